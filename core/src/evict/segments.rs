//! Intrusive doubly linked lists over page indices: each page is in at most
//! one of a few segments, or parked (remembered but not listed). Recency
//! policies build on it; callers serialise access.

use alloc::vec;
use alloc::vec::Vec;

pub(super) const NIL: u32 = u32::MAX;
/// Not tracked at all.
pub(super) const ABSENT: u8 = u8::MAX;

#[derive(Debug)]
pub(super) struct Segments<const N: usize> {
    prev: Vec<u32>,
    next: Vec<u32>,
    /// Segment of each page (`ABSENT` if untracked).
    seg: Vec<u8>,
    /// Whether a tracked page is parked (out of its segment's list).
    parked: Vec<bool>,
    /// Most recently used end.
    head: [u32; N],
    /// Least recently used end.
    tail: [u32; N],
    len: [u32; N],
}

impl<const N: usize> Segments<N> {
    pub(super) fn new(capacity: u32) -> Self {
        let n = capacity as usize;
        Self {
            prev: vec![NIL; n],
            next: vec![NIL; n],
            seg: vec![ABSENT; n],
            parked: vec![false; n],
            head: [NIL; N],
            tail: [NIL; N],
            len: [0; N],
        }
    }

    /// The page's segment, if tracked (listed or parked).
    pub(super) fn segment(&self, i: u32) -> Option<usize> {
        match self.seg.get(i as usize) {
            Some(&s) if s != ABSENT => Some(s as usize),
            _ => None,
        }
    }

    pub(super) fn is_listed(&self, i: u32) -> bool {
        self.segment(i).is_some() && !self.parked[i as usize]
    }

    /// Listed pages in segment `s`.
    pub(super) fn len(&self, s: usize) -> u32 {
        self.len[s]
    }

    /// The least recently used listed page of `s`.
    pub(super) fn lru(&self, s: usize) -> u32 {
        self.tail[s]
    }

    /// The most recently used listed page of `s`.
    pub(super) fn mru(&self, s: usize) -> u32 {
        self.head[s]
    }

    /// The next page towards the least recent end, after `i`.
    pub(super) fn older(&self, i: u32) -> u32 {
        self.next[i as usize]
    }

    /// The next page towards the most recent end, after `i`.
    pub(super) fn newer(&self, i: u32) -> u32 {
        self.prev[i as usize]
    }

    fn unlink(&mut self, i: u32) {
        let s = self.seg[i as usize] as usize;
        let (p, n) = (self.prev[i as usize], self.next[i as usize]);
        if p == NIL {
            self.head[s] = n
        } else {
            self.next[p as usize] = n
        }
        if n == NIL {
            self.tail[s] = p
        } else {
            self.prev[n as usize] = p
        }
        self.len[s] -= 1;
    }

    fn link_front(&mut self, i: u32, s: usize) {
        self.seg[i as usize] = s as u8;
        self.parked[i as usize] = false;
        self.prev[i as usize] = NIL;
        self.next[i as usize] = self.head[s];
        if self.head[s] == NIL {
            self.tail[s] = i
        } else {
            self.prev[self.head[s] as usize] = i
        }
        self.head[s] = i;
        self.len[s] += 1;
    }

    fn link_back(&mut self, i: u32, s: usize) {
        self.seg[i as usize] = s as u8;
        self.parked[i as usize] = false;
        self.next[i as usize] = NIL;
        self.prev[i as usize] = self.tail[s];
        if self.tail[s] == NIL {
            self.head[s] = i
        } else {
            self.next[self.tail[s] as usize] = i
        }
        self.tail[s] = i;
        self.len[s] += 1;
    }

    /// Puts `i` at the most recent end of `s` (from wherever it was).
    pub(super) fn touch(&mut self, i: u32, s: usize) {
        if self.is_listed(i) {
            self.unlink(i);
        }
        self.link_front(i, s);
    }

    /// Puts `i` at the least recent end of `s` (from wherever it was).
    pub(super) fn touch_back(&mut self, i: u32, s: usize) {
        if self.is_listed(i) {
            self.unlink(i);
        }
        self.link_back(i, s);
    }

    /// Takes `i` out of its list but remembers its segment.
    pub(super) fn park(&mut self, i: u32) {
        if self.is_listed(i) {
            self.unlink(i);
            self.parked[i as usize] = true;
        }
    }

    /// Moves a parked page's home segment (it stays parked).
    pub(super) fn rehome(&mut self, i: u32, s: usize) {
        if self.segment(i).is_some() && self.parked[i as usize] {
            self.seg[i as usize] = s as u8;
        }
    }

    /// Puts a parked page back at the least recent end of its segment.
    pub(super) fn unpark(&mut self, i: u32) {
        if let Some(s) = self.segment(i)
            && self.parked[i as usize]
        {
            self.link_back(i, s);
        }
    }

    /// Forgets `i` entirely.
    pub(super) fn remove(&mut self, i: u32) {
        if self.is_listed(i) {
            self.unlink(i);
        }
        self.seg[i as usize] = ABSENT;
        self.parked[i as usize] = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order<const N: usize>(s: &Segments<N>, seg: usize) -> Vec<u32> {
        let mut out = Vec::new();
        let mut i = s.lru(seg);
        while i != NIL {
            out.push(i);
            i = s.newer(i);
        }
        out
    }

    #[test]
    fn lists_park_and_move() {
        let mut s = Segments::<2>::new(6);
        for i in 0..4 {
            s.touch(i, 0);
        }
        s.touch(1, 0);
        assert_eq!(order(&s, 0), [0, 2, 3, 1]);
        s.park(2);
        assert_eq!((order(&s, 0), s.len(0)), (alloc::vec![0, 3, 1], 3));
        s.rehome(2, 1);
        s.unpark(2);
        assert_eq!(order(&s, 1), [2]);
        s.touch(0, 1);
        assert_eq!(order(&s, 1), [2, 0]);
        s.remove(3);
        assert_eq!(order(&s, 0), [1]);
        assert_eq!(s.segment(3), None);
        s.unpark(3); // untracked: no effect
        assert_eq!(s.len(0) + s.len(1), 3);
    }
}
