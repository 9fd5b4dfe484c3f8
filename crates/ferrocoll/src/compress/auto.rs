//! `FERROCOLL_COMPRESS=auto:CODEC`: whether an eligible allreduce (see
//! `super::setting`) runs compressed, decided by the cost model.
//!
//! The comparison ([`Comparison`]) is between the cheapest uncompressed
//! allreduce algorithm ([`crate::cost::candidates`]) and the compressed
//! allreduce's closed form ([`super::collective::model::predict_all_reduce`],
//! whose codec compute per byte is its own term:
//! [`super::collective::model::codec_seconds_per_byte`], the figure
//! `ferrocoll model allreduce --compress` uses), both on the communicator's
//! profile and topology for the call's element count. Those are the same
//! on every rank (the profile is rank 0's, shared at start-up), so every
//! rank decides alike, and the answer is remembered per (codec, count).
//!
//! Compression cuts the bandwidth term (bytes over beta), not alpha: its
//! exchanges take as many rounds or more (the two-phase quantizers an
//! all-to-all and an allgather, `n` latencies), and it adds the codec's
//! passes over the buffer. It pays where the bandwidth it saves exceeds
//! both: large messages on slow links. On shared memory or threads, where
//! beta is memory bandwidth, the codec's passes cost about what they save
//! and `auto` keeps compression off.
//!
//! No error feedback on this path: a residual must belong to one gradient
//! buffer across steps, and a plain allreduce does not say which buffer it
//! is given (keying residuals by length would add one layer's residual to
//! another layer's gradient of the same size). Each call sends its own
//! compressed values, as torch's `fp16_compress_hook` does; with codecs
//! that drop much (Top-k, onebit) use [`super::Compressor`] or the DDP
//! hooks, which keep residuals per bucket.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use super::collective::model::{predict_all_reduce, CompressedCost};
use crate::cost::{self, Cost, Profile, Shape};
use crate::error::Result;
use crate::plan::{Algorithm, Collective};
use crate::topo::Topology;

/// Most shapes remembered (a program with ever-new sizes must not grow the
/// cache forever).
const LIMIT: usize = 4096;

/// The predictions `auto` compares for one allreduce of `len` `f32`s.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    /// The codec, as [`super::Codec::name`] writes it.
    pub codec: String,
    /// Elements of the buffer.
    pub len: usize,
    /// The cheapest uncompressed algorithm and its predicted cost (`None`
    /// when the model has none, which never happens for an allreduce).
    pub uncompressed: Option<(Algorithm, Cost)>,
    /// The compressed allreduce's predicted cost.
    pub compressed: CompressedCost,
}

impl Comparison {
    /// Predicts both ways for `len` elements among `topology`'s ranks on
    /// `profile`.
    pub fn new(codec: &str, len: usize, topology: &Topology, profile: &Profile) -> Result<Self> {
        let compressed = predict_all_reduce(codec, len, topology, profile, None)?;
        let mut shape = Shape::new(Collective::AllReduce, topology.size(), len, 4);
        shape.topology = topology.clone();
        let uncompressed = cost::candidates(&shape, profile).first().copied();
        Ok(Comparison {
            codec: codec.to_string(),
            len,
            uncompressed,
            compressed,
        })
    }

    /// Whether the compressed allreduce is predicted strictly faster.
    pub fn pays(&self) -> bool {
        self.uncompressed
            .is_some_and(|(_, c)| self.compressed.total() < c.total())
    }

    /// Why compression pays or not, in words, with the terms that decide.
    pub fn reason(&self) -> String {
        let c = &self.compressed;
        let Some((algo, u)) = self.uncompressed else {
            return "compressed: the model has no uncompressed allreduce to compare".into();
        };
        let us = |s: f64| s * 1e6;
        if self.pays() {
            format!(
                "compressed: {:.2}x faster; the bandwidth term falls from {:.2} us ({algo}) to \
                 {:.2} us, more than the codec's {:.2} us and the latency's change from {:.2} to \
                 {:.2} us",
                u.total() / c.total().max(f64::MIN_POSITIVE),
                us(u.bandwidth),
                us(c.comm.bandwidth),
                us(c.codec),
                us(u.latency),
                us(c.comm.latency)
            )
        } else if u.latency >= u.bandwidth {
            format!(
                "uncompressed: latency-bound ({algo}'s latency {:.2} us against its bandwidth \
                 {:.2} us); compression cuts the bandwidth term, not alpha: its exchanges take \
                 {:.2} us of latency and the codec {:.2} us",
                us(u.latency),
                us(u.bandwidth),
                us(c.comm.latency),
                us(c.codec)
            )
        } else {
            format!(
                "uncompressed: bandwidth is plentiful here; compression would cut the bandwidth \
                 term from {:.2} to {:.2} us but costs {:.2} us of codec work and {:.2} us more \
                 latency",
                us(u.bandwidth),
                us(c.comm.bandwidth),
                us(c.codec),
                us(c.comm.latency - u.latency)
            )
        }
    }

