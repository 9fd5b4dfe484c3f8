//! Closed forms of the recursive (logarithmic-round) algorithms: butterfly
//! (recursive doubling) allreduce and allgather, Rabenseifner's
//! halving-doubling allreduce (`hd`), the recursive-halving reduce-scatter
//! (`halving`), Bruck's allgather and alltoall, and the dissemination barrier.
//!
//! Notation: N ranks; N' = 2^⌊log2 N⌋ ranks in the power-of-two core and
//! r = N - N' extra ranks; L = log2 N'; K = ⌈log2 N⌉; M the buffer in bytes
//! (allreduce); C the per-rank block in bytes (allgather, reduce-scatter,
//! alltoall); α, β the link's latency and bandwidth, o its per-message
//! overhead (each message of a round beyond the first on a port), γ the
//! reduction time per byte. Every round below has one message each way,
//! except where an o term says otherwise. With r > 0 the extra ranks fold into a core partner first and get
//! the result back last (plan/butterfly.rs, `PowerOfTwoCore`): two rounds
//! more on the critical path. S_r = Σ_{k<L} min(2^k, r) counts the extra
//! ranks' blocks that the most loaded core rank (virtual rank 0, which keeps
//! the low half and speaks for two blocks) carries through the core.
//!
//! * butterfly allreduce (recursive doubling):
//!   r = 0: L·α + L·M/β + L·M·γ;
//!   r > 0: (L+2)·α + (L+2)·M/β + (L+1)·M·γ (fold, L exchanges, result back).
//!   With L odd, add the copy of the input that the core ranks without an
//!   extra partner send in their first exchange, M·δ (δ the copy cost per
//!   byte): for r = 0 (`copies.rs`) and odd r >= 3 it adds, for even r it
//!   runs beside the fold, for r = 1 beside the return ([`butterfly_all_reduce`]).
//! * butterfly allgather:
//!   r = 0: L·α + (N-1)·C/β;
//!   r > 0: (L+2)·α + [r ≥ 2]·o + (1 + Σ_{k<L} (2^k + min(2^k, r)) + (N-1))·C/β
//!   = (L+2)·α + [r ≥ 2]·o + (N + N' - 1 + S_r)·C/β: core rank 0 speaks for
//!   its extra partner's block too, so its groups are min(2^k, r) blocks
//!   larger, and the post step returns all N-1 blocks, as two messages (the
//!   blocks before and after the extra rank's own) to every extra rank but
//!   rank 0; core virtual rank 1, which serves extra rank 2 when r ≥ 2, ends
//!   the core with rank 0, so its return pays the o.
//! * hd allreduce (Rabenseifner):
//!   r = 0: 2L·α + 2(N'-1)/N'·M/β + (N'-1)/N'·M·γ;
//!   r > 0: add 2·α + 2·M/β + M·γ (fold and return).
//!   With uneven blocks the critical path is core rank 0, which always holds
//!   the first (largest) range: m of the N' blocks hold
//!   S(m) = m·⌊count/N'⌋ + min(m, count mod N') elements, halving round k
//!   moves and reduces S(N'/2^(k+1)), doubling round k moves S(2^k).
//! * halving reduce-scatter:
//!   r = 0: L·α + (N-1)·C/β + (N-1)·C·γ;
//!   r > 0: (L+2)·α + o + (N + N' + S_r)·C/β + (N + N' - 1 + S_r)·C·γ (fold
//!   the N·C input, halve ranges that carry min(d, r) extra blocks, send C
//!   back); the last core round sends one message per final block, and core
//!   rank 0 receives two (its own and its extra partner's): the o.
//! * bruck allgather: K·α + (N-1)·C/β (round k moves min(2^k, N-2^k) blocks).
//! * bruck alltoall: K·α + Σ_{k<K} m_k·C/β, where
//!   m_k = ⌊N/2^(k+1)⌋·2^k + max(0, N mod 2^(k+1) - 2^k) is the number of
//!   indices 1 ≤ i < N with bit k set (about K·N/2 blocks in all).
//! * dissemination barrier: K·α (messages carry no data).
//!
//! These algorithms ignore placement. On a topology of several nodes (ranks
//! placed in blocks, node by node) each step is charged on the link class its
//! messages use ([`step`]): the core exchanges at small distances stay on a
//! node, the larger ones cross. A step whose pairs use both classes is charged
//! at the slower, which is exact when the critical path takes the slower
//! class in it and an upper bound otherwise. With a flat topology every rank
//! is on one node and only the intra-node link applies.

use super::{Cost, LinkParams, Profile, Shape};
use crate::plan::{Algorithm, Collective};

