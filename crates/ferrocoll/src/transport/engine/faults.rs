//! Faults: lost peers, crashes, mismatches (found here, reported by a peer,
//! or late: a message for a call this rank finished), aborts and
//! goodbyes. Each fails the calls it concerns, and most queue a notice for
//! the peers so that every rank fails alike instead of waiting for a
//! message that will never come. No I/O here either: the driver writes the
//! notices, and decides when to flush them.

use std::sync::atomic::Ordering;

use super::core::Core;
use super::frames::{control_frame, push_between_frames, Outbound};
use super::ledger;
use super::verdict::Verdict;
use crate::error::{Error, Result};
use crate::transport::wire::FrameKind;
use crate::transport::Header;

/// A message that arrived by a bypass (the fast path) for a call this rank
/// runs on the engine, or has finished: the peer took the other path.
pub(crate) struct Stray {
    /// Sender.
    pub peer: usize,
    /// Its call's key.
    pub key: (u64, u64),
    /// Its call, described for the error.
    pub remote: String,
}

/// Why a bypass call fails, for the engine to turn into the error and the
/// notices it would have sent itself ([`Core::bypass_fault`]).
pub(crate) enum Fault {
    /// `peer` sent a message for this call with another signature, or one
    /// although the call expects none from it.
    Mismatch { peer: usize, theirs: String },
    /// `peer` sent a message for the call with `key`, which this rank has
    /// finished.
    Late {
        peer: usize,
        key: (u64, u64),
        theirs: String,
    },
    /// A peer already reported a mismatch for this call.
    Reported(Verdict),
}

impl Core {
    /// Marks `peer` gone and fails every call that waits on it.
    pub(super) fn lose(&mut self, peer: usize, why: String) {
        if self.peers[peer].lost.is_some() {
            return;
        }
        self.peers[peer].lost = Some(why);
        let mut sending: Vec<usize> = self.peers[peer]
            .sendq
            .iter()
            .filter_map(|o| o.call)
            .collect();
        sending.extend(self.peers[peer].unacked.iter().map(|u| u.0));
        self.peers[peer].unacked.clear();
        self.peers[peer].to_read.clear();
        self.peers[peer].sendq.clear();
        // A peer that leaves because another rank failed names that one.
        let origin = self.culprit.or(self.origin).unwrap_or(peer);
        let mut awaited = false;
        for (id, call) in self.calls.iter_mut().enumerate() {
            let Some(call) = call else { continue };
            let waits = call.recvs.iter().any(|r| r.peer == peer && !r.done);
            if waits || sending.contains(&id) {
                call.error.get_or_insert(Error::PeerLost { rank: origin });
                awaited = true;
            }
        }
        // A crash, or a clean exit while a call here still needed the peer
        // (it returned early): either way it is the origin of the failure,
        // and every rank is told so, before this rank's own exit makes it
        // look like the culprit to ranks that wait on it.
        if !self.peers[peer].said_bye || awaited {
            self.crashed(origin);
        }
    }

    /// Peer `from` reports rank `culprit` gone. Said of itself (it leaves
    /// because it failed), it holds at once: everything it sent came
    /// first on this channel. Said of a third rank, it is the origin to
    /// blame from now on, and holds once the driver has read what that
    /// rank may have sent before it left ([`Core::apply_reported_losses`]).
    pub(super) fn loss_reported(&mut self, from: usize, culprit: usize) {
        if culprit == from {
            self.crashed(culprit);
        } else {
            self.origin.get_or_insert(culprit);
            self.reported_lost.push(culprit);
        }
    }

    /// Acts on the losses peers reported ([`Core::loss_reported`]), after
    /// the driver read every channel once more.
    pub(super) fn apply_reported_losses(&mut self) {
        for culprit in std::mem::take(&mut self.reported_lost) {
            self.crashed(culprit);
        }
    }

    /// A call here fails because `peer` is gone (it left before, cleanly):
    /// `peer` is the origin, as in [`Core::lose`].
    pub(super) fn blame(&mut self, peer: usize) {
        if peer != self.me && peer < self.peers.len() {
            self.crashed(peer);
        }
    }

