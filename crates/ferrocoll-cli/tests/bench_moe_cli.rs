//! End-to-end tests of `ferrocoll bench moe`: its JSON lines, `--check`
//! under every schedule, drops, processes, the `FERROCOLL_DEBUG=tune`
//! explanation and its errors.

use std::process::{Command, Output};

use serde_json::Value;

/// Runs `ferrocoll bench moe ARGS` with `env` added (and the schedule,
/// algorithm and topology variables of the caller removed).
fn bench_moe(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferrocoll"))
        .args(["bench", "moe", "--iters", "2", "--warmup", "1"])
        .args(args)
        .env_remove("FERROCOLL_MOE_SCHEDULE")
        .env_remove("FERROCOLL_ALGO")
        .env_remove("FERROCOLL_TOPO")
        .env_remove("FERROCOLL_PROFILE")
        .env_remove("FERROCOLL_DEBUG")
        .envs(env.iter().copied())
        .env("FERROCOLL_TIMEOUT", "30")
        .output()
        .expect("runs")
}

fn lines(out: &Output) -> Vec<Value> {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

const FIELDS: [&str; 12] = [
    "dispatch_us",
    "combine_us",
    "logical_GBps",
    "dispatch_GBps",
    "combine_GBps",
    "logical_bytes",
    "dropped",
    "wrong",
    "schedule",
    "combine_schedule",
    "predicted_dispatch_us",
    "topology",
];

#[test]
fn every_schedule_is_checked_on_two_fake_hosts() {
    let out = bench_moe(
        &[
            "-n",
            "4",
            "--tokens",
            "3,8",
            "--hidden",
            "16",
            "--experts",
            "8",
            "--skew",
            "uniform,zipf:1.2",
            "--schedule",
            "direct,pairwise,two-level,rail,auto,flat",
            "--check",
            "--json",
        ],
        &[("FERROCOLL_TOPO", "2x2")],
    );
    let rows = lines(&out);
    assert_eq!(rows.len(), 2 * 2 * 6);
    for r in &rows {
        for f in FIELDS {
            assert!(r.get(f).is_some(), "no {f} in {r}");
        }
        assert_eq!(r["wrong"], 0, "{r}");
        assert_eq!(r["dropped"], 0, "dropless: {r}");
        assert_eq!(r["topology"], "2x2");
        assert!(r["dispatch_us"].as_f64().unwrap() > 0.0);
        // Each rank receives top-2 x its tokens on average: 2 x T rows.
        let rows = 2.0 * r["tokens"].as_f64().unwrap() * 16.0 * 2.0;
        assert!(
            (r["logical_bytes"].as_f64().unwrap() - rows).abs() < 1e-9,
            "{r}"
        );
        let asked = r["requested"].as_str().unwrap();
        if asked != "auto" {
            assert_eq!(r["schedule"], asked, "{r}");
            assert_eq!(r["combine_schedule"], asked, "{r}");
        }
        let predicted = r["predicted_dispatch_us"].as_object().unwrap();
        assert_eq!(predicted.len(), 4, "direct, pairwise, two-level, rail: {r}");
    }
}

#[test]
fn a_capacity_drops_and_the_check_still_holds() {
    let out = bench_moe(
        &[
            "-n",
            "3",
            "--tokens",
            "20",
            "--hidden",
            "8",
            "--experts",
            "6",
            "--skew",
            "zipf:1.5",
            "--capacity",
            "0.5",
            "--dtype",
            "f32",
            "--check",
            "--json",
        ],
        &[],
    );
    let r = &lines(&out)[0];
    assert!(r["dropped"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(r["wrong"], 0, "{r}");
    assert_eq!(r["capacity"], 0.5);
}

#[test]
fn processes_over_shared_memory() {
    let out = bench_moe(
        &[
            "--transport",
            "shm",
            "-n",
            "2",
            "--tokens",
            "64",
            "--hidden",
            "64",
            "--experts",
            "4",
            "--check",
            "--json",
        ],
        &[],
    );
    let r = &lines(&out)[0];
    assert_eq!(
        (r["transport"].as_str(), r["wrong"].as_u64()),
        (Some("shm"), Some(0))
    );
}

#[test]
fn the_table_and_the_tune_explanation() {
    let out = bench_moe(
        &[
            "-n",
            "4",
            "--tokens",
            "4",
            "--hidden",
            "8",
            "--experts",
            "4",
        ],
        &[("FERROCOLL_TOPO", "2x2"), ("FERROCOLL_DEBUG", "tune")],
    );
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with("# bench moe: 4 ranks (thread)"),
        "{stdout}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    for want in [
        "ferrocoll tune: moe dispatch on 4 ranks (topology 2x2)",
        "ferrocoll tune: moe combine",
        "two-level",
        "rail",
        "chosen ",
    ] {
        assert!(stderr.contains(want), "no {want:?} in {stderr}");
    }
}

#[test]
fn errors_say_what_to_fix() {
    for (args, env, want) in [
        (
            vec!["-n", "4", "--experts", "6"],
            vec![],
            "--experts 6 cannot be split evenly over 4 ranks",
        ),
        (vec!["--dtype", "i32"], vec![], "bf16, f16 and f32"),
        (vec!["--capacity", "1e3"], vec![], "not a capacity factor"),
        (vec!["--schedule", "ring"], vec![], "unknown MoE schedule"),
        (
            vec!["--tokens", "1"],
            vec![("FERROCOLL_MOE_SCHEDULE", "bogus")],
            "FERROCOLL_MOE_SCHEDULE",
        ),
    ] {
        let out = bench_moe(&args, &env);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(want), "{args:?}: {stderr}");
        assert!(
            out.stdout.is_empty(),
            "{args:?}: nothing printed before the error"
        );
    }
}
