//! The aggregated mode over uneven blocks: ranks whose plans differ only
//! in the sizes of their blocks.
//!
//! A ring allreduce of 64,000,000 elements on 16,384 ranks cuts the buffer
//! into blocks of 3,906 and 3,907 elements (the first `count % n` one
//! longer, [`ferrocoll::plan::block`]). Rank x+1's plan is rank x's with
//! every peer shifted, as [`crate::symmetry`] needs, but the block it sends
//! in a step is one element longer or shorter, so no shift maps the full
//! run onto itself and the exact quotient of [`crate::symmetry`] does not
//! exist: in the full run ranks near the long blocks run ahead or behind
//! the others by amounts that grow with the distance, so no few classes of
//! ranks behave alike. What is exact is the bookkeeping: every message of
//! every rank is one of a representative's messages moved by a shift, with
//! its blocks moved along, so its length, and hence the bytes of every
//! link, follows from the representatives' plans. This module computes
//! those exactly and runs one quotient for the time.
//!
//! # The model
//!
//! * **Shape**: rank σ_j(x)'s plan is rank x's with every peer p replaced
//!   by σ_j(p), op for op and round for round, the lengths aside
//!   (`symmetry::differs_by`); shifts only (an exclusive-or's
//!   uneven blocks, a halving-doubling's, are refused). A count below the
//!   number of ranks leaves blocks empty, whose messages the plans skip:
//!   the shapes differ and the run is refused too.
//! * **Blocks**: the input and output buffers (as one space for the
//!   whole-buffer collectives, whose blocks lie at the same offsets in both,
//!   else each alone) are cut into atoms at every end of every span that
//!   sets a cost (a send's source, a local reduction's destination) in the
//!   representatives' plans 0..k and their images k..2k. σ_1 moves the
//!   atoms: where a representative's span is one atom and its image's span
//!   is one atom, σ_1 maps the one to the other. It must be known all the
//!   way round every atom a representative covers and be a permutation
//!   whose cycles divide m; a span of several atoms must map onto its
//!   image's atoms. Scratch spans must have the same length at every copy.
//!   A ring's or a direct allreduce's blocks form one cycle per
//!   representative (k cycles of m blocks); the hierarchical allreduce's
//!   sub-blocks of a node's chunk one cycle per local rank, its node-level
//!   chunks whole cycles; a two-port ring's halves a cycle each way. The
//!   distinct block lengths (the size classes, two for a one-level split:
//!   `count / n` and one more) are reported ([`BlockSizes`]).
//! * **Lengths**: copy j of an op covering atoms A covers σ_j(A), so its
//!   length is the sum of their lengths; a receive's is that of the send it
//!   meets (paired as the quotient engine pairs them: the k-th send of a
//!   channel with its k-th receive), at the copy that sends it.
//! * **Checked**: the model must predict every op's length of every rank
//!   that [`crate::symmetry::check_plans`] would compare: all ranks when n
//!   times a plan's length is at most [`crate::symmetry::FULL_CHECK_OPS`],
//!   else its sample (the edges of every period, the images of three
//!   representatives under four shifts, 16 spread ranks).
//!
//! # What is exact and what is not
//!
//! * **Bytes of every link** (so per class, and busy time, bytes over the
//!   link's bandwidth, as the engine charges it): exact, by
//!   `account::link_bytes`: the link σ_u(ρ) carries copy u - t of every
//!   message whose path crosses σ_t(ρ), and the lengths of a cycle's atoms
//!   are summed for every u at once (runs of equal length, so the work is
//!   the messages plus the cycles, not messages times copies). The hottest
//!   link is the busiest of those, with the full run's rule.
//! * **Time, timeline, critical path, events**: those of the quotient run
//!   in which every op moves the largest length its orbit has (the
//!   *padded* run, every block at its size class's largest). In a chain
//!   of dependencies (a ring, the rings of a hierarchical allreduce on one
//!   switch) some rank's critical path carries a long block in every step,
//!   and the padded time is the full run's. Where messages of different
//!   ranks share links, or where FIFO queues order messages by the instant
//!   they become ready, the full run's ranks drift apart and its time can
//!   be above or below the padded one: measured in
//!   `tests/aggregated_uneven.rs` (rings and hierarchical allreduces on a
//!   two-level or 2:1 fat tree within 1e-3, a two-port ring within 1e-2;
//!   a direct allreduce in the contention mode takes up to 35 % longer in
//!   full, where a rank that posts its second round a few nanoseconds late
//!   finds every peer's message to it queued behind the rest, which no
//!   quotient can show: it takes each rank's own timing).
//!   The timeline is the padded run's, scaled per class to the exact busy
//!   time, so its mean is still the class's utilization.

