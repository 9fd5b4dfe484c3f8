//! The discrete-event engine: the plans of all ranks, message by message,
//! on a [`Network`].
//!
//! # Execution
//!
//! A rank runs its rounds in order. Entering a round it first reduces its
//! local [`Op::Reduce`] bytes (gamma per byte), then posts every send and
//! receive of the round. Messages between a pair of ranks match in plan order
//! (the k-th send from a to b is the k-th receive at b from a), and a message
//! moves once both ends are posted (rendezvous, as the cost model's walk and
//! the executor's round semantics have it). The round ends when all its sends
//! are delivered and all its receives have arrived and, for
//! [`Op::RecvReduce`], been reduced (gamma per byte, one reduction at a time
//! per rank). Local copies are free.
//!
//! Events sit in a binary heap ordered by (time, sequence number), so equal
//! times resolve in the order the events were created (except that message
//! starts come last at their instant, in plan order; see `Event`): a run is
//! deterministic, bit for bit.
//!
//! # Modes
//!
//! * [`Mode::Ideal`]: no contention in the network. A message of B bytes
//!   needs B / (the slowest bandwidth on its path) on its sender's port (the
//!   path's first link) and on its receiver's port (the last), each port a
//!   FIFO queue of whole messages in the order they became ready; it arrives
//!   the path's latency after both ports are through with it. A round whose
//!   messages are all ready together therefore costs latency + max(bytes
//!   sent, bytes received) / bandwidth, which is the alpha-beta charge of the
//!   cost model (`ferrocoll::cost::walk`) with o = 0.
//! * [`Mode::Contention`]: every link is a FIFO queue of 64 KiB chunks
//!   (the chunk size is [`SimOptions::chunk_bytes`]). A chunk occupies each
//!   link of its path for chunk / bandwidth. Switching is cut-through: the
//!   chunk may start on link k+1 at its start on link k plus link k's
//!   latency (if link k+1 is free); when link k+1 is faster than link k it
//!   starts just late enough to send the whole chunk at its own rate as the
//!   tail comes in (so a slow feeder never holds a fast link longer than the
//!   chunk's own transmission time), and it never finishes before its tail
//!   has arrived. The FIFO order on a link is the order in which chunks are
//!   ready to start on it. Buffers are unbounded (no backpressure). A
//!   message is delivered when its last chunk is.
//!
//!   FIFO per chunk rather than max-min fair sharing of each link's
//!   bandwidth among the flows crossing it: a FIFO queue is deterministic,
//!   needs one `free at` time per link and one event per chunk and hop
//!   (fair sharing re-solves the rates of all flows at every arrival and
//!   departure), and it behaves like the packet switches it models, which
//!   store and forward packets in order. At 64 KiB the chunks are small
//!   against the messages that make bandwidth matter, so long flows still
//!   interleave finely on shared links. A rank's own messages leave its port
//!   one after the other (the first message's chunks first), which is
//!   throughput-equivalent to interleaving them.
//!
//! # Scenarios
//!
//! [`SimOptions`] can perturb a run: a rank that starts its plan late
//! ([`SimOptions::start_delay`]), a rank that reduces slowly
//! ([`SimOptions::compute_slowdown`], a factor on gamma), and links that
//! run below their bandwidth or have failed ([`SimOptions::slow_links`]).
//! A failed link is checked before the run starts: if any message of the
//! plans crosses it, the run is an error naming the link (a message that
//! can never be delivered would otherwise hang its ranks).
//!
//! # Several groups at once
//!
//! [`run_groups`] runs the plans of several groups of ranks together on one
//! network ([`Group`]: group rank i is physical rank `ranks[i]`). Each group
//! advances through its own plans (as separate communicators on separate
//! streams would); the groups interact only through what they share: the
//! links (each a FIFO queue in both modes, the ports in the ideal mode) and
//! the reduction unit of a physical rank (one reduction at a time per
//! physical rank, whichever group it belongs to: a pessimistic model of two
//! reduction kernels on one GPU). Traffic, busy time and timelines are
//! recorded per group; the event count is the whole run's.
//!
//! # Timeline
//!
//! Every time a link transmits (for B / bandwidth seconds: a chunk in the
//! contention mode, a message in the ideal mode) the interval is added to a
//! histogram per link class. The histogram has [`TIMELINE_BUCKETS`] · 16
//! fine bins whose width doubles (merging neighbours) whenever a run
//! outgrows them, so its size is fixed however long the run is; at the end
//! it is folded into [`TIMELINE_BUCKETS`] buckets of equal width spanning
//! `[0, time_s]` (a fine bin that straddles two buckets is split in
//! proportion to its overlap, i.e. its busy time is taken as spread evenly
//! over it). A bucket's value is the busy time of the class's links in it
//! over the bucket's width times the number of links, so the buckets'
//! mean is the class's utilization over the whole run. In the contention
//! mode every link is a queue and the values lie in 0..=1; in the ideal mode
//! only the first and last link of a path queue messages, and a middle link
//! (a fat tree's leaf uplink) that is offered more than it can carry shows
//! values above 1, as its whole-run utilization does. The ideal mode places
//! a message's busy time on a middle link at the latest of its two port
//! start times.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::BinaryHeap;

use ferrocoll::plan::pairing::{Channel, Matcher, MessageTable};
use ferrocoll::plan::{Op, Plan};

use crate::network::Network;
use crate::symmetry::Symmetry;

/// How the network is modelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// No contention: messages serialize only on the sending and receiving
    /// ranks' ports; agrees with the alpha-beta cost model.
    Ideal,
    /// Every link is a FIFO queue of chunks.
    Contention,
}

/// Knobs of a simulation beyond the topology.
///
/// The default is the plain run: no reduction cost, 64 KiB chunks, no
/// scenario (every rank starts at 0 and reduces at gamma, every link at
/// its bandwidth).
#[derive(Clone, Debug, PartialEq)]
pub struct SimOptions {
    /// Seconds to reduce one byte (gamma); 0 makes reductions free.
    pub gamma: f64,
    /// Chunk size of the contention mode, in bytes (at least 1).
    pub chunk_bytes: u64,
    /// Stragglers: `(rank, d)` makes physical rank `rank` start its plan (in
    /// every group it belongs to) `d` seconds late (finite, at least 0).
    /// Several entries for one rank add up.
    pub start_delay: Vec<(usize, f64)>,
    /// Slow ranks: `(rank, f)` multiplies physical rank `rank`'s gamma (its
    /// local and received reductions) by `f` (finite, above 0). Several
    /// entries for one rank multiply. Has no effect while gamma is 0.
    pub compute_slowdown: Vec<(usize, f64)>,
    /// Slow or failed links: `(name, f)` divides the bandwidth of every link
    /// whose display name (as in `SimResult::hottest_link`, e.g.
    /// `nic-up[3]`, `leaf-up[0]`) or whose class (`leaf-up`) is `name` by
    /// `f` (above 0). `f64::INFINITY` marks the links failed: a run whose
    /// plans send a message across one is an error naming it. A name that
    /// matches no link is an error. Several entries for one link multiply.
    pub slow_links: Vec<(String, f64)>,
}

