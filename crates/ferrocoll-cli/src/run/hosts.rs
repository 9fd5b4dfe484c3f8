//! `ferrocoll run --hosts a:2,b:2`: one job across hosts, started the way
//! mpirun starts one over ssh.
//!
//! The head launcher (the command the user ran) places the ranks in blocks
//! by host and starts, through the agent (`ssh` by default; `bench/cluster.sh
//! exec` or `ip netns exec` for the namespace cluster), one *host launcher*
//! per host: this binary again, `ferrocoll run --host-launcher ...`, which
//! starts that host's ranks exactly as a local `ferrocoll run` does (output
//! prefixed with the job's rank, a failing rank stops the host's others, the
//! job's shared memory removed afterwards: on that host, in its `/dev/shm`).
//! A host launcher is to the head what orted is to mpirun.
//!
//! The head hands each host launcher the job's secret on its standard input
//! (so it is not on any command line), then keeps that pipe open: its end
//! (the head stopped the run, or died, even by SIGKILL, or the ssh
//! connection broke) makes the host launcher stop its ranks. The first host
//! launcher that fails stops the run: the others get SIGTERM (through the
//! agent: ssh ends and their standard input with it) and SIGKILL after the
//! grace period, and the head exits with the failing host's status.
//!
//! The rendezvous address defaults to the first host's name and a random
//! port: every host must resolve that name (the namespace cluster writes an
//! /etc/hosts of its own into every host); `--addr` sets it.

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::{ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;

use super::output::{pump, wait_for_output, Sink};
use super::signals::{watch_stdin, SignalGuard};
use super::supervise::{
    describe, die_with_parent, exit_code, signal_all, supervise, Rank, StopRules,
};
use super::{launch, random_hex, JobPart, LaunchOptions, LAST_OUTPUT_WAIT};
use crate::error::CliError;

/// The hosts of `--hosts`: (name, slots), in the order given.
#[derive(Debug, Clone, PartialEq)]
pub struct HostList(pub Vec<(String, usize)>);

/// Parses `HOST:SLOTS,HOST:SLOTS,...` (`HOST` alone: 1 slot).
pub fn parse_hosts(s: &str) -> Result<HostList, String> {
    let mut hosts: Vec<(String, usize)> = Vec::new();
    for item in s.split(',') {
        let item = item.trim();
        let (name, slots) = match item.rsplit_once(':') {
            Some((name, slots)) => {
                let n: usize = slots
                    .parse()
                    .map_err(|_| format!("`{item}`: `{slots}` is not a number of slots"))?;
                (name, n)
            }
            None => (item, 1),
        };
        if name.is_empty() || name.contains(char::is_whitespace) {
            return Err(format!(
                "`{item}` is not HOST:SLOTS (e.g. --hosts node1:4,node2:4)"
            ));
        }
        if slots == 0 {
            return Err(format!("`{item}`: a host needs at least 1 slot"));
        }
        if hosts.iter().any(|(h, _)| h == name) {
            return Err(format!(
                "host `{name}` is listed twice; give it once with all its slots"
            ));
        }
        hosts.push((name.to_string(), slots));
    }
    Ok(HostList(hosts))
}

/// The hidden arguments a host launcher gets from the head.
#[derive(Debug, Args, Default)]
pub struct HostPart {
    /// Run as one host's launcher of a --hosts run (the head starts it; the
    /// job's secret comes on standard input).
    #[arg(long, hide = true)]
    pub host_launcher: bool,
    /// The job's rank of this host's first rank.
    #[arg(long, hide = true, requires = "host_launcher")]
    pub first_rank: Option<usize>,
    /// The job's number of ranks.
    #[arg(long, hide = true, requires = "host_launcher")]
    pub world_size: Option<usize>,
    /// The job's id.
    #[arg(long, hide = true, requires = "host_launcher")]
    pub job_id: Option<String>,
    /// This host's name in --hosts.
    #[arg(long, hide = true, requires = "host_launcher")]
    pub host_name: Option<String>,
    /// The head launcher's working directory: the ranks start there when
    /// this host has it (as mpirun does), else in the agent's.
    #[arg(long, hide = true, requires = "host_launcher")]
    pub wdir: Option<std::path::PathBuf>,
}

/// Block placement: the number of ranks on each host, filling the hosts in
/// order; `ranks` (default: every slot) must fit in the slots.
pub fn place(hosts: &HostList, ranks: Option<usize>) -> Result<Vec<usize>, CliError> {
    let slots: usize = hosts.0.iter().map(|(_, s)| s).sum();
    let n = ranks.unwrap_or(slots);
    if n > slots {
        return Err(CliError::Usage(format!(
            "-n {n} ranks do not fit in the {slots} slots of --hosts; give more slots or fewer ranks"
        )));
    }
    let mut left = n;
    Ok(hosts
        .0
        .iter()
        .map(|&(_, s)| {
            let here = s.min(left);
            left -= here;
            here
        })
        .collect())
}

/// The command line that starts `host`'s launcher through `agent`: the
/// agent's words with `{host}` replaced (or the host after them), then
/// `launcher`. Through ssh (whose remote side is a shell), every word of
/// the launcher's command is quoted for that shell.
pub fn agent_command(agent: &str, host: &str, launcher: &[OsString]) -> Vec<OsString> {
    let words: Vec<&str> = agent.split_whitespace().collect();
    let mut cmd: Vec<OsString> = Vec::new();
    let mut placed = false;
    for w in &words {
        if w.contains("{host}") {
            cmd.push(w.replace("{host}", host).into());
            placed = true;
        } else {
            cmd.push(OsString::from(w));
        }
    }
    if !placed {
        cmd.push(host.into());
    }
    let remote_shell = words
        .first()
        .and_then(|w| std::path::Path::new(w).file_name())
        .is_some_and(|n| n == "ssh" || n == "rsh");
    for word in launcher {
        if remote_shell {
            cmd.push(shell_quote(&word.to_string_lossy()).into());
        } else {
            cmd.push(word.clone());
        }
    }
    cmd
}

/// `s` as one word of a POSIX shell.
fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// A random port for the rendezvous on the first host, from the range
/// above the usual ephemeral-port start of the BSDs and below Linux's
/// (20000-32767), so that it rarely meets an outgoing connection's port.
fn random_port() -> Result<u16, CliError> {
    let hex = random_hex(2)?;
    let r = u16::from_str_radix(&hex, 16).unwrap_or(0);
    Ok(20000 + r % 12768)
}

/// Runs the head launcher of `--hosts`: starts one host launcher per host
/// that gets ranks, passes their output through (they prefix it), and
/// returns the run's exit code (as [`launch`]'s).
pub fn launch_hosts(
    hosts: &HostList,
    agent: &str,
    ranks: Option<usize>,
    opts: &mut LaunchOptions,
) -> Result<i32, CliError> {
    if agent.split_whitespace().next().is_none() {
        return Err(CliError::Usage("--agent is empty".into()));
    }
    let counts = place(hosts, ranks)?;
    let world_size: usize = counts.iter().sum();
    if world_size == 0 {
        return Err(CliError::Usage(
            "the number of ranks must be at least 1".into(),
        ));
    }
    let addr = match &opts.addr {
        Some(a) => a.clone(),
        None => format!("{}:{}", hosts.0[0].0, random_port()?),
    };
    let secret = random_hex(16)?;
    let job_id = format!("r{}", random_hex(6)?);
    let exe = std::env::current_exe()
        .map_err(|e| CliError::Run(format!("cannot find the ferrocoll executable: {e}")))?;

    let _signals = SignalGuard::install()?;
    let mut units: Vec<Rank> = Vec::new();
    let mut names: Vec<(String, usize, usize)> = Vec::new();
    let mut stdins: Vec<ChildStdin> = Vec::new();
    let mut pumps = Vec::new();
    let mut first = 0;
    for ((host, _), &count) in hosts.0.iter().zip(&counts) {
        if count == 0 {
            continue;
        }
        let mut launcher: Vec<OsString> = vec![
            exe.clone().into(),
            "run".into(),
            "--host-launcher".into(),
            "-n".into(),
            count.to_string().into(),
            "--first-rank".into(),
            first.to_string().into(),
            "--world-size".into(),
            world_size.to_string().into(),
            "--job-id".into(),
            job_id.clone().into(),
            "--host-name".into(),
            host.clone().into(),
            "--addr".into(),
            addr.clone().into(),
            "--grace".into(),
            opts.grace.as_secs_f64().to_string().into(),
        ];
        if let Ok(dir) = std::env::current_dir() {
            launcher.push("--wdir".into());
            launcher.push(dir.into());
        }
        if !opts.prefix {
            launcher.push("--no-prefix".into());
        }
        if opts.only_rank0_stdout {
            launcher.push("--quiet-others".into());
        }
        launcher.push("--".into());
        launcher.push(opts.program.clone().into());
        launcher.extend(opts.args.iter().cloned());
        let argv = agent_command(agent, host, &launcher);
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .envs(opts.extra_env.iter().cloned())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        die_with_parent(&mut cmd);
        let spawned = cmd.spawn().map(|mut child| {
            let mut stdin = child.stdin.take().expect("piped");
            // A host launcher that is gone already shows up as its exit.
            let _ = writeln!(stdin, "{secret}");
            (child, stdin)
        });
        let (mut child, stdin) = match spawned {
            Ok(c) => c,
            Err(e) => {
                signal_all(&units, libc::SIGTERM);
                for u in &mut units {
                    let _ = u.child.wait();
                }
                wait_for_output(&mut pumps, Instant::now() + LAST_OUTPUT_WAIT);
                return Err(CliError::Run(format!(
                    "cannot start the agent `{}` for host {host}: {e}",
                    argv[0].to_string_lossy()
                )));
            }
        };
        stdins.push(stdin);
        if let Some(out) = child.stdout.take() {
            pumps.push(pump(out, Sink::Stdout, Vec::new()));
        }
        if let Some(err) = child.stderr.take() {
            pumps.push(pump(err, Sink::Stderr, Vec::new()));
        }
        units.push(Rank {
            child,
            status: None,
            rank: first,
        });
        names.push((host.clone(), first, count));
        first += count;
    }

    // A host launcher gets the grace period for its ranks, and a little
    // more to report and clean up.
    let rules = StopRules {
        grace: opts.grace + Duration::from_secs(2),
        timeout: opts.timeout,
        stop_on_stdin_eof: false,
        timeout_signal: libc::SIGTERM,
    };
    let code = supervise(&mut units, &rules, &mut |units, index, others| {
        let status = units[index].status.expect("reaped");
        let (host, first, count) = &names[index];
        let tail = if others {
            "; stopping the other hosts"
        } else {
            ""
        };
        eprintln!(
            "ferrocoll run: host {host} (ranks {first}..{}) {}{tail}",
            first + count - 1,
            describe(status)
        );
        exit_code(status)
    });
    drop(stdins);
    if !wait_for_output(&mut pumps, Instant::now() + opts.grace) && code != 0 {
        signal_all(&units, libc::SIGKILL);
        wait_for_output(&mut pumps, Instant::now() + LAST_OUTPUT_WAIT);
    }
    Ok(code)
}

/// Runs one host's part of a `--hosts` run (`ferrocoll run
/// --host-launcher`): reads the job's secret from standard input, then
/// [`launch`]es this host's ranks, stopping them when standard input ends.
pub fn run_host_part(part: &HostPart, mut opts: LaunchOptions) -> Result<i32, CliError> {
    let missing = |what: &str| {
        CliError::Usage(format!(
            "--host-launcher needs --{what} (it is started by `ferrocoll run --hosts`, not by hand)"
        ))
    };
    let first_rank = part.first_rank.ok_or_else(|| missing("first-rank"))?;
    let world_size = part.world_size.ok_or_else(|| missing("world-size"))?;
    let job_id = part.job_id.clone().ok_or_else(|| missing("job-id"))?;
    let host_name = part.host_name.clone().ok_or_else(|| missing("host-name"))?;
    if opts.addr.is_none() {
        return Err(missing("addr"));
    }
    let mut secret = String::new();
    std::io::stdin()
        .read_line(&mut secret)
        .map_err(|e| CliError::Run(format!("reading the job's secret from stdin: {e}")))?;
    let secret = secret.trim().to_string();
    if secret.is_empty() {
        return Err(CliError::Run(
            "no job secret on stdin: the head launcher is gone".into(),
        ));
    }
    // A host identity the agent set (the namespace cluster sets one) wins
    // over the name in --hosts: it is what the host calls itself.
    let host_id = std::env::var("FERROCOLL_HOST_ID")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or(host_name);
    opts.part = Some(JobPart {
        first_rank,
        world_size,
        secret,
        job_id,
        host_id,
    });
    if let Some(dir) = &part.wdir {
        if let Err(e) = std::env::set_current_dir(dir) {
            eprintln!(
                "ferrocoll run: warning: host {}: cannot enter {}: {e}; the ranks start in {}",
                opts.part.as_ref().map_or("?", |p| p.host_id.as_str()),
                dir.display(),
                std::env::current_dir().map_or("?".into(), |d| d.display().to_string())
            );
        }
    }
    watch_stdin();
    launch(&opts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_parse_with_and_without_slots() {
        let h = parse_hosts("a:2, b:3,c").unwrap();
        assert_eq!(h.0, vec![("a".into(), 2), ("b".into(), 3), ("c".into(), 1)]);
        assert!(parse_hosts("a:0").unwrap_err().contains("at least 1 slot"));
        assert!(parse_hosts("a:x").unwrap_err().contains("not a number"));
        assert!(parse_hosts("a:1,a:2").unwrap_err().contains("twice"));
        assert!(parse_hosts(":2").unwrap_err().contains("HOST:SLOTS"));
    }

    #[test]
    fn placement_fills_hosts_in_blocks() {
        let h = parse_hosts("a:2,b:2,c:2").unwrap();
        assert_eq!(place(&h, None).unwrap(), vec![2, 2, 2]);
        assert_eq!(place(&h, Some(3)).unwrap(), vec![2, 1, 0]);
        assert!(place(&h, Some(7)).is_err());
    }

    #[test]
    fn agent_words_take_the_host_and_quote_for_ssh() {
        let launcher: Vec<OsString> = vec!["/bin/prog".into(), "two words".into()];
        let cmd = agent_command("ip netns exec", "h0", &launcher);
        assert_eq!(cmd, ["ip", "netns", "exec", "h0", "/bin/prog", "two words"]);
        let cmd = agent_command("docker exec {host}-c", "h0", &launcher);
        assert_eq!(cmd, ["docker", "exec", "h0-c", "/bin/prog", "two words"]);
        let cmd = agent_command("ssh -o BatchMode=yes", "n1", &launcher);
        assert_eq!(
            cmd,
            [
                "ssh",
                "-o",
                "BatchMode=yes",
                "n1",
                "/bin/prog",
                "'two words'"
            ]
        );
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }
}
