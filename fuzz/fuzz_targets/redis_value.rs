//! Fuzz target: see `kvslice_redis::fuzzing::value_decode`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    kvslice_redis::fuzzing::value_decode(data);
});
