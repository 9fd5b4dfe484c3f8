//! The schedules the rows of dispatch and combine can travel by, and what
//! each costs for an observed count matrix.
//!
//! After the count exchange every rank holds the whole matrix
//! `rows[s][d]` (rows rank s sends rank d), so every rank prices the same
//! candidates on the same numbers and picks the same one with no further
//! message. The candidates:
//!
//! * **direct**: one all-to-all-v round, every message in flight at once
//!   (zero-length ones too);
//! * **pairwise**: N-1 steps, in step k rank i sends to i+k and receives
//!   from i-k;
//! * **two-level** (G hosts of L ranks, from the communicator's topology):
//!   rows are aggregated by destination host inside the source host, cross
//!   between hosts as one message per host pair, and are scattered inside
//!   the destination host (see `two_level.rs`);
//! * **rail** (Tutel's 2DH): rows for local index j of every host gather at
//!   local rank j first, then cross on rail j, one message per host pair and
//!   rail, landing where they belong (two phases, L messages per host pair).
//!
//! The last two are candidates only when G >= 2 and L >= 2 (otherwise they
//! are direct with extra copies).
//!
//! Each round is priced by the seeds' four-way lower bound (seed 000, the
//! AllToAll sections): for every rank and link class (intra-host, inter-host)
//! the **start-up** α + (k-1)·o of its k messages in flight and the larger of
//! its **injection** (bytes sent) and **reception** (bytes received) over β,
//! the classes in parallel; and for every host whose ranks share its uplink
//! (the profile's `inter_ports` > 0) the **bisection** term α_inter + the
//! larger of the bytes leaving and entering the host over β_inter ·
//! `inter_ports`, plus o_inter for every message beyond the first through
//! one of those ports (a shared NIC's message rate: the seeds' reason to
//! aggregate, P(P-1) inter-node flows against N_nodes(N_nodes-1)). A round
//! takes its slowest rank or host. Direct is one
//! round; pairwise the sum of its N-1 steps (the seeds' serial bound: each
//! step waits for its slowest pair); two-level the sum of its three phases
//! (the inter-host phase as long as its busiest gateway's pairs one after the
//! other, or the host uplinks' bytes, whichever is longer) plus its local copies at the profile's copy cost (packing for
//! phase 1, gathering for phase 2, packing for phase 3, assembling the
//! result: every byte a rank sends, forwards or receives copied once more).
//!
//! `auto` runs the cheapest, except that predictions within 2 % of it
//! ([`TIE`]) are ties, which go to the schedule of fewest rounds
//! ([`choose`]).
//!
//! Direct therefore wins when the busiest port's bytes dominate (blocks
//! coarse: the aggregation only adds copies), two-level when the inter-host
//! start-ups dominate (N-L messages per rank through the slow links, each
//! carrying a few rows) and the intra-host links are fast.

use std::fmt;
use std::str::FromStr;

use crate::cost::{Cost, LinkParams, Profile};
use crate::error::{Error, Result};
use crate::topo::Topology;

/// How the rows of [`super::Dispatcher::dispatch`] and
/// [`super::Dispatcher::combine`] travel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Schedule {
    /// Let the cost model choose per call from the observed count matrix
    /// (among [`Schedule::Direct`], [`Schedule::Pairwise`] and, on a
    /// topology of several hosts of several ranks, [`Schedule::TwoLevel`]
    /// and [`Schedule::Rail`]), and where its choice is predicted at 3 ms
    /// or less, race it against the candidates predicted within 2x of it
    /// on the first calls of that size and keep the fastest measured (see
    /// the module `choose.rs`); a communicator
    /// that forces an alltoallv algorithm (call options or
    /// `FERROCOLL_ALGO`) gets [`Schedule::Flat`] instead.
    #[default]
    Auto,
    /// One [`crate::Communicator::all_to_all_v`] with the algorithm the
    /// communicator chooses for it (its call options, `FERROCOLL_ALGO`,
    /// else `direct`): what the dispatcher did before it had schedules.
    Flat,
    /// One all-to-all-v round with the `direct` algorithm.
    Direct,
    /// One all-to-all-v with the `pairwise` algorithm (N-1 steps).
    Pairwise,
    /// Aggregate by destination host, one message per host pair, scatter
    /// inside the destination host (the seed's hierarchical exchange), over
    /// sub-communicators of the communicator's topology.
    TwoLevel,
    /// Two phases over the rails: inside each host to the local rank of the
    /// destination's local index, then between hosts on each rail (Tutel's
    /// 2DH, DeepEP's intra/inter split in Tutel's order).
    Rail,
}

