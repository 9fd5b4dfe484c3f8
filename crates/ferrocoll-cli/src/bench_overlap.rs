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
//! that CPU part cannot run beside the computation: it is added to it. Over
//! TCP most of the communication's CPU time is the kernel's per-byte send
//! and receive path, which LogGP's o per message does not count; the
//! communication-only steps measure it (getrusage of the process), and the
//! prediction charges per bucket the larger of the model's CPU part and the
//! measured one's share. The predicted efficiency is computed like the
//! measured one. Before the table, a line says what the model alone makes
//! of the step: how much of the communication is CPU work and whether a
//! core is free for it (on one host with a rank per core: none can hide).
//!
//! The computation is one non-inlined function wherever it runs (the
//! calibration and each way): inlined into each place, the same loop was
//! compiled into code of different speeds (the sequential step's copy ran
//! 1.4-1.5x the compute-only one's on one rank, bench/RESULTS.md, issue 16
//! item 4), so the ways computed at different rates and a step took
//! 0.6-1.9x the time asked. `--trace` prints every step of every way on
//! every rank; the `cpu` row and the compute steps' share of a core say
//! when other processes or a slower CPU disturbed a run.

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
    /// Also print every step of every way on every rank (stderr): when it
    /// started (wall clock, so ranks on one machine compare), its
    /// computation, its total and its CPU time.
    #[arg(long)]
    trace: bool,
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
    /// Times the kernel on every rank at once (`comm`'s barrier first):
    /// with more ranks than cores a rank computes at its share of a core, as
    /// it will during the steps. The rate is the median of 11 timings of
    /// ~5 ms each (about 60 ms in all): the earlier calibration, 11 timings
    /// of ~0.16 ms taken while other ranks were still filling their
    /// gradient buffers, caught whatever the cores did in that instant.
    fn new(comm: &Communicator) -> Result<Kernel, CliError> {
        let mut k = Kernel {
            buf: vec![1.0; 4096],
            passes_per_sec: 1.0,
        };
        comm.barrier()?;
        // Warm-up, and a first rate to size the batches by.
        let t = Instant::now();
        k.passes(1000);
        let rough = 1000.0 / t.elapsed().as_secs_f64().max(1e-9);
        let batch = ((rough * 0.005) as usize).max(100);
        let mut rates = Vec::new();
        for _ in 0..11 {
            let t = Instant::now();
            k.passes(batch);
            rates.push(batch as f64 / t.elapsed().as_secs_f64().max(1e-9));
        }
        rates.sort_by(f64::total_cmp);
        k.passes_per_sec = rates[rates.len() / 2];
        Ok(k)
    }

    // Not inlined: one compiled loop for the calibration and every way (see
    // the module documentation).
    #[inline(never)]
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

/// One step of one way on one rank: which way, when it started (wall
/// clock, seconds, for `--trace`: ranks on one machine compare), when its
/// computation ended and when it ended (seconds from its start), and the
/// CPU time this rank's process used meanwhile (all its threads: the
/// progress worker's and the kernel's work in its system calls included).
#[derive(Clone, Copy, Debug, Default)]
struct Sample {
    way: usize,
    start: f64,
    compute: f64,
    total: f64,
    cpu: f64,
}

/// User plus system CPU seconds of this process so far.
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes the struct it is given and nothing else.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0.0;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    secs(u.ru_utime) + secs(u.ru_stime)
}

fn wall_clock() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// One run of `step` on every rank: the slowest rank's time, and this
/// rank's sample. `step` returns the seconds its computation took.
fn timed_step(
    comm: &Communicator,
    way: usize,
    step: impl FnOnce(Instant) -> Result<f64, CliError>,
) -> Result<(f64, Sample), CliError> {
    comm.barrier()?;
    let start = wall_clock();
    let cpu0 = cpu_seconds();
    let t = Instant::now();
    let compute = step(t)?;
    let mine = [t.elapsed().as_secs_f64()];
    let cpu = cpu_seconds() - cpu0;
    let mut slowest = [0.0f64];
    comm.all_reduce(&mine, &mut slowest, ReduceOp::Max)?;
    Ok((
        slowest[0],
        Sample {
            way,
            start,
            compute,
            total: mine[0],
            cpu,
        },
    ))
}

/// The CPUs this thread may run on, as a bit mask of CPUs 0-63 (0 if the
/// kernel does not say).
fn cpu_mask() -> u64 {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity writes exactly one
    // cpu_set_t of the size passed, for the calling thread (pid 0).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return 0;
        }
        (0..64)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .fold(0, |m, c| m | 1 << c)
    }
}

