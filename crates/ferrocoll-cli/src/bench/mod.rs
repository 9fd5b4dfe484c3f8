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

use std::io::{self, IsTerminal, Write};
use std::time::Instant;

use clap::Args;
use ferrocoll::{CallOptions, Collective, Communicator, DType, ReduceOp};
use half::{bf16, f16};
use serde::Serialize;

use crate::error::{lib_message, CliError};
use crate::verify::{self, Pattern, Sample};

/// The collectives `bench` measures, in the order `--help` lists them.
const BENCHED: [Collective; 9] = [
    Collective::AllReduce,
    Collective::AllGather,
    Collective::ReduceScatter,
    Collective::AllToAll,
    Collective::AllToAllV,
    Collective::Broadcast,
    Collective::Reduce,
    Collective::Gather,
    Collective::Scatter,
];

/// Arguments of `ferrocoll bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Collective to measure: allreduce, allgather, reducescatter, alltoall,
    /// alltoallv (uneven blocks; bytes is the average send buffer), bcast
    /// (or broadcast), reduce, gather or scatter.
    #[arg(value_name = "COLL", default_value = "allreduce", value_parser = parse_collective)]
    pub coll: Collective,

    /// Number of ranks.
    #[arg(short = 'n', long, default_value = "4", value_parser = at_least::<1>)]
    pub ranks: usize,

    /// Smallest size in bytes (suffixes K, M, G, T are powers of 1024).
    #[arg(short = 'b', long, default_value = "8", value_parser = parse_size)]
    pub minbytes: usize,

    /// Largest size in bytes (suffixes K, M, G, T are powers of 1024).
    #[arg(short = 'e', long, default_value = "64M", value_parser = parse_size)]
    pub maxbytes: usize,

    /// Multiply the size by this factor between steps.
    #[arg(short = 'f', long, default_value = "4", value_parser = at_least::<2>)]
    pub stepfactor: usize,

    /// Element type: f32, f64, f16, bf16, i8, i32, i64, u8, u32, u64.
    #[arg(long, default_value = "f32", value_parser = parse_dtype)]
    pub dtype: DType,

    /// Reduction of allreduce, reduce and reducescatter: sum, prod, min,
    /// max, avg.
    #[arg(long, default_value = "sum", value_parser = parse_op)]
    pub op: ReduceOp,

    /// Algorithm to force, or auto (then FERROCOLL_ALGO applies), e.g. ring
    /// or tree for allreduce, bcast and reduce; ring for allgather and
    /// reducescatter; direct, pairwise, bruck or hier for alltoall; direct,
    /// pairwise or hier for alltoallv; linear or tree for gather and scatter.
    /// An unknown name is refused with the list of the collective's
    /// algorithms.
    #[arg(long, default_value = "auto")]
    pub algo: String,

    /// Timed calls per size.
    #[arg(long, default_value = "20", value_parser = at_least::<1>)]
    pub iters: usize,

    /// Untimed calls per size before timing.
    #[arg(long, default_value = "5", value_parser = at_least::<0>)]
    pub warmup: usize,

    /// Verify every size (the default, as nccl-tests): run once more, after
    /// the timed calls, with known data and count the elements that differ
    /// from a sequential reference in the `#wrong` column. Accepted for
    /// compatibility; `--no-check` turns it off.
    #[arg(long, overrides_with = "no_check")]
    pub check: bool,

    /// Skip the check: pure timing (`#wrong` shows N/A). The check is not
    /// timed, but computing the reference costs the sweep's wall time.
    #[arg(long = "no-check", overrides_with = "check")]
    pub no_check: bool,

    /// Print one JSON object per size and line, nothing else, on stdout.
    #[arg(long)]
    pub json: bool,

    /// Root rank of bcast, reduce, gather and scatter.
    #[arg(long, default_value = "0")]
    pub root: usize,

    /// How ranks communicate: `thread` (ranks are threads of this process),
    /// `shm` (processes on this host, shared memory) or `tcp` (processes,
    /// TCP over loopback). For shm and tcp, bench starts its ranks itself
    /// through `ferrocoll run`; under a launcher (FERROCOLL_RANK, torchrun,
    /// mpirun, srun set) it joins that job instead.
    #[arg(long, default_value = "thread", value_parser = parse_transport)]
    pub transport: Transport,

    /// Where the send and receive buffers live: `heap` (a Vec) or `shared`
    /// (`ferrocoll::SharedBuffer`, which ranks on one host read in place,
    /// as NCCL's ncclMemAlloc or MPI_Alloc_mem buffers).
    #[arg(long, default_value = "heap", value_parser = ["heap", "shared"])]
    pub buffers: String,
}

