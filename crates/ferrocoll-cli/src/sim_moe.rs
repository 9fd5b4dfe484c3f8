//! `ferrocoll sim moe`: an MoE layer's dispatch and combine, every schedule,
//! on the simulator's modelled cluster.
//!
//! The count matrix is the one `ferrocoll bench moe` would observe: every
//! rank's router output from the same generator and seed
//! (`moe::reference`'s `Routing::Sampled`), counted per (rank, expert,
//! choice) as the count exchange carries it, and decided by the
//! dispatcher's own rule ([`plans::CountMatrix::decide`]). Each schedule's
//! exchange becomes the plans the executor runs ([`plans::plan`]: the
//! all-to-all-v calls of the schedule with its per-peer counts, the phases
//! of the hierarchical ones on their sub-groups), simulated in full (an
//! all-to-all-v of uneven counts has no symmetry to aggregate by). `auto`
//! is what the cost model picks for the matrix on the cluster's links
//! ([`moe::model::price`], [`moe::model::choose`]), as a dispatcher on such
//! a cluster would.
//!
//! Also the home of `ferrocoll sim`'s argument shape: a collective's
//! arguments ([`sim::SimArgs`]) or a subcommand (`moe`).

use std::io::{self, Write};
use std::time::Instant;

use clap::{Args, Subcommand};
use ferrocoll::cost::Profile;
use ferrocoll::moe::model::{self as moe, Skew};
use ferrocoll::moe::plans::{self, CountMatrix};
use ferrocoll::moe::reference::{Case, Routing};
use ferrocoll::moe::{Policy, Schedule, Spec};
use ferrocoll::Collective;
use ferrocoll_sim::{Mode, Network, SimOptions, SimResult, TopologySpec};
use serde_json::{json, Value};

use crate::error::CliError;
use crate::model::parse_seconds;
use crate::model_moe::{parse_capacity, LayerArgs};
use crate::sim;

/// Arguments of `ferrocoll sim`: a collective's, or a subcommand.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct SimCommand {
    #[command(subcommand)]
    sub: Option<SimSub>,
    #[command(flatten)]
    collective: Option<sim::SimArgs>,
}

#[derive(Debug, Subcommand)]
enum SimSub {
    /// An MoE layer's dispatch and combine: the count matrix `bench moe`
    /// would observe, every schedule's plans on the modelled cluster (time,
    /// bytes per link class, hottest link, the rank the critical path ends
    /// at), and what `auto` would pick.
    Moe(MoeSimArgs),
}

