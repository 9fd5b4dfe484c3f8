//! Ranks as threads of one process: zero-copy message passing.
//!
//! A send *posts* a pointer to the sender's bytes in the receiver's inbox and
//! the sender stays inside [`Transport::exchange`] until the receiver has
//! consumed it. The receiver hands the sender's memory straight to its sink,
//! so a ring step reduces directly from the neighbour's buffer: one pass over
//! the data, no intermediate copy. A waiting rank first yields its core a
//! few times (the peer is usually microseconds away), then sleeps on a
//! condition variable, waking at least every 50 ms to notice aborts and lost
//! peers: never a busy spin, which oversubscribed machines (8 ranks on 2
//! cores) need.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::{Header, Incoming, Outgoing, Sink, Transport};
use crate::error::{Error, Result};

/// [`Header::key`]: identifies one call on one communicator.
type CallKey = (u64, u64);

/// Yields before the first sleep while waiting for a message; yielding (not
/// spinning) keeps oversubscribed ranks from starving the one they wait for.
const SPINS: u32 = 16;

/// Longest sleep between checks for abort and lost peers.
const POLL: Duration = Duration::from_millis(50);

/// The shared state of all ranks of one in-process group.
pub struct ThreadFabric {
    inboxes: Vec<Inbox>,
    /// The calls each rank is inside `exchange` for right now: a rank stuck
    /// waiting looks here to tell "the peer is late" from "the peer called
    /// something else", which would otherwise deadlock silently when neither
    /// side sends first.
    active: Vec<Mutex<Vec<Header>>>,
    /// Verdicts left for a rank by a peer that found its call mismatched
    /// (keyed by the call), so both sides fail even if one leaves first.
    verdicts: Vec<Mutex<Vec<(CallKey, Error)>>>,
    aborted: AtomicBool,
    lost: Vec<AtomicBool>,
}

/// Messages posted to one rank and not yet taken.
#[derive(Default)]
struct Inbox {
    posts: Mutex<Vec<Post>>,
    arrived: Condvar,
}

/// A posted message: a view of the sender's memory, valid until the sender's
/// [`Completion`] counts it done.
struct Post {
    src: usize,
    header: Header,
    data: *const u8,
    len: usize,
    done: Arc<Completion>,
}

// SAFETY: a `Post` is only a pointer and length into the sender's buffer
// plus shared bookkeeping. The sender keeps that buffer borrowed (it is inside
// `exchange`, which holds `&[u8]` for it) until the post is consumed or
// retracted (see `Posted::drop`), so moving the pointer to the receiving
// thread and reading through it there is sound.
unsafe impl Send for Post {}

/// Tracks the sends of one `exchange` call.
struct Completion {
    state: Mutex<CompletionState>,
    changed: Condvar,
}

struct CompletionState {
    /// Posts not yet consumed (or retracted).
    pending: usize,
    /// Set by a receiver that rejected one of the posts.
    failure: Option<Error>,
}

impl Completion {
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
        self.changed.notify_all();
    }
}

impl ThreadFabric {
    /// A fabric for `n` ranks.
    pub fn new(n: usize) -> Arc<ThreadFabric> {
        Arc::new(ThreadFabric {
            inboxes: (0..n).map(|_| Inbox::default()).collect(),
            active: (0..n).map(|_| Mutex::new(Vec::new())).collect(),
            verdicts: (0..n).map(|_| Mutex::new(Vec::new())).collect(),
            aborted: AtomicBool::new(false),
            lost: (0..n).map(|_| AtomicBool::new(false)).collect(),
        })
    }

    /// The transport endpoint of `rank`.
    pub fn transport(self: &Arc<Self>, rank: usize) -> ThreadTransport {
        assert!(rank < self.inboxes.len(), "rank out of range");
        ThreadTransport {
            fabric: Arc::clone(self),
            rank,
        }
    }

    /// Records that `rank` is gone (its thread panicked): every wait on it
    /// fails with [`Error::PeerLost`].
    pub fn mark_lost(&self, rank: usize) {
        self.lost[rank].store(true, Ordering::SeqCst);
        self.wake_all();
    }

    fn wake_all(&self) {
        for inbox in &self.inboxes {
            let _guard = inbox.lock();
            inbox.arrived.notify_all();
        }
    }

    /// `Err` if the fabric was aborted or `peer` is lost.
    fn check(&self, peer: usize) -> Result<()> {
        if self.aborted.load(Ordering::SeqCst) {
            Err(Error::Aborted)
        } else if self.lost[peer].load(Ordering::SeqCst) {
            Err(Error::PeerLost { rank: peer })
        } else {
            Ok(())
        }
    }
}

impl ThreadFabric {
    /// The call `peer` is making at this point of `header`'s communicator, if
    /// it differs from `header`'s.
    fn conflicting_call(&self, peer: usize, header: &Header) -> Option<Header> {
        let active = self.active[peer].lock().unwrap_or_else(|e| e.into_inner());
        active
            .iter()
            .find(|h| h.key() == header.key() && h.sig != header.sig)
            .copied()
    }
}

