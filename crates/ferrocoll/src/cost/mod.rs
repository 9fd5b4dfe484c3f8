//! The cost model: what each algorithm costs under alpha-beta-gamma.
//!
//! Every algorithm of the catalogue has a closed form ([`predict`]): time =
//! latency term (alpha per round on the critical path) + bandwidth term (bytes
//! through the busiest port over beta) + compute term (bytes reduced times
//! gamma), with separate alpha/beta for intra-node and inter-node links. The
//! closed forms live one family per file, beside the plans they describe, and
//! `tests/cost_consistency.rs` holds each against [`walk`], which times the
//! algorithm's actual plans message by message: the model cannot drift from
//! the code.

mod direct;
mod hier;
mod loggp;
mod recursive;
mod ring;
mod tree;
mod walk;

pub use loggp::{busiest, overlap, Busiest, LogGp, Overlap};
pub use walk::{walk, walk_cpu};

use std::ops::Add;

use crate::plan::{Algorithm, Collective, PlanRequest};
use crate::topo::Topology;

/// Latency and bandwidth of one class of link.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LinkParams {
    /// Seconds per message (the alpha of the Hockney model).
    pub alpha: f64,
    /// Bytes per second through one port (beta; time per byte is 1/beta).
    pub beta: f64,
    /// Seconds each further message of a round costs on this link class
    /// (LogGP's overhead o): a round with k messages through a port pays
    /// alpha + (k-1)·o of latency. 0 in the plain alpha-beta model.
    #[serde(default)]
    pub overhead: f64,
}

/// Parameters of the machine a collective runs on.
///
/// Stored as JSON by `ferrocoll calibrate`; `FERROCOLL_PROFILE` (or the
/// default path, [`Profile::default_path`]) points [`crate::Config`] at one.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Profile {
    /// Links between ranks on the same node.
    pub intra: LinkParams,
    /// Links between ranks on different nodes.
    pub inter: LinkParams,
    /// Seconds to reduce one byte (gamma).
    pub gamma: f64,
}

impl Profile {
    /// Built-in parameters of the thread transport: what `ferrocoll
    /// calibrate` fitted on the project's 2-core machine (bench/RESULTS.md):
    /// alpha 3.7 us, beta 17 GB/s, o 0.6 us per further message, and gamma
    /// 0 (on threads the reduction hides in the memory traffic the copy pays
    /// anyway). In three regret runs this profile kept auto within 10 % of
    /// the best algorithm at 72-80 % of sizes, against 61-80 % with a 10 GB/s
    /// reduction rate added.
    pub fn thread_default() -> Profile {
        let mut p = Profile::uniform(3.7e-6, 1.7e10, 0.0);
        p.intra.overhead = 6e-7;
        p.inter.overhead = 6e-7;
        p
    }

    /// Where a calibrated profile of `transport` is looked for when
    /// `FERROCOLL_PROFILE` is not set: `$XDG_CONFIG_HOME/ferrocoll/<transport>.json`,
    /// else `$HOME/.config/ferrocoll/<transport>.json`.
    pub fn default_path(transport: &str) -> Option<std::path::PathBuf> {
        let base = std::env::var_os("XDG_CONFIG_HOME")
            .filter(|v| !v.is_empty())
            .map(std::path::PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".config"))
            })?;
        Some(base.join("ferrocoll").join(format!("{transport}.json")))
    }

    /// Reads a profile written by `ferrocoll calibrate`.
    pub fn load(path: &std::path::Path) -> Result<Profile, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let file: ProfileFile = serde_json::from_str(&text)
            .map_err(|e| format!("{} is not a ferrocoll profile: {e}", path.display()))?;
        Ok(file.profile)
    }

    /// One link class everywhere.
    pub fn uniform(alpha: f64, beta: f64, gamma: f64) -> Profile {
        let link = LinkParams {
            alpha,
            beta,
            overhead: 0.0,
        };
        Profile {
            intra: link,
            inter: link,
            gamma,
        }
    }
}

/// A profile as stored on disk, with how it was obtained.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ProfileFile {
    /// The transport it was measured on (`thread`, `shm`, `tcp`).
    pub transport: String,
    /// The parameters.
    pub profile: Profile,
    /// Coefficient of determination of the fit.
    pub r2: f64,
    /// Geometric mean of the relative errors over the fitted points,
    /// exp(mean |ln(predicted/measured)|) - 1 (0.1 = 10 %).
    pub geomean_error: f64,
    /// Number of measurements fitted.
    pub points: usize,
}

/// A predicted time, split into its terms (seconds).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Cost {
    /// Alpha terms on the critical path.
    pub latency: f64,
    /// Bytes over beta on the critical path.
    pub bandwidth: f64,
    /// Bytes reduced times gamma on the critical path.
    pub compute: f64,
}

impl Cost {
    /// No time at all.
    pub const ZERO: Cost = Cost {
        latency: 0.0,
        bandwidth: 0.0,
        compute: 0.0,
    };

    /// The predicted time.
    pub fn total(&self) -> f64 {
        self.latency + self.bandwidth + self.compute
    }

    /// `rounds` messages of `bytes` each on `link`, in sequence, with
    /// `reduced` bytes reduced at `gamma` in all.
    pub fn rounds(rounds: f64, bytes: f64, link: &LinkParams, reduced: f64, gamma: f64) -> Cost {
        Cost {
            latency: rounds * link.alpha,
            bandwidth: rounds * bytes / link.beta,
            compute: reduced * gamma,
        }
    }
}

