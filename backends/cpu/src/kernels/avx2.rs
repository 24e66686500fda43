//! x86-64 kernels with AVX2, FMA and F16C: eight f32 lanes per instruction.
//! All of this crate's `unsafe` is in this file.

use std::arch::x86_64::*;

use super::{Kernels, scalar};

/// The AVX2 table, if the CPU has AVX2, FMA and F16C.
pub(super) fn kernels() -> Option<Kernels> {
    let ok = is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c");
    ok.then_some(Kernels {
        name: "avx2+fma+f16c",
        widen_f16,
        widen_bf16,
        widen_f32,
        dot,
        axpy,
        exp,
        scores,
        weighted_sum,
        prefetch,
    })
}

// The safe wrappers below are reachable only through the table `kernels()`
// returns, which exists only after the features were detected: that is the
// invariant every `SAFETY` comment here relies on.

fn prefetch(bytes: &[u8]) {
    for line in bytes.chunks(64) {
        // SAFETY: a prefetch is a hint with no architectural effect; it
        // never faults, and the address is inside `bytes` anyway. SSE is
        // part of x86-64.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast()) };
    }
}

fn widen_f32(src: &[u8], dst: &mut [f32]) {
    let n = dst.len().min(src.len() / 4);
    // SAFETY: reads `n` f32 from `src` and writes `n` to `dst`, both in
    // bounds; unaligned access is allowed by `loadu`/`storeu`; AVX2 is
    // present (see above).
    unsafe { widen_f32_avx2(src.as_ptr(), dst.as_mut_ptr(), n) }
}

fn widen_f16(src: &[u8], dst: &mut [f32]) {
    let n = dst.len().min(src.len() / 2);
    // SAFETY: reads `n` f16 from `src`, writes `n` f32 to `dst`, in bounds;
    // AVX2 and F16C are present.
    unsafe { widen_f16_avx2(src.as_ptr(), dst.as_mut_ptr(), n) }
}

fn widen_bf16(src: &[u8], dst: &mut [f32]) {
    let n = dst.len().min(src.len() / 2);
    // SAFETY: reads `n` bf16 from `src`, writes `n` f32 to `dst`, in bounds;
    // AVX2 is present.
    unsafe { widen_bf16_avx2(src.as_ptr(), dst.as_mut_ptr(), n) }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    // SAFETY: reads `n` elements of each slice, in bounds; AVX2 and FMA are
    // present.
    unsafe { dot_avx2(a.as_ptr(), b.as_ptr(), n) }
}

fn axpy(acc: &mut [f32], w: f32, x: &[f32]) {
    let n = acc.len().min(x.len());
    // SAFETY: reads `n` of `x`, reads and writes `n` of `acc`, in bounds;
    // AVX2 and FMA are present.
    unsafe { axpy_avx2(acc.as_mut_ptr(), w, x.as_ptr(), n) }
}

fn scores(q: &[f32], rows: usize, k: &[f32], n: usize, out: &mut [f32]) {
    let d = q.len() / rows.max(1);
    assert!(
        k.len() >= n * d && out.len() >= rows * n && q.len() >= rows * d,
        "scores: shapes"
    );
    // SAFETY: the assert bounds every access made below; AVX2 and FMA are
    // present.
    unsafe { scores_avx2(q.as_ptr(), rows, k.as_ptr(), n, d, out.as_mut_ptr()) }
}

fn weighted_sum(p: &[f32], rows: usize, v: &[f32], n: usize, acc: &mut [f32]) {
    let d = acc.len() / rows.max(1);
    assert!(
        p.len() >= rows * n && v.len() >= n * d && acc.len() >= rows * d,
        "weighted_sum: shapes"
    );
    // SAFETY: the assert bounds every access made below; AVX2 and FMA are
    // present.
    unsafe { weighted_sum_avx2(p.as_ptr(), rows, v.as_ptr(), n, d, acc.as_mut_ptr()) }
}

/// Horizontal sum of eight lanes.
#[target_feature(enable = "avx2")]
fn hsum(s: __m256) -> f32 {
    let q = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    let q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    _mm_cvtss_f32(_mm_add_ss(q, _mm_shuffle_ps(q, q, 1)))
}

