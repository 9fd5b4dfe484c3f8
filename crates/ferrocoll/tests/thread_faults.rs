//! The thread transport (`local::run`) behaves like the process transports
//! for faults (point-to-point matching is in `thread_p2p.rs`):
//!
//! 1. a collective mismatch fails every rank at once (the two that
//!    disagree name themselves, a third names the pair), never a timeout;
//! 2. a rank that returns, panics or aborts is noticed at once, and every
//!    rank names the rank that failed first;
//! 3. a point-to-point timeout names its tag, and a timeout says where
//!    every rank is.
//!
//! Tests that expect an error run with a long deadline and assert that the
//! error comes well before it, so a regression fails an assertion instead
//! of hanging until the deadline.

mod thread_common;
use thread_common::{cfg, p2p_sig, timed, DEADLINE, FAST};

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrocoll::transport::thread::ThreadFabric;
use ferrocoll::transport::{CallKind, Header, Incoming, Outgoing, Signature, Sink, Transport};
use ferrocoll::{local, Collective, Config, DType, Error, ReduceOp, Result};

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

// ---- 1. collective mismatches -------------------------------------------

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

// ---- 2. lost ranks -------------------------------------------------------

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

// ---- 3. timeouts ---------------------------------------------------------

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
