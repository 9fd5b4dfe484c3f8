//! The two futex calls the doorbell is made of, on words shared between
//! processes.

use std::ptr;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Sleeps on a shared futex word while it holds `expected`, for at most
/// `timeout`. Returns on a wake-up, a mismatch, a signal or the timeout.
pub(crate) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
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
pub(super) fn futex_wake_all(word: &AtomicU32) {
    // SAFETY: `word` is a valid, aligned u32 in a live mapping; FUTEX_WAKE
    // does not access memory through the pointer, it only uses it as a key.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}
