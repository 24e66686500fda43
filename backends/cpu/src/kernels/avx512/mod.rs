//! x86-64 kernels with AVX-512 (F, BW, VL): sixteen f32 lanes per
//! instruction, and masked loads and stores for row tails instead of
//! scalar loops. Every AVX-512 CPU also has AVX2, FMA and F16C, so the
//! byte view of f32 rows, the prefetch schedule and the four-row
//! horizontal sum are [`super::avx2`]'s. The four-row decode kernels
//! follow AVX2's scheme with four keys per score group and 64 columns per
//! weighted-sum pass, and add up every score and weighted sum in the same
//! order as this set's general kernels, so the two paths agree to the bit;
//! the scores of dim-major keys sum each key's products in two chains
//! (even and odd elements) instead, and agree to rounding.
//!
//! CI has no AVX-512 CPU: these kernels are tested under Bochs's AVX-512
//! emulation (`.ci/avx512-emulated.sh`, an Ice Lake), which runs this
//! crate's tests with `KVSLICE_REQUIRE_KERNELS` naming the set built on
//! this one ([`super::vnni`]), which holds all of these kernels but the
//! four-row int8 weighted sum. The one AVX-512 CPU they
//! have been timed on, an AMD Zen 4, ran them slower than the AVX2 set
//! before both paired their prefetches with the segments, and level with
//! it since, except this set's four-row weighted sum and dim-major scores,
//! so there the set run first is AVX2's with those ([`splits_512_bit_ops`]).
//!
//! Here: the table, the scores, weighted sums and four-row kernels; in
//! `softmax` the softmax and `exp`, in `elementwise` widening, dot and
//! `axpy`.

use std::arch::x86_64::*;

use kvslice_core::KvDtype;

use super::avx2::{
    self, Ahead, Paired, PairedPasses, PassAt, PassPrefetch, elem_bytes, f32_bytes, hsum4,
    weight_at,
};
use super::{FourRowKernels, Kernels, SoftmaxState, StoredKernels, shapes};

mod elementwise;
mod softmax;

use elementwise::*;
use softmax::*;

/// Name of this kernel set in reports and in `KVSLICE_REQUIRE_KERNELS`.
pub(super) const NAME: &str = "avx512f+bw+vl";

/// The AVX-512 table, if the CPU has AVX-512 F, BW and VL besides the
/// AVX2 set's features.
pub(super) fn kernels() -> Option<Kernels> {
    let base = avx2::kernels()?;
    let ok = is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl");
    ok.then_some(Kernels {
        name: NAME,
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
        scale_key_major,
        prefetch: base.prefetch,
    })
}

/// Whether this CPU is an AMD Zen 4 (family 19h; its other members have
/// no AVX-512), which runs each 512-bit operation as two 256-bit halves.
/// There this set measured slower than AVX2's: the four-row scores 15.7
/// against 12.0 ns per key, AVX2's decode 1–32% faster in the interleaved
/// rounds, prefill 117 and 147 against 150 and 156 GFLOP/s in two runs
/// (docs/notes/cpu-decode.md, "Zen 4"), as its horizontal sums of 512-bit
/// accumulators cost more than the wider operations save. Since this
/// set pairs its prefetches as AVX2's does, decode runs
/// about level with AVX2's there and prefill no faster (121 against 135
/// GFLOP/s in one run, level in two others). Its four-row weighted sum
/// alone is faster there than AVX2's, so [`super::Kernels::supported`]
/// puts AVX2's set with that sum first ([`super::SPLIT_512_NAME`]).
pub(super) fn splits_512_bit_ops() -> bool {
    // Once per process: `cpuid` traps to the hypervisor in a VM, and
    // every `CpuEngine::new` (once per fuzz input, say) asks.
    static ZEN_4: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ZEN_4.get_or_init(is_zen_4)
}

fn is_zen_4() -> bool {
    let (vendor, version) = (__cpuid(0), __cpuid(1));
    let mut name = [0u8; 12];
    for (part, reg) in name.chunks_mut(4).zip([vendor.ebx, vendor.edx, vendor.ecx]) {
        part.copy_from_slice(&reg.to_le_bytes());
    }
    let amd = name == *b"AuthenticAMD";
    let base = (version.eax >> 8) & 0xf;
    let family = if base == 0xf {
        base + ((version.eax >> 20) & 0xff)
    } else {
        base
    };
    amd && family == 0x19
}

