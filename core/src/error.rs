//! The one error type every public entry point returns.

use alloc::string::String;
use core::fmt;

/// Everything that can go wrong with kvslice input or state.
///
/// Each variant names the offending quantity so that a caller can tell a
/// bad layout from a bad request without parsing strings. A call that
/// returns an error has left every structure it was given as it was.
///
/// ```
/// use kvslice_core::{Error, KvDtype, KvLayout, LayoutSpec};
///
/// let err = KvLayout::new(LayoutSpec::new(2, 6, 4, 64, 16, KvDtype::F16)).unwrap_err();
/// assert!(matches!(err, Error::InvalidLayout(_)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The layout is not usable; the text says which rule it broke.
    InvalidLayout(&'static str),
    /// A size computed from the input does not fit in the integer type that
    /// holds it.
    Overflow(&'static str),
    /// An index (layer, head, shard, position, page, block...) is outside
    /// its valid range.
    OutOfRange {
        /// What was indexed.
        what: &'static str,
        /// The index given.
        index: u64,
        /// The exclusive upper bound it must stay under.
        bound: u64,
    },
    /// A token range is empty or reversed.
    InvalidRange {
        /// Start of the range as given.
        start: u64,
        /// End of the range as given.
        end: u64,
    },
    /// Two lengths that must agree do not.
    ShapeMismatch {
        /// What was measured.
        what: &'static str,
        /// The length the layout or the other arguments require.
        expected: u64,
        /// The length given.
        actual: u64,
    },
    /// A value of the wrong element type was supplied.
    DtypeMismatch {
        /// What carries the wrong dtype.
        what: &'static str,
    },
    /// A numeric argument is not finite or not in its domain.
    InvalidValue(&'static str),
    /// A fixed-capacity structure is full.
    CapacityExhausted(&'static str),
    /// A handle's generation no longer matches the page it names.
    StaleHandle {
        /// The page index.
        page: u32,
    },
    /// The page is being filled or evicted, or still referenced, so the
    /// operation cannot take it now.
    PageBusy {
        /// The page index.
        page: u32,
    },
    /// A release for a page that holds no references: a double release.
    NotReferenced {
        /// The page index.
        page: u32,
    },
    /// A sequence id is not registered.
    UnknownSequence(u64),
    /// A sequence id is registered already.
    DuplicateSequence(u64),
    /// An accelerator, its driver or a shader failed.
    Device {
        /// What kind of failure, for callers that recover differently
        /// (retry on a fresh device after loss, shrink after out-of-memory).
        kind: DeviceFailure,
        /// The driver's or validator's own words.
        detail: String,
    },
    /// A K/V value the page's storage dtype cannot hold (it would be
    /// stored as infinity), or a key or query so large that attention
    /// scores could overflow f32 (see [`KvWrite`](crate::KvWrite) and
    /// [`AttentionBatch`](crate::AttentionBatch)). Nothing was written.
    ValueTooLarge {
        /// Which tensor: "key", "value" or "query".
        what: &'static str,
        /// The token's position: in the sequence for K/V, in the batch's
        /// queries for a query.
        token: u64,
        /// The element's index in that token's row (heads × head_dim).
        element: u64,
    },
    /// An attention window reads a block whose page was released (its
    /// block-table entry is [`PageId::PLACEHOLDER`](crate::PageId::PLACEHOLDER)):
    /// the window is wider than the one the pages were released under.
    ReleasedBlockRead {
        /// The released block the window reads.
        block: u64,
        /// The first block the window reads.
        first: u64,
    },
    /// A write reaches a block whose page was released (its block-table
    /// entry is [`PageId::PLACEHOLDER`](crate::PageId::PLACEHOLDER)).
    ReleasedBlockWrite {
        /// The released block.
        block: u64,
    },
    /// A sequence's context is longer than its block table covers.
    ContextPastTable {
        /// Tokens of context asked for.
        kv_len: u64,
        /// Tokens the block table's pages hold.
        table_tokens: u64,
    },
    /// A block table names one page at two positions where a write needs
    /// distinct pages.
    DuplicatePage {
        /// The page.
        page: u32,
    },
    /// The backend does not support this (valid) input; the text says
    /// what, and what to use instead.
    Unsupported(&'static str),
    /// A trace line could not be parsed.
    MalformedTrace {
        /// 1-based line number.
        line: u64,
        /// What was wrong with it.
        reason: &'static str,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidLayout(why) => write!(f, "invalid layout: {why}"),
            Error::Overflow(what) => write!(f, "size overflow computing {what}"),
            Error::OutOfRange { what, index, bound } => {
                write!(f, "{what} {index} out of range (must be < {bound})")
            }
            Error::InvalidRange { start, end } => {
                write!(f, "invalid token range {start}..{end}")
            }
            Error::ShapeMismatch {
                what,
                expected,
                actual,
            } => write!(f, "{what}: expected {expected}, got {actual}"),
            Error::DtypeMismatch { what } => write!(f, "dtype mismatch: {what}"),
            Error::InvalidValue(what) => write!(f, "invalid value: {what}"),
            Error::CapacityExhausted(what) => write!(f, "capacity exhausted: {what}"),
            Error::StaleHandle { page } => write!(f, "stale handle for page {page}"),
            Error::PageBusy { page } => {
                write!(f, "page {page} is busy (filling, evicting or referenced)")
            }
            Error::NotReferenced { page } => {
                write!(
                    f,
                    "page {page} holds no reference to release (double release?)"
                )
            }
            Error::UnknownSequence(id) => write!(f, "unknown sequence {id}"),
            Error::DuplicateSequence(id) => write!(f, "sequence {id} already exists"),
            Error::Device { kind, detail } => write!(f, "device error ({kind}): {detail}"),
            Error::ValueTooLarge {
                what,
                token,
                element,
            } => write!(
                f,
                "{what} of token {token}, element {element}, is too large: it does not fit the \
                 page's storage dtype, or could make attention scores overflow"
            ),
            Error::ReleasedBlockRead { block, first } => write!(
                f,
                "the attention window reads blocks from {first} on, but block {block}'s page \
                 was released: attend with the window the pages were released under"
            ),
            Error::ReleasedBlockWrite { block } => write!(
                f,
                "the write reaches block {block}, whose page was released: \
                 write only into blocks the sequence still holds"
            ),
            Error::ContextPastTable {
                kv_len,
                table_tokens,
            } => write!(
                f,
                "context of {kv_len} tokens, but its block table covers only {table_tokens}"
            ),
            Error::DuplicatePage { page } => {
                write!(
                    f,
                    "page {page} appears twice in a block table being written"
                )
            }
            Error::Unsupported(what) => write!(f, "unsupported by this backend: {what}"),
            Error::MalformedTrace { line, reason } => {
                write!(f, "malformed trace line {line}: {reason}")
            }
        }
    }
}

impl core::error::Error for Error {}

/// The kinds of [`Error::Device`].
///
/// ```
/// use kvslice_core::{DeviceFailure, Error};
///
/// let e = Error::Device { kind: DeviceFailure::OutOfMemory, detail: "pool of 4 GiB".into() };
/// assert_eq!(e.to_string(), "device error (out of memory): pool of 4 GiB");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DeviceFailure {
    /// No adapter matched (none present, or none named as asked).
    NoAdapter,
    /// The adapter lacks a feature or limit the request needs.
    Unsupported,
    /// The device was lost (driver reset, removal, destroyed); the engine
    /// must be rebuilt.
    Lost,
    /// Device memory ran out.
    OutOfMemory,
    /// A shader or API call failed validation.
    Validation,
    /// Anything else the driver reported.
    Internal,
}

impl fmt::Display for DeviceFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeviceFailure::NoAdapter => "no adapter",
            DeviceFailure::Unsupported => "unsupported",
            DeviceFailure::Lost => "device lost",
            DeviceFailure::OutOfMemory => "out of memory",
            DeviceFailure::Validation => "validation",
            DeviceFailure::Internal => "internal",
        })
    }
}

/// Shorthand used throughout the crate.
pub type Result<T, E = Error> = core::result::Result<T, E>;

/// Checks `index < bound`, naming `what` in the error.
pub(crate) fn check_index(what: &'static str, index: usize, bound: usize) -> Result<()> {
    if index < bound {
        Ok(())
    } else {
        Err(Error::OutOfRange {
            what,
            index: index as u64,
            bound: bound as u64,
        })
    }
}

/// Checks that two lengths agree, naming `what` in the error.
pub(crate) fn check_len(what: &'static str, expected: usize, actual: usize) -> Result<()> {
    if expected == actual {
        Ok(())
    } else {
        Err(Error::ShapeMismatch {
            what,
            expected: expected as u64,
            actual: actual as u64,
        })
    }
}
