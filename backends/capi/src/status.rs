//! Status codes, the thread-local last error, and the wrapper that keeps
//! panics on the Rust side of the ABI.

use std::cell::RefCell;
use std::ffi::{CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};

use kvslice_core::Error;

/// What a call did. Every function of the ABI returns one; on anything but
/// `KVS_STATUS_OK`, `kvs_last_error()` says why in words, and nothing the
/// call was given has changed (except where a function's docs say so).
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvsStatus {
    /// Success.
    Ok = 0,
    /// A required pointer was null.
    NullPointer = 1,
    /// A pointer is not aligned for its element type.
    Misaligned = 2,
    /// A length is wrong for the layout or the other arguments, or too
    /// large to address.
    InvalidLength = 3,
    /// A handle is null, destroyed, of another kind, or was never made.
    InvalidHandle = 4,
    /// A value breaks a rule (layout, range, index, policy name, finite
    /// numbers...); the message names it.
    InvalidArgument = 5,
    /// An output buffer is too small; the call wrote the size it needs.
    BufferTooSmall = 6,
    /// The pool (or another fixed-size structure) is full.
    CapacityExhausted = 7,
    /// The object is in use: a request on another thread, page memory
    /// still under a store, a page being filled or evicted.
    Busy = 8,
    /// A page changed generation since it was named: it was freed.
    Stale = 9,
    /// Valid input this build does not support.
    Unsupported = 10,
    /// A bug in kvslice: a panic was caught at the boundary. The message
    /// has the panic's text; please report it.
    Panic = 11,
}

/// A failed call: its status and the message `kvs_last_error` returns.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) status: KvsStatus,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn new(status: KvsStatus, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(KvsStatus::InvalidArgument, message)
    }

    /// An output buffer with room for `cap` where `need` are needed.
    pub(crate) fn too_small(what: &str, need: usize, cap: usize) -> Self {
        Self::new(
            KvsStatus::BufferTooSmall,
            format!("{need} {what} to write, room for {cap}"),
        )
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        let status = match &e {
            Error::ShapeMismatch { .. } => KvsStatus::InvalidLength,
            Error::CapacityExhausted(_) => KvsStatus::CapacityExhausted,
            Error::PageBusy { .. } => KvsStatus::Busy,
            Error::StaleHandle { .. } | Error::NotReferenced { .. } => KvsStatus::Stale,
            Error::Unsupported(_) => KvsStatus::Unsupported,
            _ => KvsStatus::InvalidArgument,
        };
        Self::new(status, e.to_string())
    }
}

pub(crate) type Outcome<T = ()> = Result<T, Failure>;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: &str) {
    // An interior NUL would cut the C string short; show it instead.
    let text = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    // After the thread's locals are gone (a C `atexit` handler, a
    // pthread key destructor) the message is lost rather than the process.
    let _ = LAST_ERROR.try_with(|e| *e.borrow_mut() = text);
}

/// Runs one entry point's body: its failure becomes a status and the
/// thread's last error, and a panic never unwinds into the caller.
pub(crate) fn call(body: impl FnOnce() -> Outcome) -> KvsStatus {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => KvsStatus::Ok,
        Ok(Err(f)) => {
            set_last_error(&f.message);
            f.status
        }
        Err(panic) => {
            let text = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into());
            set_last_error(&format!("internal error (please report): {text}"));
            KvsStatus::Panic
        }
    }
}

/// The message of the last call on this thread that did not return
/// `KVS_STATUS_OK` (empty if none has failed). Successful calls leave it as
/// it was.
///
/// The string is owned by kvslice and stays valid until the next failing
/// call on the same thread; copy it to keep it.
#[unsafe(no_mangle)]
pub extern "C" fn kvs_last_error() -> *const c_char {
    LAST_ERROR
        .try_with(|e| e.borrow().as_ptr())
        .unwrap_or(c"".as_ptr())
}
