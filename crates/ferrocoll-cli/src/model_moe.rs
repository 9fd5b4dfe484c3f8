//! `ferrocoll model moe`: what an MoE layer's exchange (the count exchange,
//! dispatch and combine of `ferrocoll::moe`) costs, from
//! [`ferrocoll::moe::model`], without running anything.
//!
//! Also the home of `ferrocoll model`'s argument shape: a collective's
//! arguments ([`model::ModelArgs`]) or a subcommand (`moe`), as clap's
//! git-style "args or subcommand".

use std::io::{self, Write};

use clap::{Args, Subcommand};
use ferrocoll::cost::{Cost, LinkParams, Profile};
use ferrocoll::moe::model::{self as moe, Skew, Workload};
use ferrocoll::moe::Policy;
use ferrocoll::{DType, Topology};
use serde::Serialize;

use crate::error::CliError;
use crate::model::{self, parse_rate, parse_seconds};

/// Arguments of `ferrocoll model`: a collective's, or a subcommand.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct ModelCommand {
    #[command(subcommand)]
    sub: Option<ModelSub>,
    #[command(flatten)]
    collective: Option<model::ModelArgs>,
}

#[derive(Debug, Subcommand)]
enum ModelSub {
    /// An MoE layer's exchange: the count exchange, dispatch and combine of
    /// `ferrocoll::moe` (bytes per rank, the busiest rank's send and
    /// receive, and the predicted time of each phase). Links default to the
    /// seed's InfiniBand NDR (alpha 3 us, beta 50 GB/s), so that
    /// `ferrocoll model moe --tokens 4096 --hidden 2048 --dtype bf16
    /// --experts 64 --ranks 8` is Napkin Math 1.4.
    Moe(MoeArgs),
}

/// The layer's shape, as `model moe` and `sim moe` take it.
#[derive(Debug, Args)]
pub(crate) struct LayerArgs {
    /// Elements per token row.
    #[arg(long, default_value_t = 2048)]
    pub(crate) hidden: usize,
    /// Element type of the rows.
    #[arg(long, default_value = "bf16")]
    pub(crate) dtype: DType,
    /// Experts in all (a multiple of the ranks).
    #[arg(long, default_value_t = 64)]
    pub(crate) experts: usize,
}

