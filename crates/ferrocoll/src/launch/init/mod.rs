//! Multi-process start-up: [`init`] builds the world communicator of a job
//! whose ranks are processes, on one host or many.
//!
//! 1. [`WorldSpec::from_env`] reads which rank this is and where the
//!    rendezvous store is, from the variables of `ferrocoll run`, torchrun,
//!    Open MPI, Slurm or PMI.
//! 2. Rank 0 serves the store ([`crate::store`]); every rank connects with
//!    the job secret.
//! 3. Ranks publish their host identity (host name plus boot id, or
//!    `FERROCOLL_HOST_ID`); ranks with the same identity form a node, and
//!    the nodes give the communicator's [`Topology`](crate::Topology) (`FERROCOLL_TOPO` or
//!    `FERROCOLL_TOPO_FILE` override it).
//! 4. `FERROCOLL_TRANSPORT` picks the links: `auto` (default) uses shared
//!    memory between ranks of a node and TCP between nodes; `shm` insists on
//!    shared memory (every rank on one host); `tcp` uses TCP everywhere.
//! 5. Rank 0's cost-model profile is handed to every rank, so every rank's
//!    `auto` choice agrees even when hosts hold different calibration files.
//!
//! # Layout
//!
//! - `mod.rs`: the entry points ([`init`], [`init_with`], [`init_as`],
//!   [`init_with_rendezvous`]), [`check_vars`], rank 0's store;
//! - `kind.rs`: [`TransportKind`] (`FERROCOLL_TRANSPORT`);
//! - `startup.rs`: the steps once the store is reached, in order, from the
//!   hosts to the engine;
//! - `hosts.rs`: who is where (host identities, nodes) and the topology
//!   the nodes imply;
//! - `links.rs`: the link to each peer, and the TCP and shared-memory
//!   sides of them;
//! - `tests.rs`: worlds of threads over each transport.
//!
//! The waits on the store and the errors naming ranks that never arrived
//! are in `launch/waits.rs`, shared with one host's shared-memory set-up
//! (`launch/node.rs`).

mod hosts;
mod kind;
mod links;
mod startup;
#[cfg(test)]
pub(crate) mod tests;

use std::sync::Arc;
use std::time::Duration;

pub use super::placement::host_identity;
use super::rendezvous::Rendezvous;
use super::settings::LaunchSettings;
use super::store::{StoreClient, StoreServer};
use super::waits::{connect_timeout, wait_for_ranks};
use super::world::{Launcher, WorldSpec};
use crate::comm::Communicator;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::transport::config::TransportConfig;
pub use kind::TransportKind;
use startup::init_over;
pub use startup::TCP_SLICE_BYTES;

/// Checks every variable the library reads (the configuration, the
/// transports' knobs, the start-up's own and `FERROCOLL_TRANSPORT`) as
/// [`init`] and [`crate::local::run`] would, reading them through `get`,
/// without starting anything: the [`Error::Config`] `init` would fail with,
/// naming the variable and what it accepts. The launcher's variables are
/// [`WorldSpec::from_vars`]'s to check.
///
/// ```
/// let vars = |name: &str| (name == "FERROCOLL_TIMEOUT").then(|| "1e300".to_string());
/// let err = ferrocoll::init::check_vars(&vars).unwrap_err().to_string();
/// assert!(err.contains("FERROCOLL_TIMEOUT"), "{err}");
/// ```
pub fn check_vars(get: &dyn Fn(&str) -> Option<String>) -> Result<()> {
    Config::from_vars(get)?;
    TransportConfig::from_lookup(get)?;
    TransportKind::from_vars(get)?;
    LaunchSettings::from_vars(get)?;
    crate::moe::check_env(get)?;
    Ok(())
}

/// Builds the world communicator from the environment (see the module
/// documentation), with the configuration of [`Config::from_env`].
///
/// ```no_run
/// // Run with `ferrocoll run -n 4 ./my_program`, torchrun, mpirun or srun.
/// let comm = ferrocoll::init().unwrap();
/// let mut v = vec![comm.rank() as f32; 4];
/// comm.all_reduce_in_place(&mut v, ferrocoll::ReduceOp::Sum).unwrap();
/// ```
pub fn init() -> Result<Communicator> {
    init_with(&WorldSpec::from_env()?, Config::from_env()?)
}

/// [`init`] for a given world and configuration.
pub fn init_with(spec: &WorldSpec, config: Config) -> Result<Communicator> {
    init_as(spec, config, TransportKind::from_env()?)
}

