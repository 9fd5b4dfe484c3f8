//! End-to-end tests of `ferrocoll bench`: the built binary, its JSON output,
//! its algorithm reporting and its errors.

use std::collections::BTreeSet;
use std::process::{Command, Output};

use serde_json::Value;

const COLLECTIVES: [&str; 9] = [
    "allreduce",
    "allgather",
    "reducescatter",
    "alltoall",
    "alltoallv",
    "bcast",
    "reduce",
    "gather",
    "scatter",
];

const FIELDS: [&str; 14] = [
    "coll",
    "bytes",
    "count",
    "dtype",
    "op",
    "ranks",
    "transport",
    "algo",
    "time_us",
    "algbw",
    "busbw",
    "wrong",
    "predicted_us",
    "median_us",
];

/// Runs `ferrocoll bench ARGS` (few iterations) with `FERROCOLL_ALGO` set to
/// `algo_env` or removed (and `FERROCOLL_TOPO` removed: a flat group).
fn bench(args: &[&str], algo_env: Option<&str>) -> Output {
    bench_env(args, algo_env, &[])
}

/// As [`bench`], with extra environment variables.
fn bench_env(args: &[&str], algo_env: Option<&str>, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferrocoll"));
    cmd.arg("bench")
        .args(["--iters", "2", "--warmup", "1"])
        .args(args)
        .env_remove("FERROCOLL_ALGO")
        .env_remove("FERROCOLL_TOPO")
        .env_remove("FERROCOLL_PROFILE")
        // These tests pin `auto` to the size rule so their expectations do
        // not depend on the cost model's profile (tested separately below).
        .env("FERROCOLL_AUTO", "rule")
        .envs(env.iter().copied())
        // A hang (a library bug) fails the test in seconds, not minutes.
        .env("FERROCOLL_TIMEOUT", "30");
    if let Some(spec) = algo_env {
        cmd.env("FERROCOLL_ALGO", spec);
    }
    cmd.output().expect("running the ferrocoll binary")
}

/// The JSON objects of a successful `--json` run, one per stdout line.
fn json_rows(args: &[&str], algo_env: Option<&str>) -> Vec<serde_json::Map<String, Value>> {
    json_rows_env(args, algo_env, &[])
}

