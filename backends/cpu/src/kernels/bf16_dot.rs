//! Four-row decode over E4M3 pages on bf16 dot products: AVX-512 BF16's
//! `vdpbf16ps` (sixteen f32 lanes, each adding two products of bf16
//! pairs, per instruction), on the CPUs that have it with VNNI and VBMI
//! (Sapphire Rapids, Zen 4). The f32 kernels spend a conversion to f16,
//! one to f32 and one FMA per code and query row; these spend three
//! integer operations per pair of codes, shared by the four rows, and
//! half an instruction per product.
//!
//! Codes become bf16 exactly (E4M3's three mantissa bits and exponents
//! from 2^-9 to 2^8 all fit bf16) through two 128-entry byte tables,
//! the high and low bytes of each magnitude's bf16, looked up with VBMI's
//! two-table byte permutes; the sign is the code's top bit.
//!
//! The other side of each product is rounded to bf16 (8 significant
//! bits, relative error at most 2^-8): the query rows in the scores, the
//! softmax weights in the weighted sum. Both are first scaled by a power
//! of two that puts their largest near 2^64, so that no product that
//! matters is a subnormal (which `vdpbf16ps` reads and writes as zero);
//! the sums are scaled back exactly. What the
//! rounding costs against f32 arithmetic is measured in
//! `docs/QUANTIZATION.md` ("fp8 on bf16 dot products").

use std::arch::x86_64::*;

use kvslice_core::KvDtype;

#[cfg(test)]
use super::Kernels;
use super::avx2::Paired;
use super::avx512::{self, mask};
use super::{Fp8Bf16Kernels, MAX_INT8_QUERY_DIMS, SoftmaxState, shapes, vnni};

/// The name the tests give [`vnni::NAME`]'s set with these kernels in
/// place.
#[cfg(test)]
pub(super) const NAME: &str = "avx512f+bw+vl+vnni+vbmi (fp8 on bf16)";
/// The same for [`vnni::SPLIT_NAME`] (Zen 4).
#[cfg(test)]
pub(super) const SPLIT_NAME: &str = "avx2+avx512-weighted-sum+vnni+vbmi (fp8 on bf16)";

/// Longest query row the scores take (longer rows take the f32 kernel).
const MAX_DIMS: usize = MAX_INT8_QUERY_DIMS;

/// Pairs of keys the weighted sum packs and sums at a time: the engine's
/// spans of 64 keys, 8 KiB of values at d = 128, read from memory by its
/// first pass over 64 dims and from L1 by the next (and few enough that
/// setting up the chunk's table on every call costs little).
const CHUNK_PAIRS: usize = 32;

/// Where the largest magnitude of a scaled side lands: 2^64, so that its
/// products with codes down to 2^-9 stay normal for elements down to
/// 2^-181 of the largest, and none overflows.
const TOP_EXP: i32 = 64;

/// Largest exponents of the scaled side that the scaling handles (the
/// factors stay normal f32); outside them, or for a side that is all
/// zeros or not finite, the f32 kernels run.
const EXP_RANGE: core::ops::RangeInclusive<i32> = -140..=70;

/// These kernels, if the CPU has AVX-512 BF16, VNNI and VBMI. They
/// fall back on the VNNI set's own ([`super::Kernels::supported`] gives
/// them to that set alone).
pub(super) fn kernels() -> Option<Fp8Bf16Kernels> {
    let ok = is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
        && is_x86_feature_detected!("avx512vbmi")
        && is_x86_feature_detected!("avx512bf16");
    ok.then_some(Fp8Bf16Kernels {
        scores_softmax_dim_major: four_row_scores_softmax_dim_major,
        weighted_sum: four_row_weighted_sum,
    })
}

/// `set` (a VNNI set with these kernels) with them in place of its own,
/// for the tests, which hold every set's kernels against the same checks.
#[cfg(test)]
pub(super) fn in_place(set: &Kernels) -> Option<Kernels> {
    let name = match set.name {
        vnni::NAME => NAME,
        vnni::SPLIT_NAME => SPLIT_NAME,
        _ => return None,
    };
    let mut set = *set;
    let four = set.stored.as_mut()?.four_rows.as_mut()?;
    let b = four.fp8_bf16?;
    four.scores_softmax_dim_major = b.scores_softmax_dim_major;
    four.weighted_sum = b.weighted_sum;
    set.name = name;
    Some(set)
}

