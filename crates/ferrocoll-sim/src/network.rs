//! The links of a modelled cluster and the path a message takes over them.
//!
//! Every link is one direction of one port (a rank's port into its switch,
//! the switch's port down to the rank, a leaf's aggregate uplink to the
//! spine, ...), with a bandwidth and a latency. Latency is paid on entering a
//! switch: it sits on the links whose far end is a switch, so a path's
//! latency is the number of switches it crosses times their latency (one for
//! `switch` and inside a `two-level` node or a leaf, three between leaves of a
//! `fat-tree`), and the links down to a rank have none.
//!
//! Link layout (n ranks, l leaves):
//!
//! | kind      | links                                                                 |
//! |-----------|-----------------------------------------------------------------------|
//! | switch    | `up[r]` = r, `down[r]` = n + r                                        |
//! | two-level | `nvlink-up[r]`, `nvlink-down[r]`, `nic-up[r]`, `nic-down[r]`: k·n + r |
//! | fat-tree  | `up[r]`, `down[r]`, then `leaf-up[j]` = 2n + j, `leaf-down[j]` = 2n + l + j |

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

/// The route of one message: up to four link ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Path {
    links: [u32; 4],
    len: u8,
}

impl Path {
    fn of(ids: &[usize]) -> Path {
        let mut links = [0u32; 4];
        for (slot, &id) in links.iter_mut().zip(ids) {
            *slot = id as u32;
        }
        Path {
            links,
            len: ids.len() as u8,
        }
    }

    /// The link ids, from the sender's port to the receiver's.
    pub fn links(&self) -> &[u32] {
        &self.links[..usize::from(self.len)]
    }
}

/// How ranks are wired, for routing.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Wiring {
    Switch,
    TwoLevel { gpus: usize },
    FatTree { leaf: usize, leaves: usize },
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
}

impl Network {
    /// The links of `spec` (see the module docs for the layout).
    pub fn new(spec: &TopologySpec) -> Network {
        let n = spec.ranks();
        let mut links = Vec::new();
        let mut classes = Vec::new();
        let mut class = |name: &str, count: usize, bw: f64, lat: f64, links: &mut Vec<Link>| {
            let c = classes.len();
            classes.push(name.to_string());
            links.extend((0..count).map(|_| Link { class: c, bw, lat }));
        };
        let wiring = match *spec {
            TopologySpec::Switch { link, .. } => {
                class("up", n, link.bw, link.lat, &mut links);
                class("down", n, link.bw, 0.0, &mut links);
                Wiring::Switch
            }
            TopologySpec::TwoLevel {
                gpus, intra, inter, ..
            } => {
                class("nvlink-up", n, intra.bw, intra.lat, &mut links);
                class("nvlink-down", n, intra.bw, 0.0, &mut links);
                class("nic-up", n, inter.bw, inter.lat, &mut links);
                class("nic-down", n, inter.bw, 0.0, &mut links);
                Wiring::TwoLevel { gpus }
            }
            TopologySpec::FatTree {
                leaf,
                link,
                oversub,
                ..
            } => {
                let leaves = n / leaf;
                let agg = leaf as f64 * link.bw / oversub;
                class("up", n, link.bw, link.lat, &mut links);
                class("down", n, link.bw, 0.0, &mut links);
                class("leaf-up", leaves, agg, link.lat, &mut links);
                class("leaf-down", leaves, agg, link.lat, &mut links);
                Wiring::FatTree { leaf, leaves }
            }
        };
        Network {
            links,
            classes,
            ranks: n,
            wiring,
        }
    }

    /// Number of ranks.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// The links a message from `src` to `dst` crosses, in order; empty when
    /// `src == dst`. The first link is always `src`'s own port and the last
    /// `dst`'s, which is what the ideal mode serializes on.
    pub fn path(&self, src: usize, dst: usize) -> Path {
        let n = self.ranks;
        if src == dst {
            return Path::of(&[]);
        }
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
}
