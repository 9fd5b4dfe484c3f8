//! Ranks as processes: every collective over shared memory and TCP with 2, 3
//! and 4 ranks through `ferrocoll run`, the API (in place, non-blocking,
//! persistent, point-to-point, split) across processes, small calls on the
//! shared-memory fast path (every type and operator, mixed with large
//! calls, non-blocking calls, point-to-point and a second communicator on
//! another thread), a 256 MiB message, the environments of torchrun, Open
//! MPI, Slurm and PMI, and a killed run that leaves nothing in /dev/shm.
//!
//! This file is its own rank program: with `FERROCOLL_TEST_ROLE` set it plays
//! one rank of a job instead of driving the tests (harness = false, so the
//! binary's `main` is ours).

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use ferrocoll::{bf16, f16, Collective, Communicator, DType, Element, ReduceOp};

const FERROCOLL: &str = env!("CARGO_BIN_EXE_ferrocoll");

const COLLECTIVES: [&str; 9] = [
    "allreduce",
    "bcast",
    "reduce",
    "allgather",
    "reducescatter",
    "alltoall",
    "alltoallv",
    "gather",
    "scatter",
];

mod common;
use common::{free_port, show, ROLE};

fn main() {
    if let Ok(role) = std::env::var(ROLE) {
        let comm = ferrocoll::init().unwrap_or_else(|e| {
            eprintln!("init failed: {e}");
            std::process::exit(3)
        });
        match role.as_str() {
            "api" => api(&comm),
            "big" => big(&comm),
            "hang" => hang(&comm),
            "sum" => sum(&comm),
            "lazy" => lazy(&comm),
            "small" => small(&comm),
            "p2p" => p2p(&comm),
            "bucket" => bucket(&comm),
            "edges" => edges(&comm),
            other => panic!("unknown role {other}"),
        }
        return;
    }
    let tests: [(&str, fn()); 11] = [
        (
            "tcp_connections_open_on_first_use",
            tcp_connections_open_on_first_use,
        ),
        (
            "every_collective_on_shm_and_tcp",
            every_collective_on_shm_and_tcp,
        ),
        ("api_across_processes", api_across_processes),
        (
            "point_to_point_as_mpi_defines_it",
            point_to_point_as_mpi_defines_it,
        ),
        ("small_calls_fast_path", small_calls_fast_path),
        ("message_of_256_mib", message_of_256_mib),
        (
            "tcp_receives_straight_into_place",
            tcp_receives_straight_into_place,
        ),
        ("launcher_environments", launcher_environments),
        (
            "killed_run_leaves_nothing_in_dev_shm",
            killed_run_leaves_nothing_in_dev_shm,
        ),
        ("two_hosts_mix_shm_and_tcp", two_hosts_mix_shm_and_tcp),
        (
            "bucketed_gradients_equal_unbucketed",
            bucketed_gradients_equal_unbucketed,
        ),
    ];
    common::run_tests(&tests, "multi-process");
}

// ---- drivers ---------------------------------------------------------------

/// `ferrocoll run -n N` of this binary in `role`, with `env` added.
fn launch(n: usize, role: &str, env: &[(&str, &str)]) -> Output {
    let me = std::env::current_exe().unwrap();
    let mut cmd = Command::new(FERROCOLL);
    cmd.args(["run", "-n", &n.to_string(), "--timeout", "120", "--"])
        .arg(&me)
        .env(ROLE, role)
        .env("FERROCOLL_TIMEOUT", "60");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// The configurations every multi-process test runs in: shared memory with
/// the rings only, shared memory with large messages read straight from the
/// sender's memory (the single-copy path, forced on: on some machines it is
/// not chosen) and small ones through the rings too (the fast path off),
/// shared memory with the buffers in `SharedBuffer`s (read in place by the
/// peers), TCP, and TCP with every peer reached over 3 striped connections
/// and every message checksummed: (transport, single copy, TCP streams,
/// buffers). The shared-memory fast path is off in the second.
const VARIANTS: [(&str, &str, &str, &str); 5] = [
    ("shm", "off", "1", "heap"),
    ("shm", "on", "1", "heap"),
    ("shm", "off", "1", "shared"),
    ("tcp", "off", "1", "heap"),
    ("tcp", "off", "3", "heap"),
];

/// `FERROCOLL_SHM_FAST` for a variant: off where the single copy is forced
/// on, so that small messages through the rings stay tested.
fn shm_fast(single_copy: &str) -> &'static str {
    if single_copy == "on" {
        "off"
    } else {
        "auto"
    }
}

fn every_collective_on_shm_and_tcp() {
    for (transport, single_copy, streams, buffers) in VARIANTS {
        for n in [2, 3, 4] {
            for coll in COLLECTIVES {
                let what = format!(
                    "{coll} {transport} (single copy {single_copy}, streams {streams}, {buffers}) n={n}"
                );
                // Up to 1 MiB: large enough for the ring and pipeline paths,
                // the single-copy path and messages bigger than a TCP
                // socket buffer.
                let out = Command::new(FERROCOLL)
                    .args([
                        "bench",
                        coll,
                        "--transport",
                        transport,
                        "-n",
                        &n.to_string(),
                    ])
                    .args([
                        "-b", "8", "-e", "1M", "-f", "32", "--iters", "1", "--warmup", "1",
                    ])
                    .args(["--check", "--json", "--buffers", buffers])
                    .env("FERROCOLL_TIMEOUT", "60")
                    .env("FERROCOLL_SHM_SINGLE_COPY", single_copy)
                    .env("FERROCOLL_SHM_FAST", shm_fast(single_copy))
                    .env("FERROCOLL_TCP_STREAMS", streams)
                    .env("FERROCOLL_CHECKSUM", if streams == "3" { "1" } else { "0" })
                    .output()
                    .unwrap();
                assert!(out.status.success(), "{what}: {}", show(&out));
                let rows: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .map(|l| serde_json::from_str(l).expect("a JSON row"))
                    .collect();
                assert!(rows.len() >= 3, "{what}: {}", show(&out));
                for row in &rows {
                    assert_eq!(row["wrong"], 0, "{what}: {row}");
                    assert_eq!(row["transport"], transport, "{row}");
                    assert_eq!(row["ranks"], n, "{row}");
                }
            }
        }
    }
}

