//! `ferrocoll bench`: an nccl-tests-style sweep of one collective.
//!
//! For each size from `--minbytes` to `--maxbytes` (multiplying by
//! `--stepfactor`), every rank runs `--warmup` untimed calls, meets the others
//! at a barrier, then times `--iters` calls. The reported time is the slowest
//! rank's average per call; bandwidths follow nccl-tests:
//!
//! * `algbw = bytes / time`;
//! * `busbw = algbw * factor`, the factor making busbw comparable with the
//!   link bandwidth: 2(n-1)/n for allreduce, (n-1)/n for allgather,
//!   reducescatter, alltoall, alltoallv, gather and scatter, 1 for bcast and
//!   reduce.
//!
//! `bytes` is the whole buffer as nccl-tests counts it: for allgather,
//! reducescatter, alltoall, gather and scatter it is all n blocks, so each
//! rank's block is bytes / (n * element size). The `count` reported is, as in
//! nccl-tests, bytes / element size.
//!
//! alltoallv sends uneven blocks. Each swept size `S` sets an average block
//! of `b = S / (n * element size)` elements, and rank `s` sends rank `d`
//! `floor(b * w / 4)` elements with `w = 1 + (s + 2d) mod 7` (from b/4 to
//! 7b/4 elements; some blocks are empty when b < 4), the same formula on
//! every rank, so `--check` can rebuild every rank's input and output (see
//! [`verify::alltoallv_count`]). Ranks send different amounts, so the
//! reported `bytes` is the *average* send buffer: all ranks' send counts
//! together, divided by n, rounded down to whole elements, times the element
//! size. It is close to `S` (equal to it for 3 ranks and b a multiple of 4)
//! but not always exactly `S`; sizes whose average rounds to nothing are
//! skipped. As for alltoall, busbw = algbw * (n-1)/n. The algorithm reported
//! is chosen, as the library chooses it for alltoallv, on 0 bytes (per-rank
//! sizes differ, so no size every rank agrees on enters the choice).
//!
//! # Layout
//!
//! * `mod.rs`: [`main`], the command: set-up, where the ranks run, the first
//!   error that is not a consequence of another rank's, the summary;
//! * `args.rs`: [`BenchArgs`], [`Transport`] and the parsers ([`parse_size`],
//!   `--algo` checked against the collective);
//! * `setup.rs`: the arguments validated into what every rank runs;
//! * `sweep.rs`: the sizes (`sweep`, `Size`) and `bus_factor`;
//! * `buffers.rs`: one rank's buffer lengths, alltoallv counts, heap or
//!   shared memory;
//! * `rank.rs`: one rank's sweep: warm-up, timing, the `--check` call;
//! * `compressed.rs`: the sweep of `--compress CODEC` (the compressed
//!   allreduce, its wire bytes and effective bandwidth);
//! * `output.rs`: the description, the table or JSON rows, the summary;
//! * `launch.rs`: ranks as threads, as processes started through
//!   `ferrocoll run`, or as one rank of a launcher's job.

mod args;
mod buffers;
mod compressed;
mod launch;
mod output;
mod rank;
mod setup;
mod sweep;

// `ferrocoll tune` times calls as the sweep does.
pub use args::{parse_size, parse_transport, ranks_and_transport, BenchArgs, Transport};
pub(crate) use buffers::{buffer_lens, PeerCounts};
pub(crate) use rank::{out_of_place, what_runs};
pub(crate) use sweep::sweep;

use crate::error::CliError;
use setup::Setup;

/// Runs `ferrocoll bench`.
pub fn main(args: &BenchArgs) -> Result<(), CliError> {
    let setup = Setup::from_args(args)?;
    let coll = setup.coll;

    // shm and tcp: this process starts the ranks (this same command, under
    // the launcher) unless it already is one of them.
    if setup.transport != Transport::Thread && !crate::run::in_job() {
        return launch::relaunch(&setup);
    }

    let header = |rank: usize| -> Result<(), CliError> {
        if !setup.json && rank == 0 {
            output::write_header(&setup, &args.algo)?;
        }
        Ok(())
    };

    let outcomes = match setup.transport {
        Transport::Shm | Transport::Tcp | Transport::Auto => {
            match launch::as_job_rank(&setup, &header)? {
                Some(rank0) => vec![rank0],
                // Only rank 0 reports.
                None => return Ok(()),
            }
        }
        Transport::Thread => {
            header(0)?;
            launch::as_threads(&setup)?
        }
    };
    // Report the first error that is not merely a consequence of another
    // rank's (the ranks that were waiting for it see `Aborted`).
    let mut rows = Vec::new();
    let mut secondary = None;
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        match outcome {
            Ok(r) if rank == 0 => rows = r,
            Ok(_) => {}
            Err(e) if e.is_secondary() => {
                secondary.get_or_insert(e);
            }
            Err(e) => return Err(e),
        }
    }
    if let Some(e) = secondary {
        return Err(e);
    }

    let wrong: u64 = rows.iter().filter_map(|r| r.wrong).sum();
    if !setup.json {
        output::write_summary(&setup, &rows, wrong)?;
    }
    if wrong > 0 {
        return Err(CliError::Run(format!(
            "--check found {wrong} wrong elements in {coll} results"
        )));
    }
    Ok(())
}
