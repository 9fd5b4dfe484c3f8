//! Traffic of the foundation algorithms (ring allgather/reduce-scatter,
//! binomial trees, the pipelined chain, linear, direct alltoall,
//! dissemination), read from their plans and held against the formulas.
//! The ring allreduce's own test lives in `plans.rs`.

mod common;
use common::ceil_log2;

use ferrocoll::plan::{self, match_messages, MessageStats, Plan, PlanRequest};
use ferrocoll::{Algorithm, Collective};

fn stats(algo: Algorithm, coll: Collective, n: usize, count: usize, root: usize) -> MessageStats {
    stats_of(&plans(algo, coll, n, count, root))
}

fn plans(algo: Algorithm, coll: Collective, n: usize, count: usize, root: usize) -> Vec<Plan> {
    (0..n)
        .map(|r| plan::build(algo, &PlanRequest::new(coll, n, r, count).with_root(root)).unwrap())
        .collect()
}

fn stats_of(plans: &[Plan]) -> MessageStats {
    match_messages(plans).unwrap()
}

#[test]
fn ring_allgather_and_reduce_scatter_take_n_minus_one_steps_of_one_block() {
    for n in 2..=17usize {
        for c in [1, 7, 100] {
            for coll in [Collective::AllGather, Collective::ReduceScatter] {
                let s = stats(Algorithm::Ring, coll, n, c, 0);
                assert_eq!(s.steps, n - 1, "{coll} n={n}");
                // (N-1)/N of the whole n-block buffer, per rank.
                assert!(
                    s.sent.iter().all(|&e| e == (n - 1) * c),
                    "{coll} n={n}: {:?}",
                    s.sent
                );
                assert!(s.received.iter().all(|&e| e == (n - 1) * c), "{coll} n={n}");
            }
        }
    }
}

#[test]
fn binomial_trees_move_the_buffer_once_per_edge() {
    for n in 2..=33usize {
        let m = 1000;
        for root in [0, n - 1] {
            // Broadcast: every non-root receives M once; N-1 edges in all.
            let s = stats(Algorithm::Tree, Collective::Broadcast, n, m, root);
            assert_eq!(s.elements, (n - 1) * m, "n={n}");
            for r in 0..n {
                assert_eq!(s.received[r], if r == root { 0 } else { m }, "n={n} r={r}");
            }
            // The root feeds ceil(log2 N) subtrees.
            assert_eq!(s.sent[root], ceil_log2(n) * m, "n={n}");
            // Reduce: every non-root sends M once, up its edge.
            let s = stats(Algorithm::Tree, Collective::Reduce, n, m, root);
            for r in 0..n {
                assert_eq!(s.sent[r], if r == root { 0 } else { m }, "n={n} r={r}");
            }
            // Gather: the root receives every other block exactly once.
            let s = stats(Algorithm::Tree, Collective::Gather, n, 10, root);
            assert_eq!(s.received[root], (n - 1) * 10, "n={n}");
        }
        // Allreduce = reduce + broadcast: twice the depth, 2(N-1) messages of M.
        let s = stats(Algorithm::Tree, Collective::AllReduce, n, m, 0);
        assert_eq!(s.steps, 2 * ceil_log2(n), "n={n}");
        assert_eq!(s.elements, 2 * (n - 1) * m, "n={n}");
    }
}

#[test]
fn pipelined_chain_takes_n_minus_two_plus_segments_steps() {
    for n in 2..=9usize {
        // 4 MiB of f32 is cut into segments of 256 KiB: 16 of them.
        let m = 1 << 20;
        for coll in [Collective::Broadcast, Collective::Reduce] {
            let p = plans(Algorithm::Pipeline, coll, n, m, 0);
            // Count the segments from the plan: the messages the chain's head sends.
            let head = if coll == Collective::Broadcast {
                0
            } else {
                1 % n
            };
            let segments = p[head].messages_sent();
            assert_eq!(segments, 16, "{coll} n={n}");
            let s = stats_of(&p);
            assert_eq!(s.steps, n - 2 + segments, "{coll} n={n}");
            // Every rank but the chain's tail forwards the whole buffer once.
            assert_eq!(s.elements, (n - 1) * m, "{coll} n={n}");
        }
    }
}

#[test]
fn linear_and_direct_take_one_step() {
    for n in 2..=17usize {
        for coll in [Collective::Gather, Collective::Scatter] {
            let s = stats(Algorithm::Linear, coll, n, 10, n / 2);
            assert_eq!(s.steps, 1, "{coll} n={n}");
            assert_eq!(s.elements, (n - 1) * 10, "{coll} n={n}");
        }
        let s = stats(Algorithm::Direct, Collective::AllToAll, n, 10, 0);
        assert_eq!(s.steps, 1, "n={n}");
        assert!(s.sent.iter().all(|&e| e == (n - 1) * 10), "n={n}");
    }
}

#[test]
fn dissemination_barrier_takes_ceil_log2_n_steps() {
    for n in 1..=33usize {
        let s = stats(Algorithm::Dissemination, Collective::Barrier, n, 0, 0);
        assert_eq!(s.steps, ceil_log2(n), "n={n}");
        assert_eq!(s.messages, n * ceil_log2(n), "n={n}");
    }
}