fn api_across_processes() {
    every_variant("api", &[1, 3, 4]);
}

/// Point-to-point as MPI and torch define it, on every variant: matched
/// by (source, tag) in FIFO order whatever the lengths, from several
/// threads, zero-length messages, and receives from any source.
fn point_to_point_as_mpi_defines_it() {
    every_variant("p2p", &[2, 3, 4]);
}

/// The bucketer and the sharded layers (`ferrocoll::bucket`): ranks as
/// threads (1 to 5) and as processes on every variant (1 to 3).
fn bucketed_gradients_equal_unbucketed() {
    for n in 1..=5 {
        ferrocoll::local::run(n, |comm| bucket(&comm)).unwrap();
    }
    every_variant("bucket", &[1, 2, 3]);
}

/// Runs `role` on every one of [`VARIANTS`] with each of `sizes` ranks;
/// every rank must exit cleanly and print "ROLE ok".
fn every_variant(role: &str, sizes: &[usize]) {
    for (transport, single_copy, streams, buffers) in VARIANTS {
        for &n in sizes {
            let env = [
                ("FERROCOLL_TRANSPORT", transport),
                ("FERROCOLL_SHM_SINGLE_COPY", single_copy),
                ("FERROCOLL_SHM_FAST", shm_fast(single_copy)),
                ("FERROCOLL_TCP_STREAMS", streams),
                ("FERROCOLL_TEST_BUFFERS", buffers),
            ];
            let out = launch(n, role, &env);
            let what = format!(
                "{role} {transport} (single copy {single_copy}, streams {streams}, {buffers}) n={n}"
            );
            assert!(out.status.success(), "{what}: {}", show(&out));
            let text = String::from_utf8_lossy(&out.stdout);
            let ok = format!("{role} ok");
            assert_eq!(
                text.matches(ok.as_str()).count(),
                n,
                "{what}: {}",
                show(&out)
            );
        }
    }
}

/// Small calls, which take the shared-memory fast path when every rank of
/// the communicator is on one host, checked against a reference: 2, 3 and
/// 4 ranks (4 share the 2 cores of CI), the fast path on and off, TCP (no
/// fast path), and two "hosts" of two ranks (the world spans both, so only
/// the per-host communicators take it).
fn small_calls_fast_path() {
    let runs: [(usize, &str, &str, bool); 8] = [
        (2, "shm", "auto", true),
        (3, "shm", "auto", true),
        (4, "shm", "auto", true),
        (2, "shm", "off", false),
        (4, "shm", "off", false),
        (3, "tcp", "auto", false),
        // Checksums on: the fast path steps aside.
        (2, "shm", "checksum", false),
        (4, "hosts", "auto", true),
    ];
    for (n, transport, fast, expect_fast) in runs {
        let what = format!("small {transport} FERROCOLL_SHM_FAST={fast} n={n}");
        let expect = if expect_fast { "1" } else { "0" };
        let out = if transport == "hosts" {
            // Two "hosts" of two ranks each on this machine.
            let me = std::env::current_exe().unwrap();
            Command::new(FERROCOLL)
                .args(["run", "-n", "4", "--timeout", "120", "--", "sh", "-c"])
                .arg("FERROCOLL_HOST_ID=host$((FERROCOLL_RANK / 2)) exec \"$0\"")
                .arg(&me)
                .env(ROLE, "small")
                .env("FERROCOLL_TIMEOUT", "60")
                .env("FERROCOLL_TEST_FAST", expect)
                .output()
                .unwrap()
        } else {
            let checksum = if fast == "checksum" { "1" } else { "0" };
            let fast = if fast == "checksum" { "auto" } else { fast };
            let env = [
                ("FERROCOLL_TRANSPORT", transport),
                ("FERROCOLL_SHM_FAST", fast),
                ("FERROCOLL_CHECKSUM", checksum),
                ("FERROCOLL_TEST_FAST", expect),
            ];
            launch(n, "small", &env)
        };
        assert!(out.status.success(), "{what}: {}", show(&out));
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            text.matches("small ok").count(),
            n,
            "{what}: {}",
            show(&out)
        );
    }
}

fn message_of_256_mib() {
    for (transport, single_copy, streams, buffers) in VARIANTS {
        let env = [
            ("FERROCOLL_TRANSPORT", transport),
            ("FERROCOLL_SHM_SINGLE_COPY", single_copy),
            ("FERROCOLL_TCP_STREAMS", streams),
            ("FERROCOLL_TEST_BUFFERS", buffers),
        ];
        let out = launch(2, "big", &env);
        let what =
            format!("big {transport} (single copy {single_copy}, streams {streams}, {buffers})");
        assert!(out.status.success(), "{what}: {}", show(&out));
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(text.matches("big ok").count(), 2, "{what}: {}", show(&out));
    }
}

/// Over TCP a receive that copies reads the socket straight into its
/// buffer: messages of lengths at and around the word, header and
/// direct-read boundaries, arriving before and after their receive is
/// posted, with reductions between, over one stream and two, checksums on
/// and off.
fn tcp_receives_straight_into_place() {
    for (streams, checksum) in [("1", "0"), ("2", "1"), ("1", "1")] {
        let env = [
            ("FERROCOLL_TRANSPORT", "tcp"),
            ("FERROCOLL_TCP_STREAMS", streams),
            ("FERROCOLL_CHECKSUM", checksum),
        ];
        let out = launch(2, "edges", &env);
        let what = format!("edges (streams {streams}, checksum {checksum})");
        assert!(out.status.success(), "{what}: {}", show(&out));
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            text.matches("edges ok").count(),
            2,
            "{what}: {}",
            show(&out)
        );
    }
}

/// Starts `n` processes of this binary directly (no launcher), rank `r`
/// with the variables `vars(r)`, and checks every one sums correctly.
fn direct(n: usize, family: &str, vars: impl Fn(usize) -> Vec<(String, String)>) {
    let me = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..n)
        .map(|r| {
            let mut cmd = Command::new(&me);
            // Only the family under test: no variable of another launcher.
            for (k, _) in std::env::vars() {
                let launcherish = ["FERROCOLL_", "OMPI_", "PMI_", "SLURM_", "MASTER_"]
                    .iter()
                    .any(|p| k.starts_with(p))
                    || ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"]
                        .contains(&k.as_str());
                if launcherish {
                    cmd.env_remove(&k);
                }
            }
            cmd.env(ROLE, "sum").env("FERROCOLL_TIMEOUT", "30");
            for (k, v) in vars(r) {
                cmd.env(k, v);
            }
            cmd.stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for (r, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{family} rank {r}: {}", show(&out));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains(&format!("sum ok {r}/{n}")),
            "{family} rank {r}: {}",
            show(&out)
        );
    }
}

