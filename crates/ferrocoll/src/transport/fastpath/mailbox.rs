//! The mailboxes of the small-collective fast path: where their words are
//! in the shared-memory segments and how to touch them. The protocol on top
//! is in the parent module; the segment's layout, and the constants that
//! size it (`SLOTS`, `SLOT_PAYLOAD`), stay in [`crate::transport::shm`],
//! which knows nothing of this module.

use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::transport::shm::{
    futex_wait, Segment, ShmNode, BLOCK, EAGER_BUFFERS, NOTICES, SLOTS, SLOT_HEADER, SLOT_PAYLOAD,
};

/// The mailboxes of one rank (see the layout in [`crate::transport::shm`]):
/// its own, which local peers write into, and its slots in theirs. The
/// protocol on top is [`super`]'s; this type only knows where the
/// words are and how to touch them.
///
/// Every header word and the `ack` are only accessed atomically. A
/// payload (in its slot, or in an eager buffer of the pair) is plain
/// memory, handed over like ring data: the sender writes it before storing
/// the slot's stamp with `Release`; the receiver reads it (in place, or
/// copying it out) after loading the stamp with `Acquire` and before
/// storing `ack` past it with `Release`; the sender writes the slot or the
/// buffer again only after loading such an `ack` with `Acquire`.
pub(crate) struct Mailboxes {
    /// Our segment: mailbox `i` holds what local rank `i` sends us.
    own: Arc<Segment>,
    /// Every local rank's segment (ours at `me`).
    peers: Vec<Arc<Segment>>,
    /// Our local rank.
    me: usize,
}

/// The header of a message in a slot: which call it belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SlotHeader {
    /// Communicator id.
    pub comm: u64,
    /// Call sequence number.
    pub seq: u64,
    /// The sender's call signature, packed (see `fastpath::pack`); the
    /// payload's length follows from it.
    pub sig: u64,
}

impl Mailboxes {
    /// The mailboxes of the small-collective fast path in `node`'s
    /// segments: ours and our slots in every local peer's segment. `None`
    /// until every local peer is attached.
    pub(crate) fn of(node: &ShmNode) -> Option<Mailboxes> {
        let peers = node.segments()?;
        let me = node.local_rank();
        Some(Mailboxes {
            own: Arc::clone(&peers[me]),
            peers,
            me,
        })
    }

    /// Number of local ranks.
    pub(crate) fn local_size(&self) -> usize {
        self.peers.len()
    }

    /// Bytes of one eager buffer: the most payload a message carries
    /// (`shm::eager_buffer_bytes`, alike in every local segment).
    pub(crate) fn eager_buffer_bytes(&self) -> usize {
        self.own.eager_buffer_bytes()
    }

    /// Offset of the slot of message `stamp` of mailbox `sender` in any
    /// segment.
    fn slot_offset(seg: &Segment, sender: usize, stamp: u64) -> usize {
        seg.mailbox_offset(sender) + BLOCK + (stamp % SLOTS as u64) as usize * BLOCK
    }

    /// Offset of the payload of message `stamp` from `sender`, `len` bytes
    /// long, in any segment: in the slot when it fits there, else in the
    /// pair's eager buffer `stamp % EAGER_BUFFERS`.
    fn payload_offset(seg: &Segment, sender: usize, stamp: u64, len: usize) -> usize {
        if len <= SLOT_PAYLOAD {
            Self::slot_offset(seg, sender, stamp) + SLOT_HEADER
        } else {
            let buffer = seg.eager_buffer_bytes();
            assert!(len <= buffer, "payload too large for an eager buffer");
            seg.eager_offset(sender) + (stamp % EAGER_BUFFERS as u64) as usize * buffer
        }
    }

    /// The stamp of the slot that holds our message number `stamp` from
    /// local rank `from` once it has arrived (stamps count from 1).
    pub(crate) fn inbound_stamp(&self, from: usize, stamp: u64) -> &AtomicU64 {
        self.own.u64_at(Self::slot_offset(&self.own, from, stamp))
    }

