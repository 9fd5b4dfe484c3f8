//! The fast path end to end: ranks as threads over shared memory (each
//! with its own segment and engine, as processes would have), every
//! collective it has against a naive reference at the size boundaries of
//! the eager buffers, several calls in flight, two communicators at once.

use std::thread;

use super::small::{
    broadcast_stream_bytes, max_message, reads_remote, remote_floor, streams, two_step,
    BROADCAST_READ_FLOOR, PAIR_AHEAD, PAIR_PART_MAX_COUNT, REMOTE_MAX_CALL_BYTES, REMOTE_MAX_RANKS,
    REMOTE_REDUCE_FLOOR, REMOTE_REDUCE_MAX_BYTES, STREAM_MAX_RANKS, TWO_STEP_MAX_RANKS,
};
use super::{all_bits, bits};
use crate::launch::init::tests::world;
use crate::transport::shm::{eager_buffer_bytes, EAGER_BUFFERS, EAGER_BYTES, SLOT_PAYLOAD};
use crate::{bf16, f16, Collective, Communicator, DType, Element, ReduceOp, TransportKind};

/// Element types built from small integers (exact in every type).
trait Small: Element + Copy {
    fn of(v: u32) -> Self;
}
macro_rules! small {
    ($($t:ty => $e:expr),* $(,)?) => {$(
        impl Small for $t {
            fn of(v: u32) -> Self {
                let f: fn(u32) -> $t = $e;
                f(v)
            }
        }
    )*};
}
small!(
    f32 => |v| v as f32, f64 => |v| v as f64, f16 => |v| f16::from_f32(v as f32),
    bf16 => |v| bf16::from_f32(v as f32), i8 => |v| v as i8, i32 => |v| v as i32,
    i64 => |v| v as i64, u8 => |v| v as u8, u32 => |v| v, u64 => |v| v as u64,
);

/// Rank `r`'s element `i`: 1..=3, so that sums of 8 ranks fit every type.
fn value(r: usize, i: usize) -> u32 {
    ((r * 5 + i * 3) % 3 + 1) as u32
}

/// The counts of `T` to try among `n` ranks: empty, uneven, both sides of
/// a slot's payload, 97 bytes, and the last count on the fast path and the
/// first past it (which must take the plans, but for the streamed
/// broadcasts and reduces).
fn counts(n: usize, size: usize) -> Vec<(usize, bool)> {
    let max = max_message(n) / size;
    let mut c = vec![
        (0, true),
        (3, true),
        (SLOT_PAYLOAD / size, true),
        (97usize.div_ceil(size), true),
        (max, true),
        (max + 1, false),
    ];
    c.dedup();
    c
}

/// Allgather (out of place and in place) and all-to-all of `count`
/// elements per block on `comm`, against a reference.
fn exchanges_of<T: Small>(comm: &Communicator, count: usize) {
    let (rank, n) = (comm.rank(), comm.size());
    let name = T::DTYPE;
    let block = |r: usize| (0..count).map(move |i| T::of(value(r, i + 1)));
    let want: Vec<T> = (0..n).flat_map(block).collect();
    let mut out = vec![T::of(0); n * count];
    comm.all_gather(&block(rank).collect::<Vec<_>>(), &mut out)
        .unwrap();
    assert_eq!(out, want, "allgather {name} count {count}");
    let mut buf = vec![T::of(0); n * count];
    buf[rank * count..(rank + 1) * count].copy_from_slice(&block(rank).collect::<Vec<_>>());
    comm.all_gather_in_place(&mut buf).unwrap();
    assert_eq!(buf, want, "allgather in place {name} count {count}");

    // All-to-all: rank s's block d holds value(s * n + d, i), which
    // rank d finds in its block s.
    let cell = |s: usize, d: usize, i: usize| T::of(value(s * n + d, i));
    let send: Vec<T> = (0..n)
        .flat_map(|d| (0..count).map(move |i| cell(rank, d, i)))
        .collect();
    let want: Vec<T> = (0..n)
        .flat_map(|s| (0..count).map(move |i| cell(s, rank, i)))
        .collect();
    let mut out = vec![T::of(0); n * count];
    comm.all_to_all(&send, &mut out).unwrap();
    assert_eq!(out, want, "alltoall {name} count {count} rank {rank}");
}

/// Broadcasts of `count` elements from every root, in place and not,
/// against a reference.
fn broadcasts_of<T: Small>(comm: &Communicator, count: usize) {
    let (rank, n) = (comm.rank(), comm.size());
    for root in 0..n {
        let theirs: Vec<T> = (0..count).map(|i| T::of(value(root + 2, i))).collect();
        let mut buf = if rank == root {
            theirs.clone()
        } else {
            vec![T::of(0); count]
        };
        comm.broadcast_in_place(&mut buf, root).unwrap();
        assert!(
            buf == theirs,
            "bcast in place {} count {count} root {root}",
            T::DTYPE
        );
        let send = if rank == root { &theirs[..] } else { &[] };
        let mut out = vec![T::of(0); count];
        comm.broadcast(send, &mut out, root).unwrap();
        assert!(
            out == theirs,
            "bcast {} count {count} root {root}",
            T::DTYPE
        );
    }
}

/// The reduction by `op` (sum, min or max) of `n` ranks' `count` elements
/// `value(r, i)`.
fn reduced<T: Small>(op: ReduceOp, n: usize, count: usize) -> Vec<T> {
    let column = |i: usize| (0..n).map(move |r| value(r, i));
    (0..count)
        .map(|i| {
            T::of(match op {
                ReduceOp::Sum => column(i).sum(),
                ReduceOp::Min => column(i).min().unwrap(),
                _ => column(i).max().unwrap(),
            })
        })
        .collect()
}

