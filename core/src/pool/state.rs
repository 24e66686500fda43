//! The packed per-page state word: generation, reference count, lifecycle.
//!
//! ```text
//!  63                32 31                 2 1  0
//! +--------------------+--------------------+----+
//! |     generation     | references | link  |life|
//! +--------------------+--------------------+----+
//! ```
//!
//! A Free page has no references, so the same 30 bits hold its free-list
//! link instead (the slot, index + 1, of the page below it; 0 ends the
//! list). The whole of a page's metadata is this one word.
//!
//! Fields are read and written through [`Field`], never with ad-hoc shifts.

/// One bit field of a `u64` word.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Field {
    shift: u32,
    bits: u32,
}

impl Field {
    const fn new(shift: u32, bits: u32) -> Self {
        Self { shift, bits }
    }

    pub(crate) const fn max(self) -> u64 {
        (1u64 << self.bits) - 1
    }

    const fn mask(self) -> u64 {
        self.max() << self.shift
    }

    pub(crate) const fn get(self, word: u64) -> u64 {
        (word & self.mask()) >> self.shift
    }

    /// `word` with this field set to `value` (which must fit).
    pub(crate) const fn set(self, word: u64, value: u64) -> u64 {
        debug_assert!(value <= self.max());
        (word & !self.mask()) | (value << self.shift)
    }
}

const LIFE: Field = Field::new(0, 2);
const REFS: Field = Field::new(2, 30);
const GENERATION: Field = Field::new(32, 32);

/// Where a page is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Life {
    /// On the free list.
    Free = 0,
    /// Handed to one writer; not visible to anyone else.
    Filling = 1,
    /// Published and immutable; readers take references.
    Cached = 2,
    /// Being removed; no new references can be taken.
    Evicting = 3,
}

impl Life {
    const fn from_bits(bits: u64) -> Self {
        match bits {
            0 => Life::Free,
            1 => Life::Filling,
            2 => Life::Cached,
            _ => Life::Evicting,
        }
    }
}

/// Unpacked view of a state word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PageState {
    pub(crate) generation: u32,
    pub(crate) refs: u32,
    pub(crate) life: Life,
}

impl PageState {
    /// The most references a page can carry.
    pub(crate) const MAX_REFS: u32 = REFS.max() as u32;

    /// The fields of `word`. A Free page has no references: its link bits
    /// read as `refs == 0` here (use [`PageState::link`] for the link).
    pub(crate) const fn unpack(word: u64) -> Self {
        let life = Life::from_bits(LIFE.get(word));
        Self {
            generation: GENERATION.get(word) as u32,
            refs: match life {
                Life::Free => 0,
                _ => REFS.get(word) as u32,
            },
            life,
        }
    }

    pub(crate) const fn pack(self) -> u64 {
        let w = GENERATION.set(0, self.generation as u64);
        let w = REFS.set(w, self.refs as u64);
        LIFE.set(w, self.life as u64)
    }

    /// The word of a Free page of `generation` whose free-list link is
    /// `link`.
    pub(crate) const fn free(generation: u32, link: u32) -> u64 {
        PageState {
            generation,
            refs: link,
            life: Life::Free,
        }
        .pack()
    }

    /// The free-list link of a Free page's word.
    pub(crate) const fn link(word: u64) -> u32 {
        REFS.get(word) as u32
    }

    /// The most pages a pool can hold: links must fit the field.
    pub(crate) const MAX_PAGES: u32 = REFS.max() as u32 - 1;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_round_trips_at_the_edges() {
        for generation in [0, 1, u32::MAX] {
            for refs in [0, 1, PageState::MAX_REFS] {
                for life in [Life::Filling, Life::Cached, Life::Evicting] {
                    let s = PageState {
                        generation,
                        refs,
                        life,
                    };
                    assert_eq!(PageState::unpack(s.pack()), s);
                }
            }
        }
        assert_eq!(PageState::MAX_REFS, (1 << 30) - 1);
        for link in [0, 1, PageState::MAX_PAGES + 1] {
            let w = PageState::free(7, link);
            assert_eq!(PageState::link(w), link);
            assert_eq!(
                PageState::unpack(w),
                PageState {
                    generation: 7,
                    refs: 0,
                    life: Life::Free
                }
            );
        }
    }
}
