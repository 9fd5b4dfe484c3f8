//! Who is where: every rank publishes its host identity (host name plus
//! boot id, or `FERROCOLL_HOST_ID`); ranks with the same identity form a
//! node ([`Hosts::exchange`]), and nodes of equal blocks of consecutive
//! ranks give a two-level topology ([`topology_of`]).

use crate::error::Result;
use crate::launch::placement::machine_identity;
use crate::launch::rendezvous::Rendezvous;
use crate::launch::settings::LaunchSettings;
use crate::launch::waits::wait_for_ranks;
use crate::topo::Topology;

/// The hosts of a job, as the ranks told each other through the store.
pub(super) struct Hosts {
    /// Each rank's host identity, by rank.
    pub(super) hosts: Vec<String>,
    /// Each rank's node: the index of its identity in the order the
    /// identities first appear.
    pub(super) node_of: Vec<usize>,
    /// How many nodes (distinct identities) there are.
    pub(super) nodes: usize,
    /// This rank's node.
    pub(super) my_node: usize,
    /// The ranks of this rank's node, in rank order.
    pub(super) locals: Vec<usize>,
    /// This rank's index among `locals`.
    pub(super) local_rank: usize,
}

impl Hosts {
    /// Publishes this rank's identity and waits for every rank's;
    /// `timeout` is the configured deadline (for the error when some rank
    /// never arrives).
    pub(super) fn exchange(
        store: &mut dyn Rendezvous,
        (rank, size): (usize, usize),
        settings: &LaunchSettings,
        timeout: std::time::Duration,
    ) -> Result<Hosts> {
        let me = settings.host_id.clone().unwrap_or_else(machine_identity);
        store.set(&format!("host/{rank}"), me.as_bytes())?;
        let keys: Vec<String> = (0..size).map(|r| format!("host/{r}")).collect();
        let everyone: Vec<usize> = (0..size).collect();
        let hosts: Vec<String> = wait_for_ranks(
            store,
            &keys,
            &everyone,
            (rank, size),
            "exchanging host identities",
            timeout,
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
        let nodes = node_names.len();
        let my_node = node_of[rank];
        let locals: Vec<usize> = (0..size).filter(|&r| node_of[r] == my_node).collect();
        let local_rank = locals
            .iter()
            .position(|&r| r == rank)
            .expect("this rank is on its node");
        Ok(Hosts {
            hosts,
            node_of,
            nodes,
            my_node,
            locals,
            local_rank,
        })
    }
}

/// The topology the nodes imply: `nodes x per_node` when nodes are equal
/// blocks of consecutive ranks, else flat.
pub(super) fn topology_of(node_of: &[usize]) -> Topology {
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
