//! The channel to one local peer: two single-producer, single-consumer
//! rings (ours in the peer's segment, the peer's in ours).

use std::io;
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::process::{cma_read, pid_alive, SingleCopyUse};
use super::segment::{invalid_data, Segment, NOTICES};
use super::watch::Watcher;
use crate::transport::channel::Channel;
use crate::transport::CallKind;

/// The byte stream to and from one local peer.
pub(super) struct ShmChannel {
    /// The peer's segment: holds our outbound ring (index `me`) and the
    /// peer's doorbell.
    pub(super) peer: Arc<Segment>,
    /// Our segment: holds our inbound ring from the peer (index `them`).
    pub(super) own: Arc<Segment>,
    /// Our local rank.
    pub(super) me: usize,
    /// The peer's local rank.
    pub(super) them: usize,
    /// Ring capacity in bytes.
    pub(super) cap: u64,
    /// `cap - 1`.
    pub(super) mask: usize,
    /// Largest piece copied before publishing (a multiple of 8).
    pub(super) piece: usize,
    /// Outbound: our `head` (we are its only writer).
    pub(super) head: u64,
    /// Outbound: last `tail` seen (a lower bound of the real one).
    pub(super) tail_seen: u64,
    /// Inbound: our `tail` (we are its only writer).
    pub(super) tail: u64,
    /// Inbound: last `head` seen (a lower bound of the real one).
    pub(super) head_seen: u64,
    /// Which calls' large messages the peer reads from our memory with
    /// `process_vm_readv`.
    pub(super) cma: SingleCopyUse,
    /// The peer's shared buffers can be mapped (`pidfd_getfd`): a pidfd of
    /// the peer once opened, and the buffers mapped so far (by region).
    pub(super) shared: bool,
    pub(super) pidfd: Option<std::os::fd::OwnedFd>,
    pub(super) regions: Vec<(u64, crate::shared::PeerRegion)>,
    /// Set by the node's watcher once the peer process has exited (`None`
    /// when it cannot watch: then only [`Channel::check_alive`] notices).
    pub(super) dead: Option<Arc<AtomicBool>>,
    /// Keeps the watcher running while the channel lives.
    pub(super) _watcher: Option<Arc<Watcher>>,
}

/// Peer buffers kept mapped per channel; the oldest mapping goes first.
const MAPPED_REGIONS: usize = 64;

impl ShmChannel {
    /// The error for a peer whose process has exited.
    fn exited(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::BrokenPipe,
            format!("local peer process {} has exited", self.peer.pid),
        )
    }

    /// The error for a ring whose shared positions make no sense.
    fn corrupt(&self, which: &str, value: u64) -> io::Error {
        invalid_data(format!(
            "shared-memory ring between local ranks {} and {} is corrupt ({which} = {value})",
            self.me, self.them
        ))
    }
}

impl Channel for ShmChannel {
    fn reads_remote(&self, kind: CallKind, len: usize) -> bool {
        self.cma.carries(kind, len)
    }

    fn read_remote(&self, addr: u64, dst: &mut [u8]) -> io::Result<()> {
        cma_read(self.peer.pid, addr, dst)
    }

    fn maps_shared(&self) -> bool {
        self.shared
    }

    fn shared_bytes(&mut self, region: u64, offset: u64, len: usize) -> io::Result<&[u8]> {
        let at = match self.regions.iter().position(|(r, _)| *r == region) {
            Some(at) => at,
            None => {
                if self.pidfd.is_none() {
                    self.pidfd = Some(crate::shared::pidfd_open(self.peer.pid)?);
                }
                let pidfd = self.pidfd.as_ref().expect("opened above");
                let mapped = crate::shared::PeerRegion::map(pidfd, (region >> 32) as u32)?;
                if self.regions.len() == MAPPED_REGIONS {
                    self.regions.remove(0);
                }
                self.regions.push((region, mapped));
                self.regions.len() - 1
            }
        };
        self.regions[at].1.bytes(offset, len)
    }

