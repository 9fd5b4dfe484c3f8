//! Shared-memory byte channels between the processes of one host (Linux).
//!
//! Every rank creates one segment, a file in `/dev/shm` named
//! `ferrocoll-{job}-{local_rank}`, and maps the segment of every local peer.
//! A rank's segment holds its `Doorbell` and one *inbound* ring per local
//! peer; a rank sends to a peer by writing into the ring for it inside the
//! peer's segment, and receives by reading the rings of its own segment.
//!
//! # Layout
//!
//! All offsets are from the start of the segment; `B` = 128 bytes (two cache
//! lines, so that the adjacent-line prefetcher cannot make two independently
//! written words share a line pair).
//!
//! ```text
//! 0        header: magic u64 | version u32 | pid u32 | local_size u64 | ring_bytes u64
//! B        doorbell: rings u32 (futex word) | sleepers u32
//! 2B       notices u64: control notices peers have written into our rings
//! 3B       mailbox 0 (tiny messages from local rank 0 to the owner)
//! ...      mailbox i at 3B + i * (1 + SLOTS) * B:
//!            +0   ack u64: messages consumed (written by the owner only)
//!            +B   SLOTS slots of B bytes: stamp u64 | comm u64 | seq u64 |
//!                 signature u64 | payload (up to 96 bytes)
//! M        ring 0   (bytes from local rank 0 to the owner), M = 3B + local_size * (1 + SLOTS) * B
//! ...      ring i at M + i * (2B + ring_bytes):
//!            +0   head u64: total bytes written (written by the sender only)
//!            +B   tail u64: total bytes consumed (written by the receiver only)
//!            +2B  ring_bytes of data (64-byte aligned)
//! ```
//!
//! The mailboxes carry the small-collective fast path
//! (`fastpath.rs`); their protocol is described there.
//!
//! Every shared word is only ever accessed through atomics, by every process.
//! The header is written by the creator before it stores `magic` with
//! `Release`; `attach` loads `magic` with `Acquire` before reading the rest.
//!
//! # The ring protocol
//!
//! One producer, one consumer. Positions are monotonically increasing `u64`
//! stream offsets; the byte at position `p` lives at data index
//! `p & (ring_bytes - 1)` (`ring_bytes` is a power of two, at least 64 KiB).
//! The sender owns `head`, the receiver owns `tail`, and `0 <= head - tail <=
//! ring_bytes` always holds.
//!
//! * The sender copies bytes into `[head, head + n)` (free space, so the
//!   receiver is not reading it), then stores `head + n` with `Release`.
//! * The receiver loads `head` with `Acquire`, which makes every byte below it
//!   visible, reads them, then stores the new `tail` with `Release`.
//! * The sender loads `tail` with `Acquire` before reusing space below it, so
//!   the receiver's reads of that space happen before the sender overwrites
//!   it.
//!
//! Each side keeps a private copy of its own position and a cached copy of
//! the other side's (a lower bound of the real value, so never unsafe to
//! use), and reloads the shared word only when the cached value is not
//! enough: the fast path of a send or receive is a load, a `memcpy`, a
//! store and a doorbell ring, with no system call unless the other side
//! sleeps. Large transfers move in pieces of at most a quarter of the ring
//! (64 KiB at most), each published as soon as it is copied, so sender and
//! receiver work on different pieces at the same time instead of in lockstep.
//!
//! Wrap points and piece sizes are multiples of 8 and the data area is
//! 64-byte aligned, so as long as the consumer consumes in multiples of 8
//! bytes (the engine does), every slice offered by `recv_some` starts 8-byte
//! aligned, whatever the sender's piece sizes were.
//!
//! # The doorbell
//!
//! An event count: `rings` is incremented (`SeqCst` read-modify-write) after
//! every publication of `head` (the receiver may be waiting for data) and of
//! `tail` (the sender may be waiting for space), in the doorbell of the rank
//! that may be waiting. A waiter reads the count (`token`, `Acquire`: it
//! synchronises with the increment, so whatever was published before the
//! increment is visible to the channel checks that follow), checks its
//! channels and, if nothing moved, calls `wait(token)`: it increments
//! `sleepers`, rereads `rings` and sleeps in `FUTEX_WAIT` (shared, not
//! private: the word is in memory shared between processes) only while the
//! count still equals the token. The ringer increments `rings` and then reads
//! `sleepers`, calling `FUTEX_WAKE` only when it is non-zero. With all four
//! of those accesses `SeqCst`, either the waiter sees the new count (and does
//! not sleep) or the ringer sees the sleeper (and wakes it); a ring landing
//! between the waiter's check and its entering the kernel makes
//! `FUTEX_WAIT` fail with `EAGAIN`, since the kernel compares the word
//! itself. No wake-up is lost, and a rank nobody waits on costs its ringers
//! one atomic increment and one load.
//!
//! # Lifetime
//!
//! The file is unlinked (`ShmNode::unlink`) as soon as every peer has
//! mapped it, so a killed job leaves nothing in `/dev/shm`; the mappings
//! stay valid. [`remove_job_segments`] removes what a rank that died early
//! left behind. A peer killed by a signal cannot close anything, so
//! `Channel::check_alive` watches its pid (recorded in its segment header).
//! Ranks must share a pid namespace for that check (and for `attach`) to work.

use std::fmt::Display;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use memmap2::{Advice, MmapOptions, MmapRaw};

use super::channel::{Channel, Doorbell};

/// Where the segments live (a tmpfs on every Linux distribution).
const SHM_DIR: &str = "/dev/shm";
/// Prefix of every segment file name.
const NAME_PREFIX: &str = "ferrocoll-";
/// First word of every segment header.
const MAGIC: u64 = u64::from_le_bytes(*b"FERROSHM");
/// Layout version, bumped on any change to the segment layout.
const VERSION: u32 = 2;
/// Spacing of independently written words: two cache lines.
const BLOCK: usize = 128;

