//! Plans: what one rank does in a collective, as data.
//!
//! An algorithm is a pure function from a [`PlanRequest`] (collective, group
//! size, this rank, counts, root, ...) to a [`Plan`]: an ordered list of
//! [`Round`]s, each a set of [`Op`]s over three buffers ([`Buf::Input`],
//! [`Buf::Output`], [`Buf::Scratch`]). Plans never touch a socket, a thread or
//! a clock; the executor (`exec.rs`) runs them over any transport and the
//! simulator runs the plans of all ranks against a network model.
//!
//! # Round semantics
//!
//! Within a round, the local ops ([`Op::Copy`], [`Op::Reduce`]) run first, in
//! order; then every send and receive of the round is in flight at once (so a
//! ring step sends and receives concurrently, and a direct all-to-all posts all
//! its messages together). The round ends when all of them are done. Messages
//! between one pair of ranks in one collective are matched in plan order
//! (FIFO), so a rank may exchange several messages with the same peer.
//!
//! A valid plan (see [`validate`]) never lets a round write a span that the
//! same round reads elsewhere or writes twice; the one exception is
//! [`Op::RecvReduce`] whose `local` is exactly its `dst` (accumulate in place).
//!
//! Spans count **elements**, not bytes; the executor scales by the element
//! size. Only the pipelined algorithms look at the element size, to choose
//! segment lengths in bytes.
//!
//! # Why rounds
//!
//! The seeds' algorithms (ring, two-port ring, trees, double binary tree,
//! butterfly, halving-doubling with its non-power-of-two pre/post step, mesh,
//! pairwise, Bruck, hierarchical, torus) are all described as a sequence of
//! steps in which each rank sends to and receives from a few peers. A round is
//! exactly such a step: the cost model charges alpha + bytes/beta per round on
//! each rank's ports, and the simulator replays rounds message by message.

mod barrier;
mod bruck;
mod butterfly;
mod check;
mod composite;
mod dbtree;
mod direct;
mod halving_doubling;
mod hier;
pub mod pairing;
mod pairwise;
mod ring;
mod torus;
mod tree;

pub use check::{inter_node_elements, match_messages, validate, Layout, MessageStats};
pub(crate) use dbtree::segments as dbtree_segments;
pub(crate) use ring::chain_segments;

use crate::error::{Error, Result};
pub use crate::topo::Topology;

/// The collectives ferrocoll implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Collective {
    /// Every rank gets the reduction of every rank's buffer.
    AllReduce,
    /// The root's buffer is copied to every rank.
    Broadcast,
    /// The root gets the reduction of every rank's buffer.
    Reduce,
    /// Every rank gets every rank's block, in rank order.
    AllGather,
    /// Rank r gets block r of the reduction of every rank's n blocks.
    ReduceScatter,
    /// Rank r sends its block p to rank p and receives block r of every rank.
    AllToAll,
    /// As [`Collective::AllToAll`] with per-peer counts.
    AllToAllV,
    /// The root gets every rank's block, in rank order.
    Gather,
    /// Rank r gets block r of the root's buffer.
    Scatter,
    /// No rank leaves until every rank has entered.
    Barrier,
}

impl Collective {
    /// Every collective, in a stable order.
    pub const ALL: [Collective; 10] = [
        Collective::AllReduce,
        Collective::Broadcast,
        Collective::Reduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::AllToAll,
        Collective::AllToAllV,
        Collective::Gather,
        Collective::Scatter,
        Collective::Barrier,
    ];

