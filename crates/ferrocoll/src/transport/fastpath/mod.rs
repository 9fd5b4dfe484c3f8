//! The small-collective fast path of the shared-memory transport.
//!
//! # Why
//!
//! A general call runs a plan through the executor and the progress engine:
//! the plan is built, every message gets a 64-byte frame header in a ring,
//! is matched against posted receives under the engine's mutex, and every
//! ring write touches the ring's head, its data, the reader's tail and both
//! doorbells: half a dozen cache lines cross between cores per message. For
//! a 2-rank 8-byte allreduce that came to ~0.7-1 us per call, against
//! 0.2-0.4 us for Open MPI, whose shared-memory collectives are a handful of
//! cache-line flag writes. This module is ferrocoll's equivalent.
//!
//! # What
//!
//! Every ordered pair of ranks on a host has a *mailbox* in the receiver's
//! segment ([`super::shm`], layout there): [`SLOTS`] slots of two cache
//! lines each, and an `ack` word the receiver writes. A message is one slot:
//! a *stamp* (the message's number on that pair, counting from 1), the
//! communicator id and call sequence number, the call's signature packed in
//! one word ([`pack()`]), and up to [`SLOT_PAYLOAD`] payload bytes (an 8-byte
//! message fits the stamp's own cache line). A longer payload, up to
//! [`EAGER_BYTES`] (16 KiB), goes into one of the pair's [`EAGER_BUFFERS`]
//! (16) *eager buffers*, beside the mailboxes in the receiver's segment:
//! buffer `stamp % EAGER_BUFFERS`; the slot still carries the stamp, the
//! key and the signature, from which the receiver derives the payload's
//! length (count x element size), so that a length mismatch is a
//! signature mismatch. The sender writes the payload and the slot and
//! stores the stamp with `Release`; the receiver, which knows the number of
//! the next message from each peer, polls that slot's stamp with `Acquire`,
//! reads the payload in place (the reduction reads the peer's slot or
//! eager buffer directly, [`FastPath::exchange`]) and then stores `ack`
//! with `Release`. Messages are consumed in order per pair, so `ack` (the
//! last consumed stamp) frees every slot and buffer below it.
//!
//! **Flow control, one invariant for both**: message `s` uses slot `s %
//! SLOTS` and, when long, eager buffer `s % EAGER_BUFFERS`; the sender
//! writes it only once `ack >= s - SLOTS` (short) or `ack >= s -
//! EAGER_BUFFERS` (long). The previous user of that slot or buffer had a
//! stamp at most `s - SLOTS` or `s - EAGER_BUFFERS`, so it was consumed;
//! and as `EAGER_BUFFERS <= SLOTS`, the one `ack` covers both. A sender may
//! so run up to [`SLOTS`] short or [`EAGER_BUFFERS`] long messages ahead of
//! a receiver. In the common case a call costs one cache-line transfer
//! each way (plus the payload's lines) and no system call, no allocation,
//! no clock read.
//!
//! **Reading in place.** A call leaves the messages it found at the heads
//! of their mailboxes there until all of its messages are in; then it
//! *holds* those heads (a bit per peer: no other call of this rank takes
//! them or looks past them), reads them, and consumes them. It holds only
//! once it waits for nothing more, so two calls (two communicators on two
//! threads) can never each hold what the other waits behind. A call that
//! needs a message lying behind another call's unheld message takes that
//! one out, copying its payload into the stash, as before.
//!
//! **Size rule.** A call qualifies when its per-rank bytes (allgather: per
//! block) are at most `small::max_message(n)`: one eager buffer per pair
//! (so a call has one message per pair in flight), and at most 48 KiB
//! from all peers together (`3 * EAGER_BYTES / (n - 1)`: 16 KiB on 2-4
//! ranks, 12 KiB on 5, 7 KiB on 8, 3.2 KiB on 16); beyond that the plans,
//! which move less than a whole contribution per peer, do better. Past
//! it, an allreduce on 3-16 ranks of any length runs in two steps, a
//! reduce-scatter and an allgather of the reduced blocks, in parts of at
//! most 64 KiB ([`small::two_step`]): the plans' `direct` without the
//! engine.
//!
//! **One pass.** A call of one short message to and from each peer (every
//! call on 2 ranks, broadcasts and reduces on 3 and 4, at most 4 KiB
//! received in all) takes [`FastPath::exchange_one_pass`] (`one_pass.rs`):
//! the same slots and books, the whole call one pass under one lock when
//! nothing unusual is in the way, and the general [`FastPath::exchange`]
//! for everything else (a 2-rank broadcast's root, which sets the pace,
//! runs about 860 instructions a call instead of 1440).
//!
//! **Streamed calls.** One-way calls longer than an eager buffer, reduces
//! of any length and broadcasts up to 512 KiB on 3-4 ranks, 2-rank
//! allreduces of any length and 2-rank allgathers and all-to-alls of
//! 16 KiB - 1 MiB blocks (each part both ways, in parts of the larger
//! eager buffers of small hosts, each rank sending several parts ahead:
//! `small::run_streamed_pair`) ([`small::streams`]), go as
//! consecutive messages of one eager buffer each (a [`Piece`] apiece), in
//! order, under the call's one key: the receiver reduces or copies each
//! part in place while the sender writes the next, up to [`EAGER_BUFFERS`]
//! parts ahead. Every part's packed
//! signature carries its own length and the call's number of parts
//! ([`pack::with_parts`]), so a streamed call against a whole one or a
//! shorter one fails on its first message; the call counts as finished
//! only with its last part, and the next parts of the ranks a part waits
//! for may lie in the stash without being a mismatch. The
//! eager buffers take 256 KiB of address space per ordered pair beyond 4
//! local ranks and 2 MiB up to 4 (costs and layout in [`super::shm`]).
//!
//! **Remote reads.** Where the job lets its ranks read each other's memory
//! (`process_vm_readv`, decided alike on every local rank at start-up),
//! allgathers and all-to-alls on 3-4 ranks, past the sizes the eager
//! buffers serve and up to 1 MiB a rank reads, and on 2 ranks of 4-16 KiB
//! blocks ([`small::reads_remote`]),
//! send each peer one slot whose payload is the address of the bytes that
//! peer needs; its signature is packed with its own mark and a 32-bit count
//! ([`pack::pack_remote`]), so it never matches an eager message. The
//! receiver reads the bytes straight from the sender's memory into its
//! output and then consumes the slot, as any other; the sender's call
//! returns only once every receiver has consumed its message
//! ([`FastPath::await_reads`]), so its buffer is never reused while read.
//! A call that takes such a message out for another call (the stash, see
//! below) reads the sender's bytes before it consumes the slot, for the
//! same reason. A 2-rank broadcast past one eager buffer is *split*: both
//! ends send an *address* message ([`Carries::Address`], its own mark
//! again; taken out for another call it is copied like any payload), the
//! receiver reads the first part from the root's memory while the root
//! writes the rest into the receiver's (`process_vm_writev`), and a second,
//! empty message each way says each is done. A 2-rank reduce of 32 KiB -
//! 4 MiB is split the same way: the root reads most of the other rank's
//! input and reduces it into its output, while the other rank reads the
//! rest of the root's input, reduces its own into it and writes the result
//! into the root's output. A 3-4 rank broadcast of 64-512 KiB is read from
//! the root's memory by every receiver, as the exchanges are.
//!
//! The collectives on top (`crate::fast`) exchange whole contributions in
//! one step: every rank writes to every rank it must inform and reads from
//! every rank it must hear (allreduce, allgather, barrier: all to all;
//! broadcast: root to all; reduce: all to root; all-to-all and
//! reduce-scatter: all to all, each peer its own block), then reduces in
//! rank order, so every rank computes bit-identical results. Which calls qualify is a
//! function of the call's signature, the group and a job-wide setting only
//! ([`small::eligible`]), never of this rank's state (another call in
//! flight, a busy lock): the peers cannot see that state, and both sides of
//! a call must use the same protocol.
//!
//! # Keeping the engine's guarantees
//!
//! * **Matching and ordering.** Messages are matched by (communicator,
//!   sequence number) like frames are, in FIFO order per peer. A message for
//!   another call (a non-blocking call, another communicator used from
//!   another thread) is *stashed* for that call to find, so concurrent fast
//!   calls never wait on each other. A call uses either the fast path or the
//!   rings for all its messages, decided alike on every rank, so ring frames
//!   and mailbox messages never need ordering among each other; point to
//!   point never uses the fast path.
//! * **Mismatch.** The signature travels in every slot. A message with this
//!   call's key but another signature fails the call with
//!   [`Error::Mismatch`] and tells the peer with the engine's mismatch
//!   notice. A message for a call this rank has already finished (fast or
//!   not: the finished list is shared, [`Ledger`]) is a late mismatch, as a
//!   late frame is. When the two ranks disagree even on the path (a tiny
//!   allreduce against a large broadcast), each side finds the other's
//!   message where it does not belong: the fast waiter checks the engine's
//!   unexpected frames for its key, and the engine, when it waits or ends a
//!   call, checks the mailboxes for messages of its calls.
//! * **Silent mismatch.** A fast call that has waited as long as an engine
//!   call waits before probing (100 ms) probes the peers it still waits
//!   to hear from with its header ([`Link::probe`]), and a peer's engine
//!   compares it with its call at that point, a fast call waiting there
//!   included: a reduce to root 0 against a broadcast from root 0 on two
//!   ranks (both only receive) fails on both at once.
//! * **Notices.** Mismatch, lost-rank, abort and goodbye notices still travel as
//!   frames through the rings. A rank busy with fast calls does not read its
//!   rings, so the sender of such a notice also bumps a `notices` counter in
//!   the receiver's segment (`Channel::alert`); every fast call compares it
//!   at its start and end (one load of a line nobody else writes) and lets
//!   the engine read its rings when it moved.
//! * **Waiting, deadlines, dead peers, abort.** A waiting call first polls
//!   the stamps without any lock: spinning while the rank has a core of its
//!   own, yielding when cores are shared, for the engine's polling time
//!   (spinning, the clock is read only after 64 polls, and then every 64
//!   polls; yielding costs more than a clock read anyway). After that
//!   it sleeps on the rank's doorbell (the same futex the engine uses; a
//!   sender wakes it only if it sleeps, after a `SeqCst` fence, see
//!   [`Mailboxes::sleep`]), at most 50 ms at a time. Before every sleep the
//!   engine runs once (notices, abort frames, mismatched frames), dead
//!   peers are looked for every 200 ms, and the deadline is checked: a
//!   timeout names the peer still awaited, as the engine's does. A gone
//!   peer fails the call, and is told to every rank as the origin, only if
//!   its message is still missing: one that wrote it and left (its last
//!   call done) is no crash ([`Link::checkup`]).
//! * **Checksums.** `FERROCOLL_CHECKSUM=1` turns the fast path off (decided
//!   job-wide at start-up): checksums guard the rings and sockets, and then
//!   every message goes through them.
//!
//! # Locking
//!
//! Per-pair message counters, the stash, the finished list and reported
//! mismatches live in one [`Ledger`] behind one mutex, which the fast path
//! holds only while it writes or reads slots, never while it waits. The
//! engine takes the ledger while holding its own state; the fast path never
//! takes the engine's state while holding the ledger.

