//! The key-value store ranks meet at during start-up, as a trait.
//!
//! [`crate::init()`] uses ferrocoll's own store ([`crate::store`], served by
//! rank 0), but a framework that already has one can hand it in instead:
//! `torch.distributed` gives every backend a `c10d::Store` (torchrun's
//! TCPStore, a FileStore, a PrefixStore per group), and a second rendezvous
//! port beside it would be one more thing to open in a firewall and to get
//! wrong. [`crate::init::init_with_rendezvous`] builds a communicator over any
//! [`Rendezvous`].
//!
//! Start-up needs only three operations: publish a value, wait for values
//! others publish, and a counter (for barriers). Every key is written once
//! per job; waits are bounded by the store's own timeout.

use crate::error::{Error, Result};

/// A key-value store every rank of a job can reach during start-up.
///
/// Implementations must be safe to call from the thread running
/// [`crate::init::init_with_rendezvous`]; they are dropped when the
/// communicator is (a store served by one of the ranks must outlive the
/// start-up of every other rank).
pub trait Rendezvous: Send {
    /// Sets `key` to `value` (keys are written once per job).
    fn set(&mut self, key: &str, value: &[u8]) -> Result<()>;

    /// Waits until every key is set and returns their values in order. A
    /// wait past the store's timeout is an error saying which keys were
    /// missing.
    fn wait(&mut self, keys: &[&str]) -> Result<Vec<Vec<u8>>>;

    /// Adds `delta` to the counter `key` (absent counts as 0) and returns the
    /// new value.
    fn add(&mut self, key: &str, delta: i64) -> Result<i64>;

    /// Where the store is, for error messages (`host:port`, a file, ...).
    fn describe(&self) -> String;

    /// Which of `keys` are not set now, by index, when the store can tell
    /// without waiting (`None`: it cannot). Start-up asks after a wait
    /// failed, to say which ranks did not arrive.
    fn missing(&mut self, _keys: &[&str]) -> Option<Vec<usize>> {
        None
    }

    /// Waits until `size` callers have called `barrier(name, size)`. A name
    /// serves one barrier only.
    fn barrier(&mut self, name: &str, size: usize) -> Result<()> {
        let done = arrive(self, name, size)?;
        self.wait(&[&done]).map(drop)
    }
}

/// The arrival half of a barrier built from `add` and `set`: counts this
/// caller in `"<name>/count"`, and the one that brings it to `size` sets
/// `"<name>/done"`, whose key it returns for the caller to wait on. More
/// than `size` arrivals is an [`Error::InvalidArgument`].
pub(crate) fn arrive<S: Rendezvous + ?Sized>(
    store: &mut S,
    name: &str,
    size: usize,
) -> Result<String> {
    if size == 0 {
        return Err(Error::invalid(format!(
            "barrier `{name}` of size 0: a barrier needs at least one participant"
        )));
    }
    let done_key = format!("{name}/done");
    let arrived = store.add(&format!("{name}/count"), 1)?;
    if arrived > size as i64 || arrived < 1 {
        return Err(Error::invalid(format!(
            "barrier `{name}` in the store at {} counted {arrived} arrivals for a size of \
             {size}: a barrier name was used twice, or the ranks disagree on the size",
            store.describe()
        )));
    }
    if arrived == size as i64 {
        store.set(&done_key, b"1")?;
    }
    Ok(done_key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A store in memory for one caller, to test the default barrier.
    #[derive(Default)]
    struct Map(HashMap<String, Vec<u8>>);

    impl Rendezvous for Map {
        fn set(&mut self, key: &str, value: &[u8]) -> Result<()> {
            self.0.insert(key.into(), value.into());
            Ok(())
        }
        fn wait(&mut self, keys: &[&str]) -> Result<Vec<Vec<u8>>> {
            keys.iter()
                .map(|k| {
                    self.0
                        .get(*k)
                        .cloned()
                        .ok_or_else(|| Error::invalid(format!("{k} never set")))
                })
                .collect()
        }
        fn add(&mut self, key: &str, delta: i64) -> Result<i64> {
            let now = self
                .0
                .get(key)
                .map_or(0, |v| String::from_utf8_lossy(v).parse().unwrap())
                + delta;
            self.0.insert(key.into(), now.to_string().into_bytes());
            Ok(now)
        }
        fn describe(&self) -> String {
            "memory".into()
        }
    }

    #[test]
    fn the_default_barrier_releases_the_last_arrival_and_refuses_an_extra_one() {
        let mut store = Map::default();
        store.barrier("b", 1).unwrap();
        let again = store.barrier("b", 1).unwrap_err().to_string();
        assert!(again.contains("counted 2 arrivals"), "{again}");
        assert!(store.barrier("z", 0).is_err());
        // Size 2 with one caller: the done key never appears.
        assert!(store.barrier("c", 2).is_err());
    }
}
