//! Closed forms of the compressed allreduce for the cost model
//! ([`predict_all_reduce`]): the exchanges' latency, bandwidth and
//! reduction terms from the encoded lengths (the same bytes
//! [`super::WireStats::sent_bytes`] reports), and the codec's compute as a
//! term of its own.
//!
//! With `n` ranks, `M = 4 len` bytes, `E_j` the encoded length of chunk
//! `j`, and the link's `alpha`, `beta` and per-message overhead `o`:
//!
//! * two-phase: an all-to-all (`alpha + (n-2) o + max_r sum_{j != r} E_j /
//!   beta`), then a ring allgather (`(n-1) (alpha + max_j E_j / beta)`);
//!   codec `(2.25 + 1.25/n) M c` (error feedback around the encoding of
//!   the whole buffer, a decode-add of `n` chunks, the server-side error
//!   feedback of one chunk, a decode of the whole);
//! * Top-k: a ring allgather of `E = E(len)`: `(n-1) (alpha + E / beta)`;
//!   codec `1.25 M c`;
//! * Random-k: an allreduce of `4K` bytes (the closed form of the
//!   library's cheapest allreduce algorithm on the group's topology, which
//!   its `all_reduce` call chooses; the wire bytes counted as a ring's
//!   `2 (n-1)/n 4K`); codec `M c`;
//! * PowerSGD: two such allreduces, of `4 rows r` and `4 cols r` bytes;
//!   codec `M c` (its three local steps);
//! * hierarchical (`H` nodes of `L` ranks, the quantizers and Top-k): a
//!   ring reduce-scatter and allgather within the node of `L` pieces of
//!   `piece` elements (`2 (L-1) (alpha + 4 piece / beta)` on the intra-node
//!   link, reduction `(L-1) 4 piece gamma`), plus the flat form among `H`
//!   ranks for `piece` elements on the inter-node link as each of the `L`
//!   rails sees it ([`Profile::inter_share`]).
//!
//! `c` is the codec's time per input byte of one encode plus one decode;
//! the 1.25 is error feedback's compensation and residual passes (around
//! int8, the round trip measured 4.1 GiB/s and with error feedback 3.3
//! GiB/s: bench/RESULTS.md, "Issue 17: codec throughput").
//! [`codec_seconds_per_byte`] gives the built-in `c` of each codec, from
//! that table (one thread per rank, baseline x86-64): a machine whose
//! ranks share cores runs them slower (the cluster measurements of
//! "Issue 17: compressed allreduce" spent about 3x these), which is what a
//! calibrated value (the caller's `codec` argument) is for.

use super::{chunk_ranges, ring_allreduce_bytes, CompressOptions, Scheme};
use crate::compress::{Codec, PowerSgd};
use crate::cost::{self, Cost, LinkParams, Profile, Shape};
use crate::error::{Error, Result};
use crate::plan::Collective;
use crate::Topology;

/// The predicted time of one compressed allreduce.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CompressedCost {
    /// What [`super::Compressor::algorithm`] would run.
    pub algorithm: &'static str,
    /// The exchanges: latency, bandwidth, and reduction (`gamma`) terms on
    /// the critical path.
    pub comm: Cost,
    /// Encoding, decoding and error feedback on the busiest rank, in
    /// seconds.
    pub codec: f64,
    /// Compressed bytes the busiest rank sends
    /// ([`super::WireStats::sent_bytes`]).
    pub wire_bytes: usize,
    /// Uncompressed bytes it sends within its node (the hierarchical
    /// form's; [`super::WireStats::local_sent_bytes`]).
    pub local_bytes: usize,
}

impl CompressedCost {
    /// The predicted time: the exchanges plus the codec work (in series:
    /// the collectives built of whole calls do not overlap them).
    pub fn total(&self) -> f64 {
        self.comm.total() + self.codec
    }
}

