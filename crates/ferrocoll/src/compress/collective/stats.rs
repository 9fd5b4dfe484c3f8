//! What a compressed call reports ([`WireStats`]) and the meter that
//! fills it in as the call goes.

use std::ops::AddAssign;
use std::time::{Duration, Instant};

use crate::error::Result;

/// What one compressed call moved and where its time went, for this rank.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WireStats {
    /// The buffer in `f32` bytes (`4 len`): what an uncompressed call would
    /// reduce, and what effective bandwidths are computed on.
    pub input_bytes: usize,
    /// The bytes this rank's messages carry, from the encoded lengths and
    /// the algorithm's exchanges (see the [module documentation](super)),
    /// each exchange counted as direct messages to the ranks that need
    /// them (an allreduce as a ring's `2 (n-1)/n` of its buffer).
    pub sent_bytes: usize,
    /// The bytes this rank actually handed its transport for other ranks
    /// during the call ([`Communicator::bytes_sent`](crate::Communicator::bytes_sent) before and after): the
    /// algorithms the library chose for the exchanges may forward more
    /// than `sent_bytes` (a tree, a hierarchical allgather). Includes any
    /// other call made on the communicator meanwhile from another thread.
    pub measured_bytes: u64,
    /// The hierarchical form's uncompressed bytes within the node (its
    /// reduce-scatter and allgather, `(L-1)/L` of the padded buffer
    /// each), by the formula; 0 for the flat form.
    pub local_sent_bytes: usize,
    /// What the node's communicator counted for them
    /// ([`Communicator::bytes_sent`](crate::Communicator::bytes_sent)); 0 for the flat form.
    pub local_measured_bytes: u64,
    /// Collective calls made (0 when there was nothing to move).
    pub exchanges: usize,
    /// Time spent encoding, decoding, adding and on error feedback.
    pub codec_time: Duration,
    /// Time spent inside the collectives (waiting for peers included).
    pub comm_time: Duration,
    /// The part of `comm_time` spent in the hierarchical form's
    /// uncompressed steps within the node (0 for the flat form).
    pub local_time: Duration,
}

impl AddAssign for WireStats {
    /// Sums the stats of several calls.
    fn add_assign(&mut self, other: WireStats) {
        self.input_bytes += other.input_bytes;
        self.sent_bytes += other.sent_bytes;
        self.measured_bytes += other.measured_bytes;
        self.local_sent_bytes += other.local_sent_bytes;
        self.local_measured_bytes += other.local_measured_bytes;
        self.exchanges += other.exchanges;
        self.codec_time += other.codec_time;
        self.comm_time += other.comm_time;
        self.local_time += other.local_time;
    }
}

/// Times and bytes of one call, as it goes.
pub(super) struct Meter {
    pub(super) stats: WireStats,
}

impl Meter {
    pub(super) fn new(len: usize) -> Meter {
        Meter {
            stats: WireStats {
                input_bytes: 4 * len,
                ..WireStats::default()
            },
        }
    }

    /// Runs codec work, timed as such.
    pub(super) fn codec<T>(&mut self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let t = Instant::now();
        let out = f();
        self.stats.codec_time += t.elapsed();
        out
    }

    /// Adds what a nested compressor (the hierarchical form's rail)
    /// reported.
    pub(super) fn add_inner(&mut self, inner: &WireStats) {
        let input = self.stats.input_bytes;
        self.stats += *inner;
        self.stats.input_bytes = input;
    }

    /// Runs one collective that sends `sent` bytes by the algorithm's
    /// formula, timed as communication.
    pub(super) fn comm(&mut self, sent: usize, f: impl FnOnce() -> Result<()>) -> Result<()> {
        let t = Instant::now();
        let out = f();
        self.stats.comm_time += t.elapsed();
        self.stats.sent_bytes += sent;
        self.stats.exchanges += 1;
        out
    }
}
