//! `FERROCOLL_COMPRESS`: the transparent compressed allreduce that `auto`
//! uses only where the cost model predicts a gain (issue 17, items 4 and
//! 7), on threads: with the communicator's own profile (built in, or the
//! calibrated file) compression stays off at every size; with a profile of
//! a 1 Gbit/s link, loaded from a file through `FERROCOLL_PROFILE` as
//! calibrated profiles are, it is on for large calls and off for small
//! ones, and what runs is the compressed allreduce (its results are
//! `Compressor`'s, bit for bit).

use std::collections::HashMap;
use std::path::PathBuf;

use ferrocoll::compress::{CompressOptions, CompressSetting, Compressor};
use ferrocoll::cost::{Profile, ProfileFile};
use ferrocoll::{local, CallOptions, Communicator, Config, DType, ReduceOp};

/// Rank `rank`'s data: values of many magnitudes, so that int8's rounding
/// shows in every block.
fn data(rank: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7919 + rank * 104_729) % 1000) as f32 * 0.013 - 6.0)
        .collect()
}

/// Config read from `vars`, as `init` would read the environment.
fn config(vars: &[(&str, &str)]) -> Config {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Config::from_vars(&move |name: &str| map.get(name).cloned()).unwrap()
}

/// Runs `f` on `n` ranks as threads with the configuration `vars` give,
/// and every rank's result (panicking on any rank's error).
fn on_ranks<R: Send>(
    n: usize,
    vars: &[(&str, &str)],
    f: impl Fn(Communicator) -> ferrocoll::Result<R> + Send + Sync,
) -> Vec<R> {
    local::run_with(n, config(vars), f)
        .unwrap()
        .into_iter()
        .map(|r| r.unwrap())
        .collect()
}

/// The exact 2-rank sum (one f32 addition per element, as any algorithm
/// does it).
fn exact_sum(len: usize) -> Vec<f32> {
    let (a, b) = (data(0, len), data(1, len));
    a.iter().zip(&b).map(|(x, y)| x + y).collect()
}

#[test]
fn the_default_profile_keeps_int8_off_at_every_size_on_two_ranks() {
    let results = on_ranks(2, &[("FERROCOLL_COMPRESS", "auto:int8")], |comm| {
        // The decision at every size up to 1 GiB...
        let mut size = 4usize;
        while size <= 1 << 30 {
            let codec = comm.compresses(DType::F32, size / 4, ReduceOp::Sum)?;
            assert_eq!(codec, None, "{size} B on {:?}", comm.profile());
            size *= 4;
        }
        // ... and what runs: the exact sum, which int8 cannot give on this
        // data.
        for len in [1usize, 1000, 1 << 16, 1 << 20] {
            let send = data(comm.rank(), len);
            let mut recv = vec![0f32; len];
            comm.all_reduce(&send, &mut recv, ReduceOp::Sum)?;
            assert!(
                recv == exact_sum(len),
                "{len} elements were not summed exactly"
            );
        }
        Ok(())
    });
    assert_eq!(results.len(), 2);
}

/// A temporary profile file, removed on drop.
struct TempProfile(PathBuf);

impl TempProfile {
    /// The built-in profile with its links at `beta` bytes per second and
    /// no cache regime, written as `ferrocoll calibrate` writes profiles.
    fn with_beta(name: &str, beta: f64) -> TempProfile {
        let mut profile = Profile::thread_default();
        profile.intra.beta = beta;
        profile.inter.beta = beta;
        profile.beta_mem = 0.0;
        let file = ProfileFile {
            transport: "thread".into(),
            profile,
            r2: 1.0,
            geomean_error: 0.0,
            points: 0,
            algorithm_errors: Vec::new(),
        };
        let path = std::env::temp_dir().join(format!(
            "ferrocoll-compress-auto-{name}-{}.json",
            std::process::id()
        ));
        std::fs::write(&path, serde_json::to_vec(&file).unwrap()).unwrap();
        TempProfile(path)
    }
}

impl Drop for TempProfile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// What `Compressor` (no error feedback, compression off on its own calls)
/// gives for `send` on `comm`.
fn reference(comm: &Communicator, send: &[f32], codec: &str, op: ReduceOp) -> Vec<f32> {
    let plain = comm.with_options(CallOptions::default().compress(CompressSetting::Off));
    let options = CompressOptions {
        error_feedback: Some(false),
        hierarchical: None,
    };
    let mut c = Compressor::with_options(&plain, send.len(), codec, options).unwrap();
    let mut out = vec![0f32; send.len()];
    c.all_reduce_into(send, &mut out, op).unwrap();
    out
}

