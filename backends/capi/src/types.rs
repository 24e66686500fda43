//! The plain C types of the ABI: handles, keys, specs, argument blocks.
//!
//! Enumerations a caller writes are `uint32_t` fields with `KVS_*`
//! constants, never Rust enums: an out-of-range value from C is then an
//! error, not undefined behaviour.
//!
//! Handles are 64-bit ids into a generation-checked table, not pointers: a
//! destroyed, reused or made-up id is `KVS_STATUS_INVALID_HANDLE`, never
//! undefined behaviour.

use kvslice_core::{BlockHash, SliceKey, StoreStats};

/// A validated K/V layout. Immutable: any thread, any time.
///
/// A 64-bit id, not a pointer (see the module docs); 0 is null.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvsLayout {
    /// The id; 0 is null.
    pub id: u64,
}

/// A coordinator: tokens to block keys. Immutable: any thread.
///
/// A 64-bit id, not a pointer (see the module docs); 0 is null.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvsCoordinator {
    /// The id; 0 is null.
    pub id: u64,
}

/// Page memory the caller owns (see `kvs_memory_wrap`).
///
/// A 64-bit id, not a pointer (see the module docs); 0 is null.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvsMemory {
    /// The id; 0 is null.
    pub id: u64,
}

/// A cache store: page pool, key map and eviction policy. Every
/// function on it may be called from any number of threads at once.
///
/// A 64-bit id, not a pointer (see the module docs); 0 is null.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvsStore {
    /// The id; 0 is null.
    pub id: u64,
}

/// One request's pages on a store, in block-table order per (layer
/// group, head shard). Used by one thread at a time: a call while
/// another thread is inside a call on the same request returns
/// `KVS_STATUS_BUSY`. Requests of one store may run on many threads.
///
/// A 64-bit id, not a pointer (see the module docs); 0 is null.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvsRequest {
    /// The id; 0 is null.
    pub id: u64,
}

/// The CPU attention engine (SIMD kernels picked at run time, work
/// split over a shared worker pool). Any number of threads may call it
/// at once.
///
/// A 64-bit id, not a pointer (see the module docs); 0 is null.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvsEngine {
    /// The id; 0 is null.
    pub id: u64,
}

/// Pages store K/V as IEEE binary32.
pub const KVS_DTYPE_F32: u32 = 0;
/// Pages store K/V as IEEE binary16.
pub const KVS_DTYPE_F16: u32 = 1;
/// Pages store K/V as bfloat16.
pub const KVS_DTYPE_BF16: u32 = 2;
/// Pages store K/V as int8 codes with one f32 scale per token and kv head
/// (docs/QUANTIZATION.md).
pub const KVS_DTYPE_I8: u32 = 3;
/// Pages store K/V as fp8 E4M3 codes with one f32 scale per token and kv
/// head (docs/QUANTIZATION.md).
pub const KVS_DTYPE_F8E4M3: u32 = 4;

/// Keys stored `[token][head_dim]` (the default).
pub const KVS_KEY_ORDER_TOKEN_MAJOR: u32 = 0;
/// Keys stored `[head_dim][token]` per block (faster CPU decode).
pub const KVS_KEY_ORDER_DIM_MAJOR: u32 = 1;

/// The geometry of a model's K/V and of a page (`kvs_layout_new`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvsLayoutSpec {
    /// Transformer layers.
    pub num_layers: u32,
    /// Query heads.
    pub num_q_heads: u32,
    /// K/V heads: a divisor of the query heads (grouped-query attention).
    pub num_kv_heads: u32,
    /// Elements per head.
    pub head_dim: u32,
    /// Tokens per page.
    pub block_tokens: u32,
    /// `KVS_DTYPE_*`.
    pub dtype: u32,
    /// Layers per page: 0 for all layers in one page, 1 for a page per
    /// layer, n for groups of n layers.
    pub layers_per_group: u32,
    /// Tensor-parallel head shards (0 or 1: unsharded).
    pub head_shards: u32,
    /// `KVS_KEY_ORDER_*`.
    pub key_order: u32,
}

/// Sizes derived from a layout (`kvs_layout_info`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvsLayoutInfo {
    /// Bytes of one page.
    pub page_bytes: usize,
    /// Layer groups: pages per block and head shard.
    pub layer_groups: u32,
    /// Head shards.
    pub head_shards: u32,
    /// Floats per token of K (or V) for one layer of shard 0: its kv
    /// heads times `head_dim`. Shards differ when the kv heads do not
    /// divide evenly (the first `kv_heads % head_shards` get one more):
    /// `kvs_layout_shard_info` gives each shard's.
    pub kv_row: u32,
    /// Floats per token of queries for one layer of shard 0.
    pub q_row: u32,
}

/// One head shard's heads and row sizes (`kvs_layout_shard_info`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvsShardInfo {
    /// The shard's first kv head.
    pub first_kv_head: u32,
    /// Its kv heads.
    pub kv_heads: u32,
    /// Its first query head.
    pub first_q_head: u32,
    /// Its query heads.
    pub q_heads: u32,
    /// Floats per token of K (or V) for one layer of the shard: what
    /// `kvs_write_kv` takes per token.
    pub kv_row: u32,
    /// Floats per token of queries (and outputs) for one layer of the
    /// shard: what `kvs_attend` takes per query row.
    pub q_row: u32,
}