/// Whether `set` is one [`in_place`] made.
#[cfg(test)]
pub(super) fn rounds_fp8_products(set: &Kernels) -> bool {
    [NAME, SPLIT_NAME].contains(&set.name)
}

// As in `avx2`: the safe wrappers below are reachable only through the
// table `kernels` returns, which exists only after the features
// were detected; every `SAFETY` comment here relies on that.

/// The exponent `e` of the largest magnitude among `x` (`2^e ≤ max <
/// 2^(e+1)`), if every element is finite, one is not zero and `e` is in
/// [`EXP_RANGE`].
fn top_exponent(x: &[f32]) -> Option<i32> {
    // SAFETY: AVX-512 F is present.
    let max = unsafe { max_abs(x) }?;
    if max == 0.0 {
        return None;
    }
    // `max` may be subnormal: its exponent from its integer log2.
    let e = if max >= f32::MIN_POSITIVE {
        ((max.to_bits() >> 23) & 0xFF) as i32 - 127
    } else {
        -149 + (31 - max.to_bits().leading_zeros() as i32)
    };
    EXP_RANGE.contains(&e).then_some(e)
}

/// The largest magnitude in `x`, or `None` where one is NaN or infinite.
///
/// # Safety
/// AVX-512 F is present.
#[target_feature(enable = "avx512f")]
unsafe fn max_abs(x: &[f32]) -> Option<f32> {
    let inf = _mm512_set1_ps(f32::INFINITY);
    let (mut m, mut bad) = (_mm512_setzero_ps(), 0u16);
    let mut at = 0;
    while at < x.len() {
        // SAFETY: the mask keeps the load inside `x`.
        let v =
            _mm512_abs_ps(unsafe { _mm512_maskz_loadu_ps(mask(x.len() - at), x.as_ptr().add(at)) });
        bad |= _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(v, inf);
        m = _mm512_max_ps(m, v);
        at += 16;
    }
    (bad == 0).then(|| _mm512_reduce_max_ps(m))
}

/// 2^e as f32, for `e` in -126..=127.
fn pow2(e: i32) -> f32 {
    debug_assert!((-126..=127).contains(&e));
    f32::from_bits(((e + 127) as u32) << 23)
}

/// Multiplies `x` by 2^e for `e` up to twice what one f32 factor holds.
#[inline]
#[target_feature(enable = "avx512f")]
fn times_pow2(x: __m512, e: i32) -> __m512 {
    let half = e / 2;
    _mm512_mul_ps(
        _mm512_mul_ps(x, _mm512_set1_ps(pow2(half))),
        _mm512_set1_ps(pow2(e - half)),
    )
}

/// The bf16 bits of E4M3 magnitudes (codes 0 to 127; 127, a NaN never
/// written, reads as 480): their low bytes, then their high bytes.
static BF16_OF_E4M3: [[u8; 128]; 2] = bf16_tables();

const fn bf16_tables() -> [[u8; 128]; 2] {
    let mut t = [[0u8; 128]; 2];
    let mut m = 0;
    while m < 128 {
        let (e, f) = ((m >> 3) as u32, (m & 7) as u32);
        let v = match e {
            0 => f as f32 / 512.0,
            _ => (8 + f) as f32 / 8.0 * f32::from_bits((e + 120) << 23),
        };
        let bits = v.to_bits() >> 16;
        t[0][m] = bits as u8;
        t[1][m] = (bits >> 8) as u8;
        m += 1;
    }
    t
}

/// [`BF16_OF_E4M3`] in registers: each table's two halves.
#[derive(Clone, Copy)]
struct Tables {
    lo: [__m512i; 2],
    hi: [__m512i; 2],
}

impl Tables {
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn load() -> Self {
        let t = &BF16_OF_E4M3;
        // SAFETY: each half is 64 bytes of its table.
        unsafe {
            let half =
                |row: &[u8; 128], h: usize| _mm512_loadu_si512(row.as_ptr().add(64 * h).cast());
            Self {
                lo: [half(&t[0], 0), half(&t[0], 1)],
                hi: [half(&t[1], 0), half(&t[1], 1)],
            }
        }
    }

    /// The low and the high bytes of the bf16 of each of 64 codes.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
    fn bytes(self, codes: __m512i) -> (__m512i, __m512i) {
        let lo = _mm512_permutex2var_epi8(self.lo[0], codes, self.lo[1]);
        let hi = _mm512_permutex2var_epi8(self.hi[0], codes, self.hi[1]);
        // The sign: hi | (codes & 0x80).
        let sign = _mm512_set1_epi8(0x80u8 as i8);
        (lo, _mm512_ternarylogic_epi32::<0xF8>(hi, codes, sign))
    }
}

