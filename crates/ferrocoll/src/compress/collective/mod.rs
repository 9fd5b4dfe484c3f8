//! Compressed collectives: an allreduce and a reduce-scatter of `f32`
//! buffers whose messages are encoded by a codec, with the error-feedback
//! state of each buffer kept across steps ([`Compressor`]).
//!
//! # Algorithms
//!
//! With `n` ranks, a buffer of `len` elements (`M = 4 len` bytes), and
//! `E(m)` the codec's [`Codec::encoded_len`] of `m` elements:
//!
//! | codec | algorithm | collectives | bytes each rank sends |
//! |---|---|---|---|
//! | `fp16`, `bf16`, `int8:B`, `onebit:B` | two-phase ("compressed reduce-scatter + allgather", 1-bit Adam's) | all-to-all, allgather | `sum_{j != r} E(c_j) + (n-1) E(c_r)`, about `2 (n-1)/n M / ratio` |
//! | `topk:F` | allgather of (index, value) payloads, local sum | allgather | `(n-1) E(len)`, about `(n-1) M / ratio` |
//! | `randk:F:SEED` | allreduce of the `K` values (the positions are shared) | allreduce | `2 (n-1)/n 4K` (a ring's share) |
//! | `powersgd:R` | allreduce of P, orthogonalisation, allreduce of Q | allreduce x 2 | `2 (n-1)/n 4 (rows + cols) R` |
//!
//! `c_j` is chunk `j` of the buffer ([`Compressor::chunk`]): the buffer cut
//! into `n` pieces at multiples of the codec's [`Codec::granule`] (its
//! block), as even as whole blocks allow, the buffer's last, short block
//! in the last non-empty chunk.
//!
//! **Two-phase** (quantizers). Every rank adds its residual to its buffer
//! and encodes it chunk by chunk ([`ErrorFeedback::compress_at`]), sends
//! encoded chunk `j` to rank `j` (an all-to-all of bytes: [`Communicator::
//! all_to_all`] when every chunk encodes to the same length, else
//! [`Communicator::all_to_all_v`]), and decodes and adds (in `f32`, in rank
//! order, starting from zero) the `n` versions of its own chunk it
//! receives: the reduce-scatter half ([`Compressor::reduce_scatter`] ends
//! here). It then encodes its reduced chunk again, with a second,
//! "server-side", [`ErrorFeedback`] for that chunk, and the encoded chunks
//! are allgathered ([`Communicator::all_gather`] of equal lengths, else an
//! all-to-all-v that sends every rank the same block); every rank decodes
//! every chunk, so every rank ends with bitwise the same buffer. With
//! [`ReduceOp::Avg`] the reduced chunk is divided by `n` before it is
//! encoded again.
//!
//! **Top-k** chooses its `K` elements from the whole buffer, so its chunks
//! cannot be reduced without decoding: each rank encodes its compensated
//! buffer once, the payloads (whose length depends only on `len`, so one
//! allgather of equal blocks carries them) are allgathered, and each rank
//! decodes and adds all `n` into a zeroed buffer in rank order. Its
//! reduce-scatter is the two-phase algorithm's first half with `K` taken
//! per chunk (a sparse reduce-scatter: `(n-1)/n` of the allgather's bytes).
//!
//! **Random-k** with a seed shared by the ranks keeps the same positions on
//! every rank ([`RandK::indices`]), so the value sections of the ranks'
//! encodings add up elementwise without decoding: one allreduce (`Sum`) of
//! `K` values, then one decode. The step advances with every call, so each
//! step keeps other positions. The rescaled form gets no error feedback (it
//! is unbiased, and its residual grows without bound); the unscaled form
//! (`randk:F:SEED:unscaled`) does, by default.
//!
//! **PowerSGD** runs [`PowerSgd`](crate::compress::PowerSgd)'s three steps around two allreduces of
//! `f32` (P, then Q, both `Sum`); its error feedback lives in the
//! [`PowerSgd`](crate::compress::PowerSgd) state.
//!
//! **Hierarchical form** (quantizers and Top-k, wherever the
//! communicator's topology has at least 2 nodes of at least 2 ranks;
//! [`CompressOptions::hierarchical`] turns it off): the node's ranks
//! reduce-scatter the buffer uncompressed, local rank `l` of every node
//! runs the flat algorithm above on piece `l` of its node's sum among the
//! nodes, and the node's ranks allgather the pieces uncompressed. Only the
//! slow links between nodes carry encoded bytes (`1/L` of the flat form's
//! per rank, `L` ranks per node), and each rank encodes `1/L` of the
//! buffer; the residuals are those of the node's sum. Random-k and
//! PowerSGD always run flat: their allreduces are the library's own, which
//! are topology-aware already. [`Compressor::new`] splits the communicator
//! for it (so there it is a collective call).
//!
//! [`model`] has the closed forms of all of these for the cost model, and
//! [`exchanges`] lists their collectives with their sizes for the simulator.
//!
//! # Why compositions of collectives, not plans
//!
//! These algorithms are built from the library's own collectives over
//! byte (and `f32`) buffers, so they run over every transport and take
//! the algorithms, slicing and topology-awareness of those collectives as
//! they are. Running a codec inside the executor's plans instead would
//! need codec-aware plan ops (send encoded, receive-decode-add), staging
//! addressed in bytes rather than elements (an encoded chunk is not a
//! whole number of `f32`s), decoding after a message has completed (a
//! block's scale arrives before its values, but a chunk's bytes arrive in
//! pieces cut at 8-byte multiples), error-feedback state reachable from
//! the call, and chunk boundaries at multiples of the granule in every
//! plan. What that form would add is the ring reduce-scatter whose every
//! hop decodes, adds and re-encodes (with error feedback at each
//! re-encode), which sends `(n-1)/n` of the encoded buffer in `n-1`
//! neighbour steps instead of the all-to-all's `n-1` simultaneous
//! messages (the same bytes, but only neighbour links, and pipelined), and
//! codec work overlapped with the wire inside a round. The all-to-all form
//! here moves the same bytes and re-encodes each chunk once instead of at
//! every hop, which also keeps the arithmetic a short, exact reference can
//! reproduce.
//!
//! # Reproducibility
//!
//! The quantizers and Top-k are exact functions of the ranks' inputs (and
//! residuals): a local simulation that encodes, decodes and adds in the
//! same order gets bitwise the same result (the tests hold them to that).
//! Random-k and PowerSGD sum in whatever order the library's allreduce
//! does, which depends on the algorithm chosen; every rank still gets
//! bitwise the same result.