/// Header: magic (u64).
const HDR_MAGIC: usize = 0;
/// Header: layout version (u32).
const HDR_VERSION: usize = 8;
/// Header: creator's pid (u32).
const HDR_PID: usize = 12;
/// Header: number of inbound rings (u64).
const HDR_LOCAL_SIZE: usize = 16;
/// Header: bytes of data per ring (u64).
const HDR_RING_BYTES: usize = 24;
/// Header length as read back by a stale-file check.
const HDR_LEN: usize = 32;
/// Doorbell: the futex word counting rings (u32).
const BELL_RINGS: usize = BLOCK;
/// Doorbell: number of threads inside [`Doorbell::wait`] (u32).
const BELL_SLEEPERS: usize = BLOCK + 4;
/// Count of control notices written to this rank (u64, see [`Mailboxes::notices`]).
const NOTICES: usize = 2 * BLOCK;
/// Offset of mailbox 0.
const MAILBOXES_START: usize = 3 * BLOCK;
/// Slots per mailbox: how many tiny messages a sender may have unconsumed.
/// Beyond the room to run ahead, more slots mean fewer reads of the
/// receiver's `ack` (a sender reloads it only when its cached copy says the
/// mailbox is full, so once every `SLOTS - 1` messages in lockstep).
pub(crate) const SLOTS: usize = 16;
/// Bytes of one mailbox: its `ack` block and its slots.
const MAILBOX_BYTES: usize = (1 + SLOTS) * BLOCK;
/// Slot: header bytes before the payload (stamp, comm, seq, signature).
const SLOT_HEADER: usize = 32;
/// Most payload bytes one slot carries.
pub(crate) const SLOT_PAYLOAD: usize = BLOCK - SLOT_HEADER;
/// Ring: `head` offset within the ring.
const RING_HEAD: usize = 0;
/// Ring: `tail` offset within the ring.
const RING_TAIL: usize = BLOCK;
/// Ring: data offset within the ring.
const RING_DATA: usize = 2 * BLOCK;

/// Smallest accepted ring size.
pub(crate) const MIN_RING_BYTES: usize = 64 << 10;
/// Largest piece published at once (see the module documentation).
const MAX_PIECE: usize = 64 << 10;

/// Adds `what` to an error's message, keeping its kind.
fn context(e: io::Error, what: impl Display) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// An `InvalidInput` error.
fn invalid_input(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// An `InvalidData` error.
fn invalid_data(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// Checks that a job name is non-empty and only `[A-Za-z0-9_-]`.
fn validate_job(job: &str) -> io::Result<()> {
    let ok = !job.is_empty()
        && job
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(invalid_input(format!(
            "shared-memory job name {job:?} must be non-empty and only contain [A-Za-z0-9_-]"
        )))
    }
}

/// Offset of ring 0 in a segment of `local_size` mailboxes.
fn rings_start(local_size: usize) -> Option<usize> {
    MAILBOX_BYTES
        .checked_mul(local_size)?
        .checked_add(MAILBOXES_START)
}

/// Segment length for `local_size` mailboxes and rings of `ring_bytes`, if
/// it fits.
fn segment_len(local_size: usize, ring_bytes: usize) -> Option<usize> {
    ring_bytes
        .checked_add(RING_DATA)?
        .checked_mul(local_size)?
        .checked_add(rings_start(local_size)?)
}

/// This process's pid.
fn own_pid() -> u32 {
    std::process::id()
}

/// Whether process `pid` exists and is not a zombie.
///
/// `kill(pid, 0)` failing with `ESRCH` means it is gone; a zombie (state `Z`
/// or `X` in `/proc/{pid}/stat`) has exited but not been reaped yet, which for
/// a peer means the same.
pub(crate) fn pid_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 sends nothing; kill only checks that the process
    // exists and that we may signal it. No memory is involved.
    let r = unsafe { libc::kill(pid, 0) };
    if r != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return false;
    }
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state is the first field after the command name, which is in
        // parentheses and may itself contain ") ".
        Ok(stat) => match stat.rfind(')') {
            Some(i) => !matches!(
                stat[i + 1..].trim_start().as_bytes().first(),
                Some(b'Z' | b'X')
            ),
            None => true,
        },
        // Gone between kill and the read, unless /proc is not mounted at all.
        Err(e) if e.kind() == io::ErrorKind::NotFound => !Path::new("/proc/self/stat").exists(),
        Err(_) => true,
    }
}

/// Sleeps on a shared futex word while it holds `expected`, for at most
/// `timeout`. Returns on a wake-up, a mismatch, a signal or the timeout.
fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(libc::time_t::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as _,
    };
    // SAFETY: `word` is a valid, aligned u32 for the duration of the call
    // (it lives in a mapping the caller keeps alive) and `ts` is a valid
    // timespec on our stack. FUTEX_WAIT (not _PRIVATE: the word is shared
    // between processes) only reads the word. Errors (EAGAIN, EINTR,
    // ETIMEDOUT) all mean "return to the caller", which rechecks.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Wakes every thread, in any process, sleeping on a shared futex word.