impl Default for SimOptions {
    /// gamma = 0, 64 KiB chunks, no scenario.
    fn default() -> SimOptions {
        SimOptions {
            gamma: 0.0,
            chunk_bytes: 64 << 10,
            start_delay: Vec::new(),
            compute_slowdown: Vec::new(),
            slow_links: Vec::new(),
        }
    }
}

/// Number of equal time buckets of [`Trace::timeline`] (and of
/// `SimResult::timeline`), spanning the run from 0 to its end.
pub const TIMELINE_BUCKETS: usize = 200;

/// Fine bins of the timeline histogram per class (see the module docs).
const FINE: usize = TIMELINE_BUCKETS * 16;

/// What a run measured, per link.
#[derive(Clone, Debug, PartialEq)]
pub struct Trace {
    /// When the last rank finished, in seconds.
    pub time_s: f64,
    /// Bytes that crossed each link (indexed like [`Network::links`]).
    pub link_bytes: Vec<u64>,
    /// Seconds each link spent transmitting (bytes / bandwidth).
    pub link_busy: Vec<f64>,
    /// Events processed.
    pub events: u64,
    /// Per link class (in [`Network::classes`] order), the utilization
    /// (busy time over time times the class's links) in each of
    /// [`TIMELINE_BUCKETS`] equal buckets of `[0, time_s]`; all zeros when
    /// no time passed. See the module docs.
    pub timeline: Vec<Vec<f64>>,
    /// What the run's time was spent on, along its critical path.
    pub critical_path: CriticalPath,
}

/// The chain of rounds and messages that determined a run's time, from
/// the rank that finished last back to the start, with the time split by
/// what it was spent on. The parts add up to the run's time.
///
/// The walk: a round ends when its last message completes. That message
/// started when both its ends were posted; if the peer posted later, the
/// path continues at the peer's round (the rank waited for it), else at
/// this rank's own. Before posting, a round reduces locally (compute);
/// before that, the previous round ran. A message's time from start to
/// arrival is its path's latency, the round's bytes (the larger of what
/// the rank sends and receives in it, as the alpha-beta model charges a
/// round) over the path's slowest link (transmission), and the rest:
/// waiting for links or ports that other ranks' traffic holds (queueing). A received reduction adds compute (including
/// any wait for the rank's reduction unit).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CriticalPath {
    /// Messages on the path.
    pub messages: u64,
    /// Distinct ranks the path visits.
    pub ranks: u64,
    /// Seconds before the path's first rank started (a straggler's delay).
    pub start_s: f64,
    /// Seconds of link latency.
    pub latency_s: f64,
    /// Seconds of transmission at the bottleneck bandwidth.
    pub transmission_s: f64,
    /// Seconds of waiting for links and ports held by other traffic.
    pub queueing_s: f64,
    /// Seconds of reduction.
    pub compute_s: f64,
}

/// The plans of one group of ranks for [`run_groups`].
#[derive(Clone, Copy)]
pub struct Group<'a> {
    /// Group rank i's plan; peers in it are group ranks.
    pub plans: Plans<'a>,
    /// `ranks[i]` is the physical rank (the network's) group rank i runs
    /// on; as many as `plans`, distinct.
    pub ranks: &'a [usize],
}

/// Where a group's plans come from.
#[derive(Clone, Copy)]
pub enum Plans<'a> {
    /// Built already: `plans[i]` is group rank i's.
    Given(&'a [Plan]),
    /// Built one at a time while the engine reads them, and dropped once
    /// read: the engine keeps only what it needs of each (peers, sizes,
    /// reductions), a fraction of a plan's memory (a 4,096-rank ring
    /// allreduce: 34 million rounds).
    Built {
        /// How many ranks.
        count: usize,
        /// Builds group rank i's plan.
        build: &'a dyn Fn(usize) -> Result<Plan, String>,
    },
}

impl<'a> Plans<'a> {
    /// How many plans.
    pub fn len(&self) -> usize {
        match self {
            Plans::Given(p) => p.len(),
            Plans::Built { count, .. } => *count,
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Group rank i's plan.
    fn get(&self, i: usize) -> Result<Cow<'a, Plan>, String> {
        match self {
            Plans::Given(p) => Ok(Cow::Borrowed(&p[i])),
            Plans::Built { build, .. } => build(i).map(Cow::Owned),
        }
    }
}

impl std::fmt::Debug for Group<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("plans", &self.plans.len())
            .field("ranks", &self.ranks)
            .finish()
    }
}

/// One message, matched.
struct Msg {
    src: u32,
    dst: u32,
    /// The physical rank the message travels to: `phys[dst]`, except in
    /// the aggregated mode, where `dst` is the representative of this rank.
    to: u32,
    bytes: u64,
    reduce: bool,
    /// Ends posted so far (0, 1 or 2).
    posted: u8,
    chunks_left: u32,
    /// Latest chunk arrival so far.
    done: f64,
    /// When both ends were posted.
    started: f64,
    /// Its slot in the receive id list (to find the receiver's round).
    recv_slot: u32,
}

/// A peer named by a plan, as the engine sees it.
struct Peer {
    /// The engine rank that runs its plan.
    engine: u32,
    /// The physical rank a message to it travels to.
    to: u32,
    /// Which of the ranks `engine` stands for (0 unless aggregated).
    offset: u32,
}

/// A receive awaiting its send: (slot in the receive id list, bytes, reduce?).
type PendingRecv = (u32, u64, bool);

/// A channel of the message table: (sending engine rank, receiving engine
/// rank, offset). The offset is 0 except in the aggregated mode, where it
/// tells apart the ranks a representative stands for (see
/// crate::symmetry).
///
/// The shared table ([`ferrocoll::plan::pairing`]) keeps the simulator's
/// lean ends (a `u32` message id per send, the receive's slot, bytes and
/// reduce flag per receive) in the same per-channel vectors of a `BTreeMap`
/// the engine kept before it was shared, so sharing costs neither memory nor
/// time on 16,384-rank plans.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Chan {
    src: u32,
    dst: u32,
    offset: u32,
}

impl Channel for Chan {
    fn src(&self) -> usize {
        self.src as usize
    }
    fn dst(&self) -> usize {
        self.dst as usize
    }
}

/// Writes the table's pairs into the message list: a receive learns its
/// message id, a message its receive slot and whether it is reduced.
struct Pairs<'m> {
    msgs: &'m mut [Msg],
    recv_ids: &'m mut [u32],
}

impl Matcher<Chan, u32, PendingRecv> for Pairs<'_> {
    fn sent_len(&self, &id: &u32) -> u64 {
        self.msgs[id as usize].bytes
    }
    fn expected_len(&self, recv: &PendingRecv) -> u64 {
        recv.1
    }
    fn matched(&mut self, _: Chan, _: usize, id: u32, (slot, _, reduce): PendingRecv) {
        let m = &mut self.msgs[id as usize];
        m.reduce = reduce;
        m.recv_slot = slot;
        self.recv_ids[slot as usize] = id;
    }
}

