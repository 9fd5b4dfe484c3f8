//! `ferrocoll run`: starts the processes of a program, one per rank, as
//! torchrun or mpirun do: N on this host (`-n N`), or across hosts
//! (`--hosts a:2,b:2`, see [`hosts`]).
//!
//! Each rank gets the inherited environment plus `FERROCOLL_RANK`,
//! `FERROCOLL_WORLD_SIZE`, `FERROCOLL_LOCAL_RANK`, `FERROCOLL_LOCAL_WORLD_SIZE`,
//! `FERROCOLL_ADDR` (the rendezvous address), `FERROCOLL_SECRET` (a random
//! token shared by the ranks of this run) and `FERROCOLL_JOB_ID` (a random
//! name, usable in file names); across hosts also `FERROCOLL_HOST_ID`. The
//! ranks' output comes back line by line, prefixed with `[rank] `.
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

mod hosts;
mod output;
mod signals;
mod supervise;

use std::ffi::OsString;
use std::fs::File;
use std::io::{self, Read};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::Args;

use crate::error::CliError;
use output::{pump, wait_for_output, Sink};
use signals::SignalGuard;
use supervise::{die_with_parent, report_failure, signal_all, supervise, Rank, StopRules};

/// How often the wait loop looks at the ranks (and at signals and the clock).
const POLL: Duration = Duration::from_millis(10);

/// How long to wait for the output of ranks already killed with SIGKILL
/// (held open only by processes that left their process group).
const LAST_OUTPUT_WAIT: Duration = Duration::from_secs(1);

/// Arguments of `ferrocoll run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Number of ranks: processes of PROGRAM to start (at least 1). With
    /// --hosts, at most the hosts' slots (default: all of them).
    #[arg(short = 'n', long = "ranks", value_name = "N", value_parser = parse_ranks,
          required_unless_present = "hosts")]
    ranks: Option<usize>,
    /// Start the ranks across hosts, as mpirun does: HOST:SLOTS,... (e.g.
    /// `node1:4,node2:4`; a HOST without :SLOTS has 1). Ranks are placed in
    /// blocks: the first SLOTS on the first host, and so on. Each host runs
    /// a launcher of its own, started through --agent.
    #[arg(long, value_name = "HOST:SLOTS,...", value_parser = hosts::parse_hosts)]
    hosts: Option<hosts::HostList>,
    /// How a host's launcher is started with --hosts: this command, then
    /// the host (or in place of `{host}`), then the launcher's command line.
    /// For the namespace cluster of bench/cluster.sh: "bench/cluster.sh
    /// exec" (or "ip netns exec").
    #[arg(long, value_name = "CMD", default_value = "ssh", requires = "hosts")]
    agent: String,
    /// Rendezvous address given to the ranks as FERROCOLL_ADDR (default:
    /// 127.0.0.1 and a free port; with --hosts, the first host and a random
    /// port).
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
    /// What a host's launcher gets from the head launcher of a --hosts run
    /// (not for users): where its ranks sit in the job.
    #[command(flatten)]
    host_part: hosts::HostPart,
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
#[derive(Debug, Clone, Default)]
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
    /// Where these ranks sit in a larger job (a host's part of a multi-host
    /// run); `None`: they are the whole job.
    pub part: Option<JobPart>,
}

/// The part of a multi-host job one host's launcher starts.
#[derive(Debug, Clone)]
pub struct JobPart {
    /// The job's rank of this host's first rank.
    pub first_rank: usize,
    /// The job's number of ranks, on every host together.
    pub world_size: usize,
    /// The job's secret (the head launcher made it).
    pub secret: String,
    /// The job's id (the head launcher made it).
    pub job_id: String,
    /// This host's identity, given to the ranks as `FERROCOLL_HOST_ID`.
    pub host_id: String,
}

/// Runs `ferrocoll run`: builds the [`LaunchOptions`] and [`launch`]es (or
/// [`hosts::launch_hosts`] with --hosts, or runs one host's part of such a
/// run). The result is the exit status the launcher should end with.
pub fn run(args: RunArgs) -> Result<ExitCode, CliError> {
    let mut command = args.command.into_iter();
    let program = command
        .next()
        .ok_or_else(|| CliError::Usage("no PROGRAM to run".into()))?;
    let mut opts = LaunchOptions {
        ranks: args.ranks.unwrap_or(0),
        program: PathBuf::from(program),
        args: command.collect(),
        extra_env: Vec::new(),
        prefix: !args.no_prefix,
        only_rank0_stdout: args.quiet_others,
        grace: args.grace,
        timeout: args.timeout,
        addr: args.addr,
        part: None,
    };
    let code = if args.host_part.host_launcher {
        hosts::run_host_part(&args.host_part, opts)?
    } else if let Some(list) = args.hosts {
        hosts::launch_hosts(&list, &args.agent, args.ranks, &mut opts)?
    } else {
        launch(&opts)?
    };
    // Exit codes are 0..=255 (an exit status or 128 + a signal number).
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
    let (first_rank, world_size) = match &opts.part {
        Some(part) => (part.first_rank, part.world_size),
        None => (0, opts.ranks),
    };
    let (secret, job_id) = match &opts.part {
        Some(part) => (part.secret.clone(), part.job_id.clone()),
        None => (random_hex(16)?, format!("r{}", random_hex(6)?)),
    };
    // Where the ranks say which rank failed first (FERROCOLL_BLAME_FILE).
    let blame = std::env::temp_dir().join(format!("ferrocoll-{job_id}-{first_rank}.blame"));
    let env_of = |local: usize| {
        let mut env = vec![
            (
                "FERROCOLL_RANK".to_string(),
                (first_rank + local).to_string(),
            ),
            ("FERROCOLL_WORLD_SIZE".to_string(), world_size.to_string()),
            ("FERROCOLL_LOCAL_RANK".to_string(), local.to_string()),
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
        if let Some(part) = &opts.part {
            env.push(("FERROCOLL_HOST_ID".to_string(), part.host_id.clone()));
        }
        env.extend(opts.extra_env.iter().cloned());
        env
    };

    let _signals = SignalGuard::install()?;
    let mut ranks: Vec<Rank> = Vec::with_capacity(opts.ranks);
    let mut pumps = Vec::new();
    for local in 0..opts.ranks {
        let rank = first_rank + local;
        let quiet = opts.only_rank0_stdout && rank != 0;
        let mut cmd = Command::new(&opts.program);
        cmd.args(&opts.args)
            .envs(env_of(local))
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
            rank,
        });
    }

    let rules = StopRules {
        grace: opts.grace,
        timeout: opts.timeout,
        stop_on_stdin_eof: opts.part.is_some(),
        timeout_signal: libc::SIGKILL,
    };
    let code = supervise(&mut ranks, &rules, &mut |ranks, index, others| {
        let tail = if others {
            "; stopping the other ranks"
        } else {
            ""
        };
        report_failure(ranks, index, &blame, tail)
    });
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
        part: None,
    };
    match launch(&options)? {
        0 => Ok(()),
        code => Err(CliError::Run(format!(
            "a rank of the {transport} {what} failed (exit status {code}); its message is above"
        ))),
    }
}
