//! MoE dispatch/combine (`ferrocoll::moe`) on ranks as threads, against the
//! naive reference of `moe_support`: 1..=8 ranks, uneven tokens with a
//! rank that has none, top-1 and top-2, dropless and capacity factors that
//! drop, the worst skew (every token to one expert), f32, bf16 and f16; every
//! element type through a round trip; and the errors.

mod moe_support;

use ferrocoll::moe::{Dispatcher, Policy, Spec};
use ferrocoll::{bf16, f16, local, Communicator, Error};
use moe_support::{check_rank, uneven_tokens, Case, Outcome, Routing, TestElem};

/// Runs `case` on its ranks in element type T; every rank must match the
/// reference. Returns each rank's outcome.
fn run_case<T: TestElem>(case: &Case) -> Vec<Outcome> {
    local::run(case.ranks, |comm| check_rank::<T>(&comm, case))
        .unwrap()
        .into_iter()
        .map(|r| r.unwrap_or_else(|e| panic!("{e}")))
        .collect()
}

/// The capacity settings every sweep covers: dropless, C = 1 (drops some
/// under random routing), C = 1/2 (drops many), C = 5/4.
const CAPACITIES: [Option<(usize, usize)>; 4] = [None, Some((1, 1)), Some((1, 2)), Some((5, 4))];

#[test]
fn matches_the_reference_on_1_to_8_ranks() {
    let mut dropped = 0;
    for n in 1..=8 {
        for topk in [1, 2] {
            // One expert per rank (blocks already in expert order) and
            // three (rows regrouped from source-major to expert-major).
            for per_rank in [1, 3] {
                for capacity in CAPACITIES {
                    let case = Case {
                        ranks: n,
                        experts: n * per_rank,
                        hidden: 5,
                        topk,
                        capacity,
                        tokens: uneven_tokens(n, (n * 10 + topk) as u64),
                        routing: Routing::Random((n * 100 + topk * 10 + per_rank) as u64),
                    };
                    let out = run_case::<f32>(&case);
                    if capacity == Some((1, 2)) {
                        dropped += out.iter().map(|o| o.dropped).sum::<usize>();
                    }
                    if capacity.is_none() {
                        assert!(out.iter().all(|o| o.dropped == 0), "{case:?}");
                    }
                }
            }
        }
    }
    // C = 1/2 must have exercised the drop path.
    assert!(dropped > 100, "only {dropped} pairs dropped at C = 1/2");
}

#[test]
fn bf16_and_f16_match_the_reference() {
    for n in 1..=8 {
        for capacity in [None, Some((1, 2))] {
            let case = Case {
                ranks: n,
                experts: 2 * n,
                hidden: 4,
                topk: 2,
                capacity,
                tokens: uneven_tokens(n, n as u64 + 7),
                routing: Routing::Random(n as u64 * 31),
            };
            run_case::<bf16>(&case);
            run_case::<f16>(&case);
        }
    }
}

#[test]
fn every_token_to_one_expert() {
    for n in 1..=8 {
        for topk in [1, 2] {
            for capacity in [None, Some((1, 1))] {
                let case = Case {
                    ranks: n,
                    experts: 2 * n,
                    hidden: 3,
                    topk,
                    capacity,
                    tokens: uneven_tokens(n, n as u64),
                    routing: Routing::Hot,
                };
                let out = run_case::<f32>(&case);
                run_case::<bf16>(&case);
                let pairs: usize = case.tokens.iter().sum::<usize>() * topk;
                // Rank 0 holds experts 0 and 1, the only ones chosen.
                let at_rank_0 = out[0].received;
                match capacity {
                    None => assert_eq!(at_rank_0, pairs, "{case:?}"),
                    Some(_) => {
                        // Each hot expert keeps ⌈pairs / E⌉ rows.
                        let cap = pairs.div_ceil(case.experts);
                        assert_eq!(at_rank_0, topk * cap.min(pairs / topk), "{case:?}");
                    }
                }
                assert!(out[1..].iter().all(|o| o.received == 0), "{case:?}");
            }
        }
    }
}

