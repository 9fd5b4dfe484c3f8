//! Every environment variable ferrocoll reads, tried with empty, blank,
//! garbage, negative, zero, NaN, infinite, huge and overflowing values,
//! through the functions that parse them (over a map: nothing here touches
//! the process environment, which other tests' threads read). A value is
//! either accepted or refused with `Error::Config` naming the variable and
//! its value and saying what to set; never a panic.
//!
//! The table's `zero` column says where 0 is a legitimate value.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::time::Duration;

use ferrocoll::init::{check_vars, TransportKind};
use ferrocoll::{Config, Error, WorldSpec};

/// Which function parses the variable, and the variables it needs beside
/// it (a launcher's family).
#[derive(Clone, Copy, Debug)]
enum Parser {
    /// `ferrocoll::init::check_vars`: the configuration, the transports'
    /// knobs, the start-up's own, `FERROCOLL_TRANSPORT`.
    Library,
    /// `WorldSpec::from_vars` over `base`.
    World(&'static [(&'static str, &'static str)]),
}

const FERRO: &[(&str, &str)] = &[
    ("FERROCOLL_RANK", "2"),
    ("FERROCOLL_WORLD_SIZE", "4"),
    ("FERROCOLL_ADDR", "node01:29500"),
];
const TORCH: &[(&str, &str)] = &[
    ("RANK", "1"),
    ("WORLD_SIZE", "4"),
    ("MASTER_ADDR", "10.0.0.1"),
    ("MASTER_PORT", "29500"),
];
const OMPI: &[(&str, &str)] = &[
    ("OMPI_COMM_WORLD_RANK", "1"),
    ("OMPI_COMM_WORLD_SIZE", "4"),
    ("FERROCOLL_ADDR", "host0:29500"),
];
/// Slurm without an address: the port comes from FERROCOLL_PORT, else
/// MASTER_PORT, else the job id.
const SLURM: &[(&str, &str)] = &[
    ("SLURM_PROCID", "1"),
    ("SLURM_NTASKS", "4"),
    ("SLURM_JOB_ID", "123456"),
    ("SLURM_JOB_NODELIST", "node[01-04]"),
];
const PMI: &[(&str, &str)] = &[
    ("PMI_RANK", "1"),
    ("PMI_SIZE", "4"),
    ("FERROCOLL_ADDR", "host0:29500"),
];

/// Values every number is tried with (on top of each row's own).
const NUMERIC_BAD: &[&str] = &[
    "garbage",
    "-1",
    "NaN",
    "inf",
    "-inf",
    "1e300",
    "18446744073709551616",
    "99999999999999999999999999999999",
    "0x10",
    "12 abc",
];

/// Values every word-valued variable is tried with.
const WORD_BAD: &[&str] = &["garbage", "-1", "NaN", "inf", "1e300", "2"];

/// One variable: who parses it, values it must accept, values it must
/// refuse, and whether 0 is legitimate.
struct Row {
    var: &'static str,
    parser: Parser,
    zero: bool,
    good: &'static [&'static str],
    bad: &'static [&'static str],
    /// Also refuse [`NUMERIC_BAD`] (numbers) or [`WORD_BAD`] (words).
    std_bad: &'static [&'static str],
}

