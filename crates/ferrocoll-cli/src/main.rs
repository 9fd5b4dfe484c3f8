//! The `ferrocoll` command.
//!
//! Subcommands:
//!
//! * `bench`: an nccl-tests-style sweep of one collective (alltoallv
//!   included, with uneven blocks) over a range of message sizes, printing
//!   time, algorithm and bus bandwidth per size; `bench moe`: MoE dispatch
//!   and combine on a router's workload.
//!
//! * `model`: the cost model's prediction for every algorithm of a
//!   collective, with the choice, n* and the crossover sizes; `model moe`:
//!   an MoE layer's dispatch and combine.
//!
//! * `calibrate`: measures the machine and fits the cost model's profile.
//!
//! * `tune`: times every candidate algorithm of each collective on this
//!   launch and writes the table `auto` then trusts where it covers a call.
//!
//! * `run`: starts N local processes of a program, one per rank (as
//!   torchrun / mpirun on one host), with the `FERROCOLL_*` rendezvous
//!   environment, rank-prefixed output and stop-all-on-first-failure.
//!
//! * `topo`: under a launcher, what the run sees: hosts, nodes, topology
//!   and the link (shm or tcp) between every pair of ranks.
//!
//! * `store`: serves a job's rendezvous store as a separate process.
//!
//! * `sim`: runs a collective's plans on a modelled cluster
//!   (crates/ferrocoll-sim) and reports time, link load and energy.

mod bench;
mod bench_moe;
mod bench_overlap;
mod calibrate;
mod error;
mod model;
mod model_compress;
mod model_moe;
mod run;
mod sim;
mod sim_compress;
mod sim_moe;
mod store;
mod topo;
mod tune;
mod verify;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::error::CliError;

/// Collective communication for Rust: benchmarks and tools.
#[derive(Debug, Parser)]
#[command(name = "ferrocoll", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Measure one collective over a sweep of sizes (as nccl-tests does).
    ///
    /// Ranks are threads of this process (transport `thread`), or processes
    /// started through `ferrocoll run` (`--transport shm|tcp`). Sizes count
    /// the whole buffer as nccl-tests does: for allgather, reducescatter,
    /// alltoall, gather and scatter the size is all n blocks, so each rank's
    /// block is size/n; `count` is size / element size, as nccl-tests prints
    /// it. alltoallv sends uneven blocks (rank s sends rank d
    /// floor(b * (1 + (s + 2d) mod 7) / 4) elements, b = size / (n * element
    /// size)) and reports as its size the average send buffer: all ranks'
    /// send counts together / n, in whole elements. `bench overlap`
    /// measures how much gradient communication hides behind a backward
    /// pass, `bench moe` an MoE layer's dispatch and combine.
    Bench(bench_overlap::BenchCommand),
    /// Predict what every algorithm of a collective costs (alpha-beta-gamma
    /// closed forms), without running anything; `model moe` prices an MoE
    /// layer's dispatch and combine.
    Model(model_moe::ModelCommand),
    /// Measure this machine and fit the cost model's alpha, beta and gamma;
    /// writes the profile the library then predicts with.
    Calibrate(calibrate::CalibrateArgs),
    /// Time every candidate algorithm of each collective on this launch
    /// (transport, ranks, topology) over a sweep of sizes and write the
    /// table `auto` trusts before the cost model (beside the profile;
    /// FERROCOLL_TUNE selects another or `off`).
    Tune(tune::TuneArgs),
    /// Start N local processes of a program, one per rank (as torchrun or
    /// mpirun on one host), and stop them all when one fails.
    ///
    /// Each rank gets FERROCOLL_RANK, FERROCOLL_WORLD_SIZE,
    /// FERROCOLL_LOCAL_RANK, FERROCOLL_LOCAL_WORLD_SIZE, FERROCOLL_ADDR,
    /// FERROCOLL_SECRET and FERROCOLL_JOB_ID. The exit status is the first
    /// failing rank's (128 + N for signal N), 124 on --timeout, 0 when all
    /// ranks exit 0.
    Run(run::RunArgs),
    /// Show what a multi-process run sees: hosts, nodes, the topology and
    /// the link between every pair of ranks. Run it under a launcher:
    /// `ferrocoll run -n 4 ferrocoll topo`.
    Topo(topo::TopoArgs),
    /// Serve a job's rendezvous store as a process of its own (instead of
    /// rank 0); the ranks then run with FERROCOLL_STORE=external.
    Store(store::StoreArgs),
    /// Simulate a collective's plans on a modelled cluster (switch,
    /// two-level nodes, fat-tree): time, bandwidth, link load, energy;
    /// `sim moe` runs an MoE layer's dispatch and combine.
    Sim(sim_moe::SimCommand),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bench(args) => bench_overlap::main(&args),
        Command::Model(args) => model_moe::main(&args),
        Command::Calibrate(args) => calibrate::main(&args),
        Command::Tune(args) => tune::main(&args),
        Command::Topo(args) => topo::main(&args),
        Command::Store(args) => store::main(&args),
        Command::Sim(args) => sim_moe::main(&args),
        Command::Run(args) => match run::run(args) {
            Ok(code) => return code,
            Err(e) => Err(e),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader of our output went away (`ferrocoll bench | head`):
        // nothing left to say to anyone.
        Err(CliError::BrokenPipe) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ferrocoll: error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
