//! The sans-IO core of the engine: matching, receiving and the books of
//! every call, with no channel, socket, clock or thread inside.
//!
//! Bytes come in with [`Core::handle_bytes`] (from whatever stream a peer's
//! channel delivered) and go out through [`Core::poll_transmit`] /
//! [`Core::handle_written`]; a call is registered with [`Core::add_call`],
//! asked for its outcome with [`Core::poll_call`] (which takes `now`, so a
//! deadline passes when the caller's clock says so), and removed with
//! [`Core::retire`]. Matched remote-data messages wait in
//! [`Core::poll_remote_read`] for the driver, which alone can read another
//! process's memory. Faults (lost peers, mismatches, aborts) are in
//! `faults.rs`. Arriving payload is handed straight to the sink of the call
//! that posted the receive: that is a call into the caller's code, not
//! I/O, and it keeps the common path free of copies.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use super::frames::{
    Outbound, RemoteRead, Rx, SinkPtr, Target, Unexpected, CRC_PRESENT, INLINE_BYTES,
};
use super::ledger::{self, LedgerLock};
use super::verdict::Verdict;
use crate::error::{Error, Result};
use crate::transport::wire::{padded, Frame, FrameKind, HEADER_BYTES};
use crate::transport::{Header, Incoming, Outgoing, Sink};

/// The engine's view of one peer.
pub(super) struct Peer {
    /// A channel to the peer exists (notices can be queued for it).
    pub(super) connected: bool,
    pub(super) sendq: VecDeque<Outbound>,
    pub(super) rx: Rx,
    pub(super) unexpected: Backlog,
    /// Remote-data messages of ours the peer has not acknowledged yet:
    /// (call, key, address).
    pub(super) unacked: Vec<(usize, (u64, u64), u64)>,
    /// Remote-data messages from the peer to read.
    pub(super) to_read: VecDeque<RemoteRead>,
    /// Why the peer is gone, once it is.
    pub(super) lost: Option<String>,
    /// The peer said goodbye (its transport was dropped): its channel
    /// closing next is a clean exit, not a crash.
    pub(super) said_bye: bool,
    /// The last large payload from the peer was read straight into place
    /// ([`Core::receive_direct`]): its padding and the next header are
    /// read so too, so that a staging read does not take the start of the
    /// next (likely large) payload along.
    pub(super) direct: bool,
    /// Eager collective data messages sent to the peer since the last one
    /// that waited for its match ([`EAGER_RUN`]).
    pub(super) eager_run: u32,
}

/// Longest run of eager collective messages to one peer: every
/// `EAGER_RUN`-th further one waits for the peer to match it, as a message
/// past the eager limit does. A rank that runs ahead (a broadcast root's
/// loop of small calls) so stays at most this many calls ahead of a peer
/// that buffers what it has not asked for yet, instead of any number: 20,000
/// broadcasts of 4 KiB ahead had the receiver keep 80 MB and run its calls at
/// a quarter of its speed (bench/RESULTS.md, "The engine's unexpected
/// messages"). Collectives only, as every rendezvous (see
/// `driver::route`); one acknowledgement per run.
pub(super) const EAGER_RUN: u32 = 64;

/// A peer's messages that arrived before a call received them, oldest
/// first, with a count per call key. Whether one of a key waits is what
/// every arriving message (FIFO per key) and every finished call (a late
/// mismatch) asks, and a rank that runs ahead, a broadcast root's loop of
/// eager messages, can leave thousands here: scanning them for it made
/// each call cost time in proportion to the backlog (an 8-byte broadcast
/// through the rings took 46 us a call after 20,000 calls).
#[derive(Default)]
pub(super) struct Backlog {
    queue: VecDeque<Unexpected>,
    per_key: HashMap<(u64, u64), usize>,
}

impl Backlog {
    /// Appends a message that arrived unexpected.
    pub(super) fn push_back(&mut self, message: Unexpected) {
        *self.per_key.entry(message.header.key()).or_default() += 1;
        self.queue.push_back(message);
    }

    /// Whether a message of call `key` waits.
    pub(super) fn has(&self, key: (u64, u64)) -> bool {
        self.per_key.contains_key(&key)
    }

    /// Where the oldest message of call `key` lies, if one waits.
    pub(super) fn position(&self, key: (u64, u64)) -> Option<usize> {
        if !self.has(key) {
            return None;
        }
        self.queue.iter().position(|u| u.header.key() == key)
    }

