//! Online softmax over score rows, and the vectorised `exp` it rests on,
//! sixteen lanes at a time.

use std::arch::x86_64::*;

use super::mask;
use crate::kernels::exp_consts::*;
use crate::kernels::shapes;

pub(super) fn softmax_rows(
    s: &mut [f32],
    n: usize,
    max: &mut [f32],
    sum: &mut [f32],
    rescale: &mut [f32],
) {
    let rows = max.len();
    shapes::check_softmax(s.len(), rows, n, sum.len(), rescale.len());
    // SAFETY: `s` holds `rows·n` elements, and `max`, `sum` and `rescale`
    // `rows`, checked above; AVX-512 F is present.
    unsafe {
        softmax_rows_avx512(
            s.as_mut_ptr(),
            rows,
            n,
            max.as_mut_ptr(),
            sum.as_mut_ptr(),
            rescale.as_mut_ptr(),
        )
    };
}

/// [`Kernels::softmax_rows`](crate::kernels::Kernels::softmax_rows) in two passes over all rows (maxima, then
/// exponentials and sums), sixteen scores per step, the last one masked.
///
/// # Safety
/// `s` is valid for `rows·n` reads and writes, `max`, `sum` and `rescale`
/// for `rows`; AVX-512 F is present.
#[target_feature(enable = "avx512f")]
unsafe fn softmax_rows_avx512(
    s: *mut f32,
    rows: usize,
    n: usize,
    max: *mut f32,
    sum: *mut f32,
    rescale: *mut f32,
) {
    // SAFETY: every unmasked access is below `rows·n` (scores) or `rows`
    // (state) by the loop bounds and the masks.
    unsafe {
        for r in 0..rows {
            let row = s.add(r * n);
            let old = *max.add(r);
            let m = _mm512_reduce_max_ps(max_lanes(row, n, _mm512_set1_ps(old)));
            // The old max's weight under the new one, with the same
            // polynomial as the scores (exactly 1 when the max held).
            *rescale.add(r) = if m > old {
                _mm512_cvtss_f32(exp16(_mm512_set1_ps(old - m)))
            } else {
                1.0
            };
            *max.add(r) = m;
        }
        for r in 0..rows {
            let row = s.add(r * n);
            let vs = exp_shifted(row, n, _mm512_set1_ps(*max.add(r)));
            *sum.add(r) = *sum.add(r) * *rescale.add(r) + _mm512_reduce_add_ps(vs);
        }
    }
}

/// The lane-wise maximum of `start` and the `len` elements of `x`, read
/// sixteen at a time; lane `l` covers the elements `l`, `l + 16`, ...
/// (masked-off lanes of the last step keep their running max).
///
/// # Safety
/// `x` is valid for `len` reads; AVX-512 F is present.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn max_lanes(x: *const f32, len: usize, start: __m512) -> __m512 {
    let mut vm = start;
    let mut i = 0;
    while i < len {
        // SAFETY: the mask keeps every access below `len`.
        vm = _mm512_max_ps(vm, unsafe {
            _mm512_mask_loadu_ps(vm, mask(len - i), x.add(i))
        });
        i += 16;
    }
    vm
}

/// `x[i] = e^(x[i] − m)` for the `len` elements of `x`, lane `i % 16` of
/// `m` for element `i`, sixteen at a time with the last step masked;
/// returns the lane-wise sums of the results.
///
/// # Safety
/// `x` is valid for `len` reads and writes; AVX-512 F is present.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn exp_shifted(x: *mut f32, len: usize, m: __m512) -> __m512 {
    let mut vs = _mm512_setzero_ps();
    let mut i = 0;
    while i < len {
        let k = mask(len - i);
        // SAFETY: the mask keeps every access below `len`.
        unsafe {
            let e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x.add(i)), m));
            _mm512_mask_storeu_ps(x.add(i), k, e);
            vs = _mm512_mask_add_ps(vs, k, vs, e);
        }
        i += 16;
    }
    vs
}

pub(super) fn exp(xs: &mut [f32]) {
    let n = xs.len();
    // SAFETY: reads and writes `n` elements of `xs`, in bounds; AVX-512 F
    // is present.
    unsafe { exp_avx512(xs.as_mut_ptr(), n) }
}

/// `e^x` for sixteen lanes: the AVX2 set's `exp8` (`x = n·ln2 + r`, Cephes'
/// degree-6 polynomial for `e^r`, `2^n` built in the exponent bits), twice
/// as wide.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn exp16(x: __m512) -> __m512 {
    let x = _mm512_min_ps(
        _mm512_max_ps(x, _mm512_set1_ps(EXP_MIN)),
        _mm512_set1_ps(EXP_MAX),
    );
    // Round toward −∞ (1), exceptions suppressed (8).
    let n = _mm512_roundscale_ps::<0x09>(_mm512_fmadd_ps(
        x,
        _mm512_set1_ps(std::f32::consts::LOG2_E),
        _mm512_set1_ps(0.5),
    ));
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2_HI), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2_LO), r);
    let mut p = _mm512_set1_ps(EXP_POLY[0]);
    for c in &EXP_POLY[1..] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(*c));
    }
    let y = _mm512_add_ps(
        _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r),
        _mm512_set1_ps(1.0),
    );
    let pow2n = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(
        _mm512_cvtps_epi32(n),
        _mm512_set1_epi32(127),
    )));
    _mm512_mul_ps(y, pow2n)
}

/// # Safety
/// `xs` is valid for `n` reads and writes; AVX-512 F is present.
#[target_feature(enable = "avx512f")]
unsafe fn exp_avx512(xs: *mut f32, n: usize) {
    let mut i = 0;
    while i < n {
        let m = mask(n - i);
        // SAFETY: the mask keeps every access below `n`.
        unsafe {
            let x = exp16(_mm512_maskz_loadu_ps(m, xs.add(i)));
            _mm512_mask_storeu_ps(xs.add(i), m, x);
        }
        i += 16;
    }
}
