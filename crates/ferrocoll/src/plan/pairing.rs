//! The message table: which receive each send meets.
//!
//! The rule, which the executor and every transport follow: between one
//! ordered pair of ranks, within one collective, the k-th send from `src` to
//! `dst` (in `src`'s plan order) meets the k-th receive from `src` posted by
//! `dst` (in `dst`'s plan order), and both must name the same length. The plan
//! checker ([`super::match_messages`]), the cost model's walk
//! (`cost::walk`) and the simulator's engine all need the pairs, and all
//! used to write the rule, and its errors, themselves; this module is the
//! one place that does.
//!
//! A [`MessageTable`] stores each end as a value of its user's choosing (a
//! site in a plan, a round, a message id), so each user keeps its own lean
//! representation: the simulator stores a `u32` per send for plans of
//! 16,384 ranks, and the table adds nothing to that beyond the per-channel
//! vectors it already kept. Lengths are asked of the user through
//! [`Matcher`] rather than stored beside every end, for the same reason: the
//! simulator already holds a send's length in its message list.

use std::collections::BTreeMap;
use std::fmt;

/// A channel of messages: the ordered pair of ranks a message goes between,
/// with whatever else its user needs to tell channels apart (the simulator's
/// aggregated mode adds an offset). Channels are visited in their `Ord`
/// order, which makes the first error reported deterministic.
pub trait Channel: Ord + Copy {
    /// The sending rank.
    fn src(&self) -> usize;
    /// The receiving rank.
    fn dst(&self) -> usize;
}

/// `(src, dst)`.
impl Channel for (usize, usize) {
    fn src(&self) -> usize {
        self.0
    }
    fn dst(&self) -> usize {
        self.1
    }
}

/// What a [`MessageTable`]'s user does with the pairs it finds.
///
/// A trait rather than closures because a user typically reads lengths from
/// the same structure it writes the pairs into (the simulator's message
/// list), which two closures could not both borrow.
pub trait Matcher<K, S, R> {
    /// The length of a send, in the table's unit.
    fn sent_len(&self, send: &S) -> u64;
    /// The length a receive expects, in the table's unit.
    fn expected_len(&self, recv: &R) -> u64;
    /// Called once for each pair whose lengths agree: the `k`-th message of
    /// `channel` (from 0). Pairs come in channel order and, within a
    /// channel, in message order.
    fn matched(&mut self, channel: K, k: usize, send: S, recv: R);
}

/// The sends and receives of all ranks, by channel, in plan order.
pub struct MessageTable<K, S, R> {
    sends: BTreeMap<K, Vec<S>>,
    recvs: BTreeMap<K, Vec<R>>,
    unit: &'static str,
}

impl<K: Channel, S, R> MessageTable<K, S, R> {
    /// An empty table whose lengths count `unit` (`"elements"`, `"bytes"`),
    /// the word its errors use.
    pub fn new(unit: &'static str) -> Self {
        MessageTable {
            sends: BTreeMap::new(),
            recvs: BTreeMap::new(),
            unit,
        }
    }

    /// Records a send on `channel`. Each rank's sends on one channel must
    /// be recorded in its plan order (ranks may be interleaved).
    pub fn send(&mut self, channel: K, send: S) {
        self.sends.entry(channel).or_default().push(send);
    }

    /// Records a receive on `channel` (whose `dst` is the receiving rank).
    /// Each rank's receives on one channel must be recorded in its plan
    /// order.
    pub fn recv(&mut self, channel: K, recv: R) {
        self.recvs.entry(channel).or_default().push(recv);
    }

