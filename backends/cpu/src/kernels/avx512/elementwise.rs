//! Element-wise kernels: widening stored rows to f32, dot products and
//! `axpy`, sixteen lanes at a time.

use std::arch::x86_64::*;

use super::{load16, mask};
use crate::kernels::avx2;

pub(super) fn widen_f32(src: &[u8], dst: &mut [f32]) {
    widen::<{ avx2::F32 }>(src, dst);
}

pub(super) fn widen_f16(src: &[u8], dst: &mut [f32]) {
    widen::<{ avx2::F16 }>(src, dst);
}

pub(super) fn widen_bf16(src: &[u8], dst: &mut [f32]) {
    widen::<{ avx2::BF16 }>(src, dst);
}

/// Widens `dst.len()` elements of encoding `E` (as many as `src` holds).
fn widen<const E: u8>(src: &[u8], dst: &mut [f32]) {
    let size = if E == avx2::F32 { 4 } else { 2 };
    let n = dst.len().min(src.len() / size);
    // SAFETY: reads `n` elements from `src`, writes `n` f32 to `dst`, in
    // bounds; AVX-512 F, BW and VL are present.
    unsafe { widen_avx512::<E>(src.as_ptr(), dst.as_mut_ptr(), n) }
}

/// # Safety
/// `src` is valid for `n` elements of encoding `E`, `dst` for `n` f32
/// writes; AVX-512 F, BW and VL are present.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn widen_avx512<const E: u8>(src: *const u8, dst: *mut f32, n: usize) {
    let mut i = 0;
    while i < n {
        let m = mask(n - i);
        // SAFETY: the mask keeps every access below `n` elements.
        unsafe { _mm512_mask_storeu_ps(dst.add(i), m, load16::<E>(src, i, m)) };
        i += 16;
    }
}

pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    // SAFETY: reads `n` elements of each slice, in bounds; AVX-512 F is
    // present.
    unsafe { dot_avx512(a.as_ptr(), b.as_ptr(), n) }
}

/// # Safety
/// `a` and `b` are valid for `n` reads; AVX-512 F is present.
#[target_feature(enable = "avx512f")]
unsafe fn dot_avx512(a: *const f32, b: *const f32, n: usize) -> f32 {
    let mut s = _mm512_setzero_ps();
    let mut i = 0;
    while i < n {
        let m = mask(n - i);
        // SAFETY: the mask keeps every access below `n`.
        unsafe {
            s = _mm512_fmadd_ps(
                _mm512_maskz_loadu_ps(m, a.add(i)),
                _mm512_maskz_loadu_ps(m, b.add(i)),
                s,
            );
        }
        i += 16;
    }
    _mm512_reduce_add_ps(s)
}

pub(super) fn axpy(acc: &mut [f32], w: f32, x: &[f32]) {
    let n = acc.len().min(x.len());
    // SAFETY: reads `n` of `x`, reads and writes `n` of `acc`, in bounds;
    // AVX-512 F is present.
    unsafe { axpy_avx512(acc.as_mut_ptr(), w, x.as_ptr(), n) }
}

/// # Safety
/// `acc` is valid for `n` reads and writes, `x` for `n` reads, and they do
/// not overlap; AVX-512 F is present.
#[target_feature(enable = "avx512f")]
unsafe fn axpy_avx512(acc: *mut f32, w: f32, x: *const f32, n: usize) {
    let wv = _mm512_set1_ps(w);
    let mut i = 0;
    while i < n {
        let m = mask(n - i);
        // SAFETY: the mask keeps every access below `n`.
        unsafe {
            let y = _mm512_fmadd_ps(
                wv,
                _mm512_maskz_loadu_ps(m, x.add(i)),
                _mm512_maskz_loadu_ps(m, acc.add(i)),
            );
            _mm512_mask_storeu_ps(acc.add(i), m, y);
        }
        i += 16;
    }
}