#[test]
fn priority_takes_first_choices_of_every_rank_before_second_choices() {
    // 2 ranks, 2 experts (one each), top-2, 4 tokens on rank 0 and 2 on
    // rank 1: 12 pairs, capacity ⌈12/2 · 1/2⌉ = 3 per expert. Rank 0's
    // tokens choose (1, 0), rank 1's (0, 1).
    let tokens = [4usize, 2];
    let dropped = local::run(2, |comm| {
        let spec = Spec::new(
            2,
            1,
            2,
            Policy::Drop {
                capacity_factor: 0.5,
            },
        );
        let moe = Dispatcher::new(&comm, spec)?;
        let r = comm.rank();
        let t = tokens[r];
        let choices: [u32; 2] = if r == 0 { [1, 0] } else { [0, 1] };
        let idx: Vec<u32> = (0..t).flat_map(|_| choices).collect();
        let x: Vec<f32> = (0..t).map(|i| i as f32).collect();
        let (_, handle) = moe.dispatch(&x, &idx, &vec![1.0; 2 * t])?;
        assert_eq!(handle.capacity(), Some(3));
        assert_eq!(handle.dropped_everywhere(), 6);
        Ok::<_, Error>(
            handle
                .dropped()
                .iter()
                .map(|d| (d.token, d.choice, d.expert))
                .collect::<Vec<_>>(),
        )
    })
    .unwrap();
    // Expert 0: rank 1's two first choices come before rank 0's second
    // choices (a choice index outranks a rank), which fill the last slot
    // with token 0's. Expert 1: rank 0's first choices of tokens 0-2 (the
    // earlier tokens), then it is full: token 3's and rank 1's second
    // choices drop.
    assert_eq!(
        dropped[0].as_ref().unwrap(),
        &vec![(1, 1, 0), (2, 1, 0), (3, 0, 1), (3, 1, 0)],
        "rank 0"
    );
    assert_eq!(
        dropped[1].as_ref().unwrap(),
        &vec![(0, 1, 1), (1, 1, 1)],
        "rank 1"
    );
}

#[test]
fn zero_tokens_everywhere() {
    for n in [1, 3, 4] {
        let case = Case {
            ranks: n,
            experts: n,
            hidden: 2,
            topk: 2,
            capacity: Some((1, 1)),
            tokens: vec![0; n],
            routing: Routing::Random(1),
        };
        let out = run_case::<f32>(&case);
        assert!(out.iter().all(|o| o.received == 0 && o.dropped == 0));
    }
}

/// Rows of small integers, exact in every element type.
trait Small: ferrocoll::moe::Accumulate + Copy {
    fn small(v: u8) -> Self;
}

macro_rules! small {
    ($($t:ty => $f:expr),* $(,)?) => {$(
        impl Small for $t {
            fn small(v: u8) -> Self {
                $f(v)
            }
        }
    )*};
}

small!(
    f32 => f32::from, f64 => f64::from, f16 => f16::from, bf16 => bf16::from,
    i8 => |v: u8| v as i8, i32 => i32::from, i64 => i64::from,
    u8 => |v: u8| v, u32 => u32::from, u64 => u64::from,
);

/// Top-2 with weights 1/2 and 1/2 and experts that return their input:
/// y = x exactly, whatever the element type.
fn round_trip<T: Small>(comm: &Communicator) -> Result<bool, Error> {
    let (n, r) = (comm.size(), comm.rank());
    let moe = Dispatcher::new(comm, Spec::new(2 * n, 3, 2, Policy::Dropless))?;
    let t = 2 + r;
    let x: Vec<T> = (0..t * 3)
        .map(|i| T::small((i * 7 + r) as u8 % 100))
        .collect();
    let idx: Vec<u32> = (0..2 * t).map(|p| ((p * 5 + r) % (2 * n)) as u32).collect();
    let (inputs, handle) = moe.dispatch(&x, &idx, &vec![0.5; 2 * t])?;
    let y = moe.combine(inputs.as_slice(), &handle)?;
    Ok(y == x)
}

#[test]
fn every_element_type_round_trips() {
    fn all<T: Small>(name: &str) {
        for n in [1, 2, 3] {
            for ok in local::run(n, |comm| round_trip::<T>(&comm)).unwrap() {
                assert!(ok.unwrap(), "{name} on {n} ranks");
            }
        }
    }
    all::<f32>("f32");
    all::<f64>("f64");
    all::<f16>("f16");
    all::<bf16>("bf16");
    all::<i8>("i8");
    all::<i32>("i32");
    all::<i64>("i64");
    all::<u8>("u8");
    all::<u32>("u32");
    all::<u64>("u64");
}

#[test]
fn experts_that_do_not_divide_among_the_ranks_are_an_error() {
    let errs = local::run(3, |comm| {
        Dispatcher::new(&comm, Spec::new(4, 8, 1, Policy::Dropless)).map(|_| ())
    })
    .unwrap();
    for e in errs {
        let msg = e.unwrap_err().to_string();
        assert!(
            msg.contains("4 experts cannot be split evenly over 3 ranks"),
            "{msg}"
        );
    }
    let bad_specs = [
        (Spec::new(2, 0, 1, Policy::Dropless), "hidden is 0"),
        (Spec::new(2, 4, 0, Policy::Dropless), "topk is 0"),
        (
            Spec::new(
                2,
                4,
                1,
                Policy::Drop {
                    capacity_factor: f64::NAN,
                },
            ),
            "must be finite and positive",
        ),
        (
            Spec::new(
                2,
                4,
                1,
                Policy::Drop {
                    capacity_factor: 0.0,
                },
            ),
            "must be finite and positive",
        ),
    ];
    for (spec, want) in bad_specs {
        let r = local::run(1, |comm| Dispatcher::new(&comm, spec).map(|_| ())).unwrap();
        let msg = r[0].as_ref().unwrap_err().to_string();
        assert!(msg.contains(want), "{spec:?}: {msg}");
    }
}

