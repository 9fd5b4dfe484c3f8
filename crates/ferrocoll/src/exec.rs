//! The executor: runs any [`Plan`] over any [`Transport`].
//!
//! It resolves the plan's spans to memory, runs a round's local ops, then
//! hands the round's messages to the transport in one
//! [`Transport::exchange`] call. Incoming chunks are copied or reduced into
//! place as they arrive (the transport decides the chunking: the thread
//! transport hands over whole messages straight from the sender's memory).

use std::marker::PhantomData;
use std::ops::Range;
use std::ptr::{self, NonNull};
use std::time::Instant;

use crate::error::{Error, Result};
use crate::kernels;
use crate::plan::{Buf, Collective, Op, Plan, Span};
use crate::transport::{Header, Incoming, Outgoing, Sink, Transport};
use crate::types::{DType, Element, ReduceOp};

/// The caller's buffers for one call, borrowed for `'a`.
///
/// A `Memory` is built only from borrowed slices (the constructors below),
/// so it always describes live memory: `input` is valid for reads of
/// `input_len` bytes and `output` for reads and writes of `output_len` bytes
/// for `'a`, and nothing else touches them meanwhile (the `&'a mut` it holds
/// is exclusive). In place, `input` and `output` point into the same
/// allocation (see [`crate::plan::Layout`]), which is why it keeps raw
/// pointers rather than a `&[u8]` and a `&mut [u8]`: the executor needs views
/// of both at once, for spans a validated plan keeps apart.
///
/// Not `Clone`: a copy would be a second handle on the exclusive borrow.
/// Views ([`Memory::input`], [`Memory::output`], [`Memory::slice`]) borrow
/// the `Memory`, so the borrow checker keeps them from overlapping.
pub(crate) struct Memory<'a> {
    input: *const u8,
    input_len: usize,
    output: *mut u8,
    output_len: usize,
    /// Invariant in `'a`, as the `&'a mut` it stands for.
    _buffers: PhantomData<&'a mut [u8]>,
}

