//! Recursive halving and doubling: Rabenseifner's allreduce and the
//! recursive-halving reduce-scatter.
//!
//! * allreduce (`hd`): a reduce-scatter by recursive halving (in round k
//!   every rank sends half of its current range to the partner at distance
//!   N/2^(k+1) and reduces the half it keeps with the partner's copy of it),
//!   then an allgather by recursive doubling that retraces the halving in
//!   reverse. 2 log2 N rounds on the critical path, each rank sends
//!   2(N-1)/N·M elements: the ring's bandwidth-optimal volume with a
//!   logarithmic instead of linear number of rounds, so it wins for medium
//!   and large buffers on groups where the ring's 2(N-1) latencies show.
//! * reduce-scatter (`halving`): the first half of the above on a buffer of N
//!   blocks of `count` elements. log2 N rounds, (N-1)/N of the input sent by
//!   each rank.
//!
//! # Groups that are not a power of two
//!
//! The seeds' pre/post step ([`PowerOfTwoCore`]): the r = N - N' extra ranks
//! (N' = 2^floor(log2 N)) first send their whole buffer to a partner that
//! folds it into its own, sit out the core, and receive their result from the
//! partner at the end: two rounds more on the critical path, and the partner
//! sends M (allreduce) or `count` (reduce-scatter) elements more.
//!
//! # Uneven counts
//!
//! The allreduce splits M into N' nearly equal blocks with [`block`]; core
//! rank v ends the halving with block v. When M < N' some blocks are empty;
//! both ends of an exchange compute the same range lengths, so zero-length
//! messages are skipped on both sides. The reduce-scatter's blocks are all
//! `count` long, but a core rank with an extra partner speaks for two of
//! them, so its ranges cover more of the buffer than the others' (the
//! pairing keeps every range contiguous, see
//! [`PowerOfTwoCore::first_block`]).

use super::butterfly::{PowerOfTwoCore, Role};
use super::{block, single_rank, Plan, PlanBuilder, PlanRequest, Span};

/// The half of the aligned range `[lo, lo + 2d)` of virtual ranks that
/// contains `v`, and the other half, each as `(first, end)`.
fn halves(v: usize, lo: usize, d: usize) -> ((usize, usize), (usize, usize)) {
    let lower = (lo, lo + d);
    let upper = (lo + d, lo + 2 * d);
    if v & d == 0 {
        (lower, upper)
    } else {
        (upper, lower)
    }
}

/// Rabenseifner's allreduce (recursive halving reduce-scatter, then
/// recursive doubling allgather).
///
/// The partial result is built straight in the output: a halving round sends
/// one half of the current range and receives-and-reduces into the other, so
/// sends and receives never touch the same elements and no scratch is
/// needed. Round 0 reads the input instead (the input and output are the same
/// memory in place; the halves are still disjoint), unless an extra partner
/// has already folded into the output.
pub(super) fn all_reduce(req: &PlanRequest) -> Plan {
    let (n, count) = (req.n, req.count);
    if n == 1 {
        return single_rank(count);
    }
    let mut p = PlanBuilder::default();
    if count == 0 {
        return p.finish();
    }
    let core = PowerOfTwoCore::new(n);
    let (vrank, partner) = match core.role(req.rank) {
        Role::Extra { partner } => {
            p.round().send(partner, Span::input(0, count));
            p.round().recv(partner, Span::output(0, count));
            return p.finish();
        }
        Role::Core { vrank, partner } => (vrank, partner),
    };
    let size = core.size;
    // Elements of blocks `first..end` of the N' blocks of the vector.
    let range = |(first, end): (usize, usize)| {
        let start = block(count, size, first).0;
        (start, block(count, size, end).0 - start)
    };
    // Where the partial result of a range lives: the input until round 0 has
    // run (or until the fold), the output afterwards.
    let mut from_input = true;
    let mut round = p.round();
    if let Some(extra) = partner {
        round.recv_reduce(extra, Span::output(0, count), Span::input(0, count));
        from_input = false;
        round = p.round();
    }
    // Reduce-scatter: halve the range of blocks held, largest distance first,
    // so that core rank v ends with block v.
    let mut lo = 0;
    for k in 0..core.levels() {
        let d = size >> (k + 1);
        let peer = core.real(vrank ^ d);
        let (keep, give) = halves(vrank, lo, d);
        let src = if from_input {
            Span::input
        } else {
            Span::output
        };
        let (give_off, give_len) = range(give);
        if give_len > 0 {
            round.send(peer, src(give_off, give_len));
        }
        let (keep_off, keep_len) = range(keep);
        if keep_len > 0 {
            round.recv_reduce(
                peer,
                Span::output(keep_off, keep_len),
                src(keep_off, keep_len),
            );
        }
        from_input = false;
        lo = keep.0;
        round = p.round();
    }
    // Allgather: the reverse, doubling the range held each round.
    for k in 0..core.levels() {
        let d = 1 << k;
        let peer_v = vrank ^ d;
        let mine = (vrank & !(d - 1), (vrank & !(d - 1)) + d);
        let theirs = (peer_v & !(d - 1), (peer_v & !(d - 1)) + d);
        let (send_off, send_len) = range(mine);
        if send_len > 0 {
            round.send(core.real(peer_v), Span::output(send_off, send_len));
        }
        let (recv_off, recv_len) = range(theirs);
        if recv_len > 0 {
            round.recv(core.real(peer_v), Span::output(recv_off, recv_len));
        }
        round = p.round();
    }
    if let Some(extra) = partner {
        round.send(extra, Span::output(0, count));
    }
    p.finish()
}

