//! Mixture-of-experts exchange: dispatch tokens to their top-k experts and
//! combine the experts' outputs, over [`Communicator::all_to_all_v`].
//!
//! A communicator of P ranks holds E experts, E/P on each, contiguous: rank
//! r holds experts r·E/P .. (r+1)·E/P. Each rank has T tokens (T may differ
//! between ranks, and may be 0), rows of H elements, and a router's top-k
//! choice per token: `topk_idx[t·k + j]`, the expert of token t's choice j,
//! with weight `topk_weights[t·k + j]`.
//!
//! [`Dispatcher::dispatch`] makes two calls:
//!
//! 1. the **count exchange**: an allgather of every rank's count per
//!    (expert, choice), so that every rank holds the whole count matrix and
//!    computes the same drops and the same message sizes with no further
//!    message (the schedule choice that the count matrix will drive needs
//!    every rank to agree too);
//! 2. the **rows**, by the call's [`Schedule`], so that on arrival each
//!    local expert's rows are contiguous ([`ExpertInputs`]: by source rank,
//!    then token position).
//!
//! [`Dispatcher::combine`] sends the experts' outputs back (the reverse
//! exchange, no count exchange: the [`Handle`] knows every size) and forms
//! y_t = Σ_j g_tj · Expert_j(x_t) over the choices that were kept.
//!
//! For an autograd layer (`ferrocoll.torch.moe`) two more exchanges reuse a
//! dispatch's handle, with no count exchange: [`Dispatcher::combine_pairs`]
//! returns each kept choice's output to its row t·k + j unsummed and
//! unweighted (the caller weights them, and differentiates the weights),
//! and [`Dispatcher::dispatch_pairs`], its adjoint, sends one row per
//! (token, choice) to the slot dispatch gave that pair (the backward of
//! combine_pairs; combine_pairs summed over the choices is dispatch's).
//!
//! # Schedules
//!
//! The rows travel by one all-to-all-v (`direct` or `pairwise`) or, on a
//! topology of several hosts of several ranks, by a hierarchical exchange
//! over sub-communicators: `two-level` (aggregate by destination host, one
//! message per host pair, scatter inside the destination host) or `rail`
//! (Tutel's 2DH: to the destination's local index inside the host, then
//! across on each rail). All give bit-identical results. Under
//! [`Schedule::Auto`] (the default) every rank prices the candidates on the
//! count matrix it holds after the count exchange, with the communicator's
//! profile and topology ([`model::price`]: per round the start-up,
//! injection, reception and host-uplink terms), and runs the cheapest, for
//! dispatch and for combine (the transpose) alike; [`Spec::schedule`] or
//! `FERROCOLL_MOE_SCHEDULE` force one, and `FERROCOLL_DEBUG=tune` prints the
//! candidates and the choice on rank 0. [`Handle::dispatch_schedule`] and
//! [`Handle::combine_schedule`] say what ran.
//!
//! # Capacity and priority ([`Policy::Drop`])
//!
//! Every expert keeps at most Capacity = ⌈P·T·k/E · C⌉ rows (the seed's
//! formula, GShard's and Switch's capacity factor C), where P·T is the
//! number of tokens of all ranks together: with equal T on every rank it is
//! exactly P·T; with uneven T it is their sum, the batch the expert's load
//! is drawn from (GShard and DeepSpeed-MoE assume equal T, their static
//! shapes; DeepSpeed computes ⌈T·k/E · C⌉ per rank, which times P is the
//! same bound). An expert fills its slots in GShard's priority order, made
//! global: by choice index (every rank's first choices before any second
//! choice), then source rank, then token position. The decision is a pure
//! function of the count matrix, which every rank holds after the count
//! exchange, so every rank reaches the same one; [`Handle::dropped`] lists
//! this rank's dropped (token, choice) pairs. Weights are applied as given:
//! a dropped choice contributes nothing and the others are not renormalised
//! (the caller's residual path carries the token).
//!
//! [`Policy::Dropless`] keeps everything: an expert receives whatever was
//! routed to it (the all-to-all-v is as uneven as the routing).
//!
//! # Errors
//!
//! Argument errors found before the count exchange (wrong slice lengths, an
//! expert index out of range) still take part in it, so that **every** rank
//! fails the dispatch: the rank at fault with what to fix, the others
//! naming it; the communicator stays usable. Dispatchers built with
//! different specs fail the same way (each rank's contribution carries a
//! fingerprint of its spec); one with a different number of experts or
//! top-k contributes a different length, which the count exchange reports
//! as a collective mismatch. Combine's argument errors are found before it
//! communicates and are this rank's alone, as with any collective: the
//! other ranks then wait in its all-to-all-v until their deadline.
//!
//! ```
//! use ferrocoll::moe::{Dispatcher, Policy, Spec};
//!
//! ferrocoll::local::run(2, |comm| {
//!     // 4 experts (2 per rank), rows of 3, top-1, dropless.
//!     let moe = Dispatcher::new(&comm, Spec::new(4, 3, 1, Policy::Dropless))?;
//!     let x = vec![1.0f32; 2 * 3]; // 2 tokens
//!     let (mut inputs, handle) = moe.dispatch(&x, &[0, 3], &[1.0, 0.5])?;
//!     for l in 0..inputs.local_experts() {
//!         // Expert e doubles its input.
//!         inputs.expert_mut(l).iter_mut().for_each(|v| *v *= 2.0);
//!     }
//!     let y = moe.combine(inputs.as_slice(), &handle)?;
//!     assert_eq!(y, [2.0, 2.0, 2.0, 1.0, 1.0, 1.0]);
//!     Ok::<_, ferrocoll::Error>(())
//! })
//! .unwrap()
//! .into_iter()
//! .for_each(|r| r.unwrap());
//! ```