/// 512 bits of plain data as bf16 pairs.
#[inline]
#[target_feature(enable = "avx512f")]
fn as_bf16(x: __m512i) -> __m512bh {
    // SAFETY: both are 512 bits of plain data.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(x) }
}

/// [`super::FourRowKernels::scores_softmax_dim_major`]: E4M3 keys on
/// `vdpbf16ps`, where the keys carry scales, `d` fits [`MAX_DIMS`] and
/// the query rows scale (see [`top_exponent`]); AVX-512's f32 kernel
/// otherwise.
fn four_row_scores_softmax_dim_major(
    dtype: KvDtype,
    q: &[f32],
    keys: &[&[u8]],
    scales: &[f32],
    weights: &mut [f32],
    mut state: SoftmaxState<'_>,
    ahead: &[&[u8]],
) {
    let d = q.len() / 4;
    // Head widths are a multiple of 8 by the kernels' contract; four
    // dims per step need 4.
    let fit =
        dtype == KvDtype::F8E4M3 && !scales.is_empty() && d.is_multiple_of(4) && d <= MAX_DIMS;
    let Some(e) = fit.then(|| top_exponent(&q[..4 * d])).flatten() else {
        return avx512::four_row_scores_softmax_dim_major(
            dtype, q, keys, scales, weights, state, ahead,
        );
    };
    let (d, bt, n) = shapes::four_row_dim_major(q.len(), keys, 1, weights.len(), state.lens());
    let scales = shapes::key_scales(scales, n);
    let mut pairs = [[0u32; MAX_DIMS / 2]; 4];
    // SAFETY: `q` holds `4·d` elements, `d` a multiple of 4 and at most
    // `MAX_DIMS`.
    unsafe { pack_rows(q.as_ptr(), d, TOP_EXP - e, &mut pairs) };
    // Products are q·2^(64−e) times each code's value; `scales` hold each
    // key's scale times 256 (`raw_scale`), for codes read as value / 256.
    let back = -8 - (TOP_EXP - e);
    // SAFETY: the shape checks above bound every access (each segment one
    // block of `bt` keys of `d` codes, `bt % 16 == 0`, `scales` `n`,
    // `weights` `4·n`, the state four rows); the features are present.
    unsafe {
        dim_major_fp8(
            &pairs,
            keys,
            d,
            bt,
            scales,
            back,
            weights.as_mut_ptr(),
            state.as_mut_ptrs(),
            Paired::new(ahead),
        )
    }
}

/// Each of the four rows of `q` (`d` each) times 2^`shift`, rounded to
/// bf16, two dims to a word (the lower dim in the low half).
///
/// # Safety
/// `q` is valid for `4·d` reads, `d` is a multiple of 4 and at most
/// `MAX_DIMS`; AVX-512 F and BF16 are present.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn pack_rows(q: *const f32, d: usize, shift: i32, out: &mut [[u32; MAX_DIMS / 2]; 4]) {
    for (r, row) in out.iter_mut().enumerate() {
        let mut c = 0;
        while c < d {
            // SAFETY: the mask keeps the read inside row `r`; the store of
            // eight words at `c / 2 < MAX_DIMS / 2` stays inside `row`
            // (`MAX_DIMS` is a multiple of 16).
            unsafe {
                let x = _mm512_maskz_loadu_ps(mask(d - c), q.add(r * d + c));
                let b = _mm512_cvtneps_pbh(times_pow2(x, shift));
                let words = std::mem::transmute::<__m256bh, __m256i>(b);
                _mm256_storeu_si256(row.as_mut_ptr().add(c / 2).cast(), words);
            }
            c += 16;
        }
    }
}

