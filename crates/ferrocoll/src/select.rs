//! Choosing the algorithm for a call: the one place that does.
//!
//! Precedence: the per-call option ([`crate::CallOptions::algorithm`]), then
//! `FERROCOLL_ALGO` for that collective, then a global `FERROCOLL_ALGO` name
//! (applied to every collective that has it), then `auto`.
//!
//! `auto` first asks the tuned table ([`crate::tune`], what `ferrocoll
//! tune` measured on this launch) where it covers the call's size, taking
//! the fastest measured (interpolated log-log between measured sizes);
//! elsewhere, or without a table (`FERROCOLL_TUNE=off`), it asks the cost
//! model for the algorithm with the least predicted time ([`crate::cost::candidates`], on the communicator's profile
//! and topology; `FERROCOLL_AUTO=model`, the default), remembering the answer
//! per shape. [`auto`] here is the size rule it replaced
//! (`FERROCOLL_AUTO=rule`), still used for alltoallv, whose cost depends on
//! counts no single rank knows: binomial trees below [`SMALL_BYTES`] where
//! latency dominates, rings above. bench/regret.sh measures both against the
//! best forced algorithm (bench/RESULTS.md). `FERROCOLL_DEBUG=tune` prints,
//! the first time a shape is seen, which decided (table or model) and every
//! candidate's measured and predicted times side by side.
//!
//! Every rank must choose alike, so choice looks only at what every rank of
//! the call agrees on: the collective, the size as
//! [`crate::Communicator::call_bytes`] counts it, the group, the
//! configuration, the profile and the tuned table (rank 0's, shared at
//! start-up).
//!
//! The communicator holds a `Memo` and asks through a `Chooser`, a view
//! of the inputs it borrows for one question (this module does not import
//! the communicator or the configuration, which imports it).

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, OnceLock};

use crate::cost::{self, Cost, Profile, Shape};
use crate::error::{Error, Result};
use crate::plan::{unknown_algorithm, Algorithm, Collective};
use crate::topo::Topology;
use crate::tune::{Lookup, TuneSetting, TuneTable};
use crate::types::DType;

/// Messages up to this many bytes use latency-optimal algorithms under `auto`.
pub const SMALL_BYTES: usize = 256 * 1024;

/// Algorithms forced by configuration (`FERROCOLL_ALGO`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AlgoChoice {
    per_collective: HashMap<Collective, Algorithm>,
    global: Option<Algorithm>,
}

impl AlgoChoice {
    /// Parses `FERROCOLL_ALGO` syntax: comma-separated entries, each
    /// `collective:algorithm` or a bare `algorithm` that applies to every
    /// collective having it; `auto` anywhere means "let ferrocoll choose".
    pub fn parse(spec: &str) -> Result<AlgoChoice> {
        let mut choice = AlgoChoice::default();
        for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            match entry.split_once(':') {
                Some((coll_name, algo_name)) => {
                    let coll = Collective::from_name(coll_name.trim()).ok_or_else(|| {
                        Error::invalid(format!(
                            "unknown collective `{coll_name}` in algorithm choice `{entry}`; use one of: {}",
                            Collective::ALL.map(|c| c.name()).join(", ")
                        ))
                    })?;
                    let algo_name = algo_name.trim();
                    if algo_name.eq_ignore_ascii_case("auto") {
                        choice.per_collective.remove(&coll);
                        continue;
                    }
                    let algo = Algorithm::from_name(algo_name)
                        .and_then(|a| a.for_collective(coll))
                        .ok_or_else(|| unknown_algorithm(coll, algo_name))?;
                    choice.per_collective.insert(coll, algo);
                }
                None if entry.eq_ignore_ascii_case("auto") => choice.global = None,
                None => {
                    let algo = Algorithm::from_name(entry).ok_or_else(|| {
                        Error::invalid(format!(
                            "unknown algorithm `{entry}`; use auto, one of {} or collective:algorithm",
                            Algorithm::ALL.map(|a| a.name()).join(", ")
                        ))
                    })?;
                    choice.global = Some(algo);
                }
            }
        }
        Ok(choice)
    }

    /// Forces `algo` for `coll` (checked against the collective's list).
    pub fn set(&mut self, coll: Collective, algo: Algorithm) -> Result<()> {
        let algo = algo
            .for_collective(coll)
            .ok_or_else(|| unknown_algorithm(coll, algo.name()))?;
        self.per_collective.insert(coll, algo);
        Ok(())
    }

    /// The forced algorithm for `coll`, if any.
    pub fn get(&self, coll: Collective) -> Option<Algorithm> {
        self.per_collective
            .get(&coll)
            .copied()
            .or_else(|| self.global.and_then(|a| a.for_collective(coll)))
    }
}

