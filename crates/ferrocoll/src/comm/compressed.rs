//! The transparent compressed allreduce of `FERROCOLL_COMPRESS` (or
//! [`super::CallOptions::compress`]): which calls are eligible, the
//! decision ([`crate::compress::auto`]) and running the call on
//! [`crate::compress::Compressor`].
//!
//! A compressed call is several collectives (an all-to-all and an
//! allgather for the quantizers, ...). It takes one sequence number of
//! this communicator, as any call does, and runs its collectives on a
//! communicator of its own: the same ranks under an identifier made from
//! this one's and that number. Every rank derives the same one, and calls
//! in flight on several threads (a blocking call and the progress worker's
//! non-blocking ones) never share a sequence of numbers they could take in
//! different orders on different ranks. That communicator's calls run
//! with compression off, so the Random-k values' allreduce inside does not
//! ask again.

use super::{mix, CallOptions, Communicator};
use crate::compress::auto::Comparison;
use crate::compress::{CompressOptions, CompressSetting, Compressor};
use crate::error::Result;
use crate::plan::Collective;
use crate::types::{DType, ReduceOp};

impl Communicator {
    /// The codec an allreduce of `len` elements of `dtype` with `op`
    /// through this handle runs compressed with, if any: the handle's
    /// [`CallOptions::compress`], else `FERROCOLL_COMPRESS`, for an
    /// eligible call (f32, sum or avg, 2+ ranks, a non-empty buffer, no
    /// algorithm forced), and under `auto:` only where the cost model
    /// predicts a gain ([`crate::compress::auto`]). Every rank gets the
    /// same answer.
    ///
    /// ```
    /// use ferrocoll::{compress::CompressSetting, local, CallOptions, DType, ReduceOp};
    ///
    /// local::run(2, |comm| {
    ///     let int8 = CompressSetting::parse("auto:int8").unwrap();
    ///     let c = comm.with_options(CallOptions::default().compress(int8));
    ///     // Threads share memory: bandwidth is plentiful, compression never pays.
    ///     assert_eq!(c.compresses(DType::F32, 1 << 20, ReduceOp::Sum).unwrap(), None);
    ///     // Other types and operators are never compressed.
    ///     let always = CompressSetting::parse("int8").unwrap();
    ///     let c = comm.with_options(CallOptions::default().compress(always));
    ///     assert_eq!(c.compresses(DType::F32, 16, ReduceOp::Max).unwrap(), None);
    ///     assert_eq!(c.compresses(DType::F32, 16, ReduceOp::Sum).unwrap().as_deref(), Some("int8:128"));
    /// })
    /// .unwrap();
    /// ```
    pub fn compresses(&self, dtype: DType, len: usize, op: ReduceOp) -> Result<Option<String>> {
        let setting = self
            .options
            .compress
            .as_ref()
            .unwrap_or(&self.shared.config.compress);
        let Some(codec) = setting.codec() else {
            return Ok(None);
        };
        let eligible = dtype == DType::F32
            && matches!(op, ReduceOp::Sum | ReduceOp::Avg)
            && len > 0
            && self.size() >= 2
            && self.options.algorithm.is_none()
            && self
                .shared
                .config
                .algorithms
                .get(Collective::AllReduce)
                .is_none();
        if !eligible {
            return Ok(None);
        }
        let memo = &self.shared.choice.compress;
        let compare = || Comparison::new(codec, len, self.topology(), &self.profile());
        let forced = matches!(setting, CompressSetting::Always(_));
        let config = &self.shared.config;
        if config.debug_tune && self.rank() == 0 && memo.first_sight(codec, len) {
            eprintln!(
                "{}",
                compare()?.explain(self.size(), &setting.to_string(), forced)
            );
        }
        let compress = forced || memo.pays(codec, len, compare)?;
        Ok(compress.then(|| codec.to_string()))
    }

    /// Runs an allreduce compressed with `codec` ([`Compressor`], without
    /// error feedback: see [`crate::compress::auto`]): out of place from
    /// `send` into `buf`, or in place on `buf` when `send` is `None`.
    pub(super) fn all_reduce_compressed(
        &self,
        codec: &str,
        send: Option<&[f32]>,
        buf: &mut [f32],
        op: ReduceOp,
    ) -> Result<()> {
        let seq = self.next_seq();
        let n = self.size();
        let all: Vec<usize> = (0..n).collect();
        let id = mix(mix(self.shared.id ^ 0x2545_f491_4f6c_dd1d) ^ seq);
        let mut inner = self.child(&all, self.rank(), id);
        inner.options = CallOptions {
            algorithm: None,
            timeout: self.options.timeout,
            compress: Some(CompressSetting::Off),
        };
        let options = CompressOptions {
            error_feedback: Some(false),
            hierarchical: None,
        };
        let mut compressor = Compressor::with_options(&inner, buf.len(), codec, options)?;
        // Random-k's positions move with the step: the call's number, the
        // same on every rank and new at every call.
        compressor.set_step(seq);
        if self.shared.config.debug && self.rank() == 0 {
            eprintln!(
                "ferrocoll: allreduce #{seq} {} B on {n} ranks -> compressed with {} ({}), {}",
                4 * buf.len(),
                compressor.name(),
                compressor.algorithm(),
                match self.options.compress {
                    Some(_) => "call options",
                    None => "FERROCOLL_COMPRESS",
                }
            );
        }
        let stats = match send {
            Some(send) => compressor.all_reduce_into(send, buf, op)?,
            None => compressor.all_reduce(buf, op)?,
        };
        // What this call's communicators (its own, and the node's and the
        // rail's of the hierarchical form) handed the transport.
        let sent = stats.measured_bytes + stats.local_measured_bytes;
        self.shared
            .sent
            .fetch_add(sent, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}
