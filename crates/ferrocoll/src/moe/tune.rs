//! Measured refinement of `auto`: which of its candidates the calls
//! themselves find fastest.
//!
//! The seeds' advice for MoE all-to-alls: "the runtime should benchmark
//! candidate schedules with the observed count distribution". The model
//! prices every candidate on the observed matrix. It ranks the flat ones
//! well against each other, but not flat against through the hosts, nor
//! two-level against rail: those differences are what an intra-host round
//! and a message more through a host's link cost on the machine at hand,
//! which on the 2-host cluster moved from one machine to the next while the
//! model's ranking did not (bench/RESULTS.md, issue 18).
//!
//! So where the model's choice is predicted to take at most
//! [`MEASURED_UP_TO`], `auto` races it against every other candidate
//! predicted within [`BAND`] of it (pairwise only where it is the model's
//! choice: it differs from direct only in its lower concurrency, and the
//! forced runs never found it the faster by more than the noise), on real
//! calls of the same class (direction and the busiest rank's bytes to
//! within a factor of 2):
//!
//! - the candidates run in turns (so that each follows the others as
//!   often: on a shaped link the previous exchange's burst decides how full
//!   the token bucket is);
//! - after every round from [`MIN_SAMPLES`] calls each, a candidate whose
//!   median is slower than the leader's beyond doubt (the distribution-free
//!   confidence intervals of the two medians, [`Z`] wide, do not overlap)
//!   is dropped;
//! - the race ends when one candidate is left, or at [`MAX_SAMPLES`] calls
//!   each: then the least median wins (the model's choice has no say: where
//!   the calls cannot tell the candidates apart, the model, whose errors
//!   between the families are larger, cannot either);
//! - the winner runs until [`REVISIT`] calls of the class, then the class
//!   races again (the machine's load changes).
//!
//! Far-apart candidates are thus dropped after a few calls, while near ones
//! get the samples that separate them: with a fixed 12 calls each (the
//! previous rule), schedules 5-10 % apart on the cluster's links were picked
//! by luck.
//!
//! Every rank must choose alike, so the times are the same on every rank:
//! each rank reports how long its last dispatch and combine exchanges took
//! in its next count exchange (two words of the allgather it makes
//! anyway), and a call's time is the slowest rank's. Every rank therefore
//! records the same numbers, in the same calls, and decides the same.

use std::collections::HashMap;

use super::schedule::{Candidate, Schedule};

/// Candidates predicted within this (relative) of the model's choice are
/// raced against it. Wide: on the 2-host cluster direct, predicted up to
/// 60 % above two-level at 1-4 tokens a rank, measured 15-37 % faster
/// (bench/RESULTS.md, issue 18); a candidate far behind costs only
/// [`MIN_SAMPLES`] calls before it is dropped.
pub(super) const BAND: f64 = 1.0;

/// Exchanges predicted longer than this (seconds) run the model's choice
/// unmeasured: on the 2-host cluster the model's choice was within 5 % of
/// the fastest at every exchange of 64 tokens a rank or more (4-60 ms a
/// layer), while the calls of a rival 20 % slower cost a 4096-token layer
/// on 1 Gbit/s links seconds (bench/RESULTS.md, issue 18).
pub(super) const MEASURED_UP_TO: f64 = 3e-3;

/// Calls each candidate gets before any is dropped.
pub(super) const MIN_SAMPLES: usize = 6;

/// Calls each candidate gets at most; then the least median wins.
pub(super) const MAX_SAMPLES: usize = 40;

/// Width of the medians' confidence intervals, in standard deviations of
/// the count of samples below the median (binomial, n/4 variance): 2 is
/// about 95 % each, so the leader is dropped by mistake rarely even with
/// a stall or two among its calls.
pub(super) const Z: f64 = 2.0;

/// Calls of a class after which its candidates are raced again (the
/// machine's load changes).
pub(super) const REVISIT: u32 = 1000;

/// A reported time meaning "nothing to report".
pub(super) const NONE: u32 = u32::MAX;

/// A class of exchanges: the direction (0 dispatch, 1 combine) and the
/// busiest rank's bytes, log2 rounded ([`class_of`]).
pub(super) type Key = (usize, u32);

/// What one class of calls has measured.
#[derive(Debug, Default)]
struct Class {
    /// Per schedule: the slowest rank's time of each call (seconds).
    times: HashMap<Schedule, Vec<f64>>,
    /// Candidates dropped from the race.
    dropped: Vec<Schedule>,
    /// The race's winner, once there is one.
    winner: Option<Schedule>,
    /// Calls since the class last started racing.
    calls: u32,
}