fn rows() -> Vec<Row> {
    use Parser::*;
    vec![
        // ---- the configuration (Config::from_vars) ----
        Row {
            var: "FERROCOLL_TIMEOUT",
            parser: Library,
            zero: false,
            good: &["30", "0.5", "1e3", "0.001", "2592000", " 7 "],
            bad: &["-0.5", "1e-9", "2592001", "1e300", "30s"],
            std_bad: NUMERIC_BAD,
        },
        Row {
            var: "FERROCOLL_ALGO",
            parser: Library,
            zero: false,
            good: &["auto", "ring", "allreduce:ring,bcast:tree"],
            bad: &["allreduce:", ":", "allreduce:nosuch", ",,"],
            std_bad: WORD_BAD,
        },
        Row {
            var: "FERROCOLL_SLICE_BYTES",
            parser: Library,
            zero: true,
            good: &["4096", "2097152", "18446744073709551615"],
            bad: &["1", "4095", "2M", "1.5"],
            std_bad: NUMERIC_BAD,
        },
        Row {
            var: "FERROCOLL_TOPO",
            parser: Library,
            zero: false,
            good: &["8", "2x4", "2X2x2"],
            bad: &["2x0", "2x", "x", "18446744073709551615x2", "2x-1", "1.5x2"],
            std_bad: NUMERIC_BAD,
        },
        Row {
            var: "FERROCOLL_AUTO",
            parser: Library,
            zero: false,
            good: &["model", "rule", "MODEL"],
            bad: &["1"],
            std_bad: WORD_BAD,
        },
        Row {
            var: "FERROCOLL_DEBUG",
            parser: Library,
            zero: true,
            good: &["1", "tune", "1,tune", "off", "on", "false"],
            bad: &["1,garbage", "verbose"],
            std_bad: WORD_BAD,
        },
        Row {
            var: "FERROCOLL_COMPRESS",
            parser: Library,
            zero: true,
            good: &[
                "off",
                "auto:int8",
                "AUTO:topk:0.01",
                "auto:onebit:128",
                "int8:64",
                "fp16",
                "auto:randk:0.01:7",
            ],
            bad: &[
                "auto",
                "auto:",
                "auto:zip",
                "auto:int8:0",
                "auto:topk:1.5",
                "powersgd:4",
                "on",
            ],
            std_bad: WORD_BAD,
        },
        // FERROCOLL_PROFILE and FERROCOLL_TOPO_FILE: paths (see below).
        // ---- the transports' knobs (TransportConfig) ----
        Row {
            var: "FERROCOLL_SPIN_US",
            parser: Library,
            zero: true,
            good: &["50", "1000000"],
            bad: &["1000001", "1.5"],
            std_bad: NUMERIC_BAD,
        },
        Row {
            var: "FERROCOLL_CHECKSUM",
            parser: Library,
            zero: true,
            good: &["1", "on", "true", "off", "no"],
            bad: &["maybe"],
            std_bad: WORD_BAD,
        },
        Row {
            var: "FERROCOLL_SINGLE_COPY_BYTES",
            parser: Library,
            zero: true,
            good: &["1", "65536", "18446744073709551615"],
            bad: &["64K", "1.5"],
            std_bad: NUMERIC_BAD,
        },
        Row {
            var: "FERROCOLL_EAGER_BYTES",
            parser: Library,
            zero: true,
            good: &["1", "32768", "18446744073709551615"],
            bad: &["32K", "1.5"],
            std_bad: NUMERIC_BAD,
        },
        Row {
            var: "FERROCOLL_SOCKET_BUFFER",
            parser: Library,
            zero: true,
            good: &["65536", "2147483647"],
            bad: &["2147483648", "4M"],
            std_bad: NUMERIC_BAD,
        },
        Row {
            var: "FERROCOLL_TCP_STREAMS",
            parser: Library,
            zero: false,
            good: &["1", "16"],
            bad: &["17", "1.5"],
            std_bad: NUMERIC_BAD,
        },
        Row {
            // A name: an interface this host lacks is refused when TCP
            // starts listening (the message lists the host's interfaces).
            var: "FERROCOLL_SOCKET_IFNAME",
            parser: Library,
            zero: true,
            good: &["lo", "eth0", "eth0:1", "garbage"],
            bad: &["a very long interface name", "eth/0", "eth 0", "l\no"],
            std_bad: &[],
        },
        Row {
            // Set by `ferrocoll run`: a path the ranks append to.
            var: "FERROCOLL_BLAME_FILE",
            parser: Library,
            zero: true,
            good: &["/tmp/ferrocoll-blame", "garbage"],
            bad: &["a\nb"],
            std_bad: &[],
        },
        // ---- start-up (init) ----
        Row {
            var: "FERROCOLL_TRANSPORT",
            parser: Library,
            zero: false,
            good: &["auto", "shm", "tcp", "TCP"],
            bad: &["thread", "0"],
            std_bad: WORD_BAD,
        },
        Row {
            var: "FERROCOLL_MOE_SCHEDULE",
            parser: Library,
            zero: false,
            good: &["auto", "direct", "two-level", "Rail", "2dh"],
            bad: &["fast", "0"],
            std_bad: WORD_BAD,
        },
        Row {
            var: "FERROCOLL_STORE",
            parser: Library,
            zero: false,
            good: &["rank0", "external"],
            bad: &["0"],
            std_bad: WORD_BAD,
        },
        Row {
            var: "FERROCOLL_STORE_BIND",
            parser: Library,
            zero: false,
            good: &["0.0.0.0:29500", "127.0.0.1:1", "[::]:29500", "node01:65535"],
            bad: &[
                "0",
                "node01",
                "node01:0",
                "node01:65536",
                "node01:-1",
                ":29500",
            ],
            std_bad: NUMERIC_BAD,
        },
        Row {
            var: "FERROCOLL_BIND",
            parser: Library,
            zero: false,
            good: &["auto", "core", "none"],
            bad: &["0", "1", "yes"],
            std_bad: WORD_BAD,
        },
        Row {
            var: "FERROCOLL_SHM_FAST",
            parser: Library,
            zero: true,
            good: &["auto", "off", "on", "1"],
            bad: &["fast"],
            std_bad: WORD_BAD,
        },
        Row {
            var: "FERROCOLL_SHM_SINGLE_COPY",
            parser: Library,
            zero: true,
            good: &["auto", "on", "off", "1"],
            bad: &["always"],
            std_bad: WORD_BAD,
        },
        Row {
            var: "FERROCOLL_SHM_RING_BYTES",
            parser: Library,
            zero: false,
            good: &["65536", "1048576", "268435456"],
            bad: &["65535", "100000", "536870912", "1M", "1.5"],
            std_bad: NUMERIC_BAD,
        },
        Row {
            var: "FERROCOLL_HOST_ID",
            parser: Library,
            zero: true,
            good: &["node7", "garbage", "-1", "NaN"],
            bad: &["a\nb", "tab\there"],
            std_bad: &[],
        },
        // ---- the launchers' variables (WorldSpec::from_vars) ----
        Row {
            var: "FERROCOLL_RANK",
            parser: World(FERRO),
            zero: true,
            good: &["3"],
            bad: &["4", "1.5"],
            std_bad: NUMERIC_BAD,
        },
        Row {
            var: "FERROCOLL_WORLD_SIZE",
            parser: World(FERRO),
            zero: false,
            good: &["3", "1048576"],
            bad: &["2", "1048577", "1.5"],
            std_bad: NUMERIC_BAD,
        },
        Row {
            var: "FERROCOLL_LOCAL_RANK",
            parser: World(FERRO),
            zero: true,
            good: &["3"],
            bad: &["4"],
            std_bad: NUMERIC_BAD,
        },
        Row {
            var: "FERROCOLL_LOCAL_WORLD_SIZE",
            parser: World(FERRO),
            zero: false,
            good: &["1", "4"],
            bad: &["5"],
            std_bad: NUMERIC_BAD,
        },
        Row {
            var: "FERROCOLL_ADDR",
            parser: World(FERRO),
            zero: false,
            good: &["node01:1", "[::1]:29500", "0.0.0.0:29500"],
            bad: &[
                "node01",
                "node01:0",
                "node01:-1",
                "node01:65536",
                "node01:NaN",
                "node01:1e300",
                ":1",
                "::1:29500",
            ],
            std_bad: NUMERIC_BAD,
        },
        Row {
            var: "FERROCOLL_PORT",
            parser: World(SLURM),
            zero: false,
            good: &["1", "29500", "65535"],
            bad: &["65536"],
            std_bad: NUMERIC_BAD,
        },
        Row {
            var: "FERROCOLL_SECRET",
            parser: World(FERRO),
            zero: true,
            good: &["s3cret", "garbage"],
            bad: &["a\nb"],
            std_bad: &[],
        },
        Row {
            var: "FERROCOLL_JOB_ID",
            parser: World(FERRO),
            zero: true,
            good: &["run-42", "NaN", "-1"],
            bad: &["a b", "a/b", "a.b", "123456789012345678901234567890123"],
            std_bad: &[],
        },
        Row {
            var: "RANK",
            parser: World(TORCH),
            zero: true,
            good: &["3"],
            bad: &["4"],
            std_bad: NUMERIC_BAD,
        },
        Row {
            var: "WORLD_SIZE",
            parser: World(TORCH),
            zero: false,
            good: &["2"],
            bad: &["1"],
            std_bad: NUMERIC_BAD,
        },
        Row {
            var: "LOCAL_RANK",
            parser: World(TORCH),
            zero: true,
            good: &["3"],
            bad: &["4"],
            std_bad: NUMERIC_BAD,
        },
        Row {
            var: "LOCAL_WORLD_SIZE",
            parser: World(TORCH),
            zero: false,
            good: &["2"],
            bad: &["5"],
            std_bad: NUMERIC_BAD,
        },
        Row {
            var: "MASTER_ADDR",
            parser: World(TORCH),
            zero: true,
            good: &["node01", "::1", "[::1]"],
            bad: &["a b", "a/b", "[node]"],
            std_bad: &[],
        },
        Row {
            var: "MASTER_PORT",
            parser: World(TORCH),
            zero: false,
            good: &["1", "65535"],
            bad: &["65536"],
            std_bad: NUMERIC_BAD,
        },
        Row {
            var: "OMPI_COMM_WORLD_RANK",
            parser: World(OMPI),
            zero: true,
            good: &["3"],
            bad: &["4"],
            std_bad: NUMERIC_BAD,
        },
        Row {
            var: "OMPI_COMM_WORLD_SIZE",
            parser: World(OMPI),
            zero: false,
            good: &["2"],
            bad: &["1"],
            std_bad: NUMERIC_BAD,
        },
        Row {
            var: "OMPI_COMM_WORLD_LOCAL_RANK",
            parser: World(OMPI),
            zero: true,
            good: &["3"],
            bad: &["4"],
            std_bad: NUMERIC_BAD,
        },
        Row {
            var: "OMPI_COMM_WORLD_LOCAL_SIZE",
            parser: World(OMPI),
            zero: false,
            good: &["4"],
            bad: &["5"],
            std_bad: NUMERIC_BAD,
        },
        Row {
            var: "SLURM_PROCID",
            parser: World(SLURM),
            zero: true,
            good: &["3"],
            bad: &["4"],
            std_bad: NUMERIC_BAD,
        },
        Row {
            var: "SLURM_NTASKS",
            parser: World(SLURM),
            zero: false,
            good: &["2"],
            bad: &["1"],
            std_bad: NUMERIC_BAD,
        },
        Row {
            var: "SLURM_LOCALID",
            parser: World(SLURM),
            zero: true,
            good: &["3"],
            bad: &["4"],
            std_bad: NUMERIC_BAD,
        },
        Row {
            // Without an address or port, the port is derived from it.
            var: "SLURM_JOB_ID",
            parser: World(SLURM),
            zero: true,
            good: &["1", "18446744073709551615"],
            bad: &["abc", "-1", "18446744073709551616", "1.5"],
            std_bad: &[],
        },
        Row {
            var: "SLURM_JOB_NODELIST",
            parser: World(SLURM),
            zero: true,
            good: &["node01", "node[01-04],gpu7", "r[1-2]n[3-4]"],
            bad: &["node[01-", "a b", "node]", "[01-02]x[", "node[a-b]"],
            std_bad: &[],
        },
        Row {
            // A hint only: a count that cannot be right is dropped (the
            // allocation's may not describe this step), never an error.
            var: "SLURM_NTASKS_PER_NODE",
            parser: World(SLURM),
            zero: true,
            good: &[
                "2",
                "4(x1)",
                "garbage",
                "-1",
                "NaN",
                "1e300",
                "18446744073709551616",
            ],
            bad: &[],
            std_bad: &[],
        },
        Row {
            var: "PMI_RANK",
            parser: World(PMI),
            zero: true,
            good: &["3"],
            bad: &["4"],
            std_bad: NUMERIC_BAD,
        },
        Row {
            var: "PMI_SIZE",
            parser: World(PMI),
            zero: false,
            good: &["2"],
            bad: &["1"],
            std_bad: NUMERIC_BAD,
        },
        Row {
            // Made safe for file names (any text is fine).
            var: "TORCHELASTIC_RUN_ID",
            parser: World(TORCH),
            zero: true,
            good: &["none", "garbage", "a/b c", "-1", "NaN"],
            bad: &[],
            std_bad: &[],
        },
    ]
}