/// The `auto` choice for `coll` moving `bytes` (the per-rank buffer as the
/// caller passed it) among `n` ranks, with the reason.
pub fn auto(coll: Collective, bytes: usize, n: usize) -> (Algorithm, &'static str) {
    let small = bytes <= SMALL_BYTES;
    match coll {
        Collective::AllReduce | Collective::Broadcast | Collective::Reduce => {
            if small || n <= 2 {
                (
                    Algorithm::Tree,
                    "small message or 2 ranks: fewest rounds (binomial tree)",
                )
            } else {
                (Algorithm::Ring, "large message: bandwidth-optimal ring")
            }
        }
        Collective::AllGather | Collective::ReduceScatter => (
            Algorithm::Ring,
            "ring: bandwidth-optimal, one neighbour per step",
        ),
        Collective::AllToAll | Collective::AllToAllV => (
            Algorithm::Direct,
            "direct: one round, every message in flight at once",
        ),
        Collective::Gather | Collective::Scatter => {
            if small && n > 8 {
                (Algorithm::Tree, "small blocks, many ranks: log2 N rounds")
            } else {
                (
                    Algorithm::Linear,
                    "one round, the root's port is the bottleneck either way",
                )
            }
        }
        Collective::Barrier => (
            Algorithm::Dissemination,
            "dissemination: ceil(log2 N) rounds",
        ),
    }
}

/// Most shapes remembered for `auto`'s choices and `FERROCOLL_DEBUG=tune`:
/// a program with ever-new sizes must not grow them forever.
const SHAPE_CACHE_LIMIT: usize = 4096;

/// What decided an `auto` choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Decider {
    /// The tuned table's measured times.
    Table,
    /// The cost model's predictions.
    Model,
}

/// What one communicator remembers about choosing: the profile and the
/// tuned table, read once, the choice per shape and the shapes already
/// explained.
#[derive(Default)]
pub(crate) struct Memo {
    profile: OnceLock<Profile>,
    table: OnceLock<Option<TuneTable>>,
    /// The table's or the model's choice per (collective, bytes).
    chosen: Mutex<HashMap<(Collective, usize), (Algorithm, Decider)>>,
    /// Shapes already explained under `FERROCOLL_DEBUG=tune`.
    explained: Mutex<HashSet<(Collective, usize)>>,
    /// `FERROCOLL_COMPRESS=auto:CODEC`'s answers ([`crate::compress::auto`]).
    pub(crate) compress: crate::compress::auto::Memo,
}

/// The inputs of a choice for one communicator handle, borrowed.
pub(crate) struct Chooser<'a> {
    /// The handle's per-call option.
    pub option: Option<Algorithm>,
    /// `FERROCOLL_ALGO`.
    pub forced: &'a AlgoChoice,
    /// `FERROCOLL_AUTO=model` (else the size rule).
    pub model: bool,
    /// A configured profile, which wins over the calibrated file.
    pub configured: Option<&'a Profile>,
    /// Where the tuned table comes from.
    pub tune: &'a TuneSetting,
    /// The transport's name, which names the calibrated file.
    pub transport: &'static str,
    /// The transport itself, asked which calls its receivers alone copy
    /// ([`crate::transport::Transport::receivers_copy`]); `None`: the
    /// profile says.
    pub carrier: Option<&'a dyn crate::transport::Transport>,
    /// The group's size and topology.
    pub n: usize,
    pub topology: &'a Topology,
    pub memo: &'a Memo,
}

