//! Compressed allreduces on the simulator ([`simulate_compressed`]):
//! the collectives [`ferrocoll::compress::Compressor`] runs for a codec
//! ([`ferrocoll::compress::collective::exchanges`]: for the quantizers an
//! all-to-all of encoded chunks and an allgather of the re-encoded ones,
//! for Top-k an allgather of the payloads, for Random-k and PowerSGD
//! allreduces of `f32`s; on 2+ nodes of 2+ ranks the hierarchical form),
//! each run as ferrocoll's plans of its bytes on the modelled cluster, and
//! the codec's compute as a time per input byte on every rank.
//!
//! The exchanges run one after the other, as the compressor's whole calls
//! do: each starts when the previous one has ended on every rank (a
//! barrier between them, which the real calls approach because each is a
//! collective over the same ranks). Within an exchange of the hierarchical
//! form, the groups (every node, or every rail) run at once and share the
//! links. The codec's time is the cost model's codec term
//! ([`ferrocoll::compress::collective::model::predict_all_reduce`]: its
//! encode, decode and error-feedback passes on the busiest rank), added
//! to the exchanges' time: the compressor's calls do not overlap its
//! codec work with the wire. Each exchange's algorithm is the one the
//! library's call picks: the cost model's cheapest on the cluster's
//! profile, and `direct` for an all-to-all of unequal lengths (the size
//! rule that `all_to_all_v` uses).

use std::collections::HashMap;
use std::sync::Mutex;

use ferrocoll::compress::collective::exchanges::{exchanges, Exchange, Level};
use ferrocoll::compress::collective::model::predict_all_reduce;
use ferrocoll::cost::{self, Profile, Shape};
use ferrocoll::plan::{self, Op, Plan, PlanRequest};
use ferrocoll::{Algorithm, Collective, Topology};

use crate::engine::{self, Group, Mode, Plans, SimOptions};
use crate::network::Network;
use crate::{estimate, LinkClassStats, TopologySpec};

/// One exchange as it ran.
#[derive(Clone, Debug, PartialEq)]
pub struct ExchangeRun {
    /// The collective and the algorithm, e.g. `alltoallv direct`.
    pub name: String,
    /// Its time (the slowest group's), in seconds.
    pub time_s: f64,
    /// Messages all ranks sent in it.
    pub messages: u64,
    /// Bytes all ranks sent in it.
    pub bytes: u64,
}

/// The outcome of one simulated compressed allreduce.
#[derive(Clone, Debug, PartialEq)]
pub struct CompressedResult {
    /// The codec, as [`ferrocoll::compress::Codec::name`] writes it (or the
    /// PowerSGD spec as given).
    pub codec: String,
    /// What the compressor runs (`two-phase`, `allgather`,
    /// `hier-two-phase`, ...).
    pub algorithm: &'static str,
    /// Exchanges plus codec, in seconds.
    pub time_s: f64,
    /// The exchanges' time.
    pub exchange_s: f64,
    /// The codec's time on the busiest rank.
    pub codec_s: f64,
    /// Each exchange, in order.
    pub exchanges: Vec<ExchangeRun>,
    /// Bytes the busiest rank sent, over all exchanges (encoded bytes, and
    /// the hierarchical form's `f32`s within the node).
    pub sent_bytes_max: u64,
    /// Bytes all ranks sent.
    pub sent_bytes_total: u64,
    /// Messages all ranks sent.
    pub messages: u64,
    /// Per link class: bytes over all exchanges, utilization over
    /// `time_s`.
    pub per_class: Vec<LinkClassStats>,
    /// Events the engine processed.
    pub events: u64,
}

