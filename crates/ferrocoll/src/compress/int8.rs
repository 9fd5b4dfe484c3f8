//! Block-wise int8 quantization ([`Int8Block`]).

use super::{check_block, check_encoded, get_f32, magnitude_bits, put_f32, Codec, INF_BITS};
use crate::error::Result;

/// Block-wise int8 quantization: one `f32` scale per block of `B` elements,
/// symmetric max-abs scaling, round to nearest (ties to even).
///
/// # Wire format
///
/// The chunk is cut into blocks of `B` elements from its first element (the
/// last block may be shorter). Block `j` is a record at byte `j (4 + B)`:
///
/// ```text
/// [ scale: f32 LE ][ q_0: i8 ][ q_1: i8 ] ... [ q_{len-1}: i8 ]
/// ```
///
/// with `scale = max|x| / 127` over the block's finite elements and
/// `q_i = round(x_i / scale)` in `-127..=127`; element `i` decodes to
/// `q_i * scale`, so the error of a finite element is at most `scale / 2`.
/// Length: `n + 4 ceil(n/B)` bytes, the seeds' ratio `4B/(B+4)` (3.88 at
/// B = 128). Records of whole blocks are independent, so a chunk cut at a
/// multiple of `B` encodes to the concatenation of its pieces' encodings
/// ([`Codec::granule`] is `B`).
///
/// # Non-finite values
///
/// The code `-128` (`0x80`), unused by the symmetric range, marks an element
/// that was NaN or infinite; it decodes to NaN (an infinity's sign is not
/// kept). The block's scale comes from its finite elements only, so one
/// overflowing element costs its own value and nothing else.
///
/// A block whose largest finite `|x|` is below `127 / f32::MAX` (about
/// 3.7e-37) is quantized by dividing by its (subnormal) scale, and one below
/// `127 * 2^-149` (about 1.8e-43) is sent as zeros: both regimes are far
/// below any gradient's precision, and neither produces a non-finite value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Int8Block {
    block: usize,
}

/// The code of a non-finite element.
const NON_FINITE: u8 = 0x80;

/// Adding 1.5 * 2^23 to an `f32` of magnitude below 2^22 rounds it to an
/// integer, ties to even (the FPU's default rounding), and leaves that
/// integer, in two's complement, in the low bits of the sum's mantissa: one
/// vectorisable add instead of `f32::round` (ties away from zero, and a
/// library call on baseline x86-64) and a float-to-int conversion.
const ROUNDER: f32 = 12_582_912.0;

impl Int8Block {
    /// The block size [`super::parse`] uses when none is given.
    pub const DEFAULT_BLOCK: usize = 128;

    /// A quantizer with blocks of `block` elements (1..=65536; 64, 128 and
    /// 256 are usual: smaller blocks follow the data more closely and pay
    /// more scales).
    pub fn new(block: usize) -> Result<Int8Block> {
        Ok(Int8Block {
            block: check_block("int8", block, 1)?,
        })
    }

    /// Elements per block.
    pub fn block(&self) -> usize {
        self.block
    }

    fn record(&self) -> usize {
        4 + self.block
    }
}

/// `round(y)` to an integer in `-127..=127` as a byte, or [`NON_FINITE`]
/// where the input element `x` is not finite.
#[inline(always)]
fn quantize(y: f32, x: f32) -> u8 {
    // The low byte of the rounded sum is round(y) as an i8 (y is clamped
    // to -127..=127; a NaN y only arises for a non-finite x, replaced
    // below).
    let q = (y.clamp(-127.0, 127.0) + ROUNDER).to_bits() as u8;
    if magnitude_bits(x) < INF_BITS {
        q
    } else {
        NON_FINITE
    }
}

#[inline(always)]
fn dequantize(q: u8, scale: f32) -> f32 {
    if q == NON_FINITE {
        f32::NAN
    } else {
        (q as i8) as f32 * scale
    }
}

