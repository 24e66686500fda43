//! The binary refuses impossible sizes and unusable paths with a message
//! and a failing exit, before any work: no abort on a huge allocation, no
//! capacity wrapped to a tiny one, no plot that fails after the replays.

use std::process::Command;

const TRACE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/data/conversation_trace.jsonl");

/// Runs `kvslice args`, expects it to fail (1, or 2 for what the
/// argument parser refuses), and returns its stderr.
fn fails(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_kvslice"))
        .args(args)
        .output()
        .expect("run kvslice");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(matches!(out.status.code(), Some(1 | 2)), "{args:?}: {err}");
    err
}

#[test]
fn impossible_capacities_are_errors() {
    // Past a page pool's limit: refused before a policy sizes its tables.
    let err = fails(&[
        "replay",
        "--trace",
        TRACE,
        "--capacity-blocks",
        "4294967295",
    ]);
    assert!(err.contains("2^30 - 2 blocks"), "{err}");
    // The offline oracle sizes its tables too: the same check, no abort.
    let err = fails(&[
        "replay",
        "--trace",
        TRACE,
        "--policy",
        "belady",
        "--capacity-blocks",
        "4294967295",
    ]);
    assert!(err.contains("2^30 - 2 blocks"), "{err}");
    let err = fails(&["serve", "--capacity-pages", "4294967295"]);
    assert!(err.contains("2^30 - 2 blocks"), "{err}");
    // The same memory as int8 would be past 2^32 blocks: not wrapped.
    let err = fails(&[
        "replay",
        "--trace",
        TRACE,
        "--capacity-blocks",
        "2214592514",
        "--kv-dtype",
        "int8",
        "--policy",
        "lru",
    ]);
    assert!(err.contains("2^30 - 2 blocks"), "{err}");
    // Five workers' memory as one store would wrap a u32.
    let err = fails(&[
        "route",
        "--trace",
        TRACE,
        "--workers",
        "5",
        "--capacity-blocks",
        "858993460",
    ]);
    assert!(err.contains("5 workers of 858993460 blocks"), "{err}");
    let err = fails(&[
        "tier",
        "--trace",
        TRACE,
        "--setups",
        "pooled",
        "--replicas",
        "5",
        "--capacity-blocks",
        "858993460",
    ]);
    assert!(err.contains("past 2^32 blocks"), "{err}");
}

/// An option the tier's replay cannot honour is refused before it
/// connects (nothing listens on port 1), not silently ignored.
#[test]
fn replay_with_a_tier_refuses_what_it_cannot_print() {
    let err = fails(&[
        "replay",
        "--trace",
        TRACE,
        "--tier",
        "redis://127.0.0.1:1",
        "--by-hits",
    ]);
    assert!(err.contains("--by-hits"), "{err}");
}

#[test]
fn a_plot_into_a_missing_folder_is_refused_first() {
    let err = fails(&[
        "sweep",
        "--trace",
        TRACE,
        "--capacity-blocks",
        "100",
        "--out",
        "/nonexistent-kvslice-folder/x.svg",
    ]);
    assert!(err.contains("no such folder"), "{err}");
    assert!(!err.contains("plotting"), "it replayed first: {err}");
}

#[test]
fn options_a_command_does_not_use_are_refused() {
    let err = fails(&["route", "--trace", TRACE, "--threads", "2"]);
    assert!(err.contains("--threads"), "{err}");
}

/// The model commands check their options before loading a model: with
/// no model at the path, each still names the bad option, not the model.
#[test]
fn model_commands_refuse_bad_options_before_the_model() {
    let nowhere = "/nonexistent/kvslice-test/model.gguf";
    let generate = |extra: &[&str]| {
        let mut args = vec!["generate", "--model", nowhere, "--prompt", "hi"];
        args.extend_from_slice(extra);
        fails(&args)
    };
    let err = generate(&["--max-prompt-tokens", "8", "--truncate", "sinks:x"]);
    assert!(err.contains("--truncate \"sinks:x\""), "{err}");
    let err = generate(&["--max-prompt-tokens", "0"]);
    assert!(err.contains("zero tokens"), "{err}");
    let err = generate(&["--max-prompt-tokens", "8", "--truncate", "sinks:8"]);
    assert!(err.contains("sink tokens"), "{err}");
    let err = generate(&["--kv-dtype", "int4"]);
    assert!(err.contains("unknown K/V dtype"), "{err}");
    for command in ["profile", "model-bench"] {
        let err = fails(&[command, "--model", nowhere, "--kv-dtype", "int4"]);
        assert!(err.contains("unknown K/V dtype"), "{command}: {err}");
        let err = fails(&[command, "--model", nowhere, "--engine", "tpu"]);
        assert!(err.contains("tpu"), "{command}: {err}");
    }
    let err = fails(&["kv-accuracy", "--model", nowhere, "--engine", "tpu"]);
    assert!(err.contains("tpu"), "{err}");
    // A good command line gets as far as the model, and names it.
    let err = generate(&["--max-prompt-tokens", "8", "--truncate", "sinks:2"]);
    assert!(err.contains("no model at"), "{err}");
}
