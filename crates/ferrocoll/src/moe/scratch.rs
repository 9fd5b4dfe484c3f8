//! Temporary buffers kept between calls.
//!
//! A dispatch of 4096 tokens x 2048 bf16 x top-2 packs 32 MiB to send and
//! receives as much; fresh buffers of that size come from the kernel as
//! new pages, so every call paid a page fault (and the zeroing) per 4 KiB
//! before copying anything: on the project's machine a 1-rank dispatch of
//! that size took 61 ms, the fault handler and the kernel's page
//! bookkeeping first in its profile (perf), and 37 ms with the buffers
//! kept (bench/RESULTS.md, issue 18). Buffers that do not leave the call (the packed send
//! buffer, what the all-to-all-v delivers before it is regrouped, the
//! two-level phases' buffers) are taken from and given back to this pool
//! instead; what the caller receives (the experts' inputs, the combined
//! output) comes from it too and returns to it if the caller hands it back
//! (`Dispatcher::recycle`).

use std::any::Any;
use std::sync::Mutex;

use crate::types::Element;

/// Most buffers kept: a layer uses up to 6 at once (dispatch's send and
/// receive buffers and the experts' inputs; combine's regrouped outputs,
/// what comes back and the result), the two-level phases 5 more; beyond
/// this the smallest are freed.
const KEPT: usize = 8;

/// Buffers of any element type, reused by type.
#[derive(Default)]
pub(super) struct Pool {
    free: Mutex<Vec<Box<dyn Any + Send>>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kept = self.free.lock().map_or(0, |f| f.len());
        f.debug_struct("Pool").field("kept", &kept).finish()
    }
}

impl Pool {
    /// A buffer of exactly `len` elements whose contents are unspecified
    /// (stale values of an earlier call, or zeros): for output that is
    /// overwritten whole. Reuses the kept buffer of `T` with the largest
    /// capacity.
    pub(super) fn sized<T: Element>(&self, len: usize) -> Vec<T> {
        let mut v = self.take::<T>();
        if v.len() >= len {
            v.truncate(len);
        } else {
            v.resize(len, T::zeroed());
        }
        v
    }

    /// An empty buffer with the capacity of a kept one (to extend).
    pub(super) fn empty<T: Element>(&self) -> Vec<T> {
        let mut v = self.take::<T>();
        v.clear();
        v
    }

    /// Keeps `v` for a later call.
    pub(super) fn give<T: Element>(&self, v: Vec<T>) {
        if v.capacity() == 0 {
            return;
        }
        let Ok(mut free) = self.free.lock() else {
            return;
        };
        free.push(Box::new(v));
        if free.len() > KEPT {
            // Drop the smallest.
            let smallest = (0..free.len())
                .min_by_key(|&i| capacity_of(&*free[i]))
                .expect("not empty");
            free.swap_remove(smallest);
        }
    }

    fn take<T: Element>(&self) -> Vec<T> {
        let Ok(mut free) = self.free.lock() else {
            return Vec::new();
        };
        let best = (0..free.len())
            .filter(|&i| free[i].is::<Vec<T>>())
            .max_by_key(|&i| capacity_of(&*free[i]));
        match best {
            Some(i) => *free
                .swap_remove(i)
                .downcast::<Vec<T>>()
                .expect("checked the type"),
            None => Vec::new(),
        }
    }
}

/// Bytes a kept buffer holds.
fn capacity_of(b: &(dyn Any + Send)) -> usize {
    macro_rules! try_types {
        ($($t:ty),*) => {$(
            if let Some(v) = b.downcast_ref::<Vec<$t>>() {
                return v.capacity() * std::mem::size_of::<$t>();
            }
        )*};
    }
    try_types!(f32, f64, half::f16, half::bf16, i8, i32, i64, u8, u32, u64);
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_by_type_and_keep_their_memory() {
        let pool = Pool::default();
        let v: Vec<f32> = pool.sized(1000);
        assert_eq!(v.len(), 1000);
        let ptr = v.as_ptr();
        pool.give(v);
        // Another type does not get it.
        assert_eq!(pool.empty::<u8>().capacity(), 0);
        let again: Vec<f32> = pool.sized(10);
        assert_eq!((again.len(), again.as_ptr()), (10, ptr));
        pool.give(again);
        let grown: Vec<f32> = pool.sized(2000);
        assert_eq!(grown.len(), 2000);
        for i in 0..2 * KEPT {
            pool.give(vec![0u32; i + 1]);
        }
        assert!(pool.free.lock().unwrap().len() <= KEPT);
    }
}
