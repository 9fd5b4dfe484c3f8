//! The ledger: the calls this rank finished and the mismatches peers
//! reported for calls it has not reached yet.
//!
//! Both paths of a call need it (the engine's channels and a bypass such as
//! the shared-memory fast path): a message for a finished call is a late
//! mismatch whichever path it came by, and a verdict must fail the call
//! whichever path it takes. So the ledger sits behind one lock that the
//! engine reaches through [`LedgerLock`]: a plain mutex when the engine
//! runs alone, the bypass's own lock (beside its books, so that its hot
//! path takes one lock per pass, not two) when it has one. The engine takes
//! it while holding its own state; the bypass never takes the engine's
//! state while holding it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::verdict::Verdict;
use crate::transport::Header;

/// Collectives finished by this rank that are remembered, so that a message
/// for one of them arriving later is recognised as a mismatch.
const FINISHED_KEPT: usize = 64;

/// Finished calls and reported mismatches (see the module documentation).
pub(crate) struct Ledger {
    /// The last collectives this rank finished, on either path: a message
    /// for one of them arriving later was sent by a peer that called
    /// something else.
    finished: VecDeque<Header>,
    /// Mismatches peers reported for calls this rank has not reached yet.
    verdicts: Vec<Verdict>,
    /// Calls of a bypass that have waited long enough to sleep: the
    /// engine, which does not run them, names them when a peer asks where
    /// this rank is.
    bypass_waiting: Vec<Header>,
    /// The last call finished here took the bypass.
    bypass_finished_last: bool,
    /// Calls that ended in a timeout, with the (world) ranks they still
    /// waited for. The report that follows a timeout asks every rank where
    /// it is, and a rank whose own call timed out at about the same moment
    /// (every rank of a stuck call has the same deadline) answers while it
    /// gathers its own report, its call already over: from here, "in
    /// allreduce #27 (timed out waiting for world rank 2)", not "in no
    /// call". Kept until a later call on the communicator finishes.
    timed_out: Vec<(Header, Vec<usize>)>,
    /// `verdicts.len()`, readable without the lock ([`Ledger::verdicts_hint`]).
    verdict_count: Arc<AtomicUsize>,
}

impl Default for Ledger {
    fn default() -> Ledger {
        Ledger::new()
    }
}

impl Ledger {
    /// An empty ledger.
    pub(crate) fn new() -> Ledger {
        Ledger {
            finished: VecDeque::new(),
            verdicts: Vec::new(),
            bypass_waiting: Vec::new(),
            bypass_finished_last: false,
            timed_out: Vec::new(),
            verdict_count: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Records that this rank finished the collective `header` on the
    /// engine.
    pub(crate) fn finish(&mut self, header: &Header) {
        self.finished.push_back(*header);
        if self.finished.len() > FINISHED_KEPT {
            self.finished.pop_front();
        }
        self.bypass_finished_last = false;
        if !self.timed_out.is_empty() {
            self.timed_out.retain(|(h, _)| h.comm != header.comm);
        }
    }

    /// Call `header` (on either path) ended in a timeout while waiting for
    /// `waiting` (see `timed_out`).
    pub(crate) fn time_out(&mut self, header: Header, waiting: Vec<usize>) {
        self.timed_out.retain(|(h, _)| h.key() != header.key());
        self.timed_out.push((header, waiting));
    }

    /// The calls on communicator `comm` that ended in a timeout since the
    /// last one on it finished, with whom they waited for.
    pub(crate) fn timed_out_on(&self, comm: u64) -> Vec<(Header, Vec<usize>)> {
        self.timed_out
            .iter()
            .filter(|(h, _)| h.comm == comm)
            .cloned()
            .collect()
    }

    /// Records that this rank finished the collective `header` on the
    /// bypass.
    pub(crate) fn finish_on_bypass(&mut self, header: &Header) {
        self.finish(header);
        self.bypass_finished_last = true;
    }

    /// Whether the last call this rank finished took the bypass (then a
    /// bypass call has nothing of a finished engine call to look for before
    /// it writes; see `fastpath::FastPath::pass`).
    pub(crate) fn bypass_finished_last(&self) -> bool {
        self.bypass_finished_last
    }

    /// The finished call with `key`, if remembered.
    pub(crate) fn finished_with(&self, key: (u64, u64)) -> Option<Header> {
        self.finished.iter().find(|h| h.key() == key).copied()
    }

    /// The last collective this rank finished on communicator `comm`, if
    /// remembered.
    pub(crate) fn last_finished(&self, comm: u64) -> Option<Header> {
        self.finished.iter().rev().find(|h| h.comm == comm).copied()
    }

    /// A bypass call `header` waits long (see `bypass_waiting`).
    pub(crate) fn bypass_waits(&mut self, header: Header) {
        self.bypass_waiting.push(header);
    }

    /// The bypass call with `key` is over.
    pub(crate) fn bypass_done(&mut self, key: (u64, u64)) {
        self.bypass_waiting.retain(|h| h.key() != key);
    }

    /// The bypass calls on communicator `comm` that wait long.
    pub(crate) fn bypass_waiting(&self, comm: u64) -> Vec<Header> {
        self.bypass_waiting
            .iter()
            .filter(|h| h.comm == comm)
            .copied()
            .collect()
    }

    /// Whether a peer reported any mismatch not taken yet.
    pub(crate) fn has_verdicts(&self) -> bool {
        !self.verdicts.is_empty()
    }

    /// Removes and returns the mismatch a peer reported for `key`.
    pub(crate) fn take_verdict(&mut self, key: (u64, u64)) -> Option<Verdict> {
        let at = self.verdicts.iter().position(|v| v.key() == key)?;
        self.verdict_count.fetch_sub(1, Ordering::Relaxed);
        Some(self.verdicts.swap_remove(at))
    }

    /// Keeps a verdict a peer reported for a call this rank has not
    /// reached yet.
    pub(crate) fn add_verdict(&mut self, verdict: Verdict) {
        self.verdicts.push(verdict);
        self.verdict_count.fetch_add(1, Ordering::Relaxed);
    }

    /// The number of kept verdicts, to read without the ledger's lock: the
    /// engine, which adds verdicts only under its own lock, skips the
    /// ledger when it holds that lock and this reads 0.
    pub(crate) fn verdicts_hint(&self) -> Arc<AtomicUsize> {
        Arc::clone(&self.verdict_count)
    }
}

/// Where the ledger lives: the engine reaches it only through this.
pub(crate) trait LedgerLock: Send + Sync {
    /// Runs `f` on the ledger, under its lock.
    fn with_ledger(&self, f: &mut dyn FnMut(&mut Ledger));
}

impl LedgerLock for Mutex<Ledger> {
    fn with_ledger(&self, f: &mut dyn FnMut(&mut Ledger)) {
        // A panic while it was held leaves it usable: its contents are
        // consistent after every method.
        f(&mut self.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Runs `f` on the ledger behind `lock` and returns what it returns.
pub(crate) fn with<R>(lock: &dyn LedgerLock, f: impl FnOnce(&mut Ledger) -> R) -> R {
    let mut f = Some(f);
    let mut out = None;
    lock.with_ledger(&mut |l| out = f.take().map(|f| f(l)));
    out.expect("with_ledger runs its closure once")
}
