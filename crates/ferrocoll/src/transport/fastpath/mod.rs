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
//! message fits the stamp's own cache line). The sender writes the slot and
//! stores the stamp with `Release`; the receiver, which knows the number of
//! the next message from each peer, polls that slot's stamp with `Acquire`,
//! copies the payload out and stores `ack` with `Release`. A sender reuses a
//! slot only once `ack` shows its previous message was taken, so it may run
//! up to [`SLOTS`] messages ahead of a receiver. In the common case a call
//! costs one cache-line transfer each way and no system call, no
//! allocation, no clock read.
//!
//! The collectives on top (`crate::fast`) exchange whole contributions in
//! one step: every rank writes to every rank it must inform and reads from
//! every rank it must hear (allreduce, allgather, barrier: all to all;
//! broadcast: root to all; reduce: all to root), then reduces in rank order,
//! so every rank computes bit-identical results. Which calls qualify is a
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
//! * **Notices.** Mismatch, lost-rank and abort notices still travel as
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
//!   timeout names the peer still awaited, as the engine's does.
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
mod pack;
pub(crate) mod small;
mod transport;

pub(crate) use transport::FastTransport;

use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::engine::{Bypass, Fault, Ledger, LedgerLock, Link, Stray, Verdict};
use super::shm::{SLOTS, SLOT_PAYLOAD};
use super::Header;
use crate::error::{Error, Result};
pub(crate) use mailbox::{Mailboxes, SlotMessage};
use pack::packed_len;
use pack::{describe, message_len, pack};

/// Largest group the fast path serves: every rank reads one slot per peer,
/// so the cost grows with the group; beyond this the plans' trees and
/// butterflies do better.
pub(crate) const FAST_MAX_RANKS: usize = 16;

/// A received payload (8-byte aligned, as the reduction kernels want).
pub(crate) type Payload = [u64; SLOT_PAYLOAD / 8];

/// Polls before the first clock read, and between clock reads while
/// spinning.
const CLOCK_EVERY: u32 = 64;

/// Longest sleep of a sender waiting for a slot to free: a receiver that
/// consumes wakes the sender only if it sees it asleep, without a fence,
/// so the sender must look again soon by itself.
const SPACE_SLICE: Duration = Duration::from_millis(1);

/// A mailbox message taken for a call that was not the one reading.
struct Stashed {
    /// Sender (transport rank).
    peer: usize,
    msg: SlotMessage,
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
}

