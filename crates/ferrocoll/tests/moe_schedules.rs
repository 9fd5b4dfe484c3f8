//! MoE dispatch/combine under every schedule (`ferrocoll::moe::Schedule`)
//! on ranks as threads: 1..=8 ranks on every topology of their number
//! (flat, one host, one rank per host, every G x L and 2x2x2), each
//! schedule against the naive reference of `moe_support` and bit for bit
//! against the others; what `auto` chooses on a profile where inter-host
//! start-ups are dear; a forced alltoallv algorithm; ranks that disagree.

mod moe_support;

use ferrocoll::cost::{LinkParams, Profile};
use ferrocoll::moe::{Dispatcher, Policy, Schedule, Spec};
use ferrocoll::{bf16, local, Algorithm, CallOptions, Collective, Config, Error, Topology};
use moe_support::{check_with, uneven_tokens, Case, Checked, Routing, TestElem};

/// Every topology of `n` ranks: flat, and every product of levels whose
/// sizes are at least 1 (1 x n, n x 1, ...), plus 2x2x2 for 8.
fn topologies(n: usize) -> Vec<Topology> {
    let mut out = vec![Topology::flat(n)];
    for g in (1..=n).filter(|g| n % g == 0) {
        out.push(Topology::new(vec![g, n / g]).unwrap());
    }
    if n == 8 {
        out.push("2x2x2".parse().unwrap());
    }
    out
}

/// Runs `case` under every schedule on `topo` (with `profile`, else the
/// built-in one); every rank's results, one per schedule in `Schedule::ALL`
/// order.
fn every_schedule<T: TestElem + Send>(
    case: &Case,
    topo: &Topology,
    profile: Option<Profile>,
) -> Vec<Vec<Checked<T>>> {
    let mut config = Config::default().with_topology(topo.clone());
    config.profile = profile;
    local::run_with(case.ranks, config, |comm| {
        Schedule::ALL
            .iter()
            .map(|&s| {
                let moe = Dispatcher::new(&comm, case.spec().with_schedule(s))
                    .map_err(|e| e.to_string())?;
                check_with::<T>(&moe, comm.rank(), case)
            })
            .collect::<Result<Vec<_>, String>>()
    })
    .unwrap()
    .into_iter()
    .map(|r| r.unwrap_or_else(|e| panic!("{e}")))
    .collect()
}

/// Every schedule matches the reference and the others bit for bit, and
/// reports what it ran.
fn check_case<T: TestElem + Send>(case: &Case, topo: &Topology) {
    check_case_on::<T>(case, topo, None);
}

/// [`check_case`] with a profile; returns whether some flat exchange ran
/// expert by expert.
fn check_case_on<T: TestElem + Send>(
    case: &Case,
    topo: &Topology,
    profile: Option<Profile>,
) -> bool {
    let bits = |v: &[T]| v.iter().map(|x| x.to_f32().to_bits()).collect::<Vec<_>>();
    let mut by_expert = false;
    for (rank, runs) in every_schedule::<T>(case, topo, profile).iter().enumerate() {
        let what = format!("{case:?} on {topo}, rank {rank}");
        for (run, &s) in runs.iter().zip(&Schedule::ALL) {
            by_expert |= run.by_expert.contains(&true);
            assert_eq!(run.wrong, 0, "{what}, {s}: {:?}", run.first);
            assert_eq!(bits(&run.inputs), bits(&runs[0].inputs), "{what}: {s}");
            assert_eq!(bits(&run.y), bits(&runs[0].y), "{what}: {s}");
            for ran in run.schedules {
                match s {
                    Schedule::Auto => assert!(
                        [
                            Schedule::Direct,
                            Schedule::Pairwise,
                            Schedule::TwoLevel,
                            Schedule::Rail
                        ]
                        .contains(&ran),
                        "{what}: auto ran {ran}"
                    ),
                    forced => assert_eq!(ran, forced, "{what}"),
                }
            }
        }
    }
    by_expert
}

#[test]
fn every_schedule_matches_the_reference_on_every_topology() {
    for n in 1..=8 {
        for topo in topologies(n) {
            for (topk, capacity, routing) in [
                (2, Some((1, 2)), Routing::Random(n as u64 * 7)),
                (2, None, Routing::Random(n as u64 * 7 + 1)),
                (1, None, Routing::Hot),
            ] {
                let case = Case {
                    ranks: n,
                    experts: 2 * n,
                    hidden: 5,
                    topk,
                    capacity,
                    tokens: uneven_tokens(n, n as u64 + 11),
                    routing,
                };
                check_case::<f32>(&case, &topo);
            }
        }
    }
}

