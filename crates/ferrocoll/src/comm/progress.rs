//! The progress worker: one thread per communicator that runs its queued
//! non-blocking calls (the `i*` forms and started persistent collectives) in
//! the order they were issued.
//!
//! Why one thread and issue order: every rank issues its collectives in the
//! same order and each call's sequence number is reserved when it is issued,
//! so the queue of every rank holds the same calls in the same order. The
//! worker of each rank runs the head of its queue, which is the same call
//! everywhere; it meets its peers and completes, so the queues drain
//! without deadlock. Calls the user makes meanwhile on their own threads
//! (blocking ones) carry their own numbers and overlap with the worker's;
//! the transports match messages by number, not by thread. A thread per
//! call, as before, cost tens of microseconds and a stack each.
//!
//! Point-to-point calls must not go through this queue: a synchronous send
//! waits for its receive, so `isend(to 1); irecv(from 1)` on both ranks of a
//! pair would wait forever behind each other. The library has no
//! non-blocking point-to-point forms (see `nonblocking.rs` for why).
//!
//! Life cycle: started lazily by the first non-blocking call, shared by
//! every handle (clone, `with_options`, `reserve_next_call`) of the same
//! communicator, and ended when the communicator's last handle goes (the
//! [`Engine`] lives in the communicator's shared state, and every queued
//! call holds a handle, so that happens only with an empty queue). The
//! thread sleeps on a condition variable when the queue is empty, and the
//! issuer signals it only then, so a busy worker costs the issuer no system
//! call.

use std::collections::VecDeque;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle, ThreadId};

/// A queued call: runs it and completes its request.
pub(super) type Task = Box<dyn FnOnce() + Send>;

/// One communicator's worker thread and its queue.
pub(super) struct Engine {
    queue: Arc<Queue>,
    thread: Option<JoinHandle<()>>,
    id: ThreadId,
}

struct Queue {
    state: Mutex<State>,
    /// Signalled when a task arrives for a sleeping worker, or on close.
    work: Condvar,
}

#[derive(Default)]
struct State {
    tasks: VecDeque<Task>,
    /// The worker waits on `work` (so a push must signal it).
    sleeping: bool,
    /// The communicator is gone: finish what is queued, then end.
    closed: bool,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Tasks run outside the lock and every critical section is a few
        // moves, so a poisoned lock still holds a consistent queue.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Engine {
    /// Starts the worker thread, named `name`.
    pub(super) fn start(name: String) -> std::io::Result<Engine> {
        let queue = Arc::new(Queue {
            state: Mutex::default(),
            work: Condvar::new(),
        });
        let q = Arc::clone(&queue);
        let thread = thread::Builder::new().name(name).spawn(move || work(&q))?;
        Ok(Engine {
            queue,
            id: thread.thread().id(),
            thread: Some(thread),
        })
    }

    /// Queues `task` behind the ones already queued.
    pub(super) fn push(&self, task: Task) {
        let wake = {
            let mut state = self.queue.lock();
            state.tasks.push_back(task);
            state.sleeping
        };
        if wake {
            self.queue.work.notify_one();
        }
    }
}

/// The worker's loop: takes every queued task at once (one lock per batch,
/// not per task, so an issuer rarely finds the lock taken) and runs them in
/// order.
fn work(queue: &Queue) {
    let mut batch: VecDeque<Task> = VecDeque::new();
    loop {
        {
            let mut state = queue.lock();
            while state.tasks.is_empty() {
                if state.closed {
                    return;
                }
                state.sleeping = true;
                state = queue.work.wait(state).unwrap_or_else(|p| p.into_inner());
                state.sleeping = false;
            }
            std::mem::swap(&mut batch, &mut state.tasks);
        }
        for task in batch.drain(..) {
            // A call that panics must not end the worker: the calls behind
            // it still run. Its request learns of the panic from its
            // finisher, dropped by the unwinding.
            let _ = panic::catch_unwind(AssertUnwindSafe(task));
        }
    }
}

impl Drop for Engine {
    /// Lets the thread finish what is queued and end; waits for it unless
    /// this is the worker itself (which drops the communicator's last
    /// handle when that was held by the call it just ran).
    fn drop(&mut self) {
        self.queue.lock().closed = true;
        self.queue.work.notify_one();
        if thread::current().id() != self.id {
            if let Some(t) = self.thread.take() {
                // A panic inside a task is caught there; the loop itself
                // does not panic.
                let _ = t.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::request::Request;

    fn queued<R: Send + 'static>(
        engine: &Engine,
        f: impl FnOnce() -> crate::Result<R> + Send + 'static,
    ) -> Request<R> {
        let (req, done) = Request::pending();
        engine.push(Box::new(move || done.finish(f())));
        req
    }

    #[test]
    fn tasks_run_in_order_and_a_panic_fails_only_its_own_request() {
        let engine = Engine::start("test-progress".into()).unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut reqs = Vec::new();
        for i in 0..100u32 {
            let log = Arc::clone(&log);
            reqs.push(queued(&engine, move || {
                log.lock().unwrap().push(i);
                if i == 40 {
                    panic!("task 40 panics on purpose");
                }
                Ok(i)
            }));
        }
        for (i, r) in reqs.into_iter().enumerate() {
            match r.wait() {
                Ok(v) => assert_eq!(v as usize, i),
                Err(e) => {
                    assert_eq!(i, 40);
                    assert!(matches!(e, Error::Internal(_)), "{e}");
                }
            }
        }
        assert_eq!(*log.lock().unwrap(), (0..100).collect::<Vec<_>>());
    }

    #[test]
    fn a_dropped_engine_finishes_its_queue_and_its_thread_ends() {
        let engine = Engine::start("test-progress".into()).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        for i in 0..10 {
            let tx = tx.clone();
            engine.push(Box::new(move || {
                thread::sleep(std::time::Duration::from_millis(2));
                tx.send(i).unwrap();
            }));
        }
        // Joins the worker: everything queued has run by then.
        drop(engine);
        drop(tx);
        assert_eq!(rx.iter().collect::<Vec<_>>(), (0..10).collect::<Vec<_>>());
    }
}
