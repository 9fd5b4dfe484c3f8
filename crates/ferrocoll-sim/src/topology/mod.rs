//! Cluster descriptions: the `kind:key=value,...` strings the simulator
//! accepts, parsed into a [`TopologySpec`].
//!
//! ```text
//! switch:ranks=64,bw=50GB/s,lat=2us
//! switch:ranks=64,bw=50GB/s,lat=1us,sharp=1
//! two-level:nodes=4,gpus=8,intra=450GB/s@1us,inter=25GB/s@2us
//! fat-tree:ranks=64,leaf=8,bw=50GB/s,lat=1us,oversub=2
//! rail:nodes=4,gpus=8,intra=450GB/s@1us,inter=50GB/s@2us
//! ring:ranks=16,bw=50GB/s,lat=1us
//! torus:dims=4x4,bw=50GB/s,lat=1us
//! torus:dims=4x4x4,bw=50GB/s,lat=1us,placement=random:7
//! ```
//!
//! Bandwidths take a decimal prefix (`K`, `M`, `G`, `T`) and `B/s` (bytes)
//! or `b/s` (bits): `50GB/s` is 5e10 bytes per second, `400Gb/s` is 5e10 too.
//! Latencies take `s`, `ms`, `us` or `ns`. What each kind means (which links
//! exist, where latency is paid) is documented on [`TopologySpec`] and in
//! [`crate::network`].
//!
//! Every kind also takes an optional `placement=` field, the [`Placement`] of
//! the plan's ranks on the physical positions: `block` (the default),
//! `roundrobin`, `random:SEED` or `list:P0,P1,...` (the list's commas belong
//! to it: every comma-separated item without `=` after `placement=list:` is
//! one more entry).
//!
//! `file:PATH` reads any graph of ranks and switches from a file (see
//! [`crate::graph`] for the format), optionally followed by
//! `,placement=...`.
//!
//! `switch` and `fat-tree` also take `sharp=0|1` (default 0): with `sharp=1`
//! their switches can reduce in the network (NVIDIA SHARP-like aggregation),
//! which [`crate::sharp`] simulates for allreduce. It changes no link and no
//! route; the plan-based algorithms run as without it.
//!
//! # Layout
//!
//! * `mod.rs`: [`TopologySpec`] and [`LinkSpec`], and what a topology tells
//!   the plans and the cost model (ranks, positions, plan topology, cost
//!   links).
//! * `parse.rs`: the string form, parsed and printed back.
//! * `placement.rs`: [`Placement`].
//! * `units.rs`: [`parse_bandwidth`] and [`parse_latency`].
//! * `tests.rs`: unit tests.

mod parse;
mod placement;
#[cfg(test)]
mod tests;
mod units;

pub use placement::Placement;
pub use units::{parse_bandwidth, parse_latency};

use std::sync::Arc;

use crate::graph::GraphSpec;

/// Bandwidth (bytes per second) and latency (seconds) of one class of link.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkSpec {
    /// Bytes per second through one port.
    pub bw: f64,
    /// Seconds a message pays for one traversal of a switch of this class.
    pub lat: f64,
}

/// The most links one route may cross (the engine counts hops in a `u8`).
pub const MAX_HOPS: usize = 255;

