//! The LogGP view of the cost model: how much of a collective's time its
//! ranks' CPUs are busy, and how much could hide behind computation.
//!
//! # From the profile to LogGP
//!
//! LogGP (Alexandrov et al., 1995) describes a link by L, the wire latency;
//! o, the CPU time a processor spends to send or to receive one message
//! (during which it can do nothing else); g, the gap, the least time between
//! two messages leaving (or entering) one port; and G, the time per byte of a
//! long message. One message of m bytes takes o + L + (m-1)·G + o; k
//! messages through one port leave g apart. The profile's link
//! ([`LinkParams`]) prices a round with k messages on the busier direction of
//! a port as alpha + (k-1)·`overhead` + bytes/beta. Matching the two:
//!
//! * **G = 1/beta**: the bandwidth term is bytes times G (the -1 byte is
//!   noise at the sizes where G matters).
//! * **g = `overhead`**: each message beyond the first of a round adds the
//!   fitted `overhead`; in LogGP that increment is the gap between
//!   successive messages through the port.
//! * **o = g/2**: the fit cannot separate g from o, so the mapping assumes
//!   what holds on the transports ferrocoll calibrates (threads, shared
//!   memory, TCP through the kernel): no offload engine, the rank's own CPU
//!   posts every send and completes every receive, so the gap is CPU work.
//!   The calibrated rounds are exchanges, in which one further message each
//!   way is one more send and one more receive for the rank's CPU, 2·o, hence
//!   g = 2·o. (A NIC that moves data on its own has g >= 2·o; the split
//!   below is then a lower bound of what can hide.) o is further capped at
//!   alpha/2 so that L cannot be negative.
//! * **L = alpha - 2·o**: a single message costs o + L + o = alpha.
//!
//! With these, a round in which a rank has k messages each way, moves
//! `bytes`, reduces `reduced` bytes and copies `copied` bytes locally costs
//! exactly
//!
//! ```text
//! alpha + (k-1)·g + bytes·G + reduced·gamma + copied·copy
//!   = [ L + bytes·G ]  +  [ 2k·o + reduced·gamma + copied·copy ]
//!     network: hideable   CPU: busy
//! ```
//!
//! the first bracket being time the rank's CPU only waits (the wire latency
//! and the bytes in flight), the second the time it works (o for each
//! message it sends or receives, gamma for each byte it reduces, the
//! profile's copy cost for each byte it copies). A round
//! with fewer messages one way than the other leaves the CPU idle for the
//! difference, and a rank waiting for a slower partner idles too; both are
//! hideable.
//!
//! # The split
//!
//! For a collective of predicted time T ([`super::predict`]), rank r's CPU
//! is busy for cpu_r = o·(messages r sends and receives) + gamma·(bytes r
//! reduces) + copy·(bytes r copies locally), summed over its plan. Computation overlapped with the
//! collective on every rank can use T - cpu_r on rank r without delaying it
//! (as long as the rank makes progress on its messages in between, e.g. by
//! polling between compute tiles), so the part that hides is what the
//! busiest rank leaves:
//!
//! ```text
//! cpu = max_r cpu_r,   hideable = T - cpu,   hideable fraction = hideable / T.
//! ```
//!
//! [`super::walk_cpu`] computes cpu_r from the plans of all ranks, message by
//! message; [`overlap`] from closed forms of the busiest rank's messages and
//! reduced bytes, one per algorithm ([`busiest`]). `tests/cost_consistency.rs`
//! holds one against the other.
//!
//! On a topology that mixes link classes the closed form charges every
//! message at the larger of the two classes' o (an upper bound of the CPU
//! part; exact when the classes' o agree), and a round on both classes,
//! which the alpha-beta model runs in parallel, may need more CPU than it
//! lasts: the CPU part is capped at T.
//!
//! What the split does not model: on threads and shared memory the bytes
//! themselves are moved by a CPU (a memcpy by the receiver), so G is CPU
//! time there too, and only L (and the waiting) really hides; the split
//! says what an offloading transport (RDMA, a copy engine) would let hide
//! with the same alpha, beta and o.

