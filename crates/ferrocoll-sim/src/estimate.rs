//! Full runs sized before they start.
//!
//! A full run holds every message of every rank's plan at once (the engine
//! pairs all sends with all receives before the first event): a
//! 16,384-rank ring allreduce is 537 million messages, about 57 GB, and a
//! run that grows past the machine's memory is killed by the kernel after
//! minutes of work. So [`crate::simulate_jobs`] (and everything built on
//! it) first estimates what the run will hold and do ([`estimate_groups`])
//! and refuses, with the estimate and the way out (the aggregated mode), a
//! run that would not fit in the memory available ([`check`]).
//!
//! # The estimate
//!
//! The plans are counted, not guessed: for groups of up to [`SAMPLE_ALL`]
//! ranks every plan is built and counted (the counts are then exact); for
//! larger ones [`SAMPLES`] ranks spread evenly over the group, plus ranks 1
//! and n - 1 (the edges where algorithms single out ranks), stand for the
//! rest, each for n / (ranks sampled). Per rank: its messages, receives and
//! rounds, the distinct peers it sends to and receives from (the message
//! table's channels), its largest round (messages in flight together), and
//! the events its messages cause: two per message (start, delivery), one
//! per chunk per link after the first in the contention mode (none for a
//! message the engine lays out on its receiver's port at once), one per
//! received reduction when reductions cost time, one per round. The memory
//! is [`Footprint::bytes`] of those counts, times [`MARGIN`].
//!
//! # The memory available
//!
//! [`memory_available`]: [`SimOptions::memory_limit`] when set, else the
//! environment variable `FERROCOLL_SIM_MEMORY` (bytes, or with KB, MB, GB,
//! KiB, MiB or GiB), else `MemAvailable` in `/proc/meminfo` (what the kernel
//! can give without swapping); where none is known the run is not checked.

use std::collections::HashSet;

use ferrocoll::plan::Op;

use crate::engine::{Footprint, Group, Mode, SimOptions};
use crate::network::Network;

/// Groups of up to this many ranks have every plan counted.
pub const SAMPLE_ALL: usize = 256;

/// Ranks spread over a larger group whose plans are counted.
pub const SAMPLES: usize = 64;

/// The estimate's safety factor: allocator slack and what the counts leave
/// out (the plan being read, vectors of the trace), so that a run the
/// estimate admits is not one the kernel kills.
pub const MARGIN: f64 = 1.25;

/// What a full run will hold and do.
#[derive(Clone, Debug, PartialEq)]
pub struct Estimate {
    /// The counts its memory follows from.
    pub footprint: Footprint,
    /// Events the engine will process (exact when every plan was counted,
    /// for a run that completes).
    pub events: u64,
    /// Plans built to count.
    pub sampled: usize,
    /// Plans in the run.
    pub plans: usize,
}

impl Estimate {
    /// Bytes the run is expected to need: [`Footprint::bytes`] times
    /// [`MARGIN`].
    pub fn bytes(&self) -> u64 {
        (self.footprint.bytes() as f64 * MARGIN) as u64
    }

    /// Whether every plan was counted.
    pub fn exact(&self) -> bool {
        self.sampled == self.plans
    }
}

/// The ranks of a group of `n` whose plans are counted, in increasing order.
fn sample(n: usize) -> Vec<usize> {
    if n <= SAMPLE_ALL {
        return (0..n).collect();
    }
    let mut v: Vec<usize> = (0..SAMPLES).map(|i| i * n / SAMPLES).collect();
    v.extend([1, n - 1]);
    v.sort_unstable();
    v.dedup();
    v
}

/// One rank's plan, counted.
#[derive(Default)]
struct RankCounts {
    messages: u64,
    receives: u64,
    rounds: u64,
    channel_ends: u64,
    largest_round: u64,
    longest_path: u64,
    events: u64,
    plan_bytes: u64,
}

