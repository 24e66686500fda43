//! Fuzz target: see `kvslice_core::fuzzing::cache_store`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kvslice_core::fuzzing::cache_store(data));
