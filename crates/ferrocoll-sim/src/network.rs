//! The links of a modelled cluster and the path a message takes over them.
//!
//! Every link is one direction of one port (a rank's port into its switch,
//! the switch's port down to the rank, a leaf's aggregate uplink to the
//! spine, a ring or torus link from one station to its neighbour, ...), with
//! a bandwidth and a latency. Latency is paid on entering a switch: it sits
//! on the links whose far end is a switch, so a path's latency is the number
//! of switches it crosses times their latency (one for `switch` and inside a
//! `two-level` or `rail` node or a leaf, three between leaves of a
//! `fat-tree`, NVSwitch plus rail switch for a `rail` PXN path), and the
//! links down to a rank have none. On `ring` and `torus` every link ends at a
//! station that forwards, so every hop pays the link's latency.
//!
//! Links belong to physical positions; [`Network::new`] applies the
//! topology's [`Placement`](crate::topology::Placement), so
//! [`Network::path`] takes ranks and routes between their positions. Link
//! names (`up[p]`, `nic-up[p]`, ...) carry the position.
//!
//! Link layout (n positions, l leaves, g GPUs per node):
//!
//! | kind      | links                                                                 |
//! |-----------|-----------------------------------------------------------------------|
//! | switch    | `up[p]` = p, `down[p]` = n + p                                        |
//! | two-level | `nvlink-up[p]`, `nvlink-down[p]`, `nic-up[p]`, `nic-down[p]`: k·n + p |
//! | fat-tree  | `up[p]`, `down[p]`, then `leaf-up[j]` = 2n + j, `leaf-down[j]` = 2n + l + j |
//! | rail      | as two-level; `nic-up[p]` enters, `nic-down[p]` leaves rail switch p % g |
//! | ring      | `cw[p]` = p (p to p+1), `ccw[p]` = n + p (p to p-1)                   |
//! | torus     | `x+[p]`, `x-[p]`, `y+[p]`, `y-[p]` (, `z+[p]`, `z-[p]`): k·n + p      |
//!
//! Routes:
//!
//! * `rail`, between nodes from GPU `i` to GPU `j`: `nic-up[src]`,
//!   `nic-down[dst]` when `i == j`; otherwise (PXN) `nvlink-up[src]`,
//!   `nvlink-down[q]`, `nic-up[q]`, `nic-down[dst]` with `q` GPU `j` of the
//!   source node.
//! * `ring`: the `cw` links from `src` to `dst` when that is at most half
//!   way round, else the `ccw` links.
//! * `torus`: dimension order, x then y then z, in each the shorter way
//!   round (`+` on a tie).

use std::sync::Arc;

use crate::graph::GraphSpec;
use crate::symmetry::{Symmetry, SymmetryKind};
use crate::topology::TopologySpec;

/// One direction of one port.
#[derive(Clone, Debug, PartialEq)]
pub struct Link {
    /// Index into [`Network::classes`].
    pub class: usize,
    /// Bytes per second.
    pub bw: f64,
    /// Seconds paid by every message (every chunk) that crosses the link.
    pub lat: f64,
}

/// Links a [`Path`] holds without allocating.
const INLINE: usize = 6;

/// The route of one message: the link ids it crosses (up to six held
/// inline, longer ring and torus routes on the heap).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Path {
    inline: [u32; INLINE],
    len: u8,
    spill: Vec<u32>,
}

impl Path {
    fn new() -> Path {
        Path {
            inline: [0; INLINE],
            len: 0,
            spill: Vec::new(),
        }
    }

    fn of(ids: &[usize]) -> Path {
        let mut p = Path::new();
        for &id in ids {
            p.push(id);
        }
        p
    }

    fn push(&mut self, id: usize) {
        let id = id as u32;
        let len = usize::from(self.len);
        if self.spill.is_empty() && len < INLINE {
            self.inline[len] = id;
            self.len += 1;
        } else {
            if self.spill.is_empty() {
                self.spill.extend_from_slice(&self.inline[..len]);
            }
            self.spill.push(id);
        }
    }

