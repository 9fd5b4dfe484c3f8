//! Traffic of the butterfly and halving-doubling plans against the seeds'
//! formulas: the number of dependent steps and the elements each rank sends
//! or receives, read from all ranks' plans run against each other
//! (`match_messages`) and compared with formulas computed here.
//!
//! N' = 2^floor(log2 N) ranks form the power-of-two core; the r = N - N'
//! extra ranks (the even ranks below 2r) fold into the odd rank above them
//! first and get the result from it last, which adds two steps.

use ferrocoll::plan::{self, match_messages, MessageStats, Plan, PlanRequest};
use ferrocoll::{Algorithm, Collective};

/// Group sizes: powers of two and everything in between, past two levels.
const GROUP_SIZES: std::ops::RangeInclusive<usize> = 1..=33;

/// The power-of-two core of a group of `n`: (N', log2 N', r).
fn core(n: usize) -> (usize, usize, usize) {
    let size = 1usize << n.ilog2();
    (size, size.trailing_zeros() as usize, n - size)
}

/// Steps the pre/post step adds: one round in, one round out.
fn pre_post_steps(n: usize) -> usize {
    if n.is_power_of_two() {
        0
    } else {
        2
    }
}

/// Whether `rank` is an extra rank of the pre/post step.
fn is_extra(n: usize, rank: usize) -> bool {
    let (_, _, extra) = core(n);
    rank < 2 * extra && rank % 2 == 0
}

/// Whether `rank` is a core rank that an extra rank folds into.
fn has_extra_partner(n: usize, rank: usize) -> bool {
    let (_, _, extra) = core(n);
    rank < 2 * extra && rank % 2 == 1
}

/// The plans of every rank, matched against each other.
fn run(algo: Algorithm, coll: Collective, n: usize, count: usize) -> MessageStats {
    let plans: Vec<Plan> = (0..n)
        .map(|rank| plan::build(algo, &PlanRequest::new(coll, n, rank, count)).unwrap())
        .collect();
    match_messages(&plans).unwrap_or_else(|e| panic!("{coll}/{algo} n={n} count={count}: {e}"))
}

#[test]
fn butterfly_allreduce_takes_log_n_steps_and_sends_the_vector_each_step() {
    for n in GROUP_SIZES {
        let (_, levels, _) = core(n);
        for count in [1, 1000, 12_345] {
            let stats = run(Algorithm::Butterfly, Collective::AllReduce, n, count);
            let what = format!("n={n} count={count}");
            assert_eq!(stats.steps, levels + pre_post_steps(n), "{what}");
            for rank in 0..n {
                let expected = if is_extra(n, rank) {
                    count // the fold
                } else if has_extra_partner(n, rank) {
                    levels * count + count // the core, and the result back
                } else {
                    levels * count
                };
                assert_eq!(stats.sent[rank], expected, "{what} rank={rank}");
                assert_eq!(
                    stats.received[rank], stats.sent[rank],
                    "{what} rank={rank}: every exchange is symmetric"
                );
            }
        }
    }
}

#[test]
fn butterfly_allgather_takes_log_n_steps_and_receives_every_other_block_once() {
    for n in GROUP_SIZES {
        let (_, levels, _) = core(n);
        for count in [1, 7, 1000] {
            let stats = run(Algorithm::Butterfly, Collective::AllGather, n, count);
            let what = format!("n={n} count={count}");
            assert_eq!(stats.steps, levels + pre_post_steps(n), "{what}");
            for rank in 0..n {
                assert_eq!(stats.received[rank], (n - 1) * count, "{what} rank={rank}");
            }
            // Every block reaches every other rank exactly once.
            assert_eq!(stats.elements, n * (n - 1) * count, "{what}");
        }
    }
}

#[test]
fn halving_doubling_allreduce_takes_two_log_n_steps_and_sends_two_n_minus_one_over_n() {
    for n in GROUP_SIZES {
        let (size, levels, extra) = core(n);
        // Counts the core divides (exact per rank) and counts it does not.
        for count in [size * 1000, size * 64 + 5, 12_345, 3] {
            let stats = run(Algorithm::HalvingDoubling, Collective::AllReduce, n, count);
            let what = format!("n={n} count={count}");
            assert_eq!(stats.steps, 2 * levels + pre_post_steps(n), "{what}");
            // Each core halving round sends half of what the core holds, and
            // each doubling round mirrors one: 2(N'-1)/N'·M per core rank.
            let core_volume = 2 * (size - 1) * count;
            let mut core_total = 0;
            for rank in 0..n {
                if is_extra(n, rank) {
                    assert_eq!(stats.sent[rank], count, "{what} rank={rank}");
                    continue;
                }
                let back_to_extra = if has_extra_partner(n, rank) { count } else { 0 };
                let in_core = stats.sent[rank] - back_to_extra;
                core_total += in_core;
                if count % size == 0 {
                    assert_eq!(in_core * size, core_volume, "{what} rank={rank}");
                } else {
                    // Uneven blocks differ by one element: the N'-1 blocks
                    // sent each way are within 2(N'-1) elements of the mean.
                    let slack = 2 * (size - 1) * size;
                    assert!(
                        (in_core * size).abs_diff(core_volume) <= slack,
                        "{what} rank={rank}: {in_core} vs {core_volume}/{size}"
                    );
                }
            }
            assert_eq!(core_total, core_volume, "{what}");
            assert_eq!(stats.elements, core_volume + 2 * extra * count, "{what}");
        }
    }
}

#[test]
fn halving_reduce_scatter_takes_log_n_steps_and_sends_n_minus_one_over_n_of_the_input() {
    for n in GROUP_SIZES {
        let (size, levels, extra) = core(n);
        for count in [1, 10, 1000] {
            let stats = run(Algorithm::Halving, Collective::ReduceScatter, n, count);
            let what = format!("n={n} count={count}");
            let input = n * count;
            assert_eq!(stats.steps, levels + pre_post_steps(n), "{what}");
            // In the round at distance d each core rank sends the range of
            // the d core ranks on the other side, so the core sends d·input
            // in all; over d = N'/2, ..., 1 that is (N'-1)·input: (N'-1)/N'
            // of the input per core rank on average, exactly when N' = N.
            let mut core_total = 0;
            for rank in 0..n {
                if is_extra(n, rank) {
                    assert_eq!(stats.sent[rank], input, "{what} rank={rank}: the fold");
                    assert_eq!(stats.received[rank], count, "{what} rank={rank}");
                    continue;
                }
                let back_to_extra = if has_extra_partner(n, rank) { count } else { 0 };
                let in_core = stats.sent[rank] - back_to_extra;
                core_total += in_core;
                if extra == 0 {
                    assert_eq!(in_core * size, (size - 1) * input, "{what} rank={rank}");
                }
            }
            assert_eq!(core_total, (size - 1) * input, "{what}");
            assert_eq!(
                stats.elements,
                (size - 1) * input + extra * (input + count),
                "{what}"
            );
        }
    }
}

#[test]
fn empty_buffers_send_nothing() {
    for n in GROUP_SIZES {
        for (algo, coll) in [
            (Algorithm::Butterfly, Collective::AllReduce),
            (Algorithm::Butterfly, Collective::AllGather),
            (Algorithm::HalvingDoubling, Collective::AllReduce),
            (Algorithm::Halving, Collective::ReduceScatter),
        ] {
            let stats = run(algo, coll, n, 0);
            assert_eq!((stats.messages, stats.steps), (0, 0), "{coll}/{algo} n={n}");
        }
    }
}