use super::{predict, Cost, LinkParams, Profile, Shape};
use crate::plan::{block, dbtree_segments, Algorithm, Collective};

/// LogGP parameters of one link class (seconds; `per_byte` in seconds per
/// byte), mapped from its [`LinkParams`] as the module docs derive.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LogGp {
    /// L: wire latency, alpha - 2·o.
    pub latency: f64,
    /// o: CPU time to send or to receive one message, min(g, alpha)/2.
    pub overhead: f64,
    /// g: gap between successive messages through a port, the profile's
    /// `overhead`.
    pub gap: f64,
    /// G: time per byte, 1/beta.
    pub per_byte: f64,
}

impl LogGp {
    /// The LogGP view of `link` (see the module docs).
    pub fn from_link(link: &LinkParams) -> LogGp {
        let gap = link.overhead.max(0.0);
        let overhead = gap.min(link.alpha.max(0.0)) / 2.0;
        LogGp {
            latency: link.alpha - 2.0 * overhead,
            overhead,
            gap,
            per_byte: 1.0 / link.beta,
        }
    }
}

/// The LogGP split of one algorithm's predicted time (seconds).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Overlap {
    /// LogGP parameters of the link class whose o the CPU part charges:
    /// the intra-node link on one node, the inter-node link when every rank
    /// is a node of its own, otherwise the class with the larger o.
    pub loggp: LogGp,
    /// The predicted time, [`Cost::total`] of [`super::predict`].
    pub total: f64,
    /// The busiest rank's CPU time: o per message it sends or receives,
    /// gamma per byte it reduces and the copy cost per byte it copies (at
    /// most `total`).
    pub cpu: f64,
    /// `total - cpu`: time every rank's CPU is free during the collective.
    pub hideable: f64,
    /// `hideable / total` (0 for a collective that takes no time).
    pub hideable_fraction: f64,
}

/// What the busiest rank of a collective does: messages it sends and
/// receives, bytes it reduces and bytes it copies locally.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Busiest {
    /// Messages sent plus messages received.
    pub messages: f64,
    /// Bytes reduced (receive-reduce and local reductions).
    pub reduced: f64,
    /// Bytes copied locally (the profile's `copy` cost each).
    pub copied: f64,
}

impl Busiest {
    /// CPU time: `o` per message, gamma per reduced byte, the copy cost
    /// per copied byte.
    pub fn cpu(&self, o: f64, profile: &Profile) -> f64 {
        o * self.messages + profile.gamma * self.reduced + profile.copy * self.copied
    }
}

/// The LogGP parameters whose o the CPU part charges: the intra-node link
/// on one node, the inter-node link when every rank is a node of its own,
/// otherwise the class with the larger o (an upper bound).
fn charged(shape: &Shape, profile: &Profile) -> LogGp {
    let topo = &shape.topology;
    let (intra, inter) = (
        LogGp::from_link(&profile.intra),
        LogGp::from_link(&profile.inter),
    );
    if topo.nodes() <= 1 {
        intra
    } else if topo.local_size() <= 1 || inter.overhead > intra.overhead {
        inter
    } else {
        intra
    }
}

