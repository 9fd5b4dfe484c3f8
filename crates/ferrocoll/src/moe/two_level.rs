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

/// One phase of a hierarchical exchange as one rank runs it: an
/// all-to-all-v on a sub-communicator, in elements to and from each of its
/// members (by member rank). A phase that moves nothing anywhere in its
/// group is skipped by all of the group (they all know it from the
/// matrix): `runs` is false, and the counts are all zero.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Phase {
    /// Elements this rank sends each member.
    pub(super) send: Vec<usize>,
    /// Elements this rank receives from each member.
    pub(super) recv: Vec<usize>,
    /// Whether the group runs the phase.
    pub(super) runs: bool,
}

/// The phases of the two-level exchange at one rank, in the order it runs
/// them. The executor ([`Groups::exchange`]) takes its counts from here and
/// the simulator's plans (`plans.rs`) are built from them: one source of
/// what travels where.
#[derive(Clone, Debug)]
pub(super) struct TwoLevelPhases {
    /// Phase 1, on the host (members: its ranks by local index).
    pub(super) aggregate: Phase,
    /// Phase 2: per pair this rank is the gateway of, in the global order,
    /// the other host and the 2-rank phase (member 0: the lower host's
    /// gateway).
    pub(super) pairs: Vec<(usize, Phase)>,
    /// Phase 3, on the host.
    pub(super) scatter: Phase,
}

/// The count matrix seen from inside the hierarchy: `rows[s·n + d]` rows of
/// `h` elements from s to d, on `hosts`.
#[derive(Clone, Copy)]
pub(super) struct View<'a> {
    pub(super) hosts: Hosts,
    pub(super) rows: &'a [usize],
    pub(super) h: usize,
}

