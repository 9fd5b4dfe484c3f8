//! The start-up's own environment knobs (beyond [`crate::Config`], the
//! transports' [`TransportConfig`](crate::transport::config) and the
//! launcher's variables of [`super::world`]), read once, before anything
//! touches the network: a bad value fails at once, on the rank that has
//! it, rather than after a rendezvous the other ranks then wait on.

use crate::env::{self, Vars};
use crate::error::Result;
use crate::topo::Topology;

/// Smallest ring `FERROCOLL_SHM_RING_BYTES` may set.
pub(crate) const MIN_RING_BYTES: usize = 64 << 10;
/// Largest ring `FERROCOLL_SHM_RING_BYTES` may set: 256 MiB (each host
/// holds local ranks squared rings, in `/dev/shm`: 1 GiB for 2 ranks, 16
/// GiB for 8; the default rings stop at 4 MiB).
pub(crate) const MAX_RING_BYTES: usize = 256 << 20;
/// Longest `FERROCOLL_HOST_ID`.
pub(crate) const MAX_HOST_ID: usize = 255;

/// `FERROCOLL_BIND`: whether to pin this process to a CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BindMode {
    /// Pin when the host's ranks fit one per allowed CPU.
    Auto,
    /// Always pin.
    Core,
    /// Never pin.
    None,
}

/// `FERROCOLL_SHM_SINGLE_COPY`: whether large messages between local ranks
/// are read straight from the sender's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SingleCopy {
    /// When the kernel allows it and the read timed at start-up is not
    /// broken-slow, for the calls it pays for
    /// ([`crate::transport::shm::SingleCopyUse`]).
    Auto,
    /// Every call, whenever the kernel allows it.
    On,
    /// Never.
    Off,
}

/// What start-up reads from the environment besides the launcher's
/// variables, [`crate::Config`] and the transports' knobs.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct LaunchSettings {
    /// `FERROCOLL_STORE=external`: a separate `ferrocoll store` serves the
    /// rendezvous (rank 0 does not).
    pub(crate) external_store: bool,
    /// `FERROCOLL_STORE_BIND`: the address rank 0's store listens on
    /// (`None`: the rendezvous address itself).
    pub(crate) store_bind: Option<String>,
    /// `FERROCOLL_BIND`.
    pub(crate) bind: BindMode,
    /// `FERROCOLL_SHM_FAST` is not `off`.
    pub(crate) shm_fast: bool,
    /// `FERROCOLL_SHM_SINGLE_COPY`.
    pub(crate) single_copy: SingleCopy,
    /// `FERROCOLL_SHM_RING_BYTES` (`None`: sized by the number of local
    /// ranks).
    pub(crate) ring_bytes: Option<usize>,
    /// `FERROCOLL_TOPO_FILE`, read and parsed.
    pub(crate) topo_file: Option<Topology>,
    /// `FERROCOLL_HOST_ID`.
    pub(crate) host_id: Option<String>,
    /// `FERROCOLL_SLICE_BYTES` is set (then TCP keeps its value rather
    /// than switching to its own default).
    pub(crate) slice_set: bool,
}

impl LaunchSettings {
    /// Reads the process environment.
    pub(crate) fn from_env() -> Result<LaunchSettings> {
        LaunchSettings::from_vars(&env::process)
    }

