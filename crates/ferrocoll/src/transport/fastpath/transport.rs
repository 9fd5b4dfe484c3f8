//! The shared-memory transport with its fast path: the engine for every
//! planned call, and [`SmallCollectives`] over the mailboxes. The engine
//! sees the fast path only as its [`Bypass`](crate::transport::engine::Bypass),
//! the fast path the engine only through its
//! [`Link`](crate::transport::engine::Link).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::small;
use super::FastPath;
use crate::error::Result;
use crate::plan::Collective;
use crate::transport::engine::Engine;
use crate::transport::{
    Header, Incoming, Outgoing, Sink, SmallBuffers, SmallCall, SmallCollectives, Transport,
};
use crate::types::DType;

/// An engine whose small calls among the ranks of a host may take the
/// mailboxes.
pub(crate) struct FastTransport {
    /// Dropped first: its goodbyes go out while the mailboxes still exist.
    engine: Engine,
    fast: Arc<FastPath>,
}

impl FastTransport {
    /// `engine` with `fast` as its bypass (the engine's ledger moves into
    /// the fast path's books).
    pub(crate) fn new(engine: Engine, fast: FastPath) -> FastTransport {
        let fast = Arc::new(fast);
        let engine = engine.with_bypass(Arc::clone(&fast) as _, Arc::clone(&fast) as _);
        FastTransport { engine, fast }
    }
}

impl Transport for FastTransport {
    fn rank(&self) -> usize {
        self.engine.rank()
    }

    fn size(&self) -> usize {
        self.engine.size()
    }

    fn exchange(
        &self,
        header: &Header,
        sends: &[Outgoing<'_>],
        recvs: &[Incoming],
        sink: &mut dyn Sink,
        deadline: Instant,
    ) -> Result<()> {
        self.engine.exchange(header, sends, recvs, sink, deadline)
    }

    fn recv_any(
        &self,
        header: &Header,
        len: usize,
        sink: &mut dyn Sink,
        deadline: Instant,
    ) -> Result<usize> {
        self.engine.recv_any(header, len, sink, deadline)
    }

    fn end_call(&self, header: &Header) -> Result<()> {
        self.engine.end_call(header)
    }

    fn abort(&self) {
        self.engine.abort()
    }

    fn name(&self) -> &'static str {
        self.engine.name()
    }

    fn receivers_copy(&self, coll: crate::plan::Collective) -> bool {
        self.engine.receivers_copy(coll)
    }

    fn small_collectives(&self) -> Option<&dyn SmallCollectives> {
        Some(self)
    }

    fn positions(&self, comm: u64, ranks: &[usize], within: Duration) -> Vec<Option<String>> {
        self.engine.positions(comm, ranks, within)
    }
}

impl SmallCollectives for FastTransport {
    fn serves(&self, group: &[usize]) -> bool {
        self.fast.serves(group)
    }

    fn eligible(&self, coll: Collective, count: usize, dtype: DType, n: usize) -> bool {
        small::eligible(coll, count, dtype, n)
            || small::remote_eligible(&self.fast, coll, count, dtype, n)
    }

    fn run(&self, call: &SmallCall<'_>, buffers: SmallBuffers<'_, '_>) -> Result<()> {
        small::run(&self.fast, &self.engine.link(), call, buffers.mem)
    }
}
