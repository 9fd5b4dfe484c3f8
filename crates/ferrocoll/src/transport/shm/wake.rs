//! The doorbell's second way to wake a rank: an eventfd that `poll(2)` can
//! wait on beside the rank's sockets.
//!
//! A rank whose peers are partly on this host (shared memory) and partly on
//! others (sockets) sleeps in `poll(2)` on its sockets. A shared-memory
//! peer's ring only bumps the futex word, which `poll` does not see, so the
//! sleeper used to poll in 1 ms slices and noticed a local message up to
//! 1 ms late: on the 2-host namespace cluster a two-level MoE dispatch,
//! whose last phase waits on a local gateway after the inter-host phase,
//! took 2.36 ms against 1.15 ms with the ranks never sleeping
//! (bench/RESULTS.md, issue 18).
//!
//! So every rank makes an eventfd when it creates its segment and writes
//! the descriptor's number into the header; each peer takes a duplicate of
//! it through `pidfd_getfd(2)` (Linux 5.6; the permission is that of
//! `process_vm_readv`, which the single copy needs anyway) when it maps the
//! segment. A rank about to sleep in `poll` counts itself in the segment's
//! `pollers` word and adds the eventfd to the poll set; a ringer that sees
//! `pollers > 0` writes the eventfd. A peer that cannot take the duplicate
//! marks the segment `deaf`, and its owner keeps polling in 1 ms slices.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// A new non-blocking, close-on-exec eventfd with count 0.
pub(super) fn new_eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd takes no pointers; a non-negative result is a new
    // descriptor that nothing else owns.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by eventfd and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A duplicate, in this process, of descriptor `fd` of process `pid`
/// (`pidfd_open` + `pidfd_getfd`).
pub(super) fn duplicate_from(pid: u32, fd: RawFd) -> io::Result<OwnedFd> {
    let pid = libc::pid_t::try_from(pid)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"))?;
    // SAFETY: pidfd_open takes a pid and flags, no pointers; a non-negative
    // result is a new descriptor owned by nobody else.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0u32) };
    if pidfd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above; the descriptor fits an i32 (the kernel's fd type).
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as RawFd) };
    // SAFETY: pidfd_getfd takes two descriptors and flags, no pointers; a
    // non-negative result is a new descriptor (close-on-exec) owned by
    // nobody else.
    let dup = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0u32) };
    if dup < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    Ok(unsafe { OwnedFd::from_raw_fd(dup as RawFd) })
}

/// Adds one to the eventfd's count, making it readable. A full count
/// (EAGAIN) is readable already; other errors leave the sleeper to its
/// timeout, so they are ignored.
pub(super) fn signal(fd: &OwnedFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64 on our stack to a descriptor
    // we own.
    unsafe {
        libc::write(
            fd.as_raw_fd(),
            (&one as *const u64).cast::<libc::c_void>(),
            std::mem::size_of::<u64>(),
        )
    };
}

/// Resets the eventfd's count to 0 (not readable any more).
pub(super) fn drain(fd: &OwnedFd) {
    let mut count: u64 = 0;
    // SAFETY: reads at most 8 bytes into a live u64 on our stack from a
    // non-blocking descriptor we own (EAGAIN when the count is 0 already).
    unsafe {
        libc::read(
            fd.as_raw_fd(),
            (&mut count as *mut u64).cast::<libc::c_void>(),
            std::mem::size_of::<u64>(),
        )
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readable(fd: &OwnedFd) -> bool {
        let mut p = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd on our stack, timeout 0.
        unsafe { libc::poll(&mut p, 1, 0) };
        p.revents & libc::POLLIN != 0
    }

    #[test]
    fn a_signal_makes_the_duplicate_readable_until_drained() {
        let own = new_eventfd().unwrap();
        // This process's own descriptor through its pid: the path a peer
        // takes (a duplicate refers to the same eventfd).
        let dup = duplicate_from(std::process::id(), own.as_raw_fd()).unwrap();
        assert!(!readable(&own));
        signal(&dup);
        signal(&dup);
        assert!(readable(&own));
        drain(&own);
        assert!(!readable(&own));
        assert!(!readable(&dup));
    }

    #[test]
    fn a_missing_descriptor_is_an_error() {
        assert!(duplicate_from(std::process::id(), 1 << 20).is_err());
    }
}
