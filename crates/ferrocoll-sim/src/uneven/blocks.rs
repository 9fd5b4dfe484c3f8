//! The blocks of the buffers and how the symmetry moves them: atoms, the
//! permutation σ_1 induces on them, its cycles, and the lengths of any
//! op's span at any rank of its orbit (see the [module docs](super)).

use std::collections::HashMap;

use ferrocoll::plan::{Buf, Op, Plan, Span};

use crate::symmetry::timed_ops;

/// Where the length of a representative's op comes from, for every rank
/// of its orbit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Extent {
    /// Atoms `first..end` of space `space`: at copy j the op covers their
    /// images under σ_j.
    Atoms {
        /// The space (index into [`Blocks::spaces`]).
        space: u8,
        /// First atom.
        first: u32,
        /// One past the last atom.
        end: u32,
    },
    /// A scratch span: every copy moves the same length.
    Fixed(u64),
}

/// Positions `start..start + width` of a cycle (mod its length) whose
/// atoms all have `len` elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Run {
    pub(crate) start: u32,
    pub(crate) width: u32,
    pub(crate) len: u64,
}

/// One cycle of σ_1 on the atoms: `atoms[p + 1] = σ_1(atoms[p])`.
#[derive(Clone, Debug)]
pub(crate) struct Cycle {
    pub(crate) atoms: Vec<u32>,
    /// The atoms' lengths along the cycle, as runs of equal length.
    pub(crate) runs: Vec<Run>,
    /// The shortest and the longest atom.
    pub(crate) min: u64,
    pub(crate) max: u64,
}

/// A coordinate space of elements cut into atoms.
#[derive(Clone, Debug, Default)]
pub(crate) struct Space {
    /// Atom i is elements `bounds[i]..bounds[i + 1]`.
    pub(crate) bounds: Vec<usize>,
    /// Per atom: its cycle, or `u32::MAX` for an atom no representative's
    /// span covers.
    pub(crate) cycle: Vec<u32>,
    /// Per atom: its position in its cycle.
    pub(crate) pos: Vec<u32>,
    pub(crate) cycles: Vec<Cycle>,
}

impl Space {
    /// Elements of atom `i`.
    fn len(&self, i: u32) -> u64 {
        (self.bounds[i as usize + 1] - self.bounds[i as usize]) as u64
    }

    /// The atoms `span` covers, which must begin and end on atom bounds.
    fn range(&self, span: &Span) -> Option<(u32, u32)> {
        let first = self.bounds.binary_search(&span.offset).ok()?;
        let end = self.bounds.binary_search(&span.end()).ok()?;
        Some((first as u32, end as u32))
    }
}

/// The atoms of a run and σ_1's cycles on them.
#[derive(Clone, Debug)]
pub(crate) struct Blocks {
    /// The spaces: the input and output buffers as one (`merged`: the
    /// whole-buffer collectives, whose input and output have the same
    /// blocks at the same offsets) or each alone.
    pub(crate) spaces: Vec<Space>,
    merged: bool,
    /// m, the copies of every representative.
    copies: usize,
}

/// The span whose length an op's cost follows: a send's source (its
/// message), a local reduction's destination. A receive's length is its
/// message's, found through the send it meets (see [`super`]).
pub(crate) fn sized_span(op: &Op) -> Option<Span> {
    match *op {
        Op::Send { src, .. } => Some(src),
        Op::Reduce { dst, .. } => Some(dst),
        _ => None,
    }
}

/// The length of a span as the plans count it.
fn span_len(op: &Op) -> Option<usize> {
    match *op {
        Op::Send { src, .. } => Some(src.len),
        Op::Recv { dst, .. } | Op::RecvReduce { dst, .. } | Op::Reduce { dst, .. } => Some(dst.len),
        Op::Copy { .. } => None,
    }
}

/// [`span_len`] of a timed op (copies are never timed).
pub(crate) fn op_len(op: &Op) -> usize {
    span_len(op).unwrap_or(0)
}

impl Blocks {
    /// The space of buffer `buf`, `None` for scratch.
    fn space_of(&self, buf: Buf) -> Option<u8> {
        match (buf, self.merged) {
            (Buf::Scratch, _) => None,
            (_, true) | (Buf::Input, false) => Some(0),
            (Buf::Output, false) => Some(1),
        }
    }

