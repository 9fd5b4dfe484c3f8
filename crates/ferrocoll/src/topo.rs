//! Topology of a group: how its ranks nest into nodes (and racks, ...).
//!
//! A topology is a list of level sizes, outermost first: `2x4` is 2 nodes of
//! 4 ranks, `2x2x2` is 2 racks of 2 nodes of 2 ranks. Ranks are placed in
//! blocks, innermost level fastest: rank `r` of `2x4` is local rank `r % 4` of
//! node `r / 4`. A flat topology (`8`, one level) says nothing about
//! placement. The hierarchical, torus and mesh algorithms read it; every
//! other algorithm ignores it.
//!
//! The hierarchical algorithms pair local rank `i` of one node with local
//! rank `i` of every other node (the seeds' rail alignment), so each inter-node
//! step runs on `L` disjoint sets of ranks at once.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// Level sizes of a group, outermost first. The product is the group size.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Topology {
    levels: Vec<usize>,
}

impl Topology {
    /// One level of `n` ranks: no structure.
    pub fn flat(n: usize) -> Topology {
        Topology { levels: vec![n] }
    }

    /// A topology from level sizes (outermost first); each must be at least 1.
    pub fn new(levels: Vec<usize>) -> Result<Topology> {
        if levels.is_empty() || levels.contains(&0) {
            return Err(Error::invalid(format!(
                "a topology needs one or more levels of at least one rank each, got {levels:?}; \
                 give level sizes outermost first, e.g. 2x4 (2 nodes of 4 ranks)"
            )));
        }
        if levels
            .iter()
            .try_fold(1usize, |a, &l| a.checked_mul(l))
            .is_none()
        {
            return Err(Error::invalid(format!(
                "a topology of levels {levels:?} has more ranks than can be counted; give the \
                 level sizes of the real group, e.g. 2x4"
            )));
        }
        Ok(Topology { levels })
    }

    /// The level sizes, outermost first.
    pub fn levels(&self) -> &[usize] {
        &self.levels
    }

    /// Number of ranks (the product of the levels).
    pub fn size(&self) -> usize {
        self.levels.iter().product()
    }

    /// Ranks per node: the innermost level.
    pub fn local_size(&self) -> usize {
        *self.levels.last().expect("at least one level")
    }

    /// Number of nodes: the product of the outer levels.
    pub fn nodes(&self) -> usize {
        self.size() / self.local_size()
    }

    /// Checks that the topology describes a group of `n` ranks.
    pub fn check_size(&self, n: usize) -> Result<()> {
        if self.size() != n {
            let (rows, cols) = Topology::flat(n.max(1)).grid();
            return Err(Error::invalid(format!(
                "topology {self} has {} ranks but the group has {n}; give levels whose product is {n} \
                 (e.g. FERROCOLL_TOPO={rows}x{cols})",
                self.size(),
            )));
        }
        Ok(())
    }

    /// The two dimensions (rows, columns) the 2-D algorithms use: the
    /// product of the outer levels by the innermost level; a flat topology is
    /// factored as close to square as its size allows (rows <= columns; a
    /// prime size gives 1 x n).
    pub fn grid(&self) -> (usize, usize) {
        if self.levels.len() > 1 {
            return (self.nodes(), self.local_size());
        }
        let n = self.size();
        let rows = (1..=n)
            .take_while(|r| r * r <= n)
            .filter(|r| n % r == 0)
            .last()
            .unwrap_or(1);
        (rows, n / rows)
    }

    /// The topology of a subset of this group's ranks (for `split`): two
    /// levels (nodes x ranks per node) when every node present holds the same
    /// number of members, otherwise flat. `members` are ranks of this group
    /// in their new order.
    pub fn subgroup(&self, members: &[usize]) -> Topology {
        let local = self.local_size();
        // Runs of consecutive members on the same node.
        let mut runs: Vec<(usize, usize)> = Vec::new();
        for &m in members {
            match runs.last_mut() {
                Some((node, count)) if *node == m / local => *count += 1,
                _ => runs.push((m / local, 1)),
            }
        }
        let mut nodes: Vec<usize> = runs.iter().map(|r| r.0).collect();
        nodes.sort_unstable();
        nodes.dedup();
        let per_node = runs.first().map_or(0, |r| r.1);
        let uniform = runs.iter().all(|r| r.1 == per_node);
        if runs.len() > 1 && per_node > 1 && nodes.len() == runs.len() && uniform {
            Topology {
                levels: vec![runs.len(), per_node],
            }
        } else {
            Topology::flat(members.len())
        }
    }
}

impl fmt::Display for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.levels.iter().map(|l| l.to_string()).collect();
        f.write_str(&parts.join("x"))
    }
}

impl FromStr for Topology {
    type Err = Error;
    /// Parses `2x4`, `2x2x2` or `8`.
    fn from_str(s: &str) -> Result<Topology> {
        let levels: std::result::Result<Vec<usize>, _> = s
            .trim()
            .split(['x', 'X'])
            .map(|p| p.trim().parse::<usize>())
            .collect();
        match levels {
            Ok(l) => Topology::new(l),
            Err(_) => Err(Error::invalid(format!(
                "cannot read topology `{s}`; write level sizes outermost first, e.g. 2x4 (2 nodes of 4 ranks) or 2x2x2"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_describes() {
        let t: Topology = "2x4".parse().unwrap();
        assert_eq!((t.size(), t.nodes(), t.local_size()), (8, 2, 4));
        assert_eq!(t.to_string(), "2x4");
        assert_eq!("2x2x2".parse::<Topology>().unwrap().nodes(), 4);
        assert!("2x0".parse::<Topology>().is_err());
        assert!("two".parse::<Topology>().is_err());
        assert!("18446744073709551615x2".parse::<Topology>().is_err());
        assert!(t.check_size(6).is_err());
    }

    #[test]
    fn grids_are_near_square() {
        assert_eq!(Topology::flat(12).grid(), (3, 4));
        assert_eq!(Topology::flat(9).grid(), (3, 3));
        assert_eq!(Topology::flat(7).grid(), (1, 7));
        assert_eq!("2x4".parse::<Topology>().unwrap().grid(), (2, 4));
    }

    #[test]
    fn subgroups_keep_whole_nodes() {
        let t: Topology = "2x4".parse().unwrap();
        assert_eq!(t.subgroup(&[0, 2, 4, 6]).levels(), &[2, 2]);
        assert_eq!(t.subgroup(&[0, 1, 2, 4]).levels(), &[4]);
        assert_eq!(t.subgroup(&[0, 1, 2, 3]).levels(), &[4]);
    }
}
