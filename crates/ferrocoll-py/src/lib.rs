//! `ferrocoll._ferrocoll`: the extension module under the `ferrocoll`
//! Python package (python/ferrocoll). It offers a [`Comm`] with one
//! `submit` method that runs any collective over buffers given by address;
//! the Python layer turns numpy arrays and torch tensors into addresses,
//! keeps them alive while a call runs, and offers the typed API.
//!
//! Every call releases the GIL for as long as ferrocoll works. Non-blocking
//! calls reserve their place in the order of calls when issued and run on
//! the communicator's progress worker (point-to-point calls, which may wait
//! on each other, each on a thread of their own).

use std::str::FromStr;
use std::sync::Arc;

use ferrocoll::init::TransportKind;
use ferrocoll::{CallOptions, Communicator, Config, DType, ReduceOp};
use pyo3::prelude::*;

mod arrays;
mod compress;
mod errors;
mod jobs;
// issue 18: MoE dispatch/combine (ferrocoll.torch.moe).
mod moe;
mod store;
mod worker;

use jobs::{Buf, Job, Kind};
use worker::{Completion, Handle};

/// A ferrocoll communicator.
#[pyclass(module = "ferrocoll._ferrocoll", frozen)]
struct Comm {
    inner: Communicator,
}

impl Comm {
    fn new(inner: Communicator) -> Comm {
        Comm { inner }
    }
}

fn py_err(py: Python<'_>, e: ferrocoll::Error) -> PyErr {
    errors::to_py(py, &e)
}

fn config_with(timeout: Option<f64>) -> ferrocoll::Result<Config> {
    let config = Config::from_env()?;
    Ok(match timeout {
        Some(t) if t > 0.0 => {
            config.with_timeout(ferrocoll::config::timeout_from_secs("timeout", t)?)
        }
        _ => config,
    })
}

/// Builds the world communicator from the launcher's environment, as Rust's
/// `ferrocoll::init()` (ferrocoll run, torchrun, mpirun, srun, PMI).
/// `timeout` (seconds) overrides `FERROCOLL_TIMEOUT`.
#[pyfunction]
#[pyo3(signature = (timeout=None))]
fn init(py: Python<'_>, timeout: Option<f64>) -> PyResult<Comm> {
    let comm = py
        .detach(|| {
            let spec = ferrocoll::world::WorldSpec::from_env()?;
            ferrocoll::init::init_with(&spec, config_with(timeout)?)
        })
        .map_err(|e| py_err(py, e))?;
    Ok(Comm::new(comm))
}

/// Builds the world communicator over a key-value store every rank
/// reaches (torch.distributed's Store: `set`, `get`, `add`, `wait`), with no
/// rendezvous port of ferrocoll's own. `route_to` (`host:port`) picks the
/// interface TCP listens on; `transport` is `auto`, `shm` or `tcp`
/// (default: `FERROCOLL_TRANSPORT`).
#[pyfunction]
#[pyo3(signature = (store, rank, size, route_to=None, timeout=None, transport=None))]
fn init_with_store(
    py: Python<'_>,
    store: Py<PyAny>,
    rank: usize,
    size: usize,
    route_to: Option<String>,
    timeout: Option<f64>,
    transport: Option<String>,
) -> PyResult<Comm> {
    let what = store
        .bind(py)
        .repr()
        .map_or_else(|_| "a Python store".into(), |r| r.to_string());
    let rendezvous = Box::new(store::PyStore::new(store, what));
    let comm = py
        .detach(move || {
            let kind = match transport.as_deref().map(str::trim) {
                None | Some("") => TransportKind::from_env()?,
                Some("auto") => TransportKind::Auto,
                Some("shm") => TransportKind::Shm,
                Some("tcp") => TransportKind::Tcp,
                Some(other) => {
                    return Err(ferrocoll::Error::invalid(format!(
                        "transport `{other}`: use auto, shm or tcp"
                    )))
                }
            };
            ferrocoll::init::init_with_rendezvous(
                rank,
                size,
                rendezvous,
                route_to.as_deref(),
                config_with(timeout)?,
                kind,
            )
        })
        .map_err(|e| py_err(py, e))?;
    Ok(Comm::new(comm))
}

