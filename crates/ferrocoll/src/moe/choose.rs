//! Which schedule a dispatch or combine runs, why, and running it.
//!
//! Precedence: [`super::Spec::schedule`] when it is not `auto`, then
//! `FERROCOLL_MOE_SCHEDULE` (read when the dispatcher is built), then, if the
//! communicator forces an alltoallv algorithm (its call options or
//! `FERROCOLL_ALGO`), [`Schedule::Flat`] (that algorithm, as before the
//! dispatcher had schedules), else the cost model: the candidate of
//! [`super::schedule::price`] with the least predicted time on the count
//! matrix every rank holds, the communicator's profile and topology (ties
//! within 2 % to the fewest rounds, [`super::schedule::choose`]). Every
//! input is the same on every rank, so every rank chooses alike.
//!
//! Where the model's choice is predicted within [`tune::MEASURED_UP_TO`]
//! (3 ms), `auto` then races it on real calls of the same class against
//! the other candidates predicted within [`tune::BAND`] (2x) of it (pairwise
//! only as the model's choice): in turns, a candidate slower beyond doubt
//! dropped after each round from [`tune::MIN_SAMPLES`] calls, the least
//! median winning at [`tune::MAX_SAMPLES`] (`tune.rs`). Every rank records
//! the slowest rank's times, so every rank still chooses alike.
//!
//! `FERROCOLL_DEBUG=tune` makes rank 0 print the candidates' predicted (and
//! measured) times and the choice to stderr, for the first dispatch and the
//! first combine and whenever the choice changes from the previous call's
//! (a race's first call only).

use std::sync::Arc;

use crate::comm::{CallOptions, Communicator};
use crate::cost::Profile;
use crate::env::{self, Vars};
use crate::error::Result;
use crate::plan::{Algorithm, Collective};
use crate::types::Element;

use super::schedule::{self, Candidate, Schedule};
use super::tune;
use super::two_level::Groups;
use super::Dispatcher;

/// The variable that forces a schedule for every dispatcher whose spec
/// does not.
pub(super) const VAR: &str = "FERROCOLL_MOE_SCHEDULE";

/// Which exchange of a layer is being chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Direction {
    Dispatch,
    Combine,
}

impl Direction {
    fn name(self) -> &'static str {
        match self {
            Direction::Dispatch => "dispatch",
            Direction::Combine => "combine",
        }
    }
}

/// `FERROCOLL_MOE_SCHEDULE` through `vars` (`auto` when unset).
pub(super) fn schedule_from_env(vars: Vars<'_>) -> Result<Schedule> {
    let Some(v) = env::get(vars, VAR) else {
        return Ok(Schedule::Auto);
    };
    v.parse::<Schedule>().map_err(|_| {
        env::bad(
            VAR,
            &v,
            format!(
                "not a schedule; use one of {}, e.g. {VAR}=two-level",
                Schedule::ALL.map(|s| s.name()).join(", ")
            ),
        )
    })
}

/// Checks `FERROCOLL_MOE_SCHEDULE` through `vars` as a dispatcher would
/// read it (for [`crate::init::check_vars`]: a bad value is reported at
/// start-up, not at the first dispatcher).
pub(crate) fn check_env(vars: Vars<'_>) -> Result<()> {
    schedule_from_env(vars).map(|_| ())
}

