//! The prefetch schedule: which lines of the next region to fetch while
//! a kernel computes this one, one burst or line for line with its
//! loads (shared with the AVX-512 and VNNI sets).

use std::arch::x86_64::*;
use std::marker::PhantomData;

/// Every line of `bytes` at once: the [`Ahead`] walk in one burst, so it
/// covers the same lines (the first byte's line onward).
pub(super) fn prefetch(bytes: &[u8]) {
    Ahead::new(bytes, 1).step();
}

/// Prefetches the line holding `at` (callers pass addresses inside a
/// slice they hold).
fn prefetch_at(at: *const u8) {
    #[cfg(test)]
    super::tests::FETCHED.with(|lines| lines.borrow_mut().push(at as usize / 64));
    // SAFETY: a prefetch is a hint with no architectural effect; it never
    // faults, whatever the address. SSE is part of x86-64.
    unsafe { _mm_prefetch::<_MM_HINT_T1>(at.cast()) };
}

/// The cache lines of `ahead`, prefetched in bursts of equal size spread
/// over a kernel's loop: ⌈lines / `steps`⌉ per call to [`Ahead::step`], so
/// all of them within `steps` calls, and the next page arrives while this
/// one is computed without filling every line-fill buffer at once. A step
/// costs a few compares when nothing is left: kernels call it every
/// iteration, so it walks addresses instead of slice iterators.
pub(in crate::kernels) struct Ahead<'a> {
    next: *const u8,
    end: *const u8,
    /// Bytes per burst, whole lines.
    burst: usize,
    /// The walked region stays borrowed while the walk lives.
    region: PhantomData<&'a [u8]>,
}

impl<'a> Ahead<'a> {
    pub(in crate::kernels) fn new(ahead: &'a [u8], steps: usize) -> Self {
        let (next, end) = line_walk(ahead);
        Self {
            next,
            end,
            // Spread over every step, the last included: bursts rounded
            // to a power of two of steps (a shift instead of this
            // division) finished early, and the miss buffers then idled
            // until the next region's kernel (docs/notes/cpu-decode.md).
            burst: lines(ahead).div_ceil(steps.max(1)) << 6,
            region: PhantomData,
        }
    }

    pub(in crate::kernels) fn step(&mut self) {
        let stop = self.end.min(self.next.wrapping_add(self.burst));
        while self.next < stop {
            prefetch_at(self.next);
            self.next = self.next.wrapping_add(64);
        }
    }
}

/// Regions prefetched alongside a kernel's segments, line for line:
/// while a kernel computes offset `o` of segment `s`, it prefetches offset
/// `o` of region `s`. Decode pairs a head's K (or V) in each page of a
/// span with the next head's in the same page, so the prefetches run
/// through memory in address order one head ahead, at the pace of the
/// loads they precede, for an instruction or two each (an [`Ahead`]
/// walk's loop cost cache-resident decode 11–17% of its time on a Zen 3;
/// docs/notes/cpu-decode.md). A segment without a region (the last span's
/// values) is paired with itself, re-fetching lines it holds already, so
/// kernels never branch on it.
#[derive(Clone, Copy)]
pub(in crate::kernels) struct Paired<'a> {
    regions: &'a [&'a [u8]],
}

impl<'a> Paired<'a> {
    pub(in crate::kernels) fn new(regions: &'a [&'a [u8]]) -> Self {
        Self { regions }
    }

    /// The region paired with segment `s`, whose `len` bytes start at
    /// `seg`: its first `len` bytes, or all of it where it is shorter.
    pub(in crate::kernels) fn region(self, s: usize, seg: *const u8, len: usize) -> PairedRegion {
        match self.regions.get(s) {
            Some(r) if !r.is_empty() => PairedRegion {
                base: r.as_ptr(),
                last: r.len().min(len).saturating_sub(1),
            },
            _ => PairedRegion {
                base: seg,
                last: len.saturating_sub(1),
            },
        }
    }
}

/// One segment's paired region: offsets into it, clamped to its last byte
/// so that the fetches stay within it whatever the segment's length.
#[derive(Clone, Copy)]
pub(in crate::kernels) struct PairedRegion {
    base: *const u8,
    last: usize,
}

impl PairedRegion {
    /// Prefetches the line holding offset `at` (or the last byte).
    #[inline]
    pub(in crate::kernels) fn fetch(self, at: usize) {
        prefetch_at(self.base.wrapping_add(at.min(self.last)));
    }

