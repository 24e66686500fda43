//! aarch64 kernels with NEON: four f32 lanes per instruction, fused
//! multiply-add, and a single-instruction horizontal sum. NEON is part of
//! the aarch64 baseline. All of this file's `unsafe` is pointer access.

use std::arch::aarch64::*;

use super::exp_consts::*;
use super::{Kernels, scalar, shapes};

/// The NEON table (every aarch64 CPU has NEON; checked anyway).
pub(super) fn kernels() -> Option<Kernels> {
    std::arch::is_aarch64_feature_detected!("neon").then_some(Kernels {
        name: "neon",
        widen_f16,
        widen_bf16,
        widen_f32,
        dot,
        axpy,
        exp,
        softmax_rows: scalar::softmax_rows,
        scores,
        weighted_sum,
        stored: None,
        scale_key_major: scalar::scale_key_major,
        prefetch,
    })
}

// The safe wrappers check lengths; the `unsafe` fns below rely on those
// checks for every pointer offset, and on NEON being present (above).

/// A no-op: Rust's aarch64 prefetch intrinsic is not stable yet.
fn prefetch(_: &[u8]) {}

fn widen_f32(src: &[u8], dst: &mut [f32]) {
    let n = dst.len().min(src.len() / 4);
    // SAFETY: reads `4n` bytes of `src`, writes `n` f32 of `dst`, in bounds.
    unsafe { widen_f32_neon(src.as_ptr(), dst.as_mut_ptr(), n) }
}

fn widen_f16(src: &[u8], dst: &mut [f32]) {
    let n = dst.len().min(src.len() / 2);
    // SAFETY: reads `2n` bytes of `src`, writes `n` f32 of `dst`, in bounds.
    unsafe { widen_f16_neon(src.as_ptr(), dst.as_mut_ptr(), n) }
}

fn widen_bf16(src: &[u8], dst: &mut [f32]) {
    let n = dst.len().min(src.len() / 2);
    // SAFETY: reads `2n` bytes of `src`, writes `n` f32 of `dst`, in bounds.
    unsafe { widen_bf16_neon(src.as_ptr(), dst.as_mut_ptr(), n) }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    // SAFETY: reads `n` elements of each slice, in bounds.
    unsafe { dot_neon(a.as_ptr(), b.as_ptr(), n) }
}

fn axpy(acc: &mut [f32], w: f32, x: &[f32]) {
    let n = acc.len().min(x.len());
    // SAFETY: reads `n` of `x`, reads and writes `n` of `acc`, in bounds.
    unsafe { axpy_neon(acc.as_mut_ptr(), w, x.as_ptr(), n) }
}

fn exp(xs: &mut [f32]) {
    let n = xs.len();
    // SAFETY: reads and writes `n` elements of `xs`, in bounds.
    unsafe { exp_neon(xs.as_mut_ptr(), n) }
}

fn scores(q: &[f32], rows: usize, k: &[f32], n: usize, out: &mut [f32], _ahead: &[u8]) {
    let d = shapes::scores_width(q.len(), rows, k.len(), 1, n, out.len());
    // SAFETY: the shape check above bounds every access made below.
    unsafe { scores_neon(q.as_ptr(), rows, k.as_ptr(), n, d, out.as_mut_ptr()) }
}

fn weighted_sum(p: &[f32], rows: usize, v: &[f32], n: usize, acc: &mut [f32], _ahead: &[u8]) {
    let d = shapes::weighted_sum_width(p.len(), rows, v.len(), 1, n, acc.len());
    // SAFETY: the shape check above bounds every access made below.
    unsafe { weighted_sum_neon(p.as_ptr(), rows, v.as_ptr(), n, d, acc.as_mut_ptr()) }
}

