//! In-network reduction (NVIDIA SHARP-like): an allreduce the switches
//! compute.
//!
//! A `switch` or `fat-tree` topology with `sharp=1` has switch ASICs that
//! aggregate the partial sums of an allreduce at line rate as packets pass
//! through the aggregation tree, so only reduced data goes up a level, and
//! the root multicasts the result back down. ferrocoll's executor cannot run
//! this (the ranks only stream their buffer up and receive the result), so it
//! is not an [`ferrocoll::Algorithm`] and has no plans: this module simulates
//! it directly on the links of [`Network`], with the engine's link rules.
//!
//! # Model
//!
//! The aggregation tree: on `switch` the one switch is the root and its
//! children are the `n` rank ports; on a `fat-tree` of `l > 1` leaves every
//! leaf switch aggregates its `leaf` rank ports into its aggregate uplink
//! (`leaf-up[j]`), the spine aggregates the `l` uplinks and is the root; the
//! result goes down every `leaf-down[j]` and from each leaf down every rank
//! port. A fat tree of one leaf is the `switch` case with the leaf as root.
//!
//! * Every rank streams its M bytes up its port in chunks of
//!   [`SimOptions::chunk_bytes`] (64 KiB), back to back, from t = 0 (or its
//!   [`SimOptions::start_delay`]).
//! * A switch forwards, per chunk index, **one** reduced chunk upward (or,
//!   at the root, down) once it has that chunk from all its children: the
//!   output may start when the last child's head is in, and cannot finish
//!   before the last child's tail is in (line-rate reduction: no gamma
//!   anywhere, the ranks reduce nothing).
//! * The root sends each reduced chunk down as a multicast: every down link
//!   of the tree carries every chunk exactly once, and a switch below
//!   forwards it to all its down links.
//! * Every link is a FIFO queue with the engine's cut-through rule (see
//!   [`crate::engine`]): a chunk that occupied link k over `[s, e]` may
//!   start on the next link at `s + lat_k`, but a faster next link waits
//!   until it can send the whole chunk at its own rate (`e + lat_k -
//!   chunk / bw`), and the chunk never finishes before `e + lat_k`. With
//!   several children, the latest head and the latest tail count.
//!   Latency is paid entering a switch, as everywhere in the simulator.
//! * A rank is done when the last chunk of the result has arrived.
//!
//! [`Mode::Ideal`] runs the same pipeline with the whole buffer as one
//! chunk and every link timed at `b_min` (each link is still charged busy
//! time at its own bandwidth), which gives exactly `L + M / b_min`: `L` the latency of the path
//! up to the root and back down (`lat` on `switch`, `3 lat` between the
//! leaves of a fat tree: rank port and leaf uplink up, leaf downlink down;
//! the links down to a rank have no latency) and `b_min` the slowest link
//! of the tree (the rank ports unless a fat tree's leaf uplinks are slower,
//! i.e. `oversub > leaf`). [`Mode::Contention`] (the chunked pipeline) adds
//! at most a few chunk times to that.
//!
//! Compared with the ring allreduce's `2(N-1)/N · M / bw` (every byte of
//! the buffer crosses a port twice, less 1/N), SHARP sends M up each port
//! and receives M down each: `M / bw`, so its nccl-tests busbw (factor
//! 2(N-1)/N) approaches twice the port bandwidth. On a fat tree only
//! reduced data crosses the spine: M per leaf uplink, whatever the leaf's
//! size, so oversubscribing the uplinks costs nothing until they are slower
//! than one rank port.
//!
//! Per-class bytes, utilization, the hottest link and the timeline are
//! those of any other run; `events` counts chunk transmissions (one per
//! chunk and link). [`SimOptions::slow_links`] applies (a failed link of the
//! tree is an error), [`SimOptions::start_delay`] delays a rank's stream;
//! gamma and [`SimOptions::compute_slowdown`] have no effect, since no rank
//! reduces anything.

use ferrocoll::Collective;

use crate::engine::{self, Histogram, Mode, SimOptions};
use crate::network::Network;
use crate::topology::TopologySpec;
use crate::SimResult;

/// `Ok` when `coll` can run with in-network reduction on `topo`: an
/// allreduce on a `switch` or `fat-tree` with `sharp=1`. The error says
/// which condition fails.
pub fn check(coll: Collective, topo: &TopologySpec) -> Result<(), String> {
    if coll != Collective::AllReduce {
        return Err(format!(
            "sharp (in-network reduction) only runs allreduce, not {coll}"
        ));
    }
    match topo {
        TopologySpec::Switch { .. } | TopologySpec::FatTree { .. } => {}
        _ => {
            return Err(format!(
                "sharp (in-network reduction) needs a switch or fat-tree topology \
                 with sharp=1; `{topo}` has no aggregation tree"
            ))
        }
    }
    if !topo.sharp() {
        return Err(format!(
            "sharp (in-network reduction): the switches of `{topo}` cannot reduce; \
             add sharp=1 to the topology"
        ));
    }
    Ok(())
}