/// One round of one rank, as ranges into the message and receive lists
/// (`rounds` ends with a sentinel whose starts are the lists' lengths).
struct RoundInfo {
    /// Its first message id (a rank's sends are numbered in plan order, so
    /// the round's sends are ids `sends` up to the next round's `sends`).
    sends: u32,
    /// Its first slot in the receive id list (ends where the next round's
    /// begin).
    recvs: u32,
    local_reduce: u64,
    /// When the rank entered the round (began its local reductions).
    entered: f64,
    /// When it posted the round's messages.
    posted: f64,
    /// The message that completed last and so ended the round (`u32::MAX`
    /// when the round has none).
    last: u32,
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    /// A rank enters its current round's communication.
    Post { rank: u32 },
    /// Both ends of a message are posted: it starts moving.
    Start { msg: u32 },
    /// Chunk `chunk` reaches hop `hop` of its path; its tail left the
    /// previous link at `prev_end`.
    Hop {
        msg: u32,
        hop: u8,
        chunk: u32,
        bytes: u32,
        prev_end: f64,
    },
    /// A message has arrived (both ends may count it).
    Delivered { msg: u32 },
    /// The receiver has finished reducing a message.
    Reduced { msg: u32 },
}

/// An event; the heap pops the smallest (time, phase, tie) first.
///
/// At one instant every other event (phase 0, in creation order: `tie` is a
/// sequence number) comes before the message starts (phase 1, in message id
/// order: `tie` is the id, and ids number each rank's sends in plan order).
/// So a rank's messages that become ready at the same time leave its port
/// in plan order, whichever partner happened to post first: a direct
/// all-to-all sends to r+1, r+2, ... as planned instead of every rank
/// sending to rank 0 first.
struct Event {
    time: f64,
    phase: u8,
    tie: u64,
    kind: Kind,
}

impl PartialEq for Event {
    fn eq(&self, o: &Event) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, o: &Event) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Event {
    /// Reversed, so that the max-heap pops the earliest event first.
    fn cmp(&self, o: &Event) -> Ordering {
        o.time
            .total_cmp(&self.time)
            .then_with(|| o.phase.cmp(&self.phase))
            .then_with(|| o.tie.cmp(&self.tie))
    }
}

/// The timeline histogram of one group: per class, [`FINE`] bins of
/// `width` seconds (0 until the first interval).
pub(crate) struct Histogram {
    width: f64,
    bins: Vec<f64>,
}

impl Histogram {
    pub(crate) fn new(classes: usize) -> Histogram {
        Histogram {
            width: 0.0,
            bins: vec![0.0; classes * FINE],
        }
    }

    /// Adds busy time over `[s, e]`, `weight` times, to class `class`.
    pub(crate) fn add(&mut self, class: usize, s: f64, e: f64, weight: f64) {
        if e <= s || !e.is_finite() {
            return;
        }
        if self.width == 0.0 {
            self.width = e / FINE as f64;
        }
        while e > self.width * FINE as f64 {
            // Twice as wide: merge neighbouring bins.
            for row in self.bins.chunks_mut(FINE) {
                for i in 0..FINE / 2 {
                    row[i] = row[2 * i] + row[2 * i + 1];
                }
                row[FINE / 2..].fill(0.0);
            }
            self.width *= 2.0;
        }
        let w = self.width;
        let row = &mut self.bins[class * FINE..(class + 1) * FINE];
        let first = ((s / w) as usize).min(FINE - 1);
        let last = ((e / w) as usize).min(FINE - 1);
        if first == last {
            row[first] += (e - s) * weight;
            return;
        }
        row[first] += ((first + 1) as f64 * w - s) * weight;
        for b in &mut row[first + 1..last] {
            *b += w * weight;
        }
        row[last] += (e - last as f64 * w) * weight;
    }

    /// [`TIMELINE_BUCKETS`] utilizations per class over `[0, t]`;
    /// `sizes[c]` is the number of links of class c.
    pub(crate) fn finish(&self, t: f64, sizes: &[usize]) -> Vec<Vec<f64>> {
        let nb = TIMELINE_BUCKETS;
        let cw = t / nb as f64;
        sizes
            .iter()
            .enumerate()
            .map(|(c, &size)| {
                let mut out = vec![0.0; nb];
                if t.is_nan() || t <= 0.0 || self.width == 0.0 {
                    return out;
                }
                let w = self.width;
                for (i, &v) in self.bins[c * FINE..(c + 1) * FINE].iter().enumerate() {
                    if v == 0.0 {
                        continue;
                    }
                    let (a, hi) = (i as f64 * w, ((i + 1) as f64 * w).min(t));
                    if hi <= a {
                        out[nb - 1] += v;
                        continue;
                    }
                    let j0 = ((a / cw) as usize).min(nb - 1);
                    let j1 = ((hi / cw) as usize).min(nb - 1);
                    for (j, o) in out.iter_mut().enumerate().take(j1 + 1).skip(j0) {
                        let lo = a.max(j as f64 * cw);
                        let up = if j == nb - 1 {
                            hi
                        } else {
                            hi.min((j + 1) as f64 * cw)
                        };
                        if up > lo {
                            *o += v * (up - lo) / (hi - a);
                        }
                    }
                }
                let cap = cw * size.max(1) as f64;
                // Rounding leaves a full bucket a few ulps above 1.
                out.iter_mut().for_each(|o| {
                    *o /= cap;
                    if *o > 1.0 && *o < 1.0 + 1e-9 {
                        *o = 1.0;
                    }
                });
                out
            })
            .collect()
    }
}

struct Engine<'a> {
    net: Cow<'a, Network>,
    mode: Mode,
    chunk_bytes: u64,
    msgs: Vec<Msg>,
    rounds: Vec<RoundInfo>,
    /// rank -> index of its first round in `rounds`; n + 1 entries.
    first_round: Vec<usize>,
    recv_ids: Vec<u32>,
    /// Per rank: index of the current round in `rounds`.
    cur: Vec<usize>,
    pending: Vec<u32>,
    /// Engine ranks (the groups' ranks one after the other) -> physical rank.
    phys: Vec<u32>,
    /// Engine rank -> its group.
    group_of: Vec<u32>,
    /// Group -> its first engine rank; groups + 1 entries.
    group_first: Vec<usize>,
    /// Per engine rank: seconds per reduced byte.
    gamma: Vec<f64>,
    /// Per engine rank: when it starts its plan.
    start_at: Vec<f64>,
    /// Per physical rank: when its reduction unit is free.
    compute_free: Vec<f64>,
    finish: Vec<f64>,
    /// Per queue: when it is free. A queue per link, except in the
    /// aggregated mode: one per orbit of links (see `queue_of`).
    link_free: Vec<f64>,
    /// Aggregated mode: link -> the representative link whose queue, busy
    /// time and traffic stand for it; `None` otherwise (every link its own).
    queue_of: Option<Vec<u32>>,
    /// How many links each queue stands for (1, or the symmetry's copies).
    weight: f64,
    /// Per group, per link (group * links + link).
    link_bytes: Vec<u64>,
    link_busy: Vec<f64>,
    hist: Vec<Histogram>,
    heap: BinaryHeap<Event>,
    seq: u64,
}