mod mailbox;
mod one_pass;
mod pack;
pub(crate) mod small;
#[cfg(test)]
mod tests;
mod transport;

pub(crate) use transport::FastTransport;

use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::engine::{Bypass, Fault, Ledger, LedgerLock, Link, Stray, Verdict};
use super::shm::{EAGER_BUFFERS, EAGER_BYTES, SLOTS, SLOT_PAYLOAD};
use super::{Header, Signature};
use crate::error::{Error, Result};
pub(crate) use mailbox::Mailboxes;
use mailbox::SlotHeader;
use pack::{
    describe, is_remote, message_bytes, pack, pack_address, pack_remote, packed_len, with_parts,
};
pub(crate) use pack::{ADDRESS_PAYLOAD, REMOTE_PAYLOAD};

/// What [`FastPath::exchange`] hands its passes: the payload for each rank
/// it sends to, those ranks, the ranks it receives from, where their
/// messages lie, and room for the stamp of the message sent to each rank
/// of `to`.
type Passes<'a, 'p> = (
    &'a [&'p [u8]],
    &'a [usize],
    &'a [usize],
    &'a mut [Got],
    &'a mut [u64],
);

/// Largest group the fast path serves: every rank reads one slot per peer,
/// so the cost grows with the group; beyond this the plans' trees and
/// butterflies do better.
pub(crate) const FAST_MAX_RANKS: usize = 16;

/// Longest read (the payloads of all peers together) a fast call does
/// while it still holds the books' lock of its last pass, to consume what
/// it read under the same lock ([`FastPath::exchange`]): a copy or
/// reduction of this size takes well under a microsecond, so another
/// thread's fast call is not kept out for long.
const READ_LOCKED_BYTES: usize = 4096;

/// Spare stash buffers kept for reuse (beyond them a buffer is freed).
const SPARE_KEPT: usize = 32;

/// Polls before the first clock read, and between clock reads while
/// spinning.
const CLOCK_EVERY: u32 = 64;

/// Longest sleep of a sender waiting for a slot to free: a receiver that
/// consumes wakes the sender only if it sees it asleep, without a fence,
/// so the sender must look again soon by itself.
const SPACE_SLICE: Duration = Duration::from_millis(1);

/// A mailbox message taken out of its slot (and eager buffer) for a call
/// that was not the one reading: its payload copied out.
struct Stashed {
    /// Sender (transport rank).
    peer: usize,
    head: SlotHeader,
    /// The payload (8-byte aligned, as the reduction kernels want); its
    /// length is `message_bytes(head.sig)` (for a remote-read message the
    /// bytes read from the sender's memory).
    data: Vec<u64>,
}

/// Where a fast call finds the message of one peer it receives from.
pub(crate) enum Got {
    /// Not found yet.
    Waiting,
    /// At the head of the peer's mailbox, message `stamp`, held for this
    /// call: read in place, consumed when the call is done with it.
    InPlace(u64),
    /// Taken out of the mailbox earlier (stashed by another call).
    Owned(Vec<u64>),
}

