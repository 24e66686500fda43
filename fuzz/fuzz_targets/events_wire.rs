//! Fuzz target: see `kvslice_events::fuzzing::payload`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    kvslice_events::fuzzing::payload(data);
});
