//! The wire decoder on arbitrary bytes, and the encoder on arbitrary
//! events. Checked: decoding never panics; a batch the decoder accepts
//! encodes to bytes that decode to the same batch; per-block events folded,
//! encoded and decoded name the same blocks in the same order.

use kvslice_core::events::{KvEvent, Medium};
use kvslice_core::{BlockHash, SliceKey};

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
