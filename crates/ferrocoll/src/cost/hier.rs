//! Closed forms of the topology-aware algorithms: the hierarchical family
//! (`hier`: BlueConnect allreduce, level-by-level allgather and
//! reduce-scatter, the two-level Tutel/DeepSpeed-MoE alltoall, the node-paired
//! alltoallv) and the 2-D allreduces (`torus2d`, Sony; `mesh2d`, Google).
//!
//! Notation. The topology's levels read **innermost first**: `p_0` is the
//! ranks of one node, `p_1` the nodes of a rack, ..., `N = p_0 ⋯ p_{d-1}`;
//! `P_k = p_0 ⋯ p_{k-1}` (`P_0 = 1`) and `Q_k = p_{k+1} ⋯ p_{d-1}`. Level 0
//! runs on the intra-node links, every level above on the inter-node links
//! (`α_k, β_k, o_k`, `o` the overhead of each message of a round beyond the
//! first through a port); a flat topology is one node, all intra. `M` is the buffer in
//! bytes (allreduce), `c` the per-rank block in bytes (allgather,
//! reduce-scatter, alltoall), `n_ij` the alltoallv bytes from rank `i` to
//! rank `j`, `γ` the time to reduce one byte. `G` nodes of `L` ranks for the
//! alltoalls; `R × C` the grid (`topology.grid()`: nodes × ranks per node,
//! or near-square when flat) for the 2-D algorithms, rows on intra-node
//! links, columns on inter-node links (intra when flat). A level of size 1
//! costs nothing. A round of `k` messages on one class costs
//! `α + (k-1)·o + bytes/β`; a round that uses both link classes costs the
//! slower of the two classes' costs.
//!
//! ```text
//! hier allreduce (BlueConnect, seed 002):
//!   Σ_k [ 2(p_k-1)·α_k + 2(p_k-1)/p_k · M/(P_k·β_k) + (p_k-1)/p_k · M/P_k · γ ]
//! hier allgather (outermost level first; K_k = Q_k messages a step, the
//! level-k chunk's blocks, strided):
//!   Σ_k (p_k-1)·(α_k + (K_k-1)·o_k + Q_k·c/β_k)
//! hier reduce-scatter (innermost level first; one message per block at the
//! first level, one per chunk above):
//!   (p_0-1)·(α_0 + (Q_0-1)·o_0 + Q_0·c/β_0 + Q_0·c·γ)
//!   + Σ_{k≥1} (p_k-1)·(α_k + Q_k·c/β_k + Q_k·c·γ)
//! hier alltoall (two rounds):
//!   [L>1]·(α_intra + ((L-1)·G-1)·o_intra + (L-1)·G·c/β_intra)
//!   + [G>1]·(α_inter + (G-2)·o_inter + (G-1)·L·c/β_inter)
//! hier alltoallv (G node-pair rounds, each at its busiest rank; j~i: the
//! other ranks of i's node, a_i: i's node):
//!   [L>1]·(α_intra + (L-2)·o_intra + max_i max(Σ_{j~i} n_ij, Σ_{j~i} n_ji)/β_intra)
//!   + Σ_{δ=1}^{G-1} (α_inter + (L-1)·o_inter
//!                    + max_i max(Σ_{j on a_i+δ} n_ij, Σ_{j on a_i-δ} n_ji)/β_inter)
//! torus2d (the two-level BlueConnect with p_0 = C on rows, p_1 = R on columns):
//!   2(C-1)·(α_row + M/(C·β_row)) + 2(R-1)·(α_col + M/(R·C·β_col))
//!   + [(C-1)/C + (R-1)/(R·C)]·M·γ
//! mesh2d (half A = M/2 row first, half B = M/2 column first, merged round
//! by round; written for C ≥ R, C < R swaps the roles):
//!   2·[ (R-1)·max(α_row + (A/C)/β_row, α_col + (B/R)/β_col)
//!     + (C-R)·(α_row + o_row + (A/C + B/(R·C))/β_row)
//!     + (R-1)·max(α_row + (B/(R·C))/β_row, α_col + (A/(R·C))/β_col) ]
//!   + [(C-1)/C + (R-1)/(R·C)]·M·γ
//! ```
//!
//! The ring steps of the allreduces (hier, torus2d) move one message each
//! way, so o does not appear in them. In mesh2d on a flat topology (one
//! link class) each `max(α + x/β, α + y/β)` is `α + o + (x+y)/β`: the two
//! halves' messages of a round share the port, two messages each way; the
//! middle rounds carry both halves on one ring, two messages, on any
//! topology.
//!
//! Uneven buffers: where a formula divides a buffer into blocks, the code
//! uses the largest block ([`block`]`(len, p, 0)`), level after level, which
//! is `M/(P_k·p_k)` exactly when `N` divides `M`.
//!
//! The alltoallv form charges every round at the busiest rank of that round,
//! as the textbook (seed 004) does for pairwise steps. That is an upper bound
//! of what the plans do: a node-paired round waits only for its partners, not
//! for every rank, so when the busiest ranks of successive rounds are not
//! partners the real critical path is shorter: by up to 2.8 % for the skewed
//! counts of `tests/cost_consistency.rs` (`4×3`; `G×2` with `G ≥ 8` up to
//! 1.9 %), never the other way, and the latency term is exact.

