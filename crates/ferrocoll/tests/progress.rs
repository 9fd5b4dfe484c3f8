//! The progress worker and persistent collectives (issue 16, items 1-2):
//! many requests in flight, calls issued while others run on other threads,
//! errors that must not wedge the worker, dropped requests, `test`,
//! `wait_all` and `wait_any`, and persistent calls equal to the plain ones.
//!
//! The test that counts threads is in `progress_threads.rs`: it needs a
//! process of its own (tests of one binary run side by side).

use std::time::{Duration, Instant};

use ferrocoll::{
    local, Algorithm, CallOptions, Communicator, Config, Element, Error, Persistent, ReduceOp,
    Request,
};

fn cfg() -> Config {
    // A hang shows as a failure within seconds, not after the default 300 s.
    Config::default().with_timeout(Duration::from_secs(60))
}

#[test]
fn ten_thousand_requests_in_flight_on_four_ranks_complete_correctly() {
    const CALLS: u64 = 10_000;
    let out = local::run_with(4, cfg(), |comm| {
        let r = comm.rank() as u64;
        // Lengths 1 to 3 (all on the small-call path where there is one).
        let reqs: Vec<Request<Vec<u64>>> = (0..CALLS)
            .map(|i| comm.iall_reduce(vec![r * CALLS + i; 1 + (i % 3) as usize], ReduceOp::Sum))
            .collect();
        Request::wait_all(reqs)
    })
    .unwrap();
    for (rank, results) in out.into_iter().enumerate() {
        let results = results.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        assert_eq!(results.len(), CALLS as usize);
        for (i, got) in results.iter().enumerate() {
            let i = i as u64;
            // Sum over ranks r of r * CALLS + i.
            let want = 6 * CALLS + 4 * i;
            assert_eq!(
                got,
                &vec![want; 1 + (i % 3) as usize],
                "rank {rank} call {i}"
            );
        }
    }
}

#[test]
fn calls_issued_while_earlier_ones_run_on_other_threads_stay_correct() {
    let out = local::run_with(3, cfg(), |comm| {
        let r = comm.rank() as u32;
        let n = comm.size() as u32;
        // A large call on the worker...
        let big = comm.iall_reduce(vec![r + 1; 1 << 20], ReduceOp::Sum);
        // ... and one reserved now and run on a thread of this rank's own,
        // while this thread goes on issuing.
        let reserved = comm.reserve_next_call();
        std::thread::scope(|s| {
            let side = s.spawn(move || {
                let mut v = vec![r; 300_000];
                reserved.all_reduce_in_place(&mut v, ReduceOp::Max)?;
                Ok::<_, Error>(v)
            });
            let small = comm.iall_reduce(vec![r; 2], ReduceOp::Sum);
            let mut blocking = [r * 10];
            comm.all_reduce_in_place(&mut blocking, ReduceOp::Sum)?;
            let bcast = comm.ibroadcast(vec![r; 50_000], 1);
            let mut p = comm.all_gather_init(vec![r; 5])?;
            let started = p.start()?;
            let gathered_plain = {
                let mut g = vec![0u32; 5 * n as usize];
                comm.all_gather(&[r; 5], &mut g)?;
                g
            };
            started.wait()?;
            assert_eq!(p.recv(), &gathered_plain[..]);
            let side = side.join().unwrap()?;
            assert!(side.iter().all(|x| *x == n - 1));
            assert_eq!(blocking, [30]);
            assert_eq!(small.wait()?, vec![3, 3]);
            assert!(bcast.wait()?.iter().all(|x| *x == 1));
            let big = big.wait()?;
            assert!(big.iter().all(|x| *x == 6));
            Ok::<_, Error>(())
        })
    })
    .unwrap();
    for (rank, r) in out.into_iter().enumerate() {
        r.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
    }
}

