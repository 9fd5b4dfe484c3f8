//! One call on one rank: registering it, posting its sends, taking and
//! checking the messages it expects, and waiting (polls, then sleeps,
//! looking at the peers it waits on) until every post is consumed.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::posts::{Completion, CompletionState, Post, Posted};
use super::state::KEPT;
use super::verdicts::mismatch;
use super::{ThreadFabric, ThreadTransport, POLL, SPINS};
use crate::error::{Error, Result};
use crate::transport::{Header, Incoming, Outgoing, Sink};

/// Registers a collective in
/// [`RankState::active`](super::state::RankState::active) for the
/// duration of an `exchange`; point-to-point calls are not registered.
pub(super) struct ActiveCall<'a> {
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
    pub(super) fn timeout(&self, header: &Header, peer: usize, start: Instant) -> Error {
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
    pub(super) fn enter(&self, header: &Header) -> Result<ActiveCall<'_>> {
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
    pub(super) fn failed(&self, header: &Header) {
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
    pub(super) fn run_exchange(
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
        // The receivers copy from our memory from now on: the caller's
        // local work runs meanwhile.
        sink.overlap();
        let mut waiting: Vec<bool> = vec![true; recvs.len()];
        let mut remaining = recvs.len();
        let mut taken: Vec<(usize, Post)> = Vec::new();
        let mut spins = 0;
        // Polling lasts `fabric.spin` from the last message taken: a long
        // call whose steps each wait briefly keeps polling through all.
        let mut spin_until = start + fabric.spin;
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
                spin_until = Instant::now() + fabric.spin;
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
            if spins < SPINS || now < spin_until {
                // Poll instead of sleeping at first: the sender is usually
                // a few microseconds away, and a futex sleep and wake-up
                // costs more than that (see the module documentation).
                spins = spins.saturating_add(1);
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
