//! x86-64 kernels with AVX2, FMA and F16C: eight f32 lanes per instruction.
//! Like every kernel module, it holds its instruction set's `unsafe`. Here:
//! the table, the scores and the four-row kernels; in `sums` the weighted
//! sums, in `softmax` the softmax and `exp`, in `elementwise` widening,
//! dot and `axpy`, in `prefetch` the prefetch schedule. Its byte view,
//! prefetch schedule and four-row sum also serve `avx512`.

use std::arch::x86_64::*;

use kvslice_core::KvDtype;

use super::{FourRowKernels, Kernels, SoftmaxState, StoredKernels, scalar, shapes};

mod elementwise;
mod prefetch;
mod softmax;
mod sums;

use elementwise::*;
use prefetch::*;
pub(super) use prefetch::{Ahead, Paired, PairedPasses, PassAt, PassPrefetch};
use softmax::*;
use sums::*;
pub(super) use sums::{elem_bytes, weight_at};

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
        softmax_rows,
        scores,
        weighted_sum,
        stored: Some(StoredKernels {
            scores: scores_stored,
            weighted_sum: weighted_sum_stored,
            four_rows: Some(FourRowKernels {
                scores_softmax: four_row_scores_softmax,
                scores_softmax_dim_major: four_row_scores_softmax_dim_major,
                int8_queries: None,
                fp8_bf16: None,
                weighted_sum: four_row_weighted_sum,
            }),
        }),
        scale_key_major: scale_weights,
        prefetch,
    })
}

// The safe wrappers below are reachable only through the table `kernels()`
// returns, which exists only after the features were detected: that is the
// invariant every `SAFETY` comment here relies on.

fn scores(q: &[f32], rows: usize, k: &[f32], n: usize, out: &mut [f32], ahead: &[u8]) {
    scores_stored(KvDtype::F32, q, rows, f32_bytes(k), n, out, ahead);
}

/// An f32 slice as its bytes (in memory order, which for these kernels'
/// little-endian targets is the f32 encoding `load8` reads).
pub(super) fn f32_bytes(x: &[f32]) -> &[u8] {
    // SAFETY: the bytes of initialised f32 values are initialised u8s,
    // `u8` needs no alignment, and the length covers exactly `x`'s memory
    // for the same lifetime.
    unsafe { std::slice::from_raw_parts(x.as_ptr().cast(), std::mem::size_of_val(x)) }
}

fn scores_stored(
    dtype: KvDtype,
    q: &[f32],
    rows: usize,
    k: &[u8],
    n: usize,
    out: &mut [f32],
    ahead: &[u8],
) {
    let d = shapes::scores_width(q.len(), rows, k.len(), dtype.size_bytes(), n, out.len());
    // One step per group of keys: threes for a four-row group, then pairs.
    let steps = if rows >= 4 {
        n.div_ceil(3)
    } else {
        n.div_ceil(2)
    };
    let ahead = Ahead::new(ahead, steps);
    let (q, k, out) = (q.as_ptr(), k.as_ptr(), out.as_mut_ptr());
    // SAFETY: the shape check above bounds every access made below (`k` holds
    // `n·d` elements of `dtype`); AVX2, FMA and F16C are present.
    unsafe {
        match dtype {
            KvDtype::F32 => scores_avx2::<F32>(q, rows, k, n, d, out, ahead),
            KvDtype::F16 => scores_avx2::<F16>(q, rows, k, n, d, out, ahead),
            KvDtype::Bf16 => scores_avx2::<BF16>(q, rows, k, n, d, out, ahead),
            KvDtype::I8 => scores_avx2::<I8>(q, rows, k, n, d, out, ahead),
            KvDtype::F8E4M3 => scores_avx2::<F8>(q, rows, k, n, d, out, ahead),
        }
    }
}

fn weighted_sum(p: &[f32], rows: usize, v: &[f32], n: usize, acc: &mut [f32], ahead: &[u8]) {
    weighted_sum_stored(KvDtype::F32, p, rows, f32_bytes(v), n, acc, ahead);
}

