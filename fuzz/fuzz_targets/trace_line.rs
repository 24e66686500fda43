//! Fuzz target: see `kvslice_benches::trace::fuzz_trace_line`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kvslice_benches::trace::fuzz_trace_line(data));
