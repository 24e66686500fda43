//! Fuzz target: see `kvslice_core::fuzzing::attention`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kvslice_core::fuzzing::attention(data));
