//! The doorbell: an event count on a shared futex word (the protocol is in
//! the module documentation of [`super`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::futex::futex_wait;
use super::segment::Segment;
use crate::transport::channel::Doorbell;

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
}