    /// Removes and returns the message at `at` (from [`Backlog::position`]).
    pub(super) fn remove(&mut self, at: usize) -> Option<Unexpected> {
        let message = self.queue.remove(at)?;
        let key = message.header.key();
        match self.per_key.get_mut(&key) {
            Some(n) if *n > 1 => *n -= 1,
            _ => {
                self.per_key.remove(&key);
            }
        }
        Some(message)
    }

    /// Removes and returns the oldest message of call `key`.
    pub(super) fn take_first(&mut self, key: (u64, u64)) -> Option<Unexpected> {
        let at = self.position(key)?;
        self.remove(at)
    }
}

pub(super) struct PostedRecv {
    pub(super) peer: usize,
    pub(super) len: usize,
    pub(super) matched: bool,
    pub(super) done: bool,
}

pub(super) struct CallState {
    pub(super) header: Header,
    pub(super) recvs: Vec<PostedRecv>,
    pub(super) sink: SinkPtr,
    pub(super) pending_sends: usize,
    pub(super) pending_recvs: usize,
    pub(super) error: Option<Error>,
    /// When the call started, for the time a timeout reports.
    pub(super) start: Instant,
    /// When waiting fails with a timeout.
    pub(super) deadline: Instant,
}

/// How one outgoing message travels (the driver decides: it knows what the
/// channel can do and where the memory lies).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// Through the stream; `flip` corrupts one payload bit after the
    /// checksum (the fault tests' hook); `rendezvous`: the send completes
    /// only once the receiver has matched it (and the frame is written),
    /// see `TransportConfig::eager_bytes`.
    Stream { flip: bool, rendezvous: bool },
    /// Only its address: the receiver reads the sender's memory.
    Remote,
    /// Only where it lies in a shared buffer the receiver maps.
    Shared { offset: u64, region: u64 },
}

/// Matching, receiving and fault books of one rank (see the module
/// documentation).
pub(crate) struct Core {
    pub(super) me: usize,
    /// Data frames carry a CRC32C.
    checksums: bool,
    pub(super) peers: Vec<Peer>,
    pub(super) calls: Vec<Option<CallState>>,
    /// The first rank known to have crashed (here or as a peer reported):
    /// from then on every call fails with `PeerLost` naming it.
    pub(super) culprit: Option<usize>,
    /// Ranks a peer reported gone, not yet acted on: the driver first reads
    /// once more from every channel (what such a rank sent before leaving
    /// may still complete calls here), then applies them
    /// ([`Core::apply_reported_losses`]).
    pub(super) reported_lost: Vec<usize>,
    /// The first rank reported gone: the origin that errors name when a
    /// peer leaves because of it, before the report is applied.
    pub(super) origin: Option<usize>,
    /// Set by a late mismatch (a message for a call this rank finished):
    /// every later call fails with it.
    pub(super) sticky: Option<Error>,
    /// Finished calls and reported mismatches, shared with a bypass
    /// (locked after this core, never before).
    pub(super) ledger: Arc<dyn LedgerLock>,
    /// How many verdicts the ledger keeps ([`super::Ledger::verdicts_hint`]).
    verdicts: Arc<AtomicUsize>,
    /// Set with `culprit` or `sticky`, for a bypass to see without the
    /// engine's lock.
    pub(super) broken: Arc<AtomicBool>,
    /// Set by an abort, here or by a peer's notice.
    pub(super) aborted: Arc<AtomicBool>,
    /// The calls whose mismatch verdict this rank has passed on (each
    /// verdict goes out once, see `faults.rs`).
    pub(super) spread: HashSet<(u64, u64)>,
    /// What each peer last said of where it is: (communicator, text).
    pub(super) positions: Vec<Option<(u64, String)>>,
    /// Buffers of delivered unexpected messages, kept for the next ones
    /// ([`Core::unexpected_buffer`]).
    spare: Vec<Vec<u64>>,
    /// Tokens of our rendezvous sends handed out so far.
    tokens: u64,
    /// Whether runs of eager messages end in one that waits ([`EAGER_RUN`]);
    /// off where waiting is (`FERROCOLL_EAGER_BYTES=0`).
    eager_runs: bool,
}

/// Set in every rendezvous token, so that a token never equals the
/// address of a remote-data message (user-space addresses have bit 63
/// clear), with which it shares the peer's list of unacknowledged sends.
const TOKEN_BIT: u64 = 1 << 63;

