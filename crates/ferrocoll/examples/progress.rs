//! Issue 16's measurements: what issuing a non-blocking 8-byte allreduce
//! costs on the progress worker against a thread per call (as before the
//! worker), and what a persistent allreduce saves per call against the
//! plain one at 8 B - 64 KiB. Rank 0 prints.
//!
//! ```text
//! cargo build --release --example progress
//! target/release/examples/progress issue 2                      # 2 ranks as threads
//! ferrocoll run -n 2 target/release/examples/progress issue     # 2 processes (shm)
//! target/release/examples/progress persistent 2
//! ferrocoll run -n 2 target/release/examples/progress persistent
//! ```
//!
//! `issue` times each issue call alone (the buffers are made before the
//! clock starts, so an allocation of the caller's is not counted), in
//! batches of [`BATCH`] calls in flight that are then waited for; the clock
//! read around each call (~20-30 ns) is included. The thread-per-call
//! variant is the code `Request::spawn` ran before the worker (commit
//! 75a66ed), written out here: reserve the number, spawn a thread running the
//! blocking call, hand the result back over a channel.
//!
//! `persistent` compares, per size, the plain in-place allreduce with a
//! persistent one run inline (`Persistent::run`), and `iall_reduce` + `wait`
//! with `start` + `wait`: the median over 4 x [`REPS`] repetitions of the
//! mean time per call, the four taking turns in a rotating order.

use std::sync::mpsc;
use std::time::Instant;

use ferrocoll::{local, Communicator, ReduceOp, Request, Result};

/// Calls in flight per batch in `issue`.
const BATCH: usize = 64;
/// Repetitions of each timing in `persistent`, times 4.
const REPS: usize = 5;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let what = args.get(1).cloned().unwrap_or_else(|| "all".into());
    let ranks: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(2);
    if std::env::var_os("FERROCOLL_RANK").is_some() {
        // Launched as processes (`ferrocoll run`).
        bench(&ferrocoll::init()?, &what)
    } else {
        for r in local::run(ranks, |comm| bench(&comm, &what))? {
            r?;
        }
        Ok(())
    }
}

fn bench(comm: &Communicator, what: &str) -> Result<()> {
    if comm.rank() == 0 {
        println!(
            "# {} ranks, transport {}",
            comm.size(),
            comm.transport_name()
        );
    }
    if what == "issue" || what == "all" {
        issue(comm)?;
    }
    if what == "persistent" || what == "all" {
        persistent(comm)?;
    }
    Ok(())
}

/// The non-blocking allreduce as it ran before the progress worker: a
/// thread per call.
fn iall_reduce_on_a_thread(
    comm: &Communicator,
    mut buf: Vec<u64>,
) -> mpsc::Receiver<Result<Vec<u64>>> {
    let handle = comm.reserve_next_call();
    let (tx, rx) = mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("ferrocoll-request".into())
        .spawn(move || {
            let _ = tx.send(
                handle
                    .all_reduce_in_place(&mut buf, ReduceOp::Sum)
                    .map(|_| buf),
            );
        })
        .expect("start a thread");
    rx
}

/// Issue-time statistics over many calls, in microseconds.
struct Stats {
    calls: usize,
    mean: f64,
    p50: f64,
    p99: f64,
    max: f64,
    /// Mean time per call of issuing and completing a whole batch.
    per_call_total: f64,
}

fn stats(mut ns: Vec<u64>, total_ns: u128) -> Stats {
    let calls = ns.len();
    let mean = ns.iter().sum::<u64>() as f64 / calls as f64 / 1e3;
    ns.sort_unstable();
    let at = |q: f64| ns[((calls - 1) as f64 * q) as usize] as f64 / 1e3;
    Stats {
        calls,
        mean,
        p50: at(0.5),
        p99: at(0.99),
        max: at(1.0),
        per_call_total: total_ns as f64 / calls as f64 / 1e3,
    }
}

/// Times `batches` batches of [`BATCH`] issues of an 8-byte allreduce; the
/// calls of each batch are waited for (and checked) after it.
fn time_issues(comm: &Communicator, batches: usize, on_threads: bool) -> Result<Stats> {
    let n = comm.size() as u64;
    let mut ns = Vec::with_capacity(batches * BATCH);
    let mut total = 0u128;
    for b in 0..batches {
        let bufs: Vec<Vec<u64>> = (0..BATCH).map(|i| vec![(b * BATCH + i) as u64]).collect();
        comm.barrier()?;
        let start = Instant::now();
        let check = |i: usize, v: Vec<u64>| assert_eq!(v, vec![n * (b * BATCH + i) as u64]);
        if on_threads {
            let mut reqs = Vec::with_capacity(BATCH);
            for buf in bufs {
                let t = Instant::now();
                reqs.push(iall_reduce_on_a_thread(comm, buf));
                ns.push(t.elapsed().as_nanos() as u64);
            }
            for (i, rx) in reqs.into_iter().enumerate() {
                check(i, rx.recv().expect("the call's thread answers")?);
            }
        } else {
            let mut reqs = Vec::with_capacity(BATCH);
            for buf in bufs {
                let t = Instant::now();
                reqs.push(comm.iall_reduce(buf, ReduceOp::Sum));
                ns.push(t.elapsed().as_nanos() as u64);
            }
            for (i, v) in Request::wait_all(reqs)?.into_iter().enumerate() {
                check(i, v);
            }
        }
        total += start.elapsed().as_nanos();
    }
    Ok(stats(ns, total))
}

