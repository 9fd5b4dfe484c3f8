//! Per-call latency of a small f32 sum allreduce across processes: mean,
//! percentiles and the tail, one line per rank.
//!
//! ```text
//! cargo build --release --example latency
//! ferrocoll run -n 2 target/release/examples/latency [CALLS] [COUNT]
//! FERROCOLL_SHM_FAST=off ferrocoll run -n 2 target/release/examples/latency
//! ```
//!
//! `bench/latency.sh` runs it next to the same measurement of Open MPI
//! (`bench/mpi_latency.c`). Every call is timed on its own; the array of
//! times is written once before timing, so no page fault lands in the loop.

use std::time::Instant;

use ferrocoll::ReduceOp;

fn main() -> Result<(), ferrocoll::Error> {
    let comm = ferrocoll::init()?;
    let arg = |i: usize, default: usize| {
        std::env::args()
            .nth(i)
            .and_then(|a| a.parse().ok())
            .unwrap_or(default)
    };
    let (calls, count) = (arg(1, 200_000).max(1), arg(2, 2));
    let send = vec![1.0f32; count];
    let mut recv = vec![0.0f32; count];
    for _ in 0..1000 {
        comm.all_reduce(&send, &mut recv, ReduceOp::Sum)?;
    }
    // Written now (not calloc's untouched zero pages): no page fault while timing.
    let mut ns = vec![u64::MAX; calls];
    comm.barrier()?;
    let start = Instant::now();
    for t in ns.iter_mut() {
        let call = Instant::now();
        comm.all_reduce(&send, &mut recv, ReduceOp::Sum)?;
        *t = call.elapsed().as_nanos() as u64;
    }
    let total = start.elapsed().as_secs_f64();
    assert!(recv.iter().all(|v| *v == comm.size() as f32));
    ns.sort_unstable();
    let at = |q: f64| ns[((calls - 1) as f64 * q) as usize] as f64 / 1e3;
    let over = |us: u64| ns.iter().filter(|&&t| t > us * 1000).count();
    let slow: u64 = ns.iter().filter(|&&t| t > 10_000).sum();
    println!(
        "rank {} ({}, {} calls of {} B): mean {:.3} p50 {:.3} p90 {:.3} p99 {:.3} p99.9 {:.3} max {:.1} us | \
         calls >2us {} >10us {}, time in calls >10us {:.1}%",
        comm.rank(),
        if comm.uses_fast_path(ferrocoll::Collective::AllReduce, count, ferrocoll::DType::F32) {
            "fast path"
        } else {
            "plans"
        },
        calls,
        4 * count,
        total / calls as f64 * 1e6,
        at(0.5),
        at(0.9),
        at(0.99),
        at(0.999),
        at(1.0),
        over(2),
        over(10),
        slow as f64 / 1e9 / total * 100.0
    );
    Ok(())
}
