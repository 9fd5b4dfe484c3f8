//! `ferrocoll sim`: run a collective's plans on a modelled cluster
//! (crates/ferrocoll-sim) and report time, bandwidth, link load and energy;
//! optionally with stragglers and slow or failed links, and with an SVG plot
//! of the link utilization over time. Besides ferrocoll's algorithms it
//! runs `--algo sharp`: an allreduce reduced in the network by switches
//! that can (`sharp=1` on a `switch` or `fat-tree` topology; see
//! `ferrocoll_sim::sharp`). `ferrocoll sim moe` (sim_moe.rs) runs an MoE
//! layer's exchange.

use std::io::Write;
use std::time::Instant;

use clap::Args;
use ferrocoll::cost::{self, Shape};
use ferrocoll::Collective;
use ferrocoll_sim::{Mode, SimAlgorithm, SimOptions, TopologySpec};

use crate::error::CliError;

/// Options of `ferrocoll sim`.
#[derive(Debug, Args)]
pub struct SimArgs {
    /// The collective: allreduce, bcast, reduce, allgather, reducescatter,
    /// alltoall, gather, scatter.
    pub coll: String,
    /// The cluster, e.g. `switch:ranks=64,bw=50GB/s,lat=2us`,
    /// `two-level:nodes=4,gpus=8,intra=450GB/s@1us,inter=25GB/s@2us`,
    /// `fat-tree:ranks=64,leaf=8,bw=50GB/s,lat=1us,oversub=2`, `rail:`,
    /// `ring:`, `torus:dims=4x4,...`, or `file:PATH`: a graph of ranks and
    /// switches written link by link (`ranks 8`, `switch s0 s1`,
    /// `link r0-r3 s0 50GB/s 1us [class=NAME]`, `plan 2x4`; see
    /// ferrocoll_sim::graph); `sharp=1` on `switch` or `fat-tree` makes the
    /// switches able to reduce (`--algo sharp`).
    #[arg(long)]
    pub topology: String,
    /// Where the plans' ranks sit on the cluster's positions: `block` (the
    /// default), `roundrobin` (dealt over nodes, leaves or rows),
    /// `random:SEED`, or `list:P0,P1,...`; the same as `placement=` in the
    /// topology string, which must not also give one.
    #[arg(long)]
    pub placement: Option<String>,
    /// Size of the call as nccl-tests counts it: bytes, or with KB/MB/GB
    /// (powers of 1000) or KiB/MiB/GiB (powers of 1024).
    #[arg(long)]
    pub bytes: String,
    /// Algorithm, or `auto`: the cost model's choice on this cluster (never
    /// sharp), or `sharp`: in-network reduction, allreduce only, on a
    /// topology with `sharp=1`.
    #[arg(long, default_value = "auto")]
    pub algo: String,
    /// `ideal` (no contention: each message costs latency + bytes/bandwidth)
    /// or `contention` (links are FIFO queues of 64 KiB chunks).
    #[arg(long, default_value = "contention", value_parser = ["ideal", "contention"])]
    pub mode: String,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Write the link utilization over time (one line per link class, 200
    /// time buckets) to this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<std::path::PathBuf>,
    /// A straggler: rank RANK starts its plan SECONDS late (a number of
    /// seconds, or with ms/us/ns/s). Repeatable.
    #[arg(long, value_name = "RANK:SECONDS")]
    pub straggler: Vec<String>,
    /// A slow link: every link named NAME (as the hottest link is printed,
    /// e.g. `leaf-up[0]`) or of class NAME (`nic-up`) runs at its bandwidth
    /// divided by FACTOR; `inf` (or `fail`) makes it a failed link, and a
    /// message that needs it an error. Repeatable.
    #[arg(long, value_name = "NAME:FACTOR")]
    pub slow_link: Vec<String>,
    /// Simulate one rank per class of ranks that behave identically (a
    /// shift or exclusive-or of rank numbers that the topology, placement
    /// and plans all have), for clusters too large to run rank by rank; the
    /// results are the full run's. Where ranks differ only in the sizes of
    /// their blocks (a count the ranks do not divide), the traffic is still
    /// the full run's and the time that of every block at its largest size.
    /// An error, saying why, when there is no such symmetry (trees, blocks
    /// of zero elements, stragglers, ...).
    #[arg(long)]
    pub aggregate: bool,
    /// Reduction cost at the receiver (gamma): a rate such as `100GB/s`
    /// (bytes reduced per second) or a time per byte such as `0.01ns`;
    /// default 0 (free reductions).
    #[arg(long)]
    pub gamma: Option<String>,
    /// The memory a full run may use (bytes, or with KB/MB/GB or
    /// KiB/MiB/GiB): a run whose estimate, counted from the plans before it
    /// starts, is larger is refused with the estimate instead of being
    /// killed by the kernel. Default: FERROCOLL_SIM_MEMORY if set, else
    /// MemAvailable of /proc/meminfo.
    #[arg(long, value_name = "SIZE")]
    pub memory_limit: Option<String>,
    /// Also run the allreduce compressed with CODEC, as
    /// `ferrocoll::compress::Compressor` runs it (fp16, bf16,
    /// int8[:BLOCK], onebit[:BLOCK], topk:K, randk:K[:SEED],
    /// powersgd[:RANK[:ROWSxCOLS]]): its collectives' plans on the encoded
    /// bytes, one after the other, plus the codec's compute per byte on
    /// every rank; printed next to the uncompressed run (`--algo`). f32
    /// allreduce only; not with --aggregate or --algo sharp.
    #[arg(long, value_name = "CODEC")]
    pub compress: Option<String>,
    /// The codec's time per input byte of one encode and one decode, as a
    /// rate (e.g. 4GB/s) or a time per byte (0.25ns); default: the built-in
    /// single-threaded rate of the codec (bench/RESULTS.md), as `ferrocoll
    /// model --compress` uses.
    #[arg(long, value_parser = parse_gamma, requires = "compress")]
    pub codec_rate: Option<f64>,
}

/// Energy per bit by link class, in picojoules (the seeds' figure: NVLink
/// 100 pJ/bit, InfiniBand 1000 pJ/bit); a class not named here counts as
/// the network tier. Downward classes are not counted: every bit that goes
/// up to a switch comes down again, and the figure is per bit moved; on
/// switchless links (ring, torus) every hop counts.
fn picojoules_per_bit(class: &str) -> f64 {
    if class.starts_with("nvlink") {
        100.0
    } else {
        1000.0
    }
}

/// `bytes` with decimal (KB, MB, GB) or binary (KiB, MiB, GiB) units;
/// errors name `flag`, the option it was given to.
pub(crate) fn parse_bytes(flag: &str, s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: usize = digits.parse().map_err(|_| {
        format!("{flag} {s:?}: give a whole number, optionally with KB/MB/GB or KiB/MiB/GiB")
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
                "{flag} {s:?}: unknown unit {other:?}; use KB, MB, GB, KiB, MiB or GiB"
            ))
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("{flag} {s:?} is too large"))
}