/// The cores of this rank's host: the CPUs any of its ranks may run on.
/// Not this rank's own affinity: a rank that ferrocoll pinned to one CPU
/// (`FERROCOLL_BIND`, as on one host with a rank per core) shares the host
/// with the others, whose CPUs count; a host confined by taskset
/// (`bench/cluster.sh up --pin`) counts only its own. Ranks of a host are
/// consecutive (the topology's innermost level).
fn host_cores(comm: &Communicator) -> Result<usize, CliError> {
    let mine = [cpu_mask()];
    let mut all = vec![0u64; comm.size()];
    comm.all_gather(&mine, &mut all)?;
    let local = comm.topology().local_size().max(1);
    let host = comm.rank() / local;
    let union = all
        .iter()
        .skip(host * local)
        .take(local)
        .fold(0u64, |m, &x| m | x);
    Ok(if union == 0 {
        std::thread::available_parallelism().map_or(1, |c| c.get())
    } else {
        union.count_ones() as usize
    })
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
    /// The computation asked for per step (seconds), against which the
    /// measured one can be read.
    compute_asked: f64,
    /// CPUs this rank may run on, and ranks on its host.
    cores: usize,
    ranks_per_host: usize,
    /// All ranks on one host: the transfer is a copy by the ranks' CPUs.
    single_host: bool,
    /// The calibrated profile's LogGP o (seconds per message sent or
    /// received) and the messages of one step on the busiest rank.
    loggp_o: f64,
    messages: f64,
    /// The model's CPU part of one step's communication (o per message,
    /// gamma, copies; on one host all of it), seconds: said before any
    /// step is run.
    model_comm_cpu: f64,
    /// The share of the communication the model says can hide, from the
    /// profile alone: 1 - CPU part / total where the host has no spare
    /// core, else 1.
    model_hideable_fraction: f64,
    /// CPU seconds of the communication-only steps on the busiest rank
    /// (median; getrusage of the whole process).
    measured_comm_cpu: f64,
    /// What the prediction charges to the computation: per bucket, the
    /// larger of the model's CPU part and the measured CPU time's share.
    charged_comm_cpu: f64,
    /// CPU time over wall time of the compute-only steps (median, lowest
    /// rank): below 1, other processes took the CPU.
    compute_cpu_share: f64,
    /// Each way's CPU time per step (median, busiest rank; getrusage of
    /// the process, divided by the ranks for in-process ranks).
    cpu: Times,
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
    let mut bucketer = GradientBucketer::new(comm, &sizes, cap);
    let mut kernel = Kernel::new(comm)?;
    let steps = args.steps.max(1);

    // One step of way `w`: 0 compute, 1 comm, 2 sequential, 3 overlapped.
    let mut step = |w: usize, t0: Instant| -> Result<f64, CliError> {
        let layers = (0..sizes.len()).rev();
        let computed = match w {
            0 => {
                layers.for_each(|i| kernel.compute(share[i]));
                t0.elapsed()
            }
            1 => {
                for i in layers {
                    bucketer.ready(i, &grads[i])?;
                }
                std::time::Duration::ZERO
            }
            2 => {
                layers.clone().for_each(|i| kernel.compute(share[i]));
                let c = t0.elapsed();
                for i in layers {
                    bucketer.ready(i, &grads[i])?;
                }
                c
            }
            _ => {
                for i in layers {
                    kernel.compute(share[i]);
                    bucketer.ready(i, &grads[i])?;
                }
                t0.elapsed()
            }
        };
        if w > 0 {
            let mut views: Vec<&mut [f32]> = out.iter_mut().map(|v| v.as_mut_slice()).collect();
            bucketer.finish(&mut views)?;
        }
        Ok(computed.as_secs_f64())
    };
    // The ways take turns, step by step, so that a change of the machine's
    // speed (other load, clock) reaches all four alike; and each round
    // starts one way later than the last, so that no way always comes
    // right after the same other one (a way that always followed the
    // communication-only step measured differently from one that always
    // followed a computing one).
    let mut times: [Vec<f64>; 4] = Default::default();
    let mut samples: Vec<Sample> = Vec::new();
    for round in 0..steps {
        for j in 0..4 {
            let w = (round + j) % 4;
            let (slowest, sample) = timed_step(comm, w, |t0| step(w, t0))?;
            times[w].push(slowest);
            samples.push(sample);
        }
    }
    if args.trace {
        trace(comm, &samples, kernel.passes_per_sec)?;
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
    let cores = host_cores(comm)?;
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
    // Each bucket's predicted time and the model's CPU part of it.
    let (mut model_cpu, mut comm_total, mut messages, mut o) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
    let mut per_bucket = Vec::with_capacity(buckets.len());
    for b in &buckets {
        let ready = b.params.iter().map(|&p| ready_at[p]).fold(0.0, f64::max);
        let (algo, _) = comm.choose(Collective::AllReduce, b.len * 4)?;
        let mut shape = Shape::new(Collective::AllReduce, n, b.len, 4);
        shape.topology = comm.topology().clone();
        let (time, cpu) = match cost::overlap(algo, &shape, &profile) {
            Some(ov) => {
                o = ov.loggp.overhead;
                messages += cost::busiest(algo, &shape, &profile).map_or(0.0, |b| b.messages);
                (ov.total, ov.cpu)
            }
            None => (
                cost::predict(algo, &shape, &profile).map_or(0.0, |c| c.total()),
                0.0,
            ),
        };
        // Within one host the bytes are moved by the ranks' CPUs (a copy
        // through shared memory or between threads): what LogGP calls the
        // wire is CPU time there too, so all of it is the CPU's.
        let cpu = if single_host { time } else { cpu };
        model_cpu += cpu;
        comm_total += time;
        per_bucket.push((ready, time, cpu));
    }
    // Every way's CPU time per step on the busiest rank (median of its
    // steps; every thread of the process: the bucketer's copies, the
    // progress worker, the kernel's send and receive path in its system
    // calls). The overlapped step's minus the compute-only one's is what the
    // communication took from the computation's core.
    let in_process = comm.transport_name() == "thread";
    let mut way_cpu = [0.0f64; 4];
    for (w, c) in way_cpu.iter_mut().enumerate() {
        let mut v: Vec<f64> = samples
            .iter()
            .filter(|s| s.way == w)
            .map(|s| s.cpu / if in_process { n as f64 } else { 1.0 })
            .collect();
        v.sort_by(f64::total_cmp);
        *c = v[v.len() / 2];
    }
    let mut busiest_cpu = [0.0f64; 4];
    comm.all_reduce(&way_cpu, &mut busiest_cpu, ReduceOp::Max)?;
    let cpu_times = Times {
        compute: busiest_cpu[0],
        comm: busiest_cpu[1],
        sequential: busiest_cpu[2],
        overlapped: busiest_cpu[3],
    };
    // The communication-only steps' CPU time: over TCP mostly the kernel's
    // per-byte work, which LogGP's o per message does not count; where the
    // host has no spare core it comes out of the computation all the same,
    // so the prediction charges the larger of the two (the model's where it
    // says more, as on one host, where it says all).
    let measured_cpu = cpu_times.comm;
    // The share of a core the computation got: CPU time over wall time of
    // the compute-only steps (median, the lowest rank). Below 1 other
    // processes took the CPU meanwhile, and the four ways' medians then
    // compare steps run at different speeds of the machine.
    let mut shares: Vec<f64> = samples
        .iter()
        .filter(|s| s.way == 0 && s.total > 0.0)
        .map(|s| s.cpu / s.total / if in_process { n as f64 } else { 1.0 })
        .collect();
    shares.sort_by(f64::total_cmp);
    let mine = [shares.get(shares.len() / 2).copied().unwrap_or(1.0)];
    let mut compute_cpu_share = [0.0f64];
    comm.all_reduce(&mine, &mut compute_cpu_share, ReduceOp::Min)?;
    let compute_cpu_share = compute_cpu_share[0];
    let scale_cpu = if cpu_contended && measured_cpu > model_cpu && comm_total > 0.0 {
        measured_cpu / comm_total
    } else {
        0.0
    };
    let (mut worker_free, mut cpu_total) = (0.0f64, 0.0f64);
    for &(ready, time, cpu) in &per_bucket {
        worker_free = worker_free.max(ready) + time;
        cpu_total += cpu.max(time * scale_cpu).min(time);
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
        compute_asked: compute_s,
        efficiency: efficiency(&measured),
        measured,
        predicted_efficiency: efficiency(&predicted),
        predicted,
        cpu_contended,
        cores,
        ranks_per_host: per_host,
        single_host,
        loggp_o: o,
        messages,
        model_comm_cpu: model_cpu,
        model_hideable_fraction: if comm_total <= 0.0 {
            0.0
        } else if cpu_contended {
            (1.0 - model_cpu / comm_total).max(0.0)
        } else {
            1.0
        },
        measured_comm_cpu: measured_cpu,
        charged_comm_cpu: cpu_total,
        compute_cpu_share,
        cpu: cpu_times,
    }))
}

