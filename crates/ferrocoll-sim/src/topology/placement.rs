//! Where the plan's ranks sit on the physical positions: the [`Placement`]
//! of a topology (`block`, `roundrobin`, `random:SEED`, `list:...`).

use std::fmt;

/// Where the ranks of a plan sit on the cluster: rank `r` runs at physical
/// position `p(r)` (see [`Placement::positions`]). The topology's own
/// numbering of positions is the block one documented on [`TopologySpec`];
/// the plans are always told that block structure
/// ([`TopologySpec::plan_topology`]), so any other placement shows what a
/// launcher that places ranks differently from what the algorithms assume
/// costs (the rank-mapping pitfall of `ferrocoll::plan::hier`).
///
/// [`TopologySpec`]: super::TopologySpec
/// [`TopologySpec::plan_topology`]: super::TopologySpec::plan_topology
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
    /// [`TopologySpec::parse`](super::TopologySpec::parse) rejects those.
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

    pub(super) fn parse(v: &str) -> Result<Placement, String> {
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
pub(super) fn check_permutation(list: &[usize], n: usize) -> Result<(), String> {
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
