//! The progress engine shared by the shared-memory and TCP transports.
//!
//! It turns [`Transport::exchange`] calls into frames ([`super::wire`]) on one
//! [`Channel`] per peer and back. All state sits behind one mutex; whichever
//! thread of the rank holds it moves every channel forward: it writes queued
//! frames of any call, and hands arriving payload straight to the [`Sink`] of
//! the call that posted the matching receive, or keeps it as an *unexpected*
//! message when no call has posted one yet (a peer that is a round ahead, a
//! `send` before its `recv`). So calls running on several threads at once
//! (non-blocking collectives, point-to-point) progress each other, as in an
//! MPI progress engine, and nothing is copied twice on the common path.
//!
//! Waiting: a rank that cannot move first polls (spinning up to 200 us when
//! it has a core to itself, yielding between polls for 30 us when it shares
//! one), then sleeps on its [`Doorbell`] (shared memory) or in `poll(2)` on
//! its sockets, waking at least every 50 ms to notice aborts, deadlines and
//! dead peers. Never an endless spin.
//!
//! Besides data, the engine speaks a few control frames (see
//! [`super::wire`]): remote and shared data with their acknowledgements (the
//! receiver reads the sender's memory in place), abort, a goodbye when the
//! transport is dropped (so the channel closing next is a clean exit), a
//! lost-rank notice (a peer vanished without a goodbye: every call fails
//! naming it) and a mismatch notice (both sides of a mismatch fail alike).
//!
//! Small collectives among the ranks of one host bypass all of this through
//! the engine's mailboxes ([`FastPath`]). The engine keeps what both paths
//! share (finished calls, reported mismatches: [`Ledger`]), alerts a peer
//! after writing it a notice (`Channel::alert`), and looks into the
//! mailboxes when a call starts, waits or ends, so that a peer that took
//! the fast path where this rank took the rings is a mismatch, not a hang.

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::channel::{Channel, Doorbell};
use super::fastpath::{self, FastPath, Foreign, Ledger, Problem};
use super::tcp::TcpConnector;
use super::wire::{padded, Frame, FrameKind, HEADER_BYTES};
use super::{Header, Incoming, Outgoing, Sink, Transport};
use crate::error::{Error, Result};

/// Payloads up to this size are copied next to their header so a small
/// message leaves in one write (one system call on TCP).
const INLINE_BYTES: usize = 16 * 1024;

/// How long a waiting call polls before it sleeps, by default: on a core of
/// its own it spins (a peer on another core answers within microseconds and
/// a futex wake-up costs more than that); sharing cores with other ranks it
/// yields between polls, so the peer it waits for can run.
const SPIN_DEDICATED: Duration = Duration::from_micros(200);
const SPIN_SHARED: Duration = Duration::from_micros(30);

/// `FERROCOLL_SPIN_US`, read once: overrides the polling time.
fn spin_override() -> Option<Duration> {
    static SPIN: std::sync::OnceLock<Option<Duration>> = std::sync::OnceLock::new();
    *SPIN.get_or_init(|| {
        std::env::var("FERROCOLL_SPIN_US")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_micros)
    })
}

/// Longest sleep between checks for abort, deadline and dead peers.
pub(super) const SLEEP_SLICE: Duration = Duration::from_millis(50);

/// How often a sleeping rank asks channels whether their peer still lives.
const LIVENESS_EVERY: Duration = Duration::from_millis(200);

const ZEROS: [u8; 8] = [0; 8];

/// A raw pointer to a caller's sink, valid while its call is registered.
#[derive(Clone, Copy)]
struct SinkPtr(*mut (dyn Sink + 'static));

// SAFETY: the sink belongs to a thread blocked inside `exchange` for as long
// as the pointer is registered (it is removed before `exchange` returns), and
// it is only used while holding the engine's mutex, so exactly one thread uses
// it at a time. The executor's sink holds raw pointers into buffers that the
// blocked caller keeps borrowed for the duration of the call.
unsafe impl Send for SinkPtr {}

/// A frame queued for one peer.
struct Outbound {
    /// The call that sent it (`None` for control frames and for data whose
    /// call has already returned with an error, see `detach`).
    call: Option<usize>,
    /// Header, followed by the whole payload and padding when it is small.
    prefix: Vec<u8>,
    /// Payload not in `prefix`: caller memory, or `owned` after a detach.
    data: *const u8,
    len: usize,
    /// Keeps a detached payload alive.
    owned: Vec<u8>,
    /// Bytes written so far out of `prefix.len() + len + pad`.
    done: usize,
    pad: usize,
    /// A remote-data frame: the send completes when the peer acknowledges
    /// having read `remote_addr`, not when the frame is written.
    remote_addr: Option<u64>,
    /// A control notice (mismatch, lost rank, abort): once written, alert
    /// the peer (`Channel::alert`), which may be busy on the fast path.
    alert: bool,
}

// SAFETY: `data` points into the sending caller's buffer, which that caller
// keeps borrowed while `call` is registered (it is blocked in `exchange`), or
// into `owned`. Only the thread holding the engine mutex reads through it.
unsafe impl Send for Outbound {}

impl Outbound {
    /// A frame that is all header (control frames, remote and shared data):
    /// `remote_addr` set when its send completes on the peer's
    /// acknowledgement.
    fn header_only(call: Option<usize>, prefix: Vec<u8>, remote_addr: Option<u64>) -> Outbound {
        Outbound {
            call,
            prefix,
            data: std::ptr::null(),
            len: 0,
            owned: Vec::new(),
            done: 0,
            pad: 0,
            remote_addr,
            alert: false,
        }
    }

    /// A control notice: a header-only frame of no call, whose peer is
    /// alerted once it is written.
    fn notice(prefix: Vec<u8>) -> Outbound {
        Outbound {
            alert: true,
            ..Outbound::header_only(None, prefix, None)
        }
    }

    fn total(&self) -> usize {
        self.prefix.len() + self.len + self.pad
    }

    /// The next bytes to write (a prefix of what is left).
    fn remaining(&self) -> &[u8] {
        let p = self.prefix.len();
        if self.done < p {
            &self.prefix[self.done..]
        } else if self.done < p + self.len {
            // SAFETY: `data..data+len` is valid for reads (see `unsafe impl
            // Send for Outbound`), and `done - p < len`.
            unsafe {
                std::slice::from_raw_parts(self.data.add(self.done - p), p + self.len - self.done)
            }
        } else {
            &ZEROS[..self.total() - self.done]
        }
    }

    /// Copies the unwritten payload into `owned`, so the frame can finish
    /// after its caller has returned (a half-written frame cannot be taken
    /// back from a stream).
    fn detach(&mut self) {
        let p = self.prefix.len();
        if self.len > 0 {
            let from = self.done.saturating_sub(p).min(self.len);
            // SAFETY: as in `remaining`; the caller is still inside exchange.
            let rest = unsafe { std::slice::from_raw_parts(self.data.add(from), self.len - from) };
            let mut owned = vec![0u8; self.len];
            owned[from..].copy_from_slice(rest);
            self.owned = owned;
            self.data = self.owned.as_ptr();
        }
        self.call = None;
    }
}

/// Where the payload of the frame being received goes.
enum Target {
    /// Receive `idx` of call `call`.
    Posted { call: usize, idx: usize },
    /// Nobody has asked for it yet.
    Unexpected(Vec<u64>),
    /// Its call failed or left: drop the bytes.
    Discard,
}

/// Receive side of one peer's stream.
enum Rx {
    Header {
        buf: [u8; HEADER_BYTES],
        have: usize,
    },
    Body {
        frame: Frame,
        target: Target,
        got: usize,
        /// Running CRC32C of the payload so far (checked at the end when
        /// the frame carries one).
        crc: u32,
    },
}

/// A complete message nobody had asked for when it arrived.
struct Unexpected {
    header: Header,
    len: usize,
    data: Vec<u64>,
    /// A remote or shared-data message: `data` is empty and the bytes are
    /// still in the sender's memory at this address (or offset of this
    /// shared buffer).
    remote: Option<(u64, Option<u64>)>,
    /// Its checksum did not match: the receive that takes it fails.
    corrupt: bool,
}

/// A remote-data message matched to a receive, to be read from the sender.
struct RemoteRead {
    header: Header,
    call: usize,
    idx: usize,
    addr: u64,
    len: usize,
    /// In the sender's shared buffer `region` (at offset `addr`) rather
    /// than at address `addr` of its memory.
    region: Option<u64>,
}

/// Bytes read from a remote sender at a time (the bounce buffer).
const BOUNCE_BYTES: usize = 256 << 10;

/// Whether data frames carry a CRC32C (`FERROCOLL_CHECKSUM=1`), read once.
pub(crate) fn checksums() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        std::env::var("FERROCOLL_CHECKSUM").is_ok_and(|v| matches!(v.trim(), "1" | "on" | "true"))
    })
}

