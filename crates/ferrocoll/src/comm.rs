//! The [`Communicator`]: a group of ranks and the collectives they call.
//!
//! Every rank of a communicator must call the same collectives in the same
//! order with matching arguments (MPI/NCCL semantics). Each call gets the
//! next sequence number; messages carry it, so calls never match messages of
//! another call, non-blocking calls may overlap blocking ones, and a rank that
//! calls something else gets [`Error::Mismatch`] instead of garbage.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::error::{Error, Result};
use crate::exec::{self, Call, Memory};
use crate::kernels;
use crate::plan::{self, Algorithm, Collective, Layout, Op, Plan, PlanRequest, Round, Span};
use crate::request::Request;
use crate::select;
use crate::topo::Topology;
use crate::transport::engine::Engine;
use crate::transport::{CallKind, Header, Signature, Transport};
use crate::types::{DType, Element, ReduceOp};

/// Most shapes remembered for `auto`'s choices and `FERROCOLL_DEBUG=tune`.
const SHAPE_CACHE_LIMIT: usize = 4096;

/// Options for the calls made through one communicator handle; see
/// [`Communicator::with_options`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CallOptions {
    /// Force this algorithm (an error for collectives that lack it); `None`
    /// follows `FERROCOLL_ALGO`, then `auto`.
    pub algorithm: Option<Algorithm>,
    /// Deadline for each wait; `None` uses the communicator's
    /// (`FERROCOLL_TIMEOUT`).
    pub timeout: Option<Duration>,
}

impl CallOptions {
    /// Options forcing `algorithm`.
    pub fn algorithm(algorithm: Algorithm) -> CallOptions {
        CallOptions {
            algorithm: Some(algorithm),
            ..CallOptions::default()
        }
    }

    /// Options forcing the algorithm named `name` (`"auto"` clears it).
    pub fn algorithm_named(name: &str) -> Result<CallOptions> {
        if name.eq_ignore_ascii_case("auto") {
            return Ok(CallOptions::default());
        }
        let algorithm = Algorithm::from_name(name).ok_or_else(|| {
            Error::invalid(format!(
                "unknown algorithm `{name}`; use auto or one of {}",
                Algorithm::ALL.map(|a| a.name()).join(", ")
            ))
        })?;
        Ok(CallOptions::algorithm(algorithm))
    }

    /// Sets the per-wait deadline.
    pub fn timeout(mut self, timeout: Duration) -> CallOptions {
        self.timeout = Some(timeout);
        self
    }
}

struct Shared {
    transport: Arc<dyn Transport>,
    /// Group rank -> transport rank.
    group: Vec<usize>,
    rank: usize,
    id: u64,
    next_seq: AtomicU64,
    splits: AtomicU64,
    config: Arc<Config>,
    topology: Topology,
    /// Scratch memory kept between calls (plans declare what they need).
    scratch: std::sync::Mutex<Vec<u64>>,
    /// Shapes already explained under `FERROCOLL_DEBUG=tune`.
    explained: std::sync::Mutex<std::collections::HashSet<(Collective, usize)>>,
    /// The model's choice per shape (`FERROCOLL_AUTO=model`).
    chosen: std::sync::Mutex<std::collections::HashMap<(Collective, usize), Algorithm>>,
    /// The cost-model profile, read once.
    profile: std::sync::OnceLock<crate::cost::Profile>,
    /// Where the ranks are (communicators made by [`crate::init()`]).
    placement: Option<Arc<crate::init::Placement>>,
    /// The transport again, when it has a shared-memory fast path (see
    /// [`crate::fast`]), for this communicator and the ones split from it.
    engine: Option<Arc<Engine>>,
    /// The fast path reaches every rank of the group.
    fast: bool,
    /// Collectives that may take the fast path: those it implements whose
    /// algorithm `FERROCOLL_ALGO` does not force (bit i: `Collective::ALL[i]`).
    fast_colls: u16,
}

/// Bit of `coll` in [`Shared::fast_colls`].
fn coll_bit(coll: Collective) -> u16 {
    let i = Collective::ALL
        .iter()
        .position(|c| *c == coll)
        .expect("every collective is in ALL");
    1 << i
}

/// The collectives of [`Shared::fast_colls`] under `config`.
fn fast_colls(config: &Config) -> u16 {
    Collective::ALL
        .iter()
        .filter(|&&c| crate::fast::handles(c) && config.algorithms.get(c).is_none())
        .fold(0, |mask, &c| mask | coll_bit(c))
}

/// A group of ranks that call collectives together.
///
/// Cloning gives another handle on the same communicator (same sequence of
/// calls); [`Communicator::with_options`] gives one with different per-call
/// options.
#[derive(Clone)]
pub struct Communicator {
    shared: Arc<Shared>,
    options: CallOptions,
    /// Set on the handle a non-blocking call runs on: the sequence number
    /// reserved when the call was issued.
    reserved_seq: Option<u64>,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.rank())
            .field("size", &self.size())
            .field("transport", &self.shared.transport.name())
            .finish()
    }
}

/// Everything that describes one collective call.
struct Spec {
    coll: Collective,
    dtype: DType,
    op: Option<ReduceOp>,
    count: usize,
    root: usize,
    send_counts: Vec<usize>,
    recv_counts: Vec<usize>,
    in_place: bool,
}

