//! The thread transport (`local::run`) behaves like the process transports
//! for point-to-point messages and faults:
//!
//! 1. point-to-point messages match by (source, tag) in FIFO order,
//!    whatever their lengths and the collectives around them;
//! 2. a collective mismatch fails every rank at once (the two that
//!    disagree name themselves, a third names the pair), never a timeout;
//! 3. a rank that returns, panics or aborts is noticed at once, and every
//!    rank names the rank that failed first;
//! 4. a point-to-point timeout names its tag.
//!
//! Tests that expect an error run with a long deadline and assert that the
//! error comes well before it, so a regression fails an assertion instead
//! of hanging until the deadline.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrocoll::transport::thread::ThreadFabric;
use ferrocoll::transport::{CallKind, Header, Incoming, Outgoing, Signature, Sink, Transport};
use ferrocoll::{local, Collective, Communicator, Config, DType, Error, ReduceOp, Result};

/// The deadline of every wait in these tests: far beyond what any of them
/// should take.
const DEADLINE: Duration = Duration::from_secs(20);

/// An error that is "immediate" arrives within this (a tenth of the
/// deadline; the transport notices within milliseconds, the rest is slack
/// for a loaded 2-core machine).
const FAST: Duration = Duration::from_secs(2);

fn cfg() -> Config {
    Config::default().with_timeout(DEADLINE)
}

/// Runs `f` on `n` ranks and returns each rank's result with how long `f`
/// took on it.
fn timed<R: Send>(
    n: usize,
    f: impl Fn(&Communicator) -> Result<R> + Sync,
) -> Vec<(Result<R>, Duration)> {
    local::run_with(n, cfg(), |comm| {
        let start = Instant::now();
        let r = f(&comm);
        (r, start.elapsed())
    })
    .unwrap()
}

/// The signature text of a collective call (what mismatch errors quote).
fn sig(
    coll: Collective,
    dtype: DType,
    count: usize,
    op: Option<ReduceOp>,
    root: Option<usize>,
) -> String {
    Signature {
        kind: CallKind::Collective(coll),
        dtype,
        op,
        count,
        root,
    }
    .to_string()
}

/// The signature text of a point-to-point message of `count` elements.
fn p2p_sig(dtype: DType, count: usize) -> String {
    Signature {
        kind: CallKind::PointToPoint,
        dtype,
        op: None,
        count,
        root: None,
    }
    .to_string()
}

/// Checks that every rank failed fast with a mismatch consistent with
/// `calls` (rank r called `calls[r]`): each error names two ranks and their
/// calls as they made them; a rank that is one of the two names itself
/// first; a third rank names the pair the detector found.
fn assert_verdicts(out: &[(Result<()>, Duration)], calls: &[String]) {
    for (r, (res, took)) in out.iter().enumerate() {
        assert!(
            *took < FAST,
            "rank {r} took {took:?} to fail (deadline {DEADLINE:?}): {res:?}"
        );
        match res {
            Err(Error::Mismatch {
                rank: a,
                local,
                peer: b,
                remote,
            }) => {
                let (a, b) = (*a, *b);
                assert_ne!(a, b, "rank {r}: {res:?}");
                assert!(
                    local.starts_with(&calls[a]),
                    "rank {r}: {local} is not rank {a}'s {}",
                    calls[a]
                );
                assert!(
                    remote.starts_with(&calls[b]),
                    "rank {r}: {remote} is not rank {b}'s {}",
                    calls[b]
                );
                if calls[a] == calls[b] {
                    // Same signature: the error says what else differed.
                    assert_ne!(local, remote, "rank {r}: {res:?}");
                }
                if r == a || r == b {
                    assert_eq!(
                        a, r,
                        "rank {r} is one of the pair and names itself: {res:?}"
                    );
                }
            }
            other => panic!("rank {r}: expected a mismatch, got {other:?}"),
        }
    }
}

fn assert_sync<T: Sync + Send>() {}

// ---- 1. point-to-point ---------------------------------------------------