/// As [`json_rows`], with extra environment variables.
fn json_rows_env(
    args: &[&str],
    algo_env: Option<&str>,
    env: &[(&str, &str)],
) -> Vec<serde_json::Map<String, Value>> {
    let out = bench_env(args, algo_env, env);
    let stdout = String::from_utf8(out.stdout).expect("stdout is UTF-8");
    assert!(
        out.status.success(),
        "bench {args:?} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<_> = stdout
        .lines()
        .map(|line| match serde_json::from_str(line) {
            Ok(Value::Object(map)) => map,
            other => panic!("not a JSON object: {line:?} ({other:?})"),
        })
        .collect();
    assert!(!rows.is_empty(), "bench {args:?} printed no rows");
    rows
}

fn algos(rows: &[serde_json::Map<String, Value>]) -> BTreeSet<String> {
    rows.iter()
        .map(|r| r["algo"].as_str().expect("algo is a string").to_string())
        .collect()
}

#[test]
fn every_collective_checks_clean_with_exact_fields() {
    let want: BTreeSet<&str> = FIELDS.into_iter().collect();
    for coll in COLLECTIVES {
        let args = [coll, "--json", "-n", "3", "-b", "8", "-e", "64K", "--check"];
        let rows = json_rows(&args, None);
        let block = !matches!(coll, "allreduce" | "bcast" | "reduce");
        let mut avg_blocks = alltoallv_blocks(3, 4, 8, 64 * 1024).into_iter();
        let reduces = matches!(coll, "allreduce" | "reduce" | "reducescatter");
        for row in &rows {
            let got: BTreeSet<&str> = row.keys().map(String::as_str).collect();
            assert_eq!(got, want, "{coll}: fields of {row:?}");
            assert_eq!(row["wrong"], 0, "{coll}: {row:?}");
            assert_eq!(row["coll"], coll);
            assert_eq!(row["ranks"], 3);
            assert_eq!(row["dtype"], "f32");
            assert_eq!(row["transport"], "thread");
            assert_eq!(row["op"], if reduces { "sum" } else { "none" });
            let (bytes, count) = (
                row["bytes"].as_u64().unwrap(),
                row["count"].as_u64().unwrap(),
            );
            assert!(count > 0);
            // count = bytes / element size, as nccl-tests prints it; block
            // collectives move whole per-rank blocks.
            assert_eq!(bytes, count * 4, "{coll}: {row:?}");
            if coll == "alltoallv" {
                // Uneven blocks: the average send buffer, from the documented
                // count formula.
                let b = avg_blocks.next().expect("no more sizes than swept");
                assert_eq!(count, alltoallv_mean(3, b), "{coll}: {row:?}");
            } else if block {
                assert_eq!(count % 3, 0, "{coll}: {row:?}");
            }
            assert!(bytes <= 64 * 1024);
            for field in ["time_us", "algbw", "busbw"] {
                let v = row[field].as_f64().unwrap();
                assert!(v.is_finite() && v >= 0.0, "{coll}: {field} = {v}");
            }
        }
        // Sizes grow by the default factor of 4, from the first one that
        // holds at least one element per rank, and end at 64 KiB (which
        // the steps from 8 B miss: 32 KiB, then 128 KiB).
        assert_eq!(rows.len(), if block { 7 } else { 8 }, "{coll}: {rows:?}");
        let last = rows.last().unwrap()["bytes"].as_u64().unwrap();
        assert!(last > 32 * 1024, "{coll}: {rows:?}");
    }
}

/// Elements rank `s` sends rank `d` in `bench alltoallv` for average block
/// `b` (the formula `bench --help` documents, written out again).
fn alltoallv_count(s: usize, d: usize, b: usize) -> usize {
    b * (1 + (s + 2 * d) % 7) / 4
}

/// All ranks' alltoallv send counts together, divided by `n`.
fn alltoallv_mean(n: usize, b: usize) -> u64 {
    let total: usize = (0..n)
        .flat_map(|s| (0..n).map(move |d| alltoallv_count(s, d, b)))
        .sum();
    (total / n) as u64
}

/// The average blocks of an alltoallv sweep from `min` to `max` bytes by 4,
/// ending at `max` itself when the steps miss it (n ranks, `elem`-byte
/// elements), skipping those that send nothing.
fn alltoallv_blocks(n: usize, elem: usize, min: usize, max: usize) -> Vec<usize> {
    let mut sizes = Vec::new();
    let mut bytes = min;
    while bytes <= max {
        sizes.push(bytes);
        bytes *= 4;
    }
    if sizes.last() != Some(&max) {
        sizes.push(max);
    }
    let mut blocks: Vec<usize> = Vec::new();
    for bytes in sizes {
        let b = bytes / (n * elem);
        if alltoallv_mean(n, b) > 0 && blocks.last() != Some(&b) {
            blocks.push(b);
        }
    }
    blocks
}

#[test]
fn alltoallv_algorithms_are_named_and_check_clean() {
    let base = [
        "alltoallv",
        "--json",
        "--check",
        "-n",
        "4",
        "-b",
        "8",
        "-e",
        "64K",
    ];
    // Some blocks are empty at the smallest sizes (average block < 4).
    assert_eq!(alltoallv_count(0, 0, 2), 0);
    let with = |extra: &[&'static str]| -> Vec<&str> {
        base.iter().copied().chain(extra.iter().copied()).collect()
    };
    let check = |rows: &[serde_json::Map<String, Value>], want: &str| {
        assert_eq!(algos(rows), BTreeSet::from([want.to_string()]), "{rows:?}");
        assert!(rows.iter().all(|r| r["wrong"] == 0), "{rows:?}");
    };
    // auto: the direct exchange.
    check(&json_rows(&base, None), "direct");
    for name in ["hier", "pairwise", "direct"] {
        check(&json_rows(&with(&["--algo", name]), None), name);
    }
    // FERROCOLL_ALGO under auto, and --algo over it.
    check(&json_rows(&base, Some("alltoallv:pairwise")), "pairwise");
    check(
        &json_rows(&with(&["--algo", "hier"]), Some("alltoallv:pairwise")),
        "hier",
    );
    // hier over a real two-level topology: 2 nodes of 2 ranks.
    check(
        &json_rows_env(&base, Some("alltoallv:hier"), &[("FERROCOLL_TOPO", "2x2")]),
        "hier",
    );
    // alltoall's bruck is not an alltoallv algorithm.
    let out = bench(&["alltoallv", "--algo", "bruck", "-e", "1K"], None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && out.stdout.is_empty(), "{stderr}");
    for want in ["bruck", "direct", "pairwise", "hier"] {
        assert!(stderr.contains(want), "{stderr}");
    }
}

#[test]
fn results_are_checked_by_default_and_no_check_skips_it() {
    // As nccl-tests: every size is checked unless asked not to.
    let rows = json_rows(&["--json", "-n", "2", "-e", "1K"], None);
    assert!(rows.iter().all(|r| r["wrong"] == 0), "{rows:?}");
    let rows = json_rows(&["--json", "-n", "2", "-e", "1K", "--no-check"], None);
    assert!(rows.iter().all(|r| r["wrong"].is_null()), "{rows:?}");
    // The last of --check and --no-check wins.
    let rows = json_rows(
        &["--json", "-n", "2", "-e", "1K", "--no-check", "--check"],
        None,
    );
    assert!(rows.iter().all(|r| r["wrong"] == 0), "{rows:?}");
    // The table says so too: a count, not N/A, and the verdict.
    let out = bench(&["-n", "2", "-e", "1K"], None);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("check on"), "{stdout}");
    assert!(stdout.contains("# Wrong elements    : 0 OK"), "{stdout}");
    assert!(!stdout.contains("N/A  "), "{stdout}");
}

