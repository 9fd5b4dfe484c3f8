//! Timing the plans of all ranks under the alpha-beta-gamma model: the
//! reference the closed forms are held against.
//!
//! The walk follows the executor's semantics. A rank runs its rounds in
//! order; a round starts when the rank has finished the previous one, and its
//! messages can move only once every partner has reached the round holding the
//! other end (messages of a pair match in plan order, as in
//! [`crate::plan::match_messages`]). A round then costs
//!
//! * for each link class it uses (intra-node, inter-node): alpha of that class,
//!   plus the overhead o for each message beyond the first on the busier
//!   direction (k messages: alpha + (k-1)·o), plus the larger of the bytes it
//!   sends and the bytes it receives on that class, over beta (one full-duplex port per class; concurrent messages of
//!   a round share it; only the bytes it receives where receivers alone copy,
//!   [`Profile::receiver_copies`]), the classes working in parallel (the round
//!   waits for the slowest);
//! * plus gamma times the bytes it reduces (receive-reduce and local reduce)
//!   and the profile's copy cost times the bytes it copies locally (a copy
//!   onto its own source, which the executor skips, is free) and the bytes
//!   a local reduce folds: its operand was staged in scratch by an earlier
//!   receive, a round trip a fold on arrival does not make.
//!
//! The time of a collective is the latest finish over
//! all ranks, and its latency, bandwidth and compute terms are the ones
//! accumulated along that critical path.

use super::{Cost, Profile};
use crate::plan::pairing::{Matcher, MessageTable};
use crate::plan::{Op, Plan, Span};
use crate::topo::Topology;

/// Time of the plans of all ranks of one collective (`plans[r]` is rank
/// r's), with elements of `elem_size` bytes, on `profile`. Ranks on the same
/// node of `topology` (block placement) use the intra-node link parameters.
/// Fails like [`crate::plan::match_messages`] on plans that do not fit.
pub fn walk(
    plans: &[Plan],
    elem_size: usize,
    profile: &Profile,
    topology: &Topology,
) -> Result<Cost, String> {
    let n = plans.len();
    let local = topology.local_size().max(1);
    let elem = elem_size as f64;
    // For each rank and round: the partner rounds its messages meet,
    // (peer, peer's round). Each end is its round and its length.
    let mut table: MessageTable<(usize, usize), (usize, usize), (usize, usize)> =
        MessageTable::new("elements");
    for (rank, plan) in plans.iter().enumerate() {
        for (ri, round) in plan.rounds.iter().enumerate() {
            for op in &round.ops {
                match *op {
                    Op::Send { peer, src } => table.send((rank, peer), (ri, src.len)),
                    Op::Recv { peer, dst } | Op::RecvReduce { peer, dst, .. } => {
                        table.recv((peer, rank), (ri, dst.len));
                    }
                    _ => {}
                }
            }
        }
    }
    let mut partners = Partners(
        plans
            .iter()
            .map(|p| vec![Vec::new(); p.rounds.len()])
            .collect(),
    );
    table.pair(&mut partners).map_err(|e| e.to_string())?;
    let partners = partners.0;
    // start[r][k]: when rank r begins round k (its previous round's finish).
    let mut start: Vec<Vec<Option<Cost>>> = plans
        .iter()
        .map(|p| vec![None; p.rounds.len() + 1])
        .collect();
    for s in start.iter_mut() {
        s[0] = Some(Cost::ZERO);
    }
    let mut next = vec![0usize; n];
    loop {
        let mut progressed = false;
        for r in 0..n {
            while next[r] < plans[r].rounds.len() {
                let k = next[r];
                let mut begin = start[r][k].expect("previous round finished");
                let mut ready = true;
                for &(p, pr) in &partners[r][k] {
                    match start[p][pr] {
                        Some(t) => {
                            if t.total() > begin.total() {
                                begin = t;
                            }
                        }
                        None => {
                            ready = false;
                            break;
                        }
                    }
                }
                if !ready {
                    break;
                }
                let round = round_cost(&plans[r].rounds[k].ops, r, local, elem, profile);
                start[r][k + 1] = Some(begin + round);
                next[r] += 1;
                progressed = true;
            }
        }
        if (0..n).all(|r| next[r] == plans[r].rounds.len()) {
            break;
        }
        if !progressed {
            return Err("deadlock".into());
        }
    }
    Ok(start
        .iter()
        .map(|s| s.last().copied().flatten().unwrap_or(Cost::ZERO))
        .fold(Cost::ZERO, |a, b| if b.total() > a.total() { b } else { a }))
}

/// Per rank and round, the (peer, peer's round) of each of its messages.
struct Partners(Vec<Vec<Vec<(usize, usize)>>>);

