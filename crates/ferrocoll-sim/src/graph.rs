//! Topologies from a file: any graph of ranks and switches, written link by
//! link, routed by shortest paths (`--topology file:PATH`).
//!
//! ```text
//! # Two leaf switches of four ranks under one spine, 2:1 oversubscribed.
//! ranks 8
//! switch leaf0 leaf1 spine
//! link r0-r3 leaf0 50GB/s 0.5us          # one link per rank of the range
//! link r4-r7 leaf1 50GB/s 0.5us
//! link leaf0 spine 100GB/s 1us class=uplink
//! link leaf1 spine 100GB/s 1us class=uplink
//! plan 2x4                               # optional: nodes x ranks per node
//! ```
//!
//! * `ranks N` (first): the ranks are the nodes `r0` .. `r{N-1}`, which are
//!   the physical positions a `placement=` maps the plans' ranks to.
//! * `switch NAME...`: switches (any names but `r<number>`), declared before
//!   the links that use them.
//! * `link A B BW LAT [class=NAME]`: a full-duplex link, i.e. one link from
//!   A to B and one from B to A, each of bandwidth BW (`50GB/s`, `400Gb/s`)
//!   and latency LAT (`1us`), which every message (every chunk) crossing it
//!   pays. A or B may be a range `rI-rJ`: one link per rank of it to the
//!   other end; when both are ranges of the same length the ranks pair up in
//!   order (`link r0-r6 r1-r7 ...` strings a chain). Classes: with
//!   `class=NAME` the A-to-B links are `NAME-up` and the others `NAME-down`;
//!   without, a rank's link to a switch is `up` (and `down` back), a link
//!   between switches `fabric-up`/`fabric-down`, between ranks
//!   `peer-up`/`peer-down`. Link `k` of a class is named `class[k]`, in the
//!   order written.
//! * `plan L1xL2...` (optional): the node structure the topology-aware
//!   algorithms (hier, torus2d, mesh2d) plan for, outermost level first; its
//!   product must be N. Without it they see a flat group.
//!
//! A message from rank a to rank b follows a shortest path in links (ranks
//! may forward, so a ring of ranks works); among equally short ones it
//! takes, at every node, the first link in the order written. Every rank
//! must reach every other within 255 links. The routes of all pairs are
//! computed once: N x (nodes) entries, at most 2^26.

use std::collections::{HashMap, VecDeque};

use crate::topology::{parse_bandwidth, parse_latency, MAX_HOPS};

/// Route table entries a file topology may need (ranks x nodes).
const MAX_ROUTE_ENTRIES: usize = 1 << 26;

/// One direction of one link of a [`GraphSpec`].
#[derive(Clone, Debug, PartialEq)]
pub struct GraphLink {
    /// Node the link leaves (ranks are nodes `0..ranks`).
    pub from: u32,
    /// Node it enters.
    pub to: u32,
    /// Index into [`GraphSpec::classes`].
    pub class: usize,
    /// Bytes per second.
    pub bw: f64,
    /// Seconds paid by every message that crosses it.
    pub lat: f64,
}

/// A topology read from a file (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct GraphSpec {
    /// Number of ranks (nodes `0..ranks`).
    pub ranks: usize,
    /// Names of all nodes: `r0`.. then the switches.
    pub nodes: Vec<String>,
    /// Every directed link, grouped by class (the links of a class are
    /// contiguous, in the order written).
    pub links: Vec<GraphLink>,
    /// Class names, in order of first use.
    pub classes: Vec<String>,
    /// The `plan` line's levels, outermost first.
    pub plan_levels: Option<Vec<usize>>,
    /// `next[d * nodes + v]`: the first link from node v towards rank d
    /// (`u32::MAX` at d itself).
    next: Vec<u32>,
}