fn launcher_environments() {
    let n = 3;
    let s = |x: &str| x.to_string();
    let port = free_port();
    direct(n, "torchrun", |r| {
        vec![
            (s("RANK"), r.to_string()),
            (s("WORLD_SIZE"), n.to_string()),
            (s("LOCAL_RANK"), r.to_string()),
            (s("MASTER_ADDR"), s("127.0.0.1")),
            (s("MASTER_PORT"), port.to_string()),
        ]
    });
    let port = free_port();
    direct(n, "Open MPI", |r| {
        vec![
            (s("OMPI_COMM_WORLD_RANK"), r.to_string()),
            (s("OMPI_COMM_WORLD_SIZE"), n.to_string()),
            (s("OMPI_COMM_WORLD_LOCAL_RANK"), r.to_string()),
            (s("OMPI_COMM_WORLD_LOCAL_SIZE"), n.to_string()),
            (s("FERROCOLL_ADDR"), format!("127.0.0.1:{port}")),
        ]
    });
    let port = free_port();
    direct(n, "Slurm", |r| {
        vec![
            (s("SLURM_PROCID"), r.to_string()),
            (s("SLURM_NTASKS"), n.to_string()),
            (s("SLURM_LOCALID"), r.to_string()),
            (s("SLURM_JOB_ID"), s("4242")),
            (s("SLURM_JOB_NODELIST"), s("localhost")),
            (s("FERROCOLL_PORT"), port.to_string()),
        ]
    });
    // The store as a process of its own (`ferrocoll store`), not rank 0.
    let port = free_port();
    let mut store = Command::new(FERROCOLL)
        .args([
            "store",
            "--addr",
            &format!("127.0.0.1:{port}"),
            "--secret",
            "xyz",
        ])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    direct(n, "external store", |r| {
        vec![
            (s("FERROCOLL_RANK"), r.to_string()),
            (s("FERROCOLL_WORLD_SIZE"), n.to_string()),
            (s("FERROCOLL_ADDR"), format!("127.0.0.1:{port}")),
            (s("FERROCOLL_SECRET"), s("xyz")),
            (s("FERROCOLL_STORE"), s("external")),
        ]
    });
    let _ = store.kill();
    let _ = store.wait();
    let port = free_port();
    direct(n, "PMI", |r| {
        vec![
            (s("PMI_RANK"), r.to_string()),
            (s("PMI_SIZE"), n.to_string()),
            (s("MASTER_ADDR"), s("127.0.0.1")),
            (s("MASTER_PORT"), port.to_string()),
        ]
    });
}

fn job_files() -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("ferrocoll-"))
                .collect()
        })
        .unwrap_or_default()
}

fn killed_run_leaves_nothing_in_dev_shm() {
    use std::io::{BufRead, BufReader};
    use std::os::unix::process::CommandExt;
    let me = std::env::current_exe().unwrap();
    // The launcher and its ranks in a process group of their own, so the
    // whole run can be killed at once, as a scheduler would.
    let mut run = Command::new(FERROCOLL)
        .args(["run", "-n", "4", "--"])
        .arg(&me)
        .env(ROLE, "hang")
        .env("FERROCOLL_TRANSPORT", "shm")
        .process_group(0)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(run.stdout.take().unwrap());
    let mut ready = 0;
    let mut job = String::new();
    for line in stdout.lines() {
        let line = line.unwrap();
        if let Some(at) = line.find("job=") {
            job = line[at + 4..].trim().to_string();
            ready += 1;
            if ready == 4 {
                break;
            }
        }
    }
    assert_eq!(ready, 4, "every rank reached the collective");
    // SAFETY: sending a signal to the process group we created.
    unsafe { libc::kill(-(run.id() as i32), libc::SIGKILL) };
    let _ = run.wait();
    // Let the killed processes be reaped.
    std::thread::sleep(Duration::from_millis(200));
    assert!(!job.is_empty());
    let ours = format!("ferrocoll-{job}");
    let left: Vec<String> = job_files()
        .into_iter()
        .filter(|f| f.starts_with(&ours))
        .collect();
    assert!(left.is_empty(), "a killed run left {left:?} in /dev/shm");
}

fn two_hosts_mix_shm_and_tcp() {
    // Two "hosts" of two ranks on this machine (FERROCOLL_HOST_ID): shared
    // memory within each, TCP between them, topology 2x2 (hier algorithms).
    let me = std::env::current_exe().unwrap();
    let out = Command::new(FERROCOLL)
        .args(["run", "-n", "4", "--timeout", "120", "--", "sh", "-c"])
        .arg("FERROCOLL_HOST_ID=host$((FERROCOLL_RANK / 2)) exec \"$0\"")
        .arg(&me)
        .env(ROLE, "api")
        .env("FERROCOLL_TIMEOUT", "60")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", show(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.matches("api ok").count(), 4, "{}", show(&out));
    assert!(
        text.contains("nodes=2 links=self,shm,tcp,tcp"),
        "{}",
        show(&out)
    );
}

fn tcp_connections_open_on_first_use() {
    let out = launch(5, "lazy", &[("FERROCOLL_TRANSPORT", "tcp")]);
    assert!(out.status.success(), "{}", show(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout)
            .matches("lazy ok")
            .count(),
        5,
        "{}",
        show(&out)
    );
}

// ---- rank programs -----------------------------------------------------------

/// Sockets this process has open.
fn sockets() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|t| t.to_string_lossy().starts_with("socket:"))
        .count()
}