fn issue(comm: &Communicator) -> Result<()> {
    // Warm up both (the worker starts on the first call).
    time_issues(comm, 10, false)?;
    time_issues(comm, 10, true)?;
    let worker = time_issues(comm, 400, false)?;
    let threads = time_issues(comm, 100, true)?;
    // One call at a time, waited at once: the hop to the worker and back,
    // against the blocking call.
    let one_at_a_time = |nonblocking: bool| -> Result<f64> {
        let calls = 20_000;
        let mut buf = vec![0u64];
        comm.barrier()?;
        let t = Instant::now();
        for _ in 0..calls {
            if nonblocking {
                buf = comm.iall_reduce(buf, ReduceOp::Sum).wait()?;
            } else {
                comm.all_reduce_in_place(&mut buf, ReduceOp::Sum)?;
            }
        }
        Ok(t.elapsed().as_secs_f64() * 1e6 / calls as f64)
    };
    let blocking = one_at_a_time(false)?;
    let round_trip = one_at_a_time(true)?;
    if comm.rank() == 0 {
        println!("## issuing a non-blocking 8 B allreduce (u64 sum), {BATCH} in flight per batch");
        println!(
            "#                   calls  issue mean    p50     p99     max us | issue+complete per call us"
        );
        for (name, s) in [("progress worker", &worker), ("thread per call", &threads)] {
            println!(
                "{name:<16} {:>8}  {:>10.3} {:>7.3} {:>7.3} {:>7.1}    | {:.3}",
                s.calls, s.mean, s.p50, s.p99, s.max, s.per_call_total
            );
        }
        println!(
            "# one at a time: blocking all_reduce {blocking:.3} us, iall_reduce + wait {round_trip:.3} us per call"
        );
    }
    Ok(())
}

/// Median of `REPS` runs of `f`, each returning microseconds per call.
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn persistent(comm: &Communicator) -> Result<()> {
    if comm.rank() == 0 {
        println!(
            "## persistent allreduce vs the plain one, f32 sum in place; us per call, median of {}",
            4 * REPS
        );
        println!(
            "#    bytes  path         plain  persistent  saved    %  | iall+wait  start+wait  saved    %"
        );
    }
    for bytes in [8usize, 64, 512, 4096, 32 << 10, 64 << 10] {
        let count = bytes / 4;
        let calls = if bytes <= 4096 { 5_000 } else { 1_000 };
        let mut buf = vec![0.0f32; count];
        let mut p = comm.all_reduce_init(vec![0.0f32; count], ReduceOp::Sum)?;
        let timed = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
            comm.barrier()?;
            let t = Instant::now();
            for _ in 0..calls {
                f()?;
            }
            Ok(t.elapsed().as_secs_f64() * 1e6 / calls as f64)
        };
        // times[m]: method m's mean per call in each repetition. The four
        // take turns, and which goes first rotates, so a slow spell of the
        // (shared) machine does not land on one of them.
        let mut times: [Vec<f64>; 4] = Default::default();
        for rep in 0..=REPS * 4 {
            for turn in 0..4 {
                let m = (turn + rep) % 4;
                let t = match m {
                    0 => timed(&mut || comm.all_reduce_in_place(&mut buf, ReduceOp::Sum))?,
                    1 => timed(&mut || p.run())?,
                    2 => timed(&mut || {
                        buf = comm
                            .iall_reduce(std::mem::take(&mut buf), ReduceOp::Sum)
                            .wait()?;
                        Ok(())
                    })?,
                    _ => timed(&mut || p.start()?.wait())?,
                };
                // The first repetition warms up (plans remembered, pages
                // touched).
                if rep > 0 {
                    times[m].push(t);
                }
            }
        }
        let [plain, pers, inb, pnb] = times;
        let (a, b, c, d) = (median(plain), median(pers), median(inb), median(pnb));
        if comm.rank() == 0 {
            let path = p
                .algorithm()
                .map_or("fast path".to_string(), |a| a.name().to_string());
            println!(
                "{bytes:>10}  {path:<10} {a:>7.3} {b:>10.3} {:>6.3} {:>4.0}  | {c:>9.3} {d:>11.3} {:>6.3} {:>4.0}",
                a - b,
                (a - b) / a * 100.0,
                c - d,
                (c - d) / c * 100.0
            );
        }
    }
    Ok(())
}
