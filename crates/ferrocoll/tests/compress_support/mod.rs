//! The local reference for the compressed collectives
//! (`ferrocoll::compress::Compressor`), shared by tests/compress_collective.rs
//! (ranks as threads) and ferrocoll-cli's tests/compress_processes.rs
//! (ranks as processes).
//!
//! Every rank's input at every step is a pure function of (rank, step,
//! length), so each rank computes the whole group's reference without
//! communicating: a simulation of every rank's error-feedback state and
//! every message, built from the codecs and `ErrorFeedback` alone (not from
//! the collectives), encoding, decoding and adding in the order the
//! algorithms document: chunk by chunk, zero plus each rank's decoded
//! version in rank order, in `f32`. The quantizers and Top-k must match it
//! bitwise; Random-k and PowerSGD, whose sums are the library allreduce's
//! (in the order of whatever algorithm it chose), within a bound of that
//! order's rounding.

#![allow(dead_code)] // each test crate uses its own subset

use ferrocoll::compress::collective::chunk_ranges;
use ferrocoll::compress::{
    self, Codec, CompressOptions, Compressor, ErrorFeedback, Keep, PowerSgd, PowerSgdConfig, RandK,
};
use ferrocoll::{Communicator, ReduceOp};

/// Every codec the collectives are checked with, in `Compressor::new`'s
/// spellings.
pub const SPECS: &[&str] = &[
    "fp16",
    "bf16",
    "int8:64",
    "int8:128",
    "onebit:64",
    "topk:0.05",
    "topk:3",
    "randk:0.1:7",
    "randk:5:7:unscaled",
    "powersgd:2",
];

/// Buffer lengths: empty, shorter than a block, uneven among any group,
/// a block edge, and several blocks with a short last one.
pub const LENS: &[usize] = &[0, 1, 7, 64, 130, 1000];

/// Rank `rank`'s input at `step`: both signs, a spread of magnitudes, a
/// few large elements (so Top-k has something to choose).
pub fn input(rank: usize, step: u64, len: usize) -> Vec<f32> {
    let mut x = (rank as u64 + 1)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(step.wrapping_mul(0xbf58_476d_1ce4_e5b9))
        | 1;
    (0..len)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let unit = (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            unit * if i % 17 == 3 {
                20.0
            } else {
                1.0 + (i % 5) as f32
            }
        })
        .collect()
}

/// What the reference promises about a result.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Exactness {
    /// Bitwise equal.
    Exact,
    /// Within `tolerance[i]` of the reference, element by element.
    Bounded,
}

/// The group's result at every step, with how closely the collective must
/// match it.
pub struct Reference {
    pub exactness: Exactness,
    /// `steps` results of `len` elements.
    pub results: Vec<Vec<f32>>,
    /// Per step and element, the allowed difference (zero when exact).
    pub tolerance: Vec<Vec<f32>>,
}

/// Random-k from a test spec (`randk:K:SEED[:unscaled]`).
pub fn randk_of(spec: &str) -> RandK {
    let parts: Vec<&str> = spec.split(':').collect();
    let keep = if parts[1].contains('.') {
        Keep::Fraction(parts[1].parse().unwrap())
    } else {
        Keep::Count(parts[1].parse().unwrap())
    };
    let codec = RandK::new(keep, parts[2].parse().unwrap()).unwrap();
    if parts.get(3) == Some(&"unscaled") {
        codec.unscaled()
    } else {
        codec
    }
}

fn divide(op: ReduceOp, n: usize, v: &mut [f32]) {
    if op == ReduceOp::Avg && n > 1 {
        v.iter_mut().for_each(|x| *x /= n as f32);
    }
}

/// Encodes `x` with `codec`, through `ef` when there is one
/// (`offset` is the chunk's place in the buffer).
fn encode(codec: &dyn Codec, ef: Option<&mut ErrorFeedback>, offset: usize, x: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; codec.encoded_len(x.len())];
    match ef {
        Some(ef) => ef.compress_at(offset, x, codec, &mut out).unwrap(),
        None => codec.encode(x, &mut out).unwrap(),
    }
    out
}

/// The reference of `steps` compressed allreduces of `len` elements among
/// `n` ranks (error feedback as `Compressor::new` sets it, unless
/// `feedback` says otherwise).
pub fn all_reduce(
    spec: &str,
    n: usize,
    len: usize,
    steps: u64,
    op: ReduceOp,
    feedback: Option<bool>,
) -> Reference {
    all_reduce_of(spec, n, len, steps, op, feedback, &|p, step| {
        input(p, step, len)
    })
}