#[test]
fn in_place_bcast_checks_clean_and_other_collectives_refuse_it() {
    // The form the peers time (MPI_Bcast, torch's broadcast): one buffer,
    // the root's input in it; the check poisons every rank's buffer but
    // the root's, so a broadcast that left a non-root's alone is counted.
    for n in ["1", "3"] {
        let rows = json_rows(
            &[
                "bcast",
                "--json",
                "-n",
                n,
                "--root",
                "0",
                "-b",
                "4",
                "-e",
                "1M",
                "-f",
                "32",
                "--in-place",
            ],
            None,
        );
        assert!(rows.len() >= 4, "{rows:?}");
        assert!(rows.iter().all(|r| r["wrong"] == 0), "{rows:?}");
    }
    let rows = json_rows(
        &[
            "bcast",
            "--json",
            "-n",
            "3",
            "--root",
            "2",
            "-e",
            "64K",
            "--in-place",
        ],
        None,
    );
    assert!(rows.iter().all(|r| r["wrong"] == 0), "{rows:?}");
    let out = bench(&["allreduce", "-n", "2", "--in-place"], None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && out.stdout.is_empty(), "{stderr}");
    assert!(stderr.contains("--in-place times bcast only"), "{stderr}");
}

#[test]
fn the_sweep_ends_at_the_largest_size_even_between_steps() {
    // From 32 MiB by 4 the next step (128 MiB) is past the default end
    // (64 MiB): the sweep ends at 64 MiB all the same, as the default
    // sweep from 8 B does (8 B by 4 reaches 32 MiB).
    let rows = json_rows(&["--json", "-n", "2", "-b", "32M"], None);
    let sizes: Vec<u64> = rows.iter().map(|r| r["bytes"].as_u64().unwrap()).collect();
    assert_eq!(sizes, [32 << 20, 64 << 20]);
    assert!(rows.iter().all(|r| r["wrong"] == 0), "{rows:?}");
}

#[test]
fn algo_field_follows_option_and_environment() {
    let small = ["--json", "-n", "3", "-b", "8", "-e", "4K"];
    let large = ["--json", "-n", "3", "-b", "1M", "-e", "1M"];
    // auto: trees for small messages, rings for large ones.
    assert_eq!(
        algos(&json_rows(&small, None)),
        BTreeSet::from(["tree".into()])
    );
    assert_eq!(
        algos(&json_rows(&large, None)),
        BTreeSet::from(["ring".into()])
    );
    // --algo forces it.
    let forced: Vec<&str> = small.iter().copied().chain(["--algo", "ring"]).collect();
    assert_eq!(
        algos(&json_rows(&forced, None)),
        BTreeSet::from(["ring".into()])
    );
    // FERROCOLL_ALGO forces it under auto...
    let env = Some("allreduce:tree");
    assert_eq!(
        algos(&json_rows(&large, env)),
        BTreeSet::from(["tree".into()])
    );
    // ...and --algo wins over it.
    assert_eq!(
        algos(&json_rows(&forced, env)),
        BTreeSet::from(["ring".into()])
    );
    // An entry for another collective leaves allreduce on auto.
    let other = Some("bcast:ring");
    assert_eq!(
        algos(&json_rows(&small, other)),
        BTreeSet::from(["tree".into()])
    );
}

