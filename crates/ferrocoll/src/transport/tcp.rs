//! TCP channels, for ranks on different hosts (or any ranks, with
//! `FERROCOLL_TRANSPORT=tcp`).
//!
//! Every pair of ranks that talks over TCP shares one connection, opened at
//! start-up: each rank listens on the interface named by
//! `FERROCOLL_SOCKET_IFNAME` (or, by default, the one that routes to the
//! rendezvous store), publishes its address in the store, and connects to
//! every lower rank; the higher rank connects, so each pair has exactly one
//! connection. A connection starts with a hello (magic, a hash of the job
//! secret, the connecting rank) so a stray client is turned away.
//!
//! Sockets are non-blocking with `TCP_NODELAY` and 4 MiB buffers; the engine
//! (`engine.rs`) writes and reads them as far as they go and sleeps in
//! `poll(2)`, so a ring step sends and receives at once (full duplex).
//! A frame whose receive stores its payload unchanged (a copy, not a
//! reduction) or keeps it as unexpected is read from the socket straight
//! into that memory (`Channel::recv_into`); the rest goes through the
//! channel's staging buffer, which takes many small frames in one read.
//! While a frame arrives, the socket's receive low-water mark is the rest
//! of it (up to `LOWAT_BYTES`), so a sleeping receiver wakes for large
//! reads (`Channel::await_bytes`).

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use super::channel::Channel;
use super::config::TransportConfig;
use crate::error::{Error, Result};

/// Bytes of receive buffer per connection.
const RECV_BUFFER: usize = 1 << 20;

const HELLO_MAGIC: u64 = u64::from_le_bytes(*b"FCTCP\0\0\x01");

/// Bytes sent on one stream before the next stream takes over, when a peer
/// is reached over several streams.
const STRIPE_BYTES: usize = 256 << 10;

/// The connection to one peer: one TCP stream, or several carrying
/// consecutive stripes of [`STRIPE_BYTES`] in turn (`FERROCOLL_TCP_STREAMS`),
/// so a large message is spread over several connections (on a real network
/// a single flow often cannot fill the link). Both ends walk the streams in
/// the same order, so the byte stream the engine sees is unchanged.
pub(crate) struct TcpChannel {
    streams: Vec<TcpStream>,
    /// Stream being written and bytes left in its stripe.
    send_at: usize,
    send_left: usize,
    /// Stream being read and bytes left in its stripe.
    recv_at: usize,
    recv_left: usize,
    /// Received bytes not yet consumed: `buf[start..end]` (as bytes). The
    /// buffer is `u64`s so that offered slices are 8-byte aligned whenever
    /// the stream position is.
    buf: Vec<u64>,
    start: usize,
    end: usize,
    /// The peer closed its end; what is buffered is still delivered.
    eof: bool,
    /// By stream: its `SO_RCVLOWAT` now (1, the kernel's default, until
    /// [`Channel::await_bytes`] sets it).
    lowat: Vec<usize>,
    /// The largest `SO_RCVLOWAT` set: a fraction of the receive buffer, so
    /// that the kernel can always queue that much.
    lowat_max: usize,
}

/// The largest `SO_RCVLOWAT` a channel sets: a read of this size costs
/// one system call per ~100 us at loopback speeds, against one per packet
/// (64 KiB or less) when every arrival wakes the receiver.
const LOWAT_BYTES: usize = 256 << 10;

