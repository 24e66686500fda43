//! Every kernel set this CPU supports against plain arithmetic, the widened
//! path and each other, and the set selection.

use super::*;

/// The Zen 4 check decodes cpuid as Linux does: vendor "AuthenticAMD"
/// and family 25 (19h) in /proc/cpuinfo.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[test]
fn zen_4_check_agrees_with_proc_cpuinfo() {
    let info = std::fs::read_to_string("/proc/cpuinfo").expect("/proc/cpuinfo");
    let field = |name: &str| {
        info.lines()
            .find(|l| l.split(':').next().is_some_and(|k| k.trim() == name))
            .and_then(|l| l.split(':').nth(1))
            .map(|v| v.trim().to_string())
            .unwrap_or_else(|| panic!("no {name:?} in /proc/cpuinfo"))
    };
    let want = field("vendor_id") == "AuthenticAMD" && field("cpu family") == "25";
    assert_eq!(avx512::splits_512_bit_ops(), want);
    let names: Vec<_> = Kernels::supported().iter().map(|k| k.name).collect();
    // The VNNI set, where the CPU has it, comes first, built on the
    // set that follows it.
    let after_vnni = match names.first() {
        Some(&vnni::SPLIT_NAME) => &names[1..],
        _ => &names[..],
    };
    if want && avx512::kernels().is_some() {
        assert_eq!(
            after_vnni[..3],
            [SPLIT_512_NAME, avx2::kernels().unwrap().name, avx512::NAME],
            "Zen 4 takes AVX2's set with AVX-512's weighted sum and dim-major scores first"
        );
    } else {
        assert!(!names.contains(&SPLIT_512_NAME), "{names:?}");
    }
}

/// Every set this CPU runs, and each with its E4M3 kernels on bf16 dot
/// products in place, where it has them.
fn all() -> Vec<Kernels> {
    let sets = Kernels::supported();
    #[cfg(target_arch = "x86_64")]
    let sets = {
        let bf16: Vec<Kernels> = sets.iter().filter_map(bf16_dot::in_place).collect();
        sets.into_iter().chain(bf16).collect()
    };
    sets
}

#[test]
fn kernels_agree_with_plain_arithmetic() {
    for n in [1usize, 7, 8, 9, 16, 31, 128, 130] {
        let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
        let want: f64 = a
            .iter()
            .zip(&b)
            .map(|(x, y)| f64::from(*x) * f64::from(*y))
            .sum();
        for k in all() {
            let got = (k.dot)(&a, &b);
            assert!((f64::from(got) - want).abs() < 1e-4, "{} dot n={n}", k.name);
            let mut e: Vec<f32> = a.iter().map(|x| x * 30.0 - 20.0).collect();
            let want_e: Vec<f64> = e.iter().map(|x| f64::from(*x).exp()).collect();
            (k.exp)(&mut e);
            for (g, w) in e.iter().zip(&want_e) {
                assert!(
                    (f64::from(*g) - w).abs() <= 2e-7 * w.abs() + 1e-37,
                    "{} exp: {g} vs {w}",
                    k.name
                );
            }
            // Matrix kernels against the row-at-a-time ones, with key
            // counts that split every way a four-row group splits
            // them (threes, threes and one or two pairs, a lone key).
            for (rows, keys) in [1usize, 3, 4, 5]
                .into_iter()
                .flat_map(|r| [1usize, 2, 3, 4, 5, 6, 7, 16, 17].map(|k| (r, k)))
            {
                let q: Vec<f32> = (0..rows * n).map(|i| (i as f32 * 0.7).sin()).collect();
                let kk: Vec<f32> = (0..keys * n).map(|i| (i as f32 * 0.3).cos()).collect();
                let mut s = vec![0f32; rows * keys];
                (k.scores)(&q, rows, &kk, keys, &mut s, &[]);
                let mut acc = vec![0.5f32; rows * n];
                let mut want_acc = acc.clone();
                (k.weighted_sum)(&s, rows, &kk, keys, &mut acc, &[]);
                for r in 0..rows {
                    for j in 0..keys {
                        let want = (Kernels::scalar().dot)(
                            &q[r * n..(r + 1) * n],
                            &kk[j * n..(j + 1) * n],
                        );
                        assert!((s[r * keys + j] - want).abs() < 1e-4, "{} scores", k.name);
                        (Kernels::scalar().axpy)(
                            &mut want_acc[r * n..(r + 1) * n],
                            s[r * keys + j],
                            &kk[j * n..(j + 1) * n],
                        );
                    }
                }
                for (x, y) in acc.iter().zip(&want_acc) {
                    assert!(
                        (x - y).abs() < 1e-3 * (1.0 + y.abs()),
                        "{} weighted_sum rows={rows} n={n}",
                        k.name
                    );
                }
            }
            let mut acc = b.clone();
            (k.axpy)(&mut acc, 0.5, &a);
            for i in 0..n {
                assert!(
                    (acc[i] - (b[i] + 0.5 * a[i])).abs() < 1e-6,
                    "{} axpy",
                    k.name
                );
            }
            for dtype in KvDtype::ALL {
                let bytes = stored_bytes(dtype, &a);
                let mut out = vec![0f32; n];
                k.widen(dtype, &bytes, &mut out);
                assert_eq!(
                    out,
                    raw_values(dtype, &bytes),
                    "{} widen {dtype:?} n={n}",
                    k.name
                );
            }
        }
    }
}

