//! The aggregated mode against full runs, wherever both fit.

use ferrocoll::{Algorithm, Collective};
use ferrocoll_sim::{
    simulate_aggregated, simulate_with, Mode, SimOptions, SymmetryKind, TopologySpec,
};

fn rel(a: f64, b: f64) -> f64 {
    if a == b {
        0.0
    } else {
        (a - b).abs() / a.abs().max(b.abs())
    }
}

/// Runs `coll`/`algo` both ways on `topo` in both modes and asserts they
/// agree; returns the symmetry's kind and period.
fn agree(coll: Collective, algo: Algorithm, bytes: usize, topo: &str) -> (SymmetryKind, usize) {
    let t = TopologySpec::parse(topo).unwrap();
    let opts = SimOptions::default();
    let mut sym = None;
    for mode in [Mode::Ideal, Mode::Contention] {
        let full = simulate_with(coll, algo, bytes, &t, mode, &opts).unwrap();
        let agg = simulate_aggregated(coll, algo, bytes, &t, mode, &opts)
            .unwrap_or_else(|e| panic!("{coll} {algo} on {topo}: {e}"));
        let what = format!("{coll} {algo} {bytes} B on {topo}, {mode:?}");
        assert!(
            rel(full.time_s, agg.time_s) < 1e-9,
            "{what}: full {} s, aggregated {} s",
            full.time_s,
            agg.time_s
        );
        assert_eq!(full.per_class.len(), agg.per_class.len());
        for (f, a) in full.per_class.iter().zip(&agg.per_class) {
            assert_eq!(f.class, a.class);
            assert_eq!(f.bytes, a.bytes, "{what}: {}", f.class);
            assert!(
                rel(f.utilization, a.utilization) < 1e-9,
                "{what}: {} {} vs {}",
                f.class,
                f.utilization,
                a.utilization
            );
        }
        assert_eq!(full.hottest_link, agg.hottest_link, "{what}");
        for ((c, f), (_, a)) in full.timeline.iter().zip(&agg.timeline) {
            // The ideal mode's middle links are not queues: where messages
            // tie, the full run's order (by rank number, which no shift
            // preserves) and the quotient's place their busy time at
            // different instants. Their totals agree (above).
            if mode == Mode::Ideal && c.starts_with("leaf-") {
                continue;
            }
            let worst = f
                .iter()
                .zip(a)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f64::max);
            assert!(worst < 1e-6, "{what}: timeline of {c} differs by {worst}");
        }
        assert!(full.aggregated.is_none());
        let s = agg.aggregated.expect("names its symmetry");
        assert!(agg.events < full.events, "{what}");
        sym = Some((s.kind, s.period));
    }
    sym.unwrap()
}

#[test]
fn shift_symmetric_plans_agree_with_full_runs() {
    use Algorithm::*;
    use Collective::*;
    let sw = "switch:ranks=12,bw=50GB/s,lat=2us";
    for (coll, algo) in [
        (AllReduce, Ring),
        (AllGather, Ring),
        (ReduceScatter, Ring),
        (AllToAll, Direct),
        (AllToAll, Pairwise),
        (AllGather, Bruck),
        (AllToAll, Bruck),
    ] {
        for bytes in [12 << 10, 12 << 20] {
            let (kind, k) = agree(coll, algo, bytes, sw);
            assert_eq!((kind, k), (SymmetryKind::Shift, 1), "{coll} {algo}");
        }
    }
    let two = "two-level:nodes=4,gpus=4,intra=450GB/s@1us,inter=25GB/s@2us";
    assert_eq!(agree(AllReduce, Ring, 16 << 20, two).1, 4);
    assert_eq!(agree(AllReduce, Hier, 16 << 20, two).1, 4);
    let fat = "fat-tree:ranks=32,leaf=8,bw=50GB/s,lat=1us,oversub=2";
    assert_eq!(agree(AllToAll, Direct, 32 << 20, fat).1, 8);
    assert_eq!(agree(AllReduce, Ring, 32 << 20, fat).1, 8);
    assert_eq!(
        agree(AllReduce, Ring, 8 << 20, "ring:ranks=8,bw=50GB/s,lat=1us").1,
        1
    );
    assert_eq!(
        agree(
            AllReduce,
            Torus2d,
            1 << 20,
            "torus:dims=4x4,bw=50GB/s,lat=1us"
        )
        .1,
        4
    );
    let rail = "rail:nodes=4,gpus=4,intra=450GB/s@1us,inter=50GB/s@2us";
    assert_eq!(agree(AllReduce, Hier, 16 << 20, rail).1, 4);
}

