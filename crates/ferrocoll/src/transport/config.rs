//! The transports' environment knobs, read once.
//!
//! `launch::init` builds a [`TransportConfig`] with [`TransportConfig::from_env`]
//! and hands it to the engine, the TCP connector and the shared-memory
//! set-up; the transports themselves never read the environment, so a test
//! (or an embedder) can build one by hand and two communicators of one
//! process can differ.

use std::path::PathBuf;
use std::time::Duration;

use crate::env;
use crate::error::Result;

/// Kernel socket buffer size asked for by default (the kernel may cap it).
const SOCKET_BUFFER: libc::c_int = 4 << 20;

/// Streams per peer unless `FERROCOLL_TCP_STREAMS` says otherwise.
const DEFAULT_STREAMS: usize = 1;

/// Messages at least this long go by the single-copy path when the channel
/// has one, by default: 16 KiB, where the small-call fast path stops (on 2-4
/// ranks). With 64 KiB, a 2-rank allgather or alltoall of 64 KiB (32 KiB
/// messages) took 10-11 us through the rings and 5.2-5.3 us by the single
/// copy, an in-place broadcast of 32 KiB 7.4 against 3.4 us; 4-rank
/// allreduce and reduce-scatter, whose messages take it too on 2 cores,
/// were alike or faster (bench/RESULTS.md, issue 20, 2026-12-06).
const SINGLE_COPY_BYTES: usize = 16 << 10;

/// Data messages longer than this wait for the receiver, by default (see
/// [`TransportConfig::eager_bytes`]).
///
/// 8 KiB: with 32 KiB a 2-rank shm broadcast of 32 KiB took 14.6-16.9 us
/// and a reduce of 16 KiB 8.4-11.4 us (the sender ran ahead, its peer
/// buffered), against 1.3-1.4 and 1.6-1.7 us with 8 KiB; allreduce and
/// allgather, whose receives are posted when the bytes come, were alike
/// (bench/RESULTS.md, issue 20).
const EAGER_BYTES: usize = 8 << 10;

/// What the process transports read from the environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TransportConfig {
    /// `FERROCOLL_SPIN_US`: how long a waiting call polls before it sleeps
    /// (0 to 1 s), overriding the engine's choice (by whether the rank has
    /// a core of its own).
    pub spin: Option<Duration>,
    /// `FERROCOLL_CHECKSUM=1` (or `on`, `true`): data frames carry a
    /// CRC32C, and the small-call fast path is off.
    pub checksums: bool,
    /// `FERROCOLL_SINGLE_COPY_BYTES`: messages at least this long go by the
    /// single-copy path when the channel has one (`usize::MAX`: never; the
    /// variable's 0 turns it off).
    pub single_copy_bytes: usize,
    /// `FERROCOLL_EAGER_BYTES`: a data message longer than this that goes
    /// through a ring or socket completes only once the receiver has
    /// matched it to a posted receive (rendezvous, as MPI's beyond its
    /// eager limit; the bytes still stream at once). Without it a rank that
    /// runs ahead (the non-root of a loop of reduces) had the receiver
    /// buffer an unbounded queue of unexpected messages; of the shorter
    /// ones every 64th in a row to one peer waits too (`usize::MAX`: never
    /// wait, neither; the variable's 0 turns waiting off).
    pub eager_bytes: usize,
    /// `FERROCOLL_SOCKET_BUFFER`: the kernel socket buffer size asked for
    /// on every TCP stream (0: the kernel's default).
    pub socket_buffer: libc::c_int,
    /// `FERROCOLL_TCP_STREAMS`: TCP connections per peer, 1 to 16.
    pub tcp_streams: usize,
    /// `FERROCOLL_SOCKET_IFNAME`: the interface TCP listens on (`None`: the
    /// one that routes to the rendezvous store).
    pub socket_ifname: Option<String>,
    /// `FERROCOLL_BLAME_FILE` (set by `ferrocoll run`): where this rank
    /// appends `CULPRIT REPORTER` once it knows which rank failed first, so
    /// the launcher reports that rank rather than the first to exit.
    pub blame_file: Option<PathBuf>,
    /// `FERROCOLL_TEST_FLIP_FRAME=N` (only with the `fault-injection`
    /// feature): flip one payload bit of the N-th data frame this process
    /// sends, after its checksum was computed, to prove corruption is
    /// caught.
    #[cfg(feature = "fault-injection")]
    pub flip_frame: Option<u64>,
}

