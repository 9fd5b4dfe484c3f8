//! Hierarchical algorithms over the topology's levels (BlueConnect, HCCL's
//! hierarchical collectives, Tutel/DeepSpeed-MoE's two-level all-to-all).
//!
//! The topology's levels are read innermost first: level 0 is the `L` ranks
//! of one node, level 1 the nodes of one rack, and so on, with sizes
//! `p_0 = L, p_1, ..., p_{d-1}` and `N = p_0 ⋯ p_{d-1}`. A rank's group at
//! level `k` is the `p_k` ranks that differ from it only in the level-`k`
//! coordinate, so every group above level 0 joins ranks with the **same local
//! index** on different nodes (rail alignment): the `L` rails of a node work
//! in parallel, each on its own NIC and rail switch. Every level runs a ring
//! ([`Ring`]) over its group; a level of size 1 is skipped, so a flat topology
//! degenerates to the plain single ring. `M` is the buffer in elements; for
//! two levels, `G` nodes of `L` ranks.
//!
//! * **allreduce** (BlueConnect): ring reduce-scatter inside level 0, then
//!   level 1 on the part this rank owns, ..., reduce-scatter and allgather at
//!   the top level (a ring allreduce), then allgather back down to level 0.
//!   `Σ_k 2(p_k - 1)` rounds; at level `k` a rank sends
//!   `2(p_k - 1)/p_k · M/(p_0 ⋯ p_{k-1})` elements. Two levels: `2(L-1)/L·M`
//!   inside the node and only `2(G-1)/G·M/L` across it, on each of the `L`
//!   rails at once. A flat ring pushes its whole `2(N-1)/N·M` through every
//!   node-boundary hop, one NIC per node carrying it all; here the slow
//!   links carry `L` times less, which wins as soon as they are the
//!   bottleneck (large `M`, `β_intra / β_inter` large). The latency term,
//!   `2(L-1) + 2(G-1)` rounds, is also far below the flat ring's `2(N-1)`.
//! * **allgather** (block `c`, output `M = Nc`): **outermost level first**,
//!   then inwards: rail peers first exchange single blocks between nodes,
//!   then each node's ranks exchange what they gathered. `Σ_k (p_k - 1)`
//!   rounds; at level `k` a rank sends `(p_k - 1) · c · p_{k+1} ⋯ p_{d-1}`.
//!   Two levels: `(G-1)·c` across nodes and `(L-1)·G·c` inside. The other
//!   order (node first, then nodes exchanging whole node-sized groups, as
//!   HCCL does for contiguous inter-server blocks) makes every rank of a node
//!   fetch the same remote data, `(G-1)·L·c` across nodes per rank, `L`
//!   times more over the slow links for the same total; we pay with
//!   non-contiguous intra-node chunks instead (`G` blocks strided by `Lc`,
//!   sent as `G` messages per step on the fast links).
//! * **reducescatter**: the mirror image, **innermost level first**: each
//!   node reduces its ranks' contributions to every block before anything
//!   crosses a node (same volumes and rounds as allgather), then rail peers
//!   reduce-scatter single blocks. Partial sums live in scratch (`Nc`
//!   elements) in digit-reversed block order, so that from the second level
//!   on every chunk is one contiguous message.
//! * **alltoall** (two levels: nodes × local ranks, outer levels merged into
//!   one set of nodes), the Tutel/DeepSpeed-MoE exchange: (a) inside the
//!   node, rank `(a,i)` sends rank `(a,j)` its blocks for local index `j` on
//!   every node; (b) on rail `j`, `(a,j)` sends `(b,j)` one aggregated message
//!   of the `L` blocks node `a` has for it. 2 rounds; per rank `(L-1)·G·c`
//!   inside the node and `(G-1)·L·c` across it in `G-1` messages, all on the
//!   rank's own rail, instead of the direct exchange's `(G-1)·L` messages of
//!   `c`, most of them cross-rail. The price is a second hop for most data
//!   (intra-node volume `G` times the direct one's) and `(G-1)·L·c` scratch:
//!   it wins when per-message cost, flow count or incast dominates the
//!   inter-node exchange (many small blocks, many nodes); for large blocks on
//!   a non-blocking fabric the direct exchange moves less.
//! * **alltoallv**: no forwarding scheme is possible, see [`all_to_all_v`];
//!   a direct exchange scheduled node pair by node pair (`G` rounds).
//!
//! Rank placement: all of this assumes block placement (rank = node·L +
//! local), which is what the topology describes. If the launcher places ranks
//! round-robin instead, the "level 0" rings run between nodes and the "rails"
//! between ranks of one node: the inter-node volume becomes `L` times the
//! intended one and rail peers share NICs, the seeds' rail-alignment pitfall
//! (nccl-tests at full speed, training at half). Check placement first.