/// Test hook (`FERROCOLL_TEST_FLIP_FRAME=N`): flip one payload bit of the
/// N-th data frame this process sends (counting from 1), after its checksum
/// was computed, to prove corruption is caught.
fn flip_frame() -> Option<u64> {
    static N: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        std::env::var("FERROCOLL_TEST_FLIP_FRAME")
            .ok()?
            .trim()
            .parse()
            .ok()
    })
}

static DATA_FRAMES_SENT: AtomicU64 = AtomicU64::new(0);

/// Flag in a data frame's address field marking a CRC32C in its low bits.
const CRC_PRESENT: u64 = 1 << 32;

/// Messages at least this long that lie in a [`crate::SharedBuffer`] are
/// read in place by a receiver that can map it.
const SHARED_BYTES: usize = 4 << 10;

/// Messages at least this long go by the single-copy path when the channel
/// has one (`FERROCOLL_SINGLE_COPY_BYTES` overrides; 0 turns it off).
const SINGLE_COPY_BYTES: usize = 64 << 10;

fn single_copy_bytes() -> usize {
    static T: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *T.get_or_init(|| {
        std::env::var("FERROCOLL_SINGLE_COPY_BYTES")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .map_or(SINGLE_COPY_BYTES, |b| if b == 0 { usize::MAX } else { b })
    })
}

struct Peer {
    chan: Option<Box<dyn Channel>>,
    sendq: VecDeque<Outbound>,
    rx: Rx,
    unexpected: VecDeque<Unexpected>,
    /// Remote-data messages of ours the peer has not acknowledged yet:
    /// (call, key, address).
    unacked: Vec<(usize, (u64, u64), u64)>,
    /// Remote-data messages from the peer to read.
    to_read: VecDeque<RemoteRead>,
    /// Why the peer is gone, once it is.
    lost: Option<String>,
    /// A TCP peer not connected yet (see [`TcpConnector`]).
    lazy: bool,
    /// The peer said goodbye (its transport was dropped): its channel
    /// closing next is a clean exit, not a crash.
    said_bye: bool,
}

struct PostedRecv {
    peer: usize,
    len: usize,
    matched: bool,
    done: bool,
}

struct CallState {
    header: Header,
    recvs: Vec<PostedRecv>,
    sink: SinkPtr,
    pending_sends: usize,
    pending_recvs: usize,
    error: Option<Error>,
}

struct State {
    peers: Vec<Peer>,
    calls: Vec<Option<CallState>>,
    last_liveness: Instant,
    /// Where remote data lands before it is reduced or copied into place.
    bounce: Vec<u64>,
    /// Opens TCP connections on first use.
    connector: Option<TcpConnector>,
    /// The first rank known to have crashed (here or as a peer reported):
    /// from then on every call fails with `PeerLost` naming it.
    culprit: Option<usize>,
    /// Set by a late mismatch (a message for a call this rank finished):
    /// every later call fails with it.
    sticky: Option<Error>,
    /// Finished calls and reported mismatches, shared with the fast path
    /// (locked after this state, never before).
    ledger: Arc<Mutex<Ledger>>,
    /// Set with `culprit` or `sticky`, for the fast path to see without
    /// this state's lock.
    broken: Arc<AtomicBool>,
}

/// A transport made of one [`Channel`] per peer.
pub(crate) struct Engine {
    rank: usize,
    size: usize,
    name: &'static str,
    state: Mutex<State>,
    bell: Arc<dyn Doorbell>,
    aborted: AtomicBool,
    /// Threads inside `exchange`: with more than one, a sleeper in `poll`
    /// wakes often, since another thread may do its work.
    active: AtomicUsize,
    /// This rank has a core to itself: poll by spinning, not yielding.
    dedicated_core: bool,
    /// Things that must live as long as the transport (the rendezvous store
    /// rank 0 serves).
    kept: Vec<Box<dyn std::any::Any + Send + Sync>>,
    /// Finished calls, reported mismatches and the fast path's books (see
    /// [`Ledger`]): locked after `state` when both are needed.
    ledger: Arc<Mutex<Ledger>>,
    /// `culprit` or `sticky` is set (see [`State`]).
    broken: Arc<AtomicBool>,
    /// How many verdicts the ledger keeps ([`Ledger::verdicts_hint`]).
    verdicts: Arc<AtomicUsize>,
    /// Mailboxes for small collectives among the ranks of this host.
    fast: Option<FastPath>,
}

impl Engine {
    /// An engine for rank `rank` with `channels[p]` leading to peer `p`
    /// (`None` for this rank itself), sleeping on `bell`.
    pub fn new(
        rank: usize,
        channels: Vec<Option<Box<dyn Channel>>>,
        bell: Arc<dyn Doorbell>,
        name: &'static str,
    ) -> Engine {
        let peers: Vec<Peer> = channels
            .into_iter()
            .map(|chan| Peer {
                chan,
                sendq: VecDeque::new(),
                rx: Rx::Header {
                    buf: [0; HEADER_BYTES],
                    have: 0,
                },
                unexpected: VecDeque::new(),
                unacked: Vec::new(),
                to_read: VecDeque::new(),
                lost: None,
                lazy: false,
                said_bye: false,
            })
            .collect();
        let ledger = Ledger::new(0);
        let verdicts = ledger.verdicts_hint();
        let ledger = Arc::new(Mutex::new(ledger));
        let broken = Arc::new(AtomicBool::new(false));
        Engine {
            rank,
            size: peers.len(),
            name,
            state: Mutex::new(State {
                peers,
                calls: Vec::new(),
                last_liveness: Instant::now(),
                bounce: Vec::new(),
                connector: None,
                culprit: None,
                sticky: None,
                ledger: Arc::clone(&ledger),
                broken: Arc::clone(&broken),
            }),
            bell,
            aborted: AtomicBool::new(false),
            active: AtomicUsize::new(0),
            dedicated_core: false,
            kept: Vec::new(),
            ledger,
            broken,
            verdicts,
            fast: None,
        }
    }

    /// Serves small collectives among the ranks `fast` reaches through its
    /// mailboxes ([`FastPath`]).
    pub fn with_fast_path(mut self, fast: FastPath) -> Engine {
        let ledger = Ledger::new(fast.local_size());
        self.verdicts = ledger.verdicts_hint();
        *lock_ledger(&self.ledger) = ledger;
        self.fast = Some(fast);
        self
    }

    /// The fast path, if this engine has one.
    pub fn fast_path(&self) -> Option<&FastPath> {
        self.fast.as_ref()
    }

