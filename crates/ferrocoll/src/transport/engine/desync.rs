//! Probes and positions: what a rank that waits long asks its peers.
//!
//! A call that has waited [`super::driver::PROBE_AFTER`] sends a *probe*
//! with its own header to every peer it still waits on. The peer compares
//! it with its call at that point: two calls that differ but exchange no
//! message (a reduce to root 0 against a broadcast from root 0 on two ranks:
//! both only receive) are a mismatch no data frame would ever reveal, found
//! this way in a fraction of a second instead of at the deadline. The peer
//! answers with its *position* (the calls it is in on that communicator, or
//! the last one it finished), which the prober keeps: when a wait reaches
//! its deadline, the communicator asks every rank again
//! ([`crate::transport::Transport::positions`]) and the timeout lists
//! where each one is, the desync report ("rank 7: in no call on this
//! communicator; last finished all_reduce(...) #182").
//!
//! A peer answers only while some thread of it drives its engine (it is in
//! a ferrocoll call, on any communicator); one computing, stopped or stuck
//! outside ferrocoll does not, and the report says so.

use super::core::Core;
use super::frames::push_between_frames;
use super::ledger;
use super::verdict::Verdict;
use crate::transport::wire::{Frame, FrameKind};
use crate::transport::{CallKind, Header, Incoming, Signature};
use crate::types::DType;

/// The sequence number of a probe that asks only where a peer is (no call
/// of the prober's to compare): collective numbers never get near it, and
/// point-to-point keys have [`Header::P2P_BIT`] set.
const WHERE_ONLY: u64 = (1 << 62) - 1;

/// Whom a call still waits for, as its position says it ("waiting for
/// world rank 2"; empty when it waits for no message). Engine ranks are the
/// transport's, the world's, which a split communicator's report numbers
/// differently: hence "world". Naming them turns a report of ranks that only
/// wait for each other into a chain that ends at the one that is missing.
fn waiting_on(mut peers: Vec<usize>) -> String {
    peers.sort_unstable();
    peers.dedup();
    match peers.as_slice() {
        [] => String::new(),
        // ANY_SOURCE is usize::MAX: last after the sort.
        [.., Incoming::ANY_SOURCE] => "waiting for a message from any rank".to_string(),
        [p] => format!("waiting for world rank {p}"),
        many => {
            let list: Vec<String> = many.iter().map(usize::to_string).collect();
            format!("waiting for world ranks {}", list.join(", "))
        }
    }
}

/// A rank's position in call `header`: "in allreduce(...) #5", with
/// `state` in parentheses after it unless empty.
fn in_call(header: &Header, state: &str) -> String {
    if state.is_empty() {
        format!("in {}", header.describe_call())
    } else {
        format!("in {} ({state})", header.describe_call())
    }
}

/// A header naming only communicator `comm` (positions, where-only probes).
fn comm_only(comm: u64) -> Header {
    Header {
        comm,
        seq: WHERE_ONLY,
        sig: Signature {
            kind: CallKind::PointToPoint,
            dtype: DType::U8,
            op: None,
            count: 0,
            root: None,
        },
    }
}

impl Core {
    /// Call `id` has waited long: asks every peer it still waits on where
    /// it is, with the call's header for them to compare.
    pub(super) fn probe(&mut self, id: usize) {
        let c = self.calls[id].as_ref().expect("live call");
        let header = c.header;
        let mut peers: Vec<usize> = c
            .recvs
            .iter()
            .filter(|r| !r.done && r.peer != Incoming::ANY_SOURCE)
            .map(|r| r.peer)
            .collect();
        peers.dedup();
        self.probe_bypass(&header, &peers);
    }

    /// A call `header` (an engine call's, [`Core::probe`], or a bypass
    /// call's, which the engine does not run) has waited long: sends a
    /// probe with its header to each of `peers` it still waits on, so that
    /// a mismatch no message reveals (both sides only receive) is found.
    pub(super) fn probe_bypass(&mut self, header: &Header, peers: &[usize]) {
        let frame = Frame {
            kind: FrameKind::Probe,
            header: *header,
            len: 0,
            addr: 0,
            region: 0,
        }
        .encode();
        for &p in peers {
            if p != self.me && self.peers[p].lost.is_none() && self.peers[p].connected {
                push_between_frames(&mut self.peers[p].sendq, &frame);
            }
        }
    }

    /// Asks each of `ranks` with a channel where it is on communicator
    /// `comm`, forgetting what they said before.
    pub(super) fn probe_where(&mut self, comm: u64, ranks: &[usize]) {
        let frame = Frame {
            kind: FrameKind::Probe,
            header: comm_only(comm),
            len: 0,
            addr: 0,
            region: 0,
        }
        .encode();
        for &p in ranks {
            if p == self.me || p >= self.peers.len() {
                continue;
            }
            self.positions[p] = None;
            if self.peers[p].lost.is_none() && self.peers[p].connected {
                push_between_frames(&mut self.peers[p].sendq, &frame);
            }
        }
    }

