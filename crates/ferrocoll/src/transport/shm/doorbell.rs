//! The doorbell: an event count on a shared futex word (the protocol is in
//! the module documentation of [`super`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use std::os::fd::AsRawFd;

use super::futex::futex_wait;
use super::segment::Segment;
use super::wake;
use crate::transport::channel::{poll_fds, Doorbell, POLL_SLICE};

/// A rank's doorbell: the event count in its own segment.
pub(super) struct ShmDoorbell {
    /// The segment holding the futex word.
    pub(super) seg: Arc<Segment>,
}

impl Doorbell for ShmDoorbell {
    fn token(&self) -> u64 {
        u64::from(self.seg.rings().load(Ordering::Acquire))
    }

    fn wait(&self, token: u64, timeout: Duration) {
        let rings = self.seg.rings();
        let sleepers = self.seg.sleepers();
        sleepers.fetch_add(1, Ordering::SeqCst);
        if rings.load(Ordering::SeqCst) == token as u32 && !timeout.is_zero() {
            futex_wait(rings, token as u32, timeout);
        }
        sleepers.fetch_sub(1, Ordering::SeqCst);
    }

    fn ring_local(&self) {
        self.seg.ring_bell();
    }

    fn wait_polling(&self, token: u64, mut fds: Vec<libc::pollfd>, timeout: Duration) {
        let seg = &self.seg;
        let Some(wake_fd) = seg
            .wake
            .as_ref()
            .filter(|_| seg.deaf().load(Ordering::SeqCst) == 0)
        else {
            poll_fds(&mut fds, timeout.min(POLL_SLICE));
            return;
        };
        // Counted before the last look at the count, as `wait` does: a
        // ringer either bumped the count before (we do not sleep) or sees
        // us counted and writes the eventfd (poll returns).
        let pollers = seg.pollers();
        pollers.fetch_add(1, Ordering::SeqCst);
        if seg.rings().load(Ordering::SeqCst) == token as u32 && !timeout.is_zero() {
            fds.push(libc::pollfd {
                fd: wake_fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
            poll_fds(&mut fds, timeout);
            if fds.last().is_some_and(|p| p.revents & libc::POLLIN != 0) {
                // A ring that lands after this leaves the eventfd readable:
                // the next sleep returns at once and drains it.
                wake::drain(wake_fd);
            }
        }
        pollers.fetch_sub(1, Ordering::SeqCst);
    }
}