impl<'a> Memory<'a> {
    /// Separate input and output buffers (out of place).
    pub(crate) fn separate<T: Element>(input: &'a [T], output: &'a mut [T]) -> Memory<'a> {
        let input = as_bytes(input);
        let output = as_bytes_mut(output);
        Memory {
            input: input.as_ptr(),
            input_len: input.len(),
            output: output.as_mut_ptr(),
            output_len: output.len(),
            _buffers: PhantomData,
        }
    }

    /// One buffer holding both: the input is elements `input` of `buf`, the
    /// output elements `output` (the in-place layouts of
    /// [`crate::plan::Layout::in_place`]). Panics if a range is outside
    /// `buf` (the callers derive them from lengths they checked).
    pub(crate) fn in_place<T: Element>(
        buf: &'a mut [T],
        input: Range<usize>,
        output: Range<usize>,
    ) -> Memory<'a> {
        let size = std::mem::size_of::<T>();
        assert!(
            input.start <= input.end
                && input.end <= buf.len()
                && output.start <= output.end
                && output.end <= buf.len(),
            "in-place ranges {input:?} and {output:?} outside a buffer of {}",
            buf.len()
        );
        let base = as_bytes_mut(buf).as_mut_ptr();
        // SAFETY: both ranges lie within `buf` (asserted above), so the
        // offsets stay inside its allocation.
        let (input_at, output_at) =
            unsafe { (base.add(input.start * size), base.add(output.start * size)) };
        Memory {
            input: input_at.cast_const(),
            input_len: input.len() * size,
            output: output_at,
            output_len: output.len() * size,
            _buffers: PhantomData,
        }
    }

    /// An input buffer and no output (a send).
    pub(crate) fn input_only<T: Element>(input: &'a [T]) -> Memory<'a> {
        Memory::separate(input, &mut [] as &mut [T])
    }

    /// An output buffer and no input (a receive).
    pub(crate) fn output_only<T: Element>(output: &'a mut [T]) -> Memory<'a> {
        Memory::separate(&[] as &[T], output)
    }

    /// No buffers at all (a barrier).
    pub(crate) fn none() -> Memory<'static> {
        Memory::separate::<u8>(&[], &mut [])
    }

    /// The input, read-only. Borrows `self`, so no output view exists
    /// while it lives (in place they may overlap).
    pub(crate) fn input(&self) -> &[u8] {
        // SAFETY: the type's invariant: `input` is valid for reads of
        // `input_len` bytes for 'a, and `&self` excludes an output view.
        unsafe { std::slice::from_raw_parts(self.input, self.input_len) }
    }

    /// The output, writable. Borrows `self` mutably, so no other view
    /// exists while it lives.
    pub(crate) fn output(&mut self) -> &mut [u8] {
        // SAFETY: the type's invariant: `output` is valid for reads and
        // writes of `output_len` bytes for 'a, and `&mut self` excludes
        // every other view.
        unsafe { std::slice::from_raw_parts_mut(self.output, self.output_len) }
    }

    /// Both views at once, when the input and the output do not overlap
    /// (out of place, or in place with disjoint ranges); `None` when they
    /// do. Borrows `self` mutably, so no other view exists meanwhile.
    pub(crate) fn apart(&mut self) -> Option<(&[u8], &mut [u8])> {
        let (i, o) = (self.input as usize, self.output as usize);
        let disjoint = self.input_len == 0
            || self.output_len == 0
            || i + self.input_len <= o
            || o + self.output_len <= i;
        // SAFETY: the type's invariant makes both ranges valid for 'a (the
        // output for writes too); they do not overlap (checked above), and
        // `&mut self` excludes every other view while these live.
        disjoint.then(|| unsafe {
            (
                std::slice::from_raw_parts(self.input, self.input_len),
                std::slice::from_raw_parts_mut(self.output, self.output_len),
            )
        })
    }

    /// Bytes `offset..offset + len` of both buffers (a buffer this rank does
    /// not use, of length 0, stays empty), borrowing `self` for as long as
    /// the part is used.
    pub(crate) fn slice(&mut self, offset: usize, len: usize) -> Memory<'_> {
        let part = |base: *mut u8, bytes: usize| {
            if bytes == 0 {
                (base, 0)
            } else {
                assert!(offset + len <= bytes, "slice past the end of a buffer");
                // SAFETY: in bounds of the buffer, as asserted.
                (unsafe { base.add(offset) }, len)
            }
        };
        let (input, input_len) = part(self.input.cast_mut(), self.input_len);
        let (output, output_len) = part(self.output, self.output_len);
        Memory {
            input: input.cast_const(),
            input_len,
            output,
            output_len,
            _buffers: PhantomData,
        }
    }
}

fn as_bytes<T: Element>(s: &[T]) -> &[u8] {
    bytemuck::cast_slice(s)
}

fn as_bytes_mut<T: Element>(s: &mut [T]) -> &mut [u8] {
    bytemuck::cast_slice_mut(s)
}

/// How a call is cut into consecutive slices: `(first element, count)`.
///
/// Allreduce, broadcast and reduce treat every element independently, so a
/// large call can run as several whole collectives over consecutive pieces of
/// at most `slice_bytes` (0: never slice). Each piece's working set (input,
/// output and the neighbour's block being reduced) then stays in cache instead
/// of streaming the whole buffer from memory at every step of the algorithm;
/// the extra rounds cost little next to the bytes. Other collectives run
/// whole.
pub(crate) fn slices(
    coll: Collective,
    count: usize,
    elem: usize,
    slice_bytes: usize,
) -> Vec<(usize, usize)> {
    let elementwise = matches!(
        coll,
        Collective::AllReduce | Collective::Broadcast | Collective::Reduce
    );
    let per_slice = (slice_bytes / elem).max(1);
    if !elementwise || slice_bytes == 0 || count <= per_slice {
        return vec![(0, count)];
    }
    let n = count.div_ceil(per_slice);
    (0..n).map(|k| crate::plan::block(count, n, k)).collect()
}