/// The built-in codec time per input byte of one encode and one decode
/// (`c` of the module documentation), from the single-threaded codec
/// throughput in bench/RESULTS.md ("Issue 17: codec throughput", 4 MiB
/// chunks): fp16 9.6, bf16 6.4, int8 4.1, onebit 4.7, Top-k 2.2 (before
/// its histogram threshold; about 1.6x that since), Random-k 23.1 GiB/s;
/// PowerSGD's local steps 5.4 GiB/s at rank 1 and 2.3 at rank 4 (linear in
/// the rank between and beyond).
pub fn codec_seconds_per_byte(spec: &str) -> Result<f64> {
    const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
    let kind = spec.trim().split(':').next().unwrap_or_default();
    let gib_per_s = match kind.to_ascii_lowercase().as_str() {
        "fp16" => 9.605,
        "bf16" => 6.379,
        "int8" => 4.1205,
        "onebit" => 4.7004,
        "topk" => 2.1958 * 1.6,
        "randk" => 23.117,
        "powersgd" => {
            let rank: f64 = spec
                .split(':')
                .nth(1)
                .and_then(|r| r.parse().ok())
                .unwrap_or(1.0);
            let (t1, t4) = (1.0 / 5.4135, 1.0 / 2.2851);
            return Ok((t1 + (t4 - t1) * (rank - 1.0) / 3.0) / GIB);
        }
        _ => {
            return Err(Error::invalid(format!(
                "no codec rate known for `{spec}`; give the codec's time per byte"
            )))
        }
    };
    Ok(1.0 / (gib_per_s * GIB))
}

/// The compressed allreduce of `len` `f32`s with codec `spec` over a group
/// of `topology` (the form [`super::Compressor::new`] would choose there:
/// hierarchical for the quantizers and Top-k on 2+ nodes of 2+ ranks) on
/// `profile`, with the codec at `codec` seconds per input byte
/// ([`codec_seconds_per_byte`] when `None`).
pub fn predict_all_reduce(
    spec: &str,
    len: usize,
    topology: &Topology,
    profile: &Profile,
    codec: Option<f64>,
) -> Result<CompressedCost> {
    let (scheme, _) = Scheme::parse(spec, len, CompressOptions::default())?;
    let c = match codec {
        Some(c) => c,
        None => codec_seconds_per_byte(spec)?,
    };
    let n = topology.size();
    let (nodes, local) = (topology.nodes(), topology.local_size());
    let grouped = topology.levels().len() > 1 && local >= 2 && nodes >= 2;
    let link = if topology.levels().len() > 1 && nodes >= 2 {
        profile.inter
    } else {
        profile.intra
    };
    match &scheme {
        Scheme::Dense(codec) | Scheme::TopK(codec) if grouped && len > 0 => {
            let granule = codec.granule().unwrap_or(1);
            let piece = len.div_ceil(local).div_ceil(granule) * granule;
            let bytes = (4 * piece) as f64;
            let steps = 2.0 * (local - 1) as f64;
            let within = Cost::rounds(
                steps,
                bytes,
                &profile.intra,
                (local - 1) as f64 * bytes,
                profile.gamma,
            );
            let inner = flat(
                &scheme,
                nodes,
                piece,
                &profile.inter_share(local),
                profile,
                c,
                None,
            )?;
            Ok(CompressedCost {
                algorithm: match scheme {
                    Scheme::Dense(_) => "hier-two-phase",
                    _ => "hier-allgather",
                },
                comm: within + inner.comm,
                local_bytes: 2 * (local - 1) * 4 * piece,
                ..inner
            })
        }
        _ => flat(&scheme, n, len, &link, profile, c, Some(topology)),
    }
}

