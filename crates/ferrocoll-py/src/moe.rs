//! `MoeDispatcher`, `MoeHandle` and `Rows`: [`ferrocoll::moe`] over buffers
//! given by address, for `ferrocoll.torch.moe` (and numpy users).
//!
//! Inputs are `(address, elements)` pairs, as [`crate::Comm`]'s `submit`
//! takes them: the caller holds the arrays or tensors for the call's
//! duration (every call here blocks) and does not touch them meanwhile.
//! Outputs are sized by the exchange (a rank learns how many rows its
//! experts receive only from the count exchange), so each call returns
//! them in a [`Rows`], a buffer owned by Rust that numpy reads in place
//! through `__array_interface__` (`numpy.asarray(rows)`, then
//! `torch.from_numpy`): no copy, and the buffer lives as long as any array
//! over it. Every call releases the GIL while ferrocoll works.

use std::any::Any;
use std::str::FromStr;

use ferrocoll::moe::{Dispatcher, ExpertInputs, Handle, Policy, Schedule, Spec};
use ferrocoll::{bf16, f16, DType, Element};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::InvalidArgument;
use crate::{parse_dtype, py_err, Comm};

/// Dispatch and combine for one MoE layer shape on a communicator
/// (`ferrocoll::moe::Dispatcher`).
#[pyclass(module = "ferrocoll._ferrocoll", frozen)]
pub struct MoeDispatcher {
    inner: Dispatcher,
}

/// What a dispatch decided and what combine needs (`ferrocoll::moe::Handle`).
/// It holds no data rows: one handle serves every element type.
#[pyclass(module = "ferrocoll._ferrocoll", frozen)]
pub struct MoeHandle {
    inner: Handle,
}

/// A buffer of `rows x hidden` elements made by a call, owned here and
/// read in place by numpy (`__array_interface__`).
#[pyclass(module = "ferrocoll._ferrocoll", frozen)]
pub struct Rows {
    /// The `Vec<T>` whose memory `addr` points into; never touched again
    /// until dropped, so numpy may read and write it.
    _owner: Box<dyn Any + Send + Sync>,
    addr: usize,
    rows: usize,
    hidden: usize,
    dtype: DType,
}

impl Rows {
    fn new<T: Element>(v: Vec<T>, hidden: usize) -> Rows {
        let addr = v.as_ptr() as usize;
        let rows = v.len().checked_div(hidden).unwrap_or(0);
        Rows {
            _owner: Box::new(v),
            addr,
            rows,
            hidden,
            dtype: T::DTYPE,
        }
    }
}

#[pymethods]
impl Rows {
    /// Number of rows.
    #[getter]
    fn rows(&self) -> usize {
        self.rows
    }

    /// Elements per row.
    #[getter]
    fn hidden(&self) -> usize {
        self.hidden
    }

    /// The element type's name (`f32`, `bf16`, ...).
    #[getter]
    fn dtype(&self) -> &'static str {
        self.dtype.name()
    }

    /// numpy's array interface (version 3). bfloat16 has no numpy type
    /// string: its rows are shown as `int16`, the same bits (view them as
    /// `torch.bfloat16`, or `ml_dtypes.bfloat16`).
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let typestr = match self.dtype {
            DType::F32 => "<f4",
            DType::F64 => "<f8",
            DType::F16 => "<f2",
            DType::BF16 => "<i2",
            DType::I8 => "|i1",
            DType::U8 => "|u1",
            DType::I32 => "<i4",
            DType::I64 => "<i8",
            DType::U32 => "<u4",
            DType::U64 => "<u8",
        };
        let d = PyDict::new(py);
        d.set_item("version", 3)?;
        d.set_item("shape", (self.rows, self.hidden))?;
        d.set_item("typestr", typestr)?;
        d.set_item("data", (self.addr, false))?;
        Ok(d)
    }
}