/// Runs `parser` with `extra` over its base variables (a `None` value
/// removes the variable), catching a panic.
fn parse_with(
    parser: Parser,
    extra: &[(&str, Option<&str>)],
) -> std::thread::Result<Result<(), Error>> {
    let base: &[(&str, &str)] = match parser {
        Parser::Library => &[],
        Parser::World(base) => base,
    };
    let mut map: HashMap<String, String> = base
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    for (k, v) in extra {
        match v {
            Some(v) => map.insert(k.to_string(), v.to_string()),
            None => map.remove(*k),
        };
    }
    let get = move |name: &str| map.get(name).cloned();
    catch_unwind(AssertUnwindSafe(|| match parser {
        Parser::Library => check_vars(&get),
        Parser::World(_) => WorldSpec::from_vars(&get).map(drop),
    }))
}

/// [`parse_with`] setting `extra`.
fn parse(parser: Parser, extra: &[(&str, &str)]) -> std::thread::Result<Result<(), Error>> {
    let extra: Vec<(&str, Option<&str>)> = extra.iter().map(|(k, v)| (*k, Some(*v))).collect();
    parse_with(parser, &extra)
}

/// Checks that `var` set to empty or blank `value` is the same as unset.
fn judge_empty(parser: Parser, var: &str, value: &str) -> Option<String> {
    let set = parse(parser, &[(var, value)]);
    let unset = parse_with(parser, &[(var, None)]);
    match (set, unset) {
        (Err(_), _) => Some(format!("{var}={value:?} panicked")),
        (Ok(a), Ok(b))
            if a.as_ref().map_err(|e| e.to_string()) == b.as_ref().map_err(|e| e.to_string()) =>
        {
            None
        }
        (Ok(a), b) => Some(format!(
            "{var}={value:?} is not the same as unset: {a:?} against {b:?}"
        )),
    }
}

