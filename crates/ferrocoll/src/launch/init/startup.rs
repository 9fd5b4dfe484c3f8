//! The start-up once every rank reaches the store, step by step
//! ([`init_over`]): who is where ([`Hosts`]), pinning to a core, the links
//! ([`super::links`]), rank 0's cost-model profile for every rank, the
//! topology, rank 0's tuned table for every rank, the slice size, the start-up barrier, and the engine that
//! becomes the communicator's transport.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::hosts::{topology_of, Hosts};
use super::kind::TransportKind;
use super::links::{attach_shm, choose_links, listen_tcp, ShmLinks};
use crate::comm::Communicator;
use crate::config::Config;
use crate::cost::Profile;
use crate::error::{Error, Result};
use crate::launch::node::bind_to_core;
use crate::launch::placement::Placement;
use crate::launch::rendezvous::Rendezvous;
use crate::launch::settings::LaunchSettings;
use crate::launch::waits::{connect_timeout, not_arrived, wait_for_ranks};
use crate::launch::world::WorldSpec;
use crate::topo::Topology;
use crate::transport::channel::Channel;
use crate::transport::config::TransportConfig;
use crate::transport::engine::Engine;
use crate::transport::fastpath::FastTransport;
use crate::tune::{TuneSetting, TuneTable};

/// Default slice size (see [`Config::slice_bytes`]) when TCP links are used.
pub const TCP_SLICE_BYTES: usize = 512 << 10;