/// The transports `bench` can run over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// Ranks are threads of this process (`ferrocoll::local`).
    Thread,
    /// Ranks are processes of this host over shared memory.
    Shm,
    /// Ranks are processes over TCP.
    Tcp,
}

impl Transport {
    fn name(self) -> &'static str {
        match self {
            Transport::Thread => "thread",
            Transport::Shm => "shm",
            Transport::Tcp => "tcp",
        }
    }
}

// ---- argument parsing ------------------------------------------------------

fn parse_collective(s: &str) -> Result<Collective, String> {
    let names = BENCHED.map(|c| c.name()).join(", ");
    match Collective::from_name(s) {
        Some(c) if BENCHED.contains(&c) => Ok(c),
        Some(c) => Err(format!(
            "bench does not measure {c} yet; use one of: {names}"
        )),
        None => Err(format!("unknown collective; use one of: {names}")),
    }
}

fn parse_dtype(s: &str) -> Result<DType, String> {
    s.parse().map_err(lib_message)
}

fn parse_op(s: &str) -> Result<ReduceOp, String> {
    s.parse().map_err(lib_message)
}

fn parse_transport(s: &str) -> Result<Transport, String> {
    match s.to_ascii_lowercase().as_str() {
        "thread" => Ok(Transport::Thread),
        "shm" => Ok(Transport::Shm),
        "tcp" => Ok(Transport::Tcp),
        _ => Err("unknown transport; use thread, shm or tcp".into()),
    }
}

/// A whole number of at least `MIN`.
fn at_least<const MIN: usize>(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(v) if v >= MIN => Ok(v),
        _ => Err(format!("give a whole number of at least {MIN}")),
    }
}

/// Parses a size in bytes: plain bytes or a K, M, G or T suffix (powers of
/// 1024, case-insensitive, optionally followed by `B` or `iB`).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let help = "use whole bytes or a K, M, G or T suffix (powers of 1024), e.g. 8, 1K, 64M, 1G";
    let lower = s.trim().to_ascii_lowercase();
    let split = lower
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(lower.len());
    let (digits, unit) = lower.split_at(split);
    let shift = match unit {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(format!("not a size; {help}")),
    };
    let value: u64 = digits.parse().map_err(|_| format!("not a size; {help}"))?;
    value
        .checked_mul(1 << shift)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| "size too large for this machine".to_string())
}

/// Checks that `name` is `auto` or an algorithm `coll` has, and returns the
/// options forcing it. Unknown names get the library's error for the
/// collective, which lists the valid names.
fn algorithm_options(coll: Collective, name: &str) -> Result<CallOptions, ferrocoll::Error> {
    let unknown = || ferrocoll::plan::unknown_algorithm(coll, name.trim());
    let options = CallOptions::algorithm_named(name.trim()).map_err(|_| unknown())?;
    match options.algorithm {
        Some(a) if a.for_collective(coll).is_none() => Err(unknown()),
        _ => Ok(options),
    }
}

// ---- the sweep ---------------------------------------------------------------

/// One size of the sweep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Size {
    /// The whole buffer, nccl-tests style (all n blocks for the block
    /// collectives; the average send buffer for alltoallv).
    pub bytes: usize,
    /// Elements per rank buffer (per block for the block collectives, the
    /// average block `b` of the count formula for alltoallv).
    pub count: usize,
}

/// True for the collectives whose size counts all n blocks (n average
/// blocks for alltoallv).
fn is_block(coll: Collective) -> bool {
    matches!(
        coll,
        Collective::AllGather
            | Collective::ReduceScatter
            | Collective::AllToAll
            | Collective::AllToAllV
            | Collective::Gather
            | Collective::Scatter
    )
}