/// Recursive-halving reduce-scatter.
///
/// Core rank v's ranges are ranges of virtual ranks; the blocks they stand
/// for are those of the ranks the core ranks speak for
/// ([`PowerOfTwoCore::first_block`]), so after the last halving round rank v
/// holds, fully reduced, exactly its own block and its extra partner's.
/// Partial sums live in scratch; in the last round each block is a message of
/// its own, so that the rank's own block is reduced straight into the output
/// and the extra partner's into scratch, from where the post step sends it.
///
/// Scratch: the whole input (n·count) for a rank with an extra partner, which
/// folds into it; otherwise the range kept after round 0, about half of it.
pub(super) fn reduce_scatter(req: &PlanRequest) -> Plan {
    let (n, rank, c) = (req.n, req.rank, req.count);
    if n == 1 {
        return single_rank(c);
    }
    let mut p = PlanBuilder::default();
    if c == 0 {
        return p.finish();
    }
    let core = PowerOfTwoCore::new(n);
    let (vrank, partner) = match core.role(rank) {
        Role::Extra { partner } => {
            p.round().send(partner, Span::input(0, n * c));
            p.round().recv(partner, Span::output(0, c));
            return p.finish();
        }
        Role::Core { vrank, partner } => (vrank, partner),
    };
    let size = core.size;
    let levels = core.levels();
    // Input elements of the blocks that virtual ranks `first..end` speak for.
    let range = |(first, end): (usize, usize)| {
        let start = core.first_block(first) * c;
        (start, core.first_block(end) * c - start)
    };
    // Scratch holds input offsets `base..`: everything after a fold,
    // otherwise only what round 0 keeps (later rounds keep subranges of it).
    let base = if partner.is_some() {
        p.scratch(n * c);
        0
    } else {
        let (keep, _) = halves(vrank, 0, size / 2);
        let (keep_off, keep_len) = range(keep);
        if levels > 1 {
            p.scratch(keep_len);
        }
        keep_off
    };
    let acc = |offset: usize, len: usize| Span::scratch(offset - base, len);
    let mut from_input = true;
    let mut round = p.round();
    if let Some(extra) = partner {
        round.recv_reduce(extra, acc(0, n * c), Span::input(0, n * c));
        from_input = false;
        round = p.round();
    }
    let mut lo = 0;
    for k in 0..levels {
        let d = size >> (k + 1);
        let peer_v = vrank ^ d;
        let peer = core.real(peer_v);
        let (keep, give) = halves(vrank, lo, d);
        let src = |offset: usize, len: usize| {
            if from_input {
                Span::input(offset, len)
            } else {
                acc(offset, len)
            }
        };
        if k + 1 < levels {
            let (give_off, give_len) = range(give);
            round.send(peer, src(give_off, give_len));
            let (keep_off, keep_len) = range(keep);
            round.recv_reduce(peer, acc(keep_off, keep_len), src(keep_off, keep_len));
        } else {
            // Last round: one message per final block, in block order on
            // both sides, so each lands where its owner's result goes.
            for b in core.first_block(peer_v)..core.first_block(peer_v + 1) {
                round.send(peer, src(b * c, c));
            }
            for b in core.first_block(vrank)..core.first_block(vrank + 1) {
                let dst = if b == rank {
                    Span::output(0, c)
                } else {
                    acc(b * c, c)
                };
                round.recv_reduce(peer, dst, src(b * c, c));
            }
        }
        from_input = false;
        lo = keep.0;
        round = p.round();
    }
    if let Some(extra) = partner {
        round.send(extra, acc(extra * c, c));
    }
    p.finish()
}