/// Sets the socket options every stream gets: no Nagle delay, kernel
/// buffers of `size` bytes each way (the kernel may cap it; 0 or less keeps
/// its default), non-blocking.
fn configure(stream: &TcpStream, size: libc::c_int) -> io::Result<()> {
    stream.set_nodelay(true)?;
    for opt in [libc::SO_SNDBUF, libc::SO_RCVBUF]
        .into_iter()
        .filter(|_| size > 0)
    {
        // SAFETY: a valid socket and a pointer to a c_int of the size
        // passed; a failure only leaves the default buffer size.
        unsafe {
            libc::setsockopt(
                stream.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&size as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }
    stream.set_nonblocking(true)
}

impl TcpChannel {
    /// A channel over `streams` (in stripe order), each with kernel
    /// buffers of `socket_buffer` bytes.
    fn new(streams: Vec<TcpStream>, socket_buffer: libc::c_int) -> io::Result<TcpChannel> {
        assert!(!streams.is_empty(), "a channel needs a stream");
        for s in &streams {
            configure(s, socket_buffer)?;
        }
        Ok(TcpChannel {
            send_at: 0,
            send_left: STRIPE_BYTES,
            recv_at: 0,
            recv_left: STRIPE_BYTES,
            buf: vec![0u64; RECV_BUFFER / 8],
            start: 0,
            end: 0,
            eof: false,
            lowat: vec![1; streams.len()],
            lowat_max: if socket_buffer > 0 {
                (socket_buffer as usize / 4).clamp(1, LOWAT_BYTES)
            } else {
                64 << 10
            },
            streams,
        })
    }
}

/// The error of a stream the peer closed.
fn closed() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "the connection was closed (the process exited or failed)",
    )
}

fn would_block(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}

impl TcpChannel {
    /// `n` bytes were read from the stream being read: over several
    /// streams, the next one takes over at the end of its stripe (one
    /// stream reads on, whatever the count).
    fn advance_recv(&mut self, n: usize) {
        if self.streams.len() == 1 {
            return;
        }
        self.recv_left -= n;
        if self.recv_left == 0 {
            self.recv_at = (self.recv_at + 1) % self.streams.len();
            self.recv_left = STRIPE_BYTES;
        }
    }
}

impl Channel for TcpChannel {
    fn send_some(&mut self, data: &[u8]) -> io::Result<usize> {
        let mut sent = 0;
        while sent < data.len() {
            let n = (data.len() - sent).min(self.send_left);
            match self.streams[self.send_at].write(&data[sent..sent + n]) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "connection closed",
                    ))
                }
                Ok(k) => {
                    sent += k;
                    self.send_left -= k;
                    if self.send_left == 0 {
                        self.send_at = (self.send_at + 1) % self.streams.len();
                        self.send_left = STRIPE_BYTES;
                    }
                }
                Err(e) if would_block(&e) => break,
                Err(e) => return Err(e),
            }
        }
        Ok(sent)
    }

    fn recv_some(&mut self, take: &mut dyn FnMut(&[u8]) -> usize) -> io::Result<usize> {
        if self.start == self.end {
            // Keep the buffer offset congruent to the stream position mod 8.
            let phase = self.start % 8;
            self.start = phase;
            self.end = phase;
        } else if self.end == RECV_BUFFER {
            // Move the unconsumed tail to the front, keeping its phase.
            let phase = self.start % 8;
            let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut self.buf);
            bytes.copy_within(self.start..self.end, phase);
            self.end = phase + (self.end - self.start);
            self.start = phase;
        }
        if self.end < RECV_BUFFER && !self.eof {
            let room = (RECV_BUFFER - self.end).min(self.recv_left);
            let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut self.buf);
            match self.streams[self.recv_at].read(&mut bytes[self.end..self.end + room]) {
                Ok(0) => self.eof = true,
                Ok(n) => {
                    self.end += n;
                    self.advance_recv(n);
                }
                Err(e) if would_block(&e) => {}
                Err(e) => return Err(e),
            }
        }
        // What arrived before a close is still delivered.
        let used = if self.start < self.end {
            let bytes: &[u8] = bytemuck::cast_slice(&self.buf);
            take(&bytes[self.start..self.end])
        } else {
            0
        };
        self.start += used;
        if used == 0 && self.eof {
            return Err(closed());
        }
        Ok(used)
    }

    fn reads_into(&self) -> bool {
        true
    }

    fn recv_into(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        if dst.is_empty() {
            return Ok(0);
        }
        // What the staging buffer holds comes first, in stream order.
        if self.start < self.end {
            let n = (self.end - self.start).min(dst.len());
            let bytes: &[u8] = bytemuck::cast_slice(&self.buf);
            dst[..n].copy_from_slice(&bytes[self.start..self.start + n]);
            self.start += n;
            return Ok(n);
        }
        if self.eof {
            return Err(closed());
        }
        // One stream: as much as the caller wants (fewer system calls);
        // several: no further than the stripe of the stream being read.
        let room = if self.streams.len() == 1 {
            dst.len()
        } else {
            dst.len().min(self.recv_left)
        };
        match self.streams[self.recv_at].read(&mut dst[..room]) {
            Ok(0) => {
                self.eof = true;
                Err(closed())
            }
            Ok(n) => {
                // The empty buffer's offset keeps following the stream
                // position mod 8, so later offers stay aligned.
                self.start = (self.start + n) % 8;
                self.end = self.start;
                self.advance_recv(n);
                Ok(n)
            }
            Err(e) if would_block(&e) => Ok(0),
            Err(e) => Err(e),
        }
    }

    fn await_bytes(&mut self, bytes: usize) {
        // What the staging buffer holds is not in the socket any more; over
        // several streams, the one being read carries the rest of its
        // stripe only.
        let mut want = bytes.saturating_sub(self.end - self.start);
        if self.streams.len() > 1 {
            want = want.min(self.recv_left);
        }
        let want = want.clamp(1, self.lowat_max);
        let at = self.recv_at;
        if self.lowat[at] == want {
            return;
        }
        let value = want as libc::c_int;
        // SAFETY: a valid socket and a pointer to a c_int of the size
        // passed; a failure leaves the old mark (reads are unaffected).
        let rc = unsafe {
            libc::setsockopt(
                self.streams[at].as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVLOWAT,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            self.lowat[at] = want;
        }
    }

    fn poll_fds(&self) -> Option<(RawFd, RawFd)> {
        Some((
            self.streams[self.recv_at].as_raw_fd(),
            self.streams[self.send_at].as_raw_fd(),
        ))
    }
}

