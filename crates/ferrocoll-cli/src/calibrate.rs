//! `ferrocoll calibrate`: measure this machine and fit the cost model.
//!
//! Runs short sweeps of allreduce, allgather and alltoall with every
//! algorithm they have, over sizes from 8 B to `--maxbytes`, then fits the
//! cost model by least squares. The closed forms are linear in (alpha,
//! 1/beta, gamma, o, copy cost, 1/beta beyond the cache): each measurement
//! contributes its algorithm's rounds, bytes on the critical path, bytes
//! reduced, further messages and bytes copied locally (the closed form
//! evaluated with unit parameters), and the fit weighs every point by
//! 1/time² so that a 10 % miss at 8 B counts as much as one at 16 MiB.
//!
//! gamma and the copy cost are timed from the kernels themselves (fitted
//! from collective timings they trade off against beta). The points whose
//! working set (every rank's buffers, [`Shape::working_set`]) exceeds a
//! threshold get a beta of their own, `beta_mem`: the threshold is the one,
//! among the gaps between the measured working sets, whose fit leaves the
//! least weighted error (none if no split helps), and the profile keeps the
//! middle of that gap as `cache_bytes`.
//!
//! Each point is the fastest of `--repeat` timed batches: on a shared
//! machine a descheduled batch only ever adds time. Prints each point's
//! error, R², the geometric-mean error, the same for the simpler models
//! (no copy cost, no cache regime) fitted to the same points, and writes the
//! profile as JSON where the communicator looks for it (or `--out`).

use std::io::{self, Write};
use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use ferrocoll::cost::{self, Profile, ProfileFile, Shape};
use ferrocoll::{local, CallOptions, Collective, Communicator, DType, ReduceOp};

use crate::error::CliError;

/// Arguments of `ferrocoll calibrate`.
#[derive(Debug, Args)]
pub struct CalibrateArgs {
    /// Ranks to measure with.
    #[arg(short = 'n', long = "ranks", default_value_t = 4)]
    ranks: usize,
    /// Largest size measured (nccl-tests bytes).
    #[arg(short = 'e', long, default_value = "16M", value_parser = crate::bench::parse_size)]
    maxbytes: usize,
    /// Where to write the profile (default: the path the library reads).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print one JSON line per measured point as well.
    #[arg(long)]
    json: bool,
    /// Transport to measure: `thread` (ranks as threads), `shm` or `tcp`
    /// (ranks as processes, started through `ferrocoll run`). The profile is
    /// written for that transport.
    #[arg(long, default_value = "thread", value_parser = ["thread", "shm", "tcp"])]
    transport: String,
    /// Timed batches per point; the fastest counts.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    repeat: u32,
}

/// The model's parameters, in the order of [`Point::coef`]: alpha, 1/beta,
/// gamma, per-message overhead o, copy cost, 1/beta beyond the cache.
const PARAMS: usize = 6;
/// Index of gamma, of the copy cost and of 1/beta_mem in [`Point::coef`].
const GAMMA: usize = 2;
const COPY: usize = 4;
const INV_BETA_MEM: usize = 5;

/// The collectives calibration measures.
const CALIBRATED: [Collective; 3] = [
    Collective::AllReduce,
    Collective::AllGather,
    Collective::AllToAll,
];

/// One measurement and what the model needs to explain it.
#[derive(Clone)]
struct Point {
    coll: Collective,
    algo: &'static str,
    bytes: usize,
    seconds: f64,
    /// Every rank's buffers together ([`Shape::working_set`]).
    working_set: f64,
    /// Rounds, bytes/beta coefficient, reduced bytes, extra concurrent
    /// messages, copied bytes, and 0 for the bytes beyond the cache (moved
    /// there from index 1 by [`split_at`]): the closed form with unit
    /// parameters.
    coef: [f64; PARAMS],
}

fn blocks(coll: Collective, n: usize) -> usize {
    if coll == Collective::AllReduce {
        1
    } else {
        n
    }
}

