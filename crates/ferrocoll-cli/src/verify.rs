//! Verifiable data for `bench --check`, and the reference results.
//!
//! Every rank fills its send buffer from a formula of `(rank, index)`, so any
//! rank can regenerate any other rank's input and compute what its own output
//! must be with a naive sequential loop, independent of the library's plans
//! and kernels. The values are chosen so that every reduction is *exact* in
//! any order (the library combines in plan order, the reference in rank
//! order), so the comparison is bit for bit:
//!
//! * integers: any values; wrapping arithmetic is exact and order-independent
//!   (products use odd values, which never collapse to zero);
//! * floats, `sum`/`avg`: small non-negative integers whose total over all
//!   ranks stays within the type's exactly representable integers (2048 for
//!   f16, 256 for bf16); `avg` then divides once, as the library does;
//! * floats, `prod`: 1s and 2s, with at most as many 2s per element as the
//!   type's largest finite power of two allows (2^15 for f16);
//! * `min`/`max` and the collectives that only move data: scrambled values,
//!   distinct across ranks and positions as far as the type allows.
//!
//! alltoallv uses uneven per-peer counts that every rank can compute for
//! every pair of ranks ([`alltoallv_count`]): for an average block of `b`
//! elements, rank `s` sends rank `d` `floor(b * w / 4)` elements with
//! `w = 1 + (s + 2d) mod 7`, between `b/4` and `7b/4` (none at all for some
//! pairs when `b < 4`). Element `j` of the block for `d` is element
//! `offset(s, d) + j` of `s`'s send buffer, whose value is a hash of `s` and
//! that position, so a block from the wrong rank, for the wrong rank or at
//! the wrong offset is counted wrong.

use ferrocoll::{Collective, Element, ReduceOp};
use half::{bf16, f16};

/// What the checker needs from an element type: exact conversion of small
/// integers and the library's reduction semantics, re-implemented.
///
/// (`ferrocoll::Element` is sealed, so this is a separate trait implemented
/// for the same ten types.)
pub trait Sample: Element + Copy {
    /// `from_small(v)` is exact and distinct for every `v < DISTINCT`.
    const DISTINCT: u64;
    /// For floats, the largest integer up to which every integer is exact
    /// (so sums of non-negative integers up to it are exact). `None` for
    /// integers, whose wrapping sums are exact anyway.
    const EXACT_SUM: Option<u64>;
    /// For floats, the largest k with 2^k finite. `None` for integers.
    const MAX_POW2: Option<u64>;
    /// The element for the integer `v` (wrapping for the integer types).
    fn from_small(v: u64) -> Self;
    /// `a + b` as the library computes it.
    fn add(self, other: Self) -> Self;
    /// `a * b` as the library computes it.
    fn mul(self, other: Self) -> Self;
    /// `min(a, b)` as the library computes it.
    fn min(self, other: Self) -> Self;
    /// `max(a, b)` as the library computes it.
    fn max(self, other: Self) -> Self;
    /// The last step of `avg`: the library's division by the group size.
    fn div_count(self, n: usize) -> Self;
    /// A value that differs from `expected`, to fill receive buffers before
    /// the checked call so elements it fails to write are counted wrong.
    fn poison(expected: Self) -> Self;
}

macro_rules! sample_int {
    ($($t:ty),*) => {$(
        impl Sample for $t {
            const DISTINCT: u64 = match 1u64.checked_shl(<$t>::BITS) {
                Some(d) => d,
                None => u64::MAX,
            };
            const EXACT_SUM: Option<u64> = None;
            const MAX_POW2: Option<u64> = None;
            fn from_small(v: u64) -> Self {
                // Wrapping on purpose: distinct for v < 2^BITS.
                v as $t
            }
            fn add(self, other: Self) -> Self { self.wrapping_add(other) }
            fn mul(self, other: Self) -> Self { self.wrapping_mul(other) }
            fn min(self, other: Self) -> Self { Ord::min(self, other) }
            fn max(self, other: Self) -> Self { Ord::max(self, other) }
            fn div_count(self, n: usize) -> Self {
                // The library divides by n converted to the type, truncating;
                // a group too large for the type averages to 0.
                match <$t>::try_from(n) {
                    Ok(d) => self / d,
                    Err(_) => 0,
                }
            }
            fn poison(expected: Self) -> Self { expected.wrapping_add(1) }
        }
    )*};
}
sample_int!(i8, i32, i64, u8, u32, u64);