    /// The name used in `FERROCOLL_ALGO`, on the command line and in JSON
    /// (nccl-tests' short names: `allreduce`, `bcast`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "allreduce",
            Collective::Broadcast => "bcast",
            Collective::Reduce => "reduce",
            Collective::AllGather => "allgather",
            Collective::ReduceScatter => "reducescatter",
            Collective::AllToAll => "alltoall",
            Collective::AllToAllV => "alltoallv",
            Collective::Gather => "gather",
            Collective::Scatter => "scatter",
            Collective::Barrier => "barrier",
        }
    }

    /// Parses a collective name (also accepts `broadcast`, `all_reduce`, ...).
    pub fn from_name(s: &str) -> Option<Collective> {
        let key: String = s
            .chars()
            .filter(|c| *c != '_' && *c != '-')
            .collect::<String>()
            .to_ascii_lowercase();
        let key = if key == "broadcast" {
            "bcast".to_string()
        } else {
            key
        };
        Collective::ALL.into_iter().find(|c| c.name() == key)
    }

    /// True if the collective has a root argument.
    pub const fn has_root(self) -> bool {
        matches!(
            self,
            Collective::Broadcast | Collective::Reduce | Collective::Gather | Collective::Scatter
        )
    }

    /// True if the collective reduces (takes a [`crate::ReduceOp`]).
    pub const fn reduces(self) -> bool {
        matches!(
            self,
            Collective::AllReduce | Collective::Reduce | Collective::ReduceScatter
        )
    }

    /// The algorithms this collective has, `auto` excluded.
    pub fn algorithms(self) -> &'static [Algorithm] {
        use Algorithm::*;
        match self {
            Collective::AllReduce => &[
                Ring,
                Ring2,
                Tree,
                DoubleBinaryTree,
                Butterfly,
                HalvingDoubling,
                Direct,
                Star,
                Hier,
                Torus2d,
                Mesh2d,
            ],
            Collective::Broadcast => &[Tree, ScatterAllgather, Pipeline, Direct],
            Collective::Reduce => &[Tree, RsGather, Pipeline],
            Collective::AllGather => &[Ring, Butterfly, Bruck, Direct, Hier],
            Collective::ReduceScatter => &[Ring, Halving, Pairwise, Direct, Hier],
            Collective::AllToAll => &[Direct, Pairwise, Bruck, Hier],
            Collective::AllToAllV => &[Direct, Pairwise, Hier],
            Collective::Gather | Collective::Scatter => &[Linear, Tree],
            Collective::Barrier => &[Dissemination, Tree],
        }
    }
}

impl std::fmt::Display for Collective {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// An algorithm family. Which collectives have which is
/// [`Collective::algorithms`]; the plan functions live one family per file.
///
/// "Power of two" algorithms work for every group size with the seeds'
/// pre/post step: the r = N - 2^floor(log2 N) extra ranks first fold their
/// data into a partner, sit out the power-of-two core, and receive the result
/// after.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Ring: allreduce as reduce-scatter + allgather around the ring
    /// (bandwidth-optimal, 2(N-1) steps); allgather and reduce-scatter in N-1
    /// steps.
    Ring,
    /// Two-port ring (allreduce): half the buffer goes clockwise, half
    /// counter-clockwise, using both directions of every link at once.
    Ring2,
    /// Binomial tree: broadcast, reduce, gather and scatter in ceil(log2 N)
    /// rounds; allreduce as tree reduce to rank 0 then tree broadcast; barrier
    /// as an empty gather then broadcast.
    Tree,
    /// Double binary tree (allreduce, as NCCL builds it): two complementary
    /// binary trees, each reducing and broadcasting half of the buffer; a rank
    /// that is a leaf in one tree is interior in the other.
    DoubleBinaryTree,
    /// Recursive doubling: log2 N rounds exchanging the whole (allreduce) or
    /// the gathered-so-far (allgather) buffer with the partner at distance 2^k.
    Butterfly,
    /// Recursive halving-doubling, Rabenseifner's allreduce: reduce-scatter
    /// by recursive halving, then allgather by recursive doubling.
    HalvingDoubling,
    /// Recursive halving reduce-scatter.
    Halving,
    /// Direct (mesh): every rank exchanges with every peer in one round.
    Direct,
    /// Star (allreduce): every rank sends to rank 0, which reduces and sends
    /// the result back; the parameter-server baseline.
    Star,
    /// Linear gather/scatter: the root exchanges with every rank in one round.
    Linear,
    /// Dissemination barrier: ceil(log2 N) rounds, rank r signals r + 2^k.
    Dissemination,
    /// Bruck: allgather and alltoall in ceil(log2 N) rounds for any N, at
    /// the price of local copies (in alltoall block i travels popcount(i)
    /// hops, so each round carries about half of the blocks).
    Bruck,
    /// Pairwise exchange: in step k rank i sends to i+k and receives from
    /// i-k (N-1 steps, one peer per step).
    Pairwise,
    /// Hierarchical over the topology's levels: reduce-scatter (or gather)
    /// inside each level from the innermost out, the top-level exchange
    /// between nodes, and back out.
    Hier,
    /// 2-D torus allreduce (Sony): reduce-scatter along rows, allreduce
    /// along columns, allgather along rows.
    Torus2d,
    /// 2-D mesh allreduce (Google): each half of the buffer runs the torus
    /// scheme with the dimensions in opposite order, both at once.
    Mesh2d,
    /// Broadcast by scatter then ring allgather (van de Geijn).
    ScatterAllgather,
    /// Segmented pipeline along the ring (broadcast, reduce): segments flow
    /// root -> root+1 -> ... one hop per round (NCCL's ring broadcast/reduce).
    /// `ring` names it too for these collectives.
    Pipeline,
    /// Reduce as reduce-scatter then gather to the root (Rabenseifner).
    RsGather,
}

