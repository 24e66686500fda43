//! Decode over int8 K/V two ways: the CPU engine's arithmetic (codes
//! widened to f32, one FMA per code and query row) and integer dot
//! products on `vpdpbusd` (64 byte products per instruction).
//!
//! Scores: keys as the engine's dim-major groups (per 16 keys, 128 rows of
//! 16 codes), four query rows (a GQA group of decode). The byte kernel
//! rounds the queries to int8, shifts them by 128 (`vpdpbusd` multiplies
//! unsigned by signed bytes), turns four dim rows of 16 keys into 16 keys
//! of four dims with one `vpermb`, and takes each key's code sum with one
//! more `vpdpbusd` against ones to undo the shift.
//!
//! Weighted sum: values as rows of 128 codes, each row's weights (times
//! the key's value scale) rounded to 16 bits, two `vpdpbusd` per row (high
//! and low bytes) over four value rows interleaved byte by byte; four
//! passes (two rows, half the dims: 16 sums in registers) over each chunk
//! of 256 keys, which stays in L1.
//!
//! Each kernel is checked against f64 first: the byte kernels exactly
//! against the rounded queries and weights, the f32 ones against the
//! unrounded. Kernels alternate round by round; medians are printed.
//!
//! Not part of the workspace (x86-64 with AVX-512 F, BW, VNNI and VBMI:
//! Ice Lake, Sapphire Rapids, Zen 4; elsewhere it says what is missing).
//! Build and run:
//!
//! ```sh
//! rustc -O --edition 2024 docs/experiments/int8_dot_ports.rs -o /tmp/int8_dot_ports
//! /tmp/int8_dot_ports              # 8,192 keys (1 MiB of codes), 64 rounds
//! KEYS=2048 /tmp/int8_dot_ports    # fewer keys: L1/L2-resident
//! ```

use std::time::Instant;

const D: usize = 128;
const ROWS: usize = 4;
const GROUP: usize = 16;
/// Keys the byte weighted sum takes from memory at a time (32 KiB of values).
const CHUNK_KEYS: usize = 256;

/// A small deterministic generator (SplitMix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

#[cfg(target_arch = "x86_64")]
mod kernels {
    use super::{CHUNK_KEYS, D, GROUP, ROWS};
    use std::arch::x86_64::*;

