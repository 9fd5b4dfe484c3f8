//! `ferrocoll bench overlap`: how much of a training step's gradient
//! communication hides behind its backward computation, measured and
//! predicted.
//!
//! A model is its parameter list (`bench/params/*.txt`: one tensor's
//! element count per line, in registration order; ResNet-50 and GPT-2
//! small ship). A step is a backward pass: the layers in reverse order,
//! each computing for its share of `--compute-ms` (proportional to its
//! parameters, as the FLOPs of dense layers are) with a real kernel (an
//! f32 multiply-add loop over a cache-resident buffer, timed at start-up to
//! take the chosen time), then handing its gradient to a
//! [`ferrocoll::bucket::GradientBucketer`]. Four ways, each the median of
//! `--steps` steps on the slowest rank:
//!
//! * compute: the backward computation alone (T_comp);
//! * comm: the bucketed allreduces alone (T_comm);
//! * sequential: computation, then all the allreduces (T_seq);
//! * overlapped: each bucket's allreduce launched as soon as it is full,
//!   while the backward pass goes on (T_ovl).
//!
//! Overlap efficiency = (T_seq - T_ovl) / min(T_comp, T_comm): 1 when the
//! shorter of the two hides entirely, 0 when nothing does.
//!
//! The prediction replays the step on the cost model, from the measured
//! computation (it predicts the overlap, not the kernel): bucket k becomes
//! ready when the computation of its last gradient ends, the buckets run
//! one after another on the communicator's progress worker, each for its
//! predicted allreduce time; of that time the LogGP split
//! ([`ferrocoll::cost::overlap`]) says which part is the CPU's (o per
//! message, gamma per reduced byte, the copies; on one host all of it, as
//! the bytes themselves are copied by the ranks' CPUs). When this host's ranks
//! have no spare core for their progress workers (ranks per host >= cores),
//! that CPU part cannot run beside the computation: it is added to it. The
//! predicted efficiency is computed like the measured one.

use std::io::{self, Write};
use std::path::PathBuf;
use std::time::Instant;

use clap::{Args, Subcommand};
use ferrocoll::bucket::{BucketCap, GradientBucketer};
use ferrocoll::cost::{self, Shape};
use ferrocoll::{Collective, Communicator, ReduceOp};
use serde::Serialize;

use crate::bench::{self, BenchArgs};
use crate::error::CliError;

/// Arguments of `ferrocoll bench`: a collective's sweep, or a subcommand
/// (`overlap`, `moe`).
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct BenchCommand {
    #[command(subcommand)]
    sub: Option<BenchSub>,
    #[command(flatten)]
    collective: Option<BenchArgs>,
}

#[derive(Debug, Subcommand)]
enum BenchSub {
    /// Overlap of gradient allreduces with a backward pass: compute only,
    /// communication only, sequential and overlapped (bucketed,
    /// non-blocking) step times, the overlap efficiency, and the cost
    /// model's prediction of it.
    Overlap(OverlapArgs),
    /// Time MoE dispatch and combine (`ferrocoll::moe`) on a router's
    /// workload; `--check` verifies them against the naive reference.
    Moe(crate::bench_moe::MoeArgs),
}