/// Runs `plans` (`plans[r]` is rank r's) with elements of `elem_size` bytes
/// on `net`. Fails when the plans do not fit together (a message sent and
/// never received or the reverse, sizes that differ, a peer outside the
/// group, a deadlock), do not match the network's size, or `opts` is
/// invalid or sends a message over a failed link.
pub fn run(
    plans: &[Plan],
    elem_size: usize,
    net: &Network,
    mode: Mode,
    opts: &SimOptions,
) -> Result<Trace, String> {
    let n = plans.len();
    if n != net.ranks() {
        return Err(format!("{n} plans for a network of {} ranks", net.ranks()));
    }
    let ranks: Vec<usize> = (0..n).collect();
    let group = Group {
        plans: Plans::Given(plans),
        ranks: &ranks,
    };
    let mut traces = run_groups(&[group], elem_size, net, mode, opts)?;
    Ok(traces.remove(0))
}

/// Runs the plans of several groups together on `net`, all from t = 0,
/// sharing its links (see the module docs); one [`Trace`] per group with
/// its own finish time, traffic and timeline (the event count is the whole
/// run's). Fails like [`run`], or when a group's ranks are not distinct
/// physical ranks of the network, one per plan.
pub fn run_groups(
    groups: &[Group<'_>],
    elem_size: usize,
    net: &Network,
    mode: Mode,
    opts: &SimOptions,
) -> Result<Vec<Trace>, String> {
    let p = net.ranks();
    for (g, group) in groups.iter().enumerate() {
        if group.plans.len() != group.ranks.len() {
            return Err(format!(
                "group {g} has {} plans for {} ranks",
                group.plans.len(),
                group.ranks.len()
            ));
        }
        let mut seen = vec![false; p];
        for &r in group.ranks {
            if r >= p {
                return Err(format!(
                    "group {g} names rank {r} outside the network of {p} ranks"
                ));
            }
            if std::mem::replace(&mut seen[r], true) {
                return Err(format!("group {g} names rank {r} twice"));
            }
        }
    }
    let (net, failed) = degrade(net, &opts.slow_links)?;
    let mut e = Engine::new(groups, elem_size, net, mode, opts, None)?;
    if !failed.is_empty() {
        e.check_failed(&failed)?;
    }
    e.run()
}

/// Checks `opts`, and returns per physical rank of a network of `p` the
/// start delay and the factor on gamma that it asks for.
fn per_rank(opts: &SimOptions, p: usize) -> Result<(Vec<f64>, Vec<f64>), String> {
    if opts.chunk_bytes == 0 || opts.chunk_bytes > u64::from(u32::MAX) {
        return Err(format!(
            "chunk size {} is not between 1 byte and 4 GiB",
            opts.chunk_bytes
        ));
    }
    if !(opts.gamma.is_finite() && opts.gamma >= 0.0) {
        return Err(format!("gamma {} is not a time per byte", opts.gamma));
    }
    let mut delay = vec![0.0f64; p];
    for &(r, d) in &opts.start_delay {
        if r >= p || !(d.is_finite() && d >= 0.0) {
            return Err(format!(
                "start delay ({r}, {d}): need a rank below {p} and a finite delay of at least 0 s"
            ));
        }
        delay[r] += d;
    }
    let mut slow = vec![1.0f64; p];
    for &(r, f) in &opts.compute_slowdown {
        if r >= p || !(f.is_finite() && f > 0.0) {
            return Err(format!(
                "compute slowdown ({r}, {f}): need a rank below {p} and a finite factor above 0"
            ));
        }
        slow[r] *= f;
    }
    Ok((delay, slow))
}

/// Runs the aggregated mode: `reps[a]` is the plan of representative a of
/// `sym` (a in `0..sym.period`), which the caller has checked against the
/// other ranks' plans ([`crate::symmetry::check_plans`]); the network must
/// admit `sym`. Only the representatives are simulated (see
/// [`crate::symmetry`] for why that is exact); the [`Trace`] is the full
/// run's, link for link, except `events`, which counts the events the
/// quotient run processed. Scenarios that single out ranks or links
/// (stragglers, slow ranks, a slow link named by index) break the
/// symmetry and are errors; a slow or failed link class is allowed.
pub fn run_aggregated(
    reps: &[Plan],
    sym: &Symmetry,
    elem_size: usize,
    net: &Network,
    mode: Mode,
    opts: &SimOptions,
) -> Result<Trace, String> {
    if reps.len() != sym.period || sym.ranks != net.ranks() || !net.admits(sym) {
        return Err(format!(
            "{} plans and the symmetry {sym} do not fit a network of {} ranks",
            reps.len(),
            net.ranks()
        ));
    }
    if !opts.start_delay.is_empty() || !opts.compute_slowdown.is_empty() {
        return Err(
            "stragglers and slow ranks single out ranks: they cannot be aggregated; run without aggregation"
                .to_string(),
        );
    }
    if let Some((name, _)) = opts
        .slow_links
        .iter()
        .find(|(name, _)| !net.classes.contains(name))
    {
        return Err(format!(
            "slow link {name} singles out one link: only a whole class (e.g. {}) can be slowed in the aggregated mode; run without aggregation",
            net.classes[0]
        ));
    }
    let ranks: Vec<usize> = (0..sym.period).collect();
    let groups = [Group {
        plans: Plans::Given(reps),
        ranks: &ranks,
    }];
    let (net, failed) = degrade(net, &opts.slow_links)?;
    let mut e = Engine::new(&groups, elem_size, net, mode, opts, Some(sym))?;
    if !failed.is_empty() {
        e.check_failed(&failed)?;
    }
    let mut traces = e.run()?;
    Ok(traces.remove(0))
}

/// `net` with `slow` applied, and which links have failed (empty when
/// none).
pub(crate) fn degrade<'a>(
    net: &'a Network,
    slow: &[(String, f64)],
) -> Result<(Cow<'a, Network>, Vec<bool>), String> {
    if slow.is_empty() {
        return Ok((Cow::Borrowed(net), Vec::new()));
    }
    let mut owned = net.clone();
    let mut failed = vec![false; net.links.len()];
    let names: Vec<String> = (0..net.links.len()).map(|i| net.link_name(i)).collect();
    for (name, f) in slow {
        if f.is_nan() || *f <= 0.0 {
            return Err(format!(
                "slow link {name}: factor {f} must be above 0 (inf for a failed link)"
            ));
        }
        let mut any = false;
        for (i, link) in owned.links.iter_mut().enumerate() {
            if names[i] == *name || net.classes[link.class] == *name {
                any = true;
                if f.is_infinite() {
                    failed[i] = true;
                } else {
                    link.bw /= f;
                }
            }
        }
        if !any {
            return Err(format!(
                "slow link {name}: no link or link class of that name (classes: {}; links are named like {})",
                net.classes.join(", "),
                names.first().map_or("up[0]", String::as_str)
            ));
        }
    }
    Ok((Cow::Owned(owned), failed))
}

