//! What an MoE layer's exchange costs, without running it: the bytes and
//! the predicted time of [`super::Dispatcher`]'s count exchange, dispatch
//! and combine for the expected count matrix of a routing distribution.
//!
//! The expected matrix: rank s has T_s tokens (the batch split as evenly as
//! it goes, the first ranks one more), and each of a token's k choices
//! names expert e with probability p_e ([`Skew`]), so T_s·p_e of rank s's
//! choice-j pairs go to e (k independent draws: the expectation of top-k
//! as long as no expert's k·p_e exceeds 1). Under [`Policy::Drop`] the
//! dispatcher's own rule (capacity ⌈P·T·k/E · C⌉, slots in the order
//! choice, source rank, position) runs on these expected counts. Rows from
//! rank s to rank d are what s keeps for d's experts.
//!
//! The exchanges are priced by [`price`] (the runtime's own pricing, on
//! the expected matrix instead of an observed one): `direct` is one round
//! whose time is set by the busiest port, α + (N-2)·o + max_i max(bytes i
//! sends, bytes i receives)/β (the max-send and max-receive terms: a hot
//! expert's rank receives more) and, where the ranks of a host share its
//! uplink, by the host's bytes through it (bisection); `pairwise` is N-1
//! steps of one message each way; `two-level`, on a topology of several
//! hosts of several ranks, aggregates by destination host (see
//! [`super::Schedule::TwoLevel`]). Combine is the transpose of dispatch (the
//! hot rank then sends the most). The count exchange is an allgather of
//! E·k + 2 u32 per rank, priced as `auto` chooses it (the cheapest closed
//! form). Local work (packing the send buffer, regrouping rows by expert,
//! the weighted sum) is charged at the profile's copy cost and gamma per
//! byte, in each phase's compute term.

use std::fmt;
use std::str::FromStr;

pub use super::schedule::{cheapest, choose, price, Candidate, TIE};
use super::{routing, Policy, HEADER};
use crate::cost::{self, Cost, Profile, Shape};
use crate::error::{Error, Result};
use crate::plan::{Algorithm, Collective};
use crate::topo::Topology;

/// How the router spreads choices over the experts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Skew {
    /// Every expert equally likely (the seed's Napkin Math 1.4).
    Uniform,
    /// Zipf with exponent s: expert e with probability ∝ (e+1)^-s, expert
    /// 0 (on rank 0) the hottest.
    Zipf(f64),
}

impl Skew {
    /// The probability of each of `experts` experts.
    pub fn probabilities(&self, experts: usize) -> Vec<f64> {
        let weights: Vec<f64> = match *self {
            Skew::Uniform => vec![1.0; experts],
            Skew::Zipf(s) => (0..experts).map(|e| ((e + 1) as f64).powf(-s)).collect(),
        };
        let total: f64 = weights.iter().sum();
        weights.into_iter().map(|w| w / total).collect()
    }
}

impl FromStr for Skew {
    type Err = Error;
    fn from_str(s: &str) -> Result<Skew> {
        let bad = || {
            Error::invalid(format!(
                "unknown skew `{s}`; use uniform or zipf:S with S >= 0 (e.g. zipf:1.2)"
            ))
        };
        match s.split_once(':') {
            None if s.eq_ignore_ascii_case("uniform") => Ok(Skew::Uniform),
            Some((name, exp)) if name.eq_ignore_ascii_case("zipf") => {
                let exp: f64 = exp.trim().parse().map_err(|_| bad())?;
                if exp.is_finite() && exp >= 0.0 {
                    Ok(Skew::Zipf(exp))
                } else {
                    Err(bad())
                }
            }
            _ => Err(bad()),
        }
    }
}

impl fmt::Display for Skew {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Skew::Uniform => f.write_str("uniform"),
            Skew::Zipf(s) => write!(f, "zipf:{s}"),
        }
    }
}

/// An MoE layer's exchange to price.
#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    /// Tokens of all ranks together (the seed's batch: 4096 on 8 GPUs is
    /// 512 a rank).
    pub tokens: usize,
    /// Elements per token row.
    pub hidden: usize,
    /// Bytes per element (2 for bf16).
    pub elem_size: usize,
    /// Experts in all, a multiple of `ranks`.
    pub experts: usize,
    /// Ranks (expert-parallel group size).
    pub ranks: usize,
    /// Choices per token.
    pub topk: usize,
    /// Capacity policy.
    pub policy: Policy,
    /// Routing distribution.
    pub skew: Skew,
    /// How the ranks nest into nodes (flat: one node).
    pub topology: Topology,
}

