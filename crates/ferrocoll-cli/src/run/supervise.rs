//! Waiting for the started processes (ranks, or the per-host launchers of a
//! multi-host run) and stopping them all on the first failure, a signal to
//! the launcher, the timeout or (for a per-host launcher) the end of its
//! standard input.

use std::io;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

use super::signals::{CAUGHT, CAUGHT_COUNT, STDIN_CLOSED};
use super::POLL;

/// One started process: a rank, or a host's launcher.
pub(super) struct Rank {
    pub(super) child: Child,
    /// Its exit status, once reaped.
    pub(super) status: Option<ExitStatus>,
    /// The rank it runs (its place in the job); for a host's launcher, the
    /// first rank of that host.
    pub(super) rank: usize,
}

/// How a stopped run ends: the grace period between SIGTERM and SIGKILL,
/// the timeout, and whether the end of standard input stops the run.
pub(super) struct StopRules {
    pub(super) grace: Duration,
    pub(super) timeout: Option<Duration>,
    /// A per-host launcher: its standard input is the connection to the
    /// head launcher, and its end means the run is over.
    pub(super) stop_on_stdin_eof: bool,
    /// What `timeout` sends: SIGKILL to ranks; SIGTERM to hosts' launchers,
    /// so that they stop their ranks and clean up after them.
    pub(super) timeout_signal: libc::c_int,
}

/// Why the run is being stopped, and the exit code it ends with.
#[derive(Clone, Copy)]
struct Stop {
    code: i32,
    /// When to send SIGKILL to the ranks still running (`None`: sent).
    kill_at: Option<Instant>,
}

/// Waits for all `ranks`, stopping the run on the first failure, a signal
/// to the launcher, the timeout or the end of standard input (as `rules`
/// say). `on_failure(ranks, index, others)` reports the first failure (of
/// `ranks[index]`, just reaped; `others`: whether others still run and are
/// being stopped) and returns the run's exit code. Returns the run's exit
/// code.
pub(super) fn supervise(
    ranks: &mut [Rank],
    rules: &StopRules,
    on_failure: &mut dyn FnMut(&mut [Rank], usize, bool) -> i32,
) -> i32 {
    let start = Instant::now();
    let mut stop: Option<Stop> = None;
    loop {
        let mut running = 0;
        for rank in 0..ranks.len() {
            if ranks[rank].status.is_some() {
                continue;
            }
            let status = match ranks[rank].child.try_wait() {
                Ok(Some(status)) => status,
                Ok(None) => {
                    running += 1;
                    continue;
                }
                // Cannot happen for a child we own; count it as a failure.
                Err(_) => ExitStatus::from_raw(1 << 8),
            };
            ranks[rank].status = Some(status);
            if stop.is_none() && !status.success() {
                let others = ranks.iter().any(|r| r.status.is_none());
                let code = on_failure(ranks, rank, others);
                signal_all(ranks, libc::SIGTERM);
                stop = Some(Stop {
                    code,
                    kill_at: Some(Instant::now() + rules.grace),
                });
            }
        }
        if running == 0 {
            return stop.map_or(0, |s| s.code);
        }

        let now = Instant::now();
        if stop.is_none() {
            let mut sig = CAUGHT.load(Ordering::SeqCst);
            if sig == 0 && rules.stop_on_stdin_eof && STDIN_CLOSED.load(Ordering::SeqCst) {
                // The head launcher stopped the run (or died): as SIGTERM.
                sig = libc::SIGTERM;
            }
            if sig != 0 {
                signal_all(ranks, libc::SIGTERM);
                stop = Some(Stop {
                    code: 128 + sig,
                    kill_at: Some(now + rules.grace),
                });
            } else if rules.timeout.is_some_and(|t| now - start >= t) {
                let secs = rules.timeout.map_or(0.0, |t| t.as_secs_f64());
                signal_all(ranks, rules.timeout_signal);
                let killed = rules.timeout_signal == libc::SIGKILL;
                eprintln!(
                    "ferrocoll run: timed out after {secs} s; {} all ranks",
                    if killed { "killed" } else { "stopping" }
                );
                stop = Some(Stop {
                    code: 124,
                    kill_at: (!killed).then(|| now + rules.grace),
                });
            }
        }
        if let Some(s) = &mut stop {
            // A second SIGINT / SIGTERM does not wait for the grace period.
            let impatient = CAUGHT_COUNT.load(Ordering::SeqCst) > 1;
            if s.kill_at.is_some_and(|t| impatient || now >= t) {
                signal_all(ranks, libc::SIGKILL);
                s.kill_at = None;
            }
        }
        thread::sleep(POLL);
    }
}

/// How long the launcher waits for the rank the others blame to end, when
/// another rank exited first (it may still be unwinding a panic).
const ORIGIN_WAIT: Duration = Duration::from_secs(1);

