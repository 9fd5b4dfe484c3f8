//! Closed forms of the tree family: the binomial trees of `plan/tree.rs`,
//! the double binary tree of `plan/dbtree.rs`, and the two tree-based
//! composites of `plan/composite.rs`.
//!
//! Notation: N ranks, D = ceil(log2 N) the binomial tree's rounds, M the
//! buffer in bytes (for gather and scatter, M is one rank's block), B =
//! ceil(count/N) elements, in bytes, the largest of N blocks (M/N when N
//! divides the count), |b_i| the bytes of block i, alpha/beta/o the group's
//! link (o: the overhead of each message of a round beyond the first
//! through a port), gamma the reduction time per byte.
//!
//! ```text
//! tree broadcast           T = D·(alpha + M/beta)
//! tree reduce              T = D·(alpha + M/beta + M·gamma)
//! tree allreduce           T = 2D·(alpha + M/beta) + D·M·gamma
//! tree gather, scatter     T = D·alpha + (N-1)·M/beta
//! tree barrier             T = 2D·alpha
//! scatter_allgather bcast  T = (D + N-1)·alpha + (M - |b_0|)/beta + (N-1)·B/beta
//!                            = (D + N-1)·alpha + 2(N-1)/N·M/beta              (N | count)
//! rs_gather reduce         T = N·alpha + (N-2)·o + (N-1)·B/beta + (M - |b_(root+1)|)/beta
//!                              + (N-1)·B·gamma
//!                            = N·alpha + (N-2)·o + 2(N-1)/N·M/beta + (N-1)/N·M·gamma   (N | count)
//! dbtree allreduce         T = (2D + S - 1)·alpha + (W - 2D - S + 1)·o + W·s/beta + C·s·gamma (+ C/2·s·copy from N = 4)
//!     S >= 3:  W = 2(2D + S - 1) + max(S - 1, min(3S - 2D - 1 - 2m, 2S - 2 - 2m)),
//!              C = 2(S + D) - 4
//!     S = 2:   W = 4D + m,      C = 2D
//!     S = 1:   W = 3D + 2 - m,  C = D
//!     N = 2:   W = 2S,          C = S
//!     N = 3:   W = min(4S, 3S + 3),  C = 2S;   N = 4, 5 and S = 1:  W = 2(N-1)
//! ```
//!
//! The binomial trees, the ring allgather and reduce-scatter and the
//! scatter send at most one message and receive at most one per round on the
//! critical path, so o appears only where a rank has several messages in a
//! round: the root's gather round of `rs_gather` (N-1 messages: o for N-2),
//! and the double binary tree, every one of whose messages carries one
//! segment, so that its path's W segments are W messages in 2D + S - 1
//! rounds.
//!
//! * `tree` broadcast, reduce: each round doubles the ranks holding the
//!   buffer (or halves those holding partial results; the root folds one
//!   subtree's per round). Allreduce is a reduce to rank 0 then a broadcast
//!   from it; the barrier an empty gather then an empty broadcast.
//! * `tree` gather and scatter: the root exchanges one subtree per round, the
//!   subtrees holding 1, 2, 4, ... blocks, N-1 in all.
//! * `scatter_allgather` broadcast (van de Geijn): the binomial scatter of the
//!   N blocks (the root sends all but its own in D rounds), then the ring
//!   allgather (N-1 rounds of one block), which every rank starts once its
//!   ring neighbours hold their blocks.
//! * `rs_gather` reduce (Rabenseifner): the ring reduce-scatter (N-1 rounds of
//!   one block, folded), then one round in which the root receives the N-1
//!   blocks it does not hold (all but block root+1).
//! * `dbtree` allreduce: two binary trees each carry half the buffer, cut
//!   into S segments of s bytes (s = ceil(ceil(count/2)/S) elements; S from
//!   the byte size as the plan picks it, [`dbtree_segments`]), up and down at
//!   once. The 2D + S - 1 rounds are the plan's. The critical path moves two
//!   segments per round (a rank folding its two children's, or sending to
//!   both) while the pipeline fills and drains, and runs through the busiest
//!   rank, interior at depth m in one tree and a deepest leaf of the other,
//!   which in the steady state receives four segments per round (two
//!   children, two parents) and sends four (one parent, two children, its
//!   own leaf segment); the max/min term of W is the surplus of that rank's
//!   rounds over two segments, and C counts the segments folded on the path.
//!   m = 1 is the depth of the shallowest rank with two children (m = 2 when
//!   N = 2^(D-1) + 1, whose rank 2^(D-1) = N-1 has a single child). For
//!   S <= 2 the pipeline never fills: the path climbs D-1 levels at two
//!   segments a round, crosses the top of the tree at one, and ends with two
//!   rounds at two. The smallest groups, whose trees are chains, differ.
//!
//! This closed form is what [`dbtree`] computes, but it is not exact: the
//! plan's critical path is not a function of N, M and S alone (it depends on
//! the depths the two trees give each rank, and with uneven segments on
//! which segments it meets). Of the 2016 cases N = 2..64, S = 1..32 with
//! equal segments, the form matches the plans in 1940 (every power of two
//! and most other N, at every S); in the other 76 its W is low, by at most
//! 9% of the bandwidth term (some N between 11 and 59 for S between about D
//! and 2D, where another rank's window can outweigh the busiest one's, and
//! N = 42, 44, 46, 48 for S = 1, where the path zig-zags between the trees
//! through a third round of two segments), and with o > 0 so is its overhead
//! term, (W - (2D + S - 1))·o. Following the two trees round by round would
//! be exact but costs O(N·(2D + S)) per prediction, far too slow for `auto`
//! and `ferrocoll model` at 100,000 ranks (minutes instead of milliseconds,
//! measured), so the consistency test holds dbtree to 10 %.
//!
//! # How exact
//!
//! With a flat topology (the tested case) the forms are exact (relative
//! 1e-9) for counts that split evenly into every block and segment; the
//! double binary tree's form is within 10 %.
//!
//! The algorithms ignore the topology, but their messages do not: on a
//! group that mixes intra- and inter-node links (block placement), the
//! binomial trees' critical path is the slowest chain of rounds from the
//! root to a rank ([`binomial_path`], a sum over the D levels for each rank,
//! which matched the walk on every multi-node topology tried), the rings
//! run at the pace of their slowest link ([`link`]), the root of
//! `rs_gather` receives on both link classes at once ([`gather_round`]: L-1
//! messages intra-node, N-L inter-node, each class paying o for all but its
//! first), and the double binary tree charges each message on its own link.

