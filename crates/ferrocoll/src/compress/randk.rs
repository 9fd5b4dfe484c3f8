//! Random-k sparsification ([`RandK`]).

use super::rng::{key, SplitMix64};
use super::{check_encoded, get_f32, magnitude_bits, put_f32, Codec, Keep, INF_BITS};
use crate::error::Result;

/// Random-k sparsification: keep `K` elements chosen uniformly at random,
/// scaled by `n/K` so that the decoded chunk is an unbiased estimate of the
/// input (`E[decode(encode(x))] = x` over the seeds). It needs no error
/// feedback to converge, at the price of more variance than Top-k; and it
/// must not be given any: the rescaled compressor is not a contraction, and
/// the residual grows without bound. [`RandK::unscaled`] is the form for
/// [`super::ErrorFeedback`].
///
/// # Indices do not travel
///
/// The `K` positions are drawn from a key derived from the codec's seed, its
/// step and stream ([`RandK::at_step`], [`RandK::with_stream`]) and the
/// chunk's length, so every rank that holds the same codec computes the same
/// positions ([`RandK::indices`]) and only the values are sent. The
/// positions are a uniformly random `K`-subset of `0..n` (Floyd's
/// algorithm over a bitmap, `O(K + n/64)`), from the SplitMix64 generator
/// (Steele, Lea and Flood 2014) with Lemire's exact bounded draw.
///
/// Because ranks that share the codec also share the positions, their value
/// sections can be summed elementwise without decoding: the sum decodes to
/// the sum of the decoded chunks (this is what lets a collective allreduce
/// the `K` values instead of allgathering (index, value) pairs).
///
/// The caller advances the step once per training step on every rank
/// ([`RandK::at_step`]); a collective that encodes several chunks of one
/// buffer gives each its own stream (the chunk's offset, say), or chunks of
/// equal length would all keep the same positions.
///
/// # Wire format
///
/// ```text
/// [ value_0 .. value_{K-1}: f32 LE ]   x at the K positions, ascending, unscaled
/// ```
///
/// Length `4K` bytes, ratio `n/K`. Element `indices[j]` decodes to
/// `value_j * (n/K)` (the factor computed in `f64` and rounded to `f32`
/// once; 1 for the unscaled form); every other element to zero.
///
/// # Non-finite values
///
/// A kept non-finite value travels as itself. If the chunk has a non-finite
/// element that was not kept and no kept value is non-finite, `value_0` is
/// sent as NaN, so the overflow is not hidden (which element it was is
/// lost).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RandK {
    keep: Keep,
    seed: u64,
    step: u64,
    stream: u64,
    rescale: bool,
}

impl RandK {
    /// Keeps `keep` random elements of each chunk, drawn from `seed` (the
    /// same on every rank), at step 0 and stream 0.
    pub fn new(keep: Keep, seed: u64) -> Result<RandK> {
        Ok(RandK {
            keep: keep.validate("randk")?,
            seed,
            step: 0,
            stream: 0,
            rescale: true,
        })
    }

    /// The same codec without the `n/K` factor: kept values decode as they
    /// are. Biased (`E[decode] = (K/n) x`), but a contraction, which is what
    /// [`super::ErrorFeedback`] needs: with the factor, a kept element's
    /// residual is `-(n/K - 1)` times its value and grows without bound
    /// from step to step. Use the rescaled form alone, this one with error
    /// feedback.
    pub fn unscaled(self) -> RandK {
        RandK {
            rescale: false,
            ..self
        }
    }

    /// Whether kept values are multiplied by `n/K` (the unbiased form).
    pub fn rescales(&self) -> bool {
        self.rescale
    }

    /// The same codec at training step `step` (new positions each step;
    /// every rank must use the same step).
    pub fn at_step(self, step: u64) -> RandK {
        RandK { step, ..self }
    }

    /// The same codec for stream `stream`: independent positions for each
    /// chunk of a buffer that is encoded in pieces.
    pub fn with_stream(self, stream: u64) -> RandK {
        RandK { stream, ..self }
    }

    /// How many elements it keeps.
    pub fn keep(&self) -> Keep {
        self.keep
    }

    /// The shared seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The current step.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// The current stream.
    pub fn stream(&self) -> u64 {
        self.stream
    }

    /// The positions kept in a chunk of `n` elements, ascending: the same
    /// on every rank with the same seed, step and stream.
    pub fn indices(&self, n: usize) -> Vec<usize> {
        let k = self.keep.of(n);
        if k == n {
            return (0..n).collect();
        }
        let mut rng = SplitMix64::new(key(self.seed, &[self.step, self.stream, n as u64]));
        // Floyd: for j = n-k .. n-1, draw t in 0..=j; take t, or j if t is
        // already taken. Every k-subset comes out with equal probability.
        let mut taken = vec![0u64; n.div_ceil(64)];
        for j in n - k..n {
            let t = rng.below(j as u64 + 1) as usize;
            let pick = if taken[t / 64] >> (t % 64) & 1 == 1 {
                j
            } else {
                t
            };
            taken[pick / 64] |= 1 << (pick % 64);
        }
        let mut out = Vec::with_capacity(k);
        for (w, &word) in taken.iter().enumerate() {
            let mut bits = word;
            while bits != 0 {
                out.push(w * 64 + bits.trailing_zeros() as usize);
                bits &= bits - 1;
            }
        }
        out
    }

