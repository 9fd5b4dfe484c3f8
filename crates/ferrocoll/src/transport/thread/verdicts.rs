//! Collective mismatches: how a peer's side of a call disagrees with this
//! rank's, and the verdict that goes to every rank (see the module
//! documentation of [`super`]).

use std::sync::Arc;

use super::posts::Completion;
use super::state::CallKey;
use super::ThreadFabric;
use crate::error::Error;
use crate::transport::Header;

impl ThreadFabric {
    /// Sends rank `a`'s verdict on the collective with `key` (`a` called
    /// `a_call`, rank `b` called `b_call`) to every other rank: `b` gets it
    /// from its own side, any other rank as `a` saw it. Call it holding no
    /// rank's lock.
    ///
    /// The fabric does not know which ranks a communicator has: a rank
    /// outside it keeps the verdict unused, as it never makes that call.
    pub(super) fn publish(&self, key: CallKey, a: usize, a_call: &str, b: usize, b_call: &str) {
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
    pub(super) fn compare(
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
}

/// A [`Error::Mismatch`] as rank `rank` reports it.
pub(super) fn mismatch(rank: usize, local: &str, peer: usize, remote: &str) -> Error {
    Error::Mismatch {
        rank,
        local: local.to_string(),
        peer,
        remote: remote.to_string(),
    }
}
