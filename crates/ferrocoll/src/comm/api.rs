//! The typed blocking collectives and send/recv: each checks its
//! arguments (errors that say what to fix), describes the call as a `Spec`
//! and its buffers as an [`exec::Memory`](crate::exec::Memory), and hands
//! both to the call runner (`call.rs`).

use super::call::{single_op_plan, Spec};
use super::Communicator;
use crate::error::{Error, Result};
use crate::exec::Memory;
use crate::kernels;
use crate::plan::{Collective, Op, Span};
use crate::transport::{CallKind, Header, Signature};
use crate::types::{DType, Element, ReduceOp};

fn bytes_mut<T: Element>(s: &mut [T]) -> &mut [u8] {
    bytemuck::cast_slice_mut(s)
}

pub(super) fn len_error(call: &str, what: &str, got: usize, want: usize, why: &str) -> Error {
    Error::invalid(format!(
        "{call}: {what} has {got} elements but must have {want} ({why})"
    ))
}

impl Communicator {
    pub(super) fn check_root(&self, call: &str, root: usize) -> Result<()> {
        if root >= self.size() {
            return Err(Error::invalid(format!(
                "{call}: root {root} is not a rank of this communicator; use 0..{}",
                self.size()
            )));
        }
        Ok(())
    }

    /// Divides the result of an `Avg` reduction by the group size.
    fn finish_avg<T: Element>(&self, op: ReduceOp, result: &mut [T]) {
        if op == ReduceOp::Avg {
            kernels::divide(T::DTYPE, bytes_mut(result), self.size());
        }
    }

    // ---- allreduce -------------------------------------------------------

