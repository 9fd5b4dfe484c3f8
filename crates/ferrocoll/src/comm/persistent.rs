//! Persistent collectives (MPI-4's `MPI_Allreduce_init` and kin): a call
//! whose arguments are checked, whose path (the small-call fast path or an
//! algorithm) is resolved and whose plans are built, and in debug builds
//! checked, once; each run then only executes.
//!
//! Every run takes the next sequence number when it starts, as any call
//! does, so persistent calls interleave with other calls like any other;
//! every rank must start its persistent calls in the same order as the rest
//! of its calls.
//!
//! # Why the buffers are owned
//!
//! A [`Persistent`] owns its buffers (the caller moves `Vec`s in and reaches
//! them through [`Persistent::send_mut`], [`Persistent::recv`], ...) rather
//! than borrowing `&'a mut [T]`. [`Persistent::start`] hands the call to
//! the progress worker, another thread, which must be able to write the
//! buffers until the call ends; a borrow cannot express that soundly, since
//! safe code may `mem::forget` whatever handle was meant to wait at the end
//! of the borrow and then touch (or free) the buffers while the worker still
//! writes them (the reason `std::thread::scope` takes a closure, and the
//! reason [`crate::Request`] owns its buffers too). So `start` moves the
//! buffers to the worker and waiting moves them back: a move of three words
//! each way, no copy. [`Started`] borrows the persistent call mutably, so
//! the compiler keeps the buffers untouched while the call runs.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use super::api::len_error;
use super::call::{Prepared, Spec};
use super::Communicator;
use crate::error::{Error, Result};
use crate::exec::Memory;
use crate::kernels;
use crate::plan::{Algorithm, Collective};
use crate::request::Request;
use crate::types::{DType, Element, ReduceOp};

/// A collective planned once and run many times ([`Communicator::all_reduce_init`]
/// and the other `*_init` methods): [`Persistent::start`] runs it on the
/// communicator's progress worker and [`Started::wait`] completes it;
/// [`Persistent::run`] does both on this thread.
///
/// It owns its buffers (see the module's notes for why): the input and
/// output are reached through [`Persistent::send`] / [`Persistent::send_mut`]
/// and [`Persistent::recv`] / [`Persistent::recv_mut`] between runs, and for
/// the in-place forms both name the one buffer.
///
/// ```
/// # use ferrocoll::{local, ReduceOp};
/// local::run(2, |comm| {
///     let mut sum = comm.all_reduce_init(vec![0.0f32; 1000], ReduceOp::Sum).unwrap();
///     for step in 0..3 {
///         sum.send_mut().fill(step as f32 + comm.rank() as f32);
///         let running = sum.start().unwrap();
///         // ... compute while the allreduce runs ...
///         running.wait().unwrap();
///         assert_eq!(sum.recv()[0], 2.0 * step as f32 + 1.0);
///     }
/// }).unwrap();
/// ```
pub struct Persistent<T: Element> {
    comm: Communicator,
    fixed: Arc<Fixed>,
    /// The buffers; `None` while a start is in flight (they are with the
    /// worker) or after a run that panicked lost them.
    bufs: Option<Buffers<T>>,
    /// The start in flight, when its [`Started`] was forgotten
    /// (`mem::forget`) or is still alive.
    pending: Option<Request<(Buffers<T>, Result<()>)>>,
}

/// What every run of one persistent call shares (with the worker, too).
struct Fixed {
    call: Prepared,
    shape: Shape,
    /// Elements of the output buffer an `Avg` reduction divides by the group
    /// size after the call (as the blocking forms do).
    avg: Option<Range<usize>>,
}

/// Where the input and output are in the buffers.
enum Shape {
    /// One buffer (`recv`): the input and output element ranges in it
    /// ([`crate::plan::Layout::in_place`]).
    InPlace {
        input: Range<usize>,
        output: Range<usize>,
    },
    /// The first `send` elements of `send` in, the first `recv` of `recv`
    /// out (fewer than the buffer on ranks that do not use it, as the
    /// blocking forms pass an empty slice there).
    Separate { send: usize, recv: usize },
}

struct Buffers<T> {
    /// Empty for the in-place forms.
    send: Vec<T>,
    recv: Vec<T>,
}

impl<T: Element> fmt::Debug for Persistent<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let call = &self.fixed.call;
        f.debug_struct("Persistent")
            .field("collective", &call.spec.coll)
            .field("count", &call.spec.count)
            .field("algorithm", &call.algorithm())
            .field("fast_path", &call.is_fast())
            .field("active", &self.pending.is_some())
            .finish()
    }
}

