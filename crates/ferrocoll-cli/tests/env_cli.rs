//! The `ferrocoll` command with bad environment variables: every one it
//! (or the library under it) reads is refused with the library's
//! configuration error naming it, exit status 2, nothing printed on
//! stdout, never a panic. The values themselves are tried one by one in
//! `crates/ferrocoll/tests/env_hardening.rs`; this checks that the command
//! reports them, in-process (thread ranks), for ranks it starts itself
//! (`--transport shm`), and for its own `store` subcommand.

use std::process::{Command, Output};

#[allow(dead_code)] // the helpers of the rank programs are not used here
mod common;
use common::show;

fn ferrocoll(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferrocoll"));
    cmd.args(args);
    for var in [
        "FERROCOLL_ALGO",
        "FERROCOLL_TOPO",
        "FERROCOLL_PROFILE",
        "FERROCOLL_DEBUG",
        "FERROCOLL_SECRET",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("FERROCOLL_TIMEOUT", "30").envs(env.iter().copied());
    cmd.output().expect("running the ferrocoll binary")
}

/// Asserts a clean refusal naming `var`.
fn refused(out: &Output, var: &str, what: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{what} was accepted: {}", show(out));
    assert!(
        !stderr.contains("panicked"),
        "{what} panicked: {}",
        show(out)
    );
    assert!(
        stderr.contains(var),
        "{what}: {var} not named: {}",
        show(out)
    );
}

const SMALL: &[&str] = &["bench", "-n", "2", "-b", "8", "-e", "8", "--iters", "1"];

#[test]
fn bench_refuses_bad_configuration_by_name() {
    for (var, value) in [
        ("FERROCOLL_TIMEOUT", "1e300"),
        ("FERROCOLL_TIMEOUT", "NaN"),
        ("FERROCOLL_TIMEOUT", "-1"),
        ("FERROCOLL_TIMEOUT", "0"),
        ("FERROCOLL_TIMEOUT", "inf"),
        ("FERROCOLL_SLICE_BYTES", "-1"),
        ("FERROCOLL_SLICE_BYTES", "18446744073709551616"),
        ("FERROCOLL_ALGO", "garbage"),
        ("FERROCOLL_TOPO", "18446744073709551615x2"),
        ("FERROCOLL_TOPO", "2x4"),
        ("FERROCOLL_AUTO", "0"),
        ("FERROCOLL_DEBUG", "verbose"),
        ("FERROCOLL_PROFILE", "/nonexistent/profile.json"),
        // The thread transport's one knob (how long a waiting rank polls).
        ("FERROCOLL_SPIN_US", "soon"),
        ("FERROCOLL_SPIN_US", "1000001"),
    ] {
        let out = ferrocoll(SMALL, &[(var, value)]);
        let what = format!("{var}={value}");
        refused(&out, var, &what);
        assert_eq!(out.status.code(), Some(2), "{what}: {}", show(&out));
        assert!(
            out.stdout.is_empty(),
            "{what} printed results: {}",
            show(&out)
        );
    }
    // Empty is unset: the run goes ahead.
    let out = ferrocoll(
        SMALL,
        &[("FERROCOLL_TIMEOUT", ""), ("FERROCOLL_DEBUG", " ")],
    );
    assert!(out.status.success(), "{}", show(&out));
}

#[test]
fn ranks_the_command_starts_refuse_bad_knobs_by_name() {
    // bench --transport shm starts its ranks through `ferrocoll run`; each
    // reads the start-up and transport knobs in init.
    for (var, value) in [
        ("FERROCOLL_SHM_RING_BYTES", "3"),
        ("FERROCOLL_SPIN_US", "soon"),
        ("FERROCOLL_TCP_STREAMS", "0"),
        ("FERROCOLL_BIND", "garbage"),
    ] {
        let mut args = SMALL.to_vec();
        args.extend(["--transport", "shm"]);
        let out = ferrocoll(&args, &[(var, value)]);
        refused(&out, var, &format!("{var}={value} under --transport shm"));
    }
}

#[test]
fn store_refuses_an_empty_secret() {
    for secret in ["", "   "] {
        let out = ferrocoll(
            &["store", "--addr", "127.0.0.1:0"],
            &[("FERROCOLL_SECRET", secret)],
        );
        refused(
            &out,
            "FERROCOLL_SECRET",
            &format!("FERROCOLL_SECRET={secret:?}"),
        );
        assert_eq!(out.status.code(), Some(2), "{}", show(&out));
    }
    let out = ferrocoll(&["store", "--addr", "127.0.0.1:0", "--secret", " "], &[]);
    refused(&out, "--secret", "--secret ' '");
}
