//! PowerSGD ([`PowerSgd`]).

use super::rng::{key, SplitMix64};
use super::ErrorFeedback;
use crate::error::{Error, Result};

/// Parameters of a [`PowerSgd`] state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PowerSgdConfig {
    /// Rank `r` of the approximation (torch's `matrix_approximation_rank`);
    /// at least 1, capped at `min(rows, cols)`.
    pub rank: usize,
    /// The matrix shape `(rows, cols)`, with `rows * cols` equal to the
    /// buffer's length; `None` picks the squarest shape that holds it.
    pub shape: Option<(usize, usize)>,
    /// Seed of the initial Q (the same on every rank).
    pub seed: u64,
    /// Start each step's power iteration from the previous step's Q
    /// (torch's `warm_start`); otherwise Q is drawn afresh every step.
    pub warm_start: bool,
    /// Carry each step's compression error into the next
    /// (torch's `use_error_feedback`).
    pub error_feedback: bool,
}

impl Default for PowerSgdConfig {
    /// Rank 1, automatic shape, seed 0, warm start and error feedback on
    /// (torch's defaults).
    fn default() -> PowerSgdConfig {
        PowerSgdConfig {
            rank: 1,
            shape: None,
            seed: 0,
            warm_start: true,
            error_feedback: true,
        }
    }
}

/// Where a [`PowerSgd`] step is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Between steps: [`PowerSgd::compress_p`] comes next.
    Idle,
    /// P was handed out for its allreduce.
    AwaitP,
    /// Q was handed out for its allreduce.
    AwaitQ,
}

/// PowerSGD (Vogels, Karimireddy and Jaggi 2019): a rank-`r` approximation
/// of the gradient as a matrix, found by one step of power iteration per
/// training step, warm-started from the previous step's result.
///
/// It is not a [`super::Codec`]: the approximation of the *sum* over ranks
/// needs two allreduces with local work between them, so it is a state
/// object driven in three steps (what a collective will run as one plan):
///
/// ```text
/// let p = state.compress_p(grad)?;    // M = grad + residual;  P = M Q     (rows x r)
/// all_reduce(p, Sum);                 //                       P = sum P
/// let q = state.after_p_allreduce()?; // P = orth(P);          Q = M^T P   (cols x r)
/// all_reduce(q, Sum);                 //                       Q = sum Q
/// state.decompress(out)?;             // out = P Q^T = P P^T sum M;  residual = M - P P^T M
/// ```
///
/// `out` is the approximation of the **sum** of the ranks' (compensated)
/// gradients, as an allreduce with `Sum` would give; divide by the group
/// size for the mean. `rows x cols` floats become `(rows + cols) r` on the
/// wire (P and Q in `f32`, summed in `f32` by the ordinary allreduce).
///
/// The buffer is a `rows x cols` matrix in row-major order: the shape given
/// in [`PowerSgdConfig::shape`] (a tensor's own shape, `rows * cols` equal to
/// its length) or, by default, the squarest one that holds it, `rows =
/// ceil(sqrt(n))`, `cols = ceil(n / rows)`, zero-padded at the end (fewer
/// than `rows` padding elements). The rank is capped at `min(rows, cols)`.
///
/// Every rank must get bitwise the same P and Q from the two allreduces (the
/// orthogonalisation runs on each rank and must agree) and start from the
/// same seed; then P, Q and the warm start agree on every rank without any
/// other exchange.
///
/// # Differences from torch's `powerSGD_hook`
///
/// * The residual is each rank's own compression error, `M_i - P P^T M_i`;
///   torch keeps `M_i - P P^T mean(M)`. Summed over ranks the two agree;
///   this one makes each rank's "sent + kept = given" hold on its own.
/// * Q is drawn uniformly in `[-1, 1)` from SplitMix64 (torch: `randn` from
///   a seeded generator); a Q column that became zero (a zero gradient) is
///   drawn again, so the approximation does not lose rank for good.
/// * In Gram-Schmidt, a column whose norm falls below `1e-5` of its norm
///   before orthogonalisation (numerically dependent on the previous ones)
///   is set to zero rather than normalised round-off.
#[derive(Clone, Debug)]
pub struct PowerSgd {
    config: PowerSgdConfig,
    len: usize,
    rows: usize,
    cols: usize,
    rank: usize,
    /// The compensated gradient as a `rows x cols` row-major matrix (zero
    /// padding after `len`).
    m: Vec<f32>,
    /// `rows x rank`, column-major: column `j` is `p[j*rows..(j+1)*rows]`.
    p: Vec<f32>,
    /// `cols x rank`, column-major; after a step, the summed Q (the warm
    /// start of the next).
    q: Vec<f32>,
    /// This rank's own Q of the current step, before its allreduce (for the
    /// residual).
    q_local: Vec<f32>,
    feedback: ErrorFeedback,
    /// One row of an approximation.
    row: Vec<f32>,
    step: u64,
    phase: Phase,
}

