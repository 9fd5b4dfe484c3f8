//! A network simulator that runs ferrocoll's own algorithm plans on
//! modelled clusters.
//!
//! [`simulate`] builds the plan of every rank with [`ferrocoll::plan::build`]
//! and replays all of them, message by message, on a [`TopologySpec`]
//! (`switch`, `two-level`, `rail`, `fat-tree`, `ring`, `torus`, with a rank
//! placement), either without contention
//! ([`Mode::Ideal`], which agrees with the alpha-beta cost model
//! `ferrocoll::cost::predict`) or with every link a FIFO queue of chunks
//! ([`Mode::Contention`]). See [`engine`] for the execution model,
//! [`network`] for the links and routes, [`topology`] for the strings.
//!
//! [`SimOptions`] adds scenarios (stragglers, slow ranks, slow or failed
//! links), [`simulate_jobs`] runs several collectives at once on one fabric,
//! every [`SimResult`] carries a per-class link utilization
//! [`timeline`](SimResult::timeline), and [`plot::svg`] draws it.
//!
//! A full run holds every message of every plan at once; it is sized from
//! the plans before it starts and refused, with the estimate, when it would
//! not fit in the memory available ([`estimate`]). [`simulate_aggregated`]
//! runs one rank per class of alike ranks instead ([`symmetry`]), also
//! where ranks differ only in the sizes of their blocks ([`uneven`]).
//!
//! Besides ferrocoll's plans the simulator runs one algorithm the executor
//! cannot: in-network reduction ([`sharp`], [`simulate_sharp_allreduce`]),
//! where the switches of a `switch` or `fat-tree` topology with `sharp=1`
//! reduce an allreduce as it passes through them. [`SimAlgorithm`] names
//! either kind for [`simulate_algorithm`]. [`compressed`] runs the
//! compressed allreduces of `ferrocoll::compress` (their collectives'
//! plans on encoded bytes, the codec's compute per byte on every rank).
//!
//! ```
//! use ferrocoll::{Algorithm, Collective};
//! use ferrocoll_sim::{simulate, Mode, TopologySpec};
//!
//! let topo = TopologySpec::parse("switch:ranks=8,bw=50GB/s,lat=2us").unwrap();
//! let r = simulate(Collective::AllReduce, Algorithm::Ring, 1 << 26, &topo, Mode::Ideal).unwrap();
//! // Ring allreduce moves 2(N-1)/N of the buffer through every port; the
//! // 14 latencies cost about 1 % at 64 MiB.
//! assert!((r.busbw / 50e9 - 1.0).abs() < 0.02);
//! ```

#![warn(missing_docs)]

pub mod compressed;
pub mod engine;
pub mod estimate;
pub mod graph;
pub mod network;
pub mod plot;
pub mod sharp;
pub mod symmetry;
pub mod topology;
pub mod uneven;

pub use compressed::{cost_profile, simulate_compressed, CompressedResult};
pub use engine::{CriticalPath, Mode, SimOptions, TIMELINE_BUCKETS};
pub use network::Network;
pub use sharp::{simulate_sharp_allreduce, simulate_sharp_allreduce_with};
pub use symmetry::{Symmetry, SymmetryKind};
pub use topology::{LinkSpec, TopologySpec};
pub use uneven::BlockSizes;

use ferrocoll::plan::{self, Plan, PlanRequest};
use ferrocoll::{Algorithm, Collective};

/// Traffic and load of one class of link.
#[derive(Clone, Debug, PartialEq)]
pub struct LinkClassStats {
    /// The class (`up`, `down`, `nvlink-up`, `nic-up`, `leaf-up`, ...).
    pub class: String,
    /// Bytes carried by all links of the class together.
    pub bytes: u64,
    /// Busy time of the class's links over `time_s` times their number
    /// (0..=1).
    pub utilization: f64,
}

