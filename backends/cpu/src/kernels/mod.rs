//! The three inner loops of paged attention, per instruction set:
//! widening a row of stored K/V to f32, a dot product, and `acc += w·x`.
//!
//! [`Kernels::detect`] picks the best set the CPU supports, once. Unsafe
//! code lives only in the per-ISA files.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod bf16_dot;
#[cfg(target_arch = "aarch64")]
mod neon;
mod scalar;
mod shapes;
#[cfg(target_arch = "x86_64")]
mod vnni;

use kvslice_core::KvDtype;

/// The constants of every SIMD `exp` (Cephes' `expf`): inputs are clamped
/// to `[EXP_MIN, EXP_MAX]`, split as `x = n·ln2 + r` with ln2 in two parts
/// (`EXP_LN2_HI + EXP_LN2_LO`) for precision, and `e^r` is
/// `1 + r + r²·p(r)`, `p` evaluated by Horner from `EXP_POLY[0]`.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod exp_consts {
    pub const EXP_MIN: f32 = -87.3;
    pub const EXP_MAX: f32 = 88.7;
    pub const EXP_LN2_HI: f32 = 0.693_359_4;
    pub const EXP_LN2_LO: f32 = -2.121_944_4e-4;
    pub const EXP_POLY: [f32; 6] = [
        1.987_569_1e-4,
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        0.5,
    ];
}

/// What a row's scale is multiplied by before the kernels apply it: every
/// kernel reads a scaled dtype's codes raw, int8 codes as their integers
/// and E4M3 codes as their value / 256 (the f16 with the same fields,
/// which F16C and NEON convert in one instruction), so E4M3 rows take 256
/// times their scale; 1 for every other dtype.
///
/// ```
/// use kvslice_core::KvDtype;
/// use kvslice_cpu::raw_scale;
///
/// assert_eq!(raw_scale(KvDtype::F8E4M3), 256.0);
/// assert_eq!(raw_scale(KvDtype::I8), 1.0);
/// ```
pub fn raw_scale(dtype: KvDtype) -> f32 {
    match dtype {
        KvDtype::F8E4M3 => 256.0,
        _ => 1.0,
    }
}

