//! Portable kernels: plain loops the compiler may auto-vectorise.

use kvslice_core::{bf16, f16};

use super::{Kernels, shapes};

pub(super) fn kernels() -> Kernels {
    Kernels {
        name: "scalar",
        widen_f16,
        widen_bf16,
        widen_f32,
        dot,
        axpy,
        exp,
        softmax_rows,
        scores,
        weighted_sum,
        stored: None,
        scale_key_major,
        prefetch,
    }
}

/// [`Kernels::scale_key_major`](super::Kernels::scale_key_major).
pub(super) fn scale_key_major(w: &mut [f32], scales: &[f32]) {
    for (w, s) in w.chunks_exact_mut(4).zip(scales) {
        w.iter_mut().for_each(|x| *x *= s);
    }
}

/// A no-op: portable code has no prefetch.
fn prefetch(_: &[u8]) {}

fn widen_f32(src: &[u8], dst: &mut [f32]) {
    for (d, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
}

fn widen_f16(src: &[u8], dst: &mut [f32]) {
    for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = f16::from_le_bytes([c[0], c[1]]).to_f32();
    }
}

fn widen_bf16(src: &[u8], dst: &mut [f32]) {
    for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = bf16::from_le_bytes([c[0], c[1]]).to_f32();
    }
}

/// The f16 bits of E4M3 code `c` shifted into place: the same sign,
/// exponent and mantissa fields with f16's bias of 15 instead of 7, so the
/// f16 is the code's value / 256 exactly, subnormals included (see
/// [`super::raw_scale`]). Codes `0x7F` and `0xFF`, NaN in E4M3, are never
/// written and come out as ±480 / 256.
pub(super) fn f8_raw_bits(c: u8) -> u16 {
    (u16::from(c & 0x80) << 8) | (u16::from(c & 0x7F) << 7)
}

/// int8 codes as f32, unscaled.
pub(super) fn widen_i8(src: &[u8], dst: &mut [f32]) {
    for (d, &c) in dst.iter_mut().zip(src) {
        *d = f32::from(c as i8);
    }
}

/// E4M3 codes as f32, unscaled and divided by 256 ([`f8_raw_bits`]).
pub(super) fn widen_f8(src: &[u8], dst: &mut [f32]) {
    for (d, &c) in dst.iter_mut().zip(src) {
        *d = f16::from_bits(f8_raw_bits(c)).to_f32();
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Four independent sums, so the loop is not one long dependency chain.
    let mut s = [0f32; 4];
    let (ac, ar) = a.split_at(a.len() / 4 * 4);
    let (bc, br) = b.split_at(ac.len());
    for (x, y) in ac.chunks_exact(4).zip(bc.chunks_exact(4)) {
        for i in 0..4 {
            s[i] += x[i] * y[i];
        }
    }
    let tail: f32 = ar.iter().zip(br).map(|(x, y)| x * y).sum();
    (s[0] + s[1]) + (s[2] + s[3]) + tail
}

fn axpy(acc: &mut [f32], w: f32, x: &[f32]) {
    for (a, v) in acc.iter_mut().zip(x) {
        *a += w * v;
    }
}

fn exp(xs: &mut [f32]) {
    xs.iter_mut().for_each(|x| *x = x.exp());
}

pub(super) fn softmax_rows(
    s: &mut [f32],
    n: usize,
    max: &mut [f32],
    sum: &mut [f32],
    rescale: &mut [f32],
) {
    // The same contract as the SIMD sets: short buffers are a bug, not rows
    // to skip.
    shapes::check_softmax(s.len(), max.len(), n, sum.len(), rescale.len());
    for (r, row) in s.chunks_exact_mut(n.max(1)).take(max.len()).enumerate() {
        let m = row.iter().copied().fold(max[r], f32::max);
        rescale[r] = if m > max[r] { (max[r] - m).exp() } else { 1.0 };
        row.iter_mut().for_each(|x| *x = (*x - m).exp());
        sum[r] = sum[r] * rescale[r] + row.iter().sum::<f32>();
        max[r] = m;
    }
}

fn scores(q: &[f32], rows: usize, k: &[f32], n: usize, out: &mut [f32], _ahead: &[u8]) {
    let d = q.len() / rows.max(1);
    for r in 0..rows {
        for j in 0..n {
            out[r * n + j] = dot(&q[r * d..(r + 1) * d], &k[j * d..(j + 1) * d]);
        }
    }
}

fn weighted_sum(p: &[f32], rows: usize, v: &[f32], n: usize, acc: &mut [f32], _ahead: &[u8]) {
    let d = acc.len() / rows.max(1);
    for r in 0..rows {
        for j in 0..n {
            axpy(
                &mut acc[r * d..(r + 1) * d],
                p[r * n + j],
                &v[j * d..(j + 1) * d],
            );
        }
    }
}
