//! The 16-bit float codecs, [`Fp16`] and [`Bf16`]: conversion rounds to
//! nearest even exactly as the `half` crate does (the tests hold every bit
//! pattern class against it), and reduction never happens in 16 bits.

use half::{f16, slice::HalfFloatSliceExt};

use super::{check_encoded, Codec};
use crate::error::Result;

/// Elements converted per pass through a stack buffer: large enough that
/// the per-pass overhead vanishes, small enough to stay in L1.
const PASS: usize = 1024;

/// IEEE half precision (binary16): 2 bytes per element, 11 significant bits,
/// range +-65504.
///
/// Wire format: `n` little-endian binary16 values, element `i` at bytes
/// `2i..2i+2`, no header (ratio 2, [`Codec::granule`] 1). Rounds to nearest,
/// ties to even, as `half::f16::from_f32` does; `decode_add` widens to `f32`
/// and adds there. Non-finite values travel as themselves; a finite `|x| >=
/// 65520` overflows to an infinity (which is why torch's fp16 hook divides
/// by the world size before casting).
///
/// Uses the `half` crate's slice conversions, which pick the F16C
/// instructions at run time (once per pass of 1024 elements, not per
/// element) where the CPU has them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fp16;

/// bfloat16: 2 bytes per element, `f32`'s exponent with 8 significant bits.
///
/// Wire format: `n` little-endian bfloat16 values (the upper halves of the
/// rounded `f32`s), element `i` at bytes `2i..2i+2`, no header (ratio 2,
/// [`Codec::granule`] 1). Rounds to nearest, ties to even; `decode_add`
/// widens to `f32` and adds there. Non-finite values travel as themselves
/// (NaN stays NaN, with its quiet bit set) and nothing finite overflows.
///
/// The conversion is written here as a branch-free bit operation (round to
/// nearest even on the upper 16 bits, NaN kept quiet) so that it
/// vectorises; it matches `half::bf16::from_f32` bit for bit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bf16;

impl Codec for Fp16 {
    fn name(&self) -> String {
        "fp16".into()
    }

    fn encoded_len(&self, n: usize) -> usize {
        2 * n
    }

    fn encode(&self, src: &[f32], dst: &mut [u8]) -> Result<()> {
        check_encoded(self, src.len(), dst.len(), "an encoding")?;
        let mut halves = [f16::ZERO; PASS];
        for (src, dst) in src.chunks(PASS).zip(dst.chunks_mut(2 * PASS)) {
            let halves = &mut halves[..src.len()];
            halves.convert_from_f32_slice(src);
            for (d, h) in dst.chunks_exact_mut(2).zip(halves.iter()) {
                d.copy_from_slice(&h.to_bits().to_le_bytes());
            }
        }
        Ok(())
    }

    fn decode(&self, src: &[u8], dst: &mut [f32]) -> Result<()> {
        check_encoded(self, dst.len(), src.len(), "the encoding")?;
        let mut halves = [f16::ZERO; PASS];
        for (src, dst) in src.chunks(2 * PASS).zip(dst.chunks_mut(PASS)) {
            let halves = &mut halves[..dst.len()];
            read_halves(src, halves);
            halves.convert_to_f32_slice(dst);
        }
        Ok(())
    }

    fn decode_add(&self, src: &[u8], dst: &mut [f32]) -> Result<()> {
        check_encoded(self, dst.len(), src.len(), "the encoding")?;
        let mut halves = [f16::ZERO; PASS];
        let mut wide = [0f32; PASS];
        for (src, dst) in src.chunks(2 * PASS).zip(dst.chunks_mut(PASS)) {
            let halves = &mut halves[..dst.len()];
            let wide = &mut wide[..dst.len()];
            read_halves(src, halves);
            halves.convert_to_f32_slice(wide);
            dst.iter_mut().zip(wide.iter()).for_each(|(d, w)| *d += *w);
        }
        Ok(())
    }

    fn granule(&self) -> Option<usize> {
        Some(1)
    }
}

/// Little-endian 16-bit words into `f16`s.
fn read_halves(src: &[u8], halves: &mut [f16]) {
    for (h, s) in halves.iter_mut().zip(src.chunks_exact(2)) {
        *h = f16::from_bits(u16::from_le_bytes([s[0], s[1]]));
    }
}

/// `f32` to bfloat16 bits, round to nearest even; a NaN stays a NaN with its
/// quiet bit set (as `half` does). Branch-free so the loops vectorise.
#[inline(always)]
fn to_bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    // Adding 0x7fff plus the lowest kept bit carries into the kept half
    // exactly when the dropped half is above 0x8000, or equal to it with an
    // odd kept half: ties to even. A carry out of the largest finite value
    // gives infinity, as it should.
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16;
    let quiet_nan = (bits >> 16) | 0x0040;
    if bits & 0x7fff_ffff > 0x7f80_0000 {
        quiet_nan as u16
    } else {
        rounded as u16
    }
}

/// bfloat16 bits to `f32`: exact; a NaN keeps its quiet bit set (as `half`
/// does for a signalling NaN).
#[inline(always)]
fn from_bf16_bits(h: u16) -> f32 {
    let wide = (h as u32) << 16;
    f32::from_bits(if h & 0x7fff > 0x7f80 {
        wide | 0x0040_0000
    } else {
        wide
    })
}

impl Codec for Bf16 {
    fn name(&self) -> String {
        "bf16".into()
    }

    fn encoded_len(&self, n: usize) -> usize {
        2 * n
    }

    fn encode(&self, src: &[f32], dst: &mut [u8]) -> Result<()> {
        check_encoded(self, src.len(), dst.len(), "an encoding")?;
        for (d, x) in dst.chunks_exact_mut(2).zip(src) {
            d.copy_from_slice(&to_bf16_bits(*x).to_le_bytes());
        }
        Ok(())
    }

