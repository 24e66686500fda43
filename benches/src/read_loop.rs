//! The read loop every decode benchmark compares with: the memory read
//! bandwidth attention over K/V has to live within, measured on the same
//! bytes in the same run.

/// Sums `bytes` as u64 words with four accumulators per thread, on every
/// core: the memory read bandwidth the attention has to live within.
///
/// ```
/// let bytes = vec![1u8; 4096];
/// // 512 words of 0x0101…01, summed with wrapping.
/// let want = 0x0101_0101_0101_0101u64.wrapping_mul(512);
/// assert_eq!(kvslice_benches::read_loop::stream_read(&bytes, 2), want);
/// ```
pub fn stream_read(bytes: &[u8], threads: usize) -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    let total = AtomicU64::new(0);
    in_parts(bytes, threads, |part| {
        let mut acc = [0u64; 4];
        for line in part.chunks_exact(32) {
            for (i, w) in line.chunks_exact(8).enumerate() {
                acc[i] = acc[i].wrapping_add(u64::from_le_bytes(w.try_into().unwrap()));
            }
        }
        total.fetch_add(acc.iter().fold(0u64, |a, b| a.wrapping_add(*b)), Relaxed);
    });
    total.into_inner()
}

/// Runs `f` over `bytes` on `threads` threads as the engine shares its
/// work (`work_sharing`): parts of 1 MiB taken in address order from one
/// counter by the calling thread and by the pool workers that start in
/// time, so a pass pays what decode pays to start its threads.
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering};
///
/// let seen = AtomicUsize::new(0);
/// let bytes = vec![0u8; 3 << 20];
/// kvslice_benches::read_loop::in_parts(&bytes, 2, |part| {
///     seen.fetch_add(part.len(), Ordering::Relaxed);
/// });
/// assert_eq!(seen.into_inner(), 3 << 20);
/// ```
pub fn in_parts(bytes: &[u8], threads: usize, f: impl Fn(&[u8]) + Sync) {
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    const PART: usize = 1 << 20;
    let next = AtomicUsize::new(0);
    let work = || {
        while let Some(part) = bytes.chunks(PART).nth(next.fetch_add(1, Relaxed)) {
            f(part);
        }
    };
    kvslice_cpu::work_sharing::share_in_pool(&work, threads - 1);
}
