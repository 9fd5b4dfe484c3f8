//! The cost model: what each algorithm costs under alpha-beta-gamma.
//!
//! Every algorithm of the catalogue has a closed form ([`predict`]): time =
//! latency term (alpha per round on the critical path) + bandwidth term (bytes
//! through the busiest port over beta) + compute term (bytes reduced times
//! gamma, plus bytes copied locally times the copy cost), with separate
//! alpha/beta for intra-node and inter-node links, and optionally a second,
//! lower bandwidth once the call's buffers outgrow the cache
//! ([`Profile::for_shape`]). The
//! closed forms live one family per file, beside the plans they describe, and
//! `tests/cost_consistency.rs` holds each against [`walk`], which times the
//! algorithm's actual plans message by message: the model cannot drift from
//! the code.

mod copies;
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
    /// Bytes of the pieces in which a message's two copies overlap (the
    /// sender's into the transport, the receiver's out of it, as a
    /// shared-memory ring or a socket has them): a round whose messages are
    /// m bytes pays `min(m, piece)` bytes more at beta, the piece that one
    /// copy waits for the other ([`LinkParams::transfer`]).
    /// So a message of a piece or less pays both copies and a long one
    /// about one. Fitted by `ferrocoll calibrate` among a few sizes; 0 (the
    /// plain alpha-beta model) leaves the term out.
    #[serde(default)]
    pub piece: f64,
}

impl LinkParams {
    /// Seconds a round moving `bytes` through a port in messages of
    /// `message` bytes (their mean, where they differ) spends on
    /// bandwidth: `(bytes + min(message, piece)) / beta` (see
    /// [`LinkParams::piece`]).
    pub fn transfer(&self, bytes: f64, message: f64) -> f64 {
        (bytes + self.piece_of(message)) / self.beta
    }