/// Everything about one call that is not the plan.
pub(crate) struct Call<'a> {
    pub transport: &'a dyn Transport,
    /// Group rank -> transport rank.
    pub group: &'a [usize],
    pub header: Header,
    pub dtype: DType,
    pub op: ReduceOp,
    pub deadline: Instant,
    /// The communicator's count of payload bytes sent to other ranks
    /// (`Communicator::bytes_sent`).
    pub sent: &'a std::sync::atomic::AtomicU64,
}

/// Where a received message goes.
#[derive(Clone, Copy)]
enum Target {
    /// `dst = incoming`.
    Store { dst: *mut u8, len: usize },
    /// `dst = dst op incoming`.
    Accumulate { dst: *mut u8, len: usize },
    /// `dst = local op incoming`, `local` disjoint from `dst`.
    Combine {
        dst: *mut u8,
        local: *const u8,
        len: usize,
    },
}

/// A local op with its spans resolved to memory.
#[derive(Clone, Copy)]
enum Local {
    /// `dst = src`, disjoint (an in-place no-op is never resolved).
    Copy {
        dst: *mut u8,
        src: *const u8,
        len: usize,
    },
    /// `dst = a op b`; `a` is `dst` or disjoint from it, `b` disjoint.
    Reduce {
        dst: *mut u8,
        a: *const u8,
        b: *const u8,
        len: usize,
    },
}

impl Local {
    /// Splits the op after its first `bytes` bytes (a multiple of 8, so of
    /// every element size): the first piece, and the rest if any.
    fn split(self, bytes: usize) -> (Local, Option<Local>) {
        debug_assert!(bytes % 8 == 0 && bytes > 0);
        match self {
            Local::Copy { dst, src, len } if len > bytes => (
                Local::Copy {
                    dst,
                    src,
                    len: bytes,
                },
                Some(Local::Copy {
                    dst: dst.wrapping_add(bytes),
                    src: src.wrapping_add(bytes),
                    len: len - bytes,
                }),
            ),
            Local::Reduce { dst, a, b, len } if len > bytes => (
                Local::Reduce {
                    dst,
                    a,
                    b,
                    len: bytes,
                },
                Some(Local::Reduce {
                    dst: dst.wrapping_add(bytes),
                    a: a.wrapping_add(bytes),
                    b: b.wrapping_add(bytes),
                    len: len - bytes,
                }),
            ),
            whole => (whole, None),
        }
    }

    /// Runs the op.
    ///
    /// # Safety
    ///
    /// The pointers come from [`Resolver::locate`] (in bounds), the plan is
    /// validated (the operands relate as the variants say), and no message
    /// in flight touches these ranges: either none is in flight, or the op
    /// is one of the round's overlapped ones, which the validator keeps
    /// clear of every range the round's messages read or write.
    unsafe fn run(self, dtype: DType, op: ReduceOp) {
        match self {
            // SAFETY: see the function's contract.
            Local::Copy { dst, src, len } => unsafe { ptr::copy_nonoverlapping(src, dst, len) },
            Local::Reduce { dst, a, b, len } => {
                // SAFETY: see the function's contract.
                let (ds, bs) = unsafe {
                    (
                        std::slice::from_raw_parts_mut(dst, len),
                        std::slice::from_raw_parts(b, len),
                    )
                };
                if a == dst.cast_const() {
                    kernels::accumulate(dtype, op, ds, bs);
                } else {
                    // SAFETY: see the function's contract.
                    let as_ = unsafe { std::slice::from_raw_parts(a, len) };
                    kernels::combine(dtype, op, ds, as_, bs);
                }
            }
        }
    }
}

