//! Traffic of the direct (mesh), star, Bruck and pairwise plans against the
//! seeds' formulas, computed from the plans themselves: the number of
//! dependent steps (`match_messages`) and the elements each rank sends and
//! receives. Also the seed-004 property of pairwise alltoallv: step k is
//! exactly the exchange between ranks i and i+k, with uneven (and zero)
//! counts.

mod common;
use common::ceil_log2;

use ferrocoll::plan::{self, match_messages, MessageStats, Op, Plan, PlanRequest};
use ferrocoll::{Algorithm, Collective};

/// The plans of every rank of a group of `n`.
fn plans(algo: Algorithm, coll: Collective, n: usize, count: usize) -> Vec<Plan> {
    (0..n)
        .map(|rank| plan::build(algo, &PlanRequest::new(coll, n, rank, count)).unwrap())
        .collect()
}

/// Plans and their message statistics; fails on a mismatch or deadlock.
fn run(algo: Algorithm, coll: Collective, n: usize, count: usize) -> (Vec<Plan>, MessageStats) {
    let p = plans(algo, coll, n, count);
    let stats = match_messages(&p).unwrap_or_else(|e| panic!("{coll}/{algo} n={n}: {e}"));
    (p, stats)
}

/// Block counts to try: one every block divides, and uneven ones.
fn block_counts() -> [usize; 3] {
    [1, 7, 1000]
}

#[test]
fn direct_allreduce_takes_two_steps_and_sends_two_n_minus_one_over_n() {
    for n in 1..=17usize {
        for count in [n * 1000, n * 64 + 5, 12_345, 1] {
            let (_, stats) = run(Algorithm::Direct, Collective::AllReduce, n, count);
            let want_steps = if n == 1 { 0 } else { 2 };
            assert_eq!(stats.steps, want_steps, "n={n} count={count}");
            let expected = 2 * (n - 1) * count; // per rank, times n
            if count % n == 0 {
                for (rank, &sent) in stats.sent.iter().enumerate() {
                    assert_eq!(sent * n, expected, "n={n} count={count} rank={rank}");
                }
            }
            // Summed over ranks the formula is exact for any count.
            assert_eq!(stats.elements * n, expected * n, "n={n} count={count}");
            assert_eq!(stats.sent, stats.received, "n={n} count={count}");
        }
    }
}

#[test]
fn direct_allgather_is_one_step_of_n_minus_one_blocks() {
    for n in 1..=17usize {
        for c in block_counts() {
            let (_, stats) = run(Algorithm::Direct, Collective::AllGather, n, c);
            assert_eq!(stats.steps, usize::from(n > 1), "n={n} c={c}");
            assert!(stats.sent.iter().all(|&s| s == (n - 1) * c), "n={n} c={c}");
            assert!(stats.received.iter().all(|&s| s == (n - 1) * c), "n={n}");
        }
    }
}

#[test]
fn direct_reduce_scatter_and_broadcast_are_one_step() {
    for n in 1..=17usize {
        for c in block_counts() {
            let (_, stats) = run(Algorithm::Direct, Collective::ReduceScatter, n, c);
            assert_eq!(stats.steps, usize::from(n > 1), "n={n} c={c}");
            assert!(stats.sent.iter().all(|&s| s == (n - 1) * c), "n={n} c={c}");
        }
        for root in [0, n - 1] {
            let p: Vec<Plan> = (0..n)
                .map(|rank| {
                    let req = PlanRequest::new(Collective::Broadcast, n, rank, 100).with_root(root);
                    plan::build(Algorithm::Direct, &req).unwrap()
                })
                .collect();
            let stats = match_messages(&p).unwrap();
            assert_eq!(stats.steps, usize::from(n > 1), "n={n}");
            for rank in 0..n {
                let want = if rank == root { (n - 1) * 100 } else { 0 };
                assert_eq!(stats.sent[rank], want, "n={n} root={root} rank={rank}");
            }
        }
    }
}

#[test]
fn star_allreduce_funnels_everything_through_rank_zero() {
    for n in 1..=17usize {
        let m = 1001;
        let (_, stats) = run(Algorithm::Star, Collective::AllReduce, n, m);
        assert_eq!(stats.steps, if n == 1 { 0 } else { 2 }, "n={n}");
        assert_eq!(stats.received[0], (n - 1) * m, "n={n}");
        assert_eq!(stats.sent[0], (n - 1) * m, "n={n}");
        for rank in 1..n {
            assert_eq!(stats.sent[rank], m, "n={n} rank={rank}");
            assert_eq!(stats.received[rank], m, "n={n} rank={rank}");
        }
    }
}

#[test]
fn bruck_allgather_takes_ceil_log2_n_steps_and_sends_n_minus_one_blocks() {
    for n in 1..=33usize {
        for c in block_counts() {
            let (p, stats) = run(Algorithm::Bruck, Collective::AllGather, n, c);
            assert_eq!(stats.steps, ceil_log2(n), "n={n} c={c}");
            assert!(stats.sent.iter().all(|&s| s == (n - 1) * c), "n={n} c={c}");
            // One message per round.
            for (rank, plan) in p.iter().enumerate() {
                assert_eq!(plan.messages_sent(), ceil_log2(n), "n={n} rank={rank}");
            }
        }
    }
}