/// The fast path's books and the engine's ledger, under one lock (so a
/// pass takes one lock, not two): the engine reaches the ledger through
/// [`LedgerLock`], locking it after its own state; the fast path never
/// takes the engine's state while holding this.
struct Books {
    ledger: Ledger,
    /// By local rank: messages sent to it so far (the last stamp).
    sent: Vec<u64>,
    /// By local rank: the last `ack` seen from it (a lower bound).
    acked: Vec<u64>,
    /// Messages taken out of their mailbox for another call.
    stash: Vec<Stashed>,
    /// Buffers of stashed messages, kept for the next stash.
    spare: Vec<Vec<u64>>,
}

impl Books {
    /// Removes and returns the oldest stashed message with `key` from a
    /// sender that `from_sender` accepts.
    fn take_stashed(
        &mut self,
        key: (u64, u64),
        from_sender: impl Fn(usize) -> bool,
    ) -> Option<Stashed> {
        if self.stash.is_empty() {
            return None;
        }
        let at = self
            .stash
            .iter()
            .position(|s| from_sender(s.peer) && (s.head.comm, s.head.seq) == key)?;
        Some(self.stash.remove(at))
    }

    /// Keeps `data` (a stashed message's buffer) for reuse.
    fn recycle(&mut self, data: Vec<u64>) {
        // A remote-read message's buffer, or a streamed allreduce's part
        // in a large eager buffer, may be large: not kept.
        if self.spare.len() < SPARE_KEPT
            && data.capacity() > 0
            && data.capacity() <= EAGER_BYTES / 8
        {
            self.spare.push(data);
        }
    }
}

/// Something a fast call found that fails it; handled by the engine
/// ([`Link::fail`]) once the books are released.
enum Problem {
    /// `peer` sent a message for this call with another signature, or a
    /// message for this call although the call expects none from it.
    Mismatch { peer: usize, theirs: u64 },
    /// `peer` sent a message for the call with `key`, which this rank has
    /// finished.
    Late {
        peer: usize,
        key: (u64, u64),
        theirs: u64,
    },
    /// A peer already reported a mismatch for this call.
    Reported(Verdict),
}

impl Problem {
    /// The engine's name for it.
    fn fault(self) -> Fault {
        match self {
            Problem::Mismatch { peer, theirs } => Fault::Mismatch {
                peer,
                theirs: describe(theirs),
            },
            Problem::Late { peer, key, theirs } => Fault::Late {
                peer,
                key,
                theirs: describe(theirs),
            },
            Problem::Reported(verdict) => Fault::Reported(verdict),
        }
    }
}

/// What a fast call received, for it to read ([`FastPath::exchange`]).
pub(crate) struct Parts<'a> {
    fast: &'a FastPath,
    from: &'a [usize],
    got: &'a [Got],
    /// The payload's length (a remote-read message's: its address).
    len: usize,
    /// The messages are remote reads (`Piece::remote`).
    remote: bool,
}

impl Parts<'_> {
    /// The payload from the `i`-th rank the call receives from.
    pub(crate) fn get(&self, i: usize) -> &[u8] {
        match &self.got[i] {
            // SAFETY: the pass that returned `Done` saw this message arrive
            // with this call's signature (so `len` is its length) and holds
            // it: no call consumes it before `FastPath::release`, which
            // `exchange` calls after `read`, and so after the last use of
            // this borrow of `self`. (`exchange_one_pass` instead keeps the
            // books' lock, under which alone a message is consumed or taken
            // out, from the check of the message until after `read`.)
            Got::InPlace(stamp) => unsafe {
                let lp = self.fast.local(self.from[i]);
                self.fast.boxes.payload(lp, *stamp, self.len)
            },
            Got::Owned(data) => &bytemuck::cast_slice::<u64, u8>(data)[..self.len],
            Got::Waiting => unreachable!("a done call has every message"),
        }
    }

    /// The two words (an address, and what the call's protocol says) an
    /// address message from the `i`-th rank the call receives from carries
    /// ([`Carries::Address`]).
    pub(crate) fn address(&self, i: usize) -> (u64, u64) {
        let bytes = self.get(i);
        let word =
            |k: usize| u64::from_ne_bytes(bytes[8 * k..8 * k + 8].try_into().expect("8 bytes"));
        (word(0), word(1))
    }

    /// The process id of the `i`-th rank the call receives from (remote
    /// reads are on).
    pub(crate) fn pid(&self, i: usize) -> u32 {
        self.fast.pid(self.from[i])
    }

    /// Writes the message from the `i`-th rank the call receives from into
    /// `dst` (its length): the payload, or for a remote-read message the
    /// bytes at the address it carries, read from the sender's memory
    /// (or already read, when another call stashed the message).
    pub(crate) fn read_into(&self, i: usize, dst: &mut [u8]) -> Result<()> {
        match &self.got[i] {
            Got::InPlace(_) if self.remote => {
                let addr = u64::from_ne_bytes(
                    self.get(i)[..REMOTE_PAYLOAD]
                        .try_into()
                        .expect("an address's bytes"),
                );
                let peer = self.from[i];
                let pid = self.fast.pid(peer);
                // The sender waits, its buffer untouched, until this
                // rank consumes the message (after this read).
                // A failed read: the sender's process is gone.
                crate::transport::shm::cma_read(pid, addr, dst)
                    .map_err(|_| Error::PeerLost { rank: peer })
            }
            Got::Owned(data) if self.remote => {
                dst.copy_from_slice(&bytemuck::cast_slice::<u64, u8>(data)[..dst.len()]);
                Ok(())
            }
            _ => {
                dst.copy_from_slice(self.get(i));
                Ok(())
            }
        }
    }
}

/// The fast path of one rank: its mailboxes and the ranks they reach.
pub(crate) struct FastPath {
    boxes: Mailboxes,
    /// Transport rank -> local rank, for ranks on this host.
    local_of: Vec<Option<usize>>,
    /// Local rank -> transport rank.
    world_of: Vec<usize>,
    /// By local rank: the stamp of the next message expected from it.
    /// Changed only under the ledger lock; atomic so that waiters can poll
    /// without the lock.
    next_in: Vec<AtomicU64>,
    /// By local rank: the last stamp sent to it (as in the ledger), for
    /// lock-free polling of a full mailbox.
    sent_out: Vec<AtomicU64>,
    /// Bumped whenever a message is stashed, so waiters look again.
    stash_gen: AtomicU64,
    /// The `notices` count last acted on.
    notices_seen: AtomicU64,
    /// Bit `lp`: the message at the head of local rank `lp`'s mailbox is
    /// held by a call that reads it in place; no other call takes it or
    /// looks past it until that call consumes it. Changed only under the
    /// books' lock.
    held: AtomicU32,
    /// A call found a held head in its way: the holder, when it consumes,
    /// makes waiters look again (`stash_gen`, the doorbell).
    blocked: AtomicBool,
    /// The books and the engine's ledger (see [`Books`]).
    books: Mutex<Books>,
    /// By local rank, the process ids, when every local rank may read
    /// every other's memory (`process_vm_readv`, decided job-wide at
    /// start-up): then large exchanges send addresses, not bytes
    /// (`small::reads_remote`).
    pids: Option<Vec<u32>>,
}

