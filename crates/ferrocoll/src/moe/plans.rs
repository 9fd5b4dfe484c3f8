//! The MoE exchange as plans: what every rank sends and receives, round by
//! round, under each [`Schedule`], for the simulator (`ferrocoll sim moe`).
//!
//! The executor runs a schedule as a sequence of all-to-all-v calls: one on
//! the whole communicator for `direct` and `pairwise`, and for `two-level`
//! and `rail` one per phase on the sub-communicators of `two_level.rs`
//! (host, rail, host pair), with the counts of `two_level::View`, skipping a
//! phase its group knows to be empty. `plan` builds rank r's calls from
//! the same counts and the same plan functions the executor runs them with
//! (the sub-communicators' all-to-all-v is `direct`, the default), maps the
//! peers from sub-communicator ranks to ranks of the whole, and appends
//! the calls' rounds in the order the executor makes them. A rank's rounds
//! then keep the executor's order; messages between two ranks match in
//! plan order, as the phases' do on their separate communicators (a pair
//! of ranks meets in phase 1 before phase 3 on both sides).
//!
//! Spans count elements of the calls' own buffers (every call's input and
//! output start at 0), which a simulator that only moves bytes does not
//! read. Local work (packing, regrouping by expert) is not in the plans:
//! the simulator's local copies are free. A flat schedule that the
//! dispatcher runs expert by expert (`passes.rs`, when the profile's copy
//! cost outweighs E/P - 1 more start-ups) moves the same bytes in E/P calls;
//! `plan` builds the one-call form.

use crate::error::{Error, Result};
use crate::plan::{self, Algorithm, Collective, Op, Plan, PlanRequest};
use crate::topo::Topology;

use super::schedule::{Hosts, Schedule};
use super::two_level::{Phase, View};
use super::{routing, Spec};

/// The count matrix of one dispatch, as every rank holds it after the
/// count exchange and decides on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CountMatrix {
    /// Ranks (P).
    pub ranks: usize,
    /// `rows[s·P + d]`: rows rank s sends rank d in dispatch, after drops
    /// (combine sends them back: the transpose).
    pub rows: Vec<usize>,
    /// Every expert's capacity in rows (`None`: dropless).
    pub capacity: Option<usize>,
    /// (token, choice) pairs dropped, all ranks together.
    pub dropped: usize,
}

impl CountMatrix {
    /// What a dispatcher of `spec` on `ranks` ranks decides for the routed
    /// pairs `routed[(s·E + e)·k + j]` (source rank s's pairs of choice j
    /// to expert e, the count exchange's payload): the dispatcher's own
    /// rule (capacity, priority order), so the rows are those its dispatch
    /// would send. Fails when the experts do not split over the ranks or
    /// `routed` is not P·E·k long.
    pub fn decide(routed: &[usize], ranks: usize, spec: &Spec) -> Result<CountMatrix> {
        let (e_all, k) = (spec.experts, spec.topk);
        if ranks == 0 || e_all % ranks != 0 || routed.len() != ranks * e_all * k {
            return Err(Error::invalid(format!(
                "moe::plans::CountMatrix::decide: {} counts for {ranks} ranks of {e_all} experts                  (a multiple of the ranks) and top-{k}; need ranks x experts x topk",
                routed.len()
            )));
        }
        let (capacity, kept_ejk) = routing::decide(routed, ranks, e_all, k, spec.policy);
        let kept: Vec<usize> = kept_ejk.chunks_exact(k).map(|c| c.iter().sum()).collect();
        Ok(CountMatrix {
            ranks,
            rows: routing::rank_rows(&kept, ranks, e_all),
            capacity,
            dropped: routed.iter().sum::<usize>() - kept.iter().sum::<usize>(),
        })
    }

    /// Combine's matrix: the transpose.
    pub fn transpose(&self) -> CountMatrix {
        CountMatrix {
            rows: super::transpose(&self.rows, self.ranks),
            ..self.clone()
        }
    }
}

