//! What can be planned: the [`Collective`]s, the [`Algorithm`] families,
//! their names, and which collective has which algorithms.

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

#[cfg(test)]
mod tests {
    use super::*;

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
