//! `ferrocoll calibrate`: measure this machine and fit the cost model.
//!
//! Runs short sweeps of allreduce, allgather and alltoall with every
//! algorithm they have, over sizes from 8 B to `--maxbytes`, then fits alpha,
//! beta and gamma by least squares. The closed forms are linear in (alpha,
//! 1/beta, gamma): each measurement contributes its algorithm's rounds, bytes
//! on the critical path and bytes reduced (the closed form evaluated with unit
//! parameters), and the fit weighs every point by 1/time² so that a 10 %
//! miss at 8 B counts as much as one at 16 MiB. Prints each point's error,
//! R² and the geometric-mean error, and writes the profile as JSON where the
//! communicator looks for it (or `--out`).

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
}

/// Fitted parameters: alpha, 1/beta, gamma, per-message overhead o.
const PARAMS: usize = 4;

/// The collectives calibration measures.
const CALIBRATED: [Collective; 3] = [
    Collective::AllReduce,
    Collective::AllGather,
    Collective::AllToAll,
];

/// One measurement and what the model needs to explain it.
struct Point {
    coll: Collective,
    algo: &'static str,
    bytes: usize,
    seconds: f64,
    /// Rounds, bytes/beta coefficient, reduced bytes, extra concurrent
    /// messages: the closed form with unit parameters.
    coef: [f64; PARAMS],
}

fn blocks(coll: Collective, n: usize) -> usize {
    if coll == Collective::AllReduce {
        1
    } else {
        n
    }
}

/// Times `iters` calls on every rank; returns the slowest rank's mean.
fn time_calls(
    comm: &Communicator,
    c: &Communicator,
    coll: Collective,
    count: usize,
    iters: usize,
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
    comm.barrier()?;
    let start = Instant::now();
    for _ in 0..iters {
        call(c)?;
    }
    let mine = [start.elapsed().as_secs_f64() / iters as f64];
    let mut slowest = [0.0f64];
    comm.all_reduce(&mine, &mut slowest, ReduceOp::Max)?;
    Ok(slowest[0])
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
    Some([rounds, bytes, reduced, messages])
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
    let bytes = 1 << 20;
    let mut dst = vec![1.0f32; bytes / 4];
    let src = vec![0.5f32; bytes / 4];
    let (d, s): (&mut [u8], &[u8]) = (
        bytemuck::cast_slice_mut(&mut dst),
        bytemuck::cast_slice(&src),
    );
    let mut best = f64::MAX;
    for _ in 0..20 {
        let t = Instant::now();
        for _ in 0..10 {
            ferrocoll::kernels::accumulate(DType::F32, ReduceOp::Sum, d, s);
        }
        best = best.min(t.elapsed().as_secs_f64() / 10.0);
    }
    std::hint::black_box(&dst);
    best / bytes as f64
}

