//! Small collectives on the shared-memory fast path.
//!
//! When every rank of a communicator is on this host and a call moves at
//! most [`max_message`] bytes per rank (a mailbox slot's payload, or an
//! eager buffer's beside it), it skips plans,
//! the executor and the progress engine: each rank writes its contribution
//! straight into the mailboxes of the ranks that need it and reads the ones
//! it needs ([`super`], which describes the protocol
//! and how it keeps the engine's guarantees).
//!
//! One step, whatever the group size (at most
//! [`FAST_MAX_RANKS`]): allreduce, allgather and
//! barrier exchange all to all, broadcast goes from the root to all, reduce
//! from all to the root; all-to-all and reduce-scatter send every peer its
//! own block (the first one message per pair in place of a plan's `n - 1`
//! rounds of `direct`, the second one step where the plans take `n - 1`).
//! Reductions run in rank order on every rank, so all ranks get
//! bit-identical results, equal to a sequential reduction.
//!
//! Beyond one step: calls streamed in parts ([`streams`]), remote reads
//! ([`reads_remote`]), and allreduces on 3-16 ranks in two steps, a
//! reduce-scatter then an allgather ([`two_step`]).

use std::cell::Cell;
use std::time::{Duration, Instant};

use super::one_pass::{ONE_PASS_MAX_BYTES, ONE_PASS_MAX_PEERS};
use super::{
    Carries, FastPath, Got, Parts, Piece, ADDRESS_PAYLOAD, FAST_MAX_RANKS, REMOTE_PAYLOAD,
};
use crate::error::{Error, Result};
use crate::exec::Memory;
use crate::kernels;
use crate::plan::Collective;
use crate::transport::engine::Link;
use crate::transport::shm::{EAGER_BUFFERS, EAGER_BYTES, SLOT_PAYLOAD};
use crate::transport::SmallCall;
use crate::types::DType;

/// Most bytes all peers' messages of one fast call may bring a rank
/// together: a one-step allreduce on `n` ranks reads `n - 1` whole
/// contributions, and beyond this (which stays in the L1/L2 caches) the
/// plans, which move `2(n-1)/n` of one, do better.
const MAX_CALL_BYTES: usize = 3 * EAGER_BYTES;

thread_local! {
    /// This thread's copy of its contribution for calls in place (the
    /// output overlaps the input): kept between calls, so that a call
    /// allocates nothing once the thread has made one of that size.
    static SCRATCH: Cell<Vec<u64>> = const { Cell::new(Vec::new()) };
}

/// Largest scratch, in bytes, a thread keeps between calls: a two-step
/// allreduce's scratch holds a whole span (a `1/n` of the call), which for
/// calls of hundreds of MiB is memory the thread should not hold after
/// them; such calls take long enough that allocating it again costs them
/// little.
const SCRATCH_KEPT_BYTES: usize = 64 << 20;

/// Puts `scratch` back for this thread's next call, unless it is larger
/// than [`SCRATCH_KEPT_BYTES`] (then it is freed).
fn keep_scratch(scratch: Vec<u64>) {
    if scratch.capacity() * 8 <= SCRATCH_KEPT_BYTES {
        SCRATCH.set(scratch);
    }
}

/// Whether the fast path implements `coll` at all.
pub(crate) fn handles(coll: Collective) -> bool {
    matches!(
        coll,
        Collective::AllReduce
            | Collective::Broadcast
            | Collective::Reduce
            | Collective::AllGather
            | Collective::AllToAll
            | Collective::ReduceScatter
            | Collective::Barrier
    )
}

/// Whether `coll`'s contribution is one block per rank (block `r` for
/// group rank `r`), each peer sent only its own: all-to-all and
/// reduce-scatter.
fn sends_blocks(coll: Collective) -> bool {
    matches!(coll, Collective::AllToAll | Collective::ReduceScatter)
}

/// The most bytes per rank (allgather, all-to-all, reduce-scatter: per
/// block, the bytes one pair exchanges) a fast call among `n`
/// ranks may carry: one slot's payload at least, one eager buffer at most
/// (one message per pair and call), and at most [`MAX_CALL_BYTES`] from
/// all peers together: 16 KiB on 2-4 ranks, 12 KiB on 5, 7 KiB on 8,
/// 3.2 KiB on 16.
pub(crate) fn max_message(n: usize) -> usize {
    (MAX_CALL_BYTES / n.saturating_sub(1).max(1)).clamp(SLOT_PAYLOAD, EAGER_BYTES)
}

/// Longest broadcast the fast path streams among `n` ranks ([`streams`]):
/// two eager buffers on 2 ranks (past one, 2-rank broadcasts read the
/// root's memory instead, [`reads_remote`]), 512 KiB on 3 and 4. A
/// streamed part is copied twice (into the eager buffer by the root, out
/// of it by the receiver, on two cores at once), where the plans' single
/// copy reads the root's memory once; but the root runs up to
/// [`EAGER_BUFFERS`] parts ahead, each receiver copies without the
/// engine's frames and matches, and no receiver waits on another. The sixth
/// session measured the parts losing from 96 KiB on 4 ranks; with the
/// twelfth's mailboxes they took 0.51-0.85x `direct`'s time at 128-256 KiB
/// on 4 ranks, 0.97x at 512 KiB, 1.03x at 1 MiB and 1.22x at 2 MiB, and
/// on 3 ranks 0.59-0.80x at 128 KiB - 1 MiB, 1.11-1.17x at 2-4 MiB
/// (bench/RESULTS.md, twelfth session). Where remote reads are on, the 3-4
/// rank broadcasts past [`BROADCAST_READ_FLOOR`] up to this limit read the
/// root's memory instead (fifteenth session).
pub(crate) fn broadcast_stream_bytes(n: usize) -> usize {
    if n <= 2 {
        2 * EAGER_BYTES
    } else {
        32 * EAGER_BYTES
    }
}

/// Largest group whose broadcasts and reduces are streamed ([`streams`]):
/// the root writes (broadcast) or reduces (reduce) every peer's parts, so
/// its work grows with the group; measured faster than the plans on 2, 3
/// and 4 ranks.
pub(crate) const STREAM_MAX_RANKS: usize = 4;

/// Whether a broadcast or reduce of `bytes` among `n` ranks (or, both ways
/// between 2 ranks, [`run_streamed_pair`]: an allreduce of any length, an
/// allgather or all-to-all of blocks up to 1 MiB), too long for one message,
/// goes through the fast path as consecutive messages of one eager buffer
/// each (up to [`STREAM_MAX_RANKS`] ranks; broadcasts up to
/// [`broadcast_stream_bytes`], reduces of any length). Broadcasts and
/// reduces are one-way calls: the receiver copies or reduces each part, in
/// place in the eager buffer, while the sender writes the next, a sender
/// runs up to
/// [`EAGER_BUFFERS`](crate::transport::shm::EAGER_BUFFERS) parts ahead
/// of its receiver, and no frame, match or acknowledgement goes through
/// the rings. A reduce so moves each byte
/// once into shared memory and reads it once, reducing; through the rings
/// the root, which in a loop of reduces posts its receive after the bytes
/// arrived, copies them out of the ring first (2-rank reduce of 2 MiB:
/// 0.53x the time).
pub(crate) fn streams(coll: Collective, bytes: usize, n: usize) -> bool {
    (2..=STREAM_MAX_RANKS).contains(&n)
        && bytes > max_message(n)
        && match coll {
            Collective::Broadcast => bytes <= broadcast_stream_bytes(n),
            Collective::Reduce => true,
            Collective::AllReduce => n == 2,
            // Past 1 MiB blocks the engine's single copy did as well or
            // better: 2 MiB blocks took 1.08-1.11x its time streamed
            // (bench/RESULTS.md, tenth session).
            Collective::AllGather | Collective::AllToAll => {
                n == 2 && bytes <= REMOTE_MAX_CALL_BYTES
            }
            _ => false,
        }
}

/// Most parts a rank of a streamed 2-rank exchange sends ahead of the
/// peer's part it reduces or copies ([`run_streamed_pair`]; 4, 6 and 10
/// measured alike, tenth session); at most `EAGER_BUFFERS - 1`, so that
/// two ranks that each wait for room to send never wait on each other.
pub(crate) const PAIR_AHEAD: usize = 6;
const _: () = assert!(PAIR_AHEAD < EAGER_BUFFERS);

/// Most elements in one part of a streamed 2-rank exchange: a packed
/// signature holds a 16-bit count ([`super::pack`]).
pub(crate) const PAIR_PART_MAX_COUNT: usize = 1 << 15;

/// Largest group whose allreduces run in two steps ([`two_step`]): every
/// group the fast path serves (measured faster than the plans on 3 to 16
/// ranks).
pub(crate) const TWO_STEP_MAX_RANKS: usize = FAST_MAX_RANKS;

