//! The arguments of `ferrocoll bench` and their parsers: the collectives it
//! measures, the transports it runs over, sizes with their K/M/G/T suffixes,
//! and the check of `--algo` against the collective's algorithms.

use clap::Args;
use ferrocoll::{CallOptions, Collective, DType, ReduceOp};

use crate::error::lib_message;

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

    /// Number of ranks (default: 4; under a launcher, the job's ranks).
    #[arg(short = 'n', long, value_parser = at_least::<1>)]
    pub ranks: Option<usize>,

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
    /// `shm` (processes on this host, shared memory), `tcp` (processes,
    /// TCP over loopback) or `auto` (processes: shared memory within a
    /// host, TCP between hosts). For shm, tcp and auto, bench starts its
    /// ranks itself through `ferrocoll run`; under a launcher
    /// (FERROCOLL_RANK, torchrun, mpirun, srun set) it joins that job
    /// instead. Default: thread, and auto under a launcher.
    #[arg(long, value_parser = parse_transport)]
    pub transport: Option<Transport>,

    /// Time the in-place form (bcast only: `broadcast_in_place`, one
    /// buffer on every rank, as `MPI_Bcast` and `torch.distributed.broadcast`
    /// are, so that a comparison with them does not charge ferrocoll the
    /// root's copy of its input into its output that they never make).
    #[arg(long)]
    pub in_place: bool,

    /// Where the send and receive buffers live: `heap` (a Vec) or `shared`
    /// (`ferrocoll::SharedBuffer`, which ranks on one host read in place,
    /// as NCCL's ncclMemAlloc or MPI_Alloc_mem buffers).
    #[arg(long, default_value = "heap", value_parser = ["heap", "shared"])]
    pub buffers: String,

    /// Compress the allreduce with CODEC (`ferrocoll::compress::Compressor`):
    /// fp16, bf16, int8[:BLOCK], onebit[:BLOCK], topk:K, randk:K[:SEED],
    /// powersgd[:RANK[:ROWSxCOLS]]. Reports the wire bytes and the effective
    /// bandwidth, computed on the uncompressed size. Allreduce of f32 only,
    /// op sum or avg, --algo auto (the compressor chooses its collectives).
    #[arg(long, value_name = "CODEC")]
    pub compress: Option<String>,
}

impl BenchArgs {
    /// The arguments of a bare `ferrocoll bench` (every default).
    pub fn defaults() -> BenchArgs {
        use clap::{Args as _, FromArgMatches as _};
        let matches =
            BenchArgs::augment_args(clap::Command::new("bench")).get_matches_from(["bench"]);
        BenchArgs::from_arg_matches(&matches).expect("the defaults parse")
    }
}

/// The ranks and transport of a benchmark: as given, else, under a
/// launcher, the job's size and `auto` (shm within a host, tcp between),
/// else `default_ranks` threads.
pub fn ranks_and_transport(
    ranks: Option<usize>,
    transport: Option<Transport>,
    default_ranks: usize,
) -> (usize, Transport) {
    let job_size = crate::run::in_job()
        .then(|| ferrocoll::world::WorldSpec::from_env().ok().map(|s| s.size))
        .flatten();
    let n = ranks.or(job_size).unwrap_or(default_ranks);
    let transport = transport.unwrap_or(if job_size.is_some() {
        Transport::Auto
    } else {
        Transport::Thread
    });
    (n, transport)
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
    /// Ranks are processes: shared memory within a host, TCP between.
    Auto,
}

impl Transport {
    /// The lowercase name `--transport` takes: `thread`, `shm`, `tcp` or
    /// `auto`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Transport::Thread => "thread",
            Transport::Shm => "shm",
            Transport::Tcp => "tcp",
            Transport::Auto => "auto",
        }
    }
}

fn parse_collective(s: &str) -> Result<Collective, String> {
    let names = BENCHED.map(|c| c.name()).join(", ");
    match Collective::from_name(s) {
        Some(c) if BENCHED.contains(&c) => Ok(c),
        Some(c) => Err(format!(
            "bench does not measure {c} yet; use one of: {names}"
        )),
        None => Err(format!(
            "unknown collective; use one of: {names} (or `bench moe` for MoE dispatch/combine)"
        )),
    }
}

fn parse_dtype(s: &str) -> Result<DType, String> {
    s.parse().map_err(lib_message)
}

fn parse_op(s: &str) -> Result<ReduceOp, String> {
    s.parse().map_err(lib_message)
}

/// Parses `--transport`: thread, shm, tcp or auto.
pub fn parse_transport(s: &str) -> Result<Transport, String> {
    match s.to_ascii_lowercase().as_str() {
        "thread" => Ok(Transport::Thread),
        "shm" => Ok(Transport::Shm),
        "tcp" => Ok(Transport::Tcp),
        "auto" => Ok(Transport::Auto),
        _ => Err("unknown transport; use thread, shm, tcp or auto".into()),
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
pub(super) fn algorithm_options(
    coll: Collective,
    name: &str,
) -> Result<CallOptions, ferrocoll::Error> {
    let unknown = || ferrocoll::plan::unknown_algorithm(coll, name.trim());
    let options = CallOptions::algorithm_named(name.trim()).map_err(|_| unknown())?;
    match options.algorithm {
        Some(a) if a.for_collective(coll).is_none() => Err(unknown()),
        _ => Ok(options),
    }
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