/// The LogGP split of `algo`'s predicted time for `shape` on `profile`:
/// total, the busiest rank's CPU time and the rest, which can hide behind
/// computation. `None` if the collective does not have that algorithm.
///
/// The profile's link maps to LogGP as G = 1/beta, g = `overhead` (the
/// increment of each further message of a round), o = g/2 (capped at
/// alpha/2: the rank's CPU sends and receives every message itself, so one
/// further message each way costs it 2·o) and L = alpha - 2·o ([`LogGp`]).
/// A round with k messages each way, `bytes` moved, `reduced` bytes
/// folded and `copied` bytes copied locally then costs
///
/// ```text
/// alpha + (k-1)·g + bytes/beta + reduced·gamma + copied·copy
///   = (L + bytes·G)  +  (2k·o + reduced·gamma + copied·copy)
///      on the wire       on the CPU
/// ```
///
/// Over the whole plan, rank r's CPU works cpu_r = o·(messages it sends and
/// receives) + gamma·(bytes it reduces) + copy·(bytes it copies); the rest
/// of the predicted time T, the wire's part and the waiting for partners,
/// is free for computation overlapped with the collective. The split is cpu = max_r cpu_r (capped
/// at T), hideable = T - cpu. The busiest rank's messages and bytes come
/// from closed forms ([`busiest`]) that `tests/cost_consistency.rs` holds
/// against the plans ([`super::walk_cpu`]). The derivation, with its
/// assumptions, is in the comments of `cost/loggp.rs`.
pub fn overlap(algo: Algorithm, shape: &Shape, profile: &Profile) -> Option<Overlap> {
    let total = predict(algo, shape, profile)?.total();
    let busy = busiest(algo, shape, profile)?;
    // G as the call sees it (beyond the cache, beta_mem).
    let loggp = charged(shape, &profile.for_shape(shape));
    let cpu = busy.cpu(loggp.overhead, profile).min(total);
    let hideable = total - cpu;
    Some(Overlap {
        loggp,
        total,
        cpu,
        hideable,
        hideable_fraction: if total > 0.0 { hideable / total } else { 0.0 },
    })
}

/// Closed forms of the busiest rank's messages (sent plus received),
/// reduced and copied bytes for `algo` on `shape`, the rank with the most
/// CPU time on `profile` where two ranks compete; `None` if the collective
/// does not have that algorithm.
///
/// Notation as in the family files: N ranks, D = ⌈log2 N⌉, N' = 2^⌊log2 N⌋,
/// r = N - N', L = log2 N', K = ⌈log2 N⌉, S the pipeline segments; a
/// message is one send or one receive.
///
/// ```text
/// allreduce  ring 4(N-1)  ring2 8(N-1)  tree 2D  dbtree 8S (N=2: 4S, N=3: 6S)
///            butterfly 2L [+2 if r>0]  hd 4L [+2 if r>0]  direct 4(N-1)
///            star 2(N-1)  hier Σ_k 4(p_k-1)  torus2d 4(R-1)+4(C-1)
///            mesh2d 8(R+C-2)
/// bcast      tree D  scatter_allgather D+2(N-1)  pipeline 2S (N=2: S)
///            direct N-1
/// reduce     tree D  rs_gather 3(N-1)  pipeline 2S (N=2: S)
/// allgather  ring, direct 2(N-1)  butterfly 2L [r>0: +2, +1 if r>=2]
///            bruck 2K  hier 2·Σ_k (p_k-1)·K_k
/// reducescat ring, pairwise, direct 2(N-1)  halving 2L [r>0: +3, +1 if r>=2]
///            hier 2·((p_0-1)·Q_0 + Σ_{k>0} (p_k-1))
/// alltoall   direct, pairwise 2(N-1)  bruck 2K
///            hier 2·([L>1]·(L-1)·G + [G>1]·(G-1))
/// alltoallv  direct, pairwise, hier 2(N-1)
/// gather, scatter  linear N-1  tree D
/// barrier    dissemination 2K  tree 2D
/// ```
///
/// (hier: the levels p_k innermost first, Q_k and K_k as in `cost/hier.rs`;
/// the 2-D algorithms on the R × C grid.) The busiest rank is the root for
/// the rooted trees and the star, a middle rank of the chain, a core rank
/// that serves an extra rank in the power-of-two algorithms, and any rank in
/// the symmetric ones.
///
/// Reduced bytes: the time form's compute term already follows the rank
/// that reduces the most (every rank of the symmetric algorithms, the root
/// of the trees and the star, core rank 0 of the power-of-two ones), so it
/// is reused, except for two pipelines whose critical path folds on several
/// ranks: the double binary tree (a rank with two children in one tree
/// folds both children's copy of that tree's half, 2·⌈M/2⌉; N = 2: ⌈M/2⌉;
/// N = 3: M) and the chain reduce (every rank but the head folds the whole
/// buffer once, M).
///
/// Copied bytes: those of the critical path (`cost/copies.rs`), which runs
/// through a rank that copies the most, except where two ranks compete:
/// butterfly allreduce with r > 0 (a core rank serving an extra rank:
/// 2L+2 messages, (L+1)·M reduced, no copy; one serving none: 2L messages,
/// L·M reduced, M copied if L is odd) and the chain broadcast (its root: S messages and
/// M copied; a middle rank: 2S messages).
pub fn busiest(algo: Algorithm, shape: &Shape, profile: &Profile) -> Option<Busiest> {
    let o = charged(shape, profile).overhead;
    candidates(algo, shape)?
        .into_iter()
        .max_by(|a, b| a.cpu(o, profile).total_cmp(&b.cpu(o, profile)))
}

