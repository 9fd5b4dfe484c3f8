//! `ferrocoll run`: starts N local processes of a program, one per rank, as
//! torchrun or mpirun do on one host.
//!
//! Each rank gets the inherited environment plus `FERROCOLL_RANK`,
//! `FERROCOLL_WORLD_SIZE`, `FERROCOLL_LOCAL_RANK`, `FERROCOLL_LOCAL_WORLD_SIZE`,
//! `FERROCOLL_ADDR` (the rendezvous address), `FERROCOLL_SECRET` (a random
//! token shared by the ranks of this run) and `FERROCOLL_JOB_ID` (a random
//! name, usable in file names). The ranks' output comes back line by line,
//! prefixed with `[rank] `.
//!
//! The first rank that fails (a non-zero exit status or a signal) stops the
//! run: the others get SIGTERM, then SIGKILL after a grace period, and the
//! launcher exits with the failing rank's status (128 + the signal number for
//! a signal). SIGINT or SIGTERM to the launcher is forwarded to the ranks as
//! SIGTERM (exit 130 / 143); `--timeout` kills everything (exit 124). Each
//! rank runs in a process group of its own, so whatever it started goes with
//! it, and its stdin is `/dev/null`. When all ranks have ended, the job's
//! shared-memory segments are removed.
//!
//! [`launch`] is the same launcher for other subcommands (`ferrocoll bench
//! --transport shm|tcp` re-runs this binary under it).

use std::ffi::OsString;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use clap::Args;

use crate::error::CliError;

/// How often the wait loop looks at the ranks (and at signals and the clock).
const POLL: Duration = Duration::from_millis(10);

/// Longest piece of output forwarded as one line: a longer line (or output
/// without newlines) is cut into pieces of this size.
const MAX_LINE: u64 = 64 * 1024;

/// How long to wait for the output of ranks already killed with SIGKILL
/// (held open only by processes that left their process group).
const LAST_OUTPUT_WAIT: Duration = Duration::from_secs(1);

/// Arguments of `ferrocoll run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Number of ranks: processes of PROGRAM to start (at least 1).
    #[arg(short = 'n', long = "ranks", value_name = "N", value_parser = parse_ranks)]
    ranks: usize,
    /// Rendezvous address given to the ranks as FERROCOLL_ADDR (default:
    /// 127.0.0.1 and a free port).
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_addr)]
    addr: Option<String>,
    /// Do not prefix the ranks' output lines with "[rank] ".
    #[arg(long)]
    no_prefix: bool,
    /// Show only rank 0's stdout and discard the other ranks' stdout (for
    /// benchmarks); the stderr of all ranks is still shown, prefixed.
    #[arg(long)]
    quiet_others: bool,
    /// Seconds the other ranks get to end after SIGTERM (when a rank failed
    /// or the launcher was interrupted) before they are killed with SIGKILL.
    #[arg(long, value_name = "SECONDS", default_value = "3", value_parser = parse_grace)]
    grace: Duration,
    /// Kill all ranks and exit with status 124 if the run takes longer than
    /// this many seconds.
    #[arg(long, value_name = "SECONDS", value_parser = parse_timeout)]
    timeout: Option<Duration>,
    /// The program to start (looked up in PATH), then its arguments. Put
    /// `--` before it when its arguments start with `-`.
    #[arg(
        value_name = "PROGRAM",
        required = true,
        num_args = 1..,
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    command: Vec<OsString>,
}

