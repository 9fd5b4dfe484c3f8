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

/// The `overlap` object of candidate `algo` in a report.
fn overlap_of(report: &Value, algo: &str) -> Value {
    report["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["algo"] == algo)
        .unwrap_or_else(|| panic!("no {algo} in {report}"))["overlap"]
        .clone()
}

#[test]
fn loggp_overlap_fields_are_reported_for_every_candidate() {
    let (ok, stdout, stderr) = model(&[
        "allgather",
        "-n",
        "8",
        "--bytes",
        "64KiB",
        "--overhead",
        "1us",
        "--json",
    ]);
    assert!(ok, "{stderr}");
    let v: Value = serde_json::from_str(stdout.trim()).unwrap();
    for c in v["candidates"].as_array().unwrap() {
        let o = &c["overlap"];
        for key in [
            "L_us",
            "o_us",
            "g_us",
            "G_s_per_byte",
            "cpu_us",
            "hideable_us",
            "hideable_fraction",
        ] {
            assert!(o[key].as_f64().is_some(), "{key} missing in {c}");
        }
        // The mapping: g = overhead, o = g/2, L = alpha - 2o, G = 1/beta
        // (defaults: alpha 10 us, beta 10 GB/s).
        assert!((o["g_us"].as_f64().unwrap() - 1.0).abs() < 1e-9, "{o}");
        assert!((o["o_us"].as_f64().unwrap() - 0.5).abs() < 1e-9, "{o}");
        assert!((o["L_us"].as_f64().unwrap() - 9.0).abs() < 1e-9, "{o}");
        assert!(
            (o["G_s_per_byte"].as_f64().unwrap() - 1e-10).abs() < 1e-22,
            "{o}"
        );
        let (cpu, hide, f) = (
            o["cpu_us"].as_f64().unwrap(),
            o["hideable_us"].as_f64().unwrap(),
            o["hideable_fraction"].as_f64().unwrap(),
        );
        let t = c["time_us"].as_f64().unwrap();
        assert!((cpu + hide - t).abs() < 1e-9 * t, "{c}");
        assert!((0.0..=1.0).contains(&f), "{c}");
        assert!((f - hide / t).abs() < 1e-12, "{c}");
    }
}

#[test]
fn ring_allreduce_hides_more_as_messages_grow() {
    // Without a reduction cost the CPU part is o per message, fixed, while
    // the wire's part grows with the size: the fraction rises towards 1.
    let mut last = -1.0;
    for bytes in ["8", "4KiB", "256KiB", "16MiB", "1GiB"] {
        let (ok, stdout, stderr) = model(&[
            "allreduce",
            "-n",
            "4",
            "--bytes",
            bytes,
            "--alpha",
            "4us",
            "--overhead",
            "1us",
            "--gamma",
            "0ns",
            "--json",
        ]);
        assert!(ok, "{stderr}");
        let v: Value = serde_json::from_str(stdout.trim()).unwrap();
        let f = overlap_of(&v, "ring")["hideable_fraction"]
            .as_f64()
            .unwrap();
        assert!((0.0..=1.0).contains(&f), "{bytes}: {f}");
        assert!(f > last, "{bytes}: {f} after {last}");
        last = f;
    }
    // 8 B: 6 rounds of alpha, the CPU busy 4 messages a round x o: 1 - 2o/alpha.
    assert!(last > 0.99, "{last}");
}

#[test]
fn ring_allreduce_cpu_part_for_two_ranks_by_hand() {
    // 2 ranks, 1 MiB of f32: each rank sends and receives one message in
    // each of the 2 rounds (4 messages x o = 0.5 us = 2 us) and reduces the
    // half it owns (524288 B x 0.1 ns/B = 52.4288 us): cpu 54.4288 us. The
    // total is 2 alpha + 2 x 524288 B / 10 GB/s + 52.4288 us = 165.2864 us,
    // so 110.8576 us hide: 2 L (3 us each) + the 104.8576 us on the wire.
    let (ok, stdout, stderr) = model(&[
        "allreduce",
        "-n",
        "2",
        "--bytes",
        "1MiB",
        "--alpha",
        "4us",
        "--beta",
        "10GB/s",
        "--overhead",
        "1us",
        "--gamma",
        "0.1ns",
        "--json",
    ]);
    assert!(ok, "{stderr}");
    let v: Value = serde_json::from_str(stdout.trim()).unwrap();
    let o = overlap_of(&v, "ring");
    let close = |k: &str, want: f64| {
        let got = o[k].as_f64().unwrap();
        assert!((got - want).abs() < 1e-6, "{k}: {got} != {want} in {o}");
    };
    close("L_us", 3.0);
    close("o_us", 0.5);
    close("cpu_us", 54.4288);
    close("hideable_us", 110.8576);
    close("hideable_fraction", 110.8576 / 165.2864);
    // Butterfly exchanges and reduces the whole buffer once: 2 messages,
    // 1 MiB reduced: cpu 1 us + 104.8576 us.
    let b = overlap_of(&v, "butterfly");
    assert!(
        (b["cpu_us"].as_f64().unwrap() - 105.8576).abs() < 1e-6,
        "{b}"
    );
}