/// Most bytes in one part of a two-step allreduce's span ([`two_step`]),
/// where the eager buffers are larger (hosts of up to 4 ranks). A 512 KiB
/// allreduce on 4 ranks in parts of 64 KiB took 0.66x the time of one 128
/// KiB part per span, in 32 KiB parts 0.79x; at 128-512 KiB on 3 and 4
/// ranks both sizes came out at 0.79-1.08x (bench/RESULTS.md, eleventh
/// session).
pub(crate) const TWO_STEP_PART_BYTES: usize = 64 << 10;

/// Whether an allreduce of `count` elements of `elem_size` bytes among `n`
/// ranks (3 to [`TWO_STEP_MAX_RANKS`]), too long for one message per pair
/// ([`max_message`]), runs as *two steps* on the fast path
/// ([`run_two_step`]): a reduce-scatter (every
/// rank sends each peer that peer's span of its input and reduces its own)
/// and an allgather of the reduced spans, under the call's one key: what
/// the plans' `direct` does through the engine. Rank `r`'s span is its
/// block, `count / n` elements from `r * (count / n)`, and the `count % n`
/// elements after it (the next block's first, or for the last rank the
/// count's tail), so that every message of a step has one length and is a
/// contiguous slice of the input: the few elements two ranks both reduce
/// come out alike (rank order). A span goes in parts of an eager buffer
/// ([`FastPath::eager_buffer_bytes`]: 16 KiB on hosts of more than 4
/// ranks) or of [`TWO_STEP_PART_BYTES`], at most [`PAIR_PART_MAX_COUNT`]
/// elements, each part one exchange with every peer. Measured
/// (bench/RESULTS.md, eleventh session): 0.35-0.60x the plans' time at 24
/// KiB - 512 KiB on 3 and 4 ranks (0.77x at 512 KiB on 4), 0.35-0.55x at
/// 64-512 KiB on 6, 8 and 16 ranks. Of any length: the eleventh session
/// stopped them at 512 KiB on a few runs past it (0.90-1.10x the plans at
/// 1-2 MiB); the twelfth's interleaved runs had them at 0.61-0.85x the
/// plans' time at 1-32 MiB on 3 ranks, 0.77-0.92x at 2-32 MiB on 4 (one
/// run of 1.36x at 1 MiB among 0.72-0.85x), 0.82-0.90x on 6, 0.86-1.00x
/// on 8 and 0.69-0.88x at 1-4 MiB on 16, all with more ranks than cores
/// (2 here), where two steps wait on descheduled peers far less often
/// than `2(n - 1)` do.
pub(crate) fn two_step(coll: Collective, count: usize, elem_size: usize, n: usize) -> bool {
    coll == Collective::AllReduce
        && (3..=TWO_STEP_MAX_RANKS).contains(&n)
        && count
            .checked_mul(elem_size)
            .is_some_and(|bytes| bytes > max_message(n))
}

/// Largest group whose large exchanges read the senders' memory
/// ([`reads_remote`]).
pub(crate) const REMOTE_MAX_RANKS: usize = 4;

/// Most bytes a rank reads from all peers together in one remote-read
/// call ([`reads_remote`]). Beyond it the copies dominate and the plans'
/// engine, whose per-call cost no longer shows, did as well: 2-rank
/// allgather and all-to-all at 1 MiB blocks 0.99x the engine's time, at
/// 4 MiB blocks 0.98-1.08x (bench/RESULTS.md, seventh session).
pub(crate) const REMOTE_MAX_CALL_BYTES: usize = 1 << 20;

/// The block size past which an allgather or all-to-all among `n` ranks
/// reads the peers' memory ([`reads_remote`]): 4 KiB on 2 ranks, where one
/// read beats the eager buffers' two copies from 8 KiB blocks (2-rank
/// allgather of 8 KiB blocks: 0.75-0.78x the time, 16 KiB: 0.63x; 4 KiB:
/// 0.98x); the eager buffers' size on 3 and 4 ranks, where the reads lost
/// below it with more ranks than cores (allgather of 8 KiB blocks on 3
/// ranks 1.25-1.54x, 16 KiB on 4 ranks 1.33x; bench/RESULTS.md, seventh
/// session).
pub(crate) fn remote_floor(n: usize) -> usize {
    if n == 2 {
        EAGER_BYTES / 4
    } else {
        max_message(n)
    }
}

/// Whether an allgather or all-to-all of `bytes` per block among `n` ranks
/// (2-4) past [`remote_floor`], or a broadcast of `bytes` on 2 ranks past
/// one eager buffer (split between both ends, [`run_remote_broadcast`]),
/// goes through the fast path as *remote reads* (when
/// the job may read its ranks' memory, see [`FastPath::reads_remote`]):
/// each rank sends every peer one slot with the address of the bytes that
/// peer needs, each reads them straight from the sender's memory with
/// `process_vm_readv`, and a sender's call returns once every peer has
/// consumed its slot. That is what the plans' single copy does through the
/// engine (one read of each peer's block, one local copy of its own),
/// without a frame, a match or an acknowledgement frame per message: on
/// 2 ranks the engine spent ~2 us a call outside the copies (128 KiB
/// allgather: 6.7 us, of which 4.6 copying; bench/RESULTS.md, seventh
/// session). At most [`REMOTE_MAX_CALL_BYTES`] a rank reads.
pub(crate) fn reads_remote(coll: Collective, bytes: usize, n: usize) -> bool {
    if !(2..=REMOTE_MAX_RANKS).contains(&n) {
        return false;
    }
    match coll {
        // On 2 ranks only up to one eager message: past it they stream
        // ([`run_streamed_pair`]).
        Collective::AllGather | Collective::AllToAll => {
            bytes > remote_floor(n)
                && bytes.saturating_mul(n - 1) <= REMOTE_MAX_CALL_BYTES
                && (n > 2 || bytes <= max_message(n))
        }
        // On 2 ranks past one eager buffer, split between the root's
        // writes and the receiver's reads (`run_remote_broadcast`): in
        // place 0.37-0.62x the engine's time at 64 KiB - 64 MiB, 0.71-0.77x
        // the streamed parts' at 24-32 KiB (a tie at 20 KiB). A single
        // reader on 3 ranks took 0.96-1.01x the engine's time and on 4
        // (more ranks than cores here) 1.06-1.14x, so those keep the
        // streamed parts and the plans (bench/RESULTS.md, seventh session).
        Collective::Broadcast if n == 2 => bytes > max_message(n) && bytes <= u32::MAX as usize,
        // On 3-4 ranks past 64 KiB up to the streamed parts' limit, every
        // receiver reads the root's buffer instead ([`run_read_broadcast`]).
        Collective::Broadcast => bytes > BROADCAST_READ_FLOOR && bytes <= broadcast_stream_bytes(n),
        // On 2 ranks past 32 KiB up to 4 MiB split between both ranks,
        // each reading the other's memory ([`run_remote_reduce`]).
        Collective::Reduce => {
            n == 2 && bytes > REMOTE_REDUCE_FLOOR && bytes <= REMOTE_REDUCE_MAX_BYTES
        }
        // Allreduces stream instead, at every length.
        _ => false,
    }
}

/// Whether a call of `count` elements of `dtype` (block collectives: per
/// block)
/// among `n` ranks fits the fast path ([`max_message`], [`streams`] or
/// [`two_step`]; [`remote_eligible`] adds the calls that read the peers'
/// memory).
/// It depends only on what every rank of the call agrees on, so all ranks
/// decide alike.
pub(crate) fn eligible(coll: Collective, count: usize, dtype: DType, n: usize) -> bool {
    handles(coll)
        && (2..=FAST_MAX_RANKS).contains(&n)
        && count.checked_mul(dtype.size()).is_some_and(|bytes| {
            bytes <= max_message(n)
                || streams(coll, bytes, n)
                || two_step(coll, count, dtype.size(), n)
        })
}

/// Whether a call of `count` elements of `dtype` among `n` ranks goes
/// through the fast path as remote reads on `fast` ([`reads_remote`]).
pub(crate) fn remote_eligible(
    fast: &FastPath,
    coll: Collective,
    count: usize,
    dtype: DType,
    n: usize,
) -> bool {
    fast.reads_remote()
        && count
            .checked_mul(dtype.size())
            .is_some_and(|bytes| reads_remote(coll, bytes, n))
}

