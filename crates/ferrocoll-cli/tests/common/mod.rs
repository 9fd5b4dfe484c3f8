//! What the test binaries that are their own rank programs share
//! (multiprocess.rs, faults.rs, errors_everywhere.rs: harness = false, so
//! `main` is theirs).

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The variable that makes a test binary play one rank in a role.
pub const ROLE: &str = "FERROCOLL_TEST_ROLE";

/// Runs the `tests` whose name contains the first non-option argument (all
/// without one), each caught so one failure does not hide the rest, prints
/// a line per test like libtest, and exits non-zero if any failed.
pub fn run_tests(tests: &[(&str, fn())], what: &str) {
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let mut failed = 0;
    for (name, test) in tests {
        if filter.as_ref().is_some_and(|f| !name.contains(f.as_str())) {
            continue;
        }
        let start = Instant::now();
        let outcome = std::panic::catch_unwind(test);
        let verdict = if outcome.is_ok() { "ok" } else { "FAILED" };
        println!(
            "test {name} ... {verdict} ({:.1} s)",
            start.elapsed().as_secs_f64()
        );
        failed += usize::from(outcome.is_err());
    }
    if failed > 0 {
        eprintln!("{failed} {what} test(s) failed");
        std::process::exit(1);
    }
}

/// A child's exit status and output, for assertion messages.
pub fn show(out: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A TCP port free on loopback right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs `n` ranks of this test binary in `role` over `transport`, started
/// directly (not through `ferrocoll run`, which would stop the survivors as
/// soon as one rank fails), with `env` added; `name` makes the job's id and
/// secret. Returns each rank's output, killing everything after 60 s: a
/// hang is a failure.
#[allow(dead_code)] // multiprocess.rs starts its ranks through `ferrocoll run`
pub fn direct_world(
    name: &str,
    n: usize,
    role: &str,
    transport: &str,
    env: &[(&str, &str)],
) -> Vec<Output> {
    let me = std::env::current_exe().unwrap();
    let port = free_port();
    let job = format!("{name}{}x{port}", std::process::id());
    let mut children: Vec<_> = (0..n)
        .map(|r| {
            let mut cmd = Command::new(&me);
            cmd.env(ROLE, role)
                .env("FERROCOLL_RANK", r.to_string())
                .env("FERROCOLL_WORLD_SIZE", n.to_string())
                .env("FERROCOLL_ADDR", format!("127.0.0.1:{port}"))
                .env("FERROCOLL_SECRET", name)
                .env("FERROCOLL_JOB_ID", &job)
                .env("FERROCOLL_TRANSPORT", transport)
                .env("FERROCOLL_TIMEOUT", "30");
            for (k, v) in env {
                cmd.env(k, v);
            }
            cmd.stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    while children.iter_mut().any(|c| c.try_wait().unwrap().is_none()) {
        if Instant::now() > deadline {
            for c in &mut children {
                let _ = c.kill();
            }
            panic!("{role} over {transport} hung: killed after 60 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect()
}
