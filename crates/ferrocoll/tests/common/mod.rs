//! Helpers shared by the integration tests.

#![allow(dead_code)] // each test crate uses its own subset

use ferrocoll::{Algorithm, Collective};

/// Whether `FERROCOLL_TEST_ALGOS` (if set) selects `algo` for `coll`:
/// `hd,allgather:bruck` selects hd wherever it exists and bruck for
/// allgather only. Unset selects everything.
pub fn selected(coll: Collective, algo: Algorithm) -> bool {
    let Ok(spec) = std::env::var("FERROCOLL_TEST_ALGOS") else {
        return true;
    };
    spec.split(',')
        .map(str::trim)
        .any(|entry| match entry.split_once(':') {
            Some((c, a)) => Collective::from_name(c) == Some(coll) && a == algo.name(),
            None => entry == algo.name(),
        })
}

/// ceil(log2 n), 0 for n <= 1.
pub fn ceil_log2(n: usize) -> usize {
    n.next_power_of_two().trailing_zeros() as usize
}
