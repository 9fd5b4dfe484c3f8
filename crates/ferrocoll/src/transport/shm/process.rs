//! The peer process: whether it still lives, and reading its memory
//! directly (the single-copy path).

use std::fs;
use std::io;
use std::path::Path;

use crate::plan::Collective;
use crate::transport::CallKind;

/// This process's pid.
pub(super) fn own_pid() -> u32 {
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

/// Which calls' large messages a receiver reads straight from the sender's
/// memory (the single-copy path, [`cma_read`]) instead of taking them
/// through the ring. The ring costs two copies per message: the sender's
/// into the ring and the receiver's out of it. The single copy costs one
/// read by the kernel, slower per byte than a copy out of cache (it pins
/// the sender's pages), and leaves the sender's core idle. So it pays where
/// every rank sends and receives at once and both copies land on the ranks'
/// own cores (allgather, alltoall), for broadcasts (the ring's two copies
/// ran one after the other, not overlapped: a 2-rank in-place broadcast took
/// 0.3-0.7 of the ring's time from 64 KiB to 16 MiB, and so did a 4-rank
/// one), and, on a host with more ranks than cores, for the all-at-once
/// reductions too, where the ring's hand-offs wait on descheduled peers.
/// It loses for gather, scatter and large reduces at 2 ranks, where the
/// ring splits its two copies between two cores that would otherwise wait;
/// a reduce's messages up to [`REDUCE_SINGLE_COPY_BYTES`] take it where
/// every rank has a core (the ring's hand-offs cost more than the copy
/// there; on 4 ranks sharing 2 cores the 0.5-8 MiB reduces, pipelined in
/// such messages, took 1.13-1.46x the time) (bench/RESULTS.md,
/// issue 20: "the single copy read into place" and "broadcasts read the
/// root's memory").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SingleCopyUse {
    /// Every message through the rings.
    Off,
    /// Allgather, alltoall, alltoallv, broadcast, and reduces' messages up to
    /// [`REDUCE_SINGLE_COPY_BYTES`] (every rank has a core).
    ExchangesAndBroadcasts,
    /// Those, allreduce and reduce-scatter (a host with more ranks than
    /// cores).
    ExchangesBroadcastsAndReductions,
    /// Every call (`FERROCOLL_SHM_SINGLE_COPY=on`).
    All,
}

/// The longest message of a reduce that takes the single copy (unless it is
/// off): a 2-rank binomial reduce took 0.64x the rings' time at 32 KiB,
/// 0.74x at 128 KiB and 0.87x at 512 KiB that way, and 1.22-1.52x at 1-16
/// MiB, where the non-root's copy into the ring runs beside the root's
/// reduction (bench/RESULTS.md, issue 20, 2026-12-06).
pub(crate) const REDUCE_SINGLE_COPY_BYTES: usize = 512 << 10;

impl SingleCopyUse {
    /// Whether a message of `len` bytes of a call of `kind` (at least the
    /// single-copy size) takes the single copy.
    pub(crate) fn carries(self, kind: CallKind, len: usize) -> bool {
        use Collective::*;
        match (self, kind) {
            (SingleCopyUse::Off, _) => false,
            (SingleCopyUse::All, _) => true,
            (_, CallKind::Collective(AllGather | AllToAll | AllToAllV | Broadcast)) => true,
            (SingleCopyUse::ExchangesAndBroadcasts, CallKind::Collective(Reduce)) => {
                len <= REDUCE_SINGLE_COPY_BYTES
            }
            (
                SingleCopyUse::ExchangesBroadcastsAndReductions,
                CallKind::Collective(AllReduce | ReduceScatter),
            ) => true,
            _ => false,
        }
    }
}

/// Reads `dst.len()` bytes at `addr` in process `pid` with
/// `process_vm_readv` (cross-memory attach: one copy, by the kernel, from
/// the other process's pages into ours). Needs ptrace permission over the
/// process: same user, and Yama's ptrace_scope and seccomp allowing it.
pub(crate) fn cma_read(pid: u32, addr: u64, dst: &mut [u8]) -> io::Result<()> {
    // SAFETY: `dst` is writable and exclusively borrowed for the call.
    unsafe { cma_copy(pid, addr, dst.as_mut_ptr(), dst.len(), Direction::Read) }
}