impl Spec {
    fn new(coll: Collective, dtype: DType, count: usize) -> Spec {
        Spec {
            coll,
            dtype,
            op: None,
            count,
            root: 0,
            send_counts: Vec::new(),
            recv_counts: Vec::new(),
            in_place: false,
        }
    }
    fn op(mut self, op: ReduceOp) -> Spec {
        self.op = Some(op);
        self
    }
    fn root(mut self, root: usize) -> Spec {
        self.root = root;
        self
    }
    fn in_place(mut self) -> Spec {
        self.in_place = true;
        self
    }
    fn signature(&self) -> Signature {
        Signature {
            kind: CallKind::Collective(self.coll),
            dtype: self.dtype,
            op: self.op,
            count: self.count,
            root: self.coll.has_root().then_some(self.root),
        }
    }
}

fn bytes_mut<T: Element>(s: &mut [T]) -> &mut [u8] {
    bytemuck::cast_slice_mut(s)
}

fn len_error(call: &str, what: &str, got: usize, want: usize, why: &str) -> Error {
    Error::invalid(format!(
        "{call}: {what} has {got} elements but must have {want} ({why})"
    ))
}

impl Communicator {
    /// A communicator over every rank of `transport`, with the topology of
    /// `config` (flat if it has none). Fails if that topology does not have
    /// the transport's number of ranks.
    pub fn new(transport: Arc<dyn Transport>, config: Config) -> Result<Communicator> {
        let size = transport.size();
        let rank = transport.rank();
        let topology = config
            .topology
            .clone()
            .unwrap_or_else(|| Topology::flat(size));
        topology.check_size(size)?;
        Ok(Communicator {
            shared: Arc::new(Shared {
                topology,
                transport,
                group: (0..size).collect(),
                rank,
                id: 0,
                next_seq: AtomicU64::new(0),
                splits: AtomicU64::new(0),
                fast_colls: fast_colls(&config),
                config: Arc::new(config),
                scratch: Default::default(),
                explained: Default::default(),
                chosen: Default::default(),
                profile: Default::default(),
                placement: None,
                engine: None,
                fast: false,
            }),
            options: CallOptions::default(),
            reserved_seq: None,
        })
    }

    /// [`Communicator::new`] for a job [`crate::init()`] has placed, over
    /// `engine`.
    pub(crate) fn with_placement(
        engine: Arc<Engine>,
        config: Config,
        placement: crate::init::Placement,
    ) -> Result<Communicator> {
        let transport: Arc<dyn Transport> = Arc::clone(&engine) as Arc<dyn Transport>;
        let mut comm = Communicator::new(transport, config)?;
        let shared = Arc::get_mut(&mut comm.shared).expect("a new communicator has one handle");
        shared.placement = Some(Arc::new(placement));
        shared.fast = engine.fast_path().is_some_and(|f| f.serves(&shared.group));
        shared.engine = engine.fast_path().is_some().then_some(engine);
        Ok(comm)
    }

    /// Where the world's ranks run and how this rank reaches each (set by
    /// [`crate::init()`]; `None` for in-process ranks and split groups).
    pub fn placement(&self) -> Option<&crate::init::Placement> {
        self.shared.placement.as_deref()
    }

    /// How this group's ranks nest into nodes.
    pub fn topology(&self) -> &Topology {
        &self.shared.topology
    }

    /// This rank, `0..size()`.
    pub fn rank(&self) -> usize {
        self.shared.rank
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.shared.group.len()
    }

