//! Closed forms of the direct (mesh) algorithms, the star allreduce, the
//! linear gather/scatter and the pairwise exchange.
//!
//! Notation: N ranks; M the buffer in bytes (allreduce, broadcast); C the
//! per-rank block in bytes (allgather, reduce-scatter, alltoall, gather,
//! scatter); n_ij the alltoallv bytes from rank i to rank j; α, β the link's
//! latency and bandwidth, o its per-message overhead, γ the reduction time
//! per byte. A round in which a rank has k messages in flight on a link
//! (k = max(#sends, #receives)) costs α + (k-1)·o + max(bytes sent, bytes
//! received)/β: its messages share one port, each one beyond the first
//! adds o.
//!
//! * direct alltoall, direct allgather: α + (N-2)·o + (N-1)·C/β (one round,
//!   N-1 messages each way).
//! * direct alltoallv: α + (N-2)·o + max_i max(Σ_{j≠i} n_ij, Σ_{j≠i} n_ji)/β:
//!   one round, the busiest port; zero-length messages are sent too, so even
//!   an all-zero exchange costs α + (N-2)·o.
//! * direct reduce-scatter: α + (N-2)·o + (N-1)·C/β + (N-1)·C·γ + (N-2)·C·δ
//!   (one arrival folded on the fly, the other N-2 stored in scratch and
//!   folded in a local round: their round trip through scratch costs δ, the
//!   copy cost, per byte).
//! * direct allreduce (mesh): 2·α + 2(N-2)·o + 2(N-1)/N·M/β + (N-1)/N·M·γ +
//!   (N-2)/N·M·δ; with uneven blocks b_i (the N blocks of the buffer) rank
//!   i's rounds move max(M - b_i, (N-1)·b_i) and reduce b_i then (N-2)·b_i
//!   (staged: (N-2)·b_i·δ), and each round waits for the slowest rank
//!   (everyone exchanges with everyone; messages of empty blocks are
//!   skipped, so they add no o).
//! * direct broadcast: α + (N-2)·o + (N-1)·M/β (the root sends N-1 copies at
//!   once).
//! * star allreduce: 2·α + 2(N-2)·o + 2(N-1)·M/β + (N-1)·M·γ + (N-2)·M·δ
//!   (rank 0 receives and sends N-1 whole buffers, reduces N-1 of them,
//!   N-2 from scratch).
//! * linear gather / scatter: α + (N-2)·o + (N-1)·C/β (the root's port, N-1
//!   messages).
//! * pairwise reduce-scatter: (N-1)·(α + C/β + C·γ) (one message each way
//!   per step: no o).
//! * pairwise alltoall: (N-1)·(α + C/β).
//! * pairwise alltoallv: the longest chain of steps, F_i(k) =
//!   max(F_i(k-1), F_{i+k}(k-1), F_{i-k}(k-1)) + α + max(n_{i,i+k}, n_{i-k,i})/β,
//!   T = max_i F_i(N-1) (indices mod N). Seed 004's
//!   Σ_{k=1}^{N-1} (α + max_i n_{i,(i+k) mod N}/β) assumes every step ends for
//!   all ranks together; the plan has no such barrier, so the seed's sum is
//!   an upper bound, equal for uniform counts. Rank i's first step also
//!   copies its own block, n_ii·δ (δ the copy cost per byte).
//!
//! Topology: with block placement (rank i on node ⌊i/L⌋, L ranks a node) the
//! one-round algorithms split each rank's messages by link class, and the
//! classes run in parallel: α_intra + (k_intra-1)·o_intra + intra
//! bytes/β_intra against α_inter + (k_inter-1)·o_inter + inter
//! bytes/β_inter (k_intra = L-1, k_inter = N-L peers for the mesh), the
//! slower wins (a class with no message costs nothing). The uniform pairwise
//! steps are charged on the classes their pairs use, the slower when both
//! ([`super::recursive::step`]); pairwise alltoallv times each rank's send
//! and receive on their own classes. A flat topology is one node: only the
//! intra-node link applies.

