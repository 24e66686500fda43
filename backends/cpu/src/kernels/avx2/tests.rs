//! The AVX2 set against the scalar kernels.

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
        eprintln!("AVX-512's kernels not checked: this CPU lacks it (CI checks them under Bochs)");
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