    /// The bytes of a `message`-byte message that its two copies do not
    /// overlap: `min(message, piece)`.
    pub fn piece_of(&self, message: f64) -> f64 {
        message.min(self.piece).max(0.0)
    }
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
    /// Seconds to copy one byte locally: a plan's [`crate::plan::Op::Copy`]
    /// between two different spans (a rank's own block into its output, a
    /// scratch copy that keeps an in-place call correct, Bruck's packing),
    /// and the round trip through scratch of an arrival folded in a later
    /// round ([`crate::plan::Op::Reduce`] from a scratch slot: the direct
    /// and star allreduce, the direct reduce-scatter, a double binary tree
    /// rank's second child), which a fold on arrival does not make.
    /// 0 (free) in profiles written before it existed.
    #[serde(default)]
    pub copy: f64,
    /// Bytes of buffers (every rank's input and output of the call
    /// together, [`Shape::working_set`]) beyond which the call no longer
    /// runs from the cache; 0: no such limit. See [`Profile::for_shape`].
    #[serde(default)]
    pub cache_bytes: f64,
    /// Bytes per second a port gets once the working set exceeds
    /// `cache_bytes`: each link class's beta is capped at it. 0: no cap.
    #[serde(default)]
    pub beta_mem: f64,
    /// Seconds to copy one byte locally once the working set exceeds
    /// `cache_bytes` (a copy out of the cache streams through memory): the
    /// copy cost [`Profile::for_shape`] uses there. 0 (profiles written
    /// before it existed, and the built-in ones): `copy` everywhere.
    /// Measured (bench/RESULTS.md, issue 19): a 16 MiB Bruck alltoall on 2
    /// ranks, which copies its buffer twice more than the direct one, took
    /// 1.5x its prediction with the in-cache copy cost.
    #[serde(default)]
    pub copy_mem: f64,
    /// Inter-node ports per node: 0 (profiles written before it existed,
    /// and the default) means every rank has a port of its own, as with a
    /// NIC per GPU; `k` means the ranks of a node share `k` ports, as on a
    /// host with one NIC (1), so that when all `L` ranks of a node cross
    /// at once (a hierarchical or 2-D algorithm's inter-node levels) each
    /// gets `inter.beta · min(1, k/L)` ([`Profile::inter_share`]).
    /// `ferrocoll calibrate` across hosts measures `inter` with one rank per
    /// host and writes 1.
    #[serde(default)]
    pub inter_ports: f64,
    /// Cores that serve one node's ranks: 0 (profiles written before it
    /// existed, and the built-in ones) means a core per rank. On one host
    /// the transports move bytes with the CPU (a copy into a ring or a
    /// socket, a reduction), so when more ranks of a node move bytes at
    /// once than it has cores, each gets a share of a core: [`predict`]
    /// divides beta and multiplies gamma and the copy cost by
    /// `max(1, busy / cores)`, with `busy` the ranks of a node that the
    /// algorithm keeps moving bytes at once ([`Profile::core_share`]).
    /// `ferrocoll calibrate` writes the host's online CPUs.
    #[serde(default)]
    pub cores: f64,
    /// Only a message's receiver moves its bytes: a receive copies straight
    /// from the sender's buffer (the thread transport), so in one round a
    /// rank pays per byte for what it receives, and a root sending to many
    /// peers at once pays nothing per byte while they copy in parallel.
    /// False (the default, and profiles written before it existed): the
    /// sender's core moves them too (into a ring or a socket), and a rank
    /// pays for the larger of what it sends and receives. Measured
    /// (bench/RESULTS.md, issue 19): a 4-rank direct broadcast of 2 MiB on
    /// threads took 236 us, against 821 us predicted with the sender
    /// paying for its three messages.
    #[serde(default)]
    pub receiver_copies: bool,
    /// Both ends of a message move its bytes, each with its own core: a
    /// shared-memory ring (the sender copies in, the receiver out) or a
    /// socket on one host (each side's system call copies). A rank then
    /// pays for what it sends plus what it receives, each byte at half of
    /// beta, beta being what a rank gets in an exchange round (a message
    /// each way at once, the rounds calibration mostly sees): a one-way
    /// round, as a tree's or a star's, costs half an exchange of the same
    /// message. False (the default, and profiles written before it
    /// existed): the larger of the two at beta, a full-duplex NIC's rule.
    /// [`Profile::receiver_copies`] takes precedence. Measured
    /// (bench/RESULTS.md, issue 19, sixth session): with the larger of the
    /// two, every shared-memory calibration over-predicted the tree and
    /// star allreduces (+16 and +18 % mean bias) and under-predicted the
    /// exchanges.
    #[serde(default)]
    pub two_sided_copies: bool,
}

impl Profile {
    /// Built-in parameters of the thread transport, from `ferrocoll
    /// calibrate` on the project's 2-core machine (bench/RESULTS.md): alpha
    /// 3.7 us, beta 17 GB/s and o 0.6 us per further message (fitted with 4
    /// ranks); gamma 0.02 ns/B and a local copy 0.017 ns/B, both timed from
    /// the kernels (the f32 sum and `copy_from_slice` on 1 MiB); and beyond a
    /// working set of 32 MiB (the L3, inside the gap every fit placed the
    /// cache's edge in) the links run at 8 GB/s, what the 4-rank fits found
    /// there. Without the copy cost, `auto` took butterfly for 2-rank
    /// allreduces of 256 KiB to 16 MiB, which copies its whole input before
    /// its one exchange and measured up to 2.4x slower than the ring.
    pub fn thread_default() -> Profile {
        let mut p = Profile::uniform(3.7e-6, 1.7e10, 2e-11);
        p.intra.overhead = 6e-7;
        p.inter.overhead = 6e-7;
        p.copy = 1.7e-11;
        p.cache_bytes = 32.0 * 1048576.0;
        p.beta_mem = 8e9;
        p
    }

