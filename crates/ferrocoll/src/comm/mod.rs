//! The [`Communicator`]: a group of ranks and the collectives they call.
//!
//! Every rank of a communicator must call the same collectives in the same
//! order with matching arguments (MPI/NCCL semantics). Each call gets the
//! next sequence number; messages carry it, so calls never match messages of
//! another call, non-blocking calls may overlap blocking ones, and a rank that
//! calls something else gets [`Error::Mismatch`] instead of garbage.
//!
//! The communicator's code is split by job:
//!
//! * this file: the [`Communicator`] and its options, construction, what a
//!   handle knows (rank, size, topology, configuration), algorithm choice's
//!   entry points (the choice itself is in [`crate::select`]) and `split`;
//! * `api.rs`: the typed blocking collectives and send/recv, which check
//!   their arguments and describe the call (a `Spec` and the caller's
//!   buffers as an `exec::Memory`);
//! * `call.rs`: the call runner: sequence numbers, the small-call fast path,
//!   choosing, planning and executing, errors in group ranks;
//! * `nonblocking.rs`: the `i*` forms, which own their buffers, reserve
//!   their sequence number when issued and queue the blocking form on the
//!   communicator's progress worker;
//! * `progress.rs`: that worker, one thread per communicator running queued
//!   calls in issue order;
//! * `persistent.rs`: persistent collectives (`all_reduce_init`, ...), a
//!   call resolved and planned once and started many times.
//!
//! The children use this file's items; this file uses none of theirs (it
//! calls their methods on `Communicator` only) except the worker its shared
//! state holds (`progress::Engine`, whose module imports nothing from
//! here) and the persistent types it re-exports, so no two modules import
//! each other.

mod api;
mod call;
mod compressed;
mod handles;
mod nonblocking;
mod persistent;
mod progress;