impl Schedule {
    /// Every schedule, in the order `FERROCOLL_MOE_SCHEDULE` lists them.
    pub const ALL: [Schedule; 6] = [
        Schedule::Auto,
        Schedule::Flat,
        Schedule::Direct,
        Schedule::Pairwise,
        Schedule::TwoLevel,
        Schedule::Rail,
    ];

    /// The schedule `FERROCOLL_MOE_SCHEDULE` forces on every dispatcher
    /// whose spec does not force one (`Auto` when unset); a value that is
    /// not a schedule is an [`Error::Config`] naming the variable.
    pub fn from_env() -> Result<Schedule> {
        super::choose::schedule_from_env(&crate::env::process)
    }

    /// The name [`Schedule::from_str`] reads and reports print.
    pub fn name(self) -> &'static str {
        match self {
            Schedule::Auto => "auto",
            Schedule::Flat => "flat",
            Schedule::Direct => "direct",
            Schedule::Pairwise => "pairwise",
            Schedule::TwoLevel => "two-level",
            Schedule::Rail => "rail",
        }
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Schedule {
    type Err = Error;
    /// A name of [`Schedule::name`] (case-insensitive; `two_level` and
    /// `twolevel` are `two-level` too, `2dh` is `rail`).
    fn from_str(s: &str) -> Result<Schedule> {
        let lower = s.trim().to_ascii_lowercase();
        let alias = match lower.as_str() {
            "two_level" | "twolevel" => "two-level",
            "2dh" => "rail",
            other => other,
        };
        Schedule::ALL
            .into_iter()
            .find(|x| x.name() == alias)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "unknown MoE schedule `{s}`; use one of {}",
                    Schedule::ALL.map(|x| x.name()).join(", ")
                ))
            })
    }
}

/// One schedule's predicted time for one exchange.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    /// The schedule.
    pub schedule: Schedule,
    /// Its predicted time (the local work the schedule adds in `compute`).
    pub cost: Cost,
}

/// How the ranks nest: `g` hosts of `l` ranks, in blocks (rank = host·l +
/// local), as [`Topology`] places them; a flat topology is one host.
#[derive(Clone, Copy, Debug)]
pub(super) struct Hosts {
    pub(super) n: usize,
    pub(super) l: usize,
    pub(super) g: usize,
}

impl Hosts {
    pub(super) fn of(topology: &Topology) -> Hosts {
        let n = topology.size();
        let l = topology.local_size().max(1);
        Hosts { n, l, g: n / l }
    }

    /// Whether two-level is a real alternative: several hosts of several
    /// ranks.
    pub(super) fn two_level(&self) -> bool {
        self.g >= 2 && self.l >= 2
    }

    /// The local index of host `x`'s rank that carries host pair {x, y}'s
    /// message (the same index on both hosts: rail aligned, and spread
    /// over the local ranks as the pairs vary).
    pub(super) fn gateway(&self, x: usize, y: usize) -> usize {
        (x + y) % self.l
    }

    /// The host pairs {x, y} (x < y) in the order the inter-host phase runs
    /// them: by (x + y) mod G, then by x. Pairs of one sum are disjoint (a
    /// host meets one other host per sum), so they run at once; every
    /// gateway takes its pairs in this one global order, so the blocking
    /// exchanges cannot wait on each other in a cycle.
    pub(super) fn pair_order(&self) -> Vec<(usize, usize)> {
        let g = self.g;
        let mut pairs: Vec<(usize, usize)> = (0..g)
            .flat_map(|x| (x + 1..g).map(move |y| (x, y)))
            .collect();
        pairs.sort_by_key(|&(x, y)| ((x + y) % g, x));
        pairs
    }
}