mod account;
mod blocks;
#[cfg(test)]
mod tests;

use ferrocoll::plan::{Op, Plan};

use crate::engine::{self, Mode, SimOptions, Trace};
use crate::network::Network;
use crate::symmetry::{
    differs_by, ranks_to_check, timed_ops, Symmetry, SymmetryKind, FULL_CHECK_OPS,
};
use blocks::{op_len, sized_span, Blocks, Extent};

/// Work allowed for sizing spans of several blocks that do not cover whole
/// cycles (see [`Blocks::max`]).
const SIZING_BUDGET: u64 = 1 << 28;

/// How a run aggregated over uneven blocks was sized; see the
/// [module docs](self).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockSizes {
    /// The distinct lengths of the blocks, in elements, ascending (e.g.
    /// `[3906, 3907]`).
    pub elements: Vec<usize>,
}

/// Where the length of one timed op of a representative comes from.
#[derive(Clone, Copy, Debug)]
pub(crate) enum OpSize {
    /// A send or a local reduction: its own span.
    Own(Extent),
    /// A receive: the length of representative `rep`'s timed op `op` (a
    /// send) at copy u - `shift` for this receive's copy u.
    Meets { rep: u32, op: u32, shift: u32 },
}

/// The plans of a run aggregated over uneven blocks.
pub(crate) struct Model {
    pub(crate) sym: Symmetry,
    /// Representative a's plan (rank a).
    pub(crate) reps: Vec<Plan>,
    pub(crate) blocks: Blocks,
    /// Per representative, per timed op (in [`timed_ops`] order).
    pub(crate) ops: Vec<Vec<OpSize>>,
}

impl Model {
    /// The length of representative a's timed op `i` at copy j.
    fn len(&self, a: usize, i: usize, j: usize) -> u64 {
        let m = self.sym.copies();
        match self.ops[a][i] {
            OpSize::Own(e) => self.blocks.eval(e, j),
            OpSize::Meets { rep, op, shift } => {
                self.len(rep as usize, op as usize, (j + m - shift as usize) % m)
            }
        }
    }

    /// Sets every timed op of the representatives' plans to the largest
    /// length of its orbit: the padded run. In place, as the plans of a
    /// 100,000-rank run are large; only peers and kinds of op are read
    /// from them afterwards ([`account::link_bytes`]), lengths come from
    /// `ops`.
    fn pad(&mut self) -> Result<(), String> {
        let mut budget = SIZING_BUDGET;
        let mut own: Vec<Vec<u64>> = Vec::with_capacity(self.reps.len());
        for sizes in &self.ops {
            let mut v = Vec::with_capacity(sizes.len());
            for s in sizes {
                v.push(match *s {
                    OpSize::Own(e) => self.blocks.max(e, &mut budget)?,
                    OpSize::Meets { .. } => 0,
                });
            }
            own.push(v);
        }
        for (a, plan) in self.reps.iter_mut().enumerate() {
            let mut i = 0;
            for round in &mut plan.rounds {
                for op in round
                    .ops
                    .iter_mut()
                    .filter(|op| !matches!(op, Op::Copy { .. }))
                {
                    let len = match self.ops[a][i] {
                        OpSize::Own(_) => own[a][i],
                        OpSize::Meets { rep, op, .. } => own[rep as usize][op as usize],
                    } as usize;
                    match op {
                        Op::Send { src: s, .. } => s.len = len,
                        Op::Recv { dst: s, .. }
                        | Op::RecvReduce { dst: s, .. }
                        | Op::Reduce { dst: s, .. } => s.len = len,
                        Op::Copy { .. } => {}
                    }
                    i += 1;
                }
            }
        }
        Ok(())
    }
}