/// `--trace`: every rank's samples to rank 0, printed on stderr one step
/// of one way per line, ranks side by side; starts relative to rank 0's
/// first step.
fn trace(comm: &Communicator, samples: &[Sample], rate: f64) -> Result<(), CliError> {
    let mine: Vec<f64> = [rate]
        .into_iter()
        .chain(
            samples
                .iter()
                .flat_map(|s| [s.start, s.compute, s.total, s.cpu]),
        )
        .collect();
    let mut all = vec![0.0f64; mine.len() * comm.size()];
    comm.all_gather(&mine, &mut all)?;
    if comm.rank() != 0 {
        return Ok(());
    }
    let per = mine.len();
    let t0 = all[1];
    let mut err = io::stderr().lock();
    let rates: Vec<String> = all.chunks(per).map(|r| format!("{:.0}", r[0])).collect();
    writeln!(err, "# trace: kernel passes/s per rank {}", rates.join(" "))?;
    writeln!(
        err,
        "# trace: round way, then per rank: start_ms (from rank 0's first) compute_ms total_ms cpu_ms"
    )?;
    let names = ["compute", "comm", "seq", "overlap"];
    for (k, sample) in samples.iter().enumerate() {
        let mut line = format!("{:>3} {:<8}", k / 4, names[sample.way]);
        for r in all.chunks(per) {
            let s = &r[1 + 4 * k..5 + 4 * k];
            line += &format!(
                " | {:>9.2} {:>8.2} {:>8.2} {:>8.2}",
                (s[0] - t0) * 1e3,
                s[1] * 1e3,
                s[2] * 1e3,
                s[3] * 1e3
            );
        }
        writeln!(err, "{line}")?;
    }
    Ok(())
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
    writeln!(out, "{}", model_says(&r))?;
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
        "  {:<10} {:>12.2} {:>12.2} {:>12.2} {:>12.2}",
        "cpu",
        r.cpu.compute * 1e3,
        r.cpu.comm * 1e3,
        r.cpu.sequential * 1e3,
        r.cpu.overlapped * 1e3
    )?;
    writeln!(
        out,
        "# efficiency = (seq - overlap) / min(compute, comm); cpu: CPU time of each way's step (median, \
         busiest rank); computation asked {:.2} ms per step; \
         the communication-only steps took {:.2} ms of CPU (getrusage, busiest rank){}",
        r.compute_asked * 1e3,
        r.measured_comm_cpu * 1e3,
        if r.cpu_contended {
            format!(
                "; the prediction adds {:.2} ms of CPU to the computation (per bucket the larger \
                 of the model's part and the measured one's share)",
                r.charged_comm_cpu * 1e3
            )
        } else {
            String::new()
        }
    )?;
    writeln!(
        out,
        "# the compute-only steps ran on {:.0}% of a core (CPU time / wall time, median, lowest rank){}",
        r.compute_cpu_share * 100.0,
        if r.compute_cpu_share < 0.95 {
            ": other processes took the CPU meanwhile, and the ways' medians compare steps run at \
             different speeds of the machine"
        } else {
            ""
        }
    )?;
    Ok(())
}

