//! The attention fuzz corpus, replayed through the harness the fuzz target
//! runs, plus random inputs.

use std::path::Path;

use kvslice_core::testkit::Rng;
use kvslice_cpu::fuzzing::attention;

#[test]
fn attention_corpus_replays_cleanly() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/attention");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        attention(&std::fs::read(entry.unwrap().path()).unwrap());
        n += 1;
    }
    assert!(n > 0, "no seeds in {}", dir.display());
}

#[test]
fn random_inputs_pass() {
    let mut rng = Rng::new(11);
    for _ in 0..300 {
        let data: Vec<u8> = (0..rng.below(512)).map(|_| rng.next_u64() as u8).collect();
        attention(&data);
    }
}
