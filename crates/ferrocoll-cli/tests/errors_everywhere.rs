//! Errors that reach every rank at once, across processes (shm and tcp),
//! with survivors that stay alive after their error, as a training loop
//! that catches and logs does:
//! - a mismatch found by one rank fails every rank of the communicator
//!   within milliseconds (a verdict travels to each), for calls that differ
//!   in kind, count, type, operator, root or all_to_all_v counts, and for
//!   two calls that exchange no message at all (found by a probe);
//! - blame survives a cascade: when a rank returns early or panics, every
//!   survivor names it, also after the ranks that noticed first have exited;
//! - a timeout lists where every rank is (the desync report).
//!
//! This file is its own rank program (harness = false): with
//! `FERROCOLL_TEST_ROLE` set it plays one rank. Ranks are started directly,
//! not through `ferrocoll run`, which would stop the survivors.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use ferrocoll::{CallOptions, Communicator, ReduceOp};

mod common;
use common::{show, ROLE};

/// How long a survivor stays alive after its error: far longer than the
/// time every rank has to learn of a mismatch (`FAST`), so no rank can
/// learn of it only from a peer's exit.
const STAY_MS: u64 = 1500;

/// Every rank must have its error within this time of the call.
const FAST: Duration = Duration::from_millis(700);

fn main() {
    if let Ok(role) = std::env::var(ROLE) {
        let comm = ferrocoll::init().expect("init");
        rank_program(&role, &comm);
        return;
    }
    let tests: [(&str, fn()); 5] = [
        (
            "mismatch_reaches_every_rank_at_once",
            mismatch_reaches_every_rank_at_once,
        ),
        (
            "blame_survives_a_cascade_of_exits",
            blame_survives_a_cascade_of_exits,
        ),
        (
            "silent_mismatch_is_found_by_a_probe",
            silent_mismatch_is_found_by_a_probe,
        ),
        (
            "timeout_says_where_every_rank_is",
            timeout_says_where_every_rank_is,
        ),
        (
            "launcher_reports_the_rank_that_failed_first",
            launcher_reports_the_rank_that_failed_first,
        ),
    ];
    common::run_tests(&tests, "errors-everywhere");
}

// ---- driver ----------------------------------------------------------------

/// [`common::direct_world`] for this file's roles.
fn world(n: usize, role: &str, transport: &str, env: &[(&str, &str)]) -> Vec<Output> {
    common::direct_world("everywhere", n, role, transport, env)
}

/// The milliseconds a rank printed after `after ` in its last report (see
/// `report`).
fn millis(text: &str) -> Option<f64> {
    let at = text.rfind("after ")? + "after ".len();
    text[at..].split(' ').next()?.parse().ok()
}

fn mismatch_reaches_every_rank_at_once() {
    let mut worst = 0.0f64;
    for transport in ["shm", "tcp"] {
        for n in [2, 3, 4] {
            for (case, elems) in [
                ("kind", 256),
                ("kind", 1 << 18),
                ("count", 256),
                ("dtype", 256),
                ("op", 256),
                ("root", 256),
                ("alltoallv", 256),
            ] {
                let elems_text = elems.to_string();
                let env = [("FC_CASE", case), ("FC_ELEMS", elems_text.as_str())];
                let outs = world(n, "mismatch", transport, &env);
                for (r, out) in outs.iter().enumerate() {
                    let text = String::from_utf8_lossy(&out.stdout);
                    let what = format!("{case} ({elems} elements) {transport} n={n} rank {r}");
                    assert!(
                        text.contains("Mismatch"),
                        "{what}: no mismatch: {}",
                        show(out)
                    );
                    let ms = millis(&text).unwrap_or_else(|| panic!("{what}: {}", show(out)));
                    assert!(
                        ms < FAST.as_secs_f64() * 1e3,
                        "{what}: learnt of the mismatch only after {ms} ms: {}",
                        show(out)
                    );
                    worst = worst.max(ms);
                }
            }
        }
    }
    println!("  slowest rank to learn of a mismatch: {worst:.1} ms");
}

