//! Helpers for writing plans: [`PlanBuilder`] and [`RoundBuilder`], so that
//! an algorithm reads like its pseudo-code, and the block arithmetic most
//! algorithms share ([`block`], [`offsets`], [`single_rank`]).

use super::ops::{Op, Plan, Round, Span};

/// The start and length of block `b` when `count` elements are split into
/// `n` nearly equal blocks (the first `count % n` blocks get one more).
pub const fn block(count: usize, n: usize, b: usize) -> (usize, usize) {
    let base = count / n;
    let extra = count % n;
    let len = base + if b < extra { 1 } else { 0 };
    let start = b * base + if b < extra { b } else { extra };
    (start, len)
}

/// Exclusive prefix sums of per-peer counts: where each peer's block starts
/// in a packed buffer.
pub(crate) fn offsets(counts: &[usize]) -> Vec<usize> {
    counts
        .iter()
        .scan(0, |acc, &c| {
            let start = *acc;
            *acc += c;
            Some(start)
        })
        .collect()
}

/// The whole collective for a group of one (or a count every rank agrees
/// makes it local): copy `len` input elements to the output. In place the
/// copy is a no-op, which the executor skips.
pub(crate) fn single_rank(len: usize) -> Plan {
    let mut p = PlanBuilder::default();
    p.round().copy(Span::output(0, len), Span::input(0, len));
    p.finish()
}

/// A broadcast root's `plan` (its sends read only its input) with its copy
/// of `count` input elements into its output listed after the first round's
/// messages, so that it runs while they are in flight (with the
/// shared-memory single copy, while the first child reads the input:
/// bench/RESULTS.md, issue 20), or as the plan's only round when it has
/// none. In place the copy is a no-op, which the executor skips.
pub(crate) fn root_copy_overlapped(mut plan: Plan, count: usize) -> Plan {
    if count == 0 {
        return plan;
    }
    let copy = Op::Copy {
        dst: Span::output(0, count),
        src: Span::input(0, count),
    };
    match plan.rounds.first_mut() {
        Some(first) => first.ops.push(copy),
        None => plan.rounds.push(Round { ops: vec![copy] }),
    }
    plan
}

/// Builds a plan round by round; algorithms use it so that their code reads
/// like the pseudo-code of the literature.
#[derive(Default)]
pub(crate) struct PlanBuilder {
    plan: Plan,
}

impl PlanBuilder {
    /// Starts a new round and returns it.
    pub(crate) fn round(&mut self) -> RoundBuilder<'_> {
        self.plan.rounds.push(Round::default());
        RoundBuilder {
            round: self.plan.rounds.last_mut().expect("just pushed"),
        }
    }

    /// Reserves at least `elements` of scratch.
    pub(crate) fn scratch(&mut self, elements: usize) {
        self.plan.scratch = self.plan.scratch.max(elements);
    }

    /// Appends every round of `other` (and its scratch needs).
    pub(crate) fn append(&mut self, other: Plan) {
        self.scratch(other.scratch);
        self.plan.rounds.extend(other.rounds);
    }

    /// The finished plan, without empty rounds.
    pub(crate) fn finish(mut self) -> Plan {
        self.plan.rounds.retain(|r| !r.ops.is_empty());
        self.plan
    }
}

/// Adds ops to one round.
pub(crate) struct RoundBuilder<'a> {
    round: &'a mut Round,
}

impl RoundBuilder<'_> {
    pub(crate) fn send(&mut self, peer: usize, src: Span) -> &mut Self {
        self.round.ops.push(Op::Send { peer, src });
        self
    }
    pub(crate) fn recv(&mut self, peer: usize, dst: Span) -> &mut Self {
        self.round.ops.push(Op::Recv { peer, dst });
        self
    }
    pub(crate) fn recv_reduce(&mut self, peer: usize, dst: Span, local: Span) -> &mut Self {
        self.round.ops.push(Op::RecvReduce { peer, dst, local });
        self
    }
    pub(crate) fn copy(&mut self, dst: Span, src: Span) -> &mut Self {
        if dst.len > 0 {
            self.round.ops.push(Op::Copy { dst, src });
        }
        self
    }
    pub(crate) fn reduce(&mut self, dst: Span, a: Span, b: Span) -> &mut Self {
        if dst.len > 0 {
            self.round.ops.push(Op::Reduce { dst, a, b });
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_cover_the_count_exactly() {
        for count in 0..40 {
            for n in 1..10 {
                let mut next = 0;
                for b in 0..n {
                    let (start, len) = block(count, n, b);
                    assert_eq!(start, next);
                    next += len;
                }
                assert_eq!(next, count);
            }
        }
    }
}