/// Times `repeat` batches of `iters` calls on every rank; returns the
/// fastest batch's mean on the slowest rank.
fn time_calls(
    comm: &Communicator,
    c: &Communicator,
    coll: Collective,
    count: usize,
    iters: usize,
    repeat: u32,
) -> Result<f64, ferrocoll::Error> {
    let n = comm.size();
    let (send_len, recv_len) = match coll {
        Collective::AllReduce => (count, count),
        Collective::AllGather => (count, n * count),
        _ => (n * count, n * count),
    };
    let send = vec![1.0f32; send_len];
    let mut recv = vec![0.0f32; recv_len];
    let mut call = |c: &Communicator| match coll {
        Collective::AllReduce => c.all_reduce(&send, &mut recv, ReduceOp::Sum),
        Collective::AllGather => c.all_gather(&send, &mut recv),
        _ => c.all_to_all(&send, &mut recv),
    };
    for _ in 0..2 {
        call(c)?;
    }
    let mut best = f64::MAX;
    for _ in 0..repeat {
        comm.barrier()?;
        let start = Instant::now();
        for _ in 0..iters {
            call(c)?;
        }
        let mine = [start.elapsed().as_secs_f64() / iters as f64];
        let mut slowest = [0.0f64];
        comm.all_reduce(&mine, &mut slowest, ReduceOp::Max)?;
        best = best.min(slowest[0]);
    }
    Ok(best)
}

/// Unit-parameter coefficients of the closed form.
fn coefficients(algo: ferrocoll::Algorithm, shape: &Shape) -> Option<[f64; PARAMS]> {
    let huge = 1e300;
    let rounds = cost::predict(algo, shape, &Profile::uniform(1.0, huge, 0.0))?.latency;
    let bytes = cost::predict(algo, shape, &Profile::uniform(0.0, 1.0, 0.0))?.bandwidth;
    let reduced = cost::predict(algo, shape, &Profile::uniform(0.0, huge, 1.0))?.compute;
    let mut unit_o = Profile::uniform(0.0, huge, 0.0);
    unit_o.intra.overhead = 1.0;
    unit_o.inter.overhead = 1.0;
    let messages = cost::predict(algo, shape, &unit_o)?.latency;
    let mut unit_copy = Profile::uniform(0.0, huge, 0.0);
    unit_copy.copy = 1.0;
    let copied = cost::predict(algo, shape, &unit_copy)?.compute;
    Some([rounds, bytes, reduced, messages, copied, 0.0])
}

/// Seconds per byte of `kernel` on 1 MiB operands, the fastest of 20
/// batches of 10 runs.
fn time_kernel(mut kernel: impl FnMut()) -> f64 {
    let bytes = 1 << 20;
    let mut best = f64::MAX;
    for _ in 0..20 {
        let t = Instant::now();
        for _ in 0..10 {
            kernel();
        }
        best = best.min(t.elapsed().as_secs_f64() / 10.0);
    }
    best / bytes as f64
}

/// Seconds per byte of a local copy (`copy_from_slice`, as the executor's
/// `Copy` does) between two 1 MiB buffers: the copy cost, timed like
/// [`measure_gamma`].
fn measure_copy() -> f64 {
    let src = vec![0.5f32; (1 << 20) / 4];
    let mut dst = vec![1.0f32; (1 << 20) / 4];
    time_kernel(|| {
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
    })
}

/// Seconds per byte of the f32 sum kernel on 1 MiB operands (cache
/// resident, as the executor's slices keep them): gamma measured on its own.
///
/// Fitting gamma together with alpha and beta from collective timings does
/// not work: reductions overlap with data movement, so the fit trades gamma
/// for beta and lands on gamma = 0, and then the model cannot tell an
/// algorithm that reduces every byte (butterfly) from one that reduces a
/// share (ring, halving-doubling).
fn measure_gamma() -> f64 {
    let mut dst = vec![1.0f32; (1 << 20) / 4];
    let src = vec![0.5f32; (1 << 20) / 4];
    let t = time_kernel(|| {
        let (d, s): (&mut [u8], &[u8]) = (
            bytemuck::cast_slice_mut(&mut dst),
            bytemuck::cast_slice(&src),
        );
        ferrocoll::kernels::accumulate(DType::F32, ReduceOp::Sum, d, s);
    });
    std::hint::black_box(&dst);
    t
}

