//! Compressed allreduce for Python: [`Compressor`], one buffer's codec and
//! error-feedback state ([`ferrocoll::compress::Compressor`]) on a
//! communicator, whose calls run on that communicator's progress worker
//! without the GIL. `ferrocoll.torch.hooks` keeps one per DDP bucket.
//!
//! Every call here is queued *without* reserving a sequence number: a
//! compressed allreduce makes several collective calls, which take their
//! numbers when they run, so a call reserved at issue time (`Comm.submit`)
//! on the same communicator could take a number between theirs on one rank
//! and not on another. The calls of this module run on the worker in queue
//! order instead, which is the issue order on every rank; the plain
//! allreduce that goes with them on a communicator ([`queued_all_reduce`])
//! is queued the same way. A communicator that carries them should carry
//! nothing else (`ferrocoll.torch.hooks` gives each hook a subgroup of its
//! own).
//!
//! The Rust compressor is made on the worker, at the first call, not when
//! the Python object is: in the hierarchical form (ranks on at least 2
//! hosts, at least 2 per host) making one splits the communicator, a
//! collective that must take its place among the calls queued before it,
//! as every call of this object does.

use std::sync::{Arc, Mutex};

use ferrocoll::compress::collective::validate_spec;
use ferrocoll::compress::{CompressOptions, WireStats};
use ferrocoll::{Communicator, ReduceOp};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::InvalidArgument;
use crate::jobs::{Buf, Job, Kind};
use crate::worker::{Completion, Handle};
use crate::Comm;

/// What the worker and Python share: the Rust compressor once made, and
/// what its calls reported.
#[derive(Default)]
struct State {
    inner: Option<ferrocoll::compress::Compressor>,
    /// The last call's stats.
    last: WireStats,
    /// Every call's, summed.
    total: WireStats,
    calls: u64,
}

/// The compressed allreduce of one `f32` buffer of a fixed length on one
/// communicator, with the codec's error-feedback residuals kept across
/// calls (one per gradient bucket). Every rank makes one with the same
/// length, codec and options and calls it in the same order.
#[pyclass(module = "ferrocoll._ferrocoll", frozen)]
pub struct Compressor {
    comm: Communicator,
    len: usize,
    spec: String,
    options: CompressOptions,
    state: Arc<Mutex<State>>,
}

/// Runs `f` on the state, locked without the GIL (the worker may hold it
/// for a whole call).
fn with_state<R: Send>(
    py: Python<'_>,
    state: &Mutex<State>,
    f: impl FnOnce(&mut State) -> R + Send,
) -> R {
    py.detach(|| f(&mut state.lock().unwrap_or_else(|p| p.into_inner())))
}

fn op_of(op: &str) -> PyResult<ReduceOp> {
    match op {
        "sum" => Ok(ReduceOp::Sum),
        "avg" => Ok(ReduceOp::Avg),
        other => Err(InvalidArgument::new_err(format!(
            "compressed all_reduce: op `{other}`; compressed collectives sum (`sum` or `avg`)"
        ))),
    }
}

/// A [`WireStats`] as a dict (times in seconds).
fn stats_dict<'py>(py: Python<'py>, s: &WireStats, calls: u64) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("calls", calls)?;
    d.set_item("input_bytes", s.input_bytes)?;
    d.set_item("sent_bytes", s.sent_bytes)?;
    d.set_item("measured_bytes", s.measured_bytes)?;
    d.set_item("local_sent_bytes", s.local_sent_bytes)?;
    d.set_item("local_measured_bytes", s.local_measured_bytes)?;
    d.set_item("exchanges", s.exchanges)?;
    d.set_item("codec_time", s.codec_time.as_secs_f64())?;
    d.set_item("comm_time", s.comm_time.as_secs_f64())?;
    d.set_item("local_time", s.local_time.as_secs_f64())?;
    Ok(d)
}

