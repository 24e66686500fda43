//! Operation sequences on both sequence tables, in lockstep, against a
//! plain model: the same answers from [`SequenceMap`] and
//! [`FixedSequenceMap`] (but for the fixed one's capacity, which the model
//! predicts), every page handed out once, and sliding windows that release
//! exactly the blocks no later token sees.

use alloc::collections::{BTreeMap, BTreeSet};
use alloc::vec::Vec;

use arbitrary::Unstructured;

use super::small;
use crate::error::Error;
use crate::page::PageId;
use crate::sequence::{FixedSequenceMap, SeqId, SequenceMap, SequenceTable};

/// The fixed table's capacity: sequences, and pages per sequence.
const SEQS: usize = 4;
const BLOCKS: usize = 8;

#[derive(Default)]
struct Seq {
    pages: Vec<PageId>,
    len: usize,
}

/// Runs one sequence-table case. Panics if the tables disagree with each
/// other or with the model, or lose or repeat a page.
pub fn sequence_table(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let bt = small(&mut u, 1, 8);
    let mut heap = SequenceMap::new(bt);
    let mut fixed = FixedSequenceMap::<SEQS, BLOCKS>::new(bt);
    let mut model: BTreeMap<SeqId, Seq> = BTreeMap::new();
    let mut pushed: BTreeSet<PageId> = BTreeSet::new();
    let mut released: BTreeSet<PageId> = BTreeSet::new();
    let mut next_page = 0u32;
    while !u.is_empty() {
        // Few ids, so operations meet sequences that exist and ones that
        // do not.
        let seq = SeqId::from(small(&mut u, 0, 5));
        let known = model.contains_key(&seq);
        let unknown = Error::UnknownSequence(seq);
        match small(&mut u, 0, 6) {
            0 => {
                let want = if known {
                    Err(Error::DuplicateSequence(seq))
                } else {
                    Ok(())
                };
                let got = fixed.create(seq);
                if want.is_ok() && model.len() == SEQS {
                    assert!(matches!(got, Err(Error::CapacityExhausted(_))), "{got:?}");
                    continue;
                }
                assert_eq!(got, want);
                assert_eq!(heap.create(seq), want);
                if want.is_ok() {
                    model.insert(seq, Seq::default());
                }
            }
            1 => {
                // Now and then a placeholder, which is never handed out.
                let page = if small(&mut u, 0, 7) == 0 {
                    PageId::PLACEHOLDER
                } else {
                    next_page += 1;
                    PageId(next_page)
                };
                let got = fixed.push_page(seq, page);
                let Some(s) = model.get_mut(&seq) else {
                    assert_eq!(got, Err(unknown.clone()));
                    assert_eq!(heap.push_page(seq, page), Err(unknown.clone()));
                    continue;
                };
                if s.pages.len() == BLOCKS {
                    assert!(matches!(got, Err(Error::CapacityExhausted(_))), "{got:?}");
                    continue;
                }
                assert_eq!(got, Ok(()));
                assert_eq!(heap.push_page(seq, page), Ok(()));
                s.pages.push(page);
                if page != PageId::PLACEHOLDER {
                    pushed.insert(page);
                }
            }
            2 => {
                let n = match small(&mut u, 0, 9) {
                    0 => usize::MAX - small(&mut u, 0, 2) as usize,
                    _ => small(&mut u, 0, 2 * bt + 1) as usize,
                };
                let got = fixed.advance(seq, n);
                assert_eq!(heap.advance(seq, n), got);
                let Some(s) = model.get_mut(&seq) else {
                    assert_eq!(got, Err(unknown));
                    continue;
                };
                let room = s.pages.len() * bt as usize;
                match s.len.checked_add(n) {
                    None => assert!(matches!(got, Err(Error::Overflow(_))), "{got:?}"),
                    Some(len) if len > room => {
                        assert!(matches!(got, Err(Error::OutOfRange { .. })), "{got:?}");
                    }
                    Some(len) => {
                        assert_eq!(got, Ok(()));
                        s.len = len;
                    }
                }
            }
            3 => {
                let n = small(&mut u, 0, 3 * bt) as usize;
                let got = fixed.blocks_needed(seq, n);
                assert_eq!(heap.blocks_needed(seq, n), got);
                match model.get(&seq) {
                    None => assert_eq!(got, Err(unknown)),
                    Some(s) => {
                        let need = got.expect("known sequence");
                        // Just enough pages: `need` more hold `n` more
                        // tokens, one fewer would not.
                        let room = |pages: usize| pages * bt as usize >= s.len + n;
                        assert!(room(s.pages.len() + need));
                        assert!(need == 0 || !room(s.pages.len() + need - 1));
                    }
                }
            }
            4 => {
                let (mut from_fixed, mut from_heap) = (Vec::new(), Vec::new());
                let got = fixed.remove(seq, |p| from_fixed.push(p));
                assert_eq!(heap.remove(seq, |p| from_heap.push(p)), got);
                assert_eq!(from_fixed, from_heap);
                match model.remove(&seq) {
                    None => assert_eq!(got, Err(unknown)),
                    Some(s) => {
                        assert_eq!(got, Ok(()));
                        let held: Vec<PageId> = s
                            .pages
                            .into_iter()
                            .filter(|p| *p != PageId::PLACEHOLDER)
                            .collect();
                        assert_eq!(from_fixed, held);
                    }
                }
                record(&mut released, &from_fixed);
            }
            5 => {
                let block = small(&mut u, 0, BLOCKS as u32 + 1) as usize;
                let (mut from_fixed, mut from_heap) = (Vec::new(), Vec::new());
                let got = fixed.release_before(seq, block, |p| from_fixed.push(p));
                assert_eq!(heap.release_before(seq, block, |p| from_heap.push(p)), got);
                assert_eq!(from_fixed, from_heap);
                match model.get_mut(&seq) {
                    None => assert_eq!(got, Err(unknown)),
                    Some(s) => {
                        let upto = block.min(s.pages.len());
                        let want = take_before(&mut s.pages, upto);
                        assert_eq!(got, Ok(want.len()));
                        assert_eq!(from_fixed, want);
                    }
                }
                record(&mut released, &from_fixed);
            }
            _ => {
                let window = small(&mut u, 0, 3 * bt);
                let (mut from_fixed, mut from_heap) = (Vec::new(), Vec::new());
                let got = fixed.slide_window(seq, window, |p| from_fixed.push(p));
                assert_eq!(heap.slide_window(seq, window, |p| from_heap.push(p)), got);
                assert_eq!(from_fixed, from_heap);
                match model.get_mut(&seq) {
                    None => assert_eq!(got, Err(unknown)),
                    Some(_) if window == 0 => {
                        assert!(matches!(got, Err(Error::InvalidValue(_))), "{got:?}");
                    }
                    Some(s) => {
                        // The next token, at position `len`, sees
                        // `len + 1 - window..=len`: a block goes exactly
                        // when all its positions come before that.
                        let first_seen = (s.len + 1).saturating_sub(window as usize);
                        let bt = bt as usize;
                        let gone = s
                            .pages
                            .iter()
                            .enumerate()
                            .filter(|(b, _)| (b + 1) * bt <= first_seen)
                            .count();
                        let want = take_before(&mut s.pages, gone);
                        assert_eq!(got, Ok(want.len()));
                        assert_eq!(from_fixed, want);
                        // What the tables keep of the blocks up to the
                        // next token's is at most the window's blocks and
                        // one more.
                        for table in [heap.block_table(seq), fixed.block_table(seq)] {
                            let kept = table
                                .expect("known")
                                .iter()
                                .take(s.len / bt + 1)
                                .filter(|p| **p != PageId::PLACEHOLDER)
                                .count();
                            assert!(kept <= (window as usize).div_ceil(bt) + 1, "{kept}");
                        }
                    }
                }
                record(&mut released, &from_fixed);
            }
        }
        assert_same(&heap, &fixed, &model);
    }
    // Every page pushed is handed back once: by now, or by removing what
    // is left.
    for seq in model.keys().copied().collect::<Vec<_>>() {
        let mut from_fixed = Vec::new();
        fixed.remove(seq, |p| from_fixed.push(p)).expect("known");
        heap.remove(seq, |_| ()).expect("known");
        record(&mut released, &from_fixed);
    }
    assert_eq!((heap.num_sequences(), fixed.num_sequences()), (0, 0));
    assert_eq!(pushed, released);
}

