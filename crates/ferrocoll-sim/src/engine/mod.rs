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
//! [`Op::Reduce`]: ferrocoll::plan::Op::Reduce
//! [`Op::RecvReduce`]: ferrocoll::plan::Op::RecvReduce
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
//!   A chunk costs an event per link after the sender's port, except where
//!   nothing else can reach the link while the message crosses it: a
//!   two-link path whose last link is the receiver's port, in a round in
//!   which the receiver has no other receive (one group). Then the chunks'
//!   passage is computed at once, with the same arithmetic (`lay_out` in
//!   `links.rs`): a butterfly's or a binomial tree's messages cost two
//!   events each however many chunks they have.
//!
//! # Scenarios
//!
//! [`SimOptions`] can perturb a run: a rank that starts its plan late
//! ([`SimOptions::start_delay`]), a rank that reduces slowly
//! ([`SimOptions::compute_slowdown`], a factor on gamma), and links that
//! run below their bandwidth or have failed ([`SimOptions::slow_links`]).
//! A message may also cost its sender a fixed overhead
//! ([`SimOptions::message_overhead`], LogGP's o): it holds the sender's
//! port that long before its first byte, so a rank's k messages pay k·o one
//! after the other (on the critical path this counts as queueing). That is
//! the start-up that aggregating messages saves (the MoE two-level
//! exchange's reason to exist), which latency alone does not show: the
//! latencies of messages in flight together overlap.
//!
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
//!
//! # Layout
//!
//! * `mod.rs`: this overview and the entry points ([`run`], [`run_groups`],
//!   [`run_aggregated`]).
//! * `options.rs`: [`Mode`] and [`SimOptions`], their checks, slowed and
//!   failed links.
//! * `groups.rs`: the input, [`Group`] and [`Plans`].
//! * `state.rs`: the engine's state, built from the plans.
//! * `matching.rs`: messages and the pairing of sends with receives.
//! * `events.rs`: the event queue (a 4-ary heap) and its order.
//! * `rounds.rs`: the event loop and each rank's walk through its rounds.
//! * `links.rs`: messages on links in either mode, and link accounting.
//! * `report.rs`: the traces and critical path of a finished run.
//! * `footprint.rs`: [`Footprint`], what a run's state costs in memory.
//! * `trace.rs`, `timeline.rs`: the result types, and the timeline
//!   histogram.
//! * `tests.rs`: unit tests on hand-written plans.

mod events;
mod footprint;
mod groups;
mod links;
mod matching;
mod options;
mod report;
mod rounds;
mod state;
#[cfg(test)]
mod tests;
mod timeline;
mod trace;

pub use footprint::Footprint;
pub use groups::{Group, Plans};
pub(crate) use options::degrade;
pub use options::{Mode, SimOptions};
pub(crate) use timeline::Histogram;
pub use timeline::TIMELINE_BUCKETS;
pub use trace::{CriticalPath, Trace};

use ferrocoll::plan::Plan;

use crate::network::Network;
use crate::symmetry::Symmetry;
use state::Engine;

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

/// Runs the aggregated mode: `reps[a]` is the plan of representative a of
/// `sym` (a in `0..sym.period`), which the caller has checked against the
/// other ranks' plans ([`crate::symmetry::check_plans`]); the network must
/// admit `sym`. Only the representatives are simulated (see
/// [`crate::symmetry`] for why that is exact); the [`Trace`] is the full
/// run's, link for link, except `events`, which counts the events the
/// quotient run processed. Scenarios that single out ranks or links
/// (stragglers, slow ranks, a slow link named by index) break the
/// symmetry and are errors; a slow or failed link class is allowed. Like a
/// full run, the quotient is refused when its estimate exceeds the memory
/// available ([`crate::estimate::check_quotient`]).
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
    // The quotient's representatives talk to ranks of the whole network:
    // the estimate takes a peer's number as its physical rank.
    let est = crate::estimate::estimate_groups(&groups, elem_size, net, mode, opts)?;
    crate::estimate::check_quotient(&est, opts, sym.ranks)?;
    let (net, failed) = degrade(net, &opts.slow_links)?;
    let mut e = Engine::new(&groups, elem_size, net, mode, opts, Some(sym))?;
    if !failed.is_empty() {
        e.check_failed(&failed)?;
    }
    let mut traces = e.run()?;
    Ok(traces.remove(0))
}
