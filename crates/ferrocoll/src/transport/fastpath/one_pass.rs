//! Calls of one short message per peer in one pass:
//! [`FastPath::exchange_one_pass`].
//!
//! # Why
//!
//! A 2-rank broadcast or reduce of a few bytes is a loop in which one rank
//! only sends and the other only receives; the sender sets the pace, and
//! its time per call follows the instructions it runs (a build padded with
//! ~1000 instructions a call took 0.23-0.24 us a call at best against
//! 0.15-0.16; bench/RESULTS.md, fourteenth session). Through the general
//! [`FastPath::exchange`], built for streamed parts, remote reads and calls
//! that run into each other, a broadcast's root ran 1441 instructions a
//! call, Open MPI's 808.
//!
//! # What
//!
//! The same protocol, the same slots and the same books, for the case that
//! has nothing unusual about it: at most one message to and from each
//! peer, all read under the books' lock ([`READ_LOCKED_BYTES`] together),
//! no mismatch reported, nothing stashed, no head held by another call, no
//! notice to act on, room in every mailbox written to, and every message
//! the call receives at the head of its mailbox. Then the whole call is one
//! pass under one lock: send, find the peers' messages, mark the call
//! finished, read the payloads in place and consume them. Wherever the
//! case is not that (before anything is sent: every check; after the
//! sends: a message missing or not this call's), the call goes on in
//! [`FastPath::exchange`], without the sends once they are done, so that
//! mismatches, late messages, stashing, waiting, probes and timeouts all
//! stay in one place.

use std::sync::atomic::{fence, Ordering};
use std::time::Duration;

use super::{
    pack, packed_len, Books, FastPath, Got, Parts, Piece, SlotHeader, EAGER_BUFFERS,
    READ_LOCKED_BYTES, SLOTS, SLOT_PAYLOAD,
};
use crate::error::Result;
use crate::transport::engine::Link;
use crate::transport::Header;

/// Polls of the peers' stamps, without the lock, after this rank has sent
/// and before the call goes on in the general exchange (whose first pass
/// alone costs about as much as a few hundred polls): in a 2-rank
/// allreduce the peer's message is usually a cache-line transfer away.
/// Only on a rank with a core of its own; sharing cores, the general wait
/// yields instead.
const POLLS: u32 = 64;

/// Most peers a one-pass call sends to or receives from.
pub(crate) const ONE_PASS_MAX_PEERS: usize = 3;

/// Most bytes a one-pass call receives from all peers together: what the
/// general exchange still reads under the books' lock.
pub(crate) const ONE_PASS_MAX_BYTES: usize = READ_LOCKED_BYTES;

