//! The non-blocking forms (`iall_reduce`, ...): each takes owned buffers,
//! reserves the call's sequence number at once (so calls keep the order in
//! which they were issued) and runs the blocking form on a background
//! thread; [`Request::wait`] returns the buffers.

use super::Communicator;
use crate::error::Result;
use crate::request::Request;
use crate::types::{Element, ReduceOp};

impl Communicator {
    /// Reserves the next sequence number now (so calls keep issue order) and
    /// runs `f` on a background thread with a handle bound to it.
    fn start<R, F>(&self, f: F) -> Request<R>
    where
        R: Send + 'static,
        F: FnOnce(&Communicator) -> Result<R> + Send + 'static,
    {
        let mut handle = self.clone();
        handle.reserved_seq = Some(self.next_seq());
        Request::spawn(move || f(&handle))
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
