//! `Dispatcher::dispatch_pairs` and `Dispatcher::combine_pairs`, the
//! per-(token, choice) exchanges an autograd layer is built from (the
//! PyTorch `ferrocoll.torch.moe`): on 1..=8 ranks as threads, on a flat and
//! a two-level topology, under every schedule and with flat exchanges run
//! expert by expert, dropless and dropping, one and three experts a rank:
//!
//! * `combine_pairs` returns each kept choice's expert output to its row
//!   t·k + j, zeros for dropped choices, and their weighted sum is
//!   `combine`'s output bit for bit;
//! * `dispatch_pairs` of rows that repeat each token's row delivers what
//!   `dispatch` delivered, bit for bit;
//! * the two are adjoint: Σ_ranks ⟨dispatch_pairs(P), O⟩ = Σ_ranks ⟨P,
//!   combine_pairs(O)⟩ for arbitrary P and O (integers, exact in f64);
//! * a handle of another shape, and rows of the wrong length, are errors.

mod moe_support;

use ferrocoll::cost::Profile;
use ferrocoll::moe::{Dispatcher, Policy, Schedule, Spec};
use ferrocoll::{local, Communicator, Config, ReduceOp, Topology};
use moe_support::{expert, mix, uneven_tokens, Case, Routing};

/// Checks every property above for `case` on this rank under `schedule`;
/// returns whether the exchanges ran expert by expert.
fn check(comm: &Communicator, case: &Case, schedule: Schedule) -> Result<bool, String> {
    let me = comm.rank();
    let (h, k) = (case.hidden, case.topk);
    let moe =
        Dispatcher::new(comm, case.spec().with_schedule(schedule)).map_err(|e| e.to_string())?;
    let what = format!("{case:?} rank {me} {schedule}");
    let x: Vec<f32> = case.x(me);
    let (idx, w) = case.route(me);
    let (mut inputs, handle) = moe.dispatch(&x, &idx, &w).map_err(|e| e.to_string())?;

    // dispatch_pairs of repeated token rows is dispatch.
    let repeated: Vec<f32> = (0..case.tokens[me] * k)
        .flat_map(|pair| x[(pair / k) * h..(pair / k + 1) * h].to_vec())
        .collect();
    let again = moe
        .dispatch_pairs(&repeated, &handle)
        .map_err(|e| e.to_string())?;
    if again != inputs {
        return Err(format!("{what}: dispatch_pairs(repeated x) != dispatch(x)"));
    }

    // The experts run; combine_pairs brings each choice home, unweighted.
    let l = inputs.local_experts();
    for x_local in 0..l {
        let e = me * l + x_local;
        for v in inputs.expert_mut(x_local) {
            *v = expert(e, *v);
        }
    }
    let pairs = moe
        .combine_pairs(inputs.as_slice(), &handle)
        .map_err(|e| e.to_string())?;
    if pairs.len() != case.tokens[me] * k * h {
        return Err(format!(
            "{what}: combine_pairs has {} elements",
            pairs.len()
        ));
    }
    let dropped: Vec<(usize, usize)> = handle
        .dropped()
        .iter()
        .map(|d| (d.token, d.choice))
        .collect();
    for pair in 0..case.tokens[me] * k {
        let (t, j) = (pair / k, pair % k);
        let e = idx[pair] as usize;
        for c in 0..h {
            let want = if dropped.contains(&(t, j)) {
                0.0
            } else {
                expert(e, x[t * h + c])
            };
            if pairs[pair * h + c].to_bits() != want.to_bits() {
                return Err(format!(
                    "{what}: combine_pairs row {pair} [{c}] = {}, want {want}",
                    pairs[pair * h + c]
                ));
            }
        }
    }
    // Their weighted sum, in choice order in f32 (combine's arithmetic for
    // f32), is combine's output; dropped rows (zeros) are skipped as
    // combine skips them, which keeps the sign of a zero sum the same.
    let y = moe
        .combine(inputs.as_slice(), &handle)
        .map_err(|e| e.to_string())?;
    for t in 0..case.tokens[me] {
        for c in 0..h {
            let mut acc: Option<f32> = None;
            for j in 0..k {
                if !dropped.contains(&(t, j)) {
                    let term = w[t * k + j] * pairs[(t * k + j) * h + c];
                    acc = Some(acc.map_or(0.0 + term, |a| a + term));
                }
            }
            let want = acc.unwrap_or(0.0);
            if y[t * h + c].to_bits() != want.to_bits() {
                return Err(format!(
                    "{what}: y[{t}][{c}] = {}, want {want}",
                    y[t * h + c]
                ));
            }
        }
    }

    // Adjointness on arbitrary integer rows.
    let salt = |i: usize, s: u64| (mix(s ^ ((me as u64) << 36) ^ i as u64) % 9) as f64 - 4.0;
    let p_rows: Vec<f64> = (0..case.tokens[me] * k * h).map(|i| salt(i, 1)).collect();
    let o_rows: Vec<f64> = (0..handle.rows_received() * h)
        .map(|i| salt(i, 2))
        .collect();
    let moe64 =
        Dispatcher::new(comm, case.spec().with_schedule(schedule)).map_err(|e| e.to_string())?;
    let sent = moe64
        .dispatch_pairs(&p_rows, &handle)
        .map_err(|e| e.to_string())?;
    let back = moe64
        .combine_pairs(&o_rows, &handle)
        .map_err(|e| e.to_string())?;
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    let local_sums = [dot(sent.as_slice(), &o_rows), dot(&p_rows, &back)];
    let mut sums = [0.0f64; 2];
    comm.all_reduce(&local_sums, &mut sums, ReduceOp::Sum)
        .map_err(|e| e.to_string())?;
    if sums[0] != sums[1] {
        return Err(format!(
            "{what}: <dispatch_pairs(P), O> = {} but <P, combine_pairs(O)> = {}",
            sums[0], sums[1]
        ));
    }
    Ok(handle.runs_by_expert().contains(&true))
}