/// The largest `|x|` over the finite elements of `x` (0 if none).
///
/// Computed as a max over magnitude bits in eight independent lanes: the
/// bits of non-negative floats order as the floats do, are below 2^31 (so
/// compare as `i32`, which baseline x86-64 has as a vector instruction and
/// `u32` it does not), and a folded `max` would be a scalar chain of
/// conditional moves.
fn finite_max_abs(x: &[f32]) -> f32 {
    #[inline(always)]
    fn lane(m: i32, v: f32) -> i32 {
        let a = magnitude_bits(v) as i32;
        let a = if a < INF_BITS as i32 { a } else { 0 };
        if a > m {
            a
        } else {
            m
        }
    }
    let mut lanes = [0i32; 8];
    let groups = x.chunks_exact(8);
    let tail = groups.remainder().iter().fold(0, |m, &v| lane(m, v));
    for group in groups {
        for (l, &v) in lanes.iter_mut().zip(group) {
            *l = lane(*l, v);
        }
    }
    let max = lanes.iter().fold(tail, |m, &l| m.max(l));
    f32::from_bits(max as u32)
}

/// Encodes one block `x` into its record `rec` (`4 + x.len()` bytes).
fn encode_block(x: &[f32], rec: &mut [u8]) {
    let max = finite_max_abs(x);
    let scale = max / 127.0;
    put_f32(rec, 0, scale);
    let codes = &mut rec[4..];
    let inv = 127.0 / max;
    if inv.is_finite() {
        // The common case: a multiply per element.
        for (q, &v) in codes.iter_mut().zip(x) {
            *q = quantize(v * inv, v);
        }
    } else if scale > 0.0 {
        // max so small that 127 / max overflows: divide by the subnormal
        // scale instead.
        for (q, &v) in codes.iter_mut().zip(x) {
            *q = quantize(v / scale, v);
        }
    } else {
        // Nothing finite above 127 * 2^-149 (or nothing finite at all).
        for (q, &v) in codes.iter_mut().zip(x) {
            *q = quantize(0.0, v);
        }
    }
}

impl Codec for Int8Block {
    fn name(&self) -> String {
        format!("int8:{}", self.block)
    }

    fn encoded_len(&self, n: usize) -> usize {
        n + 4 * n.div_ceil(self.block)
    }

    fn encode(&self, src: &[f32], dst: &mut [u8]) -> Result<()> {
        check_encoded(self, src.len(), dst.len(), "an encoding")?;
        for (x, rec) in src.chunks(self.block).zip(dst.chunks_mut(self.record())) {
            encode_block(x, rec);
        }
        Ok(())
    }

    fn decode(&self, src: &[u8], dst: &mut [f32]) -> Result<()> {
        check_encoded(self, dst.len(), src.len(), "the encoding")?;
        for (rec, out) in src.chunks(self.record()).zip(dst.chunks_mut(self.block)) {
            let scale = get_f32(rec, 0);
            for (d, &q) in out.iter_mut().zip(&rec[4..]) {
                *d = dequantize(q, scale);
            }
        }
        Ok(())
    }