/// Arguments of `ferrocoll sim moe`.
#[derive(Debug, Args)]
pub struct MoeSimArgs {
    /// Tokens on each rank (as `bench moe --tokens`; `model moe --tokens`
    /// is all ranks' together).
    #[arg(long, default_value_t = 512)]
    tokens: usize,
    #[command(flatten)]
    layer: LayerArgs,
    /// Choices per token.
    #[arg(long, default_value_t = 2)]
    topk: usize,
    /// Ranks on one switch (`switch:ranks=P,bw=50GB/s,lat=3us`, the seeds'
    /// NDR), instead of --topology.
    #[arg(short = 'n', long, conflicts_with = "topology")]
    ranks: Option<usize>,
    /// The cluster, as `ferrocoll sim --topology` takes it (e.g.
    /// `two-level:nodes=4,gpus=8,intra=450GB/s@1us,inter=25GB/s@2us`); its
    /// nodes are the hosts of the two-level and rail schedules.
    #[arg(long)]
    topology: Option<String>,
    /// Routing: uniform, or zipf:S (expert e with probability ∝ (e+1)^-S;
    /// expert 0, on rank 0, the hottest).
    #[arg(long, default_value = "uniform")]
    skew: Skew,
    /// Capacity factor C (each expert keeps ceil(P·T·k/E · C) rows, the
    /// rest drop), or `dropless`.
    #[arg(long, default_value = "dropless", value_parser = parse_capacity)]
    capacity: Policy,
    /// One schedule only: direct, pairwise, two-level, rail, or auto (the
    /// one the cost model picks, for dispatch and combine each). Default:
    /// every candidate of the topology.
    #[arg(long)]
    schedule: Option<Schedule>,
    /// Seed of the routing (as `bench moe --seed`).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Per-message overhead o, as TIME (every port) or CLASS:TIME (the
    /// sender's ports of that link class, e.g. `nic-up:10us`; repeatable):
    /// each message holds its sender's port this long before its bytes (the
    /// software start-up that aggregating messages saves). The cost model
    /// behind `auto` gets the o of the ports rank 0 sends through within
    /// and between nodes.
    #[arg(long, value_name = "[CLASS:]TIME", value_parser = parse_overhead)]
    overhead: Vec<(String, f64)>,
    /// Price `auto`'s candidates with this profile (written by `ferrocoll
    /// calibrate`, as a dispatcher would under FERROCOLL_PROFILE) instead
    /// of the cluster's links: the simulated times stay the cluster's.
    #[arg(long)]
    profile: Option<std::path::PathBuf>,
    /// `ideal` (no contention) or `contention` (links are FIFO queues of
    /// 64 KiB chunks).
    #[arg(long, default_value = "contention", value_parser = ["ideal", "contention"])]
    mode: String,
    /// The memory the simulation may use (as `ferrocoll sim
    /// --memory-limit`); a run that would need more is refused with the
    /// estimate.
    #[arg(long, value_name = "SIZE")]
    memory_limit: Option<String>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

/// `[CLASS:]TIME` of `--overhead`; a bare time applies to every port.
fn parse_overhead(s: &str) -> Result<(String, f64), String> {
    let (class, time) = match s.rsplit_once(':') {
        Some((c, t)) => (c.trim().to_string(), t),
        None => ("*".to_string(), s),
    };
    let t = parse_seconds(time.trim())
        .map_err(|e| format!("--overhead {s:?}: {e}; e.g. 10us or nic-up:10us"))?;
    if class.is_empty() {
        return Err(format!(
            "--overhead {s:?}: name a link class before the colon, or give only a time"
        ));
    }
    Ok((class, t))
}

/// The overhead `opts` gives a message from rank `a` to rank `b` on its
/// sender's port (the cost model's o for that link class).
fn overhead_between(net: &Network, given: &[(String, f64)], a: usize, b: usize) -> f64 {
    let Some(&first) = net.path(a, b).links().first() else {
        return 0.0;
    };
    let (class, name) = (
        &net.classes[net.links[first as usize].class],
        net.link_name(first as usize),
    );
    given
        .iter()
        .rev()
        .find(|(n, _)| n == "*" || n == class || *n == name)
        .map_or(0.0, |g| g.1)
}

/// `--overhead` as the header prints it.
fn overhead_text(given: &[(String, f64)]) -> String {
    if given.is_empty() {
        return "none".to_string();
    }
    let parts: Vec<String> = given
        .iter()
        .map(|(c, t)| format!("{c} {:.3} us", t * 1e6))
        .collect();
    parts.join(", ")
}

/// Runs `ferrocoll sim`.
pub fn main(cmd: &SimCommand) -> Result<(), CliError> {
    match (&cmd.sub, &cmd.collective) {
        (Some(SimSub::Moe(args)), _) => moe_main(args),
        (None, Some(args)) => sim::main(args),
        (None, None) => Err(CliError::Usage(
            "name a collective (ferrocoll sim allreduce ...) or `moe`".into(),
        )),
    }
}

/// The observed count matrix of `a` on `ranks` ranks, and the expert with
/// the most kept rows.
fn observe(a: &MoeSimArgs, ranks: usize) -> Result<(CountMatrix, usize), CliError> {
    let spec = Spec::new(a.layer.experts, a.layer.hidden, a.topk, a.capacity);
    let (e_all, k) = (a.layer.experts, a.topk);
    let case = Case {
        ranks,
        experts: e_all,
        hidden: a.layer.hidden,
        topk: k,
        // The reference's own capacity is not used: the dispatcher's rule
        // decides, below.
        capacity: None,
        tokens: vec![a.tokens; ranks],
        routing: Routing::Sampled {
            skew: a.skew,
            seed: a.seed,
        },
    };
    let mut routed = vec![0usize; ranks * e_all * k];
    for s in 0..ranks {
        let (idx, _) = case.route(s);
        for (pair, &e) in idx.iter().enumerate() {
            routed[(s * e_all + e as usize) * k + pair % k] += 1;
        }
    }
    let m = CountMatrix::decide(&routed, ranks, &spec).map_err(CliError::Lib)?;
    // The hottest expert by pairs routed to it.
    let load = |e: usize| {
        (0..ranks * k)
            .map(|q| routed[(q / k * e_all + e) * k + q % k])
            .sum::<usize>()
    };
    let hot = (0..e_all)
        .max_by_key(|&e| (load(e), std::cmp::Reverse(e)))
        .unwrap_or(0);
    Ok((m, hot))
}

/// Rank with the most bytes received from (`recv`) or sent to other ranks,
/// and those bytes.
fn busiest(m: &CountMatrix, row_bytes: usize, recv: bool) -> (usize, usize) {
    let p = m.ranks;
    let of = |r: usize| {
        (0..p)
            .filter(|&o| o != r)
            .map(|o| {
                if recv {
                    m.rows[o * p + r]
                } else {
                    m.rows[r * p + o]
                }
            })
            .sum::<usize>()
            * row_bytes
    };
    (0..p)
        .map(|r| (r, of(r)))
        .fold((0, 0), |best, x| if x.1 > best.1 { x } else { best })
}

/// One exchange simulated, with what the cost model predicted for it.
struct Run {
    result: SimResult,
    predicted_s: Option<f64>,
}

fn run_json(r: &Run) -> Value {
    let s = &r.result;
    let cp = &s.critical_path;
    json!({
        "time_us": s.time_s * 1e6,
        "predicted_us": r.predicted_s.map(|t| t * 1e6),
        "hottest_link": s.hottest_link,
        "links": s.per_class.iter().map(|c| json!({
            "class": c.class, "bytes": c.bytes, "utilization": c.utilization,
        })).collect::<Vec<_>>(),
        "critical_path": {
            "end_rank": cp.end_rank, "messages": cp.messages, "ranks": cp.ranks,
            "latency_us": cp.latency_s * 1e6, "transmission_us": cp.transmission_s * 1e6,
            "queueing_us": cp.queueing_s * 1e6,
        },
        "events": s.events,
    })
}

/// Every candidate's predicted time, by schedule name, in microseconds.
fn predictions(candidates: &[moe::Candidate]) -> Value {
    candidates
        .iter()
        .map(|c| (c.schedule.name().to_string(), json!(c.cost.total() * 1e6)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

fn moe_main(a: &MoeSimArgs) -> Result<(), CliError> {
    let spec_text = match (&a.topology, a.ranks) {
        (Some(t), _) => t.clone(),
        (None, Some(p)) => format!("switch:ranks={p},bw=50GB/s,lat=3us"),
        (None, None) => {
            return Err(CliError::Usage(
                "give --ranks P (one switch) or --topology SPEC".into(),
            ))
        }
    };
    let topo = TopologySpec::parse(&spec_text).map_err(CliError::Usage)?;
    let p = topo.ranks();
    let plan_topology = topo.plan_topology();
    let row_bytes = a.layer.hidden * a.layer.dtype.size();
    let (m, hot_expert) = observe(a, p)?;
    let back = m.transpose();
    let mode = if a.mode == "ideal" {
        Mode::Ideal
    } else {
        Mode::Contention
    };
    let opts = SimOptions {
        message_overhead: a.overhead.clone(),
        memory_limit: match &a.memory_limit {
            None => None,
            Some(s) => Some(sim::parse_bytes("--memory-limit", s).map_err(CliError::Usage)? as u64),
        },
        ..SimOptions::default()
    };
    let profile = match &a.profile {
        Some(path) => Profile::load(path).map_err(CliError::Usage)?,
        None => {
            let mut profile = ferrocoll_sim::cost_profile(&topo, 0.0);
            let net = Network::new(&topo);
            let inner = plan_topology.local_size().max(1);
            let far = if inner < p { inner } else { p - 1 };
            profile.intra.overhead = overhead_between(&net, &a.overhead, 0, 1.min(p - 1));
            profile.inter.overhead = overhead_between(&net, &a.overhead, 0, far);
            profile
        }
    };
    let as_f64 = |rows: &[usize]| -> Vec<Vec<f64>> {
        rows.chunks(p)
            .map(|r| r.iter().map(|&x| x as f64).collect())
            .collect()
    };
    let priced = [
        moe::price(&as_f64(&m.rows), row_bytes as f64, &plan_topology, &profile),
        moe::price(
            &as_f64(&back.rows),
            row_bytes as f64,
            &plan_topology,
            &profile,
        ),
    ];
    let auto = [0, 1].map(|i| moe::choose(&priced[i]).map_or(Schedule::Direct, |c| c.schedule));
    let candidates: Vec<Schedule> = priced[0].iter().map(|c| c.schedule).collect();
    let schedules: Vec<Schedule> = match a.schedule {
        None => candidates.clone(),
        Some(Schedule::Auto) => {
            let mut v = vec![auto[0]];
            if auto[1] != auto[0] {
                v.push(auto[1]);
            }
            v
        }
        Some(Schedule::Flat) => vec![Schedule::Direct],
        Some(s) => vec![s],
    };
    let total_bytes: usize = m.rows.iter().sum::<usize>() * row_bytes;
    let simulate = |s: Schedule, cm: &CountMatrix, c: usize| -> Result<Run, CliError> {
        let build = |r: usize| {
            plans::plan(s, &cm.rows, a.layer.hidden, &plan_topology, r).map_err(|e| e.to_string())
        };
        let result = ferrocoll_sim::simulate_plans(
            &build,
            a.layer.dtype.size(),
            (Collective::AllToAllV, total_bytes),
            &topo,
            mode,
            &opts,
        )
        .map_err(CliError::Run)?;
        let predicted_s = priced[c]
            .iter()
            .find(|x| x.schedule == s)
            .map(|x| x.cost.total());
        Ok(Run {
            result,
            predicted_s,
        })
    };
    let start = Instant::now();
    let mut runs = Vec::new();
    for &s in &schedules {
        runs.push((s, simulate(s, &m, 0)?, simulate(s, &back, 1)?));
    }
    let wall = start.elapsed().as_secs_f64();

    let local = a.layer.experts / p;
    let hot_rank = hot_expert / local.max(1);
    let (recv_rank, recv_bytes) = busiest(&m, row_bytes, true);
    let (send_rank, send_bytes) = busiest(&m, row_bytes, false);
    let remote_bytes: usize = (0..p * p)
        .filter(|q| q / p != q % p)
        .map(|q| m.rows[q] * row_bytes)
        .sum();
    let mut out = io::stdout().lock();
    if a.json {
        let report = json!({
            "topology": spec_text, "ranks": p, "plan_topology": plan_topology.to_string(),
            "tokens": a.tokens, "hidden": a.layer.hidden, "dtype": a.layer.dtype.name(), "row_bytes": row_bytes,
            "experts": a.layer.experts, "topk": a.topk, "skew": a.skew.to_string(), "seed": a.seed,
            "capacity_rows": m.capacity, "dropped": m.dropped,
            "overhead_us": a.overhead.iter().map(|(c, t)| (c.clone(), json!(t * 1e6))).collect::<serde_json::Map<_, _>>(),
            "mode": a.mode,
            "matrix": {
                "rows": m.rows.iter().sum::<usize>(), "bytes": total_bytes, "remote_bytes": remote_bytes,
                "max_recv_rank": recv_rank, "max_recv_bytes": recv_bytes,
                "max_send_rank": send_rank, "max_send_bytes": send_bytes,
                "hot_expert": hot_expert, "hot_expert_rank": hot_rank,
            },
            "auto": {"dispatch": auto[0].name(), "combine": auto[1].name()},
            "predicted_us": {"dispatch": predictions(&priced[0]), "combine": predictions(&priced[1])},
            "schedules": runs.iter().map(|(s, d, c)| json!({
                "schedule": s.name(), "dispatch": run_json(d), "combine": run_json(c),
            })).collect::<Vec<_>>(),
            "wall_s": wall,
        });
        writeln!(out, "{report}")?;
        return Ok(());
    }
    writeln!(
        out,
        "# ferrocoll sim moe: {p} ranks on {spec_text} (hosts {plan_topology}), {} tokens a rank x \
         hidden {} {} ({row_bytes} B a row), top-{} of {} experts, {}, skew {}, seed {}, overhead {}, \
         {} mode",
        a.tokens,
        a.layer.hidden,
        a.layer.dtype.name(),
        a.topk,
        a.layer.experts,
        match m.capacity {
            Some(c) => format!("capacity {c} rows an expert ({} pairs dropped)", m.dropped),
            None => "dropless".to_string(),
        },
        a.skew,
        a.seed,
        overhead_text(&a.overhead),
        a.mode
    )?;
    writeln!(
        out,
        "# dispatch matrix: {} rows, {remote_bytes} B between ranks; most received: rank \
         {recv_rank} ({recv_bytes} B); most sent: rank {send_rank} ({send_bytes} B); hottest \
         expert {hot_expert} on rank {hot_rank} (combine is the transpose)",
        m.rows.iter().sum::<usize>()
    )?;
    writeln!(
        out,
        "# {:<10} {:<9} {:>12} {:>12} {:>8} {:>14}  links (bytes)",
        "schedule", "phase", "sim(us)", "model(us)", "cp-rank", "hottest link"
    )?;
    for (s, d, c) in &runs {
        for (phase, r) in [("dispatch", d), ("combine", c)] {
            let links: Vec<String> = r
                .result
                .per_class
                .iter()
                .map(|c| format!("{} {}", c.class, c.bytes))
                .collect();
            writeln!(
                out,
                "  {:<10} {:<9} {:>12.2} {:>12} {:>8} {:>14}  {}",
                s.name(),
                phase,
                r.result.time_s * 1e6,
                r.predicted_s
                    .map_or("-".to_string(), |t| format!("{:.2}", t * 1e6)),
                r.result.critical_path.end_rank,
                r.result.hottest_link,
                links.join(", ")
            )?;
        }
    }
    let fastest = |i: usize| {
        runs.iter()
            .min_by(|x, y| {
                let t = |r: &(Schedule, Run, Run)| {
                    if i == 0 {
                        r.1.result.time_s
                    } else {
                        r.2.result.time_s
                    }
                };
                t(x).total_cmp(&t(y))
            })
            .map_or("-", |r| r.0.name())
    };
    writeln!(
        out,
        "# auto (the cost model on this matrix and these links) picks dispatch {}, combine {}; \
         fastest simulated: dispatch {}, combine {}",
        auto[0].name(),
        auto[1].name(),
        fastest(0),
        fastest(1)
    )?;
    writeln!(
        out,
        "# simulated {} exchanges in {wall:.3} s (cp-rank: the rank the critical path ends at)",
        runs.len() * 2
    )?;
    Ok(())
}
