//! `ferrocoll model moe` against the seed's worked example, Napkin Math 1.4
//! of seed 000 (`shared/seeds/000_f4bc3ec11c2e0189.clean.txt`, lines
//! 298-316: "用于 MoE 令牌路由的 AllToAll", the all-to-all of MoE token
//! routing), and the effect of skew and capacity.

use std::process::Command;

use serde_json::Value;

/// Runs `ferrocoll model moe <args>` and returns (success, stdout, stderr).
fn run(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ferrocoll"))
        .args(["model", "moe"])
        .args(args)
        .output()
        .expect("runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// [`run`] with `--json`; the run must succeed.
fn json(args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let (ok, stdout, stderr) = run(&all);
    assert!(ok, "model moe {args:?}: {stderr}");
    serde_json::from_str(&stdout).expect("one JSON object")
}

/// The phase `phase` under `algo` of a report.
fn phase<'a>(r: &'a Value, phase: &str, algo: &str) -> &'a Value {
    r["phases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["phase"] == phase && p["algo"] == algo)
        .unwrap_or_else(|| panic!("no {phase} {algo} in {r}"))
}

fn close(what: &str, got: &Value, want: f64, tol: f64) {
    let got = got.as_f64().unwrap_or_else(|| panic!("{what}: {got}"));
    assert!(
        (got - want).abs() <= tol,
        "{what}: {got}, want {want} ± {tol}"
    );
}

/// The command line: the seed's example with no link option (the
/// defaults are its InfiniBand NDR, α = 3 μs, β = 50 GB/s).
const NAPKIN: [&str; 10] = [
    "--tokens",
    "4096",
    "--hidden",
    "2048",
    "--dtype",
    "bf16",
    "--experts",
    "64",
    "--ranks",
    "8",
];

/// "一个 MoE 模型处理包含 4096 tokens 个令牌的批次，这些令牌分布在 8 个 GPU 上（每个
/// GPU 上有 512 tokens 个令牌）。每个令牌是一个采用 BF16 格式的 2048 维隐藏状态（每个
/// 令牌占 4.096 KB）。门控网络将每个令牌恰好分配给 1 个专家，共有 64 个专家" (4096
/// tokens over 8 GPUs, 512 each; a token is a 2048-wide BF16 hidden state,
/// 4.096 KB; each goes to exactly 1 of 64 experts);
/// "每次 GPU 间传输的数据量：64 tokens × 4.096 KB/令牌 = 262.144 KB；每个 GPU
/// 发送的总数据量：7 × 262.144 KB = 1.84 MB；每个 GPU 接收的总数据量：1.84 MB
/// （对称）" (262.144 KB per GPU pair; 1.84 MB sent and received per GPU);
/// "延迟分析（InfiniBand NDR，α = 3 μs，β = 50 GB/s）... 总体注入延迟的下界为
/// α + total bytes sent/β = 39.7 μs" (the injection bound, 39.7 μs);
/// "若串行执行：7 × 8 μs = 56 μs" (serially 56 μs, the seed rounding each
/// 262.144 KB / 50 GB/s = 5.24 μs to 5 μs: the formula gives 57.7 μs);
/// "每层都要执行两次 AllToAll，一次用于令牌分发，一次用于结果收集" (two
/// all-to-alls a layer: dispatch and combine).
#[test]
fn napkin_math_1_4_bytes_and_time() {
    let r = json(&NAPKIN);
    assert_eq!(r["tokens_per_rank"], serde_json::json!(vec![512; 8]));
    assert_eq!(r["row_bytes"], 4096, "4.096 KB a token");
    close("expert load", &r["expert_load_max"], 64.0, 1e-9);
    close("per GPU pair", &r["max_message_bytes"], 262_144.0, 1e-6);
    close("sent per GPU", &r["max_send_bytes"], 1_835_008.0, 1e-6);
    close("received per GPU", &r["max_recv_bytes"], 1_835_008.0, 1e-6);
    close("dropped", &r["dropped"], 0.0, 1e-9);
    // Dispatch is the concurrent bound, α + 1835008 B / 50 GB/s.
    let dispatch = phase(&r, "dispatch", "direct");
    close("dispatch (39.7 us)", &dispatch["time_us"], 39.7, 0.005);
    close("dispatch latency", &dispatch["latency_us"], 3.0, 1e-9);
    close(
        "dispatch combine",
        &phase(&r, "combine", "direct")["time_us"],
        39.7,
        0.005,
    );
    // The serial schedule: 7 x (3 + 5.243) us.
    let serial = phase(&r, "dispatch", "pairwise");
    close("pairwise (seed's 56 us)", &serial["time_us"], 57.7, 0.005);
    // The layer adds the count exchange (an allgather of 68 u32 a rank,
    // ~3 us of latency) to the two all-to-alls.
    let counts = phase(&r, "counts", "direct");
    close(
        "count exchange",
        &counts["time_us"],
        3.0 + 7.0 * 272.0 / 50e3,
        1e-6,
    );
    close("layer", &r["layer_us"], 2.0 * 39.7 + 3.038, 0.01);
}

#[test]
fn the_table_prints_bytes_and_time() {
    let (ok, stdout, stderr) = run(&NAPKIN);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains(
            "sends 1835008 B to other ranks, receives 1835008 B; largest message 262144 B"
        ),
        "{stdout}"
    );
    let dispatch = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("dispatch   direct"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(dispatch.contains("39.700"), "{dispatch}");
    assert!(stdout.contains("# layer"), "{stdout}");
}

#[test]
fn a_hot_expert_raises_the_max_receive_and_a_capacity_caps_it() {
    let uniform = json(&NAPKIN);
    let mut args = NAPKIN.to_vec();
    args.extend(["--topk", "2", "--skew", "zipf:1.2"]);
    let zipf = json(&args);
    // Rank 0 holds the hottest experts: it receives far more than it
    // sends, and more than twice the uniform top-2 volume (2 x 1.84 MB).
    let recv = zipf["max_recv_bytes"].as_f64().unwrap();
    assert!(recv > 2.0 * 2.0 * 1_835_008.0, "{zipf}");
    assert!(
        recv > 2.0 * zipf["max_send_bytes"].as_f64().unwrap(),
        "{zipf}"
    );
    let t = |r: &Value| phase(r, "dispatch", "direct")["time_us"].as_f64().unwrap();
    assert!(t(&zipf) > 4.0 * t(&uniform), "{zipf}");
    // C = 1.0 caps every expert at 128 rows: pairs drop, the exchange shrinks.
    args.extend(["--capacity", "1.0"]);
    let capped = json(&args);
    assert_eq!(capped["capacity_rows"], 128);
    assert!(capped["dropped"].as_f64().unwrap() > 1000.0, "{capped}");
    assert!(t(&capped) < t(&zipf), "{capped}");
}

#[test]
fn experts_that_do_not_divide_among_the_ranks_are_a_usage_error() {
    let (ok, _, stderr) = run(&["--experts", "60", "--ranks", "8"]);
    assert!(!ok);
    assert!(
        stderr.contains("60 experts cannot be split evenly over 8 ranks"),
        "{stderr}"
    );
    let (ok, _, stderr) = run(&["--skew", "pareto"]);
    assert!(!ok && stderr.contains("zipf:S"), "{stderr}");
}