/// Arguments of `ferrocoll model moe`.
#[derive(Debug, Args)]
pub struct MoeArgs {
    /// Tokens of all ranks together (the batch; split evenly over the ranks).
    #[arg(long, default_value_t = 4096)]
    tokens: usize,
    #[command(flatten)]
    layer: LayerArgs,
    /// Ranks (the expert-parallel group).
    #[arg(short = 'n', long, default_value_t = 8)]
    ranks: usize,
    /// Choices per token.
    #[arg(long, default_value_t = 1)]
    topk: usize,
    /// Capacity factor C (each expert keeps ceil(tokens·topk/experts · C)
    /// rows, the rest drop), or `dropless`.
    #[arg(long, default_value = "dropless", value_parser = parse_capacity)]
    capacity: Policy,
    /// Routing: uniform, or zipf:S (expert e with probability ∝ (e+1)^-S;
    /// expert 0, on rank 0, the hottest).
    #[arg(long, default_value = "uniform")]
    skew: Skew,
    /// Per-message latency (within a node with --topo).
    #[arg(long, default_value = "3us", value_parser = parse_seconds)]
    alpha: f64,
    /// Bandwidth of one port (within a node with --topo).
    #[arg(long, default_value = "50GB/s", value_parser = parse_rate)]
    beta: f64,
    /// LogGP per-message overhead o (each further message in flight).
    #[arg(long, default_value = "0ns", value_parser = parse_seconds)]
    overhead: f64,
    /// Time per byte of the weighted sum in combine (0 as in the seed).
    #[arg(long, default_value = "0ns", value_parser = parse_seconds)]
    gamma: f64,
    /// Time per byte of a local copy (packing, regrouping by expert).
    #[arg(long, default_value = "0ns", value_parser = parse_seconds)]
    copy: f64,
    /// Topology, outermost level first (e.g. 2x4: 2 nodes of 4 ranks).
    #[arg(long)]
    topo: Option<Topology>,
    /// Latency between nodes (defaults to --alpha).
    #[arg(long, value_parser = parse_seconds)]
    alpha_inter: Option<f64>,
    /// Bandwidth between nodes (defaults to --beta).
    #[arg(long, value_parser = parse_rate)]
    beta_inter: Option<f64>,
    /// A profile written by `ferrocoll calibrate`, instead of the link
    /// options.
    #[arg(long, conflicts_with_all = ["alpha", "beta", "overhead", "gamma", "copy", "alpha_inter", "beta_inter"])]
    profile: Option<std::path::PathBuf>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

pub(crate) fn parse_capacity(s: &str) -> Result<Policy, String> {
    if s.eq_ignore_ascii_case("dropless") {
        return Ok(Policy::Dropless);
    }
    match s.parse::<f64>() {
        Ok(c) if c.is_finite() && c > 0.0 => Ok(Policy::Drop { capacity_factor: c }),
        _ => Err(format!(
            "`{s}` is not a capacity factor; use a positive number (1.0, 1.25) or dropless"
        )),
    }
}

/// Runs `ferrocoll model`.
pub fn main(cmd: &ModelCommand) -> Result<(), CliError> {
    match (&cmd.sub, &cmd.collective) {
        (Some(ModelSub::Moe(args)), _) => moe_main(args),
        (None, Some(args)) => model::main(args),
        (None, None) => Err(CliError::Usage(
            "name a collective (ferrocoll model allreduce ...) or `moe`".into(),
        )),
    }
}

#[derive(Serialize)]
struct PhaseOut {
    phase: &'static str,
    algo: &'static str,
    time_us: f64,
    latency_us: f64,
    bandwidth_us: f64,
    compute_us: f64,
}

impl PhaseOut {
    fn new(phase: &'static str, algo: &'static str, cost: Cost) -> PhaseOut {
        PhaseOut {
            phase,
            algo,
            time_us: cost.total() * 1e6,
            latency_us: cost.latency * 1e6,
            bandwidth_us: cost.bandwidth * 1e6,
            compute_us: cost.compute * 1e6,
        }
    }
}

#[derive(Serialize)]
struct Report {
    tokens: usize,
    tokens_per_rank: Vec<usize>,
    hidden: usize,
    dtype: &'static str,
    row_bytes: usize,
    experts: usize,
    ranks: usize,
    topk: usize,
    capacity_factor: Option<f64>,
    capacity_rows: Option<usize>,
    skew: String,
    expert_load_max: f64,
    dropped: f64,
    max_send_bytes: f64,
    max_recv_bytes: f64,
    max_message_bytes: f64,
    padded_send_bytes: f64,
    phases: Vec<PhaseOut>,
    /// Count exchange + dispatch + combine under the schedules `auto`
    /// chooses (the cheapest of each phase, ties to the fewest rounds).
    layer_us: f64,
}

fn moe_main(a: &MoeArgs) -> Result<(), CliError> {
    let topology = match &a.topo {
        Some(t) => t.clone(),
        None => Topology::flat(a.ranks.max(1)),
    };
    let profile = match &a.profile {
        Some(path) => Profile::load(path).map_err(CliError::Usage)?,
        None => {
            let link = |alpha, beta| LinkParams {
                alpha,
                beta,
                overhead: a.overhead,
                piece: 0.0,
            };
            let mut p = Profile::uniform(a.alpha, a.beta, a.gamma);
            p.intra = link(a.alpha, a.beta);
            p.inter = link(
                a.alpha_inter.unwrap_or(a.alpha),
                a.beta_inter.unwrap_or(a.beta),
            );
            p.copy = a.copy;
            p
        }
    };
    let w = Workload {
        tokens: a.tokens,
        hidden: a.layer.hidden,
        elem_size: a.layer.dtype.size(),
        experts: a.layer.experts,
        ranks: a.ranks,
        topk: a.topk,
        policy: a.capacity,
        skew: a.skew,
        topology: topology.clone(),
    };
    let r = moe::predict(&w, &profile).map_err(CliError::Lib)?;
    let mut phases = vec![PhaseOut::new(
        "counts",
        r.counts.algorithm.name(),
        r.counts.cost,
    )];
    for (name, candidates) in [("dispatch", &r.dispatch), ("combine", &r.combine)] {
        phases.extend(
            candidates
                .iter()
                .map(|c| PhaseOut::new(name, c.schedule.name(), c.cost)),
        );
    }
    let report = Report {
        tokens: a.tokens,
        tokens_per_rank: r.tokens_per_rank.clone(),
        hidden: a.layer.hidden,
        dtype: a.layer.dtype.name(),
        row_bytes: r.row_bytes,
        experts: a.layer.experts,
        ranks: a.ranks,
        topk: a.topk,
        capacity_factor: match a.capacity {
            Policy::Drop { capacity_factor } => Some(capacity_factor),
            Policy::Dropless => None,
        },
        capacity_rows: r.capacity,
        skew: a.skew.to_string(),
        expert_load_max: r.expert_load.iter().fold(0.0, |m: f64, &x| m.max(x)),
        dropped: r.dropped,
        max_send_bytes: r.max_send_bytes,
        max_recv_bytes: r.max_recv_bytes,
        max_message_bytes: r.max_message_bytes,
        padded_send_bytes: r.padded_send_bytes,
        phases,
        layer_us: r.layer().total() * 1e6,
    };
    let mut out = io::stdout().lock();
    if a.json {
        let text = serde_json::to_string(&report).expect("plain data serialises");
        writeln!(out, "{text}")?;
        return Ok(());
    }
    print_table(&mut out, &report, &profile, &topology)?;
    Ok(())
}

fn print_table(
    out: &mut impl Write,
    r: &Report,
    profile: &Profile,
    topology: &Topology,
) -> io::Result<()> {
    let per_rank = r.tokens_per_rank.iter().copied().max().unwrap_or(0);
    let capacity = match (r.capacity_factor, r.capacity_rows) {
        (Some(c), Some(rows)) => format!("capacity factor {c} ({rows} rows an expert)"),
        _ => "dropless".to_string(),
    };
    writeln!(
        out,
        "# moe exchange: {} tokens (up to {per_rank} a rank) x hidden {} {} ({} B a row), \
         top-{} of {} experts on {} ranks ({} a rank), {capacity}, skew {}",
        r.tokens,
        r.hidden,
        r.dtype,
        r.row_bytes,
        r.topk,
        r.experts,
        r.ranks,
        r.experts / r.ranks.max(1),
        r.skew
    )?;
    writeln!(
        out,
        "# alpha {:.3} us, beta {:.3} GB/s, o {:.3} us, copy {:.4} ns/B, gamma {:.4} ns/B \
         (topology {topology})",
        profile.intra.alpha * 1e6,
        profile.intra.beta / 1e9,
        profile.intra.overhead * 1e6,
        profile.copy * 1e9,
        profile.gamma * 1e9
    )?;
    if profile.inter != profile.intra {
        writeln!(
            out,
            "# between nodes: alpha {:.3} us, beta {:.3} GB/s, o {:.3} us",
            profile.inter.alpha * 1e6,
            profile.inter.beta / 1e9,
            profile.inter.overhead * 1e6
        )?;
    }
    writeln!(
        out,
        "# busiest rank: sends {:.0} B to other ranks, receives {:.0} B; largest message {:.0} B; \
         busiest expert {:.1} pairs; expected drops {:.1} of {} pairs",
        r.max_send_bytes,
        r.max_recv_bytes,
        r.max_message_bytes,
        r.expert_load_max,
        r.dropped,
        r.tokens * r.topk
    )?;
    writeln!(
        out,
        "# an equal-split all_to_all padded to {} (DeepSpeed-MoE) would send {:.0} B a rank",
        if r.capacity_rows.is_some() {
            "capacity"
        } else {
            "the busiest expert's load"
        },
        r.padded_send_bytes
    )?;
    writeln!(
        out,
        "# {:<10} {:<10} {:>12} {:>12} {:>12} {:>12}",
        "phase", "algo", "time(us)", "latency", "bandwidth", "compute"
    )?;
    for p in &r.phases {
        writeln!(
            out,
            "  {:<10} {:<10} {:>12.3} {:>12.3} {:>12.3} {:>12.3}",
            p.phase, p.algo, p.time_us, p.latency_us, p.bandwidth_us, p.compute_us
        )?;
    }
    writeln!(
        out,
        "# layer (counts + dispatch + combine, the schedule auto chooses for each): {:.3} us",
        r.layer_us
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_parses() {
        assert_eq!(parse_capacity("dropless"), Ok(Policy::Dropless));
        assert_eq!(
            parse_capacity("1.25"),
            Ok(Policy::Drop {
                capacity_factor: 1.25
            })
        );
        assert!(parse_capacity("0").is_err());
        assert!(parse_capacity("lots").is_err());
    }
}
