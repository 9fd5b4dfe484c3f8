//! The compressed collectives (`ferrocoll::compress::Compressor`) with
//! ranks as processes, over shared memory and TCP with 2, 3 and 4 ranks,
//! against the local reference that tests/compress_collective.rs of the
//! library checks thread ranks with (`crates/ferrocoll/tests/
//! compress_support`): every codec, uneven and empty buffers, sum and
//! mean, every rank's result bitwise the same; and the hierarchical form
//! on 4 ranks given the topology 2x2 (`FERROCOLL_TOPO`).
//!
//! This file is its own rank program (harness = false): with
//! `FERROCOLL_TEST_ROLE` set it plays one rank.

mod common;
use common::{show, ROLE};

#[path = "../../ferrocoll/tests/compress_support/mod.rs"]
mod compress_support;
use compress_support::{check_hier_rank, check_rank, SPECS};

use ferrocoll::compress::{CompressOptions, CompressSetting, Compressor};
use ferrocoll::{CallOptions, DType, ReduceOp};

fn main() {
    if let Ok(role) = std::env::var(ROLE) {
        let comm = ferrocoll::init().expect("init");
        match role.as_str() {
            "compress" => rank_program(&comm),
            "compress-hier" => hier_program(&comm),
            "compress-auto-off" => auto_off_program(&comm),
            "compress-auto-on" => auto_on_program(&comm),
            other => panic!("unknown role {other}"),
        }
        return;
    }
    let tests: [(&str, fn()); 3] = [
        (
            "auto_compression_is_off_on_shm_and_on_over_a_slow_profile",
            auto_compression_is_off_on_shm_and_on_over_a_slow_profile,
        ),
        ("every_codec_on_shm_and_tcp", every_codec_on_shm_and_tcp),
        (
            "the_hierarchical_form_on_shm_and_tcp",
            the_hierarchical_form_on_shm_and_tcp,
        ),
    ];
    common::run_tests(&tests, "compress multi-process");
}

fn rank_program(comm: &ferrocoll::Communicator) {
    for &spec in SPECS {
        for (len, op) in [
            (0, ReduceOp::Sum),
            (7, ReduceOp::Sum),
            (1000, ReduceOp::Avg),
            (70_001, ReduceOp::Sum),
        ] {
            if let Err(e) = check_rank(comm, spec, len, 2, op) {
                panic!("{} transport: {e}", comm.transport_name());
            }
        }
    }
    println!("compress ok");
}

fn every_codec_on_shm_and_tcp() {
    for transport in ["shm", "tcp"] {
        for n in [2, 3, 4] {
            let outs = common::direct_world("compress", n, "compress", transport, &[]);
            for (r, out) in outs.iter().enumerate() {
                let what = format!("compress over {transport}, n = {n}, rank {r}");
                assert!(out.status.success(), "{what}: {}", show(out));
                let text = String::from_utf8_lossy(&out.stdout);
                assert!(text.contains("compress ok"), "{what}: {}", show(out));
            }
        }
    }
}

fn hier_program(comm: &ferrocoll::Communicator) {
    let topo = comm.topology();
    let shape = (topo.nodes(), topo.local_size());
    for spec in ["int8:128", "onebit:64", "topk:0.01", "bf16"] {
        for (len, op) in [(7, ReduceOp::Sum), (70_001, ReduceOp::Avg)] {
            if let Err(e) = check_hier_rank(comm, spec, shape, len, 2, op) {
                panic!("{} transport: {e}", comm.transport_name());
            }
        }
    }
    println!("compress-hier ok");
}

fn the_hierarchical_form_on_shm_and_tcp() {
    for transport in ["shm", "tcp"] {
        let env = [("FERROCOLL_TOPO", "2x2")];
        let outs = common::direct_world("compress-hier", 4, "compress-hier", transport, &env);
        for (r, out) in outs.iter().enumerate() {
            let what = format!("hierarchical compress over {transport}, rank {r}");
            assert!(out.status.success(), "{what}: {}", show(out));
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(text.contains("compress-hier ok"), "{what}: {}", show(out));
        }
    }
}

