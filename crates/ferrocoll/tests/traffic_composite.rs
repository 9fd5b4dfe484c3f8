//! Traffic of the composite algorithms and the tree barrier, read from their
//! plans and held against the formulas.

mod common;
use common::ceil_log2;

use ferrocoll::plan::{self, match_messages, MessageStats, Plan, PlanRequest};
use ferrocoll::{Algorithm, Collective};

fn stats(algo: Algorithm, coll: Collective, n: usize, count: usize, root: usize) -> MessageStats {
    let plans: Vec<Plan> = (0..n)
        .map(|r| plan::build(algo, &PlanRequest::new(coll, n, r, count).with_root(root)).unwrap())
        .collect();
    match_messages(&plans).unwrap()
}

#[test]
fn scatter_allgather_takes_log_plus_ring_steps_and_moves_each_block_once_per_hop() {
    for n in 2..=17usize {
        let count = n * 100;
        for root in [0, n - 1] {
            let s = stats(
                Algorithm::ScatterAllgather,
                Collective::Broadcast,
                n,
                count,
                root,
            );
            assert_eq!(s.steps, ceil_log2(n) + n - 1, "n={n}");
            // The allgather phase: every rank passes on N-1 blocks and
            // receives N-1 blocks.
            for r in 0..n {
                // Binomial scatter: virtual rank v receives the blocks of its
                // subtree [v, v + lowbit(v)) once; then the ring allgather
                // brings N-1 blocks (some of which it already holds: the
                // redundancy van de Geijn's scheme pays for its simplicity).
                let v = (r + n - root) % n;
                let subtree = if v == 0 {
                    0
                } else {
                    (1usize << v.trailing_zeros()).min(n - v)
                };
                assert_eq!(s.received[r], (subtree + n - 1) * 100, "n={n} r={r}");
            }
            // The root sends (N-1)/N of the buffer in the scatter and one
            // block per allgather step.
            assert_eq!(s.sent[root], (n - 1) * 100 + (n - 1) * 100, "n={n}");
        }
    }
}

#[test]
fn rs_gather_is_a_ring_reduce_scatter_then_one_gather_round() {
    for n in 2..=17usize {
        let count = n * 64;
        for root in [0, n / 2] {
            let s = stats(Algorithm::RsGather, Collective::Reduce, n, count, root);
            assert_eq!(s.steps, n, "n={n}: N-1 ring steps then the gather");
            for r in 0..n {
                let gather = if r == root { 0 } else { 64 };
                assert_eq!(s.sent[r], (n - 1) * 64 + gather, "n={n} r={r}");
            }
            assert_eq!(s.received[root], (n - 1) * 64 + (n - 1) * 64);
        }
    }
}

#[test]
fn tree_barrier_takes_two_log_n_steps() {
    for n in 1..=33usize {
        let s = stats(Algorithm::Tree, Collective::Barrier, n, 0, 0);
        assert_eq!(s.steps, 2 * ceil_log2(n), "n={n}");
        assert_eq!(
            s.messages,
            2 * (n - 1),
            "n={n}: one message up and one down per non-root"
        );
    }
}
