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

use std::fmt;
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

/// Where the ranks of a plan sit on the cluster: rank `r` runs at physical
/// position `p(r)` (see [`Placement::positions`]). The topology's own
/// numbering of positions is the block one documented on [`TopologySpec`];
/// the plans are always told that block structure
/// ([`TopologySpec::plan_topology`]), so any other placement shows what a
/// launcher that places ranks differently from what the algorithms assume
/// costs (the rank-mapping pitfall of `ferrocoll::plan::hier`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Placement {
    /// `block`: rank `r` at position `r` (the default).
    #[default]
    Block,
    /// `roundrobin`: ranks dealt over the groups of the outermost level of
    /// the plan topology (nodes of `two-level` and `rail`, leaves of
    /// `fat-tree`, rows of a 2-D torus, planes of a 3-D one): with `G` groups
    /// of `S` positions, rank `r` goes to group `r % G`, slot `r / G`, i.e.
    /// position `(r % G)·S + r / G`. The identity on `switch` and `ring`
    /// (no groups).
    RoundRobin,
    /// `random:SEED`: a Fisher-Yates shuffle driven by a xorshift64
    /// generator seeded with `SEED`; the same seed always gives the same
    /// placement.
    Random(u64),
    /// `list:P0,P1,...`: rank `r` at position `Pr`; must be a permutation of
    /// `0..ranks`.
    List(Vec<usize>),
}

impl Placement {
    /// The physical position of every rank (`v[r] = p(r)`, a permutation of
    /// `0..n`) for `n` ranks whose outermost plan level has `groups` groups
    /// (a divisor of `n`; `n` or 1 for a flat cluster). A [`Placement::List`]
    /// of the wrong length or that is no permutation yields the identity;
    /// [`TopologySpec::parse`] rejects those.
    pub fn positions(&self, n: usize, groups: usize) -> Vec<usize> {
        let identity = || (0..n).collect::<Vec<_>>();
        match self {
            Placement::Block => identity(),
            Placement::RoundRobin => {
                if groups == 0 || n % groups != 0 {
                    return identity();
                }
                let slots = n / groups;
                (0..n).map(|r| (r % groups) * slots + r / groups).collect()
            }
            Placement::Random(seed) => {
                // xorshift64; the constant keeps seed 0 off the fixed point.
                let mut s = seed ^ 0x9E37_79B9_7F4A_7C15;
                if s == 0 {
                    s = 0x9E37_79B9_7F4A_7C15;
                }
                let mut v = identity();
                for i in (1..n).rev() {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    v.swap(i, (s % (i as u64 + 1)) as usize);
                }
                v
            }
            Placement::List(list) => {
                if check_permutation(list, n).is_ok() {
                    list.clone()
                } else {
                    identity()
                }
            }
        }
    }

    fn parse(v: &str) -> Result<Placement, String> {
        match v {
            "block" => Ok(Placement::Block),
            "roundrobin" => Ok(Placement::RoundRobin),
            _ => {
                if let Some(seed) = v.strip_prefix("random:") {
                    seed.trim()
                        .parse::<u64>()
                        .map(Placement::Random)
                        .map_err(|_| {
                            format!("`{v}`: the seed is not a whole number (e.g. random:42)")
                        })
                } else if let Some(list) = v.strip_prefix("list:") {
                    list.split(',')
                        .map(|p| p.trim().parse::<usize>())
                        .collect::<Result<Vec<_>, _>>()
                        .map(Placement::List)
                        .map_err(|_| {
                            format!("`{v}`: expected comma-separated positions (e.g. list:3,1,0,2)")
                        })
                } else {
                    Err(format!(
                        "`{v}` is not block, roundrobin, random:SEED or list:P0,P1,..."
                    ))
                }
            }
        }
    }
}

/// `Ok` when `list` holds every one of `0..n` once.
fn check_permutation(list: &[usize], n: usize) -> Result<(), String> {
    if list.len() != n {
        return Err(format!(
            "the list has {} positions but the topology has {n} ranks",
            list.len()
        ));
    }
    let mut seen = vec![false; n];
    for &p in list {
        if p >= n {
            return Err(format!(
                "position {p} is outside 0..{n}; the list must be a permutation of 0..{n}"
            ));
        }
        if std::mem::replace(&mut seen[p], true) {
            return Err(format!(
                "position {p} appears twice; the list must be a permutation of 0..{n}"
            ));
        }
    }
    Ok(())
}

