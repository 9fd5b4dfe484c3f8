//! MoE dispatch/combine (`ferrocoll::moe`) with ranks as processes, over
//! shared memory and TCP with 2, 3 and 4 ranks, against the naive reference
//! that tests/moe.rs of the library checks thread ranks with
//! (`ferrocoll::moe::reference`): drops at C = 1/2, dropless, the worst
//! skew, f32 and bf16, rows small and large (a 4 KiB row, the seed's bf16
//! hidden state of 2048); and every schedule on 2 "hosts" of 2 and of 3
//! ranks (FERROCOLL_HOST_ID: shared memory within a host, TCP between, the
//! topology 2xL found by `init`), bit for bit against each other.
//!
//! This file is its own rank program (harness = false): with
//! `FERROCOLL_TEST_ROLE` set it plays one rank.

mod common;
use common::{show, ROLE};

#[path = "../../ferrocoll/tests/moe_support/mod.rs"]
mod moe_support;
use moe_support::{check_rank, check_with, uneven_tokens, Case, Routing, TestElem};

use std::process::Command;

use ferrocoll::bf16;
use ferrocoll::moe::{Dispatcher, Schedule};

fn main() {
    if let Ok(role) = std::env::var(ROLE) {
        let comm = ferrocoll::init().expect("init");
        match role.as_str() {
            "moe" => rank_program(&comm),
            "schedules" => schedules_program(&comm),
            _ => panic!("unknown role {role}"),
        }
        return;
    }
    let tests: [(&str, fn()); 2] = [
        (
            "dispatch_and_combine_on_shm_and_tcp",
            dispatch_and_combine_on_shm_and_tcp,
        ),
        ("every_schedule_on_two_hosts", every_schedule_on_two_hosts),
    ];
    common::run_tests(&tests, "moe multi-process");
}

/// The cases every rank runs, for a job of `n` ranks.
fn cases(n: usize) -> Vec<(Case, &'static str)> {
    let base = |hidden, topk, capacity, routing| Case {
        ranks: n,
        experts: 2 * n,
        hidden,
        topk,
        capacity,
        tokens: uneven_tokens(n, n as u64 + 3),
        routing,
    };
    vec![
        (base(7, 2, Some((1, 2)), Routing::Random(5)), "f32"),
        (base(7, 2, None, Routing::Random(6)), "bf16"),
        (base(3, 1, Some((1, 1)), Routing::Hot), "f32"),
        (base(3, 2, None, Routing::Hot), "bf16"),
        (base(2048, 2, Some((5, 4)), Routing::Random(7)), "bf16"),
    ]
}

fn rank_program(comm: &ferrocoll::Communicator) {
    for (case, dtype) in cases(comm.size()) {
        let checked = match dtype {
            "f32" => check_rank::<f32>(comm, &case),
            _ => check_rank::<bf16>(comm, &case),
        };
        if let Err(e) = checked {
            panic!("{dtype}: {e}");
        }
    }
    println!("moe ok");
}

fn dispatch_and_combine_on_shm_and_tcp() {
    for transport in ["shm", "tcp"] {
        for n in [2, 3, 4] {
            let outs = common::direct_world("moe", n, "moe", transport, &[]);
            for (r, out) in outs.iter().enumerate() {
                let what = format!("moe over {transport}, n = {n}, rank {r}");
                assert!(out.status.success(), "{what}: {}", show(out));
                let text = String::from_utf8_lossy(&out.stdout);
                assert!(text.contains("moe ok"), "{what}: {}", show(out));
            }
        }
    }
}

/// Every schedule on this job's ranks (2 hosts), each against the reference
/// and bit for bit against the first.
fn schedules_program(comm: &ferrocoll::Communicator) {
    let n = comm.size();
    assert_eq!(comm.topology().levels(), &[2, n / 2], "two hosts");
    for (case, dtype) in cases(n) {
        let runs = match dtype {
            "f32" => every_schedule::<f32>(comm, &case),
            _ => every_schedule::<bf16>(comm, &case),
        };
        for (s, (inputs, y, ran)) in Schedule::ALL.iter().zip(&runs) {
            assert_eq!(inputs, &runs[0].0, "{case:?} {s}: expert inputs");
            assert_eq!(y, &runs[0].1, "{case:?} {s}: output");
            if *s != Schedule::Auto {
                assert_eq!(ran, &[*s; 2], "{case:?}");
            }
        }
    }
    println!("schedules ok");
}

/// `case` under every schedule: (inputs, y as bits, schedules run).
fn every_schedule<T: TestElem>(
    comm: &ferrocoll::Communicator,
    case: &Case,
) -> Vec<(Vec<u32>, Vec<u32>, [Schedule; 2])> {
    let bits = |v: &[T]| v.iter().map(|x| x.to_f32().to_bits()).collect::<Vec<_>>();
    Schedule::ALL
        .iter()
        .map(|&s| {
            let moe = Dispatcher::new(comm, case.spec().with_schedule(s)).expect("spec");
            let c = check_with::<T>(&moe, comm.rank(), case).unwrap_or_else(|e| panic!("{s}: {e}"));
            assert_eq!(c.wrong, 0, "{s}: {:?}", c.first);
            (bits(&c.inputs), bits(&c.y), c.schedules)
        })
        .collect()
}

fn every_schedule_on_two_hosts() {
    // Two "hosts" on this machine (FERROCOLL_HOST_ID): shared memory
    // within each, TCP between them; init finds the topology 2xL.
    let me = std::env::current_exe().unwrap();
    for (n, per_host) in [(4, 2), (6, 3)] {
        let out = Command::new(env!("CARGO_BIN_EXE_ferrocoll"))
            .args([
                "run",
                "-n",
                &n.to_string(),
                "--timeout",
                "120",
                "--",
                "sh",
                "-c",
            ])
            .arg(format!(
                "FERROCOLL_HOST_ID=host$((FERROCOLL_RANK / {per_host})) exec \"$0\""
            ))
            .arg(&me)
            .env(ROLE, "schedules")
            .env("FERROCOLL_TIMEOUT", "60")
            .output()
            .unwrap();
        assert!(out.status.success(), "{n} ranks: {}", show(&out));
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(text.matches("schedules ok").count(), n, "{}", show(&out));
    }
}