#[test]
fn consecutive_messages_of_different_lengths_match_in_order() {
    let out = timed(2, |comm| {
        if comm.rank() == 0 {
            comm.send(&[7u8; 50], 1, 0)?;
            comm.send(&[8u8; 51], 1, 0)?;
            Ok((vec![], vec![]))
        } else {
            let (mut a, mut b) = (vec![0u8; 50], vec![0u8; 51]);
            comm.recv(&mut a, 0, 0)?;
            comm.recv(&mut b, 0, 0)?;
            Ok((a, b))
        }
    });
    for (r, (res, _)) in out.iter().enumerate() {
        assert!(res.is_ok(), "rank {r}: {res:?}");
    }
    let (a, b) = out[1].0.as_ref().unwrap();
    assert_eq!(a, &vec![7u8; 50]);
    assert_eq!(b, &vec![8u8; 51]);
}

#[test]
fn a_ring_of_sends_whose_lengths_change_call_to_call() {
    assert_sync::<Communicator>();
    const COUNTS: [usize; 4] = [0, 1, 1009, 100_003];
    for n in 2..=7 {
        let out = timed(n, |comm| {
            let (r, n) = (comm.rank(), comm.size());
            let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
            let mut got = Vec::new();
            for (i, &count) in COUNTS.iter().enumerate() {
                let mine: Vec<u32> = (0..count)
                    .map(|k| (r * 1_000_000 + i * 1000 + k) as u32)
                    .collect();
                let mut theirs = vec![u32::MAX; count];
                // Sends are synchronous: send from a second thread of this
                // rank while this one receives.
                std::thread::scope(|s| {
                    let sender = s.spawn(|| comm.send(&mine, next, 3));
                    let received = comm.recv(&mut theirs, prev, 3);
                    sender.join().unwrap().and(received)
                })?;
                got.push(theirs);
            }
            Ok(got)
        });
        for (r, (res, _)) in out.iter().enumerate() {
            let got = res
                .as_ref()
                .unwrap_or_else(|e| panic!("n={n} rank {r}: {e}"));
            let prev = (r + n - 1) % n;
            for (i, &count) in COUNTS.iter().enumerate() {
                let want: Vec<u32> = (0..count)
                    .map(|k| (prev * 1_000_000 + i * 1000 + k) as u32)
                    .collect();
                assert!(
                    got[i] == want,
                    "n={n} rank {r} message {i} ({count} elements) is wrong"
                );
            }
        }
    }
}

#[test]
fn sends_from_several_threads_are_received_by_tag_in_another_order() {
    const TAGS: u32 = 6;
    let out = timed(2, |comm| {
        if comm.rank() == 0 {
            std::thread::scope(|s| {
                let senders: Vec<_> = (0..TAGS)
                    .map(|tag| {
                        s.spawn(move || {
                            let data: Vec<u64> = (0..=u64::from(tag) * 10)
                                .map(|k| k + 100 * u64::from(tag))
                                .collect();
                            comm.send(&data, 1, tag)
                        })
                    })
                    .collect();
                senders.into_iter().try_for_each(|h| h.join().unwrap())
            })?;
            Ok(vec![])
        } else {
            // The reverse of the order the threads most likely post in.
            let mut got = Vec::new();
            for tag in (0..TAGS).rev() {
                let mut buf = vec![0u64; tag as usize * 10 + 1];
                comm.recv(&mut buf, 0, tag)?;
                got.push((tag, buf));
            }
            Ok(got)
        }
    });
    assert!(out[0].0.is_ok(), "{:?}", out[0].0);
    for (tag, buf) in out[1].0.as_ref().unwrap() {
        let want: Vec<u64> = (0..=u64::from(*tag) * 10)
            .map(|k| k + 100 * u64::from(*tag))
            .collect();
        assert_eq!(buf, &want, "tag {tag}");
    }
}

#[test]
fn zero_length_messages_are_messages() {
    let out = timed(3, |comm| match comm.rank() {
        0 => {
            comm.send::<f32>(&[], 1, 1)?;
            comm.send(&[1.5f32], 1, 1)?;
            comm.send::<f32>(&[], 1, 1)?;
            comm.send::<u8>(&[], 2, 9)?;
            Ok(vec![])
        }
        1 => {
            let (mut a, mut b, mut c) = ([0f32; 0], [0f32; 1], [0f32; 0]);
            comm.recv(&mut a, 0, 1)?;
            comm.recv(&mut b, 0, 1)?;
            comm.recv(&mut c, 0, 1)?;
            Ok(b.to_vec())
        }
        _ => {
            comm.recv::<u8>(&mut [], 0, 9)?;
            Ok(vec![])
        }
    });
    for (r, (res, _)) in out.iter().enumerate() {
        assert!(res.is_ok(), "rank {r}: {res:?}");
    }
    assert_eq!(out[1].0.as_ref().unwrap(), &vec![1.5f32]);
}