macro_rules! sample_float {
    ($($t:ty: $exact:expr, $pow2:expr);* $(;)?) => {$(
        impl Sample for $t {
            const DISTINCT: u64 = $exact + 1;
            const EXACT_SUM: Option<u64> = Some($exact);
            const MAX_POW2: Option<u64> = Some($pow2);
            fn from_small(v: u64) -> Self { v as $t }
            fn add(self, other: Self) -> Self { self + other }
            fn mul(self, other: Self) -> Self { self * other }
            fn min(self, other: Self) -> Self { <$t>::min(self, other) }
            fn max(self, other: Self) -> Self { <$t>::max(self, other) }
            fn div_count(self, n: usize) -> Self { self / n as $t }
            fn poison(_: Self) -> Self { <$t>::NAN }
        }
    )*};
}
sample_float!(f32: 1 << 24, 127; f64: 1 << 53, 1023);

// The 16-bit floats compute in f32 and round each result, as the library's
// kernels do.
macro_rules! sample_half {
    ($($t:ty: $exact:expr, $pow2:expr);* $(;)?) => {$(
        impl Sample for $t {
            const DISTINCT: u64 = $exact + 1;
            const EXACT_SUM: Option<u64> = Some($exact);
            const MAX_POW2: Option<u64> = Some($pow2);
            fn from_small(v: u64) -> Self { <$t>::from_f32(v as f32) }
            fn add(self, other: Self) -> Self { <$t>::from_f32(self.to_f32() + other.to_f32()) }
            fn mul(self, other: Self) -> Self { <$t>::from_f32(self.to_f32() * other.to_f32()) }
            fn min(self, other: Self) -> Self { <$t>::from_f32(self.to_f32().min(other.to_f32())) }
            fn max(self, other: Self) -> Self { <$t>::from_f32(self.to_f32().max(other.to_f32())) }
            fn div_count(self, n: usize) -> Self { <$t>::from_f32(self.to_f32() / n as f32) }
            fn poison(_: Self) -> Self { <$t>::NAN }
        }
    )*};
}
sample_half!(f16: 1 << 11, 15; bf16: 1 << 8, 127);

/// SplitMix64: a cheap, well-spread hash of one word.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A pseudo-random word for element `i` of rank `rank`'s send buffer.
fn word(rank: usize, i: usize) -> u64 {
    mix(mix(rank as u64) ^ i as u64)
}

/// Which family of values the inputs use (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Scrambled values below `T::DISTINCT`.
    Scrambled,
    /// Odd scrambled values (integer products).
    Odd,
    /// Integers in `0..=vmax` on ranks below `active`, 0 elsewhere.
    Small { vmax: u64, active: usize },
    /// 2 or 1 on ranks below `active`, 1 elsewhere.
    Pow2 { active: usize },
}

/// The input formula for one run of `bench --check`.
#[derive(Clone, Copy, Debug)]
pub struct Pattern {
    kind: Kind,
}

impl Pattern {
    /// The formula for element type `T`, reduction `op` (`None` for the
    /// collectives that only move data) and `n` ranks.
    pub fn new<T: Sample>(op: Option<ReduceOp>, n: usize) -> Pattern {
        let kind = match op {
            None | Some(ReduceOp::Min | ReduceOp::Max) => Kind::Scrambled,
            Some(ReduceOp::Prod) => match T::MAX_POW2 {
                None => Kind::Odd,
                // At most `max_pow2` ranks contribute a 2 to any element.
                Some(max_pow2) => Kind::Pow2 {
                    active: n.min(usize::try_from(max_pow2).unwrap_or(usize::MAX)),
                },
            },
            Some(ReduceOp::Sum | ReduceOp::Avg) => match T::EXACT_SUM {
                None => Kind::Scrambled,
                // n ranks of values <= vmax sum to at most n * vmax <= exact;
                // with more ranks than `exact`, only `exact` ranks add 1s.
                Some(exact) => Kind::Small {
                    vmax: (exact / n as u64).clamp(1, 4),
                    active: n.min(usize::try_from(exact).unwrap_or(usize::MAX)),
                },
            },
        };
        Pattern { kind }
    }