    /// Pairs the k-th send of every channel with its k-th receive, handing
    /// each pair to `matcher`. Fails on the first channel (in channel order)
    /// with a send never received, a receive never sent, or a pair whose
    /// lengths differ; channels with receives but no send at all are
    /// reported after every channel that has sends.
    pub fn pair<M: Matcher<K, S, R>>(self, matcher: &mut M) -> Result<(), Unpaired> {
        let MessageTable {
            sends,
            mut recvs,
            unit,
        } = self;
        let fail = |channel: &K, k: usize, problem: Problem| Unpaired {
            src: channel.src(),
            dst: channel.dst(),
            k,
            problem,
            unit,
        };
        for (channel, sends) in sends {
            let recvs = recvs.remove(&channel).unwrap_or_default();
            if recvs.len() < sends.len() {
                return Err(fail(&channel, recvs.len(), Problem::NeverReceived));
            }
            if recvs.len() > sends.len() {
                return Err(fail(&channel, sends.len(), Problem::NeverSent));
            }
            for (k, (send, recv)) in sends.into_iter().zip(recvs).enumerate() {
                let (sent, expected) = (matcher.sent_len(&send), matcher.expected_len(&recv));
                if sent != expected {
                    return Err(fail(&channel, k, Problem::Lengths { sent, expected }));
                }
                matcher.matched(channel, k, send, recv);
            }
        }
        match recvs.into_keys().next() {
            Some(channel) => Err(fail(&channel, 0, Problem::NeverSent)),
            None => Ok(()),
        }
    }
}

/// Why a [`MessageTable`] could not pair its messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unpaired {
    /// The sending rank of the channel.
    pub src: usize,
    /// The receiving rank of the channel.
    pub dst: usize,
    /// Which message of the channel (from 0).
    pub k: usize,
    /// What is wrong with it.
    pub problem: Problem,
    /// The unit of the lengths (`"elements"`, `"bytes"`).
    pub unit: &'static str,
}

/// What is wrong with an [`Unpaired`] message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Problem {
    /// `src` sends it and `dst` never receives it.
    NeverReceived,
    /// `dst` waits for it and `src` never sends it.
    NeverSent,
    /// The two ends name different lengths.
    Lengths {
        /// What the send carries.
        sent: u64,
        /// What the receive expects.
        expected: u64,
    },
}

impl Unpaired {
    /// The error text, with ranks named by `name` (the simulator names
    /// them by group as well).
    pub fn describe(&self, name: impl Fn(usize) -> String) -> String {
        let (s, d, k, unit) = (name(self.src), name(self.dst), self.k, self.unit);
        match self.problem {
            Problem::NeverReceived => {
                format!("{s} sends message #{k} to {d} that is never received")
            }
            Problem::NeverSent => format!("{d} waits for message #{k} from {s} that is never sent"),
            Problem::Lengths { sent, expected } => format!(
                "{s} sends {sent} {unit} to {d} (message #{k}) but {d} expects {expected} {unit}"
            ),
        }
    }
}

/// The error text with ranks named `rank R`.
impl fmt::Display for Unpaired {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe(|r| format!("rank {r}")))
    }
}

