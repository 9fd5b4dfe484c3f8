//! The critical-path summary: its parts add up to the run's time, and
//! each part shows where the seeds' reasoning says it should.

use ferrocoll::{Algorithm, Collective};
use ferrocoll_sim::{
    simulate_aggregated, simulate_sharp_allreduce, simulate_with, Mode, SimOptions, SimResult,
    TopologySpec,
};

fn topo(s: &str) -> TopologySpec {
    TopologySpec::parse(s).unwrap()
}

fn run(coll: Collective, algo: Algorithm, bytes: usize, t: &str, mode: Mode) -> SimResult {
    simulate_with(coll, algo, bytes, &topo(t), mode, &SimOptions::default()).unwrap()
}

/// The parts of the critical path add up to the time.
fn adds_up(r: &SimResult) {
    let c = &r.critical_path;
    let sum = c.start_s + c.latency_s + c.transmission_s + c.queueing_s + c.compute_s;
    assert!(
        (sum - r.time_s).abs() <= 1e-9 * r.time_s.max(1e-12),
        "parts {sum} vs time {}: {c:?}",
        r.time_s
    );
    for part in [
        c.start_s,
        c.latency_s,
        c.transmission_s,
        c.queueing_s,
        c.compute_s,
    ] {
        assert!(part >= -1e-15, "{c:?}");
    }
}

#[test]
fn a_ring_is_its_steps_of_latency_and_transmission() {
    let n = 8;
    let m = 8 << 20;
    let r = run(
        Collective::AllReduce,
        Algorithm::Ring,
        m,
        "switch:ranks=8,bw=50GB/s,lat=2us",
        Mode::Ideal,
    );
    adds_up(&r);
    let c = &r.critical_path;
    let steps = 2 * (n - 1);
    assert_eq!(c.messages, steps as u64);
    assert!((c.latency_s - steps as f64 * 2e-6).abs() < 1e-12, "{c:?}");
    let tx = steps as f64 * (m / n) as f64 / 50e9;
    assert!((c.transmission_s - tx).abs() < 1e-12, "{c:?}");
    assert!(c.queueing_s < 1e-12 && c.compute_s == 0.0 && c.start_s == 0.0);
    // All ranks post each step at the same instant: nobody waits for a
    // neighbour, so the path stays on the rank it started from.
    assert_eq!(c.ranks, 1);
}

#[test]
fn oversubscription_shows_as_queueing_and_a_straggler_as_start() {
    let t = "fat-tree:ranks=32,leaf=8,bw=50GB/s,lat=1us,oversub=2";
    let full = run(
        Collective::AllToAll,
        Algorithm::Direct,
        32 << 20,
        "fat-tree:ranks=32,leaf=8,bw=50GB/s,lat=1us,oversub=1",
        Mode::Contention,
    );
    let over = run(
        Collective::AllToAll,
        Algorithm::Direct,
        32 << 20,
        t,
        Mode::Contention,
    );
    adds_up(&full);
    adds_up(&over);
    assert!(
        over.critical_path.queueing_s > full.critical_path.queueing_s + 0.3 * full.time_s,
        "{:?} vs {:?}",
        over.critical_path,
        full.critical_path
    );
    let late = SimOptions {
        start_delay: vec![(3, 1e-3)],
        ..SimOptions::default()
    };
    let r = simulate_with(
        Collective::AllReduce,
        Algorithm::Ring,
        16 << 20,
        &topo("switch:ranks=8,bw=50GB/s,lat=2us"),
        Mode::Ideal,
        &late,
    )
    .unwrap();
    adds_up(&r);
    assert_eq!(r.critical_path.start_s, 1e-3);
    // The others waited for the straggler: the path leads back to it.
    assert!(r.critical_path.ranks > 1, "{:?}", r.critical_path);
}

#[test]
fn reductions_are_compute() {
    let opts = SimOptions {
        gamma: 1e-10,
        ..SimOptions::default()
    };
    let t = topo("switch:ranks=4,bw=50GB/s,lat=2us");
    for algo in [Algorithm::Ring, Algorithm::Tree, Algorithm::Butterfly] {
        let r = simulate_with(
            Collective::AllReduce,
            algo,
            4 << 20,
            &t,
            Mode::Contention,
            &opts,
        )
        .unwrap();
        adds_up(&r);
        assert!(
            r.critical_path.compute_s > 0.0,
            "{algo}: {:?}",
            r.critical_path
        );
    }
}

#[test]
fn every_run_adds_up() {
    let cases = [
        (
            Collective::AllReduce,
            Algorithm::Hier,
            "two-level:nodes=4,gpus=4,intra=450GB/s@1us,inter=25GB/s@2us",
        ),
        (
            Collective::AllReduce,
            Algorithm::DoubleBinaryTree,
            "switch:ranks=13,bw=50GB/s,lat=2us",
        ),
        (
            Collective::Broadcast,
            Algorithm::Tree,
            "fat-tree:ranks=32,leaf=8,bw=50GB/s,lat=1us,oversub=2",
        ),
        (
            Collective::AllGather,
            Algorithm::Bruck,
            "ring:ranks=9,bw=50GB/s,lat=1us",
        ),
        (
            Collective::AllReduce,
            Algorithm::Torus2d,
            "torus:dims=4x4,bw=50GB/s,lat=1us",
        ),
        (
            Collective::AllToAll,
            Algorithm::Pairwise,
            "rail:nodes=2,gpus=4,intra=450GB/s@1us,inter=50GB/s@2us",
        ),
    ];
    for (coll, algo, t) in cases {
        for mode in [Mode::Ideal, Mode::Contention] {
            for bytes in [0, 4096, 16 << 20] {
                adds_up(&run(coll, algo, bytes, t, mode));
            }
        }
    }
    let t = topo("fat-tree:ranks=32,leaf=4,bw=50GB/s,lat=1us,oversub=2,sharp=1");
    adds_up(&simulate_sharp_allreduce(16 << 20, &t, Mode::Contention).unwrap());
    // The aggregated mode walks the representatives: the same path.
    let t = topo("switch:ranks=64,bw=50GB/s,lat=2us");
    let o = SimOptions::default();
    let full = simulate_with(
        Collective::AllReduce,
        Algorithm::Ring,
        64 << 20,
        &t,
        Mode::Contention,
        &o,
    )
    .unwrap();
    let agg = simulate_aggregated(
        Collective::AllReduce,
        Algorithm::Ring,
        64 << 20,
        &t,
        Mode::Contention,
        &o,
    )
    .unwrap();
    adds_up(&agg);
    let (f, a) = (&full.critical_path, &agg.critical_path);
    assert_eq!(f.messages, a.messages);
    assert!(
        (f.latency_s - a.latency_s).abs() < 1e-12
            && (f.transmission_s - a.transmission_s).abs() < 1e-12
    );
}
