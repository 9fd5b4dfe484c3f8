//! `ferrocoll model allreduce --compress CODEC`: the compressed
//! allreduce's closed form beside the uncompressed algorithms', where it
//! pays (a slow link between hosts) and where it does not (memory speed).

use std::process::{Command, Output};

use serde_json::Value;

fn model(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferrocoll"))
        .arg("model")
        .args(args)
        .output()
        .unwrap()
}

fn json(args: &[&str]) -> Value {
    let out = model(&[args, &["--json"]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// 2 hosts of 2 ranks, shared memory within, 1 Gbit/s between (one NIC
/// per host).
const CLUSTER: [&str; 12] = [
    "allreduce",
    "-n",
    "4",
    "--topo",
    "2x2",
    "-b",
    "64MiB",
    "--beta",
    "5GB/s",
    "--beta-inter",
    "125MB/s",
    "--inter-ports",
];

#[test]
fn compression_pays_between_hosts_on_a_slow_link() {
    let report = json(&[&CLUSTER[..], &["1", "--compress", "int8"]].concat());
    let c = &report["compressed"];
    assert_eq!(c["algo"], "hier-two-phase");
    // Each rank's half of its host's sum, 2 (H-1)/H of its encoding.
    assert_eq!(c["wire_bytes"], 8_388_608 + 4 * 65_536);
    assert_eq!(c["local_bytes"], 67_108_864);
    assert!(c["speedup"].as_f64().unwrap() > 2.0, "{c}");
    assert!(c["codec_us"].as_f64().unwrap() > 0.0);
    let pays = c["pays_from_bytes"].as_u64().unwrap();
    assert!(pays < 64 << 20, "{c}");
    // The terms add up.
    let sum: f64 = ["latency_us", "bandwidth_us", "compute_us", "codec_us"]
        .iter()
        .map(|k| c[k].as_f64().unwrap())
        .sum();
    assert!((sum - c["time_us"].as_f64().unwrap()).abs() < 1e-6 * sum);
}

#[test]
fn compression_does_not_pay_at_memory_speed() {
    let report = json(&[
        "allreduce",
        "-n",
        "4",
        "-b",
        "64MiB",
        "--beta",
        "10GB/s",
        "--compress",
        "int8",
    ]);
    let c = &report["compressed"];
    assert_eq!(c["algo"], "two-phase");
    assert!(c["speedup"].as_f64().unwrap() < 1.0, "{c}");
    assert!(c["pays_from_bytes"].is_null(), "{c}");
    // A slower codec rate makes it worse still.
    let slower = json(&[
        "allreduce",
        "-n",
        "4",
        "-b",
        "64MiB",
        "--beta",
        "10GB/s",
        "--compress",
        "int8",
        "--codec-rate",
        "1GB/s",
    ]);
    assert!(slower["compressed"]["codec_us"].as_f64().unwrap() > c["codec_us"].as_f64().unwrap());
}

#[test]
fn the_table_says_whether_it_pays_and_plain_reports_are_unchanged() {
    let out = model(&[&CLUSTER[..], &["1", "--compress", "topk:0.01"]].concat());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("compressed with topk:0.01 (hier-allgather)"),
        "{text}"
    );
    assert!(
        text.contains("(pays)") && text.contains("compression pays from"),
        "{text}"
    );
    let plain = json(&CLUSTER[..11]);
    assert!(plain.get("compressed").is_none(), "{plain}");
    for (args, says) in [
        (&["allgather", "--compress", "int8"][..], "allreduce of f32"),
        (
            &["allreduce", "--dtype", "f64", "--compress", "int8"][..],
            "allreduce of f32",
        ),
        (&["allreduce", "--compress", "zip"][..], "unknown codec"),
    ] {
        let out = model(args);
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
}