/// What one rank moves on one link class in a round.
#[derive(Clone, Copy, Default)]
struct Port {
    sends: usize,
    recvs: usize,
    sent: f64,
    received: f64,
}

/// One round of concurrent messages, per rank and link class.
struct Round {
    hosts: Hosts,
    /// `[intra, inter]` per rank.
    ports: Vec<[Port; 2]>,
}

impl Round {
    fn new(hosts: Hosts) -> Round {
        Round {
            hosts,
            ports: vec![[Port::default(); 2]; hosts.n],
        }
    }

    /// A message of `bytes` from rank `s` to rank `d` (s != d).
    fn message(&mut self, s: usize, d: usize, bytes: f64) {
        let class = usize::from(s / self.hosts.l != d / self.hosts.l);
        let out = &mut self.ports[s][class];
        out.sends += 1;
        out.sent += bytes;
        let inn = &mut self.ports[d][class];
        inn.recvs += 1;
        inn.received += bytes;
    }

    /// The round's time: its slowest rank (start-up, injection, reception
    /// per class, the classes in parallel) or host uplink (bisection).
    fn cost(&self, profile: &Profile) -> Cost {
        let links = [profile.intra, profile.inter];
        let port_cost = |p: &Port, link: &LinkParams| {
            let k = p.sends.max(p.recvs);
            if k == 0 {
                return Cost::ZERO;
            }
            let moved = p.sent.max(p.received);
            Cost {
                latency: link.alpha + (k - 1) as f64 * link.overhead,
                bandwidth: link.transfer(moved, moved / k as f64),
                compute: 0.0,
            }
        };
        let mut worst = Cost::ZERO;
        for ports in &self.ports {
            for (p, link) in ports.iter().zip(&links) {
                worst = slower(worst, port_cost(p, link));
            }
        }
        if profile.inter_ports > 0.0 {
            let (l, ports) = (self.hosts.l, profile.inter_ports);
            for host in self.ports.chunks(l) {
                let mut all = Port::default();
                for p in host {
                    all.sends += p[1].sends;
                    all.recvs += p[1].recvs;
                    all.sent += p[1].sent;
                    all.received += p[1].received;
                }
                let k = all.sends.max(all.recvs);
                if k > 0 {
                    // The host's messages share its ports: each beyond the
                    // first of a port costs o there too.
                    let per_port = (k as f64 / ports).ceil().max(1.0);
                    let cut = Cost {
                        latency: profile.inter.alpha + (per_port - 1.0) * profile.inter.overhead,
                        bandwidth: all.sent.max(all.received) / (profile.inter.beta * ports),
                        compute: 0.0,
                    };
                    worst = slower(worst, cut);
                }
            }
        }
        worst
    }
}

/// The slower of two costs.
fn slower(a: Cost, b: Cost) -> Cost {
    if b.total() > a.total() {
        b
    } else {
        a
    }
}

/// Prices every schedule that is a candidate for the exchange `rows`
/// (`rows[s][d]`: rows rank s sends rank d, each `row_bytes` bytes; every
/// rank's matrix is the same after the count exchange) on `topology` and
/// `profile`: direct, pairwise and, with several hosts of several ranks,
/// two-level and rail, in that order. Combine's exchange is the transpose of
/// dispatch's.
pub fn price(
    rows: &[Vec<f64>],
    row_bytes: f64,
    topology: &Topology,
    profile: &Profile,
) -> Vec<Candidate> {
    let hosts = Hosts::of(topology);
    let n = rows.len();
    assert_eq!(
        hosts.n, n,
        "moe::model::price: the topology must have one rank per row"
    );
    let bytes = |s: usize, d: usize| rows[s][d] * row_bytes;
    let mut out = vec![
        Candidate {
            schedule: Schedule::Direct,
            cost: direct(hosts, &bytes, profile),
        },
        Candidate {
            schedule: Schedule::Pairwise,
            cost: pairwise(hosts, &bytes, profile),
        },
    ];
    if hosts.two_level() {
        out.push(Candidate {
            schedule: Schedule::TwoLevel,
            cost: two_level(hosts, &bytes, profile),
        });
        out.push(Candidate {
            schedule: Schedule::Rail,
            cost: rail(hosts, &bytes, profile),
        });
    }
    out
}

