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
//!    the nodes give the communicator's [`Topology`] (`FERROCOLL_TOPO` or
//!    `FERROCOLL_TOPO_FILE` override it).
//! 4. `FERROCOLL_TRANSPORT` picks the links: `auto` (default) uses shared
//!    memory between ranks of a node and TCP between nodes; `shm` insists on
//!    shared memory (every rank on one host); `tcp` uses TCP everywhere.
//! 5. Rank 0's cost-model profile is handed to every rank, so every rank's
//!    `auto` choice agrees even when hosts hold different calibration files.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::node::{bind_to_core, setup_shm};
pub use super::placement::host_identity;
use super::placement::Placement;
use super::rendezvous::Rendezvous;
use super::settings::LaunchSettings;
use super::store::{StoreClient, StoreServer};
use super::world::{Launcher, WorldSpec};
use crate::comm::Communicator;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::topo::Topology;
use crate::transport::channel::{Channel, Doorbell};
use crate::transport::config::TransportConfig;
use crate::transport::engine::{Engine, LocalBell};
use crate::transport::fastpath::{FastPath, FastTransport, Mailboxes};
use crate::transport::tcp::TcpConnector;

/// Default slice size (see [`Config::slice_bytes`]) when TCP links are used.
pub const TCP_SLICE_BYTES: usize = 512 << 10;

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

/// The topology the nodes imply: `nodes x per_node` when nodes are equal
/// blocks of consecutive ranks, else flat.
fn topology_of(node_of: &[usize]) -> Topology {
    let n = node_of.len();
    let nodes = node_of.iter().max().map_or(1, |m| m + 1);
    if nodes > 1 && n % nodes == 0 {
        let per = n / nodes;
        if node_of.iter().enumerate().all(|(r, &node)| node == r / per) {
            return Topology::new(vec![nodes, per]).expect("sizes are positive");
        }
    }
    Topology::flat(n)
}

pub(super) fn store_error(e: Error, what: &str) -> Error {
    match e {
        Error::Config { var, value, reason } => Error::Config {
            var,
            value,
            reason: format!("{reason} (during {what})"),
        },
        other => other,
    }
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

/// Waits for `keys`, the key of each rank of `ranks` in turn; a wait that
/// fails while some are still missing is an [`Error::Startup`] that says
/// which ranks did not arrive within how long and what to check, not a
/// blame on `FERROCOLL_TIMEOUT`. `me` is this rank and the world's size;
/// `what` the step of the start-up; `timeout` the configured deadline.
fn wait_for_ranks(
    store: &mut dyn Rendezvous,
    keys: &[String],
    ranks: &[usize],
    me: (usize, usize),
    what: &str,
    timeout: Duration,
) -> Result<Vec<Vec<u8>>> {
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let start = Instant::now();
    store
        .wait(&refs)
        .map_err(|e| not_arrived(store, e, keys, ranks, me, what, timeout, start.elapsed()))
}

/// The error for a start-up wait that failed after `waited`: an
/// [`Error::Startup`] naming the ranks of `ranks` whose `keys` the store
/// says are still missing, or the store's own error when it cannot tell
/// (then nothing is missing, or the store is gone).
#[allow(clippy::too_many_arguments)]
fn not_arrived(
    store: &mut dyn Rendezvous,
    err: Error,
    keys: &[String],
    ranks: &[usize],
    me: (usize, usize),
    what: &str,
    timeout: Duration,
    waited: Duration,
) -> Error {
    if let Error::Startup(_) = err {
        // Rank 0's verdict, through the store: it names the missing ranks.
        return err;
    }
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let missing: Vec<usize> = match store.missing(&refs) {
        Some(idx) if !idx.is_empty() => idx.iter().filter_map(|&i| ranks.get(i).copied()).collect(),
        _ => return store_error(err, what),
    };
    let (rank, size) = me;
    let who = match missing.as_slice() {
        [one] => format!("rank {one}"),
        many => format!("ranks {}", rank_list(many)),
    };
    Error::Startup(format!(
        "rank {rank} of {size}: {who} did not arrive at the rendezvous within {:.1} s (store at \
         {}, {what}); check that every rank was started and is still running (a rank that \
         failed before init printed why), and that all ranks were given the same rendezvous \
         address (FERROCOLL_ADDR, or MASTER_ADDR and MASTER_PORT) and world size ({size}); each \
         start-up step waits FERROCOLL_TIMEOUT, within 1 s and 120 s ({:.1} s here)",
        waited.as_secs_f64(),
        store.describe(),
        connect_timeout(timeout).as_secs_f64(),
    ))
}

/// Ranks for a message: `1, 3, 5-9` (runs of three or more as ranges).
fn rank_list(ranks: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        if j >= i + 2 {
            parts.push(format!("{}-{}", ranks[i], ranks[j]));
        } else {
            parts.extend(ranks[i..=j].iter().map(usize::to_string));
        }
        i = j + 1;
    }
    parts.join(", ")
}

