//! A store with the tier behind it: local prefix first, then the tier's
//! continuation, fetched into fresh pages and published.

use kvslice_core::epoch::Guard;
use kvslice_core::{CacheStore, EvictionPolicy, PageMut, PageRef, RequestTicket, Result, SliceKey};

use crate::config::TierError;
use crate::tier::RedisTier;

/// How a prefix lookup was served.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TieredHit {
    /// Blocks found in the local store.
    pub local: usize,
    /// Blocks after those, fetched from the tier (now local too).
    pub remote: usize,
    /// Tokens of the local blocks.
    pub local_tokens: u64,
    /// Tokens of the fetched blocks.
    pub remote_tokens: u64,
}

impl TieredHit {
    /// Blocks of the prefix served, locally or from the tier.
    pub fn blocks(&self) -> usize {
        self.local + self.remote
    }
}

/// A [`CacheStore`] with a [`RedisTier`] behind it. The store should
/// spill into the same tier (`CacheStore::with_spill(Box::new(tier.sink()))`);
/// this type adds fetch on miss and, when the tier's config asks for it,
/// write-through on publish.
///
/// ```no_run
/// use kvslice_core::{BlockHash, CacheStore, KvDtype, KvLayout, LayoutSpec, LruPolicy, SliceKey};
/// use kvslice_redis::{RedisTier, TierConfig, TieredStore};
///
/// let layout = KvLayout::new(LayoutSpec::new(1, 1, 1, 2, 4, KvDtype::F32))?;
/// let tier = RedisTier::open(layout, TierConfig::new("redis://127.0.0.1:6379"))?;
/// let store = CacheStore::new(layout, 64, LruPolicy::new(64))?.with_spill(Box::new(tier.sink()))?;
/// let tiered = TieredStore::new(&store, &tier)?;
/// let keys: Vec<SliceKey> = (0..3)
///     .map(|i| SliceKey { block: BlockHash(100 + i), block_index: i as u32, layer_group: 0, head_shard: 0 })
///     .collect();
/// let (guard, req) = (store.pin(), store.begin_request());
/// let mut pages = Vec::new();
/// let hit = tiered.lookup(&req, &keys, 12, &guard, &mut pages)?;
/// println!("{} local, {} from the tier", hit.local, hit.remote);
/// drop(pages);
/// store.end_request(req)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct TieredStore<'a, E: EvictionPolicy> {
    store: &'a CacheStore<'static, E>,
    tier: &'a RedisTier,
}

impl<'a, E: EvictionPolicy> TieredStore<'a, E> {
    /// `store` with `tier` behind it; the two must share a layout, or
    /// pages would be labelled and read as the wrong one.
    pub fn new(store: &'a CacheStore<'static, E>, tier: &'a RedisTier) -> Result<Self, TierError> {
        if !store.layout().same_pages(tier.layout()) {
            return Err(TierError::LayoutMismatch(format!(
                "store {:?}, tier {:?}",
                store.layout().spec(),
                tier.layout().spec()
            )));
        }
        Ok(Self { store, tier })
    }

    /// The local store.
    pub fn store(&self) -> &'a CacheStore<'static, E> {
        self.store
    }

    /// The tier.
    pub fn tier(&self) -> &'a RedisTier {
        self.tier
    }

    /// [`CacheStore::lookup_prefix`], then the tier for the keys after the
    /// local prefix: each block the tier has, in order, lands in a freshly
    /// allocated page (evicting, and so spilling, as allocation does), is
    /// published with the block before it as parent, and joins `out`. Stops
    /// at the tier's first miss, or when no page can be had. The tier never
    /// makes this fail: an unreachable tier gives the local prefix alone.
    pub fn lookup(
        &self,
        request: &RequestTicket,
        keys: &[SliceKey],
        total_tokens: usize,
        guard: &Guard,
        out: &mut Vec<PageRef<'a, 'static>>,
    ) -> Result<TieredHit> {
        let start = out.len();
        let local = self
            .store
            .lookup_prefix(request, keys, total_tokens, guard, out)?;
        let local_tokens = out[start..]
            .iter()
            .map(|p| self.store.valid_tokens(p).map(u64::from))
            .sum::<Result<u64>>()?;
        let mut hit = TieredHit {
            local,
            local_tokens,
            ..TieredHit::default()
        };
        if local == keys.len() {
            return Ok(hit);
        }
        let rest = &keys[local..];
        let mut failed = None;
        self.tier.fetch(rest, &mut |i, tokens, bytes| {
            let mut page: PageMut<'a, 'static> = match self.store.allocate(1, guard) {
                Ok(mut v) => v.pop().expect("allocate(1) gives one page"),
                Err(_) => return false,
            };
            page.bytes_mut().copy_from_slice(bytes);
            let parent = if out.len() > start { out.last() } else { None };
            match self
                .store
                .publish(request, page, rest[i], parent, tokens, guard)
            {
                Ok(r) => {
                    out.push(r);
                    hit.remote += 1;
                    hit.remote_tokens += u64::from(tokens);
                    true
                }
                Err(e) => {
                    failed = Some(e);
                    false
                }
            }
        });
        match failed {
            Some(e) => Err(e),
            None => Ok(hit),
        }
    }

    /// [`CacheStore::publish`], and with write-through on, a spill of the
    /// published block.
    pub fn publish(
        &self,
        request: &RequestTicket,
        page: PageMut<'a, 'static>,
        key: SliceKey,
        parent: Option<&PageRef<'a, 'static>>,
        valid_tokens: u32,
        guard: &Guard,
    ) -> Result<PageRef<'a, 'static>> {
        let r = self
            .store
            .publish(request, page, key, parent, valid_tokens, guard)?;
        if self.tier.config().write_through {
            self.tier.spill(&key, valid_tokens, r.bytes());
        }
        Ok(r)
    }
}