/// How many emptied unexpected-message buffers the engine keeps.
const SPARE_BUFFERS: usize = 8;
/// Largest buffer kept for reuse (bytes); larger ones are freed.
const SPARE_MAX_BYTES: usize = 16 << 20;

impl Core {
    /// The core of rank `me` of `size`, whose peers in `connected` have a
    /// channel already, keeping its finished calls in `ledger`.
    pub(super) fn new(
        me: usize,
        connected: &[bool],
        checksums: bool,
        ledger: Arc<dyn LedgerLock>,
    ) -> Core {
        let verdicts = ledger::with(&*ledger, |l| l.verdicts_hint());
        Core {
            me,
            checksums,
            peers: connected
                .iter()
                .map(|&connected| Peer {
                    connected,
                    sendq: VecDeque::new(),
                    rx: Rx::next_header(),
                    unexpected: Backlog::default(),
                    unacked: Vec::new(),
                    to_read: VecDeque::new(),
                    lost: None,
                    said_bye: false,
                    direct: false,
                    eager_run: 0,
                })
                .collect(),
            eager_runs: true,
            calls: Vec::new(),
            culprit: None,
            reported_lost: Vec::new(),
            origin: None,
            sticky: None,
            ledger,
            verdicts,
            broken: Arc::new(AtomicBool::new(false)),
            aborted: Arc::new(AtomicBool::new(false)),
            spread: HashSet::new(),
            positions: vec![None; connected.len()],
            spare: Vec::new(),
            tokens: 0,
        }
    }

    /// Whether runs of eager collective messages to a peer end in one that
    /// waits for its match ([`EAGER_RUN`]; on by default).
    pub(super) fn limit_eager_runs(&mut self, on: bool) {
        self.eager_runs = on;
    }

