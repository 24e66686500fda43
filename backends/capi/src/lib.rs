//! A C ABI over kvslice: layouts, the coordinator, the cache store (page
//! memory of its own or the caller's, KV cache events for routers) and the
//! CPU attention engine.
//!
//! The header, `include/kvslice.h`, is generated from this crate by
//! cbindgen (`tests/header.rs` fails when the checked-in copy is stale).
//! `examples/prefix_reuse.c` is a whole program; `tests/ctypes_smoke.py`
//! drives the same calls from Python.
//!
//! The rules every function keeps:
//!
//! - It returns a [`KvsStatus`]; on failure [`kvs_last_error`] says why,
//!   and nothing it was given has changed.
//! - Null, misaligned and unaddressably long pointers are errors, checked
//!   before anything is read. Lengths are checked against the layout.
//! - Handles are ids into a generation-checked table: a destroyed, foreign
//!   or made-up handle is an error.
//! - No panic crosses the boundary: one is caught and returned as
//!   [`KvsStatus::Panic`].
//!
//! The Rust example below is what `examples/prefix_reuse.c` does in C,
//! in brief: plan, look up, allocate, write, publish, and reuse.
//!
//! ```
//! use kvslice_capi::*;
//!
//! let spec = KvsLayoutSpec {
//!     num_layers: 1, num_q_heads: 2, num_kv_heads: 1, head_dim: 4, block_tokens: 2,
//!     dtype: KVS_DTYPE_F32, ..Default::default()
//! };
//! let (mut layout, mut coord, mut store) = (KvsLayout { id: 0 }, KvsCoordinator { id: 0 }, KvsStore { id: 0 });
//! // SAFETY: every pointer below is to a live local of the right size.
//! unsafe {
//!     assert_eq!(kvs_layout_new(&spec, &mut layout), KvsStatus::Ok);
//!     assert_eq!(kvs_coordinator_new(layout, &[7; 16], &mut coord), KvsStatus::Ok);
//!     assert_eq!(kvs_store_new(layout, 8, c"lru".as_ptr(), KvsMemory { id: 0 }, &mut store), KvsStatus::Ok);
//!     let tokens = [1u32, 2, 3, 4];
//!     let plan = KvsPlanRequest {
//!         tokens: tokens.as_ptr(), n_tokens: 4, salt: std::ptr::null(), salt_len: 0,
//!         range_start: 0, range_end: 0, layer_group: 0, head_shard: 0,
//!     };
//!     let mut keys = [KvsKey::default(); 2];
//!     let mut info = KvsPlanInfo::default();
//!     assert_eq!(kvs_plan(coord, &plan, keys.as_mut_ptr(), 2, &mut info), KvsStatus::Ok);
//!     for round in 0..2 {
//!         let mut req = KvsRequest { id: 0 };
//!         assert_eq!(kvs_request_begin(store, &mut req), KvsStatus::Ok);
//!         let mut hits = 0;
//!         assert_eq!(kvs_lookup_prefix(req, keys.as_ptr(), 2, 4, &mut hits), KvsStatus::Ok);
//!         assert_eq!(hits, round * 2); // the second round finds both blocks
//!         if hits == 0 {
//!             let mut first = 0;
//!             assert_eq!(kvs_allocate(req, 0, 0, 2, &mut first), KvsStatus::Ok);
//!             let kv = [0.5f32; 4 * 4];
//!             let w = KvsWrite { layer: 0, shard: 0, start: 0, k: kv.as_ptr(), k_len: 16, v: kv.as_ptr(), v_len: 16 };
//!             assert_eq!(kvs_write_kv(KvsEngine { id: 0 }, req, &w), KvsStatus::InvalidHandle);
//!             let mut page = 0;
//!             for slot in 0..2 {
//!                 assert_eq!(kvs_publish(req, slot, &keys[slot], 2, &mut page), KvsStatus::Ok);
//!             }
//!         }
//!         assert_eq!(kvs_request_end(req), KvsStatus::Ok);
//!     }
//! }
//! assert_eq!(kvs_store_destroy(store), KvsStatus::Ok);
//! ```

mod args;
#[doc(hidden)]
pub mod claim;
mod coordinator;
mod engine;
mod events;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod handles;
mod layout;
mod memory;
mod request;
mod status;
mod store;
mod types;

pub use coordinator::{kvs_coordinator_destroy, kvs_coordinator_new, kvs_plan};
pub use engine::{kvs_attend, kvs_engine_destroy, kvs_engine_new, kvs_write_kv};
pub use events::{
    KVS_EVENT_CLEARED, KVS_EVENT_REMOVED, KVS_EVENT_RING_MAX, KVS_EVENT_STORED, KVS_MEDIUM_CPU,
    KVS_MEDIUM_DISK, KVS_MEDIUM_GPU, KVS_MEDIUM_REMOTE, KvsEvent, KvsEventStats, kvs_events_drain,
    kvs_events_snapshot, kvs_events_stats, kvs_store_new_with_events,
};
pub use layout::{kvs_layout_destroy, kvs_layout_info, kvs_layout_new, kvs_layout_shard_info};
pub use memory::{kvs_memory_destroy, kvs_memory_wrap};
pub use request::{
    KVS_PAGE_RELEASED, kvs_allocate, kvs_block_table, kvs_lookup_prefix, kvs_publish,
    kvs_request_begin, kvs_request_end, kvs_request_slide_window, kvs_request_truncate,
};
pub use status::{KvsStatus, kvs_last_error};
pub use store::{kvs_store_destroy, kvs_store_new, kvs_store_stats};
pub use types::*;
