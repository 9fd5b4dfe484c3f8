//! Pairwise exchange: N-1 steps; in step k rank i sends to (i+k) mod N and
//! receives from (i-k) mod N, one peer each way per step.
//!
//! Every rank talks to a different peer in every step, so each step is a
//! permutation of the ranks: no rank receives from two peers at once (no
//! incast), which is why it is the classic large-message alltoall (MPICH's
//! pairwise exchange, seed 004) and keeps per-step memory small.
//! c is the per-rank block in elements.
//!
//! * reduce-scatter: in step k rank i sends its input block (i+k) mod N to
//!   that block's owner and folds the block i arriving from (i-k) mod N into
//!   its output. N-1 rounds, (N-1)·c sent per rank (the optimum), no scratch:
//!   one arrival per step accumulates in place. The ring moves the same volume
//!   in the same number of steps but forwards partial sums; here every block
//!   goes straight to its owner, so a slow rank delays only its own peers.
//! * alltoall / alltoallv: step k sends the block for (i+k) mod N and receives
//!   the one from (i-k) mod N. N-1 rounds, (N-1)·c sent per rank (alltoallv:
//!   the rank's send counts). Versus `direct`'s single round it trades
//!   latency (N-1 rounds) for only one message in flight per direction, which
//!   wins for large blocks and large N. Alltoallv sends zero-length messages
//!   too, so ranks whose counts disagree get a length mismatch instead of a
//!   hang.

use super::{offsets, Collective, Plan, PlanBuilder, PlanRequest, Span};

/// Pairwise reduce-scatter, accumulating into the output one step at a time.
pub(super) fn reduce_scatter(req: &PlanRequest) -> Plan {
    let (n, r, c) = (req.n, req.rank, req.count);
    let mut p = PlanBuilder::default();
    if n == 1 {
        p.round().copy(Span::output(0, c), Span::input(0, c));
        return p.finish();
    }
    if c == 0 {
        return p.finish();
    }
    let out = Span::output(0, c);
    for k in 1..n {
        let to = (r + k) % n;
        let from = (r + n - k) % n;
        // The first arrival combines with this rank's own block r (in place
        // that is the output itself, so it accumulates); later ones fold into
        // the running result. The send reads block `to` != r, which no
        // receive writes.
        let local = if k == 1 { Span::input(r * c, c) } else { out };
        p.round()
            .send(to, Span::input(to * c, c))
            .recv_reduce(from, out, local);
    }
    p.finish()
}

/// Pairwise alltoall and alltoallv.
///
/// Uniform counts: an empty exchange (count 0) is skipped by every rank
/// alike. Per-peer counts: every step sends and receives even zero-length
/// messages, so that the steps stay the (i, i+k) pairs and mismatched counts
/// are detected.
pub(super) fn all_to_all(req: &PlanRequest) -> Plan {
    let (n, r) = (req.n, req.rank);
    let (send_counts, recv_counts) = if req.collective == Collective::AllToAllV {
        (req.send_counts.clone(), req.recv_counts.clone())
    } else {
        (vec![req.count; n], vec![req.count; n])
    };
    let (soff, roff) = (offsets(&send_counts), offsets(&recv_counts));
    let mut p = PlanBuilder::default();
    // The block for itself is a local copy, done with the first step.
    let own = (
        Span::output(roff[r], recv_counts[r]),
        Span::input(soff[r], send_counts[r]),
    );
    if req.collective == Collective::AllToAll && req.count == 0 {
        return p.finish();
    }
    if n == 1 {
        p.round().copy(own.0, own.1);
        return p.finish();
    }
    for k in 1..n {
        let to = (r + k) % n;
        let from = (r + n - k) % n;
        let mut round = p.round();
        if k == 1 {
            round.copy(own.0, own.1);
        }
        round
            .send(to, Span::input(soff[to], send_counts[to]))
            .recv(from, Span::output(roff[from], recv_counts[from]));
    }
    p.finish()
}