/// The slice behind `(address, elements)`.
///
/// # Safety
/// For `len > 0` the address must point to `len` live, initialised `T`s
/// that nothing writes until the slice is dropped (the Python caller holds
/// the array and is blocked in the call); [`check_buf`] must have passed.
unsafe fn slice<'a, T>((addr, len): (usize, usize)) -> &'a [T] {
    if len == 0 {
        &[]
    } else {
        // SAFETY: as this function's contract says; `check_buf` verified
        // the address is non-null and aligned for `T`.
        unsafe { std::slice::from_raw_parts(addr as *const T, len) }
    }
}

/// Checks what [`slice`] relies on that can be checked: a non-null,
/// aligned address for a non-empty buffer.
fn check_buf((addr, len): (usize, usize), align: usize, what: &str) -> PyResult<()> {
    if len > 0 && (addr == 0 || addr % align != 0) {
        return Err(InvalidArgument::new_err(format!(
            "{what} at address {addr:#x} is not aligned to its {align}-byte elements; copy it \
             into a contiguous array first"
        )));
    }
    Ok(())
}

/// Runs `$body` with `$t` the Rust type of `$dtype`.
macro_rules! typed {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            DType::F32 => {
                type $t = f32;
                $body
            }
            DType::F64 => {
                type $t = f64;
                $body
            }
            DType::F16 => {
                type $t = f16;
                $body
            }
            DType::BF16 => {
                type $t = bf16;
                $body
            }
            DType::I8 => {
                type $t = i8;
                $body
            }
            DType::I32 => {
                type $t = i32;
                $body
            }
            DType::I64 => {
                type $t = i64;
                $body
            }
            DType::U8 => {
                type $t = u8;
                $body
            }
            DType::U32 => {
                type $t = u32;
                $body
            }
            DType::U64 => {
                type $t = u64;
                $body
            }
        }
    };
}

/// An [`ExpertInputs`] as Python gets it: the rows and each local expert's
/// row count.
fn inputs_out<T: Element>(inputs: ExpertInputs<T>) -> (Rows, Vec<usize>) {
    let counts = (0..inputs.local_experts())
        .map(|l| inputs.expert_rows(l))
        .collect();
    let hidden = inputs.hidden();
    (Rows::new(inputs.into_vec(), hidden), counts)
}

