//! Gradient compression: codecs and error feedback.
//!
//! A [`Codec`] turns a chunk of `f32` values into bytes for the wire and
//! back. Every codec here has three properties the collectives built on it
//! rely on:
//!
//! * **Exact, data-independent length.** [`Codec::encoded_len`] gives the
//!   wire bytes of `n` elements before anything is encoded, for any values.
//!   The transports receive messages of an exact length, and the cost model
//!   scales bytes by it ([`Codec::ratio`]).
//! * **Self-contained chunks.** An encoded chunk decodes from its bytes, its
//!   element count and the codec's parameters alone: no state of another
//!   chunk, another rank or another step. Any chunk of a buffer (a
//!   reduce-scatter's slice) can be encoded on its own. Blocked codecs
//!   restart their blocks at the chunk's first element, so splitting a
//!   buffer at a multiple of [`Codec::granule`] encodes to exactly the
//!   concatenation of the pieces' encodings (and chunks split elsewhere
//!   simply carry one more, shorter, block).
//! * **Accumulation in `f32`.** [`Codec::decode_add`] decodes and adds into
//!   an `f32` buffer in one pass (what a reduce-scatter hop does with what it
//!   receives); nothing is ever summed in the reduced precision.
//!
//! | codec | type | wire bytes for `n` elements | ratio vs f32 |
//! |---|---|---|---|
//! | `fp16` | [`Fp16`] | `2n` | 2 |
//! | `bf16` | [`Bf16`] | `2n` | 2 |
//! | `int8:B` | [`Int8Block`] | `n + 4 ceil(n/B)` | `4B/(B+4)`: 3.88 at B = 128 |
//! | `onebit:B` | [`OneBit`] | `4 ceil(n/B) + ceil(n/8)` | `32B/(B+32)`: 25.6 at B = 128 |
//! | `topk:F` | [`TopK`] | `4 ceil(n/65536) + 6K` | `~ 2/(3F)`: 66.7 at F = 1% |
//! | `randk:F:SEED` | [`RandK`] | `4K` | `1/F` |
//! | (PowerSGD, rank r) | [`PowerSgd`] | `4 (rows + cols) r`, in two allreduces | `rows cols / ((rows + cols) r)`: 512 at 4096 x 4096, r = 4 |
//!
//! `K`, the elements a sparse codec keeps, is [`Keep::of`]`(n)`: `ceil(F n)`
//! for a fraction, `min(k, n)` for a count.
//!
//! The wire layout of each is documented on its type; all multi-byte values
//! are little-endian and nothing is aligned. PowerSGD ([`PowerSgd`]) is not
//! a codec of this shape (it needs two allreduces with an
//! orthogonalisation between them) and has its own state type.
//!
//! [`ErrorFeedback`] is the residual a caller keeps across steps for one
//! buffer: it adds what earlier steps did not send before compressing, and
//! keeps what this step did not send.
//!
//! # Non-finite values
//!
//! A NaN or infinity in a gradient is how mixed-precision training learns
//! that its loss scale overflowed (torch's `GradScaler` skips the step), so
//! no codec hides one: if an encoded chunk's input holds a non-finite value,
//! its decoded output holds a non-finite value too, and the damage stays
//! local (see each codec for where exactly; a codec that keeps nothing,
//! Top-k or Random-k with `K = 0`, sends nothing at all). [`ErrorFeedback`]
//! does not carry a non-finite residual into later steps.
//!
//! # Kernels
//!
//! Each codec dispatches once per call (through `&dyn Codec` or a generic)
//! and then runs plain loops over slices, written so that LLVM vectorises
//! them: no per-element dispatch, no per-element allocation, reductions
//! with independent lanes. `benches/compress.rs` reports their throughput
//! next to a memcpy.
//!
//! ```
//! use ferrocoll::compress::{Codec, ErrorFeedback, Int8Block};
//!
//! let codec = Int8Block::new(128)?;
//! let grad = vec![0.25f32; 1000];
//! let mut ef = ErrorFeedback::new(grad.len());
//! let wire = ef.compress_to_vec(&grad, &codec)?;
//! assert_eq!(wire.len(), codec.encoded_len(1000)); // 1000 + 4 * 8 bytes
//! let mut got = vec![0.0f32; 1000];
//! codec.decode(&wire, &mut got)?;
//! // What was sent plus what is kept is what was given.
//! assert!((got[0] + ef.residual()[0] - 0.25).abs() < 1e-7);
//! # Ok::<(), ferrocoll::Error>(())
//! ```

