//! One rank's state and the fabric's bookkeeping around it: its lock,
//! sleeping and waking, and the ranks that left (departures and the
//! culprit; see the module documentation of [`super`]).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use super::posts::{Completion, Post};
use super::ThreadFabric;
use crate::error::Error;
use crate::transport::Header;

/// [`Header::key`]: identifies one call on one communicator.
pub(super) type CallKey = (u64, u64);

/// Finished and failed collectives each rank remembers, to tell a verdict
/// or a message for a call it is done with from one it has not reached.
pub(super) const KEPT: usize = 64;

/// [`ThreadFabric::culprit`] while no rank is known lost.
pub(super) const NO_CULPRIT: usize = usize::MAX;

/// One rank's state and the condition variable its waits sleep on.
pub(super) struct Slot {
    pub(super) state: Mutex<RankState>,
    pub(super) wake: Condvar,
}

/// Everything about one rank that others read or write, under one lock.
/// A thread never holds two ranks' locks at once (the completion lock of a
/// post may be taken under a rank's lock, never the other way round).
#[derive(Default)]
pub(super) struct RankState {
    /// Messages posted to this rank and not yet taken.
    pub(super) posts: Vec<Post>,
    /// The collectives this rank is inside `exchange` for right now: a
    /// waiting peer compares them with its own, to tell "the rank is late"
    /// from "the rank called something else", which would otherwise
    /// deadlock when neither side sends first. Point-to-point calls are
    /// never here: they match only through their messages.
    pub(super) active: Vec<Header>,
    /// Mismatch verdicts for calls this rank is in or has not reached.
    pub(super) verdicts: Vec<(CallKey, Error)>,
    /// Per communicator: the verdict for a call this rank had finished,
    /// which fails every call on it from then on.
    pub(super) sticky: Vec<(u64, Error)>,
    /// The last collectives this rank finished.
    pub(super) finished: VecDeque<Header>,
    /// The last collectives that failed here (their verdicts are moot).
    pub(super) failed: VecDeque<CallKey>,
    /// Per communicator: the highest collective sequence number this rank
    /// has entered.
    entered: Vec<(u64, u64)>,
    /// Bumped by every change a waiting thread of this rank must look at,
    /// so that one that checked before the change does not sleep through it.
    pub(super) generation: u64,
}

impl RankState {
    /// The finished collective with `key`, if remembered.
    pub(super) fn finished_call(&self, key: CallKey) -> Option<&Header> {
        self.finished.iter().find(|h| h.key() == key)
    }

    /// The sticky error of communicator `comm`, if it has one.
    pub(super) fn sticky_for(&self, comm: u64) -> Option<&Error> {
        self.sticky.iter().find(|(c, _)| *c == comm).map(|(_, e)| e)
    }

    /// Removes and returns the verdict for the call with `key`.
    fn take_verdict(&mut self, key: CallKey) -> Option<Error> {
        let i = self.verdicts.iter().position(|(k, _)| *k == key)?;
        Some(self.verdicts.swap_remove(i).1)
    }

    /// The verdict or sticky error a call with `header` fails with, if any.
    pub(super) fn fault_for(&mut self, header: &Header) -> Option<Error> {
        self.take_verdict(header.key())
            .or_else(|| self.sticky_for(header.comm).cloned())
    }

    /// Whether this rank has entered a collective after the one with `key`
    /// on its communicator.
    pub(super) fn is_later_than(&self, key: CallKey) -> bool {
        self.entered
            .iter()
            .any(|&(comm, seq)| comm == key.0 && seq > key.1)
    }

    /// Records that this rank reached collective `header`.
    pub(super) fn enter(&mut self, header: &Header) {
        match self
            .entered
            .iter_mut()
            .find(|(comm, _)| *comm == header.comm)
        {
            Some((_, seq)) => *seq = (*seq).max(header.seq),
            None => self.entered.push((header.comm, header.seq)),
        }
    }
}

impl ThreadFabric {
    /// `rank` left: cleanly (its last endpoint was dropped) or not.
    pub(super) fn depart(&self, rank: usize, crashed: bool) {
        if !self.gone[rank].swap(true, Ordering::SeqCst) {
            self.departures.fetch_add(1, Ordering::SeqCst);
        }
        if crashed {
            let _ =
                self.culprit
                    .compare_exchange(NO_CULPRIT, rank, Ordering::SeqCst, Ordering::SeqCst);
        }
        self.wake_all();
    }

    /// `rank`'s state. A panic while it was held leaves it usable: it is
    /// consistent between statements that change it.
    pub(super) fn lock(&self, rank: usize) -> MutexGuard<'_, RankState> {
        self.ranks[rank]
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Tells `rank`'s waiting threads that something changed.
    pub(super) fn wake(&self, rank: usize) {
        let mut st = self.lock(rank);
        st.generation += 1;
        drop(st);
        self.ranks[rank].wake.notify_all();
    }

    /// [`ThreadFabric::wake`] for every rank (an abort, a rank gone, a
    /// culprit found).
    pub(super) fn wake_all(&self) {
        for rank in 0..self.ranks.len() {
            self.wake(rank);
        }
    }

    /// What fails every wait now: an abort, or a known culprit.
    pub(super) fn broken(&self) -> Option<Error> {
        if self.aborted.load(Ordering::SeqCst) {
            return Some(Error::Aborted);
        }
        match self.culprit.load(Ordering::SeqCst) {
            NO_CULPRIT => None,
            rank => Some(Error::PeerLost { rank }),
        }
    }

    /// The error of a wait on `peer` if it is gone: it names the culprit,
    /// which `peer` becomes if none is known yet (then every other wait is
    /// woken to fail with it too). Call it holding no rank's lock.
    pub(super) fn lost(&self, peer: usize) -> Option<Error> {
        if !self.gone[peer].load(Ordering::SeqCst) {
            return None;
        }
        let first = self
            .culprit
            .compare_exchange(NO_CULPRIT, peer, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok();
        if first {
            self.wake_all();
        }
        Some(Error::PeerLost {
            rank: self.culprit.load(Ordering::SeqCst),
        })
    }

    /// Returns once no verdict is being delivered (see
    /// [`ThreadFabric::publishing`]).
    pub(super) fn settle(&self) {
        drop(self.publishing.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// Sleeps until `rank`'s generation moves past `seen` or `slice` passes.
    pub(super) fn sleep(&self, rank: usize, seen: u64, slice: Duration) {
        let st = self.lock(rank);
        if st.generation == seen {
            drop(
                self.ranks[rank]
                    .wake
                    .wait_timeout(st, slice)
                    .unwrap_or_else(|e| e.into_inner()),
            );
        }
    }

    /// Whether `peer` is gone and so will never do what `me` waits for: send
    /// a message, or take the post tracked by `ours`. Gone is read first: a
    /// gone rank's inbox no longer changes, so a post still in it then was
    /// never taken.
    pub(super) fn lost_while_awaited(&self, peer: usize, ours: Option<&Arc<Completion>>) -> bool {
        self.gone[peer].load(Ordering::SeqCst)
            && ours.map_or(true, |done| {
                self.lock(peer).posts.iter().any(|p| p.belongs_to(done))
            })
    }
}
