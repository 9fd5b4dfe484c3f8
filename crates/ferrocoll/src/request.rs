//! Handles for non-blocking calls.
//!
//! A non-blocking call takes its buffers by value and hands them back on
//! completion, so the borrow checker, not a comment, guarantees nobody
//! touches a buffer while a collective is using it.
//!
//! The call itself runs on the communicator's progress worker
//! (`comm/progress.rs`); this module is only the meeting point between that
//! worker and whoever waits: a [`Completion`] slot the worker fills once,
//! through a [`Finisher`], and the [`Request`] the caller holds. Waiters
//! sleep (`thread::park`), registered in the slot, and the worker wakes
//! exactly the threads registered there; nobody polls. Parking rather than a
//! condition variable per request lets [`Request::wait_any`] sleep on many
//! requests at once (it registers in each).

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, Thread};

use crate::error::{Error, Result};

/// The slot one call's result goes to.
pub(crate) struct Completion<T> {
    slot: Mutex<Slot<T>>,
}

struct Slot<T> {
    /// Set once, by the [`Finisher`].
    result: Option<Result<T>>,
    /// Threads asleep until `result` is set (a `wait`, or a `wait_any` over
    /// this request among others).
    waiters: Vec<Thread>,
}

impl<T> Completion<T> {
    fn lock(&self) -> MutexGuard<'_, Slot<T>> {
        // A panic while holding this lock cannot leave the slot half-written
        // (every critical section is a few moves), so a poisoned lock is
        // still consistent.
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn is_set(&self) -> bool {
        self.lock().result.is_some()
    }

    /// Takes the result if it is there.
    fn take(&self) -> Option<Result<T>> {
        self.lock().result.take()
    }
}

/// The worker's end of a [`Request`]: fills the slot once. Dropped without
/// [`Finisher::finish`] (the call panicked, or never ran), it fills the slot
/// with an [`Error::Internal`], so no waiter sleeps forever.
pub(crate) struct Finisher<T>(Option<Arc<Completion<T>>>);

impl<T> Finisher<T> {
    /// Stores the call's result and wakes whoever waits for it.
    pub(crate) fn finish(mut self, result: Result<T>) {
        if let Some(c) = self.0.take() {
            complete(&c, result);
        }
    }
}

impl<T> Drop for Finisher<T> {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            complete(
                &c,
                Err(Error::Internal(
                    "a non-blocking call ended without a result (it panicked; see the message above)"
                        .into(),
                )),
            );
        }
    }
}

fn complete<T>(c: &Completion<T>, result: Result<T>) {
    let waiters = {
        let mut slot = c.lock();
        slot.result = Some(result);
        std::mem::take(&mut slot.waiters)
    };
    // Outside the lock: a woken thread goes straight for it.
    for t in waiters {
        t.unpark();
    }
}

/// A call in progress; [`Request::wait`] returns its result (and buffers).
///
/// The call runs on the communicator's progress worker whether or not
/// anybody waits. Dropping a request without waiting lets the call finish
/// there; its result (and the buffers in it) is then dropped.
#[must_use = "a request does nothing visible unless you wait() for it"]
pub struct Request<T> {
    state: State<T>,
}

enum State<T> {
    /// Running or queued; the result arrives in the slot.
    Pending(Arc<Completion<T>>),
    /// Known at issue (the worker could not be started).
    Ready(Result<T>),
    /// [`Request::test`] or [`Request::wait_any`] already handed the
    /// result out.
    Taken,
}

impl<T> fmt::Debug for Request<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Pending(c) if c.is_set() => "complete",
            State::Pending(_) => "pending",
            State::Ready(_) => "complete",
            State::Taken => "taken",
        };
        f.debug_struct("Request").field("state", &state).finish()
    }
}

/// The error of a request whose result was already handed out.
fn taken() -> Error {
    Error::invalid(
        "this request's result was already returned (by test() or wait_any()); a request completes once",
    )
}

impl<T> Request<T> {
    /// A request and the finisher that completes it.
    pub(crate) fn pending() -> (Request<T>, Finisher<T>) {
        let c = Arc::new(Completion {
            slot: Mutex::new(Slot {
                result: None,
                waiters: Vec::new(),
            }),
        });
        let finisher = Finisher(Some(Arc::clone(&c)));
        (
            Request {
                state: State::Pending(c),
            },
            finisher,
        )
    }

