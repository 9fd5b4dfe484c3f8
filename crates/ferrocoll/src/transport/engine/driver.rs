//! The driver: the engine's I/O around the sans-IO [`Core`]. It owns the
//! channels, the TCP connector (lazy peers, the listener), the knobs `init`
//! hands it ([`TransportConfig`]), the test hook that corrupts a frame (only
//! with the `fault-injection` feature), and the one mutex every
//! thread of the rank takes to move things; the waiting loop is in
//! `wait.rs`.

use std::io;
#[cfg(feature = "fault-injection")]
use std::sync::atomic::AtomicU64;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::core::{Core, Route};
use super::faults::{Fault, Stray};
use super::ledger::{Ledger, LedgerLock};
use crate::error::{Error, Result};
use crate::transport::channel::{Channel, Doorbell};
use crate::transport::config::TransportConfig;
use crate::transport::tcp::TcpConnector;
use crate::transport::{Header, Incoming, Outgoing, Sink, Transport};

/// How long a waiting call polls before it sleeps, by default: on a core of
/// its own it spins (a peer on another core answers within microseconds and
/// a futex wake-up costs more than that); sharing cores with other ranks it
/// yields between polls, so the peer it waits for can run. Yielding for
/// 1 ms rather than 30 us before the futex sleep: with 4 ranks on 2 cores a
/// wait often outlasts 30 us (the peer is in its time slice), and a sleeping
/// rank then waits for a wake-up and its turn on a core; in one run the
/// 4-rank shm broadcast took 0.43-0.78x the time at 32 KiB - 8 MiB and
/// allreduce 0.82-1.07x (bench/RESULTS.md, issue 20 item 5). Each yield
/// lets the core's other runnable threads go first; still, a waiting rank
/// keeps its fair share of the core for up to that 1 ms per wait.
pub(crate) const SPIN_DEDICATED: Duration = Duration::from_micros(200);
const SPIN_SHARED: Duration = Duration::from_millis(1);

/// How often a sleeping rank asks channels whether their peer still lives.
pub(super) const LIVENESS_EVERY: Duration = Duration::from_millis(200);

/// Bytes read from a remote sender at a time (the bounce buffer).
const BOUNCE_BYTES: usize = 256 << 10;

/// How long a failed call may spend writing its notices before its error
/// returns ([`State::drain_notices`]): a notice is one frame, written in
/// microseconds unless the peer's channel is full and the peer not reading.
const NOTICE_DRAIN: Duration = Duration::from_millis(20);

/// How long a collective waits before it probes the peers it waits on
/// (`desync.rs`): long against any message's way (microseconds), short
/// against a deadline.
pub(super) const PROBE_AFTER: Duration = Duration::from_millis(100);

/// Data frames this process sent, counted only for the fault hook
/// ([`TransportConfig::flip_frame`]), which counts across every engine of
/// the process.
#[cfg(feature = "fault-injection")]
static DATA_FRAMES_SENT: AtomicU64 = AtomicU64::new(0);

/// Messages at least this long that lie in a [`crate::SharedBuffer`] are
/// read in place by a receiver that can map it.
const SHARED_BYTES: usize = 4 << 10;

/// Another path that carries some calls' messages outside the engine's
/// channels (the shared-memory fast path): the engine's one view of it. A
/// peer that took that path where this rank took the engine leaves its
/// message there, so the engine asks for such strays when a call starts,
/// waits and ends.
pub(crate) trait Bypass: Send + Sync {
    /// Lock-free: whether messages may have arrived that no call took yet.
    fn anything_new(&self) -> bool;
    /// Takes what arrived and returns the messages for calls `ours` says
    /// the engine runs, or that the ledger lists as finished.
    fn strays(&self, ours: &dyn Fn((u64, u64)) -> bool) -> Vec<Stray>;
}