impl GraphSpec {
    /// Parses the text of a topology file; errors name the line.
    pub fn parse(text: &str) -> Result<GraphSpec, String> {
        let mut ranks: Option<usize> = None;
        let mut nodes: Vec<String> = Vec::new();
        let mut index: HashMap<String, u32> = HashMap::new();
        let mut classes: Vec<String> = Vec::new();
        // (class, from, to, bw, lat) in the order written.
        let mut written: Vec<(usize, u32, u32, f64, f64)> = Vec::new();
        let mut plan_levels = None;
        for (i, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let at = |e: String| format!("line {}: {e}", i + 1);
            let words: Vec<&str> = line.split_whitespace().collect();
            match words[0] {
                "ranks" => {
                    if ranks.is_some() {
                        return Err(at("`ranks` given twice".into()));
                    }
                    let n = words
                        .get(1)
                        .and_then(|w| w.parse::<usize>().ok())
                        .filter(|&n| n >= 1 && words.len() == 2)
                        .ok_or_else(|| at("expected `ranks N` with N at least 1".into()))?;
                    for r in 0..n {
                        index.insert(format!("r{r}"), r as u32);
                        nodes.push(format!("r{r}"));
                    }
                    ranks = Some(n);
                }
                "switch" => {
                    if ranks.is_none() {
                        return Err(at("`ranks N` must come first".into()));
                    }
                    if words.len() < 2 {
                        return Err(at("expected `switch NAME...`".into()));
                    }
                    for &name in &words[1..] {
                        if is_rank_name(name) || index.contains_key(name) {
                            return Err(at(format!(
                                "switch `{name}`: the name is a rank's or already used"
                            )));
                        }
                        index.insert(name.to_string(), nodes.len() as u32);
                        nodes.push(name.to_string());
                    }
                }
                "link" => {
                    let n = ranks.ok_or_else(|| at("`ranks N` must come first".into()))?;
                    if !(5..=6).contains(&words.len()) {
                        return Err(at("expected `link A B BW LAT [class=NAME]`".into()));
                    }
                    let a = endpoint(words[1], n, &index).map_err(at)?;
                    let b = endpoint(words[2], n, &index).map_err(at)?;
                    let bw = parse_bandwidth(words[3]).map_err(at)?;
                    let lat = parse_latency(words[4]).map_err(at)?;
                    let class = match words.get(5) {
                        None => None,
                        Some(w) => Some(
                            w.strip_prefix("class=")
                                .filter(|c| !c.is_empty())
                                .ok_or_else(|| at(format!("`{w}`: expected class=NAME")))?,
                        ),
                    };
                    let pairs: Vec<(u32, u32)> = match (a.len(), b.len()) {
                        (1, _) => b.iter().map(|&y| (a[0], y)).collect(),
                        (_, 1) => a.iter().map(|&x| (x, b[0])).collect(),
                        (p, q) if p == q => a.iter().copied().zip(b.iter().copied()).collect(),
                        _ => {
                            return Err(at("two ranges of different lengths cannot pair up".into()))
                        }
                    };
                    for (x, y) in pairs {
                        if x == y {
                            return Err(at(format!("a link from {} to itself", nodes[x as usize])));
                        }
                        let (fwd, back) = class_names(class, x as usize >= n, y as usize >= n);
                        let mut id = |name: String| match classes.iter().position(|c| *c == name) {
                            Some(c) => c,
                            None => {
                                classes.push(name);
                                classes.len() - 1
                            }
                        };
                        let (cf, cb) = (id(fwd), id(back));
                        written.push((cf, x, y, bw, lat));
                        written.push((cb, y, x, bw, lat));
                    }
                }
                "plan" => {
                    let levels = words
                        .get(1)
                        .filter(|_| words.len() == 2)
                        .and_then(|w| {
                            w.split('x')
                                .map(|d| d.parse::<usize>().ok().filter(|&d| d >= 1))
                                .collect::<Option<Vec<usize>>>()
                        })
                        .ok_or_else(|| at("expected `plan L1xL2...` (e.g. plan 4x8)".into()))?;
                    plan_levels = Some(levels);
                }
                other => {
                    return Err(at(format!(
                        "unknown statement `{other}`; use ranks, switch, link or plan"
                    )))
                }
            }
        }
        let n = ranks.ok_or("the file has no `ranks N` line")?;
        if let Some(levels) = &plan_levels {
            if levels.iter().product::<usize>() != n {
                return Err(format!(
                    "plan {}: the levels multiply to {}, not the {n} ranks",
                    levels
                        .iter()
                        .map(|l| l.to_string())
                        .collect::<Vec<_>>()
                        .join("x"),
                    levels.iter().product::<usize>()
                ));
            }
        }
        if n.saturating_mul(nodes.len()) > MAX_ROUTE_ENTRIES {
            return Err(format!(
                "{n} ranks x {} nodes need more than {MAX_ROUTE_ENTRIES} route entries; use a built-in topology for clusters this large",
                nodes.len()
            ));
        }
        // Links grouped by class (stable: the order written within each).
        written.sort_by_key(|w| w.0);
        let links: Vec<GraphLink> = written
            .into_iter()
            .map(|(class, from, to, bw, lat)| GraphLink {
                from,
                to,
                class,
                bw,
                lat,
            })
            .collect();
        let next = routes(n, &nodes, &links)?;
        Ok(GraphSpec {
            ranks: n,
            nodes,
            links,
            classes,
            plan_levels,
            next,
        })
    }