mod dense;
pub mod exchanges;
mod hier;
mod lowrank;
pub mod model;
mod sparse;
mod spec;
mod stats;

use std::ops::Range;

use super::{Codec, ErrorFeedback, RandK};
use crate::error::{Error, Result};
use crate::{Communicator, ReduceOp};
pub use spec::validate_spec;
use spec::Scheme;
use stats::Meter;
pub use stats::WireStats;

/// Options of a [`Compressor`] beyond its codec.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompressOptions {
    /// Whether residuals are kept across steps: `None` for the codec's
    /// default (on for every biased codec, off for Random-k's rescaled,
    /// unbiased form, which must not have it), `Some(false)` to send each
    /// step's compressed gradient alone (to measure what error feedback is
    /// worth). `Some(true)` for the rescaled Random-k is refused.
    pub error_feedback: Option<bool>,
    /// Whether the quantizers and Top-k run the hierarchical form
    /// (uncompressed within a node, compressed between nodes; see
    /// [`Compressor`]): `None` for wherever the communicator's topology
    /// has at least 2 nodes of at least 2 ranks, `Some(false)` for the flat
    /// form everywhere. `Some(true)` on a topology without such nodes, or
    /// for Random-k and PowerSGD (which always run flat), is refused.
    pub hierarchical: Option<bool>,
}