impl Matcher<(usize, usize), (usize, usize), (usize, usize)> for Partners {
    fn sent_len(&self, send: &(usize, usize)) -> u64 {
        send.1 as u64
    }
    fn expected_len(&self, recv: &(usize, usize)) -> u64 {
        recv.1 as u64
    }
    fn matched(
        &mut self,
        (src, dst): (usize, usize),
        _: usize,
        (sr, _): (usize, usize),
        (dr, _): (usize, usize),
    ) {
        self.0[src][sr].push((dst, dr));
        self.0[dst][dr].push((src, sr));
    }
}

/// Cost of one round of `rank` (see the module docs).
fn round_cost(ops: &[Op], rank: usize, local: usize, elem: f64, profile: &Profile) -> Cost {
    // [intra, inter] x (sent, received, used, messages out, messages in)
    let mut sent = [0.0f64; 2];
    let mut received = [0.0f64; 2];
    let mut used = [false; 2];
    let mut sends = [0usize; 2];
    let mut recvs = [0usize; 2];
    let mut reduced = 0.0f64;
    let mut copied = 0.0f64;
    for op in ops {
        match *op {
            Op::Send { peer, src } => {
                let c = usize::from(peer / local != rank / local);
                sent[c] += src.len as f64 * elem;
                used[c] = true;
                sends[c] += 1;
            }
            Op::Recv { peer, dst } => {
                let c = usize::from(peer / local != rank / local);
                received[c] += dst.len as f64 * elem;
                used[c] = true;
                recvs[c] += 1;
            }
            Op::RecvReduce { peer, dst, .. } => {
                let c = usize::from(peer / local != rank / local);
                received[c] += dst.len as f64 * elem;
                used[c] = true;
                recvs[c] += 1;
                reduced += dst.len as f64 * elem;
            }
            // A local reduce folds an operand staged in scratch by an
            // earlier receive: that round trip costs a copy as well.
            Op::Reduce { dst, .. } => {
                reduced += dst.len as f64 * elem;
                copied += dst.len as f64 * elem;
            }
            Op::Copy { dst, src } => copied += copy_len(dst, src) as f64 * elem,
        }
    }
    let links = [&profile.intra, &profile.inter];
    let mut comm = Cost::ZERO;
    for c in 0..2 {
        if used[c] {
            let extra = (sends[c].max(recvs[c]) - 1) as f64;
            let t = Cost {
                latency: links[c].alpha + extra * links[c].overhead,
                bandwidth: profile.round_bandwidth(
                    links[c],
                    sent[c],
                    received[c],
                    sends[c].max(recvs[c]),
                ),
                compute: 0.0,
            };
            if t.total() > comm.total() {
                comm = t;
            }
        }
    }
    comm + Cost {
        latency: 0.0,
        bandwidth: 0.0,
        compute: reduced * profile.gamma + copied * profile.copy,
    }
}

/// Elements a local copy moves: none when it names its own source (the
/// executor's no-op, e.g. an in-place rank's own block).
fn copy_len(dst: Span, src: Span) -> usize {
    if dst.buf == src.buf && dst.offset == src.offset {
        0
    } else {
        dst.len
    }
}

/// The busiest rank's CPU time in the LogGP view ([`super::overlap`]): for
/// each rank of `plans`, o of the link class of every message it sends or
/// receives (o from [`super::LogGp::from_link`]) plus gamma times the bytes
/// it reduces and the copy cost times the bytes it copies locally; the
/// largest over the ranks. The reference the closed forms of
/// [`super::busiest`] are held against.
pub fn walk_cpu(plans: &[Plan], elem_size: usize, profile: &Profile, topology: &Topology) -> f64 {
    let local = topology.local_size().max(1);
    let elem = elem_size as f64;
    let o = [
        super::LogGp::from_link(&profile.intra).overhead,
        super::LogGp::from_link(&profile.inter).overhead,
    ];
    plans
        .iter()
        .enumerate()
        .map(|(rank, plan)| {
            let mut cpu = 0.0;
            for op in plan.rounds.iter().flat_map(|r| &r.ops) {
                let class = |peer: usize| usize::from(peer / local != rank / local);
                match *op {
                    Op::Send { peer, .. } | Op::Recv { peer, .. } => cpu += o[class(peer)],
                    Op::RecvReduce { peer, dst, .. } => {
                        cpu += o[class(peer)] + dst.len as f64 * elem * profile.gamma;
                    }
                    Op::Reduce { dst, .. } => {
                        cpu += dst.len as f64 * elem * (profile.gamma + profile.copy);
                    }
                    Op::Copy { dst, src } => {
                        cpu += copy_len(dst, src) as f64 * elem * profile.copy;
                    }
                }
            }
            cpu
        })
        .fold(0.0, f64::max)
}
