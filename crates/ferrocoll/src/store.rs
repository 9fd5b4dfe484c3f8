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
//!    3 `ERROR` (followed by a message), 4 `BAD_SECRET`.
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

// ---------------------------------------------------------------------------
// Server
// ---------------------------------------------------------------------------

/// What the server threads share.
struct Shared {
    /// The key-value map.
    map: Mutex<HashMap<String, Vec<u8>>>,
    /// Notified (under `map`'s lock) whenever a key is set, and at shutdown.
    changed: Condvar,
    /// Set when the server is dropped.
    stop: AtomicBool,
    /// A clone of every open connection, so that shutdown can close them.
    conns: Mutex<HashMap<u64, TcpStream>>,
    /// The job's secret.
    secret: Vec<u8>,
}

/// A running store server; stops (closes the listener and all connections,
/// joins its thread) on drop.
///
/// One thread accepts connections and one thread serves each connection.
/// Jobs have at most a few thousand ranks, each with one connection, so a
/// thread per connection is affordable and keeps a blocked `wait` from
/// delaying anyone else.
pub struct StoreServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl fmt::Debug for StoreServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl StoreServer {
    /// Binds `addr` ("host:port"; port 0 = any free port) and serves in a
    /// background thread.
    ///
    /// Clients must present `secret` in their hello. Fails with
    /// [`Error::Config`] (naming `FERROCOLL_ADDR`) when the address cannot be
    /// bound.
    pub fn start(addr: &str, secret: &str) -> Result<StoreServer> {
        let bind_error = |reason: String| Error::Config {
            var: "FERROCOLL_ADDR".into(),
            value: addr.into(),
            reason,
        };
        let listener = TcpListener::bind(addr).map_err(|e| {
            bind_error(format!(
                "rank 0 could not serve the store on it ({e}); use an address of this host \
                 and a free port (port 0 picks one)"
            ))
        })?;
        let local = listener
            .local_addr()
            .map_err(|e| bind_error(format!("could not read the bound address: {e}")))?;
        // Non-blocking, so that the accept loop notices a drop within
        // ACCEPT_POLL without anyone having to connect to it.
        listener
            .set_nonblocking(true)
            .map_err(|e| bind_error(format!("could not configure the listener: {e}")))?;
        let shared = Arc::new(Shared {
            map: Mutex::new(HashMap::new()),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
            secret: secret.as_bytes().to_vec(),
        });
        let thread = {
            let shared = Arc::clone(&shared);
            thread::Builder::new()
                .name("ferrocoll-store".into())
                .spawn(move || accept_loop(listener, shared))
                .map_err(|e| bind_error(format!("could not start the store thread: {e}")))?
        };
        Ok(StoreServer {
            addr: local,
            shared,
            thread: Some(thread),
        })
    }

    /// The bound address (with the real port).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the waits; taking the lock first means no waiter can miss the
        // flag between checking it and going to sleep.
        drop(lock(&self.shared.map));
        self.shared.changed.notify_all();
        // The accept thread closes every connection and joins their threads.
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut workers: Vec<JoinHandle<()>> = Vec::new();
    let mut next_id = 0u64;
    while !shared.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => {
                workers.retain(|w| !w.is_finished());
                let id = next_id;
                next_id += 1;
                if stream.set_nonblocking(false).is_err() || stream.set_nodelay(true).is_err() {
                    continue;
                }
                let Ok(clone) = stream.try_clone() else {
                    continue;
                };
                lock(&shared.conns).insert(id, clone);
                let worker_shared = Arc::clone(&shared);
                let spawned = thread::Builder::new()
                    .name("ferrocoll-store-conn".into())
                    .spawn(move || {
                        serve_connection(stream, &worker_shared);
                        lock(&worker_shared.conns).remove(&id);
                    });
                match spawned {
                    Ok(handle) => workers.push(handle),
                    Err(_) => {
                        // Out of threads: drop the connection; the client
                        // sees it closed.
                        if let Some(s) = lock(&shared.conns).remove(&id) {
                            let _ = s.shutdown(Shutdown::Both);
                        }
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => thread::sleep(ACCEPT_POLL),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // Out of file descriptors and the like: back off and retry.
            Err(_) => thread::sleep(ACCEPT_POLL),
        }
    }
    drop(listener);
    // Only this thread registers connections, so after this sweep none is
    // left open; a worker blocked reading or writing wakes with an error.
    for (_, s) in lock(&shared.conns).drain() {
        let _ = s.shutdown(Shutdown::Both);
    }
    for w in workers {
        let _ = w.join();
    }
}

/// Serves one connection until the client leaves, breaks the protocol, or the
/// server stops.
fn serve_connection(mut stream: TcpStream, shared: &Shared) {
    if stream.set_read_timeout(Some(HELLO_TIMEOUT)).is_err() {
        return;
    }
    let Ok(hello) = read_frame(&mut stream, MAX_HELLO) else {
        return;
    };
    if hello.len() < 8 || &hello[..4] != MAGIC {
        return; // Not one of ours: close without a word.
    }
    let version = u32::from_le_bytes([hello[4], hello[5], hello[6], hello[7]]);
    if version != VERSION {
        let msg = format!(
            "the store speaks protocol version {VERSION}, this client version {version}: \
             every rank must run the same ferrocoll"
        );
        let _ = stream.write_all(
            &Enc::new(msg.len() + 5)
                .u8(ST_ERROR)
                .field(msg.as_bytes())
                .finish(),
        );
        return;
    }
    if !secrets_match(&hello[8..], &shared.secret) {
        let _ = stream.write_all(&Enc::new(1).u8(ST_BAD_SECRET).finish());
        return;
    }
    if stream.write_all(&Enc::new(1).u8(ST_OK).finish()).is_err()
        || stream.set_read_timeout(None).is_err()
    {
        return;
    }
    while !shared.stop.load(Ordering::SeqCst) {
        let Ok(request) = read_frame(&mut stream, MAX_REQUEST) else {
            return;
        };
        let Some(response) = handle(&request, shared) else {
            return; // Malformed request or shutdown: close.
        };
        if stream.write_all(&response).is_err() {
            return;
        }
    }
}

/// Reads a key field, enforcing the limit and UTF-8.
fn key_of<'a>(d: &mut Dec<'a>) -> Option<&'a str> {
    let key = d.field()?;
    if key.len() > MAX_KEY_LEN {
        return None;
    }
    std::str::from_utf8(key).ok()
}

