//! Learning at once that a local peer process is gone.
//!
//! A peer killed by a signal closes nothing a waiting rank could see, and a
//! waiting rank sleeps on its futex doorbell, which only peers ring. So one
//! thread per shared-memory node holds a pidfd of every local peer
//! (`pidfd_open(2)`: it turns readable when the process exits) and sleeps
//! in `poll(2)` on them, costing nothing while they live. When one exits,
//! the thread marks that peer dead, bumps this rank's notice count (so a
//! call on the small-call fast path asks the engine to look) and rings this
//! rank's doorbell: every waiting thread wakes, and the channel to the dead
//! peer fails its next read once the peer's last bytes are consumed, which
//! the engine reports as a lost peer within a scheduling delay of the
//! death instead of at its next periodic liveness check.
//!
//! Where pidfds are unavailable (Linux before 5.3, or a seccomp filter),
//! nothing is watched and the periodic check (`Channel::check_alive`)
//! remains.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};

use super::segment::{Segment, NOTICES};

/// The watching thread of one node; stops (and is joined) when the last
/// channel holding it is dropped.
pub(super) struct Watcher {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// What the watcher and the channels share.
struct Shared {
    /// This rank's segment: its doorbell and notice count.
    own: Arc<Segment>,
    /// An eventfd that wakes the thread: a peer was added, or stop.
    wake: OwnedFd,
    /// Every watched peer (only ever appended to while the thread runs).
    peers: Mutex<Vec<Watched>>,
    /// Set when the watcher is dropped.
    stop: AtomicBool,
}

/// One watched peer process.
struct Watched {
    pidfd: OwnedFd,
    dead: Arc<AtomicBool>,
}

impl Watcher {
    /// Starts the thread that watches for the node whose segment is `own`.
    pub(super) fn start(own: Arc<Segment>) -> io::Result<Watcher> {
        // SAFETY: plain system call; the descriptor, if valid, is ours.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor nobody else owns.
        let wake = unsafe { OwnedFd::from_raw_fd(raw) };
        let shared = Arc::new(Shared {
            own,
            wake,
            peers: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
        });
        let thread = {
            let shared = Arc::clone(&shared);
            thread::Builder::new()
                .name("ferrocoll-shm-watch".into())
                .spawn(move || watch_loop(&shared))?
        };
        Ok(Watcher {
            shared,
            thread: Some(thread),
        })
    }

    /// Watches process `pid`; the flag turns true once it has exited.
    pub(super) fn watch(&self, pid: u32) -> io::Result<Arc<AtomicBool>> {
        let pidfd = crate::shared::pidfd_open(pid)?;
        let dead = Arc::new(AtomicBool::new(false));
        self.shared
            .peers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Watched {
                pidfd,
                dead: Arc::clone(&dead),
            });
        self.shared.poke();
        Ok(dead)
    }
}

impl Shared {
    /// Wakes the thread (it rereads the peers and the stop flag).
    fn poke(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live buffer to our eventfd. A full
        // counter (EAGAIN) already means a pending wake-up.
        unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.poke();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The thread: sleeps in `poll` on the eventfd and every live peer's
/// pidfd; marks exited peers dead and wakes this rank.
fn watch_loop(shared: &Shared) {
    let mut fds: Vec<libc::pollfd> = Vec::new();
    let mut which: Vec<usize> = Vec::new();
    while !shared.stop.load(Ordering::SeqCst) {
        fds.clear();
        which.clear();
        fds.push(libc::pollfd {
            fd: shared.wake.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        {
            let peers = shared.peers.lock().unwrap_or_else(|e| e.into_inner());
            for (i, p) in peers.iter().enumerate() {
                if !p.dead.load(Ordering::Relaxed) {
                    fds.push(libc::pollfd {
                        fd: p.pidfd.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    });
                    which.push(i);
                }
            }
        }
        // SAFETY: `fds` is a valid array of `fds.len()` pollfd structures
        // for the duration of the call; the descriptors stay open (the
        // peers list only grows and is dropped after this thread ends).
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            // Nothing sensible to do: the periodic check remains.
            return;
        }
        if fds[0].revents != 0 {
            let mut buf = [0u8; 8];
            // SAFETY: reads at most 8 bytes into a live buffer from our
            // non-blocking eventfd (resetting its counter).
            unsafe { libc::read(shared.wake.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        }
        let mut any = false;
        {
            let peers = shared.peers.lock().unwrap_or_else(|e| e.into_inner());
            for (fd, &i) in fds[1..].iter().zip(&which) {
                if fd.revents & libc::POLLNVAL != 0 {
                    // Cannot happen (we own the descriptors); polling it
                    // again would return at once forever, so stop here and
                    // leave it to the periodic check.
                    return;
                }
                if fd.revents != 0 {
                    peers[i].dead.store(true, Ordering::Release);
                    any = true;
                }
            }
        }
        if any {
            // As a peer's control notice would: the fast path then asks
            // the engine to look at the channels, and every sleeper wakes.
            shared.own.u64_at(NOTICES).fetch_add(1, Ordering::Release);
            shared.own.ring_bell();
        }
    }
}