/// Allreduces of `count` elements (sum, min and max; in place and not)
/// against a reference.
fn allreduces_of<T: Small>(comm: &Communicator, count: usize) {
    let (rank, n) = (comm.rank(), comm.size());
    let mine: Vec<T> = (0..count).map(|i| T::of(value(rank, i))).collect();
    for op in [ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max] {
        let want = reduced::<T>(op, n, count);
        let what = format!("{} {op:?} count {count} rank {rank}", T::DTYPE);
        let mut out = vec![T::of(0); count];
        comm.all_reduce(&mine, &mut out, op).unwrap();
        assert!(out == want, "allreduce {what}");
        let mut buf = mine.clone();
        comm.all_reduce_in_place(&mut buf, op).unwrap();
        assert!(buf == want, "allreduce in place {what}");
    }
}

/// Reduces of `count` elements to every root (sum, min and max; in place
/// and not) against a reference.
fn reduces_of<T: Small>(comm: &Communicator, count: usize) {
    let (rank, n) = (comm.rank(), comm.size());
    let mine: Vec<T> = (0..count).map(|i| T::of(value(rank, i))).collect();
    for (root, op) in (0..n).zip(
        [ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max]
            .into_iter()
            .cycle(),
    ) {
        let want = reduced::<T>(op, n, count);
        let what = format!("{} {op:?} count {count} root {root} rank {rank}", T::DTYPE);
        let mut out = vec![T::of(0); if rank == root { count } else { 0 }];
        comm.reduce(&mine, &mut out, op, root).unwrap();
        assert!(rank != root || out == want, "reduce {what}");
        let mut buf = mine.clone();
        comm.reduce_in_place(&mut buf, op, root).unwrap();
        assert!(rank != root || buf == want, "reduce in place {what}");
    }
}

/// Whether the job of `comm` lets large exchanges read the peers' memory
/// (decided at start-up: the kernel may forbid `process_vm_readv`, or make
/// it too slow to pay), as its choice of path for one shows.
fn remote_reads_on(comm: &Communicator) -> bool {
    let n = comm.size();
    // On 2 ranks an all-to-all past one eager message streams either way
    // (and one within it is fast either way): a broadcast past the
    // streamed ones is split, or takes the plans.
    let (coll, count) = if n == 2 {
        (Collective::Broadcast, broadcast_stream_bytes(n) + 1)
    } else {
        (Collective::AllToAll, max_message(n) + 1)
    };
    (2..=REMOTE_MAX_RANKS).contains(&n) && comm.uses_fast_path(coll, count, DType::U8)
}

/// Every fast collective of `T` on `comm` at [`counts`], checked against
/// a reference computed here, and that each size takes the path it should.
fn collectives_of<T: Small>(comm: &Communicator) {
    let (rank, n) = (comm.rank(), comm.size());
    let name = T::DTYPE;
    let remote_on = remote_reads_on(comm);
    for (count, fast) in counts(n, T::DTYPE.size()) {
        for coll in [
            Collective::AllReduce,
            Collective::Reduce,
            Collective::Broadcast,
            Collective::AllGather,
            Collective::AllToAll,
            Collective::ReduceScatter,
        ] {
            let streamed = streams(coll, count * T::DTYPE.size(), n);
            let remote = remote_on && reads_remote(coll, count * T::DTYPE.size(), n);
            // The test world is one host of `n` ranks.
            let split = two_step(coll, count, T::DTYPE.size(), n);
            assert_eq!(
                comm.uses_fast_path(coll, count, T::DTYPE),
                (fast || streamed || remote || split) && n > 1,
                "{coll} {name} count {count} on {n} ranks: fast path?"
            );
        }
        let mine: Vec<T> = (0..count).map(|i| T::of(value(rank, i))).collect();
        for op in [ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max] {
            let want = reduced::<T>(op, n, count);
            let what = format!("{name} {op:?} count {count} n {n} rank {rank}");
            let mut out = vec![T::of(0); count];
            comm.all_reduce(&mine, &mut out, op).unwrap();
            assert_eq!(out, want, "allreduce {what}");
            let mut buf = mine.clone();
            comm.all_reduce_in_place(&mut buf, op).unwrap();
            assert_eq!(buf, want, "allreduce in place {what}");
            let root = (count + op as usize) % n;
            let mut out = vec![T::of(0); if rank == root { count } else { 0 }];
            comm.reduce(&mine, &mut out, op, root).unwrap();
            if rank == root {
                assert_eq!(out, want, "reduce to {root} {what}");
            }
            let mut buf = mine.clone();
            comm.reduce_in_place(&mut buf, op, root).unwrap();
            if rank == root {
                assert_eq!(buf, want, "reduce in place to {root} {what}");
            }
        }
        let root = count % n;
        let theirs: Vec<T> = (0..count).map(|i| T::of(value(root + 1, i))).collect();
        let mut buf = if rank == root {
            theirs.clone()
        } else {
            vec![T::of(0); count]
        };
        comm.broadcast_in_place(&mut buf, root).unwrap();
        assert_eq!(buf, theirs, "bcast {name} count {count} root {root}");
        exchanges_of::<T>(comm, count);
        let cell = |s: usize, d: usize, i: usize| T::of(value(s * n + d, i));
        let send: Vec<T> = (0..n)
            .flat_map(|d| (0..count).map(move |i| cell(rank, d, i)))
            .collect();
        // Reduce-scatter of the same blocks: rank d gets the reduction of
        // every rank's block d, in rank order.
        for op in [ReduceOp::Sum, ReduceOp::Max] {
            let want: Vec<T> = (0..count)
                .map(|i| {
                    let col = (0..n).map(|s| value(s * n + rank, i));
                    T::of(match op {
                        ReduceOp::Sum => col.sum(),
                        _ => col.max().unwrap(),
                    })
                })
                .collect();
            let mut out = vec![T::of(0); count];
            comm.reduce_scatter(&send, &mut out, op).unwrap();
            assert_eq!(
                out, want,
                "reducescatter {op:?} {name} count {count} rank {rank}"
            );
            let mut buf = send.clone();
            comm.reduce_scatter_in_place(&mut buf, op).unwrap();
            assert_eq!(
                &buf[rank * count..(rank + 1) * count],
                &want[..],
                "reducescatter in place {op:?} {name} count {count} rank {rank}"
            );
        }
        comm.barrier().unwrap();
    }
}

