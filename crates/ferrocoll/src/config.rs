//! Per-communicator configuration, from the environment or built in code.
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `FERROCOLL_ALGO` | force algorithms: `allreduce:ring,bcast:tree`, or one name for every collective that has it | `auto` |
//! | `FERROCOLL_TIMEOUT` | seconds any wait may take before failing with [`crate::Error::Timeout`] | 300 |
//! | `FERROCOLL_DEBUG` | `1`: rank 0 prints every algorithm choice and why to stderr; `tune`: also, the first time each shape is seen, every candidate's predicted time split into latency, bandwidth and compute, the winner and the runner-up | off |
//! | `FERROCOLL_TOPO` | level sizes of the group, outermost first: `2x4` = 2 nodes of 4 ranks (read by `hier`, `torus2d`, `mesh2d`) | flat |
//! | `FERROCOLL_PROFILE` | JSON profile from `ferrocoll calibrate` for the cost model; default: `$XDG_CONFIG_HOME/ferrocoll/<transport>.json` or `~/.config/ferrocoll/<transport>.json` if present | built-in |
//! | `FERROCOLL_AUTO` | how `auto` chooses: `model` (least predicted time on the profile, cached per shape) or `rule` (the size thresholds of [`crate::select::auto`]) | `model` |
//! | `FERROCOLL_SLICE_BYTES` | allreduce/broadcast/reduce larger than this run as consecutive slices of this size (cache locality); `0` never slices | 2 MiB |

use std::time::Duration;

use crate::error::{Error, Result};
use crate::plan::{Algorithm, Collective};
use crate::select::AlgoChoice;
use crate::topo::Topology;

/// An environment variable's value; unset and empty are the same.
fn var(name: &str) -> Result<String, std::env::VarError> {
    std::env::var(name).and_then(|v| {
        if v.trim().is_empty() {
            Err(std::env::VarError::NotPresent)
        } else {
            Ok(v)
        }
    })
}

/// Default for [`Config::slice_bytes`]: measured best on the thread
/// transport (see bench/RESULTS.md).
pub const DEFAULT_SLICE_BYTES: usize = 2 << 20;

/// Default deadline for any single wait.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Settings shared by a communicator and the communicators split from it.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Forced algorithms.
    pub algorithms: AlgoChoice,
    /// Deadline for every wait (per-call options may override it).
    pub timeout: Duration,
    /// Print algorithm choices (rank 0, stderr).
    pub debug: bool,
    /// Also print the cost model's table the first time each shape is seen.
    pub debug_tune: bool,
    /// `auto` picks the least predicted time (true, the default) or follows
    /// the size rule (false).
    pub auto_model: bool,
    /// Elementwise collectives above this size run as slices of it (0: off).
    pub slice_bytes: usize,
    /// How the world's ranks nest into nodes; `None` is flat.
    pub topology: Option<Topology>,
    /// Cost-model parameters; `None` uses the transport's built-in profile
    /// (or its calibrated file at the default path, read by the transport's
    /// communicator).
    pub profile: Option<crate::cost::Profile>,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            algorithms: AlgoChoice::default(),
            timeout: DEFAULT_TIMEOUT,
            debug: false,
            debug_tune: false,
            auto_model: true,
            slice_bytes: DEFAULT_SLICE_BYTES,
            topology: None,
            profile: None,
        }
    }
}

impl Config {
    /// Reads `FERROCOLL_ALGO`, `FERROCOLL_TIMEOUT` and `FERROCOLL_DEBUG`.
    pub fn from_env() -> Result<Config> {
        let mut config = Config::default();
        if let Ok(spec) = var("FERROCOLL_ALGO") {
            config.algorithms = AlgoChoice::parse(&spec).map_err(|e| Error::Config {
                var: "FERROCOLL_ALGO".into(),
                value: spec.clone(),
                reason: match e {
                    Error::InvalidArgument(reason) => reason,
                    other => other.to_string(),
                },
            })?;
        }
        if let Ok(v) = var("FERROCOLL_TIMEOUT") {
            let secs: f64 = v
                .trim()
                .parse()
                .ok()
                .filter(|s: &f64| *s > 0.0 && s.is_finite())
                .ok_or_else(|| Error::Config {
                    var: "FERROCOLL_TIMEOUT".into(),
                    value: v.clone(),
                    reason: "give a positive number of seconds, e.g. 30 or 0.5".into(),
                })?;
            config.timeout = Duration::from_secs_f64(secs);
        }
        if let Ok(v) = var("FERROCOLL_SLICE_BYTES") {
            config.slice_bytes = v.trim().parse().map_err(|_| Error::Config {
                var: "FERROCOLL_SLICE_BYTES".into(),
                value: v.clone(),
                reason: "give a number of bytes, e.g. 2097152, or 0 to never slice".into(),
            })?;
        }
        if let Ok(v) = var("FERROCOLL_TOPO") {
            let topo = v.parse::<Topology>().map_err(|e| Error::Config {
                var: "FERROCOLL_TOPO".into(),
                value: v.clone(),
                reason: e.to_string(),
            })?;
            config.topology = Some(topo);
        }
        if let Ok(v) = var("FERROCOLL_PROFILE") {
            let profile =
                crate::cost::Profile::load(std::path::Path::new(&v)).map_err(|reason| {
                    Error::Config {
                        var: "FERROCOLL_PROFILE".into(),
                        value: v.clone(),
                        reason: format!("{reason}; run `ferrocoll calibrate` to write one"),
                    }
                })?;
            config.profile = Some(profile);
        }
        if let Ok(v) = var("FERROCOLL_AUTO") {
            config.auto_model = match v.trim() {
                "model" => true,
                "rule" => false,
                _ => {
                    return Err(Error::Config {
                        var: "FERROCOLL_AUTO".into(),
                        value: v.clone(),
                        reason: "use `model` (least predicted time) or `rule` (size thresholds)"
                            .into(),
                    })
                }
            };
        }
        if let Ok(v) = var("FERROCOLL_DEBUG") {
            config.debug = !matches!(v.trim(), "" | "0" | "false" | "off");
            config.debug_tune = v.split(',').any(|w| w.trim().eq_ignore_ascii_case("tune"));
        }
        Ok(config)
    }

    /// Forces `algo` for `coll`.
    pub fn with_algorithm(mut self, coll: Collective, algo: Algorithm) -> Result<Config> {
        self.algorithms.set(coll, algo)?;
        Ok(self)
    }

    /// Sets the topology of the world group.
    pub fn with_topology(mut self, topology: Topology) -> Config {
        self.topology = Some(topology);
        self
    }

    /// Sets the default deadline.
    pub fn with_timeout(mut self, timeout: Duration) -> Config {
        self.timeout = timeout;
        self
    }
}
