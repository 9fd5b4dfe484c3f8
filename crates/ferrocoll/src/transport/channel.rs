//! What the multi-process transports are made of: byte channels to peers and
//! a way to sleep until one of them moves.
//!
//! The shared-memory and TCP transports differ only in how bytes cross
//! between two processes. Everything above that (framing, matching messages
//! to receives, unexpected messages, deadlines, lost peers, abort) lives once,
//! in [`super::engine`], which drives a [`Channel`] per peer and sleeps on a
//! [`Doorbell`] when none of them can move.

use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

use super::CallKind;

/// A reliable, ordered byte stream to one peer, used without blocking.
///
/// The engine writes whole frames as consecutive bytes (a frame may be split
/// across many `send_some` calls) and reads them back in order on the other
/// side. Both methods return at once: 0 means "nothing can move now".
pub(crate) trait Channel: Send {
    /// Appends a prefix of `data` to the stream and returns its length
    /// (0 when the stream is full for now).
    fn send_some(&mut self, data: &[u8]) -> io::Result<usize>;

    /// Offers bytes that have arrived, in stream order, to `take`, which
    /// returns how many of them it consumed (a prefix; possibly 0). Returns
    /// the number consumed. The offered slice may be shorter than what has
    /// arrived (a ring offers up to its wrap point), and is 8-byte aligned
    /// whenever the stream position is a multiple of 8. An error means the
    /// peer is gone (closed stream, dead process).
    fn recv_some(&mut self, take: &mut dyn FnMut(&[u8]) -> usize) -> io::Result<usize>;

    /// Whether [`Channel::recv_into`] reads the stream straight into the
    /// caller's memory, one copy fewer than [`Channel::recv_some`]'s offer
    /// out of a staging buffer (TCP). The engine uses it only then.
    fn reads_into(&self) -> bool {
        false
    }

    /// Moves the next bytes of the stream, at most `dst.len()`, into a
    /// prefix of `dst` and returns how many (0: nothing now). Unlike
    /// `recv_some`'s `take`, it may stop at any byte; offers after it stay
    /// 8-byte aligned whenever the stream position is. An error means the
    /// peer is gone. Default: through `recv_some` (one copy, as there).
    fn recv_into(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        self.recv_some(&mut |b| {
            let n = b.len().min(dst.len());
            dst[..n].copy_from_slice(&b[..n]);
            n
        })
    }

    /// The engine can do nothing with fewer than `bytes` more bytes of the
    /// stream (the rest of the frame it is receiving): a channel that is
    /// polled may have its read descriptor turn readable only once that
    /// many have arrived (TCP's `SO_RCVLOWAT`), so that a receiver of a
    /// large message wakes for large reads, not for every packet. Its
    /// reads still return whatever has arrived. Default: nothing.
    fn await_bytes(&mut self, bytes: usize) {
        let _ = bytes;
    }

    /// The file descriptors to poll: the one that turns readable when data
    /// arrives, and the one that turns writable when the stream can take
    /// more (sockets); `None` for channels that signal through a
    /// [`Doorbell`] instead (shared memory). They can change as the stream
    /// moves (a striped TCP channel reads and writes one socket at a time).
    fn poll_fds(&self) -> Option<(RawFd, RawFd)> {
        None
    }

    /// Whether this channel's peer reads a message of `len` bytes of a call
    /// of `kind` directly from our memory ([`Channel::read_remote`]): the
    /// single-copy path (for messages of at least the single-copy size).
    fn reads_remote(&self, kind: CallKind, len: usize) -> bool {
        let _ = (kind, len);
        false
    }

    /// Copies `dst.len()` bytes at address `addr` of the peer process into
    /// `dst` (only when [`Channel::reads_remote`]).
    fn read_remote(&self, _addr: u64, _dst: &mut [u8]) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "no single-copy path to this peer",
        ))
    }

    /// Whether this channel's peer's [`crate::SharedBuffer`]s can be mapped
    /// ([`Channel::shared_bytes`]).
    fn maps_shared(&self) -> bool {
        false
    }

    /// Bytes `offset..offset + len` of the peer's shared buffer `region`
    /// (descriptor << 32 | generation), mapped on first use.
    fn shared_bytes(&mut self, _region: u64, _offset: u64, _len: usize) -> io::Result<&[u8]> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "peer buffers cannot be mapped",
        ))
    }

    /// Tells the peer that a control notice (mismatch, lost rank, abort)
    /// has just been written whole into the stream, for peers that may not
    /// be reading the stream while they work through the shared-memory fast
    /// path ([`super::fastpath`]). Default: nothing (only shared memory has
    /// a fast path).
    fn alert(&mut self) {}

    /// Checks that the peer still exists, for channels that cannot see a
    /// closed stream (a shared-memory peer killed by a signal). Called while
    /// waiting, a few times per second.
    fn check_alive(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// How a rank sleeps until something may have changed on its channels.
///
/// Usage is an event count: read [`Doorbell::token`], look at every channel,
/// and if nothing could move call [`Doorbell::wait`] with the token; the wait
/// returns at once if anything rang since the token was read, so a wake-up
/// between looking and sleeping is never lost.
pub(crate) trait Doorbell: Send + Sync {
    /// The current count of rings.
    fn token(&self) -> u64;
    /// Sleeps until the count differs from `token`, or `timeout` passes.
    fn wait(&self, token: u64, timeout: Duration);
    /// Rings this rank's own bell: wakes this rank's other threads (another
    /// call's data arrived, an abort).
    fn ring_local(&self);
    /// Sleeps in `poll(2)` on `fds` (sockets) until one is ready, the count
    /// differs from `token`, or `timeout` passes. Default: a ring does not
    /// wake `poll`, so it sleeps at most [`POLL_SLICE`] and the caller looks
    /// again.
    fn wait_polling(&self, _token: u64, mut fds: Vec<libc::pollfd>, timeout: Duration) {
        poll_fds(&mut fds, timeout.min(POLL_SLICE));
    }
}

/// Longest `poll(2)` of a rank whose doorbell cannot wake it there: how late
/// it may notice a ring.
pub(crate) const POLL_SLICE: Duration = Duration::from_millis(1);

/// `poll(2)` on `fds` for at most `timeout`, rounded up to a millisecond
/// (interruptions are fine: the caller looks at every channel again).
pub(crate) fn poll_fds(fds: &mut [libc::pollfd], timeout: Duration) {
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
    // SAFETY: `fds` is a valid, exclusively borrowed array of `fds.len()`
    // pollfd structures for the duration of the call.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
}