/// The start-up after the store is reached: placement, links, profile.
/// `keep` lives as long as the transport (rank 0's store server);
/// `serves_store`: rank 0 serves the store (and so must outlive every
/// rank's start-up).
pub(super) fn init_over(
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
    let hosts = Hosts::exchange(store.as_mut(), (rank, size), settings, config.timeout)?;
    let dedicated_core = bind_to_core(hosts.local_rank, hosts.locals.len(), settings.bind)?;

    let links = choose_links(kind, &hosts, (rank, size))?;
    // TCP between the pairs that need it.
    let (connector, lazy) = listen_tcp(
        spec,
        store.as_mut(),
        &links,
        &transport_config,
        connect_timeout,
        config.timeout,
    )?;
    // Shared memory among the ranks of this node.
    let ShmLinks {
        channels: shm_channels,
        bell,
        fast,
    } = attach_shm(
        spec,
        store.as_mut(),
        &hosts,
        &links,
        config.debug,
        &transport_config,
        settings,
    )?;
    let mut channels: Vec<Option<Box<dyn Channel>>> = (0..size).map(|_| None).collect();
    for (peer, channel) in shm_channels {
        channels[peer] = Some(channel);
    }

    // Every rank predicts with rank 0's profile, so auto choices agree. It
    // is looked for under the transport's name as the communicator reports
    // it (what `ferrocoll calibrate` writes: "shm+tcp" across hosts), then
    // under "tcp" (profiles written before), then built in.
    let transport_name = match (links.contains(&"shm"), links.contains(&"tcp")) {
        (true, true) => "shm+tcp",
        (false, true) => "tcp",
        _ => "shm",
    };
    let names: &[&str] = if transport_name == "shm+tcp" {
        &["shm+tcp", "tcp"]
    } else {
        &[transport_name]
    };
    config.profile = Some(share_profile(
        store.as_mut(),
        &config,
        (rank, size),
        names,
        hosts.nodes > 1,
    )?);
    let topo = topology(&config, settings, &hosts.node_of, size)?;
    // Likewise rank 0's tuned table, resolved for this world's key.
    config.tune = share_tune(store.as_mut(), &config, (rank, size), transport_name, &topo)?;
    config.topology = Some(topo);
    // Over TCP, slices of 512 KiB pipeline better than the thread
    // transport's 2 MiB (bench/RESULTS.md); an explicit setting wins.
    let slice_set = settings.slice_set;
    if links.contains(&"tcp")
        && !slice_set
        && config.slice_bytes == crate::config::DEFAULT_SLICE_BYTES
    {
        config.slice_bytes = TCP_SLICE_BYTES;
    }

    start_up_barrier(store.as_mut(), (rank, size), serves_store, config.timeout)?;
    drop(store);

    let placement = Placement {
        launcher: spec.launcher,
        hosts: hosts.hosts,
        node_of: hosts.node_of,
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

/// Rank 0's cost-model profile, which every rank predicts with so that
/// `auto` choices agree: rank 0 publishes its own (the configuration's, else
/// the first calibrated one of `names`, else the built-in one: for a job
/// across hosts, [`Profile::hosts_default`], on one host the transport's,
/// [`Profile::builtin`]) and every rank reads it back.
fn share_profile(
    store: &mut dyn Rendezvous,
    config: &Config,
    (rank, size): (usize, usize),
    names: &[&str],
    across_hosts: bool,
) -> Result<Profile> {
    if rank == 0 {
        let profile = config.profile.clone().unwrap_or_else(|| {
            names
                .iter()
                .find_map(|name| Profile::default_path(name).and_then(|p| Profile::load(&p).ok()))
                .unwrap_or_else(|| {
                    if across_hosts {
                        Profile::hosts_default()
                    } else {
                        Profile::builtin(names.first().copied().unwrap_or("shm"))
                    }
                })
        });
        let json = serde_json::to_vec(&profile).map_err(|e| Error::Internal(e.to_string()))?;
        store.set("profile", &json)?;
    }
    let json = wait_for_ranks(
        store,
        &["profile".to_string()],
        &[0],
        (rank, size),
        "sharing rank 0's cost-model profile",
        config.timeout,
    )?
    .remove(0);
    serde_json::from_slice(&json).map_err(|e| Error::Internal(format!("profile from rank 0: {e}")))
}

/// Rank 0's tuned table for this world ([`TuneSetting::resolve`], which
/// warns there when a table does not fit), shared so that every rank's
/// `auto` decides alike: [`TuneSetting::Shared`], or `Off` when rank 0 has
/// none.
fn share_tune(
    store: &mut dyn Rendezvous,
    config: &Config,
    (rank, size): (usize, usize),
    transport: &str,
    topology: &Topology,
) -> Result<TuneSetting> {
    if rank == 0 {
        let table = config.tune.resolve(transport, size, topology);
        let json = serde_json::to_vec(&table).map_err(|e| Error::Internal(e.to_string()))?;
        store.set("tune", &json)?;
    }
    let json = wait_for_ranks(
        store,
        &["tune".to_string()],
        &[0],
        (rank, size),
        "sharing rank 0's tuned table",
        config.timeout,
    )?
    .remove(0);
    let table: Option<TuneTable> = serde_json::from_slice(&json)
        .map_err(|e| Error::Internal(format!("tuned table from rank 0: {e}")))?;
    Ok(table.map_or(TuneSetting::Off, TuneSetting::Shared))
}

/// The topology: FERROCOLL_TOPO (in `config`), else FERROCOLL_TOPO_FILE,
/// else what the hosts imply (`node_of`, see [`topology_of`]). One given
/// by a variable must fit the world of `size` ranks.
fn topology(
    config: &Config,
    settings: &LaunchSettings,
    node_of: &[usize],
    size: usize,
) -> Result<Topology> {
    let given = if config.topology.is_some() {
        config.topology.clone().map(|t| ("FERROCOLL_TOPO", t))
    } else {
        settings
            .topo_file
            .clone()
            .map(|t| ("FERROCOLL_TOPO_FILE", t))
    };
    let Some((var, topo)) = given else {
        return Ok(topology_of(node_of));
    };
    topo.check_size(size).map_err(|e| {
        crate::env::bad(
            var,
            &topo.to_string(),
            format!("{} (this job has {size} ranks)", crate::env::reason(e)),
        )
    })?;
    Ok(topo)
}

/// Everyone is connected before anyone sends. Each rank also leaves a key
/// of its own, read only if the barrier fails, to say which ranks never got
/// this far (the barrier itself costs a rank two requests, whatever the
/// world's size). `serves_store`: this job's rank 0 serves the store, and
/// so waits until every rank is through with it; `timeout` is the
/// configured deadline (for the error).
fn start_up_barrier(
    store: &mut dyn Rendezvous,
    (rank, size): (usize, usize),
    serves_store: bool,
    timeout: Duration,
) -> Result<()> {
    store.set(&format!("init/ready/{rank}"), b"1")?;
    let start = Instant::now();
    if let Err(e) = store.barrier("init/connected", size) {
        let keys: Vec<String> = (0..size).map(|r| format!("init/ready/{r}")).collect();
        let everyone: Vec<usize> = (0..size).collect();
        return Err(not_arrived(
            store,
            e,
            &keys,
            &everyone,
            (rank, size),
            "the start-up barrier, after connecting",
            timeout,
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
    Ok(())
}