    /// Infers the atoms and σ_1's cycles from the representatives' plans
    /// (`reps[a]`, rank a) and their images (`images[a]`, rank σ_1(a)),
    /// whose shapes match op for op; `copies` is m. Fails saying what does
    /// not fit the model of the [module docs](super).
    pub(crate) fn infer(
        reps: &[Plan],
        images: &[Plan],
        copies: usize,
        merged: bool,
    ) -> Result<Blocks, String> {
        let mut blocks = Blocks {
            spaces: vec![Space::default(); if merged { 1 } else { 2 }],
            merged,
            copies,
        };
        // Atom bounds: every end of every sized span of every plan seen.
        let mut bounds: Vec<Vec<usize>> = vec![vec![0]; blocks.spaces.len()];
        for plan in reps.iter().chain(images) {
            for (_, op) in timed_ops(plan) {
                if let Some(span) = sized_span(op) {
                    if let Some(s) = blocks.space_of(span.buf) {
                        bounds[s as usize].extend([span.offset, span.end()]);
                    }
                }
            }
        }
        for (space, mut b) in blocks.spaces.iter_mut().zip(bounds) {
            b.sort_unstable();
            b.dedup();
            let atoms = b.len().saturating_sub(1);
            space.bounds = b;
            space.cycle = vec![u32::MAX; atoms];
            space.pos = vec![0; atoms];
        }
        // σ_1 on atoms, from the spans that are one atom in both plans;
        // spans of several atoms must map onto their image's atoms.
        let mut image_of: Vec<Vec<u32>> = blocks
            .spaces
            .iter()
            .map(|s| vec![u32::MAX; s.cycle.len()])
            .collect();
        let mut wide = Vec::new();
        let mut used: Vec<Vec<u32>> = vec![Vec::new(); blocks.spaces.len()];
        for (a, (rep, image)) in reps.iter().zip(images).enumerate() {
            for ((_, x), (_, y)) in timed_ops(rep).zip(timed_ops(image)) {
                let (Some(s), Some(t)) = (sized_span(x), sized_span(y)) else {
                    continue;
                };
                match (blocks.space_of(s.buf), blocks.space_of(t.buf)) {
                    (None, None) if s.len == t.len => {}
                    (None, None) => {
                        return Err(format!(
                            "rank {a} and its image move scratch spans of {} and {} elements, which no block map relates",
                            s.len, t.len
                        ))
                    }
                    (Some(p), Some(q)) if p == q => {
                        let space = &blocks.spaces[p as usize];
                        let (r, r2) = (space.range(&s), space.range(&t));
                        let (Some(r), Some(r2)) = (r, r2) else {
                            unreachable!("every sized span's ends are atom bounds");
                        };
                        used[p as usize].extend(r.0..r.1);
                        if r.1 - r.0 == 1 && r2.1 - r2.0 == 1 {
                            let slot = &mut image_of[p as usize][r.0 as usize];
                            if *slot != u32::MAX && *slot != r2.0 {
                                return Err(format!(
                                    "the block at element {} goes to two places under the shift",
                                    s.offset
                                ));
                            }
                            *slot = r2.0;
                        } else {
                            wide.push((p, r, r2));
                        }
                    }
                    _ => {
                        return Err(format!(
                            "rank {a}'s op on {:?} is another buffer's ({:?}) at its image",
                            s.buf, t.buf
                        ))
                    }
                }
            }
        }
        for (p, mut atoms) in used.into_iter().enumerate() {
            atoms.sort_unstable();
            atoms.dedup();
            blocks.cycles_from(p, &atoms, &image_of[p])?;
        }
        for (p, (f, e), (f2, e2)) in wide {
            let space = &blocks.spaces[p as usize];
            let mut mapped: Vec<u32> = (f..e)
                .map(|i| {
                    let (c, pos) = (space.cycle[i as usize], space.pos[i as usize]);
                    let cyc = &space.cycles[c as usize];
                    cyc.atoms[(pos as usize + 1) % cyc.atoms.len()]
                })
                .collect();
            mapped.sort_unstable();
            if mapped != (f2..e2).collect::<Vec<u32>>() {
                return Err(format!(
                    "the span of elements {}..{} does not go to the blocks its single blocks go to",
                    space.bounds[f as usize], space.bounds[e as usize]
                ));
            }
        }
        Ok(blocks)
    }

