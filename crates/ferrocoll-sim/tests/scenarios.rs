//! Scenarios (stragglers, slow ranks, slow and failed links), several jobs
//! on one fabric, and the utilization timeline with its SVG plot.

use std::time::Instant;

use ferrocoll::{Algorithm, Collective};
use ferrocoll_sim::{
    plot, simulate, simulate_jobs, simulate_with, Job, Mode, SimOptions, SimResult, TopologySpec,
    TIMELINE_BUCKETS,
};

fn topo(s: &str) -> TopologySpec {
    TopologySpec::parse(s).unwrap()
}

fn job(coll: Collective, algo: Algorithm, bytes: usize, ranks: &[usize]) -> Job {
    Job {
        coll,
        algo,
        bytes,
        ranks: ranks.to_vec(),
    }
}

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a / b - 1.0).abs() < tol
}

/// A ring is a chain of dependencies: every step waits for the neighbour's
/// previous one, so a rank that starts 1 ms late pushes the whole
/// collective back by that 1 ms (the others wait for it in their first
/// steps and nothing can be overlapped with the wait).
#[test]
fn a_straggler_delays_a_ring_by_its_delay() {
    let t = topo("switch:ranks=8,bw=50GB/s,lat=2us");
    let bytes = 16 << 20;
    let base = simulate(
        Collective::AllReduce,
        Algorithm::Ring,
        bytes,
        &t,
        Mode::Ideal,
    )
    .unwrap();
    let opts = SimOptions {
        start_delay: vec![(3, 1e-3)],
        ..SimOptions::default()
    };
    let late = simulate_with(
        Collective::AllReduce,
        Algorithm::Ring,
        bytes,
        &t,
        Mode::Ideal,
        &opts,
    )
    .unwrap();
    let delay = late.time_s - base.time_s;
    println!(
        "ring allreduce 16 MiB on 8 ranks: {:.1} us, with rank 3 1 ms late {:.1} us (+{:.1} us)",
        base.time_s * 1e6,
        late.time_s * 1e6,
        delay * 1e6
    );
    assert!(close(delay, 1e-3, 0.05), "delay {delay}");
    // Invalid scenarios are errors, not silent no-ops.
    for bad in [(8, 1e-3), (3, -1.0), (3, f64::NAN)] {
        let opts = SimOptions {
            start_delay: vec![bad],
            ..SimOptions::default()
        };
        assert!(simulate_with(
            Collective::AllReduce,
            Algorithm::Ring,
            bytes,
            &t,
            Mode::Ideal,
            &opts
        )
        .is_err());
    }
}

/// A rank that reduces 4x slower holds up every ring step that reduces on
/// it; an allgather only copies and does not notice.
#[test]
fn a_slow_rank_hurts_reductions_not_copies() {
    let t = topo("switch:ranks=8,bw=50GB/s,lat=2us");
    let bytes = 16 << 20;
    let gamma = SimOptions {
        gamma: 1e-10,
        ..SimOptions::default()
    };
    let slow = SimOptions {
        compute_slowdown: vec![(3, 4.0)],
        ..gamma.clone()
    };
    let ratio = |coll| {
        let run = |o: &SimOptions| {
            simulate_with(coll, Algorithm::Ring, bytes, &t, Mode::Contention, o)
                .unwrap()
                .time_s
        };
        run(&slow) / run(&gamma)
    };
    let (reduce, copy) = (ratio(Collective::AllReduce), ratio(Collective::AllGather));
    println!("slow rank 3 (gamma x4): allreduce x{reduce:.3}, allgather x{copy:.3}");
    assert!(reduce > 1.2, "{reduce}");
    assert!((copy - 1.0).abs() < 1e-12, "{copy}");
    assert!(reduce > copy);
}