impl ThreadFabric {
    fn leave_verdict(&self, rank: usize, key: CallKey, err: Error) {
        self.verdicts[rank]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((key, err));
        // Called while holding our own inbox lock, so we must not take the
        // peer's (two ranks doing this at once would deadlock). Notifying
        // without the lock can miss a waiter that is just about to sleep; it
        // then finds the verdict on its next poll, within POLL.
        self.inboxes[rank].arrived.notify_all();
    }

    fn take_verdict(&self, rank: usize, key: CallKey) -> Option<Error> {
        let mut verdicts = self.verdicts[rank]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let i = verdicts.iter().position(|(k, _)| *k == key)?;
        Some(verdicts.swap_remove(i).1)
    }
}

impl Inbox {
    fn lock(&self) -> MutexGuard<'_, Vec<Post>> {
        self.posts.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One rank's endpoint on a [`ThreadFabric`].
pub struct ThreadTransport {
    fabric: Arc<ThreadFabric>,
    rank: usize,
}

/// The posts of one exchange; dropping it (on success, error or unwinding)
/// retracts whatever a receiver has not taken and waits for what it is
/// reading, so no receiver can ever see a dangling pointer.
struct Posted<'a> {
    fabric: &'a ThreadFabric,
    done: Arc<Completion>,
    peers: Vec<usize>,
}