fn silent_mismatch_is_found_by_a_probe() {
    // reduce(root 0) against broadcast(root 0) on two ranks: both only
    // receive, no message ever shows the difference.
    for transport in ["shm", "tcp"] {
        let env = [("FC_CASE", "reduce_bcast"), ("FC_ELEMS", "256")];
        let outs = world(2, "mismatch", transport, &env);
        for (r, out) in outs.iter().enumerate() {
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                text.contains("Mismatch") && text.contains("reduce(") && text.contains("bcast("),
                "{transport} rank {r}: {}",
                show(out)
            );
            let ms = millis(&text).unwrap();
            assert!(
                ms < FAST.as_secs_f64() * 1e3,
                "{transport} rank {r}: {ms} ms"
            );
            println!("  {transport} rank {r}: {}", text.trim());
        }
    }
}

fn blame_survives_a_cascade_of_exits() {
    for transport in ["shm", "tcp"] {
        for (role, culprit) in [("early_return", 2), ("panic", 1)] {
            // Races are what this is about: a few rounds each.
            for round in 0..3 {
                let outs = world(3, role, transport, &[]);
                for (r, out) in outs.iter().enumerate() {
                    if r == culprit {
                        continue;
                    }
                    let text = String::from_utf8_lossy(&out.stdout);
                    assert!(
                        text.contains(&format!("PeerLost {{ rank: {culprit} }}")),
                        "{role} {transport} round {round}: rank {r} blames the wrong rank: {}",
                        show(out)
                    );
                }
            }
            println!("  {transport} {role}: every survivor names rank {culprit}");
        }
    }
}

fn timeout_says_where_every_rank_is() {
    for transport in ["shm", "tcp"] {
        let outs = world(3, "absent_later", transport, &[]);
        let text = String::from_utf8_lossy(&outs[0].stdout);
        assert!(
            text.contains("where every rank is")
                && text.contains("(this rank, timed out waiting for rank 2)")
                && text.contains("rank 1: in allreduce(")
                && text.contains("rank 2: no answer"),
            "{transport}: {}",
            show(&outs[0])
        );
        println!("  {transport}: {}", text.trim());
    }
}

fn launcher_reports_the_rank_that_failed_first() {
    let me = std::env::current_exe().unwrap();
    for transport in ["tcp", "shm"] {
        for (role, says, code) in [
            (
                "panic",
                "rank 1 exited with status 101 (the first rank to fail",
                101,
            ),
            (
                "early_return",
                "rank 2 exited with status 0 while the other ranks still needed it",
                1,
            ),
        ] {
            // The survivors exit at once with status 1 on their error, and
            // are often reaped before the rank that failed.
            for round in 0..3 {
                let out = Command::new(env!("CARGO_BIN_EXE_ferrocoll"))
                    .args(["run", "-n", "3", "--"])
                    .arg(&me)
                    .env(ROLE, role)
                    .env("FC_EXIT_ON_ERROR", "1")
                    .env("FERROCOLL_TRANSPORT", transport)
                    .env("FERROCOLL_TIMEOUT", "30")
                    .output()
                    .unwrap();
                let err = String::from_utf8_lossy(&out.stderr);
                assert!(
                    err.contains(says) && out.status.code() == Some(code),
                    "{role} {transport} round {round}: {}",
                    show(&out)
                );
            }
            println!("  {transport} {role}: ferrocoll run says \"{says}\"");
        }
    }
}

// ---- ranks -----------------------------------------------------------------

/// Prints the outcome of `f` with the milliseconds it took; returns whether
/// it succeeded.
fn report(comm: &Communicator, what: &str, f: impl FnOnce() -> ferrocoll::Result<()>) -> bool {
    let start = Instant::now();
    let result = f();
    let ms = start.elapsed().as_secs_f64() * 1e3;
    match &result {
        Ok(()) => println!("rank {} {what} ok after {ms:.1} ms", comm.rank()),
        Err(e) => println!(
            "rank {} {what} failed after {ms:.1} ms: {e:?}\n  {e}",
            comm.rank()
        ),
    }
    if result.is_err() && std::env::var_os("FC_EXIT_ON_ERROR").is_some() {
        // As a training script does: log and exit at once.
        std::process::exit(1);
    }
    result.is_ok()
}

