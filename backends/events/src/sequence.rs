//! A worker's batch numbers as a subscriber follows them: which live
//! batches to apply, which gaps to ask a replay for, which replayed
//! batches to take, and when a publisher has restarted. No I/O: the
//! subscriber does that around it, and the fuzz target drives it alone.

use core::ops::Range;

/// Backwards batches in a row, each numbered one past the one before,
/// that mean a worker's publisher restarted (its numbers began again at
/// 0): the worker is then forgotten
/// ([`Subscriber::forget_worker`](crate::Subscriber::forget_worker)) and
/// its new stream applied from its start, replayed where it can be.
///
/// A shorter run counts too where it began at batch 0 and runs on past
/// the newest batch seen: a publisher that restarted after sending fewer
/// than this many. Numbers alone cannot tell the rest from duplicates: a
/// restart whose new stream passes the newest batch seen before this many
/// of its batches came behind in a row, not from batch 0, is not seen
/// (its batch 0 lost after an old stream of three, say).
pub const RESTART_RUN: u32 = 3;

/// One worker's numbers. Every batch below [`next`](Self::next) has been
/// applied or counted lost, each once, since the stream began (or began
/// again).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Sequence {
    /// The next batch to apply.
    next: u64,
    /// The next batch expected live: below it is a duplicate or a
    /// publisher that went backwards.
    live_next: u64,
    /// Backwards batches in a row, each one past the one before, and the
    /// last of them.
    behind: (u32, u64),
}

/// What a live batch is to the subscriber ([`Sequence::live`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Live {
    /// Not above what was seen live (a duplicate, or a publisher that went
    /// backwards): dropped. `last` is the newest batch seen live.
    Behind { last: u64 },
    /// The last [`RESTART_RUN`] batches ran on one after another below
    /// what was seen before, or a shorter such run from batch 0 ran on
    /// past it: the publisher restarted. Forget the worker
    /// ([`Sequence::restart`]) and offer the batch again.
    Restarted,
    /// Ahead of the next batch to apply: ask a replay for `from..seq`
    /// ([`Sequence::replayed`] for what it brings, then
    /// [`Sequence::filled`]), then apply the batch if it is still the next.
    Gap { from: u64 },
    /// The next batch: apply it ([`Sequence::applied`]).
    Next,
    /// A replay brought it already.
    Done,
}

/// What a replayed batch is to the subscriber ([`Sequence::replayed`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Replayed {
    /// Below the next batch to apply: applied already, or counted lost.
    Stale,
    /// Apply it ([`Sequence::applied`]), after counting `lost` (the
    /// batches the replay skipped before it) as lost.
    Apply { lost: Range<u64> },
}

impl Sequence {
    /// The next batch to apply.
    pub(crate) fn next(&self) -> u64 {
        self.next
    }

    /// A live batch numbered `seq` (below `u64::MAX`, which the
    /// subscriber refuses first).
    pub(crate) fn live(&mut self, seq: u64) -> Live {
        debug_assert!(seq < u64::MAX);
        if seq < self.live_next {
            let (run, last) = self.behind;
            let run = if run > 0 && seq == last.wrapping_add(1) {
                run + 1
            } else {
                1
            };
            self.behind = (run, seq);
            return match run < RESTART_RUN {
                true => Live::Behind {
                    last: self.live_next - 1,
                },
                false => Live::Restarted,
            };
        }
        // 0, 1, …, seq - 1 arrived behind and `seq` runs on past them: a
        // stream numbered again from 0 (a live stream sends 0 once).
        let (run, last) = self.behind;
        if run > 0 && seq == last + 1 && seq == u64::from(run) {
            return Live::Restarted;
        }
        self.behind = (0, 0);
        self.live_next = seq + 1;
        match seq.cmp(&self.next) {
            core::cmp::Ordering::Greater => Live::Gap { from: self.next },
            core::cmp::Ordering::Equal => Live::Next,
            core::cmp::Ordering::Less => Live::Done,
        }
    }

    /// A batch numbered `seq` (below `u64::MAX`) that a replay brought.
    pub(crate) fn replayed(&self, seq: u64) -> Replayed {
        match seq < self.next {
            true => Replayed::Stale,
            false => Replayed::Apply {
                lost: self.next..seq,
            },
        }
    }

    /// Batch `seq` (at least the next) was applied: the next is the one
    /// after it.
    pub(crate) fn applied(&mut self, seq: u64) {
        debug_assert!(seq >= self.next && seq < u64::MAX);
        self.next = seq + 1;
    }

    /// A gap's replay is over: whatever of the batches below `to` it did
    /// not bring is lost (returned, if any), and the next batch is `to` at
    /// least.
    pub(crate) fn filled(&mut self, to: u64) -> Option<Range<u64>> {
        (self.next < to).then(|| {
            let lost = self.next..to;
            self.next = to;
            lost
        })
    }

    /// Forgets every number: the next batch starts a new stream.
    pub(crate) fn restart(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream that starts late, skips, is partly replayed, repeats and
    /// restarts.
    #[test]
    fn every_batch_is_applied_or_lost_once() {
        let mut s = Sequence::default();
        // The first batch is 3: 0..3 are asked of a replay, which brings 1.
        assert_eq!(s.live(3), Live::Gap { from: 0 });
        assert_eq!(s.replayed(1), Replayed::Apply { lost: 0..1 });
        s.applied(1);
        assert_eq!(s.replayed(0), Replayed::Stale);
        assert_eq!(s.filled(3), Some(2..3));
        s.applied(3);
        assert_eq!(s.live(4), Live::Next);
        s.applied(4);
        // A replay that ran ahead brought 6 and 7 with the gap to 6.
        assert_eq!(s.live(6), Live::Gap { from: 5 });
        for n in [5, 6, 7] {
            assert!(matches!(s.replayed(n), Replayed::Apply { .. }));
            s.applied(n);
        }
        assert_eq!(s.filled(6), None);
        assert_eq!(s.live(7), Live::Done);
        // Duplicates and a restart: three in a row, each one past the last.
        assert_eq!(s.live(7), Live::Behind { last: 7 });
        assert_eq!(s.live(0), Live::Behind { last: 7 });
        assert_eq!(s.live(1), Live::Behind { last: 7 });
        assert_eq!(s.next(), 8);
        assert_eq!(s.live(2), Live::Restarted);
        s.restart();
        assert_eq!(s.live(2), Live::Gap { from: 0 });
    }

    /// A publisher that restarts after two batches: its new 0 and 1 are
    /// behind, and its 2, one past them, is the restart.
    #[test]
    fn a_restart_after_fewer_than_a_run_is_seen() {
        let mut s = Sequence::default();
        for n in 0..2 {
            assert_eq!(s.live(n), Live::Next);
            s.applied(n);
        }
        assert_eq!(s.live(0), Live::Behind { last: 1 });
        assert_eq!(s.live(1), Live::Behind { last: 1 });
        assert_eq!(s.live(2), Live::Restarted);
        s.restart();
        assert_eq!(s.live(2), Live::Gap { from: 0 });
        // A run behind that did not begin at 0 is a duplicate, not a
        // restart: 1 then 2 after 0 and 1 were applied.
        let mut s = Sequence::default();
        for n in 0..2 {
            s.live(n);
            s.applied(n);
        }
        assert_eq!(s.live(1), Live::Behind { last: 1 });
        assert_eq!(s.live(2), Live::Next);
    }
}
