//! The wire decoder on arbitrary bytes, the encoder on arbitrary events,
//! and the router's index on arbitrary event streams. Checked: decoding
//! never panics; a batch the decoder accepts encodes to bytes that decode
//! to the same batch; per-block events folded, encoded and decoded name
//! the same blocks in the same order; the index agrees with a plain model
//! of who holds what and who held it last.

use std::collections::HashMap;

use kvslice_core::events::{KvEvent, Medium};
use kvslice_core::{BlockHash, SliceKey};

use crate::index::PrefixIndex;
use crate::wire::{self, WireEvent};

/// Runs both checks on `data`.
pub fn payload(data: &[u8]) {
    if let Ok(batch) = wire::decode(data) {
        let again = wire::decode(&wire::encode(batch.ts, &batch.events))
            .expect("an accepted batch re-encodes to a valid one");
        assert_eq!(again.events, batch.events);
        assert_eq!(again.ts.to_bits(), batch.ts.to_bits());
    }
    events(data);
    index(data);
}

/// Three bytes per step: event kind and worker, the blocks it names, and
/// a request to query. Eight blocks and eight departed slots, so that
/// blocks move between workers and departures collide.
fn index(data: &[u8]) {
    const WORKERS: usize = 3;
    let mut index = PrefixIndex::new(WORKERS).with_departed_slots(8);
    let mut holders: HashMap<u128, u64> = HashMap::new();
    let mut departed: HashMap<u128, (usize, u32)> = HashMap::new();
    let mut clears = [0u32; WORKERS];
    let key = |b: u128, i: usize| SliceKey {
        block: BlockHash(b),
        block_index: i as u32,
        layer_group: 0,
        head_shard: 0,
    };
    for c in data.chunks_exact(3) {
        let w = usize::from(c[0] / 3) % WORKERS;
        let bit = 1u64 << w;
        let blocks = [u128::from(c[1] % 8), u128::from(c[1] / 8 % 8)];
        let hashes = blocks.iter().map(|&b| BlockHash(b)).collect();
        let event = match c[0] % 3 {
            0 => WireEvent::Stored {
                hashes,
                parent: None,
                tokens: vec![16; 2],
                block_size: 16,
                medium: "GPU".into(),
                layer_group: 0,
                head_shard: 0,
                first_block_index: 0,
            },
            1 => WireEvent::Removed {
                hashes,
                medium: "GPU".into(),
                layer_group: 0,
                head_shard: 0,
            },
            _ => WireEvent::Cleared,
        };
        index.apply(w, &event);
        match event {
            WireEvent::Stored { .. } => blocks
                .iter()
                .for_each(|b| *holders.entry(*b).or_default() |= bit),
            WireEvent::Removed { .. } => {
                for b in blocks {
                    let set = holders.entry(b).or_default();
                    if *set & bit != 0 {
                        *set &= !bit;
                        if *set == 0 {
                            departed.insert(b, (w, clears[w]));
                        }
                    }
                }
            }
            WireEvent::Cleared => {
                holders.values_mut().for_each(|set| *set &= !bit);
                clears[w] += 1;
            }
        }
        let request: Vec<SliceKey> = [c[2] % 8, c[2] / 8 % 8, c[2] / 64]
            .iter()
            .enumerate()
            .map(|(i, &b)| key(u128::from(b), i))
            .collect();
        let held = |b: u128| holders.get(&b).copied().unwrap_or(0);
        let expected: Vec<usize> = (0..WORKERS)
            .map(|w| {
                request
                    .iter()
                    .take_while(|k| held(k.block.0) >> w & 1 == 1)
                    .count()
            })
            .collect();
        assert_eq!(index.overlaps(&request), expected);
        if let Some((depth, w)) = index.last_holder(&request) {
            let b = request[depth - 1].block.0;
            assert_eq!(held(b), 0, "block {b} is still held");
            assert_eq!(departed.get(&b), Some(&(w, clears[w])), "block {b}");
        }
    }
}

/// Six bytes per event: kind, block, index, layer group, head shard,
/// tokens; small ranges so that runs and parents line up often.
fn events(data: &[u8]) {
    let mut made = Vec::new();
    let mut prev: Option<SliceKey> = None;
    for c in data.chunks_exact(6) {
        let key = SliceKey {
            block: BlockHash(u128::from(c[1] % 8) << 64 | u128::from(c[1])),
            block_index: u32::from(c[2] % 4) | if c[2] & 0x80 != 0 { u32::MAX - 3 } else { 0 },
            layer_group: u32::from(c[3] % 2),
            head_shard: u32::from(c[4] % 2),
        };
        let event = match c[0] % 4 {
            0 | 1 => KvEvent::Stored {
                key,
                parent: match c[0] % 4 {
                    0 => prev.map(|p| p.block),
                    _ => (c[5] & 1 == 1).then_some(BlockHash(u128::from(c[5]))),
                },
                tokens: u32::from(c[5]),
            },
            2 => KvEvent::Removed { key },
            _ => KvEvent::Cleared,
        };
        prev = Some(key);
        made.push(event);
    }
    let folded = wire::fold(&made, 16, Medium::Gpu);
    let batch = wire::decode(&wire::encode(0.25, &folded)).expect("encoded batches decode");
    assert_eq!(batch.events, folded);
    // Unfold: the wire events name the blocks the store reported, in order.
    let mut named = Vec::new();
    for e in &batch.events {
        match e {
            WireEvent::Stored { tokens, .. } => named.extend(
                wire::keys(e)
                    .into_iter()
                    .zip(tokens)
                    .map(|(k, &t)| Named::Stored(k, t)),
            ),
            WireEvent::Removed {
                hashes,
                layer_group,
                head_shard,
                ..
            } => named.extend(
                hashes
                    .iter()
                    .map(|&h| Named::Removed(h, *layer_group, *head_shard)),
            ),
            WireEvent::Cleared => named.push(Named::Cleared),
        }
    }
    let expected: Vec<_> = made
        .iter()
        .map(|e| match *e {
            KvEvent::Stored { key, tokens, .. } => Named::Stored(key, tokens),
            KvEvent::Removed { key } => Named::Removed(key.block, key.layer_group, key.head_shard),
            KvEvent::Cleared => Named::Cleared,
        })
        .collect();
    assert_eq!(named, expected);
}

/// A block as a consumer's index sees it: removals carry no index.
#[derive(Debug, PartialEq)]
enum Named {
    Stored(SliceKey, u32),
    Removed(BlockHash, u32, u32),
    Cleared,
}
