//! Checks on plans: one rank's plan on its own ([`validate`]), and the plans
//! of all ranks together ([`match_messages`]: every send meets its receive,
//! lengths agree, and nothing deadlocks under the executor's round
//! semantics).
//!
//! The executor trusts validated plans to keep memory accesses disjoint, so
//! every algorithm is run through both checks for many group sizes in the
//! tests, and `validate` also runs in debug builds before every execution.

use std::collections::{HashMap, HashSet};

use super::pairing::{Matcher, MessageTable};
use super::{Buf, Collective, Op, Plan, PlanRequest, Span};

/// How the caller's buffers overlap.
///
/// Out of place, input and output are separate. In place they share memory:
/// input element `i` is at `input_base + i` and output element `j` at
/// `output_base + j` of one region (for an in-place allgather the input is the
/// rank's own block of the output; for an in-place reduce-scatter the output is
/// the rank's block of the input).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Whether input and output share memory.
    pub in_place: bool,
    /// Where input element 0 lies in the shared region.
    pub input_base: usize,
    /// Where output element 0 lies in the shared region.
    pub output_base: usize,
}

impl Layout {
    /// Separate input and output buffers.
    pub const OUT_OF_PLACE: Layout = Layout {
        in_place: false,
        input_base: 0,
        output_base: 0,
    };

    /// The in-place layout of `req`'s collective, as NCCL defines it, or
    /// `None` if the collective has no in-place form.
    pub fn in_place(req: &PlanRequest) -> Option<Layout> {
        let (input_base, output_base) = match req.collective {
            Collective::AllReduce | Collective::Broadcast | Collective::Reduce => (0, 0),
            Collective::AllGather => (req.rank * req.count, 0),
            Collective::ReduceScatter => (0, req.rank * req.count),
            _ => return None,
        };
        Some(Layout {
            in_place: true,
            input_base,
            output_base,
        })
    }

    /// (memory region, first element) of a span: region 0 is the output (and
    /// the input when in place), 1 the separate input, 2 scratch.
    fn locate(&self, span: &Span) -> (u8, usize) {
        match (span.buf, self.in_place) {
            (Buf::Scratch, _) => (2, span.offset),
            (Buf::Output, true) => (0, self.output_base + span.offset),
            (Buf::Input, true) => (0, self.input_base + span.offset),
            (Buf::Output, false) => (0, span.offset),
            (Buf::Input, false) => (1, span.offset),
        }
    }

    fn overlaps(&self, a: &Span, b: &Span) -> bool {
        let (ra, sa) = self.locate(a);
        let (rb, sb) = self.locate(b);
        ra == rb && a.len > 0 && b.len > 0 && sa < sb + b.len && sb < sa + a.len
    }

    fn same(&self, a: &Span, b: &Span) -> bool {
        self.locate(a) == self.locate(b) && a.len == b.len
    }
}