/// The count exchange: its allgather algorithm and predicted time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Exchange {
    /// The allgather algorithm.
    pub algorithm: Algorithm,
    /// Its predicted time.
    pub cost: Cost,
}

/// The prediction for a [`Workload`].
#[derive(Clone, Debug, PartialEq)]
pub struct Prediction {
    /// Tokens on each rank.
    pub tokens_per_rank: Vec<usize>,
    /// Bytes of one token row.
    pub row_bytes: usize,
    /// Expected (token, choice) pairs routed to each expert, before drops.
    pub expert_load: Vec<f64>,
    /// Every expert's capacity in rows (`None`: dropless).
    pub capacity: Option<usize>,
    /// Expected pairs dropped, all ranks together.
    pub dropped: f64,
    /// `rows[s][d]`: expected rows rank s sends rank d in dispatch (after
    /// drops; combine sends them back).
    pub rows: Vec<Vec<f64>>,
    /// The busiest rank's bytes sent to other ranks in dispatch (the
    /// max-send term; combine's max-receive).
    pub max_send_bytes: f64,
    /// The busiest rank's bytes received from other ranks in dispatch
    /// (the max-receive term; combine's max-send).
    pub max_recv_bytes: f64,
    /// The largest message between two ranks.
    pub max_message_bytes: f64,
    /// Bytes a rank sends other ranks when every expert's buffer is padded
    /// to its capacity and exchanged with an equal-split all-to-all
    /// (DeepSpeed-MoE's way; dropless pads to the largest expected load).
    pub padded_send_bytes: f64,
    /// The count exchange: its algorithm and cost.
    pub counts: Exchange,
    /// Dispatch under each candidate schedule of [`price`]: `direct`,
    /// `pairwise`, then `two-level` when the topology has several hosts of
    /// several ranks; the local work included in `compute`.
    pub dispatch: Vec<Candidate>,
    /// Combine, in the same order.
    pub combine: Vec<Candidate>,
}

impl Prediction {
    /// Count exchange + dispatch + combine under the schedules `auto`
    /// chooses ([`choose`]): one MoE layer's forward exchange.
    pub fn layer(&self) -> Cost {
        let best = |c: &[Candidate]| choose(c).map_or(Cost::ZERO, |c| c.cost);
        self.counts.cost + best(&self.dispatch) + best(&self.combine)
    }
}