use super::{Cost, LinkParams, Profile, Shape};
use crate::plan::{block, Algorithm, Collective};

/// Closed-form cost of `algo` for `shape` on `profile`; `None` for the pairs
/// this family does not have. `shape.n >= 2` and a nonzero count (except for
/// alltoallv) are ensured by [`super::predict`].
pub(super) fn predict(algo: Algorithm, shape: &Shape, profile: &Profile) -> Option<Cost> {
    use Algorithm as A;
    use Collective as C;
    let cost = match (algo, shape.coll) {
        (A::Hier, C::AllReduce) => all_reduce(&levels(shape, profile), shape.count, shape, profile),
        (A::Hier, C::AllGather) => blocks_by_level(shape, profile, false),
        (A::Hier, C::ReduceScatter) => blocks_by_level(shape, profile, true),
        (A::Hier, C::AllToAll) => all_to_all(shape, profile),
        (A::Hier, C::AllToAllV) => all_to_all_v(shape, profile),
        (A::Torus2d, C::AllReduce) => {
            let (rows, cols) = shape.topology.grid();
            let (row, col) = grid_links(shape, profile);
            all_reduce(&[(cols, row), (rows, col)], shape.count, shape, profile)
        }
        (A::Mesh2d, C::AllReduce) => mesh2d(shape, profile),
        _ => return None,
    };
    Some(cost)
}

/// `k` rounds of `bytes` each on `link`, reducing `reduced` bytes per round.
fn steps(k: usize, bytes: f64, link: &LinkParams, reduced: f64, gamma: f64) -> Cost {
    let k = k as f64;
    Cost::rounds(k, bytes, link, k * reduced, gamma)
}

/// `k` rounds of `msgs` messages (on the busier direction) moving `bytes` in
/// all each on `link`, reducing `reduced` bytes per round:
/// `k·(α + (msgs-1)·o + bytes/β + reduced·γ)`.
fn steps_of(
    k: usize,
    msgs: usize,
    bytes: f64,
    link: &LinkParams,
    reduced: f64,
    gamma: f64,
) -> Cost {
    let k = k as f64;
    Cost {
        latency: k * (link.alpha + msgs.saturating_sub(1) as f64 * link.overhead),
        bandwidth: k * link.transfer(bytes, bytes / msgs.max(1) as f64),
        compute: k * reduced * gamma,
    }
}

/// The topology's levels innermost first, each with its link class: level 0
/// (the node) intra-node, every level above inter-node (as [`super::predict`]
/// shares it among the node's ranks: at every inter-node level each rank of
/// a node moves its own chunk at once).
fn levels(shape: &Shape, profile: &Profile) -> Vec<(usize, LinkParams)> {
    shape
        .topology
        .levels()
        .iter()
        .rev()
        .enumerate()
        .map(|(k, &p)| (p, if k == 0 { profile.intra } else { profile.inter }))
        .collect()
}