impl fmt::Display for Placement {
    /// `block`, `roundrobin`, `random:SEED` or `list:P0,P1,...`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Placement::Block => f.write_str("block"),
            Placement::RoundRobin => f.write_str("roundrobin"),
            Placement::Random(seed) => write!(f, "random:{seed}"),
            Placement::List(list) => {
                f.write_str("list:")?;
                for (i, p) in list.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{p}")?;
                }
                Ok(())
            }
        }
    }
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
    /// Parses a topology string (see the module docs). Errors name the kind
    /// or the field that is wrong and what was expected.
    pub fn parse(s: &str) -> Result<TopologySpec, String> {
        let s = s.trim();
        let (kind, rest) = s.split_once(':').ok_or_else(|| {
            format!(
                "topology `{s}`: expected `kind:key=value,...` with kind one of {KINDS} \
                 (e.g. switch:ranks=64,bw=50GB/s,lat=2us)"
            )
        })?;
        let kind = kind.trim();
        if kind == "file" {
            return TopologySpec::parse_file(rest.trim());
        }
        let allowed: &[&str] = match kind {
            "switch" => &["ranks", "bw", "lat", "sharp", "placement"],
            "ring" => &["ranks", "bw", "lat", "placement"],
            "two-level" | "rail" => &["nodes", "gpus", "intra", "inter", "placement"],
            "fat-tree" => &[
                "ranks",
                "leaf",
                "bw",
                "lat",
                "oversub",
                "sharp",
                "placement",
            ],
            "torus" => &["dims", "bw", "lat", "placement"],
            _ => {
                return Err(format!(
                    "topology kind `{kind}` is unknown; use one of {KINDS}"
                ))
            }
        };
        let f = Fields::parse(kind, rest, allowed)?;
        let placement = match f.get("placement") {
            None => Placement::Block,
            Some(v) => Placement::parse(v).map_err(|e| format!("{kind}: placement: {e}"))?,
        };
        let simple = |f: &Fields| -> Result<LinkSpec, String> {
            Ok(LinkSpec {
                bw: f.bandwidth("bw")?,
                lat: f.latency("lat")?,
            })
        };
        let spec = match kind {
            "switch" => TopologySpec::Switch {
                ranks: f.count("ranks")?,
                link: simple(&f)?,
                sharp: f.flag("sharp")?,
                placement,
            },
            "two-level" => TopologySpec::TwoLevel {
                nodes: f.count("nodes")?,
                gpus: f.count("gpus")?,
                intra: f.link("intra")?,
                inter: f.link("inter")?,
                placement,
            },
            "rail" => TopologySpec::Rail {
                nodes: f.count("nodes")?,
                gpus: f.count("gpus")?,
                intra: f.link("intra")?,
                inter: f.link("inter")?,
                placement,
            },
            "ring" => {
                let ranks = f.count("ranks")?;
                if ranks / 2 > MAX_HOPS {
                    return Err(format!(
                        "ring: ranks: {ranks} gives routes of more than {MAX_HOPS} hops; \
                         use at most {} ranks",
                        2 * MAX_HOPS + 1
                    ));
                }
                TopologySpec::Ring {
                    ranks,
                    link: simple(&f)?,
                    placement,
                }
            }
            "torus" => {
                let v = f.required("dims")?;
                let dims = v
                    .split('x')
                    .map(|d| d.trim().parse::<usize>().ok().filter(|&d| d >= 1))
                    .collect::<Option<Vec<_>>>()
                    .filter(|d| d.len() == 2 || d.len() == 3)
                    .ok_or_else(|| {
                        format!(
                            "torus: dims: `{v}` is not two or three positive sizes \
                             joined by x (e.g. 4x4 or 4x4x4)"
                        )
                    })?;
                if dims.iter().map(|d| d / 2).sum::<usize>() > MAX_HOPS {
                    return Err(format!(
                        "torus: dims: `{v}` gives routes of more than {MAX_HOPS} hops"
                    ));
                }
                TopologySpec::Torus {
                    dims,
                    link: simple(&f)?,
                    placement,
                }
            }
            _ => {
                let ranks = f.count("ranks")?;
                let leaf = f.count("leaf")?;
                if ranks % leaf != 0 {
                    return Err(format!(
                        "fat-tree: leaf: {leaf} does not divide ranks={ranks}; \
                         every leaf switch holds the same number of ranks"
                    ));
                }
                let oversub = match f.get("oversub") {
                    None => 1.0,
                    Some(v) => match v.parse::<f64>() {
                        Ok(x) if x.is_finite() && x > 0.0 => x,
                        _ => {
                            return Err(format!(
                                "fat-tree: oversub: `{v}` is not a positive number (e.g. oversub=2)"
                            ))
                        }
                    },
                };
                TopologySpec::FatTree {
                    ranks,
                    leaf,
                    link: simple(&f)?,
                    oversub,
                    sharp: f.flag("sharp")?,
                    placement,
                }
            }
        };
        if let Placement::List(list) = spec.placement() {
            check_permutation(list, spec.ranks()).map_err(|e| format!("{kind}: placement: {e}"))?;
        }
        Ok(spec)
    }

    /// `file:PATH[,placement=...]` without its `file:`.
    fn parse_file(rest: &str) -> Result<TopologySpec, String> {
        let (path, placement) = match rest.rsplit_once(",placement=") {
            Some((path, p)) => (
                path,
                Placement::parse(p).map_err(|e| format!("file:{path}: placement: {e}"))?,
            ),
            None => (rest, Placement::Block),
        };
        if path.is_empty() {
            return Err(
                "file: expected file:PATH (a topology file, see `ferrocoll sim --help`)".into(),
            );
        }
        let text = std::fs::read_to_string(path).map_err(|e| format!("file:{path}: {e}"))?;
        let graph = GraphSpec::parse(&text).map_err(|e| format!("file:{path}: {e}"))?;
        if let Placement::List(list) = &placement {
            check_permutation(list, graph.ranks)
                .map_err(|e| format!("file:{path}: placement: {e}"))?;
        }
        Ok(TopologySpec::File {
            path: path.to_string(),
            graph: Arc::new(graph),
            placement,
        })
    }

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

