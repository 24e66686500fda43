//! Checks on the pointers and lengths a C caller passes, before any of
//! them is read or written.

use crate::status::{Failure, KvsStatus, Outcome};

/// Null and alignment: what can be checked about a pointer.
fn check_ptr<T>(ptr: *const T, what: &str) -> Outcome {
    if ptr.is_null() {
        return Err(Failure::new(
            KvsStatus::NullPointer,
            format!("{what} is a null pointer"),
        ));
    }
    if !ptr.addr().is_multiple_of(align_of::<T>()) {
        return Err(Failure::new(
            KvsStatus::Misaligned,
            format!(
                "{what} at {ptr:p} is not aligned to {} bytes",
                align_of::<T>()
            ),
        ));
    }
    Ok(())
}

/// A slice of `len` elements no allocation could hold is refused before
/// `from_raw_parts` would be undefined behaviour.
fn check_len<T>(len: usize, what: &str) -> Outcome {
    if len
        .checked_mul(size_of::<T>())
        .is_none_or(|b| b > isize::MAX as usize)
    {
        return Err(Failure::new(
            KvsStatus::InvalidLength,
            format!("{what}: {len} elements cannot be addressed"),
        ));
    }
    Ok(())
}

/// `len` elements read from `ptr`; a null `ptr` is allowed for `len` 0.
///
/// # Safety
///
/// A non-null `ptr` must point to `len` initialised elements that nothing
/// writes for the returned lifetime.
pub(crate) unsafe fn slice_in<'a, T>(ptr: *const T, len: usize, what: &str) -> Outcome<&'a [T]> {
    if len == 0 && ptr.is_null() {
        return Ok(&[]);
    }
    check_ptr(ptr, what)?;
    check_len::<T>(len, what)?;
    // SAFETY: non-null, aligned, a size an allocation can have; the caller
    // promises `len` readable elements (the header says so per argument).
    Ok(unsafe { core::slice::from_raw_parts(ptr, len) })
}

/// `len` elements written through `ptr`; a null `ptr` is allowed for
/// `len` 0.
///
/// # Safety
///
/// A non-null `ptr` must point to `len` writable elements that nothing else
/// reads or writes for the returned lifetime.
pub(crate) unsafe fn slice_out<'a, T>(ptr: *mut T, len: usize, what: &str) -> Outcome<&'a mut [T]> {
    if len == 0 && ptr.is_null() {
        return Ok(&mut []);
    }
    check_ptr(ptr, what)?;
    check_len::<T>(len, what)?;
    // SAFETY: as in `slice_in`, and the caller promises exclusive access.
    Ok(unsafe { core::slice::from_raw_parts_mut(ptr, len) })
}

/// One value read from `ptr`.
///
/// # Safety
///
/// A non-null `ptr` must point to an initialised `T`.
pub(crate) unsafe fn read_in<T: Copy>(ptr: *const T, what: &str) -> Outcome<T> {
    check_ptr(ptr, what)?;
    // SAFETY: non-null and aligned; the caller promises a valid `T`.
    Ok(unsafe { ptr.read() })
}

/// Writes one value through `ptr`.
///
/// # Safety
///
/// A non-null `ptr` must point to writable memory for a `T`.
pub(crate) unsafe fn write_out<T>(ptr: *mut T, value: T, what: &str) -> Outcome {
    check_ptr(ptr, what)?;
    // SAFETY: non-null and aligned; the caller promises it is writable.
    unsafe { ptr.write(value) };
    Ok(())
}

/// Checks an output pointer before the work whose result it receives, so
/// that a bad pointer fails the call before anything changes.
pub(crate) fn check_out<T>(ptr: *mut T, what: &str) -> Outcome {
    check_ptr(ptr.cast_const(), what)
}
