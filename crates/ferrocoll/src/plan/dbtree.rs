//! Double binary tree allreduce, as NCCL builds it (`ncclGetDtree` in NCCL's
//! `src/graph/trees.cc`; Sanders, Speck & Träff, "Two-tree algorithms for
//! full bandwidth broadcast, reduction and scan", 2009).
//!
//! # The trees
//!
//! Tree 1 is NCCL's `ncclGetBtree`: an in-order binary tree over ranks
//! 1..N-1 whose leaves are the odd ranks, hung under rank 0 as a root with a
//! single child. A rank r > 0 whose lowest set bit is `b` has parent
//! `(r ^ b) | 2b` (or `r ^ b` when that is N or more) and children `r - b/2`
//! and `r + b'`, `b'` the largest of `b/2, b/4, ...` that keeps it below N.
//! Rank 0's only child is the highest power of two below N.
//!
//! ```text
//!   0---------------8          N = 14 (tree 1)
//!            ______/ \______
//!           4               12
//!         /   \            /  \
//!       2       6       10     \
//!      / \     / \     /  \     \
//!     1   3   5   7   9   11    13
//! ```
//!
//! Tree 2 is tree 1 *mirrored* (rank r plays N-1-r) when N is even and
//! *shifted* by one (rank r plays r-1 mod N) when N is odd, exactly as NCCL
//! does. Then every odd rank is a leaf of tree 1 and has children in tree 2,
//! and every even rank has children in tree 1 and (for even N, or r > 0) is a
//! leaf of tree 2; for odd N, rank 0 is the single-child root of tree 1 and
//! has children in tree 2. So every rank forwards to children in only one
//! tree, except that odd-N rank 0, whose tree-1 role (send its half once,
//! receive it once) costs no more than a leaf's: the two trees run at once
//! without stacking two interior loads on one rank. Both trees have the same
//! shape, with depth D = ceil(log2 N) edges (N >= 2): the chain
//! 1 -> 2 -> 4 -> ... -> 2^(D-1) -> 0 is a path of tree 1, and none is
//! longer, since each step up at least doubles a rank's lowest set bit and
//! 2^(D-1) is the only rank in 1..N whose lowest set bit is 2^(D-1). For
//! N = 2 both trees are the single edge 0 - 1, rooted at 0 and at 1.
//!
//! # The plan
//!
//! The first ceil(M/2) elements are reduced up tree 1 and broadcast down it,
//! the other floor(M/2) up and down tree 2, both at once: a round carries the
//! ops of both trees. Each half is cut into S segments, S = ceil(bytes of
//! the larger half / 512 KiB) clamped to 1..=32 (S = 1 up to 1 MiB buffers),
//! and the segments flow through the tree level-synchronously: a rank at
//! depth d
//!
//! * receives segment j from its children in round D - d - 1 + j (the first
//!   child folds straight into the output, `out = in op incoming`, the second
//!   lands in scratch and is folded at the start of the next round, since two
//!   receives may not write the same span in one round);
//! * sends segment j to its parent in round D - d + j (a leaf sends its
//!   input);
//! * receives the reduced segment j from its parent in round D + d - 1 + j;
//! * sends it to its children in round D + d + j (the root right after
//!   folding it).
//!
//! In one round a rank touches four different segments of each half (with
//! j the one arriving from its children: j, j - 1, j - 2d, j - 2d - 1), so
//! in-flight ops never overlap, and an input segment is read only before its
//! output segment is first written, so the plan is also correct in place.
//!
//! # Cost
//!
//! * Rounds on the critical path: 2D + S - 1 with D = ceil(log2 N) (2D for
//!   small buffers, the seeds' 2 log2 N · alpha).
//! * Elements sent: in tree t a rank sends its half h_t once up (unless it is
//!   the root) and once to each child, so a leaf sends h_t and an interior
//!   rank up to 3 h_t; a rank sends at most M + 2 ceil(M/2), and all ranks
//!   together send exactly 2(N-1)·M (each of a tree's N-1 edges carries its
//!   half once up and once down).
//! * When it wins: latency logarithmic in N instead of the ring's 2(N-1)
//!   rounds, with the whole buffer still split over two trees whose interior
//!   ranks are (but for odd-N rank 0) disjoint, so it beats the ring for
//!   small and medium buffers on many ranks (NCCL's inter-node default for
//!   those); the ring's bandwidth-optimal 2(N-1)/N·M per rank wins for large
//!   buffers.
//!
//! Uneven counts: the halves differ by at most one element and each half is
//! split with [`block`], so segments differ by at most one element; segments
//! of zero elements (tiny counts) are skipped by both ends, which compute the
//! same lengths.

