//! Scaled 8-bit storage: int8 and fp8 E4M3 rows with one f32 scale each.
//!
//! A row is one token's `head_dim` values of one kv head. Its scale is
//! its largest magnitude over the type's largest code (127 for int8, 448
//! for E4M3), so the row's largest value is stored exactly at the top of
//! the range whatever the magnitude of the row, and nothing saturates.

/// The largest E4M3 magnitude (`0x7E`: exponent 15, mantissa 6, 1.75·2^8).
pub const F8E4M3_MAX: f32 = 448.0;

/// The largest int8 code a row uses (−128 is never written, so the range
/// is symmetric).
pub const I8_MAX: f32 = 127.0;

/// Below this largest magnitude a row is stored as zeros with scale 0: its
/// scale would be subnormal, and every value is under 10^-35 anyway.
pub const SCALED_ZERO_BELOW: f32 = f32::MIN_POSITIVE * F8E4M3_MAX;

/// The largest magnitude a scaled type stores: `q · scale` then stays
/// finite after rounding.
pub const SCALED_LIMIT: f32 = (1u128 << 127) as f32;

/// The E4M3 value of `code` (the OCP "e4m3fn" format: bias 7, no
/// infinities, `0x7F` and `0xFF` are NaN).
///
/// ```
/// use kvslice_core::{f8e4m3_from_f32, f8e4m3_to_f32};
///
/// assert_eq!(f8e4m3_to_f32(0x7E), 448.0);
/// assert_eq!(f8e4m3_to_f32(0x01), 2f32.powi(-9)); // smallest subnormal
/// assert!(f8e4m3_to_f32(0x7F).is_nan());
/// assert_eq!(f8e4m3_to_f32(f8e4m3_from_f32(0.3)), 0.3125); // nearest
/// ```
pub fn f8e4m3_to_f32(code: u8) -> f32 {
    let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
    let (e, m) = (i32::from((code >> 3) & 0xF), f32::from(code & 7));
    if e == 15 && m == 7.0 {
        return f32::NAN;
    }
    let magnitude = if e == 0 {
        m * pow2(-9)
    } else {
        (1.0 + m / 8.0) * pow2(e - 7)
    };
    sign * magnitude
}

/// The E4M3 code nearest `x` (ties to even), saturating at ±448. `x` is
/// finite.
pub fn f8e4m3_from_f32(x: f32) -> u8 {
    let sign = ((x.to_bits() >> 24) & 0x80) as u8;
    let a = x.abs();
    if a >= F8E4M3_MAX {
        return sign | 0x7E;
    }
    if a < pow2(-6) {
        // Subnormals and zero, in steps of 2^-9; 8 steps is the smallest
        // normal, code 0x08, so the rounding carries over on its own.
        return sign | libm::rintf(a * 512.0) as u8;
    }
    // Round the f32 mantissa to 3 bits, ties to even; a carry moves into
    // the exponent, which is what rounding up to the next binade means.
    let bits = a.to_bits();
    let r = bits + 0x7_FFFF + ((bits >> 20) & 1);
    let e = (r >> 23) as i32 - 127 + 7;
    let code = ((e as u32) << 3) | ((r >> 20) & 7);
    sign | code.min(0x7E) as u8
}

fn pow2(e: i32) -> f32 {
    f32::from_bits(((e + 127) as u32) << 23)
}

/// The largest magnitude of `row`.
fn amax(row: &[f32]) -> f32 {
    row.iter().fold(0f32, |m, x| m.max(x.abs()))
}

/// Codes of `src` into `out` for a type whose largest code is
/// `max_code`, `code` rounding a value already in range; returns the
/// row's scale.
fn quantize(src: &[f32], out: &mut [u8], max_code: f32, code: impl Fn(f32) -> u8) -> f32 {
    let a = amax(src);
    if a < SCALED_ZERO_BELOW {
        out.fill(0);
        return 0.0;
    }
    let inv = max_code / a;
    for (o, x) in out.iter_mut().zip(src) {
        *o = code(x * inv);
    }
    a / max_code
}

/// int8 codes of `src` into `out`, returning the row's scale.
pub(super) fn quantize_i8(src: &[f32], out: &mut [u8]) -> f32 {
    quantize(src, out, I8_MAX, |y| {
        libm::rintf(y).clamp(-I8_MAX, I8_MAX) as i8 as u8
    })
}

/// E4M3 codes of `src` into `out`, returning the row's scale.
pub(super) fn quantize_f8e4m3(src: &[f32], out: &mut [u8]) -> f32 {
    quantize(src, out, F8E4M3_MAX, f8e4m3_from_f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every finite code decodes to a value that encodes back to it, and
    /// the encoder picks the nearest code (ties to even) for the midpoints
    /// between neighbours and points near them.
    #[test]
    fn e4m3_encoding_is_nearest_even_and_exhaustive() {
        let finite: alloc::vec::Vec<(u8, f32)> =
            (0..=0x7Eu8).map(|c| (c, f8e4m3_to_f32(c))).collect();
        for &(c, x) in &finite {
            assert_eq!(f8e4m3_from_f32(x), c, "{x}");
            assert_eq!(f8e4m3_from_f32(-x), c | 0x80, "{x}");
        }
        for w in finite.windows(2) {
            let ((c0, x0), (c1, x1)) = (w[0], w[1]);
            assert!(x1 > x0, "codes ascend");
            let mid = (x0 + x1) / 2.0;
            let even = if c0 % 2 == 0 { c0 } else { c1 };
            assert_eq!(f8e4m3_from_f32(mid), even, "tie {x0}..{x1}");
            let step = (x1 - x0) / 64.0;
            assert_eq!(f8e4m3_from_f32(mid - step), c0, "below {mid}");
            assert_eq!(f8e4m3_from_f32(mid + step), c1, "above {mid}");
        }
        assert_eq!(f8e4m3_from_f32(1e30), 0x7E, "saturates");
        assert_eq!(f8e4m3_from_f32(-500.0), 0xFE);
        assert!(f8e4m3_to_f32(0xFF).is_nan());
    }

    #[test]
    fn rows_keep_their_largest_value_exactly_in_range() {
        let row = [0.5f32, -3.0, 1e-3, 2.25];
        let mut q = [0u8; 4];
        let s = quantize_i8(&row, &mut q);
        assert_eq!(s, 3.0 / 127.0);
        assert_eq!(q[1] as i8, -127);
        assert_eq!(q[0] as i8, 21); // 0.5 · 127 / 3 = 21.17
        let s = quantize_f8e4m3(&row, &mut q);
        assert_eq!(s, 3.0 / 448.0);
        assert_eq!(f8e4m3_to_f32(q[1]), -448.0);
        let tiny = [1e-37f32, -1e-38];
        assert_eq!(quantize_i8(&tiny, &mut q[..2]), 0.0);
        assert_eq!(q[..2], [0, 0]);
    }
}