use super::recursive::{shifted, step};
use super::{Cost, Profile, Shape};
use crate::plan::{block, Algorithm, Collective};

/// Closed-form cost of `algo` for `shape` on `profile`; `None` for the pairs
/// this family does not have. `shape.n >= 2` and a nonzero count (except for
/// alltoallv) are ensured by [`super::predict`].
pub(super) fn predict(algo: Algorithm, shape: &Shape, profile: &Profile) -> Option<Cost> {
    use Algorithm as A;
    use Collective as C;
    let cost = match (algo, shape.coll) {
        (A::Direct, C::AllToAll | C::AllGather) => direct_uniform(shape, profile),
        (A::Direct, C::AllToAllV) => direct_all_to_all_v(shape, profile),
        (A::Direct, C::ReduceScatter) => direct_reduce_scatter(shape, profile),
        (A::Direct, C::AllReduce) => direct_all_reduce(shape, profile),
        (A::Direct, C::Broadcast) => direct_broadcast(shape, profile),
        (A::Star, C::AllReduce) => star_all_reduce(shape, profile),
        (A::Linear, C::Gather | C::Scatter) => linear(shape, profile),
        (A::Pairwise, C::ReduceScatter) => pairwise(shape, profile, shape.bytes()),
        (A::Pairwise, C::AllToAll) => pairwise(shape, profile, 0.0),
        (A::Pairwise, C::AllToAllV) => pairwise_all_to_all_v(shape, profile),
        _ => return None,
    };
    Some(cost)
}

/// What one rank moves in one round on one link class: (bytes sent, bytes
/// received, messages k = max(#sends, #receives)), or `None` when it has no
/// message on that class.
type Traffic = Option<(f64, f64, usize)>;

/// One round of one rank: each link class it uses costs α + (k-1)·o +
/// max(sent, received)/β (received/β where only receivers copy,
/// [`Profile::receiver_copies`]), the classes in parallel (the slower
/// counts), plus `reduced`·γ.
fn round(profile: &Profile, intra: Traffic, inter: Traffic, reduced: f64) -> Cost {
    let class = |traffic: Traffic, link: &super::LinkParams| {
        traffic.map_or(Cost::ZERO, |(sent, received, messages)| Cost {
            latency: link.alpha + messages.saturating_sub(1) as f64 * link.overhead,
            bandwidth: profile.round_bandwidth(link, sent, received, messages),
            compute: 0.0,
        })
    };
    let (a, b) = (class(intra, &profile.intra), class(inter, &profile.inter));
    let comm = if b.total() > a.total() { b } else { a };
    comm + Cost {
        latency: 0.0,
        bandwidth: 0.0,
        compute: reduced * profile.gamma,
    }
}

/// Ranks per node L (block placement; a flat topology is one node of N).
fn local(shape: &Shape) -> usize {
    shape.topology.local_size().max(1)
}

/// `Some(traffic)` when a rank has `messages > 0` messages on that class
/// (one per peer in the one-round algorithms).
fn on(messages: usize, sent: f64, received: f64) -> Traffic {
    (messages > 0).then_some((sent, received, messages))
}

/// The slower of two costs.
fn slower(a: Cost, b: Cost) -> Cost {
    if b.total() > a.total() {
        b
    } else {
        a
    }
}

/// Direct alltoall and allgather: one round in which every rank sends C to
/// and receives C from each of its N-1 peers: α + (N-2)·o + (N-1)·C/β
/// (on several nodes: L-1 messages of C intra-node against N-L inter-node).
fn direct_uniform(shape: &Shape, profile: &Profile) -> Cost {
    let (n, l, c) = (shape.n, local(shape), shape.bytes());
    let intra = (l - 1) as f64 * c;
    let inter = (n - l) as f64 * c;
    round(
        profile,
        on(l - 1, intra, intra),
        on(n - l, inter, inter),
        0.0,
    )
}

