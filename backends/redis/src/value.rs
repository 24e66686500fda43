//! What a tier value holds: a versioned header that names the block and
//! the page layout, with a CRC-32C over header and bytes, then the page.
//!
//! | offset | bytes | field |
//! | --- | --- | --- |
//! | 0 | 4 | magic `KVSL` |
//! | 4 | 1 | format version (1) |
//! | 5 | 3 | zero |
//! | 8 | 36 | the layout's nine fingerprint words ([`KvLayout::fingerprint_words`]) |
//! | 44 | 16 | block hash |
//! | 60 | 4 | block index |
//! | 64 | 4 | layer group |
//! | 68 | 4 | head shard |
//! | 72 | 4 | valid tokens |
//! | 76 | 4 | payload length |
//! | 80 | 4 | CRC-32C of bytes 0..80 and the payload |
//! | 84 | .. | the page's bytes |
//!
//! Integers are little-endian. A value is data only if every field matches
//! what the reader expects; anything else is a [`ValueError`], which the
//! tier counts as a miss and deletes.

use core::fmt;

use kvslice_core::{BlockHash, KvLayout, SliceKey};

/// The first four bytes of every value.
pub const MAGIC: [u8; 4] = *b"KVSL";
/// The format version this crate writes and reads.
pub const VERSION: u8 = 1;
/// Bytes before the page.
pub const HEADER_BYTES: usize = 84;

/// Why a value is not the block the reader asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValueError {
    /// Shorter than its header, or than the payload length it states.
    Truncated {
        /// Bytes the value has.
        len: usize,
        /// Bytes it needs.
        needed: usize,
    },
    /// Not a kvslice value (no magic, or reserved bytes set).
    Format,
    /// A kvslice value of another format version (this one's is
    /// [`VERSION`]).
    Version(u8),
    /// Written under another page layout (dtype, page size, heads,
    /// head_dim, key order, grouping or shards).
    Layout {
        /// The reader's fingerprint words.
        ours: [u32; 9],
        /// The value's.
        theirs: [u32; 9],
    },
    /// A header naming another block than the key it was stored under.
    Key,
    /// A payload that is not one page, or a valid-token count outside
    /// `1..=block_tokens`.
    Shape,
    /// Bytes that do not match their checksum.
    Checksum,
}

impl fmt::Display for ValueError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Truncated { len, needed } => {
                write!(f, "truncated value: {len} bytes, needs {needed}")
            }
            Self::Format => f.write_str("not a kvslice tier value"),
            Self::Version(v) => write!(
                f,
                "a kvslice tier value of format version {v}, not {VERSION}"
            ),
            Self::Layout { ours, theirs } => write!(
                f,
                "value written under layout {theirs:?}, this store's is {ours:?}"
            ),
            Self::Key => f.write_str("value names another block than its key"),
            Self::Shape => f.write_str("payload or valid-token count does not fit a page"),
            Self::Checksum => f.write_str("checksum mismatch"),
        }
    }
}

impl std::error::Error for ValueError {}

/// Appends the value for `page`, the bytes of block `key` with
/// `valid_tokens` tokens under `layout`, to `out`: [`header`], then `page`.
///
/// ```
/// use kvslice_core::{BlockHash, KvDtype, KvLayout, LayoutSpec, SliceKey};
/// use kvslice_redis::value;
///
/// let layout = KvLayout::new(LayoutSpec::new(1, 1, 1, 2, 4, KvDtype::F32))?;
/// let key = SliceKey { block: BlockHash(7), block_index: 0, layer_group: 0, head_shard: 0 };
/// let page = vec![3u8; layout.page_bytes()];
/// let mut v = Vec::new();
/// value::encode(&layout, &key, 4, &page, &mut v);
/// assert_eq!(value::decode(&layout, &key, &v)?, (4, &page[..]));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn encode(
    layout: &KvLayout,
    key: &SliceKey,
    valid_tokens: u32,
    page: &[u8],
    out: &mut Vec<u8>,
) {
    out.reserve(HEADER_BYTES + page.len());
    out.extend_from_slice(&header(layout, key, valid_tokens, page));
    out.extend_from_slice(page);
}

/// The header of `page`'s value, checksum included: what [`encode`] puts
/// before the page, for writers that send the two without joining them.
pub fn header(
    layout: &KvLayout,
    key: &SliceKey,
    valid_tokens: u32,
    page: &[u8],
) -> [u8; HEADER_BYTES] {
    let mut h = [0u8; HEADER_BYTES];
    h[..4].copy_from_slice(&MAGIC);
    h[4] = VERSION;
    for (i, w) in layout.fingerprint_words().into_iter().enumerate() {
        h[8 + 4 * i..12 + 4 * i].copy_from_slice(&w.to_le_bytes());
    }
    h[44..60].copy_from_slice(&key.block.0.to_le_bytes());
    let words = [
        key.block_index,
        key.layer_group,
        key.head_shard,
        valid_tokens,
        page.len() as u32,
    ];
    for (i, w) in words.into_iter().enumerate() {
        h[60 + 4 * i..64 + 4 * i].copy_from_slice(&w.to_le_bytes());
    }
    let crc = crc32c::crc32c_append(crc32c::crc32c(&h[..80]), page);
    h[80..].copy_from_slice(&crc.to_le_bytes());
    h
}