/// The compressed allreduce and reduce-scatter of one buffer on one
/// communicator, with the state it keeps across steps: the error-feedback
/// residuals (the rank's own and, for the two-phase quantizers, the
/// server-side one of its chunk), Random-k's step, PowerSGD's warm start,
/// and scratch buffers reused from call to call.
///
/// Every rank makes one with the same length and codec and calls it in
/// the same order, as with any collective; one per gradient bucket.
///
/// ```
/// use ferrocoll::{compress::Compressor, local, ReduceOp};
///
/// let results = local::run(3, |comm| {
///     let mut c = Compressor::new(&comm, 1000, "int8:128")?;
///     let mut grad = vec![comm.rank() as f32 + 1.0; 1000];
///     let stats = c.all_reduce(&mut grad, ReduceOp::Sum)?;
///     // 1 + 2 + 3, up to int8's rounding of each rank's chunk.
///     assert!((grad[0] - 6.0).abs() < 0.1);
///     assert!(stats.sent_bytes < stats.input_bytes);
///     Ok::<_, ferrocoll::Error>(grad)
/// })
/// .unwrap();
/// // Every rank decoded the same bytes.
/// let first = results[0].as_ref().unwrap();
/// assert!(results.iter().all(|r| r.as_ref().unwrap() == first));
/// ```
#[derive(Debug)]
pub struct Compressor {
    comm: Communicator,
    len: usize,
    scheme: Scheme,
    /// Chunk `j` of the buffer, reduced by rank `j`.
    chunks: Vec<Range<usize>>,
    /// This rank's residual of the whole buffer (not for PowerSGD, which
    /// keeps its own, nor without error feedback).
    worker: Option<ErrorFeedback>,
    /// The two-phase algorithm's residual of this rank's reduced chunk.
    server: Option<ErrorFeedback>,
    step: u64,
    scratch: Scratch,
    /// The hierarchical form, where it runs (then `worker` and `server`
    /// are unused: the rail's compressor keeps the residuals).
    hier: Option<hier::Hier>,
}

/// Buffers reused from call to call (a 64 MiB gradient would otherwise
/// allocate and fault in tens of MiB per step).
#[derive(Debug, Default)]
struct Scratch {
    send: Vec<u8>,
    recv: Vec<u8>,
    acc: Vec<f32>,
}

impl Compressor {
    /// A compressor for buffers of `len` elements on `comm`, with the codec
    /// `spec`: any [`super::parse`] takes (`fp16`, `bf16`, `int8:128`,
    /// `onebit:128`, `topk:0.01`, `randk:0.01:SEED[:unscaled]`) or
    /// `powersgd[:RANK[:ROWSxCOLS[:SEED]]]` (rank 1, the squarest shape and
    /// seed 0 by default; `auto` for the shape). Error feedback is on for
    /// every codec but the rescaled Random-k. Where the hierarchical form
    /// runs (see the [module documentation](self)), every rank of `comm`
    /// must call it together: it splits `comm` into the node's and the
    /// rail's communicators.
    pub fn new(comm: &Communicator, len: usize, spec: &str) -> Result<Compressor> {
        Compressor::with_options(comm, len, spec, CompressOptions::default())
    }

    /// [`Compressor::new`] with `options`.
    pub fn with_options(
        comm: &Communicator,
        len: usize,
        spec: &str,
        options: CompressOptions,
    ) -> Result<Compressor> {
        let (scheme, feedback) = Scheme::parse(spec, len, options)?;
        let granule = match &scheme {
            Scheme::Dense(codec) => codec.granule().unwrap_or(1),
            _ => 1,
        };
        let n = comm.size();
        let topo = comm.topology();
        let grouped = topo.levels().len() > 1 && topo.local_size() >= 2 && topo.nodes() >= 2;
        let hierarchical = match (&scheme, options.hierarchical) {
            (_, Some(false)) => false,
            (Scheme::Dense(_) | Scheme::TopK(_), None) => grouped,
            (_, None) => false,
            (Scheme::Dense(_) | Scheme::TopK(_), Some(true)) if grouped => true,
            (_, _) => {
                return Err(Error::invalid(format!(
                    "codec `{spec}`: the hierarchical form needs the quantizers or Top-k and a \
                     topology of at least 2 nodes of at least 2 ranks (this group's is {topo})"
                )))
            }
        };
        if hierarchical {
            let granule = granule.max(1);
            let (nodes, local) = (topo.nodes(), topo.local_size());
            let h = hier::Hier::new(comm, len, spec, options, (nodes, local), granule)?;
            // Rank h L + l reduces chunk h of piece l.
            let chunks = (0..n)
                .map(|r| {
                    let inner = h.inner.chunk(r / local);
                    let at = (r % local) * h.piece;
                    (at + inner.start).min(len)..(at + inner.end).min(len)
                })
                .collect();
            return Ok(Compressor {
                comm: comm.clone(),
                len,
                scheme,
                chunks,
                worker: None,
                server: None,
                step: 0,
                scratch: Scratch::default(),
                hier: Some(h),
            });
        }
        let chunks = chunk_ranges(len, n, granule);
        let mine = chunks[comm.rank()].len();
        let (worker, server) = match (&scheme, feedback) {
            (_, false) | (Scheme::PowerSgd(_), _) => (None, None),
            (Scheme::Dense(_), true) => (
                Some(ErrorFeedback::new(len)),
                Some(ErrorFeedback::new(mine)),
            ),
            (_, true) => (Some(ErrorFeedback::new(len)), None),
        };
        Ok(Compressor {
            comm: comm.clone(),
            len,
            scheme,
            chunks,
            worker,
            server,
            step: 0,
            scratch: Scratch::default(),
            hier: None,
        })
    }

