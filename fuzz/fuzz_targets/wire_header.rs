//! Arbitrary bytes as a frame header: decoding never panics, and what
//! decodes encodes back to the same header.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ferrocoll::fuzzing::wire_header(data);
});
