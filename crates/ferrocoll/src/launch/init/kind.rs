//! [`TransportKind`]: which links a multi-process job uses, from
//! `FERROCOLL_TRANSPORT`.

use crate::error::Result;

/// Which links a multi-process job uses (`FERROCOLL_TRANSPORT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransportKind {
    /// Shared memory within a node, TCP between nodes.
    Auto,
    /// Shared memory only: every rank must be on one host.
    Shm,
    /// TCP between every pair of ranks, even on one host.
    Tcp,
}

impl TransportKind {
    /// Reads `FERROCOLL_TRANSPORT` (unset or empty: `auto`).
    pub fn from_env() -> Result<TransportKind> {
        TransportKind::from_vars(&crate::env::process)
    }

    /// [`TransportKind::from_env`] reading variables through `get`.
    pub fn from_vars(get: &dyn Fn(&str) -> Option<String>) -> Result<TransportKind> {
        let Some(v) = crate::env::get(get, "FERROCOLL_TRANSPORT") else {
            return Ok(TransportKind::Auto);
        };
        if v.eq_ignore_ascii_case("thread") {
            return Err(crate::env::bad(
                "FERROCOLL_TRANSPORT",
                &v,
                "`thread` is for in-process ranks (ferrocoll::local, `ferrocoll bench \
                 --transport thread`); between processes use auto, shm or tcp",
            ));
        }
        crate::env::choice(
            "FERROCOLL_TRANSPORT",
            &v,
            &[
                (
                    "auto",
                    "shared memory within a host, TCP between hosts",
                    TransportKind::Auto,
                ),
                (
                    "shm",
                    "shared memory only, every rank on one host",
                    TransportKind::Shm,
                ),
                ("tcp", "TCP everywhere", TransportKind::Tcp),
            ],
        )
    }
}