/// Runs `call` on `mem` over `fast`, whose lengths must be those the
/// collective implies for this rank (checked).
pub(crate) fn run(
    fast: &FastPath,
    link: &Link<'_>,
    call: &SmallCall<'_>,
    mem: &mut Memory<'_>,
) -> Result<()> {
    if one_pass(call) {
        return match call.group.len() {
            2 => run_one_pass::<1>(fast, link, call, mem),
            _ => run_one_pass::<ONE_PASS_MAX_PEERS>(fast, link, call, mem),
        };
    }
    // Room for where the peers' messages lie, on the stack, sized for
    // small groups when the group is small.
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
    let remote = remote_eligible(fast, call.coll, call.count, call.dtype, n);
    let two_steps = two_step(call.coll, call.count, call.dtype.size(), n);
    let streamed = len > EAGER_BYTES && !remote && !two_steps;
    debug_assert!(
        (len <= EAGER_BYTES || streams(call.coll, len, n) || remote || two_steps)
            && (2..=PEERS + 1).contains(&n)
    );

    let (mine_len, out_len) = lengths(call, mem)?;

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
    let ends = Ends {
        others: &others[..n - 1],
        root: [call.group[root]],
    };
    if two_steps {
        return run_two_step::<PEERS>(fast, link, call, &ends, mem);
    }
    if streamed && pair_streams(call.coll) {
        return run_streamed_pair::<PEERS>(fast, link, call, &ends, mem);
    }
    if streamed {
        return run_streamed::<PEERS>(fast, link, call, &ends, mem);
    }
    if remote && call.coll == Collective::Broadcast && n == 2 {
        return run_remote_broadcast::<PEERS>(fast, link, call, &ends, mem);
    }
    if remote && call.coll == Collective::Broadcast {
        return run_read_broadcast::<PEERS>(fast, link, call, &ends, mem);
    }
    if remote && call.coll == Collective::Reduce {
        return run_remote_reduce::<PEERS>(fast, link, call, &ends, mem);
    }
    if remote {
        return run_remote::<PEERS>(fast, link, call, &ends, mem, (mine_len, out_len));
    }

    // This rank's contribution is read until the output is written, after
    // every message arrived: in place (the output overlaps it) it is
    // copied out first, into this thread's scratch.
    let mut scratch = SCRATCH.take();
    let (mine, out) = contribution_and_output(mem, &mut scratch, (mine_len, out_len));
    let piece = Piece::whole(&call.header);
    let result = exchange_piece::<PEERS>(fast, link, call, &ends, piece, call.timeout, mine, out);
    SCRATCH.set(scratch);
    result
}

/// This rank's contribution and output lengths in bytes for `call` (its
/// first `mine_len` input bytes, its first `out_len` output bytes), or an
/// internal error when `mem` is shorter.
fn lengths(call: &SmallCall<'_>, mem: &mut Memory<'_>) -> Result<(usize, usize)> {
    let (n, me, root) = (call.group.len(), call.rank, call.root);
    let len = call.count * call.dtype.size();
    let sends = match call.coll {
        Collective::Barrier => false,
        Collective::Broadcast => me == root,
        _ => true,
    };
    let mine_len = if !sends {
        0
    } else if sends_blocks(call.coll) {
        n * len
    } else {
        len
    };
    let out_len = match call.coll {
        Collective::AllReduce => len,
        Collective::Reduce if me == root => len,
        Collective::Broadcast => len,
        Collective::AllGather | Collective::AllToAll => n * len,
        Collective::ReduceScatter => len,
        _ => 0,
    };
    if mem.input().len() < mine_len {
        return Err(Error::Internal(format!(
            "fast {}: input of {} bytes, {mine_len} needed",
            call.coll,
            mem.input().len()
        )));
    }
    if mem.output().len() < out_len {
        return Err(Error::Internal(format!(
            "fast {}: output of {} bytes, {out_len} needed",
            call.coll,
            mem.output().len()
        )));
    }
    Ok((mine_len, out_len))
}

/// Whether `call` takes [`FastPath::exchange_one_pass`]: at most one
/// message to and from each peer ([`ONE_PASS_MAX_PEERS`]), all it receives
/// together at most [`ONE_PASS_MAX_BYTES`]; on more than 2 ranks only
/// broadcasts and reduces, whose senders run ahead, so that their receivers
/// usually find every message there. An allreduce on 4 ranks (2 cores)
/// rarely does, and then pays for the one pass and the general exchange
/// (0.9-1.25x the time at 8 B - 1 KiB; bench/RESULTS.md, fourteenth
/// session).
fn one_pass(call: &SmallCall<'_>) -> bool {
    let n = call.group.len();
    (n == 2
        || n <= ONE_PASS_MAX_PEERS + 1
            && matches!(call.coll, Collective::Broadcast | Collective::Reduce))
        && call
            .count
            .checked_mul(call.dtype.size() * (n - 1))
            .is_some_and(|bytes| bytes <= ONE_PASS_MAX_BYTES)
}

/// A call of one short message to and from each peer at most
/// ([`one_pass`]), through [`FastPath::exchange_one_pass`].
/// `MAX`: the most peers (1 on 2 ranks, so that its loops are one step).
fn run_one_pass<const MAX: usize>(
    fast: &FastPath,
    link: &Link<'_>,
    call: &SmallCall<'_>,
    mem: &mut Memory<'_>,
) -> Result<()> {
    let (n, me, root) = (call.group.len(), call.rank, call.root);
    let len = call.count * call.dtype.size();
    let (mine_len, out_len) = lengths(call, mem)?;
    // Every other rank, in group order (transport ranks).
    let mut others = [0usize; MAX];
    for (i, o) in others[..n - 1].iter_mut().enumerate() {
        *o = call.group[if i < me { i } else { i + 1 }];
    }
    let root_at = [call.group[root]];
    let (to, from) = directions(call, &others[..n - 1], &root_at);
    // The root of a broadcast in place has nothing to write: its output
    // is its input. Other calls in place copy their contribution first,
    // as `run_with` does.
    let root_in_place = call.coll == Collective::Broadcast && me == root && {
        let input = mem.input().as_ptr();
        input == mem.output().as_ptr()
    };
    let mut scratch = Vec::new();
    let mut nothing: [u8; 0] = [];
    let (mine, out): (&[u8], &mut [u8]) = if root_in_place {
        (&mem.input()[..mine_len], &mut nothing)
    } else if mine_len == 0 {
        // A broadcast's receiver: nothing of its input is read.
        (&[], &mut mem.output()[..out_len])
    } else if let Some((input, output)) = mem.apart() {
        (&input[..mine_len], &mut output[..out_len])
    } else {
        // In place: copied into the thread's scratch first (taken only
        // here: a thread-local access a tiny call can do without).
        scratch = SCRATCH.take();
        contribution_and_output(mem, &mut scratch, (mine_len, out_len))
    };
    let payloads = payloads::<MAX>(call, mine, len, to.len());
    let result = fast.exchange_one_pass::<MAX, _, _>(
        link,
        &call.header,
        &payloads[..to.len()],
        (to, from),
        call.timeout,
        |theirs| {
            // Nothing to write (a broadcast's root in place, a reduce's
            // sender, a barrier): not even the dispatch on the collective.
            if !out.is_empty() {
                write_output(call, call.count, mine, |i| theirs[i], out)
            }
        },
    );
    if scratch.capacity() > 0 {
        SCRATCH.set(scratch);
    }
    result
}

/// This rank's contribution (its first `mine_len` input bytes) and output
/// (the first `out_len` bytes): in place, where the output overlaps the
/// input, the contribution is first copied into `scratch`.
fn contribution_and_output<'m>(
    mem: &'m mut Memory<'_>,
    scratch: &'m mut Vec<u64>,
    (mine_len, out_len): (usize, usize),
) -> (&'m [u8], &'m mut [u8]) {
    if mem.apart().is_some() {
        let (input, output) = mem.apart().expect("checked just above");
        (&input[..mine_len], &mut output[..out_len])
    } else {
        let copy = copy_into(scratch, &mem.input()[..mine_len]);
        (copy, &mut mem.output()[..out_len])
    }
}

/// `bytes` copied into `scratch` (8-byte aligned, as the reduction kernels
/// want), which keeps its capacity for the next call.
fn copy_into<'s>(scratch: &'s mut Vec<u64>, bytes: &[u8]) -> &'s [u8] {
    let copy = scratch_bytes(scratch, bytes.len());
    copy.copy_from_slice(bytes);
    copy
}

/// The first `len` bytes of this thread's `scratch` (8-byte aligned, as the
/// reduction kernels want), grown to fit. Grown, never cleared: zeroing
/// what the caller then overwrites would be a second pass over it.
fn scratch_bytes(scratch: &mut Vec<u64>, len: usize) -> &mut [u8] {
    if scratch.len() < len.div_ceil(8) {
        scratch.resize(len.div_ceil(8), 0);
    }
    &mut bytemuck::cast_slice_mut::<u64, u8>(scratch)[..len]
}

/// The ranks a call's messages go to or come from (transport ranks).
struct Ends<'a> {
    /// Every other rank of the group, in group order.
    others: &'a [usize],
    /// The root.
    root: [usize; 1],
}

