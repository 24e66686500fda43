//! The shape checks every instruction set's safe wrappers make before
//! their unsafe loops, stated once. Products are checked, so a product
//! that would overflow fails the check instead of wrapping past it.

/// Whether a slice of `len` elements holds the product of `dims` (false if
/// the product overflows).
fn holds(len: usize, dims: &[usize]) -> bool {
    dims.iter()
        .try_fold(1usize, |a, &b| a.checked_mul(b))
        .is_some_and(|need| len >= need)
}

/// The row width `d` of a scores call over `rows` query rows (`q` elements
/// in all) against `n` keys of `k` units (bytes, or 1 per f32) in `k_len`,
/// writing `rows·n` scores into `out_len`.
///
/// # Panics
/// If any buffer is too short for those shapes.
pub(super) fn scores_width(
    q_len: usize,
    rows: usize,
    k_len: usize,
    k_unit: usize,
    n: usize,
    out_len: usize,
) -> usize {
    let d = q_len / rows.max(1);
    assert!(
        holds(k_len, &[n, d, k_unit]) && holds(out_len, &[rows, n]) && holds(q_len, &[rows, d]),
        "scores: shapes"
    );
    d
}

/// The row width `d` of a weighted sum of `n` value rows (`v_len` in units
/// of `v_unit` each) into `rows` accumulators (`acc_len` elements) with
/// `rows·n` weights in `p_len`.
///
/// # Panics
/// If any buffer is too short for those shapes.
pub(super) fn weighted_sum_width(
    p_len: usize,
    rows: usize,
    v_len: usize,
    v_unit: usize,
    n: usize,
    acc_len: usize,
) -> usize {
    let d = acc_len / rows.max(1);
    assert!(
        holds(p_len, &[rows, n]) && holds(v_len, &[n, d, v_unit]) && holds(acc_len, &[rows, d]),
        "weighted_sum: shapes"
    );
    d
}

/// Keys in the segments of `segs`, each of whole rows of `row` bytes (a
/// span's blocks; the x86 four-row kernels take them).
///
/// # Panics
/// If `row` is 0 or a segment ends inside a row.
#[cfg(target_arch = "x86_64")]
pub(super) fn whole_keys(segs: &[&[u8]], row: usize) -> usize {
    assert!(row > 0, "segments: empty rows");
    segs.iter()
        .map(|seg| {
            let keys = key_count(seg.len(), row);
            assert_eq!(
                keys * row,
                seg.len(),
                "segments: not whole rows of {row} bytes"
            );
            keys
        })
        .sum()
}

/// Each segment of `segs` as its first byte and its count of whole rows
/// of `row` bytes, in order (how the x86 kernels walk a span's blocks).
#[cfg(target_arch = "x86_64")]
pub(super) fn segment_rows<'s>(
    segs: &'s [&'s [u8]],
    row: usize,
) -> impl Iterator<Item = (*const u8, usize)> + 's {
    segs.iter()
        .map(move |seg| (seg.as_ptr(), key_count(seg.len(), row)))
}

/// Rows of `row` bytes in `len` bytes, rounded down (a shift for the
/// power-of-two rows of common shapes, as kernels count per segment on
/// every call).
#[cfg(target_arch = "x86_64")]
#[inline]
pub(super) fn key_count(len: usize, row: usize) -> usize {
    if row.is_power_of_two() {
        len >> row.trailing_zeros()
    } else {
        len / row.max(1)
    }
}

/// The head width `d` and key count `n` of a four-row `scores_softmax`
/// call: four query rows (`q_len` elements) against the keys of the
/// segments of `keys` (`unit` bytes per element), into `weights_len`
/// weights and a softmax state of `max_len`, `sum_len` and `rescale_len`.
///
/// # Panics
/// If `d` is not a multiple of 8, a segment ends inside a row, or any
/// buffer is too short for those shapes.
#[cfg(target_arch = "x86_64")]
pub(super) fn four_row_scores(
    q_len: usize,
    keys: &[&[u8]],
    unit: usize,
    weights_len: usize,
    [max_len, sum_len, rescale_len]: [usize; 3],
) -> (usize, usize) {
    let d = q_len / 4;
    assert!(
        d.is_multiple_of(8),
        "four-row kernels: head width {d} is not a multiple of 8"
    );
    let n = whole_keys(keys, d * unit);
    check_softmax(weights_len, 4, n, sum_len, rescale_len);
    assert!(max_len >= 4, "four-row scores_softmax: shapes");
    (d, n)
}

