//! The event queue: what happens next, in (time, phase, sequence) order, so
//! that a run is deterministic bit for bit.

use std::cmp::Ordering;

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
///
/// A 4-ary min-heap rather than `std`'s binary heap: a 100,000-rank
/// quotient keeps millions of events waiting (every message of a direct
/// exchange starts at once), and popping spent half the run in cache
/// misses down a binary heap's 22 levels; four children per node halve the
/// depth and share cache lines. The order is total (no two events tie on
/// (time, phase, tie)), so the events come out in exactly the order a
/// binary heap gives.
pub(super) struct EventQueue {
    heap: Vec<Event>,
    /// Sequence number of the last event pushed (ties at one instant).
    seq: u64,
}

/// Children per node of the heap.
const ARITY: usize = 4;

impl EventQueue {
    /// An empty queue.
    pub(super) fn new() -> EventQueue {
        EventQueue {
            heap: Vec::new(),
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
        let ev = Event {
            time,
            phase,
            tie,
            kind,
        };
        // Sift up: `Event`'s order is reversed (greater is earlier).
        let mut i = self.heap.len();
        self.heap.push(ev);
        while i > 0 {
            let parent = (i - 1) / ARITY;
            if self.heap[i] <= self.heap[parent] {
                break;
            }
            self.heap.swap(i, parent);
            i = parent;
        }
    }

    /// The earliest event, removed from the queue.
    pub(super) fn pop(&mut self) -> Option<Event> {
        let last = self.heap.pop()?;
        if self.heap.is_empty() {
            return Some(last);
        }
        let top = std::mem::replace(&mut self.heap[0], last);
        // Sift down: move the earliest child up while it is earlier.
        let n = self.heap.len();
        let mut i = 0;
        loop {
            let first = ARITY * i + 1;
            if first >= n {
                break;
            }
            let mut best = first;
            for c in first + 1..(first + ARITY).min(n) {
                if self.heap[c] > self.heap[best] {
                    best = c;
                }
            }
            if self.heap[best] <= self.heap[i] {
                break;
            }
            self.heap.swap(i, best);
            i = best;
        }
        Some(top)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_come_out_in_time_phase_tie_order() {
        let mut q = EventQueue::new();
        // A scrambled mix of times, with starts (phase 1) at shared instants.
        let mut x = 12345u64;
        let mut pushed = 0;
        for i in 0..5000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let time = (x % 97) as f64 * 0.5;
            if i % 3 == 0 {
                q.push(time, Kind::Start { msg: i });
            } else {
                q.push(time, Kind::Post { rank: i });
            }
            pushed += 1;
        }
        let mut out = Vec::new();
        while let Some(e) = q.pop() {
            out.push(e);
        }
        assert_eq!(out.len(), pushed);
        for w in out.windows(2) {
            // Popped earliest first: each is "greater" (earlier) than the next.
            assert!(
                w[0] > w[1],
                "{} {} then {} {}",
                w[0].time,
                w[0].tie,
                w[1].time,
                w[1].tie
            );
        }
    }
}