use std::fmt;

use crate::error::{Error, Result};

pub mod auto;
pub mod collective;
mod feedback;
mod float16;
mod int8;
mod onebit;
mod powersgd;
mod randk;
mod rng;
mod setting;
mod topk;

pub use collective::{CompressOptions, Compressor, WireStats};
pub use feedback::ErrorFeedback;
pub use float16::{Bf16, Fp16};
pub use int8::Int8Block;
pub use onebit::OneBit;
pub use powersgd::{PowerSgd, PowerSgdConfig};
pub use randk::RandK;
pub use setting::CompressSetting;
pub use topk::TopK;

/// Compresses chunks of `f32` values for the wire.
///
/// Implementations are pure functions of their parameters and the data:
/// `encode` writes exactly [`Codec::encoded_len`] bytes, `decode` reads them
/// back; both fail (never panic) on buffers of the wrong length, and
/// `decode` fails on bytes that are not a valid encoding where the codec can
/// tell (an index out of range). See the [module documentation](self) for
/// the properties every codec keeps.
pub trait Codec: Send + Sync + fmt::Debug {
    /// The codec and its parameters as [`parse`] reads them (`int8:128`,
    /// `topk:0.01`), for diagnostics and benchmark output.
    fn name(&self) -> String;

    /// Exact number of wire bytes of a chunk of `n` elements, whatever its
    /// values.
    fn encoded_len(&self, n: usize) -> usize;

    /// Encodes `src` into `dst`, which must be exactly
    /// `self.encoded_len(src.len())` bytes.
    fn encode(&self, src: &[f32], dst: &mut [u8]) -> Result<()>;

    /// Decodes `src`, the encoding of `dst.len()` elements, into `dst`
    /// (overwriting it).
    fn decode(&self, src: &[u8], dst: &mut [f32]) -> Result<()>;

    /// Decodes `src` and adds the result into `dst` (`dst[i] +=
    /// decoded[i]`, in `f32`): the step of a reduction that receives an
    /// encoded operand. Elements a sparse codec did not keep are left as
    /// they are.
    fn decode_add(&self, src: &[u8], dst: &mut [f32]) -> Result<()>;

    /// Whether decoding loses information for some input (true for every
    /// codec of this module: even fp16 rounds).
    fn lossy(&self) -> bool {
        true
    }

    /// Whether the encoded bytes are a pure function of the input, the
    /// element count and the codec's parameters (a seed included), so every
    /// rank, and a local reference, computes bitwise the same message.
    fn deterministic(&self) -> bool {
        true
    }

    /// Whether the decoded value is an unbiased estimate of the input over
    /// the codec's randomness (Random-k: over its seeds). An unbiased codec
    /// needs no error feedback to converge.
    fn unbiased(&self) -> bool {
        false
    }

    /// `Some(g)` when encoding a chunk whose length is a multiple of `g`
    /// followed by any chunk gives exactly the concatenation of their two
    /// encodings (so encoded chunks can be gathered and decoded as one, and
    /// a plan that cuts buffers at multiples of `g` pays no extra block
    /// headers); `None` for codecs whose chunks depend on the whole chunk
    /// (Top-k and Random-k choose K per chunk).
    fn granule(&self) -> Option<usize>;

    /// Compression ratio at `n` elements: `4n / encoded_len(n)` (`f32`
    /// bytes over wire bytes); 1 for `n = 0`.
    fn ratio(&self, n: usize) -> f64 {
        let wire = self.encoded_len(n);
        if n == 0 || wire == 0 {
            1.0
        } else {
            (4 * n) as f64 / wire as f64
        }
    }

    /// [`Codec::encode`] into a new vector of the exact length.
    fn encode_to_vec(&self, src: &[f32]) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.encoded_len(src.len())];
        self.encode(src, &mut out)?;
        Ok(out)
    }
}

/// How many elements of a chunk a sparse codec keeps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Keep {
    /// A fraction of the chunk, in `[0, 1]`: `K = ceil(f n)`, so any
    /// non-empty chunk keeps at least one element when `f > 0`. A product
    /// within a relative 1e-9 of an integer counts as that integer, so
    /// that the rounding of `f` does not add one (`0.07 * 100` is
    /// `7.000000000000001` in `f64`; K is 7).
    Fraction(f64),
    /// A number of elements per chunk: `K = min(k, n)`. A collective that
    /// encodes a buffer in several chunks keeps `k` of each.
    Count(usize),
}

