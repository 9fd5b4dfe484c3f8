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
//!
//! The **rail** exchange (Tutel's 2DH, DeepEP's rail-aligned RDMA plus
//! NVLink forwarding, in Tutel's order) has one phase fewer: (1) inside
//! each host, (x, i) sends (x, j) its rows for rank j of every host; (2) on
//! each rail (the G ranks of one local index), an all-to-all-v carries to
//! (y, j) what host x has for it, which lands packed by source rank: the
//! result. L messages per host pair and direction, one per rail.

use crate::comm::Communicator;
use crate::error::Result;
use crate::types::Element;

use super::schedule::Hosts;
use super::scratch::Pool;

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
    /// The G ranks of this local index, by host.
    rail: Communicator,
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
            rail,
            pairs,
        })
    }

    /// The all-to-all-v of `send` (packed by destination rank: `rows[r·n +
    /// d]` rows of `h` elements for each rank d, r this rank) through the
    /// three phases, into `recv` (packed by source rank); the phases'
    /// buffers come from `pool`.
    pub(super) fn exchange<T: Element>(
        &self,
        send: &[T],
        rows: &[usize],
        h: usize,
        recv: &mut [T],
        pool: &Pool,
    ) -> Result<()> {
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
        let mut s1 = pool.empty();
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
        let mut r1 = pool.sized(c1r.iter().sum());
        let host_sends = (0..l).any(|j| (0..n).any(|d| m(rank(x, j), d) > 0));
        if host_sends {
            self.host.all_to_all_v(&s1, &c1s, &mut r1, &c1r)?;
        }
        pool.give(s1);
        let r1off = offsets(&|j| c1r[j], l);

        // Phase 2: per pair, everything this host has for host y (by
        // source local j, then destination local k), and y's for this host.
        let mut r2: Vec<(usize, Vec<T>)> = Vec::with_capacity(self.pairs.len());
        for (y, pair) in &self.pairs {
            let y = *y;
            let mut out = pool.empty();
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
            let mut inn = pool.sized(incoming);
            if !out.is_empty() || incoming > 0 {
                // Pair rank 0 is the lower host.
                let other = usize::from(x < y);
                let mut sc = [0usize; 2];
                let mut rc = [0usize; 2];
                sc[other] = out.len();
                rc[other] = incoming;
                pair.all_to_all_v(&out, &sc, &mut inn, &rc)?;
            }
            pool.give(out);
            r2.push((y, inn));
        }
        r2.sort_by_key(|p| p.0);

        // Phase 3: to local k, from every host behind me (ascending) and
        // every source local j there, the rows for (x, k).
        let mut s3 = pool.empty();
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
        for (_, inn) in r2 {
            pool.give(inn);
        }
        let from_hosts_behind = |j: usize| {
            via(x, j)
                .flat_map(|y| (0..l).map(move |s| rank(y, s)))
                .map(|s| m(s, me))
                .sum::<usize>()
        };
        let c3r: Vec<usize> = (0..l).map(from_hosts_behind).collect();
        let mut r3 = pool.sized(c3r.iter().sum());
        let host_receives =
            (0..l).any(|k| (0..n).filter(|&s| s / l != x).any(|s| m(s, rank(x, k)) > 0));
        if host_receives {
            self.host.all_to_all_v(&s3, &c3s, &mut r3, &c3r)?;
        }
        pool.give(s3);
        let r3off = offsets(&|j| c3r[j], l);

        // The result by source rank: this host's from phase 1, the others'
        // from phase 3 (segment of their pair's gateway, then host, then
        // source local index).
        let mut at_out = 0;
        for s in 0..n {
            let (y, j) = (s / l, s % l);
            let len = m(s, me);
            let from = if y == x {
                &r1[r1off[j]..r1off[j] + len]
            } else {
                let gw = self.hosts.gateway(x, y);
                let before: usize = via(x, gw)
                    .take_while(|&z| z < y)
                    .flat_map(|z| (0..l).map(move |q| rank(z, q)))
                    .chain((0..j).map(|q| rank(y, q)))
                    .map(|q| m(q, me))
                    .sum();
                let at = r3off[gw] + before;
                &r3[at..at + len]
            };
            recv[at_out..at_out + len].copy_from_slice(from);
            at_out += len;
        }
        pool.give(r1);
        pool.give(r3);
        Ok(())
    }

    /// The rail exchange of `send` (as [`Groups::exchange`]) into `recv`.
    pub(super) fn rail_exchange<T: Element>(
        &self,
        send: &[T],
        rows: &[usize],
        h: usize,
        recv: &mut [T],
        pool: &Pool,
    ) -> Result<()> {
        let Hosts { n, l, g } = self.hosts;
        let (x, i) = (self.x, self.i);
        let me = x * l + i;
        let rank = |host: usize, local: usize| host * l + local;
        let m = |s: usize, d: usize| rows[s * n + d] * h;
        let mut soff = vec![0usize; n + 1];
        for d in 0..n {
            soff[d + 1] = soff[d] + m(me, d);
        }

        // Phase 1: to local j, the rows for rank j of every host, by host.
        let mut s1 = pool.empty();
        let mut c1s = vec![0usize; l];
        for (j, count) in c1s.iter_mut().enumerate() {
            let start = s1.len();
            for y in 0..g {
                let d = rank(y, j);
                s1.extend_from_slice(&send[soff[d]..soff[d + 1]]);
            }
            *count = s1.len() - start;
        }
        // From local j: its rows for rank i of every host, by host.
        let c1r: Vec<usize> = (0..l)
            .map(|j| (0..g).map(|y| m(rank(x, j), rank(y, i))).sum())
            .collect();
        let mut r1 = pool.sized(c1r.iter().sum());
        if (0..l).any(|j| (0..n).any(|d| m(rank(x, j), d) > 0)) {
            self.host.all_to_all_v(&s1, &c1s, &mut r1, &c1r)?;
        }
        pool.give(s1);

        // Phase 2: to host y on this rail, what every rank of this host has
        // for (y, i), by source local index; it arrives by source rank.
        let mut r1off = vec![0usize; l + 1];
        for j in 0..l {
            r1off[j + 1] = r1off[j] + c1r[j];
        }
        let mut s2 = pool.empty();
        let mut c2s = vec![0usize; g];
        for (y, count) in c2s.iter_mut().enumerate() {
            let start = s2.len();
            for j in 0..l {
                let before: usize = (0..y).map(|z| m(rank(x, j), rank(z, i))).sum();
                let at = r1off[j] + before;
                s2.extend_from_slice(&r1[at..at + m(rank(x, j), rank(y, i))]);
            }
            *count = s2.len() - start;
        }
        pool.give(r1);
        let c2r: Vec<usize> = (0..g)
            .map(|y| (0..l).map(|j| m(rank(y, j), me)).sum())
            .collect();
        let rail_moves =
            (0..g).any(|y| (0..l).any(|j| (0..g).any(|z| m(rank(y, j), rank(z, i)) > 0)));
        if rail_moves {
            self.rail.all_to_all_v(&s2, &c2s, recv, &c2r)?;
        }
        pool.give(s2);
        Ok(())
    }
}