#[test]
fn flat_exchanges_expert_by_expert_give_the_same_rows() {
    // A dear copy makes every flat exchange of more than one expert a rank
    // run one all-to-all-v per expert; a free one never does.
    let mut dear = Profile::thread_default();
    dear.copy = 1e-3;
    let mut free = dear.clone();
    free.copy = 0.0;
    for n in [2, 3, 4] {
        let case = Case {
            ranks: n,
            experts: 3 * n,
            hidden: 6,
            topk: 2,
            capacity: Some((3, 4)),
            tokens: uneven_tokens(n, 99),
            routing: Routing::Random(n as u64),
        };
        let topo: Topology = if n == 4 {
            "2x2".parse().unwrap()
        } else {
            Topology::flat(n)
        };
        assert!(
            check_case_on::<f32>(&case, &topo, Some(dear.clone())),
            "{case:?}"
        );
        assert!(
            !check_case_on::<f32>(&case, &topo, Some(free.clone())),
            "{case:?}"
        );
    }
}

#[test]
fn bf16_rows_of_the_seeds_width_and_zero_tokens() {
    for (topo, tokens) in [("2x2", vec![3, 0, 5, 2]), ("2x3", vec![0; 6])] {
        let topo: Topology = topo.parse().unwrap();
        let n = topo.size();
        let case = Case {
            ranks: n,
            experts: 4 * n,
            hidden: 2048,
            topk: 2,
            capacity: Some((5, 4)),
            tokens,
            routing: Routing::Random(3),
        };
        check_case::<bf16>(&case, &topo);
    }
}

/// Fast intra-host links; slow inter-host ones, shared by a host's ranks,
/// with a large start-up per message.
fn dear_start_ups() -> Profile {
    let mut p = Profile::uniform(2e-6, 10e9, 0.0);
    p.inter = LinkParams {
        alpha: 50e-6,
        beta: 0.125e9,
        overhead: 40e-6,
        piece: 0.0,
    };
    p.inter_ports = 1.0;
    p
}

/// The schedules `auto` ran for dispatch and combine on 2x4 ranks with
/// `hidden`-wide rows, 2 tokens a rank.
fn auto_on_2x4(profile: Option<Profile>, hidden: usize) -> [Schedule; 2] {
    let mut config = Config::default().with_topology("2x4".parse().unwrap());
    config.profile = profile;
    let ran = local::run_with(8, config, |comm| {
        let moe = Dispatcher::new(&comm, Spec::new(16, hidden, 2, Policy::Dropless))?;
        let r = comm.rank() as u32;
        let idx = [r, (r + 5) % 16, (r + 9) % 16, (r + 14) % 16];
        let (inputs, handle) = moe.dispatch(&vec![1.0f32; 2 * hidden], &idx, &[0.5; 4])?;
        let y = moe.combine(inputs.as_slice(), &handle)?;
        assert_eq!(y, vec![1.0f32; 2 * hidden]);
        Ok::<_, Error>([handle.dispatch_schedule(), handle.combine_schedule()])
    })
    .unwrap();
    let first = *ran[0].as_ref().unwrap();
    for r in &ran {
        assert_eq!(r.as_ref().unwrap(), &first, "every rank chooses alike");
    }
    first
}

#[test]
fn auto_goes_two_level_when_inter_host_start_ups_dominate() {
    // A row of 64 B per pair: every inter-host start-up saved counts.
    assert_eq!(
        auto_on_2x4(Some(dear_start_ups()), 16),
        [Schedule::TwoLevel; 2]
    );
    // Rows of 1 MiB: the bytes dominate and aggregating only adds copies
    // and rounds.
    let mut copies = dear_start_ups();
    copies.copy = 1e-10;
    assert_eq!(auto_on_2x4(Some(copies), 1 << 18), [Schedule::Direct; 2]);
    // The built-in profile has one link class: no reason to forward.
    assert_eq!(auto_on_2x4(None, 16), [Schedule::Direct; 2]);
}