/// `vals` as `dtype` stores them: encoded elements, or for a scaled
/// dtype codes the kernels read raw (int8 codes of `vals · 20`, E4M3
/// codes of `vals`).
fn stored_bytes(dtype: KvDtype, vals: &[f32]) -> Vec<u8> {
    match dtype {
        KvDtype::I8 => vals
            .iter()
            .map(|v| (v * 20.0).round().clamp(-127.0, 127.0) as i8 as u8)
            .collect(),
        KvDtype::F8E4M3 => vals
            .iter()
            .map(|v| kvslice_core::f8e4m3_from_f32(*v))
            .collect(),
        _ => {
            let mut bytes = vec![0u8; vals.len() * dtype.size_bytes()];
            dtype.encode_row(vals, &mut bytes).unwrap();
            bytes
        }
    }
}

/// What the kernels read from `bytes` of `dtype`: the decoded values,
/// or a scaled dtype's codes unscaled, E4M3 divided by [`raw_scale`].
fn raw_values(dtype: KvDtype, bytes: &[u8]) -> Vec<f32> {
    match dtype {
        KvDtype::I8 => bytes.iter().map(|&c| f32::from(c as i8)).collect(),
        KvDtype::F8E4M3 => bytes
            .iter()
            .map(|&c| kvslice_core::f8e4m3_to_f32(c) / raw_scale(dtype))
            .collect(),
        _ => {
            let mut out = vec![0f32; bytes.len() / dtype.size_bytes()];
            dtype.decode_row(bytes, &mut out).unwrap();
            out
        }
    }
}

/// The stored-row kernels (where the ISA has them) against the f32
/// kernels on the same rows widened first, for every encoding, row
/// counts on both sides of a register group and widths with tails.
#[test]
fn stored_kernels_agree_with_widened_rows() {
    let sets: Vec<Kernels> = all().into_iter().filter(|k| k.stored.is_some()).collect();
    if sets.is_empty() {
        eprintln!("no stored-row kernels on this CPU: nothing to compare");
    }
    for k in sets {
        stored_kernels_agree_in(k);
    }
}