fn weighted_sum_stored(
    dtype: KvDtype,
    p: &[f32],
    rows: usize,
    v: &[u8],
    n: usize,
    acc: &mut [f32],
    ahead: &[u8],
) {
    let d = shapes::weighted_sum_width(p.len(), rows, v.len(), dtype.size_bytes(), n, acc.len());
    // The values as one segment of exactly `n` rows.
    let row = d * dtype.size_bytes();
    let v = [&v[..n * row]];
    // `weighted_sum_columns` steps every sixteen keys of its one segment,
    // in each pass of columns.
    let ahead = Ahead::new(ahead, n.div_ceil(16) * column_passes(d));
    let (p, v, acc) = (p.as_ptr(), &v[..], acc.as_mut_ptr());
    // SAFETY: the shape check above bounds every access made below (`v` is
    // `n` rows of `d` elements of `dtype`); AVX2, FMA and F16C are present.
    unsafe {
        match dtype {
            KvDtype::F32 => weighted_sum_avx2::<F32>(p, rows, v, n, d, acc, ahead),
            KvDtype::F16 => weighted_sum_avx2::<F16>(p, rows, v, n, d, acc, ahead),
            KvDtype::Bf16 => weighted_sum_avx2::<BF16>(p, rows, v, n, d, acc, ahead),
            KvDtype::I8 => weighted_sum_avx2::<I8>(p, rows, v, n, d, acc, ahead),
            KvDtype::F8E4M3 => weighted_sum_avx2::<F8>(p, rows, v, n, d, acc, ahead),
        }
    }
}

fn four_row_scores_softmax(
    dtype: KvDtype,
    q: &[f32],
    keys: &[&[u8]],
    scales: &[f32],
    weights: &mut [f32],
    mut state: SoftmaxState<'_>,
    ahead: &[&[u8]],
) {
    let size = dtype.size_bytes();
    let (d, n) = shapes::four_row_scores(q.len(), keys, size, weights.len(), state.lens());
    let scales = shapes::key_scales(scales, n);
    let ahead = Paired::new(ahead);
    let (q, w, state) = (q.as_ptr(), weights.as_mut_ptr(), state.as_mut_ptrs());
    // SAFETY: the checks above bound every access made below (each segment
    // of `keys` holds whole keys of `d` elements of `dtype`, `n` in all,
    // `d % 8 == 0`, `weights` `4·n`, `scales` null or `n`, the state four
    // rows); AVX2, FMA and F16C are present.
    unsafe {
        let k = match dtype {
            KvDtype::F32 => four_row_scores_softmax_avx2::<F32>,
            KvDtype::F16 => four_row_scores_softmax_avx2::<F16>,
            KvDtype::Bf16 => four_row_scores_softmax_avx2::<BF16>,
            KvDtype::I8 => four_row_scores_softmax_avx2::<I8>,
            KvDtype::F8E4M3 => four_row_scores_softmax_avx2::<F8>,
        };
        k(q, keys, d, scales, w, state, ahead)
    }
}

/// [`Kernels::scale_key_major`](super::Kernels::scale_key_major).
fn scale_weights(w: &mut [f32], scales: &[f32]) {
    let n = scales.len().min(w.len() / 4);
    // SAFETY: `w` holds `4·n` weights and `scales` `n`; AVX2 is present.
    unsafe { scale_key_major(w.as_mut_ptr(), scales.as_ptr(), n) }
}

/// Multiplies each of `n` keys' four key-major scores in `w` by the key's
/// scale, where `scales` is not null.
///
/// # Safety
/// `w` is valid for `4·n` reads and writes, `scales` null or valid for `n`
/// reads; AVX is present.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn scale_key_major(w: *mut f32, scales: *const f32, n: usize) {
    if scales.is_null() {
        return;
    }
    for j in 0..n {
        // SAFETY: `j < n`, within both by the contract.
        unsafe {
            let at = w.add(4 * j);
            _mm_storeu_ps(
                at,
                _mm_mul_ps(_mm_loadu_ps(at), _mm_set1_ps(*scales.add(j))),
            );
        }
    }
}

fn four_row_scores_softmax_dim_major(
    dtype: KvDtype,
    q: &[f32],
    keys: &[&[u8]],
    scales: &[f32],
    weights: &mut [f32],
    state: SoftmaxState<'_>,
    ahead: &[&[u8]],
) {
    let kernels: [DimMajorKernel; 5] = [
        dim_major_scores_softmax_avx2::<F32>,
        dim_major_scores_softmax_avx2::<F16>,
        dim_major_scores_softmax_avx2::<BF16>,
        dim_major_scores_softmax_avx2::<I8>,
        dim_major_scores_softmax_avx2::<F8>,
    ];
    // SAFETY: these are this set's kernels, whose table exists only after
    // AVX2, FMA and F16C were detected.
    unsafe { dim_major_call(kernels, dtype, q, keys, scales, weights, state, ahead) }
}