    /// The link ids from rank node `src` to rank node `dst` (empty when
    /// they are the same).
    pub fn route(&self, src: usize, dst: usize) -> impl Iterator<Item = u32> + '_ {
        let v = self.nodes.len();
        let mut at = src;
        std::iter::from_fn(move || {
            if at == dst {
                return None;
            }
            let l = self.next[dst * v + at];
            at = self.links[l as usize].to as usize;
            Some(l)
        })
    }

    /// The slowest bandwidth and the total latency from rank `a` to rank
    /// `b` (infinite and 0 when they are the same).
    pub fn bottleneck(&self, a: usize, b: usize) -> (f64, f64) {
        self.route(a, b).fold((f64::INFINITY, 0.0), |(bw, lat), l| {
            let link = &self.links[l as usize];
            (bw.min(link.bw), lat + link.lat)
        })
    }
}

/// Whether `name` is `r<number>`.
fn is_rank_name(name: &str) -> bool {
    name.strip_prefix('r')
        .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
}

/// The nodes an endpoint names: a rank `rK`, a range `rI-rJ`, a switch.
fn endpoint(word: &str, n: usize, index: &HashMap<String, u32>) -> Result<Vec<u32>, String> {
    let rank = |w: &str| -> Result<u32, String> {
        match w.strip_prefix('r').and_then(|d| d.parse::<usize>().ok()) {
            Some(r) if r < n => Ok(r as u32),
            _ => Err(format!("`{w}` is not a rank of r0..r{}", n - 1)),
        }
    };
    if let Some((lo, hi)) = word.split_once('-') {
        if is_rank_name(lo) && is_rank_name(hi) {
            let (lo, hi) = (rank(lo)?, rank(hi)?);
            if lo > hi {
                return Err(format!("range `{word}` runs backwards"));
            }
            return Ok((lo..=hi).collect());
        }
    }
    if is_rank_name(word) {
        return Ok(vec![rank(word)?]);
    }
    index
        .get(word)
        .map(|&v| vec![v])
        .ok_or_else(|| format!("`{word}` is neither a rank nor a declared switch"))
}

/// The classes of the two directions of a link from a node to another
/// (each a switch or not).
fn class_names(class: Option<&str>, a_switch: bool, b_switch: bool) -> (String, String) {
    if let Some(c) = class {
        return (format!("{c}-up"), format!("{c}-down"));
    }
    let (f, b) = match (a_switch, b_switch) {
        (false, true) => ("up", "down"),
        (true, false) => ("down", "up"),
        (true, true) => ("fabric-up", "fabric-down"),
        (false, false) => ("peer-up", "peer-down"),
    };
    (f.to_string(), b.to_string())
}