fn error_frame(msg: &str) -> Vec<u8> {
    Enc::new(msg.len() + 5)
        .u8(ST_ERROR)
        .field(msg.as_bytes())
        .finish()
}

/// Answers one request; `None` closes the connection.
fn handle(request: &[u8], shared: &Shared) -> Option<Vec<u8>> {
    let mut d = Dec { buf: request };
    match d.u8()? {
        OP_SET => {
            let key = key_of(&mut d)?;
            let value = d.field()?;
            if value.len() > MAX_VALUE_LEN || !d.end() {
                return None;
            }
            lock(&shared.map).insert(key.to_owned(), value.to_vec());
            shared.changed.notify_all();
            Some(Enc::new(1).u8(ST_OK).finish())
        }
        OP_GET => {
            let key = key_of(&mut d)?;
            if !d.end() {
                return None;
            }
            let map = lock(&shared.map);
            Some(match map.get(key) {
                Some(v) => Enc::new(v.len() + 5).u8(ST_OK).field(v).finish(),
                None => Enc::new(1).u8(ST_ABSENT).finish(),
            })
        }
        OP_WAIT => {
            let wait_ms = d.u64()?;
            let count = d.u32()? as usize;
            let mut keys = Vec::with_capacity(count.min(request.len() / 4));
            for _ in 0..count {
                keys.push(key_of(&mut d)?);
            }
            if !d.end() {
                return None;
            }
            wait_for(&keys, wait_ms, shared)
        }
        OP_ADD => {
            let key = key_of(&mut d)?;
            let delta = d.i64()?;
            if !d.end() {
                return None;
            }
            let mut map = lock(&shared.map);
            let old = match map.get(key) {
                None => 0,
                Some(v) => match std::str::from_utf8(v)
                    .ok()
                    .and_then(|s| s.parse::<i64>().ok())
                {
                    Some(n) => n,
                    None => {
                        return Some(error_frame(&format!(
                            "`add` on key {}, whose value is not an integer",
                            show_key(key)
                        )))
                    }
                },
            };
            let Some(new) = old.checked_add(delta) else {
                return Some(error_frame(&format!(
                    "`add` of {delta} to {old} under key {} overflows an i64",
                    show_key(key)
                )));
            };
            map.insert(key.to_owned(), new.to_string().into_bytes());
            drop(map);
            shared.changed.notify_all();
            Some(Enc::new(9).u8(ST_OK).i64(new).finish())
        }
        OP_DELETE => {
            let key = key_of(&mut d)?;
            if !d.end() {
                return None;
            }
            lock(&shared.map).remove(key);
            Some(Enc::new(1).u8(ST_OK).finish())
        }
        _ => None,
    }
}

/// Waits (on the condition variable, so other connections carry on) until
/// every key is set or `wait_ms` has passed.
///
/// Every `set` and `add` wakes every waiter (one condition variable for the
/// whole map). With a few thousand ranks rendezvousing once at start-up that
/// is cheap enough, and it keeps the server simple.
/// Runs one connection's worth of bytes through the server's framing and
/// request handler, on a fresh store that is shutting down (so a `wait`
/// returns at once): the entry point of the fuzz target (`fuzz/`).
#[doc(hidden)]
pub fn fuzz_connection(mut bytes: &[u8]) {
    let shared = Shared {
        map: Mutex::new(HashMap::new()),
        changed: Condvar::new(),
        stop: AtomicBool::new(true),
        conns: Mutex::new(HashMap::new()),
        secret: b"fuzz".to_vec(),
    };
    // A smaller frame limit than the server's keeps each run quick; the
    // parsing is the same.
    while let Ok(request) = read_frame(&mut bytes, 1 << 20) {
        let _ = handle(&request, &shared);
    }
}