use super::{
    block, offsets, single_rank, Collective, Plan, PlanBuilder, PlanRequest, RoundBuilder, Span,
    Topology,
};

/// One dimension of the group: the ranks that differ from a given rank only
/// in one mixed-radix digit (`size` ranks, `stride` apart).
#[derive(Clone, Copy, Debug)]
pub(super) struct Dim {
    /// Ranks in each group of this dimension.
    pub(super) size: usize,
    /// Distance between consecutive members.
    pub(super) stride: usize,
}

impl Dim {
    /// The coordinate of `rank` in this dimension.
    fn coord(self, rank: usize) -> usize {
        (rank / self.stride) % self.size
    }

    /// The member of `rank`'s group with coordinate `q`.
    fn member(self, rank: usize, q: usize) -> usize {
        rank - self.coord(rank) * self.stride + q * self.stride
    }
}

/// The topology's levels as dimensions, innermost (the ranks of one node)
/// first, matching block placement (innermost level varies fastest).
fn dims_of(topology: &Topology) -> Vec<Dim> {
    let mut stride = 1;
    topology
        .levels()
        .iter()
        .rev()
        .map(|&size| {
            let d = Dim { size, stride };
            stride *= size;
            d
        })
        .collect()
}

/// A ring over the members of one dimension, as one rank sees it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Ring {
    /// Members in the ring.
    size: usize,
    /// This rank's position (its coordinate in the dimension).
    pos: usize,
    /// The rank at position `pos + 1`, which this rank sends to.
    right: usize,
    /// The rank at position `pos - 1`, which this rank receives from.
    left: usize,
}

impl Ring {
    /// The ring of `rank`'s group in dimension `dim`.
    pub(super) fn new(dim: Dim, rank: usize) -> Ring {
        let pos = dim.coord(rank);
        Ring {
            size: dim.size,
            pos,
            right: dim.member(rank, (pos + 1) % dim.size),
            left: dim.member(rank, (pos + dim.size - 1) % dim.size),
        }
    }

    /// Position `pos - k` (mod size).
    fn back(&self, k: usize) -> usize {
        (self.pos + self.size - k % self.size) % self.size
    }
}

/// A part of a chunk that moves as one message.
///
/// `mine` is where this rank's current contribution to the part lives (the
/// input at the first reducing level, the accumulator after); `acc` is where
/// the part accumulates (reduce-scatter) or lands (allgather, which ignores
/// `mine`). Sender and receiver cut a chunk into the same parts, in the same
/// order, so their messages match.
#[derive(Clone, Copy, Debug)]
pub(super) struct Piece {
    /// This rank's own contribution.
    pub(super) mine: Span,
    /// The accumulator, or the destination of a gathered part.
    pub(super) acc: Span,
}

impl Piece {
    /// A part whose contribution and accumulator are the same memory (or an
    /// allgather part).
    fn at(span: Span) -> Piece {
        Piece {
            mine: span,
            acc: span,
        }
    }
}

/// What one ring phase does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// Ring reduce-scatter: position `q` ends with chunk `q` fully reduced.
    ReduceScatter,
    /// Ring allgather: position `q` starts with chunk `q`, ends with all.
    AllGather,
}

/// The parts of chunk `q` of a phase.
type ChunkFn<'a> = Box<dyn Fn(usize) -> Vec<Piece> + 'a>;

/// One ring reduce-scatter or allgather over one dimension: `size - 1`
/// steps, one round each. Kept as data (not emitted at once) so that the 2-D
/// mesh can interleave two schedules step by step.
pub(super) struct Phase<'a> {
    /// Reduce-scatter or allgather.
    kind: Kind,
    /// The ring it runs on.
    ring: Ring,
    /// The parts of each chunk, as this rank addresses them.
    chunk: ChunkFn<'a>,
}

