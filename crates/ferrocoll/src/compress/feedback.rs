//! Error feedback: the residual a lossy compressor leaves, carried into the
//! next step (Seide et al. 2014; Stich et al. 2018; Karimireddy et al.
//! 2019).
//!
//! With `e_0 = 0`, each step sends `v_t = C(g_t + e_t)` and keeps
//! `e_{t+1} = (g_t + e_t) - v_t`, so after `T` steps
//! `sum v_t + e_T = sum g_t`: nothing is lost, only delayed.

use super::Codec;
use crate::error::{Error, Result};

/// The residual of one buffer, kept by the caller across steps.
///
/// One `ErrorFeedback` per buffer and per place that compresses it: a
/// worker's gradient bucket has one; 1-bit Adam's two-phase allreduce keeps
/// a second, "server-side", one for the chunk each rank reduces and
/// compresses again, and a reduce-scatter that re-encodes a partial sum at
/// each hop keeps one per rank for the elements it re-encodes (the `_at`
/// methods address a sub-range, so a full-length state can serve the chunks
/// a plan hands it).
///
/// Give it biased codecs (all but Random-k's rescaled form, which needs no
/// error feedback and diverges with it; [`super::RandK::unscaled`] is the
/// form to use here).
///
/// Non-finite entries are never carried over: where the new residual is
/// NaN or infinite it is reset to zero. The non-finite input itself went
/// out in that step's message (no codec hides one), which is where an
/// overflow check looks; carried over, it would poison every later step of
/// that element.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ErrorFeedback {
    residual: Vec<f32>,
    /// The decoded message of the last `compress`, kept to reuse its
    /// allocation.
    scratch: Vec<f32>,
}

impl ErrorFeedback {
    /// A zero residual for a buffer of `len` elements.
    pub fn new(len: usize) -> ErrorFeedback {
        ErrorFeedback {
            residual: vec![0.0; len],
            scratch: Vec::new(),
        }
    }

    /// Elements of the buffer.
    pub fn len(&self) -> usize {
        self.residual.len()
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.residual.is_empty()
    }

    /// What has been given and not yet sent, per element.
    pub fn residual(&self) -> &[f32] {
        &self.residual
    }

    /// Forgets the residual (a skipped step that should not carry over, a
    /// change of codec).
    pub fn reset(&mut self) {
        self.residual.fill(0.0);
    }

    /// Encodes `grad + residual` with `codec` into `out` (exactly
    /// `codec.encoded_len(grad.len())` bytes) and keeps what the encoding
    /// did not carry. `grad` covers the whole buffer.
    pub fn compress<C: Codec + ?Sized>(
        &mut self,
        grad: &[f32],
        codec: &C,
        out: &mut [u8],
    ) -> Result<()> {
        self.check_whole(grad.len())?;
        self.compress_at(0, grad, codec, out)
    }

    /// [`ErrorFeedback::compress`] into a new vector.
    pub fn compress_to_vec<C: Codec + ?Sized>(
        &mut self,
        grad: &[f32],
        codec: &C,
    ) -> Result<Vec<u8>> {
        let mut out = vec![0u8; codec.encoded_len(grad.len())];
        self.compress(grad, codec, &mut out)?;
        Ok(out)
    }

    /// [`ErrorFeedback::compress`] for elements `offset..offset +
    /// chunk.len()` of the buffer: the chunk is encoded on its own (as a
    /// plan encodes one piece of a buffer), with that range of the residual.
    pub fn compress_at<C: Codec + ?Sized>(
        &mut self,
        offset: usize,
        chunk: &[f32],
        codec: &C,
        out: &mut [u8],
    ) -> Result<()> {
        let range = self.range(offset, chunk.len())?;
        if out.len() != codec.encoded_len(chunk.len()) {
            return Err(Error::invalid(format!(
                "error feedback with codec {}: {} elements encode to {} bytes, got a buffer of {}",
                codec.name(),
                chunk.len(),
                codec.encoded_len(chunk.len()),
                out.len()
            )));
        }
        // The residual slot holds the compensated input while it is
        // encoded, then what the message did not carry: one scratch buffer
        // (the decoded message) instead of two.
        let residual = &mut self.residual[range];
        residual.iter_mut().zip(chunk).for_each(|(r, g)| *r += *g);
        codec.encode(residual, out)?;
        self.scratch.resize(chunk.len(), 0.0);
        codec.decode(out, &mut self.scratch)?;
        subtract_finite(residual, &self.scratch);
        Ok(())
    }

