//! The collectives a compressed allreduce is made of, with their sizes
//! ([`exchanges`]): what the simulator runs (`ferrocoll sim --compress`) so
//! that its numbers are about the algorithm [`super::Compressor`] runs, as
//! the plans are for the uncompressed algorithms.

use super::{chunk_ranges, CompressOptions, Scheme};
use crate::error::Result;
use crate::plan::Collective;
use crate::Topology;

/// Which ranks run an [`Exchange`] together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// All ranks, as one group.
    All,
    /// The ranks of each node, every node at once (the hierarchical
    /// form's uncompressed steps).
    Node,
    /// Local rank `l` of every node, every `l` at once (the hierarchical
    /// form's compressed step, between nodes).
    Rail,
}

/// One collective of a compressed allreduce.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exchange {
    /// `AllToAllV` (encoded chunks, `counts[j]` bytes to rank `j` from
    /// every rank), `AllGather` (every rank's `counts[0]` bytes; different
    /// lengths per rank travel as an `AllToAllV` that sends every rank the
    /// same block), `AllReduce` or `ReduceScatter` (of `counts[0]` `f32`s
    /// per rank, as the library's own calls).
    pub collective: Collective,
    /// Bytes per element of `counts`: 1 for encoded bytes, 4 for `f32`.
    pub elem_size: usize,
    /// Elements, as `collective` says.
    pub counts: Vec<usize>,
    /// Which ranks run it together.
    pub level: Level,
}

/// The exchanges, in order, of a compressed allreduce of `len` `f32`s
/// with codec `spec` on a group of `topology` (the form
/// [`super::Compressor::new`] chooses there), and its algorithm's name.
/// An exchange whose group has one rank is left out.
pub fn exchanges(
    spec: &str,
    len: usize,
    topology: &Topology,
) -> Result<(&'static str, Vec<Exchange>)> {
    let (scheme, _) = Scheme::parse(spec, len, CompressOptions::default())?;
    let (nodes, local) = (topology.nodes(), topology.local_size());
    let grouped = topology.levels().len() > 1 && local >= 2 && nodes >= 2;
    let mut out = Vec::new();
    if len == 0 {
        return Ok((scheme.algorithm(), out));
    }
    match &scheme {
        Scheme::Dense(codec) | Scheme::TopK(codec) if grouped => {
            let granule = codec.granule().unwrap_or(1);
            let piece = len.div_ceil(local).div_ceil(granule) * granule;
            let node = |collective| Exchange {
                collective,
                elem_size: 4,
                counts: vec![piece],
                level: Level::Node,
            };
            out.push(node(Collective::ReduceScatter));
            flat(&scheme, nodes, piece, Level::Rail, &mut out);
            out.push(node(Collective::AllGather));
            let name = match scheme {
                Scheme::Dense(_) => "hier-two-phase",
                _ => "hier-allgather",
            };
            Ok((name, out))
        }
        _ => {
            flat(&scheme, topology.size(), len, Level::All, &mut out);
            Ok((scheme.algorithm(), out))
        }
    }
}

/// The flat form's exchanges among `n` ranks for `len` elements.
fn flat(scheme: &Scheme, n: usize, len: usize, level: Level, out: &mut Vec<Exchange>) {
    if n < 2 {
        return;
    }
    let bytes = |collective, counts: Vec<usize>| Exchange {
        collective,
        elem_size: 1,
        counts,
        level,
    };
    let floats = |count: usize| Exchange {
        collective: Collective::AllReduce,
        elem_size: 4,
        counts: vec![count],
        level,
    };
    match scheme {
        Scheme::Dense(codec) => {
            let lens: Vec<usize> = chunk_ranges(len, n, codec.granule().unwrap_or(1))
                .iter()
                .map(|r| codec.encoded_len(r.len()))
                .collect();
            out.push(bytes(Collective::AllToAllV, lens.clone()));
            out.push(bytes(Collective::AllGather, lens));
        }
        Scheme::TopK(codec) => out.push(bytes(Collective::AllGather, vec![codec.encoded_len(len)])),
        Scheme::RandK(codec) => {
            out.push(floats(crate::compress::Codec::encoded_len(codec, len) / 4))
        }
        Scheme::PowerSgd(state) => {
            out.push(floats(state.p_len()));
            out.push(floats(state.q_len()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_forms_are_the_compressors() {
        let flat4 = Topology::flat(4);
        let (name, ex) = exchanges("int8:128", 4096, &flat4).unwrap();
        assert_eq!(name, "two-phase");
        assert_eq!(ex.len(), 2);
        assert_eq!(ex[0].counts, vec![1024 + 32; 4]);
        let (name, ex) = exchanges("topk:0.01", 1000, &flat4).unwrap();
        assert_eq!((name, ex[0].counts[0]), ("allgather", 4 + 6 * 10));
        let (_, ex) = exchanges("powersgd:2", 64 * 64, &flat4).unwrap();
        assert_eq!(ex[0].counts, vec![64 * 2]);
        let hier = Topology::new(vec![2, 4]).unwrap();
        let (name, ex) = exchanges("int8:128", 4096, &hier).unwrap();
        assert_eq!(name, "hier-two-phase");
        let levels: Vec<Level> = ex.iter().map(|e| e.level).collect();
        assert_eq!(levels, [Level::Node, Level::Rail, Level::Rail, Level::Node]);
        assert!(exchanges("int8", 100, &Topology::flat(1))
            .unwrap()
            .1
            .is_empty());
    }
}