impl<'a> Engine<'a> {
    fn new(
        groups: &[Group<'_>],
        elem_size: usize,
        net: Cow<'a, Network>,
        mode: Mode,
        opts: &SimOptions,
        quotient: Option<&Symmetry>,
    ) -> Result<Engine<'a>, String> {
        let (delay, slow) = per_rank(opts, net.ranks())?;
        let elem = elem_size as u64;
        let mut phys = Vec::new();
        let mut group_of = Vec::new();
        let mut group_first = vec![0];
        for (g, group) in groups.iter().enumerate() {
            phys.extend(group.ranks.iter().map(|&r| r as u32));
            group_of.extend(group.ranks.iter().map(|_| g as u32));
            group_first.push(phys.len());
        }
        let n = phys.len();
        let single = groups.len() == 1;
        // How errors name an engine rank: by its rank in its group.
        let who = |v: usize| {
            let g = group_of[v] as usize;
            let r = v - group_first[g];
            if single {
                format!("rank {r}")
            } else {
                format!("group {g} rank {r}")
            }
        };
        let mut msgs: Vec<Msg> = Vec::new();
        let mut rounds = Vec::new();
        let mut first_round = Vec::with_capacity(n + 1);
        let mut recv_ids: Vec<u32> = Vec::new();
        // The message table: sends are message ids, receives
        // (recv slot, bytes, reduce), by channel in plan order.
        let mut table: MessageTable<Chan, u32, PendingRecv> = MessageTable::new("bytes");
        for (g, group) in groups.iter().enumerate() {
            let (base, size) = (group_first[g], group.plans.len());
            // A peer of the plans: the engine rank that plays it, the
            // physical rank it is, and the offset of its message channel
            // as seen by the sender (`send`) or the receiver.
            let check_peer = |rank: usize, peer: usize, send: bool| {
                let size = quotient.map_or(size, |q| q.ranks);
                if peer >= size {
                    return Err(format!(
                        "{} names peer {peer} outside the group of {size}",
                        who(base + rank)
                    ));
                }
                Ok(match quotient {
                    None => Peer {
                        engine: (base + peer) as u32,
                        to: group.ranks[peer] as u32,
                        offset: 0,
                    },
                    Some(q) => {
                        let j = q.index(peer);
                        Peer {
                            engine: q.rep(peer) as u32,
                            to: peer as u32,
                            offset: if send { j } else { q.inverse(j) } as u32,
                        }
                    }
                })
            };
            for local in 0..size {
                let plan = group.plans.get(local)?;
                let rank = base + local;
                first_round.push(rounds.len());
                for round in &plan.rounds {
                    let (s0, r0) = (msgs.len() as u32, recv_ids.len() as u32);
                    let mut local_reduce = 0u64;
                    for op in &round.ops {
                        match *op {
                            Op::Send { peer, src } => {
                                let peer = check_peer(local, peer, true)?;
                                let id = u32::try_from(msgs.len())
                                    .map_err(|_| "more than 2^32 messages".to_string())?;
                                msgs.push(Msg {
                                    src: rank as u32,
                                    dst: peer.engine,
                                    to: peer.to,
                                    bytes: src.len as u64 * elem,
                                    reduce: false,
                                    posted: 0,
                                    chunks_left: 0,
                                    done: 0.0,
                                    started: 0.0,
                                    recv_slot: u32::MAX,
                                });
                                table.send(
                                    Chan {
                                        src: rank as u32,
                                        dst: peer.engine,
                                        offset: peer.offset,
                                    },
                                    id,
                                );
                            }
                            Op::Recv { peer, dst } | Op::RecvReduce { peer, dst, .. } => {
                                let peer = check_peer(local, peer, false)?;
                                let reduce = matches!(op, Op::RecvReduce { .. });
                                let chan = Chan {
                                    src: peer.engine,
                                    dst: rank as u32,
                                    offset: peer.offset,
                                };
                                table.recv(
                                    chan,
                                    (recv_ids.len() as u32, dst.len as u64 * elem, reduce),
                                );
                                recv_ids.push(u32::MAX);
                            }
                            Op::Reduce { dst, .. } => local_reduce += dst.len as u64 * elem,
                            Op::Copy { .. } => {}
                        }
                    }
                    rounds.push(RoundInfo {
                        sends: s0,
                        recvs: r0,
                        local_reduce,
                        entered: 0.0,
                        posted: 0.0,
                        last: u32::MAX,
                    });
                }
            }
        }
        first_round.push(rounds.len());
        // The sentinel: where the last round's sends and receives end.
        rounds.push(RoundInfo {
            sends: msgs.len() as u32,
            recvs: recv_ids.len() as u32,
            local_reduce: 0,
            entered: 0.0,
            posted: 0.0,
            last: u32::MAX,
        });
        table
            .pair(&mut Pairs {
                msgs: &mut msgs,
                recv_ids: &mut recv_ids,
            })
            .map_err(|e| e.describe(who))?;
        let links = net.links.len();
        let classes = net.classes.len();
        let gamma = phys
            .iter()
            .map(|&r| opts.gamma * slow[r as usize])
            .collect();
        let start_at = phys.iter().map(|&r| delay[r as usize]).collect();
        Ok(Engine {
            mode,
            chunk_bytes: opts.chunk_bytes,
            msgs,
            cur: first_round[..n].to_vec(),
            rounds,
            first_round,
            recv_ids,
            pending: vec![0; n],
            compute_free: vec![0.0; net.ranks()],
            finish: vec![0.0; n],
            link_free: vec![0.0; links],
            queue_of: quotient.map(|q| net.link_reps(q)),
            weight: quotient.map_or(1.0, |q| q.copies() as f64),
            link_bytes: vec![0; links * groups.len()],
            link_busy: vec![0.0; links * groups.len()],
            hist: (0..groups.len()).map(|_| Histogram::new(classes)).collect(),
            heap: BinaryHeap::new(),
            seq: 0,
            phys,
            group_of,
            group_first,
            gamma,
            start_at,
            net,
        })
    }

    /// Fails naming the first failed link (in message order) that a
    /// message needs.
    fn check_failed(&self, failed: &[bool]) -> Result<(), String> {
        for m in &self.msgs {
            let (a, b) = (self.phys[m.src as usize], m.to);
            let path = self.net.path(a as usize, b as usize);
            if let Some(&l) = path.links().iter().find(|&&l| failed[l as usize]) {
                return Err(format!(
                    "link {} has failed: rank {a} sends {} bytes to rank {b} across it",
                    self.net.link_name(l as usize),
                    m.bytes
                ));
            }
        }
        Ok(())
    }

