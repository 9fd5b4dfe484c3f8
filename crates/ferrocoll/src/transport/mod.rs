//! Transports move bytes between ranks; they never know which algorithm runs.
//!
//! The executor hands a transport one round at a time: a list of outgoing
//! messages and a list of expected incoming ones, all to be in flight
//! together ([`Transport::exchange`]). Incoming data is handed to a [`Sink`]
//! chunk by chunk, so the executor can reduce while the rest of a message is
//! still arriving (and a zero-copy transport can hand over the sender's memory
//! directly). Every message carries a [`Header`] naming the call that sent it,
//! so a transport can reject a message from a different collective instead of
//! reducing garbage.
//!
//! Implementations: [`thread::ThreadTransport`] (ranks as threads of one
//! process), and for ranks that are processes one progress engine
//! (`engine.rs`) over byte channels: shared-memory rings ([`shm`]) within a
//! host, TCP ([`tcp`]) between hosts; `crate::init` assembles them. Small
//! collectives among the ranks of one host bypass plans, executor and
//! rings altogether through mailboxes (`fastpath/`), which a transport
//! offers as its optional [`SmallCollectives`] capability.

pub(crate) mod channel;
pub(crate) mod config;
pub(crate) mod engine;
pub(crate) mod fastpath;
pub mod shm;
pub mod tcp;
pub mod thread;
pub(crate) mod wire;

use std::fmt;
use std::time::{Duration, Instant};

use crate::error::Result;
use crate::exec::Memory;
use crate::plan::Collective;
use crate::types::{DType, ReduceOp};

/// What kind of call a message belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CallKind {
    /// A collective.
    Collective(Collective),
    /// Point-to-point `send`/`recv`.
    PointToPoint,
}

/// The signature of a call, carried by every message: two ranks at the same
/// point of a communicator must agree on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Signature {
    /// Which call.
    pub kind: CallKind,
    /// Element type.
    pub dtype: DType,
    /// Reduction operator, for reducing collectives.
    pub op: Option<ReduceOp>,
    /// Element count as the caller passed it (per-rank block for the
    /// block collectives; 0 for alltoallv and barrier).
    pub count: usize,
    /// Root, for rooted collectives.
    pub root: Option<usize>,
}

impl fmt::Display for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            CallKind::Collective(c) => write!(f, "{c}(")?,
            CallKind::PointToPoint => write!(f, "send/recv(")?,
        }
        write!(f, "count={}, {}", self.count, self.dtype)?;
        if let Some(op) = self.op {
            write!(f, ", {op}")?;
        }
        if let Some(root) = self.root {
            write!(f, ", root={root}")?;
        }
        write!(f, ")")
    }
}

/// Identifies the messages of one call on one communicator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Header {
    /// Communicator id (the same on every member; distinct for split groups).
    pub comm: u64,
    /// Call sequence number on the communicator (collectives), or the user
    /// tag with [`Header::P2P_BIT`] set (point-to-point).
    pub seq: u64,
    /// The call's signature.
    pub sig: Signature,
}

impl Header {
    /// Marks `seq` as a point-to-point tag rather than a collective number.
    pub const P2P_BIT: u64 = 1 << 63;

    /// The call as positions and reports name it: a collective by its
    /// number (`allreduce(...) #183`), a message by its tag.
    pub(crate) fn describe_call(&self) -> String {
        if self.seq & Header::P2P_BIT != 0 {
            format!("{} tag {}", self.sig, self.seq & !Header::P2P_BIT)
        } else {
            format!("{} #{}", self.sig, self.seq)
        }
    }

    /// Messages with equal keys are matched in FIFO order.
    pub fn key(&self) -> (u64, u64) {
        (self.comm, self.seq)
    }
}

/// One outgoing message of a round.
#[derive(Clone, Copy, Debug)]
pub struct Outgoing<'a> {
    /// Destination, in transport (world) ranks.
    pub peer: usize,
    /// The bytes to send.
    pub data: &'a [u8],
}

