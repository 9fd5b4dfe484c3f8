//! `ferrocoll sim allreduce --compress CODEC`: the compressed allreduce of
//! `ferrocoll::compress` on the modelled cluster
//! (`ferrocoll_sim::compressed`), printed next to the uncompressed run.

use ferrocoll_sim::{CompressedResult, SimResult};

/// The table lines: the compressed run, and how it compares with the
/// uncompressed `algo` run `plain`.
pub(crate) fn lines(
    c: &CompressedResult,
    plain: &SimResult,
    algo: &str,
    (bytes, n): (usize, usize),
) -> Vec<String> {
    let mut out = vec![format!(
        "compressed with {} ({}): time {:.2} us = exchanges {:.2} us + codec {:.2} us; wire {} B from the busiest rank, {} B and {} messages in all",
        c.codec,
        c.algorithm,
        c.time_s * 1e6,
        c.exchange_s * 1e6,
        c.codec_s * 1e6,
        c.sent_bytes_max,
        c.sent_bytes_total,
        c.messages
    )];
    for e in &c.exchanges {
        out.push(format!(
            "  {:<24} {:>14.2} us  {:>16} B  {:>10} messages",
            e.name,
            e.time_s * 1e6,
            e.bytes,
            e.messages
        ));
    }
    for class in &c.per_class {
        out.push(format!(
            "  {:<12} {:>16} B  utilization {:.3}",
            class.class, class.bytes, class.utilization
        ));
    }
    let plain_sent: u64 = plain.per_class.first().map_or(0, |class| class.bytes);
    let speedup = plain.time_s / c.time_s.max(f64::MIN_POSITIVE);
    out.push(format!(
        "uncompressed {algo}: time {:.2} us, {} B over the {} links; compressed is {speedup:.2}x its speed ({}; effective busbw {:.2} GB/s on the uncompressed size)",
        plain.time_s * 1e6,
        plain_sent,
        plain.per_class.first().map_or("", |class| class.class.as_str()),
        if speedup > 1.0 { "compression pays" } else { "compression does not pay" },
        if c.time_s > 0.0 {
            bytes as f64 / c.time_s * ferrocoll_sim::busbw_factor(ferrocoll::Collective::AllReduce, n) / 1e9
        } else {
            0.0
        }
    ));
    out
}

/// The `compressed` object of `--json`.
pub(crate) fn json(c: &CompressedResult, plain: &SimResult) -> serde_json::Value {
    serde_json::json!({
        "codec": c.codec, "algo": c.algorithm, "time_us": c.time_s * 1e6,
        "exchange_us": c.exchange_s * 1e6, "codec_us": c.codec_s * 1e6,
        "wire_bytes": c.sent_bytes_max, "sent_bytes_total": c.sent_bytes_total,
        "messages": c.messages, "events": c.events,
        "speedup": plain.time_s / c.time_s.max(f64::MIN_POSITIVE),
        "exchanges": c.exchanges.iter().map(|e| serde_json::json!({
            "name": e.name, "time_us": e.time_s * 1e6, "bytes": e.bytes, "messages": e.messages,
        })).collect::<Vec<_>>(),
        "links": c.per_class.iter().map(|l| serde_json::json!({
            "class": l.class, "bytes": l.bytes, "utilization": l.utilization,
        })).collect::<Vec<_>>(),
    })
}
