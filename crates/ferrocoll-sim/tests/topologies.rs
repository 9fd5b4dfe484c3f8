//! The rail, ring and torus topologies and rank placement: parsing, routing
//! effects measured against analytic times, and determinism.

use ferrocoll::{Algorithm, Collective};
use ferrocoll_sim::topology::Placement;
use ferrocoll_sim::{simulate, Mode, SimResult, TopologySpec};

fn topo(s: &str) -> TopologySpec {
    TopologySpec::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
}

fn run(coll: Collective, algo: Algorithm, bytes: usize, t: &str, mode: Mode) -> SimResult {
    simulate(coll, algo, bytes, &topo(t), mode).unwrap_or_else(|e| panic!("{t}: {e}"))
}

fn class_bytes(r: &SimResult, class: &str) -> u64 {
    r.per_class
        .iter()
        .find(|c| c.class == class)
        .unwrap_or_else(|| panic!("no class {class} in {:?}", r.per_class))
        .bytes
}

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a / b - 1.0).abs() < tol
}

#[test]
fn new_kinds_round_trip_through_display() {
    for s in [
        "rail:nodes=4,gpus=8,intra=450GB/s@1us,inter=50GB/s@2us",
        "ring:ranks=16,bw=50GB/s,lat=1us",
        "torus:dims=4x4,bw=50GB/s,lat=1us",
        "torus:dims=4x4x4,bw=25GB/s,lat=0.5us",
        "ring:ranks=4,bw=50GB/s,lat=1us,placement=list:3,1,0,2",
        "rail:nodes=2,gpus=2,intra=450GB/s@1us,inter=50GB/s@2us,placement=roundrobin",
        "torus:dims=2x3,bw=50GB/s,lat=1us,placement=random:42",
        "switch:ranks=4,bw=50GB/s,lat=2us,placement=list:1,0,3,2",
        "fat-tree:ranks=8,leaf=4,bw=50GB/s,lat=1us,oversub=2,placement=roundrobin",
        "two-level:nodes=2,gpus=2,intra=450GB/s@1us,inter=25GB/s@2us,placement=random:0",
    ] {
        let t = topo(s);
        assert_eq!(t.to_string(), s);
        assert_eq!(topo(&t.to_string()), t);
    }
    // block is the default and is not printed; spaces are allowed, also
    // inside the list; the list may sit before other fields.
    let t = topo(" ring: placement = list: 3, 1 ,0,2 , ranks=4, bw=50GB/s, lat=1us ");
    assert_eq!(t.placement(), &Placement::List(vec![3, 1, 0, 2]));
    assert_eq!(
        t.to_string(),
        "ring:ranks=4,bw=50GB/s,lat=1us,placement=list:3,1,0,2"
    );
    let b = topo("ring:ranks=4,bw=50GB/s,lat=1us,placement=block");
    assert_eq!(b.to_string(), "ring:ranks=4,bw=50GB/s,lat=1us");
    assert_eq!(b, topo("ring:ranks=4,bw=50GB/s,lat=1us"));

    let rail = topo("rail:nodes=4,gpus=8,intra=450GB/s@1us,inter=50GB/s@2us");
    assert_eq!(rail.ranks(), 32);
    assert_eq!(rail.plan_topology().levels(), &[4, 8]);
    let torus = topo("torus:dims=4x2x3,bw=50GB/s,lat=1us");
    assert_eq!(torus.ranks(), 24);
    // Outermost first: z, y, x.
    assert_eq!(torus.plan_topology().levels(), &[3, 2, 4]);
    assert_eq!(
        topo("torus:dims=1x8,bw=50GB/s,lat=1us")
            .plan_topology()
            .levels(),
        &[8]
    );
    assert_eq!(
        topo("ring:ranks=16,bw=50GB/s,lat=1us")
            .plan_topology()
            .levels(),
        &[16]
    );
}