/// Simulates the compressed allreduce of `bytes` (`f32`s) with codec
/// `spec` (as `Compressor::new` takes it) on `topo`, its exchanges'
/// algorithms chosen on `profile` (the cluster's, as `ferrocoll sim`'s
/// `auto`), and the codec at `codec` seconds per input byte (the built-in
/// rate of `codec_seconds_per_byte` when `None`).
pub fn simulate_compressed(
    spec: &str,
    bytes: usize,
    topo: &TopologySpec,
    mode: Mode,
    opts: &SimOptions,
    profile: &Profile,
    codec: Option<f64>,
) -> Result<CompressedResult, String> {
    let len = bytes / 4;
    let topology = topo.plan_topology();
    let err = |e: ferrocoll::Error| e.to_string();
    let (algorithm, list) = exchanges(spec, len, &topology).map_err(err)?;
    let model = predict_all_reduce(spec, len, &topology, profile, codec).map_err(err)?;
    let net = Network::new(topo);
    let mut out = CompressedResult {
        codec: ferrocoll::compress::parse(spec).map_or_else(|_| spec.to_string(), |c| c.name()),
        algorithm,
        time_s: 0.0,
        exchange_s: 0.0,
        codec_s: model.codec,
        exchanges: Vec::new(),
        sent_bytes_max: 0,
        sent_bytes_total: 0,
        messages: 0,
        per_class: Vec::new(),
        events: 0,
    };
    let mut link_bytes = vec![0u64; net.links.len()];
    let mut link_busy = vec![0f64; net.links.len()];
    let mut sent = vec![0u64; topo.ranks()];
    for ex in &list {
        let run = run_exchange(ex, &topology, &net, mode, opts, profile)?;
        out.exchange_s += run.time_s;
        out.events += run.events;
        for (i, b) in run.link_bytes.iter().enumerate() {
            link_bytes[i] += b;
            link_busy[i] += run.link_busy[i];
        }
        for (r, s) in run.sent.iter().enumerate() {
            sent[r] += s;
        }
        out.messages += run.messages;
        out.exchanges.push(ExchangeRun {
            name: run.name,
            time_s: run.time_s,
            messages: run.messages,
            bytes: run.sent.iter().sum(),
        });
    }
    out.time_s = out.exchange_s + out.codec_s;
    out.sent_bytes_max = sent.iter().copied().max().unwrap_or(0);
    out.sent_bytes_total = sent.iter().sum();
    out.per_class = crate::class_stats(&net, &link_bytes, &link_busy, out.time_s);
    Ok(out)
}

/// The cost-model profile of a modelled cluster: its rank ports as the
/// intra-node links and its network ports as the inter-node ones (see
/// [`TopologySpec::cost_links`]), reducing at `gamma` seconds per byte:
/// what `ferrocoll sim --algo auto` and the exchanges here choose with.
pub fn cost_profile(topo: &TopologySpec, gamma: f64) -> Profile {
    let link = |l: crate::LinkSpec| ferrocoll::cost::LinkParams {
        alpha: l.lat,
        beta: l.bw,
        overhead: 0.0,
        piece: 0.0,
    };
    let (intra, inter) = topo.cost_links();
    // Everything else off: the simulator's links are per rank (its own
    // model of sharing), every simulated rank has a core of its own, no
    // cache regime.
    Profile {
        intra: link(intra),
        inter: link(inter),
        ..Profile::uniform(0.0, 1.0, gamma)
    }
}

/// What one exchange did.
struct Ran {
    name: String,
    time_s: f64,
    events: u64,
    link_bytes: Vec<u64>,
    link_busy: Vec<f64>,
    /// Bytes each physical rank sent.
    sent: Vec<u64>,
    messages: u64,
}

/// The groups of physical ranks that run an exchange of `level` together.
fn groups_of(level: Level, topology: &Topology) -> Vec<Vec<usize>> {
    let n = topology.size();
    let (nodes, local) = (topology.nodes(), topology.local_size());
    match level {
        Level::All => vec![(0..n).collect()],
        Level::Node => (0..nodes)
            .map(|h| (h * local..(h + 1) * local).collect())
            .collect(),
        Level::Rail => (0..local)
            .map(|l| (0..nodes).map(|h| h * local + l).collect())
            .collect(),
    }
}

/// The collective, algorithm and per-rank requests of `ex` for a group of
/// `n` ranks whose plans see `topology`.
fn requests(
    ex: &Exchange,
    n: usize,
    topology: &Topology,
    profile: &Profile,
) -> Result<(Collective, Algorithm, Vec<PlanRequest>), String> {
    let base = |coll, count| {
        let mut r = PlanRequest::new(coll, n, 0, count).with_topology(topology.clone());
        r.elem_size = ex.elem_size;
        r
    };
    let uniform = ex.counts.iter().all(|&c| c == ex.counts[0]);
    let (coll, reqs): (Collective, Vec<PlanRequest>) = match ex.collective {
        // Chunk j's encoding goes from every rank to rank j.
        Collective::AllToAllV if uniform => (
            Collective::AllToAll,
            vec![base(Collective::AllToAll, ex.counts[0])],
        ),
        Collective::AllToAllV => {
            let reqs = (0..n)
                .map(|r| {
                    base(Collective::AllToAllV, 0)
                        .with_counts(ex.counts.clone(), vec![ex.counts[r]; n])
                })
                .collect();
            (Collective::AllToAllV, reqs)
        }
        // Every rank's own block to every rank.
        Collective::AllGather if !uniform => {
            let reqs = (0..n)
                .map(|r| {
                    base(Collective::AllToAllV, 0)
                        .with_counts(vec![ex.counts[r]; n], ex.counts.clone())
                })
                .collect();
            (Collective::AllToAllV, reqs)
        }
        coll => (coll, vec![base(coll, ex.counts[0])]),
    };
    let algo = if coll == Collective::AllToAllV {
        Algorithm::Direct
    } else {
        let mut shape = Shape::new(coll, n, reqs[0].count, ex.elem_size);
        shape.topology = topology.clone();
        cost::candidates(&shape, profile)
            .first()
            .map(|(a, _)| *a)
            .ok_or_else(|| format!("the cost model has no algorithm for {coll}"))?
    };
    Ok((coll, algo, reqs))
}