/// The local address to listen on: the interface `FERROCOLL_SOCKET_IFNAME`
/// names, or the one the kernel routes `store_addr` through.
fn listen_ip(store_addr: &str, ifname: Option<&str>) -> Result<IpAddr> {
    if let Some(name) = ifname {
        return interface_ip(name);
    }
    let target = store_addr
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| Error::Config {
            var: "FERROCOLL_ADDR".into(),
            value: store_addr.into(),
            reason: "cannot resolve the rendezvous address".into(),
        })?;
    let bind: SocketAddr = if target.is_ipv4() {
        "0.0.0.0:0".parse().expect("literal")
    } else {
        "[::]:0".parse().expect("literal")
    };
    // A connected UDP socket sends nothing but tells which local address
    // the route to the target uses.
    let probe = UdpSocket::bind(bind)
        .and_then(|s| s.connect(target).map(|_| s))
        .and_then(|s| s.local_addr());
    match probe {
        Ok(a) => Ok(a.ip()),
        Err(e) => Err(Error::Config {
            var: "FERROCOLL_SOCKET_IFNAME".into(),
            value: String::new(),
            reason: format!(
                "no route to the rendezvous {store_addr} ({e}); name the interface to use"
            ),
        }),
    }
}

/// The first IPv4 (else IPv6) address of interface `name`.
fn interface_ip(name: &str) -> Result<IpAddr> {
    let mut found: Vec<IpAddr> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` with a linked list we only read and
    // then free with freeifaddrs; every node's fields are valid until then.
    unsafe {
        if libc::getifaddrs(&mut list) == 0 {
            let mut cur = list;
            while !cur.is_null() {
                let ifa = &*cur;
                let ifname = std::ffi::CStr::from_ptr(ifa.ifa_name)
                    .to_string_lossy()
                    .into_owned();
                if !ifa.ifa_addr.is_null() {
                    let family = i32::from((*ifa.ifa_addr).sa_family);
                    let ip = if family == libc::AF_INET {
                        let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                        Some(IpAddr::from(
                            u32::from_be(sin.sin_addr.s_addr).to_be_bytes(),
                        ))
                    } else if family == libc::AF_INET6 {
                        let sin6 = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                        Some(IpAddr::from(sin6.sin6_addr.s6_addr))
                    } else {
                        None
                    };
                    if let Some(ip) = ip {
                        if ifname == name {
                            found.push(ip);
                        }
                        if !names.contains(&ifname) {
                            names.push(ifname);
                        }
                    }
                }
                cur = ifa.ifa_next;
            }
            libc::freeifaddrs(list);
        }
    }
    found.sort_by_key(|ip| ip.is_ipv6());
    found.first().copied().ok_or_else(|| Error::Config {
        var: "FERROCOLL_SOCKET_IFNAME".into(),
        value: name.into(),
        reason: format!(
            "no interface of that name with an address; this host has: {}",
            names.join(", ")
        ),
    })
}

fn secret_hash(secret: &str) -> u64 {
    // FNV-1a: the hello only has to tell jobs apart, not resist attackers.
    secret.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// The first bytes on every connection: magic, secret hash, the connecting
/// rank and which of its streams to this peer this is.
fn hello(secret: &str, rank: usize, stream: usize) -> [u8; 32] {
    let mut b = [0u8; 32];
    b[0..8].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
    b[8..16].copy_from_slice(&secret_hash(secret).to_le_bytes());
    b[16..24].copy_from_slice(&(rank as u64).to_le_bytes());
    b[24..32].copy_from_slice(&(stream as u64).to_le_bytes());
    b
}

/// Opens TCP connections on first use.
///
/// Every rank listens from the start and publishes its address in the
/// store; a connection between two ranks is made only when one of them first
/// has a message for the other, so a job whose algorithms talk to few peers
/// (rings, trees, hierarchical plans: O(log N) or O(1) peers per rank) never
/// opens the N² connections of a full mesh. The higher rank of a pair always
/// connects and the lower one accepts, so a pair never ends up with two
/// connections: every plan that sends from a to b also receives at b from a,
/// so the higher rank needs the connection as soon as the lower one does.
pub(crate) struct TcpConnector {
    rank: usize,
    listener: TcpListener,
    me: SocketAddr,
    /// Listening addresses of the peers this rank may connect to.
    addrs: std::collections::HashMap<usize, SocketAddr>,
    secret: String,
    /// Streams per peer (`FERROCOLL_TCP_STREAMS`).
    streams: usize,
    /// Kernel buffer size per stream (`FERROCOLL_SOCKET_BUFFER`).
    socket_buffer: libc::c_int,
    /// The interface named by `FERROCOLL_SOCKET_IFNAME`, for error messages.
    ifname: Option<String>,
    timeout: Duration,
    /// Streams accepted per peer, by stream index, until all are in.
    arriving: std::collections::HashMap<usize, Vec<Option<TcpStream>>>,
    /// Accepted connections whose hello is still arriving: the stream, its
    /// bytes so far, and when it was accepted.
    greeting: Vec<(TcpStream, Vec<u8>, Instant)>,
}

impl TcpConnector {
    /// Listens on the interface `FERROCOLL_SOCKET_IFNAME` names
    /// ([`TransportConfig::socket_ifname`]; or the one the kernel routes
    /// `route_to`, the rendezvous, through), opening `config.tcp_streams`
    /// streams per peer later. The caller
    /// publishes [`TcpConnector::address`] and hands the peers' addresses
    /// back with [`TcpConnector::add_peer`]: this module knows nothing of
    /// the rendezvous store.
    pub(crate) fn listen(
        rank: usize,
        route_to: &str,
        secret: &str,
        timeout: Duration,
        config: &TransportConfig,
    ) -> Result<TcpConnector> {
        let ifname = config.socket_ifname.clone();
        let ip = listen_ip(route_to, ifname.as_deref())?;
        let io_err = |what: String, e: io::Error| Error::Config {
            var: "FERROCOLL_SOCKET_IFNAME".into(),
            value: ifname.clone().unwrap_or_default(),
            reason: format!("{what}: {e}"),
        };
        let listener =
            TcpListener::bind((ip, 0)).map_err(|e| io_err(format!("cannot listen on {ip}"), e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| io_err("listener".into(), e))?;
        let me = listener
            .local_addr()
            .map_err(|e| io_err("listener address".into(), e))?;
        Ok(TcpConnector {
            rank,
            listener,
            me,
            addrs: Default::default(),
            secret: secret.to_string(),
            streams: config.tcp_streams,
            socket_buffer: config.socket_buffer,
            ifname,
            timeout,
            arriving: Default::default(),
            greeting: Vec::new(),
        })
    }

    /// The address this rank listens on, for peers to connect to.
    pub(crate) fn address(&self) -> SocketAddr {
        self.me
    }

    /// Records where `peer` listens (only lower ranks are ever connected
    /// to), so that connecting later needs no store: rank 0, which serves
    /// it, may have exited by then.
    pub(crate) fn add_peer(&mut self, peer: usize, addr: SocketAddr) {
        self.addrs.insert(peer, addr);
    }

    /// The listening socket, to poll for connecting peers.
    pub(crate) fn listener_fd(&self) -> RawFd {
        self.listener.as_raw_fd()
    }

    /// Connects to lower rank `peer` (blocking up to the timeout).
    pub(crate) fn connect(&mut self, peer: usize) -> Result<Box<dyn Channel>> {
        assert!(peer < self.rank, "the higher rank of a pair connects");
        let rank = self.rank;
        let target = *self.addrs.get(&peer).ok_or_else(|| {
            Error::Internal(format!("rank {rank} has no address for rank {peer}"))
        })?;
        let addr = target.to_string();
        let deadline = Instant::now() + self.timeout;
        let ifname = self.ifname.clone().unwrap_or_default();
        let fail = |e: io::Error| Error::Config {
            var: "FERROCOLL_SOCKET_IFNAME".into(),
            value: ifname.clone(),
            reason: format!(
                "rank {rank} cannot connect to rank {peer} at {addr}: {e}; check that the hosts \
                 reach each other on that interface"
            ),
        };
        let mut streams = Vec::with_capacity(self.streams);
        for index in 0..self.streams {
            let mut stream = loop {
                match TcpStream::connect_timeout(&target, Duration::from_secs(1)) {
                    Ok(s) => break s,
                    // The peer listened on this address since start-up: a
                    // refusal means it has exited.
                    Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                        return Err(Error::PeerLost { rank: peer })
                    }
                    Err(_) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    Err(e) => return Err(fail(e)),
                }
            };
            stream
                .write_all(&hello(&self.secret, rank, index))
                .map_err(fail)?;
            streams.push(stream);
        }
        Ok(Box::new(
            TcpChannel::new(streams, self.socket_buffer).map_err(fail)?,
        ))
    }

    /// Accepts whatever peers have connected; returns the channels of those
    /// whose streams are all in.
    pub(crate) fn accept(&mut self) -> Result<Vec<(usize, Box<dyn Channel>)>> {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    // Hellos are read without blocking: a client that
                    // connects and says nothing must not stall progress.
                    if stream.set_nonblocking(true).is_ok() {
                        self.greeting.push((stream, Vec::new(), Instant::now()));
                    }
                }
                Err(e) if would_block(&e) => break,
                Err(e) => {
                    return Err(Error::Internal(format!(
                        "rank {} could not accept on {}: {e}",
                        self.rank, self.me
                    )))
                }
            }
        }
        let mut ready = Vec::new();
        let mut i = 0;
        while i < self.greeting.len() {
            let (stream, got, since) = &mut self.greeting[i];
            let mut b = [0u8; 32];
            let outcome = match stream.read(&mut b[..32 - got.len()]) {
                Ok(0) => Some(false), // closed before saying hello
                Ok(n) => {
                    got.extend_from_slice(&b[..n]);
                    (got.len() == 32).then_some(true)
                }
                Err(e) if would_block(&e) => (since.elapsed() > HELLO_WAIT).then_some(false),
                Err(_) => Some(false),
            };
            match outcome {
                None => i += 1,
                Some(false) => {
                    self.greeting.swap_remove(i);
                }
                Some(true) => {
                    let (stream, hello, _) = self.greeting.swap_remove(i);
                    if let Some(peer_chan) = self.admit(stream, &hello)? {
                        ready.push(peer_chan);
                    }
                }
            }
        }
        Ok(ready)
    }

    /// Checks a complete hello and files the stream under its rank; returns
    /// the peer's channel once all its streams are in.
    fn admit(&mut self, stream: TcpStream, b: &[u8]) -> Result<Option<(usize, Box<dyn Channel>)>> {
        let word = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        if word(0) != HELLO_MAGIC || word(8) != secret_hash(&self.secret) {
            return Ok(None); // a stray client or another job: ignore it
        }
        let (peer, index) = (word(16) as usize, word(24) as usize);
        if peer <= self.rank || index >= self.streams {
            return Err(Error::Internal(format!(
                "rank {} got a TCP hello from rank {peer} (stream {index})",
                self.rank
            )));
        }
        let slots = self.arriving.entry(peer).or_default();
        slots.resize_with(self.streams, || None);
        slots[index] = Some(stream);
        if !slots.iter().all(Option::is_some) {
            return Ok(None);
        }
        let streams: Vec<TcpStream> = self
            .arriving
            .remove(&peer)
            .expect("present")
            .into_iter()
            .map(|s| s.expect("all present"))
            .collect();
        let chan = TcpChannel::new(streams, self.socket_buffer)
            .map_err(|e| Error::Internal(format!("socket options for rank {peer}: {e}")))?;
        Ok(Some((peer, Box::new(chan) as Box<dyn Channel>)))
    }
}

/// How long an accepted connection may take to say hello.
const HELLO_WAIT: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::*;

    /// Two channels joined by `k` loopback connections.
    fn pair_of(k: usize) -> (TcpChannel, TcpChannel) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for _ in 0..k {
            a.push(TcpStream::connect(l.local_addr().unwrap()).unwrap());
            b.push(l.accept().unwrap().0);
        }
        let size = TransportConfig::default().socket_buffer;
        (
            TcpChannel::new(a, size).unwrap(),
            TcpChannel::new(b, size).unwrap(),
        )
    }

    fn pair() -> (TcpChannel, TcpChannel) {
        pair_of(1)
    }

    #[test]
    fn streams_bytes_in_order_with_aligned_offers() {
        for k in [1, 3] {
            stream_through(pair_of(k));
        }
    }

    fn stream_through((mut a, mut b): (TcpChannel, TcpChannel)) {
        let total = 8 << 20;
        let data: Vec<u64> = (0..total as u64 / 8).collect();
        let bytes: &[u8] = bytemuck::cast_slice(&data);
        let mut sent = 0;
        let mut got = Vec::with_capacity(total);
        let deadline = Instant::now() + Duration::from_secs(20);
        while got.len() < total {
            assert!(Instant::now() < deadline, "stalled at {}", got.len());
            if sent < total {
                let piece = (sent % 100_003 + 1).min(total - sent);
                sent += a.send_some(&bytes[sent..sent + piece]).unwrap();
            }
            b.recv_some(&mut |s| {
                // Consume multiples of 8 only, as the engine does.
                let n = s.len() & !7;
                if n > 0 {
                    assert_eq!(s.as_ptr() as usize % 8, 0, "offered slice misaligned");
                }
                got.extend_from_slice(&s[..n]);
                n
            })
            .unwrap();
        }
        assert!(got == bytes, "stream corrupted");
    }

    /// Reads straight into the caller's memory (odd sizes, so the stream
    /// position ends anywhere), mixed with offers of the staging buffer and
    /// with receive low-water marks, over one stream and two: the bytes
    /// come in order, and offers from a word boundary stay aligned.
    #[test]
    fn recv_into_mixes_with_offers() {
        for k in [1, 2] {
            let (mut a, mut b) = pair_of(k);
            let total = 6 << 20;
            let data: Vec<u8> = (0..total).map(|i| (i * 7 + i / 4099) as u8).collect();
            let (mut sent, mut got) = (0, Vec::with_capacity(total));
            let deadline = Instant::now() + Duration::from_secs(20);
            let sizes = [1usize, 7, 8, 13, 4096, 65_537, 300_001, 1 << 20];
            let mut turn = 0;
            while got.len() < total {
                assert!(Instant::now() < deadline, "stalled at {}", got.len());
                if sent < total {
                    sent += a
                        .send_some(&data[sent..total.min(sent + 1_000_003)])
                        .unwrap();
                }
                turn += 1;
                let want = sizes[turn % sizes.len()].min(total - got.len());
                if turn % 3 == 0 {
                    let mut first_offer = true;
                    let at = got.len();
                    b.recv_some(&mut |s| {
                        if at % 8 == 0 && first_offer && !s.is_empty() {
                            assert_eq!(s.as_ptr() as usize % 8, 0, "offer misaligned");
                        }
                        first_offer = false;
                        let n = s.len().min(want);
                        got.extend_from_slice(&s[..n]);
                        n
                    })
                    .unwrap();
                } else {
                    let mut dst = vec![0u8; want];
                    let n = b.recv_into(&mut dst).unwrap();
                    got.extend_from_slice(&dst[..n]);
                }
                b.await_bytes(sizes[(turn * 5) % sizes.len()]);
            }
            assert!(got == data, "stream corrupted over {k} streams");
        }
    }

    /// The channel trait's own `recv_into` (for channels that stage every
    /// byte anyway) copies out of `recv_some`'s offer.
    #[test]
    fn default_recv_into_goes_through_the_offer() {
        struct Staged(Vec<u8>, usize);
        impl Channel for Staged {
            fn send_some(&mut self, _: &[u8]) -> io::Result<usize> {
                Ok(0)
            }
            fn recv_some(&mut self, take: &mut dyn FnMut(&[u8]) -> usize) -> io::Result<usize> {
                // Offers up to 10 bytes at a time, as a ring offers up to
                // its wrap point.
                let end = self.0.len().min(self.1 + 10);
                let n = take(&self.0[self.1..end]);
                self.1 += n;
                Ok(n)
            }
        }
        let mut c = Staged((0..100u8).collect(), 0);
        let mut got = Vec::new();
        let mut dst = [0u8; 7];
        loop {
            let n = c.recv_into(&mut dst).unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&dst[..n]);
        }
        assert_eq!(got, (0..100u8).collect::<Vec<_>>());
        assert!(!c.reads_into(), "staging channels say so");
    }

    #[test]
    fn a_client_without_the_secret_is_turned_away() {
        let addr = "127.0.0.1:9";
        let mut rank0 = TcpConnector::listen(
            0,
            addr,
            "job secret",
            Duration::from_secs(5),
            &TransportConfig::default(),
        )
        .unwrap();
        let target = rank0.me;
        // A stray client (another job's secret), then garbage, then rank 1.
        let mut stray = TcpStream::connect(target).unwrap();
        stray.write_all(&hello("other secret", 1, 0)).unwrap();
        let mut garbage = TcpStream::connect(target).unwrap();
        garbage.write_all(&[0xAB; 32]).unwrap();
        // A client that connects and says nothing does not hold anyone up.
        let _silent = TcpStream::connect(target).unwrap();
        let mut rank1 = TcpConnector::listen(
            1,
            addr,
            "job secret",
            Duration::from_secs(5),
            &TransportConfig::default(),
        )
        .unwrap();
        rank1.add_peer(0, rank0.address());
        let mut to0 = rank1.connect(0).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut accepted = Vec::new();
        while accepted.is_empty() {
            assert!(Instant::now() < deadline, "rank 1 was never accepted");
            accepted = rank0.accept().unwrap();
        }
        assert_eq!(accepted.len(), 1, "only rank 1 gets in");
        assert_eq!(accepted[0].0, 1);
        // The accepted channel carries bytes.
        let (_, mut from1) = accepted.pop().unwrap();
        while to0.send_some(&[7u8; 8]).unwrap() == 0 {}
        let mut got = Vec::new();
        while got.len() < 8 {
            from1
                .recv_some(&mut |b| {
                    got.extend_from_slice(b);
                    b.len()
                })
                .unwrap();
        }
        assert_eq!(got, [7u8; 8]);
    }

    #[test]
    fn closed_peer_is_an_error() {
        let (a, mut b) = pair();
        drop(a);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match b.recv_some(&mut |s| s.len()) {
                Err(e) => {
                    assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
                    break;
                }
                Ok(_) => assert!(Instant::now() < deadline, "EOF not seen"),
            }
        }
    }

    #[test]
    fn unknown_interface_lists_the_real_ones() {
        let err = interface_ip("no-such-if0").unwrap_err().to_string();
        assert!(
            err.contains("FERROCOLL_SOCKET_IFNAME") && err.contains("lo"),
            "{err}"
        );
        assert!(interface_ip("lo").unwrap().is_loopback());
    }

    #[test]
    fn route_to_loopback_is_loopback() {
        assert!(listen_ip("127.0.0.1:1", None).unwrap().is_loopback());
    }
}