    /// This rank leaves because it failed (its thread panicked): its peers
    /// are told it is the origin, as of a crash.
    pub(super) fn blame_self(&mut self) {
        self.crashed(self.me);
    }

    /// This rank found mismatch `verdict` (it is the verdict's rank `a`):
    /// tells the peers that must learn of it and returns the error for this
    /// rank.
    pub(super) fn declare(&mut self, verdict: Verdict) -> Error {
        let err = verdict.error_for(self.me);
        self.spread(&verdict, None);
        err
    }

    /// Queues `verdict` for every peer that must learn of it and has a
    /// channel, except `from` (who sent it here): all of them for a
    /// collective, the other rank of the pair for point-to-point. Once per
    /// call: a verdict floods the open channels and stops.
    fn spread(&mut self, verdict: &Verdict, from: Option<usize>) {
        if !self.spread.insert(verdict.key()) {
            return;
        }
        let bytes = verdict.encode();
        for p in 0..self.peers.len() {
            let wanted = verdict.is_collective() || p == verdict.a || p == verdict.b;
            if p == self.me || Some(p) == from || !wanted {
                continue;
            }
            if self.peers[p].lost.is_none() && self.peers[p].connected {
                push_between_frames(&mut self.peers[p].sendq, &bytes);
            }
        }
    }

    /// A peer's verdict arrived: passed on once, it fails this rank's call
    /// at that point (now, when this rank gets there, or, if this rank has
    /// finished it, every call from now on: the ranks no longer agree on
    /// where they are).
    pub(super) fn verdict_arrived(&mut self, from: usize, verdict: Verdict) {
        self.spread(&verdict, Some(from));
        let err = verdict.error_for(self.me);
        let running = self
            .calls
            .iter_mut()
            .flatten()
            .find(|c| c.header.key() == verdict.key());
        if let Some(c) = running {
            c.error.get_or_insert(err);
            return;
        }
        if !verdict.is_collective() {
            // A message of a send that completed here already: the receiver
            // failed, this rank's later messages under that tag are fine.
            return;
        }
        // Under one lock: a verdict kept must not miss the call finishing
        // meanwhile (or a bypass call in flight, which looks at the
        // verdicts before it ends).
        let finished = ledger::with(&*self.ledger, |l| {
            let ours = l.finished_with(verdict.key());
            if ours.is_none() {
                l.add_verdict(verdict.clone());
            }
            ours
        });
        if finished.is_some() {
            self.fail_all(&err);
            self.set_sticky(err);
        }
    }

    /// A message nobody claims, of call `theirs` from `peer`: if this rank
    /// already finished its call at that point, the two calls differ. The
    /// rank fails from now on, and tells the peer. Returns whether it was
    /// such a message (and so is dropped).
    pub(super) fn late_mismatch(&mut self, peer: usize, theirs: &Header) -> bool {
        self.late_mismatch_of(peer, theirs.key(), theirs.sig.to_string())
    }

    /// [`State::late_mismatch`] for a message with `key` whose call is
    /// described by `remote` (a frame, or a fast-path message).
    pub(super) fn late_mismatch_of(
        &mut self,
        peer: usize,
        key: (u64, u64),
        remote: String,
    ) -> bool {
        let Some(ours) = ledger::with(&*self.ledger, |l| l.finished_with(key)) else {
            return false;
        };
        let err = self.declare(Verdict {
            header: ours,
            a: self.me,
            a_call: ours.sig.to_string(),
            b: peer,
            b_call: remote,
        });
        self.fail_all(&err);
        self.set_sticky(err);
        true
    }

    /// Rank `culprit` went away without saying goodbye (killed, crashed):
    /// every call here fails naming it, now and from now on, and every peer
    /// is told, so that ranks waiting on a third rank do not hang until
    /// their deadline or blame the wrong one.
    pub(super) fn crashed(&mut self, culprit: usize) {
        if self.culprit.is_some() {
            return;
        }
        self.culprit = Some(culprit);
        self.broken.store(true, Ordering::SeqCst);
        // Calls that got everything they wait for still succeed.
        let err = Error::PeerLost { rank: culprit };
        for call in self.calls.iter_mut().flatten() {
            if call.pending_sends > 0 || call.pending_recvs > 0 {
                call.error.get_or_insert_with(|| err.clone());
            }
        }
        let notice = control_frame(FrameKind::Lost, culprit as u64);
        for (p, peer) in self.peers.iter_mut().enumerate() {
            if p != culprit && peer.lost.is_none() && peer.connected {
                push_between_frames(&mut peer.sendq, &notice);
            }
        }
    }