/// How long each start-up step may wait: the configured deadline, within
/// 1 s and 120 s.
fn connect_timeout(timeout: Duration) -> Duration {
    timeout
        .min(Duration::from_secs(120))
        .max(Duration::from_secs(1))
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

/// The start-up after the store is reached: placement, links, profile.
/// `keep` lives as long as the transport (rank 0's store server);
/// `serves_store`: rank 0 serves the store (and so must outlive every
/// rank's start-up).
fn init_over(
    spec: &WorldSpec,
    mut store: Box<dyn Rendezvous>,
    keep: Box<dyn std::any::Any + Send + Sync>,
    serves_store: bool,
    mut config: Config,
    kind: TransportKind,
    settings: &LaunchSettings,
) -> Result<Communicator> {
    let (rank, size) = (spec.rank, spec.size);
    // The transports' knobs, read once here and handed down.
    let transport_config = TransportConfig::from_env()?;
    let connect_timeout = connect_timeout(config.timeout);

    // Who is where.
    let me = settings
        .host_id
        .clone()
        .unwrap_or_else(super::placement::machine_identity);
    store.set(&format!("host/{rank}"), me.as_bytes())?;
    let keys: Vec<String> = (0..size).map(|r| format!("host/{r}")).collect();
    let everyone: Vec<usize> = (0..size).collect();
    let hosts: Vec<String> = wait_for_ranks(
        store.as_mut(),
        &keys,
        &everyone,
        (rank, size),
        "exchanging host identities",
        config.timeout,
    )?
    .into_iter()
    .map(|b| String::from_utf8_lossy(&b).into_owned())
    .collect();
    let mut node_names: Vec<&str> = Vec::new();
    let node_of: Vec<usize> = hosts
        .iter()
        .map(|h| {
            node_names.iter().position(|n| n == h).unwrap_or_else(|| {
                node_names.push(h);
                node_names.len() - 1
            })
        })
        .collect();
    let my_node = node_of[rank];
    let locals: Vec<usize> = (0..size).filter(|&r| node_of[r] == my_node).collect();
    let local_rank = locals
        .iter()
        .position(|&r| r == rank)
        .expect("this rank is on its node");
    let dedicated_core = bind_to_core(local_rank, locals.len(), settings.bind)?;

    let use_shm = |peer: usize| match kind {
        TransportKind::Tcp => false,
        TransportKind::Auto | TransportKind::Shm => node_of[peer] == my_node,
    };
    if kind == TransportKind::Shm && node_names.len() > 1 {
        let elsewhere: Vec<usize> = (0..size).filter(|&r| node_of[r] != node_of[0]).collect();
        return Err(Error::Config {
            var: "FERROCOLL_TRANSPORT".into(),
            value: "shm".into(),
            reason: format!(
                "shared memory needs every rank on one host, but ranks {elsewhere:?} are on other \
                 hosts than rank 0; use auto (shm within a host, tcp between) or tcp"
            ),
        });
    }
    let links: Vec<&'static str> = (0..size)
        .map(|p| {
            if p == rank {
                "self"
            } else if use_shm(p) {
                "shm"
            } else {
                "tcp"
            }
        })
        .collect();

    // TCP between the pairs that need it.
    let wanted: Vec<bool> = (0..size).map(|p| p != rank && !use_shm(p)).collect();
    // The relation must be symmetric: it is, as it depends on nodes only.
    // TCP connections are opened when first used (TcpConnector); the
    // listening addresses are exchanged now.
    let lazy: Vec<usize> = (0..size).filter(|&p| wanted[p]).collect();
    let mut channels: Vec<Option<Box<dyn Channel>>> = (0..size).map(|_| None).collect();
    let connector = if lazy.is_empty() {
        None
    } else {
        let mut c = TcpConnector::listen(
            rank,
            &spec.store_addr,
            &spec.secret,
            connect_timeout,
            &transport_config,
        )?;
        store.set(
            &format!("tcp/addr/{rank}"),
            c.address().to_string().as_bytes(),
        )?;
        // Only lower ranks are connected to (the higher rank of a pair
        // connects), so only their addresses are needed.
        let lower: Vec<usize> = lazy.iter().copied().filter(|&p| p < rank).collect();
        let keys: Vec<String> = lower.iter().map(|p| format!("tcp/addr/{p}")).collect();
        let addrs = wait_for_ranks(
            store.as_mut(),
            &keys,
            &lower,
            (rank, size),
            "exchanging TCP addresses",
            config.timeout,
        )?;
        for (&peer, value) in lower.iter().zip(addrs) {
            let text = String::from_utf8_lossy(&value).into_owned();
            let addr = text
                .parse()
                .map_err(|_| Error::Internal(format!("bad address {text:?} in the store")))?;
            c.add_peer(peer, addr);
        }
        Some(c)
    };

    // Shared memory among the ranks of this node.
    let shm_locals: Vec<usize> = locals
        .iter()
        .copied()
        .filter(|&p| p == rank || use_shm(p))
        .collect();
    let mut bell: Arc<dyn Doorbell> = Arc::new(LocalBell::new());
    let mut fast = None;
    if shm_locals.len() > 1 {
        let (node, fast_ok) = setup_shm(
            spec,
            store.as_mut(),
            &shm_locals,
            config.debug,
            my_node,
            &transport_config,
            settings,
        )?;
        for (lp, &peer) in shm_locals.iter().enumerate() {
            if peer != rank {
                channels[peer] = Some(node.channel(lp));
            }
        }
        bell = node.doorbell();
        if fast_ok {
            fast = Mailboxes::of(&node).map(|boxes| FastPath::new(boxes, shm_locals.clone(), size));
        }
    }

    // Every rank predicts with rank 0's profile, so auto choices agree.
    let transport_name = match kind {
        TransportKind::Tcp => "tcp",
        _ if node_names.len() == 1 => "shm",
        _ => "tcp",
    };
    if rank == 0 {
        let profile = config.profile.clone().unwrap_or_else(|| {
            crate::cost::Profile::default_path(transport_name)
                .and_then(|p| crate::cost::Profile::load(&p).ok())
                .unwrap_or_else(crate::cost::Profile::thread_default)
        });
        let json = serde_json::to_vec(&profile).map_err(|e| Error::Internal(e.to_string()))?;
        store.set("profile", &json)?;
    }
    let json = wait_for_ranks(
        store.as_mut(),
        &["profile".to_string()],
        &[0],
        (rank, size),
        "sharing rank 0's cost-model profile",
        config.timeout,
    )?
    .remove(0);
    config.profile = Some(
        serde_json::from_slice(&json)
            .map_err(|e| Error::Internal(format!("profile from rank 0: {e}")))?,
    );

    // The topology: FERROCOLL_TOPO (in `config`), else FERROCOLL_TOPO_FILE,
    // else what the hosts imply. One given by a variable must fit the
    // world.
    let given = if config.topology.is_some() {
        config.topology.clone().map(|t| ("FERROCOLL_TOPO", t))
    } else {
        settings
            .topo_file
            .clone()
            .map(|t| ("FERROCOLL_TOPO_FILE", t))
    };
    if let Some((var, topo)) = given {
        topo.check_size(size).map_err(|e| {
            crate::env::bad(
                var,
                &topo.to_string(),
                format!("{} (this job has {size} ranks)", crate::env::reason(e)),
            )
        })?;
        config.topology = Some(topo);
    }
    if config.topology.is_none() {
        config.topology = Some(topology_of(&node_of));
    }
    // Over TCP, slices of 512 KiB pipeline better than the thread
    // transport's 2 MiB (bench/RESULTS.md); an explicit setting wins.
    let slice_set = settings.slice_set;
    if links.contains(&"tcp")
        && !slice_set
        && config.slice_bytes == crate::config::DEFAULT_SLICE_BYTES
    {
        config.slice_bytes = TCP_SLICE_BYTES;
    }

    // Everyone is connected before anyone sends. Each rank also leaves a
    // key of its own, read only if the barrier fails, to say which ranks
    // never got this far (the barrier itself costs a rank two requests,
    // whatever the world's size).
    store.set(&format!("init/ready/{rank}"), b"1")?;
    let start = Instant::now();
    if let Err(e) = store.barrier("init/connected", size) {
        let keys: Vec<String> = (0..size).map(|r| format!("init/ready/{r}")).collect();
        return Err(not_arrived(
            store.as_mut(),
            e,
            &keys,
            &everyone,
            (rank, size),
            "the start-up barrier, after connecting",
            config.timeout,
            start.elapsed(),
        ));
    }
    // When rank 0 serves the store, it must not take it down (by finishing
    // its work and exiting) before every rank has read the barrier's
    // answer: each other rank says it is through, and rank 0 waits for the
    // last. The last rank's `set` may meet a store already gone, so the
    // others ignore errors here: they are done with the store.
    if serves_store && size > 1 {
        if rank == 0 {
            // A rank that died just now never reports: then, after the
            // store's deadline, carry on as before (its peers will find it
            // gone at their first call).
            let _ = store.wait(&["init/through/done"]);
        } else if store.add("init/through", 1).ok() == Some(size as i64 - 1) {
            let _ = store.set("init/through/done", b"1");
        }
    }
    drop(store);

    let placement = Placement {
        launcher: spec.launcher,
        hosts,
        node_of,
        links,
        store_addr: spec.store_addr.clone(),
    };
    let name = match (
        placement.links.contains(&"shm"),
        placement.links.contains(&"tcp"),
    ) {
        (true, true) => "shm+tcp",
        (false, true) => "tcp",
        _ => "shm",
    };
    let channels: Vec<Option<Box<dyn Channel>>> = channels;
    let mut engine =
        Engine::new(rank, channels, bell, name, transport_config).dedicated_core(dedicated_core);
    if let Some(connector) = connector {
        engine = engine.with_connector(connector, &lazy);
    }
    let engine = engine.keep_alive(keep);
    let transport: Arc<dyn crate::transport::Transport> = match fast {
        Some(fast) => Arc::new(FastTransport::new(engine, fast)),
        None => Arc::new(engine),
    };
    Communicator::with_placement(transport, config, placement)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launch::node::ring_bytes;
    use crate::ReduceOp;

    /// `n` ranks as threads, each with its own engine (TCP or shared memory)
    /// as if they were processes.
    fn world<R: Send>(
        n: usize,
        kind: TransportKind,
        f: impl Fn(Communicator) -> R + Sync,
    ) -> Vec<R> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let job = format!("t{}x{port}", std::process::id());
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..n)
                .map(|rank| {
                    let spec = WorldSpec {
                        rank,
                        size: n,
                        local_rank: None,
                        local_size: None,
                        store_addr: format!("127.0.0.1:{port}"),
                        secret: "s3cret".into(),
                        job_id: job.clone(),
                        launcher: Launcher::Ferrocoll,
                    };
                    let f = &f;
                    s.spawn(move || {
                        let config = Config::default().with_timeout(Duration::from_secs(20));
                        f(init_as(&spec, config, kind).unwrap())
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    fn allreduce_sizes(kind: TransportKind) {
        for n in [1, 2, 3, 4] {
            let out = world(n, kind, |comm| {
                let mut sums = Vec::new();
                for count in [0usize, 1, 7, 1000, 300_000, 1 << 21] {
                    let mine: Vec<f64> =
                        (0..count).map(|i| (i % 97 + comm.rank()) as f64).collect();
                    let mut out = vec![0.0; count];
                    comm.all_reduce(&mine, &mut out, ReduceOp::Sum).unwrap();
                    let nn = comm.size();
                    let ok = out
                        .iter()
                        .enumerate()
                        .all(|(i, v)| *v == (nn * (i % 97) + nn * (nn - 1) / 2) as f64);
                    sums.push(ok);
                }
                sums
            });
            for (rank, oks) in out.iter().enumerate() {
                assert!(oks.iter().all(|o| *o), "n={n} rank {rank}: {oks:?}");
            }
        }
    }

    #[test]
    fn allreduce_over_tcp_between_threads() {
        allreduce_sizes(TransportKind::Tcp);
    }

    #[test]
    fn allreduce_over_shm_between_threads() {
        allreduce_sizes(TransportKind::Shm);
    }

    /// A store shared by threads: what a framework's store looks like to
    /// `init_with_rendezvous`.
    type Entries = std::sync::Mutex<std::collections::HashMap<String, Vec<u8>>>;
    #[derive(Clone, Default)]
    struct SharedMap(Arc<(Entries, std::sync::Condvar)>);

    impl Rendezvous for SharedMap {
        fn set(&mut self, key: &str, value: &[u8]) -> Result<()> {
            let (map, cv) = &*self.0;
            map.lock().unwrap().insert(key.into(), value.into());
            cv.notify_all();
            Ok(())
        }
        fn wait(&mut self, keys: &[&str]) -> Result<Vec<Vec<u8>>> {
            let (map, cv) = &*self.0;
            let mut m = map.lock().unwrap();
            loop {
                if keys.iter().all(|k| m.contains_key(*k)) {
                    return Ok(keys.iter().map(|k| m[*k].clone()).collect());
                }
                let (next, timeout) = cv.wait_timeout(m, Duration::from_secs(20)).unwrap();
                if timeout.timed_out() {
                    return Err(Error::invalid(format!("{keys:?} never set")));
                }
                m = next;
            }
        }
        fn add(&mut self, key: &str, delta: i64) -> Result<i64> {
            let (map, cv) = &*self.0;
            let mut m = map.lock().unwrap();
            let now = m
                .get(key)
                .map_or(0, |v| String::from_utf8_lossy(v).parse::<i64>().unwrap())
                + delta;
            m.insert(key.into(), now.to_string().into_bytes());
            cv.notify_all();
            Ok(now)
        }
        fn describe(&self) -> String {
            "a map shared by threads".into()
        }
    }

    #[test]
    fn a_world_over_a_store_the_caller_hands_in() {
        for kind in [TransportKind::Shm, TransportKind::Tcp] {
            let store = SharedMap::default();
            let out: Vec<(f32, &'static str)> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..3)
                    .map(|rank| {
                        let store = store.clone();
                        s.spawn(move || {
                            let config = Config::default().with_timeout(Duration::from_secs(20));
                            let comm = init_with_rendezvous(
                                rank,
                                3,
                                Box::new(store),
                                Some("127.0.0.1:1"),
                                config,
                                kind,
                            )
                            .unwrap();
                            let mut v = vec![comm.rank() as f32 + 1.0; 1000];
                            comm.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
                            let launcher = comm.placement().unwrap().launcher.name();
                            (v[999], launcher)
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            assert_eq!(out, vec![(6.0, "caller"); 3], "{kind:?}");
        }
        let bad = init_with_rendezvous(
            3,
            3,
            Box::new(SharedMap::default()),
            None,
            Config::default(),
            TransportKind::Tcp,
        )
        .unwrap_err()
        .to_string();
        assert!(bad.contains("below the size"), "{bad}");
    }

    #[test]
    fn ring_sizes_fit_the_budget() {
        assert_eq!(ring_bytes(2, None), 4 << 20);
        assert_eq!(ring_bytes(4, None), 2 << 20);
        assert_eq!(ring_bytes(8, None), 512 << 10);
        assert_eq!(ring_bytes(64, None), 64 << 10);
        assert_eq!(ring_bytes(64, Some(1 << 20)), 1 << 20);
        assert_eq!(rank_list(&[1, 3, 4, 5, 6, 9, 10]), "1, 3-6, 9, 10");
    }

    #[test]
    fn nodes_of_equal_blocks_give_a_two_level_topology() {
        assert_eq!(topology_of(&[0, 0, 1, 1]).levels(), &[2, 2]);
        assert_eq!(topology_of(&[0, 1, 0, 1]).levels(), &[4]);
        assert_eq!(topology_of(&[0, 0, 0]).levels(), &[3]);
        assert_eq!(topology_of(&[0, 0, 0, 1]).levels(), &[4]);
    }
}
