//! The hierarchical form: compress only between nodes.
//!
//! With a topology of `H` nodes of `L` ranks (`L, H >= 2`), the buffer is
//! padded with zeros to `L` pieces of `piece` elements (a multiple of the
//! codec's granule), and:
//!
//! 1. the node's ranks reduce-scatter it, uncompressed ([`Communicator::
//!    reduce_scatter`], `Sum`): local rank `l` holds piece `l` of its
//!    node's sum;
//! 2. local rank `l` of every node (the "rail" of `l`, as the library's
//!    hierarchical algorithms pair them) runs the flat compressed
//!    allreduce of piece `l` among the `H` nodes, with its error feedback
//!    (so the residual is that of the node's sum, as hierarchical 1-bit
//!    Adam keeps it);
//! 3. the node's ranks allgather the pieces, uncompressed.
//!
//! Between nodes this moves `1/L` of what the flat form moves per rank,
//! over `L` rails at once: each node's link carries the encoded buffer
//! about `2 (H-1)/H` times instead of the flat form's `2 (n-1)/n` times
//! `L` (its `L` ranks each sending most of their chunks off the node);
//! and each rank encodes and decodes `1/L` of the buffer. Within a node
//! (shared memory, where bandwidth is plentiful and compression does not
//! pay) the data moves uncompressed.

use std::time::Instant;

use super::{CompressOptions, Compressor, Meter};
use crate::error::Result;
use crate::{Communicator, ReduceOp};

/// The hierarchical form's state: the node's communicator, the rail's
/// compressor, and the padded buffer.
#[derive(Debug)]
pub(super) struct Hier {
    node: Communicator,
    /// Elements of each local rank's piece.
    pub(super) piece: usize,
    /// The flat compressed allreduce of this rank's piece among the nodes.
    pub(super) inner: Box<Compressor>,
    /// `L` pieces: the input, zero-padded, and the allgather's result,
    /// when the buffer is not `L` whole pieces.
    padded: Vec<f32>,
    /// This rank's piece of its node's sum.
    mine: Vec<f32>,
}

impl Hier {
    /// The hierarchical form of `spec` for `len` elements on `comm`, whose
    /// topology has `nodes` nodes of `local` ranks: splits `comm` into the
    /// node's and the rail's communicators (collective: every rank of
    /// `comm` takes part). `granule` is the codec's.
    pub(super) fn new(
        comm: &Communicator,
        len: usize,
        spec: &str,
        options: CompressOptions,
        (nodes, local): (usize, usize),
        granule: usize,
    ) -> Result<Hier> {
        let (node_no, local_rank) = (comm.rank() / local, comm.rank() % local);
        let split = |color: usize, what: &str| {
            comm.split(Some(color as u32), comm.rank() as i64)?
                .ok_or_else(|| crate::Error::Internal(format!("no {what} communicator")))
        };
        let node = split(node_no, "node")?;
        let rail = split(nodes + local_rank, "rail")?;
        let piece = len.div_ceil(local).div_ceil(granule) * granule;
        let inner = Compressor::with_options(
            &rail,
            piece,
            spec,
            CompressOptions {
                hierarchical: Some(false),
                ..options
            },
        )?;
        Ok(Hier {
            node,
            piece,
            inner: Box::new(inner),
            padded: Vec::new(),
            mine: Vec::new(),
        })
    }

    /// Step 1: the node's reduce-scatter of `input`, leaving this rank's
    /// piece of its node's sum in `self.mine` (step 2 runs `self.inner` on
    /// it). The input is copied into a zero-padded buffer only when its
    /// length is not `L` whole pieces.
    pub(super) fn reduce(&mut self, input: &[f32], meter: &mut Meter) -> Result<()> {
        let l = self.node.size();
        let total = self.piece * l;
        self.mine.resize(self.piece, 0.0);
        let t = Instant::now();
        let send = if input.len() == total {
            input
        } else {
            self.padded.clear();
            self.padded.extend_from_slice(input);
            self.padded.resize(total, 0.0);
            &self.padded
        };
        meter.stats.comm_time += t.elapsed();
        let base = self.node.bytes_sent();
        let (node, mine) = (&self.node, &mut self.mine);
        local_step(meter, (l - 1) * 4 * self.piece, || {
            node.reduce_scatter(send, mine, ReduceOp::Sum)
        })?;
        meter.stats.local_measured_bytes += self.node.bytes_sent() - base;
        Ok(())
    }

    /// Step 2 of an allreduce: the rail's compressed allreduce (`Sum`) of
    /// this rank's piece.
    pub(super) fn all_reduce_piece(&mut self, meter: &mut Meter) -> Result<()> {
        let stats = self.inner.all_reduce(&mut self.mine, ReduceOp::Sum)?;
        meter.add_inner(&stats);
        Ok(())
    }

    /// Step 2 of a reduce-scatter: the rail's compressed reduce-scatter
    /// (`Sum`) of this rank's piece; `out` gets the start of this rank's
    /// chunk of it (the padding cut off).
    pub(super) fn reduce_scatter_piece(
        &mut self,
        out: &mut [f32],
        meter: &mut Meter,
    ) -> Result<()> {
        let rail_rank = self.inner.comm.rank();
        let mut part = vec![0f32; self.inner.chunk(rail_rank).len()];
        let stats = self
            .inner
            .reduce_scatter(&self.mine, &mut part, ReduceOp::Sum)?;
        meter.add_inner(&stats);
        out.copy_from_slice(&part[..out.len()]);
        Ok(())
    }

    /// Step 3: the node's ranks allgather their pieces into `out` (through
    /// the padded buffer, whose padding is then cut off, when `out` is not
    /// `L` whole pieces).
    pub(super) fn gather(&mut self, out: &mut [f32], meter: &mut Meter) -> Result<()> {
        let l = self.node.size();
        let total = self.piece * l;
        let base = self.node.bytes_sent();
        let (node, mine) = (&self.node, &self.mine);
        let direct = out.len() == total;
        self.padded.resize(if direct { 0 } else { total }, 0.0);
        let recv = if direct {
            &mut *out
        } else {
            &mut self.padded[..]
        };
        local_step(meter, (l - 1) * 4 * self.piece, || {
            node.all_gather(mine, recv)
        })?;
        meter.stats.local_measured_bytes += self.node.bytes_sent() - base;
        if !direct {
            let t = Instant::now();
            out.copy_from_slice(&self.padded[..out.len()]);
            meter.stats.comm_time += t.elapsed();
        }
        Ok(())
    }
}

/// Runs one uncompressed exchange within the node that sends `sent`
/// bytes by the formula, timed as communication.
fn local_step(meter: &mut Meter, sent: usize, f: impl FnOnce() -> Result<()>) -> Result<()> {
    let t = Instant::now();
    let out = f();
    meter.stats.comm_time += t.elapsed();
    meter.stats.local_time += t.elapsed();
    meter.stats.local_sent_bytes += sent;
    meter.stats.exchanges += 1;
    out
}
