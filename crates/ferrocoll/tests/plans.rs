//! Every plan of every algorithm, checked without running it: each rank's
//! plan passes `validate` (bounds, no unsafe overlap, in-place hazards) and
//! the plans of all ranks together pass `match_messages` (every send meets
//! its receive with the same length, and nothing deadlocks). Also the
//! traffic of the ring allreduce against the seeds' volume formula.

mod common;
use common::selected;

use ferrocoll::plan::{self, match_messages, validate, Layout, Plan, PlanRequest};
use ferrocoll::{Algorithm, Collective, Topology};

/// Counts around the interesting boundaries for group size `n`.
fn counts(n: usize) -> Vec<usize> {
    let mut c = vec![0, 1, 2, n.saturating_sub(1), n, n + 1, 3 * n + 2, 997];
    c.sort_unstable();
    c.dedup();
    c
}

/// Flat, every two-level factorisation (1xN and Nx1 included) and, where
/// they fit, three-level topologies.
fn topologies(n: usize) -> Vec<Topology> {
    let mut t = vec![Topology::flat(n)];
    for a in (1..=n).filter(|a| n % a == 0) {
        t.push(Topology::new(vec![a, n / a]).unwrap());
    }
    for levels in [vec![2, 2, 2], vec![2, 2, 3], vec![3, 2, 2]] {
        if levels.iter().product::<usize>() == n {
            t.push(Topology::new(levels).unwrap());
        }
    }
    t
}

fn requests(
    coll: Collective,
    n: usize,
    count: usize,
    root: usize,
    topo: &Topology,
) -> Vec<PlanRequest> {
    (0..n)
        .map(|rank| {
            let mut req = PlanRequest::new(coll, n, rank, count)
                .with_root(root)
                .with_elem_size(4)
                .with_topology(topo.clone());
            if coll == Collective::AllToAllV {
                // Uneven counts: rank r sends (r + 2p + count) % 5 elements to p.
                let send = (0..n).map(|p| (rank + 2 * p + count) % 5).collect();
                let recv = (0..n).map(|p| (p + 2 * rank + count) % 5).collect();
                req = req.with_counts(send, recv);
            }
            req
        })
        .collect()
}

fn check_all(
    coll: Collective,
    algo: Algorithm,
    n: usize,
    count: usize,
    root: usize,
    topo: &Topology,
) {
    let reqs = requests(coll, n, count, root, topo);
    let plans: Vec<Plan> = reqs
        .iter()
        .map(|r| plan::build(algo, r).expect("plan builds"))
        .collect();
    let what = format!("{coll}/{algo} n={n} count={count} root={root} topology={topo}");
    for (req, p) in reqs.iter().zip(&plans) {
        validate(p, req, Layout::OUT_OF_PLACE)
            .unwrap_or_else(|e| panic!("{what} rank {}: {e}", req.rank));
        if let Some(layout) = Layout::in_place(req) {
            validate(p, req, layout)
                .unwrap_or_else(|e| panic!("{what} rank {} in place: {e}", req.rank));
        }
    }
    match_messages(&plans).unwrap_or_else(|e| panic!("{what}: {e}"));
}

/// Algorithms that read the topology; the others are checked on flat groups.
fn reads_topology(algo: Algorithm) -> bool {
    matches!(
        algo,
        Algorithm::Hier | Algorithm::Torus2d | Algorithm::Mesh2d
    )
}

