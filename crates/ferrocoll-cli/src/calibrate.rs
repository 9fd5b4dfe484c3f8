//! `ferrocoll calibrate`: measure this machine and fit the cost model.
//!
//! Runs short sweeps of allreduce, allgather and alltoall with every
//! algorithm they have, over sizes from 8 B to `--maxbytes`, then fits the
//! cost model by least squares. The closed forms are linear in (alpha,
//! 1/beta, gamma, o, copy cost, 1/beta and the copy cost beyond the cache):
//! each measurement contributes its algorithm's rounds, bytes on the
//! critical path, bytes reduced, further messages and bytes copied locally
//! (the closed form evaluated with unit parameters), and the fit weighs
//! every point by 1/time² so that a 10 % miss at 8 B counts as much as one
//! at 16 MiB.
//!
//! The copy cost is timed from the copy kernel itself (fitted from
//! collective timings it trades off against beta); gamma is fitted, no
//! lower than the sum kernel's time ([`fit_class`]). The points whose
//! working set (every rank's buffers, [`Shape::working_set`]) exceeds a
//! threshold get a beta and a copy cost of their own, `beta_mem` and
//! `copy_mem`: the threshold is the one, among the gaps between the
//! measured working sets, whose fit leaves the least weighted error (none
//! if no split helps), and the profile keeps the middle of that gap as
//! `cache_bytes`.
//!
//! On one host over shared memory or sockets the forms are those in which
//! both ends of a message copy it ([`Profile::two_sided_copies`], which the
//! profile then keeps); the error of the same fit charging the larger of
//! what a rank sends and receives is printed beside it.
//!
//! Each point is the fastest of `--repeat` timed batches: on a shared
//! machine a descheduled batch only ever adds time. Prints each point's
//! error, R², the geometric-mean error, the same for the simpler models
//! (no copy cost, no cache regime) fitted to the same points, the
//! geometric-mean error and bias per (collective, algorithm) (kept in the
//! profile as `algorithm_errors`), and writes the profile as JSON where the communicator looks for it (or `--out`).

use std::io::{self, Write};
use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use ferrocoll::cost::{self, AlgorithmError, Profile, ProfileFile, Shape};
use ferrocoll::{local, CallOptions, Collective, Communicator, DType, ReduceOp};

use crate::error::CliError;

/// Arguments of `ferrocoll calibrate`.
#[derive(Debug, Args)]
pub struct CalibrateArgs {
    /// Ranks to measure with (default 4; under a launcher, the job's).
    /// Across hosts, the intra-host links are measured on the first host's
    /// ranks and the inter-host links on one rank per host, each class
    /// fitted on its own.
    #[arg(short = 'n', long = "ranks")]
    ranks: Option<usize>,
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
    /// Cores that serve one host's ranks, kept in the profile
    /// (`Profile::cores`): the model gives each rank a share of a core when
    /// an algorithm keeps more ranks moving bytes than there are cores.
    /// Default: the host's online CPUs; 0 leaves the term out.
    #[arg(long)]
    cores: Option<f64>,
}

/// The model's parameters, in the order of [`Point::coef`]: alpha, 1/beta,
/// gamma, per-message overhead o, copy cost, 1/beta beyond the cache, copy
/// cost beyond the cache.
const PARAMS: usize = 7;
/// Index of gamma, of the copy cost, of 1/beta_mem and of the copy cost
/// beyond the cache in [`Point::coef`].
const GAMMA: usize = 2;
const COPY: usize = 4;
const INV_BETA_MEM: usize = 5;
const COPY_MEM: usize = 6;

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
    /// messages, copied bytes, and 0 for the bytes moved and copied beyond
    /// the cache (moved there from indices 1 and 4 by [`split_at`]): the
    /// closed form with unit parameters.
    coef: [f64; PARAMS],
    /// What the coefficients were computed from, to compute them again for
    /// another pipeline piece ([`with_piece`]); `None` keeps `coef`.
    form: Option<Form>,
}

/// The closed form a [`Point`] is explained by.
#[derive(Clone)]
struct Form {
    algo: ferrocoll::Algorithm,
    shape: Shape,
    cores: f64,
    receiver_copies: bool,
    two_sided: bool,
}

/// The pipeline pieces ([`ferrocoll::cost::LinkParams::piece`]) a class is
/// fitted with, the one of least geometric-mean error kept if it beats no
/// piece by [`PIECE_GAIN`]: 0 (no term) and 4 KiB to 128 KiB.
const PIECES: [f64; 7] = [0.0, 4096.0, 8192.0, 16384.0, 32768.0, 65536.0, 131072.0];

