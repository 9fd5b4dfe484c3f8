//! What `bench` prints: the description line and the table's header
//! ([`write_header`]), one [`Row`] per size as a table line or a JSON object,
//! and the summary after the table ([`write_summary`]: wrong elements, the
//! average bus bandwidth and the machine's memcpy limit).

use std::io::{self, Write};
use std::time::Instant;

use serde::Serialize;

use super::setup::Setup;
use crate::error::CliError;

/// One line of results: the `--json` object, field for field.
#[derive(Clone, Debug, Serialize)]
pub(super) struct Row {
    /// The collective's name.
    pub(super) coll: &'static str,
    /// The size, nccl-tests style (see [`super::sweep::Size::bytes`]).
    pub(super) bytes: usize,
    /// `bytes` / element size, as nccl-tests reports it.
    pub(super) count: usize,
    /// The element type's name.
    pub(super) dtype: &'static str,
    /// The reduction's name, or `none`.
    pub(super) op: &'static str,
    /// Number of ranks.
    pub(super) ranks: usize,
    /// The communicator's transport.
    pub(super) transport: &'static str,
    /// The algorithm that ran (`shm-fast` for the small-call fast path).
    pub(super) algo: &'static str,
    /// Mean time of one call (the slowest rank's), in us.
    pub(super) time_us: f64,
    /// Median time of one call (per rank, then the slowest rank's), in us:
    /// robust to the scheduler's hiccups on oversubscribed machines.
    pub(super) median_us: f64,
    /// `bytes / time`, in GB/s.
    pub(super) algbw: f64,
    /// `algbw` times the collective's bus factor, in GB/s.
    pub(super) busbw: f64,
    /// Wrong elements over all ranks; `None` (null) without `--check`.
    pub(super) wrong: Option<u64>,
    /// The cost model's prediction for this call on the communicator's
    /// profile (null where it has no closed form, as for alltoallv).
    pub(super) predicted_us: Option<f64>,
}

/// The table's two header lines: nccl-tests' columns, then the algorithm
/// and the cost model's prediction.
const TABLE_HEADER: [&str; 2] = [
    "#        size         count    type   redop    root     time(us)  algbw(GB/s)  busbw(GB/s)   #wrong  algo                predicted(us)",
    "#         (B)    (elements)",
];

/// `row` as a line of the table, under [`TABLE_HEADER`]; `root` is the
/// root column ([`Setup::root_column`]).
pub(super) fn table_line(row: &Row, root: i64) -> String {
    let wrong = row
        .wrong
        .map_or_else(|| "N/A".to_string(), |w| w.to_string());
    let predicted = row
        .predicted_us
        .map_or_else(|| "N/A".to_string(), |p| format!("{p:.2}"));
    format!(
        "{:>13} {:>13} {:>7} {:>7} {:>7} {:>12.2} {:>12.2} {:>12.2} {:>8}  {:<18} {:>13}",
        row.bytes,
        row.count,
        row.dtype,
        row.op,
        root,
        row.time_us,
        row.algbw,
        row.busbw,
        wrong,
        row.algo,
        predicted
    )
}

/// The description line above the table; `algo` is `--algo` as given.
fn describe(setup: &Setup, algo: &str) -> String {
    let mut s = format!(
        "# ferrocoll bench: {}, {} ranks, transport {}, dtype {}, op {}",
        setup.coll,
        setup.n,
        setup.transport.name(),
        setup.dtype,
        setup.op_name()
    );
    if setup.coll.has_root() {
        s += &format!(", root {}", setup.root);
    }
    s += &format!(", algo {}", algo.trim().to_ascii_lowercase());
    if let Ok(spec) = std::env::var("FERROCOLL_ALGO") {
        s += &format!(" (FERROCOLL_ALGO={spec})");
    }
    s += &format!(
        ", iters {}, warmup {}, check {}",
        setup.iters,
        setup.warmup,
        if setup.check { "on" } else { "off" }
    );
    s
}

/// The description and the table's header, on stdout.
pub(super) fn write_header(setup: &Setup, algo: &str) -> Result<(), CliError> {
    if let Some(spec) = &setup.compress {
        return super::compressed::write_header(setup, spec);
    }
    let mut out = io::stdout().lock();
    writeln!(out, "{}", describe(setup, algo))?;
    writeln!(out, "#")?;
    for line in TABLE_HEADER {
        writeln!(out, "{line}")?;
    }
    Ok(())
}

/// The summary after the table, on stdout: `wrong` elements over every
/// size (with `--check`), the average bus bandwidth and the machine's limit.
pub(super) fn write_summary(setup: &Setup, rows: &[Row], wrong: u64) -> Result<(), CliError> {
    let mut out = io::stdout().lock();
    let avg_busbw = rows.iter().map(|r| r.busbw).sum::<f64>() / rows.len().max(1) as f64;
    writeln!(out, "#")?;
    // A compressed allreduce is lossy: its rows report a relative error
    // rather than wrong elements.
    if setup.check && setup.compress.is_none() {
        let verdict = if wrong == 0 { "OK" } else { "FAILED" };
        writeln!(out, "# Wrong elements    : {wrong} {verdict}")?;
    }
    writeln!(out, "# Avg bus bandwidth : {avg_busbw:.3} GB/s")?;
    // The machine's limit, measured in the same run: ranks are threads,
    // so every byte a collective moves is at least one memory copy.
    if let Some(last) = rows.last() {
        let limit = memcpy_gbps(last.bytes);
        writeln!(
            out,
            "# Machine limit     : memcpy of {} B on one thread {limit:.2} GB/s; \
             largest size's algbw is {:.2} of it",
            last.bytes,
            last.algbw / limit
        )?;
    }
    Ok(())
}

/// Bandwidth of a single-threaded copy of `bytes` (best of several runs),
/// in GB/s.
fn memcpy_gbps(bytes: usize) -> f64 {
    let src = vec![1u8; bytes.max(1)];
    let mut dst = vec![0u8; bytes.max(1)];
    let mut best = f64::INFINITY;
    for _ in 0..10 {
        let start = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
        best = best.min(start.elapsed().as_secs_f64());
    }
    bytes as f64 / best.max(1e-9) / 1e9
}