/// The flat form of `scheme` among `n` ranks for `len` elements on `link`;
/// with the group's `topology`, the allreduces of Random-k and PowerSGD
/// cost what the library's cheapest allreduce algorithm does there (the
/// one their `all_reduce` calls choose), else a ring's.
fn flat(
    scheme: &Scheme,
    n: usize,
    len: usize,
    link: &LinkParams,
    profile: &Profile,
    c: f64,
    topology: Option<&Topology>,
) -> Result<CompressedCost> {
    let m = 4.0 * len as f64;
    let nf = n as f64;
    let none = CompressedCost {
        algorithm: scheme.algorithm(),
        comm: Cost::ZERO,
        codec: 0.0,
        wire_bytes: 0,
        local_bytes: 0,
    };
    if len == 0 {
        return Ok(none);
    }
    let ring_allreduce = |bytes: usize| -> (Cost, usize) {
        if n < 2 || bytes == 0 {
            return (Cost::ZERO, 0);
        }
        let wire = ring_allreduce_bytes(n, bytes);
        if let Some(topology) = topology {
            let mut shape = Shape::new(Collective::AllReduce, n, bytes / 4, 4);
            shape.topology = topology.clone();
            if let Some((_, best)) = cost::candidates(&shape, profile).first() {
                return (*best, wire);
            }
        }
        let b = bytes as f64;
        let cost = Cost {
            latency: 2.0 * (nf - 1.0) * link.alpha,
            bandwidth: 2.0 * (nf - 1.0) / nf * b / link.beta,
            compute: (nf - 1.0) / nf * b * profile.gamma,
        };
        (cost, wire)
    };
    let (comm, wire, codec) = match scheme {
        Scheme::Dense(codec) => {
            let lens: Vec<usize> = chunk_ranges(len, n, codec.granule().unwrap_or(1))
                .iter()
                .map(|r| codec.encoded_len(r.len()))
                .collect();
            let total: usize = lens.iter().sum();
            let (biggest, smallest) = (
                lens.iter().copied().max().unwrap_or(0),
                lens.iter().copied().min().unwrap_or(0),
            );
            let wire = (0..n)
                .map(|r| total - lens[r] + (n - 1) * lens[r])
                .max()
                .unwrap_or(0);
            let comm = if n < 2 {
                Cost::ZERO
            } else {
                Cost {
                    latency: link.alpha + (nf - 2.0) * link.overhead + (nf - 1.0) * link.alpha,
                    bandwidth: ((total - smallest) as f64 + (nf - 1.0) * biggest as f64)
                        / link.beta,
                    compute: 0.0,
                }
            };
            (comm, wire, (2.25 + 1.25 / nf) * m * c)
        }
        Scheme::TopK(codec) => {
            let e = codec.encoded_len(len);
            let comm = Cost::rounds(nf - 1.0, e as f64, link, 0.0, 0.0);
            (comm, (n - 1) * e, 1.25 * m * c)
        }
        Scheme::RandK(codec) => {
            let (comm, wire) = ring_allreduce(codec.encoded_len(len));
            (comm, wire, m * c)
        }
        Scheme::PowerSgd(state) => {
            let state: &PowerSgd = state;
            let (p, p_wire) = ring_allreduce(4 * state.p_len());
            let (q, q_wire) = ring_allreduce(4 * state.q_len());
            (p + q, p_wire + q_wire, m * c)
        }
    };
    Ok(CompressedCost {
        comm,
        codec,
        wire_bytes: wire,
        ..none
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(beta: f64) -> Profile {
        Profile::uniform(10e-6, beta, 0.05e-9)
    }

    #[test]
    fn compression_pays_on_a_slow_link_and_not_on_a_fast_one() {
        let len = 16 << 20; // 64 MiB of f32
        let topo = Topology::new(vec![2, 2]).unwrap();
        // Two-phase int8 between 2 hosts: each rank's half, 2 (H-1)/H of
        // its encoding.
        // Shared memory within a host, 1 Gbit/s between them.
        let hosts = Profile {
            inter: profile(125e6).inter,
            ..profile(10e9)
        };
        let slow = predict_all_reduce("int8", len, &topo, &hosts, None).unwrap();
        assert_eq!(slow.algorithm, "hier-two-phase");
        let piece = len / 2;
        assert_eq!(slow.wire_bytes, piece + 4 * (piece / 128));
        assert_eq!(slow.local_bytes, 2 * 4 * piece);
        // The codec term: (2.25 + 1.25/2) passes of the piece at 4.1 GiB/s.
        let c = codec_seconds_per_byte("int8").unwrap();
        assert!((slow.codec - 2.875 * 4.0 * piece as f64 * c).abs() < 1e-12);
        // Faster than the uncompressed ring over the same slow link.
        let ring = 2.0 * 3.0 / 4.0 * 4.0 * len as f64 / 125e6;
        assert!(slow.total() < ring / 2.0, "{slow:?} against {ring}");
        // At memory speed the codec costs more than it saves.
        let fast =
            predict_all_reduce("int8", len, &Topology::flat(4), &profile(10e9), None).unwrap();
        let ring = 2.0 * 3.0 / 4.0 * 4.0 * len as f64 / 10e9;
        assert!(fast.total() > ring, "{fast:?} against {ring}");
    }

    #[test]
    fn every_codec_has_a_closed_form() {
        for spec in [
            "fp16",
            "bf16",
            "int8:64",
            "onebit",
            "topk:0.01",
            "randk:0.01",
            "powersgd:4",
        ] {
            for topo in [
                Topology::flat(1),
                Topology::flat(5),
                Topology::new(vec![3, 2]).unwrap(),
            ] {
                let cost = predict_all_reduce(spec, 100_000, &topo, &profile(1e9), None).unwrap();
                assert!(
                    cost.total() > 0.0 && cost.codec > 0.0,
                    "{spec} {topo}: {cost:?}"
                );
                assert_eq!(cost.wire_bytes == 0, topo.size() == 1, "{spec} {topo}");
            }
        }
        assert!(codec_seconds_per_byte("zip").is_err());
        let r1 = codec_seconds_per_byte("powersgd:1").unwrap();
        assert!(codec_seconds_per_byte("powersgd:4").unwrap() > 2.0 * r1);
    }
}