impl std::str::FromStr for TopologySpec {
    type Err = String;
    fn from_str(s: &str) -> Result<TopologySpec, String> {
        TopologySpec::parse(s)
    }
}

impl fmt::Display for TopologySpec {
    /// The canonical string (GB/s and us, `sharp=1` only when set,
    /// `placement` only when not `block`), which [`TopologySpec::parse`] reads back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bw = |l: &LinkSpec| format!("{}GB/s", l.bw / 1e9);
        let lat = |l: &LinkSpec| format!("{}us", l.lat * 1e6);
        match self {
            TopologySpec::Switch { ranks, link, .. } | TopologySpec::Ring { ranks, link, .. } => {
                let kind = if matches!(self, TopologySpec::Ring { .. }) {
                    "ring"
                } else {
                    "switch"
                };
                write!(f, "{kind}:ranks={ranks},bw={},lat={}", bw(link), lat(link))?
            }
            TopologySpec::TwoLevel {
                nodes,
                gpus,
                intra,
                inter,
                ..
            }
            | TopologySpec::Rail {
                nodes,
                gpus,
                intra,
                inter,
                ..
            } => {
                let kind = if matches!(self, TopologySpec::Rail { .. }) {
                    "rail"
                } else {
                    "two-level"
                };
                write!(
                    f,
                    "{kind}:nodes={nodes},gpus={gpus},intra={}@{},inter={}@{}",
                    bw(intra),
                    lat(intra),
                    bw(inter),
                    lat(inter)
                )?
            }
            TopologySpec::FatTree {
                ranks,
                leaf,
                link,
                oversub,
                ..
            } => write!(
                f,
                "fat-tree:ranks={ranks},leaf={leaf},bw={},lat={},oversub={oversub}",
                bw(link),
                lat(link)
            )?,
            TopologySpec::File { path, .. } => write!(f, "file:{path}")?,
            TopologySpec::Torus { dims, link, .. } => {
                let dims: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
                write!(
                    f,
                    "torus:dims={},bw={},lat={}",
                    dims.join("x"),
                    bw(link),
                    lat(link)
                )?
            }
        }
        if self.sharp() {
            f.write_str(",sharp=1")?;
        }
        match self.placement() {
            Placement::Block => Ok(()),
            p => write!(f, ",placement={p}"),
        }
    }
}

