//! What the test binaries that are their own rank programs share
//! (multiprocess.rs, faults.rs: harness = false, so `main` is theirs).

use std::process::Output;
use std::time::Instant;

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