    /// A request that is already complete with `result`.
    pub(crate) fn ready(result: Result<T>) -> Request<T> {
        Request {
            state: State::Ready(result),
        }
    }

    /// True once the call has finished (then [`Request::wait`] returns at
    /// once), also after its result was taken. Never blocks.
    pub fn is_complete(&self) -> bool {
        match &self.state {
            State::Pending(c) => c.is_set(),
            State::Ready(_) | State::Taken => true,
        }
    }

    /// Whether the result is still to be handed out.
    fn is_live(&self) -> bool {
        !matches!(self.state, State::Taken)
    }

    /// The non-blocking completion check (MPI_Test): the call's result once
    /// it has finished, `None` while it still runs. Never blocks.
    ///
    /// The result is handed out once: after `test` returned `Some`, the
    /// request is spent, and a later `test` or [`Request::wait`] returns an
    /// [`Error::InvalidArgument`].
    ///
    /// ```
    /// # use ferrocoll::{local, ReduceOp};
    /// local::run(2, |comm| {
    ///     let mut req = comm.iall_reduce(vec![1u32; 4], ReduceOp::Sum);
    ///     let sum = loop {
    ///         if let Some(result) = req.test() {
    ///             break result.unwrap();
    ///         }
    ///         std::thread::yield_now(); // or: compute something useful
    ///     };
    ///     assert_eq!(sum, vec![2; 4]);
    /// }).unwrap();
    /// ```
    pub fn test(&mut self) -> Option<Result<T>> {
        let result = match &mut self.state {
            State::Pending(c) => c.take()?,
            State::Ready(_) => match std::mem::replace(&mut self.state, State::Taken) {
                State::Ready(r) => r,
                _ => unreachable!("matched Ready above"),
            },
            State::Taken => return Some(Err(taken())),
        };
        self.state = State::Taken;
        Some(result)
    }

    /// Blocks (asleep, never spinning) until the call has finished and
    /// returns its result: the buffers, or the call's [`Error`].
    pub fn wait(self) -> Result<T> {
        let c = match self.state {
            State::Pending(c) => c,
            State::Ready(r) => return r,
            State::Taken => return Err(taken()),
        };
        let mut slot = c.lock();
        if let Some(r) = slot.result.take() {
            return r;
        }
        slot.waiters.push(thread::current());
        loop {
            drop(slot);
            // Woken by the finisher, or spuriously (then still registered).
            thread::park();
            slot = c.lock();
            if let Some(r) = slot.result.take() {
                return r;
            }
        }
    }

    /// Waits for every request and returns their results in the same order,
    /// or the first error in that order. Every request is waited for even
    /// when an earlier one failed, so no call is still running when this
    /// returns.
    ///
    /// ```
    /// # use ferrocoll::{local, ReduceOp, Request};
    /// local::run(3, |comm| {
    ///     let reqs: Vec<_> = (0..10u64)
    ///         .map(|i| comm.iall_reduce(vec![i; 2], ReduceOp::Sum))
    ///         .collect();
    ///     let sums = Request::wait_all(reqs).unwrap();
    ///     assert_eq!(sums[9], vec![27, 27]);
    /// }).unwrap();
    /// ```
    pub fn wait_all(requests: Vec<Request<T>>) -> Result<Vec<T>> {
        // Waited for from the last: a worker completes its calls in issue
        // order, so once the last is done the others usually are too, and
        // this thread sleeps and is woken once instead of once per request.
        let mut results: Vec<Result<T>> = requests.into_iter().rev().map(Request::wait).collect();
        results.reverse();
        results.into_iter().collect()
    }