fn cases(n: usize) -> Vec<Case> {
    let mut out = Vec::new();
    for per_rank in [1, 3] {
        for capacity in [None, Some((1, 2))] {
            out.push(Case {
                ranks: n,
                experts: n * per_rank,
                hidden: 3,
                topk: 2,
                capacity,
                tokens: uneven_tokens(n, n as u64 * 5 + per_rank as u64),
                routing: Routing::Random(n as u64 * 13 + per_rank as u64),
            });
        }
    }
    out
}

/// Runs every case under every schedule; returns whether some exchange ran
/// expert by expert.
fn run_all(n: usize, topo: Topology, profile: Option<Profile>) -> bool {
    let mut config = Config::default().with_topology(topo.clone());
    config.profile = profile;
    let all = cases(n);
    local::run_with(n, config, |comm| {
        let mut by_expert = false;
        for case in &all {
            for &s in Schedule::ALL.iter() {
                by_expert |= check(&comm, case, s).map_err(|e| format!("on {topo}: {e}"))?;
            }
        }
        Ok::<_, String>(by_expert)
    })
    .unwrap()
    .into_iter()
    .map(|r| r.unwrap_or_else(|e| panic!("{e}")))
    .fold(false, |a, b| a | b)
}

#[test]
fn pairs_match_dispatch_and_combine_and_are_adjoint() {
    for n in 1..=8 {
        run_all(n, Topology::flat(n), None);
        if n % 2 == 0 && n > 2 {
            run_all(n, Topology::new(vec![2, n / 2]).unwrap(), None);
        }
    }
}

#[test]
fn pairs_expert_by_expert() {
    // A dear copy makes flat exchanges of several experts a rank run one
    // all-to-all-v per expert.
    let mut dear = Profile::thread_default();
    dear.copy = 1e-3;
    for n in [2, 3, 4] {
        assert!(
            run_all(n, Topology::flat(n), Some(dear.clone())),
            "{n} ranks"
        );
    }
}

#[test]
fn pairs_check_their_arguments() {
    let out = local::run(2, |comm| {
        let a = Dispatcher::new(&comm, Spec::new(2, 3, 1, Policy::Dropless)).unwrap();
        let b = Dispatcher::new(&comm, Spec::new(2, 4, 1, Policy::Dropless)).unwrap();
        let (inputs, handle) = a.dispatch(&[1.0f32; 3], &[0], &[1.0]).unwrap();
        let wrong_len = a
            .dispatch_pairs(&[1.0f32; 4], &handle)
            .unwrap_err()
            .to_string();
        let other = b
            .combine_pairs(inputs.as_slice(), &handle)
            .unwrap_err()
            .to_string();
        let long = vec![0.0f32; inputs.as_slice().len() + 1];
        let short = a.combine_pairs(&long, &handle).unwrap_err().to_string();
        (wrong_len, other, short)
    })
    .unwrap();
    for (wrong_len, other, short) in out {
        assert!(
            wrong_len.contains("pair_rows has 4 elements but must have 3"),
            "{wrong_len}"
        );
        assert!(other.contains("not of this dispatcher"), "{other}");
        assert!(short.contains("expert_outputs has"), "{short}");
    }
}
