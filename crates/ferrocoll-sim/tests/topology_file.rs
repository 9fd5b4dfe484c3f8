//! Topologies from a file (`file:PATH`): the same clusters as the built-in
//! kinds give the same times; placement and the `plan` line apply.

use ferrocoll::{Algorithm, Collective};
use ferrocoll_sim::{simulate, Mode, SimResult, TopologySpec};

/// Writes `text` to a fresh file and parses `file:PATH` plus `suffix`.
fn file_topology(name: &str, text: &str, suffix: &str) -> TopologySpec {
    let dir = std::env::temp_dir().join(format!("ferrocoll-topo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    let spec = format!("file:{}{suffix}", path.display());
    TopologySpec::parse(&spec).unwrap_or_else(|e| panic!("{spec}: {e}"))
}

fn run(coll: Collective, algo: Algorithm, bytes: usize, t: &TopologySpec, mode: Mode) -> SimResult {
    simulate(coll, algo, bytes, t, mode).unwrap()
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / a.abs().max(b.abs())
}

#[test]
fn a_switch_in_a_file_is_the_built_in_switch() {
    // The built-in switch charges its 2 us on the way up; the file pays
    // 1 us on each of the two links.
    let file = file_topology(
        "switch.topo",
        "ranks 8\nswitch s\nlink r0-r7 s 50GB/s 1us\n",
        "",
    );
    let built = TopologySpec::parse("switch:ranks=8,bw=50GB/s,lat=2us").unwrap();
    assert_eq!(file.ranks(), 8);
    assert!(file.to_string().starts_with("file:"));
    for (coll, algo) in [
        (Collective::AllReduce, Algorithm::Ring),
        (Collective::AllToAll, Algorithm::Direct),
        (Collective::Broadcast, Algorithm::Tree),
    ] {
        for mode in [Mode::Ideal, Mode::Contention] {
            let a = run(coll, algo, 8 << 20, &file, mode);
            let b = run(coll, algo, 8 << 20, &built, mode);
            assert!(
                rel(a.time_s, b.time_s) < 1e-9,
                "{coll} {algo} {mode:?}: {} vs {}",
                a.time_s,
                b.time_s
            );
            assert_eq!(a.per_class[0].class, "up");
            assert_eq!(a.per_class[0].bytes, b.per_class[0].bytes);
            assert_eq!(a.hottest_link, b.hottest_link);
        }
    }
}

const FAT: &str = "
# 4 leaves of 8 ranks under one spine, uplinks at 8 x 50 / 2 = 200 GB/s
ranks 32
switch l0 l1 l2 l3 spine
link r0-r7 l0 50GB/s 0.5us
link r8-r15 l1 50GB/s 0.5us
link r16-r23 l2 50GB/s 0.5us
link r24-r31 l3 50GB/s 0.5us
link l0 spine 200GB/s 1us class=leaf
link l1 spine 200GB/s 1us class=leaf
link l2 spine 200GB/s 1us class=leaf
link l3 spine 200GB/s 1us class=leaf
plan 4x8
";

#[test]
fn an_oversubscribed_fat_tree_in_a_file_matches_the_built_in_one() {
    let file = file_topology("fat.topo", FAT, "");
    let built =
        TopologySpec::parse("fat-tree:ranks=32,leaf=8,bw=50GB/s,lat=1us,oversub=2").unwrap();
    assert_eq!(
        file.plan_topology().levels(),
        built.plan_topology().levels()
    );
    for (coll, algo) in [
        (Collective::AllToAll, Algorithm::Direct),
        (Collective::AllReduce, Algorithm::Hier),
        (Collective::AllReduce, Algorithm::Ring),
    ] {
        // Latency sits on different links (both ends of a hop here, the
        // upward links there): the same sums, so the ideal mode agrees
        // exactly; the chunked pipeline may start a hop a little earlier.
        let a = run(coll, algo, 32 << 20, &file, Mode::Ideal);
        let b = run(coll, algo, 32 << 20, &built, Mode::Ideal);
        assert!(
            rel(a.time_s, b.time_s) < 1e-9,
            "{coll} {algo}: {} vs {}",
            a.time_s,
            b.time_s
        );
        let a = run(coll, algo, 32 << 20, &file, Mode::Contention);
        let b = run(coll, algo, 32 << 20, &built, Mode::Contention);
        assert!(
            rel(a.time_s, b.time_s) < 0.02,
            "{coll} {algo}: {} vs {}",
            a.time_s,
            b.time_s
        );
        let uplink = a.per_class.iter().find(|c| c.class == "leaf-up").unwrap();
        let built_up = b.per_class.iter().find(|c| c.class == "leaf-up").unwrap();
        assert_eq!(uplink.bytes, built_up.bytes, "{coll} {algo}");
    }
    // Round-robin placement deals ranks over the plan's 4 nodes: a
    // hierarchical allreduce then crosses the spine in its intra-node
    // phases and slows down, as on the built-in fat tree.
    let rr = file_topology("fat-rr.topo", FAT, ",placement=roundrobin");
    let block = run(
        Collective::AllReduce,
        Algorithm::Hier,
        32 << 20,
        &file,
        Mode::Contention,
    );
    let dealt = run(
        Collective::AllReduce,
        Algorithm::Hier,
        32 << 20,
        &rr,
        Mode::Contention,
    );
    assert!(
        dealt.time_s > 1.2 * block.time_s,
        "{} vs {}",
        dealt.time_s,
        block.time_s
    );
}

#[test]
fn a_ring_of_ranks_forwards_hop_by_hop() {
    // r0 - r1 - ... - r7 - r0, no switch: the built-in ring.
    let file = file_topology(
        "ring.topo",
        "ranks 8\nlink r0-r6 r1-r7 50GB/s 1us class=cw\nlink r7 r0 50GB/s 1us class=cw\n",
        "",
    );
    let built = TopologySpec::parse("ring:ranks=8,bw=50GB/s,lat=1us").unwrap();
    for algo in [Algorithm::Ring, Algorithm::Butterfly] {
        let a = run(Collective::AllReduce, algo, 8 << 20, &file, Mode::Ideal);
        let b = run(Collective::AllReduce, algo, 8 << 20, &built, Mode::Ideal);
        assert!(
            rel(a.time_s, b.time_s) < 1e-9,
            "{algo}: {} vs {}",
            a.time_s,
            b.time_s
        );
    }
}

#[test]
fn a_missing_or_broken_file_is_an_error_naming_it() {
    let e = TopologySpec::parse("file:/nonexistent/x.topo").unwrap_err();
    assert!(e.contains("/nonexistent/x.topo"), "{e}");
    let dir = std::env::temp_dir();
    let bad = dir.join(format!("ferrocoll-bad-{}.topo", std::process::id()));
    std::fs::write(&bad, "ranks 2\nlink r0 r1 1GB/s\n").unwrap();
    let e = TopologySpec::parse(&format!("file:{}", bad.display())).unwrap_err();
    assert!(e.contains("line 2"), "{e}");
}
