//! Local copies on the critical path: the bytes a plan copies between its
//! own buffers ([`crate::plan::Op::Copy`]), which [`super::predict`] charges
//! at the profile's `copy` cost per byte.
//!
//! Notation: N ranks, M the buffer in bytes (broadcast), C the per-rank
//! block in bytes (the block collectives), n_ii the alltoallv bytes a rank
//! keeps for itself.
//!
//! ```text
//! allreduce   butterfly, N a power of two                  [L odd]·M, L = log2 N
//! broadcast   tree, scatter_allgather, pipeline, direct    M
//! allgather   ring, butterfly, direct, hier                C
//!             bruck                                        (N+1)·C
//! alltoall    direct, pairwise                             C
//!             hier                                         C, or G·C when it forwards (L > 1, G > 1)
//!             bruck                                        (1 + Σ_{i=1}^{N-1} (bits(i) + runs(i)))·C
//! alltoallv   direct, pairwise, hier                       n_ii in rank i's first round ([`own`])
//! gather      linear C, tree (N+1)·C;  scatter  linear C, tree (N+1)·C
//! other allreduces, reduce, reduce-scatter, barrier        0
//! ```
//!
//! * The root of a broadcast copies its input to its output before it sends
//!   anything, so the whole path waits for it; every allgather and alltoall
//!   rank copies its own block into its output in its first round.
//! * Bruck's allgather gathers in rotated order: every rank but rank 0
//!   rotates its N blocks into rank order in a last round of its own.
//! * Bruck's alltoall packs every block that hops into the round's send
//!   buffer (bits(i) copies of block i, one per set bit of its index) and
//!   parks it in its output slot after each run of set bits, since the next
//!   round's receive overwrites the receive buffer (runs(i) copies), plus the
//!   rank's own block: the same on every rank, round by round.
//! * The binomial gather and scatter work in rotated order at the root:
//!   the root copies its own block first and rotates the N gathered blocks
//!   at the end (gather), or rotates the N blocks first and copies its own
//!   block at the end (scatter); the root is on the critical path throughout.
//! * Butterfly allreduce with an odd number L of core exchanges sends a copy
//!   of its input in the first one (its result alternates between output
//!   and scratch so that the last exchange writes the output; the first one
//!   then writes the output, which in place is the input): every rank when
//!   N is a power of two, otherwise the core ranks that serve no extra rank.
//!   With r > 0 those meet the serving ranks only after the fold, and a
//!   round's local ops run once the round has begun (as the walk times
//!   them), so the copy delays the core after the fold; `recursive.rs`
//!   charges that case.
//! * The two-level alltoall also copies the blocks for its rail peers in
//!   other nodes into the runs it forwards in the second round: G blocks in
//!   all when it forwards.
//! * alltoallv: each rank copies its own block in its first round, which
//!   the alltoallv forms time rank by rank (`direct.rs`, `hier.rs`), so it
//!   is not added here.
//! * A group of one rank copies its buffer ([`single_rank`]; the binomial
//!   gather and scatter copy it twice, in and out of their rotated order).
//!
//! With a flat topology these are exact (`tests/cost_consistency.rs` holds
//! them against the plans with a copy cost).

use super::Shape;
use crate::plan::{block, Algorithm, Collective};

/// Bytes copied locally on the critical path of `algo` for `shape`
/// (N >= 2 and a nonzero count, as [`super::predict`] ensures).
pub(super) fn on_path(algo: Algorithm, shape: &Shape) -> f64 {
    use Algorithm as A;
    use Collective as C;
    let (n, c) = (shape.n, shape.bytes());
    match (shape.coll, algo) {
        (C::AllReduce, A::Butterfly) if n.is_power_of_two() && n.ilog2() % 2 == 1 => c,
        (C::Broadcast, _) => c,
        (C::AllGather, A::Bruck) | (C::Gather | C::Scatter, A::Tree) => (n + 1) as f64 * c,
        (C::AllToAll, A::Bruck) => (1 + (1..n).map(hops_and_parks).sum::<usize>()) as f64 * c,
        (C::AllToAll, A::Hier) => {
            let (l, g) = (shape.topology.local_size(), shape.topology.nodes());
            if l > 1 && g > 1 {
                g as f64 * c
            } else {
                c
            }
        }
        (C::AllGather | C::AllToAll | C::Gather | C::Scatter, _) => c,
        _ => 0.0,
    }
}

/// Bytes the busiest rank folds from scratch: arrivals it stored in one
/// round and reduces in a later one ([`crate::plan::Op::Reduce`]), whose
/// round trip through scratch costs a copy on top of the fold (a fold on
/// arrival reads the message once). The direct reduce-scatter and
/// allreduce fold N-2 of their N-1 arrivals so (the largest block's, for
/// uneven blocks), the star's hub N-2 whole buffers, and from N = 4 on a
/// double binary tree rank with two children its second child's segments
/// (its half of the buffer). The other plans fold every arrival on arrival.
/// The cost forms charge the same bytes on their critical paths
/// (`direct.rs`, `tree.rs`).
pub(super) fn staged(algo: Algorithm, shape: &Shape) -> f64 {
    use Algorithm as A;
    use Collective as C;
    let n = shape.n;
    if n < 3 {
        return 0.0;
    }
    let e = shape.elem_size as f64;
    match (shape.coll, algo) {
        (C::ReduceScatter, A::Direct) => (n - 2) as f64 * shape.bytes(),
        (C::AllReduce, A::Direct) => (n - 2) as f64 * block(shape.count, n, 0).1 as f64 * e,
        (C::AllReduce, A::Star) => (n - 2) as f64 * shape.bytes(),
        (C::AllReduce, A::DoubleBinaryTree) if n >= 4 => block(shape.count, 2, 0).1 as f64 * e,
        _ => 0.0,
    }
}

/// Bytes rank `i` of an alltoallv copies for itself.
pub(super) fn own(shape: &Shape, i: usize) -> f64 {
    (shape.v_counts[i][i] * shape.elem_size) as f64
}

/// Bytes a group of one rank copies: its buffer from input to output
/// (nothing for a barrier; alltoallv: its block for itself; twice for the
/// binomial gather and scatter).
pub(super) fn single_rank(algo: Algorithm, shape: &Shape) -> f64 {
    match (shape.coll, algo) {
        (Collective::Barrier, _) => 0.0,
        (Collective::AllToAllV, _) => shape
            .v_counts
            .first()
            .and_then(|row| row.first())
            .map_or(0.0, |&c| (c * shape.elem_size) as f64),
        _ if shape.n > 1 => 0.0,
        (Collective::Gather | Collective::Scatter, Algorithm::Tree) => 2.0 * shape.bytes(),
        _ => shape.bytes(),
    }
}

/// Copies of Bruck's alltoall block with index `i`: one pack per set bit,
/// one park per run of set bits.
pub(super) fn hops_and_parks(i: usize) -> usize {
    let runs = (i & !(i << 1)).count_ones() as usize;
    i.count_ones() as usize + runs
}