impl Algorithm {
    /// Every algorithm, in a stable order.
    pub const ALL: [Algorithm; 19] = [
        Algorithm::Ring,
        Algorithm::Ring2,
        Algorithm::Tree,
        Algorithm::DoubleBinaryTree,
        Algorithm::Butterfly,
        Algorithm::HalvingDoubling,
        Algorithm::Halving,
        Algorithm::Direct,
        Algorithm::Star,
        Algorithm::Linear,
        Algorithm::Dissemination,
        Algorithm::Bruck,
        Algorithm::Pairwise,
        Algorithm::Hier,
        Algorithm::Torus2d,
        Algorithm::Mesh2d,
        Algorithm::ScatterAllgather,
        Algorithm::Pipeline,
        Algorithm::RsGather,
    ];

    /// The name used in `FERROCOLL_ALGO` and in benchmark output.
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::Ring => "ring",
            Algorithm::Ring2 => "ring2",
            Algorithm::Tree => "tree",
            Algorithm::DoubleBinaryTree => "dbtree",
            Algorithm::Butterfly => "butterfly",
            Algorithm::HalvingDoubling => "hd",
            Algorithm::Halving => "halving",
            Algorithm::Direct => "direct",
            Algorithm::Star => "star",
            Algorithm::Linear => "linear",
            Algorithm::Dissemination => "dissemination",
            Algorithm::Bruck => "bruck",
            Algorithm::Pairwise => "pairwise",
            Algorithm::Hier => "hier",
            Algorithm::Torus2d => "torus2d",
            Algorithm::Mesh2d => "mesh2d",
            Algorithm::ScatterAllgather => "scatter_allgather",
            Algorithm::Pipeline => "pipeline",
            Algorithm::RsGather => "rs_gather",
        }
    }

    /// Parses an algorithm name.
    pub fn from_name(s: &str) -> Option<Algorithm> {
        let key = s.to_ascii_lowercase();
        Algorithm::ALL.into_iter().find(|a| a.name() == key)
    }

    /// This algorithm as `coll` knows it: itself if the collective has it,
    /// `pipeline` for `ring` on broadcast and reduce (whose ring algorithm is
    /// the pipelined chain), `None` otherwise.
    pub fn for_collective(self, coll: Collective) -> Option<Algorithm> {
        if coll.algorithms().contains(&self) {
            Some(self)
        } else if self == Algorithm::Ring
            && matches!(coll, Collective::Broadcast | Collective::Reduce)
        {
            Some(Algorithm::Pipeline)
        } else {
            None
        }
    }
}