/// [`Kernels::softmax_rows`]: `(scores, n, max, sum, rescale)`.
pub type SoftmaxRowsFn = fn(&mut [f32], usize, &mut [f32], &mut [f32], &mut [f32]);
/// [`Kernels::scores`]: `(q, rows, k, n, out, ahead)`.
pub type ScoresFn = fn(&[f32], usize, &[f32], usize, &mut [f32], &[u8]);
/// [`Kernels::weighted_sum`]: `(p, rows, v, n, acc, ahead)`.
pub type WeightedSumFn = fn(&[f32], usize, &[f32], usize, &mut [f32], &[u8]);
/// [`StoredKernels::scores`]: `(dtype, q, rows, k, n, out, ahead)`.
pub type StoredScoresFn = fn(KvDtype, &[f32], usize, &[u8], usize, &mut [f32], &[u8]);
/// [`StoredKernels::weighted_sum`]: `(dtype, p, rows, v, n, acc, ahead)`.
pub type StoredWeightedSumFn = fn(KvDtype, &[f32], usize, &[u8], usize, &mut [f32], &[u8]);
/// [`FourRowKernels::scores_softmax`]: `(dtype, q, keys, scales, weights,
/// state, ahead)`.
pub type FourRowScoresSoftmaxFn =
    fn(KvDtype, &[f32], &[&[u8]], &[f32], &mut [f32], SoftmaxState<'_>, &[&[u8]]);
/// [`Int8QueryKernels::scores_softmax_dim_major`]: `(q, keys, scales,
/// weights, state, ahead)`.
pub type Int8ScoresSoftmaxFn =
    fn(&Int8Queries, &[&[u8]], &[f32], &mut [f32], SoftmaxState<'_>, &[&[u8]]);
/// [`FourRowKernels::weighted_sum`]: `(dtype, p, values, acc, ahead)`.
pub type FourRowWeightedSumFn = fn(KvDtype, &[f32], &[&[u8]], &mut [f32], &[&[u8]]);

/// Name of the set AMD Zen 4 runs first ([`Kernels::supported`]; with
/// VNNI's int8 kernels on top, as `avx2+avx512-weighted-sum+vnni+vbmi`):
/// AVX2's kernels with AVX-512's four-row weighted sum and dim-major scores
/// (11.8 ns per key there against AVX2's 12.1). There AVX-512's scores
/// run no faster than AVX2's (each 512-bit operation takes two passes
/// through 256-bit units, and its 512-bit horizontal sums cost more),
/// but its weighted sum (two 64-column passes over each key's values,
/// where AVX2's sixteen registers allow eight passes of 16 columns) ran
/// streamed decode at 0.98–1.18× AVX2's speed at 8k and 32k tokens,
/// median 1.09× over 22 pairs in the same rounds (docs/notes/cpu-decode.md,
/// "SIMD sets on Zen 4"), with the same results to the bit.
///
/// ```
/// use kvslice_cpu::{Kernels, SPLIT_512_NAME};
///
/// // Detected only on a Zen 4 with AVX-512, and then first (after the
/// // same set with VNNI's int8 kernels, which every Zen 4 has).
/// let names: Vec<_> = Kernels::supported().iter().map(|k| k.name).collect();
/// assert!(names.iter().position(|n| *n == SPLIT_512_NAME).is_none_or(|i| i <= 1));
/// ```
pub const SPLIT_512_NAME: &str = "avx2+avx512-weighted-sum";

/// Function table for one instruction set.
#[derive(Clone, Copy)]
pub struct Kernels {
    /// Name for reports ("avx512f+bw+vl", "avx2+fma+f16c", "neon",
    /// "scalar").
    pub name: &'static str,
    widen_f16: fn(&[u8], &mut [f32]),
    widen_bf16: fn(&[u8], &mut [f32]),
    widen_f32: fn(&[u8], &mut [f32]),
    /// `Σ a[i]·b[i]` over equal-length slices.
    pub dot: fn(&[f32], &[f32]) -> f32,
    /// `acc[i] += w·x[i]` over equal-length slices.
    pub axpy: fn(&mut [f32], f32, &[f32]),
    /// `x[i] = e^x[i]` in place (relative error about 1e-7).
    pub exp: fn(&mut [f32]),
    /// One block of an online softmax over `rows = max.len()` rows of `n`
    /// scores (`s` is `rows × n`, every score visible): per row, the
    /// running `max` grows to cover the row, the row becomes `e^(s − max)`,
    /// `rescale` gets `e^(old max − max)` (1 when the max did not grow) and
    /// `sum` becomes `sum · rescale + Σ row`. The caller rescales its
    /// accumulators by `rescale`.
    pub softmax_rows: SoftmaxRowsFn,
    /// Scores of `rows` queries against `n` keys: `out[r·n + j] =
    /// q[r]·k[j]`, with `q` `rows × d` and `k` `n × d` (`d = q.len() / rows`).
    /// The last argument's cache lines are prefetched, spread over the loop
    /// (the next region of K or V the engine reads, so that it arrives
    /// while this one computes).
    pub scores: ScoresFn,
    /// `acc[r] += Σ_j p[r·n + j] · v[j]` for `rows` accumulators of width `d`,
    /// with `v` `n × d`; prefetches `ahead` like `scores`.
    pub weighted_sum: WeightedSumFn,
    /// `scores` and `weighted_sum` reading K/V rows as stored, where the
    /// ISA converts in registers (`None` elsewhere).
    pub stored: Option<StoredKernels>,
    /// Multiplies each key's four weights of key-major weights (as the
    /// four-row kernels leave them, `w[j·4 + i]`) by the key's scale.
    scale_key_major: fn(&mut [f32], &[f32]),
    /// Asks for `bytes` to be brought into cache (a no-op where the ISA
    /// has no stable prefetch intrinsic). The engine touches the first
    /// lines of the next page's K and V so that the L2 streamer, which
    /// stops at every 4 KiB page, is already running when they are read.
    pub prefetch: fn(bytes: &[u8]),
}

/// The online-softmax state of a block's query rows, as
/// [`Kernels::softmax_rows`] updates it: each row's running `max` and
/// `sum`, and the `rescale` factor this block applied to them.
///
/// ```
/// // Four rows before their first block: no max yet, nothing summed.
/// let (mut max, mut sum, mut rescale) = ([f32::NEG_INFINITY; 4], [0.0; 4], [1.0; 4]);
/// let state = kvslice_cpu::SoftmaxState { max: &mut max, sum: &mut sum, rescale: &mut rescale };
/// assert_eq!(state.max.len(), 4);
/// ```
pub struct SoftmaxState<'a> {
    /// Running maximum score per row.
    pub max: &'a mut [f32],
    /// Running sum of `e^(score − max)` per row.
    pub sum: &'a mut [f32],
    /// Set to `e^(old max − new max)` per row (1 where the max held).
    pub rescale: &'a mut [f32],
}

/// Score and value kernels over K/V rows in their stored encoding: no
/// widening pass, each element converted once in registers. The engine
/// uses them when a block's query rows fit one register group of four (GQA
/// decode), where each element is read once either way.
#[derive(Clone, Copy)]
pub struct StoredKernels {
    /// [`Kernels::scores`] with `k` as `n·d` elements of `dtype`.
    pub scores: StoredScoresFn,
    /// [`Kernels::weighted_sum`] with `v` as `n·d` elements of `dtype`.
    pub weighted_sum: StoredWeightedSumFn,
    /// One block of GQA decode with four query rows per kv head, where the
    /// ISA has it.
    pub four_rows: Option<FourRowKernels>,
}

/// GQA decode's common case, four query rows that all see every key of
/// a span of blocks, in two calls per head and span instead of three per
/// block: the scores and the online softmax in one (each key's four scores
/// come out of the dot products as the four lanes of one vector, so the
/// maxima and sums need no horizontal shuffles), and the weighted sum. The
/// weights pass between them key-major (`w[j·4 + i]` for key `j`, row
/// `i`), the order the scores are made in. Keys and values come as
/// segments, one per block of the span, each of whole rows; the weighted
/// sum keeps its accumulators in registers across all of them, so a span
/// of several small blocks costs what one large block does. Head widths
/// are a multiple of 8.
///
/// ```
/// use kvslice_core::KvDtype;
/// use kvslice_cpu::{Kernels, SoftmaxState};
///
/// // Four query rows of width 8 against three f32 keys of ones, in two
/// // blocks (two keys, then one).
/// let q = [0.5f32; 32];
/// let keys: Vec<u8> = [1.0f32; 24].iter().flat_map(|x| x.to_le_bytes()).collect();
/// let blocks: [&[u8]; 2] = [&keys[..64], &keys[64..]];
/// // The first kernel set this CPU runs that has them (AVX-512's or AVX2's).
/// let four = Kernels::supported().into_iter().find_map(|k| k.stored?.four_rows);
/// if let Some(fk) = four {
///     let (mut max, mut sum, mut rescale) = ([f32::NEG_INFINITY; 4], [0.0; 4], [0.0; 4]);
///     let state = SoftmaxState { max: &mut max, sum: &mut sum, rescale: &mut rescale };
///     let mut w = [0f32; 12];
///     (fk.scores_softmax)(KvDtype::F32, &q, &blocks, &[], &mut w, state, &[]);
///     assert_eq!(max, [4.0; 4]); // every score is 8 · 0.5 · 1
///     assert_eq!((w, sum), ([1.0; 12], [3.0; 4])); // e^(4 − 4) per key
///     let mut acc = [0f32; 32];
///     (fk.weighted_sum)(KvDtype::F32, &w, &blocks, &mut acc, &[]);
///     assert_eq!(acc, [3.0; 32]);
/// }
/// ```
#[derive(Clone, Copy)]
pub struct FourRowKernels {
    /// Scores of four query rows (`q`, `4 × d`) against the `n` keys of
    /// the segments of `keys` (each whole rows of `d` elements stored as
    /// `dtype`), folded into the rows' online softmax like
    /// [`Kernels::softmax_rows`]: `weights[j·4 + i]` becomes
    /// `e^(q_i·k_j − max_i)` under the grown max. For a scaled dtype,
    /// `scales` holds the `n` keys' scales times [`raw_scale`] and each
    /// key's scores are multiplied by its own before the softmax; else it
    /// is empty. Prefetches region `s` of `ahead` alongside segment `s` of
    /// `keys`, line for line.
    ///
    /// # Panics
    /// If `d` is not a multiple of 8, a segment ends inside a row, or
    /// `weights`, `scales` (when not empty) or the state is too short.
    pub scores_softmax: FourRowScoresSoftmaxFn,
    /// [`Self::scores_softmax`] for keys stored dim-major
    /// ([`kvslice_core::KeyOrder::DimMajor`]): each segment of `keys` is
    /// one whole block of `bt` keys stored `[d][bt]`, `bt` a multiple of
    /// 16. Leaves the same weights and state, prefetching `ahead` over the
    /// same bytes (to rounding: the products are summed in another order).
    ///
    /// # Panics
    /// If the segments are not whole blocks of one length, `bt` is not a
    /// multiple of 16, or `weights` or the state is too short.
    pub scores_softmax_dim_major: FourRowScoresSoftmaxFn,
    /// [`Self::scores_softmax_dim_major`] for int8 keys against query rows
    /// rounded to int8, on integer dot products, where the set has them
    /// (AVX-512 VNNI and VBMI). The rounding adds error of its own:
    /// [`crate::CpuEngine::with_int8_queries`] opts in.
    pub int8_queries: Option<Int8QueryKernels>,
    /// [`Self::scores_softmax_dim_major`] and [`Self::weighted_sum`] with
    /// E4M3 pages on bf16 dot products, where the set has them (AVX-512
    /// BF16 beside VNNI and VBMI). Their rounding of the queries and the
    /// weights to bf16 adds error of its own:
    /// [`crate::CpuEngine::with_fp8_bf16`] opts in.
    pub fp8_bf16: Option<Fp8Bf16Kernels>,
    /// `acc[i] += Σ_j weights[j·4 + i] · v[j]` for four accumulators of
    /// width `d` (`acc`, `4 × d`), `v[j]` the `n` rows of the segments of
    /// `values` in order, stored as `dtype`. Prefetches `ahead` as
    /// `scores_softmax` does, region `s` alongside segment `s`.
    ///
    /// # Panics
    /// If a segment ends inside a row, or `weights` is too short.
    pub weighted_sum: FourRowWeightedSumFn,
}

/// GQA decode over E4M3 pages with the other side of each product (the
/// query rows, the softmax weights) rounded to bf16, on bf16 dot
/// products, where a set has them ([`FourRowKernels::fp8_bf16`]). Both
/// take every dtype and shape their [`FourRowKernels`] counterparts take,
/// E4M3 pages of suitable shapes on the bf16 path and everything else on
/// the set's own kernels.
///
/// ```
/// use kvslice_core::KvDtype;
/// use kvslice_cpu::{Kernels, SoftmaxState};
///
/// // Four query rows of width 64 against 16 E4M3 keys of 0.5, dim-major
/// // (one block), each key's scale 1 (times `raw_scale`, 256).
/// let q = [0.25f32; 4 * 64];
/// let keys = vec![kvslice_core::f8e4m3_from_f32(0.5); 16 * 64];
/// let scales = [256.0f32; 16];
/// let bf16 = Kernels::supported().into_iter().find_map(|k| k.stored?.four_rows?.fp8_bf16);
/// if let Some(b) = bf16 {
///     let (mut max, mut sum, mut rescale) = ([f32::NEG_INFINITY; 4], [0.0; 4], [0.0; 4]);
///     let state = SoftmaxState { max: &mut max, sum: &mut sum, rescale: &mut rescale };
///     let mut w = [0f32; 64];
///     (b.scores_softmax_dim_major)(KvDtype::F8E4M3, &q, &[&keys[..]], &scales, &mut w, state, &[]);
///     assert_eq!(max, [8.0; 4]); // 64 · 0.25 · 0.5, exactly in bf16
///     assert_eq!(sum, [16.0; 4]);
/// }
/// ```
#[derive(Clone, Copy)]
pub struct Fp8Bf16Kernels {
    /// [`FourRowKernels::scores_softmax_dim_major`], E4M3 keys against
    /// query rows rounded to bf16 (each row first scaled by a power of
    /// two, which the scores undo exactly).
    pub scores_softmax_dim_major: FourRowScoresSoftmaxFn,
    /// [`FourRowKernels::weighted_sum`], E4M3 values (head widths a
    /// multiple of 64) under weights rounded to bf16.
    pub weighted_sum: FourRowWeightedSumFn,
}

/// Longest query row [`Int8QueryKernels::round`] takes.
pub const MAX_INT8_QUERY_DIMS: usize = 512;

/// Four query rows rounded to int8, each against its largest magnitude
/// (its scale is that over 127), as [`Int8QueryKernels::round`] leaves
/// them for [`Int8QueryKernels::scores_softmax_dim_major`]: made once per
/// kv head and call, scored against every span of its keys.
#[derive(Clone)]
pub struct Int8Queries {
    /// Each row's codes, four dims to a word.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    codes: [[u32; MAX_INT8_QUERY_DIMS / 4]; 4],
    /// Each row's sum of codes.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    sums: [i32; 4],
    scales: [f32; 4],
    dims: usize,
}

impl Int8Queries {
    /// The row width `d`.
    pub fn dims(&self) -> usize {
        self.dims
    }

    /// Each row's scale: the value of code 1.
    pub fn scales(&self) -> [f32; 4] {
        self.scales
    }

    /// Each row as its codes times its scale (what the scores are the
    /// dot products of).
    pub fn dequantized(&self) -> Vec<f32> {
        let mut out = Vec::with_capacity(4 * self.dims);
        for (row, scale) in self.codes.iter().zip(self.scales) {
            let bytes = row.iter().flat_map(|w| w.to_le_bytes()).take(self.dims);
            out.extend(bytes.map(|b| f32::from(b as i8) * scale));
        }
        out
    }
}

/// GQA decode's scores over int8 keys with the four query rows rounded to
/// int8, where a set has them ([`FourRowKernels::int8_queries`]).
///
/// ```
/// use kvslice_cpu::Kernels;
///
/// let q: Vec<f32> = (0..4 * 64).map(|i| (i as f32 * 0.3).sin()).collect();
/// let iq = Kernels::supported().into_iter().find_map(|k| k.stored?.four_rows?.int8_queries);
/// if let Some(iq) = iq {
///     let rounded = (iq.round)(&q).expect("finite rows of 64");
///     assert_eq!(rounded.dims(), 64);
///     // Each element within half a step of its row's scale.
///     for (i, (x, y)) in q.iter().zip(rounded.dequantized()).enumerate() {
///         assert!((x - y).abs() <= rounded.scales()[i / 64] * 0.5001);
///     }
/// }
/// ```
#[derive(Clone, Copy)]
pub struct Int8QueryKernels {
    /// Rounds four query rows (`q`, `4 × d`, `d` a multiple of 4 up to
    /// [`MAX_INT8_QUERY_DIMS`]) to int8; `None` where a row holds a NaN
    /// or infinity, or `d` does not fit.
    pub round: fn(&[f32]) -> Option<Int8Queries>,
    /// [`FourRowKernels::scores_softmax_dim_major`] with int8 keys
    /// against rounded rows: the same weights and state for the rounded
    /// queries, to rounding.
    ///
    /// # Panics
    /// As `scores_softmax_dim_major`, or if the blocks' rows are not
    /// `q.dims()` wide.
    pub scores_softmax_dim_major: Int8ScoresSoftmaxFn,
}

impl SoftmaxState<'_> {
    /// The lengths of `max`, `sum` and `rescale`, for the shape checks.
    #[cfg(target_arch = "x86_64")]
    fn lens(&self) -> [usize; 3] {
        [self.max.len(), self.sum.len(), self.rescale.len()]
    }

    /// Pointers to `max`, `sum` and `rescale`, for the unsafe kernels.
    #[cfg(target_arch = "x86_64")]
    fn as_mut_ptrs(&mut self) -> [*mut f32; 3] {
        [
            self.max.as_mut_ptr(),
            self.sum.as_mut_ptr(),
            self.rescale.as_mut_ptr(),
        ]
    }
}

