//! Direct (mesh) algorithms: one round in which a rank exchanges with every
//! peer at once. The fewest rounds possible, N-1 messages per rank; the
//! transport sees all of them in flight together. They win when the group is
//! small or the buffer is small enough that latency (rounds) dominates, and
//! on fabrics where every pair of ranks has its own link (NVLink switch,
//! shared memory): with N-1 messages in flight nothing waits for a neighbour
//! to forward anything.
//!
//! Costs below: M is the whole buffer (allreduce, broadcast) or c the per-rank
//! block (allgather, reduce-scatter, alltoall), in elements.
//!
//! * alltoall / alltoallv: rank r sends its block p to rank p. 1 round,
//!   (N-1)·c sent per rank. Sends are listed starting from r+1 and receives
//!   from r-1, so that at any moment the ranks are not all sending to the same
//!   peer.
//! * gather / scatter (`linear`): the root receives from (sends to) every rank.
//!   1 round; the root moves (N-1)·c.
//! * allgather: every rank sends its block to every peer. 1 round, (N-1)·c
//!   sent per rank.
//! * reduce-scatter: every rank sends block p of its input to rank p, which
//!   folds one arrival straight into its output and the other N-2 from
//!   scratch slots in a final local round. 1 communication round, (N-1)·c sent
//!   per rank, (N-2)·c of scratch.
//! * allreduce (mesh): direct reduce-scatter of 1/N blocks, then direct
//!   allgather of the reduced blocks. 2 rounds, 2(N-1)/N·M sent per rank (the
//!   ring's volume in 2 rounds instead of 2(N-1)), (N-2)/N·M of scratch; but
//!   every rank has 2(N-1) messages in flight, so it is for small N or small M.
//! * broadcast: the root sends the whole buffer to every rank. 1 round, the
//!   root sends (N-1)·M: only for tiny buffers or tiny groups.
//! * star allreduce (`star`, the parameter-server baseline): every rank sends
//!   its whole vector to rank 0, which reduces and sends the result back.
//!   2 rounds, rank 0 receives (N-1)·M and sends (N-1)·M, (N-2)·M of scratch;
//!   rank 0's port is the bottleneck, which is what the baseline shows.

use super::{
    block, offsets, single_rank, Collective, Plan, PlanBuilder, PlanRequest, RoundBuilder, Span,
};

/// Direct alltoall and alltoallv.
///
/// With uniform counts an empty exchange is skipped by every rank alike; with
/// per-peer counts zero-length messages are still sent, so that ranks whose
/// counts disagree get a length mismatch instead of waiting forever.
pub(super) fn all_to_all(req: &PlanRequest) -> Plan {
    let (n, r) = (req.n, req.rank);
    let (send_counts, recv_counts, always) = if req.collective == Collective::AllToAllV {
        (req.send_counts.clone(), req.recv_counts.clone(), true)
    } else {
        (vec![req.count; n], vec![req.count; n], false)
    };
    let (soff, roff) = (offsets(&send_counts), offsets(&recv_counts));
    let mut p = PlanBuilder::default();
    let mut round = p.round();
    for k in 1..n {
        let to = (r + k) % n;
        if always || send_counts[to] > 0 {
            round.send(to, Span::input(soff[to], send_counts[to]));
        }
    }
    for k in 1..n {
        let from = (r + n - k) % n;
        if always || recv_counts[from] > 0 {
            round.recv(from, Span::output(roff[from], recv_counts[from]));
        }
    }
    // The rank's own block, overlapped with the messages (listed after
    // them): no message reads or writes it.
    round.copy(
        Span::output(roff[r], recv_counts[r]),
        Span::input(soff[r], send_counts[r]),
    );
    p.finish()
}

/// Linear gather: every rank sends its block to the root.
pub(super) fn gather(req: &PlanRequest) -> Plan {
    let (n, r, c, root) = (req.n, req.rank, req.count, req.root);
    let mut p = PlanBuilder::default();
    if c == 0 {
        return p.finish();
    }
    let mut round = p.round();
    if r == root {
        for k in 1..n {
            let from = (r + k) % n;
            round.recv(from, Span::output(from * c, c));
        }
        // Overlapped with the receives: the root's own block.
        round.copy(Span::output(r * c, c), Span::input(0, c));
    } else {
        round.send(root, Span::input(0, c));
    }
    p.finish()
}

/// Linear scatter: the root sends block p to rank p.
pub(super) fn scatter(req: &PlanRequest) -> Plan {
    let (n, r, c, root) = (req.n, req.rank, req.count, req.root);
    let mut p = PlanBuilder::default();
    if c == 0 {
        return p.finish();
    }
    let mut round = p.round();
    if r == root {
        for k in 1..n {
            let to = (r + k) % n;
            round.send(to, Span::input(to * c, c));
        }
        // Overlapped with the sends: the root's own block.
        round.copy(Span::output(0, c), Span::input(r * c, c));
    } else {
        round.recv(root, Span::output(0, c));
    }
    p.finish()
}

