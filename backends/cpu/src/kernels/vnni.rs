//! Four-row decode over int8 pages on integer dot products: AVX-512
//! VNNI's `vpdpbusd` (64 products of unsigned by signed bytes, summed four
//! at a time into sixteen i32 lanes, per instruction) and VBMI's byte
//! permutes, on the CPUs that have both (Ice Lake, Sapphire Rapids, Zen 4).
//! The f32 kernels spend one FMA and one conversion per code and query
//! row; these spend a sixty-fourth of an instruction per product.
//!
//! - The weighted sum rounds each query row's weights of a chunk of keys
//!   (already times each value's scale) to 16 bits against the row's
//!   largest and sums their high and low bytes against the value codes,
//!   exactly in i32: its results differ from f32 arithmetic by at most
//!   about 1e-5 of the largest weight's contribution, so the set uses it
//!   for every int8 weighted sum.
//! - The scores with int8 queries round each query row to int8 against
//!   its largest element (as llama.cpp rounds activations against q8_0
//!   caches); the key codes, shifted by 128 to be unsigned as `vpdpbusd`
//!   takes one side, sum against them, and each row's code sum times 128
//!   undoes the shift. That
//!   rounding adds error of its own (a fifth more than int8 K/V's on
//!   Gaussian keys, `core/tests/quantized_accuracy.rs`), so the engine
//!   takes these only when asked ([`crate::CpuEngine::with_int8_queries`]).
//!
//! What they gain, and what was tried on the way: docs/notes/cpu-decode.md
//! ("8-bit queries on `vpdpbusd`").

use std::arch::x86_64::*;
use std::mem::MaybeUninit;

use kvslice_core::KvDtype;

use super::avx2::Paired;
use super::avx512::{self, mask};
use super::{Int8Queries, Int8QueryKernels, Kernels, MAX_INT8_QUERY_DIMS, SoftmaxState, shapes};

/// This set's name where it extends AVX-512's set.
pub(super) const NAME: &str = "avx512f+bw+vl+vnni+vbmi";
/// Its name where it extends [`super::SPLIT_512_NAME`] (Zen 4).
pub(super) const SPLIT_NAME: &str = "avx2+avx512-weighted-sum+vnni+vbmi";

/// Keys the weighted sum rounds and sums at a time: 16 KiB of values at
/// d = 128, read from memory by the first of its passes and from L1 by
/// the others (the engine's spans are 64 keys), and few enough that no
/// i32 sum can overflow (each lane adds at most 4 · 255 · 128 per group
/// of four keys).
const CHUNK_KEYS: usize = 128;

/// `base` (the set that would run first: AVX-512's, or Zen 4's split set,
/// whose four-row kernels are both AVX-512's) with this set's kernels, if
/// the CPU has AVX-512 VNNI and VBMI.
pub(super) fn with_byte_kernels(base: &Kernels) -> Option<Kernels> {
    let name = match base.name {
        avx512::NAME => NAME,
        super::SPLIT_512_NAME => SPLIT_NAME,
        _ => return None,
    };
    let ok = is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
        && is_x86_feature_detected!("avx512vbmi");
    let mut set = *base;
    let four = set.stored.as_mut()?.four_rows.as_mut()?;
    four.weighted_sum = four_row_weighted_sum;
    four.int8_queries = Some(Int8QueryKernels {
        round: round_queries,
        scores_softmax_dim_major: four_row_scores_softmax_int8_queries,
    });
    set.name = name;
    ok.then_some(set)
}

/// Whether `set` is one of these, whose four-row weighted sum rounds int8
/// pages' weights to 16 bits.
pub(super) fn is_vnni_set(set: &Kernels) -> bool {
    [NAME, SPLIT_NAME].contains(&set.name)
}

// As in `avx2`: the safe wrappers below are reachable only through the
// table `with_byte_kernels` returns, which exists only after the features
// were detected; every `SAFETY` comment here relies on that.