#[test]
fn point_to_point_does_not_take_collective_sequence_numbers() {
    // Ranks 0 and 1 exchange messages between collectives, rank 2 never
    // does: the collectives still meet.
    let out = timed(3, |comm| {
        let mut sum = [comm.rank() as u64 + 1];
        match comm.rank() {
            0 => {
                for k in 0..3u32 {
                    comm.send(&[k; 4], 1, k)?;
                }
            }
            1 => {
                for k in 0..3u32 {
                    let mut b = [0u32; 4];
                    comm.recv(&mut b, 0, k)?;
                    assert_eq!(b, [k; 4]);
                }
            }
            _ => {}
        }
        comm.barrier()?;
        comm.all_reduce_in_place(&mut sum, ReduceOp::Sum)?;
        if comm.rank() == 1 {
            comm.send(&[5u8], 0, 0)?;
        } else if comm.rank() == 0 {
            let mut b = [0u8];
            comm.recv(&mut b, 1, 0)?;
            assert_eq!(b, [5]);
        }
        comm.all_reduce_in_place(&mut sum, ReduceOp::Sum)?;
        Ok(sum[0])
    });
    for (r, (res, _)) in out.iter().enumerate() {
        assert_eq!(res.as_ref().ok(), Some(&18), "rank {r}: {res:?}");
    }
}

#[test]
fn a_length_mismatch_between_send_and_recv_fails_both_at_once() {
    let out = timed(3, |comm| match comm.rank() {
        0 => comm.send(&[0u8; 50], 1, 4),
        1 => comm.recv(&mut [0u8; 51], 0, 4),
        _ => Ok(()),
    });
    let calls = [p2p_sig(DType::U8, 50), p2p_sig(DType::U8, 51)];
    for r in 0..2 {
        let (res, took) = &out[r];
        assert!(*took < FAST, "rank {r} took {took:?}: {res:?}");
        match res {
            Err(Error::Mismatch {
                rank,
                local,
                peer,
                remote,
            }) => {
                assert_eq!((*rank, *peer), (r, 1 - r), "{res:?}");
                assert!(local.starts_with(&calls[r]), "{local}");
                assert!(remote.starts_with(&calls[1 - r]), "{remote}");
            }
            other => panic!("rank {r}: expected a mismatch, got {other:?}"),
        }
    }
}

#[test]
fn a_type_mismatch_between_send_and_recv_fails_both_at_once() {
    let out = timed(2, |comm| {
        if comm.rank() == 0 {
            comm.send(&[0u32; 4], 1, 0)
        } else {
            comm.recv(&mut [0f32; 4], 0, 0)
        }
    });
    for (r, (res, took)) in out.iter().enumerate() {
        assert!(*took < FAST, "rank {r} took {took:?}");
        assert!(
            matches!(res, Err(Error::Mismatch { rank, peer, .. }) if *rank == r && *peer == 1 - r),
            "rank {r}: {res:?}"
        );
    }
}

// ---- 2. collective mismatches -------------------------------------------

#[test]
fn all_reduce_against_broadcast_fails_every_rank_at_once() {
    let out = timed(3, |comm| {
        let mut v = vec![1.0f32; 8];
        if comm.rank() == 1 {
            comm.broadcast_in_place(&mut v, 0)
        } else {
            comm.all_reduce_in_place(&mut v, ReduceOp::Sum)
        }
    });
    let ar = sig(
        Collective::AllReduce,
        DType::F32,
        8,
        Some(ReduceOp::Sum),
        None,
    );
    let bc = sig(Collective::Broadcast, DType::F32, 8, None, Some(0));
    assert_verdicts(&out, &[ar.clone(), bc, ar]);
}

#[test]
fn different_operators_fail_every_rank_at_once() {
    for n in [2, 3, 5] {
        let out = timed(n, |comm| {
            let op = if comm.rank() == n - 1 {
                ReduceOp::Max
            } else {
                ReduceOp::Sum
            };
            comm.all_reduce_in_place(&mut [1i64; 16], op)?;
            comm.barrier()
        });
        let calls: Vec<String> = (0..n)
            .map(|r| {
                let op = if r == n - 1 {
                    ReduceOp::Max
                } else {
                    ReduceOp::Sum
                };
                sig(Collective::AllReduce, DType::I64, 16, Some(op), None)
            })
            .collect();
        assert_verdicts(&out, &calls);
    }
}