#[pymethods]
impl Compressor {
    /// A compressor for buffers of `len` f32 elements on `comm` with codec
    /// `codec`, written as `ferrocoll bench allreduce --compress` takes it
    /// (`fp16`, `bf16`, `int8[:BLOCK]`, `onebit[:BLOCK]`, `topk:K`,
    /// `randk:K[:SEED[:unscaled]]`, `powersgd[:RANK[:ROWSxCOLS[:SEED]]]`).
    /// `error_feedback`: None for the codec's default (on, but off for the
    /// rescaled Random-k), False to send each call's compressed buffer
    /// alone. `hierarchical`: None for wherever the topology allows it,
    /// False for the flat form. A bad codec fails here; a bad combination
    /// of options fails at the first call.
    #[new]
    #[pyo3(signature = (comm, len, codec, error_feedback=None, hierarchical=None))]
    fn new(
        py: Python<'_>,
        comm: &Comm,
        len: usize,
        codec: &str,
        error_feedback: Option<bool>,
        hierarchical: Option<bool>,
    ) -> PyResult<Compressor> {
        validate_spec(codec, len).map_err(|e| crate::py_err(py, e))?;
        Ok(Compressor {
            comm: comm.inner.clone(),
            len,
            spec: codec.to_string(),
            options: CompressOptions {
                error_feedback,
                hierarchical,
            },
            state: Arc::default(),
        })
    }

    /// Elements of the buffer.
    #[getter]
    fn len(&self) -> usize {
        self.len
    }

    /// The codec as given.
    #[getter]
    fn codec(&self) -> &str {
        &self.spec
    }

    /// Queues the compressed allreduce of the f32 buffer `buf` (`(address,
    /// elements)`) in place on the communicator's progress worker, behind
    /// every call issued on it before, and returns its Handle. `op` is
    /// `sum` or `avg`. `copies` (`(from, to, bytes)`) are made after it,
    /// on the worker. The buffer must stay alive and untouched until the
    /// handle completes (the Python layer holds it).
    #[pyo3(signature = (buf, op="avg", copies=None))]
    fn all_reduce(
        &self,
        py: Python<'_>,
        buf: (usize, usize),
        op: &str,
        copies: Option<Vec<(usize, usize, usize)>>,
    ) -> PyResult<Handle> {
        let (addr, len) = buf;
        let op = op_of(op)?;
        if len != self.len {
            return Err(InvalidArgument::new_err(format!(
                "compressed all_reduce: the compressor ({}) was made for {} elements and was \
                 given {len}; make one per buffer",
                self.spec, self.len
            )));
        }
        if len > 0 && (addr == 0 || addr % std::mem::align_of::<f32>() != 0) {
            return Err(InvalidArgument::new_err(format!(
                "compressed all_reduce: the buffer at {addr:#x} is not an aligned f32 buffer"
            )));
        }
        let comm = self.comm.clone();
        let (spec, options) = (self.spec.clone(), self.options);
        let state = Arc::clone(&self.state);
        let copies = copies.unwrap_or_default();
        let done = Arc::new(Completion::default());
        let finish = Arc::clone(&done);
        let task = move || {
            let outcome = (|| {
                let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
                if st.inner.is_none() {
                    st.inner = Some(ferrocoll::compress::Compressor::with_options(
                        &comm, len, &spec, options,
                    )?);
                }
                let c = st.inner.as_mut().expect("made above");
                let data: &mut [f32] = if len == 0 {
                    &mut []
                } else {
                    // SAFETY: the Python layer holds the buffer (`len` f32
                    // at `addr`, aligned: checked above) until the handle
                    // completes and touches it not meanwhile; this worker
                    // task is the only one using it.
                    unsafe { std::slice::from_raw_parts_mut(addr as *mut f32, len) }
                };
                let stats = c.all_reduce(data, op)?;
                st.last = stats;
                st.total += stats;
                st.calls += 1;
                for &(from, to, bytes) in &copies {
                    if bytes > 0 {
                        // SAFETY: the Python layer made both ranges (tensors
                        // it holds until the handle completes), distinct.
                        unsafe {
                            std::ptr::copy_nonoverlapping(from as *const u8, to as *mut u8, bytes)
                        };
                    }
                }
                Ok(())
            })();
            finish.finish(outcome);
        };
        self.comm
            .run_on_progress_worker(task)
            .map_err(|e| crate::py_err(py, e))?;
        Ok(Handle { state: done })
    }

