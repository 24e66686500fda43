//! Fuzz target: see `kvslice_capi::fuzzing::calls`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    kvslice_capi::fuzzing::calls(data);
});
