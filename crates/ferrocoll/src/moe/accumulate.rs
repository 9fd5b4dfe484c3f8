//! The weighted sum of combine, y_i = Σ_j g_ij · row_ij, for every element
//! type: accumulated wide and rounded once into the element type.

use half::{bf16, f16};

use crate::types::Element;

/// An element type [`super::Dispatcher::combine`] can form weighted sums
/// of: every [`Element`] type.
///
/// The sum of a token's rows is accumulated in `f32` for `f32`, `f16`,
/// `bf16`, `i8` and `u8` (exact for the 8- and 16-bit types' values) and in
/// `f64` for `f64`, `i32`, `u32`, `i64` and `u64`, then rounded once into
/// the element type: floats round to nearest, integers to the nearest
/// integer (halves away from zero), saturating at the type's range. Sealed:
/// implemented for exactly the types of [`crate::DType`].
pub trait Accumulate: Element + sealed::Sealed {
    /// Writes into `y` (rows of `hidden`) each token's weighted sum: for
    /// token t, the rows `rows[r·hidden..]` of the `(r, weight)` entries
    /// of `terms[t·k..(t+1)·k]` that are `Some`, summed in that order.
    #[doc(hidden)]
    fn weighted_sum(rows: &[Self], terms: &[Option<(usize, f32)>], k: usize, y: &mut [Self]);
}

mod sealed {
    pub trait Sealed {}
}

/// [`Accumulate::weighted_sum`] in accumulator type `A`, with the
/// element's conversions to and from it.
fn sum_in<T: Copy, A>(
    rows: &[T],
    terms: &[Option<(usize, f32)>],
    k: usize,
    y: &mut [T],
    widen: impl Fn(T) -> A,
    weight: impl Fn(f32) -> A,
    narrow: impl Fn(A) -> T,
) where
    A: Copy + Default + std::ops::Add<Output = A> + std::ops::Mul<Output = A>,
{
    if k == 0 || y.is_empty() {
        return;
    }
    let hidden = y.len() / (terms.len() / k);
    let zero = A::default();
    let mut acc = vec![zero; hidden];
    for (out, terms) in y.chunks_exact_mut(hidden).zip(terms.chunks_exact(k)) {
        let mut kept = terms.iter().flatten();
        match kept.next() {
            // The first term sets the sum (0 + g·v: the same value, the
            // sign of a zero included, as adding it to zeros) without a
            // pass that zeroes first.
            Some(&(row, g)) => {
                let (g, src) = (weight(g), &rows[row * hidden..(row + 1) * hidden]);
                for (a, &v) in acc.iter_mut().zip(src) {
                    *a = zero + g * widen(v);
                }
            }
            None => acc.fill(zero),
        }
        for &(row, g) in kept {
            let (g, src) = (weight(g), &rows[row * hidden..(row + 1) * hidden]);
            for (a, &v) in acc.iter_mut().zip(src) {
                *a = *a + g * widen(v);
            }
        }
        for (o, &a) in out.iter_mut().zip(&acc) {
            *o = narrow(a);
        }
    }
}

macro_rules! accumulate {
    ($acc:ty: $($t:ty => $widen:expr, $narrow:expr);* $(;)?) => {$(
        impl sealed::Sealed for $t {}
        impl Accumulate for $t {
            fn weighted_sum(
                rows: &[Self],
                terms: &[Option<(usize, f32)>],
                k: usize,
                y: &mut [Self],
            ) {
                sum_in(rows, terms, k, y, $widen, |g| g as $acc, $narrow);
            }
        }
    )*};
}