/// The ranks a one-step call of `call` sends to and receives from (transport
/// ranks): from `others`, every other rank in group order, and `root`, the
/// root.
fn directions<'a>(
    call: &SmallCall<'_>,
    others: &'a [usize],
    root: &'a [usize; 1],
) -> (&'a [usize], &'a [usize]) {
    let me = call.rank;
    match call.coll {
        Collective::Broadcast if me == call.root => (others, &[]),
        Collective::Broadcast => (&[], root),
        Collective::Reduce if me == call.root => (&[], others),
        Collective::Reduce => (root, &[]),
        _ => (others, others),
    }
}

/// What each of the first `to` ranks a call sends to gets, `len` bytes
/// apiece: its block of this rank's contribution `mine` (a block
/// collective, whose `to` is every other rank in group order), or the
/// whole contribution.
fn payloads<'m, const PEERS: usize>(
    call: &SmallCall<'_>,
    mine: &'m [u8],
    len: usize,
    to: usize,
) -> [&'m [u8]; PEERS] {
    let me = call.rank;
    let blocks = sends_blocks(call.coll);
    let mut payloads: [&[u8]; PEERS] = [&[]; PEERS];
    for (i, p) in payloads[..to].iter_mut().enumerate() {
        *p = if blocks {
            // Group rank i, or i + 1 from this rank on.
            let r = if i < me { i } else { i + 1 };
            &mine[r * len..(r + 1) * len]
        } else {
            mine
        };
    }
    payloads
}

/// Sends this rank's part of one message of `call` (`mine`, `piece.count`
/// elements a peer; a block collective's contribution holds every peer's
/// block) and writes what it receives into `out` ([`write_output`]).
#[allow(clippy::too_many_arguments)]
fn exchange_piece<const PEERS: usize>(
    fast: &FastPath,
    link: &Link<'_>,
    call: &SmallCall<'_>,
    ends: &Ends<'_>,
    piece: Piece,
    timeout: Duration,
    mine: &[u8],
    out: &mut [u8],
) -> Result<()> {
    let len = piece.count * call.dtype.size();
    let (to, from) = directions(call, ends.others, &ends.root);
    let mut got: [Got; PEERS] = std::array::from_fn(|_| Got::Waiting);
    let payloads = payloads::<PEERS>(call, mine, len, to.len());
    fast.exchange(
        link,
        &call.header,
        &payloads[..to.len()],
        to,
        from,
        &mut got,
        (piece, timeout),
        |parts| write_output(call, piece.count, mine, |i| parts.get(i), out),
    )
}

/// The length past which a broadcast on 3-4 ranks is read from the root's
/// memory ([`run_read_broadcast`]) rather than streamed. Interleaved, in
/// place, median us (bench/RESULTS.md, fifteenth session), streamed / read
/// / Open MPI: 4 ranks 32 KiB 9.9 / 16.4 / 18.0, 64 KiB 19.1 / 22.8 / 24.4,
/// 128 KiB 38.9 / 36.3 / 40.2, 512 KiB 158.5 / 107.5 / 142.4; 3 ranks
/// 128 KiB 30.5 / 20.8 / 32.4, 512 KiB 93.4 / 58.5 / 91.2.
pub(crate) const BROADCAST_READ_FLOOR: usize = 4 * EAGER_BYTES;

/// A broadcast root's input, and its output when that is a buffer of its
/// own (out of place; `None` in place, where the input is the output).
fn broadcast_root_buffers<'m>(mem: &'m mut Memory<'_>) -> (&'m [u8], Option<&'m mut [u8]>) {
    if mem.apart().is_some_and(|(_, output)| !output.is_empty()) {
        let (input, output) = mem.apart().expect("checked above");
        (input, Some(output))
    } else {
        (mem.input(), None)
    }
}

/// A broadcast on 3-4 ranks as remote reads ([`reads_remote`]): the root
/// sends every receiver the address of its buffer, each receiver reads it
/// into its output (`process_vm_readv`), and the root returns once every
/// receiver has consumed its message (out of place it fills its own output
/// meanwhile). The streamed parts it replaces had the slow mode of
/// [`run_remote_reduce`]'s: 4-rank broadcasts of 16-512 KiB at 1.0-1.1
/// GB/s, 0.27-0.94x Open MPI, in one run.
fn run_read_broadcast<const PEERS: usize>(
    fast: &FastPath,
    link: &Link<'_>,
    call: &SmallCall<'_>,
    ends: &Ends<'_>,
    mem: &mut Memory<'_>,
) -> Result<()> {
    let len = call.count * call.dtype.size();
    let (to, from) = directions(call, ends.others, &ends.root);
    let piece = Piece::read_from_sender(call.count);
    let mut got: [Got; PEERS] = std::array::from_fn(|_| Got::Waiting);
    if call.rank == call.root {
        let (input, mut output) = broadcast_root_buffers(mem);
        let input = &input[..len];
        let address = (input.as_ptr() as u64).to_ne_bytes();
        let payloads: [&[u8]; PEERS] = [&address; PEERS];
        fast.exchange(
            link,
            &call.header,
            &payloads[..to.len()],
            to,
            from,
            &mut got,
            (piece, call.timeout),
            |_| -> Result<()> {
                if let Some(output) = output.as_mut() {
                    output[..len].copy_from_slice(input);
                }
                Ok(())
            },
        )?
    } else {
        let out = &mut mem.output()[..len];
        fast.exchange(
            link,
            &call.header,
            &[],
            to,
            from,
            &mut got,
            (piece, call.timeout),
            |parts| parts.read_into(0, out),
        )?
    }
}

/// An allgather or all-to-all as remote reads ([`reads_remote`]): every
/// peer gets the address of what it needs (allgather: this rank's
/// contribution; all-to-all: its block), and this rank reads every peer's
/// block for it from that peer's memory into its output. In place, the
/// contribution is first copied into this thread's scratch: the output is
/// written while the peers still read.
fn run_remote<const PEERS: usize>(
    fast: &FastPath,
    link: &Link<'_>,
    call: &SmallCall<'_>,
    ends: &Ends<'_>,
    mem: &mut Memory<'_>,
    (mine_len, out_len): (usize, usize),
) -> Result<()> {
    let (n, me) = (call.group.len(), call.rank);
    let len = call.count * call.dtype.size();
    let blocks = sends_blocks(call.coll);
    let mut scratch = SCRATCH.take();
    let (mine, out) = contribution_and_output(mem, &mut scratch, (mine_len, out_len));
    // The address each peer reads from (`others` in group order: group
    // rank i, or i + 1 from this rank on).
    let mut addrs = [[0u8; REMOTE_PAYLOAD]; PEERS];
    for (i, a) in addrs[..n - 1].iter_mut().enumerate() {
        let r = if i < me { i } else { i + 1 };
        let at = if blocks { r * len } else { 0 };
        *a = (mine[at..].as_ptr() as u64).to_ne_bytes();
    }
    let mut payloads: [&[u8]; PEERS] = [&[]; PEERS];
    for (p, a) in payloads.iter_mut().zip(&addrs) {
        *p = a;
    }
    let piece = Piece::read_from_sender(call.count);
    let mut got: [Got; PEERS] = std::array::from_fn(|_| Got::Waiting);
    let own = if blocks {
        &mine[me * len..(me + 1) * len]
    } else {
        mine
    };
    let result = fast.exchange(
        link,
        &call.header,
        &payloads[..n - 1],
        ends.others,
        ends.others,
        &mut got,
        (piece, call.timeout),
        |parts| -> Result<()> {
            // The own block first: the peers read this rank's memory
            // meanwhile, and its slots are consumed (the peers' calls
            // released) only after the reads below.
            for (r, block) in out.chunks_exact_mut(len.max(1)).enumerate() {
                if r == me {
                    block.copy_from_slice(own);
                }
            }
            for (r, block) in out.chunks_exact_mut(len.max(1)).enumerate() {
                if r != me {
                    parts.read_into(if r < me { r } else { r - 1 }, block)?;
                }
            }
            Ok(())
        },
    );
    SCRATCH.set(scratch);
    result?
}

/// Where a 2-rank broadcast of `len` bytes is split between its ends
/// ([`run_remote_broadcast`]): the receiver reads the bytes before it, the
/// root writes those from it on. In place, half, on a page boundary (the
/// kernel pins whole pages for each side); out of place the root fills its
/// own output meanwhile, as much copying as the receiver's whole read, so
/// the receiver reads all (a root that also wrote half took 1.19-1.24x the
/// plans' time at 2-8 MiB).
fn split_point(len: usize, root_in_place: bool) -> usize {
    if root_in_place {
        (len / 2).next_multiple_of(4096).min(len)
    } else {
        len
    }
}