    /// Every call fails with `err` from now on (the first such error
    /// stays).
    pub(super) fn set_sticky(&mut self, err: Error) {
        self.sticky.get_or_insert(err);
        self.broken.store(true, Ordering::SeqCst);
    }

    /// Handles messages a bypass found where this rank used the engine
    /// (`Bypass::strays`): one for a call running here fails that call
    /// (and tells the peer); one for a finished call is a late mismatch.
    pub(super) fn handle_strays(&mut self, found: Vec<Stray>) {
        for f in found {
            let remote = f.remote;
            let running = self
                .calls
                .iter_mut()
                .flatten()
                .find(|c| c.header.key() == f.key);
            match running {
                Some(c) => {
                    let ours = c.header;
                    let err = self.declare(Verdict {
                        header: ours,
                        a: self.me,
                        a_call: ours.sig.to_string(),
                        b: f.peer,
                        b_call: remote,
                    });
                    self.fail_call(ours.key(), err);
                }
                None => {
                    self.late_mismatch_of(f.peer, f.key, remote);
                }
            }
        }
    }

    /// Fails the running call with `key`, if any, with `err`.
    pub(super) fn fail_call(&mut self, key: (u64, u64), err: Error) {
        if let Some(c) = self
            .calls
            .iter_mut()
            .flatten()
            .find(|c| c.header.key() == key)
        {
            c.error.get_or_insert(err);
        }
    }

    /// Fails every call (an abort, here or at a peer).
    pub(super) fn fail_all(&mut self, err: &Error) {
        for call in self.calls.iter_mut().flatten() {
            call.error.get_or_insert_with(|| err.clone());
        }
    }

    /// The channel to `peer` failed or the peer vanished (`why`).
    pub(super) fn handle_lost(&mut self, peer: usize, why: String) {
        self.lose(peer, why);
    }

    /// Starts an abort: every queue to a peer is cut between frames and
    /// an abort notice is queued. The driver then writes them (briefly)
    /// and calls [`Core::abort_here`]: peers first, because a thread that
    /// returns `Aborted` may end the process at once, and a notice not yet
    /// written would be lost with it.
    pub(super) fn abort_peers(&mut self) {
        // Best effort: a full channel drops the notice, and the peer's
        // deadline still holds.
        let notice = control_frame(FrameKind::Abort, 0);
        for peer in &mut self.peers {
            if peer.lost.is_some() || !peer.connected {
                continue;
            }
            // Only between frames: a half-written frame must finish first.
            if peer.sendq.front().is_some_and(|o| o.done > 0) {
                let mut first = peer.sendq.pop_front().expect("front exists");
                first.detach();
                peer.sendq.clear();
                peer.sendq.push_back(first);
            } else {
                peer.sendq.clear();
            }
            peer.sendq.push_back(Outbound::notice(notice.clone()));
        }
    }

    /// Ends an abort here: every current and future call fails.
    pub(super) fn abort_here(&mut self) {
        self.aborted.store(true, Ordering::SeqCst);
        self.fail_all(&Error::Aborted);
    }

    /// Queues a goodbye to every connected peer (this transport is
    /// dropped: the channel closing next is a clean exit there).
    pub(super) fn say_goodbye(&mut self) {
        let bye = control_frame(FrameKind::Bye, 0);
        for peer in &mut self.peers {
            if peer.lost.is_none() && peer.connected {
                // A notice: a peer busy on the fast path reads its rings
                // only when alerted, and a call of its that waits on this
                // rank must fail naming it, before this rank's leaving
                // makes others leave (they would be blamed instead).
                peer.sendq.push_back(Outbound::notice(bye.clone()));
            }
        }
    }

