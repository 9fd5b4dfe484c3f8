//! End-to-end tests of `ferrocoll run`: the built binary launching `sh`
//! ranks, their environment and output, and how a run stops.

use std::collections::BTreeSet;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// Runs `ferrocoll run ARGS`, returning its output and how long it took.
fn run(args: &[&str]) -> (Output, Duration) {
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_ferrocoll"))
        .arg("run")
        .args(args)
        .output()
        .expect("running the ferrocoll binary");
    (out, start.elapsed())
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).expect("output is UTF-8")
}

#[test]
fn every_rank_gets_its_rank_and_the_shared_rendezvous() {
    let (out, _) = run(&[
        "-n",
        "3",
        "--",
        "sh",
        "-c",
        "echo rank=$FERROCOLL_RANK size=$FERROCOLL_WORLD_SIZE \
         local=$FERROCOLL_LOCAL_RANK/$FERROCOLL_LOCAL_WORLD_SIZE; \
         echo shared $FERROCOLL_ADDR $FERROCOLL_SECRET $FERROCOLL_JOB_ID",
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}\n{stdout}", text(&out.stderr));

    let mut ranks = BTreeSet::new();
    let mut shared = BTreeSet::new();
    for line in stdout.lines() {
        let (prefix, rest) = line.split_once(' ').expect("a prefixed line");
        let rank: usize = prefix
            .strip_prefix('[')
            .and_then(|p| p.strip_suffix(']'))
            .unwrap_or_else(|| panic!("no [rank] prefix: {line:?}"))
            .parse()
            .expect("a rank number");
        if let Some(vars) = rest.strip_prefix("shared ") {
            shared.insert(vars.to_string());
        } else {
            assert_eq!(rest, format!("rank={rank} size=3 local={rank}/3"));
            ranks.insert(rank);
        }
    }
    assert_eq!(ranks, BTreeSet::from([0, 1, 2]), "{stdout}");
    assert_eq!(
        shared.len(),
        1,
        "ranks disagree on the rendezvous: {stdout}"
    );

    let vars = shared.into_iter().next().unwrap();
    let fields: Vec<&str> = vars.split(' ').collect();
    assert_eq!(fields.len(), 3, "{vars:?}");
    let (addr, secret, job) = (fields[0], fields[1], fields[2]);
    let port: u16 = addr
        .strip_prefix("127.0.0.1:")
        .expect("a local address")
        .parse()
        .expect("a port");
    assert_ne!(port, 0);
    assert_eq!(secret.len(), 32);
    assert!(secret.bytes().all(|b| b.is_ascii_hexdigit()), "{secret}");
    assert_eq!(job.len(), 13);
    assert!(job.starts_with('r'), "{job}");
    assert!(job[1..].bytes().all(|b| b.is_ascii_hexdigit()), "{job}");
}

#[test]
fn addr_is_passed_through_and_runs_differ_in_secret() {
    let script = "echo $FERROCOLL_ADDR $FERROCOLL_SECRET";
    let (a, _) = run(&["-n", "1", "--addr", "10.1.2.3:4567", "sh", "-c", script]);
    let (b, _) = run(&["-n", "1", "--addr", "10.1.2.3:4567", "sh", "-c", script]);
    assert!(a.status.success() && b.status.success());
    let (a, b) = (text(&a.stdout), text(&b.stdout));
    assert!(a.starts_with("[0] 10.1.2.3:4567 "), "{a}");
    assert!(b.starts_with("[0] 10.1.2.3:4567 "), "{b}");
    assert_ne!(a, b, "two runs got the same secret");
}

#[test]
fn stderr_lines_are_prefixed_too() {
    let (out, _) = run(&[
        "-n",
        "2",
        "sh",
        "-c",
        "echo oops-$FERROCOLL_RANK >&2; printf 'no newline'",
    ]);
    assert!(out.status.success());
    let stderr = text(&out.stderr);
    let lines: BTreeSet<&str> = stderr.lines().collect();
    assert_eq!(
        lines,
        BTreeSet::from(["[0] oops-0", "[1] oops-1"]),
        "{stderr}"
    );
    let stdout = text(&out.stdout);
    let lines: BTreeSet<&str> = stdout.lines().collect();
    assert_eq!(
        lines,
        BTreeSet::from(["[0] no newline", "[1] no newline"]),
        "{stdout}"
    );
}

#[test]
fn no_prefix_and_quiet_others() {
    let script = "echo out-$FERROCOLL_RANK; echo err-$FERROCOLL_RANK >&2";
    let (out, _) = run(&["-n", "2", "--no-prefix", "sh", "-c", script]);
    assert!(out.status.success());
    let stdout: BTreeSet<String> = text(&out.stdout).lines().map(String::from).collect();
    assert_eq!(stdout, BTreeSet::from(["out-0".into(), "out-1".into()]));

    let (out, _) = run(&[
        "-n",
        "3",
        "--no-prefix",
        "--quiet-others",
        "sh",
        "-c",
        script,
    ]);
    assert!(out.status.success());
    assert_eq!(text(&out.stdout), "out-0\n");
    let stderr: BTreeSet<String> = text(&out.stderr).lines().map(String::from).collect();
    let want: BTreeSet<String> = (0..3).map(|r| format!("[{r}] err-{r}")).collect();
    assert_eq!(stderr, want);
}

#[test]
fn a_failing_rank_stops_the_run_with_its_status() {
    let (out, elapsed) = run(&[
        "-n",
        "3",
        "--",
        "sh",
        "-c",
        "if [ $FERROCOLL_RANK = 1 ]; then exit 3; fi; sleep 30",
    ]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
    assert!(
        stderr.contains(
            "rank 1 exited with status 3 (the first rank to fail); stopping the other ranks"
        ),
        "{stderr}"
    );
}

#[test]
fn a_rank_killed_by_a_signal_gives_128_plus_the_signal() {
    let (out, elapsed) = run(&[
        "-n",
        "2",
        "--",
        "sh",
        "-c",
        "if [ $FERROCOLL_RANK = 1 ]; then kill -9 $$; fi; sleep 30",
    ]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(137), "{stderr}");
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
    assert!(
        stderr.contains("rank 1 was killed by signal 9 (SIGKILL)"),
        "{stderr}"
    );
}

#[test]
fn a_rank_ignoring_sigterm_is_killed_after_the_grace_period() {
    let (out, elapsed) = run(&[
        "-n",
        "2",
        "--grace",
        "0.5",
        "--",
        "sh",
        "-c",
        "trap '' TERM; if [ $FERROCOLL_RANK = 0 ]; then exit 5; fi; sleep 30",
    ]);
    assert_eq!(out.status.code(), Some(5), "{}", text(&out.stderr));
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
}

#[test]
fn timeout_kills_everything() {
    let (out, elapsed) = run(&["-n", "2", "--timeout", "1", "--", "sleep", "30"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(124), "{stderr}");
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
    assert!(
        stderr.contains("timed out after 1 s; killed all ranks"),
        "{stderr}"
    );
}

#[test]
fn sigterm_to_the_launcher_is_forwarded() {
    use std::io::{BufRead, BufReader};

    let start = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ferrocoll"))
        .args(["run", "-n", "2", "--", "sh", "-c", "echo ready; sleep 30"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("running the ferrocoll binary");
    // Output from a rank: the launcher's handler is installed by now.
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout
        .read_line(&mut line)
        .expect("reading the launcher's stdout");
    assert!(line.ends_with("ready\n"), "{line:?}");
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("running kill");
    assert!(status.success());
    let status = child.wait().expect("waiting for ferrocoll");
    assert_eq!(status.code(), Some(143));
    assert!(start.elapsed() < Duration::from_secs(10));
}

#[test]
fn a_missing_program_is_an_error_naming_it() {
    let (out, elapsed) = run(&["-n", "2", "--", "/nonexistent/ferrocoll-test-prog"]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert!(elapsed < Duration::from_secs(10));
    assert!(
        stderr.contains("/nonexistent/ferrocoll-test-prog"),
        "{stderr}"
    );
    assert!(stderr.contains("No such file"), "{stderr}");
}

#[test]
fn zero_ranks_and_no_program_are_usage_errors() {
    let (out, _) = run(&["-n", "0", "--", "true"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("at least 1"), "{stderr}");

    let (out, _) = run(&["-n", "2"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("PROGRAM"), "{stderr}");
}

#[test]
fn the_program_gets_its_own_options() {
    // Options after PROGRAM (even without `--`) are the program's.
    let (out, _) = run(&[
        "-n",
        "1",
        "sh",
        "-c",
        "printf '%s\\n' \"$*\"",
        "sh",
        "-n",
        "5",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "[0] -n 5\n");
}

#[test]
fn the_jobs_shared_memory_is_removed_after_the_run() {
    if !std::path::Path::new("/dev/shm").is_dir() {
        return;
    }
    // Rank 1 dies without unlinking its segment.
    let (out, _) = run(&[
        "-n",
        "2",
        "--",
        "sh",
        "-c",
        "touch /dev/shm/ferrocoll-$FERROCOLL_JOB_ID-$FERROCOLL_RANK; \
         echo $FERROCOLL_JOB_ID; if [ $FERROCOLL_RANK = 1 ]; then exit 1; fi",
    ]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let job = stdout
        .lines()
        .next()
        .expect("a job id")
        .split_once(' ')
        .unwrap()
        .1;
    for rank in 0..2 {
        let path = format!("/dev/shm/ferrocoll-{job}-{rank}");
        assert!(!std::path::Path::new(&path).exists(), "{path} left behind");
    }
}