/// Everything behind the engine's mutex.
pub(super) struct State {
    pub(super) core: Core,
    /// By peer: its channel, once there is one.
    pub(super) chans: Vec<Option<Box<dyn Channel>>>,
    /// By peer: a TCP peer not connected yet (see [`TcpConnector`]).
    pub(super) lazy: Vec<bool>,
    /// Opens TCP connections on first use.
    pub(super) connector: Option<TcpConnector>,
    pub(super) last_liveness: Instant,
    /// Where remote data lands before it is reduced or copied into place.
    bounce: Vec<u64>,
    /// Where to tell the launcher which rank failed first
    /// ([`TransportConfig::blame_file`]), until it is told.
    blame_file: Option<std::path::PathBuf>,
}

/// A transport made of one [`Channel`] per peer.
pub(crate) struct Engine {
    pub(super) rank: usize,
    size: usize,
    name: &'static str,
    state: Mutex<State>,
    pub(super) bell: Arc<dyn Doorbell>,
    /// The core's abort flag, readable without the lock.
    pub(super) aborted: Arc<AtomicBool>,
    /// The core's broken flag (a crash, a late mismatch).
    broken: Arc<AtomicBool>,
    /// Threads inside `exchange`: with more than one, a sleeper in `poll`
    /// wakes often, since another thread may do its work.
    pub(super) active: AtomicUsize,
    /// This rank has a core to itself: poll by spinning, not yielding.
    pub(super) dedicated_core: bool,
    /// Things that must live as long as the transport (the rendezvous store
    /// rank 0 serves).
    kept: Vec<Box<dyn std::any::Any + Send + Sync>>,
    /// The path small calls may take instead (see [`Bypass`]).
    pub(super) bypass: Option<Arc<dyn Bypass>>,
    /// The environment knobs, as `init` read them.
    config: TransportConfig,
}

impl Engine {
    /// An engine for rank `rank` with `channels[p]` leading to peer `p`
    /// (`None` for this rank itself), sleeping on `bell`, tuned by `config`.
    pub(crate) fn new(
        rank: usize,
        channels: Vec<Option<Box<dyn Channel>>>,
        bell: Arc<dyn Doorbell>,
        name: &'static str,
        config: TransportConfig,
    ) -> Engine {
        let connected: Vec<bool> = channels.iter().map(Option::is_some).collect();
        let ledger: Arc<dyn LedgerLock> = Arc::new(Mutex::new(Ledger::new()));
        let mut core = Core::new(rank, &connected, config.checksums, ledger);
        // No waiting at all when the user turned the eager limit off.
        core.limit_eager_runs(config.eager_bytes != usize::MAX);
        let aborted = Arc::clone(core.aborted_flag());
        let broken = Arc::clone(core.broken_flag());
        Engine {
            rank,
            size: channels.len(),
            name,
            state: Mutex::new(State {
                core,
                lazy: vec![false; channels.len()],
                chans: channels,
                connector: None,
                last_liveness: Instant::now(),
                bounce: Vec::new(),
                blame_file: config.blame_file.clone(),
            }),
            bell,
            aborted,
            broken,
            active: AtomicUsize::new(0),
            dedicated_core: false,
            kept: Vec::new(),
            bypass: None,
            config,
        }
    }

    /// Lets `bypass` carry some calls, keeping the ledger in `ledger`
    /// (the bypass's own lock, see [`LedgerLock`]).
    pub(crate) fn with_bypass(
        mut self,
        bypass: Arc<dyn Bypass>,
        ledger: Arc<dyn LedgerLock>,
    ) -> Engine {
        self.lock().core.set_ledger(ledger);
        self.bypass = Some(bypass);
        self
    }

    /// Declares whether this rank runs on a core of its own (it spins while
    /// waiting) or shares cores with other ranks (it yields).
    pub(crate) fn dedicated_core(mut self, dedicated: bool) -> Engine {
        self.dedicated_core = dedicated;
        self
    }

    /// Connects to the peers in `lazy` over TCP when they are first needed.
    pub(crate) fn with_connector(self, connector: TcpConnector, lazy: &[usize]) -> Engine {
        {
            let mut st = self.lock();
            for &p in lazy {
                st.lazy[p] = true;
            }
            st.connector = Some(connector);
        }
        self
    }

    /// Keeps `thing` alive as long as the engine.
    pub(crate) fn keep_alive(mut self, thing: Box<dyn std::any::Any + Send + Sync>) -> Engine {
        self.kept.push(thing);
        self
    }

