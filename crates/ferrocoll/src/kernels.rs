//! Reduction kernels: tight loops over slices that LLVM vectorises.
//!
//! Dispatch on `(dtype, op)` happens once per call, outside the loop, so each
//! inner loop is a monomorphic elementwise operation (see `benches/kernels.rs`
//! for its throughput next to a plain copy). Integer arithmetic wraps, which
//! keeps integer reductions exact and order-independent.

use half::{bf16, f16};

use crate::types::{DType, ReduceOp};

/// Arithmetic a reduction needs from one element type.
trait Arith: bytemuck::Pod {
    fn add(a: Self, b: Self) -> Self;
    fn mul(a: Self, b: Self) -> Self;
    fn min(a: Self, b: Self) -> Self;
    fn max(a: Self, b: Self) -> Self;
    /// `self / n`, the final step of `Avg`.
    fn div_count(self, n: usize) -> Self;
}

macro_rules! arith_int {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)] fn add(a: Self, b: Self) -> Self { a.wrapping_add(b) }
            #[inline(always)] fn mul(a: Self, b: Self) -> Self { a.wrapping_mul(b) }
            #[inline(always)] fn min(a: Self, b: Self) -> Self { Ord::min(a, b) }
            #[inline(always)] fn max(a: Self, b: Self) -> Self { Ord::max(a, b) }
            #[inline(always)] fn div_count(self, n: usize) -> Self {
                // n <= group size, which always fits the wider types; for the
                // 8-bit types a group larger than the type's range makes the
                // average 0 (or the value itself for n == 1), as integer
                // division would.
                match <$t>::try_from(n) { Ok(d) => self / d, Err(_) => 0 }
            }
        }
    )*};
}
arith_int!(i8, i32, i64, u8, u32, u64);

macro_rules! arith_float {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)] fn add(a: Self, b: Self) -> Self { a + b }
            #[inline(always)] fn mul(a: Self, b: Self) -> Self { a * b }
            #[inline(always)] fn min(a: Self, b: Self) -> Self { a.min(b) }
            #[inline(always)] fn max(a: Self, b: Self) -> Self { a.max(b) }
            #[inline(always)] fn div_count(self, n: usize) -> Self { self / n as $t }
        }
    )*};
}
arith_float!(f32, f64);

// The 16-bit floats compute in f32 and round once per element, as NCCL does.
macro_rules! arith_half {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)] fn add(a: Self, b: Self) -> Self { <$t>::from_f32(a.to_f32() + b.to_f32()) }
            #[inline(always)] fn mul(a: Self, b: Self) -> Self { <$t>::from_f32(a.to_f32() * b.to_f32()) }
            #[inline(always)] fn min(a: Self, b: Self) -> Self { <$t>::from_f32(a.to_f32().min(b.to_f32())) }
            #[inline(always)] fn max(a: Self, b: Self) -> Self { <$t>::from_f32(a.to_f32().max(b.to_f32())) }
            #[inline(always)] fn div_count(self, n: usize) -> Self { <$t>::from_f32(self.to_f32() / n as f32) }
        }
    )*};
}
arith_half!(f16, bf16);

/// `dst[i] = dst[i] op src[i]`, typed.
fn accumulate_typed<T: Arith>(op: ReduceOp, dst: &mut [T], src: &[T]) {
    debug_assert_eq!(dst.len(), src.len());
    let pairs = dst.iter_mut().zip(src);
    match op.combining() {
        ReduceOp::Sum | ReduceOp::Avg => pairs.for_each(|(d, s)| *d = T::add(*d, *s)),
        ReduceOp::Prod => pairs.for_each(|(d, s)| *d = T::mul(*d, *s)),
        ReduceOp::Min => pairs.for_each(|(d, s)| *d = T::min(*d, *s)),
        ReduceOp::Max => pairs.for_each(|(d, s)| *d = T::max(*d, *s)),
    }
}

/// `dst[i] = a[i] op b[i]`, typed.
fn combine_typed<T: Arith>(op: ReduceOp, dst: &mut [T], a: &[T], b: &[T]) {
    debug_assert!(dst.len() == a.len() && a.len() == b.len());
    let triples = dst.iter_mut().zip(a.iter().zip(b));
    match op.combining() {
        ReduceOp::Sum | ReduceOp::Avg => triples.for_each(|(d, (x, y))| *d = T::add(*x, *y)),
        ReduceOp::Prod => triples.for_each(|(d, (x, y))| *d = T::mul(*x, *y)),
        ReduceOp::Min => triples.for_each(|(d, (x, y))| *d = T::min(*x, *y)),
        ReduceOp::Max => triples.for_each(|(d, (x, y))| *d = T::max(*x, *y)),
    }
}

fn divide_typed<T: Arith>(buf: &mut [T], n: usize) {
    buf.iter_mut().for_each(|x| *x = x.div_count(n));
}

/// Views bytes as `T` when they are aligned for it; `None` otherwise.
fn typed<T: bytemuck::Pod>(bytes: &[u8]) -> Option<&[T]> {
    bytemuck::try_cast_slice(bytes).ok()
}

fn typed_mut<T: bytemuck::Pod>(bytes: &mut [u8]) -> Option<&mut [T]> {
    bytemuck::try_cast_slice_mut(bytes).ok()
}