/// Closed-form cost of `algo` for `shape` on `profile`; `None` for the pairs
/// this family does not have. `shape.n >= 2` and a nonzero count (except for
/// the barrier) are ensured by [`super::predict`].
pub(super) fn predict(algo: Algorithm, shape: &Shape, profile: &Profile) -> Option<Cost> {
    use Algorithm as A;
    use Collective as C;
    let cost = match (algo, shape.coll) {
        (A::Butterfly, C::AllReduce) => butterfly_all_reduce(shape, profile),
        (A::Butterfly, C::AllGather) => butterfly_all_gather(shape, profile),
        (A::HalvingDoubling, C::AllReduce) => hd_all_reduce(shape, profile),
        (A::Halving, C::ReduceScatter) => halving_reduce_scatter(shape, profile),
        (A::Bruck, C::AllGather) => bruck_all_gather(shape, profile),
        (A::Bruck, C::AllToAll) => bruck_all_to_all(shape, profile),
        (A::Dissemination, C::Barrier) => dissemination_barrier(shape, profile),
        _ => return None,
    };
    Some(cost)
}

/// The link classes, `[intra-node, inter-node]`, that the messages between
/// `pairs` of ranks use under block placement.
pub(super) fn classes(shape: &Shape, pairs: impl IntoIterator<Item = (usize, usize)>) -> [bool; 2] {
    let local = shape.topology.local_size().max(1);
    let mut used = [false; 2];
    for (a, b) in pairs {
        used[usize::from(a / local != b / local)] = true;
    }
    used
}

/// One step that moves `bytes` through a rank's port and reduces `reduced`
/// bytes, one message each way exchanged between `pairs` of ranks:
/// α + bytes/β + reduced·γ on the link class the pairs use; the intra-node
/// link when the whole group is on one node, the slower class when the pairs
/// use both (see the module docs).
pub(super) fn step(
    shape: &Shape,
    profile: &Profile,
    bytes: f64,
    reduced: f64,
    pairs: impl IntoIterator<Item = (usize, usize)>,
) -> Cost {
    step_of(shape, profile, 1, bytes, reduced, pairs)
}

/// [`step`] with `messages` (k) messages on the busier direction of a
/// rank's port: α + (k-1)·o + bytes/β + reduced·γ.
fn step_of(
    shape: &Shape,
    profile: &Profile,
    messages: usize,
    bytes: f64,
    reduced: f64,
    pairs: impl IntoIterator<Item = (usize, usize)>,
) -> Cost {
    let extra = messages.saturating_sub(1) as f64;
    let on = |link: &LinkParams| Cost {
        latency: link.alpha + extra * link.overhead,
        bandwidth: link.transfer(bytes, bytes / messages.max(1) as f64),
        compute: reduced * profile.gamma,
    };
    if shape.topology.nodes() <= 1 {
        return on(&profile.intra);
    }
    match classes(shape, pairs) {
        [true, false] => on(&profile.intra),
        [false, true] => on(&profile.inter),
        _ => {
            let (intra, inter) = (on(&profile.intra), on(&profile.inter));
            if inter.total() > intra.total() {
                inter
            } else {
                intra
            }
        }
    }
}

/// The pairs of a step in which every rank i exchanges with (i + d) mod n
/// (Bruck, dissemination, pairwise).
pub(super) fn shifted(n: usize, d: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..n).map(move |i| (i, (i + d) % n))
}

/// The power-of-two core of `n` ranks: (N', r, L) with N' = 2^⌊log2 n⌋,
/// r = n - N' extra ranks and L = log2 N' core rounds.
fn core(n: usize) -> (usize, usize, usize) {
    let size = 1usize << n.ilog2();
    (size, n - size, size.trailing_zeros() as usize)
}

/// The pairs of the fold and return steps: extra rank 2i with core rank
/// 2i + 1, i < r.
fn fold_pairs(r: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..r).map(|i| (2 * i, 2 * i + 1))
}

/// The pairs of a core step at virtual distance d: virtual ranks v and
/// v xor d of the N' = `size` core ranks, virtual rank v being rank 2v + 1
/// for v < r and v + r otherwise.
fn core_pairs(size: usize, r: usize, d: usize) -> impl Iterator<Item = (usize, usize)> {
    let real = move |v: usize| if v < r { 2 * v + 1 } else { v + r };
    (0..size).map(move |v| (real(v), real(v ^ d)))
}

/// K = ⌈log2 n⌉: rounds of Bruck and dissemination.
fn ceil_log2(n: usize) -> usize {
    n.next_power_of_two().trailing_zeros() as usize
}