    /// The link ids, from the sender's port to the receiver's.
    pub fn links(&self) -> &[u32] {
        if self.spill.is_empty() {
            &self.inline[..usize::from(self.len)]
        } else {
            &self.spill
        }
    }
}

/// How positions are wired, for routing.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Wiring {
    Switch,
    TwoLevel {
        gpus: usize,
    },
    FatTree {
        leaf: usize,
        leaves: usize,
    },
    Rail {
        gpus: usize,
    },
    Ring,
    /// Dimension sizes, x first; unused ones are 1.
    Torus {
        dims: [usize; 3],
    },
    /// A file's graph (`Network::graph`), routed by its table.
    Graph,
}

/// The links of a cluster and its routing.
#[derive(Clone, Debug, PartialEq)]
pub struct Network {
    /// Every link; ids index this vector.
    pub links: Vec<Link>,
    /// Names of the link classes (`up`, `down`, `nvlink-up`, `leaf-up`, ...).
    pub classes: Vec<String>,
    ranks: usize,
    wiring: Wiring,
    /// Rank to physical position.
    pos: Vec<usize>,
    /// The graph of a `file:` topology.
    graph: Option<Arc<GraphSpec>>,
}

impl Network {
    /// The links of `spec` (see the module docs for the layout), with its
    /// placement applied to routing.
    pub fn new(spec: &TopologySpec) -> Network {
        let n = spec.ranks();
        let mut links = Vec::new();
        let mut classes = Vec::new();
        let mut class = |name: &str, count: usize, bw: f64, lat: f64, links: &mut Vec<Link>| {
            let c = classes.len();
            classes.push(name.to_string());
            links.extend((0..count).map(|_| Link { class: c, bw, lat }));
        };
        let wiring = match spec {
            TopologySpec::Switch { link, .. } => {
                class("up", n, link.bw, link.lat, &mut links);
                class("down", n, link.bw, 0.0, &mut links);
                Wiring::Switch
            }
            TopologySpec::TwoLevel {
                gpus, intra, inter, ..
            }
            | TopologySpec::Rail {
                gpus, intra, inter, ..
            } => {
                class("nvlink-up", n, intra.bw, intra.lat, &mut links);
                class("nvlink-down", n, intra.bw, 0.0, &mut links);
                class("nic-up", n, inter.bw, inter.lat, &mut links);
                class("nic-down", n, inter.bw, 0.0, &mut links);
                if matches!(spec, TopologySpec::Rail { .. }) {
                    Wiring::Rail { gpus: *gpus }
                } else {
                    Wiring::TwoLevel { gpus: *gpus }
                }
            }
            TopologySpec::FatTree {
                leaf,
                link,
                oversub,
                ..
            } => {
                let leaves = n / leaf;
                let agg = *leaf as f64 * link.bw / oversub;
                class("up", n, link.bw, link.lat, &mut links);
                class("down", n, link.bw, 0.0, &mut links);
                class("leaf-up", leaves, agg, link.lat, &mut links);
                class("leaf-down", leaves, agg, link.lat, &mut links);
                Wiring::FatTree {
                    leaf: *leaf,
                    leaves,
                }
            }
            TopologySpec::Ring { link, .. } => {
                class("cw", n, link.bw, link.lat, &mut links);
                class("ccw", n, link.bw, link.lat, &mut links);
                Wiring::Ring
            }
            TopologySpec::Torus { dims, link, .. } => {
                let mut d = [1; 3];
                for (k, &size) in dims.iter().take(3).enumerate() {
                    d[k] = size;
                    for dir in ["+", "-"] {
                        let name = format!("{}{dir}", ["x", "y", "z"][k]);
                        class(&name, n, link.bw, link.lat, &mut links);
                    }
                }
                Wiring::Torus { dims: d }
            }
            TopologySpec::File { graph, .. } => {
                classes.extend(graph.classes.iter().cloned());
                links.extend(graph.links.iter().map(|l| Link {
                    class: l.class,
                    bw: l.bw,
                    lat: l.lat,
                }));
                Wiring::Graph
            }
        };
        Network {
            links,
            classes,
            ranks: n,
            wiring,
            pos: spec.positions(),
            graph: match spec {
                TopologySpec::File { graph, .. } => Some(graph.clone()),
                _ => None,
            },
        }
    }