/// Checks one rank's plan: spans in bounds, peers valid, operand lengths
/// equal, no two in-flight ops of a round touching the same memory unsafely,
/// the input never written, and (in place) the input never read after its
/// memory was overwritten. Returns a description of the first problem.
pub fn validate(plan: &Plan, req: &PlanRequest, layout: Layout) -> Result<(), String> {
    let limits = [
        (Buf::Input, req.input_len()),
        (Buf::Output, req.output_len()),
        (Buf::Scratch, plan.scratch),
    ];
    let in_bounds = |s: &Span| {
        let limit = limits.iter().find(|(b, _)| *b == s.buf).map_or(0, |l| l.1);
        s.end() <= limit
    };
    let mut written: Vec<Span> = Vec::new();
    for (ri, round) in plan.rounds.iter().enumerate() {
        let at = |what: &str| format!("round {ri}: {what}");
        let mut comm_reads: Vec<(usize, Span)> = Vec::new();
        let mut comm_writes: Vec<(usize, Span)> = Vec::new();
        // Local ops after the round's messages run while those are in
        // flight (`overlapped`); a message may not follow one.
        let mut overlapped_reads: Vec<Span> = Vec::new();
        let mut overlapped_writes: Vec<Span> = Vec::new();
        let mut local_done = false;
        for (oi, op) in round.ops.iter().enumerate() {
            let (reads, writes): (Vec<Span>, Vec<Span>) = match *op {
                Op::Send { src, .. } => (vec![src], vec![]),
                Op::Recv { dst, .. } => (vec![], vec![dst]),
                Op::RecvReduce { dst, local, .. } => {
                    if dst.len != local.len {
                        return Err(at("recv-reduce operands differ in length"));
                    }
                    if layout.overlaps(&dst, &local) && !layout.same(&dst, &local) {
                        return Err(at("recv-reduce local operand partly overlaps dst"));
                    }
                    (vec![local], vec![dst])
                }
                Op::Copy { dst, src } => {
                    if dst.len != src.len {
                        return Err(at("copy operands differ in length"));
                    }
                    if layout.same(&dst, &src) {
                        continue; // a no-op (in place), which the executor skips
                    }
                    if layout.overlaps(&dst, &src) {
                        return Err(at("copy operands partly overlap"));
                    }
                    (vec![src], vec![dst])
                }
                Op::Reduce { dst, a, b } => {
                    if dst.len != a.len || a.len != b.len {
                        return Err(at("reduce operands differ in length"));
                    }
                    if layout.overlaps(&dst, &a) && !layout.same(&dst, &a) {
                        return Err(at("reduce operand a partly overlaps dst"));
                    }
                    // The executor reads `b` while writing `dst`: no overlap
                    // at all (put the accumulator in `a`).
                    if layout.overlaps(&dst, &b) {
                        return Err(at("reduce operand b overlaps dst; swap a and b"));
                    }
                    (vec![a, b], vec![dst])
                }
            };
            match op.peer() {
                Some(p) if p >= req.n || p == req.rank => {
                    return Err(at(&format!("peer {p} is not another rank of {}", req.n)));
                }
                Some(_) if !overlapped_reads.is_empty() || !overlapped_writes.is_empty() => {
                    return Err(at("communication op listed after an overlapped local op"));
                }
                Some(_) => local_done = true,
                None if local_done => {
                    overlapped_reads.extend(reads.iter().copied());
                    overlapped_writes.extend(writes.iter().copied());
                }
                None => {}
            }
            for s in reads.iter().chain(&writes) {
                if !in_bounds(s) {
                    return Err(at(&format!("{s:?} is out of bounds")));
                }
            }
            for w in &writes {
                if w.buf == Buf::Input {
                    return Err(at("writes the input buffer"));
                }
            }
            // In place, an input element whose memory was already overwritten
            // no longer holds the caller's data.
            if layout.in_place {
                for r in reads.iter().filter(|s| s.buf == Buf::Input) {
                    if written.iter().any(|w| layout.overlaps(w, r)) {
                        return Err(at(&format!("reads input {r:?} after it was overwritten")));
                    }
                }
            }
            if op.peer().is_some() {
                comm_reads.extend(reads.iter().map(|s| (oi, *s)));
                comm_writes.extend(writes.iter().map(|s| (oi, *s)));
            }
            written.extend(writes.iter().filter(|s| s.len > 0));
        }
        // Overlapped local ops run at any moment while the messages are in
        // flight: they may not write what a message reads or writes, nor
        // read what a receive writes.
        for w in &overlapped_writes {
            if let Some((_, c)) = comm_reads
                .iter()
                .chain(&comm_writes)
                .find(|(_, c)| layout.overlaps(w, c))
            {
                return Err(at(&format!(
                    "overlapped local op writes {w:?}, which an in-flight message uses ({c:?})"
                )));
            }
        }
        for r in &overlapped_reads {
            if let Some((_, c)) = comm_writes.iter().find(|(_, c)| layout.overlaps(r, c)) {
                return Err(at(&format!(
                    "overlapped local op reads {r:?} while a receive writes {c:?}"
                )));
            }
        }
        // Ops in flight together: a write may not meet another op's read or
        // write (a recv-reduce accumulating into its own local is fine).
        for (i, (wo, w)) in comm_writes.iter().enumerate() {
            for (wo2, w2) in &comm_writes[i + 1..] {
                if wo != wo2 && layout.overlaps(w, w2) {
                    return Err(at(&format!(
                        "two receives write overlapping {w:?} and {w2:?}"
                    )));
                }
            }
            for (ro, r) in &comm_reads {
                if ro != wo && layout.overlaps(w, r) {
                    return Err(at(&format!(
                        "receive into {w:?} overlaps in-flight read {r:?}"
                    )));
                }
            }
        }
    }
    Ok(())
}

/// What [`match_messages`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MessageStats {
    /// Messages sent by all ranks.
    pub messages: usize,
    /// Elements sent by all ranks.
    pub elements: usize,
    /// Length of the longest chain of dependent rounds (the number of
    /// communication steps on the critical path, as the alpha term counts
    /// them).
    pub steps: usize,
    /// Elements each rank sends.
    pub sent: Vec<usize>,
    /// Elements each rank receives.
    pub received: Vec<usize>,
}