impl Chooser<'_> {
    /// The algorithm for `coll` moving `bytes` ([`call_bytes`]), and why,
    /// in the precedence of the module docs.
    pub(crate) fn choose(&self, coll: Collective, bytes: usize) -> Result<(Algorithm, String)> {
        if let Some(a) = self.option {
            let a = a
                .for_collective(coll)
                .ok_or_else(|| unknown_algorithm(coll, a.name()))?;
            return Ok((a, "forced by call options".into()));
        }
        if let Some(a) = self.forced.get(coll) {
            return Ok((a, "forced by FERROCOLL_ALGO".into()));
        }
        if self.model && coll != Collective::AllToAllV {
            match self.auto_choice(coll, bytes) {
                Some((a, Decider::Table)) => {
                    return Ok((a, "auto: fastest measured (tuned table)".into()))
                }
                Some((a, Decider::Model)) => {
                    return Ok((a, "auto: least predicted time (cost model)".into()))
                }
                None => {}
            }
        }
        let (a, why) = auto(coll, bytes, self.n);
        Ok((a, format!("auto: {why}")))
    }

    /// The fastest algorithm for `bytes` by the tuned table where it covers
    /// the size, else the cheapest on the profile and topology; cached per
    /// shape.
    fn auto_choice(&self, coll: Collective, bytes: usize) -> Option<(Algorithm, Decider)> {
        if let Some(&a) = self.memo.chosen.lock().ok()?.get(&(coll, bytes)) {
            return Some(a);
        }
        let best = match self.measured(coll, bytes) {
            Some(found) => (found.winner(), Decider::Table),
            None => (
                cost::candidates(&self.model_shape(coll, bytes), &self.profile_for(coll))
                    .first()?
                    .0,
                Decider::Model,
            ),
        };
        let mut chosen = self.memo.chosen.lock().ok()?;
        if chosen.len() >= SHAPE_CACHE_LIMIT {
            chosen.clear();
        }
        chosen.insert((coll, bytes), best);
        Some(best)
    }

    /// The shape the model prices for a call of `bytes`: the choice depends
    /// on bytes, not on the element type, so one-byte elements.
    fn model_shape(&self, coll: Collective, bytes: usize) -> Shape {
        let blocks = call_bytes(coll, self.n, 1, DType::U8).max(1);
        self.shape(coll, bytes / blocks, 1)
    }

    /// The tuned table's times for `coll` at `bytes`, where it covers them.
    fn measured(&self, coll: Collective, bytes: usize) -> Option<Lookup> {
        self.table()?.lookup(coll, bytes)
    }

    /// The tuned table for this group ([`TuneSetting::resolve`]), resolved
    /// once per communicator.
    pub(crate) fn table(&self) -> Option<&TuneTable> {
        self.memo
            .table
            .get_or_init(|| self.tune.resolve(self.transport, self.n, self.topology))
            .as_ref()
    }

    /// The cost-model parameters: the configured profile, else a calibrated
    /// file at [`Profile::default_path`] for the transport, else the
    /// built-in one; read once per communicator.
    pub(crate) fn profile(&self) -> &Profile {
        self.memo.profile.get_or_init(|| {
            if let Some(p) = self.configured {
                return p.clone();
            }
            Profile::default_path(self.transport)
                .and_then(|path| Profile::load(&path).ok())
                .unwrap_or_else(|| Profile::builtin(self.transport))
        })
    }

    /// The profile that prices a call of `coll`: [`Chooser::profile`], with
    /// [`Profile::receiver_copies`] on where the transport's receivers
    /// alone move that call's bytes (the shared-memory single copy, which
    /// carries some collectives and not others). Measured on 4 shm ranks
    /// (bench/RESULTS.md, issue 20, 2026-12-06): with broadcasts read from
    /// the root's memory, the direct broadcast took 30-120 us at 128-512 KiB
    /// where the model, pricing the root's three sends, chose the tree
    /// (51 us) and scatter-allgather (260 us).
    fn profile_for(&self, coll: Collective) -> std::borrow::Cow<'_, Profile> {
        let profile = self.profile();
        if !profile.receiver_copies && self.carrier.is_some_and(|t| t.receivers_copy(coll)) {
            std::borrow::Cow::Owned(Profile {
                receiver_copies: true,
                ..profile.clone()
            })
        } else {
            std::borrow::Cow::Borrowed(profile)
        }
    }

    /// The algorithm a call of `count` elements of `dtype` would use and
    /// its predicted cost (`None` without a closed form, and for
    /// alltoallv, whose cost depends on every pair's counts, which no rank
    /// knows).
    pub(crate) fn predict(
        &self,
        coll: Collective,
        count: usize,
        dtype: DType,
    ) -> Result<(Algorithm, Option<Cost>)> {
        let (algo, _) = self.choose(coll, call_bytes(coll, self.n, count, dtype))?;
        if coll == Collective::AllToAllV {
            return Ok((algo, None));
        }
        let shape = self.shape(coll, count, dtype.size());
        Ok((algo, cost::predict(algo, &shape, &self.profile_for(coll))))
    }

    /// Prints, the first time a shape is seen (`FERROCOLL_DEBUG=tune`),
    /// which decided (tuned table or cost model) and every candidate's
    /// measured and predicted time side by side, to stderr.
    pub(crate) fn explain(&self, coll: Collective, count: usize, dtype: DType, bytes: usize) {
        let first = self
            .memo
            .explained
            .lock()
            .map(|mut seen| seen.len() < SHAPE_CACHE_LIMIT && seen.insert((coll, bytes)))
            .unwrap_or(false);
        if !first || coll == Collective::AllToAllV {
            return;
        }
        let shape = self.shape(coll, count, dtype.size());
        let ranked = cost::candidates(&shape, &self.profile_for(coll));
        let measured = self.measured(coll, bytes);
        let decided = match (&measured, self.table()) {
            (Some(m), _) if m.between.0 == m.between.1 => {
                format!("decided by the tuned table (measured at {} B)", bytes)
            }
            (Some(m), _) => format!(
                "decided by the tuned table (log-log between the measured {} B and {} B)",
                m.between.0, m.between.1
            ),
            (None, Some(_)) => {
                "decided by the cost model (the tuned table does not cover this size)".into()
            }
            (None, None) => "decided by the cost model (no tuned table for this launch)".into(),
        };
        let mut text = format!(
            "ferrocoll tune: {coll} {bytes} B on {} ranks, {decided}; times (us):\n  {:<18} {:>10} {:>10} = latency + bandwidth + compute",
            self.n, "algorithm", "measured", "predicted"
        );
        // The decider's order: measured where the table decided.
        let mut order: Vec<Algorithm> = match &measured {
            Some(m) => m.times.iter().map(|t| t.0).collect(),
            None => Vec::new(),
        };
        for (a, _) in &ranked {
            if !order.contains(a) {
                order.push(*a);
            }
        }
        for a in order {
            let m = measured
                .as_ref()
                .and_then(|m| m.times.iter().find(|t| t.0 == a))
                .map_or("-".to_string(), |t| format!("{:.2}", t.1 * 1e6));
            let p = ranked.iter().find(|r| r.0 == a).map(|r| r.1);
            let p_text = p.map_or("-".to_string(), |c| format!("{:.2}", c.total() * 1e6));
            let split = p.map_or(String::new(), |c| {
                format!(
                    " = {:.2} + {:.2} + {:.2}",
                    c.latency * 1e6,
                    c.bandwidth * 1e6,
                    c.compute * 1e6
                )
            });
            text.push_str(&format!("\n  {:<18} {m:>10} {p_text:>10}{split}", a.name()));
        }
        if let [(w, wc), (r, rc), ..] = ranked.as_slice() {
            text.push_str(&format!(
                "\n  model's winner {w}, runner-up {r} ({:.2}x)",
                rc.total() / wc.total().max(f64::MIN_POSITIVE)
            ));
        }
        if let Some(m) = &measured {
            if let [(w, wt), (r, rt), ..] = m.times.as_slice() {
                text.push_str(&format!(
                    "\n  measured winner {w}, runner-up {r} ({:.2}x)",
                    rt / wt.max(f64::MIN_POSITIVE)
                ));
            }
        }
        eprintln!("{text}");
    }

    fn shape(&self, coll: Collective, count: usize, elem_size: usize) -> Shape {
        let mut shape = Shape::new(coll, self.n, count, elem_size);
        shape.topology = self.topology.clone();
        shape
    }
}