    /// The header of message `stamp` from local rank `from`, which the
    /// caller has seen arrive (its stamp loaded with `Acquire` equal to
    /// `stamp`) and not consumed yet.
    pub(crate) fn peek(&self, from: usize, stamp: u64) -> SlotHeader {
        let seg = &*self.own;
        let off = Self::slot_offset(seg, from, stamp);
        SlotHeader {
            comm: seg.u64_at(off + 8).load(Ordering::Relaxed),
            seq: seg.u64_at(off + 16).load(Ordering::Relaxed),
            sig: seg.u64_at(off + 24).load(Ordering::Relaxed),
        }
    }

    /// The `len` payload bytes of message `stamp` from local rank `from`,
    /// in place in our segment (8-byte aligned, as the reduction kernels
    /// want).
    ///
    /// # Safety
    ///
    /// The caller has seen the message arrive, as for [`Mailboxes::peek`],
    /// `len` is the length its signature gives (at most
    /// [`Mailboxes::eager_buffer_bytes`]),
    /// and the slice is not used after the caller's
    /// [`Mailboxes::consume`] of the message: until then the sender does
    /// not write these bytes (see the type's documentation).
    pub(crate) unsafe fn payload(&self, from: usize, stamp: u64, len: usize) -> &[u8] {
        let off = Self::payload_offset(&self.own, from, stamp, len);
        // SAFETY: `bytes_at` checked that the range is inside the mapping,
        // which lives as long as `self`. The sender wrote the bytes before
        // its `Release` store of the stamp, which the caller loaded with
        // `Acquire`, and writes them again only after our `ack` moves past
        // the message, which the caller's contract puts after the last use.
        unsafe { std::slice::from_raw_parts(self.own.bytes_at(off, len), len) }
    }

    /// Marks message `stamp` from local rank `from` consumed (every earlier
    /// one was): its slot and eager buffer are the sender's again.
    pub(crate) fn consume(&self, from: usize, stamp: u64) {
        let seg = &*self.own;
        seg.u64_at(seg.mailbox_offset(from))
            .store(stamp, Ordering::Release);
    }