/// Estimates the full run of `groups` with elements of `elem_size` bytes
/// on `net` (see the module docs).
/// Fails with a plan's build error.
pub fn estimate_groups(
    groups: &[Group<'_>],
    elem_size: usize,
    net: &Network,
    mode: Mode,
    opts: &SimOptions,
) -> Result<Estimate, String> {
    let mut fp = Footprint {
        physical: net.ranks() as u64,
        links: net.links.len() as u64,
        classes: net.classes.len() as u64,
        groups: groups.len() as u64,
        ..Footprint::default()
    };
    let (mut events, mut sampled, mut plans) = (0u64, 0usize, 0usize);
    let chunk = opts.chunk_bytes.max(1);
    for group in groups {
        let n = group.plans.len();
        let ranks = sample(n);
        let mut sum = RankCounts::default();
        for &rank in &ranks {
            let plan = group.plans.get(rank)?;
            let mut c = RankCounts {
                rounds: plan.rounds.len() as u64,
                ..RankCounts::default()
            };
            let (mut to, mut from) = (HashSet::new(), HashSet::new());
            let mut ops = 0u64;
            let phys = |r: usize| group.ranks.get(r).copied().unwrap_or(r);
            for round in &plan.rounds {
                let mut sends = 0u64;
                ops += round.ops.len() as u64;
                let receives = round
                    .ops
                    .iter()
                    .filter(|op| matches!(op, Op::Recv { .. } | Op::RecvReduce { .. }))
                    .count();
                for op in &round.ops {
                    match *op {
                        Op::Send { peer, .. } => {
                            sends += 1;
                            to.insert(peer);
                            c.events += 2;
                        }
                        Op::Recv { peer, dst } | Op::RecvReduce { peer, dst, .. } => {
                            c.receives += 1;
                            from.insert(peer);
                            if opts.gamma > 0.0
                                && dst.len > 0
                                && matches!(op, Op::RecvReduce { .. })
                            {
                                c.events += 1;
                            }
                            if mode == Mode::Contention {
                                // A chunk's hops after its sender's port, unless
                                // the engine lays the message out on this rank's
                                // port at once (alone there: the round's only
                                // receive, one group).
                                let path = net.path(phys(peer), phys(rank));
                                let links = path.links();
                                let hops = links.len() as u64;
                                c.longest_path = c.longest_path.max(hops);
                                let laid_out = hops == 2
                                    && receives == 1
                                    && groups.len() == 1
                                    && net.is_receiver_port(links[1] as usize);
                                if hops >= 2 && !laid_out {
                                    let bytes = (dst.len * elem_size) as u64;
                                    c.events += bytes.div_ceil(chunk).max(1) * (hops - 1);
                                }
                            }
                        }
                        Op::Copy { .. } | Op::Reduce { .. } => {}
                    }
                }
                c.messages += sends;
                c.largest_round = c.largest_round.max(sends);
            }
            c.events += c.rounds;
            c.channel_ends = (to.len() + from.len()) as u64;
            c.plan_bytes = c.rounds * 40 + ops * std::mem::size_of::<Op>() as u64;
            sum.messages += c.messages;
            sum.receives += c.receives;
            sum.rounds += c.rounds;
            sum.channel_ends += c.channel_ends;
            sum.largest_round += c.largest_round * c.longest_path.max(1);
            sum.events += c.events;
            sum.plan_bytes = sum.plan_bytes.max(c.plan_bytes);
        }
        // Each counted rank stands for n / (ranks counted) of the group.
        let scale = |x: u64| -> u64 {
            if ranks.len() == n {
                x
            } else {
                (x as f64 * n as f64 / ranks.len() as f64).ceil() as u64
            }
        };
        fp.ranks += n as u64;
        fp.messages += scale(sum.messages);
        fp.receives += scale(sum.receives);
        fp.rounds += scale(sum.rounds);
        fp.channel_ends += scale(sum.channel_ends);
        fp.pending_events += scale(sum.largest_round) + n as u64;
        fp.largest_plan_bytes = fp.largest_plan_bytes.max(sum.plan_bytes);
        events += scale(sum.events);
        sampled += ranks.len();
        plans += n;
    }
    Ok(Estimate {
        footprint: fp,
        events,
        sampled,
        plans,
    })
}

/// The memory a run may use and where that figure comes from (see the
/// module docs); `None` where it is not known. Fails when
/// `FERROCOLL_SIM_MEMORY` is set but is not a size.
pub fn memory_available(opts: &SimOptions) -> Result<Option<(u64, String)>, String> {
    if let Some(limit) = opts.memory_limit {
        return Ok(Some((limit, "the memory limit given".to_string())));
    }
    if let Ok(v) = std::env::var("FERROCOLL_SIM_MEMORY") {
        let bytes = parse_size(&v).ok_or_else(|| {
            format!("FERROCOLL_SIM_MEMORY={v:?} is not a size; write bytes, or with KB, MB, GB, KiB, MiB or GiB (e.g. 8GB)")
        })?;
        return Ok(Some((bytes, "FERROCOLL_SIM_MEMORY".to_string())));
    }
    Ok(std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| mem_available(&text))
        .map(|b| (b, "MemAvailable in /proc/meminfo".to_string())))
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes.
fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// A size: a whole number of bytes, optionally with KB, MB, GB, TB
/// (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024).
pub fn parse_size(s: &str) -> Option<u64> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits.parse().ok()?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        _ => return None,
    };
    n.checked_mul(mult)
}