/// The longest 2-rank reduce split between the ranks' reads of each other's
/// memory ([`run_remote_reduce`]); past it the streamed parts keep pace
/// (median of interleaved runs at 4 MiB: 421-487 us split, 477-535
/// streamed; at 8 MiB 1700 split, 1201 streamed; bench/RESULTS.md,
/// fifteenth session).
pub(crate) const REMOTE_REDUCE_MAX_BYTES: usize = 4 << 20;

/// The length past which a 2-rank reduce is split between the ranks' reads
/// ([`run_remote_reduce`]); up to it the streamed parts are as fast (32
/// KiB: 5.2-5.9 us against 5.0-5.9 streamed).
pub(crate) const REMOTE_REDUCE_FLOOR: usize = 2 * EAGER_BYTES;

/// How much of a 2-rank remote reduce each rank reads at a time before it
/// reduces it: the read lands in the output (or scratch), where the
/// reduction then finds it in this core's cache.
const REMOTE_REDUCE_CHUNK: usize = 128 << 10;

/// A 2-rank reduce of [`REMOTE_REDUCE_FLOOR`] - [`REMOTE_REDUCE_MAX_BYTES`]
/// split between both ranks ([`reads_remote`]), in the two messages each
/// way of [`split_exchange`]. First each sends its addresses: the root of
/// its input and output, the other rank of its input. Then the root reads
/// the first 5/8 of the other rank's input (`process_vm_readv`) in chunks
/// of [`REMOTE_REDUCE_CHUNK`] straight into its output (in place: into
/// scratch) and reduces each chunk with its own while it is in cache;
/// meanwhile the other rank reads the rest of the root's input into
/// scratch, reduces its own into it and writes the result into the root's
/// output (`process_vm_writev`): two kernel copies a byte against the
/// root's one, hence the uneven split. Then each says it is done and
/// returns once the other has: the other rank's input is read, the root's
/// output written. Both poll about as long as the other works before
/// sleeping (a wake-up on this VM costs more than such a wait).
///
/// Why not the streamed parts there: their speed depends on the machine's
/// mood. The non-root writes each part into an eager buffer that the root
/// has just read, and some runs on this VM spent 42 % of their samples in
/// that copy, a 256 KiB reduce taking 120-180 us against 17-30 in others;
/// in one interleaved run the streamed 128 KiB - 4 MiB reduces ranged
/// over 4.7-5.1x their best time, the split ones over 1.3-1.6x, at
/// 0.75-0.93x Open MPI's median time against 0.96-1.37x (bench/RESULTS.md,
/// fifteenth session). The tenth session's split took 2.5x the streamed
/// time at 128 KiB; its waits slept after the usual polling, which here
/// took a 2 MiB reduce from 316-324 us to 460-760.
fn run_remote_reduce<const PEERS: usize>(
    fast: &FastPath,
    link: &Link<'_>,
    call: &SmallCall<'_>,
    ends: &Ends<'_>,
    mem: &mut Memory<'_>,
) -> Result<()> {
    debug_assert_eq!(ends.others.len(), 1);
    let len = call.count * call.dtype.size();
    let peer = ends.others;
    let lost = |_| Error::PeerLost { rank: peer[0] };
    let (dtype, op) = (call.dtype, call.op);
    let size = dtype.size();
    // Chunks end on whole elements.
    let chunk = REMOTE_REDUCE_CHUNK - REMOTE_REDUCE_CHUNK % size;
    // The root reduces [0, split), the other rank [split, len): it reads
    // and writes the root's memory for each byte, the root only reads.
    let split = (len * 5 / 8).next_multiple_of(4096).min(len) / size * size;
    // Each waits about as long as the other works.
    let patient = link.polling_at_least(Duration::from_nanos(len as u64 / 4));
    let mut scratch = SCRATCH.take();
    let result = if call.rank != call.root {
        let input = &mem.input()[..len];
        let mut work = |parts: &Parts<'_>| -> Result<()> {
            let (root_input, root_output) = parts.address(0);
            let pid = parts.pid(0);
            for start in (split..len).step_by(chunk) {
                let end = (start + chunk).min(len);
                let sum = scratch_bytes(&mut scratch, end - start);
                crate::transport::shm::cma_read(pid, root_input + start as u64, sum)
                    .map_err(lost)?;
                kernels::accumulate(dtype, op, sum, &input[start..end]);
                crate::transport::shm::cma_write(pid, root_output + start as u64, sum)
                    .map_err(lost)?;
            }
            Ok(())
        };
        split_exchange::<PEERS>(
            fast,
            &patient,
            call,
            peer,
            &address_payload(input.as_ptr(), 0),
            &mut work,
        )
    } else {
        let (input, output) = match mem.apart() {
            Some((input, output)) => (input.as_ptr(), output.as_ptr()),
            None => (mem.input().as_ptr(), mem.input().as_ptr()),
        };
        let mut work = |parts: &Parts<'_>| -> Result<()> {
            let (theirs, _) = parts.address(0);
            let pid = parts.pid(0);
            for start in (0..split).step_by(chunk) {
                let end = (start + chunk).min(split);
                let at = theirs + start as u64;
                match mem.apart() {
                    Some((input, output)) => {
                        let out = &mut output[start..end];
                        crate::transport::shm::cma_read(pid, at, out).map_err(lost)?;
                        kernels::accumulate(dtype, op, out, &input[start..end]);
                    }
                    None => {
                        let read = scratch_bytes(&mut scratch, end - start);
                        crate::transport::shm::cma_read(pid, at, read).map_err(lost)?;
                        kernels::accumulate(dtype, op, &mut mem.output()[start..end], read);
                    }
                }
            }
            Ok(())
        };
        split_exchange::<PEERS>(
            fast,
            &patient,
            call,
            peer,
            &address_payload(input, output as usize),
            &mut work,
        )
    };
    SCRATCH.set(scratch);
    result
}

/// The 8-byte words of an address message's payload.
fn address_payload(addr: *const u8, word: usize) -> [u8; ADDRESS_PAYLOAD] {
    let mut payload = [0u8; ADDRESS_PAYLOAD];
    payload[..8].copy_from_slice(&(addr as u64).to_ne_bytes());
    payload[8..].copy_from_slice(&(word as u64).to_ne_bytes());
    payload
}

/// A 2-rank broadcast as remote reads and writes ([`reads_remote`]), in two
/// messages each way under the call's key: first both ends send the
/// address of their buffer (the root its input and the [`split_point`],
/// the receiver its output); then the receiver reads the bytes before the
/// split from the root's memory while the root writes those after it into
/// the receiver's (or, out of place, fills its own output), each core
/// copying about as much; then each tells the other it is done (an empty
/// message), and returns once the other's has come. A single reader
/// leaves the root's core idle: one read of 128 KiB took 4.6 us, two halves
/// at once 3.1 us, of 1 MiB 47 us against 18 (a C program,
/// bench/RESULTS.md, seventh session).
fn run_remote_broadcast<const PEERS: usize>(
    fast: &FastPath,
    link: &Link<'_>,
    call: &SmallCall<'_>,
    ends: &Ends<'_>,
    mem: &mut Memory<'_>,
) -> Result<()> {
    debug_assert_eq!(ends.others.len(), 1);
    let len = call.count * call.dtype.size();
    let peer = ends.others;
    let lost = |_| Error::PeerLost { rank: peer[0] };
    let split_exchange = |payload: &[u8], work: &mut dyn FnMut(&Parts<'_>) -> Result<()>| {
        split_exchange::<PEERS>(fast, link, call, peer, payload, work)
    };
    if call.rank == call.root {
        let (input, mut output) = broadcast_root_buffers(mem);
        let split = split_point(len, output.is_none());
        let input = &input[..len];
        split_exchange(&address_payload(input.as_ptr(), split), &mut |parts| {
            let (theirs, _) = parts.address(0);
            crate::transport::shm::cma_write(parts.pid(0), theirs + split as u64, &input[split..])
                .map_err(lost)?;
            if let Some(output) = output.as_mut() {
                output[..len].copy_from_slice(input);
            }
            Ok(())
        })
    } else {
        let out = &mut mem.output()[..len];
        split_exchange(&address_payload(out.as_ptr(), 0), &mut |parts| {
            // The root writes `out[split..]` meanwhile: disjoint.
            let (root_input, split) = parts.address(0);
            let split = usize::try_from(split).unwrap_or(usize::MAX).min(len);
            crate::transport::shm::cma_read(parts.pid(0), root_input, &mut out[..split])
                .map_err(lost)
        })
    }
}

