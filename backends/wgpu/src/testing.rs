//! The project's rule for GPU tests, in one place: a test that needs an
//! adapter either gets one, or says why it skipped; with
//! `KVSLICE_REQUIRE_GPU=1` (CI sets it) a missing adapter fails the test.

use crate::WgpuEngine;

/// An engine on the environment's adapter, printing which one; or `None`
/// after printing why there is none. Panics instead when
/// `KVSLICE_REQUIRE_GPU=1`.
///
/// ```no_run
/// let Some(engine) = kvslice_wgpu::testing::engine_or_skip("my_test") else { return };
/// assert!(!engine.adapter().name.is_empty());
/// ```
pub fn engine_or_skip(test: &str) -> Option<WgpuEngine> {
    match WgpuEngine::new() {
        Ok(e) => {
            let a = e.adapter();
            println!(
                "{test}: adapter {} ({}, {}, shader_f16 {}, subgroups {} of {:?})",
                a.name, a.backend, a.device_type, a.shader_f16, a.subgroups, a.subgroup_sizes
            );
            Some(e)
        }
        Err(err) if required() => panic!("{test}: KVSLICE_REQUIRE_GPU=1 but no adapter: {err}"),
        Err(err) => {
            // Straight to stderr: the test harness captures `eprintln!` of
            // passing tests, and a skip must be seen.
            use std::io::Write as _;
            let _ = writeln!(
                std::io::stderr(),
                "{test}: SKIPPED, no wgpu adapter ({err}); set KVSLICE_REQUIRE_GPU=1 to fail instead"
            );
            None
        }
    }
}

/// Whether `KVSLICE_REQUIRE_GPU=1` is set.
pub fn required() -> bool {
    std::env::var("KVSLICE_REQUIRE_GPU").as_deref() == Ok("1")
}
