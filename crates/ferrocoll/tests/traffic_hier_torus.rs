//! Traffic of the hierarchical, 2-D torus and 2-D mesh algorithms, read from
//! the plans themselves (`plan::build` for every rank, `match_messages` for
//! steps and volumes, `inter_node_elements` for what crosses a node) and
//! compared with the seeds' formulas (BlueConnect, Sony, Google, Tutel).
//!
//! `M` is the allreduce buffer in elements, `G` nodes of `L` ranks.

use ferrocoll::plan::{
    self, inter_node_elements, match_messages, MessageStats, Op, Plan, PlanRequest,
};
use ferrocoll::{Algorithm, Collective, Topology};

fn topo(s: &str) -> Topology {
    s.parse().unwrap()
}

/// The plans of every rank for a uniform-count collective.
fn plans(algo: Algorithm, coll: Collective, topology: &Topology, count: usize) -> Vec<Plan> {
    let n = topology.size();
    (0..n)
        .map(|r| {
            let req = PlanRequest::new(coll, n, r, count).with_topology(topology.clone());
            plan::build(algo, &req).unwrap()
        })
        .collect()
}

fn stats(plans: &[Plan], what: &str) -> MessageStats {
    match_messages(plans).unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// Every (peer, elements) a rank sends.
fn sends(plan: &Plan) -> impl Iterator<Item = (usize, usize)> + '_ {
    plan.ops().filter_map(|op| match *op {
        Op::Send { peer, src } => Some((peer, src.len)),
        _ => None,
    })
}

/// Asserts `got` is `want` (exact) or within `slack` elements of it.
fn close(got: usize, want: f64, slack: usize, what: &str) {
    assert!(
        (got as f64 - want).abs() <= slack as f64 + 1e-9,
        "{what}: got {got}, want {want} (slack {slack})"
    );
}

/// Inter-node sends of hierarchical plans stay on the sender's rail.
fn assert_rail_aligned(plans: &[Plan], topology: &Topology, what: &str) {
    let l = topology.local_size();
    for (rank, p) in plans.iter().enumerate() {
        for (peer, _) in sends(p) {
            if peer / l != rank / l {
                assert_eq!(
                    peer % l,
                    rank % l,
                    "{what}: rank {rank} sends to {peer} off its rail"
                );
            }
        }
    }
}

/// Two levels: per rank `2(L-1)/L·M + 2(G-1)/G·M/L` sent, of which
/// `2(G-1)/G·M/L` across nodes, in `2(L-1) + 2(G-1)` steps; exact when
/// `G·L` divides `M`, one element per block otherwise, and the inter-node
/// total over all ranks exact for any `M`.
#[test]
fn hier_allreduce_two_levels_cuts_inter_node_traffic_by_l() {
    for (g, l) in [
        (2, 4),
        (4, 2),
        (2, 2),
        (3, 3),
        (2, 3),
        (3, 2),
        (1, 4),
        (4, 1),
        (2, 8),
        (3, 5),
    ] {
        let t = Topology::new(vec![g, l]).unwrap();
        let n = g * l;
        for m in [n * 1000, n * 64 + 5, 12_345] {
            let what = format!("hier allreduce {t} M={m}");
            let ps = plans(Algorithm::Hier, Collective::AllReduce, &t, m);
            let st = stats(&ps, &what);
            let inter = inter_node_elements(&ps, &t);
            let (gf, lf, mf) = (g as f64, l as f64, m as f64);
            let want_inter = 2.0 * (gf - 1.0) / gf * mf / lf;
            let want_total = 2.0 * (lf - 1.0) / lf * mf + want_inter;
            let exact = m % n == 0;
            let (si, st_) = if exact {
                (0, 0)
            } else {
                (2 * (g - 1), 2 * (l - 1) + 2 * (g - 1))
            };
            for (r, (&inter_r, &sent_r)) in inter.iter().zip(&st.sent).enumerate() {
                close(
                    inter_r,
                    want_inter,
                    si,
                    &format!("{what} rank {r} inter-node"),
                );
                close(sent_r, want_total, st_, &format!("{what} rank {r} sent"));
            }
            let total_inter: usize = inter.iter().sum();
            assert_eq!(total_inter, 2 * (g - 1) * m, "{what}: inter-node total");
            assert_eq!(st.steps, 2 * (l - 1) + 2 * (g - 1), "{what}: steps");
            assert_rail_aligned(&ps, &t, &what);
        }
    }
}