use super::ring::{link, round_of, slower};
use super::{Cost, LinkParams, Profile, Shape};
use crate::plan::{block, Algorithm, Collective};

/// Closed-form cost of a tree-family algorithm for `shape` (N >= 2, and
/// count > 0 except for the barrier; [`super::predict`] handles the rest),
/// `None` for a collective the family does not implement.
pub(super) fn predict(algo: Algorithm, shape: &Shape, profile: &Profile) -> Option<Cost> {
    let (n, count, e) = (shape.n, shape.count, shape.elem_size as f64);
    let g = profile.gamma;
    let m = shape.bytes();
    let d = ceil_log2(n) as f64;
    // Bytes of block `i` of N, and of virtual blocks `from..to`.
    let blk = |i: usize| block(count, n, i % n).1 as f64 * e;
    let blocks = |from: usize, to: usize| {
        (block(count, n, to.min(n)).0 - block(count, n, from).0) as f64 * e
    };
    // The one link class of a single-node (or one-rank-per-node) group;
    // `None` when the group mixes both.
    let single = single_link(shape, profile);
    // A binomial round is one way for every rank: it sends or receives.
    let one_way = profile.moved(0.0, m);
    match (algo, shape.coll) {
        (Algorithm::Tree, Collective::Broadcast) => Some(match single {
            Some(l) => Cost::rounds(d, one_way, l, 0.0, g),
            None => binomial_path(shape, profile, |_, _| m, 0.0),
        }),
        (Algorithm::Tree, Collective::Reduce) => Some(match single {
            Some(l) => Cost::rounds(d, one_way, l, d * m, g),
            None => binomial_path(shape, profile, |_, _| m, m),
        }),
        (Algorithm::Tree, Collective::AllReduce) => Some(match single {
            Some(l) => Cost::rounds(2.0 * d, one_way, l, d * m, g),
            None => {
                let rooted = Shape {
                    root: 0,
                    ..shape.clone()
                };
                binomial_path(&rooted, profile, |_, _| m, m)
                    + binomial_path(&rooted, profile, |_, _| m, 0.0)
            }
        }),
        // With a pipeline piece the rounds' messages differ in what they
        // pay beyond their bytes: the path below prices each.
        (Algorithm::Tree, Collective::Gather | Collective::Scatter) => Some(match single {
            Some(l) if l.piece <= 0.0 => Cost {
                latency: d * l.alpha,
                bandwidth: (n - 1) as f64 * one_way / l.beta,
                compute: 0.0,
            },
            // The message between virtual ranks h and h + k carries the
            // subtree of h + k: min(k, N - h - k) blocks.
            _ => binomial_path(shape, profile, |h, k| k.min(n - h - k) as f64 * m, 0.0),
        }),
        (Algorithm::Tree, Collective::Barrier) => Some(match single {
            Some(l) => Cost::rounds(2.0 * d, 0.0, l, 0.0, g),
            None => {
                let rooted = Shape {
                    root: 0,
                    ..shape.clone()
                };
                let half = binomial_path(&rooted, profile, |_, _| 0.0, 0.0);
                half + half
            }
        }),
        (Algorithm::ScatterAllgather, Collective::Broadcast) => {
            let b = blk(0);
            let scatter = match single {
                Some(l) if l.piece <= 0.0 => Cost {
                    latency: d * l.alpha,
                    bandwidth: (m - b) / l.beta,
                    compute: 0.0,
                },
                _ => binomial_path(shape, profile, |h, k| blocks(h + k, h + 2 * k), 0.0),
            };
            let allgather = Cost::rounds((n - 1) as f64, b, link(shape, profile, b), 0.0, g);
            Some(scatter + allgather)
        }
        (Algorithm::RsGather, Collective::Reduce) => {
            let b = blk(0);
            let steps = (n - 1) as f64;
            let reduce_scatter = Cost::rounds(steps, b, link(shape, profile, b), steps * b, g);
            Some(reduce_scatter + gather_round(shape, profile, m - blk(shape.root + 1)))
        }
        (Algorithm::DoubleBinaryTree, Collective::AllReduce) => Some(dbtree(shape, profile)),
        _ => None,
    }
}