/// Direct alltoallv: one round; rank i sends Σ_{j≠i} n_ij and receives
/// Σ_{j≠i} n_ji (zero-length messages included, so every peer is a message
/// of its class): α + (N-2)·o + max_i max(Σ_{j≠i} n_ij, Σ_{j≠i} n_ji)/β, the
/// busiest port; exactly, the slowest rank i of its own round, which also
/// copies n_ii (n_ii·δ, δ the copy cost).
fn direct_all_to_all_v(shape: &Shape, profile: &Profile) -> Cost {
    let (n, l, e) = (shape.n, local(shape), shape.elem_size as f64);
    let v = &shape.v_counts;
    (0..n)
        .map(|i| {
            let node = i / l * l..i / l * l + l;
            // Bytes to (from) peers on i's node and off it, itself excluded.
            let (mut sent, mut received) = ([0usize; 2], [0usize; 2]);
            for j in (0..n).filter(|&j| j != i) {
                let class = usize::from(!node.contains(&j));
                sent[class] += v[i][j];
                received[class] += v[j][i];
            }
            let bytes = |k: usize| (sent[k] as f64 * e, received[k] as f64 * e);
            let (intra, inter) = (bytes(0), bytes(1));
            round(
                profile,
                on(l - 1, intra.0, intra.1),
                on(n - l, inter.0, inter.1),
                0.0,
            ) + copy(shape, profile, i)
        })
        .fold(Cost::ZERO, slower)
}

/// Rank `i`'s copy of its own alltoallv block (in its first round).
fn copy(shape: &Shape, profile: &Profile, i: usize) -> Cost {
    Cost {
        latency: 0.0,
        bandwidth: 0.0,
        compute: super::copies::own(shape, i) * profile.copy,
    }
}

/// Direct reduce-scatter: one round exchanging C with every peer and folding
/// one arrival, then a local round folding the other N-2 from scratch:
/// α + (N-2)·o + (N-1)·C/β + (N-1)·C·γ + (N-2)·C·δ.
fn direct_reduce_scatter(shape: &Shape, profile: &Profile) -> Cost {
    let (n, l, c) = (shape.n, local(shape), shape.bytes());
    let intra = (l - 1) as f64 * c;
    let inter = (n - l) as f64 * c;
    let exchange = round(profile, on(l - 1, intra, intra), on(n - l, inter, inter), c);
    exchange
        + round(profile, None, None, (n - 2) as f64 * c)
        + scratch_round_trip(profile, (n - 2) as f64 * c)
}

/// The round trip through scratch of `bytes` that arrived in one round and
/// are folded in a later one (a local reduce from a scratch slot), at the
/// profile's copy cost: a fold on arrival reads the message once, a staged
/// one writes it to scratch and reads it back (measured, bench/RESULTS.md,
/// 2026-12-05: 4 thread ranks, direct reduce-scatter 1.3-1.6x the time of
/// pairwise from 512 KiB, whose folds are all on arrival).
fn scratch_round_trip(profile: &Profile, bytes: f64) -> Cost {
    Cost {
        latency: 0.0,
        bandwidth: 0.0,
        compute: bytes * profile.copy,
    }
}