#[test]
fn different_counts_fail_every_rank_at_once() {
    for n in [3, 4] {
        let count = |r: usize| if r == 1 { 5 } else { 4 };
        let out = timed(n, |comm| {
            comm.all_reduce_in_place(&mut vec![1i32; count(comm.rank())], ReduceOp::Sum)?;
            comm.barrier()
        });
        let calls: Vec<String> = (0..n)
            .map(|r| {
                sig(
                    Collective::AllReduce,
                    DType::I32,
                    count(r),
                    Some(ReduceOp::Sum),
                    None,
                )
            })
            .collect();
        assert_verdicts(&out, &calls);
    }
}

#[test]
fn different_roots_fail_every_rank_at_once() {
    // Every rank its own root (everybody only sends), and one rank off.
    let roots: [fn(usize) -> usize; 2] = [|r| r, |r| usize::from(r == 2)];
    for root in roots {
        // A rank whose part of the call was right may finish it before the
        // verdict comes: then its next call fails with it.
        let out = timed(3, |comm| {
            comm.broadcast_in_place(&mut [3i32; 10], root(comm.rank()))?;
            comm.barrier()
        });
        let calls: Vec<String> = (0..3)
            .map(|r| sig(Collective::Broadcast, DType::I32, 10, None, Some(root(r))))
            .collect();
        assert_verdicts(&out, &calls);
    }
}

#[test]
fn reduce_against_broadcast_with_the_same_root_fails_both_at_once() {
    // Neither rank sends to the other: only the calls themselves differ.
    let out = timed(2, |comm| {
        let mut v = [1.0f64; 6];
        if comm.rank() == 0 {
            comm.reduce_in_place(&mut v, ReduceOp::Sum, 0)
        } else {
            comm.broadcast_in_place(&mut v, 0)
        }
    });
    let calls = [
        sig(
            Collective::Reduce,
            DType::F64,
            6,
            Some(ReduceOp::Sum),
            Some(0),
        ),
        sig(Collective::Broadcast, DType::F64, 6, None, Some(0)),
    ];
    assert_verdicts(&out, &calls);
}

#[test]
fn all_to_all_v_counts_that_disagree_fail_every_rank() {
    // Rank 0 sends 2 elements to rank 1, which expects 3; everything else
    // agrees. Rank 2 may finish the call before the verdict comes: then
    // its next call fails with it.
    let out = timed(3, |comm| {
        let r = comm.rank();
        let mut send_counts = vec![1usize; 3];
        let mut recv_counts = vec![1usize; 3];
        if r == 0 {
            send_counts[1] = 2;
        }
        if r == 1 {
            recv_counts[0] = 3;
        }
        let send = vec![r as u32; send_counts.iter().sum()];
        let mut recv = vec![0u32; recv_counts.iter().sum()];
        comm.all_to_all_v(&send, &send_counts, &mut recv, &recv_counts)?;
        comm.barrier()
    });
    let a2av = sig(Collective::AllToAllV, DType::U32, 0, None, None);
    let calls = vec![a2av; 3];
    assert_verdicts(&out, &calls);
    // The pair is ranks 0 and 1, whoever reports it.
    for (r, (res, _)) in out.iter().enumerate() {
        if let Err(Error::Mismatch { rank, peer, .. }) = res {
            let mut pair = [*rank, *peer];
            pair.sort_unstable();
            assert_eq!(pair, [0, 1], "rank {r}: {res:?}");
        }
    }
}