/// Butterfly allreduce: L exchanges of the whole buffer, each reduced;
/// with r > 0 a fold (α + M/β + M·γ) before and a return (α + M/β) after.
///
/// r = 0: L·α + L·M/β + L·M·γ; r > 0: (L+2)·α + (L+2)·M/β + (L+1)·M·γ.
///
/// With L odd the core ranks that enter with their own input send a copy of
/// it: c = M·δ (δ the copy cost) in their first round, which (as the walk
/// times rounds) runs once the round has begun, i.e. once both partners
/// have reached it. When r = 0 every rank copies: c + L exchanges
/// (`copies.rs` adds the c). With r > 0 the copying ranks are the core
/// ranks v >= r, paired in the first exchange with v xor 1:
///
/// * r even: copiers pair with copiers and copy at once, beside the fold;
///   after L rounds every core rank depends on every other's first round:
///   max(fold, c) + L exchanges + return;
/// * r = 1: v = 1 copies after meeting v = 0, which has folded; the delay
///   spreads through the ranks whose virtual rank has bit 0 set, never to
///   v = 0, the only serving rank: fold + L exchanges + max(return, c);
/// * r odd >= 3: as for r = 1, but the delay reaches v = 1, which serves an
///   extra rank: fold + c + L exchanges + return.
fn butterfly_all_reduce(shape: &Shape, profile: &Profile) -> Cost {
    let (size, r, levels) = core(shape.n);
    let m = shape.bytes();
    let exchanges = (0..levels).fold(Cost::ZERO, |t, k| {
        t + step(shape, profile, m, m, core_pairs(size, r, 1 << k))
    });
    if r == 0 {
        return exchanges;
    }
    let fold = step(shape, profile, m, m, fold_pairs(r));
    let back = step(shape, profile, m, 0.0, fold_pairs(r));
    let copy = Cost {
        latency: 0.0,
        bandwidth: 0.0,
        compute: if levels % 2 == 1 {
            m * profile.copy
        } else {
            0.0
        },
    };
    let slower = |a: Cost, b: Cost| if b.total() > a.total() { b } else { a };
    if r % 2 == 0 {
        slower(fold, copy) + exchanges + back
    } else if r == 1 {
        fold + exchanges + slower(back, copy)
    } else {
        fold + copy + exchanges + back
    }
}

/// Butterfly allgather: round k exchanges the 2^k gathered blocks.
///
/// r = 0: L·α + (N-1)·C/β (Σ_{k<L} 2^k = N-1 blocks). r > 0: the fold moves
/// C, core round k on virtual rank 0 moves 2^k + min(2^k, r) blocks (its
/// group's first r virtual ranks speak for two blocks each), the return moves
/// N-1 blocks: (L+2)·α + [r ≥ 2]·o + (N + N' - 1 + S_r)·C/β.
///
/// The return is two messages (blocks before and after the extra rank's
/// own) for every extra rank but rank 0, which has no blocks before it. The
/// core ranks that serve extra ranks, virtual ranks 0..r, all end the core
/// together in a flat group (virtual ranks below 2^(k+1) are in the largest
/// exchange of round k), so with r ≥ 2 the return pays one o.
///
/// Local copies: every rank copies its own block first (C·δ, `copies.rs`);
/// with r odd and at least 3, see the return.
fn butterfly_all_gather(shape: &Shape, profile: &Profile) -> Cost {
    let (size, r, levels) = core(shape.n);
    let c = shape.bytes();
    let exchanges = (0..levels).fold(Cost::ZERO, |t, k| {
        let blocks = (1usize << k) + (1usize << k).min(r);
        t + step(
            shape,
            profile,
            blocks as f64 * c,
            0.0,
            core_pairs(size, r, 1 << k),
        )
    });
    if r == 0 {
        return exchanges;
    }
    let all = (shape.n - 1) as f64 * c;
    // Extra rank 0 gets one message back, the others two.
    let first = step(shape, profile, all, 0.0, fold_pairs(1));
    let back = if r >= 2 {
        let mut others = step_of(shape, profile, 2, all, 0.0, fold_pairs(r).skip(1));
        if r % 2 == 1 {
            // Core virtual rank r copies its own block (`copies.rs`) only
            // once its first partner, r - 1, has folded; through the
            // butterfly that delay reaches virtual rank 1 (the bits of r
            // xor 1 are all above bit 0), which returns to extra rank 2.
            // The delay travels with exchanges smaller than virtual rank
            // 0's, so adding it to these is an upper bound: within 3.5 % of
            // the plans for N <= 64 (tests/cost_consistency.rs).
            others = others
                + Cost {
                    latency: 0.0,
                    bandwidth: 0.0,
                    compute: c * profile.copy,
                };
        }
        if others.total() > first.total() {
            others
        } else {
            first
        }
    } else {
        first
    };
    step(shape, profile, c, 0.0, fold_pairs(r)) + exchanges + back
}