/// Direct (mesh) allreduce: direct reduce-scatter of the N blocks b_i of the
/// buffer, then direct allgather of the reduced blocks.
///
/// Round 1, rank i: sends M - b_i (every other nonempty block to its owner),
/// receives (N-1)·b_i and folds b_i; round 2: folds (N-2)·b_i, sends
/// (N-1)·b_i, receives M - b_i. A rank has N-1 messages each way when all
/// blocks are nonempty (messages of empty blocks are skipped by the plan).
/// Every rank exchanges with every other, so each round ends with its
/// slowest rank: max_i round1(i) + max_i round2(i) =
/// 2·α + 2(N-2)·o + 2(N-1)/N·M/β + (N-1)/N·M·γ for even blocks.
fn direct_all_reduce(shape: &Shape, profile: &Profile) -> Cost {
    let (n, l, count) = (shape.n, local(shape), shape.count);
    let e = shape.elem_size as f64;
    // Bytes of blocks first..end (block n starts at the end of the buffer).
    let span =
        |first: usize, end: usize| (block(count, n, end).0 - block(count, n, first).0) as f64 * e;
    let m = shape.bytes();
    let nonempty = |i: usize| block(count, n, i).1 > 0;
    let (mut first, mut second) = (Cost::ZERO, Cost::ZERO);
    for i in 0..n {
        let b = block(count, n, i).1 as f64 * e;
        let nodes = i / l * l..i / l * l + l;
        let node = span(nodes.start, nodes.end);
        // Other ranks' blocks on i's node and off it, and how many of them
        // are nonempty (messages to / from those ranks).
        let (near, far) = (node - b, m - node);
        let (to_near, to_far) = ((l - 1) as f64 * b, (n - l) as f64 * b);
        // Blocks are nonempty exactly for indices below min(count, n), so
        // the nonempty peers on and off i's node are counted in O(1).
        let filled = count.min(n);
        let in_range = |a: usize, b: usize| b.min(filled).saturating_sub(a.min(filled));
        let on_node = in_range(nodes.start, nodes.end);
        let own = usize::from(nonempty(i));
        let (near_peers, far_peers) = (on_node - own, in_range(0, n) - on_node);
        // Messages of i's own block: one per peer, none when it is empty.
        let (own_near, own_far) = if nonempty(i) { (l - 1, n - l) } else { (0, 0) };
        first = slower(
            first,
            round(
                profile,
                on(near_peers.max(own_near), near, to_near),
                on(far_peers.max(own_far), far, to_far),
                b,
            ),
        );
        second = slower(
            second,
            round(
                profile,
                on(own_near.max(near_peers), to_near, near),
                on(own_far.max(far_peers), to_far, far),
                (n - 2) as f64 * b,
            ) + scratch_round_trip(profile, (n - 2) as f64 * b),
        );
    }
    first + second
}

/// Direct broadcast: the root sends M to each of the N-1 others at once:
/// α + (N-2)·o + (N-1)·M/β (on several nodes: L-1 messages of M intra
/// against N-L inter; a receiver's own α + M/β never exceeds that). Where
/// only receivers copy, the root's part is α + (N-2)·o and a receiver's
/// α + M/β: the N-1 copies run at once.
fn direct_broadcast(shape: &Shape, profile: &Profile) -> Cost {
    let (n, l, m) = (shape.n, local(shape), shape.bytes());
    let root = round(
        profile,
        on(l - 1, (l - 1) as f64 * m, 0.0),
        on(n - l, (n - l) as f64 * m, 0.0),
        0.0,
    );
    // A receiver on the root's node, and one on another node.
    let near = round(profile, (l > 1).then_some((0.0, m, 1)), None, 0.0);
    let far = round(profile, None, (n > l).then_some((0.0, m, 1)), 0.0);
    slower(slower(root, near), far)
}

/// Linear gather (scatter): the root receives (sends) C from (to) each of
/// the N-1 others in one round: α + (N-2)·o + (N-1)·C/β (a scatter's leaves
/// α + C/β each where only receivers copy).
fn linear(shape: &Shape, profile: &Profile) -> Cost {
    let (n, l, c) = (shape.n, local(shape), shape.bytes());
    // (sent, received) of the root's and of a leaf's one message.
    let gather = shape.coll == Collective::Gather;
    let (root_of, leaf) = if gather {
        ((0.0, 1.0), (c, 0.0))
    } else {
        ((1.0, 0.0), (0.0, c))
    };
    let root_side = |peers: usize| {
        on(
            peers,
            root_of.0 * peers as f64 * c,
            root_of.1 * peers as f64 * c,
        )
    };
    let root = round(profile, root_side(l - 1), root_side(n - l), 0.0);
    let near = round(profile, (l > 1).then_some((leaf.0, leaf.1, 1)), None, 0.0);
    let far = round(profile, None, (n > l).then_some((leaf.0, leaf.1, 1)), 0.0);
    slower(slower(root, near), far)
}