fn futex_wake_all(word: &AtomicU32) {
    // SAFETY: `word` is a valid, aligned u32 in a live mapping; FUTEX_WAKE
    // does not access memory through the pointer, it only uses it as a key.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

/// One mapped segment (ours or a peer's) and its geometry.
struct Segment {
    /// The shared mapping; every access to it goes through the accessors
    /// below.
    map: MmapRaw,
    /// Number of rings.
    local_size: usize,
    /// Data bytes per ring.
    ring_bytes: usize,
    /// Pid of the process that created the segment.
    pid: u32,
}

impl Segment {
    /// The `AtomicU64` at byte offset `off`.
    fn u64_at(&self, off: usize) -> &AtomicU64 {
        assert!(off & 7 == 0 && off + 8 <= self.map.len());
        // SAFETY: the offset is 8-aligned and inside the mapping (checked
        // above; the mapping itself is page-aligned), the mapping lives as
        // long as `self` and so outlives the returned reference, and every
        // process only ever accesses this word atomically.
        unsafe { &*(self.map.as_mut_ptr().add(off) as *const AtomicU64) }
    }

    /// The `AtomicU32` at byte offset `off`.
    fn u32_at(&self, off: usize) -> &AtomicU32 {
        assert!(off & 3 == 0 && off + 4 <= self.map.len());
        // SAFETY: as in `u64_at`: 4-aligned, inside the mapping, which
        // outlives the reference, and only ever accessed atomically.
        unsafe { &*(self.map.as_mut_ptr().add(off) as *const AtomicU32) }
    }

    /// The doorbell's futex word.
    fn rings(&self) -> &AtomicU32 {
        self.u32_at(BELL_RINGS)
    }

    /// The number of threads sleeping on the doorbell.
    fn sleepers(&self) -> &AtomicU32 {
        self.u32_at(BELL_SLEEPERS)
    }

    /// Offset of ring `i` (bytes from local rank `i`).
    fn ring_offset(&self, i: usize) -> usize {
        assert!(i < self.local_size);
        MAILBOXES_START + self.local_size * MAILBOX_BYTES + i * (RING_DATA + self.ring_bytes)
    }

    /// Offset of mailbox `i` (tiny messages from local rank `i`).
    fn mailbox_offset(&self, i: usize) -> usize {
        assert!(i < self.local_size);
        MAILBOXES_START + i * MAILBOX_BYTES
    }

    /// Ring `i`'s `head` (total bytes written by its sender).
    fn head(&self, i: usize) -> &AtomicU64 {
        self.u64_at(self.ring_offset(i) + RING_HEAD)
    }

    /// Ring `i`'s `tail` (total bytes consumed by its receiver).
    fn tail(&self, i: usize) -> &AtomicU64 {
        self.u64_at(self.ring_offset(i) + RING_TAIL)
    }

    /// Start of ring `i`'s data (`ring_bytes` long, 64-byte aligned).
    fn data(&self, i: usize) -> *mut u8 {
        let off = self.ring_offset(i) + RING_DATA;
        debug_assert!(off + self.ring_bytes <= self.map.len());
        // SAFETY: `off + ring_bytes` is within the mapping (the segment
        // length is computed from the same geometry and checked against the
        // file), so the pointer stays in bounds.
        unsafe { self.map.as_mut_ptr().add(off) }
    }

    /// Rings this segment's doorbell: bumps the count and wakes sleepers,
    /// if any (see the module documentation for why this loses nothing).
    fn ring_bell(&self) {
        self.rings().fetch_add(1, Ordering::SeqCst);
        if self.sleepers().load(Ordering::SeqCst) > 0 {
            futex_wake_all(self.rings());
        }
    }

    /// Writes the header (magic last, with `Release`).
    fn write_header(&self) {
        self.u32_at(HDR_VERSION).store(VERSION, Ordering::Relaxed);
        self.u32_at(HDR_PID).store(self.pid, Ordering::Relaxed);
        self.u64_at(HDR_LOCAL_SIZE)
            .store(self.local_size as u64, Ordering::Relaxed);
        self.u64_at(HDR_RING_BYTES)
            .store(self.ring_bytes as u64, Ordering::Relaxed);
        self.u64_at(HDR_MAGIC).store(MAGIC, Ordering::Release);
    }
}

/// Reads the pid out of an existing segment file's header, if the file has
/// a valid header.
fn header_pid(path: &Path) -> Option<u32> {
    let mut file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .ok()?;
    let mut hdr = [0u8; HDR_LEN];
    file.read_exact(&mut hdr).ok()?;
    let word = |off: usize| u64::from_le_bytes(hdr[off..off + 8].try_into().unwrap());
    let half = |off: usize| u32::from_le_bytes(hdr[off..off + 4].try_into().unwrap());
    (word(HDR_MAGIC) == MAGIC && half(HDR_VERSION) == VERSION).then(|| half(HDR_PID))
}

/// Creates `path` exclusively, read-write, mode 0600.
fn create_exclusive(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// Gives the file its length, allocating the memory now so that a too-small
/// `/dev/shm` is an error here rather than a `SIGBUS` later.
fn allocate(file: &File, len: usize, path: &Path) -> io::Result<()> {
    let off_len = libc::off_t::try_from(len)
        .map_err(|_| invalid_input(format!("shared-memory segment of {len} bytes is too large")))?;
    // SAFETY: the descriptor is open for writing for the whole call; no
    // memory is passed.
    let r = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, off_len) };
    match r {
        0 => Ok(()),
        libc::EOPNOTSUPP | libc::EINVAL => file.set_len(len as u64),
        e => Err(context(
            io::Error::from_raw_os_error(e),
            format_args!(
                "cannot allocate {len} bytes for {} (is {SHM_DIR} too small? containers often \
                 need a larger --shm-size)",
                path.display()
            ),
        )),
    }
}

/// This rank's segment: its doorbell and one inbound ring per local peer.
///
/// Dropping the node unlinks its file if [`ShmNode::unlink`] was not called
/// yet, so keep it until every peer has attached. Channels and doorbells
/// handed out keep the mappings alive on their own.
pub(crate) struct ShmNode {
    /// File name under `/dev/shm`.
    name: String,
    /// Full path of the file.
    path: PathBuf,
    /// This rank's index among the local ranks.
    local_rank: usize,
    /// Our own segment.
    own: Arc<Segment>,
    /// Peers' segments, by local rank (`own` at `local_rank`).
    peers: Vec<Option<Arc<Segment>>>,
    /// Which channels were handed out (each ring has one producer).
    taken: Vec<AtomicBool>,
    /// Whether the file was unlinked.
    unlinked: AtomicBool,
    /// Channels made from now on use the single-copy path.
    cma: bool,
    /// Channels made from now on map peers' shared buffers.
    shared: bool,
}

