//! The ABI call-sequence fuzz harness (`fuzz/fuzz_targets/capi.rs`) on its
//! committed seeds and on random inputs: stable Rust, no fuzzer needed.

use kvslice_capi::fuzzing;
use kvslice_core::testkit::{Rng, fuzz_seeds};

#[test]
fn seeds_replay_cleanly() {
    for (_, data) in fuzz_seeds("capi", 1) {
        fuzzing::calls(&data);
    }
}

#[test]
fn random_call_sequences_keep_every_rule() {
    let mut rng = Rng::new(7);
    let mut reached = fuzzing::Reached::default();
    for _ in 0..400 {
        let len = (rng.next_u64() % 1500) as usize;
        let data: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        for (total, n) in reached.iter_mut().zip(fuzzing::calls(&data)) {
            *total += n;
        }
    }
    println!("successful calls per operation: {reached:?}");
    // Random bytes reach the deep paths, not only refusals: lookups,
    // allocations, publishes, writes and attention all succeed sometimes.
    for (op, name) in [
        (6, "lookup"),
        (7, "allocate"),
        (8, "publish"),
        (12, "write"),
        (13, "attend"),
    ] {
        assert!(
            reached[op] > 0,
            "no successful {name} in 400 random runs: {reached:?}"
        );
    }
}
