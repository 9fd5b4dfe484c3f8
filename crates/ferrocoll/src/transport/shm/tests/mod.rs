//! Unit tests of the segment, rings, doorbell and liveness checks.

use super::process::pid_alive;
use super::segment::*;
use super::*;
use crate::transport::channel::{Channel, Doorbell};
use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;
use std::time::Instant;

/// A job name unique to this process and call.
fn job(tag: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!(
        "t{}-{tag}{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Two attached nodes of one job, local ranks 0 and 1.
fn pair(tag: &str, ring_bytes: usize) -> (ShmNode, ShmNode) {
    let j = job(tag);
    let mut a = ShmNode::create(&j, 0, 2, ring_bytes).unwrap();
    let mut b = ShmNode::create(&j, 1, 2, ring_bytes).unwrap();
    a.attach(1, b.name()).unwrap();
    b.attach(0, a.name()).unwrap();
    (a, b)
}

/// xorshift64*, for reproducible random piece sizes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Byte `pos` of the stream with `seed`: little-endian u64 counter.
fn pattern_byte(seed: u64, pos: usize) -> u8 {
    ((pos as u64 / 8).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seed).to_le_bytes()[pos % 8]
}

/// Sends `total` bytes of pattern `seed_out` and receives `total` bytes of
/// pattern `seed_in` on one channel, in random pieces, consuming
/// multiples of 8; returns the longest doorbell wait.
fn duplex(
    mut ch: Box<dyn Channel>,
    bell: Arc<dyn Doorbell>,
    total: usize,
    seed_out: u64,
    seed_in: u64,
) -> Duration {
    let mut rng = Rng(seed_out | 1);
    let src: Vec<u8> = (0..total).map(|p| pattern_byte(seed_out, p)).collect();
    let (mut sent, mut got) = (0, 0);
    let mut idle = 0u32;
    let mut longest = Duration::ZERO;
    while sent < total || got < total {
        let token = bell.token();
        let mut moved = false;
        if sent < total {
            let piece = (1 + rng.below(100_000)).min(total - sent);
            let n = ch.send_some(&src[sent..sent + piece]).unwrap();
            sent += n;
            moved |= n > 0;
        }
        if got < total {
            let budget = rng.below(100_000);
            let n = ch
                .recv_some(&mut |bytes: &[u8]| {
                    assert_eq!(
                        bytes.as_ptr() as usize % 8,
                        0,
                        "offered slice not 8-aligned"
                    );
                    let n = bytes.len().min(budget) / 8 * 8;
                    for (i, &b) in bytes[..n].iter().enumerate() {
                        if b != pattern_byte(seed_in, got + i) {
                            panic!(
                                "byte {} is {b}, expected {}",
                                got + i,
                                pattern_byte(seed_in, got + i)
                            );
                        }
                    }
                    n
                })
                .unwrap();
            got += n;
            moved |= n > 0;
        }
        if moved {
            idle = 0;
        } else {
            idle += 1;
            if idle < 50 {
                std::hint::spin_loop();
            } else {
                let t = Instant::now();
                bell.wait(token, Duration::from_secs(3));
                longest = longest.max(t.elapsed());
            }
        }
    }
    longest
}

#[test]
fn shm_streams_64_mib_full_duplex() {
    let (a, b) = pair("duplex", MIN_RING_BYTES);
    let total = 64 << 20;
    let (ca, ba) = (a.channel(1), a.doorbell());
    let (cb, bb) = (b.channel(0), b.doorbell());
    let ta = thread::spawn(move || duplex(ca, ba, total, 0x1234, 0x5678));
    let tb = thread::spawn(move || duplex(cb, bb, total, 0x5678, 0x1234));
    let (wa, wb) = (ta.join().unwrap(), tb.join().unwrap());
    // A lost wake-up would show as a wait running into its 3 s timeout.
    assert!(
        wa < Duration::from_secs(1) && wb < Duration::from_secs(1),
        "{wa:?} {wb:?}"
    );
}

#[test]
fn shm_four_ranks_all_to_all_with_sleeping() {
    let n = 4;
    let per_peer = 4 << 20;
    let j = job("a2a");
    let mut nodes: Vec<ShmNode> = (0..n)
        .map(|r| ShmNode::create(&j, r, n, MIN_RING_BYTES).unwrap())
        .collect();
    let names: Vec<String> = nodes.iter().map(|x| x.name().to_string()).collect();
    for (r, node) in nodes.iter_mut().enumerate() {
        for (p, name) in names.iter().enumerate() {
            if p != r {
                node.attach(p, name).unwrap();
            }
        }
    }
    for node in &nodes {
        node.unlink();
    }
    let handles: Vec<_> = nodes
        .iter()
        .enumerate()
        .map(|(r, node)| {
            let mut chans: Vec<_> = (0..n).map(|p| (p != r).then(|| node.channel(p))).collect();
            let bell = node.doorbell();
            thread::spawn(move || {
                let seed = |from: usize, to: usize| (from * 16 + to) as u64;
                let out: Vec<Vec<u8>> = (0..n)
                    .map(|p| (0..per_peer).map(|i| pattern_byte(seed(r, p), i)).collect())
                    .collect();
                let mut sent = vec![0; n];
                let mut got = vec![0; n];
                sent[r] = per_peer;
                got[r] = per_peer;
                let mut longest = Duration::ZERO;
                let mut idle = 0;
                while sent.iter().chain(&got).any(|&x| x < per_peer) {
                    let token = bell.token();
                    let mut moved = false;
                    for p in (0..n).filter(|&p| p != r) {
                        let ch = chans[p].as_mut().unwrap();
                        if sent[p] < per_peer {
                            let end = (sent[p] + 40_000).min(per_peer);
                            let k = ch.send_some(&out[p][sent[p]..end]).unwrap();
                            sent[p] += k;
                            moved |= k > 0;
                        }
                        let at = got[p];
                        let k = ch
                            .recv_some(&mut |b: &[u8]| {
                                let k = b.len() / 8 * 8;
                                assert!(b[..k]
                                    .iter()
                                    .enumerate()
                                    .all(|(i, &x)| x == pattern_byte(seed(p, r), at + i)));
                                k
                            })
                            .unwrap();
                        got[p] += k;
                        moved |= k > 0;
                    }
                    if moved {
                        idle = 0;
                    } else {
                        idle += 1;
                        if idle > 20 {
                            let t = Instant::now();
                            bell.wait(token, Duration::from_secs(3));
                            longest = longest.max(t.elapsed());
                        }
                    }
                }
                longest
            })
        })
        .collect();
    for h in handles {
        let longest = h.join().unwrap();
        assert!(
            longest < Duration::from_millis(2500),
            "lost wake-up? {longest:?}"
        );
    }
}

#[test]
fn shm_loopback_channel() {
    let j = job("loop");
    let node = ShmNode::create(&j, 0, 1, MIN_RING_BYTES).unwrap();
    let mut ch = node.channel(0);
    assert_eq!(ch.send_some(b"12345678").unwrap(), 8);
    let mut out = Vec::new();
    ch.recv_some(&mut |b: &[u8]| {
        out.extend_from_slice(b);
        b.len()
    })
    .unwrap();
    assert_eq!(out, b"12345678");
}

#[test]
fn shm_send_stops_when_full_and_resumes() {
    let (a, b) = pair("full", MIN_RING_BYTES);
    let (mut tx, mut rx) = (a.channel(1), b.channel(0));
    let data = vec![7u8; 3 * MIN_RING_BYTES];
    let mut sent = 0;
    loop {
        let n = tx.send_some(&data[sent..]).unwrap();
        if n == 0 {
            break;
        }
        sent += n;
    }
    assert_eq!(sent, MIN_RING_BYTES);
    let n = rx
        .recv_some(&mut |b: &[u8]| b.len().min(1000) / 8 * 8)
        .unwrap();
    assert_eq!(n, 1000 / 8 * 8);
    assert_eq!(tx.send_some(&data[sent..]).unwrap(), n);
    assert_eq!(tx.send_some(&data[sent..]).unwrap(), 0);
}

#[test]
fn shm_doorbell_wakes_on_send() {
    let (a, b) = pair("bell", MIN_RING_BYTES);
    let mut tx = a.channel(1);
    let bell = b.doorbell();
    let token = bell.token();
    assert_send_wakes(tx.as_mut(), move || {
        bell.wait(token, Duration::from_secs(5))
    });
}

/// Runs `sleep` (a doorbell wait of 5 s) on a thread, sends 8 bytes on `tx`
/// 100 ms later, and checks that the sleeper woke within a second of it.
fn assert_send_wakes(tx: &mut dyn Channel, sleep: impl FnOnce() + Send + 'static) {
    let waiter = thread::spawn(move || {
        sleep();
        Instant::now()
    });
    thread::sleep(Duration::from_millis(100));
    let sent_at = Instant::now();
    assert_eq!(tx.send_some(&[1; 8]).unwrap(), 8);
    let woke_at = waiter.join().unwrap();
    let latency = woke_at.saturating_duration_since(sent_at);
    assert!(
        latency < Duration::from_secs(1),
        "woke {latency:?} after the send"
    );
}

/// A poll set of one descriptor that never becomes ready: the read end of
/// a socket pair whose other end stays open and silent (as a rank's
/// sockets to other hosts while it waits on a local peer).
/// Both ends are returned, to be kept open while the set is in use.
fn silent_socket() -> ([std::os::unix::net::UnixStream; 2], Vec<libc::pollfd>) {
    use std::os::fd::AsRawFd;
    let (quiet, other) = std::os::unix::net::UnixStream::pair().unwrap();
    let fds = vec![libc::pollfd {
        fd: quiet.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    ([quiet, other], fds)
}

#[test]
fn shm_doorbell_wakes_a_rank_sleeping_in_poll() {
    let (a, b) = pair("pollbell", MIN_RING_BYTES);
    let mut tx = a.channel(1);
    let bell = b.doorbell();
    // Nothing rings: the sleep lasts its timeout (no 1 ms slices: the ring
    // below, not a timeout, is what ends the next one).
    let (_keep, fds) = silent_socket();
    let t = Instant::now();
    bell.wait_polling(bell.token(), fds, Duration::from_millis(300));
    assert!(
        t.elapsed() >= Duration::from_millis(250),
        "returned after {:?} with nothing rung",
        t.elapsed()
    );
    // A local peer's send wakes it at once.
    let (_keep, fds) = silent_socket();
    let token = bell.token();
    assert_send_wakes(tx.as_mut(), move || {
        bell.wait_polling(token, fds, Duration::from_secs(5))
    });
}

#[test]
fn a_deaf_doorbell_polls_in_short_slices() {
    let (_a, b) = pair("deafbell", MIN_RING_BYTES);
    // What a peer that could not duplicate the eventfd leaves behind.
    b.segments().unwrap()[1].deaf().store(1, Ordering::SeqCst);
    let bell = b.doorbell();
    let (_keep, fds) = silent_socket();
    let t = Instant::now();
    bell.wait_polling(bell.token(), fds, Duration::from_secs(5));
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "slept {:?}: a ring might not have woken it",
        t.elapsed()
    );
}

#[test]
fn shm_doorbell_wakes_on_recv_and_ring_local() {
    let (a, b) = pair("bell2", MIN_RING_BYTES);
    let (mut tx, mut rx) = (a.channel(1), b.channel(0));
    tx.send_some(&[1; 8]).unwrap();
    // The sender waits for space; the receiver consuming rings it.
    let bell = a.doorbell();
    let token = bell.token();
    let waiter = thread::spawn(move || {
        let t = Instant::now();
        bell.wait(token, Duration::from_secs(5));
        t.elapsed()
    });
    thread::sleep(Duration::from_millis(50));
    assert_eq!(rx.recv_some(&mut |b: &[u8]| b.len()).unwrap(), 8);
    assert!(waiter.join().unwrap() < Duration::from_secs(1));

    let bell = b.doorbell();
    let token = bell.token();
    let other = Arc::clone(&bell);
    let waiter = thread::spawn(move || {
        let t = Instant::now();
        other.wait(token, Duration::from_secs(5));
        t.elapsed()
    });
    thread::sleep(Duration::from_millis(50));
    bell.ring_local();
    assert!(waiter.join().unwrap() < Duration::from_secs(1));
}

#[test]
fn shm_doorbell_stale_token_and_timeout() {
    let (a, b) = pair("stale", MIN_RING_BYTES);
    let mut tx = a.channel(1);
    let bell = b.doorbell();
    let token = bell.token();
    tx.send_some(&[1; 8]).unwrap();
    let t = Instant::now();
    bell.wait(token, Duration::from_secs(5));
    assert!(
        t.elapsed() < Duration::from_millis(100),
        "{:?}",
        t.elapsed()
    );

    let token = bell.token();
    let t = Instant::now();
    bell.wait(token, Duration::from_millis(50));
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_millis(45) && waited < Duration::from_secs(1),
        "{waited:?}"
    );
    bell.wait(token, Duration::ZERO);
}

#[test]
fn shm_unlink_keeps_channel_working() {
    let (a, b) = pair("unlink", MIN_RING_BYTES);
    let (pa, pb) = (
        Path::new(SHM_DIR).join(a.name()),
        Path::new(SHM_DIR).join(b.name()),
    );
    assert!(pa.exists() && pb.exists());
    a.unlink();
    b.unlink();
    a.unlink();
    assert!(!pa.exists() && !pb.exists());
    let (mut tx, mut rx) = (a.channel(1), b.channel(0));
    drop((a, b));
    assert_eq!(tx.send_some(b"abcdefgh").unwrap(), 8);
    let mut out = Vec::new();
    rx.recv_some(&mut |bytes: &[u8]| {
        out.extend_from_slice(bytes);
        bytes.len()
    })
    .unwrap();
    assert_eq!(out, b"abcdefgh");
}

#[test]
fn shm_drop_unlinks() {
    let j = job("drop");
    let node = ShmNode::create(&j, 0, 1, MIN_RING_BYTES).unwrap();
    let path = Path::new(SHM_DIR).join(node.name());
    assert!(path.exists());
    drop(node);
    assert!(!path.exists());
}

#[test]
fn shm_remove_job_segments_only_removes_that_job() {
    let j = job("rm");
    let dir = Path::new(SHM_DIR);
    let mine = [
        format!("ferrocoll-{j}-0"),
        format!("ferrocoll-{j}-13"),
        format!("ferrocoll-{j}-n0-1"),
    ];
    let others = [
        format!("ferrocoll-{j}x-0"),
        format!("ferrocoll-{j}_n0-0"),
        format!("ferrocoll-{j}"),
        format!("other-{j}-0"),
        format!("ferrocoll-x{j}-0"),
    ];
    for n in mine.iter().chain(&others) {
        fs::write(dir.join(n), b"x").unwrap();
    }
    assert_eq!(remove_job_segments(&j).unwrap(), 3);
    for n in &mine {
        assert!(!dir.join(n).exists(), "{n}");
    }
    for n in &others {
        assert!(dir.join(n).exists(), "{n}");
        fs::remove_file(dir.join(n)).unwrap();
    }
    assert_eq!(remove_job_segments(&j).unwrap(), 0);
    assert!(remove_job_segments("../etc").is_err());
}

#[test]
fn shm_pid_alive_tracks_child() {
    let mut child = std::process::Command::new("sleep")
        .arg("10")
        .spawn()
        .unwrap();
    let pid = child.id();
    assert!(pid_alive(pid));
    child.kill().unwrap();
    // Killed but not reaped: a zombie, which counts as dead.
    let t = Instant::now();
    while pid_alive(pid) {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "zombie still looks alive"
        );
        thread::sleep(Duration::from_millis(1));
    }
    child.wait().unwrap();
    assert!(!pid_alive(pid));
    assert!(pid_alive(std::process::id()));
    assert!(!pid_alive(0));
    assert!(!pid_alive(u32::MAX));
}

#[test]
fn shm_check_alive_of_live_peer() {
    let (a, _b) = pair("alive", MIN_RING_BYTES);
    assert!(a.channel(1).check_alive().is_ok());
}

/// Tells the child half of [`shm_cross_process_echo_and_death`] its job.
const CHILD_ENV: &str = "FERROCOLL_SHM_TEST_CHILD_JOB";
/// Bytes the cross-process test sends and gets back.
const ECHO_BYTES: usize = 8 << 20;

/// The child process of [`shm_cross_process_echo_and_death`]: local
/// rank 1, echoes `ECHO_BYTES` back to rank 0, then idles until killed
/// (without unlinking, like a rank killed during start-up). Does nothing
/// when run on its own.
#[test]
#[ignore = "helper: the child process of shm_cross_process_echo_and_death"]
fn shm_cross_process_child() {
    let Ok(j) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut node = ShmNode::create(&j, 1, 2, MIN_RING_BYTES).unwrap();
    node.attach(0, &format!("ferrocoll-{j}-0")).unwrap();
    let mut ch = node.channel(0);
    let bell = node.doorbell();
    let mut buf = Vec::with_capacity(ECHO_BYTES);
    let mut sent = 0;
    while sent < ECHO_BYTES {
        let token = bell.token();
        let got = ch
            .recv_some(&mut |b: &[u8]| {
                buf.extend_from_slice(b);
                b.len()
            })
            .unwrap();
        let put = ch.send_some(&buf[sent..]).unwrap();
        sent += put;
        if got == 0 && put == 0 {
            ch.check_alive().unwrap();
            bell.wait(token, Duration::from_millis(100));
        }
    }
    std::mem::forget(node);
    // Idle until killed; give up if the parent test goes away.
    let start = Instant::now();
    while ch.check_alive().is_ok() && start.elapsed() < Duration::from_secs(60) {
        thread::sleep(Duration::from_millis(20));
    }
}

/// Kills and reaps a child process when a test ends, even by panicking.
struct Reap(std::process::Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the child of [`shm_cross_process_child`] as local rank 1 of job
/// `j` and echoes [`ECHO_BYTES`] through it: returns our node, the
/// channel to the child, our doorbell and the child.
fn echo_with_child(j: &str) -> (ShmNode, Box<dyn Channel>, Arc<dyn Doorbell>, Reap) {
    let mut node = ShmNode::create(j, 0, 2, MIN_RING_BYTES).unwrap();
    let tests = module_path!().split_once("::").unwrap().1;
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            &format!("{tests}::shm_cross_process_child"),
            "--ignored",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, j)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let child = Reap(child);
    let start = Instant::now();
    while let Err(e) = node.attach(1, &format!("ferrocoll-{j}-1")) {
        // The child creates its segment after starting up.
        assert!(start.elapsed() < Duration::from_secs(30), "{e}");
        thread::sleep(Duration::from_millis(5));
    }
    let mut ch = node.channel(1);
    let bell = node.doorbell();
    let out: Vec<u8> = (0..ECHO_BYTES).map(|i| pattern_byte(7, i)).collect();
    let (mut sent, mut got) = (0, 0);
    while got < ECHO_BYTES {
        let token = bell.token();
        let put = ch.send_some(&out[sent..]).unwrap();
        sent += put;
        let k = ch
            .recv_some(&mut |b: &[u8]| {
                assert_eq!(b, &out[got..got + b.len()]);
                b.len()
            })
            .unwrap();
        got += k;
        if put == 0 && k == 0 {
            ch.check_alive().unwrap();
            bell.wait(token, Duration::from_millis(100));
        }
    }
    (node, ch, bell, child)
}

#[test]
fn shm_cross_process_echo_and_death() {
    let j = job("xproc");
    let (node, mut ch, _bell, mut child) = echo_with_child(&j);
    node.unlink();
    assert!(ch.check_alive().is_ok());

    // Killed, then a zombie, then reaped: dead throughout.
    child.0.kill().unwrap();
    let start = Instant::now();
    let err = loop {
        match ch.check_alive() {
            Ok(()) => assert!(start.elapsed() < Duration::from_secs(5)),
            Err(e) => break e,
        }
        thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
    assert!(err.to_string().contains(&child.0.id().to_string()), "{err}");
    child.0.wait().unwrap();
    assert!(ch.check_alive().is_err());
    // The child never unlinked its segment; the launcher's clean-up does.
    assert_eq!(remove_job_segments(&j).unwrap(), 1);
}

/// A rank asleep on its doorbell, with nothing to wake it but the node's
/// watcher, learns of its peer's SIGKILL at once: the sleep ends and the
/// channel fails, well within 50 ms (the periodic check alone took up to
/// 200 ms).
#[test]
fn shm_dead_peer_wakes_a_sleeping_rank_at_once() {
    let j = job("watch");
    let (node, mut ch, bell, child) = echo_with_child(&j);
    node.unlink();
    let pid = child.0.id() as libc::pid_t;
    let killer = thread::spawn(move || {
        thread::sleep(Duration::from_millis(100));
        let at = Instant::now();
        // SAFETY: signals our own child process, which is not reaped
        // before this thread is joined (`child` lives until the end).
        unsafe { libc::kill(pid, libc::SIGKILL) };
        at
    });
    let start = Instant::now();
    let mut sleeps = 0;
    let err = loop {
        let token = bell.token();
        match ch.recv_some(&mut |b: &[u8]| b.len()) {
            Err(e) => break e,
            Ok(_) => assert!(start.elapsed() < Duration::from_secs(10), "never noticed"),
        }
        sleeps += 1;
        bell.wait(token, Duration::from_secs(10));
    };
    let noticed = killer.join().unwrap().elapsed();
    println!("a sleeping rank noticed its peer's SIGKILL after {noticed:?} ({sleeps} sleeps)");
    assert_eq!(err.kind(), io::ErrorKind::BrokenPipe, "{err}");
    assert!(err.to_string().contains("has exited"), "{err}");
    assert!(
        noticed < Duration::from_millis(50),
        "noticed {noticed:?} after the kill ({sleeps} sleeps)"
    );
    drop(child);
    assert_eq!(remove_job_segments(&j).unwrap(), 1);
}

/// A fake segment header at `path` claiming `pid`.
fn write_fake_header(path: &Path, pid: u32) {
    let mut hdr = vec![0u8; 4096];
    hdr[HDR_MAGIC..HDR_MAGIC + 8].copy_from_slice(&MAGIC.to_le_bytes());
    hdr[HDR_VERSION..HDR_VERSION + 4].copy_from_slice(&VERSION.to_le_bytes());
    hdr[HDR_PID..HDR_PID + 4].copy_from_slice(&pid.to_le_bytes());
    fs::write(path, hdr).unwrap();
}

#[test]
fn shm_create_over_stale_file() {
    // Garbage left behind.
    let j = job("stale");
    let path = Path::new(SHM_DIR).join(format!("ferrocoll-{j}-0"));
    fs::write(&path, b"left over").unwrap();
    let node = ShmNode::create(&j, 0, 1, MIN_RING_BYTES).unwrap();
    assert_eq!(
        fs::metadata(&path).unwrap().len(),
        segment_len(1, MIN_RING_BYTES).unwrap() as u64
    );
    drop(node);

    // A valid header of a process that has exited.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    write_fake_header(&path, dead);
    drop(ShmNode::create(&j, 0, 1, MIN_RING_BYTES).unwrap());

    // A valid header of a live process: not ours to remove.
    let mut child = std::process::Command::new("sleep")
        .arg("10")
        .spawn()
        .unwrap();
    write_fake_header(&path, child.id());
    let err = ShmNode::create(&j, 0, 1, MIN_RING_BYTES).err().unwrap();
    assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
    child.kill().unwrap();
    child.wait().unwrap();
    fs::remove_file(&path).unwrap();
}

#[test]
fn shm_rejects_bad_arguments_and_mismatched_peers() {
    let j = job("bad");
    assert!(ShmNode::create("a/b", 0, 2, MIN_RING_BYTES).is_err());
    assert!(ShmNode::create("", 0, 2, MIN_RING_BYTES).is_err());
    assert!(ShmNode::create(&j, 2, 2, MIN_RING_BYTES).is_err());
    assert!(ShmNode::create(&j, 0, 2, 1 << 15).is_err());
    assert!(ShmNode::create(&j, 0, 2, MIN_RING_BYTES + 8).is_err());

    let mut a = ShmNode::create(&j, 0, 2, MIN_RING_BYTES).unwrap();
    let other = job("bad");
    let b = ShmNode::create(&other, 1, 2, 2 * MIN_RING_BYTES).unwrap();
    let err = a.attach(1, b.name()).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    let c = ShmNode::create(&other, 0, 3, MIN_RING_BYTES).unwrap();
    assert_eq!(
        a.attach(1, c.name()).unwrap_err().kind(),
        io::ErrorKind::InvalidData
    );
    let missing = format!("ferrocoll-{j}-1");
    assert_eq!(
        a.attach(1, &missing).unwrap_err().kind(),
        io::ErrorKind::NotFound
    );
    assert!(a.attach(1, "../etc/passwd").is_err());
    assert!(a.attach(5, &missing).is_err());
    let own = a.name().to_string();
    a.attach(0, &own).unwrap();
}

mod bench;

#[test]
fn eager_buffers_are_large_on_small_hosts_and_never_overlap_the_rings() {
    for local_size in 1..=9 {
        let buffer = eager_buffer_bytes(local_size);
        let expected = if local_size <= LARGE_EAGER_MAX_LOCAL {
            LARGE_EAGER_BYTES
        } else {
            EAGER_BYTES
        };
        assert_eq!(buffer, expected, "{local_size} local ranks");
        // Every sender's buffers end where the next sender's begin, and
        // the last sender's where the rings begin.
        let eager = eager_start(local_size).unwrap();
        let rings = rings_start(local_size).unwrap();
        assert_eq!(rings - eager, local_size * EAGER_BUFFERS * buffer);
        assert_eq!(eager % BLOCK, 0);
    }
}