/// Opens a round that receives `dst.len` elements from every peer and
/// reduces them into `dst`, starting from `local` (this rank's own
/// contribution, which is exactly `dst` in place, or disjoint from it).
///
/// The first peer's message is folded on arrival (`dst = local op
/// incoming`); the other N-2 land in distinct scratch slots, because two
/// receives of one round may not accumulate into the same memory. `extra`
/// adds the caller's sends to the round first. Returns the slots, which the
/// caller folds into `dst` with local ops at the start of the next round,
/// before anything reads `dst`.
fn reduce_from_peers(
    p: &mut PlanBuilder,
    req: &PlanRequest,
    dst: Span,
    local: Span,
    extra: impl FnOnce(&mut RoundBuilder<'_>),
) -> Vec<Span> {
    let (n, r, len) = (req.n, req.rank, dst.len);
    let mut round = p.round();
    extra(&mut round);
    let mut slots = Vec::new();
    if len > 0 {
        for k in 1..n {
            let from = (r + n - k) % n;
            if k == 1 {
                round.recv_reduce(from, dst, local);
            } else {
                let slot = Span::scratch((k - 2) * len, len);
                round.recv(from, slot);
                slots.push(slot);
            }
        }
    }
    p.scratch(slots.len() * len);
    slots
}

/// Direct (mesh) allreduce: direct reduce-scatter, then direct allgather.
///
/// Round 1: rank r sends input block p to rank p and reduces block r from
/// every peer. Round 2: it folds the scratch slots into output block r and
/// sends that block to every peer, receiving every other reduced block. An
/// empty block is skipped by both sides alike (everyone knows its length).
pub(super) fn all_reduce(req: &PlanRequest) -> Plan {
    let (n, r, count) = (req.n, req.rank, req.count);
    if n == 1 {
        return single_rank(count);
    }
    let mut p = PlanBuilder::default();
    if count == 0 {
        return p.finish();
    }
    let blk = |b: usize| block(count, n, b);
    let (mo, ml) = blk(r);
    let mine = Span::output(mo, ml);
    // In place the output block r is input block r, so the first fold
    // accumulates in place; the sends read only the other input blocks, which
    // nothing writes until round 2, after they have gone.
    let slots = reduce_from_peers(&mut p, req, mine, Span::input(mo, ml), |round| {
        for k in 1..n {
            let to = (r + k) % n;
            let (o, l) = blk(to);
            if l > 0 {
                round.send(to, Span::input(o, l));
            }
        }
    });
    let mut round = p.round();
    for slot in slots {
        round.reduce(mine, mine, slot);
    }
    if ml > 0 {
        for k in 1..n {
            round.send((r + k) % n, mine);
        }
    }
    for k in 1..n {
        let from = (r + n - k) % n;
        let (o, l) = blk(from);
        if l > 0 {
            round.recv(from, Span::output(o, l));
        }
    }
    p.finish()
}

/// Direct allgather: one round, own block to every peer, every block in.
pub(super) fn all_gather(req: &PlanRequest) -> Plan {
    let (n, r, c) = (req.n, req.rank, req.count);
    if n == 1 || c == 0 {
        return single_rank(c);
    }
    let mut p = PlanBuilder::default();
    let mut round = p.round();
    for k in 1..n {
        round.send((r + k) % n, Span::input(0, c));
    }
    for k in 1..n {
        let from = (r + n - k) % n;
        round.recv(from, Span::output(from * c, c));
    }
    // Own block, overlapped with the messages (listed after them): in place
    // the input is output block r, so it is a no-op, and the sends read
    // memory that no receive writes.
    round.copy(Span::output(r * c, c), Span::input(0, c));
    p.finish()
}

/// Direct reduce-scatter: one communication round, then a local fold.
///
/// All N-1 contributions to block r arrive in the same round (the fewest
/// rounds, which is the point of `direct`); one is folded on arrival into the
/// output, the others wait in scratch and are folded by a local round. A
/// chain of N-1 accumulating rounds would need no scratch but is `pairwise`.
pub(super) fn reduce_scatter(req: &PlanRequest) -> Plan {
    let (n, r, c) = (req.n, req.rank, req.count);
    if n == 1 || c == 0 {
        return single_rank(c);
    }
    let mut p = PlanBuilder::default();
    let out = Span::output(0, c);
    // In place the output is input block r: the first fold accumulates in
    // place, and the sends read the other blocks.
    let slots = reduce_from_peers(&mut p, req, out, Span::input(r * c, c), |round| {
        for k in 1..n {
            let to = (r + k) % n;
            round.send(to, Span::input(to * c, c));
        }
    });
    let mut round = p.round();
    for slot in slots {
        round.reduce(out, out, slot);
    }
    p.finish()
}

/// Direct broadcast: the root sends the whole buffer to every rank at once.
pub(super) fn broadcast(req: &PlanRequest) -> Plan {
    let (n, r, count, root) = (req.n, req.rank, req.count, req.root);
    if n == 1 {
        return single_rank(count);
    }
    let mut p = PlanBuilder::default();
    if count == 0 {
        return p.finish();
    }
    let mut round = p.round();
    if r == root {
        for k in 1..n {
            round.send((r + k) % n, Span::input(0, count));
        }
        // Overlapped: runs while the peers receive.
        round.copy(Span::output(0, count), Span::input(0, count));
    } else {
        round.recv(root, Span::output(0, count));
    }
    p.finish()
}

/// Star allreduce: everyone sends to rank 0, which reduces and sends back.
///
/// Rank 0 folds the first arrival into its output on the fly and the other
/// N-2 from scratch slots at the start of round 2, then sends the result to
/// every rank in that same round.
pub(super) fn star_all_reduce(req: &PlanRequest) -> Plan {
    let (n, r, count) = (req.n, req.rank, req.count);
    if n == 1 {
        return single_rank(count);
    }
    let mut p = PlanBuilder::default();
    if count == 0 {
        return p.finish();
    }
    let (input, out) = (Span::input(0, count), Span::output(0, count));
    if r == 0 {
        // In place the first fold accumulates into the input's own memory.
        let slots = reduce_from_peers(&mut p, req, out, input, |_| {});
        let mut round = p.round();
        for slot in slots {
            round.reduce(out, out, slot);
        }
        for peer in 1..n {
            round.send(peer, out);
        }
    } else {
        // In place the receive overwrites the input, which went in round 1.
        p.round().send(0, input);
        p.round().recv(0, out);
    }
    p.finish()
}
