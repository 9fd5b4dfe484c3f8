//! Waiting: the loop that moves everything until a call is done, and the
//! sleeping it falls back to.
//!
//! A rank that cannot move first polls (spinning up to 200 us when it has a
//! core to itself, yielding between polls for 1 ms when it shares one),
//! then sleeps on its [`Doorbell`] (shared memory) or in `poll(2)` on its
//! sockets, waking at least every 50 ms to notice aborts, deadlines and
//! dead peers. Never an endless spin.

use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::driver::{Engine, State, LIVENESS_EVERY, PROBE_AFTER};
use crate::error::Result;
use crate::transport::channel::{poll_fds, Doorbell};

/// Bytes of a call's overlapped local work (an allgather's own block) done
/// at a time when every channel is a socket: a piece runs after a turn of
/// progress that moved nothing, the rest once the messages are done. There
/// the kernel moves the bytes only inside this rank's and its peers'
/// system calls, so a rank copying its whole block at once leaves its
/// sockets idle meanwhile (its receive buffer full, the peer's writes
/// stalled): 2-rank TCP allgathers and alltoalls of 1-8 MiB took 0.70-0.92x
/// the time in pieces; 64 MiB the same (bench/RESULTS.md, issue 20). Over
/// shared memory the peers read this rank's memory while it copies: the
/// work runs whole after the first turn.
const OVERLAP_PIECE: usize = 1 << 20;

/// Longest sleep between checks for abort, deadline and dead peers.
pub(crate) const SLEEP_SLICE: Duration = Duration::from_millis(50);

impl Engine {
    /// Moves everything until call `id` completes, fails or times out.
    pub(super) fn drive<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        id: usize,
        start: Instant,
    ) -> (MutexGuard<'a, State>, Result<()>) {
        // Polling lasts the spin time from the call's start and from the
        // last time bytes moved through a channel that is not a socket: a
        // large call whose chunks stream through a shared-memory ring
        // waits briefly for each, and sleeping on the doorbell there (a
        // futex wake-up each time, tens of microseconds on this VM) made a
        // 2-rank 16 MiB shm allreduce 1.5x slower (bench/RESULTS.md,
        // issue 20).
        let spin = self.spin_time();
        let mut spin_until = start + spin;
        let mut probed = false;
        // Over sockets only, the local work runs in pieces when progress
        // stalls (see OVERLAP_PIECE).
        let piece = st.all_polled().then_some(OVERLAP_PIECE);
        let mut overlap_left = true;
        loop {
            let token = self.bell.token();
            let moved = st.progress();
            if overlap_left && (piece.is_none() || !moved) {
                // The call's first bytes are out (a single-copy send is
                // posted, a ring holds what fits): the caller's local work
                // runs now, while the peers read, rather than after.
                overlap_left = st.core.overlap(id, piece);
                if overlap_left {
                    continue;
                }
            }
            if let Some(result) = st.core.poll_call(id) {
                // Acknowledgements this call's receives queued (rendezvous
                // senders wait for them) go out now: after its last call a
                // rank may do nothing more with the engine.
                if st.core.has_queued() {
                    st.flush_now();
                }
                return (st, result);
            }
            if moved {
                // Past the spin, a rank whose channels are all sockets
                // sleeps in poll(2) even while bytes move: a socket wakes
                // it once the frame being received has the bytes it needs
                // (`Channel::await_bytes`) or the peer took some of ours,
                // so a large message is read in large reads; polling again
                // at once reads each packet as it lands (a system call
                // each, and the socket's lock taken from the sender).
                let now = Instant::now();
                if !st.all_polled() {
                    spin_until = now + spin;
                    continue;
                }
                if now < spin_until {
                    continue;
                }
                st = self.sleep(st, id, token, now);
                continue;
            }
            let now = Instant::now();
            if let Some(err) = st.core.handle_timeout(id, now) {
                return (st, Err(err));
            }
            if now.duration_since(st.last_liveness) >= LIVENESS_EVERY {
                st.check_liveness(now);
                continue;
            }
            if !probed && now.duration_since(start) >= PROBE_AFTER {
                // Long for any message: ask the peers (a mismatch where no
                // message would show it, see desync.rs).
                probed = true;
                st.core.probe(id);
                st.flush_now();
                continue;
            }
            // A peer on the bypass where this call uses the channels: its
            // message waits there.
            if let Some(bypass) = self.bypass.as_ref().filter(|b| b.anything_new()) {
                let live = st.core.live_keys();
                let found = bypass.strays(&|key| live.contains(&key));
                if !found.is_empty() {
                    st.core.handle_strays(found);
                    st.flush_now();
                    continue;
                }
            }
            if now < spin_until {
                // Let go of the lock so other threads of this rank progress.
                drop(st);
                // Spin briefly (the peer is usually on another core and
                // microseconds away), then yield: with more ranks than
                // cores the peer we wait for may need this very core.
                if self.dedicated_core {
                    // A few pauses only: one PAUSE takes ~140 cycles on
                    // recent x86 cores, so the 32 this loop once had made
                    // every poll ~1.5 us late (8 B through the rings: median
                    // 1.2-1.3 us with 32, 0.49 us with 4; bench/RESULTS.md).
                    for _ in 0..4 {
                        std::hint::spin_loop();
                    }
                } else {
                    std::thread::yield_now();
                }
                st = self.lock();
                continue;
            }
            st = self.sleep(st, id, token, now);
        }
    }

    /// Sleeps until a channel may move, the doorbell rings (`token`: the
    /// count read before the last look), or a slice of call `id`'s time
    /// to its deadline passes, and takes the lock again.
    fn sleep<'a>(
        &'a self,
        st: MutexGuard<'a, State>,
        id: usize,
        token: u64,
        now: Instant,
    ) -> MutexGuard<'a, State> {
        let mut slice = st
            .core
            .deadline(id)
            .saturating_duration_since(now)
            .min(SLEEP_SLICE);
        if self.active.load(Ordering::SeqCst) > 1 {
            slice = slice.min(Duration::from_millis(1));
        }
        let (mut polls, all_fds) = st.poll_set();
        drop(st);
        if polls.is_empty() {
            self.bell.wait(token, slice);
        } else if all_fds {
            poll_fds(&mut polls, slice);
        } else {
            // Sockets wake poll; shared-memory peers ring the doorbell,
            // which wakes poll where it can (shm's eventfd) and otherwise
            // makes the sleep short.
            self.bell.wait_polling(token, polls, slice);
        }
        self.lock()
    }
}