    /// The ledger (see [`Ledger`] for the lock order).
    pub(super) fn ledger(&self) -> MutexGuard<'_, Ledger> {
        lock_ledger(&self.ledger)
    }

    /// This rank (transport numbering).
    pub(super) fn rank_id(&self) -> usize {
        self.rank
    }

    /// Whether this transport was aborted (here or by a peer's notice).
    pub(super) fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Relaxed)
    }

    /// Whether every call fails from now on (a crashed rank, a late
    /// mismatch).
    pub(super) fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Relaxed)
    }

    /// Whether this rank has a core to itself (it spins while waiting).
    pub(super) fn has_dedicated_core(&self) -> bool {
        self.dedicated_core
    }

    /// How long a waiting call polls before it sleeps.
    pub(super) fn spin_time(&self) -> Duration {
        spin_override().unwrap_or(if self.dedicated_core {
            SPIN_DEDICATED
        } else {
            SPIN_SHARED
        })
    }

    /// Declares whether this rank runs on a core of its own (it spins while
    /// waiting) or shares cores with other ranks (it yields).
    pub fn dedicated_core(mut self, dedicated: bool) -> Engine {
        self.dedicated_core = dedicated;
        self
    }

    /// Connects to the peers in `lazy` over TCP when they are first needed.
    pub fn with_connector(self, connector: TcpConnector, lazy: &[usize]) -> Engine {
        {
            let mut st = self.lock();
            for &p in lazy {
                st.peers[p].lazy = true;
            }
            st.connector = Some(connector);
        }
        self
    }

    /// Keeps `thing` alive as long as the engine.
    pub fn keep_alive(mut self, thing: Box<dyn std::any::Any + Send + Sync>) -> Engine {
        self.kept.push(thing);
        self
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn timeout_error(&self, header: &Header, peer: usize, start: Instant) -> Error {
        Error::Timeout {
            collective: header.sig.to_string(),
            seq: header.seq & !Header::P2P_BIT,
            rank: self.rank,
            peer,
            waited: start.elapsed(),
        }
    }
}

impl State {
    /// Marks `peer` gone and fails every call that waits on it.
    fn lose(&mut self, peer: usize, why: String) {
        if self.peers[peer].lost.is_some() {
            return;
        }
        self.peers[peer].lost = Some(why);
        let mut sending: Vec<usize> = self.peers[peer]
            .sendq
            .iter()
            .filter_map(|o| o.call)
            .collect();
        sending.extend(self.peers[peer].unacked.iter().map(|u| u.0));
        self.peers[peer].unacked.clear();
        self.peers[peer].to_read.clear();
        self.peers[peer].sendq.clear();
        for (id, call) in self.calls.iter_mut().enumerate() {
            let Some(call) = call else { continue };
            let waits = call.recvs.iter().any(|r| r.peer == peer && !r.done);
            if waits || sending.contains(&id) {
                call.error.get_or_insert(Error::PeerLost { rank: peer });
            }
        }
        if !self.peers[peer].said_bye {
            self.crashed(peer);
        }
    }

    /// A message nobody claims, of call `theirs` from `peer`: if this rank
    /// already finished its call at that point, the two calls differ. The
    /// rank fails from now on, and tells the peer. Returns whether it was
    /// such a message (and so is dropped).
    fn late_mismatch(&mut self, me: usize, peer: usize, theirs: &Header) -> bool {
        self.late_mismatch_of(me, peer, theirs.key(), theirs.sig.to_string())
    }

    /// [`State::late_mismatch`] for a message with `key` whose call is
    /// described by `remote` (a frame, or a fast-path message).
    fn late_mismatch_of(
        &mut self,
        me: usize,
        peer: usize,
        key: (u64, u64),
        remote: String,
    ) -> bool {
        let Some(ours) = lock_ledger(&self.ledger).finished_with(key) else {
            return false;
        };
        let err = Error::Mismatch {
            rank: me,
            local: ours.sig.to_string(),
            peer,
            remote,
        };
        self.fail_all(&err);
        self.set_sticky(err);
        let notice = Frame {
            kind: FrameKind::Mismatch,
            header: ours,
            len: 0,
            addr: 0,
            region: 0,
        }
        .encode();
        push_between_frames(&mut self.peers[peer].sendq, &notice);
        true
    }

    /// Peer `peer` found that its call `theirs` and ours at the same point
    /// differ: fail ours (now, or when this rank gets there).
    fn mismatch_reported(&mut self, me: usize, peer: usize, theirs: Header) {
        let ours = self
            .calls
            .iter_mut()
            .flatten()
            .find(|c| c.header.key() == theirs.key());
        match ours {
            Some(c) => {
                c.error.get_or_insert(Error::Mismatch {
                    rank: me,
                    local: c.header.sig.to_string(),
                    peer,
                    remote: theirs.sig.to_string(),
                });
            }
            None => {
                let mut ledger = lock_ledger(&self.ledger);
                match ledger.finished_with(theirs.key()) {
                    // Our side of that point is over: the communicator is
                    // broken from here, for every call.
                    Some(ours) => {
                        drop(ledger);
                        let err = Error::Mismatch {
                            rank: me,
                            local: ours.sig.to_string(),
                            peer,
                            remote: theirs.sig.to_string(),
                        };
                        self.fail_all(&err);
                        self.set_sticky(err);
                    }
                    // Not there yet (or a fast call in flight, which looks
                    // at the verdicts before it ends).
                    None => ledger.add_verdict(peer, theirs),
                }
            }
        }
    }

    /// Rank `culprit` went away without saying goodbye (killed, crashed):
    /// every call here fails naming it, now and from now on, and every peer
    /// is told, so that ranks waiting on a third rank do not hang until
    /// their deadline or blame the wrong one.
    fn crashed(&mut self, culprit: usize) {
        if self.culprit.is_some() {
            return;
        }
        self.culprit = Some(culprit);
        self.broken.store(true, Ordering::SeqCst);
        self.fail_all(&Error::PeerLost { rank: culprit });
        let notice = control_frame(FrameKind::Lost, culprit as u64);
        for (p, peer) in self.peers.iter_mut().enumerate() {
            if p != culprit && peer.lost.is_none() && peer.chan.is_some() {
                push_between_frames(&mut peer.sendq, &notice);
            }
        }
    }

    /// Moves every channel until nothing is queued for a live peer, for at
    /// most `within`: best effort for the last notices (abort, goodbye); a
    /// peer that stopped reading keeps its deadline and liveness checks.
    fn drain_briefly(&mut self, me: usize, aborted: &AtomicBool, within: Duration) {
        let until = Instant::now() + within;
        while self
            .peers
            .iter()
            .any(|p| p.lost.is_none() && p.chan.is_some() && !p.sendq.is_empty())
            && Instant::now() < until
        {
            if !self.progress(me, aborted) {
                std::thread::yield_now();
            }
        }
    }

    /// Writes queued control frames as far as the channels take them now,
    /// without waiting (used right after a crash is noticed).
    fn flush_now(&mut self) {
        for p in 0..self.peers.len() {
            if self.peers[p].lost.is_some() {
                continue;
            }
            let Some(mut chan) = self.peers[p].chan.take() else {
                continue;
            };
            while let Some(out) = self.peers[p].sendq.front_mut() {
                match chan.send_some(out.remaining()) {
                    Ok(n) if n > 0 => {
                        out.done += n;
                        if out.done < out.total() {
                            continue;
                        }
                        let out = self.peers[p].sendq.pop_front().expect("front exists");
                        if out.alert {
                            chan.alert();
                        }
                        self.sent(p, out);
                    }
                    _ => break,
                }
            }
            self.peers[p].chan = Some(chan);
        }
    }

    /// Every call fails with `err` from now on (the first such error
    /// stays).
    fn set_sticky(&mut self, err: Error) {
        self.sticky.get_or_insert(err);
        self.broken.store(true, Ordering::SeqCst);
    }

