//! The API around the collectives: user errors, non-blocking requests,
//! split, point-to-point, algorithm selection, mismatches, timeouts and lost
//! peers.

use std::time::{Duration, Instant};

use ferrocoll::{local, Algorithm, CallOptions, Collective, Config, Error, ReduceOp};

fn cfg() -> Config {
    Config::default()
}

#[test]
fn user_mistakes_are_errors_that_say_what_to_fix() {
    local::run_with(3, cfg(), |comm| {
        let mut out = vec![0.0f32; 4];
        let e = comm
            .all_reduce(&[1.0f32; 5], &mut out, ReduceOp::Sum)
            .unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)));
        assert!(
            e.to_string()
                .contains("recv has 4 elements but must have 5"),
            "{e}"
        );

        let e = comm.broadcast_in_place(&mut out, 3).unwrap_err();
        assert!(e.to_string().contains("root 3 is not a rank"), "{e}");

        let mut g = vec![0i32; 5];
        let e = comm.all_gather(&[1i32, 2], &mut g).unwrap_err();
        assert!(e.to_string().contains("size() times"), "{e}");

        let e = comm.all_to_all(&[1u8; 4], &mut [0u8; 4]).unwrap_err();
        assert!(e.to_string().contains("multiple of size()"), "{e}");

        let e = comm
            .all_to_all_v(&[1u8; 3], &[1, 1], &mut [0u8; 3], &[1, 1, 1])
            .unwrap_err();
        assert!(e.to_string().contains("one per rank"), "{e}");

        let e = comm.send(&[1u8], 7, 0).unwrap_err();
        assert!(e.to_string().contains("peer 7"), "{e}");
        let e = comm.send(&[1u8], comm.rank(), 0).unwrap_err();
        assert!(e.to_string().contains("itself"), "{e}");

        let forced = comm.with_options(CallOptions::algorithm(Algorithm::Dissemination));
        let e = forced
            .all_reduce_in_place(&mut out, ReduceOp::Sum)
            .unwrap_err();
        assert!(matches!(e, Error::UnknownAlgorithm { .. }), "{e}");
        assert!(e.to_string().contains("ring"), "lists the valid names: {e}");
    })
    .unwrap();
    assert!(local::run_with(0, cfg(), |_| ()).is_err());
}

#[test]
fn non_blocking_calls_hand_buffers_back_and_overlap() {
    let out = local::run_with(4, cfg(), |comm| {
        let r = comm.rank() as i64;
        // Several outstanding calls at once, waited in reverse order.
        let a = comm.iall_reduce(vec![r; 1000], ReduceOp::Sum);
        let b = comm.iall_gather(vec![r; 3]);
        let c = comm.ibroadcast(vec![r; 10], 2);
        let d = comm.ibarrier();
        // A blocking call while the others are in flight.
        let mut x = vec![1i64; 7];
        comm.all_reduce_in_place(&mut x, ReduceOp::Max).unwrap();
        d.wait().unwrap();
        let c = c.wait().unwrap();
        while !b.is_complete() {
            std::thread::yield_now();
        }
        let b = b.wait().unwrap();
        let a = a.wait().unwrap();
        let e = comm
            .ireduce_scatter(vec![1i64; 8], ReduceOp::Sum)
            .wait()
            .unwrap();
        let f = comm.igather(vec![r], 0).wait().unwrap();
        let g = comm.iscatter(vec![5i64, 6, 7, 8], 1, 3).wait().unwrap();
        let h = comm
            .iall_to_all((0..4).map(|p| r * 10 + p).collect())
            .wait()
            .unwrap();
        let i = comm.ireduce(vec![r; 2], ReduceOp::Sum, 1).wait().unwrap();
        (a[999], b, c[0], x[0], e, f, g, h, i)
    })
    .unwrap();
    for (rank, (a, b, c, x, e, f, g, h, i)) in out.into_iter().enumerate() {
        assert_eq!(a, 6);
        assert_eq!(b, vec![0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]);
        assert_eq!(c, 2);
        assert_eq!(x, 1);
        assert_eq!(e, vec![4, 4]);
        assert_eq!(f, if rank == 0 { vec![0, 1, 2, 3] } else { vec![] });
        assert_eq!(g, vec![5 + rank as i64]);
        assert_eq!(h, (0..4).map(|p| p * 10 + rank as i64).collect::<Vec<_>>());
        assert_eq!(
            i,
            if rank == 1 {
                vec![6, 6]
            } else {
                vec![rank as i64; 2]
            }
        );
    }
}