    /// Element `i` of rank `rank`'s send buffer.
    pub fn value<T: Sample>(&self, rank: usize, i: usize) -> T {
        let w = word(rank, i);
        let v = match self.kind {
            Kind::Scrambled => w % T::DISTINCT,
            Kind::Odd => (w % T::DISTINCT) | 1,
            Kind::Small { vmax, active } => {
                if rank < active {
                    w % (vmax + 1)
                } else {
                    0
                }
            }
            Kind::Pow2 { active } => {
                if rank < active && w % 3 == 0 {
                    2
                } else {
                    1
                }
            }
        };
        T::from_small(v)
    }

    /// Fills `buf` with rank `rank`'s send data.
    pub fn fill<T: Sample>(&self, rank: usize, buf: &mut [T]) {
        for (i, slot) in buf.iter_mut().enumerate() {
            *slot = self.value(rank, i);
        }
    }

    /// `op` over element `i` of every rank's send buffer, in rank order.
    fn reduced<T: Sample>(&self, op: ReduceOp, n: usize, i: usize) -> T {
        let combine: fn(T, T) -> T = match op {
            ReduceOp::Sum | ReduceOp::Avg => T::add,
            ReduceOp::Prod => T::mul,
            ReduceOp::Min => T::min,
            ReduceOp::Max => T::max,
        };
        let total = (1..n).fold(self.value::<T>(0, i), |acc, r| {
            combine(acc, self.value(r, i))
        });
        if op == ReduceOp::Avg {
            total.div_count(n)
        } else {
            total
        }
    }
}

/// Elements rank `src` sends rank `dst` in `bench alltoallv` for an average
/// block of `block` elements: `floor(block * w / 4)` with
/// `w = 1 + (src + 2 * dst) mod 7` (see the module docs).
pub fn alltoallv_count(src: usize, dst: usize, block: usize) -> usize {
    let w = 1 + (src % 7 + 2 * (dst % 7)) % 7;
    // floor(block * w / 4), saturating rather than overflowing for blocks
    // no machine could allocate anyway.
    (block / 4)
        .saturating_mul(w)
        .saturating_add((block % 4) * w / 4)
}

/// Rank `rank`'s `send_counts` and `recv_counts` for `bench alltoallv` on `n`
/// ranks with an average block of `block` elements, in rank order.
pub fn alltoallv_counts(n: usize, rank: usize, block: usize) -> (Vec<usize>, Vec<usize>) {
    let send = (0..n).map(|d| alltoallv_count(rank, d, block)).collect();
    let recv = (0..n).map(|s| alltoallv_count(s, rank, block)).collect();
    (send, recv)
}

/// The average send buffer of `bench alltoallv` in elements: all ranks' send
/// counts together, divided by `n` and rounded down (saturating where the
/// total would not fit a `usize`).
pub fn alltoallv_mean(n: usize, block: usize) -> usize {
    let total: u128 = (0..n)
        .flat_map(|s| (0..n).map(move |d| alltoallv_count(s, d, block) as u128))
        .sum();
    usize::try_from(total / n.max(1) as u128).unwrap_or(usize::MAX)
}

/// One call of a collective, as far as the reference needs to know it.
#[derive(Clone, Copy, Debug)]
pub struct Call {
    /// The collective.
    pub coll: Collective,
    /// The reduction (ignored by collectives that do not reduce).
    pub op: ReduceOp,
    /// Number of ranks.
    pub n: usize,
    /// This rank.
    pub rank: usize,
    /// The root (ignored by collectives without one).
    pub root: usize,
    /// Elements per rank buffer (per block for the block collectives, the
    /// average block of [`alltoallv_count`] for alltoallv).
    pub count: usize,
}