/// Rank `rank`'s plan for the exchange `rows` (`rows[s·P + d]`: rows of
/// `hidden` elements rank s sends rank d, the count matrix every rank holds
/// after the count exchange) by `schedule` on `topology` (its outermost
/// level the hosts, as for the dispatcher). [`Schedule::Flat`] is the
/// communicator's default algorithm, `direct`. Combine's exchange is the
/// transpose of dispatch's.
///
/// Fails for [`Schedule::Auto`] (choose first: [`super::model::choose`] on
/// [`super::model::price`]), when `rows` is not P x P for the topology's P
/// ranks, or `rank` is not one of them.
pub fn plan(
    schedule: Schedule,
    rows: &[usize],
    hidden: usize,
    topology: &Topology,
    rank: usize,
) -> Result<Plan> {
    let hosts = Hosts::of(topology);
    let n = hosts.n;
    if rows.len() != n * n || rank >= n {
        return Err(Error::invalid(format!(
            "moe::plans::plan: need a {n} x {n} count matrix ({} entries given) and a rank below \
             {n} (got {rank}) for topology {topology}",
            rows.len()
        )));
    }
    let v = View {
        hosts,
        rows,
        h: hidden,
    };
    let (x, i) = (rank / hosts.l, rank % hosts.l);
    let host: Vec<usize> = (0..hosts.l).map(|j| x * hosts.l + j).collect();
    let mut out = Plan::default();
    match schedule {
        Schedule::Auto => {
            return Err(Error::invalid(
                "moe::plans::plan: `auto` is a choice, not a route; price the candidates \
                 (moe::model::price) and pass the one moe::model::choose picks",
            ))
        }
        Schedule::Direct | Schedule::Flat | Schedule::Pairwise => {
            let algo = if schedule == Schedule::Pairwise {
                Algorithm::Pairwise
            } else {
                Algorithm::Direct
            };
            let phase = Phase {
                send: (0..n).map(|d| v.rows[rank * n + d] * hidden).collect(),
                recv: (0..n).map(|s| v.rows[s * n + rank] * hidden).collect(),
                runs: true,
            };
            let all: Vec<usize> = (0..n).collect();
            append(&mut out, algo, &phase, &all, rank)?;
        }
        Schedule::TwoLevel => {
            let phases = v.two_level(rank);
            append(&mut out, Algorithm::Direct, &phases.aggregate, &host, i)?;
            for (y, phase) in &phases.pairs {
                // Pair rank 0 is the lower host's gateway.
                let (lo, hi) = (x.min(*y), x.max(*y));
                let pair = [lo * hosts.l + i, hi * hosts.l + i];
                append(
                    &mut out,
                    Algorithm::Direct,
                    phase,
                    &pair,
                    usize::from(x > *y),
                )?;
            }
            append(&mut out, Algorithm::Direct, &phases.scatter, &host, i)?;
        }
        Schedule::Rail => {
            let [local, across] = v.rail(rank);
            let rail: Vec<usize> = (0..hosts.g).map(|y| y * hosts.l + i).collect();
            append(&mut out, Algorithm::Direct, &local, &host, i)?;
            append(&mut out, Algorithm::Direct, &across, &rail, x)?;
        }
    }
    Ok(out)
}

