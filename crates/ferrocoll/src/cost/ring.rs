//! Closed forms of the ring family (`plan/ring.rs`): every rank talks only
//! to its two ring neighbours.
//!
//! Notation: N ranks, M the buffer in bytes (for allgather and
//! reduce-scatter, M is one rank's block), alpha/beta/o the link of the
//! group (o: the overhead of each message of a round beyond the first
//! through a port), gamma the reduction time per byte. B = ceil(count/N) elements, in bytes, is
//! the largest of the N ring blocks (`block(count, N, 0)`); it is exactly M/N
//! when N divides the count.
//!
//! ```text
//! ring allreduce       T = 2(N-1)·alpha + 2(N-1)·B/beta + (N-1)·B·gamma
//!                        = 2(N-1)·alpha + 2(N-1)/N·M/beta + (N-1)/N·M·gamma   (N | count)
//! ring2 allreduce      T = 2(N-1)·(alpha + o) + 2(N-1)·B2/beta + (N-1)·B2·gamma,
//!                      B2 = ceil(ceil(count/2)/N) + ceil(floor(count/2)/N) elements
//! ring allgather       T = (N-1)·(alpha + M/beta)
//! ring reduce-scatter  T = (N-1)·(alpha + M/beta + M·gamma)
//! pipeline broadcast   T = (N+S-2)·alpha + ((N-2)·s + M)/beta
//! pipeline reduce      T = (N+S-2)·alpha + ((N-2)·s + M)·(1/beta + gamma)
//!                        = (N+S-2)·(alpha + M/S/beta [+ M/S·gamma])             (S | count)
//! ```
//!
//! Every round of `ring` and `pipeline` sends one message and receives one,
//! so o never appears; a `ring2` round sends two (one to each neighbour)
//! and receives two.
//!
//! * `ring` allreduce: N-1 reduce-scatter steps then N-1 allgather steps, each
//!   sending one block and receiving one; the first N-1 fold what they
//!   receive.
//! * `ring2` allreduce (two-port ring): the same 2(N-1) rounds, but each round
//!   sends a block of each half, one to each neighbour. On one link class
//!   both messages go through the rank's one port (the model's full-duplex
//!   port per class), so a round moves a block of each half, B2 (M/N when
//!   2N | count), each way in two messages: the ring's cost plus o a round. The plan's doc expects half the
//!   bandwidth term from the two directions; in this model that happens only
//!   where the two neighbours are on different link classes (see below).
//! * `ring` allgather and reduce-scatter: N-1 steps of one block.
//! * `pipeline` broadcast and reduce (NCCL's ring broadcast/reduce): the
//!   buffer is cut into S segments (S from the byte size, as the plan picks
//!   it: [`segments`]; s = ceil(count/S) elements, in bytes, the largest)
//!   that flow down the chain root -> root+1 -> ... one hop per round, N+S-2
//!   rounds in all: the first segment takes N-1 hops to reach the end of the
//!   chain, and the S-1 others follow one round apart. Each middle rank's
//!   round sends one segment and receives the next, so with uneven segments
//!   a round costs its larger, earlier one; hence (N-2)·s + M rather than
//!   (N+S-2)·M/S.
//!
//! With a flat topology (the tested case) every link is intra-node and these
//! forms are exact: for the pipeline whatever the segments, for the others
//! when N (2N for `ring2`) divides the count, and within a block's element
//! otherwise. On several nodes (block placement, L ranks per node), a rank
//! whose neighbour is on another node uses both link classes in a round and
//! pays the slower ([`link`]); the ring keeps every rank in step with its
//! neighbours, so the whole ring runs at that pace (exact for `ring`). For
//! `ring2` a boundary rank sends one half's block on each class (one message
//! each, no o), while a rank inside a node (L >= 3) sends both halves
//! intra-node (alpha + o) ([`ring2_round`]). The
//! chain pays the inter-node link on each of its X node crossings and, for
//! each further segment, at one of them ([`pipeline`]; an estimate).