/// ceil(log2 n) for n >= 1: the rounds of a binomial tree over n ranks.
fn ceil_log2(n: usize) -> u32 {
    n.next_power_of_two().trailing_zeros()
}

/// The group's only link class: intra-node on one node, inter-node when
/// every rank is a node of its own; `None` when it has both.
fn single_link<'a>(shape: &Shape, profile: &'a Profile) -> Option<&'a LinkParams> {
    let topo = &shape.topology;
    if topo.nodes() == 1 {
        Some(&profile.intra)
    } else if topo.local_size() == 1 {
        Some(&profile.inter)
    } else {
        None
    }
}

/// The binomial tree's critical path on a group that mixes both link
/// classes: for a virtual rank v, the rounds k = 2^(D-1), ..., lowbit(v) in
/// which its ancestor h = v with the bits below 2k cleared exchanges with
/// h + k (v's branch or a sibling's, if h + k < N) lie on one chain, each on
/// the link between h and h + k; the slowest chain over v is the broadcast's
/// (and, reversed, the reduce's):
/// `T = max_v sum_k (alpha_(h,h+k) + bytes(h, k)/beta_(h,h+k) + reduced·gamma)`,
/// `bytes(h, k)` being the message between virtual ranks h and h + k and
/// `reduced` the bytes folded per round. With one link class the chain of
/// v = 1 (all D rounds of the root) is the longest: the closed forms.
fn binomial_path(
    shape: &Shape,
    profile: &Profile,
    bytes: impl Fn(usize, usize) -> f64,
    reduced: f64,
) -> Cost {
    let n = shape.n;
    let local = shape.topology.local_size();
    let node = |v: usize| (v + shape.root) % n / local;
    let top = n.next_power_of_two() / 2;
    let mut worst = Cost::ZERO;
    for v in 1..n {
        let mut path = Cost::ZERO;
        let mut k = top;
        while k >= 1 << v.trailing_zeros() {
            let h = v & !(2 * k - 1);
            if h + k < n {
                let l = if node(h) == node(h + k) {
                    &profile.intra
                } else {
                    &profile.inter
                };
                // One way: h sends, h + k receives (or the reverse).
                let one_way = profile.moved(0.0, bytes(h, k));
                path = path + Cost::rounds(1.0, one_way, l, reduced, profile.gamma);
            }
            k >>= 1;
        }
        worst = slower(worst, path);
    }
    worst
}

