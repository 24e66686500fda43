//! Canonical identities: chained keyed block hashes and the slice keys
//! built on them.

mod block_hash;
mod slice_key;

pub use block_hash::{BlockHash, ChainHasher, HashSecret, KeyScope};
pub use slice_key::SliceKey;
