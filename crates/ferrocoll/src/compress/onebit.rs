//! 1-bit sign quantization with a scale per block ([`OneBit`]).

use super::{check_block, check_encoded, get_f32, put_f32, Codec};
use crate::error::Result;

/// 1-bit sign quantization with one scale per block: each element travels
/// as its sign, each block of `B` elements as one `f32` magnitude, the mean
/// `|x|` of the block (1-bit SGD, Seide et al. 2014; signSGD with error
/// feedback, Karimireddy et al. 2019, whose scale `||x||_1 / d` this is per
/// block). Without [`super::ErrorFeedback`] this compressor is badly biased;
/// with it, it converges.
///
/// # Wire format
///
/// Blocks of `B` elements (a multiple of 8) from the chunk's first element;
/// the last may be shorter. Block `j` is a record at byte `j (4 + B/8)`:
///
/// ```text
/// [ scale: f32 LE ][ sign bits: ceil(len/8) bytes ]
/// ```
///
/// Bit `i % 8` of byte `i / 8` (least significant first) is the sign bit of
/// element `i` of the block: 1 for negative (including `-0.0`), 0 otherwise;
/// the unused high bits of a short block's last byte are 0. Element `i`
/// decodes to `-scale` or `+scale`. Length: `4 ceil(n/B) + ceil(n/8)` bytes,
/// ratio `32B/(B+32)` (25.6 at B = 128). Whole-block records are
/// independent, so [`Codec::granule`] is `B`.
///
/// # Non-finite values
///
/// A block holding a NaN or an infinity gets the scale NaN, so the whole
/// block (and only that block) decodes to NaN: one bit per element has no
/// room to mark a single element, and a finite scale would hide the
/// overflow. The mean is accumulated in `f64`, so large finite blocks do not
/// overflow it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OneBit {
    block: usize,
}

impl OneBit {
    /// The block size [`super::parse`] uses when none is given.
    pub const DEFAULT_BLOCK: usize = 128;

    /// Sign quantization with blocks of `block` elements (a multiple of 8 in
    /// 8..=65536, so each full block's bits fill whole bytes).
    pub fn new(block: usize) -> Result<OneBit> {
        Ok(OneBit {
            block: check_block("onebit", block, 8)?,
        })
    }

    /// Elements per block.
    pub fn block(&self) -> usize {
        self.block
    }

    fn record(&self) -> usize {
        4 + self.block / 8
    }
}

/// `sum |x|` in `f64`, in eight independent lanes so that it vectorises.
/// Infinite if any element is infinite, NaN if any is NaN.
fn sum_abs(x: &[f32]) -> f64 {
    let mut lanes = [0f64; 8];
    let groups = x.chunks_exact(8);
    let tail: f64 = groups.remainder().iter().map(|v| v.abs() as f64).sum();
    for group in groups {
        for (lane, v) in lanes.iter_mut().zip(group) {
            *lane += v.abs() as f64;
        }
    }
    lanes.iter().sum::<f64>() + tail
}

/// The sign bits of up to 8 elements, element `i` at bit `i`.
#[inline(always)]
fn pack_signs(group: &[f32]) -> u8 {
    group
        .iter()
        .enumerate()
        .fold(0u8, |b, (i, v)| b | (((v.to_bits() >> 31) as u8) << i))
}

/// `+scale` or `-scale` by bit `i` of `byte`, for each element of `out`.
#[inline(always)]
fn unpack_signs(byte: u8, scale: f32, out: &mut [f32]) {
    let bits = scale.to_bits();
    for (i, d) in out.iter_mut().enumerate() {
        *d = f32::from_bits(bits ^ ((((byte >> i) & 1) as u32) << 31));
    }
}

impl Codec for OneBit {
    fn name(&self) -> String {
        format!("onebit:{}", self.block)
    }

    fn encoded_len(&self, n: usize) -> usize {
        // Full blocks fill whole bytes, so the bits of all blocks together
        // take ceil(n/8) bytes.
        4 * n.div_ceil(self.block) + n.div_ceil(8)
    }

    fn encode(&self, src: &[f32], dst: &mut [u8]) -> Result<()> {
        check_encoded(self, src.len(), dst.len(), "an encoding")?;
        for (x, rec) in src.chunks(self.block).zip(dst.chunks_mut(self.record())) {
            let sum = sum_abs(x);
            let scale = if sum.is_finite() {
                (sum / x.len() as f64) as f32
            } else {
                f32::NAN
            };
            put_f32(rec, 0, scale);
            for (byte, group) in rec[4..].iter_mut().zip(x.chunks(8)) {
                *byte = pack_signs(group);
            }
        }
        Ok(())
    }

    fn decode(&self, src: &[u8], dst: &mut [f32]) -> Result<()> {
        check_encoded(self, dst.len(), src.len(), "the encoding")?;
        for (rec, out) in src.chunks(self.record()).zip(dst.chunks_mut(self.block)) {
            let scale = get_f32(rec, 0);
            for (&byte, out) in rec[4..].iter().zip(out.chunks_mut(8)) {
                unpack_signs(byte, scale, out);
            }
        }
        Ok(())
    }

