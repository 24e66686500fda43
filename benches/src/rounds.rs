//! Timing in rounds, for the benches that interleave what they compare
//! (`kv_dtype`, `gqa_decode`): each round times every case once, and a
//! case's figure is its median over the rounds.

use std::time::Instant;

/// Rounds to run: `KVSLICE_BENCH_ROUNDS` where it is set to a number, else
/// `default`; at least one.
///
/// ```
/// assert!(kvslice_benches::rounds::from_env(5) >= 1);
/// ```
pub fn from_env(default: usize) -> usize {
    std::env::var("KVSLICE_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
        .max(1)
}

/// The median of `xs` (the upper one of an even count); 0 for none.
///
/// ```
/// assert_eq!(kvslice_benches::rounds::median(vec![3.0, 1.0, 2.0]), 2.0);
/// ```
pub fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs.get(xs.len() / 2).copied().unwrap_or(0.0)
}

/// Mean seconds of `reps` calls of `f` (at least one).
///
/// ```
/// let mut calls = 0;
/// let t = kvslice_benches::rounds::mean_secs(3, || calls += 1);
/// assert_eq!(calls, 3);
/// assert!(t >= 0.0);
/// ```
pub fn mean_secs(reps: u32, mut f: impl FnMut()) -> f64 {
    let reps = reps.max(1);
    let t = Instant::now();
    for _ in 0..reps {
        f();
    }
    t.elapsed().as_secs_f64() / f64::from(reps)
}