impl Phase<'_> {
    /// Rounds this phase takes.
    pub(super) fn steps(&self) -> usize {
        self.ring.size - 1
    }

    /// Adds the ops of step `s` to `round`.
    ///
    /// Reduce-scatter: step `s` sends chunk `pos-s-1` and folds chunk
    /// `pos-s-2` from the left, so the chunk sent at step `s >= 1` is the one
    /// folded at step `s-1`, and the last step folds chunk `pos` itself.
    /// Allgather: step `s` passes on chunk `pos-s` and receives `pos-s-1`.
    /// Empty parts are skipped; both ends compute the same lengths.
    pub(super) fn emit(&self, round: &mut RoundBuilder<'_>, s: usize) {
        let ring = &self.ring;
        match self.kind {
            Kind::ReduceScatter => {
                for piece in (self.chunk)(ring.back(s + 1)) {
                    if piece.acc.len > 0 {
                        // At step 0 the chunk is still only this rank's own.
                        round.send(ring.right, if s == 0 { piece.mine } else { piece.acc });
                    }
                }
                for piece in (self.chunk)(ring.back(s + 2)) {
                    if piece.acc.len > 0 {
                        round.recv_reduce(ring.left, piece.acc, piece.mine);
                    }
                }
            }
            Kind::AllGather => {
                for piece in (self.chunk)(ring.back(s)) {
                    if piece.acc.len > 0 {
                        // At step 0 the chunk is this rank's own, which a
                        // piece may give where it already is (`mine`).
                        round.send(ring.right, if s == 0 { piece.mine } else { piece.acc });
                    }
                }
                for piece in (self.chunk)(ring.back(s + 1)) {
                    if piece.acc.len > 0 {
                        round.recv(ring.left, piece.acc);
                    }
                }
            }
        }
    }
}

/// Appends the phases one after another, one round per step.
pub(super) fn emit_phases(p: &mut PlanBuilder, phases: &[Phase<'_>]) {
    for phase in phases {
        for s in 0..phase.steps() {
            phase.emit(&mut p.round(), s);
        }
    }
}

/// The phases of a multi-level allreduce of `len` elements from `offset`,
/// reducing over `dims` in the order given (ring reduce-scatter in each, on
/// the part the previous one left this rank) and gathering back in reverse.
///
/// Dimensions of size 1 are skipped. The first reducing phase reads this
/// rank's contribution from the input and accumulates into the output at the
/// same offsets (in place that is an accumulation into the caller's buffer);
/// every later phase works in the output only, so the input is never read
/// after the output was written.
pub(super) fn all_reduce_phases(
    rank: usize,
    dims: &[Dim],
    offset: usize,
    len: usize,
) -> Vec<Phase<'static>> {
    let active: Vec<Dim> = dims.iter().copied().filter(|d| d.size > 1).collect();
    let mut ranges = Vec::with_capacity(active.len());
    let mut phases = Vec::with_capacity(2 * active.len());
    let (mut off, mut len) = (offset, len);
    for (k, &dim) in active.iter().enumerate() {
        let ring = Ring::new(dim, rank);
        let first = k == 0;
        ranges.push((off, len));
        let (o, l) = (off, len);
        phases.push(Phase {
            kind: Kind::ReduceScatter,
            ring,
            chunk: Box::new(move |q| {
                let (bo, bl) = block(l, dim.size, q);
                let acc = Span::output(o + bo, bl);
                let mine = if first { Span::input(o + bo, bl) } else { acc };
                vec![Piece { mine, acc }]
            }),
        });
        // The next level works on the part this rank now owns.
        let (bo, bl) = block(len, dim.size, ring.pos);
        off += bo;
        len = bl;
    }
    for (&dim, &(o, l)) in active.iter().zip(&ranges).rev() {
        phases.push(Phase {
            kind: Kind::AllGather,
            ring: Ring::new(dim, rank),
            chunk: Box::new(move |q| {
                let (bo, bl) = block(l, dim.size, q);
                vec![Piece::at(Span::output(o + bo, bl))]
            }),
        });
    }
    phases
}