    /// Follows σ_1 (`image_of`) from every atom of `atoms` in space `p`
    /// and records its cycle: σ_1 must be known all the way round, be a
    /// permutation, and have cycles whose lengths divide m (σ_m is the
    /// identity).
    fn cycles_from(&mut self, p: usize, atoms: &[u32], image_of: &[u32]) -> Result<(), String> {
        let copies = self.copies;
        let space = &mut self.spaces[p];
        for &start in atoms {
            if space.cycle[start as usize] != u32::MAX {
                continue;
            }
            let id = space.cycles.len() as u32;
            let mut seq = vec![start];
            // Marked as visited while walking (u32::MAX - 1), so a σ_1 that
            // is not injective shows as a walk into a visited atom.
            space.cycle[start as usize] = u32::MAX - 1;
            let mut x = image_of[start as usize];
            while x != start {
                let at = space.bounds.get(x as usize).copied();
                if x == u32::MAX {
                    return Err(format!(
                        "the block at element {} moves to one that no representative touches",
                        space.bounds[*seq.last().unwrap_or(&start) as usize]
                    ));
                }
                if space.cycle[x as usize] != u32::MAX || seq.len() > copies {
                    return Err(format!(
                        "the shift does not permute the blocks (element {})",
                        at.unwrap_or(0)
                    ));
                }
                space.cycle[x as usize] = u32::MAX - 1;
                seq.push(x);
                x = image_of[x as usize];
            }
            if copies % seq.len() != 0 {
                return Err(format!(
                    "a cycle of {} blocks does not divide the {copies} copies",
                    seq.len()
                ));
            }
            for (i, &a) in seq.iter().enumerate() {
                space.cycle[a as usize] = id;
                space.pos[a as usize] = i as u32;
            }
            let lens: Vec<u64> = seq.iter().map(|&a| space.len(a)).collect();
            space.cycles.push(Cycle {
                runs: runs(&lens),
                min: lens.iter().copied().min().unwrap_or(0),
                max: lens.iter().copied().max().unwrap_or(0),
                atoms: seq,
            });
        }
        Ok(())
    }

    /// The extent of a representative's sized span.
    pub(crate) fn extent(&self, span: &Span) -> Extent {
        match self.space_of(span.buf) {
            None => Extent::Fixed(span.len as u64),
            Some(s) => {
                let (first, end) = self.spaces[s as usize]
                    .range(span)
                    .expect("a representative's span ends on atom bounds");
                Extent::Atoms {
                    space: s,
                    first,
                    end,
                }
            }
        }
    }

    /// Elements of atom `i` of space `s` at copy j (its image under σ_j).
    fn len_at(&self, s: u8, i: u32, j: usize) -> u64 {
        let space = &self.spaces[s as usize];
        let cyc = &space.cycles[space.cycle[i as usize] as usize];
        let p = (space.pos[i as usize] as usize + j) % cyc.atoms.len();
        space.len(cyc.atoms[p])
    }

    /// Elements an op of extent `e` covers at copy j.
    pub(crate) fn eval(&self, e: Extent, j: usize) -> u64 {
        match e {
            Extent::Fixed(len) => len,
            Extent::Atoms { space, first, end } => {
                (first..end).map(|i| self.len_at(space, i, j)).sum()
            }
        }
    }

    /// How many atoms of each cycle the extent covers, and at which
    /// positions: `(cycle, positions)`.
    pub(crate) fn positions(&self, space: u8, first: u32, end: u32) -> HashMap<u32, Vec<u32>> {
        let sp = &self.spaces[space as usize];
        let mut by: HashMap<u32, Vec<u32>> = HashMap::new();
        for i in first..end {
            by.entry(sp.cycle[i as usize])
                .or_default()
                .push(sp.pos[i as usize]);
        }
        by
    }

    /// The most elements an op of extent `e` covers at any copy. Spending
    /// at most `budget` steps of work on extents of several atoms that do
    /// not cover whole cycles; fails when that runs out.
    pub(crate) fn max(&self, e: Extent, budget: &mut u64) -> Result<u64, String> {
        let Extent::Atoms { space, first, end } = e else {
            return Ok(self.eval(e, 0));
        };
        let sp = &self.spaces[space as usize];
        if end - first == 1 {
            return Ok(sp.cycles[sp.cycle[first as usize] as usize].max);
        }
        let by = self.positions(space, first, end);
        if by
            .iter()
            .all(|(&c, p)| p.len() == sp.cycles[c as usize].atoms.len())
        {
            // Whole cycles: every copy covers them all.
            return Ok(self.eval(e, 0));
        }
        let mut total = vec![0u64; self.copies];
        for (&c, p) in &by {
            let cyc = &sp.cycles[c as usize];
            let cost = (cyc.atoms.len() + p.len() * cyc.runs.len() + self.copies) as u64;
            *budget = budget.checked_sub(cost).ok_or_else(|| {
                "too many spans of several blocks of differing sizes to size".to_string()
            })?;
            let f = correlate(&histogram(p), cyc);
            for (u, t) in total.iter_mut().enumerate() {
                *t += f[u % f.len()];
            }
        }
        Ok(total.into_iter().max().unwrap_or(0))
    }

