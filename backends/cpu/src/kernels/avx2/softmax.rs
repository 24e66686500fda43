//! Online softmax over score rows (one row at a time, or four in
//! registers) and the vectorised `exp` it rests on.

use std::arch::x86_64::*;

use super::hsum4;
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
    // `rows`, checked above; AVX2 and FMA are present.
    unsafe {
        softmax_rows_avx2(
            s.as_mut_ptr(),
            rows,
            n,
            max.as_mut_ptr(),
            sum.as_mut_ptr(),
            rescale.as_mut_ptr(),
        )
    };
}

/// Horizontal max and sum of eight lanes.
#[target_feature(enable = "avx2")]
fn hmax(v: __m256) -> f32 {
    let q = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let q = _mm_max_ps(q, _mm_movehl_ps(q, q));
    _mm_cvtss_f32(_mm_max_ss(q, _mm_shuffle_ps(q, q, 1)))
}

#[target_feature(enable = "avx2")]
fn hadd(v: __m256) -> f32 {
    let q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    _mm_cvtss_f32(_mm_add_ss(q, _mm_shuffle_ps(q, q, 1)))
}

/// [`Kernels::softmax_rows`](crate::kernels::Kernels::softmax_rows): rows of whole vectors four at a time
/// ([`softmax_four_rows`]), the rest in two passes over all of them
/// (maxima, then exponentials and sums), so that the rows' dependency
/// chains overlap.
///
/// # Safety
/// `s` is valid for `rows·n` reads and writes, `max`, `sum` and `rescale`
/// for `rows`; AVX2 and FMA are present.
#[target_feature(enable = "avx2,fma")]
unsafe fn softmax_rows_avx2(
    s: *mut f32,
    rows: usize,
    n: usize,
    max: *mut f32,
    sum: *mut f32,
    rescale: *mut f32,
) {
    let lanes = n / 8 * 8;
    // Rows whose length is whole vectors go four at a time, with their
    // horizontal reductions, rescale factors and sums done once per four.
    let grouped = if lanes == n && n > 0 { rows / 4 * 4 } else { 0 };
    // SAFETY: rows `0..grouped` are within `rows` and whole vectors long;
    // the contract covers the rest.
    unsafe {
        let mut r = 0;
        while r < grouped {
            softmax_four_rows(s.add(r * n), n, max.add(r), sum.add(r), rescale.add(r));
            r += 4;
        }
    }
    let (s, rows) = (s.wrapping_add(grouped * n), rows - grouped);
    let (max, sum, rescale) = (
        max.wrapping_add(grouped),
        sum.wrapping_add(grouped),
        rescale.wrapping_add(grouped),
    );
    // SAFETY: every access is below `rows·n` (scores) or `rows` (state) by
    // the loop bounds; a row's tail goes through a stack buffer padded with
    // the row's max, whose padding lanes are not summed.
    unsafe {
        for r in 0..rows {
            let row = s.add(r * n);
            let mut vm = _mm256_set1_ps(*max.add(r));
            let mut i = 0;
            while i < lanes {
                vm = _mm256_max_ps(vm, _mm256_loadu_ps(row.add(i)));
                i += 8;
            }
            let mut m = hmax(vm);
            for e in lanes..n {
                m = m.max(*row.add(e));
            }
            let old = *max.add(r);
            // The old max's weight under the new one, with the same
            // polynomial as the scores (exactly 1 when the max held).
            *rescale.add(r) = if m > old {
                _mm256_cvtss_f32(exp8(_mm256_set1_ps(old - m)))
            } else {
                1.0
            };
            *max.add(r) = m;
        }
        for r in 0..rows {
            let row = s.add(r * n);
            let mv = _mm256_set1_ps(*max.add(r));
            let mut vs = _mm256_setzero_ps();
            let mut i = 0;
            while i < lanes {
                let x = exp8(_mm256_sub_ps(_mm256_loadu_ps(row.add(i)), mv));
                _mm256_storeu_ps(row.add(i), x);
                vs = _mm256_add_ps(vs, x);
                i += 8;
            }
            let mut total = hadd(vs);
            if lanes < n {
                let mut buf = [*max.add(r); 8];
                std::ptr::copy_nonoverlapping(row.add(lanes), buf.as_mut_ptr(), n - lanes);
                let x = exp8(_mm256_sub_ps(_mm256_loadu_ps(buf.as_ptr()), mv));
                _mm256_storeu_ps(buf.as_mut_ptr(), x);
                std::ptr::copy_nonoverlapping(buf.as_ptr(), row.add(lanes), n - lanes);
                total += buf[..n - lanes].iter().sum::<f32>();
            }
            *sum.add(r) = *sum.add(r) * *rescale.add(r) + total;
        }
    }
}