/// Multi-level allreduce over `dims` (innermost first) on the whole buffer;
/// a group of one rank (every dimension of size 1) just copies.
pub(super) fn all_reduce_over(req: &PlanRequest, dims: &[Dim]) -> Plan {
    let count = req.count;
    let mut p = PlanBuilder::default();
    if dims.iter().all(|d| d.size == 1) {
        p.round()
            .copy(Span::output(0, count), Span::input(0, count));
        return p.finish();
    }
    emit_phases(&mut p, &all_reduce_phases(req.rank, dims, 0, count));
    p.finish()
}

/// Hierarchical (BlueConnect) allreduce over the request's topology.
pub(super) fn all_reduce(req: &PlanRequest) -> Plan {
    all_reduce_over(req, &dims_of(&req.topology))
}

/// Block indices in digit-reversed order: the innermost coordinate most
/// significant. In this order the blocks that share a rank's coordinates
/// below level `k` are contiguous, and so is each level-`k` chunk of them,
/// which lets the block collectives address a level's chunk as a range.
struct Order {
    /// The levels, innermost first.
    dims: Vec<Dim>,
    /// `tail[k]`: product of the sizes of the levels above `k`, the weight
    /// of coordinate `k` in the reversed index (and the blocks in one
    /// level-`k` chunk).
    tail: Vec<usize>,
}

impl Order {
    /// The order for `topology`.
    fn new(topology: &Topology) -> Order {
        let dims = dims_of(topology);
        let n = topology.size();
        let tail = dims.iter().map(|d| n / (d.stride * d.size)).collect();
        Order { dims, tail }
    }

    /// The block (rank) at reversed index `t`.
    fn block_at(&self, t: usize) -> usize {
        self.dims
            .iter()
            .zip(&self.tail)
            .map(|(d, &w)| (t / w) % d.size * d.stride)
            .sum()
    }

    /// Reversed index of the first block sharing `rank`'s coordinates below
    /// level `k` (those blocks are the next `tail[k] * size_k`).
    fn base(&self, rank: usize, k: usize) -> usize {
        self.dims[..k]
            .iter()
            .zip(&self.tail)
            .map(|(d, &w)| d.coord(rank) * w)
            .sum()
    }

    /// Reversed indices of level-`k` chunk `q` of `rank`'s blocks.
    fn chunk(&self, rank: usize, k: usize, q: usize) -> std::ops::Range<usize> {
        let start = self.base(rank, k) + q * self.tail[k];
        start..start + self.tail[k]
    }

    /// Indices of the levels that have more than one rank.
    fn active(&self) -> Vec<usize> {
        (0..self.dims.len())
            .filter(|&k| self.dims[k].size > 1)
            .collect()
    }
}

/// Spans in order, adjacent ones merged.
fn coalesce(spans: impl Iterator<Item = Span>) -> Vec<Span> {
    let mut out: Vec<Span> = Vec::new();
    for s in spans {
        match out.last_mut() {
            Some(last) if last.buf == s.buf && last.end() == s.offset => last.len += s.len,
            _ => out.push(s),
        }
    }
    out
}

/// Hierarchical allgather: rings from the outermost level in.
///
/// At level `k`, position `q` of the ring owns the blocks whose coordinates
/// below `k` are this rank's, whose level-`k` coordinate is `q`, and whose
/// outer coordinates are anything (gathered at the outer levels already).
/// They land straight at their rank-order place in the output; adjacent
/// blocks travel as one message.
pub(super) fn all_gather(req: &PlanRequest) -> Plan {
    let (n, r, c) = (req.n, req.rank, req.count);
    if n == 1 {
        return single_rank(c);
    }
    let mut p = PlanBuilder::default();
    if c == 0 {
        return p.finish();
    }
    let order = Order::new(&req.topology);
    let own = Span::output(r * c, c);
    let active = order.active();
    let outermost = active[active.len() - 1];
    let phases: Vec<Phase<'_>> = active
        .into_iter()
        .rev()
        .map(|k| {
            let order = &order;
            let ring = Ring::new(order.dims[k], r);
            Phase {
                kind: Kind::AllGather,
                ring,
                chunk: Box::new(move |q| {
                    if k == outermost && q == ring.pos {
                        // The outermost ring's own chunk is this rank's
                        // block alone: it goes out from the input, so the
                        // first send neither waits for the copy below nor
                        // has the peer read lines just written.
                        return vec![Piece {
                            mine: Span::input(0, c),
                            acc: own,
                        }];
                    }
                    let spans = order
                        .chunk(r, k, q)
                        .map(|t| Span::output(order.block_at(t) * c, c));
                    coalesce(spans).into_iter().map(Piece::at).collect()
                }),
            }
        })
        .collect();
    for (i, phase) in phases.iter().enumerate() {
        for s in 0..phase.steps() {
            let mut round = p.round();
            phase.emit(&mut round, s);
            if i == 0 && s == 0 {
                // The own block into the output, overlapped with the first
                // messages (listed after them); inner rings send it from
                // there. In place the input is this very block: a no-op.
                round.copy(own, Span::input(0, c));
            }
        }
    }
    p.finish()
}