    /// Reads the variables through `vars`.
    pub(crate) fn from_vars(vars: Vars<'_>) -> Result<LaunchSettings> {
        let get = |name| env::get(vars, name);
        let external_store = match get("FERROCOLL_STORE") {
            None => false,
            Some(v) => env::choice(
                "FERROCOLL_STORE",
                &v,
                &[
                    ("rank0", "rank 0 serves the rendezvous", false),
                    ("external", "`ferrocoll store` does", true),
                ],
            )?,
        };
        let store_bind = match get("FERROCOLL_STORE_BIND") {
            None => None,
            Some(v) => Some(super::world::check_addr("FERROCOLL_STORE_BIND", &v)?),
        };
        let bind = match get("FERROCOLL_BIND") {
            None => BindMode::Auto,
            Some(v) => env::choice(
                "FERROCOLL_BIND",
                &v,
                &[
                    (
                        "auto",
                        "pin when the host's ranks fit one per CPU",
                        BindMode::Auto,
                    ),
                    ("core", "always pin", BindMode::Core),
                    ("none", "never pin", BindMode::None),
                ],
            )?,
        };
        let shm_fast = match get("FERROCOLL_SHM_FAST") {
            None => true,
            Some(v) => env::choice(
                "FERROCOLL_SHM_FAST",
                &v,
                &[
                    (
                        "auto",
                        "small collectives through cache-line mailboxes when every rank of a \
                         communicator is on this host",
                        true,
                    ),
                    ("on", "", true),
                    ("1", "", true),
                    ("off", "every call through the rings", false),
                    ("0", "", false),
                ],
            )?,
        };
        let single_copy = match get("FERROCOLL_SHM_SINGLE_COPY") {
            None => SingleCopy::Auto,
            Some(v) => env::choice(
                "FERROCOLL_SHM_SINGLE_COPY",
                &v,
                &[
                    (
                        "auto",
                        "allgather and alltoall (and allreduce and reduce-scatter with more ranks than cores)",
                        SingleCopy::Auto,
                    ),
                    ("on", "whenever the kernel allows", SingleCopy::On),
                    ("1", "", SingleCopy::On),
                    ("off", "never", SingleCopy::Off),
                    ("0", "", SingleCopy::Off),
                ],
            )?,
        };
        let ring_bytes = match get("FERROCOLL_SHM_RING_BYTES") {
            None => None,
            Some(v) => {
                let hint = " (a power of two); unset, the rings of a host take 32 MiB in all";
                let b = env::whole_usize(
                    "FERROCOLL_SHM_RING_BYTES",
                    &v,
                    MIN_RING_BYTES,
                    MAX_RING_BYTES,
                    "bytes",
                    hint,
                )?;
                if !b.is_power_of_two() {
                    return Err(env::bad(
                        "FERROCOLL_SHM_RING_BYTES",
                        &v,
                        format!(
                            "not a power of two; give one from {MIN_RING_BYTES} to \
                             {MAX_RING_BYTES}, e.g. FERROCOLL_SHM_RING_BYTES={}",
                            b.next_power_of_two().min(MAX_RING_BYTES)
                        ),
                    ));
                }
                Some(b)
            }
        };
        let topo_file = match get("FERROCOLL_TOPO_FILE") {
            None => None,
            Some(path) => {
                let text = std::fs::read_to_string(&path).map_err(|e| {
                    env::bad(
                        "FERROCOLL_TOPO_FILE",
                        &path,
                        format!(
                            "cannot read it: {e}; give the path of a file holding level sizes \
                             such as 2x4, or unset it"
                        ),
                    )
                })?;
                let topo = text
                    .trim()
                    .parse::<Topology>()
                    .map_err(|e| env::bad("FERROCOLL_TOPO_FILE", &path, env::reason(e)))?;
                Some(topo)
            }
        };
        let host_id = match get("FERROCOLL_HOST_ID") {
            None => None,
            Some(v) => Some(env::text(
                "FERROCOLL_HOST_ID",
                &v,
                MAX_HOST_ID,
                "host identity",
                "give a plain name shared by the ranks of one host, e.g. FERROCOLL_HOST_ID=node7, \
                 or unset it (host name and boot id)",
            )?),
        };
        Ok(LaunchSettings {
            external_store,
            store_bind,
            bind,
            shm_fast,
            single_copy,
            ring_bytes,
            topo_file,
            host_id,
            slice_set: get("FERROCOLL_SLICE_BYTES").is_some(),
        })
    }
}