/// AVX-512's dim-major scheme ([`avx512::dim_major_weights`] for the
/// softmax) with each group's 16 keys in one register per row: four dims
/// of the group's keys through the tables at once, then two dims per
/// `vdpbf16ps` into eight accumulators. Each lane's sum times its key's
/// scale and 2^`back` is the score.
///
/// # Safety
/// As [`avx2::DimMajorKernel`](super::avx2::DimMajorKernel) for one-byte
/// codes, with the query rows packed in `q` (`d / 2` words each, `d` a
/// multiple of 4) and `scales` not null; AVX-512 F, BW, VL, VBMI and
/// BF16, AVX2 and FMA are present.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512bf16,avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn dim_major_fp8(
    q: &[[u32; MAX_DIMS / 2]; 4],
    keys: &[&[u8]],
    d: usize,
    bt: usize,
    scales: *const f32,
    back: i32,
    w: *mut f32,
    state: [*mut f32; 3],
    ahead: Paired<'_>,
) {
    let tables = Tables::load();
    // From four dims' 16 codes each (bytes 16·i + t) through the tables
    // (low bytes, then high bytes at 64 + ...): dword `t` of pair `p`
    // holds key `t`'s bf16 of dims `2p` and `2p + 1`.
    let mut idx = [[0u8; 64]; 2];
    for (p, idx) in idx.iter_mut().enumerate() {
        for (b, x) in idx.iter_mut().enumerate() {
            let (t, half, byte) = (b / 4, (b % 4) / 2, b % 2);
            *x = (64 * byte + 16 * (2 * p + half) + t) as u8;
        }
    }
    // SAFETY: 64 bytes each.
    let idx = idx.map(|i| unsafe { _mm512_loadu_si512(i.as_ptr().cast()) });
    let mut vmax = [_mm512_set1_ps(f32::NEG_INFINITY); 4];
    let mut g = 0;
    // SAFETY: group `gb` of a segment reads dims `c..c + 4 ≤ d` of its 16
    // keys, inside the block's `bt·d` bytes; group `g` reads scales
    // `16g..16g + 16` and writes weights `64g..64g + 64`, under `n` and
    // `4·n`; as the contract requires.
    unsafe {
        for (s, seg) in keys.iter().enumerate() {
            let region = ahead.region(s, seg.as_ptr(), seg.len());
            for gb in 0..bt / 16 {
                let kp = seg.as_ptr().add(16 * gb);
                let mut acc = [_mm512_setzero_ps(); 8];
                let mut c = 0;
                while c < d {
                    let at = gb * 16 * d + c * 16;
                    region.fetch_lines(at, at + 64);
                    let (lo, hi) = tables.bytes(four_dims(kp, bt, c));
                    let k0 = as_bf16(_mm512_permutex2var_epi8(lo, idx[0], hi));
                    let k1 = as_bf16(_mm512_permutex2var_epi8(lo, idx[1], hi));
                    for r in 0..4 {
                        acc[r] = _mm512_dpbf16_ps(acc[r], k0, query_pair(q, r, c));
                        let q1 = query_pair(q, r, c + 2);
                        acc[4 + r] = _mm512_dpbf16_ps(acc[4 + r], k1, q1);
                    }
                    c += 4;
                }
                let sv = _mm512_loadu_ps(scales.add(16 * g));
                let out = w.add(64 * g);
                for r in 0..4 {
                    let x = times_pow2(_mm512_add_ps(acc[r], acc[4 + r]), back);
                    let x = _mm512_mul_ps(x, sv);
                    _mm512_storeu_ps(out.add(16 * r), x);
                    vmax[r] = _mm512_max_ps(vmax[r], x);
                }
                g += 1;
            }
        }
        avx512::dim_major_weights(w, g, vmax, state);
    }
}

/// The codes of dims `c..c + 4` of a group's 16 keys, 16 bytes per dim,
/// from a block of `bt` keys stored `[d][bt]`: one load where the block
/// is one group wide.
///
/// # Safety
/// `kp + i·bt` is valid for 16 reads for every `i` in `c..c + 4`;
/// AVX-512 F is present.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn four_dims(kp: *const u8, bt: usize, c: usize) -> __m512i {
    // SAFETY: the contract above.
    unsafe {
        if bt == 16 {
            return _mm512_loadu_si512(kp.add(c * bt).cast());
        }
        let x = [0, 1, 2, 3].map(|i| _mm_loadu_si128(kp.add((c + i) * bt).cast()));
        let lo = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(x[0]), x[1]);
        let hi = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(x[2]), x[3]);
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
    }
}

/// Row `r`'s dims `c` and `c + 1` (`c` even, `c + 1 < d`) of packed queries,
/// in every lane.
#[inline]
#[target_feature(enable = "avx512f")]
fn query_pair(q: &[[u32; MAX_DIMS / 2]; 4], r: usize, c: usize) -> __m512bh {
    as_bf16(_mm512_set1_epi32(q[r][c / 2] as i32))
}

