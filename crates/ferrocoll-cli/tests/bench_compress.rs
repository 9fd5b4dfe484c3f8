//! End-to-end tests of `ferrocoll bench allreduce --compress CODEC`: the
//! built binary, its JSON rows (wire bytes from the formula and from the
//! communicator's counter, effective bandwidth on the uncompressed size),
//! its table, and the arguments it refuses.

use std::process::{Command, Output};

use serde_json::Value;

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferrocoll"))
        .arg("bench")
        .args(["--iters", "2", "--warmup", "1"])
        .args(args)
        .env_remove("FERROCOLL_ALGO")
        .env_remove("FERROCOLL_TOPO")
        .env("FERROCOLL_TIMEOUT", "30")
        .output()
        .unwrap()
}

fn rows(args: &[&str]) -> Vec<serde_json::Map<String, Value>> {
    let out = bench(&[args, &["--json"]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l)
                .unwrap()
                .as_object()
                .unwrap()
                .clone()
        })
        .collect()
}

#[test]
fn every_codec_reports_its_wire_bytes_and_effective_bandwidth() {
    // 3 ranks of 64 Ki f32 (256 KiB).
    let (n, bytes) = (3.0, 262_144.0);
    for (codec, algo, least) in [
        ("fp16", "two-phase", 1.9),
        ("int8:128", "two-phase", 3.8),
        ("onebit", "two-phase", 20.0),
        ("topk:0.01", "allgather", 30.0),
        ("randk:0.01:3", "allreduce-values", 90.0),
        ("powersgd:4", "powersgd", 30.0),
    ] {
        let rows = rows(&[
            "allreduce",
            "-n",
            "3",
            "-b",
            "256K",
            "-e",
            "256K",
            "--compress",
            codec,
        ]);
        assert_eq!(rows.len(), 1, "{codec}");
        let row = &rows[0];
        let num = |k: &str| row[k].as_f64().unwrap_or_else(|| panic!("{codec}: {k}"));
        assert_eq!(row["algo"], algo, "{codec}");
        assert_eq!(num("bytes"), bytes);
        // Effective bandwidth: on the uncompressed size.
        let algbw = bytes / (num("time_us") * 1e-6) / 1e9;
        assert!(
            (num("algbw") - algbw).abs() < 1e-6 * algbw.max(1.0),
            "{codec}"
        );
        assert!(
            (num("busbw") - algbw * 2.0 * (n - 1.0) / n).abs() < 1e-6,
            "{codec}"
        );
        // A ring's 2(n-1)/n of the buffer over the formula's bytes.
        let ring = 2.0 * (n - 1.0) / n * bytes;
        assert!(
            (num("less") - ring / num("wire_bytes")).abs() < 1e-6,
            "{codec}"
        );
        assert!(num("less") >= least, "{codec}: {row:?}");
        assert!(num("counted_bytes") > 0.0, "{codec}");
        // The check is on by default: one fresh call against the exact sum.
        assert!(num("relerr").is_finite(), "{codec}");
        if codec == "fp16" {
            // Small integers survive fp16 exactly.
            assert_eq!(num("relerr"), 0.0);
        }
    }
}

#[test]
fn the_table_has_its_own_header_and_no_wrong_count() {
    let out = bench(&[
        "allreduce",
        "-n",
        "2",
        "-b",
        "1M",
        "-e",
        "1M",
        "--compress",
        "int8",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("compressed with int8"), "{text}");
    assert!(
        text.contains("wire(B)") && text.contains("counted(B)"),
        "{text}"
    );
    assert!(!text.contains("Wrong elements"), "{text}");
    let row = text.lines().find(|l| !l.starts_with('#')).unwrap();
    assert!(
        row.contains("int8:128") && row.ends_with("two-phase"),
        "{text}"
    );
}

#[test]
fn what_cannot_be_compressed_is_refused() {
    for (args, says) in [
        (&["allgather", "--compress", "int8"][..], "only allreduce"),
        (
            &["allreduce", "--dtype", "f64", "--compress", "int8"][..],
            "f32",
        ),
        (
            &["allreduce", "--op", "max", "--compress", "int8"][..],
            "sum or avg",
        ),
        (
            &["allreduce", "--algo", "ring", "--compress", "int8"][..],
            "--algo ring",
        ),
        (&["allreduce", "--compress", "zip"][..], "unknown codec"),
        (
            &[
                "allreduce",
                "-b",
                "1M",
                "-e",
                "1M",
                "--compress",
                "powersgd:4:100x100",
            ][..],
            "100 x 100",
        ),
    ] {
        let out = bench(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}