/// Three levels (BlueConnect): level k (innermost first, sizes p_k) sends
/// `2(p_k-1)/p_k · M/(p_0⋯p_{k-1})` per rank in `2(p_k-1)` steps; everything
/// above level 0 crosses a node.
#[test]
fn hier_allreduce_three_levels_follows_blueconnect() {
    for levels in [
        vec![2, 2, 2],
        vec![2, 2, 3],
        vec![3, 2, 2],
        vec![2, 3, 2],
        vec![3, 1, 2],
    ] {
        let t = Topology::new(levels.clone()).unwrap();
        let n = t.size();
        let m = n * 840;
        let what = format!("hier allreduce {t} M={m}");
        let ps = plans(Algorithm::Hier, Collective::AllReduce, &t, m);
        let st = stats(&ps, &what);
        let inter = inter_node_elements(&ps, &t);
        let (mut total, mut above_node, mut steps, mut part) = (0usize, 0usize, 0usize, m);
        for (k, &p) in levels.iter().rev().enumerate() {
            let level = 2 * (p - 1) * (part / p);
            total += level;
            if k > 0 {
                above_node += level;
            }
            steps += 2 * (p - 1);
            part /= p;
        }
        assert_eq!(st.sent, vec![total; n], "{what}: sent per rank");
        assert_eq!(inter, vec![above_node; n], "{what}: inter-node per rank");
        assert_eq!(st.steps, steps, "{what}: steps");
        assert_rail_aligned(&ps, &t, &what);
    }
}

/// Allgather (outer level first) and reduce-scatter (inner level first):
/// per rank `(n-1)·c` in all, only `(G-1)·c` across nodes, in `Σ(p_k - 1)`
/// steps.
#[test]
fn hier_allgather_and_reducescatter_cross_nodes_once_per_block() {
    for s in ["2x4", "4x2", "3x3", "2x2x2", "2x2x3", "1x5", "5x1", "6"] {
        let t = topo(s);
        let (n, g) = (t.size(), t.nodes());
        let c = 37;
        for coll in [Collective::AllGather, Collective::ReduceScatter] {
            let what = format!("hier {coll} {t} c={c}");
            let ps = plans(Algorithm::Hier, coll, &t, c);
            let st = stats(&ps, &what);
            let inter = inter_node_elements(&ps, &t);
            assert_eq!(st.sent, vec![(n - 1) * c; n], "{what}: sent per rank");
            assert_eq!(inter, vec![(g - 1) * c; n], "{what}: inter-node per rank");
            let steps: usize = t.levels().iter().map(|p| p - 1).sum();
            assert_eq!(st.steps, steps, "{what}: steps");
            assert_rail_aligned(&ps, &t, &what);
        }
    }
}

/// Two-level alltoall: every inter-node message stays on the sender's rail,
/// each rank sends to at most G-1 ranks on other nodes, `(G-1)·L·c` elements,
/// in 2 steps.
#[test]
fn hier_alltoall_sends_g_minus_one_rail_aligned_messages() {
    for s in ["2x4", "4x2", "3x3", "2x2x2", "2x2x3", "1x4", "4x1", "8"] {
        let t = topo(s);
        let (g, l) = (t.nodes(), t.local_size());
        let c = 11;
        let what = format!("hier alltoall {t} c={c}");
        let ps = plans(Algorithm::Hier, Collective::AllToAll, &t, c);
        let st = stats(&ps, &what);
        let inter = inter_node_elements(&ps, &t);
        assert_rail_aligned(&ps, &t, &what);
        for (r, p) in ps.iter().enumerate() {
            let mut remote: Vec<usize> = sends(p)
                .filter(|(q, _)| q / l != r / l)
                .map(|(q, _)| q)
                .collect();
            let messages = remote.len();
            remote.sort_unstable();
            remote.dedup();
            assert_eq!(messages, g - 1, "{what} rank {r}: inter-node messages");
            assert_eq!(remote.len(), g - 1, "{what} rank {r}: inter-node peers");
            assert_eq!(
                inter[r],
                (g - 1) * l * c,
                "{what} rank {r} inter-node elements"
            );
            assert_eq!(
                st.sent[r],
                (l - 1) * g * c + (g - 1) * l * c,
                "{what} rank {r} sent"
            );
        }
        let want_steps = usize::from(l > 1) + usize::from(g > 1);
        assert_eq!(st.steps, want_steps, "{what}: steps");
    }
}

/// Alltoallv cannot forward (see `hier.rs`): a direct exchange in which each
/// round's inter-node sends all go to one node, every pair exchanging one
/// message (zero-length ones included), in G steps.
#[test]
fn hier_alltoallv_pairs_nodes_round_by_round() {
    for s in ["2x4", "4x2", "3x3", "2x2x2", "1x3", "3x1"] {
        let t = topo(s);
        let (n, g, l) = (t.size(), t.nodes(), t.local_size());
        let amount = |src: usize, dst: usize| (src * 3 + dst * 5) % 4;
        let ps: Vec<Plan> = (0..n)
            .map(|r| {
                let req = PlanRequest::new(Collective::AllToAllV, n, r, 0)
                    .with_topology(t.clone())
                    .with_counts(
                        (0..n).map(|d| amount(r, d)).collect(),
                        (0..n).map(|s| amount(s, r)).collect(),
                    );
                plan::build(Algorithm::Hier, &req).unwrap()
            })
            .collect();
        let what = format!("hier alltoallv {t}");
        let st = stats(&ps, &what);
        for (r, p) in ps.iter().enumerate() {
            assert_eq!(p.messages_sent(), n - 1, "{what} rank {r}: messages");
            let want: usize = (0..n).filter(|&d| d != r).map(|d| amount(r, d)).sum();
            assert_eq!(st.sent[r], want, "{what} rank {r} sent");
            for round in &p.rounds {
                let mut nodes: Vec<usize> = round
                    .ops
                    .iter()
                    .filter_map(|op| match *op {
                        Op::Send { peer, .. } if peer / l != r / l => Some(peer / l),
                        _ => None,
                    })
                    .collect();
                nodes.dedup();
                assert!(
                    nodes.len() <= 1,
                    "{what} rank {r}: one round sends to nodes {nodes:?}"
                );
            }
        }
        assert_eq!(st.steps, usize::from(l > 1) + (g - 1), "{what}: steps");
    }
}

