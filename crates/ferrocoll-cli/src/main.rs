//! The `ferrocoll` command.
//!
//! Subcommands:
//!
//! * `bench`: an nccl-tests-style sweep of one collective (alltoallv
//!   included, with uneven blocks) over a range of message sizes, printing
//!   time, algorithm and bus bandwidth per size.
//!
//! * `model`: the cost model's prediction for every algorithm of a
//!   collective, with the choice, n* and the crossover sizes.
//!
//! * `calibrate`: measures the machine and fits the cost model's profile.
//!
//! `run`, `sim` and `topo` are planned; each gets a variant of
//! [`Command`] and a module of its own.

mod bench;
mod calibrate;
mod error;
mod model;
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
    /// Ranks are threads of this process (transport `thread`). Sizes count
    /// the whole buffer as nccl-tests does: for allgather, reducescatter,
    /// alltoall, gather and scatter the size is all n blocks, so each rank's
    /// block is size/n; `count` is size / element size, as nccl-tests prints
    /// it. alltoallv sends uneven blocks (rank s sends rank d
    /// floor(b * (1 + (s + 2d) mod 7) / 4) elements, b = size / (n * element
    /// size)) and reports as its size the average send buffer: all ranks'
    /// send counts together / n, in whole elements.
    Bench(bench::BenchArgs),
    /// Predict what every algorithm of a collective costs (alpha-beta-gamma
    /// closed forms), without running anything.
    Model(model::ModelArgs),
    /// Measure this machine and fit the cost model's alpha, beta and gamma;
    /// writes the profile the library then predicts with.
    Calibrate(calibrate::CalibrateArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bench(args) => bench::main(&args),
        Command::Model(args) => model::main(&args),
        Command::Calibrate(args) => calibrate::main(&args),
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
