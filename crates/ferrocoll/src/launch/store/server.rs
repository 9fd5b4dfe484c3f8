//! The store's server: one thread per connection, waits on a condition variable.

use super::*;

// ---------------------------------------------------------------------------
// Server
// ---------------------------------------------------------------------------

/// What the server threads share.
pub(super) struct Shared {
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
    /// Set by [`StoreServer::fail_waits`]: why every wait now fails (read
    /// and written under `map`'s lock).
    failed: Mutex<Option<String>>,
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
            bind_error(match e.kind() {
                io::ErrorKind::AddrNotAvailable => format!(
                    "the store cannot listen there ({e}): it is not an address of this host; \
                     give an address of the host that serves the store"
                ),
                io::ErrorKind::AddrInUse => format!(
                    "the store cannot listen there ({e}): another process (another job, or \
                     torchrun's own store on MASTER_PORT) already listens on that port; pick \
                     a free port"
                ),
                _ => format!(
                    "the store cannot listen there ({e}); use an address of this host and a \
                     free port (port 0 picks one)"
                ),
            })
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
            failed: Mutex::new(None),
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

    /// Fails every `wait`, those blocked now and those to come, with
    /// `why` (a `FAILED` answer, which clients turn into
    /// [`Error::Startup`]): the rank serving the store gave up on the
    /// start-up and tells the ranks still waiting why, rather than
    /// vanishing under them. Other requests are still answered.
    pub fn fail_waits(&self, why: &str) {
        let map = lock(&self.shared.map);
        *lock(&self.shared.failed) = Some(why.to_string());
        drop(map);
        self.shared.changed.notify_all();
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

pub(super) fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
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
pub(super) fn serve_connection(mut stream: TcpStream, shared: &Shared) {
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
pub(super) fn key_of<'a>(d: &mut Dec<'a>) -> Option<&'a str> {
    let key = d.field()?;
    if key.len() > MAX_KEY_LEN {
        return None;
    }
    std::str::from_utf8(key).ok()
}

pub(super) fn error_frame(msg: &str) -> Vec<u8> {
    Enc::new(msg.len() + 5)
        .u8(ST_ERROR)
        .field(msg.as_bytes())
        .finish()
}

/// Answers one request; `None` closes the connection.
pub(super) fn handle(request: &[u8], shared: &Shared) -> Option<Vec<u8>> {
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
        failed: Mutex::new(None),
    };
    // A smaller frame limit than the server's keeps each run quick; the
    // parsing is the same.
    while let Ok(request) = read_frame(&mut bytes, 1 << 20) {
        let _ = handle(&request, &shared);
    }
}

pub(super) fn wait_for(keys: &[&str], wait_ms: u64, shared: &Shared) -> Option<Vec<u8>> {
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
        if let Some(why) = lock(&shared.failed).as_deref() {
            return Some(
                Enc::new(why.len() + 5)
                    .u8(ST_FAILED)
                    .field(why.as_bytes())
                    .finish(),
            );
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
