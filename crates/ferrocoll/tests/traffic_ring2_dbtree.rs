//! Traffic of the two-port ring (`ring2`) and the double binary tree
//! (`dbtree`) allreduce, read from the plans themselves (`plan::build` for
//! every rank, then `match_messages`) and checked against formulas computed
//! here independently of the algorithms' code:
//!
//! * ring2: 2(N-1) dependent steps; each rank sends 2(N-1)/N of the buffer,
//!   ceil(M/2)·2(N-1)/N of it to rank + 1 and floor(M/2)·2(N-1)/N to
//!   rank - 1 (exactly when 2N divides M, within a block's rounding
//!   otherwise); the same total as `ring`.
//! * dbtree: 2·ceil(log2 N) + S - 1 dependent steps, S the number of
//!   pipeline segments per half (S = 1 for small buffers; read off the plan
//!   as the number of messages rank 0 sends to its only child in tree 1);
//!   all ranks together send exactly 2(N-1)·M; within each half a rank sends
//!   its half 1, 2 or 3 times (leaf or single-child root; interior with one
//!   or two children, or the root with two); every rank sends its half only
//!   once in at least one of the two trees, so none sends more than
//!   M + 2·ceil(M/2).

mod common;
use common::ceil_log2;

use ferrocoll::plan::{self, match_messages, validate, Layout, Op, Plan, PlanRequest};
use ferrocoll::{Algorithm, Collective};

/// Every rank's plan of `algo` for an allreduce of `count` elements, each
/// validated out of place and in place, and the messages matched.
fn all_plans(algo: Algorithm, n: usize, count: usize) -> (Vec<Plan>, plan::MessageStats) {
    let plans: Vec<Plan> = (0..n)
        .map(|rank| {
            let req = PlanRequest::new(Collective::AllReduce, n, rank, count);
            let p = plan::build(algo, &req).expect("plan builds");
            validate(&p, &req, Layout::OUT_OF_PLACE)
                .unwrap_or_else(|e| panic!("{algo} n={n} count={count} rank={rank}: {e}"));
            let layout = Layout::in_place(&req).expect("allreduce has an in-place form");
            validate(&p, &req, layout)
                .unwrap_or_else(|e| panic!("{algo} n={n} count={count} rank={rank} in place: {e}"));
            p
        })
        .collect();
    let stats =
        match_messages(&plans).unwrap_or_else(|e| panic!("{algo} n={n} count={count}: {e}"));
    (plans, stats)
}

/// Elements `plan` sends to `peer`.
fn sent_to(plan: &Plan, peer: usize) -> usize {
    plan.ops()
        .filter_map(|op| match *op {
            Op::Send { peer: p, src } if p == peer => Some(src.len),
            _ => None,
        })
        .sum()
}

/// Elements `plan` sends from `lo..hi` of its input or output, and how many
/// messages that takes (every send of an allreduce reads one of the two, and
/// a span never straddles the halves).
fn sent_within(plan: &Plan, lo: usize, hi: usize) -> (usize, usize) {
    let mut elements = 0;
    let mut messages = 0;
    for op in plan.ops() {
        if let Op::Send { src, .. } = *op {
            if src.len > 0 && src.offset >= lo && src.end() <= hi {
                elements += src.len;
                messages += 1;
            } else {
                assert!(
                    src.end() <= lo || src.offset >= hi,
                    "{src:?} straddles {lo}..{hi}"
                );
            }
        }
    }
    (elements, messages)
}

/// ceil(log2 n) for n >= 1, by counting doublings.

#[test]
fn ring2_takes_two_n_minus_one_steps_and_splits_the_volume_over_both_directions() {
    for n in 2..=16usize {
        // 2N divides the first two (every block of both halves equal); the
        // others leave uneven blocks, but still one of >= 1 element per block
        // and half, so no step is skipped.
        for count in [2 * n * 1000, 2 * n * 7, 2 * n * 64 + 5, 12_345] {
            let (plans, stats) = all_plans(Algorithm::Ring2, n, count);
            assert_eq!(stats.steps, 2 * (n - 1), "n={n} count={count}: steps");
            let first = count.div_ceil(2);
            let second = count / 2;
            let fraction = |m: usize| 2.0 * (n as f64 - 1.0) / n as f64 * m as f64;
            // Rounding: each of the 2(N-1) blocks a direction sends is within
            // one element of half/N.
            let slack = (2 * (n - 1)) as f64;
            let (mut cw_total, mut ccw_total) = (0, 0);
            for (rank, p) in plans.iter().enumerate() {
                let total = p.elements_sent();
                assert_eq!(total, stats.sent[rank]);
                let (right, left) = ((rank + 1) % n, (rank + n - 1) % n);
                let (cw, ccw) = if n == 2 {
                    // Both neighbours are the same rank: split by half instead.
                    (sent_within(p, 0, first).0, sent_within(p, first, count).0)
                } else {
                    assert_eq!(
                        sent_to(p, right) + sent_to(p, left),
                        total,
                        "n={n} rank={rank}"
                    );
                    // And each direction carries only its own half.
                    assert_eq!(sent_within(p, 0, first).0, sent_to(p, right));
                    assert_eq!(sent_within(p, first, count).0, sent_to(p, left));
                    (sent_to(p, right), sent_to(p, left))
                };
                cw_total += cw;
                ccw_total += ccw;
                let what = format!("n={n} count={count} rank={rank}");
                if count % (2 * n) == 0 {
                    assert_eq!(cw as f64, fraction(first), "{what}: clockwise");
                    assert_eq!(ccw as f64, fraction(second), "{what}: counter-clockwise");
                    assert_eq!(cw, ccw, "{what}: the halves are equal");
                } else {
                    assert!((cw as f64 - fraction(first)).abs() <= slack, "{what}: {cw}");
                    assert!(
                        (ccw as f64 - fraction(second)).abs() <= slack,
                        "{what}: {ccw}"
                    );
                }
                assert!(
                    (total as f64 - fraction(count)).abs() <= 2.0 * slack,
                    "{what}"
                );
            }
            // Summed over ranks every block is sent 2(N-1) times: exact.
            assert_eq!(cw_total, 2 * (n - 1) * first, "n={n} count={count}");
            assert_eq!(ccw_total, 2 * (n - 1) * second, "n={n} count={count}");
            // The same volume as the one-port ring, over twice the messages.
            let (ring, ring_stats) = all_plans(Algorithm::Ring, n, count);
            assert_eq!(ring_stats.elements, stats.elements, "n={n} count={count}");
            assert_eq!(
                stats.messages,
                2 * ring_stats.messages,
                "n={n} count={count}"
            );
            for (rank, (a, b)) in plans.iter().zip(&ring).enumerate() {
                let (a, b) = (a.elements_sent() as f64, b.elements_sent() as f64);
                // Each is within its rounding of 2(N-1)/N·M (see above).
                assert!(
                    (a - b).abs() <= 3.0 * slack,
                    "n={n} count={count} rank={rank}"
                );
                if count % (2 * n) == 0 {
                    assert_eq!(a, b, "n={n} count={count} rank={rank}");
                }
            }
        }
    }
}