/// Hierarchical reduce-scatter: rings from the innermost level out.
///
/// Partial sums accumulate in scratch at the blocks' digit-reversed places
/// (`N·c` elements, where the flat ring needs `2c`: every block a rank ever
/// folds keeps its own place, which is what lets the later levels address
/// their chunks as ranges of it). The first ring reads the caller's blocks from the input,
/// where one chunk is strided, so it moves one message per block; every later
/// ring works on a contiguous range of scratch, one message per chunk. The
/// rank's own block is folded for the last time straight into the output.
/// In place the output is the input's block `rank`, which only the last fold
/// writes, after every read of the input.
pub(super) fn reduce_scatter(req: &PlanRequest) -> Plan {
    let (n, r, c) = (req.n, req.rank, req.count);
    if n == 1 {
        return single_rank(c);
    }
    let mut p = PlanBuilder::default();
    if c == 0 {
        return p.finish();
    }
    let order = Order::new(&req.topology);
    let active = order.active();
    let (first, last) = (active[0], active[active.len() - 1]);
    p.scratch(n * c);
    let phases: Vec<Phase<'_>> = active
        .iter()
        .map(|&k| {
            let order = &order;
            let ring = Ring::new(order.dims[k], r);
            Phase {
                kind: Kind::ReduceScatter,
                ring,
                chunk: Box::new(move |q| {
                    let range = order.chunk(r, k, q);
                    if k == last && q == ring.pos {
                        // At the last level a chunk is one block: this rank's.
                        let mine = if k == first {
                            Span::input(r * c, c)
                        } else {
                            Span::scratch(range.start * c, c)
                        };
                        return vec![Piece {
                            mine,
                            acc: Span::output(0, c),
                        }];
                    }
                    if k == first {
                        range
                            .map(|t| Piece {
                                mine: Span::input(order.block_at(t) * c, c),
                                acc: Span::scratch(t * c, c),
                            })
                            .collect()
                    } else {
                        vec![Piece::at(Span::scratch(range.start * c, range.len() * c))]
                    }
                }),
            }
        })
        .collect();
    emit_phases(&mut p, &phases);
    p.finish()
}

