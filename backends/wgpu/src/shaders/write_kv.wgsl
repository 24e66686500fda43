// Appends new K/V in place: one thread per element of the f32 inputs (K
// then V, each tokens × kv_heads × HD, token-major), rounded to the pages'
// dtype by `put`.

@group(0) @binding(1) var<storage, read> k_in: array<f32>;
@group(0) @binding(2) var<storage, read> v_in: array<f32>;
// Per token: its page and its position in the sequence.
@group(0) @binding(3) var<storage, read> dests: array<vec2<u32>>;

// IEEE binary16 bits of `x`, rounded to nearest even; NaN stays NaN (quiet,
// top payload bits kept), overflow is infinity: what the host's conversion
// gives, bit for bit.
fn f16_bits(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    let sign = (b >> 16u) & 0x8000u;
    let exp = (b >> 23u) & 0xffu;
    let man = b & 0x7fffffu;
    if exp == 0xffu {
        return sign | 0x7c00u | select(0u, 0x200u, man != 0u) | (man >> 13u);
    }
    let e = i32(exp) - 127 + 15;
    if e >= 31 {
        return sign | 0x7c00u;
    }
    if e <= 0 {
        // Subnormal (or zero): shift the mantissa, hidden bit included.
        if 14 - e > 24 {
            return sign;
        }
        let m = man | 0x800000u;
        let sh = u32(14 - e);
        var h = m >> sh;
        let round = 1u << (sh - 1u);
        if (m & round) != 0u && (m & (3u * round - 1u)) != 0u {
            h += 1u;
        }
        return sign | h;
    }
    let h = sign | (u32(e) << 10u) | (man >> 13u);
    if (man & 0x1000u) != 0u && (man & 0x2fffu) != 0u {
        return h + 1u;
    }
    return h;
}

// bfloat16 bits of `x`, rounded to nearest even; NaN stays NaN (quiet).
fn bf16_bits(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    if (b & 0x7fffffffu) > 0x7f800000u {
        return (b >> 16u) | 0x40u;
    }
    if (b & 0x8000u) != 0u && (b & 0x17fffu) != 0u {
        return (b >> 16u) + 1u;
    }
    return b >> 16u;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let i = (wid.x + wid.y * params.grid_x) * WG + t;
    if i >= params.num_items {
        return;
    }
    let per_part = params.tokens * params.kv_heads * HD;
    let rem = i % per_part;
    var x: f32;
    if i < per_part {
        x = k_in[rem];
    } else {
        x = v_in[rem];
    }
    let tok = rem / (params.kv_heads * HD);
    let head = (rem / HD) % params.kv_heads;
    let dest = dests[tok];
    let base = select(params.k_base, params.v_base, i >= per_part);
    let a = row_elem(dest.x, dest.y, head, base);
    put(a.x, a.y + rem % HD, x);
}
