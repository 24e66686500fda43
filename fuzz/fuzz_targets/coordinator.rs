//! Fuzz target: see `kvslice_core::fuzzing::coordinator`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kvslice_core::fuzzing::coordinator(data));