/// (row traffic, column traffic) per rank of a rows × cols grid.
fn by_dimension(plans: &[Plan], cols: usize) -> Vec<(usize, usize)> {
    plans
        .iter()
        .enumerate()
        .map(|(r, p)| {
            let (mut row, mut col) = (0, 0);
            for (peer, len) in sends(p) {
                if peer / cols == r / cols {
                    row += len;
                } else {
                    assert_eq!(
                        peer % cols,
                        r % cols,
                        "rank {r} sends to {peer}, off its row and column"
                    );
                    col += len;
                }
            }
            (row, col)
        })
        .collect()
}

/// Grids to try: multi-level topologies (nodes × local) and flat sizes
/// factored near square (12 -> 3x4, 9 -> 3x3, 7 -> 1x7).
const GRIDS: [&str; 9] = ["2x4", "4x2", "3x3", "2x3", "2x2x2", "12", "9", "7", "1x4"];

/// Sony's torus: `2(cols-1) + 2(rows-1)` steps; per rank
/// `2(cols-1)/cols·M` along the row and `2(rows-1)/rows·M/cols` along the
/// column.
#[test]
fn torus2d_matches_the_sony_formula() {
    for s in GRIDS {
        let t = topo(s);
        let (rows, cols) = t.grid();
        let m = rows * cols * 420;
        let what = format!("torus2d {t} ({rows}x{cols}) M={m}");
        let ps = plans(Algorithm::Torus2d, Collective::AllReduce, &t, m);
        let st = stats(&ps, &what);
        let row_bytes = 2 * (cols - 1) * m / cols;
        let col_bytes = 2 * (rows - 1) * (m / cols) / rows;
        for (r, &(row, col)) in by_dimension(&ps, cols).iter().enumerate() {
            assert_eq!(row, row_bytes, "{what} rank {r} row");
            assert_eq!(col, col_bytes, "{what} rank {r} column");
            assert_eq!(st.sent[r], row_bytes + col_bytes, "{what} rank {r} sent");
        }
        assert_eq!(st.steps, 2 * (cols - 1) + 2 * (rows - 1), "{what}: steps");
    }
}

/// Google's mesh: the same `2(N-1)/N·M` per rank as the torus (split half
/// and half differently between the dimensions), in the steps of one half's
/// schedule (both take `2(cols-1) + 2(rows-1)`); on a square grid every
/// round uses both dimensions.
#[test]
fn mesh2d_runs_both_dimensions_at_once() {
    for s in GRIDS {
        let t = topo(s);
        let (rows, cols) = t.grid();
        let n = rows * cols;
        let m = 2 * n * 210;
        let what = format!("mesh2d {t} ({rows}x{cols}) M={m}");
        let ps = plans(Algorithm::Mesh2d, Collective::AllReduce, &t, m);
        let st = stats(&ps, &what);
        let half = m / 2;
        let row_bytes = 2 * (cols - 1) * half / cols + 2 * (cols - 1) * (half / rows) / cols;
        let col_bytes = 2 * (rows - 1) * (half / cols) / rows + 2 * (rows - 1) * half / rows;
        for (r, &(row, col)) in by_dimension(&ps, cols).iter().enumerate() {
            assert_eq!(row, row_bytes, "{what} rank {r} row");
            assert_eq!(col, col_bytes, "{what} rank {r} column");
            assert_eq!(st.sent[r], 2 * (n - 1) * m / n, "{what} rank {r} sent");
        }
        let half_steps = 2 * (cols - 1) + 2 * (rows - 1);
        assert_eq!(st.steps, half_steps, "{what}: steps");
        if rows == cols && rows > 1 {
            for (r, p) in ps.iter().enumerate() {
                for round in &p.rounds {
                    let peers: Vec<usize> = round
                        .ops
                        .iter()
                        .filter_map(|op| match *op {
                            Op::Send { peer, .. } => Some(peer),
                            _ => None,
                        })
                        .collect();
                    assert!(
                        peers.iter().any(|q| q / cols == r / cols),
                        "{what} rank {r}: no row send in a round"
                    );
                    assert!(
                        peers.iter().any(|q| q / cols != r / cols),
                        "{what} rank {r}: no column send in a round"
                    );
                }
            }
        }
    }
}