impl StoredKernels {
    /// Query rows up to which the engine prefers these kernels.
    pub const MAX_ROWS: usize = 4;
}

impl std::fmt::Debug for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

impl Kernels {
    /// The fastest kernels this CPU runs.
    ///
    /// ```
    /// let k = kvslice_cpu::Kernels::detect();
    /// assert_eq!(k.name, kvslice_cpu::Kernels::supported()[0].name);
    /// ```
    pub fn detect() -> Self {
        Self::supported()[0]
    }

    /// Every kernel set this CPU runs, fastest first, the portable one
    /// last (so that tests can hold each against the same oracle). On
    /// x86-64, AVX-512 comes before AVX2, except on AMD Zen 4 (where each
    /// 512-bit operation runs as two halves): there AVX2's set with
    /// AVX-512's four-row weighted sum comes first, then AVX2's and
    /// AVX-512's own ([`SPLIT_512_NAME`]). Where the CPU has AVX-512 VNNI
    /// and VBMI, the first of those with int8 kernels on integer dot
    /// products comes before them all ([`FourRowKernels::int8_queries`]).
    ///
    /// ```
    /// let all = kvslice_cpu::Kernels::supported();
    /// assert_eq!(all.last().unwrap().name, "scalar");
    /// ```
    pub fn supported() -> Vec<Self> {
        let mut all = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            let (wide, narrow) = (avx512::kernels(), avx2::kernels());
            match (wide, narrow) {
                (Some(wide), Some(narrow)) if avx512::splits_512_bit_ops() => {
                    all.extend(narrow.with_four_row_weighted_sum(&wide));
                    all.extend([narrow, wide]);
                }
                _ => all.extend(wide.into_iter().chain(narrow)),
            }
            // Int8 pages on integer dot products, where the CPU has them:
            // the set otherwise first, with those kernels.
            if let Some(bytes) = all.first().and_then(vnni::with_byte_kernels) {
                all.insert(0, bytes);
            }
            // E4M3 pages on bf16 dot products, for the engine to opt in.
            if let Some(bf16) = bf16_dot::kernels() {
                for set in all.iter_mut().filter(|k| vnni::is_vnni_set(k)) {
                    if let Some(four) = set.stored.as_mut().and_then(|s| s.four_rows.as_mut()) {
                        four.fp8_bf16 = Some(bf16);
                    }
                }
            }
        }
        #[cfg(target_arch = "aarch64")]
        all.extend(neon::kernels());
        all.push(scalar::kernels());
        all
    }

    /// This set with `other`'s four-row weighted sum and dim-major scores,
    /// named [`SPLIT_512_NAME`] (its one use: AVX2's set with AVX-512's
    /// on Zen 4), or `None` where either set lacks four-row kernels. The
    /// kernels share [`FourRowKernels`]' contract, weights key-major, so
    /// either set's scores feed either's sum.
    #[cfg(target_arch = "x86_64")]
    fn with_four_row_weighted_sum(mut self, other: &Self) -> Option<Self> {
        let theirs = other.stored?.four_rows?;
        let ours = self.stored.as_mut()?.four_rows.as_mut()?;
        ours.weighted_sum = theirs.weighted_sum;
        ours.scores_softmax_dim_major = theirs.scores_softmax_dim_major;
        self.name = SPLIT_512_NAME;
        Some(self)
    }

    /// The portable fallback, for comparison and tests.
    pub fn scalar() -> Self {
        scalar::kernels()
    }

    /// Multiplies the four key-major weights of each key `j` (`w[j·4 +
    /// i]`) by `scales[j]`, for as many keys as both hold.
    #[inline]
    pub(crate) fn scale_key_major(&self, w: &mut [f32], scales: &[f32]) {
        (self.scale_key_major)(w, scales)
    }

    /// Widens little-endian stored elements (`src`, `dst.len()` of them) to
    /// f32. The codes of a scaled dtype come out raw, each row still to be
    /// multiplied by its scale times [`raw_scale`] (portable loops in every
    /// set: only prefill widens them, decode reads them in registers).
    #[inline]
    pub fn widen(&self, dtype: KvDtype, src: &[u8], dst: &mut [f32]) {
        debug_assert_eq!(src.len(), dst.len() * dtype.size_bytes());
        match dtype {
            KvDtype::F32 => (self.widen_f32)(src, dst),
            KvDtype::F16 => (self.widen_f16)(src, dst),
            KvDtype::Bf16 => (self.widen_bf16)(src, dst),
            KvDtype::I8 => scalar::widen_i8(src, dst),
            KvDtype::F8E4M3 => scalar::widen_f8(src, dst),
        }
    }
}

#[cfg(test)]
mod tests;
