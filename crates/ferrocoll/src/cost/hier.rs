//! Closed forms of the topology-aware algorithms: the hierarchical family
//! (`hier`: BlueConnect allreduce, level-by-level allgather and
//! reduce-scatter, the two-level Tutel/DeepSpeed-MoE alltoall, the node-paired
//! alltoallv) and the 2-D allreduces (`torus2d`, Sony; `mesh2d`, Google).
//!
//! Notation. The topology's levels read **innermost first**: `p_0` is the
//! ranks of one node, `p_1` the nodes of a rack, ..., `N = p_0 ⋯ p_{d-1}`;
//! `P_k = p_0 ⋯ p_{k-1}` (`P_0 = 1`) and `Q_k = p_{k+1} ⋯ p_{d-1}`. Level 0
//! runs on the intra-node links, every level above on the inter-node links
//! (`α_k, β_k`); a flat topology is one node, all intra. `M` is the buffer in
//! bytes (allreduce), `c` the per-rank block in bytes (allgather,
//! reduce-scatter, alltoall), `n_ij` the alltoallv bytes from rank `i` to
//! rank `j`, `γ` the time to reduce one byte. `G` nodes of `L` ranks for the
//! alltoalls; `R × C` the grid (`topology.grid()`: nodes × ranks per node,
//! or near-square when flat) for the 2-D algorithms, rows on intra-node
//! links, columns on inter-node links (intra when flat). A level of size 1
//! costs nothing. A round that uses both link classes costs the slower of
//! `α_intra + bytes_intra/β_intra` and `α_inter + bytes_inter/β_inter`.
//!
//! ```text
//! hier allreduce (BlueConnect, seed 002):
//!   Σ_k [ 2(p_k-1)·α_k + 2(p_k-1)/p_k · M/(P_k·β_k) + (p_k-1)/p_k · M/P_k · γ ]
//! hier allgather (outermost level first):
//!   Σ_k (p_k-1)·(α_k + Q_k·c/β_k)
//! hier reduce-scatter (innermost level first):
//!   Σ_k (p_k-1)·(α_k + Q_k·c/β_k + Q_k·c·γ)
//! hier alltoall (two rounds):
//!   [L>1]·(α_intra + (L-1)·G·c/β_intra) + [G>1]·(α_inter + (G-1)·L·c/β_inter)
//! hier alltoallv (G node-pair rounds, each at its busiest rank; j~i: the
//! other ranks of i's node, a_i: i's node):
//!   [L>1]·(α_intra + max_i max(Σ_{j~i} n_ij, Σ_{j~i} n_ji)/β_intra)
//!   + Σ_{δ=1}^{G-1} (α_inter + max_i max(Σ_{j on a_i+δ} n_ij, Σ_{j on a_i-δ} n_ji)/β_inter)
//! torus2d (the two-level BlueConnect with p_0 = C on rows, p_1 = R on columns):
//!   2(C-1)·(α_row + M/(C·β_row)) + 2(R-1)·(α_col + M/(R·C·β_col))
//!   + [(C-1)/C + (R-1)/(R·C)]·M·γ
//! mesh2d (half A = M/2 row first, half B = M/2 column first, merged round
//! by round; written for C ≥ R, C < R swaps the roles):
//!   2·[ (R-1)·max(α_row + (A/C)/β_row, α_col + (B/R)/β_col)
//!     + (C-R)·(α_row + (A/C + B/(R·C))/β_row)
//!     + (R-1)·max(α_row + (B/(R·C))/β_row, α_col + (A/(R·C))/β_col) ]
//!   + [(C-1)/C + (R-1)/(R·C)]·M·γ
//! ```
//!
//! In mesh2d on a flat topology (one link class) each
//! `max(α + x/β, α + y/β)` is `α + (x+y)/β`: the two halves' messages of a
//! round share the port.
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

/// The topology's levels innermost first, each with its link class: level 0
/// (the node) intra-node, every level above inter-node.
fn levels<'p>(shape: &Shape, profile: &'p Profile) -> Vec<(usize, &'p LinkParams)> {
    shape
        .topology
        .levels()
        .iter()
        .rev()
        .enumerate()
        .map(|(k, &p)| {
            (
                p,
                if k == 0 {
                    &profile.intra
                } else {
                    &profile.inter
                },
            )
        })
        .collect()
}