/// Appends to `out` the rounds of `phase` (skipped unless it runs): the
/// all-to-all-v plan of `algo` on the group `members` (its ranks in the
/// whole, by group rank), of which this rank is member `me`, with the peers
/// renamed to ranks of the whole.
fn append(
    out: &mut Plan,
    algo: Algorithm,
    phase: &Phase,
    members: &[usize],
    me: usize,
) -> Result<()> {
    if !phase.runs {
        return Ok(());
    }
    let req = PlanRequest::new(Collective::AllToAllV, members.len(), me, 0)
        .with_counts(phase.send.clone(), phase.recv.clone());
    let p = plan::build(algo, &req)?;
    out.scratch = out.scratch.max(p.scratch);
    for mut round in p.rounds {
        for op in &mut round.ops {
            match op {
                Op::Send { peer, .. } | Op::Recv { peer, .. } | Op::RecvReduce { peer, .. } => {
                    *peer = members[*peer]
                }
                Op::Copy { .. } | Op::Reduce { .. } => {}
            }
        }
        out.rounds.push(round);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{match_messages, Buf};

    fn plans(schedule: Schedule, rows: &[usize], h: usize, t: &Topology) -> Vec<Plan> {
        (0..t.size())
            .map(|r| plan(schedule, rows, h, t, r).unwrap())
            .collect()
    }

    /// Elements the plans send between hosts of `l` ranks.
    fn across(ps: &[Plan], l: usize) -> usize {
        ps.iter()
            .enumerate()
            .flat_map(|(r, p)| p.ops().map(move |op| (r, op)))
            .filter_map(|(r, op)| match op {
                Op::Send { peer, src } if peer / l != r / l => Some(src.len),
                _ => None,
            })
            .sum()
    }

    #[test]
    fn every_schedule_moves_the_matrix_across_hosts_once() {
        let t: Topology = "3x2".parse().unwrap();
        let n = t.size();
        let rows: Vec<usize> = (0..n * n).map(|q| (q * 7 + 3) % 5).collect();
        let h = 4;
        let between: usize = (0..n * n)
            .filter(|q| q / n / 2 != q % n / 2)
            .map(|q| rows[q] * h)
            .sum();
        for schedule in [
            Schedule::Direct,
            Schedule::Pairwise,
            Schedule::TwoLevel,
            Schedule::Rail,
        ] {
            let ps = plans(schedule, &rows, h, &t);
            // The plans fit together: every send has its receive, of its
            // length, in an order that cannot deadlock.
            match_messages(&ps).unwrap_or_else(|e| panic!("{schedule}: {e}"));
            // Every row between hosts crosses once, whatever the route.
            assert_eq!(across(&ps, 2), between, "{schedule}");
            // Each rank's final arrivals are its column of the matrix: in
            // one call directly, through the phases as their last hop.
            for (d, p) in ps.iter().enumerate() {
                let column: usize = (0..n)
                    .filter(|&s| s != d)
                    .map(|s| rows[s * n + d] * h)
                    .sum();
                if matches!(schedule, Schedule::Direct | Schedule::Pairwise) {
                    let got: usize = p
                        .ops()
                        .filter_map(|op| match op {
                            Op::Recv { dst, .. } if dst.buf == Buf::Output => Some(dst.len),
                            _ => None,
                        })
                        .sum();
                    assert_eq!(got, column, "{schedule} rank {d}");
                }
            }
        }
    }

    #[test]
    fn two_level_sends_one_message_per_host_pair_between_hosts() {
        let t: Topology = "4x2".parse().unwrap();
        let n = t.size();
        let rows = vec![1usize; n * n];
        let ps = plans(Schedule::TwoLevel, &rows, 1, &t);
        // 4 hosts: 6 pairs, one message each way, of the 4 rows one host
        // has for the other; direct sends 8 x 6 messages of 1 row.
        let messages = |ps: &[Plan]| {
            ps.iter()
                .enumerate()
                .map(|(r, p)| {
                    p.ops()
                        .filter(|op| matches!(op, Op::Send { peer, .. } if peer / 2 != r / 2))
                        .count()
                })
                .sum::<usize>()
        };
        assert_eq!(messages(&ps), 12);
        assert_eq!(messages(&plans(Schedule::Direct, &rows, 1, &t)), 48);
    }

    #[test]
    fn empty_phases_are_skipped_and_auto_is_refused() {
        let t: Topology = "2x2".parse().unwrap();
        let zero = vec![0usize; 16];
        assert!(plan(Schedule::TwoLevel, &zero, 8, &t, 0)
            .unwrap()
            .rounds
            .is_empty());
        let e = plan(Schedule::Auto, &zero, 8, &t, 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("moe::model::choose"), "{e}");
        assert!(plan(Schedule::Direct, &zero[..15], 8, &t, 0).is_err());
    }
}