/// [`super::FourRowKernels::weighted_sum`]: E4M3 values on `vdpbf16ps`
/// where the head width is a multiple of 64 and the weights scale (see
/// [`top_exponent`]); the VNNI set's kernel otherwise.
fn four_row_weighted_sum(
    dtype: KvDtype,
    p: &[f32],
    values: &[&[u8]],
    acc: &mut [f32],
    ahead: &[&[u8]],
) {
    let d = acc.len() / 4;
    if dtype != KvDtype::F8E4M3 || d == 0 || !d.is_multiple_of(64) {
        return vnni::four_row_weighted_sum(dtype, p, values, acc, ahead);
    }
    let (d, n) = shapes::four_row_weighted_sum(p.len(), values, 1, acc.len());
    let Some(e) = top_exponent(&p[..4 * n]) else {
        return vnni::four_row_weighted_sum(dtype, p, values, acc, ahead);
    };
    // SAFETY: the shape checks above bound every access (`p` `4·n`
    // weights, the segments `n` whole rows of `d` codes, `acc` `4·d`,
    // `d % 64 == 0`); the features are present.
    unsafe {
        weighted_sum_fp8(
            p.as_ptr(),
            values,
            d,
            acc.as_mut_ptr(),
            e,
            Paired::new(ahead),
        )
    }
}

/// One or two keys of a segment, as [`weighted_sum_fp8`] sums them.
#[derive(Clone, Copy)]
struct KeyPair {
    /// Row `i`'s two weights as bf16, the first key's in the low half.
    weights: [u32; 4],
    /// The first key's value row.
    row: *const u8,
    /// Whether a second key follows it (else its weights are zero and
    /// its row is not read).
    two: bool,
    /// The segment and the row's byte offset there, for the prefetches.
    seg: usize,
    at: usize,
}

/// The weighted sum on bf16 pairs: per chunk of up to [`CHUNK_PAIRS`]
/// pairs of keys, the weights times 2^(64 − `e`) rounded to bf16, then
/// one pass per 64 dims whose sixteen sums (four rows, four vectors of
/// 16 dims) stay in registers for the chunk. Two value rows interleaved
/// byte by byte, through the tables, put one dim of both keys in each
/// lane; the dim's sum is the lane's times 2^(e − 64 − 8).
///
/// # Safety
/// `p` is valid for `4·n` reads (`n` the rows of `values` in all), their
/// largest magnitude below 2^(e+1); each segment of `values` holds whole
/// rows of `d` codes; `acc` is valid for `4·d` reads and writes; `d % 64
/// == 0`; AVX-512 F, BW, VL, VBMI and BF16 are present.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512bf16")]
unsafe fn weighted_sum_fp8(
    p: *const f32,
    values: &[&[u8]],
    d: usize,
    acc: *mut f32,
    e: i32,
    ahead: Paired<'_>,
) {
    let shift = TOP_EXP - e;
    let back = -8 - shift;
    // Keys j and j + 1's weights (lanes 0..4 and 4..8, as bf16 words) to
    // row i's pair in word i.
    let order = _mm_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15);
    let tables = Tables::load();
    let mut chunk = [KeyPair {
        weights: [0; 4],
        row: std::ptr::null(),
        two: false,
        seg: 0,
        at: 0,
    }; CHUNK_PAIRS];
    let (mut s, mut j, mut key) = (0, 0, 0);
    loop {
        let mut pairs = 0;
        while s < values.len() && pairs < CHUNK_PAIRS {
            let m = values[s].len() / d;
            if j >= m {
                (s, j) = (s + 1, 0);
                continue;
            }
            let count = (m - j).min(2);
            let mut weights = [0u32; 4];
            // SAFETY: the mask keeps the weights read under `4·n` (`key +
            // count ≤ n`); row `j` of segment `s` is inside it (`j < m`).
            let row = unsafe {
                let w = _mm256_maskz_loadu_ps(mask(4 * count) as __mmask8, p.add(4 * key));
                let w = _mm512_castps512_ps256(times_pow2(_mm512_castps256_ps512(w), shift));
                let b = std::mem::transmute::<__m128bh, __m128i>(_mm256_cvtneps_pbh(w));
                _mm_storeu_si128(weights.as_mut_ptr().cast(), _mm_shuffle_epi8(b, order));
                values[s].as_ptr().add(j * d)
            };
            chunk[pairs] = KeyPair {
                weights,
                row,
                two: count == 2,
                seg: s,
                at: j * d,
            };
            (pairs, key, j) = (pairs + 1, key + count, j + count);
        }
        if pairs == 0 {
            return;
        }
        let ready = &chunk[..pairs];
        for h in 0..d / 64 {
            // SAFETY: the pairs' rows are inside their segments, each `d ≥
            // 64·(h + 1)` codes long; `acc` holds `4·d`.
            unsafe {
                let sums = pass(ready, d, 64 * h, tables, (ahead, values, (h, d / 64)));
                for (r, row) in sums.into_iter().enumerate() {
                    add_sums(acc.add(r * d + 64 * h), row, back);
                }
            }
        }
    }
}

