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

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::verdict::Verdict;
use crate::transport::Header;

/// Collectives finished by this rank that are remembered, so that a message
/// for one of them arriving later is recognised as a mismatch.
const FINISHED_KEPT: usize = 64;

/// The last [`FINISHED_KEPT`] finished calls, the oldest overwritten
/// first: a ring in a vector, which every tiny fast call adds to (a
/// `VecDeque`'s push and pop took ~40 instructions of a ~900-instruction
/// call).
#[derive(Default)]
struct Recent {
    /// At most `FINISHED_KEPT`; the newest at `next - 1` (wrapping).
    calls: Vec<Header>,
    /// Where the next call goes.
    next: usize,
}

impl Recent {
    fn push(&mut self, header: Header) {
        if self.calls.len() < FINISHED_KEPT {
            self.calls.push(header);
        } else {
            self.calls[self.next] = header;
        }
        self.next = (self.next + 1) % FINISHED_KEPT;
    }

    /// The calls kept, the newest first.
    fn newest_first(&self) -> impl Iterator<Item = &Header> {
        // Before `next`: the newest, in order; from it on (once full): the
        // oldest, in order.
        let (newer, older) = self.calls.split_at(self.next.min(self.calls.len()));
        newer.iter().rev().chain(older.iter().rev())
    }
}

/// Finished calls and reported mismatches (see the module documentation).
pub(crate) struct Ledger {
    /// The last collectives this rank finished, on either path: a message
    /// for one of them arriving later was sent by a peer that called
    /// something else.
    finished: Recent,
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
            finished: Recent::default(),
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
        self.finished.push(*header);
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
        self.finished
            .newest_first()
            .find(|h| h.key() == key)
            .copied()
    }

    /// The last collective this rank finished on communicator `comm`, if
    /// remembered.
    pub(crate) fn last_finished(&self, comm: u64) -> Option<Header> {
        self.finished
            .newest_first()
            .find(|h| h.comm == comm)
            .copied()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Collective;
    use crate::transport::{CallKind, Signature};
    use crate::types::{DType, ReduceOp};

    fn header(comm: u64, seq: u64) -> Header {
        Header {
            comm,
            seq,
            sig: Signature {
                kind: CallKind::Collective(Collective::AllReduce),
                dtype: DType::F32,
                op: Some(ReduceOp::Sum),
                count: 1,
                root: None,
            },
        }
    }

    #[test]
    fn finished_calls_are_kept_newest_first_up_to_the_limit() {
        let mut ledger = Ledger::new();
        assert_eq!(ledger.last_finished(1), None);
        // Past the limit, twice around the ring, on two communicators.
        for seq in 1..=(2 * FINISHED_KEPT as u64 + 5) {
            ledger.finish(&header(seq % 2, seq));
            assert_eq!(ledger.last_finished(seq % 2), Some(header(seq % 2, seq)));
            let oldest = seq.saturating_sub(FINISHED_KEPT as u64 - 1).max(1);
            assert!(
                ledger.finished_with((oldest % 2, oldest)).is_some(),
                "{seq}"
            );
            if oldest > 1 {
                let gone = oldest - 1;
                assert!(ledger.finished_with((gone % 2, gone)).is_none(), "{seq}");
            }
        }
        // The newest on the other communicator is the one before the last.
        let last = 2 * FINISHED_KEPT as u64 + 5;
        assert_eq!(
            ledger.last_finished((last - 1) % 2),
            Some(header((last - 1) % 2, last - 1))
        );
    }
}