/// The outcome of one simulated collective.
#[derive(Clone, Debug, PartialEq)]
pub struct SimResult {
    /// Time until the last rank finished, in seconds.
    pub time_s: f64,
    /// Algorithm bandwidth, bytes / time (bytes per second), 0 when no time
    /// passed.
    pub algbw: f64,
    /// Bus bandwidth: algbw times the nccl-tests factor of the collective
    /// (allreduce 2(n-1)/n; allgather, reducescatter, alltoall(v), gather,
    /// scatter (n-1)/n; bcast and reduce 1).
    pub busbw: f64,
    /// Per link class, in the network's class order.
    pub per_class: Vec<LinkClassStats>,
    /// The link busy longest, e.g. `leaf-up[2]` (empty when nothing moved).
    pub hottest_link: String,
    /// Events the engine processed (with [`simulate_jobs`], those of the
    /// whole run, all jobs together).
    pub events: u64,
    /// Link utilization over time: per link class (in `per_class` order),
    /// the busy time of the class's links in each of [`TIMELINE_BUCKETS`]
    /// (200) equal buckets spanning `[0, time_s]`, over the bucket's width
    /// times the number of links. The mean of a class's buckets is its
    /// `per_class` utilization; values lie in 0..=1 in the contention mode
    /// (see [`engine`] for the ideal mode's middle links). All zeros when
    /// no time passed.
    pub timeline: Vec<(String, Vec<f64>)>,
    /// The symmetry the run was aggregated by ([`simulate_aggregated`]),
    /// `None` for a full run.
    pub aggregated: Option<Symmetry>,
    /// Set when the aggregated ranks' blocks differ in size ([`uneven`]):
    /// the sizes. Then the traffic (`per_class`, `hottest_link`) is the
    /// full run's, exactly, and the time (with `algbw`, `busbw`,
    /// `timeline`, `critical_path`) that of the run with every block at its
    /// largest size; `None` otherwise.
    pub uneven: Option<BlockSizes>,
    /// What the time was spent on along the critical path (latency,
    /// transmission, queueing, compute; see [`CriticalPath`]).
    pub critical_path: CriticalPath,
}

/// An algorithm the simulator can run: one of ferrocoll's plans, or
/// in-network reduction, which exists only in the simulator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SimAlgorithm {
    /// The plans of a ferrocoll algorithm ([`simulate_with`]).
    Plan(Algorithm),
    /// Allreduce reduced by the switches (`sharp`; see [`sharp`]).
    Sharp,
}

impl SimAlgorithm {
    /// Parses `sharp` or a ferrocoll algorithm name.
    pub fn from_name(s: &str) -> Option<SimAlgorithm> {
        if s.eq_ignore_ascii_case("sharp") {
            Some(SimAlgorithm::Sharp)
        } else {
            Algorithm::from_name(s).map(SimAlgorithm::Plan)
        }
    }

    /// `sharp` or the algorithm's name.
    pub fn name(self) -> &'static str {
        match self {
            SimAlgorithm::Plan(a) => a.name(),
            SimAlgorithm::Sharp => "sharp",
        }
    }
}

impl std::fmt::Display for SimAlgorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl From<Algorithm> for SimAlgorithm {
    fn from(a: Algorithm) -> SimAlgorithm {
        SimAlgorithm::Plan(a)
    }
}

/// Simulates `coll` with `algo`: [`simulate_with`] for a plan,
/// [`simulate_sharp_allreduce_with`] for [`SimAlgorithm::Sharp`], which
/// fails unless `coll` is allreduce and `topo` can reduce in the network
/// ([`sharp::check`]).
pub fn simulate_algorithm(
    coll: Collective,
    algo: SimAlgorithm,
    bytes: usize,
    topo: &TopologySpec,
    mode: Mode,
    opts: &SimOptions,
) -> Result<SimResult, String> {
    match algo {
        SimAlgorithm::Plan(a) => simulate_with(coll, a, bytes, topo, mode, opts),
        SimAlgorithm::Sharp => {
            sharp::check(coll, topo)?;
            simulate_sharp_allreduce_with(bytes, topo, mode, opts)
        }
    }
}

