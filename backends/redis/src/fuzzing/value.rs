//! The value decoder's harness: arbitrary bytes as a value, and valid
//! values with one byte flipped.

use kvslice_core::{BlockHash, KeyOrder, KvDtype, KvLayout, LayoutSpec, SliceKey};

use crate::value::{self, ValueError};

/// Decodes `data` as a value under a small layout: it is refused, or it
/// is exactly what re-encoding gives back. The first bytes pick the
/// layout's dtype and key order; a valid value built from the rest is
/// decoded too, and any one-byte corruption of it is refused. The same
/// corruption with the checksum made good again reaches the field checks
/// behind it: refused for the field the byte belongs to, or (a valid-token
/// count still in range, a page byte) decoded as what it now says.
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
        let bit = 1 << (pick % 8);
        v[i] ^= bit;
        assert!(value::decode(&layout, &key, &v).is_err(), "flip at {i}");
        resealed(&layout, &key, tokens, &page, v, i, bit);
    }
}

/// `v` (the value of `page`) with byte `i` flipped by `bit`: with its
/// checksum recomputed, it decodes as the value's field table says.
fn resealed(
    layout: &KvLayout,
    key: &SliceKey,
    tokens: u32,
    page: &[u8],
    mut v: Vec<u8>,
    i: usize,
    bit: u8,
) {
    if (80..84).contains(&i) {
        return; // the checksum itself
    }
    let crc = crc32c::crc32c_append(crc32c::crc32c(&v[..80]), &v[84..]);
    v[80..84].copy_from_slice(&crc.to_le_bytes());
    let word = |at: usize| u32::from_le_bytes(v[at..at + 4].try_into().expect("4 bytes"));
    let got = value::decode(layout, key, &v);
    match i {
        4 => assert_eq!(got, Err(ValueError::Version(v[4]))),
        0..8 => assert_eq!(got, Err(ValueError::Format)),
        8..44 => assert!(matches!(got, Err(ValueError::Layout { .. })), "{got:?}"),
        44..72 => assert_eq!(got, Err(ValueError::Key)),
        72..76 => {
            let t = word(72);
            if (1..=layout.block_tokens()).contains(&t) {
                assert_eq!(got, Ok((t, page)));
            } else {
                assert_eq!(got, Err(ValueError::Shape));
            }
        }
        76..80 => {
            let stated = word(76) as usize;
            if stated > page.len() {
                let needed = value::HEADER_BYTES + stated;
                assert_eq!(
                    got,
                    Err(ValueError::Truncated {
                        len: v.len(),
                        needed
                    })
                );
            } else {
                assert_eq!(got, Err(ValueError::Shape));
            }
        }
        _ => {
            let mut changed = page.to_vec();
            changed[i - value::HEADER_BYTES] ^= bit;
            assert_eq!(got, Ok((tokens, &changed[..])));
        }
    }
}
