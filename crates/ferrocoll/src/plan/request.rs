//! What an algorithm is asked to plan: the [`PlanRequest`].

use super::catalog::Collective;
use crate::topo::Topology;

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
