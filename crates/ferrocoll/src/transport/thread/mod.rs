//! Ranks as threads of one process: zero-copy message passing.
//!
//! A send *posts* a pointer to the sender's bytes in the receiver's inbox and
//! the sender stays inside [`Transport::exchange`] until the receiver has
//! consumed it. The receiver hands the sender's memory straight to its sink,
//! so a ring step reduces directly from the neighbour's buffer: one pass over
//! the data, no intermediate copy. A waiting rank first yields its core a
//! few times (the peer is usually microseconds away), then sleeps on its
//! condition variable, woken by whatever concerns it (a post, a consumed
//! send, a verdict, a rank leaving, an abort) and at least every 50 ms:
//! never a busy spin, which oversubscribed machines (8 ranks on 2 cores)
//! need.
//!
//! The rules are the process transports' (`engine/`):
//!
//! - **Matching.** A message matches a receive by (source, [`Header::key`])
//!   in FIFO order. For point-to-point that key is the tag, so messages
//!   match by (source, tag) whatever their lengths and whatever collectives
//!   run around them; a matched pair whose signatures or lengths differ is
//!   a mismatch of those two ranks only.
//! - **Collective mismatches.** The rank that finds one (a message of
//!   another call, or a peer inside another call at the same point, which
//!   is how a reduce meets a broadcast when neither sends to the other)
//!   sends its verdict to every rank: the two that disagree fail with their
//!   own side first, any other rank with the detector's view; a rank that
//!   had finished that call fails its current and every later call on the
//!   communicator (sticky), one that has not reached it fails when it does.
//! - **Lost ranks.** A rank is gone once its last endpoint is dropped (its
//!   closure returned or unwound; clones and split communicators keep it)
//!   or [`ThreadFabric::mark_lost`] says so. A wait on a gone rank fails
//!   with [`Error::PeerLost`], and the first rank found gone (or the first
//!   that panicked) becomes the culprit: from then on every wait of every
//!   rank fails naming it, so ranks that waited on a rank that left after
//!   its own error name the origin, not the messenger, and nobody waits
//!   for the deadline.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::{Header, Incoming, Outgoing, Sink, Transport};
use crate::error::{Error, Result};

/// [`Header::key`]: identifies one call on one communicator.
type CallKey = (u64, u64);

/// Yields before the first sleep while waiting for a message; yielding (not
/// spinning) keeps oversubscribed ranks from starving the one they wait for.
const SPINS: u32 = 16;

/// Longest sleep between checks; what no wake-up announces (a peer entering
/// or ending a call) is noticed within this.
const POLL: Duration = Duration::from_millis(50);

/// Finished and failed collectives each rank remembers, to tell a verdict
/// or a message for a call it is done with from one it has not reached.
const KEPT: usize = 64;

/// [`ThreadFabric::culprit`] while no rank is known lost.
const NO_CULPRIT: usize = usize::MAX;

/// The shared state of all ranks of one in-process group.
pub struct ThreadFabric {
    ranks: Vec<Slot>,
    aborted: AtomicBool,
    /// Live endpoints ([`ThreadTransport`]s) per rank: the rank is gone
    /// when its count drops to zero.
    endpoints: Vec<AtomicUsize>,
    gone: Vec<AtomicBool>,
    /// How many ranks have left (so a wait knows to look at its peers
    /// again).
    departures: AtomicUsize,
    /// The first rank found gone by a wait on it, or the first that
    /// panicked ([`NO_CULPRIT`] until then); see the module documentation.
    culprit: AtomicUsize,
    /// Held while a verdict goes to every rank ([`ThreadFabric::publish`]):
    /// a rank that sees a peer gone waits for a delivery in progress, as the
    /// peer may have left because of a verdict that is on its way to this
    /// rank too, and then that verdict is the error, not the peer's absence.
    publishing: Mutex<()>,
}

/// One rank's state and the condition variable its waits sleep on.
struct Slot {
    state: Mutex<RankState>,
    wake: Condvar,
}