    /// How long a waiting call polls before it sleeps.
    pub(super) fn spin_time(&self) -> Duration {
        self.config.spin.unwrap_or(if self.dedicated_core {
            SPIN_DEDICATED
        } else {
            SPIN_SHARED
        })
    }

    /// What a bypass may ask of this engine (see [`Link`]).
    pub(crate) fn link(&self) -> Link<'_> {
        Link {
            rank: self.rank,
            dedicated_core: self.dedicated_core,
            spin: self.spin_time(),
            aborted: &self.aborted,
            broken: &self.broken,
            engine: self,
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Another thread may have been waiting for bytes this thread's
    /// progress delivered to it.
    pub(super) fn ring_if_others(&self) {
        if self.active.load(Ordering::SeqCst) > 0 {
            self.bell.ring_local();
        }
    }
}

/// The one interface a bypass has to the engine: the flags it polls
/// without a lock, how to wait, and two calls for what only the engine can
/// see or do.
pub(crate) struct Link<'a> {
    /// This rank.
    pub rank: usize,
    /// Whether this rank spins (its own core) or yields while waiting.
    pub dedicated_core: bool,
    /// How long a waiting call polls before it sleeps.
    pub spin: Duration,
    /// Set by an abort.
    pub aborted: &'a AtomicBool,
    /// Set once every call fails (a crashed rank, a late mismatch).
    pub broken: &'a AtomicBool,
    engine: &'a Engine,
}

impl<'a> Link<'a> {
    /// This link with waits that poll for at least `spin` before they
    /// sleep: for a call that knows its peer is busy on its behalf for
    /// about that long (a sleeping rank on a VM can take hundreds of
    /// microseconds to wake).
    pub(crate) fn polling_at_least(&self, spin: Duration) -> Link<'a> {
        Link {
            spin: self.spin.max(spin),
            ..*self
        }
    }

    /// Whether this transport was aborted (here or by a peer's notice).
    pub(crate) fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Relaxed)
    }

    /// Whether every call fails from now on.
    pub(crate) fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Relaxed)
    }

    /// What a bypass call cannot see on its own path, checked while it
    /// waits (and when a notice arrived): runs the engine once (notices,
    /// abort, frames), looks for dead peers if `liveness` and it is time,
    /// and fails the call `header` as [`Core::bypass_checkup`] says.
    ///
    /// `still_missing()`: whether the call still lacks something from the
    /// peers in `awaited`. It is asked, under the engine's lock (so it must
    /// not take it), only when one of them is gone: a gone peer fails the
    /// call, and is declared the origin of the failure to every rank, only
    /// if it is still needed. A call that can get further returns `Ok`
    /// instead, and nothing is declared.
    pub(crate) fn checkup(
        &self,
        header: &Header,
        awaited: &[usize],
        liveness: bool,
        still_missing: &dyn Fn() -> bool,
    ) -> Result<()> {
        let e = self.engine;
        if self.is_aborted() {
            return Err(Error::Aborted);
        }
        let mut st = e.lock();
        st.progress();
        // As after an engine call's progress: bytes for another thread's
        // call may have been delivered.
        e.ring_if_others();
        if liveness {
            let now = Instant::now();
            if now.duration_since(st.last_liveness) >= LIVENESS_EVERY {
                st.check_liveness(now);
            }
        }
        let result = st.core.bypass_checkup(header, awaited, still_missing);
        if result.is_err() {
            // The checkup may have named the origin of a failure (a peer
            // gone while this call needs it): the launcher learns it too,
            // as from the engine's own progress.
            st.tell_launcher();
            st.flush_now();
        }
        result
    }

    /// How long a call waits before it probes the peers it waits on.
    pub(crate) fn probe_after(&self) -> Duration {
        PROBE_AFTER
    }

    /// The bypass call `header` has waited [`Link::probe_after`]: probes
    /// `peers`, which it still waits on, as an engine call would (see
    /// `desync.rs`); a peer that runs another call at that point reports
    /// the mismatch to every rank.
    pub(crate) fn probe(&self, header: &Header, peers: &[usize]) {
        let mut st = self.engine.lock();
        st.core.probe_bypass(header, peers);
        st.flush_now();
    }

    /// Fails the bypass call `header` for `fault`, telling the peer where
    /// the engine would.
    pub(crate) fn fail(&self, header: &Header, fault: Fault) -> Error {
        let mut st = self.engine.lock();
        let err = st.core.bypass_fault(header, fault);
        st.flush_now();
        err
    }
}

