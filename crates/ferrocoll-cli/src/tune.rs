//! `ferrocoll tune`: time every candidate algorithm on this launch and
//! write the table `auto` then trusts ([`ferrocoll::tune`]).
//!
//! For each collective (allreduce, allgather, reducescatter, alltoall,
//! bcast and reduce by default) and each size of the sweep (`-b` to `-e`
//! multiplying by `-f`, as `ferrocoll bench` sweeps), every algorithm the
//! cost model has a closed form for (the candidates `auto` chooses among)
//! is timed in `--samples` rounds. The algorithms take turns within a
//! round, each round starting with the next one, so that a burst of load
//! from elsewhere on a shared machine falls on all of them rather than on
//! one. A sample is the mean of a batch of calls (enough to fill about
//! 5 ms) on the slowest rank; each algorithm's median, p10 and p90 go into
//! the table, and the printed line says whether the winner is separated
//! from the runner-up (its p90 below the runner-up's p10) or within noise.
//!
//! Ranks are threads (`--transport thread`) or processes started through
//! `ferrocoll run` (`shm`, `tcp`), or the job's ranks under a launcher, as
//! for `ferrocoll calibrate`. The table is keyed by transport, group size,
//! topology, machine and library version, and written beside the profile
//! (`<transport>.tune.json`, replacing the table of the same launch and
//! keeping the others) or to `--out`.

use std::io::{self, Write};
use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use ferrocoll::cost::{self, Shape};
use ferrocoll::tune::{Measured, TuneFile, TuneKey, TunePoint, TuneTable};
use ferrocoll::{local, CallOptions, Collective, Communicator, DType, ReduceOp};

use crate::bench::{buffer_lens, call, sweep, PeerCounts};
use crate::error::CliError;

/// Arguments of `ferrocoll tune`.
#[derive(Debug, Args)]
pub struct TuneArgs {
    /// Ranks (default 4; under a launcher, the job's).
    #[arg(short = 'n', long = "ranks")]
    ranks: Option<usize>,
    /// Transport: `thread` (ranks as threads), `shm` or `tcp` (ranks as
    /// processes, started through `ferrocoll run`).
    #[arg(long, default_value = "thread", value_parser = ["thread", "shm", "tcp"])]
    transport: String,
    /// Smallest size (nccl-tests bytes: all blocks of the block
    /// collectives).
    #[arg(short = 'b', long, default_value = "8", value_parser = crate::bench::parse_size)]
    minbytes: usize,
    /// Largest size.
    #[arg(short = 'e', long, default_value = "64M", value_parser = crate::bench::parse_size)]
    maxbytes: usize,
    /// Multiply the size by this from one point to the next (default 4;
    /// 16 with --quick).
    #[arg(short = 'f', long, value_parser = clap::value_parser!(u64).range(2..))]
    stepfactor: Option<u64>,
    /// Timed samples per algorithm and size (default 7; 3 with --quick).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    samples: Option<u32>,
    /// A coarse, fast table: sizes by 16 and 3 samples unless given.
    #[arg(long)]
    quick: bool,
    /// Collectives to tune, comma-separated.
    #[arg(
        long,
        default_value = "allreduce,allgather,reducescatter,alltoall,bcast,reduce",
        value_delimiter = ','
    )]
    colls: Vec<String>,
    /// Where to write the table (default: beside the profile, where the
    /// library reads it).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print one JSON line per (collective, size, algorithm) as well.
    #[arg(long)]
    json: bool,
}

/// What every rank runs: the collectives, the sweep's bounds, samples.
struct Plan {
    colls: Vec<Collective>,
    min: usize,
    max: usize,
    factor: usize,
    samples: u32,
}

/// Seconds a timed batch should take: long enough that the clock's
/// resolution and one call's jitter do not matter, short enough that a
/// round of every algorithm stays within one load regime.
const BATCH_SECONDS: f64 = 5e-3;

/// The `q`-quantile of sorted `v` (nearest rank).
fn quantile(v: &[f64], q: f64) -> f64 {
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    v[i.min(v.len() - 1)]
}

