//! Fuzz target: see `kvslice_core::fuzzing::sequence_table`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kvslice_core::fuzzing::sequence_table(data));