fn lazy(comm: &Communicator) {
    let (rank, n) = (comm.rank(), comm.size());
    let before = sockets();
    // Talk to the two ring neighbours only: two connections, not n - 1.
    let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
    let mut got = [0u32];
    if rank % 2 == 0 {
        comm.send(&[rank as u32], next, 0).unwrap();
        comm.recv(&mut got, prev, 0).unwrap();
    } else {
        comm.recv(&mut got, prev, 0).unwrap();
        comm.send(&[rank as u32], next, 0).unwrap();
    }
    assert_eq!(got[0], prev as u32);
    // Rank 0 also serves the rendezvous store, whose connections come and
    // go as the other ranks finish: count on the others.
    if rank != 0 {
        let ring = sockets() - before;
        assert_eq!(
            ring, 2,
            "rank {rank}: a ring exchange opened {ring} connections"
        );
    }
    // No rank talks to anyone else, so no other connection can appear.
    println!("lazy ok {rank}");
}

fn sum(comm: &Communicator) {
    let mut v = vec![comm.rank() as u64 + 1; 1000];
    comm.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
    let n = comm.size() as u64;
    assert!(v.iter().all(|x| *x == n * (n + 1) / 2));
    println!("sum ok {}/{}", comm.rank(), comm.size());
}

fn big(comm: &Communicator) {
    // 64 Mi f32 = 256 MiB in one call.
    let count = 64 << 20;
    let shared = std::env::var("FERROCOLL_TEST_BUFFERS").is_ok_and(|b| b == "shared");
    let mut heap = Vec::new();
    let mut mapped = ferrocoll::SharedBuffer::<f32>::new(if shared { count } else { 0 }).unwrap();
    let v: &mut [f32] = if shared {
        &mut mapped
    } else {
        heap.resize(count, 0.0);
        &mut heap
    };
    v.fill(comm.rank() as f32 + 1.0);
    comm.all_reduce_in_place(v, ReduceOp::Sum).unwrap();
    let n = comm.size() as f32;
    assert!(
        v.iter().all(|x| *x == n * (n + 1.0) / 2.0),
        "allreduce of 256 MiB"
    );
    let mut b = if comm.rank() == 0 {
        (0..count as u32).collect()
    } else {
        vec![0u32; count]
    };
    comm.broadcast_in_place(&mut b, 0).unwrap();
    assert!(
        b.iter().enumerate().all(|(i, x)| *x == i as u32),
        "broadcast of 256 MiB"
    );
    println!("big ok {}", comm.rank());
}

/// Byte `i` of edge-test message `k` from rank `r`.
fn edge_byte(r: usize, k: usize, i: usize) -> u8 {
    (i.wrapping_mul(13) + k * 29 + r * 101 + (i >> 10)) as u8
}

