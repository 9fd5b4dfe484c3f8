//! Binomial-tree algorithms (MPICH's binomial broadcast/reduce/gather/scatter).
//!
//! Ranks are renumbered relative to the root (`v = rank - root mod N`), so
//! the root is virtual rank 0. In round k, the ranks `v < 2^k` that already
//! hold the data send it to `v + 2^k`: ceil(log2 N) rounds for any N, with no
//! power-of-two restriction (ranks whose partner would be >= N sit out).
//! Latency-optimal; the root sends the whole buffer log2 N times, so rings win
//! for large buffers.

use super::{root_copy_overlapped, Plan, PlanBuilder, PlanRequest, Span};

/// Virtual rank of `rank` in a tree rooted at `root`.
fn vrank(req: &PlanRequest) -> usize {
    (req.rank + req.n - req.root) % req.n
}

/// Real rank of virtual rank `v`.
fn real(req: &PlanRequest, v: usize) -> usize {
    (v + req.root) % req.n
}

/// Lowest set bit of `v`, or the smallest power of two >= n for the root:
/// the size of the subtree a virtual rank heads.
fn subtree(v: usize, n: usize) -> usize {
    if v == 0 {
        n.next_power_of_two()
    } else {
        1 << v.trailing_zeros()
    }
}

/// Binomial broadcast of `count` elements; the root sends from `root_src`.
fn broadcast_from(req: &PlanRequest, root_src: fn(usize, usize) -> Span) -> Plan {
    let (n, count) = (req.n, req.count);
    let v = vrank(req);
    let mut p = PlanBuilder::default();
    if count == 0 {
        return p.finish();
    }
    let src = |o, l| {
        if v == 0 {
            root_src(o, l)
        } else {
            Span::output(o, l)
        }
    };
    if v > 0 {
        let parent = v - subtree(v, n);
        p.round().recv(real(req, parent), Span::output(0, count));
    }
    // Children v + mask for every mask below this rank's subtree size, the
    // largest first (it heads the largest subtree).
    let mut mask = subtree(v, n) >> 1;
    while mask > 0 {
        if v + mask < n {
            p.round().send(real(req, v + mask), src(0, count));
        }
        mask >>= 1;
    }
    p.finish()
}

/// Binomial broadcast; the root copies its input into its output while its
/// first child receives.
pub(super) fn broadcast(req: &PlanRequest) -> Plan {
    let plan = broadcast_from(req, Span::input);
    if vrank(req) == 0 {
        root_copy_overlapped(plan, req.count)
    } else {
        plan
    }
}

/// Binomial reduce into `acc` (the root's result lands in its output).
fn reduce_into(req: &PlanRequest, nonroot_acc: fn(usize, usize) -> Span) -> Plan {
    let (n, count) = (req.n, req.count);
    let v = vrank(req);
    let acc = if v == 0 {
        Span::output(0, count)
    } else {
        nonroot_acc(0, count)
    };
    let mut p = PlanBuilder::default();
    if count == 0 {
        return p.finish();
    }
    let mut have_acc = false;
    let mut mask = 1;
    while mask < n {
        if v & mask != 0 {
            // Lower bits are clear here, so the parent is v - mask.
            let src = if have_acc { acc } else { Span::input(0, count) };
            p.round().send(real(req, v - mask), src);
            break;
        }
        if v + mask < n {
            let local = if have_acc { acc } else { Span::input(0, count) };
            p.round().recv_reduce(real(req, v + mask), acc, local);
            have_acc = true;
        }
        mask <<= 1;
    }
    if v == 0 && !have_acc {
        p.round().copy(acc, Span::input(0, count));
    }
    if v != 0 && have_acc && acc.buf == super::Buf::Scratch {
        p.scratch(count);
    }
    p.finish()
}

/// Binomial reduce.
pub(super) fn reduce(req: &PlanRequest) -> Plan {
    reduce_into(req, Span::scratch)
}

