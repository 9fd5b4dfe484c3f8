//! `ferrocoll model`: the JSON report's shape, and that its choice is the
//! cheapest candidate.

use std::process::Command;

use serde_json::Value;

fn model(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ferrocoll"))
        .arg("model")
        .args(args)
        .output()
        .expect("runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn json_report_lists_every_candidate_cheapest_first() {
    let (ok, stdout, stderr) = model(&[
        "allreduce",
        "-n",
        "32",
        "--bytes",
        "1MiB",
        "--topo",
        "4x8",
        "--alpha",
        "2us",
        "--beta",
        "50GB/s",
        "--alpha-inter",
        "10us",
        "--beta-inter",
        "5GB/s",
        "--json",
    ]);
    assert!(ok, "{stderr}");
    let v: Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    for key in [
        "coll",
        "ranks",
        "bytes",
        "choice",
        "candidates",
        "crossovers",
    ] {
        assert!(v.get(key).is_some(), "missing {key}: {v}");
    }
    assert_eq!(v["ranks"], 32);
    assert_eq!(v["bytes"], 1 << 20);
    let cands = v["candidates"].as_array().unwrap();
    assert_eq!(
        cands.len(),
        ferrocoll::Collective::AllReduce.algorithms().len()
    );
    let times: Vec<f64> = cands
        .iter()
        .map(|c| c["time_us"].as_f64().unwrap())
        .collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    assert_eq!(v["choice"], cands[0]["algo"]);
    for c in cands {
        let parts: f64 = ["latency_us", "bandwidth_us", "compute_us"]
            .iter()
            .map(|k| c[*k].as_f64().unwrap())
            .sum();
        assert!((parts - c["time_us"].as_f64().unwrap()).abs() < 1e-6 * parts.max(1.0));
    }
}

#[test]
fn latency_bound_sizes_prefer_few_rounds() {
    // 8 bytes on 64 ranks with a large alpha: the ring's 2(N-1) rounds lose.
    let (ok, stdout, stderr) = model(&[
        "allreduce",
        "-n",
        "64",
        "--bytes",
        "8",
        "--alpha",
        "50us",
        "--json",
    ]);
    assert!(ok, "{stderr}");
    let v: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_ne!(v["choice"], "ring");
    let ring = v["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["algo"] == "ring")
        .unwrap()
        .clone();
    // 2(N-1) rounds of 50 us.
    assert!((ring["latency_us"].as_f64().unwrap() - 2.0 * 63.0 * 50.0).abs() < 1e-6);
}

#[test]
fn bad_units_are_errors() {
    for args in [
        &["allreduce", "--bytes", "3 parsecs"][..],
        &["allreduce", "--alpha", "10"],
        &["alltoallv"],
    ] {
        let (ok, _, stderr) = model(args);
        assert!(!ok, "{args:?} accepted");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}
