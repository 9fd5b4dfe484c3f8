//! The two-level exchange: an all-to-all-v whose every rank knows every
//! count, done as aggregate by destination host, one message per host pair,
//! scatter inside the destination host (the seed's hierarchical MoE
//! exchange, Tutel's 2DH, DeepEP's intra/inter kernels).
//!
//! The communicator's plans cannot forward alltoallv rows (an intermediate
//! rank would have to know a count only the source has; see
//! `plan/hier.rs`), but after the MoE count exchange every rank holds the
//! whole matrix, so this exchange is built from collectives of
//! sub-communicators instead. G hosts of L ranks in blocks (rank (x, i) =
//! x·L + i); host pair {x, y} is carried by local index j = (x + y) mod L
//! on both hosts (the pair's gateways, rail aligned):
//!
//! 1. **aggregate**, an all-to-all-v inside each host: (x, i) sends (x, j)
//!    its rows for (x, j) itself and for every rank of each host y that
//!    (x, j) is the gateway to;
//! 2. **inter-host**, per host pair one 2-rank all-to-all-v between the
//!    gateways, carrying everything host x has for host y (by source local
//!    rank, then destination local rank) and back; a gateway takes its pairs
//!    in one global order (`Hosts::pair_order`), so they cannot deadlock;
//! 3. **scatter**, an all-to-all-v inside each host: each gateway hands
//!    every rank of its host the rows the other hosts sent it.
//!
//! The result is packed by source rank exactly as the flat all-to-all-v
//! packs it; only the route differs, so both give bit-identical results. A
//! phase that moves nothing anywhere in its group is skipped by all of the
//! group (they all know it from the matrix). Inter-host messages: one per
//! host pair and direction, against L² for the flat exchange.

use crate::comm::Communicator;
use crate::error::Result;
use crate::types::Element;

use super::schedule::Hosts;

/// Distinguishes the 2-rank pair groups from other subgroups of the rail.
const PAIR_TAG: u64 = 0x6d6f_655f_7061_6972; // "moe_pair"

/// The sub-communicators of one rank for the two-level exchange.
pub(super) struct Groups {
    hosts: Hosts,
    /// This rank's host x and local index i.
    x: usize,
    i: usize,
    /// The L ranks of this host, by local index.
    host: Communicator,
    /// The pairs this rank is the gateway of, in the global order: the other
    /// host and the 2-rank communicator (lower host first).
    pairs: Vec<(usize, Communicator)>,
}

impl std::fmt::Debug for Groups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Groups")
            .field("hosts", &self.hosts)
            .field("pairs", &self.pairs.iter().map(|p| p.0).collect::<Vec<_>>())
            .finish()
    }
}

impl Groups {
    /// Splits `comm` by host and by local index (collective: every rank of
    /// `comm` calls it, in the same call) and makes this rank's pair groups.
    pub(super) fn new(comm: &Communicator) -> Result<Groups> {
        let hosts = Hosts::of(comm.topology());
        let (x, i) = (comm.rank() / hosts.l, comm.rank() % hosts.l);
        // Colours fit: there are fewer hosts (local ranks) than ranks.
        let host = comm
            .split(Some(x as u32), i as i64)?
            .expect("every rank has a colour");
        let rail = comm
            .split(Some(i as u32), x as i64)?
            .expect("every rank has a colour");
        let mut pairs = Vec::new();
        for (a, b) in hosts.pair_order() {
            if (a == x || b == x) && hosts.gateway(a, b) == i {
                // On the rail, rank = host index (split by key x).
                let pair = rail.subgroup(&[a, b], PAIR_TAG)?;
                pairs.push((if a == x { b } else { a }, pair));
            }
        }
        Ok(Groups {
            hosts,
            x,
            i,
            host,
            pairs,
        })
    }