impl State {
    /// Whether every live channel is one to poll (sockets): then a poll
    /// sees everything that can move.
    fn all_polled(&self) -> bool {
        self.chans.iter().enumerate().all(|(p, c)| {
            self.core.is_lost(p) || c.as_ref().map_or(true, |c| c.poll_fds().is_some())
        })
    }

    /// What to sleep on in `poll(2)`: the listener while TCP peers are
    /// still to connect, and every live channel's descriptors (writable
    /// too where frames wait). The flag says whether every channel has
    /// descriptors (shared-memory ones only ring the doorbell).
    fn poll_set(&self) -> (Vec<libc::pollfd>, bool) {
        let mut polls: Vec<libc::pollfd> = Vec::new();
        let mut all_fds = true;
        if self.lazy.iter().any(|&l| l) {
            if let Some(connector) = self.connector.as_ref() {
                polls.push(libc::pollfd {
                    fd: connector.listener_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
        }
        for (p, chan) in self.chans.iter().enumerate() {
            if self.core.is_lost(p) {
                continue;
            }
            let Some(chan) = chan.as_ref() else {
                continue;
            };
            let Some((read, write)) = chan.poll_fds() else {
                all_fds = false;
                continue;
            };
            let out = if self.core.wants_write(p) {
                libc::POLLOUT
            } else {
                0
            };
            if read == write {
                polls.push(libc::pollfd {
                    fd: read,
                    events: libc::POLLIN | out,
                    revents: 0,
                });
            } else {
                polls.push(libc::pollfd {
                    fd: read,
                    events: libc::POLLIN,
                    revents: 0,
                });
                if out != 0 {
                    polls.push(libc::pollfd {
                        fd: write,
                        events: out,
                        revents: 0,
                    });
                }
            }
        }
        (polls, all_fds)
    }
}

/// A doorbell for ranks that wait only on sockets: it rings the threads of
/// this process (abort, another thread's progress).
pub(crate) struct LocalBell {
    count: Mutex<u64>,
    rung: std::sync::Condvar,
}

impl LocalBell {
    /// A new bell.
    pub(crate) fn new() -> LocalBell {
        LocalBell {
            count: Mutex::new(0),
            rung: std::sync::Condvar::new(),
        }
    }
}

impl Doorbell for LocalBell {
    fn token(&self) -> u64 {
        *self.count.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait(&self, token: u64, timeout: Duration) {
        let guard = self.count.lock().unwrap_or_else(|e| e.into_inner());
        let _ = self
            .rung
            .wait_timeout_while(guard, timeout, |c| *c == token);
    }

    fn ring_local(&self) {
        *self.count.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.rung.notify_all();
    }
}
