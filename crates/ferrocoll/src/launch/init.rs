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
use std::time::Duration;

use super::node::{bind_to_core, setup_shm};
pub use super::placement::host_identity;
use super::placement::Placement;
use super::rendezvous::Rendezvous;
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
        match std::env::var("FERROCOLL_TRANSPORT")
            .unwrap_or_default()
            .trim()
        {
            "" | "auto" => Ok(TransportKind::Auto),
            "shm" => Ok(TransportKind::Shm),
            "tcp" => Ok(TransportKind::Tcp),
            other => Err(Error::Config {
                var: "FERROCOLL_TRANSPORT".into(),
                value: other.into(),
                reason: "use auto, shm or tcp (`thread` is for in-process ranks: ferrocoll::local)"
                    .into(),
            }),
        }
    }
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
    let connect_timeout = config
        .timeout
        .min(Duration::from_secs(120))
        .max(Duration::from_secs(1));

    // Rank 0 serves the store on the address every rank was given, unless
    // a separate `ferrocoll store` serves it (FERROCOLL_STORE=external).
    let external =
        match std::env::var("FERROCOLL_STORE").unwrap_or_default().trim() {
            "" | "rank0" => false,
            "external" => true,
            other => return Err(Error::Config {
                var: "FERROCOLL_STORE".into(),
                value: other.into(),
                reason:
                    "use rank0 (rank 0 serves the rendezvous) or external (`ferrocoll store` does)"
                        .into(),
            }),
        };
    let server = if rank == 0 && !external {
        let server = match StoreServer::start(&spec.store_addr, &spec.secret) {
            Ok(s) => s,
            Err(_) => {
                // The name may not be a local address (a DNS alias): listen on
                // every interface at its port.
                let port = spec.store_addr.rsplit(':').next().unwrap_or("0");
                StoreServer::start(&format!("0.0.0.0:{port}"), &spec.secret)
                    .map_err(|e| store_error(e, "starting the rendezvous store on rank 0"))?
            }
        };
        Some(server)
    } else {
        None
    };
    let mut store = StoreClient::connect(&spec.store_addr, &spec.secret, connect_timeout)?;
    store.set_timeout(connect_timeout);
    init_over(
        spec,
        Box::new(store),
        Box::new(server),
        !external,
        config,
        kind,
    )
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
    if rank == 0 {
        let job = format!("s{:016x}", random_u64());
        let secret = format!("{:016x}{:016x}", random_u64(), random_u64());
        store.set("ferrocoll/job", format!("{job} {secret}").as_bytes())?;
    }
    let job = store
        .wait(&["ferrocoll/job"])
        .map_err(|e| store_error(e, "learning the job identifier from rank 0"))?
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
    init_over(&spec, store, Box::new(()), false, config, kind)
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
) -> Result<Communicator> {
    let (rank, size) = (spec.rank, spec.size);
    // The transports' knobs, read once here and handed down.
    let transport_config = TransportConfig::from_env()?;
    let connect_timeout = config
        .timeout
        .min(Duration::from_secs(120))
        .max(Duration::from_secs(1));

    // Who is where.
    let me = host_identity();
    store.set(&format!("host/{rank}"), me.as_bytes())?;
    let keys: Vec<String> = (0..size).map(|r| format!("host/{r}")).collect();
    let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let hosts: Vec<String> = store
        .wait(&key_refs)
        .map_err(|e| store_error(e, "exchanging host identities"))?
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
    let dedicated_core = bind_to_core(local_rank, locals.len())?;

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
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let addrs = store
            .wait(&refs)
            .map_err(|e| store_error(e, "exchanging TCP addresses"))?;
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
    let json = store
        .wait(&["profile"])
        .map_err(|e| store_error(e, "sharing the profile"))?
        .remove(0);
    config.profile = Some(
        serde_json::from_slice(&json)
            .map_err(|e| Error::Internal(format!("profile from rank 0: {e}")))?,
    );

    if config.topology.is_none() {
        if let Ok(path) = std::env::var("FERROCOLL_TOPO_FILE") {
            if !path.trim().is_empty() {
                let text = std::fs::read_to_string(path.trim()).map_err(|e| Error::Config {
                    var: "FERROCOLL_TOPO_FILE".into(),
                    value: path.clone(),
                    reason: format!("cannot read it: {e}"),
                })?;
                let topo = text.trim().parse::<Topology>().map_err(|e| Error::Config {
                    var: "FERROCOLL_TOPO_FILE".into(),
                    value: path.clone(),
                    reason: e.to_string(),
                })?;
                config.topology = Some(topo);
            }
        }
    }
    if config.topology.is_none() {
        config.topology = Some(topology_of(&node_of));
    }
    // Over TCP, slices of 512 KiB pipeline better than the thread
    // transport's 2 MiB (bench/RESULTS.md); an explicit setting wins.
    let slice_set = std::env::var("FERROCOLL_SLICE_BYTES").is_ok_and(|v| !v.trim().is_empty());
    if links.contains(&"tcp")
        && !slice_set
        && config.slice_bytes == crate::config::DEFAULT_SLICE_BYTES
    {
        config.slice_bytes = TCP_SLICE_BYTES;
    }

    // Everyone is connected before anyone sends.
    store
        .barrier("init/connected", size)
        .map_err(|e| store_error(e, "the start-up barrier"))?;
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
        assert_eq!(ring_bytes(2).unwrap(), 4 << 20);
        assert_eq!(ring_bytes(4).unwrap(), 2 << 20);
        assert_eq!(ring_bytes(8).unwrap(), 512 << 10);
        assert_eq!(ring_bytes(64).unwrap(), 64 << 10);
    }

    #[test]
    fn nodes_of_equal_blocks_give_a_two_level_topology() {
        assert_eq!(topology_of(&[0, 0, 1, 1]).levels(), &[2, 2]);
        assert_eq!(topology_of(&[0, 1, 0, 1]).levels(), &[4]);
        assert_eq!(topology_of(&[0, 0, 0]).levels(), &[3]);
        assert_eq!(topology_of(&[0, 0, 0, 1]).levels(), &[4]);
    }
}
