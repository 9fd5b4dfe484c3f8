//! Per-communicator configuration, from the environment or built in code.
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `FERROCOLL_ALGO` | force algorithms: `allreduce:ring,bcast:tree`, or one name for every collective that has it | `auto` |
//! | `FERROCOLL_TIMEOUT` | seconds any wait may take before failing with [`crate::Error::Timeout`] | 300 |
//! | `FERROCOLL_DEBUG` | `1`: rank 0 prints every algorithm choice and why to stderr; `tune`: also, the first time each shape is seen, every candidate's predicted time split into latency, bandwidth and compute, the winner and the runner-up | off |
//! | `FERROCOLL_TOPO` | level sizes of the group, outermost first: `2x4` = 2 nodes of 4 ranks (read by `hier`, `torus2d`, `mesh2d`) | flat |
//! | `FERROCOLL_PROFILE` | JSON profile from `ferrocoll calibrate` for the cost model; default: `$XDG_CONFIG_HOME/ferrocoll/<transport>.json` or `~/.config/ferrocoll/<transport>.json` if present | built-in |
//! | `FERROCOLL_TUNE` | tuned tables from `ferrocoll tune` that `auto` trusts before the cost model where they cover a call, or `off` (model only); default: `<transport>.tune.json` beside the profile if present. A table of another machine, group size, topology or library version is ignored with a warning | default file |
//! | `FERROCOLL_AUTO` | how `auto` chooses: `model` (least predicted time on the profile, cached per shape) or `rule` (the size thresholds of [`crate::select::auto`]) | `model` |
//! | `FERROCOLL_SLICE_BYTES` | allreduce/broadcast/reduce larger than this run as consecutive slices of this size (cache locality); `0` never slices | 2 MiB |
//! | `FERROCOLL_COMPRESS` | `auto:CODEC`: f32 sum/avg allreduces run compressed where the cost model predicts a gain; `CODEC`: always; `off` ([`crate::compress::CompressSetting`]) | `off` |

use std::time::Duration;

use crate::env::{self, Vars};
use crate::error::Result;
use crate::plan::{Algorithm, Collective};
use crate::select::AlgoChoice;
use crate::topo::Topology;

/// Default for [`Config::slice_bytes`]: measured best on the thread
/// transport (see bench/RESULTS.md).
pub const DEFAULT_SLICE_BYTES: usize = 2 << 20;

/// Default deadline for any single wait.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Longest deadline `FERROCOLL_TIMEOUT` may set: 30 days (a deadline must
/// stay a point in time the clock can represent; a job that should wait
/// longer than this for one message is stuck).
pub const MAX_TIMEOUT_SECS: f64 = 30.0 * 86_400.0;

/// Shortest deadline `FERROCOLL_TIMEOUT` may set: 1 ms.
pub const MIN_TIMEOUT_SECS: f64 = 0.001;

/// Smallest slice `FERROCOLL_SLICE_BYTES` may set (other than 0, never):
/// below it every slice costs a call's overhead for next to no data.
pub const MIN_SLICE_BYTES: usize = 4096;

/// `secs` seconds as a deadline, checked as `FERROCOLL_TIMEOUT` is (from
/// [`MIN_TIMEOUT_SECS`] to [`MAX_TIMEOUT_SECS`]); `what` names the source
/// in the error (a variable, or an argument such as `timeout`).
pub fn timeout_from_secs(what: &str, secs: f64) -> Result<Duration> {
    env::seconds(
        what,
        &secs.to_string(),
        MIN_TIMEOUT_SECS,
        MAX_TIMEOUT_SECS,
        "; the default is 300",
    )
}

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
    /// Where `auto` finds its tuned table (`FERROCOLL_TUNE`).
    pub tune: crate::tune::TuneSetting,
    /// Whether eligible allreduces run compressed (`FERROCOLL_COMPRESS`).
    pub compress: crate::compress::CompressSetting,
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
            tune: crate::tune::TuneSetting::Default,
            compress: crate::compress::CompressSetting::Off,
        }
    }
}

impl Config {
    /// Reads `FERROCOLL_ALGO`, `FERROCOLL_TIMEOUT`, `FERROCOLL_DEBUG`,
    /// `FERROCOLL_TOPO`, `FERROCOLL_PROFILE`, `FERROCOLL_TUNE`, `FERROCOLL_AUTO`,
    /// `FERROCOLL_SLICE_BYTES` and `FERROCOLL_COMPRESS` (the table in the module docs). A value that
    /// cannot be used is an [`crate::Error::Config`] naming the variable and what
    /// it accepts; unset or empty variables keep their defaults.
    pub fn from_env() -> Result<Config> {
        Config::from_vars(&env::process)
    }