// As in `avx2`: the safe wrappers below are reachable only through the
// table `kernels()` returns, which exists only after the features were
// detected; every `SAFETY` comment here relies on that.

/// Lanes `0..m` of a 16-lane mask (`m ≤ 16`).
pub(super) fn mask(m: usize) -> __mmask16 {
    ((1u32 << m.min(16)) - 1) as __mmask16
}

/// Sixteen elements of encoding `E` at element index `i` of `p`, as f32;
/// lanes outside `m` read nothing and are zero.
///
/// # Safety
/// Element `i` is inside `p`'s allocation (or one past it), and `p` is
/// valid for reads of the elements `i + l` for every lane `l` set in `m`;
/// AVX-512 F, BW and VL are present.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn load16<const E: u8>(p: *const u8, i: usize, m: __mmask16) -> __m512 {
    // SAFETY: the contract above; masked-off lanes are not accessed.
    unsafe {
        match E {
            avx2::F32 => _mm512_maskz_loadu_ps(m, p.cast::<f32>().add(i)),
            avx2::F16 => _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p.add(2 * i).cast())),
            avx2::I8 => _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(
                m,
                p.add(i).cast(),
            ))),
            avx2::F8 => _mm512_cvtph_ps(f8_to_f16_bits(_mm_maskz_loadu_epi8(m, p.add(i).cast()))),
            _ => _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(
                _mm256_maskz_loadu_epi16(m, p.add(2 * i).cast()),
            ))),
        }
    }
}

/// The f16 bits of the sixteen E4M3 codes of `x`
/// ([`super::scalar::f8_raw_bits`] lane by lane).
#[inline]
#[target_feature(enable = "avx2")]
fn f8_to_f16_bits(x: __m128i) -> __m256i {
    // As `avx2::f8_to_f16_bits`, sixteen lanes.
    let w = _mm256_slli_epi16::<7>(_mm256_cvtepi8_epi16(x));
    _mm256_and_si256(w, _mm256_set1_epi16(!0x4000))
}

/// The sum of a 16-lane vector's halves, as eight lanes (for [`hsum4`]).
#[target_feature(enable = "avx512f")]
fn fold(a: __m512) -> __m256 {
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(a)));
    _mm256_add_ps(_mm512_castps512_ps256(a), hi)
}

fn scores(q: &[f32], rows: usize, k: &[f32], n: usize, out: &mut [f32], ahead: &[u8]) {
    scores_stored(KvDtype::F32, q, rows, f32_bytes(k), n, out, ahead);
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
    let mut ahead = Ahead::new(ahead, n.div_ceil(2));
    let (q, k, out) = (q.as_ptr(), k.as_ptr(), out.as_mut_ptr());
    let mut r = 0;
    while r < rows {
        let g = (rows - r).min(4);
        // SAFETY: the shape check above bounds every access of rows `r..r + g`
        // (`k` holds `n·d` elements of `dtype`); AVX-512 F, BW and VL, AVX2,
        // FMA and F16C are present.
        unsafe {
            let (q, out) = (q.add(r * d), out.add(r * n));
            match g {
                1 => scores_any::<1>(dtype, q, k, n, d, out, &mut ahead),
                2 => scores_any::<2>(dtype, q, k, n, d, out, &mut ahead),
                3 => scores_any::<3>(dtype, q, k, n, d, out, &mut ahead),
                _ => scores_any::<4>(dtype, q, k, n, d, out, &mut ahead),
            }
        }
        r += g;
    }
}

/// [`scores_group`] for a run-time encoding.
///
/// # Safety
/// As [`scores_group`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn scores_any<const G: usize>(
    dtype: KvDtype,
    q: *const f32,
    k: *const u8,
    n: usize,
    d: usize,
    out: *mut f32,
    ahead: &mut Ahead<'_>,
) {
    // SAFETY: the caller's contract is `scores_group`'s.
    unsafe {
        match dtype {
            KvDtype::F32 => scores_group::<G, { avx2::F32 }>(q, k, n, d, out, ahead),
            KvDtype::F16 => scores_group::<G, { avx2::F16 }>(q, k, n, d, out, ahead),
            KvDtype::Bf16 => scores_group::<G, { avx2::BF16 }>(q, k, n, d, out, ahead),
            KvDtype::I8 => scores_group::<G, { avx2::I8 }>(q, k, n, d, out, ahead),
            KvDtype::F8E4M3 => scores_group::<G, { avx2::F8 }>(q, k, n, d, out, ahead),
        }
    }
}