/// Rank `p`'s input at a step.
pub type Inputs<'a> = &'a dyn Fn(usize, u64) -> Vec<f32>;

/// [`all_reduce`] of the inputs `x` gives.
pub fn all_reduce_of(
    spec: &str,
    n: usize,
    len: usize,
    steps: u64,
    op: ReduceOp,
    feedback: Option<bool>,
    x: Inputs<'_>,
) -> Reference {
    let inputs = |n: usize, step: u64, _len: usize| -> Vec<Vec<f32>> {
        (0..n).map(|p| x(p, step)).collect()
    };
    let kind = spec.split(':').next().unwrap();
    let mut results = Vec::new();
    let mut tolerance = Vec::new();
    let exactness = match kind {
        "randk" | "powersgd" => Exactness::Bounded,
        _ => Exactness::Exact,
    };
    match kind {
        "randk" => {
            let base = randk_of(spec);
            let on = feedback.unwrap_or(!base.rescales());
            let mut efs: Vec<ErrorFeedback> = (0..n).map(|_| ErrorFeedback::new(len)).collect();
            for step in 0..steps {
                let codec = base.at_step(step);
                let encoded: Vec<Vec<u8>> = inputs(n, step, len)
                    .iter()
                    .zip(&mut efs)
                    .map(|(x, ef)| encode(&codec, on.then_some(ef), 0, x))
                    .collect();
                let k = encoded[0].len() / 4;
                let value = |p: usize, j: usize| {
                    let b = &encoded[p][4 * j..4 * j + 4];
                    f32::from_le_bytes([b[0], b[1], b[2], b[3]])
                };
                let mut sum = vec![0f32; k];
                let mut mag = vec![0f32; k];
                for p in 0..n {
                    for j in 0..k {
                        sum[j] += value(p, j);
                        mag[j] += value(p, j).abs();
                    }
                }
                divide(op, n, &mut sum);
                let bytes: Vec<u8> = sum.iter().flat_map(|v| v.to_le_bytes()).collect();
                let mut out = vec![0f32; len];
                codec.decode(&bytes, &mut out).unwrap();
                // Any order of n - 1 additions errs by at most (n - 1) eps
                // times the sum of magnitudes (then scaled, and divided).
                let scale = codec.scale(len) / if op == ReduceOp::Avg { n as f32 } else { 1.0 };
                let mut tol = vec![0f32; len];
                for (j, &i) in codec.indices(len).iter().enumerate() {
                    tol[i] = 2.0 * n as f32 * f32::EPSILON * mag[j] * scale.max(1.0);
                }
                results.push(out);
                tolerance.push(tol);
            }
        }
        "powersgd" => {
            let rank: usize = spec.split(':').nth(1).map_or(1, |r| r.parse().unwrap());
            let config = PowerSgdConfig {
                rank,
                error_feedback: feedback.unwrap_or(true),
                ..PowerSgdConfig::default()
            };
            let mut states: Vec<PowerSgd> = (0..n)
                .map(|_| PowerSgd::new(len, config).unwrap())
                .collect();
            for step in 0..steps {
                let xs = inputs(n, step, len);
                let sum_into = |parts: Vec<&mut [f32]>| {
                    let mut sum = vec![0f32; parts[0].len()];
                    for part in &parts {
                        sum.iter_mut().zip(part.iter()).for_each(|(s, v)| *s += *v);
                    }
                    for part in parts {
                        part.copy_from_slice(&sum);
                    }
                };
                sum_into(
                    states
                        .iter_mut()
                        .zip(&xs)
                        .map(|(s, x)| s.compress_p(x).unwrap())
                        .collect(),
                );
                sum_into(
                    states
                        .iter_mut()
                        .map(|s| s.after_p_allreduce().unwrap())
                        .collect(),
                );
                let mut out = vec![0f32; len];
                for (p, s) in states.iter_mut().enumerate() {
                    let mut mine = vec![0f32; len];
                    s.decompress(&mut mine).unwrap();
                    if p == 0 {
                        out = mine;
                    }
                }
                divide(op, n, &mut out);
                // The orthogonalisation amplifies the allreduce's rounding;
                // a relative bound on the whole matrix, growing with steps
                // (the warm start carries it forward).
                let big = out.iter().fold(0f32, |m, v| m.max(v.abs()));
                let tol = 1e-3 * big * (step + 1) as f32 + 1e-6;
                tolerance.push(vec![tol; len]);
                results.push(out);
            }
        }
        _ => {
            let codec = compress::parse(spec).unwrap();
            let on = feedback.unwrap_or(true);
            let dense = codec.granule().is_some();
            let chunks = if dense {
                chunk_ranges(len, n, codec.granule().unwrap())
            } else {
                std::iter::once(0..len).collect()
            };
            let mut workers: Vec<ErrorFeedback> = (0..n).map(|_| ErrorFeedback::new(len)).collect();
            let mut servers: Vec<ErrorFeedback> =
                chunks.iter().map(|c| ErrorFeedback::new(c.len())).collect();
            for step in 0..steps {
                let xs = inputs(n, step, len);
                let mut out = vec![0f32; len];
                // encoded[p][j]: rank p's encoding of chunk j.
                let encoded: Vec<Vec<Vec<u8>>> = xs
                    .iter()
                    .zip(&mut workers)
                    .map(|(x, ef)| {
                        let mut ef = on.then_some(ef);
                        chunks
                            .iter()
                            .map(|c| encode(&*codec, ef.as_deref_mut(), c.start, &x[c.clone()]))
                            .collect()
                    })
                    .collect();
                for (j, c) in chunks.iter().enumerate() {
                    let mut acc = vec![0f32; c.len()];
                    for version in &encoded {
                        codec.decode_add(&version[j], &mut acc).unwrap();
                    }
                    divide(op, n, &mut acc);
                    if dense {
                        let again = encode(&*codec, on.then_some(&mut servers[j]), 0, &acc);
                        codec.decode(&again, &mut out[c.clone()]).unwrap();
                    } else {
                        out[c.clone()].copy_from_slice(&acc);
                    }
                }
                results.push(out);
                tolerance.push(vec![0.0; len]);
            }
        }
    }
    Reference {
        exactness,
        results,
        tolerance,
    }
}