/// One expected incoming message of a round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Incoming {
    /// Source, in transport (world) ranks; [`Incoming::ANY_SOURCE`] only in
    /// [`Transport::recv_any`].
    pub peer: usize,
    /// Exact length in bytes; a message of any other length is a mismatch.
    pub len: usize,
}

impl Incoming {
    /// A receive that takes the message of whichever peer sends first
    /// ([`Transport::recv_any`]).
    pub const ANY_SOURCE: usize = usize::MAX;
}

/// Receives incoming data.
pub trait Sink {
    /// Called with `chunk`, bytes `offset..offset + chunk.len()` of incoming
    /// message `index` (an index into the `recvs` of [`Transport::exchange`]).
    /// Chunks of one message arrive in order and cover it exactly once;
    /// `offset` is a multiple of 8 so chunks hold whole elements.
    fn deliver(&mut self, index: usize, offset: usize, chunk: &[u8]);

    /// Where bytes `offset..offset + len` of incoming message `index` are
    /// stored unchanged, if they are (a plain copy, not a reduction): a
    /// transport may then write them there itself (a socket read straight
    /// into place, saving the copy out of its own buffer) instead of
    /// calling [`Sink::deliver`]. Writing bytes into a prefix of the slice
    /// has the effect `deliver(index, offset, those bytes)` would have; the
    /// rules of `deliver` hold, except that `offset` may be any byte.
    /// `None` (the default) makes the transport call `deliver`.
    fn destination(&mut self, index: usize, offset: usize, len: usize) -> Option<&mut [u8]> {
        let _ = (index, offset, len);
        None
    }

    /// Local work of the caller's that may run while this exchange's
    /// messages are in flight (a plan's overlapped local ops, see
    /// [`crate::plan`]): a transport calls it at most once per exchange,
    /// after it has posted the sends, from the exchanging thread; the caller
    /// does whatever was not done once the exchange returns. It touches no
    /// memory of the exchange's messages. Default: nothing.
    fn overlap(&mut self) {}

    /// Does at most about `bytes` bytes of the work [`Sink::overlap`] does
    /// (whatever is left of it), for a transport that interleaves it with
    /// moving the exchange's bytes; returns whether any is left. The same
    /// rules hold; a transport may mix the two (`overlap` does the rest).
    /// Default: all of it at once.
    fn overlap_some(&mut self, bytes: usize) -> bool {
        let _ = bytes;
        self.overlap();
        false
    }
}

/// Moves bytes between the ranks of a group.
pub trait Transport: Send + Sync {
    /// This rank (transport/world numbering).
    fn rank(&self) -> usize;

    /// Number of ranks the transport connects.
    fn size(&self) -> usize;

