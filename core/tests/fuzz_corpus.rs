//! Every committed fuzz corpus file, replayed through the same harnesses
//! the cargo-fuzz targets run (see `fuzz/README.md`), plus a few hundred
//! random inputs per harness. Stable Rust, no fuzzer needed.

use kvslice_core::fuzzing;
use kvslice_core::testkit::{self, Rng};

type Harness = fn(&[u8]);

const HARNESSES: [(&str, Harness); 5] = [
    ("coordinator", fuzzing::coordinator),
    ("page_pool", fuzzing::page_pool),
    ("slice_map", fuzzing::slice_map),
    ("sequence_table", fuzzing::sequence_table),
    ("cache_store", fuzzing::cache_store),
];

#[test]
fn corpora_replay_cleanly() {
    for (name, harness) in HARNESSES {
        // Under Miri, which interprets every step, the first few seeds.
        let take = if cfg!(miri) { 3 } else { usize::MAX };
        for (_, data) in testkit::fuzz_seeds(name, 1).into_iter().take(take) {
            harness(&data);
        }
    }
}

#[test]
fn random_inputs_pass_every_harness() {
    for (i, (_, harness)) in HARNESSES.iter().enumerate() {
        let mut rng = Rng::new(i as u64);
        // Under Miri, two short inputs per harness.
        let (inputs, longest) = if cfg!(miri) { (2, 256) } else { (300, 2048) };
        for _ in 0..inputs {
            let len = rng.below(longest) as usize;
            let data: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            harness(&data);
        }
    }
}