/// Rabenseifner's allreduce: recursive-halving reduce-scatter then
/// recursive-doubling allgather over the N' blocks of the buffer, plus the
/// fold and return of the extra ranks.
///
/// Even blocks, r = 0: 2L·α + 2(N'-1)/N'·M/β + (N'-1)/N'·M·γ; r > 0 adds
/// 2·α + 2·M/β + M·γ. Uneven blocks: halving round k moves and reduces the
/// largest range of N'/2^(k+1) blocks, doubling round k moves the largest
/// range of 2^k blocks (core rank 0 holds the largest range in every round).
fn hd_all_reduce(shape: &Shape, profile: &Profile) -> Cost {
    let (size, r, levels) = core(shape.n);
    let (count, elem) = (shape.count, shape.elem_size as f64);
    // S(m): elements of the first m of the N' blocks, the largest m-block
    // range (the first count mod N' blocks hold one element more).
    let largest = |m: usize| (m * (count / size) + m.min(count % size)) as f64 * elem;
    let halving = (0..levels).fold(Cost::ZERO, |t, k| {
        let d = size >> (k + 1);
        t + step(
            shape,
            profile,
            largest(d),
            largest(d),
            core_pairs(size, r, d),
        )
    });
    let doubling = (0..levels).fold(Cost::ZERO, |t, k| {
        t + step(
            shape,
            profile,
            largest(1 << k),
            0.0,
            core_pairs(size, r, 1 << k),
        )
    });
    if r == 0 {
        return halving + doubling;
    }
    let m = shape.bytes();
    step(shape, profile, m, m, fold_pairs(r))
        + halving
        + doubling
        + step(shape, profile, m, 0.0, fold_pairs(r))
}

/// Recursive-halving reduce-scatter of N blocks of C bytes.
///
/// r = 0: L·α + (N-1)·C/β + (N-1)·C·γ (round k halves a range of N/2^k
/// blocks). r > 0: the fold moves and reduces N·C, core round k on virtual
/// rank 0 moves and reduces its kept range of d + min(d, r) blocks
/// (d = N'/2^(k+1)), the return moves C:
/// (L+2)·α + o + (N + N' + S_r)·C/β + (N + N' - 1 + S_r)·C·γ.
///
/// The last core round sends one message per final block: core rank 0,
/// which with r > 0 speaks for two blocks, receives two (an o more).
fn halving_reduce_scatter(shape: &Shape, profile: &Profile) -> Cost {
    let (size, r, levels) = core(shape.n);
    let c = shape.bytes();
    let halving = (0..levels).fold(Cost::ZERO, |t, k| {
        let d = size >> (k + 1);
        let b = (d + d.min(r)) as f64 * c;
        // The last round (d = 1): one message per block, 1 + min(1, r).
        let messages = if d == 1 { 1 + r.min(1) } else { 1 };
        t + step_of(shape, profile, messages, b, b, core_pairs(size, r, d))
    });
    if r == 0 {
        return halving;
    }
    let all = shape.n as f64 * c;
    step(shape, profile, all, all, fold_pairs(r))
        + halving
        + step(shape, profile, c, 0.0, fold_pairs(r))
}

/// Bruck allgather: round k (distance d = 2^k) moves min(d, N-d) blocks;
/// K·α + (N-1)·C/β. The final rotation is a local copy (free).
fn bruck_all_gather(shape: &Shape, profile: &Profile) -> Cost {
    let n = shape.n;
    (0..ceil_log2(n)).fold(Cost::ZERO, |t, k| {
        let d = 1usize << k;
        t + step(
            shape,
            profile,
            d.min(n - d) as f64 * shape.bytes(),
            0.0,
            shifted(n, d),
        )
    })
}

/// Bruck alltoall: round k moves the m_k blocks whose index has bit k set,
/// m_k = ⌊N/2^(k+1)⌋·2^k + max(0, N mod 2^(k+1) - 2^k);
/// K·α + Σ_k m_k·C/β. Packing and unpacking are local copies (free).
fn bruck_all_to_all(shape: &Shape, profile: &Profile) -> Cost {
    let n = shape.n;
    (0..ceil_log2(n)).fold(Cost::ZERO, |t, k| {
        let (bit, period) = (1usize << k, 2usize << k);
        let blocks = n / period * bit + (n % period).saturating_sub(bit);
        t + step(
            shape,
            profile,
            blocks as f64 * shape.bytes(),
            0.0,
            shifted(n, bit),
        )
    })
}

/// Dissemination barrier: K = ⌈log2 N⌉ rounds of empty messages, K·α.
fn dissemination_barrier(shape: &Shape, profile: &Profile) -> Cost {
    (0..ceil_log2(shape.n)).fold(Cost::ZERO, |t, k| {
        t + step(shape, profile, 0.0, 0.0, shifted(shape.n, 1 << k))
    })
}