    /// Built-in parameters of the TCP transport on one host (loopback):
    /// [`Profile::thread_default`] with a message's latency alpha 6 us and
    /// o 3 us per further message of a round (the thread transport's: 3.7
    /// and 0.6 us). A message through a socket costs a system call on each
    /// side, so a round's further messages cost several times a thread's
    /// hand-over; with the thread numbers `auto` took `direct` for small
    /// 4-rank allgathers and reduce-scatters, 1.2-1.3x slower than butterfly
    /// and halving. Chosen by re-pricing two kept regret runs (the
    /// model's picks scored by the forced candidates' times: 188 -> 204 of
    /// 254 sizes within 1.10, alpha 2-6 us and o 2-4 us searched) and held on
    /// a third run made afterwards: 96 -> 104 of 127 (bench/RESULTS.md,
    /// 2026-12-06, fourth session). The loopback calibration's own numbers
    /// (alpha 8.4 us, beta 4.0 GB/s, o 2.0 us) chose as the thread numbers
    /// did at 126 of 127 sizes.
    ///
    /// Both ends of a message copy it ([`Profile::two_sided_copies`]): on
    /// one host each side's system call copies, so a one-way round (a
    /// tree's) costs half an exchange's per byte. With the larger of the
    /// two instead, `auto` took `rs_gather` for reduces from 1 MiB, at
    /// 1.0-3.4x the binomial tree's time on 2 ranks; the regret runs of
    /// reduce and broadcast on 2 and 4 ranks put `auto` within 10 % of the
    /// fastest forced algorithm at 25 of 36 sizes with it, 17 without, and
    /// the allreduce, allgather and all-to-all choices do not move
    /// (bench/RESULTS.md, 2026-12-07, eleventh session).
    pub fn tcp_default() -> Profile {
        let mut p = Profile::thread_default();
        p.intra.alpha = 6e-6;
        p.inter.alpha = 6e-6;
        p.intra.overhead = 3e-6;
        p.inter.overhead = 3e-6;
        p.two_sided_copies = true;
        p
    }

    /// The built-in profile of `transport` when no calibrated one exists:
    /// [`Profile::tcp_default`] for `tcp`, else [`Profile::thread_default`],
    /// with [`Profile::receiver_copies`] on the thread transport, whose
    /// receives copy from the sender's buffer.
    pub fn builtin(transport: &str) -> Profile {
        if transport == "tcp" {
            return Profile::tcp_default();
        }
        Profile {
            receiver_copies: transport == "thread",
            ..Profile::thread_default()
        }
    }