fn parse_dtype(py: Python<'_>, s: &str) -> PyResult<DType> {
    DType::from_str(s).map_err(|e| py_err(py, e))
}

fn parse_op(py: Python<'_>, s: &str) -> PyResult<ReduceOp> {
    ReduceOp::from_str(s).map_err(|e| py_err(py, e))
}

#[pymethods]
impl Comm {
    /// This rank, in `0..size`.
    #[getter]
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    /// Number of ranks.
    #[getter]
    fn size(&self) -> usize {
        self.inner.size()
    }

    /// Payload bytes this rank has handed its transport for other ranks on
    /// this communicator since it was made (`Communicator::bytes_sent`).
    #[getter]
    fn bytes_sent(&self) -> u64 {
        self.inner.bytes_sent()
    }

    /// The transport's name: `thread`, `shm`, `tcp` or `shm+tcp`.
    #[getter]
    fn transport(&self) -> &'static str {
        self.inner.transport_name()
    }

    /// MPI_Comm_split: ranks with the same `color` form a new communicator
    /// ordered by `key`, then rank; `color=None` gets None. Collective.
    #[pyo3(signature = (color, key=0))]
    fn split(&self, py: Python<'_>, color: Option<u32>, key: i64) -> PyResult<Option<Comm>> {
        let inner = self.inner.reserve_next_call();
        let out = py
            .detach(move || inner.split(color, key))
            .map_err(|e| py_err(py, e))?;
        Ok(out.map(Comm::new))
    }

    /// A communicator over `ranks` made by its members alone
    /// (MPI_Comm_create_group); every member passes the same list and tag.
    #[pyo3(signature = (ranks, tag=0))]
    fn subgroup(&self, py: Python<'_>, ranks: Vec<usize>, tag: u64) -> PyResult<Comm> {
        let inner = self
            .inner
            .subgroup(&ranks, tag)
            .map_err(|e| py_err(py, e))?;
        Ok(Comm::new(inner))
    }

    /// Aborts every call in progress on this rank and tells the peers.
    fn abort(&self) {
        self.inner.abort();
    }

    /// The algorithm `auto` picks for `collective` at `bytes`, and why.
    fn choose(&self, py: Python<'_>, collective: &str, bytes: usize) -> PyResult<(String, String)> {
        let coll = ferrocoll::Collective::from_name(collective).ok_or_else(|| {
            errors::InvalidArgument::new_err(format!("unknown collective `{collective}`"))
        })?;
        let (algo, why) = self.inner.choose(coll, bytes).map_err(|e| py_err(py, e))?;
        Ok((algo.to_string(), why))
    }

    /// Runs one call over buffers given as `(address, elements)`.
    ///
    /// `kind`: all_reduce, broadcast, reduce, all_gather, reduce_scatter,
    /// all_to_all, all_to_all_v, gather, scatter, barrier, send, recv.
    /// Blocking (`async_op=False`): returns None when done. Non-blocking:
    /// returns a Handle at once, the call queued on the progress worker;
    /// with `eager=True` it runs on this thread first (the GIL released) and
    /// the handle comes back completed: for callers that will wait at once
    /// (torch's synchronous calls), which saves two thread hand-offs. The
    /// buffers must stay alive and untouched until the handle completes
    /// (the Python layer holds them). `timeout` (seconds) and `algorithm` (a
    /// name, or `auto`) apply to this call only.
    #[pyo3(signature = (kind, dtype="u8", send=(0, 0), recv=(0, 0), op="sum", root=0, peer=0,
                        tag=0, send_counts=None, recv_counts=None, scale=None, copies=None,
                        async_op=false, timeout=None, algorithm=None, eager=false))]
    #[allow(clippy::too_many_arguments)]
    fn submit(
        &self,
        py: Python<'_>,
        kind: &str,
        dtype: &str,
        send: (usize, usize),
        recv: (usize, usize),
        op: &str,
        root: usize,
        peer: usize,
        tag: u32,
        send_counts: Option<Vec<usize>>,
        recv_counts: Option<Vec<usize>>,
        scale: Option<f64>,
        copies: Option<Vec<(usize, usize, usize)>>,
        async_op: bool,
        timeout: Option<f64>,
        algorithm: Option<&str>,
        eager: bool,
    ) -> PyResult<Option<Handle>> {
        let send = Buf {
            addr: send.0,
            len: send.1,
        };
        let recv = Buf {
            addr: recv.0,
            len: recv.1,
        };
        let how = Args {
            op: parse_op(py, op)?,
            root,
            peer,
            tag,
        };
        let kind = make_kind(kind, send, recv, &how, send_counts, recv_counts)?;
        let job = Job {
            kind,
            dtype: parse_dtype(py, dtype)?,
            scale,
            copies: copies.unwrap_or_default(),
        };
        let mode = match (async_op, eager) {
            (false, _) => Mode::Block,
            (true, false) => Mode::Queue,
            (true, true) => Mode::Eager,
        };
        self.start(py, job, mode, timeout, algorithm)
    }

    /// [`Comm::submit`] for numpy arrays (or anything with numpy's
    /// `__array_struct__`): the element type and lengths come from the
    /// arrays. `recv=None` works in place on `send` (broadcast: `send` is
    /// the buffer). The arrays must stay alive and untouched until the call
    /// completes. numpy bools reduce as logical or (sum, max) and and
    /// (prod, min).
    #[pyo3(signature = (kind, send, recv=None, op="sum", root=0, async_op=false))]
    #[allow(clippy::too_many_arguments)]
    fn call(
        &self,
        py: Python<'_>,
        kind: &str,
        send: &Bound<'_, PyAny>,
        recv: Option<&Bound<'_, PyAny>>,
        op: &str,
        root: usize,
        async_op: bool,
    ) -> PyResult<Option<Handle>> {
        let in_place = recv.is_none() || recv.is_some_and(|r| r.is(send));
        let writes_send = in_place || kind == "broadcast";
        let s = arrays::read(send, "send", writes_send)?;
        let r = match recv {
            Some(obj) if !in_place => arrays::read(obj, "recv", true)?,
            _ => arrays::Array {
                buf: s.buf,
                dtype: s.dtype,
                is_bool: s.is_bool,
            },
        };
        if r.dtype != s.dtype {
            return Err(errors::InvalidArgument::new_err(format!(
                "{kind}: send is {} but recv is {}",
                s.dtype, r.dtype
            )));
        }
        let mut op = parse_op(py, op)?;
        if s.is_bool {
            op = match op {
                ReduceOp::Sum | ReduceOp::Max => ReduceOp::Max,
                ReduceOp::Prod | ReduceOp::Min => ReduceOp::Min,
                ReduceOp::Avg => {
                    return Err(errors::InvalidArgument::new_err(
                        "avg of bool arrays is not defined",
                    ))
                }
            };
        }
        // A reduce's output matters on the root only.
        let recv_buf = if kind == "reduce" && self.inner.rank() != root {
            Buf {
                addr: r.buf.addr,
                len: 0,
            }
        } else {
            r.buf
        };
        let how = Args {
            op,
            root,
            peer: 0,
            tag: 0,
        };
        let kind = make_kind(kind, s.buf, recv_buf, &how, None, None)?;
        let job = Job {
            kind,
            dtype: s.dtype,
            scale: None,
            copies: Vec::new(),
        };
        let mode = if async_op { Mode::Queue } else { Mode::Block };
        self.start(py, job, mode, None, None)
    }
}

