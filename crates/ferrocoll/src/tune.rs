//! Tuned tables: what `ferrocoll tune` measured on this machine, which
//! `auto` trusts before the cost model where they cover a call.
//!
//! A [`TuneTable`] holds, for one launch ([`TuneKey`]: transport, group
//! size, topology, machine and library version), the measured time of every
//! candidate algorithm of each collective at a grid of sizes (median and
//! p10/p90 of repeated samples). A [`TuneFile`] keeps several tables (one
//! per group size and topology) beside the calibrated profile
//! ([`TuneFile::default_path`]: `<transport>.tune.json` next to
//! `<transport>.json`); `FERROCOLL_TUNE` names another file, or `off`.
//!
//! Between measured sizes [`TuneTable::lookup`] interpolates each
//! candidate's time on a log-log scale between the two nearest measured
//! sizes and takes the least (times of collectives are close to piecewise
//! power laws in the size, so a straight line in log-log space is the
//! natural guess, and it moves the crossover between two algorithms to
//! where their interpolated lines cross rather than to the midpoint). A
//! size outside the measured range is not covered: the model decides.
//!
//! A table measured elsewhere (another machine, group size, topology,
//! transport or library version) is never trusted: [`TuneFile::select`]
//! says why none fits and the caller warns once per process
//! ([`warn_once`]) and falls back to the model. Under a launcher rank 0
//! resolves the table and shares it ([`TuneSetting::Shared`]) so every rank
//! chooses alike.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::plan::{Algorithm, Collective};
use crate::topo::Topology;

/// The library version a table must carry to be used.
pub const LIBRARY_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Which launch a table was measured on; a table is used only on a launch
/// with the same key.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TuneKey {
    /// The transport as the communicator names it (`thread`, `shm`, `tcp`,
    /// `shm+tcp`).
    pub transport: String,
    /// Group size.
    pub ranks: usize,
    /// The group's topology ([`Topology`]'s display form, e.g. `4` or `2x2`).
    pub topology: String,
    /// The machine ([`machine_id`]) rank 0 ran on.
    pub machine: String,
    /// The library version that measured it ([`LIBRARY_VERSION`]).
    pub version: String,
}

impl TuneKey {
    /// The key of a launch of `ranks` ranks over `transport` with
    /// `topology`, on this machine and library version.
    pub fn current(transport: &str, ranks: usize, topology: &Topology) -> TuneKey {
        TuneKey {
            transport: transport.to_string(),
            ranks,
            topology: topology.to_string(),
            machine: machine_id(),
            version: LIBRARY_VERSION.to_string(),
        }
    }

    /// Why a table of key `self` does not fit a launch of key `want`, or
    /// `None` when it does.
    pub fn mismatch(&self, want: &TuneKey) -> Option<String> {
        let fields = [
            ("transport", &self.transport, &want.transport),
            ("machine", &self.machine, &want.machine),
            ("library version", &self.version, &want.version),
            ("topology", &self.topology, &want.topology),
        ];
        if self.ranks != want.ranks {
            return Some(format!(
                "measured on {} ranks, this launch has {}",
                self.ranks, want.ranks
            ));
        }
        fields
            .iter()
            .find(|(_, a, b)| a != b)
            .map(|(what, a, b)| format!("{what} `{a}`, this launch's is `{b}`"))
    }

    /// Whether a table of this key replaces one of `other`'s in a file:
    /// the same launch, whatever machine or version measured it (a new
    /// measurement supersedes the old one).
    fn same_launch(&self, other: &TuneKey) -> bool {
        self.transport == other.transport
            && self.ranks == other.ranks
            && self.topology == other.topology
    }
}

/// An identifier of this machine: `/etc/machine-id` (or dbus's copy), else
/// the host name, else `unknown`.
pub fn machine_id() -> String {
    [
        "/etc/machine-id",
        "/var/lib/dbus/machine-id",
        "/proc/sys/kernel/hostname",
    ]
    .iter()
    .filter_map(|p| std::fs::read_to_string(p).ok())
    .map(|s| s.trim().to_string())
    .find(|s| !s.is_empty())
    .unwrap_or_else(|| "unknown".into())
}

