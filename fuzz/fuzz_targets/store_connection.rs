//! Arbitrary bytes as one client's stream to the rendezvous store: the
//! framing and the request handler never panic or allocate without bound.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ferrocoll::fuzzing::store_connection(data);
});