/// What [`launch`] starts and how.
#[derive(Debug, Clone)]
pub struct LaunchOptions {
    /// Number of ranks (processes) to start; at least 1.
    pub ranks: usize,
    /// The program each rank runs (looked up in PATH as `Command` does).
    pub program: PathBuf,
    /// The program's arguments, the same for every rank.
    pub args: Vec<OsString>,
    /// More environment variables for every rank, set after the launcher's
    /// own `FERROCOLL_*` ones (so they can override them).
    pub extra_env: Vec<(String, String)>,
    /// Prefix each stdout line with `[rank] ` (and each stderr line, unless
    /// `only_rank0_stdout` is set: then stderr is always prefixed).
    pub prefix: bool,
    /// Show only rank 0's stdout; the other ranks' stdout goes to
    /// `/dev/null`.
    pub only_rank0_stdout: bool,
    /// How long the ranks get between SIGTERM and SIGKILL.
    pub grace: Duration,
    /// Kill everything (exit code 124) when the run takes longer than this.
    pub timeout: Option<Duration>,
    /// The rendezvous address (`HOST:PORT`); `None` picks a free port on
    /// 127.0.0.1.
    pub addr: Option<String>,
}

/// Runs `ferrocoll run`: builds the [`LaunchOptions`] and [`launch`]es.
/// The result is the exit status the launcher should end with.
pub fn run(args: RunArgs) -> Result<ExitCode, CliError> {
    let mut command = args.command.into_iter();
    let program = command
        .next()
        .ok_or_else(|| CliError::Usage("no PROGRAM to run".into()))?;
    let opts = LaunchOptions {
        ranks: args.ranks,
        program: PathBuf::from(program),
        args: command.collect(),
        extra_env: Vec::new(),
        prefix: !args.no_prefix,
        only_rank0_stdout: args.quiet_others,
        grace: args.grace,
        timeout: args.timeout,
        addr: args.addr,
    };
    let code = launch(&opts)?;
    // `launch` returns 0..=255 (an exit status or 128 + a signal number).
    Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
}

/// Starts `opts.ranks` processes of `opts.program`, forwards their output,
/// waits for them all and returns the exit code of the run: 0 when every
/// rank exited 0, else the first failing rank's status (128 + signal number
/// when it was killed by a signal), 130 / 143 when the launcher got SIGINT /
/// SIGTERM, 124 on timeout.
///
/// While it runs, SIGINT and SIGTERM of this process are caught (the
/// previous handlers are restored on return); only one launch should run at
/// a time in a process. When the program cannot be started, the ranks
/// already started are killed and the error names the program.
pub fn launch(opts: &LaunchOptions) -> Result<i32, CliError> {
    if opts.ranks == 0 {
        return Err(CliError::Usage(
            "the number of ranks must be at least 1".into(),
        ));
    }
    let addr = match &opts.addr {
        Some(addr) => addr.clone(),
        None => format!("127.0.0.1:{}", free_port()?),
    };
    let secret = random_hex(16)?;
    let job_id = format!("r{}", random_hex(6)?);
    // Where the ranks say which rank failed first (FERROCOLL_BLAME_FILE).
    let blame = std::env::temp_dir().join(format!("ferrocoll-{job_id}.blame"));
    let env_of = |rank: usize| {
        let mut env = vec![
            ("FERROCOLL_RANK".to_string(), rank.to_string()),
            ("FERROCOLL_WORLD_SIZE".to_string(), opts.ranks.to_string()),
            ("FERROCOLL_LOCAL_RANK".to_string(), rank.to_string()),
            (
                "FERROCOLL_LOCAL_WORLD_SIZE".to_string(),
                opts.ranks.to_string(),
            ),
            ("FERROCOLL_ADDR".to_string(), addr.clone()),
            ("FERROCOLL_SECRET".to_string(), secret.clone()),
            ("FERROCOLL_JOB_ID".to_string(), job_id.clone()),
            (
                "FERROCOLL_BLAME_FILE".to_string(),
                blame.display().to_string(),
            ),
        ];
        env.extend(opts.extra_env.iter().cloned());
        env
    };

    let _signals = SignalGuard::install()?;
    let mut ranks: Vec<Rank> = Vec::with_capacity(opts.ranks);
    let mut pumps: Vec<JoinHandle<()>> = Vec::new();
    for rank in 0..opts.ranks {
        let quiet = opts.only_rank0_stdout && rank != 0;
        let mut cmd = Command::new(&opts.program);
        cmd.args(&opts.args)
            .envs(env_of(rank))
            .stdin(Stdio::null())
            .stdout(if quiet { Stdio::null() } else { Stdio::piped() })
            .stderr(Stdio::piped())
            // Its own process group: signals reach what the rank started too.
            .process_group(0);
        die_with_parent(&mut cmd);
        let mut child = match cmd.spawn() {
            Ok(child) => child,
            Err(e) => {
                signal_all(&ranks, libc::SIGKILL);
                for r in &mut ranks {
                    let _ = r.child.wait();
                }
                wait_for_output(&mut pumps, Instant::now() + LAST_OUTPUT_WAIT);
                cleanup(&job_id);
                let _ = std::fs::remove_file(&blame);
                return Err(CliError::Run(format!(
                    "cannot start `{}`: {e}",
                    opts.program.display()
                )));
            }
        };
        let label = format!("[{rank}] ").into_bytes();
        if let Some(out) = child.stdout.take() {
            let prefix = if opts.prefix {
                label.clone()
            } else {
                Vec::new()
            };
            pumps.push(pump(out, Sink::Stdout, prefix));
        }
        if let Some(err) = child.stderr.take() {
            let prefix = if opts.prefix || opts.only_rank0_stdout {
                label
            } else {
                Vec::new()
            };
            pumps.push(pump(err, Sink::Stderr, prefix));
        }
        ranks.push(Rank {
            child,
            status: None,
        });
    }

    let code = supervise(&mut ranks, opts, &blame);
    let _ = std::fs::remove_file(&blame);

    // Everything the ranks wrote, unless some leftover process holds a pipe:
    // then give it the grace period (and SIGKILL if the run was stopped).
    if !wait_for_output(&mut pumps, Instant::now() + opts.grace) && code != 0 {
        signal_all(&ranks, libc::SIGKILL);
        wait_for_output(&mut pumps, Instant::now() + LAST_OUTPUT_WAIT);
    }
    cleanup(&job_id);
    Ok(code)
}