/// `RANK:SECONDS` of `--straggler`; the delay is in seconds unless it
/// ends in `s`, `ms`, `us` or `ns`.
fn parse_straggler(s: &str) -> Result<(usize, f64), String> {
    let bad = || format!("--straggler {s:?}: expected RANK:SECONDS, e.g. 3:1ms or 3:0.001");
    let (rank, delay) = s.split_once(':').ok_or_else(bad)?;
    let rank = rank.trim().parse().map_err(|_| bad())?;
    let d = delay.trim();
    let (num, scale) = [("ns", 1e-9), ("us", 1e-6), ("ms", 1e-3), ("s", 1.0)]
        .iter()
        .find_map(|&(unit, scale)| d.strip_suffix(unit).map(|n| (n, scale)))
        .unwrap_or((d, 1.0));
    let v: f64 = num.trim().parse().map_err(|_| bad())?;
    if !(v.is_finite() && v >= 0.0) {
        return Err(format!("--straggler {s:?}: the delay must be at least 0"));
    }
    Ok((rank, v * scale))
}

/// `NAME:FACTOR` of `--slow-link`; `inf` or `fail` is a failed link.
fn parse_slow_link(s: &str) -> Result<(String, f64), String> {
    let bad =
        || format!("--slow-link {s:?}: expected NAME:FACTOR, e.g. leaf-up[0]:4 or nic-up[3]:inf");
    let (name, factor) = s.rsplit_once(':').ok_or_else(bad)?;
    let f = match factor.trim() {
        "inf" | "fail" | "failed" => f64::INFINITY,
        f => f.parse::<f64>().map_err(|_| bad())?,
    };
    if name.trim().is_empty() || f.is_nan() || f <= 0.0 {
        return Err(bad());
    }
    Ok((name.trim().to_string(), f))
}

