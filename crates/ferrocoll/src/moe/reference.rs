//! A naive reference for MoE dispatch/combine: what every rank's experts
//! must receive and every token's output must be, computed without
//! communicating. Used by the tests (ranks as threads and as processes) and
//! by `ferrocoll bench moe --check`; not a stable API.
//!
//! Every rank's inputs are a pure function of (case, rank), so each rank
//! can compute every other rank's inputs and hence the whole reference
//! without communicating: the list of every (source rank, token, choice,
//! expert) pair of the job, sorted in the priority order (choice, source
//! rank, token) and cut at each expert's capacity one pair at a time; each
//! expert's expected rows; each token's expected output, the weighted sum
//! of the "expert" e(v) = v·(e+1) + e over its kept choices.

use half::{bf16, f16};

use super::model::Skew;
use super::{Accumulate, Dispatcher, DroppedChoice, Policy, Spec};
use crate::comm::Communicator;

/// How the router chooses.
#[derive(Clone, Copy, Debug)]
pub enum Routing {
    /// Pseudo-random experts (a token may choose one expert twice), weights
    /// from a short list of exact values.
    Random(u64),
    /// Choice j of every token goes to expert j: the worst skew (top-1
    /// sends everything to expert 0).
    Hot,
    /// What a router does: k distinct experts per token drawn from `skew`'s
    /// distribution (with repeats only when k exceeds the experts), weights
    /// the softmax of k pseudo-random logits; all from `seed`.
    Sampled {
        /// The distribution over the experts.
        skew: Skew,
        /// Seed of every draw.
        seed: u64,
    },
}

/// One configuration to check.
#[derive(Clone, Debug)]
pub struct Case {
    /// Ranks of the job.
    pub ranks: usize,
    /// Experts in all.
    pub experts: usize,
    /// Elements per row.
    pub hidden: usize,
    /// Choices per token.
    pub topk: usize,
    /// `None`: dropless; `Some((num, den))`: drop at C = num/den (a ratio,
    /// so that the reference's capacity is exact integer arithmetic).
    pub capacity: Option<(usize, usize)>,
    /// Tokens of each rank.
    pub tokens: Vec<usize>,
    /// How the router chooses.
    pub routing: Routing,
}

/// A mixing hash (splitmix64).
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Uneven tokens per rank, rank 1 (when there is one) with none.
pub fn uneven_tokens(ranks: usize, seed: u64) -> Vec<usize> {
    (0..ranks)
        .map(|r| {
            if r == 1 {
                0
            } else {
                1 + (mix(seed ^ (r as u64 * 977)) % 9) as usize
            }
        })
        .collect()
}

impl Case {
    /// The dispatcher's spec for this case.
    pub fn spec(&self) -> Spec {
        let policy = match self.capacity {
            None => Policy::Dropless,
            Some((num, den)) => Policy::Drop {
                capacity_factor: num as f64 / den as f64,
            },
        };
        Spec::new(self.experts, self.hidden, self.topk, policy)
    }

    /// Element c of token t's row on rank s: a small integer, exact in
    /// every element type (and in bf16 after the expert function's
    /// rounding the reference repeats).
    pub fn value(&self, s: usize, t: usize, c: usize) -> f32 {
        ((s * 31 + t * 7 + c * 3) % 17) as f32 - 8.0
    }

    /// Rank s's router output: (topk_idx, topk_weights).
    pub fn route(&self, s: usize) -> (Vec<u32>, Vec<f32>) {
        if let Routing::Sampled { skew, seed } = self.routing {
            return sampled(skew, seed, s, self.tokens[s], self.topk, self.experts);
        }
        let pairs = self.tokens[s] * self.topk;
        let idx = (0..pairs)
            .map(|pair| match self.routing {
                Routing::Random(seed) => {
                    (mix(seed ^ ((s as u64) << 32) ^ pair as u64) % self.experts as u64) as u32
                }
                _ => ((pair % self.topk) % self.experts) as u32,
            })
            .collect();
        let weights = (0..pairs)
            .map(|pair| [0.25, 0.5, 0.75, 1.0, 0.125][(s * 3 + pair) % 5])
            .collect();
        (idx, weights)
    }