#[test]
fn xor_symmetric_plans_agree_with_full_runs() {
    let sw = "switch:ranks=16,bw=50GB/s,lat=2us";
    for (coll, algo) in [
        (Collective::AllReduce, Algorithm::Butterfly),
        (Collective::AllReduce, Algorithm::HalvingDoubling),
        (Collective::AllGather, Algorithm::Butterfly),
    ] {
        let (kind, k) = agree(coll, algo, 16 << 20, sw);
        assert_eq!((kind, k), (SymmetryKind::Xor, 1), "{coll} {algo}");
    }
}

#[test]
fn large_groups_agree_too() {
    // 1,024 ranks: 2 million messages in the full run, 2,046 aggregated.
    let (kind, k) = agree(
        Collective::AllReduce,
        Algorithm::Ring,
        64 << 20,
        "switch:ranks=1024,bw=50GB/s,lat=2us",
    );
    assert_eq!((kind, k), (SymmetryKind::Shift, 1));
    let (_, k) = agree(
        Collective::AllReduce,
        Algorithm::Hier,
        64 << 20,
        "two-level:nodes=64,gpus=8,intra=450GB/s@1us,inter=50GB/s@2us",
    );
    assert_eq!(k, 8);
}

#[test]
fn what_has_no_symmetry_is_an_error_that_says_why() {
    let sw = TopologySpec::parse("switch:ranks=8,bw=50GB/s,lat=2us").unwrap();
    let opts = SimOptions::default();
    let run = |coll, algo, bytes, t: &TopologySpec, o: &SimOptions| {
        simulate_aggregated(coll, algo, bytes, t, Mode::Contention, o).unwrap_err()
    };
    // A tree singles out its root.
    let e = run(Collective::Broadcast, Algorithm::Tree, 1 << 20, &sw, &opts);
    assert!(
        e.contains("no symmetry") && e.contains("run without"),
        "{e}"
    );
    // Blocks of zero elements: 5 elements over 8 ranks, whose empty blocks'
    // messages are skipped. (Uneven blocks, 1001 elements over 8 ranks,
    // aggregate: tests/aggregated_uneven.rs.)
    let e = run(Collective::AllReduce, Algorithm::Ring, 20, &sw, &opts);
    assert!(e.contains("no symmetry"), "{e}");
    // A random placement breaks the network's symmetry.
    let rnd = TopologySpec::parse("switch:ranks=8,bw=50GB/s,lat=2us,placement=random:7").unwrap();
    let e = run(Collective::AllReduce, Algorithm::Ring, 1 << 20, &rnd, &opts);
    assert!(e.contains("placement"), "{e}");
    // Scenarios that single out a rank or a link.
    let late = SimOptions {
        start_delay: vec![(3, 1e-3)],
        ..SimOptions::default()
    };
    let e = run(Collective::AllReduce, Algorithm::Ring, 1 << 20, &sw, &late);
    assert!(e.contains("stragglers"), "{e}");
    let one = SimOptions {
        slow_links: vec![("up[3]".into(), 2.0)],
        ..SimOptions::default()
    };
    let e = run(Collective::AllReduce, Algorithm::Ring, 1 << 20, &sw, &one);
    assert!(e.contains("up[3]"), "{e}");
    // A whole class may be slow: every rank sees it alike.
    let class = SimOptions {
        slow_links: vec![("up".into(), 2.0)],
        ..SimOptions::default()
    };
    let full = simulate_with(
        Collective::AllReduce,
        Algorithm::Ring,
        1 << 20,
        &sw,
        Mode::Contention,
        &class,
    )
    .unwrap();
    let agg = simulate_aggregated(
        Collective::AllReduce,
        Algorithm::Ring,
        1 << 20,
        &sw,
        Mode::Contention,
        &class,
    )
    .unwrap();
    assert!(rel(full.time_s, agg.time_s) < 1e-9);
}

#[test]
fn aggregated_runs_are_deterministic() {
    let t = TopologySpec::parse("fat-tree:ranks=64,leaf=8,bw=50GB/s,lat=1us,oversub=2").unwrap();
    let o = SimOptions::default();
    let a = simulate_aggregated(
        Collective::AllToAll,
        Algorithm::Direct,
        1 << 24,
        &t,
        Mode::Contention,
        &o,
    )
    .unwrap();
    let b = simulate_aggregated(
        Collective::AllToAll,
        Algorithm::Direct,
        1 << 24,
        &t,
        Mode::Contention,
        &o,
    )
    .unwrap();
    assert_eq!(format!("{a:?}"), format!("{b:?}"));
}