#[test]
fn split_forms_independent_groups() {
    let out = local::run_with(6, cfg(), |comm| {
        let r = comm.rank();
        // Even and odd ranks; key reverses the order within each group.
        let sub = comm
            .split(Some((r % 2) as u32), -(r as i64))
            .unwrap()
            .unwrap();
        let mut v = vec![r as u32];
        sub.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        // Rank 5 opts out of a second split.
        let color = if r == 5 { None } else { Some(0) };
        let second = comm.split(color, 0).unwrap();
        let second_size = second.as_ref().map(|c| c.size());
        if let Some(c) = &second {
            c.barrier().unwrap();
        }
        // The parent still works after splitting.
        let mut w = vec![1u32];
        comm.all_reduce_in_place(&mut w, ReduceOp::Sum).unwrap();
        (sub.rank(), sub.size(), v[0], second_size, w[0])
    })
    .unwrap();
    for (r, (sub_rank, sub_size, sum, second, total)) in out.into_iter().enumerate() {
        assert_eq!(sub_size, 3);
        assert_eq!(sum, if r % 2 == 0 { 6 } else { 9 });
        // Reversed by key: the highest old rank is new rank 0.
        assert_eq!(sub_rank, 2 - r / 2);
        assert_eq!(second, if r == 5 { None } else { Some(5) });
        assert_eq!(total, 6);
    }
}

#[test]
fn point_to_point_keeps_order_per_tag() {
    let out = local::run_with(3, cfg(), |comm| match comm.rank() {
        0 => {
            comm.send(&[1u32, 2], 1, 7).unwrap();
            comm.send(&[3u32, 4], 1, 7).unwrap();
            comm.send(&[9u32], 2, 0).unwrap();
            vec![]
        }
        1 => {
            let (mut a, mut b) = ([0u32; 2], [0u32; 2]);
            comm.recv(&mut a, 0, 7).unwrap();
            comm.recv(&mut b, 0, 7).unwrap();
            vec![a[0], a[1], b[0], b[1]]
        }
        _ => {
            let mut c = [0u32; 1];
            comm.recv(&mut c, 0, 0).unwrap();
            c.to_vec()
        }
    })
    .unwrap();
    assert_eq!(out[1], vec![1, 2, 3, 4]);
    assert_eq!(out[2], vec![9]);
}

#[test]
fn different_collectives_at_the_same_point_are_a_mismatch_on_both_sides() {
    let config = cfg().with_timeout(Duration::from_secs(5));
    let out = local::run_with(2, config, |comm| {
        let mut v = vec![1.0f32; 8];
        if comm.rank() == 0 {
            comm.all_reduce_in_place(&mut v, ReduceOp::Sum)
        } else {
            comm.broadcast_in_place(&mut v, 0)
        }
    })
    .unwrap();
    for (rank, r) in out.iter().enumerate() {
        match r {
            Err(Error::Mismatch {
                rank: me,
                local,
                remote,
                ..
            }) => {
                assert_eq!(*me, rank);
                let text = format!("{local} {remote}");
                assert!(
                    text.contains("allreduce") && text.contains("bcast"),
                    "{text}"
                );
            }
            other => panic!("rank {rank}: expected a mismatch, got {other:?}"),
        }
    }
}

#[test]
fn different_counts_are_a_mismatch() {
    let config = cfg().with_timeout(Duration::from_secs(5));
    let out = local::run_with(2, config, |comm| {
        let mut v = vec![1i32; 4 + comm.rank()];
        comm.with_options(CallOptions::algorithm(Algorithm::Tree))
            .all_reduce_in_place(&mut v, ReduceOp::Sum)
    })
    .unwrap();
    assert!(
        out.iter().all(|r| matches!(r, Err(Error::Mismatch { .. }))),
        "{out:?}"
    );
}

#[test]
fn a_rank_that_never_arrives_is_a_timeout_naming_it() {
    let config = cfg().with_timeout(Duration::from_millis(300));
    let out = local::run_with(3, config, |comm| {
        if comm.rank() == 2 {
            // Alive but elsewhere until past the others' deadline (a rank
            // that returns is lost at once instead: tests/thread_faults.rs).
            std::thread::sleep(Duration::from_millis(800));
            return Ok(());
        }
        let start = Instant::now();
        let r = comm.barrier();
        assert!(start.elapsed() < Duration::from_secs(5));
        r
    })
    .unwrap();
    let named: Vec<usize> = out
        .iter()
        .filter_map(|r| match r {
            Err(Error::Timeout {
                peer, collective, ..
            }) => {
                assert!(collective.contains("barrier"), "{collective}");
                Some(*peer)
            }
            _ => None,
        })
        .collect();
    assert!(named.contains(&2), "someone must name rank 2: {out:?}");
}

