//! `ferrocoll sim` end to end: JSON fields, the seeds' two-level example
//! (a flat ring bounded by the inter-node links, hierarchical far ahead),
//! the fat-tree oversubscription effect, and errors.

use std::process::Command;

fn sim(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ferrocoll"))
        .arg("sim")
        .args(args)
        .output()
        .unwrap()
}

fn json(args: &[&str]) -> serde_json::Value {
    let mut all = args.to_vec();
    all.push("--json");
    let out = sim(&all);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

const TWO_LEVEL: &str = "two-level:nodes=4,gpus=8,intra=450GB/s@1us,inter=25GB/s@2us";

#[test]
fn json_has_the_fields_and_the_seeds_two_level_effect_shows() {
    let ring = json(&[
        "allreduce",
        "--topology",
        TWO_LEVEL,
        "--bytes",
        "256MiB",
        "--algo",
        "ring",
    ]);
    for field in [
        "coll",
        "ranks",
        "bytes",
        "algo",
        "mode",
        "time_us",
        "algbw",
        "busbw",
        "energy_j",
        "wall_s",
        "links",
        "critical_path",
    ] {
        assert!(ring.get(field).is_some(), "missing {field}: {ring}");
    }
    assert_eq!(ring["ranks"], 32);
    // A flat ring's time is its 2(n-1) = 62 steps: transmission, latency.
    let cp = &ring["critical_path"];
    assert_eq!(cp["messages"], 62);
    let parts: f64 = [
        "start_us",
        "latency_us",
        "transmission_us",
        "queueing_us",
        "compute_us",
    ]
    .iter()
    .map(|k| cp[k].as_f64().unwrap())
    .sum();
    let time = ring["time_us"].as_f64().unwrap();
    assert!((parts - time).abs() < 1e-6 * time, "{cp} vs {time}");
    // A flat ring crosses the 25 GB/s NICs every step: its busbw is that.
    let busbw = ring["busbw"].as_f64().unwrap();
    assert!((busbw - 25.0).abs() < 1.0, "flat ring busbw {busbw}");
    // The cost model's choice (hierarchical) keeps most bytes on NVLink.
    let auto = json(&["allreduce", "--topology", TWO_LEVEL, "--bytes", "256MiB"]);
    assert_eq!(auto["algo"], "hier");
    assert!(auto["time_us"].as_f64().unwrap() * 3.0 < ring["time_us"].as_f64().unwrap());
}

#[test]
fn the_seeds_hierarchical_bandwidth_multiplication() {
    // Napkin Math 1.6 of the seeds: 8 nodes of 8 GPUs, NVLink 450 GB/s,
    // InfiniBand 50 GB/s, a 1 GB allreduce: a flat ring takes ~40 ms
    // (2 x 1 GB / 50 GB/s), the hierarchical one ~8.3 ms (1.94 + 4.42 +
    // 1.94), a 4.8x speed-up.
    let topo = "two-level:nodes=8,gpus=8,intra=450GB/s@1us,inter=50GB/s@2us";
    let time = |algo: &str| {
        json(&[
            "allreduce",
            "--topology",
            topo,
            "--bytes",
            "1GB",
            "--algo",
            algo,
        ])["time_us"]
            .as_f64()
            .unwrap()
            / 1000.0
    };
    let (ring, hier) = (time("ring"), time("hier"));
    assert!((ring - 40.0).abs() < 1.0, "flat ring {ring} ms");
    assert!((hier - 8.3).abs() < 0.3, "hierarchical {hier} ms");
    assert!((ring / hier - 4.8).abs() < 0.2, "speed-up {}", ring / hier);
}

#[test]
fn an_oversubscribed_spine_slows_an_alltoall() {
    let t = |oversub: &str| {
        let topo = format!("fat-tree:ranks=32,leaf=4,bw=50GB/s,lat=1us,oversub={oversub}");
        json(&[
            "alltoall",
            "--topology",
            &topo,
            "--bytes",
            "32MiB",
            "--algo",
            "direct",
        ])["time_us"]
            .as_f64()
            .unwrap()
    };
    // 2:1 at the spine: the leaf uplinks, not the rank ports, bound it:
    // 2 (n - leaf) / (n - 1) = 1.81 times the full-bisection time.
    let ratio = t("2") / t("1");
    assert!((ratio - 2.0 * 28.0 / 31.0).abs() < 0.1, "ratio {ratio}");
}

#[test]
fn mistakes_are_errors_that_say_what_to_fix() {
    let out = sim(&["allreduce", "--topology", "mesh:ranks=4", "--bytes", "1MiB"]);
    assert!(!out.status.success());
    assert!(!String::from_utf8_lossy(&out.stderr).is_empty());
    let out = sim(&["allreduce", "--topology", TWO_LEVEL, "--bytes", "3 parsecs"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("KiB"));
}

#[test]
fn aggregate_gives_the_full_runs_numbers_and_scales() {
    // 256 ranks: both ways, the same answer.
    let args = [
        "allreduce",
        "--topology",
        "two-level:nodes=32,gpus=8,intra=450GB/s@1us,inter=50GB/s@2us",
        "--bytes",
        "64MiB",
        "--algo",
        "hier",
    ];
    let full = json(&args);
    let mut with = args.to_vec();
    with.push("--aggregate");
    let agg = json(&with);
    assert!(full["aggregated"].is_null());
    assert_eq!(agg["aggregated"]["kind"], "shift");
    assert_eq!(agg["aggregated"]["period"], 8);
    let (f, a) = (
        full["time_us"].as_f64().unwrap(),
        agg["time_us"].as_f64().unwrap(),
    );
    assert!((f - a).abs() <= 1e-9 * f, "full {f} us, aggregated {a} us");
    assert_eq!(full["links"], agg["links"]);
    assert!(agg["events"].as_u64().unwrap() < full["events"].as_u64().unwrap());
    // 20,000 ranks of a ring: one rank simulated, 2(n-1) rounds of 1.6 KB.
    let big = json(&[
        "allreduce",
        "--topology",
        "switch:ranks=20000,bw=50GB/s,lat=2us",
        "--bytes",
        "128MB",
        "--algo",
        "ring",
        "--aggregate",
    ]);
    assert_eq!(big["ranks"], 20000);
    let expect_us = 2.0 * 19999.0 * (2.0 + 6400.0 / 50e9 * 1e6);
    let t = big["time_us"].as_f64().unwrap();
    assert!((t / expect_us - 1.0).abs() < 0.01, "{t} vs {expect_us}");
    // No symmetry: an error that says what to do.
    let out = sim(&[
        "bcast",
        "--topology",
        "switch:ranks=64,bw=50GB/s,lat=2us",
        "--bytes",
        "1MiB",
        "--algo",
        "tree",
        "--aggregate",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("run without aggregation"), "{err}");
}

#[test]
fn a_topology_file_runs_like_its_built_in_twin() {
    let path = std::env::temp_dir().join(format!("ferrocoll-cli-{}.topo", std::process::id()));
    std::fs::write(
        &path,
        "# 2 nodes of 4 GPUs\nranks 8\nswitch nv0 nv1 ib\n\
         link r0-r3 nv0 450GB/s 0.5us class=nvlink\n\
         link r4-r7 nv1 450GB/s 0.5us class=nvlink\n\
         link r0-r7 ib 25GB/s 1us class=nic\nplan 2x4\n",
    )
    .unwrap();
    let topo = format!("file:{}", path.display());
    let r = json(&["allreduce", "--topology", &topo, "--bytes", "64MiB"]);
    assert_eq!(r["ranks"], 8);
    // The plan line gives the node structure: the model picks hier.
    assert_eq!(r["algo"], "hier");
    let classes: Vec<&str> = r["links"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["class"].as_str().unwrap())
        .collect();
    assert_eq!(classes, ["nvlink-up", "nvlink-down", "nic-up", "nic-down"]);
    let missing = sim(&[
        "allreduce",
        "--topology",
        "file:/no/such.topo",
        "--bytes",
        "1MiB",
    ]);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/no/such.topo"));
}

#[test]
fn placement_flag_moves_ranks_like_the_topology_field() {
    let rail = "rail:nodes=4,gpus=4,intra=450GB/s@1us,inter=50GB/s@2us";
    let base = [
        "allreduce",
        "--topology",
        rail,
        "--bytes",
        "16MiB",
        "--algo",
        "hier",
    ];
    let block = json(&base);
    let mut flag = base.to_vec();
    flag.extend(["--placement", "roundrobin"]);
    let dealt = json(&flag);
    let field = format!("{rail},placement=roundrobin");
    let same = json(&[
        "allreduce",
        "--topology",
        &field,
        "--bytes",
        "16MiB",
        "--algo",
        "hier",
    ]);
    assert_eq!(dealt["time_us"], same["time_us"]);
    assert!(dealt["time_us"].as_f64().unwrap() > 2.0 * block["time_us"].as_f64().unwrap());
    let both = sim(&[
        "allreduce",
        "--topology",
        &field,
        "--bytes",
        "16MiB",
        "--placement",
        "block",
    ]);
    assert!(!both.status.success());
}

#[test]
fn full_runs_too_large_for_the_memory_are_refused_with_the_estimate() {
    // The command (16,384 ranks of a 256 MB ring allreduce grew to
    // 24 GB and was killed): refused from a sample of its plans, saying
    // what it would need and what to use instead.
    let big = [
        "sim",
        "allreduce",
        "--topology",
        "switch:ranks=16384,bw=50GB/s,lat=2us",
        "--bytes",
        "256MB",
        "--algo",
        "ring",
        "--mode",
        "contention",
    ];
    let out = Command::new(env!("CARGO_BIN_EXE_ferrocoll"))
        .args(big)
        .env("FERROCOLL_SIM_MEMORY", "4GB")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("would need about"), "{err}");
    assert!(err.contains("537 M messages"), "{err}");
    assert!(
        err.contains("4.0 GB is available (FERROCOLL_SIM_MEMORY)"),
        "{err}"
    );
    assert!(err.contains("--aggregate"), "{err}");
    let bad = Command::new(env!("CARGO_BIN_EXE_ferrocoll"))
        .args(big)
        .env("FERROCOLL_SIM_MEMORY", "lots")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&bad.stderr).contains("is not a size"));
    // The flag: a run that fits in 1 GB does not fit in 1 KB.
    let small = [
        "allreduce",
        "--topology",
        "switch:ranks=8,bw=50GB/s,lat=2us",
        "--bytes",
        "1MiB",
        "--algo",
        "ring",
        "--memory-limit",
    ];
    let mut tiny = small.to_vec();
    tiny.push("1KB");
    let out = sim(&tiny);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("1.0 KB is available (the memory limit given)"),
        "{err}"
    );
    let mut enough = small.to_vec();
    enough.push("1GB");
    assert!(json(&enough)["time_us"].as_f64().unwrap() > 0.0);
}

