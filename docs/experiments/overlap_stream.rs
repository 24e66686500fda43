//! How much arithmetic a sequential read stream hides on this machine.
//!
//! Two threads each stream over half of a 512 MiB buffer of f16 values.
//! Per 64-byte line, each of its four 8-element chunks is widened
//! (`vcvtph2ps`) and multiplied into `rows` accumulators, so `rows = 4` is
//! decode's arithmetic per K/V byte (4 query rows per kv head: 128 FMAs
//! per 512 bytes); `rows = 0` is a plain read loop, the baseline. An
//! optional software prefetch runs `ahead` lines in front, `burst` lines
//! at a time. Modes alternate round by round; medians are printed.
//!
//! Not part of the workspace (x86-64 with AVX2/FMA/F16C only). Build and
//! run:
//!
//! ```sh
//! rustc -O -C target-cpu=native --edition 2024 docs/experiments/overlap_stream.rs -o /tmp/overlap_stream
//! /tmp/overlap_stream                          # the modes of docs/notes/cpu-decode.md
//! MODES=0:0,6:32 /tmp/overlap_stream           # rows:ahead[:burst], comma-separated
//! HOT=131072 /tmp/overlap_stream               # each thread re-reads 128 KiB (compute alone)
//! ```

use std::arch::x86_64::*;
use std::time::Instant;

const LINE: usize = 64;
/// Slack past each thread's span, so prefetches stay inside the buffer.
const PAD: usize = 512 * LINE;

/// One pass over `buf` with `R` FMAs per widened chunk.
///
/// # Safety
/// AVX2, FMA and F16C are present; `buf` has `PAD` readable bytes past
/// `len` (prefetches are hints and never fault, but stay in bounds).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pass<const R: usize>(buf: &[u8], len: usize, ahead: usize, burst: usize) -> f32 {
    let mut acc = [_mm256_setzero_ps(); 8];
    let q: [__m256; 8] = core::array::from_fn(|r| _mm256_set1_ps(1.0 + r as f32 * 1e-3));
    let p = buf.as_ptr();
    let mut next_prefetch = 0;
    for i in 0..len / LINE {
        // SAFETY: line `i` is below `len`, and prefetches reach at most
        // `ahead + burst` lines (< PAD) past it.
        unsafe {
            let l = p.add(i * LINE);
            if ahead > 0 && i == next_prefetch {
                next_prefetch += burst;
                for b in 0..burst {
                    _mm_prefetch::<_MM_HINT_T0>(l.add((ahead + b) * LINE).cast());
                }
            }
            if R == 0 {
                let a = _mm256_loadu_ps(l.cast());
                let b = _mm256_loadu_ps(l.add(32).cast());
                acc[i % 8] = _mm256_add_ps(acc[i % 8], _mm256_add_ps(a, b));
            } else {
                let mut k = 0;
                for c in 0..4 {
                    let x = _mm256_cvtph_ps(_mm_loadu_si128(l.add(c * 16).cast()));
                    for qr in q.iter().take(R) {
                        acc[k % 8] = _mm256_fmadd_ps(x, *qr, acc[k % 8]);
                        k += 1;
                    }
                }
            }
        }
    }
    let mut out = [0f32; 8];
    let s = acc.iter().fold(_mm256_setzero_ps(), |s, a| _mm256_add_ps(s, *a));
    // SAFETY: `out` holds eight f32.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), s) };
    out.iter().sum()
}

fn run(rows: usize, buf: &[u8], len: usize, ahead: usize, burst: usize) -> f32 {
    assert!(len + PAD <= buf.len(), "the span needs PAD bytes of slack");
    assert!((ahead + burst) * LINE <= PAD, "prefetch distance past the slack");
    // SAFETY: main checked AVX2, FMA and F16C; the asserts above are
    // `pass`'s bounds.
    unsafe {
        match rows {
            0 => pass::<0>(buf, len, ahead, burst),
            1 => pass::<1>(buf, len, ahead, burst),
            2 => pass::<2>(buf, len, ahead, burst),
            3 => pass::<3>(buf, len, ahead, burst),
            4 => pass::<4>(buf, len, ahead, burst),
            5 => pass::<5>(buf, len, ahead, burst),
            6 => pass::<6>(buf, len, ahead, burst),
            8 => pass::<8>(buf, len, ahead, burst),
            _ => panic!("rows must be 0-6 or 8, not {rows}"),
        }
    }
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().map_or(default, |s| {
        s.parse().unwrap_or_else(|_| panic!("{name}={s}: not a number"))
    })
}

fn main() {
    assert!(
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c"),
        "needs AVX2, FMA and F16C"
    );
    let (mib, rounds, threads, hot) = (env("MIB", 512), env("ROUNDS", 15), env("T", 2), env("HOT", 0));
    let modes: Vec<[usize; 3]> = std::env::var("MODES")
        .unwrap_or("0:0,1:0,2:0,4:0,6:0,8:0,4:16,4:32,4:64,4:64:12,6:32,8:32".into())
        .split(',')
        .map(|m| {
            let v: Vec<usize> = m.split(':').map(|x| x.parse().expect("MODES: rows:ahead[:burst]")).collect();
            [v[0], v.get(1).copied().unwrap_or(0), v.get(2).copied().unwrap_or(1).max(1)]
        })
        .collect();
    assert!(modes[0][0] == 0, "the first mode is the baseline: 0 rows");
    let per = (mib << 20) / threads / LINE * LINE;
    // Halves as f16 in [0.5, 1): no subnormals, no infinities.
    let mut buf = vec![0u8; per * threads + PAD];
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    for c in buf.chunks_exact_mut(2) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        c.copy_from_slice(&(0x3800 | (s as u16 & 0x3ff)).to_le_bytes());
    }
    let mut times = vec![Vec::new(); modes.len()];
    let mut sink = 0f32;
    for _ in 0..rounds {
        for (m, t) in modes.iter().zip(&mut times) {
            let start = Instant::now();
            sink += std::thread::scope(|sc| {
                let hs: Vec<_> = (0..threads)
                    .map(|i| {
                        let part = &buf[i * per..(i + 1) * per + PAD];
                        sc.spawn(move || match hot {
                            0 => run(m[0], part, per, m[1], m[2]),
                            h => (0..per / h).map(|_| run(m[0], part, h, m[1], m[2])).sum(),
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).sum::<f32>()
            });
            t.push(start.elapsed().as_secs_f64());
        }
    }
    let gib = (per * threads) as f64 / (1u64 << 30) as f64;
    // Per mode: the median rate, and the slowest and fastest rounds (how
    // much the machine's speed moved while the modes alternated).
    let spread: Vec<[f64; 3]> = times
        .iter_mut()
        .map(|t| {
            t.sort_by(f64::total_cmp);
            [gib / t[t.len() - 1], gib / t[t.len() / 2], gib / t[0]]
        })
        .collect();
    let rates: Vec<f64> = spread.iter().map(|s| s[1]).collect();
    println!("{threads} threads, {} MiB, medians of {rounds} alternating rounds{}", mib, if hot > 0 { format!(", {hot} bytes re-read per thread") } else { String::new() });
    for (m, s) in modes.iter().zip(&spread) {
        println!(
            "rows {} ({:3} FMAs / 512 B), prefetch {:3} lines ahead in bursts of {:2}: {:6.2} GiB/s, {:4.0}% of the read loop (rounds {:.2}-{:.2})",
            m[0], m[0] * 32, m[1], m[2], s[1], 100.0 * s[1] / rates[0], s[0], s[2]
        );
    }
    std::hint::black_box(sink);
}