impl View<'_> {
    /// Rank `local` of host `host`.
    fn rank(&self, host: usize, local: usize) -> usize {
        host * self.hosts.l + local
    }

    /// Elements from s to d.
    fn m(&self, s: usize, d: usize) -> usize {
        self.rows[s * self.hosts.n + d] * self.h
    }

    /// Elements from rank s to every rank of host y (contiguous in s's
    /// send buffer: a host's ranks are consecutive).
    fn for_host(&self, s: usize, y: usize) -> usize {
        (0..self.hosts.l).map(|k| self.m(s, self.rank(y, k))).sum()
    }

    /// The hosts local index j of host `at` is the gateway to, ascending.
    fn via(&self, at: usize, j: usize) -> impl Iterator<Item = usize> + '_ {
        let hosts = self.hosts;
        (0..hosts.g).filter(move |&y| y != at && hosts.gateway(at, y) == j)
    }

    /// Whether any rank of host x sends anything to anyone.
    fn host_sends(&self, x: usize) -> bool {
        (0..self.hosts.l).any(|j| (0..self.hosts.n).any(|d| self.m(self.rank(x, j), d) > 0))
    }

    /// Whether `phase` runs; zeroes its counts when it does not.
    fn gate(send: Vec<usize>, recv: Vec<usize>, runs: bool) -> Phase {
        if runs {
            Phase { send, recv, runs }
        } else {
            Phase {
                send: vec![0; send.len()],
                recv: vec![0; recv.len()],
                runs,
            }
        }
    }

    /// The two-level exchange's phases at rank `me`.
    pub(super) fn two_level(&self, me: usize) -> TwoLevelPhases {
        let Hosts { n, l, .. } = self.hosts;
        let (x, i) = (me / l, me % l);
        // Phase 1: to local j, the rows for (x, j), then for the hosts
        // behind gateway j; from local j, its rows for me, then for the
        // hosts behind me.
        let send = (0..l)
            .map(|j| {
                self.m(me, self.rank(x, j))
                    + self.via(x, j).map(|y| self.for_host(me, y)).sum::<usize>()
            })
            .collect();
        let recv = (0..l)
            .map(|j| {
                let s = self.rank(x, j);
                self.m(s, me) + self.via(x, i).map(|y| self.for_host(s, y)).sum::<usize>()
            })
            .collect();
        let aggregate = View::gate(send, recv, self.host_sends(x));
        // Phase 2: everything this host has for host y, and y's for this
        // host, between the pair's gateways.
        let pairs = self
            .hosts
            .pair_order()
            .into_iter()
            .filter(|&(a, b)| (a == x || b == x) && self.hosts.gateway(a, b) == i)
            .map(|(a, b)| {
                let y = if a == x { b } else { a };
                let out: usize = (0..l).map(|j| self.for_host(self.rank(x, j), y)).sum();
                let incoming: usize = (0..l).map(|j| self.for_host(self.rank(y, j), x)).sum();
                let other = usize::from(x < y);
                let (mut send, mut recv) = (vec![0; 2], vec![0; 2]);
                send[other] = out;
                recv[other] = incoming;
                (y, View::gate(send, recv, out > 0 || incoming > 0))
            })
            .collect();
        // Phase 3: to local k, from every host behind me and every source
        // local j there, the rows for (x, k); from local j, the rows the
        // hosts behind it have for me.
        let send = (0..l)
            .map(|k| {
                self.via(x, i)
                    .flat_map(|y| (0..l).map(move |j| (y, j)))
                    .map(|(y, j)| self.m(self.rank(y, j), self.rank(x, k)))
                    .sum()
            })
            .collect();
        let recv = (0..l)
            .map(|j| {
                self.via(x, j)
                    .flat_map(|y| (0..l).map(move |s| (y, s)))
                    .map(|(y, s)| self.m(self.rank(y, s), me))
                    .sum()
            })
            .collect();
        let host_receives = (0..l).any(|k| {
            (0..n)
                .filter(|&s| s / l != x)
                .any(|s| self.m(s, self.rank(x, k)) > 0)
        });
        TwoLevelPhases {
            aggregate,
            pairs,
            scatter: View::gate(send, recv, host_receives),
        }
    }

    /// The rail exchange's two phases at rank `me`: inside the host
    /// (members by local index), then on the rail (members by host).
    pub(super) fn rail(&self, me: usize) -> [Phase; 2] {
        let Hosts { l, g, .. } = self.hosts;
        let (x, i) = (me / l, me % l);
        // Phase 1: to local j, the rows for rank j of every host; from
        // local j, its rows for rank i of every host.
        let send = (0..l)
            .map(|j| (0..g).map(|y| self.m(me, self.rank(y, j))).sum())
            .collect();
        let recv = (0..l)
            .map(|j| {
                (0..g)
                    .map(|y| self.m(self.rank(x, j), self.rank(y, i)))
                    .sum()
            })
            .collect();
        let host = View::gate(send, recv, self.host_sends(x));
        // Phase 2: to host y, what every rank of this host has for (y, i);
        // from host y, what its ranks have for me.
        let send = (0..g)
            .map(|y| {
                (0..l)
                    .map(|j| self.m(self.rank(x, j), self.rank(y, i)))
                    .sum()
            })
            .collect();
        let recv = (0..g)
            .map(|y| (0..l).map(|j| self.m(self.rank(y, j), me)).sum())
            .collect();
        let rail_moves = (0..g)
            .any(|y| (0..l).any(|j| (0..g).any(|z| self.m(self.rank(y, j), self.rank(z, i)) > 0)));
        [host, View::gate(send, recv, rail_moves)]
    }
}

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
    /// buffers come from `pool`. The counts are [`View::two_level`]'s; the
    /// packing follows them.
    pub(super) fn exchange<T: Element>(
        &self,
        send: &[T],
        rows: &[usize],
        h: usize,
        recv: &mut [T],
        pool: &Pool,
    ) -> Result<()> {
        let Hosts { n, l, .. } = self.hosts;
        let (x, i) = (self.x, self.i);
        let me = x * l + i;
        let v = View {
            hosts: self.hosts,
            rows,
            h,
        };
        let phases = v.two_level(me);
        let offsets = |len: &dyn Fn(usize) -> usize, count: usize| {
            let mut at = Vec::with_capacity(count + 1);
            at.push(0);
            for q in 0..count {
                at.push(at[q] + len(q));
            }
            at
        };
        let soff = offsets(&|d| v.m(me, d), n);

        // Phase 1: to local j, the rows for (x, j), then for the hosts
        // behind gateway j, each host's ranks in order.
        let p1 = &phases.aggregate;
        let mut s1 = pool.empty();
        for j in 0..l {
            let d = v.rank(x, j);
            s1.extend_from_slice(&send[soff[d]..soff[d + 1]]);
            for y in v.via(x, j) {
                let first = soff[v.rank(y, 0)];
                s1.extend_from_slice(&send[first..first + v.for_host(me, y)]);
            }
        }
        let mut r1 = pool.sized(p1.recv.iter().sum());
        if p1.runs {
            debug_assert_eq!(s1.len(), p1.send.iter().sum::<usize>());
            self.host.all_to_all_v(&s1, &p1.send, &mut r1, &p1.recv)?;
        }
        pool.give(s1);
        // From local j: its rows for me, then for the hosts behind me.
        let r1off = offsets(&|j| p1.recv[j], l);

        // Phase 2: per pair, everything this host has for host y (by
        // source local j, then destination local k), and y's for this host.
        let mut r2: Vec<(usize, Vec<T>)> = Vec::with_capacity(self.pairs.len());
        for ((y, pair), (y2, p2)) in self.pairs.iter().zip(&phases.pairs) {
            let y = *y;
            debug_assert_eq!(y, *y2, "the pairs run in one order");
            let mut out = pool.empty();
            for j in 0..l {
                // Inside segment j of r1: the rows for me, then the hosts
                // behind me in ascending order.
                let before: usize = v.m(v.rank(x, j), me)
                    + v.via(x, i)
                        .take_while(|&z| z < y)
                        .map(|z| v.for_host(v.rank(x, j), z))
                        .sum::<usize>();
                let at = r1off[j] + before;
                out.extend_from_slice(&r1[at..at + v.for_host(v.rank(x, j), y)]);
            }
            let mut inn = pool.sized(p2.recv.iter().sum());
            if p2.runs {
                pair.all_to_all_v(&out, &p2.send, &mut inn, &p2.recv)?;
            }
            pool.give(out);
            r2.push((y, inn));
        }
        r2.sort_by_key(|p| p.0);

        // Phase 3: to local k, from every host behind me (ascending) and
        // every source local j there, the rows for (x, k).
        let p3 = &phases.scatter;
        let mut s3 = pool.empty();
        for k in 0..l {
            for (y, inn) in &r2 {
                let mut at = 0;
                for j in 0..l {
                    let s = v.rank(*y, j);
                    let skip: usize = (0..k).map(|k2| v.m(s, v.rank(x, k2))).sum();
                    s3.extend_from_slice(&inn[at + skip..at + skip + v.m(s, v.rank(x, k))]);
                    at += v.for_host(s, x);
                }
            }
        }
        for (_, inn) in r2 {
            pool.give(inn);
        }
        let mut r3 = pool.sized(p3.recv.iter().sum());
        if p3.runs {
            debug_assert_eq!(s3.len(), p3.send.iter().sum::<usize>());
            self.host.all_to_all_v(&s3, &p3.send, &mut r3, &p3.recv)?;
        }
        pool.give(s3);
        let r3off = offsets(&|j| p3.recv[j], l);

        // The result by source rank: this host's from phase 1, the others'
        // from phase 3 (segment of their pair's gateway, then host, then
        // source local index).
        let mut at_out = 0;
        for s in 0..n {
            let (y, j) = (s / l, s % l);
            let len = v.m(s, me);
            let from = if y == x {
                &r1[r1off[j]..r1off[j] + len]
            } else {
                let gw = self.hosts.gateway(x, y);
                let before: usize = v
                    .via(x, gw)
                    .take_while(|&z| z < y)
                    .flat_map(|z| (0..l).map(move |q| v.rank(z, q)))
                    .chain((0..j).map(|q| v.rank(y, q)))
                    .map(|q| v.m(q, me))
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

    /// The rail exchange of `send` (as [`Groups::exchange`]) into `recv`,
    /// with [`View::rail`]'s counts.
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
        let v = View {
            hosts: self.hosts,
            rows,
            h,
        };
        let [p1, p2] = v.rail(me);
        let mut soff = vec![0usize; n + 1];
        for d in 0..n {
            soff[d + 1] = soff[d] + v.m(me, d);
        }

        // Phase 1: to local j, the rows for rank j of every host, by host.
        let mut s1 = pool.empty();
        for j in 0..l {
            for y in 0..g {
                let d = v.rank(y, j);
                s1.extend_from_slice(&send[soff[d]..soff[d + 1]]);
            }
        }
        // From local j: its rows for rank i of every host, by host.
        let mut r1 = pool.sized(p1.recv.iter().sum());
        if p1.runs {
            self.host.all_to_all_v(&s1, &p1.send, &mut r1, &p1.recv)?;
        }
        pool.give(s1);

        // Phase 2: to host y on this rail, what every rank of this host has
        // for (y, i), by source local index; it arrives by source rank.
        let mut r1off = vec![0usize; l + 1];
        for j in 0..l {
            r1off[j + 1] = r1off[j] + p1.recv[j];
        }
        let mut s2 = pool.empty();
        for y in 0..g {
            for j in 0..l {
                let before: usize = (0..y).map(|z| v.m(v.rank(x, j), v.rank(z, i))).sum();
                let at = r1off[j] + before;
                s2.extend_from_slice(&r1[at..at + v.m(v.rank(x, j), v.rank(y, i))]);
            }
        }
        pool.give(r1);
        if p2.runs {
            debug_assert_eq!(s2.len(), p2.send.iter().sum::<usize>());
            self.rail.all_to_all_v(&s2, &p2.send, recv, &p2.recv)?;
        }
        pool.give(s2);
        Ok(())
    }
}