/// What this rank's receive buffer must hold after `call` when every rank's
/// send buffer was filled by `pattern` (empty where the rank receives
/// nothing: non-roots of reduce and gather).
pub fn expected<T: Sample>(pattern: &Pattern, call: &Call) -> Vec<T> {
    let Call {
        coll,
        op,
        n,
        rank,
        root,
        count: c,
    } = *call;
    let is_root = rank == root;
    match coll {
        Collective::AllReduce => (0..c).map(|i| pattern.reduced(op, n, i)).collect(),
        Collective::Reduce if is_root => (0..c).map(|i| pattern.reduced(op, n, i)).collect(),
        Collective::Reduce => Vec::new(),
        Collective::Broadcast => (0..c).map(|i| pattern.value(root, i)).collect(),
        Collective::ReduceScatter => (0..c)
            .map(|j| pattern.reduced(op, n, rank * c + j))
            .collect(),
        // Block p comes from rank p's (only) block.
        Collective::AllGather => (0..n * c).map(|k| pattern.value(k / c, k % c)).collect(),
        Collective::Gather if is_root => (0..n * c).map(|k| pattern.value(k / c, k % c)).collect(),
        Collective::Gather => Vec::new(),
        // Block p comes from block `rank` of rank p.
        Collective::AllToAll => (0..n * c)
            .map(|k| pattern.value(k / c, rank * c + k % c))
            .collect(),
        Collective::Scatter => (0..c).map(|j| pattern.value(root, rank * c + j)).collect(),
        // Block p is rank p's block for this rank: it starts after what p
        // sends ranks 0..rank.
        Collective::AllToAllV => (0..n)
            .flat_map(|p| {
                let offset: usize = (0..rank).map(|d| alltoallv_count(p, d, c)).sum();
                (0..alltoallv_count(p, rank, c)).map(move |j| pattern.value(p, offset + j))
            })
            .collect(),
        Collective::Barrier => Vec::new(),
    }
}

/// Fills `recv` with values that differ from `expected` element by element.
pub fn poison<T: Sample>(recv: &mut [T], expected: &[T]) {
    for (slot, &e) in recv.iter_mut().zip(expected) {
        *slot = T::poison(e);
    }
}

