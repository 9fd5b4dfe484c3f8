//! The two halves of the two-phase algorithm: [`ChunkReduce`], the
//! compressed reduce-scatter (encode every chunk, all-to-all, decode and
//! add one's own), and [`gather`], the re-encode with the server-side
//! residual, the allgather of the encoded chunks and the decode.

use std::ops::Range;

use super::{divide_for, Meter, Scratch};
use crate::compress::{Codec, ErrorFeedback};
use crate::error::Result;
use crate::{Communicator, ReduceOp};

/// The reduce-scatter half, over chunks each with its own codec (the same
/// codec for the quantizers and Top-k, Random-k with one stream per chunk
/// so that chunks of equal length keep different positions).
pub(super) struct ChunkReduce<'a> {
    pub(super) comm: &'a Communicator,
    /// Chunk `j` of the buffer, reduced by rank `j`.
    pub(super) chunks: &'a [Range<usize>],
    /// The codec of chunk `j` (the same on every rank).
    pub(super) codecs: &'a [&'a dyn Codec],
}

impl ChunkReduce<'_> {
    /// Encodes every chunk of `input` (plus the residual of `ef`, which
    /// keeps what the encodings did not carry), sends encoded chunk `j` to
    /// rank `j`, and leaves in `scratch.acc` the sum of the `n` decoded
    /// versions of this rank's chunk: zero, then each rank's added in rank
    /// order, in `f32`.
    pub(super) fn run(
        &self,
        input: &[f32],
        mut ef: Option<&mut ErrorFeedback>,
        scratch: &mut Scratch,
        meter: &mut Meter,
    ) -> Result<()> {
        let (n, r) = (self.comm.size(), self.comm.rank());
        let lens: Vec<usize> = self
            .chunks
            .iter()
            .zip(self.codecs)
            .map(|(c, codec)| codec.encoded_len(c.len()))
            .collect();
        let total: usize = lens.iter().sum();
        meter.codec(|| {
            scratch.send.resize(total, 0);
            let mut at = 0;
            for ((range, codec), &len) in self.chunks.iter().zip(self.codecs).zip(&lens) {
                let out = &mut scratch.send[at..at + len];
                let chunk = &input[range.clone()];
                match ef.as_deref_mut() {
                    Some(ef) => ef.compress_at(range.start, chunk, *codec, out)?,
                    None => codec.encode(chunk, out)?,
                }
                at += len;
            }
            Ok(())
        })?;
        let mine = lens[r];
        scratch.recv.resize(n * mine, 0);
        // Every rank knows every chunk's length: all skip together.
        if total > 0 {
            let sent = total - mine;
            let (send, recv) = (&scratch.send[..], &mut scratch.recv[..]);
            meter.comm(sent, || {
                if lens.iter().all(|&l| l == mine) {
                    self.comm.all_to_all(send, recv)
                } else {
                    self.comm.all_to_all_v(send, &lens, recv, &vec![mine; n])
                }
            })?;
        }
        meter.codec(|| {
            let acc = &mut scratch.acc;
            acc.clear();
            acc.resize(self.chunks[r].len(), 0.0);
            for p in 0..n {
                let version = &scratch.recv[p * mine..(p + 1) * mine];
                self.codecs[r].decode_add(version, acc)?;
            }
            Ok(())
        })
    }
}

/// The allgather half: this rank's reduced chunk (`scratch.acc`, divided
/// by `n` first for `Avg`) is encoded with the server-side residual
/// `server`, the encoded chunks are allgathered, and every chunk is
/// decoded into its range of `out`.
#[allow(clippy::too_many_arguments)] // the halves share no struct worth making
pub(super) fn gather(
    comm: &Communicator,
    chunks: &[Range<usize>],
    codec: &dyn Codec,
    server: Option<&mut ErrorFeedback>,
    op: ReduceOp,
    scratch: &mut Scratch,
    out: &mut [f32],
    meter: &mut Meter,
) -> Result<()> {
    let (n, r) = (comm.size(), comm.rank());
    let lens: Vec<usize> = chunks.iter().map(|c| codec.encoded_len(c.len())).collect();
    let (mine, total) = (lens[r], lens.iter().sum::<usize>());
    let equal = lens.iter().all(|&l| l == mine);
    meter.codec(|| {
        divide_for(op, n, &mut scratch.acc);
        // What was sent in the first half is no longer needed.
        scratch.send.resize(mine, 0);
        match server {
            Some(ef) => ef.compress(&scratch.acc, codec, &mut scratch.send)?,
            None => codec.encode(&scratch.acc, &mut scratch.send)?,
        }
        if !equal {
            // No allgather of unequal blocks in the library: an
            // all-to-all-v that sends every rank the same block is one.
            scratch.send.resize(n * mine, 0);
            for j in 1..n {
                scratch.send.copy_within(0..mine, j * mine);
            }
        }
        Ok(())
    })?;
    scratch.recv.resize(total, 0);
    if total > 0 {
        let (send, recv) = (&scratch.send[..], &mut scratch.recv[..]);
        meter.comm((n - 1) * mine, || {
            if equal {
                comm.all_gather(send, recv)
            } else {
                comm.all_to_all_v(send, &vec![mine; n], recv, &lens)
            }
        })?;
    }
    meter.codec(|| {
        let mut at = 0;
        for (range, &len) in chunks.iter().zip(&lens) {
            codec.decode(&scratch.recv[at..at + len], &mut out[range.clone()])?;
            at += len;
        }
        Ok(())
    })
}
