// Shared by every kvslice kernel. The generated prelude before this file
// defines HD, R, PPT, SCALED, the pool bindings and the loads (or stores).

struct Params {
    block_tokens: u32,
    // Page stride in elements (bytes for the scaled 8-bit types).
    page_elems: u32,
    pages_per_chunk: u32,
    k_base: u32,
    v_base: u32,
    head_stride: u32,
    q_heads: u32,
    gqa: u32,
    scale: f32,
    num_items: u32,
    grid_x: u32,
    // Byte offset in a page of head 0's K scales of this layer (scaled types).
    ks_base: u32,
    tokens: u32,
    kv_heads: u32,
    // Sliding attention window in tokens; 0xffffffff for none.
    window: u32,
    // Byte offset in a page of head 0's V scales.
    vs_base: u32,
}

@group(0) @binding(0) var<uniform> params: Params;

// One workgroup of the attention pass: a tile of query rows of one
// sequence and kv head, over keys k0..k1 (`plan.rs`'s `WorkItem`).
struct Work {
    table_off: u32,
    kv_len: u32,
    q_len: u32,
    q_tok0: u32,
    head: u32,
    row0: u32,
    k0: u32,
    k1: u32,
}

const WG: u32 = 64u;
// Scores of masked keys; any real score is far above it.
const NEG: f32 = -1e30;

// Pool chunk and element index of `key`'s row of one kv head, where `base`
// selects K or V of the layer.
fn row_elem(page: u32, key: u32, head: u32, base: u32) -> vec2<u32> {
    let slot = key % params.block_tokens;
    let c = page / params.pages_per_chunk;
    let e = (page % params.pages_per_chunk) * params.page_elems + base + head * params.head_stride + slot * HD;
    return vec2<u32>(c, e);
}

// Pool chunk and word index of the f32 scale of `key`'s row of one kv head
// (scaled types), where `base` is `params.ks_base` or `params.vs_base`.
fn scale_word(page: u32, key: u32, head: u32, base: u32) -> vec2<u32> {
    let slot = key % params.block_tokens;
    let c = page / params.pages_per_chunk;
    let b = (page % params.pages_per_chunk) * params.page_elems + base + 4u * (head * params.block_tokens + slot);
    return vec2<u32>(c, b / 4u);
}