#[pymethods]
impl MoeDispatcher {
    /// A dispatcher on `comm` for `experts` experts (a multiple of the
    /// ranks; each holds experts/size, contiguous), rows of `hidden`
    /// elements and `topk` choices per token. `policy` is `drop` (each
    /// expert keeps at most ceil(P*T*k/E * capacity_factor) rows, GShard's
    /// priority) or `dropless`; it defaults to `drop` when a
    /// `capacity_factor` is given and to `dropless` otherwise. `schedule`:
    /// auto, flat, direct, pairwise, two-level or rail. Every rank builds
    /// one with the same arguments.
    #[new]
    #[pyo3(signature = (comm, experts, hidden, topk, capacity_factor=None, policy=None,
                        schedule="auto"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        comm: &Comm,
        experts: usize,
        hidden: usize,
        topk: usize,
        capacity_factor: Option<f64>,
        policy: Option<&str>,
        schedule: &str,
    ) -> PyResult<MoeDispatcher> {
        let policy =
            match (policy, capacity_factor) {
                (None | Some("drop"), Some(c)) => Policy::Drop { capacity_factor: c },
                (Some("drop"), None) => return Err(InvalidArgument::new_err(
                    "moe: policy `drop` needs a capacity_factor (1.0 sizes each expert for the \
                     uniform load, 1.25 is usual)",
                )),
                (None | Some("dropless"), None) => Policy::Dropless,
                (Some("dropless"), Some(c)) => {
                    return Err(InvalidArgument::new_err(format!(
                    "moe: policy `dropless` keeps every token; capacity_factor {c} would not be \
                     used (leave it out, or use policy `drop`)"
                )))
                }
                (Some(other), _) => {
                    return Err(InvalidArgument::new_err(format!(
                        "moe: unknown policy `{other}`; use drop or dropless"
                    )))
                }
            };
        let schedule = Schedule::from_str(schedule).map_err(|e| py_err(py, e))?;
        let spec = Spec::new(experts, hidden, topk, policy).with_schedule(schedule);
        let inner = Dispatcher::new(&comm.inner, spec).map_err(|e| py_err(py, e))?;
        Ok(MoeDispatcher { inner })
    }

    /// Experts on each rank (experts / size).
    #[getter]
    fn local_experts(&self) -> usize {
        self.inner.local_experts()
    }

    /// Sends every (token, choice) pair's row to its expert's rank.
    /// `x`: T rows of `hidden` elements of `dtype`; `topk_idx`: T*k
    /// `uint32` (or non-negative `int32`) expert indices; `topk_weights`:
    /// T*k `float32`. Returns `(rows, expert_rows, handle)`: the rows this
    /// rank's experts received (each local expert's rows contiguous, by
    /// source rank then token), how many each local expert got, and the
    /// handle combine needs. Collective.
    fn dispatch(
        &self,
        py: Python<'_>,
        x: (usize, usize),
        topk_idx: (usize, usize),
        topk_weights: (usize, usize),
        dtype: &str,
    ) -> PyResult<(Rows, Vec<usize>, MoeHandle)> {
        let dtype = parse_dtype(py, dtype)?;
        check_buf(x, dtype.size(), "x")?;
        check_buf(topk_idx, 4, "topk_idx")?;
        check_buf(topk_weights, 4, "topk_weights")?;
        let d = &self.inner;
        let out = py.detach(move || {
            typed!(dtype, T => {
                // SAFETY: the caller holds the three buffers, untouched,
                // until this blocking call returns; `check_buf` passed.
                let (x, idx, w) = unsafe {
                    (slice::<T>(x), slice::<u32>(topk_idx), slice::<f32>(topk_weights))
                };
                d.dispatch(x, idx, w).map(|(inputs, h)| (inputs_out(inputs), h))
            })
        });
        let ((rows, counts), handle) = out.map_err(|e| py_err(py, e))?;
        Ok((rows, counts, MoeHandle { inner: handle }))
    }

    /// Sends one row per (token, choice) pair, `pair_rows` (T*k rows, choice
    /// j of token t at row t*k + j), to the expert slot `handle`'s dispatch
    /// gave it; no count exchange. Returns `(rows, expert_rows)` laid out as
    /// dispatch's. Collective.
    fn dispatch_pairs(
        &self,
        py: Python<'_>,
        pair_rows: (usize, usize),
        handle: &MoeHandle,
        dtype: &str,
    ) -> PyResult<(Rows, Vec<usize>)> {
        let dtype = parse_dtype(py, dtype)?;
        check_buf(pair_rows, dtype.size(), "pair_rows")?;
        let (d, h) = (&self.inner, &handle.inner);
        py.detach(move || {
            typed!(dtype, T => {
                // SAFETY: the caller holds `pair_rows`, untouched, until this
                // blocking call returns; `check_buf` passed.
                let rows = unsafe { slice::<T>(pair_rows) };
                d.dispatch_pairs(rows, h).map(inputs_out)
            })
        })
        .map_err(|e| py_err(py, e))
    }

    /// Returns the experts' outputs (laid out as dispatch's rows) to their
    /// tokens and forms y_t = sum_j g_tj * out_tj with the dispatch's
    /// weights, accumulated wide. Returns T rows. Collective.
    fn combine(
        &self,
        py: Python<'_>,
        expert_outputs: (usize, usize),
        handle: &MoeHandle,
        dtype: &str,
    ) -> PyResult<Rows> {
        self.bring_back(py, expert_outputs, handle, dtype, false)
    }

    /// Returns the experts' outputs to their tokens unsummed and
    /// unweighted: T*k rows, row t*k + j the output for token t's choice j,
    /// zeros where it was dropped. Collective.
    fn combine_pairs(
        &self,
        py: Python<'_>,
        expert_outputs: (usize, usize),
        handle: &MoeHandle,
        dtype: &str,
    ) -> PyResult<Rows> {
        self.bring_back(py, expert_outputs, handle, dtype, true)
    }
}