    /// Scores of `ROWS` query rows against every key: codes widened to f32.
    ///
    /// # Safety
    /// AVX-512 F is present; `codes` holds whole groups of `GROUP * D`.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn scores_f32(q: &[[f32; D]; ROWS], codes: &[i8], out: &mut [[f32; GROUP]]) {
        for (g, o) in codes
            .chunks_exact(GROUP * D)
            .zip(out.chunks_exact_mut(ROWS))
        {
            let mut acc = [_mm512_setzero_ps(); ROWS];
            for d in 0..D {
                // SAFETY: 16 bytes at d * 16 lie inside the group.
                let raw = unsafe { _mm_loadu_si128(g.as_ptr().add(d * GROUP).cast()) };
                let k = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(raw));
                for r in 0..ROWS {
                    acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(q[r][d]), k, acc[r]);
                }
            }
            for r in 0..ROWS {
                // SAFETY: `o[r]` is 16 f32.
                unsafe { _mm512_storeu_ps(o[r].as_mut_ptr(), acc[r]) };
            }
        }
    }

    /// The same with `q8` (queries rounded to int8, shifted by 128 and
    /// packed four dims to a word) on `vpdpbusd`; `scale[r]` undoes each
    /// row's rounding.
    ///
    /// # Safety
    /// AVX-512 F, BW, VNNI and VBMI are present; `codes` as above.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vbmi")]
    pub unsafe fn scores_vnni(
        q8: &[[u32; D / 4]; ROWS],
        scale: &[f32; ROWS],
        codes: &[i8],
        out: &mut [[f32; GROUP]],
    ) {
        // Byte 4t + i of the result is byte 16i + t of the source: dim i
        // of key t.
        let idx: [u8; 64] = core::array::from_fn(|b| ((b % 4) * 16 + b / 4) as u8);
        // SAFETY: 64 bytes.
        let idx = unsafe { _mm512_loadu_si512(idx.as_ptr().cast()) };
        let ones = _mm512_set1_epi8(1);
        let shift = _mm512_set1_epi32(128);
        for (g, o) in codes
            .chunks_exact(GROUP * D)
            .zip(out.chunks_exact_mut(ROWS))
        {
            let mut acc = [_mm512_setzero_si512(); ROWS];
            let mut sums = _mm512_setzero_si512();
            for j in 0..D / 4 {
                // SAFETY: four rows of 16 codes at j * 64 lie inside the group.
                let rows = unsafe { _mm512_loadu_si512(g.as_ptr().add(j * 64).cast()) };
                let k = _mm512_permutexvar_epi8(idx, rows);
                sums = _mm512_dpbusd_epi32(sums, ones, k);
                for r in 0..ROWS {
                    acc[r] = _mm512_dpbusd_epi32(acc[r], _mm512_set1_epi32(q8[r][j] as i32), k);
                }
            }
            let shifted = _mm512_mullo_epi32(sums, shift);
            for r in 0..ROWS {
                let exact = _mm512_sub_epi32(acc[r], shifted);
                let s = _mm512_mul_ps(_mm512_cvtepi32_ps(exact), _mm512_set1_ps(scale[r]));
                // SAFETY: `o[r]` is 16 f32.
                unsafe { _mm512_storeu_ps(o[r].as_mut_ptr(), s) };
            }
        }
    }

    /// Weighted sums of value codes (`[key][D]`) for `ROWS` weight rows,
    /// codes widened to f32, half the dims per pass.
    ///
    /// # Safety
    /// AVX-512 F is present; `codes` holds `w[r].len()` rows of `D`.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn sums_f32(w: &[Vec<f32>; ROWS], codes: &[i8], out: &mut [[f32; D]; ROWS]) {
        for h in 0..2 {
            let mut acc = [[_mm512_setzero_ps(); 4]; ROWS];
            for (t, row) in codes.chunks_exact(D).enumerate() {
                for c in 0..4 {
                    // SAFETY: 16 codes at h * 64 + c * 16 lie inside the row.
                    let raw = unsafe { _mm_loadu_si128(row.as_ptr().add(h * 64 + c * 16).cast()) };
                    let v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(raw));
                    for r in 0..ROWS {
                        acc[r][c] = _mm512_fmadd_ps(_mm512_set1_ps(w[r][t]), v, acc[r][c]);
                    }
                }
            }
            for r in 0..ROWS {
                for c in 0..4 {
                    // SAFETY: 16 f32 at h * 64 + c * 16 lie inside the row.
                    unsafe {
                        _mm512_storeu_ps(out[r].as_mut_ptr().add(h * 64 + c * 16), acc[r][c])
                    };
                }
            }
        }
    }

    /// The same with each row's weights rounded to 16 bits (`hi`, `lo`:
    /// the high and low bytes of four keys packed to a word, `unit[r]` the
    /// weight of code 1) on two `vpdpbusd` per row: four value rows are
    /// interleaved byte by byte (`vpunpck`) so that each word holds one
    /// dim of four keys.
    ///
    /// # Safety
    /// AVX-512 F, BW and VNNI are present; `codes` holds `4 * hi[r].len()`
    /// rows of `D`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub unsafe fn sums_vnni(
        hi: &[Vec<u32>; ROWS],
        lo: &[Vec<u32>; ROWS],
        unit: &[f32; ROWS],
        codes: &[i8],
        out: &mut [[f32; D]; ROWS],
    ) {
        // Sums per (row pair, half of the dims): 16 registers each, too
        // many for all four at once. A chunk of keys small enough for L1 is
        // read from memory once and three more times from L1; between
        // chunks the sums wait in memory.
        let mut parts = [[[[[_mm512_setzero_si512(); 4]; 2]; 2]; 2]; ROWS / 2];
        for (chunk_at, chunk) in codes.chunks(CHUNK_KEYS * D).enumerate() {
            for (pair, halves) in parts.iter_mut().enumerate() {
                for (h, part) in halves.iter_mut().enumerate() {
                    // In registers for the chunk.
                    let mut acc = *part;
                    for (n, rows) in chunk.chunks_exact(4 * D).enumerate() {
                        let g = chunk_at * CHUNK_KEYS / 4 + n;
                        // SAFETY: each of the four rows has 64 codes at h * 64.
                        let [a, b, c, d] = core::array::from_fn(|k| unsafe {
                            _mm512_loadu_si512(rows.as_ptr().add(k * D + h * 64).cast())
                        });
                        let (ab_lo, ab_hi) =
                            (_mm512_unpacklo_epi8(a, b), _mm512_unpackhi_epi8(a, b));
                        let (cd_lo, cd_hi) =
                            (_mm512_unpacklo_epi8(c, d), _mm512_unpackhi_epi8(c, d));
                        let x = [
                            _mm512_unpacklo_epi16(ab_lo, cd_lo),
                            _mm512_unpackhi_epi16(ab_lo, cd_lo),
                            _mm512_unpacklo_epi16(ab_hi, cd_hi),
                            _mm512_unpackhi_epi16(ab_hi, cd_hi),
                        ];
                        for i in 0..2 {
                            let r = 2 * pair + i;
                            let bh = _mm512_set1_epi32(hi[r][g] as i32);
                            let bl = _mm512_set1_epi32(lo[r][g] as i32);
                            for c in 0..4 {
                                acc[i][0][c] = _mm512_dpbusd_epi32(acc[i][0][c], bh, x[c]);
                                acc[i][1][c] = _mm512_dpbusd_epi32(acc[i][1][c], bl, x[c]);
                            }
                        }
                    }
                    *part = acc;
                }
            }
        }
        for (pair, halves) in parts.iter().enumerate() {
            for (h, acc) in halves.iter().enumerate() {
                for i in 0..2 {
                    let r = 2 * pair + i;
                    for c in 0..4 {
                        let mut words = [[0i32; 16]; 2];
                        for limb in 0..2 {
                            // SAFETY: 16 i32.
                            unsafe {
                                _mm512_storeu_si512(
                                    words[limb].as_mut_ptr().cast(),
                                    acc[i][limb][c],
                                )
                            };
                        }
                        // Word j of lane l holds dim 16 l + 4 c + j of the half.
                        for (n, (h8, l8)) in words[0].iter().zip(&words[1]).enumerate() {
                            let dim = h * 64 + (n / 4) * 16 + c * 4 + n % 4;
                            out[r][dim] = (*h8 as f32 * 256.0 + *l8 as f32) * unit[r];
                        }
                    }
                }
            }
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median seconds per call of `a` and of `b`, over 64 rounds that run
/// each `reps` times, alternating.
fn alternate(reps: usize, mut a: impl FnMut(), mut b: impl FnMut()) -> (f64, f64) {
    let time = |f: &mut dyn FnMut()| {
        let t = Instant::now();
        for _ in 0..reps {
            f();
        }
        t.elapsed().as_secs_f64() / reps as f64
    };
    let (mut ta, mut tb) = (Vec::new(), Vec::new());
    for _ in 0..64 {
        ta.push(time(&mut a));
        tb.push(time(&mut b));
    }
    (median(ta), median(tb))
}

#[cfg(target_arch = "x86_64")]
fn main() {
    let missing: Vec<&str> = [
        ("avx512f", is_x86_feature_detected!("avx512f")),
        ("avx512bw", is_x86_feature_detected!("avx512bw")),
        ("avx512vnni", is_x86_feature_detected!("avx512vnni")),
        ("avx512vbmi", is_x86_feature_detected!("avx512vbmi")),
    ]
    .iter()
    .filter(|(_, ok)| !ok)
    .map(|(name, _)| *name)
    .collect();
    if !missing.is_empty() {
        println!("this CPU lacks {}: nothing to measure", missing.join(", "));
        return;
    }
    let keys: usize = std::env::var("KEYS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8192);
    let keys = keys.div_ceil(GROUP).max(1) * GROUP;
    let mut rng = Rng(7);
    let codes: Vec<i8> = (0..keys * D)
        .map(|_| ((rng.next() % 255) as i32 - 127) as i8)
        .collect();
    let q: [[f32; D]; ROWS] = core::array::from_fn(|_| core::array::from_fn(|_| rng.unit()));
    // Each row rounded to int8 against its largest element.
    let scale: [f32; ROWS] =
        core::array::from_fn(|r| q[r].iter().fold(0f32, |m, x| m.max(x.abs())) / 127.0);
    let rounded: [[i8; D]; ROWS] =
        core::array::from_fn(|r| core::array::from_fn(|d| (q[r][d] / scale[r]).round() as i8));
    let q8: [[u32; D / 4]; ROWS] = core::array::from_fn(|r| {
        core::array::from_fn(|j| {
            u32::from_le_bytes(core::array::from_fn(|i| {
                (rounded[r][4 * j + i] as i32 + 128) as u8
            }))
        })
    });
    let groups = keys / GROUP;
    let mut out_f32 = vec![[0f32; GROUP]; groups * ROWS];
    let mut out_vnni = vec![[0f32; GROUP]; groups * ROWS];

    // Check both against f64 before timing.
    // SAFETY: the features were detected above; `codes` is whole groups.
    unsafe {
        kernels::scores_f32(&q, &codes, &mut out_f32);
        kernels::scores_vnni(&q8, &scale, &codes, &mut out_vnni);
    }
    let (mut worst_f32, mut worst_vnni) = (0f64, 0f64);
    for g in 0..groups {
        for r in 0..ROWS {
            for t in 0..GROUP {
                let code = |d: usize| f64::from(codes[g * GROUP * D + d * GROUP + t]);
                let exact: f64 = (0..D).map(|d| f64::from(q[r][d]) * code(d)).sum();
                let exact8: f64 = (0..D).map(|d| f64::from(rounded[r][d]) * code(d)).sum();
                worst_f32 = worst_f32.max((f64::from(out_f32[g * ROWS + r][t]) - exact).abs());
                let want8 = f64::from(scale[r]) * exact8;
                worst_vnni = worst_vnni.max((f64::from(out_vnni[g * ROWS + r][t]) - want8).abs());
            }
        }
    }
    println!(
        "largest error: f32 {worst_f32:.2e} (vs unrounded queries), bytes {worst_vnni:.2e} (vs int8 queries)"
    );
    assert!(worst_f32 < 1e-2 && worst_vnni < 1e-2, "a kernel is wrong");

    let reps = (8192 * 64 / keys).max(1);
    let (a, b) = alternate(
        reps,
        || {
            // SAFETY: as above.
            unsafe { kernels::scores_f32(&q, &codes, &mut out_f32) };
            std::hint::black_box(&out_f32);
        },
        || {
            // SAFETY: as above.
            unsafe { kernels::scores_vnni(&q8, &scale, &codes, &mut out_vnni) };
            std::hint::black_box(&out_vnni);
        },
    );
    let per_key = |s: f64| s * 1e9 / keys as f64;
    println!(
        "scores, {keys} keys, 4 rows, d = {D}: f32 FMAs {:.2} ns/key, vpdpbusd {:.2} ns/key ({:.2}x)",
        per_key(a),
        per_key(b),
        a / b
    );

    // The weighted sum: softmax-like weights (exp of a spread of 6) times
    // each key's value scale, rounded to 16 bits against the row's
    // largest for the byte kernel.
    let w: [Vec<f32>; ROWS] = core::array::from_fn(|_| {
        let raw: Vec<f64> = (0..keys)
            .map(|_| f64::from(3.0 * rng.unit()).exp())
            .collect();
        let total: f64 = raw.iter().sum();
        raw.iter()
            .map(|x| (x / total * (0.01 + 0.01 * f64::from(rng.unit().abs()))) as f32)
            .collect()
    });
    let unit: [f32; ROWS] =
        core::array::from_fn(|r| w[r].iter().fold(0f32, |m, x| m.max(*x)) / 65535.0);
    let w16: [Vec<u32>; ROWS] =
        core::array::from_fn(|r| w[r].iter().map(|x| (x / unit[r]).round() as u32).collect());
    let pack = |r: usize, shift: u32| -> Vec<u32> {
        w16[r]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(core::array::from_fn(|i| (c[i] >> shift) as u8)))
            .collect()
    };
    let hi: [Vec<u32>; ROWS] = core::array::from_fn(|r| pack(r, 8));
    let lo: [Vec<u32>; ROWS] = core::array::from_fn(|r| pack(r, 0));
    let mut sums_f32 = [[0f32; D]; ROWS];
    let mut sums_vnni = [[0f32; D]; ROWS];
    // The value codes: the same bytes, read as rows of D per key.
    // SAFETY: the features were detected above; `codes` is `keys` rows.
    unsafe {
        kernels::sums_f32(&w, &codes, &mut sums_f32);
        kernels::sums_vnni(&hi, &lo, &unit, &codes, &mut sums_vnni);
    }
    let (mut worst_f32, mut worst_vnni, mut largest) = (0f64, 0f64, 0f64);
    for r in 0..ROWS {
        for d in 0..D {
            let code = |t: usize| f64::from(codes[t * D + d]);
            let exact: f64 = (0..keys).map(|t| f64::from(w[r][t]) * code(t)).sum();
            let exact16: f64 = (0..keys)
                .map(|t| f64::from(w16[r][t]) * code(t))
                .sum::<f64>()
                * f64::from(unit[r]);
            largest = largest.max(exact.abs());
            worst_f32 = worst_f32.max((f64::from(sums_f32[r][d]) - exact).abs());
            worst_vnni = worst_vnni.max((f64::from(sums_vnni[r][d]) - exact16).abs());
        }
    }
    println!(
        "largest error over largest sum {largest:.2e}: f32 {:.2e}, bytes {:.2e} (vs 16-bit weights)",
        worst_f32 / largest,
        worst_vnni / largest
    );
    assert!(
        worst_f32 < 1e-4 * largest && worst_vnni < 1e-4 * largest,
        "a kernel is wrong"
    );
    let (c, e) = alternate(
        reps,
        || {
            // SAFETY: as above.
            unsafe { kernels::sums_f32(&w, &codes, &mut sums_f32) };
            std::hint::black_box(&sums_f32);
        },
        || {
            // SAFETY: as above.
            unsafe { kernels::sums_vnni(&hi, &lo, &unit, &codes, &mut sums_vnni) };
            std::hint::black_box(&sums_vnni);
        },
    );
    println!(
        "weighted sum, same shape: f32 FMAs {:.2} ns/key, vpdpbusd on 16-bit weights {:.2} ns/key ({:.2}x)",
        per_key(c),
        per_key(e),
        c / e
    );
    println!(
        "both: f32 {:.2} ns/key, bytes {:.2} ns/key ({:.2}x)",
        per_key(a + c),
        per_key(b + e),
        (a + c) / (b + e)
    );
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    println!("x86-64 only");
}