impl Keep {
    /// `K` for a chunk of `n` elements (never more than `n`).
    pub fn of(&self, n: usize) -> usize {
        match *self {
            Keep::Fraction(f) => {
                let exact = f * n as f64;
                let nearest = exact.round();
                let k = if (exact - nearest).abs() <= 1e-9 * nearest.max(1.0) {
                    nearest
                } else {
                    exact.ceil()
                };
                (k as usize).min(n)
            }
            Keep::Count(k) => k.min(n),
        }
    }

    /// Checks the parameter (a fraction must be finite and in `[0, 1]`).
    fn validate(self, codec: &str) -> Result<Keep> {
        match self {
            Keep::Fraction(f) if !(0.0..=1.0).contains(&f) => Err(Error::invalid(format!(
                "{codec}: the fraction of elements to keep must be in [0, 1], got {f}"
            ))),
            keep => Ok(keep),
        }
    }

    /// `0.01` for a fraction, `1000` for a count: how [`parse`] reads it.
    fn spec(&self) -> String {
        match self {
            Keep::Fraction(f) => format!("{f:?}"),
            Keep::Count(k) => k.to_string(),
        }
    }

    /// Reads `0.01`, `1%` or `1e-3` as a fraction and `1000` as a count.
    fn parse(codec: &str, text: &str) -> Result<Keep> {
        let bad = || {
            Error::invalid(format!(
                "{codec}: `{text}` is neither a fraction (0.01, 1%) nor a count (1000)"
            ))
        };
        let keep = if let Some(percent) = text.strip_suffix('%') {
            Keep::Fraction(percent.parse::<f64>().map_err(|_| bad())? / 100.0)
        } else if let Ok(count) = text.parse::<usize>() {
            Keep::Count(count)
        } else {
            Keep::Fraction(text.parse::<f64>().map_err(|_| bad())?)
        };
        keep.validate(codec)
    }
}

/// Builds a codec from its name as [`Codec::name`] writes it (the form
/// `FERROCOLL_COMPRESS` and the command line will take):
///
/// * `fp16`, `bf16`
/// * `int8` or `int8:BLOCK` (block 128 by default)
/// * `onebit` or `onebit:BLOCK` (block 128 by default)
/// * `topk:K` with `K` a fraction (`0.01`, `1%`) or a count (`1000`); an
///   integer is a count: `topk:1` keeps one element, `topk:1.0` all of them
/// * `randk:K`, `randk:K:SEED` (seed 0 by default; every rank must use the
///   same one, and advance [`RandK::at_step`] together) or
///   `randk:K:SEED:unscaled` ([`RandK::unscaled`], the form for error
///   feedback)
///
/// PowerSGD is not a [`Codec`]; see [`PowerSgd`].
pub fn parse(spec: &str) -> Result<Box<dyn Codec>> {
    let mut parts = spec.trim().split(':');
    let kind = parts.next().unwrap_or_default().to_ascii_lowercase();
    let args: Vec<&str> = parts.collect();
    let arity = |max: usize| -> Result<()> {
        if args.len() > max {
            Err(Error::invalid(format!(
                "codec `{spec}`: {kind} takes at most {max} parameter(s)"
            )))
        } else {
            Ok(())
        }
    };
    let block = |default: usize| -> Result<usize> {
        match args.first() {
            None => Ok(default),
            Some(b) => b.parse().map_err(|_| {
                Error::invalid(format!("codec `{spec}`: block size `{b}` is not a number"))
            }),
        }
    };
    let codec: Box<dyn Codec> = match kind.as_str() {
        "fp16" => {
            arity(0)?;
            Box::new(Fp16)
        }
        "bf16" => {
            arity(0)?;
            Box::new(Bf16)
        }
        "int8" => {
            arity(1)?;
            Box::new(Int8Block::new(block(Int8Block::DEFAULT_BLOCK)?)?)
        }
        "onebit" => {
            arity(1)?;
            Box::new(OneBit::new(block(OneBit::DEFAULT_BLOCK)?)?)
        }
        "topk" | "randk" => {
            let k = args.first().ok_or_else(|| {
                Error::invalid(format!(
                    "codec `{spec}`: {kind} needs the number to keep: {kind}:0.01 or {kind}:1000"
                ))
            })?;
            let keep = Keep::parse(spec, k)?;
            if kind == "topk" {
                arity(1)?;
                Box::new(TopK::new(keep)?)
            } else {
                arity(3)?;
                Box::new(randk_of(spec, keep, &args[1..])?)
            }
        }
        _ => {
            return Err(Error::invalid(format!(
                "unknown codec `{spec}`; valid: fp16, bf16, int8[:BLOCK], onebit[:BLOCK], \
                 topk:K, randk:K[:SEED] (K a fraction like 0.01 or a count)"
            )))
        }
    };
    Ok(codec)
}

