//! What dispatch returns: the rows every local expert receives
//! ([`ExpertInputs`]) and what combine needs to bring the results home
//! ([`Handle`]).

use super::Schedule;

/// The rows a rank's local experts received from [`super::Dispatcher::dispatch`].
///
/// One buffer of `rows() × hidden()` elements, row-major, each local
/// expert's rows contiguous and the experts in order (local expert `l` is
/// global expert `first_expert() + l`). Inside an expert the rows are
/// ordered by source rank, then by token position on that rank (then by
/// choice index, for a token that chose the same expert twice). The
/// experts' outputs go back to [`super::Dispatcher::combine`] in this same
/// layout.
#[derive(Clone, Debug, PartialEq)]
pub struct ExpertInputs<T> {
    pub(super) rows: Vec<T>,
    /// Row offsets of the local experts: expert l's rows are
    /// `offsets[l]..offsets[l + 1]`.
    pub(super) offsets: Vec<usize>,
    pub(super) hidden: usize,
    pub(super) first_expert: usize,
}

impl<T> ExpertInputs<T> {
    /// Number of experts on this rank (E/P).
    pub fn local_experts(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Global index of this rank's first expert (rank·E/P).
    pub fn first_expert(&self) -> usize {
        self.first_expert
    }

    /// Elements per row.
    pub fn hidden(&self) -> usize {
        self.hidden
    }

    /// Rows received, all local experts together.
    pub fn rows(&self) -> usize {
        self.offsets[self.offsets.len() - 1]
    }

    /// Rows of local expert `local` (`0..local_experts()`).
    pub fn expert_rows(&self, local: usize) -> usize {
        self.offsets[local + 1] - self.offsets[local]
    }

    /// The range of local expert `local`'s rows in [`ExpertInputs::as_slice`]
    /// (in rows; multiply by `hidden()` for elements).
    pub fn expert_range(&self, local: usize) -> std::ops::Range<usize> {
        self.offsets[local]..self.offsets[local + 1]
    }

    /// Local expert `local`'s rows, `expert_rows(local) × hidden()`
    /// elements.
    pub fn expert(&self, local: usize) -> &[T] {
        let r = self.expert_range(local);
        &self.rows[r.start * self.hidden..r.end * self.hidden]
    }

    /// Local expert `local`'s rows, writable (an expert that works in place
    /// can then pass [`ExpertInputs::as_slice`] to combine).
    pub fn expert_mut(&mut self, local: usize) -> &mut [T] {
        let r = self.expert_range(local);
        &mut self.rows[r.start * self.hidden..r.end * self.hidden]
    }

    /// Every row, the experts in order.
    pub fn as_slice(&self) -> &[T] {
        &self.rows
    }

    /// Every row, writable.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        &mut self.rows
    }

    /// The buffer of every row.
    pub fn into_vec(self) -> Vec<T> {
        self.rows
    }
}

/// A (token, choice) pair that [`super::Policy::Drop`] left out: its
/// expert was full. Its row did not travel and contributes nothing to the
/// combined output; the caller's residual path takes the token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DroppedChoice {
    /// Token index on this rank (row of `x`).
    pub token: usize,
    /// Choice index, `0..topk` (0: the router's first choice).
    pub choice: usize,
    /// The expert it was routed to.
    pub expert: usize,
}

/// Everything combine needs to return a dispatch's rows to their sources,
/// and what the dispatch decided: the count matrix of every rank, the
/// capacity, the drops.
///
/// It holds no data rows, so one handle serves outputs of any element type.
/// It belongs to the dispatcher's communicator and this rank; combine
/// checks that it gets the handle's shape.
#[derive(Clone, Debug, PartialEq)]
pub struct Handle {
    pub(super) ranks: usize,
    pub(super) rank: usize,
    pub(super) experts: usize,
    pub(super) hidden: usize,
    pub(super) topk: usize,
    pub(super) tokens: usize,
    pub(super) capacity: Option<usize>,
    /// `routed[(s·E + e)·k + j]`: the count matrix of the exchange.
    pub(super) routed: Vec<usize>,
    /// `kept[s·E + e]`: rows source s sends expert e (every choice).
    pub(super) kept: Vec<usize>,
    /// `slot_of[t·k + j]`: the row of this rank's send buffer (and of what
    /// combine gets back) carrying choice j of token t; `None` if dropped.
    pub(super) slot_of: Vec<Option<u32>>,
    /// `weights[t·k + j]`: the router's weight of choice j of token t.
    pub(super) weights: Vec<f32>,
    pub(super) dropped: Vec<DroppedChoice>,
    /// The schedules of dispatch and of combine (resolved: never `Auto`).
    pub(super) schedules: [Schedule; 2],
    /// Whether dispatch and combine run one exchange per local expert
    /// (`passes.rs`).
    pub(super) by_expert: [bool; 2],
    /// The classes dispatch's and combine's times are measured in, where
    /// `auto` measures them (`tune.rs`).
    pub(super) tune_class: [Option<super::tune::Key>; 2],
}

impl Handle {
    /// Tokens this rank dispatched.
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Elements per row.
    pub fn hidden(&self) -> usize {
        self.hidden
    }

    /// Choices per token.
    pub fn topk(&self) -> usize {
        self.topk
    }