/// Reports the failure of `rank` (just reaped) and returns the run's exit
/// code. The ranks write the first rank that failed to `blame`
/// (`CULPRIT REPORTER` lines) as soon as they know it; when that is another
/// rank, it is the one to report: a survivor that exits at once on its
/// error is often reaped before the rank that caused it.
pub(super) fn report_failure(
    ranks: &mut [Rank],
    index: usize,
    blame: &std::path::Path,
    tail: &str,
) -> i32 {
    let status = ranks[index].status.expect("reaped");
    let rank = ranks[index].rank;
    let culprit = std::fs::read_to_string(blame).ok().and_then(|text| {
        let first = text.lines().next()?;
        first.split(' ').next()?.parse::<usize>().ok()
    });
    let Some(c) = culprit.filter(|&c| c != rank) else {
        // No rank names another origin: this one, reaped first, failed
        // first (whether or not the survivors wrote their blame before it
        // was reaped: they often have not yet when its panic ends it).
        let first = if status.success() {
            ""
        } else {
            " (the first rank to fail)"
        };
        eprintln!(
            "ferrocoll run: rank {rank} {}{first}{tail}",
            describe(status)
        );
        return exit_code(status);
    };
    // The culprit may run on another host (a multi-host run): then its own
    // host's launcher reports it.
    let Some(ci) = ranks.iter().position(|r| r.rank == c) else {
        eprintln!(
            "ferrocoll run: rank {rank} {}: the ranks report that rank {c} (on another host) \
             failed first{tail}",
            describe(status)
        );
        return exit_code(status);
    };
    let until = Instant::now() + ORIGIN_WAIT;
    while ranks[ci].status.is_none() && Instant::now() < until {
        match ranks[ci].child.try_wait() {
            Ok(Some(st)) => ranks[ci].status = Some(st),
            Ok(None) => thread::sleep(POLL),
            Err(_) => break,
        }
    }
    let after = format!("rank {rank} {} after it", describe(status));
    match ranks[ci].status {
        Some(st) if !st.success() => {
            eprintln!(
                "ferrocoll run: rank {c} {} (the first rank to fail; {after}){tail}",
                describe(st)
            );
            exit_code(st)
        }
        Some(_) => {
            eprintln!(
                "ferrocoll run: rank {c} exited with status 0 while the other ranks still needed it \
                 (the first rank to fail; {after}){tail}"
            );
            exit_code(status)
        }
        None => {
            eprintln!(
                "ferrocoll run: rank {rank} {}: the ranks report that rank {c} failed first{tail}",
                describe(status)
            );
            exit_code(status)
        }
    }
}

/// Sends `sig` to the process group of every rank (also of ranks already
/// ended: what they started may still run).
pub(super) fn signal_all(ranks: &[Rank], sig: libc::c_int) {
    for rank in ranks {
        if let Ok(pgid) = libc::pid_t::try_from(rank.child.id()) {
            // SAFETY: kill has no memory-safety preconditions; ESRCH (the
            // group is gone) is fine.
            unsafe {
                libc::kill(-pgid, sig);
            }
        }
    }
}

/// On Linux, the rank gets SIGKILL if the launcher dies (even by SIGKILL).
#[cfg(target_os = "linux")]
pub(super) fn die_with_parent(cmd: &mut Command) {
    // SAFETY: getpid is async-signal-safe.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the closure only makes async-signal-safe system calls.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                return Err(io::Error::last_os_error());
            }
            // The launcher died before prctl took effect.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
pub(super) fn die_with_parent(_cmd: &mut Command) {}

/// "exited with status S" or "was killed by signal N (SIGNAME)".
pub(super) fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(sig)) => match signal_name(sig) {
            Some(name) => format!("was killed by signal {sig} ({name})"),
            None => format!("was killed by signal {sig}"),
        },
        (None, None) => format!("ended ({status})"),
    }
}

/// The exit code that reports `status`: its code, or 128 + its signal.
pub(super) fn exit_code(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(sig)) => 128 + sig,
        (None, None) => 1,
    }
}

/// The name of a common signal.
fn signal_name(sig: libc::c_int) -> Option<&'static str> {
    const NAMES: [(libc::c_int, &str); 15] = [
        (libc::SIGHUP, "SIGHUP"),
        (libc::SIGINT, "SIGINT"),
        (libc::SIGQUIT, "SIGQUIT"),
        (libc::SIGILL, "SIGILL"),
        (libc::SIGTRAP, "SIGTRAP"),
        (libc::SIGABRT, "SIGABRT"),
        (libc::SIGBUS, "SIGBUS"),
        (libc::SIGFPE, "SIGFPE"),
        (libc::SIGKILL, "SIGKILL"),
        (libc::SIGUSR1, "SIGUSR1"),
        (libc::SIGSEGV, "SIGSEGV"),
        (libc::SIGUSR2, "SIGUSR2"),
        (libc::SIGPIPE, "SIGPIPE"),
        (libc::SIGALRM, "SIGALRM"),
        (libc::SIGTERM, "SIGTERM"),
    ];
    NAMES.iter().find(|(n, _)| *n == sig).map(|(_, name)| *name)
}