/// Writes `src` to `addr` in process `pid` with `process_vm_writev` (one
/// copy, by the kernel, from our pages into the other process's). Needs the
/// same permission as [`cma_read`].
pub(crate) fn cma_write(pid: u32, addr: u64, src: &[u8]) -> io::Result<()> {
    // SAFETY: `src` is readable for the call, and the kernel only reads it
    // when writing to another process (the pointer is cast to mutable
    // because `iovec` wants one).
    unsafe {
        cma_copy(
            pid,
            addr,
            src.as_ptr().cast_mut(),
            src.len(),
            Direction::Write,
        )
    }
}

/// Which way [`cma_copy`] copies.
#[derive(Clone, Copy)]
enum Direction {
    /// From the other process into `local` (`process_vm_readv`).
    Read,
    /// From `local` into the other process (`process_vm_writev`).
    Write,
}

/// Copies `len` bytes between `local` and `addr` in process `pid`, the way
/// `direction` says, until all are copied.
///
/// # Safety
///
/// `local` is valid for `len` bytes: for writes into it (`Read`) or reads
/// from it (`Write`), and nothing else touches it meanwhile.
unsafe fn cma_copy(
    pid: u32,
    addr: u64,
    local: *mut u8,
    len: usize,
    direction: Direction,
) -> io::Result<()> {
    let mut done = 0;
    while done < len {
        let here = libc::iovec {
            // SAFETY: `done < len`, inside the caller's range.
            iov_base: unsafe { local.add(done) }.cast(),
            iov_len: len - done,
        };
        let there = libc::iovec {
            iov_base: (addr as usize + done) as *mut libc::c_void,
            iov_len: len - done,
        };
        // SAFETY: `here` describes the rest of the caller's range, valid for
        // the direction's access (the function's contract); the kernel
        // checks `there` against the other process's mappings (a bad
        // address is an error, never a fault here).
        let n = unsafe {
            match direction {
                Direction::Read => {
                    libc::process_vm_readv(pid as libc::pid_t, &here, 1, &there, 1, 0)
                }
                Direction::Write => {
                    libc::process_vm_writev(pid as libc::pid_t, &here, 1, &there, 1, 0)
                }
            }
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "process_vm_readv/writev copied nothing",
            ));
        }
        done += n as usize;
    }
    Ok(())
}

#[cfg(test)]
mod single_copy_tests {
    use super::SingleCopyUse::{self, *};
    use crate::plan::Collective::*;
    use crate::transport::CallKind::{self, Collective as C, PointToPoint};

    #[test]
    fn each_use_carries_its_calls_and_no_others() {
        let kinds: Vec<CallKind> = crate::plan::Collective::ALL
            .into_iter()
            .map(C)
            .chain([PointToPoint])
            .collect();
        let carried = |use_| -> Vec<CallKind> {
            kinds
                .iter()
                .copied()
                .filter(|&k| SingleCopyUse::carries(use_, k, usize::MAX))
                .collect()
        };
        assert!(carried(Off).is_empty());
        assert_eq!(carried(All), kinds);
        assert_eq!(
            carried(ExchangesAndBroadcasts),
            [C(Broadcast), C(AllGather), C(AllToAll), C(AllToAllV)]
        );
        assert_eq!(
            carried(ExchangesBroadcastsAndReductions),
            [
                C(AllReduce),
                C(Broadcast),
                C(AllGather),
                C(ReduceScatter),
                C(AllToAll),
                C(AllToAllV)
            ]
        );
    }

    #[test]
    fn reduces_take_it_up_to_their_size_limit() {
        let limit = super::REDUCE_SINGLE_COPY_BYTES;
        let use_ = ExchangesAndBroadcasts;
        assert!(use_.carries(C(Reduce), 16 << 10));
        assert!(use_.carries(C(Reduce), limit));
        assert!(!use_.carries(C(Reduce), limit + 8));
        // Other one-way calls keep the rings at any size, and so do reduces
        // on a host with more ranks than cores.
        assert!(!use_.carries(C(Gather), 16 << 10));
        assert!(!ExchangesBroadcastsAndReductions.carries(C(Reduce), 16 << 10));
        assert!(!Off.carries(C(Reduce), 16 << 10));
        assert!(All.carries(C(Reduce), limit + 8));
    }
}
