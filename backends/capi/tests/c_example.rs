//! `examples/prefix_reuse.c` built with the system C compiler against the
//! static library, run, and run again under AddressSanitizer and
//! UndefinedBehaviorSanitizer. Needs `cc` (`KVSLICE_REQUIRE_CC=1` makes a
//! missing one a failure).

mod common;

use std::process::Command;

use common::{crate_dir, library, profile_dir, run, tool_present};

/// Compiles the example with `flags` and returns its standard output.
fn build_and_run(name: &str, flags: &[&str]) -> String {
    let exe = profile_dir().join(name);
    let mut cc = Command::new("cc");
    cc.args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-g"])
        .args(flags)
        .arg("-I")
        .arg(crate_dir().join("include"))
        .arg(crate_dir().join("examples/prefix_reuse.c"))
        .arg(library("libkvslice_capi.a"))
        .args(["-lpthread", "-ldl", "-lm", "-o"])
        .arg(&exe);
    run("compiling examples/prefix_reuse.c", &mut cc);
    let out = run(
        name,
        Command::new(&exe)
            // Leaks are errors; a sanitizer report fails the run.
            .env("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=1")
            .env("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1"),
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("Sanitizer") && !stderr.contains("runtime error"),
        "{name}: sanitizer report:\n{stderr}"
    );
    print!("{name}:\n{stdout}");
    stdout
}

fn check(stdout: &str) {
    assert!(stdout.contains("request A:") && stdout.contains("request B:"));
    assert!(stdout.contains("2 cached blocks reused"), "{stdout}");
    assert!(
        stdout.contains("events: 2 stored, 0 removed, 0 dropped"),
        "{stdout}"
    );
    assert_eq!(stdout.lines().last(), Some("ok"), "{stdout}");
}

#[test]
fn c_example_reuses_a_prefix_and_matches_direct_attention() {
    if tool_present("c_example", "cc", "CC") {
        check(&build_and_run("prefix_reuse", &[]));
    }
}

#[test]
fn c_example_is_clean_under_asan_and_ubsan() {
    if tool_present("c_example_sanitized", "cc", "CC") {
        check(&build_and_run(
            "prefix_reuse_sanitized",
            &[
                "-fsanitize=address,undefined",
                "-fno-sanitize-recover=all",
                "-fno-omit-frame-pointer",
            ],
        ));
    }
}