/// Arguments of `ferrocoll bench overlap`.
#[derive(Debug, Args)]
pub struct OverlapArgs {
    /// The model: `resnet50`, `gpt2` (GPT-2 small), or a file of parameter
    /// sizes (one element count per line, registration order; `#` starts a
    /// comment).
    #[arg(long, default_value = "resnet50")]
    model: String,
    /// Backward computation per step, in milliseconds, spread over the
    /// layers by their parameter counts.
    #[arg(long, default_value_t = 100.0)]
    compute_ms: f64,
    /// Bucket size: `auto` (from the cost model) or bytes (`25M`, 1 MiB
    /// first bucket as DDP).
    #[arg(long, default_value = "auto")]
    cap: String,
    /// Steps per way; the median counts.
    #[arg(long, default_value_t = 5)]
    steps: usize,
    /// Number of ranks (default 2; under a launcher, the job's).
    #[arg(short = 'n', long)]
    ranks: Option<usize>,
    /// `thread`, `shm`, `tcp` or `auto` (as `bench`; default thread, and
    /// the job's under a launcher).
    #[arg(long, value_parser = bench::parse_transport)]
    transport: Option<bench::Transport>,
    /// One JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

/// Runs `ferrocoll bench ...`.
pub fn main(cmd: &BenchCommand) -> Result<(), CliError> {
    match (&cmd.sub, &cmd.collective) {
        (Some(BenchSub::Overlap(args)), _) => overlap_main(args),
        (Some(BenchSub::Moe(args)), _) => crate::bench_moe::moe_main(args),
        (None, Some(args)) => bench::main(args),
        (None, None) => bench::main(&BenchArgs::defaults()),
    }
}

/// The parameter sizes of `--model`.
fn load_model(model: &str) -> Result<(String, Vec<usize>), CliError> {
    let shipped = |name: &str| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../bench/params")
            .join(name)
    };
    let (name, path) = match model {
        "resnet50" => ("resnet50".to_string(), shipped("resnet50.txt")),
        "gpt2" => ("gpt2-small".to_string(), shipped("gpt2_small.txt")),
        file => (file.to_string(), PathBuf::from(file)),
    };
    let text = std::fs::read_to_string(&path).map_err(|e| {
        CliError::Usage(format!(
            "--model {model}: cannot read {}: {e} (use resnet50, gpt2 or a file of sizes)",
            path.display()
        ))
    })?;
    let mut sizes = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        let Some(first) = line.split_whitespace().next() else {
            continue;
        };
        let n: usize = first.parse().map_err(|_| {
            CliError::Usage(format!(
                "{} line {}: `{first}` is not an element count",
                path.display(),
                i + 1
            ))
        })?;
        sizes.push(n);
    }
    if sizes.is_empty() {
        return Err(CliError::Usage(format!(
            "{}: no parameter sizes",
            path.display()
        )));
    }
    Ok((name, sizes))
}

/// A kernel that computes for a chosen time: multiply-adds over a 16 KiB
/// buffer (in L1), `rate` passes per second measured at start-up.
struct Kernel {
    buf: Vec<f32>,
    passes_per_sec: f64,
}

impl Kernel {
    fn new() -> Kernel {
        let mut k = Kernel {
            buf: vec![1.0; 4096],
            passes_per_sec: 1.0,
        };
        k.passes(100);
        // The median of 11 timings of ~5 ms each, taken while every rank
        // does the same: with more ranks than cores a rank computes at its
        // share of a core, as it will during the steps (the fastest timing
        // would catch a moment with a core to itself).
        let batch = 500;
        let mut rates = Vec::new();
        for _ in 0..11 {
            let t = Instant::now();
            k.passes(batch);
            rates.push(batch as f64 / t.elapsed().as_secs_f64().max(1e-9));
        }
        rates.sort_by(f64::total_cmp);
        k.passes_per_sec = rates[rates.len() / 2];
        k
    }

    fn passes(&mut self, n: usize) {
        for _ in 0..n {
            for x in self.buf.iter_mut() {
                *x = *x * 0.999_9 + 0.000_1;
            }
        }
        std::hint::black_box(&self.buf);
    }

    fn compute(&mut self, seconds: f64) {
        self.passes((seconds * self.passes_per_sec).round() as usize);
    }
}

/// The four ways' step times (seconds, median over the steps, slowest
/// rank).
#[derive(Clone, Copy, Debug, Serialize)]
struct Times {
    compute: f64,
    comm: f64,
    sequential: f64,
    overlapped: f64,
}

fn efficiency(t: &Times) -> f64 {
    (t.sequential - t.overlapped) / t.compute.min(t.comm).max(1e-12)
}

/// One run of `step` on every rank: the slowest rank's time.
fn timed_step(
    comm: &Communicator,
    step: impl FnOnce() -> Result<(), CliError>,
) -> Result<f64, CliError> {
    comm.barrier()?;
    let t = Instant::now();
    step()?;
    let mine = [t.elapsed().as_secs_f64()];
    let mut slowest = [0.0f64];
    comm.all_reduce(&mine, &mut slowest, ReduceOp::Max)?;
    Ok(slowest[0])
}

/// What one rank measures and predicts.
#[derive(Serialize)]
struct Report {
    model: String,
    parameters: usize,
    ranks: usize,
    transport: &'static str,
    buckets: usize,
    cap_bytes: usize,
    measured: Times,
    efficiency: f64,
    predicted: Times,
    predicted_efficiency: f64,
    /// Whether the model adds the communication's CPU part to the
    /// computation (no spare core for the progress workers).
    cpu_contended: bool,
}

