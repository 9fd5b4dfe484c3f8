//! Measured refinement of `auto`: flat or through the hosts, as the calls
//! themselves measure it.
//!
//! The seeds' advice for MoE all-to-alls: "the runtime should benchmark
//! candidate schedules with the observed count distribution". The model
//! prices every candidate on the observed matrix. It ranks the members of
//! a family well (direct and pairwise send the same messages in other
//! orders; two-level and rail both go through the hosts), but not the
//! families against each other: that difference is what an intra-host
//! round and a message more through a host's link cost on the machine at
//! hand, which on the 2-host cluster moved from one machine to the next
//! while the model's ranking did not (bench/RESULTS.md, issue 18). So where
//! the other family's cheapest candidate (direct for the flat family) is
//! predicted within [`BAND`] of the model's choice, and the choice is
//! predicted to take at most [`MEASURED_UP_TO`], `auto` runs both (and
//! direct too when the model's choice is pairwise) [`SAMPLES`] times on real
//! calls of the same class (direction and the busiest rank's bytes to
//! within a factor of 2), in turns (so that each follows the others as
//! often: on a shaped link the previous exchange's burst decides how full
//! the token bucket is), then switches from the model's choice only to a
//! candidate whose median is faster by more than [`MARGIN`], re-measuring
//! every [`REVISIT`] calls of the class.
//!
//! Every rank must choose alike, so the times are the same on every rank:
//! each rank reports how long its last dispatch and combine exchanges took
//! in its next count exchange (two words of the allgather it makes
//! anyway), and a call's time is the slowest rank's. Every rank therefore
//! records the same numbers, in the same calls, and decides the same.

use std::collections::HashMap;

use super::schedule::{Candidate, Schedule};

/// The other family's cheapest candidate is measured against the model's
/// choice when it is predicted within this (relative) of it. Wide: on the 2-host cluster the model put direct 16-37 %
/// above two-level at 2-4 tokens a rank, where direct measured 15-37 %
/// faster (bench/RESULTS.md, issue 18).
pub(super) const BAND: f64 = 0.5;

/// Exchanges predicted longer than this (seconds) run the model's choice
/// unmeasured: on the 2-host cluster the model's choice was within 5 % of
/// the fastest at every exchange of 64 tokens a rank or more (4-60 ms a
/// layer), while 12 calls of a rival 20 % slower cost a 4096-token layer
/// on 1 Gbit/s links seconds (bench/RESULTS.md, issue 18).
pub(super) const MEASURED_UP_TO: f64 = 3e-3;

/// A measured candidate replaces the model's choice only when its median
/// is faster by more than this (relative): closer than that, 8 calls on a
/// busy machine do not tell them apart, and the model's choice stays.
pub(super) const MARGIN: f64 = 0.05;

/// Calls each measured candidate gets before one is kept; a candidate's
/// time is the median of its calls. (The first version took the least of 3
/// calls among every candidate within 25 % and picked no better than the
/// model alone: on the shaped links single exchanges stall for
/// milliseconds now and then, and the least of three is mostly luck. With
/// every candidate within 50 % measured 8 times, pairwise, which the
/// forced runs put 5-8 % behind direct, won the medians of 8 in a third of
/// the picks.)
pub(super) const SAMPLES: u32 = 12;

/// Calls of a class after which its candidates are measured again (the
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
    /// Calls since the class was last fully measured.
    calls: u32,
}