    /// Number of ranks.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// The physical position of rank `rank` (see
    /// [`TopologySpec::positions`]).
    pub fn position(&self, rank: usize) -> usize {
        self.pos[rank]
    }

    /// The links a message from rank `src` to rank `dst` crosses, in order;
    /// empty when `src == dst`. The first link is always `src`'s own port
    /// and the last `dst`'s, which is what the ideal mode serializes on.
    pub fn path(&self, src: usize, dst: usize) -> Path {
        let n = self.ranks;
        if src == dst {
            return Path::new();
        }
        let (src, dst) = (self.pos[src], self.pos[dst]);
        match self.wiring {
            Wiring::Switch => Path::of(&[src, n + dst]),
            Wiring::TwoLevel { gpus } => {
                if src / gpus == dst / gpus {
                    Path::of(&[src, n + dst])
                } else {
                    Path::of(&[2 * n + src, 3 * n + dst])
                }
            }
            Wiring::FatTree { leaf, leaves } => {
                let (a, b) = (src / leaf, dst / leaf);
                if a == b {
                    Path::of(&[src, n + dst])
                } else {
                    Path::of(&[src, 2 * n + a, 2 * n + leaves + b, n + dst])
                }
            }
            Wiring::Rail { gpus } => {
                let (node, j) = (src / gpus, dst % gpus);
                if node == dst / gpus {
                    Path::of(&[src, n + dst])
                } else if src % gpus == j {
                    Path::of(&[2 * n + src, 3 * n + dst])
                } else {
                    // PXN: over NVLink to GPU j of this node, then rail j.
                    let proxy = node * gpus + j;
                    Path::of(&[src, n + proxy, 2 * n + proxy, 3 * n + dst])
                }
            }
            Wiring::Ring => {
                let cw = (dst + n - src) % n;
                let mut path = Path::new();
                if cw <= n - cw {
                    for k in 0..cw {
                        path.push((src + k) % n);
                    }
                } else {
                    for k in 0..n - cw {
                        path.push(n + (src + n - k) % n);
                    }
                }
                path
            }
            Wiring::Torus { dims } => {
                let mut path = Path::new();
                let mut at = src;
                let mut stride = 1;
                for (k, &d) in dims.iter().enumerate() {
                    let coord = |p: usize| p / stride % d;
                    let delta = (coord(dst) + d - coord(at)) % d;
                    let (steps, class, step): (usize, usize, isize) = if delta <= d - delta {
                        (delta, 2 * k, 1)
                    } else {
                        (d - delta, 2 * k + 1, -1)
                    };
                    for _ in 0..steps {
                        path.push(class * n + at);
                        let c = coord(at);
                        let next = (c as isize + step).rem_euclid(d as isize) as usize;
                        at = at - c * stride + next * stride;
                    }
                    stride *= d;
                }
                debug_assert_eq!(at, dst);
                path
            }
            Wiring::Graph => {
                let mut path = Path::new();
                if let Some(g) = &self.graph {
                    for l in g.route(src, dst) {
                        path.push(l as usize);
                    }
                }
                path
            }
        }
    }

