//! The thread transport (`local::run`) behaves like the process transports
//! for point-to-point messages: they match by (source, tag) in FIFO order,
//! whatever their lengths and the collectives around them; a send and a
//! receive that disagree fail both at once; a receive from any source takes
//! every sender once. Faults are in `thread_faults.rs`.
//!
//! Tests that expect an error run with a long deadline and assert that the
//! error comes well before it, so a regression fails an assertion instead
//! of hanging until the deadline.

mod thread_common;
use thread_common::{cfg, p2p_sig, timed, FAST};

use ferrocoll::{local, Communicator, DType, Error, ReduceOp};

/// Compiles only if `T` may be shared between and sent to threads.
fn assert_sync<T: Sync + Send>() {}

// ---- matching by (source, tag) -------------------------------------------

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

// ---- sends and receives that disagree ------------------------------------

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

// ---- any source ----------------------------------------------------------

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