/// The measurements of one dispatcher (shared by its clones).
#[derive(Debug, Default)]
pub(super) struct Tuner {
    classes: HashMap<Key, Class>,
    /// Per direction, the class and schedule of the last raced exchange
    /// whose time the next count exchange brings.
    pending: [Option<(Key, Schedule)>; 2],
    /// Per direction, this rank's time of that exchange, in µs.
    elapsed: [u32; 2],
}

impl Tuner {
    /// The two words this rank contributes to the count exchange.
    pub(super) fn report(&self) -> [u32; 2] {
        [0, 1].map(|d| {
            if self.pending[d].is_some() {
                self.elapsed[d]
            } else {
                NONE
            }
        })
    }

    /// Records the slowest rank's time (`words[r]`: rank r's report) of
    /// each pending exchange.
    pub(super) fn record(&mut self, words: &[[u32; 2]]) {
        for d in 0..2 {
            let Some((key, schedule)) = self.pending[d].take() else {
                continue;
            };
            if words.iter().any(|w| w[d] == NONE) {
                continue;
            }
            let slowest = words.iter().map(|w| w[d]).max().unwrap_or(0) as f64 * 1e-6;
            self.classes
                .entry(key)
                .or_default()
                .times
                .entry(schedule)
                .or_default()
                .push(slowest);
        }
    }

    /// This rank's time of the exchange of direction `dir` just run by
    /// `schedule` in class `key`, reported by the next count exchange.
    pub(super) fn ran(&mut self, dir: usize, key: Key, schedule: Schedule, secs: f64) {
        self.pending[dir] = Some((key, schedule));
        self.elapsed[dir] = (secs * 1e6).round().min((NONE - 1) as f64) as u32;
    }

