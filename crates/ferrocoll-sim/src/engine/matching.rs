//! Messages and the pairing of their ends: the engine's [`Msg`] list and
//! its side of the shared message table ([`ferrocoll::plan::pairing`]),
//! which pairs the k-th send from a to b with the k-th receive at b from a.

use ferrocoll::plan::pairing::{Channel, Matcher};

/// One message, matched.
pub(super) struct Msg {
    pub(super) src: u32,
    pub(super) dst: u32,
    /// The physical rank the message travels to: `phys[dst]`, except in
    /// the aggregated mode, where `dst` is the representative of this rank.
    pub(super) to: u32,
    pub(super) bytes: u64,
    pub(super) reduce: bool,
    /// Ends posted so far (0, 1 or 2).
    pub(super) posted: u8,
    pub(super) chunks_left: u32,
    /// Latest chunk arrival so far.
    pub(super) done: f64,
    /// When both ends were posted.
    pub(super) started: f64,
    /// Its slot in the receive id list (to find the receiver's round).
    pub(super) recv_slot: u32,
}

/// A peer named by a plan, as the engine sees it.
pub(super) struct Peer {
    /// The engine rank that runs its plan.
    pub(super) engine: u32,
    /// The physical rank a message to it travels to.
    pub(super) to: u32,
    /// Which of the ranks `engine` stands for (0 unless aggregated).
    pub(super) offset: u32,
}

/// A receive awaiting its send: (slot in the receive id list, bytes, reduce?).
pub(super) type PendingRecv = (u32, u64, bool);

/// A channel of the message table: (sending engine rank, receiving engine
/// rank, offset). The offset is 0 except in the aggregated mode, where it
/// tells apart the ranks a representative stands for (see
/// crate::symmetry).
///
/// The shared table ([`ferrocoll::plan::pairing`]) keeps the simulator's
/// lean ends (a `u32` message id per send, the receive's slot, bytes and
/// reduce flag per receive) in the same per-channel vectors of a `BTreeMap`
/// the engine kept before it was shared, so sharing costs neither memory nor
/// time on 16,384-rank plans.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Chan {
    pub(super) src: u32,
    pub(super) dst: u32,
    pub(super) offset: u32,
}

impl Channel for Chan {
    fn src(&self) -> usize {
        self.src as usize
    }
    fn dst(&self) -> usize {
        self.dst as usize
    }
}

/// Writes the table's pairs into the message list: a receive learns its
/// message id, a message its receive slot and whether it is reduced.
pub(super) struct Pairs<'m> {
    pub(super) msgs: &'m mut [Msg],
    pub(super) recv_ids: &'m mut [u32],
}

impl Matcher<Chan, u32, PendingRecv> for Pairs<'_> {
    fn sent_len(&self, &id: &u32) -> u64 {
        self.msgs[id as usize].bytes
    }
    fn expected_len(&self, recv: &PendingRecv) -> u64 {
        recv.1
    }
    fn matched(&mut self, _: Chan, _: usize, id: u32, (slot, _, reduce): PendingRecv) {
        let m = &mut self.msgs[id as usize];
        m.reduce = reduce;
        m.recv_slot = slot;
        self.recv_ids[slot as usize] = id;
    }
}