/// A page's canonical key: a block's chained hash, its index, and which
/// layer group and head shard the page holds. Produced by `kvs_plan`;
/// equal keys name the same K/V.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvsKey {
    /// Low 64 bits of the 128-bit block hash.
    pub block_lo: u64,
    /// High 64 bits of the block hash.
    pub block_hi: u64,
    /// The block's index in its sequence.
    pub block_index: u32,
    /// Layer group.
    pub layer_group: u32,
    /// Head shard.
    pub head_shard: u32,
}

impl From<SliceKey> for KvsKey {
    fn from(k: SliceKey) -> Self {
        Self {
            block_lo: k.block.0 as u64,
            block_hi: (k.block.0 >> 64) as u64,
            block_index: k.block_index,
            layer_group: k.layer_group,
            head_shard: k.head_shard,
        }
    }
}

impl From<KvsKey> for SliceKey {
    fn from(k: KvsKey) -> Self {
        SliceKey {
            block: BlockHash(u128::from(k.block_hi) << 64 | u128::from(k.block_lo)),
            block_index: k.block_index,
            layer_group: k.layer_group,
            head_shard: k.head_shard,
        }
    }
}

/// What to plan (`kvs_plan`): a token sequence, its tenant scope and the
/// token range to address.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KvsPlanRequest {
    /// The whole sequence from position 0: `n_tokens` token ids.
    pub tokens: *const u32,
    /// Tokens at `tokens`.
    pub n_tokens: usize,
    /// The tenant's cache salt (`salt_len` bytes; null when 0): requests of
    /// different salts never share keys.
    pub salt: *const u8,
    /// Bytes at `salt`.
    pub salt_len: usize,
    /// First token to address (widened down to a block boundary).
    pub range_start: usize,
    /// One past the last token to address; `range_start == range_end == 0`
    /// addresses the whole sequence.
    pub range_end: usize,
    /// Layer group of the keys written out.
    pub layer_group: u32,
    /// Head shard of the keys written out.
    pub head_shard: u32,
}

/// What `kvs_plan` found.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvsPlanInfo {
    /// Blocks (keys) of the plan: the size `keys` needs.
    pub blocks: usize,
    /// Leading full blocks: the ones that may be cached and shared.
    pub full_blocks: usize,
    /// First token position the blocks hold.
    pub token_start: usize,
    /// One past the last.
    pub token_end: usize,
}

/// A store's counters (`kvs_store_stats`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvsStats {
    /// `kvs_lookup_prefix` calls.
    pub lookups: u64,
    /// Blocks found.
    pub hit_blocks: u64,
    /// Blocks not found.
    pub miss_blocks: u64,
    /// Tokens in the blocks found.
    pub hit_tokens: u64,
    /// Tokens looked up beyond the hits.
    pub miss_tokens: u64,
    /// Pages published.
    pub inserts: u64,
    /// Publishes that found the key cached already (no duplicate kept).
    pub duplicate_publishes: u64,
    /// Pages evicted.
    pub evictions: u64,
    /// Valid tokens of evicted pages.
    pub evicted_tokens: u64,
    /// Accesses the policy's lossy read buffer dropped.
    pub dropped_accesses: u64,
    /// Pages in the pool.
    pub capacity: u32,
    /// Pages free now.
    pub free_pages: u32,
}

impl KvsStats {
    pub(crate) fn new(s: StoreStats, capacity: u32, free_pages: u32) -> Self {
        Self {
            lookups: s.lookups,
            hit_blocks: s.hit_blocks,
            miss_blocks: s.miss_blocks,
            hit_tokens: s.hit_tokens,
            miss_tokens: s.miss_tokens,
            inserts: s.inserts,
            duplicate_publishes: s.duplicate_publishes,
            evictions: s.evictions,
            evicted_tokens: s.evicted_tokens,
            dropped_accesses: s.dropped_accesses,
            capacity,
            free_pages,
        }
    }
}

/// New K/V tokens of one layer and shard for one request (`kvs_write_kv`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KvsWrite {
    /// Global layer index.
    pub layer: u32,
    /// Head shard.
    pub shard: u32,
    /// Position of the first new token in the sequence.
    pub start: usize,
    /// Keys: tokens × `kv_row` floats, token-major then head.
    pub k: *const f32,
    /// Floats at `k`.
    pub k_len: usize,
    /// Values, shaped as `k`.
    pub v: *const f32,
    /// Floats at `v`.
    pub v_len: usize,
}

/// One sequence of an attention batch.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KvsSeq {
    /// The request whose pages hold the sequence's K/V.
    pub request: KvsRequest,
    /// Tokens of context, the new ones included.
    pub kv_len: usize,
    /// New query tokens (1 for decode).
    pub q_len: usize,
}

/// A layer's attention for a batch of sequences (`kvs_attend`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KvsAttend {
    /// Global layer index.
    pub layer: u32,
    /// Head shard.
    pub shard: u32,
    /// Softmax scale, usually `1 / sqrt(head_dim)`.
    pub scale: f32,
    /// The sequences, `n_seqs` of them, all on one store.
    pub seqs: *const KvsSeq,
    /// Entries at `seqs`.
    pub n_seqs: usize,
    /// Queries: Σ q_len × `q_row` floats, sequences in order, token-major,
    /// then head.
    pub q: *const f32,
    /// Floats at `q`.
    pub q_len: usize,
    /// Output, shaped as `q`; written only on success.
    pub out: *mut f32,
    /// Floats at `out`.
    pub out_len: usize,
    /// Sliding attention window in tokens: a query at position `p` sees
    /// keys `p - window + 1..=p`. 0 (what an initializer that leaves it out
    /// gives) is full causal attention.
    pub window: u32,
}
