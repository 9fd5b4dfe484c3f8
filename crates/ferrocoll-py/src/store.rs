//! A Python key-value store (torch.distributed's `Store`, or any object with
//! `set`, `get`, `add` and `wait`) as ferrocoll's [`Rendezvous`].

use ferrocoll::rendezvous::Rendezvous;
use ferrocoll::{Error, Result};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// The store object; every call takes the GIL for its own duration only
/// (start-up runs with the GIL released).
pub struct PyStore {
    store: Py<PyAny>,
    what: String,
}

impl PyStore {
    /// Wraps `store`; `what` names it in errors.
    pub fn new(store: Py<PyAny>, what: String) -> PyStore {
        PyStore { store, what }
    }

    fn fail(&self, op: &str, key: &str, e: PyErr) -> Error {
        Error::Config {
            var: "store".into(),
            value: self.what.clone(),
            reason: format!("{op} of key `{key}` failed: {e}"),
        }
    }
}

impl Rendezvous for PyStore {
    fn set(&mut self, key: &str, value: &[u8]) -> Result<()> {
        Python::attach(|py| {
            let bytes = PyBytes::new(py, value);
            self.store.call_method1(py, "set", (key, bytes)).map(drop)
        })
        .map_err(|e| self.fail("set", key, e))
    }

    fn wait(&mut self, keys: &[&str]) -> Result<Vec<Vec<u8>>> {
        Python::attach(|py| {
            let list: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
            self.store.call_method1(py, "wait", (list,))?;
            keys.iter()
                .map(|k| {
                    self.store
                        .call_method1(py, "get", (*k,))?
                        .extract::<Vec<u8>>(py)
                })
                .collect::<PyResult<Vec<Vec<u8>>>>()
        })
        .map_err(|e| self.fail("wait", &keys.join(","), e))
    }

    fn add(&mut self, key: &str, delta: i64) -> Result<i64> {
        Python::attach(|py| {
            self.store
                .call_method1(py, "add", (key, delta))?
                .extract::<i64>(py)
        })
        .map_err(|e| self.fail("add", key, e))
    }

    fn describe(&self) -> String {
        self.what.clone()
    }
}