    /// The factor kept values are multiplied by when decoded: `n/K` (1 when
    /// nothing is kept, or for the [`RandK::unscaled`] form).
    pub fn scale(&self, n: usize) -> f32 {
        match self.keep.of(n) {
            0 => 1.0,
            _ if !self.rescale => 1.0,
            k => (n as f64 / k as f64) as f32,
        }
    }
}

impl Codec for RandK {
    fn name(&self) -> String {
        let unscaled = if self.rescale { "" } else { ":unscaled" };
        format!("randk:{}:{}{unscaled}", self.keep.spec(), self.seed)
    }

    fn encoded_len(&self, n: usize) -> usize {
        4 * self.keep.of(n)
    }

    fn encode(&self, src: &[f32], dst: &mut [u8]) -> Result<()> {
        check_encoded(self, src.len(), dst.len(), "an encoding")?;
        let mut kept_non_finite = false;
        for (j, &i) in self.indices(src.len()).iter().enumerate() {
            kept_non_finite |= magnitude_bits(src[i]) >= INF_BITS;
            put_f32(dst, 4 * j, src[i]);
        }
        if !dst.is_empty() && !kept_non_finite {
            let any_non_finite = src
                .iter()
                .fold(false, |any, &x| any | (magnitude_bits(x) >= INF_BITS));
            if any_non_finite {
                put_f32(dst, 0, f32::NAN);
            }
        }
        Ok(())
    }

    fn decode(&self, src: &[u8], dst: &mut [f32]) -> Result<()> {
        check_encoded(self, dst.len(), src.len(), "the encoding")?;
        let scale = self.scale(dst.len());
        dst.fill(0.0);
        for (j, &i) in self.indices(dst.len()).iter().enumerate() {
            dst[i] = get_f32(src, 4 * j) * scale;
        }
        Ok(())
    }

    fn decode_add(&self, src: &[u8], dst: &mut [f32]) -> Result<()> {
        check_encoded(self, dst.len(), src.len(), "the encoding")?;
        let scale = self.scale(dst.len());
        for (j, &i) in self.indices(dst.len()).iter().enumerate() {
            dst[i] += get_f32(src, 4 * j) * scale;
        }
        Ok(())
    }

    fn unbiased(&self) -> bool {
        self.rescale
    }

    fn granule(&self) -> Option<usize> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codec(keep: Keep, seed: u64) -> RandK {
        RandK::new(keep, seed).unwrap()
    }

    #[test]
    fn two_ranks_with_one_seed_keep_the_same_positions() {
        let rank0 = codec(Keep::Fraction(0.1), 42).at_step(5);
        let rank1 = codec(Keep::Fraction(0.1), 42).at_step(5);
        let idx = rank0.indices(10_000);
        assert_eq!(idx.len(), 1000);
        assert_eq!(idx, rank1.indices(10_000));
        assert!(idx.windows(2).all(|w| w[0] < w[1]) && *idx.last().unwrap() < 10_000);
        // Another step, stream or seed draws other positions.
        assert_ne!(idx, rank0.at_step(6).indices(10_000));
        assert_ne!(idx, rank0.with_stream(1).indices(10_000));
        assert_ne!(
            idx,
            codec(Keep::Fraction(0.1), 43).at_step(5).indices(10_000)
        );
    }

    #[test]
    fn value_sections_of_ranks_sum_without_decoding() {
        let c = codec(Keep::Count(50), 9).at_step(3);
        let a: Vec<f32> = (0..700).map(|i| (i as f32).sin()).collect();
        let b: Vec<f32> = (0..700).map(|i| (i as f32 * 0.3).cos()).collect();
        let (ea, eb) = (c.encode_to_vec(&a).unwrap(), c.encode_to_vec(&b).unwrap());
        let summed: Vec<u8> = (0..50)
            .flat_map(|j| (get_f32(&ea, 4 * j) + get_f32(&eb, 4 * j)).to_le_bytes())
            .collect();
        let ab: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        assert_eq!(summed, c.encode_to_vec(&ab).unwrap());
        let mut via_sum = vec![0f32; 700];
        c.decode(&summed, &mut via_sum).unwrap();
        let mut via_adds = vec![0f32; 700];
        c.decode_add(&ea, &mut via_adds).unwrap();
        c.decode_add(&eb, &mut via_adds).unwrap();
        // (x+y)*s vs x*s + y*s: equal up to one rounding each.
        for (p, q) in via_sum.iter().zip(&via_adds) {
            assert!((p - q).abs() <= 1e-5 * p.abs().max(1.0), "{p} vs {q}");
        }
    }

