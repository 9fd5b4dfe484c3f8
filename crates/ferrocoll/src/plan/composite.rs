//! Algorithms built from two phases of other families.
//!
//! * `scatter_allgather` broadcast (van de Geijn): the root scatters the
//!   buffer in N blocks down a binomial tree (ceil(log2 N) rounds, the root
//!   sends (N-1)/N·M), then a ring allgather in N-1 rounds completes every
//!   rank's copy. Each rank sends about 2(N-1)/N·M instead of the binomial
//!   tree's M·log2 N at the root: it wins for large buffers where the
//!   pipelined chain's N-2+S rounds cost more than its bandwidth saves.
//! * `rs_gather` reduce (Rabenseifner's reduce): a ring reduce-scatter leaves
//!   rank r with reduced block r+1, then every rank sends that block to the
//!   root in one round. Every rank sends (N-1)/N·M in the first phase and M/N
//!   in the second, and the reduction work is spread over all ranks instead
//!   of piling up on the tree's interior ranks: a large-message reduce.
//!
//! Blocks are `block(count, N, i)`, so counts need not divide N; empty
//! blocks are skipped by sender and receiver alike.

use super::{block, single_rank, Plan, PlanBuilder, PlanRequest, Span};

/// Van de Geijn broadcast: binomial scatter, then ring allgather.
///
/// Blocks are numbered by virtual rank `v = rank - root (mod N)`, so the
/// blocks of a binomial subtree `[v, v + size)` are one contiguous range of
/// the buffer and every scatter message lands straight in the output.
pub(super) fn broadcast_scatter_allgather(req: &PlanRequest) -> Plan {
    let (n, count, root) = (req.n, req.count, req.root);
    if n == 1 || count == 0 {
        return single_rank(count);
    }
    let v = (req.rank + n - root) % n;
    let real = |u: usize| (u + root) % n;
    // Elements of virtual blocks [from, to).
    let range = |from: usize, to: usize| {
        let start = block(count, n, from).0;
        let end = if to >= n {
            count
        } else {
            block(count, n, to).0
        };
        (start, end - start)
    };
    let mut p = PlanBuilder::default();
    // Scatter down the binomial tree: the subtree of v is [v, v + lowbit(v)).
    let subtree = if v == 0 {
        n.next_power_of_two()
    } else {
        1 << v.trailing_zeros()
    };
    if v == 0 {
        p.round()
            .copy(Span::output(0, count), Span::input(0, count));
    } else {
        let (o, l) = range(v, (v + subtree).min(n));
        if l > 0 {
            p.round().recv(real(v - subtree), Span::output(o, l));
        }
    }
    let mut mask = subtree >> 1;
    while mask > 0 {
        if v + mask < n {
            let (o, l) = range(v + mask, (v + 2 * mask).min(n));
            if l > 0 {
                // The root still sends from its input: in place that is the
                // same memory, out of place it avoids waiting for the copy.
                let src = if v == 0 {
                    Span::input(o, l)
                } else {
                    Span::output(o, l)
                };
                p.round().send(real(v + mask), src);
            }
        }
        mask >>= 1;
    }
    // Ring allgather over virtual ranks: pass on block v - s, receive v - s - 1.
    let (right, left) = (real((v + 1) % n), real((v + n - 1) % n));
    for s in 0..n - 1 {
        let (so, sl) = block(count, n, (v + n - s) % n);
        let (ro, rl) = block(count, n, (v + 2 * n - s - 1) % n);
        let mut round = p.round();
        if sl > 0 {
            round.send(right, Span::output(so, sl));
        }
        if rl > 0 {
            round.recv(left, Span::output(ro, rl));
        }
    }
    p.finish()
}

/// Rabenseifner's reduce: ring reduce-scatter, then every rank sends its
/// reduced block to the root.
pub(super) fn reduce_rs_gather(req: &PlanRequest) -> Plan {
    let (n, r, count, root) = (req.n, req.rank, req.count, req.root);
    let is_root = r == root;
    if n == 1 || count == 0 {
        return single_rank(if is_root { count } else { 0 });
    }
    let (right, left) = ((r + 1) % n, (r + n - 1) % n);
    let blk = |b: usize| block(count, n, b % n);
    // The root folds partial sums straight into its output; the others need
    // scratch for theirs.
    let acc = |o: usize, l: usize| {
        if is_root {
            Span::output(o, l)
        } else {
            Span::scratch(o, l)
        }
    };
    let mut p = PlanBuilder::default();
    if !is_root {
        p.scratch(count);
    }
    // Reduce-scatter as in the ring allreduce: in step s send block r - s and
    // fold block r - s - 1 from the left; rank r ends with block r + 1.
    for s in 0..n - 1 {
        let (so, sl) = blk(r + n - s);
        let (ro, rl) = blk(r + 2 * n - s - 1);
        let mut round = p.round();
        if sl > 0 {
            let src = if s == 0 {
                Span::input(so, sl)
            } else {
                acc(so, sl)
            };
            round.send(right, src);
        }
        if rl > 0 {
            round.recv_reduce(left, acc(ro, rl), Span::input(ro, rl));
        }
    }
    // Gather: rank q's reduced block is q + 1; the root already has its own.
    let mut round = p.round();
    if is_root {
        for q in (0..n).filter(|&q| q != root) {
            let (o, l) = blk(q + 1);
            if l > 0 {
                round.recv(q, Span::output(o, l));
            }
        }
    } else {
        let (o, l) = blk(r + 1);
        if l > 0 {
            round.send(root, acc(o, l));
        }
    }
    p.finish()
}