/// Every point of the table, measured on `comm`; rank 0 prints each point
/// as it completes and returns the points, the others an empty list.
fn measure(comm: &Communicator, plan: &Plan, json: bool) -> Result<Vec<TunePoint>, CliError> {
    let (n, rank) = (comm.size(), comm.rank());
    let profile = comm.profile();
    let mut points = Vec::new();
    for &coll in &plan.colls {
        for size in sweep(coll, n, 4, plan.min, plan.max, plan.factor) {
            let mut shape = Shape::new(coll, n, size.count, 4);
            shape.topology = comm.topology().clone();
            let algos: Vec<ferrocoll::Algorithm> = cost::candidates(&shape, &profile)
                .into_iter()
                .map(|c| c.0)
                .collect();
            if algos.is_empty() {
                continue;
            }
            let (send_len, recv_len) = buffer_lens(coll, n, rank, 0, size.count);
            let send = vec![1.0f32; send_len];
            let mut recv = vec![0.0f32; recv_len];
            let counts = PeerCounts::default();
            let handles: Vec<Communicator> = algos
                .iter()
                .map(|&a| comm.with_options(CallOptions::algorithm(a)))
                .collect();
            // Batch length from one warmed-up call of the first algorithm,
            // the slowest rank's, so that every rank runs the same batches.
            for h in &handles {
                call(h, coll, &send, &mut recv, ReduceOp::Sum, 0, &counts)?;
            }
            let t = Instant::now();
            call(
                &handles[0],
                coll,
                &send,
                &mut recv,
                ReduceOp::Sum,
                0,
                &counts,
            )?;
            let mut one = [0.0f64];
            comm.all_reduce(&[t.elapsed().as_secs_f64()], &mut one, ReduceOp::Max)?;
            let batch = (BATCH_SECONDS / one[0].max(1e-7)).clamp(1.0, 200.0) as usize;
            let mut samples: Vec<Vec<f64>> = vec![Vec::new(); algos.len()];
            for round in 0..plan.samples as usize {
                for k in 0..algos.len() {
                    let i = (round + k) % algos.len();
                    comm.barrier()?;
                    let t = Instant::now();
                    for _ in 0..batch {
                        call(
                            &handles[i],
                            coll,
                            &send,
                            &mut recv,
                            ReduceOp::Sum,
                            0,
                            &counts,
                        )?;
                    }
                    let mine = [t.elapsed().as_secs_f64() / batch as f64];
                    let mut slowest = [0.0f64];
                    comm.all_reduce(&mine, &mut slowest, ReduceOp::Max)?;
                    samples[i].push(slowest[0]);
                }
            }
            if rank != 0 {
                continue;
            }
            let mut times: Vec<Measured> = algos
                .iter()
                .zip(samples.iter_mut())
                .map(|(a, s)| {
                    s.sort_by(f64::total_cmp);
                    Measured {
                        algo: a.name().to_string(),
                        median_us: quantile(s, 0.5) * 1e6,
                        p10_us: quantile(s, 0.1) * 1e6,
                        p90_us: quantile(s, 0.9) * 1e6,
                        samples: s.len(),
                    }
                })
                .collect();
            times.sort_by(|a, b| a.median_us.total_cmp(&b.median_us));
            let bytes = comm.call_bytes(coll, size.count, DType::F32);
            report_point(coll, bytes, &times, batch, json)?;
            points.push(TunePoint {
                coll: coll.name().to_string(),
                bytes,
                times,
            });
        }
    }
    Ok(points)
}

/// Prints one point: every algorithm's median [p10, p90], and whether the
/// winner is separated from the runner-up.
fn report_point(
    coll: Collective,
    bytes: usize,
    times: &[Measured],
    batch: usize,
    json: bool,
) -> Result<(), CliError> {
    let mut out = io::stdout().lock();
    let verdict = match times {
        [w, r, ..] if w.p90_us < r.p10_us => format!(
            "{} wins, separated from {} ({:.2}x)",
            w.algo,
            r.algo,
            r.median_us / w.median_us
        ),
        [w, r, ..] => format!(
            "{} wins, within noise of {} ({:.2}x)",
            w.algo,
            r.algo,
            r.median_us / w.median_us
        ),
        [w] => format!("{} (the only candidate)", w.algo),
        [] => String::new(),
    };
    writeln!(out, "{coll} {bytes} B ({batch} calls/sample): {verdict}")?;
    for m in times {
        writeln!(
            out,
            "  {:<18} median {:>12.2} us  p10 {:>12.2}  p90 {:>12.2}  ({} samples)",
            m.algo, m.median_us, m.p10_us, m.p90_us, m.samples
        )?;
        if json {
            writeln!(
                out,
                "{}",
                serde_json::json!({"coll": coll.name(), "bytes": bytes, "algo": m.algo,
                    "median_us": m.median_us, "p10_us": m.p10_us, "p90_us": m.p90_us,
                    "samples": m.samples})
            )?;
        }
    }
    out.flush()?;
    Ok(())
}

