//! Fuzz target: see `kvslice_core::fuzzing::slice_map`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kvslice_core::fuzzing::slice_map(data));