/// Random-k from the parameters after its `K`: `[SEED[:unscaled]]`.
fn randk_of(spec: &str, keep: Keep, rest: &[&str]) -> Result<RandK> {
    let seed = match rest.first() {
        None => 0,
        Some(s) => s
            .parse()
            .map_err(|_| Error::invalid(format!("codec `{spec}`: seed `{s}` is not a u64")))?,
    };
    let codec = RandK::new(keep, seed)?;
    match rest.get(1) {
        None => Ok(codec),
        Some(&"unscaled") => Ok(codec.unscaled()),
        Some(other) => Err(Error::invalid(format!(
            "codec `{spec}`: `{other}` is not `unscaled`"
        ))),
    }
}

/// [`parse`] for a Random-k spec, as its own type: `None` when `spec` names
/// another codec. The compressed collectives need the type to move its
/// step and stream ([`RandK::at_step`], [`RandK::with_stream`]) and to know
/// whether it rescales.
pub(crate) fn parse_randk(spec: &str) -> Option<Result<RandK>> {
    let mut parts = spec.trim().split(':');
    if !parts.next()?.eq_ignore_ascii_case("randk") {
        return None;
    }
    let args: Vec<&str> = parts.collect();
    Some(match args.split_first() {
        None => Err(Error::invalid(format!(
            "codec `{spec}`: randk needs the number to keep: randk:0.01 or randk:1000"
        ))),
        Some(_) if args.len() > 3 => Err(Error::invalid(format!(
            "codec `{spec}`: randk takes at most 3 parameter(s)"
        ))),
        Some((k, rest)) => Keep::parse(spec, k).and_then(|keep| randk_of(spec, keep, rest)),
    })
}

/// Fails unless an encoding of `n` elements has the codec's exact length.
fn check_encoded(codec: &dyn Codec, n: usize, bytes: usize, what: &str) -> Result<()> {
    let want = codec.encoded_len(n);
    if bytes == want {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "codec {}: {what} of {n} elements takes exactly {want} bytes, got a buffer of {bytes}",
            codec.name()
        )))
    }
}

/// Checks a block size for the blocked codecs.
fn check_block(codec: &str, block: usize, multiple_of: usize) -> Result<usize> {
    if (multiple_of..=MAX_BLOCK).contains(&block) && block % multiple_of == 0 {
        Ok(block)
    } else {
        Err(Error::invalid(format!(
            "{codec}: block size must be a multiple of {multiple_of} in {multiple_of}..={MAX_BLOCK} \
             (64, 128 or 256 are usual), got {block}"
        )))
    }
}

/// Largest block of the blocked codecs (a block's element count fits 16
/// bits' worth of positions, as Top-k's blocks do).
const MAX_BLOCK: usize = 65_536;

/// Reads the little-endian `f32` at byte `at` (unaligned).
#[inline(always)]
fn get_f32(bytes: &[u8], at: usize) -> f32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    f32::from_le_bytes(word)
}

