//! The small deterministic generator the randomised codecs share.
//!
//! SplitMix64 (Steele, Lea and Flood 2014; the generator `java.util.
//! SplittableRandom` uses and xoshiro's authors recommend for seeding): a
//! 64-bit counter stepped by the golden ratio and put through a 64-bit
//! finaliser. It passes BigCrush, has period 2^64, costs a few instructions,
//! and, what matters here, is fully specified by these lines, so every rank
//! (and any other implementation of the wire format) draws the same numbers
//! from the same seed. It is not a cryptographic generator and need not be.

/// SplitMix64; see the [module documentation](self).
#[derive(Clone, Debug)]
pub(crate) struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub(crate) fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    #[inline]
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..bound` (`bound > 0`), exactly: Lemire's
    /// multiply-and-shift with rejection of the few low products that would
    /// bias it ("Fast random integer generation in an interval", 2019).
    #[inline]
    pub(crate) fn below(&mut self, bound: u64) -> u64 {
        debug_assert!(bound > 0);
        let mut m = (self.next_u64() as u128) * (bound as u128);
        if (m as u64) < bound {
            // 2^64 mod bound: products whose low half falls below it belong
            // to an incomplete last interval.
            let threshold = bound.wrapping_neg() % bound;
            while (m as u64) < threshold {
                m = (self.next_u64() as u128) * (bound as u128);
            }
        }
        (m >> 64) as u64
    }

    /// Uniform in `[-1, 1)`, with 24 random bits (every value an `f32`
    /// represents exactly).
    #[inline]
    pub(crate) fn symmetric_f32(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32) * (1.0 / (1u64 << 23) as f32) - 1.0
    }
}

/// A 64-bit key from a seed and more words (a step, a stream, a length):
/// each word is folded in through the generator's finaliser, so keys that
/// differ in any word are unrelated.
pub(crate) fn key(seed: u64, words: &[u64]) -> u64 {
    words
        .iter()
        .fold(SplitMix64::new(seed).next_u64(), |k, &w| {
            SplitMix64::new(k ^ SplitMix64::new(w).next_u64()).next_u64()
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_matches_the_reference_sequence() {
        // The first outputs for seed 1234567 of the reference C
        // implementation (Vigna, prng.di.unimi.it/splitmix64.c), recomputed
        // with an independent transcription of it in Python.
        let mut g = SplitMix64::new(1_234_567);
        let got: Vec<u64> = (0..5).map(|_| g.next_u64()).collect();
        assert_eq!(
            got,
            [
                6_457_827_717_110_365_317,
                3_203_168_211_198_807_973,
                9_817_491_932_198_370_423,
                4_593_380_528_125_082_431,
                16_408_922_859_458_223_821,
            ]
        );
    }

    #[test]
    fn below_is_uniform_and_in_range() {
        let mut g = SplitMix64::new(7);
        let mut counts = [0u32; 6];
        for _ in 0..60_000 {
            counts[g.below(6) as usize] += 1;
        }
        // 10,000 expected per bin, standard deviation ~91.
        assert!(
            counts.iter().all(|&c| (9_500..10_500).contains(&c)),
            "{counts:?}"
        );
        assert!((0..1000).all(|_| g.below(1) == 0));
        assert!((0..1000).all(|_| g.below(u64::MAX) < u64::MAX));
    }

    #[test]
    fn symmetric_f32_stays_in_range() {
        let mut g = SplitMix64::new(3);
        let xs: Vec<f32> = (0..10_000).map(|_| g.symmetric_f32()).collect();
        assert!(xs.iter().all(|x| (-1.0..1.0).contains(x)));
        let mean = xs.iter().map(|&x| x as f64).sum::<f64>() / xs.len() as f64;
        assert!(mean.abs() < 0.03, "{mean}");
    }

    #[test]
    fn keys_differ_in_every_word() {
        let base = key(1, &[2, 3]);
        assert_eq!(base, key(1, &[2, 3]));
        assert_ne!(base, key(0, &[2, 3]));
        assert_ne!(base, key(1, &[3, 3]));
        assert_ne!(base, key(1, &[2, 4]));
        assert_ne!(key(1, &[2, 3]), key(1, &[3, 2]));
    }
}