    /// Writes `chunk + residual` (elements `offset..`) into `out`, changing
    /// nothing: the first half of a step whose compressor is not a
    /// [`Codec`] (PowerSGD), or that encodes in pieces of its own.
    pub fn compensate_at(&self, offset: usize, chunk: &[f32], out: &mut [f32]) -> Result<()> {
        let range = self.range(offset, chunk.len())?;
        if out.len() != chunk.len() {
            return Err(Error::invalid(format!(
                "error feedback: {} elements to compensate into a buffer of {}",
                chunk.len(),
                out.len()
            )));
        }
        out.iter_mut()
            .zip(chunk.iter().zip(&self.residual[range]))
            .for_each(|(o, (g, r))| *o = *g + *r);
        Ok(())
    }

    /// The second half: the residual of elements `offset..` becomes
    /// `compensated - sent`, where `compensated` is what
    /// [`ErrorFeedback::compensate_at`] returned and `sent` what the
    /// receivers will take it for (the decoded message).
    pub fn record_at(&mut self, offset: usize, compensated: &[f32], sent: &[f32]) -> Result<()> {
        let range = self.range(offset, compensated.len())?;
        if sent.len() != compensated.len() {
            return Err(Error::invalid(format!(
                "error feedback: {} compensated elements but {} sent",
                compensated.len(),
                sent.len()
            )));
        }
        let residual = &mut self.residual[range];
        residual.copy_from_slice(compensated);
        subtract_finite(residual, sent);
        Ok(())
    }

    fn check_whole(&self, len: usize) -> Result<()> {
        if len == self.len() {
            Ok(())
        } else {
            Err(Error::invalid(format!(
                "error feedback kept for {} elements was given {len}; keep one ErrorFeedback per \
                 buffer (or use compress_at for a piece of it)",
                self.len()
            )))
        }
    }

    fn range(&self, offset: usize, len: usize) -> Result<std::ops::Range<usize>> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => Ok(offset..end),
            _ => Err(Error::invalid(format!(
                "error feedback: elements {offset}..{offset}+{len} are outside its buffer of {}",
                self.len()
            ))),
        }
    }
}