impl ShmNode {
    /// Creates `/dev/shm/ferrocoll-{job}-{local_rank}` (`O_CREAT|O_EXCL`,
    /// mode 0600; a stale file of that name left by a dead run is removed and
    /// the creation retried once), sized for `local_size` inbound rings of
    /// `ring_bytes` each (`ring_bytes`: a power of two, at least 64 KiB),
    /// maps it and writes its header (magic, version, pid, local_size,
    /// ring_bytes). `job` is `[A-Za-z0-9_-]`.
    ///
    /// Fails with `AlreadyExists` if the file belongs to a live process.
    pub fn create(
        job: &str,
        local_rank: usize,
        local_size: usize,
        ring_bytes: usize,
    ) -> io::Result<ShmNode> {
        validate_job(job)?;
        if local_rank >= local_size {
            return Err(invalid_input(format!(
                "local rank {local_rank} out of range for {local_size} local ranks"
            )));
        }
        if !ring_bytes.is_power_of_two() || ring_bytes < MIN_RING_BYTES {
            return Err(invalid_input(format!(
                "shared-memory ring size {ring_bytes} must be a power of two of at least {MIN_RING_BYTES}"
            )));
        }
        let len = segment_len(local_size, ring_bytes).ok_or_else(|| {
            invalid_input(format!(
                "{local_size} shared-memory rings of {ring_bytes} bytes do not fit in memory"
            ))
        })?;
        let name = format!("{NAME_PREFIX}{job}-{local_rank}");
        let path = Path::new(SHM_DIR).join(&name);

        let file = match create_exclusive(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                if let Some(pid) = header_pid(&path) {
                    if pid != own_pid() && pid_alive(pid) {
                        return Err(io::Error::new(
                            io::ErrorKind::AlreadyExists,
                            format!(
                                "{} is in use by live process {pid} (two jobs with the same name?)",
                                path.display()
                            ),
                        ));
                    }
                }
                match fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => {
                        return Err(context(
                            e,
                            format_args!("cannot remove stale {}", path.display()),
                        ))
                    }
                }
                create_exclusive(&path)
                    .map_err(|e| context(e, format_args!("cannot create {}", path.display())))?
            }
            Err(e) => return Err(context(e, format_args!("cannot create {}", path.display()))),
        };

        let setup = || -> io::Result<Segment> {
            allocate(&file, len, &path)?;
            let map = MmapOptions::new()
                .len(len)
                .populate()
                .map_raw(&file)
                .map_err(|e| context(e, format_args!("cannot map {}", path.display())))?;
            let seg = Segment {
                map,
                local_size,
                ring_bytes,
                pid: own_pid(),
            };
            seg.write_header();
            Ok(seg)
        };
        let own = match setup() {
            Ok(seg) => Arc::new(seg),
            Err(e) => {
                let _ = fs::remove_file(&path);
                return Err(e);
            }
        };
        let mut peers = vec![None; local_size];
        peers[local_rank] = Some(Arc::clone(&own));
        Ok(ShmNode {
            name,
            path,
            local_rank,
            own,
            peers,
            taken: (0..local_size).map(|_| AtomicBool::new(false)).collect(),
            unlinked: AtomicBool::new(false),
            cma: false,
            shared: false,
        })
    }

    /// The segment's file name (under `/dev/shm`), for peers to attach.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Maps peer `local_peer`'s segment (created by it, named `name`),
    /// checking magic, version and geometry (the same `local_size` and
    /// `ring_bytes` as ours) and that its creator is alive. Attaching our own
    /// rank under our own name is a no-op.
    pub fn attach(&mut self, local_peer: usize, name: &str) -> io::Result<()> {
        let local_size = self.own.local_size;
        let ring_bytes = self.own.ring_bytes;
        if local_peer >= local_size {
            return Err(invalid_input(format!(
                "local peer {local_peer} out of range for {local_size} local ranks"
            )));
        }
        if local_peer == self.local_rank {
            return if name == self.name {
                Ok(())
            } else {
                Err(invalid_input(format!(
                    "local rank {local_peer} is this rank, whose segment is {}, not {name}",
                    self.name
                )))
            };
        }
        if !name.starts_with(NAME_PREFIX) || name.contains('/') {
            return Err(invalid_input(format!(
                "{name:?} is not a ferrocoll shared-memory segment name"
            )));
        }
        let path = Path::new(SHM_DIR).join(name);
        let what = || format!("local rank {local_peer}'s segment {}", path.display());
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| context(e, format_args!("cannot open {}", what())))?;
        let len = segment_len(local_size, ring_bytes).expect("our own geometry fits");
        let file_len = file.metadata()?.len();
        if file_len != len as u64 {
            return Err(invalid_data(format!(
                "{} is {file_len} bytes, expected {len} ({local_size} rings of {ring_bytes} bytes)",
                what()
            )));
        }
        let map = MmapOptions::new()
            .len(len)
            .map_raw(&file)
            .map_err(|e| context(e, format_args!("cannot map {}", what())))?;
        let mut seg = Segment {
            map,
            local_size,
            ring_bytes,
            pid: 0,
        };
        if seg.u64_at(HDR_MAGIC).load(Ordering::Acquire) != MAGIC {
            return Err(invalid_data(format!("{} has no valid header", what())));
        }
        let version = seg.u32_at(HDR_VERSION).load(Ordering::Relaxed);
        if version != VERSION {
            return Err(invalid_data(format!(
                "{} has layout version {version}, expected {VERSION} (mixed ferrocoll versions?)",
                what()
            )));
        }
        let their_size = seg.u64_at(HDR_LOCAL_SIZE).load(Ordering::Relaxed);
        let their_ring = seg.u64_at(HDR_RING_BYTES).load(Ordering::Relaxed);
        if their_size != local_size as u64 || their_ring != ring_bytes as u64 {
            return Err(invalid_data(format!(
                "{} has {their_size} rings of {their_ring} bytes, expected {local_size} of {ring_bytes}",
                what()
            )));
        }
        seg.pid = seg.u32_at(HDR_PID).load(Ordering::Relaxed);
        if !pid_alive(seg.pid) {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                format!(
                    "{} belongs to process {}, which has exited",
                    what(),
                    seg.pid
                ),
            ));
        }
        // Fault in the ring we write (ours, inside the peer's segment) now
        // rather than during the first messages; best effort (Linux >= 5.14).
        let _ = seg.map.advise_range(
            Advice::PopulateWrite,
            seg.ring_offset(self.local_rank),
            RING_DATA + ring_bytes,
        );
        let _ = seg.map.advise_range(
            Advice::PopulateWrite,
            seg.mailbox_offset(self.local_rank),
            MAILBOX_BYTES,
        );
        self.peers[local_peer] = Some(Arc::new(seg));
        Ok(())
    }

    /// Removes this rank's file from `/dev/shm` (the mapping stays valid).
    /// The caller calls it once every peer has attached, so a killed job
    /// leaves nothing behind. Later calls do nothing.
    pub fn unlink(&self) {
        if !self.unlinked.swap(true, Ordering::AcqRel) {
            let _ = fs::remove_file(&self.path);
        }
    }

    /// The channel to `local_peer` (attached before): sends write into the
    /// ring for us inside the peer's segment, receives read the ring for that
    /// peer inside our segment. The channel to our own rank is a loopback.
    ///
    /// # Panics
    ///
    /// If `local_peer` was not attached, or its channel was already taken
    /// (a ring has exactly one producer and one consumer).
    pub fn channel(&self, local_peer: usize) -> Box<dyn Channel> {
        let peer = self
            .peers
            .get(local_peer)
            .cloned()
            .flatten()
            .unwrap_or_else(|| {
                panic!("shm channel to local rank {local_peer}, which is not attached")
            });
        assert!(
            !self.taken[local_peer].swap(true, Ordering::Relaxed),
            "shm channel to local rank {local_peer} requested twice"
        );
        let me = self.local_rank;
        let own = Arc::clone(&self.own);
        let ring_bytes = own.ring_bytes;
        // Nobody has used the rings yet, but start from whatever they hold.
        let head = peer.head(me).load(Ordering::Acquire);
        let tail_seen = peer.tail(me).load(Ordering::Acquire);
        let tail = own.tail(local_peer).load(Ordering::Acquire);
        let head_seen = own.head(local_peer).load(Ordering::Acquire);
        Box::new(ShmChannel {
            peer,
            own,
            me,
            them: local_peer,
            cap: ring_bytes as u64,
            mask: ring_bytes - 1,
            piece: (ring_bytes / 4).min(MAX_PIECE),
            head,
            tail_seen,
            tail,
            head_seen,
            cma: self.cma,
            shared: self.shared,
            pidfd: None,
            regions: Vec::new(),
        })
    }

    /// Lets channels made from now on map their peer's
    /// [`crate::SharedBuffer`]s (the caller has checked that it works).
    pub fn enable_shared_buffers(&mut self, on: bool) {
        self.shared = on;
    }

    /// The pid of local peer `local_peer` (attached before).
    pub fn peer_pid(&self, local_peer: usize) -> Option<u32> {
        self.peers.get(local_peer)?.as_ref().map(|seg| seg.pid)
    }

    /// Lets channels made from now on read their peer's memory directly
    /// (the caller has checked with [`cma_read`] that the kernel allows it).
    pub fn enable_single_copy(&mut self, on: bool) {
        self.cma = on;
    }

    /// The mailboxes of the small-collective fast path: ours and our slots
    /// in every local peer's segment. `None` until every local peer is
    /// attached.
    pub fn mailboxes(&self) -> Option<Mailboxes> {
        let peers = self.peers.iter().cloned().collect::<Option<Vec<_>>>()?;
        Some(Mailboxes {
            own: Arc::clone(&self.own),
            peers,
            me: self.local_rank,
        })
    }

    /// This rank's doorbell (in its own segment).
    pub fn doorbell(&self) -> Arc<dyn Doorbell> {
        Arc::new(ShmDoorbell {
            seg: Arc::clone(&self.own),
        })
    }
}