/// Runs one persistent call on `comm` over `bufs`.
fn execute<T: Element>(comm: &Communicator, fixed: &Fixed, bufs: &mut Buffers<T>) -> Result<()> {
    {
        let mut mem = match &fixed.shape {
            Shape::InPlace { input, output } => {
                Memory::in_place(&mut bufs.recv, input.clone(), output.clone())
            }
            Shape::Separate { send, recv } => {
                Memory::separate(&bufs.send[..*send], &mut bufs.recv[..*recv])
            }
        };
        comm.run_prepared(&fixed.call, &mut mem)?;
    }
    if let Some(range) = &fixed.avg {
        let out: &mut [T] = &mut bufs.recv[range.clone()];
        kernels::divide(T::DTYPE, bytemuck::cast_slice_mut(out), comm.size());
    }
    Ok(())
}

fn lost() -> Error {
    Error::Internal(
        "this persistent call lost its buffers when an earlier run panicked; build it again".into(),
    )
}

impl<T: Element> Persistent<T> {
    /// Starts one run on the communicator's progress worker, behind every
    /// non-blocking call issued before, and returns at once; the run takes
    /// the next sequence number now. The returned [`Started`] completes it
    /// ([`Started::wait`]); until then the buffers are the worker's.
    pub fn start(&mut self) -> Result<Started<'_, T>> {
        // Only a forgotten `Started` leaves a run pending here; like a
        // dropped one, its result is discarded.
        let _ = self.settle();
        let mut bufs = self.bufs.take().ok_or_else(lost)?;
        let handle = self.comm.reserve_next_call();
        let fixed = Arc::clone(&self.fixed);
        self.pending = Some(self.comm.submit(move || {
            let outcome = execute(&handle, &fixed, &mut bufs);
            Ok((bufs, outcome))
        }));
        Ok(Started { p: self })
    }

    /// One run on this thread, blocking until it completes (the cheapest
    /// way to repeat a call when there is nothing to overlap).
    pub fn run(&mut self) -> Result<()> {
        let _ = self.settle();
        let bufs = self.bufs.as_mut().ok_or_else(lost)?;
        execute(&self.comm, &self.fixed, bufs)
    }

    /// Waits for a run in flight, if any, and takes its buffers back.
    fn settle(&mut self) -> Result<()> {
        let Some(pending) = self.pending.take() else {
            return Ok(());
        };
        let (bufs, outcome) = pending.wait()?;
        self.bufs = Some(bufs);
        outcome
    }

    /// The input: what [`Persistent::send_mut`] last wrote (in place: the
    /// buffer, which holds the last run's result). Empty while a forgotten
    /// [`Started`] still has the buffers.
    pub fn send(&self) -> &[T] {
        match &self.bufs {
            Some(b) if matches!(self.fixed.shape, Shape::InPlace { .. }) => &b.recv,
            Some(b) => &b.send,
            None => &[],
        }
    }

    /// The input, to fill before the next run (in place: the buffer). If a
    /// forgotten [`Started`] left a run in flight, waits for it first.
    pub fn send_mut(&mut self) -> &mut [T] {
        let _ = self.settle();
        let in_place = matches!(self.fixed.shape, Shape::InPlace { .. });
        match &mut self.bufs {
            Some(b) => {
                if in_place {
                    &mut b.recv
                } else {
                    &mut b.send
                }
            }
            None => &mut [],
        }
    }

    /// The output: the last run's result (in place: the buffer). Empty
    /// while a forgotten [`Started`] still has the buffers.
    pub fn recv(&self) -> &[T] {
        self.bufs.as_ref().map_or(&[], |b| &b.recv)
    }

    /// The output, writable (in place: the buffer). If a forgotten
    /// [`Started`] left a run in flight, waits for it first.
    pub fn recv_mut(&mut self) -> &mut [T] {
        let _ = self.settle();
        self.bufs.as_mut().map_or(&mut [], |b| &mut b.recv)
    }

    /// The buffers back, `(send, recv)`; in place the buffer is `recv` and
    /// `send` is empty. Waits for a run in flight first.
    pub fn into_buffers(mut self) -> (Vec<T>, Vec<T>) {
        let _ = self.settle();
        self.bufs
            .take()
            .map_or((Vec::new(), Vec::new()), |b| (b.send, b.recv))
    }

    /// Which collective this is.
    pub fn collective(&self) -> Collective {
        self.fixed.call.spec.coll
    }

    /// The algorithm every run uses, or `None` when runs take the
    /// small-collective fast path.
    pub fn algorithm(&self) -> Option<Algorithm> {
        self.fixed.call.algorithm()
    }
}

