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
//! one. A sample is a loop of calls of one algorithm timed as a whole, the
//! way `ferrocoll bench` and the peers' benchmarks time theirs: enough
//! calls to fill `--sample-ms` (default 20 ms) and never fewer than
//! [`MIN_CALLS`], each algorithm's count from a timed loop of its own (at
//! least 2 ms) after warming up; the sample is the loop's mean per call on the slowest rank.
//! Each algorithm's median, p10 and p90 go into the table, and the printed
//! line says whether the winner is separated from the runner-up (its p90
//! below the runner-up's p10) or within noise.
//!
//! Why loops and not single calls: with more ranks than cores (4 ranks on
//! 2 cores) one call's time is mostly where the scheduler's time slices
//! fell, so a sample of one call (what the old 5 ms budget gave from 4 MiB
//! up) did not separate `ring` from `direct`, while the bench's loops of
//! 100 calls found the ring up to 1.5x faster (bench/RESULTS.md, issue 20
//! item 5). A loop averages over many slices, and an algorithm that needs
//! fewer peers on a CPU at once shows it.
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

use crate::bench::{buffer_lens, out_of_place, sweep, what_runs, PeerCounts};
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
    /// How long one timed sample (a loop of calls of one algorithm) should
    /// last, in milliseconds (default 20; 5 with --quick). Longer samples
    /// average over more of the scheduler's time slices when ranks share
    /// cores.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    sample_ms: Option<u32>,
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
    /// Also time `auto` (the communicator's own choice: the table named by
    /// `FERROCOLL_TUNE`, else the cost model; the fast path where it
    /// applies) in the same rounds as the candidates, and print it beside
    /// them (`"algo": "auto"`, with `"ran"`: what it ran). It never enters
    /// the table. This is how `bench/regret_tune.sh` scores `auto`: against
    /// the candidates measured in the same process and the same minutes.
    #[arg(long)]
    with_auto: bool,
}

/// What every rank runs: the collectives, the sweep's bounds, samples.
struct Plan {
    colls: Vec<Collective>,
    min: usize,
    max: usize,
    factor: usize,
    samples: u32,
    /// Seconds one sample should last.
    sample_seconds: f64,
    /// Whether `auto` is timed beside the candidates (`--with-auto`).
    with_auto: bool,
}

/// The name `auto`'s measurements go under (never an algorithm's name).
const AUTO: &str = "auto";

/// The fewest calls in one sample, whatever `--sample-ms` gives: a loop of
/// a few calls lets the ranks fall into the schedule an algorithm runs in
/// back to back (as an application calls it), where one call measures
/// mostly its start.
pub const MIN_CALLS: usize = 5;

/// The most calls in one sample: at small sizes `--sample-ms` would ask for
/// tens of thousands; past this the mean no longer moves.
const MAX_CALLS: usize = 2000;

/// Calls of each algorithm before it is timed (connections, buffers and
/// caches warmed).
const WARMUP_CALLS: usize = 2;

/// The least time the loop that sizes an algorithm's samples runs (its
/// count grows by 4 until it does): a loop of a fixed 3 calls, under load
/// from elsewhere, gave one algorithm 605 calls per sample and another 55
/// at the same time per call (bench/RESULTS.md, 4-rank selection).
const PROBE_SECONDS: f64 = 2e-3;

/// Calls per sample for an algorithm whose calls take `per_call` seconds,
/// so that a sample lasts about `sample_seconds`.
fn calls_per_sample(sample_seconds: f64, per_call: f64) -> usize {
    (sample_seconds / per_call.max(1e-8)).clamp(MIN_CALLS as f64, MAX_CALLS as f64) as usize
}

/// Warns when the machine is busy before tuning starts (the one-minute
/// load average at least the number of cores): with ranks sharing cores,
/// load from elsewhere reorders the algorithms (4 ranks on 2 cores under a
/// compiler's load had `direct` win where the ring wins on a quiet machine:
/// bench/RESULTS.md, 4-rank selection), and the table would keep that
/// order for every later run.
fn warn_if_loaded() {
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    if let Some(load) = load_average() {
        if let Some(warning) = load_warning(load, cores) {
            eprintln!("tune: {warning}");
        }
    }
}