impl PowerSgd {
    /// A state for a buffer of `len` elements.
    pub fn new(len: usize, config: PowerSgdConfig) -> Result<PowerSgd> {
        if config.rank == 0 {
            return Err(Error::invalid("powersgd: the rank must be at least 1"));
        }
        let (rows, cols) = match config.shape {
            Some((rows, cols)) if rows.checked_mul(cols) == Some(len) => (rows, cols),
            Some((rows, cols)) => {
                return Err(Error::invalid(format!(
                    "powersgd: a {rows} x {cols} matrix does not hold a buffer of {len} elements \
                     exactly; give its shape, or none to have one chosen"
                )))
            }
            None => squarest(len),
        };
        let rank = config.rank.min(rows).min(cols);
        let mut state = PowerSgd {
            config,
            len,
            rows,
            cols,
            rank,
            m: vec![0.0; rows * cols],
            p: vec![0.0; rows * rank],
            q: vec![0.0; cols * rank],
            q_local: vec![0.0; cols * rank],
            feedback: ErrorFeedback::new(if config.error_feedback { len } else { 0 }),
            row: vec![0.0; cols],
            step: 0,
            phase: Phase::Idle,
        };
        for j in 0..rank {
            state.draw_q_column(j);
        }
        Ok(state)
    }

    /// The parameters it was made with.
    pub fn config(&self) -> &PowerSgdConfig {
        &self.config
    }

