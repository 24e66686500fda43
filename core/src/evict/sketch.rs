//! A count-min sketch of 4-bit counters with periodic halving: TinyLFU's
//! estimate of how often a key was seen recently, in a few bytes per page.

use alloc::vec;
use alloc::vec::Vec;

const ROWS: usize = 4;
const SEEDS: [u64; ROWS] = [
    0x9e37_79b9_7f4a_7c15,
    0xc2b2_ae3d_27d4_eb4f,
    0x1656_67b1_9e37_79f9,
    0x27d4_eb2f_1656_67c5,
];

#[derive(Debug)]
pub(super) struct Sketch {
    /// Counters, two per byte.
    table: Vec<u8>,
    mask: usize,
    samples: u64,
    period: u64,
}

impl Sketch {
    /// Room for about `items` distinct keys; halves every `period` samples.
    pub(super) fn new(items: u32, period: u64) -> Self {
        let width = (items as usize).max(64).next_power_of_two();
        Self {
            table: vec![0; width * ROWS / 2],
            mask: width - 1,
            samples: 0,
            period: period.max(1),
        }
    }

    fn slot(&self, fp: u64, row: usize) -> (usize, u32) {
        let h = (fp ^ (fp >> 29)).wrapping_mul(SEEDS[row]);
        let i = row * (self.mask + 1) + ((h >> 32) as usize & self.mask);
        (i / 2, (i as u32 & 1) * 4)
    }

    pub(super) fn estimate(&self, fp: u64) -> u8 {
        (0..ROWS)
            .map(|r| {
                let (b, shift) = self.slot(fp, r);
                (self.table[b] >> shift) & 0xf
            })
            .min()
            .unwrap_or(0)
    }

    pub(super) fn increment(&mut self, fp: u64) {
        for r in 0..ROWS {
            let (b, shift) = self.slot(fp, r);
            if (self.table[b] >> shift) & 0xf < 15 {
                self.table[b] += 1 << shift;
            }
        }
        self.samples += 1;
        if self.samples >= self.period {
            // Age: halve every counter, so old popularity fades.
            for b in &mut self.table {
                *b = (*b >> 1) & 0x77;
            }
            self.samples /= 2;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_saturate_and_age() {
        let mut s = Sketch::new(1024, 1_000_000);
        for _ in 0..20 {
            s.increment(42);
        }
        s.increment(7);
        assert_eq!(s.estimate(42), 15);
        assert_eq!(s.estimate(7), 1);
        assert_eq!(s.estimate(99), 0);
        let mut aging = Sketch::new(1024, 10);
        for _ in 0..9 {
            aging.increment(5);
        }
        assert_eq!(aging.estimate(5), 9);
        aging.increment(6); // the 10th sample halves everything
        assert_eq!((aging.estimate(5), aging.estimate(6)), (4, 0));
    }
}
