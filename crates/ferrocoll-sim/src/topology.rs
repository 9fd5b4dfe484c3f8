//! Cluster descriptions: the `kind:key=value,...` strings the simulator
//! accepts, parsed into a [`TopologySpec`].
//!
//! ```text
//! switch:ranks=64,bw=50GB/s,lat=2us
//! two-level:nodes=4,gpus=8,intra=450GB/s@1us,inter=25GB/s@2us
//! fat-tree:ranks=64,leaf=8,bw=50GB/s,lat=1us,oversub=2
//! ```
//!
//! Bandwidths take a decimal prefix (`K`, `M`, `G`, `T`) and `B/s` (bytes)
//! or `b/s` (bits): `50GB/s` is 5e10 bytes per second, `400Gb/s` is 5e10 too.
//! Latencies take `s`, `ms`, `us` or `ns`. What each kind means (which links
//! exist, where latency is paid) is documented on [`TopologySpec`] and in
//! [`crate::network`].

use std::fmt;

/// Bandwidth (bytes per second) and latency (seconds) of one class of link.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkSpec {
    /// Bytes per second through one port.
    pub bw: f64,
    /// Seconds a message pays for one traversal of a switch of this class.
    pub lat: f64,
}

/// A modelled cluster. Ranks are numbered in blocks: in `two-level` rank `r`
/// is GPU `r % gpus` of node `r / gpus`, in `fat-tree` it hangs off leaf
/// switch `r / leaf`.
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
        let allowed: &[&str] = match kind {
            "switch" => &["ranks", "bw", "lat"],
            "two-level" => &["nodes", "gpus", "intra", "inter"],
            "fat-tree" => &["ranks", "leaf", "bw", "lat", "oversub"],
            _ => {
                return Err(format!(
                    "topology kind `{kind}` is unknown; use one of {KINDS}"
                ))
            }
        };
        let f = Fields::parse(kind, rest, allowed)?;
        let spec = match kind {
            "switch" => TopologySpec::Switch {
                ranks: f.count("ranks")?,
                link: LinkSpec {
                    bw: f.bandwidth("bw")?,
                    lat: f.latency("lat")?,
                },
            },
            "two-level" => TopologySpec::TwoLevel {
                nodes: f.count("nodes")?,
                gpus: f.count("gpus")?,
                intra: f.link("intra")?,
                inter: f.link("inter")?,
            },
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
                    link: LinkSpec {
                        bw: f.bandwidth("bw")?,
                        lat: f.latency("lat")?,
                    },
                    oversub,
                }
            }
        };
        Ok(spec)
    }

    /// Number of ranks of the cluster.
    pub fn ranks(&self) -> usize {
        match *self {
            TopologySpec::Switch { ranks, .. } | TopologySpec::FatTree { ranks, .. } => ranks,
            TopologySpec::TwoLevel { nodes, gpus, .. } => nodes * gpus,
        }
    }

    /// The node structure the topology-aware algorithms (hier, torus2d,
    /// mesh2d) plan for: nodes x GPUs for `two-level`, leaves x ranks per
    /// leaf for `fat-tree` (when both exceed 1), flat otherwise.
    pub fn plan_topology(&self) -> ferrocoll::Topology {
        let flat = ferrocoll::Topology::flat(self.ranks());
        let (outer, inner) = match *self {
            TopologySpec::Switch { .. } => return flat,
            TopologySpec::TwoLevel { nodes, gpus, .. } => (nodes, gpus),
            TopologySpec::FatTree { ranks, leaf, .. } => (ranks / leaf, leaf),
        };
        if outer > 1 && inner > 1 {
            ferrocoll::Topology::new(vec![outer, inner]).unwrap_or(flat)
        } else {
            flat
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
    /// The canonical string (GB/s and us), which [`TopologySpec::parse`]
    /// reads back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bw = |l: &LinkSpec| format!("{}GB/s", l.bw / 1e9);
        let lat = |l: &LinkSpec| format!("{}us", l.lat * 1e6);
        match self {
            TopologySpec::Switch { ranks, link } => {
                write!(f, "switch:ranks={ranks},bw={},lat={}", bw(link), lat(link))
            }
            TopologySpec::TwoLevel {
                nodes,
                gpus,
                intra,
                inter,
            } => write!(
                f,
                "two-level:nodes={nodes},gpus={gpus},intra={}@{},inter={}@{}",
                bw(intra),
                lat(intra),
                bw(inter),
                lat(inter)
            ),
            TopologySpec::FatTree {
                ranks,
                leaf,
                link,
                oversub,
            } => write!(
                f,
                "fat-tree:ranks={ranks},leaf={leaf},bw={},lat={},oversub={oversub}",
                bw(link),
                lat(link)
            ),
        }
    }
}

const KINDS: &str = "switch, two-level, fat-tree";

/// The `key=value` pairs of one topology string.
struct Fields<'a> {
    kind: &'a str,
    pairs: Vec<(&'a str, &'a str)>,
}

impl<'a> Fields<'a> {
    fn parse(kind: &'a str, rest: &'a str, allowed: &[&str]) -> Result<Fields<'a>, String> {
        let mut pairs: Vec<(&str, &str)> = Vec::new();
        for item in rest.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (k, v) = item.split_once('=').ok_or_else(|| {
                format!(
                    "{kind}: `{item}` is not key=value (fields: {})",
                    allowed.join(", ")
                )
            })?;
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
                }
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
                oversub: 2.0
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
        ] {
            let t = TopologySpec::parse(s).unwrap();
            assert_eq!(t.to_string(), s);
            assert_eq!(TopologySpec::parse(&t.to_string()).unwrap(), t);
        }
    }

    #[test]
    fn errors_name_the_field() {
        let err = |s: &str| TopologySpec::parse(s).unwrap_err();
        assert!(err("torus:ranks=4").contains("kind `torus`"));
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
    }
}