/// The reference of `steps` compressed reduce-scatters: rank `r`'s chunk
/// (`chunk_ranges` of the codec's granule; 1 for the sparse codecs) at
/// every step, exact for every codec but PowerSGD (which runs its
/// allreduce).
pub fn reduce_scatter(
    spec: &str,
    n: usize,
    r: usize,
    len: usize,
    steps: u64,
    op: ReduceOp,
) -> Reference {
    reduce_scatter_of(spec, n, r, len, steps, op, &|p, step| input(p, step, len))
}

/// [`reduce_scatter`] of the inputs `x` gives.
pub fn reduce_scatter_of(
    spec: &str,
    n: usize,
    r: usize,
    len: usize,
    steps: u64,
    op: ReduceOp,
    x: Inputs<'_>,
) -> Reference {
    let inputs = |n: usize, step: u64, _len: usize| -> Vec<Vec<f32>> {
        (0..n).map(|p| x(p, step)).collect()
    };
    let kind = spec.split(':').next().unwrap();
    if kind == "powersgd" {
        let mut whole = all_reduce_of(spec, n, len, steps, op, None, x);
        let c = chunk_ranges(len, n, 1)[r].clone();
        for v in whole.results.iter_mut().chain(whole.tolerance.iter_mut()) {
            *v = v[c.clone()].to_vec();
        }
        return whole;
    }
    let randk = (kind == "randk").then(|| randk_of(spec));
    let single = (kind != "randk").then(|| compress::parse(spec).unwrap());
    let granule = single.as_ref().and_then(|c| c.granule()).unwrap_or(1);
    let chunks = chunk_ranges(len, n, granule);
    let on = randk.map_or(true, |c| !c.rescales());
    let mut workers: Vec<ErrorFeedback> = (0..n).map(|_| ErrorFeedback::new(len)).collect();
    let mut results = Vec::new();
    for step in 0..steps {
        let streams: Vec<RandK> = match randk {
            Some(c) => (0..n)
                .map(|j| c.at_step(step).with_stream(j as u64))
                .collect(),
            None => Vec::new(),
        };
        let codec_of = |j: usize| -> &dyn Codec {
            match &single {
                Some(c) => &**c,
                None => &streams[j],
            }
        };
        let xs = inputs(n, step, len);
        let mut acc = vec![0f32; chunks[r].len()];
        for (x, ef) in xs.iter().zip(&mut workers) {
            let mut ef = on.then_some(ef);
            for (j, c) in chunks.iter().enumerate() {
                let bytes = encode(codec_of(j), ef.as_deref_mut(), c.start, &x[c.clone()]);
                if j == r {
                    codec_of(j).decode_add(&bytes, &mut acc).unwrap();
                }
            }
        }
        divide(op, n, &mut acc);
        results.push(acc);
    }
    let tolerance = results.iter().map(|v| vec![0.0; v.len()]).collect();
    Reference {
        exactness: Exactness::Exact,
        results,
        tolerance,
    }
}