/// Direct all-to-all on an oversubscribed fat tree is bound by the leaf
/// uplinks; a quarter of the bandwidth on the hottest one makes that leaf's
/// traffic take about 4x as long. A failed link is an error naming it.
#[test]
fn slow_and_failed_links() {
    let t = topo("fat-tree:ranks=16,leaf=4,bw=50GB/s,lat=1us,oversub=2");
    let (coll, algo, bytes) = (Collective::AllToAll, Algorithm::Direct, 16 << 20);
    let base = simulate(coll, algo, bytes, &t, Mode::Contention).unwrap();
    let hot = base.hottest_link.clone();
    assert!(hot.starts_with("leaf-"), "{hot}");
    let slowed = |name: &str, f: f64| SimOptions {
        slow_links: vec![(name.to_string(), f)],
        ..SimOptions::default()
    };
    let slow = simulate_with(coll, algo, bytes, &t, Mode::Contention, &slowed(&hot, 4.0)).unwrap();
    let ratio = slow.time_s / base.time_s;
    println!(
        "alltoall 16 MiB, 16 ranks: {:.1} us; {hot} at 1/4 bandwidth: {:.1} us (x{ratio:.2}), hottest {}",
        base.time_s * 1e6,
        slow.time_s * 1e6,
        slow.hottest_link
    );
    assert!(ratio > 1.5, "{ratio}");
    assert_eq!(slow.hottest_link, hot);
    // A whole class by its name: every leaf uplink at half bandwidth.
    let class = simulate_with(
        coll,
        algo,
        bytes,
        &t,
        Mode::Contention,
        &slowed("leaf-up", 2.0),
    )
    .unwrap();
    assert!(class.time_s > 1.5 * base.time_s);
    // Failed: an error that names the link, at once.
    for mode in [Mode::Ideal, Mode::Contention] {
        let start = Instant::now();
        let e =
            simulate_with(coll, algo, bytes, &t, mode, &slowed(&hot, f64::INFINITY)).unwrap_err();
        assert!(start.elapsed().as_secs_f64() < 1.0);
        assert!(e.contains(&hot) && e.contains("failed"), "{e}");
    }
    // A failed link nobody needs does not matter: ranks 0..3 stay in leaf 0.
    let inside = simulate_jobs(
        &[job(coll, algo, bytes / 4, &[0, 1, 2, 3])],
        &t,
        Mode::Contention,
        &slowed("leaf-up[0]", f64::INFINITY),
    )
    .unwrap();
    assert!(inside[0].time_s > 0.0);
    let e = simulate_with(
        coll,
        algo,
        bytes,
        &t,
        Mode::Ideal,
        &slowed("nic-up[0]", 2.0),
    )
    .unwrap_err();
    assert!(e.contains("nic-up[0]"), "{e}");
    assert!(simulate_with(coll, algo, bytes, &t, Mode::Ideal, &slowed(&hot, 0.0)).is_err());
}

#[test]
fn one_job_is_simulate() {
    for (coll, algo, s) in [
        (
            Collective::AllReduce,
            Algorithm::Hier,
            "two-level:nodes=2,gpus=4,intra=450GB/s@1us,inter=25GB/s@2us",
        ),
        (
            Collective::AllToAll,
            Algorithm::Direct,
            "fat-tree:ranks=16,leaf=4,bw=50GB/s,lat=1us,oversub=2",
        ),
    ] {
        let t = topo(s);
        for mode in [Mode::Ideal, Mode::Contention] {
            let alone = simulate(coll, algo, 4 << 20, &t, mode).unwrap();
            let ranks: Vec<usize> = (0..t.ranks()).collect();
            let jobs = simulate_jobs(
                &[job(coll, algo, 4 << 20, &ranks)],
                &t,
                mode,
                &SimOptions::default(),
            )
            .unwrap();
            assert_eq!(jobs, vec![alone]);
        }
    }
}

/// On a switch every rank has its own ports, so two groups of different
/// ranks share no link: each finishes exactly as if alone, and as on a
/// switch of its own size.
#[test]
fn disjoint_jobs_on_a_switch_finish_as_if_alone() {
    let t = topo("switch:ranks=8,bw=50GB/s,lat=2us");
    let a = job(
        Collective::AllReduce,
        Algorithm::Ring,
        8 << 20,
        &[0, 1, 2, 3],
    );
    let b = job(
        Collective::AllGather,
        Algorithm::Ring,
        8 << 20,
        &[7, 5, 6, 4],
    );
    let opts = SimOptions::default();
    for mode in [Mode::Ideal, Mode::Contention] {
        let both = simulate_jobs(&[a.clone(), b.clone()], &t, mode, &opts).unwrap();
        let small = topo("switch:ranks=4,bw=50GB/s,lat=2us");
        for (j, r) in [&a, &b].into_iter().zip(&both) {
            let alone = simulate_jobs(std::slice::from_ref(j), &t, mode, &opts).unwrap();
            let own = simulate(j.coll, j.algo, j.bytes, &small, mode).unwrap();
            assert!(close(r.time_s, alone[0].time_s, 1e-12), "{mode:?}");
            assert!(close(r.time_s, own.time_s, 1e-12), "{mode:?}");
        }
    }
}