/// [`super::FourRowKernels::weighted_sum`]: int8 values on `vpdpbusd`
/// where the head width is a multiple of 64 and every weight is finite and
/// not negative (as softmax weights times scales are), and no row's are
/// all below about 1.9e-34; AVX-512's f32 kernel otherwise.
pub(super) fn four_row_weighted_sum(
    dtype: KvDtype,
    p: &[f32],
    values: &[&[u8]],
    acc: &mut [f32],
    ahead: &[&[u8]],
) {
    let d = acc.len() / 4;
    if dtype != KvDtype::I8 || d == 0 || !d.is_multiple_of(64) {
        return avx512::four_row_weighted_sum(dtype, p, values, acc, ahead);
    }
    let (d, n) = shapes::four_row_weighted_sum(p.len(), values, 1, acc.len());
    // SAFETY: `p` holds `4·n` weights (checked above); AVX-512 F is present.
    let Some(max) = (unsafe { row_maxima(p.as_ptr(), n) }) else {
        return avx512::four_row_weighted_sum(dtype, p, values, acc, ahead);
    };
    // SAFETY: the shape checks above bound every access (`p` `4·n`
    // weights, the segments `n` whole rows of `d` codes, `acc` `4·d`,
    // `d % 64 == 0`); AVX-512 F, BW, VL, VNNI and VBMI are present.
    unsafe {
        weighted_sum_bytes(
            p.as_ptr(),
            values,
            d,
            acc.as_mut_ptr(),
            max,
            Paired::new(ahead),
        )
    }
}

/// The largest of each of the four rows' weights (`w[j·4 + i]` for key
/// `j`, row `i`), or `None` where any weight is negative, NaN or infinite,
/// or a row's are all so small that rounding them against their largest
/// (65535 over it overflows) would make them all 0.
///
/// # Safety
/// `w` is valid for `4·n` reads; AVX-512 F is present.
#[target_feature(enable = "avx512f")]
unsafe fn row_maxima(w: *const f32, n: usize) -> Option<[f32; 4]> {
    let (mut max, mut bad) = (_mm512_setzero_ps(), 0u16);
    let (zero, inf) = (_mm512_setzero_ps(), _mm512_set1_ps(f32::INFINITY));
    let mut at = 0;
    while at < 4 * n {
        // SAFETY: the mask keeps the load under `4·n`.
        let x = unsafe { _mm512_maskz_loadu_ps(mask(4 * n - at), w.add(at)) };
        // Not (0 ≤ x < ∞): negative, NaN or infinite.
        bad |=
            _mm512_cmp_ps_mask::<_CMP_NGE_UQ>(x, zero) | _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(x, inf);
        max = _mm512_max_ps(max, x);
        at += 16;
    }
    let mut rows = [0f32; 4];
    // SAFETY: four f32.
    unsafe { _mm_storeu_ps(rows.as_mut_ptr(), avx512::quarters::<{ avx512::MAX }>(max)) };
    let too_small = rows.iter().any(|&m| m > 0.0 && !(65535.0 / m).is_finite());
    (bad == 0 && !too_small).then_some(rows)
}

/// Up to four keys of one segment, as [`weighted_sum_bytes`] sums them.
#[derive(Clone, Copy)]
struct Group {
    /// The rounded weights: low bytes of rows 0..4 (key `k` in byte `k`),
    /// then their high bytes.
    packed: [u32; 8],
    /// The first key's value row.
    row: *const u8,
    /// Keys in the group, 1 to 4.
    count: usize,
    /// The segment and the row's byte offset there, for the prefetches.
    seg: usize,
    at: usize,
}