/// Pairs every representative's receives with the sends they meet in the
/// quotient (see the engine): a send of a to p goes on channel
/// (a, rep(p), index(p)), a receive of b from p' on (rep(p'), b,
/// inverse(index(p'))), the k-th send of a channel meeting its k-th receive.
/// Both ends are sorted by (channel, plan order) and zipped: a direct
/// exchange of 100,000 ranks has a channel per message, too many for a
/// queue each.
fn pair(sym: &Symmetry, reps: &[Plan], blocks: &Blocks) -> Result<Vec<Vec<OpSize>>, String> {
    type End = ((u32, u32, u32), u32, u32);
    let mut sends: Vec<End> = Vec::new();
    let mut recvs: Vec<End> = Vec::new();
    let mut ops: Vec<Vec<OpSize>> = Vec::with_capacity(reps.len());
    for (a, plan) in reps.iter().enumerate() {
        let mut v = Vec::new();
        for (i, (_, op)) in timed_ops(plan).enumerate() {
            let (a, i) = (a as u32, i as u32);
            match *op {
                Op::Send { peer, .. } => {
                    let key = (a, sym.rep(peer) as u32, sym.index(peer) as u32);
                    sends.push((key, a, i));
                }
                Op::Recv { peer, .. } | Op::RecvReduce { peer, .. } => {
                    let j = sym.inverse(sym.index(peer)) as u32;
                    recvs.push(((sym.rep(peer) as u32, a, j), a, i));
                }
                _ => {}
            }
            // Receives are filled in below, once every send is known.
            v.push(match sized_span(op) {
                Some(span) => OpSize::Own(blocks.extent(&span)),
                None => OpSize::Own(Extent::Fixed(0)),
            });
        }
        ops.push(v);
    }
    // Within one channel, ends of one rank in plan order (op index).
    sends.sort_unstable();
    recvs.sort_unstable();
    let unpaired = |(src, dst, j): (u32, u32, u32), sent: bool| {
        let (src, dst) = (src as usize, dst as usize);
        if sent {
            format!(
                "rank {src} sends to rank {} a message never received",
                sym.apply(j as usize, dst)
            )
        } else {
            format!(
                "rank {dst} receives from rank {} a message never sent",
                sym.apply(sym.inverse(j as usize), src)
            )
        }
    };
    let (mut s, mut r) = (sends.iter().peekable(), recvs.iter().peekable());
    loop {
        match (s.peek(), r.peek()) {
            (None, None) => break,
            (Some(&&(k, a, i)), Some(&&(k2, b, i2))) if k == k2 => {
                ops[b as usize][i2 as usize] = OpSize::Meets {
                    rep: a,
                    op: i,
                    shift: k.2,
                };
                s.next();
                r.next();
            }
            (Some(&&(k, ..)), Some(&&(k2, ..))) => return Err(unpaired(k.min(k2), k < k2)),
            (Some(&&(k, ..)), None) => return Err(unpaired(k, true)),
            (None, Some(&&(k2, ..))) => return Err(unpaired(k2, false)),
        }
    }
    Ok(ops)
}

/// Why a rank's plan does not fit a model.
enum Miss {
    /// Its shape is not its representative's moved (the plans differ in
    /// more than sizes).
    Shape,
    /// Its shape fits but a length is not the model's.
    Sizes(String),
}

/// Checks the model against rank x's plan: its shape is its
/// representative's moved by σ_j, and every timed op has the length the
/// model gives it at copy j.
fn check(model: &Model, x: usize, plan: &Plan) -> Result<(), Miss> {
    let sym = &model.sym;
    let (a, j) = (sym.rep(x), sym.index(x));
    if differs_by(sym, j, &model.reps[a], plan, false).is_some() {
        return Err(Miss::Shape);
    }
    for (i, (round, op)) in timed_ops(plan).enumerate() {
        let want = model.len(a, i, j);
        if op_len(op) as u64 != want {
            return Err(Miss::Sizes(format!(
                "rank {x}'s op {i} (round {round}) moves {} elements where its blocks, moved from rank {a}'s, have {want}",
                op_len(op)
            )));
        }
    }
    Ok(())
}

