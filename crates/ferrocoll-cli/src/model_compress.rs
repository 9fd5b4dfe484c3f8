//! `ferrocoll model allreduce --compress CODEC`: the compressed allreduce's
//! closed form (`ferrocoll::compress::collective::model`) next to the
//! uncompressed algorithms', and from which size on it pays.

use ferrocoll::compress::collective::model::{predict_all_reduce, CompressedCost};
use ferrocoll::cost::{self, Profile, Shape};
use ferrocoll::Topology;
use serde::Serialize;

use crate::error::CliError;

/// The compressed allreduce in `ferrocoll model`'s report (the `compressed`
/// object of its JSON).
#[derive(Debug, Serialize)]
pub(crate) struct CompressedOut {
    codec: String,
    algo: &'static str,
    time_us: f64,
    latency_us: f64,
    bandwidth_us: f64,
    compute_us: f64,
    /// Encoding, decoding and error feedback.
    codec_us: f64,
    /// Compressed bytes the busiest rank sends.
    wire_bytes: usize,
    /// Uncompressed bytes it sends within its node (hierarchical form).
    local_bytes: usize,
    /// The uncompressed choice's time over this one (above 1: it pays).
    speedup: f64,
    /// The smallest size of the sweep (1 KiB doubling to the larger of
    /// 1 GiB and the call) from which on it beats the uncompressed choice
    /// at every size; `None` if it never does.
    pays_from_bytes: Option<usize>,
}

/// The compressed allreduce of `bytes` (f32) with codec `spec` on
/// `topology` and `profile`, against the cheapest uncompressed algorithm;
/// `codec` overrides the codec's built-in time per byte.
pub(crate) fn report(
    spec: &str,
    bytes: usize,
    topology: &Topology,
    profile: &Profile,
    codec: Option<f64>,
) -> Result<CompressedOut, CliError> {
    let n = topology.size();
    let predict = |bytes: usize| -> Result<(CompressedCost, f64), CliError> {
        let len = bytes / 4;
        let compressed = predict_all_reduce(spec, len, topology, profile, codec)?;
        let mut shape = Shape::new(ferrocoll::Collective::AllReduce, n, len, 4);
        shape.topology = topology.clone();
        let best = cost::candidates(&shape, profile)
            .first()
            .map_or(0.0, |(_, c)| c.total());
        Ok((compressed, best))
    };
    let (c, best) = predict(bytes)?;
    let mut pays_from = None;
    let mut size = 1024usize;
    let top = bytes.max(1 << 30);
    while size <= top {
        // A PowerSGD shape fixed on the command line holds one size only.
        let Ok((at, uncompressed)) = predict(size) else {
            break;
        };
        if at.total() < uncompressed {
            pays_from.get_or_insert(size);
        } else {
            pays_from = None;
        }
        size *= 2;
    }
    Ok(CompressedOut {
        codec: spec.to_string(),
        algo: c.algorithm,
        time_us: c.total() * 1e6,
        latency_us: c.comm.latency * 1e6,
        bandwidth_us: c.comm.bandwidth * 1e6,
        compute_us: c.comm.compute * 1e6,
        codec_us: c.codec * 1e6,
        wire_bytes: c.wire_bytes,
        local_bytes: c.local_bytes,
        speedup: best / c.total().max(f64::MIN_POSITIVE),
        pays_from_bytes: pays_from,
    })
}

/// The report's lines for the table output.
pub(crate) fn lines(c: &CompressedOut, choice: &str) -> Vec<String> {
    let mut out = vec![
        format!(
            "# compressed with {} ({}): {:.3} us = latency {:.3} + bandwidth {:.3} + compute {:.3} + codec {:.3}",
            c.codec, c.algo, c.time_us, c.latency_us, c.bandwidth_us, c.compute_us, c.codec_us
        ),
        format!(
            "#   wire {} B per rank, {} B uncompressed within the node; {:.2}x the speed of {choice}{}",
            c.wire_bytes,
            c.local_bytes,
            c.speedup,
            if c.speedup > 1.0 { " (pays)" } else { " (does not pay)" }
        ),
    ];
    out.push(match c.pays_from_bytes {
        Some(b) => format!("#   compression pays from {b} B on (1 KiB doubling to 1 GiB)"),
        None => "#   compression does not pay at any size of 1 KiB doubling to 1 GiB here".into(),
    });
    out
}
