//! What a run reports: the [`Trace`] of a group and its [`CriticalPath`].

/// What a run measured, per link.
#[derive(Clone, Debug, PartialEq)]
pub struct Trace {
    /// When the last rank finished, in seconds.
    pub time_s: f64,
    /// Bytes that crossed each link (indexed like
    /// [`Network::links`](crate::network::Network::links)).
    pub link_bytes: Vec<u64>,
    /// Seconds each link spent transmitting (bytes / bandwidth).
    pub link_busy: Vec<f64>,
    /// Events processed.
    pub events: u64,
    /// Per link class (in
    /// [`Network::classes`](crate::network::Network::classes) order), the
    /// utilization (busy time over time times the class's links) in each of
    /// [`TIMELINE_BUCKETS`](super::TIMELINE_BUCKETS) equal buckets of
    /// `[0, time_s]`; all zeros when no time passed. See the engine's module
    /// docs.
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
    /// The rank the path ends at: the first of the ranks that finished
    /// last (a group rank; in the aggregated mode its class's
    /// representative).
    pub end_rank: u64,
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