fn stored_kernels_agree_in(k: Kernels) {
    let sk = k.stored.expect("a set with stored-row kernels");
    // Widths around the 8- and 16-lane steps and their tails.
    for d in [1usize, 7, 8, 16, 17, 20, 33, 40, 128] {
        for n in [1usize, 2, 3, 16, 17] {
            let vals: Vec<f32> = (0..n * d).map(|i| (i as f32 * 0.37).sin()).collect();
            let ahead = vec![0u8; 300];
            for dtype in KvDtype::ALL {
                let bytes = stored_bytes(dtype, &vals);
                let mut wide = vec![0f32; n * d];
                k.widen(dtype, &bytes, &mut wide);
                for rows in [1usize, 3, 4, 5, 9] {
                    let q: Vec<f32> = (0..rows * d).map(|i| (i as f32 * 0.7).cos()).collect();
                    let (mut want, mut got) = (vec![0f32; rows * n], vec![0f32; rows * n]);
                    (k.scores)(&q, rows, &wide, n, &mut want, &ahead);
                    (sk.scores)(dtype, &q, rows, &bytes, n, &mut got, &ahead);
                    let close = |a: &[f32], b: &[f32]| {
                        a.iter()
                            .zip(b)
                            .all(|(x, y)| (x - y).abs() <= 1e-5 * (1.0 + y.abs()))
                    };
                    assert!(
                        close(&got, &want),
                        "{} scores {dtype:?} d={d} n={n} rows={rows}",
                        k.name
                    );
                    let (mut want_acc, mut acc) =
                        (vec![0.25f32; rows * d], vec![0.25f32; rows * d]);
                    (k.weighted_sum)(&want, rows, &wide, n, &mut want_acc, &ahead);
                    (sk.weighted_sum)(dtype, &want, rows, &bytes, n, &mut acc, &ahead);
                    assert!(
                        close(&acc, &want_acc),
                        "{} weighted_sum {dtype:?} d={d} n={n} rows={rows}",
                        k.name
                    );
                }
            }
        }
    }
}

/// One online-softmax block per kernel set against the definition, in
/// f64: rows whose max grows, holds, or starts from nothing, widths
/// with tails, and row counts around the four-row groups some sets use.
#[test]
fn softmax_rows_follow_the_definition() {
    for k in all() {
        for (n, rows) in [1usize, 5, 8, 16, 19]
            .into_iter()
            .flat_map(|n| [3usize, 4, 9].map(|rows| (n, rows)))
        {
            let s0: Vec<f32> = (0..rows * n)
                .map(|i| (i as f32 * 0.91).sin() * 4.0)
                .collect();
            // Rows in turn: starting empty, below their new max, above.
            let max0: Vec<f32> = (0..rows)
                .map(|r| [f32::NEG_INFINITY, -1.0, 10.0][r % 3])
                .collect();
            let sum0: Vec<f32> = (0..rows).map(|r| [0.0, 2.5, 3.0][r % 3]).collect();
            let (mut s, mut max, mut sum, mut rescale) =
                (s0.clone(), max0.clone(), sum0.clone(), vec![0f32; rows]);
            (k.softmax_rows)(&mut s, n, &mut max, &mut sum, &mut rescale);
            for r in 0..rows {
                let row = &s0[r * n..(r + 1) * n];
                let m = row
                    .iter()
                    .map(|x| f64::from(*x))
                    .fold(f64::from(max0[r]), f64::max);
                assert_eq!(f64::from(max[r]), m, "{} max n={n} r={r}", k.name);
                let c = (f64::from(max0[r]) - m).exp();
                assert!(
                    (f64::from(rescale[r]) - c).abs() <= 1e-6 * c.max(1e-30),
                    "{} rescale",
                    k.name
                );
                if r % 3 == 2 {
                    assert_eq!(
                        rescale[r], 1.0,
                        "{}: a max that holds rescales by exactly 1",
                        k.name
                    );
                }
                // f32 rounding of `x − max` (up to 2^-24·|x − max|)
                // is the tolerance of each weight.
                let mut total = f64::from(sum0[r]) * c;
                for (j, x) in row.iter().enumerate() {
                    let e = (f64::from(*x) - m).exp();
                    total += e;
                    let got = f64::from(s[r * n + j]);
                    assert!(
                        (got - e).abs() <= 4e-6 * e + 1e-37,
                        "{} weight n={n} r={r}",
                        k.name
                    );
                }
                assert!(
                    (f64::from(sum[r]) - total).abs() <= 1e-6 * total,
                    "{} sum n={n} r={r}",
                    k.name
                );
            }
        }
    }
}