struct PlanSink {
    targets: Vec<Target>,
    dtype: DType,
    op: ReduceOp,
    /// The round's overlapped local ops not yet run.
    overlapped: Vec<Local>,
}

impl PlanSink {
    /// Runs the round's overlapped local ops that have not run yet.
    fn run_overlapped(&mut self) {
        for work in self.overlapped.drain(..) {
            // SAFETY: resolved by `Resolver::locate` from a validated plan's
            // overlapped op, which touches nothing the round's messages do.
            unsafe { work.run(self.dtype, self.op) };
        }
    }
}

impl Sink for PlanSink {
    fn overlap(&mut self) {
        self.run_overlapped();
    }

    fn overlap_some(&mut self, bytes: usize) -> bool {
        if self.overlapped.is_empty() {
            return false;
        }
        // In plan order, as `run_overlapped` runs them (a few ops a round).
        let (piece, rest) = self
            .overlapped
            .remove(0)
            .split(bytes.next_multiple_of(8).max(8));
        // SAFETY: as in `run_overlapped`: a piece of a resolved, validated
        // overlapped op touches a sub-range of what the op does.
        unsafe { piece.run(self.dtype, self.op) };
        if let Some(rest) = rest {
            self.overlapped.insert(0, rest);
        }
        !self.overlapped.is_empty()
    }

    fn deliver(&mut self, index: usize, offset: usize, chunk: &[u8]) {
        let target = self.targets[index];
        let (Target::Store { len, .. }
        | Target::Accumulate { len, .. }
        | Target::Combine { len, .. }) = target;
        assert!(
            offset + chunk.len() <= len,
            "transport delivered bytes past the end of a message"
        );
        let n = chunk.len();
        // SAFETY (all arms): `dst`/`local` were resolved from a span checked
        // against its buffer's bounds in `Resolver::locate`, and the assert
        // above keeps `offset..offset+n` inside it. A validated plan never
        // lets two in-flight ops of a round touch overlapping memory, so
        // nothing else reads or writes `dst` while we hold it, and `local` is
        // either exactly `dst` (handled as Accumulate) or disjoint from it.
        match target {
            Target::Store { dst, .. } => unsafe {
                ptr::copy_nonoverlapping(chunk.as_ptr(), dst.add(offset), n);
            },
            Target::Accumulate { dst, .. } => {
                let d = unsafe { std::slice::from_raw_parts_mut(dst.add(offset), n) };
                kernels::accumulate(self.dtype, self.op, d, chunk);
            }
            Target::Combine { dst, local, .. } => {
                let d = unsafe { std::slice::from_raw_parts_mut(dst.add(offset), n) };
                let l = unsafe { std::slice::from_raw_parts(local.add(offset), n) };
                kernels::combine(self.dtype, self.op, d, l, chunk);
            }
        }
    }

    fn destination(&mut self, index: usize, offset: usize, len: usize) -> Option<&mut [u8]> {
        let Target::Store { dst, len: total } = self.targets[index] else {
            return None;
        };
        assert!(
            offset + len <= total,
            "transport asked for bytes past the end of a message"
        );
        // SAFETY: as in `deliver`'s Store arm: `dst..dst + total` is the
        // receive's span, checked against its buffer in `Resolver::locate`,
        // which nothing else touches while the round is in flight; the
        // assert keeps `offset..offset + len` inside it. The slice borrows
        // `self`, so the transport holds it only while it holds the sink.
        Some(unsafe { std::slice::from_raw_parts_mut(dst.add(offset), len) })
    }
}

/// Turns spans into pointers, checking bounds.
struct Resolver<'m, 'a> {
    mem: &'m Memory<'a>,
    scratch: *mut u8,
    scratch_bytes: usize,
    elem: usize,
}