/// The two messages each way of a 2-rank call split between its ends (the
/// split broadcast and the split reduce): first the addresses (`payload`),
/// with `work` run once the peer's has come, then an empty one that says
/// the work is done; returns once the peer's has come too.
fn split_exchange<const PEERS: usize>(
    fast: &FastPath,
    link: &Link<'_>,
    call: &SmallCall<'_>,
    peer: &[usize],
    payload: &[u8],
    work: &mut dyn FnMut(&Parts<'_>) -> Result<()>,
) -> Result<()> {
    let mut got: [Got; PEERS] = std::array::from_fn(|_| Got::Waiting);
    for (carries, payload) in [(Carries::Address, payload), (Carries::Bytes, &[][..])] {
        let piece = Piece {
            count: if carries == Carries::Bytes {
                0
            } else {
                call.count
            },
            parts: 2,
            last: carries == Carries::Bytes,
            carries,
            tail: None,
        };
        let timed = (piece, call.timeout);
        let work = &mut *work;
        fast.exchange(
            link,
            &call.header,
            &[payload],
            peer,
            peer,
            &mut got,
            timed,
            |parts| {
                if carries == Carries::Bytes {
                    Ok(())
                } else {
                    work(parts)
                }
            },
        )??;
    }
    Ok(())
}

/// A streamed broadcast or reduce ([`streams`]): the call's bytes as
/// consecutive messages of one eager buffer each, under the call's key, so
/// that the receiver copies (or reduces) one part while the sender writes
/// the next. A sender runs up to
/// [`EAGER_BUFFERS`](crate::transport::shm::EAGER_BUFFERS) parts ahead of
/// its receiver.
fn run_streamed<const PEERS: usize>(
    fast: &FastPath,
    link: &Link<'_>,
    call: &SmallCall<'_>,
    ends: &Ends<'_>,
    mem: &mut Memory<'_>,
) -> Result<()> {
    let size = call.dtype.size();
    let per_part = EAGER_BYTES / size;
    let parts = call.count.div_ceil(per_part);
    let until = Instant::now() + call.timeout;
    let (me, root) = (call.rank, call.root);
    // What this rank sends and writes: a broadcast's receivers send
    // nothing, a reduce's non-roots write nothing.
    let sends = !(call.coll == Collective::Broadcast && me != root);
    let writes = !(call.coll == Collective::Reduce && me != root);
    // In place, a reduce's root reads each part of its input before it
    // writes that part of its output: the part goes through this scratch.
    let mut scratch = SCRATCH.take();
    let mut result = Ok(());
    for part in 0..parts {
        let first = part * per_part;
        let count = per_part.min(call.count - first);
        let bytes = first * size..(first + count) * size;
        let piece = Piece {
            count,
            parts,
            last: part + 1 == parts,
            carries: Carries::Bytes,
            tail: None,
        };
        let timeout = until.saturating_duration_since(Instant::now());
        let exchange = |mine: &[u8], out: &mut [u8]| {
            exchange_piece::<PEERS>(fast, link, call, ends, piece, timeout, mine, out)
        };
        result = match mem.apart() {
            Some((input, output)) => {
                let mine = if sends {
                    &input[bytes.clone()]
                } else {
                    &[][..]
                };
                let out = if writes {
                    &mut output[bytes]
                } else {
                    &mut [][..]
                };
                exchange(mine, out)
            }
            // In place, a broadcast's root sends from its output, which is
            // its input, and writes nothing.
            None if call.coll == Collective::Broadcast && me == root => {
                exchange(&mem.input()[bytes], &mut [])
            }
            None if sends && writes => {
                let copy = copy_into(&mut scratch, &mem.input()[bytes.clone()]);
                exchange(copy, &mut mem.output()[bytes])
            }
            None if sends => exchange(&mem.input()[bytes], &mut []),
            None => exchange(&[], &mut mem.output()[bytes]),
        };
        if result.is_err() {
            break;
        }
    }
    SCRATCH.set(scratch);
    result
}

/// Whether a streamed call of `coll` goes both ways between two ranks
/// ([`run_streamed_pair`]): allreduce, allgather and all-to-all.
fn pair_streams(coll: Collective) -> bool {
    matches!(
        coll,
        Collective::AllReduce | Collective::AllGather | Collective::AllToAll
    )
}

/// A streamed 2-rank allreduce, allgather or all-to-all ([`streams`]): each
/// rank sends what the peer needs (its input; an all-to-all's block for the
/// peer) as consecutive parts of one eager buffer each
/// ([`FastPath::eager_buffer_bytes`], at most [`PAIR_PART_MAX_COUNT`]
/// elements), under the call's key, and reduces each of the peer's parts
/// with its own into its output (allreduce) or copies it into the peer's
/// block of the output, in place from the eager buffer; its own block it
/// copies meanwhile. Each byte is copied once into shared memory and read
/// once from it, by user-space copies.
///
/// A rank sends [`PAIR_AHEAD`] parts before it waits for the peer's first,
/// and keeps that lead: part `p + PAIR_AHEAD` goes out before part `p` is
/// read. A receiver then reads bytes the peer wrote several parts ago,
/// which have left the writer's L2 for the shared L3; a part read just
/// after it was written crosses between the cores' L2s line by line: in
/// a C model of these copies (bench/stream_pair.c) a lead of 256 KiB took
/// 1.4x the time of 1 MiB at 1 MiB, and the old 2-rank allreduce (16 KiB
/// parts exchanged in lockstep up to 4 MiB, the split above) took
/// 1.04-1.43x this one's at 64 KiB - 64 MiB (bench/RESULTS.md, tenth
/// session). Each send and receive is its own exchange with the one peer:
/// a send waits only for room (a free eager buffer), and as the lead is
/// less than the 16 buffers, two ranks that each wait for room always find
/// the other able to receive.
///
/// The remote reads these calls used before (`process_vm_readv`, the
/// kernel's copy at about 10 GB/s here against 35-42 GB/s for memcpy of
/// cached bytes) lost to these parts (tenth session).
///
/// In place, an allreduce sends part `p + PAIR_AHEAD` from the input
/// before part `p` of the output (the same memory) is written, and reduces
/// part `p` in place; an allgather or all-to-all first copies its
/// contribution into this thread's scratch. Both ranks hold the same bits:
/// the operators are commutative, so the order of the two operands does
/// not change a result.
fn run_streamed_pair<const PEERS: usize>(
    fast: &FastPath,
    link: &Link<'_>,
    call: &SmallCall<'_>,
    ends: &Ends<'_>,
    mem: &mut Memory<'_>,
) -> Result<()> {
    debug_assert_eq!(ends.others.len(), 1);
    if call.coll == Collective::AllReduce || mem.apart().is_some() {
        return stream_pair::<PEERS>(fast, link, call, ends, mem);
    }
    let mut scratch = SCRATCH.take();
    let copy = copy_into(&mut scratch, mem.input());
    let mut apart = Memory::separate::<u8>(copy, mem.output());
    let result = stream_pair::<PEERS>(fast, link, call, ends, &mut apart);
    SCRATCH.set(scratch);
    result
}

/// [`run_streamed_pair`] on `mem`, whose input and output are apart unless
/// the call is an allreduce.
fn stream_pair<const PEERS: usize>(
    fast: &FastPath,
    link: &Link<'_>,
    call: &SmallCall<'_>,
    ends: &Ends<'_>,
    mem: &mut Memory<'_>,
) -> Result<()> {
    let size = call.dtype.size();
    let len = call.count * size;
    let per_part = (fast.eager_buffer_bytes() / size).min(PAIR_PART_MAX_COUNT);
    let parts = call.count.div_ceil(per_part);
    let ahead = PAIR_AHEAD.min(parts);
    let until = Instant::now() + call.timeout;
    let peer = ends.others;
    let none: &[usize] = &[];
    let (me, them) = (call.rank, 1 - call.rank);
    // Where what the peer gets starts in the input, and where what it
    // sends goes in the output (the allreduce's whole buffers, the
    // all-to-all's and allgather's blocks).
    let (sent_from, received_at) = match call.coll {
        Collective::AllReduce => (0, 0),
        Collective::AllGather => (0, them * len),
        _ => (them * len, them * len),
    };
    // Part `p`: its element count and byte range within the stream.
    let part = |p: usize| {
        let first = p * per_part;
        let count = per_part.min(call.count - first);
        (count, first * size..(first + count) * size)
    };
    let piece = |count: usize, last: bool| Piece {
        count,
        parts,
        last,
        carries: Carries::Bytes,
        tail: None,
    };
    let send = |p: usize, mem: &mut Memory<'_>| -> Result<()> {
        let (count, bytes) = part(p);
        let bytes = sent_from + bytes.start..sent_from + bytes.end;
        let mine = match mem.apart() {
            Some((input, _)) => &input[bytes],
            None => &mem.input()[bytes],
        };
        let timeout = until.saturating_duration_since(Instant::now());
        // Never the call's last message: the receive of the last part is.
        let timed = (piece(count, false), timeout);
        let mut got: [Got; PEERS] = std::array::from_fn(|_| Got::Waiting);
        fast.exchange(
            link,
            &call.header,
            &[mine],
            peer,
            none,
            &mut got,
            timed,
            |_| (),
        )
    };
    let receive = |p: usize, mem: &mut Memory<'_>| -> Result<()> {
        let (count, bytes) = part(p);
        let timeout = until.saturating_duration_since(Instant::now());
        let timed = (piece(count, p + 1 == parts), timeout);
        let mut got: [Got; PEERS] = std::array::from_fn(|_| Got::Waiting);
        fast.exchange(
            link,
            &call.header,
            &[],
            none,
            peer,
            &mut got,
            timed,
            |got| {
                let theirs = got.get(0);
                let at = received_at + bytes.start..received_at + bytes.end;
                match mem.apart() {
                    Some((_, output)) if call.coll != Collective::AllReduce => {
                        output[at].copy_from_slice(theirs);
                    }
                    Some((input, output)) => {
                        let (out, mine) = (&mut output[at], &input[bytes]);
                        // In rank order, as every fast call reduces.
                        let (first, second) = if me == 0 {
                            (mine, theirs)
                        } else {
                            (theirs, mine)
                        };
                        kernels::combine(call.dtype, call.op, out, first, second);
                    }
                    None => kernels::accumulate(call.dtype, call.op, &mut mem.output()[at], theirs),
                }
            },
        )
    };
    for p in 0..ahead {
        send(p, mem)?;
    }
    // This rank's own block, while the peer copies its first parts.
    if call.coll != Collective::AllReduce {
        let own = if call.coll == Collective::AllGather {
            0
        } else {
            me * len
        };
        let (input, output) = mem.apart().expect("apart: see run_streamed_pair");
        output[me * len..(me + 1) * len].copy_from_slice(&input[own..own + len]);
    }
    for p in 0..parts {
        if p + ahead < parts {
            send(p + ahead, mem)?;
        }
        receive(p, mem)?;
    }
    Ok(())
}

