//! PowerSGD as a compressed allreduce: [`PowerSgd`]'s three steps around
//! the allreduces (`Sum`, in `f32`) of P and of Q.

use super::{ring_allreduce_bytes, Meter};
use crate::compress::PowerSgd;
use crate::error::Result;
use crate::{Communicator, ReduceOp};

/// Everything that reads the input: `M = input + residual`, `P = M Q`, the
/// allreduce of P, its orthogonalisation, `Q = M^T P` and the allreduce
/// of Q (the input is copied into M at the first step, so the output may
/// be the input's memory).
pub(super) fn begin(
    comm: &Communicator,
    state: &mut PowerSgd,
    input: &[f32],
    meter: &mut Meter,
) -> Result<()> {
    let n = comm.size();
    let s = &mut *state;
    let p = meter.codec(move || s.compress_p(input))?;
    meter.comm(ring_allreduce_bytes(n, 4 * p.len()), || {
        comm.all_reduce_in_place(p, ReduceOp::Sum)
    })?;
    let s = &mut *state;
    let q = meter.codec(move || s.after_p_allreduce())?;
    meter.comm(ring_allreduce_bytes(n, 4 * q.len()), || {
        comm.all_reduce_in_place(q, ReduceOp::Sum)
    })
}

/// `out = P Q^T`, the approximation of the sum; the residual is kept.
pub(super) fn finish(state: &mut PowerSgd, out: &mut [f32], meter: &mut Meter) -> Result<()> {
    meter.codec(|| state.decompress(out))
}