impl Drop for ShmNode {
    fn drop(&mut self) {
        self.unlink();
    }
}

/// Removes every `/dev/shm/ferrocoll-{job}-*` file (the launcher calls this
/// after a run, in case a rank died before unlinking) and returns how many it
/// removed (0 when there is no `/dev/shm`).
///
/// `job` is `[A-Za-z0-9_-]`. Every name that starts with `ferrocoll-{job}-`
/// matches, so segments named after derived jobs (`{job}-n0`, one per node)
/// go too; so would those of a job literally named `{job}-...`, which
/// launcher-generated job ids never are. `ferrocoll-{job}x-*` does not match.
pub fn remove_job_segments(job: &str) -> io::Result<usize> {
    validate_job(job)?;
    let prefix = format!("{NAME_PREFIX}{job}-");
    let dir = match fs::read_dir(SHM_DIR) {
        Ok(dir) => dir,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(context(e, format_args!("cannot list {SHM_DIR}"))),
    };
    let mut removed = 0;
    for entry in dir {
        let entry = entry?;
        if !entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(&prefix))
        {
            continue;
        }
        match fs::remove_file(entry.path()) {
            Ok(()) => removed += 1,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(context(
                    e,
                    format_args!("cannot remove {}", entry.path().display()),
                ))
            }
        }
    }
    Ok(removed)
}

/// A rank's doorbell: the event count in its own segment.
struct ShmDoorbell {
    /// The segment holding the futex word.
    seg: Arc<Segment>,
}

impl Doorbell for ShmDoorbell {
    fn token(&self) -> u64 {
        u64::from(self.seg.rings().load(Ordering::Acquire))
    }

    fn wait(&self, token: u64, timeout: Duration) {
        let rings = self.seg.rings();
        let sleepers = self.seg.sleepers();
        sleepers.fetch_add(1, Ordering::SeqCst);
        if rings.load(Ordering::SeqCst) == token as u32 && !timeout.is_zero() {
            futex_wait(rings, token as u32, timeout);
        }
        sleepers.fetch_sub(1, Ordering::SeqCst);
    }

    fn ring_local(&self) {
        self.seg.ring_bell();
    }
}

/// The mailboxes of one rank (see the layout in the module documentation):
/// its own, which local peers write into, and its slots in theirs. The
/// protocol on top is [`super::fastpath`]'s; this type only knows where the
/// words are and how to touch them.
///
/// Every header word and the `ack` are only accessed atomically. A slot's
/// payload is plain memory, handed over like ring data: the sender writes it
/// before storing the slot's stamp with `Release`; the receiver reads it
/// after loading the stamp with `Acquire` and before storing `ack` past it
/// with `Release`; the sender writes the slot again only after loading such
/// an `ack` with `Acquire`.
pub(crate) struct Mailboxes {
    /// Our segment: mailbox `i` holds what local rank `i` sends us.
    own: Arc<Segment>,
    /// Every local rank's segment (ours at `me`).
    peers: Vec<Arc<Segment>>,
    /// Our local rank.
    me: usize,
}

/// A message read out of a slot.
#[derive(Clone, Copy)]
pub(crate) struct SlotMessage {
    /// Communicator id.
    pub comm: u64,
    /// Call sequence number.
    pub seq: u64,
    /// The sender's call signature, packed (see `fastpath::pack`).
    pub sig: u64,
    /// The first `len` bytes of the payload (`len` as the signature says,
    /// at most [`SLOT_PAYLOAD`]); 8-byte aligned.
    pub data: [u64; SLOT_PAYLOAD / 8],
}

impl Mailboxes {
    /// Number of local ranks.
    pub fn local_size(&self) -> usize {
        self.peers.len()
    }

    /// Offset of slot `k` of mailbox `sender` in any segment.
    fn slot_offset(seg: &Segment, sender: usize, k: usize) -> usize {
        debug_assert!(k < SLOTS);
        seg.mailbox_offset(sender) + BLOCK + (k % SLOTS) * BLOCK
    }

    /// The stamp of the slot that holds our message number `stamp` from
    /// local rank `from` once it has arrived (stamps count from 1).
    pub fn inbound_stamp(&self, from: usize, stamp: u64) -> &AtomicU64 {
        let off = Self::slot_offset(&self.own, from, (stamp % SLOTS as u64) as usize);
        self.own.u64_at(off)
    }

