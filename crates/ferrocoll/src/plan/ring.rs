//! Ring algorithms: every rank talks only to its two neighbours.
//!
//! * allreduce = reduce-scatter + allgather around the ring: 2(N-1) steps,
//!   each rank sends 2(N-1)/N of the buffer (bandwidth-optimal, latency
//!   linear in N). Blocks are nearly equal when N does not divide the count.
//! * two-port ring allreduce (`ring2`, the seeds' "2-port ring"): the first
//!   half of the buffer (ceil(M/2) elements) runs the ring allreduce
//!   clockwise (send to r+1), the second half (floor(M/2)) counter-clockwise
//!   (send to r-1), in the same 2(N-1) rounds. Each round every rank sends one
//!   message to each neighbour and receives one from each, so both
//!   directions of every link (two DMA engines / a full-duplex link) carry
//!   data at once. Cost: 2(N-1) rounds on the critical path, like the ring;
//!   each rank still sends 2(N-1)/N·M elements in total, but half of them
//!   each way, so each port moves (N-1)/N·M: the bandwidth term halves when
//!   the two directions do not share bandwidth. It wins over `ring` for
//!   large buffers on full-duplex links; it has the same latency term, so
//!   it never wins for small ones (it also doubles the message count). Each
//!   half is split into N nearly equal blocks on its own, so any count works;
//!   blocks of zero elements (count < 2N) are skipped by both ends.
//!   (Seed 002 quotes 2·ceil(N/2) steps and M/beta for its 2-port ring,
//!   which halves the step count; this plan instead keeps the ring's 2(N-1)
//!   rounds, each moving M/(2N) per direction, so its bandwidth term is
//!   (N-1)/N·M/beta per port.)
//! * allgather, reduce-scatter: N-1 steps, (N-1)/N of the whole buffer each.
//! * broadcast, reduce: a pipelined chain along the ring (as NCCL's ring
//!   broadcast/reduce): the buffer is cut into segments that flow
//!   root -> root+1 -> ... one hop per round, so N-2+S rounds move S segments.

use super::{block, single_rank, Plan, PlanBuilder, PlanRequest, RoundBuilder, Span};

/// Target segment size for the pipelined chain. Small enough that the chain
/// fills quickly, large enough that a round's fixed cost stays small.
const SEGMENT_BYTES: usize = 256 * 1024;
/// Upper bound on segments, which bounds the number of rounds.
const MAX_SEGMENTS: usize = 64;

/// (right, left): the ranks after and before this one on the ring.
fn neighbours(req: &PlanRequest) -> (usize, usize) {
    let n = req.n;
    ((req.rank + 1) % n, (req.rank + n - 1) % n)
}

/// One direction of the ring allreduce over one sub-range of the buffer:
/// the ranks, taken in the direction of travel, form a ring of positions,
/// and the sub-range is split into N nearly equal blocks.
#[derive(Clone, Copy, Debug)]
struct RingPass {
    /// Group size.
    n: usize,
    /// This rank's position along the direction of travel.
    pos: usize,
    /// The rank this pass sends to (position `pos + 1`).
    next: usize,
    /// The rank this pass receives from (position `pos - 1`).
    prev: usize,
    /// First element of the sub-range.
    base: usize,
    /// Elements in the sub-range.
    len: usize,
}

impl RingPass {
    /// The pass that sends to rank + 1 over elements `base..base + len`.
    fn clockwise(req: &PlanRequest, base: usize, len: usize) -> RingPass {
        let (right, left) = neighbours(req);
        RingPass {
            n: req.n,
            pos: req.rank,
            next: right,
            prev: left,
            base,
            len,
        }
    }

    /// The pass that sends to rank - 1 over elements `base..base + len`.
    /// Position p is rank -p (mod N), so position p + 1 is rank - 1.
    fn counter_clockwise(req: &PlanRequest, base: usize, len: usize) -> RingPass {
        let (right, left) = neighbours(req);
        RingPass {
            n: req.n,
            pos: (req.n - req.rank) % req.n,
            next: left,
            prev: right,
            base,
            len,
        }
    }

    /// Number of steps (rounds) of the pass: reduce-scatter then allgather.
    fn steps(&self) -> usize {
        2 * (self.n - 1)
    }