/// Star allreduce: everyone sends M to rank 0, which folds the N-1 buffers
/// (one on arrival, N-2 at the start of round 2) and sends the result to
/// each: 2·α + 2(N-2)·o + 2(N-1)·M/β + (N-1)·M·γ (rank 0's port, both
/// rounds, N-1 messages in each).
///
/// A leaf's second round waits for rank 0 to start its own; it ends before
/// rank 0's unless a leaf's link is slower than all of rank 0's traffic, which
/// the max below covers.
fn star_all_reduce(shape: &Shape, profile: &Profile) -> Cost {
    let (n, l, m) = (shape.n, local(shape), shape.bytes());
    let (near, far) = ((l - 1) as f64 * m, (n - l) as f64 * m);
    let gather = round(profile, on(l - 1, 0.0, near), on(n - l, 0.0, far), m);
    let spread = round(
        profile,
        on(l - 1, near, 0.0),
        on(n - l, far, 0.0),
        (n - 2) as f64 * m,
    ) + scratch_round_trip(profile, (n - 2) as f64 * m);
    let hub = gather + spread;
    // Leaves on rank 0's node (intra) and on other nodes (inter).
    let leaves = [
        (
            l > 1,
            round(profile, Some((m, 0.0, 1)), None, 0.0),
            round(profile, Some((0.0, m, 1)), None, 0.0),
        ),
        (
            n > l,
            round(profile, None, Some((m, 0.0, 1)), 0.0),
            round(profile, None, Some((0.0, m, 1)), 0.0),
        ),
    ];
    leaves
        .into_iter()
        .filter(|(present, ..)| *present)
        .map(|(_, send, recv)| slower(send, gather) + recv)
        .fold(hub, slower)
}

/// Pairwise reduce-scatter (`reduced` = C) and alltoall (`reduced` = 0):
/// N-1 steps, in step k rank i sends C to (i+k) mod N and receives C from
/// (i-k) mod N: (N-1)·(α + C/β + reduced·γ).
fn pairwise(shape: &Shape, profile: &Profile, reduced: f64) -> Cost {
    (1..shape.n).fold(Cost::ZERO, |t, k| {
        t + step(shape, profile, shape.bytes(), reduced, shifted(shape.n, k))
    })
}

/// Pairwise alltoallv: in step k rank i sends n_{i,(i+k) mod N} to
/// (i+k) mod N while receiving n_{(i-k) mod N,i} from (i-k) mod N, which
/// costs it c_i(k) = α + max(n_{i,i+k}, n_{i-k,i})/β (one message each way:
/// no o term).
///
/// Seed 004 charges each step its largest block,
/// Σ_{k=1}^{N-1} (α + max_i n_{i,(i+k) mod N}/β), which assumes that every
/// step ends for all ranks together. The plan has no such barrier: rank i
/// starts step k as soon as it and its two partners of that step have
/// finished step k-1, so a large block delays only the ranks downstream of
/// it, and the seed's sum is an upper bound (up to 8 % high on the
/// consistency test's uneven counts).
/// The time is the longest such chain,
///
/// F_i(0) = 0, F_i(k) = max(F_i(k-1), F_{i+k}(k-1), F_{i-k}(k-1)) + c_i(k),
/// T = max_i F_i(N-1),
///
/// which equals the seed's sum when the counts are uniform. Zero-length
/// messages are sent too (α per step even when empty).
fn pairwise_all_to_all_v(shape: &Shape, profile: &Profile) -> Cost {
    let (n, l, e) = (shape.n, local(shape), shape.elem_size as f64);
    let v = &shape.v_counts;
    // c_i(k), with the send and the receive on their own link classes.
    let cost = |i: usize, k: usize| {
        let (to, from) = ((i + k) % n, (i + n - k) % n);
        let (sent, received) = (v[i][to] as f64 * e, v[from][i] as f64 * e);
        let (mut intra, mut inter): (Traffic, Traffic) = (None, None);
        // One send and one receive: a class carrying both has k = 1 too.
        for (peer, s, r) in [(to, sent, 0.0), (from, 0.0, received)] {
            let class = if peer / l == i / l {
                &mut intra
            } else {
                &mut inter
            };
            let (s0, r0, _) = class.unwrap_or((0.0, 0.0, 1));
            *class = Some((s0 + s, r0 + r, 1));
        }
        round(profile, intra, inter, 0.0)
    };
    let mut finish = vec![Cost::ZERO; n];
    for k in 1..n {
        finish = (0..n)
            .map(|i| {
                let partners = [finish[(i + k) % n], finish[(i + n - k) % n]];
                let first = if k == 1 {
                    copy(shape, profile, i)
                } else {
                    Cost::ZERO
                };
                partners.into_iter().fold(finish[i], slower) + cost(i, k) + first
            })
            .collect();
    }
    finish.into_iter().fold(Cost::ZERO, slower)
}