    fn decode_add(&self, src: &[u8], dst: &mut [f32]) -> Result<()> {
        check_encoded(self, dst.len(), src.len(), "the encoding")?;
        let mut signed = [0f32; 8];
        for (rec, out) in src.chunks(self.record()).zip(dst.chunks_mut(self.block)) {
            let scale = get_f32(rec, 0);
            for (&byte, out) in rec[4..].iter().zip(out.chunks_mut(8)) {
                let signed = &mut signed[..out.len()];
                unpack_signs(byte, scale, signed);
                out.iter_mut()
                    .zip(signed.iter())
                    .for_each(|(d, s)| *d += *s);
            }
        }
        Ok(())
    }

    fn granule(&self) -> Option<usize> {
        Some(self.block)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn round_trip(codec: &OneBit, src: &[f32]) -> (Vec<u8>, Vec<f32>) {
        let wire = codec.encode_to_vec(src).unwrap();
        assert_eq!(wire.len(), codec.encoded_len(src.len()));
        let mut back = vec![0f32; src.len()];
        codec.decode(&wire, &mut back).unwrap();
        (wire, back)
    }

    #[test]
    fn layout_is_scale_then_sign_bits_least_significant_first() {
        let codec = OneBit::new(8).unwrap();
        let src = [
            1.0, -2.0, 3.0, -4.0, 5.0, 6.0, 7.0, -8.0, /* block 2 */ -1.0, 3.0, -0.0,
        ];
        let (wire, back) = round_trip(&codec, &src);
        assert_eq!(wire.len(), 4 + 1 + 4 + 1);
        assert_eq!(get_f32(&wire, 0), 4.5);
        assert_eq!(wire[4], 0b1000_1010);
        assert_eq!(get_f32(&wire, 5), 4.0 / 3.0);
        assert_eq!(wire[9], 0b0000_0101);
        assert_eq!(&back[..4], &[4.5, -4.5, 4.5, -4.5]);
        assert_eq!(&back[8..], &[-4.0 / 3.0, 4.0 / 3.0, -4.0 / 3.0]);
    }

    #[test]
    fn a_block_with_a_non_finite_value_decodes_to_nan_and_only_that_block() {
        let codec = OneBit::new(64).unwrap();
        let mut src: Vec<f32> = (0..300).map(|i| (i as f32 - 150.0) / 9.0).collect();
        src[70] = f32::INFINITY;
        src[200] = f32::NAN;
        let (_, back) = round_trip(&codec, &src);
        for (i, y) in back.iter().enumerate() {
            let poisoned = (64..128).contains(&i) || (192..256).contains(&i);
            assert_eq!(y.is_nan(), poisoned, "{i}: {y}");
        }
    }

    #[test]
    fn huge_finite_blocks_do_not_overflow_the_scale() {
        let codec = OneBit::new(64).unwrap();
        let src = vec![f32::MAX; 64];
        let (_, back) = round_trip(&codec, &src);
        assert!(back.iter().all(|&y| y == f32::MAX));
    }

    #[test]
    fn decode_add_adds() {
        let codec = OneBit::new(16).unwrap();
        let src: Vec<f32> = (0..45).map(|i| i as f32 - 20.0).collect();
        let (wire, back) = round_trip(&codec, &src);
        let mut acc = vec![1.0f32; 45];
        codec.decode_add(&wire, &mut acc).unwrap();
        for (a, b) in acc.iter().zip(&back) {
            assert_eq!(*a, 1.0 + b);
        }
    }

    #[test]
    fn blocks_must_fill_bytes() {
        assert!(OneBit::new(12).is_err());
        assert!(OneBit::new(0).is_err());
        assert!(OneBit::new(1 << 17).is_err());
        assert!(OneBit::new(8).is_ok());
    }

    proptest! {
        #[test]
        fn signs_survive_and_the_scale_is_the_mean_magnitude(
            block in prop::sample::select(vec![8usize, 64, 128, 256]),
            src in proptest::collection::vec(-1e4f32..1e4, 0..1100),
        ) {
            let codec = OneBit::new(block).unwrap();
            let (wire, back) = round_trip(&codec, &src);
            for (j, x) in src.chunks(block).enumerate() {
                let mean = x.iter().map(|v| v.abs() as f64).sum::<f64>() / x.len() as f64;
                let scale = get_f32(&wire, j * (4 + block / 8));
                prop_assert!((scale as f64 - mean).abs() <= mean * 1e-6, "block {}: {} vs {}", j, scale, mean);
                for (i, &v) in x.iter().enumerate() {
                    let y = back[j * block + i];
                    prop_assert_eq!(y.abs(), scale);
                    if v != 0.0 {
                        prop_assert_eq!(y.is_sign_negative(), v < 0.0);
                    }
                }
            }
            if src.len() % 8 != 0 {
                // Unused bits of the last byte are zero.
                let used = src.len() % 8;
                prop_assert_eq!(wire[wire.len() - 1] >> used, 0);
            }
        }
    }
}