/// Four f16 bit patterns to f32, exactly (subnormals, infinities and NaN
/// included): shift exponent and mantissa into f32 position and rescale by
/// 2^112, which also normalises subnormals; infinities and NaN get the all
/// ones exponent; the sign goes back on last.
#[target_feature(enable = "neon")]
fn f16x4_to_f32(h: uint16x4_t) -> float32x4_t {
    let w = vmovl_u16(h);
    let sign = vshlq_n_u32::<16>(vandq_u32(w, vdupq_n_u32(0x8000)));
    let em = vandq_u32(w, vdupq_n_u32(0x7fff));
    let shifted = vshlq_n_u32::<13>(em);
    let scaled = vmulq_f32(
        vreinterpretq_f32_u32(shifted),
        vreinterpretq_f32_u32(vdupq_n_u32(0x7780_0000)), // 2^112
    );
    let inf_nan = vcgeq_u32(em, vdupq_n_u32(0x7c00));
    let special = vorrq_u32(shifted, vdupq_n_u32(0x7f80_0000));
    let bits = vbslq_u32(inf_nan, special, vreinterpretq_u32_f32(scaled));
    vreinterpretq_f32_u32(vorrq_u32(bits, sign))
}

/// # Safety
/// `src` is valid for `4n` bytes, `dst` for `n` f32 writes.
#[target_feature(enable = "neon")]
unsafe fn widen_f32_neon(src: *const u8, dst: *mut f32, n: usize) {
    let mut i = 0;
    while i + 4 <= n {
        // SAFETY: `i + 4 <= n` keeps both accesses in bounds.
        unsafe { vst1q_f32(dst.add(i), vld1q_f32(src.add(4 * i).cast())) };
        i += 4;
    }
    // SAFETY: the tail stays in bounds by the same contract.
    let (s, d) = unsafe {
        (
            std::slice::from_raw_parts(src.add(4 * i), 4 * (n - i)),
            std::slice::from_raw_parts_mut(dst.add(i), n - i),
        )
    };
    (scalar::kernels().widen_f32)(s, d);
}

/// # Safety
/// `src` is valid for `2n` bytes, `dst` for `n` f32 writes.
#[target_feature(enable = "neon")]
unsafe fn widen_f16_neon(src: *const u8, dst: *mut f32, n: usize) {
    let mut i = 0;
    while i + 4 <= n {
        // SAFETY: `i + 4 <= n`: 8 bytes read, 4 f32 written, in bounds.
        unsafe {
            let h = vld1_u16(src.add(2 * i).cast());
            vst1q_f32(dst.add(i), f16x4_to_f32(h));
        }
        i += 4;
    }
    // SAFETY: the tail stays in bounds by the same contract.
    let (s, d) = unsafe {
        (
            std::slice::from_raw_parts(src.add(2 * i), 2 * (n - i)),
            std::slice::from_raw_parts_mut(dst.add(i), n - i),
        )
    };
    (scalar::kernels().widen_f16)(s, d);
}

/// # Safety
/// `src` is valid for `2n` bytes, `dst` for `n` f32 writes.
#[target_feature(enable = "neon")]
unsafe fn widen_bf16_neon(src: *const u8, dst: *mut f32, n: usize) {
    let mut i = 0;
    while i + 4 <= n {
        // SAFETY: `i + 4 <= n`: 8 bytes read, 4 f32 written, in bounds. A
        // bf16 is the top half of an f32: widen and shift up.
        unsafe {
            let h = vld1_u16(src.add(2 * i).cast());
            vst1q_f32(dst.add(i), vreinterpretq_f32_u32(vshll_n_u16::<16>(h)));
        }
        i += 4;
    }
    // SAFETY: the tail stays in bounds by the same contract.
    let (s, d) = unsafe {
        (
            std::slice::from_raw_parts(src.add(2 * i), 2 * (n - i)),
            std::slice::from_raw_parts_mut(dst.add(i), n - i),
        )
    };
    (scalar::kernels().widen_bf16)(s, d);
}

