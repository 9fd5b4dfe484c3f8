//! Butterfly (recursive doubling) algorithms, and the power-of-two pre/post
//! step that the butterfly and halving-doubling families share.
//!
//! * allreduce: in round k every rank exchanges its whole partial result with
//!   the partner at distance 2^k and reduces. log2 N rounds on the critical
//!   path, each rank sends log2(N)·M elements. Wins for small buffers, where
//!   the latency term dominates: half the rounds of halving-doubling and
//!   log2 N instead of 2(N-1) for the ring, at log2 N / (2(N-1)/N) times the
//!   ring's volume.
//! * allgather: in round k every rank exchanges everything gathered so far
//!   (2^k blocks) with the partner at distance 2^k. log2 N rounds, (N-1)·c
//!   elements each rank sends and receives (bandwidth-optimal, like the ring,
//!   with log2 N instead of N-1 rounds).
//!
//! # Groups that are not a power of two
//!
//! The seeds' pre/post step ([`PowerOfTwoCore`], MPICH's pairing): with
//! N' = 2^floor(log2 N) and r = N - N' extra ranks, each even rank below 2r
//! is an extra rank that first sends its data to the odd rank above it (which
//! folds it in), sits out the power-of-two core of the N' remaining ranks,
//! and receives the result from the same partner at the end. That is two
//! rounds more on the critical path, and the partner sends M (allreduce) or
//! (N-1)·c (allgather) elements more. Pairing neighbours keeps the fold on
//! one node under block placement, and it makes the blocks a core rank
//! speaks for contiguous in rank order (see [`PowerOfTwoCore::first_block`]),
//! so an allgather round is one message per direction.
//!
//! Counts need no special care here: allreduce moves the whole vector and
//! allgather whole blocks. A zero count gives an empty plan on every rank.

use super::{single_rank, Plan, PlanBuilder, PlanRequest, Span};

/// The seeds' pre/post step for power-of-two algorithms, with MPICH's
/// pairing.
///
/// With N' = 2^floor(log2 n) and r = n - N', the ranks `2i` (`i < r`) are
/// extra: they fold their data into rank `2i + 1` before the core and get
/// the result from it afterwards. The N' core ranks are renumbered
/// `0..N'` in rank order: virtual rank `v` is rank `2v + 1` for `v < r` and
/// rank `v + r` otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct PowerOfTwoCore {
    /// Ranks in the core, N' = 2^floor(log2 n).
    pub(super) size: usize,
    /// Extra ranks, r = n - N'.
    pub(super) extra: usize,
}

/// What one rank does in a [`PowerOfTwoCore`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role {
    /// Sends its data to `partner` first, receives the result from it last.
    Extra {
        /// The core rank that stands in for this one.
        partner: usize,
    },
    /// Takes part in the core as virtual rank `vrank`.
    Core {
        /// This rank's number in the core, `0..N'`.
        vrank: usize,
        /// The extra rank that folds into this one, if any.
        partner: Option<usize>,
    },
}

impl PowerOfTwoCore {
    /// The core of a group of `n >= 1` ranks.
    pub(super) fn new(n: usize) -> PowerOfTwoCore {
        debug_assert!(n >= 1, "a group has at least one rank");
        let size = 1 << n.ilog2();
        PowerOfTwoCore {
            size,
            extra: n - size,
        }
    }

    /// log2 N': the number of butterfly rounds in the core.
    pub(super) fn levels(&self) -> usize {
        self.size.trailing_zeros() as usize
    }

    /// The role of `rank`.
    pub(super) fn role(&self, rank: usize) -> Role {
        if rank < 2 * self.extra {
            if rank % 2 == 0 {
                Role::Extra { partner: rank + 1 }
            } else {
                Role::Core {
                    vrank: rank / 2,
                    partner: Some(rank - 1),
                }
            }
        } else {
            Role::Core {
                vrank: rank - self.extra,
                partner: None,
            }
        }
    }

    /// The real rank of core virtual rank `v`.
    pub(super) fn real(&self, v: usize) -> usize {
        if v < self.extra {
            2 * v + 1
        } else {
            v + self.extra
        }
    }

    /// The first rank whose data core rank `v` speaks for: its extra
    /// partner if it has one, else itself. Core rank `v` speaks for ranks
    /// `first_block(v)..first_block(v + 1)`, so an aligned range of virtual
    /// ranks speaks for a contiguous range of ranks; `first_block(N') = n`.
    pub(super) fn first_block(&self, v: usize) -> usize {
        v + v.min(self.extra)
    }
}

