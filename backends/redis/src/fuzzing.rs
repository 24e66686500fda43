//! The value decoder's fuzz harness, shared by the cargo-fuzz target
//! `redis_value` and the stable corpus replay.

use kvslice_core::{BlockHash, KeyOrder, KvDtype, KvLayout, LayoutSpec, SliceKey};

use crate::value;

/// Decodes `data` as a value under a small layout: it is refused, or it
/// is exactly what re-encoding gives back. The first bytes pick the
/// layout's dtype and key order; a valid value built from the rest is
/// decoded too, and any one-byte corruption of it is refused.
pub fn value_decode(data: &[u8]) {
    let (&pick, rest) = data.split_first().unwrap_or((&0, &[]));
    let dtype = KvDtype::ALL[usize::from(pick) % KvDtype::ALL.len()];
    let order = if pick & 4 == 0 {
        KeyOrder::TokenMajor
    } else {
        KeyOrder::DimMajor
    };
    let layout =
        KvLayout::new(LayoutSpec::new(1, 2, 1, 4, 4, dtype).with_key_order(order)).expect("layout");
    let key = SliceKey {
        block: BlockHash(0x5eed),
        block_index: 1,
        layer_group: 0,
        head_shard: 0,
    };
    if let Ok((tokens, page)) = value::decode(&layout, &key, rest) {
        let mut again = Vec::new();
        value::encode(&layout, &key, tokens, page, &mut again);
        assert_eq!(again, rest, "a decoded value re-encodes to itself");
    }
    // A valid value over bytes from the input, then one byte of it flipped.
    let page: Vec<u8> = (0..layout.page_bytes())
        .map(|i| rest.get(i).copied().unwrap_or(i as u8))
        .collect();
    let tokens = 1 + u32::from(pick >> 6);
    let mut v = Vec::new();
    value::encode(&layout, &key, tokens, &page, &mut v);
    assert_eq!(value::decode(&layout, &key, &v), Ok((tokens, &page[..])));
    if let Some(&at) = rest.first() {
        let i = usize::from(at) * 7 % v.len();
        v[i] ^= 1 << (pick % 8);
        assert!(value::decode(&layout, &key, &v).is_err(), "flip at {i}");
    }
}