fn wait_for(keys: &[&str], wait_ms: u64, shared: &Shared) -> Option<Vec<u8>> {
    let deadline = if wait_ms == u64::MAX {
        None
    } else {
        Instant::now().checked_add(Duration::from_millis(wait_ms))
    };
    let mut map = lock(&shared.map);
    loop {
        if shared.stop.load(Ordering::SeqCst) {
            return None;
        }
        match keys.iter().position(|k| !map.contains_key(*k)) {
            None => break,
            Some(missing) => {
                let timed_out = match deadline {
                    None => {
                        map = shared.changed.wait(map).unwrap_or_else(|p| p.into_inner());
                        false
                    }
                    Some(deadline) => {
                        let now = Instant::now();
                        if now >= deadline {
                            true
                        } else {
                            map = shared
                                .changed
                                .wait_timeout(map, deadline - now)
                                .unwrap_or_else(|p| p.into_inner())
                                .0;
                            false
                        }
                    }
                };
                if timed_out {
                    return Some(Enc::new(5).u8(ST_TIMEOUT).u32(missing as u32).finish());
                }
            }
        }
    }
    let values: Vec<&Vec<u8>> = keys.iter().map(|k| &map[*k]).collect();
    let total: usize = values.iter().map(|v| v.len() + 4).sum::<usize>() + 5;
    if total > u32::MAX as usize {
        drop(map);
        return Some(error_frame(&format!(
            "the {} values waited for total {total} bytes, more than one reply can carry; \
             wait for fewer keys at a time",
            keys.len()
        )));
    }
    let mut enc = Enc::new(total).u8(ST_OK).u32(values.len() as u32);
    for v in values {
        enc = enc.field(v);
    }
    Some(enc.finish())
}

// ---------------------------------------------------------------------------
// Client
// ---------------------------------------------------------------------------

/// A connection to the store. Every call has a deadline (the client's
/// timeout); past it the call fails with an error naming the key and the
/// store address.
///
/// A call whose connection fails (the store went away, or the call timed out
/// in the middle of a reply) drops the connection; the next call tries once
/// to reconnect.
pub struct StoreClient {
    addr: String,
    secret: String,
    timeout: Duration,
    stream: Option<TcpStream>,
}

impl fmt::Debug for StoreClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreClient")
            .field("addr", &self.addr)
            .field("timeout", &self.timeout)
            .field("connected", &self.stream.is_some())
            .finish_non_exhaustive()
    }
}

/// `now + d`, or `None` (no deadline) when that is out of range.
fn deadline_after(d: Duration) -> Option<Instant> {
    Instant::now().checked_add(d)
}

/// Time left until `deadline`, as a socket timeout (never zero, which the
/// socket calls reject; `None` = no limit).
fn socket_timeout(deadline: Option<Instant>, extra: Duration) -> Option<Duration> {
    deadline.map(|d| {
        d.saturating_duration_since(Instant::now())
            .saturating_add(extra)
            .max(Duration::from_millis(1))
    })
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
    )
}