    /// Elements of the buffer.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The codec and its parameters, as [`Compressor::new`] reads them
    /// (PowerSGD with its shape resolved: `powersgd:4:4096x4096`).
    pub fn name(&self) -> String {
        match &self.scheme {
            Scheme::Dense(codec) | Scheme::TopK(codec) => codec.name(),
            Scheme::RandK(codec) => codec.name(),
            Scheme::PowerSgd(state) => {
                let (rows, cols) = state.shape();
                let seed = match state.config().seed {
                    0 => String::new(),
                    s => format!(":{s}"),
                };
                format!("powersgd:{}:{rows}x{cols}{seed}", state.config().rank)
            }
        }
    }

    /// The algorithm [`Compressor::all_reduce`] runs: `two-phase`,
    /// `allgather`, `allreduce-values` or `powersgd`.
    pub fn algorithm(&self) -> &'static str {
        match (&self.scheme, self.hier.is_some()) {
            (Scheme::Dense(_), true) => "hier-two-phase",
            (Scheme::TopK(_), true) => "hier-allgather",
            (scheme, _) => scheme.algorithm(),
        }
    }

    /// Whether it runs the hierarchical form.
    pub fn hierarchical(&self) -> bool {
        self.hier.is_some()
    }
}

impl Compressor {
    /// The range of the buffer rank `rank` reduces, and that
    /// [`Compressor::reduce_scatter`] returns on it (empty for a rank past
    /// the group).
    pub fn chunk(&self, rank: usize) -> Range<usize> {
        self.chunks.get(rank).cloned().unwrap_or(0..0)
    }