fn edges(comm: &Communicator) {
    let (r, n) = (comm.rank(), comm.size());
    assert_eq!(n, 2, "the edge test runs on 2 ranks");
    let peer = 1 - r;
    let lens = [
        0usize,
        1,
        7,
        8,
        9,
        63,
        64,
        65,
        65_535,
        65_536,
        65_537,
        65_543,
        5,
        300_003,
        3,
        1 << 20 | 5,
        16,
        4 << 20 | 3,
    ];
    // Point-to-point both ways at once (sends on a thread: a send waits
    // for its receive); every other message is received only after a
    // pause, so it arrives unexpected.
    std::thread::scope(|s| {
        s.spawn(|| {
            for (k, &len) in lens.iter().enumerate() {
                let v: Vec<u8> = (0..len).map(|i| edge_byte(r, k, i)).collect();
                comm.send(&v, peer, 3).unwrap();
            }
        });
        for (k, &len) in lens.iter().enumerate() {
            if k % 2 == 1 {
                std::thread::sleep(Duration::from_millis(20));
            }
            let mut v = vec![0xEEu8; len];
            comm.recv(&mut v, peer, 3).unwrap();
            assert!(
                v.iter()
                    .enumerate()
                    .all(|(i, &x)| x == edge_byte(peer, k, i)),
                "p2p message {k} ({len} B)"
            );
        }
    });
    // Collectives that copy (broadcast, allgather, alltoall) with odd byte
    // counts, an allreduce (reduced, not copied) between them, and a rank
    // that comes late to every other call.
    for (k, &len) in lens.iter().enumerate() {
        if k % 2 == r {
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut b: Vec<u8> = if r == 0 {
            (0..len).map(|i| edge_byte(0, k, i)).collect()
        } else {
            vec![0; len]
        };
        comm.broadcast_in_place(&mut b, 0).unwrap();
        assert!(
            b.iter().enumerate().all(|(i, &x)| x == edge_byte(0, k, i)),
            "broadcast {k} ({len} B)"
        );
        let mine: Vec<u8> = (0..len).map(|i| edge_byte(r, k, i)).collect();
        let mut all = vec![0u8; 2 * len];
        comm.all_gather(&mine, &mut all).unwrap();
        for (q, block) in all
            .chunks(len.max(1))
            .enumerate()
            .take(if len == 0 { 0 } else { 2 })
        {
            assert!(
                block
                    .iter()
                    .enumerate()
                    .all(|(i, &x)| x == edge_byte(q, k, i)),
                "allgather {k} ({len} B), block of rank {q}"
            );
        }
        let mut sum = vec![r as u32 + 1; len / 4 + 1];
        comm.all_reduce_in_place(&mut sum, ReduceOp::Sum).unwrap();
        assert!(sum.iter().all(|&x| x == 3), "allreduce {k}");
        let send: Vec<u8> = (0..2 * len).map(|i| edge_byte(r, k, i)).collect();
        let mut recv = vec![0u8; 2 * len];
        comm.all_to_all(&send, &mut recv).unwrap();
        for q in 0..2 {
            let from = &recv[q * len..(q + 1) * len];
            assert!(
                from.iter()
                    .enumerate()
                    .all(|(i, &x)| x == edge_byte(q, k, r * len + i)),
                "alltoall {k} ({len} B), block from rank {q}"
            );
        }
    }
    comm.barrier().unwrap();
    println!("edges ok {r}");
}

fn hang(comm: &Communicator) {
    comm.barrier().unwrap();
    let job = std::env::var("FERROCOLL_JOB_ID").unwrap();
    println!("hang ready {} job={job}", comm.rank());
    // Rank 0 never joins: the others wait until the run is killed.
    if comm.rank() != 0 {
        let _ = comm.barrier();
    }
    std::thread::sleep(Duration::from_secs(120));
}

/// Element types built from small integers, for exact references.
trait Small: Element + Copy {
    fn of(v: u32) -> Self;
}

macro_rules! small_int {
    ($($t:ty),*) => {$(impl Small for $t {
        fn of(v: u32) -> Self { v as $t }
    })*};
}
small_int!(i8, i32, i64, u8, u32, u64);

impl Small for f32 {
    fn of(v: u32) -> Self {
        v as f32
    }
}
impl Small for f64 {
    fn of(v: u32) -> Self {
        f64::from(v)
    }
}
impl Small for f16 {
    fn of(v: u32) -> Self {
        f16::from_f32(v as f32)
    }
}
impl Small for bf16 {
    fn of(v: u32) -> Self {
        bf16::from_f32(v as f32)
    }
}

/// Rank `r`'s element `i` in the reductions: 1..=3, so that sums, products
/// (at most 3^4) and averages of up to 4 ranks are exact in every type.
fn contribution(r: usize, i: usize) -> u32 {
    ((r + i) % 3 + 1) as u32
}

/// Every small allreduce, reduce, broadcast, allgather, all-to-all and
/// reduce-scatter of type `T` on `comm` (in place and not, every operator
/// or two, every root), checked.
fn small_calls_of<T: Small>(comm: &Communicator, max_count: usize) {
    let (rank, n) = (comm.rank(), comm.size());
    let name = T::DTYPE;
    for count in [0, 1, 2, 3, max_count] {
        let mine: Vec<T> = (0..count).map(|i| T::of(contribution(rank, i))).collect();
        let column = |i: usize| (0..n).map(move |r| contribution(r, i));
        for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max] {
            let want: Vec<T> = (0..count)
                .map(|i| {
                    T::of(match op {
                        ReduceOp::Sum => column(i).sum(),
                        ReduceOp::Prod => column(i).product(),
                        ReduceOp::Min => column(i).min().unwrap(),
                        _ => column(i).max().unwrap(),
                    })
                })
                .collect();
            let mut out = vec![T::of(0); count];
            comm.all_reduce(&mine, &mut out, op).unwrap();
            assert_eq!(out, want, "allreduce {name} {op:?} count {count}");
            let mut buf = mine.clone();
            comm.all_reduce_in_place(&mut buf, op).unwrap();
            assert_eq!(buf, want, "allreduce in place {name} {op:?} count {count}");
            let root = (count + op as usize) % n;
            let mut out = vec![T::of(0); if rank == root { count } else { 0 }];
            comm.reduce(&mine, &mut out, op, root).unwrap();
            if rank == root {
                assert_eq!(out, want, "reduce {name} {op:?} count {count} root {root}");
            }
        }
        for root in 0..n {
            let theirs: Vec<T> = (0..count).map(|i| T::of((root * 7 + i) as u32)).collect();
            let send = if rank == root {
                theirs.clone()
            } else {
                Vec::new()
            };
            let mut out = vec![T::of(0); count];
            comm.broadcast(&send, &mut out, root).unwrap();
            assert_eq!(out, theirs, "bcast {name} count {count} root {root}");
            let mut buf = if rank == root {
                theirs.clone()
            } else {
                vec![T::of(0); count]
            };
            comm.broadcast_in_place(&mut buf, root).unwrap();
            assert_eq!(
                buf, theirs,
                "bcast in place {name} count {count} root {root}"
            );
        }
        let block = |r: usize| (0..count).map(move |i| T::of((r * 5 + i) as u32));
        let want: Vec<T> = (0..n).flat_map(block).collect();
        let mut out = vec![T::of(0); n * count];
        comm.all_gather(&block(rank).collect::<Vec<_>>(), &mut out)
            .unwrap();
        assert_eq!(out, want, "allgather {name} count {count}");
        let mut buf = vec![T::of(0); n * count];
        buf[rank * count..(rank + 1) * count].copy_from_slice(&block(rank).collect::<Vec<_>>());
        comm.all_gather_in_place(&mut buf).unwrap();
        assert_eq!(buf, want, "allgather in place {name} count {count}");
        // Block d of rank s's all-to-all input: contribution(s * n + d, i),
        // which rank d finds in its block s; reduce-scatter of the same
        // input gives rank d the reduction of every rank's block d.
        let cell = |s: usize, d: usize, i: usize| contribution(s * n + d, i);
        let send: Vec<T> = (0..n)
            .flat_map(|d| (0..count).map(move |i| T::of(cell(rank, d, i))))
            .collect();
        let want: Vec<T> = (0..n)
            .flat_map(|s| (0..count).map(move |i| T::of(cell(s, rank, i))))
            .collect();
        let mut out = vec![T::of(0); n * count];
        comm.all_to_all(&send, &mut out).unwrap();
        assert_eq!(out, want, "alltoall {name} count {count}");
        for op in [ReduceOp::Sum, ReduceOp::Max] {
            let want: Vec<T> = (0..count)
                .map(|i| {
                    let col = (0..n).map(|s| cell(s, rank, i));
                    T::of(if op == ReduceOp::Sum {
                        col.sum()
                    } else {
                        col.max().unwrap()
                    })
                })
                .collect();
            let mut out = vec![T::of(0); count];
            comm.reduce_scatter(&send, &mut out, op).unwrap();
            assert_eq!(out, want, "reducescatter {op:?} {name} count {count}");
            let mut buf = send.clone();
            comm.reduce_scatter_in_place(&mut buf, op).unwrap();
            assert_eq!(
                &buf[rank * count..(rank + 1) * count],
                &want[..],
                "reducescatter in place {op:?} {name} count {count}"
            );
        }
    }
}