/// Checks that `var=value` is accepted (`good`) or refused as it must be;
/// returns what went wrong, if anything.
fn judge(parser: Parser, var: &str, value: &str, good: bool) -> Option<String> {
    let outcome = match parse(parser, &[(var, value)]) {
        Err(_) => return Some(format!("{var}={value:?} panicked")),
        Ok(outcome) => outcome,
    };
    match (good, outcome) {
        (true, Ok(())) => None,
        (true, Err(e)) => Some(format!("{var}={value:?} refused: {e}")),
        (false, Ok(())) => Some(format!("{var}={value:?} accepted")),
        (false, Err(e)) => {
            let msg = e.to_string();
            let shown: String = value.trim().chars().take(40).collect();
            // The message quotes the value as Rust does (`\n` for a newline).
            let quoted = format!("{shown:?}");
            let escaped = &quoted[1..quoted.len() - 1];
            if !matches!(e, Error::Config { .. }) {
                Some(format!("{var}={value:?}: not a configuration error: {msg}"))
            } else if !msg.contains(var) || !(msg.contains(&shown) || msg.contains(escaped)) {
                Some(format!(
                    "{var}={value:?}: the message names neither it nor its value: {msg}"
                ))
            } else if !["e.g.", "use ", "give ", "set ", "unset "]
                .iter()
                .any(|w| msg.contains(w))
            {
                Some(format!(
                    "{var}={value:?}: the message does not say what to set: {msg}"
                ))
            } else {
                None
            }
        }
    }
}

