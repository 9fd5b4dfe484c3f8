//! One rank's buffers: how long its send and receive buffers are for each
//! collective ([`buffer_lens`]), its per-peer counts of an alltoallv call
//! ([`PeerCounts`]), and where the memory lives ([`Buffer`]: heap or a
//! `SharedBuffer`, `--buffers`).

use ferrocoll::Collective;

use crate::error::CliError;
use crate::verify::{self, Sample};

/// Elements of this rank's send and receive buffers for a call of `count`
/// (empty where the library ignores the buffer: the send buffer of non-roots
/// in bcast and scatter, the receive buffer of non-roots in reduce and
/// gather; the sums of this rank's per-peer counts for alltoallv).
pub(crate) fn buffer_lens(
    coll: Collective,
    n: usize,
    rank: usize,
    root: usize,
    count: usize,
) -> (usize, usize) {
    let root_only = |len: usize| if rank == root { len } else { 0 };
    match coll {
        Collective::AllReduce => (count, count),
        Collective::Broadcast => (root_only(count), count),
        Collective::Reduce => (count, root_only(count)),
        Collective::AllGather => (count, n * count),
        Collective::ReduceScatter => (n * count, count),
        Collective::AllToAll => (n * count, n * count),
        Collective::Gather => (count, root_only(n * count)),
        Collective::Scatter => (root_only(n * count), count),
        Collective::AllToAllV => {
            let (send, recv) = verify::alltoallv_counts(n, rank, count);
            (send.iter().sum(), recv.iter().sum())
        }
        Collective::Barrier => (0, 0),
    }
}

/// This rank's per-peer counts of an alltoallv call (empty for the other
/// collectives).
#[derive(Clone, Debug, Default)]
pub(crate) struct PeerCounts {
    /// Elements sent to each peer.
    pub(super) send: Vec<usize>,
    /// Elements received from each peer.
    pub(super) recv: Vec<usize>,
}

impl PeerCounts {
    /// The counts of `rank` in a call of `coll` over `n` ranks with `count`
    /// elements per (average) block.
    pub(super) fn new(coll: Collective, n: usize, rank: usize, count: usize) -> PeerCounts {
        if coll == Collective::AllToAllV {
            let (send, recv) = verify::alltoallv_counts(n, rank, count);
            PeerCounts { send, recv }
        } else {
            PeerCounts::default()
        }
    }
}

/// Where a heap buffer starts: at a page boundary, as the OSU
/// micro-benchmarks align theirs. A `Vec` starts wherever the allocator
/// puts it, and after the start-up's large allocations are freed glibc
/// serves even megabytes from its heap, 16 bytes past a cache line; the
/// peers' benchmarks allocate their buffers first, each then mapped on its
/// own page (16 bytes in, both alike). A send and a receive buffer 16 bytes
/// apart modulo a cache line made the 2-rank allgather's copies (the local
/// one and the kernel's) 10-12 % slower at 512 KiB than the same copies
/// between buffers that start alike (bench/RESULTS.md, seventh session).
const HEAP_ALIGN: usize = 4096;

/// A benchmark buffer: heap memory or a shared buffer.
pub(super) enum Buffer<T: Sample> {
    /// `len` elements of a `Vec` from the first one at a page boundary
    /// (`--buffers heap`).
    Heap {
        vec: Vec<T>,
        start: usize,
        len: usize,
    },
    /// A `ferrocoll::SharedBuffer` (`--buffers shared`).
    Shared(ferrocoll::SharedBuffer<T>),
}

impl<T: Sample> Buffer<T> {
    /// `len` zeros, on the heap or, with `shared`, in a shared buffer.
    pub(super) fn new(len: usize, shared: bool) -> Result<Buffer<T>, CliError> {
        Ok(if shared {
            let mut b = ferrocoll::SharedBuffer::new(len)?;
            b.fill(T::from_small(0));
            Buffer::Shared(b)
        } else {
            // Room for the elements after the first page boundary.
            let spare = HEAP_ALIGN / std::mem::size_of::<T>().max(1);
            let vec = vec![T::from_small(0); len + spare];
            let start = vec.as_ptr().align_offset(HEAP_ALIGN).min(spare);
            Buffer::Heap { vec, start, len }
        })
    }
}

impl<T: Sample> std::ops::Deref for Buffer<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match self {
            Buffer::Heap { vec, start, len } => &vec[*start..*start + *len],
            Buffer::Shared(b) => b,
        }
    }
}

impl<T: Sample> std::ops::DerefMut for Buffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match self {
            Buffer::Heap { vec, start, len } => &mut vec[*start..*start + *len],
            Buffer::Shared(b) => b,
        }
    }
}