/// Allreduce as binomial reduce to rank 0, then binomial broadcast. Every
/// rank accumulates in its own output, which the broadcast then overwrites.
pub(super) fn all_reduce(req: &PlanRequest) -> Plan {
    let rooted = PlanRequest {
        root: 0,
        ..req.clone()
    };
    let mut p = PlanBuilder::default();
    p.append(reduce_into(&rooted, Span::output));
    p.append(broadcast_from(&rooted, Span::output));
    p.finish()
}

/// Binomial gather. Each rank collects its subtree's blocks in scratch, in
/// virtual-rank order, and sends them up in one message; the root then
/// rotates them into rank order.
pub(super) fn gather(req: &PlanRequest) -> Plan {
    let (n, c, root) = (req.n, req.count, req.root);
    let v = vrank(req);
    let mut p = PlanBuilder::default();
    if c == 0 {
        return p.finish();
    }
    let size = subtree(v, n).min(n - v);
    if size == 1 && v != 0 {
        // A leaf sends its input straight up.
        p.round()
            .send(real(req, v - subtree(v, n)), Span::input(0, c));
        return p.finish();
    }
    p.scratch(size * c);
    p.round().copy(Span::scratch(0, c), Span::input(0, c));
    let mut mask = 1;
    while mask < n {
        if v & mask != 0 {
            p.round()
                .send(real(req, v - mask), Span::scratch(0, size * c));
            break;
        }
        if v + mask < n {
            let len = mask.min(n - v - mask) * c;
            p.round()
                .recv(real(req, v + mask), Span::scratch(mask * c, len));
        }
        mask <<= 1;
    }
    if v == 0 {
        // Virtual ranks 0..n-root are ranks root..n; the rest wrap to 0..root.
        let head = (n - root) * c;
        p.round()
            .copy(Span::output(root * c, head), Span::scratch(0, head))
            .copy(Span::output(0, root * c), Span::scratch(head, root * c));
    }
    p.finish()
}

/// Binomial scatter: the reverse of [`gather`].
pub(super) fn scatter(req: &PlanRequest) -> Plan {
    let (n, c, root) = (req.n, req.count, req.root);
    let v = vrank(req);
    let mut p = PlanBuilder::default();
    if c == 0 {
        return p.finish();
    }
    let size = subtree(v, n).min(n - v);
    if v == 0 {
        let head = (n - root) * c;
        p.round()
            .copy(Span::scratch(0, head), Span::input(root * c, head))
            .copy(Span::scratch(head, root * c), Span::input(0, root * c));
    } else if size == 1 {
        p.round()
            .recv(real(req, v - subtree(v, n)), Span::output(0, c));
        return p.finish();
    } else {
        let parent = v - subtree(v, n);
        p.round()
            .recv(real(req, parent), Span::scratch(0, size * c));
    }
    p.scratch(size * c);
    let mut mask = subtree(v, n) >> 1;
    while mask > 0 {
        if v + mask < n {
            let len = mask.min(n - v - mask) * c;
            p.round()
                .send(real(req, v + mask), Span::scratch(mask * c, len));
        }
        mask >>= 1;
    }
    p.round().copy(Span::output(0, c), Span::scratch(0, c));
    p.finish()
}

/// Tree barrier: an empty binomial gather to rank 0 (fan-in), then an empty
/// binomial broadcast (fan-out): 2 ceil(log2 N) rounds, zero-byte messages.
/// No rank leaves before rank 0 has heard from everyone.
pub(super) fn barrier(req: &PlanRequest) -> Plan {
    let (n, v) = (req.n, req.rank);
    let signal = Span::input(0, 0);
    let mut p = PlanBuilder::default();
    let mut mask = 1;
    while mask < n {
        if v & mask != 0 {
            p.round().send(v - mask, signal);
            break;
        }
        if v + mask < n {
            p.round().recv(v + mask, Span::output(0, 0));
        }
        mask <<= 1;
    }
    if v > 0 {
        p.round().recv(v - subtree(v, n), Span::output(0, 0));
    }
    let mut mask = subtree(v, n) >> 1;
    while mask > 0 {
        if v + mask < n {
            p.round().send(v + mask, signal);
        }
        mask >>= 1;
    }
    p.finish()
}
