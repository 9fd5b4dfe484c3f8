//! One rank's part of the sweep: for each size, the warm-up calls, a
//! barrier, the timed calls (the slowest rank's mean and median), and with
//! `--check` one more call on known data whose wrong elements every rank
//! counts against the sequential reference of [`crate::verify`]. Rank 0
//! prints each row as it completes.

use std::io::{self, IsTerminal, Write};
use std::time::Instant;

use ferrocoll::{Collective, Communicator, DType, ReduceOp};
use half::{bf16, f16};

use super::buffers::{buffer_lens, Buffer, PeerCounts};
use super::output::{table_line, Row};
use super::setup::Setup;
use super::sweep::bus_factor;
use crate::error::CliError;
use crate::verify::{self, Pattern, Sample};

/// One rank's part of the sweep, with the element type of `--dtype`. Rank 0
/// prints each row as it completes and returns the rows; the other ranks
/// return nothing.
pub(super) fn run_rank(comm: &Communicator, setup: &Setup) -> Result<Vec<Row>, CliError> {
    if let Some(spec) = &setup.compress {
        return super::compressed::run_rank(comm, setup, spec);
    }
    match setup.dtype {
        DType::F32 => run_rank_as::<f32>(comm, setup),
        DType::F64 => run_rank_as::<f64>(comm, setup),
        DType::F16 => run_rank_as::<f16>(comm, setup),
        DType::BF16 => run_rank_as::<bf16>(comm, setup),
        DType::I8 => run_rank_as::<i8>(comm, setup),
        DType::I32 => run_rank_as::<i32>(comm, setup),
        DType::I64 => run_rank_as::<i64>(comm, setup),
        DType::U8 => run_rank_as::<u8>(comm, setup),
        DType::U32 => run_rank_as::<u32>(comm, setup),
        DType::U64 => run_rank_as::<u64>(comm, setup),
    }
}

/// [`run_rank`] with elements of type `T`.
fn run_rank_as<T: Sample>(comm: &Communicator, setup: &Setup) -> Result<Vec<Row>, CliError> {
    let (n, rank, coll, root, op) = (setup.n, comm.rank(), setup.coll, setup.root, setup.op);
    let tuned = comm.with_options(setup.options.clone());
    let pattern = Pattern::new::<T>(coll.reduces().then_some(op), n);

    // Buffers for the largest size; each size uses a prefix (the pattern is
    // defined per index, so a prefix of the largest input is the input of a
    // smaller size).
    let max_count = setup.sizes.last().map_or(0, |s| s.count);
    let (send_max, recv_max) = buffer_lens(coll, n, rank, root, max_count);
    let mut send = Buffer::<T>::new(send_max, setup.shared_buffers)?;
    pattern.fill(rank, &mut send);
    let mut recv = Buffer::<T>::new(recv_max, setup.shared_buffers)?;

    let progress = setup.json && io::stderr().is_terminal();
    let mut rows = Vec::new();
    for &size in &setup.sizes {
        let (send_len, recv_len) = buffer_lens(coll, n, rank, root, size.count);
        let (send, recv) = (&send[..send_len], &mut recv[..recv_len]);
        let counts = PeerCounts::new(coll, n, rank, size.count);

        let algo = what_runs(&tuned, coll, size.count, setup.dtype)?;

        for _ in 0..setup.warmup {
            call(&tuned, setup, send, recv, &counts)?;
        }
        // The mean comes from a loop timed as a whole, as the peers'
        // benchmarks time theirs: reading the clock around every call costs
        // two clock reads per call, a quarter of an 8-byte broadcast's time.
        comm.barrier()?;
        let start = Instant::now();
        for _ in 0..setup.iters {
            call(&tuned, setup, send, recv, &counts)?;
        }
        let mine = start.elapsed().as_secs_f64() / setup.iters as f64;
        // The median from a second loop, each call timed alone.
        comm.barrier()?;
        let mut each = Vec::with_capacity(setup.iters);
        for _ in 0..setup.iters {
            let t = Instant::now();
            call(&tuned, setup, send, recv, &counts)?;
            each.push(t.elapsed().as_secs_f64());
        }
        each.sort_by(f64::total_cmp);
        let median = each[each.len() / 2];
        // The slowest rank's mean and median.
        let mut slowest = [0.0f64; 2];
        comm.all_reduce(&[mine, median], &mut slowest, ReduceOp::Max)?;

        let wrong = if setup.check {
            let expected = verify::expected::<T>(
                &pattern,
                &verify::Call {
                    coll,
                    op,
                    n,
                    rank,
                    root,
                    count: size.count,
                },
            );
            verify::poison(recv, &expected);
            if setup.in_place && rank == root {
                // In place the root's buffer is its input.
                recv.copy_from_slice(send);
            }
            call(&tuned, setup, send, recv, &counts)?;
            let mut total = [0u64];
            comm.all_reduce(
                &[verify::count_wrong(recv, &expected)],
                &mut total,
                ReduceOp::Sum,
            )?;
            Some(total[0])
        } else {
            None
        };

        if rank == 0 {
            let time = slowest[0];
            let algbw = size.bytes as f64 / time / 1e9;
            let row = Row {
                coll: coll.name(),
                bytes: size.bytes,
                count: size.bytes / setup.dtype.size(),
                dtype: setup.dtype.name(),
                op: setup.op_name(),
                ranks: n,
                transport: comm.transport_name(),
                algo,
                time_us: time * 1e6,
                median_us: slowest[1] * 1e6,
                algbw,
                busbw: algbw * bus_factor(coll, n),
                wrong,
                predicted_us: tuned
                    .predict(coll, size.count, setup.dtype)?
                    .1
                    .map(|c| c.total() * 1e6),
            };
            let line = if setup.json {
                serde_json::to_string(&row)
                    .map_err(|e| CliError::Run(format!("encoding JSON: {e}")))?
            } else {
                table_line(&row, setup.root_column())
            };
            // Locked only here: a lock held by every rank would deadlock.
            let mut stdout = io::stdout().lock();
            writeln!(stdout, "{line}")?;
            stdout.flush()?;
            if progress {
                eprintln!("bench: {coll} {} B done", size.bytes);
            }
            rows.push(row);
        }
    }
    Ok(rows)
}