    /// A peer's probe: a collective of its at a point where this rank runs
    /// (or ran) another is a mismatch; either way the peer gets this
    /// rank's position.
    pub(super) fn probe_arrived(&mut self, from: usize, theirs: &Header) {
        let collective = matches!(theirs.sig.kind, CallKind::Collective(_));
        if collective && theirs.seq != WHERE_ONLY {
            let running = self
                .calls
                .iter()
                .flatten()
                .find(|c| c.header.key() == theirs.key())
                .map(|c| c.header);
            // A call waiting on the bypass, which the engine does not run.
            let bypass = || {
                ledger::with(&*self.ledger, |l| {
                    l.bypass_waiting(theirs.comm)
                        .into_iter()
                        .find(|h| h.key() == theirs.key())
                })
            };
            let on_bypass = running.is_none().then(bypass).flatten();
            match running.or(on_bypass) {
                Some(ours) if ours.sig != theirs.sig => {
                    let verdict = Verdict {
                        header: ours,
                        a: self.me,
                        a_call: ours.sig.to_string(),
                        b: from,
                        b_call: theirs.sig.to_string(),
                    };
                    if on_bypass.is_some() {
                        // The bypass call finds it at its next checkup (it
                        // runs one before every sleep).
                        ledger::with(&*self.ledger, |l| l.add_verdict(verdict.clone()));
                        self.declare(verdict);
                    } else {
                        let err = self.declare(verdict);
                        self.fail_call(ours.key(), err);
                    }
                }
                Some(_) => {}
                None => {
                    let finished = ledger::with(&*self.ledger, |l| l.finished_with(theirs.key()));
                    if finished.is_some_and(|ours| ours.sig != theirs.sig) {
                        self.late_mismatch_of(from, theirs.key(), theirs.sig.to_string());
                    }
                }
            }
        }
        if self.peers[from].lost.is_some() || !self.peers[from].connected {
            return;
        }
        let text = self.position_text(theirs.comm);
        let frame = Frame {
            kind: FrameKind::Position,
            header: comm_only(theirs.comm),
            len: text.len(),
            addr: 0,
            region: 0,
        };
        let mut bytes = frame.encode().to_vec();
        bytes.extend_from_slice(text.as_bytes());
        bytes.resize(bytes.len().next_multiple_of(8), 0);
        self.peers[from]
            .sendq
            .push_back(super::frames::Outbound::notice(bytes));
    }

    /// A peer said where it is on communicator `header.comm`.
    pub(super) fn position_arrived(&mut self, from: usize, header: &Header, text: String) {
        self.positions[from] = Some((header.comm, text));
    }

    /// The peers call `id` still waits for: those it receives from, and
    /// those its unwritten or unacknowledged sends wait on (a send into a
    /// dead link).
    pub(super) fn awaited_by(&self, id: usize) -> Vec<usize> {
        let c = self.calls[id].as_ref().expect("live call");
        let receiving = c.recvs.iter().filter(|r| !r.done).map(|r| r.peer);
        let sending = self.peers.iter().enumerate().filter_map(|(p, peer)| {
            let queued = peer.sendq.iter().any(|o| o.call == Some(id));
            let unacked = peer.unacked.iter().any(|u| u.0 == id);
            (queued || unacked).then_some(p)
        });
        receiving.chain(sending).collect()
    }

    /// Call `id` timed out: the ledger keeps it, and whom it waited for,
    /// for the positions asked while the reports are gathered.
    pub(super) fn note_timeout(&self, id: usize) {
        let header = self.calls[id].as_ref().expect("live call").header;
        let waiting = self.awaited_by(id);
        ledger::with(&*self.ledger, |l| l.time_out(header, waiting));
    }

    /// Where this rank is on communicator `comm`: the calls it is in (and
    /// whom each waits for), else the one that just timed out, else the
    /// last one it finished.
    pub(super) fn position_text(&self, comm: u64) -> String {
        let (bypass, timed_out) = ledger::with(&*self.ledger, |l| {
            (l.bypass_waiting(comm), l.timed_out_on(comm))
        });
        let running: Vec<String> = self
            .calls
            .iter()
            .enumerate()
            .filter_map(|(id, c)| c.as_ref().map(|c| (id, c)))
            .filter(|(_, c)| c.header.comm == comm)
            .map(|(id, c)| in_call(&c.header, &waiting_on(self.awaited_by(id))))
            .chain(bypass.iter().map(|h| in_call(h, "")))
            .collect();
        if !running.is_empty() {
            return running.join(", ");
        }
        if !timed_out.is_empty() {
            return timed_out
                .into_iter()
                .map(|(h, peers)| {
                    let waiting = waiting_on(peers);
                    in_call(&h, format!("timed out {waiting}").trim_end())
                })
                .collect::<Vec<_>>()
                .join(", ");
        }
        match ledger::with(&*self.ledger, |l| l.last_finished(comm)) {
            Some(h) => format!(
                "in no call on this communicator; last finished {}",
                h.describe_call()
            ),
            None => "in no call on this communicator; finished none yet".to_string(),
        }
    }

    /// What is known of where each of `ranks` is on `comm` (`None`: no
    /// answer); this rank and gone peers are always known.
    pub(super) fn positions_of(&self, comm: u64, ranks: &[usize]) -> Vec<Option<String>> {
        ranks
            .iter()
            .map(|&r| {
                if r == self.me {
                    return Some(format!("{} (this rank)", self.position_text(comm)));
                }
                let peer = self.peers.get(r)?;
                if peer.lost.is_some() {
                    return Some("gone".to_string());
                }
                if !peer.connected {
                    return Some("not asked: no channel to it yet".to_string());
                }
                match &self.positions[r] {
                    Some((c, text)) if *c == comm => Some(text.clone()),
                    _ => None,
                }
            })
            .collect()
    }

    /// Whether every rank of `ranks` has answered (or cannot).
    pub(super) fn all_placed(&self, comm: u64, ranks: &[usize]) -> bool {
        self.positions_of(comm, ranks).iter().all(Option::is_some)
    }
}