/// Sizes from `min` to `max` bytes, multiplying by `factor`, and `max`
/// itself when the steps miss it (8 B by 4 reaches 32 MiB, then 64 MiB
/// ends the sweep), rounded down to whole elements (whole n-block buffers
/// for the block collectives); sizes that round to nothing are skipped.
/// For alltoallv each size fixes the average block and reports the average
/// send buffer (see the module docs).
pub fn sweep(
    coll: Collective,
    n: usize,
    elem: usize,
    min: usize,
    max: usize,
    factor: usize,
) -> Vec<Size> {
    let unit = elem * if is_block(coll) { n } else { 1 };
    let mut sizes: Vec<Size> = Vec::new();
    let mut bytes = Some(min);
    let mut last = false;
    while let Some(b) = bytes {
        let b = if b > max {
            // Past the end: the sweep ends at `max` itself.
            if last {
                break;
            }
            max
        } else {
            b
        };
        last |= b == max;
        let count = b / unit;
        let reported = if coll == Collective::AllToAllV {
            verify::alltoallv_mean(n, count).saturating_mul(elem)
        } else {
            count * unit
        };
        if reported > 0 && sizes.last().map_or(true, |s| s.count != count) {
            sizes.push(Size {
                bytes: reported,
                count,
            });
        }
        bytes = match b.checked_mul(factor) {
            Some(next) => Some(next),
            // Overflow: only `max` remains to do.
            None if !last => Some(max),
            None => None,
        };
    }
    sizes
}

/// busbw / algbw for `coll` on `n` ranks (nccl-tests' factors).
pub fn bus_factor(coll: Collective, n: usize) -> f64 {
    let n = n as f64;
    match coll {
        Collective::AllReduce => 2.0 * (n - 1.0) / n,
        Collective::Broadcast | Collective::Reduce => 1.0,
        _ => (n - 1.0) / n,
    }
}

/// Elements of this rank's send and receive buffers for a call of `count`
/// (empty where the library ignores the buffer: the send buffer of non-roots
/// in bcast and scatter, the receive buffer of non-roots in reduce and
/// gather; the sums of this rank's per-peer counts for alltoallv).
fn buffer_lens(
    coll: Collective,
    n: usize,
    rank: usize,
    root: usize,
    count: usize,
) -> (usize, usize) {
    let root_only = |len: usize| if rank == root { len } else { 0 };
    match coll {
        Collective::AllReduce => (count, count),
        Collective::Broadcast => (root_only(count), count),
        Collective::Reduce => (count, root_only(count)),
        Collective::AllGather => (count, n * count),
        Collective::ReduceScatter => (n * count, count),
        Collective::AllToAll => (n * count, n * count),
        Collective::Gather => (count, root_only(n * count)),
        Collective::Scatter => (root_only(n * count), count),
        Collective::AllToAllV => {
            let (send, recv) = verify::alltoallv_counts(n, rank, count);
            (send.iter().sum(), recv.iter().sum())
        }
        Collective::Barrier => (0, 0),
    }
}

/// This rank's per-peer counts of an alltoallv call (empty for the other
/// collectives).
#[derive(Clone, Debug, Default)]
struct PeerCounts {
    send: Vec<usize>,
    recv: Vec<usize>,
}

impl PeerCounts {
    fn new(coll: Collective, n: usize, rank: usize, count: usize) -> PeerCounts {
        if coll == Collective::AllToAllV {
            let (send, recv) = verify::alltoallv_counts(n, rank, count);
            PeerCounts { send, recv }
        } else {
            PeerCounts::default()
        }
    }
}

/// One call of `coll` (out of place); `counts` are used by alltoallv only.
fn call<T: Sample>(
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

/// Everything the ranks need, validated.
struct Setup {
    coll: Collective,
    n: usize,
    dtype: DType,
    op: ReduceOp,
    root: usize,
    options: CallOptions,
    sizes: Vec<Size>,
    warmup: usize,
    iters: usize,
    check: bool,
    json: bool,
    transport: Transport,
    /// Send and receive buffers are `SharedBuffer`s.
    shared_buffers: bool,
}

/// A benchmark buffer: heap memory or a shared buffer.
enum Buffer<T: Sample> {
    Heap(Vec<T>),
    Shared(ferrocoll::SharedBuffer<T>),
}

impl<T: Sample> Buffer<T> {
    fn new(len: usize, shared: bool) -> Result<Buffer<T>, CliError> {
        Ok(if shared {
            let mut b = ferrocoll::SharedBuffer::new(len)?;
            b.fill(T::from_small(0));
            Buffer::Shared(b)
        } else {
            Buffer::Heap(vec![T::from_small(0); len])
        })
    }
}

impl<T: Sample> std::ops::Deref for Buffer<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match self {
            Buffer::Heap(v) => v,
            Buffer::Shared(b) => b,
        }
    }
}