/// Four rows' old maxima's weights under their new ones,
/// `e^(old − new)`, with the same polynomial as the scores; exactly 1 where
/// a max held, as in the one-row path (also for a row still at -inf).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn rescale_factors(old: __m128, new: __m128) -> __m128 {
    let grew = _mm_cmp_ps::<_CMP_GT_OQ>(new, old);
    let e = _mm256_castps256_ps128(exp8(_mm256_castps128_ps256(_mm_sub_ps(old, new))));
    _mm_blendv_ps(_mm_set1_ps(1.0), e, grew)
}

/// Lane `i` of the result is the largest of `a[i]`'s eight lanes (the
/// max counterpart of [`hsum4`]).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn hmax4(a: [__m256; 4]) -> __m128 {
    let pairs = |x, y| {
        _mm256_max_ps(
            _mm256_shuffle_ps::<0b10_00_10_00>(x, y),
            _mm256_shuffle_ps::<0b11_01_11_01>(x, y),
        )
    };
    let u = pairs(pairs(a[0], a[1]), pairs(a[2], a[3]));
    _mm_max_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1))
}

/// [`softmax_rows_avx2`] for four rows of `n` scores, `n` a positive
/// multiple of 8 (decode's four query heads per kv head on a whole page).
///
/// # Safety
/// `s` is valid for `4·n` reads and writes, `max`, `sum` and `rescale` for
/// 4; `n % 8 == 0` and `n > 0`; AVX2 and FMA are present.
#[target_feature(enable = "avx2,fma")]
unsafe fn softmax_four_rows(
    s: *mut f32,
    n: usize,
    max: *mut f32,
    sum: *mut f32,
    rescale: *mut f32,
) {
    // SAFETY: row `i`'s vectors start at `i·n + c` with `c + 8 <= n`, and
    // the state is read and written as four lanes, per the contract.
    unsafe {
        let old = _mm_loadu_ps(max);
        let mut vm = [_mm256_setzero_ps(); 4];
        for (i, m) in vm.iter_mut().enumerate() {
            *m = _mm256_set1_ps(*max.add(i));
        }
        let mut c = 0;
        while c < n {
            for (i, m) in vm.iter_mut().enumerate() {
                *m = _mm256_max_ps(*m, _mm256_loadu_ps(s.add(i * n + c)));
            }
            c += 8;
        }
        let new = hmax4(vm);
        _mm_storeu_ps(max, new);
        let factor = rescale_factors(old, new);
        _mm_storeu_ps(rescale, factor);
        let mut vs = [_mm256_setzero_ps(); 4];
        let mut mv = [_mm256_setzero_ps(); 4];
        for (i, m) in mv.iter_mut().enumerate() {
            *m = _mm256_set1_ps(*max.add(i));
        }
        let mut c = 0;
        while c < n {
            for i in 0..4 {
                let at = s.add(i * n + c);
                let x = exp8(_mm256_sub_ps(_mm256_loadu_ps(at), mv[i]));
                _mm256_storeu_ps(at, x);
                vs[i] = _mm256_add_ps(vs[i], x);
            }
            c += 8;
        }
        _mm_storeu_ps(sum, _mm_fmadd_ps(_mm_loadu_ps(sum), factor, hsum4(vs)));
    }
}

pub(super) fn exp(xs: &mut [f32]) {
    let n = xs.len();
    // SAFETY: reads and writes `n` elements of `xs`, in bounds; AVX2 and FMA
    // are present.
    unsafe { exp_avx2(xs.as_mut_ptr(), n) }
}

/// `e^x` for eight lanes: `x = n·ln2 + r`, a degree-6 polynomial for `e^r`
/// (Cephes' `expf` coefficients), and `2^n` built in the exponent bits.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn exp8(x: __m256) -> __m256 {
    let x = _mm256_min_ps(
        _mm256_max_ps(x, _mm256_set1_ps(EXP_MIN)),
        _mm256_set1_ps(EXP_MAX),
    );
    let n = _mm256_floor_ps(_mm256_fmadd_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
        _mm256_set1_ps(0.5),
    ));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_HI), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_LO), r);
    let mut p = _mm256_set1_ps(EXP_POLY[0]);
    for c in &EXP_POLY[1..] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(*c));
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