#[test]
fn fast_calls_at_every_eager_boundary_on_1_to_8_ranks() {
    for n in 1..=8 {
        world(n, TransportKind::Shm, |comm| {
            collectives_of::<f32>(&comm);
            collectives_of::<f64>(&comm);
            collectives_of::<f16>(&comm);
            collectives_of::<bf16>(&comm);
            collectives_of::<i8>(&comm);
            collectives_of::<i32>(&comm);
            collectives_of::<i64>(&comm);
            collectives_of::<u8>(&comm);
            collectives_of::<u32>(&comm);
            collectives_of::<u64>(&comm);
        });
    }
}

#[test]
fn eager_calls_in_flight_and_on_two_communicators_at_once() {
    for n in [2, 3, 4] {
        world(n, TransportKind::Shm, |comm| {
            let (rank, size) = (comm.rank(), comm.size());
            let len = max_message(size) / 4;
            assert!(comm.uses_fast_path(Collective::AllReduce, len, DType::F32));
            // Non-blocking calls larger than a slot, several in flight (more
            // than there are eager buffers per pair), waited in reverse.
            let reqs: Vec<_> = (0..6)
                .map(|k| comm.iall_reduce(vec![(rank + k) as f32; len], ReduceOp::Sum))
                .collect();
            let mut v = vec![rank as u32 + 1; len / 2];
            comm.all_reduce_in_place(&mut v, ReduceOp::Max).unwrap();
            assert!(v.iter().all(|x| *x == size as u32));
            for (k, r) in reqs.into_iter().enumerate().rev() {
                let want = (0..size).map(|r| (r + k) as f32).sum::<f32>();
                assert!(r.wait().unwrap().iter().all(|x| *x == want), "request {k}");
            }
            // Two communicators, two threads, eager calls on both (each
            // rank's threads read each other's messages out of order).
            let twin = comm.split(Some(0), 0).unwrap().unwrap();
            let other = thread::spawn(move || {
                for i in 0..100u64 {
                    let mut v = vec![i + twin.rank() as u64; 500];
                    twin.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
                    let m = twin.size() as u64;
                    assert!(v.iter().all(|x| *x == i * m + m * (m - 1) / 2), "twin {i}");
                }
            });
            for i in 0..100u64 {
                let mut v = vec![i; 700];
                comm.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
                assert!(v.iter().all(|x| *x == i * size as u64), "world {i}");
                let mut b = vec![rank as u64; 300];
                comm.broadcast_in_place(&mut b, i as usize % size).unwrap();
                assert!(b.iter().all(|x| *x == i % size as u64), "bcast {i}");
            }
            other.join().unwrap();
        });
    }
}

/// The one-pass path (`FastPath::exchange_one_pass`: every call on 2
/// ranks, broadcasts and reduces on 3 and 4) and its detours into the
/// general exchange: one-way calls (a sender runs ahead), calls of two
/// communicators on two threads (each takes the other's messages out of
/// the mailboxes), a non-blocking call in flight, a call on the engine
/// between them, and messages in eager buffers beside ones in slots. Each
/// against the value every rank can compute.
#[test]
fn one_pass_calls_beside_other_calls_and_threads() {
    for n in 2..=4u64 {
        world(n as usize, TransportKind::Shm, move |comm| {
            let rank = comm.rank() as u64;
            assert!(comm.uses_fast_path(Collective::Broadcast, 1, DType::U64));
            // The sum over the ranks of `i + rank`.
            let sum = move |i: u64| n * i + n * (n - 1) / 2;
            let twin = comm.split(Some(0), 0).unwrap().unwrap();
            let other = thread::spawn(move || {
                for i in 0..1000u64 {
                    let root = (i % n) as usize;
                    let mut b = [rank + i; 1];
                    twin.broadcast_in_place(&mut b, root).unwrap();
                    assert_eq!(b[0], root as u64 + i, "twin broadcast {i}");
                    let to = (root + 1) % n as usize;
                    let mut r = vec![i + rank; 64];
                    twin.reduce_in_place(&mut r, ReduceOp::Sum, to).unwrap();
                    if twin.rank() == to {
                        assert!(r.iter().all(|x| *x == sum(i)), "twin reduce {i}");
                    }
                }
            });
            for i in 0..1000u64 {
                let pending =
                    (i % 100 == 0).then(|| comm.iall_reduce(vec![rank + i; 3], ReduceOp::Max));
                let root = (i / 3 % n) as usize;
                let mut b = [rank * 7 + i; 2];
                comm.broadcast_in_place(&mut b, root).unwrap();
                assert_eq!(b, [root as u64 * 7 + i; 2], "broadcast {i}");
                // Past a slot: in an eager buffer.
                let send = [i + rank; 100];
                let mut got = [0u64; 100];
                let out: &mut [u64] = if rank as usize == root {
                    &mut got
                } else {
                    &mut []
                };
                comm.reduce(&send, out, ReduceOp::Sum, root).unwrap();
                if rank as usize == root {
                    assert!(got.iter().all(|x| *x == sum(i)), "reduce {i}");
                }
                let mut a = vec![i + rank; 300];
                comm.all_reduce_in_place(&mut a, ReduceOp::Sum).unwrap();
                assert!(a.iter().all(|x| *x == sum(i)), "allreduce {i}");
                if i % 500 == 0 {
                    // A call on the engine (past the fast path's sizes for
                    // a gather), then the one-pass path again.
                    let block = 2 << 20;
                    assert!(!comm.uses_fast_path(Collective::AllGather, block, DType::U8));
                    let big = vec![rank as u8; block];
                    let mut all = vec![0u8; n as usize * block];
                    comm.all_gather(&big, &mut all).unwrap();
                    for (r, part) in all.chunks(block).enumerate() {
                        assert!(part.iter().all(|x| *x == r as u8), "gather {i}");
                    }
                }
                if let Some(req) = pending {
                    let want = i + n - 1;
                    assert!(
                        req.wait().unwrap().iter().all(|x| *x == want),
                        "iallreduce {i}"
                    );
                }
            }
            other.join().unwrap();
        });
    }
}

