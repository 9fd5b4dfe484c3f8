//! `ferrocoll model`: what every algorithm of a collective would cost, from
//! the closed forms of the cost model, without running anything.
//!
//! Prints each candidate's predicted time split into latency, bandwidth and
//! compute terms, the choice, the critical message size n* = alpha·beta, and
//! the sizes where the cheapest algorithm changes; and for each candidate
//! the LogGP split ([`cost::overlap`]): how much of its time the busiest
//! rank's CPU works (o per message, gamma per reduced byte) and how much
//! could hide behind computation.

use std::io::{self, Write};

use clap::Args;
use ferrocoll::cost::{self, Cost, LinkParams, LogGp, Overlap, Profile, Shape};
use ferrocoll::{Collective, DType, Topology};
use serde::Serialize;

use crate::error::CliError;

/// Arguments of `ferrocoll model`.
#[derive(Debug, Args)]
pub struct ModelArgs {
    /// The collective: allreduce, allgather, reducescatter, alltoall, bcast,
    /// reduce, gather, scatter or barrier.
    #[arg(value_parser = parse_collective)]
    coll: Collective,
    /// Number of ranks.
    #[arg(short = 'n', long = "ranks", default_value_t = 8)]
    ranks: usize,
    /// Size of the call as nccl-tests counts it (the whole n-block buffer for
    /// the block collectives): an integer, or with KB/MB/GB (powers of 1000)
    /// or KiB/MiB/GiB (powers of 1024).
    #[arg(short = 'b', long, default_value = "1MiB", value_parser = parse_bytes)]
    bytes: usize,
    /// Element type (sets the element size).
    #[arg(long, default_value = "f32")]
    dtype: DType,
    /// Per-message latency within a node: e.g. 10us, 500ns, 1ms.
    #[arg(long, default_value = "10us", value_parser = parse_seconds)]
    alpha: f64,
    /// Bandwidth of one port within a node: e.g. 10GB/s, 800MB/s.
    #[arg(long, default_value = "10GB/s", value_parser = parse_rate)]
    beta: f64,
    /// Per-message overhead o within a node (LogGP): each further message a
    /// rank has in flight in one step costs this much more, e.g. 1us.
    #[arg(long, default_value = "0ns", value_parser = parse_seconds)]
    overhead: f64,
    /// Per-message overhead between nodes (defaults to --overhead).
    #[arg(long, value_parser = parse_seconds)]
    overhead_inter: Option<f64>,
    /// Pipeline piece: a round pays its message's first this-many bytes
    /// once more at beta, the part of a transport's two copies (into a ring
    /// or socket, and out of it) that does not overlap (`LinkParams::piece`;
    /// `ferrocoll calibrate` fits it). 0: the plain alpha-beta model.
    #[arg(long, default_value = "0", value_parser = parse_bytes)]
    piece: usize,
    /// Reduction cost: a rate (e.g. 20GB/s) or a time per byte (e.g. 0.05ns).
    #[arg(long, default_value = "20GB/s", value_parser = parse_gamma)]
    gamma: f64,
    /// Cost of a local copy (own blocks, scratch, packing): a rate (e.g.
    /// 50GB/s) or a time per byte (e.g. 0.02ns); 0ns makes copies free.
    #[arg(long, default_value = "0ns", value_parser = parse_gamma)]
    copy: f64,
    /// Working set (every rank's buffers together) beyond which links run
    /// at --beta-mem, e.g. 32MiB; needs --beta-mem.
    #[arg(long, value_parser = parse_bytes, requires = "beta_mem")]
    cache: Option<usize>,
    /// Bandwidth of a port once the working set exceeds --cache.
    #[arg(long, value_parser = parse_rate, requires = "cache")]
    beta_mem: Option<f64>,
    /// Cost of a local copy once the working set exceeds --cache (a rate or
    /// a time per byte, as --copy); default: --copy everywhere.
    #[arg(long, value_parser = parse_gamma, requires = "cache")]
    copy_mem: Option<f64>,
    /// Topology, outermost level first (e.g. 4x8: 4 nodes of 8 ranks).
    #[arg(long)]
    topo: Option<Topology>,
    /// Latency between nodes (defaults to --alpha).
    #[arg(long, value_parser = parse_seconds)]
    alpha_inter: Option<f64>,
    /// Inter-node ports per node that the node's ranks share (1: a host
    /// with one NIC, --beta-inter is its bandwidth); 0: every rank has its
    /// own (as with a NIC per GPU).
    #[arg(long, default_value_t = 0.0)]
    inter_ports: f64,
    /// Cores serving one node's ranks: when an algorithm keeps more ranks
    /// of a node moving bytes at once, each gets a share of a core (beta
    /// divided, gamma and the copy cost multiplied by busy/cores); 0: a
    /// core per rank.
    #[arg(long, default_value_t = 0.0)]
    cores: f64,
    /// Only a message's receiver moves its bytes (a receive copies from the
    /// sender's buffer, as on the thread transport): a rank pays per byte
    /// for what it receives, not for the larger of what it sends and
    /// receives.
    #[arg(long)]
    receiver_copies: bool,
    /// Both ends of a message copy it with their own core (shared memory,
    /// sockets on one host): a rank pays for half of what it sends plus
    /// what it receives, so a one-way round (a tree's, a star's) costs half
    /// an exchange's per byte; without it, the larger of the two.
    #[arg(long)]
    two_sided_copies: bool,
    /// Bandwidth between nodes (defaults to --beta).
    #[arg(long, value_parser = parse_rate)]
    beta_inter: Option<f64>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Also model the allreduce compressed with CODEC
    /// (`ferrocoll::compress::Compressor`: fp16, bf16, int8[:BLOCK],
    /// onebit[:BLOCK], topk:K, randk:K[:SEED], powersgd[:RANK[:ROWSxCOLS]]):
    /// its time with the codec's compute as a term of its own, its wire
    /// bytes, and from which size on it beats the uncompressed choice. f32
    /// allreduce only.
    #[arg(long, value_name = "CODEC")]
    compress: Option<String>,
    /// The codec's time per input byte of one encode and one decode, as a
    /// rate (e.g. 4GB/s) or a time per byte (0.25ns); default: the built-in
    /// single-threaded rate of the codec (bench/RESULTS.md).
    #[arg(long, value_parser = parse_gamma, requires = "compress")]
    codec_rate: Option<f64>,
}

