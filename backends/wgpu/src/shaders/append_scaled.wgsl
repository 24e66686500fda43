// Appends new K/V to scaled 8-bit pages: one thread per row (one token's
// HD values of one kv head; K rows, then V rows), quantised as the host
// quantises: a = the row's largest magnitude, codes = code(x · (MAX_CODE /
// a)), scale = a / MAX_CODE; a row with a under ZERO_BELOW is zeros with
// scale 0. The prelude defines MAX_CODE, ZERO_BELOW, `code`, `put_byte`
// and `put_word`.

@group(0) @binding(1) var<storage, read> k_in: array<f32>;
@group(0) @binding(2) var<storage, read> v_in: array<f32>;
// Per token: its page and its position in the sequence.
@group(0) @binding(3) var<storage, read> dests: array<vec2<u32>>;

// The int8 code of y (already within ±127 but for rounding), nearest even.
fn i8_code(y: f32) -> u32 {
    return u32(i32(clamp(round(y), -127.0, 127.0))) & 0xffu;
}

// The E4M3 (OCP e4m3fn) code nearest y, ties to even, saturating at 448.
fn e4m3_code(y: f32) -> u32 {
    let sign = (bitcast<u32>(y) >> 24u) & 0x80u;
    let a = abs(y);
    if a >= 448.0 {
        return sign | 0x7eu;
    }
    if a < 0.015625 {
        // Subnormals and zero in steps of 2^-9; a carry to 8 is the
        // smallest normal, code 0x08.
        return sign | u32(round(a * 512.0));
    }
    // Round the mantissa to 3 bits, ties to even; a carry moves into the
    // exponent.
    let bits = bitcast<u32>(a);
    let r = bits + 0x7ffffu + ((bits >> 20u) & 1u);
    let e = (r >> 23u) - 127u + 7u;
    return sign | min((e << 3u) | ((r >> 20u) & 7u), 0x7eu);
}

fn input(v: bool, i: u32) -> f32 {
    if v {
        return v_in[i];
    }
    return k_in[i];
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let i = (wid.x + wid.y * params.grid_x) * WG + t;
    if i >= params.num_items {
        return;
    }
    let rows = params.tokens * params.kv_heads;
    let is_v = i >= rows;
    let row = i % rows;
    let tok = row / params.kv_heads;
    let head = row % params.kv_heads;
    let first = row * HD;
    var a = 0.0;
    for (var d = 0u; d < HD; d++) {
        a = max(a, abs(input(is_v, first + d)));
    }
    let dest = dests[tok];
    let at = row_elem(dest.x, dest.y, head, select(params.k_base, params.v_base, is_v));
    let sw = scale_word(dest.x, dest.y, head, select(params.ks_base, params.vs_base, is_v));
    if a < ZERO_BELOW {
        for (var d = 0u; d < HD; d++) {
            put_byte(at.x, at.y + d, 0u);
        }
        put_word(sw.x, sw.y, 0u);
        return;
    }
    // Division is bounded to 2.5 ULP only for divisors up to 2^126; rows
    // up to 2^127 are valid, so those divide a quarter by a quarter (the
    // same quotient, exactly scaled).
    let inv = select(MAX_CODE / a, (MAX_CODE * 0.25) / (a * 0.25), a > 0x1p126f);
    for (var d = 0u; d < HD; d++) {
        put_byte(at.x, at.y + d, code(input(is_v, first + d) * inv));
    }
    put_word(sw.x, sw.y, bitcast<u32>(a / MAX_CODE));
}