fn run_rank(comm: &Communicator, args: &OverlapArgs) -> Result<Option<Report>, CliError> {
    let (model, sizes) = load_model(&args.model)?;
    let cap = match args.cap.as_str() {
        "auto" => BucketCap::Auto,
        s => {
            let bytes = bench::parse_size(s).map_err(CliError::Usage)?;
            BucketCap::Bytes {
                cap: bytes,
                first: bytes.min(ferrocoll::bucket::DEFAULT_FIRST_CAP_BYTES),
            }
        }
    };
    let total: usize = sizes.iter().sum();
    let compute_s = args.compute_ms / 1e3;
    // Layer i's share of the backward computation.
    let share: Vec<f64> = sizes
        .iter()
        .map(|&s| compute_s * s as f64 / total.max(1) as f64)
        .collect();
    let grads: Vec<Vec<f32>> = sizes
        .iter()
        .map(|&s| vec![comm.rank() as f32 + 1.0; s])
        .collect();
    let mut out: Vec<Vec<f32>> = sizes.iter().map(|&s| vec![0.0; s]).collect();
    let mut kernel = Kernel::new();
    let mut bucketer = GradientBucketer::new(comm, &sizes, cap);
    let steps = args.steps.max(1);

    // One step of way `w`: 0 compute, 1 comm, 2 sequential, 3 overlapped.
    let mut step = |w: usize| -> Result<(), CliError> {
        let layers = (0..sizes.len()).rev();
        match w {
            0 => layers.for_each(|i| kernel.compute(share[i])),
            1 => {
                for i in layers {
                    bucketer.ready(i, &grads[i])?;
                }
            }
            2 => {
                layers.clone().for_each(|i| kernel.compute(share[i]));
                for i in layers {
                    bucketer.ready(i, &grads[i])?;
                }
            }
            _ => {
                for i in layers {
                    kernel.compute(share[i]);
                    bucketer.ready(i, &grads[i])?;
                }
            }
        }
        if w > 0 {
            let mut views: Vec<&mut [f32]> = out.iter_mut().map(|v| v.as_mut_slice()).collect();
            bucketer.finish(&mut views)?;
        }
        Ok(())
    };
    // The ways take turns, step by step, so that a change of the machine's
    // speed (other load, clock) reaches all four alike.
    let mut times: [Vec<f64>; 4] = Default::default();
    for _ in 0..steps {
        for (w, t) in times.iter_mut().enumerate() {
            t.push(timed_step(comm, || step(w))?);
        }
    }
    let [compute, comm_only, sequential, overlapped] = times.map(|mut t| {
        t.sort_by(f64::total_cmp);
        t[t.len() / 2]
    });
    // The averaged gradient of ranks 1..=n is (n+1)/2 everywhere.
    let want = (comm.size() as f32 + 1.0) / 2.0;
    if let Some((p, _)) = out
        .iter()
        .enumerate()
        .find(|(_, g)| g.iter().any(|&x| x != want))
    {
        return Err(CliError::Run(format!(
            "the bucketed allreduce of parameter {p} is wrong"
        )));
    }
    let measured = Times {
        compute,
        comm: comm_only,
        sequential,
        overlapped,
    };

    // The prediction: the same step replayed on the cost model.
    let profile = comm.profile();
    let buckets = bucketer.buckets().to_vec();
    let n = comm.size();
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let per_host = comm.topology().local_size();
    let cpu_contended = per_host >= cores;
    let single_host = comm.topology().nodes() <= 1;
    // The model predicts the overlap, not the kernel: it starts from the
    // measured computation, spread over the layers as the steps spread it.
    let compute_pred = measured.compute;
    let scale = compute_pred / compute_s.max(1e-12);
    let mut ready_at = vec![0.0f64; sizes.len()];
    let mut t = 0.0;
    for i in (0..sizes.len()).rev() {
        t += share[i] * scale;
        ready_at[i] = t;
    }
    let (mut worker_free, mut cpu_total, mut comm_total) = (0.0f64, 0.0f64, 0.0f64);
    for b in &buckets {
        let ready = b.params.iter().map(|&p| ready_at[p]).fold(0.0, f64::max);
        let (algo, _) = comm.choose(Collective::AllReduce, b.len * 4)?;
        let mut shape = Shape::new(Collective::AllReduce, n, b.len, 4);
        shape.topology = comm.topology().clone();
        let (time, cpu) = match cost::overlap(algo, &shape, &profile) {
            Some(o) => (o.total, o.cpu),
            None => (
                cost::predict(algo, &shape, &profile).map_or(0.0, |c| c.total()),
                0.0,
            ),
        };
        // Within one host the bytes are moved by the ranks' CPUs (a copy
        // through shared memory or between threads): what LogGP calls the
        // wire is CPU time there too, so all of it is the CPU's.
        let cpu = if single_host { time } else { cpu };
        worker_free = worker_free.max(ready) + time;
        cpu_total += cpu;
        comm_total += time;
    }
    let seq_pred = compute_pred + comm_total;
    let ovl_pred = if cpu_contended {
        (compute_pred + cpu_total).max(worker_free)
    } else {
        compute_pred.max(worker_free)
    };
    let predicted = Times {
        compute: compute_pred,
        comm: comm_total,
        sequential: seq_pred,
        overlapped: ovl_pred,
    };
    if comm.rank() != 0 {
        return Ok(None);
    }
    let cap_bytes = bucketer.caps().0;
    Ok(Some(Report {
        model,
        parameters: total,
        ranks: n,
        transport: comm.transport_name(),
        buckets: buckets.len(),
        cap_bytes,
        efficiency: efficiency(&measured),
        measured,
        predicted_efficiency: efficiency(&predicted),
        predicted,
        cpu_contended,
    }))
}