/// The dim-major four-row scores against the token-major ones on the
/// same keys: every encoding, head widths of 8 to 128, blocks of 16,
/// 32 and 48 keys, one to three blocks, and rows whose max starts from
/// nothing, holds or grows. The products are summed in another order,
/// so scores agree to rounding.
#[test]
fn dim_major_four_row_scores_agree_with_token_major() {
    for k in four_row_sets() {
        let fk = k.stored.unwrap().four_rows.unwrap();
        for (d, bt, blocks) in [
            (8, 16, 1),
            (16, 32, 2),
            (24, 16, 3),
            (128, 16, 4),
            (40, 48, 2),
            (512, 16, 1),
        ] {
            let n = bt * blocks;
            let vals: Vec<f32> = (0..n * d).map(|i| (i as f32 * 0.37).sin()).collect();
            // Keys dim-major within each block.
            let tvals = kvslice_core::testkit::dim_major_blocks(&vals, bt, d);
            let q: Vec<f32> = (0..4 * d).map(|i| (i as f32 * 0.7).cos() * 0.5).collect();
            for dtype in KvDtype::ALL {
                let es = dtype.size_bytes();
                let (tm, dm) = (stored_bytes(dtype, &vals), stored_bytes(dtype, &tvals));
                // Scaled dtypes: a scale per key, unlike its neighbours'.
                let scales: Vec<f32> = match dtype.is_scaled() {
                    true => (0..n).map(|j| 0.01 + 0.003 * (j % 7) as f32).collect(),
                    false => Vec::new(),
                };
                let tm: Vec<&[u8]> = tm.chunks(bt * d * es).collect();
                let dm: Vec<&[u8]> = dm.chunks(bt * d * es).collect();
                let ahead = vec![0u8; 4096];
                let ahead = [&ahead[..], &ahead[..100]];
                let case = format!("{} {dtype:?} d={d} bt={bt} blocks={blocks}", k.name);
                let max0 = [f32::NEG_INFINITY, -1.0, 10.0, 0.5];
                let sum0 = [0.0, 2.5, 3.0, 1.5];
                let run = |f: FourRowScoresSoftmaxFn, keys: &[&[u8]]| {
                    let mut w = vec![f32::NAN; 4 * n];
                    let (mut max, mut sum, mut rescale) = (max0, sum0, [0f32; 4]);
                    let state = SoftmaxState {
                        max: &mut max,
                        sum: &mut sum,
                        rescale: &mut rescale,
                    };
                    f(dtype, &q, keys, &scales, &mut w, state, &ahead);
                    (w, max, sum, rescale)
                };
                let (w, max, sum, rescale) = run(fk.scores_softmax, &tm);
                let (dw, dmax, dsum, drescale) = run(fk.scores_softmax_dim_major, &dm);
                // Where the dim-major kernel rounds the queries to bf16,
                // each score may move by `bound`: each weight, sum and
                // rescale by about twice that of itself (its score and
                // the max both move), the max by `bound`.
                let bound = match dtype == KvDtype::F8E4M3 && rounds_fp8_products(&k) {
                    true => (0..n)
                        .flat_map(|j| (0..4).map(move |i| (i, j)))
                        .map(|(i, j)| {
                            let codes = &stored_bytes(dtype, &vals[j * d..(j + 1) * d]);
                            scales[j] * bf16_bound(&q[i * d..(i + 1) * d], codes)
                        })
                        .fold(0f32, f32::max),
                    false => 0.0,
                };
                // Off by `rel` of itself and `abs`, beyond f32 rounding.
                let close = |a: f32, b: f32, rel: f32, abs: f32| {
                    (a - b).abs() <= 1e-5 * b.abs().max(1e-3) + rel * b.abs() + abs
                };
                let twice = 2.5 * bound;
                for i in 0..4 {
                    let (a, b) = (dmax[i], max[i]);
                    assert!(close(a, b, 0.0, bound), "{case}: max row {i}: {a} vs {b}");
                    let (a, b) = (drescale[i], rescale[i]);
                    assert!(
                        close(a, b, twice, 0.0),
                        "{case}: rescale row {i}: {a} vs {b}"
                    );
                    let (a, b) = (dsum[i], sum[i]);
                    assert!(close(a, b, twice, 0.0), "{case}: sum row {i}: {a} vs {b}");
                }
                for (j, (a, b)) in dw.iter().zip(&w).enumerate() {
                    assert!(close(*a, *b, twice, 0.0), "{case}: weight {j}: {a} vs {b}");
                }
            }
        }
    }
}