/// Predictions closer than this (relative) to the least are ties: the
/// closed forms do not resolve such differences (on the 2-host cluster
/// every schedule's predictions lay within 1-2 % of each other once the
/// link's bytes dominated, while their measured times scattered over
/// 5-15 %; bench/RESULTS.md, issue 18).
pub const TIE: f64 = 0.02;

/// The candidate of least predicted time (the first of equals).
pub fn cheapest(candidates: &[Candidate]) -> Option<Candidate> {
    candidates.iter().copied().fold(None, |best, c| match best {
        Some(b) if b.cost.total() <= c.cost.total() => Some(b),
        _ => Some(c),
    })
}

/// What `auto` runs: among the candidates within [`TIE`] of the cheapest,
/// the one of fewest rounds (direct 1, rail 2, two-level 3, pairwise
/// N-1): each round is a synchronisation point, which the model prices at
/// one start-up but which waits for the slowest rank's arrival.
pub fn choose(candidates: &[Candidate]) -> Option<Candidate> {
    let best = cheapest(candidates)?.cost.total();
    let rounds = |s: Schedule| match s {
        Schedule::Direct | Schedule::Flat | Schedule::Auto => 1,
        Schedule::Rail => 2,
        Schedule::TwoLevel => 3,
        Schedule::Pairwise => 4,
    };
    candidates
        .iter()
        .copied()
        .filter(|c| c.cost.total() <= best * (1.0 + TIE))
        .min_by(|a, b| {
            rounds(a.schedule)
                .cmp(&rounds(b.schedule))
                .then(a.cost.total().total_cmp(&b.cost.total()))
        })
}

/// One round, every ordered pair a message (zero-length ones are sent).
fn direct(hosts: Hosts, bytes: &dyn Fn(usize, usize) -> f64, profile: &Profile) -> Cost {
    let n = hosts.n;
    let mut round = Round::new(hosts);
    for s in 0..n {
        for d in (0..n).filter(|&d| d != s) {
            round.message(s, d, bytes(s, d));
        }
    }
    round.cost(profile)
}

/// N-1 steps of one message each way per rank, summed.
fn pairwise(hosts: Hosts, bytes: &dyn Fn(usize, usize) -> f64, profile: &Profile) -> Cost {
    let n = hosts.n;
    (1..n)
        .map(|k| {
            let mut round = Round::new(hosts);
            for i in 0..n {
                round.message(i, (i + k) % n, bytes(i, (i + k) % n));
            }
            round.cost(profile)
        })
        .fold(Cost::ZERO, |a, b| a + b)
}