    /// Start (in the whole buffer) and length of block `b` (mod N).
    fn blk(&self, b: usize) -> (usize, usize) {
        let (o, l) = block(self.len, self.n, b % self.n);
        (self.base + o, l)
    }

    /// Adds step `s` (`0..self.steps()`) of this pass to `round`: only
    /// communication ops, so two passes can share a round.
    fn step(&self, s: usize, round: &mut RoundBuilder<'_>) {
        let (n, r) = (self.n, self.pos);
        if s < n - 1 {
            // Reduce-scatter: in step s, send block r-s and fold block
            // r-s-1 from the previous position into the output. Step 0 sends
            // straight from the input, so no copy of the input is ever made;
            // each block is folded exactly once.
            let (so, sl) = self.blk(r + n - s);
            let (ro, rl) = self.blk(r + 2 * n - s - 1);
            if sl > 0 {
                let src = if s == 0 {
                    Span::input(so, sl)
                } else {
                    Span::output(so, sl)
                };
                round.send(self.next, src);
            }
            if rl > 0 {
                round.recv_reduce(self.prev, Span::output(ro, rl), Span::input(ro, rl));
            }
        } else {
            // Position r now holds the reduced block r+1. Allgather: pass
            // blocks on.
            let s = s - (n - 1);
            let (so, sl) = self.blk(r + 1 + n - s);
            let (ro, rl) = self.blk(r + n - s);
            if sl > 0 {
                round.send(self.next, Span::output(so, sl));
            }
            if rl > 0 {
                round.recv(self.prev, Span::output(ro, rl));
            }
        }
    }
}

/// Ring allreduce (reduce-scatter then allgather).
pub(super) fn all_reduce(req: &PlanRequest) -> Plan {
    if req.n == 1 {
        return single_rank(req.count);
    }
    let pass = RingPass::clockwise(req, 0, req.count);
    let mut p = PlanBuilder::default();
    for s in 0..pass.steps() {
        pass.step(s, &mut p.round());
    }
    p.finish()
}

/// Ring allgather: in step s, pass on block r-s and receive block r-s-1.
pub(super) fn all_gather(req: &PlanRequest) -> Plan {
    let (n, r, c) = (req.n, req.rank, req.count);
    if n == 1 || c == 0 {
        return single_rank(c);
    }
    let (right, left) = neighbours(req);
    let mut p = PlanBuilder::default();
    for s in 0..n - 1 {
        let send_b = (r + n - s) % n;
        let recv_b = (r + 2 * n - s - 1) % n;
        let mut round = p.round();
        if s == 0 {
            round.send(right, Span::input(0, c));
        } else {
            round.send(right, Span::output(send_b * c, c));
        }
        round.recv(left, Span::output(recv_b * c, c));
        if s == 0 {
            // Overlapped with the first step's messages (listed after
            // them): the rank's own block, which no receive writes. In place
            // it is a no-op (the input is that block of the output).
            round.copy(Span::output(r * c, c), Span::input(0, c));
        }
    }
    p.finish()
}

/// Ring reduce-scatter: block b travels around the ring collecting every
/// rank's contribution and ends, fully reduced, at rank b.
pub(super) fn reduce_scatter(req: &PlanRequest) -> Plan {
    let (n, r, c) = (req.n, req.rank, req.count);
    if n == 1 || c == 0 {
        return single_rank(c);
    }
    let (right, left) = neighbours(req);
    let mut p = PlanBuilder::default();
    // Partial sums in flight alternate between two scratch slots: the one
    // received last step is sent while the next one arrives.
    let slot = |s: usize| Span::scratch((s % 2) * c, c);
    for s in 0..n - 1 {
        let send_b = (r + 2 * n - s - 1) % n;
        let recv_b = (r + 2 * n - s - 2) % n;
        let src = if s == 0 {
            Span::input(send_b * c, c)
        } else {
            slot(s - 1)
        };
        let dst = if s == n - 2 {
            Span::output(0, c) // recv_b == r: the rank's own, final block
        } else {
            slot(s)
        };
        p.round()
            .send(right, src)
            .recv_reduce(left, dst, Span::input(recv_b * c, c));
    }
    if n > 2 {
        p.scratch(2 * c);
    }
    p.finish()
}