/// How much lower (absolute) the geometric-mean error with a piece must be
/// than without one for the piece to be kept: on threads, whose receivers
/// copy once, every piece fitted within 0.1 % of none, and a term that
/// buys nothing should not move predictions.
const PIECE_GAIN: f64 = 0.01;

/// `points` with their coefficients for a pipeline piece of `piece` bytes.
fn with_piece(points: &[Point], piece: f64) -> Vec<Point> {
    points
        .iter()
        .map(|p| {
            let mut q = p.clone();
            if let Some(f) = &p.form {
                if let Some(coef) = coefficients(
                    f.algo,
                    &f.shape,
                    f.cores,
                    f.receiver_copies,
                    f.two_sided,
                    piece,
                ) {
                    q.coef = coef;
                }
            }
            q
        })
        .collect()
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

/// Unit-parameter coefficients of the closed form, on a host of `cores`
/// cores (the per-byte coefficients carry the core share, so the fit finds
/// the speed of a rank with a core of its own), on a transport where only
/// receivers copy or not ([`Profile::receiver_copies`]), where both ends
/// copy or not ([`Profile::two_sided_copies`]), with a pipeline piece of
/// `piece` bytes on both link classes (its bytes join the 1/beta
/// coefficient).
fn coefficients(
    algo: ferrocoll::Algorithm,
    shape: &Shape,
    cores: f64,
    receiver_copies: bool,
    two_sided: bool,
    piece: f64,
) -> Option<[f64; PARAMS]> {
    let huge = 1e300;
    let unit = |alpha, beta, gamma| {
        let mut p = Profile {
            receiver_copies,
            two_sided_copies: two_sided,
            ..Profile::uniform(alpha, beta, gamma).with_cores(cores)
        };
        p.intra.piece = piece;
        p.inter.piece = piece;
        p
    };
    let rounds = cost::predict(algo, shape, &unit(1.0, huge, 0.0))?.latency;
    let bytes = cost::predict(algo, shape, &unit(0.0, 1.0, 0.0))?.bandwidth;
    let reduced = cost::predict(algo, shape, &unit(0.0, huge, 1.0))?.compute;
    let mut unit_o = unit(0.0, huge, 0.0);
    unit_o.intra.overhead = 1.0;
    unit_o.inter.overhead = 1.0;
    let messages = cost::predict(algo, shape, &unit_o)?.latency;
    let mut unit_copy = unit(0.0, huge, 0.0);
    unit_copy.copy = 1.0;
    let copied = cost::predict(algo, shape, &unit_copy)?.compute;
    Some([rounds, bytes, reduced, messages, copied, 0.0, 0.0])
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
/// resident): the floor of the fitted gamma.
///
/// Fitting gamma together with alpha and beta from collective timings with
/// nothing below it can trade gamma for beta (reductions overlap with data
/// movement) down to gamma = 0, and then the model cannot tell an
/// algorithm that reduces every byte (butterfly) from one that reduces a
/// share (ring, halving-doubling); the kernel's time bounds it.
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

/// The points with their bandwidth and copy coefficients moved to
/// 1/beta_mem and the copy cost beyond the cache where the working set
/// exceeds `threshold` bytes.
fn split_at(points: &[Point], threshold: f64) -> Vec<Point> {
    points
        .iter()
        .map(|p| {
            let mut q = p.clone();
            if p.working_set > threshold {
                q.coef[INV_BETA_MEM] = q.coef[1];
                q.coef[1] = 0.0;
                q.coef[COPY_MEM] = q.coef[COPY];
                q.coef[COPY] = 0.0;
            }
            q
        })
        .collect()
}

/// [`fit`], with the copy cost beyond the cache no lower than the copy cost
/// held in `fixed` (a copy out of the cache is not faster than one in it):
/// refitted at that floor when it comes out below.
fn fit_copy_floored(points: &[Point], fixed: [Option<f64>; PARAMS]) -> [f64; PARAMS] {
    let x = fit(points, fixed);
    match fixed[COPY] {
        Some(floor)
            if fixed[COPY_MEM].is_none()
                && x[COPY_MEM] < floor
                && points.iter().any(|p| p.coef[COPY_MEM] != 0.0) =>
        {
            let mut held = fixed;
            held[COPY_MEM] = Some(floor);
            fit(points, held)
        }
        _ => x,
    }
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
/// weighted error, with beta_mem no faster than beta and the copy cost
/// beyond the cache no lower than the one held in `fixed`. Returns the
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
        let x = fit_copy_floored(&split, fixed);
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

/// The fitted parameters of one link class and how well they explain its
/// points.
struct ClassFit {
    /// alpha, 1/beta, gamma, o, copy, 1/beta_mem.
    x: [f64; PARAMS],
    /// The cache's edge (a gap between working sets), if a split helped.
    gap: Option<(f64, f64)>,
    /// The points as fitted (split at the cache's edge).
    points: Vec<Point>,
    /// The simpler models, fitted to the same points.
    plain: [f64; PARAMS],
    with_copy: [f64; PARAMS],
    /// The points without a pipeline piece (the simpler models' fits).
    unpiped: Vec<Point>,
    /// The pipeline piece kept, and the geometric-mean error of the full
    /// fit with each piece of [`PIECES`].
    piece: f64,
    piece_errors: Vec<(f64, f64)>,
    /// The kernel's gamma and the full fit's geometric-mean error with
    /// gamma held at it.
    kernel_gamma: (f64, f64),
    /// Whether gamma was fitted (else held at the kernel's).
    gamma_fitted: bool,
}

/// Fits one link class: the copy cost held at its kernel timing, a cache
/// regime searched for when `cache` is set, and the pipeline piece among
/// [`PIECES`] (the one whose fit leaves the least geometric-mean error).
///
/// gamma is fitted with the others when `fit_gamma` is set, no lower than
/// `gamma` (the kernel's time on cache-resident operands); otherwise, or if
/// the fit goes below it, held at `gamma`. A collective's reduction reads
/// what just arrived (a peer's cache lines, a ring's slots), not operands
/// of its own core's cache: on this project's machine its fitted cost was
/// 2.2-2.3x the kernel's at 2 ranks, and with gamma held at the kernel
/// every allreduce came out 20-35 % under its time from 32 KiB to 256 KiB
/// while the allgathers and alltoalls came out 13-45 % over (bench/RESULTS.md,
/// issue 19). The old note that a free gamma lands on 0 (reductions overlap
/// with the transfers and trade against beta) is what the floor is for.
fn fit_class(points: &[Point], gamma: f64, copy: f64, cache: bool, fit_gamma: bool) -> ClassFit {
    let mut fixed = [None; PARAMS];
    fixed[GAMMA] = Some(gamma);
    fixed[COPY] = Some(0.0);
    let plain = fit(points, fixed);
    fixed[COPY] = Some(copy);
    let with_copy = fit(points, fixed);
    let held = best_piece(points, fixed, cache);
    let kernel_error = held.error;
    let free = fit_gamma.then(|| {
        let mut free = fixed;
        free[GAMMA] = None;
        best_piece(points, free, cache)
    });
    let (chosen, gamma_fitted) = match free {
        Some(tried) if tried.x[GAMMA] >= gamma => (tried, true),
        _ => (held, false),
    };
    ClassFit {
        x: chosen.x,
        gap: chosen.gap,
        points: chosen.points,
        plain,
        with_copy,
        unpiped: points.to_vec(),
        piece: chosen.piece,
        piece_errors: chosen.piece_errors,
        kernel_gamma: (gamma, kernel_error),
        gamma_fitted,
    }
}

/// The full fit with one pipeline piece of [`PIECES`] (and a cache regime
/// when `cache` is set), and its geometric-mean error.
struct Tried {
    error: f64,
    x: [f64; PARAMS],
    gap: Option<(f64, f64)>,
    points: Vec<Point>,
    piece: f64,
    /// The error of the fit with each piece.
    piece_errors: Vec<(f64, f64)>,
}

/// The full fit over every piece of [`PIECES`] with `fixed` held, keeping
/// the one of least geometric-mean error (a piece must beat no piece by
/// [`PIECE_GAIN`]).
fn best_piece(points: &[Point], fixed: [Option<f64>; PARAMS], cache: bool) -> Tried {
    let mut best: Option<Tried> = None;
    let mut piece_errors = Vec::new();
    for piece in PIECES {
        let piped = with_piece(points, piece);
        let (x, gap, split) = if cache {
            fit_with_cache(&piped, fixed)
        } else {
            let x = refit_beta_on_large(&piped, fit(&piped, fixed));
            (x, None, piped)
        };
        let error = quality(&x, &split).0;
        piece_errors.push((piece, error));
        // PIECES starts with 0: a piece must beat no piece by PIECE_GAIN.
        let bar = best.as_ref().map_or(f64::INFINITY, |b| {
            if b.piece == 0.0 {
                b.error - PIECE_GAIN
            } else {
                b.error
            }
        });
        if error < bar {
            best = Some(Tried {
                error,
                x,
                gap,
                points: split,
                piece,
                piece_errors: Vec::new(),
            });
        }
    }
    let mut best = best.expect("PIECES is not empty");
    best.piece_errors = piece_errors;
    best
}

/// Calls from this size on fit the inter-host beta ([`refit_beta_on_large`]):
/// 4x the namespace cluster's token bucket (250 KB at 1 Gbit/s), which a
/// 256 KiB call still partly bursts through.
const LARGE: usize = 1 << 20;

/// `x` with 1/beta refitted on the points of at least [`LARGE`] bytes, the
/// other parameters held. For the inter-host class: on a shaped link a
/// token bucket's burst makes the small calls' times erratic (0.2-0.95 ms
/// for 4 KiB on the namespace cluster's 1 Gbit/s links), and one weighted
/// fit over all sizes traded the large calls' accuracy for them (-26 % at
/// 2 MiB); the latency terms come from all points, the bandwidth from the
/// calls where it dominates. Unchanged when no point is that large.
fn refit_beta_on_large(points: &[Point], x: [f64; PARAMS]) -> [f64; PARAMS] {
    let large: Vec<Point> = points
        .iter()
        .filter(|p| p.bytes >= LARGE)
        .cloned()
        .collect();
    if large.iter().all(|p| p.coef[1] == 0.0) {
        return x;
    }
    let fixed: [Option<f64>; PARAMS] =
        std::array::from_fn(|i| if i == 1 { None } else { Some(x[i]) });
    fit(&large, fixed)
}

/// Every collective of [`CALIBRATED`] with every algorithm, over `sizes`,
/// timed on `comm` (each point the fastest of `repeat` batches on the
/// slowest rank), explained by forms in which both ends of a message copy
/// when `two_sided` ([`Profile::two_sided_copies`]).
fn measure(
    comm: &Communicator,
    sizes: &[usize],
    repeat: u32,
    cores: f64,
    two_sided: bool,
) -> Result<Vec<Point>, ferrocoll::Error> {
    let n = comm.size();
    let elem = DType::F32.size();
    let progress = io::stderr();
    let mut points = Vec::new();
    for coll in CALIBRATED {
        for &algo in coll.algorithms() {
            let c = comm.with_options(CallOptions::algorithm(algo));
            for &bytes in sizes {
                let count = bytes / (elem * blocks(coll, n));
                if count == 0 {
                    continue;
                }
                // Enough calls to fill ~20 ms, at least 3.
                let iters = (2e7 / (bytes as f64 + 2e4)).clamp(3.0, 200.0) as usize;
                let seconds = time_calls(comm, &c, coll, count, iters, repeat)?;
                let mut shape = Shape::new(coll, n, count, elem);
                shape.topology = comm.topology().clone();
                let receiver_copies = comm.receivers_copy(coll);
                if let Some(coef) =
                    coefficients(algo, &shape, cores, receiver_copies, two_sided, 0.0)
                {
                    points.push(Point {
                        coll,
                        algo: algo.name(),
                        bytes: count * elem * blocks(coll, n),
                        seconds,
                        working_set: shape.working_set(),
                        coef,
                        form: Some(Form {
                            algo,
                            shape,
                            cores,
                            receiver_copies,
                            two_sided,
                        }),
                    });
                }
            }
            if comm.rank() == 0 {
                let _ = writeln!(progress.lock(), "calibrate: {coll}/{algo} measured");
            }
        }
    }
    Ok(points)
}

/// Across hosts: the intra-host class measured on the first host's ranks
/// and the inter-host class on one rank per host, the other ranks waiting
/// meanwhile, so that `intra` is what a host's memory gives its ranks and
/// `inter` what one host's link gives. (Hosts of a real cluster have their
/// own CPUs; measuring every host at once on the namespace cluster, whose
/// hosts share this machine's cores, doubled the intra-host error from
/// 1 MiB on.) Returns rank 0's (intra, inter) points; `None` on the other
/// ranks.
#[allow(clippy::type_complexity)]
fn measure_two_classes(
    comm: &Communicator,
    sizes: &[usize],
    repeat: u32,
    cores: f64,
) -> Result<Option<(Vec<Point>, Vec<Point>)>, CliError> {
    let topo = comm.topology();
    let (per_node, nodes) = (topo.local_size(), topo.nodes());
    if per_node * nodes != comm.size() {
        return Err(CliError::Usage(format!(
            "calibrating across hosts needs the same number of ranks on every host \
             (topology {topo})"
        )));
    }
    let (rank, node, local) = (comm.rank(), comm.rank() / per_node, comm.rank() % per_node);
    let mut intra = Vec::new();
    let first_host = comm.split((node == 0).then_some(0), rank as i64)?;
    if let Some(host) = first_host.filter(|_| per_node >= 2) {
        if rank == 0 {
            eprintln!("calibrate: intra-host links ({per_node} ranks of the first host)");
        }
        intra = measure(&host, sizes, repeat, cores, false)?;
    }
    comm.barrier()?;
    let across = comm.split((local == 0).then_some(0), rank as i64)?;
    let mut inter = Vec::new();
    if let Some(across) = across {
        if rank == 0 {
            eprintln!("calibrate: inter-host links (one rank on each of {nodes} hosts)");
        }
        inter = measure(&across, sizes, repeat, cores, false)?;
    }
    comm.barrier()?;
    Ok((rank == 0).then_some((intra, inter)))
}

/// Geometric-mean error of `x` over the points of at least `min_bytes`
/// (`None` when there are none).
fn error_from(x: &[f64; PARAMS], points: &[Point], min_bytes: usize) -> Option<f64> {
    let big: Vec<Point> = points
        .iter()
        .filter(|p| p.bytes >= min_bytes)
        .cloned()
        .collect();
    (!big.is_empty()).then(|| quality(x, &big).0)
}

/// Runs `ferrocoll calibrate`.
pub fn main(args: &CalibrateArgs) -> Result<(), CliError> {
    let mut sizes = vec![];
    let mut b = 8usize;
    while b <= args.maxbytes {
        sizes.push(b);
        b *= 8;
    }
    let in_job = crate::run::in_job();
    let transport = args.transport.as_str();
    let cores = args.cores.unwrap_or_else(|| cost::online_cpus() as f64);
    if !(cores >= 0.0 && cores.is_finite()) {
        return Err(CliError::Usage(format!(
            "--cores {cores}: give the number of cores (0 leaves the core share out)"
        )));
    }
    let n = args.ranks.unwrap_or(4);
    if !in_job && n < 2 {
        return Err(CliError::Usage(
            "--ranks must be at least 2 to measure communication".into(),
        ));
    }
    if transport != "thread" && !in_job {
        return crate::run::relaunch_self(n, transport, "calibration");
    }
    // (intra points, inter points): one class unless the job spans hosts.
    let (transport_name, intra, inter) = if transport == "thread" && !in_job {
        let results = local::run(n, |comm| measure(&comm, &sizes, args.repeat, cores, false))?;
        let mut points = Vec::new();
        for r in results {
            let p = r?;
            if points.is_empty() {
                points = p;
            }
        }
        ("thread", points, Vec::new())
    } else {
        let comm = ferrocoll::init()?;
        if let Some(n) = args.ranks.filter(|&n| n != comm.size()) {
            return Err(CliError::Usage(format!(
                "--ranks {n} but the job has {} ranks",
                comm.size()
            )));
        }
        if comm.size() < 2 {
            return Err(CliError::Usage(
                "the job needs at least 2 ranks to measure communication".into(),
            ));
        }
        let name = comm.transport_name();
        if comm.topology().nodes() > 1 {
            match measure_two_classes(&comm, &sizes, args.repeat, cores)? {
                Some((intra, inter)) => (name, intra, inter),
                None => return Ok(()),
            }
        } else {
            // One host's shared memory or sockets: both ends copy.
            let points = measure(&comm, &sizes, args.repeat, cores, true);
            if comm.rank() != 0 {
                return points.map(|_| ()).map_err(CliError::from);
            }
            (name, points?, Vec::new())
        }
    };
    if intra.is_empty() && inter.is_empty() {
        return Err(CliError::Run("no point could be measured".into()));
    }
    let (gamma, copy) = (measure_gamma(), measure_copy());
    let mut out = io::stdout().lock();
    let mut classes: Vec<(&str, ClassFit)> = Vec::new();
    if !intra.is_empty() {
        let label = if inter.is_empty() {
            "links"
        } else {
            "intra-host"
        };
        classes.push((label, fit_class(&intra, gamma, copy, true, true)));
    }
    // The profile has one gamma: the inter-host class is fitted with the
    // intra-host class's (reductions run on a host's memory either way).
    let gamma = classes.first().map_or(gamma, |(_, f)| f.x[GAMMA]);
    if !inter.is_empty() {
        classes.push(("inter-host", fit_class(&inter, gamma, copy, false, false)));
    }
    let gbs = |inv: f64| 1.0 / inv.max(1e-18) / 1e9;
    let link_of = |f: &ClassFit| ferrocoll::cost::LinkParams {
        alpha: f.x[0],
        beta: 1.0 / f.x[1].max(1e-18),
        overhead: f.x[3],
        piece: f.piece,
    };
    // Whether the points were explained with both ends copying (one host's
    // shared memory or sockets, `measure`'s choice).
    let two_sided = intra
        .iter()
        .chain(&inter)
        .any(|p| p.form.as_ref().is_some_and(|f| f.two_sided));
    for (label, f) in &classes {
        writeln!(out, "# {label}")?;
        report_class(&mut out, f, args.json, gbs)?;
        if two_sided {
            // The same points with every rank charged the larger of what it
            // sends and receives, for comparison.
            let one_sided: Vec<Point> = f
                .unpiped
                .iter()
                .map(|p| {
                    let mut q = p.clone();
                    if let Some(form) = q.form.as_mut() {
                        form.two_sided = false;
                    }
                    q
                })
                .collect();
            let kernel = f.kernel_gamma.0;
            let other = fit_class(&with_piece(&one_sided, 0.0), kernel, copy, true, true);
            writeln!(
                out,
                "# model {:<20} both ends of a message copy (a rank pays half of what it sends plus what it receives); charging the larger of the two instead: geometric-mean error {:.1}%",
                "+ two-sided copies",
                quality(&other.x, &other.points).0 * 100.0
            )?;
        }
    }
    // The profile: one class everywhere, or intra and inter from their own
    // fits (the cache regime is the memory's, so it comes from intra).
    let first = &classes[0].1;
    let mut profile = Profile::uniform(0.0, 1.0, gamma).with_cores(cores);
    profile.receiver_copies = transport_name == "thread";
    profile.two_sided_copies = two_sided;
    profile.copy = copy;
    profile.intra = link_of(first);
    profile.inter = link_of(&classes.last().expect("a class").1);
    if !intra.is_empty() {
        if let Some((below, above)) = first.gap {
            // The data place the cache's edge somewhere in the gap: its
            // geometric middle.
            profile.cache_bytes = (below * above).sqrt();
            profile.beta_mem = 1.0 / first.x[INV_BETA_MEM].max(1e-18);
            profile.copy_mem = first.x[COPY_MEM];
        }
    }
    if !inter.is_empty() {
        // Measured with one rank per host: the host's own link, which its
        // ranks share when they cross together.
        profile.inter_ports = 1.0;
        if intra.is_empty() {
            profile.intra = profile.inter;
        }
    }
    let all: Vec<Point> = classes.iter().flat_map(|(_, f)| f.points.clone()).collect();
    let errors: Vec<(f64, f64)> = classes
        .iter()
        .map(|(_, f)| quality(&f.x, &f.points))
        .collect();
    let geomean_error = errors.iter().map(|e| e.0).fold(0.0, f64::max);
    let r2 = errors.iter().map(|e| e.1).fold(1.0, f64::min);
    for (label, f) in &classes {
        if let Some(e) = error_from(&f.x, &f.points, 1 << 20) {
            writeln!(
                out,
                "# {label}: geometric-mean error at >= 1 MiB {:.1}% ({} points)",
                e * 100.0,
                f.points.iter().filter(|p| p.bytes >= 1 << 20).count()
            )?;
        }
    }
    let algorithm_errors: Vec<AlgorithmError> = classes
        .iter()
        .flat_map(|(label, f)| per_algorithm(label, &f.x, &f.points))
        .collect();
    report_per_algorithm(&mut out, transport_name, &algorithm_errors)?;
    let file = ProfileFile {
        transport: transport_name.into(),
        profile,
        r2,
        geomean_error,
        points: all.len(),
        algorithm_errors,
    };
    let path = match &args.out {
        Some(p) => p.clone(),
        None => Profile::default_path(transport_name).ok_or_else(|| {
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

/// The fit's error per (collective, algorithm) of one link class, in the
/// order measured.
fn per_algorithm(class: &str, x: &[f64; PARAMS], points: &[Point]) -> Vec<AlgorithmError> {
    let mut keys: Vec<(Collective, &'static str)> = Vec::new();
    for p in points {
        if !keys.contains(&(p.coll, p.algo)) {
            keys.push((p.coll, p.algo));
        }
    }
    keys.into_iter()
        .map(|(coll, algo)| {
            let mine: Vec<Point> = points
                .iter()
                .filter(|p| p.coll == coll && p.algo == algo)
                .cloned()
                .collect();
            let log_ratios: Vec<f64> = mine
                .iter()
                .map(|p| (model_time(x, p).max(1e-12) / p.seconds).ln())
                .collect();
            let mean = log_ratios.iter().sum::<f64>() / log_ratios.len() as f64;
            AlgorithmError {
                class: class.to_string(),
                coll: coll.name().to_string(),
                algo: algo.to_string(),
                geomean_error: quality(x, &mine).0,
                bias: mean.exp() - 1.0,
                points: mine.len(),
            }
        })
        .collect()
}

/// Prints the per-algorithm errors: geometric mean and bias (the model
/// high, +, or low, -, on average).
fn report_per_algorithm(
    out: &mut impl Write,
    transport: &str,
    errors: &[AlgorithmError],
) -> Result<(), CliError> {
    writeln!(
        out,
        "# per-algorithm error of the fit ({transport}): {:<11} {:<14} {:<18} {:>9} {:>8} {:>6}",
        "class", "coll", "algo", "geomean", "bias", "points"
    )?;
    for e in errors {
        writeln!(
            out,
            "#   {:<11} {:<14} {:<18} {:>8.1}% {:>+7.1}% {:>6}",
            e.class,
            e.coll,
            e.algo,
            e.geomean_error * 100.0,
            e.bias * 100.0,
            e.points
        )?;
    }
    Ok(())
}

/// Prints one class's points (measured, predicted, error), its models and
/// its fit.
fn report_class(
    out: &mut impl Write,
    f: &ClassFit,
    json: bool,
    gbs: impl Fn(f64) -> f64,
) -> Result<(), CliError> {
    let x = &f.x;
    writeln!(
        out,
        "# {:<14} {:<18} {:>10} {:>12} {:>12} {:>8}",
        "coll", "algo", "bytes", "measured_us", "predicted_us", "error"
    )?;
    for p in &f.points {
        let q = model_time(x, p);
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
        if json {
            writeln!(
                out,
                "{}",
                serde_json::json!({"coll": p.coll.name(), "algo": p.algo, "bytes": p.bytes,
                    "measured_us": p.seconds * 1e6, "predicted_us": q * 1e6})
            )?;
        }
    }
    for (name, y) in [
        ("alpha-beta-gamma-o", &f.plain),
        ("+ copy cost", &f.with_copy),
    ] {
        let (g, r) = quality(y, &f.unpiped);
        writeln!(
            out,
            "# model {name:<20} alpha {:.3} us, beta {:.3} GB/s, overhead {:.3} us/message; R^2 (log time) {r:.4}; geometric-mean error {:.1}%",
            y[0] * 1e6,
            gbs(y[1]),
            y[3] * 1e6,
            g * 100.0
        )?;
    }
    writeln!(
        out,
        "# model {:<20} geometric-mean error by piece: {}; kept {:.0} KiB",
        "+ pipeline piece",
        f.piece_errors
            .iter()
            .map(|(p, e)| format!("{:.0} KiB {:.1}%", p / 1024.0, e * 100.0))
            .collect::<Vec<_>>()
            .join(", "),
        f.piece / 1024.0
    )?;
    let (kernel, kernel_error) = f.kernel_gamma;
    if f.gamma_fitted {
        writeln!(
            out,
            "# model {:<20} gamma {:.4} ns/B, {:.1}x the kernel's {:.4} ns/B (geometric-mean error {:.1}% with the kernel's)",
            "+ fitted gamma",
            x[GAMMA] * 1e9,
            x[GAMMA] / kernel,
            kernel * 1e9,
            kernel_error * 100.0
        )?;
    } else {
        writeln!(
            out,
            "# model {:<20} gamma held at {:.4} ns/B (the kernel's, or the intra-host fit's)",
            "+ fitted gamma",
            kernel * 1e9
        )?;
    }
    match f.gap {
        Some((below, above)) => writeln!(
            out,
            "# model {:<20} beta {:.3} GB/s and copy {:.4} ns/B up to a working set of {:.1}..{:.1} MiB (cache_bytes {:.1} MiB), {:.3} GB/s and {:.4} ns/B beyond",
            "+ cache regime",
            gbs(x[1]),
            x[COPY] * 1e9,
            below / 1048576.0,
            above / 1048576.0,
            (below * above).sqrt() / 1048576.0,
            gbs(x[INV_BETA_MEM]),
            x[COPY_MEM] * 1e9
        )?,
        None => writeln!(out, "# model {:<20} no split of the working sets lowers the error", "+ cache regime")?,
    }
    let (geomean_error, r2) = quality(x, &f.points);
    writeln!(
        out,
        "# fit over {} points: alpha {:.3} us, beta {:.3} GB/s, gamma {:.4} ns/B, copy {:.4} ns/B, overhead {:.3} us/message, piece {:.0} KiB; R^2 (log time) {:.4}; geometric-mean error {:.1}%",
        f.points.len(),
        x[0] * 1e6,
        gbs(x[1]),
        x[GAMMA] * 1e9,
        x[COPY] * 1e9,
        x[3] * 1e6,
        f.piece / 1024.0,
        r2,
        geomean_error * 100.0
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
        // 2e-11 s/B, 1/beta_mem = 4e-10 s/B and a copy cost of 9e-11 s/B
        // beyond the cache.
        let truth = [2e-6, 1e-10, 5e-11, 7e-7, 2e-11, 4e-10, 9e-11];
        let coefs = [
            [2.0, 8.0, 0.0, 0.0, 0.0, 0.0, 0.0],
            [6.0, 1e6, 5e5, 1.0, 0.0, 0.0, 0.0],
            [4.0, 1e7, 0.0, 6.0, 2e6, 0.0, 0.0],
            [10.0, 3e4, 1e4, 0.0, 1e4, 0.0, 0.0],
            [2.0, 1e8, 5e7, 2.0, 0.0, 0.0, 0.0],
            [1.0, 64.0, 0.0, 30.0, 64.0, 0.0, 0.0],
            [3.0, 0.0, 1e7, 2.0, 0.0, 3e7, 1e7],
            [8.0, 0.0, 0.0, 0.0, 0.0, 5e7, 0.0],
            [5.0, 0.0, 2e7, 0.0, 0.0, 4e7, 3e7],
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
                form: None,
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
                    coef: [rounds, bytes * rounds, 0.0, 0.0, 0.0, 0.0, 0.0],
                    form: None,
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

    /// Points of ring and butterfly allreduce, ring allgather and direct
    /// alltoall on 4 ranks from 64 B to 8 MiB, timed by the model itself
    /// with `truth`.
    fn model_points(truth: &Profile) -> Vec<Point> {
        let mut points = Vec::new();
        for (coll, algo) in [
            (Collective::AllReduce, ferrocoll::Algorithm::Ring),
            (Collective::AllReduce, ferrocoll::Algorithm::Butterfly),
            (Collective::AllGather, ferrocoll::Algorithm::Ring),
            (Collective::AllToAll, ferrocoll::Algorithm::Direct),
        ] {
            for bytes in [64usize, 4096, 16384, 65536, 1 << 20, 1 << 23] {
                let shape = Shape::new(coll, 4, bytes / 4, 4);
                let seconds = cost::predict(algo, &shape, truth).unwrap().total();
                let form = Form {
                    algo,
                    shape: shape.clone(),
                    cores: 0.0,
                    receiver_copies: false,
                    two_sided: false,
                };
                points.push(Point {
                    coll,
                    algo: algo.name(),
                    bytes,
                    seconds,
                    working_set: shape.working_set(),
                    coef: coefficients(algo, &shape, 0.0, false, false, 0.0).unwrap(),
                    form: Some(form),
                });
            }
        }
        points
    }

    /// Points timed by the model itself with a 16 KiB piece: the search
    /// keeps that piece, and the fit finds the parameters back.
    #[test]
    fn the_pipeline_piece_is_found_among_the_candidates() {
        let mut truth = Profile::uniform(2e-6, 1e10, 3e-11);
        truth.intra.piece = 16384.0;
        truth.inter.piece = 16384.0;
        truth.copy = 2e-11;
        let points = model_points(&truth);
        let f = fit_class(&points, 3e-11, 2e-11, false, false);
        assert_eq!(f.piece, 16384.0, "{:?}", f.piece_errors);
        assert!((f.x[0] / 2e-6 - 1.0).abs() < 1e-6, "alpha {}", f.x[0]);
        assert!((f.x[1] / 1e-10 - 1.0).abs() < 1e-6, "1/beta {}", f.x[1]);
        let without = f.piece_errors.iter().find(|(p, _)| *p == 0.0).unwrap().1;
        assert!(without > 0.01, "no piece fits too: {without}");
    }

    /// gamma is fitted when the reductions cost more than the kernel
    /// timing says, and held at the kernel's when the fit would go below it.
    #[test]
    fn gamma_is_fitted_no_lower_than_the_kernel() {
        let mut truth = Profile::uniform(2e-6, 1e10, 7e-11);
        truth.copy = 2e-11;
        let points = model_points(&truth);
        let f = fit_class(&points, 3e-11, 2e-11, false, true);
        assert!(f.gamma_fitted);
        assert!(
            (f.x[GAMMA] / 7e-11 - 1.0).abs() < 1e-6,
            "gamma {}",
            f.x[GAMMA]
        );
        assert!(quality(&f.x, &f.points).0 < 1e-6);
        assert!(
            f.kernel_gamma.1 > 0.01,
            "the kernel's gamma fits too: {:?}",
            f.kernel_gamma
        );
        // Not asked to: the kernel's gamma, whatever the points say.
        let held = fit_class(&points, 3e-11, 2e-11, false, false);
        assert!(!held.gamma_fitted);
        assert_eq!(held.x[GAMMA], 3e-11);
        // Reductions cheaper than the kernel: held at the kernel's.
        let cheap = model_points(&Profile {
            copy: 2e-11,
            ..Profile::uniform(2e-6, 1e10, 1e-11)
        });
        let f = fit_class(&cheap, 3e-11, 2e-11, false, true);
        assert!(!f.gamma_fitted);
        assert_eq!(f.x[GAMMA], 3e-11);
    }
}