/// Broadcasts and reduces streamed in parts ([`streams`]): every root, in
/// place and not, at part boundaries, past the eager buffers a pair has
/// (a sender waits for its receiver mid-call), a loop of them (senders run
/// ahead), and calls of other kinds between them. Each against a
/// reference.
fn streamed_calls<T: Small>(comm: &Communicator) {
    let (rank, n) = (comm.rank(), comm.size());
    let per_part = EAGER_BYTES / T::DTYPE.size();
    let bcast_max = broadcast_stream_bytes(n) / T::DTYPE.size();
    let reduce_counts = [
        per_part + 1,
        2 * per_part,
        2 * per_part + 3,
        EAGER_BUFFERS * per_part,
        (EAGER_BUFFERS + 2) * per_part + 5,
    ];
    for count in reduce_counts {
        assert!(comm.uses_fast_path(Collective::Reduce, count, T::DTYPE));
        let mine: Vec<T> = (0..count).map(|i| T::of(value(rank, i))).collect();
        let want: Vec<T> = (0..count)
            .map(|i| T::of((0..n).map(|r| value(r, i)).sum()))
            .collect();
        for root in 0..n {
            let what = format!("{} count {count} n {n} root {root}", T::DTYPE);
            let mut out = vec![T::of(0); if rank == root { count } else { 0 }];
            comm.reduce(&mine, &mut out, ReduceOp::Sum, root).unwrap();
            if rank == root {
                assert!(out == want, "streamed reduce {what}");
            }
            let mut buf = mine.clone();
            comm.reduce_in_place(&mut buf, ReduceOp::Sum, root).unwrap();
            if rank == root {
                assert!(buf == want, "streamed reduce in place {what}");
            }
        }
    }
    for count in [per_part + 1, 2 * per_part + 3, bcast_max]
        .into_iter()
        .filter(|&c| c <= bcast_max)
    {
        assert!(comm.uses_fast_path(Collective::Broadcast, count, T::DTYPE));
        // Past the streamed limit a broadcast reads the root's memory
        // where the job allows it, else takes the plans (the remote-read
        // tests cover it).
        assert_eq!(
            comm.uses_fast_path(Collective::Broadcast, bcast_max + 1, T::DTYPE),
            n == 2 && remote_reads_on(comm)
        );
        for root in 0..n {
            let theirs: Vec<T> = (0..count).map(|i| T::of(value(root + 1, i))).collect();
            let what = format!("{} count {count} n {n} root {root}", T::DTYPE);
            let mut buf = if rank == root {
                theirs.clone()
            } else {
                vec![T::of(0); count]
            };
            comm.broadcast_in_place(&mut buf, root).unwrap();
            assert!(buf == theirs, "streamed bcast in place {what}");
            let mut out = vec![T::of(0); count];
            comm.broadcast(&theirs, &mut out, root).unwrap();
            assert!(out == theirs, "streamed bcast {what}");
        }
    }
    // A loop: each root's and non-root's calls run ahead of the others
    // by up to a pair's eager buffers, with small calls between.
    let count = 3 * per_part + 1;
    for k in 0..20usize {
        let mine: Vec<T> = (0..count).map(|i| T::of(value(rank + k, i))).collect();
        let root = k % n;
        let mut out = vec![T::of(0); count];
        comm.reduce(&mine, &mut out, ReduceOp::Max, root).unwrap();
        if rank == root {
            let want: Vec<T> = (0..count)
                .map(|i| T::of((0..n).map(|r| value(r + k, i)).max().unwrap()))
                .collect();
            assert!(out == want, "reduce {k} in a loop");
        }
        let mut b = vec![T::of(value(rank, k)); count];
        comm.broadcast_in_place(&mut b, root).unwrap();
        assert!(b.iter().all(|x| *x == T::of(value(root, k))), "bcast {k}");
        if k % 5 == 0 {
            let mut s = [T::of(1)];
            comm.all_reduce_in_place(&mut s, ReduceOp::Sum).unwrap();
            assert!(s[0] == T::of(n as u32));
        }
    }
}

