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
    futex_wait, Segment, ShmNode, BLOCK, NOTICES, SLOTS, SLOT_HEADER, SLOT_PAYLOAD,
};

/// The mailboxes of one rank (see the layout in [`crate::transport::shm`]):
/// its own, which local peers write into, and its slots in theirs. The
/// protocol on top is [`super`]'s; this type only knows where the
/// words are and how to touch them.
///
/// Every header word and the `ack` are only accessed atomically. A slot's
/// payload is plain memory, handed over like ring data: the sender writes it
/// before storing the slot's stamp with `Release`; the receiver reads it
/// after loading the stamp with `Acquire` and before storing `ack` past it
/// with `Release`; the sender writes the slot again only after loading such
/// an `ack` with `Acquire`.
pub(crate) struct Mailboxes {
    /// Our segment: mailbox `i` holds what local rank `i` sends us.
    own: Arc<Segment>,
    /// Every local rank's segment (ours at `me`).
    peers: Vec<Arc<Segment>>,
    /// Our local rank.
    me: usize,
}

/// A message read out of a slot.
#[derive(Clone, Copy)]
pub(crate) struct SlotMessage {
    /// Communicator id.
    pub comm: u64,
    /// Call sequence number.
    pub seq: u64,
    /// The sender's call signature, packed (see `fastpath::pack`).
    pub sig: u64,
    /// The first `len` bytes of the payload (`len` as the signature says,
    /// at most [`SLOT_PAYLOAD`]); 8-byte aligned.
    pub data: [u64; SLOT_PAYLOAD / 8],
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

    /// Offset of slot `k` of mailbox `sender` in any segment.
    fn slot_offset(seg: &Segment, sender: usize, k: usize) -> usize {
        debug_assert!(k < SLOTS);
        seg.mailbox_offset(sender) + BLOCK + (k % SLOTS) * BLOCK
    }

    /// The stamp of the slot that holds our message number `stamp` from
    /// local rank `from` once it has arrived (stamps count from 1).
    pub(crate) fn inbound_stamp(&self, from: usize, stamp: u64) -> &AtomicU64 {
        let off = Self::slot_offset(&self.own, from, (stamp % SLOTS as u64) as usize);
        self.own.u64_at(off)
    }

    /// Reads message `stamp` from local rank `from`, which the caller has
    /// seen arrive (its stamp loaded with `Acquire` equal to `stamp`), then
    /// marks it consumed. `payload_len` extracts the payload length from the
    /// packed signature (clamped to [`SLOT_PAYLOAD`]).
    pub(crate) fn take(
        &self,
        from: usize,
        stamp: u64,
        payload_len: impl Fn(u64) -> usize,
    ) -> SlotMessage {
        let seg = &*self.own;
        let off = Self::slot_offset(seg, from, (stamp % SLOTS as u64) as usize);
        let comm = seg.u64_at(off + 8).load(Ordering::Relaxed);
        let seq = seg.u64_at(off + 16).load(Ordering::Relaxed);
        let sig = seg.u64_at(off + 24).load(Ordering::Relaxed);
        let len = payload_len(sig).min(SLOT_PAYLOAD);
        let mut data = [0u64; SLOT_PAYLOAD / 8];
        // SAFETY: `off + SLOT_HEADER + len <= off + BLOCK` is inside the
        // mapping (the slot lies inside the segment's mailbox area). The
        // sender wrote these bytes before its `Release` store of the stamp,
        // which the caller loaded with `Acquire`, and does not write them
        // again before we store `ack` below (see the type's documentation).
        // `data` is a local array of at least `len` bytes.
        unsafe {
            ptr::copy_nonoverlapping(
                seg.bytes_at(off + SLOT_HEADER, len),
                data.as_mut_ptr().cast::<u8>(),
                len,
            );
        }
        seg.u64_at(seg.mailbox_offset(from))
            .store(stamp, Ordering::Release);
        SlotMessage {
            comm,
            seq,
            sig,
            data,
        }
    }

    /// How many of our messages local rank `to` has consumed.
    pub(crate) fn acked_by(&self, to: usize) -> u64 {
        let seg = &*self.peers[to];
        seg.u64_at(seg.mailbox_offset(self.me))
            .load(Ordering::Acquire)
    }

    /// Writes our message number `stamp` to local rank `to` and publishes
    /// it. The caller has checked that `to` consumed message `stamp -
    /// SLOTS` ([`Mailboxes::acked_by`]), so the slot is free.
    pub(crate) fn put(&self, to: usize, stamp: u64, comm: u64, seq: u64, sig: u64, payload: &[u8]) {
        assert!(
            payload.len() <= SLOT_PAYLOAD,
            "payload too large for a slot"
        );
        let seg = &*self.peers[to];
        let off = Self::slot_offset(seg, self.me, (stamp % SLOTS as u64) as usize);
        seg.u64_at(off + 8).store(comm, Ordering::Relaxed);
        seg.u64_at(off + 16).store(seq, Ordering::Relaxed);
        seg.u64_at(off + 24).store(sig, Ordering::Relaxed);
        // SAFETY: the destination `off + SLOT_HEADER .. + payload.len()` is
        // inside the slot (asserted length) and so inside the mapping. The
        // receiver consumed the slot's previous message (the caller checked
        // its `ack` with `Acquire`) and does not read the slot again until
        // the `Release` store of the stamp below. The source is the
        // caller's memory, disjoint from the shared mapping.
        unsafe {
            ptr::copy_nonoverlapping(
                payload.as_ptr(),
                seg.bytes_at(off + SLOT_HEADER, payload.len()),
                payload.len(),
            );
        }
        seg.u64_at(off).store(stamp, Ordering::Release);
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
    use crate::transport::shm::MIN_RING_BYTES;
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
        let len = |_sig: u64| 12;
        // Nothing yet: message 1 has not arrived.
        assert_ne!(mb.inbound_stamp(0, 1).load(Ordering::Acquire), 1);
        assert_eq!(ma.acked_by(1), 0);
        // Fill every slot, then take them in order; the ack follows.
        for stamp in 1..=SLOTS as u64 {
            let payload = [stamp as u8; 12];
            ma.put(1, stamp, 7, 100 + stamp, 0xAB, &payload);
        }
        for stamp in 1..=SLOTS as u64 {
            assert_eq!(mb.inbound_stamp(0, stamp).load(Ordering::Acquire), stamp);
            let msg = mb.take(0, stamp, len);
            assert_eq!((msg.comm, msg.seq, msg.sig), (7, 100 + stamp, 0xAB));
            let bytes: &[u8] = bytemuck::cast_slice(&msg.data);
            assert_eq!(&bytes[..12], &[stamp as u8; 12]);
            assert_eq!(ma.acked_by(1), stamp);
        }
        // A slot reused: its old stamp is not the new one's.
        let next = SLOTS as u64 + 1;
        assert_ne!(mb.inbound_stamp(0, next).load(Ordering::Acquire), next);
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
        ma.put(1, next, 7, 0, 0, &[]);
        std::sync::atomic::fence(Ordering::SeqCst);
        ma.wake(1);
        let (slept, stamp) = waiter.join().unwrap();
        assert_eq!(stamp, next);
        assert!(slept < Duration::from_secs(2), "slept {slept:?}");
    }
}