/// Weighted least squares for t ≈ x·coef with weights 1/t², x >= 0
/// (parameters that come out negative are dropped and the rest refitted).
/// With `gamma` given, that parameter is fixed and the rest are fitted to
/// what it leaves of each time.
fn fit(points: &[Point], gamma: Option<f64>) -> [f64; PARAMS] {
    let mut active = [true; PARAMS];
    let fixed = gamma.unwrap_or(0.0);
    if gamma.is_some() {
        active[2] = false;
    }
    loop {
        let idx: Vec<usize> = (0..PARAMS).filter(|&i| active[i]).collect();
        let k = idx.len();
        let mut ata = vec![vec![0.0f64; k]; k];
        let mut atb = vec![0.0f64; k];
        for p in points {
            let w = 1.0 / p.seconds; // rows scaled by 1/t: relative residuals
            let rest = p.seconds - fixed * p.coef[2];
            for (a, &i) in idx.iter().enumerate() {
                atb[a] += p.coef[i] * w * w * rest;
                for (b, &j) in idx.iter().enumerate() {
                    ata[a][b] += p.coef[i] * p.coef[j] * w * w;
                }
            }
        }
        let sol = solve(ata, atb);
        let mut x = [0.0f64; PARAMS];
        x[2] = fixed;
        for (a, &i) in idx.iter().enumerate() {
            x[i] = sol[a];
        }
        match (0..PARAMS).find(|&i| active[i] && x[i] < 0.0) {
            Some(i) => active[i] = false,
            None => return x,
        }
    }
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
                    let seconds = time_calls(&comm, &c, coll, count, iters)?;
                    let mut shape = Shape::new(coll, n, count, elem);
                    shape.topology = comm.topology().clone();
                    if let Some(coef) = coefficients(algo, &shape) {
                        points.push(Point {
                            coll,
                            algo: algo.name(),
                            bytes: count * elem * blocks(coll, n),
                            seconds,
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
    let [alpha, inv_beta, gamma, overhead] = fit(&points, Some(measure_gamma()));
    let mut profile = Profile::uniform(alpha, 1.0 / inv_beta.max(1e-18), gamma);
    profile.intra.overhead = overhead;
    profile.inter.overhead = overhead;
    let predict = |p: &Point| {
        alpha * p.coef[0] + inv_beta * p.coef[1] + gamma * p.coef[2] + overhead * p.coef[3]
    };
    // Fit quality on log time (sizes span many decades).
    let logs: Vec<(f64, f64)> = points
        .iter()
        .map(|p| (p.seconds.ln(), predict(p).max(1e-12).ln()))
        .collect();
    let mean = logs.iter().map(|l| l.0).sum::<f64>() / logs.len() as f64;
    let ss_res: f64 = logs.iter().map(|(m, q)| (m - q).powi(2)).sum();
    let ss_tot: f64 = logs.iter().map(|(m, _)| (m - mean).powi(2)).sum();
    let r2 = 1.0 - ss_res / ss_tot.max(1e-300);
    // Geometric mean of the relative errors: exp(mean |ln(predicted/measured)|) - 1.
    let geomean_error =
        (logs.iter().map(|(m, q)| (q - m).abs()).sum::<f64>() / logs.len() as f64).exp() - 1.0;

    let mut out = io::stdout().lock();
    writeln!(
        out,
        "# {:<14} {:<18} {:>10} {:>12} {:>12} {:>8}",
        "coll", "algo", "bytes", "measured_us", "predicted_us", "error"
    )?;
    for p in &points {
        let q = predict(p);
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
    writeln!(
        out,
        "# fit over {} points: alpha {:.3} us, beta {:.3} GB/s, gamma {:.4} ns/B, overhead {:.3} us/message; R^2 (log time) {:.4}; geometric-mean error {:.1}%",
        points.len(),
        alpha * 1e6,
        1.0 / inv_beta.max(1e-18) / 1e9,
        gamma * 1e9,
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
        // gamma = 5e-11 s/B and o = 0.7 us per extra message.
        let truth = [2e-6, 1e-10, 5e-11, 7e-7];
        let coefs = [
            [2.0, 8.0, 0.0, 0.0],
            [6.0, 1e6, 5e5, 1.0],
            [4.0, 1e7, 0.0, 6.0],
            [10.0, 3e4, 1e4, 0.0],
            [2.0, 1e8, 5e7, 2.0],
            [1.0, 64.0, 0.0, 30.0],
        ];
        let points: Vec<Point> = coefs
            .iter()
            .map(|c| Point {
                coll: Collective::AllReduce,
                algo: "ring",
                bytes: 0,
                seconds: c.iter().zip(&truth).map(|(c, t)| c * t).sum(),
                coef: *c,
            })
            .collect();
        let x = fit(&points, None);
        for (got, want) in x.iter().zip(&truth) {
            assert!((got - want).abs() <= 1e-6 * want, "{x:?}");
        }
        // With gamma fixed at its true value the others come out the same.
        let x = fit(&points, Some(truth[2]));
        for (got, want) in x.iter().zip(&truth) {
            assert!((got - want).abs() <= 1e-6 * want, "{x:?}");
        }
    }
}