/// Whether `set`'s four-row weighted sum rounds int8 weights to 16
/// bits (the VNNI set's).
#[cfg(target_arch = "x86_64")]
fn rounds_int8_weights(set: &Kernels) -> bool {
    // The bf16 kernels are the VNNI set's, int8 and all.
    vnni::is_vnni_set(set) || bf16_dot::rounds_fp8_products(set)
}

/// No set outside x86-64 rounds them.
#[cfg(not(target_arch = "x86_64"))]
fn rounds_int8_weights(_: &Kernels) -> bool {
    false
}

/// Whether `set`'s four-row E4M3 kernels round the other side of each
/// product (queries, weights) to bf16 (the bf16 set's).
#[cfg(target_arch = "x86_64")]
fn rounds_fp8_products(set: &Kernels) -> bool {
    bf16_dot::rounds_fp8_products(set)
}

/// No set outside x86-64 rounds them.
#[cfg(not(target_arch = "x86_64"))]
fn rounds_fp8_products(_: &Kernels) -> bool {
    false
}

/// How far `Σ x_c · v_c`, `v` the raw values of E4M3 `codes`, may move
/// on bf16 dot products: each `x_c` rounded to bf16, off by at most 2^-8
/// of itself, and 2^-16 of each term more for the f32 sums' order.
fn bf16_bound(x: &[f32], codes: &[u8]) -> f32 {
    let raw = raw_values(KvDtype::F8E4M3, codes);
    let size: f32 = x.iter().zip(raw).map(|(x, v)| (x * v).abs()).sum();
    size * (1.0 / 256.0 + 1.0 / 65536.0)
}

/// The sets this CPU runs that have four-row kernels (none says so).
fn four_row_sets() -> Vec<Kernels> {
    let sets: Vec<Kernels> = all()
        .into_iter()
        .filter(|k| k.stored.is_some_and(|s| s.four_rows.is_some()))
        .collect();
    if sets.is_empty() {
        eprintln!("no four-row kernels on this CPU: nothing to compare");
    }
    sets
}