#[test]
fn a_verdict_concerns_only_its_communicator() {
    let out = timed(4, |comm| {
        let half = comm
            .split(Some((comm.rank() / 2) as u32), 0)?
            .expect("every rank has a color");
        let mut v = [1u32; 4];
        let first = if comm.rank() == 1 {
            half.broadcast_in_place(&mut v, 0)
        } else {
            half.all_reduce_in_place(&mut v, ReduceOp::Sum)
        };
        // The other half's calls go on; so do the parent's, on every rank.
        let mut more = Ok(());
        if comm.rank() >= 2 {
            for _ in 0..3 {
                more = more.and(half.all_reduce_in_place(&mut v, ReduceOp::Sum));
            }
        }
        let parent = comm
            .barrier()
            .and(comm.all_reduce_in_place(&mut [1u8], ReduceOp::Sum));
        Ok((first, more, parent))
    });
    for (r, (res, took)) in out.iter().enumerate() {
        assert!(*took < FAST, "rank {r} took {took:?}");
        let (first, more, parent) = res.as_ref().unwrap();
        if r < 2 {
            match first {
                Err(Error::Mismatch { rank, peer, .. }) => assert_eq!((*rank, *peer), (r, 1 - r)),
                other => panic!("rank {r}: expected a mismatch, got {other:?}"),
            }
        } else {
            assert!(
                first.is_ok() && more.is_ok(),
                "rank {r}: {first:?} {more:?}"
            );
        }
        assert!(
            parent.is_ok(),
            "rank {r}: the parent communicator is unaffected: {parent:?}"
        );
    }
}

/// A sink that drops what it gets.
struct Discard;

impl Sink for Discard {
    fn deliver(&mut self, _index: usize, _offset: usize, _chunk: &[u8]) {}
}

#[test]
fn a_verdict_for_a_finished_call_fails_every_later_call() {
    // Straight on the transport, to order things exactly: rank 2 finishes
    // call 0 first (it exchanges nothing in it); then ranks 0 and 1 meet
    // with different calls at that point. Rank 2, already in call 1, fails
    // it, and every later call, with their verdict.
    let fabric = ThreadFabric::new(3);
    let t: Vec<Arc<dyn Transport>> = (0..3)
        .map(|r| Arc::new(fabric.transport(r)) as Arc<dyn Transport>)
        .collect();
    let header = |seq: u64, coll: Collective| Header {
        comm: 0,
        seq,
        sig: Signature {
            kind: CallKind::Collective(coll),
            dtype: DType::U8,
            op: None,
            count: 1,
            root: Some(0),
        },
    };
    let deadline = || Instant::now() + DEADLINE;
    t[2].end_call(&header(0, Collective::Broadcast)).unwrap();
    let (r0, r1, r2) = std::thread::scope(|s| {
        let later = s.spawn(|| {
            // Waits for rank 0 in call 1, which never comes.
            let start = Instant::now();
            let e = t[2].exchange(
                &header(1, Collective::Broadcast),
                &[],
                &[Incoming { peer: 0, len: 1 }],
                &mut Discard,
                deadline(),
            );
            (e, start.elapsed())
        });
        std::thread::sleep(Duration::from_millis(50));
        let a = s.spawn(|| {
            t[0].exchange(
                &header(0, Collective::Broadcast),
                &[Outgoing {
                    peer: 1,
                    data: &[1],
                }],
                &[],
                &mut Discard,
                deadline(),
            )
        });
        let b = s.spawn(|| {
            t[1].exchange(
                &header(0, Collective::Reduce),
                &[],
                &[Incoming { peer: 0, len: 1 }],
                &mut Discard,
                deadline(),
            )
        });
        (a.join().unwrap(), b.join().unwrap(), later.join().unwrap())
    });
    let bc = header(0, Collective::Broadcast).sig.to_string();
    let rd = header(0, Collective::Reduce).sig.to_string();
    assert_eq!(
        r0,
        Err(Error::Mismatch {
            rank: 0,
            local: bc.clone(),
            peer: 1,
            remote: rd.clone()
        })
    );
    assert_eq!(
        r1,
        Err(Error::Mismatch {
            rank: 1,
            local: rd.clone(),
            peer: 0,
            remote: bc.clone()
        })
    );
    let (r2, took) = r2;
    assert!(took < FAST, "rank 2 took {took:?}");
    // The detector (either of the pair) first, then its peer.
    let by_1 = Error::Mismatch {
        rank: 1,
        local: rd.clone(),
        peer: 0,
        remote: bc.clone(),
    };
    let by_0 = Error::Mismatch {
        rank: 0,
        local: bc,
        peer: 1,
        remote: rd,
    };
    let verdict = r2.unwrap_err();
    assert!(verdict == by_1 || verdict == by_0, "{verdict:?}");
    // Sticky: every later call on that communicator fails alike ...
    let e = t[2].exchange(
        &header(2, Collective::Broadcast),
        &[],
        &[],
        &mut Discard,
        deadline(),
    );
    assert_eq!(e, Err(verdict.clone()));
    assert_eq!(
        t[2].end_call(&header(3, Collective::Broadcast)),
        Err(verdict)
    );
    // ... and no call on another communicator.
    let other = Header {
        comm: 99,
        ..header(0, Collective::Broadcast)
    };
    assert_eq!(t[2].end_call(&other), Ok(()));
}