/// The measurements of one dispatcher (shared by its clones).
#[derive(Debug, Default)]
pub(super) struct Tuner {
    classes: HashMap<Key, Class>,
    /// Per direction, the class and schedule of the last tuned exchange
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
    /// model's choice `model`), and whether it was measured or is being
    /// measured.
    pub(super) fn pick(
        &mut self,
        key: Key,
        candidates: &[Candidate],
        model: Candidate,
    ) -> (Schedule, Pick) {
        // The model's choice and the other family's cheapest prediction, if
        // within the band: the model ranks the members of a family well (the
        // same messages in other orders), but not the families, whose
        // difference is what an intra-host round and a message more through
        // a host's link cost on the machine at hand. The flat family's rival
        // is direct: pairwise differs from it only in its lower
        // concurrency, which the model prices no better than the families,
        // so where pairwise is the model's choice direct is measured too.
        let rival = candidates
            .iter()
            .copied()
            .filter(|c| {
                hierarchical(c.schedule) != hierarchical(model.schedule)
                    && c.schedule != Schedule::Pairwise
            })
            .min_by(|a, b| a.cost.total().total_cmp(&b.cost.total()));
        let direct = candidates
            .iter()
            .copied()
            .filter(|c| model.schedule == Schedule::Pairwise && c.schedule == Schedule::Direct);
        let mut band: Vec<Candidate> = std::iter::once(model)
            .chain(rival)
            .chain(direct)
            .filter(|c| c.cost.total() <= model.cost.total() * (1.0 + BAND))
            .collect();
        // Long exchanges are not measured: their bytes dominate, which the
        // model prices well, and a rival's calls would cost too much.
        if model.cost.total() > MEASURED_UP_TO {
            band.truncate(1);
        }
        if band.len() < 2 {
            return (model.schedule, Pick::Model);
        }
        // The model's choice first, then the others by prediction; the
        // one of fewest samples runs next (the first of equals), so the
        // candidates take turns.
        band[1..].sort_by(|a, b| a.cost.total().total_cmp(&b.cost.total()));
        let order: Vec<Schedule> = band.iter().map(|c| c.schedule).collect();
        let class = self.classes.entry(key).or_default();
        class.calls += 1;
        if class.calls > REVISIT {
            class.calls = 0;
            class.times.clear();
        }
        let samples = |s: &Schedule| class.times.get(s).map_or(0, Vec::len);
        let next = *order
            .iter()
            .min_by_key(|s| samples(s))
            .expect("the band has two candidates or more");
        if samples(&next) < SAMPLES as usize {
            return (next, Pick::Measuring);
        }
        let (fastest, least) = order
            .iter()
            .map(|&s| (s, median(&class.times[&s])))
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .expect("the band has two candidates or more");
        if median(&class.times[&model.schedule]) <= least * (1.0 + MARGIN) {
            return (model.schedule, Pick::Measured);
        }
        (fastest, Pick::Measured)
    }

    /// The median measured time of `schedule` in class `key`, if any.
    pub(super) fn measured(&self, key: Key, schedule: Schedule) -> Option<f64> {
        self.classes
            .get(&key)
            .and_then(|c| c.times.get(&schedule))
            .filter(|t| !t.is_empty())
            .map(|t| median(t))
    }
}

/// Whether `schedule` goes through the hosts (two phases or more) rather
/// than one all-to-all-v.
fn hierarchical(schedule: Schedule) -> bool {
    matches!(schedule, Schedule::TwoLevel | Schedule::Rail)
}