#[test]
fn a_forced_alltoallv_algorithm_keeps_the_flat_exchange() {
    let config = Config::default()
        .with_topology("2x2".parse().unwrap())
        .with_algorithm(Collective::AllToAllV, Algorithm::Pairwise)
        .unwrap();
    let ran = local::run_with(4, config, |comm| {
        let moe = Dispatcher::new(&comm, Spec::new(4, 3, 1, Policy::Dropless))?;
        let (_, h) = moe.dispatch(&[1.0f32; 3], &[comm.rank() as u32 ^ 1], &[1.0])?;
        let hier = comm.with_options(CallOptions::algorithm(Algorithm::Hier));
        let moe = Dispatcher::new(&hier, Spec::new(4, 3, 1, Policy::Dropless))?;
        let (inputs, h2) = moe.dispatch(&[2.0f32; 3], &[3], &[1.0])?;
        let y = moe.combine(inputs.as_slice(), &h2)?;
        assert_eq!(y, vec![2.0; 3]);
        Ok::<_, Error>((h.dispatch_schedule(), h2.combine_schedule()))
    })
    .unwrap();
    for r in ran {
        assert_eq!(r.unwrap(), (Schedule::Flat, Schedule::Flat));
    }
}

#[test]
fn ranks_that_force_different_schedules_fail_on_every_rank() {
    let config = Config::default().with_topology("2x2".parse().unwrap());
    let msgs = local::run_with(4, config, |comm| {
        let s = if comm.rank() == 3 {
            Schedule::TwoLevel
        } else {
            Schedule::Direct
        };
        let moe = Dispatcher::new(&comm, Spec::new(4, 2, 1, Policy::Dropless).with_schedule(s))?;
        let err = moe.dispatch(&[1.0f32; 2], &[0], &[1.0]).unwrap_err();
        Ok::<_, Error>(err.to_string())
    })
    .unwrap();
    for (r, m) in msgs.into_iter().enumerate() {
        let m = m.unwrap();
        let names = if r == 3 {
            "rank(s) 0, 1, 2"
        } else {
            "rank(s) 3"
        };
        assert!(m.contains(names) && m.contains("schedule"), "rank {r}: {m}");
    }
}

#[test]
fn auto_races_flat_against_hierarchical_and_every_rank_runs_the_same() {
    // The 2-host cluster's profile (bench/RESULTS.md): at one token a rank
    // direct, two-level and rail are predicted within 2x of each other, so
    // auto races them on real calls, in turns, then keeps one.
    let mut p = Profile::uniform(11.9e-6, 17e9, 1.9e-11);
    p.intra.overhead = 0.27e-6;
    p.inter = LinkParams {
        alpha: 7.4e-6,
        beta: 0.136e9,
        overhead: 11.8e-6,
        piece: 0.0,
    };
    p.inter_ports = 1.0;
    p.copy = 1.7e-11;
    let mut config = Config::default().with_topology("2x2".parse().unwrap());
    config.profile = Some(p);
    let ran = local::run_with(4, config, |comm| {
        let moe = Dispatcher::new(&comm, Spec::new(8, 2048, 2, Policy::Dropless))?;
        let r = comm.rank() as u32;
        let x = vec![bf16::ONE; 2048];
        let mut ran = Vec::new();
        // A race ends by 40 calls of each of at most 4 candidates.
        for _ in 0..170 {
            let (inputs, h) = moe.dispatch(&x, &[r, (r + 3) % 8], &[0.5, 0.5])?;
            let y = moe.combine(inputs.as_slice(), &h)?;
            assert_eq!(y, x);
            ran.push([h.dispatch_schedule(), h.combine_schedule()]);
        }
        Ok::<_, Error>(ran)
    })
    .unwrap();
    let first = ran[0].as_ref().unwrap();
    for r in &ran {
        assert_eq!(
            r.as_ref().unwrap(),
            first,
            "every rank runs the same schedules"
        );
    }
    let tried: std::collections::HashSet<Schedule> = first.iter().map(|s| s[0]).collect();
    let hierarchical = |s: &Schedule| matches!(s, Schedule::TwoLevel | Schedule::Rail);
    assert!(
        tried.iter().any(hierarchical) && tried.iter().any(|s| !hierarchical(s)),
        "both families raced: {first:?}"
    );
    // Once the race is over, one schedule stays.
    assert!(first[161..].windows(2).all(|w| w[0] == w[1]), "{first:?}");
}