/// One pass of [`weighted_sum_fp8`] over dims `off..off + 64`: per row,
/// four vectors of sums, vector `x` holding in lane `4·l + t` dim `off +
/// 16·l + 4·x + t` ([`add_sums`] puts them back in order). `fetch` (the
/// paired regions, the segments of the values, and this pass's share
/// `(i, of)`): share `i` of `of` of each pair's rows in the paired region
/// is prefetched as the pair is summed.
///
/// # Safety
/// Each pair's row points at one row of `d` codes, two where `two`,
/// `off + 64 ≤ d`; AVX-512 F, BW, VL, VBMI and BF16 are present.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512bf16")]
unsafe fn pass(
    pairs: &[KeyPair],
    d: usize,
    off: usize,
    tables: Tables,
    (ahead, values, (i, of)): (Paired<'_>, &[&[u8]], (usize, usize)),
) -> [[__m512; 4]; 4] {
    let mut sums = [[_mm512_setzero_ps(); 4]; 4];
    // Each row's share: `d / of` bytes (`of` divides `d`), without a
    // division per pair.
    let stride = d / of;
    for kp in pairs {
        let seg = values[kp.seg];
        let share = if kp.two { 2 * stride } else { stride };
        let region = ahead.region(kp.seg, seg.as_ptr(), seg.len());
        region.fetch_lines(kp.at + i * share, kp.at + (i + 1) * share);
        // SAFETY: 64 codes at `off` of the pair's one or two rows.
        let (a, b) = unsafe {
            let a = _mm512_loadu_si512(kp.row.add(off).cast());
            let b = match kp.two {
                true => _mm512_loadu_si512(kp.row.add(d + off).cast()),
                false => _mm512_setzero_si512(),
            };
            (a, b)
        };
        // Lane `l` of the first: dims `16·l..16·l + 8` of both keys in
        // turn; of the second, the next 8.
        let codes = [_mm512_unpacklo_epi8(a, b), _mm512_unpackhi_epi8(a, b)];
        let mut x = [_mm512_setzero_si512(); 4];
        for (h, c) in codes.into_iter().enumerate() {
            let (lo, hi) = tables.bytes(c);
            x[2 * h] = _mm512_unpacklo_epi8(lo, hi);
            x[2 * h + 1] = _mm512_unpackhi_epi8(lo, hi);
        }
        for (r, row) in sums.iter_mut().enumerate() {
            let wv = as_bf16(_mm512_set1_epi32(kp.weights[r] as i32));
            for (sum, v) in row.iter_mut().zip(x) {
                *sum = _mm512_dpbf16_ps(*sum, as_bf16(v), wv);
            }
        }
    }
    sums
}

/// `acc[0..64] += sums · 2^back`, the sums in [`pass`]'s order put back
/// in dim order by a 4 × 4 transpose of their 128-bit lanes.
///
/// # Safety
/// `acc` is valid for 64 reads and writes; AVX-512 F is present.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn add_sums(acc: *mut f32, x: [__m512; 4], back: i32) {
    for (m, v) in avx512::transpose_quarters(x).into_iter().enumerate() {
        // SAFETY: 16 f32 at `16·m < 64`.
        unsafe {
            let a = acc.add(16 * m);
            _mm512_storeu_ps(a, _mm512_add_ps(_mm512_loadu_ps(a), times_pow2(v, back)));
        }
    }
}

#[cfg(test)]
mod tests {
    /// The tables give every E4M3 code's value exactly, as bf16.
    #[test]
    fn tables_hold_every_code_exactly() {
        for code in 0..=255u8 {
            if code & 0x7F == 0x7F {
                continue; // NaN, never written
            }
            let m = usize::from(code & 0x7F);
            let [lo, hi] = super::BF16_OF_E4M3.map(|t| u16::from(t[m]));
            let bits = (hi << 8 | lo) | u16::from(code & 0x80) << 8;
            let got = f32::from_bits(u32::from(bits) << 16);
            assert_eq!(got, kvslice_core::f8e4m3_to_f32(code), "code {code:#04x}");
        }
    }
}