/// A dim-major four-row scores kernel for one encoding, with the contract
/// of [`dim_major_scores_softmax_avx2`].
pub(super) type DimMajorKernel =
    unsafe fn(*const f32, &[&[u8]], usize, usize, *const f32, *mut f32, [*mut f32; 3], Paired<'_>);

/// [`FourRowKernels::scores_softmax_dim_major`] for a set whose kernels
/// for f32, f16 and bf16 are `kernels`: the shape checks, then the kernel
/// for `dtype`.
///
/// # Safety
/// Each of `kernels` keeps [`DimMajorKernel`]'s contract for its encoding
/// given the shapes checked here, and the CPU has the features it needs.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn dim_major_call(
    kernels: [DimMajorKernel; 5],
    dtype: KvDtype,
    q: &[f32],
    keys: &[&[u8]],
    scales: &[f32],
    weights: &mut [f32],
    mut state: SoftmaxState<'_>,
    ahead: &[&[u8]],
) {
    let size = dtype.size_bytes();
    let (d, bt, n) = shapes::four_row_dim_major(q.len(), keys, size, weights.len(), state.lens());
    let scales = shapes::key_scales(scales, n);
    let ahead = Paired::new(ahead);
    let (q, w, state) = (q.as_ptr(), weights.as_mut_ptr(), state.as_mut_ptrs());
    let kernel = kernels[dtype.tag() as usize];
    // SAFETY: the checks above bound every access the kernel makes (each
    // segment of `keys` one block of `bt` keys of `d` elements of `dtype`,
    // `bt` a multiple of 16, `weights` `4·n`, `scales` null or `n`, the
    // state four rows); the kernel for `dtype` (indexed by its tag) and
    // the CPU's features are the caller's contract.
    unsafe { kernel(q, keys, d, bt, scales, w, state, ahead) }
}

fn four_row_weighted_sum(
    dtype: KvDtype,
    p: &[f32],
    values: &[&[u8]],
    acc: &mut [f32],
    ahead: &[&[u8]],
) {
    let (d, n) = shapes::four_row_weighted_sum(p.len(), values, dtype.size_bytes(), acc.len());
    let mut ahead = PairedPasses::new(Paired::new(ahead));
    let (p, acc) = (p.as_ptr(), acc.as_mut_ptr());
    // SAFETY: the shape checks above bound every access made below (`p`
    // holds `4·n` weights, the segments `n` whole rows of `d` elements of
    // `dtype`, `acc` `4·d`); AVX2, FMA and F16C are present.
    unsafe {
        match dtype {
            KvDtype::F32 => weighted_sum_group::<4, F32, true>(p, values, n, d, acc, &mut ahead),
            KvDtype::F16 => weighted_sum_group::<4, F16, true>(p, values, n, d, acc, &mut ahead),
            KvDtype::Bf16 => weighted_sum_group::<4, BF16, true>(p, values, n, d, acc, &mut ahead),
            KvDtype::I8 => weighted_sum_group::<4, I8, true>(p, values, n, d, acc, &mut ahead),
            KvDtype::F8E4M3 => weighted_sum_group::<4, F8, true>(p, values, n, d, acc, &mut ahead),
        }
    }
}

/// Passes of `sums::weighted_sum_columns` over rows of `d` elements: sixteen
/// columns each, then eight (the tail beyond is scalar).
fn column_passes(d: usize) -> usize {
    (d / 8 * 8).div_ceil(16)
}

/// Element encodings the score and value kernels read, as a const
/// parameter so each instantiation has its own straight-line loads.
pub(super) const F32: u8 = 0;
pub(super) const F16: u8 = 1;
pub(super) const BF16: u8 = 2;
/// int8 codes, read raw ([`super::raw_scale`]).
pub(super) const I8: u8 = 3;
/// E4M3 codes, read raw as the f16 of [`scalar::f8_raw_bits`].
pub(super) const F8: u8 = 4;

/// The f16 bits of the eight E4M3 codes in the low half of `x`
/// ([`scalar::f8_raw_bits`] lane by lane): each code sign-extended to 16
/// bits and shifted left by 7 puts the sign at bit 15, a copy of it at
/// bit 14 (cleared) and the exponent and mantissa in f16's places, in
/// three operations.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn f8_to_f16_bits(x: __m128i) -> __m128i {
    let w = _mm_slli_epi16::<7>(_mm_cvtepi8_epi16(x));
    _mm_and_si128(w, _mm_set1_epi16(!0x4000))
}

/// Eight elements of encoding `E` at element index `i` of `p`, as f32.
///
/// # Safety
/// `p` is valid for reads of elements `i..i + 8`; AVX2 and F16C are
/// present.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn load8<const E: u8>(p: *const u8, i: usize) -> __m256 {
    // SAFETY: the contract above.
    unsafe {
        match E {
            F32 => _mm256_loadu_ps(p.cast::<f32>().add(i)),
            F16 => _mm256_cvtph_ps(_mm_loadu_si128(p.add(2 * i).cast())),
            I8 => _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p.add(i).cast()))),
            F8 => _mm256_cvtph_ps(f8_to_f16_bits(_mm_loadl_epi64(p.add(i).cast()))),
            _ => _mm256_castsi256_ps(_mm256_slli_epi32(
                _mm256_cvtepu16_epi32(_mm_loadu_si128(p.add(2 * i).cast())),
                16,
            )),
        }
    }
}