/// `--gamma`: a reduction rate (`100GB/s`) or a time per byte (`0.01ns`),
/// as seconds per byte.
fn parse_gamma(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let gamma = if t.ends_with("/s") {
        1.0 / ferrocoll_sim::topology::parse_bandwidth(t)?
    } else {
        ferrocoll_sim::topology::parse_latency(t)?
    };
    if gamma.is_finite() && gamma >= 0.0 {
        Ok(gamma)
    } else {
        Err(format!(
            "--gamma {s:?}: give a rate (100GB/s) or a time per byte (0.01ns)"
        ))
    }
}

/// `3906 and 3907`, `2, 3 and 4`: the block sizes of an uneven run.
fn block_list(sizes: &[usize]) -> String {
    let words: Vec<String> = sizes.iter().map(|s| s.to_string()).collect();
    match words.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
    }
}

/// Runs `ferrocoll sim`.
pub fn main(args: &SimArgs) -> Result<(), CliError> {
    let coll = Collective::from_name(&args.coll)
        .ok_or_else(|| CliError::Usage(format!("unknown collective {:?}", args.coll)))?;
    let topology = match &args.placement {
        None => args.topology.clone(),
        Some(_) if args.topology.contains("placement=") => {
            return Err(CliError::Usage(
                "--placement and a placement= in --topology: give one".into(),
            ))
        }
        Some(p) => format!("{},placement={p}", args.topology),
    };
    let topo = TopologySpec::parse(&topology).map_err(CliError::Usage)?;
    let bytes = parse_bytes("--bytes", &args.bytes).map_err(CliError::Usage)?;
    let n = topo.ranks();
    let mode = if args.mode == "ideal" {
        Mode::Ideal
    } else {
        Mode::Contention
    };
    let count = ferrocoll_sim::element_count(coll, n, bytes, 4);
    let gamma = match &args.gamma {
        None => 0.0,
        Some(g) => parse_gamma(g).map_err(CliError::Usage)?,
    };
    let algo = if args.algo == "auto" {
        let mut shape = Shape::new(coll, n, count, 4);
        shape.topology = topo.plan_topology();
        let profile = ferrocoll_sim::cost_profile(&topo, gamma);
        cost::candidates(&shape, &profile)
            .first()
            .map(|(a, _)| SimAlgorithm::Plan(*a))
            .ok_or_else(|| CliError::Usage(format!("the cost model has no algorithm for {coll}")))?
    } else {
        SimAlgorithm::from_name(&args.algo)
            .ok_or_else(|| CliError::Usage(format!("unknown algorithm {:?}", args.algo)))?
    };
    if let Some(spec) = &args.compress {
        if coll != Collective::AllReduce || algo == SimAlgorithm::Sharp || args.aggregate {
            return Err(CliError::Usage(format!(
                "--compress {spec}: compressed allreduces only, without --algo sharp or \
                 --aggregate (the compressed exchanges run rank by rank); got {coll}{}{}",
                if algo == SimAlgorithm::Sharp {
                    ", --algo sharp"
                } else {
                    ""
                },
                if args.aggregate { ", --aggregate" } else { "" }
            )));
        }
        ferrocoll::compress::collective::validate_spec(spec, count)?;
    }
    if algo == SimAlgorithm::Sharp {
        ferrocoll_sim::sharp::check(coll, &topo).map_err(CliError::Usage)?;
        if args.aggregate {
            return Err(CliError::Usage(
                "--aggregate runs ferrocoll's plans; --algo sharp has none".into(),
            ));
        }
    }
    let opts = SimOptions {
        gamma,
        start_delay: args
            .straggler
            .iter()
            .map(|s| parse_straggler(s))
            .collect::<Result<_, _>>()
            .map_err(CliError::Usage)?,
        slow_links: args
            .slow_link
            .iter()
            .map(|s| parse_slow_link(s))
            .collect::<Result<_, _>>()
            .map_err(CliError::Usage)?,
        memory_limit: match &args.memory_limit {
            None => None,
            Some(m) => Some(parse_bytes("--memory-limit", m).map_err(CliError::Usage)? as u64),
        },
        ..SimOptions::default()
    };
    let start = Instant::now();
    let r = match algo {
        SimAlgorithm::Plan(a) if args.aggregate => {
            ferrocoll_sim::simulate_aggregated(coll, a, bytes, &topo, mode, &opts)
        }
        _ => ferrocoll_sim::simulate_algorithm(coll, algo, bytes, &topo, mode, &opts),
    }
    .map_err(CliError::Run)?;
    let compressed = match &args.compress {
        None => None,
        Some(spec) => Some(
            ferrocoll_sim::simulate_compressed(
                spec,
                bytes,
                &topo,
                mode,
                &opts,
                &ferrocoll_sim::cost_profile(&topo, gamma),
                args.codec_rate,
            )
            .map_err(CliError::Run)?,
        ),
    };
    let wall = start.elapsed().as_secs_f64();
    if let Some(path) = &args.plot {
        let title = format!(
            "{coll} {algo} {bytes} B on {}, {} mode",
            args.topology, args.mode
        );
        std::fs::write(path, ferrocoll_sim::plot::svg(&r, &title))
            .map_err(|e| CliError::Run(format!("--plot {}: {e}", path.display())))?;
    }
    let energy: f64 = r
        .per_class
        .iter()
        .filter(|c| !c.class.ends_with("down"))
        .map(|c| c.bytes as f64 * 8.0 * picojoules_per_bit(&c.class) * 1e-12)
        .sum();
    // The simulator reports bytes per second; print GB/s as bench does.
    let (algbw, busbw) = (r.algbw / 1e9, r.busbw / 1e9);
    let cp = &r.critical_path;
    let mut out = std::io::stdout().lock();
    if args.json {
        let links: Vec<serde_json::Value> = r
            .per_class
            .iter()
            .map(|c| serde_json::json!({"class": c.class, "bytes": c.bytes, "utilization": c.utilization}))
            .collect();
        let mut json = serde_json::json!({
            "coll": coll.name(), "ranks": n, "bytes": bytes, "algo": algo.name(), "mode": args.mode,
            "time_us": r.time_s * 1e6, "algbw": algbw, "busbw": busbw, "energy_j": energy,
            "wall_s": wall, "hottest_link": r.hottest_link, "events": r.events, "links": links,
            "timeline_buckets": ferrocoll_sim::TIMELINE_BUCKETS,
            "critical_path": {
                "messages": cp.messages, "ranks": cp.ranks, "start_us": cp.start_s * 1e6,
                "latency_us": cp.latency_s * 1e6, "transmission_us": cp.transmission_s * 1e6,
                "queueing_us": cp.queueing_s * 1e6, "compute_us": cp.compute_s * 1e6,
            },
            "aggregated": r.aggregated.map(|s| serde_json::json!({
                "kind": s.kind.name(), "period": s.period, "simulated_ranks": s.period,
                "uneven": r.uneven.as_ref().map(|u| serde_json::json!({
                    "block_elements": u.elements, "time": "padded",
                })),
            })),
        });
        if let Some(c) = &compressed {
            json["compressed"] = crate::sim_compress::json(c, &r);
        }
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
    // Where the time went along the critical path, largest parts first.
    let pct = |x: f64| {
        if r.time_s > 0.0 {
            100.0 * x / r.time_s
        } else {
            0.0
        }
    };
    let mut parts = [
        ("latency", cp.latency_s),
        ("transmission", cp.transmission_s),
        ("queueing", cp.queueing_s),
        ("compute", cp.compute_s),
        ("late start", cp.start_s),
    ];
    parts.sort_by(|a, b| b.1.total_cmp(&a.1));
    let parts: Vec<String> = parts
        .iter()
        .filter(|p| p.1 > 0.0)
        .map(|(name, t)| format!("{name} {:.2} us ({:.0}%)", t * 1e6, pct(*t)))
        .collect();
    writeln!(
        out,
        "critical path: {} messages through {} ranks: {}",
        cp.messages,
        cp.ranks,
        parts.join(", ")
    )?;
    match r.aggregated {
        Some(s) => match &r.uneven {
            None => writeln!(
                out,
                "# simulated {} events in {wall:.3} s, aggregated ({s})",
                r.events
            )?,
            Some(u) => writeln!(
                out,
                "# simulated {} events in {wall:.3} s, aggregated ({s}; blocks of {} elements: traffic exact, time with every block at its largest)",
                r.events,
                block_list(&u.elements)
            )?,
        },
        None => writeln!(out, "# simulated {} events in {wall:.3} s", r.events)?,
    }
    if let Some(c) = &compressed {
        for line in crate::sim_compress::lines(c, &r, algo.name(), (bytes, n)) {
            writeln!(out, "{line}")?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_take_decimal_and_binary_units() {
        assert_eq!(parse_bytes("--bytes", "64").unwrap(), 64);
        assert_eq!(parse_bytes("--bytes", "1KB").unwrap(), 1000);
        assert_eq!(parse_bytes("--bytes", "1KiB").unwrap(), 1024);
        assert_eq!(parse_bytes("--bytes", "64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_bytes("--bytes", "2GB").unwrap(), 2_000_000_000);
        assert!(parse_bytes("--bytes", "3 parsecs").is_err());
    }

    #[test]
    fn block_sizes_read_as_a_list() {
        assert_eq!(block_list(&[3906, 3907]), "3906 and 3907");
        assert_eq!(block_list(&[2, 3, 4]), "2, 3 and 4");
        assert_eq!(block_list(&[7]), "7");
    }

    #[test]
    fn gamma_takes_a_rate_or_a_time_per_byte() {
        assert!((parse_gamma("100GB/s").unwrap() - 1e-11).abs() < 1e-24);
        assert!((parse_gamma("0.01ns").unwrap() - 1e-11).abs() < 1e-24);
        assert!(parse_gamma("fast").is_err());
    }

    #[test]
    fn scenarios_parse() {
        assert_eq!(parse_straggler("3:0.001").unwrap(), (3, 0.001));
        let (r, d) = parse_straggler("5:250us").unwrap();
        assert!(r == 5 && (d - 250e-6).abs() < 1e-18);
        assert_eq!(parse_straggler("0:2ms").unwrap().0, 0);
        assert!(parse_straggler("3").is_err());
        assert!(parse_straggler("x:1").is_err());
        assert!(parse_straggler("3:-1").is_err());
        assert_eq!(
            parse_slow_link("leaf-up[0]:4").unwrap(),
            ("leaf-up[0]".to_string(), 4.0)
        );
        assert_eq!(parse_slow_link("nic-up:inf").unwrap().1, f64::INFINITY);
        assert_eq!(parse_slow_link("up[3]:fail").unwrap().1, f64::INFINITY);
        assert!(parse_slow_link("up[3]").is_err());
        assert!(parse_slow_link("up[3]:0").is_err());
        assert!(parse_slow_link(":2").is_err());
    }
}
