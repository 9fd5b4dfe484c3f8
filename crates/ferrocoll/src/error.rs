//! The one error type of ferrocoll.
//!
//! Every message says what went wrong and what to do about it; errors that
//! come from waiting on a peer name the collective, its sequence number, this
//! rank and the peer.

use std::time::Duration;

/// Result alias used throughout ferrocoll.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong in a ferrocoll call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The caller passed something the call cannot accept (a buffer of the
    /// wrong length, a root or peer outside the group, ...). The message says
    /// what to change.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// An algorithm name the collective does not have (from `FERROCOLL_ALGO`
    /// or a per-call option).
    #[error("unknown algorithm `{name}` for {collective}; valid names: {valid}")]
    UnknownAlgorithm {
        /// The collective the name was given for.
        collective: String,
        /// The name that was given.
        name: String,
        /// Comma-separated list of the names that would work.
        valid: String,
    },

    /// A configuration value (environment variable) could not be used.
    #[error("bad configuration {var}={value:?}: {reason}")]
    Config {
        /// The environment variable.
        var: String,
        /// Its value.
        value: String,
        /// Why it was rejected and what to set instead.
        reason: String,
    },

    /// A wait exceeded its deadline.
    #[error(
        "timeout: rank {rank} waited {waited:?} in {collective} ({}) for rank {peer}; \
         check that every rank calls the same collectives in the same order, or raise \
         FERROCOLL_TIMEOUT{}",
        position(collective, *seq),
        desync(report)
    )]
    Timeout {
        /// The collective (or `send`/`recv`) that was waiting.
        collective: String,
        /// Its sequence number on this communicator; for `send`/`recv`, the
        /// message tag.
        seq: u64,
        /// This rank (in the communicator).
        rank: usize,
        /// The peer it was waiting for (in the communicator).
        peer: usize,
        /// How long it waited.
        waited: Duration,
        /// Where every rank of the communicator was when the wait ended, as
        /// far as the reachable peers answered (`rank 3: in all_reduce #183;
        /// rank 7: finished #182, in no call; ...`); empty when the
        /// transport cannot ask (the desync report).
        report: String,
    },

    /// Two ranks called different collectives (or the same one with
    /// different counts, types, operators or roots) at the same point.
    #[error(
        "collective mismatch: rank {rank} called {local} but rank {peer} called {remote} at the \
         same point; every rank must call the same collectives in the same order with matching \
         arguments"
    )]
    Mismatch {
        /// This rank.
        rank: usize,
        /// The call this rank made.
        local: String,
        /// The peer whose message disagreed.
        peer: usize,
        /// The call the peer made.
        remote: String,
    },

    /// A peer went away (its thread panicked or its process died).
    #[error("rank {rank} is gone (it failed or exited); the communicator cannot continue")]
    PeerLost {
        /// The peer that is gone.
        rank: usize,
    },

    /// The communicator was aborted.
    #[error("the communicator was aborted")]
    Aborted,

    /// A message arrived with a checksum that does not match its bytes
    /// (`FERROCOLL_CHECKSUM=1`): memory or link corruption on the way.
    #[error(
        "corrupted message: rank {rank} received from rank {peer} in {collective} bytes whose \
         CRC32C does not match the sender's; suspect the link or the memory of either host"
    )]
    Corrupted {
        /// This rank.
        rank: usize,
        /// The rank that sent the message.
        peer: usize,
        /// The call the message belonged to.
        collective: String,
    },

    /// Start-up (`init`) could not complete: ranks that did not arrive at
    /// the rendezvous in time (the message lists them and says what to
    /// check), or a rendezvous nobody serves.
    #[error("start-up failed: {0}")]
    Startup(String),

    /// Something inside ferrocoll went wrong (an inconsistent plan, a
    /// background operation that panicked): a bug, reported rather than
    /// risking memory safety.
    #[error("internal error: {0}; please report it to the ferrocoll developers")]
    Internal(String),
}

/// How a timeout names its call: a collective by its sequence number, a
/// point-to-point message by its tag.
fn position(collective: &str, seq: u64) -> String {
    if collective.starts_with("send/recv") {
        format!("tag {seq}")
    } else {
        format!("call #{seq}")
    }
}

/// The desync report of a timeout, when there is one.
fn desync(report: &str) -> String {
    if report.is_empty() {
        String::new()
    } else {
        format!("; where every rank is: {report}")
    }
}

impl Error {
    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid(msg: impl Into<String>) -> Error {
        Error::InvalidArgument(msg.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeout(collective: &str, seq: u64, report: &str) -> String {
        Error::Timeout {
            collective: collective.into(),
            seq,
            rank: 0,
            peer: 1,
            waited: Duration::from_secs(1),
            report: report.into(),
        }
        .to_string()
    }

    #[test]
    fn a_timeout_names_a_tag_as_a_tag_and_a_call_by_its_number() {
        // Every transport builds its timeouts this way: the engine and the
        // fast path (shm, tcp) and the thread transport.
        let p2p = timeout("send/recv(count=4, f32)", 77, "");
        assert!(p2p.contains("(tag 77)") && !p2p.contains("call #"), "{p2p}");
        let coll = timeout("allreduce(count=4, f32, sum)", 77, "");
        assert!(coll.contains("(call #77)"), "{coll}");
        assert!(!coll.contains("where every rank is"), "{coll}");
        let reported = timeout("allreduce(count=4, f32, sum)", 3, "rank 1: gone");
        assert!(
            reported.ends_with("; where every rank is: rank 1: gone"),
            "{reported}"
        );
    }
}
