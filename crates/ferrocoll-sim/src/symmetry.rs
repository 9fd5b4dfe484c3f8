//! The aggregated mode: ranks that behave identically, simulated once.
//!
//! On a cluster of 100,000 ranks a ring allreduce is 2·10^10 messages, but
//! on a uniform fabric every rank does exactly what its neighbour does, at
//! the same instants. The aggregated mode simulates one rank of each such
//! class and lets it stand for the others.
//!
//! # The symmetry
//!
//! A [`Symmetry`] is a group of rank permutations σ_j, j in `0..m`, with
//! period k = n / m: either shifts, σ_j(x) = (x + j·k) mod n
//! ([`SymmetryKind::Shift`]: rings, direct and pairwise exchanges, Bruck,
//! the ring inside hierarchical algorithms), or exclusive-ors,
//! σ_j(x) = x xor j·k with n and k powers of two ([`SymmetryKind::Xor`]:
//! butterflies, recursive halving and doubling). Every rank x is
//! σ_{x / k}(x mod k) for exactly one j, so the ranks `0..k` (the
//! representatives) stand for all of them.
//!
//! It may be used when both halves of the run commute with every σ_j:
//!
//! * the network ([`Network::admits`]): routes map to routes
//!   (path(σx, σy) = σ(path(x, y)), links to links of the same bandwidth
//!   and latency) and the placement commutes with σ;
//! * the plans ([`check_plans`]): rank σ_j(x)'s plan is rank x's with
//!   every peer p replaced by σ_j(p), op for op, with the same lengths
//!   (local copies, which cost nothing, are ignored).
//!
//! Then the full run is symmetric too (the same events happen at the same
//! times for x and σ_j(x)), and the quotient run of [`crate::engine`]
//! reproduces it: a representative a that sends to rank b = σ_j(b') sends
//! to the representative b' over the real path from a to b, with each link
//! of that path replaced by the representative of its orbit (a link's
//! queue stands for the m queues of its orbit, which in the full run carry
//! copies of the same traffic at the same times). Messages between a pair
//! of representatives are matched per offset j: the receiver b' sees the
//! message as coming from p = σ_j⁻¹(a), so it computes j from p by the
//! inverse ([`Symmetry::inverse`]). Traffic and busy time per link are the
//! representative's for every link of its orbit.
//!
//! # How the plans are checked
//!
//! The representatives' plans are built anyway. When n times the length of
//! a plan is at most [`FULL_CHECK_OPS`] ops, every rank's plan is built
//! and compared, which proves the symmetry. Beyond that (a 100,000-rank
//! ring would need 2·10^10 ops) a sample is compared: the second period
//! `k..2k`, the last period, the images of three representatives under
//! σ_1, σ_2, σ_{m/2} and σ_{m-1}, and 16 ranks spread evenly. Algorithms
//! treat ranks alike or single out a few (a root, the extra ranks of a
//! non-power-of-two group, a remainder block), and those differ from their
//! neighbours, which the sample contains; an asymmetry that no sampled rank
//! shows would go unnoticed, which is why the tests compare aggregated and
//! full runs wherever both fit.
//!
//! # Uneven blocks
//!
//! Plans that commute with a shift except for the lengths of their blocks
//! (a count the ranks do not divide) have no symmetry in this sense;
//! [`crate::uneven`] aggregates them with the same quotient engine, the
//! lengths padded for the time and summed exactly for the traffic.

use ferrocoll::plan::{Op, Plan};

use crate::network::Network;

/// Plans of up to this many ops in all ranks together are all compared.
pub const FULL_CHECK_OPS: usize = 1 << 22;

/// Which permutations relate equivalent ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SymmetryKind {
    /// σ_j(x) = (x + j·k) mod n.
    Shift,
    /// σ_j(x) = x xor j·k (n and k powers of two).
    Xor,
}

impl SymmetryKind {
    /// `shift` or `xor`.
    pub fn name(self) -> &'static str {
        match self {
            SymmetryKind::Shift => "shift",
            SymmetryKind::Xor => "xor",
        }
    }
}

/// A group of rank permutations (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Symmetry {
    /// Shifts or exclusive-ors.
    pub kind: SymmetryKind,
    /// k: the representatives are ranks `0..period`.
    pub period: usize,
    /// n, the number of ranks (a multiple of `period`).
    pub ranks: usize,
}

impl Symmetry {
    /// m = n / k: how many ranks each representative stands for.
    pub fn copies(&self) -> usize {
        self.ranks / self.period
    }

    /// σ_j(x).
    pub fn apply(&self, j: usize, x: usize) -> usize {
        match self.kind {
            SymmetryKind::Shift => (x + j * self.period) % self.ranks,
            SymmetryKind::Xor => x ^ (j * self.period),
        }
    }