    fn send_some(&mut self, data: &[u8]) -> io::Result<usize> {
        let seg = &*self.peer;
        let mut sent = 0;
        while sent < data.len() {
            let want = (data.len() - sent).min(self.piece);
            let mut free = self.cap - (self.head - self.tail_seen);
            if free < want as u64 {
                let tail = seg.tail(self.me).load(Ordering::Acquire);
                if tail < self.tail_seen || tail > self.head {
                    return Err(self.corrupt("tail", tail));
                }
                self.tail_seen = tail;
                free = self.cap - (self.head - tail);
                if free == 0 {
                    break;
                }
            }
            let n = want.min(free as usize);
            let idx = self.head as usize & self.mask;
            let first = n.min(self.cap as usize - idx);
            let ring = seg.data(self.me);
            // SAFETY: `[head, head + n)` is free space (n <= cap - (head -
            // tail) with `tail` loaded with Acquire, so the receiver finished
            // reading it), which the receiver does not read until we publish
            // `head` below; as indices it is `[idx, idx + first)` plus
            // `[0, n - first)`, both inside the ring's `cap` data bytes. The
            // source range is inside `data`, and the two never overlap (one
            // is our caller's memory, the other the shared ring).
            unsafe {
                ptr::copy_nonoverlapping(data.as_ptr().add(sent), ring.add(idx), first);
                ptr::copy_nonoverlapping(data.as_ptr().add(sent + first), ring, n - first);
            }
            self.head += n as u64;
            seg.head(self.me).store(self.head, Ordering::Release);
            seg.ring_bell();
            sent += n;
        }
        Ok(sent)
    }

    fn recv_some(&mut self, take: &mut dyn FnMut(&[u8]) -> usize) -> io::Result<usize> {
        let seg = &*self.own;
        let mut avail = self.head_seen - self.tail;
        if avail < self.piece as u64 {
            // Whether the peer is gone, read before its last `head`: what
            // it published before it died is then all visible below, and is
            // consumed before its death is reported.
            let gone = self
                .dead
                .as_ref()
                .is_some_and(|d| d.load(Ordering::Acquire));
            let head = seg.head(self.them).load(Ordering::Acquire);
            if head < self.head_seen || head - self.tail > self.cap {
                return Err(self.corrupt("head", head));
            }
            self.head_seen = head;
            avail = head - self.tail;
            if avail == 0 {
                return if gone { Err(self.exited()) } else { Ok(0) };
            }
        }
        let idx = self.tail as usize & self.mask;
        let len = (avail as usize)
            .min(self.cap as usize - idx)
            .min(self.piece);
        // SAFETY: `[tail, tail + len)` was published by the sender's Release
        // store of `head`, which we loaded with Acquire, so the bytes are
        // initialised and visible; the sender does not write them again
        // until we advance `tail` past them, which happens only after
        // `take` returns and the slice is gone. `[idx, idx + len)` is inside
        // the ring's data (len <= cap - idx).
        let bytes = unsafe { std::slice::from_raw_parts(seg.data(self.them).add(idx), len) };
        let n = take(bytes);
        assert!(
            n <= len,
            "recv_some: take consumed {n} of {len} offered bytes"
        );
        if n > 0 {
            self.tail += n as u64;
            seg.tail(self.them).store(self.tail, Ordering::Release);
            self.peer.ring_bell();
        }
        Ok(n)
    }

    fn alert(&mut self) {
        self.peer.u64_at(NOTICES).fetch_add(1, Ordering::Release);
    }

    fn check_alive(&mut self) -> io::Result<()> {
        let watched_dead = self
            .dead
            .as_ref()
            .is_some_and(|d| d.load(Ordering::Acquire));
        if !watched_dead && pid_alive(self.peer.pid) {
            Ok(())
        } else {
            Err(self.exited())
        }
    }
}
