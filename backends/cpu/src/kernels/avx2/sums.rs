//! Weighted sums of stored value rows: per row group in registers, and in
//! column passes for four rows (shared with the AVX-512 set).

use std::arch::x86_64::*;

use super::{Ahead, F8, F32, I8, PassAt, PassPrefetch, column_passes, load1, load8};
use crate::kernels::shapes;

/// # Safety
/// `p` is valid for `rows·n` reads, the segments of `v` hold `n` whole rows
/// of `d` elements of encoding `E` in all, `acc` is valid for `rows·d`
/// reads and writes; AVX2, FMA and F16C are present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn weighted_sum_avx2<const E: u8>(
    p: *const f32,
    rows: usize,
    v: &[&[u8]],
    n: usize,
    d: usize,
    acc: *mut f32,
    mut ahead: Ahead<'_>,
) {
    let mut r = 0;
    while r < rows {
        let g = (rows - r).min(4);
        // SAFETY: rows `r..r + g` are within `rows`, so the group's weights
        // and accumulators are in bounds by this function's contract.
        unsafe {
            let (p, acc) = (p.add(r * n), acc.add(r * d));
            match g {
                1 => weighted_sum_group::<1, E, false>(p, v, n, d, acc, &mut ahead),
                2 => weighted_sum_group::<2, E, false>(p, v, n, d, acc, &mut ahead),
                3 => weighted_sum_group::<3, E, false>(p, v, n, d, acc, &mut ahead),
                _ => weighted_sum_group::<4, E, false>(p, v, n, d, acc, &mut ahead),
            }
        }
        r += g;
    }
}

/// Where row `i`'s weight for key `j` sits among `G·n` weights: row-major
/// (`p[i·n + j]`), or key-major (`p[j·G + i]`) with `KEY_MAJOR`.
#[inline]
pub(in crate::kernels) fn weight_at<const G: usize, const KEY_MAJOR: bool>(
    n: usize,
    i: usize,
    j: usize,
) -> usize {
    if KEY_MAJOR { j * G + i } else { i * n + j }
}

/// `acc[i] += Σ_j p[i·n + j] · v[j]` for `G` rows (`G ≤ 4`, a constant so
/// that the accumulators stay in registers); the weights key-major with
/// `KEY_MAJOR` ([`weight_at`]). The value rows `v[j]` are the rows of the
/// segments of `v` in order (the blocks of a span), so the accumulators
/// stay in registers across all of them.
///
/// # Safety
/// `p` is valid for `G·n` reads, the segments of `v` hold `n` whole rows of
/// `d` elements of encoding `E` in all, `acc` is valid for `G·d` reads and
/// writes; AVX2, FMA and F16C are present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn weighted_sum_group<const G: usize, const E: u8, const KEY_MAJOR: bool>(
    p: *const f32,
    v: &[&[u8]],
    n: usize,
    d: usize,
    acc: *mut f32,
    ahead: &mut impl PassPrefetch,
) {
    // SAFETY: every column block below ends at or before `d / 8 * 8`, and
    // the tail loop stays under `d`, so all offsets are under `G·n`
    // (weights), a segment's rows (values) or `G·d` (accumulators), as the
    // contract requires; AVX2 and FMA are present.
    unsafe {
        let lanes = d / 8 * 8;
        // Sixteen columns at a time (G rows × two vectors of accumulators
        // stay in registers across all `n` keys), then a last eight.
        let mut c = 0;
        while c + 16 <= lanes {
            weighted_sum_columns::<G, E, 2, KEY_MAJOR>(p, v, n, d, acc, c, &mut *ahead);
            c += 16;
        }
        if c < lanes {
            weighted_sum_columns::<G, E, 1, KEY_MAJOR>(p, v, n, d, acc, c, ahead);
        }
        let row = d * elem_bytes::<E>();
        for i in 0..G {
            for e in lanes..d {
                let mut t = 0f32;
                let mut j = 0;
                for seg in v {
                    for r in 0..shapes::key_count(seg.len(), row) {
                        t += *p.add(weight_at::<G, KEY_MAJOR>(n, i, j))
                            * load1::<E>(seg.as_ptr(), r * d + e);
                        j += 1;
                    }
                }
                *acc.add(i * d + e) += t;
            }
        }
    }
}

/// Bytes per element of encoding `E`.
pub(in crate::kernels) const fn elem_bytes<const E: u8>() -> usize {
    match E {
        F32 => 4,
        I8 | F8 => 1,
        _ => 2,
    }
}

/// [`weighted_sum_group`] over columns `c..c + 8·W`, telling `ahead`
/// where it is ([`PassPrefetch`]).
///
/// # Safety
/// As [`weighted_sum_group`], with `c + 8·W <= d`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn weighted_sum_columns<
    const G: usize,
    const E: u8,
    const W: usize,
    const KEY_MAJOR: bool,
>(
    p: *const f32,
    v: &[&[u8]],
    n: usize,
    d: usize,
    acc: *mut f32,
    c: usize,
    ahead: &mut impl PassPrefetch,
) {
    // SAFETY: columns `c..c + 8·W` are within every row of the segments
    // and of `acc`; `vp` stays within its segment's rows and `wp` at key
    // `j` (counting the rows of every segment, `n` in all) reads weights
    // `weight_at(n, i, j)` within `G·n`, by the contract.
    unsafe {
        let mut a = [[_mm256_setzero_ps(); W]; G];
        for (i, row) in a.iter_mut().enumerate() {
            for (w, sum) in row.iter_mut().enumerate() {
                *sum = _mm256_loadu_ps(acc.add(i * d + c + 8 * w));
            }
        }
        let row_bytes = d * elem_bytes::<E>();
        // Pointers walk the keys (a value row, a key's weights) so that
        // the loop over sixteen keys carries no index arithmetic.
        let key_step = if KEY_MAJOR { G } else { 1 };
        let mut wp = p;
        let passes = column_passes(d);
        for (s, (vp, mut left)) in shapes::segment_rows(v, row_bytes).enumerate() {
            ahead.segment(PassAt {
                s,
                seg: vp,
                m: left,
                row: row_bytes,
                pass: c / 16,
                passes,
            });
            let mut vp = vp.add(c * elem_bytes::<E>());
            while left > 0 {
                ahead.sixteen();
                let keys = left.min(16);
                for _ in 0..keys {
                    ahead.key();
                    let mut vals = [_mm256_setzero_ps(); W];
                    for (w, val) in vals.iter_mut().enumerate() {
                        *val = load8::<E>(vp, 8 * w);
                    }
                    for (i, row) in a.iter_mut().enumerate() {
                        let wv = _mm256_broadcast_ss(&*wp.add(weight_at::<G, KEY_MAJOR>(n, i, 0)));
                        for (sum, val) in row.iter_mut().zip(vals) {
                            *sum = _mm256_fmadd_ps(wv, val, *sum);
                        }
                    }
                    vp = vp.add(row_bytes);
                    wp = wp.add(key_step);
                }
                left -= keys;
            }
            ahead.segment_end();
        }
        for (i, row) in a.iter().enumerate() {
            for (w, sum) in row.iter().enumerate() {
                _mm256_storeu_ps(acc.add(i * d + c + 8 * w), *sum);
            }
        }
    }
}