    /// Every rank gets `op` over every rank's `send`, in `recv`.
    /// `send` and `recv` must have the same length on every rank.
    ///
    /// With `FERROCOLL_COMPRESS` (or [`crate::CallOptions::compress`]) an
    /// f32 sum or average may run compressed, an approximation of the
    /// result (see [`crate::compress::CompressSetting`]).
    pub fn all_reduce<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        if recv.len() != send.len() {
            return Err(len_error(
                "all_reduce",
                "recv",
                recv.len(),
                send.len(),
                "the length of send",
            ));
        }
        if let Some(codec) = self.compresses(T::DTYPE, send.len(), op)? {
            let (send, recv) = (bytemuck::cast_slice(send), bytemuck::cast_slice_mut(recv));
            return self.all_reduce_compressed(&codec, Some(send), recv, op);
        }
        let spec = Spec::new(Collective::AllReduce, T::DTYPE, send.len()).op(op);
        self.run(spec, Memory::separate(send, recv))?;
        self.finish_avg(op, recv);
        Ok(())
    }

    /// In-place allreduce: `buf` is replaced by `op` over every rank's `buf`.
    pub fn all_reduce_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        if let Some(codec) = self.compresses(T::DTYPE, buf.len(), op)? {
            return self.all_reduce_compressed(&codec, None, bytemuck::cast_slice_mut(buf), op);
        }
        let spec = Spec::new(Collective::AllReduce, T::DTYPE, buf.len())
            .op(op)
            .in_place();
        let len = buf.len();
        self.run(spec, Memory::in_place(buf, 0..len, 0..len))?;
        self.finish_avg(op, buf);
        Ok(())
    }

    // ---- broadcast -------------------------------------------------------

    /// Copies the root's `send` into every rank's `recv`. `send` is read only
    /// on the root (other ranks may pass an empty slice); `recv` must have the
    /// same length on every rank.
    pub fn broadcast<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        self.check_root("broadcast", root)?;
        let count = recv.len();
        if self.rank() == root && send.len() != count {
            return Err(len_error(
                "broadcast",
                "send on the root",
                send.len(),
                count,
                "the length of recv",
            ));
        }
        // Non-roots' plans never read the input: it is empty for them.
        let send = root_only(self.rank() == root, send);
        let spec = Spec::new(Collective::Broadcast, T::DTYPE, count).root(root);
        self.run(spec, Memory::separate(send, recv))
    }

    /// In-place broadcast: every rank's `buf` becomes the root's `buf`.
    pub fn broadcast_in_place<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        self.check_root("broadcast_in_place", root)?;
        let spec = Spec::new(Collective::Broadcast, T::DTYPE, buf.len())
            .root(root)
            .in_place();
        let len = buf.len();
        self.run(spec, Memory::in_place(buf, 0..len, 0..len))
    }

    // ---- reduce ------------------------------------------------------------

    /// The root gets `op` over every rank's `send` in `recv`. `recv` is used
    /// only on the root (others may pass an empty slice) and must there have
    /// the length of `send`.
    pub fn reduce<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        self.check_root("reduce", root)?;
        let is_root = self.rank() == root;
        if is_root && recv.len() != send.len() {
            return Err(len_error(
                "reduce",
                "recv on the root",
                recv.len(),
                send.len(),
                "the length of send",
            ));
        }
        let spec = Spec::new(Collective::Reduce, T::DTYPE, send.len())
            .op(op)
            .root(root);
        // Non-roots' plans never touch the output: it is empty for them.
        self.run(spec, Memory::separate(send, root_only_mut(is_root, recv)))?;
        if is_root {
            self.finish_avg(op, recv);
        }
        Ok(())
    }

    /// In-place reduce: the root's `buf` becomes `op` over every rank's
    /// `buf`; other ranks' `buf` is left unchanged.
    pub fn reduce_in_place<T: Element>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        self.check_root("reduce_in_place", root)?;
        let is_root = self.rank() == root;
        let spec = Spec::new(Collective::Reduce, T::DTYPE, buf.len())
            .op(op)
            .root(root)
            .in_place();
        // Other ranks' plans never write the output: it is empty for them.
        let (len, out) = (buf.len(), if is_root { buf.len() } else { 0 });
        self.run(spec, Memory::in_place(buf, 0..len, 0..out))?;
        if is_root {
            self.finish_avg(op, buf);
        }
        Ok(())
    }

    // ---- allgather -------------------------------------------------------

    /// Every rank gets every rank's `send`, concatenated in rank order, in
    /// `recv` (`size()` times the length of `send`).
    pub fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let n = self.size();
        if recv.len() != n * send.len() {
            return Err(len_error(
                "all_gather",
                "recv",
                recv.len(),
                n * send.len(),
                "size() times the length of send",
            ));
        }
        let spec = Spec::new(Collective::AllGather, T::DTYPE, send.len());
        self.run(spec, Memory::separate(send, recv))
    }

    /// In-place allgather: `buf` holds `size()` blocks; this rank's block
    /// (block `rank()`) is its contribution, and on return every block is
    /// filled.
    pub fn all_gather_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        let n = self.size();
        if buf.len() % n != 0 {
            return Err(Error::invalid(format!(
                "all_gather_in_place: buf has {} elements, not a multiple of size() = {n}",
                buf.len()
            )));
        }
        let c = buf.len() / n;
        let spec = Spec::new(Collective::AllGather, T::DTYPE, c).in_place();
        let r = self.rank();
        let len = buf.len();
        self.run(spec, Memory::in_place(buf, r * c..(r + 1) * c, 0..len))
    }

    // ---- reduce-scatter ----------------------------------------------------

    /// Rank r gets block r of `op` over every rank's `send`: `send` holds
    /// `size()` blocks of the length of `recv`.
    pub fn reduce_scatter<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        let n = self.size();
        if send.len() != n * recv.len() {
            return Err(len_error(
                "reduce_scatter",
                "send",
                send.len(),
                n * recv.len(),
                "size() times the length of recv",
            ));
        }
        let spec = Spec::new(Collective::ReduceScatter, T::DTYPE, recv.len()).op(op);
        self.run(spec, Memory::separate(send, recv))?;
        self.finish_avg(op, recv);
        Ok(())
    }

    /// In-place reduce-scatter: `buf` holds `size()` blocks; on return block
    /// `rank()` holds the reduced block (the rest of `buf` is unspecified).
    pub fn reduce_scatter_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let n = self.size();
        if buf.len() % n != 0 {
            return Err(Error::invalid(format!(
                "reduce_scatter_in_place: buf has {} elements, not a multiple of size() = {n}",
                buf.len()
            )));
        }
        let c = buf.len() / n;
        let r = self.rank();
        let spec = Spec::new(Collective::ReduceScatter, T::DTYPE, c)
            .op(op)
            .in_place();
        let len = buf.len();
        self.run(spec, Memory::in_place(buf, 0..len, r * c..(r + 1) * c))?;
        self.finish_avg(op, &mut buf[r * c..(r + 1) * c]);
        Ok(())
    }

    // ---- all-to-all --------------------------------------------------------

    /// Rank r sends block p of `send` to rank p and receives rank p's block r
    /// into block p of `recv`. Both hold `size()` equal blocks.
    pub fn all_to_all<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let n = self.size();
        if send.len() % n != 0 {
            return Err(Error::invalid(format!(
                "all_to_all: send has {} elements, not a multiple of size() = {n}",
                send.len()
            )));
        }
        if recv.len() != send.len() {
            return Err(len_error(
                "all_to_all",
                "recv",
                recv.len(),
                send.len(),
                "the length of send",
            ));
        }
        let spec = Spec::new(Collective::AllToAll, T::DTYPE, send.len() / n);
        self.run(spec, Memory::separate(send, recv))
    }

    /// All-to-all with per-peer counts: `send` holds `send_counts[p]`
    /// elements for each rank p, packed in rank order; `recv` receives
    /// `recv_counts[p]` elements from each rank p, packed in rank order.
    /// Rank p's `send_counts[r]` must equal rank r's `recv_counts[p]`.
    pub fn all_to_all_v<T: Element>(
        &self,
        send: &[T],
        send_counts: &[usize],
        recv: &mut [T],
        recv_counts: &[usize],
    ) -> Result<()> {
        let n = self.size();
        let r = self.rank();
        for (name, counts) in [("send_counts", send_counts), ("recv_counts", recv_counts)] {
            if counts.len() != n {
                return Err(Error::invalid(format!(
                    "all_to_all_v: {name} has {} entries but needs one per rank ({n})",
                    counts.len()
                )));
            }
        }
        let (s_total, r_total): (usize, usize) =
            (send_counts.iter().sum(), recv_counts.iter().sum());
        if send.len() != s_total {
            return Err(len_error(
                "all_to_all_v",
                "send",
                send.len(),
                s_total,
                "the sum of send_counts",
            ));
        }
        if recv.len() != r_total {
            return Err(len_error(
                "all_to_all_v",
                "recv",
                recv.len(),
                r_total,
                "the sum of recv_counts",
            ));
        }
        if send_counts[r] != recv_counts[r] {
            return Err(Error::invalid(format!(
                "all_to_all_v: send_counts[{r}] = {} but recv_counts[{r}] = {}; what rank {r} sends itself must equal what it receives from itself",
                send_counts[r], recv_counts[r]
            )));
        }
        let mut spec = Spec::new(Collective::AllToAllV, T::DTYPE, 0);
        spec.send_counts = send_counts.to_vec();
        spec.recv_counts = recv_counts.to_vec();
        self.run(spec, Memory::separate(send, recv))
    }

    // ---- gather / scatter ------------------------------------------------

    /// The root gets every rank's `send`, concatenated in rank order, in
    /// `recv` (`size()` times the length of `send`; ignored elsewhere).
    pub fn gather<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        self.check_root("gather", root)?;
        let n = self.size();
        let is_root = self.rank() == root;
        if is_root && recv.len() != n * send.len() {
            return Err(len_error(
                "gather",
                "recv on the root",
                recv.len(),
                n * send.len(),
                "size() times the length of send",
            ));
        }
        let spec = Spec::new(Collective::Gather, T::DTYPE, send.len()).root(root);
        // Non-roots never touch the output: it is empty for them.
        self.run(spec, Memory::separate(send, root_only_mut(is_root, recv)))
    }

    /// Rank r gets block r of the root's `send` (`size()` blocks of the
    /// length of `recv`; ignored elsewhere) in `recv`.
    pub fn scatter<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        self.check_root("scatter", root)?;
        let n = self.size();
        let is_root = self.rank() == root;
        if is_root && send.len() != n * recv.len() {
            return Err(len_error(
                "scatter",
                "send on the root",
                send.len(),
                n * recv.len(),
                "size() times the length of recv",
            ));
        }
        let spec = Spec::new(Collective::Scatter, T::DTYPE, recv.len()).root(root);
        // Non-roots never read the input: it is empty for them.
        self.run(spec, Memory::separate(root_only(is_root, send), recv))
    }

    // ---- barrier -------------------------------------------------------------

    /// Returns once every rank has entered the barrier.
    pub fn barrier(&self) -> Result<()> {
        let spec = Spec::new(Collective::Barrier, DType::U8, 0);
        self.run(spec, Memory::none())
    }

    // ---- point to point --------------------------------------------------

    fn p2p_header_sig<T: Element>(
        &self,
        call: &str,
        peer: usize,
        tag: u32,
        len: usize,
    ) -> Result<(u64, Signature)> {
        if peer >= self.size() {
            return Err(Error::invalid(format!(
                "{call}: peer {peer} is not a rank of this communicator; use 0..{}",
                self.size()
            )));
        }
        if peer == self.rank() {
            return Err(Error::invalid(format!(
                "{call}: rank {peer} cannot {call} to itself (it would wait for itself); copy the data instead"
            )));
        }
        let sig = Signature {
            kind: CallKind::PointToPoint,
            dtype: T::DTYPE,
            op: None,
            count: len,
            root: None,
        };
        Ok((Header::P2P_BIT | u64::from(tag), sig))
    }

    /// Sends `data` to `peer` with `tag`; returns once the receiver has taken
    /// it (synchronous send: the matching `recv` must be posted). Messages
    /// with the same peer and tag arrive in order. The receiver must expect
    /// exactly `data.len()` elements of the same type.
    pub fn send<T: Element>(&self, data: &[T], peer: usize, tag: u32) -> Result<()> {
        let (seq, sig) = self.p2p_header_sig::<T>("send", peer, tag, data.len())?;
        let plan = single_op_plan(Op::Send {
            peer,
            src: Span::input(0, data.len()),
        });
        self.execute(
            &plan,
            &mut Memory::input_only(data),
            &sig,
            seq,
            ReduceOp::Sum,
        )
    }

    /// Receives exactly `buf.len()` elements with `tag` from whichever rank
    /// sends first, and returns that rank (MPI's `MPI_ANY_SOURCE`, torch's
    /// `recv(src=None)`). Messages of one sender still arrive in order.
    /// Every transport offers it (a custom one that does not fails with
    /// [`Error::InvalidArgument`]).
    pub fn recv_any<T: Element>(&self, buf: &mut [T], tag: u32) -> Result<usize> {
        if self.size() < 2 {
            return Err(Error::invalid(
                "recv_any: a communicator of one rank has nobody to receive from",
            ));
        }
        let sig = Signature {
            kind: CallKind::PointToPoint,
            dtype: T::DTYPE,
            op: None,
            count: buf.len(),
            root: None,
        };
        self.recv_any_bytes(
            &sig,
            Header::P2P_BIT | u64::from(tag),
            bytemuck::cast_slice_mut(buf),
        )
    }

    /// Receives exactly `buf.len()` elements from `peer` with `tag`.
    pub fn recv<T: Element>(&self, buf: &mut [T], peer: usize, tag: u32) -> Result<()> {
        let (seq, sig) = self.p2p_header_sig::<T>("recv", peer, tag, buf.len())?;
        let plan = single_op_plan(Op::Recv {
            peer,
            dst: Span::output(0, buf.len()),
        });
        self.execute(
            &plan,
            &mut Memory::output_only(buf),
            &sig,
            seq,
            ReduceOp::Sum,
        )
    }
}

/// `buf` on the rank that uses it, else its empty start: a buffer the
/// collective reads only on the root (broadcast's and scatter's input).
fn root_only<T>(is_root: bool, buf: &[T]) -> &[T] {
    if is_root {
        buf
    } else {
        &buf[..0]
    }
}

/// [`root_only`] for a buffer written only on the root (reduce's and
/// gather's output).
fn root_only_mut<T>(is_root: bool, buf: &mut [T]) -> &mut [T] {
    if is_root {
        buf
    } else {
        &mut buf[..0]
    }
}