#[test]
fn ring2_for_one_rank_is_a_copy_and_tiny_counts_still_match() {
    let (plans1, stats) = all_plans(Algorithm::Ring2, 1, 100);
    assert_eq!(stats.messages, 0);
    assert_eq!(plans1[0].ops().count(), 1);
    for n in 2..=9 {
        for count in 0..2 * n {
            all_plans(Algorithm::Ring2, n, count);
        }
    }
}

#[test]
fn dbtree_takes_two_ceil_log2_n_steps_when_unsegmented() {
    for n in 2..=40usize {
        for count in [2, 3, n, 2 * n + 1, 1000] {
            let (plans, stats) = all_plans(Algorithm::DoubleBinaryTree, n, count);
            assert_eq!(stats.steps, 2 * ceil_log2(n), "n={n} count={count}");
            // Unsegmented: one message per tree edge and direction.
            assert_eq!(stats.messages, 2 * 2 * (n - 1), "n={n} count={count}");
            check_dbtree_volume(&plans, &stats, n, count);
        }
    }
}

#[test]
fn dbtree_pipelines_large_buffers_in_two_ceil_log2_n_plus_s_minus_one_steps() {
    for n in [2usize, 3, 4, 5, 7, 8, 13, 16] {
        for count in [1 << 20, (1 << 22) + 3] {
            let (plans, stats) = all_plans(Algorithm::DoubleBinaryTree, n, count);
            // Rank 0 is tree 1's root with one child: one message per
            // segment of the first half goes down that edge.
            let first = count.div_ceil(2);
            let (_, segs) = sent_within(&plans[0], 0, first);
            assert!(segs > 1, "n={n} count={count}: a large buffer is pipelined");
            assert_eq!(
                stats.steps,
                2 * ceil_log2(n) + segs - 1,
                "n={n} count={count}"
            );
            check_dbtree_volume(&plans, &stats, n, count);
        }
    }
}

#[test]
fn dbtree_for_one_rank_is_a_copy() {
    for count in [0, 1, 1000] {
        let (p, stats) = all_plans(Algorithm::DoubleBinaryTree, 1, count);
        assert_eq!(stats.messages, 0);
        assert!(p[0].ops().all(|op| matches!(op, Op::Copy { .. })));
    }
}

/// The volume formulas of the module docs for one dbtree allreduce.
fn check_dbtree_volume(plans: &[Plan], stats: &plan::MessageStats, n: usize, count: usize) {
    let halves = [(0, count.div_ceil(2)), (count.div_ceil(2), count)];
    // Each tree has N-1 edges; each carries its half up once and down once.
    assert_eq!(stats.elements, 2 * (n - 1) * count, "n={n} count={count}");
    for (rank, p) in plans.iter().enumerate() {
        let what = format!("n={n} count={count} rank={rank}");
        let mut once_somewhere = false;
        let mut total = 0;
        for &(lo, hi) in &halves {
            let h = hi - lo;
            let (sent, _) = sent_within(p, lo, hi);
            total += sent;
            if h == 0 {
                assert_eq!(sent, 0, "{what}");
                continue;
            }
            assert!(
                sent % h == 0 && (1..=3).contains(&(sent / h)),
                "{what}: sends {sent} of a half of {h}"
            );
            once_somewhere |= sent == h;
        }
        assert_eq!(total, p.elements_sent(), "{what}: every send is in a half");
        assert!(
            once_somewhere || halves.iter().any(|&(lo, hi)| lo == hi),
            "{what}: a leaf (or single-child root) in neither tree"
        );
        assert!(total <= count + 2 * count.div_ceil(2), "{what}");
    }
    assert_eq!(
        stats.received.iter().sum::<usize>(),
        stats.elements,
        "n={n} count={count}"
    );
}