/// One collective of [`simulate_jobs`]: `coll` with `algo` on the group
/// made of the physical ranks `ranks` (group rank i runs on `ranks[i]`),
/// `bytes` as for [`simulate`].
#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    /// The collective.
    pub coll: Collective,
    /// Its algorithm.
    pub algo: Algorithm,
    /// Size of the call as nccl-tests counts it (see [`simulate`]).
    pub bytes: usize,
    /// The physical ranks of the group, distinct, in group rank order.
    pub ranks: Vec<usize>,
}

/// Simulates `coll` with `algo` on `topo`: `bytes` is the size nccl-tests
/// reports (the whole buffer; for the block collectives the n blocks
/// together), in f32 elements, root 0, no reduction cost. See
/// [`simulate_with`] for gamma and the chunk size.
pub fn simulate(
    coll: Collective,
    algo: Algorithm,
    bytes: usize,
    topo: &TopologySpec,
    mode: Mode,
) -> Result<SimResult, String> {
    simulate_with(coll, algo, bytes, topo, mode, &SimOptions::default())
}

/// [`simulate`] with explicit [`SimOptions`].
pub fn simulate_with(
    coll: Collective,
    algo: Algorithm,
    bytes: usize,
    topo: &TopologySpec,
    mode: Mode,
    opts: &SimOptions,
) -> Result<SimResult, String> {
    let job = Job {
        coll,
        algo,
        bytes,
        ranks: (0..topo.ranks()).collect(),
    };
    let mut results = simulate_jobs(&[job], topo, mode, opts)?;
    Ok(results.remove(0))
}

/// Runs several collectives at once on one fabric: every job's plans start
/// at t = 0 and share the links (and the reduction unit of a rank that is
/// in several jobs; see [`engine`]). One result per job, in order, each
/// with its own completion time and its own traffic (`per_class`,
/// `hottest_link`, `timeline` count only that job's bytes, over its own
/// time); `events` is the whole run's.
///
/// A job's plans see its group as flat (no node structure) unless its ranks
/// are the whole cluster in order, in which case they see the topology's
/// node structure as [`simulate`] does; a single such job is exactly
/// [`simulate_with`].
///
/// Before anything runs, the run's memory is estimated from the plans
/// ([`estimate`]); a run that would need more than is available fails
/// then, with the estimate, instead of being killed by the kernel later.
pub fn simulate_jobs(
    jobs: &[Job],
    topo: &TopologySpec,
    mode: Mode,
    opts: &SimOptions,
) -> Result<Vec<SimResult>, String> {
    let builders = job_builders(jobs, topo)?;
    let groups = job_groups(jobs, &builders);
    let net = Network::new(topo);
    estimate::check(
        &estimate::estimate_groups(&groups, ELEM, &net, mode, opts)?,
        opts,
    )?;
    let traces = engine::run_groups(&groups, ELEM, &net, mode, opts)?;
    Ok(jobs
        .iter()
        .zip(&traces)
        .map(|(job, trace)| summarize(job.coll, job.ranks.len(), job.bytes, &net, trace))
        .collect())
}

/// Runs plans made elsewhere on `topo`: `build(r)` is rank r's plan (peers
/// are ranks of `topo`, one plan per rank), its spans counting elements of
/// `elem_size` bytes; `coll` and `bytes` only label the result (its
/// algorithm and bus bandwidth, as [`simulate`] counts them). For
/// exchanges that are no single collective of the catalog, such as the MoE
/// schedules of `ferrocoll::moe::plans`. The memory is estimated and
/// checked first, as for [`simulate_jobs`].
pub fn simulate_plans(
    build: &dyn Fn(usize) -> Result<Plan, String>,
    elem_size: usize,
    (coll, bytes): (Collective, usize),
    topo: &TopologySpec,
    mode: Mode,
    opts: &SimOptions,
) -> Result<SimResult, String> {
    let n = topo.ranks();
    let ranks: Vec<usize> = (0..n).collect();
    let groups = [engine::Group {
        plans: engine::Plans::Built { count: n, build },
        ranks: &ranks,
    }];
    let net = Network::new(topo);
    estimate::check_unaggregated(
        &estimate::estimate_groups(&groups, elem_size, &net, mode, opts)?,
        opts,
        "these plans were built outside the catalog, with no symmetry known to the simulator",
    )?;
    let trace = engine::run_groups(&groups, elem_size, &net, mode, opts)?.remove(0);
    Ok(summarize(coll, n, bytes, &net, &trace))
}