// `as` from a float to an integer saturates (and maps NaN to 0).
accumulate!(f32:
    f32 => |v: f32| v, |a: f32| a;
    f16 => |v: f16| v.to_f32(), f16::from_f32;
    bf16 => |v: bf16| v.to_f32(), bf16_of;
    i8 => |v: i8| f32::from(v), |a: f32| a.round() as i8;
    u8 => |v: u8| f32::from(v), |a: f32| a.round() as u8;
);
/// `bf16::from_f32` without branches (so the rounding loop of a row
/// vectorises): round to nearest, ties to even, by adding 0x7fff plus the
/// kept part's lowest bit; a NaN keeps its high bits and gets the quiet
/// bit, as `half` does. Equal to `bf16::from_f32` for every f32
/// (`tests::bf16_rounding_is_halfs`).
#[inline]
fn bf16_of(a: f32) -> bf16 {
    let x = a.to_bits();
    let rounded = x.wrapping_add(0x7fff + ((x >> 16) & 1)) >> 16;
    let nan = (x >> 16) | 0x0040;
    let bits = if x & 0x7fff_ffff > 0x7f80_0000 {
        nan
    } else {
        rounded
    };
    bf16::from_bits(bits as u16)
}

accumulate!(f64:
    f64 => |v: f64| v, |a: f64| a;
    i32 => |v: i32| f64::from(v), |a: f64| a.round() as i32;
    u32 => |v: u32| f64::from(v), |a: f64| a.round() as u32;
    i64 => |v: i64| v as f64, |a: f64| a.round() as i64;
    u64 => |v: u64| v as f64, |a: f64| a.round() as u64;
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_sums_round_once() {
        // 1 + 2^-8 + 2^-8: each partial sum rounded to bf16 (8 bits of
        // mantissa) would lose both halves; accumulated in f32 they add to
        // 1 + 2^-7, which bf16 holds.
        let rows = [
            bf16::ONE,
            bf16::from_f32(1.0 / 256.0),
            bf16::from_f32(1.0 / 256.0),
        ];
        let terms = [Some((0, 1.0)), Some((1, 1.0)), Some((2, 1.0))];
        let mut y = [bf16::ZERO];
        bf16::weighted_sum(&rows, &terms, 3, &mut y);
        assert_eq!(y[0], bf16::from_f32(1.0 + 1.0 / 128.0));
    }

    #[test]
    fn bf16_rounding_is_halfs() {
        // Every sign, exponent and the mantissa's low bits around the
        // rounding point, plus a stride through all the rest.
        let edges = (0..=0x1ffu32).flat_map(|se| {
            [
                0u32, 1, 0x7fff, 0x8000, 0x8001, 0xffff, 0x1_7fff, 0x1_8000, 0x7f_ffff,
            ]
            .map(move |m| (se << 23) | m)
        });
        for x in edges.chain((0..u32::MAX).step_by(4099)) {
            let f = f32::from_bits(x);
            assert_eq!(bf16_of(f).to_bits(), bf16::from_f32(f).to_bits(), "{x:#x}");
        }
    }

    #[test]
    fn negative_zero_terms_sum_as_from_zero() {
        // 0 + (-0) is +0: the first term must not leave a -0 behind.
        let rows = [bf16::from_f32(-0.0), bf16::ONE];
        let mut y = [bf16::ONE];
        bf16::weighted_sum(&rows, &[Some((0, 1.0))], 1, &mut y);
        assert_eq!(y[0].to_bits(), bf16::ZERO.to_bits());
        let mut y = [9.0f32];
        f32::weighted_sum(&[1.0], &[None], 1, &mut y);
        assert_eq!(y, [0.0]);
    }

    #[test]
    fn integers_round_to_nearest_and_saturate_and_missing_terms_add_nothing() {
        let rows = [100i8, 101, -3];
        // Token 0: 0.5·100 + 0.5·101 = 100.5 -> 101; token 1: 2·101 = 202
        // saturates at 127; token 2: its only choice was dropped -> 0.
        let terms = [
            Some((0, 0.5)),
            Some((1, 0.5)),
            Some((1, 2.0)),
            None,
            None,
            None,
        ];
        let mut y = [0i8; 3];
        i8::weighted_sum(&rows, &terms, 2, &mut y);
        assert_eq!(y, [101, 127, 0]);
    }
}