impl State {
    /// Writes and reads every channel as far as it goes without blocking.
    /// Returns whether any byte moved.
    pub(super) fn progress(&mut self) -> bool {
        let culprit_before = self.core.culprit();
        let mut moved = self.progress_channels();
        if !self.core.reported_lost.is_empty() {
            // A peer says a rank is gone: read what that rank sent before
            // leaving (it may complete calls here) before acting on it.
            moved |= self.progress_channels();
            self.core.apply_reported_losses();
        }
        if culprit_before.is_none() {
            self.tell_launcher();
        }
        if self.core.culprit().is_some() && culprit_before.is_none() {
            self.flush_now();
        }
        moved
    }

    fn progress_channels(&mut self) -> bool {
        let mut moved = false;
        if self.lazy.iter().any(|&l| l) {
            moved |= self.accept_peers();
        }
        for p in 0..self.chans.len() {
            if self.core.is_lost(p) {
                continue;
            }
            let Some(mut chan) = self.chans[p].take() else {
                continue;
            };
            let result = self.pump(p, chan.as_mut(), &mut moved);
            self.chans[p] = Some(chan);
            if let Err(e) = result {
                self.core.handle_lost(p, format!("rank {p}: {e}"));
            }
        }
        moved
    }

    /// Writes what is queued for `p` as far as `chan` takes it now.
    fn write(&mut self, p: usize, chan: &mut dyn Channel, moved: &mut bool) -> io::Result<()> {
        while let Some(bytes) = self.core.poll_transmit(p) {
            let n = chan.send_some(bytes)?;
            if n == 0 {
                break;
            }
            *moved = true;
            if self.core.handle_written(p, n) {
                chan.alert();
            }
        }
        Ok(())
    }

    fn pump(&mut self, p: usize, chan: &mut dyn Channel, moved: &mut bool) -> io::Result<()> {
        self.write(p, chan, moved)?;
        let core = &mut self.core;
        let direct = chan.reads_into();
        loop {
            // Straight into place where the core says the bytes may go
            // there (a copy saved), else through the channel's offer.
            let into = if direct {
                core.receive_direct(p, &mut |dst| chan.recv_into(dst))?
            } else {
                None
            };
            let n = match into {
                Some(n) => n,
                None => chan.recv_some(&mut |bytes| core.handle_bytes(p, bytes))?,
            };
            if n == 0 {
                break;
            }
            *moved = true;
        }
        chan.await_bytes(self.core.bytes_awaited(p));
        if self.read_remotes(p, &mut *chan)? {
            *moved = true;
            // Send the acknowledgements now rather than at the next turn.
            self.write(p, chan, moved)?;
        }
        Ok(())
    }