fn small(comm: &Communicator) {
    let (rank, n) = (comm.rank(), comm.size());
    let fast = std::env::var("FERROCOLL_TEST_FAST").is_ok_and(|v| v == "1");
    let nodes = comm.placement().unwrap().nodes();
    // The communicator of this rank's host.
    let node_of = comm.placement().unwrap().node_of[rank];
    let host = comm.split(Some(node_of as u32), 0).unwrap().unwrap();
    assert_eq!(
        comm.uses_fast_path(Collective::AllReduce, 2, DType::F32),
        fast && nodes == 1,
        "rank {rank}: the world communicator's fast path"
    );
    assert_eq!(
        host.uses_fast_path(Collective::AllReduce, 2, DType::F32),
        fast && host.size() > 1,
        "rank {rank}: the host communicator's fast path"
    );
    // Past a slot's payload, up to an eager buffer (16 KiB on 2-4 ranks):
    // still fast; too large, or not a collective the fast path has: not
    // (a reduce-scatter has no path past the eager buffers; 2-rank
    // allreduces do where the single copy is allowed).
    assert_eq!(
        comm.uses_fast_path(Collective::AllReduce, 4096, DType::F32),
        fast && nodes == 1
    );
    assert!(!comm.uses_fast_path(Collective::ReduceScatter, 4097, DType::F32));
    assert_eq!(
        comm.uses_fast_path(Collective::AllToAll, 1, DType::F32),
        fast && nodes == 1
    );
    assert!(!comm.uses_fast_path(Collective::Gather, 1, DType::F32));
    for c in [comm, &host] {
        // Up to the 96 bytes of one slot, and past it through the eager
        // buffers up to their 16 KiB.
        small_calls_of::<f32>(c, 24);
        small_calls_of::<f32>(c, 4096);
        small_calls_of::<i8>(c, 16 << 10);
        small_calls_of::<u64>(c, 1000);
        small_calls_of::<f64>(c, 12);
        small_calls_of::<f16>(c, 48);
        small_calls_of::<bf16>(c, 5);
        small_calls_of::<i8>(c, 96);
        small_calls_of::<i32>(c, 7);
        small_calls_of::<i64>(c, 12);
        small_calls_of::<u8>(c, 9);
        small_calls_of::<u32>(c, 24);
        small_calls_of::<u64>(c, 3);
        // Avg: the sum, divided once.
        let mut v = [c.rank() as f64 + 1.0; 4];
        c.all_reduce_in_place(&mut v, ReduceOp::Avg).unwrap();
        let sum: f64 = (0..c.size()).map(|r| r as f64 + 1.0).sum();
        assert_eq!(v, [sum / c.size() as f64; 4], "avg");
        c.barrier().unwrap();
    }

    // Small and large calls interleaved (fast path, rings), both ways.
    for i in 0..20u64 {
        let mut tiny = [rank as u64 + i; 2];
        comm.all_reduce_in_place(&mut tiny, ReduceOp::Sum).unwrap();
        let want = (0..n as u64).map(|r| r + i).sum::<u64>();
        assert_eq!(tiny, [want; 2], "tiny {i}");
        let mut big = vec![rank as u64 + i; 50_000];
        comm.all_reduce_in_place(&mut big, ReduceOp::Sum).unwrap();
        assert!(big.iter().all(|x| *x == want), "large {i}");
        let mut b = vec![if rank == 0 { i as u32 } else { 0 }; 100_000];
        comm.broadcast_in_place(&mut b, 0).unwrap();
        assert!(b.iter().all(|x| *x == i as u32), "large bcast {i}");
        let mut t = [if rank == n - 1 { i as u32 } else { 0 }];
        comm.broadcast_in_place(&mut t, n - 1).unwrap();
        assert_eq!(t, [i as u32], "tiny bcast {i}");
    }

    // Non-blocking calls in flight (one large on the rings, one small on
    // the fast path) while this thread makes small blocking calls.
    let big = comm.iall_reduce(vec![1.0f32; 300_000], ReduceOp::Sum);
    let tiny = comm.iall_reduce(vec![rank as u64; 3], ReduceOp::Sum);
    let bar = comm.ibarrier();
    for i in 0..50u32 {
        let mut v = [i + rank as u32];
        comm.all_reduce_in_place(&mut v, ReduceOp::Max).unwrap();
        assert_eq!(v, [i + n as u32 - 1]);
    }
    bar.wait().unwrap();
    let tiny = tiny.wait().unwrap();
    assert_eq!(tiny, vec![(n * (n - 1) / 2) as u64; 3]);
    let big = big.wait().unwrap();
    assert!(big.iter().all(|x| *x == n as f32));

    // Point-to-point with tags between small calls, the sender on another
    // thread.
    if n > 1 {
        let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
        let sender = {
            let comm = comm.clone();
            std::thread::spawn(move || {
                comm.send(&[rank as u32; 2], next, 9).unwrap();
                comm.send(&vec![rank as u8; 200_000], next, 10).unwrap();
            })
        };
        let mut v = [1u32];
        comm.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        assert_eq!(v, [n as u32]);
        let mut second = vec![0u8; 200_000];
        comm.recv(&mut second, prev, 10).unwrap();
        let mut first = [0u32; 2];
        comm.recv(&mut first, prev, 9).unwrap();
        sender.join().unwrap();
        assert_eq!(first, [prev as u32; 2]);
        assert!(second.iter().all(|x| *x == prev as u8));
    }

    // Two communicators at once, on two threads: small calls on both.
    let parity = comm.split(Some((rank % 2) as u32), 0).unwrap().unwrap();
    let other = std::thread::spawn(move || {
        for i in 0..200u64 {
            let mut v = [i, parity.rank() as u64];
            parity.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
            let m = parity.size() as u64;
            assert_eq!(v, [i * m, m * (m - 1) / 2], "parity {i}");
        }
    });
    for i in 0..200u64 {
        let mut v = [i];
        comm.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        assert_eq!(v, [i * n as u64], "world {i}");
    }
    other.join().unwrap();

    comm.barrier().unwrap();
    println!("small ok {rank}");
}