    /// Asks every live peer's channel whether the peer still exists, and
    /// loses those that do not (at most every `LIVENESS_EVERY`; `now` is
    /// the time of this check).
    fn check_liveness(&mut self, now: Instant) {
        self.last_liveness = now;
        for p in 0..self.peers.len() {
            if self.peers[p].lost.is_some() {
                continue;
            }
            if let Some(chan) = self.peers[p].chan.as_mut() {
                if let Err(e) = chan.check_alive() {
                    self.lose(p, format!("rank {p}: {e}"));
                }
            }
        }
    }

    /// Tells `peer` that its call at the point of our call `ours` differs.
    fn notify_mismatch(&mut self, peer: usize, ours: &Header) {
        if self.peers[peer].lost.is_some() || self.peers[peer].chan.is_none() {
            return;
        }
        let notice = Frame {
            kind: FrameKind::Mismatch,
            header: *ours,
            len: 0,
            addr: 0,
            region: 0,
        }
        .encode();
        push_between_frames(&mut self.peers[peer].sendq, &notice);
    }

    /// Handles fast-path messages found where this rank used the rings
    /// ([`FastPath::drain`]): one for a call running here fails that call
    /// (and tells the peer); one for a finished call is a late mismatch.
    fn fast_foreign(&mut self, me: usize, found: Vec<Foreign>) {
        for f in found {
            let remote = fastpath::describe(f.sig);
            let running = self
                .calls
                .iter_mut()
                .flatten()
                .find(|c| c.header.key() == f.key);
            match running {
                Some(c) => {
                    c.error.get_or_insert(Error::Mismatch {
                        rank: me,
                        local: c.header.sig.to_string(),
                        peer: f.peer,
                        remote,
                    });
                    let ours = c.header;
                    self.notify_mismatch(f.peer, &ours);
                }
                None => {
                    self.late_mismatch_of(me, f.peer, f.key, remote);
                }
            }
        }
    }

    /// Fails every call (an abort, here or at a peer).
    fn fail_all(&mut self, err: &Error) {
        for call in self.calls.iter_mut().flatten() {
            call.error.get_or_insert_with(|| err.clone());
        }
    }

    /// The first unmatched receive from `peer` of the call with `header`'s key.
    fn find_posted(&self, peer: usize, header: &Header) -> Option<(usize, usize)> {
        self.calls.iter().enumerate().find_map(|(id, c)| {
            let c = c.as_ref()?;
            if c.header.key() != header.key() {
                return None;
            }
            let idx = c.recvs.iter().position(|r| r.peer == peer && !r.matched)?;
            Some((id, idx))
        })
    }

    /// [`State::find_posted`] for a message that just arrived whole: none if
    /// an older message of the same key from `peer` still waits (FIFO).
    fn find_posted_in_order(&self, peer: usize, header: &Header) -> Option<(usize, usize)> {
        let older = self.peers[peer]
            .unexpected
            .iter()
            .any(|u| u.header.key() == header.key());
        if older {
            None
        } else {
            self.find_posted(peer, header)
        }
    }

    /// Checks a message against the receive it matched; on a mismatch the
    /// call fails and the message is dropped.
    fn accept(
        &mut self,
        me: usize,
        peer: usize,
        call: usize,
        idx: usize,
        header: &Header,
        len: usize,
    ) -> bool {
        let c = self.calls[call].as_mut().expect("live call");
        c.recvs[idx].matched = true;
        let want = c.recvs[idx].len;
        if header.sig != c.header.sig || len != want {
            let remote = if header.sig != c.header.sig {
                header.sig.to_string()
            } else {
                format!(
                    "{} with a message of {len} bytes where {want} were expected",
                    header.sig
                )
            };
            c.error.get_or_insert(Error::Mismatch {
                rank: me,
                local: c.header.sig.to_string(),
                peer,
                remote,
            });
            // Tell the peer, so that it fails with the same verdict instead
            // of waiting for a message this rank will never send.
            let notice = Frame {
                kind: FrameKind::Mismatch,
                header: c.header,
                len: 0,
                addr: 0,
                region: 0,
            }
            .encode();
            push_between_frames(&mut self.peers[peer].sendq, &notice);
            return false;
        }
        true
    }

    fn finish_recv(&mut self, call: usize, idx: usize) {
        let c = self.calls[call].as_mut().expect("live call");
        c.recvs[idx].done = true;
        c.pending_recvs -= 1;
    }

    /// Consumes a prefix of `bytes` arriving from `peer`; returns how many.
    fn consume(&mut self, me: usize, peer: usize, bytes: &[u8], aborted: &AtomicBool) -> usize {
        let mut used = 0;
        loop {
            let rest = &bytes[used..];
            match &mut self.peers[peer].rx {
                Rx::Header { buf, have } => {
                    let take = (HEADER_BYTES - *have).min(rest.len()) & !7;
                    if take == 0 {
                        return used;
                    }
                    buf[*have..*have + take].copy_from_slice(&rest[..take]);
                    *have += take;
                    used += take;
                    if *have < HEADER_BYTES {
                        return used;
                    }
                    let frame = match Frame::decode(buf) {
                        Ok(f) => f,
                        Err(why) => {
                            self.lose(peer, format!("corrupt stream from rank {peer}: {why}"));
                            return bytes.len();
                        }
                    };
                    if frame.kind == FrameKind::Mismatch {
                        self.mismatch_reported(me, peer, frame.header);
                        self.peers[peer].rx = Rx::Header {
                            buf: [0; HEADER_BYTES],
                            have: 0,
                        };
                        continue;
                    }
                    if matches!(frame.kind, FrameKind::Lost | FrameKind::Bye) {
                        if frame.kind == FrameKind::Bye {
                            self.peers[peer].said_bye = true;
                        } else {
                            let culprit = frame.addr as usize;
                            if culprit < self.peers.len() && culprit != me {
                                self.crashed(culprit);
                            }
                        }
                        self.peers[peer].rx = Rx::Header {
                            buf: [0; HEADER_BYTES],
                            have: 0,
                        };
                        continue;
                    }
                    if frame.kind == FrameKind::Ack {
                        self.acknowledged(peer, &frame);
                        self.peers[peer].rx = Rx::Header {
                            buf: [0; HEADER_BYTES],
                            have: 0,
                        };
                        continue;
                    }
                    if matches!(frame.kind, FrameKind::Remote | FrameKind::Shared) {
                        self.remote_arrived(me, peer, frame);
                        self.peers[peer].rx = Rx::Header {
                            buf: [0; HEADER_BYTES],
                            have: 0,
                        };
                        continue;
                    }
                    if frame.kind == FrameKind::Abort {
                        aborted.store(true, Ordering::SeqCst);
                        self.fail_all(&Error::Aborted);
                        self.peers[peer].rx = Rx::Header {
                            buf: [0; HEADER_BYTES],
                            have: 0,
                        };
                        continue;
                    }
                    let target = match self.find_posted(peer, &frame.header) {
                        Some((call, idx)) => {
                            if self.accept(me, peer, call, idx, &frame.header, frame.len) {
                                Target::Posted { call, idx }
                            } else {
                                Target::Discard
                            }
                        }
                        None => Target::Unexpected(vec![0u64; frame.len.div_ceil(8)]),
                    };
                    self.peers[peer].rx = Rx::Body {
                        frame,
                        target,
                        got: 0,
                        crc: 0,
                    };
                    self.maybe_finish_body(me, peer);
                }
                Rx::Body {
                    frame,
                    target,
                    got,
                    crc,
                } => {
                    let total = padded(frame.len);
                    let left = total - *got;
                    let mut take = left.min(rest.len());
                    if take < left {
                        take &= !7;
                    }
                    if take == 0 {
                        return used;
                    }
                    let payload_end = frame.len.min(*got + take);
                    if payload_end > *got {
                        let chunk = &rest[..payload_end - *got];
                        if frame.addr & CRC_PRESENT != 0 {
                            *crc = crc32c::crc32c_append(*crc, chunk);
                        }
                        match target {
                            Target::Posted { call, idx } => {
                                let c = self.calls[*call].as_mut().expect("live call");
                                // SAFETY: the call is registered, so its sink
                                // is alive and its thread is blocked in
                                // exchange; we hold the mutex (see SinkPtr).
                                unsafe { (*c.sink.0).deliver(*idx, *got, chunk) };
                            }
                            Target::Unexpected(buf) => {
                                let dst: &mut [u8] = bytemuck::cast_slice_mut(buf);
                                dst[*got..payload_end].copy_from_slice(chunk);
                            }
                            Target::Discard => {}
                        }
                    }
                    *got += take;
                    used += take;
                    self.maybe_finish_body(me, peer);
                }
            }
        }
    }

