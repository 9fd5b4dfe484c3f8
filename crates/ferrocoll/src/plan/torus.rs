//! 2-D allreduce on a `rows × cols` grid (`(rows, cols) = topology.grid()`,
//! rank = row·cols + col): Sony's 2-D torus and Google's 2-D mesh.
//!
//! * **torus2d** (Sony, 2018): ring reduce-scatter along the row (the `cols`
//!   ranks of a row), ring allreduce along the column (the `rows` ranks of a
//!   column) on the `M/cols` block this rank owns, ring allgather along the
//!   row. `2(cols-1) + 2(rows-1)` rounds instead of the flat ring's
//!   `2(N-1)`; each rank sends `2(cols-1)/cols·M` along its row and
//!   `2(rows-1)/rows·M/cols` along its column, `2(N-1)/N·M` in all, as much
//!   as the ring (bandwidth-optimal). It is the two-level hierarchical
//!   allreduce with rows as the outer level; on a multi-level topology the
//!   grid is nodes × ranks per node, so the column rings are the rails.
//! * **mesh2d** (Google TPU, 2018): half `A` of the buffer runs the torus
//!   scheme (row reduce-scatter, column allreduce, row allgather) while half
//!   `B` runs it with the dimensions swapped (column reduce-scatter, row
//!   allreduce, column allgather), their steps merged round by round. Each
//!   half takes `2(cols-1) + 2(rows-1)` rounds, so the merge does too; on a
//!   square grid every round drives a row link and a column link at once
//!   (rounds `< cols-1`: A on rows, B on columns, and so on), which is where
//!   the 2x over a 1-D ring comes from on hardware with independent links per
//!   direction. Bytes per rank: half A sends `2(cols-1)/cols·M/2` on the row
//!   and `2(rows-1)/rows·M/(2cols)` on the column, half B the mirror image,
//!   again `2(N-1)/N·M` in all. Without separate per-direction links (one NIC
//!   per GPU) the two halves share one port and mesh2d is just torus2d.
//!
//! Placement: the grid assumes block placement, rows contiguous. If the
//! physical rows (nodes) are not the logical rows, the "fast" row rings cross
//! the slow links and the column rings leave their rails: the same pitfall as
//! the hierarchical algorithms. On a flat topology the grid is only a
//! near-square factorisation (rows ≤ cols; a prime N gives 1 × N, a ring).

use super::hier::{all_reduce_over, all_reduce_phases, Dim, Phase};
use super::{block, Plan, PlanBuilder, PlanRequest, Span};

/// The row dimension (the `cols` ranks of one row, adjacent) and the column
/// dimension (the `rows` ranks of one column, `cols` apart).
fn row_and_column(req: &PlanRequest) -> (Dim, Dim) {
    let (rows, cols) = req.topology.grid();
    (
        Dim {
            size: cols,
            stride: 1,
        },
        Dim {
            size: rows,
            stride: cols,
        },
    )
}

/// Sony's 2-D torus allreduce: row reduce-scatter, column allreduce, row
/// allgather.
pub(super) fn torus2d_all_reduce(req: &PlanRequest) -> Plan {
    let (row, column) = row_and_column(req);
    all_reduce_over(req, &[row, column])
}

/// Google's 2-D mesh allreduce: the torus scheme on each half of the buffer,
/// the halves in opposite dimension order, merged step by step.
pub(super) fn mesh2d_all_reduce(req: &PlanRequest) -> Plan {
    let (row, column) = row_and_column(req);
    let count = req.count;
    let mut p = PlanBuilder::default();
    if req.n == 1 {
        p.round()
            .copy(Span::output(0, count), Span::input(0, count));
        return p.finish();
    }
    let (a_off, a_len) = block(count, 2, 0);
    let (b_off, b_len) = block(count, 2, 1);
    let a = all_reduce_phases(req.rank, &[row, column], a_off, a_len);
    let b = all_reduce_phases(req.rank, &[column, row], b_off, b_len);
    // Merge by step index, empty steps included, so that every rank pairs
    // the same steps of the two halves in one round (the halves touch
    // disjoint halves of the buffer, so their ops never conflict).
    let (a, b) = (steps(&a), steps(&b));
    for t in 0..a.len().max(b.len()) {
        let mut round = p.round();
        for half in [&a, &b] {
            if let Some(&(phase, s)) = half.get(t) {
                phase.emit(&mut round, s);
            }
        }
    }
    p.finish()
}

/// Every step of `phases` in order, as (phase, step within it).
fn steps<'p, 'a>(phases: &'p [Phase<'a>]) -> Vec<(&'p Phase<'a>, usize)> {
    phases
        .iter()
        .flat_map(|ph| (0..ph.steps()).map(move |s| (ph, s)))
        .collect()
}