    fn decode(&self, src: &[u8], dst: &mut [f32]) -> Result<()> {
        check_encoded(self, dst.len(), src.len(), "the encoding")?;
        for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
            *d = from_bf16_bits(u16::from_le_bytes([s[0], s[1]]));
        }
        Ok(())
    }

    fn decode_add(&self, src: &[u8], dst: &mut [f32]) -> Result<()> {
        check_encoded(self, dst.len(), src.len(), "the encoding")?;
        for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
            *d += from_bf16_bits(u16::from_le_bytes([s[0], s[1]]));
        }
        Ok(())
    }

    fn granule(&self) -> Option<usize> {
        Some(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;
    use proptest::prelude::*;

    /// Values that exercise every rounding path: ties, subnormals of both
    /// formats, the overflow boundary, infinities, NaNs with payloads.
    fn edge_values() -> Vec<f32> {
        let mut v = vec![
            0.0,
            -0.0,
            1.0,
            -1.0,
            65504.0,
            65519.9,
            65520.0,
            -65520.0,
            1e-8,
            -6e-8,
            5.96e-8,
            2.98e-8,
            f32::MIN_POSITIVE,
            f32::MAX,
            f32::MIN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::from_bits(0x7f80_0001), // signalling NaN
            f32::from_bits(0xffc0_1234), // negative NaN with payload
            f32::from_bits(0x3f80_8000), // bf16 tie, even: rounds down
            f32::from_bits(0x3f81_8000), // bf16 tie, odd: rounds up
            f32::from_bits(0x7f7f_ffff), // rounds to bf16 infinity
            1.0 + 1.0 / 2048.0,          // fp16 tie
            1.0 + 3.0 / 2048.0,
        ];
        v.extend((0..2000).map(|i| (i as f32 - 1000.0) * 0.731));
        v
    }

    fn bits_eq(a: f32, b: f32) -> bool {
        a.to_bits() == b.to_bits()
    }

    #[test]
    fn fp16_is_bit_exact_against_half() {
        let src = edge_values();
        let wire = Fp16.encode_to_vec(&src).unwrap();
        assert_eq!(wire.len(), 2 * src.len());
        let mut back = vec![0f32; src.len()];
        Fp16.decode(&wire, &mut back).unwrap();
        for (i, (&x, &y)) in src.iter().zip(&back).enumerate() {
            let h = f16::from_f32(x);
            assert_eq!(
                &wire[2 * i..2 * i + 2],
                &h.to_bits().to_le_bytes(),
                "x = {x:e}"
            );
            assert!(
                bits_eq(y, h.to_f32()) || (y.is_nan() && x.is_nan()),
                "x = {x:e}"
            );
        }
        assert!(back[6].is_infinite() && back[7] == f16::NEG_INFINITY.to_f32());
    }

    #[test]
    fn bf16_is_bit_exact_against_half() {
        let src = edge_values();
        let wire = Bf16.encode_to_vec(&src).unwrap();
        let mut back = vec![0f32; src.len()];
        Bf16.decode(&wire, &mut back).unwrap();
        for (i, (&x, &y)) in src.iter().zip(&back).enumerate() {
            let h = bf16::from_f32(x);
            assert_eq!(
                &wire[2 * i..2 * i + 2],
                &h.to_bits().to_le_bytes(),
                "x = {x:e}"
            );
            assert!(bits_eq(y, h.to_f32()), "x = {x:e}");
        }
    }

    #[test]
    fn decode_add_accumulates_in_f32() {
        // 2049 is not an fp16 value, so a 16-bit sum 2048 + 1 would round
        // back to 2048; the f32 accumulation keeps it.
        for codec in [&Fp16 as &dyn Codec, &Bf16] {
            let wire = codec.encode_to_vec(&[1.0; 3]).unwrap();
            let mut acc = vec![2048.0f32, 0.5, -1.0];
            codec.decode_add(&wire, &mut acc).unwrap();
            assert_eq!(acc, vec![2049.0, 1.5, 0.0], "{}", codec.name());
        }
    }

    #[test]
    fn wrong_lengths_are_errors() {
        for codec in [&Fp16 as &dyn Codec, &Bf16] {
            let mut out = vec![0u8; 5];
            assert!(codec.encode(&[1.0, 2.0], &mut out).is_err());
            let mut dst = vec![0f32; 3];
            assert!(codec.decode(&[0u8; 4], &mut dst).is_err());
            assert!(codec.decode_add(&[0u8; 8], &mut dst).is_err());
            assert!(codec.encode(&[], &mut []).is_ok());
            assert!(codec.decode(&[], &mut []).is_ok());
        }
    }

    proptest! {
        #[test]
        fn any_bits_round_trip_as_half_does(bits in proptest::collection::vec(any::<u32>(), 0..3000)) {
            let src: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
            let mut back = vec![0f32; src.len()];
            Fp16.decode(&Fp16.encode_to_vec(&src).unwrap(), &mut back).unwrap();
            for (&x, &y) in src.iter().zip(&back) {
                let want = f16::from_f32(x).to_f32();
                prop_assert!(bits_eq(y, want) || (want.is_nan() && y.is_nan()), "fp16 {:#x}", x.to_bits());
            }
            Bf16.decode(&Bf16.encode_to_vec(&src).unwrap(), &mut back).unwrap();
            for (&x, &y) in src.iter().zip(&back) {
                prop_assert!(bits_eq(y, bf16::from_f32(x).to_f32()), "bf16 {:#x}", x.to_bits());
            }
        }
    }
}