/// Which of its call's messages a [`FastPath::exchange`] sends each peer
/// and receives from each: the whole call's one, or one part of a streamed
/// call (`small::streams`), whose payloads follow each other through the
/// same mailboxes, in order, under the call's one key.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Piece {
    /// Elements in this message (each payload, or what a remote read
    /// reads), of the call's type.
    pub(crate) count: usize,
    /// Messages the call sends each peer (1: the whole call in one).
    pub(crate) parts: usize,
    /// Whether this is the call's last message: the call counts as
    /// finished (for late-message checks) once it is in, not before, so
    /// that a part still to come is never taken for a late message.
    pub(crate) last: bool,
    /// What the message's payload is.
    pub(crate) carries: Carries,
    /// `Some(t)` for a two-step allreduce whose count leaves `t` (1 to
    /// `n - 1`) elements past `n` equal blocks (`small::two_step`): packed
    /// in the signature's root byte, which an allreduce does not use, so
    /// that two counts whose messages have one length still differ.
    pub(crate) tail: Option<usize>,
}

/// What a fast-path message's payload is ([`Piece::carries`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Carries {
    /// The bytes themselves (`count` elements).
    Bytes,
    /// The address of the sender's `count` elements, which the receiver
    /// reads from its memory; the sender's call returns only once every
    /// receiver has consumed the message (`small::reads_remote`).
    ReadFromSender,
    /// The address of a buffer of the sender's, used as the call's
    /// protocol says (the 2-rank broadcast split between both ends); the
    /// message is an ordinary one of 8 bytes otherwise.
    Address,
}

impl Piece {
    /// The whole call `header` in one message.
    pub(crate) fn whole(header: &Header) -> Piece {
        Piece {
            count: header.sig.count,
            parts: 1,
            last: true,
            carries: Carries::Bytes,
            tail: None,
        }
    }

    /// The whole call of `count` elements in one message that carries
    /// their address ([`Carries::ReadFromSender`]).
    pub(crate) fn read_from_sender(count: usize) -> Piece {
        Piece {
            count,
            parts: 1,
            last: true,
            carries: Carries::ReadFromSender,
            tail: None,
        }
    }
}

/// What one pass over the mailboxes achieved.
enum Pass {
    Done,
    Waiting,
    Failed(Problem),
}

/// Bits `0..n`.
fn all_bits(n: usize) -> u32 {
    debug_assert!(n <= 32);
    if n == 32 {
        u32::MAX
    } else {
        (1u32 << n) - 1
    }
}

/// The indices of the set bits of `mask`, lowest first.
fn bits(mut mask: u32) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        (mask != 0).then(|| {
            let i = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            i
        })
    })
}

impl FastPath {
    /// The fast path over `boxes`, whose local rank `i` is transport rank
    /// `world_of[i]`, in a transport of `size` ranks.
    pub(crate) fn new(boxes: Mailboxes, world_of: Vec<usize>, size: usize) -> FastPath {
        assert_eq!(boxes.local_size(), world_of.len());
        let mut local_of = vec![None; size];
        for (lp, &w) in world_of.iter().enumerate() {
            local_of[w] = Some(lp);
        }
        let n = world_of.len();
        // Stamps count from 1: the first message expected is number 1.
        FastPath {
            // Not the counter's current value: a peer that finished its own
            // start-up first may already have sent a notice (an abort) and
            // bumped it, and that notice must still be acted on. The
            // segment, and so the counter, started at 0.
            notices_seen: AtomicU64::new(0),
            boxes,
            local_of,
            world_of,
            next_in: (0..n).map(|_| AtomicU64::new(1)).collect(),
            sent_out: (0..n).map(|_| AtomicU64::new(0)).collect(),
            stash_gen: AtomicU64::new(0),
            held: AtomicU32::new(0),
            blocked: AtomicBool::new(false),
            books: Mutex::new(Books {
                ledger: Ledger::new(),
                sent: vec![0; n],
                acked: vec![0; n],
                stash: Vec::new(),
                spare: Vec::new(),
            }),
            pids: None,
        }
    }

    /// Lets large exchanges read the senders' memory: `pids` are the
    /// process ids by local rank (every local rank can read every other,
    /// as the job decided alike on all of them).
    pub(crate) fn with_remote_reads(mut self, pids: Vec<u32>) -> FastPath {
        assert_eq!(pids.len(), self.world_of.len());
        self.pids = Some(pids);
        self
    }

    /// Bytes of one eager buffer on this host: the most payload one
    /// message carries (`shm::eager_buffer_bytes`).
    pub(crate) fn eager_buffer_bytes(&self) -> usize {
        self.boxes.eager_buffer_bytes()
    }

    /// Whether large exchanges read the senders' memory
    /// ([`FastPath::with_remote_reads`]).
    pub(crate) fn reads_remote(&self) -> bool {
        self.pids.is_some()
    }

    /// The process id of `peer` (a transport rank on this host), for
    /// remote reads.
    fn pid(&self, peer: usize) -> u32 {
        self.pids.as_ref().expect("remote reads are on")[self.local(peer)]
    }

    /// Locks the books (a panic while they were held leaves them usable:
    /// they are consistent between passes).
    fn books(&self) -> MutexGuard<'_, Books> {
        self.books.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs the engine's checkup for call `header` (see [`Link::checkup`],
    /// which asks `still_missing` before it fails the call for a gone peer
    /// in `awaited`), having marked the notices seen so far as acted on:
    /// the engine reads the rings now, and a notice arriving later is acted
    /// on next time.
    fn checkup(
        &self,
        link: &Link<'_>,
        header: &Header,
        awaited: &[usize],
        liveness: bool,
        still_missing: &dyn Fn() -> bool,
    ) -> Result<()> {
        if link.is_aborted() {
            return Err(Error::Aborted);
        }
        self.notices_acted();
        link.checkup(header, awaited, liveness, still_missing)
    }

    /// Whether every rank of `group` (transport ranks) is reachable
    /// through the mailboxes, and the group is small enough.
    pub(crate) fn serves(&self, group: &[usize]) -> bool {
        // `held` has a bit per local rank.
        const _: () = assert!(FAST_MAX_RANKS <= 32);
        (2..=FAST_MAX_RANKS).contains(&group.len())
            && group
                .iter()
                .all(|&w| self.local_of.get(w).is_some_and(Option::is_some))
    }

    fn local(&self, peer: usize) -> usize {
        self.local_of[peer].expect("a fast-path peer is on this host")
    }

    /// Whether a control notice arrived since the engine last read the
    /// rings for the fast path.
    pub(crate) fn notices_changed(&self) -> bool {
        self.boxes.notices() != self.notices_seen.load(Ordering::Relaxed)
    }

    /// Marks the notices seen so far as acted on (the caller then runs the
    /// engine).
    pub(crate) fn notices_acted(&self) {
        self.notices_seen
            .store(self.boxes.notices(), Ordering::Relaxed);
    }