/// Weighted least squares for t ≈ x·coef with weights 1/t², x >= 0
/// (parameters that come out negative are dropped and the rest refitted).
/// `fixed[i]` = Some(v) holds parameter i at v; the others are fitted to
/// what the fixed ones leave of each time. A parameter whose coefficient is
/// 0 at every point comes out 0.
fn fit(points: &[Point], fixed: [Option<f64>; PARAMS]) -> [f64; PARAMS] {
    let mut active: [bool; PARAMS] =
        std::array::from_fn(|i| fixed[i].is_none() && points.iter().any(|p| p.coef[i] != 0.0));
    loop {
        let idx: Vec<usize> = (0..PARAMS).filter(|&i| active[i]).collect();
        let k = idx.len();
        let mut ata = vec![vec![0.0f64; k]; k];
        let mut atb = vec![0.0f64; k];
        for p in points {
            let w = 1.0 / p.seconds; // rows scaled by 1/t: relative residuals
            let rest = p.seconds
                - (0..PARAMS)
                    .map(|i| fixed[i].unwrap_or(0.0) * p.coef[i])
                    .sum::<f64>();
            for (a, &i) in idx.iter().enumerate() {
                atb[a] += p.coef[i] * w * w * rest;
                for (b, &j) in idx.iter().enumerate() {
                    ata[a][b] += p.coef[i] * p.coef[j] * w * w;
                }
            }
        }
        let sol = solve(ata, atb);
        let mut x: [f64; PARAMS] = std::array::from_fn(|i| fixed[i].unwrap_or(0.0));
        for (a, &i) in idx.iter().enumerate() {
            x[i] = sol[a];
        }
        match (0..PARAMS).find(|&i| active[i] && x[i] < 0.0) {
            Some(i) => active[i] = false,
            None => return x,
        }
    }
}

/// The points with their bandwidth coefficient moved to 1/beta_mem where
/// the working set exceeds `threshold` bytes.
fn split_at(points: &[Point], threshold: f64) -> Vec<Point> {
    points
        .iter()
        .map(|p| {
            let mut q = p.clone();
            if p.working_set > threshold {
                q.coef[INV_BETA_MEM] = q.coef[1];
                q.coef[1] = 0.0;
            }
            q
        })
        .collect()
}

/// The model's time for `p` with parameters `x`.
fn model_time(x: &[f64; PARAMS], p: &Point) -> f64 {
    x.iter().zip(&p.coef).map(|(x, c)| x * c).sum()
}

/// Sum of squared relative residuals: what [`fit`] minimises.
fn weighted_error(x: &[f64; PARAMS], points: &[Point]) -> f64 {
    points
        .iter()
        .map(|p| (model_time(x, p) / p.seconds - 1.0).powi(2))
        .sum()
}

/// Geometric mean of the relative errors, exp(mean |ln(predicted/measured)|)
/// - 1, and R² of log time.
fn quality(x: &[f64; PARAMS], points: &[Point]) -> (f64, f64) {
    let logs: Vec<(f64, f64)> = points
        .iter()
        .map(|p| (p.seconds.ln(), model_time(x, p).max(1e-12).ln()))
        .collect();
    let mean = logs.iter().map(|l| l.0).sum::<f64>() / logs.len() as f64;
    let ss_res: f64 = logs.iter().map(|(m, q)| (m - q).powi(2)).sum();
    let ss_tot: f64 = logs.iter().map(|(m, _)| (m - mean).powi(2)).sum();
    let geomean =
        (logs.iter().map(|(m, q)| (q - m).abs()).sum::<f64>() / logs.len() as f64).exp() - 1.0;
    (geomean, 1.0 - ss_res / ss_tot.max(1e-300))
}