/// One started rank.
struct Rank {
    child: Child,
    /// Its exit status, once reaped.
    status: Option<ExitStatus>,
}

/// Why the run is being stopped, and the exit code it ends with.
#[derive(Clone, Copy)]
struct Stop {
    code: i32,
    /// When to send SIGKILL to the ranks still running (`None`: sent).
    kill_at: Option<Instant>,
}

/// Waits for all ranks, stopping the run on the first failure, a signal to
/// the launcher or the timeout. Returns the run's exit code.
fn supervise(ranks: &mut [Rank], opts: &LaunchOptions, blame: &std::path::Path) -> i32 {
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
                let tail = if others {
                    "; stopping the other ranks"
                } else {
                    ""
                };
                let code = report_failure(ranks, rank, blame, tail);
                signal_all(ranks, libc::SIGTERM);
                stop = Some(Stop {
                    code,
                    kill_at: Some(Instant::now() + opts.grace),
                });
            }
        }
        if running == 0 {
            return stop.map_or(0, |s| s.code);
        }

        let now = Instant::now();
        if stop.is_none() {
            let sig = CAUGHT.load(Ordering::SeqCst);
            if sig != 0 {
                signal_all(ranks, libc::SIGTERM);
                stop = Some(Stop {
                    code: 128 + sig,
                    kill_at: Some(now + opts.grace),
                });
            } else if opts.timeout.is_some_and(|t| now - start >= t) {
                let secs = opts.timeout.map_or(0.0, |t| t.as_secs_f64());
                eprintln!("ferrocoll run: timed out after {secs} s; killed all ranks");
                signal_all(ranks, libc::SIGKILL);
                stop = Some(Stop {
                    code: 124,
                    kill_at: None,
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
fn report_failure(ranks: &mut [Rank], rank: usize, blame: &std::path::Path, tail: &str) -> i32 {
    let status = ranks[rank].status.expect("reaped");
    let culprit = std::fs::read_to_string(blame).ok().and_then(|text| {
        let first = text.lines().next()?;
        first.split(' ').next()?.parse::<usize>().ok()
    });
    let Some(c) = culprit.filter(|&c| c != rank && c < ranks.len()) else {
        eprintln!("ferrocoll run: rank {rank} {}{tail}", describe(status));
        return exit_code(status);
    };
    let until = Instant::now() + ORIGIN_WAIT;
    while ranks[c].status.is_none() && Instant::now() < until {
        match ranks[c].child.try_wait() {
            Ok(Some(st)) => ranks[c].status = Some(st),
            Ok(None) => thread::sleep(POLL),
            Err(_) => break,
        }
    }
    let after = format!("rank {rank} {} after it", describe(status));
    match ranks[c].status {
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
fn signal_all(ranks: &[Rank], sig: libc::c_int) {
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
fn die_with_parent(cmd: &mut Command) {
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
fn die_with_parent(_cmd: &mut Command) {}

/// "exited with status S" or "was killed by signal N (SIGNAME)".
fn describe(status: ExitStatus) -> String {
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
fn exit_code(status: ExitStatus) -> i32 {
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

/// Where a rank's output goes.
#[derive(Clone, Copy)]
enum Sink {
    Stdout,
    Stderr,
}

/// A thread that copies `src` line by line to `sink`, each line written
/// whole (under the stream's lock) after `prefix`.
fn pump(src: impl Read + Send + 'static, sink: Sink, prefix: Vec<u8>) -> JoinHandle<()> {
    thread::spawn(move || {
        let mut reader = BufReader::new(src);
        let mut buf = Vec::new();
        let mut line = Vec::new();
        loop {
            buf.clear();
            match (&mut reader).take(MAX_LINE).read_until(b'\n', &mut buf) {
                Ok(0) => return,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return,
            }
            line.clear();
            line.extend_from_slice(&prefix);
            line.extend_from_slice(&buf);
            if !line.ends_with(b"\n") {
                line.push(b'\n');
            }
            // A closed stdout / stderr: keep draining so the rank does not
            // block on a full pipe.
            let _ = match sink {
                Sink::Stdout => {
                    let mut out = io::stdout().lock();
                    out.write_all(&line).and_then(|()| out.flush())
                }
                Sink::Stderr => io::stderr().lock().write_all(&line),
            };
        }
    })
}

/// Waits until every output thread is done or `deadline` passes; joins the
/// finished ones and leaves the others running. True when all finished.
fn wait_for_output(pumps: &mut Vec<JoinHandle<()>>, deadline: Instant) -> bool {
    loop {
        let (done, rest): (Vec<_>, Vec<_>) = pumps.drain(..).partition(|p| p.is_finished());
        for p in done {
            let _ = p.join();
        }
        *pumps = rest;
        if pumps.is_empty() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(POLL);
    }
}

/// Removes the job's shared-memory segments (left behind by ranks that died
/// before unlinking them), warning when that fails.
fn cleanup(job: &str) {
    match ferrocoll::transport::shm::remove_job_segments(job) {
        Ok(_) => {}
        // No /dev/shm on this system: nothing to remove.
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => {
            eprintln!("ferrocoll run: warning: removing the shared memory of job {job}: {e}")
        }
    }
}

/// A port on 127.0.0.1 that was free a moment ago.
fn free_port() -> Result<u16, CliError> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .map_err(|e| CliError::Run(format!("finding a free port on 127.0.0.1: {e}")))?;
    let port = listener
        .local_addr()
        .map_err(|e| CliError::Run(format!("finding a free port on 127.0.0.1: {e}")))?
        .port();
    Ok(port)
}

/// `bytes` random bytes from /dev/urandom, in hex.
fn random_hex(bytes: usize) -> Result<String, CliError> {
    let mut buf = vec![0u8; bytes];
    File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(|e| CliError::Run(format!("reading /dev/urandom: {e}")))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// The first SIGINT / SIGTERM the launcher got (0: none).
static CAUGHT: AtomicI32 = AtomicI32::new(0);
/// How many SIGINT / SIGTERM the launcher got.
static CAUGHT_COUNT: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    // Atomics are async-signal-safe.
    let _ = CAUGHT.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst);
    CAUGHT_COUNT.fetch_add(1, Ordering::SeqCst);
}

/// Catches SIGINT and SIGTERM while alive; restores the previous handlers
/// when dropped.
struct SignalGuard {
    previous: Vec<(libc::c_int, libc::sigaction)>,
}

impl SignalGuard {
    fn install() -> Result<SignalGuard, CliError> {
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

fn parse_ranks(s: &str) -> Result<usize, String> {
    let n: usize = s
        .parse()
        .map_err(|_| format!("`{s}` is not a number of ranks"))?;
    if n == 0 {
        return Err("the number of ranks must be at least 1".into());
    }
    Ok(n)
}

fn parse_seconds(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("`{s}` is not a number of seconds"))?;
    Duration::try_from_secs_f64(secs).map_err(|_| format!("`{s}` is not a number of seconds"))
}

fn parse_grace(s: &str) -> Result<Duration, String> {
    parse_seconds(s)
}

fn parse_timeout(s: &str) -> Result<Duration, String> {
    let t = parse_seconds(s)?;
    if t.is_zero() {
        return Err("the timeout must be more than 0 seconds".into());
    }
    Ok(t)
}

fn parse_addr(s: &str) -> Result<String, String> {
    let port = s
        .rsplit_once(':')
        .map(|(host, port)| (host, port.parse::<u16>()));
    match port {
        Some((host, Ok(_))) if !host.is_empty() => Ok(s.to_string()),
        _ => Err(format!("`{s}` is not HOST:PORT")),
    }
}

/// Set in the environment of the ranks that `bench` and `calibrate` start
/// for `--transport shm|tcp`.
const CHILD_VAR: &str = "FERROCOLL_SELF_LAUNCHED";

/// Whether this process is one rank of a launched job (by us or by any
/// launcher whose variables `ferrocoll::init` reads). A launcher's variable
/// that is set but wrong counts as a job too, so that `init` reports it
/// rather than this command starting ranks of its own inside someone
/// else's job.
pub fn in_job() -> bool {
    std::env::var_os(CHILD_VAR).is_some()
        || matches!(
            ferrocoll::world::WorldSpec::from_env(),
            Ok(_) | Err(ferrocoll::Error::Config { .. })
        )
}

/// Runs this very command again as `n` processes under the launcher, with
/// `FERROCOLL_TRANSPORT=transport`, showing rank 0's output only, and
/// passes on their exit status (`what` names the job in the error).
pub fn relaunch_self(n: usize, transport: &str, what: &str) -> Result<(), CliError> {
    let program = std::env::current_exe()
        .map_err(|e| CliError::Run(format!("cannot find the ferrocoll executable: {e}")))?;
    let options = LaunchOptions {
        ranks: n,
        program,
        args: std::env::args_os().skip(1).collect(),
        extra_env: vec![
            (CHILD_VAR.into(), "1".into()),
            ("FERROCOLL_TRANSPORT".into(), transport.into()),
        ],
        prefix: false,
        only_rank0_stdout: true,
        grace: Duration::from_secs(3),
        timeout: None,
        addr: None,
    };
    match launch(&options)? {
        0 => Ok(()),
        code => Err(CliError::Run(format!(
            "a rank of the {transport} {what} failed (exit status {code}); its message is above"
        ))),
    }
}
