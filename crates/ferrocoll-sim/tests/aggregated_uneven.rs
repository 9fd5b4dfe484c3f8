//! The aggregated mode over uneven blocks against full runs: the traffic
//! (bytes of every link class, the hottest link) is the full run's
//! exactly; the time is the padded run's (every block at its largest
//! size), which is the full run's for chains of dependencies and measured
//! against it elsewhere.

use ferrocoll::{Algorithm, Collective};
use ferrocoll_sim::{
    simulate_aggregated, simulate_with, Mode, SimOptions, SimResult, SymmetryKind, TopologySpec,
};

fn rel(a: f64, b: f64) -> f64 {
    if a == b {
        0.0
    } else {
        (a - b).abs() / a.abs().max(b.abs())
    }
}

/// Full and aggregated runs of `coll`/`algo` on `topo` in `mode`; asserts
/// that the traffic agrees exactly and returns both.
fn both(
    coll: Collective,
    algo: Algorithm,
    bytes: usize,
    topo: &str,
    mode: Mode,
) -> (SimResult, SimResult) {
    let t = TopologySpec::parse(topo).unwrap();
    let opts = SimOptions::default();
    let full = simulate_with(coll, algo, bytes, &t, mode, &opts).unwrap();
    let agg = simulate_aggregated(coll, algo, bytes, &t, mode, &opts)
        .unwrap_or_else(|e| panic!("{coll} {algo} {bytes} B on {topo}: {e}"));
    let what = format!("{coll} {algo} {bytes} B on {topo}, {mode:?}");
    assert_eq!(full.per_class.len(), agg.per_class.len());
    for (f, a) in full.per_class.iter().zip(&agg.per_class) {
        assert_eq!(f.class, a.class);
        assert_eq!(f.bytes, a.bytes, "{what}: {}", f.class);
    }
    assert_eq!(full.hottest_link, agg.hottest_link, "{what}");
    let sym = agg.aggregated.expect("aggregated");
    assert_eq!(sym.kind, SymmetryKind::Shift, "{what}");
    assert!(agg.uneven.is_some(), "{what}: blocks of one size?");
    println!(
        "{what}: full {:.6} us, aggregated {:.6} us ({:+.2e}), {} of {} ranks, sizes {:?}",
        full.time_s * 1e6,
        agg.time_s * 1e6,
        agg.time_s / full.time_s - 1.0,
        sym.period,
        sym.ranks,
        agg.uneven.as_ref().unwrap().elements
    );
    (full, agg)
}

/// 64 ranks, blocks of 1,000 and 1,001 elements (37 long): the traffic is
/// exact everywhere; the time is exact for a ring or the hierarchical
/// allreduce on one switch (a chain with a long block in every step) and
/// for the direct allreduce without contention, close for chains whose
/// links differ, and below the full run's for the direct allreduce with
/// contention (the full run's ranks drift apart; see the module docs of
/// ferrocoll_sim::uneven).
#[test]
fn traffic_is_exact_and_time_is_the_padded_runs() {
    use Algorithm::*;
    use Collective::*;
    let bytes = 4 * (64 * 1000 + 37);
    let topos = [
        "switch:ranks=64,bw=50GB/s,lat=2us",
        "fat-tree:ranks=64,leaf=8,bw=50GB/s,lat=1us,oversub=2",
        "two-level:nodes=8,gpus=8,intra=450GB/s@1us,inter=50GB/s@2us",
    ];
    for topo in topos {
        for algo in [Ring, Direct, Hier, Ring2] {
            for mode in [Mode::Ideal, Mode::Contention] {
                let (f, a) = both(AllReduce, algo, bytes, topo, mode);
                let (ft, at) = (f.time_s, a.time_s);
                let what = format!("{algo} on {topo}, {mode:?}: full {ft}, aggregated {at}");
                assert_eq!(a.uneven.as_ref().unwrap().elements.len(), 2, "{what}");
                let exact = (topo.starts_with("switch") && matches!(algo, Ring | Hier))
                    || (algo == Direct && mode == Mode::Ideal);
                if exact {
                    assert!(rel(ft, at) < 1e-12, "{what}");
                } else if algo == Direct {
                    assert!(at <= ft && rel(ft, at) < 0.3, "{what}");
                } else {
                    assert!(rel(ft, at) < 1e-2, "{what}");
                }
                for (fc, ac) in f.per_class.iter().zip(&a.per_class) {
                    // Exact busy time over the padded run's time.
                    let want = fc.utilization * ft / at;
                    assert!(rel(want, ac.utilization) < 1e-9, "{what}: {}", fc.class);
                }
            }
        }
    }
}