#[test]
fn streamed_broadcasts_and_reduces_on_2_to_4_ranks() {
    for n in 2..=STREAM_MAX_RANKS {
        world(n, TransportKind::Shm, |comm| {
            streamed_calls::<f32>(&comm);
            streamed_calls::<f64>(&comm);
            streamed_calls::<bf16>(&comm);
            streamed_calls::<u8>(&comm);
        });
    }
    // Non-blocking streamed calls in flight together and with blocking
    // ones: the parts of several calls interleave in the same mailboxes.
    for n in [2, 3] {
        world(n, TransportKind::Shm, |comm| {
            let (rank, size) = (comm.rank(), comm.size());
            let count = 2 * EAGER_BYTES / 4 + 7;
            let reqs: Vec<_> = (0..4)
                .map(|k| {
                    let reduce =
                        comm.ireduce(vec![(rank + k) as f32; count], ReduceOp::Sum, k % size);
                    let bcast = comm.ibroadcast(vec![(rank * 10 + k) as f32; count], k % size);
                    (reduce, bcast)
                })
                .collect();
            let mut v = vec![1.0f32; count];
            comm.reduce_in_place(&mut v, ReduceOp::Sum, 0).unwrap();
            if rank == 0 {
                assert!(v.iter().all(|x| *x == size as f32));
            }
            for (k, (reduce, bcast)) in reqs.into_iter().enumerate().rev() {
                let got = reduce.wait().unwrap();
                if rank == k % size {
                    let want = (0..size).map(|r| (r + k) as f32).sum::<f32>();
                    assert!(got.iter().all(|x| *x == want), "ireduce {k}");
                }
                let want = ((k % size) * 10 + k) as f32;
                assert!(
                    bcast.wait().unwrap().iter().all(|x| *x == want),
                    "ibroadcast {k}"
                );
            }
        });
    }
    // Streamed 2-rank allreduces in flight on the progress worker while
    // a blocking one runs on the caller's thread: both calls' parts,
    // each sent ahead, interleave in the one mailbox each way, and each
    // call takes the other's out of its way.
    world(2, TransportKind::Shm, |comm| {
        let rank = comm.rank();
        let part = (eager_buffer_bytes(2) / 4).min(PAIR_PART_MAX_COUNT);
        let count = (PAIR_AHEAD + 2) * part + 5;
        let reqs: Vec<_> = (0..3)
            .map(|k| comm.iall_reduce(vec![(rank + k) as f32; count], ReduceOp::Sum))
            .collect();
        let mine: Vec<f32> = (0..count).map(|i| (i % 1000 + rank) as f32).collect();
        let mut out = vec![0.0f32; count];
        comm.all_reduce(&mine, &mut out, ReduceOp::Sum).unwrap();
        assert!(out
            .iter()
            .enumerate()
            .all(|(i, x)| *x == (2 * (i % 1000) + 1) as f32));
        for (k, req) in reqs.into_iter().enumerate().rev() {
            let want = (1 + 2 * k) as f32;
            assert!(
                req.wait().unwrap().iter().all(|x| *x == want),
                "iall_reduce {k}"
            );
        }
    });
    // Past the largest group streamed, both take the plans.
    world(STREAM_MAX_RANKS + 1, TransportKind::Shm, |comm| {
        let count = EAGER_BYTES / 4 + 1;
        assert!(!comm.uses_fast_path(Collective::Reduce, count, DType::F32));
        assert!(!comm.uses_fast_path(Collective::Broadcast, count, DType::F32));
    });
}

/// A streamed call against a peer's call of another length or kind fails
/// on both sides with a mismatch naming both (no hang).
#[test]
fn streamed_calls_of_different_lengths_are_a_mismatch() {
    let per_part = EAGER_BYTES / 4;
    // Three ranks: on two a broadcast streams two parts at most.
    world(3, TransportKind::Shm, |comm| {
        let rank = comm.rank();
        // 3 parts against 2: the first message's marks differ.
        let count = if rank == 1 {
            2 * per_part
        } else {
            3 * per_part
        };
        let mut buf = vec![1.0f32; count];
        let err = comm.broadcast_in_place(&mut buf, 0);
        if rank == 1 {
            let msg = err.expect_err("a broadcast of other length").to_string();
            assert!(
                msg.contains("mismatch") || msg.contains("Mismatch"),
                "{msg}"
            );
            assert!(msg.contains("3 parts"), "{msg}");
        }
    });
}

/// A streamed 2-rank allreduce against one of another number of parts
/// fails on both ranks with a mismatch, although both sent parts ahead
/// before they looked at the peer's first.
#[test]
fn streamed_allreduces_of_different_lengths_are_a_mismatch() {
    let part = (eager_buffer_bytes(2) / 4).min(PAIR_PART_MAX_COUNT);
    world(2, TransportKind::Shm, |comm| {
        let parts = if comm.rank() == 0 { 3 } else { 2 };
        let mut buf = vec![1.0f32; parts * part];
        let msg = comm
            .all_reduce_in_place(&mut buf, ReduceOp::Sum)
            .expect_err("an allreduce of another length")
            .to_string();
        assert!(msg.to_lowercase().contains("mismatch"), "{msg}");
        // The communicator still works: the next call matches.
        let mut one = vec![1.0f32; 8];
        comm.all_reduce_in_place(&mut one, ReduceOp::Sum).unwrap();
        assert_eq!(one, vec![2.0f32; 8]);
    });
}

/// The counts of `T` whose allreduce among `n` ranks (this host's all)
/// runs in two steps at its lower end and beyond, each with whether it
/// does: one message (not), the first count past it, a count that `n` does
/// not divide, and long ones (spans of several eager buffers, or of
/// several packed counts for bytes; a count `n` divides and one it does
/// not).
fn two_step_counts<T: Small>(n: usize) -> Vec<(usize, bool)> {
    let size = T::DTYPE.size();
    let one = max_message(n) / size;
    let long = (512 << 10) / size;
    vec![
        (one, false),
        (one + 1, true),
        (n * (one / n + 5) + n - 1, true),
        (long - 1, true),
        (long, true),
    ]
}

