//! Helpers shared by the thread transport's tests (`thread_p2p.rs`,
//! `thread_faults.rs`): the deadline of every wait, what counts as fast, and
//! running a closure on ranks as threads with its time on each.

use std::time::{Duration, Instant};

use ferrocoll::transport::{CallKind, Signature};
use ferrocoll::{local, Communicator, Config, DType, Result};

/// The deadline of every wait in these tests: far beyond what any of them
/// should take.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// An error that is "immediate" arrives within this (a tenth of the
/// deadline; the transport notices within milliseconds, the rest is slack
/// for a loaded 2-core machine).
pub const FAST: Duration = Duration::from_secs(2);

/// The configuration of every run in these tests: waits end at [`DEADLINE`].
pub fn cfg() -> Config {
    Config::default().with_timeout(DEADLINE)
}

/// Runs `f` on `n` ranks and returns each rank's result with how long `f`
/// took on it.
pub fn timed<R: Send>(
    n: usize,
    f: impl Fn(&Communicator) -> Result<R> + Sync,
) -> Vec<(Result<R>, Duration)> {
    local::run_with(n, cfg(), |comm| {
        let start = Instant::now();
        let r = f(&comm);
        (r, start.elapsed())
    })
    .unwrap()
}

/// The signature text of a point-to-point message of `count` elements.
pub fn p2p_sig(dtype: DType, count: usize) -> String {
    Signature {
        kind: CallKind::PointToPoint,
        dtype,
        op: None,
        count,
        root: None,
    }
    .to_string()
}