    /// Rank s's tokens as element type T.
    pub fn x<T: TestElem>(&self, s: usize) -> Vec<T> {
        (0..self.tokens[s])
            .flat_map(|t| (0..self.hidden).map(move |c| (t, c)))
            .map(|(t, c)| T::from_f32(self.value(s, t, c)))
            .collect()
    }

    /// The reference capacity: ⌈P·T·k/E · num/den⌉ in integers, P·T the
    /// tokens of all ranks.
    pub fn capacity_rows(&self) -> Option<usize> {
        let pairs: usize = self.tokens.iter().sum::<usize>() * self.topk;
        self.capacity
            .map(|(num, den)| (pairs * num).div_ceil(self.experts * den))
    }

    /// Every pair of the job, (choice, source, token, expert), and whether
    /// it is kept: sorted by the priority order, each expert taking pairs
    /// one at a time until it is full.
    pub fn decide(&self) -> Vec<(usize, usize, usize, usize, bool)> {
        let mut pairs = Vec::new();
        for s in 0..self.ranks {
            let (idx, _) = self.route(s);
            for (pair, &e) in idx.iter().enumerate() {
                pairs.push((pair % self.topk, s, pair / self.topk, e as usize));
            }
        }
        pairs.sort();
        let mut taken = vec![0usize; self.experts];
        let cap = self.capacity_rows();
        pairs
            .into_iter()
            .map(|(j, s, t, e)| {
                let keep = cap.map_or(true, |c| taken[e] < c);
                taken[e] += usize::from(keep);
                (j, s, t, e, keep)
            })
            .collect()
    }

    /// Rank r's dropped pairs, by token then choice.
    pub fn dropped(&self, r: usize) -> Vec<DroppedChoice> {
        let mut out: Vec<DroppedChoice> = self
            .decide()
            .into_iter()
            .filter(|&(_, s, _, _, keep)| s == r && !keep)
            .map(|(j, _, t, e, _)| DroppedChoice {
                token: t,
                choice: j,
                expert: e,
            })
            .collect();
        out.sort();
        out
    }

    /// The rows global expert e receives, as (source, token), in the
    /// documented order: by source rank, then token (then choice).
    pub fn expert_rows(&self, e: usize) -> Vec<(usize, usize)> {
        let mut rows: Vec<(usize, usize, usize)> = self
            .decide()
            .into_iter()
            .filter(|&(_, _, _, x, keep)| x == e && keep)
            .map(|(j, s, t, _, _)| (s, t, j))
            .collect();
        rows.sort();
        rows.into_iter().map(|(s, t, _)| (s, t)).collect()
    }
}

/// The element types the reference computes in (through f32, as
/// [`Accumulate`] sums them).
pub trait TestElem: Accumulate + Copy {
    /// `v` rounded to the type.
    fn from_f32(v: f32) -> Self;
    /// The value in f32 (exact).
    fn to_f32(self) -> f32;
}

impl TestElem for f32 {
    fn from_f32(v: f32) -> Self {
        v
    }
    fn to_f32(self) -> f32 {
        self
    }
}

impl TestElem for bf16 {
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
}

impl TestElem for f16 {
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
}

/// The test's "expert" e: v·(e+1) + e, computed in f32 and rounded to T.
pub fn expert<T: TestElem>(e: usize, v: T) -> T {
    T::from_f32(v.to_f32() * (e + 1) as f32 + e as f32)
}

/// What one rank's dispatch and combine did: (rows received, pairs this
/// rank dropped).
#[derive(Debug, PartialEq)]
pub struct Outcome {
    /// Rows this rank's experts received.
    pub received: usize,
    /// Pairs this rank dropped.
    pub dropped: usize,
}

