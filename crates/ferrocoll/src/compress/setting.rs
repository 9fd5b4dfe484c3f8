//! `FERROCOLL_COMPRESS` and [`crate::CallOptions::compress`]: whether the
//! library's own allreduce may run compressed ([`CompressSetting`]), and
//! how that is read.
//!
//! Only an allreduce the codecs can carry is eligible: `f32` elements, op
//! `Sum` or `Avg` (what [`super::Compressor::all_reduce`] takes, the same
//! constraints `ferrocoll bench --compress` checks), at least 2 ranks, a
//! non-empty buffer, and no algorithm forced for it (a forced algorithm,
//! per call or by `FERROCOLL_ALGO`, names an uncompressed one). Every
//! other call is unchanged. Lossy codecs never run unless asked for here.

use crate::error::{Error, Result};

/// What eligible allreduces do about compression.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum CompressSetting {
    /// Never compress (the default, and `FERROCOLL_COMPRESS=off`).
    #[default]
    Off,
    /// `auto:CODEC`: compress with the codec where the cost model predicts
    /// the compressed allreduce is faster than the best uncompressed
    /// algorithm ([`super::auto`]), on the communicator's profile (rank
    /// 0's, shared at start-up), so every rank decides alike.
    Auto(String),
    /// `CODEC` alone: compress every eligible allreduce, whatever the
    /// model predicts (to try a codec's effect on training without changing
    /// the training code).
    Always(String),
}

/// The forms [`CompressSetting::parse`] takes, for error messages.
pub(crate) const FORMS: &str =
    "off, auto:CODEC (compress where the cost model predicts a gain) or \
    CODEC (always compress), CODEC one of fp16, bf16, int8[:BLOCK], onebit[:BLOCK], topk:K, \
    randk:K[:SEED[:unscaled]] (K a fraction like 0.01 or a count), e.g. auto:int8 or \
    auto:topk:0.01";

impl CompressSetting {
    /// Reads `off` (also `0`, `none`, `no`, `false`), `auto:CODEC` or
    /// `CODEC`, with CODEC as [`super::parse`] takes it (`auto:int8`,
    /// `auto:topk:0.01`, `onebit:128`). The codec is stored as
    /// [`super::Codec::name`] writes it (`int8` becomes `int8:128`).
    ///
    /// PowerSGD is refused here: it needs the gradient's matrix shape and
    /// its warm start carried from step to step, which an allreduce of a
    /// flat buffer has neither of (the DDP hook `powersgd` and
    /// [`super::Compressor`] have both).
    pub fn parse(text: &str) -> Result<CompressSetting> {
        let text = text.trim();
        if ["off", "0", "none", "no", "false"]
            .iter()
            .any(|w| text.eq_ignore_ascii_case(w))
        {
            return Ok(CompressSetting::Off);
        }
        let (auto, spec) = match text.split_once(':') {
            Some((head, rest)) if head.trim().eq_ignore_ascii_case("auto") => (true, rest.trim()),
            _ if text.eq_ignore_ascii_case("auto") => {
                return Err(Error::invalid(format!(
                    "`auto` needs the codec to consider: auto:CODEC; give {FORMS}"
                )))
            }
            _ => (false, text),
        };
        if spec
            .split(':')
            .next()
            .is_some_and(|k| k.trim().eq_ignore_ascii_case("powersgd"))
        {
            return Err(Error::invalid(format!(
                "`{spec}`: PowerSGD needs the gradient's matrix shape and a warm start kept from \
                 step to step, which a plain allreduce of a flat buffer has neither of; use the \
                 DDP hook ferrocoll.torch.hooks.powersgd or compress::Compressor, or give {FORMS}"
            )));
        }
        let codec = super::parse(spec)
            .map_err(|e| Error::invalid(format!("{}; give {FORMS}", crate::env::reason(e))))?;
        let name = codec.name();
        Ok(if auto {
            CompressSetting::Auto(name)
        } else {
            CompressSetting::Always(name)
        })
    }

    /// The codec it names (`None` when off).
    pub fn codec(&self) -> Option<&str> {
        match self {
            CompressSetting::Off => None,
            CompressSetting::Auto(c) | CompressSetting::Always(c) => Some(c),
        }
    }
}

impl std::fmt::Display for CompressSetting {
    /// The form [`CompressSetting::parse`] reads back.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CompressSetting::Off => f.write_str("off"),
            CompressSetting::Auto(c) => write!(f, "auto:{c}"),
            CompressSetting::Always(c) => f.write_str(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_off_auto_and_always_and_writes_them_back() {
        for (text, want) in [
            ("off", CompressSetting::Off),
            ("OFF", CompressSetting::Off),
            ("0", CompressSetting::Off),
            ("auto:int8", CompressSetting::Auto("int8:128".into())),
            (
                " Auto:topk:0.01 ",
                CompressSetting::Auto("topk:0.01".into()),
            ),
            (
                "auto:onebit:128",
                CompressSetting::Auto("onebit:128".into()),
            ),
            ("int8:64", CompressSetting::Always("int8:64".into())),
            ("fp16", CompressSetting::Always("fp16".into())),
            (
                "auto:randk:0.1:7",
                CompressSetting::Auto("randk:0.1:7".into()),
            ),
        ] {
            let got = CompressSetting::parse(text).unwrap();
            assert_eq!(got, want, "{text}");
            assert_eq!(CompressSetting::parse(&got.to_string()).unwrap(), got);
        }
        assert_eq!(CompressSetting::Off.codec(), None);
        assert_eq!(CompressSetting::Auto("fp16".into()).codec(), Some("fp16"));
    }

    #[test]
    fn refuses_what_it_cannot_run_listing_the_forms() {
        for bad in [
            "auto",
            "auto:",
            "zip",
            "auto:zip",
            "int8:0",
            "auto:topk",
            "auto:topk:1.5",
            "powersgd:4",
            "auto:powersgd",
            "on",
        ] {
            let err = CompressSetting::parse(bad).unwrap_err().to_string();
            assert!(
                err.contains("auto:CODEC") && err.contains("int8"),
                "{bad}: {err}"
            );
        }
    }
}