    /// Reads message `stamp` from local rank `from`, which the caller has
    /// seen arrive (its stamp loaded with `Acquire` equal to `stamp`), then
    /// marks it consumed. `payload_len` extracts the payload length from the
    /// packed signature (clamped to [`SLOT_PAYLOAD`]).
    pub fn take(&self, from: usize, stamp: u64, payload_len: impl Fn(u64) -> usize) -> SlotMessage {
        let seg = &*self.own;
        let off = Self::slot_offset(seg, from, (stamp % SLOTS as u64) as usize);
        let comm = seg.u64_at(off + 8).load(Ordering::Relaxed);
        let seq = seg.u64_at(off + 16).load(Ordering::Relaxed);
        let sig = seg.u64_at(off + 24).load(Ordering::Relaxed);
        let len = payload_len(sig).min(SLOT_PAYLOAD);
        let mut data = [0u64; SLOT_PAYLOAD / 8];
        // SAFETY: `off + SLOT_HEADER + len <= off + BLOCK` is inside the
        // mapping (the slot lies inside the segment's mailbox area). The
        // sender wrote these bytes before its `Release` store of the stamp,
        // which the caller loaded with `Acquire`, and does not write them
        // again before we store `ack` below (see the type's documentation).
        // `data` is a local array of at least `len` bytes.
        unsafe {
            ptr::copy_nonoverlapping(
                seg.map.as_ptr().add(off + SLOT_HEADER),
                data.as_mut_ptr().cast::<u8>(),
                len,
            );
        }
        seg.u64_at(seg.mailbox_offset(from))
            .store(stamp, Ordering::Release);
        SlotMessage {
            comm,
            seq,
            sig,
            data,
        }
    }

    /// How many of our messages local rank `to` has consumed.
    pub fn acked_by(&self, to: usize) -> u64 {
        let seg = &*self.peers[to];
        seg.u64_at(seg.mailbox_offset(self.me))
            .load(Ordering::Acquire)
    }

    /// Writes our message number `stamp` to local rank `to` and publishes
    /// it. The caller has checked that `to` consumed message `stamp -
    /// SLOTS` ([`Mailboxes::acked_by`]), so the slot is free.
    pub fn put(&self, to: usize, stamp: u64, comm: u64, seq: u64, sig: u64, payload: &[u8]) {
        assert!(
            payload.len() <= SLOT_PAYLOAD,
            "payload too large for a slot"
        );
        let seg = &*self.peers[to];
        let off = Self::slot_offset(seg, self.me, (stamp % SLOTS as u64) as usize);
        seg.u64_at(off + 8).store(comm, Ordering::Relaxed);
        seg.u64_at(off + 16).store(seq, Ordering::Relaxed);
        seg.u64_at(off + 24).store(sig, Ordering::Relaxed);
        // SAFETY: the destination `off + SLOT_HEADER .. + payload.len()` is
        // inside the slot (asserted length) and so inside the mapping. The
        // receiver consumed the slot's previous message (the caller checked
        // its `ack` with `Acquire`) and does not read the slot again until
        // the `Release` store of the stamp below. The source is the
        // caller's memory, disjoint from the shared mapping.
        unsafe {
            ptr::copy_nonoverlapping(
                payload.as_ptr(),
                seg.map.as_mut_ptr().add(off + SLOT_HEADER),
                payload.len(),
            );
        }
        seg.u64_at(off).store(stamp, Ordering::Release);
    }

    /// Wakes local rank `to` if a thread of it sleeps on its doorbell. The
    /// caller issues a `SeqCst` fence between publishing what `to` may wait
    /// for and this call (see [`Mailboxes::sleep`]).
    pub fn wake(&self, to: usize) {
        let seg = &*self.peers[to];
        if seg.sleepers().load(Ordering::Relaxed) > 0 {
            seg.ring_bell();
        }
    }

    /// Rings our own doorbell (wakes this rank's other threads).
    pub fn wake_self(&self) {
        self.own.ring_bell();
    }

    /// The count of control notices written to this rank (incremented by
    /// peers after such a frame is in our ring: `ShmChannel::alert`).
    pub fn notices(&self) -> u64 {
        self.own.u64_at(NOTICES).load(Ordering::Acquire)
    }

    /// Sleeps on our doorbell for at most `timeout` unless `ready()` says
    /// there is something to do. The waker publishes, issues a `SeqCst`
    /// fence and then reads our sleeper count ([`Mailboxes::wake`]); we
    /// raise the count, fence, then call `ready`: one of the two sees the
    /// other (so a waker that finds no sleeper needs no system call, and no
    /// wake-up is lost). The futex compares the ring count against the
    /// token read before, so a ring between `ready` and the sleep returns
    /// at once.
    pub fn sleep(&self, timeout: Duration, ready: impl Fn() -> bool) {
        let rings = self.own.rings();
        let sleepers = self.own.sleepers();
        let token = rings.load(Ordering::Acquire);
        sleepers.fetch_add(1, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
        if !ready() && !timeout.is_zero() {
            futex_wait(rings, token, timeout);
        }
        sleepers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The byte stream to and from one local peer.
struct ShmChannel {
    /// The peer's segment: holds our outbound ring (index `me`) and the
    /// peer's doorbell.
    peer: Arc<Segment>,
    /// Our segment: holds our inbound ring from the peer (index `them`).
    own: Arc<Segment>,
    /// Our local rank.
    me: usize,
    /// The peer's local rank.
    them: usize,
    /// Ring capacity in bytes.
    cap: u64,
    /// `cap - 1`.
    mask: usize,
    /// Largest piece copied before publishing (a multiple of 8).
    piece: usize,
    /// Outbound: our `head` (we are its only writer).
    head: u64,
    /// Outbound: last `tail` seen (a lower bound of the real one).
    tail_seen: u64,
    /// Inbound: our `tail` (we are its only writer).
    tail: u64,
    /// Inbound: last `head` seen (a lower bound of the real one).
    head_seen: u64,
    /// The peer's memory can be read with `process_vm_readv`.
    cma: bool,
    /// The peer's shared buffers can be mapped (`pidfd_getfd`): a pidfd of
    /// the peer once opened, and the buffers mapped so far (by region).
    shared: bool,
    pidfd: Option<std::os::fd::OwnedFd>,
    regions: Vec<(u64, crate::shared::PeerRegion)>,
}

/// Peer buffers kept mapped per channel; the oldest mapping goes first.
const MAPPED_REGIONS: usize = 64;

impl ShmChannel {
    /// The error for a ring whose shared positions make no sense.
    fn corrupt(&self, which: &str, value: u64) -> io::Error {
        invalid_data(format!(
            "shared-memory ring between local ranks {} and {} is corrupt ({which} = {value})",
            self.me, self.them
        ))
    }
}

/// Reads `dst.len()` bytes at `addr` in process `pid` with
/// `process_vm_readv` (cross-memory attach: one copy, by the kernel, from
/// the other process's pages into ours). Needs ptrace permission over the
/// process: same user, and Yama's ptrace_scope and seccomp allowing it.
pub(crate) fn cma_read(pid: u32, addr: u64, dst: &mut [u8]) -> io::Result<()> {
    let mut done = 0;
    while done < dst.len() {
        let local = libc::iovec {
            iov_base: dst[done..].as_mut_ptr().cast(),
            iov_len: dst.len() - done,
        };
        let remote = libc::iovec {
            iov_base: (addr as usize + done) as *mut libc::c_void,
            iov_len: dst.len() - done,
        };
        // SAFETY: `local` describes the writable, exclusively borrowed rest
        // of `dst`; the kernel checks `remote` against the other process's
        // mappings (a bad address is an error, never a fault here).
        let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "process_vm_readv read nothing",
            ));
        }
        done += n as usize;
    }
    Ok(())
}