#[test]
fn bad_strings_name_the_field() {
    let err = |s: &str| TopologySpec::parse(s).unwrap_err();
    let cases = [
        (
            "rail:nodes=4,gpus=8,intra=450GB/s@1us",
            "missing field `inter`",
        ),
        (
            "rail:nodes=4,gpus=8,intra=450GB/s,inter=50GB/s@2us",
            "intra:",
        ),
        (
            "rail:nodes=0,gpus=8,intra=450GB/s@1us,inter=50GB/s@2us",
            "nodes:",
        ),
        ("ring:ranks=8,bw=50GB,lat=1us", "bw:"),
        ("ring:ranks=8,bw=50GB/s,lat=1", "lat:"),
        (
            "ring:ranks=8,bw=50GB/s,lat=1us,leaf=2",
            "unknown field `leaf`",
        ),
        ("ring:ranks=1000,bw=50GB/s,lat=1us", "ranks:"),
        ("torus:dims=4,bw=50GB/s,lat=1us", "dims:"),
        ("torus:dims=4x4x4x4,bw=50GB/s,lat=1us", "dims:"),
        ("torus:dims=4x0,bw=50GB/s,lat=1us", "dims:"),
        ("torus:dims=4xa,bw=50GB/s,lat=1us", "dims:"),
        ("torus:dims=4x4,bw=50GB/s", "missing field `lat`"),
        (
            "ring:ranks=4,bw=50GB/s,lat=1us,placement=spread",
            "placement:",
        ),
        (
            "ring:ranks=4,bw=50GB/s,lat=1us,placement=random:x",
            "placement:",
        ),
        (
            "ring:ranks=4,bw=50GB/s,lat=1us,placement=list:0,1,a,2",
            "placement:",
        ),
        // Items without `=` belong to a list only.
        (
            "ring:ranks=4,bw=50GB/s,lat=1us,placement=roundrobin,3",
            "key=value",
        ),
    ];
    for (s, want) in cases {
        let e = err(s);
        assert!(e.contains(want), "{s}: {e}");
    }
    // A list must be a permutation of 0..ranks.
    for (list, want) in [
        ("0,1,1,2", "appears twice"),
        ("0,1,2", "has 3 positions"),
        ("0,1,2,3,0", "has 5 positions"),
        ("0,1,2,4", "outside 0..4"),
    ] {
        let e = err(&format!(
            "switch:ranks=4,bw=50GB/s,lat=1us,placement=list:{list}"
        ));
        assert!(e.contains("placement:") && e.contains(want), "{list}: {e}");
    }
}

#[test]
fn placements_are_permutations() {
    let t = topo("rail:nodes=4,gpus=4,intra=450GB/s@1us,inter=50GB/s@2us,placement=roundrobin");
    // Rank r on node r % 4, slot r / 4.
    let rr = t.positions();
    assert_eq!(&rr[..6], &[0, 4, 8, 12, 1, 5]);
    let mut seen = rr.clone();
    seen.sort_unstable();
    assert_eq!(seen, (0..16).collect::<Vec<_>>());
    // roundrobin on a flat cluster is the identity.
    let ring = topo("ring:ranks=6,bw=50GB/s,lat=1us,placement=roundrobin");
    assert_eq!(ring.positions(), (0..6).collect::<Vec<_>>());
    // random: a permutation, the same for the same seed, another for another.
    let r = |seed: u64| Placement::Random(seed).positions(64, 8);
    let mut p = r(7);
    assert_eq!(p, r(7));
    assert_ne!(p, r(8));
    assert_ne!(r(0), (0..64).collect::<Vec<_>>());
    p.sort_unstable();
    assert_eq!(p, (0..64).collect::<Vec<_>>());
}

/// Ring allreduce against a direct all-to-all that sends as many bytes per
/// rank, both on a physical bidirectional ring of N stations (contention
/// mode, bw = 50 GB/s, lat = 1 us).
///
/// Ring allreduce of a buffer M: every rank sends S = 2(N-1)/N·M to its
/// clockwise neighbour, one hop, in 2(N-1) rounds: T_ar = 2(N-1)·lat + S/bw,
/// and no link carries anything else.
///
/// All-to-all of a buffer M' = S·N/(N-1) (so each rank again sends S): every
/// rank sends a block M'/N to each of the others, at clockwise distance
/// d = 1..N/2 clockwise (d hops, the tie N/2 too) and the rest the other way.
/// A clockwise link therefore carries N·(1 + ... + N/2)/N blocks, i.e.
/// (N/2)(N/2+1)/2 · M'/N bytes, and with the links kept busy
/// T_aa ≈ that / bw (plus a few hops' latency, under 2 % here). The ratio
/// T_aa / T_ar is 10/7 ≈ 1.43 for N = 8 and 12/5 = 2.4 for N = 16 without
/// latency; with the allreduce's 2(N-1) latencies 1.36 and 2.19.
#[test]
fn multi_hop_alltoall_on_a_ring_is_slower_than_ring_allreduce() {
    let (bw, lat) = (50e9, 1e-6);
    for n in [8usize, 16] {
        let t = format!("ring:ranks={n},bw=50GB/s,lat=1us");
        let m = 8usize << 20;
        let s = 2.0 * (n - 1) as f64 / n as f64 * m as f64;
        let m2 = 2 * m; // S·N/(N-1) = 2M
        let ar = run(
            Collective::AllReduce,
            Algorithm::Ring,
            m,
            &t,
            Mode::Contention,
        );
        let aa = run(
            Collective::AllToAll,
            Algorithm::Direct,
            m2,
            &t,
            Mode::Contention,
        );
        let t_ar = 2.0 * (n - 1) as f64 * lat + s / bw;
        let h = n / 2;
        let cw_link = (h * (h + 1) / 2) as f64 * (m2 / n) as f64;
        let t_aa = cw_link / bw;
        let (ratio, expect) = (aa.time_s / ar.time_s, t_aa / t_ar);
        println!(
            "ring:ranks={n}: allreduce {:.1} us (analytic {:.1}), alltoall {:.1} us \
             (analytic {:.1}), ratio {ratio:.3} (analytic {expect:.3})",
            ar.time_s * 1e6,
            t_ar * 1e6,
            aa.time_s * 1e6,
            t_aa * 1e6
        );
        assert!(close(ar.time_s, t_ar, 0.01), "{ar:?}");
        assert!(close(ratio, expect, 0.10), "{ratio} vs {expect}");
        assert!(ratio > 1.3);
        // Every rank sends S; the clockwise links carry sum(d) hops of it.
        assert_eq!(class_bytes(&ar, "cw") as f64, n as f64 * s);
        assert_eq!(class_bytes(&ar, "ccw"), 0);
        assert_eq!(class_bytes(&aa, "cw"), n as u64 * cw_link as u64);
    }
}

