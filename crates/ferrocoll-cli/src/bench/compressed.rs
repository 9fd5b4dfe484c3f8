//! `bench allreduce --compress CODEC`: the compressed allreduce of
//! `ferrocoll::compress::Compressor` in place of the plain one, with what
//! it put on the wire.
//!
//! Each size gets one compressor, which keeps its error-feedback residuals
//! across the warm-up and timed calls as training would; every call is
//! out of place (`Compressor::all_reduce_into`), so each reduces the same
//! input. The time is the slowest rank's mean per call, and the bandwidths
//! are computed on the **uncompressed** size, as the plain allreduce's
//! are, so that they compare with it directly (`busbw = bytes / time * 2
//! (n-1)/n`: the effective bus bandwidth). Beside them:
//!
//! * `wire(B)`: the bytes a rank sends per call by the algorithm's formula
//!   (`WireStats::sent_bytes`, the largest over the ranks);
//! * `counted(B)`: the bytes it handed the transport, from the
//!   communicator's counter (`WireStats::measured_bytes`, the largest);
//! * `local(B)`: the hierarchical form's uncompressed bytes within the
//!   node, counted (`WireStats::local_measured_bytes`; 0 for the flat
//!   form);
//! * `less`: what a ring allreduce of the uncompressed buffer sends per
//!   rank (`2 (n-1)/n bytes`) over `wire`;
//! * `codec(us)` and `comm(us)`: the mean time per call spent encoding,
//!   decoding and adding, and inside the collectives (the slowest rank's),
//!   and `local(us)`, the part of `comm` spent in the hierarchical form's
//!   uncompressed steps within the node;
//! * `relerr`: with the check on, `|result - sum| / |sum|` (L2) of one call
//!   of a fresh compressor (no residual yet) on the known data, against
//!   the exact sum: how lossy one step is (`N/A` without the check).

use std::io::{self, IsTerminal, Write};
use std::time::Instant;

use ferrocoll::compress::{Compressor, WireStats};
use ferrocoll::{Collective, Communicator, ReduceOp};
use serde::Serialize;

use super::buffers::Buffer;
use super::output::Row;
use super::setup::Setup;
use super::sweep::bus_factor;
use crate::error::CliError;
use crate::verify::{self, Pattern};

/// One line of results of a compressed allreduce: the `--json` object.
#[derive(Clone, Debug, Serialize)]
struct CompressedRow {
    coll: &'static str,
    /// The codec, as the compressor names it.
    codec: String,
    /// The algorithm the compressor runs (`two-phase`, `allgather`, ...).
    algo: &'static str,
    /// The uncompressed size in bytes.
    bytes: usize,
    count: usize,
    ranks: usize,
    transport: &'static str,
    /// Mean time of one call (the slowest rank's), in us.
    time_us: f64,
    /// Median time of one call (the slowest rank's), in us.
    median_us: f64,
    /// Uncompressed bytes / time, in GB/s.
    algbw: f64,
    /// `algbw` times 2(n-1)/n: the effective bus bandwidth.
    busbw: f64,
    /// Bytes a rank sends per call by the formula (the largest).
    wire_bytes: usize,
    /// Bytes a rank handed its transport per call (the largest).
    counted_bytes: u64,
    /// Uncompressed bytes within the node per call, counted (the largest).
    local_bytes: u64,
    /// A ring allreduce's bytes per rank over `wire_bytes`.
    less: f64,
    /// Mean codec time per call (the slowest rank's), in us.
    codec_us: f64,
    /// Mean time inside the collectives per call (the slowest rank's), in us.
    comm_us: f64,
    /// The part of `comm_us` within the node (hierarchical form), in us.
    local_us: f64,
    /// Relative L2 error of one fresh call; `None` without `--check`.
    relerr: Option<f64>,
}

/// The table's header lines.
const HEADER: [&str; 2] = [
    "#        size         count  codec                      time(us)  algbw(GB/s)  busbw(GB/s)      wire(B)   counted(B)     local(B)     less   codec(us)    comm(us)   local(us)     relerr  algo",
    "#         (B)    (elements)                                       (effective, on the uncompressed size)",
];

/// The description line and the header, on stdout.
pub(super) fn write_header(setup: &Setup, spec: &str) -> Result<(), CliError> {
    let mut out = io::stdout().lock();
    writeln!(
        out,
        "# ferrocoll bench: {} compressed with {spec}, {} ranks, transport {}, dtype f32, op {}, \
         iters {}, warmup {}, check {}",
        setup.coll,
        setup.n,
        setup.transport.name(),
        setup.op_name(),
        setup.iters,
        setup.warmup,
        if setup.check { "on" } else { "off" }
    )?;
    writeln!(out, "#")?;
    for line in HEADER {
        writeln!(out, "{line}")?;
    }
    Ok(())
}

fn table_line(row: &CompressedRow) -> String {
    let relerr = row
        .relerr
        .map_or_else(|| "N/A".to_string(), |e| format!("{e:.3e}"));
    format!(
        "{:>13} {:>13}  {:<22} {:>12.2} {:>12.3} {:>12.3} {:>12} {:>12} {:>12} {:>8.1} {:>11.1} {:>11.1} {:>11.1} {:>10}  {}",
        row.bytes,
        row.count,
        row.codec,
        row.time_us,
        row.algbw,
        row.busbw,
        row.wire_bytes,
        row.counted_bytes,
        row.local_bytes,
        row.less,
        row.codec_us,
        row.comm_us,
        row.local_us,
        relerr,
        row.algo
    )
}