#[test]
fn unknown_algorithm_fails_listing_valid_names() {
    for name in ["bruck", "linear"] {
        let out = bench(&["allreduce", "--algo", name, "-e", "1K"], None);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "--algo {name} was accepted");
        assert!(out.stdout.is_empty(), "--algo {name} printed results");
        for want in [name, "auto", "ring", "tree"] {
            assert!(stderr.contains(want), "--algo {name}: {stderr}");
        }
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    let out = bench(&["allreduce", "-e", "1K"], Some("allreduce:bruck"));
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("FERROCOLL_ALGO") && stderr.contains("bruck"),
        "{stderr}"
    );
}

#[test]
fn user_mistakes_are_errors_not_panics() {
    let cases: [&[&str]; 6] = [
        &["-b", "12Q"],
        &["-b", "1M", "-e", "1K"],
        &["gather", "-n", "3", "--root", "3"],
        &["--transport", "infiniband"],
        &["--dtype", "f128"],
        &["barrier"],
    ];
    for args in cases {
        let out = bench(args, None);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(out.stdout.is_empty(), "{args:?} printed results");
        assert!(
            !stderr.is_empty() && !stderr.contains("panicked"),
            "{args:?}: {stderr}"
        );
    }
    let out = bench(&["--transport", "infiniband"], None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("use thread, shm, tcp or auto"), "{stderr}");
}

#[test]
fn table_output_has_header_and_one_row_per_size() {
    let out = bench(
        &["bcast", "-n", "2", "-b", "1K", "-e", "16K", "--check"],
        None,
    );
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    let header = stdout.lines().next().unwrap();
    for want in ["bcast", "2 ranks", "thread", "f32", "op none"] {
        assert!(header.contains(want), "{header}");
    }
    let rows: Vec<&str> = stdout.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(rows.len(), 3, "{stdout}");
    // size count type redop root time algbw busbw #wrong algo predicted
    let cols: Vec<&str> = rows[0].split_whitespace().collect();
    assert_eq!(cols.len(), 11, "{}", rows[0]);
    assert_eq!(&cols[..5], ["1024", "256", "f32", "none", "0"]);
    assert_eq!(cols[8], "0");
    let predicted: f64 = cols[10].parse().expect("a predicted time in us");
    assert!(predicted > 0.0, "{}", rows[0]);
}

#[test]
fn auto_model_runs_what_the_model_predicts_cheapest() {
    // No calibrated profile: point HOME at an empty directory.
    let home = std::env::temp_dir().join(format!("ferrocoll-test-home-{}", std::process::id()));
    std::fs::create_dir_all(&home).unwrap();
    let home = home.to_str().unwrap();
    for bytes in ["64", "4M"] {
        let rows = json_rows_env(
            &["--json", "-n", "3", "-b", bytes, "-e", bytes],
            None,
            &[
                ("FERROCOLL_AUTO", "model"),
                ("HOME", home),
                ("XDG_CONFIG_HOME", ""),
            ],
        );
        let ran = rows[0]["algo"].as_str().unwrap().to_string();
        let b = rows[0]["bytes"].as_u64().unwrap().to_string();
        // The built-in thread profile, spelled out for `ferrocoll model`.
        let out = Command::new(env!("CARGO_BIN_EXE_ferrocoll"))
            .args([
                "model",
                "allreduce",
                "-n",
                "3",
                "--bytes",
                &b,
                "--alpha",
                "3.7us",
            ])
            .args([
                "--beta",
                "17GB/s",
                "--gamma",
                "0.02ns",
                "--overhead",
                "0.6us",
                "--copy",
                "0.017ns",
                "--cache",
                "32MiB",
                "--beta-mem",
                "8GB/s",
                "--receiver-copies",
                "--json",
            ])
            .output()
            .unwrap();
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["choice"].as_str().unwrap(), ran, "{bytes}: {report}");
    }
}