/// Simulates an allreduce of `bytes` (the whole buffer, as nccl-tests
/// counts it) reduced in the network on `topo` (a `switch` or `fat-tree`
/// with `sharp=1`); see the module docs for the model. Fails when the
/// topology cannot reduce in the network.
pub fn simulate_sharp_allreduce(
    bytes: usize,
    topo: &TopologySpec,
    mode: Mode,
) -> Result<SimResult, String> {
    simulate_sharp_allreduce_with(bytes, topo, mode, &SimOptions::default())
}

/// [`simulate_sharp_allreduce`] with explicit [`SimOptions`] (chunk size,
/// stragglers, slow or failed links; gamma and slow ranks have no effect).
pub fn simulate_sharp_allreduce_with(
    bytes: usize,
    topo: &TopologySpec,
    mode: Mode,
    opts: &SimOptions,
) -> Result<SimResult, String> {
    check(Collective::AllReduce, topo)?;
    let n = topo.ranks();
    if opts.chunk_bytes == 0 {
        return Err("chunk size 0: chunks need at least 1 byte".to_string());
    }
    let mut delay = vec![0.0f64; n];
    for &(r, d) in &opts.start_delay {
        if r >= n || !(d.is_finite() && d >= 0.0) {
            return Err(format!(
                "start delay ({r}, {d}): need a rank below {n} and a finite delay of at least 0 s"
            ));
        }
        delay[r] += d;
    }
    let net = Network::new(topo);
    let (degraded, failed) = engine::degrade(&net, &opts.slow_links)?;
    // Rank ports per leaf switch and number of leaves.
    let (leaf, leaves) = match topo {
        TopologySpec::FatTree { ranks, leaf, .. } => (*leaf, ranks / leaf),
        _ => (n, 1),
    };
    let tree = Tree { n, leaf, leaves };
    if let Some(&l) = tree.links().iter().find(|&&l| failed.get(l) == Some(&true)) {
        return Err(format!(
            "link {} has failed: the sharp allreduce's aggregation tree needs it",
            net.link_name(l)
        ));
    }
    // Stream start per physical position.
    let mut start_at = vec![0.0f64; n];
    for (r, d) in delay.iter().enumerate() {
        start_at[net.position(r)] = *d;
    }
    let total = bytes as u64;
    let chunk = match mode {
        Mode::Ideal => total.max(1),
        Mode::Contention => opts.chunk_bytes,
    };
    // The ideal mode paces every link at the tree's slowest bandwidth (every
    // link carries every byte of M, so the slowest sets the rate of a
    // pipelined stream); the contention mode moves chunks at each link's own.
    let pace = match mode {
        Mode::Ideal => tree
            .links()
            .iter()
            .map(|&l| degraded.links[l].bw)
            .fold(f64::INFINITY, f64::min),
        Mode::Contention => f64::INFINITY,
    };
    let mut p = Pipeline {
        net: &degraded,
        pace,
        free: vec![0.0; net.links.len()],
        link_bytes: vec![0; net.links.len()],
        link_busy: vec![0.0; net.links.len()],
        hist: Histogram::new(net.classes.len()),
        events: 0,
    };
    let mut done = 0.0f64;
    // (start, end) of the current chunk on each rank port / leaf uplink.
    let mut up = vec![(0.0, 0.0); n];
    let mut leaf_up = vec![(0.0, 0.0); leaves];
    for c in 0..total.div_ceil(chunk).max(1) {
        let cb = chunk.min(total - (c * chunk).min(total));
        for (pos, seg) in up.iter_mut().enumerate() {
            *seg = p.first(tree.up(pos), start_at[pos], cb);
        }
        // What comes down into each leaf: (head, tail) at its switch.
        let mut into_leaf = Vec::with_capacity(leaves);
        if leaves == 1 {
            let (h, t) = p.gather((0..n).map(|q| (tree.up(q), up[q])));
            into_leaf.push((h, t));
        } else {
            for (j, seg) in leaf_up.iter_mut().enumerate() {
                let (h, t) = p.gather((j * leaf..(j + 1) * leaf).map(|q| (tree.up(q), up[q])));
                *seg = p.forward(tree.leaf_up(j), h, t, cb);
            }
            let (h, t) = p.gather((0..leaves).map(|j| (tree.leaf_up(j), leaf_up[j])));
            for j in 0..leaves {
                let seg = p.forward(tree.leaf_down(j), h, t, cb);
                into_leaf.push(p.gather(std::iter::once((tree.leaf_down(j), seg))));
            }
        }
        for (j, &(h, t)) in into_leaf.iter().enumerate() {
            for q in j * leaf..(j + 1) * leaf {
                let l = tree.down(q);
                let (_, end) = p.forward(l, h, t, cb);
                done = done.max(end + degraded.links[l].lat);
            }
        }
    }
    let sizes: Vec<usize> = (0..net.classes.len()).map(|c| net.class_size(c)).collect();
    // The critical path is the stream of the latest rank: its delay, the
    // latency up the tree and down again (rank 0 to rank n - 1 crosses
    // every level), the buffer at the slowest link's rate, and the rest
    // waiting in the pipeline. The stream counts as one message.
    let start_s = start_at.iter().copied().fold(0.0, f64::max);
    let latency: f64 = if n > 1 {
        net.path(0, n - 1)
            .links()
            .iter()
            .map(|&l| net.links[l as usize].lat)
            .sum()
    } else {
        0.0
    };
    let slowest = tree
        .links()
        .iter()
        .map(|&l| degraded.links[l].bw)
        .fold(f64::INFINITY, f64::min);
    let latency_s = latency.min((done - start_s).max(0.0));
    let transmission_s = (total as f64 / slowest).min((done - start_s - latency_s).max(0.0));
    let critical_path = engine::CriticalPath {
        messages: 1,
        ranks: n as u64,
        // The reduction's result reaches every rank at once; rank 0 stands
        // for them.
        end_rank: 0,
        start_s,
        latency_s,
        transmission_s,
        queueing_s: (done - start_s - latency_s - transmission_s).max(0.0),
        compute_s: 0.0,
    };
    let trace = engine::Trace {
        time_s: done,
        timeline: p.hist.finish(done, &sizes),
        link_bytes: p.link_bytes,
        link_busy: p.link_busy,
        events: p.events,
        critical_path,
    };
    Ok(crate::summarize(
        Collective::AllReduce,
        n,
        bytes,
        &net,
        &trace,
    ))
}