#[test]
fn every_variable_accepts_its_range_and_refuses_the_rest_by_name() {
    let mut failures = Vec::new();
    let mut tried = 0;
    for row in rows() {
        // Empty and blank are unset: the default, or (for a variable a
        // launcher's family requires) the error for a missing one.
        for value in ["", "   "] {
            failures.extend(judge_empty(row.parser, row.var, value));
            tried += 1;
        }
        failures.extend(judge(row.parser, row.var, "0", row.zero));
        tried += 1;
        for value in row.good {
            failures.extend(judge(row.parser, row.var, value, true));
            tried += 1;
        }
        for value in row.bad.iter().chain(row.std_bad) {
            failures.extend(judge(row.parser, row.var, value, false));
            tried += 1;
        }
        // Something enormous: refused (numbers, words) or taken whole
        // (free text up to its limit), never a panic.
        let huge = "9".repeat(100_000);
        if parse(row.parser, &[(row.var, &huge)]).is_err() {
            failures.push(format!("{}=<100000 digits> panicked", row.var));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {tried} cases went wrong:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn long_free_text_is_refused_by_length() {
    let long_secret = "s".repeat(4097);
    let long_host = "h".repeat(256);
    for (parser, var, value) in [
        (
            Parser::World(FERRO),
            "FERROCOLL_SECRET",
            long_secret.as_str(),
        ),
        (Parser::Library, "FERROCOLL_HOST_ID", long_host.as_str()),
    ] {
        assert_eq!(judge(parser, var, value, false), None);
        assert_eq!(judge(parser, var, &value[1..], true), None);
    }
}

/// A file in the temporary directory, removed at the end.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str, contents: &[u8]) -> TempFile {
        let path =
            std::env::temp_dir().join(format!("ferrocoll-env-{}-{name}", std::process::id()));
        std::fs::write(&path, contents).unwrap();
        TempFile(path)
    }
    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn paths_must_name_readable_files_of_the_right_form() {
    let topo = TempFile::new("topo-good", b"2x4\n");
    let topo_bad = TempFile::new("topo-bad", b"two by four");
    let topo_zero = TempFile::new("topo-zero", b"0");
    let profile_json = serde_json::to_vec(&ferrocoll::cost::ProfileFile {
        transport: "thread".into(),
        profile: ferrocoll::cost::Profile::thread_default(),
        r2: 1.0,
        geomean_error: 0.0,
        points: 1,
        algorithm_errors: Vec::new(),
    })
    .unwrap();
    let profile = TempFile::new("profile-good.json", &profile_json);
    let tune_json = serde_json::to_vec(&ferrocoll::tune::TuneFile::default()).unwrap();
    let tune = TempFile::new("tune-good.json", &tune_json);
    let tune_bad = TempFile::new("tune-bad.json", b"{\"tables\": 3}");
    let profile_bad = TempFile::new("profile-bad.json", b"{ not json");
    let mut failures = Vec::new();
    for (var, value, good) in [
        ("FERROCOLL_TOPO_FILE", topo.path(), true),
        ("FERROCOLL_TOPO_FILE", topo_bad.path(), false),
        ("FERROCOLL_TOPO_FILE", topo_zero.path(), false),
        ("FERROCOLL_TOPO_FILE", "/nonexistent/ferrocoll-topo", false),
        ("FERROCOLL_TOPO_FILE", "/", false),
        ("FERROCOLL_PROFILE", profile.path(), true),
        ("FERROCOLL_PROFILE", profile_bad.path(), false),
        ("FERROCOLL_PROFILE", "/nonexistent/ferrocoll.json", false),
        ("FERROCOLL_PROFILE", "/", false),
        ("FERROCOLL_PROFILE", "garbage", false),
        ("FERROCOLL_TUNE", tune.path(), true),
        ("FERROCOLL_TUNE", "off", true),
        ("FERROCOLL_TUNE", tune_bad.path(), false),
        ("FERROCOLL_TUNE", profile.path(), false),
        ("FERROCOLL_TUNE", "/nonexistent/ferrocoll.tune.json", false),
    ] {
        failures.extend(judge(Parser::Library, var, value, good));
    }
    for var in ["FERROCOLL_TOPO_FILE", "FERROCOLL_PROFILE", "FERROCOLL_TUNE"] {
        failures.extend(judge_empty(Parser::Library, var, ""));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Accepted values mean what they say (no silent reinterpretation).
#[test]
fn accepted_values_are_read_as_given() {
    let vars = |pairs: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    };
    let c = Config::from_vars(&vars(&[
        ("FERROCOLL_TIMEOUT", "0.25"),
        ("FERROCOLL_SLICE_BYTES", "0"),
        ("FERROCOLL_DEBUG", "1,tune"),
        ("FERROCOLL_AUTO", "rule"),
        ("FERROCOLL_TOPO", "2x4"),
    ]))
    .unwrap();
    assert_eq!(c.timeout, Duration::from_millis(250));
    assert_eq!(c.slice_bytes, 0);
    assert!(c.debug && c.debug_tune && !c.auto_model);
    assert_eq!(c.topology.unwrap().levels(), &[2, 4]);
    let c = Config::from_vars(&vars(&[
        ("FERROCOLL_DEBUG", "0"),
        ("FERROCOLL_TIMEOUT", " "),
    ]))
    .unwrap();
    assert!(!c.debug && !c.debug_tune);
    assert_eq!(c.timeout, ferrocoll::config::DEFAULT_TIMEOUT);
    assert_eq!(
        TransportKind::from_vars(&vars(&[("FERROCOLL_TRANSPORT", " Tcp ")])).unwrap(),
        TransportKind::Tcp
    );
    let w = WorldSpec::from_vars(&vars(&[
        ("FERROCOLL_RANK", "0"),
        ("FERROCOLL_WORLD_SIZE", "1"),
        ("FERROCOLL_ADDR", "127.0.0.1:29500"),
    ]))
    .unwrap();
    assert_eq!((w.rank, w.size), (0, 1));
}

/// The bug that started this: `FERROCOLL_TIMEOUT=1e300` panicked inside
/// `Duration::from_secs_f64`; a timeout argument takes the same checks.
#[test]
fn an_enormous_timeout_is_a_configuration_error() {
    let get = |name: &str| (name == "FERROCOLL_TIMEOUT").then(|| "1e300".to_string());
    let err = Config::from_vars(&get).unwrap_err().to_string();
    assert!(
        err.contains("FERROCOLL_TIMEOUT") && err.contains("1e300") && err.contains("30 days"),
        "{err}"
    );
    for secs in [1e300, f64::INFINITY, f64::NAN, -1.0, 0.0] {
        let err = ferrocoll::config::timeout_from_secs("timeout", secs).unwrap_err();
        assert!(matches!(err, Error::Config { .. }), "{secs}: {err:?}");
    }
    assert_eq!(
        ferrocoll::config::timeout_from_secs("timeout", 2.5).unwrap(),
        Duration::from_millis(2500)
    );
}