/// Everything about one rank that others read or write, under one lock.
/// A thread never holds two ranks' locks at once (the completion lock of a
/// post may be taken under a rank's lock, never the other way round).
#[derive(Default)]
struct RankState {
    /// Messages posted to this rank and not yet taken.
    posts: Vec<Post>,
    /// The collectives this rank is inside `exchange` for right now: a
    /// waiting peer compares them with its own, to tell "the rank is late"
    /// from "the rank called something else", which would otherwise
    /// deadlock when neither side sends first. Point-to-point calls are
    /// never here: they match only through their messages.
    active: Vec<Header>,
    /// Mismatch verdicts for calls this rank is in or has not reached.
    verdicts: Vec<(CallKey, Error)>,
    /// Per communicator: the verdict for a call this rank had finished,
    /// which fails every call on it from then on.
    sticky: Vec<(u64, Error)>,
    /// The last collectives this rank finished.
    finished: VecDeque<Header>,
    /// The last collectives that failed here (their verdicts are moot).
    failed: VecDeque<CallKey>,
    /// Per communicator: the highest collective sequence number this rank
    /// has entered.
    entered: Vec<(u64, u64)>,
    /// Bumped by every change a waiting thread of this rank must look at,
    /// so that one that checked before the change does not sleep through it.
    generation: u64,
}

impl RankState {
    /// The finished collective with `key`, if remembered.
    fn finished_call(&self, key: CallKey) -> Option<&Header> {
        self.finished.iter().find(|h| h.key() == key)
    }

    /// The sticky error of communicator `comm`, if it has one.
    fn sticky_for(&self, comm: u64) -> Option<&Error> {
        self.sticky.iter().find(|(c, _)| *c == comm).map(|(_, e)| e)
    }

    /// Removes and returns the verdict for the call with `key`.
    fn take_verdict(&mut self, key: CallKey) -> Option<Error> {
        let i = self.verdicts.iter().position(|(k, _)| *k == key)?;
        Some(self.verdicts.swap_remove(i).1)
    }

    /// The verdict or sticky error a call with `header` fails with, if any.
    fn fault_for(&mut self, header: &Header) -> Option<Error> {
        self.take_verdict(header.key())
            .or_else(|| self.sticky_for(header.comm).cloned())
    }

    /// Whether this rank has entered a collective after the one with `key`
    /// on its communicator.
    fn is_later_than(&self, key: CallKey) -> bool {
        self.entered
            .iter()
            .any(|&(comm, seq)| comm == key.0 && seq > key.1)
    }