/// The ranks that may be the busiest (see [`busiest`]).
fn candidates(algo: Algorithm, shape: &Shape) -> Option<Vec<Busiest>> {
    use Algorithm as A;
    use Collective as C;
    let algo = algo.for_collective(shape.coll)?;
    let n = shape.n;
    if n <= 1 || (shape.count == 0 && shape.coll != C::AllToAllV && shape.coll != C::Barrier) {
        return Some(vec![Busiest {
            copied: super::copies::single_rank(algo, shape),
            ..Busiest::default()
        }]);
    }
    let nf = |k: usize| k as f64;
    let d = nf(ceil_log2(n));
    let (core, r) = {
        let size = 1usize << n.ilog2();
        (size, n - size)
    };
    let l = nf(core.trailing_zeros() as usize);
    let extra = r > 0;
    let topo = &shape.topology;
    // Levels innermost first, as cost/hier.rs reads them.
    let levels: Vec<usize> = topo.levels().iter().rev().copied().collect();
    let (rows, cols) = topo.grid();
    let segments = |len: usize| {
        if shape.coll == C::AllReduce {
            dbtree_segments(len, shape.elem_size)
        } else {
            crate::plan::chain_segments(len, shape.elem_size)
        }
    };
    let messages = match (algo, shape.coll) {
        (A::Ring, C::AllReduce) | (A::Direct, C::AllReduce) => 4.0 * nf(n - 1),
        (A::Ring2, C::AllReduce) => 8.0 * nf(n - 1),
        (A::Tree, C::AllReduce) | (A::Tree, C::Barrier) => 2.0 * d,
        (A::DoubleBinaryTree, C::AllReduce) => {
            let s = nf(segments(block(shape.count, 2, 0).1));
            match n {
                2 => 4.0 * s,
                3 => 6.0 * s,
                _ => 8.0 * s,
            }
        }
        (A::Butterfly, C::AllReduce) => 2.0 * l + if extra { 2.0 } else { 0.0 },
        (A::HalvingDoubling, C::AllReduce) => 4.0 * l + if extra { 2.0 } else { 0.0 },
        (A::Star, C::AllReduce) => 2.0 * nf(n - 1),
        (A::Hier, C::AllReduce) => levels.iter().map(|&p| 4.0 * nf(p - 1)).sum(),
        (A::Torus2d, C::AllReduce) => 4.0 * nf(rows - 1) + 4.0 * nf(cols - 1),
        (A::Mesh2d, C::AllReduce) => 8.0 * nf(rows + cols - 2),
        (A::Tree, C::Broadcast | C::Reduce | C::Gather | C::Scatter) => d,
        (A::ScatterAllgather, C::Broadcast) => d + 2.0 * nf(n - 1),
        (A::Pipeline, C::Broadcast | C::Reduce) => {
            let s = nf(segments(shape.count));
            if n == 2 {
                s
            } else {
                2.0 * s
            }
        }
        (A::Direct, C::Broadcast) | (A::Linear, C::Gather | C::Scatter) => nf(n - 1),
        (A::RsGather, C::Reduce) => 3.0 * nf(n - 1),
        (
            A::Ring | A::Direct | A::Pairwise,
            C::AllGather | C::ReduceScatter | C::AllToAll | C::AllToAllV,
        )
        | (A::Hier, C::AllToAllV) => 2.0 * nf(n - 1),
        (A::Butterfly, C::AllGather) => {
            2.0 * l
                + match r {
                    0 => 0.0,
                    1 => 2.0,
                    _ => 3.0,
                }
        }
        (A::Halving, C::ReduceScatter) => {
            2.0 * l
                + match r {
                    0 => 0.0,
                    1 => 3.0,
                    _ => 4.0,
                }
        }
        (A::Bruck, C::AllGather | C::AllToAll) | (A::Dissemination, C::Barrier) => 2.0 * d,
        (A::Hier, C::AllGather) => 2.0 * super::hier::allgather_messages(&levels),
        (A::Hier, C::ReduceScatter) => {
            let mut first = true;
            let mut each_way = 0.0;
            for (k, &p) in levels.iter().enumerate().filter(|(_, &p)| p > 1) {
                let q: usize = levels[k + 1..].iter().product();
                each_way += nf(p - 1) * if first { nf(q) } else { 1.0 };
                first = false;
            }
            2.0 * each_way
        }
        (A::Hier, C::AllToAll) => {
            let (local, nodes) = (topo.local_size(), topo.nodes());
            let intra = if local > 1 {
                nf((local - 1) * nodes)
            } else {
                0.0
            };
            let inter = if nodes > 1 { nf(nodes - 1) } else { 0.0 };
            2.0 * (intra + inter)
        }
        _ => return None,
    };
    let reduced = if !shape.coll.reduces() {
        0.0
    } else {
        match algo {
            A::DoubleBinaryTree => {
                let first = block(shape.count, 2, 0).1 as f64 * shape.elem_size as f64;
                match n {
                    2 => first,
                    3 => shape.bytes(),
                    _ => 2.0 * first,
                }
            }
            A::Pipeline => shape.bytes(),
            _ => {
                predict(algo, shape, &Profile::uniform(0.0, f64::INFINITY, 1.0))
                    .unwrap_or(Cost::ZERO)
                    .compute
            }
        }
    };
    let m = shape.bytes();
    let copied = if shape.coll == C::AllToAllV {
        (0..n)
            .map(|i| super::copies::own(shape, i))
            .fold(0.0, f64::max)
    } else {
        super::copies::on_path(algo, shape) + super::copies::staged(algo, shape)
    };
    // Butterfly allreduce with L odd: a core rank that serves no extra rank
    // sends a copy of its input (cost/copies.rs).
    let odd_core_copy = if core.trailing_zeros() % 2 == 1 {
        m
    } else {
        0.0
    };
    Some(match (algo, shape.coll) {
        (A::Butterfly, C::AllReduce) if extra => vec![
            Busiest {
                messages,
                reduced,
                copied: 0.0,
            },
            Busiest {
                messages: messages - 2.0,
                reduced: reduced - m,
                copied: odd_core_copy,
            },
        ],
        (A::Butterfly, C::AllReduce) => vec![Busiest {
            messages,
            reduced,
            copied: odd_core_copy,
        }],
        (A::Pipeline, C::Broadcast) if n > 2 => vec![
            Busiest {
                messages,
                reduced,
                copied: 0.0,
            },
            Busiest {
                messages: messages / 2.0,
                reduced,
                copied,
            },
        ],
        _ => vec![Busiest {
            messages,
            reduced,
            copied,
        }],
    })
}

/// ⌈log2 n⌉ for n >= 1.
fn ceil_log2(n: usize) -> usize {
    n.next_power_of_two().trailing_zeros() as usize
}