    #[test]
    fn every_position_is_kept_with_probability_k_over_n() {
        // 20,000 draws of 10 of 100: each position is kept 2,000 times in
        // expectation, standard deviation ~42.
        let (n, k, draws) = (100usize, 10usize, 20_000u64);
        let mut hits = vec![0u32; n];
        let c = codec(Keep::Count(k), 1);
        for step in 0..draws {
            for i in c.at_step(step).indices(n) {
                hits[i] += 1;
            }
        }
        assert!(
            hits.iter().all(|&h| (1_800..2_200).contains(&h)),
            "{hits:?}"
        );
    }

    #[test]
    fn the_mean_over_seeds_converges_to_the_input() {
        // Unbiasedness: E[decode] = x. Per element, the mean of S draws has
        // standard deviation |x| sqrt((n/k - 1)/S): 0.03 |x| here; allow 5.
        let (n, draws) = (64usize, 10_000u64);
        let x: Vec<f32> = (0..n).map(|i| (i as f32 - 31.5) / 8.0).collect();
        let mut sum = vec![0f64; n];
        let mut out = vec![0f32; n];
        for seed in 0..draws {
            let c = codec(Keep::Fraction(0.125), seed);
            c.decode(&c.encode_to_vec(&x).unwrap(), &mut out).unwrap();
            sum.iter_mut().zip(&out).for_each(|(s, &y)| *s += y as f64);
        }
        let sigma = ((n as f64 / 8.0 - 1.0) / draws as f64).sqrt();
        for (i, (&s, &xi)) in sum.iter().zip(&x).enumerate() {
            let mean = s / draws as f64;
            let tol = 5.0 * sigma * (xi as f64).abs() + 1e-9;
            assert!((mean - xi as f64).abs() <= tol, "{i}: mean {mean} vs {xi}");
        }
    }

    #[test]
    fn decoding_scales_by_n_over_k_and_zeroes_the_rest() {
        let c = codec(Keep::Count(4), 2);
        let x: Vec<f32> = (1..=10).map(|i| i as f32).collect();
        let wire = c.encode_to_vec(&x).unwrap();
        assert_eq!(wire.len(), 16);
        let mut out = vec![f32::NAN; 10];
        c.decode(&wire, &mut out).unwrap();
        let idx = c.indices(10);
        for (i, &y) in out.iter().enumerate() {
            let want = if idx.contains(&i) { x[i] * 2.5 } else { 0.0 };
            assert_eq!(y, want);
        }
        let mut acc = vec![1.0f32; 10];
        c.decode_add(&wire, &mut acc).unwrap();
        for (a, y) in acc.iter().zip(&out) {
            assert_eq!(*a, 1.0 + y);
        }
    }

    #[test]
    fn a_dropped_non_finite_value_still_shows() {
        let c = codec(Keep::Count(3), 5);
        let mut x = vec![1.0f32; 50];
        let idx = c.indices(50);
        let dropped = (0..50).find(|i| !idx.contains(i)).unwrap();
        x[dropped] = f32::INFINITY;
        let mut out = vec![0f32; 50];
        c.decode(&c.encode_to_vec(&x).unwrap(), &mut out).unwrap();
        assert!(out[idx[0]].is_nan());
        assert_eq!(out.iter().filter(|y| y.is_nan()).count(), 1);
        // Kept, it travels as itself.
        x[dropped] = 1.0;
        x[idx[1]] = f32::NEG_INFINITY;
        c.decode(&c.encode_to_vec(&x).unwrap(), &mut out).unwrap();
        assert_eq!(out[idx[1]], f32::NEG_INFINITY);
        assert_eq!(out[idx[0]], 1.0 * c.scale(50));
    }

    #[test]
    fn the_unscaled_form_keeps_values_as_they_are() {
        let c = codec(Keep::Count(4), 2).unscaled();
        assert!(!c.unbiased() && codec(Keep::Count(4), 2).unbiased());
        assert_eq!(c.name(), "randk:4:2:unscaled");
        let x: Vec<f32> = (1..=10).map(|i| i as f32).collect();
        let mut out = vec![0f32; 10];
        c.decode(&c.encode_to_vec(&x).unwrap(), &mut out).unwrap();
        let idx = c.indices(10);
        for (i, &y) in out.iter().enumerate() {
            assert_eq!(y, if idx.contains(&i) { x[i] } else { 0.0 });
        }
    }

    #[test]
    fn edge_lengths() {
        let c = codec(Keep::Fraction(0.5), 0);
        assert!(c.encode_to_vec(&[]).unwrap().is_empty());
        assert!(c.indices(0).is_empty());
        let all = codec(Keep::Fraction(1.0), 0);
        let x = [3.0f32, -1.0, 2.0];
        let mut out = [0f32; 3];
        all.decode(&all.encode_to_vec(&x).unwrap(), &mut out)
            .unwrap();
        assert_eq!(out, x);
        let none = codec(Keep::Count(0), 0);
        assert!(none.encode_to_vec(&x).unwrap().is_empty());
        none.decode(&[], &mut out).unwrap();
        assert_eq!(out, [0.0; 3]);
    }
}