impl Add for Cost {
    type Output = Cost;
    fn add(self, o: Cost) -> Cost {
        Cost {
            latency: self.latency + o.latency,
            bandwidth: self.bandwidth + o.bandwidth,
            compute: self.compute + o.compute,
        }
    }
}

/// Everything a closed form needs to know about a call.
#[derive(Clone, Debug, PartialEq)]
pub struct Shape {
    /// The collective.
    pub coll: Collective,
    /// Group size.
    pub n: usize,
    /// Elements, as [`PlanRequest::count`] counts them (the buffer for
    /// allreduce/broadcast/reduce, the per-rank block for the block
    /// collectives).
    pub count: usize,
    /// Bytes per element.
    pub elem_size: usize,
    /// Root of rooted collectives.
    pub root: usize,
    /// The group's topology.
    pub topology: Topology,
    /// For alltoallv: `counts[src][dst]` elements from rank src to rank dst.
    pub v_counts: Vec<Vec<usize>>,
}

impl Shape {
    /// A shape with a flat topology and root 0.
    pub fn new(coll: Collective, n: usize, count: usize, elem_size: usize) -> Shape {
        Shape {
            coll,
            n,
            count,
            elem_size,
            root: 0,
            topology: Topology::flat(n),
            v_counts: Vec::new(),
        }
    }

    /// Bytes of `count` elements.
    pub fn bytes(&self) -> f64 {
        (self.count * self.elem_size) as f64
    }

    /// The plan request of `rank` for this shape.
    pub fn request(&self, rank: usize) -> PlanRequest {
        let mut req = PlanRequest::new(self.coll, self.n, rank, self.count)
            .with_root(self.root)
            .with_elem_size(self.elem_size)
            .with_topology(self.topology.clone());
        if self.coll == Collective::AllToAllV {
            let send = self.v_counts[rank].clone();
            let recv = (0..self.n).map(|s| self.v_counts[s][rank]).collect();
            req = req.with_counts(send, recv);
        }
        req
    }
}

/// The closed-form cost of `algo` for `shape` on `profile`, or `None` if the
/// collective does not have that algorithm.
pub fn predict(algo: Algorithm, shape: &Shape, profile: &Profile) -> Option<Cost> {
    let algo = algo.for_collective(shape.coll)?;
    if shape.n <= 1
        || (shape.count == 0
            && shape.coll != Collective::AllToAllV
            && shape.coll != Collective::Barrier)
    {
        // A copy, or nothing at all: no message moves.
        return Some(Cost::ZERO);
    }
    use Algorithm as A;
    match algo {
        A::Ring | A::Ring2 | A::Pipeline => ring::predict(algo, shape, profile),
        A::Tree | A::DoubleBinaryTree | A::ScatterAllgather | A::RsGather => {
            tree::predict(algo, shape, profile)
        }
        A::Butterfly | A::HalvingDoubling | A::Halving | A::Bruck | A::Dissemination => {
            recursive::predict(algo, shape, profile)
        }
        A::Direct | A::Star | A::Linear | A::Pairwise => direct::predict(algo, shape, profile),
        A::Hier | A::Torus2d | A::Mesh2d => hier::predict(algo, shape, profile),
    }
}

/// Every algorithm `shape.coll` has, with its predicted cost, cheapest
/// first (ties keep the catalogue's order).
pub fn candidates(shape: &Shape, profile: &Profile) -> Vec<(Algorithm, Cost)> {
    let mut all: Vec<(Algorithm, Cost)> = shape
        .coll
        .algorithms()
        .iter()
        .filter_map(|&a| predict(a, shape, profile).map(|c| (a, c)))
        .collect();
    all.sort_by(|a, b| a.1.total().total_cmp(&b.1.total()));
    all
}

/// A size at which the cheapest algorithm changes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Crossover {
    /// The smallest size (in bytes, as [`Shape::bytes`] counts them for the
    /// whole call) at which `to` is predicted cheaper than `from`.
    pub bytes: usize,
    /// The winner below that size.
    pub from: Algorithm,
    /// The winner from that size on.
    pub to: Algorithm,
}

/// The sizes between 1 byte and `max_bytes` where the cheapest algorithm
/// changes, for calls shaped like `shape` (only its byte size varies;
/// `bytes_to_count` turns a size into the shape's element count).
pub fn crossovers(
    shape: &Shape,
    profile: &Profile,
    max_bytes: usize,
    bytes_to_count: impl Fn(usize) -> usize,
) -> Vec<Crossover> {
    let winner = |bytes: usize| {
        let s = Shape {
            count: bytes_to_count(bytes),
            ..shape.clone()
        };
        candidates(&s, profile).first().map(|c| c.0)
    };
    let mut found = Vec::new();
    let mut lo = 1usize;
    let mut lo_win = winner(lo);
    while lo < max_bytes {
        let hi = (lo.saturating_mul(2)).min(max_bytes);
        let hi_win = winner(hi);
        if hi_win != lo_win {
            // Bisect for the first size where the winner differs from lo's.
            let (mut a, mut b) = (lo, hi);
            while b - a > 1 {
                let mid = a + (b - a) / 2;
                if winner(mid) == lo_win {
                    a = mid;
                } else {
                    b = mid;
                }
            }
            if let (Some(from), Some(to)) = (lo_win, winner(b)) {
                found.push(Crossover { bytes: b, from, to });
            }
            lo = b;
            lo_win = winner(b);
        } else {
            lo = hi;
        }
    }
    found
}