    /// Blocks until one of `requests` has finished and returns its index
    /// and result (MPI_Waitany); that request is then spent (see
    /// [`Request::test`]) and later calls skip it. `None` when no request
    /// is left to complete (the slice is empty or every result was taken).
    ///
    /// ```
    /// # use ferrocoll::{local, ReduceOp, Request};
    /// local::run(2, |comm| {
    ///     let mut reqs: Vec<_> = (0..4u32)
    ///         .map(|i| comm.iall_reduce(vec![i], ReduceOp::Sum))
    ///         .collect();
    ///     let mut seen = 0;
    ///     while let Some((i, result)) = Request::wait_any(&mut reqs) {
    ///         assert_eq!(result.unwrap(), vec![2 * i as u32]);
    ///         seen += 1;
    ///     }
    ///     assert_eq!(seen, 4);
    /// }).unwrap();
    /// ```
    pub fn wait_any(requests: &mut [Request<T>]) -> Option<(usize, Result<T>)> {
        if !requests.iter().any(Request::is_live) {
            return None;
        }
        // Something already finished: no need to sleep.
        if let Some(found) = take_first(requests) {
            return Some(found);
        }
        // Register in every pending slot, re-checking each under its lock
        // (a call finishing between the scan above and the registration
        // would otherwise wake nobody).
        let me = thread::current();
        let mut registered = Vec::new();
        let mut early = None;
        for (i, r) in requests.iter().enumerate() {
            if let State::Pending(c) = &r.state {
                let mut slot = c.lock();
                if slot.result.is_some() {
                    early = Some(i);
                    break;
                }
                slot.waiters.push(me.clone());
                registered.push(i);
            }
        }
        let found = match early {
            Some(_) => take_first(requests),
            None => loop {
                thread::park();
                if let Some(found) = take_first(requests) {
                    break Some(found);
                }
            },
        };
        // Leave the slots that did not wake us, so they do not wake this
        // thread for nothing later (and their lists do not grow with every
        // wait_any over the same requests).
        let id = me.id();
        for i in registered {
            if let State::Pending(c) = &requests[i].state {
                c.lock().waiters.retain(|t| t.id() != id);
            }
        }
        found
    }
}

/// The first request of `requests` (in index order) that has finished, with
/// its result taken.
fn take_first<T>(requests: &mut [Request<T>]) -> Option<(usize, Result<T>)> {
    requests.iter_mut().enumerate().find_map(|(i, r)| {
        if r.is_live() && r.is_complete() {
            r.test().map(|result| (i, result))
        } else {
            None
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_returns_what_the_finisher_stores_across_threads() {
        let (req, done) = Request::<u32>::pending();
        let t = thread::spawn(move || {
            thread::sleep(std::time::Duration::from_millis(20));
            done.finish(Ok(7));
        });
        assert_eq!(req.wait().unwrap(), 7);
        t.join().unwrap();
    }

    #[test]
    fn a_dropped_finisher_completes_with_an_internal_error() {
        let (mut req, done) = Request::<u32>::pending();
        assert!(req.test().is_none());
        drop(done);
        let e = req.test().unwrap().unwrap_err();
        assert!(matches!(e, Error::Internal(_)), "{e}");
        // Spent now.
        assert!(matches!(req.test(), Some(Err(Error::InvalidArgument(_)))));
    }

    #[test]
    fn wait_any_wakes_on_the_one_that_finishes_and_deregisters() {
        let (reqs, dones): (Vec<_>, Vec<_>) = (0..5).map(|_| Request::<usize>::pending()).unzip();
        let mut reqs = reqs;
        let mut dones: Vec<Option<Finisher<usize>>> = dones.into_iter().map(Some).collect();
        let third = dones[3].take().unwrap();
        let t = thread::spawn(move || {
            thread::sleep(std::time::Duration::from_millis(20));
            third.finish(Ok(33));
        });
        let (i, r) = Request::wait_any(&mut reqs).unwrap();
        assert_eq!((i, r.unwrap()), (3, 33));
        t.join().unwrap();
        for (k, r) in reqs.iter().enumerate() {
            if let State::Pending(c) = &r.state {
                assert!(
                    c.lock().waiters.is_empty(),
                    "request {k} still lists the waiter"
                );
            }
        }
        for (k, d) in dones.into_iter().enumerate() {
            if let Some(d) = d {
                d.finish(Ok(k));
            }
        }
        let mut got: Vec<usize> = std::iter::from_fn(|| Request::wait_any(&mut reqs))
            .map(|(_, r)| r.unwrap())
            .collect();
        got.sort_unstable();
        assert_eq!(got, vec![0, 1, 2, 4]);
        assert!(Request::wait_any(&mut reqs).is_none());
        assert!(Request::<u8>::wait_any(&mut []).is_none());
    }
}
