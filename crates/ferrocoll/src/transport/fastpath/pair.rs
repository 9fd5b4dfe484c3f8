//! The one-message exchange between two ranks: [`FastPath::exchange_pair`].
//!
//! # Why
//!
//! A 2-rank broadcast or reduce of a few bytes is a loop in which one rank
//! only sends and the other only receives; the sender sets the pace, and
//! its time per call follows the instructions it runs (a build padded with
//! ~1000 instructions a call took 0.23-0.24 us a call at best against
//! 0.15-0.16; bench/RESULTS.md, fourteenth session). Through the general
//! [`FastPath::exchange`], built for any number of peers, streamed parts,
//! remote reads and calls that run into each other, a broadcast's root ran
//! 1441 instructions a call, Open MPI's 808.
//!
//! # What
//!
//! The same protocol, the same slots and the same books, for the case that
//! has nothing unusual about it: at most one message each way, its payload
//! read under the books' lock ([`READ_LOCKED_BYTES`]), no mismatch
//! reported, nothing stashed, no head held by another call, no notice to
//! act on, and the peer's message (if any) at the head of its mailbox.
//! Then the whole call is one pass under one lock: send, find the peer's
//! message, mark the call finished, read the payload in place and consume
//! it. Wherever the case is not that (before anything is sent: every
//! check; after the send: the peer's message missing or not this call's),
//! the call goes on in [`FastPath::exchange`], without the send when it is
//! done, so that mismatches, late messages, stashing, waiting, probes and
//! timeouts all stay in one place.

use std::sync::atomic::{fence, Ordering};
use std::time::Duration;

use super::{
    pack, packed_len, FastPath, Got, Parts, Piece, SlotHeader, EAGER_BUFFERS, READ_LOCKED_BYTES,
    SLOTS, SLOT_PAYLOAD,
};
use crate::error::Result;
use crate::transport::engine::Link;
use crate::transport::Header;

/// Polls of the peer's stamp, without the lock, after this rank has sent
/// and before the call goes on in the general exchange (whose first pass
/// alone costs about as much as a few hundred polls): in a 2-rank
/// allreduce the peer's message is usually a cache-line transfer away.
/// Only on a rank with a core of its own; sharing cores, the general wait
/// yields instead.
const PAIR_POLLS: u32 = 64;

/// Most bytes a message of [`FastPath::exchange_pair`] carries: its
/// payload is read under the books' lock, as the general exchange reads
/// short ones ([`READ_LOCKED_BYTES`]).
pub(crate) const PAIR_MAX_BYTES: usize = READ_LOCKED_BYTES;

