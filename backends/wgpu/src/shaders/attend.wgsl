// Pass 1: one workgroup scores keys k0..k1 of one kv head for a tile of R
// query rows with an online softmax, and writes one partial per row:
// [running max, running sum, unnormalised output × HD].

@group(0) @binding(1) var<storage, read> queries: array<f32>;
@group(0) @binding(2) var<storage, read> work: array<Work>;
@group(0) @binding(3) var<storage, read> tables: array<u32>;
@group(0) @binding(4) var<storage, read_write> partials: array<f32>;

var<workgroup> q_s: array<f32, R * HD>;
var<workgroup> p_s: array<f32, R * WG>;
var<workgroup> m_s: array<f32, R>;
var<workgroup> l_s: array<f32, R>;
var<workgroup> a_s: array<f32, R>;

fn key_elem(it: Work, key: u32, base: u32) -> vec2<u32> {
    let page = tables[it.table_off + key / params.block_tokens];
    return row_elem(page, key, it.head, base);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let w = wid.x + wid.y * params.grid_x;
    if w >= params.num_items {
        return;
    }
    let it = work[w];
    let rows = it.q_len * params.gqa;
    // The tile's queries, pre-scaled; rows past the sequence are zeros.
    for (var i = t; i < R * HD; i += WG) {
        let row = it.row0 + i / HD;
        var x = 0.0;
        if row < rows {
            let qh = it.head * params.gqa + row % params.gqa;
            x = queries[((it.q_tok0 + row / params.gqa) * params.q_heads + qh) * HD + i % HD] * params.scale;
        }
        q_s[i] = x;
    }
    if t < R {
        m_s[t] = NEG;
        l_s[t] = 0.0;
    }
    var acc: array<vec2<f32>, R * PPT>;
    // Row i of the sequence sees keys 0..=horizon0 + i (bottom-right mask),
    // the last `params.window` of them.
    let horizon0 = it.kv_len - it.q_len;
    workgroupBarrier();

    for (var kt = it.k0; kt < it.k1; kt += WG) {
        // Scores: one key per thread against every row of the tile.
        let key = kt + t;
        var s: array<f32, R>;
        if key < it.k1 {
            let a = key_elem(it, key, params.k_base);
            for (var p = 0u; p < HD / 2u; p++) {
                let k = ld2(a.x, a.y + 2u * p);
                for (var r = 0u; r < R; r++) {
                    s[r] += q_s[r * HD + 2u * p] * k.x + q_s[r * HD + 2u * p + 1u] * k.y;
                }
            }
            if HD % 2u == 1u {
                let k = ld(a.x, a.y + HD - 1u);
                for (var r = 0u; r < R; r++) {
                    s[r] += q_s[r * HD + HD - 1u] * k;
                }
            }
            if SCALED {
                // The key's scale multiplies its dot products.
                let page = tables[it.table_off + key / params.block_tokens];
                let sw = scale_word(page, key, it.head, params.ks_base);
                let ks = row_scale(sw.x, sw.y);
                for (var r = 0u; r < R; r++) {
                    s[r] *= ks;
                }
            }
        }
        for (var r = 0u; r < R; r++) {
            let row = it.row0 + r;
            let at = horizon0 + row / params.gqa;
            // `at - key` wraps when key > at, which the causal test rejects.
            let visible = key < it.k1 && row < rows && key <= at && at - key < params.window;
            p_s[r * WG + t] = select(NEG, s[r], visible);
        }
        workgroupBarrier();

        // Online softmax bookkeeping, one thread per row.
        if t < R {
            let m_old = m_s[t];
            var mx = m_old;
            for (var j = 0u; j < WG; j++) {
                mx = max(mx, p_s[t * WG + j]);
            }
            var sum = 0.0;
            for (var j = 0u; j < WG; j++) {
                let x = p_s[t * WG + j];
                let p = select(0.0, exp(x - mx), x > NEG);
                p_s[t * WG + j] = p;
                sum += p;
            }
            let alpha = exp(m_old - mx);
            a_s[t] = alpha;
            l_s[t] = l_s[t] * alpha + sum;
            m_s[t] = mx;
        }
        workgroupBarrier();

        // Values: each thread owns dimension pairs, all rows of the tile.
        let n = min(WG, it.k1 - kt);
        for (var j = 0u; j < PPT; j++) {
            let d = 2u * (t + j * WG);
            if d < HD {
                for (var r = 0u; r < R; r++) {
                    acc[r * PPT + j] *= a_s[r];
                }
                for (var kk = 0u; kk < n; kk++) {
                    let a = key_elem(it, kt + kk, params.v_base);
                    var v: vec2<f32>;
                    if d + 1u < HD {
                        v = ld2(a.x, a.y + d);
                    } else {
                        v = vec2<f32>(ld(a.x, a.y + d), 0.0);
                    }
                    if SCALED {
                        let key = kt + kk;
                        let page = tables[it.table_off + key / params.block_tokens];
                        let sw = scale_word(page, key, it.head, params.vs_base);
                        v *= row_scale(sw.x, sw.y);
                    }
                    for (var r = 0u; r < R; r++) {
                        acc[r * PPT + j] += p_s[r * WG + kk] * v;
                    }
                }
            }
        }
        workgroupBarrier();
    }

    let stride = HD + 2u;
    if t < R {
        partials[(w * R + t) * stride] = m_s[t];
        partials[(w * R + t) * stride + 1u] = l_s[t];
    }
    for (var j = 0u; j < PPT; j++) {
        let d = 2u * (t + j * WG);
        if d < HD {
            for (var r = 0u; r < R; r++) {
                let o = (w * R + r) * stride + 2u + d;
                partials[o] = acc[r * PPT + j].x;
                if d + 1u < HD {
                    partials[o + 1u] = acc[r * PPT + j].y;
                }
            }
        }
    }
}
