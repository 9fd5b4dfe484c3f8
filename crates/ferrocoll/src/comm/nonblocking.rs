//! The non-blocking forms (`iall_reduce`, ...): each takes owned buffers,
//! reserves the call's sequence number at once (so calls keep the order in
//! which they were issued) and queues the blocking form on the
//! communicator's progress worker (`progress.rs`); [`Request::wait`]
//! returns the buffers.
//!
//! There are no non-blocking point-to-point forms (`isend`, `irecv`). They
//! cannot share the worker's queue (a synchronous send waits for its
//! receive, so an `isend` queued before an `irecv` on both ranks of a pair
//! never completes), and running each on a thread of its own, as the Python
//! layer does, brings back the thread per call and still cannot keep MPI's
//! non-overtaking order: two sends on one peer and tag reach the transport
//! in whatever order their threads run, not in issue order. Doing them
//! right needs the transports to post a send or receive at issue time and
//! progress it later; until then a caller that wants overlap runs the
//! blocking `send`/`recv` on a thread of its choosing
//! (`std::thread::scope`), which is what a thread per call would do.

use super::progress::Engine;
use super::Communicator;
use crate::error::{Error, Result};
use crate::request::Request;
use crate::types::{Element, ReduceOp};

impl Communicator {
    /// This communicator's progress worker, started on first use.
    fn engine(&self) -> Result<&Engine> {
        if let Some(engine) = self.shared.engine.get() {
            return Ok(engine);
        }
        let name = format!("ferrocoll-progress-{}", self.rank());
        let engine = Engine::start(name).map_err(|e| {
            Error::Internal(format!(
                "could not start the progress worker for non-blocking calls: {e}"
            ))
        })?;
        // Another thread may have started one meanwhile: then that one is
        // used and this one ends (dropping it joins its idle thread).
        Ok(self.shared.engine.get_or_init(|| Box::new(engine)))
    }

    /// Queues `task` on this communicator's progress worker, the thread its
    /// non-blocking calls run on, behind everything queued before: for a
    /// binding that runs its own asynchronous calls in the background (the
    /// Python package does), each on a handle from
    /// [`Communicator::reserve_next_call`] taken in program order, so they
    /// share the worker and its order with this crate's `i*` calls instead
    /// of a thread of their own. `task` must not wait for a later task of
    /// the same worker (a point-to-point send that needs the matching
    /// receive queued behind it would wait forever). An error when the
    /// worker cannot be started.
    pub fn run_on_progress_worker(&self, task: impl FnOnce() + Send + 'static) -> Result<()> {
        self.engine()?.push(Box::new(task));
        Ok(())
    }

    /// Queues `f` on the progress worker behind every call issued before;
    /// the request completes with what `f` returns. The caller has reserved
    /// whatever sequence number `f` uses.
    pub(super) fn submit<R, F>(&self, f: F) -> Request<R>
    where
        R: Send + 'static,
        F: FnOnce() -> Result<R> + Send + 'static,
    {
        match self.engine() {
            Ok(engine) => {
                let (request, done) = Request::pending();
                engine.push(Box::new(move || done.finish(f())));
                request
            }
            Err(e) => Request::ready(Err(e)),
        }
    }

    /// Reserves the next sequence number now (so calls keep issue order) and
    /// queues `f` on the progress worker with a handle bound to it.
    fn start<R, F>(&self, f: F) -> Request<R>
    where
        R: Send + 'static,
        F: FnOnce(&Communicator) -> Result<R> + Send + 'static,
    {
        let handle = self.reserve_next_call();
        self.submit(move || f(&handle))
    }

    /// Non-blocking [`Communicator::all_reduce_in_place`]; the buffer comes
    /// back from [`Request::wait`].
    pub fn iall_reduce<T: Element>(&self, mut buf: Vec<T>, op: ReduceOp) -> Request<Vec<T>> {
        self.start(move |c| c.all_reduce_in_place(&mut buf, op).map(|_| buf))
    }

    /// Non-blocking [`Communicator::broadcast_in_place`].
    pub fn ibroadcast<T: Element>(&self, mut buf: Vec<T>, root: usize) -> Request<Vec<T>> {
        self.start(move |c| c.broadcast_in_place(&mut buf, root).map(|_| buf))
    }

    /// Non-blocking [`Communicator::reduce_in_place`].
    pub fn ireduce<T: Element>(
        &self,
        mut buf: Vec<T>,
        op: ReduceOp,
        root: usize,
    ) -> Request<Vec<T>> {
        self.start(move |c| c.reduce_in_place(&mut buf, op, root).map(|_| buf))
    }

    /// Non-blocking [`Communicator::all_gather`]; returns the gathered buffer.
    pub fn iall_gather<T: Element>(&self, send: Vec<T>) -> Request<Vec<T>> {
        self.start(move |c| {
            let mut recv = vec![T::zeroed(); send.len() * c.size()];
            c.all_gather(&send, &mut recv).map(|_| recv)
        })
    }

    /// Non-blocking [`Communicator::reduce_scatter`]; returns this rank's
    /// reduced block.
    pub fn ireduce_scatter<T: Element>(&self, send: Vec<T>, op: ReduceOp) -> Request<Vec<T>> {
        self.start(move |c| {
            let mut recv = vec![T::zeroed(); send.len() / c.size()];
            c.reduce_scatter(&send, &mut recv, op).map(|_| recv)
        })
    }

    /// Non-blocking [`Communicator::all_to_all`]; returns the received blocks.
    pub fn iall_to_all<T: Element>(&self, send: Vec<T>) -> Request<Vec<T>> {
        self.start(move |c| {
            let mut recv = vec![T::zeroed(); send.len()];
            c.all_to_all(&send, &mut recv).map(|_| recv)
        })
    }

    /// Non-blocking [`Communicator::all_to_all_v`]; returns the received data.
    pub fn iall_to_all_v<T: Element>(
        &self,
        send: Vec<T>,
        send_counts: Vec<usize>,
        recv_counts: Vec<usize>,
    ) -> Request<Vec<T>> {
        self.start(move |c| {
            let mut recv = vec![T::zeroed(); recv_counts.iter().sum()];
            c.all_to_all_v(&send, &send_counts, &mut recv, &recv_counts)
                .map(|_| recv)
        })
    }

    /// Non-blocking [`Communicator::gather`]; returns the gathered buffer on
    /// the root and an empty vector elsewhere.
    pub fn igather<T: Element>(&self, send: Vec<T>, root: usize) -> Request<Vec<T>> {
        self.start(move |c| {
            let len = if c.rank() == root {
                send.len() * c.size()
            } else {
                0
            };
            let mut recv = vec![T::zeroed(); len];
            c.gather(&send, &mut recv, root).map(|_| recv)
        })
    }

    /// Non-blocking [`Communicator::scatter`] of blocks of `count` elements;
    /// `send` is read on the root only.
    pub fn iscatter<T: Element>(&self, send: Vec<T>, count: usize, root: usize) -> Request<Vec<T>> {
        self.start(move |c| {
            let mut recv = vec![T::zeroed(); count];
            c.scatter(&send, &mut recv, root).map(|_| recv)
        })
    }

    /// Non-blocking [`Communicator::barrier`].
    pub fn ibarrier(&self) -> Request<()> {
        self.start(|c| c.barrier())
    }
}