fn p2p(comm: &Communicator) {
    let (r, n) = (comm.rank(), comm.size());
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    // Two messages under one tag whose lengths differ: FIFO, not a mismatch.
    if r == 0 {
        comm.send(&[1u8; 50], 1, 0).unwrap();
        comm.send(&[2u8; 51], 1, 0).unwrap();
    } else if r == 1 {
        let (mut a, mut b) = ([0u8; 50], [0u8; 51]);
        comm.recv(&mut a, 0, 0).unwrap();
        comm.recv(&mut b, 0, 0).unwrap();
        assert!(
            a.iter().all(|&x| x == 1) && b.iter().all(|&x| x == 2),
            "FIFO per tag"
        );
    }
    // A ring whose counts change call to call, zero included; the sends run
    // on a thread of their own (a send waits for its receive).
    let counts = [0usize, 1, 1009, 100_003];
    std::thread::scope(|s| {
        s.spawn(|| {
            for (i, &c) in counts.iter().enumerate() {
                let v = vec![(r * 10 + i) as u32; c];
                comm.send(&v, next, 5).unwrap();
            }
        });
        for (i, &c) in counts.iter().enumerate() {
            let mut v = vec![u32::MAX; c];
            comm.recv(&mut v, prev, 5).unwrap();
            assert!(
                v.iter().all(|&x| x == (prev * 10 + i) as u32),
                "ring step {i}"
            );
        }
    });
    // Sends of several threads with different tags, received in the other
    // order.
    if r == 0 {
        std::thread::scope(|s| {
            for tag in 10..14u32 {
                s.spawn(move || comm.send(&[tag as u64; 300], 1, tag).unwrap());
            }
        });
    } else if r == 1 {
        for tag in (10..14u32).rev() {
            let mut v = [0u64; 300];
            comm.recv(&mut v, 0, tag).unwrap();
            assert!(v.iter().all(|&x| x == u64::from(tag)), "tag {tag}");
        }
    }
    // Receives from any source: rank 0 takes one message from every other
    // rank, in whatever order they come, and learns who sent each.
    if r == 0 {
        let mut seen = vec![false; n];
        for _ in 1..n {
            let mut v = [0i32; 3];
            let src = comm.recv_any(&mut v, 9).unwrap();
            assert!(v.iter().all(|&x| x == src as i32 * 7), "payload of {src}");
            assert!(!seen[src], "rank {src} twice");
            seen[src] = true;
        }
    } else {
        comm.send(&[r as i32 * 7; 3], 0, 9).unwrap();
    }
    comm.barrier().unwrap();
    println!("p2p ok");
}

fn api(comm: &Communicator) {
    let (rank, n) = (comm.rank(), comm.size());
    if rank == 0 {
        let p = comm.placement().unwrap();
        println!("nodes={} links={}", p.nodes(), p.links.join(","));
    }
    // In place, every reducing collective with a non-power-of-two count.
    // In a SharedBuffer when the variant asks (read in place by the peers
    // on this host), else on the heap; large enough for the in-place path.
    let count = 100_001;
    let mut v = ferrocoll::SharedBuffer::<i64>::new(count).unwrap();
    let mut heap = vec![0i64; count];
    let v: &mut [i64] = if std::env::var("FERROCOLL_TEST_BUFFERS").is_ok_and(|b| b == "shared") {
        &mut v
    } else {
        &mut heap
    };
    for (i, x) in v.iter_mut().enumerate() {
        *x = i as i64 * (rank as i64 + 1);
    }
    comm.all_reduce_in_place(v, ReduceOp::Sum).unwrap();
    let tri = (n * (n + 1) / 2) as i64;
    assert!(
        v.iter().enumerate().all(|(i, x)| *x == i as i64 * tri),
        "allreduce in place"
    );

    let mut m = vec![rank as f64; 77];
    comm.reduce_in_place(&mut m, ReduceOp::Max, n - 1).unwrap();
    if rank == n - 1 {
        assert!(m.iter().all(|x| *x == (n - 1) as f64), "reduce max");
    }

    let mut g = vec![0u32; 5 * n];
    g[5 * rank..5 * rank + 5].fill(rank as u32 + 7);
    comm.all_gather_in_place(&mut g).unwrap();
    assert!(
        g.chunks(5)
            .enumerate()
            .all(|(r, c)| c.iter().all(|x| *x == r as u32 + 7)),
        "allgather"
    );

    // Zero-length buffers.
    let mut empty: Vec<f32> = Vec::new();
    comm.all_reduce_in_place(&mut empty, ReduceOp::Sum).unwrap();
    comm.broadcast_in_place(&mut empty, 0).unwrap();

    // Uneven alltoallv, with zero counts.
    let sc: Vec<usize> = (0..n).map(|d| (rank + 2 * d) % 3).collect();
    let rc: Vec<usize> = (0..n).map(|s| (s + 2 * rank) % 3).collect();
    let send: Vec<u32> = (0..n)
        .flat_map(|d| vec![(rank * 100 + d) as u32; sc[d]])
        .collect();
    let mut recv = vec![0u32; rc.iter().sum()];
    comm.all_to_all_v(&send, &sc, &mut recv, &rc).unwrap();
    let want: Vec<u32> = (0..n)
        .flat_map(|s| vec![(s * 100 + rank) as u32; rc[s]])
        .collect();
    assert_eq!(recv, want, "alltoallv");

    // Two non-blocking calls in flight at once, waited in reverse order.
    let a = comm.iall_reduce(vec![1.0f32; 100_000], ReduceOp::Sum);
    let b = comm.iall_reduce(vec![2i32; 3], ReduceOp::Prod);
    let b = b.wait().unwrap();
    let a = a.wait().unwrap();
    assert!(a.iter().all(|x| *x == n as f32) && b.iter().all(|x| *x == 2i32.pow(n as u32)));

    // Persistent collectives equal the plain calls: small ones on the fast
    // path where it serves (resolved once, at init), large ones on plans;
    // two started at once beside a non-blocking call, then run inline.
    for len in [2usize, 100_003] {
        let mine: Vec<i64> = (0..len as i64).map(|i| i * 3 + rank as i64).collect();
        let mut want = vec![0i64; len];
        comm.all_reduce(&mine, &mut want, ReduceOp::Sum).unwrap();
        let mut gathered = vec![0i64; n * len];
        comm.all_gather(&mine, &mut gathered).unwrap();
        let mut p = comm.all_reduce_init(mine.clone(), ReduceOp::Sum).unwrap();
        let fast = comm.uses_fast_path(Collective::AllReduce, len, DType::I64);
        assert_eq!(
            p.algorithm().is_none(),
            fast,
            "persistent allreduce of {len}"
        );
        let mut g = comm.all_gather_init(mine.clone()).unwrap();
        let other = comm.iall_reduce(vec![1u8; 3], ReduceOp::Sum);
        let (sp, sg) = (p.start().unwrap(), g.start().unwrap());
        sg.wait().unwrap();
        sp.wait().unwrap();
        assert_eq!(other.wait().unwrap(), vec![n as u8; 3]);
        assert_eq!(p.recv(), &want[..], "persistent allreduce of {len}");
        assert_eq!(g.recv(), &gathered[..], "persistent allgather of {len}");
        p.send_mut().copy_from_slice(&mine);
        p.run().unwrap();
        assert_eq!(p.recv(), &want[..], "persistent allreduce of {len}, run");
        let mut b = comm.broadcast_init(vec![rank as i64; len], n - 1).unwrap();
        b.run().unwrap();
        assert!(b.recv().iter().all(|x| *x == (n - 1) as i64), "bcast {len}");
        let blocks = vec![rank as i64 + 1; n * len];
        let mut s = comm.reduce_scatter_init(blocks, ReduceOp::Sum).unwrap();
        s.start().unwrap().wait().unwrap();
        let total = (n * (n + 1) / 2) as i64;
        assert!(s.recv().iter().all(|x| *x == total), "reducescatter {len}");
    }

    // Point-to-point around the ring, tags received out of order.
    if n > 1 {
        let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
        let big: Vec<u8> = (0..300_000).map(|i| (i % 251) as u8 ^ rank as u8).collect();
        let sender = {
            let comm = comm.clone();
            std::thread::spawn(move || {
                comm.send(&[rank as u32; 4], next, 1).unwrap();
                comm.send(&big, next, 2).unwrap();
            })
        };
        let mut second = vec![0u8; 300_000];
        comm.recv(&mut second, prev, 2).unwrap();
        let mut first = [0u32; 4];
        comm.recv(&mut first, prev, 1).unwrap();
        sender.join().unwrap();
        assert_eq!(first, [prev as u32; 4]);
        assert!(second
            .iter()
            .enumerate()
            .all(|(i, x)| *x == (i % 251) as u8 ^ prev as u8));
    }

    // Split into even and odd ranks and reduce within each.
    let half = comm.split(Some((rank % 2) as u32), 0).unwrap().unwrap();
    let mut h = [rank as u64];
    half.all_reduce_in_place(&mut h, ReduceOp::Sum).unwrap();
    let want: u64 = (0..n).filter(|r| r % 2 == rank % 2).map(|r| r as u64).sum();
    assert_eq!(h[0], want, "split");

    comm.barrier().unwrap();
    println!("api ok {rank}");
}