// ---- 3. lost ranks -------------------------------------------------------

/// Whether `res` is `PeerLost` naming `who`.
fn lost(res: &Result<()>, who: usize) -> bool {
    matches!(res, Err(Error::PeerLost { rank }) if *rank == who)
}

#[test]
fn a_rank_that_returns_before_a_collective_is_lost_at_once() {
    for n in [2, 3, 4] {
        let out = timed(n, |comm| {
            if comm.rank() == n - 1 {
                return Ok(());
            }
            comm.all_reduce_in_place(&mut [1.0f32; 100], ReduceOp::Sum)
        });
        for (r, (res, took)) in out.iter().enumerate().take(n - 1) {
            assert!(*took < FAST, "n={n} rank {r} took {took:?}");
            assert!(lost(res, n - 1), "n={n} rank {r}: {res:?}");
        }
    }
}

#[test]
fn every_rank_names_the_rank_that_left_first() {
    // Rank 2 leaves; rank 0 waits on it and leaves after its error; rank 1
    // waits on rank 0 only, and must still name rank 2.
    let out = timed(3, |comm| match comm.rank() {
        0 => comm.recv(&mut [0u8; 4], 2, 0),
        1 => comm.recv(&mut [0u8; 4], 0, 0),
        _ => {
            std::thread::sleep(Duration::from_millis(100));
            Ok(())
        }
    });
    for (r, (res, took)) in out.iter().enumerate().take(2) {
        assert!(*took < FAST, "rank {r} took {took:?}");
        assert!(lost(res, 2), "rank {r}: {res:?}");
    }
    // The same through collectives: ranks 0 and 1 in a barrier.
    let out = timed(3, |comm| {
        if comm.rank() == 2 {
            return Ok(());
        }
        comm.barrier()
    });
    for (r, (res, took)) in out.iter().enumerate().take(2) {
        assert!(*took < FAST, "rank {r} took {took:?}");
        assert!(lost(res, 2), "rank {r}: {res:?}");
    }
}

#[test]
fn a_panicking_rank_is_named_by_every_rank_at_once() {
    let results = std::sync::Mutex::new(Vec::new());
    let run = std::panic::catch_unwind(|| {
        local::run_with(4, cfg(), |comm| {
            if comm.rank() == 1 {
                std::thread::sleep(Duration::from_millis(100));
                panic!("rank 1 fails on purpose");
            }
            let start = Instant::now();
            let r = comm.all_reduce_in_place(&mut [2u8; 3], ReduceOp::Max);
            results
                .lock()
                .unwrap()
                .push((comm.rank(), r, start.elapsed()));
        })
    });
    assert!(run.is_err(), "local::run resumes the panic");
    let results = results.into_inner().unwrap();
    assert_eq!(results.len(), 3);
    for (r, res, took) in results {
        assert!(took < FAST, "rank {r} took {took:?}");
        assert!(lost(&res, 1), "rank {r}: {res:?}");
    }
}

#[test]
fn an_abort_is_noticed_at_once() {
    let out = timed(3, |comm| {
        if comm.rank() == 0 {
            std::thread::sleep(Duration::from_millis(100));
            comm.abort();
            return Ok(());
        }
        comm.barrier()
    });
    for (r, (res, took)) in out.iter().enumerate().skip(1) {
        assert!(*took < FAST, "rank {r} took {took:?}");
        assert_eq!(res, &Err(Error::Aborted), "rank {r}");
    }
}