impl Books {
    /// Removes and returns the oldest stashed message with `key` from
    /// `peer` (any peer when `None`).
    fn take_stashed(&mut self, peer: Option<usize>, key: (u64, u64)) -> Option<Stashed> {
        if self.stash.is_empty() {
            return None;
        }
        let at = self
            .stash
            .iter()
            .position(|s| peer.map_or(true, |p| s.peer == p) && (s.msg.comm, s.msg.seq) == key)?;
        Some(self.stash.remove(at))
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
    /// The books and the engine's ledger (see [`Books`]).
    books: Mutex<Books>,
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
            books: Mutex::new(Books {
                ledger: Ledger::new(),
                sent: vec![0; n],
                acked: vec![0; n],
                stash: Vec::new(),
            }),
        }
    }

    /// Locks the books (a panic while they were held leaves them usable:
    /// they are consistent between passes).
    fn books(&self) -> MutexGuard<'_, Books> {
        self.books.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs the engine's checkup for call `header` (see [`Link::checkup`]),
    /// having marked the notices seen so far as acted on: the engine reads
    /// the rings now, and a notice arriving later is acted on next time.
    fn checkup(
        &self,
        link: &Link<'_>,
        header: &Header,
        awaited: &[usize],
        liveness: bool,
    ) -> Result<()> {
        if link.is_aborted() {
            return Err(Error::Aborted);
        }
        self.notices_acted();
        link.checkup(header, awaited, liveness)
    }

    /// Whether every rank of `group` (transport ranks) is reachable
    /// through the mailboxes, and the group is small enough.
    pub(crate) fn serves(&self, group: &[usize]) -> bool {
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
        (0..self.world_of.len()).any(|lp| {
            let n = self.next_in[lp].load(Ordering::Relaxed);
            self.boxes.inbound_stamp(lp, n).load(Ordering::Acquire) == n
        })
    }

    /// The next message from local peer `lp` when it has arrived, taken
    /// out of its slot (the slot freed and a sender waiting for it woken:
    /// no fence, it sleeps in short slices, see SPACE_SLICE).
    fn take_next(&self, lp: usize) -> Option<SlotMessage> {
        let n = self.next_in[lp].load(Ordering::Relaxed);
        if self.boxes.inbound_stamp(lp, n).load(Ordering::Acquire) != n {
            return None;
        }
        let msg = self.boxes.take(lp, n, packed_len);
        self.next_in[lp].store(n + 1, Ordering::Relaxed);
        self.boxes.wake(lp);
        Some(msg)
    }

    /// Moves every message that has arrived into the stash and returns the
    /// stashed messages that are for `ours` (calls the engine runs) or for
    /// calls finished here: the engine's check that no peer used the fast
    /// path where this rank used the rings.
    fn drain(&self, ledger: &mut Books, ours: &dyn Fn((u64, u64)) -> bool) -> Vec<Stray> {
        let mut stashed = false;
        for lp in 0..self.world_of.len() {
            while let Some(msg) = self.take_next(lp) {
                ledger.stash.push(Stashed {
                    peer: self.world_of[lp],
                    msg,
                });
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
            let key = (s.msg.comm, s.msg.seq);
            if ours(key) || ledger.ledger.finished_with(key).is_some() {
                let s = ledger.stash.remove(i);
                found.push(Stray {
                    peer: s.peer,
                    key,
                    remote: describe(s.msg.sig),
                });
            } else {
                i += 1;
            }
        }
        found
    }

    /// Sends `payload` to every rank of `to` and receives one message from
    /// every rank of `from` into `got` (same order), for the call `header`
    /// (transport ranks; `to` and `from` on this host, without this rank).
    /// Every message is [`message_len`] bytes (`payload` too, unless `to`
    /// is empty). Waits at most `timeout` from when waiting starts.
    // The arguments are those of `Transport::exchange`, plus the engine's link.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn exchange(
        &self,
        link: &Link<'_>,
        header: &Header,
        payload: &[u8],
        to: &[usize],
        from: &[usize],
        got: &mut [Payload],
        timeout: Duration,
    ) -> Result<()> {
        assert!(to.len() < 32 && from.len() < 32 && got.len() >= from.len());
        assert!(to.is_empty() || payload.len() == message_len(&header.sig));
        let sig = pack(&header.sig).expect("fast-path calls pack");
        if link.is_aborted() {
            return Err(Error::Aborted);
        }
        if link.is_broken() || self.notices_changed() {
            self.checkup(link, header, from, false)?;
        }
        let mut wait = Wait::new(link, timeout);
        let result = self.run_passes(link, header, sig, payload, (to, from, got), &mut wait);
        if wait.registered {
            self.books().ledger.bypass_done(header.key());
        }
        result
    }

    /// The passes of [`FastPath::exchange`] until the call is done or fails.
    fn run_passes(
        &self,
        link: &Link<'_>,
        header: &Header,
        sig: u64,
        payload: &[u8],
        (to, from, got): (&[usize], &[usize], &mut [Payload]),
        wait: &mut Wait,
    ) -> Result<()> {
        let mut to_send = all_bits(to.len());
        let mut to_recv = all_bits(from.len());
        let mut first = true;
        loop {
            let (pass, gen) = {
                let mut books = self.books();
                let pass = self.pass(
                    &mut books,
                    header,
                    sig,
                    payload,
                    (to, &mut to_send),
                    (from, &mut to_recv, got),
                    first,
                );
                (pass, self.stash_gen.load(Ordering::Relaxed))
            };
            first = false;
            match pass {
                Pass::Done => break,
                Pass::Failed(problem) => return Err(link.fail(header, problem.fault())),
                Pass::Waiting => {}
            }
            wait.until_ready(self, link, header, (to, to_send), (from, to_recv), gen)?;
        }
        // A notice that crossed this call (the peer found a mismatch).
        if self.notices_changed() {
            self.checkup(link, header, &[], false)?;
        }
        Ok(())
    }

    /// One pass under the ledger: write what can be written, read what has
    /// arrived, and finish the call if nothing is left.
    #[allow(clippy::too_many_arguments)]
    fn pass(
        &self,
        ledger: &mut Books,
        header: &Header,
        sig: u64,
        payload: &[u8],
        (to, to_send): (&[usize], &mut u32),
        (from, to_recv, got): (&[usize], &mut u32, &mut [Payload]),
        first: bool,
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
            match self.take_arrived(ledger, key, sig, (from, to_recv, got)) {
                Ok(s) => stashed = s,
                Err(problem) => return Pass::Failed(problem),
            }
        }
        if *to_send != 0 {
            let mut wrote = 0u32;
            for i in bits(*to_send) {
                let lp = self.local(to[i]);
                let stamp = ledger.sent[lp] + 1;
                if stamp > ledger.acked[lp] + SLOTS as u64 {
                    ledger.acked[lp] = self.boxes.acked_by(lp);
                    if stamp > ledger.acked[lp] + SLOTS as u64 {
                        continue; // full: the receiver is SLOTS messages behind
                    }
                }
                self.boxes
                    .put(lp, stamp, header.comm, header.seq, sig, payload);
                ledger.sent[lp] = stamp;
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
        match self.take_arrived(ledger, key, sig, (from, to_recv, got)) {
            Ok(s) => stashed |= s,
            Err(problem) => return Pass::Failed(problem),
        }
        if stashed {
            self.stash_gen.fetch_add(1, Ordering::Relaxed);
            // Another thread of this rank may sleep waiting for it.
            fence(Ordering::SeqCst);
            self.boxes.wake_self();
        }
        if *to_send != 0 || *to_recv != 0 {
            return Pass::Waiting;
        }
        // Done. A message for this call from a rank it expects nothing from
        // means that rank called something else here.
        if let Some(s) = ledger.take_stashed(None, key) {
            return Pass::Failed(Problem::Mismatch {
                peer: s.peer,
                theirs: s.msg.sig,
            });
        }
        if let Some(verdict) = ledger.ledger.take_verdict(key) {
            return Pass::Failed(Problem::Reported(verdict));
        }
        ledger.ledger.finish_on_bypass(header);
        Pass::Done
    }

    /// Takes what arrived for the receives still in `to_recv`: the
    /// messages of this call (into `got`), stashing those of other calls.
    /// Returns whether it stashed any, or the problem that fails the call (a
    /// message of this call with another signature, or one of a call this
    /// rank finished).
    fn take_arrived(
        &self,
        ledger: &mut Books,
        key: (u64, u64),
        sig: u64,
        (from, to_recv, got): (&[usize], &mut u32, &mut [Payload]),
    ) -> std::result::Result<bool, Problem> {
        let mut stashed = false;
        for i in bits(*to_recv) {
            let peer = from[i];
            let lp = self.local(peer);
            if let Some(s) = ledger.take_stashed(Some(peer), key) {
                if s.msg.sig != sig {
                    return Err(Problem::Mismatch {
                        peer,
                        theirs: s.msg.sig,
                    });
                }
                got[i] = s.msg.data;
                *to_recv &= !(1 << i);
                continue;
            }
            while let Some(msg) = self.take_next(lp) {
                let theirs = (msg.comm, msg.seq);
                if theirs == key {
                    if msg.sig != sig {
                        return Err(Problem::Mismatch {
                            peer,
                            theirs: msg.sig,
                        });
                    }
                    got[i] = msg.data;
                    *to_recv &= !(1 << i);
                    break;
                }
                if ledger.ledger.finished_with(theirs).is_some() {
                    return Err(Problem::Late {
                        peer,
                        key: theirs,
                        theirs: msg.sig,
                    });
                }
                // For another call (another communicator, a non-blocking
                // call, the next call of a peer that is ahead).
                ledger.stash.push(Stashed { peer, msg });
                stashed = true;
            }
        }
        Ok(stashed)
    }

    /// Lock-free: whether another pass may get further (a message arrived
    /// from a rank in `from`, a message was stashed, or a full mailbox to a
    /// rank in `to` has room).
    fn ready(
        &self,
        (to, to_send): (&[usize], u32),
        (from, to_recv): (&[usize], u32),
        gen: u64,
    ) -> bool {
        if self.stash_gen.load(Ordering::Relaxed) != gen {
            return true;
        }
        let arrived = bits(to_recv).any(|i| {
            let lp = self.local(from[i]);
            let n = self.next_in[lp].load(Ordering::Relaxed);
            self.boxes.inbound_stamp(lp, n).load(Ordering::Acquire) == n
        });
        arrived
            || bits(to_send).any(|i| {
                let lp = self.local(to[i]);
                self.boxes.acked_by(lp) + SLOTS as u64 > self.sent_out[lp].load(Ordering::Relaxed)
            })
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
        }
    }

    /// Returns when another pass may get further, or fails (abort,
    /// deadline, a dead peer, a mismatch found by the engine).
    fn until_ready(
        &mut self,
        fast: &FastPath,
        link: &Link<'_>,
        header: &Header,
        sends: (&[usize], u32),
        recvs: (&[usize], u32),
        gen: u64,
    ) -> Result<()> {
        let awaited = || {
            bits(recvs.1)
                .map(|i| recvs.0[i])
                .chain(bits(sends.1).map(|i| sends.0[i]))
        };
        loop {
            if fast.ready(sends, recvs, gen) {
                return Ok(());
            }
            if link.is_aborted() {
                return Err(Error::Aborted);
            }
            if fast.notices_changed() {
                let waiting: Vec<usize> = awaited().collect();
                fast.checkup(link, header, &waiting, false)?;
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
                let peer = awaited().next().unwrap_or(link.rank);
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
            let waiting: Vec<usize> = awaited().collect();
            if let Err(e) = fast.checkup(link, header, &waiting, true) {
                // A peer may have written what this call waits for and
                // exited since the poll above (its last call done, its
                // process gone): its slot is still in our segment, and the
                // call it completes must not fail with that peer.
                if matches!(e, Error::PeerLost { .. }) && fast.ready(sends, recvs, gen) {
                    return Ok(());
                }
                return Err(e);
            }
            let left = (start + self.timeout).saturating_duration_since(Instant::now());
            let mut slice = left.min(super::engine::SLEEP_SLICE);
            if sends.1 != 0 {
                slice = slice.min(SPACE_SLICE);
            }
            fast.boxes.sleep(slice, || {
                fast.ready(sends, recvs, gen) || fast.notices_changed() || link.is_aborted()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bit_iteration() {
        assert_eq!(bits(0b1011).collect::<Vec<_>>(), vec![0, 1, 3]);
        assert_eq!(all_bits(3), 0b111);
        assert_eq!(bits(all_bits(0)).count(), 0);
    }
}