/// The seeds' 4x4 torus: torus2d allreduce on `torus:dims=4x4` planned as
/// 4 rows of 4 takes 2(4-1) row rounds + 2(4-1) column rounds = 12, every
/// message to a torus neighbour (one hop, the row and column rings use the
/// wrap-around links), and sends 2(N-1)/N·M = 1.875 M per rank in all:
/// T = 12·lat + 1.875·M/bw. No link is shared by two messages at once, so
/// the contention mode must give exactly that. (The ideal mode counts a
/// one-link path's bytes twice, on the sender's port and again on the
/// receiver's, which is the same link here; see the report.)
///
/// A flat ring over the same 16 ranks needs 2(N-1) = 30 rounds, and in every
/// round ranks 3, 7, 11, 15 send to the next row: (3,y) -> (0,y+1) is x+
/// (wrap) then y+, two hops, so T_ring = 30·2·lat + 1.875·M/bw.
///
/// In 3-D, hier allreduce on `torus:dims=4x4x4` (levels x, y, z innermost
/// first) runs a ring per dimension, all one hop: 2·3·3 = 18 rounds and
/// 1.5·(1 + 1/4 + 1/16)·M = 1.96875 M per rank.
#[test]
fn torus2d_on_the_4x4_torus_takes_12_neighbour_steps() {
    let (bw, lat) = (50e9, 1e-6);
    let m = 1usize << 20;
    let t = "torus:dims=4x4,bw=50GB/s,lat=1us";
    assert_eq!(topo(t).plan_topology().levels(), &[4, 4]);
    let beta = 1.875 * m as f64 / bw;
    let tor = run(
        Collective::AllReduce,
        Algorithm::Torus2d,
        m,
        t,
        Mode::Contention,
    );
    let expect = 12.0 * lat + beta;
    println!(
        "torus2d 4x4: {:.3} us, 12 lat + beta = {:.3} us",
        tor.time_s * 1e6,
        expect * 1e6
    );
    assert!(close(tor.time_s, expect, 0.05), "{tor:?}");
    assert!(close(tor.time_s, expect, 1e-9), "{tor:?}");
    let ring = run(
        Collective::AllReduce,
        Algorithm::Ring,
        m,
        t,
        Mode::Contention,
    );
    assert!(close(ring.time_s, 60.0 * lat + beta, 1e-9), "{ring:?}");
    // The step count is what makes the difference: (60 lat + beta) / (12 lat + beta).
    assert!(ring.time_s > 1.9 * tor.time_s);

    let t3 = "torus:dims=4x4x4,bw=50GB/s,lat=1us";
    let h = run(
        Collective::AllReduce,
        Algorithm::Hier,
        m,
        t3,
        Mode::Contention,
    );
    let expect3 = 18.0 * lat + 1.96875 * m as f64 / bw;
    assert!(close(h.time_s, expect3, 1e-9), "{h:?}");
}