    /// The `FERROCOLL_DEBUG=tune` explanation: both predictions, split into
    /// their terms, the wire bytes, and the reason. `forced` says the
    /// setting compresses whatever the model predicts.
    pub fn explain(&self, n: usize, setting: &str, forced: bool) -> String {
        let us = |s: f64| s * 1e6;
        let bytes = 4 * self.len;
        let mut text = format!(
            "ferrocoll tune: allreduce {bytes} B (f32) on {n} ranks, FERROCOLL_COMPRESS={setting}; \
             times (us):\n  {:<26} {:>10} = latency + bandwidth + compute + codec",
            "algorithm", "predicted"
        );
        if let Some((algo, u)) = self.uncompressed {
            text.push_str(&format!(
                "\n  {:<26} {:>10.2} = {:.2} + {:.2} + {:.2} + 0   wire {} B per rank",
                format!("{algo} (uncompressed)"),
                us(u.total()),
                us(u.latency),
                us(u.bandwidth),
                us(u.compute),
                // What a bandwidth-optimal allreduce sends per rank.
                2 * (n - 1) * bytes / n.max(1)
            ));
        }
        let c = &self.compressed;
        text.push_str(&format!(
            "\n  {:<26} {:>10.2} = {:.2} + {:.2} + {:.2} + {:.2}   wire {} B per rank",
            format!("{} {}", self.codec, c.algorithm),
            us(c.total()),
            us(c.comm.latency),
            us(c.comm.bandwidth),
            us(c.comm.compute),
            us(c.codec),
            c.wire_bytes
        ));
        let verdict = if forced {
            format!(
                "compressed: forced by the setting (the model says: {})",
                self.reason()
            )
        } else {
            self.reason()
        };
        text.push_str(&format!("\n  -> {verdict}"));
        text
    }
}

/// What one communicator remembers about compression choices: the answer
/// per (codec, count) and the shapes already explained.
#[derive(Debug, Default)]
pub(crate) struct Memo {
    chosen: Mutex<HashMap<(String, usize), bool>>,
    explained: Mutex<HashSet<(String, usize)>>,
}

impl Memo {
    /// Whether `codec` pays for `len` elements (remembered; computed by
    /// `compare` the first time).
    pub(crate) fn pays(
        &self,
        codec: &str,
        len: usize,
        compare: impl FnOnce() -> Result<Comparison>,
    ) -> Result<bool> {
        let key = (codec.to_string(), len);
        if let Some(&p) = self.chosen.lock().ok().as_ref().and_then(|m| m.get(&key)) {
            return Ok(p);
        }
        let pays = compare()?.pays();
        if let Ok(mut m) = self.chosen.lock() {
            if m.len() >= LIMIT {
                m.clear();
            }
            m.insert(key, pays);
        }
        Ok(pays)
    }

    /// True the first time (codec, len) is asked (for explaining once).
    pub(crate) fn first_sight(&self, codec: &str, len: usize) -> bool {
        self.explained
            .lock()
            .map(|mut seen| seen.len() < LIMIT && seen.insert((codec.to_string(), len)))
            .unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_speed_keeps_it_off_and_a_slow_link_turns_it_on_for_large_calls() {
        let flat = Topology::flat(2);
        let fast = Profile::thread_default();
        for shift in [4usize, 10, 16, 20, 24, 26] {
            let c = Comparison::new("int8:128", 1 << shift, &flat, &fast).unwrap();
            assert!(!c.pays(), "{}", c.explain(2, "auto:int8:128", false));
        }
        let mut slow = Profile::thread_default();
        slow.intra.beta = 125e6; // 1 Gbit/s
        slow.inter.beta = 125e6;
        slow.beta_mem = 0.0;
        let small = Comparison::new("int8:128", 16, &flat, &slow).unwrap();
        assert!(!small.pays());
        assert!(
            small.reason().contains("latency-bound"),
            "{}",
            small.reason()
        );
        let large = Comparison::new("int8:128", 4 << 20, &flat, &slow).unwrap();
        assert!(large.pays(), "{}", large.explain(2, "auto:int8:128", false));
        assert!(
            large.reason().starts_with("compressed"),
            "{}",
            large.reason()
        );
        let text = large.explain(2, "auto:int8:128", false);
        eprintln!("{text}\n{}", small.explain(2, "auto:int8:128", false));
        assert!(
            text.contains("two-phase") && text.contains("(uncompressed)"),
            "{text}"
        );
    }

    #[test]
    fn the_memo_remembers_and_explains_once() {
        let memo = Memo::default();
        let topo = Topology::flat(4);
        let p = Profile::thread_default();
        let mut asked = 0;
        for _ in 0..3 {
            memo.pays("fp16", 1000, || {
                asked += 1;
                Comparison::new("fp16", 1000, &topo, &p)
            })
            .unwrap();
        }
        assert_eq!(asked, 1);
        assert!(memo.first_sight("fp16", 1000));
        assert!(!memo.first_sight("fp16", 1000));
        assert!(memo.first_sight("fp16", 1001));
    }
}
