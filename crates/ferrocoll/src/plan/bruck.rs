//! Bruck's algorithms (Bruck, Ho, Kipnis, Upfal, Weathersby 1997): allgather
//! and alltoall in ceil(log2 N) rounds for any N, not only powers of two.
//!
//! Both work in *rotated* block order: rank r calls block i the one of rank
//! (r+i) mod N (allgather) or for rank (r+i) mod N (alltoall), so that every
//! rank runs the same index arithmetic, and a local rotation at the end puts
//! the blocks in rank order. c is the per-rank block in elements.
//!
//! * allgather: in round k (distance d = 2^k) rank r sends the first
//!   min(d, N-d) blocks it has gathered to r-d and receives as many from
//!   r+d, appending them. ceil(log2 N) rounds, (N-1)·c sent per rank (the
//!   optimum), N·c of scratch (none on rank 0, whose rotation is the
//!   identity). Wins over the ring (N-1 rounds) when latency dominates: small
//!   blocks or many ranks; unlike recursive doubling it needs no power of two.
//! * alltoall: in round k rank r sends every block whose index has bit k set
//!   to r+d, in one message packed by local copies, and receives the same
//!   indices from r-d. A block moves once per set bit of its index, so each
//!   round sends about N/2 blocks: ceil(log2 N) rounds but about
//!   (N/2)·log2 N·c sent per rank instead of the direct (N-1)·c. It wins for
//!   small blocks and large N, where N-1 message start-ups cost more than the
//!   extra volume. Scratch: two packed buffers of the largest round.

use super::{single_rank, Plan, PlanBuilder, PlanRequest, Span};

/// Bruck allgather.
///
/// The gathered blocks live in rotated order in a working buffer: block i
/// holds rank (r+i) mod N's data. Rank 0's rotated order is rank order, so it
/// works straight in its output; the others use scratch and rotate at the end
/// with two copies.
pub(super) fn all_gather(req: &PlanRequest) -> Plan {
    let (n, r, c) = (req.n, req.rank, req.count);
    if n == 1 || c == 0 {
        return single_rank(c);
    }
    let work = |block: usize, blocks: usize| {
        if r == 0 {
            Span::output(block * c, blocks * c)
        } else {
            Span::scratch(block * c, blocks * c)
        }
    };
    let mut p = PlanBuilder::default();
    if r != 0 {
        p.scratch(n * c);
    }
    let mut d = 1;
    while d < n {
        let m = d.min(n - d);
        let mut round = p.round();
        // Blocks 0..m go out while blocks d..d+m come in: disjoint, as m <= d.
        if d == 1 {
            // Block 0 is the rank's own: sent from the input, its copy into
            // the working buffer overlapped with the messages (listed after
            // them; for rank 0 in place a no-op, its input being output
            // block 0), so the send neither waits for the copy nor has the
            // peer read lines just written.
            round.send((r + n - d) % n, Span::input(0, c));
            round.recv((r + d) % n, work(d, m));
            round.copy(work(0, 1), Span::input(0, c));
        } else {
            round.send((r + n - d) % n, work(0, m));
            round.recv((r + d) % n, work(d, m));
        }
        d *= 2;
    }
    if r != 0 {
        // Rotated block i is rank (r+i) mod N's: blocks 0..N-r are ranks
        // r..N, the rest wrap to 0..r. In place this overwrites the input
        // (output block r), which was last read in the first round.
        let head = (n - r) * c;
        p.round()
            .copy(Span::output(r * c, head), Span::scratch(0, head))
            .copy(Span::output(0, r * c), Span::scratch(head, r * c));
    }
    p.finish()
}

/// Where a block of the alltoall currently is.
#[derive(Clone, Copy)]
enum Loc {
    /// Not moved yet: still in the input.
    Input,
    /// In slot j of the receive buffer (arrived last round).
    Received(usize),
    /// Parked in its final output slot (it has more hops to make).
    Output,
}

/// Bruck alltoall.
///
/// Rotated index i at rank r is the block headed (r+i) mod N away; after the
/// rounds of all set bits of i it has travelled i ranks, so at the end index
/// i at rank r is the block from rank (r-i) mod N, which goes to output block
/// (r-i) mod N.
///
/// The textbook version rotates the whole input into scratch first, unpacks
/// every received block back into it and rotates again at the end: about
/// 2N + log2 N·N local block copies. Here each block is found where it is
/// instead: packed straight from the input for its first hop, and after a
/// hop either packed again from the receive buffer (if its next bit is set)
/// or copied into its output slot, which no other block uses; it waits there
/// for any later hop and otherwise is already final. That is one copy per
/// hop plus one, and scratch is only the send and receive buffers.
pub(super) fn all_to_all(req: &PlanRequest) -> Plan {
    let (n, r, c) = (req.n, req.rank, req.count);
    if n == 1 || c == 0 {
        return single_rank(n * c);
    }
    // Output slot of rotated index i, and its source block in the input.
    let out = |i: usize| Span::output((r + n - i) % n * c, c);
    let input = |i: usize| Span::input((r + i) % n * c, c);
    // The largest round: the most indices in 1..N sharing one bit.
    let mut widest = 0;
    let mut d = 1;
    while d < n {
        widest = widest.max((1..n).filter(|i| i & d != 0).count());
        d *= 2;
    }
    let (send_base, recv_base) = (0, widest * c);
    let mut p = PlanBuilder::default();
    p.scratch(2 * widest * c);
    let mut loc = vec![Loc::Input; n];
    let mut d = 1;
    while d < n {
        let mut round = p.round();
        if d == 1 {
            // Index 0 is this rank's block for itself: it never moves.
            round.copy(out(0), input(0));
        }
        // Blocks that arrived last round and do not hop now leave the
        // receive buffer before this round's receive overwrites it.
        for (i, l) in loc.iter_mut().enumerate() {
            if let (Loc::Received(j), false) = (*l, i & d != 0) {
                round.copy(out(i), Span::scratch(recv_base + j * c, c));
                *l = Loc::Output;
            }
        }
        // Pack the hopping blocks in index order; the receiver unpacks the
        // same indices in the same order.
        let mut m = 0;
        for i in (1..n).filter(|i| i & d != 0) {
            let src = match loc[i] {
                Loc::Input => input(i),
                Loc::Received(j) => Span::scratch(recv_base + j * c, c),
                Loc::Output => out(i),
            };
            round.copy(Span::scratch(send_base + m * c, c), src);
            loc[i] = Loc::Received(m);
            m += 1;
        }
        round.send((r + d) % n, Span::scratch(send_base, m * c));
        round.recv((r + n - d) % n, Span::scratch(recv_base, m * c));
        d *= 2;
    }
    // The last round's arrivals are final.
    let mut round = p.round();
    for (i, l) in loc.iter().enumerate() {
        if let Loc::Received(j) = *l {
            round.copy(out(i), Span::scratch(recv_base + j * c, c));
        }
    }
    p.finish()
}
