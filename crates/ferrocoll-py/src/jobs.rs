//! One collective call described by addresses and counts, as the Python
//! layer hands it over, and its execution on a [`Communicator`].
//!
//! The Python side owns the buffers (numpy arrays, torch tensors) and keeps
//! them alive and untouched until the call's handle completes; this module
//! turns the addresses back into slices for exactly that time.

use std::ops::Range;

use ferrocoll::{bf16, f16, Communicator, DType, Element, Error, ReduceOp, Result};

/// A buffer: its address and its length in elements of the call's type.
#[derive(Clone, Copy, Debug)]
pub struct Buf {
    pub addr: usize,
    pub len: usize,
}

impl Buf {
    fn bytes(&self, dtype: DType) -> Range<usize> {
        self.addr..self.addr + self.len * dtype.size()
    }
}

/// What to do.
#[derive(Clone, Debug)]
pub enum Kind {
    AllReduce {
        send: Buf,
        recv: Buf,
        op: ReduceOp,
    },
    Broadcast {
        buf: Buf,
        root: usize,
    },
    Reduce {
        send: Buf,
        recv: Buf,
        op: ReduceOp,
        root: usize,
    },
    AllGather {
        send: Buf,
        recv: Buf,
    },
    ReduceScatter {
        send: Buf,
        recv: Buf,
        op: ReduceOp,
    },
    AllToAll {
        send: Buf,
        recv: Buf,
    },
    AllToAllV {
        send: Buf,
        send_counts: Vec<usize>,
        recv: Buf,
        recv_counts: Vec<usize>,
    },
    Gather {
        send: Buf,
        recv: Buf,
        root: usize,
    },
    Scatter {
        send: Buf,
        recv: Buf,
        root: usize,
    },
    Barrier,
    Send {
        buf: Buf,
        peer: usize,
        tag: u32,
    },
    Recv {
        buf: Buf,
        peer: usize,
        tag: u32,
    },
    /// A receive from whichever rank sends first; the sender's rank is
    /// written to the `i64` at address `source`, which the caller holds.
    RecvAny {
        buf: Buf,
        tag: u32,
        source: usize,
    },
}

/// A call: what, over which element type, and what to do after it.
#[derive(Clone, Debug)]
pub struct Job {
    pub kind: Kind,
    pub dtype: DType,
    /// Multiply the result by this factor (torch's `PREMUL_SUM`: the sum of
    /// `factor * x` over ranks is `factor` times the sum).
    pub scale: Option<f64>,
    /// Copies after the call, `(from, to, bytes)`: the Python side gathers
    /// into one staging buffer and scatters it into a list of tensors here,
    /// without the GIL.
    pub copies: Vec<(usize, usize, usize)>,
}

impl Job {
    /// Whether this is a point-to-point call (those may wait on each other,
    /// so they do not queue behind one worker).
    pub fn is_p2p(&self) -> bool {
        matches!(
            self.kind,
            Kind::Send { .. } | Kind::Recv { .. } | Kind::RecvAny { .. }
        )
    }

    /// Checks what the slices made later rely on: aligned addresses, and
    /// output buffers that do not partly overlap inputs.
    pub fn check(&self, rank: usize, size: usize) -> Result<()> {
        let align = self.dtype.size();
        let mut bufs: Vec<(Buf, bool)> = Vec::new();
        match &self.kind {
            Kind::AllReduce { send, recv, .. }
            | Kind::Reduce { send, recv, .. }
            | Kind::AllGather { send, recv }
            | Kind::ReduceScatter { send, recv, .. }
            | Kind::AllToAll { send, recv }
            | Kind::AllToAllV { send, recv, .. }
            | Kind::Gather { send, recv, .. }
            | Kind::Scatter { send, recv, .. } => {
                bufs.push((*send, false));
                bufs.push((*recv, true));
            }
            Kind::Broadcast { buf, .. } | Kind::Recv { buf, .. } => bufs.push((*buf, true)),
            Kind::RecvAny { buf, source, .. } => {
                if *source == 0 || *source % 8 != 0 {
                    return Err(Error::invalid(
                        "recv_any: the source cell must be an aligned 8-byte integer",
                    ));
                }
                bufs.push((*buf, true));
            }
            Kind::Send { buf, .. } => bufs.push((*buf, false)),
            Kind::Barrier => {}
        }
        for (b, _) in &bufs {
            if b.len > 0 && (b.addr == 0 || b.addr % align != 0) {
                return Err(Error::invalid(format!(
                    "a buffer at address {:#x} is not aligned to its {}-byte elements ({}); \
                     copy it into an aligned array first",
                    b.addr,
                    align,
                    self.dtype.name()
                )));
            }
        }
        if let [(send, false), (recv, true)] = bufs[..] {
            let (s, r) = (send.bytes(self.dtype), recv.bytes(self.dtype));
            let overlap = s.start < r.end && r.start < s.end && send.len > 0 && recv.len > 0;
            if overlap && !self.in_place(rank, size) {
                return Err(Error::invalid(format!(
                    "{}: the input and output buffers overlap but are not the in-place layout \
                     (the same buffer, or for allgather / reduce-scatter the input being this \
                     rank's block of the output / the output this rank's block of the input); \
                     use separate buffers",
                    self.name()
                )));
            }
        }
        Ok(())
    }

