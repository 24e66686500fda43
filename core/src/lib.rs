//! kvslice-core: the `no_std` heart of kvslice.
//!
//! New to kvslice? The embedding guide is `docs/GUIDE.md` in the
//! repository (rendered as `kvslice_benches::guide`, whose doc tests run
//! its code); results against peers are in `docs/BENCHMARKS.md`.
//!
//! - [`layout`]: model and page geometry ([`KvLayout`]), validated once.
//! - [`key`]: chained keyed 128-bit block hashes and [`SliceKey`]s.
//! - [`coordinator`]: requests → canonical block plans and slice keys.
//! - [`sequence`]: sequence id → block table, on the heap or fixed-size.
//! - [`page`]: page memory and K/V row I/O.
//! - [`pool`]: the fixed-capacity lock-free [`PagePool`].
//! - [`map`]: the lock-free, epoch-reclaimed [`SliceMap`].
//! - [`evict`]: eviction policies ([`DensityPolicy`], the replay default;
//!   [`ChainPolicy`], [`TinyLfuPolicy`], [`ClockPolicy`], [`LruPolicy`]).
//! - [`store`]: the [`CacheStore`] façade over pool, map and policy.
//! - [`engine`]: the [`AttentionEngine`] trait and the [`ReferenceEngine`].
//!
//! ```
//! use kvslice_core::{Coordinator, HashSecret, KvDtype, KvLayout, LayoutSpec, Request};
//!
//! let layout = KvLayout::new(LayoutSpec::new(4, 8, 2, 64, 16, KvDtype::F16))?;
//! let coord = Coordinator::new(layout, HashSecret::from_bytes(*b"deployment-key!!"));
//! let tokens: Vec<u32> = (0..40).collect();
//! let plan = coord.plan(&Request::new(&tokens))?;
//! assert_eq!(plan.blocks().len(), 3); // 16 + 16 + a partial tail of 8
//! assert_eq!(plan.full_blocks(), 2);
//! # Ok::<(), kvslice_core::Error>(())
//! ```

#![no_std]
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]
#![warn(missing_docs)]

extern crate alloc;
#[cfg(feature = "std")]
extern crate std;

/// The 16-bit float types K/V can be stored in.
pub use half::{bf16, f16};

/// The epoch-based reclamation crate the map uses: `Collector`, `Guard`,
/// `LocalHandle` (and, with `std`, `pin`).
///
/// Keep a [`Collector`](epoch::Collector) alive until every handle
/// registered with it is dropped. A handle that outlives the last
/// `Collector` frees the collector from inside crossbeam-epoch 0.9's
/// `Local::finalize`, which Miri reports as undefined behaviour
/// (crossbeam-rs/crossbeam issue 545); declaring the collector first
/// drops it last:
///
/// ```
/// use kvslice_core::epoch::Collector;
///
/// let collector = Collector::new(); // dropped after `handle`
/// let handle = collector.register();
/// let _guard = handle.pin();
/// ```
///
/// Not `Collector::new().register()`, whose temporary collector is gone
/// before the handle.
pub use crossbeam_epoch as epoch;

pub mod coordinator;
pub mod engine;
mod error;
pub mod events;
pub mod evict;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod key;
pub mod layout;
pub mod map;
pub mod page;
pub mod pool;
pub mod sequence;
pub mod store;
mod sync;
#[cfg(feature = "testkit")]
pub mod testkit;

pub use coordinator::{BlockRef, Coordinator, MAX_REGION_DIMS, Request, SlicePlan};
pub use engine::{AttentionBatch, AttentionEngine, BatchShape, ReferenceEngine, SeqAttention};
pub use error::{DeviceFailure, Error, Result};
pub use evict::{
    ChainPolicy, ClockPolicy, DensityPolicy, EvictPass, EvictionPolicy, LruPolicy, PageEvent,
    TinyLfuPolicy,
};
pub use key::{BlockHash, ChainHasher, HashSecret, KeyScope, SliceKey};
pub use layout::{
    F8E4M3_MAX, HeadShard, I8_MAX, KeyOrder, KvDtype, KvLayout, KvPart, LayerGrouping, LayoutSpec,
    MAX_LANES, SCALED_ZERO_BELOW, f8e4m3_from_f32, f8e4m3_to_f32,
};
pub use map::{MapCensus, SliceMap};
pub use page::{
    KEY_LIMIT, KvRows, KvRowsMut, KvWrite, PageBuf, PageGeometry, PageId, PageMemory,
    PageMemoryMut, ScaledRows, VALUE_LIMIT, WriteShape, read_head_rows, write_kv,
};
pub use pool::{
    AllocMany, Evicting, FillToken, Life, PageHandle, PageInfo, PageMut, PagePool, PageRef,
    PageView, RefToken,
};
pub use sequence::{FixedSequenceMap, SeqId, SequenceMap, SequenceTable, first_kept_block};
pub use store::{
    CacheStore, Priority, RequestTicket, SpillRefused, SpillSink, StoreStats, WindowHit,
};

/// The README's example runs as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
