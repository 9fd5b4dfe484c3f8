//! What a run's state costs in memory, from counts of what its plans hold:
//! the engine's own record sizes (`size_of` of its message, round, event and
//! message-table entries), so that an estimate follows the engine when its
//! records change. [`crate::estimate`] counts the plans and calls this.

use std::mem::size_of;

use super::events::Event;
use super::matching::{Chan, Msg, PendingRecv};
use super::state::RoundInfo;
use super::timeline::FINE;

/// What a run holds, counted over all its engine ranks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Footprint {
    /// Engine ranks (the groups' ranks together).
    pub ranks: u64,
    /// Physical ranks of the network.
    pub physical: u64,
    /// Links of the network.
    pub links: u64,
    /// Link classes of the network.
    pub classes: u64,
    /// Groups (jobs).
    pub groups: u64,
    /// Messages (sends).
    pub messages: u64,
    /// Receives (one per message in plans that fit together).
    pub receives: u64,
    /// Rounds of all plans.
    pub rounds: u64,
    /// Channels of the message table, counted once at each end (a rank's
    /// distinct send peers plus its distinct receive peers).
    pub channel_ends: u64,
    /// Events that can wait in the queue at once: the messages in flight
    /// together (each rank's largest round, summed) times the events one
    /// message can have pending (a chunk on every hop), plus one per rank.
    pub pending_events: u64,
    /// Bytes of the largest single plan (its rounds and ops), built one at
    /// a time while the engine reads them.
    pub largest_plan_bytes: u64,
}

/// A `BTreeMap` entry (key, value, the node's share) and the first
/// allocation of its vector: what one channel costs at one end of the
/// message table, beyond the entries themselves.
const CHANNEL_OVERHEAD: u64 = 112;

/// The process itself (code, allocator, the network's tables): what a
/// run of a handful of ranks already uses.
const BASE: u64 = 32 << 20;

impl Footprint {
    /// Bytes the run will hold at its peak: while the message table is
    /// being paired (messages, rounds, receive slots and the table with its
    /// per-channel vectors) or while events run (the same lists and the
    /// event queue), whichever is larger, plus the per-rank and per-link
    /// vectors, the timeline histograms and the plan being read. Vectors
    /// count their length: capacity that a vector reserved ahead but never
    /// wrote is address space, not memory the kernel has to find.
    pub fn bytes(&self) -> u64 {
        let size = |n: u64, of: usize| n.saturating_mul(of as u64);
        let lists = size(self.messages, size_of::<Msg>())
            .saturating_add(size(self.rounds + 1, size_of::<RoundInfo>()))
            .saturating_add(size(self.receives, size_of::<u32>()));
        let table = size(self.messages, size_of::<u32>())
            .saturating_add(size(self.receives, size_of::<PendingRecv>()))
            .saturating_add(size(
                self.channel_ends,
                size_of::<Chan>() + CHANNEL_OVERHEAD as usize,
            ));
        let queue = size(self.pending_events, size_of::<Event>());
        // cur, pending, phys, group_of, gamma, start_at, finish, the
        // first-round index and the critical path's `seen`.
        let per_rank = size(self.ranks, 8 * 8 + 1);
        let per_link = size(self.links * self.groups, 16).saturating_add(size(self.links, 8));
        let hist = size(self.classes * self.groups, FINE * 8);
        lists
            .saturating_add(table.max(queue))
            .saturating_add(per_rank)
            .saturating_add(size(self.physical, 8))
            .saturating_add(per_link)
            .saturating_add(hist)
            .saturating_add(self.largest_plan_bytes)
            .saturating_add(BASE)
    }
}