/// What the cost model says about this step before any step is run: how
/// much of the communication is CPU work (LogGP's o per message, gamma,
/// copies; on one host the transfer itself) and whether a core is free for
/// it.
fn model_says(r: &Report) -> String {
    let comm = r.predicted.comm * 1e3;
    let cpu = r.model_comm_cpu * 1e3;
    let what = format!(
        "# model (calibrated profile, before any step): the {} allreduces take {comm:.2} ms, \
         {cpu:.2} ms of it CPU work (o = {:.2} us x {:.0} messages, gamma, copies{})",
        r.buckets,
        r.loggp_o * 1e6,
        r.messages,
        if r.single_host {
            "; on one host the transfer is a copy by the ranks' CPUs, so all of it"
        } else {
            ""
        }
    );
    if r.cpu_contended {
        format!(
            "{what}; {} rank(s) on {} core(s) leave no core for the progress workers: \
             the CPU part cannot hide behind computation on the same cores, at most {:.0}% \
             of the communication can{}",
            r.ranks_per_host,
            r.cores,
            r.model_hideable_fraction * 100.0,
            if r.model_hideable_fraction < 0.05 {
                " (CPU-bound communication does not hide behind CPU-bound computation)"
            } else {
                ""
            }
        )
    } else {
        format!(
            "{what}; {} rank(s) on {} core(s): the progress workers have cores of their own, \
             all of it can hide",
            r.ranks_per_host, r.cores
        )
    }
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