use super::{block, Plan, PlanBuilder, PlanRequest, RoundBuilder, Span};

/// Target segment size of the pipeline. A tree pipeline takes 2D + S - 1
/// rounds, so segments are larger than the ring chain's: fewer, fuller
/// rounds while still overlapping the reduce and the broadcast.
const SEGMENT_BYTES: usize = 512 * 1024;
/// Upper bound on segments per half, which bounds the number of rounds.
const MAX_SEGMENTS: usize = 32;

/// NCCL's `ncclGetBtree`: the parent and children of `rank` in the in-order
/// binary tree over `0..n` rooted at 0 (see the module docs).
fn btree(n: usize, rank: usize) -> (Option<usize>, [Option<usize>; 2]) {
    if n == 1 {
        return (None, [None, None]);
    }
    // Lowest set bit of the rank; for rank 0 the power of two >= n.
    let mut bit = 1;
    while bit < n && bit & rank == 0 {
        bit <<= 1;
    }
    if rank == 0 {
        return (None, [Some(bit >> 1), None]);
    }
    let mut up = (rank ^ bit) | (bit << 1);
    if up >= n {
        up = rank ^ bit;
    }
    let mut low = bit >> 1;
    // The left child is always in range (it is below the rank).
    let left = (low > 0).then(|| rank - low);
    while low > 0 && rank + low >= n {
        low >>= 1;
    }
    let right = (low > 0).then(|| rank + low);
    (Some(up), [left, right])
}

/// Parent and children of `rank` in tree `tree` (0 or 1) of NCCL's
/// `ncclGetDtree`: tree 0 is [`btree`], tree 1 is it shifted by one rank for
/// odd `n` and mirrored for even `n`.
fn dtree(n: usize, rank: usize, tree: usize) -> (Option<usize>, [Option<usize>; 2]) {
    if tree == 0 {
        return btree(n, rank);
    }
    // `to` maps a rank to the rank it plays in tree 0, `from` back.
    let odd = n % 2 == 1;
    let to = |r: usize| if odd { (r + n - 1) % n } else { n - 1 - r };
    let from = |v: usize| if odd { (v + 1) % n } else { n - 1 - v };
    let (up, down) = btree(n, to(rank));
    (up.map(&from), down.map(|c| c.map(&from)))
}

/// Edges from `rank` up to the root of tree `tree`.
fn depth(n: usize, rank: usize, tree: usize) -> usize {
    let mut d = 0;
    let mut r = rank;
    while let Some(up) = dtree(n, r, tree).0 {
        r = up;
        d += 1;
    }
    d
}

/// The depth of tree `tree` (the deepest rank's edges to the root): that of
/// rank 1 of tree 0, ceil(log2 n), for both trees, since tree 1 is tree 0
/// with the ranks renamed. Every rank's plan needs it, so walking every rank
/// (as the definition reads) made building all n plans O(n^2 log n): 35 s of
/// a 16,384-rank simulation. `tree_depth_is_the_deepest_ranks` checks it.
fn tree_depth(n: usize) -> usize {
    if n == 1 {
        0
    } else {
        depth(n, 1, 0)
    }
}