const KINDS: &str = "switch, two-level, fat-tree, rail, ring, torus, file";

/// The `key=value` pairs of one topology string.
struct Fields<'a> {
    kind: &'a str,
    pairs: Vec<(&'a str, &'a str)>,
}

impl<'a> Fields<'a> {
    fn parse(kind: &'a str, rest: &'a str, allowed: &[&str]) -> Result<Fields<'a>, String> {
        let mut pairs: Vec<(&str, &str)> = Vec::new();
        // (start, end) in `rest` of the value of a `placement=list:` pair,
        // which takes the following items without `=` as more entries.
        let mut list: Option<(usize, usize)> = None;
        let mut offset = 0;
        for raw in rest.split(',') {
            let start = offset;
            offset += raw.len() + 1;
            let item = raw.trim();
            if item.is_empty() {
                continue;
            }
            let Some((k, v)) = item.split_once('=') else {
                if let Some((vs, ve)) = list.as_mut() {
                    *ve = start + raw.trim_end().len();
                    let last = pairs.last_mut().expect("the placement pair");
                    last.1 = &rest[*vs..*ve];
                    continue;
                }
                return Err(format!(
                    "{kind}: `{item}` is not key=value (fields: {})",
                    allowed.join(", ")
                ));
            };
            let (k, v) = (k.trim(), v.trim());
            if !allowed.contains(&k) {
                return Err(format!(
                    "{kind}: unknown field `{k}`; {kind} takes {}",
                    allowed.join(", ")
                ));
            }
            if pairs.iter().any(|p| p.0 == k) {
                return Err(format!("{kind}: field `{k}` is given twice"));
            }
            list = None;
            if k == "placement" && v.starts_with("list:") {
                let vs = start + raw.find('=').expect("has =") + 1;
                let vs = vs + (rest[vs..].len() - rest[vs..].trim_start().len());
                list = Some((vs, vs + v.len()));
            }
            pairs.push((k, v));
        }
        Ok(Fields { kind, pairs })
    }

    fn get(&self, key: &str) -> Option<&'a str> {
        self.pairs.iter().find(|p| p.0 == key).map(|p| p.1)
    }

    fn required(&self, key: &str) -> Result<&'a str, String> {
        self.get(key)
            .ok_or_else(|| format!("{}: missing field `{key}`", self.kind))
    }

    fn count(&self, key: &str) -> Result<usize, String> {
        let v = self.required(key)?;
        match v.parse::<usize>() {
            Ok(n) if n >= 1 => Ok(n),
            _ => Err(format!(
                "{}: {key}: `{v}` is not a positive whole number",
                self.kind
            )),
        }
    }

    /// An optional `0` / `1` field, false when absent.
    fn flag(&self, key: &str) -> Result<bool, String> {
        match self.get(key) {
            None | Some("0") => Ok(false),
            Some("1") => Ok(true),
            Some(v) => Err(format!(
                "{}: {key}: `{v}` is not 0 or 1 (e.g. {key}=1)",
                self.kind
            )),
        }
    }

    fn bandwidth(&self, key: &str) -> Result<f64, String> {
        let v = self.required(key)?;
        parse_bandwidth(v).map_err(|e| format!("{}: {key}: {e}", self.kind))
    }

    fn latency(&self, key: &str) -> Result<f64, String> {
        let v = self.required(key)?;
        parse_latency(v).map_err(|e| format!("{}: {key}: {e}", self.kind))
    }

    /// `bw@lat`, e.g. `450GB/s@1us`.
    fn link(&self, key: &str) -> Result<LinkSpec, String> {
        let v = self.required(key)?;
        let (bw, lat) = v.split_once('@').ok_or_else(|| {
            format!(
                "{}: {key}: `{v}` is not bandwidth@latency (e.g. 25GB/s@2us)",
                self.kind
            )
        })?;
        Ok(LinkSpec {
            bw: parse_bandwidth(bw.trim()).map_err(|e| format!("{}: {key}: {e}", self.kind))?,
            lat: parse_latency(lat.trim()).map_err(|e| format!("{}: {key}: {e}", self.kind))?,
        })
    }
}

