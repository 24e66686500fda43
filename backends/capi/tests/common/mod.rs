//! What the tests that leave Rust share: finding the built libraries and
//! the external tools, failing or skipping by `KVSLICE_REQUIRE_*`.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The crate's directory.
pub fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The profile directory cargo built this test into (`target/release`),
/// which holds `libkvslice_capi.a` and `.so`, built with the test.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<test>")
        .to_path_buf()
}

/// A library of this crate as cargo built it for this test run (in
/// `deps/`: the copies next to it are only refreshed by `cargo build`).
pub fn library(name: &str) -> PathBuf {
    let path = profile_dir().join("deps").join(name);
    assert!(
        path.exists(),
        "{} is missing: cargo builds it with the tests",
        path.display()
    );
    path
}

/// Whether `tool --version` runs. Without it the test fails when
/// `KVSLICE_REQUIRE_<thing>=1`, and otherwise prints SKIPPED and why.
pub fn tool_present(test: &str, tool: &str, thing: &str) -> bool {
    let present = Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !present {
        let var = format!("KVSLICE_REQUIRE_{thing}");
        assert!(
            std::env::var(&var).as_deref() != Ok("1"),
            "{test}: {var}=1 but `{tool}` does not run"
        );
        eprintln!("{test}: SKIPPED, `{tool}` does not run; set {var}=1 to fail instead");
    }
    present
}

/// Runs `cmd`, failing the test with its output if it does not succeed.
pub fn run(what: &str, cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}