    /// Lock-free: whether a message has arrived from any local rank that no
    /// call has taken yet.
    pub(crate) fn anything_new(&self) -> bool {
        (0..self.world_of.len()).any(|lp| self.arrived(lp))
    }

    /// Lock-free: whether the next message from local rank `lp` has
    /// arrived and is not held by a call reading it in place.
    fn arrived(&self, lp: usize) -> bool {
        let n = self.next_in[lp].load(Ordering::Relaxed);
        self.held.load(Ordering::Relaxed) & (1 << lp) == 0
            && self.boxes.inbound_stamp(lp, n).load(Ordering::Acquire) == n
    }

    /// The stamp and header of the next message from local peer `lp` when
    /// it has arrived and no other call holds it (under the books' lock).
    fn head(&self, lp: usize) -> Option<(u64, SlotHeader)> {
        if self.held.load(Ordering::Relaxed) & (1 << lp) != 0 {
            self.blocked.store(true, Ordering::Relaxed);
            return None;
        }
        let n = self.next_in[lp].load(Ordering::Relaxed);
        if self.boxes.inbound_stamp(lp, n).load(Ordering::Acquire) != n {
            return None;
        }
        Some((n, self.boxes.peek(lp, n)))
    }

    /// Marks message `stamp`, the head of local peer `lp`'s mailbox,
    /// consumed (the slot and eager buffer freed, and a sender waiting for
    /// them woken: no fence, it sleeps in short slices, see SPACE_SLICE).
    fn consume(&self, lp: usize, stamp: u64) {
        self.boxes.consume(lp, stamp);
        self.next_in[lp].store(stamp + 1, Ordering::Relaxed);
        self.boxes.wake(lp);
        // The next message's slot, fetched while this rank does other work:
        // the first poll of the next call then finds it near (measured in
        // bench/RESULTS.md, "small broadcast and reduce").
        self.boxes.prefetch(lp, stamp + 1);
    }