    /// [`Config::from_env`] reading variables through `get` (tests pass a
    /// map; nothing reads the process environment).
    pub fn from_vars(get: &dyn Fn(&str) -> Option<String>) -> Result<Config> {
        let vars: Vars<'_> = get;
        let mut config = Config::default();
        if let Some(spec) = env::get(vars, "FERROCOLL_ALGO") {
            let example = "e.g. FERROCOLL_ALGO=ring or FERROCOLL_ALGO=allreduce:ring,bcast:tree";
            if spec.split(',').any(|entry| entry.trim().is_empty()) {
                return Err(env::bad(
                    "FERROCOLL_ALGO",
                    &spec,
                    format!(
                        "an empty entry between commas; give comma-separated entries, {example}"
                    ),
                ));
            }
            config.algorithms = AlgoChoice::parse(&spec).map_err(|e| {
                env::bad(
                    "FERROCOLL_ALGO",
                    &spec,
                    format!("{}; {example}", env::reason(e)),
                )
            })?;
        }
        if let Some(v) = env::get(vars, "FERROCOLL_TIMEOUT") {
            config.timeout = env::seconds(
                "FERROCOLL_TIMEOUT",
                &v,
                MIN_TIMEOUT_SECS,
                MAX_TIMEOUT_SECS,
                "; the default is 300",
            )?;
        }
        if let Some(v) = env::get(vars, "FERROCOLL_SLICE_BYTES") {
            let hint = "; 0 never slices, the default is 2097152 (2 MiB)";
            let bytes =
                env::whole_usize("FERROCOLL_SLICE_BYTES", &v, 0, usize::MAX, "bytes", hint)?;
            if bytes > 0 && bytes < MIN_SLICE_BYTES {
                return Err(env::bad(
                    "FERROCOLL_SLICE_BYTES",
                    &v,
                    format!(
                        "too small: slices under {MIN_SLICE_BYTES} bytes cost a step each for \
                         next to no data; give 0 (never slice) or at least {MIN_SLICE_BYTES}, \
                         e.g. FERROCOLL_SLICE_BYTES=2097152"
                    ),
                ));
            }
            config.slice_bytes = bytes;
        }
        if let Some(v) = env::get(vars, "FERROCOLL_TOPO") {
            let topo = v
                .parse::<Topology>()
                .map_err(|e| env::bad("FERROCOLL_TOPO", &v, env::reason(e)))?;
            config.topology = Some(topo);
        }
        if let Some(v) = env::get(vars, "FERROCOLL_PROFILE") {
            let profile =
                crate::cost::Profile::load(std::path::Path::new(&v)).map_err(|reason| {
                    env::bad(
                        "FERROCOLL_PROFILE",
                        &v,
                        format!(
                            "{reason}; give the path of a profile `ferrocoll calibrate` wrote, \
                             or unset it for the built-in one"
                        ),
                    )
                })?;
            config.profile = Some(profile);
        }
        if let Some(v) = env::get(vars, "FERROCOLL_TUNE") {
            config.tune = if ["off", "0", "none", "no", "false"]
                .iter()
                .any(|w| v.eq_ignore_ascii_case(w))
            {
                crate::tune::TuneSetting::Off
            } else {
                let path = std::path::PathBuf::from(&v);
                let file = crate::tune::TuneFile::load(&path).map_err(|reason| {
                    env::bad(
                        "FERROCOLL_TUNE",
                        &v,
                        format!(
                            "{reason}; give the path of a table `ferrocoll tune` wrote, `off` \
                             for the cost model only, or unset it for the default file"
                        ),
                    )
                })?;
                crate::tune::TuneSetting::File(path, file)
            };
        }
        if let Some(v) = env::get(vars, "FERROCOLL_COMPRESS") {
            config.compress = crate::compress::CompressSetting::parse(&v)
                .map_err(|e| env::bad("FERROCOLL_COMPRESS", &v, env::reason(e)))?;
        }
        if let Some(v) = env::get(vars, "FERROCOLL_AUTO") {
            config.auto_model = env::choice(
                "FERROCOLL_AUTO",
                &v,
                &[
                    ("model", "least predicted time", true),
                    ("rule", "size thresholds", false),
                ],
            )?;
        }
        if let Some(v) = env::get(vars, "FERROCOLL_DEBUG") {
            for word in v.split(',').map(str::trim).filter(|w| !w.is_empty()) {
                let (debug, tune) = env::choice(
                    "FERROCOLL_DEBUG",
                    word,
                    &[
                        ("1", "print algorithm choices", (true, false)),
                        ("on", "", (true, false)),
                        ("true", "", (true, false)),
                        ("yes", "", (true, false)),
                        ("tune", "also the cost model's table", (true, true)),
                        ("0", "off", (false, false)),
                        ("off", "", (false, false)),
                        ("false", "", (false, false)),
                        ("no", "", (false, false)),
                    ],
                )
                .map_err(|_| {
                    env::bad(
                        "FERROCOLL_DEBUG",
                        &v,
                        format!(
                            "`{word}` is not a debug setting; use 1 (print algorithm choices), \
                             tune (also the cost model's table) or 0 (off), e.g. FERROCOLL_DEBUG=1"
                        ),
                    )
                })?;
                config.debug |= debug;
                config.debug_tune |= tune;
            }
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
        // Longer than the longest `FERROCOLL_TIMEOUT` counts as it: a
        // deadline must stay a time the clock can reach.
        self.timeout = timeout.min(Duration::from_secs_f64(MAX_TIMEOUT_SECS));
        self
    }
}