#[test]
fn an_error_in_a_queued_call_comes_back_from_wait_and_later_calls_still_run() {
    let out = local::run_with(3, cfg(), |comm| {
        let r = comm.rank() as i64;
        let before = comm.iall_reduce(vec![r; 4], ReduceOp::Sum);
        // Fails on the worker, in choice (allreduce has no dissemination
        // algorithm): the same error as from the blocking form.
        let forced = comm.with_options(CallOptions::algorithm(Algorithm::Dissemination));
        let failing = forced.iall_reduce(vec![r; 4], ReduceOp::Sum);
        let after = comm.iall_reduce(vec![r; 4], ReduceOp::Max);
        // Barriers have dissemination: this one runs, on this thread,
        // while the worker handles the calls above.
        let mut p = forced.barrier_init()?;
        p.run()?;
        Ok::<_, Error>((
            before.wait(),
            failing.wait().map(|_| ()),
            after.wait(),
            forced
                .all_reduce_init(vec![r; 4], ReduceOp::Sum)
                .map(|_| ()),
        ))
    })
    .unwrap();
    for (rank, (before, failing, after, init)) in out.into_iter().map(Result::unwrap).enumerate() {
        assert_eq!(before.unwrap(), vec![3; 4], "rank {rank}");
        let e = failing.unwrap_err();
        assert!(
            matches!(e, Error::UnknownAlgorithm { .. }),
            "rank {rank}: {e}"
        );
        assert_eq!(after.unwrap(), vec![2; 4], "rank {rank}");
        // Persistent calls resolve the algorithm at init: the error is there.
        assert!(
            matches!(init, Err(Error::UnknownAlgorithm { .. })),
            "{init:?}"
        );
    }
}

#[test]
fn a_mismatch_on_the_worker_fails_that_request_and_does_not_wedge_the_worker() {
    let config = cfg().with_timeout(Duration::from_secs(5));
    let out = local::run_with(2, config, |comm| {
        let tree = comm.with_options(CallOptions::algorithm(Algorithm::Tree));
        // Different counts on the two ranks: a mismatch on both sides.
        let bad = tree.iall_reduce(vec![1i32; 4 + comm.rank()], ReduceOp::Sum);
        let next = comm.iall_reduce(vec![1i32; 4], ReduceOp::Sum);
        let start = Instant::now();
        let bad = bad.wait();
        // Whatever the transport makes of the call after a mismatch, the
        // worker gets to it and its request completes.
        let next = next.wait();
        (bad, next, start.elapsed())
    })
    .unwrap();
    for (bad, next, took) in out {
        assert!(matches!(bad, Err(Error::Mismatch { .. })), "{bad:?}");
        if let Ok(v) = next {
            assert_eq!(v, vec![2; 4]);
        }
        assert!(took < Duration::from_secs(20), "took {took:?}");
    }
}

#[test]
fn dropped_requests_still_run_and_do_not_hang_the_worker() {
    let out = local::run_with(4, cfg(), |comm| {
        let r = comm.rank() as u64;
        for i in 0..200u64 {
            // Never waited: each still runs on the worker, so the calls
            // behind them (and on the other ranks) still match.
            drop(comm.iall_reduce(vec![i + r; 1 + (i as usize % 5) * 100], ReduceOp::Sum));
        }
        let last = comm.iall_reduce(vec![r; 3], ReduceOp::Sum);
        let mut blocking = [r];
        comm.all_reduce_in_place(&mut blocking, ReduceOp::Max)?;
        Ok::<_, Error>((last.wait()?, blocking[0]))
    })
    .unwrap();
    for r in out {
        assert_eq!(r.unwrap(), (vec![6; 3], 3));
    }
}

#[test]
fn test_returns_the_result_once_and_wait_any_hands_out_each_request_once() {
    let out = local::run_with(3, cfg(), |comm| {
        let r = comm.rank() as u32;
        let mut req = comm.iall_reduce(vec![r; 8], ReduceOp::Sum);
        let got = loop {
            if let Some(result) = req.test() {
                break result?;
            }
            std::thread::yield_now();
        };
        assert_eq!(got, vec![3; 8]);
        assert!(req.is_complete());
        assert!(matches!(req.test(), Some(Err(Error::InvalidArgument(_)))));

        let mut reqs: Vec<_> = (0..20u32)
            .map(|i| comm.iall_reduce(vec![i * 3 + r], ReduceOp::Sum))
            .collect();
        let mut seen = [false; 20];
        while let Some((i, result)) = Request::wait_any(&mut reqs) {
            assert!(!seen[i], "request {i} handed out twice");
            seen[i] = true;
            assert_eq!(result?, vec![9 * i as u32 + 3]);
        }
        assert!(seen.iter().all(|s| *s));
        Ok::<_, Error>(())
    })
    .unwrap();
    for r in out {
        r.unwrap();
    }
}