    /// Charges `busy` seconds and `bytes` on link `link` from `start` to
    /// the group of engine rank `rank`.
    ///
    /// In the aggregated mode the charge goes to the link's representative
    /// and counts `weight` times in the timeline (the orbit's links are all
    /// busy alike).
    fn account(&mut self, rank: usize, link: usize, start: f64, busy: f64, bytes: u64) {
        let g = self.group_of[rank] as usize;
        let i = g * self.net.links.len() + self.queue(link as u32);
        self.link_bytes[i] += bytes;
        self.link_busy[i] += busy;
        let class = self.net.links[link].class;
        self.hist[g].add(class, start, start + busy, self.weight);
    }

    /// The queue of link `link` (itself, or its orbit's representative).
    fn queue(&self, link: u32) -> usize {
        match &self.queue_of {
            None => link as usize,
            Some(q) => q[link as usize] as usize,
        }
    }

    fn push(&mut self, time: f64, kind: Kind) {
        let (phase, tie) = match kind {
            Kind::Start { msg } => (1, u64::from(msg)),
            _ => {
                self.seq += 1;
                (0, self.seq)
            }
        };
        self.heap.push(Event {
            time,
            phase,
            tie,
            kind,
        });
    }

    fn run(&mut self) -> Result<Vec<Trace>, String> {
        let n = self.first_round.len() - 1;
        for rank in 0..n {
            self.enter_round(rank, self.start_at[rank]);
        }
        let mut events = 0u64;
        while let Some(ev) = self.heap.pop() {
            events += 1;
            let now = ev.time;
            match ev.kind {
                Kind::Post { rank } => self.post(rank as usize, now),
                Kind::Start { msg } => self.start(msg, now),
                Kind::Hop {
                    msg,
                    hop,
                    chunk,
                    bytes,
                    prev_end,
                } => {
                    if hop == 1 {
                        // The next chunk follows this one on the port.
                        self.release_chunk(msg, chunk + 1, prev_end);
                    }
                    self.hop(
                        msg,
                        usize::from(hop),
                        chunk,
                        u64::from(bytes),
                        prev_end,
                        now,
                    )
                }
                Kind::Delivered { msg } => {
                    let (src, dst, bytes, reduce) = {
                        let m = &self.msgs[msg as usize];
                        (m.src as usize, m.dst as usize, m.bytes, m.reduce)
                    };
                    self.msgs[msg as usize].done = now;
                    self.complete_one(src, now, msg);
                    let (gamma, unit) = (self.gamma[dst], self.phys[dst] as usize);
                    if reduce && gamma > 0.0 && bytes > 0 {
                        let start = now.max(self.compute_free[unit]);
                        let end = start + gamma * bytes as f64;
                        self.compute_free[unit] = end;
                        self.push(end, Kind::Reduced { msg });
                    } else {
                        self.complete_one(dst, now, msg);
                    }
                }
                Kind::Reduced { msg } => {
                    let dst = self.msgs[msg as usize].dst as usize;
                    self.complete_one(dst, now, msg);
                }
            }
        }
        let groups = self.group_first.len() - 1;
        if let Some(rank) = (0..n).find(|&r| self.cur[r] < self.first_round[r + 1]) {
            let g = self.group_of[rank] as usize;
            let prefix = if groups == 1 {
                String::new()
            } else {
                format!("group {g} ")
            };
            return Err(format!(
                "deadlock: {prefix}rank {} never finishes round {} of its plan",
                rank - self.group_first[g],
                self.cur[rank] - self.first_round[rank]
            ));
        }
        let links = self.net.links.len();
        let sizes: Vec<usize> = (0..self.net.classes.len())
            .map(|c| self.net.class_size(c))
            .collect();
        Ok((0..groups)
            .map(|g| {
                let ranks = self.group_first[g]..self.group_first[g + 1];
                let time_s = self.finish[ranks].iter().copied().fold(0.0, f64::max);
                // Every link reports its queue's figures (in the
                // aggregated mode, its orbit representative's).
                let per_link = |v: &[u64]| -> Vec<u64> {
                    (0..links)
                        .map(|l| v[g * links + self.queue(l as u32)])
                        .collect()
                };
                let busy = (0..links)
                    .map(|l| self.link_busy[g * links + self.queue(l as u32)])
                    .collect();
                Trace {
                    time_s,
                    link_bytes: per_link(&self.link_bytes),
                    link_busy: busy,
                    events,
                    timeline: self.hist[g].finish(time_s, &sizes),
                    critical_path: self.critical_path(g),
                }
            })
            .collect())
    }

    /// The critical path of group `g` (see [`CriticalPath`]).
    fn critical_path(&self, g: usize) -> CriticalPath {
        let (lo, hi) = (self.group_first[g], self.group_first[g + 1]);
        let mut cp = CriticalPath::default();
        // The first of the ranks that finished last.
        let Some(mut x) = (lo..hi).reduce(|a, b| {
            if self.finish[b] > self.finish[a] {
                b
            } else {
                a
            }
        }) else {
            return cp;
        };
        let mut seen = vec![false; hi - lo];
        // Invariant: round k - 1 of rank x ended at `end`.
        let mut k = self.first_round[x + 1];
        let mut end = self.finish[x];
        loop {
            if !std::mem::replace(&mut seen[x - lo], true) {
                cp.ranks += 1;
            }
            if k == self.first_round[x] {
                cp.start_s = end;
                return cp;
            }
            let round = &self.rounds[k - 1];
            // Where the round's communication began, and the round (of x,
            // or of the peer x waited for) whose local part came before.
            let (mut from, mut at) = (round.posted, (x, k - 1));
            if round.last != u32::MAX {
                let id = round.last;
                let m = &self.msgs[id as usize];
                cp.messages += 1;
                // A received reduction finishes after the arrival.
                cp.compute_s += end - m.done;
                let path = self
                    .net
                    .path(self.phys[m.src as usize] as usize, m.to as usize);
                let (mut lat, mut bw) = (0.0f64, f64::INFINITY);
                for &l in path.links() {
                    lat += self.net.links[l as usize].lat;
                    bw = bw.min(self.net.links[l as usize].bw);
                }
                // The round moves max(sent, received) through this rank's
                // port, as the alpha-beta model charges it: that much is
                // transmission, even when this message waited behind the
                // rank's own others.
                let sent: u64 = self.sends(k - 1).map(|i| self.msgs[i as usize].bytes).sum();
                let received: u64 = self
                    .recvs(k - 1)
                    .map(|i| self.msgs[self.recv_ids[i as usize] as usize].bytes)
                    .sum();
                let net = m.done - m.started;
                let lat = lat.min(net);
                let tx = (sent.max(received) as f64 / bw).min(net - lat);
                cp.latency_s += lat;
                cp.transmission_s += tx;
                cp.queueing_s += net - lat - tx;
                let (peer, peer_round) = if x == m.src as usize {
                    let r = self.round_of_recv(m.dst as usize, m.recv_slot);
                    (m.dst as usize, r)
                } else {
                    (m.src as usize, self.round_of_send(m.src as usize, id))
                };
                // The message started when its later end posted.
                from = m.started;
                if self.rounds[peer_round].posted > round.posted {
                    at = (peer, peer_round);
                }
            }
            let entered = self.rounds[at.1].entered;
            cp.compute_s += from - entered;
            end = entered;
            x = at.0;
            k = at.1;
        }
    }

