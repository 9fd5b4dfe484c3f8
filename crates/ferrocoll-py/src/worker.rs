//! Asynchrony for the Python layer: [`Handle`]s that complete without the
//! GIL. The calls themselves run on the communicator's progress worker
//! (`Communicator::run_on_progress_worker`, shared with the Rust crate's
//! non-blocking calls), in issue order.
//!
//! Hand-off rules, so that autograd threads, a Python `wait()` and the
//! worker can never deadlock:
//! - the worker never takes the GIL: it runs the call, stores the result and
//!   wakes waiters through a mutex and condition variable of its own;
//! - `Handle.wait()` releases the GIL while it waits;
//! - Python callbacks (`Handle.on_complete`, used to complete torch futures)
//!   run on one separate completer thread, which is the only one that takes
//!   the GIL for them, so a slow GIL never delays the next call.

use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use pyo3::prelude::*;

use crate::errors;

/// What a finished call left: `Ok` or ferrocoll's error.
type Outcome = Result<(), ferrocoll::Error>;

#[derive(Default)]
struct Slot {
    outcome: Option<Outcome>,
    callbacks: Vec<Py<PyAny>>,
}

/// The shared state of one call.
#[derive(Default)]
pub struct Completion {
    slot: Mutex<Slot>,
    done: Condvar,
}

impl Completion {
    /// Records the outcome, wakes waiters and hands callbacks to the
    /// completer thread. Called once, without the GIL.
    pub fn finish(&self, outcome: Outcome) {
        let callbacks = {
            let mut slot = self.slot.lock().unwrap_or_else(|p| p.into_inner());
            slot.outcome = Some(outcome.clone());
            std::mem::take(&mut slot.callbacks)
        };
        self.done.notify_all();
        if !callbacks.is_empty() {
            completer().send((callbacks, outcome)).ok();
        }
    }
}

/// The completer thread's queue: callbacks and the outcome to call them with.
type Delivery = (Vec<Py<PyAny>>, Outcome);

fn completer() -> &'static mpsc::Sender<Delivery> {
    static SENDER: OnceLock<mpsc::Sender<Delivery>> = OnceLock::new();
    SENDER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Delivery>();
        std::thread::Builder::new()
            .name("ferrocoll-completer".into())
            .spawn(move || {
                for (callbacks, outcome) in rx {
                    if !COMPLETER.begin() {
                        // The interpreter is shutting down: taking the GIL
                        // now would end this thread inside Rust code (3.11's
                        // take_gil calls pthread_exit, whose forced unwind
                        // aborts the process). Leak the callbacks instead of
                        // dropping Python objects without the GIL.
                        std::mem::forget(callbacks);
                        continue;
                    }
                    Python::attach(|py| call_back(py, callbacks, &outcome));
                    COMPLETER.end();
                }
            })
            .expect("start the ferrocoll completer thread");
        tx
    })
}

/// Whether the completer may take the GIL, and whether it holds or waits
/// for it now: [`shutdown`] (from an `atexit` handler, before the
/// interpreter starts finalizing) stops new deliveries and waits for the
/// one in progress.
struct CompleterGate {
    state: Mutex<(bool, bool)>, // (shutting down, delivering)
    idle: Condvar,
}

static COMPLETER: CompleterGate = CompleterGate {
    state: Mutex::new((false, false)),
    idle: Condvar::new(),
};

impl CompleterGate {
    fn begin(&self) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.0 {
            return false;
        }
        s.1 = true;
        true
    }

    fn end(&self) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).1 = false;
        self.idle.notify_all();
    }
}

/// Stops the completer from taking the GIL again and waits (without the GIL)
/// for a delivery in progress. Registered with `atexit` by the Python
/// package; callbacks of calls that finish later are not run.
#[pyfunction]
pub fn _shutdown(py: Python<'_>) {
    py.detach(|| {
        let mut s = COMPLETER.state.lock().unwrap_or_else(|p| p.into_inner());
        s.0 = true;
        while s.1 {
            s = COMPLETER.idle.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    });
}

/// Calls each callback with `None` (success) or the exception.
fn call_back(py: Python<'_>, callbacks: Vec<Py<PyAny>>, outcome: &Outcome) {
    for cb in callbacks {
        let arg: Py<PyAny> = match outcome {
            Ok(()) => py.None(),
            Err(e) => errors::to_py(py, e).into_value(py).into_any(),
        };
        if let Err(err) = cb.call1(py, (arg,)) {
            // A callback that fails must not end the completer thread.
            err.print(py);
        }
    }
}

/// A call in progress, as Python sees it: `wait()`, `is_completed()`,
/// `exception()`, `on_complete(fn)`.
#[pyclass(module = "ferrocoll._ferrocoll", frozen)]
pub struct Handle {
    pub(crate) state: Arc<Completion>,
}

#[pymethods]
impl Handle {
    /// Blocks (without the GIL) until the call finishes and raises its
    /// error if it failed. With `timeout` (seconds), returns False if the
    /// call is still running then; True once it finished.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let state = Arc::clone(&self.state);
        let outcome = py.detach(move || {
            // NaN waits not at all; a timeout too long for the clock
            // (1e300, inf) waits as long as no timeout does.
            let deadline = timeout.and_then(|t| {
                let t = if t.is_nan() { 0.0 } else { t.max(0.0) };
                Duration::try_from_secs_f64(t)
                    .ok()
                    .and_then(|d| Instant::now().checked_add(d))
            });
            let mut slot = state.slot.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if let Some(o) = &slot.outcome {
                    return Some(o.clone());
                }
                match deadline {
                    None => slot = state.done.wait(slot).unwrap_or_else(|p| p.into_inner()),
                    Some(d) => {
                        let left = d.saturating_duration_since(Instant::now());
                        if left.is_zero() {
                            return None;
                        }
                        slot = state
                            .done
                            .wait_timeout(slot, left)
                            .unwrap_or_else(|p| p.into_inner())
                            .0;
                    }
                }
            }
        });
        match outcome {
            None => Ok(false),
            Some(Ok(())) => Ok(true),
            Some(Err(e)) => Err(errors::to_py(py, &e)),
        }
    }

    /// True once the call finished (successfully or not). Never blocks.
    fn is_completed(&self) -> bool {
        self.state
            .slot
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .outcome
            .is_some()
    }

    /// The exception the call failed with, None if it succeeded or is still
    /// running.
    fn exception(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        let slot = self.state.slot.lock().unwrap_or_else(|p| p.into_inner());
        match &slot.outcome {
            Some(Err(e)) => Some(errors::to_py(py, e).into_value(py).into_any()),
            _ => None,
        }
    }

    /// Calls `callback(exc)` once the call finishes, with None on success
    /// or the exception: at once (on this thread) if it already finished,
    /// else on ferrocoll's completer thread.
    fn on_complete(&self, py: Python<'_>, callback: Py<PyAny>) {
        let done = {
            let mut slot = self.state.slot.lock().unwrap_or_else(|p| p.into_inner());
            match &slot.outcome {
                Some(o) => Some(o.clone()),
                None => {
                    slot.callbacks.push(callback.clone_ref(py));
                    None
                }
            }
        };
        if let Some(outcome) = done {
            call_back(py, vec![callback], &outcome);
        }
    }
}
