//! Full runs are sized before they start: the estimate counts the plans
//! exactly on small groups, and a run that would not fit in the memory
//! allowed is refused with the estimate, quickly, instead of growing until
//! the kernel kills it.

use std::time::Instant;

use ferrocoll::{Algorithm, Collective};
use ferrocoll_sim::{
    build_plans, element_count, estimate_jobs, simulate_with, Job, Mode, SimOptions, TopologySpec,
};

fn job(coll: Collective, algo: Algorithm, bytes: usize, n: usize) -> Job {
    Job {
        coll,
        algo,
        bytes,
        ranks: (0..n).collect(),
    }
}

#[test]
fn small_runs_are_counted_exactly() {
    use Algorithm::*;
    use Collective::*;
    let cases = [
        (
            AllReduce,
            Ring,
            1 << 20,
            "switch:ranks=12,bw=50GB/s,lat=2us",
        ),
        (
            AllReduce,
            Direct,
            3 << 20,
            "fat-tree:ranks=16,leaf=4,bw=50GB/s,lat=1us,oversub=2",
        ),
        (
            AllReduce,
            DoubleBinaryTree,
            5 << 20,
            "switch:ranks=13,bw=50GB/s,lat=2us",
        ),
        (
            AllReduce,
            Hier,
            1 << 22,
            "two-level:nodes=4,gpus=4,intra=450GB/s@1us,inter=25GB/s@2us",
        ),
        (
            AllToAll,
            Pairwise,
            1 << 20,
            "ring:ranks=8,bw=50GB/s,lat=1us",
        ),
        (Broadcast, Tree, 1000003, "switch:ranks=9,bw=50GB/s,lat=2us"),
    ];
    for (coll, algo, bytes, topo) in cases {
        let t = TopologySpec::parse(topo).unwrap();
        let n = t.ranks();
        for mode in [Mode::Ideal, Mode::Contention] {
            for gamma in [0.0, 1e-11] {
                let opts = SimOptions {
                    gamma,
                    ..SimOptions::default()
                };
                let what = format!("{coll} {algo} on {topo}, {mode:?}, gamma {gamma}");
                let est = estimate_jobs(&[job(coll, algo, bytes, n)], &t, mode, &opts).unwrap();
                assert!(est.exact(), "{what}");
                let r = simulate_with(coll, algo, bytes, &t, mode, &opts).unwrap();
                assert_eq!(est.events, r.events, "{what}");
                let plans =
                    build_plans(coll, algo, n, element_count(coll, n, bytes, 4), &t).unwrap();
                let sends: usize = plans.iter().map(|p| p.messages_sent()).sum();
                assert_eq!(est.footprint.messages, sends as u64, "{what}");
                assert_eq!(est.footprint.receives, sends as u64, "{what}");
                let rounds: usize = plans.iter().map(|p| p.rounds.len()).sum();
                assert_eq!(est.footprint.rounds, rounds as u64, "{what}");
                assert!(est.bytes() > est.footprint.messages * 48, "{what}");
            }
        }
    }
}

#[test]
fn large_groups_are_estimated_from_a_sample() {
    // A ring's ranks are alike: the sample's counts are the exact ones.
    let t = TopologySpec::parse("switch:ranks=1024,bw=50GB/s,lat=2us").unwrap();
    let opts = SimOptions::default();
    let j = job(Collective::AllReduce, Algorithm::Ring, 64 << 20, 1024);
    let est = estimate_jobs(&[j], &t, Mode::Contention, &opts).unwrap();
    assert!(!est.exact() && est.sampled <= 66);
    assert_eq!(est.footprint.messages, 1024 * 2046);
    // Per message its start and delivery, per round (one message each)
    // its post: the round's only receive is laid out on the receiver's
    // port at once, without a chunk's hop.
    assert_eq!(est.events, 1024 * 2046 * 3);
}