/// The three phases of `two_level.rs`, summed, plus their copies.
fn two_level(hosts: Hosts, bytes: &dyn Fn(usize, usize) -> f64, profile: &Profile) -> Cost {
    let Hosts { n, l, g } = hosts;
    let rank = |x: usize, j: usize| x * l + j;
    // Bytes from rank s to every rank of host y.
    let to_host = |s: usize, y: usize| (0..l).map(|k| bytes(s, rank(y, k))).sum::<f64>();
    let host_of = |r: usize| r / l;
    let mut copied = vec![0.0f64; n];

    // Phase 1: (x,i) sends (x,j) its rows for (x,j) and for every rank of
    // the hosts (x,j) is the gateway to. Skipped by a host that sends
    // nothing at all.
    let mut p1 = Round::new(hosts);
    for (s, copy) in copied.iter_mut().enumerate() {
        let x = host_of(s);
        *copy += (0..n).map(|d| bytes(s, d)).sum::<f64>();
        if (0..l).all(|i| (0..n).all(|d| bytes(rank(x, i), d) == 0.0)) {
            continue;
        }
        for j in (0..l).filter(|&j| rank(x, j) != s) {
            let mut b = bytes(s, rank(x, j));
            for y in (0..g).filter(|&y| y != x && hosts.gateway(x, y) == j) {
                b += to_host(s, y);
            }
            p1.message(s, rank(x, j), b);
        }
    }
    let mut total = p1.cost(profile);

    // Phase 2: one message each way between each pair's gateways (skipped
    // when both ways are empty). A gateway takes its pairs one after the
    // other, but the gateways of a host are different ranks (local index
    // (x + y) mod L) and run theirs at once: the phase lasts as long as the
    // busiest gateway's pairs, each priced alone, or as the host uplinks
    // need for all the phase's bytes together (`all`: one round of every
    // message, whose per-host term is the bisection; where the ranks have
    // ports of their own it is the concurrent bound). Pricing the pairs in
    // rounds of one sum each, every gateway waiting for the others,
    // charged a 2 x 4-host exchange 3.2-3.6x what the simulator found in
    // its ideal mode (`ferrocoll sim moe`, which runs these very phases).
    let mut serial = vec![Cost::ZERO; n];
    let mut all = Round::new(hosts);
    for (x, y) in hosts.pair_order() {
        let j = hosts.gateway(x, y);
        let way = |from: usize, to: usize| (0..l).map(|i| to_host(rank(from, i), to)).sum();
        let (xy, yx): (f64, f64) = (way(x, y), way(y, x));
        if xy > 0.0 || yx > 0.0 {
            let mut alone = Round::new(hosts);
            for round in [&mut alone, &mut all] {
                round.message(rank(x, j), rank(y, j), xy);
                round.message(rank(y, j), rank(x, j), yx);
            }
            let c = alone.cost(profile);
            serial[rank(x, j)] = serial[rank(x, j)] + c;
            serial[rank(y, j)] = serial[rank(y, j)] + c;
            // Gathered into the message, then forwarded in phase 3.
            copied[rank(x, j)] += xy + yx;
            copied[rank(y, j)] += xy + yx;
        }
    }
    total = total + serial.into_iter().fold(all.cost(profile), slower);

    // Phase 3: each gateway scatters what it received to its host's ranks
    // (skipped by a host that receives nothing from the others).
    let mut p3 = Round::new(hosts);
    for x in 0..g {
        let from_others = |d: usize| {
            (0..n)
                .filter(|&s| host_of(s) != x)
                .map(|s| bytes(s, d))
                .sum::<f64>()
        };
        if (0..l).all(|k| from_others(rank(x, k)) == 0.0) {
            continue;
        }
        for j in 0..l {
            for k in (0..l).filter(|&k| k != j) {
                let b: f64 = (0..g)
                    .filter(|&y| y != x && hosts.gateway(x, y) == j)
                    .flat_map(|y| (0..l).map(move |i| rank(y, i)))
                    .map(|s| bytes(s, rank(x, k)))
                    .sum();
                p3.message(rank(x, j), rank(x, k), b);
            }
        }
    }
    total = total + p3.cost(profile);
    for (d, c) in copied.iter_mut().enumerate() {
        *c += (0..n).map(|s| bytes(s, d)).sum::<f64>();
    }
    total
        + Cost {
            latency: 0.0,
            bandwidth: 0.0,
            compute: copied.into_iter().fold(0.0, f64::max) * profile.copy,
        }
}