/// Hier allreduce of M = 16 MiB on 4 nodes of 4 GPUs, NVLink 450 GB/s @ 1 us,
/// NICs 50 GB/s @ 2 us, contention mode.
///
/// * block placement: level 0 (inside the node) on NVLink, level 1 between
///   nodes among ranks of the same local index, i.e. on one rail each: no
///   PXN, so the rail cluster behaves exactly like two-level (same time,
///   same bytes per class; the NVLink bytes are the intra-node phases only).
///   T = 6·1 us + 1.5·M/450e9 + 6·2 us + 0.375·M/50e9.
/// * roundrobin (rank r on node r % 4, slot r / 4): the plan's "nodes" are
///   now spread over the four nodes, all on one rail, and its "rails" lie
///   inside a physical node. The big phases (1.5 M per rank) cross the
///   NICs, the small one (0.375 M) NVLink: the seeds' pitfall, NIC bytes
///   L = 4 times the intended ones, NVLink bytes 4 times fewer (on a square
///   cluster the hierarchy is simply transposed, so no PXN either), and
///   T = 6·2 us + 1.5·M/50e9 + 6·1 us + 0.375·M/450e9, 2.7 times slower.
/// * rail-misaligned (nodes kept, node k's local ranks rotated by k slots):
///   every inter-node message goes from GPU i to GPU i+1 (mod 4) of the next
///   node, a PXN detour: NVLink carries every inter-node byte once more
///   (both nvlink-up and nvlink-down), the NICs the same bytes as with
///   block placement, and each of the 6 inter-node rounds pays one more
///   NVSwitch latency (the rotation keeps one flow per NIC, so no queueing).
#[test]
fn rail_alignment_and_placement() {
    let m = 16usize << 20;
    let mf = m as f64;
    let spec = "rail:nodes=4,gpus=4,intra=450GB/s@1us,inter=50GB/s@2us";
    let two = "two-level:nodes=4,gpus=4,intra=450GB/s@1us,inter=50GB/s@2us";
    let hier = |t: &str| {
        run(
            Collective::AllReduce,
            Algorithm::Hier,
            m,
            t,
            Mode::Contention,
        )
    };

    let block = hier(spec);
    let flat = hier(two);
    assert_eq!(block.time_s, flat.time_s);
    assert_eq!(block.per_class, flat.per_class);
    // PXN bytes: what NVLink carries beyond the intra-node phases.
    let pxn = class_bytes(&block, "nvlink-up") - class_bytes(&flat, "nvlink-up");
    assert_eq!(pxn, 0);
    assert_eq!(class_bytes(&block, "nvlink-up"), (16.0 * 1.5 * mf) as u64);
    assert_eq!(class_bytes(&block, "nic-up"), (16.0 * 0.375 * mf) as u64);
    let t_block = 6e-6 + 1.5 * mf / 450e9 + 12e-6 + 0.375 * mf / 50e9;
    assert!(close(block.time_s, t_block, 0.01), "{block:?}");

    let rr = hier(&format!("{spec},placement=roundrobin"));
    let t_rr = 12e-6 + 1.5 * mf / 50e9 + 6e-6 + 0.375 * mf / 450e9;
    println!(
        "rail hier: block {:.1} us (analytic {:.1}), roundrobin {:.1} us (analytic {:.1})",
        block.time_s * 1e6,
        t_block * 1e6,
        rr.time_s * 1e6,
        t_rr * 1e6
    );
    assert!(close(rr.time_s, t_rr, 0.01), "{rr:?}");
    assert!(rr.time_s > 2.5 * block.time_s);
    assert_eq!(
        class_bytes(&rr, "nic-up"),
        4 * class_bytes(&block, "nic-up")
    );
    assert_eq!(
        4 * class_bytes(&rr, "nvlink-up"),
        class_bytes(&block, "nvlink-up")
    );

    let rotated: Vec<String> = (0..16)
        .map(|r| ((r / 4) * 4 + (r % 4 + r / 4) % 4).to_string())
        .collect();
    let rot = hier(&format!("{spec},placement=list:{}", rotated.join(",")));
    let inter = class_bytes(&block, "nic-up");
    assert_eq!(class_bytes(&rot, "nic-up"), inter);
    for c in ["nvlink-up", "nvlink-down"] {
        assert_eq!(class_bytes(&rot, c), class_bytes(&block, c) + inter, "{c}");
    }
    assert!(close(rot.time_s, block.time_s + 6e-6, 1e-9), "{rot:?}");
}

#[test]
fn same_spec_same_result_bit_for_bit() {
    for (t, coll, algo) in [
        (
            "rail:nodes=4,gpus=4,intra=450GB/s@1us,inter=50GB/s@2us,placement=random:3",
            Collective::AllReduce,
            Algorithm::Hier,
        ),
        (
            "torus:dims=4x4x2,bw=50GB/s,lat=1us,placement=random:9",
            Collective::AllToAll,
            Algorithm::Direct,
        ),
        (
            "ring:ranks=12,bw=50GB/s,lat=1us,placement=roundrobin",
            Collective::AllGather,
            Algorithm::Ring,
        ),
    ] {
        for mode in [Mode::Ideal, Mode::Contention] {
            let a = run(coll, algo, 3 << 20, t, mode);
            let b = run(coll, algo, 3 << 20, t, mode);
            assert_eq!(a.time_s.to_bits(), b.time_s.to_bits(), "{t}");
            assert_eq!(a, b, "{t}");
            assert!(a.time_s > 0.0);
        }
    }
}
