//! The trace_line fuzz corpus, replayed through the same harness the fuzz
//! target runs, plus every line of the repository's traces.

use std::path::Path;

use kvslice_benches::trace::{Trace, fuzz_trace_line};

#[test]
fn trace_line_corpus_replays_cleanly() {
    for (_, data) in kvslice_core::testkit::fuzz_seeds("trace_line", 1) {
        fuzz_trace_line(&data);
    }
}

#[test]
fn repository_traces_parse_completely() {
    for (name, requests, blocks) in [
        ("conversation", 12_031, 288_500),
        ("synthetic", 3_993, 121_877),
    ] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("data/{name}_trace.jsonl"));
        let trace = Trace::read(
            std::io::BufReader::new(std::fs::File::open(path).unwrap()),
            false,
        )
        .unwrap();
        assert_eq!(
            (trace.requests.len(), trace.blocks(), trace.skipped_lines),
            (requests, blocks, 0)
        );
    }
}
