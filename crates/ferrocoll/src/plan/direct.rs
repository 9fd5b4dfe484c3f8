//! Direct (mesh) algorithms: one round in which a rank exchanges with every
//! peer at once. The fewest rounds possible, N-1 messages per rank; the
//! transport sees all of them in flight together.
//!
//! * alltoall / alltoallv: rank r sends its block p to rank p. Sends are
//!   listed starting from r+1 and receives from r-1, so that at any moment the
//!   ranks are not all sending to the same peer.
//! * gather / scatter (`linear`): the root receives from (sends to) every rank.

use super::{Collective, Plan, PlanBuilder, PlanRequest, Span};

/// Exclusive prefix sums: where each peer's block starts.
fn offsets(counts: &[usize]) -> Vec<usize> {
    counts
        .iter()
        .scan(0, |acc, &c| {
            let start = *acc;
            *acc += c;
            Some(start)
        })
        .collect()
}

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
    round.copy(
        Span::output(roff[r], recv_counts[r]),
        Span::input(soff[r], send_counts[r]),
    );
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
        round.copy(Span::output(r * c, c), Span::input(0, c));
        for k in 1..n {
            let from = (r + k) % n;
            round.recv(from, Span::output(from * c, c));
        }
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
        round.copy(Span::output(0, c), Span::input(r * c, c));
        for k in 1..n {
            let to = (r + k) % n;
            round.send(to, Span::input(to * c, c));
        }
    } else {
        round.recv(root, Span::output(0, c));
    }
    p.finish()
}