impl StoreClient {
    /// Connects, retrying until `timeout` passes (the server may start after
    /// the clients), then authenticates with `secret`. `timeout` is also the
    /// deadline of every later call (see [`StoreClient::set_timeout`]).
    ///
    /// Fails with [`Error::Config`] naming `FERROCOLL_ADDR` when the store
    /// cannot be reached in time, and naming `FERROCOLL_SECRET` when the
    /// store rejects the secret.
    pub fn connect(addr: &str, secret: &str, timeout: Duration) -> Result<StoreClient> {
        let mut client = StoreClient {
            addr: addr.to_owned(),
            secret: secret.to_owned(),
            timeout,
            stream: None,
        };
        let start = Instant::now();
        let deadline = deadline_after(timeout);
        let mut pause = Duration::from_millis(10);
        loop {
            match client.open(deadline) {
                Ok(stream) => {
                    client.stream = Some(stream);
                    return Ok(client);
                }
                Err(Attempt::Fatal(e)) => return Err(e),
                Err(Attempt::Retry(last)) => {
                    let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
                    if left == Some(Duration::ZERO) {
                        return Err(client.unreachable(start.elapsed(), &last));
                    }
                    thread::sleep(left.map_or(pause, |l| l.min(pause)));
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
            }
        }
    }

    /// Stores `value` under `key`, replacing any previous value.
    pub fn set(&mut self, key: &str, value: &[u8]) -> Result<()> {
        check_key(key)?;
        if value.len() > MAX_VALUE_LEN {
            return Err(Error::invalid(format!(
                "store value for key {} is {} bytes; the store takes at most {MAX_VALUE_LEN}",
                show_key(key),
                value.len()
            )));
        }
        let request = Enc::new(key.len() + value.len() + 9)
            .u8(OP_SET)
            .field(key.as_bytes())
            .field(value)
            .finish();
        let response = self.call("set", key, &request, Duration::ZERO)?;
        self.expect_ok("set", key, &response, |d| d.end().then_some(()))
    }

    /// The store's address, as given to [`StoreClient::connect`].
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The value, or None if the key is not set (does not wait).
    pub fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>> {
        check_key(key)?;
        let request = Enc::new(key.len() + 5)
            .u8(OP_GET)
            .field(key.as_bytes())
            .finish();
        let response = self.call("get", key, &request, Duration::ZERO)?;
        if response.first() == Some(&ST_ABSENT) && response.len() == 1 {
            return Ok(None);
        }
        self.expect_ok("get", key, &response, |d| {
            let v = d.field()?.to_vec();
            d.end().then_some(Some(v))
        })
    }

    /// Waits until every key is set (up to the timeout) and returns their
    /// values in order.
    ///
    /// The wait happens in the server, so it holds up no other client. Past
    /// the deadline it fails with [`Error::Config`] naming
    /// `FERROCOLL_TIMEOUT` and the first key still missing.
    pub fn wait(&mut self, keys: &[&str]) -> Result<Vec<Vec<u8>>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut size = 13;
        for key in keys {
            check_key(key)?;
            size += key.len() + 4;
        }
        if size > MAX_REQUEST {
            return Err(Error::invalid(format!(
                "a store wait for {} keys totalling {size} bytes is more than one request can \
                 carry ({MAX_REQUEST} bytes); wait for fewer keys at a time",
                keys.len()
            )));
        }
        let deadline = deadline_after(self.timeout);
        let wait_ms = match deadline {
            None => u64::MAX,
            Some(_) => {
                let ms = self.timeout.as_nanos().div_ceil(1_000_000);
                u64::try_from(ms).unwrap_or(u64::MAX - 1).min(u64::MAX - 1)
            }
        };
        let mut enc = Enc::new(size)
            .u8(OP_WAIT)
            .u64(wait_ms)
            .u32(keys.len() as u32);
        for key in keys {
            enc = enc.field(key.as_bytes());
        }
        let first = keys[0];
        let response = self.call("wait", first, &enc.finish(), WAIT_GRACE)?;
        if response.first() == Some(&ST_TIMEOUT) {
            let mut d = Dec {
                buf: &response[1..],
            };
            let missing = d
                .u32()
                .and_then(|i| keys.get(i as usize).copied())
                .unwrap_or(first);
            return Err(self.wait_timeout(missing, keys.len()));
        }
        self.expect_ok("wait", first, &response, |d| {
            let n = d.u32()? as usize;
            if n != keys.len() {
                return None;
            }
            let mut values = Vec::with_capacity(n);
            for _ in 0..n {
                values.push(d.field()?.to_vec());
            }
            d.end().then_some(values)
        })
    }

    /// Atomically adds `delta` to the integer under `key` (absent = 0) and
    /// returns the new value.
    ///
    /// The integer is stored as ASCII decimal text, so [`StoreClient::get`]
    /// of the key reads e.g. `b"42"`; an `add` on a key holding anything else
    /// fails with [`Error::InvalidArgument`].
    pub fn add(&mut self, key: &str, delta: i64) -> Result<i64> {
        check_key(key)?;
        let request = Enc::new(key.len() + 13)
            .u8(OP_ADD)
            .field(key.as_bytes())
            .i64(delta)
            .finish();
        let response = self.call("add", key, &request, Duration::ZERO)?;
        self.expect_ok("add", key, &response, |d| {
            let v = d.i64()?;
            d.end().then_some(v)
        })
    }

    /// Deletes a key (no error if absent).
    pub fn delete(&mut self, key: &str) -> Result<()> {
        check_key(key)?;
        let request = Enc::new(key.len() + 5)
            .u8(OP_DELETE)
            .field(key.as_bytes())
            .finish();
        let response = self.call("delete", key, &request, Duration::ZERO)?;
        self.expect_ok("delete", key, &response, |d| d.end().then_some(()))
    }

    /// Changes the per-call deadline.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Waits until `size` clients have called `barrier` with this `name`.
    ///
    /// Each caller adds 1 to the counter `"<name>/count"`; the one that
    /// brings it to `size` sets `"<name>/done"`, and every caller waits for
    /// that key (up to the client's timeout). The keys stay in the store, so
    /// a name serves one barrier only: give each barrier of a job its own
    /// name (e.g. with a sequence number), and call it from exactly `size`
    /// clients. More than `size` arrivals is an [`Error::InvalidArgument`];
    /// a timeout says how many of the `size` arrived.
    pub fn barrier(&mut self, name: &str, size: usize) -> Result<()> {
        if size == 0 {
            return Err(Error::invalid(format!(
                "barrier `{name}` of size 0: a barrier needs at least one participant"
            )));
        }
        let count_key = format!("{name}/count");
        let done_key = format!("{name}/done");
        let arrived = self.add(&count_key, 1)?;
        if arrived > size as i64 || arrived < 1 {
            return Err(Error::invalid(format!(
                "barrier `{name}` in the store at {} counted {arrived} arrivals for a size of \
                 {size}: a barrier name was used twice, or the ranks disagree on the size",
                self.addr
            )));
        }
        if arrived == size as i64 {
            self.set(&done_key, b"1")?;
        }
        match self.wait(&[&done_key]) {
            Ok(_) => Ok(()),
            Err(Error::Config { var, value, reason }) if var == "FERROCOLL_TIMEOUT" => {
                // Say how many made it, if the store still answers.
                let seen = match self.get(&count_key) {
                    Ok(Some(v)) => String::from_utf8_lossy(&v).into_owned(),
                    _ => "an unknown number".into(),
                };
                Err(Error::Config {
                    var,
                    value,
                    reason: format!(
                        "barrier `{name}`: {seen} of {size} ranks arrived in time; {reason}"
                    ),
                })
            }
            Err(e) => Err(e),
        }
    }