    /// The distinct lengths (elements) of the atoms on cycles, ascending.
    pub(crate) fn sizes(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self
            .spaces
            .iter()
            .flat_map(|s| {
                s.cycles
                    .iter()
                    .flat_map(|c| c.runs.iter().map(|r| r.len as usize))
            })
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }
}

/// Cyclic runs of equal values of `lens` (a run may wrap round the end).
fn runs(lens: &[u64]) -> Vec<Run> {
    let n = lens.len();
    let mut out: Vec<Run> = Vec::new();
    for (i, &len) in lens.iter().enumerate() {
        match out.last_mut() {
            Some(r) if r.len == len => r.width += 1,
            _ => out.push(Run {
                start: i as u32,
                width: 1,
                len,
            }),
        }
    }
    if out.len() > 1 && out[0].len == out[out.len() - 1].len {
        let last = out.pop().expect("more than one run");
        out[0].start = last.start;
        out[0].width += last.width;
    }
    debug_assert_eq!(out.iter().map(|r| r.width as usize).sum::<usize>(), n);
    out
}

/// Positions with their multiplicities.
pub(crate) fn histogram(positions: &[u32]) -> Vec<(u32, u64)> {
    let mut v = positions.to_vec();
    v.sort_unstable();
    let mut out: Vec<(u32, u64)> = Vec::new();
    for p in v {
        match out.last_mut() {
            Some((q, c)) if *q == p => *c += 1,
            _ => out.push((p, 1)),
        }
    }
    out
}

/// f(u) = Σ_v h(v) · len(atom at position (v + u) mod L) for u in 0..L, L
/// the cycle's length: what the atoms at positions v cover, summed, at
/// copy u. Every run longer than the shortest atom adds its excess over a
/// window of u, so the work is (positions x runs) + L.
pub(crate) fn correlate(h: &[(u32, u64)], cyc: &Cycle) -> Vec<u64> {
    let l = cyc.atoms.len();
    let total: u64 = h.iter().map(|&(_, c)| c).sum();
    let mut diff = vec![0i64; l + 1];
    for run in cyc.runs.iter().filter(|r| r.len > cyc.min) {
        let extra = (run.len - cyc.min) as i64;
        for &(v, count) in h {
            // (v + u) mod L in start..start + width for u in
            // (start - v)..(start - v + width), mod L.
            let lo = (run.start as usize + l - v as usize % l) % l;
            let add = extra * count as i64;
            let hi = lo + run.width as usize;
            if hi <= l {
                diff[lo] += add;
                diff[hi] -= add;
            } else {
                diff[lo] += add;
                diff[l] -= add;
                diff[0] += add;
                diff[hi - l] -= add;
            }
        }
    }
    let mut acc = 0i64;
    (0..l)
        .map(|u| {
            acc += diff[u];
            total * cyc.min + acc as u64
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cycle(lens: &[u64]) -> Cycle {
        Cycle {
            atoms: (0..lens.len() as u32).collect(),
            runs: runs(lens),
            min: *lens.iter().min().unwrap(),
            max: *lens.iter().max().unwrap(),
        }
    }

    #[test]
    fn runs_wrap_round_the_cycle() {
        // The last run joins the first across the end.
        assert_eq!(
            runs(&[3, 2, 2, 3]),
            [
                Run {
                    start: 3,
                    width: 2,
                    len: 3
                },
                Run {
                    start: 1,
                    width: 2,
                    len: 2
                }
            ]
        );
        assert_eq!(runs(&[5, 5]).len(), 1);
    }

    #[test]
    fn correlation_is_the_sum_it_stands_for() {
        let lens = [4u64, 4, 3, 3, 3, 4, 7, 3];
        let c = cycle(&lens);
        let positions = [0u32, 2, 2, 6, 7];
        let f = correlate(&histogram(&positions), &c);
        for (u, &fu) in f.iter().enumerate() {
            let want: u64 = positions
                .iter()
                .map(|&v| lens[(v as usize + u) % lens.len()])
                .sum();
            assert_eq!(fu, want, "u={u}");
        }
    }
}