impl Resolver<'_, '_> {
    fn locate(&self, span: &Span) -> Result<(*mut u8, usize)> {
        let (base, limit) = match span.buf {
            Buf::Input => (self.mem.input.cast_mut(), self.mem.input_len),
            Buf::Output => (self.mem.output, self.mem.output_len),
            Buf::Scratch => (self.scratch, self.scratch_bytes),
        };
        let start = span.offset * self.elem;
        let len = span.len * self.elem;
        if start + len > limit {
            return Err(Error::Internal(format!(
                "{span:?} is outside its buffer ({limit} bytes)"
            )));
        }
        if len == 0 {
            return Ok((NonNull::<u8>::dangling().as_ptr(), 0));
        }
        // SAFETY: start + len <= limit, the length of the allocation `base`
        // points to (checked just above), so the offset stays in bounds.
        Ok((unsafe { base.add(start) }, len))
    }

    /// The local op `op` with its spans resolved (bounds checked), or `None`
    /// for a copy that is a no-op (in place, or empty) and for messages.
    /// The validated plan makes a copy's operands disjoint or identical,
    /// and a reduce's `b` disjoint from `dst` and `a` `dst` or disjoint.
    fn local(&self, op: &Op) -> Result<Option<Local>> {
        Ok(match op {
            Op::Copy { dst, src } => {
                let (d, len) = self.locate(dst)?;
                let (s, _) = self.locate(src)?;
                (d.cast_const() != s && len > 0).then_some(Local::Copy {
                    dst: d,
                    src: s,
                    len,
                })
            }
            Op::Reduce { dst, a, b } => {
                let (d, len) = self.locate(dst)?;
                let (pa, _) = self.locate(a)?;
                let (pb, _) = self.locate(b)?;
                Some(Local::Reduce {
                    dst: d,
                    a: pa,
                    b: pb,
                    len,
                })
            }
            _ => None,
        })
    }
}