/// One element of encoding `E` at index `i` of `p`, as f32.
///
/// # Safety
/// `p` is valid for reads of element `i`.
unsafe fn load1<const E: u8>(p: *const u8, i: usize) -> f32 {
    // SAFETY: the contract above; unaligned reads.
    unsafe {
        match E {
            F32 => p.cast::<f32>().add(i).read_unaligned(),
            F16 => {
                kvslice_core::f16::from_bits(p.add(2 * i).cast::<u16>().read_unaligned()).to_f32()
            }
            I8 => f32::from(p.add(i).cast::<i8>().read()),
            F8 => kvslice_core::f16::from_bits(scalar::f8_raw_bits(p.add(i).read())).to_f32(),
            _ => f32::from_bits(u32::from(p.add(2 * i).cast::<u16>().read_unaligned()) << 16),
        }
    }
}

/// Row sums of four accumulators: lane `i` of the result is the sum of
/// `a[i]`'s eight lanes (three horizontal adds instead of four `hsum`s).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn hsum4(a: [__m256; 4]) -> __m128 {
    let u = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1))
}

/// # Safety
/// `q` is valid for `rows·d` reads, `k` for `n·d` elements of encoding `E`,
/// `out` for `rows·n` writes; AVX2, FMA and F16C are present.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores_avx2<const E: u8>(
    q: *const f32,
    rows: usize,
    k: *const u8,
    n: usize,
    d: usize,
    out: *mut f32,
    mut ahead: Ahead<'_>,
) {
    let mut r = 0;
    while r < rows {
        let g = (rows - r).min(4);
        // SAFETY: rows `r..r + g` are within `rows`, so the group's query
        // and score rows are in bounds by this function's contract.
        unsafe {
            let (q, out) = (q.add(r * d), out.add(r * n));
            match g {
                1 => scores_group::<1, E>(q, k, n, d, out, &mut ahead),
                2 => scores_group::<2, E>(q, k, n, d, out, &mut ahead),
                3 => scores_group::<3, E>(q, k, n, d, out, &mut ahead),
                _ => scores_group::<4, E>(q, k, n, d, out, &mut ahead),
            }
        }
        r += g;
    }
}

/// Scores of `G` query rows (`G ≤ 4`, a constant so that the accumulators
/// stay in registers) against `n` keys.
///
/// # Safety
/// `q` is valid for `G·d` reads, `k` for `n·d` elements of encoding `E`,
/// `out` for writes at `i·n + j` (`i < G`, `j < n`); AVX2, FMA and F16C are
/// present.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores_group<const G: usize, const E: u8>(
    q: *const f32,
    k: *const u8,
    n: usize,
    d: usize,
    out: *mut f32,
    ahead: &mut Ahead<'_>,
) {
    // SAFETY: every offset below stays under `n·d` (keys), `G·d` (queries)
    // or `(G - 1)·n + n` (scores) by the loop bounds, as the contract
    // requires; AVX2 and FMA are present.
    unsafe {
        let lanes = d / 8 * 8;
        let mut j = 0;
        // Four rows (GQA decode) take three keys at a time: twelve
        // accumulators, three key and four query loads per twelve FMAs,
        // which fills the sixteen registers without spilling and leaves
        // fewer horizontal sums per key than pairs do.
        if G == 4 {
            while j < 3 * four_row_threes(n) {
                ahead.step();
                scores_three_keys::<E>(q, k, n, d, out, j);
                j += 3;
            }
        }
        // Two keys at a time: 2·G accumulators, 2 + G loads per 2·G FMAs.
        while j < n {
            ahead.step();
            let two = j + 1 < n;
            let (k0, k1) = (j * d, (j + usize::from(two)) * d);
            let mut a0 = [_mm256_setzero_ps(); 4];
            let mut a1 = [_mm256_setzero_ps(); 4];
            let mut c = 0;
            while c < lanes {
                let (kv0, kv1) = (load8::<E>(k, k0 + c), load8::<E>(k, k1 + c));
                for i in 0..G {
                    let qv = _mm256_loadu_ps(q.add(i * d + c));
                    a0[i] = _mm256_fmadd_ps(qv, kv0, a0[i]);
                    a1[i] = _mm256_fmadd_ps(qv, kv1, a1[i]);
                }
                c += 8;
            }
            let (h0, h1) = (hsum4(a0), hsum4(a1));
            if G == 4 && two && lanes == d {
                // Decode's common case.
                store_four_row_pairs(out, n, j, h0, h1);
                j += 2;
                continue;
            }
            let (mut s0, mut s1) = ([0f32; 4], [0f32; 4]);
            _mm_storeu_ps(s0.as_mut_ptr(), h0);
            _mm_storeu_ps(s1.as_mut_ptr(), h1);
            for i in 0..G {
                *out.add(i * n + j) = s0[i] + dot_tail::<E>(q, k, d, i, j);
                if two {
                    *out.add(i * n + j + 1) = s1[i] + dot_tail::<E>(q, k, d, i, j + 1);
                }
            }
            j += 2;
        }
    }
}