/// Up to 1,024 ranks, counts that the ranks do not divide, contention
/// mode: the traffic agrees exactly and the chains' times closely.
#[test]
fn large_groups_with_uneven_counts_agree() {
    use Algorithm::*;
    use Collective::*;
    let c = Mode::Contention;
    for (algo, bytes, topo, tol) in [
        (Ring, 1000003, "switch:ranks=1024,bw=50GB/s,lat=2us", 1e-12),
        (
            Ring,
            64_000_004,
            "fat-tree:ranks=1024,leaf=32,bw=50GB/s,lat=1us,oversub=2",
            1e-5,
        ),
        (
            Hier,
            1000003,
            "two-level:nodes=128,gpus=8,intra=450GB/s@1us,inter=50GB/s@2us",
            1e-12,
        ),
        (
            Hier,
            64_000_004,
            "fat-tree:ranks=1024,leaf=32,bw=50GB/s,lat=1us,oversub=2",
            1e-4,
        ),
        (
            Direct,
            1000003,
            "fat-tree:ranks=1024,leaf=32,bw=50GB/s,lat=1us,oversub=2",
            0.2,
        ),
    ] {
        let (f, a) = both(AllReduce, algo, bytes, topo, c);
        assert!(
            rel(f.time_s, a.time_s) < tol,
            "{algo} {bytes} B on {topo}: full {}, aggregated {}",
            f.time_s,
            a.time_s
        );
        assert!(a.events * 10 < f.events, "{algo} on {topo}");
    }
    // Reduce-scatter and alltoall cut the call into whole blocks per rank:
    // a count the ranks do not divide is cut down, and the aggregated mode
    // is the exact one.
    let t = TopologySpec::parse("fat-tree:ranks=256,leaf=16,bw=50GB/s,lat=1us,oversub=2").unwrap();
    let o = SimOptions::default();
    let f = simulate_with(ReduceScatter, Pairwise, 1000003, &t, c, &o).unwrap();
    let a = simulate_aggregated(ReduceScatter, Pairwise, 1000003, &t, c, &o).unwrap();
    assert!(a.uneven.is_none() && rel(f.time_s, a.time_s) < 1e-9);
}

#[test]
fn what_differs_in_more_than_sizes_is_still_refused() {
    let o = SimOptions::default();
    let sw = TopologySpec::parse("switch:ranks=8,bw=50GB/s,lat=2us").unwrap();
    let run = |algo, bytes, t: &TopologySpec| {
        simulate_aggregated(Collective::AllReduce, algo, bytes, t, Mode::Contention, &o)
    };
    // 5 elements on 8 ranks: three ranks' blocks are empty and their
    // messages are skipped, so the plans' shapes differ.
    let e = run(Algorithm::Ring, 20, &sw).unwrap_err();
    assert!(e.contains("no symmetry"), "{e}");
    // Halving-doubling's uneven blocks move by exclusive-or: not modelled.
    let e = run(Algorithm::HalvingDoubling, 4 * 1001, &sw).unwrap_err();
    assert!(e.contains("no symmetry"), "{e}");
    // A double binary tree singles out ranks whatever the count.
    let e = run(Algorithm::DoubleBinaryTree, 4 * 1001, &sw).unwrap_err();
    assert!(e.contains("no symmetry"), "{e}");
    // A straggler singles out a rank, uneven blocks or not.
    let late = SimOptions {
        start_delay: vec![(3, 1e-3)],
        ..SimOptions::default()
    };
    let e = simulate_aggregated(
        Collective::AllReduce,
        Algorithm::Ring,
        4 * 1001,
        &sw,
        Mode::Contention,
        &late,
    )
    .unwrap_err();
    assert!(e.contains("stragglers"), "{e}");
}

/// The issue's command: 16,384 ranks, 256 MB, blocks of 3,906 and 3,907
/// elements, one rank simulated.
#[test]
fn the_issues_ring_runs_aggregated() {
    let t = TopologySpec::parse("switch:ranks=16384,bw=50GB/s,lat=2us").unwrap();
    let r = simulate_aggregated(
        Collective::AllReduce,
        Algorithm::Ring,
        256_000_000,
        &t,
        Mode::Contention,
        &SimOptions::default(),
    )
    .unwrap();
    assert_eq!(r.uneven.as_ref().unwrap().elements, [3906, 3907]);
    assert_eq!(r.aggregated.unwrap().period, 1);
    // Every block crosses every up port twice but for two: 2(n-1) blocks
    // of the 64,000,000 elements sent by each rank in all.
    let up = &r.per_class[0];
    assert_eq!(up.bytes, 2 * 16383 * 256_000_000);
    // A chain of 2(n-1) steps with a 3,907-element block in each.
    let step = 2e-6 + 3907.0 * 4.0 / 50e9;
    assert!(rel(r.time_s, 2.0 * 16383.0 * step) < 1e-9, "{}", r.time_s);
}