/// A run of a [`Persistent`] call in progress; [`Started::wait`] completes it.
///
/// It borrows the persistent call mutably, so nothing touches the buffers
/// while the run has them. Dropping it waits for the run (so the buffers
/// are back when the borrow ends) and discards its result.
#[must_use = "a started run is completed by wait(); dropping it waits and discards the result"]
pub struct Started<'p, T: Element> {
    p: &'p mut Persistent<T>,
}

impl<T: Element> fmt::Debug for Started<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Started")
            .field("call", &self.p)
            .field("complete", &self.is_complete())
            .finish()
    }
}

impl<T: Element> Started<'_, T> {
    /// Blocks (asleep) until the run completes; its buffers are then back in
    /// the [`Persistent`]. An error is the call's, as from the blocking
    /// form; the buffers come back either way.
    pub fn wait(self) -> Result<()> {
        self.p.settle()
    }

    /// True once the run has completed ([`Started::wait`] then returns at
    /// once). Never blocks.
    pub fn is_complete(&self) -> bool {
        self.p.pending.as_ref().map_or(true, Request::is_complete)
    }

    /// The non-blocking completion check (MPI_Test): the run's result once
    /// it has completed (the buffers are back then), `None` while it runs.
    pub fn test(&mut self) -> Option<Result<()>> {
        if self.is_complete() {
            Some(self.p.settle())
        } else {
            None
        }
    }
}

impl<T: Element> Drop for Started<'_, T> {
    fn drop(&mut self) {
        let _ = self.p.settle();
    }
}

impl Communicator {
    /// A persistent call of `spec` over `send` and `recv`.
    fn persistent<T: Element>(
        &self,
        spec: Spec,
        shape: Shape,
        avg: Option<Range<usize>>,
        send: Vec<T>,
        recv: Vec<T>,
    ) -> Result<Persistent<T>> {
        let call = self.prepare(spec)?;
        // Every run takes a number of its own: a reservation this handle
        // may carry is for one call, not for all of them.
        let mut comm = self.clone();
        comm.reserved_seq = None;
        Ok(Persistent {
            comm,
            fixed: Arc::new(Fixed { call, shape, avg }),
            bufs: Some(Buffers { send, recv }),
            pending: None,
        })
    }

    /// The whole of a buffer of `len` elements as input and output.
    fn whole(len: usize) -> Shape {
        Shape::InPlace {
            input: 0..len,
            output: 0..len,
        }
    }

    /// Persistent [`Communicator::all_reduce_in_place`] over `buf`
    /// (MPI_Allreduce_init with MPI_IN_PLACE): resolved and planned now,
    /// run by [`Persistent::start`] or [`Persistent::run`].
    pub fn all_reduce_init<T: Element>(&self, buf: Vec<T>, op: ReduceOp) -> Result<Persistent<T>> {
        let len = buf.len();
        let spec = Spec::new(Collective::AllReduce, T::DTYPE, len)
            .op(op)
            .in_place();
        let avg = (op == ReduceOp::Avg).then_some(0..len);
        self.persistent(spec, Self::whole(len), avg, Vec::new(), buf)
    }

    /// Persistent [`Communicator::broadcast_in_place`] over `buf`.
    pub fn broadcast_init<T: Element>(&self, buf: Vec<T>, root: usize) -> Result<Persistent<T>> {
        self.check_root("broadcast_init", root)?;
        let len = buf.len();
        let spec = Spec::new(Collective::Broadcast, T::DTYPE, len)
            .root(root)
            .in_place();
        self.persistent(spec, Self::whole(len), None, Vec::new(), buf)
    }

    /// Persistent [`Communicator::reduce_in_place`] over `buf`.
    pub fn reduce_init<T: Element>(
        &self,
        buf: Vec<T>,
        op: ReduceOp,
        root: usize,
    ) -> Result<Persistent<T>> {
        self.check_root("reduce_init", root)?;
        let len = buf.len();
        let is_root = self.rank() == root;
        let spec = Spec::new(Collective::Reduce, T::DTYPE, len)
            .op(op)
            .root(root)
            .in_place();
        // Other ranks' plans never write the output: it is empty for them.
        let out = if is_root { len } else { 0 };
        let shape = Shape::InPlace {
            input: 0..len,
            output: 0..out,
        };
        let avg = (op == ReduceOp::Avg && is_root).then_some(0..len);
        self.persistent(spec, shape, avg, Vec::new(), buf)
    }