    /// Takes the head message `(stamp, head)` of local peer `lp` out of its
    /// mailbox into the stash, its payload copied (under the books' lock).
    /// A remote-read message is read from the sender's memory here, before
    /// it is consumed: consuming tells the sender its buffer is free.
    /// Returns false, leaving the message, when that read fails (the
    /// sender is gone; the waits' checkups report it).
    fn stash_head(&self, books: &mut Books, lp: usize, (stamp, head): (u64, SlotHeader)) -> bool {
        let remote = is_remote(head.sig) && self.pids.is_some();
        let payload_len = packed_len(head.sig).min(self.boxes.eager_buffer_bytes());
        let len = if remote {
            message_bytes(head.sig)
        } else {
            payload_len
        };
        // A remote read's buffer may be large: a fresh one, not a spare.
        let mut data = if remote {
            Vec::new()
        } else {
            books.spare.pop().unwrap_or_default()
        };
        data.clear();
        data.resize(len.div_ceil(8), 0);
        let dst = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut data)[..len];
        // SAFETY: the message has arrived (`head` saw its stamp) and is not
        // consumed until below, after the copy; `payload_len` is what its
        // signature gives (for a remote read: the address), clamped to an
        // eager buffer.
        let payload = unsafe { self.boxes.payload(lp, stamp, payload_len) };
        if remote {
            let addr = u64::from_ne_bytes(payload[..REMOTE_PAYLOAD].try_into().expect("8 bytes"));
            let pids = self.pids.as_ref().expect("checked above");
            if crate::transport::shm::cma_read(pids[lp], addr, dst).is_err() {
                return false;
            }
        } else {
            dst.copy_from_slice(payload);
        }
        self.consume(lp, stamp);
        books.stash.push(Stashed {
            peer: self.world_of[lp],
            head,
            data,
        });
        true
    }

    /// Moves every message that has arrived into the stash and returns the
    /// stashed messages that are for `ours` (calls the engine runs) or for
    /// calls finished here: the engine's check that no peer used the fast
    /// path where this rank used the rings.
    fn drain(&self, ledger: &mut Books, ours: &dyn Fn((u64, u64)) -> bool) -> Vec<Stray> {
        let mut stashed = false;
        for lp in 0..self.world_of.len() {
            while let Some(next) = self.head(lp) {
                if !self.stash_head(ledger, lp, next) {
                    break;
                }
                stashed = true;
            }
        }
        if stashed {
            self.stash_gen.fetch_add(1, Ordering::Relaxed);
            fence(Ordering::SeqCst);
            self.boxes.wake_self();
        }
        let mut found = Vec::new();
        let mut i = 0;
        while i < ledger.stash.len() {
            let s = &ledger.stash[i];
            let key = (s.head.comm, s.head.seq);
            if ours(key) || ledger.ledger.finished_with(key).is_some() {
                let s = ledger.stash.remove(i);
                found.push(Stray {
                    peer: s.peer,
                    key,
                    remote: describe(s.head.sig),
                });
                ledger.recycle(s.data);
            } else {
                i += 1;
            }
        }
        found
    }

    /// Sends `payloads[i]` to rank `to[i]` (the same slice to all for one
    /// contribution, one block each for an all-to-all) and receives one
    /// message from every rank of `from`, for the call `header` (transport
    /// ranks; `to` and `from` on this host, without this rank), then runs
    /// `read` on what arrived: `read(parts)` where `parts.get(i)` is the
    /// payload from `from[i]`, in place in shared memory where it can be
    /// (the message is consumed, and its slot and eager buffer freed, once
    /// `read` returns). Every message is `piece.count` elements (each
    /// payload too): the whole call's, or one part of a streamed call,
    /// which `header` (the whole call's) still names in waits, probes and
    /// errors. `got` is the caller's room for where each message lies (at
    /// least `from.len()` entries, all `Got::Waiting`).
    /// Waits at most `timeout` from when waiting starts.
    // The arguments are those of `Transport::exchange`, plus the engine's link.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn exchange<R>(
        &self,
        link: &Link<'_>,
        header: &Header,
        payloads: &[&[u8]],
        to: &[usize],
        from: &[usize],
        got: &mut [Got],
        (piece, timeout): (Piece, Duration),
        read: impl FnOnce(&Parts<'_>) -> R,
    ) -> Result<R> {
        assert!(to.len() < 32 && from.len() < 32 && got.len() >= from.len());
        let remote = piece.carries == Carries::ReadFromSender;
        let len = match piece.carries {
            Carries::Bytes => piece.count.saturating_mul(header.sig.dtype.size()),
            Carries::ReadFromSender => REMOTE_PAYLOAD,
            Carries::Address => ADDRESS_PAYLOAD,
        };
        assert!(len <= self.boxes.eager_buffer_bytes() && payloads.len() == to.len());
        assert!(payloads.iter().all(|p| p.len() == len));
        let message = Signature {
            count: piece.count,
            root: piece.tail.or(header.sig.root),
            ..header.sig
        };
        if piece.carries != Carries::Bytes {
            assert!(self.reads_remote(), "remote reads are off");
        }
        let mut sig = match piece.carries {
            Carries::Bytes => pack(&message),
            Carries::ReadFromSender => pack_remote(&message),
            Carries::Address => pack_address(&message),
        }
        .expect("fast-path calls pack");
        if piece.parts > 1 && piece.carries == Carries::Bytes {
            sig = with_parts(sig, piece.parts);
        }
        if link.is_aborted() {
            return Err(Error::Aborted);
        }
        if link.is_broken() || self.notices_changed() {
            // As the engine's precheck: sending to a gone peer fails at
            // once; receiving from one fails only if what it wrote before
            // leaving does not hold the message (the waits' checkups see
            // that, once a pass has looked). The notice may be the goodbye
            // of a peer whose message for this call is already here. Only
            // the ranks this call sends to are awaited here, and a gone
            // one is always missing: nothing it wrote stands for the
            // message this rank has to give it.
            self.checkup(link, header, to, false, &|| true)?;
        }
        let mut wait = Wait::new(link, timeout);
        let mut stamps = [0u64; 32];
        let passes = (payloads, to, from, &mut *got, &mut stamps[..to.len()]);
        // Whether the message needs an eager buffer (longer than a slot's
        // payload): known here from the piece, so the passes need not
        // unpack `sig` for it on every call.
        debug_assert_eq!(packed_len(sig), len);
        let eager = len > SLOT_PAYLOAD;
        let mut done = self.run_passes(link, header, (sig, piece.last, eager), passes, &mut wait);
        if wait.registered {
            match &mut done {
                Ok(Some(books)) => books.ledger.bypass_done(header.key()),
                _ => self.books().ledger.bypass_done(header.key()),
            }
        }
        if let Err(Error::Timeout { peer, .. }) = &done {
            // For the positions asked while the report is gathered (see
            // `Ledger::time_out`).
            self.books().ledger.time_out(*header, vec![*peer]);
        }
        let mut books = done?;
        if piece.carries != Carries::Bytes || len * from.len() > READ_LOCKED_BYTES {
            // A long read (a reduction of up to 16 KiB per peer, a read
            // or write of a peer's memory) does not keep other threads'
            // fast calls out meanwhile.
            books = None;
        }
        let got = &mut got[..from.len()];
        let out = read(&Parts {
            fast: self,
            from,
            got,
            len,
            remote,
        });
        match books {
            // A short read, done under the lock of the last pass: one lock
            // per call instead of two (a locked instruction each way, ~6 ns
            // apiece here, and each waits for the stores before it, an
            // `ack` that is often a cache miss).
            Some(mut books) => self.release_locked(&mut books, from, got),
            None => self.release(from, got),
        }
        if remote {
            // The receivers read this rank's memory: it stays untouched
            // until each has consumed the message (after its read).
            self.await_reads(link, header, to, &stamps[..to.len()], &mut wait)?;
        }
        Ok(out)
    }

    /// Waits until every rank of `to` has consumed message `stamps[i]` of
    /// this rank (its remote read is done), or fails (abort, deadline, a
    /// receiver gone).
    fn await_reads(
        &self,
        link: &Link<'_>,
        header: &Header,
        to: &[usize],
        stamps: &[u64],
        wait: &mut Wait,
    ) -> Result<()> {
        let pending = || {
            let mut mask = 0u32;
            for (i, &stamp) in stamps.iter().enumerate() {
                if self.boxes.acked_by(self.local(to[i])) < stamp {
                    mask |= 1 << i;
                }
            }
            mask
        };
        loop {
            let left = pending();
            if left == 0 {
                return Ok(());
            }
            let awaited = || bits(left).map(|i| to[i]).collect::<Vec<_>>();
            // A gone receiver that has not read is always missing.
            let ready = || pending() != left;
            wait.until(
                self,
                link,
                header,
                (&ready, &awaited, &Vec::new),
                &|| true,
                true,
            )?;
        }
    }

    /// Consumes the held messages of a call done reading them (see
    /// [`FastPath::exchange`]), keeps the buffers of stashed ones, and
    /// leaves `got` all `Got::Waiting`.
    fn release(&self, from: &[usize], got: &mut [Got]) {
        if got.iter().all(|g| matches!(g, Got::Waiting)) {
            // Nothing received (a broadcast's root, a call that failed
            // before its first message): no lock to take.
            return;
        }
        self.release_locked(&mut self.books(), from, got);
    }

    /// [`FastPath::release`] with the books' lock held.
    fn release_locked(&self, books: &mut Books, from: &[usize], got: &mut [Got]) {
        let mut held = 0u32;
        for (i, g) in got.iter_mut().enumerate() {
            match std::mem::replace(g, Got::Waiting) {
                Got::InPlace(stamp) => {
                    let lp = self.local(from[i]);
                    self.consume(lp, stamp);
                    held |= 1 << lp;
                }
                Got::Owned(data) => books.recycle(data),
                Got::Waiting => {}
            }
        }
        // `held` and `blocked` change only under the books' lock (held
        // here), so a load and a store do what a read-modify-write would,
        // without its cost (a locked instruction that also drains the store
        // of the `ack` just written, often a cache miss).
        self.held
            .store(self.held.load(Ordering::Relaxed) & !held, Ordering::Relaxed);
        if held != 0 && self.blocked.load(Ordering::Relaxed) {
            self.blocked.store(false, Ordering::Relaxed);
            // Another call found a held head in its way and may sleep.
            self.stash_gen.fetch_add(1, Ordering::Relaxed);
            fence(Ordering::SeqCst);
            self.boxes.wake_self();
        }
    }

    /// The passes of [`FastPath::exchange`] until the call has every
    /// message (held or owned, in `got`) or fails. Returns the books, still
    /// locked by the last pass, unless a notice had to be acted on after it.
    fn run_passes(
        &self,
        link: &Link<'_>,
        header: &Header,
        (sig, last, eager): (u64, bool, bool),
        (payloads, to, from, got, stamps): Passes<'_, '_>,
        wait: &mut Wait,
    ) -> Result<Option<MutexGuard<'_, Books>>> {
        let mut to_send = all_bits(to.len());
        let mut to_recv = all_bits(from.len());
        // Bit i: the message from `from[i]` was at the head of its mailbox
        // in the last pass (not taken: it is read in place once all are).
        let mut present = 0u32;
        let mut first = true;
        let books = loop {
            let mut books = self.books();
            let pass = self.pass(
                &mut books,
                header,
                sig,
                payloads,
                (to, &mut to_send, &mut *stamps),
                (from, &mut to_recv, &mut present, got),
                (first, last, eager),
            );
            first = false;
            match pass {
                Pass::Done => break books,
                Pass::Failed(problem) => {
                    drop(books);
                    return Err(link.fail(header, problem.fault()));
                }
                Pass::Waiting => {}
            }
            let gen = self.stash_gen.load(Ordering::Relaxed);
            drop(books);
            let sends = (to, to_send, eager);
            wait.until_ready(self, link, header, sends, (from, to_recv & !present), gen)?;
        };
        // A notice that crossed this call (the peer found a mismatch).
        if self.notices_changed() {
            drop(books);
            // Nothing awaited: `still_missing` is never asked.
            if let Err(e) = self.checkup(link, header, &[], false, &|| true) {
                self.release(from, got);
                return Err(e);
            }
            return Ok(None);
        }
        Ok(Some(books))
    }

    /// One pass under the ledger: write what can be written, find what has
    /// arrived, and, once every message is there, hold those at the heads
    /// of their mailboxes for the call to read in place and finish it.
    #[allow(clippy::too_many_arguments)]
    fn pass(
        &self,
        ledger: &mut Books,
        header: &Header,
        sig: u64,
        payloads: &[&[u8]],
        (to, to_send, stamps): (&[usize], &mut u32, &mut [u64]),
        (from, to_recv, present, got): (&[usize], &mut u32, &mut u32, &mut [Got]),
        (first, last, eager): (bool, bool, bool),
    ) -> Pass {
        let key = header.key();
        if first && ledger.ledger.has_verdicts() {
            if let Some(verdict) = ledger.ledger.take_verdict(key) {
                return Pass::Failed(Problem::Reported(verdict));
            }
        }
        // On the first pass after a call that ran on the engine, look at
        // what arrived before writing: a message of that call here (a peer
        // that took this path there) must fail this call before its own
        // message goes out, or that peer could complete its call on it and
        // miss the mismatch. After a call on this path there is none: it
        // read its mailboxes (and the read costs ~60 ns of the ~0.4 us an
        // 8-byte call takes, bench/latency.sh).
        let mut stashed = false;
        if first && !ledger.ledger.bypass_finished_last() {
            match self.take_arrived(ledger, key, sig, (from, to_recv, present, got)) {
                Ok(s) => stashed = s,
                Err(problem) => return Pass::Failed(problem),
            }
        }
        if *to_send != 0 {
            // A payload longer than a slot's goes into eager buffer `stamp %
            // EAGER_BUFFERS` of the pair, last used by message `stamp -
            // EAGER_BUFFERS` or earlier; the one `ack` (consumed messages,
            // in order) covers slots and buffers alike, since
            // EAGER_BUFFERS <= SLOTS: a sender may be SLOTS messages ahead
            // of its receiver, EAGER_BUFFERS when it needs a buffer.
            let ahead = if eager { EAGER_BUFFERS } else { SLOTS } as u64;
            let head = SlotHeader {
                comm: header.comm,
                seq: header.seq,
                sig,
            };
            let mut wrote = 0u32;
            for i in bits(*to_send) {
                let lp = self.local(to[i]);
                let stamp = ledger.sent[lp] + 1;
                if stamp > ledger.acked[lp] + ahead {
                    ledger.acked[lp] = self.boxes.acked_by(lp);
                    if stamp > ledger.acked[lp] + ahead {
                        continue; // full: the receiver is that far behind
                    }
                }
                self.boxes.put(lp, stamp, head, payloads[i]);
                ledger.sent[lp] = stamp;
                stamps[i] = stamp;
                self.sent_out[lp].store(stamp, Ordering::Relaxed);
                wrote |= 1 << i;
            }
            *to_send &= !wrote;
            if wrote != 0 {
                // Pairs with the fence in `Mailboxes::sleep`.
                fence(Ordering::SeqCst);
                for i in bits(wrote) {
                    self.boxes.wake(self.local(to[i]));
                }
            }
        }
        if *to_recv != 0 {
            match self.take_arrived(ledger, key, sig, (from, to_recv, present, got)) {
                Ok(s) => stashed |= s,
                Err(problem) => return Pass::Failed(problem),
            }
        } else {
            // Nothing (left) to receive: a one-way call's sender looks at
            // no mailbox (what `take_arrived` would conclude, without its
            // call; a stray for this call is still looked for below).
            *present = 0;
        }
        if stashed {
            self.stash_gen.fetch_add(1, Ordering::Relaxed);
            // Another thread of this rank may sleep waiting for it.
            fence(Ordering::SeqCst);
            self.boxes.wake_self();
        }
        if *to_send != 0 || *to_recv & !*present != 0 {
            return Pass::Waiting;
        }
        // Every message is here. One for this call from a rank it expects
        // nothing from means that rank called something else here (before
        // a streamed call's last part, the next parts of the ranks it
        // receives from may lie in the stash already: those are its own;
        // a part that only sends, as a streamed 2-rank allreduce's sends
        // ahead, receives from no one but belongs to a call that does, so
        // its call's last part looks instead).
        let stray = if last {
            ledger.take_stashed(key, |_| true)
        } else if from.is_empty() {
            None
        } else {
            ledger.take_stashed(key, |p| !from.contains(&p))
        };
        if let Some(s) = stray {
            return Pass::Failed(Problem::Mismatch {
                peer: s.peer,
                theirs: s.head.sig,
            });
        }
        if let Some(verdict) = ledger.ledger.take_verdict(key) {
            return Pass::Failed(Problem::Reported(verdict));
        }
        // Hold the heads this call reads in place: no other call takes
        // them or looks past them until `release`. Holding only now, with
        // every message of the call here, means a holder never waits, so
        // holds cannot form a cycle between two calls.
        let mut held = 0u32;
        for i in bits(*present) {
            let lp = self.local(from[i]);
            got[i] = Got::InPlace(self.next_in[lp].load(Ordering::Relaxed));
            held |= 1 << lp;
        }
        // Under the books' lock, as every change of `held` (see `release`).
        self.held
            .store(self.held.load(Ordering::Relaxed) | held, Ordering::Relaxed);
        *to_recv = 0;
        if last {
            ledger.ledger.finish_on_bypass(header);
        }
        Pass::Done
    }

    /// Looks at what arrived for the receives still in `to_recv`: a
    /// message of this call taken out earlier (by another call) moves into
    /// `got` and leaves `to_recv`; one at the head of its mailbox sets its
    /// bit in `present` (recomputed on every pass: another call may stash
    /// it meanwhile); messages of other calls in front of it are stashed.
    /// Returns whether it stashed any, or the problem that fails the call (a
    /// message of this call with another signature, or one of a call this
    /// rank finished).
    fn take_arrived(
        &self,
        ledger: &mut Books,
        key: (u64, u64),
        sig: u64,
        (from, to_recv, present, got): (&[usize], &mut u32, &mut u32, &mut [Got]),
    ) -> std::result::Result<bool, Problem> {
        let mut stashed = false;
        *present = 0;
        for i in bits(*to_recv) {
            let peer = from[i];
            let lp = self.local(peer);
            if let Some(s) = ledger.take_stashed(key, |p| p == peer) {
                if s.head.sig != sig {
                    return Err(Problem::Mismatch {
                        peer,
                        theirs: s.head.sig,
                    });
                }
                got[i] = Got::Owned(s.data);
                *to_recv &= !(1 << i);
                continue;
            }
            while let Some((stamp, head)) = self.head(lp) {
                let theirs = (head.comm, head.seq);
                if theirs == key {
                    if head.sig != sig {
                        return Err(Problem::Mismatch {
                            peer,
                            theirs: head.sig,
                        });
                    }
                    *present |= 1 << i;
                    break;
                }
                if ledger.ledger.finished_with(theirs).is_some() {
                    return Err(Problem::Late {
                        peer,
                        key: theirs,
                        theirs: head.sig,
                    });
                }
                // For another call (another communicator, a non-blocking
                // call, the next call of a peer that is ahead).
                if !self.stash_head(ledger, lp, (stamp, head)) {
                    break;
                }
                stashed = true;
            }
        }
        Ok(stashed)
    }

    /// Lock-free: whether another pass may get further (a message arrived
    /// from a rank in `from`, a message was stashed, or a full mailbox to a
    /// rank in `to` has room: for `eager` messages, a free eager buffer).
    fn ready(
        &self,
        (to, to_send, eager): (&[usize], u32, bool),
        recvs: (&[usize], u32),
        gen: u64,
    ) -> bool {
        let ahead = if eager { EAGER_BUFFERS } else { SLOTS } as u64;
        self.received(recvs, gen)
            || bits(to_send).any(|i| {
                let lp = self.local(to[i]);
                self.boxes.acked_by(lp) + ahead > self.sent_out[lp].load(Ordering::Relaxed)
            })
    }

    /// Lock-free: the receiving half of [`FastPath::ready`] (a message
    /// arrived from a rank in `from`, or one was stashed, maybe from one of
    /// them). Room to send does not count: it is no message from anyone.
    fn received(&self, (from, to_recv): (&[usize], u32), gen: u64) -> bool {
        self.stash_gen.load(Ordering::Relaxed) != gen
            || bits(to_recv).any(|i| self.arrived(self.local(from[i])))
    }
}