/// What one rank's checked dispatch and combine produced.
#[derive(Debug)]
pub struct Checked<T> {
    /// Rows received and pairs dropped.
    pub outcome: Outcome,
    /// Elements of the experts' inputs and of the combined output that
    /// differ from the reference.
    pub wrong: usize,
    /// The first difference, described.
    pub first: Option<String>,
    /// The experts' inputs as dispatch delivered them.
    pub inputs: Vec<T>,
    /// The combined output.
    pub y: Vec<T>,
    /// The schedules dispatch and combine ran.
    pub schedules: [super::Schedule; 2],
    /// Whether they ran expert by expert.
    pub by_expert: [bool; 2],
}

/// Runs `case` on this rank in element type T and checks everything
/// against the reference: the handle's capacity, counts and drops, each
/// local expert's rows in order, and every token's combined output.
pub fn check_rank<T: TestElem>(comm: &Communicator, case: &Case) -> Result<Outcome, String> {
    let moe = Dispatcher::new(comm, case.spec()).map_err(|e| e.to_string())?;
    let checked = check_with::<T>(&moe, comm.rank(), case)?;
    match checked.first {
        Some(first) => Err(first),
        None => Ok(checked.outcome),
    }
}

/// [`check_rank`] with a given dispatcher (of `case.spec()`'s shape, any
/// schedule), rank `me`: a wrong count, capacity or drop is an error; wrong
/// elements are counted, the first described.
pub fn check_with<T: TestElem>(
    moe: &Dispatcher,
    me: usize,
    case: &Case,
) -> Result<Checked<T>, String> {
    let x: Vec<T> = case.x(me);
    let (idx, w) = case.route(me);
    let (mut inputs, handle) = moe.dispatch(&x, &idx, &w).map_err(|e| e.to_string())?;
    let h = case.hidden;
    let what = format!("{case:?} rank {me}");
    let decided = case.decide();
    let mut wrong = 0usize;
    let mut first: Option<String> = None;
    let mut note = |n: usize, why: &dyn Fn() -> String| {
        if n > 0 {
            wrong += n;
            first.get_or_insert_with(why);
        }
    };

    if handle.capacity() != case.capacity_rows() {
        return Err(format!("{what}: capacity {:?}", handle.capacity()));
    }
    let expect_dropped = case.dropped(me);
    if handle.dropped() != expect_dropped.as_slice() {
        return Err(format!(
            "{what}: dropped {:?}, reference {expect_dropped:?}",
            handle.dropped()
        ));
    }
    let dropped_all = decided.iter().filter(|p| !p.4).count();
    if handle.dropped_everywhere() != dropped_all {
        return Err(format!("{what}: dropped_everywhere"));
    }
    let mut routed = vec![0usize; case.ranks * case.experts];
    for s in 0..case.ranks {
        for &e in &case.route(s).0 {
            routed[s * case.experts + e as usize] += 1;
        }
    }
    for s in 0..case.ranks {
        for e in 0..case.experts {
            if handle.routed(s, e) != routed[s * case.experts + e] {
                return Err(format!("{what}: routed({s}, {e})"));
            }
        }
    }

    // Each local expert's rows, exactly, in the documented order.
    let l = case.experts / case.ranks;
    if inputs.local_experts() != l || inputs.first_expert() != me * l || inputs.hidden() != h {
        return Err(format!("{what}: ExpertInputs shape"));
    }
    for x_local in 0..l {
        let e = me * l + x_local;
        let rows = case.expert_rows(e);
        let from = handle.received_from(x_local);
        for (s, &n) in from.iter().enumerate() {
            let want = rows.iter().filter(|r| r.0 == s).count();
            if n != want {
                return Err(format!(
                    "{what}: received_from({x_local})[{s}] = {n}, want {want}"
                ));
            }
        }
        let got = inputs.expert(x_local);
        let differ = rows
            .iter()
            .flat_map(|&(s, t)| (0..h).map(move |c| T::from_f32(case.value(s, t, c))))
            .zip(got)
            .filter(|(want, got)| want.to_f32().to_bits() != got.to_f32().to_bits())
            .count();
        note(differ, &|| {
            format!("{what}: expert {e}'s rows differ from the reference")
        });
    }
    let delivered = inputs.as_slice().to_vec();

    // The experts run; combine brings their outputs home.
    for x_local in 0..l {
        let e = me * l + x_local;
        for v in inputs.expert_mut(x_local) {
            *v = expert(e, *v);
        }
    }
    let y = moe
        .combine(inputs.as_slice(), &handle)
        .map_err(|e| e.to_string())?;
    if y.len() != case.tokens[me] * h {
        return Err(format!("{what}: y has {} elements", y.len()));
    }
    let kept: std::collections::HashSet<(usize, usize)> = decided
        .iter()
        .filter(|p| p.1 == me && p.4)
        .map(|p| (p.2, p.0))
        .collect();
    for t in 0..case.tokens[me] {
        for c in 0..h {
            // Accumulated in f32 in choice order and rounded once: the
            // same operations as combine, so the result is exact.
            let mut acc = 0.0f32;
            for j in 0..case.topk {
                if kept.contains(&(t, j)) {
                    let e = idx[t * case.topk + j] as usize;
                    let v = T::from_f32(case.value(me, t, c));
                    acc += w[t * case.topk + j] * expert(e, v).to_f32();
                }
            }
            let want = T::from_f32(acc);
            let got = y[t * h + c];
            if got.to_f32().to_bits() != want.to_f32().to_bits() {
                note(1, &|| {
                    format!(
                        "{what}: y[{t}][{c}] = {}, reference {}",
                        got.to_f32(),
                        want.to_f32()
                    )
                });
            }
        }
    }
    Ok(Checked {
        outcome: Outcome {
            received: inputs.rows(),
            dropped: handle.dropped().len(),
        },
        wrong,
        first,
        inputs: delivered,
        y,
        schedules: [handle.dispatch_schedule(), handle.combine_schedule()],
        by_expert: handle.runs_by_expert(),
    })
}