/// Scores of `G` query rows (`G ≤ 4`, a constant so that the accumulators
/// stay in registers) against `n` keys, two keys at a time; the last
/// sixteen-column step of a row is masked.
///
/// # Safety
/// `q` is valid for `G·d` reads, `k` for `n·d` elements of encoding `E`,
/// `out` for writes at `i·n + j` (`i < G`, `j < n`); AVX-512 F, BW and VL,
/// AVX2, FMA and F16C are present.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn scores_group<const G: usize, const E: u8>(
    q: *const f32,
    k: *const u8,
    n: usize,
    d: usize,
    out: *mut f32,
    ahead: &mut Ahead<'_>,
) {
    // SAFETY: keys `j..j + K` stay under `n` by the loop bounds, so every
    // read is within `n·d` (keys) or `G·d` (queries), and every write below
    // `(G - 1)·n + n`, as the contract requires.
    unsafe {
        let mut j = 0;
        while j < n {
            ahead.step();
            let h: &[__m128] = if j + 1 < n {
                &row_sums::<G, E, 2>(q, k, d, j)
            } else {
                &row_sums::<G, E, 1>(q, k, d, j)
            };
            for (x, v) in h.iter().enumerate() {
                let mut s = [0f32; 4];
                _mm_storeu_ps(s.as_mut_ptr(), *v);
                for (i, &score) in s.iter().take(G).enumerate() {
                    *out.add(i * n + j + x) = score;
                }
            }
            j += h.len();
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
    // The values as one segment of exactly `n` rows; a step every sixteen
    // keys of each 64-column pass.
    let v = [&v[..n * d * dtype.size_bytes()]];
    let mut ahead = Ahead::new(ahead, n.div_ceil(16) * d.div_ceil(64));
    let (p, v, acc) = (p.as_ptr(), &v[..], acc.as_mut_ptr());
    let mut r = 0;
    while r < rows {
        let g = (rows - r).min(4);
        // SAFETY: the shape check above bounds every access of rows `r..r + g`
        // (`v` is `n` rows of `d` elements of `dtype`); AVX-512 F, BW and
        // VL, AVX2, FMA and F16C are present.
        unsafe {
            let (p, acc) = (p.add(r * n), acc.add(r * d));
            match g {
                1 => weighted_sum_any::<1>(dtype, p, v, n, d, acc, &mut ahead),
                2 => weighted_sum_any::<2>(dtype, p, v, n, d, acc, &mut ahead),
                3 => weighted_sum_any::<3>(dtype, p, v, n, d, acc, &mut ahead),
                _ => weighted_sum_any::<4>(dtype, p, v, n, d, acc, &mut ahead),
            }
        }
        r += g;
    }
}

/// [`weighted_sum_group`] for a run-time encoding.
///
/// # Safety
/// As [`weighted_sum_group`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn weighted_sum_any<const G: usize>(
    dtype: KvDtype,
    p: *const f32,
    v: &[&[u8]],
    n: usize,
    d: usize,
    acc: *mut f32,
    ahead: &mut Ahead<'_>,
) {
    // SAFETY: the caller's contract is `weighted_sum_group`'s.
    unsafe {
        match dtype {
            KvDtype::F32 => weighted_sum_group::<G, { avx2::F32 }, false>(p, v, n, d, acc, ahead),
            KvDtype::F16 => weighted_sum_group::<G, { avx2::F16 }, false>(p, v, n, d, acc, ahead),
            KvDtype::Bf16 => weighted_sum_group::<G, { avx2::BF16 }, false>(p, v, n, d, acc, ahead),
            KvDtype::I8 => weighted_sum_group::<G, { avx2::I8 }, false>(p, v, n, d, acc, ahead),
            KvDtype::F8E4M3 => weighted_sum_group::<G, { avx2::F8 }, false>(p, v, n, d, acc, ahead),
        }
    }
}

/// `acc[i] += Σ_j w(i, j) · v[j]` for `G` rows (`G ≤ 4`, a constant so
/// that the accumulators stay in registers) in passes of 64 columns (`G`
/// rows × four vectors of accumulators stay in registers across every
/// segment), the last pass as wide as the columns left, its last vector
/// masked; `v[j]` are the rows of the segments of `v` in order, the
/// weights row-major or, with `KEY_MAJOR`, key-major ([`weight_at`]).
///
/// # Safety
/// `p` is valid for `G·n` reads, the segments of `v` hold `n` whole rows of
/// `d` elements of encoding `E` in all, `acc` is valid for `G·d` reads and
/// writes; AVX-512 F, BW and VL, AVX2, FMA and F16C are present.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn weighted_sum_group<const G: usize, const E: u8, const KEY_MAJOR: bool>(
    p: *const f32,
    v: &[&[u8]],
    n: usize,
    d: usize,
    acc: *mut f32,
    ahead: &mut impl PassPrefetch,
) {
    let mut c = 0;
    while c < d {
        // SAFETY: the pass's vectors start under `d` (`W` is the number of
        // sixteen-column vectors left, at most four), the contract's.
        unsafe {
            match (d - c).div_ceil(16) {
                1 => weighted_sum_columns::<G, E, 1, KEY_MAJOR>(p, v, n, d, acc, c, &mut *ahead),
                2 => weighted_sum_columns::<G, E, 2, KEY_MAJOR>(p, v, n, d, acc, c, &mut *ahead),
                3 => weighted_sum_columns::<G, E, 3, KEY_MAJOR>(p, v, n, d, acc, c, &mut *ahead),
                _ => weighted_sum_columns::<G, E, 4, KEY_MAJOR>(p, v, n, d, acc, c, &mut *ahead),
            }
        }
        c += 64;
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
    // rows); AVX-512 F, BW and VL, AVX2, FMA and F16C are present.
    unsafe {
        let k = match dtype {
            KvDtype::F32 => four_row_scores_softmax_avx512::<{ avx2::F32 }>,
            KvDtype::F16 => four_row_scores_softmax_avx512::<{ avx2::F16 }>,
            KvDtype::Bf16 => four_row_scores_softmax_avx512::<{ avx2::BF16 }>,
            KvDtype::I8 => four_row_scores_softmax_avx512::<{ avx2::I8 }>,
            KvDtype::F8E4M3 => four_row_scores_softmax_avx512::<{ avx2::F8 }>,
        };
        k(q, keys, d, scales, w, state, ahead)
    }
}

pub(super) fn four_row_scores_softmax_dim_major(
    dtype: KvDtype,
    q: &[f32],
    keys: &[&[u8]],
    scales: &[f32],
    weights: &mut [f32],
    state: SoftmaxState<'_>,
    ahead: &[&[u8]],
) {
    let kernels: [avx2::DimMajorKernel; 5] = [
        dim_major_avx512::<{ avx2::F32 }>,
        dim_major_avx512::<{ avx2::F16 }>,
        dim_major_avx512::<{ avx2::BF16 }>,
        dim_major_avx512::<{ avx2::I8 }>,
        dim_major_avx512::<{ avx2::F8 }>,
    ];
    // SAFETY: these are this set's kernels, whose table exists only after
    // AVX-512 F, BW and VL, AVX2, FMA and F16C were detected.
    unsafe { avx2::dim_major_call(kernels, dtype, q, keys, scales, weights, state, ahead) }
}

/// [`FourRowKernels::scores_softmax_dim_major`]: AVX2's scheme (and its
/// softmax, sixteen keys at a time: [`dim_major_weights`]) with a group's 16 keys in
/// one register per row, two elements per step into eight accumulators
/// (four chains per element hide the FMA latency). On a Zen 4, where
/// 512-bit operations take two passes, the four-row bench (64
/// cache-resident f16 keys of 128 elements, one thread) ran its scores
/// and softmax at 11.8 ns per key, AVX2's dim-major kernel at 12.1 and
/// AVX2's token-major one at 13.6 (FMA floor 8.8; docs/notes/cpu-decode.md).
///
/// # Safety
/// `q` is valid for `4·d` reads, each segment of `keys` is one block of
/// `bt` keys (`bt % 16 == 0`) of `d` elements of encoding `E` stored
/// `[d][bt]`, `scales` is null or valid for `n` reads, `w` is valid for
/// `4·n` writes (`n` the keys in all), and the three pointers of `state`
/// (max, sum, rescale) for 4 reads and writes each; AVX-512 F, BW and VL, AVX2, FMA and F16C are present.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn dim_major_avx512<const E: u8>(
    q: *const f32,
    keys: &[&[u8]],
    d: usize,
    bt: usize,
    scales: *const f32,
    w: *mut f32,
    state: [*mut f32; 3],
    ahead: Paired<'_>,
) {
    let es = avx2::elem_bytes::<E>();
    // A step's two elements of 16 keys are 64 bytes (f16) or 128 (f32) of
    // the block; the same offsets of the paired region are fetched.
    let group_bytes = 16 * es * d;
    let all = mask(16);
    let mut vmax = [_mm512_set1_ps(f32::NEG_INFINITY); 4];
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
                let mut acc = [_mm512_setzero_ps(); 8];
                let mut c = 0;
                while c + 2 <= d {
                    let at = gb * group_bytes + c * 16 * es;
                    pair.fetch_lines(at, at + 32 * es);
                    let k0 = load16::<E>(kp, c * bt, all);
                    let k1 = load16::<E>(kp, (c + 1) * bt, all);
                    for r in 0..4 {
                        let q0 = _mm512_set1_ps(*q.add(r * d + c));
                        let q1 = _mm512_set1_ps(*q.add(r * d + c + 1));
                        acc[r] = _mm512_fmadd_ps(q0, k0, acc[r]);
                        acc[4 + r] = _mm512_fmadd_ps(q1, k1, acc[4 + r]);
                    }
                    c += 2;
                }
                if c < d {
                    pair.fetch(gb * group_bytes + c * 16 * es);
                    let k0 = load16::<E>(kp, c * bt, all);
                    for (r, a) in acc.iter_mut().take(4).enumerate() {
                        *a = _mm512_fmadd_ps(_mm512_set1_ps(*q.add(r * d + c)), k0, *a);
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
                    let x = _mm512_mul_ps(_mm512_add_ps(acc[r], acc[4 + r]), sv);
                    _mm512_storeu_ps(out.add(16 * r), x);
                    vmax[r] = _mm512_max_ps(vmax[r], x);
                }
                g += 1;
            }
        }
        dim_major_weights(w, g, vmax, state);
    }
}

