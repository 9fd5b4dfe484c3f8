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
//! 0        header: magic u64 | version u32 | pid u32 | local_size u64 | ring_bytes u64 |
//!            eager_offset u64 (E below) | wake_fd u32 (the owner's eventfd, `wake.rs`)
//! B        doorbell: rings u32 (futex word) | sleepers u32 | pollers u32 | deaf u32
//! 2B       notices u64: control notices peers have written into our rings
//! 3B       mailbox 0 (tiny messages from local rank 0 to the owner)
//! ...      mailbox i at 3B + i * (1 + SLOTS) * B:
//!            +0   ack u64: messages consumed (written by the owner only)
//!            +B   SLOTS slots of B bytes: stamp u64 | comm u64 | seq u64 |
//!                 signature u64 | payload (up to 96 bytes)
//! E        eager buffers of local rank 0 (payloads of its fast-path messages
//!          longer than a slot carries), E = 3B + local_size * (1 + SLOTS) * B
//! ...      those of local rank i at E + i * EAGER_BUFFERS * X:
//!            EAGER_BUFFERS buffers of X bytes (16 x 128 KiB on hosts of up
//!            to 4 ranks, 16 x 16 KiB beyond: `eager_buffer_bytes`),
//!            written by rank i only, read by the owner (protocol in `fastpath/`)
//! M        ring 0   (bytes from local rank 0 to the owner), M = E + local_size * 16 * X
//! ...      ring i at M + i * (2B + ring_bytes):
//!            +0   head u64: total bytes written (written by the sender only)
//!            +B   tail u64: total bytes consumed (written by the receiver only)
//!            +2B  ring_bytes of data (64-byte aligned)
//! ```
//!
//! The eager buffers take 256 KiB of address space per ordered pair of
//! local ranks (the unused pair of a rank with itself included) beyond 4
//! ranks: 2 MiB in each segment and 16 MiB on a host of 8 ranks. Up to 4
//! ranks a buffer is 128 KiB, which only the parts of a streamed 2-rank
//! allreduce fill: 2 MiB per pair, 8 MiB a segment on 4 ranks. A rank
//! pre-faults the buffers it writes when it attaches a peer's segment
//! (`node.rs`), so a host uses 256 KiB or 2 MiB per ordered pair of
//! distinct ranks: 14 MiB on 8 ranks, 24 MiB on 4, 4 MiB on 2, beside the
//! rings' 32 MiB budget. Sixteen buffers, as many as
//! slots, let a sender run as far ahead with 97 B - 16 KiB messages as
//! with short ones (4-rank broadcast of 128 B - 8 KiB: 0.40-0.57x the time
//! of 4 buffers, bench/RESULTS.md).
//!
//! The mailboxes and eager buffers carry the small-collective fast path; their protocol, and
//! the type that reads and writes them, live in `transport/fastpath/`
//! (`mailbox.rs`), which reaches the words through `Segment`'s accessors.
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
//! left behind. A peer killed by a signal cannot close anything, so a
//! thread per node (`watch.rs`) holds a pidfd of every peer process
//! (recorded in its segment header) and, when one exits, wakes this rank
//! at once, whose channel to it then fails; `Channel::check_alive` checks
//! the pid too, periodically, where pidfds are unavailable. Ranks must
//! share a pid namespace for that (and for `attach`) to work.
//!
//! # Files
//!
//! * `segment.rs`: the layout constants, one mapped `Segment` and its
//!   accessors, creating and sizing the file;
//! * `node.rs`: `ShmNode`, this rank's segment and its peers' (create,
//!   attach, unlink, hand out channels);
//! * `ring.rs`: the single-producer ring channel to one peer;
//! * `doorbell.rs`: the event count, over the futex calls of `futex.rs`;
//! * `process.rs`: whether a peer process lives, and the single-copy
//!   `process_vm_readv` read;
//! * `watch.rs`: the thread that learns of a dead peer at once (pidfds).

mod doorbell;
mod futex;
mod node;
mod process;
mod ring;
mod segment;
#[cfg(test)]
mod tests;
mod wake;
mod watch;

use std::fs;
use std::io;

pub(crate) use futex::futex_wait;
pub(crate) use node::ShmNode;
pub(crate) use process::{cma_read, cma_write, SingleCopyUse};
use segment::{context, validate_job, NAME_PREFIX, SHM_DIR};
pub(crate) use segment::{
    Segment, BLOCK, EAGER_BUFFERS, EAGER_BYTES, NOTICES, SLOTS, SLOT_HEADER, SLOT_PAYLOAD,
};
// The fast path's tests size their calls by the eager buffers.
#[cfg(test)]
pub(crate) use segment::{eager_buffer_bytes, LARGE_EAGER_BYTES};
// Only the tests outside this module (the mailboxes') make segments of their own.
#[cfg(test)]
pub(crate) use segment::MIN_RING_BYTES;

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