/// The size in bytes that choice looks at for a call of `count` elements of
/// `dtype` (the per-rank block for the block collectives) among `n` ranks:
/// the size nccl-tests reports, which every rank agrees on (0 for
/// alltoallv, whose sizes differ per rank, and for barrier).
pub(crate) fn call_bytes(coll: Collective, n: usize, count: usize, dtype: DType) -> usize {
    let blocks = match coll {
        Collective::AllReduce | Collective::Broadcast | Collective::Reduce => 1,
        Collective::AllGather
        | Collective::ReduceScatter
        | Collective::AllToAll
        | Collective::Gather
        | Collective::Scatter => n,
        Collective::AllToAllV | Collective::Barrier => 0,
    };
    blocks * count * dtype.size()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_per_collective_and_global_names() {
        let c = AlgoChoice::parse("allreduce:tree, bcast:ring").unwrap();
        assert_eq!(c.get(Collective::AllReduce), Some(Algorithm::Tree));
        assert_eq!(c.get(Collective::Broadcast), Some(Algorithm::Pipeline));
        assert_eq!(c.get(Collective::Reduce), None);
        let c = AlgoChoice::parse("ring").unwrap();
        assert_eq!(c.get(Collective::AllGather), Some(Algorithm::Ring));
        // Broadcast's ring algorithm is the pipelined chain.
        assert_eq!(c.get(Collective::Broadcast), Some(Algorithm::Pipeline));
        assert_eq!(c.get(Collective::AllToAll), None, "alltoall has no ring");
        let c = AlgoChoice::parse("tree,allreduce:ring").unwrap();
        assert_eq!(c.get(Collective::AllReduce), Some(Algorithm::Ring));
        assert_eq!(c.get(Collective::Reduce), Some(Algorithm::Tree));
    }

    #[test]
    fn rejects_unknown_names_listing_valid_ones() {
        let e = AlgoChoice::parse("allreduce:bruck").unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("bruck") && msg.contains("ring") && msg.contains("tree"),
            "{msg}"
        );
        let e = AlgoChoice::parse("allreduce:linear").unwrap_err();
        assert!(matches!(e, Error::UnknownAlgorithm { .. }));
        let e = AlgoChoice::parse("allredux:ring").unwrap_err();
        assert!(e.to_string().contains("allreduce"), "{e}");
        assert!(AlgoChoice::parse("nonsense").is_err());
    }

    fn chooser<'a>(
        option: Option<Algorithm>,
        forced: &'a AlgoChoice,
        model: bool,
        profile: &'a Profile,
        topology: &'a Topology,
        memo: &'a Memo,
    ) -> Chooser<'a> {
        Chooser {
            option,
            forced,
            model,
            configured: Some(profile),
            tune: &TuneSetting::Off,
            transport: "thread",
            carrier: None,
            n: topology.size(),
            topology,
            memo,
        }
    }

    #[test]
    fn calls_whose_receivers_copy_are_priced_so() {
        // A profile whose senders copy (as shm's and tcp's), and a carrier
        // (the thread transport) whose receivers alone copy every call.
        let profile = Profile::thread_default().with_cores(2.0);
        assert!(!profile.receiver_copies);
        let topology = Topology::flat(4);
        let none = AlgoChoice::default();
        let fabric = crate::transport::thread::ThreadFabric::new(4);
        let carrier = fabric.transport(0);
        let (memo, plain_memo) = (Memo::default(), Memo::default());
        let c = Chooser {
            carrier: Some(&carrier),
            ..chooser(None, &none, true, &profile, &topology, &memo)
        };
        let plain = chooser(None, &none, true, &profile, &topology, &plain_memo);
        let count = 1 << 20;
        let shape = Shape::new(Collective::Broadcast, 4, count, 1);
        let receivers = Profile {
            receiver_copies: true,
            ..profile.clone()
        };
        let (a, cost) = c.predict(Collective::Broadcast, count, DType::U8).unwrap();
        assert_eq!(cost, cost::predict(a, &shape, &receivers));
        let (b, cost) = plain
            .predict(Collective::Broadcast, count, DType::U8)
            .unwrap();
        assert_eq!(cost, cost::predict(b, &shape, &profile));
        // A root that sends to its three peers at once pays nothing per
        // byte when they read it: the direct broadcast costs less so.
        let direct = |carrier| {
            let memo = Memo::default();
            let c = Chooser {
                carrier,
                ..chooser(
                    Some(Algorithm::Direct),
                    &none,
                    true,
                    &profile,
                    &topology,
                    &memo,
                )
            };
            let (a, cost) = c.predict(Collective::Broadcast, count, DType::U8).unwrap();
            assert_eq!(a, Algorithm::Direct);
            cost.unwrap().total()
        };
        let carried: &dyn crate::transport::Transport = &carrier;
        assert!(direct(Some(carried)) < 0.8 * direct(None));
    }

    #[test]
    fn precedence_is_option_then_algo_then_model_then_rule() {
        let profile = Profile::thread_default();
        let topology = Topology::flat(8);
        let memo = Memo::default();
        let forced = AlgoChoice::parse("allreduce:ring").unwrap();
        let none = AlgoChoice::default();
        let big = 64 << 20;
        let c = chooser(
            Some(Algorithm::Tree),
            &forced,
            true,
            &profile,
            &topology,
            &memo,
        );
        let (a, why) = c.choose(Collective::AllReduce, big).unwrap();
        assert_eq!(
            (a, why.as_str()),
            (Algorithm::Tree, "forced by call options")
        );
        // A per-call option the collective lacks is an error, not skipped.
        assert!(c.choose(Collective::AllToAll, big).is_err());
        let c = chooser(None, &forced, true, &profile, &topology, &memo);
        let (a, why) = c.choose(Collective::AllReduce, big).unwrap();
        assert_eq!(
            (a, why.as_str()),
            (Algorithm::Ring, "forced by FERROCOLL_ALGO")
        );
        let c = chooser(None, &none, true, &profile, &topology, &memo);
        let (a, why) = c.choose(Collective::AllReduce, big).unwrap();
        assert!(why.contains("cost model"), "{why}");
        // The model's choice is remembered per shape.
        assert_eq!(
            memo.chosen
                .lock()
                .unwrap()
                .get(&(Collective::AllReduce, big)),
            Some(&(a, Decider::Model))
        );
        // Alltoallv, whose cost no rank knows, and FERROCOLL_AUTO=rule take
        // the size rule.
        let (a, why) = c.choose(Collective::AllToAllV, 0).unwrap();
        assert_eq!(a, Algorithm::Direct);
        assert!(why.starts_with("auto: direct"), "{why}");
        let c = chooser(None, &none, false, &profile, &topology, &memo);
        let (a, why) = c.choose(Collective::AllReduce, big).unwrap();
        assert_eq!(
            (a, why.as_str()),
            (
                Algorithm::Ring,
                "auto: large message: bandwidth-optimal ring"
            )
        );
    }

    #[test]
    fn call_bytes_counts_every_block_of_the_block_collectives() {
        assert_eq!(call_bytes(Collective::AllReduce, 4, 10, DType::F32), 40);
        assert_eq!(call_bytes(Collective::AllGather, 4, 10, DType::F32), 160);
        assert_eq!(call_bytes(Collective::AllToAllV, 4, 10, DType::F32), 0);
        assert_eq!(call_bytes(Collective::Barrier, 4, 0, DType::U8), 0);
    }

    /// A table for `key` where, at 1 KiB and 1 MiB of allreduce, the
    /// model's own winner is the slowest candidate measured and its
    /// runner-up the fastest: a choice that follows the table cannot be the
    /// model's.
    fn contrary_table(key: crate::tune::TuneKey, profile: &Profile) -> (TuneTable, [Algorithm; 2]) {
        use crate::tune::{Measured, TunePoint};
        let n = key.ranks;
        let mut points = Vec::new();
        let mut fastest = [Algorithm::Ring; 2];
        for (i, bytes) in [1usize << 10, 1 << 20].into_iter().enumerate() {
            let ranked = cost::candidates(&Shape::new(Collective::AllReduce, n, bytes, 1), profile);
            assert!(ranked.len() >= 2, "{ranked:?}");
            fastest[i] = ranked[1].0;
            let times = ranked
                .iter()
                .enumerate()
                .map(|(j, (a, _))| Measured {
                    algo: a.name().into(),
                    // The model's winner slowest, its runner-up fastest.
                    median_us: match j {
                        0 => 1000.0,
                        1 => 10.0,
                        _ => 100.0 + j as f64,
                    },
                    p10_us: 0.0,
                    p90_us: 0.0,
                    samples: 3,
                })
                .collect();
            points.push(TunePoint {
                coll: "allreduce".into(),
                bytes,
                times,
            });
        }
        (TuneTable { key, points }, fastest)
    }

    #[test]
    fn a_tuned_table_decides_where_it_covers_the_size_the_model_elsewhere() {
        let profile = Profile::thread_default();
        let topology = Topology::flat(4);
        let none = AlgoChoice::default();
        let key = crate::tune::TuneKey::current("thread", 4, &topology);
        let (table, fastest) = contrary_table(key, &profile);
        let tune = TuneSetting::File(
            "t.json".into(),
            crate::tune::TuneFile {
                tables: vec![table],
            },
        );
        let memo = Memo::default();
        let c = Chooser {
            tune: &tune,
            ..chooser(None, &none, true, &profile, &topology, &memo)
        };
        let model_only = Memo::default();
        let m = chooser(None, &none, true, &profile, &topology, &model_only);
        for (i, bytes) in [1usize << 10, 1 << 20].into_iter().enumerate() {
            let (a, why) = c.choose(Collective::AllReduce, bytes).unwrap();
            assert_eq!(a, fastest[i], "{bytes} B: {why}");
            assert!(why.contains("tuned table"), "{why}");
            let (ma, mwhy) = m.choose(Collective::AllReduce, bytes).unwrap();
            assert_ne!(ma, a, "the model and the table disagree by construction");
            assert!(mwhy.contains("cost model"), "{mwhy}");
        }
        // Between the measured sizes: the log-log rule over the two
        // points (here one candidate is fastest at both ends only when the
        // model's runner-up is the same at both sizes).
        let (a, why) = c.choose(Collective::AllReduce, 32 << 10).unwrap();
        assert!(why.contains("tuned table"), "{why}");
        let lookup = c
            .table()
            .unwrap()
            .lookup(Collective::AllReduce, 32 << 10)
            .unwrap();
        assert_eq!(a, lookup.winner());
        assert_eq!(lookup.between, (1 << 10, 1 << 20));
        // Outside the measured range, and for collectives it lacks: the model.
        for (coll, bytes) in [
            (Collective::AllReduce, 64 << 20),
            (Collective::AllReduce, 8),
            (Collective::AllGather, 1 << 10),
        ] {
            let (a, why) = c.choose(coll, bytes).unwrap();
            assert!(why.contains("cost model"), "{coll} {bytes}: {why}");
            assert_eq!(a, m.choose(coll, bytes).unwrap().0);
        }
        // A forced algorithm still wins over the table.
        let forced = AlgoChoice::parse("allreduce:ring").unwrap();
        let f = Chooser {
            forced: &forced,
            ..chooser(None, &none, true, &profile, &topology, &memo)
        };
        assert_eq!(
            f.choose(Collective::AllReduce, 1 << 10).unwrap().0,
            Algorithm::Ring
        );
    }

    #[test]
    fn a_stale_table_is_ignored_for_the_model() {
        let profile = Profile::thread_default();
        let topology = Topology::flat(4);
        let none = AlgoChoice::default();
        let here = crate::tune::TuneKey::current("thread", 4, &topology);
        let stale_keys = [
            crate::tune::TuneKey {
                version: "0.0.0-before".into(),
                ..here.clone()
            },
            crate::tune::TuneKey {
                machine: "another-machine".into(),
                ..here.clone()
            },
            crate::tune::TuneKey {
                ranks: 8,
                ..here.clone()
            },
        ];
        for key in stale_keys {
            let (table, _) = contrary_table(key.clone(), &profile);
            let tune = TuneSetting::File(
                format!("stale-{}-{}.json", key.ranks, key.machine).into(),
                crate::tune::TuneFile {
                    tables: vec![table],
                },
            );
            let memo = Memo::default();
            let c = Chooser {
                tune: &tune,
                ..chooser(None, &none, true, &profile, &topology, &memo)
            };
            let (_, why) = c.choose(Collective::AllReduce, 1 << 10).unwrap();
            assert!(why.contains("cost model"), "{key:?}: {why}");
            assert!(c.table().is_none());
        }
    }
}