/// Dot products of `G` query rows (`G ≤ 4`) with keys `j..j + K`
/// (`K ≤ 4`): lane `i` of the `x`th result is row `i`'s against key
/// `j + x` (lanes from `G` on are 0). Both score paths sum this way, so
/// they agree to the bit. Four rows and four keys are sixteen
/// accumulators, four key and four query loads per sixteen FMAs: half of
/// the 32 registers.
///
/// # Safety
/// `q` is valid for `G·d` reads, `k` for `(j + K)·d` elements of encoding
/// `E`; AVX-512 F, BW and VL, AVX2, FMA and F16C are present.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn row_sums<const G: usize, const E: u8, const K: usize>(
    q: *const f32,
    k: *const u8,
    d: usize,
    j: usize,
) -> [__m128; K] {
    // SAFETY: the masks keep every lane read under `(j + K)·d` (keys) or
    // `G·d` (queries), by the contract.
    unsafe {
        let mut a = [[_mm512_setzero_ps(); 4]; K];
        let mut c = 0;
        while c < d {
            let m = mask(d - c);
            let mut x = [_mm512_setzero_ps(); K];
            for (t, key) in x.iter_mut().enumerate() {
                *key = load16::<E>(k, (j + t) * d + c, m);
            }
            for i in 0..G {
                let qv = _mm512_maskz_loadu_ps(m, q.add(i * d + c));
                for (acc, key) in a.iter_mut().zip(x) {
                    acc[i] = _mm512_fmadd_ps(qv, key, acc[i]);
                }
            }
            c += 16;
        }
        // Plain loops: a closure here (`a.map(..)`) would carry this
        // function's target features into `array::map`, which lacks them,
        // so it could not be inlined and each call would pass its vectors
        // through memory (scores 5x slower on Zen 4 than with these loops).
        let mut sums = [_mm_setzero_ps(); K];
        for (sum, acc) in sums.iter_mut().zip(a) {
            *sum = hsum4([fold(acc[0]), fold(acc[1]), fold(acc[2]), fold(acc[3])]);
        }
        sums
    }
}