#[test]
fn a_run_over_the_limit_is_refused_with_its_estimate() {
    let t = TopologySpec::parse("switch:ranks=64,bw=50GB/s,lat=2us").unwrap();
    let run = |limit: Option<u64>| {
        let opts = SimOptions {
            memory_limit: limit,
            ..SimOptions::default()
        };
        simulate_with(
            Collective::AllReduce,
            Algorithm::Ring,
            16 << 20,
            &t,
            Mode::Contention,
            &opts,
        )
    };
    let e = run(Some(1 << 20)).unwrap_err();
    assert!(e.contains("would need about"), "{e}");
    assert!(e.contains("8.06 k messages"), "{e}");
    assert!(
        e.contains("1.0 MB is available (the memory limit given)"),
        "{e}"
    );
    assert!(e.contains("--aggregate"), "{e}");
    assert!(e.contains("counted from every plan"), "{e}");
    assert!(run(Some(1 << 30)).is_ok());
}

#[test]
fn the_issues_ring_is_refused_in_seconds() {
    // 16,384 ranks of a ring allreduce of 256 MB: 537 M messages, tens of
    // GB. Refused from a sample of its plans; nothing is built in full.
    let t = TopologySpec::parse("switch:ranks=16384,bw=50GB/s,lat=2us").unwrap();
    let opts = SimOptions {
        memory_limit: Some(8 << 30),
        ..SimOptions::default()
    };
    let start = Instant::now();
    let e = simulate_with(
        Collective::AllReduce,
        Algorithm::Ring,
        256_000_000,
        &t,
        Mode::Contention,
        &opts,
    )
    .unwrap_err();
    let secs = start.elapsed().as_secs_f64();
    assert!(e.contains("537 M messages"), "{e}");
    assert!(e.contains("estimated from 66 of the 16384 plans"), "{e}");
    assert!(secs < 20.0, "{secs} s");
    let j = job(Collective::AllReduce, Algorithm::Ring, 256_000_000, 16384);
    let est = estimate_jobs(&[j], &t, Mode::Contention, &opts).unwrap();
    assert!(est.bytes() > 50_000_000_000, "{}", est.bytes());
}

#[test]
fn the_aggregated_mode_sizes_its_quotient_too() {
    let t = TopologySpec::parse("switch:ranks=1024,bw=50GB/s,lat=2us").unwrap();
    let run = |limit: Option<u64>, bytes: usize| {
        let opts = SimOptions {
            memory_limit: limit,
            ..SimOptions::default()
        };
        ferrocoll_sim::simulate_aggregated(
            Collective::AllReduce,
            Algorithm::Ring,
            bytes,
            &t,
            Mode::Contention,
            &opts,
        )
    };
    // Even and uneven blocks alike: one rank simulated, 2,046 messages.
    for bytes in [64 << 20, 1000003] {
        let e = run(Some(1000), bytes).unwrap_err();
        assert!(
            e.contains("the aggregated run (1 of 1024 ranks simulated) would need about"),
            "{e}"
        );
        assert!(
            e.contains("2.05 k messages") && e.contains("use fewer ranks"),
            "{e}"
        );
        assert!(run(Some(1 << 30), bytes).is_ok());
    }
}

#[test]
fn plans_built_elsewhere_are_refused_without_suggesting_the_aggregated_mode() {
    // `simulate_plans` (the MoE schedules' path) has no aggregated mode:
    // its refusal must not send the user to a flag it does not take.
    let t = TopologySpec::parse("switch:ranks=64,bw=50GB/s,lat=2us").unwrap();
    let plans = build_plans(Collective::AllReduce, Algorithm::Ring, 64, 4 << 20, &t).unwrap();
    let build = |r: usize| Ok(plans[r].clone());
    let opts = SimOptions {
        memory_limit: Some(1 << 20),
        ..SimOptions::default()
    };
    let run = |opts: &SimOptions| {
        ferrocoll_sim::simulate_plans(
            &build,
            4,
            (Collective::AllReduce, 16 << 20),
            &t,
            Mode::Contention,
            opts,
        )
    };
    let e = run(&opts).unwrap_err();
    assert!(e.contains("would need about"), "{e}");
    assert!(e.contains("use fewer ranks"), "{e}");
    assert!(!e.contains("--aggregate"), "{e}");
    assert!(run(&SimOptions::default()).is_ok());
}