/// BlueConnect allreduce of `count` elements over `dims` (innermost first):
/// `Σ_k 2(p_k-1)·(α_k + m_k/β_k) + (p_k-1)·m_k·γ`, with `m_k` the level-`k`
/// chunk, `M/(P_k·p_k)` (exactly: the largest block of the previous level's
/// chunk). A ring reduce-scatter and, mirrored, a ring allgather per level.
fn all_reduce(
    dims: &[(usize, LinkParams)],
    count: usize,
    shape: &Shape,
    profile: &Profile,
) -> Cost {
    let e = shape.elem_size as f64;
    let mut len = count;
    let mut cost = Cost::ZERO;
    for &(p, ref link) in dims.iter().filter(|d| d.0 > 1) {
        let chunk = block(len, p, 0).1;
        let bytes = chunk as f64 * e;
        cost = cost
            + steps(p - 1, bytes, link, bytes, profile.gamma)
            + steps(p - 1, bytes, link, 0.0, profile.gamma);
        len = chunk;
    }
    cost
}

/// Hierarchical allgather (`reduce = false`) or reduce-scatter (`true`):
/// at level `k` a ring of `p_k` moves chunks of `Q_k` blocks in `K_k`
/// messages a step, `Σ_k (p_k-1)·(α_k + (K_k-1)·o_k + Q_k·c/β_k [+ Q_k·c·γ])`
/// (allgather: [`runs`], `Q_k`; reduce-scatter: `Q_k` at the first level,
/// 1 above). The order of the levels
/// (outermost first for allgather, innermost first for reduce-scatter) does
/// not change the sum.
fn blocks_by_level(shape: &Shape, profile: &Profile, reduce: bool) -> Cost {
    let c = shape.bytes();
    let dims = levels(shape, profile);
    let first = dims.iter().position(|d| d.0 > 1);
    let mut cost = Cost::ZERO;
    for (k, &(p, ref link)) in dims.iter().enumerate().filter(|(_, d)| d.0 > 1) {
        let q: usize = dims[k + 1..].iter().map(|d| d.0).product();
        let bytes = q as f64 * c;
        let (reduced, msgs) = if reduce {
            // One message per block at the first level (its chunks are
            // strided in the input), one per chunk above (scratch).
            (bytes, if Some(k) == first { q } else { 1 })
        } else {
            (0.0, runs(&dims, k))
        };
        cost = cost + steps_of(p - 1, msgs, bytes, link, reduced, profile.gamma);
    }
    cost
}

/// Messages one rank sends in the whole hierarchical allgather (as many
/// arrive): `Σ_k (p_k-1)·K_k` over the levels `sizes`, innermost first
/// ([`runs`]). For the LogGP split ([`super::loggp`]).
pub(super) fn allgather_messages(sizes: &[usize]) -> f64 {
    let link = LinkParams {
        alpha: 0.0,
        beta: 1.0,
        overhead: 0.0,
        piece: 0.0,
    };
    let dims: Vec<(usize, LinkParams)> = sizes.iter().map(|&p| (p, link)).collect();
    (0..dims.len())
        .filter(|&k| dims[k].0 > 1)
        .map(|k| ((dims[k].0 - 1) * runs(&dims, k)) as f64)
        .sum()
}