/// [`FourRowKernels::scores_softmax`]: AVX2's key-major scheme
/// (`avx2::four_row_scores_softmax_avx2`) with four keys per group, so
/// that a group's scores fill one sixteen-lane vector for the maxima and
/// `exp`, the last one masked.
///
/// # Safety
/// `q` is valid for `4·d` reads, the segments of `keys` hold whole keys of
/// `d` elements of encoding `E`, `n` in all, `scales` is null or valid
/// for `n` reads, `w` is valid for `4·n` writes, and the three pointers of
/// `state` (max, sum, rescale) for 4 reads and writes each; AVX-512 F, BW
/// and VL, AVX2, FMA and F16C are present.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn four_row_scores_softmax_avx512<const E: u8>(
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
    // the null or `n` scales; the masks keep the softmax's accesses under
    // `4·n`; the state is four lanes; as the contract requires.
    unsafe {
        let mut n = 0;
        let row = d * elem_bytes::<E>();
        for (s, (k, m)) in shapes::segment_rows(keys, row).enumerate() {
            let w = w.add(4 * n);
            let pair = ahead.region(s, k, m * row);
            let mut j = 0;
            while j < m {
                let group = (m - j).min(4);
                pair.fetch_lines(j * row, (j + group) * row);
                let h: &[__m128] = match group {
                    1 => &row_sums::<4, E, 1>(q, k, d, j),
                    2 => &row_sums::<4, E, 2>(q, k, d, j),
                    3 => &row_sums::<4, E, 3>(q, k, d, j),
                    _ => &row_sums::<4, E, 4>(q, k, d, j),
                };
                for (x, v) in h.iter().enumerate() {
                    _mm_storeu_ps(w.add(4 * (j + x)), *v);
                }
                j += group;
            }
            n += m;
        }
        avx2::scale_key_major(w, scales, n);
        // Lane `l` of a sixteen-lane step is row `l % 4`; masked-off lanes
        // keep the running max.
        let total = 4 * n;
        let old = _mm_loadu_ps(max);
        let vm = max_lanes(w, total, _mm512_broadcast_f32x4(old));
        let new = quarters::<MAX>(vm);
        _mm_storeu_ps(max, new);
        // The old max's weight under the new one, exactly 1 where it held
        // (as `softmax_rows_avx512` has it).
        let e = _mm512_castps512_ps128(exp16(_mm512_zextps128_ps512(_mm_sub_ps(old, new))));
        let factor =
            _mm_mask_blend_ps(_mm_cmp_ps_mask::<_CMP_GT_OQ>(new, old), _mm_set1_ps(1.0), e);
        _mm_storeu_ps(rescale, factor);
        let vs = exp_shifted(w, total, _mm512_broadcast_f32x4(new));
        let total = quarters::<ADD>(vs);
        _mm_storeu_ps(sum, _mm_fmadd_ps(_mm_loadu_ps(sum), factor, total));
    }
}

