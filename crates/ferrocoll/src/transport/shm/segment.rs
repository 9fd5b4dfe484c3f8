//! One mapped segment: the layout's constants, the accessors every shared
//! word is reached through, and creating and sizing the file.

use std::fmt::Display;
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use memmap2::MmapRaw;

use super::futex::futex_wake_all;
use super::wake;

/// Where the segments live (a tmpfs on every Linux distribution).
pub(super) const SHM_DIR: &str = "/dev/shm";
/// Prefix of every segment file name.
pub(super) const NAME_PREFIX: &str = "ferrocoll-";
/// First word of every segment header.
pub(super) const MAGIC: u64 = u64::from_le_bytes(*b"FERROSHM");
/// Layout version, bumped on any change to the segment layout.
pub(super) const VERSION: u32 = 5;
/// Spacing of independently written words: two cache lines.
pub(crate) const BLOCK: usize = 128;

/// Header: magic (u64).
pub(super) const HDR_MAGIC: usize = 0;
/// Header: layout version (u32).
pub(super) const HDR_VERSION: usize = 8;
/// Header: creator's pid (u32).
pub(super) const HDR_PID: usize = 12;
/// Header: number of inbound rings (u64).
pub(super) const HDR_LOCAL_SIZE: usize = 16;
/// Header: bytes of data per ring (u64).
pub(super) const HDR_RING_BYTES: usize = 24;
/// Header: offset of the eager buffers (u64, see [`Segment::eager_offset`]).
pub(super) const HDR_EAGER_OFFSET: usize = 32;
/// Header: the creator's wake-up eventfd, its descriptor number in the
/// creator's process, or `u32::MAX` if it has none (u32, see `wake.rs`).
pub(super) const HDR_WAKE_FD: usize = 40;
/// Header length as read back by a stale-file check.
pub(super) const HDR_LEN: usize = 44;
/// Doorbell: the futex word counting rings (u32).
pub(super) const BELL_RINGS: usize = BLOCK;
/// Doorbell: number of threads inside [`Doorbell::wait`](crate::transport::channel::Doorbell::wait) (u32).
pub(super) const BELL_SLEEPERS: usize = BLOCK + 4;
/// Doorbell: number of threads sleeping in `poll(2)` with the owner's
/// wake-up eventfd in their set (u32, see `wake.rs`).
pub(super) const BELL_POLLERS: usize = BLOCK + 8;
/// Doorbell: nonzero once a peer could not take a duplicate of the owner's
/// eventfd, so rings may not wake `poll` (u32).
pub(super) const BELL_DEAF: usize = BLOCK + 12;
/// Count of control notices written to this rank (u64, see `fastpath::Mailboxes::notices`).
pub(crate) const NOTICES: usize = 2 * BLOCK;
/// Offset of mailbox 0.
pub(super) const MAILBOXES_START: usize = 3 * BLOCK;
/// Slots per mailbox: how many tiny messages a sender may have unconsumed.
/// Beyond the room to run ahead, more slots mean fewer reads of the
/// receiver's `ack` (a sender reloads it only when its cached copy says the
/// mailbox is full, so once every `SLOTS - 1` messages in lockstep).
/// With more ranks than cores a rank that waits hands its core over, and
/// the room to run ahead decides how often: a loop of 8-64 byte broadcasts
/// on 4 ranks on 2 cores took 1.00-1.16 us a call with 16 slots, 0.58-0.69
/// with 64 and 0.46-0.51 with 256 (Open MPI: 0.62-0.72; bench/RESULTS.md,
/// twelfth session). A mailbox of 256 slots is 32 KiB of the segment,
/// touched only as it is used.
pub(crate) const SLOTS: usize = 256;
/// Bytes of one mailbox: its `ack` block and its slots.
pub(super) const MAILBOX_BYTES: usize = (1 + SLOTS) * BLOCK;
/// Slot: header bytes before the payload (stamp, comm, seq, signature).
pub(crate) const SLOT_HEADER: usize = 32;
/// Most payload bytes one slot carries.
pub(crate) const SLOT_PAYLOAD: usize = BLOCK - SLOT_HEADER;
/// Eager buffers per ordered pair of local ranks: a fast-path message
/// longer than a slot's payload carries its payload in buffer
/// `stamp % EAGER_BUFFERS` of its pair. At most [`SLOTS`], so that the
/// slots' flow control (`ack`) covers the buffers too (see `fastpath`).
pub(crate) const EAGER_BUFFERS: usize = 16;
/// The most payload a fast-path message of a whole call (not a part of a
/// streamed one) carries, and the size of an eager buffer on larger hosts
/// ([`eager_buffer_bytes`]).
pub(crate) const EAGER_BYTES: usize = 16 << 10;
/// The size of an eager buffer on hosts of at most
/// [`LARGE_EAGER_MAX_LOCAL`] ranks ([`eager_buffer_bytes`]).
pub(crate) const LARGE_EAGER_BYTES: usize = 128 << 10;
/// The most local ranks whose segments get [`LARGE_EAGER_BYTES`] buffers:
/// 2 MiB of address space per sender, 8 MiB a segment on 4 ranks.
pub(crate) const LARGE_EAGER_MAX_LOCAL: usize = 4;
const _: () = assert!(EAGER_BUFFERS <= SLOTS && EAGER_BYTES % BLOCK == 0);
const _: () = assert!(LARGE_EAGER_BYTES % EAGER_BYTES == 0);