    /// Prefetches every line of offsets `from..to`, once each.
    #[inline]
    pub(in crate::kernels) fn fetch_lines(self, from: usize, to: usize) {
        if from >= to {
            return;
        }
        self.fetch(from);
        // The next line's first offset, then a line at a time.
        let mut at = from + 64 - self.base.wrapping_add(from) as usize % 64;
        while at < to {
            self.fetch(at);
            at += 64;
        }
    }
}

/// What a weighted sum's pass over a block of columns prefetches as it
/// walks the keys: an [`Ahead`] walk, a step every sixteen keys, or
/// [`Paired`] regions, their lines key by key ([`PairedPasses`]).
pub(in crate::kernels) trait PassPrefetch {
    /// A pass reaches a segment.
    fn segment(&mut self, at: PassAt);
    /// Before every sixteenth key of a segment, the first included.
    fn sixteen(&mut self);
    /// Before every key.
    fn key(&mut self);
    /// After the segment's last key.
    fn segment_end(&mut self);
}

/// Where a weighted sum's pass over columns stands: pass `pass` of
/// `passes` reaches segment `s`, `m` rows of `row` bytes at `seg`.
#[derive(Clone, Copy)]
pub(in crate::kernels) struct PassAt {
    pub(in crate::kernels) s: usize,
    pub(in crate::kernels) seg: *const u8,
    pub(in crate::kernels) m: usize,
    pub(in crate::kernels) row: usize,
    pub(in crate::kernels) pass: usize,
    pub(in crate::kernels) passes: usize,
}

impl PassPrefetch for Ahead<'_> {
    #[inline]
    fn segment(&mut self, _: PassAt) {}

    #[inline]
    fn sixteen(&mut self) {
        self.step();
    }

    #[inline]
    fn key(&mut self) {}

    #[inline]
    fn segment_end(&mut self) {}
}

/// [`Paired`] regions for a weighted sum: pass `p` of `P` over a segment
/// of `m` rows of `row` bytes fetches, key by key, the lines of offsets
/// `p·m·t + k·t .. p·m·t + (k + 1)·t` of its region, `t = ⌈row / P⌉` (a
/// half line for AVX2's 16-bit values, whose passes take 32 of a row's
/// bytes, so one fetch per key; two lines for AVX-512's, whose 64-column
/// passes take 128), and the last pass ends with the last line (which the
/// last offset can fall short of), so that all the passes together cover
/// the region's first `m` rows in address order.
pub(in crate::kernels) struct PairedPasses<'a> {
    pairs: Paired<'a>,
    region: PairedRegion,
    at: usize,
    stride: usize,
    last_pass: bool,
}

impl<'a> PairedPasses<'a> {
    pub(in crate::kernels) fn new(pairs: Paired<'a>) -> Self {
        Self {
            pairs,
            region: PairedRegion {
                base: std::ptr::null(),
                last: 0,
            },
            at: 0,
            stride: 0,
            last_pass: false,
        }
    }
}

impl PassPrefetch for PairedPasses<'_> {
    #[inline]
    fn segment(&mut self, at: PassAt) {
        let PassAt {
            s,
            seg,
            m,
            row,
            pass,
            passes,
        } = at;
        self.region = self.pairs.region(s, seg, m * row);
        self.stride = row.div_ceil(passes);
        self.at = pass * m * self.stride;
        self.last_pass = pass + 1 == passes;
    }

    #[inline]
    fn sixteen(&mut self) {}

    #[inline]
    fn key(&mut self) {
        // One fetch where a key's stride fits in a line (AVX2's passes, the
        // hot case), without `fetch_lines`' line arithmetic.
        if self.stride <= 64 {
            self.region.fetch(self.at);
        } else {
            self.region.fetch_lines(self.at, self.at + self.stride);
        }
        self.at += self.stride;
    }

    #[inline]
    fn segment_end(&mut self) {
        if self.last_pass {
            self.region.fetch(self.region.last);
        }
    }
}

/// Cache lines `region` touches.
fn lines(region: &[u8]) -> usize {
    let (start, end) = line_walk(region);
    (end as usize - start as usize).div_ceil(64)
}

/// Where a walk over `region`'s lines starts (the line holding its first
/// byte, so that a region that does not start on a line boundary still
/// has its last line prefetched) and ends; empty for an empty region.
fn line_walk(region: &[u8]) -> (*const u8, *const u8) {
    let range = region.as_ptr_range();
    if region.is_empty() {
        return (range.end, range.end);
    }
    (
        range.start.wrapping_sub(range.start as usize % 64),
        range.end,
    )
}