    /// Reads every matched remote message from `peer` straight from its
    /// memory into the receiving call's sink, and acknowledges each.
    fn read_remotes(&mut self, peer: usize, chan: &mut dyn Channel) -> io::Result<bool> {
        let mut moved = false;
        while let Some(r) = self.core.poll_remote_read(peer) {
            if self.bounce.len() < BOUNCE_BYTES / 8 {
                self.bounce.resize(BOUNCE_BYTES / 8, 0);
            }
            moved = true;
            let wanted = self.core.remote_read_wanted(&r);
            if wanted {
                if let Some(region) = r.region {
                    // In place, from our mapping of the sender's buffer.
                    let bytes = chan.shared_bytes(region, r.addr, r.len)?;
                    self.core.deliver_remote(&r, 0, bytes);
                } else if let Some(dst) = self.core.remote_destination(&r) {
                    // Stored unchanged: read straight into place.
                    chan.read_remote(r.addr, dst)?;
                } else {
                    let mut off = 0;
                    while off < r.len {
                        let n = (r.len - off).min(BOUNCE_BYTES);
                        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut self.bounce);
                        chan.read_remote(r.addr + off as u64, &mut bytes[..n])?;
                        self.core.deliver_remote(&r, off, &bytes[..n]);
                        off += n;
                    }
                }
            }
            self.core.remote_read_done(peer, r, wanted);
        }
        Ok(moved)
    }

    /// Writes queued frames as far as the channels take them now, without
    /// waiting and ignoring errors (used right after a fault is noticed).
    pub(super) fn flush_now(&mut self) {
        for p in 0..self.chans.len() {
            if self.core.is_lost(p) {
                continue;
            }
            let Some(mut chan) = self.chans[p].take() else {
                continue;
            };
            let _ = self.write(p, chan.as_mut(), &mut false);
            self.chans[p] = Some(chan);
        }
    }

    /// After a call failed: writes the notices it queued (a verdict, a
    /// lost rank) before the error returns, moving the channels for at most
    /// [`NOTICE_DRAIN`]. A rank that catches its error and stays alive (a
    /// training loop that logs and waits) drives nothing afterwards, so a
    /// notice left queued would reach its peers only at the rank's exit,
    /// and they would wait until their deadline.
    pub(super) fn drain_notices(&mut self) {
        self.flush_now();
        let until = Instant::now() + NOTICE_DRAIN;
        while self.core.has_queued_notice() && Instant::now() < until {
            if !self.progress() {
                std::thread::yield_now();
            }
        }
    }

    /// Appends the first failed rank, once known, to the launcher's blame
    /// file (best effort: the launcher falls back to the first rank that
    /// exited).
    pub(super) fn tell_launcher(&mut self) {
        let Some(culprit) = self.core.culprit() else {
            return;
        };
        let Some(path) = self.blame_file.take() else {
            return;
        };
        use std::io::Write;
        let line = format!("{culprit} {}\n", self.core.me);
        let _ = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
    }

    /// A call fails with `err` before it started: if a gone peer is the
    /// cause, it is the origin of the failure, and every rank is told so
    /// (see [`Core::blame`]).
    fn fail_on_lost(&mut self, err: &Error) {
        if let Error::PeerLost { rank } = *err {
            if self.core.culprit().is_none() {
                self.core.blame(rank);
                self.tell_launcher();
                self.drain_notices();
            }
        }
    }

    /// Moves every channel until nothing is queued for a live peer, for at
    /// most `within`: best effort for the last notices (abort, goodbye); a
    /// peer that stopped reading keeps its deadline and liveness checks.
    fn drain_briefly(&mut self, within: Duration) {
        let until = Instant::now() + within;
        while self.core.has_queued() && Instant::now() < until {
            if !self.progress() {
                std::thread::yield_now();
            }
        }
    }

    /// Asks every live peer's channel whether the peer still exists, and
    /// loses those that do not (at most every `LIVENESS_EVERY`; `now` is
    /// the time of this check).
    pub(super) fn check_liveness(&mut self, now: Instant) {
        self.last_liveness = now;
        for p in 0..self.chans.len() {
            if self.core.is_lost(p) {
                continue;
            }
            let Some(mut chan) = self.chans[p].take() else {
                continue;
            };
            if let Err(e) = chan.check_alive() {
                // Read what the peer wrote before it went (over shared
                // memory its last frames, such as the acknowledgement a
                // rendezvous sender here waits for and its goodbye, stay
                // in the ring after its process is gone): a call they
                // complete must not fail with the peer.
                let _ = self.pump(p, chan.as_mut(), &mut false);
                self.core.handle_lost(p, format!("rank {p}: {e}"));
            }
            self.chans[p] = Some(chan);
        }
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
                    self.install(peer, chan);
                }
                any
            }
            Err(e) => {
                let waiting: Vec<usize> = (0..self.lazy.len()).filter(|&p| self.lazy[p]).collect();
                for p in waiting {
                    self.core.handle_lost(p, e.to_string());
                }
                false
            }
        }
    }

    fn install(&mut self, peer: usize, chan: Box<dyn Channel>) {
        self.chans[peer] = Some(chan);
        self.lazy[peer] = false;
        self.core.connected(peer);
    }

    /// Connects to every lower-ranked peer in `peers` that has no
    /// connection yet (higher-ranked ones connect to us).
    fn connect_to(&mut self, me: usize, peers: impl Iterator<Item = usize>) -> Result<()> {
        for p in peers {
            if p < me && self.lazy[p] && self.chans[p].is_none() {
                let connector = self
                    .connector
                    .as_mut()
                    .expect("lazy peers have a connector");
                let chan = connector.connect(p)?;
                self.install(p, chan);
            }
        }
        Ok(())
    }
}