impl FastPath {
    /// [`FastPath::exchange`] of one whole message to each rank of `to`
    /// (`payloads[i]` to `to[i]`) and from each rank of `from` (at most
    /// `MAX` each, [`ONE_PASS_MAX_BYTES`] received in all; `MAX` sizes the
    /// call's arrays, at most [`ONE_PASS_MAX_PEERS`]), then `read` of the payloads that arrived (`theirs[i]` from
    /// `from[i]`, in place in shared memory). Errors, waits and the other
    /// calls of this rank are as `exchange`'s (see the module
    /// documentation).
    pub(crate) fn exchange_one_pass<const MAX: usize, R, F: FnOnce(&[&[u8]]) -> R>(
        &self,
        link: &Link<'_>,
        header: &Header,
        payloads: &[&[u8]],
        (to, from): (&[usize], &[usize]),
        timeout: Duration,
        read: F,
    ) -> Result<R> {
        let len = header.sig.count * header.sig.dtype.size();
        const { assert!(MAX <= ONE_PASS_MAX_PEERS) };
        assert!(to.len() <= MAX && from.len() <= MAX && payloads.len() == to.len());
        assert!(len * from.len() <= ONE_PASS_MAX_BYTES);
        assert!(payloads.iter().all(|p| p.len() == len));
        let piece = Piece::whole(header);
        // The general exchange, from the start or, once this rank has
        // sent, for the receives alone.
        let general = |payloads: &[&[u8]], to: &[usize], read: F| {
            let mut got: [Got; MAX] = std::array::from_fn(|_| Got::Waiting);
            let read = |parts: &Parts<'_>| {
                let mut theirs: [&[u8]; MAX] = [&[]; MAX];
                for (i, t) in theirs[..from.len()].iter_mut().enumerate() {
                    *t = parts.get(i);
                }
                read(&theirs[..from.len()])
            };
            let timed = (piece, timeout);
            self.exchange(link, header, payloads, to, from, &mut got, timed, read)
        };
        if link.is_aborted() || link.is_broken() || self.notices_changed() {
            return general(payloads, to, read);
        }
        let sig = pack(&header.sig).expect("fast-path calls pack");
        debug_assert_eq!(packed_len(sig), len);
        let key = header.key();
        let mut books = self.books();
        // What the general first pass looks at before it sends (a mismatch
        // a peer reported, the messages of a call the engine ran last), and
        // what may hold this call's messages elsewhere (the stash, a head
        // another call holds).
        if !books.ledger.bypass_finished_last() || self.in_the_way(&books) {
            drop(books);
            return general(payloads, to, read);
        }
        if !to.is_empty() {
            // Room in every mailbox first: all are sent, or none.
            let ahead = if len > SLOT_PAYLOAD {
                EAGER_BUFFERS
            } else {
                SLOTS
            } as u64;
            for &peer in to {
                let lp = self.local(peer);
                if books.sent[lp] + 1 > books.acked[lp] + ahead {
                    books.acked[lp] = self.boxes.acked_by(lp);
                    if books.sent[lp] + 1 > books.acked[lp] + ahead {
                        // Full: the general exchange waits for room.
                        drop(books);
                        return general(payloads, to, read);
                    }
                }
            }
            let head = SlotHeader {
                comm: header.comm,
                seq: header.seq,
                sig,
            };
            for (&peer, payload) in to.iter().zip(payloads) {
                let lp = self.local(peer);
                let stamp = books.sent[lp] + 1;
                self.boxes.put(lp, stamp, head, payload);
                books.sent[lp] = stamp;
                self.sent_out[lp].store(stamp, Ordering::Relaxed);
            }
            // Pairs with the fence in `Mailboxes::sleep`.
            fence(Ordering::SeqCst);
            for &peer in to {
                self.boxes.wake(self.local(peer));
            }
        }
        // From here on, a detour into the general exchange leaves the sends
        // out: they are done.
        if from.is_empty() {
            books.ledger.finish_on_bypass(header);
            drop(books);
            // A notice that crossed the call (a peer found a mismatch), as
            // the general exchange looks after its passes.
            if self.notices_changed() {
                self.checkup(link, header, &[], false, &|| true)?;
            }
            return Ok(read(&[]));
        }
        // The local rank of each peer heard from, and its next message.
        let mut next = [(0usize, 0u64); MAX];
        for (n, &peer) in next.iter_mut().zip(from) {
            let lp = self.local(peer);
            *n = (lp, self.next_in[lp].load(Ordering::Relaxed));
        }
        let next = &next[..from.len()];
        let arrived = || {
            next.iter().all(|&(lp, stamp)| {
                self.boxes.inbound_stamp(lp, stamp).load(Ordering::Acquire) == stamp
            })
        };
        if !arrived() {
            drop(books);
            let polls = if link.dedicated_core { POLLS } else { 0 };
            let came = (0..polls).any(|_| {
                std::hint::spin_loop();
                arrived()
            });
            if !came {
                return general(&[], &[], read);
            }
            books = self.books();
            // What may have changed while the lock was free: another call
            // of this rank stashed or holds a message, a peer reported a
            // mismatch.
            if self.in_the_way(&books)
                || next
                    .iter()
                    .any(|&(lp, stamp)| self.next_in[lp].load(Ordering::Relaxed) != stamp)
            {
                drop(books);
                return general(&[], &[], read);
            }
        }
        let ours = next.iter().all(|&(lp, stamp)| {
            let head = self.boxes.peek(lp, stamp);
            (head.comm, head.seq) == key && head.sig == sig
        });
        if !ours || self.notices_changed() {
            // Another call's message first, this call's with another
            // signature, or a notice that crossed the call: the general
            // exchange stashes, fails or acts on it.
            drop(books);
            return general(&[], &[], read);
        }
        books.ledger.finish_on_bypass(header);
        let mut theirs: [&[u8]; MAX] = [&[]; MAX];
        for (t, &(lp, stamp)) in theirs.iter_mut().zip(next) {
            // SAFETY: the message arrived (its stamp was loaded with
            // `Acquire`) with this call's signature, so `len` is its
            // length; it is consumed only below, after the last use of the
            // slice, and no other call takes it out meanwhile: that needs
            // the books' lock, held from the check until then.
            *t = unsafe { self.boxes.payload(lp, stamp, len) };
        }
        let out = read(&theirs[..from.len()]);
        // Under the lock of the pass, as the general exchange's short
        // reads: no other call takes or consumes the messages meanwhile.
        for &(lp, stamp) in next {
            self.consume(lp, stamp);
        }
        drop(books);
        Ok(out)
    }

    /// Whether something may hold or decide this call's messages
    /// elsewhere: a mismatch a peer reported, a message taken out into
    /// the stash, a head another call holds (under the books' lock).
    fn in_the_way(&self, books: &Books) -> bool {
        books.ledger.has_verdicts()
            || !books.stash.is_empty()
            || self.held.load(Ordering::Relaxed) != 0
    }
}