    /// Records that call `header` ended on this rank (see
    /// [`Core::check_unclaimed`]).
    pub(super) fn finished(&mut self, header: &Header) {
        ledger::with(&*self.ledger, |l| l.finish(header));
    }

    /// The error every call fails with since a late mismatch, if any.
    pub(super) fn sticky(&self) -> Option<&Error> {
        self.sticky.as_ref()
    }

    /// After [`Core::finished`]: a message of call `header` still
    /// unclaimed came from a peer that called something else here (a late
    /// mismatch, also told to that peer).
    pub(super) fn check_unclaimed(&mut self, header: &Header) -> Result<()> {
        if let Some((peer, msg)) = self.take_unexpected(header.key()) {
            self.late_mismatch(peer, &msg.header);
            return Err(self.sticky.clone().expect("set by late_mismatch"));
        }
        Ok(())
    }

    /// What a bypass call `header` cannot see on its own path, checked
    /// while it waits (after the driver moved the channels): an abort, a
    /// crashed rank, a late mismatch, a mismatch a peer reported, a frame
    /// of this call on the channels (a peer that took the engine where this
    /// rank took the bypass: the peer is told), or a gone peer in
    /// `awaited` while `still_missing()` says the call lacks something
    /// from those peers.
    ///
    /// `still_missing` is asked only once a peer in `awaited` is gone, and
    /// before that is declared a crash: a peer may write the message this
    /// call waits for, say goodbye and exit (its last call done) between
    /// the call's last look and this checkup. Such a call must succeed, and
    /// no rank may learn of a crash that never happened. It runs under the
    /// engine's lock, so it must not take it (lock-free loads are fine).
    pub(super) fn bypass_checkup(
        &mut self,
        header: &Header,
        awaited: &[usize],
        still_missing: &dyn Fn() -> bool,
    ) -> Result<()> {
        if self.aborted.load(Ordering::SeqCst) {
            return Err(Error::Aborted);
        }
        if let Some(culprit) = self.culprit {
            return Err(Error::PeerLost { rank: culprit });
        }
        if let Some(err) = &self.sticky {
            return Err(err.clone());
        }
        let verdict = ledger::with(&*self.ledger, |l| l.take_verdict(header.key()));
        if let Some(v) = verdict {
            return Err(v.error_for(self.me));
        }
        if let Some((p, msg)) = self.take_unexpected(header.key()) {
            return Err(self.declare(Verdict {
                header: *header,
                a: self.me,
                a_call: header.sig.to_string(),
                b: p,
                b_call: msg.header.sig.to_string(),
            }));
        }
        if let Some(&p) = awaited.iter().find(|&&p| self.peers[p].lost.is_some()) {
            if !still_missing() {
                // What the gone peer wrote before it left is here (or
                // another pass may get further): the call goes on, and a
                // later checkup decides if it still waits on a gone peer.
                // Declaring first would tell every rank of a crash, and
                // fail later calls here and elsewhere, for a clean exit.
                return Ok(());
            }
            // As `lose` does for an engine call that waits on it: a peer
            // gone (even with a goodbye) while a call still needs it is the
            // origin of the failure, and every rank is told so before this
            // rank's own exit makes it look like the culprit.
            let origin = self.culprit.or(self.origin).unwrap_or(p);
            self.crashed(origin);
            return Err(Error::PeerLost { rank: origin });
        }
        Ok(())
    }

    /// The error a bypass call `header` fails with for `fault`, after
    /// queueing the notice the engine would send.
    pub(super) fn bypass_fault(&mut self, header: &Header, fault: Fault) -> Error {
        match fault {
            Fault::Mismatch { peer, theirs } => self.declare(Verdict {
                header: *header,
                a: self.me,
                a_call: header.sig.to_string(),
                b: peer,
                b_call: theirs,
            }),
            Fault::Late { peer, key, theirs } => {
                self.late_mismatch_of(peer, key, theirs.clone());
                self.sticky.clone().unwrap_or_else(|| Error::Mismatch {
                    rank: self.me,
                    local: header.sig.to_string(),
                    peer,
                    remote: theirs,
                })
            }
            Fault::Reported(verdict) => verdict.error_for(self.me),
        }
    }
}
