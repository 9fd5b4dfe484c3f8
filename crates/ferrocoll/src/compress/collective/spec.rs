//! What a codec spec names ([`Scheme`]) and how it is read.

use super::CompressOptions;
use crate::compress::{Codec, PowerSgd, PowerSgdConfig, RandK};
use crate::error::{Error, Result};

/// What a [`super::Compressor`] runs.
#[derive(Debug)]
pub(super) enum Scheme {
    /// A quantizer: the two-phase algorithm.
    Dense(Box<dyn Codec>),
    /// Top-k: allgather of the payloads.
    TopK(Box<dyn Codec>),
    /// Random-k: allreduce of the values.
    RandK(RandK),
    /// PowerSGD: two allreduces.
    PowerSgd(Box<PowerSgd>),
}

impl Scheme {
    pub(super) fn algorithm(&self) -> &'static str {
        match self {
            Scheme::Dense(_) => "two-phase",
            Scheme::TopK(_) => "allgather",
            Scheme::RandK(_) => "allreduce-values",
            Scheme::PowerSgd(_) => "powersgd",
        }
    }
}

impl Scheme {
    /// The scheme of `spec` for `len` elements, and whether it keeps
    /// residuals.
    pub(super) fn parse(
        spec: &str,
        len: usize,
        options: CompressOptions,
    ) -> Result<(Scheme, bool)> {
        let trimmed = spec.trim();
        let kind = trimmed.split(':').next().unwrap_or_default();
        if kind.eq_ignore_ascii_case("powersgd") {
            let config = powersgd_config(trimmed, options.error_feedback.unwrap_or(true))?;
            let state = PowerSgd::new(len, config)?;
            return Ok((Scheme::PowerSgd(Box::new(state)), config.error_feedback));
        }
        if let Some(randk) = crate::compress::parse_randk(trimmed) {
            let randk = randk?;
            let feedback = match (randk.rescales(), options.error_feedback) {
                (true, Some(true)) => {
                    return Err(Error::invalid(format!(
                        "codec `{spec}`: the rescaled Random-k is unbiased and must not get error \
                         feedback (its residual grows without bound); use `{}:unscaled` for \
                         error feedback",
                        randk.name()
                    )))
                }
                (rescales, asked) => asked.unwrap_or(!rescales),
            };
            return Ok((Scheme::RandK(randk), feedback));
        }
        let codec = crate::compress::parse(trimmed).map_err(|e| match e {
            Error::InvalidArgument(msg) if msg.starts_with("unknown codec") => {
                Error::InvalidArgument(format!("{msg}, powersgd[:RANK[:ROWSxCOLS[:SEED]]]"))
            }
            other => other,
        })?;
        let feedback = options.error_feedback.unwrap_or(true);
        Ok(match codec.granule() {
            Some(_) => (Scheme::Dense(codec), feedback),
            None => (Scheme::TopK(codec), feedback),
        })
    }
}

/// Checks, without a communicator, that [`super::Compressor::new`] takes `spec`
/// for a buffer of `len` elements (a PowerSGD shape must hold exactly
/// `len`): for a command line to refuse a bad codec before it starts any
/// rank.
pub fn validate_spec(spec: &str, len: usize) -> Result<()> {
    Scheme::parse(spec, len, CompressOptions::default()).map(|_| ())
}

/// Reads `powersgd[:RANK[:ROWSxCOLS|auto[:SEED]]]`.
fn powersgd_config(spec: &str, error_feedback: bool) -> Result<PowerSgdConfig> {
    let args: Vec<&str> = spec.split(':').skip(1).collect();
    let bad = |what: &str| {
        Error::invalid(format!(
            "codec `{spec}`: {what}; write powersgd[:RANK[:ROWSxCOLS[:SEED]]], e.g. powersgd:4 \
             or powersgd:4:4096x4096"
        ))
    };
    if args.len() > 3 {
        return Err(bad("powersgd takes at most 3 parameters"));
    }
    let mut config = PowerSgdConfig {
        error_feedback,
        ..PowerSgdConfig::default()
    };
    if let Some(rank) = args.first() {
        config.rank = rank
            .parse()
            .map_err(|_| bad(&format!("rank `{rank}` is not a number")))?;
    }
    if let Some(shape) = args.get(1).filter(|s| !s.eq_ignore_ascii_case("auto")) {
        let (rows, cols) = shape
            .split_once(['x', 'X'])
            .and_then(|(r, c)| Some((r.parse().ok()?, c.parse().ok()?)))
            .ok_or_else(|| bad(&format!("shape `{shape}` is not ROWSxCOLS")))?;
        config.shape = Some((rows, cols));
    }
    if let Some(seed) = args.get(2) {
        config.seed = seed
            .parse()
            .map_err(|_| bad(&format!("seed `{seed}` is not a u64")))?;
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn powersgd_specs_parse() {
        let c = powersgd_config("powersgd:4:4096x4096:9", true).unwrap();
        assert_eq!((c.rank, c.shape, c.seed), (4, Some((4096, 4096)), 9));
        let c = powersgd_config("powersgd", false).unwrap();
        assert_eq!((c.rank, c.shape, c.error_feedback), (1, None, false));
        assert_eq!(
            powersgd_config("powersgd:2:auto", true).unwrap().shape,
            None
        );
        for bad in [
            "powersgd:x",
            "powersgd:2:4096",
            "powersgd:2:4x4:s",
            "powersgd:1:2x2:3:4",
        ] {
            let e = powersgd_config(bad, true).unwrap_err().to_string();
            assert!(e.contains("powersgd[:RANK"), "{bad}: {e}");
        }
    }
}
