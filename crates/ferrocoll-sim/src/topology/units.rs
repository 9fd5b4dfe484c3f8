//! Bandwidths (`50GB/s`, `400Gb/s`) and latencies (`2us`) as the topology
//! strings write them.

/// Splits `50GB/s` into (50.0, "GB/s").
fn number_and_unit(s: &str) -> Option<(f64, &str)> {
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == 'e' || c == '-' || c == '+'))
        .unwrap_or(s.len());
    // `e` may begin a unit only in theory; none of ours does.
    let x = s[..end].parse::<f64>().ok()?;
    Some((x, s[end..].trim()))
}

/// Parses a bandwidth into bytes per second: a number, a decimal prefix
/// (none, K, M, G, T) and `B/s` (bytes) or `b/s` (bits).
pub fn parse_bandwidth(s: &str) -> Result<f64, String> {
    let bad = || {
        format!("`{s}` is not a bandwidth; write a positive number and a unit such as GB/s (bytes) or Gb/s (bits)")
    };
    let (x, unit) = number_and_unit(s).ok_or_else(bad)?;
    let (prefix, per_unit) = if let Some(p) = unit.strip_suffix("B/s") {
        (p, 1.0)
    } else if let Some(p) = unit.strip_suffix("b/s") {
        (p, 0.125)
    } else {
        return Err(bad());
    };
    let scale = match prefix {
        "" => 1.0,
        "K" | "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        _ => return Err(bad()),
    };
    let bw = x * scale * per_unit;
    if bw.is_finite() && bw > 0.0 {
        Ok(bw)
    } else {
        Err(bad())
    }
}

/// Parses a latency into seconds: a number and `s`, `ms`, `us` or `ns`.
pub fn parse_latency(s: &str) -> Result<f64, String> {
    let bad = || format!("`{s}` is not a latency; write a number and s, ms, us or ns (e.g. 2us)");
    let (x, unit) = number_and_unit(s).ok_or_else(bad)?;
    let scale = match unit {
        "s" => 1.0,
        "ms" => 1e-3,
        "us" => 1e-6,
        "ns" => 1e-9,
        _ => return Err(bad()),
    };
    let lat = x * scale;
    if lat.is_finite() && lat >= 0.0 {
        Ok(lat)
    } else {
        Err(bad())
    }
}
