//! Peak f32 FMA throughput of this machine: independent FMA chains on
//! every core.

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn chains(iters: u64) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_set1_ps(1.0); 10];
    let a = _mm256_set1_ps(0.999_999);
    let b = _mm256_set1_ps(1e-7);
    for _ in 0..iters {
        for x in acc.iter_mut() {
            *x = _mm256_fmadd_ps(*x, a, b);
        }
    }
    let s = acc
        .iter()
        .fold(_mm256_setzero_ps(), |s, x| _mm256_add_ps(s, *x));
    _mm256_cvtss_f32(s)
}

/// GFLOP/s (an FMA is 2 flops) over all cores, or `None` without
/// AVX2+FMA: the best of five trials, as a peak is what the machine
/// reaches when nothing else on the host gets in the way (one trial
/// read 25% low on a shared VM; the caller also measures at two
/// times).
pub fn gflops(threads: usize) -> Option<f64> {
    (0..5)
        .filter_map(|_| trial(threads, 20_000_000))
        .reduce(f64::max)
}

/// GFLOP/s of one trial of `iters` rounds of ten FMAs per thread, or
/// `None` without AVX2+FMA.
pub fn trial(threads: usize, iters: u64) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        let t = std::time::Instant::now();
        std::thread::scope(|s| {
            for _ in 0..threads {
                // SAFETY: AVX2 and FMA were detected just above.
                s.spawn(move || std::hint::black_box(unsafe { chains(iters) }));
            }
        });
        let flops = (threads as u64 * iters * 10 * 8 * 2) as f64;
        return Some(flops / t.elapsed().as_secs_f64() / 1e9);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (threads, iters);
    None
}
