//! Ring algorithms: every rank talks only to its two neighbours.
//!
//! * allreduce = reduce-scatter + allgather around the ring: 2(N-1) steps,
//!   each rank sends 2(N-1)/N of the buffer (bandwidth-optimal, latency
//!   linear in N). Blocks are nearly equal when N does not divide the count.
//! * allgather, reduce-scatter: N-1 steps, (N-1)/N of the whole buffer each.
//! * broadcast, reduce: a pipelined chain along the ring (as NCCL's ring
//!   broadcast/reduce): the buffer is cut into segments that flow
//!   root -> root+1 -> ... one hop per round, so N-2+S rounds move S segments.

use super::{block, Plan, PlanBuilder, PlanRequest, Span};

/// Target segment size for the pipelined chain. Small enough that the chain
/// fills quickly, large enough that a round's fixed cost stays small.
const SEGMENT_BYTES: usize = 256 * 1024;
/// Upper bound on segments, which bounds the number of rounds.
const MAX_SEGMENTS: usize = 64;

fn neighbours(req: &PlanRequest) -> (usize, usize) {
    let n = req.n;
    ((req.rank + 1) % n, (req.rank + n - 1) % n)
}

/// Copies the input to the output: the whole collective for N = 1.
fn single_rank(len: usize) -> Plan {
    let mut p = PlanBuilder::default();
    p.round().copy(Span::output(0, len), Span::input(0, len));
    p.finish()
}

/// Ring allreduce (reduce-scatter then allgather).
pub(super) fn all_reduce(req: &PlanRequest) -> Plan {
    let (n, r, count) = (req.n, req.rank, req.count);
    if n == 1 {
        return single_rank(count);
    }
    let (right, left) = neighbours(req);
    let blk = |b: usize| block(count, n, b % n);
    let mut p = PlanBuilder::default();
    // Reduce-scatter: in step s, send block r-s and fold block r-s-1 from the
    // left into the output. Step 0 sends straight from the input, so no copy
    // of the input is ever made; each block is folded exactly once.
    for s in 0..n - 1 {
        let send_b = (r + n - s) % n;
        let recv_b = (r + 2 * n - s - 1) % n;
        let (so, sl) = blk(send_b);
        let (ro, rl) = blk(recv_b);
        let mut round = p.round();
        if sl > 0 {
            let src = if s == 0 {
                Span::input(so, sl)
            } else {
                Span::output(so, sl)
            };
            round.send(right, src);
        }
        if rl > 0 {
            round.recv_reduce(left, Span::output(ro, rl), Span::input(ro, rl));
        }
    }
    // Rank r now holds the reduced block r+1. Allgather: pass blocks on.
    for s in 0..n - 1 {
        let (so, sl) = blk(r + 1 + n - s);
        let (ro, rl) = blk(r + n - s);
        let mut round = p.round();
        if sl > 0 {
            round.send(right, Span::output(so, sl));
        }
        if rl > 0 {
            round.recv(left, Span::output(ro, rl));
        }
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
            // Local ops run before the round's messages; in place this copy
            // is a no-op (the input is the rank's block of the output).
            round.copy(Span::output(r * c, c), Span::input(0, c));
            round.send(right, Span::input(0, c));
        } else {
            round.send(right, Span::output(send_b * c, c));
        }
        round.recv(left, Span::output(recv_b * c, c));
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

/// Number of pipeline segments for a chain of `count` elements.
fn segments(req: &PlanRequest) -> usize {
    let bytes = req.count * req.elem_size.max(1);
    bytes
        .div_ceil(SEGMENT_BYTES)
        .clamp(1, MAX_SEGMENTS)
        .min(req.count.max(1))
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
