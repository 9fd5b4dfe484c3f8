//! The ideal mode against the closed forms of the cost model.
//!
//! On a `switch` (one port each way per rank, latency `lat`), with gamma = 0
//! and no per-message overhead, the ideal mode charges what the alpha-beta
//! model charges (alpha = lat, beta = bw): every algorithm of every
//! collective must land within 1 % of `ferrocoll::cost::predict`, for
//! N in {2, 3, 4, 5, 8, 16, 64, 127, 128, 1000, 1024} and a 4 MiB-per-rank-ish
//! size (`SIM_IDEAL_MAX_N=64` stops at 64 for a quick run).

use ferrocoll::cost::{predict, Profile, Shape};
use ferrocoll::{Algorithm, Collective};
use ferrocoll_sim::{element_count, simulate, Mode, TopologySpec};

const BW: f64 = 50e9;
const LAT: f64 = 2e-6;

/// Relative tolerance for `algo` on `coll`.
fn tolerance(coll: Collective, algo: Algorithm) -> f64 {
    match (coll, algo) {
        // The double binary tree's closed form is approximate: the critical
        // path depends on the depth each rank gets in each tree, and the cost
        // model's own consistency test allows 10 % against its plan walk.
        (_, Algorithm::DoubleBinaryTree) => 0.10,
        _ => 0.01,
    }
}

#[test]
fn ideal_mode_agrees_with_the_cost_model_on_a_switch() {
    let profile = Profile::uniform(LAT, BW, 0.0);
    let mut failures = Vec::new();
    let mut worst: (f64, String) = (-1.0, String::new());
    let mut worst_dbtree = 0.0f64;
    let mut checked = 0;
    let max_n: usize = std::env::var("SIM_IDEAL_MAX_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    for n in [2usize, 3, 4, 5, 8, 16, 64, 127, 128, 1000, 1024] {
        if n > max_n {
            break;
        }
        let topo = TopologySpec::parse(&format!("switch:ranks={n},bw=50GB/s,lat=2us")).unwrap();
        for coll in Collective::ALL {
            if coll == Collective::Barrier {
                continue;
            }
            // 1 << 20 f32 elements: the buffer of allreduce, bcast and reduce;
            // each rank's block of the block collectives is 1 MiB (2^18 elements).
            let bytes = match coll {
                Collective::AllReduce | Collective::Broadcast | Collective::Reduce => 4 << 20,
                _ => n * (1 << 20),
            };
            let count = element_count(coll, n, bytes, 4);
            for &algo in coll.algorithms() {
                let mut shape = Shape::new(coll, n, count, 4);
                if coll == Collective::AllToAllV {
                    shape.v_counts = vec![vec![count; n]; n];
                }
                let model = predict(algo, &shape, &profile).unwrap().total();
                let sim = simulate(coll, algo, bytes, &topo, Mode::Ideal)
                    .unwrap_or_else(|e| panic!("{coll}/{algo} n={n}: {e}"));
                let err = (sim.time_s - model).abs() / model;
                checked += 1;
                let what = format!(
                    "{coll}/{algo} n={n}: sim {:.3} us, model {:.3} us, err {:.2e} %",
                    sim.time_s * 1e6,
                    model * 1e6,
                    err * 100.0
                );
                if std::env::var_os("SIM_VERBOSE").is_some() {
                    println!("{what}");
                }
                if algo == Algorithm::DoubleBinaryTree {
                    worst_dbtree = worst_dbtree.max(err);
                } else if err > worst.0 {
                    worst = (err, what.clone());
                }
                if err > tolerance(coll, algo) {
                    failures.push(what);
                }
            }
        }
    }
    println!(
        "{checked} cases; worst: {}; worst dbtree: {:.2e} %",
        worst.1,
        worst_dbtree * 100.0
    );
    assert!(
        failures.is_empty(),
        "{} disagree:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