    /// The representative of `x` (x mod k).
    pub fn rep(&self, x: usize) -> usize {
        x % self.period
    }

    /// The j with `x = σ_j(rep(x))` (x / k, for both kinds).
    pub fn index(&self, x: usize) -> usize {
        x / self.period
    }

    /// The j' with σ_j' = σ_j⁻¹.
    pub fn inverse(&self, j: usize) -> usize {
        match self.kind {
            SymmetryKind::Shift => (self.copies() - j % self.copies()) % self.copies(),
            SymmetryKind::Xor => j,
        }
    }

    /// Whether this is a valid group on `ranks` ranks: k divides n, at
    /// least two copies, and powers of two for [`SymmetryKind::Xor`].
    pub fn is_valid(&self) -> bool {
        let (k, n) = (self.period, self.ranks);
        k >= 1
            && n % k == 0
            && n / k >= 2
            && (self.kind == SymmetryKind::Shift || (n.is_power_of_two() && k.is_power_of_two()))
    }
}

impl std::fmt::Display for Symmetry {
    /// e.g. `shift by 8: 8 of 4096 ranks simulated`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} by {}: {} of {} ranks simulated",
            self.kind.name(),
            self.period,
            self.period,
            self.ranks
        )
    }
}

/// The ops of a plan that cost time (copies left out), numbered by the
/// rounds that have any: a round of local copies only costs nothing, and
/// ranks that differ only in such rounds (a final rotation that one rank
/// does not need) behave alike.
pub(crate) fn timed_ops(plan: &Plan) -> impl Iterator<Item = (usize, &Op)> + '_ {
    plan.rounds
        .iter()
        .map(|r| r.ops.iter().filter(|op| !matches!(op, Op::Copy { .. })))
        .filter(|ops| ops.clone().next().is_some())
        .enumerate()
        .flat_map(|(i, ops)| ops.map(move |op| (i, op)))
}

/// Whether `image` (rank σ_j(x)'s plan) is `plan` (rank x's) with every
/// peer p replaced by σ_j(p); `None` when it is, else the first round (of
/// those with timed ops) that differs.
fn differs(sym: &Symmetry, j: usize, plan: &Plan, image: &Plan) -> Option<usize> {
    differs_by(sym, j, plan, image, true)
}

/// [`differs`], comparing the ops' lengths only when `lengths` (without,
/// it compares the plans' shape: rounds, kinds of op, mapped peers; see
/// [`crate::uneven`]).
pub(crate) fn differs_by(
    sym: &Symmetry,
    j: usize,
    plan: &Plan,
    image: &Plan,
    lengths: bool,
) -> Option<usize> {
    let mut a = timed_ops(plan);
    let mut b = timed_ops(image);
    loop {
        match (a.next(), b.next()) {
            (None, None) => return None,
            (Some((ra, x)), Some((rb, y))) => {
                let same = ra == rb
                    && match (x, y) {
                        (Op::Send { peer: p, src: s }, Op::Send { peer: q, src: t }) => {
                            sym.apply(j, *p) == *q && (!lengths || s.len == t.len)
                        }
                        (Op::Recv { peer: p, dst: s }, Op::Recv { peer: q, dst: t })
                        | (
                            Op::RecvReduce {
                                peer: p, dst: s, ..
                            },
                            Op::RecvReduce {
                                peer: q, dst: t, ..
                            },
                        ) => sym.apply(j, *p) == *q && (!lengths || s.len == t.len),
                        (Op::Reduce { dst: s, .. }, Op::Reduce { dst: t, .. }) => {
                            !lengths || s.len == t.len
                        }
                        _ => false,
                    };
                if !same {
                    return Some(ra.min(rb));
                }
            }
            (Some((r, _)), None) | (None, Some((r, _))) => return Some(r),
        }
    }
}

/// The ranks whose plans [`check_plans`] compares with their
/// representatives' (all of them when `all`), in increasing order, without
/// the representatives themselves.
pub(crate) fn ranks_to_check(sym: &Symmetry, all: bool) -> Vec<usize> {
    let (k, n, m) = (sym.period, sym.ranks, sym.copies());
    let mut v: Vec<usize> = if all {
        (k..n).collect()
    } else {
        let mut v: Vec<usize> = (k..2 * k).chain(n - k..n).collect();
        for j in [1, 2, m / 2, m - 1] {
            for a in [0, k / 2, k - 1] {
                v.push(sym.apply(j % m, a));
            }
        }
        v.extend((0..16).map(|i| i * n / 16));
        v
    };
    v.retain(|&x| x >= k);
    v.sort_unstable();
    v.dedup();
    v
}