    // -- internals --------------------------------------------------------

    /// One connection attempt (resolve, connect, hello) bounded by
    /// `deadline`.
    fn open(&self, deadline: Option<Instant>) -> std::result::Result<TcpStream, Attempt> {
        let addrs: Vec<SocketAddr> = match self.addr.to_socket_addrs() {
            Ok(a) => a.collect(),
            Err(e) => return Err(Attempt::Retry(format!("cannot resolve the address: {e}"))),
        };
        if addrs.is_empty() {
            return Err(Attempt::Retry("the address resolves to nothing".into()));
        }
        let mut last = String::new();
        for sa in addrs {
            // Short attempts, so that a silently dropped SYN does not eat the
            // whole timeout.
            let attempt = socket_timeout(deadline, Duration::ZERO)
                .map_or(Duration::from_secs(5), |t| t.min(Duration::from_secs(5)));
            match TcpStream::connect_timeout(&sa, attempt) {
                Ok(stream) => return self.hello(stream, deadline),
                Err(e) => last = format!("{sa}: {e}"),
            }
        }
        Err(Attempt::Retry(last))
    }

    /// Sends the hello on a fresh connection and reads the answer.
    fn hello(
        &self,
        mut stream: TcpStream,
        deadline: Option<Instant>,
    ) -> std::result::Result<TcpStream, Attempt> {
        let io_fail = |e: io::Error| {
            let reason = if is_timeout(&e) {
                format!(
                    "the store at {} accepted the connection but did not answer the hello in \
                     time; is it a ferrocoll store, and is rank 0 responsive?",
                    self.addr
                )
            } else {
                format!(
                    "the store at {} closed the connection during the hello ({e}); is the \
                     address that of this job's rank 0, running the same ferrocoll version?",
                    self.addr
                )
            };
            Attempt::Fatal(Error::Config {
                var: "FERROCOLL_ADDR".into(),
                value: self.addr.clone(),
                reason,
            })
        };
        let hello = Enc::new(self.secret.len() + 8)
            .raw(MAGIC)
            .u32(VERSION)
            .raw(self.secret.as_bytes())
            .finish();
        stream.set_nodelay(true).map_err(io_fail)?;
        stream
            .set_write_timeout(socket_timeout(deadline, Duration::ZERO))
            .map_err(io_fail)?;
        stream
            .set_read_timeout(socket_timeout(deadline, Duration::ZERO))
            .map_err(io_fail)?;
        stream.write_all(&hello).map_err(io_fail)?;
        let answer = read_frame(&mut stream, MAX_HELLO).map_err(io_fail)?;
        let mut d = Dec { buf: &answer };
        match d.u8() {
            Some(ST_OK) if d.end() => Ok(stream),
            Some(ST_BAD_SECRET) => Err(Attempt::Fatal(Error::Config {
                var: "FERROCOLL_SECRET".into(),
                value: "(not shown)".into(),
                reason: format!(
                    "the store at {} rejected our secret: this process belongs to another job, \
                     or FERROCOLL_SECRET differs between ranks",
                    self.addr
                ),
            })),
            Some(ST_ERROR) => {
                let msg = d.field().map(String::from_utf8_lossy).unwrap_or_default();
                Err(Attempt::Fatal(Error::Config {
                    var: "FERROCOLL_ADDR".into(),
                    value: self.addr.clone(),
                    reason: format!("the store at {} refused the connection: {msg}", self.addr),
                }))
            }
            _ => Err(Attempt::Fatal(self.garbled("hello", None))),
        }
    }

    /// The error for a store not reached within the connect timeout.
    fn unreachable(&self, waited: Duration, last: &str) -> Error {
        Error::Config {
            var: "FERROCOLL_ADDR".into(),
            value: self.addr.clone(),
            reason: format!(
                "the store at {} could not be reached after {:.1} s (last error: {last}); check \
                 that rank 0 is running and has started the store, that the address is \
                 reachable from this host, and that no firewall blocks the port",
                self.addr,
                waited.as_secs_f64()
            ),
        }
    }

    /// The error for a `wait` past its deadline.
    fn wait_timeout(&self, key: &str, of: usize) -> Error {
        let others = if of > 1 {
            format!(" (one of {of} keys waited for)")
        } else {
            String::new()
        };
        Error::Config {
            var: "FERROCOLL_TIMEOUT".into(),
            value: secs(self.timeout),
            reason: format!(
                "waited for key {}{others} at store {}; the ranks that should set it have not \
                 (did every rank start? same job?)",
                show_key(key),
                self.addr
            ),
        }
    }