/// [`estimate::estimate_groups`] of what [`simulate_jobs`] would run: the
/// memory and events of the full run, before it starts.
pub fn estimate_jobs(
    jobs: &[Job],
    topo: &TopologySpec,
    mode: Mode,
    opts: &SimOptions,
) -> Result<estimate::Estimate, String> {
    let builders = job_builders(jobs, topo)?;
    let groups = job_groups(jobs, &builders);
    estimate::estimate_groups(&groups, ELEM, &Network::new(topo), mode, opts)
}

/// The element size of every simulated call (f32).
const ELEM: usize = 4;

/// For every job, the function that builds group rank i's plan. Rank 0's
/// plan is built first: an algorithm that cannot run a call fails here,
/// before any job starts.
fn job_builders<'a>(
    jobs: &'a [Job],
    topo: &TopologySpec,
) -> Result<Vec<impl Fn(usize) -> Result<Plan, String> + 'a>, String> {
    let all = topo.ranks();
    let name = move |j: usize, e: String| {
        if jobs.len() == 1 {
            e
        } else {
            format!("job {j}: {e}")
        }
    };
    let mut builders = Vec::with_capacity(jobs.len());
    for (j, job) in jobs.iter().enumerate() {
        let n = job.ranks.len();
        if n == 0 {
            return Err(format!("job {j} has no ranks"));
        }
        let whole = n == all && job.ranks.iter().enumerate().all(|(i, &r)| i == r);
        let topology = if whole {
            topo.plan_topology()
        } else {
            ferrocoll::Topology::flat(n)
        };
        let count = element_count(job.coll, n, job.bytes, ELEM);
        plan_of(job.coll, job.algo, n, 0, count, &topology).map_err(|e| name(j, e))?;
        builders.push(move |rank: usize| {
            plan_of(job.coll, job.algo, n, rank, count, &topology).map_err(|e| name(j, e))
        });
    }
    Ok(builders)
}

/// The engine's groups of `jobs`, their plans built by `builders`.
fn job_groups<'a>(
    jobs: &'a [Job],
    builders: &'a [impl Fn(usize) -> Result<Plan, String> + 'a],
) -> Vec<engine::Group<'a>> {
    jobs.iter()
        .zip(builders)
        .map(|(job, build)| engine::Group {
            plans: engine::Plans::Built {
                count: job.ranks.len(),
                build,
            },
            ranks: &job.ranks,
        })
        .collect()
}

