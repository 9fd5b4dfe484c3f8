//! The event queue: what happens next, in (time, phase, sequence) order, so
//! that a run is deterministic bit for bit.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// What an event does.
#[derive(Clone, Copy, Debug)]
pub(super) enum Kind {
    /// A rank enters its current round's communication.
    Post { rank: u32 },
    /// Both ends of a message are posted: it starts moving.
    Start { msg: u32 },
    /// Chunk `chunk` reaches hop `hop` of its path; its tail left the
    /// previous link at `prev_end`.
    Hop {
        msg: u32,
        hop: u8,
        chunk: u32,
        bytes: u32,
        prev_end: f64,
    },
    /// A message has arrived (both ends may count it).
    Delivered { msg: u32 },
    /// The receiver has finished reducing a message.
    Reduced { msg: u32 },
}

/// An event; the heap pops the smallest (time, phase, tie) first.
///
/// At one instant every other event (phase 0, in creation order: `tie` is a
/// sequence number) comes before the message starts (phase 1, in message id
/// order: `tie` is the id, and ids number each rank's sends in plan order).
/// So a rank's messages that become ready at the same time leave its port
/// in plan order, whichever partner happened to post first: a direct
/// all-to-all sends to r+1, r+2, ... as planned instead of every rank
/// sending to rank 0 first.
pub(super) struct Event {
    pub(super) time: f64,
    phase: u8,
    tie: u64,
    pub(super) kind: Kind,
}

impl PartialEq for Event {
    fn eq(&self, o: &Event) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, o: &Event) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Event {
    /// Reversed, so that the max-heap pops the earliest event first.
    fn cmp(&self, o: &Event) -> Ordering {
        o.time
            .total_cmp(&self.time)
            .then_with(|| o.phase.cmp(&self.phase))
            .then_with(|| o.tie.cmp(&self.tie))
    }
}

/// The pending events of a run, earliest first (see [`Event`] for the
/// order of events at one instant).
pub(super) struct EventQueue {
    heap: BinaryHeap<Event>,
    /// Sequence number of the last event pushed (ties at one instant).
    seq: u64,
}

impl EventQueue {
    /// An empty queue.
    pub(super) fn new() -> EventQueue {
        EventQueue {
            heap: BinaryHeap::new(),
            seq: 0,
        }
    }

    /// Schedules `kind` at `time`.
    pub(super) fn push(&mut self, time: f64, kind: Kind) {
        let (phase, tie) = match kind {
            Kind::Start { msg } => (1, u64::from(msg)),
            _ => {
                self.seq += 1;
                (0, self.seq)
            }
        };
        self.heap.push(Event {
            time,
            phase,
            tie,
            kind,
        });
    }

    /// The earliest event, removed from the queue.
    pub(super) fn pop(&mut self) -> Option<Event> {
        self.heap.pop()
    }
}