#[test]
fn aggregate_takes_counts_the_ranks_do_not_divide() {
    // The command with --aggregate: 64,000,000 elements over
    // 16,384 ranks are blocks of 3,906 and 3,907; one rank is simulated.
    let args = [
        "allreduce",
        "--topology",
        "switch:ranks=16384,bw=50GB/s,lat=2us",
        "--bytes",
        "256MB",
        "--algo",
        "ring",
        "--mode",
        "contention",
        "--aggregate",
    ];
    let j = json(&args);
    assert_eq!(j["aggregated"]["period"], 1);
    assert_eq!(
        j["aggregated"]["uneven"]["block_elements"],
        serde_json::json!([3906, 3907])
    );
    assert_eq!(j["links"][0]["bytes"], 2u64 * 16383 * 256_000_000);
    let out = sim(&args);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("blocks of 3906 and 3907 elements: traffic exact"),
        "{text}"
    );
    // An even count has no such field.
    let even = json(&[
        "allreduce",
        "--topology",
        "switch:ranks=16384,bw=50GB/s,lat=2us",
        "--bytes",
        "64MiB",
        "--algo",
        "ring",
        "--aggregate",
    ]);
    assert!(even["aggregated"]["uneven"].is_null());
}

/// `sim COLL --topology SLOW --bytes BYTES --compress CODEC` and `extra`.
fn compressed_args<'a>(
    coll: &'a str,
    bytes: &'a str,
    codec: &'a str,
    extra: &[&'a str],
) -> Vec<&'a str> {
    let slow = "switch:ranks=16,bw=1GB/s,lat=5us";
    let mut args = vec![
        coll,
        "--topology",
        slow,
        "--bytes",
        bytes,
        "--compress",
        codec,
    ];
    args.extend_from_slice(extra);
    args
}