/// BlueConnect allreduce of `count` elements over `dims` (innermost first):
/// `Σ_k 2(p_k-1)·(α_k + m_k/β_k) + (p_k-1)·m_k·γ`, with `m_k` the level-`k`
/// chunk, `M/(P_k·p_k)` (exactly: the largest block of the previous level's
/// chunk). A ring reduce-scatter and, mirrored, a ring allgather per level.
fn all_reduce(
    dims: &[(usize, &LinkParams)],
    count: usize,
    shape: &Shape,
    profile: &Profile,
) -> Cost {
    let e = shape.elem_size as f64;
    let mut len = count;
    let mut cost = Cost::ZERO;
    for &(p, link) in dims.iter().filter(|d| d.0 > 1) {
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
/// at level `k` a ring of `p_k` moves chunks of `Q_k` blocks,
/// `Σ_k (p_k-1)·(α_k + Q_k·c/β_k [+ Q_k·c·γ])`. The order of the levels
/// (outermost first for allgather, innermost first for reduce-scatter) does
/// not change the sum.
fn blocks_by_level(shape: &Shape, profile: &Profile, reduce: bool) -> Cost {
    let c = shape.bytes();
    let dims = levels(shape, profile);
    let mut cost = Cost::ZERO;
    for (k, &(p, link)) in dims.iter().enumerate().filter(|(_, d)| d.0 > 1) {
        let q: usize = dims[k + 1..].iter().map(|d| d.0).product();
        let bytes = q as f64 * c;
        let reduced = if reduce { bytes } else { 0.0 };
        cost = cost + steps(p - 1, bytes, link, reduced, profile.gamma);
    }
    cost
}

/// Two-level alltoall: one intra-node round, `(L-1)·G` blocks each way,
/// then one rail round, `G-1` runs of `L` blocks each way:
/// `[L>1]·(α_intra + (L-1)·G·c/β_intra) + [G>1]·(α_inter + (G-1)·L·c/β_inter)`.
fn all_to_all(shape: &Shape, profile: &Profile) -> Cost {
    let (l, g) = (shape.topology.local_size(), shape.topology.nodes());
    let c = shape.bytes();
    let mut cost = Cost::ZERO;
    if l > 1 {
        cost = cost + steps(1, ((l - 1) * g) as f64 * c, &profile.intra, 0.0, 0.0);
    }
    if g > 1 {
        cost = cost + steps(1, ((g - 1) * l) as f64 * c, &profile.inter, 0.0, 0.0);
    }
    cost
}

/// Node-paired alltoallv: round 0 exchanges inside each node, round `δ`
/// sends to every rank of node `a+δ` and receives from node `a-δ`; each
/// round is charged at its busiest port,
/// `α_δ + max_i max(sent_i(δ), received_i(δ))/β_δ`, summed over the `G`
/// rounds (round 0 only when `L > 1`). Zero-length messages are sent too,
/// so an all-zero exchange still costs α per round. An upper bound of the
/// plans' critical path; see the module docs.
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
    let first = usize::from(l == 1);
    (first..g).fold(Cost::ZERO, |cost, delta| {
        let link = if delta == 0 {
            &profile.intra
        } else {
            &profile.inter
        };
        let busiest = (0..shape.n).map(|r| port(r, delta)).max().unwrap_or(0);
        cost + steps(1, busiest as f64 * e, link, 0.0, 0.0)
    })
}

/// Link classes of the grid's (row, column) rings: rows are the ranks of a
/// node, columns cross nodes; on a flat topology both are intra-node.
fn grid_links<'p>(shape: &Shape, profile: &'p Profile) -> (&'p LinkParams, &'p LinkParams) {
    if shape.topology.levels().len() > 1 {
        (&profile.intra, &profile.inter)
    } else {
        (&profile.intra, &profile.intra)
    }
}

/// One round in which a rank moves `row` bytes on its row ring and `col`
/// bytes on its column ring (both directions alike; `None`: that ring is
/// idle): on one shared class `α + (row+col)/β`, on two classes the slower
/// of `α_row + row/β_row` and `α_col + col/β_col`.
fn row_and_column(shape: &Shape, profile: &Profile, row: Option<f64>, col: Option<f64>) -> Cost {
    let (row_link, col_link) = grid_links(shape, profile);
    if shape.topology.levels().len() == 1 {
        let bytes = row.unwrap_or(0.0) + col.unwrap_or(0.0);
        return steps(1, bytes, row_link, 0.0, 0.0);
    }
    let on = |bytes: Option<f64>, link| bytes.map_or(Cost::ZERO, |b| steps(1, b, link, 0.0, 0.0));
    let (r, c) = (on(row, row_link), on(col, col_link));
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
    let middle = if cols >= rows {
        round(Some(a1 + b2), None)
    } else {
        round(None, Some(a2 + b1))
    };
    let half = times(round(Some(a1), Some(b1)), short)
        + times(middle, long - short)
        + times(round(Some(b2), Some(a2)), short);
    let reduced = (cols - 1) as f64 * (a1 + b2) + (rows - 1) as f64 * (a2 + b1);
    times(half, 2)
        + Cost {
            latency: 0.0,
            bandwidth: 0.0,
            compute: reduced * profile.gamma,
        }
}