    /// The name of the call, for messages.
    pub fn name(&self) -> &'static str {
        match self.kind {
            Kind::AllReduce { .. } => "all_reduce",
            Kind::Broadcast { .. } => "broadcast",
            Kind::Reduce { .. } => "reduce",
            Kind::AllGather { .. } => "all_gather",
            Kind::ReduceScatter { .. } => "reduce_scatter",
            Kind::AllToAll { .. } => "all_to_all",
            Kind::AllToAllV { .. } => "all_to_all_v",
            Kind::Gather { .. } => "gather",
            Kind::Scatter { .. } => "scatter",
            Kind::Barrier => "barrier",
            Kind::Send { .. } => "send",
            Kind::Recv { .. } => "recv",
            Kind::RecvAny { .. } => "recv_any",
        }
    }

    /// Whether the buffers are this rank's in-place layout: the same buffer
    /// (allreduce, reduce), the input this rank's block of the output
    /// (allgather), the output this rank's block of the input
    /// (reduce-scatter).
    fn in_place(&self, rank: usize, size: usize) -> bool {
        let elem = self.dtype.size();
        match self.kind {
            Kind::AllReduce { send, recv, .. } | Kind::Reduce { send, recv, .. } => {
                send.len > 0 && send.addr == recv.addr && send.len == recv.len
            }
            Kind::AllGather { send, recv } => {
                send.len > 0
                    && send.addr == recv.addr + rank * send.len * elem
                    && recv.len == send.len * size
            }
            Kind::ReduceScatter { send, recv, .. } => {
                recv.len > 0
                    && recv.addr == send.addr + rank * recv.len * elem
                    && send.len == recv.len * size
            }
            _ => false,
        }
    }

    /// Runs the call on `comm` (a handle reserved for it, or the
    /// communicator itself), then the scale and the copies.
    ///
    /// # Safety
    /// Every address must point to live memory of the given length that
    /// nothing else reads or writes until this returns (what the Python
    /// layer guarantees by holding the arrays and documenting that they must
    /// not be touched before `wait()`); [`Job::check`] must have passed.
    pub unsafe fn run(&self, comm: &Communicator) -> Result<()> {
        match self.dtype {
            DType::F32 => self.run_typed::<f32>(comm),
            DType::F64 => self.run_typed::<f64>(comm),
            DType::F16 => self.run_typed::<f16>(comm),
            DType::BF16 => self.run_typed::<bf16>(comm),
            DType::I8 => self.run_typed::<i8>(comm),
            DType::I32 => self.run_typed::<i32>(comm),
            DType::I64 => self.run_typed::<i64>(comm),
            DType::U8 => self.run_typed::<u8>(comm),
            DType::U32 => self.run_typed::<u32>(comm),
            DType::U64 => self.run_typed::<u64>(comm),
        }
    }

    unsafe fn run_typed<T: Element + Scale>(&self, comm: &Communicator) -> Result<()> {
        // SAFETY (for every `read`/`write` below): the caller guarantees the
        // memory is live, exclusively ours and of the given length, and
        // `check` verified alignment and that distinct views do not overlap;
        // where views overlap (in place) one mutable slice is made.
        let read = |b: Buf| -> &[T] {
            if b.len == 0 {
                &[]
            } else {
                std::slice::from_raw_parts(b.addr as *const T, b.len)
            }
        };
        let write = |b: Buf| -> &mut [T] {
            if b.len == 0 {
                &mut []
            } else {
                std::slice::from_raw_parts_mut(b.addr as *mut T, b.len)
            }
        };
        let in_place = self.in_place(comm.rank(), comm.size());
        let mut scaled: Option<Buf> = None;
        match &self.kind {
            &Kind::AllReduce { send, recv, op } => {
                if in_place {
                    comm.all_reduce_in_place(write(recv), op)?;
                } else {
                    comm.all_reduce(read(send), write(recv), op)?;
                }
                scaled = Some(recv);
            }
            &Kind::Broadcast { buf, root } => comm.broadcast_in_place(write(buf), root)?,
            &Kind::Reduce {
                send,
                recv,
                op,
                root,
            } => {
                if in_place {
                    comm.reduce_in_place(write(recv), op, root)?;
                } else {
                    comm.reduce(read(send), write(recv), op, root)?;
                }
                if comm.rank() == root {
                    scaled = Some(recv);
                }
            }
            &Kind::AllGather { send, recv } => {
                if in_place {
                    comm.all_gather_in_place(write(recv))?;
                } else {
                    comm.all_gather(read(send), write(recv))?;
                }
            }
            &Kind::ReduceScatter { send, recv, op } => {
                if in_place {
                    comm.reduce_scatter_in_place(write(send), op)?;
                } else {
                    comm.reduce_scatter(read(send), write(recv), op)?;
                }
                scaled = Some(recv);
            }
            &Kind::AllToAll { send, recv } => comm.all_to_all(read(send), write(recv))?,
            Kind::AllToAllV {
                send,
                send_counts,
                recv,
                recv_counts,
            } => comm.all_to_all_v(read(*send), send_counts, write(*recv), recv_counts)?,
            &Kind::Gather { send, recv, root } => comm.gather(read(send), write(recv), root)?,
            &Kind::Scatter { send, recv, root } => comm.scatter(read(send), write(recv), root)?,
            Kind::Barrier => comm.barrier()?,
            &Kind::Send { buf, peer, tag } => comm.send(read(buf), peer, tag)?,
            &Kind::Recv { buf, peer, tag } => comm.recv(write(buf), peer, tag)?,
            &Kind::RecvAny { buf, tag, source } => {
                let from = comm.recv_any(write(buf), tag)?;
                // SAFETY: `check` verified the cell is non-null and aligned;
                // the Python layer holds it (an 8-byte integer) until the
                // call completes, and nothing else writes it meanwhile.
                unsafe { *(source as *mut i64) = from as i64 };
            }
        }
        if let (Some(factor), Some(out)) = (self.scale, scaled) {
            T::scale(write(out), factor);
        }
        for &(from, to, bytes) in &self.copies {
            if bytes > 0 {
                // SAFETY: the Python layer made both ranges (a staging
                // buffer it holds and tensors it holds), distinct.
                std::ptr::copy_nonoverlapping(from as *const u8, to as *mut u8, bytes);
            }
        }
        Ok(())
    }
}

/// Multiplying a result by a factor (for `PREMUL_SUM`), in the element's
/// own arithmetic.
pub trait Scale: Sized {
    /// `x *= factor` for every element.
    fn scale(xs: &mut [Self], factor: f64);
}

macro_rules! scale_float {
    ($($t:ty),*) => {$(
        impl Scale for $t {
            fn scale(xs: &mut [Self], factor: f64) {
                let f = factor as $t;
                xs.iter_mut().for_each(|x| *x *= f);
            }
        }
    )*};
}
scale_float!(f32, f64);

macro_rules! scale_half {
    ($($t:ty),*) => {$(
        impl Scale for $t {
            fn scale(xs: &mut [Self], factor: f64) {
                let f = factor as f32;
                xs.iter_mut().for_each(|x| *x = <$t>::from_f32(x.to_f32() * f));
            }
        }
    )*};
}
scale_half!(f16, bf16);

macro_rules! scale_int {
    ($($t:ty),*) => {$(
        impl Scale for $t {
            fn scale(xs: &mut [Self], factor: f64) {
                xs.iter_mut().for_each(|x| *x = (*x as f64 * factor) as $t);
            }
        }
    )*};
}
scale_int!(i8, i32, i64, u8, u32, u64);