pub use persistent::{Persistent, Started};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::plan::{Algorithm, Collective};
use crate::select::{self, Chooser};
use crate::topo::Topology;
use crate::transport::Transport;
use crate::types::DType;

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
    /// Whether eligible allreduces (f32, sum or avg) may run compressed
    /// ([`crate::compress::CompressSetting`]); `None` follows
    /// `FERROCOLL_COMPRESS`.
    pub compress: Option<crate::compress::CompressSetting>,
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

    /// Sets whether eligible allreduces run compressed, over
    /// `FERROCOLL_COMPRESS` (`CompressSetting::parse("auto:int8")`).
    pub fn compress(mut self, setting: crate::compress::CompressSetting) -> CallOptions {
        self.compress = Some(setting);
        self
    }

    /// Sets the per-wait deadline. Longer than 30 days counts as 30 days
    /// (the longest `FERROCOLL_TIMEOUT` accepts): a deadline must stay a
    /// time the clock can reach.
    pub fn timeout(mut self, timeout: Duration) -> CallOptions {
        let longest = Duration::from_secs_f64(crate::config::MAX_TIMEOUT_SECS);
        self.timeout = Some(timeout.min(longest));
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
    /// The profile and what choice remembers per shape (see
    /// [`crate::select`]).
    choice: select::Memo,
    /// Where the ranks are (communicators made by [`crate::init()`]).
    placement: Option<Arc<crate::launch::Placement>>,
    /// The transport's small-collective capability
    /// ([`Transport::small_collectives`]) reaches every rank of the group.
    fast: bool,
    /// Collectives that may take the small-collective path: those whose
    /// algorithm `FERROCOLL_ALGO` does not force (bit i: `Collective::ALL[i]`).
    fast_colls: u16,
    /// The progress worker of the non-blocking calls, started by the first
    /// (`nonblocking.rs`); dropped, and its thread ended, with the last
    /// handle. Boxed: every call reads this struct, so it grows by a word
    /// rather than by the worker (with the worker inline, a blocking 512 B
    /// allreduce on shm measured ~2% slower than before it, boxed ~0-1%).
    engine: OnceLock<Box<progress::Engine>>,
    /// Payload bytes of this rank's planned messages to other ranks
    /// ([`Communicator::bytes_sent`]).
    sent: AtomicU64,
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
        .filter(|&&c| config.algorithms.get(c).is_none())
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
        let group: Vec<usize> = (0..size).collect();
        let fast = transport
            .small_collectives()
            .is_some_and(|s| s.serves(&group));
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
                choice: Default::default(),
                placement: None,
                fast,
                engine: OnceLock::new(),
                sent: AtomicU64::new(0),
            }),
            options: CallOptions::default(),
            reserved_seq: None,
        })
    }

    /// [`Communicator::new`] for a job [`crate::init()`] has placed, over
    /// `transport`.
    pub(crate) fn with_placement(
        transport: Arc<dyn Transport>,
        config: Config,
        placement: crate::launch::Placement,
    ) -> Result<Communicator> {
        let mut comm = Communicator::new(transport, config)?;
        let shared = Arc::get_mut(&mut comm.shared).expect("a new communicator has one handle");
        shared.placement = Some(Arc::new(placement));
        Ok(comm)
    }

    /// Where the world's ranks run and how this rank reaches each (set by
    /// [`crate::init()`]; `None` for in-process ranks and split groups).
    pub fn placement(&self) -> Option<&crate::launch::Placement> {
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

    /// Whether the large messages of a call of `coll` are moved by their
    /// receivers alone, straight from the sender's memory (threads; shared
    /// memory where its single copy carries `coll`), as the cost model then
    /// prices them ([`crate::cost::Profile::receiver_copies`]).
    pub fn receivers_copy(&self, coll: Collective) -> bool {
        self.shared.transport.receivers_copy(coll)
    }

    /// Payload bytes this rank has handed its transport for other ranks
    /// on this communicator (every handle and every call, blocking or not,
    /// since it was made): the traffic counter a compressed collective
    /// reads to report what it actually sent ([`crate::compress::WireStats`]).
    ///
    /// Counts the messages of the plans, as the executor hands them over
    /// (what a transport adds, frame headers or checksums, is not
    /// counted); a small call on the shared-memory fast path of ranks on
    /// one host counts what this rank wrote into the mailboxes for the
    /// others (its contribution, once, however many read it; for
    /// all-to-all and reduce-scatter the blocks of the others). A split
    /// group counts its own calls.
    pub fn bytes_sent(&self) -> u64 {
        self.shared.sent.load(Ordering::Relaxed)
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

    /// The per-call options of this handle ([`Communicator::with_options`]).
    pub fn options(&self) -> &CallOptions {
        &self.options
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
    /// rank) and barrier. [`Communicator::call_bytes`] computes it. The
    /// precedence is [`crate::select`]'s.
    pub fn choose(&self, coll: Collective, bytes: usize) -> Result<(Algorithm, String)> {
        self.chooser().choose(coll, bytes)
    }

    /// The cost-model parameters this communicator predicts with: the
    /// configured profile, else a calibrated file at
    /// [`crate::cost::Profile::default_path`] for this transport, else the
    /// transport's built-in one.
    pub fn profile(&self) -> crate::cost::Profile {
        self.chooser().profile().clone()
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
        self.chooser().predict(coll, count, dtype)
    }

    /// What [`crate::select`] chooses from for this handle.
    fn chooser(&self) -> Chooser<'_> {
        let config = &self.shared.config;
        Chooser {
            option: self.options.algorithm,
            forced: &config.algorithms,
            model: config.auto_model,
            configured: config.profile.as_ref(),
            tune: &config.tune,
            transport: self.transport_name(),
            carrier: Some(&*self.shared.transport),
            n: self.size(),
            topology: &self.shared.topology,
            memo: &self.shared.choice,
        }
    }

    /// The size in bytes that algorithm choice looks at (see
    /// [`Communicator::choose`]) for a call of `count` elements of `dtype`
    /// (the per-rank block for the block collectives).
    pub fn call_bytes(&self, coll: Collective, count: usize, dtype: DType) -> usize {
        select::call_bytes(coll, self.size(), count, dtype)
    }

    /// Whether a call of `count` elements of `dtype` (the per-rank block for
    /// the block collectives) runs on the shared-memory fast path rather
    /// than an algorithm's plan: every rank of this communicator is on one
    /// host with shared memory (`FERROCOLL_SHM_FAST` not `off`, checksums
    /// off), the group has 2 to 16 ranks, the collective is an allreduce,
    /// broadcast, reduce, allgather, all-to-all, reduce-scatter or barrier
    /// moving at most 16 KiB per rank (per block for the block
    /// collectives) on 2-4 ranks (`3 * 16 KiB / (n - 1)` on `n` ranks, 96
    /// bytes at least: per-pair eager buffers in shared memory carry it),
    /// or is a reduce of any length or a broadcast of at most 64 KiB on 2-4
    /// ranks (streamed through those buffers in 16 KiB parts), and no
    /// algorithm is forced for it.
    pub fn uses_fast_path(&self, coll: Collective, count: usize, dtype: DType) -> bool {
        self.small_path(coll, count, dtype).is_some()
    }

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
        let in_parent: Vec<usize> = members.iter().map(|&(_, r)| r).collect();
        let id = mix(mix(self.shared.id ^ 0x9e37_79b9_7f4a_7c15) ^ split_no) ^ u64::from(color);
        Ok(Some(self.child(&in_parent, rank, mix(id))))
    }

    /// The communicator over `in_parent` (this communicator's ranks, in the
    /// new order), where this rank is `rank`, with identifier `id`: what
    /// [`Communicator::split`] and [`Communicator::subgroup`] build.
    fn child(&self, in_parent: &[usize], rank: usize, id: u64) -> Communicator {
        let group: Vec<usize> = in_parent.iter().map(|&r| self.shared.group[r]).collect();
        let topology = self.shared.topology.subgroup(in_parent);
        let fast = self
            .shared
            .transport
            .small_collectives()
            .is_some_and(|s| s.serves(&group));
        Communicator {
            shared: Arc::new(Shared {
                transport: Arc::clone(&self.shared.transport),
                group,
                rank,
                id,
                next_seq: AtomicU64::new(0),
                splits: AtomicU64::new(0),
                config: Arc::clone(&self.shared.config),
                topology,
                scratch: Default::default(),
                choice: Default::default(),
                placement: None,
                fast,
                fast_colls: self.shared.fast_colls,
                engine: OnceLock::new(),
                sent: AtomicU64::new(0),
            }),
            options: self.options.clone(),
            reserved_seq: None,
        }
    }
}

/// SplitMix64 finaliser: spreads communicator ids so that split groups get
/// distinct ids with overwhelming probability.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}