use super::{Cost, LinkParams, Profile, Shape};
use crate::plan::{block, Algorithm, Collective};

/// Segments the pipelined chain cuts `count` elements into: the plan's own
/// rule.
fn segments(count: usize, elem_size: usize) -> usize {
    crate::plan::chain_segments(count, elem_size)
}

/// Closed-form cost of a ring-family algorithm for `shape` (N >= 2, count >
/// 0; [`super::predict`] handles the rest), `None` for a collective the
/// family does not implement.
pub(super) fn predict(algo: Algorithm, shape: &Shape, profile: &Profile) -> Option<Cost> {
    let (n, count, e) = (shape.n, shape.count, shape.elem_size as f64);
    let g = profile.gamma;
    let steps = (n - 1) as f64;
    match (algo, shape.coll) {
        (Algorithm::Ring, Collective::AllReduce) => {
            let b = block(count, n, 0).1 as f64 * e;
            Some(all_reduce(steps, b, round(link(shape, profile, b), b), g))
        }
        (Algorithm::Ring2, Collective::AllReduce) => {
            let (_, first) = block(count, 2, 0);
            let (cw, ccw) = (block(first, n, 0).1, block(count - first, n, 0).1);
            let b2 = (cw + ccw) as f64 * e;
            let per_round = ring2_round(shape, profile, cw.max(ccw) as f64 * e, b2);
            Some(all_reduce(steps, b2, per_round, g))
        }
        (Algorithm::Ring, Collective::AllGather) => {
            let m = shape.bytes();
            Some(Cost::rounds(steps, m, link(shape, profile, m), 0.0, g))
        }
        (Algorithm::Ring, Collective::ReduceScatter) => {
            let m = shape.bytes();
            let l = link(shape, profile, m);
            Some(Cost::rounds(steps, m, l, steps * m, g))
        }
        (Algorithm::Pipeline, Collective::Broadcast | Collective::Reduce) => {
            Some(pipeline(shape, profile))
        }
        _ => None,
    }
}

/// Ring allreduce: 2(N-1) rounds of `per_round` (alpha + b/beta on the
/// ring's link), and (N-1)·b·gamma for the reduce-scatter half, which folds
/// one received block of `b` bytes per round.
fn all_reduce(steps: f64, b: f64, per_round: Cost, gamma: f64) -> Cost {
    Cost {
        latency: 2.0 * steps * per_round.latency,
        bandwidth: 2.0 * steps * per_round.bandwidth,
        compute: steps * b * gamma,
    }
}

/// One round of `bytes` through a port of `link`: alpha + bytes/beta.
pub(super) fn round(link: &LinkParams, bytes: f64) -> Cost {
    Cost::rounds(1.0, bytes, link, 0.0, 0.0)
}

/// One round of `msgs` messages (on the busier direction) moving `bytes` in
/// all through a port of `link`: alpha + (msgs-1)·o + bytes/beta.
pub(super) fn round_of(link: &LinkParams, msgs: usize, bytes: f64) -> Cost {
    Cost {
        latency: link.alpha + msgs.saturating_sub(1) as f64 * link.overhead,
        bandwidth: link.transfer(bytes, bytes / msgs.max(1) as f64),
        compute: 0.0,
    }
}

/// The slower of two round costs (by total), as a rank that uses both link
/// classes in one round waits for the slower.
pub(super) fn slower(a: Cost, b: Cost) -> Cost {
    if b.total() > a.total() {
        b
    } else {
        a
    }
}