/// The valid-token count and page bytes of `bytes`, if it is the value of
/// block `key` under `layout` and intact.
pub fn decode<'v>(
    layout: &KvLayout,
    key: &SliceKey,
    bytes: &'v [u8],
) -> Result<(u32, &'v [u8]), ValueError> {
    if bytes.len() < HEADER_BYTES {
        return Err(ValueError::Truncated {
            len: bytes.len(),
            needed: HEADER_BYTES,
        });
    }
    if bytes[4] != VERSION && bytes[..4] == MAGIC {
        return Err(ValueError::Version(bytes[4]));
    }
    if bytes[..4] != MAGIC || bytes[5..8] != [0; 3] {
        return Err(ValueError::Format);
    }
    let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    let block = BlockHash(u128::from_le_bytes(
        bytes[44..60].try_into().expect("16 bytes"),
    ));
    let named = SliceKey {
        block,
        block_index: word(60),
        layer_group: word(64),
        head_shard: word(68),
    };
    let (valid_tokens, payload_len) = (word(72), word(76) as usize);
    let needed = HEADER_BYTES.saturating_add(payload_len);
    if bytes.len() < needed {
        return Err(ValueError::Truncated {
            len: bytes.len(),
            needed,
        });
    }
    let payload = &bytes[HEADER_BYTES..];
    if crc32c::crc32c_append(crc32c::crc32c(&bytes[..80]), payload) != word(80) {
        return Err(ValueError::Checksum);
    }
    // After the checksum: a corrupted fingerprint is damage (and deleted),
    // an intact one of another layout some writer's data (and kept).
    let theirs: [u32; 9] = core::array::from_fn(|i| word(8 + 4 * i));
    let ours = layout.fingerprint_words();
    if theirs != ours {
        return Err(ValueError::Layout { ours, theirs });
    }
    if named != *key {
        return Err(ValueError::Key);
    }
    if payload.len() != layout.page_bytes()
        || payload_len != payload.len()
        || valid_tokens == 0
        || valid_tokens > layout.block_tokens()
    {
        return Err(ValueError::Shape);
    }
    Ok((valid_tokens, payload))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvslice_core::{KvDtype, LayoutSpec};

    fn setup() -> (KvLayout, SliceKey, Vec<u8>) {
        let layout = KvLayout::new(LayoutSpec::new(2, 4, 2, 8, 4, KvDtype::F16)).unwrap();
        let key = SliceKey {
            block: BlockHash(0xfeed_beef << 64 | 3),
            block_index: 3,
            layer_group: 0,
            head_shard: 0,
        };
        let page: Vec<u8> = (0..layout.page_bytes()).map(|i| i as u8).collect();
        let mut v = Vec::new();
        encode(&layout, &key, 3, &page, &mut v);
        (layout, key, v)
    }

    #[test]
    fn every_field_is_checked() {
        let (layout, key, v) = setup();
        assert_eq!(decode(&layout, &key, &v).unwrap().0, 3);
        // Any one byte flipped is refused, whatever it hits.
        for i in 0..v.len() {
            let mut bad = v.clone();
            bad[i] ^= 0x40;
            assert!(decode(&layout, &key, &bad).is_err(), "byte {i}");
        }
        // Every truncation is refused.
        for n in 0..v.len() {
            assert!(decode(&layout, &key, &v[..n]).is_err(), "{n} bytes");
        }
        let other = SliceKey {
            block_index: 4,
            ..key
        };
        assert_eq!(decode(&layout, &other, &v), Err(ValueError::Key));
        let dim_major = KvLayout::new(
            layout
                .spec()
                .with_key_order(kvslice_core::KeyOrder::DimMajor),
        )
        .unwrap();
        assert!(matches!(
            decode(&dim_major, &key, &v),
            Err(ValueError::Layout { .. })
        ));
        // A fingerprint byte flipped in transit or at rest is damage, not
        // another layout's value.
        let mut bad = v.clone();
        bad[20] ^= 1;
        assert_eq!(decode(&layout, &key, &bad), Err(ValueError::Checksum));
    }

    #[test]
    fn a_well_formed_value_of_another_size_is_a_shape_error() {
        let (layout, key, _) = setup();
        let mut v = Vec::new();
        encode(&layout, &key, 3, &[0; 10], &mut v);
        assert_eq!(decode(&layout, &key, &v), Err(ValueError::Shape));
        v.clear();
        let page = vec![0; layout.page_bytes()];
        encode(&layout, &key, 5, &page, &mut v);
        assert_eq!(decode(&layout, &key, &v), Err(ValueError::Shape));
    }
}
