//! What 8-bit K/V costs in accuracy: attention over K/V rounded as each
//! dtype stores it, against attention in f64 over the unrounded K/V, for
//! Gaussian K/V and for keys with outlier channels (a few channels 20x the
//! rest, as real keys have). Scales per row (what kvslice stores) and per
//! block of 32 values (llama.cpp's q8_0) are both measured: the figures in
//! docs/QUANTIZATION.md come from this test's output
//! (`cargo test --release -p kvslice-core --test quantized_accuracy -- --nocapture`).

use kvslice_core::KvDtype;
use kvslice_core::testkit::Rng;

const D: usize = 128;
const KEYS: usize = 2048;
const QUERIES: usize = 16;

/// A standard normal draw (Box–Muller).
fn normal(rng: &mut Rng) -> f64 {
    let u1 = f64::from(rng.unit().abs()).max(1e-12);
    let u2 = f64::from(rng.unit());
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::PI * u2).cos()
}

/// Attention of each query over `k`, `v` (`KEYS × D`), in f64.
fn attend(q: &[f32], k: &[f32], v: &[f32]) -> Vec<f64> {
    attend_weights_rounded(q, k, v, false)
}

/// [`attend`], with each query's softmax weights optionally rounded to 8
/// bits (255 levels up to the largest), as integer weighted sums would
/// take them.
fn attend_weights_rounded(q: &[f32], k: &[f32], v: &[f32], round_weights: bool) -> Vec<f64> {
    let scale = 1.0 / (D as f64).sqrt();
    let mut out = Vec::new();
    for q in q.chunks_exact(D) {
        let s: Vec<f64> = k
            .chunks_exact(D)
            .map(|k| {
                scale
                    * q.iter()
                        .zip(k)
                        .map(|(a, b)| f64::from(*a) * f64::from(*b))
                        .sum::<f64>()
            })
            .collect();
        let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let mut w: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let total: f64 = w.iter().sum();
        if round_weights {
            // The largest weight is exp(0) = 1.
            w.iter_mut().for_each(|w| *w = (*w * 255.0).round() / 255.0);
        }
        for d in 0..D {
            out.push(
                w.iter()
                    .zip(v.chunks_exact(D))
                    .map(|(w, v)| w * f64::from(v[d]))
                    .sum::<f64>()
                    / total,
            );
        }
    }
    out
}

/// `x` rounded as `dtype` stores it with a scale per `group` values
/// (`D` = per row).
fn rounded(dtype: KvDtype, x: &[f32], group: usize) -> Vec<f32> {
    let mut y = x.to_vec();
    y.chunks_mut(group).for_each(|g| dtype.round_trip_row(g));
    y
}

/// Relative error in the 2-norm, and the largest absolute error.
fn errors(got: &[f64], want: &[f64]) -> (f64, f64) {
    let num: f64 = got.iter().zip(want).map(|(a, b)| (a - b).powi(2)).sum();
    let den: f64 = want.iter().map(|b| b * b).sum();
    let max = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    ((num / den).sqrt(), max)
}

#[test]
#[cfg_attr(miri, ignore = "numeric measurement, too slow under Miri")]
fn eight_bit_kv_error_against_the_f64_oracle() {
    let mut rng = Rng::new(41);
    let gauss =
        |rng: &mut Rng, n: usize| -> Vec<f32> { (0..n).map(|_| normal(rng) as f32).collect() };
    let q = gauss(&mut rng, QUERIES * D);
    let v = gauss(&mut rng, KEYS * D);
    let plain = gauss(&mut rng, KEYS * D);
    // Channels 3, 40 and 97 of every key 20x the rest.
    let mut outliers = plain.clone();
    for k in outliers.chunks_exact_mut(D) {
        for c in [3, 40, 97] {
            k[c] *= 20.0;
        }
    }
    println!("| keys | dtype | scale per | rel L2 error | max abs error |");
    println!("| --- | --- | --- | --- | --- |");
    let mut errs = std::collections::HashMap::new();
    for (dist, k) in [("Gaussian", &plain), ("outlier channels", &outliers)] {
        // Queries of the same spread as the keys' typical channels.
        let want = attend(&q, k, &v);
        let cases = [
            (KvDtype::F16, D, "element"),
            (KvDtype::Bf16, D, "element"),
            (KvDtype::I8, D, "row (kvslice)"),
            (KvDtype::I8, 32, "32 values"),
            (KvDtype::F8E4M3, D, "row (kvslice)"),
            (KvDtype::F8E4M3, 32, "32 values"),
        ];
        for (dtype, group, per) in cases {
            let got = attend(&q, &rounded(dtype, k, group), &rounded(dtype, &v, group));
            let (e, max) = errors(&got, &want);
            println!(
                "| {dist} | {} | {per} | {e:.2e} | {max:.2e} |",
                dtype.name()
            );
            errs.insert((dist, dtype.name(), group), e);
        }
        // What integer dot products over int8 codes would add: queries
        // rounded to int8 with a scale per row (llama.cpp's q8_0
        // activations), then the softmax weights rounded to 8 bits too.
        let (k8, v8, q8) = (
            rounded(KvDtype::I8, k, D),
            rounded(KvDtype::I8, &v, D),
            rounded(KvDtype::I8, &q, D),
        );
        for (per, weights) in [
            ("row, int8 queries", false),
            ("row, int8 queries and 8-bit weights", true),
        ] {
            let got = attend_weights_rounded(&q8, &k8, &v8, weights);
            let (e, max) = errors(&got, &want);
            println!("| {dist} | int8 | {per} | {e:.2e} | {max:.2e} |");
            assert!(
                e < 3.0 * errs[&(dist, KvDtype::I8.name(), D)],
                "{dist}, {per}: {e}"
            );
        }
    }
    // Bounds with a margin over the measured figures. Gaussian rows stay
    // within a few percent, int8 finer than E4M3 (7 significant bits
    // against 4). Outlier channels set a row's scale, so the other
    // channels get fewer levels: up to 10% with a scale per row, about
    // half that with a scale per 32 values, which never do worse.
    for (dist, i8_bound, f8_bound) in [("Gaussian", 2e-2, 6e-2), ("outlier channels", 0.15, 0.12)] {
        let e = |dt: KvDtype, g: usize| errs[&(dist, dt.name(), g)];
        assert!(e(KvDtype::F16, D) < 2e-3, "{dist}");
        assert!(
            e(KvDtype::I8, D) < i8_bound,
            "{dist}: int8 {}",
            e(KvDtype::I8, D)
        );
        assert!(
            e(KvDtype::F8E4M3, D) < f8_bound,
            "{dist}: fp8 {}",
            e(KvDtype::F8E4M3, D)
        );
        if dist == "Gaussian" {
            assert!(e(KvDtype::I8, D) < e(KvDtype::F8E4M3, D), "{dist}");
        }
        for dt in [KvDtype::I8, KvDtype::F8E4M3] {
            assert!(e(dt, 32) <= e(dt, D) * 1.05, "{dist} {dt:?}: blocks of 32");
        }
    }
}