    fn decode_add(&self, src: &[u8], dst: &mut [f32]) -> Result<()> {
        check_encoded(self, dst.len(), src.len(), "the encoding")?;
        for (rec, out) in src.chunks(self.record()).zip(dst.chunks_mut(self.block)) {
            let scale = get_f32(rec, 0);
            for (d, &q) in out.iter_mut().zip(&rec[4..]) {
                *d += dequantize(q, scale);
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

    fn round_trip(codec: &Int8Block, src: &[f32]) -> (Vec<u8>, Vec<f32>) {
        let wire = codec.encode_to_vec(src).unwrap();
        assert_eq!(wire.len(), codec.encoded_len(src.len()));
        let mut back = vec![0f32; src.len()];
        codec.decode(&wire, &mut back).unwrap();
        (wire, back)
    }

    #[test]
    fn layout_is_scale_then_codes_per_block() {
        let codec = Int8Block::new(4).unwrap();
        let src = [1.0, -0.5, 0.25, 0.0, /* block 2 */ 254.0, 127.0];
        let (wire, back) = round_trip(&codec, &src);
        assert_eq!(wire.len(), 6 + 4 * 2);
        assert_eq!(get_f32(&wire, 0), 1.0 / 127.0);
        // 0.5 * 127 = 63.5 rounds to even 64; 0.25 * 127 = 31.75 -> 32.
        assert_eq!(&wire[4..8], &[127, (-64i8) as u8, 32, 0]);
        assert_eq!(get_f32(&wire, 8), 2.0);
        assert_eq!(&wire[12..], &[127, 64]);
        assert_eq!(back[4], 254.0);
        assert_eq!(back[5], 128.0);
    }

    #[test]
    fn a_non_finite_element_costs_only_itself() {
        let codec = Int8Block::new(64).unwrap();
        let mut src: Vec<f32> = (0..200).map(|i| (i as f32 - 100.0) / 7.0).collect();
        src[5] = f32::INFINITY;
        src[6] = f32::NEG_INFINITY;
        src[70] = f32::NAN;
        let (wire, back) = round_trip(&codec, &src);
        // The block's scale ignores the infinities.
        let finite_max = src[..64]
            .iter()
            .filter(|x| x.is_finite())
            .fold(0f32, |m, x| m.max(x.abs()));
        assert_eq!(get_f32(&wire, 0), finite_max / 127.0);
        for (i, (&x, &y)) in src.iter().zip(&back).enumerate() {
            if x.is_finite() {
                let scale = get_f32(&wire, (i / 64) * 68);
                assert!((x - y).abs() <= scale / 2.0 * 1.0001, "{i}: {x} -> {y}");
            } else {
                assert!(y.is_nan(), "{i}: {x} -> {y}");
            }
        }
    }

    #[test]
    fn zeros_tiny_values_and_all_non_finite_blocks_stay_finite_or_marked() {
        let codec = Int8Block::new(4).unwrap();
        let src = [
            0.0,
            -0.0,
            0.0,
            0.0, // block of zeros
            1e-38,
            -3e-39,
            1e-45,
            0.0, // max below 127 / f32::MAX: the division path
            1e-44,
            f32::NAN, // below 127 * 2^-149: zeros (and the NaN marked)
        ];
        let (_, back) = round_trip(&codec, &src);
        assert_eq!(&back[..4], &[0.0; 4]);
        for (&x, &y) in src[4..8].iter().zip(&back[4..8]) {
            assert!(
                y.is_finite() && (x - y).abs() <= 1e-38 / 127.0,
                "{x} -> {y}"
            );
        }
        assert_eq!(back[8], 0.0);
        assert!(back[9].is_nan());
    }

    #[test]
    fn decode_add_adds() {
        let codec = Int8Block::new(64).unwrap();
        let src: Vec<f32> = (0..100).map(|i| i as f32).collect();
        let (wire, back) = round_trip(&codec, &src);
        let mut acc = vec![0.5f32; 100];
        codec.decode_add(&wire, &mut acc).unwrap();
        for (a, b) in acc.iter().zip(&back) {
            assert_eq!(*a, 0.5 + b);
        }
    }

    #[test]
    fn a_chunk_cut_at_a_block_boundary_encodes_as_its_pieces() {
        let codec = Int8Block::new(128).unwrap();
        let src: Vec<f32> = (0..1000).map(|i| ((i * 37) % 101) as f32 - 50.0).collect();
        let whole = codec.encode_to_vec(&src).unwrap();
        let mut pieces = codec.encode_to_vec(&src[..256]).unwrap();
        pieces.extend(codec.encode_to_vec(&src[256..]).unwrap());
        assert_eq!(whole, pieces);
    }

    proptest! {
        #[test]
        fn error_is_at_most_half_a_scale(
            block in prop::sample::select(vec![1usize, 7, 64, 128, 256]),
            src in proptest::collection::vec(-1e6f32..1e6, 0..1200),
        ) {
            let codec = Int8Block::new(block).unwrap();
            let (wire, back) = round_trip(&codec, &src);
            for (i, (&x, &y)) in src.iter().zip(&back).enumerate() {
                let scale = get_f32(&wire, (i / block) * (block + 4));
                // scale/2 from the rounding, a few ulps of x from the float
                // arithmetic of x * (127/max) and q * scale.
                let bound = scale / 2.0 * (1.0 + 1e-6) + 4.0 * f32::EPSILON * x.abs();
                prop_assert!((x - y).abs() <= bound, "{}: {} -> {} (scale {})", i, x, y, scale);
                let q = wire[(i / block) * (block + 4) + 4 + i % block] as i8;
                prop_assert!((-127..=127).contains(&q));
            }
        }
    }
}