/// [`simulate_with`] in the aggregated mode: finds the smallest symmetry
/// (a shift or exclusive-or of rank numbers) that the topology, the
/// placement and the plans all have ([`symmetry::find`]), and simulates
/// one rank per class. The result is the full run's (time, traffic and
/// utilization of every link class, hottest link, timeline) except
/// `events`, which counts the quotient run's, and `aggregated`, which
/// names the symmetry.
///
/// Where the plans have the symmetry only up to the sizes of their blocks
/// (a ring, direct or hierarchical allreduce of a count that the ranks do
/// not divide), [`uneven`] aggregates them: the traffic is still the full
/// run's, exactly; the time is that of the run with every block at its
/// largest size, and `uneven` gives the sizes.
///
/// Fails, saying why, when there is no symmetry at all (trees, a random
/// placement, blocks of zero elements, ...) or `opts` singles out ranks or
/// links (see [`engine::run_aggregated`]). 100,000 ranks of a ring
/// allreduce take about as long as one rank's plan is to build.
pub fn simulate_aggregated(
    coll: Collective,
    algo: Algorithm,
    bytes: usize,
    topo: &TopologySpec,
    mode: Mode,
    opts: &SimOptions,
) -> Result<SimResult, String> {
    let n = topo.ranks();
    let count = element_count(coll, n, bytes, ELEM);
    let topology = topo.plan_topology();
    let build = |rank: usize| plan_of(coll, algo, n, rank, count, &topology);
    let net = Network::new(topo);
    let (trace, sym, sizes) = match symmetry::find(&net, &build) {
        Ok((sym, reps)) => (
            engine::run_aggregated(&reps, &sym, ELEM, &net, mode, opts)?,
            sym,
            None,
        ),
        Err(why) => match uneven::find(&net, &build) {
            Ok(Some(model)) => {
                let sym = model.sym;
                let (trace, sizes) = uneven::run(model, ELEM, &net, mode, opts)?;
                (trace, sym, Some(sizes))
            }
            Ok(None) => return Err(why),
            Err(e) => {
                return Err(format!(
                    "no symmetry to aggregate: the plans differ from a shift of each other only in the sizes of their blocks, but {e}; run without aggregation"
                ))
            }
        },
    };
    let mut r = summarize(coll, n, bytes, &net, &trace);
    r.aggregated = Some(sym);
    r.uneven = sizes;
    Ok(r)
}

/// The element count [`PlanRequest::count`] takes for a call of `bytes`
/// as nccl-tests counts them: the buffer for allreduce, bcast and reduce, one
/// of n blocks for the block collectives, nothing for barrier.
pub fn element_count(coll: Collective, n: usize, bytes: usize, elem_size: usize) -> usize {
    match coll {
        Collective::AllReduce | Collective::Broadcast | Collective::Reduce => bytes / elem_size,
        Collective::Barrier => 0,
        _ => bytes / elem_size / n.max(1),
    }
}

/// The plans of all `n` ranks (root 0; uniform counts for alltoallv; the
/// topology's node structure for the topology-aware algorithms).
pub fn build_plans(
    coll: Collective,
    algo: Algorithm,
    n: usize,
    count: usize,
    topo: &TopologySpec,
) -> Result<Vec<Plan>, String> {
    plans_on(coll, algo, n, count, &topo.plan_topology())
}

/// [`build_plans`] on an explicit plan topology.
fn plans_on(
    coll: Collective,
    algo: Algorithm,
    n: usize,
    count: usize,
    topology: &ferrocoll::Topology,
) -> Result<Vec<Plan>, String> {
    (0..n)
        .map(|rank| plan_of(coll, algo, n, rank, count, topology))
        .collect()
}

/// Rank `rank`'s plan (root 0; uniform counts for alltoallv).
fn plan_of(
    coll: Collective,
    algo: Algorithm,
    n: usize,
    rank: usize,
    count: usize,
    topology: &ferrocoll::Topology,
) -> Result<Plan, String> {
    let mut req = PlanRequest::new(coll, n, rank, count).with_topology(topology.clone());
    if coll == Collective::AllToAllV {
        req = req.with_counts(vec![count; n], vec![count; n]);
    }
    plan::build(algo, &req).map_err(|e| e.to_string())
}

/// The nccl-tests bus bandwidth factor of `coll` on `n` ranks.
pub fn busbw_factor(coll: Collective, n: usize) -> f64 {
    let n = n as f64;
    match coll {
        Collective::AllReduce => 2.0 * (n - 1.0) / n,
        Collective::Broadcast | Collective::Reduce => 1.0,
        Collective::Barrier => 0.0,
        _ => (n - 1.0) / n,
    }
}