/// A modelled cluster. Physical positions are numbered in blocks: in
/// `two-level` and `rail` position `p` is GPU `p % gpus` of node `p / gpus`,
/// in `fat-tree` it hangs off leaf switch `p / leaf`, on a `ring` it is the
/// `p`-th station, on a `torus` it has coordinates `x = p % X`,
/// `y = p / X % Y`, `z = p / (X·Y)`. Rank `r` of the plans sits at position
/// `p(r)` given by the variant's [`Placement`] (`block`, the identity, by
/// default).
#[derive(Clone, Debug, PartialEq)]
pub enum TopologySpec {
    /// One full-bisection switch: every rank has one up port (rank to
    /// switch) and one down port (switch to rank) of `link.bw`; a message
    /// pays `link.lat` once.
    Switch {
        /// Number of ranks.
        ranks: usize,
        /// The rank ports.
        link: LinkSpec,
        /// `sharp=1`: the switch reduces in the network (see
        /// [`crate::sharp`]).
        sharp: bool,
        /// Rank to position.
        placement: Placement,
    },
    /// Nodes of GPUs. Inside a node every GPU has an up and a down port into
    /// a non-blocking NVSwitch (`intra`); between nodes a message leaves
    /// through the sending GPU's NIC (one per GPU, `inter`) into a single
    /// non-blocking switch and enters through the receiving GPU's NIC.
    TwoLevel {
        /// Number of nodes.
        nodes: usize,
        /// GPUs (ranks) per node.
        gpus: usize,
        /// The NVLink ports and the node switch's latency.
        intra: LinkSpec,
        /// The NIC ports and the network switch's latency.
        inter: LinkSpec,
        /// Rank to position.
        placement: Placement,
    },
    /// Two-tier fat tree: leaf switches of `leaf` ranks (rank ports of
    /// `link.bw`), each joined to the spine by one aggregate uplink and one
    /// aggregate downlink of `leaf * link.bw / oversub`. A message inside a
    /// leaf crosses one switch (`link.lat`), one between leaves three (leaf,
    /// spine, leaf).
    FatTree {
        /// Number of ranks (a multiple of `leaf`).
        ranks: usize,
        /// Ranks per leaf switch.
        leaf: usize,
        /// The rank ports and every switch's latency.
        link: LinkSpec,
        /// Oversubscription of the leaf uplinks (1 = full bisection).
        oversub: f64,
        /// `sharp=1`: the leaf and spine switches reduce in the network (see
        /// [`crate::sharp`]).
        sharp: bool,
        /// Rank to position.
        placement: Placement,
    },
    /// Rail-optimized nodes of GPUs (`rail:nodes=4,gpus=8,intra=..,inter=..`).
    /// Inside a node as `two-level` (NVSwitch ports of `intra`). Between
    /// nodes there is no common switch: NIC `i` of every node (the NIC of GPU
    /// `i`, `inter`) connects to rail switch `i` only. A message from GPU
    /// `i` of one node to GPU `j` of another goes NIC-up `i`, rail switch
    /// `i`, NIC-down `j` when `i == j` (one switch, `inter.lat`); when
    /// `i != j` it first crosses the NVSwitch of the source node to GPU `j`
    /// there and leaves by that GPU's NIC on rail `j` (PXN, NCCL's PCI x
    /// NVLink forwarding): `intra.lat + inter.lat`, and it loads the NVLink
    /// ports and a NIC that is not the sender's.
    Rail {
        /// Number of nodes.
        nodes: usize,
        /// GPUs (ranks, NICs, rails) per node.
        gpus: usize,
        /// The NVLink ports and the NVSwitch's latency.
        intra: LinkSpec,
        /// The NIC ports and the rail switches' latency.
        inter: LinkSpec,
        /// Rank to position.
        placement: Placement,
    },
    /// A physical bidirectional ring (`ring:ranks=16,bw=..,lat=..`): station
    /// `p` has one link to `p+1` and one to `p-1` (mod `ranks`), each of
    /// `link.bw`, each hop paying `link.lat`. A message takes the shorter
    /// way round (clockwise, towards `p+1`, on a tie), hop by hop through
    /// the stations between. At most 511 ranks (255 hops).
    Ring {
        /// Number of ranks (stations).
        ranks: usize,
        /// Every link and every hop's latency.
        link: LinkSpec,
        /// Rank to position.
        placement: Placement,
    },
    /// A wrap-around torus of two or three dimensions
    /// (`torus:dims=4x4,bw=..,lat=..`, `dims=XxYxZ`): every position has one
    /// link per direction per dimension to its neighbour (mod the
    /// dimension's size), each of `link.bw`, each hop paying `link.lat`.
    /// Dimension-order routing: first along x, then y, then z, the shorter
    /// way in each (the + direction on a tie). The plans see the dimensions
    /// as levels, x innermost: `4x4` is planned as 4 nodes (rows) of 4.
    Torus {
        /// Sizes of the dimensions, x first (two or three, each at least 1).
        dims: Vec<usize>,
        /// Every link and every hop's latency.
        link: LinkSpec,
        /// Rank to position.
        placement: Placement,
    },
    /// A graph read from a file (`file:PATH`; format and routing in
    /// [`crate::graph`]): position `p` is the file's rank `r<p>`.
    File {
        /// The file, as given.
        path: String,
        /// What it describes.
        graph: Arc<GraphSpec>,
        /// Rank to position.
        placement: Placement,
    },
}

impl TopologySpec {
    /// Number of ranks of the cluster.
    pub fn ranks(&self) -> usize {
        match self {
            TopologySpec::Switch { ranks, .. }
            | TopologySpec::FatTree { ranks, .. }
            | TopologySpec::Ring { ranks, .. } => *ranks,
            TopologySpec::TwoLevel { nodes, gpus, .. } | TopologySpec::Rail { nodes, gpus, .. } => {
                nodes * gpus
            }
            TopologySpec::Torus { dims, .. } => dims.iter().product(),
            TopologySpec::File { graph, .. } => graph.ranks,
        }
    }