/// Where `got` differs from `want` by more than the reference allows.
pub fn compare(what: &str, got: &[f32], want: &Reference, step: usize) -> Result<(), String> {
    let (reference, tol) = (&want.results[step], &want.tolerance[step]);
    if got.len() != reference.len() {
        return Err(format!(
            "{what}: {} elements, want {}",
            got.len(),
            reference.len()
        ));
    }
    for (i, (&g, &w)) in got.iter().zip(reference).enumerate() {
        let ok = match want.exactness {
            Exactness::Exact => g.to_bits() == w.to_bits(),
            Exactness::Bounded => (g - w).abs() <= tol[i],
        };
        if !ok {
            return Err(format!(
                "{what}: step {step}, element {i}: got {g:e}, want {w:e} ({:?}, within {:e})",
                want.exactness, tol[i]
            ));
        }
    }
    Ok(())
}

/// Checks on this rank `steps` compressed allreduces and reduce-scatters
/// of `len` elements with `spec` against the reference, that every rank
/// got bitwise the same allreduce result, and the bytes the stats report.
pub fn check_rank(
    comm: &Communicator,
    spec: &str,
    len: usize,
    steps: u64,
    op: ReduceOp,
) -> Result<(), String> {
    let (n, r) = (comm.size(), comm.rank());
    let what = format!("{spec} allreduce ({op}) of {len} on {n} ranks, rank {r}");
    let err = |e: ferrocoll::Error| format!("{what}: {e}");
    let reference = all_reduce(spec, n, len, steps, op, None);
    let mut c = Compressor::new(comm, len, spec).map_err(err)?;
    for step in 0..steps {
        let mut buf = input(r, step, len);
        let stats = c.all_reduce(&mut buf, op).map_err(err)?;
        compare(&what, &buf, &reference, step as usize)?;
        same_everywhere(comm, &buf).map_err(|e| format!("{what}: step {step}: {e}"))?;
        check_stats(&what, n, len, &stats)?;
    }
    let what = format!("{spec} reduce-scatter ({op}) of {len} on {n} ranks, rank {r}");
    let err = |e: ferrocoll::Error| format!("{what}: {e}");
    let reference = reduce_scatter(spec, n, r, len, steps, op);
    let mut c = Compressor::new(comm, len, spec).map_err(err)?;
    for step in 0..steps {
        let mut out = vec![0f32; c.chunk(r).len()];
        let stats = c
            .reduce_scatter(&input(r, step, len), &mut out, op)
            .map_err(err)?;
        compare(&what, &out, &reference, step as usize)?;
        check_stats(&what, n, len, &stats)?;
    }
    Ok(())
}

/// The stats every call must report: the input's size; nothing sent for
/// an empty buffer or by a lone rank; on two ranks, where every algorithm
/// of every exchange sends exactly the formula's bytes, the counted bytes
/// equal to the computed ones.
fn check_stats(
    what: &str,
    n: usize,
    len: usize,
    stats: &ferrocoll::compress::WireStats,
) -> Result<(), String> {
    let alone = n == 1 || len == 0;
    let bad = stats.input_bytes != 4 * len
        || (alone && (stats.sent_bytes, stats.measured_bytes) != (0, 0))
        || (n == 2 && stats.measured_bytes != stats.sent_bytes as u64)
        || (len == 0 && stats.exchanges != 0);
    if bad {
        return Err(format!("{what}: stats {stats:?}"));
    }
    Ok(())
}

/// Fails unless every rank holds bitwise the same `buf`.
pub fn same_everywhere(comm: &Communicator, buf: &[f32]) -> Result<(), String> {
    let mine: Vec<u32> = buf.iter().map(|v| v.to_bits()).collect();
    let mut all = vec![0u32; mine.len() * comm.size()];
    comm.all_gather(&mine, &mut all)
        .map_err(|e| e.to_string())?;
    match all
        .chunks(mine.len().max(1))
        .position(|other| other != mine)
    {
        Some(p) if !mine.is_empty() => Err(format!(
            "rank {p}'s result differs from rank {}'s",
            comm.rank()
        )),
        _ => Ok(()),
    }
}

/// `Compressor::with_options` with error feedback turned `on` or off.
pub fn with_feedback(comm: &Communicator, len: usize, spec: &str, on: bool) -> Compressor {
    Compressor::with_options(
        comm,
        len,
        spec,
        CompressOptions {
            error_feedback: Some(on),
            ..CompressOptions::default()
        },
    )
    .unwrap()
}

/// Rank `rank`'s input rounded to quarters: sums of these are exact in
/// `f32` in any order, so a reference need not know the order in which a
/// node's ranks are summed.
pub fn quarters(rank: usize, step: u64, len: usize) -> Vec<f32> {
    input(rank, step, len)
        .into_iter()
        .map(|v| (v * 4.0).round() / 4.0)
        .collect()
}

