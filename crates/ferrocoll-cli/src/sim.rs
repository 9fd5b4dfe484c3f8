//! `ferrocoll sim`: run a collective's plans on a modelled cluster
//! (crates/ferrocoll-sim) and report time, bandwidth, link load and energy.

use std::io::Write;
use std::time::Instant;

use clap::Args;
use ferrocoll::cost::{self, LinkParams, Profile, Shape};
use ferrocoll::{Algorithm, Collective};
use ferrocoll_sim::{Mode, TopologySpec};

use crate::error::CliError;

/// Options of `ferrocoll sim`.
#[derive(Debug, Args)]
pub struct SimArgs {
    /// The collective: allreduce, bcast, reduce, allgather, reducescatter,
    /// alltoall, gather, scatter.
    pub coll: String,
    /// The cluster, e.g. `switch:ranks=64,bw=50GB/s,lat=2us`,
    /// `two-level:nodes=4,gpus=8,intra=450GB/s@1us,inter=25GB/s@2us`,
    /// `fat-tree:ranks=64,leaf=8,bw=50GB/s,lat=1us,oversub=2`.
    #[arg(long)]
    pub topology: String,
    /// Size of the call as nccl-tests counts it: bytes, or with KB/MB/GB
    /// (powers of 1000) or KiB/MiB/GiB (powers of 1024).
    #[arg(long)]
    pub bytes: String,
    /// Algorithm, or `auto`: the cost model's choice on this cluster.
    #[arg(long, default_value = "auto")]
    pub algo: String,
    /// `ideal` (no contention: each message costs latency + bytes/bandwidth)
    /// or `contention` (links are FIFO queues of 64 KiB chunks).
    #[arg(long, default_value = "contention", value_parser = ["ideal", "contention"])]
    pub mode: String,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Energy per bit by link class, in picojoules (the seeds' figure: NVLink
/// 100 pJ/bit, InfiniBand 1000 pJ/bit); a class not named here counts as
/// the network tier. Only the upward classes are counted: every bit that
/// goes up a tier comes down it again, and the figure is per bit moved.
fn picojoules_per_bit(class: &str) -> f64 {
    if class.starts_with("nvlink") {
        100.0
    } else {
        1000.0
    }
}

/// `bytes` with decimal (KB, MB, GB) or binary (KiB, MiB, GiB) units.
fn parse_bytes(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: usize = digits.parse().map_err(|_| {
        format!("--bytes {s:?}: give a whole number, optionally with KB/MB/GB or KiB/MiB/GiB")
    })?;
    let mult: usize = match unit.trim() {
        "" | "B" => 1,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "KiB" | "K" => 1 << 10,
        "MiB" | "M" => 1 << 20,
        "GiB" | "G" => 1 << 30,
        other => {
            return Err(format!(
                "--bytes {s:?}: unknown unit {other:?}; use KB, MB, GB, KiB, MiB or GiB"
            ))
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("--bytes {s:?} is too large"))
}

/// The cost-model profile of a modelled cluster: its rank ports as the
/// intra-node links and its network ports as the inter-node ones.
fn profile_of(topo: &TopologySpec) -> Profile {
    let link = |bw: f64, lat: f64| LinkParams {
        alpha: lat,
        beta: bw,
        overhead: 0.0,
    };
    match topo {
        TopologySpec::Switch { link: l, .. } => Profile {
            intra: link(l.bw, l.lat),
            inter: link(l.bw, l.lat),
            gamma: 0.0,
        },
        TopologySpec::TwoLevel { intra, inter, .. } => Profile {
            intra: link(intra.bw, intra.lat),
            inter: link(inter.bw, inter.lat),
            gamma: 0.0,
        },
        TopologySpec::FatTree {
            link: l, oversub, ..
        } => Profile {
            intra: link(l.bw, l.lat),
            inter: link(l.bw / oversub.max(1.0), 3.0 * l.lat),
            gamma: 0.0,
        },
    }
}

/// Runs `ferrocoll sim`.
pub fn main(args: &SimArgs) -> Result<(), CliError> {
    let coll = Collective::from_name(&args.coll)
        .ok_or_else(|| CliError::Usage(format!("unknown collective {:?}", args.coll)))?;
    let topo = TopologySpec::parse(&args.topology).map_err(CliError::Usage)?;
    let bytes = parse_bytes(&args.bytes).map_err(CliError::Usage)?;
    let n = topo.ranks();
    let mode = if args.mode == "ideal" {
        Mode::Ideal
    } else {
        Mode::Contention
    };
    let count = ferrocoll_sim::element_count(coll, n, bytes, 4);
    let algo = if args.algo == "auto" {
        let mut shape = Shape::new(coll, n, count, 4);
        shape.topology = topo.plan_topology();
        let profile = profile_of(&topo);
        cost::candidates(&shape, &profile)
            .first()
            .map(|(a, _)| *a)
            .ok_or_else(|| CliError::Usage(format!("the cost model has no algorithm for {coll}")))?
    } else {
        Algorithm::from_name(&args.algo)
            .ok_or_else(|| CliError::Usage(format!("unknown algorithm {:?}", args.algo)))?
    };
    let start = Instant::now();
    let r = ferrocoll_sim::simulate(coll, algo, bytes, &topo, mode).map_err(CliError::Run)?;
    let wall = start.elapsed().as_secs_f64();
    let energy: f64 = r
        .per_class
        .iter()
        .filter(|c| c.class.ends_with("up"))
        .map(|c| c.bytes as f64 * 8.0 * picojoules_per_bit(&c.class) * 1e-12)
        .sum();
    // The simulator reports bytes per second; print GB/s as bench does.
    let (algbw, busbw) = (r.algbw / 1e9, r.busbw / 1e9);
    let mut out = std::io::stdout().lock();
    if args.json {
        let links: Vec<serde_json::Value> = r
            .per_class
            .iter()
            .map(|c| serde_json::json!({"class": c.class, "bytes": c.bytes, "utilization": c.utilization}))
            .collect();
        let json = serde_json::json!({
            "coll": coll.name(), "ranks": n, "bytes": bytes, "algo": algo.name(), "mode": args.mode,
            "time_us": r.time_s * 1e6, "algbw": algbw, "busbw": busbw, "energy_j": energy,
            "wall_s": wall, "hottest_link": r.hottest_link, "events": r.events, "links": links,
        });
        writeln!(out, "{json}")?;
        return Ok(());
    }
    writeln!(
        out,
        "# ferrocoll sim: {coll} of {bytes} B on {} ({n} ranks), {algo}, {} mode",
        args.topology, args.mode
    )?;
    writeln!(
        out,
        "time {:.2} us, algbw {:.2} GB/s, busbw {:.2} GB/s, energy {:.3e} J, hottest link {}",
        r.time_s * 1e6,
        algbw,
        busbw,
        energy,
        r.hottest_link
    )?;
    for c in &r.per_class {
        writeln!(
            out,
            "  {:<12} {:>16} B  utilization {:.3}",
            c.class, c.bytes, c.utilization
        )?;
    }
    writeln!(out, "# simulated {} events in {wall:.3} s", r.events)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_take_decimal_and_binary_units() {
        assert_eq!(parse_bytes("64").unwrap(), 64);
        assert_eq!(parse_bytes("1KB").unwrap(), 1000);
        assert_eq!(parse_bytes("1KiB").unwrap(), 1024);
        assert_eq!(parse_bytes("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_bytes("2GB").unwrap(), 2_000_000_000);
        assert!(parse_bytes("3 parsecs").is_err());
    }
}