    /// Persistent [`Communicator::all_gather`] of `send`; the output
    /// ([`Persistent::recv`]) holds `size()` blocks of its length.
    pub fn all_gather_init<T: Element>(&self, send: Vec<T>) -> Result<Persistent<T>> {
        let (len, n) = (send.len(), self.size());
        let spec = Spec::new(Collective::AllGather, T::DTYPE, len);
        let shape = Shape::Separate {
            send: len,
            recv: n * len,
        };
        self.persistent(spec, shape, None, send, vec![T::zeroed(); n * len])
    }

    /// Persistent [`Communicator::reduce_scatter`] of `send` (`size()`
    /// blocks); the output ([`Persistent::recv`]) is this rank's reduced
    /// block.
    pub fn reduce_scatter_init<T: Element>(
        &self,
        send: Vec<T>,
        op: ReduceOp,
    ) -> Result<Persistent<T>> {
        let (len, n) = (send.len(), self.size());
        if len % n != 0 {
            return Err(Error::invalid(format!(
                "reduce_scatter_init: send has {len} elements, not a multiple of size() = {n}"
            )));
        }
        let c = len / n;
        let spec = Spec::new(Collective::ReduceScatter, T::DTYPE, c).op(op);
        let shape = Shape::Separate { send: len, recv: c };
        let avg = (op == ReduceOp::Avg).then_some(0..c);
        self.persistent(spec, shape, avg, send, vec![T::zeroed(); c])
    }

    /// Persistent [`Communicator::all_to_all`] of `send` (`size()` blocks);
    /// the output ([`Persistent::recv`]) has the same length.
    pub fn all_to_all_init<T: Element>(&self, send: Vec<T>) -> Result<Persistent<T>> {
        let (len, n) = (send.len(), self.size());
        if len % n != 0 {
            return Err(Error::invalid(format!(
                "all_to_all_init: send has {len} elements, not a multiple of size() = {n}"
            )));
        }
        let spec = Spec::new(Collective::AllToAll, T::DTYPE, len / n);
        let shape = Shape::Separate {
            send: len,
            recv: len,
        };
        self.persistent(spec, shape, None, send, vec![T::zeroed(); len])
    }

    /// Persistent [`Communicator::gather`] of `send` to `root`; the output
    /// ([`Persistent::recv`]) holds `size()` blocks on the root and is empty
    /// elsewhere.
    pub fn gather_init<T: Element>(&self, send: Vec<T>, root: usize) -> Result<Persistent<T>> {
        self.check_root("gather_init", root)?;
        let len = send.len();
        let out = if self.rank() == root {
            len * self.size()
        } else {
            0
        };
        let spec = Spec::new(Collective::Gather, T::DTYPE, len).root(root);
        let shape = Shape::Separate {
            send: len,
            recv: out,
        };
        self.persistent(spec, shape, None, send, vec![T::zeroed(); out])
    }

    /// Persistent [`Communicator::scatter`] of blocks of `count` elements
    /// from the root's `send` (`size()` blocks there; read on the root only);
    /// the output ([`Persistent::recv`]) is this rank's block.
    pub fn scatter_init<T: Element>(
        &self,
        send: Vec<T>,
        count: usize,
        root: usize,
    ) -> Result<Persistent<T>> {
        self.check_root("scatter_init", root)?;
        let (n, is_root) = (self.size(), self.rank() == root);
        if is_root && send.len() != n * count {
            return Err(len_error(
                "scatter_init",
                "send on the root",
                send.len(),
                n * count,
                "size() times count",
            ));
        }
        let spec = Spec::new(Collective::Scatter, T::DTYPE, count).root(root);
        // Non-roots never read the input: it is empty for them.
        let shape = Shape::Separate {
            send: if is_root { send.len() } else { 0 },
            recv: count,
        };
        self.persistent(spec, shape, None, send, vec![T::zeroed(); count])
    }

    /// Persistent [`Communicator::barrier`] (its buffers are empty).
    pub fn barrier_init(&self) -> Result<Persistent<u8>> {
        let spec = Spec::new(Collective::Barrier, DType::U8, 0);
        let shape = Shape::Separate { send: 0, recv: 0 };
        self.persistent(spec, shape, None, Vec::new(), Vec::new())
    }
}
