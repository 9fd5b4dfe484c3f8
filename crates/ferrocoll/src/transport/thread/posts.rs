//! Zero-copy posting: a send leaves a pointer to the sender's bytes in the
//! receiver's inbox ([`Post`]), the sender's [`Completion`] counts the posts
//! consumed, and [`Posted`] retracts what is left when the sender's
//! `exchange` ends, however it ends: why reading through a post is sound.

use std::sync::{Arc, Mutex, MutexGuard};

use super::{ThreadFabric, POLL};
use crate::error::Error;
use crate::transport::Header;

/// A posted message: a view of the sender's memory, valid until the sender's
/// [`Completion`] counts it done.
pub(super) struct Post {
    pub(super) src: usize,
    /// The rank it was posted to.
    pub(super) dst: usize,
    pub(super) header: Header,
    pub(super) data: *const u8,
    pub(super) len: usize,
    /// `None` once counted done ([`Post::finish`]). A post dropped while
    /// still `Some` (retracted by its sender, or dropped by a receiver that
    /// unwound) counts itself done on the way, so its sender never waits
    /// for it forever.
    pub(super) done: Option<Arc<Completion>>,
}

// SAFETY: a `Post` is only a pointer and length into the sender's buffer
// plus shared bookkeeping. The sender keeps that buffer borrowed (it is inside
// `exchange`, which holds `&[u8]` for it) until the post is consumed or
// retracted (see `Posted::drop`), so moving the pointer to the receiving
// thread and reading through it there is sound.
unsafe impl Send for Post {}

impl Post {
    /// Whether this is one of the posts tracked by `done`.
    pub(super) fn belongs_to(&self, done: &Arc<Completion>) -> bool {
        self.done.as_ref().is_some_and(|d| Arc::ptr_eq(d, done))
    }

    /// Counts the post consumed, with the receiver's verdict; the caller
    /// then wakes the sender (not here: the caller may hold a rank's lock).
    pub(super) fn finish(mut self, failure: Option<Error>) {
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
pub(super) struct Completion {
    pub(super) state: Mutex<CompletionState>,
}

/// What [`Completion`] guards.
pub(super) struct CompletionState {
    /// Posts not yet consumed (or retracted).
    pub(super) pending: usize,
    /// Set by a receiver that rejected one of the posts.
    pub(super) failure: Option<Error>,
}

impl Completion {
    /// Its state (usable after a panic elsewhere: consistent after every
    /// method).
    pub(super) fn lock(&self) -> MutexGuard<'_, CompletionState> {
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

/// The posts of one exchange; dropping it (on success, error or unwinding)
/// retracts whatever a receiver has not taken and waits for what it is
/// reading, so no receiver can ever see a dangling pointer.
pub(super) struct Posted<'a> {
    pub(super) fabric: &'a ThreadFabric,
    pub(super) rank: usize,
    pub(super) done: Arc<Completion>,
    pub(super) peers: Vec<usize>,
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