#[test]
fn clones_share_one_worker_and_split_groups_get_their_own() {
    let out = local::run_with(4, cfg(), |comm| {
        let r = comm.rank() as u64;
        let clone = comm.clone();
        let a = comm.iall_reduce(vec![r], ReduceOp::Sum);
        let b = clone.iall_reduce(vec![1], ReduceOp::Sum);
        let half = comm.split(Some((comm.rank() % 2) as u32), 0)?.unwrap();
        let c = half.iall_reduce(vec![r], ReduceOp::Sum);
        let d = comm.iall_reduce(vec![2], ReduceOp::Sum);
        Ok::<_, Error>((a.wait()?[0], b.wait()?[0], c.wait()?[0], d.wait()?[0]))
    })
    .unwrap();
    for (rank, r) in out.into_iter().enumerate() {
        let same_parity = if rank % 2 == 0 { 2 } else { 4 };
        assert_eq!(r.unwrap(), (6, 4, same_parity, 8));
    }
}

// ---- persistent collectives -------------------------------------------

/// Rank `rank`'s input for run `k`, element `i`.
fn value(rank: usize, k: usize, i: usize) -> i64 {
    (rank as i64 * 1_000_003 + i as i64 * 7 + k as i64 * 31) % 1_000_000_007
}

/// Runs `p` three times (start/wait with a plain call in between, run,
/// start/wait) on fresh inputs and compares each output with `plain` over
/// the same input.
fn agrees<T: Element>(
    what: &str,
    comm: &Communicator,
    mut p: Persistent<T>,
    input: impl Fn(usize, usize) -> T,
    plain: impl Fn(&[T]) -> ferrocoll::Result<Vec<T>>,
) -> ferrocoll::Result<()> {
    for k in 0..3 {
        for (i, x) in p.send_mut().iter_mut().enumerate() {
            *x = input(k, i);
        }
        let sent = p.send().to_vec();
        let want = if k == 1 {
            p.run()?;
            plain(&sent)?
        } else {
            // The plain call runs while the persistent one is in flight
            // (on the worker), under the next sequence number.
            let started = p.start()?;
            let want = plain(&sent)?;
            started.wait()?;
            want
        };
        assert_eq!(
            p.recv(),
            &want[..],
            "{what}: rank {} of {}, run {k}",
            comm.rank(),
            comm.size()
        );
    }
    Ok(())
}

fn persistent_matrix(comm: &Communicator, len: usize) -> ferrocoll::Result<()> {
    let (n, r) = (comm.size(), comm.rank());
    let v = move |k: usize, i: usize| value(r, k, i);
    let tag = |c: &str| format!("{c} of {len}");

    for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max] {
        agrees(
            &tag(&format!("all_reduce {op:?}")),
            comm,
            comm.all_reduce_init(vec![0i64; len], op)?,
            v,
            |s| {
                let mut b = s.to_vec();
                comm.all_reduce_in_place(&mut b, op)?;
                Ok(b)
            },
        )?;
    }
    let root = n - 1;
    agrees(
        &tag("broadcast"),
        comm,
        comm.broadcast_init(vec![0i64; len], root)?,
        v,
        |s| {
            let mut b = s.to_vec();
            comm.broadcast_in_place(&mut b, root)?;
            Ok(b)
        },
    )?;
    let root = n / 2;
    agrees(
        &tag("reduce"),
        comm,
        comm.reduce_init(vec![0i64; len], ReduceOp::Sum, root)?,
        v,
        |s| {
            let mut b = s.to_vec();
            comm.reduce_in_place(&mut b, ReduceOp::Sum, root)?;
            Ok(b)
        },
    )?;
    agrees(
        &tag("all_gather"),
        comm,
        comm.all_gather_init(vec![0i64; len])?,
        v,
        |s| {
            let mut out = vec![0i64; n * len];
            comm.all_gather(s, &mut out)?;
            Ok(out)
        },
    )?;
    for op in [ReduceOp::Sum, ReduceOp::Avg] {
        agrees(
            &tag(&format!("reduce_scatter {op:?}")),
            comm,
            comm.reduce_scatter_init(vec![0i64; n * len], op)?,
            v,
            |s| {
                let mut out = vec![0i64; len];
                comm.reduce_scatter(s, &mut out, op)?;
                Ok(out)
            },
        )?;
    }
    agrees(
        &tag("all_to_all"),
        comm,
        comm.all_to_all_init(vec![0i64; n * len])?,
        v,
        |s| {
            let mut out = vec![0i64; n * len];
            comm.all_to_all(s, &mut out)?;
            Ok(out)
        },
    )?;
    agrees(
        &tag("gather"),
        comm,
        comm.gather_init(vec![0i64; len], 0)?,
        v,
        |s| {
            let mut out = vec![0i64; if r == 0 { n * len } else { 0 }];
            comm.gather(s, &mut out, 0)?;
            Ok(out)
        },
    )?;
    agrees(
        &tag("scatter"),
        comm,
        comm.scatter_init(vec![0i64; n * len], len, 0)?,
        v,
        |s| {
            let mut out = vec![0i64; len];
            comm.scatter(s, &mut out, 0)?;
            Ok(out)
        },
    )?;
    let mut b = comm.barrier_init()?;
    b.start()?.wait()?;
    b.run()?;
    Ok(())
}