/// Number of pipeline segments for a chain of `count` elements of
/// `elem_size` bytes (the cost model uses the same rule).
pub(crate) fn chain_segments(count: usize, elem_size: usize) -> usize {
    (count * elem_size.max(1))
        .div_ceil(SEGMENT_BYTES)
        .clamp(1, MAX_SEGMENTS)
        .min(count.max(1))
}

/// Number of pipeline segments for the request's chain.
fn segments(req: &PlanRequest) -> usize {
    chain_segments(req.count, req.elem_size)
}

/// Pipelined chain broadcast: position p = rank - root (mod N) receives
/// segment k in round p-1+k and forwards it in round p+k.
pub(super) fn broadcast(req: &PlanRequest) -> Plan {
    let (n, count) = (req.n, req.count);
    if n == 1 || count == 0 {
        return single_rank(count);
    }
    let (right, left) = neighbours(req);
    let pos = (req.rank + n - req.root) % n;
    let segs = segments(req);
    let seg = |k: usize| block(count, segs, k);
    let mut p = PlanBuilder::default();
    if pos == 0 {
        p.round()
            .copy(Span::output(0, count), Span::input(0, count));
    }
    for t in 0..segs + n - 2 {
        let mut round = p.round();
        if pos > 0 && t + 1 >= pos && t + 1 - pos < segs {
            let (o, l) = seg(t + 1 - pos);
            round.recv(left, Span::output(o, l));
        }
        if pos < n - 1 && t >= pos && t - pos < segs {
            let (o, l) = seg(t - pos);
            let src = if pos == 0 {
                Span::input(o, l)
            } else {
                Span::output(o, l)
            };
            round.send(right, src);
        }
    }
    p.finish()
}

/// Pipelined chain reduce: the chain starts at root+1 and ends at the root;
/// each rank folds its input into the partial result passing through.
pub(super) fn reduce(req: &PlanRequest) -> Plan {
    let (n, count) = (req.n, req.count);
    let is_root = req.rank == req.root;
    if n == 1 || count == 0 {
        return single_rank(if is_root { count } else { 0 });
    }
    let (right, left) = neighbours(req);
    let pos = (req.rank + n - req.root - 1) % n; // root is at n-1
    let segs = segments(req);
    let seg = |k: usize| block(count, segs, k);
    // Where this rank accumulates: the root straight into its output, the
    // middle of the chain in scratch, the head not at all.
    let acc = |o: usize, l: usize| {
        if is_root {
            Span::output(o, l)
        } else {
            Span::scratch(o, l)
        }
    };
    let mut p = PlanBuilder::default();
    if pos > 0 && !is_root {
        p.scratch(count);
    }
    for t in 0..segs + n - 2 {
        let mut round = p.round();
        if pos > 0 && t + 1 >= pos && t + 1 - pos < segs {
            let (o, l) = seg(t + 1 - pos);
            round.recv_reduce(left, acc(o, l), Span::input(o, l));
        }
        if pos < n - 1 && t >= pos && t - pos < segs {
            let (o, l) = seg(t - pos);
            let src = if pos == 0 {
                Span::input(o, l)
            } else {
                acc(o, l)
            };
            round.send(right, src);
        }
    }
    p.finish()
}

/// Two-port ring allreduce: the first half of the buffer goes clockwise,
/// the second counter-clockwise, one step of each per round.
///
/// Both passes emit their ops in the same order on every rank (clockwise
/// first), so for N = 2, where both neighbours are the same rank and two
/// messages travel each way per round, FIFO matching still pairs each
/// message with the receive of its own pass.
pub(super) fn all_reduce_bidirectional(req: &PlanRequest) -> Plan {
    let count = req.count;
    if req.n == 1 {
        return single_rank(count);
    }
    // The halves are disjoint, so the two passes never touch the same
    // memory and their ops may share every round.
    let (_, first) = block(count, 2, 0);
    let cw = RingPass::clockwise(req, 0, first);
    let ccw = RingPass::counter_clockwise(req, first, count - first);
    let mut p = PlanBuilder::default();
    for s in 0..cw.steps() {
        let mut round = p.round();
        cw.step(s, &mut round);
        ccw.step(s, &mut round);
    }
    p.finish()
}