/// The weighted sum on bytes: per chunk of up to [`CHUNK_KEYS`] keys, the
/// weights rounded to 16 bits (`w / max_i · 65535` for row `i`), then one
/// pass per pair of rows and 64 dims, whose sixteen i32 sums (two rows,
/// high and low bytes, four vectors of 16 dims) stay in registers for the
/// chunk. Four value rows interleaved byte by byte (`vpunpck`) put one dim
/// of four keys in each i32 lane, the four keys' bytes of one weight in
/// each lane of a broadcast: one `vpdpbusd` per limb, row and 16 dims.
/// The first pass prefetches the paired region of the rows it reads.
///
/// # Safety
/// `p` is valid for `4·n` reads (`n` the rows of `values` in all), every
/// one finite, not negative and at most `max` of its row; each segment of
/// `values` holds whole rows of `d` codes; `acc` is valid for `4·d` reads
/// and writes; `d % 64 == 0`; AVX-512 F, BW, VL, VNNI and VBMI are present.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn weighted_sum_bytes(
    p: *const f32,
    values: &[&[u8]],
    d: usize,
    acc: *mut f32,
    max: [f32; 4],
    ahead: Paired<'_>,
) {
    let mut inv = [0f32; 4];
    let mut unit = [0f32; 4];
    for i in 0..4 {
        if max[i] > 0.0 {
            inv[i] = 65535.0 / max[i];
            unit[i] = max[i] / 65535.0;
        }
    }
    // SAFETY: four f32.
    let inv = _mm512_broadcast_f32x4(unsafe { _mm_loadu_ps(inv.as_ptr()) });
    let top = _mm512_set1_epi32(65535);
    // Four keys' rounded weights (lane 4k + i: key k, row i) to the low
    // bytes of rows 0..4 (bytes 4i + k) and their high bytes (16 + 4i + k).
    let mut idx = [0u8; 64];
    for (b, x) in idx.iter_mut().enumerate().take(32) {
        let (limb, i, k) = (b / 16, (b % 16) / 4, b % 4);
        *x = (4 * (4 * k + i) + limb) as u8;
    }
    // SAFETY: 64 bytes.
    let idx = unsafe { _mm512_loadu_si512(idx.as_ptr().cast()) };
    // Groups never cross segments; those of a chunk, each written before
    // it is read, are all the chunk's state.
    let mut chunk = [const { MaybeUninit::<Group>::uninit() }; CHUNK_KEYS];
    let (mut s, mut j, mut key) = (0, 0, 0);
    loop {
        let (mut groups, mut keys) = (0, 0);
        while s < values.len() && keys + 4 <= CHUNK_KEYS {
            let m = values[s].len() / d;
            if j >= m {
                (s, j) = (s + 1, 0);
                continue;
            }
            let count = (m - j).min(4);
            let mut packed = [0u32; 8];
            // SAFETY: row `j` of segment `s` is inside it (`j < m`); the
            // mask keeps the weights read under `4·n` (`key + count ≤ n`).
            let row = unsafe {
                let w = _mm512_maskz_loadu_ps(mask(4 * count), p.add(4 * key));
                let codes = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(w, inv)), top);
                let bytes = _mm512_permutexvar_epi8(idx, codes);
                _mm256_storeu_si256(packed.as_mut_ptr().cast(), _mm512_castsi512_si256(bytes));
                values[s].as_ptr().add(j * d)
            };
            chunk[groups].write(Group {
                packed,
                row,
                count,
                seg: s,
                at: j * d,
            });
            (groups, keys, key, j) = (groups + 1, keys + count, key + count, j + count);
        }
        if groups == 0 {
            return;
        }
        // SAFETY: the first `groups` entries were written above.
        let ready = unsafe { std::slice::from_raw_parts(chunk.as_ptr().cast::<Group>(), groups) };
        for pair in 0..2 {
            for h in 0..d / 64 {
                // SAFETY: the groups' rows are inside their segments, each
                // `d ≥ 64·(h + 1)` codes long; `acc` holds `4·d`.
                unsafe {
                    // Each pass prefetches its share of the paired rows
                    // as it goes, so that they spread over the chunk.
                    let share = (pair * d / 64 + h, 2 * d / 64);
                    let sums = pass(ready, d, 64 * h, pair, (ahead, values, share));
                    for (i, row) in sums.into_iter().enumerate() {
                        let r = 2 * pair + i;
                        add_sums(acc.add(r * d + 64 * h), row, unit[r]);
                    }
                }
            }
        }
    }
}