    /// Name of the transport underneath (`thread`, ...).
    pub fn transport_name(&self) -> &'static str {
        self.shared.transport.name()
    }

    /// The configuration this communicator runs with.
    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    /// A handle on the same communicator whose calls use `options`.
    ///
    /// ```
    /// # use ferrocoll::{local, CallOptions, Algorithm, ReduceOp};
    /// local::run(3, |comm| {
    ///     let ring = comm.with_options(CallOptions::algorithm(Algorithm::Ring));
    ///     let mut v = vec![1.0f32; 10];
    ///     ring.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
    ///     assert_eq!(v, vec![3.0; 10]);
    /// }).unwrap();
    /// ```
    pub fn with_options(&self, options: CallOptions) -> Communicator {
        Communicator {
            options,
            ..self.clone()
        }
    }

    /// Makes every pending and future wait on this communicator's transport
    /// (on every rank that shares it) fail with [`Error::Aborted`]. Callable
    /// from any thread.
    pub fn abort(&self) {
        self.shared.transport.abort();
    }

    /// The algorithm a collective of `bytes` would use, and why.
    ///
    /// `bytes` is the size of the call as nccl-tests counts it, which every
    /// rank agrees on (so every rank chooses alike): the buffer for allreduce,
    /// broadcast and reduce; all `size()` blocks for allgather, reducescatter,
    /// alltoall, gather and scatter; 0 for alltoallv (whose sizes differ per
    /// rank) and barrier. [`Communicator::call_bytes`] computes it.
    pub fn choose(&self, coll: Collective, bytes: usize) -> Result<(Algorithm, String)> {
        if let Some(a) = self.options.algorithm {
            let a = a
                .for_collective(coll)
                .ok_or_else(|| plan::unknown_algorithm(coll, a.name()))?;
            return Ok((a, "forced by call options".into()));
        }
        if let Some(a) = self.shared.config.algorithms.get(coll) {
            return Ok((a, "forced by FERROCOLL_ALGO".into()));
        }
        if self.shared.config.auto_model && coll != Collective::AllToAllV {
            if let Some(a) = self.model_choice(coll, bytes) {
                return Ok((a, "auto: least predicted time (cost model)".into()));
            }
        }
        let (a, why) = select::auto(coll, bytes, self.size());
        Ok((a, format!("auto: {why}")))
    }

    /// The cheapest algorithm for `bytes` on this communicator's profile and
    /// topology, cached per shape.
    fn model_choice(&self, coll: Collective, bytes: usize) -> Option<Algorithm> {
        if let Some(&a) = self.shared.chosen.lock().ok()?.get(&(coll, bytes)) {
            return Some(a);
        }
        // The choice depends on bytes, not on the element type: model bytes
        // as one-byte elements.
        let blocks = self.call_bytes(coll, 1, DType::U8).max(1);
        let mut shape = crate::cost::Shape::new(coll, self.size(), bytes / blocks, 1);
        shape.topology = self.shared.topology.clone();
        let best = crate::cost::candidates(&shape, &self.profile()).first()?.0;
        let mut chosen = self.shared.chosen.lock().ok()?;
        // Bounded: a program with ever-new sizes must not grow it forever.
        if chosen.len() >= SHAPE_CACHE_LIMIT {
            chosen.clear();
        }
        chosen.insert((coll, bytes), best);
        Some(best)
    }

    /// The cost-model parameters this communicator predicts with: the
    /// configured profile, else a calibrated file at
    /// [`crate::cost::Profile::default_path`] for this transport, else the
    /// transport's built-in one.
    pub fn profile(&self) -> crate::cost::Profile {
        self.shared
            .profile
            .get_or_init(|| {
                if let Some(p) = &self.shared.config.profile {
                    return p.clone();
                }
                crate::cost::Profile::default_path(self.transport_name())
                    .and_then(|path| crate::cost::Profile::load(&path).ok())
                    .unwrap_or_else(crate::cost::Profile::thread_default)
            })
            .clone()
    }

    /// The algorithm a call of `count` elements of `dtype` would use and its
    /// predicted cost on [`Communicator::profile`] (`None` if the cost model
    /// has no closed form for it).
    pub fn predict(
        &self,
        coll: Collective,
        count: usize,
        dtype: DType,
    ) -> Result<(Algorithm, Option<crate::cost::Cost>)> {
        let (algo, _) = self.choose(coll, self.call_bytes(coll, count, dtype))?;
        if coll == Collective::AllToAllV {
            // Its cost depends on every pair's counts, which no rank knows.
            return Ok((algo, None));
        }
        let mut shape = crate::cost::Shape::new(coll, self.size(), count, dtype.size());
        shape.topology = self.shared.topology.clone();
        Ok((algo, crate::cost::predict(algo, &shape, &self.profile())))
    }

    /// Prints the cost model's table for a shape the first time it is seen
    /// (`FERROCOLL_DEBUG=tune`).
    fn explain(&self, coll: Collective, count: usize, dtype: DType, bytes: usize) {
        let first = self
            .shared
            .explained
            .lock()
            .map(|mut seen| seen.len() < SHAPE_CACHE_LIMIT && seen.insert((coll, bytes)))
            .unwrap_or(false);
        if !first || coll == Collective::AllToAllV {
            return;
        }
        let mut shape = crate::cost::Shape::new(coll, self.size(), count, dtype.size());
        shape.topology = self.shared.topology.clone();
        let ranked = crate::cost::candidates(&shape, &self.profile());
        let mut text = format!(
            "ferrocoll tune: {coll} {bytes} B on {} ranks, predicted (us):",
            self.size()
        );
        for (a, c) in &ranked {
            text.push_str(&format!(
                "\n  {:<18} {:>10.2} = latency {:.2} + bandwidth {:.2} + compute {:.2}",
                a.name(),
                c.total() * 1e6,
                c.latency * 1e6,
                c.bandwidth * 1e6,
                c.compute * 1e6
            ));
        }
        if let [(w, wc), (r, rc), ..] = ranked.as_slice() {
            text.push_str(&format!(
                "\n  model's winner {w}, runner-up {r} ({:.2}x)",
                rc.total() / wc.total().max(f64::MIN_POSITIVE)
            ));
        }
        eprintln!("{text}");
    }

    /// The size in bytes that algorithm choice looks at (see
    /// [`Communicator::choose`]) for a call of `count` elements of `dtype`
    /// (the per-rank block for the block collectives).
    pub fn call_bytes(&self, coll: Collective, count: usize, dtype: DType) -> usize {
        let blocks = match coll {
            Collective::AllReduce | Collective::Broadcast | Collective::Reduce => 1,
            Collective::AllGather
            | Collective::ReduceScatter
            | Collective::AllToAll
            | Collective::Gather
            | Collective::Scatter => self.size(),
            Collective::AllToAllV | Collective::Barrier => 0,
        };
        blocks * count * dtype.size()
    }

    /// Whether a call of `count` elements of `dtype` (the per-rank block for
    /// the block collectives) runs on the shared-memory fast path rather
    /// than an algorithm's plan: every rank of this communicator is on one
    /// host with shared memory (`FERROCOLL_SHM_FAST` not `off`, checksums
    /// off), the group has 2 to 16 ranks, the collective is an allreduce,
    /// broadcast, reduce, allgather or barrier moving at most 96 bytes per
    /// rank, and no algorithm is forced for it.
    pub fn uses_fast_path(&self, coll: Collective, count: usize, dtype: DType) -> bool {
        self.fast_engine(coll, count, dtype).is_some()
    }

    /// The engine to run a call on the fast path with, if it qualifies.
    fn fast_engine(&self, coll: Collective, count: usize, dtype: DType) -> Option<&Engine> {
        let engine = self.shared.engine.as_deref()?;
        let qualifies = self.shared.fast
            && self.options.algorithm.is_none()
            && self.shared.fast_colls & coll_bit(coll) != 0
            && crate::fast::eligible(coll, count, dtype, self.size());
        qualifies.then_some(engine)
    }

    /// Runs a small call on the fast path.
    fn run_fast(&self, engine: &Engine, spec: &Spec, mem: &mut Memory<'_>) -> Result<()> {
        let seq = self.next_seq();
        if self.shared.config.debug && self.rank() == 0 {
            eprintln!(
                "ferrocoll: {} #{seq} {} B on {} ranks -> shared-memory fast path",
                spec.coll,
                self.call_bytes(spec.coll, spec.count, spec.dtype),
                self.size()
            );
        }
        let call = crate::fast::Small {
            engine,
            group: &self.shared.group,
            rank: self.rank(),
            coll: spec.coll,
            dtype: spec.dtype,
            op: spec.op.unwrap_or(ReduceOp::Sum),
            root: spec.root,
            count: spec.count,
            header: Header {
                comm: self.shared.id,
                seq,
                sig: spec.signature(),
            },
            timeout: self.options.timeout.unwrap_or(self.shared.config.timeout),
        };
        crate::fast::run(&call, mem).map_err(|e| self.group_error(e))
    }

    fn next_seq(&self) -> u64 {
        self.reserved_seq
            .unwrap_or_else(|| self.shared.next_seq.fetch_add(1, Ordering::Relaxed))
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.options.timeout.unwrap_or(self.shared.config.timeout)
    }

    /// Rewrites transport (world) ranks in an error into this group's ranks.
    fn group_error(&self, err: Error) -> Error {
        let g = |w: usize| self.shared.group.iter().position(|&x| x == w).unwrap_or(w);
        match err {
            Error::Timeout {
                collective,
                seq,
                rank,
                peer,
                waited,
            } => Error::Timeout {
                collective,
                seq,
                rank: g(rank),
                peer: g(peer),
                waited,
            },
            Error::Mismatch {
                rank,
                local,
                peer,
                remote,
            } => Error::Mismatch {
                rank: g(rank),
                local,
                peer: g(peer),
                remote,
            },
            Error::PeerLost { rank } => Error::PeerLost { rank: g(rank) },
            other => other,
        }
    }

    /// Plans and runs one collective on `mem`, which holds the lengths the
    /// spec implies, laid out as `Layout::in_place` says when in place.
    fn run(&self, spec: Spec, mut mem: Memory<'_>) -> Result<()> {
        if let Some(engine) = self.fast_engine(spec.coll, spec.count, spec.dtype) {
            return self.run_fast(engine, &spec, &mut mem);
        }
        let seq = self.next_seq();
        let elem = spec.dtype.size();
        // Every rank must choose alike, so the choice looks only at what every
        // rank agrees on (not, say, the root's larger gather buffer).
        let bytes = self.call_bytes(spec.coll, spec.count, spec.dtype);
        let (algo, why) = self.choose(spec.coll, bytes)?;
        if self.shared.config.debug && self.rank() == 0 {
            eprintln!(
                "ferrocoll: {} #{seq} {bytes} B on {} ranks -> {algo} ({why})",
                spec.coll,
                self.size()
            );
            if self.shared.config.debug_tune {
                self.explain(spec.coll, spec.count, spec.dtype, bytes);
            }
        }
        let req = PlanRequest {
            collective: spec.coll,
            n: self.size(),
            rank: self.rank(),
            count: spec.count,
            root: spec.root,
            elem_size: elem,
            send_counts: spec.send_counts.clone(),
            recv_counts: spec.recv_counts.clone(),
            topology: self.shared.topology.clone(),
        };
        let layout = if spec.in_place {
            Layout::in_place(&req).expect("in-place form exists")
        } else {
            Layout::OUT_OF_PLACE
        };
        let sig = spec.signature();
        let op = spec.op.unwrap_or(ReduceOp::Sum);
        // Elementwise collectives of many bytes run as consecutive slices,
        // each a whole collective on a cache-sized piece (see
        // `exec::slices`); everything else runs as one plan.
        let mut planned: Option<(usize, Plan)> = None;
        for (offset, len) in
            exec::slices(spec.coll, spec.count, elem, self.shared.config.slice_bytes)
        {
            if planned.as_ref().map(|(l, _)| *l) != Some(len) {
                let req = PlanRequest {
                    count: len,
                    ..req.clone()
                };
                let plan = plan::build(algo, &req)?;
                if cfg!(debug_assertions) {
                    plan::validate(&plan, &req, layout).map_err(|e| {
                        Error::Internal(format!("{algo} plan for {}: {e}", spec.coll))
                    })?;
                }
                planned = Some((len, plan));
            }
            let (_, plan) = planned.as_ref().expect("planned above");
            if len == spec.count {
                // One slice: the whole call, whatever its buffers' shapes.
                self.execute(plan, &mut mem, &sig, seq, op)?;
            } else {
                let mut piece = mem.slice(offset * elem, len * elem);
                self.execute(plan, &mut piece, &sig, seq, op)?;
            }
        }
        let header = Header {
            comm: self.shared.id,
            seq,
            sig,
        };
        self.shared
            .transport
            .end_call(&header)
            .map_err(|e| self.group_error(e))
    }

    /// Runs a plan under a header.
    fn execute(
        &self,
        plan: &Plan,
        mem: &mut Memory<'_>,
        sig: &Signature,
        seq: u64,
        op: ReduceOp,
    ) -> Result<()> {
        let call = Call {
            transport: &*self.shared.transport,
            group: &self.shared.group,
            header: Header {
                comm: self.shared.id,
                seq,
                sig: *sig,
            },
            dtype: sig.dtype,
            op,
            deadline: self.deadline(),
        };
        // Reuse the communicator's scratch memory; a call running alongside
        // (non-blocking) finds it taken and uses a fresh buffer.
        let mut scratch = self
            .shared
            .scratch
            .try_lock()
            .map(|mut s| std::mem::take(&mut *s))
            .unwrap_or_default();
        let result = exec::execute(plan, mem, &call, &mut scratch);
        if let Ok(mut slot) = self.shared.scratch.try_lock() {
            if slot.len() < scratch.len() {
                *slot = scratch;
            }
        }
        result.map_err(|e| self.group_error(e))
    }

    fn check_root(&self, call: &str, root: usize) -> Result<()> {
        if root >= self.size() {
            return Err(Error::invalid(format!(
                "{call}: root {root} is not a rank of this communicator; use 0..{}",
                self.size()
            )));
        }
        Ok(())
    }

    /// Divides the result of an `Avg` reduction by the group size.
    fn finish_avg<T: Element>(&self, op: ReduceOp, result: &mut [T]) {
        if op == ReduceOp::Avg {
            kernels::divide(T::DTYPE, bytes_mut(result), self.size());
        }
    }

    // ---- allreduce -------------------------------------------------------

    /// Every rank gets `op` over every rank's `send`, in `recv`.
    /// `send` and `recv` must have the same length on every rank.
    pub fn all_reduce<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        if recv.len() != send.len() {
            return Err(len_error(
                "all_reduce",
                "recv",
                recv.len(),
                send.len(),
                "the length of send",
            ));
        }
        let spec = Spec::new(Collective::AllReduce, T::DTYPE, send.len()).op(op);
        self.run(spec, Memory::separate(send, recv))?;
        self.finish_avg(op, recv);
        Ok(())
    }

    /// In-place allreduce: `buf` is replaced by `op` over every rank's `buf`.
    pub fn all_reduce_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let spec = Spec::new(Collective::AllReduce, T::DTYPE, buf.len())
            .op(op)
            .in_place();
        let len = buf.len();
        self.run(spec, Memory::in_place(buf, 0..len, 0..len))?;
        self.finish_avg(op, buf);
        Ok(())
    }

    // ---- broadcast -------------------------------------------------------

    /// Copies the root's `send` into every rank's `recv`. `send` is read only
    /// on the root (other ranks may pass an empty slice); `recv` must have the
    /// same length on every rank.
    pub fn broadcast<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        self.check_root("broadcast", root)?;
        let count = recv.len();
        if self.rank() == root && send.len() != count {
            return Err(len_error(
                "broadcast",
                "send on the root",
                send.len(),
                count,
                "the length of recv",
            ));
        }
        // Non-roots' plans never read the input: it is empty for them.
        let send = root_only(self.rank() == root, send);
        let spec = Spec::new(Collective::Broadcast, T::DTYPE, count).root(root);
        self.run(spec, Memory::separate(send, recv))
    }

    /// In-place broadcast: every rank's `buf` becomes the root's `buf`.
    pub fn broadcast_in_place<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        self.check_root("broadcast_in_place", root)?;
        let spec = Spec::new(Collective::Broadcast, T::DTYPE, buf.len())
            .root(root)
            .in_place();
        let len = buf.len();
        self.run(spec, Memory::in_place(buf, 0..len, 0..len))
    }

    // ---- reduce ------------------------------------------------------------

    /// The root gets `op` over every rank's `send` in `recv`. `recv` is used
    /// only on the root (others may pass an empty slice) and must there have
    /// the length of `send`.
    pub fn reduce<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        self.check_root("reduce", root)?;
        let is_root = self.rank() == root;
        if is_root && recv.len() != send.len() {
            return Err(len_error(
                "reduce",
                "recv on the root",
                recv.len(),
                send.len(),
                "the length of send",
            ));
        }
        let spec = Spec::new(Collective::Reduce, T::DTYPE, send.len())
            .op(op)
            .root(root);
        // Non-roots' plans never touch the output: it is empty for them.
        self.run(spec, Memory::separate(send, root_only_mut(is_root, recv)))?;
        if is_root {
            self.finish_avg(op, recv);
        }
        Ok(())
    }

    /// In-place reduce: the root's `buf` becomes `op` over every rank's
    /// `buf`; other ranks' `buf` is left unchanged.
    pub fn reduce_in_place<T: Element>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        self.check_root("reduce_in_place", root)?;
        let is_root = self.rank() == root;
        let spec = Spec::new(Collective::Reduce, T::DTYPE, buf.len())
            .op(op)
            .root(root)
            .in_place();
        // Other ranks' plans never write the output: it is empty for them.
        let (len, out) = (buf.len(), if is_root { buf.len() } else { 0 });
        self.run(spec, Memory::in_place(buf, 0..len, 0..out))?;
        if is_root {
            self.finish_avg(op, buf);
        }
        Ok(())
    }

    // ---- allgather -------------------------------------------------------

    /// Every rank gets every rank's `send`, concatenated in rank order, in
    /// `recv` (`size()` times the length of `send`).
    pub fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let n = self.size();
        if recv.len() != n * send.len() {
            return Err(len_error(
                "all_gather",
                "recv",
                recv.len(),
                n * send.len(),
                "size() times the length of send",
            ));
        }
        let spec = Spec::new(Collective::AllGather, T::DTYPE, send.len());
        self.run(spec, Memory::separate(send, recv))
    }

    /// In-place allgather: `buf` holds `size()` blocks; this rank's block
    /// (block `rank()`) is its contribution, and on return every block is
    /// filled.
    pub fn all_gather_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        let n = self.size();
        if buf.len() % n != 0 {
            return Err(Error::invalid(format!(
                "all_gather_in_place: buf has {} elements, not a multiple of size() = {n}",
                buf.len()
            )));
        }
        let c = buf.len() / n;
        let spec = Spec::new(Collective::AllGather, T::DTYPE, c).in_place();
        let r = self.rank();
        let len = buf.len();
        self.run(spec, Memory::in_place(buf, r * c..(r + 1) * c, 0..len))
    }

    // ---- reduce-scatter ----------------------------------------------------

    /// Rank r gets block r of `op` over every rank's `send`: `send` holds
    /// `size()` blocks of the length of `recv`.
    pub fn reduce_scatter<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        let n = self.size();
        if send.len() != n * recv.len() {
            return Err(len_error(
                "reduce_scatter",
                "send",
                send.len(),
                n * recv.len(),
                "size() times the length of recv",
            ));
        }
        let spec = Spec::new(Collective::ReduceScatter, T::DTYPE, recv.len()).op(op);
        self.run(spec, Memory::separate(send, recv))?;
        self.finish_avg(op, recv);
        Ok(())
    }

    /// In-place reduce-scatter: `buf` holds `size()` blocks; on return block
    /// `rank()` holds the reduced block (the rest of `buf` is unspecified).
    pub fn reduce_scatter_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let n = self.size();
        if buf.len() % n != 0 {
            return Err(Error::invalid(format!(
                "reduce_scatter_in_place: buf has {} elements, not a multiple of size() = {n}",
                buf.len()
            )));
        }
        let c = buf.len() / n;
        let r = self.rank();
        let spec = Spec::new(Collective::ReduceScatter, T::DTYPE, c)
            .op(op)
            .in_place();
        let len = buf.len();
        self.run(spec, Memory::in_place(buf, 0..len, r * c..(r + 1) * c))?;
        self.finish_avg(op, &mut buf[r * c..(r + 1) * c]);
        Ok(())
    }

    // ---- all-to-all --------------------------------------------------------

    /// Rank r sends block p of `send` to rank p and receives rank p's block r
    /// into block p of `recv`. Both hold `size()` equal blocks.
    pub fn all_to_all<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let n = self.size();
        if send.len() % n != 0 {
            return Err(Error::invalid(format!(
                "all_to_all: send has {} elements, not a multiple of size() = {n}",
                send.len()
            )));
        }
        if recv.len() != send.len() {
            return Err(len_error(
                "all_to_all",
                "recv",
                recv.len(),
                send.len(),
                "the length of send",
            ));
        }
        let spec = Spec::new(Collective::AllToAll, T::DTYPE, send.len() / n);
        self.run(spec, Memory::separate(send, recv))
    }

    /// All-to-all with per-peer counts: `send` holds `send_counts[p]`
    /// elements for each rank p, packed in rank order; `recv` receives
    /// `recv_counts[p]` elements from each rank p, packed in rank order.
    /// Rank p's `send_counts[r]` must equal rank r's `recv_counts[p]`.
    pub fn all_to_all_v<T: Element>(
        &self,
        send: &[T],
        send_counts: &[usize],
        recv: &mut [T],
        recv_counts: &[usize],
    ) -> Result<()> {
        let n = self.size();
        let r = self.rank();
        for (name, counts) in [("send_counts", send_counts), ("recv_counts", recv_counts)] {
            if counts.len() != n {
                return Err(Error::invalid(format!(
                    "all_to_all_v: {name} has {} entries but needs one per rank ({n})",
                    counts.len()
                )));
            }
        }
        let (s_total, r_total): (usize, usize) =
            (send_counts.iter().sum(), recv_counts.iter().sum());
        if send.len() != s_total {
            return Err(len_error(
                "all_to_all_v",
                "send",
                send.len(),
                s_total,
                "the sum of send_counts",
            ));
        }
        if recv.len() != r_total {
            return Err(len_error(
                "all_to_all_v",
                "recv",
                recv.len(),
                r_total,
                "the sum of recv_counts",
            ));
        }
        if send_counts[r] != recv_counts[r] {
            return Err(Error::invalid(format!(
                "all_to_all_v: send_counts[{r}] = {} but recv_counts[{r}] = {}; what rank {r} sends itself must equal what it receives from itself",
                send_counts[r], recv_counts[r]
            )));
        }
        let mut spec = Spec::new(Collective::AllToAllV, T::DTYPE, 0);
        spec.send_counts = send_counts.to_vec();
        spec.recv_counts = recv_counts.to_vec();
        self.run(spec, Memory::separate(send, recv))
    }

    // ---- gather / scatter ------------------------------------------------

    /// The root gets every rank's `send`, concatenated in rank order, in
    /// `recv` (`size()` times the length of `send`; ignored elsewhere).
    pub fn gather<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        self.check_root("gather", root)?;
        let n = self.size();
        let is_root = self.rank() == root;
        if is_root && recv.len() != n * send.len() {
            return Err(len_error(
                "gather",
                "recv on the root",
                recv.len(),
                n * send.len(),
                "size() times the length of send",
            ));
        }
        let spec = Spec::new(Collective::Gather, T::DTYPE, send.len()).root(root);
        // Non-roots never touch the output: it is empty for them.
        self.run(spec, Memory::separate(send, root_only_mut(is_root, recv)))
    }

    /// Rank r gets block r of the root's `send` (`size()` blocks of the
    /// length of `recv`; ignored elsewhere) in `recv`.
    pub fn scatter<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        self.check_root("scatter", root)?;
        let n = self.size();
        let is_root = self.rank() == root;
        if is_root && send.len() != n * recv.len() {
            return Err(len_error(
                "scatter",
                "send on the root",
                send.len(),
                n * recv.len(),
                "size() times the length of recv",
            ));
        }
        let spec = Spec::new(Collective::Scatter, T::DTYPE, recv.len()).root(root);
        // Non-roots never read the input: it is empty for them.
        self.run(spec, Memory::separate(root_only(is_root, send), recv))
    }

    // ---- barrier -------------------------------------------------------------

    /// Returns once every rank has entered the barrier.
    pub fn barrier(&self) -> Result<()> {
        let spec = Spec::new(Collective::Barrier, DType::U8, 0);
        self.run(spec, Memory::none())
    }

    // ---- point to point --------------------------------------------------

    fn p2p_header_sig<T: Element>(
        &self,
        call: &str,
        peer: usize,
        tag: u32,
        len: usize,
    ) -> Result<(u64, Signature)> {
        if peer >= self.size() {
            return Err(Error::invalid(format!(
                "{call}: peer {peer} is not a rank of this communicator; use 0..{}",
                self.size()
            )));
        }
        if peer == self.rank() {
            return Err(Error::invalid(format!(
                "{call}: rank {peer} cannot {call} to itself (it would wait for itself); copy the data instead"
            )));
        }
        let sig = Signature {
            kind: CallKind::PointToPoint,
            dtype: T::DTYPE,
            op: None,
            count: len,
            root: None,
        };
        Ok((Header::P2P_BIT | u64::from(tag), sig))
    }

    /// Sends `data` to `peer` with `tag`; returns once the receiver has taken
    /// it (synchronous send: the matching `recv` must be posted). Messages
    /// with the same peer and tag arrive in order. The receiver must expect
    /// exactly `data.len()` elements of the same type.
    pub fn send<T: Element>(&self, data: &[T], peer: usize, tag: u32) -> Result<()> {
        let (seq, sig) = self.p2p_header_sig::<T>("send", peer, tag, data.len())?;
        let plan = single_op_plan(Op::Send {
            peer,
            src: Span::input(0, data.len()),
        });
        self.execute(
            &plan,
            &mut Memory::input_only(data),
            &sig,
            seq,
            ReduceOp::Sum,
        )
    }

    /// Receives exactly `buf.len()` elements from `peer` with `tag`.
    pub fn recv<T: Element>(&self, buf: &mut [T], peer: usize, tag: u32) -> Result<()> {
        let (seq, sig) = self.p2p_header_sig::<T>("recv", peer, tag, buf.len())?;
        let plan = single_op_plan(Op::Recv {
            peer,
            dst: Span::output(0, buf.len()),
        });
        self.execute(
            &plan,
            &mut Memory::output_only(buf),
            &sig,
            seq,
            ReduceOp::Sum,
        )
    }

    // ---- split -----------------------------------------------------------

    /// Splits the communicator (MPI_Comm_split): ranks passing the same
    /// `Some(color)` form a new communicator, ordered by `key` then by rank
    /// here; ranks passing `None` get `None`. Every rank must call it.
    pub fn split(&self, color: Option<u32>, key: i64) -> Result<Option<Communicator>> {
        let mine = [color.map_or(-1, i64::from), key];
        let mut all = vec![0i64; 2 * self.size()];
        self.all_gather(&mine, &mut all)?;
        let split_no = self.shared.splits.fetch_add(1, Ordering::Relaxed);
        let Some(color) = color else {
            return Ok(None);
        };
        let mut members: Vec<(i64, usize)> = (0..self.size())
            .filter(|&r| all[2 * r] == i64::from(color))
            .map(|r| (all[2 * r + 1], r))
            .collect();
        members.sort_unstable();
        let rank = members
            .iter()
            .position(|&(_, r)| r == self.rank())
            .expect("this rank has this color");
        let group: Vec<usize> = members.iter().map(|&(_, r)| self.shared.group[r]).collect();
        let in_parent: Vec<usize> = members.iter().map(|&(_, r)| r).collect();
        let topology = self.shared.topology.subgroup(&in_parent);
        let id = mix(mix(self.shared.id ^ 0x9e37_79b9_7f4a_7c15) ^ split_no) ^ u64::from(color);
        let fast = self
            .shared
            .engine
            .as_ref()
            .and_then(|e| e.fast_path())
            .is_some_and(|f| f.serves(&group));
        Ok(Some(Communicator {
            shared: Arc::new(Shared {
                transport: Arc::clone(&self.shared.transport),
                group,
                rank,
                id: mix(id),
                next_seq: AtomicU64::new(0),
                splits: AtomicU64::new(0),
                config: Arc::clone(&self.shared.config),
                topology,
                scratch: Default::default(),
                explained: Default::default(),
                chosen: Default::default(),
                profile: Default::default(),
                placement: None,
                engine: self.shared.engine.clone(),
                fast,
                fast_colls: self.shared.fast_colls,
            }),
            options: self.options.clone(),
            reserved_seq: None,
        }))
    }

    // ---- non-blocking forms ------------------------------------------------

    /// Reserves the next sequence number now (so calls keep issue order) and
    /// runs `f` on a background thread with a handle bound to it.
    fn start<R, F>(&self, f: F) -> Request<R>
    where
        R: Send + 'static,
        F: FnOnce(&Communicator) -> Result<R> + Send + 'static,
    {
        let mut handle = self.clone();
        handle.reserved_seq = Some(self.next_seq());
        Request::spawn(move || f(&handle))
    }

    /// Non-blocking [`Communicator::all_reduce_in_place`]; the buffer comes
    /// back from [`Request::wait`].
    pub fn iall_reduce<T: Element>(&self, mut buf: Vec<T>, op: ReduceOp) -> Request<Vec<T>> {
        self.start(move |c| c.all_reduce_in_place(&mut buf, op).map(|_| buf))
    }

    /// Non-blocking [`Communicator::broadcast_in_place`].
    pub fn ibroadcast<T: Element>(&self, mut buf: Vec<T>, root: usize) -> Request<Vec<T>> {
        self.start(move |c| c.broadcast_in_place(&mut buf, root).map(|_| buf))
    }

    /// Non-blocking [`Communicator::reduce_in_place`].
    pub fn ireduce<T: Element>(
        &self,
        mut buf: Vec<T>,
        op: ReduceOp,
        root: usize,
    ) -> Request<Vec<T>> {
        self.start(move |c| c.reduce_in_place(&mut buf, op, root).map(|_| buf))
    }

    /// Non-blocking [`Communicator::all_gather`]; returns the gathered buffer.
    pub fn iall_gather<T: Element>(&self, send: Vec<T>) -> Request<Vec<T>> {
        self.start(move |c| {
            let mut recv = vec![T::zeroed(); send.len() * c.size()];
            c.all_gather(&send, &mut recv).map(|_| recv)
        })
    }

    /// Non-blocking [`Communicator::reduce_scatter`]; returns this rank's
    /// reduced block.
    pub fn ireduce_scatter<T: Element>(&self, send: Vec<T>, op: ReduceOp) -> Request<Vec<T>> {
        self.start(move |c| {
            let mut recv = vec![T::zeroed(); send.len() / c.size()];
            c.reduce_scatter(&send, &mut recv, op).map(|_| recv)
        })
    }

    /// Non-blocking [`Communicator::all_to_all`]; returns the received blocks.
    pub fn iall_to_all<T: Element>(&self, send: Vec<T>) -> Request<Vec<T>> {
        self.start(move |c| {
            let mut recv = vec![T::zeroed(); send.len()];
            c.all_to_all(&send, &mut recv).map(|_| recv)
        })
    }

    /// Non-blocking [`Communicator::all_to_all_v`]; returns the received data.
    pub fn iall_to_all_v<T: Element>(
        &self,
        send: Vec<T>,
        send_counts: Vec<usize>,
        recv_counts: Vec<usize>,
    ) -> Request<Vec<T>> {
        self.start(move |c| {
            let mut recv = vec![T::zeroed(); recv_counts.iter().sum()];
            c.all_to_all_v(&send, &send_counts, &mut recv, &recv_counts)
                .map(|_| recv)
        })
    }

    /// Non-blocking [`Communicator::gather`]; returns the gathered buffer on
    /// the root and an empty vector elsewhere.
    pub fn igather<T: Element>(&self, send: Vec<T>, root: usize) -> Request<Vec<T>> {
        self.start(move |c| {
            let len = if c.rank() == root {
                send.len() * c.size()
            } else {
                0
            };
            let mut recv = vec![T::zeroed(); len];
            c.gather(&send, &mut recv, root).map(|_| recv)
        })
    }

    /// Non-blocking [`Communicator::scatter`] of blocks of `count` elements;
    /// `send` is read on the root only.
    pub fn iscatter<T: Element>(&self, send: Vec<T>, count: usize, root: usize) -> Request<Vec<T>> {
        self.start(move |c| {
            let mut recv = vec![T::zeroed(); count];
            c.scatter(&send, &mut recv, root).map(|_| recv)
        })
    }

    /// Non-blocking [`Communicator::barrier`].
    pub fn ibarrier(&self) -> Request<()> {
        self.start(|c| c.barrier())
    }
}

fn single_op_plan(op: Op) -> Plan {
    Plan {
        rounds: vec![Round { ops: vec![op] }],
        scratch: 0,
    }
}

/// `buf` on the rank that uses it, else its empty start: a buffer the
/// collective reads only on the root (broadcast's and scatter's input).
fn root_only<T>(is_root: bool, buf: &[T]) -> &[T] {
    if is_root {
        buf
    } else {
        &buf[..0]
    }
}

/// [`root_only`] for a buffer written only on the root (reduce's and
/// gather's output).
fn root_only_mut<T>(is_root: bool, buf: &mut [T]) -> &mut [T] {
    if is_root {
        buf
    } else {
        &mut buf[..0]
    }
}

/// SplitMix64 finaliser: spreads communicator ids so that split groups get
/// distinct ids with overwhelming probability.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}
