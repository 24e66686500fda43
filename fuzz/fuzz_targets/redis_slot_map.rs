//! Fuzz target: see `kvslice_redis::fuzzing::slot_map`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kvslice_redis::fuzzing::slot_map(data));
