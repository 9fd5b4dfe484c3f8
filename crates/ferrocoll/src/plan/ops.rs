//! A plan as data: the buffers ([`Buf`]) and [`Span`]s of elements in them,
//! the [`Op`]s over spans, [`Round`]s of ops in flight together, and the
//! [`Plan`] of one rank.

/// Which buffer a span refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Buf {
    /// The caller's send buffer (read-only).
    Input,
    /// The caller's receive buffer.
    Output,
    /// Temporary memory owned by the executor, [`Plan::scratch`] elements.
    Scratch,
}

/// A range of elements in one buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Span {
    /// The buffer.
    pub buf: Buf,
    /// First element.
    pub offset: usize,
    /// Number of elements.
    pub len: usize,
}

impl Span {
    /// `len` elements of the input buffer from `offset`.
    pub const fn input(offset: usize, len: usize) -> Span {
        Span {
            buf: Buf::Input,
            offset,
            len,
        }
    }
    /// `len` elements of the output buffer from `offset`.
    pub const fn output(offset: usize, len: usize) -> Span {
        Span {
            buf: Buf::Output,
            offset,
            len,
        }
    }
    /// `len` elements of scratch from `offset`.
    pub const fn scratch(offset: usize, len: usize) -> Span {
        Span {
            buf: Buf::Scratch,
            offset,
            len,
        }
    }
    /// One past the last element.
    pub const fn end(&self) -> usize {
        self.offset + self.len
    }
}

/// One step of a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Send `src` to `peer`.
    Send {
        /// Destination rank (in the group).
        peer: usize,
        /// What to send.
        src: Span,
    },
    /// Receive from `peer` into `dst` (the message has `dst.len` elements).
    Recv {
        /// Source rank.
        peer: usize,
        /// Where the data lands.
        dst: Span,
    },
    /// Receive from `peer` and store `dst = local op incoming`. `local` is
    /// either exactly `dst` (accumulate) or disjoint from it.
    RecvReduce {
        /// Source rank.
        peer: usize,
        /// Where the result lands.
        dst: Span,
        /// The local operand.
        local: Span,
    },
    /// Local copy `dst = src` (a no-op when both name the same memory).
    Copy {
        /// Destination.
        dst: Span,
        /// Source.
        src: Span,
    },
    /// Local reduction `dst = a op b`.
    Reduce {
        /// Destination (exactly `a`, or disjoint from it; always disjoint
        /// from `b`).
        dst: Span,
        /// First operand.
        a: Span,
        /// Second operand.
        b: Span,
    },
}

impl Op {
    /// The peer of a communication op, `None` for local ops.
    pub const fn peer(&self) -> Option<usize> {
        match *self {
            Op::Send { peer, .. } | Op::Recv { peer, .. } | Op::RecvReduce { peer, .. } => {
                Some(peer)
            }
            Op::Copy { .. } | Op::Reduce { .. } => None,
        }
    }
}

/// A set of ops in flight together (see the [module docs](super)).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Round {
    /// The ops: local ones that run first, then the messages, then local
    /// ones that run while the messages are in flight (see the module docs
    /// of [`crate::plan`]).
    pub ops: Vec<Op>,
}

/// What one rank does in one collective.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// The rounds, in order.
    pub rounds: Vec<Round>,
    /// Scratch elements the plan needs.
    pub scratch: usize,
}

impl Plan {
    /// Elements this rank sends in total.
    pub fn elements_sent(&self) -> usize {
        self.ops()
            .filter_map(|op| match op {
                Op::Send { src, .. } => Some(src.len),
                _ => None,
            })
            .sum()
    }

    /// Number of messages this rank sends.
    pub fn messages_sent(&self) -> usize {
        self.ops()
            .filter(|op| matches!(op, Op::Send { .. }))
            .count()
    }

    /// All ops of all rounds in order.
    pub fn ops(&self) -> impl Iterator<Item = &Op> {
        self.rounds.iter().flat_map(|r| r.ops.iter())
    }
}