/// One rank's sweep of the compressed allreduce with codec `spec`. Rank 0
/// prints each row and returns the rows (as the plain sweep's, for the
/// summary); the other ranks return nothing.
pub(super) fn run_rank(
    comm: &Communicator,
    setup: &Setup,
    spec: &str,
) -> Result<Vec<Row>, CliError> {
    let (n, rank, op) = (setup.n, comm.rank(), setup.op);
    let pattern = Pattern::new::<f32>(Some(op), n);
    let max_count = setup.sizes.last().map_or(0, |s| s.count);
    let mut send = Buffer::<f32>::new(max_count, setup.shared_buffers)?;
    pattern.fill(rank, &mut send);
    let mut recv = Buffer::<f32>::new(max_count, setup.shared_buffers)?;
    let progress = setup.json && io::stderr().is_terminal();
    let mut rows = Vec::new();
    for &size in &setup.sizes {
        let (send, recv) = (&send[..size.count], &mut recv[..size.count]);
        let mut c = Compressor::new(comm, size.count, spec)?;
        for _ in 0..setup.warmup {
            c.all_reduce_into(send, recv, op)?;
        }
        comm.barrier()?;
        let mut total = WireStats::default();
        let mut each = Vec::with_capacity(setup.iters);
        let start = Instant::now();
        for _ in 0..setup.iters {
            let t = Instant::now();
            total += c.all_reduce_into(send, recv, op)?;
            each.push(t.elapsed().as_secs_f64());
        }
        let iters = setup.iters as f64;
        let mine = start.elapsed().as_secs_f64() / iters;
        each.sort_by(f64::total_cmp);
        let median = each[each.len() / 2];
        let local = [
            mine,
            median,
            total.sent_bytes as f64 / iters,
            total.measured_bytes as f64 / iters,
            total.local_measured_bytes as f64 / iters,
            total.codec_time.as_secs_f64() / iters,
            total.comm_time.as_secs_f64() / iters,
            total.local_time.as_secs_f64() / iters,
        ];
        let mut slowest = [0.0f64; 8];
        comm.all_reduce(&local, &mut slowest, ReduceOp::Max)?;

        let relerr = if setup.check {
            let mut fresh = Compressor::new(comm, size.count, spec)?;
            fresh.all_reduce_into(send, recv, op)?;
            let expected = verify::expected::<f32>(
                &pattern,
                &verify::Call {
                    coll: Collective::AllReduce,
                    op,
                    n,
                    rank,
                    root: 0,
                    count: size.count,
                },
            );
            Some(relative_error(recv, &expected))
        } else {
            None
        };

        if rank == 0 {
            let [time, median, wire, counted, local, codec_s, comm_s, local_s] = slowest;
            let algbw = size.bytes as f64 / time / 1e9;
            let ring = 2.0 * (n as f64 - 1.0) / n as f64 * size.bytes as f64;
            let row = CompressedRow {
                coll: setup.coll.name(),
                codec: c.name(),
                algo: c.algorithm(),
                bytes: size.bytes,
                count: size.count,
                ranks: n,
                transport: comm.transport_name(),
                time_us: time * 1e6,
                median_us: median * 1e6,
                algbw,
                busbw: algbw * bus_factor(setup.coll, n),
                wire_bytes: wire.round() as usize,
                counted_bytes: counted.round() as u64,
                local_bytes: local.round() as u64,
                less: if wire > 0.0 { ring / wire } else { 0.0 },
                codec_us: codec_s * 1e6,
                comm_us: comm_s * 1e6,
                local_us: local_s * 1e6,
                relerr,
            };
            let line = if setup.json {
                serde_json::to_string(&row)
                    .map_err(|e| CliError::Run(format!("encoding JSON: {e}")))?
            } else {
                table_line(&row)
            };
            let mut stdout = io::stdout().lock();
            writeln!(stdout, "{line}")?;
            stdout.flush()?;
            if progress {
                eprintln!("bench: compressed {} B done", size.bytes);
            }
            rows.push(Row {
                coll: row.coll,
                bytes: row.bytes,
                count: row.count,
                dtype: "f32",
                op: setup.op_name(),
                ranks: n,
                transport: row.transport,
                algo: row.algo,
                time_us: row.time_us,
                median_us: row.median_us,
                algbw: row.algbw,
                busbw: row.busbw,
                // Lossy: there is no exact answer to count wrong elements
                // against (relerr says how far it is).
                wrong: None,
                predicted_us: None,
            });
        }
    }
    Ok(rows)
}

/// `|got - want| / |want|` in L2, in `f64` (0 when both are zero).
fn relative_error(got: &[f32], want: &[f32]) -> f64 {
    let (mut diff, mut norm) = (0f64, 0f64);
    for (&g, &w) in got.iter().zip(want) {
        diff += (g as f64 - w as f64).powi(2);
        norm += (w as f64).powi(2);
    }
    if norm == 0.0 {
        diff.sqrt()
    } else {
        (diff / norm).sqrt()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_error_is_l2_over_the_sum() {
        assert_eq!(relative_error(&[3.0, 4.0], &[3.0, 4.0]), 0.0);
        assert!((relative_error(&[3.0, 0.0], &[3.0, 4.0]) - 0.8).abs() < 1e-12);
        assert_eq!(relative_error(&[0.0], &[0.0]), 0.0);
    }
}
