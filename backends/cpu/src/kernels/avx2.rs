//! x86-64 kernels with AVX2, FMA and F16C: eight f32 lanes per instruction.
//! Like every kernel file, it holds its instruction set's `unsafe`; its
//! byte view, prefetch schedule and four-row sum also serve `avx512.rs`.

use std::arch::x86_64::*;
use std::marker::PhantomData;

use kvslice_core::KvDtype;

use super::exp_consts::*;
use super::{FourRowKernels, Kernels, SoftmaxState, StoredKernels, scalar, shapes};

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

/// Every line of `bytes` at once: the [`Ahead`] walk in one burst, so it
/// covers the same lines (the first byte's line onward).
fn prefetch(bytes: &[u8]) {
    Ahead::new(bytes, 1).step();
}

/// Prefetches the line holding `at` (callers pass addresses inside a
/// slice they hold).
fn prefetch_at(at: *const u8) {
    #[cfg(test)]
    tests::FETCHED.with(|lines| lines.borrow_mut().push(at as usize / 64));
    // SAFETY: a prefetch is a hint with no architectural effect; it never
    // faults, whatever the address. SSE is part of x86-64.
    unsafe { _mm_prefetch::<_MM_HINT_T1>(at.cast()) };
}

/// The cache lines of `ahead`, prefetched in bursts of equal size spread
/// over a kernel's loop: ⌈lines / `steps`⌉ per call to [`Ahead::step`], so
/// all of them within `steps` calls, and the next page arrives while this
/// one is computed without filling every line-fill buffer at once. A step
/// costs a few compares when nothing is left: kernels call it every
/// iteration, so it walks addresses instead of slice iterators.
pub(super) struct Ahead<'a> {
    next: *const u8,
    end: *const u8,
    /// Bytes per burst, whole lines.
    burst: usize,
    /// The walked region stays borrowed while the walk lives.
    region: PhantomData<&'a [u8]>,
}

impl<'a> Ahead<'a> {
    pub(super) fn new(ahead: &'a [u8], steps: usize) -> Self {
        let (next, end) = line_walk(ahead);
        Self {
            next,
            end,
            // Spread over every step, the last included: bursts rounded
            // to a power of two of steps (a shift instead of this
            // division) finished early, and the miss buffers then idled
            // until the next region's kernel (docs/notes/cpu-decode.md).
            burst: lines(ahead).div_ceil(steps.max(1)) << 6,
            region: PhantomData,
        }
    }

    pub(super) fn step(&mut self) {
        let stop = self.end.min(self.next.wrapping_add(self.burst));
        while self.next < stop {
            prefetch_at(self.next);
            self.next = self.next.wrapping_add(64);
        }
    }
}

/// Regions prefetched alongside a kernel's segments, line for line:
/// while a kernel computes offset `o` of segment `s`, it prefetches offset
/// `o` of region `s`. Decode pairs a head's K (or V) in each page of a
/// span with the next head's in the same page, so the prefetches run
/// through memory in address order one head ahead, at the pace of the
/// loads they precede, for an instruction or two each (an [`Ahead`]
/// walk's loop cost cache-resident decode 11–17% of its time on a Zen 3;
/// docs/notes/cpu-decode.md). A segment without a region (the last span's
/// values) is paired with itself, re-fetching lines it holds already, so
/// kernels never branch on it.
#[derive(Clone, Copy)]
pub(super) struct Paired<'a> {
    regions: &'a [&'a [u8]],
}

impl<'a> Paired<'a> {
    pub(super) fn new(regions: &'a [&'a [u8]]) -> Self {
        Self { regions }
    }

    /// The region paired with segment `s`, whose `len` bytes start at
    /// `seg`: its first `len` bytes, or all of it where it is shorter.
    pub(super) fn region(self, s: usize, seg: *const u8, len: usize) -> PairedRegion {
        match self.regions.get(s) {
            Some(r) if !r.is_empty() => PairedRegion {
                base: r.as_ptr(),
                last: r.len().min(len).saturating_sub(1),
            },
            _ => PairedRegion {
                base: seg,
                last: len.saturating_sub(1),
            },
        }
    }
}

/// One segment's paired region: offsets into it, clamped to its last byte
/// so that the fetches stay within it whatever the segment's length.
#[derive(Clone, Copy)]
pub(super) struct PairedRegion {
    base: *const u8,
    last: usize,
}

impl PairedRegion {
    /// Prefetches the line holding offset `at` (or the last byte).
    #[inline]
    pub(super) fn fetch(self, at: usize) {
        prefetch_at(self.base.wrapping_add(at.min(self.last)));
    }