/// [`Kernels::scale_key_major`](super::Kernels::scale_key_major): four
/// keys' weights per vector, their scales spread four lanes each.
fn scale_key_major(w: &mut [f32], scales: &[f32]) {
    let n = scales.len().min(w.len() / 4);
    // SAFETY: `w` holds `4·n` weights and `scales` `n`; AVX-512 F is
    // present.
    unsafe { scale_key_major_avx512(w.as_mut_ptr(), scales.as_ptr(), n) }
}

/// # Safety
/// `w` is valid for `4·n` reads and writes, `scales` for `n` reads;
/// AVX-512 F is present.
#[target_feature(enable = "avx512f")]
unsafe fn scale_key_major_avx512(w: *mut f32, scales: *const f32, n: usize) {
    let spread = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    let mut j = 0;
    while j < n {
        let m = (n - j).min(4);
        // SAFETY: the masks keep keys `j..j + m` under `n`, weights under
        // `4·n`.
        unsafe {
            let s = _mm512_maskz_loadu_ps(mask(m), scales.add(j));
            let at = w.add(4 * j);
            let x = _mm512_maskz_loadu_ps(mask(4 * m), at);
            let y = _mm512_mul_ps(x, _mm512_permutexvar_ps(spread, s));
            _mm512_mask_storeu_ps(at, mask(4 * m), y);
        }
        j += 4;
    }
}

