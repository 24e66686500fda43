//! The wire fuzz harness (`fuzz/fuzz_targets/events_wire.rs`) on its
//! committed seeds and on random and mutated inputs: stable Rust, no
//! fuzzer needed.

use kvslice_core::events::{KvEvent, Medium};
use kvslice_core::testkit::{Rng, fuzz_seeds};
use kvslice_core::{BlockHash, SliceKey};
use kvslice_events::{fuzzing, wire};

#[test]
fn seeds_replay_cleanly() {
    let mut accepted = 0;
    for (_, data) in fuzz_seeds("events_wire", 3) {
        accepted += usize::from(wire::decode(&data).is_ok());
        fuzzing::payload(&data);
    }
    assert!(accepted >= 2, "the seeds include valid batches");
}

/// A real batch with one byte changed, cut short, or extended, many times:
/// the decoder refuses or accepts, and never panics.
#[test]
fn mutated_batches_never_panic() {
    let key = |b: u128, i| SliceKey {
        block: BlockHash(b),
        block_index: i,
        layer_group: 0,
        head_shard: 0,
    };
    let events = [
        KvEvent::Stored {
            key: key(1, 0),
            parent: None,
            tokens: 16,
        },
        KvEvent::Stored {
            key: key(2, 1),
            parent: Some(BlockHash(1)),
            tokens: 16,
        },
        KvEvent::Removed { key: key(1, 0) },
        KvEvent::Cleared,
    ];
    let good = wire::encode(12.5, &wire::fold(&events, 16, Medium::Cpu));
    let mut rng = Rng::new(11);
    let (mut ok, mut refused) = (0, 0);
    for _ in 0..20_000 {
        let mut data = good.clone();
        match rng.next_u64() % 3 {
            0 => {
                let at = (rng.next_u64() % data.len() as u64) as usize;
                data[at] = rng.next_u64() as u8;
            }
            1 => data.truncate((rng.next_u64() % data.len() as u64) as usize),
            _ => data.extend((0..rng.next_u64() % 8).map(|_| rng.next_u64() as u8)),
        }
        match wire::decode(&data) {
            Ok(_) => ok += 1,
            Err(_) => refused += 1,
        }
        fuzzing::payload(&data);
    }
    println!("accepted {ok}, refused {refused}");
    assert!(ok > 0 && refused > 0, "accepted {ok}, refused {refused}");
}

#[test]
fn random_bytes_keep_every_rule() {
    let mut rng = Rng::new(5);
    for _ in 0..2_000 {
        let len = (rng.next_u64() % 400) as usize;
        let data: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        fuzzing::payload(&data);
    }
}
