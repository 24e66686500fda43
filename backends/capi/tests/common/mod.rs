//! What the C ABI's tests share: plans and keys, and, for those that leave
//! Rust, finding the built libraries and
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

/// The message of this thread's last failed call.
pub fn last_error() -> String {
    // SAFETY: kvs_last_error returns a NUL-terminated string.
    unsafe { std::ffi::CStr::from_ptr(kvslice_capi::kvs_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// A plan of all of `tokens`, lane (0, 0), no salt; it points into
/// `tokens`, which must outlive it.
pub fn whole_plan(tokens: &[u32]) -> kvslice_capi::KvsPlanRequest {
    kvslice_capi::KvsPlanRequest {
        tokens: tokens.as_ptr(),
        n_tokens: tokens.len(),
        salt: std::ptr::null(),
        salt_len: 0,
        range_start: 0,
        range_end: 0,
        layer_group: 0,
        head_shard: 0,
    }
}

/// The keys of `tokens` in lane (0, 0) of `layout`, one per block (room
/// for `blocks`), planned by a coordinator with a secret of `secret`s.
pub fn plan_keys(
    layout: kvslice_capi::KvsLayout,
    secret: u8,
    tokens: &[u32],
    blocks: usize,
) -> Vec<kvslice_capi::KvsKey> {
    use kvslice_capi::*;
    let mut coord = KvsCoordinator { id: 0 };
    let mut keys = vec![KvsKey::default(); blocks];
    let plan = whole_plan(tokens);
    let mut info = KvsPlanInfo::default();
    // SAFETY: every pointer is to a live local of the stated size.
    unsafe {
        assert_eq!(
            kvs_coordinator_new(layout, &[secret; 16], &mut coord),
            KvsStatus::Ok
        );
        assert_eq!(
            kvs_plan(coord, &plan, keys.as_mut_ptr(), blocks, &mut info),
            KvsStatus::Ok,
            "{}",
            last_error()
        );
    }
    assert_eq!(kvs_coordinator_destroy(coord), KvsStatus::Ok);
    keys
}

/// One layer, one kv head of width 4 (two query heads), 2-token blocks,
/// f32: the smallest layout attention runs on.
pub fn tiny_layout() -> kvslice_capi::KvsLayout {
    use kvslice_capi::*;
    let spec = KvsLayoutSpec {
        num_layers: 1,
        num_q_heads: 2,
        num_kv_heads: 1,
        head_dim: 4,
        block_tokens: 2,
        dtype: KVS_DTYPE_F32,
        ..Default::default()
    };
    let mut layout = KvsLayout { id: 0 };
    // SAFETY: live locals.
    assert_eq!(unsafe { kvs_layout_new(&spec, &mut layout) }, KvsStatus::Ok);
    layout
}