/// Runs `ferrocoll tune`.
pub fn main(args: &TuneArgs) -> Result<(), CliError> {
    let colls = args
        .colls
        .iter()
        .map(|name| {
            Collective::from_name(name.trim())
                .filter(|c| !matches!(c, Collective::AllToAllV | Collective::Barrier))
                .ok_or_else(|| {
                    CliError::Usage(format!(
                        "cannot tune `{name}`; use allreduce, allgather, reducescatter, alltoall, \
                         bcast, reduce, gather or scatter"
                    ))
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if args.minbytes == 0 || args.minbytes > args.maxbytes {
        return Err(CliError::Usage(format!(
            "sizes from {} to {} bytes: give 0 < --minbytes <= --maxbytes",
            args.minbytes, args.maxbytes
        )));
    }
    let plan = Plan {
        colls,
        min: args.minbytes,
        max: args.maxbytes,
        factor: args.stepfactor.unwrap_or(if args.quick { 16 } else { 4 }) as usize,
        samples: args.samples.unwrap_or(if args.quick { 3 } else { 7 }),
    };
    let in_job = crate::run::in_job();
    let transport = args.transport.as_str();
    let n = args.ranks.unwrap_or(4);
    if !in_job && transport != "thread" {
        return crate::run::relaunch_self(n, transport, "tuning");
    }
    let (points, key) = if !in_job {
        if n == 0 {
            return Err(CliError::Usage("--ranks must be at least 1".into()));
        }
        let results = local::run(n, |comm| {
            let key = TuneKey::current(comm.transport_name(), comm.size(), comm.topology());
            measure(&comm, &plan, args.json).map(|p| (p, key))
        })?;
        let mut first = None;
        for r in results {
            let r = r?;
            if first.is_none() {
                first = Some(r);
            }
        }
        first.ok_or_else(|| CliError::Run("no rank ran".into()))?
    } else {
        let comm = ferrocoll::init()?;
        if let Some(n) = args.ranks.filter(|&n| n != comm.size()) {
            return Err(CliError::Usage(format!(
                "--ranks {n} but the job has {} ranks",
                comm.size()
            )));
        }
        let key = TuneKey::current(comm.transport_name(), comm.size(), comm.topology());
        let points = measure(&comm, &plan, args.json)?;
        if comm.rank() != 0 {
            return Ok(());
        }
        (points, key)
    };
    let path = match &args.out {
        Some(p) => p.clone(),
        None => TuneFile::default_path(&key.transport).ok_or_else(|| {
            CliError::Usage("no HOME or XDG_CONFIG_HOME to write the table to; pass --out".into())
        })?,
    };
    // Keep the other launches' tables of an existing file.
    let mut file = if path.exists() {
        TuneFile::load(&path).unwrap_or_else(|why| {
            eprintln!("tune: {why}; starting a new file");
            TuneFile::default()
        })
    } else {
        TuneFile::default()
    };
    let count = points.len();
    file.insert(TuneTable {
        key: key.clone(),
        points,
    });
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| CliError::Run(format!("cannot create {}: {e}", dir.display())))?;
    }
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&file).expect("plain data"),
    )
    .map_err(|e| CliError::Run(format!("cannot write {}: {e}", path.display())))?;
    println!(
        "# wrote {count} points for {} on {} ranks (topology {}) to {} \
         (FERROCOLL_TUNE={} selects it explicitly, FERROCOLL_TUNE=off ignores it)",
        key.transport,
        key.ranks,
        key.topology,
        path.display(),
        path.display()
    );
    Ok(())
}