/// What a call of `count` elements of `dtype` runs on `comm`: `shm-fast`
/// where small calls on one host skip the plans (see
/// `Communicator::uses_fast_path`), else the algorithm it chooses, asked
/// with the same byte count the library passes to its choice (0 for
/// alltoallv, whose per-rank sizes differ).
pub(crate) fn what_runs(
    comm: &Communicator,
    coll: Collective,
    count: usize,
    dtype: DType,
) -> ferrocoll::Result<&'static str> {
    if comm.uses_fast_path(coll, count, dtype) {
        return Ok("shm-fast");
    }
    let (algo, _why) = comm.choose(coll, comm.call_bytes(coll, count, dtype))?;
    Ok(algo.name())
}

/// One call of the set-up's collective: out of place, or in place in
/// `recv` with `--in-place`; `counts` are used by alltoallv only.
fn call<T: Sample>(
    comm: &Communicator,
    setup: &Setup,
    send: &[T],
    recv: &mut [T],
    counts: &PeerCounts,
) -> ferrocoll::Result<()> {
    let (coll, op, root) = (setup.coll, setup.op, setup.root);
    if setup.in_place && coll == Collective::Broadcast {
        return comm.broadcast_in_place(recv, root);
    }
    out_of_place(comm, coll, send, recv, op, root, counts)
}

/// One call of `coll` (out of place); `counts` are used by alltoallv only.
pub(crate) fn out_of_place<T: Sample>(
    comm: &Communicator,
    coll: Collective,
    send: &[T],
    recv: &mut [T],
    op: ReduceOp,
    root: usize,
    counts: &PeerCounts,
) -> ferrocoll::Result<()> {
    match coll {
        Collective::AllReduce => comm.all_reduce(send, recv, op),
        Collective::Broadcast => comm.broadcast(send, recv, root),
        Collective::Reduce => comm.reduce(send, recv, op, root),
        Collective::AllGather => comm.all_gather(send, recv),
        Collective::ReduceScatter => comm.reduce_scatter(send, recv, op),
        Collective::AllToAll => comm.all_to_all(send, recv),
        Collective::Gather => comm.gather(send, recv, root),
        Collective::Scatter => comm.scatter(send, recv, root),
        Collective::AllToAllV => comm.all_to_all_v(send, &counts.send, recv, &counts.recv),
        Collective::Barrier => Err(ferrocoll::Error::invalid(format!(
            "bench does not measure {coll}"
        ))),
    }
}