impl std::fmt::Display for Algorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Which buffer a span refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Buf {
    /// The caller's send buffer (read-only).
    Input,
    /// The caller's receive buffer.
    Output,
    /// Temporary memory owned by the executor, [`Plan::scratch`] elements.
    Scratch,
}

/// A range of elements in one buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Span {
    /// The buffer.
    pub buf: Buf,
    /// First element.
    pub offset: usize,
    /// Number of elements.
    pub len: usize,
}

impl Span {
    /// `len` elements of the input buffer from `offset`.
    pub const fn input(offset: usize, len: usize) -> Span {
        Span {
            buf: Buf::Input,
            offset,
            len,
        }
    }
    /// `len` elements of the output buffer from `offset`.
    pub const fn output(offset: usize, len: usize) -> Span {
        Span {
            buf: Buf::Output,
            offset,
            len,
        }
    }
    /// `len` elements of scratch from `offset`.
    pub const fn scratch(offset: usize, len: usize) -> Span {
        Span {
            buf: Buf::Scratch,
            offset,
            len,
        }
    }
    /// One past the last element.
    pub const fn end(&self) -> usize {
        self.offset + self.len
    }
}

/// One step of a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Send `src` to `peer`.
    Send {
        /// Destination rank (in the group).
        peer: usize,
        /// What to send.
        src: Span,
    },
    /// Receive from `peer` into `dst` (the message has `dst.len` elements).
    Recv {
        /// Source rank.
        peer: usize,
        /// Where the data lands.
        dst: Span,
    },
    /// Receive from `peer` and store `dst = local op incoming`. `local` is
    /// either exactly `dst` (accumulate) or disjoint from it.
    RecvReduce {
        /// Source rank.
        peer: usize,
        /// Where the result lands.
        dst: Span,
        /// The local operand.
        local: Span,
    },
    /// Local copy `dst = src` (a no-op when both name the same memory).
    Copy {
        /// Destination.
        dst: Span,
        /// Source.
        src: Span,
    },
    /// Local reduction `dst = a op b`.
    Reduce {
        /// Destination (exactly `a`, or disjoint from it; always disjoint
        /// from `b`).
        dst: Span,
        /// First operand.
        a: Span,
        /// Second operand.
        b: Span,
    },
}

impl Op {
    /// The peer of a communication op, `None` for local ops.
    pub const fn peer(&self) -> Option<usize> {
        match *self {
            Op::Send { peer, .. } | Op::Recv { peer, .. } | Op::RecvReduce { peer, .. } => {
                Some(peer)
            }
            Op::Copy { .. } | Op::Reduce { .. } => None,
        }
    }
}

/// A set of ops in flight together (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Round {
    /// The ops, local ones first in execution order.
    pub ops: Vec<Op>,
}

/// What one rank does in one collective.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// The rounds, in order.
    pub rounds: Vec<Round>,
    /// Scratch elements the plan needs.
    pub scratch: usize,
}

impl Plan {
    /// Elements this rank sends in total.
    pub fn elements_sent(&self) -> usize {
        self.ops()
            .filter_map(|op| match op {
                Op::Send { src, .. } => Some(src.len),
                _ => None,
            })
            .sum()
    }

    /// Number of messages this rank sends.
    pub fn messages_sent(&self) -> usize {
        self.ops()
            .filter(|op| matches!(op, Op::Send { .. }))
            .count()
    }

    /// All ops of all rounds in order.
    pub fn ops(&self) -> impl Iterator<Item = &Op> {
        self.rounds.iter().flat_map(|r| r.ops.iter())
    }
}

/// Everything an algorithm needs to know to plan one rank's part.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanRequest {
    /// The collective.
    pub collective: Collective,
    /// Group size.
    pub n: usize,
    /// This rank, `0..n`.
    pub rank: usize,
    /// Element count: the whole buffer for allreduce, broadcast and reduce;
    /// the per-rank block for allgather, reducescatter, alltoall, gather and
    /// scatter; ignored for alltoallv and barrier.
    pub count: usize,
    /// Root rank for rooted collectives (0 otherwise).
    pub root: usize,
    /// Element size in bytes (only pipelined algorithms use it, to size
    /// segments).
    pub elem_size: usize,
    /// For alltoallv: elements this rank sends to each peer.
    pub send_counts: Vec<usize>,
    /// For alltoallv: elements this rank receives from each peer.
    pub recv_counts: Vec<usize>,
    /// How the group's ranks nest into nodes; only the hierarchical, torus
    /// and mesh algorithms read it. Its size is `n`.
    pub topology: Topology,
}