    /// The schedule to run for class `key` among `candidates` (priced, the
    /// model's choice `model`), and how it was picked. Only a
    /// [`Pick::Racing`] call's time is to be reported ([`Tuner::ran`]).
    pub(super) fn pick(
        &mut self,
        key: Key,
        candidates: &[Candidate],
        model: Candidate,
    ) -> (Schedule, Pick) {
        let mut racers: Vec<Candidate> = candidates
            .iter()
            .copied()
            .filter(|c| {
                c.schedule == model.schedule
                    || (c.schedule != Schedule::Pairwise
                        && c.cost.total() <= model.cost.total() * (1.0 + BAND))
            })
            .collect();
        // Long exchanges are not measured: their bytes dominate, which the
        // model prices well, and a rival's calls would cost too much.
        if racers.len() < 2 || model.cost.total() > MEASURED_UP_TO {
            return (model.schedule, Pick::Model);
        }
        let class = self.classes.entry(key).or_default();
        class.calls += 1;
        if class.calls > REVISIT {
            *class = Class {
                calls: 1,
                ..Class::default()
            };
        }
        if let Some(winner) = class.winner {
            return (winner, Pick::Raced);
        }
        // The model's choice first, then the others by prediction: the
        // first of equals runs next, so the candidates take turns.
        racers.sort_by(|a, b| {
            let first = |c: &Candidate| c.schedule != model.schedule;
            (first(a), a.cost.total())
                .partial_cmp(&(first(b), b.cost.total()))
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        let left: Vec<Schedule> = racers
            .iter()
            .map(|c| c.schedule)
            .filter(|s| !class.dropped.contains(s))
            .collect();
        // Calls of one class may price the candidates a little apart, so
        // those of this call may all but one (or all) have been dropped.
        match left.as_slice() {
            [] => return (model.schedule, Pick::Model),
            [only] => {
                class.winner = Some(*only);
                return (*only, Pick::Raced);
            }
            _ => {}
        }
        let samples = |s: &Schedule| class.times.get(s).map_or(0, Vec::len);
        let fewest = left.iter().map(samples).min().unwrap_or(0);
        let round_done = left.iter().all(|s| samples(s) == fewest);
        if fewest >= MIN_SAMPLES && round_done {
            // Per racer its median and the median's interval.
            let stats: Vec<(Schedule, f64, (f64, f64))> = left
                .iter()
                .map(|&s| {
                    let times = &class.times[&s];
                    (s, median(times), median_interval(times))
                })
                .collect();
            let &(leader, _, (_, leader_high)) = stats
                .iter()
                .min_by(|a, b| a.1.total_cmp(&b.1))
                .expect("two racers or more");
            let behind: Vec<Schedule> = stats
                .iter()
                .filter(|&&(s, _, (low, _))| s != leader && low > leader_high)
                .map(|&(s, ..)| s)
                .collect();
            class.dropped.extend(&behind);
            let left: Vec<Schedule> = left.into_iter().filter(|s| !behind.contains(s)).collect();
            // The race ends with one candidate left, or at the most
            // samples, where the least median wins.
            if left.len() == 1 || fewest >= MAX_SAMPLES {
                class.winner = Some(leader);
                return (leader, Pick::Raced);
            }
            return (left[0], Pick::Racing);
        }
        let next = *left
            .iter()
            .min_by_key(|s| samples(s))
            .expect("two racers or more");
        (next, Pick::Racing)
    }

    /// The median measured time of `schedule` in class `key`, if any.
    #[cfg(test)]
    fn measured(&self, key: Key, schedule: Schedule) -> Option<f64> {
        self.samples(key, schedule).map(median)
    }

    /// What `FERROCOLL_DEBUG=tune` says of `schedule`'s calls in class
    /// `key`, if any: their median, its interval, their number, and
    /// whether the race dropped it.
    pub(super) fn summary(&self, key: Key, schedule: Schedule) -> Option<String> {
        let times = self.samples(key, schedule)?;
        let (low, high) = median_interval(times);
        let dropped = self.classes[&key].dropped.contains(&schedule);
        Some(format!(
            "measured {:.2} ({:.2}-{:.2}, {} calls{})",
            median(times) * 1e6,
            low * 1e6,
            high * 1e6,
            times.len(),
            if dropped { ", dropped" } else { "" }
        ))
    }

    /// The recorded times of `schedule` in class `key`, if any.
    fn samples(&self, key: Key, schedule: Schedule) -> Option<&[f64]> {
        self.classes
            .get(&key)
            .and_then(|c| c.times.get(&schedule))
            .filter(|t| !t.is_empty())
            .map(Vec::as_slice)
    }
}

/// The median of `times` (the upper one of an even count), not empty.
fn median(times: &[f64]) -> f64 {
    let mut sorted = times.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

/// A distribution-free confidence interval of the median of `times` (not
/// empty): the order statistics [`Z`] standard deviations either side of
/// the middle rank, as the count of samples below the true median is
/// binomial(n, 1/2). Stalls move it by a rank each, not by their length.
fn median_interval(times: &[f64]) -> (f64, f64) {
    let mut sorted = times.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let middle = (n - 1) as f64 / 2.0;
    let half = Z * (n as f64).sqrt() / 2.0;
    let low = (middle - half).floor().max(0.0) as usize;
    let high = ((middle + half).ceil() as usize).min(n - 1);
    (sorted[low], sorted[high])
}

/// How [`Tuner::pick`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pick {
    /// Not raced (no other candidate within [`BAND`], or a long exchange):
    /// the model's choice.
    Model,
    /// A candidate of the race running.
    Racing,
    /// The race's winner.
    Raced,
}

/// The class of an exchange: its direction and the busiest rank's bytes
/// (sent or received) to within a factor of 2.
pub(super) fn class_of(dir: usize, rows: &[usize], p: usize, row_bytes: f64) -> Key {
    let most = (0..p)
        .map(|i| {
            let sent: usize = rows[i * p..(i + 1) * p].iter().sum();
            let received: usize = (0..p).map(|s| rows[s * p + i]).sum();
            sent.max(received)
        })
        .max()
        .unwrap_or(0) as f64
        * row_bytes;
    (dir, (most.max(1.0)).log2().round() as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::Cost;

    fn c(schedule: Schedule, us: f64) -> Candidate {
        Candidate {
            schedule,
            cost: Cost {
                latency: us * 1e-6,
                bandwidth: 0.0,
                compute: 0.0,
            },
        }
    }

    /// Runs the race for `key` to its end, `time(schedule, its call
    /// number)` giving each call's µs; returns the schedules that ran.
    fn race(
        t: &mut Tuner,
        key: Key,
        cands: &[Candidate],
        model: Candidate,
        time: impl Fn(Schedule, usize) -> u32,
    ) -> Vec<Schedule> {
        let mut ran = Vec::new();
        let mut calls: HashMap<Schedule, usize> = HashMap::new();
        loop {
            let (s, how) = t.pick(key, cands, model);
            if how != Pick::Racing {
                return ran;
            }
            assert!(ran.len() < cands.len() * MAX_SAMPLES, "the race ends");
            ran.push(s);
            let k = calls.entry(s).or_default();
            *k += 1;
            t.ran(key.0, key, s, 1e-3);
            let us = time(s, *k);
            // Two ranks, the other one a little faster: the slowest counts.
            let mut words = [[NONE; 2]; 2];
            words[0][key.0] = us;
            words[1][key.0] = us - 1;
            t.record(&words);
        }
    }

    /// `base` µs spread evenly over +0-20 % from call to call.
    fn noisy(base: f64, call: usize) -> u32 {
        let spread = (call as f64 * 0.618_034).fract() * 0.2;
        (base * (1.0 + spread)).round() as u32
    }

    #[test]
    fn a_clear_loser_is_dropped_once_its_median_is_behind_beyond_doubt() {
        let mut t = Tuner::default();
        let key = (0, 10);
        let cands = [
            c(Schedule::Direct, 100.0),
            c(Schedule::Pairwise, 150.0),
            c(Schedule::TwoLevel, 300.0),
            c(Schedule::Rail, 95.0),
        ];
        // The model's rail measures 300 us (once 100), direct 150 us with a
        // stall of 5 ms every 5th call: the medians decide, not the least
        // nor the mean.
        let ran = race(&mut t, key, &cands, cands[3], |s, k| match s {
            Schedule::Rail if k == 2 => 100,
            Schedule::Rail => 300,
            _ if k % 5 == 0 => 5000,
            _ => 150,
        });
        // In turns, the model's choice first; pairwise (not the model's
        // choice) and two-level (over twice the prediction) never.
        let turns: Vec<Schedule> = (0..ran.len())
            .map(|i| [Schedule::Rail, Schedule::Direct][i % 2])
            .collect();
        assert_eq!(ran, turns);
        assert!(ran.len() >= 2 * MIN_SAMPLES && ran.len() < 2 * MAX_SAMPLES);
        assert_eq!(
            t.pick(key, &cands, cands[3]),
            (Schedule::Direct, Pick::Raced)
        );
        assert_eq!(t.measured(key, Schedule::Direct), Some(150e-6));
        assert_eq!(t.measured(key, Schedule::Rail), Some(300e-6));
        // A model's choice with no candidate within the band is not raced.
        let clear = [c(Schedule::Direct, 100.0), c(Schedule::Rail, 201.0)];
        assert_eq!(
            t.pick((1, 3), &clear, clear[0]),
            (Schedule::Direct, Pick::Model)
        );
    }

    #[test]
    fn near_candidates_race_to_the_end_and_the_least_median_wins() {
        let cands = [c(Schedule::Direct, 100.0), c(Schedule::Rail, 110.0)];
        let model = cands[0];
        // Direct 200 us, rail 2 % faster (too near to drop either: the
        // race runs to the end, and rail's median wins over the model's
        // choice), then 10 % faster (direct is dropped before the end).
        for (rail_us, to_the_end) in [(196.0, true), (180.0, false)] {
            let mut t = Tuner::default();
            let key = (0, 14);
            let ran = race(&mut t, key, &cands, model, |s, k| {
                noisy(
                    if s == Schedule::Direct {
                        200.0
                    } else {
                        rail_us
                    },
                    k,
                )
            });
            assert_eq!(ran.len() == 2 * MAX_SAMPLES, to_the_end, "rail {rail_us}");
            assert_eq!(t.pick(key, &cands, model), (Schedule::Rail, Pick::Raced));
        }
    }

    #[test]
    fn every_candidate_within_the_band_races_pairwise_only_as_the_models_choice() {
        let mut t = Tuner::default();
        let key = (0, 9);
        let cands = [
            c(Schedule::Direct, 110.0),
            c(Schedule::Pairwise, 100.0),
            c(Schedule::TwoLevel, 130.0),
            c(Schedule::Rail, 120.0),
        ];
        let ran = race(&mut t, key, &cands, cands[1], |s, k| {
            noisy(if s == Schedule::Direct { 100.0 } else { 200.0 }, k)
        });
        // In turns: the model's pairwise, then by prediction; every loser
        // dropped after the first full round it is behind beyond doubt.
        assert_eq!(
            ran[..4],
            [
                Schedule::Pairwise,
                Schedule::Direct,
                Schedule::Rail,
                Schedule::TwoLevel
            ]
        );
        assert_eq!(ran.len(), 4 * MIN_SAMPLES);
        assert_eq!(
            t.pick(key, &cands, cands[1]),
            (Schedule::Direct, Pick::Raced)
        );
        // Where the model's choice is rail, pairwise does not race.
        let mut t = Tuner::default();
        let ran = race(&mut t, key, &cands, cands[3], |_, k| noisy(100.0, k));
        assert!(!ran.contains(&Schedule::Pairwise));
        assert!(ran.contains(&Schedule::TwoLevel) && ran.contains(&Schedule::Direct));
    }

    #[test]
    fn a_class_whose_racers_change_still_ends_its_race() {
        let mut t = Tuner::default();
        let key = (0, 11);
        let three = [
            c(Schedule::Direct, 100.0),
            c(Schedule::TwoLevel, 110.0),
            c(Schedule::Rail, 120.0),
        ];
        // Direct is far behind, two-level and rail alike: direct is
        // dropped while the other two race on.
        let dropped = |t: &Tuner| {
            t.classes
                .get(&key)
                .is_some_and(|c| c.dropped.contains(&Schedule::Direct))
        };
        while !dropped(&t) {
            let (s, how) = t.pick(key, &three, three[0]);
            assert_eq!(how, Pick::Racing);
            t.ran(0, key, s, 1e-4);
            let us = if s == Schedule::Direct { 300 } else { 100 };
            t.record(&[[us, NONE]]);
        }
        // A call of the class priced with rail out of the band leaves
        // two-level alone in the race: it wins.
        let two = [
            c(Schedule::Direct, 100.0),
            c(Schedule::TwoLevel, 110.0),
            c(Schedule::Rail, 250.0),
        ];
        assert_eq!(t.pick(key, &two, two[0]), (Schedule::TwoLevel, Pick::Raced));
    }

    #[test]
    fn long_exchanges_are_not_raced() {
        let mut t = Tuner::default();
        let ms = |s, ms: f64| c(s, ms * 1e3);
        let long = [ms(Schedule::Direct, 10.0), ms(Schedule::Rail, 10.1)];
        assert_eq!(
            t.pick((0, 20), &long, long[0]),
            (Schedule::Direct, Pick::Model)
        );
    }

    #[test]
    fn a_class_is_raced_again_after_revisit_calls() {
        let mut t = Tuner::default();
        let key = (1, 12);
        let cands = [c(Schedule::Direct, 100.0), c(Schedule::Rail, 99.0)];
        let ran = race(&mut t, key, &cands, cands[1], |s, k| {
            noisy(if s == Schedule::Direct { 100.0 } else { 200.0 }, k)
        });
        // REVISIT calls of the class in all (the racing ones and the one
        // that ended the race included) run the winner; the next one
        // starts racing again.
        for _ in ran.len() + 1..REVISIT as usize {
            assert_eq!(
                t.pick(key, &cands, cands[1]),
                (Schedule::Direct, Pick::Raced)
            );
        }
        assert_eq!(t.pick(key, &cands, cands[1]).1, Pick::Racing);
        assert_eq!(t.measured(key, Schedule::Direct), None);
    }

    #[test]
    fn the_medians_interval_widens_with_z_and_narrows_with_samples() {
        let times: Vec<f64> = (0..30).map(|i| i as f64).collect();
        // 30 samples: ranks 14.5 -+ 2 sqrt(30)/2 = 14.5 -+ 5.5.
        assert_eq!(median_interval(&times), (9.0, 20.0));
        assert_eq!(median_interval(&times[..6]), (0.0, 5.0));
        assert_eq!(median_interval(&[7.0]), (7.0, 7.0));
    }

    #[test]
    fn a_rank_without_a_time_records_nothing() {
        let mut t = Tuner::default();
        t.ran(1, (1, 5), Schedule::Rail, 2e-6);
        assert_eq!(t.report(), [NONE, 2]);
        t.record(&[[NONE, 2], [NONE, NONE]]);
        assert_eq!(t.measured((1, 5), Schedule::Rail), None);
        assert_eq!(t.report(), [NONE, NONE]);
    }

    #[test]
    fn classes_are_the_busiest_ranks_bytes_to_a_factor_of_two() {
        // 2 ranks: rank 0 sends 3 + 1 rows, rank 1 receives 1 + 5.
        let rows = [3, 1, 5, 2];
        assert_eq!(class_of(0, &rows, 2, 1024.0), (0, 13)); // 8 KiB
        assert_eq!(class_of(1, &[0; 4], 2, 1024.0), (1, 0));
    }
}