    /// A peer has read one of our remote-data messages.
    fn acknowledged(&mut self, peer: usize, frame: &Frame) {
        let key = frame.header.key();
        let unacked = &mut self.peers[peer].unacked;
        if let Some(at) = unacked.iter().position(|u| u.1 == key && u.2 == frame.addr) {
            let (call, _, _) = unacked.swap_remove(at);
            if let Some(c) = self.calls[call].as_mut() {
                c.pending_sends -= 1;
            }
        }
    }

    /// A remote-data message arrived: match it like a data message, but
    /// leave the bytes where they are until they are read.
    fn remote_arrived(&mut self, me: usize, peer: usize, frame: Frame) {
        let posted = self.find_posted_in_order(peer, &frame.header);
        match posted {
            Some((call, idx)) => {
                if self.accept(me, peer, call, idx, &frame.header, frame.len) {
                    self.peers[peer].to_read.push_back(RemoteRead {
                        header: frame.header,
                        call,
                        idx,
                        addr: frame.addr,
                        len: frame.len,
                        region: (frame.kind == FrameKind::Shared).then_some(frame.region),
                    });
                } else {
                    // Rejected: release the sender anyway.
                    self.queue_ack(peer, &frame.header, frame.addr);
                }
            }
            None => {
                if self.late_mismatch(me, peer, &frame.header) {
                    // Release the sender of a message nobody will read.
                    self.queue_ack(peer, &frame.header, frame.addr);
                } else {
                    self.peers[peer].unexpected.push_back(Unexpected {
                        header: frame.header,
                        len: frame.len,
                        data: Vec::new(),
                        corrupt: false,
                        remote: Some((
                            frame.addr,
                            (frame.kind == FrameKind::Shared).then_some(frame.region),
                        )),
                    });
                }
            }
        }
    }

    /// Queues the acknowledgement of remote message `addr` of call `header`.
    /// Removes the first unexpected message under `key` (peers in order)
    /// and returns it with its sender, acknowledging a remote one so that
    /// its sender may reuse the buffer.
    fn take_unexpected(&mut self, key: (u64, u64)) -> Option<(usize, Unexpected)> {
        for peer in 0..self.peers.len() {
            let q = &mut self.peers[peer].unexpected;
            let Some(at) = q.iter().position(|u| u.header.key() == key) else {
                continue;
            };
            let msg = q.remove(at).expect("position is valid");
            if let Some((addr, _)) = msg.remote {
                self.queue_ack(peer, &msg.header, addr);
            }
            return Some((peer, msg));
        }
        None
    }

    fn queue_ack(&mut self, peer: usize, header: &Header, addr: u64) {
        let ack = Frame {
            kind: FrameKind::Ack,
            header: *header,
            len: 0,
            addr,
            region: 0,
        };
        self.peers[peer]
            .sendq
            .push_back(Outbound::header_only(None, ack.encode().to_vec(), None));
    }