/// # Safety
/// `a` and `b` are valid for `n` reads.
#[target_feature(enable = "neon")]
unsafe fn dot_neon(a: *const f32, b: *const f32, n: usize) -> f32 {
    let mut s0 = vdupq_n_f32(0.0);
    let mut s1 = vdupq_n_f32(0.0);
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: `i + 8 <= n` keeps all four loads in bounds.
        unsafe {
            s0 = vfmaq_f32(s0, vld1q_f32(a.add(i)), vld1q_f32(b.add(i)));
            s1 = vfmaq_f32(s1, vld1q_f32(a.add(i + 4)), vld1q_f32(b.add(i + 4)));
        }
        i += 8;
    }
    if i + 4 <= n {
        // SAFETY: `i + 4 <= n`.
        unsafe { s0 = vfmaq_f32(s0, vld1q_f32(a.add(i)), vld1q_f32(b.add(i))) };
        i += 4;
    }
    let mut total = vaddvq_f32(vaddq_f32(s0, s1));
    while i < n {
        // SAFETY: `i < n`.
        unsafe { total += *a.add(i) * *b.add(i) };
        i += 1;
    }
    total
}

/// # Safety
/// `acc` is valid for `n` reads and writes, `x` for `n` reads, and they do
/// not overlap.
#[target_feature(enable = "neon")]
unsafe fn axpy_neon(acc: *mut f32, w: f32, x: *const f32, n: usize) {
    let wv = vdupq_n_f32(w);
    let mut i = 0;
    while i + 4 <= n {
        // SAFETY: `i + 4 <= n`.
        unsafe {
            vst1q_f32(
                acc.add(i),
                vfmaq_f32(vld1q_f32(acc.add(i)), wv, vld1q_f32(x.add(i))),
            )
        };
        i += 4;
    }
    while i < n {
        // SAFETY: `i < n`.
        unsafe { *acc.add(i) += w * *x.add(i) };
        i += 1;
    }
}

/// `e^x` for four lanes, the same range reduction and Cephes polynomial as
/// the AVX2 kernel.
#[target_feature(enable = "neon")]
fn exp4(x: float32x4_t) -> float32x4_t {
    let x = vminq_f32(vmaxq_f32(x, vdupq_n_f32(EXP_MIN)), vdupq_n_f32(EXP_MAX));
    let n = vrndmq_f32(vfmaq_f32(
        vdupq_n_f32(0.5),
        x,
        vdupq_n_f32(std::f32::consts::LOG2_E),
    ));
    let r = vfmsq_f32(x, n, vdupq_n_f32(EXP_LN2_HI));
    let r = vfmsq_f32(r, n, vdupq_n_f32(EXP_LN2_LO));
    let mut p = vdupq_n_f32(EXP_POLY[0]);
    for c in &EXP_POLY[1..] {
        p = vfmaq_f32(vdupq_n_f32(*c), p, r);
    }
    let y = vaddq_f32(vfmaq_f32(r, vmulq_f32(p, r), r), vdupq_n_f32(1.0));
    let pow2n = vreinterpretq_f32_s32(vshlq_n_s32::<23>(vaddq_s32(
        vcvtq_s32_f32(n),
        vdupq_n_s32(127),
    )));
    vmulq_f32(y, pow2n)
}

/// # Safety
/// `xs` is valid for `n` reads and writes.
#[target_feature(enable = "neon")]
unsafe fn exp_neon(xs: *mut f32, n: usize) {
    let mut i = 0;
    while i + 4 <= n {
        // SAFETY: `i + 4 <= n`.
        unsafe { vst1q_f32(xs.add(i), exp4(vld1q_f32(xs.add(i)))) };
        i += 4;
    }
    if i < n {
        // The tail through a stack buffer, so it uses the same polynomial.
        let mut buf = [0f32; 4];
        // SAFETY: `n - i < 4` elements are read from and written back to `xs`.
        unsafe {
            std::ptr::copy_nonoverlapping(xs.add(i), buf.as_mut_ptr(), n - i);
            vst1q_f32(buf.as_mut_ptr(), exp4(vld1q_f32(buf.as_ptr())));
            std::ptr::copy_nonoverlapping(buf.as_ptr(), xs.add(i), n - i);
        }
    }
}