    /// Prefetches every line of offsets `from..to`, once each.
    #[inline]
    pub(super) fn fetch_lines(self, from: usize, to: usize) {
        if from >= to {
            return;
        }
        self.fetch(from);
        // The next line's first offset, then a line at a time.
        let mut at = from + 64 - self.base.wrapping_add(from) as usize % 64;
        while at < to {
            self.fetch(at);
            at += 64;
        }
    }
}

/// What a weighted sum's pass over a block of columns prefetches as it
/// walks the keys: an [`Ahead`] walk, a step every sixteen keys, or
/// [`Paired`] regions, their lines key by key ([`PairedPasses`]).
pub(super) trait PassPrefetch {
    /// A pass reaches a segment.
    fn segment(&mut self, at: PassAt);
    /// Before every sixteenth key of a segment, the first included.
    fn sixteen(&mut self);
    /// Before every key.
    fn key(&mut self);
    /// After the segment's last key.
    fn segment_end(&mut self);
}

/// Where a weighted sum's pass over columns stands: pass `pass` of
/// `passes` reaches segment `s`, `m` rows of `row` bytes at `seg`.
#[derive(Clone, Copy)]
pub(super) struct PassAt {
    pub(super) s: usize,
    pub(super) seg: *const u8,
    pub(super) m: usize,
    pub(super) row: usize,
    pub(super) pass: usize,
    pub(super) passes: usize,
}

impl PassPrefetch for Ahead<'_> {
    #[inline]
    fn segment(&mut self, _: PassAt) {}

    #[inline]
    fn sixteen(&mut self) {
        self.step();
    }

    #[inline]
    fn key(&mut self) {}

    #[inline]
    fn segment_end(&mut self) {}
}

/// [`Paired`] regions for a weighted sum: pass `p` of `P` over a segment
/// of `m` rows of `row` bytes fetches, key by key, the lines of offsets
/// `p·m·t + k·t .. p·m·t + (k + 1)·t` of its region, `t = ⌈row / P⌉` (a
/// half line for AVX2's 16-bit values, whose passes take 32 of a row's
/// bytes, so one fetch per key; two lines for AVX-512's, whose 64-column
/// passes take 128), and the last pass ends with the last line (which the
/// last offset can fall short of), so that all the passes together cover
/// the region's first `m` rows in address order.
pub(super) struct PairedPasses<'a> {
    pairs: Paired<'a>,
    region: PairedRegion,
    at: usize,
    stride: usize,
    last_pass: bool,
}

impl<'a> PairedPasses<'a> {
    pub(super) fn new(pairs: Paired<'a>) -> Self {
        Self {
            pairs,
            region: PairedRegion {
                base: std::ptr::null(),
                last: 0,
            },
            at: 0,
            stride: 0,
            last_pass: false,
        }
    }
}

impl PassPrefetch for PairedPasses<'_> {
    #[inline]
    fn segment(&mut self, at: PassAt) {
        let PassAt {
            s,
            seg,
            m,
            row,
            pass,
            passes,
        } = at;
        self.region = self.pairs.region(s, seg, m * row);
        self.stride = row.div_ceil(passes);
        self.at = pass * m * self.stride;
        self.last_pass = pass + 1 == passes;
    }

    #[inline]
    fn sixteen(&mut self) {}

    #[inline]
    fn key(&mut self) {
        // One fetch where a key's stride fits in a line (AVX2's passes, the
        // hot case), without `fetch_lines`' line arithmetic.
        if self.stride <= 64 {
            self.region.fetch(self.at);
        } else {
            self.region.fetch_lines(self.at, self.at + self.stride);
        }
        self.at += self.stride;
    }

    #[inline]
    fn segment_end(&mut self) {
        if self.last_pass {
            self.region.fetch(self.region.last);
        }
    }
}

/// Cache lines `region` touches.
fn lines(region: &[u8]) -> usize {
    let (start, end) = line_walk(region);
    (end as usize - start as usize).div_ceil(64)
}

/// Where a walk over `region`'s lines starts (the line holding its first
/// byte, so that a region that does not start on a line boundary still
/// has its last line prefetched) and ends; empty for an empty region.
fn line_walk(region: &[u8]) -> (*const u8, *const u8) {
    let range = region.as_ptr_range();
    if region.is_empty() {
        return (range.end, range.end);
    }
    (
        range.start.wrapping_sub(range.start as usize % 64),
        range.end,
    )
}

fn widen_f32(src: &[u8], dst: &mut [f32]) {
    let n = dst.len().min(src.len() / 4);
    // SAFETY: reads `n` f32 from `src` and writes `n` to `dst`, both in
    // bounds; unaligned access is allowed by `loadu`/`storeu`; AVX2 is
    // present (see above).
    unsafe { widen_f32_avx2(src.as_ptr(), dst.as_mut_ptr(), n) }
}