/// The first-hop table: for every rank d, a breadth-first search back from
/// d gives every node's distance; a node's next hop is its first link
/// (lowest id) to a node one closer. Fails when a rank cannot reach
/// another or a route is too long.
fn routes(n: usize, nodes: &[String], links: &[GraphLink]) -> Result<Vec<u32>, String> {
    let v = nodes.len();
    let mut incoming: Vec<Vec<u32>> = vec![Vec::new(); v];
    let mut outgoing: Vec<Vec<u32>> = vec![Vec::new(); v];
    for (id, l) in links.iter().enumerate() {
        incoming[l.to as usize].push(id as u32);
        outgoing[l.from as usize].push(id as u32);
    }
    let mut next = vec![u32::MAX; n * v];
    let mut dist = vec![u32::MAX; v];
    let mut queue = VecDeque::new();
    for d in 0..n {
        dist.fill(u32::MAX);
        dist[d] = 0;
        queue.push_back(d);
        while let Some(w) = queue.pop_front() {
            for &id in &incoming[w] {
                let u = links[id as usize].from as usize;
                if dist[u] == u32::MAX {
                    dist[u] = dist[w] + 1;
                    queue.push_back(u);
                }
            }
        }
        for src in 0..n {
            if dist[src] == u32::MAX {
                return Err(format!(
                    "no route from {} to {}: every rank must reach every other",
                    nodes[src], nodes[d]
                ));
            }
            if dist[src] as usize > MAX_HOPS {
                return Err(format!(
                    "the route from {} to {} crosses {} links, more than {MAX_HOPS}",
                    nodes[src], nodes[d], dist[src]
                ));
            }
        }
        for u in 0..v {
            if u == d || dist[u] == u32::MAX {
                continue;
            }
            next[d * v + u] = *outgoing[u]
                .iter()
                .find(|&&id| dist[links[id as usize].to as usize] == dist[u] - 1)
                .expect("a node at distance k has a link to one at k - 1");
        }
    }
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TREE: &str = "
        # two leaves under a spine
        ranks 8
        switch leaf0 leaf1 spine
        link r0-r3 leaf0 50GB/s 0.5us
        link r4-r7 leaf1 50GB/s 0.5us
        link leaf0 spine 100GB/s 1us class=uplink
        link leaf1 spine 100GB/s 1us class=uplink
        plan 2x4
    ";

    #[test]
    fn a_tree_parses_and_routes_through_the_spine() {
        let g = GraphSpec::parse(TREE).unwrap();
        assert_eq!(g.ranks, 8);
        assert_eq!(g.classes, ["up", "down", "uplink-up", "uplink-down"]);
        assert_eq!(g.plan_levels, Some(vec![2, 4]));
        let names = |a, b| -> Vec<String> {
            g.route(a, b)
                .map(|l| {
                    let l = &g.links[l as usize];
                    format!("{}>{}", g.nodes[l.from as usize], g.nodes[l.to as usize])
                })
                .collect()
        };
        assert_eq!(names(0, 1), ["r0>leaf0", "leaf0>r1"]);
        assert_eq!(
            names(1, 6),
            ["r1>leaf0", "leaf0>spine", "spine>leaf1", "leaf1>r6"]
        );
        assert!(names(3, 3).is_empty());
        let (bw, lat) = g.bottleneck(0, 7);
        assert_eq!(bw, 50e9);
        assert!((lat - 3e-6).abs() < 1e-15);
    }

    #[test]
    fn ranks_forward_on_a_chain_and_ranges_pair_up() {
        let g = GraphSpec::parse("ranks 4\nlink r0-r2 r1-r3 10GB/s 1us").unwrap();
        assert_eq!(g.route(0, 3).count(), 3);
        assert_eq!(g.classes, ["peer-up", "peer-down"]);
    }

    #[test]
    fn mistakes_name_their_line() {
        for (text, want) in [
            ("switch s", "line 1: `ranks N` must come first"),
            ("ranks 2\nlink r0 s 1GB/s 1us", "line 2: `s` is neither"),
            ("ranks 2\nlink r0 r5 1GB/s 1us", "not a rank"),
            ("ranks 2\nlink r0 r1 fast 1us", "line 2"),
            ("ranks 3\nlink r0 r1 1GB/s 1us", "no route from r2 to r0"),
            ("ranks 2\nlink r0 r1 1GB/s 1us\nplan 3", "multiply to 3"),
            ("ranks 2\nfrobnicate", "unknown statement"),
            ("ranks 2\nswitch r1", "rank's or already used"),
            ("ranks 4\nlink r0-r1 r1-r3 1GB/s 1us", "different lengths"),
        ] {
            let e = GraphSpec::parse(text).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }
}