impl Dispatcher {
    /// The schedule of one exchange of `rows` (`[s·P + d]` rows, s to d),
    /// never `Auto`, and the class it is measured in when `auto` is
    /// measuring (`tune.rs`); explains it under `FERROCOLL_DEBUG=tune`.
    /// `row_bytes` is the bytes of one row (dispatch's element type; combine
    /// is priced with it too, its outputs' type being unknown until then).
    pub(super) fn resolve(
        &self,
        rows: &[usize],
        row_bytes: f64,
        dir: Direction,
    ) -> Result<(Schedule, Option<tune::Key>)> {
        let p = self.comm.size();
        let tune = self.comm.config().debug_tune && self.comm.rank() == 0;
        let forcing = self
            .comm
            .options()
            .algorithm
            .or_else(|| self.comm.config().algorithms.get(Collective::AllToAllV));
        let (forced, by) = self.forced;
        let decided = if forced != Schedule::Auto {
            Some((forced, format!("forced by {by}")))
        } else if let Some(a) = forcing {
            Some((
                Schedule::Flat,
                format!(
                    "the communicator forces alltoallv's algorithm ({}): one all_to_all_v with it",
                    a.name()
                ),
            ))
        } else if p == 1 {
            Some((Schedule::Direct, "one rank: a local copy".to_string()))
        } else {
            None
        };
        if let (Some((s, _)), false) = (&decided, tune) {
            return Ok((*s, None));
        }
        let candidates = self.candidates(rows, row_bytes);
        // The class and how the tuner picked, where `auto` asked it.
        let mut tuned = None;
        let (choice, why) = match decided {
            Some(d) => d,
            None => {
                let best = schedule::choose(&candidates).expect("direct is always a candidate");
                let class = tune::class_of(dir as usize, rows, p, row_bytes);
                let (s, how) = self.tuner().pick(class, &candidates, best);
                if how != tune::Pick::Model {
                    tuned = Some((class, how));
                }
                let why = match how {
                    tune::Pick::Racing => format!(
                        "racing the model's {} against the candidates predicted within {:.0} %",
                        best.schedule.name(),
                        tune::BAND * 100.0,
                    ),
                    tune::Pick::Raced => format!(
                        "won the race against the model's {} and the candidates within {:.0} % of it",
                        best.schedule.name(),
                        tune::BAND * 100.0,
                    ),
                    tune::Pick::Model if Some(best) == schedule::cheapest(&candidates) => {
                        "least predicted time".to_string()
                    }
                    tune::Pick::Model => format!(
                        "fewest rounds among the predictions within {:.0} % of the least",
                        schedule::TIE * 100.0
                    ),
                };
                (s, why)
            }
        };
        if tune {
            self.explain(dir, rows, row_bytes, &candidates, (choice, &why), tuned);
        }
        // Only a racing exchange reports its time: the others' times would
        // pile up unread.
        let report = tuned
            .filter(|&(_, how)| how == tune::Pick::Racing)
            .map(|(class, _)| class);
        Ok((choice, report))
    }

    /// The candidates' predicted times for `rows` on this communicator.
    fn candidates(&self, rows: &[usize], row_bytes: f64) -> Vec<Candidate> {
        let p = self.comm.size();
        let matrix: Vec<Vec<f64>> = rows
            .chunks(p)
            .map(|r| r.iter().map(|&x| x as f64).collect())
            .collect();
        let total: f64 = rows.iter().sum::<usize>() as f64 * row_bytes;
        schedule::price(
            &matrix,
            row_bytes,
            self.comm.topology(),
            &in_memory(self.comm.profile(), total),
        )
    }

    /// Prints the table of `FERROCOLL_DEBUG=tune` when the choice is new
    /// for `dir`, with what `auto` measured of each candidate in the class
    /// of `tuned` (and how it picked); a race prints its first call only
    /// (its calls alternate).
    fn explain(
        &self,
        dir: Direction,
        rows: &[usize],
        rb: f64,
        candidates: &[Candidate],
        (choice, why): (Schedule, &str),
        tuned: Option<(tune::Key, tune::Pick)>,
    ) {
        let racing = matches!(tuned, Some((_, tune::Pick::Racing)));
        let slot = dir as usize;
        {
            let Ok(mut last) = self.state.explained.lock() else {
                return;
            };
            // `Auto` (never a chosen schedule) stands for "racing".
            let shown = if racing { Schedule::Auto } else { choice };
            if last[slot] == Some(shown) {
                return;
            }
            last[slot] = Some(shown);
        }
        let measured = |s: Schedule| self.tuner().summary(tuned?.0, s);
        let p = self.comm.size();
        let remote = |s: usize, d: usize| if s == d { 0 } else { rows[s * p + d] };
        let sent = (0..p)
            .map(|s| (0..p).map(|d| remote(s, d)).sum::<usize>())
            .max()
            .unwrap_or(0);
        let received = (0..p)
            .map(|d| (0..p).map(|s| remote(s, d)).sum::<usize>())
            .max()
            .unwrap_or(0);
        let mut text = format!(
            "ferrocoll tune: moe {} on {p} ranks (topology {}), {} rows of {rb} B; busiest rank sends \
             {:.0} B and receives {:.0} B to and from other ranks; predicted (us):",
            dir.name(),
            self.comm.topology(),
            rows.iter().sum::<usize>(),
            sent as f64 * rb,
            received as f64 * rb,
        );
        for c in candidates {
            text.push_str(&format!(
                "\n  {:<10} {:>12.2} = latency {:.2} + bandwidth {:.2} + compute {:.2}",
                c.schedule.name(),
                c.cost.total() * 1e6,
                c.cost.latency * 1e6,
                c.cost.bandwidth * 1e6,
                c.cost.compute * 1e6
            ));
            if let Some(m) = measured(c.schedule) {
                text.push_str(&format!("; {m}"));
            }
        }
        let mut ranked = candidates.to_vec();
        ranked.sort_by(|a, b| a.cost.total().total_cmp(&b.cost.total()));
        text.push_str(&format!("\n  chosen {}: {why}", choice.name()));
        if let [w, r, ..] = ranked.as_slice() {
            text.push_str(&format!(
                "; model's winner {}, runner-up {} ({:.2}x)",
                w.schedule.name(),
                r.schedule.name(),
                r.cost.total() / w.cost.total().max(f64::MIN_POSITIVE)
            ));
        }
        eprintln!("{text}");
    }