/// Runs `plan` on `mem`, with `scratch` (grown as the plan needs) as its
/// scratch buffer.
///
/// # Why this is safe to call
///
/// `mem` describes live, exclusively borrowed buffers (the invariant of
/// [`Memory`]), and every span is checked against its buffer's bounds here
/// before it becomes a pointer. What this function trusts, and does not
/// check for speed, is that `plan` passes [`crate::plan::validate`] for
/// `mem`'s layout: no two in-flight ops of a round touch overlapping memory
/// (except a receive-reduce accumulating into its own local), and local ops
/// never overlap partly. The plans it runs are crate-internal: built by
/// [`crate::plan::build`], which the test suite validates for every
/// algorithm, group size and layout and the call runner validates again in
/// debug builds, or one-op send/receive plans. It is `pub(crate)` so that
/// no other plan can reach it.
pub(crate) fn execute(
    plan: &Plan,
    mem: &mut Memory<'_>,
    call: &Call<'_>,
    scratch: &mut Vec<u64>,
) -> Result<()> {
    let elem = call.dtype.size();
    // u64 backing keeps scratch aligned for every element type. Plans write
    // scratch before reading it, so reused memory needs no clearing.
    let words = (plan.scratch * elem).div_ceil(8);
    if scratch.len() < words {
        scratch.resize(words, 0);
    }
    let res = Resolver {
        mem: &*mem,
        scratch: scratch.as_mut_ptr().cast(),
        scratch_bytes: plan.scratch * elem,
        elem,
    };
    let mut sends: Vec<Outgoing<'_>> = Vec::new();
    let mut recvs: Vec<Incoming> = Vec::new();
    let mut sink = PlanSink {
        targets: Vec::new(),
        dtype: call.dtype,
        op: call.op,
        overlapped: Vec::new(),
    };
    for round in &plan.rounds {
        sends.clear();
        recvs.clear();
        sink.targets.clear();
        sink.overlapped.clear();
        // Local ops listed after a message run while the round's messages
        // are in flight (the transport calls `Sink::overlap`, or they run
        // once the exchange returns); those before run first.
        let mut in_flight = false;
        for op in &round.ops {
            match op {
                Op::Copy { .. } | Op::Reduce { .. } => {
                    if let Some(work) = res.local(op)? {
                        if in_flight {
                            sink.overlapped.push(work);
                        } else {
                            // SAFETY: resolved by `Resolver::local` from a
                            // validated plan, and nothing is in flight yet.
                            unsafe { work.run(call.dtype, call.op) };
                        }
                    }
                }
                Op::Send { peer, src } => {
                    in_flight = true;
                    let (s, len) = res.locate(src)?;
                    // SAFETY: in bounds (locate); a validated plan never
                    // writes this range while the round is in flight.
                    let data = unsafe { std::slice::from_raw_parts(s, len) };
                    sends.push(Outgoing {
                        peer: call.group[*peer],
                        data,
                    });
                }
                Op::Recv { peer, dst } => {
                    in_flight = true;
                    let (d, len) = res.locate(dst)?;
                    recvs.push(Incoming {
                        peer: call.group[*peer],
                        len,
                    });
                    sink.targets.push(Target::Store { dst: d, len });
                }
                Op::RecvReduce { peer, dst, local } => {
                    in_flight = true;
                    let (d, len) = res.locate(dst)?;
                    let (l, _) = res.locate(local)?;
                    recvs.push(Incoming {
                        peer: call.group[*peer],
                        len,
                    });
                    sink.targets.push(if l == d {
                        Target::Accumulate { dst: d, len }
                    } else {
                        Target::Combine {
                            dst: d,
                            local: l,
                            len,
                        }
                    });
                }
            }
        }
        if !sends.is_empty() || !recvs.is_empty() {
            let me = call.transport.rank();
            let bytes: usize = sends
                .iter()
                .filter(|s| s.peer != me)
                .map(|s| s.data.len())
                .sum();
            if bytes > 0 {
                call.sent
                    .fetch_add(bytes as u64, std::sync::atomic::Ordering::Relaxed);
            }
            call.transport
                .exchange(&call.header, &sends, &recvs, &mut sink, call.deadline)?;
        }
        sink.run_overlapped();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{Local, PlanSink};
    use crate::transport::Sink;
    use crate::types::{DType, ReduceOp};

    /// Overlapped work done in pieces of any size (a whole element or
    /// more) ends as the whole ops would: a copy and a reduction, in plan
    /// order, each longer than several pieces and not a multiple of them.
    #[test]
    fn overlapped_work_in_pieces_equals_the_whole() {
        let n = 1000;
        let src: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..n).map(|i| (3 * i) as f32).collect();
        for piece in [1, 8, 24, 4000, 1 << 20] {
            let mut copied = vec![0f32; n];
            let mut reduced: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
            let want: Vec<f32> = (0..n).map(|i| (i % 7) as f32 + b[i]).collect();
            let mut sink = PlanSink {
                targets: Vec::new(),
                dtype: DType::F32,
                op: ReduceOp::Sum,
                overlapped: vec![
                    Local::Copy {
                        dst: copied.as_mut_ptr().cast(),
                        src: src.as_ptr().cast(),
                        len: n * 4,
                    },
                    Local::Reduce {
                        dst: reduced.as_mut_ptr().cast(),
                        a: reduced.as_ptr().cast(),
                        b: b.as_ptr().cast(),
                        len: n * 4,
                    },
                ],
            };
            let mut turns = 1;
            while sink.overlap_some(piece) {
                turns += 1;
            }
            assert!(!sink.overlap_some(piece), "work left after the last piece");
            let pieces = 2 * (n * 4).div_ceil(piece.next_multiple_of(8));
            assert_eq!(turns, pieces, "pieces of {piece} B");
            assert_eq!(copied, src, "copy in pieces of {piece} B");
            assert_eq!(reduced, want, "reduction in pieces of {piece} B");
        }
    }
}
