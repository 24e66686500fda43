//! A lookup's accesses on their way to the policy.

use crate::evict::{Access, EvictionPolicy, ReadBuffer};

/// Records a lookup claims from the read buffer at once.
const CHUNK: usize = 16;

/// Collects one lookup's accesses. A policy that buffers them gets them
/// through the read buffer, up to 16 per claim (one compare-and-swap for
/// 16 blocks rather than one per block); any other policy gets each as it
/// happens, so LRU's order stays exact. What is collected is recorded
/// when the recorder is dropped, on every path out of the lookup.
pub(super) struct Recorder<'a, E: EvictionPolicy> {
    reads: Option<&'a ReadBuffer>,
    policy: &'a E,
    chunk: [Access; CHUNK],
    len: usize,
}

impl<'a, E: EvictionPolicy> Recorder<'a, E> {
    pub(super) fn new(reads: Option<&'a ReadBuffer>, policy: &'a E) -> Self {
        Self {
            reads,
            policy,
            chunk: [Access::End { request: 0 }; CHUNK],
            len: 0,
        }
    }

    /// One access of the lookup's request.
    pub(super) fn push(&mut self, access: Access) {
        let Some(reads) = self.reads else {
            self.policy.on_accesses(&[access]);
            return;
        };
        self.chunk[self.len] = access;
        self.len += 1;
        if self.len == CHUNK {
            reads.record_all(&self.chunk);
            self.len = 0;
        }
    }
}

impl<E: EvictionPolicy> Drop for Recorder<'_, E> {
    fn drop(&mut self) {
        if let Some(reads) = self.reads {
            reads.record_all(&self.chunk[..self.len]);
        }
    }
}