/// Bytes of one eager buffer in the segments of a host of `local_size`
/// ranks: the most payload one fast-path message carries there. Whole
/// calls carry at most [`EAGER_BYTES`]; only the parts of a streamed
/// 2-rank allreduce fill a larger buffer (`fastpath::small`). Those parts
/// cross between cores best when a sender runs far enough ahead that what
/// the receiver reads has left the sender's 512 KiB L2 for the shared L3:
/// 16 parts of 16 KiB never do (bench/stream_pair.c: 1.4x the time of a
/// 1 MiB lead at 1 MiB; bench/RESULTS.md, tenth session), so small hosts,
/// where the address space costs little, get 128 KiB buffers.
pub(crate) const fn eager_buffer_bytes(local_size: usize) -> usize {
    if local_size <= LARGE_EAGER_MAX_LOCAL {
        LARGE_EAGER_BYTES
    } else {
        EAGER_BYTES
    }
}

/// Bytes of the eager buffers of one sender in a receiver's segment, on a
/// host of `local_size` ranks.
pub(super) const fn eager_pair_bytes(local_size: usize) -> usize {
    EAGER_BUFFERS * eager_buffer_bytes(local_size)
}
/// Ring: `head` offset within the ring.
pub(super) const RING_HEAD: usize = 0;
/// Ring: `tail` offset within the ring.
pub(super) const RING_TAIL: usize = BLOCK;
/// Ring: data offset within the ring.
pub(super) const RING_DATA: usize = 2 * BLOCK;

/// Smallest accepted ring size.
pub(crate) const MIN_RING_BYTES: usize = 64 << 10;
/// Largest piece published at once (see the module documentation).
pub(super) const MAX_PIECE: usize = 64 << 10;

