//! Handles for non-blocking calls.
//!
//! A non-blocking call takes its buffers by value and hands them back on
//! completion, so the borrow checker, not a comment, guarantees nobody
//! touches a buffer while a collective is using it.

use std::sync::mpsc;
use std::thread;

use crate::error::{Error, Result};

/// A call in progress; [`Request::wait`] returns its result (and buffers).
///
/// Dropping a request without waiting lets the call finish in the
/// background; its result is discarded.
#[must_use = "a request does nothing visible unless you wait() for it"]
#[derive(Debug)]
pub struct Request<T> {
    rx: mpsc::Receiver<Result<T>>,
    ready: Option<Result<T>>,
}

impl<T: Send + 'static> Request<T> {
    /// Runs `f` on a background thread.
    pub(crate) fn spawn<F>(f: F) -> Request<T>
    where
        F: FnOnce() -> Result<T> + Send + 'static,
    {
        let (tx, rx) = mpsc::sync_channel(1);
        let spawned = thread::Builder::new()
            .name("ferrocoll-request".into())
            .spawn(move || {
                // The receiver may be gone (request dropped): nothing to do.
                let _ = tx.send(f());
            });
        let ready = match spawned {
            Ok(_) => None,
            Err(e) => Some(Err(Error::Internal(format!(
                "could not start a thread for a non-blocking call: {e}"
            )))),
        };
        Request { rx, ready }
    }

    /// True once the call has finished (then [`Request::wait`] returns at
    /// once). Never blocks.
    pub fn test(&mut self) -> bool {
        if self.ready.is_none() {
            match self.rx.try_recv() {
                Ok(r) => self.ready = Some(r),
                Err(mpsc::TryRecvError::Empty) => {}
                Err(mpsc::TryRecvError::Disconnected) => self.ready = Some(Err(lost())),
            }
        }
        self.ready.is_some()
    }

    /// Blocks until the call has finished and returns its result.
    pub fn wait(self) -> Result<T> {
        match self.ready {
            Some(r) => r,
            None => self.rx.recv().unwrap_or_else(|_| Err(lost())),
        }
    }
}

fn lost() -> Error {
    Error::Internal("the thread running a non-blocking call panicked".into())
}