    /// The error for an answer that does not parse.
    fn garbled(&self, op: &str, key: Option<&str>) -> Error {
        let of = key
            .map(|k| format!(" of key {}", show_key(k)))
            .unwrap_or_default();
        Error::Internal(format!(
            "the store at {} sent a malformed answer to `{op}`{of}",
            self.addr
        ))
    }

    /// Sends one request and reads its response, reconnecting first if an
    /// earlier call dropped the connection. `extra` lengthens the read
    /// deadline (the server answers a `wait` at the deadline itself).
    fn call(&mut self, op: &str, key: &str, request: &[u8], extra: Duration) -> Result<Vec<u8>> {
        let deadline = deadline_after(self.timeout);
        if self.stream.is_none() {
            match self.open(deadline) {
                Ok(s) => self.stream = Some(s),
                Err(Attempt::Fatal(e)) => return Err(e),
                Err(Attempt::Retry(last)) => {
                    return Err(Error::Config {
                        var: "FERROCOLL_ADDR".into(),
                        value: self.addr.clone(),
                        reason: format!(
                            "lost the connection to the store at {} and could not reconnect for \
                             `{op}` of key {} ({last}); has rank 0 exited?",
                            self.addr,
                            show_key(key)
                        ),
                    })
                }
            }
        }
        let stream = self.stream.as_mut().expect("connected above");
        let result = (|| {
            stream.set_write_timeout(socket_timeout(deadline, Duration::ZERO))?;
            stream.write_all(request)?;
            stream.set_read_timeout(socket_timeout(deadline, extra))?;
            read_frame(stream, usize::MAX)
        })();
        match result {
            Ok(response) => Ok(response),
            Err(e) => {
                // The stream may be mid-frame: never reuse it.
                self.stream = None;
                Err(if is_timeout(&e) {
                    Error::Config {
                        var: "FERROCOLL_TIMEOUT".into(),
                        value: secs(self.timeout),
                        reason: format!(
                            "the store at {} did not answer `{op}` of key {} in time; is rank 0 \
                             alive and responsive?",
                            self.addr,
                            show_key(key)
                        ),
                    }
                } else {
                    Error::Config {
                        var: "FERROCOLL_ADDR".into(),
                        value: self.addr.clone(),
                        reason: format!(
                            "the connection to the store at {} failed during `{op}` of key {} \
                             ({e}); rank 0, which serves the store, has probably exited or failed",
                            self.addr,
                            show_key(key)
                        ),
                    }
                })
            }
        }
    }

