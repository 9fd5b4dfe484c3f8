//! Where the ranks run. With `--transport thread` they are threads of this
//! process ([`as_threads`]). With shm or tcp they are processes: outside a
//! job this process starts them, as this same command under `ferrocoll run`
//! ([`relaunch`]); inside one (a launcher's variables set) it is one of them
//! ([`as_job_rank`]).

use super::output::Row;
use super::rank::run_rank;
use super::setup::Setup;
use crate::error::CliError;

/// What one rank's sweep returned: its rows on rank 0, or why it failed.
pub(super) type Outcome = Result<Vec<Row>, CliError>;

/// Runs this same `bench` command as `n` processes under the launcher.
pub(super) fn relaunch(setup: &Setup) -> Result<(), CliError> {
    crate::run::relaunch_self(setup.n, setup.transport.name(), "benchmark")
}

/// This process as one rank of a job: joins it (`ferrocoll::init`), prints
/// the header through `header` (which prints on rank 0 only), and runs its
/// part of the sweep. Rank 0 gets its outcome back to report; another rank
/// gets `None` once done, or its error.
pub(super) fn as_job_rank(
    setup: &Setup,
    header: &dyn Fn(usize) -> Result<(), CliError>,
) -> Result<Option<Outcome>, CliError> {
    let n = setup.n;
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
    let result = run_rank(&comm, setup);
    if result.is_err() {
        comm.abort();
    }
    if comm.rank() != 0 {
        // Only rank 0 reports.
        return result.map(|_| None);
    }
    Ok(Some(result))
}

/// The `n` ranks as threads of this process (`ferrocoll::local`): every
/// rank's outcome, in rank order.
pub(super) fn as_threads(setup: &Setup) -> Result<Vec<Outcome>, CliError> {
    Ok(ferrocoll::local::run(setup.n, |comm| {
        let result = run_rank(&comm, setup);
        if result.is_err() {
            // Don't leave the other ranks waiting for this one until
            // the timeout.
            comm.abort();
        }
        result
    })?)
}
