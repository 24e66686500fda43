// Pass 2: one workgroup per tile combines the partials of the tile's splits
// by log-sum-exp and writes the normalised output rows.

struct Merge {
    first_work: u32,
    splits: u32,
    q_len: u32,
    q_tok0: u32,
    head: u32,
    row0: u32,
    _p0: u32,
    _p1: u32,
}

@group(0) @binding(1) var<storage, read> merges: array<Merge>;
@group(0) @binding(2) var<storage, read> partials: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let w = wid.x + wid.y * params.grid_x;
    if w >= params.num_items {
        return;
    }
    let m = merges[w];
    let rows = m.q_len * params.gqa;
    let stride = HD + 2u;
    for (var r = 0u; r < R; r++) {
        let row = m.row0 + r;
        if row >= rows {
            break;
        }
        var mx = NEG;
        for (var s = 0u; s < m.splits; s++) {
            mx = max(mx, partials[((m.first_work + s) * R + r) * stride]);
        }
        var l = 0.0;
        for (var s = 0u; s < m.splits; s++) {
            let b = ((m.first_work + s) * R + r) * stride;
            l += partials[b + 1u] * exp(partials[b] - mx);
        }
        let qh = m.head * params.gqa + row % params.gqa;
        let o = ((m.q_tok0 + row / params.gqa) * params.q_heads + qh) * HD;
        for (var d = t; d < HD; d += WG) {
            var x = 0.0;
            for (var s = 0u; s < m.splits; s++) {
                let b = ((m.first_work + s) * R + r) * stride;
                x += partials[b + 2u + d] * exp(partials[b] - mx);
            }
            out[o + d] = x / l;
        }
    }
}