/// The link a ring round moving `bytes` through each port is charged on: the
/// group's only link class (intra-node for a flat topology, inter-node when
/// every rank is a node of its own), or, when nodes of several ranks meet,
/// whichever class is slower for that message, since the ranks at node
/// boundaries use both in every round. The tree family uses it too.
pub(super) fn link<'a>(shape: &Shape, profile: &'a Profile, bytes: f64) -> &'a LinkParams {
    let topo = &shape.topology;
    let time = |l: &LinkParams| l.alpha + bytes / l.beta;
    match (topo.local_size() > 1, topo.nodes() > 1) {
        (true, false) => &profile.intra,
        (false, _) => &profile.inter,
        (true, true) => {
            if time(&profile.inter) >= time(&profile.intra) {
                &profile.inter
            } else {
                &profile.intra
            }
        }
    }
}

/// One round of the two-port ring, the slowest rank's: `both` bytes (a
/// block of each half) in two messages through one port where both
/// neighbours share a link class (alpha + o + both/beta), `half` bytes in
/// one message per class at a node boundary, where one neighbour is on each.
fn ring2_round(shape: &Shape, profile: &Profile, half: f64, both: f64) -> Cost {
    let topo = &shape.topology;
    let (nodes, local) = (topo.nodes(), topo.local_size());
    if nodes == 1 {
        return round_of(&profile.intra, 2, both);
    }
    if local == 1 {
        return round_of(&profile.inter, 2, both);
    }
    let boundary = slower(round(&profile.intra, half), round(&profile.inter, half));
    if local >= 3 {
        slower(boundary, round_of(&profile.intra, 2, both))
    } else {
        boundary
    }
}

/// The pipelined chain (broadcast and reduce): (N+S-2)·alpha +
/// ((N-2)·s + M)/beta, plus the same bytes times gamma for reduce (see the
/// module docs), with the inter-node surcharge of a multi-node group.
fn pipeline(shape: &Shape, profile: &Profile) -> Cost {
    let (n, count) = (shape.n, shape.count);
    let segs = segments(count, shape.elem_size);
    let s = block(count, segs, 0).1 as f64 * shape.elem_size as f64;
    let topo = &shape.topology;
    let (nodes, local) = (topo.nodes(), topo.local_size());
    let base = if local == 1 {
        &profile.inter
    } else {
        &profile.intra
    };
    let moved = (n - 2) as f64 * s + shape.bytes();
    let reduced = if shape.coll == Collective::Reduce {
        moved
    } else {
        0.0
    };
    // The round's larger segment is its message: the first segment (the
    // largest) in the N-2 rounds the chain fills in, each segment once.
    let pieces = (n - 2) as f64 * base.piece_of(s)
        + (0..segs)
            .map(|j| base.piece_of(block(count, segs, j).1 as f64 * shape.elem_size as f64))
            .sum::<f64>();
    let flat = Cost {
        latency: (n + segs - 2) as f64 * base.alpha,
        bandwidth: (moved + pieces) / base.beta,
        compute: reduced * profile.gamma,
    };
    if nodes == 1 || local == 1 {
        return flat;
    }
    // The chain's N-1 hops cross every node boundary but the one it leaves
    // out (root-1 -> root for broadcast, root -> root+1 for reduce, which
    // starts at root+1), X in all. The two ends of a crossing pay the
    // inter-node link in the S rounds it carries a segment; the critical path
    // spends those S rounds at one crossing and passes each other crossing
    // in one round: X + S - 1 rounds on the slower link (an estimate; with
    // two ranks per node, where every rank borders a crossing, it runs low).
    let head = if shape.coll == Collective::Reduce {
        shape.root + 1
    } else {
        shape.root
    };
    let crossings = nodes - usize::from(head % local == 0);
    let slow_rounds = (crossings + segs - 1).min(n + segs - 2) as f64;
    let (inter, intra) = (round(&profile.inter, s), round(&profile.intra, s));
    if inter.total() <= intra.total() {
        return flat;
    }
    flat + Cost {
        latency: slow_rounds * (inter.latency - intra.latency),
        bandwidth: slow_rounds * (inter.bandwidth - intra.bandwidth),
        compute: 0.0,
    }
}