/// Bucketed gradients (several caps, gradients arriving in a different order
/// on every rank, three steps) against one plain allreduce per parameter,
/// and the sharded layers' gathers and gradient shards against the full
/// layers; integer-valued floats so that every summation order agrees to
/// the bit.
fn bucket(comm: &Communicator) {
    use ferrocoll::bucket::{BucketCap, GradientBucketer, ShardedLayers};
    let (r, n) = (comm.rank(), comm.size());
    // Zero-length, tiny and 300,001-element parameters.
    let sizes = [3usize, 0, 1000, 7, 300_001, 64, 1, 5000];
    let grad = |step: usize, p: usize, j: usize| (r * 1000 + p * 10 + step + j % 7) as f32;
    for cap in [
        BucketCap::default(),
        BucketCap::Bytes {
            cap: 4096,
            first: 100,
        },
        BucketCap::Bytes { cap: 1, first: 1 },
        BucketCap::Auto,
    ] {
        let mut bucketer = GradientBucketer::new(comm, &sizes, cap);
        for step in 0..3 {
            // Reverse order, as autograd; every rank rotates it differently.
            let mut order: Vec<usize> = (0..sizes.len()).rev().collect();
            order.rotate_left((r + step) % sizes.len());
            for &p in &order {
                let g: Vec<f32> = (0..sizes[p]).map(|j| grad(step, p, j)).collect();
                bucketer.ready(p, &g).unwrap();
            }
            let mut out: Vec<Vec<f32>> = sizes.iter().map(|&s| vec![f32::NAN; s]).collect();
            let mut views: Vec<&mut [f32]> = out.iter_mut().map(|v| v.as_mut_slice()).collect();
            bucketer.finish(&mut views).unwrap();
            for (p, got) in out.iter().enumerate() {
                let mut want: Vec<f32> = (0..sizes[p]).map(|j| grad(step, p, j)).collect();
                comm.all_reduce_in_place(&mut want, ReduceOp::Avg).unwrap();
                assert_eq!(got, &want, "{cap:?} step {step} parameter {p}");
            }
        }
        // A missing gradient is an error, and the next step still works.
        for (p, &size) in sizes.iter().enumerate().skip(1) {
            bucketer.ready(p, &vec![0.0; size]).unwrap();
        }
        let mut out: Vec<Vec<f32>> = sizes.iter().map(|&s| vec![0.0; s]).collect();
        let mut views: Vec<&mut [f32]> = out.iter_mut().map(|v| v.as_mut_slice()).collect();
        let e = bucketer.finish(&mut views).unwrap_err();
        assert!(e.to_string().contains("parameter 0"), "{e}");
        assert!(bucketer.ready(0, &[1.0]).is_err(), "wrong length");
    }

    let layers: Vec<Vec<f32>> = [5usize, 0, 1001, 64]
        .iter()
        .enumerate()
        .map(|(l, &len)| (0..len).map(|j| (l * 100 + j) as f32).collect())
        .collect();
    let mut sharded = ShardedLayers::new(comm, &layers);
    for l in 0..layers.len() {
        let next = (l + 1 < layers.len()).then_some(l + 1);
        assert_eq!(sharded.gather(l, next).unwrap(), layers[l], "layer {l}");
    }
    for l in (0..layers.len()).rev() {
        let g: Vec<f32> = layers[l].iter().map(|x| x + r as f32).collect();
        sharded.reduce_gradient(l, g).unwrap();
    }
    let shards = sharded.finish_backward().unwrap();
    for (l, shard) in shards {
        let per = layers[l].len().div_ceil(n);
        // The average of x + r over the ranks is x + (n-1)/2.
        let mean = (n - 1) as f32 / 2.0;
        for (k, got) in shard.iter().enumerate() {
            let j = r * per + k;
            let want = layers[l].get(j).map_or(0.0, |x| x + mean);
            assert_eq!(*got, want, "layer {l} element {j}");
        }
    }
    println!("bucket ok");
}