/// Splits `50GB/s` into (50.0, "GB/s").
fn number_and_unit(s: &str) -> Option<(f64, &str)> {
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == 'e' || c == '-' || c == '+'))
        .unwrap_or(s.len());
    // `e` may begin a unit only in theory; none of ours does.
    let x = s[..end].parse::<f64>().ok()?;
    Some((x, s[end..].trim()))
}

/// Parses a bandwidth into bytes per second: a number, a decimal prefix
/// (none, K, M, G, T) and `B/s` (bytes) or `b/s` (bits).
pub fn parse_bandwidth(s: &str) -> Result<f64, String> {
    let bad = || {
        format!("`{s}` is not a bandwidth; write a positive number and a unit such as GB/s (bytes) or Gb/s (bits)")
    };
    let (x, unit) = number_and_unit(s).ok_or_else(bad)?;
    let (prefix, per_unit) = if let Some(p) = unit.strip_suffix("B/s") {
        (p, 1.0)
    } else if let Some(p) = unit.strip_suffix("b/s") {
        (p, 0.125)
    } else {
        return Err(bad());
    };
    let scale = match prefix {
        "" => 1.0,
        "K" | "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        _ => return Err(bad()),
    };
    let bw = x * scale * per_unit;
    if bw.is_finite() && bw > 0.0 {
        Ok(bw)
    } else {
        Err(bad())
    }
}

