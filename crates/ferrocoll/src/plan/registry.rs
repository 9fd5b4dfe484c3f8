//! From an [`Algorithm`] to its plan: [`build`] checks the request and
//! calls the family's plan function; [`unknown_algorithm`] is the error for
//! an algorithm a collective does not have.

use super::catalog::{Algorithm, Collective};
use super::ops::Plan;
use super::request::PlanRequest;
use super::{
    barrier, bruck, butterfly, composite, dbtree, direct, halving_doubling, hier, pairwise, ring,
    torus, tree,
};
use crate::error::{Error, Result};

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