/// Copies bytes into an aligned vector of `T` (the rare unaligned path: a
/// transport's staging buffer that is not aligned for the element type).
fn aligned_copy<T: bytemuck::Pod>(bytes: &[u8]) -> Vec<T> {
    let mut v = vec![T::zeroed(); bytes.len() / std::mem::size_of::<T>()];
    bytemuck::cast_slice_mut::<T, u8>(&mut v).copy_from_slice(bytes);
    v
}

fn accumulate_bytes<T: Arith>(op: ReduceOp, dst: &mut [u8], src: &[u8]) {
    match (typed_mut::<T>(dst), typed::<T>(src)) {
        (Some(d), Some(s)) => accumulate_typed(op, d, s),
        (Some(d), None) => accumulate_typed(op, d, &aligned_copy::<T>(src)),
        (None, _) => {
            let mut d = aligned_copy::<T>(dst);
            accumulate_typed(op, &mut d, &aligned_copy::<T>(src));
            dst.copy_from_slice(bytemuck::cast_slice(&d));
        }
    }
}

fn combine_bytes<T: Arith>(op: ReduceOp, dst: &mut [u8], a: &[u8], b: &[u8]) {
    match (typed_mut::<T>(dst), typed::<T>(a), typed::<T>(b)) {
        (Some(d), Some(x), Some(y)) => combine_typed(op, d, x, y),
        _ => {
            dst.copy_from_slice(a);
            accumulate_bytes::<T>(op, dst, b);
        }
    }
}

fn divide_bytes<T: Arith>(buf: &mut [u8], n: usize) {
    match typed_mut::<T>(buf) {
        Some(b) => divide_typed(b, n),
        None => {
            let mut b = aligned_copy::<T>(buf);
            divide_typed(&mut b, n);
            buf.copy_from_slice(bytemuck::cast_slice(&b));
        }
    }
}

macro_rules! dispatch {
    ($dtype:expr, $f:ident, $($arg:expr),*) => {
        match $dtype {
            DType::F32 => $f::<f32>($($arg),*),
            DType::F64 => $f::<f64>($($arg),*),
            DType::F16 => $f::<f16>($($arg),*),
            DType::BF16 => $f::<bf16>($($arg),*),
            DType::I8 => $f::<i8>($($arg),*),
            DType::I32 => $f::<i32>($($arg),*),
            DType::I64 => $f::<i64>($($arg),*),
            DType::U8 => $f::<u8>($($arg),*),
            DType::U32 => $f::<u32>($($arg),*),
            DType::U64 => $f::<u64>($($arg),*),
        }
    };
}

/// `dst = dst op src` over raw element bytes of type `dtype`.
///
/// Both slices hold whole elements and have the same length.
pub fn accumulate(dtype: DType, op: ReduceOp, dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "reduction operands differ in length");
    dispatch!(dtype, accumulate_bytes, op, dst, src)
}

/// `dst = a op b` over raw element bytes of type `dtype`.
pub fn combine(dtype: DType, op: ReduceOp, dst: &mut [u8], a: &[u8], b: &[u8]) {
    assert!(
        dst.len() == a.len() && a.len() == b.len(),
        "reduction operands differ in length"
    );
    dispatch!(dtype, combine_bytes, op, dst, a, b)
}

/// Divides every element by `n` (the last step of [`ReduceOp::Avg`]).
pub fn divide(dtype: DType, buf: &mut [u8], n: usize) {
    dispatch!(dtype, divide_bytes, buf, n)
}

/// The f32 sum kernel on typed slices, exposed for the kernel benchmark.
pub fn sum_f32(dst: &mut [f32], src: &[f32]) {
    accumulate_typed(ReduceOp::Sum, dst, src)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_and_extremes_per_type() {
        let mut d = [1i8, 100, -5];
        let s = [2i8, 100, 7];
        accumulate(
            DType::I8,
            ReduceOp::Sum,
            bytemuck::cast_slice_mut(&mut d),
            bytemuck::cast_slice(&s),
        );
        assert_eq!(d, [3, -56, 2]); // 200 wraps to -56
        let mut d = [f16::from_f32(1.5), f16::from_f32(-2.0)];
        let s = [f16::from_f32(0.5), f16::from_f32(-3.0)];
        accumulate(
            DType::F16,
            ReduceOp::Min,
            bytemuck::cast_slice_mut(&mut d),
            bytemuck::cast_slice(&s),
        );
        assert_eq!(d, [f16::from_f32(0.5), f16::from_f32(-3.0)]);
    }

    #[test]
    fn unaligned_operands_take_the_copy_path() {
        // u32 backing is 4-aligned, so one byte in the f32 view is not.
        let mut dst_words = [0u32; 5];
        let mut src_words = [0u32; 5];
        let dst: &mut [u8] = bytemuck::cast_slice_mut(&mut dst_words);
        let src: &mut [u8] = bytemuck::cast_slice_mut(&mut src_words);
        dst[1..17].copy_from_slice(bytemuck::cast_slice(&[1.0f32, 2.0, 3.0, 4.0]));
        src[1..17].copy_from_slice(bytemuck::cast_slice(&[10.0f32, 20.0, 30.0, 40.0]));
        accumulate(DType::F32, ReduceOp::Sum, &mut dst[1..17], &src[1..17]);
        let out: Vec<f32> = aligned_copy(&dst[1..17]);
        assert_eq!(out, [11.0, 22.0, 33.0, 44.0]);
    }

    #[test]
    fn avg_divides_once() {
        let mut v = [7i32, -7, 9];
        divide(DType::I32, bytemuck::cast_slice_mut(&mut v), 2);
        assert_eq!(v, [3, -3, 4]);
    }
}