#[cfg(test)]
mod tests {
    //! The closed forms of this file and of `recursive.rs` on multi-node
    //! topologies, which `tests/cost_consistency.rs` does not cover for
    //! them: exact for the one-round algorithms and the pairwise exchange,
    //! never below the walk for the others.

    use super::super::{predict, walk, LinkParams, Profile, Shape};
    use crate::plan::{self, Algorithm, Collective, Plan, Topology};

    /// Intra-node links 100 times faster than inter-node ones.
    fn two_tier() -> Profile {
        Profile {
            intra: LinkParams {
                alpha: 1e-6,
                beta: 1e11,
                overhead: 0.0,
                piece: 0.0,
            },
            inter: LinkParams {
                alpha: 1e-5,
                beta: 1e9,
                overhead: 0.0,
                piece: 0.0,
            },
            gamma: 2e-11,
            copy: 0.0,
            cache_bytes: 0.0,
            beta_mem: 0.0,
            copy_mem: 0.0,
            inter_ports: 0.0,
            cores: 0.0,
            receiver_copies: false,
            two_sided_copies: false,
        }
    }

    /// A shape on `levels`, uneven alltoallv counts included.
    fn shape(coll: Collective, levels: &[usize], count: usize, root: usize) -> Shape {
        let n = levels.iter().product();
        let mut s = Shape::new(coll, n, count, 4);
        s.topology = Topology::new(levels.to_vec()).unwrap();
        s.root = root;
        if coll == Collective::AllToAllV {
            s.v_counts = (0..n)
                .map(|i| {
                    (0..n)
                        .map(|j| count / n * (1 + (3 * i + j) % 7) / 2)
                        .collect()
                })
                .collect();
        }
        s
    }

    /// The walk of the real plans.
    fn walked(algo: Algorithm, s: &Shape, profile: &Profile) -> f64 {
        let plans: Vec<Plan> = (0..s.n)
            .map(|r| plan::build(algo, &s.request(r)).unwrap())
            .collect();
        walk(&plans, s.elem_size, profile, &s.topology)
            .unwrap()
            .total()
    }

    #[test]
    fn multi_node_topologies() {
        use Algorithm as A;
        use Collective as C;
        let exact = [
            (C::AllReduce, A::Direct),
            (C::AllGather, A::Direct),
            (C::ReduceScatter, A::Direct),
            (C::Broadcast, A::Direct),
            (C::AllToAll, A::Direct),
            (C::AllToAllV, A::Direct),
            (C::AllReduce, A::Star),
            (C::Gather, A::Linear),
            (C::Scatter, A::Linear),
            (C::ReduceScatter, A::Pairwise),
            (C::AllToAll, A::Pairwise),
            (C::AllToAllV, A::Pairwise),
            (C::AllGather, A::Bruck),
            (C::AllToAll, A::Bruck),
            (C::Barrier, A::Dissemination),
        ];
        let bounded = [
            (C::AllReduce, A::Butterfly),
            (C::AllGather, A::Butterfly),
            (C::AllReduce, A::HalvingDoubling),
            (C::ReduceScatter, A::Halving),
        ];
        let profile = two_tier();
        let layouts: [&[usize]; 10] = [
            &[2, 4],
            &[4, 2],
            &[3, 3],
            &[2, 2, 2],
            &[2, 3],
            &[3, 4],
            &[6, 2],
            &[2, 5],
            &[4, 4],
            &[3, 5],
        ];
        for levels in layouts {
            let n: usize = levels.iter().product();
            for (coll, algo) in exact.iter().chain(&bounded).copied() {
                for root in [0, n - 1] {
                    let s = shape(coll, levels, n * 16 * 64, root);
                    let model = predict(algo, &s, &profile).unwrap().total();
                    let w = walked(algo, &s, &profile);
                    let what = format!(
                        "{coll}/{algo} on {levels:?}, root {root}: model {model:e}, walk {w:e}"
                    );
                    assert!(model >= w * (1.0 - 1e-9), "{what}");
                    if exact.contains(&(coll, algo)) {
                        assert!((model - w).abs() <= 1e-9 * w, "{what}");
                    }
                }
            }
        }
    }

