//! The engine's state, and how it is built from the plans: every rank's
//! rounds as ranges into one message list and one receive list, matched
//! through the message table, plus the per-rank, per-link and per-group
//! figures a run updates.

use std::borrow::Cow;

use ferrocoll::plan::pairing::MessageTable;
use ferrocoll::plan::Op;

use super::events::EventQueue;
use super::groups::Group;
use super::matching::{Chan, Msg, Pairs, Peer, PendingRecv};
use super::options::{per_rank, Mode, SimOptions};
use super::timeline::Histogram;
use crate::network::Network;
use crate::symmetry::Symmetry;

/// One round of one rank, as ranges into the message and receive lists
/// (`rounds` ends with a sentinel whose starts are the lists' lengths).
pub(super) struct RoundInfo {
    /// Its first message id (a rank's sends are numbered in plan order, so
    /// the round's sends are ids `sends` up to the next round's `sends`).
    pub(super) sends: u32,
    /// Its first slot in the receive id list (ends where the next round's
    /// begin).
    pub(super) recvs: u32,
    pub(super) local_reduce: u64,
    /// When the rank entered the round (began its local reductions).
    pub(super) entered: f64,
    /// When it posted the round's messages.
    pub(super) posted: f64,
    /// The message that completed last and so ended the round (`u32::MAX`
    /// when the round has none).
    pub(super) last: u32,
}

/// A run in progress: the plans of every group read into flat tables, and
/// what the run has measured so far.
pub(super) struct Engine<'a> {
    pub(super) net: Cow<'a, Network>,
    pub(super) mode: Mode,
    pub(super) chunk_bytes: u64,
    /// Per link, the seconds a message holds it before its bytes when it
    /// is the message's first ([`super::SimOptions::message_overhead`]);
    /// empty when none.
    pub(super) overhead: Vec<f64>,
    pub(super) msgs: Vec<Msg>,
    pub(super) rounds: Vec<RoundInfo>,
    /// rank -> index of its first round in `rounds`; n + 1 entries.
    pub(super) first_round: Vec<usize>,
    pub(super) recv_ids: Vec<u32>,
    /// Per rank: index of the current round in `rounds`.
    pub(super) cur: Vec<usize>,
    pub(super) pending: Vec<u32>,
    /// Engine ranks (the groups' ranks one after the other) -> physical rank.
    pub(super) phys: Vec<u32>,
    /// Engine rank -> its group.
    pub(super) group_of: Vec<u32>,
    /// Group -> its first engine rank; groups + 1 entries.
    pub(super) group_first: Vec<usize>,
    /// Per engine rank: seconds per reduced byte.
    pub(super) gamma: Vec<f64>,
    /// Per engine rank: when it starts its plan.
    pub(super) start_at: Vec<f64>,
    /// Per physical rank: when its reduction unit is free.
    pub(super) compute_free: Vec<f64>,
    pub(super) finish: Vec<f64>,
    /// Per queue: when it is free. A queue per link, except in the
    /// aggregated mode: one per orbit of links (see `queue_of`).
    pub(super) link_free: Vec<f64>,
    /// Aggregated mode: link -> the representative link whose queue, busy
    /// time and traffic stand for it; `None` otherwise (every link its own).
    pub(super) queue_of: Option<Vec<u32>>,
    /// How many links each queue stands for (1, or the symmetry's copies).
    pub(super) weight: f64,
    /// Per group, per link (group * links + link).
    pub(super) link_bytes: Vec<u64>,
    pub(super) link_busy: Vec<f64>,
    pub(super) hist: Vec<Histogram>,
    /// Events not yet processed.
    pub(super) events: EventQueue,
    /// Whether a message alone on its receiver's port has its chunks laid
    /// out at once (see `Engine::lay_out`): with one group; tests turn it
    /// off to compare.
    pub(super) lay_out: bool,
}