/// One tree's share of the plan: this rank's place in it and the half of
/// the buffer it carries.
struct TreeHalf {
    /// Parent rank, `None` at the root.
    parent: Option<usize>,
    /// Child ranks (zero, one or two).
    children: Vec<usize>,
    /// This rank's depth (edges to the root).
    depth: usize,
    /// The tree's depth (its deepest rank's depth).
    tree_depth: usize,
    /// First element of the half.
    base: usize,
    /// Elements in the half.
    len: usize,
    /// Segments the half is cut into (the same on every rank).
    segs: usize,
    /// Where a second child's segment lands before it is folded.
    scratch: usize,
}

impl TreeHalf {
    /// Start and length of segment `j` (in the whole buffer).
    fn seg(&self, j: usize) -> (usize, usize) {
        let (o, l) = block(self.len, self.segs, j);
        (self.base + o, l)
    }

    /// The segment handled in round `k` by the phase that starts at round
    /// `start` (segment j in round start + j), if any.
    fn seg_at(&self, k: usize, start: usize) -> Option<(usize, usize)> {
        k.checked_sub(start)
            .filter(|&j| j < self.segs)
            .map(|j| self.seg(j))
            .filter(|&(_, l)| l > 0)
    }

    /// Rounds this tree needs: the deepest leaf gets the last segment back
    /// in round 2D + S - 2.
    fn rounds(&self) -> usize {
        2 * self.tree_depth + self.segs - 1
    }

    /// Round in which this rank's children send it segment 0 (one level
    /// below it, level-synchronously from the deepest level).
    fn up_recv_start(&self) -> Option<usize> {
        // A rank with children is not at the deepest level.
        (!self.children.is_empty()).then(|| self.tree_depth - self.depth - 1)
    }

    /// Local ops of round `k`: fold the second child's segment, received
    /// the round before, into the output before it is sent on.
    fn local_ops(&self, k: usize, round: &mut RoundBuilder<'_>) {
        if self.children.len() < 2 {
            return;
        }
        let start = self.tree_depth - self.depth;
        if let Some((o, l)) = self.seg_at(k, start) {
            let out = Span::output(o, l);
            round.reduce(out, out, Span::scratch(self.scratch, l));
        }
    }

    /// Messages of round `k`, in a fixed order (children up, parent up,
    /// parent down, children down) that every rank shares.
    fn comm_ops(&self, k: usize, round: &mut RoundBuilder<'_>) {
        let (dd, d) = (self.tree_depth, self.depth);
        if let Some((o, l)) = self.up_recv_start().and_then(|s| self.seg_at(k, s)) {
            // The first child accumulates onto the input straight into the
            // output (in place: in the output itself); the second waits in
            // scratch.
            round.recv_reduce(self.children[0], Span::output(o, l), Span::input(o, l));
            if let Some(&second) = self.children.get(1) {
                round.recv(second, Span::scratch(self.scratch, l));
            }
        }
        if let Some(parent) = self.parent {
            if let Some((o, l)) = self.seg_at(k, dd - d) {
                let src = if self.children.is_empty() {
                    Span::input(o, l)
                } else {
                    Span::output(o, l)
                };
                round.send(parent, src);
            }
            if let Some((o, l)) = self.seg_at(k, dd + d - 1) {
                round.recv(parent, Span::output(o, l));
            }
        }
        if let Some((o, l)) = self.seg_at(k, dd + d) {
            for &child in &self.children {
                round.send(child, Span::output(o, l));
            }
        }
    }
}

/// Segments per half for a half of `len` elements of `elem_size` bytes (the
/// cost model uses the same rule).
pub(crate) fn segments(len: usize, elem_size: usize) -> usize {
    (len * elem_size.max(1))
        .div_ceil(SEGMENT_BYTES)
        .clamp(1, MAX_SEGMENTS)
        .min(len.max(1))
}