    /// The last call's wire statistics: `sent_bytes` (the algorithm's
    /// bytes by formula), `measured_bytes` (what the communicator's
    /// transport counter moved during the call), `input_bytes`
    /// (uncompressed), `exchanges`, and `codec_time` / `comm_time` in
    /// seconds. Zeros before the first call.
    fn last_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (last, calls) = with_state(py, &self.state, |st| (st.last, st.calls));
        stats_dict(py, &last, u64::from(calls > 0))
    }

    /// [`Compressor::last_stats`] summed over every call, with `calls`.
    fn total_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (total, calls) = with_state(py, &self.state, |st| (st.total, st.calls));
        stats_dict(py, &total, calls)
    }

    /// This rank's residual (what it was given and has not sent yet), for
    /// the elements `residual_range()` names; None without error feedback
    /// or before the first call.
    fn residual(&self, py: Python<'_>) -> Option<Vec<f32>> {
        with_state(py, &self.state, |st| {
            st.inner.as_ref()?.residual().map(<[f32]>::to_vec)
        })
    }

    /// The `(start, end)` of the buffer `residual()` covers: all of it in
    /// the flat form. None before the first call.
    fn residual_range(&self, py: Python<'_>) -> Option<(usize, usize)> {
        with_state(py, &self.state, |st| {
            st.inner
                .as_ref()
                .map(|c| c.residual_range())
                .map(|r| (r.start, r.end))
        })
    }

    /// The two-phase quantizers' server-side residual of this rank's chunk
    /// (`chunk(rank)`); None for other algorithms, without error feedback
    /// or before the first call.
    fn server_residual(&self, py: Python<'_>) -> Option<Vec<f32>> {
        with_state(py, &self.state, |st| {
            st.inner.as_ref()?.server_residual().map(<[f32]>::to_vec)
        })
    }

    /// The `(start, end)` of the buffer rank `rank` reduces (the chunk its
    /// server residual covers); None before the first call.
    fn chunk(&self, py: Python<'_>, rank: usize) -> Option<(usize, usize)> {
        with_state(py, &self.state, |st| {
            st.inner
                .as_ref()
                .map(|c| c.chunk(rank))
                .map(|r| (r.start, r.end))
        })
    }

    /// The algorithm the calls run (`two-phase`, `allgather`,
    /// `allreduce-values`, `powersgd`, `hier-...`); None before the first
    /// call.
    fn algorithm(&self, py: Python<'_>) -> Option<&'static str> {
        with_state(py, &self.state, |st| {
            st.inner.as_ref().map(|c| c.algorithm())
        })
    }

    /// The codec with its parameters resolved (`int8:128`,
    /// `powersgd:4:64x32`); None before the first call.
    fn name(&self, py: Python<'_>) -> Option<String> {
        with_state(py, &self.state, |st| st.inner.as_ref().map(|c| c.name()))
    }

    /// Whether residuals are kept across calls; None before the first call.
    fn error_feedback(&self, py: Python<'_>) -> Option<bool> {
        with_state(py, &self.state, |st| {
            st.inner.as_ref().map(|c| c.error_feedback())
        })
    }

    /// Forgets the residuals, the step and PowerSGD's warm start (waits for
    /// a call in progress). Every rank must reset together.
    fn reset(&self, py: Python<'_>) {
        with_state(py, &self.state, |st| {
            if let Some(c) = st.inner.as_mut() {
                c.reset();
            }
        })
    }
}

/// Queues a plain allreduce of `buf` (`(address, elements)` of `dtype`)
/// in place on `comm`'s progress worker without reserving its sequence
/// number, so that it keeps its queue place among [`Compressor`] calls on
/// the same communicator (see the module documentation), and returns its
/// Handle. `copies` (`(from, to, bytes)`) are made after it, on the worker.
/// The buffer must stay alive and untouched until the handle completes.
#[pyfunction]
#[pyo3(signature = (comm, dtype, buf, op="avg", copies=None))]
pub fn queued_all_reduce(
    py: Python<'_>,
    comm: &Comm,
    dtype: &str,
    buf: (usize, usize),
    op: &str,
    copies: Option<Vec<(usize, usize, usize)>>,
) -> PyResult<Handle> {
    let buf = Buf {
        addr: buf.0,
        len: buf.1,
    };
    let job = Job {
        kind: Kind::AllReduce {
            send: buf,
            recv: buf,
            op: crate::parse_op(py, op)?,
        },
        dtype: crate::parse_dtype(py, dtype)?,
        scale: None,
        copies: copies.unwrap_or_default(),
    };
    let comm = comm.inner.clone();
    job.check(comm.rank(), comm.size())
        .map_err(|e| crate::py_err(py, e))?;
    let done = Arc::new(Completion::default());
    let finish = Arc::clone(&done);
    let runner = comm.clone();
    comm.run_on_progress_worker(move || {
        // SAFETY: the Python caller holds the buffers until the handle
        // completes and touches them not meanwhile; `check` passed.
        finish.finish(unsafe { job.run(&runner) });
    })
    .map_err(|e| crate::py_err(py, e))?;
    Ok(Handle { state: done })
}

/// Adds the class and function to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Compressor>()?;
    m.add_function(wrap_pyfunction!(queued_all_reduce, m)?)
}
