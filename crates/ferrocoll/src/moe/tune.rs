//! Measured refinement of `auto`: among the schedules the cost model cannot
//! tell apart, the one the calls themselves measured fastest.
//!
//! The seeds' advice for MoE all-to-alls: "the runtime should benchmark
//! candidate schedules with the observed count distribution". The model
//! prices every candidate on the observed matrix; candidates within
//! [`BAND`] of its choice are within its error (the calibrated profiles'
//! geometric-mean errors are 15-40 %), and on the 2-host cluster their
//! order flipped from run to run with the calibration (bench/RESULTS.md,
//! issue 18). So `auto` runs each of them [`SAMPLES`] times on real calls
//! of the same class (direction and the busiest rank's bytes to within a
//! factor of 2), then keeps the fastest measured (least of its calls),
//! re-measuring every [`REVISIT`] calls of the class.
//!
//! Every rank must choose alike, so the times are the same on every rank:
//! each rank reports how long its last dispatch and combine exchanges took
//! in its next count exchange (two words of the allgather it makes
//! anyway), and a call's time is the slowest rank's. Every rank therefore
//! records the same numbers, in the same calls, and decides the same.

use std::collections::HashMap;

use super::schedule::{Candidate, Schedule};

/// Candidates predicted within this (relative) of the model's choice are
/// measured.
pub(super) const BAND: f64 = 0.25;

/// Calls each measured candidate gets before the fastest is kept; a
/// candidate's time is the least of its calls (the machine's interference
/// only ever adds time; `ferrocoll calibrate` keeps the fastest batch too).
pub(super) const SAMPLES: u32 = 3;

/// Calls of a class after which its candidates are measured again (the
/// machine's load changes).
pub(super) const REVISIT: u32 = 1000;

/// A reported time meaning "nothing to report".
pub(super) const NONE: u32 = u32::MAX;

/// What one class of calls has measured.
#[derive(Debug, Default)]
struct Class {
    /// Per schedule: samples taken and the least (seconds).
    times: HashMap<Schedule, (u32, f64)>,
    /// Calls since the class was last fully measured.
    calls: u32,
}

/// The measurements of one dispatcher (shared by its clones).
#[derive(Debug, Default)]
pub(super) struct Tuner {
    classes: HashMap<(usize, u32), Class>,
    /// Per direction, the class and schedule of the last tuned exchange
    /// whose time the next count exchange brings.
    pending: [Option<((usize, u32), Schedule)>; 2],
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
            let (n, least) = self
                .classes
                .entry(key)
                .or_default()
                .times
                .entry(schedule)
                .or_insert((0, f64::INFINITY));
            *least = least.min(slowest);
            *n += 1;
        }
    }

    /// This rank's time of the exchange of direction `dir` just run by
    /// `schedule` in class `key`, reported by the next count exchange.
    pub(super) fn ran(&mut self, dir: usize, key: (usize, u32), schedule: Schedule, secs: f64) {
        self.pending[dir] = Some((key, schedule));
        self.elapsed[dir] = (secs * 1e6).round().min((NONE - 1) as f64) as u32;
    }

    /// The schedule to run for class `key` among `candidates` (priced, the
    /// model's choice `model`), and whether it was measured or is being
    /// measured.
    pub(super) fn pick(
        &mut self,
        key: (usize, u32),
        candidates: &[Candidate],
        model: Candidate,
    ) -> (Schedule, Pick) {
        let mut band: Vec<Candidate> = candidates
            .iter()
            .copied()
            .filter(|c| c.cost.total() <= model.cost.total() * (1.0 + BAND))
            .collect();
        if band.len() < 2 {
            return (model.schedule, Pick::Model);
        }
        band.sort_by(|a, b| a.cost.total().total_cmp(&b.cost.total()));
        let class = self.classes.entry(key).or_default();
        class.calls += 1;
        if class.calls > REVISIT {
            class.calls = 0;
            class.times.clear();
        }
        // The model's choice first, then the others by prediction.
        let order = std::iter::once(model.schedule).chain(
            band.iter()
                .map(|c| c.schedule)
                .filter(|&s| s != model.schedule),
        );
        let mut fastest: Option<(Schedule, f64)> = None;
        for s in order {
            match class.times.get(&s) {
                Some(&(n, t)) if n >= SAMPLES => {
                    let better = match fastest {
                        None => true,
                        Some((_, best)) => t < best,
                    };
                    if better {
                        fastest = Some((s, t));
                    }
                }
                _ => return (s, Pick::Measuring),
            }
        }
        let (s, _) = fastest.expect("the band has two candidates or more");
        (s, Pick::Measured)
    }

    /// The least measured time of `schedule` in class `key`, if any.
    pub(super) fn measured(&self, key: (usize, u32), schedule: Schedule) -> Option<f64> {
        self.classes
            .get(&key)
            .and_then(|c| c.times.get(&schedule))
            .map(|&(_, t)| t)
    }
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
pub(super) fn class_of(dir: usize, rows: &[usize], p: usize, row_bytes: f64) -> (usize, u32) {
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
    fn near_ties_are_measured_then_the_fastest_kept() {
        let mut t = Tuner::default();
        let key = (0, 10);
        let cands = [
            c(Schedule::Direct, 100.0),
            c(Schedule::Pairwise, 200.0),
            c(Schedule::Rail, 95.0),
        ];
        let model = cands[2];
        let mut ran = Vec::new();
        // Rail measures 300 us, direct 150 us (the slowest rank's).
        for call in 0..2 * SAMPLES {
            let (s, how) = t.pick(key, &cands, model);
            assert_eq!(how, Pick::Measuring);
            ran.push(s);
            t.ran(0, key, s, 1e-3);
            // One slow call of direct: the least of its calls counts.
            let us = match s {
                Schedule::Rail => 300,
                _ if call == SAMPLES => 900,
                _ => 150,
            };
            t.record(&[[us, NONE], [us - 10, NONE]]);
        }
        // The model's choice first; pairwise (twice the prediction) never.
        let n = SAMPLES as usize;
        assert_eq!(ran[..n], vec![Schedule::Rail; n][..]);
        assert_eq!(ran[n..], vec![Schedule::Direct; n][..]);
        assert_eq!(
            t.pick(key, &cands, model),
            (Schedule::Direct, Pick::Measured)
        );
        assert_eq!(t.measured(key, Schedule::Direct), Some(150e-6));
        // A clear model choice is not measured.
        let clear = [c(Schedule::Direct, 100.0), c(Schedule::Rail, 200.0)];
        assert_eq!(
            t.pick((1, 3), &clear, clear[0]),
            (Schedule::Direct, Pick::Model)
        );
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