#[test]
fn every_plan_is_valid_and_deadlock_free() {
    for coll in Collective::ALL {
        for &algo in coll.algorithms().iter().filter(|&&a| selected(coll, a)) {
            for n in 1..=17 {
                let roots: Vec<usize> = if coll.has_root() {
                    (0..n).collect()
                } else {
                    vec![0]
                };
                let topos = if reads_topology(algo) {
                    topologies(n)
                } else {
                    vec![Topology::flat(n)]
                };
                for topo in &topos {
                    for count in counts(n) {
                        for &root in &roots {
                            check_all(coll, algo, n, count, root, topo);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn pipelined_chains_validate_with_many_segments() {
    // 64 MiB of f32: the chain cuts it into the maximum number of segments.
    for coll in [Collective::Broadcast, Collective::Reduce] {
        for n in [2, 3, 5, 8] {
            check_all(
                coll,
                Algorithm::Pipeline,
                n,
                16 << 20,
                n / 2,
                &Topology::flat(n),
            );
        }
    }
}

/// The seeds' ring allreduce volume: each rank sends 2(N-1)/N of the buffer.
/// Computed from the plan itself, for counts N divides and counts it does not.
#[test]
fn ring_allreduce_sends_two_n_minus_one_over_n_of_the_buffer() {
    for n in 1..=16usize {
        for count in [n * 1000, n * 64 + 5, 12_345] {
            let bytes_per_elem = 4;
            let buffer_bytes = (count * bytes_per_elem) as f64;
            let expected = 2.0 * (n as f64 - 1.0) / n as f64 * buffer_bytes;
            let mut total = 0.0;
            for rank in 0..n {
                let req = PlanRequest::new(Collective::AllReduce, n, rank, count);
                let p = plan::build(Algorithm::Ring, &req).unwrap();
                let sent = (p.elements_sent() * bytes_per_elem) as f64;
                total += sent;
                if count % n == 0 {
                    assert_eq!(sent, expected, "n={n} count={count} rank={rank}");
                } else {
                    // Uneven blocks differ by one element: within 2(N-1) elements.
                    let slack = (2 * (n - 1) * bytes_per_elem) as f64;
                    assert!(
                        (sent - expected).abs() <= slack,
                        "n={n} count={count}: {sent} vs {expected}"
                    );
                }
            }
            // Summed over ranks the formula is exact for any count.
            assert!(
                (total - expected * n as f64).abs() < 1e-6,
                "n={n} count={count}"
            );
            // And it takes 2(N-1) dependent steps.
            let plans: Vec<Plan> = (0..n)
                .map(|r| {
                    plan::build(
                        Algorithm::Ring,
                        &PlanRequest::new(Collective::AllReduce, n, r, count),
                    )
                    .unwrap()
                })
                .collect();
            assert_eq!(match_messages(&plans).unwrap().steps, 2 * (n - 1));
        }
    }
}

#[test]
fn binomial_trees_take_ceil_log2_n_steps() {
    for n in 1..=33usize {
        let log = n.next_power_of_two().trailing_zeros() as usize;
        for coll in [
            Collective::Broadcast,
            Collective::Reduce,
            Collective::Gather,
            Collective::Scatter,
        ] {
            let plans: Vec<Plan> = requests(coll, n, 10, 0, &Topology::flat(n))
                .iter()
                .map(|r| plan::build(Algorithm::Tree, r).unwrap())
                .collect();
            assert_eq!(match_messages(&plans).unwrap().steps, log, "{coll} n={n}");
        }
    }
}

#[test]
fn the_checker_catches_broken_plans() {
    use ferrocoll::plan::{Op, Round, Span};
    // Two ranks that both wait before sending: a deadlock.
    let wait_then_send = |peer| Plan {
        rounds: vec![
            Round {
                ops: vec![Op::Recv {
                    peer,
                    dst: Span::output(0, 1),
                }],
            },
            Round {
                ops: vec![Op::Send {
                    peer,
                    src: Span::input(0, 1),
                }],
            },
        ],
        scratch: 0,
    };
    let err = match_messages(&[wait_then_send(1), wait_then_send(0)]).unwrap_err();
    assert!(err.contains("deadlock"), "{err}");
    // A receive into the span a send of the same round reads.
    let req = PlanRequest::new(Collective::AllReduce, 2, 0, 4);
    let racy = Plan {
        rounds: vec![Round {
            ops: vec![
                Op::Send {
                    peer: 1,
                    src: Span::output(0, 4),
                },
                Op::Recv {
                    peer: 1,
                    dst: Span::output(2, 2),
                },
            ],
        }],
        scratch: 0,
    };
    assert!(validate(&racy, &req, Layout::OUT_OF_PLACE).is_err());
    // Lengths that disagree.
    let a = Plan {
        rounds: vec![Round {
            ops: vec![Op::Send {
                peer: 1,
                src: Span::input(0, 3),
            }],
        }],
        scratch: 0,
    };
    let b = Plan {
        rounds: vec![Round {
            ops: vec![Op::Recv {
                peer: 0,
                dst: Span::output(0, 4),
            }],
        }],
        scratch: 0,
    };
    assert!(match_messages(&[a, b]).unwrap_err().contains("expects"));
}

/// Local ops listed after a round's messages run while those are in flight:
/// the checker accepts one that touches nothing the messages use, and
/// refuses one that writes what a send reads or a receive writes, that reads
/// what a receive writes, or that a message follows.
#[test]
fn overlapped_local_ops_keep_clear_of_the_messages() {
    use ferrocoll::plan::{Op, Round, Span};
    let req = PlanRequest::new(Collective::Broadcast, 2, 0, 8);
    let plan = |ops: Vec<Op>| Plan {
        rounds: vec![Round { ops }],
        scratch: 4,
    };
    let send = Op::Send {
        peer: 1,
        src: Span::input(0, 8),
    };
    let recv = Op::Recv {
        peer: 1,
        dst: Span::output(4, 4),
    };
    let copy = |dst, src| Op::Copy { dst, src };
    // The broadcast root's copy while its child reads the input: fine.
    let root = plan(vec![send, copy(Span::output(0, 8), Span::input(0, 8))]);
    assert_eq!(validate(&root, &req, Layout::OUT_OF_PLACE), Ok(()));
    // In place the copy is a no-op, also fine.
    let layout = Layout::in_place(&req).expect("broadcast has an in-place form");
    assert_eq!(validate(&root, &req, layout), Ok(()));
    // Writing what a receive writes.
    let bad = plan(vec![recv, copy(Span::output(0, 8), Span::input(0, 8))]);
    let err = validate(&bad, &req, Layout::OUT_OF_PLACE).unwrap_err();
    assert!(err.contains("overlapped local op writes"), "{err}");
    // Reading what a receive writes.
    let bad = plan(vec![recv, copy(Span::scratch(0, 4), Span::output(4, 4))]);
    let err = validate(&bad, &req, Layout::OUT_OF_PLACE).unwrap_err();
    assert!(err.contains("overlapped local op reads"), "{err}");
    // Writing what a send reads (the output, sent by a non-root).
    let relay = Op::Send {
        peer: 1,
        src: Span::output(0, 4),
    };
    let bad = plan(vec![relay, copy(Span::output(0, 4), Span::input(0, 4))]);
    let err = validate(&bad, &req, Layout::OUT_OF_PLACE).unwrap_err();
    assert!(err.contains("overlapped local op writes"), "{err}");
    // A message after an overlapped local op.
    let bad = plan(vec![
        relay,
        copy(Span::scratch(0, 4), Span::input(4, 4)),
        recv,
    ]);
    let err = validate(&bad, &req, Layout::OUT_OF_PLACE).unwrap_err();
    assert!(err.contains("listed after an overlapped local op"), "{err}");
}
