//! Choosing the algorithm for a call.
//!
//! Precedence: the per-call option ([`crate::CallOptions::algorithm`]), then
//! `FERROCOLL_ALGO` for that collective, then a global `FERROCOLL_ALGO` name
//! (applied to every collective that has it), then `auto`.
//!
//! `auto` normally asks the cost model for the algorithm with the least
//! predicted time ([`crate::cost::candidates`], on the communicator's profile
//! and topology; `FERROCOLL_AUTO=model`, the default). [`auto`] here is the
//! size rule it replaced (`FERROCOLL_AUTO=rule`), still used for alltoallv,
//! whose cost depends on counts no single rank knows: binomial trees below
//! [`SMALL_BYTES`] where latency dominates, rings above. bench/regret.sh
//! measures both against the best forced algorithm (bench/RESULTS.md).

use std::collections::HashMap;

use crate::error::{Error, Result};
use crate::plan::{unknown_algorithm, Algorithm, Collective};

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
}