/// `bench overlap` on a small model of its own: the four ways, the
/// efficiency and the prediction come out as JSON, and a gradient the
/// bucketer got wrong would fail the command.
#[test]
fn overlap_reports_four_ways_and_a_prediction() {
    let dir = std::env::temp_dir().join(format!("ferrocoll-overlap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("model.txt");
    std::fs::write(
        &model,
        "# a small model\n1000 a\n0 empty\n300000 b\n7 c # bias\n",
    )
    .unwrap();
    for n in ["1", "3"] {
        let out = Command::new(env!("CARGO_BIN_EXE_ferrocoll"))
            .args(["bench", "overlap", "--model", model.to_str().unwrap()])
            .args([
                "--compute-ms",
                "5",
                "--steps",
                "1",
                "--cap",
                "64K",
                "--json",
                "-n",
                n,
            ])
            .env("FERROCOLL_TIMEOUT", "30")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!(v["parameters"], 301007);
        assert_eq!(v["ranks"].as_u64().unwrap().to_string(), n);
        assert_eq!(v["cap_bytes"], 65536);
        for way in ["compute", "comm", "sequential", "overlapped"] {
            assert!(v["measured"][way].as_f64().unwrap() > 0.0, "{way}: {text}");
            assert!(
                v["predicted"][way].as_f64().unwrap() >= 0.0,
                "{way}: {text}"
            );
        }
        // The prediction starts from the measured computation.
        assert_eq!(v["predicted"]["compute"], v["measured"]["compute"]);
        // What the model says before any step: in-process ranks are on
        // one host, where the transfer is the CPUs' copy, so with no core
        // spare none of it can hide.
        assert_eq!(v["single_host"], true, "{text}");
        if v["cpu_contended"] == true {
            assert_eq!(v["model_hideable_fraction"], 0.0, "{text}");
        }
        assert!(v["measured_comm_cpu"].as_f64().unwrap() >= 0.0, "{text}");
        // The computation's CPU time is counted (getrusage), every way's.
        assert!(v["cpu"]["compute"].as_f64().unwrap() > 0.0, "{text}");
        assert!(v["compute_cpu_share"].as_f64().unwrap() > 0.0, "{text}");
    }
    // --trace: a line per step of every way, the four ways each round.
    let out = Command::new(env!("CARGO_BIN_EXE_ferrocoll"))
        .args(["bench", "overlap", "--model", model.to_str().unwrap()])
        .args([
            "--compute-ms",
            "2",
            "--steps",
            "2",
            "--cap",
            "64K",
            "--trace",
        ])
        .args(["-n", "2"])
        .env("FERROCOLL_TIMEOUT", "30")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    for way in ["compute", "comm", "seq", "overlap"] {
        let lines = err
            .lines()
            .filter(|l| l.contains(&format!(" {way} ")))
            .count();
        assert_eq!(lines, 2, "{way}: {err}");
    }
    assert!(String::from_utf8_lossy(&out.stdout).contains("# model (calibrated profile"));
    let out = Command::new(env!("CARGO_BIN_EXE_ferrocoll"))
        .args(["bench", "overlap", "--model", "/nonexistent/model.txt"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn calibrate_keeps_the_cores_in_the_profile() {
    let dir = std::env::temp_dir().join(format!("ferrocoll-test-cores-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out_path = dir.join("thread.json");
    let calibrate = |cores: &str| {
        Command::new(env!("CARGO_BIN_EXE_ferrocoll"))
            .args(["calibrate", "-n", "2", "-e", "512", "--repeat", "1"])
            .arg(format!("--cores={cores}"))
            .arg("--out")
            .arg(&out_path)
            .output()
            .unwrap()
    };
    let out = calibrate("3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let file: Value = serde_json::from_str(&std::fs::read_to_string(&out_path).unwrap()).unwrap();
    assert_eq!(file["profile"]["cores"].as_f64(), Some(3.0), "{file}");
    let bad = calibrate("-1");
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("--cores"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