/// The round in which the root receives `bytes` from all N-1 other ranks at
/// once: on one port per link class, L-1 of them from its own node and N-L
/// from the others (alpha + (k-1)·o + bytes/beta for k messages), the slower
/// class setting the pace.
fn gather_round(shape: &Shape, profile: &Profile, bytes: f64) -> Cost {
    let (n, local) = (shape.n, shape.topology.local_size());
    let share = |k: usize| bytes * k as f64 / (n - 1) as f64;
    match single_link(shape, profile) {
        Some(l) => round_of(l, n - 1, bytes),
        None => slower(
            round_of(&profile.intra, local - 1, share(local - 1)),
            round_of(&profile.inter, n - local, share(n - local)),
        ),
    }
}

/// Segments per half of the double binary tree: the plan's own rule.
fn dbtree_segments(len: usize, elem_size: usize) -> usize {
    crate::plan::dbtree_segments(len, elem_size)
}

/// Double binary tree allreduce: the closed form of the module docs.
///
/// Not exact: the plan's critical path depends on the depth each rank gets
/// in each tree, which no formula in N, M and S captures; this form matches
/// the walk in 1940 of 2016 equal-segment cases (N = 2..64, S = 1..32) and is
/// otherwise at most 9 % low on the bandwidth term. Its rounds, 2D + S - 1,
/// are exact; every message carries one segment, so the per-message overhead
/// o is charged for the messages beyond one per round: W - (2D + S - 1) of
/// the W segments moved on the critical path (low by the same few messages
/// where W is). O(1), which `auto` and `ferrocoll model` need at 100,000
/// ranks.
fn dbtree(shape: &Shape, profile: &Profile) -> Cost {
    let (_, half) = block(shape.count, 2, 0);
    let segs = dbtree_segments(half, shape.elem_size);
    let s = block(half, segs, 0).1 as f64 * shape.elem_size as f64;
    let d = ceil_log2(shape.n) as f64;
    let sf = segs as f64;
    let n = shape.n;
    // Depth of the shallowest rank with two children (in either tree, as
    // both have the same shape): 1, except when N = 2^(D-1) + 1, where the
    // root's child 2^(D-1) = N-1 has a single child.
    let dm = if n == n.next_power_of_two() / 2 + 1 {
        2.0
    } else {
        1.0
    };
    let (moved, reduced) = if n == 2 {
        // One edge, used by both trees in opposite directions: every round
        // but the first and last carries a segment each way of each half.
        (2.0 * sf, sf)
    } else if n == 3 {
        // Two chains of three ranks; rank 0 is the middle of one and the
        // root of the other.
        ((4.0 * sf).min(3.0 * sf + 3.0), 2.0 * sf)
    } else if segs == 1 {
        let moved = if n <= 5 {
            2.0 * (n - 1) as f64
        } else {
            3.0 * d + 2.0 - dm
        };
        (moved, d)
    } else if segs == 2 {
        (4.0 * d + dm, 2.0 * d)
    } else {
        let busiest =
            (sf - 1.0).max((3.0 * sf - 2.0 * d - 1.0 - 2.0 * dm).min(2.0 * sf - 2.0 - 2.0 * dm));
        (2.0 * (2.0 * d + sf - 1.0) + busiest, 2.0 * (sf + d) - 4.0)
    };
    // From N = 4 on, the path runs through ranks with two children, which
    // fold one child's segment on arrival and the other's from scratch a
    // round later: half the folds pay the scratch round trip (a copy). Not
    // when N = 2^(D-1) + 1 (dm = 2) and the pipeline does not fill (S <= 2):
    // the path then climbs through ranks with a single child (the walk
    // finds no staged fold on it).
    let staged = if n >= 4 && (dm == 1.0 || segs >= 3) {
        reduced / 2.0
    } else {
        0.0
    };
    let l = link(shape, profile, 4.0 * s);
    let rounds = 2.0 * d + sf - 1.0;
    Cost {
        latency: rounds * l.alpha + (moved - rounds).max(0.0) * l.overhead,
        // One piece a round (its messages are segments).
        bandwidth: (moved * s + rounds * l.piece_of(s)) / l.beta,
        compute: reduced * s * profile.gamma + staged * s * profile.copy,
    }
}