/// Checks that the plans commute with `sym`: `reps[a]` is representative
/// a's plan (a in `0..k`) and `build(x)` builds rank x's. Fails naming the
/// first rank whose plan is not its representative's image (and the round
/// where they part), or with `build`'s error.
pub fn check_plans(
    sym: &Symmetry,
    reps: &[Plan],
    build: &dyn Fn(usize) -> Result<Plan, String>,
) -> Result<(), String> {
    let ops: usize = reps
        .iter()
        .map(|p| p.rounds.iter().map(|r| r.ops.len()).sum::<usize>())
        .max()
        .unwrap_or(0);
    let all = ops.saturating_mul(sym.ranks) <= FULL_CHECK_OPS;
    for x in ranks_to_check(sym, all) {
        let (a, j) = (sym.rep(x), sym.index(x));
        let plan = build(x)?;
        if let Some(round) = differs(sym, j, &reps[a], &plan) {
            return Err(format!(
                "rank {x}'s plan is not rank {a}'s mapped by {} {} (they differ in round {round})",
                sym.kind.name(),
                j * sym.period
            ));
        }
    }
    Ok(())
}

/// The smallest symmetry that both the network and the plans have, with
/// the representatives' plans. Tries the periods `k < n` in increasing
/// order, for each shifts then exclusive-ors (when the network admits
/// them), and for each compares rank k's plan with rank 0's before building the other
/// representatives. `build(x)` builds rank x's plan. Fails when none fits,
/// saying why for the smallest period the network admits.
pub fn find(
    net: &Network,
    build: &dyn Fn(usize) -> Result<Plan, String>,
) -> Result<(Symmetry, Vec<Plan>), String> {
    let n = net.ranks();
    let first = build(0)?;
    let mut why: Option<String> = None;
    for period in (1..n).filter(|k| n % k == 0) {
        for kind in [SymmetryKind::Shift, SymmetryKind::Xor] {
            let sym = Symmetry {
                kind,
                period,
                ranks: n,
            };
            if !sym.is_valid() || !net.admits(&sym) {
                continue;
            }
            // Rank k = σ_1(0): a cheap first test before k plans are built.
            let second = build(period)?;
            if let Some(round) = differs(&sym, 1, &first, &second) {
                why.get_or_insert_with(|| {
                    format!(
                        "rank {period}'s plan is not rank 0's mapped by {} {period} (they differ in round {round})",
                        kind.name()
                    )
                });
                continue;
            }
            let mut reps = Vec::with_capacity(period);
            reps.push(first.clone());
            for a in 1..period {
                reps.push(build(a)?);
            }
            match check_plans(&sym, &reps, build) {
                Ok(()) => return Ok((sym, reps)),
                Err(e) => {
                    why.get_or_insert(e);
                }
            }
        }
    }
    Err(match why {
        Some(e) => format!(
            "no symmetry to aggregate: {e}; the aggregated mode needs plans in which ranks differ only by a shift or exclusive-or of their numbers (ring, direct, pairwise, bruck, butterfly, hier, ...), on a topology and placement with the same symmetry; run without aggregation"
        ),
        None => "no symmetry to aggregate: the topology and placement admit no shift or exclusive-or of the ranks (a random or listed placement, or a single rank); run without aggregation".to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shifts_and_xors_act_as_documented() {
        let s = Symmetry {
            kind: SymmetryKind::Shift,
            period: 4,
            ranks: 12,
        };
        assert_eq!(s.copies(), 3);
        for x in 0..12 {
            assert_eq!(s.apply(s.index(x), s.rep(x)), x);
            let j = s.index(x);
            assert_eq!(s.apply(s.inverse(j), x), s.rep(x));
        }
        let x = Symmetry {
            kind: SymmetryKind::Xor,
            period: 2,
            ranks: 16,
        };
        for r in 0..16 {
            assert_eq!(x.apply(x.index(r), x.rep(r)), r);
            assert_eq!(x.apply(x.inverse(x.index(r)), r), x.rep(r));
        }
        assert!(s.is_valid() && x.is_valid());
        let bad = Symmetry {
            kind: SymmetryKind::Xor,
            period: 4,
            ranks: 12,
        };
        assert!(!bad.is_valid());
        assert_eq!(s.to_string(), "shift by 4: 4 of 12 ranks simulated");
    }

    #[test]
    fn samples_cover_the_edges() {
        let s = Symmetry {
            kind: SymmetryKind::Shift,
            period: 4,
            ranks: 1 << 20,
        };
        let v = ranks_to_check(&s, false);
        assert!(v.contains(&4) && v.contains(&7) && v.contains(&((1 << 20) - 1)));
        assert!(v.iter().all(|x| (4..1 << 20).contains(x)));
        assert!(v.len() < 64);
        assert_eq!(ranks_to_check(&s, true).len(), (1 << 20) - 4);
    }
}
