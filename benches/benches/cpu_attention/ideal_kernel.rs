//! A stand-in for a decode kernel that does nothing but the arithmetic
//! no f16 kernel can avoid: it reads the bytes the read loop reads, a
//! 4 KiB region (one kv head's K or V in one page) at a time, converts
//! each 64-byte line's 32 f16 elements to f32 (4 `vcvtph2ps`) and spends
//! on it decode's FMAs at four query heads per kv head (4 rows × 4
//! vectors = 16), with no sums, softmax, query loads or stores. With
//! `PREFETCH` it prefetches as the kernels do (`Ahead`: T1, in even bursts
//! over the current region, four regions or 16 KiB ahead, as decode's next
//! head's span is); without, only the hardware prefetchers feed it, which
//! they do well here because the regions come in address order (decode's
//! come from pages 64 KiB apart).
//! Against the read loop in the same rounds, it says how much of decode's
//! gap a faster kernel could close and how much is the way bytes arrive.
//! [`in_engine`](ideal_kernel::in_engine) puts the same arithmetic inside
//! decode's engine, as its four-row kernels, so that decode's order and
//! prefetches are measured with it.

use std::arch::x86_64::*;

use kvslice_benches::decode_workload::{BLOCK, HEAD_DIM};
use kvslice_core::KvDtype;
use kvslice_cpu::{FourRowKernels, Kernels, SoftmaxState, StoredKernels};

/// One kv head's K (or V) in one page: 16 tokens × 128 f16.
const REGION: usize = BLOCK as usize * HEAD_DIM as usize * 2;
/// Regions between the one consumed and the one prefetched: decode
/// prefetches the next head's span, four regions (docs/notes/cpu-decode.md
/// has two and eight).
const AHEAD: usize = 4;
/// Prefetch bursts per region, spread over its lines.
const BURSTS: usize = 16;

/// The arithmetic no f16 decode kernel avoids, a 64-byte line at a
/// time: its 32 elements converted (4 `vcvtph2ps`) and given the 16
/// FMAs of four query rows, into eight accumulators.
struct LineFmas {
    acc: [__m256; 8],
}