/// Runs one exchange: all its groups at once on `net`.
fn run_exchange(
    ex: &Exchange,
    topology: &Topology,
    net: &Network,
    mode: Mode,
    opts: &SimOptions,
    profile: &Profile,
) -> Result<Ran, String> {
    let groups = groups_of(ex.level, topology);
    // Plans see the cluster's node structure where the group is the whole
    // cluster, else a flat group (as `simulate_jobs` has it).
    let group_topology = |g: &[usize]| {
        if g.len() == topology.size() {
            topology.clone()
        } else {
            Topology::flat(g.len())
        }
    };
    let mut name = String::new();
    let mut specs = Vec::with_capacity(groups.len());
    for g in &groups {
        let (coll, algo, reqs) = requests(ex, g.len(), &group_topology(g), profile)?;
        name = format!("{coll} {algo}");
        specs.push((algo, reqs));
    }
    // Bytes and messages each group rank sends, recorded as plans are
    // built (a plan may be built more than once: the estimate reads them
    // too, so the count is stored, not added).
    let counted: Vec<Mutex<HashMap<usize, (u64, u64)>>> =
        groups.iter().map(|_| Mutex::new(HashMap::new())).collect();
    let builders: Vec<_> = specs
        .iter()
        .zip(&counted)
        .map(|((algo, reqs), counted)| {
            move |rank: usize| -> Result<Plan, String> {
                let mut req = reqs[rank.min(reqs.len() - 1)].clone();
                req.rank = rank;
                let plan = plan::build(*algo, &req).map_err(|e| e.to_string())?;
                let (mut bytes, mut msgs) = (0u64, 0u64);
                for op in plan.rounds.iter().flat_map(|r| &r.ops) {
                    if let Op::Send { src, .. } = op {
                        bytes += (src.len * req.elem_size) as u64;
                        msgs += 1;
                    }
                }
                if let Ok(mut c) = counted.lock() {
                    c.insert(rank, (bytes, msgs));
                }
                Ok(plan)
            }
        })
        .collect();
    let dyns: Vec<&dyn Fn(usize) -> Result<Plan, String>> = builders
        .iter()
        .map(|b| b as &dyn Fn(usize) -> Result<Plan, String>)
        .collect();
    let engine_groups: Vec<Group<'_>> = groups
        .iter()
        .zip(&dyns)
        .map(|(g, build)| Group {
            plans: Plans::Built {
                count: g.len(),
                build: *build,
            },
            ranks: g,
        })
        .collect();
    estimate::check_unaggregated(
        &estimate::estimate_groups(&engine_groups, ex.elem_size, net, mode, opts)?,
        opts,
        "a compressed exchange runs rank by rank",
    )?;
    let traces = engine::run_groups(&engine_groups, ex.elem_size, net, mode, opts)?;
    let mut ran = Ran {
        name,
        time_s: traces.iter().map(|t| t.time_s).fold(0.0, f64::max),
        events: traces.iter().map(|t| t.events).max().unwrap_or(0),
        link_bytes: vec![0; net.links.len()],
        link_busy: vec![0.0; net.links.len()],
        sent: vec![0; topology.size()],
        messages: 0,
    };
    for t in &traces {
        for i in 0..net.links.len() {
            ran.link_bytes[i] += t.link_bytes[i];
            ran.link_busy[i] += t.link_busy[i];
        }
    }
    for (g, counted) in groups.iter().zip(&counted) {
        let counted = counted.lock().map_err(|_| "a plan builder panicked")?;
        for (&rank, &(bytes, msgs)) in counted.iter() {
            ran.sent[g[rank]] += bytes;
            ran.messages += msgs;
        }
    }
    Ok(ran)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{simulate_with, TopologySpec};

    #[test]
    fn wire_bytes_are_the_encoded_size_times_the_messages() {
        let topo = TopologySpec::parse("switch:ranks=8,bw=1GB/s,lat=5us").unwrap();
        let p = cost_profile(&topo, 0.0);
        let n = 8u64;
        let len = 8 * 128 * 64; // every chunk whole blocks: equal encodings
        let encoded =
            |spec: &str, m: usize| ferrocoll::compress::parse(spec).unwrap().encoded_len(m);
        for spec in ["int8:128", "onebit:128", "fp16", "topk:0.01"] {
            let opts = SimOptions::default();
            let r = simulate_compressed(spec, 4 * len, &topo, Mode::Contention, &opts, &p, None)
                .unwrap();
            let model = predict_all_reduce(spec, len, &topo.plan_topology(), &p, None).unwrap();
            if spec.starts_with("topk") {
                // One allgather of the payload: n - 1 copies of it leave
                // every rank, whatever the algorithm's message count.
                assert_eq!(r.sent_bytes_max, 7 * encoded(spec, len) as u64, "{r:?}");
            } else {
                // All-to-all (direct) and allgather of chunk encodings:
                // every message is one chunk's encoding.
                let chunk = encoded(spec, len / 8) as u64;
                let [a2a, ag] = &r.exchanges[..] else {
                    panic!("{spec}: {r:?}")
                };
                assert_eq!(a2a.name, "alltoall direct");
                assert_eq!(
                    (a2a.messages, a2a.bytes),
                    (n * (n - 1), n * (n - 1) * chunk)
                );
                assert_eq!(ag.bytes, n * (n - 1) * chunk, "{spec}: {ag:?}");
                if ag.name.ends_with("ring") || ag.name.ends_with("direct") {
                    assert_eq!(ag.messages, n * (n - 1));
                }
            }
            // The busiest rank sends what the cost model says, every rank
            // as much, and every byte crosses its sender's uplink once.
            assert_eq!(r.sent_bytes_max, model.wire_bytes as u64, "{spec}: {r:?}");
            assert_eq!(r.sent_bytes_total, n * r.sent_bytes_max, "{spec}");
            let up = r.per_class.iter().find(|c| c.class == "up").unwrap();
            assert_eq!(up.bytes, r.sent_bytes_total, "{spec}");
        }
    }

    #[test]
    fn compression_wins_on_a_slow_link_and_loses_on_a_tiny_message() {
        let topo = TopologySpec::parse("switch:ranks=8,bw=125MB/s,lat=5us").unwrap();
        let p = cost_profile(&topo, 0.0);
        let opts = SimOptions::default();
        let mode = Mode::Contention;
        let plain = |bytes| {
            let algo = Algorithm::Ring;
            simulate_with(Collective::AllReduce, algo, bytes, &topo, mode, &opts)
                .unwrap()
                .time_s
        };
        let big = 64 << 20;
        let c = simulate_compressed("int8", big, &topo, mode, &opts, &p, None).unwrap();
        assert!(c.time_s < plain(big) / 2.0, "{c:?} against {}", plain(big));
        assert!(c.codec_s > 0.0 && c.exchanges.len() == 2);
        let tiny = 64;
        let c = simulate_compressed("int8", tiny, &topo, mode, &opts, &p, None).unwrap();
        // Against every uncompressed allreduce algorithm: the two-phase
        // form's two rounds are the direct allreduce's, plus the codec.
        let best = Algorithm::ALL
            .iter()
            .filter_map(|&a| a.for_collective(Collective::AllReduce))
            .filter_map(|a| simulate_with(Collective::AllReduce, a, tiny, &topo, mode, &opts).ok())
            .map(|r| r.time_s)
            .fold(f64::INFINITY, f64::min);
        assert!(c.time_s > best, "{c:?} against {best}");
    }

    #[test]
    fn every_codec_runs_flat_and_hierarchical() {
        let two_level =
            TopologySpec::parse("two-level:nodes=2,gpus=4,intra=100GB/s@1us,inter=1GB/s@5us")
                .unwrap();
        let flat = TopologySpec::parse("switch:ranks=5,bw=1GB/s,lat=5us").unwrap();
        for topo in [&two_level, &flat] {
            let p = cost_profile(topo, 0.0);
            for spec in [
                "fp16",
                "bf16",
                "int8:64",
                "onebit",
                "topk:0.01",
                "randk:0.01",
                "powersgd:2",
            ] {
                let r = simulate_compressed(
                    spec,
                    4 * 10_000,
                    topo,
                    Mode::Contention,
                    &SimOptions::default(),
                    &p,
                    None,
                )
                .unwrap();
                assert!(
                    r.time_s > r.exchange_s && r.exchange_s > 0.0,
                    "{spec}: {r:?}"
                );
            }
        }
        let r = simulate_compressed(
            "int8",
            4 << 20,
            &two_level,
            Mode::Contention,
            &SimOptions::default(),
            &cost_profile(&two_level, 0.0),
            None,
        )
        .unwrap();
        assert_eq!(r.algorithm, "hier-two-phase");
        assert_eq!(r.exchanges.len(), 4);
    }
}
