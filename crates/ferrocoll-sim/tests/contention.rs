//! The contention mode on oversubscribed and two-tier clusters, determinism
//! and speed.

use std::time::Instant;

use ferrocoll::cost::{predict, Profile, Shape};
use ferrocoll::{Algorithm, Collective};
use ferrocoll_sim::{simulate, simulate_with, Mode, SimOptions, SimResult, TopologySpec};

fn topo(s: &str) -> TopologySpec {
    TopologySpec::parse(s).unwrap()
}

fn run(coll: Collective, algo: Algorithm, bytes: usize, t: &str, mode: Mode) -> SimResult {
    simulate(coll, algo, bytes, &topo(t), mode).unwrap()
}

/// Direct all-to-all over a fat tree, 1 MiB per pair.
///
/// With oversub = 1 the rank ports are the bottleneck: each rank sends (and
/// receives) n-1 blocks of B through its 50 GB/s port, T1 = (n-1)·B/bw. A
/// leaf's aggregate uplink carries leaf·(n-leaf) blocks at leaf·bw/oversub,
/// i.e. (n-leaf)·B·oversub/bw, which with oversub = 2 exceeds the ports'
/// time: T2 = 2(n-leaf)·B/bw. So the ratio is 2(n-leaf)/(n-1), not exactly
/// 2: 1.78 for 64 ranks in leaves of 8, 1.90 in leaves of 4, 1.97 in leaves
/// of 2. The simulator must reproduce that ratio within 10 % and, when nearly
/// every byte crosses the spine, be 2 within 5 %.
#[test]
fn oversubscribed_fat_tree_slows_direct_alltoall_about_twofold() {
    let n = 64usize;
    let bytes = n * (1 << 20);
    for leaf in [8usize, 4, 2] {
        let t = |o: u32| {
            let s = format!("fat-tree:ranks={n},leaf={leaf},bw=50GB/s,lat=1us,oversub={o}");
            run(
                Collective::AllToAll,
                Algorithm::Direct,
                bytes,
                &s,
                Mode::Contention,
            )
        };
        let (full, over) = (t(1), t(2));
        let block = (1u64 << 20) as f64;
        let t1 = (n - 1) as f64 * block / 50e9;
        let t2 = 2.0 * (n - leaf) as f64 * block / 50e9;
        let ratio = over.time_s / full.time_s;
        let expect = t2 / t1;
        println!(
            "leaf={leaf}: oversub=1 {:.3} ms (analytic {:.3}), oversub=2 {:.3} ms (analytic {:.3}), \
             ratio {ratio:.3} (analytic {expect:.3}); hottest {} / {}",
            full.time_s * 1e3,
            t1 * 1e3,
            over.time_s * 1e3,
            t2 * 1e3,
            full.hottest_link,
            over.hottest_link
        );
        assert!(
            (ratio / expect - 1.0).abs() < 0.10,
            "ratio {ratio} vs {expect}"
        );
        assert!((full.time_s / t1 - 1.0).abs() < 0.10);
        assert!((over.time_s / t2 - 1.0).abs() < 0.10);
        assert!(
            over.hottest_link.starts_with("leaf-"),
            "{}",
            over.hottest_link
        );
        // With leaves of 2, 62 of every 63 blocks cross the spine: the
        // issue's "about 2x, within 5 %".
        if leaf == 2 {
            assert!((ratio / 2.0 - 1.0).abs() < 0.05, "ratio {ratio}");
        }
        let up = over
            .per_class
            .iter()
            .find(|c| c.class == "leaf-up")
            .unwrap();
        // Every block between leaves crosses one uplink.
        assert_eq!(up.bytes, (n * (n - leaf)) as u64 * (1 << 20));
        assert!(
            up.utilization > 0.85 && up.utilization <= 1.0 + 1e-9,
            "{up:?}"
        );
    }
}

/// Flat ring allreduce over two nodes of four GPUs. Ring order 0..7 crosses
/// the node boundary twice (3 -> 4 and 7 -> 0), each crossing on its own
/// pair of NICs. Every one of the 2(N-1) steps moves bytes/N per rank and
/// ends when its slowest message does (the ring waits on it), which is an
/// inter-node one: nic_lat + (bytes/N) / inter_bw (the NVLink messages of
/// the step take 1/18 of that). Estimate:
/// T = 2(N-1)·inter_lat + 2(N-1)/N · bytes / inter_bw.
#[test]
fn two_level_ring_is_bound_by_the_nics() {
    let bytes = 256usize << 20;
    let n = 8.0;
    let s = "two-level:nodes=2,gpus=4,intra=450GB/s@1us,inter=25GB/s@2us";
    let estimate = 2.0 * (n - 1.0) * 2e-6 + 2.0 * (n - 1.0) / n * bytes as f64 / 25e9;
    for mode in [Mode::Contention, Mode::Ideal] {
        let r = run(Collective::AllReduce, Algorithm::Ring, bytes, s, mode);
        let ratio = r.time_s / estimate;
        println!(
            "{mode:?}: {:.3} ms, estimate {:.3} ms, ratio {ratio:.4}, busbw {:.1} GB/s, hottest {}",
            r.time_s * 1e3,
            estimate * 1e3,
            r.busbw / 1e9,
            r.hottest_link
        );
        assert!((ratio - 1.0).abs() < 0.01, "{mode:?}: ratio {ratio}");
        assert!(r.hottest_link.starts_with("nic-"), "{}", r.hottest_link);
        let nic = r.per_class.iter().find(|c| c.class == "nic-up").unwrap();
        // Two of the eight NICs carry 2(N-1) messages of bytes/N each.
        assert_eq!(nic.bytes, 2 * 14 * (bytes as u64 / 8));
        assert!((nic.utilization - 2.0 / 8.0).abs() < 0.01, "{nic:?}");
    }
}