/// The model's `release_before`: the pages before block `upto`, their
/// places taken by placeholders.
fn take_before(pages: &mut [PageId], upto: usize) -> Vec<PageId> {
    pages[..upto]
        .iter_mut()
        .filter(|p| **p != PageId::PLACEHOLDER)
        .map(|p| core::mem::replace(p, PageId::PLACEHOLDER))
        .collect()
}

/// Notes pages handed back; each may come back once.
fn record(released: &mut BTreeSet<PageId>, pages: &[PageId]) {
    for p in pages {
        assert_ne!(*p, PageId::PLACEHOLDER, "a placeholder handed back");
        assert!(released.insert(*p), "{p:?} handed back twice");
    }
}

/// Both tables hold what the model holds.
fn assert_same(
    heap: &SequenceMap,
    fixed: &FixedSequenceMap<SEQS, BLOCKS>,
    model: &BTreeMap<SeqId, Seq>,
) {
    assert_eq!(heap.num_sequences(), model.len());
    assert_eq!(fixed.num_sequences(), model.len());
    for (seq, s) in model {
        assert_eq!(heap.len(*seq), Ok(s.len));
        assert_eq!(fixed.len(*seq), Ok(s.len));
        assert_eq!(heap.block_table(*seq), Ok(&s.pages[..]));
        assert_eq!(fixed.block_table(*seq), Ok(&s.pages[..]));
        let held = s
            .pages
            .iter()
            .filter(|p| **p != PageId::PLACEHOLDER)
            .count();
        assert_eq!(heap.held_pages(*seq), Ok(held));
        assert_eq!(fixed.held_pages(*seq), Ok(held));
    }
}