/// Messages per step of the allgather ring at level `k` (`dims` innermost
/// first): a level-`k` chunk is the blocks of the ranks that share the
/// coordinates below `k` and at `k`, outer coordinates in digit-reversed
/// order (level `k+1` most significant), and blocks of consecutive ranks
/// travel as one message. `Q_k` unless the strides of the outer levels are
/// 1 (every level below them of size 1).
fn runs(dims: &[(usize, LinkParams)], k: usize) -> usize {
    let sizes: Vec<usize> = dims.iter().map(|d| d.0).collect();
    let strides: Vec<usize> = (0..sizes.len())
        .map(|j| sizes[..j].iter().product())
        .collect();
    let tail = |j: usize| -> usize { sizes[j + 1..].iter().product() };
    let rank = |t: usize| -> usize {
        (k + 1..sizes.len())
            .map(|j| (t / tail(j)) % sizes[j] * strides[j])
            .sum()
    };
    1 + (1..tail(k)).filter(|&t| rank(t) != rank(t - 1) + 1).count()
}

/// Two-level alltoall: one intra-node round, `(L-1)·G` blocks each way, one
/// message each, then one rail round, `G-1` runs of `L` blocks each way, one
/// message each:
///
/// ```text
/// [L>1]·(α_intra + ((L-1)·G-1)·o_intra + (L-1)·G·c/β_intra)
///   + [G>1]·(α_inter + (G-2)·o_inter + (G-1)·L·c/β_inter)
/// ```
fn all_to_all(shape: &Shape, profile: &Profile) -> Cost {
    let (l, g) = (shape.topology.local_size(), shape.topology.nodes());
    let c = shape.bytes();
    let mut cost = Cost::ZERO;
    if l > 1 {
        let msgs = (l - 1) * g;
        cost = cost + steps_of(1, msgs, msgs as f64 * c, &profile.intra, 0.0, 0.0);
    }
    if g > 1 {
        let msgs = g - 1;
        cost = cost + steps_of(1, msgs, (msgs * l) as f64 * c, &profile.inter, 0.0, 0.0);
    }
    cost
}

/// Node-paired alltoallv: round 0 exchanges inside each node, round `δ`
/// sends to every rank of node `a+δ` and receives from node `a-δ`; each
/// round is charged at its busiest port,
/// `α_δ + (k_δ-1)·o_δ + max_i max(sent_i(δ), received_i(δ))/β_δ` (`k_0 =
/// L-1` messages each way, `k_δ = L` above), summed over the `G` rounds
/// (round 0 only when `L > 1`). Zero-length messages are sent too,
/// so an all-zero exchange still costs α per round. Round 0 also copies each
/// rank's block for itself (`n_ii·δ`, δ the copy cost, even when `L = 1`),
/// charged with that rank's exchange. An upper bound of the plans' critical
/// path; see the module docs.
fn all_to_all_v(shape: &Shape, profile: &Profile) -> Cost {
    let e = shape.elem_size as f64;
    let (l, g) = (shape.topology.local_size(), shape.topology.nodes());
    let v = &shape.v_counts;
    // Elements rank r sends and receives in round δ.
    let port = |r: usize, delta: usize| {
        let (a, i) = (r / l, r % l);
        let peers = |node: usize| {
            (0..l)
                .filter(move |&j| delta > 0 || j != i)
                .map(move |j| node * l + j)
        };
        let sent: usize = peers((a + delta) % g).map(|q| v[r][q]).sum();
        let received: usize = peers((a + g - delta) % g).map(|q| v[q][r]).sum();
        sent.max(received)
    };
    // Round 0 also copies each rank's own block (alone when L = 1): charged
    // rank by rank, the busiest rank's round.
    let round0 = (0..shape.n)
        .map(|r| {
            let copy = Cost {
                latency: 0.0,
                bandwidth: 0.0,
                compute: super::copies::own(shape, r) * profile.copy,
            };
            if l > 1 {
                copy + steps_of(1, l - 1, port(r, 0) as f64 * e, &profile.intra, 0.0, 0.0)
            } else {
                copy
            }
        })
        .fold(Cost::ZERO, |a, b| if b.total() > a.total() { b } else { a });
    (1..g).fold(round0, |cost, delta| {
        let busiest = (0..shape.n).map(|r| port(r, delta)).max().unwrap_or(0);
        cost + steps_of(1, l, busiest as f64 * e, &profile.inter, 0.0, 0.0)
    })
}