/// The fit with a cache regime: among the gaps between the points' working
/// sets (and no split at all), the threshold whose fit leaves the least
/// weighted error, with beta_mem no faster than beta. Returns the
/// parameters, the gap (`None`: no split) and the points as split.
fn fit_with_cache(
    points: &[Point],
    fixed: [Option<f64>; PARAMS],
) -> ([f64; PARAMS], Option<(f64, f64)>, Vec<Point>) {
    let mut sets: Vec<f64> = points.iter().map(|p| p.working_set).collect();
    sets.sort_by(f64::total_cmp);
    sets.dedup();
    let mut best = (fit(points, fixed), None, points.to_vec());
    let mut best_err = weighted_error(&best.0, points);
    for gap in sets.windows(2) {
        let split = split_at(points, gap[0]);
        let x = fit(&split, fixed);
        // A split that finds the memory faster than the cache is noise.
        if x[INV_BETA_MEM] < x[1] || x[1] == 0.0 {
            continue;
        }
        let err = weighted_error(&x, &split);
        if err < best_err {
            best_err = err;
            best = (x, Some((gap[0], gap[1])), split);
        }
    }
    best
}

/// Gaussian elimination with partial pivoting (k <= PARAMS).
fn solve(mut a: Vec<Vec<f64>>, mut b: Vec<f64>) -> Vec<f64> {
    let k = b.len();
    for col in 0..k {
        let piv = (col..k)
            .max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))
            .unwrap_or(col);
        a.swap(col, piv);
        b.swap(col, piv);
        if a[col][col].abs() < 1e-300 {
            continue;
        }
        for row in col + 1..k {
            let f = a[row][col] / a[col][col];
            let pivot_row = a[col].clone();
            for (x, p) in a[row][col..].iter_mut().zip(&pivot_row[col..]) {
                *x -= f * p;
            }
            b[row] -= f * b[col];
        }
    }
    let mut x = vec![0.0; k];
    for row in (0..k).rev() {
        let s: f64 = (row + 1..k).map(|c| a[row][c] * x[c]).sum();
        x[row] = if a[row][row].abs() < 1e-300 {
            0.0
        } else {
            (b[row] - s) / a[row][row]
        };
    }
    x
}

