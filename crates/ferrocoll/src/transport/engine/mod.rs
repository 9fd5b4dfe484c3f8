//! The progress engine shared by the shared-memory and TCP transports.
//!
//! It turns [`Transport::exchange`](crate::transport::Transport::exchange)
//! calls into frames ([`super::wire`]) on one [`Channel`](super::channel::Channel)
//! per peer and back. All state sits behind one mutex; whichever thread of
//! the rank holds it moves every channel forward: it writes queued frames of
//! any call, and hands arriving payload straight to the sink of the call
//! that posted the matching receive, or keeps it as an *unexpected* message
//! when no call has posted one yet (a peer that is a round ahead, a `send`
//! before its `recv`). So calls running on several threads at once
//! (non-blocking collectives, point-to-point) progress each other, as in an
//! MPI progress engine, and nothing is copied twice on the common path.
//!
//! Besides data, the engine speaks a few control frames (see
//! [`super::wire`]): remote and shared data with their acknowledgements (the
//! receiver reads the sender's memory in place), abort, a goodbye when the
//! transport is dropped (so the channel closing next is a clean exit), a
//! lost-rank notice (a peer vanished without a goodbye, or left while a
//! call waited on it: every call fails naming it) and a mismatch verdict
//! (every rank of the communicator fails alike, see `verdict.rs`).
//!
//! # Layout
//!
//! * `core.rs`, `receive.rs`: the sans-IO core ([`Core`]): calls,
//!   matching in FIFO order per peer and key, unexpected messages, the
//!   receive state of every stream. Bytes and `now` in; writes, completions
//!   and verdicts out. No clock, channel, socket or thread inside, so it is
//!   unit-tested alone (`tests.rs`).
//! * `faults.rs`: lost peers, crashes, mismatches (here, reported, late),
//!   aborts, goodbyes, and what a bypass call asks the engine to check.
//! * `ledger.rs`: finished calls and reported verdicts ([`Ledger`]), shared
//!   with a bypass.
//! * `desync.rs`: probes of a call that waits long (a mismatch no message
//!   reveals) and the positions peers answer with (the desync report).
//! * `verdict.rs`: a mismatch verdict ([`Verdict`]: the two ranks and their
//!   calls) and its frame; verdicts of collectives reach every rank.
//! * `frames.rs`: queued frames, receive states, control frames.
//! * `driver.rs`: the [`Engine`] itself: channels, the TCP connector and
//!   lazy peers, remote reads (another process's memory), environment
//!   knobs and the frame-corrupting test hook, the [`Bypass`] a small-call
//!   path plugs in and the [`Link`] it gets back.
//! * `wait.rs`: the waiting loop (polling, `poll(2)`, the doorbell).
//!
//! Small collectives among the ranks of one host may bypass all of this
//! ([`super::fastpath`]). The engine sees such a path only as a
//! [`Bypass`]: it asks it for strays (messages of calls the engine runs or
//! finished: the peer took the other path, a mismatch, not a hang) when a
//! call starts, waits and ends; the bypass sees the engine only through
//! [`Link`].

mod core;
mod desync;
mod driver;
mod faults;
mod frames;
mod ledger;
mod receive;
#[cfg(test)]
mod tests;
mod verdict;
mod wait;

pub(crate) use driver::{Bypass, Engine, Link, SPIN_DEDICATED};
pub(crate) use faults::{Fault, Stray};
pub(crate) use ledger::{Ledger, LedgerLock};
pub(crate) use verdict::Verdict;
pub(crate) use wait::{LocalBell, SLEEP_SLICE};