/// Recursive-doubling allreduce.
///
/// The partial result alternates between the output and scratch: round k
/// sends the current buffer and receives-and-reduces into the other one
/// (`next = current op incoming`), so a round never writes what it sends and
/// no separate reduction pass is needed. The starting buffer is chosen so
/// that the last round lands in the output. Both partners compute
/// `own op theirs`, which is the same value for the commutative operators,
/// so every rank ends with identical data.
///
/// In place the output is the input, so the input is read only before the
/// first write to the output.
pub(super) fn all_reduce(req: &PlanRequest) -> Plan {
    let (n, count) = (req.n, req.count);
    if n == 1 {
        return single_rank(count);
    }
    let mut p = PlanBuilder::default();
    if count == 0 {
        return p.finish();
    }
    let (input, output, scratch) = (
        Span::input(0, count),
        Span::output(0, count),
        Span::scratch(0, count),
    );
    let core = PowerOfTwoCore::new(n);
    let (vrank, partner) = match core.role(req.rank) {
        Role::Extra { partner } => {
            p.round().send(partner, input);
            p.round().recv(partner, output);
            return p.finish();
        }
        Role::Core { vrank, partner } => (vrank, partner),
    };
    let levels = core.levels();
    p.scratch(count);
    // The buffer that holds the partial result before round k: the output
    // when levels - k is even, scratch otherwise (so round levels - 1 writes
    // the output). Before round 0 the input may stand in for the output.
    let buffer_before = |k: usize| {
        if (levels - k) % 2 == 0 {
            output
        } else {
            scratch
        }
    };
    let mut current = buffer_before(0);
    let mut round = p.round();
    if let Some(extra) = partner {
        round.recv_reduce(extra, current, input);
        round = p.round();
    } else if current == output {
        // Round 0 writes scratch only, so it can send the input itself.
        current = input;
    } else {
        // Round 0 writes the output, which in place is the input: send a
        // copy. Local ops run before the round's messages.
        round.copy(current, input);
    }
    for k in 0..levels {
        let peer = core.real(vrank ^ (1 << k));
        let next = buffer_before(k + 1);
        round.send(peer, current).recv_reduce(peer, next, current);
        current = next;
        round = p.round();
    }
    if let Some(extra) = partner {
        round.send(extra, current);
    }
    p.finish()
}

/// Recursive-doubling allgather.
///
/// Before round k, core rank `v` holds the blocks of the aligned group of
/// 2^k virtual ranks around it; its partner `v xor 2^k` holds the other half
/// of the next group. With [`PowerOfTwoCore`]'s pairing both halves are
/// contiguous ranges of the output, so each round is one send and one
/// receive, straight in the output. An extra rank receives the final result
/// as two messages (the blocks before and after its own), so that every rank
/// receives exactly (N-1)·c elements.
pub(super) fn all_gather(req: &PlanRequest) -> Plan {
    let (n, rank, c) = (req.n, req.rank, req.count);
    if n == 1 {
        return single_rank(c);
    }
    let mut p = PlanBuilder::default();
    if c == 0 {
        return p.finish();
    }
    let blocks = |first: usize, end: usize| Span::output(first * c, (end - first) * c);
    let core = PowerOfTwoCore::new(n);
    let (vrank, partner) = match core.role(rank) {
        Role::Extra { partner } => {
            // The rank's own block is never sent back to it; in place this
            // copy is a no-op.
            p.round()
                .copy(blocks(rank, rank + 1), Span::input(0, c))
                .send(partner, Span::input(0, c));
            // The extra rank is even and below 2r <= n - 1, so blocks after
            // it always exist; blocks before it exist unless it is rank 0.
            let mut round = p.round();
            if rank > 0 {
                round.recv(partner, blocks(0, rank));
            }
            round.recv(partner, blocks(rank + 1, n));
            return p.finish();
        }
        Role::Core { vrank, partner } => (vrank, partner),
    };
    let mut round = p.round();
    let own = blocks(rank, rank + 1);
    if let Some(extra) = partner {
        // In place this copy is a no-op: the input is the rank's own block.
        round.copy(own, Span::input(0, c));
        round.recv(extra, blocks(extra, extra + 1));
        round = p.round();
    }
    // The output blocks that the aligned group of `size` virtual ranks
    // containing `v` speaks for.
    let group = |v: usize, size: usize| {
        let first = v & !(size - 1);
        blocks(core.first_block(first), core.first_block(first + size))
    };
    for k in 0..core.levels() {
        let size = 1 << k;
        let peer_v = vrank ^ size;
        if k == 0 && partner.is_none() {
            // The first block out is the rank's own: sent from the input,
            // with the copy into the output overlapped with the messages
            // (listed after them), as the ring does. Sending it from the
            // output made the send wait for the copy, and the peer read
            // lines this rank had just written (on threads: a 256 KiB
            // allgather of 2 ranks took 17.4 us against the ring's 7.3).
            round
                .send(core.real(peer_v), Span::input(0, c))
                .recv(core.real(peer_v), group(peer_v, size))
                .copy(own, Span::input(0, c));
        } else {
            round
                .send(core.real(peer_v), group(vrank, size))
                .recv(core.real(peer_v), group(peer_v, size));
        }
        round = p.round();
    }
    if let Some(extra) = partner {
        // `extra` is even, so `extra > 0` exactly when blocks before it exist.
        if extra > 0 {
            round.send(extra, blocks(0, extra));
        }
        round.send(extra, blocks(extra + 1, n));
    }
    p.finish()
}