    /// Whether link `id` is a receiver's port: the last link of every path
    /// that crosses it, and of paths to one rank only (the switch's port
    /// down to a rank: `down` of `switch` and `fat-tree`, `nvlink-down` and
    /// `nic-down` of `two-level`, `nic-down` of `rail`, whose `nvlink-down`
    /// also carries PXN traffic on to a NIC). Such a link carries only the
    /// messages its rank receives, which lets the engine lay out a message's
    /// chunks on it at once when nothing else can reach it meanwhile. False
    /// for rings, tori and files, whose links forward.
    pub fn is_receiver_port(&self, id: usize) -> bool {
        let class = self.links[id].class;
        match self.wiring {
            Wiring::Switch | Wiring::FatTree { .. } => class == 1,
            Wiring::TwoLevel { .. } => class == 1 || class == 3,
            Wiring::Rail { .. } => class == 3,
            Wiring::Ring | Wiring::Torus { .. } | Wiring::Graph => false,
        }
    }

    /// A readable name of link `id`, e.g. `leaf-up[3]`.
    pub fn link_name(&self, id: usize) -> String {
        let class = self.links[id].class;
        let first = self
            .links
            .iter()
            .position(|l| l.class == class)
            .unwrap_or(0);
        format!("{}[{}]", self.classes[class], id - first)
    }

    /// Number of links of class `class`.
    pub fn class_size(&self, class: usize) -> usize {
        self.links.iter().filter(|l| l.class == class).count()
    }

    /// Whether every permutation of `sym` is an automorphism of the
    /// network as the ranks see it: routes map to routes, link for link
    /// (of equal bandwidth and latency), and the placement commutes with
    /// it. Shifts by a multiple of the GPUs per node (`two-level`, `rail`),
    /// of the leaf size (`fat-tree`), of any period (`switch`, `ring`), or
    /// of the stride of a torus's outermost dimension; exclusive-ors on the
    /// same terms except on `ring` and `torus`, whose neighbour links they
    /// do not preserve. See [`crate::symmetry`].
    pub fn admits(&self, sym: &Symmetry) -> bool {
        let (k, n) = (sym.period, self.ranks);
        if !sym.is_valid() || sym.ranks != n {
            return false;
        }
        let xor = sym.kind == SymmetryKind::Xor;
        let wiring = match self.wiring {
            Wiring::Switch => true,
            Wiring::TwoLevel { gpus } | Wiring::Rail { gpus } => k % gpus == 0,
            Wiring::FatTree { leaf, .. } => k % leaf == 0,
            Wiring::Ring => !xor,
            // Nothing is known of a file's symmetries.
            Wiring::Graph => false,
            Wiring::Torus { dims } => {
                // Shifting by the outermost used dimension's stride moves
                // every station one step along that dimension only.
                let last = dims.iter().rposition(|&d| d > 1).unwrap_or(0);
                let stride: usize = dims[..last].iter().product();
                !xor && k % stride == 0
            }
        };
        if !wiring {
            return false;
        }
        // The placement must commute with the group's generators: sigma_1
        // for shifts, the single-bit exclusive-ors for xor.
        let generators: Vec<usize> = match sym.kind {
            SymmetryKind::Shift => vec![1],
            SymmetryKind::Xor => (0..)
                .map(|b| 1usize << b)
                .take_while(|&j| j < sym.copies())
                .collect(),
        };
        generators
            .iter()
            .all(|&j| (0..n).all(|r| self.pos[sym.apply(j, r)] == sym.apply(j, self.pos[r])))
    }

    /// For every link, the representative of its orbit under `sym` (which
    /// the network must [admit](Network::admits)): the link of its class
    /// whose index is its own modulo the class's links per period. A class
    /// of c links has one per n / c positions (per rank, or per leaf), so
    /// a period of k positions spans k·c / n of them.
    pub fn link_reps(&self, sym: &Symmetry) -> Vec<u32> {
        self.link_orbits(sym)
            .into_iter()
            .map(|(rep, _)| rep)
            .collect()
    }