/// Adds `what` to an error's message, keeping its kind.
pub(super) fn context(e: io::Error, what: impl Display) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// An `InvalidInput` error.
pub(super) fn invalid_input(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// An `InvalidData` error.
pub(super) fn invalid_data(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// Checks that a job name is non-empty and only `[A-Za-z0-9_-]`.
pub(super) fn validate_job(job: &str) -> io::Result<()> {
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

/// Offset of the eager buffers in a segment of `local_size` mailboxes:
/// right after the mailboxes (a multiple of [`BLOCK`]).
pub(super) fn eager_start(local_size: usize) -> Option<usize> {
    MAILBOX_BYTES
        .checked_mul(local_size)?
        .checked_add(MAILBOXES_START)
}

/// Offset of ring 0 in a segment of `local_size` mailboxes.
pub(super) fn rings_start(local_size: usize) -> Option<usize> {
    eager_pair_bytes(local_size)
        .checked_mul(local_size)?
        .checked_add(eager_start(local_size)?)
}

/// Segment length for `local_size` mailboxes and rings of `ring_bytes`, if
/// it fits.
pub(super) fn segment_len(local_size: usize, ring_bytes: usize) -> Option<usize> {
    ring_bytes
        .checked_add(RING_DATA)?
        .checked_mul(local_size)?
        .checked_add(rings_start(local_size)?)
}

/// One mapped segment (ours or a peer's) and its geometry.
pub(crate) struct Segment {
    /// The shared mapping; every access to it goes through the accessors
    /// below.
    pub(super) map: MmapRaw,
    /// Number of rings.
    pub(super) local_size: usize,
    /// Data bytes per ring.
    pub(super) ring_bytes: usize,
    /// Pid of the process that created the segment.
    pub(super) pid: u32,
    /// The owner's wake-up eventfd (ours, or a duplicate of a peer's), if
    /// any: written by [`Segment::ring_bell`] while the owner sleeps in
    /// `poll(2)` (see `wake.rs`).
    pub(super) wake: Option<OwnedFd>,
}

impl Segment {
    /// The `AtomicU64` at byte offset `off`.
    pub(crate) fn u64_at(&self, off: usize) -> &AtomicU64 {
        assert!(off & 7 == 0 && off + 8 <= self.map.len());
        // SAFETY: the offset is 8-aligned and inside the mapping (checked
        // above; the mapping itself is page-aligned), the mapping lives as
        // long as `self` and so outlives the returned reference, and every
        // process only ever accesses this word atomically.
        unsafe { &*(self.map.as_mut_ptr().add(off) as *const AtomicU64) }
    }

    /// The `AtomicU32` at byte offset `off`.
    pub(super) fn u32_at(&self, off: usize) -> &AtomicU32 {
        assert!(off & 3 == 0 && off + 4 <= self.map.len());
        // SAFETY: as in `u64_at`: 4-aligned, inside the mapping, which
        // outlives the reference, and only ever accessed atomically.
        unsafe { &*(self.map.as_mut_ptr().add(off) as *const AtomicU32) }
    }

    /// The doorbell's futex word.
    pub(crate) fn rings(&self) -> &AtomicU32 {
        self.u32_at(BELL_RINGS)
    }

    /// The number of threads sleeping on the doorbell.
    pub(crate) fn sleepers(&self) -> &AtomicU32 {
        self.u32_at(BELL_SLEEPERS)
    }

    /// The number of threads sleeping in `poll(2)` on the wake-up eventfd.
    pub(super) fn pollers(&self) -> &AtomicU32 {
        self.u32_at(BELL_POLLERS)
    }

    /// Nonzero when some peer cannot write the wake-up eventfd.
    pub(super) fn deaf(&self) -> &AtomicU32 {
        self.u32_at(BELL_DEAF)
    }

    /// Offset of ring `i` (bytes from local rank `i`).
    pub(super) fn ring_offset(&self, i: usize) -> usize {
        assert!(i < self.local_size);
        rings_start(self.local_size).expect("the segment's geometry fits")
            + i * (RING_DATA + self.ring_bytes)
    }

    /// Offset of the first of the [`EAGER_BUFFERS`] eager buffers that
    /// local rank `i` writes into (payloads of its fast-path messages).
    pub(crate) fn eager_offset(&self, i: usize) -> usize {
        assert!(i < self.local_size);
        eager_start(self.local_size).expect("the segment's geometry fits")
            + i * eager_pair_bytes(self.local_size)
    }

    /// Bytes of one eager buffer in this segment ([`eager_buffer_bytes`]).
    pub(crate) fn eager_buffer_bytes(&self) -> usize {
        eager_buffer_bytes(self.local_size)
    }

    /// Offset of mailbox `i` (tiny messages from local rank `i`).
    pub(crate) fn mailbox_offset(&self, i: usize) -> usize {
        assert!(i < self.local_size);
        MAILBOXES_START + i * MAILBOX_BYTES
    }

    /// Ring `i`'s `head` (total bytes written by its sender).
    pub(super) fn head(&self, i: usize) -> &AtomicU64 {
        self.u64_at(self.ring_offset(i) + RING_HEAD)
    }

    /// Ring `i`'s `tail` (total bytes consumed by its receiver).
    pub(super) fn tail(&self, i: usize) -> &AtomicU64 {
        self.u64_at(self.ring_offset(i) + RING_TAIL)
    }

    /// Start of ring `i`'s data (`ring_bytes` long, 64-byte aligned).
    pub(super) fn data(&self, i: usize) -> *mut u8 {
        let off = self.ring_offset(i) + RING_DATA;
        debug_assert!(off + self.ring_bytes <= self.map.len());
        // SAFETY: `off + ring_bytes` is within the mapping (the segment
        // length is computed from the same geometry and checked against the
        // file), so the pointer stays in bounds.
        unsafe { self.map.as_mut_ptr().add(off) }
    }

    /// A pointer to the `len` bytes at offset `off`, for plain (not atomic)
    /// memory such as a mailbox slot's payload; the caller's protocol says
    /// who may touch those bytes when.
    pub(crate) fn bytes_at(&self, off: usize, len: usize) -> *mut u8 {
        assert!(off
            .checked_add(len)
            .is_some_and(|end| end <= self.map.len()));
        // SAFETY: `off + len` is inside the mapping (asserted above), so the
        // pointer stays in bounds of one allocation.
        unsafe { self.map.as_mut_ptr().add(off) }
    }

    /// Rings this segment's doorbell: bumps the count and wakes sleepers,
    /// if any (see the module documentation for why this loses nothing).
    pub(crate) fn ring_bell(&self) {
        self.rings().fetch_add(1, Ordering::SeqCst);
        if self.sleepers().load(Ordering::SeqCst) > 0 {
            futex_wake_all(self.rings());
        }
        if self.pollers().load(Ordering::SeqCst) > 0 {
            if let Some(fd) = &self.wake {
                wake::signal(fd);
            }
        }
    }

    /// Writes the header (magic last, with `Release`).
    pub(super) fn write_header(&self) {
        self.u32_at(HDR_VERSION).store(VERSION, Ordering::Relaxed);
        self.u32_at(HDR_PID).store(self.pid, Ordering::Relaxed);
        self.u64_at(HDR_LOCAL_SIZE)
            .store(self.local_size as u64, Ordering::Relaxed);
        self.u64_at(HDR_RING_BYTES)
            .store(self.ring_bytes as u64, Ordering::Relaxed);
        self.u64_at(HDR_EAGER_OFFSET)
            .store(self.eager_offset(0) as u64, Ordering::Relaxed);
        let wake_fd = self
            .wake
            .as_ref()
            .and_then(|fd| u32::try_from(fd.as_raw_fd()).ok())
            .unwrap_or(u32::MAX);
        self.u32_at(HDR_WAKE_FD).store(wake_fd, Ordering::Relaxed);
        self.u64_at(HDR_MAGIC).store(MAGIC, Ordering::Release);
    }
}

/// Reads the pid out of an existing segment file's header, if the file has
/// a valid header.
pub(super) fn header_pid(path: &Path) -> Option<u32> {
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
pub(super) fn create_exclusive(path: &Path) -> io::Result<File> {
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
pub(super) fn allocate(file: &File, len: usize, path: &Path) -> io::Result<()> {
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
