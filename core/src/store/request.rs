//! Request tickets: which request a lookup or publish belongs to, so that a
//! policy can group a request's hits and inserts whatever the threads
//! serving requests interleave.

use crate::error::{Error, Result};

/// One request's identity within one [`CacheStore`](crate::CacheStore),
/// from [`begin_request`](crate::CacheStore::begin_request) to
/// [`end_request`](crate::CacheStore::end_request), which consumes it:
/// using a request after its end does not compile, and a ticket of another
/// store is an [`Error::InvalidValue`].
///
/// ```
/// use kvslice_core::{CacheStore, ClockPolicy, KvDtype, KvLayout, LayoutSpec};
///
/// let layout = KvLayout::new(LayoutSpec::new(1, 1, 1, 8, 4, KvDtype::F16))?;
/// let (a, b) = (
///     CacheStore::new(layout, 4, ClockPolicy::new(4))?,
///     CacheStore::new(layout, 4, ClockPolicy::new(4))?,
/// );
/// let ticket = a.begin_request();
/// let guard = b.pin();
/// let err = b.lookup_prefix(&ticket, &[], 0, &guard, &mut Vec::new()).unwrap_err();
/// assert!(matches!(err, kvslice_core::Error::InvalidValue(_)));
/// a.end_request(ticket)?;
/// # Ok::<(), kvslice_core::Error>(())
/// ```
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a request ends with CacheStore::end_request"]
pub struct RequestTicket {
    pub(super) store: u64,
    pub(super) serial: u64,
}

impl RequestTicket {
    /// The request's serial in its store (1, 2, …, in order of
    /// `begin_request`): what policies see as
    /// [`PageEvent::request`](crate::PageEvent::request).
    pub fn serial(&self) -> u64 {
        self.serial
    }

    pub(super) fn check(&self, store: u64) -> Result<()> {
        if self.store == store {
            Ok(())
        } else {
            Err(Error::InvalidValue("request ticket from another store"))
        }
    }
}