impl PlanRequest {
    /// A request for a collective with a uniform count.
    pub fn new(collective: Collective, n: usize, rank: usize, count: usize) -> PlanRequest {
        PlanRequest {
            collective,
            n,
            rank,
            count,
            root: 0,
            elem_size: 4,
            send_counts: Vec::new(),
            recv_counts: Vec::new(),
            topology: Topology::flat(n),
        }
    }

    /// Sets the topology (its size must be `n`).
    pub fn with_topology(mut self, topology: Topology) -> PlanRequest {
        self.topology = topology;
        self
    }

    /// Sets the root.
    pub fn with_root(mut self, root: usize) -> PlanRequest {
        self.root = root;
        self
    }

    /// Sets the element size in bytes.
    pub fn with_elem_size(mut self, elem_size: usize) -> PlanRequest {
        self.elem_size = elem_size;
        self
    }

    /// Sets alltoallv counts.
    pub fn with_counts(mut self, send: Vec<usize>, recv: Vec<usize>) -> PlanRequest {
        self.send_counts = send;
        self.recv_counts = recv;
        self
    }

    /// Elements in the input buffer this request implies.
    pub fn input_len(&self) -> usize {
        let (n, c) = (self.n, self.count);
        match self.collective {
            Collective::AllReduce | Collective::Broadcast | Collective::Reduce => c,
            Collective::AllGather | Collective::Gather => c,
            Collective::ReduceScatter | Collective::AllToAll => n * c,
            Collective::Scatter => {
                if self.rank == self.root {
                    n * c
                } else {
                    0
                }
            }
            Collective::AllToAllV => self.send_counts.iter().sum(),
            Collective::Barrier => 0,
        }
    }

    /// Elements in the output buffer this request implies.
    pub fn output_len(&self) -> usize {
        let (n, c) = (self.n, self.count);
        match self.collective {
            Collective::AllReduce | Collective::Broadcast => c,
            Collective::Reduce => {
                if self.rank == self.root {
                    c
                } else {
                    0
                }
            }
            Collective::AllGather | Collective::AllToAll => n * c,
            Collective::Gather => {
                if self.rank == self.root {
                    n * c
                } else {
                    0
                }
            }
            Collective::ReduceScatter | Collective::Scatter => c,
            Collective::AllToAllV => self.recv_counts.iter().sum(),
            Collective::Barrier => 0,
        }
    }
}

/// The whole collective for a group of one (or a count every rank agrees
/// makes it local): copy `len` input elements to the output. In place the
/// copy is a no-op, which the executor skips.
pub(crate) fn single_rank(len: usize) -> Plan {
    let mut p = PlanBuilder::default();
    p.round().copy(Span::output(0, len), Span::input(0, len));
    p.finish()
}

/// Exclusive prefix sums of per-peer counts: where each peer's block starts
/// in a packed buffer.
pub(crate) fn offsets(counts: &[usize]) -> Vec<usize> {
    counts
        .iter()
        .scan(0, |acc, &c| {
            let start = *acc;
            *acc += c;
            Some(start)
        })
        .collect()
}

