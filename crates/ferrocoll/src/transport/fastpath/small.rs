//! Small collectives on the shared-memory fast path.
//!
//! When every rank of a communicator is on this host and a call moves at
//! most one mailbox slot per rank ([`SLOT_PAYLOAD`] bytes), it skips plans,
//! the executor and the progress engine: each rank writes its contribution
//! straight into the mailboxes of the ranks that need it and reads the ones
//! it needs ([`super`], which describes the protocol
//! and how it keeps the engine's guarantees).
//!
//! One step, whatever the group size (at most
//! [`FAST_MAX_RANKS`]): allreduce, allgather and
//! barrier exchange all to all, broadcast goes from the root to all, reduce
//! from all to the root. Reductions run in rank order on every rank, so all
//! ranks get bit-identical results, equal to a sequential reduction.

use super::{FastPath, Payload, FAST_MAX_RANKS};
use crate::error::{Error, Result};
use crate::exec::Memory;
use crate::kernels;
use crate::plan::Collective;
use crate::transport::engine::Link;
use crate::transport::shm::SLOT_PAYLOAD;
use crate::transport::SmallCall;
use crate::types::DType;

/// Whether the fast path implements `coll` at all.
pub(crate) fn handles(coll: Collective) -> bool {
    matches!(
        coll,
        Collective::AllReduce
            | Collective::Broadcast
            | Collective::Reduce
            | Collective::AllGather
            | Collective::Barrier
    )
}

/// Whether a call of `count` elements of `dtype` (allgather: per rank)
/// among `n` ranks fits the fast path. It depends only on what every rank
/// of the call agrees on, so all ranks decide alike.
pub(crate) fn eligible(coll: Collective, count: usize, dtype: DType, n: usize) -> bool {
    handles(coll)
        && (2..=FAST_MAX_RANKS).contains(&n)
        && count
            .checked_mul(dtype.size())
            .is_some_and(|bytes| bytes <= SLOT_PAYLOAD)
}

/// Runs `call` on `mem` over `fast`, whose lengths must be those the
/// collective implies for this rank (checked).
pub(crate) fn run(
    fast: &FastPath,
    link: &Link<'_>,
    call: &SmallCall<'_>,
    mem: &mut Memory<'_>,
) -> Result<()> {
    // Room for the peers' messages on the stack, sized for small groups
    // when the group is small (it is cleared on every call).
    if call.group.len() <= 4 {
        run_with::<3>(fast, link, call, mem)
    } else {
        run_with::<{ FAST_MAX_RANKS - 1 }>(fast, link, call, mem)
    }
}

/// [`run`] for groups of at most `PEERS + 1` ranks.
fn run_with<const PEERS: usize>(
    fast: &FastPath,
    link: &Link<'_>,
    call: &SmallCall<'_>,
    mem: &mut Memory<'_>,
) -> Result<()> {
    let (n, me, root) = (call.group.len(), call.rank, call.root);
    let len = call.count * call.dtype.size();
    debug_assert!(len <= SLOT_PAYLOAD && (2..=PEERS + 1).contains(&n));

    // What this rank contributes, copied out first: in place, the output
    // overlaps it.
    let sends = match call.coll {
        Collective::Barrier => false,
        Collective::Broadcast => me == root,
        _ => true,
    };
    let mut mine: Payload = [0; SLOT_PAYLOAD / 8];
    let mine_len = if sends { len } else { 0 };
    let input = mem.input();
    if input.len() < mine_len {
        return Err(Error::Internal(format!(
            "fast {}: input of {} bytes, {mine_len} needed",
            call.coll,
            input.len()
        )));
    }
    bytemuck::cast_slice_mut::<u64, u8>(&mut mine)[..mine_len].copy_from_slice(&input[..mine_len]);

    let mut others = [0usize; PEERS];
    for (slot, &w) in others.iter_mut().zip(
        call.group
            .iter()
            .enumerate()
            .filter(|&(r, _)| r != me)
            .map(|(_, w)| w),
    ) {
        *slot = w;
    }
    let others = &others[..n - 1];
    let root_rank = [call.group[root]];
    let none: &[usize] = &[];
    let (to, from): (&[usize], &[usize]) = match call.coll {
        Collective::Broadcast if me == root => (others, none),
        Collective::Broadcast => (none, &root_rank),
        Collective::Reduce if me == root => (none, others),
        Collective::Reduce => (&root_rank, none),
        _ => (others, others),
    };
    let mut got: [Payload; PEERS] = [[0u64; SLOT_PAYLOAD / 8]; PEERS];
    let mine_bytes: &[u8] = &bytemuck::cast_slice::<u64, u8>(&mine)[..mine_len];
    fast.exchange(
        link,
        &call.header,
        mine_bytes,
        to,
        from,
        &mut got,
        call.timeout,
    )?;

    // Group rank r's contribution (when received from all).
    let part = |r: usize| -> &[u8] {
        let words = if r == me {
            &mine
        } else {
            &got[if r < me { r } else { r - 1 }]
        };
        &bytemuck::cast_slice::<u64, u8>(words)[..len]
    };
    let out_len = match call.coll {
        Collective::AllReduce => len,
        Collective::Reduce if me == root => len,
        Collective::Broadcast => len,
        Collective::AllGather => n * len,
        _ => 0,
    };
    if out_len == 0 {
        return Ok(());
    }
    // The input is no longer read (copied into `mine`), so the output view
    // may overlap it (in place); `Memory` lets it exist only now.
    let output = mem.output();
    if output.len() < out_len {
        return Err(Error::Internal(format!(
            "fast {}: output of {} bytes, {out_len} needed",
            call.coll,
            output.len()
        )));
    }
    let out = &mut output[..out_len];
    match call.coll {
        Collective::AllReduce | Collective::Reduce => {
            out.copy_from_slice(part(0));
            for r in 1..n {
                kernels::accumulate(call.dtype, call.op, out, part(r));
            }
        }
        Collective::Broadcast if me == root => out.copy_from_slice(part(me)),
        Collective::Broadcast => out.copy_from_slice(&bytemuck::cast_slice(&got[0])[..len]),
        Collective::AllGather => {
            for (r, block) in out.chunks_exact_mut(len).enumerate() {
                block.copy_from_slice(part(r));
            }
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eligibility_depends_on_shape_only() {
        assert!(eligible(Collective::AllReduce, 2, DType::F32, 2));
        assert!(eligible(Collective::Barrier, 0, DType::U8, 16));
        assert!(eligible(Collective::AllGather, 12, DType::F64, 4));
        assert!(!eligible(Collective::AllGather, 13, DType::F64, 4));
        assert!(!eligible(Collective::AllReduce, 2, DType::F32, 1));
        assert!(!eligible(Collective::AllReduce, 2, DType::F32, 17));
        assert!(!eligible(Collective::AllToAll, 1, DType::U8, 2));
        assert!(!eligible(Collective::AllReduce, usize::MAX, DType::F64, 2));
    }
}