    /// Moves `send` (packed by destination rank, `rows[me·P + d]` rows for
    /// rank d) by `schedule` into `recv` (packed by source rank, exactly
    /// the rows that arrive).
    pub(super) fn exchange<T: Element>(
        &self,
        schedule: Schedule,
        send: &[T],
        rows: &[usize],
        recv: &mut [T],
    ) -> Result<()> {
        let (p, me, h) = (self.comm.size(), self.comm.rank(), self.spec.hidden);
        match schedule {
            Schedule::TwoLevel => {
                return self
                    .groups()?
                    .exchange(send, rows, h, recv, &self.state.pool)
            }
            Schedule::Rail => {
                return self
                    .groups()?
                    .rail_exchange(send, rows, h, recv, &self.state.pool)
            }
            _ => {}
        }
        let send_counts: Vec<usize> = (0..p).map(|d| rows[me * p + d] * h).collect();
        let recv_counts: Vec<usize> = (0..p).map(|s| rows[s * p + me] * h).collect();
        self.flat_comm(schedule)
            .all_to_all_v(send, &send_counts, recv, &recv_counts)
    }

    /// The communicator handle a flat schedule's all-to-all-v runs on: this
    /// one with `direct` or `pairwise` forced (its other options, the
    /// deadline, kept), or as it is for [`Schedule::Flat`].
    pub(super) fn flat_comm(&self, schedule: Schedule) -> Communicator {
        let algorithm = match schedule {
            Schedule::Direct => Algorithm::Direct,
            Schedule::Pairwise => Algorithm::Pairwise,
            _ => return self.comm.clone(),
        };
        self.comm.with_options(CallOptions {
            algorithm: Some(algorithm),
            ..self.comm.options().clone()
        })
    }

    /// Makes what `schedule` runs on (the hierarchical schedules'
    /// sub-communicators) if it is not made yet.
    pub(super) fn prepare(&self, schedule: Schedule) -> Result<()> {
        if matches!(schedule, Schedule::TwoLevel | Schedule::Rail) {
            self.groups()?;
        }
        Ok(())
    }

    /// The two-level sub-communicators, made by the first call that needs
    /// them (a collective split: every rank gets here in the same call,
    /// as every rank chose the same schedule).
    fn groups(&self) -> Result<Arc<Groups>> {
        let mut groups = self
            .state
            .groups
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(g) = groups.as_ref() {
            return Ok(Arc::clone(g));
        }
        let made = Arc::new(Groups::new(&self.comm)?);
        *groups = Some(Arc::clone(&made));
        Ok(made)
    }
}

/// `profile` as it applies to an exchange of `bytes` sent (and as many
/// received): [`Profile::for_working_set`].
fn in_memory(profile: Profile, bytes: f64) -> Profile {
    profile.for_working_set(2.0 * bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_is_read_and_checked() {
        let get = |v: &'static str| move |name: &str| (name == VAR).then(|| v.to_string());
        assert_eq!(schedule_from_env(&get("")).unwrap(), Schedule::Auto);
        assert_eq!(
            schedule_from_env(&get(" Two-Level ")).unwrap(),
            Schedule::TwoLevel
        );
        assert_eq!(
            schedule_from_env(&get("pairwise")).unwrap(),
            Schedule::Pairwise
        );
        let e = schedule_from_env(&get("ring")).unwrap_err().to_string();
        assert!(e.contains(VAR) && e.contains("two-level"), "{e}");
    }
}