/// The part of query row `i`'s dot product with key `key` past the last
/// whole vector: elements `d / 8 · 8..d` (0 when `d` is a multiple of 8).
///
/// # Safety
/// `q` is valid for `(i + 1)·d` reads and `k` for `(key + 1)·d` elements
/// of encoding `E`.
unsafe fn dot_tail<const E: u8>(
    q: *const f32,
    k: *const u8,
    d: usize,
    i: usize,
    key: usize,
) -> f32 {
    let mut t = 0f32;
    for e in d / 8 * 8..d {
        // SAFETY: `e < d`, so both reads are within the contract's rows.
        t += unsafe { *q.add(i * d + e) * load1::<E>(k, key * d + e) };
    }
    t
}

/// Stores four rows' scores against keys `j` and `j + 1` (`a` and `b`:
/// lane `i` is row `i`'s score) as one 8-byte pair per row, at
/// `out[i·n + j]`; `storel_epi64` has no alignment requirement, so the
/// pairs may sit at any f32 offset.
///
/// # Safety
/// `out` is valid for writes at `i·n + j` and `i·n + j + 1` (`i < 4`);
/// SSE2 is present (part of x86-64).
#[inline]
#[target_feature(enable = "sse2")]
unsafe fn store_four_row_pairs(out: *mut f32, n: usize, j: usize, a: __m128, b: __m128) {
    let rows01 = _mm_castps_si128(_mm_unpacklo_ps(a, b));
    let rows23 = _mm_castps_si128(_mm_unpackhi_ps(a, b));
    // SAFETY: the four 8-byte writes are the contract's.
    unsafe {
        _mm_storel_epi64(out.add(j).cast(), rows01);
        _mm_storel_epi64(out.add(n + j).cast(), _mm_unpackhi_epi64(rows01, rows01));
        _mm_storel_epi64(out.add(2 * n + j).cast(), rows23);
        _mm_storel_epi64(
            out.add(3 * n + j).cast(),
            _mm_unpackhi_epi64(rows23, rows23),
        );
    }
}

/// Scores of four query rows against keys `j`, `j + 1` and `j + 2`:
/// `out[i·n + j + x] = q[i]·k[j + x]`.
///
/// # Safety
/// `q` is valid for `4·d` reads, `k` for `(j + 3)·d` elements of encoding
/// `E`, `out` for writes at `i·n + j + x` (`i < 4`, `x < 3`); AVX2, FMA and
/// F16C are present.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores_three_keys<const E: u8>(
    q: *const f32,
    k: *const u8,
    n: usize,
    d: usize,
    out: *mut f32,
    j: usize,
) {
    // SAFETY: keys `j..j + 3` hold `3·d` elements, query rows `4·d`, and
    // the writes are the contract's, made by unaligned stores or through
    // `f32` pointers; AVX2, FMA and F16C are present.
    unsafe {
        let lanes = d / 8 * 8;
        // Lane `i` of `h[x]`: row `i`'s score against key `j + x`.
        let h = four_row_sums::<E, 3>(q, k, d, lanes, j);
        if lanes == d {
            store_four_row_pairs(out, n, j, h[0], h[1]);
            let mut third = [0f32; 4];
            _mm_storeu_ps(third.as_mut_ptr(), h[2]);
            for (i, s) in third.into_iter().enumerate() {
                *out.add(i * n + j + 2) = s;
            }
            return;
        }
        let mut sums = [[0f32; 4]; 3];
        for (s, v) in sums.iter_mut().zip(h) {
            _mm_storeu_ps(s.as_mut_ptr(), v);
        }
        for (x, s) in sums.iter().enumerate() {
            for (i, &v) in s.iter().enumerate() {
                *out.add(i * n + j + x) = v + dot_tail::<E>(q, k, d, i, j + x);
            }
        }
    }
}