    /// Sends every message of `sends` and receives every message of `recvs`,
    /// all in flight together, and returns when all are done.
    ///
    /// Messages to one peer are delivered in order, and matched by
    /// [`Header::key`] in FIFO order. A message under the same key but with a
    /// different signature or length fails with [`crate::Error::Mismatch`];
    /// waiting past `deadline` fails with [`crate::Error::Timeout`] naming the
    /// peer. On error, no send of this call is left referencing `sends`.
    fn exchange(
        &self,
        header: &Header,
        sends: &[Outgoing<'_>],
        recvs: &[Incoming],
        sink: &mut dyn Sink,
        deadline: Instant,
    ) -> Result<()>;

    /// Called once a collective's every round is done on this rank. A
    /// message of that call still unclaimed now was sent by a peer that ran
    /// something else at this point (a broadcast root that only sends meets
    /// a reduce that only sends): the transport reports it as
    /// [`crate::Error::Mismatch`] here, and on the peer. Default: nothing to
    /// check.
    fn end_call(&self, _header: &Header) -> Result<()> {
        Ok(())
    }

    /// Makes every current and future wait of every rank on this transport
    /// fail with [`crate::Error::Aborted`].
    fn abort(&self);

    /// Short name for diagnostics and benchmark output (`thread`, `shm`, `tcp`).
    fn name(&self) -> &'static str;

    /// Whether the large messages of a call of `coll` are moved by their
    /// receivers alone, straight from the sender's memory, so that a sender
    /// does no per-byte work (the cost model's
    /// [`crate::cost::Profile::receiver_copies`]): the thread transport's
    /// every call, the shared-memory transport's calls that its single-copy
    /// path carries. Default: no (the sender copies into a ring or socket).
    fn receivers_copy(&self, coll: crate::plan::Collective) -> bool {
        let _ = coll;
        false
    }

    /// Receives one point-to-point message of `header` (a tag) of `len`
    /// bytes from whichever peer's arrives first, into `sink` (index 0),
    /// and returns that peer (MPI's `MPI_ANY_SOURCE`). Messages of one
    /// peer still arrive in order. Default: the transport cannot.
    fn recv_any(
        &self,
        _header: &Header,
        _len: usize,
        _sink: &mut dyn Sink,
        _deadline: Instant,
    ) -> Result<usize> {
        Err(crate::Error::invalid(format!(
            "recv_any: the {} transport cannot receive from any source; name the sender",
            self.name()
        )))
    }

    /// Where each of `ranks` (transport ranks) is on communicator `comm`,
    /// as far as they answer within `within`: "in all_reduce(...) #183",
    /// "in no call on this communicator; last finished ... #182", "gone";
    /// `None` for a rank that did not answer. A timeout lists them (the
    /// desync report). Default: nothing known.
    fn positions(&self, _comm: u64, ranks: &[usize], _within: Duration) -> Vec<Option<String>> {
        vec![None; ranks.len()]
    }

    /// The transport's way to run small collectives without plans, if it
    /// has one (the shared-memory fast path). Default: none, every call
    /// runs its plan through [`Transport::exchange`].
    fn small_collectives(&self) -> Option<&dyn SmallCollectives> {
        None
    }
}

/// One small collective, as the communicator hands it to
/// [`SmallCollectives::run`].
#[derive(Clone, Copy, Debug)]
pub struct SmallCall<'a> {
    /// Group rank -> transport rank.
    pub group: &'a [usize],
    /// This rank in the group.
    pub rank: usize,
    /// Which collective.
    pub coll: Collective,
    /// Element type.
    pub dtype: DType,
    /// The reduction (`Avg` sums; the caller divides).
    pub op: ReduceOp,
    /// Root, for rooted collectives (0 otherwise).
    pub root: usize,
    /// Elements per rank (allgather: per block).
    pub count: usize,
    /// The call's key and signature, as a planned call's messages carry.
    pub header: Header,
    /// How long a wait may take.
    pub timeout: Duration,
}

/// The buffers of a [`SmallCall`]: the call's input and output, which may
/// be the same memory (in place). Built by the communicator only.
pub struct SmallBuffers<'m, 'b> {
    pub(crate) mem: &'m mut Memory<'b>,
}

/// An optional capability of a transport ([`Transport::small_collectives`]):
/// runs small collectives in one step, without plans or the executor, with
/// the same matching, mismatch, deadline and abort guarantees as
/// [`Transport::exchange`]. Which calls qualify depends only on what every
/// rank of a call agrees on (see the fast path's documentation), so all
/// ranks of a call take the same path.
pub trait SmallCollectives: Send + Sync {
    /// Whether it reaches every rank of `group` (transport ranks).
    fn serves(&self, group: &[usize]) -> bool;

    /// Whether it implements `coll` for `count` elements of `dtype` (per
    /// rank) among `n` ranks.
    fn eligible(&self, coll: Collective, count: usize, dtype: DType, n: usize) -> bool;

    /// Runs `call` over `buffers`.
    fn run(&self, call: &SmallCall<'_>, buffers: SmallBuffers<'_, '_>) -> Result<()>;
}