/// The one-minute load average (Linux `/proc/loadavg`), if readable.
fn load_average() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// The warning for a one-minute load of `load` on `cores` cores, if the
/// machine is too busy to tune on.
fn load_warning(load: f64, cores: usize) -> Option<String> {
    (load >= cores as f64).then(|| {
        format!(
            "the machine is busy (load {load:.2} on {cores} cores) before tuning starts; \
             load from elsewhere changes which algorithm wins when ranks share cores, \
             and the table keeps that order: tune on a quiet machine"
        )
    })
}

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
            let mut handles: Vec<Communicator> = algos
                .iter()
                .map(|&a| comm.with_options(CallOptions::algorithm(a)))
                .collect();
            let mut names: Vec<String> = algos.iter().map(|a| a.name().to_string()).collect();
            // `auto` is one more handle in the rotation: no algorithm
            // forced, so the communicator chooses (and takes the fast path
            // where it applies) on every call, as an application's calls do.
            let auto_ran = if plan.with_auto {
                Some(what_runs(comm, coll, size.count, DType::F32)?)
            } else {
                None
            };
            if auto_ran.is_some() {
                handles.push(comm.with_options(CallOptions::default()));
                names.push(AUTO.to_string());
            }
            let run = |h: &Communicator, calls: usize, recv: &mut [f32]| -> Result<f64, CliError> {
                comm.barrier()?;
                let t = Instant::now();
                for _ in 0..calls {
                    out_of_place(h, coll, &send, recv, ReduceOp::Sum, 0, &counts)?;
                }
                Ok(t.elapsed().as_secs_f64() / calls as f64)
            };
            // Each algorithm's calls per sample from timed loops of its
            // own after warming up (at least PROBE_SECONDS long), the
            // slowest rank's, so that every rank runs the same loops and
            // every algorithm's samples last alike.
            let mut probe = Vec::with_capacity(handles.len());
            for h in &handles {
                for _ in 0..WARMUP_CALLS {
                    out_of_place(h, coll, &send, &mut recv, ReduceOp::Sum, 0, &counts)?;
                }
                // The slowest rank's time decides, so every rank leaves
                // the loop at the same count.
                let mut calls = 1;
                let per_call = loop {
                    let mine = [run(h, calls, &mut recv)?];
                    let mut slowest = [0.0f64];
                    comm.all_reduce(&mine, &mut slowest, ReduceOp::Max)?;
                    if slowest[0] * calls as f64 >= PROBE_SECONDS || calls >= MAX_CALLS {
                        break slowest[0];
                    }
                    calls *= 4;
                };
                probe.push(per_call);
            }
            let batches: Vec<usize> = probe
                .iter()
                .map(|&t| calls_per_sample(plan.sample_seconds, t))
                .collect();
            let mut samples: Vec<Vec<f64>> = vec![Vec::new(); handles.len()];
            for round in 0..plan.samples as usize {
                for k in 0..handles.len() {
                    let i = (round + k) % handles.len();
                    let mine = [run(&handles[i], batches[i], &mut recv)?];
                    let mut slowest = [0.0f64];
                    comm.all_reduce(&mine, &mut slowest, ReduceOp::Max)?;
                    samples[i].push(slowest[0]);
                }
            }
            if rank != 0 {
                continue;
            }
            let mut times: Vec<(Measured, usize)> = names
                .iter()
                .zip(samples.iter_mut())
                .zip(&batches)
                .map(|((a, s), &calls)| {
                    s.sort_by(f64::total_cmp);
                    let m = Measured {
                        algo: a.clone(),
                        median_us: quantile(s, 0.5) * 1e6,
                        p10_us: quantile(s, 0.1) * 1e6,
                        p90_us: quantile(s, 0.9) * 1e6,
                        samples: s.len(),
                    };
                    (m, calls)
                })
                .collect();
            // `auto` is reported, never written to the table.
            let auto = auto_ran.map(|ran| {
                let (m, calls) = times.pop().expect("auto was timed last");
                (m, calls, ran)
            });
            times.sort_by(|a, b| a.0.median_us.total_cmp(&b.0.median_us));
            let bytes = comm.call_bytes(coll, size.count, DType::F32);
            report_point(coll, bytes, &times, auto.as_ref(), json)?;
            points.push(TunePoint {
                coll: coll.name().to_string(),
                bytes,
                times: times.into_iter().map(|(m, _)| m).collect(),
            });
        }
    }
    Ok(points)
}