fn widen_f16(src: &[u8], dst: &mut [f32]) {
    let n = dst.len().min(src.len() / 2);
    // SAFETY: reads `n` f16 from `src`, writes `n` f32 to `dst`, in bounds;
    // AVX2 and F16C are present.
    unsafe { widen_f16_avx2(src.as_ptr(), dst.as_mut_ptr(), n) }
}

fn widen_bf16(src: &[u8], dst: &mut [f32]) {
    let n = dst.len().min(src.len() / 2);
    // SAFETY: reads `n` bf16 from `src`, writes `n` f32 to `dst`, in bounds;
    // AVX2 is present.
    unsafe { widen_bf16_avx2(src.as_ptr(), dst.as_mut_ptr(), n) }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    // SAFETY: reads `n` elements of each slice, in bounds; AVX2 and FMA are
    // present.
    unsafe { dot_avx2(a.as_ptr(), b.as_ptr(), n) }
}

fn axpy(acc: &mut [f32], w: f32, x: &[f32]) {
    let n = acc.len().min(x.len());
    // SAFETY: reads `n` of `x`, reads and writes `n` of `acc`, in bounds;
    // AVX2 and FMA are present.
    unsafe { axpy_avx2(acc.as_mut_ptr(), w, x.as_ptr(), n) }
}

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

/// Passes of [`weighted_sum_columns`] over rows of `d` elements: sixteen
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
        // inline it (avx512.rs's `row_sums` was 5x slower for it).
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