/// [`avx2::dim_major_weights`] sixteen keys at a time, the rows' maxima
/// the lanes of `vmax` (one vector per row): the same `exp` per weight (to
/// the bit) and the same key-major order, the rows' sums added in another
/// order.
///
/// # Safety
/// As [`avx2::dim_major_weights`]; AVX-512 F and VL, AVX2 and FMA are
/// present.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
pub(super) unsafe fn dim_major_weights(
    w: *mut f32,
    groups: usize,
    vmax: [__m512; 4],
    [max, sum, rescale]: [*mut f32; 3],
) {
    // SAFETY: the contract above.
    unsafe {
        let block_max = _mm_setr_ps(
            _mm512_reduce_max_ps(vmax[0]),
            _mm512_reduce_max_ps(vmax[1]),
            _mm512_reduce_max_ps(vmax[2]),
            _mm512_reduce_max_ps(vmax[3]),
        );
        let (new, factor) = avx2::grow_max(block_max, max, rescale);
        let m = [
            _mm512_broadcastss_ps(new),
            _mm512_broadcastss_ps(_mm_permute_ps::<0x55>(new)),
            _mm512_broadcastss_ps(_mm_permute_ps::<0xAA>(new)),
            _mm512_broadcastss_ps(_mm_permute_ps::<0xFF>(new)),
        ];
        let mut sums = [_mm512_setzero_ps(); 4];
        for g in 0..groups {
            let at = w.add(64 * g);
            let mut x = [_mm512_setzero_ps(); 4];
            for (r, x) in x.iter_mut().enumerate() {
                *x = exp16(_mm512_sub_ps(_mm512_loadu_ps(at.add(16 * r)), m[r]));
                sums[r] = _mm512_add_ps(sums[r], *x);
            }
            // Four rows × sixteen keys to sixteen keys × four rows: within
            // each 128-bit lane `l`, `k[i]` gets key `4l + i`'s four rows;
            // a transpose of the lanes puts keys `4l..4l + 4` in vector `l`.
            let t0 = _mm512_unpacklo_ps(x[0], x[1]);
            let t1 = _mm512_unpacklo_ps(x[2], x[3]);
            let t2 = _mm512_unpackhi_ps(x[0], x[1]);
            let t3 = _mm512_unpackhi_ps(x[2], x[3]);
            let k = [
                _mm512_shuffle_ps::<0x44>(t0, t1),
                _mm512_shuffle_ps::<0xEE>(t0, t1),
                _mm512_shuffle_ps::<0x44>(t2, t3),
                _mm512_shuffle_ps::<0xEE>(t2, t3),
            ];
            for (l, keys) in transpose_quarters(k).into_iter().enumerate() {
                _mm512_storeu_ps(at.add(16 * l), keys);
            }
        }
        let total = _mm_setr_ps(
            _mm512_reduce_add_ps(sums[0]),
            _mm512_reduce_add_ps(sums[1]),
            _mm512_reduce_add_ps(sums[2]),
            _mm512_reduce_add_ps(sums[3]),
        );
        _mm_storeu_ps(sum, _mm_fmadd_ps(_mm_loadu_ps(sum), factor, total));
    }
}

/// The 4 × 4 transpose of four vectors' 128-bit quarters: quarter `l` of
/// result `c` is quarter `c` of `x[l]`.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn transpose_quarters(x: [__m512; 4]) -> [__m512; 4] {
    let t0 = _mm512_shuffle_f32x4::<0x44>(x[0], x[1]);
    let t1 = _mm512_shuffle_f32x4::<0x44>(x[2], x[3]);
    let t2 = _mm512_shuffle_f32x4::<0xEE>(x[0], x[1]);
    let t3 = _mm512_shuffle_f32x4::<0xEE>(x[2], x[3]);
    [
        _mm512_shuffle_f32x4::<0x88>(t0, t1),
        _mm512_shuffle_f32x4::<0xDD>(t0, t1),
        _mm512_shuffle_f32x4::<0x88>(t2, t3),
        _mm512_shuffle_f32x4::<0xDD>(t2, t3),
    ]
}

/// [`quarters`]' lane-wise operations.
pub(super) const MAX: u8 = 0;
const ADD: u8 = 1;

/// The four 128-bit quarters of `v` combined lane-wise by `OP` ([`MAX`] or
/// [`ADD`]; lane `i` of the result covers lanes `i`, `i + 4`, `i + 8` and
/// `i + 12`). A constant rather than a closure, which could not be inlined
/// here (see [`row_sums`]).
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn quarters<const OP: u8>(v: __m512) -> __m128 {
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn op<const OP: u8>(a: __m128, b: __m128) -> __m128 {
        if OP == MAX {
            _mm_max_ps(a, b)
        } else {
            _mm_add_ps(a, b)
        }
    }
    let lo = op::<OP>(_mm512_castps512_ps128(v), _mm512_extractf32x4_ps::<1>(v));
    let hi = op::<OP>(
        _mm512_extractf32x4_ps::<2>(v),
        _mm512_extractf32x4_ps::<3>(v),
    );
    op::<OP>(lo, hi)
}