fn overlap_main(args: &OverlapArgs) -> Result<(), CliError> {
    let in_job = crate::run::in_job();
    let (n, transport) = bench::ranks_and_transport(args.ranks, args.transport, 2);
    if transport != bench::Transport::Thread && !in_job {
        return crate::run::relaunch_self(n, transport.name(), "overlap benchmark");
    }
    let report = if transport == bench::Transport::Thread && !in_job {
        let mut reports = ferrocoll::local::run(n, |comm| {
            let r = run_rank(&comm, args);
            if r.is_err() {
                comm.abort();
            }
            r
        })?;
        reports.remove(0)?
    } else {
        let comm = ferrocoll::init()?;
        let r = run_rank(&comm, args);
        if r.is_err() {
            comm.abort();
        }
        r?
    };
    let Some(r) = report else {
        return Ok(());
    };
    let mut out = io::stdout().lock();
    if args.json {
        writeln!(out, "{}", serde_json::to_string(&r).expect("plain data"))?;
        return Ok(());
    }
    writeln!(
        out,
        "# ferrocoll bench overlap: {} ({} parameters, {} buckets, cap {} B), {} ranks, transport {}",
        r.model, r.parameters, r.buckets, r.cap_bytes, r.ranks, r.transport
    )?;
    writeln!(
        out,
        "# {:<10} {:>12} {:>12} {:>12} {:>12} {:>10}",
        "", "compute_ms", "comm_ms", "seq_ms", "overlap_ms", "efficiency"
    )?;
    for (label, t, e) in [
        ("measured", &r.measured, r.efficiency),
        ("predicted", &r.predicted, r.predicted_efficiency),
    ] {
        writeln!(
            out,
            "  {label:<10} {:>12.2} {:>12.2} {:>12.2} {:>12.2} {:>10.2}",
            t.compute * 1e3,
            t.comm * 1e3,
            t.sequential * 1e3,
            t.overlapped * 1e3,
            e
        )?;
    }
    writeln!(
        out,
        "# efficiency = (seq - overlap) / min(compute, comm); predicted from the cost model's allreduce \
         times per bucket{}",
        if r.cpu_contended {
            " with their CPU part (o, gamma, copies) added to the computation: this host's ranks \
             leave no core for their progress workers"
        } else {
            ""
        }
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_models_have_their_published_sizes() {
        let (_, r) = load_model("resnet50").unwrap();
        assert_eq!(r.iter().sum::<usize>(), 25_557_032);
        let (_, g) = load_model("gpt2").unwrap();
        assert_eq!(g.iter().sum::<usize>(), 124_439_808);
        assert!(load_model("/nonexistent").is_err());
    }

    #[test]
    fn efficiency_is_the_hidden_share_of_the_shorter_part() {
        let t = Times {
            compute: 0.1,
            comm: 0.05,
            sequential: 0.15,
            overlapped: 0.11,
        };
        assert!((efficiency(&t) - 0.8).abs() < 1e-9);
    }
}