/// Prices `w` on `profile`.
pub fn predict(w: &Workload, profile: &Profile) -> Result<Prediction> {
    let (p, e_all, k) = (w.ranks, w.experts, w.topk);
    if p == 0 || e_all == 0 || e_all % p != 0 {
        return Err(Error::invalid(format!(
            "moe model: {e_all} experts cannot be split evenly over {p} ranks; use a positive \
             multiple of the ranks"
        )));
    }
    if w.hidden == 0 || w.elem_size == 0 || k == 0 {
        return Err(Error::invalid(
            "moe model: hidden, the element size and topk must be at least 1",
        ));
    }
    w.topology.check_size(p)?;
    let l = e_all / p;
    let tokens_per_rank: Vec<usize> = (0..p)
        .map(|s| w.tokens / p + usize::from(s < w.tokens % p))
        .collect();
    let prob = w.skew.probabilities(e_all);
    let routed: Vec<f64> = (0..p)
        .flat_map(|s| {
            let t = tokens_per_rank[s] as f64;
            prob.iter()
                .flat_map(move |&pe| std::iter::repeat(t * pe).take(k))
        })
        .collect();
    let expert_load: Vec<f64> = (0..e_all)
        .map(|e| {
            (0..p)
                .map(|s| routed[(s * e_all + e) * k..][..k].iter().sum::<f64>())
                .sum()
        })
        .collect();
    let capacity = match w.policy {
        Policy::Drop { capacity_factor } => {
            Some(routing::capacity(w.tokens * k, e_all, capacity_factor))
        }
        Policy::Dropless => None,
    };
    let kept = routing::keep_in_priority_order(&routed, p, e_all, k, capacity.map(|c| c as f64));
    let dropped = routed.iter().sum::<f64>() - kept.iter().sum::<f64>();
    let rows: Vec<Vec<f64>> = (0..p)
        .map(|s| {
            (0..p)
                .map(|d| kept[(s * e_all + d * l) * k..][..l * k].iter().sum())
                .collect()
        })
        .collect();

    let row_bytes = w.hidden * w.elem_size;
    let rb = row_bytes as f64;
    let remote = |s: usize, d: usize| if s == d { 0.0 } else { rows[s][d] * rb };
    let max_send_bytes = (0..p)
        .map(|s| (0..p).map(|d| remote(s, d)).sum::<f64>())
        .fold(0.0, f64::max);
    let max_recv_bytes = (0..p)
        .map(|d| (0..p).map(|s| remote(s, d)).sum::<f64>())
        .fold(0.0, f64::max);
    let max_message_bytes = (0..p)
        .flat_map(|s| (0..p).map(move |d| (s, d)))
        .map(|(s, d)| remote(s, d))
        .fold(0.0, f64::max);
    // Padded: every rank sends each expert its per-rank share of the
    // buffer, ⌈capacity / P⌉ rows (DeepSpeed's ⌈T·k/E · C⌉).
    let slots = match capacity {
        Some(c) => c.div_ceil(p) as f64,
        None => (expert_load.iter().fold(0.0, |a: f64, &b| a.max(b)) / p as f64).ceil(),
    };
    let padded_send_bytes = (p - 1) as f64 * l as f64 * slots * rb;

    // Local work on the busiest rank: dispatch packs what it sends and
    // regroups what it receives; combine regroups again and sums what
    // comes back.
    let busiest = |by_row: bool| {
        (0..p)
            .map(|i| {
                (0..p)
                    .map(|j| if by_row { rows[i][j] } else { rows[j][i] })
                    .sum::<f64>()
            })
            .fold(0.0, f64::max)
            * rb
    };
    let (sent, received) = (busiest(true), busiest(false));
    let local_dispatch = (sent + received) * profile.copy;
    let local_combine = received * profile.copy + sent * profile.gamma;
    let backward: Vec<Vec<f64>> = (0..p)
        .map(|s| (0..p).map(|d| rows[d][s]).collect())
        .collect();
    let exchange = |m: &[Vec<f64>], local: f64| -> Vec<Candidate> {
        price(m, rb, &w.topology, profile)
            .into_iter()
            .map(|c| Candidate {
                cost: c.cost
                    + Cost {
                        latency: 0.0,
                        bandwidth: 0.0,
                        compute: local,
                    },
                ..c
            })
            .collect()
    };
    let mut gather = Shape::new(Collective::AllGather, p, HEADER + e_all * k, 4);
    gather.topology = w.topology.clone();
    let (algorithm, cost) = cost::candidates(&gather, profile)
        .into_iter()
        .next()
        .expect("allgather has closed forms");
    Ok(Prediction {
        tokens_per_rank,
        row_bytes,
        expert_load,
        capacity,
        dropped,
        max_send_bytes,
        max_recv_bytes,
        max_message_bytes,
        padded_send_bytes,
        counts: Exchange { algorithm, cost },
        dispatch: exchange(&rows, local_dispatch),
        combine: exchange(&backward, local_combine),
        rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seed's worked example (seed 000, Napkin Math 1.4): 4096 tokens
    /// on 8 GPUs, hidden 2048 in BF16, top-1 of 64 experts, uniform
    /// routing, InfiniBand NDR α = 3 μs, β = 50 GB/s.
    fn napkin_1_4(policy: Policy, skew: Skew) -> Workload {
        Workload {
            tokens: 4096,
            hidden: 2048,
            elem_size: 2,
            experts: 64,
            ranks: 8,
            topk: 1,
            policy,
            skew,
            topology: Topology::flat(8),
        }
    }

    fn ndr() -> Profile {
        Profile::uniform(3e-6, 50e9, 0.0)
    }

    #[test]
    fn napkin_math_1_4_bytes_and_time() {
        let r = predict(&napkin_1_4(Policy::Dropless, Skew::Uniform), &ndr()).unwrap();
        // "每个令牌占 4.096 KB" (4.096 KB a token).
        assert_eq!(r.row_bytes, 4096);
        assert_eq!(r.tokens_per_rank, vec![512; 8]);
        // "每个专家接收 64 tokens" (each expert receives 64 tokens).
        assert!(r.expert_load.iter().all(|&n| (n - 64.0).abs() < 1e-9));
        // "每次 GPU 间传输的数据量：64 tokens × 4.096 KB/令牌 = 262.144 KB"
        // (per GPU pair 262.144 KB).
        assert!((r.max_message_bytes - 262_144.0).abs() < 1e-6);
        // "每个 GPU 发送的总数据量：7 × 262.144 KB = 1.84 MB"; "接收的总数据量：
        // 1.84 MB（对称）" (sent 1.84 MB per GPU, received the same).
        assert!((r.max_send_bytes - 1_835_008.0).abs() < 1e-6);
        assert!((r.max_recv_bytes - 1_835_008.0).abs() < 1e-6);
        // "总体注入延迟的下界为 α + total bytes sent/β = 39.7 μs" (the
        // injection bound); the direct schedule is exactly that.
        let direct = r.dispatch[0];
        assert_eq!(direct.schedule, crate::moe::Schedule::Direct);
        assert!(
            (direct.cost.total() * 1e6 - 39.70).abs() < 0.01,
            "{direct:?}"
        );
        // "每层都要执行两次 AllToAll" (two all-to-alls a layer): combine is
        // the same exchange back.
        assert!((r.combine[0].cost.total() - direct.cost.total()).abs() < 1e-12);
        // "若串行执行：7 × 8 μs = 56 μs" (serially 56 us): pairwise is 7 ×
        // (3 + 5.243) = 57.7 us; the seed rounds 5.243 us to 5.
        let pairwise = r.dispatch[1];
        assert!((pairwise.cost.total() * 1e6 - 57.70).abs() < 0.01);
        // C = 1.0 on a uniform load drops nothing and pads nothing.
        let c1 = Policy::Drop {
            capacity_factor: 1.0,
        };
        let r1 = predict(&napkin_1_4(c1, Skew::Uniform), &ndr()).unwrap();
        assert_eq!(r1.capacity, Some(64));
        assert!(r1.dropped.abs() < 1e-9);
        assert!((r1.padded_send_bytes - 1_835_008.0).abs() < 1e-6);
        // C = 1.25: padding moves 1.25x the bytes (the seed's "C×").
        let c = Policy::Drop {
            capacity_factor: 1.25,
        };
        let padded = predict(&napkin_1_4(c, Skew::Uniform), &ndr()).unwrap();
        assert!((padded.padded_send_bytes - 1.25 * 1_835_008.0).abs() < 1e-6);
    }

    #[test]
    fn a_hot_expert_makes_its_rank_the_critical_path() {
        let uniform = predict(&napkin_1_4(Policy::Dropless, Skew::Uniform), &ndr()).unwrap();
        let zipf = predict(&napkin_1_4(Policy::Dropless, Skew::Zipf(1.2)), &ndr()).unwrap();
        // Rank 0 holds the hottest experts: it receives far more than the
        // uniform 1.84 MB, and dispatch takes longer.
        assert!(zipf.max_recv_bytes > 2.0 * uniform.max_recv_bytes);
        assert!(zipf.dispatch[0].cost.total() > 2.0 * uniform.dispatch[0].cost.total());
        assert_eq!(zipf.dropped, 0.0);
        // With a capacity, the hot experts drop and the exchange shrinks.
        let c = Policy::Drop {
            capacity_factor: 1.0,
        };
        let capped = predict(&napkin_1_4(c, Skew::Zipf(1.2)), &ndr()).unwrap();
        assert!(capped.dropped > 1000.0);
        assert!(capped.max_recv_bytes <= uniform.max_recv_bytes + 1e-6);
    }

    #[test]
    fn bad_workloads_are_errors() {
        let mut w = napkin_1_4(Policy::Dropless, Skew::Uniform);
        w.experts = 60;
        let e = predict(&w, &ndr()).unwrap_err().to_string();
        assert!(
            e.contains("60 experts cannot be split evenly over 8 ranks"),
            "{e}"
        );
        assert_eq!("zipf:1.2".parse::<Skew>().unwrap(), Skew::Zipf(1.2));
        assert_eq!("uniform".parse::<Skew>().unwrap(), Skew::Uniform);
        assert!("zipf:-1".parse::<Skew>().is_err());
        assert!("pareto".parse::<Skew>().is_err());
    }
}