/// Allreduces in two steps ([`two_step`]) on 3 to 16 ranks, at both ends of
/// their sizes, in place and not, in four types and three operators,
/// against the reference; the counts beside them take the plans (or one
/// message) and are checked too. Then several in flight on the progress
/// worker while blocking ones run, whose two messages per pair lie behind
/// each other's in the mailboxes.
#[test]
fn two_step_allreduces_at_their_boundaries_on_3_to_16_ranks() {
    fn check<T: Small>(comm: &Communicator) {
        let n = comm.size();
        for (count, split) in two_step_counts::<T>(n) {
            assert_eq!(
                two_step(Collective::AllReduce, count, T::DTYPE.size(), n),
                split,
                "{} count {count} on {n} ranks",
                T::DTYPE
            );
            if split {
                assert!(comm.uses_fast_path(Collective::AllReduce, count, T::DTYPE));
            }
            allreduces_of::<T>(comm, count);
        }
    }
    for n in [3, 4, 5, 8, 16] {
        assert!(n <= TWO_STEP_MAX_RANKS);
        world(n, TransportKind::Shm, |comm| {
            check::<f32>(&comm);
            if n <= 8 {
                check::<f64>(&comm);
                check::<bf16>(&comm);
                check::<u8>(&comm);
            }
            let (rank, size) = (comm.rank(), comm.size());
            let (count, _) = two_step_counts::<f32>(size)[2];
            let reqs: Vec<_> = (0..4)
                .map(|k| comm.iall_reduce(vec![(rank + k) as f32; count], ReduceOp::Sum))
                .collect();
            let mut v = vec![rank as f32 + 1.0; count];
            comm.all_reduce_in_place(&mut v, ReduceOp::Max).unwrap();
            assert!(v.iter().all(|x| *x == size as f32));
            for (k, r) in reqs.into_iter().enumerate().rev() {
                let want = (0..size).map(|r| (r + k) as f32).sum::<f32>();
                assert!(r.wait().unwrap().iter().all(|x| *x == want), "request {k}");
            }
        });
    }
}

/// A two-step allreduce against one of another length (both in two steps)
/// fails on every rank with a mismatch, and the next call works: spans of
/// another length, and spans of one length from counts that `n` divides
/// differently (3 x 2000 + 2 and 3 x 2001 + 1: 2002 elements each).
#[test]
fn two_step_allreduces_of_different_lengths_are_a_mismatch() {
    world(3, TransportKind::Shm, |comm| {
        let first = two_step_counts::<f32>(3)[1].0;
        for (mine, theirs) in [(first, first + 3), (3 * 2000 + 2, 3 * 2001 + 1)] {
            let count = if comm.rank() == 1 { theirs } else { mine };
            assert!(comm.uses_fast_path(Collective::AllReduce, count, DType::F32));
            let mut buf = vec![1.0f32; count];
            let msg = comm
                .all_reduce_in_place(&mut buf, ReduceOp::Sum)
                .expect_err("an allreduce of another length")
                .to_string();
            assert!(msg.to_lowercase().contains("mismatch"), "{msg}");
            if mine % 3 != 0 {
                assert!(msg.contains("past equal blocks"), "{msg}");
            }
            let mut one = vec![1.0f32; 8];
            comm.all_reduce_in_place(&mut one, ReduceOp::Sum).unwrap();
            assert_eq!(one, vec![3.0f32; 8]);
        }
    });
}

/// Whether this process may read its own memory with `process_vm_readv`,
/// as the test worlds' ranks (threads of this process) read each other's.
fn remote_reads_allowed() -> bool {
    let probe = [7u8; 16];
    let mut got = [0u8; 16];
    crate::transport::shm::cma_read(std::process::id(), probe.as_ptr() as u64, &mut got).is_ok()
        && got == probe
}

/// The per-block counts of `T` to try around the remote reads among `n`
/// ranks, and whether each reads remotely: the last at [`remote_floor`]
/// and the first past it, the first past the eager buffers, an odd one,
/// the last within [`REMOTE_MAX_CALL_BYTES`] and the first past it (which
/// takes the plans).
fn remote_counts(n: usize, size: usize) -> Vec<(usize, bool)> {
    let floor = remote_floor(n) / size;
    let eager = max_message(n) / size;
    let last = REMOTE_MAX_CALL_BYTES / (n - 1) / size;
    let mut c = vec![
        (floor, false),
        (floor + 1, true),
        (eager + 1, true),
        (3 * eager + 5, true),
        (last, true),
        (last + 1, false),
    ];
    c.dedup();
    c
}