/// Link classes of the grid's (row, column) rings: rows are the ranks of a
/// node, columns cross nodes; on a flat topology both are intra-node.
fn grid_links(shape: &Shape, profile: &Profile) -> (LinkParams, LinkParams) {
    if shape.topology.levels().len() > 1 {
        (profile.intra, profile.inter)
    } else {
        (profile.intra, profile.intra)
    }
}

/// One round in which a rank moves `row` = (bytes, messages) on its row
/// ring and `col` on its column ring (both directions alike; `None`: that
/// ring is idle): on one shared class `α + (k-1)·o + (row+col)/β`, `k` the
/// messages of both, on two classes the slower of
/// `α_row + (k_row-1)·o_row + row/β_row` and its column counterpart.
fn row_and_column(
    shape: &Shape,
    profile: &Profile,
    row: Option<(f64, usize)>,
    col: Option<(f64, usize)>,
) -> Cost {
    let (row_link, col_link) = grid_links(shape, profile);
    if shape.topology.levels().len() == 1 {
        let (rb, rk) = row.unwrap_or((0.0, 0));
        let (cb, ck) = col.unwrap_or((0.0, 0));
        return steps_of(1, rk + ck, rb + cb, &row_link, 0.0, 0.0);
    }
    let on = |x: Option<(f64, usize)>, link| {
        x.map_or(Cost::ZERO, |(b, k)| steps_of(1, k, b, link, 0.0, 0.0))
    };
    let (r, c) = (on(row, &row_link), on(col, &col_link));
    if c.total() > r.total() {
        c
    } else {
        r
    }
}

/// `k` times `cost`.
fn times(cost: Cost, k: usize) -> Cost {
    let k = k as f64;
    Cost {
        latency: k * cost.latency,
        bandwidth: k * cost.bandwidth,
        compute: k * cost.compute,
    }
}

/// 2-D mesh allreduce: half A (`⌈M/2⌉`) runs row reduce-scatter, column
/// reduce-scatter, column allgather, row allgather; half B (`⌊M/2⌋`) the
/// same with the dimensions swapped; round `t` runs step `t` of both. With
/// `a1 = A/C`, `a2 = A/(R·C)`, `b1 = B/R`, `b2 = B/(R·C)` (exact largest
/// blocks) and `C ≥ R`, the reduce-scatter half is `R-1` rounds of
/// (row a1, column b1), `C-R` of (row a1 + b2), `R-1` of (row b2, column
/// a2); the allgather half mirrors it. For `C < R` the middle rounds are
/// (column a2 + b1). Every received byte of the first half is reduced.
fn mesh2d(shape: &Shape, profile: &Profile) -> Cost {
    let e = shape.elem_size as f64;
    let (rows, cols) = shape.topology.grid();
    let half_a = block(shape.count, 2, 0).1;
    let half_b = block(shape.count, 2, 1).1;
    let a1 = block(half_a, cols, 0).1;
    let a2 = block(a1, rows, 0).1;
    let b1 = block(half_b, rows, 0).1;
    let b2 = block(b1, cols, 0).1;
    let [a1, a2, b1, b2] = [a1, a2, b1, b2].map(|x| x as f64 * e);
    let round = |row, col| row_and_column(shape, profile, row, col);
    let (short, long) = (rows.min(cols) - 1, rows.max(cols) - 1);
    // The middle rounds carry a message of each half on the same ring.
    let middle = if cols >= rows {
        round(Some((a1 + b2, 2)), None)
    } else {
        round(None, Some((a2 + b1, 2)))
    };
    let half = times(round(Some((a1, 1)), Some((b1, 1))), short)
        + times(middle, long - short)
        + times(round(Some((b2, 1)), Some((a2, 1))), short);
    let reduced = (cols - 1) as f64 * (a1 + b2) + (rows - 1) as f64 * (a2 + b1);
    times(half, 2)
        + Cost {
            latency: 0.0,
            bandwidth: 0.0,
            compute: reduced * profile.gamma,
        }
}