/// Tensor parallelism inside the nodes (two 4-rank allreduces over NVLink)
/// and data parallelism across them (four 2-rank allreduces, {i, i+4}) at
/// once on two-level:nodes=2,gpus=4.
///
/// In this model every GPU has its own NVLink ports and its own NIC, and a
/// message inside a node never touches a NIC nor one between nodes an
/// NVLink port: the TP jobs use only nvlink-*, the DP jobs only nic-*, and
/// the DP jobs use different NICs from each other. So without a reduction
/// cost all six finish exactly as if alone. What they do share is the
/// GPUs: with gamma > 0 a GPU's reductions for its TP and its DP group
/// queue on one reduction unit, and both slow down. And where groups do
/// share a link (two cross-leaf pairs on a fat tree whose leaf uplink is
/// one port wide) they split it.
#[test]
fn tensor_and_data_parallel_share_only_what_they_share() {
    let t = topo("two-level:nodes=2,gpus=4,intra=450GB/s@1us,inter=25GB/s@2us");
    let bytes = 16 << 20;
    let ar = |ranks: &[usize]| job(Collective::AllReduce, Algorithm::Ring, bytes, ranks);
    let mut jobs = vec![ar(&[0, 1, 2, 3]), ar(&[4, 5, 6, 7])];
    jobs.extend((0..4).map(|i| ar(&[i, i + 4])));
    let run = |jobs: &[Job], opts: &SimOptions| -> Vec<SimResult> {
        simulate_jobs(jobs, &t, Mode::Contention, opts).unwrap()
    };
    for gamma in [0.0, 1e-10] {
        let opts = SimOptions {
            gamma,
            ..SimOptions::default()
        };
        let together = run(&jobs, &opts);
        let alone: Vec<f64> = jobs
            .iter()
            .map(|j| run(std::slice::from_ref(j), &opts)[0].time_s)
            .collect();
        println!(
            "gamma {gamma:e}: TP {:.1} us alone, {:.1} us together; DP {:.1} us alone, {:.1} us together",
            alone[0] * 1e6,
            together[0].time_s * 1e6,
            alone[2] * 1e6,
            together[2].time_s * 1e6
        );
        for (r, a) in together.iter().zip(&alone) {
            if gamma == 0.0 {
                assert!(close(r.time_s, *a, 1e-12), "{} vs {a}", r.time_s);
            } else {
                assert!(r.time_s > *a * 1.001, "{} vs {a}", r.time_s);
            }
        }
        // Each job's traffic is its own: TP on NVLink, DP on the NICs.
        let class_bytes =
            |r: &SimResult, c: &str| r.per_class.iter().find(|s| s.class == c).unwrap().bytes;
        assert!(class_bytes(&together[0], "nic-up") == 0);
        assert!(class_bytes(&together[0], "nvlink-up") > 0);
        assert!(class_bytes(&together[2], "nvlink-up") == 0);
        // Each of the two ranks sends half the buffer twice.
        assert!(class_bytes(&together[2], "nic-up") == 2 * bytes as u64);
    }
    // Sharing a link: ranks 0 and 1 (leaf 0) with 4 and 5 (leaf 1), leaf
    // uplinks as wide as one port. Each pair alone has its ports to
    // itself; together the two pairs split the leaf uplinks.
    let f = topo("fat-tree:ranks=8,leaf=4,bw=50GB/s,lat=1us,oversub=4");
    let pairs = [ar(&[0, 4]), ar(&[1, 5])];
    let alone = simulate_jobs(&pairs[..1], &f, Mode::Contention, &SimOptions::default()).unwrap();
    let both = simulate_jobs(&pairs, &f, Mode::Contention, &SimOptions::default()).unwrap();
    println!(
        "two cross-leaf pairs: {:.1} us alone, {:.1} / {:.1} us together",
        alone[0].time_s * 1e6,
        both[0].time_s * 1e6,
        both[1].time_s * 1e6
    );
    for r in &both {
        assert!(r.time_s > 1.8 * alone[0].time_s);
    }
    // Bad groups are errors.
    let o = SimOptions::default();
    assert!(simulate_jobs(&[ar(&[0, 0])], &t, Mode::Ideal, &o).is_err());
    assert!(simulate_jobs(&[ar(&[0, 8])], &t, Mode::Ideal, &o).is_err());
    assert!(simulate_jobs(&[ar(&[])], &t, Mode::Ideal, &o).is_err());
}