    /// Where only receivers copy, a root sending to many peers at once pays
    /// nothing per byte and a receiver pays for its one message; a root
    /// receiving from many (gather) pays for all of them either way. Where
    /// senders copy too, nothing changes.
    #[test]
    fn receiver_copies_moves_the_byte_cost_to_the_receivers() {
        let push = Profile::uniform(2e-6, 1e9, 0.0);
        let pull = Profile {
            receiver_copies: true,
            ..push.clone()
        };
        let (n, count) = (5usize, 1000usize);
        let m = (count * 4) as f64;
        let cost = |coll, p: &Profile| {
            let s = shape(coll, &[n], count, 0);
            predict(
                if coll == Collective::Broadcast {
                    Algorithm::Direct
                } else {
                    Algorithm::Linear
                },
                &s,
                p,
            )
            .unwrap()
        };
        let (bcast_push, bcast_pull) = (
            cost(Collective::Broadcast, &push),
            cost(Collective::Broadcast, &pull),
        );
        assert!((bcast_push.bandwidth - (n - 1) as f64 * m / 1e9).abs() < 1e-15);
        assert!(
            (bcast_pull.bandwidth - m / 1e9).abs() < 1e-15,
            "{bcast_pull:?}"
        );
        let (scatter_push, scatter_pull) = (
            cost(Collective::Scatter, &push),
            cost(Collective::Scatter, &pull),
        );
        assert!((scatter_push.bandwidth - (n - 1) as f64 * m / 1e9).abs() < 1e-15);
        assert!((scatter_pull.bandwidth - m / 1e9).abs() < 1e-15);
        let (gather_push, gather_pull) = (
            cost(Collective::Gather, &push),
            cost(Collective::Gather, &pull),
        );
        assert_eq!(gather_push.bandwidth, gather_pull.bandwidth);
        assert!((gather_pull.bandwidth - (n - 1) as f64 * m / 1e9).abs() < 1e-15);
        // Symmetric rounds cost the same either way.
        let s = shape(Collective::AllToAll, &[n], count, 0);
        assert_eq!(
            predict(Algorithm::Direct, &s, &push).unwrap(),
            predict(Algorithm::Direct, &s, &pull).unwrap()
        );
    }

    /// Seed 004's lockstep sum for pairwise alltoallv bounds the plan's time
    /// from above, and equals it for uniform counts.
    #[test]
    fn pairwise_alltoallv_under_the_lockstep_sum() {
        let profile = Profile::uniform(5e-6, 2e9, 1e-10);
        for n in 2..=24usize {
            for uniform in [true, false] {
                let mut s = Shape::new(Collective::AllToAllV, n, 0, 4);
                s.v_counts = (0..n)
                    .map(|i| {
                        (0..n)
                            .map(|j| {
                                if uniform {
                                    640
                                } else {
                                    64 * (1 + (i + 2 * j) % 5)
                                }
                            })
                            .collect()
                    })
                    .collect();
                let model = predict(Algorithm::Pairwise, &s, &profile).unwrap().total();
                let lockstep: f64 = (1..n)
                    .map(|k| {
                        let largest = (0..n).map(|i| s.v_counts[i][(i + k) % n]).max().unwrap();
                        profile.intra.alpha + (largest * 4) as f64 / profile.intra.beta
                    })
                    .sum();
                assert!(model <= lockstep * (1.0 + 1e-12), "n = {n}");
                if uniform {
                    assert!((model - lockstep).abs() <= 1e-9 * lockstep, "n = {n}");
                }
            }
        }
    }
}