    /// Elements of the buffer.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The matrix shape `(rows, cols)`.
    pub fn shape(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    /// The rank in use (the configured one, capped at `min(rows, cols)`).
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Elements of P, the first allreduce (`rows * rank`).
    pub fn p_len(&self) -> usize {
        self.p.len()
    }

    /// Elements of Q, the second allreduce (`cols * rank`).
    pub fn q_len(&self) -> usize {
        self.q.len()
    }

    /// Compression ratio: buffer elements over the elements both allreduces
    /// move (`len / ((rows + cols) rank)`); 1 for an empty buffer.
    pub fn ratio(&self) -> f64 {
        match self.p_len() + self.q_len() {
            0 => 1.0,
            wire => self.len as f64 / wire as f64,
        }
    }

    /// Completed steps.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// The residual carried into the next step (empty without error
    /// feedback).
    pub fn residual(&self) -> &[f32] {
        self.feedback.residual()
    }

    /// Forgets the residual and the warm start (Q is drawn again from the
    /// seed), as after a change of model.
    pub fn reset(&mut self) {
        self.feedback.reset();
        self.step = 0;
        self.phase = Phase::Idle;
        for j in 0..self.rank {
            self.draw_q_column(j);
        }
    }

    /// Step 1: `M = grad + residual`, `P = M Q`. Returns P (`rows x rank`,
    /// column-major) for the caller to allreduce with `Sum` in place.
    /// Calling it again before the step is finished starts the step over.
    pub fn compress_p(&mut self, grad: &[f32]) -> Result<&mut [f32]> {
        if grad.len() != self.len {
            return Err(Error::invalid(format!(
                "powersgd: the state was made for {} elements and was given {}",
                self.len,
                grad.len()
            )));
        }
        let (m, padding) = self.m.split_at_mut(self.len);
        if self.config.error_feedback {
            self.feedback.compensate_at(0, grad, m)?;
        } else {
            m.copy_from_slice(grad);
        }
        padding.fill(0.0);
        for j in 0..self.rank {
            let column = &self.q[j * self.cols..(j + 1) * self.cols];
            if !self.config.warm_start || column.iter().all(|&v| v == 0.0) {
                self.draw_q_column(j);
            }
        }
        for (i, row) in self.m.chunks_exact(self.cols.max(1)).enumerate() {
            for j in 0..self.rank {
                self.p[j * self.rows + i] = dot(row, &self.q[j * self.cols..(j + 1) * self.cols]);
            }
        }
        self.phase = Phase::AwaitP;
        Ok(&mut self.p)
    }

    /// Step 2, once P holds the sum over ranks: orthonormalises P's columns
    /// (modified Gram-Schmidt) and computes `Q = M^T P`. Returns Q (`cols x
    /// rank`, column-major) for the caller to allreduce with `Sum` in
    /// place.
    pub fn after_p_allreduce(&mut self) -> Result<&mut [f32]> {
        self.expect(Phase::AwaitP, "after_p_allreduce", "compress_p")?;
        orthonormalise(&mut self.p, self.rows);
        self.q.fill(0.0);
        for (i, row) in self.m.chunks_exact(self.cols.max(1)).enumerate() {
            for j in 0..self.rank {
                let pij = self.p[j * self.rows + i];
                axpy(&mut self.q[j * self.cols..(j + 1) * self.cols], pij, row);
            }
        }
        self.q_local.copy_from_slice(&self.q);
        self.phase = Phase::AwaitQ;
        Ok(&mut self.q)
    }

    /// Step 3, once Q holds the sum over ranks: writes `P Q^T`, the rank-r
    /// approximation of the sum of the ranks' compensated gradients, into
    /// `out` (the buffer's length) and keeps this rank's own error as the
    /// residual. Q stays as the next step's warm start.
    pub fn decompress(&mut self, out: &mut [f32]) -> Result<()> {
        self.expect(Phase::AwaitQ, "decompress", "after_p_allreduce")?;
        if out.len() != self.len {
            return Err(Error::invalid(format!(
                "powersgd: decompress into {} elements; the buffer has {}",
                out.len(),
                self.len
            )));
        }
        for (i, out) in out.chunks_mut(self.cols.max(1)).enumerate() {
            approximate_row(&mut self.row, &self.p, self.rows, &self.q, i);
            out.copy_from_slice(&self.row[..out.len()]);
        }
        if self.config.error_feedback {
            for i in 0..self.rows {
                let start = i * self.cols;
                let end = (start + self.cols).min(self.len);
                if start >= end {
                    break;
                }
                approximate_row(&mut self.row, &self.p, self.rows, &self.q_local, i);
                self.feedback
                    .record_at(start, &self.m[start..end], &self.row[..end - start])?;
            }
        }
        self.step += 1;
        self.phase = Phase::Idle;
        Ok(())
    }

    fn expect(&self, phase: Phase, call: &str, before: &str) -> Result<()> {
        if self.phase == phase {
            Ok(())
        } else {
            Err(Error::invalid(format!(
                "powersgd: {call} must follow {before} (and the allreduce of what it returned)"
            )))
        }
    }

    /// Fills column `j` of Q from the seed, the step and `j`: the same on
    /// every rank.
    fn draw_q_column(&mut self, j: usize) {
        let mut rng = SplitMix64::new(key(self.config.seed, &[self.step, j as u64]));
        self.q[j * self.cols..(j + 1) * self.cols]
            .iter_mut()
            .for_each(|v| *v = rng.symmetric_f32());
    }
}

/// The squarest `rows x cols` with `rows * cols >= len`: `rows =
/// ceil(sqrt(len))`, padding fewer than `rows` elements.
fn squarest(len: usize) -> (usize, usize) {
    if len == 0 {
        return (0, 0);
    }
    let mut rows = (len as f64).sqrt() as usize;
    // Correct the float square root to the exact ceiling.
    while rows * rows < len {
        rows += 1;
    }
    while rows > 1 && (rows - 1) * (rows - 1) >= len {
        rows -= 1;
    }
    (rows, len.div_ceil(rows))
}

/// Row `i` of `P Q^T` into `row` (`P` column-major with `rows` rows, `Q`
/// column-major with `row.len()` rows).
fn approximate_row(row: &mut [f32], p: &[f32], rows: usize, q: &[f32], i: usize) {
    let cols = row.len();
    row.fill(0.0);
    for (j, q) in q.chunks_exact(cols.max(1)).enumerate() {
        axpy(row, p[j * rows + i], q);
    }
}

/// Modified Gram-Schmidt on the columns (length `rows`) of `p`.
fn orthonormalise(p: &mut [f32], rows: usize) {
    for j in 0..p.len() / rows.max(1) {
        let (done, rest) = p.split_at_mut(j * rows);
        let column = &mut rest[..rows];
        let before = dot(column, column).sqrt();
        for prev in done.chunks_exact(rows) {
            let d = dot(prev, column);
            axpy(column, -d, prev);
        }
        let norm = dot(column, column).sqrt();
        if norm > before * 1e-5 {
            let inv = 1.0 / norm;
            column.iter_mut().for_each(|v| *v *= inv);
        } else if norm.is_finite() {
            // Zero, or dependent on the previous columns up to round-off.
            column.fill(0.0);
        }
        // A NaN norm (a non-finite gradient) leaves NaN in the column, so
        // the output shows it.
    }
}

/// `sum a[i] b[i]` in eight independent lanes (a fixed order, so the same
/// on every rank, and one that vectorises).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = a8
        .remainder()
        .iter()
        .zip(b8.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in a8.zip(b8) {
        for k in 0..8 {
            lanes[k] += x[k] * y[k];
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// `y += a x`.
fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    y.iter_mut().zip(x).for_each(|(y, x)| *y += a * *x);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs one step of `ranks` states on their gradients, summing P and Q
    /// as the allreduces would; returns the output (the same on every
    /// rank).
    fn step(states: &mut [PowerSgd], grads: &[Vec<f32>]) -> Vec<f32> {
        let mut p_sum = vec![0f32; states[0].p_len()];
        for (s, g) in states.iter_mut().zip(grads) {
            axpy(&mut p_sum, 1.0, s.compress_p(g).unwrap());
        }
        let mut q_sum = vec![0f32; states[0].q_len()];
        for s in states.iter_mut() {
            s.p.copy_from_slice(&p_sum);
            axpy(&mut q_sum, 1.0, s.after_p_allreduce().unwrap());
        }
        let mut outs = Vec::new();
        for s in states.iter_mut() {
            s.q.copy_from_slice(&q_sum);
            let mut out = vec![0f32; s.len()];
            s.decompress(&mut out).unwrap();
            outs.push(out);
        }
        assert!(outs.windows(2).all(|w| w[0] == w[1]), "ranks disagree");
        outs.pop().unwrap()
    }

    fn random(seed: u64, len: usize) -> Vec<f32> {
        let mut rng = SplitMix64::new(seed);
        (0..len).map(|_| rng.symmetric_f32()).collect()
    }

    /// `A B^T` (row-major `rows x cols`) for `A` `rows x r` and `B` `cols x
    /// r`, both row-major.
    fn product(a: &[f32], b: &[f32], rows: usize, cols: usize, r: usize) -> Vec<f32> {
        let mut m = vec![0f32; rows * cols];
        for i in 0..rows {
            for c in 0..cols {
                m[i * cols + c] = (0..r).map(|k| a[i * r + k] * b[c * r + k]).sum();
            }
        }
        m
    }

    fn max_diff(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
    }

    fn config(rank: usize, shape: Option<(usize, usize)>) -> PowerSgdConfig {
        PowerSgdConfig {
            rank,
            shape,
            seed: 5,
            ..PowerSgdConfig::default()
        }
    }

    #[test]
    fn a_rank_r_sum_is_reproduced_exactly_before_and_after_a_warm_start() {
        // Three ranks whose gradients share a rank-3 column space: the sum
        // has rank 3, and rank-3 PowerSGD must reproduce it.
        let (rows, cols, r) = (40, 30, 3);
        let a = random(1, rows * r);
        let mut states: Vec<PowerSgd> = (0..3)
            .map(|_| PowerSgd::new(rows * cols, config(r, Some((rows, cols)))).unwrap())
            .collect();
        for round in 0..3u64 {
            let grads: Vec<Vec<f32>> = (0..3)
                .map(|k| product(&a, &random(10 * round + k + 2, cols * r), rows, cols, r))
                .collect();
            let sum: Vec<f32> = (0..rows * cols)
                .map(|i| grads.iter().map(|g| g[i]).sum())
                .collect();
            let out = step(&mut states, &grads);
            let scale = sum.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!(max_diff(&out, &sum) <= 1e-4 * scale, "round {round}");
            // Nothing was lost, so nothing is carried.
            for s in &states {
                assert!(s.residual().iter().all(|e| e.abs() <= 1e-4 * scale));
            }
        }
        assert_eq!(states[0].step(), 3);
    }

    #[test]
    fn warm_start_converges_to_the_best_rank_r_approximation() {
        // M = U diag(s) V^T with orthonormal U, V and a known spectrum: the
        // best rank-2 error (Frobenius) is sqrt(sum of the other s^2). Each
        // warm-started step is one more power iteration on the same M.
        let (n, r) = (32, 2);
        let mut u = random(3, n * n);
        let mut v = random(4, n * n);
        orthonormalise(&mut u, n);
        orthonormalise(&mut v, n);
        let s: Vec<f32> = (0..n).map(|i| 0.6f32.powi(i as i32)).collect();
        let mut m = vec![0f32; n * n];
        for i in 0..n {
            for j in 0..n {
                m[i * n + j] = (0..n).map(|k| u[k * n + i] * s[k] * v[k * n + j]).sum();
            }
        }
        let best = s[r..].iter().map(|x| x * x).sum::<f32>().sqrt();
        let error = |out: &[f32]| {
            out.iter()
                .zip(&m)
                .map(|(a, b)| (a - b) * (a - b))
                .sum::<f32>()
                .sqrt()
        };
        let run = |warm_start: bool| {
            let cfg = PowerSgdConfig {
                warm_start,
                error_feedback: false,
                ..config(r, Some((n, n)))
            };
            let mut states = vec![PowerSgd::new(n * n, cfg).unwrap()];
            let mut out = Vec::new();
            for _ in 0..12 {
                out = step(&mut states, &[m.clone()]);
            }
            error(&out)
        };
        let warm = run(true);
        let cold = run(false);
        assert!(warm <= best * 1.01, "warm {warm} vs best {best}");
        assert!(cold > warm * 1.05, "cold {cold} vs warm {warm}");
    }

    #[test]
    fn what_was_sent_plus_what_is_kept_is_what_was_given() {
        // One rank: the output is exactly this rank's contribution.
        let len = 1000;
        let mut states = vec![PowerSgd::new(len, config(2, None)).unwrap()];
        assert_eq!(states[0].shape(), (32, 32));
        let mut given = vec![0f64; len];
        let mut sent = vec![0f64; len];
        for t in 0..50 {
            let g = random(100 + t, len);
            let out = step(&mut states, std::slice::from_ref(&g));
            given.iter_mut().zip(&g).for_each(|(s, &x)| *s += x as f64);
            sent.iter_mut().zip(&out).for_each(|(s, &x)| *s += x as f64);
        }
        for i in 0..len {
            let err = sent[i] + states[0].residual()[i] as f64 - given[i];
            assert!(err.abs() < 1e-3, "element {i}: {err}");
        }
    }

    #[test]
    fn shapes_ranks_and_ratios() {
        assert_eq!(squarest(10), (4, 3));
        assert_eq!(squarest(16), (4, 4));
        assert_eq!(squarest(17), (5, 4));
        assert_eq!(squarest(1), (1, 1));
        assert_eq!(squarest(0), (0, 0));
        for len in 1..2000 {
            let (r, c) = squarest(len);
            assert!(r * c >= len && r * c - len < r, "{len}: {r} x {c}");
        }
        let s = PowerSgd::new(4096 * 4096, config(4, Some((4096, 4096)))).unwrap();
        assert_eq!((s.p_len(), s.q_len()), (4096 * 4, 4096 * 4));
        assert_eq!(s.ratio(), 512.0);
        // The rank is capped by the shape.
        let s = PowerSgd::new(6, config(4, Some((2, 3)))).unwrap();
        assert_eq!(s.rank(), 2);
        assert!(PowerSgd::new(6, config(0, None)).is_err());
        assert!(PowerSgd::new(6, config(1, Some((4, 2)))).is_err());
    }

    #[test]
    fn an_empty_buffer_and_a_tiny_one() {
        let mut states = vec![PowerSgd::new(0, config(4, None)).unwrap()];
        assert!(step(&mut states, &[vec![]]).is_empty());
        assert_eq!(states[0].ratio(), 1.0);
        // One element: rank 1, a 1 x 1 matrix, reproduced exactly.
        let mut states = vec![PowerSgd::new(1, config(4, None)).unwrap()];
        let out = step(&mut states, &[vec![-2.5]]);
        assert!((out[0] + 2.5).abs() < 1e-6, "{out:?}");
    }

    #[test]
    fn a_zero_gradient_does_not_cost_rank_for_good() {
        let (rows, cols) = (20, 10);
        let mut states = vec![PowerSgd::new(rows * cols, config(1, Some((rows, cols)))).unwrap()];
        let out = step(&mut states, &[vec![0.0; rows * cols]]);
        assert!(out.iter().all(|&v| v == 0.0));
        let g = product(&random(7, rows), &random(8, cols), rows, cols, 1);
        let out = step(&mut states, std::slice::from_ref(&g));
        assert!(max_diff(&out, &g) < 1e-5, "{}", max_diff(&out, &g));
    }

    #[test]
    fn a_non_finite_gradient_shows_in_the_output_and_is_not_carried() {
        let mut states = vec![PowerSgd::new(100, config(2, None)).unwrap()];
        let mut g = random(9, 100);
        g[17] = f32::INFINITY;
        let out = step(&mut states, &[g]);
        assert!(out.iter().any(|v| !v.is_finite()));
        assert!(states[0].residual().iter().all(|e| e.is_finite()));
    }

    #[test]
    fn steps_out_of_order_are_errors() {
        let mut s = PowerSgd::new(100, config(2, None)).unwrap();
        let mut out = vec![0f32; 100];
        assert!(s.after_p_allreduce().is_err());
        assert!(s.decompress(&mut out).is_err());
        assert!(s.compress_p(&[0.0; 99]).is_err());
        s.compress_p(&[1.0; 100]).unwrap();
        assert!(s.decompress(&mut out).is_err());
        // compress_p again starts the step over.
        s.compress_p(&[1.0; 100]).unwrap();
        s.after_p_allreduce().unwrap();
        assert!(s.after_p_allreduce().is_err());
        assert!(s.decompress(&mut out[..50]).is_err());
        s.decompress(&mut out).unwrap();
        assert!(s.decompress(&mut out).is_err());
        s.reset();
        assert_eq!(s.step(), 0);
    }
}
