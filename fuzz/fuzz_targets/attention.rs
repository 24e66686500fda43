//! Fuzz target: see `kvslice_cpu::fuzzing::attention`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kvslice_cpu::fuzzing::attention(data));