/// Allgathers and all-to-alls past [`remote_floor`] read the peers' memory
/// on 2-4 ranks up to their size limit (on 2 ranks up to one eager
/// message, streamed past it), 2-rank broadcasts past what the
/// fast path streams are split between both ends, and 2-rank allreduces
/// stream at every length whether or not remote reads are on, in every element type
/// tried, in place and not, against a reference; on 5 ranks they take the
/// plans.
#[test]
fn remote_reads_at_their_boundaries_on_2_to_4_ranks() {
    let allowed = remote_reads_allowed();
    for n in 2..=REMOTE_MAX_RANKS {
        world(n, TransportKind::Shm, |comm| {
            let on = remote_reads_on(&comm);
            if !allowed {
                eprintln!("process_vm_readv is not allowed here: remote reads untested");
            }
            assert_eq!(on, allowed, "remote reads on {n} ranks");
            fn each<T: Small>(comm: &Communicator, on: bool) {
                let n = comm.size();
                for (count, remote) in remote_counts(n, T::DTYPE.size()) {
                    // At or below the eager buffers' size an exchange is
                    // fast either way.
                    let eager = count * T::DTYPE.size() <= max_message(n);
                    for coll in [Collective::AllGather, Collective::AllToAll] {
                        // On 2 ranks past it they stream, up to 1 MiB.
                        let streamed = streams(coll, count * T::DTYPE.size(), n);
                        assert_eq!(streamed, n == 2 && !eager && remote);
                        assert_eq!(
                            comm.uses_fast_path(coll, count, T::DTYPE),
                            eager || streamed || (remote && on),
                            "{coll} {} count {count} on {n} ranks",
                            T::DTYPE
                        );
                    }
                    exchanges_of::<T>(comm, count);
                }
                // Broadcasts: on 2 ranks past one eager buffer split
                // between the root's writes and the receiver's reads, of any
                // length (odd ones, past a page and past 1 MiB); on 3 and 4
                // streamed up to 64 KiB, then read from the root's memory
                // up to the streamed parts' limit, then the plans.
                let size = T::DTYPE.size();
                let streamed = broadcast_stream_bytes(n) / size;
                let fast_bcast =
                    |count| comm.uses_fast_path(Collective::Broadcast, count, T::DTYPE);
                let first = max_message(n) / size + 1;
                assert!(fast_bcast(first) && fast_bcast(streamed));
                broadcasts_of::<T>(comm, first);
                if n > 2 {
                    let read = BROADCAST_READ_FLOOR / size;
                    for count in [read, read + 1, (256 << 10) / size + 3, streamed] {
                        let remote = reads_remote(Collective::Broadcast, count * size, n);
                        assert_eq!(remote, count > read, "bcast count {count} on {n} ranks");
                        assert!(fast_bcast(count));
                        broadcasts_of::<T>(comm, count);
                    }
                }
                let mut counts = vec![streamed + 1, streamed + 4096 / size + 3];
                if n == 2 {
                    counts.push((3 << 20) / size + 1);
                }
                for count in counts {
                    assert_eq!(
                        fast_bcast(count),
                        on && n == 2,
                        "bcast count {count} on {n} ranks"
                    );
                    broadcasts_of::<T>(comm, count);
                }
                // Allreduces: on 2 ranks past one eager message streamed at
                // every length, in parts of a large eager buffer (2 local
                // ranks): one part and one element, past the parts sent
                // ahead, and a few MiB, odd; never remote reads.
                let eager = max_message(n) / size;
                let part = (eager_buffer_bytes(n) / size).min(PAIR_PART_MAX_COUNT);
                let past_ahead = (PAIR_AHEAD + 1) * part + 3;
                for count in [
                    eager + 1,
                    4096 + 7,
                    part + 1,
                    past_ahead,
                    (3 << 20) / size + 5,
                ] {
                    let bytes = count * size;
                    let past_eager = count > eager;
                    assert!(streams(Collective::AllReduce, bytes, n) == (n == 2 && past_eager));
                    assert!(!reads_remote(Collective::AllReduce, bytes, n));
                    assert_eq!(
                        comm.uses_fast_path(Collective::AllReduce, count, T::DTYPE),
                        n == 2 || !past_eager || two_step(Collective::AllReduce, count, size, n),
                        "allreduce count {count} on {n} ranks"
                    );
                    if n == 2 || count < (1 << 16) {
                        allreduces_of::<T>(comm, count);
                    }
                }
                // Reduces: on 2 ranks past 32 KiB up to 4 MiB read from
                // memory and split between the two ranks when remote reads
                // are on, else streamed (odd lengths: a chunk and an
                // element past the split, and past one chunk); on 3-4
                // streamed at every length.
                for bytes in [
                    REMOTE_REDUCE_FLOOR + 8,
                    (64 << 10) + 4096,
                    (160 << 10) + 8,
                    REMOTE_MAX_CALL_BYTES,
                    (3 << 20) + 40,
                    REMOTE_REDUCE_MAX_BYTES + 8,
                ] {
                    let count = bytes / size;
                    assert!(comm.uses_fast_path(Collective::Reduce, count, T::DTYPE) == (n <= 4));
                    let remote = n == 2 && bytes <= REMOTE_REDUCE_MAX_BYTES;
                    assert_eq!(reads_remote(Collective::Reduce, count * size, n), remote);
                    if bytes <= REMOTE_REDUCE_MAX_BYTES && (n == 2 || bytes < (1 << 20)) {
                        reduces_of::<T>(comm, count);
                    }
                }
                // Other collectives of those sizes keep their paths.
                let count = max_message(n) / T::DTYPE.size() + 1;
                assert!(!comm.uses_fast_path(Collective::ReduceScatter, count, T::DTYPE));
            }
            each::<f32>(&comm, on);
            each::<bf16>(&comm, on);
            each::<u8>(&comm, on);
            each::<f64>(&comm, on);
        });
    }
    world(REMOTE_MAX_RANKS + 1, TransportKind::Shm, |comm| {
        let count = max_message(comm.size()) / 4 + 1;
        assert!(!comm.uses_fast_path(Collective::AllGather, count, DType::F32));
        assert!(!comm.uses_fast_path(Collective::AllToAll, count, DType::F32));
        exchanges_of::<f32>(&comm, count);
        assert!(!comm.uses_fast_path(Collective::Broadcast, count, DType::F32));
    });
}

