//! The exact traffic of a run aggregated over uneven blocks: every link's
//! bytes and busy time, summed over the copies of every representative's
//! messages at their own lengths (see the [module docs](super)).

use std::collections::HashMap;

use ferrocoll::plan::Op;

use super::blocks::{correlate, histogram, Extent};
use super::{Model, OpSize};
use crate::network::Network;
use crate::symmetry::timed_ops;

/// Bytes that crossed every link of `net` in the full run `model` stands
/// for, with elements of `elem` bytes.
///
/// Copy j of representative a's message to p crosses σ_j(λ) for every
/// link λ of path(a, p); with λ = σ_t(ρ) (ρ its orbit's representative),
/// that is σ_{j+t}(ρ), so link σ_u(ρ) carries copy u - t, which covers the
/// atoms at positions pos + u - t of their cycles. Per representative link
/// and cycle the positions pos - t are gathered into a histogram, and
/// [`correlate`] sums their lengths for every u at once.
pub(crate) fn link_bytes(model: &Model, net: &Network, elem: u64) -> Vec<u64> {
    let sym = &model.sym;
    let orbits = net.link_orbits(sym);
    // Per representative link: elements every copy carries alike, and per
    // (space, cycle) the positions of the atoms its messages cover.
    let mut fixed: HashMap<u32, u64> = HashMap::new();
    let mut at: HashMap<(u32, u8, u32), Vec<u32>> = HashMap::new();
    for (a, plan) in model.reps.iter().enumerate() {
        for ((_, op), size) in timed_ops(plan).zip(&model.ops[a]) {
            let (Op::Send { peer, .. }, OpSize::Own(extent)) = (op, size) else {
                continue;
            };
            let path = net.path(a, *peer);
            for &l in path.links() {
                let (rho, t) = orbits[l as usize];
                match *extent {
                    Extent::Fixed(len) => *fixed.entry(rho).or_default() += len,
                    Extent::Atoms { space, first, end } => {
                        let sp = &model.blocks.spaces[space as usize];
                        for i in first..end {
                            let c = sp.cycle[i as usize];
                            let len = sp.cycles[c as usize].atoms.len() as u32;
                            let v = (sp.pos[i as usize] + len - t % len) % len;
                            at.entry((rho, space, c)).or_default().push(v);
                        }
                    }
                }
            }
        }
    }
    // Per representative link, the cycles' sums by copy (mod the cycle).
    let mut by_rep: HashMap<u32, Vec<Vec<u64>>> = HashMap::new();
    for ((rho, space, c), positions) in at {
        let cyc = &model.blocks.spaces[space as usize].cycles[c as usize];
        by_rep
            .entry(rho)
            .or_default()
            .push(correlate(&histogram(&positions), cyc));
    }
    orbits
        .iter()
        .map(|&(rho, t)| {
            let t = t as usize;
            let base = fixed.get(&rho).copied().unwrap_or(0);
            let cycles: u64 = by_rep
                .get(&rho)
                .map_or(0, |fs| fs.iter().map(|f| f[t % f.len()]).sum());
            (base + cycles) * elem
        })
        .collect()
}