/// Bytes and utilization over `t` seconds of every link class, from each
/// link's bytes and busy time.
pub(crate) fn class_stats(
    net: &Network,
    link_bytes: &[u64],
    link_busy: &[f64],
    t: f64,
) -> Vec<LinkClassStats> {
    net.classes
        .iter()
        .enumerate()
        .map(|(c, name)| {
            let ids = net.links.iter().enumerate().filter(|(_, l)| l.class == c);
            let (bytes, busy) = ids.fold((0u64, 0.0f64), |(b, s), (i, _)| {
                (b + link_bytes[i], s + link_busy[i])
            });
            let links = net.class_size(c) as f64;
            LinkClassStats {
                class: name.clone(),
                bytes,
                utilization: if t > 0.0 { busy / (t * links) } else { 0.0 },
            }
        })
        .collect()
}

fn summarize(
    coll: Collective,
    n: usize,
    bytes: usize,
    net: &Network,
    trace: &engine::Trace,
) -> SimResult {
    let t = trace.time_s;
    let algbw = if t > 0.0 { bytes as f64 / t } else { 0.0 };
    let per_class = class_stats(net, &trace.link_bytes, &trace.link_busy, t);
    // The first of the busiest links; busy times that differ only by
    // rounding (a message charged whole on one link and chunk by chunk on
    // the next) count as equal.
    let mut hottest = None;
    for (i, &busy) in trace.link_busy.iter().enumerate() {
        if busy > 0.0 && hottest.map_or(true, |(_, b)| busy > b * (1.0 + 1e-9)) {
            hottest = Some((i, busy));
        }
    }
    SimResult {
        time_s: t,
        algbw,
        busbw: algbw * busbw_factor(coll, n),
        per_class,
        hottest_link: hottest.map(|(i, _)| net.link_name(i)).unwrap_or_default(),
        events: trace.events,
        timeline: net
            .classes
            .iter()
            .cloned()
            .zip(trace.timeline.iter().cloned())
            .collect(),
        aggregated: None,
        uneven: None,
        critical_path: trace.critical_path.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_factors_follow_nccl_tests() {
        assert_eq!(element_count(Collective::AllReduce, 8, 1 << 20, 4), 1 << 18);
        assert_eq!(element_count(Collective::AllGather, 8, 1 << 20, 4), 1 << 15);
        assert_eq!(element_count(Collective::Barrier, 8, 1 << 20, 4), 0);
        assert_eq!(busbw_factor(Collective::AllReduce, 4), 1.5);
        assert_eq!(busbw_factor(Collective::AllToAll, 4), 0.75);
        assert_eq!(busbw_factor(Collective::Broadcast, 4), 1.0);
    }

    #[test]
    fn results_describe_the_traffic() {
        let t = TopologySpec::parse("switch:ranks=4,bw=50GB/s,lat=2us").unwrap();
        let r = simulate(
            Collective::AllGather,
            Algorithm::Ring,
            4 << 20,
            &t,
            Mode::Contention,
        )
        .unwrap();
        // 3 steps of 1 MiB per rank.
        let expect = 3.0 * (2e-6 + (1u64 << 20) as f64 / 50e9);
        assert!((r.time_s / expect - 1.0).abs() < 1e-9, "{r:?}");
        assert!((r.algbw - (4u64 << 20) as f64 / r.time_s).abs() < 1e-3);
        assert!((r.busbw - r.algbw * 0.75).abs() < 1e-3);
        assert_eq!(r.per_class.len(), 2);
        assert_eq!(r.per_class[0].class, "up");
        assert_eq!(r.per_class[0].bytes, (4 * 3) << 20);
        assert!(r.per_class[0].utilization > 0.9 && r.per_class[0].utilization <= 1.0);
        assert_eq!(r.hottest_link, "up[0]");
        let bad = simulate(Collective::Gather, Algorithm::Ring, 1024, &t, Mode::Ideal);
        assert!(bad.is_err());
        let barrier = simulate(
            Collective::Barrier,
            Algorithm::Tree,
            0,
            &t,
            Mode::Contention,
        )
        .unwrap();
        assert!(barrier.time_s > 0.0 && barrier.algbw == 0.0);
    }
}