/// An allreduce in two steps ([`two_step`]), both all to all: every rank
/// sends each peer that peer's span of its input and reduces its own span
/// from every rank's, in rank order, into this thread's scratch; then sends
/// that reduced span to every peer, copies each peer's block (and the last
/// rank's tail) into its output, and its own last. Each element is reduced
/// in rank order from the same inputs wherever it is, so every rank holds
/// the same bits. In place the input is read only in the first step and
/// the output written only in the second. A span longer than an eager
/// buffer goes in parts, each one exchange with every peer; every message
/// is marked as one of the call's `2 x parts` (and with the count's tail,
/// [`Piece::tail`]), so a call of another length differs in its first
/// message or, at the latest, in its first step's last part.
fn run_two_step<const PEERS: usize>(
    fast: &FastPath,
    link: &Link<'_>,
    call: &SmallCall<'_>,
    ends: &Ends<'_>,
    mem: &mut Memory<'_>,
) -> Result<()> {
    let (n, me) = (call.group.len(), call.rank);
    let size = call.dtype.size();
    let (block, tail) = (call.count / n, call.count % n);
    let span = block + tail;
    // Bytes of a block, of a span, and of the whole call.
    let (b, s, len) = (block * size, span * size, call.count * size);
    // A span longer than a part goes in parts, the same on every rank, each
    // step's parts one exchange apiece.
    let part_bytes = fast.eager_buffer_bytes().min(TWO_STEP_PART_BYTES);
    let per_part = (part_bytes / size).min(PAIR_PART_MAX_COUNT);
    let parts = span.div_ceil(per_part).max(1);
    let until = Instant::now() + call.timeout;
    // Part `k` of a step: its bytes within a span, and its message.
    let part = |k: usize, second: bool| {
        let first = k * per_part;
        let count = per_part.min(span - first);
        let piece = Piece {
            count,
            parts: 2 * parts,
            last: second && k + 1 == parts,
            carries: Carries::Bytes,
            tail: (tail > 0).then_some(tail),
        };
        let timed = (piece, until.saturating_duration_since(Instant::now()));
        (first * size..(first + count) * size, timed)
    };
    // Group rank of `others[i]`.
    let rank_of = |i: usize| if i < me { i } else { i + 1 };
    let mut scratch = SCRATCH.take();
    // Grown, never cleared: the reduction writes every byte it reads.
    if scratch.len() < s.div_ceil(8) {
        scratch.resize(s.div_ceil(8), 0);
    }
    let reduced = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut scratch)[..s];
    let result = (|| {
        // Step 1: each peer its span; this rank's span reduced.
        let input = mem.input();
        let span_of = |r: usize| &input[r * b..r * b + s];
        for k in 0..parts {
            let (at, timed) = part(k, false);
            let mut payloads: [&[u8]; PEERS] = [&[]; PEERS];
            for (i, p) in payloads[..n - 1].iter_mut().enumerate() {
                *p = &span_of(rank_of(i))[at.clone()];
            }
            let into = &mut reduced[at.clone()];
            with_all::<PEERS>(fast, link, call, ends, &payloads, timed, |parts| {
                let from = |r: usize| match r.cmp(&me) {
                    std::cmp::Ordering::Equal => &span_of(me)[at.clone()],
                    std::cmp::Ordering::Less => parts.get(r),
                    std::cmp::Ordering::Greater => parts.get(r - 1),
                };
                reduce_in_rank_order(call, n, into, from);
            })?;
        }
        // Step 2: the reduced span to every peer; their blocks (and the
        // last rank's tail, past the blocks) into place.
        let reduced: &[u8] = reduced;
        let output = mem.output();
        for k in 0..parts {
            let (at, timed) = part(k, true);
            let payloads: [&[u8]; PEERS] = [&reduced[at.clone()]; PEERS];
            with_all::<PEERS>(fast, link, call, ends, &payloads, timed, |parts| {
                // The part's bytes of a block, and of the tail.
                let in_block = at.start.min(b)..at.end.min(b);
                let in_tail = at.start.max(b)..at.end.max(b);
                for i in 0..n - 1 {
                    let (r, theirs) = (rank_of(i), parts.get(i));
                    let (mine, rest) = theirs.split_at(in_block.len());
                    output[r * b + in_block.start..r * b + in_block.end].copy_from_slice(mine);
                    if r == n - 1 {
                        output[n * b + in_tail.start - b..n * b + in_tail.end - b]
                            .copy_from_slice(rest);
                    }
                }
            })?;
        }
        output[me * b..(me + 1) * b].copy_from_slice(&reduced[..b]);
        if me == n - 1 {
            output[n * b..len].copy_from_slice(&reduced[b..]);
        }
        Ok(())
    })();
    keep_scratch(scratch);
    result
}

/// One message of `call` to and from every other rank of the group
/// (`payloads[i]` to `ends.others[i]`), then `read` on what arrived.
fn with_all<const PEERS: usize>(
    fast: &FastPath,
    link: &Link<'_>,
    call: &SmallCall<'_>,
    ends: &Ends<'_>,
    payloads: &[&[u8]; PEERS],
    timed: (Piece, Duration),
    read: impl FnOnce(&Parts<'_>),
) -> Result<()> {
    let peers = ends.others.len();
    let mut got: [Got; PEERS] = std::array::from_fn(|_| Got::Waiting);
    fast.exchange(
        link,
        &call.header,
        &payloads[..peers],
        ends.others,
        ends.others,
        &mut got,
        timed,
        read,
    )
}

/// `out` = the reduction by `call`'s operator of `from(0)`, ..., `from(n -
/// 1)`, in rank order (every rank so computes the same bits).
fn reduce_in_rank_order<'a>(
    call: &SmallCall<'_>,
    n: usize,
    out: &mut [u8],
    from: impl Fn(usize) -> &'a [u8],
) {
    kernels::combine(call.dtype, call.op, out, from(0), from(1));
    for r in 2..n {
        kernels::accumulate(call.dtype, call.op, out, from(r));
    }
}

