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

/// Runs every check on `data`.
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

/// Three bytes per step: event kind, worker and layer group; the blocks
/// it names; and a request to query. Eight blocks (with high hash bits
/// set) in two layer groups. Two indexes: one of eight departed slots,
/// so that departures collide, checked for soundness (what it names is
/// right); one of 2^16, where these sixteen blocks have slots of their
/// own, checked exactly against a plain model.
fn index(data: &[u8]) {
    const WORKERS: usize = 3;
    type Id = (u128, u32);
    let mut small = PrefixIndex::new(WORKERS).with_departed_slots(8);
    let mut exact = PrefixIndex::new(WORKERS).with_departed_slots(1 << 16);
    let block = |b: u8| u128::from(b) << 64 | u128::from(b).wrapping_mul(0x9e37_79b9);
    let key = |b: u8, g: u32, i: usize| SliceKey {
        block: BlockHash(block(b)),
        block_index: i as u32,
        layer_group: g,
        head_shard: 0,
    };
    let all: Vec<SliceKey> = (0..16).map(|n| key(n % 8, u32::from(n / 8), 0)).collect();
    let mut slots: Vec<usize> = all.iter().filter_map(|k| exact.departed_slot(k)).collect();
    slots.sort_unstable();
    slots.dedup();
    assert_eq!(
        slots.len(),
        all.len(),
        "the exact index's blocks share slots"
    );
    let mut holders: HashMap<Id, u64> = HashMap::new();
    let mut departed: HashMap<Id, (usize, u32)> = HashMap::new();
    let mut forgets = [0u32; WORKERS];
    for c in data.chunks_exact(3) {
        let (w, g) = (usize::from(c[0] / 4) % WORKERS, u32::from(c[0] / 12 % 2));
        let bit = 1u64 << w;
        let blocks = [c[1] % 8, c[1] / 8 % 8];
        let hashes = blocks.iter().map(|&b| BlockHash(block(b))).collect();
        let mut depart = |id: Id, holders: &mut HashMap<Id, u64>| {
            let set = holders.entry(id).or_default();
            if *set & bit != 0 {
                *set &= !bit;
                if *set == 0 {
                    departed.insert(id, (w, forgets[w]));
                }
            }
        };
        let event = match c[0] % 4 {
            0 => {
                blocks
                    .iter()
                    .for_each(|&b| *holders.entry((block(b), g)).or_default() |= bit);
                Some(WireEvent::Stored {
                    hashes,
                    parent: None,
                    tokens: vec![16; 2],
                    block_size: 16,
                    medium: "GPU".into(),
                    layer_group: g,
                    head_shard: 0,
                    first_block_index: 0,
                })
            }
            1 => {
                blocks
                    .iter()
                    .for_each(|&b| depart((block(b), g), &mut holders));
                Some(WireEvent::Removed {
                    hashes,
                    medium: "GPU".into(),
                    layer_group: g,
                    head_shard: 0,
                })
            }
            2 => {
                let ids: Vec<Id> = holders.keys().copied().collect();
                ids.into_iter().for_each(|id| depart(id, &mut holders));
                Some(WireEvent::Cleared)
            }
            _ => {
                holders.values_mut().for_each(|set| *set &= !bit);
                forgets[w] += 1;
                None
            }
        };
        for index in [&mut small, &mut exact] {
            match &event {
                Some(e) => index.apply(w, e),
                None => index.forget_worker(w),
            }
        }
        let request: Vec<SliceKey> = [c[2] % 8, c[2] / 8 % 8, c[2] / 64]
            .iter()
            .enumerate()
            .map(|(i, &b)| key(b, g, i))
            .collect();
        let id = |k: &SliceKey| (k.block.0, k.layer_group);
        let held = |k: &SliceKey| holders.get(&id(k)).copied().unwrap_or(0);
        let expected: Vec<usize> = (0..WORKERS)
            .map(|w| request.iter().take_while(|k| held(k) >> w & 1 == 1).count())
            .collect();
        // Departed from a worker not forgotten since, and held by none.
        let named = |k: &SliceKey| {
            departed
                .get(&id(k))
                .filter(|&&(w, f)| f == forgets[w] && held(k) == 0)
                .map(|&(w, _)| w)
        };
        for index in [&small, &exact] {
            assert_eq!(index.overlaps(&request), expected);
        }
        if let Some((depth, w)) = small.last_holder(&request) {
            assert_eq!(
                named(&request[depth - 1]),
                Some(w),
                "{:?}",
                request[depth - 1]
            );
        }
        let deepest = (0..request.len())
            .rev()
            .find_map(|d| named(&request[d]).map(|w| (d + 1, w)));
        assert_eq!(exact.last_holder(&request), deepest);
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