#[test]
fn compress_runs_the_compressed_allreduce_next_to_the_uncompressed_one() {
    // A slow link and a large call: compression pays; every codec runs.
    for codec in [
        "int8",
        "onebit",
        "topk:0.01",
        "fp16",
        "powersgd:4",
        "randk:0.01",
    ] {
        let j = json(&compressed_args("allreduce", "64MiB", codec, &[]));
        let c = &j["compressed"];
        let (time, plain) = (
            c["time_us"].as_f64().unwrap(),
            j["time_us"].as_f64().unwrap(),
        );
        assert!(
            time < plain && c["speedup"].as_f64().unwrap() > 1.0,
            "{codec}: {j}"
        );
        assert!(c["codec_us"].as_f64().unwrap() > 0.0, "{codec}");
        // The wire bytes the exchanges moved are those the links carried.
        let wire: u64 = c["exchanges"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["bytes"].as_u64().unwrap())
            .sum();
        assert_eq!(wire, c["sent_bytes_total"].as_u64().unwrap(), "{codec}");
        assert_eq!(c["links"][0]["bytes"].as_u64().unwrap(), wire, "{codec}");
        assert!(wire < j["links"][0]["bytes"].as_u64().unwrap(), "{codec}");
    }
    // A tiny call: latency-bound, compression only adds the codec.
    let j = json(&compressed_args(
        "allreduce",
        "64",
        "int8",
        &["--algo", "direct"],
    ));
    assert!(j["compressed"]["speedup"].as_f64().unwrap() < 1.0, "{j}");
    // The table names both.
    let out = sim(&compressed_args("allreduce", "1MiB", "int8", &[]));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("compressed with int8:128 (two-phase)"),
        "{text}"
    );
    assert!(text.contains("uncompressed"), "{text}");
    // What it cannot run is refused.
    for bad in [
        compressed_args("allgather", "1MiB", "int8", &[]),
        compressed_args("allreduce", "1MiB", "zip", &[]),
        compressed_args("allreduce", "1MiB", "int8", &["--aggregate"]),
    ] {
        let out = sim(&bad);
        assert!(!out.status.success(), "{bad:?}");
        assert!(!out.stderr.is_empty(), "{bad:?}");
    }
}
