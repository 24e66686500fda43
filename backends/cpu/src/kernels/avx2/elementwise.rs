//! Element-wise kernels: widening stored rows to f32, dot products and
//! `axpy`.

use std::arch::x86_64::*;

use crate::kernels::scalar;

pub(super) fn widen_f32(src: &[u8], dst: &mut [f32]) {
    let n = dst.len().min(src.len() / 4);
    // SAFETY: reads `n` f32 from `src` and writes `n` to `dst`, both in
    // bounds; unaligned access is allowed by `loadu`/`storeu`; AVX2 is
    // present (see above).
    unsafe { widen_f32_avx2(src.as_ptr(), dst.as_mut_ptr(), n) }
}

pub(super) fn widen_f16(src: &[u8], dst: &mut [f32]) {
    let n = dst.len().min(src.len() / 2);
    // SAFETY: reads `n` f16 from `src`, writes `n` f32 to `dst`, in bounds;
    // AVX2 and F16C are present.
    unsafe { widen_f16_avx2(src.as_ptr(), dst.as_mut_ptr(), n) }
}

pub(super) fn widen_bf16(src: &[u8], dst: &mut [f32]) {
    let n = dst.len().min(src.len() / 2);
    // SAFETY: reads `n` bf16 from `src`, writes `n` f32 to `dst`, in bounds;
    // AVX2 is present.
    unsafe { widen_bf16_avx2(src.as_ptr(), dst.as_mut_ptr(), n) }
}

pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    // SAFETY: reads `n` elements of each slice, in bounds; AVX2 and FMA are
    // present.
    unsafe { dot_avx2(a.as_ptr(), b.as_ptr(), n) }
}

pub(super) fn axpy(acc: &mut [f32], w: f32, x: &[f32]) {
    let n = acc.len().min(x.len());
    // SAFETY: reads `n` of `x`, reads and writes `n` of `acc`, in bounds;
    // AVX2 and FMA are present.
    unsafe { axpy_avx2(acc.as_mut_ptr(), w, x.as_ptr(), n) }
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