/// Dot products of four query rows with keys `j..j + K` over their first
/// `lanes` elements (whole vectors): lane `i` of the `x`th result is row
/// `i`'s against key `j + x`. Three keys are twelve accumulators, three
/// key and four query loads per twelve FMAs, which fills the sixteen
/// registers without spilling.
///
/// # Safety
/// `q` is valid for `4·d` reads, `k` for `(j + K)·d` elements of encoding
/// `E`; `lanes ≤ d` is a multiple of 8; AVX2, FMA and F16C are present.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn four_row_sums<const E: u8, const K: usize>(
    q: *const f32,
    k: *const u8,
    d: usize,
    lanes: usize,
    j: usize,
) -> [__m128; K] {
    // SAFETY: every offset is under `(j + K)·d` (keys) or `4·d` (queries)
    // by the contract.
    unsafe {
        let mut a = [[_mm256_setzero_ps(); 4]; K];
        let mut c = 0;
        while c < lanes {
            let mut x = [_mm256_setzero_ps(); K];
            for (t, key) in x.iter_mut().enumerate() {
                *key = load8::<E>(k, (j + t) * d + c);
            }
            for i in 0..4 {
                let qv = _mm256_loadu_ps(q.add(i * d + c));
                for (acc, key) in a.iter_mut().zip(x) {
                    acc[i] = _mm256_fmadd_ps(qv, key, acc[i]);
                }
            }
            c += 8;
        }
        // A loop, not `a.map(..)`: a closure carries this function's
        // target features, so `array::map` (which lacks them) could not
        // inline it (`avx512::row_sums` was 5x slower for it).
        let mut sums = [_mm_setzero_ps(); K];
        for (sum, acc) in sums.iter_mut().zip(a) {
            *sum = hsum4(acc);
        }
        sums
    }
}

/// Calls of [`four_row_sums`] with three keys among `n`: threes up to
/// where the rest splits into pairs (16 = 4·3 + 2·2), a last single key
/// alone.
fn four_row_threes(n: usize) -> usize {
    if n % 3 == 1 && n > 3 {
        n / 3 - 1
    } else {
        n / 3
    }
}

/// [`FourRowKernels::scores_softmax`]: the scores come out key by key as
/// four-lane vectors (lane = row) and are stored key-major, so that the
/// rows' maxima and sums are lane-wise over pairs of keys, folded once
/// over every segment's keys.
///
/// # Safety
/// `q` is valid for `4·d` reads, the segments of `keys` hold `n` whole
/// keys of `d` elements of encoding `E` in all, `scales` is null or valid
/// for `n` reads, `w` is valid for `4·n` writes, and the three pointers of
/// `state` (max, sum, rescale) for 4 reads and writes each; `d % 8 == 0`;
/// AVX2, FMA and F16C are present.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn four_row_scores_softmax_avx2<const E: u8>(
    q: *const f32,
    keys: &[&[u8]],
    d: usize,
    scales: *const f32,
    w: *mut f32,
    [max, sum, rescale]: [*mut f32; 3],
    ahead: Paired<'_>,
) {
    // SAFETY: keys `j..j + K` stay under the segment's `m` by the loop
    // bounds, so every read is within the segment and every write under
    // `4·n` (`base + m ≤ n`); `scale_key_major` gets the `4·n` weights and
    // the null or `n` scales; the state is four lanes; as the contract
    // requires.
    unsafe {
        let mut n = 0;
        let row = d * elem_bytes::<E>();
        for (s, (k, m)) in shapes::segment_rows(keys, row).enumerate() {
            let w = w.add(4 * n);
            let pair = ahead.region(s, k, m * row);
            let mut j = 0;
            while j < 3 * four_row_threes(m) {
                pair.fetch_lines(j * row, (j + 3) * row);
                let h = four_row_sums::<E, 3>(q, k, d, d, j);
                for (x, v) in h.into_iter().enumerate() {
                    _mm_storeu_ps(w.add(4 * (j + x)), v);
                }
                j += 3;
            }
            while j < m {
                pair.fetch_lines(j * row, (j + 2).min(m) * row);
                if j + 1 < m {
                    let h = four_row_sums::<E, 2>(q, k, d, d, j);
                    _mm_storeu_ps(w.add(4 * j), h[0]);
                    _mm_storeu_ps(w.add(4 * j + 4), h[1]);
                    j += 2;
                } else {
                    let [h] = four_row_sums::<E, 1>(q, k, d, d, j);
                    _mm_storeu_ps(w.add(4 * j), h);
                    j += 1;
                }
            }
            n += m;
        }
        scale_key_major(w, scales, n);
        // Pairs of keys as eight lanes, an odd last key as four.
        let pairs = n / 2;
        let old = _mm_loadu_ps(max);
        let mut vm = _mm256_set_m128(old, old);
        for t in 0..pairs {
            vm = _mm256_max_ps(vm, _mm256_loadu_ps(w.add(8 * t)));
        }
        let mut new = _mm_max_ps(_mm256_castps256_ps128(vm), _mm256_extractf128_ps(vm, 1));
        if n % 2 == 1 {
            new = _mm_max_ps(new, _mm_loadu_ps(w.add(4 * (n - 1))));
        }
        _mm_storeu_ps(max, new);
        let factor = rescale_factors(old, new);
        _mm_storeu_ps(rescale, factor);
        let mv = _mm256_set_m128(new, new);
        let mut vs = _mm256_setzero_ps();
        for t in 0..pairs {
            let x = exp8(_mm256_sub_ps(_mm256_loadu_ps(w.add(8 * t)), mv));
            _mm256_storeu_ps(w.add(8 * t), x);
            vs = _mm256_add_ps(vs, x);
        }
        let mut total = _mm_add_ps(_mm256_castps256_ps128(vs), _mm256_extractf128_ps(vs, 1));
        if n % 2 == 1 {
            let at = w.add(4 * (n - 1));
            let x = _mm256_castps256_ps128(exp8(_mm256_castps128_ps256(_mm_sub_ps(
                _mm_loadu_ps(at),
                new,
            ))));
            _mm_storeu_ps(at, x);
            total = _mm_add_ps(total, x);
        }
        _mm_storeu_ps(sum, _mm_fmadd_ps(_mm_loadu_ps(sum), factor, total));
    }
}