impl LineFmas {
    #[target_feature(enable = "avx2,fma,f16c")]
    fn new() -> Self {
        Self {
            acc: [_mm256_setzero_ps(); 8],
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn line(&mut self, line: &[u8; 64]) {
        // Loops, not closures: a closure would not inherit this
        // function's target features (the AVX2 set's kernels).
        let q = [
            _mm256_set1_ps(0.5),
            _mm256_set1_ps(0.25),
            _mm256_set1_ps(0.125),
            _mm256_set1_ps(0.0625),
        ];
        let mut x = [_mm256_setzero_ps(); 4];
        for (v, x) in x.iter_mut().enumerate() {
            // SAFETY: `line` holds 64 bytes, four 16-byte loads' worth;
            // SSE2 is part of x86-64.
            let h = unsafe { _mm_loadu_si128(line.as_ptr().add(16 * v).cast()) };
            *x = _mm256_cvtph_ps(h);
        }
        for (v, x) in x.into_iter().enumerate() {
            for (i, q) in q.into_iter().enumerate() {
                let a = &mut self.acc[(4 * v + i) % 8];
                *a = _mm256_fmadd_ps(q, x, *a);
            }
        }
    }

    /// The accumulators' sum, so that the work cannot be dropped.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn total(&self) -> f32 {
        let s = self
            .acc
            .iter()
            .fold(_mm256_setzero_ps(), |s, x| _mm256_add_ps(s, *x));
        _mm256_cvtss_f32(s)
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn consume<const PREFETCH: bool>(part: &[u8]) -> f32 {
    let mut fmas = LineFmas::new();
    let regions: Vec<&[u8]> = part.chunks(REGION).collect();
    for (r, region) in regions.iter().enumerate() {
        let ahead = regions.get(r + AHEAD).copied().unwrap_or(&[]);
        let burst = REGION / BURSTS;
        for (b, piece) in region.chunks(burst).enumerate() {
            if PREFETCH {
                for line in ahead.chunks(burst).nth(b).unwrap_or(&[]).chunks(64) {
                    _mm_prefetch::<_MM_HINT_T1>(line.as_ptr().cast());
                }
            }
            for line in piece.as_chunks::<64>().0 {
                fmas.line(line);
            }
        }
    }
    fmas.total()
}

/// Lines of `segments` in order, each converted and given the same
/// arithmetic as in [`consume`], while the same line of the segment's
/// paired region in `ahead` is prefetched (T1; the segment itself where
/// it has none), as decode's four-row kernels pair theirs.
#[target_feature(enable = "avx2,fma,f16c")]
fn paired_lines(segments: &[&[u8]], ahead: &[&[u8]]) -> f32 {
    let mut fmas = LineFmas::new();
    for (s, segment) in segments.iter().enumerate() {
        let pair = match ahead.get(s) {
            Some(r) if !r.is_empty() => *r,
            _ => *segment,
        };
        for (o, line) in segment.as_chunks::<64>().0.iter().enumerate() {
            let at = (64 * o).min(pair.len() - 1);
            _mm_prefetch::<_MM_HINT_T1>(pair[at..].as_ptr().cast());
            fmas.line(line);
        }
    }
    fmas.total()
}

/// Keys of 128 f16 elements in `segments`.
fn keys(segments: &[&[u8]]) -> usize {
    segments.iter().map(|s| s.len()).sum::<usize>() / (2 * HEAD_DIM as usize)
}

/// [`FourRowKernels::scores_softmax`] with only [`paired_lines`]'
/// arithmetic: every weight the same small value and a state that
/// stays finite, so that the engine's merges run as in decode.
fn scores_softmax(
    _: KvDtype,
    _: &[f32],
    keys: &[&[u8]],
    _: &[f32],
    weights: &mut [f32],
    state: SoftmaxState<'_>,
    ahead: &[&[u8]],
) {
    // SAFETY: only reachable through `in_engine`'s table, built after
    // `supported` detected AVX2, FMA and F16C.
    let s = unsafe { paired_lines(keys, ahead) };
    let n = self::keys(keys);
    weights[..4 * n].fill(1e-3 + s * 1e-30);
    state.max.fill(0.0);
    state.rescale.fill(1.0);
    for sum in state.sum.iter_mut() {
        *sum += n as f32 * 1e-3;
    }
}

/// [`FourRowKernels::weighted_sum`] with only [`paired_lines`]'
/// arithmetic, its result folded into one accumulator.
fn weighted_sum(_: KvDtype, weights: &[f32], values: &[&[u8]], acc: &mut [f32], ahead: &[&[u8]]) {
    // SAFETY: as in `scores_softmax`.
    let s = unsafe { paired_lines(values, ahead) };
    acc[0] += s * weights[0] * 1e-30;
}

/// `set` with its four-row decode kernels replaced by ones that do
/// only the ideal kernel's arithmetic over the same segments, with the
/// same paired prefetches: decode's engine around an ideal kernel. For
/// the bench's pages only (f16, head_dim 128): the weights and state
/// they leave are finite but not attention's.
///
/// # Panics
/// Where [`supported`] is false, or `set` has no four-row kernels.
pub fn in_engine(mut set: Kernels) -> Kernels {
    assert!(supported(), "the ideal kernel needs AVX2, FMA and F16C");
    let stored = set.stored.expect("a set with stored kernels");
    assert!(stored.four_rows.is_some(), "a set with four-row kernels");
    set.stored = Some(StoredKernels {
        four_rows: Some(FourRowKernels {
            scores_softmax,
            // Both take a span's bytes segment by segment, whatever
            // they hold.
            scores_softmax_dim_major: scores_softmax,
            weighted_sum,
            // The bench's pages are f16: no int8 queries, no fp8.
            int8_queries: None,
            fp8_bf16: None,
        }),
        ..stored
    });
    set
}

/// Whether this CPU runs [`run`] (AVX2, FMA and F16C).
pub fn supported() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// Consumes `bytes` on `threads` threads, shared as the read loop
/// shares them ([`in_parts`]).
///
/// # Panics
/// Where [`supported`] is false.
///
/// [`in_parts`]: super::in_parts
pub fn run<const PREFETCH: bool>(bytes: &[u8], threads: usize) {
    assert!(supported(), "the ideal kernel needs AVX2, FMA and F16C");
    super::in_parts(bytes, threads, |part| {
        // SAFETY: `supported` (asserted above) detected AVX2, FMA and
        // F16C.
        std::hint::black_box(unsafe { consume::<PREFETCH>(part) });
    });
}