/// Writes `v` as a little-endian `f32` at byte `at` (unaligned).
#[inline(always)]
fn put_f32(bytes: &mut [u8], at: usize, v: f32) {
    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// The magnitude bits of an `f32` (its bits with the sign cleared): for
/// non-negative floats the unsigned order of these bits is the numeric
/// order, with every infinity above every finite value and every NaN above
/// infinity. Integer compares of these vectorise where float compares with
/// NaN checks do not.
#[inline(always)]
fn magnitude_bits(x: f32) -> u32 {
    x.to_bits() & 0x7fff_ffff
}

/// Magnitude bits of +infinity; anything at or above is not finite.
const INF_BITS: u32 = 0x7f80_0000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_reads_what_name_writes() {
        for spec in [
            "fp16",
            "bf16",
            "int8:64",
            "int8:128",
            "onebit:256",
            "topk:0.01",
            "topk:1000",
            "randk:0.25:7",
            "randk:0.25:7:unscaled",
        ] {
            let codec = parse(spec).unwrap();
            assert_eq!(codec.name(), spec);
            assert_eq!(parse(&codec.name()).unwrap().name(), spec);
        }
        assert_eq!(parse("int8").unwrap().name(), "int8:128");
        assert_eq!(parse("topk:1%").unwrap().name(), "topk:0.01");
        assert_eq!(parse("randk:0.5").unwrap().name(), "randk:0.5:0");
    }

    #[test]
    fn parse_rejects_what_it_cannot_build() {
        for spec in [
            "",
            "zip",
            "int8:0",
            "int8:65537",
            "int8:x",
            "onebit:12",
            "topk",
            "topk:1.5",
            "topk:-1",
            "topk:abc",
            "randk:0.1:x",
            "fp16:2",
            "topk:0.1:3",
            "randk:0.1:3:scaled",
            "randk:0.1:3:unscaled:4",
        ] {
            let err = parse(spec).unwrap_err().to_string();
            assert!(err.starts_with("invalid argument"), "{spec}: {err}");
        }
    }

    #[test]
    fn parse_randk_gives_the_type_parse_boxes() {
        let c = parse_randk("randk:0.1:3:unscaled").unwrap().unwrap();
        assert_eq!(c.name(), "randk:0.1:3:unscaled");
        assert!(!c.rescales());
        assert_eq!(parse_randk("RandK:5").unwrap().unwrap().name(), "randk:5:0");
        assert!(parse_randk("int8:128").is_none());
        for bad in [
            "randk",
            "randk:2.0",
            "randk:0.1:x",
            "randk:0.1:1:unscaled:2",
        ] {
            let err = parse_randk(bad).unwrap().unwrap_err().to_string();
            assert_eq!(err, parse(bad).unwrap_err().to_string(), "{bad}");
        }
    }

    #[test]
    fn keep_counts_what_it_says() {
        assert_eq!(Keep::Fraction(0.01).of(1000), 10);
        assert_eq!(Keep::Fraction(0.01).of(1001), 11);
        assert_eq!(Keep::Fraction(0.01).of(1), 1);
        // 0.07 * 100 = 7.000000000000001 in f64: still 7.
        assert!(std::hint::black_box(0.07f64) * 100.0 > 7.0);
        assert_eq!(Keep::Fraction(0.07).of(100), 7);
        assert_eq!(Keep::Fraction(0.07).of(101), 8);
        for n in 1..5000 {
            for f in [0.001, 0.01, 0.07, 0.1, 0.3] {
                let k = Keep::Fraction(f).of(n);
                assert!(k as f64 >= f * n as f64 - 1e-6 && k >= 1, "{f} of {n}: {k}");
                assert!((k as f64) < f * n as f64 + 1.0, "{f} of {n}: {k}");
            }
        }
        assert_eq!(Keep::Fraction(0.0).of(1000), 0);
        assert_eq!(Keep::Fraction(1.0).of(1000), 1000);
        assert_eq!(Keep::Fraction(0.5).of(0), 0);
        assert_eq!(Keep::Count(10).of(3), 3);
        assert_eq!(Keep::Count(10).of(300), 10);
    }

    #[test]
    fn ratios_are_the_seeds_closed_forms() {
        // 4b/(b+4) for block int8: 3.88 at b = 128 (the seeds' figure).
        let int8 = Int8Block::new(128).unwrap();
        assert!((int8.ratio(128 * 1024) - 4.0 * 128.0 / 132.0).abs() < 1e-12);
        assert_eq!(format!("{:.2}", int8.ratio(1 << 20)), "3.88");
        assert_eq!(Fp16.ratio(1000), 2.0);
        // Top-k with 16-bit indices: 4n / (6K + 4 n/65536).
        let topk = TopK::new(Keep::Fraction(0.001)).unwrap();
        let n = 1 << 20;
        let want = (4 * n) as f64 / (6 * 1049 + 4 * 16) as f64;
        assert!((topk.ratio(n) - want).abs() < 1e-9);
        assert_eq!(Fp16.ratio(0), 1.0);
    }
}