impl Drop for Posted<'_> {
    fn drop(&mut self) {
        let mut retracted = 0;
        for &peer in &self.peers {
            let mut posts = self.fabric.inboxes[peer].lock();
            let before = posts.len();
            posts.retain(|p| !Arc::ptr_eq(&p.done, &self.done));
            retracted += before - posts.len();
        }
        let mut st = self.done.lock();
        st.pending -= retracted;
        // What is left is being read right now; that finishes without waiting
        // on anything else.
        while st.pending > 0 {
            st = self
                .done
                .changed
                .wait(st)
                .unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// Registers a call in [`ThreadFabric::active`] for the duration of an
/// `exchange`.
struct ActiveCall<'a> {
    fabric: &'a ThreadFabric,
    rank: usize,
    header: Header,
}

impl<'a> ActiveCall<'a> {
    fn enter(fabric: &'a ThreadFabric, rank: usize, header: &Header) -> ActiveCall<'a> {
        fabric.active[rank]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(*header);
        ActiveCall {
            fabric,
            rank,
            header: *header,
        }
    }
}

impl Drop for ActiveCall<'_> {
    fn drop(&mut self) {
        let mut active = self.fabric.active[self.rank]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(i) = active.iter().position(|h| *h == self.header) {
            active.swap_remove(i);
        }
    }
}

impl ThreadTransport {
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

    /// Takes and delivers every expected message.
    fn receive_all(
        &self,
        header: &Header,
        recvs: &[Incoming],
        sink: &mut dyn Sink,
        posted: &Posted<'_>,
        start: Instant,
        deadline: Instant,
    ) -> Result<()> {
        let inbox = &self.fabric.inboxes[self.rank];
        let mut waiting: Vec<bool> = vec![true; recvs.len()];
        let mut remaining = recvs.len();
        let mut taken: Vec<(usize, Post)> = Vec::new();
        let mut spins = 0;
        while remaining > 0 {
            {
                let mut posts = inbox.lock();
                loop {
                    // FIFO per source: only the first expected message from a
                    // source may take that source's first post.
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
                    if !taken.is_empty() {
                        break;
                    }
                    let first = recvs
                        .iter()
                        .zip(&waiting)
                        .find(|(_, w)| **w)
                        .map(|(r, _)| r.peer)
                        .expect("remaining > 0");
                    for (rv, _) in recvs.iter().zip(&waiting).filter(|(_, w)| **w) {
                        self.fabric.check(rv.peer)?;
                        if let Some(theirs) = self.fabric.conflicting_call(rv.peer, header) {
                            let (local, remote) = (header.sig.to_string(), theirs.sig.to_string());
                            self.fabric.leave_verdict(
                                rv.peer,
                                theirs.key(),
                                Error::Mismatch {
                                    rank: rv.peer,
                                    local: remote.clone(),
                                    peer: self.rank,
                                    remote: local.clone(),
                                },
                            );
                            return Err(Error::Mismatch {
                                rank: self.rank,
                                local,
                                peer: rv.peer,
                                remote,
                            });
                        }
                    }
                    if let Some(err) = self.fabric.take_verdict(self.rank, header.key()) {
                        return Err(err);
                    }
                    // A receiver rejected one of our messages: the call is over.
                    if let Some(err) = posted.done.lock().failure.take() {
                        return Err(err);
                    }
                    let now = Instant::now();
                    if now >= deadline {
                        return Err(self.timeout(header, first, start));
                    }
                    if spins < SPINS {
                        // Yield instead of sleeping at first: the sender is
                        // usually a few microseconds away, and a futex sleep
                        // and wake-up costs more than that.
                        spins += 1;
                        drop(posts);
                        std::thread::yield_now();
                        posts = inbox.lock();
                        continue;
                    }
                    let slice = (deadline - now).min(POLL);
                    posts = inbox
                        .arrived
                        .wait_timeout(posts, slice)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
            let mut failed = None;
            for (i, post) in taken.drain(..) {
                waiting[i] = false;
                remaining -= 1;
                if let Err(verdict) = self.check_match(header, &recvs[i], &post) {
                    let (mine, theirs) = *verdict;
                    post.done.finish_one(Some(theirs));
                    // Wake the sender if it is still waiting for its own receives.
                    self.fabric.inboxes[post.src].arrived.notify_all();
                    failed.get_or_insert(mine);
                    continue;
                }
                // SAFETY: the sender is blocked in `exchange` until
                // `finish_one` below (see `Post`), so `data..data+len` is a
                // live, initialised byte buffer that nobody writes meanwhile:
                // validated plans never receive into memory that an in-flight
                // send of the same round reads.
                let bytes = unsafe { std::slice::from_raw_parts(post.data, post.len) };
                sink.deliver(i, 0, bytes);
                post.done.finish_one(None);
            }
            if let Some(err) = failed {
                return Err(err);
            }
        }
        Ok(())
    }

    /// Compares a post with what this rank expected; on disagreement returns
    /// the error for this rank and the one for the sender.
    fn check_match(
        &self,
        header: &Header,
        expected: &Incoming,
        post: &Post,
    ) -> std::result::Result<(), Box<(Error, Error)>> {
        let mut local = header.sig.to_string();
        let mut remote = post.header.sig.to_string();
        if post.header.sig == header.sig {
            if post.len == expected.len {
                return Ok(());
            }
            local = format!("{local} expecting {} bytes", expected.len);
            remote = format!("{remote} sending {} bytes", post.len);
        }
        let mine = Error::Mismatch {
            rank: self.rank,
            local: local.clone(),
            peer: post.src,
            remote: remote.clone(),
        };
        let theirs = Error::Mismatch {
            rank: post.src,
            local: remote,
            peer: self.rank,
            remote: local,
        };
        Err(Box::new((mine, theirs)))
    }

    /// Waits until every post is consumed.
    fn wait_sends(
        &self,
        header: &Header,
        posted: &Posted<'_>,
        start: Instant,
        deadline: Instant,
    ) -> Result<()> {
        let mut spins = 0;
        loop {
            {
                let mut st = posted.done.lock();
                if let Some(err) = st.failure.take() {
                    return Err(err);
                }
                if st.pending == 0 {
                    return Ok(());
                }
            }
            if spins < SPINS {
                spins += 1;
                std::thread::yield_now();
                continue;
            }
            // Name a peer that has not taken its message yet.
            let slow = posted.peers.iter().copied().find(|&p| {
                self.fabric.inboxes[p]
                    .lock()
                    .iter()
                    .any(|post| Arc::ptr_eq(&post.done, &posted.done))
            });
            if let Some(p) = slow {
                self.fabric.check(p)?;
            }
            // The receiver may have found our call mismatched and left.
            if let Some(err) = self.fabric.take_verdict(self.rank, header.key()) {
                return Err(err);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(self.timeout(header, slow.unwrap_or(self.rank), start));
            }
            let st = posted.done.lock();
            if st.pending > 0 && st.failure.is_none() {
                drop(
                    posted
                        .done
                        .changed
                        .wait_timeout(st, (deadline - now).min(POLL))
                        .unwrap_or_else(|e| e.into_inner()),
                );
            }
        }
    }
}

impl Transport for ThreadTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.fabric.inboxes.len()
    }

    fn exchange(
        &self,
        header: &Header,
        sends: &[Outgoing<'_>],
        recvs: &[Incoming],
        sink: &mut dyn Sink,
        deadline: Instant,
    ) -> Result<()> {
        let start = Instant::now();
        if self.fabric.aborted.load(Ordering::SeqCst) {
            return Err(Error::Aborted);
        }
        let _active = ActiveCall::enter(&self.fabric, self.rank, header);
        let posted = Posted {
            fabric: &self.fabric,
            done: Arc::new(Completion {
                state: Mutex::new(CompletionState {
                    pending: sends.len(),
                    failure: None,
                }),
                changed: Condvar::new(),
            }),
            peers: sends.iter().map(|s| s.peer).collect(),
        };
        for s in sends {
            let inbox = &self.fabric.inboxes[s.peer];
            inbox.lock().push(Post {
                src: self.rank,
                header: *header,
                data: s.data.as_ptr(),
                len: s.data.len(),
                done: Arc::clone(&posted.done),
            });
            inbox.arrived.notify_all();
        }
        self.receive_all(header, recvs, sink, &posted, start, deadline)?;
        self.wait_sends(header, &posted, start, deadline)
        // `posted` drops here: nothing is left to retract on success.
    }

    fn abort(&self) {
        self.fabric.aborted.store(true, Ordering::SeqCst);
        self.fabric.wake_all();
    }

    fn name(&self) -> &'static str {
        "thread"
    }
}