/// One pass of [`weighted_sum_bytes`]: for rows `2·pair` and `2·pair + 1`
/// and dims `off..off + 64`, the i32 sums of the high (`[i][0]`) and low
/// (`[i][1]`) weight bytes times the codes, vector `c` holding dims
/// `off + 16·l + 4·c + t` in lane `4·l + t`. `fetch` (the paired
/// regions, the segments of the values, and this pass's share `(i, of)`):
/// share `i` of `of` of each group's rows in the paired region is
/// prefetched as the group is summed.
///
/// # Safety
/// Each group's row points at `count` rows of `d` codes, `off + 64 ≤ d`;
/// AVX-512 F, BW, VL and VNNI are present.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn pass(
    groups: &[Group],
    d: usize,
    off: usize,
    pair: usize,
    (ahead, values, (i, of)): (Paired<'_>, &[&[u8]], (usize, usize)),
) -> [[[__m512i; 4]; 2]; 2] {
    let mut sums = [[[_mm512_setzero_si512(); 4]; 2]; 2];
    // Each row's share: `d / of` bytes (`of` divides `d`), without a
    // division per group.
    let stride = d / of;
    for g in groups {
        let (at, count) = (g.row, g.count);
        let seg = values[g.seg];
        let share = count * stride;
        let region = ahead.region(g.seg, seg.as_ptr(), seg.len());
        region.fetch_lines(g.at + i * share, g.at + (i + 1) * share);
        // Keys past the group's count read as zeros (their weights are
        // zero too).
        let mut v = [_mm512_setzero_si512(); 4];
        for (k, x) in v.iter_mut().enumerate().take(count) {
            // SAFETY: row `k < count` of the group, 64 codes at `off`.
            *x = unsafe { _mm512_loadu_si512(at.add(k * d + off).cast()) };
        }
        let (ab_lo, ab_hi) = (
            _mm512_unpacklo_epi8(v[0], v[1]),
            _mm512_unpackhi_epi8(v[0], v[1]),
        );
        let (cd_lo, cd_hi) = (
            _mm512_unpacklo_epi8(v[2], v[3]),
            _mm512_unpackhi_epi8(v[2], v[3]),
        );
        let x = [
            _mm512_unpacklo_epi16(ab_lo, cd_lo),
            _mm512_unpackhi_epi16(ab_lo, cd_lo),
            _mm512_unpacklo_epi16(ab_hi, cd_hi),
            _mm512_unpackhi_epi16(ab_hi, cd_hi),
        ];
        for (i, sum) in sums.iter_mut().enumerate() {
            let r = 2 * pair + i;
            let hi = _mm512_set1_epi32(g.packed[4 + r] as i32);
            let lo = _mm512_set1_epi32(g.packed[r] as i32);
            for c in 0..4 {
                sum[0][c] = _mm512_dpbusd_epi32(sum[0][c], hi, x[c]);
                sum[1][c] = _mm512_dpbusd_epi32(sum[1][c], lo, x[c]);
            }
        }
    }
    sums
}

/// `acc[0..64] += (256·hi + lo) · unit`, the sums in [`pass`]'s order
/// (vector `c`, lane `4·l + t`: dim `16·l + 4·c + t`) put back in dim
/// order by a 4 × 4 transpose of 128-bit lanes.
///
/// # Safety
/// `acc` is valid for 64 reads and writes; AVX-512 F is present.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn add_sums(acc: *mut f32, [hi, lo]: [[__m512i; 4]; 2], unit: f32) {
    let mut f = [_mm512_setzero_ps(); 4];
    for c in 0..4 {
        f[c] = _mm512_fmadd_ps(
            _mm512_cvtepi32_ps(hi[c]),
            _mm512_set1_ps(256.0),
            _mm512_cvtepi32_ps(lo[c]),
        );
    }
    let u = _mm512_set1_ps(unit);
    for (m, x) in avx512::transpose_quarters(f).into_iter().enumerate() {
        // SAFETY: 16 f32 at `16·m < 64`.
        unsafe {
            let a = acc.add(16 * m);
            _mm512_storeu_ps(a, _mm512_fmadd_ps(x, u, _mm512_loadu_ps(a)));
        }
    }
}

