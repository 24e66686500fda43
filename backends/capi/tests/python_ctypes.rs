//! `tests/ctypes_smoke.py` drives the shared library from Python through
//! ctypes (standard library only). Needs `python3`
//! (`KVSLICE_REQUIRE_PYTHON=1` makes a missing one a failure).

mod common;

use std::process::Command;

use common::{crate_dir, library, run, tool_present};

#[test]
fn python_uses_the_abi_through_ctypes() {
    if !tool_present("python_ctypes", "python3", "PYTHON") {
        return;
    }
    let out = run(
        "tests/ctypes_smoke.py",
        Command::new("python3")
            .arg(crate_dir().join("tests/ctypes_smoke.py"))
            .arg(library("libkvslice_capi.so")),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    print!("{stdout}");
    assert!(
        stdout.contains("request B 2;") && stdout.trim_end().ends_with("ok"),
        "{stdout}"
    );
}