    /// Parses an `OK` response with `parse`, or turns an `ERROR` response
    /// into [`Error::InvalidArgument`].
    fn expect_ok<T>(
        &mut self,
        op: &str,
        key: &str,
        response: &[u8],
        parse: impl FnOnce(&mut Dec<'_>) -> Option<T>,
    ) -> Result<T> {
        let mut d = Dec { buf: response };
        match d.u8() {
            Some(ST_OK) => {
                if let Some(v) = parse(&mut d) {
                    return Ok(v);
                }
            }
            Some(ST_ERROR) => {
                if let Some(msg) = d.field() {
                    return Err(Error::invalid(format!(
                        "the store at {} refused `{op}`: {}",
                        self.addr,
                        String::from_utf8_lossy(msg)
                    )));
                }
            }
            _ => {}
        }
        // Out of step with the server: drop the connection.
        self.stream = None;
        Err(self.garbled(op, Some(key)))
    }
}

/// Why a connection attempt failed.
enum Attempt {
    /// Worth retrying (refused, unreachable, unresolvable); the last cause.
    Retry(String),
    /// Not worth retrying (the store answered and said no).
    Fatal(Error),
}

fn check_key(key: &str) -> Result<()> {
    if key.len() > MAX_KEY_LEN {
        return Err(Error::invalid(format!(
            "store key {} is longer than the {MAX_KEY_LEN} bytes the store takes",
            show_key(key)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    const SECRET: &str = "s3cret";

    fn server() -> StoreServer {
        StoreServer::start("127.0.0.1:0", SECRET).unwrap()
    }

    fn client(s: &StoreServer, timeout_ms: u64) -> StoreClient {
        StoreClient::connect(
            &s.local_addr().to_string(),
            SECRET,
            Duration::from_millis(timeout_ms),
        )
        .unwrap()
    }

    #[test]
    fn set_get_delete() {
        let s = server();
        let mut c = client(&s, 2000);
        assert_eq!(c.get("a").unwrap(), None);
        c.set("a", b"hello").unwrap();
        c.set("empty", b"").unwrap();
        assert_eq!(c.get("a").unwrap(), Some(b"hello".to_vec()));
        assert_eq!(c.get("empty").unwrap(), Some(Vec::new()));
        c.set("a", b"again").unwrap();
        assert_eq!(c.get("a").unwrap(), Some(b"again".to_vec()));
        c.delete("a").unwrap();
        c.delete("a").unwrap(); // absent: no error
        assert_eq!(c.get("a").unwrap(), None);
        // Another client sees the same map.
        let mut other = client(&s, 2000);
        assert_eq!(other.get("empty").unwrap(), Some(Vec::new()));
    }

    #[test]
    fn limits_are_invalid_arguments() {
        let s = server();
        let mut c = client(&s, 2000);
        let long = "k".repeat(MAX_KEY_LEN + 1);
        assert!(matches!(c.set(&long, b"x"), Err(Error::InvalidArgument(_))));
        assert!(matches!(c.get(&long), Err(Error::InvalidArgument(_))));
        let big = vec![0u8; MAX_VALUE_LEN + 1];
        assert!(matches!(c.set("k", &big), Err(Error::InvalidArgument(_))));
        // The connection is still fine.
        c.set("k", b"v").unwrap();
        assert_eq!(c.get("k").unwrap(), Some(b"v".to_vec()));
    }

    #[test]
    fn wait_blocks_until_set_and_keeps_order() {
        let s = server();
        let addr = s.local_addr().to_string();
        let mut c = client(&s, 2000);
        c.set("b", b"2").unwrap();
        let setter = thread::spawn(move || {
            let mut c = StoreClient::connect(&addr, SECRET, Duration::from_secs(2)).unwrap();
            thread::sleep(Duration::from_millis(100));
            c.set("a", b"1").unwrap();
            thread::sleep(Duration::from_millis(50));
            c.set("c", b"3").unwrap();
        });
        // A waiting client must not hold up others.
        let mut third = client(&s, 2000);
        let start = Instant::now();
        let values = c.wait(&["c", "a", "b"]).unwrap();
        assert!(start.elapsed() >= Duration::from_millis(100));
        assert_eq!(values, vec![b"3".to_vec(), b"1".to_vec(), b"2".to_vec()]);
        third.set("d", b"4").unwrap();
        setter.join().unwrap();
        assert_eq!(c.wait(&[]).unwrap(), Vec::<Vec<u8>>::new());
    }

    #[test]
    fn wait_does_not_block_other_clients() {
        let s = server();
        let addr = s.local_addr().to_string();
        let waiter = thread::spawn(move || {
            let mut c = StoreClient::connect(&addr, SECRET, Duration::from_secs(2)).unwrap();
            c.wait(&["late"]).unwrap()
        });
        thread::sleep(Duration::from_millis(50));
        let mut c = client(&s, 2000);
        let start = Instant::now();
        c.set("x", b"1").unwrap();
        assert_eq!(c.get("x").unwrap(), Some(b"1".to_vec()));
        assert!(start.elapsed() < Duration::from_millis(500));
        c.set("late", b"now").unwrap();
        assert_eq!(waiter.join().unwrap(), vec![b"now".to_vec()]);
    }

    #[test]
    fn wait_timeout_names_the_key() {
        let s = server();
        let mut c = client(&s, 200);
        c.set("present", b"x").unwrap();
        let start = Instant::now();
        let err = c.wait(&["present", "missing/key"]).unwrap_err();
        let waited = start.elapsed();
        assert!(waited >= Duration::from_millis(190), "{waited:?}");
        assert!(waited < Duration::from_millis(1500), "{waited:?}");
        let msg = err.to_string();
        assert!(matches!(err, Error::Config { ref var, .. } if var == "FERROCOLL_TIMEOUT"));
        assert!(msg.contains("missing/key"), "{msg}");
        assert!(msg.contains(&s.local_addr().to_string()), "{msg}");
        // The connection stays usable after a timeout.
        c.set_timeout(Duration::from_secs(2));
        assert_eq!(c.get("present").unwrap(), Some(b"x".to_vec()));
    }

    #[test]
    fn add_from_many_threads() {
        let s = server();
        let addr = s.local_addr().to_string();
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let addr = addr.clone();
                thread::spawn(move || {
                    let mut c =
                        StoreClient::connect(&addr, SECRET, Duration::from_secs(2)).unwrap();
                    let mut last = 0;
                    for _ in 0..100 {
                        let v = c.add("counter", 1).unwrap();
                        assert!(v > last);
                        last = v;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let mut c = client(&s, 2000);
        assert_eq!(c.add("counter", 0).unwrap(), 800);
        assert_eq!(c.get("counter").unwrap(), Some(b"800".to_vec()));
        assert_eq!(c.add("neg", -5).unwrap(), -5);
        c.set("text", b"abc").unwrap();
        let err = c.add("text", 1).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
        assert!(err.to_string().contains("text"));
        // Still in step after the error.
        assert_eq!(c.add("counter", 1).unwrap(), 801);
    }

    #[test]
    fn barrier_with_five_clients() {
        let s = server();
        let addr = s.local_addr().to_string();
        let threads: Vec<_> = (0..5)
            .map(|i| {
                let addr = addr.clone();
                thread::spawn(move || {
                    let mut c =
                        StoreClient::connect(&addr, SECRET, Duration::from_secs(2)).unwrap();
                    thread::sleep(Duration::from_millis(20 * i));
                    c.set(&format!("arrived/{i}"), b"1").unwrap();
                    c.barrier("b0", 5).unwrap();
                    for j in 0..5 {
                        assert!(c.get(&format!("arrived/{j}")).unwrap().is_some());
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        // A barrier short of participants times out and says how many came.
        let mut c = client(&s, 200);
        let msg = c.barrier("b1", 2).unwrap_err().to_string();
        assert!(msg.contains("1 of 2"), "{msg}");
        assert!(msg.contains("b1/done"), "{msg}");
    }

    #[test]
    fn wrong_secret_is_rejected() {
        let s = server();
        let addr = s.local_addr().to_string();
        let start = Instant::now();
        let err = StoreClient::connect(&addr, "xyzzy-42", Duration::from_secs(2)).unwrap_err();
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "no retry on a rejection"
        );
        let msg = err.to_string();
        assert!(
            msg.contains(&format!(
                "the store at {addr} rejected our secret: this process belongs to another job, \
                 or FERROCOLL_SECRET differs between ranks"
            )),
            "{msg}"
        );
        assert!(!msg.contains("xyzzy"), "the secret must not leak: {msg}");
        // A prefix of the secret is not the secret.
        assert!(StoreClient::connect(&addr, "s3cr", Duration::from_secs(1)).is_err());
        assert!(StoreClient::connect(&addr, "s3crets", Duration::from_secs(1)).is_err());
        client(&s, 2000).set("k", b"v").unwrap();
    }

    #[test]
    fn garbage_does_not_kill_the_server() {
        let s = server();
        let addr = s.local_addr();
        // Something speaking HTTP: its first "length" is huge.
        let mut http = TcpStream::connect(addr).unwrap();
        http.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        // A small frame without the magic.
        let mut wrong = TcpStream::connect(addr).unwrap();
        wrong
            .write_all(&Enc::new(8).raw(b"XXXX").u32(1).finish())
            .unwrap();
        for mut g in [http, wrong] {
            g.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            let mut buf = [0u8; 16];
            // Closed without a reply (EOF or reset).
            assert!(matches!(g.read(&mut buf), Ok(0) | Err(_)));
        }
        // An authenticated client breaking the protocol is closed too.
        let mut c = client(&s, 2000);
        let bad = Enc::new(1).u8(99).finish();
        assert!(c.call("bogus", "k", &bad, Duration::ZERO).is_err());
        // One that connects and says nothing holds up nobody.
        let _silent = TcpStream::connect(addr).unwrap();
        let mut good = client(&s, 2000);
        good.set("k", b"v").unwrap();
        assert_eq!(good.get("k").unwrap(), Some(b"v".to_vec()));
        // The client that broke the protocol reconnects on its next call.
        assert_eq!(c.get("k").unwrap(), Some(b"v".to_vec()));
    }

    #[test]
    fn connect_retries_until_the_server_starts() {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let (tx, rx) = mpsc::channel();
        let server_addr = addr.clone();
        let starter = thread::spawn(move || {
            thread::sleep(Duration::from_millis(300));
            let s = StoreServer::start(&server_addr, SECRET).unwrap();
            tx.send(()).unwrap();
            s
        });
        let start = Instant::now();
        let mut c = StoreClient::connect(&addr, SECRET, Duration::from_secs(3)).unwrap();
        assert!(start.elapsed() >= Duration::from_millis(250));
        rx.recv().unwrap();
        let s = starter.join().unwrap();
        assert_eq!(s.local_addr().port(), port);
        c.set("k", b"v").unwrap();
        assert_eq!(c.get("k").unwrap(), Some(b"v".to_vec()));
    }

    #[test]
    fn connect_gives_up_after_the_timeout() {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let start = Instant::now();
        let err = StoreClient::connect(&addr, SECRET, Duration::from_millis(300)).unwrap_err();
        let waited = start.elapsed();
        assert!(waited >= Duration::from_millis(290) && waited < Duration::from_secs(2));
        let msg = err.to_string();
        assert!(
            msg.contains("FERROCOLL_ADDR") && msg.contains(&addr),
            "{msg}"
        );
        assert!(msg.contains("could not be reached"), "{msg}");
    }

    #[test]
    fn server_drop_does_not_hang_and_clients_error() {
        let s = server();
        let addr = s.local_addr().to_string();
        let mut c = client(&s, 2000);
        c.set("k", b"v").unwrap();
        let waiter = {
            let addr = addr.clone();
            thread::spawn(move || {
                let mut c = StoreClient::connect(&addr, SECRET, Duration::from_secs(10)).unwrap();
                c.wait(&["never"])
            })
        };
        let _silent = TcpStream::connect(&addr).unwrap();
        thread::sleep(Duration::from_millis(100));
        let start = Instant::now();
        drop(s);
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "{:?}",
            start.elapsed()
        );
        let err = waiter.join().unwrap().unwrap_err();
        assert!(err.to_string().contains(&addr), "{err}");
        assert!(start.elapsed() < Duration::from_secs(1));
        let err = c.get("k").unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains(&addr) && msg.contains("`k`"), "{msg}");
        // And the next call fails fast too (the reconnect is refused).
        assert!(c.set("k", b"v").is_err());
        assert!(start.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(secrets_match(b"abc", b"abc"));
        assert!(secrets_match(b"", b""));
        assert!(!secrets_match(b"abc", b"abd"));
        assert!(!secrets_match(b"abc", b"ab"));
        assert!(!secrets_match(b"", b"a"));
    }
}