/// [`FourRowKernels::scores_softmax_dim_major`]: each group of 16 keys of
/// a block is scored as one 16-lane vector per row, element by element
/// (a key vector converted once, four FMAs with the rows' elements
/// broadcast, no horizontal sums); the raw scores are left row by row in
/// the group's 64 weights, then [`dim_major_weights`] turns them into the
/// key-major weights of the four-row contract.
///
/// # Safety
/// `q` is valid for `4·d` reads, each segment of `keys` is one block of
/// `bt` keys (`bt % 16 == 0`) of `d` elements of encoding `E` stored
/// `[d][bt]`, `scales` is null or valid for `n` reads, `w` is valid for
/// `4·n` writes (`n` the keys in all), and the three pointers of `state`
/// (max, sum, rescale) for 4 reads and writes each; AVX2, FMA and F16C are present.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn dim_major_scores_softmax_avx2<const E: u8>(
    q: *const f32,
    keys: &[&[u8]],
    d: usize,
    bt: usize,
    scales: *const f32,
    w: *mut f32,
    state: [*mut f32; 3],
    ahead: Paired<'_>,
) {
    let es = elem_bytes::<E>();
    // Elements per 64-byte line of a group's 16 keys: prefetches at that
    // pace walk the paired region once over the block's groups.
    let per_line = (64 / (16 * es)).max(1);
    let group_bytes = 16 * es * d;
    let mut vmax = [_mm256_set1_ps(f32::NEG_INFINITY); 4];
    let mut g = 0;
    // SAFETY: group `gb` of a segment reads elements `c·bt + 16·gb..+16`
    // for `c < d`, inside its `bt·d` elements; group `g` reads scales
    // `16g..16g + 16` (when not null) and writes weights `64g..64g + 64`,
    // under `n` and `4·n`; as the contract requires.
    unsafe {
        for (s, seg) in keys.iter().enumerate() {
            let pair = ahead.region(s, seg.as_ptr(), seg.len());
            for gb in 0..bt / 16 {
                let kp = seg.as_ptr().add(16 * gb * es);
                let mut acc = [_mm256_setzero_ps(); 8];
                for c in 0..d {
                    if c % per_line == 0 {
                        pair.fetch(gb * group_bytes + c * 16 * es);
                    }
                    let lo = load8::<E>(kp, c * bt);
                    let hi = load8::<E>(kp, c * bt + 8);
                    for r in 0..4 {
                        let qv = _mm256_broadcast_ss(&*q.add(r * d + c));
                        acc[2 * r] = _mm256_fmadd_ps(qv, lo, acc[2 * r]);
                        acc[2 * r + 1] = _mm256_fmadd_ps(qv, hi, acc[2 * r + 1]);
                    }
                }
                if !scales.is_null() {
                    // Lanes are keys: each key's scores times its scale.
                    let (lo, hi) = (
                        _mm256_loadu_ps(scales.add(16 * g)),
                        _mm256_loadu_ps(scales.add(16 * g + 8)),
                    );
                    for r in 0..4 {
                        acc[2 * r] = _mm256_mul_ps(acc[2 * r], lo);
                        acc[2 * r + 1] = _mm256_mul_ps(acc[2 * r + 1], hi);
                    }
                }
                let out = w.add(64 * g);
                for r in 0..4 {
                    _mm256_storeu_ps(out.add(16 * r), acc[2 * r]);
                    _mm256_storeu_ps(out.add(16 * r + 8), acc[2 * r + 1]);
                    let m = _mm256_max_ps(acc[2 * r], acc[2 * r + 1]);
                    vmax[r] = _mm256_max_ps(vmax[r], m);
                }
                g += 1;
            }
        }
        dim_major_weights(w, g, hmax4(vmax), state);
    }
}

