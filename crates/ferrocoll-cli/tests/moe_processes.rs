//! MoE dispatch/combine (`ferrocoll::moe`) with ranks as processes, over
//! shared memory and TCP with 2, 3 and 4 ranks, against the naive reference
//! that tests/moe.rs of the library checks thread ranks with
//! (`crates/ferrocoll/tests/moe_support`): drops at C = 1/2, dropless,
//! the worst skew, f32 and bf16, rows small and large (a 4 KiB row, the
//! seed's bf16 hidden state of 2048).
//!
//! This file is its own rank program (harness = false): with
//! `FERROCOLL_TEST_ROLE` set it plays one rank.

mod common;
use common::{show, ROLE};

#[path = "../../ferrocoll/tests/moe_support/mod.rs"]
mod moe_support;
use moe_support::{check_rank, uneven_tokens, Case, Routing};

use ferrocoll::bf16;

fn main() {
    if let Ok(role) = std::env::var(ROLE) {
        let comm = ferrocoll::init().expect("init");
        assert_eq!(role, "moe", "unknown role {role}");
        rank_program(&comm);
        return;
    }
    let tests: [(&str, fn()); 1] = [(
        "dispatch_and_combine_on_shm_and_tcp",
        dispatch_and_combine_on_shm_and_tcp,
    )];
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
