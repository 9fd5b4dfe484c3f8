//! Where the ranks of a job run: hosts, nodes and links, as init found them.

use super::world::Launcher;

/// Where the ranks of a job are, as [`crate::init()`] found them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Which launcher's variables were read.
    pub launcher: Launcher,
    /// Host identity of every rank (host name, plus `#` and the first
    /// characters of the boot id).
    pub hosts: Vec<String>,
    /// Node index of every rank (nodes numbered by their lowest rank).
    pub node_of: Vec<usize>,
    /// How this rank reaches every rank: `self`, `shm` or `tcp`.
    pub links: Vec<&'static str>,
    /// The rendezvous store's address.
    pub store_addr: String,
}

impl Placement {
    /// Number of nodes.
    pub fn nodes(&self) -> usize {
        self.node_of.iter().max().map_or(0, |m| m + 1)
    }
}

/// This host's identity: `FERROCOLL_HOST_ID` if set, else host name and boot
/// id (two containers with the same host name but different kernels differ).
pub fn host_identity() -> String {
    crate::env::get(&crate::env::process, "FERROCOLL_HOST_ID").unwrap_or_else(machine_identity)
}

/// The host name and the first characters of the boot id.
pub(crate) fn machine_identity() -> String {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    let host = read("/proc/sys/kernel/hostname");
    let boot = read("/proc/sys/kernel/random/boot_id");
    format!("{host}#{}", &boot[..boot.len().min(8)])
}