    /// Reads every matched remote message from `peer` straight from its
    /// memory into the receiving call's sink, and acknowledges each.
    fn read_remotes(&mut self, peer: usize, chan: &mut dyn Channel) -> io::Result<bool> {
        let mut moved = false;
        if self.bounce.len() < BOUNCE_BYTES / 8 {
            self.bounce.resize(BOUNCE_BYTES / 8, 0);
        }
        while let Some(r) = self.peers[peer].to_read.pop_front() {
            moved = true;
            if let (Some(c), Some(region)) = (self.calls[r.call].as_mut(), r.region) {
                // In place, from our mapping of the sender's buffer.
                let bytes = chan.shared_bytes(region, r.addr, r.len)?;
                // SAFETY: the call is registered (see SinkPtr).
                unsafe { (*c.sink.0).deliver(r.idx, 0, bytes) };
                self.finish_recv(r.call, r.idx);
            } else if let Some(c) = self.calls[r.call].as_mut() {
                let mut off = 0;
                while off < r.len {
                    let n = (r.len - off).min(BOUNCE_BYTES);
                    let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut self.bounce);
                    chan.read_remote(r.addr + off as u64, &mut bytes[..n])?;
                    // SAFETY: the call is registered (see SinkPtr).
                    unsafe { (*c.sink.0).deliver(r.idx, off, &bytes[..n]) };
                    off += n;
                }
                self.finish_recv(r.call, r.idx);
            }
            self.queue_ack(peer, &r.header, r.addr);
        }
        Ok(moved)
    }

    /// Completes the frame being received from `peer` if all of it is in.
    fn maybe_finish_body(&mut self, me: usize, peer: usize) {
        let Rx::Body { frame, got, .. } = &self.peers[peer].rx else {
            return;
        };
        if *got < padded(frame.len) {
            return;
        }
        let rx = std::mem::replace(
            &mut self.peers[peer].rx,
            Rx::Header {
                buf: [0; HEADER_BYTES],
                have: 0,
            },
        );
        let Rx::Body {
            frame, target, crc, ..
        } = rx
        else {
            unreachable!("matched above")
        };
        let corrupt = frame.addr & CRC_PRESENT != 0 && frame.addr as u32 != crc;
        if corrupt {
            if let Target::Posted { call, .. } = target {
                let c = self.calls[call].as_mut().expect("live call");
                c.error.get_or_insert(Error::Corrupted {
                    rank: me,
                    peer,
                    collective: c.header.sig.to_string(),
                });
            }
        }
        match target {
            Target::Posted { call, idx } => self.finish_recv(call, idx),
            Target::Unexpected(data) => {
                // A call may have posted the receive while the message was
                // arriving.
                let posted = self.find_posted_in_order(peer, &frame.header);
                match posted {
                    Some((call, idx)) => {
                        if self.accept(me, peer, call, idx, &frame.header, frame.len) {
                            let c = self.calls[call].as_mut().expect("live call");
                            if corrupt {
                                c.error.get_or_insert(Error::Corrupted {
                                    rank: me,
                                    peer,
                                    collective: c.header.sig.to_string(),
                                });
                            }
                            let bytes: &[u8] = bytemuck::cast_slice(&data);
                            // SAFETY: the call is registered (see SinkPtr).
                            unsafe { (*c.sink.0).deliver(idx, 0, &bytes[..frame.len]) };
                            self.finish_recv(call, idx);
                        }
                    }
                    None => {
                        if !self.late_mismatch(me, peer, &frame.header) {
                            self.peers[peer].unexpected.push_back(Unexpected {
                                header: frame.header,
                                len: frame.len,
                                data,
                                remote: None,
                                corrupt,
                            });
                        }
                    }
                }
            }
            Target::Discard => {}
        }
    }

    /// Writes and reads every channel as far as it goes without blocking.
    /// Returns whether any byte moved.
    fn progress(&mut self, me: usize, aborted: &AtomicBool) -> bool {
        let culprit_before = self.culprit;
        let moved = self.progress_channels(me, aborted);
        if self.culprit.is_some() && culprit_before.is_none() {
            self.flush_now();
        }
        moved
    }

    fn progress_channels(&mut self, me: usize, aborted: &AtomicBool) -> bool {
        let mut moved = false;
        if self.peers.iter().any(|p| p.lazy) {
            moved |= self.accept_peers();
        }
        for p in 0..self.peers.len() {
            if self.peers[p].lost.is_some() {
                continue;
            }
            let Some(mut chan) = self.peers[p].chan.take() else {
                continue;
            };
            let result = self.pump(me, p, chan.as_mut(), aborted, &mut moved);
            self.peers[p].chan = Some(chan);
            if let Err(e) = result {
                self.lose(p, format!("rank {p}: {e}"));
            }
        }
        moved
    }

    fn pump(
        &mut self,
        me: usize,
        p: usize,
        chan: &mut dyn Channel,
        aborted: &AtomicBool,
        moved: &mut bool,
    ) -> io::Result<()> {
        while let Some(out) = self.peers[p].sendq.front_mut() {
            let n = chan.send_some(out.remaining())?;
            if n == 0 {
                break;
            }
            *moved = true;
            out.done += n;
            if out.done == out.total() {
                let out = self.peers[p].sendq.pop_front().expect("front exists");
                if out.alert {
                    chan.alert();
                }
                self.sent(p, out);
            }
        }
        loop {
            let n = chan.recv_some(&mut |bytes| self.consume(me, p, bytes, aborted))?;
            if n == 0 {
                break;
            }
            *moved = true;
        }
        if !self.peers[p].to_read.is_empty() {
            *moved |= self.read_remotes(p, &mut *chan)?;
            // Send the acknowledgements now rather than at the next turn.
            while let Some(out) = self.peers[p].sendq.front_mut() {
                let n = chan.send_some(out.remaining())?;
                out.done += n;
                if n == 0 || out.done < out.total() {
                    break;
                }
                let out = self.peers[p].sendq.pop_front().expect("front exists");
                if out.alert {
                    chan.alert();
                }
                self.sent(p, out);
            }
        }
        Ok(())
    }

    /// Installs the channels of peers that have connected to us.
    fn accept_peers(&mut self) -> bool {
        let Some(connector) = self.connector.as_mut() else {
            return false;
        };
        match connector.accept() {
            Ok(ready) => {
                let any = !ready.is_empty();
                for (peer, chan) in ready {
                    self.peers[peer].chan = Some(chan);
                    self.peers[peer].lazy = false;
                }
                any
            }
            Err(e) => {
                let waiting: Vec<usize> = (0..self.peers.len())
                    .filter(|&p| self.peers[p].lazy)
                    .collect();
                for p in waiting {
                    self.lose(p, e.to_string());
                }
                false
            }
        }
    }

    /// Connects to every lower-ranked peer in `peers` that has no
    /// connection yet (higher-ranked ones connect to us).
    fn connect_to(&mut self, me: usize, peers: impl Iterator<Item = usize>) -> Result<()> {
        for p in peers {
            if p < me && self.peers[p].lazy && self.peers[p].chan.is_none() {
                let connector = self
                    .connector
                    .as_mut()
                    .expect("lazy peers have a connector");
                let chan = connector.connect(p)?;
                self.peers[p].chan = Some(chan);
                self.peers[p].lazy = false;
            }
        }
        Ok(())
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

    /// Delivers already-arrived messages to the new call `id`'s receives.
    fn match_unexpected(&mut self, me: usize, id: usize) {
        let c = self.calls[id].as_ref().expect("live call");
        let key = c.header.key();
        let wanted: Vec<(usize, usize)> = c
            .recvs
            .iter()
            .enumerate()
            .map(|(i, r)| (i, r.peer))
            .collect();
        for (idx, peer) in wanted {
            let q = &mut self.peers[peer].unexpected;
            let Some(pos) = q.iter().position(|u| u.header.key() == key) else {
                continue;
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
            let msg = q.remove(pos).expect("position is valid");
            if let Some((addr, region)) = msg.remote {
                if self.accept(me, peer, id, idx, &msg.header, msg.len) {
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
            if self.accept(me, peer, id, idx, &msg.header, msg.len) {
                let c = self.calls[id].as_mut().expect("live call");
                if msg.corrupt {
                    c.error.get_or_insert(Error::Corrupted {
                        rank: me,
                        peer,
                        collective: c.header.sig.to_string(),
                    });
                }
                let bytes: &[u8] = bytemuck::cast_slice(&msg.data);
                // SAFETY: `id` is the calling thread's own registered call.
                unsafe { (*c.sink.0).deliver(idx, 0, &bytes[..msg.len]) };
                self.finish_recv(id, idx);
            }
        }
    }

    /// Removes call `id`: its unsent frames go, a half-sent one is finished
    /// from a copy, and bytes still arriving for it are dropped.
    fn retire(&mut self, id: usize) {
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

impl Transport for Engine {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn exchange(
        &self,
        header: &Header,
        sends: &[Outgoing<'_>],
        recvs: &[Incoming],
        sink: &mut dyn Sink,
        deadline: Instant,
    ) -> Result<()> {
        if self.aborted.load(Ordering::SeqCst) {
            return Err(Error::Aborted);
        }
        let start = Instant::now();
        let mut st = self.lock();
        if let Some(culprit) = st.culprit {
            return Err(Error::PeerLost { rank: culprit });
        }
        if let Some(err) = &st.sticky {
            return Err(err.clone());
        }
        let size = self.size;
        for peer in sends
            .iter()
            .map(|s| s.peer)
            .chain(recvs.iter().map(|r| r.peer))
        {
            if peer >= size || peer == self.rank {
                return Err(Error::Internal(format!(
                    "rank {} asked its transport to talk to rank {peer} (of {size})",
                    self.rank
                )));
            }
        }
        // Sending to a gone peer fails at once; receiving from one fails only
        // if what it sent before leaving does not hold the message.
        if let Some(s) = sends.iter().find(|s| st.peers[s.peer].lost.is_some()) {
            return Err(Error::PeerLost { rank: s.peer });
        }
        st.connect_to(
            self.rank,
            sends
                .iter()
                .map(|s| s.peer)
                .chain(recvs.iter().map(|r| r.peer)),
        )?;
        // SAFETY: only the lifetime is erased; the pointer is removed from the
        // table (`retire`) before this function returns, while `sink` is
        // still borrowed.
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
        };
        let id = match st.calls.iter().position(Option::is_none) {
            Some(free) => {
                st.calls[free] = Some(call);
                free
            }
            None => {
                st.calls.push(Some(call));
                st.calls.len() - 1
            }
        };
        for s in sends {
            // Large messages to a peer that can read our memory: send only
            // their address (single copy, by the receiver).
            let chan = st.peers[s.peer].chan.as_ref();
            // Large messages in a shared buffer to a peer that maps it: only
            // where they are.
            let shared = (s.data.len() >= SHARED_BYTES && chan.is_some_and(|c| c.maps_shared()))
                .then(|| crate::shared::locate(s.data.as_ptr(), s.data.len()))
                .flatten();
            let remote =
                s.data.len() >= single_copy_bytes() && chan.is_some_and(|c| c.reads_remote());
            if shared.is_some() || remote {
                let frame = match shared {
                    Some(at) => Frame {
                        kind: FrameKind::Shared,
                        header: *header,
                        len: s.data.len(),
                        addr: at.offset,
                        region: u64::from(at.fd) << 32 | u64::from(at.generation),
                    },
                    None => Frame {
                        kind: FrameKind::Remote,
                        header: *header,
                        len: s.data.len(),
                        addr: s.data.as_ptr() as u64,
                        region: 0,
                    },
                };
                let addr = frame.addr;
                st.peers[s.peer].sendq.push_back(Outbound::header_only(
                    Some(id),
                    frame.encode().to_vec(),
                    Some(addr),
                ));
                continue;
            }
            let mut frame = Frame::data(*header, s.data.len());
            if checksums() {
                frame.addr = CRC_PRESENT | u64::from(crc32c::crc32c(s.data));
            }
            // The test hook counts data frames only when it is set.
            let flip = flip_frame().is_some_and(|n| {
                DATA_FRAMES_SENT.fetch_add(1, Ordering::Relaxed) + 1 == n && !s.data.is_empty()
            });
            // A frame to corrupt (test hook) is copied so the caller's
            // buffer stays intact.
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
            st.peers[s.peer].sendq.push_back(Outbound {
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
        // Verdicts are added under the state's lock, which is held: a zero
        // count is exact.
        let verdict = if self.verdicts.load(Ordering::Relaxed) > 0 {
            self.ledger().take_verdict(header.key())
        } else {
            None
        };
        if let Some((peer, theirs)) = verdict {
            st.retire(id);
            return Err(Error::Mismatch {
                rank: self.rank,
                local: header.sig.to_string(),
                peer,
                remote: theirs.sig.to_string(),
            });
        }
        st.match_unexpected(self.rank, id);
        // A peer that took the fast path for this call (its message came
        // before the call started, so it waits in the stash): a mismatch.
        if let Some(fast) = &self.fast {
            let found = fast.drain(&mut self.ledger(), |key| key == header.key());
            if !found.is_empty() {
                st.fast_foreign(self.rank, found);
                st.flush_now();
            }
        }
        let state = &*st;
        let c = state.calls[id].as_ref().expect("live call");
        let gone = c
            .recvs
            .iter()
            .find(|r| !r.done && state.peers[r.peer].lost.is_some());
        if let Some(peer) = gone.map(|r| r.peer) {
            let err = Error::PeerLost { rank: peer };
            st.retire(id);
            return Err(err);
        }
        self.active.fetch_add(1, Ordering::SeqCst);
        let (mut st, result) = self.drive(st, id, start, deadline);
        self.active.fetch_sub(1, Ordering::SeqCst);
        st.retire(id);
        drop(st);
        // Another thread may have been waiting for bytes this call's progress
        // delivered to it.
        if self.active.load(Ordering::SeqCst) > 0 {
            self.bell.ring_local();
        }
        result
    }

    fn end_call(&self, header: &Header) -> Result<()> {
        let mut st = self.lock();
        let found = {
            let mut ledger = self.ledger();
            ledger.finish(header);
            // A small call's message in a mailbox, for this call or another
            // finished one: a peer took the fast path where this rank did
            // not.
            match &self.fast {
                Some(fast) => fast.drain(&mut ledger, |_| false),
                None => Vec::new(),
            }
        };
        if !found.is_empty() {
            st.fast_foreign(self.rank, found);
            st.flush_now();
            if let Some(err) = st.sticky.clone() {
                return Err(err);
            }
        }
        // Anything of this call left unclaimed came from a peer that called
        // something else here.
        if let Some((peer, msg)) = st.take_unexpected(header.key()) {
            st.late_mismatch(self.rank, peer, &msg.header);
            let err = st.sticky.clone().expect("set by late_mismatch");
            st.flush_now();
            return Err(err);
        }
        Ok(())
    }

    fn abort(&self) {
        // Peers first, this rank's own waiters after: a thread that returns
        // Aborted may end the process at once, and a notice not yet written
        // would be lost with it (a small-call waiter polls the flag without
        // the lock, so it would not wait for this one).
        let mut st = self.lock();
        // Tell every peer, so their waits end too (best effort: a full
        // channel drops the notice, and the peer's deadline still holds).
        let notice = control_frame(FrameKind::Abort, 0);
        for p in 0..st.peers.len() {
            let peer = &mut st.peers[p];
            if peer.lost.is_some() || peer.chan.is_none() {
                continue;
            }
            // Only between frames: a half-written frame must finish first.
            if peer.sendq.front().is_some_and(|o| o.done > 0) {
                let mut first = peer.sendq.pop_front().expect("front exists");
                first.detach();
                peer.sendq.clear();
                peer.sendq.push_back(first);
            } else {
                peer.sendq.clear();
            }
            peer.sendq.push_back(Outbound::notice(notice.clone()));
        }
        st.drain_briefly(self.rank, &self.aborted, Duration::from_millis(100));
        self.aborted.store(true, Ordering::SeqCst);
        st.fail_all(&Error::Aborted);
        drop(st);
        self.bell.ring_local();
    }

    fn name(&self) -> &'static str {
        self.name
    }
}

impl Engine {
    /// What a fast call cannot see in its mailboxes, checked while it
    /// waits (and when a notice arrived): runs the engine once (notices,
    /// abort, frames), looks for dead peers if `liveness` and it is time,
    /// and fails the call `header` on an abort, a crashed or lost rank it
    /// awaits (`awaited`), a mismatch a peer reported, or a frame of this
    /// call on the rings (a peer that took the rings where this rank took
    /// the fast path).
    pub(super) fn fast_checkup(
        &self,
        fast: &FastPath,
        header: &Header,
        awaited: &[usize],
        liveness: bool,
    ) -> Result<()> {
        if self.is_aborted() {
            return Err(Error::Aborted);
        }
        // Before reading the rings, so that a notice arriving later is
        // acted on next time.
        fast.notices_acted();
        let mut st = self.lock();
        st.progress(self.rank, &self.aborted);
        // As after an engine call's progress: bytes for another thread's
        // call may have been delivered.
        if self.active.load(Ordering::SeqCst) > 0 {
            self.bell.ring_local();
        }
        if liveness {
            let now = Instant::now();
            if now.duration_since(st.last_liveness) >= LIVENESS_EVERY {
                st.check_liveness(now);
            }
        }
        if self.is_aborted() {
            return Err(Error::Aborted);
        }
        if let Some(culprit) = st.culprit {
            return Err(Error::PeerLost { rank: culprit });
        }
        if let Some(err) = &st.sticky {
            return Err(err.clone());
        }
        let verdict = self.ledger().take_verdict(header.key());
        if let Some((peer, theirs)) = verdict {
            return Err(Error::Mismatch {
                rank: self.rank,
                local: header.sig.to_string(),
                peer,
                remote: theirs.sig.to_string(),
            });
        }
        if let Some((p, msg)) = st.take_unexpected(header.key()) {
            st.notify_mismatch(p, header);
            st.flush_now();
            return Err(Error::Mismatch {
                rank: self.rank,
                local: header.sig.to_string(),
                peer: p,
                remote: msg.header.sig.to_string(),
            });
        }
        if let Some(&p) = awaited.iter().find(|&&p| st.peers[p].lost.is_some()) {
            return Err(Error::PeerLost { rank: p });
        }
        Ok(())
    }

    /// Fails the fast call `header` for `problem`, telling the peer where
    /// the engine would.
    pub(super) fn fast_fail(&self, header: &Header, problem: Problem) -> Error {
        let mut st = self.lock();
        match problem {
            Problem::Mismatch { peer, theirs } => {
                st.notify_mismatch(peer, header);
                st.flush_now();
                Error::Mismatch {
                    rank: self.rank,
                    local: header.sig.to_string(),
                    peer,
                    remote: fastpath::describe(theirs),
                }
            }
            Problem::Late { peer, key, theirs } => {
                st.late_mismatch_of(self.rank, peer, key, fastpath::describe(theirs));
                st.flush_now();
                st.sticky.clone().unwrap_or_else(|| Error::Mismatch {
                    rank: self.rank,
                    local: header.sig.to_string(),
                    peer,
                    remote: fastpath::describe(theirs),
                })
            }
            Problem::Reported { peer, theirs } => Error::Mismatch {
                rank: self.rank,
                local: header.sig.to_string(),
                peer,
                remote: theirs.sig.to_string(),
            },
        }
    }

    /// Moves everything until call `id` completes, fails or times out.
    fn drive<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        id: usize,
        start: Instant,
        deadline: Instant,
    ) -> (MutexGuard<'a, State>, Result<()>) {
        let default_spin = if self.dedicated_core {
            SPIN_DEDICATED
        } else {
            SPIN_SHARED
        };
        let spin_until = start + spin_override().unwrap_or(default_spin);
        loop {
            let token = self.bell.token();
            let moved = st.progress(self.rank, &self.aborted);
            let c = st.calls[id].as_mut().expect("live call");
            if let Some(err) = c.error.take() {
                return (st, Err(err));
            }
            if c.pending_sends == 0 && c.pending_recvs == 0 {
                return (st, Ok(()));
            }
            if self.aborted.load(Ordering::SeqCst) {
                return (st, Err(Error::Aborted));
            }
            if moved {
                continue;
            }
            let now = Instant::now();
            if now >= deadline {
                let c = st.calls[id].as_ref().expect("live call");
                let peer = c
                    .recvs
                    .iter()
                    .find(|r| !r.done)
                    .map(|r| r.peer)
                    .or_else(|| {
                        st.peers
                            .iter()
                            .position(|p| p.sendq.iter().any(|o| o.call == Some(id)))
                    })
                    .unwrap_or(self.rank);
                let err = self.timeout_error(&c.header, peer, start);
                return (st, Err(err));
            }
            if now.duration_since(st.last_liveness) >= LIVENESS_EVERY {
                st.check_liveness(now);
                continue;
            }
            // A peer on the fast path where this call uses the rings: its
            // message waits in a mailbox.
            if let Some(fast) = self.fast.as_ref().filter(|f| f.anything_new()) {
                let live: Vec<(u64, u64)> =
                    st.calls.iter().flatten().map(|c| c.header.key()).collect();
                let found = fast.drain(&mut self.ledger(), |key| live.contains(&key));
                if !found.is_empty() {
                    st.fast_foreign(self.rank, found);
                    st.flush_now();
                    continue;
                }
            }
            if now < spin_until {
                // Let go of the lock so other threads of this rank progress.
                drop(st);
                // Spin briefly (the peer is usually on another core and
                // microseconds away), then yield: with more ranks than
                // cores the peer we wait for may need this very core.
                if self.dedicated_core {
                    // A few pauses only: one PAUSE takes ~140 cycles on
                    // recent x86 cores, so the 32 this loop once had made
                    // every poll ~1.5 us late (8 B through the rings: median
                    // 1.2-1.3 us with 32, 0.49 us with 4; bench/RESULTS.md).
                    for _ in 0..4 {
                        std::hint::spin_loop();
                    }
                } else {
                    std::thread::yield_now();
                }
                st = self.lock();
                continue;
            }
            let mut slice = deadline.saturating_duration_since(now).min(SLEEP_SLICE);
            if self.active.load(Ordering::SeqCst) > 1 {
                slice = slice.min(Duration::from_millis(1));
            }
            let mut polls: Vec<libc::pollfd> = Vec::new();
            let mut all_fds = true;
            if st.peers.iter().any(|p| p.lazy) {
                if let Some(connector) = st.connector.as_ref() {
                    polls.push(libc::pollfd {
                        fd: connector.listener_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    });
                }
            }
            for p in st.peers.iter().filter(|p| p.lost.is_none()) {
                let Some(chan) = p.chan.as_ref() else {
                    continue;
                };
                let Some((read, write)) = chan.poll_fds() else {
                    all_fds = false;
                    continue;
                };
                let out = if p.sendq.is_empty() { 0 } else { libc::POLLOUT };
                if read == write {
                    polls.push(libc::pollfd {
                        fd: read,
                        events: libc::POLLIN | out,
                        revents: 0,
                    });
                } else {
                    polls.push(libc::pollfd {
                        fd: read,
                        events: libc::POLLIN,
                        revents: 0,
                    });
                    if out != 0 {
                        polls.push(libc::pollfd {
                            fd: write,
                            events: out,
                            revents: 0,
                        });
                    }
                }
            }
            drop(st);
            if polls.is_empty() {
                self.bell.wait(token, slice);
            } else {
                // Sockets wake poll; shared-memory peers (if any) only ring
                // the doorbell, so then poll in short slices.
                let slice = if all_fds {
                    slice
                } else {
                    slice.min(Duration::from_millis(1))
                };
                poll_fds(polls, slice);
            }
            st = self.lock();
        }
    }
}

/// Locks the ledger (a panic while it was held leaves it usable).
fn lock_ledger(ledger: &Mutex<Ledger>) -> MutexGuard<'_, Ledger> {
    ledger.lock().unwrap_or_else(|e| e.into_inner())
}

/// `poll(2)` on `fds` for at most `timeout` (interruptions are fine: the
/// caller looks at every channel again).
fn poll_fds(mut fds: Vec<libc::pollfd>, timeout: Duration) {
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
    // SAFETY: `fds` is a valid, exclusively borrowed array of `fds.len()`
    // pollfd structures for the duration of the call.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
}

/// A doorbell for ranks that wait only on sockets: it rings the threads of
/// this process (abort, another thread's progress).
pub(crate) struct LocalBell {
    count: Mutex<u64>,
    rung: std::sync::Condvar,
}

impl LocalBell {
    /// A new bell.
    pub fn new() -> LocalBell {
        LocalBell {
            count: Mutex::new(0),
            rung: std::sync::Condvar::new(),
        }
    }
}

impl Doorbell for LocalBell {
    fn token(&self) -> u64 {
        *self.count.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait(&self, token: u64, timeout: Duration) {
        let guard = self.count.lock().unwrap_or_else(|e| e.into_inner());
        let _ = self
            .rung
            .wait_timeout_while(guard, timeout, |c| *c == token);
    }

    fn ring_local(&self) {
        *self.count.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.rung.notify_all();
    }
}

/// A control frame (no call, no payload) carrying `value` in its address
/// field: a lost rank, or nothing.
fn control_frame(kind: FrameKind, value: u64) -> Vec<u8> {
    Frame {
        kind,
        header: Header {
            comm: 0,
            seq: 0,
            sig: super::Signature {
                kind: super::CallKind::PointToPoint,
                dtype: crate::types::DType::U8,
                op: None,
                count: 0,
                root: None,
            },
        },
        len: 0,
        addr: value,
        region: 0,
    }
    .encode()
    .to_vec()
}

/// Queues control frame `bytes` right after the frame being written (a
/// half-written frame cannot be interrupted), ahead of the data behind it.
fn push_between_frames(sendq: &mut VecDeque<Outbound>, bytes: &[u8]) {
    let at = usize::from(sendq.front().is_some_and(|o| o.done > 0));
    sendq.insert(at, Outbound::notice(bytes.to_vec()));
}

impl Drop for Engine {
    /// Says goodbye to every connected peer, so that its channel closing
    /// reads as a clean exit there rather than a crash.
    fn drop(&mut self) {
        let mut st = self.lock();
        let bye = control_frame(FrameKind::Bye, 0);
        for peer in st.peers.iter_mut() {
            if peer.lost.is_none() && peer.chan.is_some() {
                peer.sendq
                    .push_back(Outbound::header_only(None, bye.clone(), None));
            }
        }
        st.drain_briefly(self.rank, &self.aborted, Duration::from_millis(200));
    }
}