    /// Asks the CPU to fetch the cache line of the slot that message
    /// `stamp` from local rank `from` will use, so that the poll of its
    /// stamp finds it close: a sender that runs ahead (a broadcast root,
    /// one rank of a reduce) has already written it, and the fetch then
    /// overlaps the caller's work until its next call instead of stalling
    /// that call's first poll. Only a hint: no load is architecturally
    /// performed, nothing is read or ordered, and a line not yet written
    /// is merely fetched early (the sender's write invalidates it, as it
    /// would the copy left by the slot's previous message).
    pub(crate) fn prefetch(&self, from: usize, stamp: u64) {
        let at = self
            .own
            .bytes_at(Self::slot_offset(&self.own, from, stamp), 8);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `_mm_prefetch` only needs SSE, which every x86_64 CPU
        // has; a prefetch never faults and has no effect on memory, and the
        // address is inside the mapping anyway (`bytes_at` checked it).
        unsafe {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            _mm_prefetch::<_MM_HINT_T0>(at as *const i8);
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = at;
    }

    /// How many of our messages local rank `to` has consumed.
    pub(crate) fn acked_by(&self, to: usize) -> u64 {
        let seg = &*self.peers[to];
        seg.u64_at(seg.mailbox_offset(self.me))
            .load(Ordering::Acquire)
    }

    /// Writes our message number `stamp` to local rank `to` and publishes
    /// it: the header in the slot, the payload beside it when it fits
    /// ([`SLOT_PAYLOAD`]), else in the pair's eager buffer `stamp %
    /// EAGER_BUFFERS`. The caller has checked that `to` consumed message
    /// `stamp - SLOTS` ([`Mailboxes::acked_by`]), and `stamp -
    /// EAGER_BUFFERS` for a payload that needs an eager buffer, so the
    /// slot and the buffer are free.
    pub(crate) fn put(&self, to: usize, stamp: u64, head: SlotHeader, payload: &[u8]) {
        let seg = &*self.peers[to];
        let off = Self::slot_offset(seg, self.me, stamp);
        // One bounds check for the whole slot, header and short payload
        // (a tiny call's sender runs this on every call).
        let slot = seg.bytes_at(off, BLOCK);
        let dst = if payload.len() <= SLOT_PAYLOAD {
            // SAFETY: `SLOT_HEADER + payload.len() <= BLOCK`, inside the
            // slot that `bytes_at` checked.
            unsafe { slot.add(SLOT_HEADER) }
        } else {
            let at = Self::payload_offset(seg, self.me, stamp, payload.len());
            seg.bytes_at(at, payload.len())
        };
        // SAFETY: the slot is inside the mapping (checked above), which
        // outlives `self`, and 8-aligned (slots are BLOCK-aligned in a
        // page-aligned mapping); every process only ever accesses its
        // header words atomically.
        let word = |i: usize| unsafe { &*(slot.add(8 * i) as *const AtomicU64) };
        word(1).store(head.comm, Ordering::Relaxed);
        word(2).store(head.seq, Ordering::Relaxed);
        word(3).store(head.sig, Ordering::Relaxed);
        // SAFETY: the destination is inside the mapping (checked above:
        // the slot, or `bytes_at` for the eager buffer, whose length
        // `payload_offset` asserted). The receiver consumed the previous
        // message of that slot and of that buffer (the caller checked its
        // `ack` with `Acquire`) and does not read them again until the
        // `Release` store of the stamp below. The source is the caller's
        // memory, disjoint from the shared mapping.
        unsafe {
            ptr::copy_nonoverlapping(payload.as_ptr(), dst, payload.len());
        }
        word(0).store(stamp, Ordering::Release);
    }

    /// Wakes local rank `to` if a thread of it sleeps on its doorbell. The
    /// caller issues a `SeqCst` fence between publishing what `to` may wait
    /// for and this call (see [`Mailboxes::sleep`]).
    pub(crate) fn wake(&self, to: usize) {
        let seg = &*self.peers[to];
        if seg.sleepers().load(Ordering::Relaxed) > 0 {
            seg.ring_bell();
        }
    }

    /// Rings our own doorbell (wakes this rank's other threads).
    pub(crate) fn wake_self(&self) {
        self.own.ring_bell();
    }

    /// The count of control notices written to this rank (incremented by
    /// peers after such a frame is in our ring: `ShmChannel::alert`).
    pub(crate) fn notices(&self) -> u64 {
        self.own.u64_at(NOTICES).load(Ordering::Acquire)
    }

    /// Sleeps on our doorbell for at most `timeout` unless `ready()` says
    /// there is something to do. The waker publishes, issues a `SeqCst`
    /// fence and then reads our sleeper count ([`Mailboxes::wake`]); we
    /// raise the count, fence, then call `ready`: one of the two sees the
    /// other (so a waker that finds no sleeper needs no system call, and no
    /// wake-up is lost). The futex compares the ring count against the
    /// token read before, so a ring between `ready` and the sleep returns
    /// at once.
    pub(crate) fn sleep(&self, timeout: Duration, ready: impl Fn() -> bool) {
        let rings = self.own.rings();
        let sleepers = self.own.sleepers();
        let token = rings.load(Ordering::Acquire);
        sleepers.fetch_add(1, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
        if !ready() && !timeout.is_zero() {
            futex_wait(rings, token, timeout);
        }
        sleepers.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::shm::{LARGE_EAGER_BYTES, MIN_RING_BYTES};
    use std::sync::atomic::AtomicUsize;
    use std::thread;
    use std::time::Instant;

    /// Two attached nodes of one job, local ranks 0 and 1.
    fn pair(tag: &str, ring_bytes: usize) -> (ShmNode, ShmNode) {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let j = format!(
            "t{}-{tag}{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let mut a = ShmNode::create(&j, 0, 2, ring_bytes).unwrap();
        let mut b = ShmNode::create(&j, 1, 2, ring_bytes).unwrap();
        a.attach(1, b.name()).unwrap();
        b.attach(0, a.name()).unwrap();
        (a, b)
    }

    #[test]
    fn shm_mailboxes_carry_stamped_messages_and_wake_sleepers() {
        let (a, b) = pair("mbox", MIN_RING_BYTES);
        let (ma, mb) = (Mailboxes::of(&a).unwrap(), Mailboxes::of(&b).unwrap());
        let head = |stamp: u64| SlotHeader {
            comm: 7,
            seq: 100 + stamp,
            sig: 0xAB,
        };
        // Nothing yet: message 1 has not arrived.
        assert_ne!(mb.inbound_stamp(0, 1).load(Ordering::Acquire), 1);
        assert_eq!(ma.acked_by(1), 0);
        // Fill every slot, then take them in order; the ack follows.
        for stamp in 1..=SLOTS as u64 {
            let payload = [stamp as u8; 12];
            ma.put(1, stamp, head(stamp), &payload);
        }
        for stamp in 1..=SLOTS as u64 {
            assert_eq!(mb.inbound_stamp(0, stamp).load(Ordering::Acquire), stamp);
            assert_eq!(mb.peek(0, stamp), head(stamp));
            // SAFETY: arrived, 12 bytes long, not used after `consume`.
            let bytes = unsafe { mb.payload(0, stamp, 12) };
            assert_eq!(bytes, &[stamp as u8; 12]);
            mb.consume(0, stamp);
            assert_eq!(ma.acked_by(1), stamp);
        }
        // A slot reused: its old stamp is not the new one's.
        let next = SLOTS as u64 + 1;
        assert_ne!(mb.inbound_stamp(0, next).load(Ordering::Acquire), next);
        // Payloads longer than a slot's go through the eager buffers, one
        // per stamp modulo EAGER_BUFFERS: every buffer in use at once keeps
        // its own bytes, and a payload exactly one buffer long fits (on 2
        // local ranks a large one: a streamed allreduce's part).
        let buffer = ma.eager_buffer_bytes();
        assert_eq!(buffer, LARGE_EAGER_BYTES);
        let eager: Vec<Vec<u8>> = (0..EAGER_BUFFERS)
            .map(|k| {
                let len = [SLOT_PAYLOAD + 1, buffer, 4096, 1000][k % 4];
                (0..len).map(|i| (i * 7 + k) as u8).collect()
            })
            .collect();
        for (k, bytes) in eager.iter().enumerate() {
            ma.put(1, next + k as u64, head(k as u64), bytes);
        }
        for (k, bytes) in eager.iter().enumerate() {
            let stamp = next + k as u64;
            assert_eq!(mb.inbound_stamp(0, stamp).load(Ordering::Acquire), stamp);
            // SAFETY: arrived, its length, not used after `consume`.
            let got = unsafe { mb.payload(0, stamp, bytes.len()) };
            assert_eq!(got, &bytes[..], "eager message {k}");
            assert_eq!(got.as_ptr() as usize % 8, 0, "aligned for the kernels");
            mb.consume(0, stamp);
        }
        let next = next + EAGER_BUFFERS as u64;
        // A sleeper wakes when a message is put and the sender wakes it.
        let waiter = thread::spawn(move || {
            let start = Instant::now();
            mb.sleep(Duration::from_secs(5), || {
                mb.inbound_stamp(0, next).load(Ordering::Acquire) == next
            });
            (
                start.elapsed(),
                mb.inbound_stamp(0, next).load(Ordering::Acquire),
            )
        });
        thread::sleep(Duration::from_millis(100));
        ma.put(1, next, head(0), &[]);
        std::sync::atomic::fence(Ordering::SeqCst);
        ma.wake(1);
        let (slept, stamp) = waiter.join().unwrap();
        assert_eq!(stamp, next);
        assert!(slept < Duration::from_secs(2), "slept {slept:?}");
    }
}
