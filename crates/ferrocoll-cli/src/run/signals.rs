//! The launcher's signals (SIGINT and SIGTERM, caught while a launch runs)
//! and, for a per-host launcher, the end of its standard input.

use std::io::{self, Read};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};

use crate::error::CliError;

/// The first SIGINT / SIGTERM the launcher got (0: none).
pub(super) static CAUGHT: AtomicI32 = AtomicI32::new(0);
/// How many SIGINT / SIGTERM the launcher got.
pub(super) static CAUGHT_COUNT: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    // Atomics are async-signal-safe.
    let _ = CAUGHT.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst);
    CAUGHT_COUNT.fetch_add(1, Ordering::SeqCst);
}

/// Catches SIGINT and SIGTERM while alive; restores the previous handlers
/// when dropped.
pub(super) struct SignalGuard {
    previous: Vec<(libc::c_int, libc::sigaction)>,
}

impl SignalGuard {
    pub(super) fn install() -> Result<SignalGuard, CliError> {
        CAUGHT.store(0, Ordering::SeqCst);
        CAUGHT_COUNT.store(0, Ordering::SeqCst);
        let mut guard = SignalGuard {
            previous: Vec::new(),
        };
        for sig in [libc::SIGINT, libc::SIGTERM] {
            // SAFETY: sigaction is plain data; an all-zero value is valid.
            let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
            action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            // SAFETY: zeroed sigaction to fill; the handler only touches
            // atomics.
            let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
            let rc = unsafe {
                libc::sigemptyset(&mut action.sa_mask);
                libc::sigaction(sig, &action, &mut old)
            };
            if rc != 0 {
                return Err(CliError::Run(format!(
                    "installing a signal handler: {}",
                    io::Error::last_os_error()
                )));
            }
            guard.previous.push((sig, old));
        }
        Ok(guard)
    }
}

impl Drop for SignalGuard {
    fn drop(&mut self) {
        for (sig, old) in &self.previous {
            // SAFETY: restores an action sigaction returned earlier.
            unsafe {
                libc::sigaction(*sig, old, std::ptr::null_mut());
            }
        }
    }
}
/// Set when this process's standard input has ended (see
/// [`watch_stdin`]).
pub(super) static STDIN_CLOSED: AtomicBool = AtomicBool::new(false);

/// Reads standard input to its end on a thread of its own, then sets
/// [`STDIN_CLOSED`]. A per-host launcher's standard input is its
/// connection to the head launcher (a pipe, or ssh's channel): it ends when
/// the head stops the run or dies, also by SIGKILL, whatever the agent.
pub(super) fn watch_stdin() {
    STDIN_CLOSED.store(false, Ordering::SeqCst);
    std::thread::spawn(|| {
        let mut sink = [0u8; 256];
        let mut stdin = io::stdin().lock();
        loop {
            match stdin.read(&mut sink) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        STDIN_CLOSED.store(true, Ordering::SeqCst);
    });
}
