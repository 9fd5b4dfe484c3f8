//! The transports' environment knobs, read once.
//!
//! `launch::init` builds a [`TransportConfig`] with [`TransportConfig::from_env`]
//! and hands it to the engine, the TCP connector and the shared-memory
//! set-up; the transports themselves never read the environment, so a test
//! (or an embedder) can build one by hand and two communicators of one
//! process can differ.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Error, Result};

/// Kernel socket buffer size asked for by default (the kernel may cap it).
const SOCKET_BUFFER: libc::c_int = 4 << 20;

/// Streams per peer unless `FERROCOLL_TCP_STREAMS` says otherwise.
const DEFAULT_STREAMS: usize = 1;

/// Messages at least this long go by the single-copy path when the channel
/// has one, by default.
const SINGLE_COPY_BYTES: usize = 64 << 10;

/// What the process transports read from the environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TransportConfig {
    /// `FERROCOLL_SPIN_US`: how long a waiting call polls before it sleeps,
    /// overriding the engine's choice (by whether the rank has a core of
    /// its own). Unparsable values are ignored, as they always were.
    pub spin: Option<Duration>,
    /// `FERROCOLL_CHECKSUM=1` (or `on`, `true`): data frames carry a
    /// CRC32C, and the small-call fast path is off.
    pub checksums: bool,
    /// `FERROCOLL_SINGLE_COPY_BYTES`: messages at least this long go by the
    /// single-copy path when the channel has one (`usize::MAX`: never; the
    /// variable's 0 turns it off).
    pub single_copy_bytes: usize,
    /// `FERROCOLL_SOCKET_BUFFER`: the kernel socket buffer size asked for
    /// on every TCP stream (0 or less: the kernel's default).
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
            socket_buffer: SOCKET_BUFFER,
            tcp_streams: DEFAULT_STREAMS,
            socket_ifname: None,
            blame_file: None,
            #[cfg(feature = "fault-injection")]
            flip_frame: None,
        }
    }
}

impl TransportConfig {
    /// Reads the knobs from the environment; unset ones keep their
    /// defaults. Fails (with [`Error::Config`]) only for a
    /// `FERROCOLL_TCP_STREAMS` outside 1 to 16, the one knob that was ever
    /// checked; the others ignore values they cannot parse, as before.
    pub(crate) fn from_env() -> Result<TransportConfig> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// [`TransportConfig::from_env`] over any source of variables (tests).
    pub(crate) fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<TransportConfig> {
        let d = TransportConfig::default();
        let tcp_streams = match var("FERROCOLL_TCP_STREAMS") {
            Some(v) if !v.trim().is_empty() => v
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|k| (1..=16).contains(k))
                .ok_or_else(|| Error::Config {
                    var: "FERROCOLL_TCP_STREAMS".into(),
                    value: v.clone(),
                    reason: "give a number of TCP connections per peer from 1 to 16".into(),
                })?,
            _ => d.tcp_streams,
        };
        Ok(TransportConfig {
            spin: var("FERROCOLL_SPIN_US")
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_micros),
            checksums: var("FERROCOLL_CHECKSUM")
                .is_some_and(|v| matches!(v.trim(), "1" | "on" | "true")),
            single_copy_bytes: var("FERROCOLL_SINGLE_COPY_BYTES")
                .and_then(|v| v.trim().parse::<usize>().ok())
                .map_or(d.single_copy_bytes, |b| if b == 0 { usize::MAX } else { b }),
            socket_buffer: var("FERROCOLL_SOCKET_BUFFER")
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(d.socket_buffer),
            tcp_streams,
            socket_ifname: var("FERROCOLL_SOCKET_IFNAME").filter(|s| !s.is_empty()),
            blame_file: var("FERROCOLL_BLAME_FILE")
                .filter(|s| !s.is_empty())
                .map(PathBuf::from),
            #[cfg(feature = "fault-injection")]
            flip_frame: var("FERROCOLL_TEST_FLIP_FRAME").and_then(|v| v.trim().parse().ok()),
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
    fn knobs_are_read_as_before() {
        let c = from(&[
            ("FERROCOLL_SPIN_US", " 50 "),
            ("FERROCOLL_CHECKSUM", "on"),
            ("FERROCOLL_SINGLE_COPY_BYTES", "0"),
            ("FERROCOLL_SOCKET_BUFFER", "65536"),
            ("FERROCOLL_TCP_STREAMS", "3"),
            ("FERROCOLL_SOCKET_IFNAME", "lo"),
        ])
        .unwrap();
        assert_eq!(c.spin, Some(Duration::from_micros(50)));
        assert!(c.checksums);
        assert_eq!(c.single_copy_bytes, usize::MAX);
        assert_eq!(c.socket_buffer, 65536);
        assert_eq!(c.tcp_streams, 3);
        assert_eq!(c.socket_ifname.as_deref(), Some("lo"));
        // Unparsable values are ignored, an empty interface is none.
        let c = from(&[
            ("FERROCOLL_SPIN_US", "soon"),
            ("FERROCOLL_CHECKSUM", "yes"),
            ("FERROCOLL_SOCKET_IFNAME", ""),
            ("FERROCOLL_TCP_STREAMS", " "),
        ])
        .unwrap();
        assert_eq!(c, TransportConfig::default());
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