/// # Safety
/// `q` is valid for `rows·d` reads, `k` for `n·d`, `out` for `rows·n`
/// writes; AVX2 and FMA are present.
#[target_feature(enable = "avx2,fma")]
unsafe fn scores_avx2(
    q: *const f32,
    rows: usize,
    k: *const f32,
    n: usize,
    d: usize,
    out: *mut f32,
) {
    // SAFETY: every pointer offset below stays under `n·d` (keys), `rows·d`
    // (queries) or `rows·n` (scores) by the loop bounds, as the contract
    // requires; AVX2 and FMA are present.
    unsafe {
        let lanes = d / 8 * 8;
        // Dot product of query row `r` with key `j`, scalar tail included.
        let finish = |sum: __m256, r: usize, j: usize| {
            let mut t = hsum(sum);
            for e in lanes..d {
                t += *q.add(r * d + e) * *k.add(j * d + e);
            }
            *out.add(r * n + j) = t;
        };
        let mut r = 0;
        while r < rows {
            // Up to four query rows share each key load, and two keys each
            // query load: 8 accumulators, 6 loads per 8 FMAs.
            let g = (rows - r).min(4);
            let mut j = 0;
            while j < n {
                let two = j + 1 < n;
                let (k0, k1) = (k.add(j * d), k.add((j + usize::from(two)) * d));
                let mut a0 = [_mm256_setzero_ps(); 4];
                let mut a1 = [_mm256_setzero_ps(); 4];
                let mut c = 0;
                while c < lanes {
                    let (kv0, kv1) = (_mm256_loadu_ps(k0.add(c)), _mm256_loadu_ps(k1.add(c)));
                    for i in 0..g {
                        let qv = _mm256_loadu_ps(q.add((r + i) * d + c));
                        a0[i] = _mm256_fmadd_ps(qv, kv0, a0[i]);
                        a1[i] = _mm256_fmadd_ps(qv, kv1, a1[i]);
                    }
                    c += 8;
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
/// and writes; AVX2 and FMA are present.
#[target_feature(enable = "avx2,fma")]
unsafe fn weighted_sum_avx2(
    p: *const f32,
    rows: usize,
    v: *const f32,
    n: usize,
    d: usize,
    acc: *mut f32,
) {
    // SAFETY: every pointer offset below stays under `rows·n` (weights),
    // `n·d` (values) or `rows·d` (accumulators) by the loop bounds, as the
    // contract requires; AVX2 and FMA are present.
    unsafe {
        let lanes = d / 8 * 8;
        let mut r = 0;
        while r < rows {
            let g = (rows - r).min(4);
            let mut c = 0;
            // Sixteen columns at a time: up to four rows × two vectors of
            // accumulators stay in registers across all `n` keys.
            while c < lanes {
                let wide = c + 16 <= lanes;
                let c1 = if wide { c + 8 } else { c };
                let mut a0 = [_mm256_setzero_ps(); 4];
                let mut a1 = [_mm256_setzero_ps(); 4];
                for i in 0..g {
                    a0[i] = _mm256_loadu_ps(acc.add((r + i) * d + c));
                    a1[i] = _mm256_loadu_ps(acc.add((r + i) * d + c1));
                }
                for j in 0..n {
                    let v0 = _mm256_loadu_ps(v.add(j * d + c));
                    let v1 = _mm256_loadu_ps(v.add(j * d + c1));
                    for i in 0..g {
                        let w = _mm256_set1_ps(*p.add((r + i) * n + j));
                        a0[i] = _mm256_fmadd_ps(w, v0, a0[i]);
                        if wide {
                            a1[i] = _mm256_fmadd_ps(w, v1, a1[i]);
                        }
                    }
                }
                for i in 0..g {
                    _mm256_storeu_ps(acc.add((r + i) * d + c), a0[i]);
                    if wide {
                        _mm256_storeu_ps(acc.add((r + i) * d + c1), a1[i]);
                    }
                }
                c += if wide { 16 } else { 8 };
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

fn exp(xs: &mut [f32]) {
    let n = xs.len();
    // SAFETY: reads and writes `n` elements of `xs`, in bounds; AVX2 and FMA
    // are present.
    unsafe { exp_avx2(xs.as_mut_ptr(), n) }
}

/// `e^x` for eight lanes: `x = n·ln2 + r`, a degree-6 polynomial for `e^r`
/// (Cephes' `expf` coefficients), and `2^n` built in the exponent bits.
#[target_feature(enable = "avx2,fma")]
fn exp8(x: __m256) -> __m256 {
    let x = _mm256_min_ps(
        _mm256_max_ps(x, _mm256_set1_ps(-87.3)),
        _mm256_set1_ps(88.7),
    );
    let n = _mm256_floor_ps(_mm256_fmadd_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
        _mm256_set1_ps(0.5),
    ));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
    let mut p = _mm256_set1_ps(1.987_569_1e-4);
    for c in [
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        0.5,
    ] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let y = _mm256_add_ps(
        _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r),
        _mm256_set1_ps(1.0),
    );
    let pow2n = _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)),
        23,
    ));
    _mm256_mul_ps(y, pow2n)
}

/// # Safety
/// `xs` is valid for `n` reads and writes; AVX2 and FMA are present.
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_avx2(xs: *mut f32, n: usize) {
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: `i + 8 <= n`.
        unsafe { _mm256_storeu_ps(xs.add(i), exp8(_mm256_loadu_ps(xs.add(i)))) };
        i += 8;
    }
    if i < n {
        // The tail through a stack buffer, so it uses the same polynomial.
        let mut buf = [0f32; 8];
        // SAFETY: `n - i < 8` elements are read from and written back to `xs`.
        unsafe {
            std::ptr::copy_nonoverlapping(xs.add(i), buf.as_mut_ptr(), n - i);
            _mm256_storeu_ps(buf.as_mut_ptr(), exp8(_mm256_loadu_ps(buf.as_ptr())));
            std::ptr::copy_nonoverlapping(buf.as_ptr(), xs.add(i), n - i);
        }
    }
}

/// # Safety
/// `src` is valid for `4n` bytes, `dst` for `n` f32 writes; AVX2 is present.
#[target_feature(enable = "avx2")]
unsafe fn widen_f32_avx2(src: *const u8, dst: *mut f32, n: usize) {
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: `i + 8 <= n` keeps both accesses in bounds.
        unsafe { _mm256_storeu_ps(dst.add(i), _mm256_loadu_ps(src.add(4 * i).cast())) };
        i += 8;
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
/// `src` is valid for `2n` bytes, `dst` for `n` f32 writes; AVX2 and F16C
/// are present.
#[target_feature(enable = "avx2,f16c")]
unsafe fn widen_f16_avx2(src: *const u8, dst: *mut f32, n: usize) {
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: `i + 8 <= n`: 16 bytes read, 8 f32 written, in bounds.
        unsafe {
            _mm256_storeu_ps(
                dst.add(i),
                _mm256_cvtph_ps(_mm_loadu_si128(src.add(2 * i).cast())),
            )
        };
        i += 8;
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
/// `src` is valid for `2n` bytes, `dst` for `n` f32 writes; AVX2 is present.
#[target_feature(enable = "avx2")]
unsafe fn widen_bf16_avx2(src: *const u8, dst: *mut f32, n: usize) {
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: `i + 8 <= n`: 16 bytes read, 8 f32 written, in bounds. A
        // bf16 is the top half of an f32: zero-extend and shift up.
        unsafe {
            let h = _mm_loadu_si128(src.add(2 * i).cast());
            let w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
            _mm256_storeu_ps(dst.add(i), _mm256_castsi256_ps(w));
        }
        i += 8;
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
/// `a` and `b` are valid for `n` reads; AVX2 and FMA are present.
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(a: *const f32, b: *const f32, n: usize) -> f32 {
    let mut s0 = _mm256_setzero_ps();
    let mut s1 = _mm256_setzero_ps();
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: `i + 16 <= n` keeps all four loads in bounds.
        unsafe {
            s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a.add(i)), _mm256_loadu_ps(b.add(i)), s0);
            s1 = _mm256_fmadd_ps(
                _mm256_loadu_ps(a.add(i + 8)),
                _mm256_loadu_ps(b.add(i + 8)),
                s1,
            );
        }
        i += 16;
    }
    if i + 8 <= n {
        // SAFETY: `i + 8 <= n`.
        unsafe { s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a.add(i)), _mm256_loadu_ps(b.add(i)), s0) };
        i += 8;
    }
    let s = _mm256_add_ps(s0, s1);
    let lo = _mm256_castps256_ps128(s);
    let hi = _mm256_extractf128_ps(s, 1);
    let q = _mm_add_ps(lo, hi);
    let q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    let q = _mm_add_ss(q, _mm_shuffle_ps(q, q, 1));
    let mut total = _mm_cvtss_f32(q);
    while i < n {
        // SAFETY: `i < n`.
        unsafe { total += *a.add(i) * *b.add(i) };
        i += 1;
    }
    total
}

/// # Safety
/// `acc` is valid for `n` reads and writes, `x` for `n` reads, and they do
/// not overlap; AVX2 and FMA are present.
#[target_feature(enable = "avx2,fma")]
unsafe fn axpy_avx2(acc: *mut f32, w: f32, x: *const f32, n: usize) {
    let wv = _mm256_set1_ps(w);
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: `i + 8 <= n`.
        unsafe {
            _mm256_storeu_ps(
                acc.add(i),
                _mm256_fmadd_ps(wv, _mm256_loadu_ps(x.add(i)), _mm256_loadu_ps(acc.add(i))),
            )
        };
        i += 8;
    }
    while i < n {
        // SAFETY: `i < n`.
        unsafe { *acc.add(i) += w * *x.add(i) };
        i += 1;
    }
}