    /// For every link l, its orbit's representative ρ ([`Network::link_reps`])
    /// and the t with l = σ_t(ρ): σ_1 moves a link of a class of c links
    /// k·c / n places along its class (mod c), so t is the link's distance
    /// from ρ in those steps. For an exclusive-or, σ_t moves it to index
    /// ρ xor t·(k·c / n), and t is the same quotient.
    pub fn link_orbits(&self, sym: &Symmetry) -> Vec<(u32, u32)> {
        let n = self.ranks;
        let mut first = vec![usize::MAX; self.classes.len()];
        for (i, l) in self.links.iter().enumerate() {
            first[l.class] = first[l.class].min(i);
        }
        let sizes: Vec<usize> = (0..self.classes.len())
            .map(|c| self.class_size(c))
            .collect();
        self.links
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let c = l.class;
                let per_period = (sym.period * sizes[c] / n).max(1);
                let at = i - first[c];
                (
                    (first[c] + at % per_period) as u32,
                    (at / per_period) as u32,
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> Network {
        Network::new(&TopologySpec::parse(s).unwrap())
    }

    #[test]
    fn fat_tree_routes_through_the_spine_between_leaves() {
        let f = net("fat-tree:ranks=16,leaf=4,bw=50GB/s,lat=1us,oversub=2");
        assert_eq!(f.links.len(), 2 * 16 + 2 * 4);
        assert_eq!(f.path(1, 2).links(), &[1, 16 + 2]);
        assert_eq!(f.path(1, 6).links(), &[1, 32, 32 + 4 + 1, 16 + 6]);
        assert_eq!(f.link_name(32 + 4 + 1), "leaf-down[1]");
        assert_eq!(f.links[32].bw, 4.0 * 50e9 / 2.0);
        let lat: f64 = f
            .path(1, 6)
            .links()
            .iter()
            .map(|&l| f.links[l as usize].lat)
            .sum();
        assert!((lat - 3e-6).abs() < 1e-15);
        assert_eq!(f.class_size(2), 4);
        assert!(f.path(3, 3).links().is_empty());
    }

    #[test]
    fn two_level_uses_nvlink_inside_and_nics_between_nodes() {
        let t = net("two-level:nodes=2,gpus=4,intra=450GB/s@1us,inter=25GB/s@2us");
        assert_eq!(t.path(0, 3).links(), &[0, 8 + 3]);
        assert_eq!(t.path(3, 4).links(), &[16 + 3, 24 + 4]);
        assert_eq!(t.link_name(16 + 3), "nic-up[3]");
        assert_eq!(t.links[t.path(3, 4).links()[0] as usize].bw, 25e9);
        let s = net("switch:ranks=4,bw=50GB/s,lat=2us");
        assert_eq!(s.path(2, 1).links(), &[2, 5]);
        assert_eq!(s.classes, ["up", "down"]);
    }

    #[test]
    fn rail_crosses_nvlink_only_between_rails() {
        let r = net("rail:nodes=2,gpus=4,intra=450GB/s@1us,inter=50GB/s@2us");
        assert_eq!(
            r.classes,
            ["nvlink-up", "nvlink-down", "nic-up", "nic-down"]
        );
        assert_eq!(r.path(1, 2).links(), &[1, 8 + 2]);
        assert_eq!(r.path(1, 5).links(), &[16 + 1, 24 + 5]);
        // GPU 1 of node 0 to GPU 2 of node 1: NVLink to GPU 2, then rail 2.
        assert_eq!(r.path(1, 6).links(), &[1, 8 + 2, 16 + 2, 24 + 6]);
        let lat: f64 = r
            .path(1, 6)
            .links()
            .iter()
            .map(|&l| r.links[l as usize].lat)
            .sum();
        assert!((lat - 3e-6).abs() < 1e-15);
    }

    #[test]
    fn ring_takes_the_shorter_way() {
        let r = net("ring:ranks=8,bw=50GB/s,lat=1us");
        assert_eq!(r.classes, ["cw", "ccw"]);
        assert_eq!(r.path(1, 3).links(), &[1, 2]);
        assert_eq!(r.path(1, 6).links(), &[8 + 1, 8, 8 + 7]);
        assert_eq!(r.path(0, 4).links(), &[0, 1, 2, 3]);
        assert_eq!(r.path(7, 0).links(), &[7]);
        assert_eq!(r.link_name(8 + 7), "ccw[7]");
        let long = net("ring:ranks=20,bw=50GB/s,lat=1us");
        assert_eq!(long.path(3, 13).links(), &[3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
        assert_eq!(long.path(3, 14).links().len(), 9);
        assert_eq!(long.path(3, 14).links()[0], 20 + 3);
    }

    #[test]
    fn torus_routes_x_then_y_then_z() {
        let t = net("torus:dims=4x4,bw=50GB/s,lat=1us");
        assert_eq!(t.classes, ["x+", "x-", "y+", "y-"]);
        assert_eq!(t.links.len(), 4 * 16);
        // (0,0) -> (1,1): x+ from 0, then y+ from (1,0).
        assert_eq!(t.path(0, 5).links(), &[0, 2 * 16 + 1]);
        // (0,0) -> (3,3): one hop back in each dimension.
        assert_eq!(t.path(0, 15).links(), &[16, 3 * 16 + 3]);
        // (0,0) -> (2,2): ties go +.
        assert_eq!(t.path(0, 10).links(), &[0, 1, 32 + 2, 32 + 6]);
        let t3 = net("torus:dims=4x4x4,bw=50GB/s,lat=1us");
        assert_eq!(t3.classes.len(), 6);
        // (0,0,0) -> (2,2,2): six hops, x first.
        let p = t3.path(0, 42);
        assert_eq!(p.links(), &[0, 1, 128 + 2, 128 + 6, 256 + 10, 256 + 26]);
        assert_eq!(t3.link_name(256 + 26), "z+[26]");
    }

    #[test]
    fn receiver_ports_and_link_orbits() {
        let s = net("switch:ranks=4,bw=50GB/s,lat=2us");
        assert!(!s.is_receiver_port(1) && s.is_receiver_port(4 + 1));
        let r = net("rail:nodes=2,gpus=4,intra=450GB/s@1us,inter=50GB/s@2us");
        // PXN forwards through a GPU's NVLink port; only the NICs' down
        // ports end every path that crosses them.
        assert!(!r.is_receiver_port(8 + 2) && r.is_receiver_port(24 + 2));
        assert!(!net("ring:ranks=8,bw=50GB/s,lat=1us").is_receiver_port(8 + 1));
        let f = net("fat-tree:ranks=16,leaf=4,bw=50GB/s,lat=1us,oversub=2");
        let sym = Symmetry {
            kind: SymmetryKind::Shift,
            period: 4,
            ranks: 16,
        };
        let orbits = f.link_orbits(&sym);
        assert_eq!(orbits[5], (1, 1));
        assert_eq!(orbits[16 + 14], (16 + 2, 3));
        assert_eq!(orbits[32 + 2], (32, 2));
        assert_eq!(
            f.link_reps(&sym),
            orbits.iter().map(|o| o.0).collect::<Vec<_>>()
        );
    }

    #[test]
    fn placement_moves_ranks() {
        let s = net("switch:ranks=4,bw=50GB/s,lat=2us,placement=list:3,1,0,2");
        assert_eq!(s.path(0, 1).links(), &[3, 4 + 1]);
        assert_eq!(s.position(3), 2);
        // Round robin on 2 nodes of 4: rank r on node r % 2, slot r / 2.
        let t =
            net("two-level:nodes=2,gpus=4,intra=450GB/s@1us,inter=25GB/s@2us,placement=roundrobin");
        assert_eq!(
            (0..8).map(|r| t.position(r)).collect::<Vec<_>>(),
            [0, 4, 1, 5, 2, 6, 3, 7]
        );
        assert_eq!(t.path(0, 1).links(), &[16, 24 + 4]);
        assert_eq!(t.path(0, 2).links(), &[0, 8 + 1]);
    }
}