mod accumulate;
mod choose;
pub(crate) use choose::check_env;
mod handle;
pub mod model;
mod passes;
pub mod plans;
#[doc(hidden)]
pub mod reference;
mod routing;
mod schedule;
mod scratch;
mod tune;
mod two_level;

pub use accumulate::Accumulate;
pub use handle::{DroppedChoice, ExpertInputs, Handle};
pub use schedule::Schedule;

use std::sync::{Arc, Mutex};

use crate::comm::Communicator;
use crate::error::{Error, Result};
use crate::types::Element;

/// What happens to the pairs routed to an expert beyond its capacity.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Policy {
    /// Each expert keeps at most ⌈P·T·k/E · `capacity_factor`⌉ rows, in
    /// GShard's priority order (see the [module docs](self)); the rest are
    /// dropped and reported.
    Drop {
        /// C in the capacity formula (finite, > 0; 1.0 sizes buffers to the
        /// uniform expectation, 1.25-1.5 is usual).
        capacity_factor: f64,
    },
    /// Every pair travels; experts receive as many rows as were routed to
    /// them.
    Dropless,
}

/// The shape of an MoE layer's exchange: what every rank's dispatcher must
/// agree on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spec {
    /// Experts in all (E), a multiple of the number of ranks.
    pub experts: usize,
    /// Elements per token row (H).
    pub hidden: usize,
    /// Choices per token (k). A token may choose an expert more than once;
    /// each (token, choice) pair is routed on its own.
    pub topk: usize,
    /// What to do beyond an expert's capacity.
    pub policy: Policy,
    /// How the rows travel ([`Schedule::Auto`]: the cost model chooses per
    /// call, see [`Dispatcher::dispatch`]); anything else forces it, over
    /// `FERROCOLL_MOE_SCHEDULE`.
    pub schedule: Schedule,
}

impl Spec {
    /// A spec of `experts` experts, rows of `hidden`, `topk` choices per
    /// token, under `policy`, with the schedule chosen per call
    /// ([`Schedule::Auto`]).
    pub fn new(experts: usize, hidden: usize, topk: usize, policy: Policy) -> Spec {
        Spec {
            experts,
            hidden,
            topk,
            policy,
            schedule: Schedule::Auto,
        }
    }

    /// This spec with `schedule` forced ([`Schedule::Auto`] chooses).
    pub fn with_schedule(mut self, schedule: Schedule) -> Spec {
        self.schedule = schedule;
        self
    }

