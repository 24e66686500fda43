//! The fuzz harnesses (`fuzz/fuzz_targets/redis_value.rs` and
//! `redis_slot_map.rs`) on their committed seeds and on random inputs, and
//! real values with bytes flipped, cut or added: stable Rust, no fuzzer
//! needed, no Redis.

use kvslice_core::testkit::{Rng, fuzz_seeds};
use kvslice_core::{BlockHash, KvDtype, KvLayout, LayoutSpec, SliceKey};
use kvslice_redis::{fuzzing, value};

type Harness = fn(&[u8]);

/// The harnesses and the seed directories they replay.
const HARNESSES: [(&str, Harness); 2] = [
    ("redis_value", fuzzing::value_decode),
    ("redis_slot_map", fuzzing::slot_map),
];

#[test]
fn seeds_and_random_inputs_pass_the_harnesses() {
    for (i, (name, harness)) in HARNESSES.into_iter().enumerate() {
        for (_, data) in fuzz_seeds(name, 3) {
            harness(&data);
        }
        let mut rng = Rng::new(38 + i as u64);
        for _ in 0..2000 {
            let data: Vec<u8> = (0..rng.below(400)).map(|_| rng.next_u64() as u8).collect();
            harness(&data);
        }
    }
}

#[test]
fn mutated_values_are_refused_or_exact() {
    let layout = KvLayout::new(LayoutSpec::new(2, 2, 1, 8, 4, KvDtype::Bf16)).unwrap();
    let key = SliceKey {
        block: BlockHash(77),
        block_index: 2,
        layer_group: 1,
        head_shard: 0,
    };
    let page: Vec<u8> = (0..layout.page_bytes()).map(|i| (i * 7) as u8).collect();
    let mut good = Vec::new();
    value::encode(&layout, &key, 3, &page, &mut good);
    let mut rng = Rng::new(39);
    let mut refused = 0;
    for _ in 0..5000 {
        let mut v = good.clone();
        match rng.below(3) {
            0 => {
                let i = rng.below(v.len() as u64) as usize;
                v[i] ^= 1 << rng.below(8);
            }
            1 => v.truncate(rng.below(v.len() as u64) as usize),
            _ => v.extend((0..1 + rng.below(8)).map(|_| rng.next_u64() as u8)),
        }
        match value::decode(&layout, &key, &v) {
            Ok(got) => assert_eq!(got, (3, &page[..]), "a changed value decoded to other data"),
            Err(_) => refused += 1,
        }
    }
    assert_eq!(refused, 5000, "every change is caught");
}