impl FastPath {
    /// [`FastPath::exchange`] of one whole message each way at most
    /// between this rank and one peer: sends `payload` to the ranks of `to`
    /// (none or the peer) and receives from those of `from` (none or the
    /// peer), then runs `read` on what arrived. Messages are the call's
    /// whole count, at most [`PAIR_MAX_BYTES`]. Errors, waits and the other
    /// calls of this rank are as `exchange`'s (see the module
    /// documentation).
    pub(crate) fn exchange_pair<R, F: FnOnce(&[u8]) -> R>(
        &self,
        link: &Link<'_>,
        header: &Header,
        payload: &[u8],
        (to, from): (&[usize], &[usize]),
        timeout: Duration,
        read: F,
    ) -> Result<R> {
        let len = header.sig.count * header.sig.dtype.size();
        assert!(to.len() <= 1 && from.len() <= 1 && len <= PAIR_MAX_BYTES);
        assert!(to.is_empty() || payload.len() == len);
        let piece = Piece::whole(header);
        // The general exchange, from the start or, once this rank has
        // sent, for the receive alone.
        let general = |payloads: &[&[u8]], to: &[usize], read: F| {
            let mut got = [Got::Waiting];
            let read = |parts: &Parts<'_>| read(if from.is_empty() { &[] } else { parts.get(0) });
            self.exchange(
                link,
                header,
                payloads,
                to,
                from,
                &mut got,
                (piece, timeout),
                read,
            )
        };
        let payloads: [&[u8]; 1] = [payload];
        let payloads = &payloads[..to.len()];
        if link.is_aborted() || link.is_broken() || self.notices_changed() {
            return general(payloads, to, read);
        }
        let sig = pack(&header.sig).expect("fast-path calls pack");
        debug_assert_eq!(packed_len(sig), len);
        let key = header.key();
        let mut books = self.books();
        // What the general first pass looks at before it sends (a mismatch
        // a peer reported, the messages of a call the engine ran last), and
        // what may hold this call's message elsewhere (the stash, a head
        // another call holds).
        if books.ledger.has_verdicts()
            || !books.ledger.bypass_finished_last()
            || !books.stash.is_empty()
            || self.held.load(Ordering::Relaxed) != 0
        {
            drop(books);
            return general(payloads, to, read);
        }
        if let Some(&peer) = to.first() {
            let lp = self.local(peer);
            let stamp = books.sent[lp] + 1;
            let ahead = if len > SLOT_PAYLOAD {
                EAGER_BUFFERS
            } else {
                SLOTS
            } as u64;
            if stamp > books.acked[lp] + ahead {
                books.acked[lp] = self.boxes.acked_by(lp);
                if stamp > books.acked[lp] + ahead {
                    // Full: the general exchange waits for room.
                    drop(books);
                    return general(payloads, to, read);
                }
            }
            let head = SlotHeader {
                comm: header.comm,
                seq: header.seq,
                sig,
            };
            self.boxes.put(lp, stamp, head, payload);
            books.sent[lp] = stamp;
            self.sent_out[lp].store(stamp, Ordering::Relaxed);
            // Pairs with the fence in `Mailboxes::sleep`.
            fence(Ordering::SeqCst);
            self.boxes.wake(lp);
        }
        // From here on, a detour into the general exchange leaves the send
        // out: it is done.
        let Some(&peer) = from.first() else {
            books.ledger.finish_on_bypass(header);
            drop(books);
            // A notice that crossed the call (the peer found a mismatch),
            // as the general exchange looks after its passes.
            if self.notices_changed() {
                self.checkup(link, header, &[], false, &|| true)?;
            }
            return Ok(read(&[]));
        };
        let lp = self.local(peer);
        let stamp = self.next_in[lp].load(Ordering::Relaxed);
        let arrived = || self.boxes.inbound_stamp(lp, stamp).load(Ordering::Acquire) == stamp;
        if !arrived() {
            drop(books);
            let polls = if link.dedicated_core { PAIR_POLLS } else { 0 };
            let came = (0..polls).any(|_| {
                std::hint::spin_loop();
                arrived()
            });
            if !came {
                return general(&[], &[], read);
            }
            books = self.books();
            // What may have changed while the lock was free: another call
            // of this rank stashed or holds the message, a peer reported a
            // mismatch.
            if books.ledger.has_verdicts()
                || !books.stash.is_empty()
                || self.held.load(Ordering::Relaxed) != 0
                || self.next_in[lp].load(Ordering::Relaxed) != stamp
            {
                drop(books);
                return general(&[], &[], read);
            }
        }
        let head = self.boxes.peek(lp, stamp);
        if (head.comm, head.seq) != key || head.sig != sig || self.notices_changed() {
            // Another call's message first, this call's with another
            // signature, or a notice that crossed the call: the general
            // exchange stashes, fails or acts on it.
            drop(books);
            return general(&[], &[], read);
        }
        books.ledger.finish_on_bypass(header);
        // SAFETY: the message arrived (its stamp was loaded with `Acquire`)
        // with this call's signature, so `len` is its length; it is
        // consumed only below, after the last use of the slice, and no
        // other call takes it out meanwhile: that needs the books' lock,
        // held from the check until then.
        let theirs = unsafe { self.boxes.payload(lp, stamp, len) };
        let out = read(theirs);
        // Under the lock of the pass, as the general exchange's short
        // reads: no other call takes or consumes the message meanwhile.
        self.consume(lp, stamp);
        drop(books);
        Ok(out)
    }
}