/// The four-row kernels (where the ISA has them) against the general
/// path they replace, scores, `softmax_rows` and the weighted sum with
/// row-major weights, for every encoding, key counts that split every
/// way the key groups split them, those keys as one segment or cut
/// into blocks (of 1, 16 or 5 keys and a shorter last one), and rows
/// whose max starts from nothing, holds or grows.
#[test]
fn four_row_kernels_agree_with_the_general_path() {
    for k in four_row_sets() {
        let (sk, fk) = (k.stored.unwrap(), k.stored.unwrap().four_rows.unwrap());
        for d in [8usize, 16, 24, 40, 64, 72, 128] {
            for n in [1usize, 2, 3, 4, 5, 6, 7, 16, 17, 64] {
                let vals: Vec<f32> = (0..n * d).map(|i| (i as f32 * 0.37).sin()).collect();
                let q: Vec<f32> = (0..4 * d).map(|i| (i as f32 * 0.7).cos() * 0.5).collect();
                let ahead = vec![0u8; 256];
                for dtype in KvDtype::ALL {
                    let bytes = stored_bytes(dtype, &vals);
                    let case = format!("{} {dtype:?} d={d} n={n}", k.name);
                    // General path: row-major scores, softmax, values.
                    let mut s = vec![0f32; 4 * n];
                    (sk.scores)(dtype, &q, 4, &bytes, n, &mut s, &ahead);
                    let max0 = [f32::NEG_INFINITY, -1.0, 10.0, 0.5];
                    let sum0 = [0.0, 2.5, 3.0, 1.5];
                    let (mut max, mut sum, mut rescale) = (max0, sum0, [0f32; 4]);
                    (k.softmax_rows)(&mut s, n, &mut max, &mut sum, &mut rescale);
                    let mut acc = vec![0.25f32; 4 * d];
                    (sk.weighted_sum)(dtype, &s, 4, &bytes, n, &mut acc, &ahead);
                    for block in [n, 1, 16, 5] {
                        let row = d * dtype.size_bytes();
                        let segs: Vec<&[u8]> = bytes.chunks(block * row).collect();
                        let ahead = [&ahead[..100], &ahead[130..]];
                        let case = format!("{case} blocks of {block}");
                        // Four-row path: key-major weights.
                        let mut w = vec![0f32; 4 * n];
                        let (mut fmax, mut fsum, mut frescale) = (max0, sum0, [0f32; 4]);
                        let state = SoftmaxState {
                            max: &mut fmax,
                            sum: &mut fsum,
                            rescale: &mut frescale,
                        };
                        (fk.scores_softmax)(dtype, &q, &segs, &[], &mut w, state, &ahead);
                        let mut facc = vec![0.25f32; 4 * d];
                        (fk.weighted_sum)(dtype, &w, &segs, &mut facc, &ahead);
                        // Both paths make the same products in the
                        // same order and the same per-lane `exp`: only
                        // the sums add the weights in another order.
                        assert_eq!((fmax, frescale), (max, rescale), "{case}: max, rescale");
                        for i in 0..4 {
                            let rel = (fsum[i] - sum[i]).abs() / sum[i];
                            assert!(rel <= 1e-6, "{case}: sum row {i} off by {rel:e}");
                            for j in 0..n {
                                assert_eq!(w[j * 4 + i], s[i * n + j], "{case}: weight {i},{j}");
                            }
                        }
                        // A max that held rescales by exactly 1 (row 2
                        // starts above every score, but int8's codes
                        // of 20 · vals may pass it).
                        if max[2] == max0[2] {
                            assert_eq!(frescale[2], 1.0, "{case}");
                        }
                        if dtype == KvDtype::I8 && rounds_int8_weights(&k) {
                            // Weights rounded to 16 bits against each
                            // row's largest: each off by at most half
                            // of 1/65535 of it, times a code of at
                            // most 127.
                            for i in 0..4 {
                                let top = (0..n).map(|j| w[j * 4 + i]).fold(0f32, f32::max);
                                let bound = top / 65535.0 * 0.5 * 127.0 * n as f32;
                                for c in i * d..(i + 1) * d {
                                    let err = (facc[c] - acc[c]).abs();
                                    let tol = bound + 1e-6 * acc[c].abs();
                                    assert!(err <= tol, "{case}: weighted sum {c}: {err:e}");
                                }
                            }
                        } else if dtype == KvDtype::F8E4M3 && rounds_fp8_products(&k) && d % 64 == 0
                        {
                            for i in 0..4 {
                                let w_i: Vec<f32> = (0..n).map(|j| w[j * 4 + i]).collect();
                                for c in 0..d {
                                    let col: Vec<u8> = (0..n).map(|j| bytes[j * d + c]).collect();
                                    let bound = bf16_bound(&w_i, &col);
                                    let at = i * d + c;
                                    let err = (facc[at] - acc[at]).abs();
                                    let tol = bound + 1e-6 * acc[at].abs();
                                    assert!(err <= tol, "{case}: weighted sum {at}: {err:e}");
                                }
                            }
                        } else {
                            assert_eq!(facc, acc, "{case}: weighted sum");
                        }
                    }
                }
            }
        }
    }
}