/// `bytes` for a person: `57.2 GB`, `412 MB`.
pub fn human_bytes(bytes: u64) -> String {
    let b = bytes as f64;
    for (unit, scale) in [("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)] {
        if b >= scale {
            return format!("{:.1} {unit}", b / scale);
        }
    }
    format!("{bytes} B")
}

/// `count` for a person: `537 M`, `1.07 G`, three significant digits.
fn human_count(count: u64) -> String {
    let c = count as f64;
    for (unit, scale) in [("G", 1e9), ("M", 1e6), ("k", 1e3)] {
        if c >= scale {
            let v = c / scale;
            let digits = if v >= 100.0 {
                0
            } else if v >= 10.0 {
                1
            } else {
                2
            };
            return format!("{v:.digits$} {unit}");
        }
    }
    count.to_string()
}

/// Refuses a full run whose estimate exceeds the memory available (see
/// [`memory_available`]), with the estimate, where the figure of memory
/// came from, and what to do instead (the aggregated mode).
pub fn check(est: &Estimate, opts: &SimOptions) -> Result<(), String> {
    let what = format!("a full run of {} ranks", est.footprint.ranks);
    refuse(
        est,
        opts,
        &what,
        "use the aggregated mode (--aggregate), which simulates one rank per class of ranks that behave alike, or fewer ranks",
    )
}

/// [`check`] for a run that has no aggregated mode (plans built elsewhere,
/// such as the MoE schedules' uneven all-to-all-v, or the compressed
/// exchanges, which run rank by rank): the way out is fewer ranks.
pub fn check_unaggregated(est: &Estimate, opts: &SimOptions, why: &str) -> Result<(), String> {
    let what = format!("a full run of {} ranks", est.footprint.ranks);
    let instead = format!("use fewer ranks ({why}, so it has no aggregated mode)");
    refuse(est, opts, &what, &instead)
}

/// [`check`] for the quotient run of the aggregated mode, whose `ranks`
/// representatives stand for `of` ranks: what it could do instead is only
/// fewer ranks (a quotient of a symmetric run is small; one of a large
/// period, or of plans with millions of messages per rank, may not be).
pub fn check_quotient(est: &Estimate, opts: &SimOptions, of: usize) -> Result<(), String> {
    let what = format!(
        "the aggregated run ({} of {of} ranks simulated)",
        est.footprint.ranks
    );
    refuse(est, opts, &what, "use fewer ranks")
}

/// The refusal of [`check`] and [`check_quotient`]: `what` the run is,
/// `instead` what to do.
fn refuse(est: &Estimate, opts: &SimOptions, what: &str, instead: &str) -> Result<(), String> {
    let Some((avail, source)) = memory_available(opts)? else {
        return Ok(());
    };
    let need = est.bytes();
    if need <= avail {
        return Ok(());
    }
    let how = if est.exact() {
        "counted from every plan".to_string()
    } else {
        format!("estimated from {} of the {} plans", est.sampled, est.plans)
    };
    Err(format!(
        "{what} would need about {} of memory ({} messages, {} events; {how}) but {} is available ({source}); {instead}",
        human_bytes(need),
        human_count(est.footprint.messages),
        human_count(est.events),
        human_bytes(avail),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_meminfo_parse() {
        assert_eq!(parse_size("512"), Some(512));
        assert_eq!(parse_size("8GB"), Some(8_000_000_000));
        assert_eq!(parse_size("1 MiB"), Some(1 << 20));
        assert_eq!(parse_size("lots"), None);
        assert_eq!(parse_size("3 parsecs"), None);
        let text =
            "MemTotal:       24683584 kB\nMemFree:  15500872 kB\nMemAvailable:   23247324 kB\n";
        assert_eq!(mem_available(text), Some(23247324 * 1024));
        assert_eq!(mem_available("MemTotal: 1 kB\n"), None);
        assert_eq!(human_bytes(57_200_000_000), "57.2 GB");
        assert_eq!(human_bytes(999), "999 B");
        assert_eq!(human_count(537_000_000), "537 M");
        assert_eq!(human_count(1_070_000_000), "1.07 G");
        assert_eq!(human_count(42_500), "42.5 k");
        assert_eq!(human_count(12), "12");
    }

    #[test]
    fn samples_take_the_edges_of_large_groups() {
        assert_eq!(sample(5), [0, 1, 2, 3, 4]);
        let s = sample(100_000);
        assert!(s.len() <= SAMPLES + 2);
        assert!(s.contains(&0) && s.contains(&1) && s.contains(&99_999));
        assert!(s.windows(2).all(|w| w[0] < w[1]));
    }
}