/// [`init_with`] with the links chosen by the caller instead of
/// `FERROCOLL_TRANSPORT`.
pub fn init_as(spec: &WorldSpec, config: Config, kind: TransportKind) -> Result<Communicator> {
    let rank = spec.rank;
    let connect_timeout = connect_timeout(config.timeout);

    // Every knob is read (and a bad one reported) before the network is
    // touched.
    let settings = LaunchSettings::from_env()?;
    TransportConfig::from_env()?;

    // Rank 0 serves the store on the address every rank was given (or on
    // FERROCOLL_STORE_BIND), unless a separate `ferrocoll store` serves it
    // (FERROCOLL_STORE=external).
    let external = settings.external_store;
    let server = if rank == 0 && !external {
        Some(Arc::new(start_store(spec, &settings)?))
    } else {
        None
    };
    let mut store = StoreClient::connect(&spec.store_addr, &spec.secret, connect_timeout)?;
    store.set_timeout(connect_timeout);
    let result = init_over(
        spec,
        Box::new(store),
        Box::new(server.clone()),
        !external,
        config,
        kind,
        &settings,
    );
    if let (Err(Error::Startup(why)), Some(server)) = (&result, &server) {
        // Rank 0 gave up: tell the ranks still waiting why (it names the
        // ranks that did not arrive), rather than vanishing under them,
        // which they would report as a lost store.
        server.fail_waits(why);
        std::thread::sleep(STARTUP_VERDICT_GRACE);
    }
    result
}

/// How long rank 0 keeps the store up after its start-up failed, so the
/// ranks still waiting get its verdict.
const STARTUP_VERDICT_GRACE: Duration = Duration::from_millis(200);

/// Rank 0's store, listening on `FERROCOLL_STORE_BIND` when set, else on
/// the rendezvous address itself (so `127.0.0.1:29500` is reachable from
/// this host only; a wildcard such as `0.0.0.0:29500` listens on every
/// interface).
fn start_store(spec: &WorldSpec, settings: &LaunchSettings) -> Result<StoreServer> {
    let (var, addr) = match &settings.store_bind {
        Some(bind) => ("FERROCOLL_STORE_BIND", bind.as_str()),
        None => ("FERROCOLL_ADDR", spec.store_addr.as_str()),
    };
    StoreServer::start(addr, &spec.secret).map_err(|e| match e {
        Error::Config { value, reason, .. } => Error::Config {
            var: var.into(),
            value,
            reason: if var == "FERROCOLL_ADDR" && reason.contains("not an address of this host") {
                let port = addr.rsplit(':').next().unwrap_or("29500");
                format!(
                    "{reason}; if other hosts reach this one by that name but it is no \
                     address of this host (NAT, a DNS alias), set \
                     FERROCOLL_STORE_BIND=0.0.0.0:{port} on rank 0 to listen on every interface"
                )
            } else {
                format!("{reason} (starting the rendezvous store on rank 0)")
            },
        },
        other => other,
    })
}

/// Builds the world communicator of `size` ranks over a rendezvous store
/// the caller already has (see [`crate::rendezvous`]): `torch.distributed`'s
/// store, for one, so that a backend needs no port of its own. Every rank
/// calls it with its `rank`, the same `size` and a store they all reach.
///
/// Rank 0 draws a job identifier and a secret and publishes them in the
/// store (the store is trusted; the secret keeps strays off the TCP links).
/// `route_to` (`host:port`, typically the store's address) picks the
/// interface TCP listens on unless `FERROCOLL_SOCKET_IFNAME` names one;
/// without it the loopback interface is used, which serves one host only.
pub fn init_with_rendezvous(
    rank: usize,
    size: usize,
    mut store: Box<dyn Rendezvous>,
    route_to: Option<&str>,
    config: Config,
    kind: TransportKind,
) -> Result<Communicator> {
    if size == 0 || rank >= size {
        return Err(Error::invalid(format!(
            "init_with_rendezvous: rank {rank} of a world of {size}: the rank must be below the \
             size"
        )));
    }
    let settings = LaunchSettings::from_env()?;
    TransportConfig::from_env()?;
    if rank == 0 {
        let job = format!("s{:016x}", random_u64());
        let secret = format!("{:016x}{:016x}", random_u64(), random_u64());
        store.set("ferrocoll/job", format!("{job} {secret}").as_bytes())?;
    }
    let job = wait_for_ranks(
        store.as_mut(),
        &["ferrocoll/job".to_string()],
        &[0],
        (rank, size),
        "learning the job identifier from rank 0",
        config.timeout,
    )?
    .remove(0);
    let job = String::from_utf8_lossy(&job).into_owned();
    let (job_id, secret) = job
        .split_once(' ')
        .ok_or_else(|| Error::Internal(format!("bad job entry {job:?} in the store")))?;
    let spec = WorldSpec {
        rank,
        size,
        local_rank: None,
        local_size: None,
        store_addr: route_to.unwrap_or("127.0.0.1:1").to_string(),
        secret: secret.to_string(),
        job_id: job_id.to_string(),
        launcher: Launcher::Caller,
    };
    init_over(&spec, store, Box::new(()), false, config, kind, &settings)
}

/// 64 bits that differ between processes and calls (not cryptographic:
/// the store that carries them is trusted).
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    h.finish()
}