/// # Safety
/// `q` is valid for `rows·d` reads, `k` for `n·d`, `out` for `rows·n`
/// writes.
#[target_feature(enable = "neon")]
unsafe fn scores_neon(
    q: *const f32,
    rows: usize,
    k: *const f32,
    n: usize,
    d: usize,
    out: *mut f32,
) {
    // SAFETY: every offset below stays under `n·d` (keys), `rows·d`
    // (queries) or `rows·n` (scores) by the loop bounds.
    unsafe {
        let lanes = d / 4 * 4;
        let finish = |sum: float32x4_t, r: usize, j: usize| {
            let mut t = vaddvq_f32(sum);
            for e in lanes..d {
                t += *q.add(r * d + e) * *k.add(j * d + e);
            }
            *out.add(r * n + j) = t;
        };
        let mut r = 0;
        while r < rows {
            // Up to four query rows share each key load and two keys each
            // query load, as in the AVX2 kernel.
            let g = (rows - r).min(4);
            let mut j = 0;
            while j < n {
                let two = j + 1 < n;
                let (k0, k1) = (k.add(j * d), k.add((j + usize::from(two)) * d));
                let mut a0 = [vdupq_n_f32(0.0); 4];
                let mut a1 = [vdupq_n_f32(0.0); 4];
                let mut c = 0;
                while c < lanes {
                    let (kv0, kv1) = (vld1q_f32(k0.add(c)), vld1q_f32(k1.add(c)));
                    for i in 0..g {
                        let qv = vld1q_f32(q.add((r + i) * d + c));
                        a0[i] = vfmaq_f32(a0[i], qv, kv0);
                        a1[i] = vfmaq_f32(a1[i], qv, kv1);
                    }
                    c += 4;
                }
                for i in 0..g {
                    finish(a0[i], r + i, j);
                    if two {
                        finish(a1[i], r + i, j + 1);
                    }
                }
                j += 2;
            }
            r += g;
        }
    }
}

/// # Safety
/// `p` is valid for `rows·n` reads, `v` for `n·d`, `acc` for `rows·d` reads
/// and writes.
#[target_feature(enable = "neon")]
unsafe fn weighted_sum_neon(
    p: *const f32,
    rows: usize,
    v: *const f32,
    n: usize,
    d: usize,
    acc: *mut f32,
) {
    // SAFETY: every offset below stays under `rows·n` (weights), `n·d`
    // (values) or `rows·d` (accumulators) by the loop bounds.
    unsafe {
        let lanes = d / 4 * 4;
        let mut r = 0;
        while r < rows {
            let g = (rows - r).min(4);
            let mut c = 0;
            // Sixteen columns at a time when they exist: up to four rows ×
            // four vectors of accumulators (16 of NEON's 32 registers).
            while c < lanes {
                let width = (lanes - c).min(16) / 4;
                let mut a = [[vdupq_n_f32(0.0); 4]; 4];
                for (i, row) in a.iter_mut().enumerate().take(g) {
                    for (u, slot) in row.iter_mut().enumerate().take(width) {
                        *slot = vld1q_f32(acc.add((r + i) * d + c + 4 * u));
                    }
                }
                for j in 0..n {
                    let mut vv = [vdupq_n_f32(0.0); 4];
                    for (u, slot) in vv.iter_mut().enumerate().take(width) {
                        *slot = vld1q_f32(v.add(j * d + c + 4 * u));
                    }
                    for (i, row) in a.iter_mut().enumerate().take(g) {
                        let w = vdupq_n_f32(*p.add((r + i) * n + j));
                        for (slot, x) in row.iter_mut().zip(&vv).take(width) {
                            *slot = vfmaq_f32(*slot, w, *x);
                        }
                    }
                }
                for (i, row) in a.iter().enumerate().take(g) {
                    for (u, slot) in row.iter().enumerate().take(width) {
                        vst1q_f32(acc.add((r + i) * d + c + 4 * u), *slot);
                    }
                }
                c += 4 * width;
            }
            for i in 0..g {
                for e in lanes..d {
                    let mut t = 0f32;
                    for j in 0..n {
                        t += *p.add((r + i) * n + j) * *v.add(j * d + e);
                    }
                    *acc.add((r + i) * d + e) += t;
                }
            }
            r += g;
        }
    }
}