impl MoeDispatcher {
    /// `combine` (`pairs` false) or `combine_pairs` (true): the experts'
    /// outputs back to their tokens, `hidden` wide rows.
    fn bring_back(
        &self,
        py: Python<'_>,
        expert_outputs: (usize, usize),
        handle: &MoeHandle,
        dtype: &str,
        pairs: bool,
    ) -> PyResult<Rows> {
        let dtype = parse_dtype(py, dtype)?;
        check_buf(expert_outputs, dtype.size(), "expert_outputs")?;
        let (d, h) = (&self.inner, &handle.inner);
        let hidden = d.spec().hidden;
        py.detach(move || {
            typed!(dtype, T => {
                // SAFETY: the caller holds `expert_outputs`, untouched, until
                // this blocking call returns; `check_buf` passed.
                let outs = unsafe { slice::<T>(expert_outputs) };
                let back = if pairs {
                    d.combine_pairs(outs, h)
                } else {
                    d.combine(outs, h)
                };
                back.map(|y| Rows::new(y, hidden))
            })
        })
        .map_err(|e| py_err(py, e))
    }
}

#[pymethods]
impl MoeHandle {
    /// Tokens this rank dispatched.
    #[getter]
    fn tokens(&self) -> usize {
        self.inner.tokens()
    }

    /// Choices per token.
    #[getter]
    fn topk(&self) -> usize {
        self.inner.topk()
    }

    /// Elements per row.
    #[getter]
    fn hidden(&self) -> usize {
        self.inner.hidden()
    }

    /// Every expert's capacity in rows under `drop`; None when dropless.
    #[getter]
    fn capacity(&self) -> Option<usize> {
        self.inner.capacity()
    }

    /// This rank's dropped (token, choice, expert) triples, by token then
    /// choice.
    #[getter]
    fn dropped(&self) -> Vec<(usize, usize, usize)> {
        self.inner
            .dropped()
            .iter()
            .map(|d| (d.token, d.choice, d.expert))
            .collect()
    }

    /// Pairs dropped on all ranks together (the same on every rank).
    #[getter]
    fn dropped_everywhere(&self) -> usize {
        self.inner.dropped_everywhere()
    }

    /// Rows this rank's experts received.
    #[getter]
    fn rows_received(&self) -> usize {
        self.inner.rows_received()
    }

    /// Rows this rank sent to each rank (rank order).
    #[getter]
    fn send_rows(&self) -> Vec<usize> {
        self.inner.send_rows()
    }

    /// Rows this rank received from each rank (rank order).
    #[getter]
    fn recv_rows(&self) -> Vec<usize> {
        self.inner.recv_rows()
    }

    /// The schedule dispatch ran (what `auto` chose).
    #[getter]
    fn dispatch_schedule(&self) -> String {
        self.inner.dispatch_schedule().to_string()
    }

    /// The schedule combine will run.
    #[getter]
    fn combine_schedule(&self) -> String {
        self.inner.combine_schedule().to_string()
    }

    fn __repr__(&self) -> String {
        format!(
            "MoeHandle(tokens={}, topk={}, rows_received={}, dropped={}, capacity={}, \
             schedule={})",
            self.inner.tokens(),
            self.inner.topk(),
            self.inner.rows_received(),
            self.inner.dropped().len(),
            self.inner
                .capacity()
                .map_or_else(|| "None".to_string(), |c| c.to_string()),
            self.inner.dispatch_schedule()
        )
    }
}

/// Adds the classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<MoeDispatcher>()?;
    m.add_class::<MoeHandle>()?;
    m.add_class::<Rows>()?;
    Ok(())
}
