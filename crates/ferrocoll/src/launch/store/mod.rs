//! The rendezvous key-value store of a multi-process job.
//!
//! Rank 0 serves it on TCP ([`StoreServer`]); every rank, rank 0 included,
//! connects to it as a client ([`StoreClient`]). The ranks use it at start-up
//! to exchange listening addresses and host identities, and `split` uses it
//! to agree on new groups. Like torch's `TCPStore` it is small and strict:
//! a flat map from string keys to byte values, with `set`, `get`, `wait`,
//! `add` and `delete`, plus a [`StoreClient::barrier`] built from `add` and
//! `wait`.
//!
//! # Protocol
//!
//! Everything travels in frames: a `u32` little-endian length, then that many
//! payload bytes. Inside a payload, integers are little-endian and a
//! variable-length field (a key, a value, a message) is again a `u32` length
//! followed by its bytes.
//!
//! 1. **Hello.** The first frame from a client is `"FCST"`, the protocol
//!    version (`u32`) and the job's secret (the rest of the frame). The server
//!    compares the secret in constant time; on a mismatch it answers a
//!    `BAD_SECRET` frame and closes the connection, on a version mismatch an
//!    `ERROR` frame with a message. A first frame without the magic (some
//!    other program talking to the port) is closed without an answer.
//! 2. **Requests.** Each later frame is one request, answered by exactly one
//!    response frame, in order. A request is an opcode byte and its fields:
//!
//!    | opcode     | fields                                   | `OK` response      |
//!    |------------|------------------------------------------|--------------------|
//!    | 1 `SET`    | key, value                               | (empty)            |
//!    | 2 `GET`    | key                                      | value, or `ABSENT` |
//!    | 3 `WAIT`   | wait in ms (`u64`, `u64::MAX` = forever), key count (`u32`), keys | count, values |
//!    | 4 `ADD`    | key, delta (`i64`)                       | new value (`i64`)  |
//!    | 5 `DELETE` | key                                      | (empty)            |
//!
//!    A response starts with a status byte: 0 `OK`, 1 `ABSENT`, 2 `TIMEOUT`
//!    (followed by the index, `u32`, of the first key still missing),
//!    3 `ERROR` (followed by a message), 4 `BAD_SECRET`, 5 `FAILED` (a
//!    `WAIT` only, followed by a message: the store's owner gave up the
//!    start-up, [`StoreServer::fail_waits`], and says why).
//!
//! `WAIT` never blocks other clients: the server thread of the waiting
//! connection sleeps on a condition variable until the keys are all set or
//! the wait the client sent (its remaining time) has passed. `ADD` keeps the
//! counter as ASCII decimal text, so a `get` of a counter reads e.g. `b"42"`.
//!
//! Keys are at most 4 KiB and values at most 64 MiB; clients refuse larger
//! ones with [`Error::InvalidArgument`], the server closes a connection that
//! sends them anyway. Every client call has a deadline (the client's timeout);
//! past it the call fails with an error that names the key and the store's
//! address.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::{Error, Result};

mod client;
mod server;
#[cfg(test)]
mod tests;

pub use client::StoreClient;
#[doc(hidden)]
pub use server::fuzz_connection;
pub use server::StoreServer;

/// The magic that opens a client's hello.
const MAGIC: &[u8; 4] = b"FCST";
/// The protocol version in the hello.
const VERSION: u32 = 1;
/// The longest key.
pub const MAX_KEY_LEN: usize = 4 << 10;
/// The longest value.
pub const MAX_VALUE_LEN: usize = 64 << 20;
/// The longest request frame the server reads (a `SET` of the longest key and
/// value, with room for the headers; a `WAIT`'s keys must fit in it too).
const MAX_REQUEST: usize = MAX_VALUE_LEN + MAX_KEY_LEN + 64;
/// The longest hello (and hello answer) frame.
const MAX_HELLO: usize = 64 << 10;
/// How long the server waits for a new connection's hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the accept loop sleeps when no connection is pending (bounds the
/// time a dropped server takes to stop).
const ACCEPT_POLL: Duration = Duration::from_millis(20);
/// Extra time a client gives the server to answer a `WAIT` past its deadline.
const WAIT_GRACE: Duration = Duration::from_secs(2);

const OP_SET: u8 = 1;
const OP_GET: u8 = 2;
const OP_WAIT: u8 = 3;
const OP_ADD: u8 = 4;
const OP_DELETE: u8 = 5;

const ST_OK: u8 = 0;
const ST_ABSENT: u8 = 1;
const ST_TIMEOUT: u8 = 2;
const ST_ERROR: u8 = 3;
const ST_BAD_SECRET: u8 = 4;
const ST_FAILED: u8 = 5;

// ---------------------------------------------------------------------------
// Framing
// ---------------------------------------------------------------------------

/// Builds one frame: 4 bytes of length, patched by [`Enc::finish`].
struct Enc(Vec<u8>);

impl Enc {
    fn new(capacity: usize) -> Enc {
        let mut buf = Vec::with_capacity(capacity + 4);
        buf.extend_from_slice(&[0; 4]);
        Enc(buf)
    }
    fn u8(mut self, v: u8) -> Enc {
        self.0.push(v);
        self
    }
    fn u32(mut self, v: u32) -> Enc {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(mut self, v: u64) -> Enc {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn i64(mut self, v: i64) -> Enc {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn raw(mut self, v: &[u8]) -> Enc {
        self.0.extend_from_slice(v);
        self
    }
    /// A length-prefixed field (callers keep fields far below 4 GiB).
    fn field(self, v: &[u8]) -> Enc {
        self.u32(v.len() as u32).raw(v)
    }
    fn finish(mut self) -> Vec<u8> {
        let len = (self.0.len() - 4) as u32;
        self.0[..4].copy_from_slice(&len.to_le_bytes());
        self.0
    }
}

/// Reads the fields of a payload; `None` when it is too short.
struct Dec<'a> {
    buf: &'a [u8],
}

impl<'a> Dec<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.buf.len() < n {
            return None;
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn i64(&mut self) -> Option<i64> {
        Some(i64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn field(&mut self) -> Option<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    fn end(&self) -> bool {
        self.buf.is_empty()
    }
}

/// Reads one frame of at most `max` bytes. Longer frames are an
/// `InvalidData` error (the caller closes the connection).
fn read_frame(r: &mut impl Read, max: usize) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes, more than the {max} allowed"),
        ));
    }
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf)?;
    Ok(buf)
}

/// Compares two secrets in time that depends only on their lengths.
fn secrets_match(a: &[u8], b: &[u8]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    diff == 0 && a.len() == b.len()
}

/// A key shortened for an error message.
fn show_key(key: &str) -> String {
    const SHOWN: usize = 64;
    if key.len() <= SHOWN {
        return format!("`{key}`");
    }
    let mut end = SHOWN;
    while !key.is_char_boundary(end) {
        end -= 1;
    }
    format!("`{}...` ({} bytes)", &key[..end], key.len())
}

/// Seconds for messages and `Config` values ("5", "0.25").
fn secs(d: Duration) -> String {
    format!("{}", d.as_secs_f64())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
