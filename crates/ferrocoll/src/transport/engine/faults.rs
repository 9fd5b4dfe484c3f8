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
use crate::error::{Error, Result};
use crate::transport::wire::{Frame, FrameKind};
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
    /// `peer` already reported a mismatch for this call.
    Reported { peer: usize, theirs: Header },
}

/// A mismatch notice for our call `ours`.
pub(super) fn mismatch_notice(ours: &Header) -> [u8; crate::transport::wire::HEADER_BYTES] {
    Frame {
        kind: FrameKind::Mismatch,
        header: *ours,
        len: 0,
        addr: 0,
        region: 0,
    }
    .encode()
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
        for (id, call) in self.calls.iter_mut().enumerate() {
            let Some(call) = call else { continue };
            let waits = call.recvs.iter().any(|r| r.peer == peer && !r.done);
            if waits || sending.contains(&id) {
                call.error.get_or_insert(Error::PeerLost { rank: peer });
            }
        }
        if !self.peers[peer].said_bye {
            self.crashed(peer);
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
        let err = Error::Mismatch {
            rank: self.me,
            local: ours.sig.to_string(),
            peer,
            remote,
        };
        self.fail_all(&err);
        self.set_sticky(err);
        push_between_frames(&mut self.peers[peer].sendq, &mismatch_notice(&ours));
        true
    }

    /// Peer `peer` found that its call `theirs` and ours at the same point
    /// differ: fail ours (now, or when this rank gets there).
    pub(super) fn mismatch_reported(&mut self, peer: usize, theirs: Header) {
        let ours = self
            .calls
            .iter_mut()
            .flatten()
            .find(|c| c.header.key() == theirs.key());
        match ours {
            Some(c) => {
                c.error.get_or_insert(Error::Mismatch {
                    rank: self.me,
                    local: c.header.sig.to_string(),
                    peer,
                    remote: theirs.sig.to_string(),
                });
            }
            None => {
                // Under one lock: a verdict kept must not miss the call
                // finishing meanwhile.
                let finished = ledger::with(&*self.ledger, |l| {
                    let ours = l.finished_with(theirs.key());
                    if ours.is_none() {
                        // Not there yet (or a bypass call in flight, which
                        // looks at the verdicts before it ends).
                        l.add_verdict(peer, theirs);
                    }
                    ours
                });
                // Our side of that point is over: the communicator is
                // broken from here, for every call.
                if let Some(ours) = finished {
                    let err = Error::Mismatch {
                        rank: self.me,
                        local: ours.sig.to_string(),
                        peer,
                        remote: theirs.sig.to_string(),
                    };
                    self.fail_all(&err);
                    self.set_sticky(err);
                }
            }
        }
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
        self.fail_all(&Error::PeerLost { rank: culprit });
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

    /// Tells `peer` that its call at the point of our call `ours` differs.
    pub(super) fn notify_mismatch(&mut self, peer: usize, ours: &Header) {
        if self.peers[peer].lost.is_some() || !self.peers[peer].connected {
            return;
        }
        push_between_frames(&mut self.peers[peer].sendq, &mismatch_notice(ours));
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
                    c.error.get_or_insert(Error::Mismatch {
                        rank: self.me,
                        local: c.header.sig.to_string(),
                        peer: f.peer,
                        remote,
                    });
                    let ours = c.header;
                    self.notify_mismatch(f.peer, &ours);
                }
                None => {
                    self.late_mismatch_of(f.peer, f.key, remote);
                }
            }
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
                peer.sendq
                    .push_back(Outbound::header_only(None, bye.clone(), None));
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
    /// `awaited`.
    pub(super) fn bypass_checkup(&mut self, header: &Header, awaited: &[usize]) -> Result<()> {
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
        if let Some((peer, theirs)) = verdict {
            return Err(Error::Mismatch {
                rank: self.me,
                local: header.sig.to_string(),
                peer,
                remote: theirs.sig.to_string(),
            });
        }
        if let Some((p, msg)) = self.take_unexpected(header.key()) {
            self.notify_mismatch(p, header);
            return Err(Error::Mismatch {
                rank: self.me,
                local: header.sig.to_string(),
                peer: p,
                remote: msg.header.sig.to_string(),
            });
        }
        if let Some(&p) = awaited.iter().find(|&&p| self.peers[p].lost.is_some()) {
            return Err(Error::PeerLost { rank: p });
        }
        Ok(())
    }

    /// The error a bypass call `header` fails with for `fault`, after
    /// queueing the notice the engine would send.
    pub(super) fn bypass_fault(&mut self, header: &Header, fault: Fault) -> Error {
        match fault {
            Fault::Mismatch { peer, theirs } => {
                self.notify_mismatch(peer, header);
                Error::Mismatch {
                    rank: self.me,
                    local: header.sig.to_string(),
                    peer,
                    remote: theirs,
                }
            }
            Fault::Late { peer, key, theirs } => {
                self.late_mismatch_of(peer, key, theirs.clone());
                self.sticky.clone().unwrap_or_else(|| Error::Mismatch {
                    rank: self.me,
                    local: header.sig.to_string(),
                    peer,
                    remote: theirs,
                })
            }
            Fault::Reported { peer, theirs } => Error::Mismatch {
                rank: self.me,
                local: header.sig.to_string(),
                peer,
                remote: theirs.sig.to_string(),
            },
        }
    }
}
