//! Chained, keyed 128-bit block hashes.
//!
//! `h_i = SipHash-2-4-128(secret; tag, h_{i-1}, i, n, tokens of block i, extra)`
//! and `h_{-1} = SipHash-2-4-128(secret; root tag, layout, salt, adapter)`.
//! The secret keys the PRF, so someone who can choose tokens but not read the
//! secret cannot aim for a collision; 128 bits keep accidental ones out of
//! reach at any cache size. Every variable-length field is length-prefixed
//! and every hash input starts with a domain tag, so no two different inputs
//! share an encoding.

use core::fmt;
use core::hash::Hasher as _;

use core::ops::Range;

use siphasher::sip128::{Hasher128, SipHasher24};

use crate::layout::KvLayout;

const TAG_ROOT: u8 = 0x00;
const TAG_FULL_BLOCK: u8 = 0x01;
const TAG_PARTIAL_BLOCK: u8 = 0x02;
const TAG_REGION: u8 = 0x03;
const TAG_TRUNCATED: u8 = 0x04;

/// The deployment's 128-bit hashing key.
///
/// Every worker that should share cache entries must use the same secret;
/// keep it out of logs and client reach, as it is what makes keys
/// unforgeable.
///
/// ```
/// use kvslice_core::HashSecret;
///
/// let secret = HashSecret::from_bytes(*b"0123456789abcdef");
/// assert_ne!(format!("{secret:?}"), "0123456789abcdef");
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct HashSecret([u8; 16]);

impl HashSecret {
    /// Wraps 16 secret bytes.
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }
}

impl fmt::Debug for HashSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("HashSecret(..)")
    }
}

/// The 128-bit identity of a block and, through the chain, of its whole
/// prefix.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub u128);

impl fmt::Debug for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BlockHash({:032x})", self.0)
    }
}

impl fmt::Display for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// Who a chain belongs to: the tenant's salt and, if any, the adapter
/// (LoRA) the request runs with. Requests with different scopes never share
/// a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct KeyScope<'a> {
    /// Per-tenant cache salt; may be empty.
    pub salt: &'a [u8],
    /// Adapter identity, if the request uses one.
    pub adapter: Option<u64>,
}

/// Computes chain roots and links for one layout under one secret.
///
/// ```
/// use kvslice_core::{ChainHasher, HashSecret, KeyScope, KvDtype, KvLayout, LayoutSpec};
///
/// let layout = KvLayout::new(LayoutSpec::new(1, 2, 2, 8, 4, KvDtype::F32))?;
/// let h = ChainHasher::new(&layout, HashSecret::from_bytes([7; 16]));
/// let root = h.root(&KeyScope { salt: b"tenant-a", adapter: None });
/// let b0 = h.link(root, 0, &[1, 2, 3, 4], None, true);
/// assert_eq!(b0, h.link(root, 0, &[1, 2, 3, 4], None, true));
/// assert_ne!(b0, h.link(root, 0, &[1, 2, 3, 5], None, true));
/// # Ok::<(), kvslice_core::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct ChainHasher {
    secret: HashSecret,
    layout_words: [u32; 9],
}

impl ChainHasher {
    /// A hasher for pages of `layout`.
    pub fn new(layout: &KvLayout, secret: HashSecret) -> Self {
        Self {
            secret,
            layout_words: layout.fingerprint_words(),
        }
    }

    fn hasher(&self, tag: u8) -> SipHasher24 {
        let mut h = SipHasher24::new_with_key(&self.secret.0);
        h.write(&[tag]);
        h
    }

    /// `h_{-1}`: the chain root for `scope`.
    pub fn root(&self, scope: &KeyScope<'_>) -> BlockHash {
        let mut h = self.hasher(TAG_ROOT);
        for w in self.layout_words {
            h.write(&w.to_le_bytes());
        }
        h.write(&(scope.salt.len() as u64).to_le_bytes());
        h.write(scope.salt);
        match scope.adapter {
            None => h.write(&[0]),
            Some(id) => {
                h.write(&[1]);
                h.write(&id.to_le_bytes());
            }
        }
        BlockHash(h.finish128().into())
    }

    /// `h_i` from `h_{i-1}` (`prev`), the block's index, its tokens and an
    /// optional extra key (for example a multimodal content hash).
    ///
    /// `full` says whether the block holds `block_tokens` tokens; full and
    /// partial blocks are hashed in separate domains so a partial tail can
    /// never be mistaken for a full block.
    pub fn link(
        &self,
        prev: BlockHash,
        index: u32,
        tokens: &[u32],
        extra: Option<u128>,
        full: bool,
    ) -> BlockHash {
        let mut h = self.hasher(if full {
            TAG_FULL_BLOCK
        } else {
            TAG_PARTIAL_BLOCK
        });
        h.write(&prev.0.to_le_bytes());
        h.write(&index.to_le_bytes());
        h.write(&(tokens.len() as u64).to_le_bytes());
        // Hash tokens through a stack buffer: one `write` per 64 tokens is
        // much cheaper than one per token.
        let mut buf = [0u8; 256];
        for chunk in tokens.chunks(64) {
            for (dst, t) in buf.chunks_exact_mut(4).zip(chunk) {
                dst.copy_from_slice(&t.to_le_bytes());
            }
            h.write(&buf[..chunk.len() * 4]);
        }
        match extra {
            None => h.write(&[0]),
            Some(x) => {
                h.write(&[1]);
                h.write(&x.to_le_bytes());
            }
        }
        BlockHash(h.finish128().into())
    }

    /// The hash of a rectangular region of tensor `tensor` under `root`:
    /// the half-open range of each dimension, in order. Keyed by where the
    /// region lies, not by its shape alone, and in its own domain, so it
    /// never equals a token block's hash.
    pub fn region(&self, root: BlockHash, tensor: u64, ranges: &[Range<u64>]) -> BlockHash {
        let mut h = self.hasher(TAG_REGION);
        h.write(&root.0.to_le_bytes());
        h.write(&tensor.to_le_bytes());
        h.write(&(ranges.len() as u64).to_le_bytes());
        for r in ranges {
            h.write(&r.start.to_le_bytes());
            h.write(&r.end.to_le_bytes());
        }
        BlockHash(h.finish128().into())
    }

    /// The root of a sequence whose tokens `dropped` were cut before
    /// planning: its keys never equal those of a sequence that kept them,
    /// nor of one that cut elsewhere.
    pub fn truncated_root(&self, root: BlockHash, dropped: Range<u64>) -> BlockHash {
        let mut h = self.hasher(TAG_TRUNCATED);
        h.write(&root.0.to_le_bytes());
        h.write(&dropped.start.to_le_bytes());
        h.write(&dropped.end.to_le_bytes());
        BlockHash(h.finish128().into())
    }
}