/// The aggregation tree's links, by the network's layout (see
/// [`crate::network`]): `up[p]` = p, `down[p]` = n + p, and on a fat tree
/// `leaf-up[j]` = 2n + j, `leaf-down[j]` = 2n + l + j.
struct Tree {
    n: usize,
    leaf: usize,
    leaves: usize,
}

impl Tree {
    fn up(&self, pos: usize) -> usize {
        pos
    }
    fn down(&self, pos: usize) -> usize {
        self.n + pos
    }
    fn leaf_up(&self, j: usize) -> usize {
        2 * self.n + j
    }
    fn leaf_down(&self, j: usize) -> usize {
        2 * self.n + self.leaves + j
    }
    /// Every link the tree uses.
    fn links(&self) -> Vec<usize> {
        let mut v: Vec<usize> = (0..self.n)
            .flat_map(|p| [self.up(p), self.down(p)])
            .collect();
        if self.leaves > 1 {
            v.extend((0..self.leaves).flat_map(|j| [self.leaf_up(j), self.leaf_down(j)]));
        }
        debug_assert!(self.leaf * self.leaves == self.n);
        v
    }
}

/// Link state of one run: when each link is free, and what it carried.
struct Pipeline<'a> {
    net: &'a Network,
    /// Bandwidth every link is timed at when it is below the link's own
    /// (the ideal mode's tree-wide minimum; infinite in the contention mode).
    pace: f64,
    free: Vec<f64>,
    link_bytes: Vec<u64>,
    link_busy: Vec<f64>,
    hist: Histogram,
    events: u64,
}

impl Pipeline<'_> {
    /// A chunk of `cb` bytes leaves a rank on its port `link`, ready at
    /// `at`: its (start, end) there.
    fn first(&mut self, link: usize, at: f64, cb: u64) -> (f64, f64) {
        let dur = self.dur(link, cb);
        let start = at.max(self.free[link]);
        self.send(link, start, start + dur, cb)
    }

    /// The (head, tail) of the chunk a switch reduces from its children:
    /// each child link's (start, end) plus its latency, latest of each.
    fn gather(&self, children: impl Iterator<Item = (usize, (f64, f64))>) -> (f64, f64) {
        children.fold((0.0f64, 0.0f64), |(h, t), (l, (s, e))| {
            let lat = self.net.links[l].lat;
            (h.max(s + lat), t.max(e + lat))
        })
    }

    /// The switch sends a chunk of `cb` bytes whose head is in at `head`
    /// and tail at `tail` on `link` (cut-through, FIFO): its (start, end).
    fn forward(&mut self, link: usize, head: f64, tail: f64, cb: u64) -> (f64, f64) {
        let dur = self.dur(link, cb);
        let start = head.max(tail - dur).max(self.free[link]);
        self.send(link, start, (start + dur).max(tail), cb)
    }

    /// Seconds `cb` bytes take on `link` (at the pace, when that is lower).
    fn dur(&self, link: usize, cb: u64) -> f64 {
        cb as f64 / self.net.links[link].bw.min(self.pace)
    }

    /// Records a transmission of `cb` bytes on `link` from `start` that
    /// holds the link until `end` (a slow feeder's tail, or the ideal
    /// mode's pace); its (start, end).
    fn send(&mut self, link: usize, start: f64, end: f64, cb: u64) -> (f64, f64) {
        self.free[link] = end;
        self.link_bytes[link] += cb;
        // Busy for the bytes at the link's own rate, whatever the pace.
        let busy = cb as f64 / self.net.links[link].bw;
        self.link_busy[link] += busy;
        self.hist
            .add(self.net.links[link].class, start, start + busy, 1.0);
        self.events += 1;
        (start, end)
    }
}