/// `residual[i] -= sent[i]`, then 0 where the result is not finite.
fn subtract_finite(residual: &mut [f32], sent: &[f32]) {
    residual.iter_mut().zip(sent).for_each(|(r, s)| {
        let left = *r - *s;
        *r = if left.is_finite() { left } else { 0.0 };
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compress::{Bf16, Fp16, Int8Block, Keep, OneBit, RandK, TopK};

    /// Deterministic gradients with a spread of magnitudes (and a bias, so
    /// that the small elements matter over many steps).
    fn gradient(step: u64, len: usize) -> Vec<f32> {
        let mut rng = crate::compress::rng::SplitMix64::new(step * 7 + 1);
        (0..len)
            .map(|i| {
                // Uniform in [-1, 1).
                let noise = (rng.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
                noise * if i % 10 == 0 { 3.0 } else { 0.05 } + 0.01
            })
            .collect()
    }

    /// Every biased codec, as it is at step `step` (Random-k draws new
    /// positions each step; its unscaled form is the one for error
    /// feedback).
    fn lossy_codecs(step: u64) -> Vec<Box<dyn Codec>> {
        vec![
            Box::new(Fp16),
            Box::new(Bf16),
            Box::new(Int8Block::new(64).unwrap()),
            Box::new(Int8Block::new(256).unwrap()),
            Box::new(OneBit::new(128).unwrap()),
            Box::new(TopK::new(Keep::Fraction(0.01)).unwrap()),
            Box::new(TopK::new(Keep::Count(3)).unwrap()),
            Box::new(
                RandK::new(Keep::Fraction(0.05), 11)
                    .unwrap()
                    .unscaled()
                    .at_step(step),
            ),
        ]
    }

    /// Runs `steps` steps of error feedback with the codec `codec_at(step)`
    /// on 1000 elements (not a multiple of any block) and
    /// checks that the decoded messages plus the final residual sum to the
    /// inputs. Returns the final residual's largest magnitude.
    fn check_invariant(steps: u64, codec_at: impl Fn(u64) -> Box<dyn Codec>) -> f32 {
        let len = 1000usize;
        let mut ef = ErrorFeedback::new(len);
        let mut given = vec![0f64; len];
        let mut sent = vec![0f64; len];
        let mut decoded = vec![0f32; len];
        let mut largest = 3.1f32; // the largest gradient element
        let name = codec_at(0).name();
        for step in 0..steps {
            let codec = codec_at(step);
            let grad = gradient(step, len);
            let wire = ef.compress_to_vec(&grad, codec.as_ref()).unwrap();
            assert_eq!(wire.len(), codec.encoded_len(len));
            codec.decode(&wire, &mut decoded).unwrap();
            given
                .iter_mut()
                .zip(&grad)
                .for_each(|(s, &g)| *s += g as f64);
            sent.iter_mut()
                .zip(&decoded)
                .for_each(|(s, &v)| *s += v as f64);
            largest = ef.residual().iter().fold(largest, |m, r| m.max(r.abs()));
        }
        // Each step's f32 arithmetic (g + e, then (g + e) - v) rounds by at
        // most an ulp of the compensated value; the residual of a sparse
        // codec grows to many steps' worth of gradient.
        let tol = 4.0 * steps as f64 * f32::EPSILON as f64 * (largest as f64 + 3.1);
        for i in 0..len {
            let err = (sent[i] + ef.residual()[i] as f64 - given[i]).abs();
            assert!(
                err <= tol,
                "{name}: element {i} off by {err} (tolerance {tol})"
            );
        }
        ef.residual().iter().fold(0f32, |m, r| m.max(r.abs()))
    }

    #[test]
    fn what_was_sent_plus_what_is_kept_is_what_was_given() {
        for which in 0..lossy_codecs(0).len() {
            check_invariant(200, |step| lossy_codecs(step).swap_remove(which));
        }
    }

    #[test]
    fn rescaled_random_k_must_not_be_given_error_feedback() {
        // The identity holds while the numbers last, but the residual of
        // the rescaled (unbiased) form grows geometrically: each time an
        // element is kept its residual becomes -(n/K - 1) times itself.
        let rescaled = |step| -> Box<dyn Codec> {
            Box::new(RandK::new(Keep::Fraction(0.05), 11).unwrap().at_step(step))
        };
        let early = check_invariant(5, rescaled);
        let later = check_invariant(40, rescaled);
        assert!(later > 100.0 * early.max(1.0), "{early} -> {later}");
        // The unscaled form stays bounded by a few steps' worth of gradient.
        let unscaled = |step| -> Box<dyn Codec> {
            Box::new(
                RandK::new(Keep::Fraction(0.05), 11)
                    .unwrap()
                    .unscaled()
                    .at_step(step),
            )
        };
        assert!(check_invariant(40, unscaled) < 40.0 * 3.1);
    }

    #[test]
    fn error_feedback_moves_small_values_that_top_k_alone_never_sends() {
        // The seeds' example: a value too small to be picked by itself is
        // delivered once its residual has grown past the others.
        let codec = TopK::new(Keep::Count(1)).unwrap();
        let mut ef = ErrorFeedback::new(2);
        let mut out = [0f32; 2];
        let mut small_sent = 0.0;
        for _ in 0..10 {
            let wire = ef.compress_to_vec(&[1.0, 0.3], &codec).unwrap();
            codec.decode(&wire, &mut out).unwrap();
            small_sent += out[1];
        }
        assert!(small_sent >= 2.0, "sent {small_sent} of the 3.0 given");
        // Without it, the small value never goes.
        let wire = codec.encode_to_vec(&[1.0, 0.3]).unwrap();
        codec.decode(&wire, &mut out).unwrap();
        assert_eq!(out[1], 0.0);
    }

    #[test]
    fn pieces_of_a_buffer_keep_their_own_residual() {
        let codec = Int8Block::new(64).unwrap();
        let grad = gradient(0, 300);
        let mut whole = ErrorFeedback::new(300);
        whole.compress_to_vec(&grad, &codec).unwrap();
        let mut pieces = ErrorFeedback::new(300);
        for (offset, end) in [(0, 128), (128, 300)] {
            let mut out = vec![0u8; codec.encoded_len(end - offset)];
            pieces
                .compress_at(offset, &grad[offset..end], &codec, &mut out)
                .unwrap();
        }
        // Cut at a block boundary, the pieces are quantized exactly as the
        // whole buffer is.
        assert_eq!(whole.residual(), pieces.residual());
    }

    #[test]
    fn compensate_and_record_are_compress_in_two_halves() {
        let codec = OneBit::new(64).unwrap();
        let grad = gradient(1, 200);
        let mut a = ErrorFeedback::new(200);
        let mut b = ErrorFeedback::new(200);
        for _ in 0..3 {
            let wire = a.compress_to_vec(&grad, &codec).unwrap();
            let mut comp = vec![0f32; 200];
            b.compensate_at(0, &grad, &mut comp).unwrap();
            let mut sent = vec![0f32; 200];
            codec
                .decode(&codec.encode_to_vec(&comp).unwrap(), &mut sent)
                .unwrap();
            assert_eq!(wire, codec.encode_to_vec(&comp).unwrap());
            b.record_at(0, &comp, &sent).unwrap();
            assert_eq!(a.residual(), b.residual());
        }
    }

    #[test]
    fn non_finite_inputs_do_not_poison_later_steps() {
        for codec in lossy_codecs(0) {
            let mut ef = ErrorFeedback::new(300);
            let mut grad = gradient(2, 300);
            grad[7] = f32::INFINITY;
            grad[100] = f32::NAN;
            let wire = ef.compress_to_vec(&grad, codec.as_ref()).unwrap();
            let mut out = vec![0f32; 300];
            codec.decode(&wire, &mut out).unwrap();
            assert!(
                out.iter().any(|y| !y.is_finite()),
                "{}: the overflow must show in the message",
                codec.name()
            );
            assert!(
                ef.residual().iter().all(|r| r.is_finite()),
                "{}",
                codec.name()
            );
            let wire = ef
                .compress_to_vec(&gradient(3, 300), codec.as_ref())
                .unwrap();
            codec.decode(&wire, &mut out).unwrap();
            assert!(out.iter().all(|y| y.is_finite()), "{}", codec.name());
        }
    }

    #[test]
    fn misuse_is_an_error() {
        let codec = Fp16;
        let mut ef = ErrorFeedback::new(10);
        assert!(ef.compress_to_vec(&[1.0; 9], &codec).is_err());
        let mut out = vec![0u8; 8];
        assert!(ef.compress_at(8, &[1.0; 4], &codec, &mut out).is_err());
        assert!(ef
            .compress_at(usize::MAX, &[1.0; 4], &codec, &mut out)
            .is_err());
        assert!(ef.compress_at(6, &[1.0; 4], &codec, &mut out[..7]).is_err());
        assert!(ef.compress_at(6, &[1.0; 4], &codec, &mut out).is_ok());
        assert!(ef.record_at(0, &[1.0; 3], &[1.0; 2]).is_err());
        assert!(ef.compensate_at(0, &[1.0; 3], &mut [0.0; 2]).is_err());
        ef.reset();
        assert!(ef.residual().iter().all(|&r| r == 0.0));
        let mut empty = ErrorFeedback::new(0);
        assert!(empty.is_empty());
        assert!(empty.compress_to_vec(&[], &codec).unwrap().is_empty());
    }
}