/// Rank 1 calls dispatch with `bad` arguments, the others with good ones:
/// every rank must fail (rank 1 saying what to fix, the others naming rank
/// 1), and a dispatch after it must work everywhere.
fn one_rank_errs(bad: fn(&Dispatcher) -> Result<(), Error>) -> Vec<String> {
    local::run(3, |comm| {
        let moe = Dispatcher::new(&comm, Spec::new(6, 2, 2, Policy::Dropless))?;
        let (x, idx, w) = (vec![1.0f32; 4], vec![0u32, 5, 2, 3], vec![1.0f32; 4]);
        let first = if comm.rank() == 1 {
            bad(&moe)
        } else {
            moe.dispatch(&x, &idx, &w).map(|_| ())
        };
        // The communicator is still usable: every rank took part in the
        // count exchange and none in the rows' exchange.
        let (inputs, handle) = moe.dispatch(&x, &idx, &w)?;
        let y = moe.combine(inputs.as_slice(), &handle)?;
        assert_eq!(y, vec![2.0f32; 4]);
        Ok::<_, Error>(first.unwrap_err().to_string())
    })
    .unwrap()
    .into_iter()
    .map(|r| r.unwrap())
    .collect()
}

#[test]
fn argument_errors_reach_every_rank_and_say_what_to_fix() {
    type Bad = fn(&Dispatcher) -> Result<(), Error>;
    let cases: [(Bad, &str); 4] = [
        (
            |m| m.dispatch(&[1.0f32; 5], &[0, 1], &[1.0, 1.0]).map(|_| ()),
            "x has 5 elements, not a multiple of hidden = 2",
        ),
        (
            |m| m.dispatch(&[1.0f32; 4], &[0, 1, 2], &[1.0; 4]).map(|_| ()),
            "topk_idx has 3 entries but must have 4 (2 tokens x top-2",
        ),
        (
            |m| {
                m.dispatch(&[1.0f32; 4], &[0, 1, 2, 3], &[1.0; 2])
                    .map(|_| ())
            },
            "topk_weights has 2 entries but must have 4",
        ),
        (
            |m| {
                m.dispatch(&[1.0f32; 4], &[0, 1, 9, 3], &[1.0; 4])
                    .map(|_| ())
            },
            "topk_idx[2] = 9 (token 1, choice 0) is not an expert; use 0..6",
        ),
    ];
    for (bad, want) in cases {
        let msgs = one_rank_errs(bad);
        assert!(msgs[1].contains(want), "{}", msgs[1]);
        for r in [0, 2] {
            assert!(
                msgs[r].contains("rank(s) 1 passed arguments dispatch cannot use"),
                "{}",
                msgs[r]
            );
        }
    }
}

#[test]
fn dispatchers_that_disagree_fail_on_every_rank() {
    let msgs = local::run(3, |comm| {
        let factor = if comm.rank() == 2 { 2.0 } else { 1.0 };
        let spec = Spec::new(
            3,
            2,
            1,
            Policy::Drop {
                capacity_factor: factor,
            },
        );
        let moe = Dispatcher::new(&comm, spec)?;
        let err = moe
            .dispatch(&[1.0f32; 2], &[0], &[1.0])
            .map(|_| ())
            .unwrap_err();
        Ok::<_, Error>(err.to_string())
    })
    .unwrap();
    for (r, m) in msgs.into_iter().enumerate() {
        let m = m.unwrap();
        let names = if r == 2 { "rank(s) 0, 1" } else { "rank(s) 2" };
        assert!(
            m.contains(names) && m.contains("different Spec"),
            "rank {r}: {m}"
        );
    }
}

#[test]
fn combine_checks_its_arguments() {
    let msgs = local::run(2, |comm| {
        let moe = Dispatcher::new(&comm, Spec::new(2, 3, 1, Policy::Dropless))?;
        let (inputs, handle) = moe.dispatch(&[1.0f32; 6], &[0, 1], &[1.0, 1.0])?;
        // Each rank receives one row from each rank: 2 rows of 3.
        assert_eq!(inputs.rows(), 2);
        let short = moe.combine(&inputs.as_slice()[..5], &handle).unwrap_err();
        let other = Dispatcher::new(&comm, Spec::new(2, 4, 1, Policy::Dropless))?;
        let foreign = other.combine(&[0.0f32; 8], &handle).unwrap_err();
        Ok::<_, Error>((short.to_string(), foreign.to_string()))
    })
    .unwrap();
    for m in msgs {
        let (short, foreign) = m.unwrap();
        assert!(
            short.contains("expert_outputs has 5 elements but must have 6 (the 2 rows"),
            "{short}"
        );
        assert!(foreign.contains("not of this dispatcher"), "{foreign}");
    }
}