/// One algorithm's measured time at one size.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Measured {
    /// The algorithm's name ([`Algorithm::name`]).
    pub algo: String,
    /// Median over the samples, microseconds per call (each sample the mean
    /// of a batch of calls on the slowest rank).
    pub median_us: f64,
    /// 10th percentile of the samples.
    pub p10_us: f64,
    /// 90th percentile of the samples.
    pub p90_us: f64,
    /// Samples taken.
    pub samples: usize,
}

/// Every candidate's time for one collective at one size.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TunePoint {
    /// The collective's name ([`Collective::name`]).
    pub coll: String,
    /// The size as choice sees it ([`crate::Communicator::call_bytes`]:
    /// nccl-tests bytes, all blocks of the block collectives).
    pub bytes: usize,
    /// Each candidate's time.
    pub times: Vec<Measured>,
}

/// What `ferrocoll tune` measured on one launch.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TuneTable {
    /// The launch it applies to.
    pub key: TuneKey,
    /// The measured points, any order.
    pub points: Vec<TunePoint>,
}

/// What [`TuneTable::lookup`] finds for a call.
#[derive(Clone, Debug, PartialEq)]
pub struct Lookup {
    /// Each candidate's measured (or interpolated) time in seconds,
    /// fastest first.
    pub times: Vec<(Algorithm, f64)>,
    /// The measured sizes the times come from: equal when the size was
    /// measured, else the two around it.
    pub between: (usize, usize),
}

impl Lookup {
    /// The fastest candidate.
    pub fn winner(&self) -> Algorithm {
        self.times[0].0
    }
}

impl TuneTable {
    /// The measured times of `coll` for a call of `bytes` (as
    /// [`TunePoint::bytes`] counts): at a measured size its medians, between
    /// two measured sizes each candidate measured at both interpolated
    /// log-log, and `None` outside the measured range or where no
    /// candidate has a usable time.
    pub fn lookup(&self, coll: Collective, bytes: usize) -> Option<Lookup> {
        let mut pts: Vec<&TunePoint> = self
            .points
            .iter()
            .filter(|p| Collective::from_name(&p.coll) == Some(coll) && !p.times.is_empty())
            .collect();
        pts.sort_by_key(|p| p.bytes);
        let hi = pts.iter().position(|p| p.bytes >= bytes)?;
        let hi_pt = pts[hi];
        let usable = |m: &Measured| {
            Algorithm::from_name(&m.algo)
                .and_then(|a| a.for_collective(coll))
                .filter(|_| m.median_us.is_finite() && m.median_us > 0.0)
        };
        let mut times: Vec<(Algorithm, f64)> = if hi_pt.bytes == bytes {
            hi_pt
                .times
                .iter()
                .filter_map(|m| usable(m).map(|a| (a, m.median_us * 1e-6)))
                .collect()
        } else {
            let lo_pt = pts[hi.checked_sub(1)?];
            if lo_pt.bytes == 0 {
                return None;
            }
            // Position of `bytes` between the two on a log scale.
            let f = ((bytes as f64).ln() - (lo_pt.bytes as f64).ln())
                / ((hi_pt.bytes as f64).ln() - (lo_pt.bytes as f64).ln());
            lo_pt
                .times
                .iter()
                .filter_map(|lo| {
                    let a = usable(lo)?;
                    let hi = hi_pt.times.iter().find(|m| usable(m) == Some(a))?;
                    let ln_t = lo.median_us.ln() + f * (hi.median_us.ln() - lo.median_us.ln());
                    Some((a, ln_t.exp() * 1e-6))
                })
                .collect()
        };
        if times.is_empty() {
            return None;
        }
        times.sort_by(|a, b| a.1.total_cmp(&b.1));
        let lo_bytes = if hi_pt.bytes == bytes {
            bytes
        } else {
            pts[hi - 1].bytes
        };
        Some(Lookup {
            times,
            between: (lo_bytes, hi_pt.bytes),
        })
    }
}