/// The waiting policy of a fast call (see the module documentation).
struct Wait {
    dedicated: bool,
    /// How long to poll before sleeping.
    spin: Duration,
    timeout: Duration,
    polls: u32,
    /// Set at the first clock read.
    start: Option<Instant>,
    /// The call is listed in the ledger as waiting long (for the positions
    /// a peer's probe asks for), and must be taken off when it ends.
    registered: bool,
    /// The call has probed the peers it waits on.
    probed: bool,
}

impl Wait {
    fn new(link: &Link<'_>, timeout: Duration) -> Wait {
        Wait {
            dedicated: link.dedicated_core,
            spin: link.spin,
            timeout,
            polls: 0,
            start: None,
            registered: false,
            probed: false,
        }
    }

    /// Returns when another pass may get further, or fails (abort,
    /// deadline, a dead peer, a mismatch found by the engine).
    fn until_ready(
        &mut self,
        fast: &FastPath,
        link: &Link<'_>,
        header: &Header,
        sends: (&[usize], u32, bool),
        recvs: (&[usize], u32),
        gen: u64,
    ) -> Result<()> {
        let awaited = || {
            bits(recvs.1)
                .map(|i| recvs.0[i])
                .chain(bits(sends.1).map(|i| sends.0[i]))
                .collect()
        };
        let hearing = || bits(recvs.1).map(|i| recvs.0[i]).collect();
        // For the checkups: whether the call still lacks what it waits for
        // from the peers in `awaited`. A peer may write the message this
        // call waits for and exit (its last call done, its process gone)
        // after the poll that missed it: its slot is still in our segment,
        // and the call must take it, not fail with that peer, nor tell every
        // rank it crashed. Room to send to a gone receiver does not count:
        // sending to a gone peer fails, as on the engine.
        let still_missing = || !fast.received(recvs, gen);
        let ready = || fast.ready(sends, recvs, gen);
        self.until(
            fast,
            link,
            header,
            (&ready, &awaited, &hearing),
            &still_missing,
            sends.1 != 0,
        )
    }

