//! The compressed collectives (`ferrocoll::compress::Compressor`) on ranks
//! as threads: every codec against the local reference of
//! `compress_support` for every group size 1..=9, uneven and empty
//! buffers, several steps (so the residuals matter), sum and mean; what
//! error feedback keeps; Random-k's mean over many steps; the bytes of the
//! stats; and the errors.

mod compress_support;

use compress_support::{check_hier_rank, check_rank, input, with_feedback, LENS, SPECS};
use ferrocoll::compress::{CompressOptions, Compressor};
use ferrocoll::{local, Config, ReduceOp, Topology};

/// Runs `check_rank` on `n` thread ranks; panics with the first failure.
fn check(n: usize, spec: &str, len: usize, steps: u64, op: ReduceOp) {
    for outcome in local::run(n, |comm| check_rank(&comm, spec, len, steps, op)).unwrap() {
        outcome.unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn every_codec_matches_the_reference_on_1_to_9_ranks() {
    for &spec in SPECS {
        for n in 1..=9 {
            for &len in LENS {
                check(n, spec, len, 3, ReduceOp::Sum);
            }
        }
    }
}

#[test]
fn the_mean_matches_the_reference() {
    for &spec in SPECS {
        for n in [2, 3, 5] {
            check(n, spec, 1000, 2, ReduceOp::Avg);
        }
    }
}

#[test]
fn large_buffers_with_many_blocks_match_the_reference() {
    // More than one 65,536-element Top-k block, and blocks of 256.
    for spec in [
        "int8:256",
        "onebit:128",
        "topk:0.01",
        "bf16",
        "randk:0.01:3",
    ] {
        check(4, spec, 200_003, 2, ReduceOp::Sum);
    }
}

/// Over several steps, what the ranks were given equals what the
/// allreduce delivered plus what the residuals still hold: the ranks' own
/// (of the whole buffer; in the hierarchical form, of their piece of the
/// node's sum) and, for the two-phase algorithm, the server-side ones of
/// the chunks.
#[test]
fn error_feedback_delays_and_loses_nothing() {
    let flat = [
        "int8:64",
        "onebit:64",
        "topk:0.05",
        "randk:0.1:5:unscaled",
        "fp16",
    ];
    for (spec, shape) in flat
        .iter()
        .map(|s| (*s, None))
        .chain(["int8:64", "onebit:64", "topk:0.05"].map(|s| (s, Some((2, 2)))))
    {
        let (len, steps) = (1000, 6);
        let rank_part = |comm: ferrocoll::Communicator| {
            let mut c = Compressor::new(&comm, len, spec).unwrap();
            assert_eq!(c.hierarchical(), shape.is_some());
            let mut delivered = vec![0f64; len];
            for step in 0..steps {
                let mut buf = input(comm.rank(), step, len);
                c.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
                delivered
                    .iter_mut()
                    .zip(&buf)
                    .for_each(|(d, v)| *d += *v as f64);
            }
            let mut kept = vec![0f64; len];
            kept[c.residual_range()]
                .iter_mut()
                .zip(c.residual().unwrap())
                .for_each(|(k, r)| *k += *r as f64);
            if let Some(server) = c.server_residual() {
                kept[c.chunk(comm.rank())]
                    .iter_mut()
                    .zip(server)
                    .for_each(|(k, s)| *k += *s as f64);
            }
            (delivered, kept)
        };
        let outcomes = match shape {
            None => local::run(3, rank_part).unwrap(),
            Some(shape) => run_on(shape, rank_part),
        };
        let n = outcomes.len();
        for i in 0..len {
            let given: f64 = (0..n)
                .flat_map(|r| (0..steps).map(move |s| input(r, s, len)[i] as f64))
                .sum();
            let kept: f64 = outcomes.iter().map(|(_, k)| k[i]).sum();
            let delivered = outcomes[0].0[i];
            assert!(
                (delivered + kept - given).abs() < 1e-3 * (1.0 + given.abs()),
                "{spec} {shape:?}: element {i}: delivered {delivered} + kept {kept} != given {given}"
            );
        }
    }
}

/// Without error feedback Top-k drops the small elements every step, and
/// the gap between the delivered and the given totals grows with the
/// steps; with it they arrive later, and the gap stays the size of the
/// residual (measured: about 835 against 15,064 after 400 steps).
#[test]
fn error_feedback_brings_what_topk_drops() {
    let (n, len, steps) = (2, 500, 400);
    let error = |on: bool| {
        let runs = local::run(n, |comm| {
            let mut c = with_feedback(&comm, len, "topk:0.02", on);
            let mut delivered = vec![0f64; len];
            for _ in 0..steps {
                let mut buf = input(comm.rank(), 0, len);
                c.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
                delivered
                    .iter_mut()
                    .zip(&buf)
                    .for_each(|(d, v)| *d += *v as f64);
            }
            delivered
        })
        .unwrap();
        let delivered = &runs[0];
        (0..len)
            .map(|i| {
                let given: f64 = (0..n).map(|r| input(r, 0, len)[i] as f64).sum::<f64>();
                (delivered[i] - steps as f64 * given).powi(2)
            })
            .sum::<f64>()
            .sqrt()
    };
    let (with, without) = (error(true), error(false));
    assert!(with * 10.0 < without, "with EF {with}, without {without}");
}

/// Random-k rescaled is unbiased: the mean of its allreduce over many
/// steps (new positions each) converges to the true sum, with the error
/// shrinking as the steps grow.
#[test]
fn random_k_mean_over_many_seeds_converges_to_the_sum() {
    let (n, len) = (3, 200);
    let truth: Vec<f64> = (0..len)
        .map(|i| (0..n).map(|r| input(r, 0, len)[i] as f64).sum())
        .collect();
    let runs = local::run(n, |comm| {
        let mut c = Compressor::new(&comm, len, "randk:0.1:11").unwrap();
        assert!(!c.error_feedback());
        let mut mean = vec![0f64; len];
        let mut errors = Vec::new();
        for step in 1..=4000u64 {
            let mut buf = input(comm.rank(), 0, len);
            c.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
            mean.iter_mut().zip(&buf).for_each(|(m, v)| *m += *v as f64);
            if step == 40 || step == 4000 {
                let rms = (0..len)
                    .map(|i| (mean[i] / step as f64 - truth[i]).powi(2))
                    .sum::<f64>()
                    / len as f64;
                errors.push(rms.sqrt());
            }
        }
        errors
    })
    .unwrap();
    let errors = &runs[0];
    let scale = (truth.iter().map(|t| t * t).sum::<f64>() / len as f64).sqrt();
    // 100x the steps: about 10x less error (1/sqrt(steps)).
    assert!(errors[1] < errors[0] / 4.0, "{errors:?}");
    assert!(errors[1] < 0.1 * scale, "{errors:?} against rms {scale}");
}

#[test]
fn wire_bytes_follow_the_formulas() {
    let (n, len) = (4, 4096);
    let runs = local::run(n, |comm| {
        let mut stats = Vec::new();
        for spec in [
            "fp16",
            "int8:128",
            "topk:0.01",
            "randk:0.01:1",
            "powersgd:4",
        ] {
            let mut c = Compressor::new(&comm, len, spec).unwrap();
            let mut buf = input(comm.rank(), 0, len);
            stats.push((spec, c.all_reduce(&mut buf, ReduceOp::Sum).unwrap()));
        }
        stats
    })
    .unwrap();
    for (spec, s) in &runs[0] {
        let want = match *spec {
            // Two phases, each (n-1)/n of the encoded buffer.
            "fp16" => 2 * 3 * 2048,
            "int8:128" => 2 * 3 * (1024 + 4 * 8),
            // (n-1) allgathered payloads: one block count, 41 values and
            // indices.
            "topk:0.01" => 3 * (4 + 6 * 41),
            // A ring's share of 41 values.
            "randk:0.01:1" => 2 * 3 * 4 * 41 / 4,
            // 64 x 64, rank 4: P and Q of 64 x 4 each.
            "powersgd:4" => 2 * (2 * 3 * 4 * 256 / 4),
            _ => unreachable!(),
        };
        assert_eq!(s.sent_bytes, want, "{spec}: {s:?}");
        assert_eq!(s.input_bytes, 4 * len);
        assert!(s.measured_bytes > 0, "{spec}: {s:?}");
    }
}

#[test]
fn errors_say_what_to_fix() {
    let runs = local::run(2, |comm| {
        let mut c = Compressor::new(&comm, 10, "int8").unwrap();
        let mut messages = vec![
            c.all_reduce(&mut [0.0; 9], ReduceOp::Sum)
                .unwrap_err()
                .to_string(),
            c.all_reduce(&mut [0.0; 10], ReduceOp::Max)
                .unwrap_err()
                .to_string(),
            c.reduce_scatter(&[0.0; 10], &mut [0.0; 3], ReduceOp::Sum)
                .unwrap_err()
                .to_string(),
        ];
        let options = CompressOptions {
            error_feedback: Some(true),
            ..CompressOptions::default()
        };
        messages.push(
            Compressor::with_options(&comm, 10, "randk:0.1", options)
                .unwrap_err()
                .to_string(),
        );
        messages.push(Compressor::new(&comm, 10, "zip").unwrap_err().to_string());
        messages.push(
            Compressor::new(&comm, 10, "powersgd:2:3x3")
                .unwrap_err()
                .to_string(),
        );
        messages
    })
    .unwrap();
    let m = &runs[0];
    assert!(m[0].contains("made for 10 elements"), "{}", m[0]);
    assert!(
        m[1].contains("max") && m[1].contains("sum or avg"),
        "{}",
        m[1]
    );
    assert!(m[2].contains("Compressor::chunk"), "{}", m[2]);
    assert!(m[3].contains("unscaled"), "{}", m[3]);
    assert!(m[4].contains("powersgd"), "{}", m[4]);
    assert!(m[5].contains("3 x 3"), "{}", m[5]);
}

#[test]
fn names_and_algorithms() {
    local::run(1, |comm| {
        for (spec, name, algo) in [
            ("int8", "int8:128", "two-phase"),
            ("topk:1%", "topk:0.01", "allgather"),
            ("randk:0.5:3", "randk:0.5:3", "allreduce-values"),
            ("powersgd:4", "powersgd:4:64x64", "powersgd"),
            ("powersgd:2:32x128:5", "powersgd:2:32x128:5", "powersgd"),
        ] {
            let c = Compressor::new(&comm, 4096, spec).unwrap();
            assert_eq!((c.name().as_str(), c.algorithm()), (name, algo));
        }
    })
    .unwrap();
}

/// The counter the stats read: a ring allreduce sends `2 (n-1)/n` of the
/// buffer from every rank, and a lone rank sends nothing.
#[test]
fn bytes_sent_counts_the_payload_handed_to_the_transport() {
    use ferrocoll::{Algorithm, CallOptions};
    let counted = local::run(4, |comm| {
        let ring = comm.with_options(CallOptions::algorithm(Algorithm::Ring));
        let before = comm.bytes_sent();
        let mut buf = vec![1f32; 1000];
        ring.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap();
        comm.bytes_sent() - before
    })
    .unwrap();
    assert_eq!(counted, vec![6000; 4]);
    let alone = local::run(1, |comm| {
        comm.all_reduce_in_place(&mut [1f32; 100], ReduceOp::Sum)
            .unwrap();
        comm.bytes_sent()
    })
    .unwrap();
    assert_eq!(alone, vec![0]);
}

/// `local::run` of `nodes` nodes of `local` ranks.
fn run_on<R: Send>(
    (nodes, local): (usize, usize),
    f: impl Fn(ferrocoll::Communicator) -> R + Sync,
) -> Vec<R> {
    let config = Config {
        topology: Some(Topology::new(vec![nodes, local]).unwrap()),
        ..Config::default()
    };
    local::run_with(nodes * local, config, f).unwrap()
}

#[test]
fn the_hierarchical_form_matches_its_reference() {
    for spec in ["fp16", "int8:64", "onebit:64", "topk:0.05", "topk:3"] {
        for shape in [(2, 2), (3, 2), (2, 3), (4, 2)] {
            for len in [0, 1, 7, 130, 1000, 1024] {
                for op in [ReduceOp::Sum, ReduceOp::Avg] {
                    for outcome in run_on(shape, |comm| {
                        check_hier_rank(&comm, spec, shape, len, 2, op)
                    }) {
                        outcome.unwrap_or_else(|e| panic!("{e}"));
                    }
                }
            }
        }
    }
}

/// Between nodes the hierarchical form sends `1/L` of what the flat one
/// does per rank; within them, the uncompressed reduce-scatter and
/// allgather.
#[test]
fn the_hierarchical_form_sends_less_between_nodes() {
    let len = 1 << 16;
    let stats = run_on((2, 2), |comm| {
        let mut hier = Compressor::new(&comm, len, "int8:128").unwrap();
        let flat_options = CompressOptions {
            hierarchical: Some(false),
            ..CompressOptions::default()
        };
        let mut flat = Compressor::with_options(&comm, len, "int8:128", flat_options).unwrap();
        assert!(hier.hierarchical() && !flat.hierarchical());
        assert_eq!(hier.algorithm(), "hier-two-phase");
        let mut buf = input(comm.rank(), 0, len);
        let h = hier.all_reduce(&mut buf.clone(), ReduceOp::Sum).unwrap();
        let f = flat.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
        (h, f)
    });
    let encoded = len + 4 * (len / 128);
    for (h, f) in stats {
        // Flat: 2 (n-1)/n of the encoded buffer; hierarchical: each rank's
        // half, 2 (H-1)/H of it.
        assert_eq!(f.sent_bytes, 2 * 3 * encoded / 4);
        assert_eq!(h.sent_bytes, encoded / 2);
        assert_eq!(h.measured_bytes, h.sent_bytes as u64);
        // Within the node: half the f32 buffer each way.
        assert_eq!(h.local_sent_bytes, 2 * 4 * len / 2);
        assert_eq!(h.local_measured_bytes, h.local_sent_bytes as u64);
    }
}

#[test]
fn the_hierarchical_form_is_refused_where_it_cannot_run() {
    let forced = CompressOptions {
        hierarchical: Some(true),
        ..CompressOptions::default()
    };
    let flat = local::run(4, |comm| {
        Compressor::with_options(&comm, 100, "int8", forced)
            .unwrap_err()
            .to_string()
    })
    .unwrap();
    assert!(flat[0].contains("topology"), "{}", flat[0]);
    let randk = run_on((2, 2), |comm| {
        let auto = Compressor::new(&comm, 100, "randk:0.1").unwrap();
        assert!(!auto.hierarchical());
        Compressor::with_options(&comm, 100, "randk:0.1", forced).is_err()
    });
    assert!(randk.iter().all(|&refused| refused));
}

/// The cost model's closed forms count the bytes the collectives send:
/// the busiest rank's compressed bytes and, in the hierarchical form, its
/// uncompressed ones within the node, for every codec, flat and
/// hierarchical, even and uneven.
#[test]
fn the_models_bytes_are_the_collectives() {
    use ferrocoll::compress::collective::model::predict_all_reduce;
    use ferrocoll::cost::Profile;
    let profile = Profile::uniform(1e-5, 1e9, 1e-11);
    for spec in [
        "fp16",
        "int8:64",
        "onebit:128",
        "topk:0.01",
        "randk:0.01:2",
        "powersgd:3",
    ] {
        for shape in [(1, 1), (1, 3), (1, 5), (2, 2), (3, 2)] {
            for len in [1000, 4099, 65_536] {
                let topo = if shape.0 == 1 {
                    Topology::flat(shape.1)
                } else {
                    Topology::new(vec![shape.0, shape.1]).unwrap()
                };
                let model = predict_all_reduce(spec, len, &topo, &profile, None).unwrap();
                let stats = run_on(shape, |comm| {
                    let mut c = Compressor::new(&comm, len, spec).unwrap();
                    assert_eq!(c.algorithm(), model.algorithm, "{spec} {topo}");
                    c.all_reduce(&mut input(comm.rank(), 0, len), ReduceOp::Sum)
                        .unwrap()
                });
                let wire = stats.iter().map(|s| s.sent_bytes).max().unwrap();
                let local = stats.iter().map(|s| s.local_sent_bytes).max().unwrap();
                assert_eq!(
                    (model.wire_bytes, model.local_bytes),
                    (wire, local),
                    "{spec} on {topo}, {len} elements"
                );
            }
        }
    }
}