    /// Calls completed (Random-k draws new positions at each).
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Sets the step the next call runs as (Random-k's positions): the
    /// transparent path of `FERROCOLL_COMPRESS` makes a compressor per call
    /// and gives it the call's sequence number, which every rank shares.
    pub(crate) fn set_step(&mut self, step: u64) {
        self.step = step;
    }

    /// Whether residuals are kept across steps.
    pub fn error_feedback(&self) -> bool {
        if let Some(h) = &self.hier {
            return h.inner.error_feedback();
        }
        match &self.scheme {
            Scheme::PowerSgd(state) => state.config().error_feedback,
            _ => self.worker.is_some(),
        }
    }

    /// This rank's residual: what it was given and has not sent yet
    /// (`None` without error feedback), for the elements
    /// [`Compressor::residual_range`] says: the whole buffer in the flat
    /// form; in the hierarchical form, this rank's piece of its node's sum
    /// (the residual is the node's, kept by the rank that compresses it).
    pub fn residual(&self) -> Option<&[f32]> {
        if let Some(h) = &self.hier {
            let range = self.residual_range();
            return h.inner.residual().map(|r| &r[..range.len()]);
        }
        match &self.scheme {
            Scheme::PowerSgd(state) if state.config().error_feedback => Some(state.residual()),
            _ => self.worker.as_ref().map(ErrorFeedback::residual),
        }
    }

    /// The elements of the buffer [`Compressor::residual`] covers.
    pub fn residual_range(&self) -> Range<usize> {
        match &self.hier {
            Some(h) => {
                let local = self.comm.topology().local_size();
                let at = (self.comm.rank() % local) * h.piece;
                at.min(self.len)..(at + h.piece).min(self.len)
            }
            None => 0..self.len,
        }
    }

    /// The two-phase algorithm's server-side residual of this rank's chunk
    /// ([`Compressor::chunk`]); `None` for the other algorithms and without
    /// error feedback.
    pub fn server_residual(&self) -> Option<&[f32]> {
        if let Some(h) = &self.hier {
            let mine = self.chunk(self.comm.rank()).len();
            return h.inner.server_residual().map(|r| &r[..mine]);
        }
        self.server.as_ref().map(ErrorFeedback::residual)
    }

    /// Forgets every residual, the step and PowerSGD's warm start (a
    /// skipped step, a new model).
    pub fn reset(&mut self) {
        for ef in [&mut self.worker, &mut self.server].into_iter().flatten() {
            ef.reset();
        }
        if let Scheme::PowerSgd(state) = &mut self.scheme {
            state.reset();
        }
        if let Some(h) = &mut self.hier {
            h.inner.reset();
        }
        self.step = 0;
    }

    /// Compressed allreduce of `buf` in place: on return every rank holds
    /// bitwise the same approximation of the sum (or, with
    /// [`ReduceOp::Avg`], the mean) of the ranks' buffers plus their
    /// residuals. `op` is `Sum` or `Avg`.
    pub fn all_reduce(&mut self, buf: &mut [f32], op: ReduceOp) -> Result<WireStats> {
        self.check(buf.len(), "all_reduce", op)?;
        let base = self.comm.bytes_sent();
        let mut meter = Meter::new(self.len);
        if let (Some(h), true) = (&mut self.hier, self.len > 0) {
            h.reduce(buf, &mut meter)?;
            self.hier_all_reduce(buf, op, &mut meter)?;
        } else if self.len > 0 {
            self.begin(&*buf, &mut meter)?;
            self.finish(buf, op, &mut meter)?;
        }
        Ok(self.done(meter, base))
    }

    /// [`Compressor::all_reduce`] out of place: `send` is this rank's
    /// buffer, `recv` (the same length) gets the result.
    pub fn all_reduce_into(
        &mut self,
        send: &[f32],
        recv: &mut [f32],
        op: ReduceOp,
    ) -> Result<WireStats> {
        self.check(send.len(), "all_reduce_into", op)?;
        if recv.len() != send.len() {
            return Err(Error::invalid(format!(
                "compressed all_reduce_into: recv has {} elements, send {}",
                recv.len(),
                send.len()
            )));
        }
        let base = self.comm.bytes_sent();
        let mut meter = Meter::new(self.len);
        if let (Some(h), true) = (&mut self.hier, self.len > 0) {
            h.reduce(send, &mut meter)?;
            self.hier_all_reduce(recv, op, &mut meter)?;
        } else if self.len > 0 {
            self.begin(send, &mut meter)?;
            self.finish(recv, op, &mut meter)?;
        }
        Ok(self.done(meter, base))
    }

    /// Compressed reduce-scatter: `out` (the length of
    /// [`Compressor::chunk`]`(rank)`) gets this rank's chunk of the sum (or
    /// mean) of the ranks' `buf`s plus their residuals. The quantizers,
    /// Top-k and Random-k run the two-phase algorithm's first half (Top-k
    /// and Random-k keep `K` per chunk, Random-k with each chunk's own
    /// stream); PowerSGD, whose approximation is of the whole matrix, runs
    /// its allreduce and keeps the chunk.
    pub fn reduce_scatter(
        &mut self,
        buf: &[f32],
        out: &mut [f32],
        op: ReduceOp,
    ) -> Result<WireStats> {
        self.check(buf.len(), "reduce_scatter", op)?;
        let mine = self.chunk(self.comm.rank());
        if out.len() != mine.len() {
            return Err(Error::invalid(format!(
                "compressed reduce_scatter: out has {} elements; rank {}'s chunk is {mine:?}, \
                 {} elements (Compressor::chunk)",
                out.len(),
                self.comm.rank(),
                mine.len()
            )));
        }
        let base = self.comm.bytes_sent();
        let mut meter = Meter::new(self.len);
        let n = self.comm.size();
        if let (Some(h), true) = (&mut self.hier, self.len > 0) {
            h.reduce(buf, &mut meter)?;
            h.reduce_scatter_piece(out, &mut meter)?;
            meter.codec(|| {
                divide_for(op, n, out);
                Ok(())
            })?;
        } else if self.len > 0 {
            self.reduce_scatter_inner(buf, out, op, &mut meter)?;
        }
        Ok(self.done(meter, base))
    }

    fn check(&self, len: usize, call: &str, op: ReduceOp) -> Result<()> {
        if len != self.len {
            return Err(Error::invalid(format!(
                "compressed {call}: the compressor was made for {} elements and was given {len}; \
                 make one per buffer",
                self.len
            )));
        }
        match op {
            ReduceOp::Sum | ReduceOp::Avg => Ok(()),
            other => Err(Error::invalid(format!(
                "compressed {call}: {other} is not supported; compressed collectives sum \
                 (sum or avg)"
            ))),
        }
    }

    fn done(&mut self, mut meter: Meter, base: u64) -> WireStats {
        self.step += 1;
        meter.stats.measured_bytes += self.comm.bytes_sent().saturating_sub(base);
        meter.stats
    }

    /// The rest of the hierarchical allreduce once the node's
    /// reduce-scatter is done: the rail's compressed allreduce and the
    /// node's allgather into `out` (see `hier.rs`).
    fn hier_all_reduce(&mut self, out: &mut [f32], op: ReduceOp, meter: &mut Meter) -> Result<()> {
        let n = self.comm.size();
        let h = self.hier.as_mut().expect("the hierarchical form");
        h.all_reduce_piece(meter)?;
        h.gather(out, meter)?;
        meter.codec(|| {
            divide_for(op, n, out);
            Ok(())
        })
    }

    /// The first part of an allreduce, which reads the input: encoding,
    /// and for the two-phase algorithm its all-to-all and reduction too.
    fn begin(&mut self, input: &[f32], meter: &mut Meter) -> Result<()> {
        match &mut self.scheme {
            Scheme::Dense(codec) => {
                let codecs = vec![&**codec; self.chunks.len()];
                let reduce = dense::ChunkReduce {
                    comm: &self.comm,
                    chunks: &self.chunks,
                    codecs: &codecs,
                };
                reduce.run(input, self.worker.as_mut(), &mut self.scratch, meter)
            }
            Scheme::TopK(codec) => sparse::encode_whole(
                &**codec,
                input,
                self.worker.as_mut(),
                &mut self.scratch,
                meter,
            ),
            Scheme::RandK(codec) => {
                let codec = codec.at_step(self.step);
                sparse::encode_whole(
                    &codec,
                    input,
                    self.worker.as_mut(),
                    &mut self.scratch,
                    meter,
                )
            }
            Scheme::PowerSgd(state) => lowrank::begin(&self.comm, state, input, meter),
        }
    }

    /// The rest of an allreduce, which writes the output.
    fn finish(&mut self, out: &mut [f32], op: ReduceOp, meter: &mut Meter) -> Result<()> {
        let n = self.comm.size();
        match &mut self.scheme {
            Scheme::Dense(codec) => dense::gather(
                &self.comm,
                &self.chunks,
                &**codec,
                self.server.as_mut(),
                op,
                &mut self.scratch,
                out,
                meter,
            ),
            Scheme::TopK(codec) => {
                sparse::gather_sum(&self.comm, &**codec, &mut self.scratch, out, meter)?;
                meter.codec(|| {
                    divide_for(op, n, out);
                    Ok(())
                })
            }
            Scheme::RandK(codec) => {
                let codec = codec.at_step(self.step);
                sparse::reduce_values(&self.comm, &codec, op, &mut self.scratch, out, meter)
            }
            Scheme::PowerSgd(state) => {
                lowrank::finish(state, out, meter)?;
                meter.codec(|| {
                    divide_for(op, n, out);
                    Ok(())
                })
            }
        }
    }

    fn reduce_scatter_inner(
        &mut self,
        buf: &[f32],
        out: &mut [f32],
        op: ReduceOp,
        meter: &mut Meter,
    ) -> Result<()> {
        let n = self.comm.size();
        let chunked: Vec<RandK>;
        let codecs: Vec<&dyn Codec> = match &self.scheme {
            Scheme::Dense(codec) | Scheme::TopK(codec) => vec![&**codec; n],
            Scheme::RandK(codec) => {
                let at = codec.at_step(self.step);
                chunked = (0..n).map(|j| at.with_stream(j as u64)).collect();
                chunked.iter().map(|c| c as &dyn Codec).collect()
            }
            Scheme::PowerSgd(_) => {
                let mut whole = vec![0f32; self.len];
                self.begin(buf, meter)?;
                self.finish(&mut whole, op, meter)?;
                out.copy_from_slice(&whole[self.chunk(self.comm.rank())]);
                return Ok(());
            }
        };
        let reduce = dense::ChunkReduce {
            comm: &self.comm,
            chunks: &self.chunks,
            codecs: &codecs,
        };
        reduce.run(buf, self.worker.as_mut(), &mut self.scratch, meter)?;
        meter.codec(|| {
            out.copy_from_slice(&self.scratch.acc);
            divide_for(op, n, out);
            Ok(())
        })
    }
}

/// Chunk `j` of `len` elements among `n` ranks, cut at multiples of
/// `granule`: `units = ceil(len / granule)` blocks are dealt as evenly as
/// possible (the first `units mod n` chunks get one more), and the last
/// block, which may be short, ends the last non-empty chunk.
pub fn chunk_ranges(len: usize, n: usize, granule: usize) -> Vec<Range<usize>> {
    let (n, granule) = (n.max(1), granule.max(1));
    let units = len.div_ceil(granule);
    let (base, extra) = (units / n, units % n);
    (0..n)
        .map(|j| {
            let first = j * base + j.min(extra);
            let count = base + usize::from(j < extra);
            let start = (first * granule).min(len);
            let end = ((first + count) * granule).min(len);
            start..end
        })
        .collect()
}

/// Bytes each rank sends in a ring allreduce of `bytes`: `2 (n-1)/n` of
/// them (the bandwidth-optimal share; what [`WireStats::sent_bytes`]
/// counts an allreduce as).
fn ring_allreduce_bytes(n: usize, bytes: usize) -> usize {
    2 * (n - 1) * bytes / n.max(1)
}

/// Divides by `n` for [`ReduceOp::Avg`] (as the library's own `Avg` does:
/// a sum, then one division per element).
fn divide_for(op: ReduceOp, n: usize, out: &mut [f32]) {
    if op == ReduceOp::Avg && n > 1 {
        let n = n as f32;
        out.iter_mut().for_each(|x| *x /= n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_buffer_at_block_multiples_as_evenly_as_blocks_allow() {
        for len in [0usize, 1, 7, 127, 128, 129, 1000, 4099] {
            for n in 1..=9 {
                for g in [1usize, 64, 128] {
                    let c = chunk_ranges(len, n, g);
                    assert_eq!(c.len(), n);
                    assert_eq!(c[0].start, 0);
                    assert_eq!(c[n - 1].end, len);
                    for w in c.windows(2) {
                        assert_eq!(w[0].end, w[1].start, "len {len} n {n} g {g}");
                    }
                    for r in &c {
                        // Every boundary but the buffer's end is a block edge.
                        assert!(r.start % g == 0 || r.start == len, "{c:?}");
                    }
                    let blocks: Vec<usize> = c.iter().map(|r| r.len().div_ceil(g)).collect();
                    let (lo, hi) = (blocks.iter().min(), blocks.iter().max());
                    assert!(hi.unwrap() - lo.unwrap() <= 1, "{blocks:?}");
                }
            }
        }
        assert_eq!(
            chunk_ranges(1000, 3, 128),
            vec![0..384, 384..768, 768..1000]
        );
        assert_eq!(chunk_ranges(10, 4, 1), vec![0..3, 3..6, 6..8, 8..10]);
    }
}