    /// Whether the switches reduce in the network (`sharp=1` on `switch`
    /// or `fat-tree`; false for every other kind).
    pub fn sharp(&self) -> bool {
        match self {
            TopologySpec::Switch { sharp, .. } | TopologySpec::FatTree { sharp, .. } => *sharp,
            _ => false,
        }
    }

    /// How the plan's ranks sit on the physical positions.
    pub fn placement(&self) -> &Placement {
        match self {
            TopologySpec::Switch { placement, .. }
            | TopologySpec::TwoLevel { placement, .. }
            | TopologySpec::FatTree { placement, .. }
            | TopologySpec::Rail { placement, .. }
            | TopologySpec::Ring { placement, .. }
            | TopologySpec::Torus { placement, .. }
            | TopologySpec::File { placement, .. } => placement,
        }
    }

    /// The physical position of every rank: `v[r] = p(r)`, the
    /// [`Placement`] applied with the outermost level of
    /// [`TopologySpec::plan_topology`] as its groups.
    pub fn positions(&self) -> Vec<usize> {
        let n = self.ranks();
        let groups = self.plan_topology().levels()[0];
        self.placement().positions(n, groups)
    }

    /// The node structure the topology-aware algorithms (hier, torus2d,
    /// mesh2d) plan for, whatever the placement: nodes x GPUs for
    /// `two-level` and `rail`, leaves x ranks per leaf for `fat-tree` (when
    /// both exceed 1), the dimensions of a `torus` outermost first (`z x y x
    /// x`, dimensions of size 1 left out), a file's `plan` line, flat
    /// otherwise.
    pub fn plan_topology(&self) -> ferrocoll::Topology {
        let flat = ferrocoll::Topology::flat(self.ranks());
        let (outer, inner) = match self {
            TopologySpec::File { graph, .. } => {
                return match &graph.plan_levels {
                    Some(levels) if levels.iter().filter(|&&l| l > 1).count() > 1 => {
                        ferrocoll::Topology::new(levels.clone()).unwrap_or(flat)
                    }
                    _ => flat,
                }
            }
            TopologySpec::Switch { .. } | TopologySpec::Ring { .. } => return flat,
            TopologySpec::TwoLevel { nodes, gpus, .. } | TopologySpec::Rail { nodes, gpus, .. } => {
                (*nodes, *gpus)
            }
            TopologySpec::FatTree { ranks, leaf, .. } => (ranks / leaf, *leaf),
            TopologySpec::Torus { dims, .. } => {
                let levels: Vec<usize> = dims.iter().rev().copied().filter(|&d| d > 1).collect();
                return if levels.len() > 1 {
                    ferrocoll::Topology::new(levels).unwrap_or(flat)
                } else {
                    flat
                };
            }
        };
        if outer > 1 && inner > 1 {
            ferrocoll::Topology::new(vec![outer, inner]).unwrap_or(flat)
        } else {
            flat
        }
    }

    /// The (intra-node, inter-node) links an alpha-beta cost model sees: the
    /// rank ports twice for `switch`, `ring` and `torus` (a neighbour is one
    /// hop), the NVLink and NIC ports for `two-level` and `rail`, and for
    /// `fat-tree` the rank ports and, between leaves, `bw / oversub` (when
    /// oversubscribed) with three switches' latency; for a file, the
    /// slowest link and the summed latency of the route from rank 0 to
    /// rank 1 (intra) and to the first rank of the next node of its `plan`
    /// (or to the last rank; inter).
    pub fn cost_links(&self) -> (LinkSpec, LinkSpec) {
        match self {
            TopologySpec::File { graph, .. } => {
                let n = graph.ranks;
                let link = |b: usize| {
                    let (bw, lat) = graph.bottleneck(0, b);
                    LinkSpec { bw, lat }
                };
                let inner = graph
                    .plan_levels
                    .as_ref()
                    .map_or(1, |l| l.iter().skip(1).product::<usize>());
                let far = if inner > 1 && inner < n { inner } else { n - 1 };
                (link(1.min(n - 1)), link(far))
            }
            TopologySpec::Switch { link, .. }
            | TopologySpec::Ring { link, .. }
            | TopologySpec::Torus { link, .. } => (*link, *link),
            TopologySpec::TwoLevel { intra, inter, .. }
            | TopologySpec::Rail { intra, inter, .. } => (*intra, *inter),
            TopologySpec::FatTree { link, oversub, .. } => (
                *link,
                LinkSpec {
                    bw: link.bw / oversub.max(1.0),
                    lat: 3.0 * link.lat,
                },
            ),
        }
    }
}