impl Default for TransportConfig {
    fn default() -> TransportConfig {
        TransportConfig {
            spin: None,
            checksums: false,
            single_copy_bytes: SINGLE_COPY_BYTES,
            eager_bytes: EAGER_BYTES,
            socket_buffer: SOCKET_BUFFER,
            tcp_streams: DEFAULT_STREAMS,
            socket_ifname: None,
            blame_file: None,
            #[cfg(feature = "fault-injection")]
            flip_frame: None,
        }
    }
}

/// Longest spin `FERROCOLL_SPIN_US` may ask for: 1 s (a waiting rank
/// must sleep eventually; ranks often share cores).
pub(crate) const MAX_SPIN_US: u64 = 1_000_000;

/// Longest path (Linux's PATH_MAX less the NUL).
const MAX_PATH: usize = 4095;

/// Longest interface name (Linux's IFNAMSIZ less the NUL).
const MAX_IFNAME: usize = 15;

impl TransportConfig {
    /// Reads the knobs from the environment; unset (or empty) ones keep
    /// their defaults, and a value that cannot be used is an
    /// [`Error::Config`] naming the variable and what it accepts.
    pub(crate) fn from_env() -> Result<TransportConfig> {
        Self::from_lookup(crate::env::process)
    }

    /// [`TransportConfig::from_env`] over any source of variables (tests).
    pub(crate) fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<TransportConfig> {
        let vars: env::Vars<'_> = &var;
        let d = TransportConfig::default();
        let get = |name| env::get(vars, name);
        let spin = match get("FERROCOLL_SPIN_US") {
            None => d.spin,
            Some(v) => Some(Duration::from_micros(env::whole(
                "FERROCOLL_SPIN_US",
                &v,
                0,
                MAX_SPIN_US,
                "microseconds",
                "; 0 sleeps at once; unset, a rank spins 200 us on a core of its own, 1000 us \
                 sharing one",
            )?)),
        };
        let checksums = match get("FERROCOLL_CHECKSUM") {
            None => d.checksums,
            Some(v) => env::switch("FERROCOLL_CHECKSUM", &v)?,
        };
        let single_copy_bytes = match get("FERROCOLL_SINGLE_COPY_BYTES") {
            None => d.single_copy_bytes,
            Some(v) => match env::whole_usize(
                "FERROCOLL_SINGLE_COPY_BYTES",
                &v,
                0,
                usize::MAX,
                "bytes",
                "; 0 turns the single-copy path off, the default is 16384",
            )? {
                0 => usize::MAX,
                b => b,
            },
        };
        let eager_bytes = match get("FERROCOLL_EAGER_BYTES") {
            None => d.eager_bytes,
            Some(v) => match env::whole_usize(
                "FERROCOLL_EAGER_BYTES",
                &v,
                0,
                usize::MAX,
                "bytes",
                "; 0 never waits for the receiver, the default is 8192",
            )? {
                0 => usize::MAX,
                b => b,
            },
        };
        let socket_buffer = match get("FERROCOLL_SOCKET_BUFFER") {
            None => d.socket_buffer,
            Some(v) => env::whole(
                "FERROCOLL_SOCKET_BUFFER",
                &v,
                0,
                libc::c_int::MAX as u64,
                "bytes",
                "; 0 leaves the size to the kernel, the default is 4194304 (the kernel caps it \
                 at net.core.rmem_max / wmem_max)",
            )? as libc::c_int,
        };
        let tcp_streams = match get("FERROCOLL_TCP_STREAMS") {
            None => d.tcp_streams,
            Some(v) => env::whole_usize(
                "FERROCOLL_TCP_STREAMS",
                &v,
                1,
                16,
                "TCP connections per peer",
                "; the default is 1",
            )?,
        };
        let socket_ifname = match get("FERROCOLL_SOCKET_IFNAME") {
            None => None,
            Some(v) => {
                let hint = "give one of this host's interfaces (`ip link` lists them), e.g. \
                            FERROCOLL_SOCKET_IFNAME=eth0, or unset it for the one that routes to \
                            the rendezvous";
                let name = env::text(
                    "FERROCOLL_SOCKET_IFNAME",
                    &v,
                    MAX_IFNAME,
                    "network interface name",
                    hint,
                )?;
                if name.contains(|c: char| c.is_whitespace() || c == '/') {
                    return Err(env::bad(
                        "FERROCOLL_SOCKET_IFNAME",
                        &v,
                        format!("an interface name has no spaces or `/`; {hint}"),
                    ));
                }
                Some(name)
            }
        };
        let blame_file = match get("FERROCOLL_BLAME_FILE") {
            None => None,
            Some(v) => Some(PathBuf::from(env::text(
                "FERROCOLL_BLAME_FILE",
                &v,
                MAX_PATH,
                "path",
                "`ferrocoll run` sets it to a file of its own; unset it when not running under \
                 it",
            )?)),
        };
        Ok(TransportConfig {
            spin,
            checksums,
            single_copy_bytes,
            eager_bytes,
            socket_buffer,
            tcp_streams,
            socket_ifname,
            blame_file,
            #[cfg(feature = "fault-injection")]
            flip_frame: match get("FERROCOLL_TEST_FLIP_FRAME") {
                None => None,
                Some(v) => Some(env::whole(
                    "FERROCOLL_TEST_FLIP_FRAME",
                    &v,
                    1,
                    u64::MAX,
                    "data frames",
                    " (the frame whose bit to flip, counted from 1)",
                )?),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(vars: &[(&str, &str)]) -> Result<TransportConfig> {
        TransportConfig::from_lookup(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn unset_knobs_keep_the_defaults() {
        assert_eq!(from(&[]).unwrap(), TransportConfig::default());
    }

    #[test]
    fn knobs_are_read() {
        let c = from(&[
            ("FERROCOLL_SPIN_US", " 50 "),
            ("FERROCOLL_CHECKSUM", "on"),
            ("FERROCOLL_SINGLE_COPY_BYTES", "0"),
            ("FERROCOLL_EAGER_BYTES", "0"),
            ("FERROCOLL_SOCKET_BUFFER", "65536"),
            ("FERROCOLL_TCP_STREAMS", "3"),
            ("FERROCOLL_SOCKET_IFNAME", "lo"),
        ])
        .unwrap();
        assert_eq!(c.spin, Some(Duration::from_micros(50)));
        assert!(c.checksums);
        assert_eq!(c.single_copy_bytes, usize::MAX);
        assert_eq!(c.eager_bytes, usize::MAX);
        assert_eq!(c.socket_buffer, 65536);
        assert_eq!(c.tcp_streams, 3);
        assert_eq!(c.socket_ifname.as_deref(), Some("lo"));
        // Empty (or blank) values are unset.
        let c = from(&[
            ("FERROCOLL_SPIN_US", ""),
            ("FERROCOLL_CHECKSUM", " "),
            ("FERROCOLL_SOCKET_IFNAME", ""),
            ("FERROCOLL_TCP_STREAMS", " "),
        ])
        .unwrap();
        assert_eq!(c, TransportConfig::default());
    }

    #[test]
    fn unusable_values_are_errors_naming_the_knob() {
        for (var, value) in [
            ("FERROCOLL_SPIN_US", "soon"),
            ("FERROCOLL_SPIN_US", "-1"),
            ("FERROCOLL_SPIN_US", "18446744073709551615"),
            ("FERROCOLL_CHECKSUM", "maybe"),
            ("FERROCOLL_SINGLE_COPY_BYTES", "64K"),
            ("FERROCOLL_EAGER_BYTES", "-1"),
            ("FERROCOLL_SOCKET_BUFFER", "-1"),
            ("FERROCOLL_SOCKET_BUFFER", "4294967296"),
            ("FERROCOLL_SOCKET_IFNAME", "a very long interface name"),
            ("FERROCOLL_SOCKET_IFNAME", "eth/0"),
        ] {
            match from(&[(var, value)]) {
                Err(crate::Error::Config { var: v, .. }) => assert_eq!(v, var, "{value}"),
                other => panic!("{var}={value}: {other:?}"),
            }
        }
    }

    #[test]
    fn bad_stream_count_is_an_error_naming_the_knob() {
        for bad in ["0", "17", "two"] {
            let err = from(&[("FERROCOLL_TCP_STREAMS", bad)]).unwrap_err();
            let text = err.to_string();
            assert!(text.contains("FERROCOLL_TCP_STREAMS"), "{text}");
            assert!(text.contains("from 1 to 16"), "{text}");
        }
    }
}