/// Parses a latency into seconds: a number and `s`, `ms`, `us` or `ns`.
pub fn parse_latency(s: &str) -> Result<f64, String> {
    let bad = || format!("`{s}` is not a latency; write a number and s, ms, us or ns (e.g. 2us)");
    let (x, unit) = number_and_unit(s).ok_or_else(bad)?;
    let scale = match unit {
        "s" => 1.0,
        "ms" => 1e-3,
        "us" => 1e-6,
        "ns" => 1e-9,
        _ => return Err(bad()),
    };
    let lat = x * scale;
    if lat.is_finite() && lat >= 0.0 {
        Ok(lat)
    } else {
        Err(bad())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * a.abs().max(b.abs())
    }

    #[test]
    fn units_convert() {
        assert!(close(parse_bandwidth("50GB/s").unwrap(), 5e10));
        assert!(close(parse_bandwidth("400Gb/s").unwrap(), 5e10));
        assert!(close(parse_bandwidth("1.5TB/s").unwrap(), 1.5e12));
        assert!(close(parse_bandwidth("100MB/s").unwrap(), 1e8));
        assert!(close(parse_bandwidth("8b/s").unwrap(), 1.0));
        assert!(close(parse_latency("2us").unwrap(), 2e-6));
        assert!(close(parse_latency("500ns").unwrap(), 5e-7));
        assert!(close(parse_latency("1.5ms").unwrap(), 1.5e-3));
        assert!(close(parse_latency("0s").unwrap(), 0.0));
        for bad in [
            "50", "50GB", "GB/s", "50XB/s", "-1GB/s", "0GB/s", "50 GiB/s", "5µB/s",
        ] {
            assert!(parse_bandwidth(bad).is_err(), "{bad}");
        }
        for bad in ["2", "2 sec", "us", "-1us", "2mus"] {
            assert!(parse_latency(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn parses_the_three_kinds() {
        let s = TopologySpec::parse("switch:ranks=64,bw=50GB/s,lat=2us").unwrap();
        assert_eq!(
            s,
            TopologySpec::Switch {
                ranks: 64,
                link: LinkSpec {
                    bw: 5e10,
                    lat: 2e-6
                },
                sharp: false,
                placement: Placement::Block,
            }
        );
        assert_eq!(s.ranks(), 64);
        let t = TopologySpec::parse("two-level:nodes=4,gpus=8,intra=450GB/s@1us,inter=200Gb/s@2us")
            .unwrap();
        match t {
            TopologySpec::TwoLevel {
                nodes,
                gpus,
                intra,
                inter,
                ..
            } => {
                assert_eq!((nodes, gpus), (4, 8));
                assert!(close(intra.bw, 4.5e11) && close(intra.lat, 1e-6));
                assert!(close(inter.bw, 2.5e10) && close(inter.lat, 2e-6));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(t.ranks(), 32);
        assert_eq!(t.plan_topology().levels(), &[4, 8]);
        let f =
            TopologySpec::parse("fat-tree:ranks=64,leaf=8,bw=50GB/s,lat=1us,oversub=2").unwrap();
        assert_eq!(
            f,
            TopologySpec::FatTree {
                ranks: 64,
                leaf: 8,
                link: LinkSpec {
                    bw: 5e10,
                    lat: 1e-6
                },
                oversub: 2.0,
                sharp: false,
                placement: Placement::Block,
            }
        );
        // oversub defaults to 1; spaces and field order do not matter.
        let g = TopologySpec::parse(" fat-tree: lat=1us, bw=50GB/s, leaf=8, ranks=16 ").unwrap();
        assert!(matches!(g, TopologySpec::FatTree { oversub, .. } if oversub == 1.0));
    }

    #[test]
    fn display_round_trips() {
        for s in [
            "switch:ranks=64,bw=50GB/s,lat=2us",
            "two-level:nodes=4,gpus=8,intra=450GB/s@1us,inter=25GB/s@2us",
            "fat-tree:ranks=64,leaf=8,bw=50GB/s,lat=1us,oversub=2",
            "switch:ranks=64,bw=50GB/s,lat=1us,sharp=1",
            "fat-tree:ranks=64,leaf=8,bw=50GB/s,lat=1us,oversub=2,sharp=1,placement=roundrobin",
        ] {
            let t = TopologySpec::parse(s).unwrap();
            assert_eq!(t.to_string(), s);
            assert_eq!(TopologySpec::parse(&t.to_string()).unwrap(), t);
        }
    }

    #[test]
    fn errors_name_the_field() {
        let err = |s: &str| TopologySpec::parse(s).unwrap_err();
        assert!(err("mesh:ranks=4").contains("kind `mesh`"));
        assert!(err("switch").contains("kind:key=value"));
        assert!(err("switch:ranks=64,bw=50GB/s").contains("missing field `lat`"));
        assert!(err("switch:ranks=64,bw=50XB/s,lat=1us").contains("bw:"));
        assert!(err("switch:ranks=64,bw=50GB/s,lat=1").contains("lat:"));
        assert!(err("switch:ranks=0,bw=50GB/s,lat=1us").contains("ranks:"));
        assert!(err("switch:ranks=many,bw=50GB/s,lat=1us").contains("ranks:"));
        assert!(err("switch:ranks=4,ranks=4,bw=50GB/s,lat=1us").contains("twice"));
        assert!(err("switch:ranks=4,bw=50GB/s,lat=1us,leaf=2").contains("unknown field `leaf`"));
        assert!(err("switch:ranks=4,bw50GB/s,lat=1us").contains("key=value"));
        assert!(err("two-level:nodes=2,gpus=4,intra=450GB/s,inter=25GB/s@2us").contains("intra:"));
        assert!(
            err("two-level:nodes=2,gpus=4,intra=450GB/s@1us,inter=25GB/s@2").contains("inter:")
        );
        assert!(err("fat-tree:ranks=60,leaf=8,bw=50GB/s,lat=1us").contains("leaf:"));
        assert!(err("fat-tree:ranks=64,leaf=8,bw=50GB/s,lat=1us,oversub=0").contains("oversub:"));
        assert!(err("switch:ranks=4,bw=50GB/s,lat=1us,sharp=yes").contains("sharp:"));
        assert!(err("ring:ranks=4,bw=50GB/s,lat=1us,sharp=1").contains("unknown field `sharp`"));
    }

    #[test]
    fn sharp_is_a_switch_capability() {
        let on = |s: &str| TopologySpec::parse(s).unwrap().sharp();
        assert!(on("switch:ranks=4,bw=50GB/s,lat=1us,sharp=1"));
        assert!(!on("switch:ranks=4,bw=50GB/s,lat=1us,sharp=0"));
        assert!(!on("switch:ranks=4,bw=50GB/s,lat=1us"));
        assert!(on("fat-tree:ranks=8,leaf=4,bw=50GB/s,lat=1us,sharp=1"));
        // sharp=0 is the default and is not printed.
        let t = TopologySpec::parse("switch:ranks=4,bw=50GB/s,lat=1us,sharp=0").unwrap();
        assert_eq!(t.to_string(), "switch:ranks=4,bw=50GB/s,lat=1us");
    }
}