/// Rank s's router output under [`Routing::Sampled`].
fn sampled(
    skew: Skew,
    seed: u64,
    s: usize,
    tokens: usize,
    k: usize,
    experts: usize,
) -> (Vec<u32>, Vec<f32>) {
    let cdf: Vec<f64> = skew
        .probabilities(experts)
        .into_iter()
        .scan(0.0, |acc, p| {
            *acc += p;
            Some(*acc)
        })
        .collect();
    let unit = |z: u64| (z >> 11) as f64 / (1u64 << 53) as f64;
    let distinct = k <= experts;
    let mut idx = Vec::with_capacity(tokens * k);
    let mut weights = Vec::with_capacity(tokens * k);
    for t in 0..tokens {
        let base = mix(seed ^ ((s as u64) << 40) ^ t as u64);
        let mut chosen: Vec<u32> = Vec::with_capacity(k);
        let mut draw = 0u64;
        while chosen.len() < k {
            let u = unit(mix(base ^ draw)) * cdf[experts - 1];
            draw += 1;
            let e = cdf.partition_point(|&c| c <= u).min(experts - 1) as u32;
            if !distinct || !chosen.contains(&e) {
                chosen.push(e);
            }
        }
        // Softmax of logits in [-2, 2), the largest first (a router's
        // top-k comes sorted by weight).
        let mut logits: Vec<f32> = (0..k)
            .map(|j| (4.0 * unit(mix(base ^ 0x5eed ^ ((j as u64) << 20))) - 2.0) as f32)
            .collect();
        logits.sort_by(|a, b| b.total_cmp(a));
        let top = logits[0];
        let exps: Vec<f32> = logits.iter().map(|&z| (z - top).exp()).collect();
        let sum: f32 = exps.iter().sum();
        idx.extend(chosen);
        weights.extend(exps.iter().map(|&v| v / sum));
    }
    (idx, weights)
}