impl std::error::Error for Unpaired {}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ends are (tag, length); pairs are collected as (channel, k, tags).
    #[derive(Default)]
    struct Collect(Vec<((usize, usize), usize, &'static str, &'static str)>);

    type End = (&'static str, u64);

    impl Matcher<(usize, usize), End, End> for Collect {
        fn sent_len(&self, send: &End) -> u64 {
            send.1
        }
        fn expected_len(&self, recv: &End) -> u64 {
            recv.1
        }
        fn matched(&mut self, channel: (usize, usize), k: usize, send: End, recv: End) {
            self.0.push((channel, k, send.0, recv.0));
        }
    }

    fn table() -> MessageTable<(usize, usize), End, End> {
        MessageTable::new("elements")
    }

    #[test]
    fn sends_meet_receives_in_order_per_pair() {
        let mut t = table();
        // Rank 0 sends twice to 1 and once to 2; the ranks are recorded
        // interleaved, and 1's receives come before 0's sends.
        t.recv((0, 1), ("r1a", 3));
        t.send((0, 1), ("s1a", 3));
        t.send((0, 2), ("s2", 5));
        t.recv((0, 2), ("r2", 5));
        t.send((0, 1), ("s1b", 4));
        t.recv((0, 1), ("r1b", 4));
        t.send((2, 0), ("back", 1));
        t.recv((2, 0), ("got", 1));
        let mut c = Collect::default();
        t.pair(&mut c).unwrap();
        assert_eq!(
            c.0,
            [
                ((0, 1), 0, "s1a", "r1a"),
                ((0, 1), 1, "s1b", "r1b"),
                ((0, 2), 0, "s2", "r2"),
                ((2, 0), 0, "back", "got"),
            ]
        );
    }

    #[test]
    fn a_send_never_received_is_named() {
        let mut t = table();
        t.send((0, 1), ("a", 1));
        t.send((0, 1), ("b", 1));
        t.recv((0, 1), ("a", 1));
        let e = t.pair(&mut Collect::default()).unwrap_err();
        assert_eq!(
            (e.src, e.dst, e.k, e.problem),
            (0, 1, 1, Problem::NeverReceived)
        );
        assert_eq!(
            e.to_string(),
            "rank 0 sends message #1 to rank 1 that is never received"
        );
    }

    #[test]
    fn a_receive_never_sent_is_named() {
        // More receives than sends on a channel with sends...
        let mut t = table();
        t.send((1, 0), ("a", 1));
        t.recv((1, 0), ("a", 1));
        t.recv((1, 0), ("b", 1));
        let e = t.pair(&mut Collect::default()).unwrap_err();
        assert_eq!(
            (e.src, e.dst, e.k, e.problem),
            (1, 0, 1, Problem::NeverSent)
        );
        assert_eq!(
            e.to_string(),
            "rank 0 waits for message #1 from rank 1 that is never sent"
        );
        // ... and on a channel without any.
        let mut t = table();
        t.send((0, 1), ("a", 1));
        t.recv((0, 1), ("a", 1));
        t.recv((2, 1), ("x", 1));
        let e = t.pair(&mut Collect::default()).unwrap_err();
        assert_eq!(
            (e.src, e.dst, e.k, e.problem),
            (2, 1, 0, Problem::NeverSent)
        );
    }

    #[test]
    fn lengths_must_agree() {
        let mut t = table();
        t.send((0, 1), ("a", 3));
        t.recv((0, 1), ("a", 4));
        let e = t.pair(&mut Collect::default()).unwrap_err();
        assert_eq!(
            e.problem,
            Problem::Lengths {
                sent: 3,
                expected: 4
            }
        );
        assert_eq!(
            e.to_string(),
            "rank 0 sends 3 elements to rank 1 (message #0) but rank 1 expects 4 elements"
        );
        // The caller chooses how ranks are named, the table the unit.
        let mut t: MessageTable<(usize, usize), End, End> = MessageTable::new("bytes");
        t.send((0, 1), ("a", 8));
        t.recv((0, 1), ("a", 4));
        let e = t.pair(&mut Collect::default()).unwrap_err();
        assert_eq!(
            e.describe(|r| format!("group 1 rank {r}")),
            "group 1 rank 0 sends 8 bytes to group 1 rank 1 (message #0) but group 1 rank 1 expects 4 bytes"
        );
    }

    #[test]
    fn zero_length_messages_pair_like_any_other() {
        let mut t = table();
        t.send((0, 1), ("empty", 0));
        t.send((0, 1), ("full", 2));
        t.recv((0, 1), ("empty", 0));
        t.recv((0, 1), ("full", 2));
        let mut c = Collect::default();
        t.pair(&mut c).unwrap();
        assert_eq!(
            c.0,
            [((0, 1), 0, "empty", "empty"), ((0, 1), 1, "full", "full")]
        );
        // A zero-length send still needs its receive.
        let mut t = table();
        t.send((0, 1), ("empty", 0));
        let e = t.pair(&mut Collect::default()).unwrap_err();
        assert_eq!(e.problem, Problem::NeverReceived);
    }

    #[test]
    fn one_rank_has_nothing_to_pair() {
        // A group of one sends nothing: the empty table pairs.
        let mut c = Collect::default();
        table().pair(&mut c).unwrap();
        assert!(c.0.is_empty());
    }
}
