//! The store's client: every call has a deadline.

use super::*;
use crate::launch::rendezvous::{arrive, Rendezvous};

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
pub(super) fn deadline_after(d: Duration) -> Option<Instant> {
    Instant::now().checked_add(d)
}

/// Time left until `deadline`, as a socket timeout (never zero, which the
/// socket calls reject; `None` = no limit).
pub(super) fn socket_timeout(deadline: Option<Instant>, extra: Duration) -> Option<Duration> {
    deadline.map(|d| {
        d.saturating_duration_since(Instant::now())
            .saturating_add(extra)
            .max(Duration::from_millis(1))
    })
}

pub(super) fn is_timeout(e: &io::Error) -> bool {
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
                Err(Attempt::Retry { why, refused }) => {
                    let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
                    if left == Some(Duration::ZERO) {
                        return Err(client.unreachable(start.elapsed(), &why, refused));
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
    /// `FERROCOLL_TIMEOUT` and the first key still missing; when the
    /// server's owner gave up the start-up ([`StoreServer::fail_waits`])
    /// it fails with [`Error::Startup`] saying why.
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
        if response.first() == Some(&ST_FAILED) {
            let mut d = Dec {
                buf: &response[1..],
            };
            if let Some(why) = d.field().filter(|_| d.end()) {
                return Err(Error::Startup(String::from_utf8_lossy(why).into_owned()));
            }
        }
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
        let done_key = arrive(self, name, size)?;
        match self.wait(&[&done_key]) {
            Ok(_) => Ok(()),
            Err(Error::Config { var, value, reason }) if var == "FERROCOLL_TIMEOUT" => {
                // Say how many made it, if the store still answers.
                let seen = match self.get(&format!("{name}/count")) {
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
            Err(e) => {
                return Err(Attempt::Retry {
                    why: format!("cannot resolve the address: {e}"),
                    refused: false,
                })
            }
        };
        if addrs.is_empty() {
            return Err(Attempt::Retry {
                why: "the address resolves to nothing".into(),
                refused: false,
            });
        }
        let mut last = String::new();
        let mut refused = true;
        for sa in addrs {
            // Short attempts, so that a silently dropped SYN does not eat the
            // whole timeout.
            let attempt = socket_timeout(deadline, Duration::ZERO)
                .map_or(Duration::from_secs(5), |t| t.min(Duration::from_secs(5)));
            match TcpStream::connect_timeout(&sa, attempt) {
                Ok(stream) => return self.hello(stream, deadline),
                Err(e) => {
                    refused &= e.kind() == io::ErrorKind::ConnectionRefused;
                    last = format!("{sa}: {e}");
                }
            }
        }
        Err(Attempt::Retry { why: last, refused })
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

    /// The error for a store not reached within the connect timeout;
    /// `refused`: every attempt was refused (nothing listens there).
    fn unreachable(&self, waited: Duration, last: &str, refused: bool) -> Error {
        let reason = if refused {
            format!(
                "nothing listens at {}: every connection was refused for {:.1} s (last: {last}); \
                 rank 0 serves the rendezvous store there once it starts: check that rank 0 was \
                 started and has not failed (its output says why), and that every rank has the \
                 same FERROCOLL_ADDR (or MASTER_ADDR and MASTER_PORT): host and port",
                self.addr,
                waited.as_secs_f64()
            )
        } else {
            format!(
                "the store at {} could not be reached after {:.1} s (last error: {last}); check \
                 that rank 0 is running and has started the store, that the address is \
                 reachable from this host, and that no firewall blocks the port",
                self.addr,
                waited.as_secs_f64()
            )
        };
        Error::Config {
            var: "FERROCOLL_ADDR".into(),
            value: self.addr.clone(),
            reason,
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
    pub(super) fn call(
        &mut self,
        op: &str,
        key: &str,
        request: &[u8],
        extra: Duration,
    ) -> Result<Vec<u8>> {
        let deadline = deadline_after(self.timeout);
        if self.stream.is_none() {
            match self.open(deadline) {
                Ok(s) => self.stream = Some(s),
                Err(Attempt::Fatal(e)) => return Err(e),
                Err(Attempt::Retry { why: last, .. }) => {
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
pub(super) enum Attempt {
    /// Worth retrying (refused, unreachable, unresolvable): the last cause,
    /// and whether every address refused the connection (nothing listens).
    Retry {
        /// The last cause.
        why: String,
        /// Every address tried refused the connection.
        refused: bool,
    },
    /// Not worth retrying (the store answered and said no).
    Fatal(Error),
}

pub(super) fn check_key(key: &str) -> Result<()> {
    if key.len() > MAX_KEY_LEN {
        return Err(Error::invalid(format!(
            "store key {} is longer than the {MAX_KEY_LEN} bytes the store takes",
            show_key(key)
        )));
    }
    Ok(())
}

impl Rendezvous for StoreClient {
    fn set(&mut self, key: &str, value: &[u8]) -> Result<()> {
        StoreClient::set(self, key, value)
    }
    fn wait(&mut self, keys: &[&str]) -> Result<Vec<Vec<u8>>> {
        StoreClient::wait(self, keys)
    }
    fn add(&mut self, key: &str, delta: i64) -> Result<i64> {
        StoreClient::add(self, key, delta)
    }
    fn describe(&self) -> String {
        self.addr().to_string()
    }
    /// Asks for each key in turn (the store answers a `get` at once).
    fn missing(&mut self, keys: &[&str]) -> Option<Vec<usize>> {
        let mut absent = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            if StoreClient::get(self, key).ok()?.is_none() {
                absent.push(i);
            }
        }
        Some(absent)
    }
    /// The store's own barrier, whose timeout says how many ranks arrived.
    fn barrier(&mut self, name: &str, size: usize) -> Result<()> {
        StoreClient::barrier(self, name, size)
    }
}