#[test]
fn ranks_that_finish_early_and_cleanly_are_no_error() {
    // Rank 0 leaves after its part; ranks 1 and 2 go on among themselves,
    // and rank 3 goes on with a clone of its communicator on another
    // thread after its closure returned.
    let out = local::run_with(4, cfg(), |comm| {
        let r = comm.rank();
        let mut late = None;
        let res = (|| {
            comm.all_reduce_in_place(&mut [1u32; 7], ReduceOp::Sum)?;
            match r {
                0 => comm.send(&[1u8, 2, 3], 1, 0)?,
                1 | 2 => {
                    if r == 1 {
                        comm.recv(&mut [0u8; 3], 0, 0)?;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                    let pair = comm.subgroup(&[1, 2], 5)?;
                    for _ in 0..5 {
                        pair.all_reduce_in_place(&mut [1.0f64; 33], ReduceOp::Sum)?;
                    }
                    pair.barrier()?;
                    let g = comm.subgroup(&[1, 2, 3], 6)?;
                    g.barrier()?;
                }
                _ => {
                    let c = comm.clone();
                    late = Some(std::thread::spawn(move || {
                        std::thread::sleep(Duration::from_millis(100));
                        c.subgroup(&[1, 2, 3], 6)?.barrier()
                    }));
                }
            }
            Ok::<_, Error>(())
        })();
        (res, late)
    })
    .unwrap();
    for (r, (res, late)) in out.into_iter().enumerate() {
        assert!(res.is_ok(), "rank {r}: {res:?}");
        if let Some(h) = late {
            let late = h.join().unwrap();
            assert!(late.is_ok(), "rank {r}'s other thread: {late:?}");
        }
    }
}

// ---- 4. timeouts ---------------------------------------------------------

#[test]
fn a_point_to_point_timeout_names_its_tag() {
    let config = Config::default().with_timeout(Duration::from_millis(300));
    let out = local::run_with(2, config, |comm| {
        let start = Instant::now();
        let r = if comm.rank() == 0 {
            comm.recv(&mut [0i8; 3], 1, 42)
        } else {
            comm.send(&[1u64; 2], 0, 7)
        };
        let took = start.elapsed();
        // Stay alive past the other's deadline: a timeout, not a lost rank.
        std::thread::sleep(Duration::from_millis(500));
        (r, took)
    })
    .unwrap();
    for (r, (res, took)) in out.iter().enumerate() {
        assert!(*took < FAST, "rank {r} took {took:?}");
        let (tag, want) = if r == 0 {
            (42, p2p_sig(DType::I8, 3))
        } else {
            (7, p2p_sig(DType::U64, 2))
        };
        match res {
            Err(
                e @ Error::Timeout {
                    collective,
                    seq,
                    rank,
                    peer,
                    ..
                },
            ) => {
                assert_eq!((*seq, *rank, *peer), (tag, r, 1 - r), "{e}");
                assert_eq!(collective, &want);
                let text = e.to_string();
                assert!(text.contains(&format!("tag {tag}")), "{text}");
            }
            other => panic!("rank {r}: expected a timeout, got {other:?}"),
        }
    }
}

#[test]
fn a_receive_from_any_source_takes_every_sender_once() {
    for n in [2, 3, 5] {
        let out = local::run_with(n, cfg(), |comm| {
            let r = comm.rank();
            let mut seen = Vec::new();
            if r == 0 {
                for _ in 1..n {
                    let mut v = [0u32; 4];
                    let src = comm.recv_any(&mut v, 8).unwrap();
                    assert!(v.iter().all(|&x| x as usize == src * 3), "{src}: {v:?}");
                    seen.push(src);
                }
            } else {
                comm.send(&[r as u32 * 3; 4], 0, 8).unwrap();
            }
            comm.barrier().unwrap();
            seen.sort();
            seen
        })
        .unwrap();
        assert_eq!(out[0], (1..n).collect::<Vec<_>>(), "n = {n}");
    }
}

#[test]
fn a_timeout_says_where_every_rank_is() {
    // Rank 2 finishes call #0 and never joins #1; ranks 0 and 1 wait in it.
    let config = Config::default().with_timeout(Duration::from_millis(300));
    let out = local::run_with(3, config, |comm| {
        let mut v = vec![1.0f32; 8];
        comm.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        if comm.rank() == 2 {
            std::thread::sleep(Duration::from_millis(900));
            return String::new();
        }
        match comm.all_reduce_in_place(&mut v, ReduceOp::Sum) {
            Err(e) => e.to_string(),
            Ok(()) => "no error".into(),
        }
    })
    .unwrap();
    let text = &out[0];
    assert!(
        text.contains("where every rank is")
            && text.contains("rank 0: in allreduce(count=8, f32, sum) #1 (this rank, timed out")
            && text.contains("rank 2: in no collective on this communicator; last finished allreduce(count=8, f32, sum) #0"),
        "{text}"
    );
}