#[test]
fn a_panicking_rank_is_reported_as_lost_not_a_hang() {
    let start = Instant::now();
    let result = std::panic::catch_unwind(|| {
        local::run_with(3, cfg(), |comm| {
            if comm.rank() == 1 {
                panic!("rank 1 fails on purpose");
            }
            let e = comm.barrier().unwrap_err();
            assert!(matches!(e, Error::PeerLost { .. }), "{e}");
        })
    });
    assert!(result.is_err(), "the panic is resumed by local::run");
    assert!(start.elapsed() < Duration::from_secs(10));
}

#[test]
fn abort_wakes_every_waiter() {
    let out = local::run_with(3, cfg(), |comm| {
        if comm.rank() == 0 {
            std::thread::sleep(Duration::from_millis(100));
            comm.abort();
            return Ok(());
        }
        let start = Instant::now();
        let r = comm.barrier();
        assert!(start.elapsed() < Duration::from_secs(2));
        r
    })
    .unwrap();
    assert!(matches!(out[1], Err(Error::Aborted)));
    assert!(matches!(out[2], Err(Error::Aborted)));
}

#[test]
fn algorithm_choice_follows_options_then_config_then_auto() {
    let config = cfg()
        .with_algorithm(Collective::AllReduce, Algorithm::Ring)
        .unwrap();
    local::run_with(2, config, |comm| {
        let (a, why) = comm.choose(Collective::AllReduce, 8).unwrap();
        assert_eq!(a, Algorithm::Ring);
        assert!(why.contains("FERROCOLL_ALGO"));
        let tree = comm.with_options(CallOptions::algorithm(Algorithm::Tree));
        assert_eq!(
            tree.choose(Collective::AllReduce, 8).unwrap().0,
            Algorithm::Tree
        );
        let (_, why) = comm.choose(Collective::Broadcast, 8).unwrap();
        assert!(why.starts_with("auto"));
        assert!(CallOptions::algorithm_named("bogus").is_err());
    })
    .unwrap();
}

#[test]
fn avg_divides_by_the_group_size() {
    let out = local::run_with(4, cfg(), |comm| {
        let mut f = vec![comm.rank() as f64; 3];
        comm.all_reduce_in_place(&mut f, ReduceOp::Avg).unwrap();
        let mut i = vec![comm.rank() as i32 * 3; 2];
        comm.all_reduce_in_place(&mut i, ReduceOp::Avg).unwrap();
        (f[0], i[0])
    })
    .unwrap();
    assert!(out.iter().all(|&(f, i)| f == 1.5 && i == 4)); // (0+3+6+9)/4 = 4 (truncated)
}

#[test]
fn auto_chooses_alike_on_root_and_leaves() {
    // 12 ranks, 8 KiB blocks: the root's gather buffer is 96 KiB while the
    // others hold 8 KiB. The choice must not depend on that difference.
    let config = cfg().with_timeout(Duration::from_secs(20));
    let out = local::run_with(12, config, |comm| {
        let mine = vec![comm.rank() as f32; 2048];
        let mut all = vec![0.0f32; if comm.rank() == 3 { 12 * 2048 } else { 0 }];
        comm.gather(&mine, &mut all, 3)?;
        let mut back = vec![0.0f32; 2048];
        comm.scatter(&all, &mut back, 3)?;
        Ok::<_, Error>(back[2047])
    })
    .unwrap();
    for (rank, r) in out.into_iter().enumerate() {
        assert_eq!(r.unwrap(), rank as f32);
    }
}

#[test]
fn topology_must_fit_the_group_and_follows_splits() {
    use ferrocoll::Topology;
    let t: Topology = "2x4".parse().unwrap();
    let e = local::run_with(6, cfg().with_topology(t.clone()), |_| ()).unwrap_err();
    assert!(e.to_string().contains("2x4"), "{e}");
    let out = local::run_with(8, cfg().with_topology(t), |comm| {
        assert_eq!(comm.topology().levels(), &[2, 4]);
        // Even local ranks of both nodes: 2 nodes of 2.
        let color = (comm.rank() % 2 == 0).then_some(0);
        let sub = comm.split(color, 0).unwrap();
        sub.map(|s| s.topology().levels().to_vec())
    })
    .unwrap();
    assert_eq!(out[0], Some(vec![2, 2]));
    assert_eq!(out[1], None);
}

/// A per-call or configured timeout of `Duration::MAX` waits "forever"
/// (30 days) instead of overflowing the deadline's clock arithmetic.
#[test]
fn an_endless_timeout_is_capped_not_a_panic() {
    use ferrocoll::{local, CallOptions, Config, ReduceOp};
    use std::time::Duration;
    let config = Config::from_env().unwrap().with_timeout(Duration::MAX);
    let sums = local::run_with(2, config, |comm| {
        let timed = comm.with_options(CallOptions::default().timeout(Duration::MAX));
        let mut v = vec![1.0f32; 3];
        timed.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        comm.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        v[0]
    })
    .unwrap();
    assert_eq!(sums, vec![4.0, 4.0]);
}