fn parse_collective(s: &str) -> Result<Collective, String> {
    match Collective::from_name(s) {
        Some(Collective::AllToAllV) => Err(
            "alltoallv depends on every pair's counts; model alltoall (uniform blocks) instead"
                .into(),
        ),
        Some(c) => Ok(c),
        None => Err(format!(
            "unknown collective; use one of {}",
            Collective::ALL.map(|c| c.name()).join(", ")
        )),
    }
}

/// Splits "10us" into (10.0, "us").
fn number_and_unit(s: &str) -> Result<(f64, String), String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == 'e' || c == '-' || c == '+'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` does not start with a number"))?;
    if !value.is_finite() || value < 0.0 {
        return Err(format!("`{s}` must be a non-negative number"));
    }
    Ok((value, unit.trim().to_string()))
}

/// Bytes: plain, KB/MB/GB/TB (1000s) or KiB/MiB/GiB/TiB (1024s).
pub fn parse_bytes(s: &str) -> Result<usize, String> {
    let (v, unit) = number_and_unit(s)?;
    let scale: f64 = match unit.as_str() {
        "" | "B" => 1.0,
        "KB" | "kB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        "TiB" => 1024.0f64.powi(4),
        other => {
            return Err(format!(
                "unknown size unit `{other}`; use B, KB, MB, GB, KiB, MiB or GiB"
            ))
        }
    };
    Ok((v * scale).round() as usize)
}

/// Seconds from ns/us/ms/s.
pub fn parse_seconds(s: &str) -> Result<f64, String> {
    let (v, unit) = number_and_unit(s)?;
    let scale = match unit.as_str() {
        "ns" => 1e-9,
        // Both the micro sign (U+00B5) and the Greek mu (U+03BC) the seeds use.
        "us" | "\u{b5}s" | "\u{3bc}s" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "" => return Err(format!("`{s}` needs a unit: ns, us, ms or s")),
        other => return Err(format!("unknown time unit `{other}`; use ns, us, ms or s")),
    };
    Ok(v * scale)
}

/// Bytes per second from GB/s, MB/s, KB/s (powers of 1000), GiB/s, B/s.
pub fn parse_rate(s: &str) -> Result<f64, String> {
    let (v, unit) = number_and_unit(s)?;
    let scale = match unit.as_str() {
        "B/s" => 1.0,
        "KB/s" => 1e3,
        "MB/s" => 1e6,
        "GB/s" => 1e9,
        "TB/s" => 1e12,
        "GiB/s" => 1024.0 * 1024.0 * 1024.0,
        other => {
            return Err(format!(
                "unknown rate unit `{other}`; use GB/s, MB/s or GiB/s"
            ))
        }
    };
    if v == 0.0 {
        return Err("a bandwidth must be positive".into());
    }
    Ok(v * scale)
}

/// Seconds per byte, from a rate (`20GB/s`) or a time per byte (`0.05ns`).
fn parse_gamma(s: &str) -> Result<f64, String> {
    if s.contains("/s") {
        parse_rate(s).map(|r| 1.0 / r)
    } else {
        parse_seconds(s)
    }
}

#[derive(Serialize)]
struct Candidate {
    algo: &'static str,
    time_us: f64,
    latency_us: f64,
    bandwidth_us: f64,
    compute_us: f64,
    overlap: OverlapOut,
}

/// The LogGP split of one candidate (`overlap` in the JSON report).
#[derive(Serialize)]
struct OverlapOut {
    /// LogGP parameters of the link class the CPU part is charged on.
    #[serde(rename = "L_us")]
    l_us: f64,
    o_us: f64,
    g_us: f64,
    #[serde(rename = "G_s_per_byte")]
    big_g_s_per_byte: f64,
    /// The busiest rank's CPU time.
    cpu_us: f64,
    /// The rest of the predicted time.
    hideable_us: f64,
    hideable_fraction: f64,
}

impl OverlapOut {
    fn new(o: &Overlap) -> OverlapOut {
        OverlapOut {
            l_us: o.loggp.latency * 1e6,
            o_us: o.loggp.overhead * 1e6,
            g_us: o.loggp.gap * 1e6,
            big_g_s_per_byte: o.loggp.per_byte,
            cpu_us: o.cpu * 1e6,
            hideable_us: o.hideable * 1e6,
            hideable_fraction: o.hideable_fraction,
        }
    }
}

#[derive(Serialize)]
struct CrossoverOut {
    bytes: usize,
    from: &'static str,
    to: &'static str,
}

#[derive(Serialize)]
struct Report {
    coll: &'static str,
    ranks: usize,
    bytes: usize,
    choice: &'static str,
    n_star_bytes: f64,
    candidates: Vec<Candidate>,
    crossovers: Vec<CrossoverOut>,
    /// With `--compress`: the compressed allreduce.
    #[serde(skip_serializing_if = "Option::is_none")]
    compressed: Option<crate::model_compress::CompressedOut>,
}

/// Blocks per call: the block collectives count all n blocks in their size.
fn blocks(coll: Collective, n: usize) -> usize {
    match coll {
        Collective::AllGather
        | Collective::ReduceScatter
        | Collective::AllToAll
        | Collective::Gather
        | Collective::Scatter => n,
        _ => 1,
    }
}

/// Runs `ferrocoll model`.
pub fn main(args: &ModelArgs) -> Result<(), CliError> {
    let n = args.ranks;
    if n == 0 {
        return Err(CliError::Usage("--ranks must be at least 1".into()));
    }
    let topology = match &args.topo {
        Some(t) => {
            t.check_size(n).map_err(CliError::Lib)?;
            t.clone()
        }
        None => Topology::flat(n),
    };
    let profile = Profile {
        intra: LinkParams {
            alpha: args.alpha,
            beta: args.beta,
            overhead: args.overhead,
            piece: args.piece as f64,
        },
        inter: LinkParams {
            alpha: args.alpha_inter.unwrap_or(args.alpha),
            beta: args.beta_inter.unwrap_or(args.beta),
            overhead: args.overhead_inter.unwrap_or(args.overhead),
            piece: args.piece as f64,
        },
        gamma: args.gamma,
        copy: args.copy,
        cache_bytes: args.cache.unwrap_or(0) as f64,
        beta_mem: args.beta_mem.unwrap_or(0.0),
        copy_mem: args.copy_mem.unwrap_or(0.0),
        inter_ports: args.inter_ports,
        cores: args.cores,
        receiver_copies: args.receiver_copies,
        two_sided_copies: args.two_sided_copies,
    };
    if args.compress.is_some() && (args.coll != Collective::AllReduce || args.dtype != DType::F32) {
        return Err(CliError::Usage(
            "--compress models the allreduce of f32 only".into(),
        ));
    }
    let elem = args.dtype.size();
    let per = elem * blocks(args.coll, n);
    let to_count = |bytes: usize| bytes / per;
    let mut shape = Shape::new(args.coll, n, to_count(args.bytes), elem);
    shape.topology = topology;
    let ranked = cost::candidates(&shape, &profile);
    let Some(&(choice, _)) = ranked.first() else {
        return Err(CliError::Usage(format!(
            "{} has no algorithm to model",
            args.coll
        )));
    };
    let max_bytes = args.bytes.max(1 << 30);
    let crossovers = cost::crossovers(&shape, &profile, max_bytes, to_count);
    let us = |c: &Cost| {
        (
            c.total() * 1e6,
            c.latency * 1e6,
            c.bandwidth * 1e6,
            c.compute * 1e6,
        )
    };
    let compressed = match &args.compress {
        Some(spec) => Some(crate::model_compress::report(
            spec,
            shape.count * per,
            &shape.topology,
            &profile,
            args.codec_rate,
        )?),
        None => None,
    };
    let report = Report {
        compressed,
        coll: args.coll.name(),
        ranks: n,
        bytes: shape.count * per,
        choice: choice.name(),
        n_star_bytes: profile.intra.alpha * profile.intra.beta,
        candidates: ranked
            .iter()
            .map(|(a, c)| {
                let (t, l, b, g) = us(c);
                let overlap =
                    cost::overlap(*a, &shape, &profile).expect("every candidate has a closed form");
                Candidate {
                    algo: a.name(),
                    time_us: t,
                    latency_us: l,
                    bandwidth_us: b,
                    compute_us: g,
                    overlap: OverlapOut::new(&overlap),
                }
            })
            .collect(),
        crossovers: crossovers
            .iter()
            .map(|c| CrossoverOut {
                bytes: c.bytes,
                from: c.from.name(),
                to: c.to.name(),
            })
            .collect(),
    };
    let mut out = io::stdout().lock();
    if args.json {
        writeln!(
            out,
            "{}",
            serde_json::to_string(&report).expect("plain data serialises")
        )?;
        return Ok(());
    }
    writeln!(
        out,
        "# {} of {} B on {} ranks (topology {}), alpha {:.3} us, beta {:.3} GB/s, gamma {:.4} ns/B",
        report.coll,
        report.bytes,
        n,
        shape.topology,
        profile.intra.alpha * 1e6,
        profile.intra.beta / 1e9,
        profile.gamma * 1e9
    )?;
    if profile.copy > 0.0 || profile.cache_bytes > 0.0 {
        writeln!(
            out,
            "# copy {:.4} ns/B; working set {:.1} MiB{}",
            profile.copy * 1e9,
            shape.working_set() / 1048576.0,
            if profile.cache_bytes > 0.0 {
                format!(
                    ", beyond {:.1} MiB the links run at {:.3} GB/s{}{}",
                    profile.cache_bytes / 1048576.0,
                    profile.beta_mem / 1e9,
                    if profile.copy_mem > profile.copy {
                        format!(" and a copy costs {:.4} ns/B", profile.copy_mem * 1e9)
                    } else {
                        String::new()
                    },
                    if shape.working_set() > profile.cache_bytes {
                        " (this call)"
                    } else {
                        ""
                    }
                )
            } else {
                String::new()
            }
        )?;
    }
    if profile.inter != profile.intra {
        writeln!(
            out,
            "# between nodes: alpha {:.3} us, beta {:.3} GB/s",
            profile.inter.alpha * 1e6,
            profile.inter.beta / 1e9
        )?;
    }
    let loggp = LogGp::from_link(&profile.for_shape(&shape).intra);
    writeln!(
        out,
        "# LogGP: L {:.3} us, o {:.3} us, g {:.3} us, G {:.4} ns/B; cpu = the busiest rank's o per message + gamma per reduced byte + copy per copied byte, hide = the rest",
        loggp.latency * 1e6,
        loggp.overhead * 1e6,
        loggp.gap * 1e6,
        loggp.per_byte * 1e9
    )?;
    writeln!(
        out,
        "# {:<18} {:>12} {:>12} {:>12} {:>12} {:>12} {:>6}",
        "algo", "time(us)", "latency", "bandwidth", "compute", "cpu", "hide%"
    )?;
    for c in &report.candidates {
        writeln!(
            out,
            "  {:<18} {:>12.3} {:>12.3} {:>12.3} {:>12.3} {:>12.3} {:>6.1}",
            c.algo,
            c.time_us,
            c.latency_us,
            c.bandwidth_us,
            c.compute_us,
            c.overlap.cpu_us,
            c.overlap.hideable_fraction * 100.0
        )?;
    }
    writeln!(out, "# choice: {}", report.choice)?;
    if let Some(second) = report.candidates.get(1) {
        writeln!(
            out,
            "# runner-up: {} ({:.2}x the choice's time)",
            second.algo,
            second.time_us / report.candidates[0].time_us.max(f64::MIN_POSITIVE)
        )?;
    }
    writeln!(
        out,
        "# n* = alpha * beta = {:.0} B (below it latency dominates a message)",
        report.n_star_bytes
    )?;
    for c in &report.crossovers {
        writeln!(out, "# crossover at {} B: {} -> {}", c.bytes, c.from, c.to)?;
    }
    if let Some(c) = &report.compressed {
        for line in crate::model_compress::lines(c, report.choice) {
            writeln!(out, "{line}")?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_parse() {
        assert_eq!(parse_bytes("64MiB"), Ok(64 << 20));
        assert_eq!(parse_bytes("1MB"), Ok(1_000_000));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert!(parse_bytes("3 furlongs").is_err());
        assert!((parse_seconds("10us").unwrap() - 1e-5).abs() < 1e-18);
        assert!((parse_seconds("500ns").unwrap() - 5e-7).abs() < 1e-18);
        assert!(parse_seconds("10").is_err());
        assert_eq!(parse_rate("10GB/s"), Ok(1e10));
        assert!((parse_gamma("20GB/s").unwrap() - 5e-11).abs() < 1e-20);
        assert!((parse_gamma("0.05ns").unwrap() - 5e-11).abs() < 1e-20);
    }
}