/// Remote reads with other calls in flight: non-blocking allgathers
/// waited in reverse, and a second communicator's all-to-alls and
/// broadcasts on another thread at the same time (a rank's calls find each other's messages at
/// the heads of the mailboxes and take them out, reading the sender's
/// memory before consuming them).
#[test]
fn remote_reads_in_flight_and_on_two_communicators_at_once() {
    if !remote_reads_allowed() {
        eprintln!("process_vm_readv is not allowed here: test skipped");
        return;
    }
    for n in [2, 3] {
        world(n, TransportKind::Shm, |comm| {
            let (rank, size) = (comm.rank(), comm.size());
            let count = 3 * EAGER_BYTES / 4 + 11;
            assert!(comm.uses_fast_path(Collective::AllGather, count, DType::F32));
            let reqs: Vec<_> = (0..4)
                .map(|k| comm.iall_gather(vec![(rank * 10 + k) as f32; count]))
                .collect();
            let twin = comm.split(Some(0), 0).unwrap().unwrap();
            let other = thread::spawn(move || {
                let (r, m) = (twin.rank(), twin.size());
                for i in 0..400u64 {
                    let send: Vec<u64> = (0..m * count)
                        .map(|j| i + (r * m + j / count) as u64)
                        .collect();
                    let mut out = vec![0u64; m * count];
                    twin.all_to_all(&send, &mut out).unwrap();
                    for (s, block) in out.chunks(count).enumerate() {
                        assert!(
                            block.iter().all(|x| *x == i + (s * m + r) as u64),
                            "twin {i}"
                        );
                    }
                    // On 2 ranks split between root and receiver.
                    let root = i as usize % m;
                    let mut b = vec![(r * 7) as u64 + i; count];
                    twin.broadcast_in_place(&mut b, root).unwrap();
                    assert!(
                        b.iter().all(|x| *x == (root * 7) as u64 + i),
                        "twin bcast {i}"
                    );
                }
            });
            for i in 0..400usize {
                let mut out = vec![0.0f32; size * count];
                comm.all_gather(&vec![(rank + i) as f32; count], &mut out)
                    .unwrap();
                for (s, block) in out.chunks(count).enumerate() {
                    assert!(block.iter().all(|x| *x == (s + i) as f32), "world {i}");
                }
            }
            other.join().unwrap();
            for (k, r) in reqs.into_iter().enumerate().rev() {
                let got = r.wait().unwrap();
                for (s, block) in got.chunks(count).enumerate() {
                    assert!(
                        block.iter().all(|x| *x == (s * 10 + k) as f32),
                        "request {k}"
                    );
                }
            }
        });
    }
}

/// A 2-rank broadcast split between its ends whose first message (an
/// address) lies at the head of a mailbox while the other rank runs
/// another call, which takes it out; the broadcast then finds it among the
/// messages taken out. Once with the root's message taken out, once with
/// the receiver's.
#[test]
fn split_broadcast_messages_taken_out_for_another_call() {
    if !remote_reads_allowed() {
        eprintln!("process_vm_readv is not allowed here: test skipped");
        return;
    }
    for early in [0, 1] {
        world(2, TransportKind::Shm, |comm| {
            let rank = comm.rank();
            let count = broadcast_stream_bytes(2) / 4 * 3 + 5;
            assert!(comm.uses_fast_path(Collective::Broadcast, count, DType::F32));
            let twin = comm.split(Some(0), 0).unwrap().unwrap();
            let bcast = move || {
                let mut b = vec![rank as f32 + 1.0; count];
                twin.broadcast_in_place(&mut b, 0).unwrap();
                assert!(
                    b.iter().all(|x| *x == 1.0),
                    "bcast, rank {rank} early {early}"
                );
            };
            let gather = || {
                let mut out = vec![0.0f32; 2 * count];
                comm.all_gather(&vec![rank as f32; count], &mut out)
                    .unwrap();
                assert!(out[..count].iter().all(|x| *x == 0.0));
                assert!(out[count..].iter().all(|x| *x == 1.0));
            };
            if rank == early {
                // This rank's broadcast message goes out first; the peer,
                // in its allgather, finds it in the way.
                let t = thread::spawn(bcast);
                thread::sleep(std::time::Duration::from_millis(50));
                gather();
                t.join().unwrap();
            } else {
                gather();
                bcast();
            }
        });
    }
}

/// A remote-read allgather against a peer's of another length, or one
/// that takes the plans, fails with a mismatch (no hang, no wrong data).
#[test]
fn remote_reads_of_other_lengths_are_a_mismatch() {
    if !remote_reads_allowed() {
        eprintln!("process_vm_readv is not allowed here: test skipped");
        return;
    }
    let first = max_message(2) / 4 + 1;
    let past = REMOTE_MAX_CALL_BYTES / 4 + 1;
    // A broadcast split between its ends against one of another length.
    let bcast = broadcast_stream_bytes(2) / 4;
    world(2, TransportKind::Shm, |comm| {
        let count = if comm.rank() == 1 { bcast } else { bcast + 1 };
        let mut buf = vec![1.0f32; count];
        let err = comm.broadcast_in_place(&mut buf, 0);
        let msg = err.expect_err("a broadcast of another length").to_string();
        assert!(
            msg.to_lowercase().contains("mismatch"),
            "rank {}: {msg}",
            comm.rank()
        );
    });
    for theirs in [first + 1, past] {
        world(2, TransportKind::Shm, |comm| {
            let rank = comm.rank();
            let count = if rank == 1 { theirs } else { first };
            let mut out = vec![0.0f32; 2 * count];
            let err = comm.all_gather(&vec![1.0f32; count], &mut out);
            let msg = err.expect_err("an allgather of another length").to_string();
            assert!(
                msg.to_lowercase().contains("mismatch"),
                "rank {rank}: {msg}"
            );
        });
    }
}

#[test]
fn bit_iteration() {
    assert_eq!(bits(0b1011).collect::<Vec<_>>(), vec![0, 1, 3]);
    assert_eq!(all_bits(3), 0b111);
    assert_eq!(bits(all_bits(0)).count(), 0);
}