/// [`Int8QueryKernels::round`].
fn round_queries(q: &[f32]) -> Option<Int8Queries> {
    let d = q.len() / 4;
    if d == 0 || !d.is_multiple_of(4) || d > MAX_INT8_QUERY_DIMS || q.len() != 4 * d {
        return None;
    }
    let mut out = Int8Queries {
        codes: [[0; MAX_INT8_QUERY_DIMS / 4]; 4],
        sums: [0; 4],
        scales: [0.0; 4],
        dims: d,
    };
    // SAFETY: `q` holds `4·d` elements, `d % 4 == 0` and `d` fits the
    // codes; AVX-512 F, BW and VL are present.
    out.scales = unsafe { round_rows(q.as_ptr(), d, &mut out.codes) }?;
    for (sum, row) in out.sums.iter_mut().zip(&out.codes) {
        let bytes = row.iter().flat_map(|w| w.to_le_bytes()).take(d);
        *sum = bytes.map(|b| i32::from(b as i8)).sum();
    }
    Some(out)
}

/// Rounds each of the four rows of `q` (`d` each) to int8 against its
/// largest magnitude, packed four dims to a word in `codes`;
/// returns each row's scale (the value of code 1), or `None` where an
/// element is NaN or infinite.
///
/// # Safety
/// `q` is valid for `4·d` reads, `d ≤ MAX_INT8_QUERY_DIMS`; AVX-512 F,
/// BW and VL are present.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn round_rows(
    q: *const f32,
    d: usize,
    codes: &mut [[u32; MAX_INT8_QUERY_DIMS / 4]; 4],
) -> Option<[f32; 4]> {
    let mut scales = [0f32; 4];
    let inf = _mm512_set1_ps(f32::INFINITY);
    for (r, out) in codes.iter_mut().enumerate() {
        // SAFETY: row `r` is `d` elements at `r·d`; masks keep every read
        // inside it, and each 16-byte store starts below `d`, inside the
        // row's `MAX_INT8_QUERY_DIMS` bytes (a multiple of 16).
        unsafe {
            let row = q.add(r * d);
            let (mut m, mut bad) = (_mm512_setzero_ps(), 0u16);
            let mut c = 0;
            while c < d {
                let x = _mm512_abs_ps(_mm512_maskz_loadu_ps(mask(d - c), row.add(c)));
                bad |= _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(x, inf);
                m = _mm512_max_ps(m, x);
                c += 16;
            }
            if bad != 0 {
                return None;
            }
            let largest = _mm512_reduce_max_ps(m);
            scales[r] = largest / 127.0;
            let inv = _mm512_set1_ps(if largest > 0.0 { 127.0 / largest } else { 0.0 });
            let bytes = out.as_mut_ptr().cast::<u8>();
            let mut c = 0;
            while c < d {
                let x = _mm512_maskz_loadu_ps(mask(d - c), row.add(c));
                let code = _mm512_cvtps_epi32(_mm512_mul_ps(x, inv));
                _mm_storeu_si128(bytes.add(c).cast(), _mm512_cvtepi32_epi8(code));
                c += 16;
            }
        }
    }
    Some(scales)
}

/// [`Int8QueryKernels::scores_softmax_dim_major`].
fn four_row_scores_softmax_int8_queries(
    q: &Int8Queries,
    keys: &[&[u8]],
    scales: &[f32],
    weights: &mut [f32],
    mut state: SoftmaxState<'_>,
    ahead: &[&[u8]],
) {
    let (d, bt, n) = shapes::four_row_dim_major(4 * q.dims, keys, 1, weights.len(), state.lens());
    let scales = shapes::key_scales(scales, n);
    // SAFETY: the checks above bound every access (each segment one block
    // of `bt` keys of `d` codes stored `[d][bt]`, `bt % 16 == 0`, `d % 4 ==
    // 0` as `round` made it, `weights` `4·n`, `scales` null or `n`, the
    // state four rows); AVX-512 F, BW, VL, VNNI and VBMI, AVX2, FMA and
    // F16C are present.
    unsafe {
        scores_bytes(
            q,
            keys,
            bt,
            scales,
            weights.as_mut_ptr(),
            state.as_mut_ptrs(),
            Paired::new(ahead),
        )
    }
    debug_assert_eq!(d, q.dims);
}

