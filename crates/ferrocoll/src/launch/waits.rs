//! The start-up's waits on the rendezvous store, and the errors they end
//! in: [`wait_for_ranks`] waits for one key per rank and, when some never
//! come, fails with an [`Error::Startup`] naming the ranks that did not
//! arrive ([`not_arrived`]); [`store_error`] says which step a store's
//! configuration error happened in; [`connect_timeout`] is how long each
//! step may wait.
//!
//! Shared by [`init`](super::init) (every step of the start-up) and
//! [`node`](super::node) (the shared-memory set-up of one host).

use std::time::{Duration, Instant};

use super::rendezvous::Rendezvous;
use crate::error::{Error, Result};

/// Waits for `keys`, the key of each rank of `ranks` in turn; a wait that
/// fails while some are still missing is an [`Error::Startup`] that says
/// which ranks did not arrive within how long and what to check, not a
/// blame on `FERROCOLL_TIMEOUT`. `me` is this rank and the world's size;
/// `what` the step of the start-up; `timeout` the configured deadline.
pub(super) fn wait_for_ranks(
    store: &mut dyn Rendezvous,
    keys: &[String],
    ranks: &[usize],
    me: (usize, usize),
    what: &str,
    timeout: Duration,
) -> Result<Vec<Vec<u8>>> {
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let start = Instant::now();
    store
        .wait(&refs)
        .map_err(|e| not_arrived(store, e, keys, ranks, me, what, timeout, start.elapsed()))
}

/// The error for a start-up wait that failed after `waited`: an
/// [`Error::Startup`] naming the ranks of `ranks` whose `keys` the store
/// says are still missing, or the store's own error when it cannot tell
/// (then nothing is missing, or the store is gone).
#[allow(clippy::too_many_arguments)]
pub(super) fn not_arrived(
    store: &mut dyn Rendezvous,
    err: Error,
    keys: &[String],
    ranks: &[usize],
    me: (usize, usize),
    what: &str,
    timeout: Duration,
    waited: Duration,
) -> Error {
    if let Error::Startup(_) = err {
        // Rank 0's verdict, through the store: it names the missing ranks.
        return err;
    }
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let missing: Vec<usize> = match store.missing(&refs) {
        Some(idx) if !idx.is_empty() => idx.iter().filter_map(|&i| ranks.get(i).copied()).collect(),
        _ => return store_error(err, what),
    };
    let (rank, size) = me;
    let who = match missing.as_slice() {
        [one] => format!("rank {one}"),
        many => format!("ranks {}", rank_list(many)),
    };
    Error::Startup(format!(
        "rank {rank} of {size}: {who} did not arrive at the rendezvous within {:.1} s (store at \
         {}, {what}); check that every rank was started and is still running (a rank that \
         failed before init printed why), and that all ranks were given the same rendezvous \
         address (FERROCOLL_ADDR, or MASTER_ADDR and MASTER_PORT) and world size ({size}); each \
         start-up step waits FERROCOLL_TIMEOUT, within 1 s and 120 s ({:.1} s here)",
        waited.as_secs_f64(),
        store.describe(),
        connect_timeout(timeout).as_secs_f64(),
    ))
}

/// Ranks for a message: `1, 3, 5-9` (runs of three or more as ranges).
pub(super) fn rank_list(ranks: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        if j >= i + 2 {
            parts.push(format!("{}-{}", ranks[i], ranks[j]));
        } else {
            parts.extend(ranks[i..=j].iter().map(usize::to_string));
        }
        i = j + 1;
    }
    parts.join(", ")
}

/// How long each start-up step may wait: the configured deadline, within
/// 1 s and 120 s.
pub(super) fn connect_timeout(timeout: Duration) -> Duration {
    timeout
        .min(Duration::from_secs(120))
        .max(Duration::from_secs(1))
}

/// `e` with the start-up step `what` added to the reason of a
/// configuration error (other errors unchanged).
pub(super) fn store_error(e: Error, what: &str) -> Error {
    match e {
        Error::Config { var, value, reason } => Error::Config {
            var,
            value,
            reason: format!("{reason} (during {what})"),
        },
        other => other,
    }
}
