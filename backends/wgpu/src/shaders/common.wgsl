// Shared by every kvslice kernel. The generated prelude before this file
// defines HD, R, PPT, the pool bindings and `ld`/`ld2` (or the stores).

struct Params {
    block_tokens: u32,
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
    _p0: u32,
    tokens: u32,
    kv_heads: u32,
    // Sliding attention window in tokens; 0xffffffff for none.
    window: u32,
    _p1: u32,
}

@group(0) @binding(0) var<uniform> params: Params;

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