/// Rank `rank`'s data for the `FERROCOLL_COMPRESS` programs: values of many
/// magnitudes, so that int8's rounding shows in every block.
fn auto_data(rank: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7919 + rank * 104_729) % 1000) as f32 * 0.013 - 6.0)
        .collect()
}

/// The exact sum of the 2 ranks' data.
fn auto_exact(len: usize) -> Vec<f32> {
    let (a, b) = (auto_data(0, len), auto_data(1, len));
    a.iter().zip(&b).map(|(x, y)| x + y).collect()
}

/// `FERROCOLL_COMPRESS=auto:int8` on shared memory with the shm profile
/// (rank 0's calibrated one, else built in): off at every size, and every
/// allreduce the exact sum.
fn auto_off_program(comm: &ferrocoll::Communicator) {
    let mut bytes = 4usize;
    while bytes <= 1 << 30 {
        let codec = comm
            .compresses(DType::F32, bytes / 4, ReduceOp::Sum)
            .unwrap();
        assert_eq!(codec, None, "{bytes} B on {:?}", comm.profile());
        bytes *= 4;
    }
    for len in [1usize, 24, 1000, 1 << 20] {
        let send = auto_data(comm.rank(), len);
        let mut recv = vec![0f32; len];
        comm.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap();
        assert!(recv == auto_exact(len), "{len} elements not summed exactly");
    }
    println!("compress-auto-off ok");
}

/// The same over a profile of a 1 Gbit/s link: small calls uncompressed,
/// large ones compressed, with `Compressor`'s result bit for bit.
fn auto_on_program(comm: &ferrocoll::Communicator) {
    let large = 1usize << 20;
    assert_eq!(comm.compresses(DType::F32, 4, ReduceOp::Sum).unwrap(), None);
    let codec = comm.compresses(DType::F32, large, ReduceOp::Sum).unwrap();
    assert_eq!(codec.as_deref(), Some("int8:128"));
    let send = auto_data(comm.rank(), 4);
    let mut recv = vec![0f32; 4];
    comm.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap();
    assert!(recv == auto_exact(4));
    let send = auto_data(comm.rank(), large);
    let plain = comm.with_options(CallOptions::default().compress(CompressSetting::Off));
    let options = CompressOptions {
        error_feedback: Some(false),
        hierarchical: None,
    };
    let mut c = Compressor::with_options(&plain, large, "int8:128", options).unwrap();
    let mut want = vec![0f32; large];
    c.all_reduce_into(&send, &mut want, ReduceOp::Sum).unwrap();
    let mut got = vec![0f32; large];
    comm.all_reduce(&send, &mut got, ReduceOp::Sum).unwrap();
    assert!(got == want, "not the compressed allreduce's result");
    assert!(got != auto_exact(large), "int8 cannot be exact here");
    println!("compress-auto-on ok");
}

fn auto_compression_is_off_on_shm_and_on_over_a_slow_profile() {
    let mut profile = ferrocoll::cost::Profile::thread_default();
    profile.intra.beta = 125e6;
    profile.inter.beta = 125e6;
    profile.beta_mem = 0.0;
    let file = ferrocoll::cost::ProfileFile {
        transport: "shm".into(),
        profile,
        r2: 1.0,
        geomean_error: 0.0,
        points: 0,
        algorithm_errors: Vec::new(),
    };
    let path =
        std::env::temp_dir().join(format!("ferrocoll-auto-1gbit-{}.json", std::process::id()));
    std::fs::write(&path, serde_json::to_vec(&file).unwrap()).unwrap();
    let slow = path.to_str().unwrap();
    for (role, env) in [
        (
            "compress-auto-off",
            vec![("FERROCOLL_COMPRESS", "auto:int8")],
        ),
        (
            "compress-auto-on",
            vec![
                ("FERROCOLL_COMPRESS", "auto:int8"),
                ("FERROCOLL_PROFILE", slow),
            ],
        ),
    ] {
        let outs = common::direct_world(role, 2, role, "shm", &env);
        for (r, out) in outs.iter().enumerate() {
            let what = format!("{role} over shm, rank {r}");
            assert!(out.status.success(), "{what}: {}", show(out));
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                text.contains(&format!("{role} ok")),
                "{what}: {}",
                show(out)
            );
        }
    }
    let _ = std::fs::remove_file(&path);
}