/// The head width `d`, block length `bt` and key count `n` of a four-row
/// dim-major `scores_softmax` call: four query rows (`q_len` elements)
/// against the segments of `keys`, each one whole block of `bt` keys
/// stored `[d][bt]` (`unit` bytes per element), `bt` a multiple of 16,
/// into `weights_len` weights and a softmax state of four rows.
///
/// # Panics
/// If the segments are not whole blocks of one length, `bt` is not a
/// multiple of 16, or any buffer is too short for those shapes.
#[cfg(target_arch = "x86_64")]
pub(super) fn four_row_dim_major(
    q_len: usize,
    keys: &[&[u8]],
    unit: usize,
    weights_len: usize,
    [max_len, sum_len, rescale_len]: [usize; 3],
) -> (usize, usize, usize) {
    let d = q_len / 4;
    let block = keys.first().map_or(0, |k| k.len());
    let bt = block / (d * unit).max(1);
    assert!(
        d > 0
            && bt.is_multiple_of(16)
            && bt * d * unit == block
            && keys.iter().all(|k| k.len() == block),
        "four-row dim-major kernels: segments are not whole blocks of a multiple of 16 keys"
    );
    let n = bt
        .checked_mul(keys.len())
        .expect("four-row dim-major kernels: key count overflows");
    check_softmax(weights_len, 4, n, sum_len, rescale_len);
    assert!(max_len >= 4, "four-row scores_softmax: shapes");
    (d, bt, n)
}

/// The scales of a four-row scores call over `n` keys as a pointer to
/// their first, or null where `scales` is empty (an unscaled dtype).
///
/// # Panics
/// If `scales` is neither empty nor `n` long.
#[cfg(target_arch = "x86_64")]
pub(super) fn key_scales(scales: &[f32], n: usize) -> *const f32 {
    assert!(
        scales.is_empty() || scales.len() == n,
        "four-row kernels: {} scales for {n} keys",
        scales.len()
    );
    if scales.is_empty() {
        std::ptr::null()
    } else {
        scales.as_ptr()
    }
}

/// The head width `d` and value count `n` of a four-row `weighted_sum`
/// call: the rows of the segments of `values` (`unit` bytes per element)
/// into four accumulators (`acc_len` elements) with `p_len` weights.
///
/// # Panics
/// If a segment ends inside a row, or any buffer is too short for those
/// shapes.
#[cfg(target_arch = "x86_64")]
pub(super) fn four_row_weighted_sum(
    p_len: usize,
    values: &[&[u8]],
    unit: usize,
    acc_len: usize,
) -> (usize, usize) {
    let d = acc_len / 4;
    let row = d * unit;
    let n = whole_keys(values, row);
    weighted_sum_width(p_len, 4, n * row, unit, n, acc_len);
    (d, n)
}

/// Checks a softmax block of `rows` rows of `n` scores (`s_len`) with
/// `sum_len` sums and `rescale_len` factors.
///
/// # Panics
/// If any buffer is too short for those shapes.
pub(super) fn check_softmax(
    s_len: usize,
    rows: usize,
    n: usize,
    sum_len: usize,
    rescale_len: usize,
) {
    assert!(
        holds(s_len, &[rows, n]) && sum_len >= rows && rescale_len >= rows,
        "softmax_rows: shapes"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn products_that_overflow_fail_the_check() {
        assert!(holds(12, &[3, 4]) && !holds(11, &[3, 4]));
        assert!(!holds(usize::MAX, &[usize::MAX, 2]));
        assert_eq!(scores_width(8, 2, 24, 2, 3, 6), 4);
        // No rows: only `n·d·2` (which wraps to 0) stands between this call
        // and a pass.
        let wrapped = std::panic::catch_unwind(|| scores_width(2, 0, 0, 2, usize::MAX / 2 + 1, 0));
        assert!(wrapped.is_err(), "a wrapped n·d must not pass");
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn segments_count_whole_rows_and_refuse_partial_ones() {
        let bytes = [0u8; 96];
        assert_eq!(whole_keys(&[&bytes[..32], &bytes[32..]], 32), 3);
        assert_eq!(whole_keys(&[&bytes[..24], &[], &bytes[..48]], 24), 3);
        assert_eq!(whole_keys(&[], 32), 0);
        let partial = std::panic::catch_unwind(|| whole_keys(&[&bytes[..40]], 32));
        assert!(
            partial.is_err(),
            "a segment ending inside a row must not pass"
        );
        assert!(std::panic::catch_unwind(|| whole_keys(&[&bytes[..0]], 0)).is_err());
    }
}