    /// A number every rank's dispatcher must share (FNV-1a of the spec and
    /// of the schedule it forces, `forced`): the count exchange compares
    /// them, so ranks that would route the rows differently fail instead
    /// of waiting for each other.
    fn fingerprint(&self, forced: Schedule) -> u32 {
        let (tag, factor) = match self.policy {
            Policy::Drop { capacity_factor } => (1u64, capacity_factor.to_bits()),
            Policy::Dropless => (2, 0),
        };
        let schedule = Schedule::ALL
            .iter()
            .position(|&s| s == forced)
            .expect("every schedule is in ALL") as u64;
        let words = [
            self.experts as u64,
            self.hidden as u64,
            self.topk as u64,
            tag,
            factor,
            schedule,
        ];
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in words.iter().flat_map(|w| w.to_le_bytes()) {
            h = (h ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        (h ^ (h >> 32)) as u32
    }
}

/// Dispatch and combine for one MoE layer shape on a communicator.
///
/// Cheap to build (it checks the spec and keeps a handle on the
/// communicator); every rank of the communicator must build one with the
/// same [`Spec`] and call [`Dispatcher::dispatch`] and
/// [`Dispatcher::combine`] in the same order, as with any collective.
#[derive(Clone, Debug)]
pub struct Dispatcher {
    comm: Communicator,
    spec: Spec,
    /// The schedule forced by the spec or `FERROCOLL_MOE_SCHEDULE`, and by
    /// which ([`Schedule::Auto`]: none).
    forced: (Schedule, &'static str),
    /// Shared by clones: the two-level sub-communicators, made by the first
    /// two-level exchange, and what `FERROCOLL_DEBUG=tune` last explained.
    state: Arc<State>,
}

/// The part of a [`Dispatcher`] its clones share.
#[derive(Debug, Default)]
struct State {
    groups: Mutex<Option<Arc<two_level::Groups>>>,
    /// Temporary buffers kept between calls (`scratch.rs`).
    pool: scratch::Pool,
    /// The schedule last explained for dispatch and for combine.
    explained: Mutex<[Option<Schedule>; 2]>,
    /// What `auto` measured of the schedules it could not tell apart.
    tuner: Mutex<tune::Tuner>,
}

/// Words before the counts in each rank's contribution to the count
/// exchange: its verdict on its own arguments, its spec's fingerprint, and
/// how long its last measured dispatch and combine exchanges took
/// (`tune.rs`).
const HEADER: usize = 4;
/// The verdicts.
const ARGS_OK: u32 = 0;
const ARGS_BAD: u32 = 1;

impl Dispatcher {
    /// A dispatcher for `spec` on `comm`. Fails if the experts cannot be
    /// split evenly over the ranks, or if the hidden size, top-k or the
    /// capacity factor cannot be used.
    pub fn new(comm: &Communicator, spec: Spec) -> Result<Dispatcher> {
        let p = comm.size();
        let what = "moe::Dispatcher::new";
        if spec.experts == 0 || spec.experts % p != 0 {
            return Err(Error::invalid(format!(
                "{what}: {} experts cannot be split evenly over {p} ranks (each rank holds E/P \
                 contiguous experts); use a positive multiple of {p} experts",
                spec.experts
            )));
        }
        if spec.hidden == 0 {
            return Err(Error::invalid(format!(
                "{what}: hidden is 0; a token row needs at least one element"
            )));
        }
        if spec.topk == 0 {
            return Err(Error::invalid(format!(
                "{what}: topk is 0; every token needs at least one choice"
            )));
        }
        if let Policy::Drop { capacity_factor } = spec.policy {
            if !(capacity_factor.is_finite() && capacity_factor > 0.0) {
                return Err(Error::invalid(format!(
                    "{what}: capacity factor {capacity_factor} must be finite and positive \
                     (1.0 sizes each expert for the uniform load); use Policy::Dropless to \
                     keep every token"
                )));
            }
        }
        let forced = if spec.schedule != Schedule::Auto {
            (spec.schedule, "Spec::schedule")
        } else {
            (Schedule::from_env()?, "FERROCOLL_MOE_SCHEDULE")
        };
        Ok(Dispatcher {
            comm: comm.clone(),
            spec,
            forced,
            state: Arc::default(),
        })
    }

    /// The spec this dispatcher was built with.
    pub fn spec(&self) -> &Spec {
        &self.spec
    }

    /// Experts on each rank (E/P).
    pub fn local_experts(&self) -> usize {
        self.spec.experts / self.comm.size()
    }

    /// Hands back a buffer the caller is done with (an
    /// [`ExpertInputs::into_vec`], a combined output), for a later call to
    /// fill instead of allocating. Optional: a fresh buffer of many MiB
    /// costs a page fault per 4 KiB when first written, which in a loop of
    /// layers is most of a CPU dispatch's local work. The dispatcher keeps
    /// a few buffers (its own temporaries and these), the largest ones.
    pub fn recycle<T: Element>(&self, buffer: Vec<T>) {
        self.state.pool.give(buffer);
    }

    /// Sends every (token, choice) pair's row to its expert's rank.
    ///
    /// `x` holds this rank's tokens, T rows of `hidden` elements
    /// (row-major; T may be 0); `topk_idx` and `topk_weights` hold T·k
    /// entries, token t's choice j at t·k + j. Returns the rows this
    /// rank's experts received and the handle [`Dispatcher::combine`]
    /// needs. Collective: every rank calls it.
    pub fn dispatch<T: Element>(
        &self,
        x: &[T],
        topk_idx: &[u32],
        topk_weights: &[f32],
    ) -> Result<(ExpertInputs<T>, Handle)> {
        let (p, me) = (self.comm.size(), self.comm.rank());
        let Spec {
            experts: e_all,
            hidden: h,
            topk: k,
            ..
        } = self.spec;
        let local_error = self.check(x, topk_idx, topk_weights).err();
        let tokens = if local_error.is_some() {
            0
        } else {
            x.len() / h
        };

        // 1. The count exchange: [verdict, fingerprint, counts (e, j)].
        let width = HEADER + e_all * k;
        let mut mine = vec![0u32; width];
        mine[0] = if local_error.is_some() {
            ARGS_BAD
        } else {
            ARGS_OK
        };
        mine[1] = self.spec.fingerprint(self.forced.0);
        let report = self.tuner().report();
        mine[2..4].copy_from_slice(&report);
        if local_error.is_none() {
            for (pair, &e) in topk_idx.iter().enumerate() {
                mine[HEADER + e as usize * k + pair % k] += 1;
            }
        }
        let mut all = vec![0u32; p * width];
        self.comm.all_gather(&mine, &mut all)?;
        if let Some(e) = local_error {
            return Err(e);
        }
        self.check_peers(&all, width)?;
        let reports: Vec<[u32; 2]> = all.chunks_exact(width).map(|r| [r[2], r[3]]).collect();
        self.tuner().record(&reports);
        let routed: Vec<usize> = all
            .chunks_exact(width)
            .flat_map(|r| r[HEADER..].iter().map(|&c| c as usize))
            .collect();

        // 2. The decision, the same on every rank.
        let (capacity, kept_ejk) = routing::decide(&routed, p, e_all, k, self.spec.policy);
        let kept: Vec<usize> = kept_ejk.chunks_exact(k).map(|c| c.iter().sum()).collect();

        // 3. This rank's pairs: kept ones get a row of the send buffer, in
        // (expert, token, choice) order; the first kept_ejk[me][e][j] of
        // the choice-j pairs to e (by token) are the kept ones.
        let mine_kept = &kept_ejk[me * e_all * k..(me + 1) * e_all * k];
        let mut cursor: Vec<usize> = kept[me * e_all..(me + 1) * e_all]
            .iter()
            .scan(0, |at, &n| {
                let start = *at;
                *at += n;
                Some(start)
            })
            .collect();
        let mut seen = vec![0usize; e_all * k];
        let mut slot_of = vec![None; tokens * k];
        let mut dropped = Vec::new();
        for (pair, &e) in topk_idx.iter().enumerate().take(tokens * k) {
            let (t, j, e) = (pair / k, pair % k, e as usize);
            let q = e * k + j;
            if seen[q] < mine_kept[q] {
                // Fits: slots < T·k <= u32::MAX (checked).
                slot_of[pair] = Some(cursor[e] as u32);
                cursor[e] += 1;
            } else {
                dropped.push(DroppedChoice {
                    token: t,
                    choice: j,
                    expert: e,
                });
            }
            seen[q] += 1;
        }

        let mut handle = Handle {
            ranks: p,
            rank: me,
            experts: e_all,
            hidden: h,
            topk: k,
            tokens,
            capacity,
            routed,
            kept,
            slot_of,
            weights: topk_weights[..tokens * k].to_vec(),
            dropped,
            schedules: [Schedule::Auto; 2],
            by_expert: [false; 2],
            tune_class: [None; 2],
        };

        // 4. The schedules of dispatch and of combine (the transpose), the
        // same on every rank: they depend on the count matrix only; and
        // whether each runs expert by expert (see `passes.rs`).
        let forward = handle.rank_rows();
        let backward = transpose(&forward, p);
        let row_bytes = (h * T::DTYPE.size()) as f64;
        let (d, d_class) = self.resolve(&forward, row_bytes, choose::Direction::Dispatch)?;
        let (c, c_class) = self.resolve(&backward, row_bytes, choose::Direction::Combine)?;
        handle.schedules = [d, c];
        handle.tune_class = [d_class, c_class];
        handle.by_expert = [
            self.by_expert(handle.schedules[0], &forward, row_bytes),
            self.by_expert(handle.schedules[1], &backward, row_bytes),
        ];

        // 5-6. The rows: each kept pair's row is token t's.
        let inputs = self.deliver(x, &handle, |pair| pair / k, true)?;
        Ok((inputs, handle))
    }

    /// Sends one row per (token, choice) pair to the expert slot that
    /// `handle`'s dispatch gave the pair, with no count exchange: the
    /// rows travel exactly as dispatch's did, by the same schedule, but
    /// choice j of token t carries its own row, `pair_rows[(t·k + j)·hidden..]`
    /// (T·k rows of `hidden`), instead of a copy of token t's.
    ///
    /// The adjoint of [`Dispatcher::combine_pairs`] (what the backward pass
    /// of an MoE layer needs: the gradient of each choice's output, scaled by
    /// its weight, goes to the expert that produced it); rows of dropped
    /// pairs are not sent. Collective: every rank calls it with the handle
    /// of the same dispatch. Argument errors are this rank's alone, as in
    /// [`Dispatcher::combine`].
    pub fn dispatch_pairs<T: Element>(
        &self,
        pair_rows: &[T],
        handle: &Handle,
    ) -> Result<ExpertInputs<T>> {
        let what = "moe dispatch_pairs";
        self.check_handle(handle, what)?;
        let (h, k) = (self.spec.hidden, self.spec.topk);
        let want = handle.tokens * k * h;
        if pair_rows.len() != want {
            return Err(Error::invalid(format!(
                "{what}: pair_rows has {} elements but must have {want} ({} tokens x top-{k} \
                 rows of hidden {h}, choice j of token t at row t*{k} + j)",
                pair_rows.len(),
                handle.tokens
            )));
        }
        self.deliver(pair_rows, handle, |pair| pair, false)
    }

    /// Dispatch's steps 5 and 6 for `handle`: packs the row
    /// `src[row_of(pair)·hidden..]` of every kept pair at its slot (by
    /// destination rank, then expert, or at the slot's place in
    /// expert-major order when dispatch runs expert by expert; every slot is
    /// written, so stale contents do not matter), sends the rows, and
    /// (unless they arrived expert by expert) moves each (source, expert)
    /// block from source-major to expert-major order.
    fn deliver<T: Element>(
        &self,
        src: &[T],
        handle: &Handle,
        row_of: impl Fn(usize) -> usize,
        measured: bool,
    ) -> Result<ExpertInputs<T>> {
        let (p, me, h) = (self.comm.size(), self.comm.rank(), self.spec.hidden);
        let forward = handle.rank_rows();
        let rows_out = handle.rows_sent();
        let mut send = self.state.pool.sized::<T>(rows_out * h);
        let place = handle.by_expert[0].then(|| handle.by_expert_positions());
        for (pair, slot) in handle.slot_of.iter().enumerate() {
            if let Some(slot) = *slot {
                let at = place.as_ref().map_or(slot as usize, |p| p[slot as usize]);
                let r = row_of(pair);
                send[at * h..(at + 1) * h].copy_from_slice(&src[r * h..(r + 1) * h]);
            }
        }

        let l = self.local_experts();
        let blocks = handle.blocks();
        let total: usize = (0..p).map(|s| forward[s * p + me]).sum::<usize>() * h;
        let mut recv = self.state.pool.sized(total);
        // The sub-communicators are made before the clock starts: a
        // measured exchange must not include them.
        self.prepare(handle.schedules[0])?;
        let started = std::time::Instant::now();
        // With one source or one expert per rank the arrival order is the
        // experts' order: the caller gets the buffer the rows arrive in.
        let rows = if handle.by_expert[0] {
            self.dispatch_by_expert(handle.schedules[0], &send, handle, &mut recv)?;
            self.state.pool.give(send);
            recv
        } else {
            self.exchange(handle.schedules[0], &send, &forward, &mut recv)?;
            self.state.pool.give(send);
            if p == 1 || l == 1 {
                recv
            } else {
                let mut rows = self.state.pool.empty();
                regroup(&recv, &blocks, (p, l, h), Order::ToExperts, &mut rows);
                self.state.pool.give(recv);
                rows
            }
        };
        if let (Some(class), true) = (handle.tune_class[0], measured) {
            let secs = started.elapsed().as_secs_f64();
            self.tuner().ran(0, class, handle.schedules[0], secs);
        }
        let mut offsets = vec![0usize; l + 1];
        for x in 0..l {
            offsets[x + 1] = offsets[x] + (0..p).map(|s| blocks[s * l + x]).sum::<usize>();
        }
        Ok(ExpertInputs {
            rows,
            offsets,
            hidden: h,
            first_expert: me * l,
        })
    }

    /// Returns the experts' outputs to their tokens and forms each token's
    /// weighted sum y_t = Σ_j g_tj · out_tj over its kept choices (a token
    /// whose every choice was dropped gets zeros).
    ///
    /// `expert_outputs` is laid out as the [`ExpertInputs`] of the
    /// dispatch `handle` came from (one row per received row, the experts'
    /// rows contiguous and in the same order); the result has T rows of
    /// `hidden`, in token order. Sums accumulate wide and round once (see
    /// [`Accumulate`]). Collective: every rank calls it.
    pub fn combine<T: Accumulate>(&self, expert_outputs: &[T], handle: &Handle) -> Result<Vec<T>> {
        let (returned, place) = self.bring_back(expert_outputs, handle, "moe combine")?;
        let terms: Vec<Option<(usize, f32)>> = handle
            .slot_of
            .iter()
            .zip(&handle.weights)
            .map(|(slot, &g)| {
                slot.map(|s| (place.as_ref().map_or(s as usize, |p| p[s as usize]), g))
            })
            .collect();
        // Every element is written by the weighted sum.
        let pool = &self.state.pool;
        let mut y = pool.sized(handle.tokens * self.spec.hidden);
        T::weighted_sum(&returned, &terms, handle.topk, &mut y);
        pool.give(returned);
        Ok(y)
    }

    /// Returns the experts' outputs to their tokens without summing them:
    /// T·k rows of `hidden`, row t·k + j the output of the expert of token
    /// t's choice j, unweighted, zeros where that choice was dropped.
    ///
    /// The exchange is [`Dispatcher::combine`]'s (same schedule, same
    /// layout of `expert_outputs`); the caller forms the weighted sum
    /// itself, e.g. where the weights need a gradient (the gradient of
    /// g_tj is the dot product of the output gradient of token t with row
    /// t·k + j), and the adjoint is [`Dispatcher::dispatch_pairs`].
    /// Collective: every rank calls it.
    pub fn combine_pairs<T: Element>(
        &self,
        expert_outputs: &[T],
        handle: &Handle,
    ) -> Result<Vec<T>> {
        let (returned, place) = self.bring_back(expert_outputs, handle, "moe combine_pairs")?;
        let h = self.spec.hidden;
        let mut out = vec![T::zeroed(); handle.tokens * self.spec.topk * h];
        for (pair, slot) in handle.slot_of.iter().enumerate() {
            if let Some(s) = *slot {
                let at = place.as_ref().map_or(s as usize, |p| p[s as usize]);
                out[pair * h..(pair + 1) * h].copy_from_slice(&returned[at * h..(at + 1) * h]);
            }
        }
        self.state.pool.give(returned);
        Ok(out)
    }

    /// Fails unless `handle` is of a dispatch of this dispatcher's shape on
    /// this rank.
    fn check_handle(&self, handle: &Handle, what: &str) -> Result<()> {
        let (p, h) = (self.comm.size(), self.spec.hidden);
        if handle.ranks != p
            || handle.rank != self.comm.rank()
            || handle.experts != self.spec.experts
            || handle.hidden != h
            || handle.topk != self.spec.topk
        {
            return Err(Error::invalid(format!(
                "{what}: the handle is of a dispatch of rank {} of {} ranks ({} experts, \
                 hidden {}, top-{}), not of this dispatcher (rank {} of {p}, {} experts, hidden \
                 {h}, top-{}); pass the handle its own dispatch returned",
                handle.rank,
                handle.ranks,
                handle.experts,
                handle.hidden,
                handle.topk,
                self.comm.rank(),
                self.spec.experts,
                self.spec.topk
            )));
        }
        Ok(())
    }

    /// Combine's exchange: the experts' outputs back to this rank, one row
    /// per slot of its dispatch, and where each slot's row lies in them
    /// (`None`: at the slot itself; else at its place in expert-major
    /// order, when combine ran expert by expert).
    #[allow(clippy::type_complexity)]
    fn bring_back<T: Element>(
        &self,
        expert_outputs: &[T],
        handle: &Handle,
        what: &str,
    ) -> Result<(Vec<T>, Option<Vec<usize>>)> {
        self.check_handle(handle, what)?;
        let (p, h) = (self.comm.size(), self.spec.hidden);
        let received = handle.rows_received();
        if expert_outputs.len() != received * h {
            return Err(Error::invalid(format!(
                "{what}: expert_outputs has {} elements but must have {} (the {received} \
                 rows this rank's experts received x hidden {h}, laid out as ExpertInputs)",
                expert_outputs.len(),
                received * h
            )));
        }
        let l = self.local_experts();
        let backward = transpose(&handle.rank_rows(), p);
        let pool = &self.state.pool;
        let me = self.comm.rank();
        let mut returned = pool.sized((0..p).map(|d| backward[d * p + me]).sum::<usize>() * h);
        self.prepare(handle.schedules[1])?;
        let started = std::time::Instant::now();
        let place = if handle.by_expert[1] {
            self.combine_by_expert(handle.schedules[1], expert_outputs, handle, &mut returned)?;
            Some(handle.by_expert_positions())
        } else if p == 1 || l == 1 {
            self.exchange(
                handle.schedules[1],
                expert_outputs,
                &backward,
                &mut returned,
            )?;
            None
        } else {
            let mut back = pool.empty();
            regroup(
                expert_outputs,
                &handle.blocks(),
                (p, l, h),
                Order::ToSources,
                &mut back,
            );
            self.exchange(handle.schedules[1], &back, &backward, &mut returned)?;
            pool.give(back);
            None
        };
        if let Some(class) = handle.tune_class[1] {
            self.tuner().ran(
                1,
                class,
                handle.schedules[1],
                started.elapsed().as_secs_f64(),
            );
        }
        Ok((returned, place))
    }

    /// What `auto` measured (a poisoned lock still holds usable numbers).
    fn tuner(&self) -> std::sync::MutexGuard<'_, tune::Tuner> {
        self.state
            .tuner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// This rank's arguments to dispatch, checked.
    fn check<T>(&self, x: &[T], topk_idx: &[u32], topk_weights: &[f32]) -> Result<()> {
        let Spec {
            experts,
            hidden: h,
            topk: k,
            ..
        } = self.spec;
        let what = "moe dispatch";
        if x.len() % h != 0 {
            return Err(Error::invalid(format!(
                "{what}: x has {} elements, not a multiple of hidden = {h} (x is tokens x hidden, \
                 row-major)",
                x.len()
            )));
        }
        let tokens = x.len() / h;
        let pairs = tokens.checked_mul(k).filter(|&n| n <= u32::MAX as usize);
        let Some(pairs) = pairs else {
            return Err(Error::invalid(format!(
                "{what}: {tokens} tokens x top-{k} is more than 2^32 - 1 (token, choice) pairs; \
                 dispatch fewer tokens per call"
            )));
        };
        for (name, len) in [
            ("topk_idx", topk_idx.len()),
            ("topk_weights", topk_weights.len()),
        ] {
            if len != pairs {
                return Err(Error::invalid(format!(
                    "{what}: {name} has {len} entries but must have {pairs} ({tokens} tokens x \
                     top-{k}, token t's choice j at t*{k} + j)"
                )));
            }
        }
        if let Some(pair) = topk_idx.iter().position(|&e| e as usize >= experts) {
            return Err(Error::invalid(format!(
                "{what}: topk_idx[{pair}] = {} (token {}, choice {}) is not an expert; use \
                 0..{experts}",
                topk_idx[pair],
                pair / k,
                pair % k
            )));
        }
        Ok(())
    }

    /// Every peer's verdict and fingerprint from the count exchange.
    fn check_peers(&self, all: &[u32], width: usize) -> Result<()> {
        let bad: Vec<String> = all
            .chunks_exact(width)
            .enumerate()
            .filter(|(_, r)| r[0] != ARGS_OK)
            .map(|(s, _)| s.to_string())
            .collect();
        if !bad.is_empty() {
            return Err(Error::invalid(format!(
                "moe dispatch: rank(s) {} passed arguments dispatch cannot use (their error \
                 says what); no row was exchanged",
                bad.join(", ")
            )));
        }
        let ours = self.spec.fingerprint(self.forced.0);
        let differ: Vec<String> = all
            .chunks_exact(width)
            .enumerate()
            .filter(|(_, r)| r[1] != ours)
            .map(|(s, _)| s.to_string())
            .collect();
        if !differ.is_empty() {
            return Err(Error::invalid(format!(
                "moe dispatch: rank(s) {} built their Dispatcher with a different Spec than \
                 rank {} ({:?}, schedule {} from {}); every rank must use the same \
                 experts, hidden, topk, policy and schedule (Spec::schedule, else \
                 FERROCOLL_MOE_SCHEDULE)",
                differ.join(", "),
                self.comm.rank(),
                self.spec,
                self.forced.0,
                self.forced.1
            )));
        }
        Ok(())
    }
}

/// The transpose of an n x n row-major matrix (combine's exchange is
/// dispatch's, backwards).
fn transpose(m: &[usize], n: usize) -> Vec<usize> {
    (0..n * n).map(|q| m[(q % n) * n + q / n]).collect()
}

/// Which way [`regroup`] moves the blocks.
#[derive(Clone, Copy, PartialEq)]
enum Order {
    /// Source-major (how all-to-all-v delivers) to expert-major (how the
    /// experts read).
    ToExperts,
    /// Back.
    ToSources,
}

/// Appends to `out` the (source rank, local expert) blocks of `rows`
/// (`blocks[s·l + x]` rows each) moved between source-major and
/// expert-major order, each block copied once.
fn regroup<T: Copy>(
    rows: &[T],
    blocks: &[usize],
    (p, l, h): (usize, usize, usize),
    order: Order,
    out: &mut Vec<T>,
) {
    let source_major: Vec<usize> = (0..p * l).collect();
    let expert_major: Vec<usize> = (0..l)
        .flat_map(|x| (0..p).map(move |s| s * l + x))
        .collect();
    // Where each block starts (in rows) when the blocks lie in `sequence`.
    let starts = |sequence: &[usize]| {
        let mut at = vec![0usize; p * l];
        let mut next = 0;
        for &b in sequence {
            at[b] = next;
            next += blocks[b];
        }
        at
    };
    let (from, to) = match order {
        Order::ToExperts => (starts(&source_major), expert_major),
        Order::ToSources => (starts(&expert_major), source_major),
    };
    out.reserve(rows.len());
    for b in to {
        out.extend_from_slice(&rows[from[b] * h..(from[b] + blocks[b]) * h]);
    }
}