/// # Safety
/// `p` is valid for `rows·n` reads, the segments of `v` hold `n` whole rows
/// of `d` elements of encoding `E` in all, `acc` is valid for `rows·d`
/// reads and writes; AVX2, FMA and F16C are present.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn weighted_sum_avx2<const E: u8>(
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
pub(super) fn weight_at<const G: usize, const KEY_MAJOR: bool>(
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
unsafe fn weighted_sum_group<const G: usize, const E: u8, const KEY_MAJOR: bool>(
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
pub(super) const fn elem_bytes<const E: u8>() -> usize {
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

fn softmax_rows(s: &mut [f32], n: usize, max: &mut [f32], sum: &mut [f32], rescale: &mut [f32]) {
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

/// [`Kernels::softmax_rows`]: rows of whole vectors four at a time
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
#[target_feature(enable = "avx2,fma")]
fn rescale_factors(old: __m128, new: __m128) -> __m128 {
    let grew = _mm_cmp_ps::<_CMP_GT_OQ>(new, old);
    let e = _mm256_castps256_ps128(exp8(_mm256_castps128_ps256(_mm_sub_ps(old, new))));
    _mm_blendv_ps(_mm_set1_ps(1.0), e, grew)
}

/// Lane `i` of the result is the largest of `a[i]`'s eight lanes (the
/// max counterpart of [`hsum4`]).
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

fn exp(xs: &mut [f32]) {
    let n = xs.len();
    // SAFETY: reads and writes `n` elements of `xs`, in bounds; AVX2 and FMA
    // are present.
    unsafe { exp_avx2(xs.as_mut_ptr(), n) }
}

/// `e^x` for eight lanes: `x = n·ln2 + r`, a degree-6 polynomial for `e^r`
/// (Cephes' `expf` coefficients), and `2^n` built in the exponent bits.
#[target_feature(enable = "avx2,fma")]
fn exp8(x: __m256) -> __m256 {
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

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use kvslice_core::KvDtype;

    use super::{Ahead, SoftmaxState};

    thread_local! {
        /// Every line prefetched on this thread, in order.
        pub(super) static FETCHED: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
    }

    /// The lines `f` prefetches.
    fn fetched_by(f: impl FnOnce()) -> Vec<usize> {
        FETCHED.with(|lines| lines.borrow_mut().clear());
        f();
        FETCHED.with(|lines| lines.take())
    }

    /// The lines `r` touches.
    fn lines_of(r: &[u8]) -> Vec<usize> {
        let (start, end) = (r.as_ptr() as usize, r.as_ptr() as usize + r.len());
        if r.is_empty() {
            vec![]
        } else {
            (start / 64..end.div_ceil(64)).collect()
        }
    }

    /// Every line of the region is walked once, in order, within `steps`
    /// steps, in bursts of at most ⌈lines / steps⌉, whatever the region's
    /// alignment.
    #[test]
    fn the_walk_covers_every_line_within_its_steps() {
        let buf = vec![0u8; 64 * 300];
        for offset in [0, 1, 40, 63, 64] {
            for len in [0, 1, 63, 64, 65, 1000, 4096, 4097, 64 * 90] {
                let region = &buf[offset..offset + len];
                let want = lines_of(region);
                for steps in 1..=17 {
                    let mut walk = Ahead::new(region, steps);
                    let case = format!("offset {offset}, {len} bytes, {steps} steps");
                    let mut walked = Vec::new();
                    for _ in 0..steps {
                        let burst = fetched_by(|| walk.step());
                        assert!(burst.len() <= want.len().div_ceil(steps), "{case}");
                        walked.extend(burst);
                    }
                    assert_eq!(walked, want, "{case}");
                    assert_eq!(
                        fetched_by(|| walk.step()),
                        [],
                        "{case}: nothing after the last line"
                    );
                }
            }
        }
    }

    /// The four-row kernels (AVX2's, and AVX-512's where the CPU has it)
    /// prefetch every line of each segment's paired region, in address
    /// order within it, and nothing else; a segment without a region
    /// re-fetches its own lines, and a region shorter than its segment is
    /// not overrun.
    #[test]
    fn four_row_kernels_fetch_their_paired_regions_line_for_line() {
        let sets: Vec<_> = (super::kernels().into_iter())
            .chain(super::super::avx512::kernels())
            .collect();
        if sets.is_empty() {
            eprintln!("skipped: this CPU lacks AVX2, FMA or F16C");
        } else if sets.len() == 1 {
            eprintln!(
                "AVX-512's kernels not checked: this CPU lacks it (CI checks them under Bochs)"
            );
        }
        for set in sets {
            let fk = set.stored.and_then(|s| s.four_rows).expect(set.name);
            fetches_paired_regions(set.name, fk);
        }
    }

    fn fetches_paired_regions(set: &str, fk: super::FourRowKernels) {
        for (dtype, d) in [
            (KvDtype::F16, 128),
            (KvDtype::F32, 128),
            (KvDtype::Bf16, 72),
        ] {
            let row = d * dtype.size_bytes();
            // Line-aligned pages of 16 keys, as a page pool holds them.
            let page_bytes = 16 * row;
            let vals: Vec<f32> = (0..6 * 16 * d).map(|i| (i % 7) as f32 * 0.1).collect();
            let mut buf = vec![0u8; 6 * page_bytes + 64];
            let at = buf.as_ptr().align_offset(64);
            dtype
                .encode_row(&vals, &mut buf[at..at + 6 * page_bytes])
                .unwrap();
            let pool = &buf[at..at + 6 * page_bytes];
            let page = |i: usize| &pool[i * page_bytes..(i + 1) * page_bytes];
            let segs = [page(0), &page(1)[..5 * row], page(2)];
            let regions = [page(3), page(4), &page(5)[..2 * row]];
            // Regions that start inside a line.
            let skewed = [&page(3)[40..], &page(4)[1..], &page(5)[63..]];
            let q = vec![0.01f32; 4 * d];
            for (pairs, case) in [
                (&regions[..], "three regions"),
                (&regions[..2], "two"),
                (&skewed[..], "skewed"),
            ] {
                // What each segment covers of its region: as many bytes
                // as it holds, or the whole region where that is shorter.
                let want: Vec<Vec<usize>> = (segs.iter().enumerate())
                    .map(|(s, seg)| {
                        let r = pairs.get(s).copied().unwrap_or(seg);
                        lines_of(&r[..seg.len().min(r.len())])
                    })
                    .collect();
                let n = segs.iter().map(|s| s.len() / row).sum::<usize>();
                let mut w = vec![0f32; 4 * n];
                let (mut max, mut sum, mut rescale) = ([f32::NEG_INFINITY; 4], [0.0; 4], [0.0; 4]);
                let state = SoftmaxState {
                    max: &mut max,
                    sum: &mut sum,
                    rescale: &mut rescale,
                };
                let scored =
                    fetched_by(|| (fk.scores_softmax)(dtype, &q, &segs, &[], &mut w, state, pairs));
                let mut acc = vec![0f32; 4 * d];
                let summed = fetched_by(|| (fk.weighted_sum)(dtype, &w, &segs, &mut acc, pairs));
                for (kernel, got) in [("scores", scored), ("weighted sum", summed)] {
                    let case = format!("{set}, {dtype:?}, {case}: {kernel}");
                    // The weighted sum walks each segment once per pass
                    // of columns, so the regions are checked apart.
                    for lines in &want {
                        let mut mine: Vec<usize> =
                            got.iter().copied().filter(|l| lines.contains(l)).collect();
                        mine.dedup();
                        assert_eq!(&mine, lines, "{case}");
                    }
                    let stray = got.iter().find(|l| !want.iter().any(|w| w.contains(l)));
                    assert_eq!(stray, None, "{case}: a line outside every region");
                }
            }
        }
    }
}
