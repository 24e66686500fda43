// Pass 1 with subgroups: the same inputs and partials as attend.wgsl, cut
// differently. The workgroup's 64 threads form NG lane groups of G lanes
// (G divides the subgroup size, so a group never spans two subgroups).
// Lane `lane` of a group owns dimensions lane·DPL .. lane·DPL + DPL of every
// row: it keeps those query elements and output accumulators in registers
// and loads those dimensions of each key and value, 16 bytes at a time.
// A group walks its own contiguous run of the split's keys with its own
// online softmax; a score is the group's partial dot products summed by a
// butterfly of subgroup shuffles. No workgroup memory and no barrier in the
// key loop; the NG groups' states are combined once at the end.
//
// The prelude defines G, NG, DPL, VW (elements per 16 bytes), Q4 (DPL / 4),
// RQ (R × Q4), the pool bindings as array<vec4<u32>>, `State` and the
// per-key arithmetic written out straight: `load_dims`, `scores`,
// `visible` and `advance`.

@group(0) @binding(1) var<storage, read> queries: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> work: array<Work>;
@group(0) @binding(3) var<storage, read> tables: array<u32>;
@group(0) @binding(4) var<storage, read_write> partials: array<f32>;

var<workgroup> m_s: array<f32, NG * R>;
var<workgroup> l_s: array<f32, NG * R>;
var<workgroup> o_s: array<f32, R * HD>;

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_size) sg_size: u32,
    @builtin(subgroup_invocation_id) sg_lane: u32,
) {
    // Surplus workgroups of the grid repeat the last item and write
    // nothing: no early return, so every load below stays outside
    // divergent control flow.
    let w_raw = wid.x + wid.y * params.grid_x;
    let live = w_raw < params.num_items;
    let w = min(w_raw, params.num_items - 1u);
    let it = work[w];
    let g = sg * (sg_size / G) + sg_lane / G;
    let lane = sg_lane % G;
    let d0 = lane * DPL;
    let rows = it.q_len * params.gqa;

    // This lane's dimensions of the tile's queries, pre-scaled; rows past
    // the sequence read a valid row and are zeroed. Row r sees keys up to
    // at[r] (bottom-right causal mask).
    var q: array<vec4<f32>, RQ>;
    var at: array<u32, R>;
    var live_row: array<bool, R>;
    let horizon0 = it.kv_len - it.q_len;
    for (var r = 0u; r < R; r++) {
        let row = min(it.row0 + r, rows - 1u);
        let qh = it.head * params.gqa + row % params.gqa;
        let first_q = (((it.q_tok0 + row / params.gqa) * params.q_heads + qh) * HD + d0) / 4u;
        let keep = select(0.0, params.scale, it.row0 + r < rows);
        for (var i = 0u; i < Q4; i++) {
            q[r * Q4 + i] = queries[first_q + i] * keep;
        }
        at[r] = horizon0 + row / params.gqa;
        live_row[r] = it.row0 + r < rows;
    }

    var st: State;
    for (var r = 0u; r < R; r++) {
        st.m[r] = NEG;
    }

    // This group's run of keys, and the page slot of its first key; the
    // slot then advances without a division per key.
    let per_group = (it.k1 - it.k0 + NG - 1u) / NG;
    let first = min(it.k0 + g * per_group, it.k1);
    let end = min(first + per_group, it.k1);
    // A group with an empty run (first == k1) reads the item's last key,
    // masked: k1 itself may be past the sequence's block table.
    let at_key = min(first, max(it.k1, 1u) - 1u);
    var blk = at_key / params.block_tokens;
    var slot = at_key % params.block_tokens;
    let head_off = it.head * params.head_stride;
    for (var j = 0u; j < per_group; j++) {
        let key = first + j;
        let ok = key < end;
        let page = tables[it.table_off + blk];
        let c = page / params.pages_per_chunk;
        let in_chunk = (page - c * params.pages_per_chunk) * params.page_elems;
        let row_at = in_chunk + head_off + slot * HD + d0;
        // Scaled types: the row's scales (1 otherwise, folded away).
        let scale_at = (in_chunk + 4u * (it.head * params.block_tokens + slot)) / 4u;
        let ks = row_scale(c, scale_at + params.ks_base / 4u);
        let vs = row_scale(c, scale_at + params.vs_base / 4u);
        let s = scores(q, load_dims(c, row_at + params.k_base), ks);
        let v = load_dims(c, row_at + params.v_base);
        st = advance(st, s, v, vs, visible(key, ok, at, live_row));
        // Next slot; past the run the key stays put (its loads are masked).
        slot += select(0u, 1u, key + 1u < end);
        let wrap = slot == params.block_tokens;
        blk += select(0u, 1u, wrap);
        slot = select(slot, 0u, wrap);
    }

    // Combine the groups: each group's state is rescaled to the tile's
    // running max per row and summed into workgroup memory, group by group.
    if lane == 0u {
        for (var r = 0u; r < R; r++) {
            m_s[g * R + r] = st.m[r];
            l_s[g * R + r] = st.l[r];
        }
    }
    workgroupBarrier();
    var f: array<f32, R>;
    for (var r = 0u; r < R; r++) {
        var mx = NEG;
        for (var gg = 0u; gg < NG; gg++) {
            mx = max(mx, m_s[gg * R + r]);
        }
        f[r] = exp(st.m[r] - mx);
    }
    for (var gg = 0u; gg < NG; gg++) {
        if g == gg {
            for (var r = 0u; r < R; r++) {
                for (var i = 0u; i < Q4; i++) {
                    let x = st.acc[r * Q4 + i] * f[r];
                    let o = r * HD + d0 + 4u * i;
                    o_s[o] += x.x;
                    o_s[o + 1u] += x.y;
                    o_s[o + 2u] += x.z;
                    o_s[o + 3u] += x.w;
                }
            }
        }
        workgroupBarrier();
    }

    if !live {
        return;
    }
    let stride = HD + 2u;
    for (var i = t; i < R * HD; i += WG) {
        partials[(w * R + i / HD) * stride + 2u + i % HD] = o_s[i];
    }
    if t < R {
        var mx = NEG;
        for (var gg = 0u; gg < NG; gg++) {
            mx = max(mx, m_s[gg * R + t]);
        }
        var sum = 0.0;
        for (var gg = 0u; gg < NG; gg++) {
            sum += l_s[gg * R + t] * exp(m_s[gg * R + t] - mx);
        }
        partials[(w * R + t) * stride] = mx;
        partials[(w * R + t) * stride + 1u] = sum;
    }
}