/// Double binary tree allreduce (see the module docs).
pub(super) fn all_reduce(req: &PlanRequest) -> Plan {
    let (n, rank, count) = (req.n, req.rank, req.count);
    let mut p = PlanBuilder::default();
    if n == 1 {
        p.round()
            .copy(Span::output(0, count), Span::input(0, count));
        return p.finish();
    }
    let (_, first) = block(count, 2, 0);
    // Both halves use the segment count of the larger one, so the segment
    // boundaries depend only on the request, which every rank shares.
    let segs = segments(first, req.elem_size);
    let mut scratch = 0;
    let halves: Vec<TreeHalf> = [(0, first), (first, count - first)]
        .into_iter()
        .enumerate()
        .map(|(tree, (base, len))| {
            let (parent, down) = dtree(n, rank, tree);
            let children: Vec<usize> = down.into_iter().flatten().collect();
            let half = TreeHalf {
                parent,
                children,
                depth: depth(n, rank, tree),
                tree_depth: tree_depth(n),
                base,
                len,
                segs,
                scratch,
            };
            if half.children.len() == 2 {
                scratch += block(len, segs, 0).1;
            }
            half
        })
        .collect();
    p.scratch(scratch);
    let rounds = halves.iter().map(TreeHalf::rounds).max().unwrap_or(0);
    for k in 0..rounds {
        let mut round = p.round();
        for h in &halves {
            h.local_ops(k, &mut round);
        }
        // Tree 1's messages before tree 2's on every rank, so that two
        // messages between the same pair in one round (N = 2) match in order.
        for h in &halves {
            h.comm_ops(k, &mut round);
        }
    }
    p.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn btree_matches_nccls_picture_for_14_ranks() {
        let parent = |r| btree(14, r).0;
        assert_eq!(btree(14, 0), (None, [Some(8), None]));
        assert_eq!(btree(14, 8), (Some(0), [Some(4), Some(12)]));
        assert_eq!(btree(14, 12), (Some(8), [Some(10), Some(13)]));
        assert_eq!(parent(13), Some(12));
        assert_eq!(parent(11), Some(10));
        assert_eq!(parent(5), Some(6));
        assert_eq!(btree(14, 7), (Some(6), [None, None]));
    }

    #[test]
    fn second_tree_is_mirrored_or_shifted_like_nccls() {
        // N = 12 mirrored: root 11, then 3 (the mirror of 8).
        assert_eq!(dtree(12, 11, 1), (None, [Some(3), None]));
        assert_eq!(dtree(12, 3, 1).0, Some(11));
        // N = 13 shifted: root 1, then 9; 0 is 12's shift, a child of 9.
        assert_eq!(dtree(13, 1, 1), (None, [Some(9), None]));
        assert_eq!(dtree(13, 0, 1).0, Some(9));
    }

    #[test]
    fn tree_depth_is_the_deepest_ranks() {
        for n in 1..=600 {
            for tree in 0..2 {
                let deepest = (0..n).map(|r| depth(n, r, tree)).max().unwrap_or(0);
                assert_eq!(tree_depth(n), deepest, "n={n} tree={tree}");
            }
        }
    }

    #[test]
    fn trees_are_spanning_and_consistent() {
        for n in 1..=40 {
            for tree in 0..2 {
                let mut roots = 0;
                for r in 0..n {
                    let (up, down) = dtree(n, r, tree);
                    match up {
                        None => roots += 1,
                        Some(u) => assert!(dtree(n, u, tree).1.contains(&Some(r))),
                    }
                    for c in down.into_iter().flatten() {
                        assert_eq!(dtree(n, c, tree).0, Some(r), "n={n} tree={tree}");
                    }
                    // depth() terminates: no cycles.
                    assert!(depth(n, r, tree) < n);
                }
                assert_eq!(roots, 1);
            }
        }
    }
}