impl<T: Sample> std::ops::DerefMut for Buffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match self {
            Buffer::Heap(v) => v,
            Buffer::Shared(b) => b,
        }
    }
}

impl Setup {
    /// The op name for output: the reduction, or `none`.
    fn op_name(&self) -> &'static str {
        if self.coll.reduces() {
            self.op.name()
        } else {
            "none"
        }
    }

    /// The root for the table: the root, or -1 (as nccl-tests).
    fn root_column(&self) -> i64 {
        if self.coll.has_root() {
            self.root as i64
        } else {
            -1
        }
    }
}

/// One line of results: the `--json` object, field for field.
#[derive(Clone, Debug, Serialize)]
struct Row {
    coll: &'static str,
    bytes: usize,
    count: usize,
    dtype: &'static str,
    op: &'static str,
    ranks: usize,
    transport: &'static str,
    algo: &'static str,
    time_us: f64,
    /// Median time of one call (per rank, then the slowest rank's), in us:
    /// robust to the scheduler's hiccups on oversubscribed machines.
    median_us: f64,
    algbw: f64,
    busbw: f64,
    /// Wrong elements over all ranks; `None` (null) without `--check`.
    wrong: Option<u64>,
    /// The cost model's prediction for this call on the communicator's
    /// profile (null where it has no closed form, as for alltoallv).
    predicted_us: Option<f64>,
}

// ---- output --------------------------------------------------------------

const TABLE_HEADER: [&str; 2] = [
    "#        size         count    type   redop    root     time(us)  algbw(GB/s)  busbw(GB/s)   #wrong  algo                predicted(us)",
    "#         (B)    (elements)",
];

