//! `ferrocoll tune`: the table it writes, and `auto` reading it back in a
//! later run (threads and processes), or ignoring it with a warning when it
//! was measured on another launch.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ferrocoll::tune::TuneFile;

/// A scratch directory of this test, removed first.
fn scratch(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("ferrocoll-tune-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `ferrocoll ARGS` with no profile, algorithm or topology from the
/// environment, and `XDG_CONFIG_HOME` at `config`.
fn ferrocoll(config: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferrocoll"))
        .args(args)
        .env_remove("FERROCOLL_ALGO")
        .env_remove("FERROCOLL_TOPO")
        .env_remove("FERROCOLL_PROFILE")
        .env_remove("FERROCOLL_TUNE")
        .env_remove("FERROCOLL_AUTO")
        .env("XDG_CONFIG_HOME", config)
        .env("FERROCOLL_TIMEOUT", "60")
        .envs(env.iter().copied())
        .output()
        .expect("running the ferrocoll binary")
}

fn ok(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "failed: {stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A quick table of allreduce and allgather from 64 B to 4 KiB.
const TUNE: [&str; 10] = [
    "tune",
    "--quick",
    "-b",
    "64",
    "-e",
    "4K",
    "-f",
    "4",
    "--colls",
    "allreduce,allgather",
];

#[test]
fn tune_writes_a_table_that_auto_then_uses_on_threads() {
    let config = scratch("thread");
    let mut args = TUNE.to_vec();
    args.extend(["-n", "3"]);
    let stdout = ok(&ferrocoll(&config, &args, &[]));
    assert!(stdout.contains("wins"), "{stdout}");
    let path = config.join("ferrocoll").join("thread.tune.json");
    let file = TuneFile::load(&path).unwrap();
    assert_eq!(file.tables.len(), 1);
    let table = &file.tables[0];
    assert_eq!(
        (table.key.transport.as_str(), table.key.ranks),
        ("thread", 3)
    );
    for coll in ["allreduce", "allgather"] {
        let points: Vec<_> = table.points.iter().filter(|p| p.coll == coll).collect();
        assert!(points.len() >= 3, "{coll}: {points:?}");
        for p in points {
            assert!(p.times.len() >= 2, "{p:?}");
            for m in &p.times {
                assert!(m.p10_us <= m.median_us && m.median_us <= m.p90_us, "{m:?}");
                assert_eq!(m.samples, 3);
            }
            // Fastest first.
            assert!(p.times.windows(2).all(|w| w[0].median_us <= w[1].median_us));
        }
    }
    // Tuning another group size keeps this table beside the new one.
    let mut two = TUNE.to_vec();
    two.extend(["-n", "2", "--colls", "allreduce"]);
    ok(&ferrocoll(&config, &two, &[]));
    assert_eq!(TuneFile::load(&path).unwrap().tables.len(), 2);

    // A later run decides by the table where it covers the size (1 KiB
    // was measured), by the model outside it (64 KiB).
    let bench = |env: &[(&str, &str)]| {
        let out = ferrocoll(
            &config,
            &[
                "bench",
                "allreduce",
                "-n",
                "3",
                "-b",
                "1K",
                "-e",
                "64K",
                "-f",
                "64",
                "--iters",
                "1",
                "--warmup",
                "0",
            ],
            env,
        );
        ok(&out);
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let stderr = bench(&[("FERROCOLL_DEBUG", "tune")]);
    assert!(
        stderr.contains("1024 B on 3 ranks -> ")
            && stderr.contains("(auto: fastest measured (tuned table))"),
        "{stderr}"
    );
    assert!(stderr.contains("decided by the tuned table"), "{stderr}");
    assert!(
        stderr.contains("65536 B on 3 ranks") && stderr.contains("the tuned table does not cover"),
        "{stderr}"
    );
    // FERROCOLL_TUNE=off: the model everywhere.
    let stderr = bench(&[("FERROCOLL_DEBUG", "1"), ("FERROCOLL_TUNE", "off")]);
    assert!(!stderr.contains("tuned table"), "{stderr}");
    assert!(stderr.contains("cost model"), "{stderr}");
    let _ = std::fs::remove_dir_all(&config);
}

#[test]
fn a_table_of_another_version_or_size_is_ignored_with_one_warning() {
    let config = scratch("stale");
    let mut args = TUNE.to_vec();
    args.extend(["-n", "2", "--colls", "allreduce"]);
    ok(&ferrocoll(&config, &args, &[]));
    let path = config.join("ferrocoll").join("thread.tune.json");
    let mut file = TuneFile::load(&path).unwrap();
    file.tables[0].key.version = "0.0.0-older".into();
    let stale = config.join("stale.tune.json");
    std::fs::write(&stale, serde_json::to_string(&file).unwrap()).unwrap();
    let bench = |n: &str, table: &Path| {
        let out = ferrocoll(
            &config,
            &[
                "bench",
                "allreduce",
                "-n",
                n,
                "-b",
                "1K",
                "-e",
                "4K",
                "-f",
                "4",
                "--iters",
                "1",
                "--warmup",
                "0",
            ],
            &[
                ("FERROCOLL_DEBUG", "1"),
                ("FERROCOLL_TUNE", table.to_str().unwrap()),
            ],
        );
        ok(&out);
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let stderr = bench("2", &stale);
    assert_eq!(
        stderr.matches("warning: ignoring the tuned tables").count(),
        1,
        "{stderr}"
    );
    assert!(stderr.contains("0.0.0-older"), "{stderr}");
    assert!(!stderr.contains("(tuned table)"), "{stderr}");
    // The fresh table, on a group size it was not measured on.
    let stderr = bench("4", &path);
    assert!(
        stderr.contains("measured on 2 ranks, this launch has 4"),
        "{stderr}"
    );
    assert!(!stderr.contains("(tuned table)"), "{stderr}");
    let _ = std::fs::remove_dir_all(&config);
}

#[test]
fn processes_share_rank_0s_table() {
    let config = scratch("shm");
    let mut args = TUNE.to_vec();
    // Small calls over shared memory take the fast path, which no
    // algorithm choice precedes (all-to-all too, since it has one): the
    // bench below turns it off, so that its 256 B call is chosen by the
    // table.
    args.extend(["-n", "2", "--transport", "shm", "--colls", "alltoall"]);
    ok(&ferrocoll(&config, &args, &[]));
    let path = config.join("ferrocoll").join("shm.tune.json");
    let file = TuneFile::load(&path).unwrap();
    assert_eq!(file.tables[0].key.transport, "shm");
    let out = ferrocoll(
        &config,
        &[
            "bench",
            "alltoall",
            "-n",
            "2",
            "--transport",
            "shm",
            "-b",
            "256",
            "-e",
            "256",
            "--iters",
            "1",
            "--warmup",
            "0",
        ],
        &[("FERROCOLL_DEBUG", "1"), ("FERROCOLL_SHM_FAST", "off")],
    );
    ok(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("(auto: fastest measured (tuned table))"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&config);
}

#[test]
fn with_auto_times_auto_beside_the_candidates_and_keeps_it_out_of_the_table() {
    let config = scratch("with-auto");
    let first = config.join("first.json");
    let mut args = TUNE.to_vec();
    args.extend(["-n", "3", "--out", first.to_str().unwrap()]);
    ok(&ferrocoll(&config, &args, &[]));
    let table = TuneFile::load(&first).unwrap();

    // A fresh run with auto reading the first table: auto's lines name
    // what it ran, which at every measured size is the table's fastest.
    let second = config.join("second.json");
    let mut again = TUNE.to_vec();
    again.extend([
        "-n",
        "3",
        "--with-auto",
        "--json",
        "--out",
        second.to_str().unwrap(),
    ]);
    let stdout = ok(&ferrocoll(
        &config,
        &again,
        &[("FERROCOLL_TUNE", first.to_str().unwrap())],
    ));
    let autos: Vec<serde_json::Value> = stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|v: &serde_json::Value| v["algo"] == "auto")
        .collect();
    let points = &table.tables[0].points;
    assert_eq!(autos.len(), points.len(), "{stdout}");
    for a in &autos {
        let p = points
            .iter()
            .find(|p| p.coll == a["coll"] && serde_json::json!(p.bytes) == a["bytes"])
            .unwrap_or_else(|| panic!("no point for {a}"));
        assert_eq!(a["ran"], p.times[0].algo.as_str(), "{a} against {p:?}");
        assert!(a["median_us"].as_f64().unwrap() > 0.0, "{a}");
        assert_eq!(a["samples"], 3, "{a}");
    }
    assert!(stdout.contains("x the fastest candidate"), "{stdout}");
    // The table of the second run holds algorithms only.
    let written = TuneFile::load(&second).unwrap();
    for p in &written.tables[0].points {
        assert!(p.times.iter().all(|m| m.algo != "auto"), "{p:?}");
        assert!(!p.times.is_empty());
    }
}