/// Prints one point: every algorithm's median [p10, p90] and calls per
/// sample, and whether the winner is separated from the runner-up; with
/// `auto` (measured in the same rounds) its line too, with what it ran and
/// its time over the fastest candidate's.
fn report_point(
    coll: Collective,
    bytes: usize,
    times: &[(Measured, usize)],
    auto: Option<&(Measured, usize, &str)>,
    json: bool,
) -> Result<(), CliError> {
    let mut out = io::stdout().lock();
    let verdict = match times {
        [(w, _), (r, _), ..] if w.p90_us < r.p10_us => format!(
            "{} wins, separated from {} ({:.2}x)",
            w.algo,
            r.algo,
            r.median_us / w.median_us
        ),
        [(w, _), (r, _), ..] => format!(
            "{} wins, within noise of {} ({:.2}x)",
            w.algo,
            r.algo,
            r.median_us / w.median_us
        ),
        [(w, _)] => format!("{} (the only candidate)", w.algo),
        [] => String::new(),
    };
    writeln!(out, "{coll} {bytes} B: {verdict}")?;
    let line = |out: &mut io::StdoutLock, m: &Measured, calls: usize, ran: Option<&str>| {
        let extra = ran.map_or(String::new(), |ran| {
            let best = times.first().map_or(f64::NAN, |(w, _)| w.median_us);
            format!(
                "; ran {ran}; {:.2}x the fastest candidate",
                m.median_us / best
            )
        });
        writeln!(
            out,
            "  {:<18} median {:>12.2} us  p10 {:>12.2}  p90 {:>12.2}  ({} samples of {calls} calls{extra})",
            m.algo, m.median_us, m.p10_us, m.p90_us, m.samples
        )?;
        if json {
            let mut record = serde_json::json!({"coll": coll.name(), "bytes": bytes, "algo": m.algo,
                "median_us": m.median_us, "p10_us": m.p10_us, "p90_us": m.p90_us,
                "samples": m.samples, "calls_per_sample": calls});
            if let Some(ran) = ran {
                record["ran"] = ran.into();
            }
            writeln!(out, "{record}")?;
        }
        io::Result::Ok(())
    };
    for (m, calls) in times {
        line(&mut out, m, *calls, None)?;
    }
    if let Some((m, calls, ran)) = auto {
        line(&mut out, m, *calls, Some(ran))?;
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
        sample_seconds: f64::from(args.sample_ms.unwrap_or(if args.quick { 5 } else { 20 })) * 1e-3,
        with_auto: args.with_auto,
    };
    let in_job = crate::run::in_job();
    let transport = args.transport.as_str();
    let n = args.ranks.unwrap_or(4);
    if !in_job {
        warn_if_loaded();
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_machine_is_warned_about_and_a_quiet_one_is_not() {
        let busy = load_warning(2.5, 2).expect("load above the cores warns");
        assert!(busy.contains("load 2.50 on 2 cores"), "{busy}");
        assert!(
            load_warning(2.0, 2).is_some(),
            "load equal to the cores warns"
        );
        assert!(load_warning(1.2, 2).is_none(), "a quiet machine does not");
        assert!(
            load_average().is_some(),
            "/proc/loadavg is readable on Linux"
        );
    }

    #[test]
    fn a_sample_fills_its_time_but_never_has_fewer_than_min_calls() {
        // 100 us calls, 20 ms samples: 200 calls.
        assert_eq!(calls_per_sample(20e-3, 100e-6), 200);
        // A call longer than the sample: still a loop, not one call (the
        // single-call samples that did not separate ring from direct).
        assert_eq!(calls_per_sample(20e-3, 50e-3), MIN_CALLS);
        // Tiny calls are capped; a zero time does not divide by zero.
        assert_eq!(calls_per_sample(20e-3, 1e-9), MAX_CALLS);
        assert_eq!(calls_per_sample(20e-3, 0.0), MAX_CALLS);
    }
}