/// The scores of int8 queries against dim-major int8 keys, then
/// [`avx512::dim_major_weights`]: per group of 16 keys, four dims at a
/// time, one `vpermb` turns four dim rows of 16 keys into 16 keys of four
/// dims, shifted by 128 (an `xor` of the sign bits) to be unsigned, and one
/// `vpdpbusd` per row sums them against the row's four codes; the row's
/// code sum times 128 undoes the shift.
///
/// # Safety
/// As [`avx512`]'s dim-major kernel, with int8 keys of `q.dims` elements
/// (a multiple of 4); AVX-512 F, BW, VL, VNNI and VBMI, AVX2, FMA and F16C
/// are present.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn scores_bytes(
    q: &Int8Queries,
    keys: &[&[u8]],
    bt: usize,
    scales: *const f32,
    w: *mut f32,
    state: [*mut f32; 3],
    ahead: Paired<'_>,
) {
    // Byte 4t + i of the result is byte 16i + t of the source: dim i of
    // key t.
    let mut idx = [0u8; 64];
    for (b, x) in idx.iter_mut().enumerate() {
        *x = ((b % 4) * 16 + b / 4) as u8;
    }
    // SAFETY: 64 bytes.
    let idx = unsafe { _mm512_loadu_si512(idx.as_ptr().cast()) };
    let signs = _mm512_set1_epi8(-128);
    let (q8, q_scales, d) = (&q.codes, q.scales, q.dims);
    let mut vmax = [_mm512_set1_ps(f32::NEG_INFINITY); 4];
    let mut g = 0;
    // SAFETY: group `gb` of a segment reads codes `c·bt + 16·gb..+16` for
    // `c < d`, inside its `bt·d`; group `g` reads scales `16g..16g + 16`
    // (when not null) and writes weights `64g..64g + 64`, under `n` and
    // `4·n`; as the contract requires.
    unsafe {
        for (s, seg) in keys.iter().enumerate() {
            let pair = ahead.region(s, seg.as_ptr(), seg.len());
            for gb in 0..bt / 16 {
                let kp = seg.as_ptr().add(16 * gb);
                let mut acc = [_mm512_setzero_si512(); 4];
                // `j` steps through the keys' dims and every row's codes.
                #[allow(clippy::needless_range_loop)]
                for j in 0..d / 4 {
                    let at = gb * 16 * d + 64 * j;
                    pair.fetch_lines(at, at + 64);
                    let four = if bt == 16 {
                        _mm512_loadu_si512(kp.add(64 * j).cast())
                    } else {
                        let row = |t: usize| kp.add((4 * j + t) * bt).cast::<__m128i>();
                        let x = _mm512_castsi128_si512(_mm_loadu_si128(row(0)));
                        let x = _mm512_inserti32x4::<1>(x, _mm_loadu_si128(row(1)));
                        let x = _mm512_inserti32x4::<2>(x, _mm_loadu_si128(row(2)));
                        _mm512_inserti32x4::<3>(x, _mm_loadu_si128(row(3)))
                    };
                    let k = _mm512_xor_si512(_mm512_permutexvar_epi8(idx, four), signs);
                    for (r, a) in acc.iter_mut().enumerate() {
                        *a = _mm512_dpbusd_epi32(*a, k, _mm512_set1_epi32(q8[r][j] as i32));
                    }
                }
                // Lanes are keys: each key's scores times its scale.
                let sv = if scales.is_null() {
                    _mm512_set1_ps(1.0)
                } else {
                    _mm512_loadu_ps(scales.add(16 * g))
                };
                let out = w.add(64 * g);
                for r in 0..4 {
                    let shift = _mm512_set1_epi32(128 * q.sums[r]);
                    let exact = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r], shift));
                    let x = _mm512_mul_ps(exact, _mm512_mul_ps(sv, _mm512_set1_ps(q_scales[r])));
                    _mm512_storeu_ps(out.add(16 * r), x);
                    vmax[r] = _mm512_max_ps(vmax[r], x);
                }
                g += 1;
            }
        }
        avx512::dim_major_weights(w, g, vmax, state);
    }
}