/// Every 8-bit code (E4M3's two NaN codes aside, never written) reads
/// as [`raw_values`] says through each set's stored-row kernels: a
/// score against a one-hot query is the code's raw value, exactly (−0
/// sums to +0 with the zeros beside it).
#[test]
fn stored_kernels_read_every_8_bit_code_exactly() {
    let d = 8;
    for dtype in [KvDtype::I8, KvDtype::F8E4M3] {
        let codes: Vec<u8> = (0..=255u8)
            .filter(|c| dtype == KvDtype::I8 || c & 0x7F != 0x7F)
            .collect();
        let want = raw_values(dtype, &codes);
        // Key j holds code j then zeros.
        let keys: Vec<u8> = codes
            .iter()
            .flat_map(|&c| [c, 0, 0, 0, 0, 0, 0, 0])
            .collect();
        let mut q = vec![0f32; d];
        q[0] = 1.0;
        let sets = all().into_iter().filter(|k| k.stored.is_some()).count();
        if sets == 0 {
            println!("SKIPPED: no kernel set on this CPU reads stored rows");
        }
        for k in all().into_iter().filter(|k| k.stored.is_some()) {
            let sk = k.stored.unwrap();
            let mut got = vec![f32::NAN; codes.len()];
            (sk.scores)(dtype, &q, 1, &keys, codes.len(), &mut got, &[]);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g, w, "{} {dtype:?} code {:#04x}", k.name, codes[i]);
            }
        }
    }
}

/// Every 16-bit pattern (normals, subnormals, ±0, ±inf, NaNs) widens to
/// the same f32 bits as the `half` crate, in every kernel set and at
/// every position of a vector (odd offsets exercise the tails).
#[test]
fn widening_is_exact_for_every_16_bit_pattern() {
    let bytes: Vec<u8> = (0..=u16::MAX).flat_map(u16::to_le_bytes).collect();
    for dtype in [KvDtype::F16, KvDtype::Bf16] {
        let mut want = vec![0f32; 1 << 16];
        dtype.decode_row(&bytes, &mut want).unwrap();
        for k in all() {
            for skip in [0usize, 3] {
                let mut got = vec![0f32; (1 << 16) - skip];
                k.widen(dtype, &bytes[2 * skip..], &mut got);
                for (i, (g, w)) in got.iter().zip(&want[skip..]).enumerate() {
                    let same = g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
                    assert!(
                        same,
                        "{} {dtype:?} pattern {:#06x}: {g} vs {w}",
                        k.name,
                        i + skip
                    );
                }
            }
        }
    }
}

/// Four-row weighted sums of int8 values under weights far below 1 (tiny
/// V scales times softmax weights): each set's result is the plain sum,
/// not zero, however small the weights (the byte kernels round weights
/// against their largest, which must not overflow).
#[test]
fn tiny_weights_are_summed_not_dropped() {
    let (d, n) = (64usize, 4usize);
    let codes: Vec<u8> = (0..n * d).map(|i| (i % 200) as u8).collect();
    let mut sets = 0;
    for scale in [1e-20f32, 1e-34, 1e-37, 1e-40] {
        let w: Vec<f32> = (0..4 * n).map(|i| scale * (1.0 + i as f32)).collect();
        // The sum, and the sum of its terms' magnitudes (terms may cancel).
        let (mut want, mut size) = (vec![0f64; 4 * d], vec![0f64; 4 * d]);
        for j in 0..n {
            for r in 0..4 {
                for c in 0..d {
                    let t = f64::from(w[j * 4 + r]) * f64::from(codes[j * d + c] as i8);
                    want[r * d + c] += t;
                    size[r * d + c] += t.abs();
                }
            }
        }
        for k in all() {
            let Some(fk) = k.stored.and_then(|s| s.four_rows) else {
                continue;
            };
            sets += 1;
            let mut acc = vec![0f32; 4 * d];
            (fk.weighted_sum)(KvDtype::I8, &w, &[&codes[..]], &mut acc, &[]);
            for (i, (&g, &e)) in acc.iter().zip(&want).enumerate() {
                let tol = 1e-3 * size[i] + 1e-45;
                assert!(
                    (f64::from(g) - e).abs() <= tol,
                    "{} scale {scale:e} element {i}: {g:e} vs {e:e}",
                    k.name
                );
            }
        }
    }
    if sets == 0 {
        println!("SKIPPED: no kernel set on this CPU has four-row kernels");
    }
}