#[test]
fn a_one_gigabit_link_turns_int8_on_for_large_calls_and_off_for_small_ones() {
    let file = TempProfile::with_beta("1gbit", 125e6);
    let path = file.0.to_str().unwrap().to_string();
    let results = on_ranks(
        2,
        &[
            ("FERROCOLL_COMPRESS", "auto:int8"),
            ("FERROCOLL_PROFILE", &path),
        ],
        |comm| {
            let small = 4usize;
            let large = 1usize << 20;
            assert_eq!(comm.compresses(DType::F32, small, ReduceOp::Sum)?, None);
            assert_eq!(
                comm.compresses(DType::F32, large, ReduceOp::Avg)?
                    .as_deref(),
                Some("int8:128")
            );
            // Never for what the codecs cannot carry.
            assert_eq!(comm.compresses(DType::F64, large, ReduceOp::Sum)?, None);
            assert_eq!(comm.compresses(DType::F32, large, ReduceOp::Max)?, None);
            let ring = comm.with_options(CallOptions::algorithm(ferrocoll::Algorithm::Ring));
            assert_eq!(ring.compresses(DType::F32, large, ReduceOp::Sum)?, None);

            // Small: the exact sum.
            let send = data(comm.rank(), small);
            let mut recv = vec![0f32; small];
            comm.all_reduce(&send, &mut recv, ReduceOp::Sum)?;
            assert!(recv == exact_sum(small));

            // Large, out of place and in place: the compressed allreduce's
            // result, bit for bit, and fewer bytes on the wire than a ring's.
            for op in [ReduceOp::Sum, ReduceOp::Avg] {
                let send = data(comm.rank(), large);
                let want = reference(&comm, &send, "int8:128", op);
                let before = comm.bytes_sent();
                let mut recv = vec![0f32; large];
                comm.all_reduce(&send, &mut recv, op)?;
                let sent = comm.bytes_sent() - before;
                assert!(recv == want, "{op}: not the compressed allreduce's result");
                assert!(recv != exact_sum(large), "{op}: int8 cannot be exact here");
                assert!(sent > 0 && sent < (4 * large / 2) as u64, "{sent} B sent");
                let mut buf = send.clone();
                comm.all_reduce_in_place(&mut buf, op)?;
                assert!(buf == want, "{op}: in place differs");
            }
            Ok(())
        },
    );
    assert_eq!(results.len(), 2);
}

#[test]
fn a_forced_codec_compresses_every_eligible_call_and_randk_moves_its_positions() {
    let results = on_ranks(3, &[("FERROCOLL_COMPRESS", "randk:0.5:3")], |comm| {
        let len = 64;
        assert_eq!(
            comm.compresses(DType::F32, len, ReduceOp::Sum)?.as_deref(),
            Some("randk:0.5:3")
        );
        let ones = vec![1f32; len];
        let mut kept = Vec::new();
        for _ in 0..2 {
            let mut out = vec![0f32; len];
            comm.all_reduce(&ones, &mut out, ReduceOp::Sum)?;
            // Random-k keeps half the positions, rescaled by 2: 6 or 0.
            assert!(out.iter().all(|&x| x == 0.0 || x == 6.0), "{out:?}");
            kept.push(out.iter().map(|&x| x != 0.0).collect::<Vec<_>>());
        }
        assert_ne!(kept[0], kept[1], "every call must draw new positions");
        // Integers are never compressed.
        let mut ints = vec![0i32; len];
        comm.all_reduce(&vec![1i32; len], &mut ints, ReduceOp::Sum)?;
        assert!(ints.iter().all(|&x| x == 3));
        Ok(kept)
    });
    for r in &results {
        assert_eq!(r, &results[0], "every rank kept the same positions");
    }
}

#[test]
fn nonblocking_calls_take_the_compressed_path_alongside_blocking_ones() {
    let results = on_ranks(2, &[("FERROCOLL_COMPRESS", "fp16")], |comm| {
        let len = 1000;
        let pending: Vec<_> = (0..3)
            .map(|k| comm.iall_reduce(vec![k as f32 + 0.5; len], ReduceOp::Sum))
            .collect();
        let mut blocking = vec![0f32; len];
        comm.all_reduce(&vec![0.25f32; len], &mut blocking, ReduceOp::Sum)?;
        assert!(blocking.iter().all(|&x| x == 0.5));
        for (k, p) in pending.into_iter().enumerate() {
            let got = p.wait()?;
            assert!(got.iter().all(|&x| x == 2.0 * (k as f32 + 0.5)), "{k}");
        }
        Ok(())
    });
    assert_eq!(results.len(), 2);
}

#[test]
fn check_vars_refuses_bad_settings_listing_the_valid_forms() {
    for bad in [
        "auto",
        "auto:zip",
        "int8:0",
        "auto:topk:2.5",
        "powersgd:4",
        "yes",
    ] {
        let vars = |name: &str| (name == "FERROCOLL_COMPRESS").then(|| bad.to_string());
        let err = ferrocoll::init::check_vars(&vars).unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(err, ferrocoll::Error::Config { .. }),
            "{bad}: {msg}"
        );
        for form in [
            "FERROCOLL_COMPRESS",
            "off",
            "auto:CODEC",
            "int8[:BLOCK]",
            "topk:K",
        ] {
            assert!(msg.contains(form), "{bad}: {msg} lacks {form}");
        }
    }
    let vars = |name: &str| (name == "FERROCOLL_COMPRESS").then(|| "auto:int8".to_string());
    ferrocoll::init::check_vars(&vars).unwrap();
}