/// Builds the plan of `algorithm` for `req`.
///
/// Fails with [`Error::UnknownAlgorithm`] when the collective does not have
/// that algorithm, and with [`Error::InvalidArgument`] for an impossible
/// request (rank or root outside the group, alltoallv counts of the wrong
/// length).
pub fn build(algorithm: Algorithm, req: &PlanRequest) -> Result<Plan> {
    let coll = req.collective;
    let algorithm = algorithm
        .for_collective(coll)
        .ok_or_else(|| unknown_algorithm(coll, algorithm.name()))?;
    if req.n == 0 || req.rank >= req.n {
        return Err(Error::invalid(format!(
            "rank {} is not in a group of {} ranks",
            req.rank, req.n
        )));
    }
    if coll.has_root() && req.root >= req.n {
        return Err(Error::invalid(format!(
            "root {} is not in a group of {} ranks; use 0..{}",
            req.root, req.n, req.n
        )));
    }
    if coll == Collective::AllToAllV
        && (req.send_counts.len() != req.n || req.recv_counts.len() != req.n)
    {
        return Err(Error::invalid(format!(
            "alltoallv needs one send and one receive count per rank ({}), got {} and {}",
            req.n,
            req.send_counts.len(),
            req.recv_counts.len()
        )));
    }
    if req.topology.size() != req.n {
        return Err(Error::invalid(format!(
            "topology {} does not describe a group of {} ranks",
            req.topology, req.n
        )));
    }
    use Algorithm as A;
    use Collective as C;
    let plan = match (algorithm, coll) {
        (A::Ring, C::AllReduce) => ring::all_reduce(req),
        (A::Ring, C::AllGather) => ring::all_gather(req),
        (A::Ring, C::ReduceScatter) => ring::reduce_scatter(req),
        (A::Ring2, C::AllReduce) => ring::all_reduce_bidirectional(req),
        (A::Pipeline, C::Broadcast) => ring::broadcast(req),
        (A::Pipeline, C::Reduce) => ring::reduce(req),
        (A::Tree, C::AllReduce) => tree::all_reduce(req),
        (A::Tree, C::Broadcast) => tree::broadcast(req),
        (A::Tree, C::Reduce) => tree::reduce(req),
        (A::Tree, C::Gather) => tree::gather(req),
        (A::Tree, C::Scatter) => tree::scatter(req),
        (A::Tree, C::Barrier) => tree::barrier(req),
        (A::DoubleBinaryTree, C::AllReduce) => dbtree::all_reduce(req),
        (A::Butterfly, C::AllReduce) => butterfly::all_reduce(req),
        (A::Butterfly, C::AllGather) => butterfly::all_gather(req),
        (A::HalvingDoubling, C::AllReduce) => halving_doubling::all_reduce(req),
        (A::Halving, C::ReduceScatter) => halving_doubling::reduce_scatter(req),
        (A::Direct, C::AllReduce) => direct::all_reduce(req),
        (A::Direct, C::AllGather) => direct::all_gather(req),
        (A::Direct, C::ReduceScatter) => direct::reduce_scatter(req),
        (A::Direct, C::Broadcast) => direct::broadcast(req),
        (A::Direct, C::AllToAll | C::AllToAllV) => direct::all_to_all(req),
        (A::Star, C::AllReduce) => direct::star_all_reduce(req),
        (A::Linear, C::Gather) => direct::gather(req),
        (A::Linear, C::Scatter) => direct::scatter(req),
        (A::Bruck, C::AllGather) => bruck::all_gather(req),
        (A::Bruck, C::AllToAll) => bruck::all_to_all(req),
        (A::Pairwise, C::ReduceScatter) => pairwise::reduce_scatter(req),
        (A::Pairwise, C::AllToAll | C::AllToAllV) => pairwise::all_to_all(req),
        (A::Hier, C::AllReduce) => hier::all_reduce(req),
        (A::Hier, C::AllGather) => hier::all_gather(req),
        (A::Hier, C::ReduceScatter) => hier::reduce_scatter(req),
        (A::Hier, C::AllToAll | C::AllToAllV) => hier::all_to_all(req),
        (A::Torus2d, C::AllReduce) => torus::torus2d_all_reduce(req),
        (A::Mesh2d, C::AllReduce) => torus::mesh2d_all_reduce(req),
        (A::ScatterAllgather, C::Broadcast) => composite::broadcast_scatter_allgather(req),
        (A::RsGather, C::Reduce) => composite::reduce_rs_gather(req),
        (A::Dissemination, C::Barrier) => barrier::dissemination(req),
        _ => unreachable!("Collective::algorithms lists {algorithm} for {coll}"),
    };
    Ok(plan)
}

