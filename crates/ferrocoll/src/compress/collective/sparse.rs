//! Top-k and Random-k: the whole buffer encoded once, then an allgather of
//! the payloads and a local sum (Top-k, [`gather_sum`]) or an allreduce of
//! the value sections (Random-k with its shared positions,
//! [`reduce_values`]).

use super::{divide_for, ring_allreduce_bytes, Meter, Scratch};
use crate::compress::{Codec, ErrorFeedback, RandK};
use crate::error::Result;
use crate::{Communicator, ReduceOp};

/// Encodes the whole of `input` (plus the residual of `ef`) into
/// `scratch.send`.
pub(super) fn encode_whole(
    codec: &dyn Codec,
    input: &[f32],
    ef: Option<&mut ErrorFeedback>,
    scratch: &mut Scratch,
    meter: &mut Meter,
) -> Result<()> {
    meter.codec(|| {
        scratch.send.resize(codec.encoded_len(input.len()), 0);
        match ef {
            Some(ef) => ef.compress(input, codec, &mut scratch.send),
            None => codec.encode(input, &mut scratch.send),
        }
    })
}

/// Allgathers every rank's encoding (`scratch.send`, of one length on
/// every rank: it depends only on the buffer's length) and writes into
/// `out` zero plus each rank's decoded payload, in rank order.
pub(super) fn gather_sum(
    comm: &Communicator,
    codec: &dyn Codec,
    scratch: &mut Scratch,
    out: &mut [f32],
    meter: &mut Meter,
) -> Result<()> {
    let (n, e) = (comm.size(), scratch.send.len());
    scratch.recv.resize(n * e, 0);
    if e > 0 {
        let (send, recv) = (&scratch.send[..], &mut scratch.recv[..]);
        meter.comm((n - 1) * e, || comm.all_gather(send, recv))?;
    }
    meter.codec(|| {
        out.fill(0.0);
        for p in 0..n {
            codec.decode_add(&scratch.recv[p * e..(p + 1) * e], out)?;
        }
        Ok(())
    })
}

/// Sums the ranks' value sections (`scratch.send`: `K` little-endian
/// `f32`s at positions every rank shares) with one allreduce, divides them
/// by `n` for `Avg`, and decodes the sum into `out`.
pub(super) fn reduce_values(
    comm: &Communicator,
    codec: &RandK,
    op: ReduceOp,
    scratch: &mut Scratch,
    out: &mut [f32],
    meter: &mut Meter,
) -> Result<()> {
    let n = comm.size();
    meter.codec(|| {
        let values = &mut scratch.acc;
        values.clear();
        values.extend(
            scratch
                .send
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        );
        Ok(())
    })?;
    let k = scratch.acc.len();
    if k > 0 {
        let values = &mut scratch.acc[..];
        meter.comm(ring_allreduce_bytes(n, 4 * k), || {
            comm.all_reduce_in_place(values, ReduceOp::Sum)
        })?;
    }
    meter.codec(|| {
        divide_for(op, n, &mut scratch.acc);
        for (bytes, v) in scratch.send.chunks_exact_mut(4).zip(&scratch.acc) {
            bytes.copy_from_slice(&v.to_le_bytes());
        }
        codec.decode(&scratch.send, out)
    })
}
