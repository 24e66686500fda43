// Stores new K/V in place: one thread per element of the host-encoded
// payload (K then V, each tokens × kv_heads × HD, token-major).

@group(0) @binding(1) var<storage, read> payload: array<u32>;
@group(0) @binding(2) var<storage, read> table: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let i = (wid.x + wid.y * params.grid_x) * WG + t;
    if i >= params.num_items {
        return;
    }
    let per_part = params.tokens * params.kv_heads * HD;
    let part = i / per_part;
    let rem = i % per_part;
    let tok = rem / (params.kv_heads * HD);
    let head = (rem / HD) % params.kv_heads;
    let pos = params.start + tok;
    let base = select(params.k_base, params.v_base, part == 1u);
    let a = row_elem(table[pos / params.block_tokens], pos, head, base);
    put(a.x, a.y + rem % HD, i);
}