    /// Built-in parameters of a job across hosts that has no calibrated
    /// profile: [`Profile::thread_default`] within a host, and between
    /// hosts a 10 Gbit/s Ethernet port per host (alpha 30 us, beta
    /// 1.25 GB/s, o 2 us, shared by the host's ranks: `inter_ports` 1). A
    /// guess, but the right way round: with the thread transport's numbers
    /// between hosts too, `auto` took the flat `mesh2d` across a 1 Gbit/s
    /// link (0.119 GB/s busbw) where `hier` ran 1.5x faster (bench/RESULTS.md,
    /// issue 15). `ferrocoll calibrate` across the hosts measures both.
    pub fn hosts_default() -> Profile {
        let mut p = Profile::thread_default();
        p.inter = LinkParams {
            alpha: 30e-6,
            beta: 1.25e9,
            overhead: 2e-6,
            piece: 0.0,
        };
        p.inter_ports = 1.0;
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
            piece: 0.0,
        };
        Profile {
            intra: link,
            inter: link,
            gamma,
            copy: 0.0,
            cache_bytes: 0.0,
            beta_mem: 0.0,
            copy_mem: 0.0,
            inter_ports: 0.0,
            cores: 0.0,
            receiver_copies: false,
            two_sided_copies: false,
        }
    }

    /// This profile with [`Profile::cores`] set to `cores`.
    pub fn with_cores(mut self, cores: f64) -> Profile {
        self.cores = cores;
        self
    }

    /// The factor by which each rank's per-byte costs grow when `busy`
    /// ranks of a node move bytes at once on [`Profile::cores`] cores:
    /// `max(1, busy / cores)`, 1 when `cores` is 0 (unknown).
    ///
    /// Measured (bench/RESULTS.md, issue 19 item 3): 4 ranks on 2 cores,
    /// one beta for every algorithm under-predicted the ones where every
    /// rank copies at once (direct and Bruck all-to-all, direct allgather:
    /// 36-72 % low) and over-predicted the ones that leave ranks idle
    /// (binomial tree, star: 35-62 % high), in every calibration.
    pub fn core_share(&self, busy: f64) -> f64 {
        if self.cores > 0.0 {
            (busy / self.cores).max(1.0)
        } else {
            1.0
        }
    }

    /// The bytes a rank pays for at beta in a round where it sends `sent`
    /// and receives `received` bytes on one link class: what it receives
    /// where only receivers copy ([`Profile::receiver_copies`]), half of
    /// both where both ends copy ([`Profile::two_sided_copies`]), else the
    /// larger of the two.
    pub fn moved(&self, sent: f64, received: f64) -> f64 {
        if self.receiver_copies {
            received
        } else if self.two_sided_copies {
            0.5 * (sent + received)
        } else {
            sent.max(received)
        }
    }

    /// Seconds a rank spends on bandwidth in a round where it sends `sent`
    /// and receives `received` bytes through `link` in `messages` messages
    /// each way at most: [`Profile::moved`] bytes at the link's
    /// [`LinkParams::transfer`], in messages of their mean size.
    pub fn round_bandwidth(
        &self,
        link: &LinkParams,
        sent: f64,
        received: f64,
        messages: usize,
    ) -> f64 {
        let moved = self.moved(sent, received);
        link.transfer(moved, moved / messages.max(1) as f64)
    }

    /// The inter-node link as each of `ranks_per_node` ranks of a node sees
    /// it when all of them cross at once: `inter` with its beta divided
    /// among them when they share [`Profile::inter_ports`] ports (unchanged
    /// when `inter_ports` is 0 or they are no more than the ports).
    pub fn inter_share(&self, ranks_per_node: usize) -> LinkParams {
        let mut link = self.inter;
        let l = ranks_per_node.max(1) as f64;
        if self.inter_ports > 0.0 && l > self.inter_ports {
            link.beta *= self.inter_ports / l;
        }
        link
    }

    /// The parameters that apply to a call of `shape`: this profile, with
    /// both link classes' beta capped at `beta_mem` and the copy cost raised
    /// to `copy_mem` when the call's working set exceeds `cache_bytes` (both
    /// set). On one host the "network" of
    /// the thread and shared-memory transports is the memory system: while
    /// every rank's buffers fit the last-level cache a copy runs at cache
    /// speed, beyond it at what the shared memory bus gives each port. A
    /// step, fitted by `ferrocoll calibrate`; [`predict`] applies it.
    pub fn for_shape(&self, shape: &Shape) -> Profile {
        self.for_working_set(shape.working_set())
    }

    /// [`Profile::for_shape`] for a call whose buffers total `working_set`
    /// bytes (an exchange that is not a [`Shape`], as an MoE dispatch).
    pub fn for_working_set(&self, working_set: f64) -> Profile {
        let mut p = self.clone();
        if self.cache_bytes > 0.0 && self.beta_mem > 0.0 && working_set > self.cache_bytes {
            p.intra.beta = p.intra.beta.min(self.beta_mem);
            p.inter.beta = p.inter.beta.min(self.beta_mem);
            p.copy = p.copy.max(self.copy_mem);
        }
        p
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
    /// The fit's geometric-mean error per (link class, collective,
    /// algorithm) over the sizes measured; empty in profiles written before
    /// it existed.
    #[serde(default)]
    pub algorithm_errors: Vec<AlgorithmError>,
}

