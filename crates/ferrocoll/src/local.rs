//! In-process ranks: `n` threads over the zero-copy thread transport.
//!
//! The embedded default: tests, examples and `ferrocoll bench` use it with no
//! setup at all.
//!
//! ```
//! use ferrocoll::{local, ReduceOp};
//! let sums = local::run(4, |comm| {
//!     let mut v = vec![comm.rank() as f32; 3];
//!     comm.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
//!     v[0]
//! }).unwrap();
//! assert_eq!(sums, vec![6.0; 4]);
//! ```

use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;

use crate::comm::Communicator;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::transport::thread::ThreadFabric;

/// Runs `f` on `n` ranks (threads) with the configuration from the
/// environment (`FERROCOLL_ALGO`, `FERROCOLL_TIMEOUT`, ...) and returns each
/// rank's result in rank order.
///
/// A rank is gone once its closure has returned (or unwound) and dropped
/// every handle on its communicator (clones, split groups): the other
/// ranks' waits on it then fail at once with [`Error::PeerLost`] instead of
/// hanging until the deadline, and so does every other wait from then on,
/// each naming the first rank found gone (or the first that panicked), not
/// a rank that left after failing because of it. A panic is resumed here
/// once every rank has returned.
pub fn run<R, F>(n: usize, f: F) -> Result<Vec<R>>
where
    R: Send,
    F: Fn(Communicator) -> R + Sync,
{
    let config = Config::from_env()?;
    if let (Some(topo), true) = (&config.topology, n > 0) {
        // The topology came from FERROCOLL_TOPO: say so if it does not fit.
        topo.check_size(n).map_err(|e| {
            crate::env::bad(
                "FERROCOLL_TOPO",
                &topo.to_string(),
                format!("{} ({n} ranks)", crate::env::reason(e)),
            )
        })?;
    }
    run_with(n, config, f)
}

/// [`run`] with an explicit configuration (of the environment only the
/// transport's `FERROCOLL_SPIN_US` is read; a bad value is an
/// [`Error::Config`]).
pub fn run_with<R, F>(n: usize, config: Config, f: F) -> Result<Vec<R>>
where
    R: Send,
    F: Fn(Communicator) -> R + Sync,
{
    if n == 0 {
        return Err(Error::invalid("local::run needs at least one rank"));
    }
    if let Some(topo) = &config.topology {
        topo.check_size(n)?;
    }
    let spin = spin_from_env()?;
    let fabric = ThreadFabric::with_spin(n, spin);
    let mut spawn_error = None;
    let outcomes: Vec<std::thread::Result<R>> = std::thread::scope(|scope| {
        let mut handles = Vec::with_capacity(n);
        for rank in 0..n {
            let comm = Communicator::new(Arc::new(fabric.transport(rank)), config.clone())
                .expect("topology size checked above");
            let (f, fabric) = (&f, &fabric);
            let spawned = std::thread::Builder::new()
                .name(format!("ferrocoll-rank-{rank}"))
                .spawn_scoped(scope, move || {
                    // A rank that returns leaves by dropping `comm`'s last
                    // handle (see `ThreadFabric::transport`); one that
                    // panics is marked here too, in case a handle outlives
                    // the unwinding.
                    let out = panic::catch_unwind(AssertUnwindSafe(|| f(comm)));
                    if out.is_err() {
                        fabric.mark_lost(rank);
                    }
                    out
                });
            match spawned {
                Ok(h) => handles.push(h),
                Err(e) => {
                    // The ranks already started would wait for this one
                    // forever: abort them, then report.
                    fabric.abort();
                    spawn_error = Some(Error::invalid(format!(
                        "could not start a thread for rank {rank} of {n}: {e}; use fewer ranks"
                    )));
                    break;
                }
            }
        }
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(Err))
            .collect()
    });
    if let Some(e) = spawn_error {
        return Err(e);
    }
    let mut results = Vec::with_capacity(n);
    for outcome in outcomes {
        match outcome {
            Ok(r) => results.push(r),
            Err(payload) => panic::resume_unwind(payload),
        }
    }
    Ok(results)
}

/// `FERROCOLL_SPIN_US`, the one knob of the process transports that a run
/// of threads honours (how long a waiting rank polls before it sleeps).
/// Only that variable is read: the others are the process transports' and
/// cannot fail a run of threads.
fn spin_from_env() -> Result<Option<std::time::Duration>> {
    let spin_only = |name: &str| {
        (name == "FERROCOLL_SPIN_US")
            .then(|| crate::env::process(name))
            .flatten()
    };
    Ok(crate::transport::config::TransportConfig::from_lookup(spin_only)?.spin)
}

/// Checks the environment variables [`run`] reads ([`Config::from_env`]'s
/// and `FERROCOLL_SPIN_US`, which [`run_with`] reads too), so that a
/// program can refuse a bad one before it prints or starts anything.
pub fn check_env() -> Result<()> {
    Config::from_env()?;
    spin_from_env()?;
    Ok(())
}