fn rank_program(role: &str, comm: &Communicator) {
    let r = comm.rank();
    let n = comm.size();
    let env = |k: &str| std::env::var(k).unwrap_or_default();
    match role {
        "mismatch" => {
            let case = env("FC_CASE");
            let elems: usize = env("FC_ELEMS").parse().unwrap();
            comm.barrier().unwrap();
            let odd = r == 1;
            let mut f = vec![1.0f32; elems];
            let done = report(comm, &case, || match case.as_str() {
                "kind" if odd => comm.broadcast_in_place(&mut f, 0),
                "count" if odd => comm.all_reduce_in_place(&mut f[..elems - 1], ReduceOp::Sum),
                "dtype" if odd => comm.all_reduce_in_place(&mut vec![1.0f64; elems], ReduceOp::Sum),
                "op" if odd => comm.all_reduce_in_place(&mut f, ReduceOp::Max),
                "root" => comm.broadcast_in_place(&mut f, usize::from(odd)),
                "alltoallv" => {
                    // Rank 1 sends two elements to each rank, which expect one.
                    let send_each = if odd { 2 } else { 1 };
                    let send = vec![1.0f32; send_each * n];
                    // (What it sends itself it receives from itself.)
                    let recv_counts: Vec<usize> =
                        (0..n).map(|p| if odd && p == 1 { 2 } else { 1 }).collect();
                    let mut recv = vec![0.0f32; recv_counts.iter().sum()];
                    comm.all_to_all_v(&send, &vec![send_each; n], &mut recv, &recv_counts)
                }
                "reduce_bcast" if odd => comm.broadcast_in_place(&mut f, 0),
                "reduce_bcast" => comm.reduce_in_place(&mut f, ReduceOp::Sum, 0),
                _ => comm.all_reduce_in_place(&mut f, ReduceOp::Sum),
            });
            if done {
                // A call that only sends may end before any rank can tell
                // (two broadcast roots): the next call must fail at once.
                println!("  (its message went out; the next call:)");
                report(comm, "next", || comm.barrier());
            }
            // Stay alive, as a survivor that logs its error does.
            std::thread::sleep(Duration::from_millis(STAY_MS));
        }
        "early_return" => {
            // The barrier itself may fail on a survivor: rank 2 leaves as
            // soon as its own barrier is done, and a rank still finishing
            // the barrier then learns of the loss while in it. That is a
            // call in flight when a peer went away, and its error must name
            // rank 2 as well, so it goes through `report` too.
            if !report(comm, "barrier", || comm.barrier()) {
                return;
            }
            if r == 2 {
                return;
            }
            let mut f = vec![1.0f32; 1024];
            // Rank 0 waits on rank 2 (gone) and exits at once; rank 1 may
            // notice only rank 0's exit, and must still blame rank 2.
            report(comm, "allreduce", || {
                comm.all_reduce_in_place(&mut f, ReduceOp::Sum)
            });
        }
        "panic" => {
            if r == 1 {
                comm.barrier().unwrap();
                panic!("rank 1 fails on purpose");
            }
            // As above: a survivor may learn of rank 1's panic while still
            // in the barrier.
            if !report(comm, "barrier", || comm.barrier()) {
                return;
            }
            let mut f = vec![1.0f32; 1024];
            report(comm, "allreduce", || {
                comm.all_reduce_in_place(&mut f, ReduceOp::Sum)
            });
        }
        "absent_later" => {
            let mut f = vec![1.0f32; 1024];
            comm.all_reduce_in_place(&mut f, ReduceOp::Sum).unwrap();
            if r == 2 {
                // Finished #1 but never joins #2: busy outside ferrocoll.
                std::thread::sleep(Duration::from_millis(2500));
                return;
            }
            // Rank 0 reaches its deadline first; rank 1 is still waiting in
            // the call then, and says so.
            let secs = if r == 0 { 1 } else { 4 };
            let timed =
                comm.with_options(CallOptions::default().timeout(Duration::from_secs(secs)));
            report(comm, "allreduce", || {
                timed.all_reduce_in_place(&mut f, ReduceOp::Sum)
            });
        }
        other => panic!("unknown role {other}"),
    }
}