/// The per-call arguments besides buffers.
struct Args {
    op: ReduceOp,
    root: usize,
    peer: usize,
    tag: u32,
}

/// Where a call runs: on this thread to the end (`Block`), on the progress
/// worker (`Queue`), or on this thread with a completed handle (`Eager`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Block,
    Queue,
    Eager,
}

fn make_kind(
    kind: &str,
    send: Buf,
    recv: Buf,
    a: &Args,
    send_counts: Option<Vec<usize>>,
    recv_counts: Option<Vec<usize>>,
) -> PyResult<Kind> {
    let (op, root) = (a.op, a.root);
    Ok(match kind {
        "all_reduce" => Kind::AllReduce { send, recv, op },
        "broadcast" => Kind::Broadcast { buf: recv, root },
        "reduce" => Kind::Reduce {
            send,
            recv,
            op,
            root,
        },
        "all_gather" => Kind::AllGather { send, recv },
        "reduce_scatter" => Kind::ReduceScatter { send, recv, op },
        "all_to_all" => Kind::AllToAll { send, recv },
        "all_to_all_v" => Kind::AllToAllV {
            send,
            recv,
            send_counts: send_counts.unwrap_or_default(),
            recv_counts: recv_counts.unwrap_or_default(),
        },
        "gather" => Kind::Gather { send, recv, root },
        "scatter" => Kind::Scatter { send, recv, root },
        "barrier" => Kind::Barrier,
        "send" => Kind::Send {
            buf: send,
            peer: a.peer,
            tag: a.tag,
        },
        "recv" => Kind::Recv {
            buf: recv,
            peer: a.peer,
            tag: a.tag,
        },
        // `send` holds the address of the cell the sender's rank goes to.
        "recv_any" => Kind::RecvAny {
            buf: recv,
            tag: a.tag,
            source: send.addr,
        },
        other => {
            return Err(errors::InvalidArgument::new_err(format!(
                "unknown call `{other}`"
            )))
        }
    })
}