/// The two phases of the rail exchange, plus their copies (packing for
/// phase 1, gathering for phase 2).
fn rail(hosts: Hosts, bytes: &dyn Fn(usize, usize) -> f64, profile: &Profile) -> Cost {
    let Hosts { n, l, g } = hosts;
    let rank = |x: usize, j: usize| x * l + j;
    let mut copied = vec![0.0f64; n];
    let mut p1 = Round::new(hosts);
    for (s, copy) in copied.iter_mut().enumerate() {
        let x = s / l;
        *copy += (0..n).map(|d| bytes(s, d)).sum::<f64>();
        if (0..l).all(|i| (0..n).all(|d| bytes(rank(x, i), d) == 0.0)) {
            continue;
        }
        for j in (0..l).filter(|&j| rank(x, j) != s) {
            p1.message(s, rank(x, j), (0..g).map(|y| bytes(s, rank(y, j))).sum());
        }
    }
    let mut p2 = Round::new(hosts);
    for i in 0..l {
        let moves = (0..n).any(|s| (0..g).any(|z| bytes(s, rank(z, i)) > 0.0));
        if !moves {
            continue;
        }
        for x in 0..g {
            for y in (0..g).filter(|&y| y != x) {
                let b: f64 = (0..l).map(|j| bytes(rank(x, j), rank(y, i))).sum();
                p2.message(rank(x, i), rank(y, i), b);
                copied[rank(x, i)] += b;
            }
        }
    }
    p1.cost(profile)
        + p2.cost(profile)
        + Cost {
            latency: 0.0,
            bandwidth: 0.0,
            compute: copied.into_iter().fold(0.0, f64::max) * profile.copy,
        }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fast links inside a host, a slow shared one between hosts with a
    /// large per-message cost.
    fn cluster() -> Profile {
        let mut p = Profile::uniform(2e-6, 10e9, 0.0);
        p.intra.overhead = 0.5e-6;
        p.inter = LinkParams {
            alpha: 40e-6,
            beta: 0.125e9,
            overhead: 30e-6,
            piece: 0.0,
        };
        p.inter_ports = 1.0;
        p.copy = 1e-10;
        p
    }

    fn uniform(n: usize, r: f64) -> Vec<Vec<f64>> {
        vec![vec![r; n]; n]
    }

    #[test]
    fn ties_go_to_the_fewest_rounds() {
        let c = |schedule, us: f64| Candidate {
            schedule,
            cost: Cost {
                latency: us * 1e-6,
                bandwidth: 0.0,
                compute: 0.0,
            },
        };
        let close = [
            c(Schedule::Direct, 100.8),
            c(Schedule::Pairwise, 99.0),
            c(Schedule::TwoLevel, 100.0),
            c(Schedule::Rail, 100.5),
        ];
        assert_eq!(cheapest(&close).unwrap().schedule, Schedule::Pairwise);
        assert_eq!(choose(&close).unwrap().schedule, Schedule::Direct);
        let apart = [
            c(Schedule::Direct, 110.0),
            c(Schedule::TwoLevel, 100.0),
            c(Schedule::Rail, 101.5),
        ];
        assert_eq!(choose(&apart).unwrap().schedule, Schedule::Rail);
        assert_eq!(choose(&[]), None);
    }

    #[test]
    fn names_parse_back() {
        for s in Schedule::ALL {
            assert_eq!(s.name().parse::<Schedule>().unwrap(), s);
        }
        assert_eq!("2DH".parse::<Schedule>().unwrap(), Schedule::Rail);
        assert_eq!("two_level".parse::<Schedule>().unwrap(), Schedule::TwoLevel);
        let e = "ring".parse::<Schedule>().unwrap_err().to_string();
        assert!(
            e.contains("auto, flat, direct, pairwise, two-level, rail"),
            "{e}"
        );
    }

    #[test]
    fn two_level_is_a_candidate_only_for_hosts_of_several_ranks() {
        let p = cluster();
        let names = |t: &str| {
            let t: Topology = t.parse().unwrap();
            price(&uniform(t.size(), 1.0), 4096.0, &t, &p)
                .iter()
                .map(|c| c.schedule)
                .collect::<Vec<_>>()
        };
        assert_eq!(names("4"), [Schedule::Direct, Schedule::Pairwise]);
        assert_eq!(names("4x1"), [Schedule::Direct, Schedule::Pairwise]);
        assert_eq!(
            names("2x2"),
            [
                Schedule::Direct,
                Schedule::Pairwise,
                Schedule::TwoLevel,
                Schedule::Rail
            ]
        );
    }

    #[test]
    fn small_blocks_go_two_level_and_large_ones_direct() {
        let (p, t) = (cluster(), "2x4".parse::<Topology>().unwrap());
        // One 256 B row per pair: 4 inter-host start-ups per rank (30 us
        // each beyond the first) against one per host pair.
        let small = price(&uniform(8, 1.0), 256.0, &t, &p);
        assert_eq!(cheapest(&small).unwrap().schedule, Schedule::TwoLevel);
        // 1000 rows of 4 KiB per pair: the shared uplink's bytes dominate
        // both alike, and two-level adds its copies and two more rounds.
        let large = price(&uniform(8, 1000.0), 4096.0, &t, &p);
        assert_eq!(cheapest(&large).unwrap().schedule, Schedule::Direct);
    }

    #[test]
    fn rail_wins_with_a_port_per_rank_and_dear_messages() {
        // A NIC per rank (inter_ports 0): the gateway's one port carries
        // the whole host's bytes, the rails spread them; direct pays three
        // more start-ups per rank.
        let mut p = Profile::uniform(2e-6, 10e9, 0.0);
        p.inter = LinkParams {
            alpha: 50e-6,
            beta: 1e9,
            overhead: 40e-6,
            piece: 0.0,
        };
        let t: Topology = "2x4".parse().unwrap();
        let c = price(&uniform(8, 1.0), 65536.0, &t, &p);
        assert_eq!(cheapest(&c).unwrap().schedule, Schedule::Rail, "{c:?}");
    }

    #[test]
    fn direct_is_the_seeds_bound_and_a_shared_uplink_adds_bisection() {
        // 2 hosts of 2 ranks, 1 row of 1000 B per pair, no per-message
        // overhead: a rank sends 1000 B intra and 2000 B inter.
        let mut p = Profile::uniform(1e-6, 1e9, 0.0);
        p.inter.alpha = 10e-6;
        let t: Topology = "2x2".parse().unwrap();
        let c = price(&uniform(4, 1.0), 1000.0, &t, &p)[0].cost;
        assert!((c.total() - (10e-6 + 2000.0 / 1e9)).abs() < 1e-12, "{c:?}");
        // One port per host: the host's 4000 B leave through it.
        p.inter_ports = 1.0;
        let c = price(&uniform(4, 1.0), 1000.0, &t, &p)[0].cost;
        assert!((c.total() - (10e-6 + 4000.0 / 1e9)).abs() < 1e-12, "{c:?}");
    }

    #[test]
    fn pair_order_meets_each_host_once_per_sum() {
        for g in 2..9 {
            let hosts = Hosts { n: g * 2, l: 2, g };
            let pairs = hosts.pair_order();
            assert_eq!(pairs.len(), g * (g - 1) / 2);
            for sum in 0..g {
                let mut seen = vec![false; g];
                for &(x, y) in pairs.iter().filter(|(x, y)| (x + y) % g == sum) {
                    assert!(!seen[x] && !seen[y], "g = {g}: host twice in sum {sum}");
                    seen[x] = true;
                    seen[y] = true;
                }
            }
        }
    }

    #[test]
    fn empty_exchanges_cost_the_start_ups_of_the_phases_that_run() {
        let (p, t) = (cluster(), "2x2".parse::<Topology>().unwrap());
        let zero = uniform(4, 0.0);
        let c = price(&zero, 4096.0, &t, &p);
        // Direct still sends its zero-length messages; two-level skips
        // every phase of an empty exchange.
        assert!(c[0].cost.total() > 0.0);
        assert_eq!(c[2].cost, Cost::ZERO);
    }
}