/// The error for an algorithm name a collective does not have.
pub fn unknown_algorithm(coll: Collective, name: &str) -> Error {
    let mut valid: Vec<&str> = vec!["auto"];
    valid.extend(coll.algorithms().iter().map(|a| a.name()));
    Error::UnknownAlgorithm {
        collective: coll.name().to_string(),
        name: name.to_string(),
        valid: valid.join(", "),
    }
}

/// The start and length of block `b` when `count` elements are split into
/// `n` nearly equal blocks (the first `count % n` blocks get one more).
pub const fn block(count: usize, n: usize, b: usize) -> (usize, usize) {
    let base = count / n;
    let extra = count % n;
    let len = base + if b < extra { 1 } else { 0 };
    let start = b * base + if b < extra { b } else { extra };
    (start, len)
}

/// Builds a plan round by round; algorithms use it so that their code reads
/// like the pseudo-code of the literature.
#[derive(Default)]
pub(crate) struct PlanBuilder {
    plan: Plan,
}

impl PlanBuilder {
    /// Starts a new round and returns it.
    pub(crate) fn round(&mut self) -> RoundBuilder<'_> {
        self.plan.rounds.push(Round::default());
        RoundBuilder {
            round: self.plan.rounds.last_mut().expect("just pushed"),
        }
    }

    /// Reserves at least `elements` of scratch.
    pub(crate) fn scratch(&mut self, elements: usize) {
        self.plan.scratch = self.plan.scratch.max(elements);
    }

    /// Appends every round of `other` (and its scratch needs).
    pub(crate) fn append(&mut self, other: Plan) {
        self.scratch(other.scratch);
        self.plan.rounds.extend(other.rounds);
    }

    /// The finished plan, without empty rounds.
    pub(crate) fn finish(mut self) -> Plan {
        self.plan.rounds.retain(|r| !r.ops.is_empty());
        self.plan
    }
}

/// Adds ops to one round.
pub(crate) struct RoundBuilder<'a> {
    round: &'a mut Round,
}

impl RoundBuilder<'_> {
    pub(crate) fn send(&mut self, peer: usize, src: Span) -> &mut Self {
        self.round.ops.push(Op::Send { peer, src });
        self
    }
    pub(crate) fn recv(&mut self, peer: usize, dst: Span) -> &mut Self {
        self.round.ops.push(Op::Recv { peer, dst });
        self
    }
    pub(crate) fn recv_reduce(&mut self, peer: usize, dst: Span, local: Span) -> &mut Self {
        self.round.ops.push(Op::RecvReduce { peer, dst, local });
        self
    }
    pub(crate) fn copy(&mut self, dst: Span, src: Span) -> &mut Self {
        if dst.len > 0 {
            self.round.ops.push(Op::Copy { dst, src });
        }
        self
    }
    pub(crate) fn reduce(&mut self, dst: Span, a: Span, b: Span) -> &mut Self {
        if dst.len > 0 {
            self.round.ops.push(Op::Reduce { dst, a, b });
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_cover_the_count_exactly() {
        for count in 0..40 {
            for n in 1..10 {
                let mut next = 0;
                for b in 0..n {
                    let (start, len) = block(count, n, b);
                    assert_eq!(start, next);
                    next += len;
                }
                assert_eq!(next, count);
            }
        }
    }

    #[test]
    fn names_round_trip() {
        for c in Collective::ALL {
            assert_eq!(Collective::from_name(c.name()), Some(c));
        }
        assert_eq!(
            Collective::from_name("broadcast"),
            Some(Collective::Broadcast)
        );
        assert_eq!(
            Collective::from_name("all_reduce"),
            Some(Collective::AllReduce)
        );
        for a in Algorithm::ALL {
            assert_eq!(Algorithm::from_name(a.name()), Some(a));
        }
    }
}
