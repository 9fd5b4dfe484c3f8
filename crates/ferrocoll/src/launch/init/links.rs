//! The links, per transport: which link this rank has to each peer
//! ([`choose_links`]: `self`, `shm` or `tcp`, from `FERROCOLL_TRANSPORT` and
//! the nodes), the TCP side ([`listen_tcp`]: a listener whose address the
//! peers learn through the store; connections open on first use), and the
//! shared-memory side ([`attach_shm`], giving [`ShmLinks`]: the node's segments, its doorbell
//! and, when every local rank agrees, the small-call fast path).

use std::sync::Arc;
use std::time::Duration;

use super::hosts::Hosts;
use super::kind::TransportKind;
use crate::error::{Error, Result};
use crate::launch::node::setup_shm;
use crate::launch::rendezvous::Rendezvous;
use crate::launch::settings::LaunchSettings;
use crate::launch::waits::wait_for_ranks;
use crate::launch::world::WorldSpec;
use crate::transport::channel::{Channel, Doorbell};
use crate::transport::config::TransportConfig;
use crate::transport::engine::LocalBell;
use crate::transport::fastpath::{FastPath, Mailboxes};
use crate::transport::tcp::TcpConnector;

/// The link `rank` has to each peer, by peer: `self` for itself, `shm` to
/// the peers of its node (unless `kind` is [`TransportKind::Tcp`]), `tcp`
/// to the others. With [`TransportKind::Shm`], ranks on more than one host
/// are an [`Error::Config`] naming `FERROCOLL_TRANSPORT`.
pub(super) fn choose_links(
    kind: TransportKind,
    hosts: &Hosts,
    (rank, size): (usize, usize),
) -> Result<Vec<&'static str>> {
    let (node_of, my_node) = (&hosts.node_of, hosts.my_node);
    let use_shm = |peer: usize| match kind {
        TransportKind::Tcp => false,
        TransportKind::Auto | TransportKind::Shm => node_of[peer] == my_node,
    };
    if kind == TransportKind::Shm && hosts.nodes > 1 {
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
    Ok((0..size)
        .map(|p| {
            if p == rank {
                "self"
            } else if use_shm(p) {
                "shm"
            } else {
                "tcp"
            }
        })
        .collect())
}

/// TCP between the pairs that need it (`links`): a listener on the
/// interface that routes to the store, its address published, and the
/// addresses of the lower ranks (the higher rank of a pair connects)
/// learnt. Returns the connector, `None` when no peer is over TCP, and the
/// peers it serves. `connect_timeout` bounds each connection, `timeout` is
/// the configured deadline (for the error when some rank never arrives).
pub(super) fn listen_tcp(
    spec: &WorldSpec,
    store: &mut dyn Rendezvous,
    links: &[&str],
    transport_config: &TransportConfig,
    connect_timeout: Duration,
    timeout: Duration,
) -> Result<(Option<TcpConnector>, Vec<usize>)> {
    let (rank, size) = (spec.rank, spec.size);
    // The relation must be symmetric: it is, as it depends on nodes only.
    // TCP connections are opened when first used (TcpConnector); the
    // listening addresses are exchanged now.
    let lazy: Vec<usize> = (0..size).filter(|&p| links[p] == "tcp").collect();
    if lazy.is_empty() {
        return Ok((None, lazy));
    }
    let mut c = TcpConnector::listen(
        rank,
        &spec.store_addr,
        &spec.secret,
        connect_timeout,
        transport_config,
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
        store,
        &keys,
        &lower,
        (rank, size),
        "exchanging TCP addresses",
        timeout,
    )?;
    for (&peer, value) in lower.iter().zip(addrs) {
        let text = String::from_utf8_lossy(&value).into_owned();
        let addr = text
            .parse()
            .map_err(|_| Error::Internal(format!("bad address {text:?} in the store")))?;
        c.add_peer(peer, addr);
    }
    Ok((Some(c), lazy))
}

/// What shared memory gives this rank: a channel to each peer `links` puts
/// on it, the doorbell to sleep on, and perhaps the fast path.
pub(super) struct ShmLinks {
    /// (peer, channel to it), for every peer over shared memory.
    pub(super) channels: Vec<(usize, Box<dyn Channel>)>,
    /// The node's doorbell, or one of this rank's own when no peer is over
    /// shared memory.
    pub(super) bell: Arc<dyn Doorbell>,
    /// The small-call fast path, when every local rank agreed to it.
    pub(super) fast: Option<FastPath>,
}

/// Shared memory among the ranks of this node that `links` puts on it:
/// the segments set up (see [`setup_shm`]), with `debug` the
/// configuration's debug checks.
pub(super) fn attach_shm(
    spec: &WorldSpec,
    store: &mut dyn Rendezvous,
    hosts: &Hosts,
    links: &[&str],
    debug: bool,
    transport_config: &TransportConfig,
    settings: &LaunchSettings,
) -> Result<ShmLinks> {
    let (rank, size) = (spec.rank, spec.size);
    let mut channels = Vec::new();
    let shm_locals: Vec<usize> = hosts
        .locals
        .iter()
        .copied()
        .filter(|&p| p == rank || links[p] == "shm")
        .collect();
    let mut bell: Arc<dyn Doorbell> = Arc::new(LocalBell::new());
    let mut fast = None;
    if shm_locals.len() > 1 {
        let (node, fast_ok) = setup_shm(
            spec,
            store,
            &shm_locals,
            debug,
            hosts.my_node,
            transport_config,
            settings,
        )?;
        for (lp, &peer) in shm_locals.iter().enumerate() {
            if peer != rank {
                channels.push((peer, node.channel(lp)));
            }
        }
        bell = node.doorbell();
        if fast_ok {
            fast = Mailboxes::of(&node).map(|boxes| {
                let fast = FastPath::new(boxes, shm_locals.clone(), size);
                match node.pids_if_single_copy() {
                    Some(pids) => fast.with_remote_reads(pids),
                    None => fast,
                }
            });
        }
    }
    Ok(ShmLinks {
        channels,
        bell,
        fast,
    })
}
