//! The attention fuzz corpus, replayed through the harness the fuzz target
//! runs, plus random inputs.

use kvslice_core::testkit::{Rng, fuzz_seeds};
use kvslice_cpu::fuzzing::attention;

#[test]
fn attention_corpus_replays_cleanly() {
    for (_, data) in fuzz_seeds("attention", 1) {
        attention(&data);
    }
}

#[test]
fn random_inputs_pass() {
    let mut rng = Rng::new(11);
    for _ in 0..300 {
        let data: Vec<u8> = (0..rng.below(512)).map(|_| rng.next_u64() as u8).collect();
        attention(&data);
    }
}