    /// The all-to-all-v of `send` (packed by destination rank: `rows[r·n +
    /// d]` rows of `h` elements for each rank d, r this rank) through the
    /// three phases; returns what arrives packed by source rank.
    pub(super) fn exchange<T: Element>(
        &self,
        send: &[T],
        rows: &[usize],
        h: usize,
    ) -> Result<Vec<T>> {
        let Hosts { n, l, g } = self.hosts;
        let (x, i) = (self.x, self.i);
        let me = x * l + i;
        let rank = |host: usize, local: usize| host * l + local;
        let m = |s: usize, d: usize| rows[s * n + d] * h;
        // Elements from rank s to every rank of host y (contiguous in s's
        // send buffer: a host's ranks are consecutive).
        let to_host = |s: usize, y: usize| (0..l).map(|k| m(s, rank(y, k))).sum::<usize>();
        // The hosts local index j of host `at` is the gateway to, ascending.
        let via = |at: usize, j: usize| {
            (0..g).filter(move |&y| y != at && self.hosts.gateway(at, y) == j)
        };
        let offsets = |len: &dyn Fn(usize) -> usize, count: usize| {
            let mut at = Vec::with_capacity(count + 1);
            at.push(0);
            for q in 0..count {
                at.push(at[q] + len(q));
            }
            at
        };
        let soff = offsets(&|d| m(me, d), n);

        // Phase 1: to local j, the rows for (x, j), then for the hosts
        // behind gateway j, each host's ranks in order.
        let mut s1 = Vec::with_capacity(send.len());
        let mut c1s = vec![0usize; l];
        for (j, count) in c1s.iter_mut().enumerate() {
            let start = s1.len();
            let d = rank(x, j);
            s1.extend_from_slice(&send[soff[d]..soff[d + 1]]);
            for y in via(x, j) {
                let first = soff[rank(y, 0)];
                s1.extend_from_slice(&send[first..first + to_host(me, y)]);
            }
            *count = s1.len() - start;
        }
        // From local j: its rows for me, then for the hosts behind me.
        let c1r: Vec<usize> = (0..l)
            .map(|j| m(rank(x, j), me) + via(x, i).map(|y| to_host(rank(x, j), y)).sum::<usize>())
            .collect();
        let mut r1 = vec![T::zeroed(); c1r.iter().sum()];
        let host_sends = (0..l).any(|j| (0..n).any(|d| m(rank(x, j), d) > 0));
        if host_sends {
            self.host.all_to_all_v(&s1, &c1s, &mut r1, &c1r)?;
        }
        drop(s1);
        let r1off = offsets(&|j| c1r[j], l);

        // Phase 2: per pair, everything this host has for host y (by
        // source local j, then destination local k), and y's for this host.
        let mut r2: Vec<(usize, Vec<T>)> = Vec::with_capacity(self.pairs.len());
        for (y, pair) in &self.pairs {
            let y = *y;
            let mut out = Vec::new();
            for j in 0..l {
                // Inside segment j of r1: the rows for me, then the hosts
                // behind me in ascending order.
                let before: usize = m(rank(x, j), me)
                    + via(x, i)
                        .take_while(|&z| z < y)
                        .map(|z| to_host(rank(x, j), z))
                        .sum::<usize>();
                let at = r1off[j] + before;
                out.extend_from_slice(&r1[at..at + to_host(rank(x, j), y)]);
            }
            let incoming: usize = (0..l).map(|j| to_host(rank(y, j), x)).sum();
            let mut inn = vec![T::zeroed(); incoming];
            if !out.is_empty() || incoming > 0 {
                // Pair rank 0 is the lower host.
                let other = usize::from(x < y);
                let mut sc = [0usize; 2];
                let mut rc = [0usize; 2];
                sc[other] = out.len();
                rc[other] = incoming;
                pair.all_to_all_v(&out, &sc, &mut inn, &rc)?;
            }
            r2.push((y, inn));
        }
        r2.sort_by_key(|p| p.0);

        // Phase 3: to local k, from every host behind me (ascending) and
        // every source local j there, the rows for (x, k).
        let mut s3 = Vec::new();
        let mut c3s = vec![0usize; l];
        for (k, count) in c3s.iter_mut().enumerate() {
            let start = s3.len();
            for (y, inn) in &r2 {
                let mut at = 0;
                for j in 0..l {
                    let s = rank(*y, j);
                    let skip: usize = (0..k).map(|k2| m(s, rank(x, k2))).sum();
                    s3.extend_from_slice(&inn[at + skip..at + skip + m(s, rank(x, k))]);
                    at += to_host(s, x);
                }
            }
            *count = s3.len() - start;
        }
        drop(r2);
        let from_hosts_behind = |j: usize| {
            via(x, j)
                .flat_map(|y| (0..l).map(move |s| rank(y, s)))
                .map(|s| m(s, me))
                .sum::<usize>()
        };
        let c3r: Vec<usize> = (0..l).map(from_hosts_behind).collect();
        let mut r3 = vec![T::zeroed(); c3r.iter().sum()];
        let host_receives =
            (0..l).any(|k| (0..n).filter(|&s| s / l != x).any(|s| m(s, rank(x, k)) > 0));
        if host_receives {
            self.host.all_to_all_v(&s3, &c3s, &mut r3, &c3r)?;
        }
        drop(s3);
        let r3off = offsets(&|j| c3r[j], l);

        // The result by source rank: this host's from phase 1, the others'
        // from phase 3 (segment of their pair's gateway, then host, then
        // source local index).
        let mut out = Vec::with_capacity((0..n).map(|s| m(s, me)).sum());
        for s in 0..n {
            let (y, j) = (s / l, s % l);
            if y == x {
                let at = r1off[j];
                out.extend_from_slice(&r1[at..at + m(s, me)]);
            } else {
                let gw = self.hosts.gateway(x, y);
                let before: usize = via(x, gw)
                    .take_while(|&z| z < y)
                    .flat_map(|z| (0..l).map(move |q| rank(z, q)))
                    .chain((0..j).map(|q| rank(y, q)))
                    .map(|q| m(q, me))
                    .sum();
                let at = r3off[gw] + before;
                out.extend_from_slice(&r3[at..at + m(s, me)]);
            }
        }
        Ok(out)
    }
}