    /// Every expert's capacity in rows under [`super::Policy::Drop`]
    /// (⌈P·T·k/E · C⌉ with P·T the tokens of all ranks); `None` when
    /// dropless.
    pub fn capacity(&self) -> Option<usize> {
        self.capacity
    }

    /// This rank's (token, choice) pairs that were dropped, by token then
    /// choice.
    pub fn dropped(&self) -> &[DroppedChoice] {
        &self.dropped
    }

    /// Pairs dropped on every rank together (the same number on every rank).
    pub fn dropped_everywhere(&self) -> usize {
        let routed: usize = self.routed.iter().sum();
        routed - self.kept.iter().sum::<usize>()
    }

    /// Pairs source rank `src` routed to `expert`, before any drop.
    pub fn routed(&self, src: usize, expert: usize) -> usize {
        let at = (src * self.experts + expert) * self.topk;
        self.routed[at..at + self.topk].iter().sum()
    }

    /// Rows source rank `src` sent `expert` (after drops).
    pub fn kept(&self, src: usize, expert: usize) -> usize {
        self.kept[src * self.experts + expert]
    }

    /// The schedule dispatch's rows travelled by (never
    /// [`Schedule::Auto`]: what auto chose).
    pub fn dispatch_schedule(&self) -> Schedule {
        self.schedules[0]
    }

    /// The schedule combine will send the rows back by, chosen at dispatch
    /// from the same matrix, transposed.
    pub fn combine_schedule(&self) -> Schedule {
        self.schedules[1]
    }

    /// Whether dispatch and combine ran their flat exchange once per local
    /// expert (no regrouping copy; chosen from the profile's copy cost and
    /// latency). For tests and reports.
    #[doc(hidden)]
    pub fn runs_by_expert(&self) -> [bool; 2] {
        self.by_expert
    }

    /// Rows every rank sent every rank in dispatch: `[s·P + d]`, rank s to
    /// rank d (after drops), row-major.
    pub fn rank_rows(&self) -> Vec<usize> {
        super::routing::rank_rows(&self.kept, self.ranks, self.experts)
    }

    /// For every slot of this rank's send buffer (by destination rank, then
    /// expert), its place when the buffer is ordered by local expert index
    /// first, then destination rank: the layout of the per-expert passes.
    pub(super) fn by_expert_positions(&self) -> Vec<usize> {
        let (p, l, e_all) = (self.ranks, self.local(), self.experts);
        let mine = &self.kept[self.rank * e_all..(self.rank + 1) * e_all];
        let mut start = vec![0usize; e_all];
        let mut at = 0;
        for x in 0..l {
            for d in 0..p {
                start[d * l + x] = at;
                at += mine[d * l + x];
            }
        }
        let mut out = Vec::with_capacity(at);
        for (e, &n) in mine.iter().enumerate() {
            out.extend(start[e]..start[e] + n);
        }
        out
    }

    /// Experts per rank.
    fn local(&self) -> usize {
        self.experts / self.ranks
    }

    /// Rows this rank sent each rank (rank order): the row counts of the
    /// dispatch's all-to-all-v, and of what combine receives.
    pub fn send_rows(&self) -> Vec<usize> {
        let l = self.local();
        (0..self.ranks)
            .map(|d| {
                self.kept[self.rank * self.experts + d * l..][..l]
                    .iter()
                    .sum()
            })
            .collect()
    }

    /// Rows this rank received from each rank (rank order).
    pub fn recv_rows(&self) -> Vec<usize> {
        let (l, first) = (self.local(), self.rank * self.local());
        (0..self.ranks)
            .map(|s| self.kept[s * self.experts + first..][..l].iter().sum())
            .collect()
    }

    /// Rows this rank's experts received, all together.
    pub fn rows_received(&self) -> usize {
        self.recv_rows().iter().sum()
    }

    /// Rows this rank sent, all peers (itself included) together.
    pub fn rows_sent(&self) -> usize {
        self.slot_of.iter().flatten().count()
    }

    /// Where each row of local expert `local`'s input came from: the rows
    /// from every source rank, in rank order (the experts' rows are
    /// ordered by source rank, then token position).
    pub fn received_from(&self, local: usize) -> Vec<usize> {
        let e = self.rank * self.local() + local;
        (0..self.ranks).map(|s| self.kept(s, e)).collect()
    }

    /// For every row this rank sent, in send order (the order combine
    /// gets them back in): the token, the choice and the weight.
    pub fn sent(&self) -> Vec<(usize, usize, f32)> {
        let mut rows = vec![(0, 0, 0.0); self.rows_sent()];
        for (pair, slot) in self.slot_of.iter().enumerate() {
            if let Some(slot) = slot {
                let (t, j) = (pair / self.topk, pair % self.topk);
                rows[*slot as usize] = (t, j, self.weights[pair]);
            }
        }
        rows
    }

    /// `kept` for this rank's experts as blocks: `(source rank, local
    /// expert) -> rows`, source-major (the order rows arrive in).
    pub(super) fn blocks(&self) -> Vec<usize> {
        let (l, first) = (self.local(), self.rank * self.local());
        (0..self.ranks)
            .flat_map(|s| (0..l).map(move |x| (s, x)))
            .map(|(s, x)| self.kept[s * self.experts + first + x])
            .collect()
    }
}
