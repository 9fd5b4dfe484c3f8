//! What a run is asked for: the [`Mode`] and the [`SimOptions`], checked
//! and applied (per-rank start delays and reduction slowdowns, slowed and
//! failed links).

use std::borrow::Cow;

use crate::network::Network;

/// How the network is modelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// No contention: messages serialize only on the sending and receiving
    /// ranks' ports; agrees with the alpha-beta cost model.
    Ideal,
    /// Every link is a FIFO queue of chunks.
    Contention,
}

/// Knobs of a simulation beyond the topology.
///
/// The default is the plain run: no reduction cost, 64 KiB chunks, no
/// per-message overhead, no scenario (every rank starts at 0 and reduces at gamma, every link at
/// its bandwidth), full runs checked against the memory available.
#[derive(Clone, Debug, PartialEq)]
pub struct SimOptions {
    /// Seconds to reduce one byte (gamma); 0 makes reductions free.
    pub gamma: f64,
    /// Chunk size of the contention mode, in bytes (at least 1).
    pub chunk_bytes: u64,
    /// Stragglers: `(rank, d)` makes physical rank `rank` start its plan (in
    /// every group it belongs to) `d` seconds late (finite, at least 0).
    /// Several entries for one rank add up.
    pub start_delay: Vec<(usize, f64)>,
    /// Slow ranks: `(rank, f)` multiplies physical rank `rank`'s gamma (its
    /// local and received reductions) by `f` (finite, above 0). Several
    /// entries for one rank multiply. Has no effect while gamma is 0.
    pub compute_slowdown: Vec<(usize, f64)>,
    /// Slow or failed links: `(name, f)` divides the bandwidth of every link
    /// whose display name (as in `SimResult::hottest_link`, e.g.
    /// `nic-up[3]`, `leaf-up[0]`) or whose class (`leaf-up`) is `name` by
    /// `f` (above 0). `f64::INFINITY` marks the links failed: a run whose
    /// plans send a message across one is an error naming it. A name that
    /// matches no link is an error. Several entries for one link multiply.
    pub slow_links: Vec<(String, f64)>,
    /// The memory a full run may use, in bytes: a run whose estimate
    /// exceeds it is refused before it starts (see [`crate::estimate`]).
    /// `None`: the environment variable `FERROCOLL_SIM_MEMORY` if set, else
    /// `MemAvailable` of `/proc/meminfo`, else unchecked.
    pub memory_limit: Option<u64>,
    /// Per-message overheads: `(name, o)` makes every message whose
    /// sender's port (its path's first link) is named or of class `name`
    /// (`nic-up`, `nvlink-up[3]`; `*`: every link) hold that port `o`
    /// seconds before its first byte (LogGP's per-message overhead o: the
    /// software cost of posting a message, which a rank pays once per
    /// message, serially, however many it has in flight). A later entry for
    /// the same link replaces an earlier one; a name that matches no link is
    /// an error. Empty (the default): messages are free to post. The plans'
    /// messages only: in-network reduction ([`crate::sharp`]) ignores it.
    pub message_overhead: Vec<(String, f64)>,
}

impl Default for SimOptions {
    /// gamma = 0, 64 KiB chunks, no scenario, no memory limit of its own.
    fn default() -> SimOptions {
        SimOptions {
            gamma: 0.0,
            chunk_bytes: 64 << 10,
            start_delay: Vec::new(),
            compute_slowdown: Vec::new(),
            slow_links: Vec::new(),
            memory_limit: None,
            message_overhead: Vec::new(),
        }
    }
}

/// Checks `opts`, and returns per physical rank of a network of `p` the
/// start delay and the factor on gamma that it asks for.
pub(super) fn per_rank(opts: &SimOptions, p: usize) -> Result<(Vec<f64>, Vec<f64>), String> {
    if opts.chunk_bytes == 0 || opts.chunk_bytes > u64::from(u32::MAX) {
        return Err(format!(
            "chunk size {} is not between 1 byte and 4 GiB",
            opts.chunk_bytes
        ));
    }
    if !(opts.gamma.is_finite() && opts.gamma >= 0.0) {
        return Err(format!("gamma {} is not a time per byte", opts.gamma));
    }
    let mut delay = vec![0.0f64; p];
    for &(r, d) in &opts.start_delay {
        if r >= p || !(d.is_finite() && d >= 0.0) {
            return Err(format!(
                "start delay ({r}, {d}): need a rank below {p} and a finite delay of at least 0 s"
            ));
        }
        delay[r] += d;
    }
    let mut slow = vec![1.0f64; p];
    for &(r, f) in &opts.compute_slowdown {
        if r >= p || !(f.is_finite() && f > 0.0) {
            return Err(format!(
                "compute slowdown ({r}, {f}): need a rank below {p} and a finite factor above 0"
            ));
        }
        slow[r] *= f;
    }
    Ok((delay, slow))
}

/// The per-message overhead of every link of `net` as a sender's port
/// ([`SimOptions::message_overhead`]); empty when there is none.
pub(super) fn overheads(net: &Network, given: &[(String, f64)]) -> Result<Vec<f64>, String> {
    if given.is_empty() {
        return Ok(Vec::new());
    }
    let mut o = vec![0.0f64; net.links.len()];
    for (name, t) in given {
        if !(t.is_finite() && *t >= 0.0) {
            return Err(format!(
                "message overhead {name}: {t} s is not a finite time of at least 0"
            ));
        }
        let mut any = false;
        for (i, link) in net.links.iter().enumerate() {
            if name == "*" || net.classes[link.class] == *name || net.link_name(i) == *name {
                o[i] = *t;
                any = true;
            }
        }
        if !any {
            return Err(format!(
                "message overhead {name}: no link or link class of that name (classes: {}; or * \
                 for every link)",
                net.classes.join(", ")
            ));
        }
    }
    Ok(o)
}

/// `net` with `slow` applied, and which links have failed (empty when
/// none).
pub(crate) fn degrade<'a>(
    net: &'a Network,
    slow: &[(String, f64)],
) -> Result<(Cow<'a, Network>, Vec<bool>), String> {
    if slow.is_empty() {
        return Ok((Cow::Borrowed(net), Vec::new()));
    }
    let mut owned = net.clone();
    let mut failed = vec![false; net.links.len()];
    let names: Vec<String> = (0..net.links.len()).map(|i| net.link_name(i)).collect();
    for (name, f) in slow {
        if f.is_nan() || *f <= 0.0 {
            return Err(format!(
                "slow link {name}: factor {f} must be above 0 (inf for a failed link)"
            ));
        }
        let mut any = false;
        for (i, link) in owned.links.iter_mut().enumerate() {
            if names[i] == *name || net.classes[link.class] == *name {
                any = true;
                if f.is_infinite() {
                    failed[i] = true;
                } else {
                    link.bw /= f;
                }
            }
        }
        if !any {
            return Err(format!(
                "slow link {name}: no link or link class of that name (classes: {}; links are named like {})",
                net.classes.join(", "),
                names.first().map_or("up[0]", String::as_str)
            ));
        }
    }
    Ok((Cow::Owned(owned), failed))
}