/// Runs `ferrocoll calibrate`.
pub fn main(args: &CalibrateArgs) -> Result<(), CliError> {
    let n = args.ranks;
    if n < 2 {
        return Err(CliError::Usage(
            "--ranks must be at least 2 to measure communication".into(),
        ));
    }
    let mut sizes = vec![];
    let mut b = 8usize;
    while b <= args.maxbytes {
        sizes.push(b);
        b *= 8;
    }
    let transport = args.transport.as_str();
    if transport != "thread" && !crate::run::in_job() {
        return crate::run::relaunch_self(n, transport, "calibration");
    }
    let elem = DType::F32.size();
    let progress = io::stderr();
    let measure = |comm: Communicator| -> Result<Vec<Point>, ferrocoll::Error> {
        let mut points = Vec::new();
        for coll in CALIBRATED {
            for &algo in coll.algorithms() {
                let c = comm.with_options(CallOptions::algorithm(algo));
                for &bytes in &sizes {
                    let count = bytes / (elem * blocks(coll, n));
                    if count == 0 {
                        continue;
                    }
                    // Enough calls to fill ~20 ms, at least 3.
                    let iters = (2e7 / (bytes as f64 + 2e4)).clamp(3.0, 200.0) as usize;
                    let seconds = time_calls(&comm, &c, coll, count, iters, args.repeat)?;
                    let mut shape = Shape::new(coll, n, count, elem);
                    shape.topology = comm.topology().clone();
                    if let Some(coef) = coefficients(algo, &shape) {
                        points.push(Point {
                            coll,
                            algo: algo.name(),
                            bytes: count * elem * blocks(coll, n),
                            seconds,
                            working_set: shape.working_set(),
                            coef,
                        });
                    }
                }
                if comm.rank() == 0 {
                    let _ = writeln!(progress.lock(), "calibrate: {coll}/{algo} measured");
                }
            }
        }
        Ok(points)
    };
    let results = if transport == "thread" {
        local::run(n, measure)?
    } else {
        let comm = ferrocoll::init()?;
        if comm.size() != n {
            return Err(CliError::Usage(format!(
                "--ranks {n} but the job has {} ranks",
                comm.size()
            )));
        }
        let rank = comm.rank();
        let points = measure(comm);
        if rank != 0 {
            return points.map(|_| ()).map_err(CliError::from);
        }
        vec![points]
    };
    let mut points = Vec::new();
    for r in results {
        let p = r?;
        if points.is_empty() {
            points = p;
        }
    }
    if points.is_empty() {
        return Err(CliError::Run("no point could be measured".into()));
    }
    let (gamma, copy) = (measure_gamma(), measure_copy());
    // The simpler models first, fitted to the same points: what the profile
    // would say without a copy cost and without a cache regime.
    let mut fixed = [None; PARAMS];
    fixed[GAMMA] = Some(gamma);
    fixed[COPY] = Some(0.0);
    let plain = fit(&points, fixed);
    fixed[COPY] = Some(copy);
    let with_copy = fit(&points, fixed);
    let (x, gap, split) = fit_with_cache(&points, fixed);
    let [alpha, inv_beta, _, overhead, _, inv_beta_mem] = x;
    let mut profile = Profile::uniform(alpha, 1.0 / inv_beta.max(1e-18), gamma);
    profile.intra.overhead = overhead;
    profile.inter.overhead = overhead;
    profile.copy = copy;
    if let Some((below, above)) = gap {
        // The data place the cache's edge somewhere in the gap: its
        // geometric middle.
        profile.cache_bytes = (below * above).sqrt();
        profile.beta_mem = 1.0 / inv_beta_mem.max(1e-18);
    }
    let (geomean_error, r2) = quality(&x, &split);

    let mut out = io::stdout().lock();
    writeln!(
        out,
        "# {:<14} {:<18} {:>10} {:>12} {:>12} {:>8}",
        "coll", "algo", "bytes", "measured_us", "predicted_us", "error"
    )?;
    for p in &split {
        let q = model_time(&x, p);
        writeln!(
            out,
            "  {:<14} {:<18} {:>10} {:>12.2} {:>12.2} {:>7.1}%",
            p.coll.name(),
            p.algo,
            p.bytes,
            p.seconds * 1e6,
            q * 1e6,
            (q / p.seconds - 1.0) * 100.0
        )?;
        if args.json {
            writeln!(
                out,
                "{}",
                serde_json::json!({"coll": p.coll.name(), "algo": p.algo, "bytes": p.bytes,
                    "measured_us": p.seconds * 1e6, "predicted_us": q * 1e6})
            )?;
        }
    }
    let gbs = |inv: f64| 1.0 / inv.max(1e-18) / 1e9;
    for (name, y, pts) in [
        ("alpha-beta-gamma-o", &plain, &points),
        ("+ copy cost", &with_copy, &points),
    ] {
        let (g, r) = quality(y, pts);
        writeln!(
            out,
            "# model {name:<20} alpha {:.3} us, beta {:.3} GB/s, overhead {:.3} us/message; R^2 (log time) {r:.4}; geometric-mean error {:.1}%",
            y[0] * 1e6,
            gbs(y[1]),
            y[3] * 1e6,
            g * 100.0
        )?;
    }
    match gap {
        Some((below, above)) => writeln!(
            out,
            "# model {:<20} beta {:.3} GB/s up to a working set of {:.1}..{:.1} MiB (cache_bytes {:.1} MiB), {:.3} GB/s beyond",
            "+ cache regime",
            gbs(inv_beta),
            below / 1048576.0,
            above / 1048576.0,
            profile.cache_bytes / 1048576.0,
            gbs(inv_beta_mem)
        )?,
        None => writeln!(out, "# model {:<20} no split of the working sets lowers the error", "+ cache regime")?,
    }
    writeln!(
        out,
        "# fit over {} points: alpha {:.3} us, beta {:.3} GB/s, gamma {:.4} ns/B, copy {:.4} ns/B, overhead {:.3} us/message; R^2 (log time) {:.4}; geometric-mean error {:.1}%",
        points.len(),
        alpha * 1e6,
        gbs(inv_beta),
        gamma * 1e9,
        copy * 1e9,
        overhead * 1e6,
        r2,
        geomean_error * 100.0
    )?;
    let file = ProfileFile {
        transport: transport.into(),
        profile,
        r2,
        geomean_error,
        points: points.len(),
    };
    let path = match &args.out {
        Some(p) => p.clone(),
        None => Profile::default_path(transport).ok_or_else(|| {
            CliError::Usage("no HOME or XDG_CONFIG_HOME to write the profile to; pass --out".into())
        })?,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| CliError::Run(format!("cannot create {}: {e}", dir.display())))?;
    }
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&file).expect("plain data"),
    )
    .map_err(|e| CliError::Run(format!("cannot write {}: {e}", path.display())))?;
    writeln!(
        out,
        "# wrote {} (FERROCOLL_PROFILE={} selects it explicitly)",
        path.display(),
        path.display()
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_recovers_known_parameters() {
        // Points generated from alpha = 2 us, 1/beta = 1e-10 s/B,
        // gamma = 5e-11 s/B, o = 0.7 us per extra message, a copy cost of
        // 2e-11 s/B and 1/beta_mem = 4e-10 s/B.
        let truth = [2e-6, 1e-10, 5e-11, 7e-7, 2e-11, 4e-10];
        let coefs = [
            [2.0, 8.0, 0.0, 0.0, 0.0, 0.0],
            [6.0, 1e6, 5e5, 1.0, 0.0, 0.0],
            [4.0, 1e7, 0.0, 6.0, 2e6, 0.0],
            [10.0, 3e4, 1e4, 0.0, 1e4, 0.0],
            [2.0, 1e8, 5e7, 2.0, 0.0, 0.0],
            [1.0, 64.0, 0.0, 30.0, 64.0, 0.0],
            [3.0, 0.0, 1e7, 2.0, 1e7, 3e7],
            [8.0, 0.0, 0.0, 0.0, 0.0, 5e7],
        ];
        let points: Vec<Point> = coefs
            .iter()
            .map(|c| Point {
                coll: Collective::AllReduce,
                algo: "ring",
                bytes: 0,
                seconds: c.iter().zip(&truth).map(|(c, t)| c * t).sum(),
                working_set: 0.0,
                coef: *c,
            })
            .collect();
        let close = |x: [f64; PARAMS]| {
            for (got, want) in x.iter().zip(&truth) {
                assert!((got - want).abs() <= 1e-6 * want, "{x:?}");
            }
        };
        close(fit(&points, [None; PARAMS]));
        // With gamma and the copy cost fixed at their true values the others
        // come out the same.
        let mut fixed = [None; PARAMS];
        fixed[GAMMA] = Some(truth[GAMMA]);
        fixed[COPY] = Some(truth[COPY]);
        close(fit(&points, fixed));
    }

    #[test]
    fn cache_regime_is_found_between_the_working_sets() {
        // 1/beta = 1e-10 s/B while every rank's buffers fit in 32 MiB,
        // 1/beta_mem = 3e-10 s/B beyond; alpha = 5 us.
        let mib = 1048576.0;
        let points: Vec<Point> = [
            (1.0, 4e3),
            (4.0, 1e6),
            (16.0, 4e6),
            (64.0, 1.6e7),
            (128.0, 3.2e7),
        ]
        .iter()
        .flat_map(|&(ws, bytes)| {
            [1.0, 2.0].map(|rounds| {
                let inv = if ws * mib > 32.0 * mib { 3e-10 } else { 1e-10 };
                Point {
                    coll: Collective::AllReduce,
                    algo: "ring",
                    bytes: 0,
                    seconds: 5e-6 * rounds + inv * bytes * rounds,
                    working_set: ws * mib,
                    coef: [rounds, bytes * rounds, 0.0, 0.0, 0.0, 0.0],
                }
            })
        })
        .collect();
        let mut fixed = [None; PARAMS];
        fixed[GAMMA] = Some(0.0);
        fixed[COPY] = Some(0.0);
        let (x, gap, _) = fit_with_cache(&points, fixed);
        assert_eq!(gap, Some((16.0 * mib, 64.0 * mib)));
        assert!((x[0] - 5e-6).abs() < 1e-12, "{x:?}");
        assert!((x[1] - 1e-10).abs() < 1e-16, "{x:?}");
        assert!((x[INV_BETA_MEM] - 3e-10).abs() < 1e-16, "{x:?}");
        // One regime everywhere: no split.
        let flat: Vec<Point> = points
            .iter()
            .map(|p| Point {
                seconds: 5e-6 * p.coef[0] + 1e-10 * p.coef[1],
                ..p.clone()
            })
            .collect();
        assert_eq!(fit_with_cache(&flat, fixed).1, None);
    }
}
