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

use ferrocoll::ReduceOp;

fn main() {
    if let Ok(role) = std::env::var(ROLE) {
        let comm = ferrocoll::init().expect("init");
        match role.as_str() {
            "compress" => rank_program(&comm),
            "compress-hier" => hier_program(&comm),
            other => panic!("unknown role {other}"),
        }
        return;
    }
    let tests: [(&str, fn()); 2] = [
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