    /// Returns once `ready()`, or after one sleep, or fails (abort,
    /// deadline, a dead peer in `awaited()`, a mismatch found by the
    /// engine). `hearing()` are the peers to probe when the wait is long,
    /// `still_missing()` whether what the call waits for from a gone peer
    /// is still missing; `short_slices` sleeps in [`SPACE_SLICE`]s (the
    /// peers consume without a fence, see there).
    #[allow(clippy::type_complexity)]
    fn until(
        &mut self,
        fast: &FastPath,
        link: &Link<'_>,
        header: &Header,
        (ready, awaited, hearing): (
            &dyn Fn() -> bool,
            &dyn Fn() -> Vec<usize>,
            &dyn Fn() -> Vec<usize>,
        ),
        still_missing: &dyn Fn() -> bool,
        short_slices: bool,
    ) -> Result<()> {
        loop {
            if ready() {
                return Ok(());
            }
            if link.is_aborted() {
                return Err(Error::Aborted);
            }
            if fast.notices_changed() {
                fast.checkup(link, header, &awaited(), false, still_missing)?;
                return Ok(());
            }
            self.polls += 1;
            if self.dedicated && (self.polls < CLOCK_EVERY || self.polls % CLOCK_EVERY != 0) {
                std::hint::spin_loop();
                continue;
            }
            let now = Instant::now();
            let start = *self.start.get_or_insert(now);
            if now.duration_since(start) >= self.timeout {
                let peer = awaited().first().copied().unwrap_or(link.rank);
                return Err(Error::Timeout {
                    collective: header.sig.to_string(),
                    seq: header.seq & !Header::P2P_BIT,
                    rank: link.rank,
                    peer,
                    waited: now.duration_since(start),
                    report: String::new(),
                });
            }
            if now.duration_since(start) < self.spin {
                if !self.dedicated {
                    std::thread::yield_now();
                }
                continue;
            }
            // Polled long enough: let the engine look at the rings (notices,
            // abort, frames of a peer on the other path, dead peers), then
            // sleep until something rings. From now on a peer's probe may
            // ask where this rank is: the engine does not see this call.
            if !self.registered {
                fast.books().ledger.bypass_waits(*header);
                self.registered = true;
            }
            if !self.probed && now.duration_since(start) >= link.probe_after() {
                // Long for any message: ask the peers this call waits to
                // hear from (a mismatch where no message would show it,
                // such as a reduce against a broadcast with the same root
                // on two ranks: both only receive; see engine/desync.rs).
                self.probed = true;
                link.probe(header, &hearing());
            }
            if let Err(e) = fast.checkup(link, header, &awaited(), true, still_missing) {
                // The checkup itself lets a call go on whose awaited peer
                // left after writing its message (`still_missing`), before
                // it declares anything. What is left here is a crash
                // already declared (a peer gone without a goodbye, or one
                // named by another rank): as the engine's calls that have
                // everything they wait for, a call whose message arrived
                // meanwhile still takes it.
                if matches!(e, Error::PeerLost { .. }) && !still_missing() {
                    return Ok(());
                }
                return Err(e);
            }
            let left = (start + self.timeout).saturating_duration_since(Instant::now());
            let mut slice = left.min(super::engine::SLEEP_SLICE);
            if short_slices {
                slice = slice.min(SPACE_SLICE);
            }
            fast.boxes.sleep(slice, || {
                ready() || fast.notices_changed() || link.is_aborted()
            });
            return Ok(());
        }
    }
}

impl LedgerLock for FastPath {
    fn with_ledger(&self, f: &mut dyn FnMut(&mut Ledger)) {
        f(&mut self.books().ledger)
    }
}

impl Bypass for FastPath {
    fn anything_new(&self) -> bool {
        FastPath::anything_new(self)
    }

    fn strays(&self, ours: &dyn Fn((u64, u64)) -> bool) -> Vec<Stray> {
        self.drain(&mut self.books(), ours)
    }
}