/// Elements each rank sends to ranks on other nodes of `topology` (block
/// placement: rank r is on node r / local_size).
pub fn inter_node_elements(plans: &[Plan], topology: &crate::topo::Topology) -> Vec<usize> {
    let local = topology.local_size();
    plans
        .iter()
        .enumerate()
        .map(|(rank, plan)| {
            plan.ops()
                .filter_map(|op| match *op {
                    Op::Send { peer, src } if peer / local != rank / local => Some(src.len),
                    _ => None,
                })
                .sum()
        })
        .collect()
}

/// A message endpoint: (rank, round, index of the op in the round).
type Site = (usize, usize, usize);

/// Runs the plans of all ranks against each other without data: each rank
/// posts the sends and receives of its current round; a message moves when
/// both ends are in the rounds that hold it (the executor's semantics, with
/// FIFO matching per ordered pair of ranks, as [`super::pairing`] pairs
/// them). Fails if a message has no partner, lengths disagree, or the ranks
/// deadlock.
pub fn match_messages(plans: &[Plan]) -> Result<MessageStats, String> {
    let n = plans.len();
    // Each end is its site and its length in elements.
    let mut table: MessageTable<(usize, usize), (Site, usize), (Site, usize)> =
        MessageTable::new("elements");
    let mut stats = MessageStats {
        sent: vec![0; n],
        received: vec![0; n],
        ..MessageStats::default()
    };
    for (rank, plan) in plans.iter().enumerate() {
        for (ri, round) in plan.rounds.iter().enumerate() {
            for (oi, op) in round.ops.iter().enumerate() {
                match *op {
                    Op::Send { peer, src } => {
                        table.send((rank, peer), ((rank, ri, oi), src.len));
                        stats.messages += 1;
                        stats.elements += src.len;
                        stats.sent[rank] += src.len;
                    }
                    Op::Recv { peer, dst } | Op::RecvReduce { peer, dst, .. } => {
                        table.recv((peer, rank), ((rank, ri, oi), dst.len));
                        stats.received[rank] += dst.len;
                    }
                    _ => {}
                }
            }
        }
    }
    let mut partner = Partners(HashMap::new());
    table.pair(&mut partner).map_err(|e| e.to_string())?;
    let partner = partner.0;
    // Step the ranks in lock-step "ticks": in a tick, every message whose
    // two ends are both in their current rounds completes.
    let mut round_of = vec![0usize; n];
    let mut done: HashSet<Site> = HashSet::new();
    loop {
        let mut progressed = false;
        // Rounds with nothing left to wait for end at once.
        for rank in 0..n {
            while round_of[rank] < plans[rank].rounds.len()
                && round_complete(&plans[rank], rank, round_of[rank], &done)
            {
                round_of[rank] += 1;
                progressed = true;
            }
        }
        if (0..n).all(|r| round_of[r] == plans[r].rounds.len()) {
            return Ok(stats);
        }
        let mut moved = Vec::new();
        for rank in 0..n {
            let ri = round_of[rank];
            let Some(round) = plans[rank].rounds.get(ri) else {
                continue;
            };
            for (oi, op) in round.ops.iter().enumerate() {
                let site = (rank, ri, oi);
                if op.peer().is_none() || done.contains(&site) {
                    continue;
                }
                let other = partner[&site];
                if round_of[other.0] == other.1 {
                    moved.push(site);
                }
            }
        }
        if !moved.is_empty() {
            stats.steps += 1;
            progressed = true;
        }
        done.extend(moved);
        if !progressed {
            let stuck: Vec<String> = (0..n)
                .filter(|&r| round_of[r] < plans[r].rounds.len())
                .map(|r| format!("rank {r} in round {}", round_of[r]))
                .collect();
            return Err(format!("deadlock: {}", stuck.join(", ")));
        }
    }
}

/// The other end of every message, both ways.
struct Partners(HashMap<Site, Site>);

impl Matcher<(usize, usize), (Site, usize), (Site, usize)> for Partners {
    fn sent_len(&self, send: &(Site, usize)) -> u64 {
        send.1 as u64
    }
    fn expected_len(&self, recv: &(Site, usize)) -> u64 {
        recv.1 as u64
    }
    fn matched(&mut self, _: (usize, usize), _: usize, send: (Site, usize), recv: (Site, usize)) {
        self.0.insert(send.0, recv.0);
        self.0.insert(recv.0, send.0);
    }
}

fn round_complete(plan: &Plan, rank: usize, ri: usize, done: &HashSet<Site>) -> bool {
    plan.rounds[ri]
        .ops
        .iter()
        .enumerate()
        .all(|(oi, op)| op.peer().is_none() || done.contains(&(rank, ri, oi)))
}
