//! No thread per non-blocking call (issue 16): the process's threads are
//! counted (Linux: `/proc/self/task`) while 1,000 calls are queued, and
//! after they complete. Alone in its test binary, so no other test's threads
//! are counted.

#![cfg(target_os = "linux")]

use std::sync::Barrier;

use ferrocoll::{local, Config, ReduceOp, Request};

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task lists this process's threads")
        .count()
}

#[test]
fn a_thousand_non_blocking_calls_start_no_thread_per_call() {
    const CALLS: u64 = 1000;
    let outside = threads();
    let gate = Barrier::new(2);
    let counts = local::run_with(2, Config::default(), |comm| {
        let r = comm.rank() as u64;
        // The first non-blocking call starts each rank's worker.
        comm.iall_reduce(vec![r], ReduceOp::Sum).wait().unwrap();
        gate.wait();
        let mut seen = None;
        if r == 0 {
            let base = threads();
            // Rank 1 issues nothing until this rank has counted, so all
            // 1,000 calls are still queued (or running) here: a thread per
            // call would show 1,000 more.
            let reqs: Vec<_> = (0..CALLS)
                .map(|i| comm.iall_reduce(vec![i; 2], ReduceOp::Sum))
                .collect();
            let queued = threads();
            gate.wait();
            let sums = Request::wait_all(reqs).unwrap();
            assert!(sums
                .iter()
                .enumerate()
                .all(|(i, s)| *s == vec![2 * i as u64; 2]));
            seen = Some((base, queued, threads()));
        } else {
            gate.wait();
            let reqs: Vec<_> = (0..CALLS)
                .map(|i| comm.iall_reduce(vec![i; 2], ReduceOp::Sum))
                .collect();
            Request::wait_all(reqs).unwrap();
        }
        // Both ranks done before rank 0's counts are final.
        gate.wait();
        seen
    })
    .unwrap();
    let (base, queued, done) = counts[0].unwrap();
    assert_eq!(
        queued, base,
        "1,000 queued calls must not add threads ({base} before, {queued} while queued)"
    );
    assert_eq!(
        done, base,
        "threads after the calls: {done}, before: {base}"
    );
    // The workers end with their communicators.
    assert_eq!(threads(), outside, "threads left once the ranks are gone");
}