/// Tables of several launches, as stored on disk.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TuneFile {
    /// One table per launch (transport, group size, topology).
    pub tables: Vec<TuneTable>,
}

impl TuneFile {
    /// Where `ferrocoll tune` writes and the library looks for the tables
    /// of `transport` when `FERROCOLL_TUNE` is not set: beside the profile
    /// ([`crate::cost::Profile::default_path`]), `<transport>.tune.json`.
    pub fn default_path(transport: &str) -> Option<PathBuf> {
        let profile = crate::cost::Profile::default_path(transport)?;
        Some(profile.with_file_name(format!("{transport}.tune.json")))
    }

    /// Reads a file `ferrocoll tune` wrote.
    pub fn load(path: &Path) -> Result<TuneFile, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        serde_json::from_str(&text)
            .map_err(|e| format!("{} is not a ferrocoll tuned table: {e}", path.display()))
    }

    /// Adds `table`, replacing any table of the same launch.
    pub fn insert(&mut self, table: TuneTable) {
        self.tables.retain(|t| !t.key.same_launch(&table.key));
        self.tables.push(table);
    }

    /// The table for a launch of key `want`, or why none fits (naming
    /// each table's mismatch).
    pub fn select(&self, want: &TuneKey) -> Result<&TuneTable, String> {
        let mut why = Vec::new();
        for t in &self.tables {
            match t.key.mismatch(want) {
                None => return Ok(t),
                Some(m) => why.push(m),
            }
        }
        if why.is_empty() {
            Err("it holds no table".into())
        } else {
            Err(format!("no table fits ({})", why.join("; ")))
        }
    }
}

/// Where `auto` gets its table ([`crate::Config::tune`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub enum TuneSetting {
    /// The transport's file at [`TuneFile::default_path`], if there is one.
    #[default]
    Default,
    /// No table (`FERROCOLL_TUNE=off`): the cost model decides.
    Off,
    /// The tables of a file (`FERROCOLL_TUNE=path`), with its path.
    File(PathBuf, TuneFile),
    /// The table rank 0 resolved at start-up, shared with every rank (used
    /// on the group it was resolved for; a communicator split from it, of
    /// another size or topology, has no table).
    Shared(TuneTable),
}

impl TuneSetting {
    /// The table for a group of `n` ranks over `transport` with
    /// `topology`: `None` when there is none or it does not fit, with a
    /// warning (once per process) when a file holds tables but none fits.
    pub fn resolve(&self, transport: &str, n: usize, topology: &Topology) -> Option<TuneTable> {
        let from_file = |path: &Path, file: &TuneFile| {
            let want = TuneKey::current(transport, n, topology);
            match file.select(&want) {
                Ok(t) => Some(t.clone()),
                Err(why) => {
                    warn_once(&format!(
                        "ferrocoll: warning: ignoring the tuned tables in {}: {why}; auto uses the \
                         cost model (run `ferrocoll tune` on this launch, or FERROCOLL_TUNE=off)",
                        path.display()
                    ));
                    None
                }
            }
        };
        match self {
            TuneSetting::Off => None,
            TuneSetting::Shared(t) => {
                (t.key.ranks == n && t.key.topology == topology.to_string()).then(|| t.clone())
            }
            TuneSetting::File(path, file) => from_file(path, file),
            TuneSetting::Default => {
                let path = TuneFile::default_path(transport)?;
                if !path.exists() {
                    return None;
                }
                match TuneFile::load(&path) {
                    Ok(file) => from_file(&path, &file),
                    Err(why) => {
                        warn_once(&format!(
                            "ferrocoll: warning: {why}; auto uses the cost model"
                        ));
                        None
                    }
                }
            }
        }
    }
}