    /// A buffer for an unexpected message of `len` bytes, reused from one
    /// delivered earlier when there is one.
    ///
    /// Why: a rank that runs ahead (the non-root of a reduce, the root of a
    /// broadcast, any rank of a loop of rooted calls) makes most of its
    /// peer's messages unexpected. A fresh zeroed buffer per message cost a
    /// page fault and a clear per 4 KiB, and glibc gave the memory back to
    /// the kernel after each free: a 2-rank 128 KiB reduce over shared
    /// memory took 80-160 us, three quarters of it in the fault handler
    /// (perf), against 14 us predicted. The bytes of a reused buffer are
    /// stale, not cleared: the frame's payload overwrites the first `len`
    /// bytes before anyone reads them, and only those are delivered.
    ///
    /// The buffer is for a message of `len` bytes but holds (as initialised
    /// words) only `first` bytes or what a reused buffer held already: the
    /// receive path grows it as the bytes arrive (`receive::grow_for`), so
    /// a message whose receive is posted early never touches the rest. A
    /// reused buffer keeps its length, so that growing it again zeroes
    /// nothing it had zeroed before.
    pub(super) fn unexpected_buffer(&mut self, len: usize, first: usize) -> Vec<u64> {
        let words = len.div_ceil(8);
        // The smallest spare that holds it, else the largest (grown).
        let pick = self
            .spare
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= words)
            .min_by_key(|(_, b)| b.capacity())
            .or_else(|| {
                self.spare
                    .iter()
                    .enumerate()
                    .max_by_key(|(_, b)| b.capacity())
            })
            .map(|(i, _)| i);
        let mut buf = match pick {
            Some(i) => self.spare.swap_remove(i),
            None => Vec::new(),
        };
        // Room for the whole message now, so that growing never moves what
        // arrived (untouched pages of a large allocation cost nothing).
        buf.reserve_exact(words.saturating_sub(buf.len()));
        let first = first.min(len).div_ceil(8);
        if buf.len() < first {
            buf.resize(first, 0);
        }
        buf
    }

    /// Keeps the buffer of a delivered unexpected message for the next one
    /// (at most [`SPARE_BUFFERS`], each at most [`SPARE_MAX_BYTES`]).
    pub(super) fn recycle(&mut self, buf: Vec<u64>) {
        if buf.capacity() == 0 || buf.capacity() * 8 > SPARE_MAX_BYTES {
            return;
        }
        if self.spare.len() < SPARE_BUFFERS {
            self.spare.push(buf);
        } else if let Some(smallest) = self.spare.iter_mut().min_by_key(|b| b.capacity()) {
            if smallest.capacity() < buf.capacity() {
                *smallest = buf;
            }
        }
    }

    /// Number of ranks.
    pub(super) fn size(&self) -> usize {
        self.peers.len()
    }

    /// The flag an abort sets (shared with whoever polls it without a lock).
    pub(super) fn aborted_flag(&self) -> &Arc<AtomicBool> {
        &self.aborted
    }

    /// The flag a crash or late mismatch sets.
    pub(super) fn broken_flag(&self) -> &Arc<AtomicBool> {
        &self.broken
    }

    /// Moves the ledger to `ledger` (a bypass's lock); before any call.
    pub(super) fn set_ledger(&mut self, ledger: Arc<dyn LedgerLock>) {
        self.verdicts = ledger::with(&*ledger, |l| l.verdicts_hint());
        self.ledger = ledger;
    }

    /// A channel to `peer` now exists.
    pub(super) fn connected(&mut self, peer: usize) {
        self.peers[peer].connected = true;
    }

    /// Whether `peer` is gone.
    pub(super) fn is_lost(&self, peer: usize) -> bool {
        self.peers[peer].lost.is_some()
    }

    /// The first crashed rank, once one is known.
    pub(super) fn culprit(&self) -> Option<usize> {
        self.culprit
    }

    /// Whether frames wait to be written to a live, connected peer.
    pub(super) fn has_queued(&self) -> bool {
        self.peers
            .iter()
            .any(|p| p.lost.is_none() && p.connected && !p.sendq.is_empty())
    }

    /// Whether a notice (verdict, lost rank, abort) waits to be written to
    /// a live, connected peer.
    pub(super) fn has_queued_notice(&self) -> bool {
        self.peers
            .iter()
            .any(|p| p.lost.is_none() && p.connected && p.sendq.iter().any(|o| o.alert))
    }

    /// Whether frames wait to be written to `peer`.
    pub(super) fn wants_write(&self, peer: usize) -> bool {
        !self.peers[peer].sendq.is_empty()
    }

    /// What a new call must not start against: an abort, a crash, a late
    /// mismatch, a peer out of range, a send to a gone peer.
    pub(super) fn precheck(&self, sends: &[Outgoing<'_>], recvs: &[Incoming]) -> Result<()> {
        if self.aborted.load(Ordering::SeqCst) {
            return Err(Error::Aborted);
        }
        if let Some(culprit) = self.culprit {
            return Err(Error::PeerLost { rank: culprit });
        }
        if let Some(err) = &self.sticky {
            return Err(err.clone());
        }
        let size = self.size();
        for peer in sends
            .iter()
            .map(|s| s.peer)
            .chain(recvs.iter().map(|r| r.peer))
            .filter(|&p| p != Incoming::ANY_SOURCE)
        {
            if peer >= size || peer == self.me {
                return Err(Error::Internal(format!(
                    "rank {} asked its transport to talk to rank {peer} (of {size})",
                    self.me
                )));
            }
        }
        // Sending to a gone peer fails at once; receiving from one fails only
        // if what it sent before leaving does not hold the message.
        if let Some(s) = sends.iter().find(|s| self.peers[s.peer].lost.is_some()) {
            return Err(Error::PeerLost { rank: s.peer });
        }
        Ok(())
    }

    /// Registers a call: queues its sends (each the way `route` says),
    /// posts its receives and hands them what already arrived. Returns its
    /// id, or the mismatch a peer already reported for it (then it is not
    /// registered).
    ///
    /// # Safety
    ///
    /// `sink` and the memory of every send must stay valid, and not be
    /// used elsewhere while the core may use them, until [`Core::retire`]
    /// removes the call (the core writes into the sink and reads the sends
    /// whenever bytes move).
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn add_call(
        &mut self,
        header: &Header,
        sends: &[Outgoing<'_>],
        recvs: &[Incoming],
        sink: &mut dyn Sink,
        start: Instant,
        deadline: Instant,
        mut route: impl FnMut(&Outgoing<'_>) -> Route,
    ) -> Result<usize> {
        // SAFETY: only the lifetime is erased; the caller keeps the sink
        // alive until the call is retired, which removes the pointer.
        let sink_ptr = SinkPtr(unsafe {
            std::mem::transmute::<*mut (dyn Sink + '_), *mut (dyn Sink + 'static)>(
                sink as *mut dyn Sink,
            )
        });
        let call = CallState {
            header: *header,
            recvs: recvs
                .iter()
                .map(|r| PostedRecv {
                    peer: r.peer,
                    len: r.len,
                    matched: false,
                    done: false,
                })
                .collect(),
            sink: sink_ptr,
            pending_sends: sends.len(),
            pending_recvs: recvs.len(),
            error: None,
            start,
            deadline,
        };
        let id = match self.calls.iter().position(Option::is_none) {
            Some(free) => {
                self.calls[free] = Some(call);
                free
            }
            None => {
                self.calls.push(Some(call));
                self.calls.len() - 1
            }
        };
        for s in sends {
            let route = route(s);
            self.queue_send(id, header, s, route);
        }
        // Verdicts are added under the engine's lock, which the caller
        // holds: a zero count is exact.
        let verdict = if self.verdicts.load(Ordering::Relaxed) > 0 {
            ledger::with(&*self.ledger, |l| l.take_verdict(header.key()))
        } else {
            None
        };
        if let Some(v) = verdict {
            self.retire(id);
            return Err(v.error_for(self.me));
        }
        self.match_unexpected(id);
        Ok(id)
    }

    /// Queues send `s` of call `id`.
    fn queue_send(&mut self, id: usize, header: &Header, s: &Outgoing<'_>, route: Route) {
        let (flip, rendezvous) = match route {
            Route::Stream { flip, rendezvous } => (flip, rendezvous),
            Route::Remote | Route::Shared { .. } => {
                let frame = match route {
                    Route::Shared { offset, region } => Frame {
                        kind: FrameKind::Shared,
                        header: *header,
                        len: s.data.len(),
                        addr: offset,
                        region,
                    },
                    _ => Frame {
                        kind: FrameKind::Remote,
                        header: *header,
                        len: s.data.len(),
                        addr: s.data.as_ptr() as u64,
                        region: 0,
                    },
                };
                let addr = frame.addr;
                self.peers[s.peer].sendq.push_back(Outbound::header_only(
                    Some(id),
                    frame.encode().to_vec(),
                    Some(addr),
                ));
                return;
            }
        };
        // A run of eager messages to one peer ends in one that waits.
        let collective = header.seq & Header::P2P_BIT == 0;
        let peer = &mut self.peers[s.peer];
        let rendezvous = if rendezvous || !collective || !self.eager_runs {
            rendezvous
        } else {
            peer.eager_run += 1;
            peer.eager_run >= EAGER_RUN
        };
        if rendezvous {
            peer.eager_run = 0;
        }
        let mut frame = Frame::data(*header, s.data.len());
        if self.checksums {
            frame.addr = CRC_PRESENT | u64::from(crc32c::crc32c(s.data));
        }
        if rendezvous {
            // Done when written and when the peer has matched it, in
            // either order: the peer answers as soon as it has read the
            // header and found the receive, often before the last byte is
            // written. So the wait is booked now, as one more pending send.
            self.tokens += 1;
            let token = TOKEN_BIT | self.tokens;
            frame.region = token;
            self.peers[s.peer].unacked.push((id, header.key(), token));
            if let Some(c) = self.calls[id].as_mut() {
                c.pending_sends += 1;
            }
        }
        let flip = flip && !s.data.is_empty();
        // A frame to corrupt (test hook) is copied so the caller's buffer
        // stays intact.
        let inline = s.data.len() <= INLINE_BYTES || flip;
        let mut prefix =
            Vec::with_capacity(HEADER_BYTES + if inline { padded(s.data.len()) } else { 0 });
        prefix.extend_from_slice(&frame.encode());
        if inline {
            prefix.extend_from_slice(s.data);
            prefix.resize(HEADER_BYTES + padded(s.data.len()), 0);
            if flip {
                prefix[HEADER_BYTES] ^= 0x10;
            }
        }
        self.peers[s.peer].sendq.push_back(Outbound {
            call: Some(id),
            prefix,
            data: if inline {
                std::ptr::null()
            } else {
                s.data.as_ptr()
            },
            len: if inline { 0 } else { s.data.len() },
            owned: Vec::new(),
            done: 0,
            pad: if inline {
                0
            } else {
                padded(s.data.len()) - s.data.len()
            },
            remote_addr: None,
            alert: false,
        });
    }

    /// Fails a just-registered call `id` that waits on a gone peer (what
    /// that peer sent before leaving did not hold the message).
    pub(super) fn check_gone(&self, id: usize) -> Result<()> {
        let c = self.calls[id].as_ref().expect("live call");
        match c.recvs.iter().find(|r| {
            !r.done && r.peer != Incoming::ANY_SOURCE && self.peers[r.peer].lost.is_some()
        }) {
            Some(r) => Err(Error::PeerLost { rank: r.peer }),
            None => Ok(()),
        }
    }

    /// Runs call `id`'s overlapped local work ([`Sink::overlap`]), once its
    /// first messages are out: all of it, or with `piece` about that many
    /// bytes of it ([`Sink::overlap_some`]). Returns whether any is left.
    pub(super) fn overlap(&mut self, id: usize, piece: Option<usize>) -> bool {
        let Some(c) = self.calls.get_mut(id).and_then(Option::as_mut) else {
            return false;
        };
        // SAFETY: `id` is the calling thread's own registered call (its
        // sink lives until the call is retired), and the engine's mutex,
        // held through `&mut self`, makes this thread its only user.
        unsafe {
            match piece {
                Some(bytes) => (*c.sink.0).overlap_some(bytes),
                None => {
                    (*c.sink.0).overlap();
                    false
                }
            }
        }
    }

    /// The outcome of call `id`: `None` while it waits.
    pub(super) fn poll_call(&mut self, id: usize) -> Option<Result<()>> {
        let c = self.calls[id].as_mut().expect("live call");
        if let Some(err) = c.error.take() {
            return Some(Err(err));
        }
        if c.pending_sends == 0 && c.pending_recvs == 0 {
            return Some(Ok(()));
        }
        if self.aborted.load(Ordering::SeqCst) {
            return Some(Err(Error::Aborted));
        }
        None
    }

    /// The time is `now`: the timeout of call `id` if its deadline has
    /// passed, naming the peer it still waits for (a receive, else a send).
    pub(super) fn handle_timeout(&self, id: usize, now: Instant) -> Option<Error> {
        let c = self.calls[id].as_ref().expect("live call");
        if now < c.deadline {
            return None;
        }
        // A receive first, else a send not yet written or not yet read by
        // the peer (a remote-data message waits for its acknowledgement).
        let peer = self
            .awaited_by(id)
            .into_iter()
            .find(|&p| p != Incoming::ANY_SOURCE)
            .unwrap_or(self.me);
        Some(Error::Timeout {
            collective: c.header.sig.to_string(),
            seq: c.header.seq & !Header::P2P_BIT,
            rank: self.me,
            peer,
            waited: now.saturating_duration_since(c.start),
            report: String::new(),
        })
    }

    /// The peer receive `idx` of call `id` came from (an any-source
    /// receive learns it when it matches).
    pub(super) fn source_of(&self, id: usize, idx: usize) -> usize {
        self.calls[id].as_ref().expect("live call").recvs[idx].peer
    }

    /// When call `id`'s waiting fails.
    pub(super) fn deadline(&self, id: usize) -> Instant {
        self.calls[id].as_ref().expect("live call").deadline
    }

    /// The keys of every call registered now.
    pub(super) fn live_keys(&self) -> Vec<(u64, u64)> {
        self.calls
            .iter()
            .flatten()
            .map(|c| c.header.key())
            .collect()
    }

    /// The next bytes to write to `peer`, if any.
    pub(super) fn poll_transmit(&self, peer: usize) -> Option<&[u8]> {
        self.peers[peer].sendq.front().map(Outbound::remaining)
    }

    /// `n` bytes of [`Core::poll_transmit`]'s were written to `peer`.
    /// Returns true when they ended a notice, after which the driver alerts
    /// the peer (`Channel::alert`: it may be busy on a bypass).
    pub(super) fn handle_written(&mut self, peer: usize, n: usize) -> bool {
        let out = self.peers[peer]
            .sendq
            .front_mut()
            .expect("a frame was offered");
        out.done += n;
        if out.done < out.total() {
            return false;
        }
        let out = self.peers[peer].sendq.pop_front().expect("front exists");
        let alert = out.alert;
        self.sent(peer, out);
        alert
    }

    /// Bookkeeping for a frame written whole to `peer`.
    fn sent(&mut self, peer: usize, out: Outbound) {
        let Some(call) = out.call else { return };
        match out.remote_addr {
            // Done when the peer says it has read it.
            Some(addr) => {
                if let Some(key) = self.calls[call].as_ref().map(|c| c.header.key()) {
                    self.peers[peer].unacked.push((call, key, addr));
                }
            }
            None => {
                if let Some(c) = self.calls[call].as_mut() {
                    c.pending_sends -= 1;
                }
            }
        }
    }

    /// The first unmatched receive from `peer` of the call with `header`'s key.
    pub(super) fn find_posted(&self, peer: usize, header: &Header) -> Option<(usize, usize)> {
        self.calls.iter().enumerate().find_map(|(id, c)| {
            let c = c.as_ref()?;
            if c.header.key() != header.key() {
                return None;
            }
            let idx = c
                .recvs
                .iter()
                .position(|r| (r.peer == peer || r.peer == Incoming::ANY_SOURCE) && !r.matched)?;
            Some((id, idx))
        })
    }

    /// [`Core::find_posted`] for a message that just arrived whole: none if
    /// an older message of the same key from `peer` still waits (FIFO).
    pub(super) fn find_posted_in_order(
        &self,
        peer: usize,
        header: &Header,
    ) -> Option<(usize, usize)> {
        if self.peers[peer].unexpected.has(header.key()) {
            None
        } else {
            self.find_posted(peer, header)
        }
    }

    /// Checks a message against the receive it matched; on a mismatch the
    /// call fails and the message is dropped.
    pub(super) fn accept(
        &mut self,
        peer: usize,
        call: usize,
        idx: usize,
        header: &Header,
        len: usize,
    ) -> bool {
        let c = self.calls[call].as_mut().expect("live call");
        c.recvs[idx].matched = true;
        // An any-source receive is from this peer from now on.
        c.recvs[idx].peer = peer;
        let want = c.recvs[idx].len;
        if header.sig == c.header.sig && len == want {
            return true;
        }
        let remote = if header.sig != c.header.sig {
            header.sig.to_string()
        } else {
            format!(
                "{} with a message of {len} bytes where {want} were expected",
                header.sig
            )
        };
        let ours = c.header;
        // Tell the peer, so that it fails with the same verdict instead of
        // waiting for a message this rank will never send, and for a
        // collective every other rank too.
        let err = self.declare(Verdict {
            header: ours,
            a: self.me,
            a_call: ours.sig.to_string(),
            b: peer,
            b_call: remote,
        });
        let c = self.calls[call].as_mut().expect("live call");
        c.error.get_or_insert(err);
        false
    }

    pub(super) fn finish_recv(&mut self, call: usize, idx: usize) {
        let c = self.calls[call].as_mut().expect("live call");
        c.recvs[idx].done = true;
        c.pending_recvs -= 1;
    }

    /// Delivers already-arrived messages to the new call `id`'s receives.
    pub(super) fn match_unexpected(&mut self, id: usize) {
        let c = self.calls[id].as_ref().expect("live call");
        let key = c.header.key();
        let wanted: Vec<(usize, usize)> = c
            .recvs
            .iter()
            .enumerate()
            .map(|(i, r)| (i, r.peer))
            .collect();
        for (idx, wanted_peer) in wanted {
            // An any-source receive takes the first peer with a message.
            let peer = if wanted_peer == Incoming::ANY_SOURCE {
                match (0..self.peers.len()).find(|&p| self.peers[p].unexpected.has(key)) {
                    Some(p) => p,
                    None => continue,
                }
            } else {
                wanted_peer
            };
            // FIFO per peer and key: only the first receive from this peer
            // that is still unmatched may take the oldest message.
            let c = self.calls[id].as_ref().expect("live call");
            if c.recvs
                .iter()
                .take(idx)
                .any(|r| r.peer == peer && !r.matched)
            {
                continue;
            }
            let q = &mut self.peers[peer].unexpected;
            let Some(pos) = q.position(key) else {
                if wanted_peer != Incoming::ANY_SOURCE {
                    self.take_arriving(peer, id, idx, key);
                }
                continue;
            };
            let msg = q.remove(pos).expect("position is valid");
            if let Some(token) = msg.ack {
                self.queue_ack(peer, &msg.header, token);
            }
            if let Some((addr, region)) = msg.remote {
                if self.accept(peer, id, idx, &msg.header, msg.len) {
                    // Read at the next turn of progress.
                    self.peers[peer].to_read.push_back(RemoteRead {
                        header: msg.header,
                        call: id,
                        idx,
                        addr,
                        len: msg.len,
                        region,
                    });
                } else {
                    self.queue_ack(peer, &msg.header, addr);
                }
                continue;
            }
            if self.accept(peer, id, idx, &msg.header, msg.len) {
                let c = self.calls[id].as_mut().expect("live call");
                if msg.corrupt {
                    c.error.get_or_insert(Error::Corrupted {
                        rank: self.me,
                        peer,
                        collective: c.header.sig.to_string(),
                    });
                }
                let bytes: &[u8] = bytemuck::cast_slice(&msg.data);
                // SAFETY: `id` is the calling thread's own registered call.
                unsafe { (*c.sink.0).deliver(idx, 0, &bytes[..msg.len]) };
                self.finish_recv(id, idx);
            }
            self.recycle(msg.data);
        }
    }

    /// Receive `idx` of the just-posted call `id` takes the message of its
    /// key (`key`) that is arriving from `peer` while nobody had asked for it:
    /// what came so far is delivered from its unexpected buffer, and the
    /// rest goes straight to the receive as it arrives.
    ///
    /// Without this the whole message went through the buffer and was
    /// copied once complete. A peer that runs a call ahead (a loop of large
    /// allgathers over TCP: the next call's message starts arriving as the
    /// previous call completes) made that the common case: a 2-rank 64 MiB
    /// allgather copied 38 % of what it received twice (bench/RESULTS.md,
    /// issue 20).
    fn take_arriving(&mut self, peer: usize, id: usize, idx: usize, key: (u64, u64)) {
        let p = &mut self.peers[peer];
        let Rx::Body {
            frame,
            target: target @ Target::Unexpected(_),
            got,
            ..
        } = &mut p.rx
        else {
            return;
        };
        if frame.kind != FrameKind::Data || frame.header.key() != key {
            return;
        }
        let (frame, got) = (*frame, *got);
        let prefix = got.min(frame.len);
        // A read straight into the buffer may have stopped inside a word. A
        // sink that stores takes any bytes; one that reduces takes whole
        // elements only (whole words, as `handle_bytes` offers them): the
        // word's first bytes wait for the rest (`Rx::Body::carry`).
        let mut whole = prefix;
        if prefix % 8 != 0 && prefix < frame.len {
            let c = self.calls[id].as_mut().expect("live call");
            // SAFETY: `id` is the calling thread's own registered call.
            if unsafe { (*c.sink.0).destination(idx, 0, 0) }.is_none() {
                whole = prefix & !7;
            }
        }
        let Target::Unexpected(data) = std::mem::replace(target, Target::Discard) else {
            unreachable!("matched above")
        };
        // A rendezvous sender waits until its message is matched.
        if let Some(token) = super::receive::rendezvous_token(&frame) {
            self.queue_ack(peer, &frame.header, token);
        }
        if self.accept(peer, id, idx, &frame.header, frame.len) {
            let bytes: &[u8] = bytemuck::cast_slice(&data);
            let c = self.calls[id].as_mut().expect("live call");
            // SAFETY: `id` is the calling thread's own registered call.
            unsafe { (*c.sink.0).deliver(idx, 0, &bytes[..whole]) };
            if let Rx::Body { target, carry, .. } = &mut self.peers[peer].rx {
                *target = Target::Posted { call: id, idx };
                carry.len = prefix - whole;
                carry.bytes[..carry.len].copy_from_slice(&bytes[whole..prefix]);
            }
        }
        self.recycle(data);
    }

    /// Removes call `id`: its unsent frames go, a half-sent one is finished
    /// from a copy, and bytes still arriving for it are dropped.
    pub(super) fn retire(&mut self, id: usize) {
        for p in 0..self.peers.len() {
            // Remote messages this call will not read: release their
            // senders. Its own unacknowledged ones are forgotten.
            if self.peers[p].to_read.is_empty() && self.peers[p].unacked.is_empty() {
                continue;
            }
            let dropped: Vec<RemoteRead> = {
                let q = &mut self.peers[p].to_read;
                let (mine, rest): (VecDeque<_>, VecDeque<_>) =
                    q.drain(..).partition(|r| r.call == id);
                *q = rest;
                mine.into()
            };
            for r in dropped {
                self.queue_ack(p, &r.header, r.addr);
            }
            self.peers[p].unacked.retain(|u| u.0 != id);
        }
        for peer in &mut self.peers {
            peer.sendq.retain_mut(|out| {
                if out.call != Some(id) {
                    return true;
                }
                if out.done == 0 {
                    return false;
                }
                out.detach();
                true
            });
            if let Rx::Body { target, .. } = &mut peer.rx {
                if matches!(target, Target::Posted { call, .. } if *call == id) {
                    *target = Target::Discard;
                }
            }
        }
        self.calls[id] = None;
    }
}