impl<'a> Engine<'a> {
    pub(super) fn new(
        groups: &[Group<'_>],
        elem_size: usize,
        net: Cow<'a, Network>,
        mode: Mode,
        opts: &SimOptions,
        quotient: Option<&Symmetry>,
    ) -> Result<Engine<'a>, String> {
        let (delay, slow) = per_rank(opts, net.ranks())?;
        let elem = elem_size as u64;
        let mut phys = Vec::new();
        let mut group_of = Vec::new();
        let mut group_first = vec![0];
        for (g, group) in groups.iter().enumerate() {
            phys.extend(group.ranks.iter().map(|&r| r as u32));
            group_of.extend(group.ranks.iter().map(|_| g as u32));
            group_first.push(phys.len());
        }
        let n = phys.len();
        let single = groups.len() == 1;
        // How errors name an engine rank: by its rank in its group.
        let who = |v: usize| {
            let g = group_of[v] as usize;
            let r = v - group_first[g];
            if single {
                format!("rank {r}")
            } else {
                format!("group {g} rank {r}")
            }
        };
        let mut msgs: Vec<Msg> = Vec::new();
        let mut rounds = Vec::new();
        let mut first_round = Vec::with_capacity(n + 1);
        let mut recv_ids: Vec<u32> = Vec::new();
        // The message table: sends are message ids, receives
        // (recv slot, bytes, reduce), by channel in plan order.
        let mut table: MessageTable<Chan, u32, PendingRecv> = MessageTable::new("bytes");
        for (g, group) in groups.iter().enumerate() {
            let (base, size) = (group_first[g], group.plans.len());
            // A peer of the plans: the engine rank that plays it, the
            // physical rank it is, and the offset of its message channel
            // as seen by the sender (`send`) or the receiver.
            let check_peer = |rank: usize, peer: usize, send: bool| {
                let size = quotient.map_or(size, |q| q.ranks);
                if peer >= size {
                    return Err(format!(
                        "{} names peer {peer} outside the group of {size}",
                        who(base + rank)
                    ));
                }
                Ok(match quotient {
                    None => Peer {
                        engine: (base + peer) as u32,
                        to: group.ranks[peer] as u32,
                        offset: 0,
                    },
                    Some(q) => {
                        let j = q.index(peer);
                        Peer {
                            engine: q.rep(peer) as u32,
                            to: peer as u32,
                            offset: if send { j } else { q.inverse(j) } as u32,
                        }
                    }
                })
            };
            for local in 0..size {
                let plan = group.plans.get(local)?;
                let rank = base + local;
                first_round.push(rounds.len());
                for round in &plan.rounds {
                    let (s0, r0) = (msgs.len() as u32, recv_ids.len() as u32);
                    let mut local_reduce = 0u64;
                    for op in &round.ops {
                        match *op {
                            Op::Send { peer, src } => {
                                let peer = check_peer(local, peer, true)?;
                                let id = u32::try_from(msgs.len())
                                    .map_err(|_| "more than 2^32 messages".to_string())?;
                                msgs.push(Msg {
                                    src: rank as u32,
                                    dst: peer.engine,
                                    to: peer.to,
                                    bytes: src.len as u64 * elem,
                                    reduce: false,
                                    posted: 0,
                                    chunks_left: 0,
                                    done: 0.0,
                                    started: 0.0,
                                    recv_slot: u32::MAX,
                                });
                                table.send(
                                    Chan {
                                        src: rank as u32,
                                        dst: peer.engine,
                                        offset: peer.offset,
                                    },
                                    id,
                                );
                            }
                            Op::Recv { peer, dst } | Op::RecvReduce { peer, dst, .. } => {
                                let peer = check_peer(local, peer, false)?;
                                let reduce = matches!(op, Op::RecvReduce { .. });
                                let chan = Chan {
                                    src: peer.engine,
                                    dst: rank as u32,
                                    offset: peer.offset,
                                };
                                table.recv(
                                    chan,
                                    (recv_ids.len() as u32, dst.len as u64 * elem, reduce),
                                );
                                recv_ids.push(u32::MAX);
                            }
                            Op::Reduce { dst, .. } => local_reduce += dst.len as u64 * elem,
                            Op::Copy { .. } => {}
                        }
                    }
                    rounds.push(RoundInfo {
                        sends: s0,
                        recvs: r0,
                        local_reduce,
                        entered: 0.0,
                        posted: 0.0,
                        last: u32::MAX,
                    });
                }
            }
        }
        first_round.push(rounds.len());
        // The sentinel: where the last round's sends and receives end.
        rounds.push(RoundInfo {
            sends: msgs.len() as u32,
            recvs: recv_ids.len() as u32,
            local_reduce: 0,
            entered: 0.0,
            posted: 0.0,
            last: u32::MAX,
        });
        table
            .pair(&mut Pairs {
                msgs: &mut msgs,
                recv_ids: &mut recv_ids,
            })
            .map_err(|e| e.describe(who))?;
        let links = net.links.len();
        let classes = net.classes.len();
        let gamma = phys
            .iter()
            .map(|&r| opts.gamma * slow[r as usize])
            .collect();
        let start_at = phys.iter().map(|&r| delay[r as usize]).collect();
        Ok(Engine {
            mode,
            chunk_bytes: opts.chunk_bytes,
            overhead: super::options::overheads(&net, &opts.message_overhead)?,
            msgs,
            cur: first_round[..n].to_vec(),
            rounds,
            first_round,
            recv_ids,
            pending: vec![0; n],
            compute_free: vec![0.0; net.ranks()],
            finish: vec![0.0; n],
            link_free: vec![0.0; links],
            queue_of: quotient.map(|q| net.link_reps(q)),
            weight: quotient.map_or(1.0, |q| q.copies() as f64),
            link_bytes: vec![0; links * groups.len()],
            link_busy: vec![0.0; links * groups.len()],
            hist: (0..groups.len()).map(|_| Histogram::new(classes)).collect(),
            events: EventQueue::new(),
            lay_out: groups.len() == 1,
            phys,
            group_of,
            group_first,
            gamma,
            start_at,
            net,
        })
    }
}