    /// The message ids round `k` sends.
    fn sends(&self, k: usize) -> std::ops::Range<u32> {
        self.rounds[k].sends..self.rounds[k + 1].sends
    }

    /// The slots in the receive id list of round `k`'s receives.
    fn recvs(&self, k: usize) -> std::ops::Range<u32> {
        self.rounds[k].recvs..self.rounds[k + 1].recvs
    }

    /// The round of `rank` that sends message `id`.
    fn round_of_send(&self, rank: usize, id: u32) -> usize {
        let rounds = &self.rounds[self.first_round[rank]..self.first_round[rank + 1]];
        self.first_round[rank] + rounds.partition_point(|r| r.sends <= id) - 1
    }

    /// The round of `rank` whose receive has slot `slot`.
    fn round_of_recv(&self, rank: usize, slot: u32) -> usize {
        let rounds = &self.rounds[self.first_round[rank]..self.first_round[rank + 1]];
        self.first_round[rank] + rounds.partition_point(|r| r.recvs <= slot) - 1
    }

    /// Rank `rank` starts round `self.cur[rank]` (or finishes) at `now`.
    fn enter_round(&mut self, rank: usize, now: f64) {
        let k = self.cur[rank];
        if k == self.first_round[rank + 1] {
            self.finish[rank] = now;
            return;
        }
        self.rounds[k].entered = now;
        let local = self.rounds[k].local_reduce;
        let (gamma, unit) = (self.gamma[rank], self.phys[rank] as usize);
        let mut t = now;
        if local > 0 && gamma > 0.0 {
            t = now.max(self.compute_free[unit]) + gamma * local as f64;
            self.compute_free[unit] = t;
        }
        self.push(t, Kind::Post { rank: rank as u32 });
    }

    fn post(&mut self, rank: usize, now: f64) {
        let k = self.cur[rank];
        self.rounds[k].posted = now;
        let (sends, recvs) = (self.sends(k), self.recvs(k));
        self.pending[rank] = sends.len() as u32 + recvs.len() as u32;
        if self.pending[rank] == 0 {
            self.cur[rank] += 1;
            self.enter_round(rank, now);
            return;
        }
        for id in sends {
            self.post_end(id, now);
        }
        for i in recvs {
            let id = self.recv_ids[i as usize];
            self.post_end(id, now);
        }
    }

    fn post_end(&mut self, id: u32, now: f64) {
        let m = &mut self.msgs[id as usize];
        m.posted += 1;
        if m.posted == 2 {
            m.started = now;
            self.push(now, Kind::Start { msg: id });
        }
    }

    /// Message `msg`, one of `rank`'s outstanding messages of the current
    /// round, is done.
    fn complete_one(&mut self, rank: usize, now: f64, msg: u32) {
        self.pending[rank] -= 1;
        if self.pending[rank] == 0 {
            self.rounds[self.cur[rank]].last = msg;
            self.cur[rank] += 1;
            self.enter_round(rank, now);
        }
    }

    /// Both ends of message `id` are posted: it starts moving at `now`.
    fn start(&mut self, id: u32, now: f64) {
        let (src, to, bytes) = {
            let m = &self.msgs[id as usize];
            (m.src as usize, m.to as usize, m.bytes)
        };
        let path = self.net.path(self.phys[src] as usize, to);
        let links = path.links();
        if links.is_empty() {
            self.push(now, Kind::Delivered { msg: id });
            return;
        }
        match self.mode {
            Mode::Ideal => {
                let mut bw = f64::INFINITY;
                let mut lat = 0.0;
                for &l in links {
                    let link = &self.net.links[l as usize];
                    bw = bw.min(link.bw);
                    lat += link.lat;
                }
                let dur = bytes as f64 / bw;
                let (first, last) = (self.queue(links[0]), self.queue(links[links.len() - 1]));
                let end_out = now.max(self.link_free[first]) + dur;
                self.link_free[first] = end_out;
                // A one-link path (neighbours on a ring) has one queue.
                let end_in = if last == first {
                    end_out
                } else {
                    now.max(self.link_free[last]) + dur
                };
                self.link_free[last] = end_in;
                let mid = end_out.max(end_in) - dur;
                for (k, &l) in links.iter().enumerate() {
                    let at = if k == 0 {
                        end_out - dur
                    } else if k + 1 == links.len() {
                        end_in - dur
                    } else {
                        mid
                    };
                    let busy = bytes as f64 / self.net.links[l as usize].bw;
                    self.account(src, l as usize, at, busy, bytes);
                }
                self.push(end_out.max(end_in) + lat, Kind::Delivered { msg: id });
            }
            Mode::Contention => {
                let chunk = self.chunk_bytes;
                let nchunks = bytes.div_ceil(chunk).max(1);
                {
                    let m = &mut self.msgs[id as usize];
                    m.chunks_left = u32::try_from(nchunks).unwrap_or(u32::MAX);
                    m.done = now;
                }
                // The first link is the sender's own port: its queue only
                // ever receives this rank's messages, in the order they
                // become ready, so the chunks are laid out on it at once,
                // back to back. Their events on the next hop are released
                // one at a time (`release_chunk`), each when the previous
                // one gets there: the heap then holds a few events per
                // message in flight rather than one per chunk, which at
                // 16,384 ranks of 1,024 chunks each is what made every heap
                // operation a cache miss.
                let q0 = self.queue(links[0]);
                let bw = self.net.links[links[0] as usize].bw;
                let start = now.max(self.link_free[q0]);
                self.link_free[q0] = start + bytes as f64 / bw;
                self.account(src, links[0] as usize, start, bytes as f64 / bw, bytes);
                if links.len() == 1 {
                    // Its last chunk arrives last.
                    let lat = self.net.links[links[0] as usize].lat;
                    self.msgs[id as usize].chunks_left = 1;
                    self.arrive(id, start + bytes as f64 / bw + lat);
                } else {
                    self.release_chunk(id, 0, start);
                }
            }
        }
    }

    /// Chunk `c` of message `id`, whose path has two links or more, is on
    /// the sender's port from `start` (laid out by [`Engine::start`]):
    /// schedules its arrival at the next hop. Nothing when the message has
    /// fewer chunks.
    fn release_chunk(&mut self, id: u32, c: u32, start: f64) {
        let chunk = self.chunk_bytes;
        let m = &self.msgs[id as usize];
        let (src, to, bytes) = (m.src as usize, m.to as usize, m.bytes);
        let nchunks = bytes.div_ceil(chunk).max(1);
        if u64::from(c) >= nchunks {
            return;
        }
        let path = self.net.path(self.phys[src] as usize, to);
        let links = path.links();
        let link = &self.net.links[links[0] as usize];
        let (bw, lat) = (link.bw, link.lat);
        let c = u64::from(c);
        let cb = chunk.min(bytes - (c * chunk).min(bytes));
        let end = start + cb as f64 / bw;
        let next = self.ready_on(links[1], cb, start, end, lat);
        self.push(
            next,
            Kind::Hop {
                msg: id,
                hop: 1,
                chunk: c as u32,
                bytes: cb as u32,
                prev_end: end,
            },
        );
    }