pub(super) fn four_row_weighted_sum(
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
    // `dtype`, `acc` `4·d`); AVX-512 F, BW and VL, AVX2, FMA and F16C are
    // present.
    unsafe {
        match dtype {
            KvDtype::F32 => {
                weighted_sum_group::<4, { avx2::F32 }, true>(p, values, n, d, acc, &mut ahead)
            }
            KvDtype::F16 => {
                weighted_sum_group::<4, { avx2::F16 }, true>(p, values, n, d, acc, &mut ahead)
            }
            KvDtype::Bf16 => {
                weighted_sum_group::<4, { avx2::BF16 }, true>(p, values, n, d, acc, &mut ahead)
            }
            KvDtype::I8 => {
                weighted_sum_group::<4, { avx2::I8 }, true>(p, values, n, d, acc, &mut ahead)
            }
            KvDtype::F8E4M3 => {
                weighted_sum_group::<4, { avx2::F8 }, true>(p, values, n, d, acc, &mut ahead)
            }
        }
    }
}

/// `acc[i] += Σ_j w(i, j) · v[j]` for `G` rows over the `W`
/// sixteen-column vectors from column `c`, each masked to `d`, the weights
/// row-major or, with `KEY_MAJOR`, key-major ([`weight_at`]), telling
/// `ahead` where it is ([`PassPrefetch`]: the general sum's [`Ahead`]
/// steps every sixteen keys, the four-row sum's [`PairedPasses`] fetch
/// their lines key by key). Both weighted sums run it (through
/// [`weighted_sum_group`]), so they add the same products in the same
/// order.
///
/// # Safety
/// `p` is valid for `G·n` reads, the segments of `v` hold `n` whole rows of
/// `d` elements of encoding `E` in all, `acc` is valid for `G·d` reads and
/// writes, `c + 16·(W − 1) < d`; AVX-512 F, BW and VL, AVX2, FMA and F16C
/// are present.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
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
    // SAFETY: the masks keep every lane access under column `d` of a row
    // of the segments or of `acc`; `vp` stays within its segment's rows
    // and `wp` at key `j` (counting every segment's rows, `n` in all)
    // reads the weights `weight_at(n, i, j)` within `G·n`, by the contract.
    unsafe {
        let mut m = [0 as __mmask16; W];
        for (x, m) in m.iter_mut().enumerate() {
            *m = mask(d - c - 16 * x);
        }
        let mut a = [[_mm512_setzero_ps(); W]; G];
        for (i, row) in a.iter_mut().enumerate() {
            for (x, sum) in row.iter_mut().enumerate() {
                *sum = _mm512_maskz_loadu_ps(m[x], acc.add(i * d + c + 16 * x));
            }
        }
        let row_bytes = d * elem_bytes::<E>();
        let key_step = if KEY_MAJOR { G } else { 1 };
        let mut wp = p;
        let passes = d.div_ceil(64);
        for (s, (mut vp, mut left)) in shapes::segment_rows(v, row_bytes).enumerate() {
            ahead.segment(PassAt {
                s,
                seg: vp,
                m: left,
                row: row_bytes,
                pass: c / 64,
                passes,
            });
            while left > 0 {
                ahead.sixteen();
                let keys = left.min(16);
                for _ in 0..keys {
                    ahead.key();
                    // A loop, not `array::from_fn` (see `row_sums`).
                    let mut vals = [_mm512_setzero_ps(); W];
                    for (x, val) in vals.iter_mut().enumerate() {
                        *val = load16::<E>(vp, c + 16 * x, m[x]);
                    }
                    for (i, row) in a.iter_mut().enumerate() {
                        let wv = _mm512_set1_ps(*wp.add(weight_at::<G, KEY_MAJOR>(n, i, 0)));
                        for (sum, val) in row.iter_mut().zip(vals) {
                            *sum = _mm512_fmadd_ps(wv, val, *sum);
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
            for (x, sum) in row.iter().enumerate() {
                _mm512_mask_storeu_ps(acc.add(i * d + c + 16 * x), m[x], *sum);
            }
        }
    }
}