/// Prints `message` to stderr unless this process already printed it;
/// returns whether it printed.
pub fn warn_once(message: &str) -> bool {
    static SEEN: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let first = SEEN
        .lock()
        .map(|mut seen| {
            seen.get_or_insert_with(HashSet::new)
                .insert(message.to_string())
        })
        .unwrap_or(true);
    if first {
        eprintln!("{message}");
    }
    first
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured(algo: &str, us: f64) -> Measured {
        Measured {
            algo: algo.into(),
            median_us: us,
            p10_us: us * 0.5,
            p90_us: us * 2.0,
            samples: 5,
        }
    }

    pub(crate) fn table(key: TuneKey) -> TuneTable {
        // Tree twice as fast at 1 KiB, ring 4x faster at 1 MiB.
        TuneTable {
            key,
            points: vec![
                TunePoint {
                    coll: "allreduce".into(),
                    bytes: 1024,
                    times: vec![measured("ring", 20.0), measured("tree", 10.0)],
                },
                TunePoint {
                    coll: "allreduce".into(),
                    bytes: 1 << 20,
                    times: vec![measured("ring", 100.0), measured("tree", 400.0)],
                },
            ],
        }
    }

    #[test]
    fn lookup_takes_measured_sizes_and_interpolates_log_log_between() {
        let t = table(TuneKey::current("thread", 4, &Topology::flat(4)));
        let at = t.lookup(Collective::AllReduce, 1024).unwrap();
        assert_eq!(at.winner(), Algorithm::Tree);
        assert_eq!(at.between, (1024, 1024));
        assert!((at.times[0].1 - 10e-6).abs() < 1e-12);
        // Halfway on a log scale (32 KiB): ring sqrt(20*100) = 44.7 us,
        // tree sqrt(10*400) = 63.2 us. The lines cross where
        // ln 2 = f ln 8, f = 1/3 of the way: 1024 * 1024^(1/3) = 10.1 KiB
        // (interpolating the times linearly in bytes would put it at 34 KiB,
        // and pick tree at 32 KiB).
        let mid = t.lookup(Collective::AllReduce, 32 << 10).unwrap();
        assert_eq!(mid.winner(), Algorithm::Ring);
        assert_eq!(mid.between, (1024, 1 << 20));
        assert!((mid.times[0].1 - (20.0f64 * 100.0).sqrt() * 1e-6).abs() < 1e-9);
        assert!((mid.times[1].1 - (10.0f64 * 400.0).sqrt() * 1e-6).abs() < 1e-9);
        assert_eq!(
            t.lookup(Collective::AllReduce, 8 << 10).unwrap().winner(),
            Algorithm::Tree
        );
        assert_eq!(
            t.lookup(Collective::AllReduce, 12 << 10).unwrap().winner(),
            Algorithm::Ring
        );
        // Outside the measured range, or another collective: not covered.
        assert!(t.lookup(Collective::AllReduce, 512).is_none());
        assert!(t.lookup(Collective::AllReduce, 2 << 20).is_none());
        assert!(t.lookup(Collective::AllReduce, 0).is_none());
        assert!(t.lookup(Collective::AllGather, 1024).is_none());
    }

    #[test]
    fn lookup_skips_unknown_and_unusable_entries() {
        let mut t = table(TuneKey::current("thread", 4, &Topology::flat(4)));
        t.points[0].times.push(measured("no-such-algo", 1.0));
        t.points[0].times.push(measured("bruck", 1.0)); // not an allreduce
        t.points[0].times.push(measured("butterfly", f64::NAN));
        let at = t.lookup(Collective::AllReduce, 1024).unwrap();
        assert_eq!(at.times.len(), 2, "{at:?}");
        // Between sizes only candidates measured at both count.
        t.points[1].times.retain(|m| m.algo == "tree");
        let mid = t.lookup(Collective::AllReduce, 4096).unwrap();
        assert_eq!(mid.times.len(), 1);
        assert_eq!(mid.winner(), Algorithm::Tree);
    }

    #[test]
    fn select_refuses_other_machines_sizes_versions_and_says_why() {
        let here = TuneKey::current("shm", 4, &Topology::flat(4));
        let mut file = TuneFile::default();
        assert!(file.select(&here).unwrap_err().contains("no table"));
        for (field, change) in [
            (
                "ranks",
                Box::new(|k: &mut TuneKey| k.ranks = 2) as Box<dyn Fn(&mut TuneKey)>,
            ),
            (
                "machine",
                Box::new(|k: &mut TuneKey| k.machine = "elsewhere".into()),
            ),
            (
                "version",
                Box::new(|k: &mut TuneKey| k.version = "0.0.0-old".into()),
            ),
            (
                "transport",
                Box::new(|k: &mut TuneKey| k.transport = "tcp".into()),
            ),
            (
                "topology",
                Box::new(|k: &mut TuneKey| k.topology = "2x2".into()),
            ),
        ] {
            let mut key = here.clone();
            change(&mut key);
            let file = TuneFile {
                tables: vec![table(key)],
            };
            let why = file.select(&here).unwrap_err();
            let word = match field {
                "ranks" => "2 ranks",
                "machine" => "elsewhere",
                "version" => "0.0.0-old",
                "transport" => "tcp",
                _ => "2x2",
            };
            assert!(why.contains(word), "{field}: {why}");
        }
        file.insert(table(TuneKey {
            ranks: 2,
            ..here.clone()
        }));
        file.insert(table(here.clone()));
        assert_eq!(file.select(&here).unwrap().key, here);
        // Re-tuning a launch replaces its table.
        let mut newer = table(here.clone());
        newer.points.pop();
        file.insert(newer.clone());
        assert_eq!(file.tables.len(), 2);
        assert_eq!(file.select(&here).unwrap(), &newer);
    }

    #[test]
    fn resolve_warns_once_and_falls_back_for_a_stale_file() {
        let topo = Topology::flat(4);
        let mut stale = TuneKey::current("thread", 4, &topo);
        stale.version = "0.0.0-stale".into();
        let setting = TuneSetting::File(
            PathBuf::from("/nowhere/stale.tune.json"),
            TuneFile {
                tables: vec![table(stale)],
            },
        );
        assert_eq!(setting.resolve("thread", 4, &topo), None);
        let message = "ferrocoll: warning: ignoring the tuned tables in /nowhere/stale.tune.json: \
             no table fits (library version `0.0.0-stale`, this launch's is `"
            .to_string()
            + LIBRARY_VERSION
            + "`); auto uses the cost model (run `ferrocoll tune` on this launch, or FERROCOLL_TUNE=off)";
        // resolve printed exactly this already: a second time is silent.
        assert!(!warn_once(&message));
        let fresh = TuneSetting::File(
            PathBuf::from("/nowhere/fresh.tune.json"),
            TuneFile {
                tables: vec![table(TuneKey::current("thread", 4, &topo))],
            },
        );
        assert!(fresh.resolve("thread", 4, &topo).is_some());
        assert_eq!(fresh.resolve("thread", 2, &Topology::flat(2)), None);
        // A shared table serves its own group only (not a split of it).
        let shared = TuneSetting::Shared(table(TuneKey::current("shm", 4, &topo)));
        assert!(shared.resolve("shm", 4, &topo).is_some());
        assert_eq!(shared.resolve("shm", 2, &Topology::flat(2)), None);
        assert_eq!(TuneSetting::Off.resolve("thread", 4, &topo), None);
    }

    #[test]
    fn round_trips_through_json() {
        let file = TuneFile {
            tables: vec![table(TuneKey::current("tcp", 2, &Topology::flat(2)))],
        };
        let text = serde_json::to_string(&file).unwrap();
        assert_eq!(serde_json::from_str::<TuneFile>(&text).unwrap(), file);
    }
}