    /// Records that this rank reached collective `header`.
    fn enter(&mut self, header: &Header) {
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

/// A posted message: a view of the sender's memory, valid until the sender's
/// [`Completion`] counts it done.
struct Post {
    src: usize,
    /// The rank it was posted to.
    dst: usize,
    header: Header,
    data: *const u8,
    len: usize,
    /// `None` once counted done ([`Post::finish`]). A post dropped while
    /// still `Some` (retracted by its sender, or dropped by a receiver that
    /// unwound) counts itself done on the way, so its sender never waits
    /// for it forever.
    done: Option<Arc<Completion>>,
}

// SAFETY: a `Post` is only a pointer and length into the sender's buffer
// plus shared bookkeeping. The sender keeps that buffer borrowed (it is inside
// `exchange`, which holds `&[u8]` for it) until the post is consumed or
// retracted (see `Posted::drop`), so moving the pointer to the receiving
// thread and reading through it there is sound.
unsafe impl Send for Post {}

impl Post {
    /// Whether this is one of the posts tracked by `done`.
    fn belongs_to(&self, done: &Arc<Completion>) -> bool {
        self.done.as_ref().is_some_and(|d| Arc::ptr_eq(d, done))
    }

    /// Counts the post consumed, with the receiver's verdict; the caller
    /// then wakes the sender (not here: the caller may hold a rank's lock).
    fn finish(mut self, failure: Option<Error>) {
        if let Some(done) = self.done.take() {
            done.finish_one(failure);
        }
    }
}

impl Drop for Post {
    fn drop(&mut self) {
        if let Some(done) = self.done.take() {
            done.finish_one(Some(Error::PeerLost { rank: self.dst }));
        }
    }
}

/// Tracks the sends of one `exchange` call.
struct Completion {
    state: Mutex<CompletionState>,
}

/// What [`Completion`] guards.
struct CompletionState {
    /// Posts not yet consumed (or retracted).
    pending: usize,
    /// Set by a receiver that rejected one of the posts.
    failure: Option<Error>,
}

impl Completion {
    /// Its state (usable after a panic elsewhere: consistent after every
    /// method).
    fn lock(&self) -> MutexGuard<'_, CompletionState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks one post consumed, with the receiver's verdict.
    fn finish_one(&self, failure: Option<Error>) {
        let mut st = self.lock();
        st.pending -= 1;
        if st.failure.is_none() {
            st.failure = failure;
        }
    }
}

impl ThreadFabric {
    /// A fabric for `n` ranks.
    pub fn new(n: usize) -> Arc<ThreadFabric> {
        Arc::new(ThreadFabric {
            ranks: (0..n)
                .map(|_| Slot {
                    state: Mutex::default(),
                    wake: Condvar::new(),
                })
                .collect(),
            aborted: AtomicBool::new(false),
            endpoints: (0..n).map(|_| AtomicUsize::new(0)).collect(),
            gone: (0..n).map(|_| AtomicBool::new(false)).collect(),
            departures: AtomicUsize::new(0),
            culprit: AtomicUsize::new(NO_CULPRIT),
            publishing: Mutex::new(()),
        })
    }

    /// An endpoint of `rank`. The rank counts as gone (and waits on it
    /// fail with [`Error::PeerLost`]) once every endpoint made for it is
    /// dropped.
    pub fn transport(self: &Arc<Self>, rank: usize) -> ThreadTransport {
        assert!(rank < self.ranks.len(), "rank out of range");
        self.endpoints[rank].fetch_add(1, Ordering::SeqCst);
        ThreadTransport {
            fabric: Arc::clone(self),
            rank,
        }
    }

    /// Records that `rank` is gone abnormally (its thread panicked): every
    /// wait on it fails with [`Error::PeerLost`], and it is the culprit
    /// unless a rank was found lost before.
    pub fn mark_lost(&self, rank: usize) {
        self.depart(rank, true);
    }

    /// Makes every current and future wait of every rank fail with
    /// [`Error::Aborted`].
    pub fn abort(&self) {
        self.aborted.store(true, Ordering::SeqCst);
        self.wake_all();
    }

    /// `rank` left: cleanly (its last endpoint was dropped) or not.
    fn depart(&self, rank: usize, crashed: bool) {
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
    fn lock(&self, rank: usize) -> MutexGuard<'_, RankState> {
        self.ranks[rank]
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Tells `rank`'s waiting threads that something changed.
    fn wake(&self, rank: usize) {
        let mut st = self.lock(rank);
        st.generation += 1;
        drop(st);
        self.ranks[rank].wake.notify_all();
    }

    /// [`ThreadFabric::wake`] for every rank (an abort, a rank gone, a
    /// culprit found).
    fn wake_all(&self) {
        for rank in 0..self.ranks.len() {
            self.wake(rank);
        }
    }

    /// What fails every wait now: an abort, or a known culprit.
    fn broken(&self) -> Option<Error> {
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
    fn lost(&self, peer: usize) -> Option<Error> {
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
    fn settle(&self) {
        drop(self.publishing.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// Sleeps until `rank`'s generation moves past `seen` or `slice` passes.
    fn sleep(&self, rank: usize, seen: u64, slice: Duration) {
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

    /// Sends rank `a`'s verdict on the collective with `key` (`a` called
    /// `a_call`, rank `b` called `b_call`) to every other rank: `b` gets it
    /// from its own side, any other rank as `a` saw it. Call it holding no
    /// rank's lock.
    ///
    /// The fabric does not know which ranks a communicator has: a rank
    /// outside it keeps the verdict unused, as it never makes that call.
    fn publish(&self, key: CallKey, a: usize, a_call: &str, b: usize, b_call: &str) {
        let _delivering = self.publishing.lock().unwrap_or_else(|e| e.into_inner());
        for r in (0..self.ranks.len()).filter(|&r| r != a) {
            let err = if r == b {
                mismatch(b, b_call, a, a_call)
            } else {
                mismatch(a, a_call, b, b_call)
            };
            let mut st = self.lock(r);
            if st.failed.contains(&key) {
                // That call already failed there: nothing left to fail.
                continue;
            }
            let inside = st.active.iter().any(|h| h.key() == key);
            if !inside && (st.finished_call(key).is_some() || st.is_later_than(key)) {
                // Its side of that point is over: the communicator is
                // broken there, for this and every later call.
                if st.sticky_for(key.0).is_none() {
                    st.sticky.push((key.0, err));
                }
            } else if !st.verdicts.iter().any(|(k, _)| *k == key) {
                st.verdicts.push((key, err));
            }
            st.generation += 1;
            drop(st);
            self.ranks[r].wake.notify_all();
        }
    }

    /// How `peer`'s side of collective `header` disagrees with `me`'s, if
    /// it visibly does: inside that call with another signature, or done
    /// with it although `me` still waits on `peer` in it. `ours` is set when
    /// `me` waits for `peer` to take one of its posts (tracked by `ours`)
    /// rather than for a message from `peer`: whether it still does is read
    /// here, under `peer`'s lock, as `peer` may have taken it, finished the
    /// call and moved on since the caller looked.
    fn compare(
        &self,
        me: usize,
        peer: usize,
        header: &Header,
        ours: Option<&Arc<Completion>>,
    ) -> Option<String> {
        let st = self.lock(peer);
        if let Some(theirs) = st.active.iter().find(|h| h.key() == header.key()) {
            return (theirs.sig != header.sig).then(|| theirs.sig.to_string());
        }
        let theirs = st.finished_call(header.key())?;
        if ours.is_some_and(|done| !st.posts.iter().any(|p| p.belongs_to(done))) {
            return None;
        }
        // A message from `peer` cannot be on its way: a sender finishes a
        // call only once its messages are taken.
        Some(if theirs.sig != header.sig {
            theirs.sig.to_string()
        } else {
            format!(
                "{} and ended it without the message rank {me} exchanges with it",
                theirs.sig
            )
        })
    }

    /// Whether `peer` is gone and so will never do what `me` waits for: send
    /// a message, or take the post tracked by `ours`. Gone is read first: a
    /// gone rank's inbox no longer changes, so a post still in it then was
    /// never taken.
    fn lost_while_awaited(&self, peer: usize, ours: Option<&Arc<Completion>>) -> bool {
        self.gone[peer].load(Ordering::SeqCst)
            && ours.map_or(true, |done| {
                self.lock(peer).posts.iter().any(|p| p.belongs_to(done))
            })
    }
}

/// A [`Error::Mismatch`] as rank `rank` reports it.
fn mismatch(rank: usize, local: &str, peer: usize, remote: &str) -> Error {
    Error::Mismatch {
        rank,
        local: local.to_string(),
        peer,
        remote: remote.to_string(),
    }
}

/// One rank's endpoint on a [`ThreadFabric`]. Dropping the last endpoint of
/// a rank makes it gone (see [`ThreadFabric::transport`]).
pub struct ThreadTransport {
    fabric: Arc<ThreadFabric>,
    rank: usize,
}

impl Drop for ThreadTransport {
    fn drop(&mut self) {
        if self.fabric.endpoints[self.rank].fetch_sub(1, Ordering::SeqCst) == 1 {
            // Dropped by unwinding: the rank failed, it did not finish.
            self.fabric.depart(self.rank, std::thread::panicking());
        }
    }
}

/// The posts of one exchange; dropping it (on success, error or unwinding)
/// retracts whatever a receiver has not taken and waits for what it is
/// reading, so no receiver can ever see a dangling pointer.
struct Posted<'a> {
    fabric: &'a ThreadFabric,
    rank: usize,
    done: Arc<Completion>,
    peers: Vec<usize>,
}

impl Posted<'_> {
    fn pending(&self) -> usize {
        self.done.lock().pending
    }
}

impl Drop for Posted<'_> {
    fn drop(&mut self) {
        if self.pending() == 0 {
            return;
        }
        for &peer in &self.peers {
            let retracted: Vec<Post> = {
                let mut st = self.fabric.lock(peer);
                let (mine, rest) = std::mem::take(&mut st.posts)
                    .into_iter()
                    .partition(|p| p.belongs_to(&self.done));
                st.posts = rest;
                mine
            };
            // Each counts itself done as it drops (outside the peer's lock).
            drop(retracted);
        }
        // What is left is being read right now; that finishes without
        // waiting on anything else, and the reader wakes this rank after.
        let mut st = self.fabric.lock(self.rank);
        while self.pending() > 0 {
            st = self.fabric.ranks[self.rank]
                .wake
                .wait_timeout(st, POLL)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// Registers a collective in [`RankState::active`] for the duration of an
/// `exchange`; point-to-point calls are not registered.
struct ActiveCall<'a> {
    fabric: &'a ThreadFabric,
    rank: usize,
    header: Option<Header>,
}

impl Drop for ActiveCall<'_> {
    fn drop(&mut self) {
        let Some(header) = self.header else { return };
        let mut st = self.fabric.lock(self.rank);
        if let Some(i) = st.active.iter().position(|h| *h == header) {
            st.active.swap_remove(i);
        }
    }
}

/// Whether `header` is a point-to-point message's.
fn is_p2p(header: &Header) -> bool {
    header.seq & Header::P2P_BIT != 0
}

/// A peer a waiting call depends on.
struct Awaited {
    peer: usize,
    /// For taking one of this call's posts (else for sending a message).
    to_take: bool,
}

impl ThreadTransport {
    /// The timeout of a wait on `peer` in `header`'s call; a point-to-point
    /// one carries its tag (without [`Header::P2P_BIT`]) as its number.
    fn timeout(&self, header: &Header, peer: usize, start: Instant) -> Error {
        Error::Timeout {
            collective: header.sig.to_string(),
            seq: header.seq & !Header::P2P_BIT,
            rank: self.rank,
            peer,
            waited: start.elapsed(),
            report: String::new(),
        }
    }

    /// Starts a call on this rank: fails it if a verdict, the sticky error
    /// of its communicator, an abort or a culprit already does, else
    /// registers it (collectives).
    fn enter(&self, header: &Header) -> Result<ActiveCall<'_>> {
        let mut st = self.fabric.lock(self.rank);
        if let Some(err) = st.fault_for(header) {
            return Err(err);
        }
        if let Some(err) = self.fabric.broken() {
            return Err(err);
        }
        let p2p = is_p2p(header);
        if !p2p {
            st.active.push(*header);
            st.enter(header);
        }
        Ok(ActiveCall {
            fabric: &self.fabric,
            rank: self.rank,
            header: (!p2p).then_some(*header),
        })
    }

    /// Records that collective `header` failed here: a verdict for it that
    /// comes later has nothing to fail.
    fn failed(&self, header: &Header) {
        if is_p2p(header) {
            return;
        }
        let mut st = self.fabric.lock(self.rank);
        st.verdicts.retain(|(k, _)| *k != header.key());
        st.failed.push_back(header.key());
        if st.failed.len() > KEPT {
            st.failed.pop_front();
        }
    }

    /// Posts every send, then takes and delivers every expected message and
    /// waits until every post is consumed.
    fn run_exchange(
        &self,
        header: &Header,
        sends: &[Outgoing<'_>],
        recvs: &[Incoming],
        sink: &mut dyn Sink,
        deadline: Instant,
    ) -> Result<()> {
        let start = Instant::now();
        let fabric = &*self.fabric;
        let posted = Posted {
            fabric,
            rank: self.rank,
            done: Arc::new(Completion {
                state: Mutex::new(CompletionState {
                    pending: sends.len(),
                    failure: None,
                }),
            }),
            peers: sends.iter().map(|s| s.peer).collect(),
        };
        for s in sends {
            let mut st = fabric.lock(s.peer);
            st.posts.push(Post {
                src: self.rank,
                dst: s.peer,
                header: *header,
                data: s.data.as_ptr(),
                len: s.data.len(),
                done: Some(Arc::clone(&posted.done)),
            });
            st.generation += 1;
            drop(st);
            fabric.ranks[s.peer].wake.notify_all();
        }
        let mut waiting: Vec<bool> = vec![true; recvs.len()];
        let mut remaining = recvs.len();
        let mut taken: Vec<(usize, Post)> = Vec::new();
        let mut spins = 0;
        // When the peers were last looked at, and how many ranks had left
        // then (see below).
        let mut checked: Option<(Instant, usize)> = None;
        loop {
            let seen = {
                let mut st = fabric.lock(self.rank);
                if let Some(err) = st.fault_for(header) {
                    return Err(err);
                }
                if remaining > 0 {
                    take_posts(&mut st.posts, header, recvs, &waiting, &mut taken);
                }
                st.generation
            };
            if !taken.is_empty() {
                let mut failed = None;
                for (i, post) in taken.drain(..) {
                    waiting[i] = false;
                    remaining -= 1;
                    if let Err(err) = self.consume(header, i, &recvs[i], post, sink) {
                        failed.get_or_insert(err);
                    }
                }
                if let Some(err) = failed {
                    return Err(err);
                }
                continue;
            }
            let pending = {
                let mut done = posted.done.lock();
                // A receiver rejected one of our messages: the call is over.
                if let Some(err) = done.failure.take() {
                    return Err(err);
                }
                done.pending
            };
            if remaining == 0 && pending == 0 {
                return Ok(());
            }
            if let Some(err) = fabric.broken() {
                // A verdict delivered meanwhile comes first: a culprit is
                // only named once the verdicts it may have left over are
                // delivered (see `check_peers`).
                return Err(fabric.lock(self.rank).fault_for(header).unwrap_or(err));
            }
            let now = Instant::now();
            let expired = now >= deadline;
            // Past the first yields (the peer was not just late), look at
            // what the peers are doing: at once, then when a rank left, else
            // once per POLL however often posts for other calls wake us
            // (each look locks every awaited peer; a mismatch shows within
            // POLL at worst, and is usually found at once by the rank that
            // entered its call second).
            let departures = fabric.departures.load(Ordering::SeqCst);
            let due = spins >= SPINS
                && checked.map_or(true, |(at, left)| {
                    left != departures || now.duration_since(at) >= POLL
                });
            if due || expired {
                let awaited = self.awaited(recvs, &waiting, &posted, pending);
                if due {
                    checked = Some((now, departures));
                    self.check_peers(header, &awaited, &posted.done)?;
                }
                if expired {
                    let peer = awaited.first().map_or(self.rank, |a| a.peer);
                    return Err(self.timeout(header, peer, start));
                }
            }
            if spins < SPINS {
                // Yield instead of sleeping at first: the sender is
                // usually a few microseconds away, and a futex sleep and
                // wake-up costs more than that.
                spins += 1;
                std::thread::yield_now();
                continue;
            }
            fabric.sleep(self.rank, seen, (deadline - now).min(POLL));
        }
    }

    /// The peers a call still waits on: those it expects a message from,
    /// then those that have not taken its messages.
    fn awaited(
        &self,
        recvs: &[Incoming],
        waiting: &[bool],
        posted: &Posted<'_>,
        pending: usize,
    ) -> Vec<Awaited> {
        let mut awaited: Vec<Awaited> = recvs
            .iter()
            .zip(waiting)
            .filter(|(_, w)| **w)
            .map(|(r, _)| Awaited {
                peer: r.peer,
                to_take: false,
            })
            .collect();
        if pending > 0 {
            for &p in &posted.peers {
                if awaited.iter().any(|a| a.peer == p) {
                    continue;
                }
                let untaken = self
                    .fabric
                    .lock(p)
                    .posts
                    .iter()
                    .any(|x| x.belongs_to(&posted.done));
                if untaken {
                    awaited.push(Awaited {
                        peer: p,
                        to_take: true,
                    });
                }
            }
        }
        awaited
    }

    /// Fails the call if a peer it waits on is inside another collective at
    /// this point, or ended this one without it (a mismatch: every rank is
    /// told), or is gone.
    fn check_peers(
        &self,
        header: &Header,
        awaited: &[Awaited],
        done: &Arc<Completion>,
    ) -> Result<()> {
        for a in awaited {
            let ours = a.to_take.then_some(done);
            if !is_p2p(header) {
                if let Some(theirs) = self.fabric.compare(self.rank, a.peer, header, ours) {
                    let local = header.sig.to_string();
                    self.fabric
                        .publish(header.key(), self.rank, &local, a.peer, &theirs);
                    return Err(mismatch(self.rank, &local, a.peer, &theirs));
                }
            }
            if self.fabric.lost_while_awaited(a.peer, ours) {
                // It may have left over a verdict that concerns this call
                // too: that verdict, once delivered, is the error.
                self.fabric.settle();
                let verdict = self.fabric.lock(self.rank).fault_for(header);
                if let Some(err) = verdict {
                    return Err(err);
                }
                if let Some(err) = self.fabric.lost(a.peer) {
                    return Err(err);
                }
            }
        }
        Ok(())
    }

    /// Checks a taken post against receive `index` and delivers it, or
    /// rejects it: a mismatch of this rank and the sender, which for a
    /// collective every rank is told of.
    fn consume(
        &self,
        header: &Header,
        index: usize,
        expected: &Incoming,
        post: Post,
        sink: &mut dyn Sink,
    ) -> Result<()> {
        let src = post.src;
        if post.header.sig == header.sig && post.len == expected.len {
            // SAFETY: the sender is blocked in `exchange` until `finish`
            // below (see `Post`; a retracting sender waits for posts being
            // read), so `data..data+len` is a live, initialised byte buffer
            // that nobody writes meanwhile: validated plans never receive
            // into memory that an in-flight send of the same round reads.
            let bytes = unsafe { std::slice::from_raw_parts(post.data, post.len) };
            sink.deliver(index, 0, bytes);
            post.finish(None);
            self.fabric.wake(src);
            return Ok(());
        }
        let local = header.sig.to_string();
        let remote = if post.header.sig != header.sig {
            post.header.sig.to_string()
        } else {
            format!(
                "{} with a message of {} bytes where {} were expected",
                post.header.sig, post.len, expected.len
            )
        };
        if !is_p2p(header) {
            // Everyone first, so that no rank can leave (and be taken for
            // lost) before the others know why.
            self.fabric
                .publish(header.key(), self.rank, &local, src, &remote);
        }
        post.finish(Some(mismatch(src, &remote, self.rank, &local)));
        self.fabric.wake(src);
        Err(mismatch(self.rank, &local, src, &remote))
    }
}

/// Moves into `taken` the posts that the receives still `waiting` take now:
/// FIFO per source, so only the first waiting receive from a source may
/// take that source's first post of this call.
fn take_posts(
    posts: &mut Vec<Post>,
    header: &Header,
    recvs: &[Incoming],
    waiting: &[bool],
    taken: &mut Vec<(usize, Post)>,
) {
    let mut seen_src: Vec<usize> = Vec::new();
    for (i, rv) in recvs.iter().enumerate() {
        if !waiting[i] || seen_src.contains(&rv.peer) {
            continue;
        }
        seen_src.push(rv.peer);
        if let Some(at) = posts
            .iter()
            .position(|p| p.src == rv.peer && p.header.key() == header.key())
        {
            taken.push((i, posts.remove(at)));
        }
    }
}

impl Transport for ThreadTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.fabric.ranks.len()
    }

    fn exchange(
        &self,
        header: &Header,
        sends: &[Outgoing<'_>],
        recvs: &[Incoming],
        sink: &mut dyn Sink,
        deadline: Instant,
    ) -> Result<()> {
        let result = self
            .enter(header)
            .and_then(|_active| self.run_exchange(header, sends, recvs, sink, deadline));
        if result.is_err() {
            self.failed(header);
        }
        result
    }

    /// Waits for the first post under `header`'s tag from any rank, then
    /// receives it as from that rank. (Two threads of one rank receiving
    /// from any source under the same tag at once may both pick one sender;
    /// one then waits for that sender's next message.)
    fn recv_any(
        &self,
        header: &Header,
        len: usize,
        sink: &mut dyn Sink,
        deadline: Instant,
    ) -> Result<usize> {
        let start = Instant::now();
        let _active = self.enter(header)?;
        let fabric = &*self.fabric;
        let src = loop {
            let seen = {
                let mut st = fabric.lock(self.rank);
                if let Some(err) = st.fault_for(header) {
                    return Err(err);
                }
                if let Some(p) = st.posts.iter().find(|p| p.header.key() == header.key()) {
                    break p.src;
                }
                st.generation
            };
            if let Some(err) = fabric.broken() {
                return Err(err);
            }
            // Nobody left who could send.
            let others = (0..self.size()).filter(|&p| p != self.rank);
            if let Some(last) = others.clone().next_back() {
                if others
                    .clone()
                    .all(|p| fabric.gone[p].load(Ordering::SeqCst))
                {
                    return Err(fabric.lost(last).unwrap_or(Error::PeerLost { rank: last }));
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(self.timeout(header, self.rank, start));
            }
            fabric.sleep(self.rank, seen, (deadline - now).min(POLL));
        };
        let recvs = [Incoming { peer: src, len }];
        self.run_exchange(header, &[], &recvs, sink, deadline)
            .map(|()| src)
    }

    /// Fails the call if a verdict came for it or its communicator is
    /// broken, or if a message of it is still unclaimed: its sender called
    /// something else here (a late mismatch, told to every rank).
    fn end_call(&self, header: &Header) -> Result<()> {
        let unclaimed: Vec<Post> = {
            let mut st = self.fabric.lock(self.rank);
            if let Some(err) = st.fault_for(header) {
                drop(st);
                self.failed(header);
                return Err(err);
            }
            st.enter(header);
            let (stray, rest) = std::mem::take(&mut st.posts)
                .into_iter()
                .partition(|p| p.header.key() == header.key());
            st.posts = rest;
            if stray.is_empty() {
                st.finished.push_back(*header);
                if st.finished.len() > KEPT {
                    st.finished.pop_front();
                }
                return Ok(());
            }
            stray
        };
        let local = header.sig.to_string();
        let describe = |p: &Post| {
            if p.header.sig != header.sig {
                p.header.sig.to_string()
            } else {
                format!(
                    "{} with a message of {} bytes where none was expected",
                    p.header.sig, p.len
                )
            }
        };
        let first = (unclaimed[0].src, describe(&unclaimed[0]));
        self.fabric
            .publish(header.key(), self.rank, &local, first.0, &first.1);
        for post in unclaimed {
            let (src, remote) = (post.src, describe(&post));
            post.finish(Some(mismatch(src, &remote, self.rank, &local)));
            self.fabric.wake(src);
        }
        self.failed(header);
        Err(mismatch(self.rank, &local, first.0, &first.1))
    }

    fn abort(&self) {
        self.fabric.abort();
    }

    fn name(&self) -> &'static str {
        "thread"
    }

    /// Read straight from each rank's state: threads need not answer.
    fn positions(&self, comm: u64, ranks: &[usize], _within: Duration) -> Vec<Option<String>> {
        let describe = |h: &Header| format!("{} #{}", h.sig, h.seq);
        ranks
            .iter()
            .map(|&r| {
                if r >= self.size() {
                    return None;
                }
                if self.fabric.gone[r].load(Ordering::SeqCst) {
                    return Some("gone".to_string());
                }
                let st = self.fabric.lock(r);
                let running: Vec<String> = st
                    .active
                    .iter()
                    .filter(|h| h.comm == comm)
                    .map(|h| format!("in {}", describe(h)))
                    .collect();
                if !running.is_empty() {
                    return Some(running.join(", "));
                }
                Some(match st.finished.iter().rev().find(|h| h.comm == comm) {
                    Some(h) => format!(
                        "in no collective on this communicator; last finished {}",
                        describe(h)
                    ),
                    None => "in no collective on this communicator; finished none yet".to_string(),
                })
            })
            .collect()
    }
}