/// Hierarchical alltoall (two-level, Tutel/DeepSpeed-MoE) or, for
/// alltoallv, the node-paired direct exchange of [`all_to_all_v`].
///
/// Rank `(a,i)` = node `a`, local index `i`; `G` nodes of `L` ranks.
/// Round 1, inside the node: `(a,i)` sends `(a,j)` its blocks for `(b,j)`,
/// every node `b`, one message per block (they are strided `Lc` apart in the
/// input; the fast links absorb the message count). `(a,j)` keeps the block
/// for itself in the output and files the others in scratch by destination
/// node, `[b][i]`, so that node `b`'s `L` blocks are contiguous. Round 2, on
/// rail `j` only: `(a,j)` sends `(b,j)` that contiguous `L·c` run, which lands
/// as source ranks `(a,0..L)` = the output's run for node `a`.
pub(super) fn all_to_all(req: &PlanRequest) -> Plan {
    if req.collective == Collective::AllToAllV {
        return all_to_all_v(req);
    }
    let (r, c) = (req.rank, req.count);
    let (l, g) = (req.topology.local_size(), req.topology.nodes());
    let (a, i) = (r / l, r % l);
    let mut p = PlanBuilder::default();
    if c == 0 {
        return p.finish(); // every rank knows: nothing to move
    }
    // Scratch run for destination node b != a (own node's blocks never wait
    // in scratch): runs in order a+1, a+2, ...
    let forwards = l > 1 && g > 1;
    let run = |b: usize| Span::scratch(((b + g - a - 1) % g) * l * c, l * c);
    if forwards {
        p.scratch((g - 1) * l * c);
    }
    let mut round = p.round();
    round.copy(Span::output(r * c, c), Span::input(r * c, c));
    if forwards {
        // This rank's own blocks for its rail peers join the runs it forwards.
        for b in (0..g).filter(|&b| b != a) {
            let slot = run(b);
            round.copy(
                Span::scratch(slot.offset + i * c, c),
                Span::input((b * l + i) * c, c),
            );
        }
    }
    for k in 1..l {
        let j = (i + k) % l;
        for b in 0..g {
            round.send(a * l + j, Span::input((b * l + j) * c, c));
        }
    }
    for k in 1..l {
        let from = (i + l - k) % l;
        for b in 0..g {
            let dst = if b == a {
                Span::output((a * l + from) * c, c)
            } else {
                Span::scratch(run(b).offset + from * c, c)
            };
            round.recv(a * l + from, dst);
        }
    }
    let mut round = p.round();
    for d in 1..g {
        let b = (a + d) % g;
        // With one rank per node the run is just the input block.
        let src = if forwards {
            run(b)
        } else {
            Span::input(b * c, c)
        };
        round.send(b * l + i, src);
    }
    for d in 1..g {
        let b = (a + g - d) % g;
        round.recv(b * l + i, Span::output(b * l * c, l * c));
    }
    p.finish()
}

/// Hierarchical alltoallv: a direct exchange, ordered node pair by node
/// pair; no forwarding.
///
/// Why not the two-level forwarding of [`all_to_all`]: every forwarding path
/// from `(a,i)` to `(b,j)` with `j != i` passes through a third rank (`(a,j)`
/// or `(b,i)`) that must post a receive of exactly the forwarded length and
/// send it on. That length is `send_counts[(b,j)]` of rank `(a,i)`, which the
/// intermediate rank does not know: a request carries only its own rank's
/// send and receive counts. Nor can the plan exchange the counts first: a
/// plan is fixed before any data moves (lengths, offsets and scratch are part
/// of it), so a count received at run time cannot shape it. Aggregating per
/// destination node fails the same way (the receiving rail peer does not know
/// the aggregate's length). So no rank can forward, and the inter-node
/// message count cannot drop below the direct `(G-1)·L` per rank.
///
/// What the topology still buys is the order: round 0 exchanges with the
/// `L-1` ranks of the own node; in round `d = 1..G`, rank `(a,i)` sends to
/// every rank of node `a+d` (its rail peer's message posted first) and
/// receives from node
/// `a-d`. Every node talks to exactly one other node per round (a pairwise
/// schedule at node granularity), so no node's NICs see incast from all
/// others at once and the per-round inter-node flows form a permutation of
/// nodes. `G` rounds, direct volumes. Zero-length messages are still sent,
/// so ranks whose counts disagree get a length mismatch instead of a hang.
fn all_to_all_v(req: &PlanRequest) -> Plan {
    let r = req.rank;
    let (l, g) = (req.topology.local_size(), req.topology.nodes());
    let (a, i) = (r / l, r % l);
    let (send, recv) = (&req.send_counts, &req.recv_counts);
    let (soff, roff) = (offsets(send), offsets(recv));
    let to = |q: usize| Span::input(soff[q], send[q]);
    let from = |q: usize| Span::output(roff[q], recv[q]);
    let mut p = PlanBuilder::default();
    let mut round = p.round();
    round.copy(from(r), to(r));
    for k in 1..l {
        round.send(a * l + (i + k) % l, to(a * l + (i + k) % l));
    }
    for k in 1..l {
        let q = a * l + (i + l - k) % l;
        round.recv(q, from(q));
    }
    for d in 1..g {
        let (out, inn) = ((a + d) % g, (a + g - d) % g);
        let mut round = p.round();
        for k in 0..l {
            let q = out * l + (i + k) % l;
            round.send(q, to(q));
        }
        for k in 0..l {
            let q = inn * l + (i + l - k) % l;
            round.recv(q, from(q));
        }
    }
    p.finish()
}
