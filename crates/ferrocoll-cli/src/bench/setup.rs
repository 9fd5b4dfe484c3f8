//! The validated set-up of one `bench` run: [`Setup::from_args`] checks the
//! arguments (root, `--algo`, the `FERROCOLL_*` variables, the size range)
//! before anything is printed or started, and fixes the sizes to sweep.

use ferrocoll::{CallOptions, Collective, DType, ReduceOp};

use super::args::{algorithm_options, BenchArgs, Transport};
use super::sweep::{is_block, sweep, Size};
use crate::error::{lib_message, CliError};

/// Everything the ranks need, validated.
pub(super) struct Setup {
    pub(super) coll: Collective,
    pub(super) n: usize,
    pub(super) dtype: DType,
    pub(super) op: ReduceOp,
    pub(super) root: usize,
    pub(super) options: CallOptions,
    pub(super) sizes: Vec<Size>,
    pub(super) warmup: usize,
    pub(super) iters: usize,
    pub(super) check: bool,
    pub(super) json: bool,
    pub(super) transport: Transport,
    /// Send and receive buffers are `SharedBuffer`s.
    pub(super) shared_buffers: bool,
    /// `--compress`: the codec of a compressed allreduce.
    pub(super) compress: Option<String>,
    /// `--in-place`: the call is the collective's in-place form.
    pub(super) in_place: bool,
}

impl Setup {
    /// Checks `args` and builds the set-up every rank runs; the errors are
    /// the command's usage errors and the library's configuration errors.
    pub(super) fn from_args(args: &BenchArgs) -> Result<Setup, CliError> {
        let coll = args.coll;
        // Under a launcher the job decides how many ranks there are and
        // how they talk.
        let (n, transport) = super::args::ranks_and_transport(args.ranks, args.transport, 4);
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
        ferrocoll::local::check_env().map_err(CliError::Lib)?;
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
        if let Some(spec) = &args.compress {
            check_compress(args, spec, &sizes)?;
        }
        if args.in_place && coll != Collective::Broadcast {
            return Err(CliError::Usage(format!(
                "--in-place times bcast only (the form MPI_Bcast and torch's broadcast have); \
                 {coll} is timed out of place, as the peers' benchmarks time it"
            )));
        }
        if args.in_place && args.compress.is_some() {
            return Err(CliError::Usage(
                "--in-place and --compress do not go together (--compress is an allreduce)".into(),
            ));
        }
        Ok(Setup {
            compress: args.compress.clone(),
            in_place: args.in_place,
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
            transport,
        })
    }

    /// The op name for output: the reduction, or `none`.
    pub(super) fn op_name(&self) -> &'static str {
        if self.coll.reduces() {
            self.op.name()
        } else {
            "none"
        }
    }

    /// The root for the table: the root, or -1 (as nccl-tests).
    pub(super) fn root_column(&self) -> i64 {
        if self.coll.has_root() {
            self.root as i64
        } else {
            -1
        }
    }
}

/// What `--compress` needs: an allreduce of f32 that sums or averages, no
/// forced algorithm, and a codec the compressor accepts at every size.
fn check_compress(args: &BenchArgs, spec: &str, sizes: &[Size]) -> Result<(), CliError> {
    let refuse = |what: String| Err(CliError::Usage(format!("--compress {spec}: {what}")));
    if args.coll != Collective::AllReduce {
        return refuse(format!("only allreduce is compressed, not {}", args.coll));
    }
    if args.dtype != DType::F32 {
        return refuse(format!("the codecs take f32, not {}", args.dtype));
    }
    if !matches!(args.op, ReduceOp::Sum | ReduceOp::Avg) {
        return refuse(format!("compressed allreduces sum or avg, not {}", args.op));
    }
    if !args.algo.trim().eq_ignore_ascii_case("auto") {
        return refuse(format!(
            "--algo {} cannot be forced: the compressor runs all-to-alls, allgathers and \
             allreduces of its own (FERROCOLL_ALGO still applies to them)",
            args.algo
        ));
    }
    for size in sizes {
        ferrocoll::compress::collective::validate_spec(spec, size.count).map_err(CliError::Lib)?;
    }
    Ok(())
}