#[test]
fn bruck_alltoall_takes_ceil_log2_n_steps_of_about_half_the_blocks() {
    for n in 1..=33usize {
        for c in block_counts() {
            let (p, stats) = run(Algorithm::Bruck, Collective::AllToAll, n, c);
            let rounds = ceil_log2(n);
            assert_eq!(stats.steps, rounds, "n={n} c={c}");
            // Round k sends the blocks whose index has bit k set.
            let per_round: Vec<usize> = (0..rounds)
                .map(|k| (0..n).filter(|i| i & (1 << k) != 0).count())
                .collect();
            let total: usize = per_round.iter().sum::<usize>() * c;
            for (rank, plan) in p.iter().enumerate() {
                assert_eq!(stats.sent[rank], total, "n={n} c={c} rank={rank}");
                let sends: Vec<usize> = plan
                    .ops()
                    .filter_map(|op| match op {
                        Op::Send { src, .. } => Some(src.len),
                        _ => None,
                    })
                    .collect();
                assert_eq!(
                    sends.len(),
                    rounds,
                    "n={n} rank={rank}: one message a round"
                );
                for (k, &len) in sends.iter().enumerate() {
                    assert_eq!(len, per_round[k] * c, "n={n} rank={rank} round={k}");
                    assert!(len <= n.div_ceil(2) * c, "n={n} rank={rank} round={k}");
                }
            }
        }
    }
}

#[test]
fn pairwise_reduce_scatter_takes_n_minus_one_steps() {
    for n in 1..=17usize {
        for c in block_counts() {
            let (_, stats) = run(Algorithm::Pairwise, Collective::ReduceScatter, n, c);
            assert_eq!(stats.steps, n - 1, "n={n} c={c}");
            assert!(stats.sent.iter().all(|&s| s == (n - 1) * c), "n={n} c={c}");
            assert!(stats.received.iter().all(|&s| s == (n - 1) * c), "n={n}");
        }
    }
}

#[test]
fn pairwise_alltoall_takes_n_minus_one_steps() {
    for n in 1..=17usize {
        for c in block_counts() {
            let (_, stats) = run(Algorithm::Pairwise, Collective::AllToAll, n, c);
            assert_eq!(stats.steps, n - 1, "n={n} c={c}");
            assert!(stats.sent.iter().all(|&s| s == (n - 1) * c), "n={n} c={c}");
            assert_eq!(stats.messages, n * (n - 1), "n={n} c={c}");
        }
    }
}

/// Seed 004: with uneven counts (zeros included) step k of pairwise
/// alltoallv is exactly the exchange i -> i+k for every i, zero-length
/// messages included.
#[test]
fn pairwise_alltoallv_step_k_pairs_i_with_i_plus_k() {
    for n in 1..=13usize {
        for seed in 0..3 {
            // Rank s sends (s + 2d + seed) % 5 elements to rank d: many zeros.
            let amount = |s: usize, d: usize| (s + 2 * d + seed) % 5;
            let p: Vec<Plan> = (0..n)
                .map(|rank| {
                    let req = PlanRequest::new(Collective::AllToAllV, n, rank, 0).with_counts(
                        (0..n).map(|d| amount(rank, d)).collect(),
                        (0..n).map(|s| amount(s, rank)).collect(),
                    );
                    plan::build(Algorithm::Pairwise, &req).unwrap()
                })
                .collect();
            let stats = match_messages(&p).unwrap_or_else(|e| panic!("n={n}: {e}"));
            assert_eq!(stats.steps, n - 1, "n={n} seed={seed}");
            assert_eq!(stats.messages, n * (n - 1), "n={n}: zero-length ones too");
            for (i, plan) in p.iter().enumerate() {
                // The rounds that communicate (n = 1 has only its local copy).
                let steps: Vec<Vec<Op>> = plan
                    .rounds
                    .iter()
                    .map(|r| {
                        r.ops
                            .iter()
                            .copied()
                            .filter(|op| op.peer().is_some())
                            .collect()
                    })
                    .filter(|ops: &Vec<Op>| !ops.is_empty())
                    .collect();
                assert_eq!(steps.len(), n - 1, "n={n} rank={i}");
                for (si, comm) in steps.iter().enumerate() {
                    let k = si + 1;
                    let (to, from) = ((i + k) % n, (i + n - k) % n);
                    assert_eq!(comm.len(), 2, "n={n} rank={i} step={k}: {comm:?}");
                    let ok = comm.iter().any(|op| {
                        matches!(*op, Op::Send { peer, src } if peer == to && src.len == amount(i, to))
                    }) && comm.iter().any(|op| {
                        matches!(*op, Op::Recv { peer, dst } if peer == from && dst.len == amount(from, i))
                    });
                    assert!(ok, "n={n} rank={i} step={k}: {comm:?}");
                }
            }
        }
    }
}