/// Grows the four rows' running `max` to cover `block_max` and stores each
/// row's rescale factor (exactly 1 where the max held) at `rescale`;
/// returns the new maxima and the factors.
///
/// # Safety
/// `max` and `rescale` are valid for 4 reads and writes; AVX2 and FMA are
/// present.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn grow_max(
    block_max: __m128,
    max: *mut f32,
    rescale: *mut f32,
) -> (__m128, __m128) {
    // SAFETY: four lanes each, by the contract.
    unsafe {
        let old = _mm_loadu_ps(max);
        let new = _mm_max_ps(old, block_max);
        _mm_storeu_ps(max, new);
        let factor = rescale_factors(old, new);
        _mm_storeu_ps(rescale, factor);
        (new, factor)
    }
}

/// The softmax of a dim-major kernel's raw scores: `groups` groups of 16
/// keys, each left as four rows of 16 in its 64 weights, whose rows'
/// maxima are `block_max`. Folds them into the rows' online softmax (the
/// same `exp` and rescaling as [`four_row_scores_softmax_avx2`]) and
/// writes each group's weights back in place, key-major.
///
/// # Safety
/// `w` is valid for `64·groups` reads and writes, and the three pointers
/// of `state` (max, sum, rescale) for 4 reads and writes each; AVX2 and FMA
/// are present.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn dim_major_weights(
    w: *mut f32,
    groups: usize,
    block_max: __m128,
    [max, sum, rescale]: [*mut f32; 3],
) {
    // SAFETY: the contract above.
    unsafe {
        let (new, factor) = grow_max(block_max, max, rescale);
        let m = [
            _mm256_set1_ps(_mm_cvtss_f32(new)),
            _mm256_set1_ps(_mm_cvtss_f32(_mm_permute_ps::<0x55>(new))),
            _mm256_set1_ps(_mm_cvtss_f32(_mm_permute_ps::<0xAA>(new))),
            _mm256_set1_ps(_mm_cvtss_f32(_mm_permute_ps::<0xFF>(new))),
        ];
        let mut sums = [_mm256_setzero_ps(); 4];
        for g in 0..groups {
            let at = w.add(64 * g);
            // Every score of the group is loaded before any weight is
            // stored over it.
            let mut x = [[_mm256_setzero_ps(); 4]; 2];
            for (half, x) in x.iter_mut().enumerate() {
                for (r, x) in x.iter_mut().enumerate() {
                    let s = _mm256_loadu_ps(at.add(16 * r + 8 * half));
                    *x = exp8(_mm256_sub_ps(s, m[r]));
                    sums[r] = _mm256_add_ps(sums[r], *x);
                }
            }
            for (half, x) in x.into_iter().enumerate() {
                // Four rows × eight keys to eight keys × four rows.
                let t0 = _mm256_unpacklo_ps(x[0], x[1]);
                let t1 = _mm256_unpacklo_ps(x[2], x[3]);
                let t2 = _mm256_unpackhi_ps(x[0], x[1]);
                let t3 = _mm256_unpackhi_ps(x[2], x[3]);
                let k04 = _mm256_shuffle_ps::<0x44>(t0, t1);
                let k15 = _mm256_shuffle_ps::<0xEE>(t0, t1);
                let k26 = _mm256_shuffle_ps::<0x44>(t2, t3);
                let k37 = _mm256_shuffle_ps::<0xEE>(t2, t3);
                let out = at.add(32 * half);
                _mm256_storeu_ps(out, _mm256_permute2f128_ps::<0x20>(k04, k15));
                _mm256_storeu_ps(out.add(8), _mm256_permute2f128_ps::<0x20>(k26, k37));
                _mm256_storeu_ps(out.add(16), _mm256_permute2f128_ps::<0x31>(k04, k15));
                _mm256_storeu_ps(out.add(24), _mm256_permute2f128_ps::<0x31>(k26, k37));
            }
        }
        _mm_storeu_ps(sum, _mm_fmadd_ps(_mm_loadu_ps(sum), factor, hsum4(sums)));
    }
}

#[cfg(test)]
mod tests;