impl Channel for ShmChannel {
    fn reads_remote(&self) -> bool {
        self.cma
    }

    fn read_remote(&self, addr: u64, dst: &mut [u8]) -> io::Result<()> {
        cma_read(self.peer.pid, addr, dst)
    }

    fn maps_shared(&self) -> bool {
        self.shared
    }

    fn shared_bytes(&mut self, region: u64, offset: u64, len: usize) -> io::Result<&[u8]> {
        let at = match self.regions.iter().position(|(r, _)| *r == region) {
            Some(at) => at,
            None => {
                if self.pidfd.is_none() {
                    self.pidfd = Some(crate::shared::pidfd_open(self.peer.pid)?);
                }
                let pidfd = self.pidfd.as_ref().expect("opened above");
                let mapped = crate::shared::PeerRegion::map(pidfd, (region >> 32) as u32)?;
                if self.regions.len() == MAPPED_REGIONS {
                    self.regions.remove(0);
                }
                self.regions.push((region, mapped));
                self.regions.len() - 1
            }
        };
        self.regions[at].1.bytes(offset, len)
    }

    fn send_some(&mut self, data: &[u8]) -> io::Result<usize> {
        let seg = &*self.peer;
        let mut sent = 0;
        while sent < data.len() {
            let want = (data.len() - sent).min(self.piece);
            let mut free = self.cap - (self.head - self.tail_seen);
            if free < want as u64 {
                let tail = seg.tail(self.me).load(Ordering::Acquire);
                if tail < self.tail_seen || tail > self.head {
                    return Err(self.corrupt("tail", tail));
                }
                self.tail_seen = tail;
                free = self.cap - (self.head - tail);
                if free == 0 {
                    break;
                }
            }
            let n = want.min(free as usize);
            let idx = self.head as usize & self.mask;
            let first = n.min(self.cap as usize - idx);
            let ring = seg.data(self.me);
            // SAFETY: `[head, head + n)` is free space (n <= cap - (head -
            // tail) with `tail` loaded with Acquire, so the receiver finished
            // reading it), which the receiver does not read until we publish
            // `head` below; as indices it is `[idx, idx + first)` plus
            // `[0, n - first)`, both inside the ring's `cap` data bytes. The
            // source range is inside `data`, and the two never overlap (one
            // is our caller's memory, the other the shared ring).
            unsafe {
                ptr::copy_nonoverlapping(data.as_ptr().add(sent), ring.add(idx), first);
                ptr::copy_nonoverlapping(data.as_ptr().add(sent + first), ring, n - first);
            }
            self.head += n as u64;
            seg.head(self.me).store(self.head, Ordering::Release);
            seg.ring_bell();
            sent += n;
        }
        Ok(sent)
    }

    fn recv_some(&mut self, take: &mut dyn FnMut(&[u8]) -> usize) -> io::Result<usize> {
        let seg = &*self.own;
        let mut avail = self.head_seen - self.tail;
        if avail < self.piece as u64 {
            let head = seg.head(self.them).load(Ordering::Acquire);
            if head < self.head_seen || head - self.tail > self.cap {
                return Err(self.corrupt("head", head));
            }
            self.head_seen = head;
            avail = head - self.tail;
            if avail == 0 {
                return Ok(0);
            }
        }
        let idx = self.tail as usize & self.mask;
        let len = (avail as usize)
            .min(self.cap as usize - idx)
            .min(self.piece);
        // SAFETY: `[tail, tail + len)` was published by the sender's Release
        // store of `head`, which we loaded with Acquire, so the bytes are
        // initialised and visible; the sender does not write them again
        // until we advance `tail` past them, which happens only after
        // `take` returns and the slice is gone. `[idx, idx + len)` is inside
        // the ring's data (len <= cap - idx).
        let bytes = unsafe { std::slice::from_raw_parts(seg.data(self.them).add(idx), len) };
        let n = take(bytes);
        assert!(
            n <= len,
            "recv_some: take consumed {n} of {len} offered bytes"
        );
        if n > 0 {
            self.tail += n as u64;
            seg.tail(self.them).store(self.tail, Ordering::Release);
            self.peer.ring_bell();
        }
        Ok(n)
    }

    fn alert(&mut self) {
        self.peer.u64_at(NOTICES).fetch_add(1, Ordering::Release);
    }