/// The median of `times` (the upper one of an even count), not empty.
fn median(times: &[f64]) -> f64 {
    let mut sorted = times.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

/// How [`Tuner::pick`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pick {
    /// No other candidate within [`BAND`]: the model's choice.
    Model,
    /// A candidate being measured.
    Measuring,
    /// The fastest measured.
    Measured,
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

    #[test]
    fn near_ties_take_turns_then_the_least_median_is_kept() {
        let mut t = Tuner::default();
        let key = (0, 10);
        let cands = [
            c(Schedule::Direct, 100.0),
            c(Schedule::Pairwise, 200.0),
            c(Schedule::Rail, 95.0),
        ];
        let model = cands[2];
        let mut ran = Vec::new();
        // Rail measures 300 us, direct 150 us (the slowest rank's), but
        // direct stalls in 3 of its 8 calls and rail is once faster than
        // any of direct's calls: the medians decide, not the least.
        let mut direct_calls = 0;
        for call in 0..2 * SAMPLES {
            let (s, how) = t.pick(key, &cands, model);
            assert_eq!(how, Pick::Measuring, "call {call}");
            ran.push(s);
            t.ran(0, key, s, 1e-3);
            let us = match s {
                Schedule::Rail if call == 4 => 100,
                Schedule::Rail => 300,
                _ => {
                    direct_calls += 1;
                    if direct_calls % 3 == 0 {
                        5000
                    } else {
                        150
                    }
                }
            };
            t.record(&[[us, NONE], [us - 10, NONE]]);
        }
        // In turns, the model's choice first; pairwise (twice the
        // prediction) never.
        let turns: Vec<Schedule> = (0..2 * SAMPLES)
            .map(|i| [Schedule::Rail, Schedule::Direct][i as usize % 2])
            .collect();
        assert_eq!(ran, turns);
        assert_eq!(
            t.pick(key, &cands, model),
            (Schedule::Direct, Pick::Measured)
        );
        assert_eq!(t.measured(key, Schedule::Direct), Some(150e-6));
        assert_eq!(t.measured(key, Schedule::Rail), Some(300e-6));
        // A clear model choice is not measured.
        let clear = [c(Schedule::Direct, 100.0), c(Schedule::Rail, 200.0)];
        assert_eq!(
            t.pick((1, 3), &clear, clear[0]),
            (Schedule::Direct, Pick::Model)
        );
    }

    #[test]
    fn the_models_choice_stays_unless_another_measures_clearly_faster() {
        let cands = [c(Schedule::Direct, 100.0), c(Schedule::Rail, 110.0)];
        let model = cands[0];
        // Rail 4 % faster than direct (within MARGIN), then 10 % faster.
        for (rail_us, want) in [(192, Schedule::Direct), (180, Schedule::Rail)] {
            let mut t = Tuner::default();
            let key = (0, 14);
            for _ in 0..2 * SAMPLES {
                let (s, _) = t.pick(key, &cands, model);
                t.ran(0, key, s, 1e-3);
                let us = if s == Schedule::Direct { 200 } else { rail_us };
                t.record(&[[us, NONE]]);
            }
            assert_eq!(t.pick(key, &cands, model), (want, Pick::Measured));
        }
    }

    #[test]
    fn pairwise_is_measured_against_direct_too() {
        let mut t = Tuner::default();
        let key = (0, 9);
        let cands = [
            c(Schedule::Direct, 110.0),
            c(Schedule::Pairwise, 100.0),
            c(Schedule::TwoLevel, 130.0),
            c(Schedule::Rail, 120.0),
        ];
        let mut ran = Vec::new();
        for _ in 0..3 * SAMPLES {
            let (s, how) = t.pick(key, &cands, cands[1]);
            assert_eq!(how, Pick::Measuring);
            ran.push(s);
            t.ran(0, key, s, 1e-3);
            let us = if s == Schedule::Direct { 100 } else { 200 };
            t.record(&[[us, NONE]]);
        }
        // In turns: the model's pairwise, then by prediction.
        assert_eq!(
            ran[..3],
            [Schedule::Pairwise, Schedule::Direct, Schedule::Rail]
        );
        assert!(!ran.contains(&Schedule::TwoLevel));
        assert_eq!(
            t.pick(key, &cands, cands[1]),
            (Schedule::Direct, Pick::Measured)
        );
    }

    #[test]
    fn long_exchanges_and_pairwise_rivals_are_not_measured() {
        let mut t = Tuner::default();
        let ms = |s, ms: f64| c(s, ms * 1e3);
        let long = [ms(Schedule::Direct, 10.0), ms(Schedule::Rail, 10.1)];
        assert_eq!(
            t.pick((0, 20), &long, long[0]),
            (Schedule::Direct, Pick::Model)
        );
        // Rail's flat rival is direct, not the cheaper pairwise.
        let cands = [
            c(Schedule::Direct, 130.0),
            c(Schedule::Pairwise, 110.0),
            c(Schedule::Rail, 100.0),
        ];
        let mut ran = std::collections::HashSet::new();
        for _ in 0..2 * SAMPLES {
            let (s, _) = t.pick((0, 9), &cands, cands[2]);
            ran.insert(s);
            t.ran(0, (0, 9), s, 1e-4);
            t.record(&[[100, NONE]]);
        }
        assert_eq!(ran, [Schedule::Rail, Schedule::Direct].into());
    }

    #[test]
    fn a_class_is_measured_again_after_revisit_calls() {
        let mut t = Tuner::default();
        let key = (1, 12);
        let cands = [c(Schedule::Direct, 100.0), c(Schedule::Rail, 99.0)];
        for _ in 0..2 * SAMPLES {
            let (s, _) = t.pick(key, &cands, cands[1]);
            t.ran(1, key, s, 1e-3);
            let us = if s == Schedule::Direct { 100 } else { 200 };
            t.record(&[[NONE, us]]);
        }
        // REVISIT calls of the class in all (the measuring ones included)
        // run the fastest measured; the next one starts measuring again.
        for _ in 2 * SAMPLES..REVISIT {
            assert_eq!(
                t.pick(key, &cands, cands[1]),
                (Schedule::Direct, Pick::Measured)
            );
        }
        assert_eq!(t.pick(key, &cands, cands[1]).1, Pick::Measuring);
        assert_eq!(t.measured(key, Schedule::Direct), None);
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