/// Number of elements of `got` that differ from `expected`.
pub fn count_wrong<T: Sample>(got: &[T], expected: &[T]) -> u64 {
    debug_assert_eq!(got.len(), expected.len());
    let differing = got.iter().zip(expected).filter(|(g, e)| g != e).count();
    (differing + got.len().abs_diff(expected.len())) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference for allreduce over `n` ranks, by the definition.
    fn allreduce_ref<T: Sample>(op: ReduceOp, n: usize, c: usize) -> Vec<T> {
        let pattern = Pattern::new::<T>(Some(op), n);
        let call = Call {
            coll: Collective::AllReduce,
            op,
            n,
            rank: 0,
            root: 0,
            count: c,
        };
        expected(&pattern, &call)
    }

    #[test]
    fn float_sums_stay_exact() {
        // Every partial sum is an integer the type holds exactly, so the
        // total equals the f64 total.
        for n in [1, 3, 64, 300, 600] {
            let pattern = Pattern::new::<bf16>(Some(ReduceOp::Sum), n);
            for i in 0..200 {
                let exact: f64 = (0..n)
                    .map(|r| f64::from(pattern.value::<bf16>(r, i).to_f32()))
                    .sum();
                assert!(exact <= 256.0, "n={n} i={i}: {exact}");
                let got = pattern.reduced::<bf16>(ReduceOp::Sum, n, i);
                assert_eq!(f64::from(got.to_f32()), exact);
            }
        }
    }

    #[test]
    fn half_products_stay_finite() {
        let r = allreduce_ref::<f16>(ReduceOp::Prod, 40, 500);
        assert!(r.iter().all(|v| v.is_finite() && v.to_f32() >= 1.0));
        assert!(
            r.iter().any(|v| v.to_f32() > 2.0),
            "products are not all trivial"
        );
    }

    #[test]
    fn integer_products_never_vanish() {
        let r = allreduce_ref::<u8>(ReduceOp::Prod, 16, 500);
        assert!(r.iter().all(|&v| v % 2 == 1));
    }

    #[test]
    fn avg_truncates_integers_and_divides_floats_once() {
        let n = 3;
        let pattern = Pattern::new::<i32>(Some(ReduceOp::Avg), n);
        let sum = pattern.reduced::<i32>(ReduceOp::Sum, n, 7);
        assert_eq!(pattern.reduced::<i32>(ReduceOp::Avg, n, 7), sum / 3);
        let pattern = Pattern::new::<f32>(Some(ReduceOp::Avg), n);
        let sum = pattern.reduced::<f32>(ReduceOp::Sum, n, 7);
        assert_eq!(pattern.reduced::<f32>(ReduceOp::Avg, n, 7), sum / 3.0);
    }

    #[test]
    fn moved_data_identifies_rank_and_position() {
        let pattern = Pattern::new::<u32>(None, 4);
        let call = Call {
            coll: Collective::AllToAll,
            op: ReduceOp::Sum,
            n: 4,
            rank: 2,
            root: 0,
            count: 5,
        };
        let out = expected::<u32>(&pattern, &call);
        assert_eq!(out.len(), 20);
        // Block 1 of rank 2's output is block 2 of rank 1's input.
        assert_eq!(out[5 + 3], pattern.value::<u32>(1, 2 * 5 + 3));
        let mut distinct = out.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), out.len());
    }

    #[test]
    fn alltoallv_counts_are_uneven_and_agree_between_peers() {
        let n = 5;
        for block in [0, 1, 3, 4, 10, 1000] {
            let all: Vec<_> = (0..n).map(|r| alltoallv_counts(n, r, block)).collect();
            for (p, (send, _)) in all.iter().enumerate() {
                for (r, (_, recv)) in all.iter().enumerate() {
                    assert_eq!(send[r], recv[p], "block {block}: {p} -> {r}");
                }
                for &c in send {
                    assert!(c >= block / 4 && c <= 7 * block / 4, "block {block}: {c}");
                }
            }
            let total: usize = all.iter().map(|(s, _)| s.iter().sum::<usize>()).sum();
            assert_eq!(alltoallv_mean(n, block), total / n);
        }
        // Small blocks include empty ones; larger ones are uneven.
        assert!(alltoallv_counts(n, 0, 1).0.contains(&0));
        let (send, _) = alltoallv_counts(n, 0, 1000);
        assert!(send.iter().any(|&c| c != send[0]), "{send:?}");
        // No overflow for huge blocks.
        assert_eq!(alltoallv_count(0, 0, usize::MAX), usize::MAX / 4);
        assert_eq!(alltoallv_count(6, 0, usize::MAX), usize::MAX);
    }

    #[test]
    fn alltoallv_reference_places_every_block() {
        let (n, block) = (4, 6);
        let pattern = Pattern::new::<u32>(None, n);
        let mut seen = Vec::new();
        for rank in 0..n {
            let call = Call {
                coll: Collective::AllToAllV,
                op: ReduceOp::Sum,
                n,
                rank,
                root: 0,
                count: block,
            };
            let out = expected::<u32>(&pattern, &call);
            let (_, recv) = alltoallv_counts(n, rank, block);
            assert_eq!(out.len(), recv.iter().sum::<usize>());
            // The block from rank 2 starts after those from ranks 0 and 1,
            // and is rank 2's block for `rank` (after its blocks for 0..rank).
            let start = recv[0] + recv[1];
            let src_off: usize = (0..rank).map(|d| alltoallv_count(2, d, block)).sum();
            for j in 0..recv[2] {
                assert_eq!(out[start + j], pattern.value::<u32>(2, src_off + j));
            }
            seen.extend(out);
        }
        // Every element sent arrives exactly once somewhere, and they are
        // all distinct: a misplaced one cannot match by accident.
        let sent: usize = (0..n)
            .map(|r| alltoallv_counts(n, r, block).0.iter().sum::<usize>())
            .sum();
        assert_eq!(seen.len(), sent);
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), sent);
    }

    #[test]
    fn poison_always_differs() {
        let e = [0u8, 255, 7];
        let mut r = [0u8; 3];
        poison(&mut r, &e);
        assert_eq!(count_wrong(&r, &e), 3);
        let e = [f16::from_f32(1.0), f16::from_f32(0.0)];
        let mut r = e;
        poison(&mut r, &e);
        assert_eq!(count_wrong(&r, &e), 2);
    }
}