    fn check_alive(&mut self) -> io::Result<()> {
        let pid = self.peer.pid;
        if pid_alive(pid) {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                format!("local peer process {pid} has exited"),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::thread;
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
        let waiter = thread::spawn(move || {
            bell.wait(token, Duration::from_secs(5));
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

    #[test]
    fn shm_mailboxes_carry_stamped_messages_and_wake_sleepers() {
        let (a, b) = pair("mbox", MIN_RING_BYTES);
        let (ma, mb) = (a.mailboxes().unwrap(), b.mailboxes().unwrap());
        let len = |_sig: u64| 12;
        // Nothing yet: message 1 has not arrived.
        assert_ne!(mb.inbound_stamp(0, 1).load(Ordering::Acquire), 1);
        assert_eq!(ma.acked_by(1), 0);
        // Fill every slot, then take them in order; the ack follows.
        for stamp in 1..=SLOTS as u64 {
            let payload = [stamp as u8; 12];
            ma.put(1, stamp, 7, 100 + stamp, 0xAB, &payload);
        }
        for stamp in 1..=SLOTS as u64 {
            assert_eq!(mb.inbound_stamp(0, stamp).load(Ordering::Acquire), stamp);
            let msg = mb.take(0, stamp, len);
            assert_eq!((msg.comm, msg.seq, msg.sig), (7, 100 + stamp, 0xAB));
            let bytes: &[u8] = bytemuck::cast_slice(&msg.data);
            assert_eq!(&bytes[..12], &[stamp as u8; 12]);
            assert_eq!(ma.acked_by(1), stamp);
        }
        // A slot reused: its old stamp is not the new one's.
        let next = SLOTS as u64 + 1;
        assert_ne!(mb.inbound_stamp(0, next).load(Ordering::Acquire), next);
        // A sleeper wakes when a message is put and the sender wakes it.
        let waiter = thread::spawn(move || {
            let start = Instant::now();
            mb.sleep(Duration::from_secs(5), || {
                mb.inbound_stamp(0, next).load(Ordering::Acquire) == next
            });
            (
                start.elapsed(),
                mb.inbound_stamp(0, next).load(Ordering::Acquire),
            )
        });
        thread::sleep(Duration::from_millis(100));
        ma.put(1, next, 7, 0, 0, &[]);
        std::sync::atomic::fence(Ordering::SeqCst);
        ma.wake(1);
        let (slept, stamp) = waiter.join().unwrap();
        assert_eq!(stamp, next);
        assert!(slept < Duration::from_secs(2), "slept {slept:?}");
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

    #[test]
    fn shm_cross_process_echo_and_death() {
        let j = job("xproc");
        let mut node = ShmNode::create(&j, 0, 2, MIN_RING_BYTES).unwrap();
        let tests = module_path!().split_once("::").unwrap().1;
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                &format!("{tests}::shm_cross_process_child"),
                "--ignored",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, &j)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut child = Reap(child);
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

    /// How a benchmark loop idles when nothing moved: `spin` busy polls,
    /// then `yields` polls that yield the CPU (so a peer sharing the core
    /// runs), then sleeps on the doorbell.
    #[derive(Clone, Copy, Debug)]
    struct Idle {
        spin: u32,
        yields: u32,
    }

    impl Idle {
        /// Called after the `count`-th consecutive empty poll.
        fn pause(self, count: &mut u32, bell: &dyn Doorbell, token: u64) {
            *count += 1;
            if *count <= self.spin {
                std::hint::spin_loop();
            } else if *count <= self.spin + self.yields {
                thread::yield_now();
            } else {
                bell.wait(token, Duration::from_secs(1));
            }
        }
    }

    /// Sends 8-byte messages back and forth `round_trips` times; returns the
    /// mean one-way latency.
    fn ping_pong(round_trips: usize, idle: Idle) -> Duration {
        let (a, b) = pair("pingpong", MIN_RING_BYTES);
        let (ca, ba) = (a.channel(1), a.doorbell());
        let (cb, bb) = (b.channel(0), b.doorbell());
        let side = move |mut ch: Box<dyn Channel>, bell: Arc<dyn Doorbell>, first: bool| {
            let start = Instant::now();
            let mut buf = 0u64;
            for i in 0..round_trips as u64 {
                if first {
                    assert_eq!(ch.send_some(&i.to_le_bytes()).unwrap(), 8);
                }
                let mut empty = 0;
                loop {
                    let token = bell.token();
                    let n = ch
                        .recv_some(&mut |b: &[u8]| {
                            if b.len() < 8 {
                                return 0;
                            }
                            buf = u64::from_le_bytes(b[..8].try_into().unwrap());
                            8
                        })
                        .unwrap();
                    if n == 8 {
                        break;
                    }
                    idle.pause(&mut empty, &*bell, token);
                }
                assert_eq!(buf, i);
                if !first {
                    assert_eq!(ch.send_some(&i.to_le_bytes()).unwrap(), 8);
                }
            }
            start.elapsed()
        };
        let t = thread::spawn(move || side(cb, bb, false));
        let elapsed = side(ca, ba, true);
        t.join().unwrap();
        elapsed / (2 * round_trips as u32)
    }

    /// Streams `total` bytes from a source buffer into a destination buffer
    /// in `msg`-byte messages; returns bytes per second.
    fn stream(ring_bytes: usize, msg: usize, total: usize, idle: Idle) -> f64 {
        let (a, b) = pair("bw", ring_bytes);
        let (mut tx, tx_bell) = (a.channel(1), a.doorbell());
        let (mut rx, rx_bell) = (b.channel(0), b.doorbell());
        // Both buffers written once up front, so no page faults are timed.
        let src = vec![3u8; msg];
        let mut dst = vec![1u8; msg];
        let rounds = total / msg;
        let receiver = thread::spawn(move || {
            for _ in 0..rounds {
                let (mut got, mut empty) = (0, 0);
                while got < msg {
                    let token = rx_bell.token();
                    let n = rx
                        .recv_some(&mut |b: &[u8]| {
                            let n = b.len().min(msg - got);
                            dst[got..got + n].copy_from_slice(&b[..n]);
                            n
                        })
                        .unwrap();
                    got += n;
                    if n == 0 {
                        idle.pause(&mut empty, &*rx_bell, token);
                    } else {
                        empty = 0;
                    }
                }
            }
            dst[0]
        });
        let start = Instant::now();
        for _ in 0..rounds {
            let (mut sent, mut empty) = (0, 0);
            while sent < msg {
                let token = tx_bell.token();
                let n = tx.send_some(&src[sent..]).unwrap();
                sent += n;
                if n == 0 {
                    idle.pause(&mut empty, &*tx_bell, token);
                } else {
                    empty = 0;
                }
            }
        }
        assert_eq!(receiver.join().unwrap(), 3);
        (rounds * msg) as f64 / start.elapsed().as_secs_f64()
    }

    #[test]
    #[ignore = "micro-benchmark; run with --release -- --ignored --nocapture"]
    fn shm_micro_benchmark() {
        // Best of three everywhere: the machine may be shared.
        let polls = Idle {
            spin: 100,
            yields: 1000,
        };
        let policies = [
            ("spin 100, yield 1000, then sleep", polls),
            ("sleep at once (futex wake)", Idle { spin: 0, yields: 0 }),
        ];
        for (what, idle) in policies {
            let lat = (0..3).map(|_| ping_pong(100_000, idle)).min().unwrap();
            println!("shm ping-pong, 8 B, {what}: {lat:?} one-way");
        }
        let total = 256 << 20;
        for ring in [64 << 10, 256 << 10, 1 << 20, 4 << 20] {
            for msg in [512 << 10, 4 << 20, 64 << 20] {
                let bw = (0..3)
                    .map(|_| stream(ring, msg, total, polls))
                    .fold(0.0, f64::max);
                println!(
                    "shm stream, ring {:>5} KiB, messages {:>6} KiB: {:6.2} GB/s",
                    ring >> 10,
                    msg >> 10,
                    bw / 1e9
                );
            }
        }
        let src = vec![1u8; 64 << 20];
        let mut dst = vec![0u8; 64 << 20];
        let t = Instant::now();
        for _ in 0..16 {
            dst.copy_from_slice(&src);
            std::hint::black_box(&mut dst);
        }
        println!(
            "reference: single-thread memcpy of 64 MiB buffers: {:.2} GB/s",
            (16 << 26) as f64 / t.elapsed().as_secs_f64() / 1e9
        );
    }
}