    /// Chunk `chunk` (of `bytes`) of message `id` reaches hop `hop` at
    /// `now`.
    fn hop(&mut self, id: u32, hop: usize, chunk: u32, bytes: u64, prev_end: f64, now: f64) {
        let src = self.msgs[id as usize].src as usize;
        let to = self.msgs[id as usize].to as usize;
        let path = self.net.path(self.phys[src] as usize, to);
        let links = path.links();
        let (prev, l) = (links[hop - 1] as usize, links[hop] as usize);
        let q = self.queue(links[hop]);
        let link = &self.net.links[l];
        let (bw, lat) = (link.bw, link.lat);
        let start = now.max(self.link_free[q]);
        // Cut-through: the tail cannot leave before it has come in.
        let end = (start + bytes as f64 / bw).max(prev_end + self.net.links[prev].lat);
        self.link_free[q] = end;
        self.account(src, l, start, bytes as f64 / bw, bytes);
        if hop + 1 == links.len() {
            self.arrive(id, end + lat);
        } else {
            let next = self.ready_on(links[hop + 1], bytes, start, end, lat);
            self.push(
                next,
                Kind::Hop {
                    msg: id,
                    hop: (hop + 1) as u8,
                    chunk,
                    bytes: bytes as u32,
                    prev_end: end,
                },
            );
        }
    }

    /// When a chunk of `bytes` that occupies a link over `[start, end]`,
    /// whose latency is `lat`, can start on the next link `next`: its head
    /// is there at `start + lat` (cut-through), but a faster next link only
    /// starts once it can send the whole chunk at its own rate without
    /// running out of data (the tail reaches it at `end + lat`). Otherwise a
    /// chunk trickling in from a slow link would hold a fast one (a leaf's
    /// aggregate uplink) for the slow link's time.
    fn ready_on(&self, next: u32, bytes: u64, start: f64, end: f64, lat: f64) -> f64 {
        let bw = self.net.links[next as usize].bw;
        (start + lat).max(end + lat - bytes as f64 / bw)
    }

    /// A chunk of message `id` has arrived at `t`.
    fn arrive(&mut self, id: u32, t: f64) {
        let m = &mut self.msgs[id as usize];
        m.done = m.done.max(t);
        m.chunks_left -= 1;
        if m.chunks_left == 0 {
            let done = m.done;
            self.push(done, Kind::Delivered { msg: id });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::TopologySpec;
    use ferrocoll::plan::{Round, Span};

    fn plan(ops: Vec<Vec<Op>>) -> Plan {
        Plan {
            rounds: ops.into_iter().map(|ops| Round { ops }).collect(),
            scratch: 0,
        }
    }

    fn net(n: usize) -> Network {
        Network::new(&TopologySpec::parse(&format!("switch:ranks={n},bw=1GB/s,lat=1us")).unwrap())
    }

    fn send(peer: usize, len: usize) -> Op {
        Op::Send {
            peer,
            src: Span::input(0, len),
        }
    }

    fn recv(peer: usize, len: usize) -> Op {
        Op::Recv {
            peer,
            dst: Span::output(0, len),
        }
    }

    #[test]
    fn one_message_costs_latency_plus_bytes_over_bandwidth() {
        let plans = [
            plan(vec![vec![send(1, 250)]]),
            plan(vec![vec![recv(0, 250)]]),
        ];
        for mode in [Mode::Ideal, Mode::Contention] {
            let t = run(&plans, 4, &net(2), mode, &SimOptions::default()).unwrap();
            assert!(
                (t.time_s - (1e-6 + 1000.0 / 1e9)).abs() < 1e-15,
                "{mode:?} {t:?}"
            );
            assert_eq!(t.link_bytes, [1000, 0, 0, 1000]);
        }
    }

    #[test]
    fn a_one_link_path_is_charged_once() {
        // Neighbours on a physical ring share one link: no separate ports.
        let ring = TopologySpec::parse("ring:ranks=4,bw=1GB/s,lat=1us").unwrap();
        let net = Network::new(&ring);
        assert_eq!(net.path(0, 1).links().len(), 1);
        let plans = [
            plan(vec![vec![send(1, 250)]]),
            plan(vec![vec![recv(0, 250)]]),
            plan(vec![]),
            plan(vec![]),
        ];
        for mode in [Mode::Ideal, Mode::Contention] {
            let t = run(&plans, 4, &net, mode, &SimOptions::default()).unwrap();
            assert!(
                (t.time_s - (1e-6 + 1000.0 / 1e9)).abs() < 1e-15,
                "{mode:?} {t:?}"
            );
        }
    }

    #[test]
    fn rendezvous_waits_for_the_later_end() {
        // Rank 1 first receives 1000 bytes from rank 2 (2 us), then from rank 0.
        let plans = [
            plan(vec![vec![send(1, 250)]]),
            plan(vec![vec![recv(2, 250)], vec![recv(0, 250)]]),
            plan(vec![vec![send(1, 250)]]),
        ];
        let t = run(&plans, 4, &net(3), Mode::Ideal, &SimOptions::default()).unwrap();
        assert!((t.time_s - 4e-6).abs() < 1e-15, "{t:?}");
    }

    #[test]
    fn plans_that_do_not_fit_are_errors() {
        let opts = SimOptions::default();
        let lonely = [plan(vec![vec![send(1, 1)]]), plan(vec![])];
        let e = run(&lonely, 4, &net(2), Mode::Ideal, &opts).unwrap_err();
        assert!(e.contains("never received"), "{e}");
        let waiting = [plan(vec![]), plan(vec![vec![recv(0, 1)]])];
        let e = run(&waiting, 4, &net(2), Mode::Ideal, &opts).unwrap_err();
        assert!(e.contains("never sent"), "{e}");
        let sizes = [plan(vec![vec![send(1, 2)]]), plan(vec![vec![recv(0, 1)]])];
        let e = run(&sizes, 4, &net(2), Mode::Ideal, &opts).unwrap_err();
        assert!(e.contains("bytes"), "{e}");
        // Each waits for the other's second round first.
        let crossed = [
            plan(vec![vec![recv(1, 1)], vec![send(1, 1)]]),
            plan(vec![vec![recv(0, 1)], vec![send(0, 1)]]),
        ];
        let e = run(&crossed, 4, &net(2), Mode::Contention, &opts).unwrap_err();
        assert!(e.contains("deadlock"), "{e}");
        let e = run(&crossed, 4, &net(3), Mode::Ideal, &opts).unwrap_err();
        assert!(e.contains("network of 3"), "{e}");
        let outside = [plan(vec![vec![send(5, 1)]]), plan(vec![])];
        assert!(run(&outside, 4, &net(2), Mode::Ideal, &opts).is_err());
    }
}
