//! Ranks as threads of one process: zero-copy message passing.
//!
//! A send *posts* a pointer to the sender's bytes in the receiver's inbox and
//! the sender stays inside [`Transport::exchange`] until the receiver has
//! consumed it. The receiver hands the sender's memory straight to its sink,
//! so a ring step reduces directly from the neighbour's buffer: one pass over
//! the data, no intermediate copy. A waiting rank first polls, yielding
//! its core between looks (16 times, and for up to 200 us when the group
//! has a core per rank; `FERROCOLL_SPIN_US` sets the time, as for the
//! process transports), then sleeps on its condition variable, woken by
//! whatever concerns it (a post, a consumed send, a verdict, a rank
//! leaving, an abort) and at least every 50 ms: never an endless spin,
//! which oversubscribed machines (8 ranks on 2 cores) need.
//!
//! Why poll by time where the cores allow: with 16 yields only (a few
//! microseconds when the core is free) a rank whose peer was later than
//! that slept, and the futex wake-up on this machine's VM costs tens of
//! microseconds; the late peer then made *its* peer sleep in the next
//! step, so a process settled into one of two modes for good: a 2-rank
//! 128 KiB allreduce ran at 12-15 us in some processes and 50-128 us in
//! others, with 6 context switches a call (bench/RESULTS.md, issue 19).
//! With more ranks than cores the 16 yields stay: polling for longer
//! there measured no better (4 ranks on 2 cores, 1 KiB - 16 MiB).
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
//!
//! The files: this one has the fabric's public face, the endpoint
//! ([`ThreadTransport`]) and its [`Transport`] impl; `state.rs` one rank's
//! state, its lock, sleeping and waking, and the ranks that left (the
//! culprit); `posts.rs` the zero-copy posts and why reading through them
//! is sound; `exchange.rs` one call on one rank (posting, taking, waiting,
//! looking at the peers); `verdicts.rs` a mismatch told to every rank.

mod exchange;
mod posts;
mod state;
mod verdicts;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use self::posts::Post;
use self::state::{Slot, KEPT, NO_CULPRIT};
use self::verdicts::mismatch;
use super::engine::SPIN_DEDICATED;
use super::{Header, Incoming, Outgoing, Sink, Transport};
use crate::error::{Error, Result};

/// Polls (each after a yield) of a waiting call before it may sleep, and
/// before it first looks at what its peers are doing (mismatch and
/// lost-rank checks; then once per [`POLL`]). Yielding, not spinning,
/// keeps oversubscribed ranks from starving the one they wait for.
const SPINS: u32 = 16;

/// Longest sleep between checks; what no wake-up announces (a peer entering
/// or ending a call) is noticed within this.
const POLL: Duration = Duration::from_millis(50);

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
    /// How long a waiting call keeps polling (beyond its [`SPINS`] polls)
    /// before it sleeps.
    spin: Duration,
}

impl ThreadFabric {
    /// A fabric for `n` ranks.
    ///
    /// A waiting rank polls for up to 200 us when there are no more ranks
    /// than CPUs this process may run on, and 16 times only otherwise.
    pub fn new(n: usize) -> Arc<ThreadFabric> {
        Self::with_spin(n, None)
    }

    /// A fabric for `n` ranks whose waiting ranks poll for `spin` (as
    /// `FERROCOLL_SPIN_US` asks; `None`: [`ThreadFabric::new`]'s choice)
    /// before they sleep. The transports read no environment: the caller
    /// passes what it read.
    pub fn with_spin(n: usize, spin: Option<Duration>) -> Arc<ThreadFabric> {
        let cpus = std::thread::available_parallelism().map_or(1, |c| c.get());
        let spin = spin.unwrap_or(if n <= cpus {
            SPIN_DEDICATED
        } else {
            Duration::ZERO
        });
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
            spin,
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

    /// Always: a receive copies straight from the sender's buffer.
    fn receivers_copy(&self, _coll: crate::plan::Collective) -> bool {
        true
    }

    /// Read straight from each rank's state: threads need not answer.
    fn positions(&self, comm: u64, ranks: &[usize], _within: Duration) -> Vec<Option<String>> {
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
                    .map(|h| format!("in {}", h.describe_call()))
                    .collect();
                if !running.is_empty() {
                    return Some(running.join(", "));
                }
                Some(match st.finished.iter().rev().find(|h| h.comm == comm) {
                    Some(h) => format!(
                        "in no collective on this communicator; last finished {}",
                        h.describe_call()
                    ),
                    None => "in no collective on this communicator; finished none yet".to_string(),
                })
            })
            .collect()
    }
}