#[test]
fn persistent_collectives_equal_the_plain_calls() {
    for n in [1, 2, 3, 5] {
        let out = local::run_with(n, cfg(), |comm| {
            for len in [0, 1, 1000, 100_003] {
                persistent_matrix(&comm, len)?;
            }
            Ok::<_, Error>(())
        })
        .unwrap();
        for (rank, r) in out.into_iter().enumerate() {
            r.unwrap_or_else(|e| panic!("{n} ranks, rank {rank}: {e}"));
        }
    }
}

#[test]
fn persistent_calls_keep_the_forced_algorithm_and_interleave_with_others() {
    let out = local::run_with(4, cfg(), |comm| {
        let r = comm.rank() as u64;
        let ring = comm.with_options(CallOptions::algorithm(Algorithm::Ring));
        let mut p = ring.all_reduce_init(vec![0u64; 4096], ReduceOp::Sum)?;
        assert_eq!(p.algorithm(), Some(Algorithm::Ring));
        let mut q = comm.broadcast_init(vec![0u64; 10], 2)?;
        for step in 0..50u64 {
            p.send_mut().fill(r + step);
            q.send_mut().fill(if r == 2 { step } else { 99 });
            // Two persistent calls and a non-blocking one in flight at once,
            // waited in another order than started.
            let before = comm.iall_reduce(vec![step], ReduceOp::Max);
            let sp = p.start()?;
            let mut plain = [r];
            comm.all_reduce_in_place(&mut plain, ReduceOp::Sum)?;
            sp.wait()?;
            let sq = q.start()?;
            assert_eq!(before.wait()?, vec![step]);
            sq.wait()?;
            assert_eq!(plain, [6]);
            assert!(p.recv().iter().all(|x| *x == 6 + 4 * step), "step {step}");
            assert!(q.recv().iter().all(|x| *x == step), "step {step}");
        }
        // A started run that is dropped is waited for (the buffers are back),
        // a forgotten one is settled by the next start.
        p.send_mut().fill(1);
        drop(p.start()?);
        assert_eq!(p.recv()[0], 4);
        std::mem::forget(p.start()?);
        p.run()?;
        assert_eq!(p.recv()[0], 64);
        let (send, recv) = p.into_buffers();
        assert!(send.is_empty() && recv.len() == 4096);
        Ok::<_, Error>(())
    })
    .unwrap();
    for (rank, r) in out.into_iter().enumerate() {
        r.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
    }
}

#[test]
fn persistent_init_checks_its_arguments() {
    local::run_with(3, cfg(), |comm| {
        let e = comm.broadcast_init(vec![0u8; 4], 3).unwrap_err();
        assert!(e.to_string().contains("root 3 is not a rank"), "{e}");
        let e = comm
            .reduce_scatter_init(vec![0u8; 4], ReduceOp::Sum)
            .unwrap_err();
        assert!(e.to_string().contains("multiple of size()"), "{e}");
        let e = comm.all_to_all_init(vec![0u8; 4]).unwrap_err();
        assert!(e.to_string().contains("multiple of size()"), "{e}");
        if comm.rank() == 0 {
            let e = comm.scatter_init(vec![0u8; 4], 2, 0).unwrap_err();
            assert!(e.to_string().contains("size() times count"), "{e}");
        }
    })
    .unwrap();
}