/// How well the calibrated model explains one algorithm's measurements.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AlgorithmError {
    /// The link class fitted (`links` on one host; `intra-host` or
    /// `inter-host` across hosts).
    pub class: String,
    /// The collective's name.
    pub coll: String,
    /// The algorithm's name.
    pub algo: String,
    /// exp(mean |ln(predicted/measured)|) - 1 over its points.
    pub geomean_error: f64,
    /// Mean of ln(predicted/measured) as a ratio, exp(mean) - 1: the sign
    /// says whether the model is high (+) or low (-) for it.
    pub bias: f64,
    /// Points (sizes) measured.
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
            bandwidth: rounds * link.transfer(bytes, bytes),
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

    /// Bytes of every rank's input and output buffer together, as the
    /// collective defines them (`ferrocoll bench` allocates exactly these):
    /// M in and M out per rank for allreduce, C in and N·C out for
    /// allgather, N·C each way for alltoall, the root's buffer only where
    /// the others have none. Scratch is not counted.
    pub fn working_set(&self) -> f64 {
        let (n, c) = (self.n, self.count);
        let per_rank = |send: usize, recv: usize| (send + recv) as f64;
        let elements = match self.coll {
            Collective::AllReduce => n as f64 * per_rank(c, c),
            // The root's buffer serves as both; the others have one.
            Collective::Broadcast | Collective::Reduce => (n + 1) as f64 * c as f64,
            Collective::AllGather | Collective::ReduceScatter => n as f64 * per_rank(c, n * c),
            Collective::AllToAll => n as f64 * per_rank(n * c, n * c),
            Collective::Gather | Collective::Scatter => (n * c + n * c) as f64,
            Collective::AllToAllV => 2.0 * self.v_counts.iter().flatten().sum::<usize>() as f64,
            Collective::Barrier => 0.0,
        };
        elements * self.elem_size as f64
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

/// CPUs online on this host: the cores its ranks share ([`Profile::cores`],
/// as `ferrocoll calibrate` writes it). Not this process's affinity, which
/// the launcher may have narrowed to one CPU per rank. 0 if unknown.
pub fn online_cpus() -> usize {
    // SAFETY: sysconf only reads a system setting; no memory is passed.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).unwrap_or(0)
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
        return Some(Cost {
            latency: 0.0,
            bandwidth: 0.0,
            compute: copies::single_rank(algo, shape) * profile.copy,
        });
    }
    let mut profile = profile.for_shape(shape);
    if !crosses_one_rank_per_node(algo) {
        profile.inter = profile.inter_share(shape.topology.local_size());
    }
    let share = profile.core_share(busy_ranks(algo, shape));
    if share > 1.0 {
        profile.intra.beta /= share;
        profile.inter.beta /= share;
        profile.gamma *= share;
        profile.copy *= share;
    }
    let profile = &profile;
    let copies = Cost {
        latency: 0.0,
        bandwidth: 0.0,
        compute: copies::on_path(algo, shape) * profile.copy,
    };
    Some(family(algo, shape, profile)? + copies)
}

/// Whether `algo`, with ranks placed in blocks by node, has at most one rank
/// of a node sending to other nodes at a time: the ring and the pipelined
/// chain (one hop per node boundary), the binomial tree (a step whose
/// distance crosses nodes has one sender per node) and the root-based
/// star and linear forms (only the root's port is busy). Every other
/// algorithm has the ranks of a node cross at once (the inter-node levels
/// of hier, torus2d and mesh2d, the exchanges of direct, pairwise,
/// butterfly, halving-doubling, Bruck; the two rings of ring2 and the two
/// trees of the double binary tree), so with ports shared by the node
/// ([`Profile::inter_ports`]) each of them gets its share of the port.
fn crosses_one_rank_per_node(algo: Algorithm) -> bool {
    use Algorithm as A;
    matches!(algo, A::Ring | A::Pipeline | A::Tree | A::Star | A::Linear)
}