/// How send `s` travels over `chan` (see [`Route`]): large messages in a
/// shared buffer to a peer that maps it go as where they are; large ones
/// to a peer that reads this kind of call's messages from our memory as
/// their address (single copy, by the receiver); the rest through the
/// stream, those longer than the eager limit as rendezvous sends.
///
/// Only collectives' messages rendezvous: every rank issues a collective's
/// calls in the same order, so waiting for the receiver to reach the call
/// cannot deadlock, while point-to-point users (torch's `isend` then
/// `irecv` on both ranks, one progress worker each) count on a send
/// completing before its receive is posted.
fn route(
    config: &TransportConfig,
    chan: Option<&dyn Channel>,
    header: &Header,
    s: &Outgoing<'_>,
) -> Route {
    let collective = header.seq & Header::P2P_BIT == 0;
    let shared = (s.data.len() >= SHARED_BYTES && chan.is_some_and(|c| c.maps_shared()))
        .then(|| crate::shared::locate(s.data.as_ptr(), s.data.len()))
        .flatten();
    if let Some(at) = shared {
        return Route::Shared {
            offset: at.offset,
            region: u64::from(at.fd) << 32 | u64::from(at.generation),
        };
    }
    if s.data.len() >= config.single_copy_bytes
        && chan.is_some_and(|c| c.reads_remote(header.sig.kind, s.data.len()))
    {
        return Route::Remote;
    }
    // The test hook counts data frames only when it is set, and exists only
    // in builds with the `fault-injection` feature (the fault tests').
    #[cfg(feature = "fault-injection")]
    let flip = config.flip_frame.is_some_and(|n| {
        DATA_FRAMES_SENT.fetch_add(1, Ordering::Relaxed) + 1 == n && !s.data.is_empty()
    });
    #[cfg(not(feature = "fault-injection"))]
    let flip = false;
    Route::Stream {
        flip,
        rendezvous: collective && s.data.len() > config.eager_bytes,
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
        if let Err(err) = st.core.precheck(sends, recvs) {
            st.fail_on_lost(&err);
            return Err(err);
        }
        st.connect_to(
            self.rank,
            sends
                .iter()
                .map(|s| s.peer)
                .chain(recvs.iter().map(|r| r.peer)),
        )?;
        let st_ref = &mut *st;
        let chans = &st_ref.chans;
        let config = &self.config;
        // SAFETY: `sink` and the memory of `sends` are borrowed for this
        // whole function, and the call is retired before it returns (on
        // every path below), while the engine's mutex serialises every use.
        let id = unsafe {
            st_ref
                .core
                .add_call(header, sends, recvs, sink, start, deadline, |s| {
                    route(config, chans[s.peer].as_deref(), header, s)
                })?
        };
        // A peer that took the bypass for this call (its message came
        // before the call started, so it waits there): a mismatch.
        if let Some(bypass) = &self.bypass {
            let found = bypass.strays(&|key| key == header.key());
            if !found.is_empty() {
                st.core.handle_strays(found);
                st.flush_now();
            }
        }
        if let Err(err) = st.core.check_gone(id) {
            st.core.retire(id);
            st.fail_on_lost(&err);
            return Err(err);
        }
        self.active.fetch_add(1, Ordering::SeqCst);
        let (mut st, result) = self.drive(st, id, start);
        self.active.fetch_sub(1, Ordering::SeqCst);
        if let Err(Error::Timeout { .. }) = &result {
            st.core.note_timeout(id);
        }
        st.core.retire(id);
        if result.is_err() {
            st.drain_notices();
        }
        drop(st);
        self.ring_if_others();
        result
    }

    fn recv_any(
        &self,
        header: &Header,
        len: usize,
        sink: &mut dyn Sink,
        deadline: Instant,
    ) -> Result<usize> {
        if self.aborted.load(Ordering::SeqCst) {
            return Err(Error::Aborted);
        }
        let start = Instant::now();
        let recvs = [Incoming {
            peer: Incoming::ANY_SOURCE,
            len,
        }];
        let mut st = self.lock();
        if let Err(err) = st.core.precheck(&[], &recvs) {
            st.fail_on_lost(&err);
            return Err(err);
        }
        // Over TCP a lower rank sends only once the higher one connected:
        // any peer may be the sender.
        st.connect_to(self.rank, 0..self.size)?;
        // SAFETY: as in `exchange`: `sink` is borrowed for this whole
        // function and the call is retired before it returns.
        let id = unsafe {
            st.core
                .add_call(header, &[], &recvs, sink, start, deadline, |_| {
                    Route::Stream {
                        flip: false,
                        rendezvous: false,
                    }
                })?
        };
        self.active.fetch_add(1, Ordering::SeqCst);
        let (mut st, result) = self.drive(st, id, start);
        self.active.fetch_sub(1, Ordering::SeqCst);
        let source = st.core.source_of(id, 0);
        st.core.retire(id);
        if result.is_err() {
            st.drain_notices();
        }
        drop(st);
        self.ring_if_others();
        result.map(|()| source)
    }

    fn end_call(&self, header: &Header) -> Result<()> {
        let mut st = self.lock();
        st.core.finished(header);
        // A small call's message on the bypass, for this call or another
        // finished one: a peer took the bypass where this rank did not.
        if let Some(bypass) = &self.bypass {
            let found = bypass.strays(&|_| false);
            if !found.is_empty() {
                st.core.handle_strays(found);
                st.flush_now();
                if let Some(err) = st.core.sticky() {
                    return Err(err.clone());
                }
            }
        }
        // Anything of this call left unclaimed came from a peer that called
        // something else here.
        let result = st.core.check_unclaimed(header);
        if result.is_err() {
            st.drain_notices();
        }
        result
    }

    fn abort(&self) {
        // Peers first, this rank's own waiters after: a thread that returns
        // Aborted may end the process at once, and a notice not yet written
        // would be lost with it (a small-call waiter polls the flag without
        // the lock, so it would not wait for this one).
        let mut st = self.lock();
        st.core.abort_peers();
        st.drain_briefly(Duration::from_millis(100));
        st.core.abort_here();
        drop(st);
        self.bell.ring_local();
    }

    fn name(&self) -> &'static str {
        self.name
    }

    /// Yes when every peer's channel reads this call kind's large messages
    /// from our memory (the shared-memory single copy), and the single copy
    /// is not turned off by size.
    fn receivers_copy(&self, coll: crate::plan::Collective) -> bool {
        let kind = crate::transport::CallKind::Collective(coll);
        let st = self.lock();
        self.config.single_copy_bytes != usize::MAX
            && self.size > 1
            && st.chans.iter().enumerate().all(|(p, c)| {
                p == self.rank || c.as_ref().is_some_and(|c| c.reads_remote(kind, usize::MAX))
            })
    }

    fn positions(&self, comm: u64, ranks: &[usize], within: Duration) -> Vec<Option<String>> {
        let until = Instant::now() + within;
        let mut st = self.lock();
        st.core.probe_where(comm, ranks);
        st.flush_now();
        while !st.core.all_placed(comm, ranks) && Instant::now() < until {
            if !st.progress() {
                drop(st);
                std::thread::sleep(Duration::from_micros(500));
                st = self.lock();
            }
        }
        st.core.positions_of(comm, ranks)
    }
}

impl Drop for Engine {
    /// Says goodbye to every connected peer, so that its channel closing
    /// reads as a clean exit there rather than a crash.
    fn drop(&mut self) {
        let mut st = self.lock();
        if std::thread::panicking() {
            // Leaving because this rank failed: peers learn that it is the
            // origin, not a clean exit (which they would blame only where
            // they wait on it).
            st.core.blame_self();
            st.tell_launcher();
        }
        st.core.say_goodbye();
        st.drain_briefly(Duration::from_millis(200));
    }
}