impl Comm {
    /// Checks `job` and runs it as `mode` says.
    fn start(
        &self,
        py: Python<'_>,
        job: Job,
        mode: Mode,
        timeout: Option<f64>,
        algorithm: Option<&str>,
    ) -> PyResult<Option<Handle>> {
        job.check(self.inner.rank(), self.inner.size())
            .map_err(|e| py_err(py, e))?;
        let base = if timeout.is_some() || algorithm.is_some() {
            let mut options = match algorithm {
                Some(name) => CallOptions::algorithm_named(name).map_err(|e| py_err(py, e))?,
                None => CallOptions::default(),
            };
            if let Some(t) = timeout.filter(|t| *t > 0.0) {
                let t = ferrocoll::config::timeout_from_secs("timeout", t)
                    .map_err(|e| py_err(py, e))?;
                options = options.timeout(t);
            }
            Some(self.inner.with_options(options))
        } else {
            None
        };
        let base = base.as_ref().unwrap_or(&self.inner);
        // Collectives take their place in the order of calls now, whichever
        // thread runs them; point-to-point calls are matched by peer and tag.
        let p2p = job.is_p2p();
        let comm = if p2p {
            base.clone()
        } else {
            base.reserve_next_call()
        };
        // A send waits for its receive: run eagerly, an isend followed by an
        // irecv on both ranks would wait forever.
        let mode = if p2p && mode == Mode::Eager {
            Mode::Queue
        } else {
            mode
        };
        if mode != Mode::Queue {
            // SAFETY: the Python caller holds the buffers for this call's
            // duration (it is blocked in it) and `check` passed.
            let outcome = py.detach(move || unsafe { job.run(&comm) });
            if mode == Mode::Block {
                return outcome.map(|()| None).map_err(|e| py_err(py, e));
            }
            let state = Arc::new(Completion::default());
            state.finish(outcome);
            return Ok(Some(Handle { state }));
        }
        let state = Arc::new(Completion::default());
        let done = Arc::clone(&state);
        let task = move || {
            // SAFETY: the Python layer holds the buffers until the handle
            // completes and documents that they must not be touched before.
            let outcome = unsafe { job.run(&comm) };
            done.finish(outcome);
        };
        if p2p {
            // Each point-to-point call on a thread of its own: two queued
            // behind one worker could wait on each other.
            std::thread::Builder::new()
                .name("ferrocoll-p2p".into())
                .spawn(task)
                .map_err(|e| {
                    errors::InternalError::new_err(format!("cannot start a thread: {e}"))
                })?;
        } else {
            // The communicator's own progress worker, shared with its Rust
            // non-blocking calls.
            base.run_on_progress_worker(task)
                .map_err(|e| py_err(py, e))?;
        }
        Ok(Some(Handle { state }))
    }
}

#[pymodule]
fn _ferrocoll(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Comm>()?;
    m.add_class::<Handle>()?;
    m.add_function(wrap_pyfunction!(init, m)?)?;
    m.add_function(wrap_pyfunction!(init_with_store, m)?)?;
    m.add_function(wrap_pyfunction!(worker::_shutdown, m)?)?;
    errors::register(m)?;
    moe::register(m)?;
    compress::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