/// How many of a node's ranks `algo` keeps moving bytes at once: every rank
/// of the node for the algorithms whose rounds all have every rank send or
/// receive (rings, chains, exchanges, the double binary tree's two trees,
/// the hierarchical levels); two for the root-based star and linear forms
/// (the root and the peer it serves: the root's work is the critical path)
/// and for the binomial tree. The tree's first round pairs every rank, its
/// later ones fewer (round k pairs min(2^k, n - 2^k) ranks with as many):
/// 3 of 4 ranks on average at n = 4, but counted so (a share of 1.5 on 2
/// cores) it was over-predicted by 43-67 % in two calibrations (28-46 %
/// without the term) while the others' errors fell (bench/RESULTS.md,
/// issue 19): its critical path is the root's chain of rounds, which the
/// round-0 pairs beside it slow down only briefly.
fn busy_ranks(algo: Algorithm, shape: &Shape) -> f64 {
    use Algorithm as A;
    let local = shape.topology.local_size() as f64;
    match algo {
        A::Star | A::Linear | A::Tree => local.min(2.0),
        _ => local,
    }
}

/// The closed form of `algo`'s family, without the local copies that
/// [`copies::on_path`] adds.
fn family(algo: Algorithm, shape: &Shape, profile: &Profile) -> Option<Cost> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_written_before_copy_and_cache_load_with_defaults() {
        let old = r#"{"transport": "thread", "profile": {
            "intra": {"alpha": 3.7e-6, "beta": 1.7e10, "overhead": 6e-7},
            "inter": {"alpha": 3.7e-6, "beta": 1.7e10},
            "gamma": 0.0}, "r2": 0.9, "geomean_error": 0.55, "points": 151}"#;
        let file: ProfileFile = serde_json::from_str(old).unwrap();
        let p = file.profile;
        assert_eq!((p.copy, p.cache_bytes, p.beta_mem), (0.0, 0.0, 0.0));
        assert_eq!(p.inter.overhead, 0.0);
        assert_eq!((p.intra.piece, p.inter.piece), (0.0, 0.0));
        let shape = Shape::new(Collective::AllReduce, 4, 1 << 22, 4);
        assert_eq!(p.for_shape(&shape), p);
    }

    /// Each transport's built-in profile: TCP's own (a message through a
    /// socket costs system calls: more latency, and several times a
    /// thread's cost for each further message of a round), the others the
    /// thread transport's, with receivers copying on threads only.
    #[test]
    fn tcp_has_a_builtin_profile_of_its_own() {
        let tcp = Profile::builtin("tcp");
        assert_eq!(tcp, Profile::tcp_default());
        assert!(!tcp.receiver_copies);
        assert!(tcp.two_sided_copies);
        let thread = Profile::thread_default();
        assert!(tcp.intra.alpha > thread.intra.alpha);
        assert!(tcp.intra.overhead > 2.0 * thread.intra.overhead);
        assert_eq!(Profile::builtin("shm"), thread);
        assert_eq!(Profile::builtin("shm+tcp"), thread);
        assert!(Profile::builtin("thread").receiver_copies);
        // A 512 B allgather on 4 ranks: the thread numbers put `direct`
        // (one round of three messages) well ahead of butterfly (two rounds
        // of one); TCP's do not (a tie on latency, butterfly ahead by its
        // smaller copy).
        let shape = Shape::new(Collective::AllGather, 4, 32, 4);
        let cost = |algo, p: &Profile| predict(algo, &shape, p).unwrap().total();
        assert!(cost(Algorithm::Direct, &thread) + 1e-6 < cost(Algorithm::Butterfly, &thread));
        assert!(cost(Algorithm::Direct, &tcp) >= cost(Algorithm::Butterfly, &tcp));
        // A 2 MiB reduce on 2 ranks over TCP: the tree's one message costs
        // each end one copy; rs_gather's exchange and return cost more in
        // all. Under the larger-of-the-two rule rs_gather won, and measured
        // 1.0-3.4x the tree's time (bench/RESULTS.md, eleventh session).
        let reduce = Shape::new(Collective::Reduce, 2, 1 << 19, 4);
        let cost = |algo, p: &Profile| predict(algo, &reduce, p).unwrap().total();
        assert!(cost(Algorithm::Tree, &tcp) < cost(Algorithm::RsGather, &tcp));
        let max_rule = Profile {
            two_sided_copies: false,
            ..tcp.clone()
        };
        assert!(cost(Algorithm::Tree, &max_rule) > cost(Algorithm::RsGather, &max_rule));
    }

    #[test]
    fn two_sided_copies_halve_a_one_way_round_and_keep_an_exchange() {
        let max_rule = Profile::uniform(1e-6, 1e10, 0.0);
        let two_sided = Profile {
            two_sided_copies: true,
            ..max_rule.clone()
        };
        assert_eq!(max_rule.moved(3.0, 1.0), 3.0);
        assert_eq!(two_sided.moved(3.0, 1.0), 2.0);
        let receivers = Profile {
            receiver_copies: true,
            ..two_sided.clone()
        };
        assert_eq!(
            receivers.moved(3.0, 1.0),
            1.0,
            "receiver_copies comes first"
        );
        // 1 MiB on 2 ranks: the tree's two rounds are one way (half the
        // bytes), the ring's are exchanges (unchanged).
        let shape = Shape::new(Collective::AllReduce, 2, 1 << 18, 4);
        let bw = |algo, p: &Profile| predict(algo, &shape, p).unwrap().bandwidth;
        assert!(
            (bw(Algorithm::Tree, &two_sided) * 2.0 - bw(Algorithm::Tree, &max_rule)).abs() < 1e-15
        );
        assert_eq!(
            bw(Algorithm::Ring, &two_sided),
            bw(Algorithm::Ring, &max_rule)
        );
    }

    /// An alltoall of 64 MiB on 4 ranks: beyond a 32 MiB cache.
    fn big_a2a() -> Shape {
        Shape::new(Collective::AllToAll, 4, 1 << 22, 4)
    }

    #[test]
    fn beyond_the_cache_the_links_run_at_beta_mem() {
        let mut p = Profile::uniform(2e-6, 2e10, 0.0);
        p.cache_bytes = 32.0 * 1048576.0;
        p.beta_mem = 5e9;
        // allreduce of 1 MiB on 4 ranks: 4 x (1 + 1) MiB = 8 MiB, in cache.
        let small = Shape::new(Collective::AllReduce, 4, 1 << 18, 4);
        assert_eq!(small.working_set(), 8.0 * 1048576.0);
        assert_eq!(
            predict(Algorithm::Ring, &small, &p),
            predict(Algorithm::Ring, &small, &Profile::uniform(2e-6, 2e10, 0.0))
        );
        // 16 MiB: 128 MiB of buffers, the bandwidth term at 5 GB/s.
        let big = Shape::new(Collective::AllReduce, 4, 1 << 22, 4);
        let ring = predict(Algorithm::Ring, &big, &p).unwrap();
        let mem = predict(Algorithm::Ring, &big, &Profile::uniform(2e-6, 5e9, 0.0)).unwrap();
        assert_eq!(ring, mem);
        // A link already slower than beta_mem stays as it is.
        let mut slow = p.clone();
        slow.intra.beta = 1e9;
        slow.inter.beta = 1e9;
        assert_eq!(slow.for_shape(&big).intra.beta, 1e9);
        // The copy cost beyond the cache: copy_mem there, copy in it, and
        // copy everywhere while copy_mem is 0.
        let mut copies = p.clone();
        copies.copy = 2e-11;
        assert_eq!(copies.for_shape(&big).copy, 2e-11);
        copies.copy_mem = 9e-11;
        assert_eq!(copies.for_shape(&big).copy, 9e-11);
        assert_eq!(copies.for_shape(&small).copy, 2e-11);
        let bruck = |q: &Profile| predict(Algorithm::Bruck, &big_a2a(), q).unwrap().compute;
        assert!(
            bruck(&copies)
                > bruck(&Profile {
                    copy_mem: 0.0,
                    ..copies.clone()
                })
        );
        // allgather: C in, N·C out per rank; alltoall: N·C each way.
        let ag = Shape::new(Collective::AllGather, 4, 100, 4);
        assert_eq!(ag.working_set(), (4 * (100 + 400) * 4) as f64);
        let a2a = Shape::new(Collective::AllToAll, 4, 100, 4);
        assert_eq!(a2a.working_set(), (4 * 800 * 4) as f64);
    }

    #[test]
    fn ranks_beyond_the_cores_share_them_by_how_many_move_bytes_at_once() {
        let mut p = Profile::uniform(2e-6, 1e10, 2e-11);
        p.copy = 1e-11;
        let on = |cores: f64, algo: Algorithm, shape: &Shape| {
            predict(algo, shape, &p.clone().with_cores(cores)).unwrap()
        };
        let a2a = Shape::new(Collective::AllToAll, 4, 1 << 16, 4);
        let free = on(0.0, Algorithm::Direct, &a2a);
        // Every rank of the 4 copies at once on 2 cores: half a core each.
        let shared = on(2.0, Algorithm::Direct, &a2a);
        assert_eq!(shared.latency, free.latency);
        assert!((shared.bandwidth / free.bandwidth - 2.0).abs() < 1e-12);
        assert!((shared.compute - 2.0 * free.compute).abs() <= 1e-12 * free.compute);
        // Enough cores: nothing changes; 2 ranks on 2 cores neither.
        assert_eq!(on(4.0, Algorithm::Direct, &a2a), free);
        let two = Shape::new(Collective::AllReduce, 2, 1 << 16, 4);
        assert_eq!(
            on(2.0, Algorithm::Ring, &two),
            on(0.0, Algorithm::Ring, &two)
        );
        // The star's root works alone: the root and one peer, within 2 cores.
        let ar = Shape::new(Collective::AllReduce, 4, 1 << 16, 4);
        assert_eq!(on(2.0, Algorithm::Star, &ar), on(0.0, Algorithm::Star, &ar));
        // The binomial tree likewise (its root's chain of rounds).
        assert_eq!(on(2.0, Algorithm::Tree, &ar), on(0.0, Algorithm::Tree, &ar));
        // The double binary tree keeps every rank busy.
        let dbt = on(2.0, Algorithm::DoubleBinaryTree, &ar);
        let dbt_free = on(0.0, Algorithm::DoubleBinaryTree, &ar);
        assert!((dbt.bandwidth / dbt_free.bandwidth - 2.0).abs() < 1e-12);
        assert_eq!(p.core_share(3.0), 1.0, "cores unknown: no share");
    }

    /// A round pays its message's first piece once more: on 2 ranks a ring
    /// allreduce of M bytes is two rounds of M/2, each paying min(M/2,
    /// piece) more bytes at beta; a butterfly one round of M.
    #[test]
    fn a_round_pays_one_piece_of_its_message_once_more() {
        let mut p = Profile::uniform(1e-6, 1e10, 0.0);
        let plain = p.clone();
        p.intra.piece = 16384.0;
        p.inter.piece = 16384.0;
        for bytes in [4096usize, 32768, 1 << 20] {
            let shape = Shape::new(Collective::AllReduce, 2, bytes / 4, 4);
            let extra = |algo| {
                predict(algo, &shape, &p).unwrap().bandwidth
                    - predict(algo, &shape, &plain).unwrap().bandwidth
            };
            let m = bytes as f64;
            let want = 2.0 * (m / 2.0).min(16384.0) / 1e10;
            assert!((extra(Algorithm::Ring) - want).abs() < 1e-15, "{bytes}");
            let want = m.min(16384.0) / 1e10;
            assert!(
                (extra(Algorithm::Butterfly) - want).abs() < 1e-15,
                "{bytes}"
            );
        }
    }
}