fn table_line(row: &Row, root: i64) -> String {
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

// ---- the ranks ---------------------------------------------------------------

/// Calls `$f::<T>($args)` with `T` the element type of `$dtype`.
macro_rules! with_dtype {
    ($dtype:expr, $f:ident($($arg:expr),* $(,)?)) => {
        match $dtype {
            DType::F32 => $f::<f32>($($arg),*),
            DType::F64 => $f::<f64>($($arg),*),
            DType::F16 => $f::<f16>($($arg),*),
            DType::BF16 => $f::<bf16>($($arg),*),
            DType::I8 => $f::<i8>($($arg),*),
            DType::I32 => $f::<i32>($($arg),*),
            DType::I64 => $f::<i64>($($arg),*),
            DType::U8 => $f::<u8>($($arg),*),
            DType::U32 => $f::<u32>($($arg),*),
            DType::U64 => $f::<u64>($($arg),*),
        }
    };
}

/// One rank's part of the sweep. Rank 0 prints each row as it completes and
/// returns the rows; the other ranks return nothing.
fn run_rank<T: Sample>(comm: &Communicator, setup: &Setup) -> Result<Vec<Row>, CliError> {
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

        // The same byte count the library passes to its choice (0 for
        // alltoallv, whose per-rank sizes differ).
        let (algo, _why) = tuned.choose(coll, comm.call_bytes(coll, size.count, setup.dtype))?;

        for _ in 0..setup.warmup {
            call(&tuned, coll, send, recv, op, root, &counts)?;
        }
        comm.barrier()?;
        let mut each = Vec::with_capacity(setup.iters);
        let start = Instant::now();
        for _ in 0..setup.iters {
            let t = Instant::now();
            call(&tuned, coll, send, recv, op, root, &counts)?;
            each.push(t.elapsed().as_secs_f64());
        }
        let mine = start.elapsed().as_secs_f64() / setup.iters as f64;
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
            call(&tuned, coll, send, recv, op, root, &counts)?;
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
                // Small calls on one host skip the plans (see
                // `Communicator::uses_fast_path`).
                algo: if tuned.uses_fast_path(coll, size.count, setup.dtype) {
                    "shm-fast"
                } else {
                    algo.name()
                },
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

/// Runs `ferrocoll bench`.
pub fn main(args: &BenchArgs) -> Result<(), CliError> {
    let coll = args.coll;
    let n = args.ranks;
    if coll.has_root() && args.root >= n {
        return Err(CliError::Usage(format!(
            "--root {} is not a rank; with {n} ranks use 0 to {}",
            args.root,
            n - 1
        )));
    }
    let options = algorithm_options(coll, &args.algo)?;
    // Report a bad FERROCOLL_* variable before printing anything
    // (local::run and init read the same variables again), including a
    // FERROCOLL_TOPO that does not fit the ranks.
    let config = ferrocoll::Config::from_env().map_err(CliError::Lib)?;
    if let Some(topo) = &config.topology {
        topo.check_size(n).map_err(|e| {
            CliError::Lib(ferrocoll::Error::Config {
                var: "FERROCOLL_TOPO".into(),
                value: topo.to_string(),
                reason: format!("{} (bench -n {n})", lib_message(e)),
            })
        })?;
    }
    if args.minbytes > args.maxbytes {
        return Err(CliError::Usage(format!(
            "--minbytes ({}) is larger than --maxbytes ({})",
            args.minbytes, args.maxbytes
        )));
    }
    let elem = args.dtype.size();
    let sizes = sweep(coll, n, elem, args.minbytes, args.maxbytes, args.stepfactor);
    if sizes.is_empty() {
        let unit = elem * if is_block(coll) { n } else { 1 };
        let alltoallv = if coll == Collective::AllToAllV {
            ", and an average of at least 1 element sent per rank"
        } else {
            ""
        };
        return Err(CliError::Usage(format!(
            "no size from {} to {} B holds a whole {coll} buffer: each needs at least {unit} B \
             ({} x {elem} B){alltoallv}; raise --maxbytes",
            args.minbytes,
            args.maxbytes,
            if is_block(coll) {
                format!("{n} ranks")
            } else {
                "1 element".into()
            },
        )));
    }
    let setup = Setup {
        coll,
        n,
        dtype: args.dtype,
        op: args.op,
        root: args.root,
        shared_buffers: args.buffers == "shared",
        options,
        sizes,
        warmup: args.warmup,
        iters: args.iters,
        check: !args.no_check,
        json: args.json,
        transport: args.transport,
    };

    // shm and tcp: this process starts the ranks (this same command, under
    // the launcher) unless it already is one of them.
    if setup.transport != Transport::Thread && !crate::run::in_job() {
        return launch_ranks(&setup);
    }

    let header = |rank: usize| -> Result<(), CliError> {
        if !setup.json && rank == 0 {
            let mut out = io::stdout().lock();
            writeln!(out, "{}", describe(&setup, &args.algo))?;
            writeln!(out, "#")?;
            for line in TABLE_HEADER {
                writeln!(out, "{line}")?;
            }
        }
        Ok(())
    };

    let outcomes = match setup.transport {
        Transport::Shm | Transport::Tcp => {
            // The header once start-up succeeded (it reports a bad
            // variable on its own).
            let comm = ferrocoll::init()?;
            header(comm.rank())?;
            if comm.size() != n {
                return Err(CliError::Usage(format!(
                    "bench -n {n} but the job has {} ranks; pass -n {}",
                    comm.size(),
                    comm.size()
                )));
            }
            let result = with_dtype!(setup.dtype, run_rank(&comm, &setup));
            if result.is_err() {
                comm.abort();
            }
            if comm.rank() != 0 {
                // Only rank 0 reports.
                return result.map(|_| ());
            }
            vec![result]
        }
        Transport::Thread => {
            header(0)?;
            ferrocoll::local::run(n, |comm| {
                let result = with_dtype!(setup.dtype, run_rank(&comm, &setup));
                if result.is_err() {
                    // Don't leave the other ranks waiting for this one until
                    // the timeout.
                    comm.abort();
                }
                result
            })?
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
        let mut out = io::stdout().lock();
        let avg_busbw = rows.iter().map(|r| r.busbw).sum::<f64>() / rows.len().max(1) as f64;
        writeln!(out, "#")?;
        if setup.check {
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
    }
    if wrong > 0 {
        return Err(CliError::Run(format!(
            "--check found {wrong} wrong elements in {coll} results"
        )));
    }
    Ok(())
}

/// Runs this same `bench` command as `n` processes under the launcher.
fn launch_ranks(setup: &Setup) -> Result<(), CliError> {
    crate::run::relaunch_self(setup.n, setup.transport.name(), "benchmark")
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_suffixes() {
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("1K"), Ok(1024));
        assert_eq!(parse_size("64m"), Ok(64 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("2KiB"), Ok(2048));
        assert!(parse_size("").is_err());
        assert!(parse_size("K").is_err());
        assert!(parse_size("1.5M").is_err());
        assert!(parse_size("12X").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999999999999T").is_err());
    }

    #[test]
    fn sweep_rounds_to_whole_blocks_and_skips_empty_ones() {
        let s = sweep(Collective::AllReduce, 4, 4, 8, 64 << 20, 4);
        assert_eq!(s.first(), Some(&Size { bytes: 8, count: 2 }));
        // The steps of 4 miss 64 MiB: the sweep ends there anyway.
        let tail: Vec<usize> = s[s.len() - 2..].iter().map(|z| z.bytes).collect();
        assert_eq!(tail, [32 << 20, 64 << 20]);
        // A sweep the steps end exactly on has no extra size.
        let s = sweep(Collective::AllReduce, 4, 4, 8, 32 << 20, 4);
        assert_eq!(s.last().unwrap().bytes, 32 << 20);
        assert_eq!(s.len(), 12);
        // 3 ranks of f32: 12-byte units; 8 B holds none.
        let s = sweep(Collective::AllGather, 3, 4, 8, 512, 4);
        assert_eq!(
            s,
            vec![
                Size {
                    bytes: 24,
                    count: 2
                },
                Size {
                    bytes: 120,
                    count: 10
                },
                Size {
                    bytes: 504,
                    count: 42
                },
            ]
        );
        assert!(sweep(Collective::AllToAll, 8, 8, 8, 32, 2).is_empty());
        // No overflow at the top of the range.
        assert!(!sweep(Collective::AllReduce, 2, 1, usize::MAX / 2, usize::MAX, 4).is_empty());
    }

    #[test]
    fn alltoallv_sizes_report_the_average_send_buffer() {
        // 3 ranks of f32: 12-byte units of one average element per block.
        let s = sweep(Collective::AllToAllV, 3, 4, 8, 512, 4);
        let blocks: Vec<usize> = s.iter().map(|z| z.count).collect();
        assert_eq!(blocks, [2, 10, 42]);
        for z in &s {
            let total: usize = (0..3)
                .map(|r| {
                    verify::alltoallv_counts(3, r, z.count)
                        .0
                        .iter()
                        .sum::<usize>()
                })
                .sum();
            assert_eq!(z.bytes, total / 3 * 4, "{z:?}");
        }
        // With b a multiple of 4, 3 ranks' weights average exactly 4.
        assert_eq!(sweep(Collective::AllToAllV, 3, 4, 48, 48, 4)[0].bytes, 48);
        // One rank sending itself b/4 elements: nothing below b = 4.
        assert_eq!(
            sweep(Collective::AllToAllV, 1, 1, 1, 8, 2),
            vec![Size { bytes: 1, count: 4 }, Size { bytes: 2, count: 8 }]
        );
        assert!(!sweep(Collective::AllToAllV, 2, 1, usize::MAX / 2, usize::MAX, 4).is_empty());
    }

    #[test]
    fn bus_factors_match_nccl_tests() {
        assert_eq!(bus_factor(Collective::AllReduce, 4), 1.5);
        assert_eq!(bus_factor(Collective::AllGather, 4), 0.75);
        assert_eq!(bus_factor(Collective::AllToAllV, 4), 0.75);
        assert_eq!(bus_factor(Collective::Broadcast, 4), 1.0);
    }

    #[test]
    fn algorithm_names_are_checked_per_collective() {
        assert!(algorithm_options(Collective::AllReduce, "auto")
            .unwrap()
            .algorithm
            .is_none());
        assert_eq!(
            algorithm_options(Collective::AllReduce, "Ring")
                .unwrap()
                .algorithm,
            Some(ferrocoll::Algorithm::Ring)
        );
        for good in ["direct", "pairwise", "hier"] {
            assert!(algorithm_options(Collective::AllToAllV, good).is_ok());
        }
        assert!(algorithm_options(Collective::AllToAllV, "bruck").is_err());
        for bad in ["linear", "bruck"] {
            let msg = algorithm_options(Collective::AllReduce, bad)
                .unwrap_err()
                .to_string();
            assert!(
                msg.contains(bad) && msg.contains("ring") && msg.contains("tree"),
                "{msg}"
            );
        }
    }

    #[test]
    fn collective_names() {
        assert_eq!(parse_collective("broadcast"), Ok(Collective::Broadcast));
        assert_eq!(parse_collective("all_reduce"), Ok(Collective::AllReduce));
        assert_eq!(parse_collective("alltoallv"), Ok(Collective::AllToAllV));
        assert!(parse_collective("barrier").is_err());
        assert!(parse_collective("allredux").is_err());
    }
}