/// Writes this rank's output of `call` from its contribution `mine` and
/// `part(i)`, the message from the `i`-th rank it receives from (in group
/// order, without this rank), each `count` elements (per block for the
/// block collectives): the whole call's, or a streamed part's (passed apart
/// rather than in a copy of `call`: a copy cost ~20 instructions of a tiny
/// call's ~1,600). Reductions run in rank order on every rank, so every
/// rank computes the same bits.
fn write_output<'p>(
    call: &SmallCall<'_>,
    count: usize,
    mine: &'p [u8],
    part: impl Fn(usize) -> &'p [u8],
    out: &mut [u8],
) {
    let (n, me, root) = (call.group.len(), call.rank, call.root);
    let len = count * call.dtype.size();
    let blocks = sends_blocks(call.coll);
    // What group rank r brings to this rank's output (when received from
    // all): its contribution, or for a block collective its block `me`
    // (this rank's own is block `me` of its contribution).
    let from = |r: usize| -> &[u8] {
        match r.cmp(&me) {
            std::cmp::Ordering::Equal if blocks => &mine[me * len..(me + 1) * len],
            std::cmp::Ordering::Equal => mine,
            std::cmp::Ordering::Less => part(r),
            std::cmp::Ordering::Greater => part(r - 1),
        }
    };
    match call.coll {
        Collective::AllReduce | Collective::Reduce | Collective::ReduceScatter
            if !out.is_empty() =>
        {
            reduce_in_rank_order(call, n, out, from)
        }
        Collective::Broadcast if me == root && !out.is_empty() => out.copy_from_slice(mine),
        // A streamed broadcast's root in place has no output to write.
        Collective::Broadcast if me == root => {}
        Collective::Broadcast => out.copy_from_slice(part(0)),
        Collective::AllGather | Collective::AllToAll => {
            for (r, block) in out.chunks_exact_mut(len.max(1)).enumerate() {
                block.copy_from_slice(from(r));
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eligibility_depends_on_shape_only() {
        assert!(eligible(Collective::AllReduce, 2, DType::F32, 2));
        assert!(eligible(Collective::Barrier, 0, DType::U8, 16));
        assert!(eligible(Collective::AllGather, 12, DType::F64, 4));
        // Up to one eager buffer per pair, and 48 KiB from all peers.
        assert_eq!(max_message(2), EAGER_BYTES);
        assert_eq!(max_message(4), EAGER_BYTES);
        assert_eq!(max_message(8), 3 * EAGER_BYTES / 7);
        assert_eq!(max_message(16), 3 * EAGER_BYTES / 15);
        assert_eq!(max_message(1000), SLOT_PAYLOAD);
        assert!(eligible(Collective::AllGather, 2048, DType::F64, 4));
        assert!(!eligible(Collective::AllGather, 2049, DType::F64, 4));
        assert!(eligible(Collective::Reduce, 4096, DType::F32, 2));
        // Allreduces on 3-16 ranks past one message run in two steps, of
        // any length; gathers never.
        assert!(eligible(Collective::AllReduce, 4097, DType::F32, 3));
        assert!(eligible(Collective::AllReduce, 1 << 17, DType::F32, 16));
        assert!(eligible(Collective::AllReduce, 1 << 30, DType::F32, 3));
        assert!(!eligible(Collective::Gather, 4097, DType::F32, 3));
        // Broadcasts and reduces past one eager buffer are streamed on up
        // to 4 ranks: broadcasts up to 512 KiB, reduces of any length; and
        // allreduces on 2 ranks of any length.
        assert!(eligible(Collective::AllReduce, 4097, DType::F32, 2));
        assert!(eligible(Collective::AllReduce, 1 << 20, DType::F32, 2));
        assert!(eligible(Collective::AllReduce, 1 << 30, DType::F32, 2));
        assert!(eligible(Collective::Reduce, 4097, DType::F32, 2));
        assert!(eligible(Collective::Reduce, 1 << 30, DType::F32, 4));
        assert!(!eligible(Collective::Reduce, 4097, DType::F32, 5));
        assert!(eligible(Collective::Broadcast, 1 << 17, DType::F32, 3));
        assert!(!eligible(
            Collective::Broadcast,
            (1 << 17) + 1,
            DType::F32,
            4
        ));
        assert!(!eligible(Collective::Gather, 4097, DType::F32, 2));
        assert!(eligible(Collective::AllGather, 3276, DType::U8, 16));
        assert!(!eligible(Collective::AllGather, 3277, DType::U8, 16));
        assert!(!eligible(Collective::AllReduce, 2, DType::F32, 1));
        assert!(!eligible(Collective::AllReduce, 2, DType::F32, 17));
        assert!(eligible(Collective::AllToAll, 1, DType::U8, 2));
        assert!(eligible(Collective::ReduceScatter, 4096, DType::F32, 4));
        assert!(!eligible(Collective::ReduceScatter, 4097, DType::F32, 4));
        assert!(!eligible(Collective::AllToAllV, 1, DType::U8, 2));
        assert!(!eligible(Collective::Gather, 1, DType::U8, 2));
        assert!(!eligible(Collective::AllReduce, usize::MAX, DType::F64, 2));
    }

    #[test]
    fn remote_reads_by_block_size_and_group() {
        use Collective::*;
        // 2 ranks: past 4 KiB blocks up to one eager message, where they
        // start to stream; 3 and 4: past the eager buffers.
        assert!(!reads_remote(AllGather, 4096, 2));
        assert!(reads_remote(AllGather, 4097, 2));
        assert!(reads_remote(AllToAll, EAGER_BYTES, 2));
        assert!(!reads_remote(AllToAll, EAGER_BYTES, 3));
        assert!(reads_remote(AllToAll, EAGER_BYTES + 1, 4));
        for bytes in [
            EAGER_BYTES + 1,
            REMOTE_MAX_CALL_BYTES,
            REMOTE_MAX_CALL_BYTES + 1,
        ] {
            for coll in [AllGather, AllToAll] {
                assert!(!reads_remote(coll, bytes, 2), "{coll} {bytes}");
                let streamed = bytes <= REMOTE_MAX_CALL_BYTES;
                assert_eq!(streams(coll, bytes, 2), streamed, "{coll} {bytes}");
                assert!(!streams(coll, bytes, 3), "{coll} {bytes}");
            }
        }
        // Up to 1 MiB from all peers together.
        assert!(reads_remote(AllGather, REMOTE_MAX_CALL_BYTES / 2, 3));
        assert!(!reads_remote(AllGather, REMOTE_MAX_CALL_BYTES / 2 + 1, 3));
        assert!(reads_remote(AllToAll, REMOTE_MAX_CALL_BYTES / 3, 4));
        assert!(!reads_remote(AllToAll, REMOTE_MAX_CALL_BYTES / 3 + 1, 4));
        // Not the other collectives.
        for coll in [ReduceScatter, AllToAllV, Gather] {
            assert!(!reads_remote(coll, 1 << 16, 2), "{coll}");
        }
        // Reduces on 2 ranks past 32 KiB up to 4 MiB only.
        assert!(!reads_remote(Reduce, REMOTE_REDUCE_FLOOR, 2));
        assert!(reads_remote(Reduce, REMOTE_REDUCE_FLOOR + 1, 2));
        assert!(reads_remote(Reduce, REMOTE_REDUCE_MAX_BYTES, 2));
        assert!(!reads_remote(Reduce, REMOTE_REDUCE_MAX_BYTES + 1, 2));
        assert!(!reads_remote(Reduce, 1 << 16, 3));
        // Broadcasts on 2 ranks past one eager buffer, up to 4 GiB (the
        // address message's count).
        assert!(!reads_remote(Broadcast, max_message(2), 2));
        assert!(reads_remote(Broadcast, max_message(2) + 1, 2));
        assert!(reads_remote(Broadcast, REMOTE_MAX_CALL_BYTES, 2));
        assert!(reads_remote(Broadcast, u32::MAX as usize, 2));
        assert!(!reads_remote(Broadcast, u32::MAX as usize + 1, 2));
        // On 3-4 ranks past 64 KiB up to the streamed parts' limit.
        for n in [3, 4] {
            assert!(!reads_remote(Broadcast, BROADCAST_READ_FLOOR, n));
            assert!(reads_remote(Broadcast, BROADCAST_READ_FLOOR + 1, n));
            assert!(reads_remote(Broadcast, broadcast_stream_bytes(n), n));
            assert!(!reads_remote(Broadcast, broadcast_stream_bytes(n) + 1, n));
        }
        // Never allreduces: on 2 ranks they stream at every length.
        for bytes in [
            max_message(2) + 1,
            4 << 20,
            (4 << 20) + 1,
            u32::MAX as usize,
        ] {
            assert!(!reads_remote(AllReduce, bytes, 2));
            assert!(streams(AllReduce, bytes, 2));
        }
        assert!(!reads_remote(AllReduce, 1 << 18, 3));
        assert!(!streams(AllReduce, 1 << 18, 3));
        // Reduces stream at every length where they do not read memory
        // (remote reads off, or past 4 MiB).
        for bytes in [
            max_message(2) + 1,
            64 << 10,
            (64 << 10) + 1,
            1 << 20,
            8 << 20,
        ] {
            assert!(streams(Reduce, bytes, 2));
            assert!(streams(Reduce, bytes, 4));
        }
        assert!(!reads_remote(AllGather, 1 << 16, 1));
        assert!(!reads_remote(AllGather, 1 << 16, REMOTE_MAX_RANKS + 1));
    }
}