/// The smallest shift under which the network admits and the plans have
/// one shape, with its model; `Ok(None)` when there is none (then the
/// plans differ in more than sizes), an error when some shift gives the
/// plans one shape but their sizes do not follow the model (the first
/// such shift's reason). `build(x)` builds rank x's plan.
pub(crate) fn find(
    net: &Network,
    build: &dyn Fn(usize) -> Result<Plan, String>,
) -> Result<Option<Model>, String> {
    let n = net.ranks();
    let first = build(0)?;
    let mut why: Option<String> = None;
    for period in (1..n).filter(|k| n % k == 0) {
        let sym = Symmetry {
            kind: SymmetryKind::Shift,
            period,
            ranks: n,
        };
        if !sym.is_valid() || !net.admits(&sym) {
            continue;
        }
        // Rank k = σ_1(0): a cheap first test before 2k plans are built.
        let second = build(period)?;
        if differs_by(&sym, 1, &first, &second, false).is_some() {
            continue;
        }
        let mut reps = vec![first.clone()];
        for a in 1..period {
            reps.push(build(a)?);
        }
        let mut images = vec![second];
        for a in 1..period {
            images.push(build(period + a)?);
        }
        if (0..period).any(|a| differs_by(&sym, 1, &reps[a], &images[a], false).is_some()) {
            continue;
        }
        let m = sym.copies();
        let model = Blocks::infer(&reps, &images, m, true)
            .or_else(|merged| Blocks::infer(&reps, &images, m, false).map_err(|_| merged))
            .and_then(|blocks| {
                let ops = pair(&sym, &reps, &blocks)?;
                Ok(Model {
                    sym,
                    reps,
                    blocks,
                    ops,
                })
            });
        let model = match model {
            Ok(model) => model,
            Err(e) => {
                why.get_or_insert(e);
                continue;
            }
        };
        match check_ranks(&model, &images, build)? {
            Ok(()) => return Ok(Some(model)),
            Err(Miss::Shape) => continue,
            Err(Miss::Sizes(e)) => {
                why.get_or_insert(e);
            }
        }
    }
    match why {
        Some(e) => Err(e),
        None => Ok(None),
    }
}

/// Checks `model` against the ranks [`crate::symmetry::check_plans`] would
/// compare (`images` are ranks k..2k, built already). The outer error is a
/// plan's build error.
fn check_ranks(
    model: &Model,
    images: &[Plan],
    build: &dyn Fn(usize) -> Result<Plan, String>,
) -> Result<Result<(), Miss>, String> {
    let (sym, period) = (&model.sym, model.sym.period);
    let plan_ops: usize = model
        .reps
        .iter()
        .map(|p| p.rounds.iter().map(|r| r.ops.len()).sum::<usize>())
        .max()
        .unwrap_or(0);
    let all = plan_ops.saturating_mul(sym.ranks) <= FULL_CHECK_OPS;
    for x in ranks_to_check(sym, all) {
        let found = if (period..2 * period).contains(&x) {
            check(model, x, &images[x - period])
        } else {
            check(model, x, &build(x)?)
        };
        if found.is_err() {
            return Ok(found);
        }
    }
    Ok(Ok(()))
}

/// Runs the padded quotient of `model` and makes its traffic exact (see
/// the [module docs](self)): per link, the bytes of the full run and their
/// busy time; per class, the timeline scaled to that busy time. Fails like
/// [`engine::run_aggregated`].
pub(crate) fn run(
    mut model: Model,
    elem_size: usize,
    net: &Network,
    mode: Mode,
    opts: &SimOptions,
) -> Result<(Trace, BlockSizes), String> {
    model.pad()?;
    let mut trace = engine::run_aggregated(&model.reps, &model.sym, elem_size, net, mode, opts)?;
    let (degraded, _) = engine::degrade(net, &opts.slow_links)?;
    let bytes = account::link_bytes(&model, net, elem_size as u64);
    let busy: Vec<f64> = bytes
        .iter()
        .zip(&degraded.links)
        .map(|(&b, l)| b as f64 / l.bw)
        .collect();
    for (c, row) in trace.timeline.iter_mut().enumerate() {
        let class = |v: &[f64]| -> f64 {
            v.iter()
                .zip(&net.links)
                .filter(|(_, l)| l.class == c)
                .map(|(b, _)| b)
                .sum()
        };
        let (was, is) = (class(&trace.link_busy), class(&busy));
        if was > 0.0 {
            row.iter_mut().for_each(|x| *x *= is / was);
        }
    }
    trace.link_bytes = bytes;
    trace.link_busy = busy;
    Ok((
        trace,
        BlockSizes {
            elements: model.blocks.sizes(),
        },
    ))
}
