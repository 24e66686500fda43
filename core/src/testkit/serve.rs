//! One request served the way a runtime serves it, for tests and benches
//! that need a store's traffic rather than its data.

use alloc::vec::Vec;

use crossbeam_epoch::Guard;

use crate::error::{Error, Result};
use crate::evict::EvictionPolicy;
use crate::key::SliceKey;
use crate::pool::PageRef;
use crate::store::{CacheStore, RequestTicket};

/// Takes references on the cached prefix of `keys`, then allocates and
/// publishes the rest in order, each block holding `tokens` tokens and the
/// child of the one before; every reference goes to `held`. Returns the
/// blocks that hit. A store that cannot give pages for the rest publishes
/// nothing more (not an error).
///
/// ```
/// use kvslice_core::testkit::serve_blocks;
/// use kvslice_core::{BlockHash, CacheStore, KvDtype, KvLayout, LayoutSpec, LruPolicy, SliceKey};
///
/// let layout = KvLayout::new(LayoutSpec::new(1, 1, 1, 2, 4, KvDtype::F32))?;
/// let store = CacheStore::new(layout, 4, LruPolicy::new(4))?;
/// let keys: Vec<SliceKey> = (0..3)
///     .map(|i| SliceKey { block: BlockHash(i.into()), block_index: i, layer_group: 0, head_shard: 0 })
///     .collect();
/// for want in [0, 3] {
///     let (guard, req, mut held) = (store.pin(), store.begin_request(), Vec::new());
///     assert_eq!(serve_blocks(&store, &req, &keys, 4, &guard, &mut held)?, want);
///     drop(held);
///     store.end_request(req)?;
/// }
/// # Ok::<(), kvslice_core::Error>(())
/// ```
pub fn serve_blocks<'s, 'm, E: EvictionPolicy>(
    store: &'s CacheStore<'m, E>,
    request: &RequestTicket,
    keys: &[SliceKey],
    tokens: u32,
    guard: &Guard,
    held: &mut Vec<PageRef<'s, 'm>>,
) -> Result<usize> {
    let hits = store.lookup_prefix(request, keys, keys.len() * tokens as usize, guard, held)?;
    let pages = match store.allocate((keys.len() - hits) as u32, guard) {
        Ok(pages) => pages,
        Err(Error::CapacityExhausted(_)) => return Ok(hits),
        Err(e) => return Err(e),
    };
    for (key, page) in keys[hits..].iter().zip(pages) {
        let r = store.publish(request, page, *key, held.last(), tokens, guard)?;
        held.push(r);
    }
    Ok(hits)
}