fn check_timeline(r: &SimResult, what: &str, unit: bool) {
    assert_eq!(r.timeline.len(), r.per_class.len(), "{what}");
    for ((class, values), stats) in r.timeline.iter().zip(&r.per_class) {
        assert_eq!(*class, stats.class);
        assert_eq!(values.len(), TIMELINE_BUCKETS);
        if unit {
            assert!(
                values.iter().all(|&v| (0.0..=1.0).contains(&v)),
                "{what} {class}: {values:?}"
            );
        }
        let mean = values.iter().sum::<f64>() / values.len() as f64;
        if stats.utilization == 0.0 {
            assert_eq!(mean, 0.0);
        } else {
            assert!(
                close(mean, stats.utilization, 0.02),
                "{what} {class}: mean {mean} vs {}",
                stats.utilization
            );
        }
    }
}

#[test]
fn timelines_are_utilizations_over_time() {
    let cases = [
        (
            Collective::AllToAll,
            Algorithm::Direct,
            "fat-tree:ranks=16,leaf=4,bw=50GB/s,lat=1us,oversub=2",
        ),
        (
            Collective::AllReduce,
            Algorithm::Hier,
            "two-level:nodes=4,gpus=4,intra=450GB/s@1us,inter=25GB/s@2us",
        ),
        (
            Collective::AllReduce,
            Algorithm::Ring,
            "switch:ranks=8,bw=50GB/s,lat=2us",
        ),
    ];
    for (coll, algo, s) in cases {
        let t = topo(s);
        let r = simulate(coll, algo, 8 << 20, &t, Mode::Contention).unwrap();
        check_timeline(&r, s, true);
        // On a switch the ideal mode queues every link too.
        let ideal = simulate(coll, algo, 8 << 20, &t, Mode::Ideal).unwrap();
        check_timeline(&ideal, s, s.starts_with("switch"));
    }
    // The switch ring keeps its ports busy from start to end, except for
    // the latency of each of its 14 steps.
    let r = simulate(
        Collective::AllReduce,
        Algorithm::Ring,
        8 << 20,
        &topo("switch:ranks=8,bw=50GB/s,lat=2us"),
        Mode::Contention,
    )
    .unwrap();
    let up = &r.timeline[0].1;
    assert!(up[TIMELINE_BUCKETS / 2] > 0.9, "{up:?}");
    // A straggler shows as a quiet first half: only the first ring step of
    // the ranks not waiting for rank 0 (6 of 8 ports, one step of 14)
    // happens before it starts.
    let late = simulate_with(
        Collective::AllReduce,
        Algorithm::Ring,
        8 << 20,
        &topo("switch:ranks=8,bw=50GB/s,lat=2us"),
        Mode::Contention,
        &SimOptions {
            start_delay: vec![(0, r.time_s)],
            ..SimOptions::default()
        },
    )
    .unwrap();
    let up = &late.timeline[0].1;
    let first_half = up[..TIMELINE_BUCKETS / 2].iter().sum::<f64>();
    let second_half = up[TIMELINE_BUCKETS / 2..].iter().sum::<f64>();
    assert!(first_half < 0.2 * second_half, "{first_half} {second_half}");
    check_timeline(&late, "straggler", true);
    // Nothing moved: all zeros.
    let barrier = simulate(
        Collective::AllGather,
        Algorithm::Ring,
        0,
        &topo("switch:ranks=4,bw=50GB/s,lat=2us"),
        Mode::Contention,
    )
    .unwrap();
    assert!(barrier
        .timeline
        .iter()
        .all(|(_, v)| v.iter().all(|&x| x == 0.0)));
}

#[test]
fn the_plot_has_a_line_per_class_and_is_deterministic() {
    let t = topo("two-level:nodes=2,gpus=4,intra=450GB/s@1us,inter=25GB/s@2us");
    let run = || {
        simulate(
            Collective::AllReduce,
            Algorithm::Hier,
            8 << 20,
            &t,
            Mode::Contention,
        )
        .unwrap()
    };
    let (a, b) = (run(), run());
    let (sa, sb) = (plot::svg(&a, "hier"), plot::svg(&b, "hier"));
    assert_eq!(sa, sb);
    assert_eq!(sa.matches("<polyline").count(), a.per_class.len());
    assert_eq!(a.per_class.len(), 4);
    // Busy links reach 1 and the y axis stops there.
    assert!(a.timeline.iter().any(|(_, v)| v.contains(&1.0)));
    assert!(sa.contains(">1</text>") && !sa.contains(">1.25</text>"));
}