/// On a full-bisection switch a ring has nothing to contend for: both modes
/// give the same time.
#[test]
fn ring_on_a_switch_has_no_contention() {
    let s = "switch:ranks=16,bw=50GB/s,lat=2us";
    let a = run(
        Collective::AllReduce,
        Algorithm::Ring,
        64 << 20,
        s,
        Mode::Ideal,
    );
    let b = run(
        Collective::AllReduce,
        Algorithm::Ring,
        64 << 20,
        s,
        Mode::Contention,
    );
    assert!((a.time_s / b.time_s - 1.0).abs() < 1e-9, "{a:?} {b:?}");
    // 30 steps of 2 us + 4 MiB / 50 GB/s: latency takes 2.4 % of busbw.
    assert!((a.busbw / 50e9 - 0.976).abs() < 0.005, "{}", a.busbw);
}

/// With a reduction cost, the ideal mode still follows the model: each
/// received block is reduced after it arrives.
#[test]
fn gamma_is_charged_like_the_model() {
    let gamma = 1e-10;
    let opts = SimOptions {
        gamma,
        ..SimOptions::default()
    };
    for (algo, n) in [
        (Algorithm::Ring, 8usize),
        (Algorithm::Tree, 8),
        (Algorithm::HalvingDoubling, 16),
    ] {
        let t = topo(&format!("switch:ranks={n},bw=50GB/s,lat=2us"));
        let bytes = 4usize << 20;
        let sim =
            simulate_with(Collective::AllReduce, algo, bytes, &t, Mode::Ideal, &opts).unwrap();
        let shape = Shape::new(Collective::AllReduce, n, bytes / 4, 4);
        let model = predict(algo, &shape, &Profile::uniform(2e-6, 50e9, gamma))
            .unwrap()
            .total();
        println!(
            "{algo} n={n} gamma: sim {:.3} us, model {:.3} us",
            sim.time_s * 1e6,
            model * 1e6
        );
        assert!(
            (sim.time_s / model - 1.0).abs() < 0.01,
            "{algo}: {} vs {model}",
            sim.time_s
        );
    }
}

#[test]
fn same_input_same_bits() {
    let cases = [
        (
            Collective::AllToAll,
            Algorithm::Direct,
            "fat-tree:ranks=32,leaf=4,bw=50GB/s,lat=1us,oversub=3",
        ),
        (
            Collective::AllReduce,
            Algorithm::DoubleBinaryTree,
            "two-level:nodes=4,gpus=4,intra=450GB/s@1us,inter=25GB/s@2us",
        ),
        (
            Collective::AllReduce,
            Algorithm::Hier,
            "two-level:nodes=4,gpus=4,intra=450GB/s@1us,inter=25GB/s@2us",
        ),
    ];
    for (coll, algo, s) in cases {
        for mode in [Mode::Ideal, Mode::Contention] {
            let a = run(coll, algo, 3 << 20, s, mode);
            let b = run(coll, algo, 3 << 20, s, mode);
            assert_eq!(a.time_s.to_bits(), b.time_s.to_bits());
            assert_eq!(a, b);
            assert!(a.time_s > 0.0 && a.events > 0);
        }
    }
}

/// 1024 ranks, 2046 ring steps of one 64 KiB chunk each: about six million
/// events.
#[test]
fn thousand_ranks_ring_is_fast() {
    let s = "switch:ranks=1024,bw=50GB/s,lat=2us";
    let start = Instant::now();
    let r = run(
        Collective::AllReduce,
        Algorithm::Ring,
        64 << 20,
        s,
        Mode::Contention,
    );
    let wall = start.elapsed().as_secs_f64();
    let expect = 2.0 * 1023.0 * (2e-6 + 65536.0 / 50e9);
    println!(
        "1024-rank ring allreduce 64 MiB: simulated {:.3} ms (analytic {:.3} ms), {} events, wall {wall:.2} s",
        r.time_s * 1e3,
        expect * 1e3,
        r.events
    );
    assert!((r.time_s / expect - 1.0).abs() < 1e-6);
    assert!(wall < 30.0, "took {wall} s");
}
