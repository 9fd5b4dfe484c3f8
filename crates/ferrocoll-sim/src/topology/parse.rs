//! The string form of a topology: [`TopologySpec::parse`] reads
//! `kind:key=value,...` (or `file:PATH`), `Display` writes the canonical
//! string back.

use std::fmt;
use std::sync::Arc;

use super::placement::{check_permutation, Placement};
use super::units::{parse_bandwidth, parse_latency};
use super::{LinkSpec, TopologySpec, MAX_HOPS};
use crate::graph::GraphSpec;

impl TopologySpec {
    /// Parses a topology string (see the [module docs](super)). Errors
    /// name the kind or the field that is wrong and what was expected.
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