/// The hierarchical form on `nodes` nodes of `local` ranks: each node's
/// sum, cut into `local` pieces of the padded length; piece `l` through
/// the flat reference among the nodes (`Sum`); then the pieces put
/// together and divided for `Avg`. `rank`: `Some(r)` for rank `r`'s chunk
/// of a reduce-scatter, `None` for the allreduce.
pub fn hier(
    spec: &str,
    (nodes, local): (usize, usize),
    len: usize,
    steps: u64,
    op: ReduceOp,
    rank: Option<usize>,
    x: Inputs<'_>,
) -> Reference {
    let n = nodes * local;
    let granule = compress::parse(spec).unwrap().granule().unwrap_or(1);
    let piece = len.div_ceil(local).div_ceil(granule) * granule;
    let node_sum = |h: usize, step: u64| -> Vec<f32> {
        let mut sum = vec![0f32; local * piece];
        for l in 0..local {
            sum.iter_mut()
                .zip(x(h * local + l, step))
                .for_each(|(s, v)| *s += v);
        }
        sum
    };
    let piece_of = |l: usize| {
        move |h: usize, step: u64| node_sum(h, step)[l * piece..(l + 1) * piece].to_vec()
    };
    let mut results = vec![Vec::new(); steps as usize];
    match rank {
        None => {
            for l in 0..local {
                let part =
                    all_reduce_of(spec, nodes, piece, steps, ReduceOp::Sum, None, &piece_of(l));
                for (whole, p) in results.iter_mut().zip(part.results) {
                    whole.extend(p);
                }
            }
            for v in &mut results {
                v.truncate(len);
            }
        }
        Some(r) => {
            let (h, l) = (r / local, r % local);
            let part = reduce_scatter_of(spec, nodes, h, piece, steps, ReduceOp::Sum, &piece_of(l));
            let at = l * piece + chunk_ranges(piece, nodes, granule)[h].start;
            let keep = part.results[0].len().min(len.saturating_sub(at));
            results = part
                .results
                .into_iter()
                .map(|mut v| {
                    v.truncate(keep);
                    v
                })
                .collect();
        }
    }
    for v in &mut results {
        divide(op, n, v);
    }
    let tolerance = results.iter().map(|v| vec![0.0; v.len()]).collect();
    Reference {
        exactness: Exactness::Exact,
        results,
        tolerance,
    }
}

/// Checks the hierarchical form on this rank (the communicator's topology
/// has `nodes` nodes of `local` ranks) against [`hier`], for the allreduce
/// and the reduce-scatter, on the quarter-valued inputs.
pub fn check_hier_rank(
    comm: &Communicator,
    spec: &str,
    (nodes, local): (usize, usize),
    len: usize,
    steps: u64,
    op: ReduceOp,
) -> Result<(), String> {
    let r = comm.rank();
    let what =
        format!("{spec} hierarchical allreduce ({op}) of {len} on {nodes}x{local}, rank {r}");
    let err = |e: ferrocoll::Error| format!("{what}: {e}");
    let x = |p: usize, step: u64| quarters(p, step, len);
    let reference = hier(spec, (nodes, local), len, steps, op, None, &x);
    let mut c = Compressor::new(comm, len, spec).map_err(err)?;
    if !c.hierarchical() {
        return Err(format!(
            "{what}: runs {}, not the hierarchical form",
            c.algorithm()
        ));
    }
    for step in 0..steps {
        let mut buf = x(r, step);
        let stats = c.all_reduce(&mut buf, op).map_err(err)?;
        compare(&what, &buf, &reference, step as usize)?;
        same_everywhere(comm, &buf).map_err(|e| format!("{what}: step {step}: {e}"))?;
        if len > 0 && (stats.local_sent_bytes == 0 || stats.local_measured_bytes == 0) {
            return Err(format!("{what}: stats {stats:?}"));
        }
    }
    let what =
        format!("{spec} hierarchical reduce-scatter ({op}) of {len} on {nodes}x{local}, rank {r}");
    let err = |e: ferrocoll::Error| format!("{what}: {e}");
    let reference = hier(spec, (nodes, local), len, steps, op, Some(r), &x);
    let mut c = Compressor::new(comm, len, spec).map_err(err)?;
    for step in 0..steps {
        let mut out = vec![0f32; c.chunk(r).len()];
        c.reduce_scatter(&x(r, step), &mut out, op).map_err(err)?;
        compare(&what, &out, &reference, step as usize)?;
    }
    Ok(())
}
