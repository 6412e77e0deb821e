//! The C ABI: the only `extern "C"` entry points of the crate.
//!
//! Every entry point is a few lines that run inside [`boundary`] (or one of its
//! variants): it records the entry marker for capture sites, catches panics (a panic
//! becomes an `NDX_ERROR_INTERNAL` error, never an abort of the host process), checks
//! out-params and handles, and converts the core's `Result` into an owned
//! `ndx_error_t*` (NULL on success). No logic lives here.

#![allow(non_camel_case_types)]
// The entry points are called from C, whose callers promise valid pointers per the
// documented contract; marking them `unsafe fn` would change nothing for C and only
// obscure the one place each pointer is checked.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

mod checks;
mod cuda;
mod error;
mod exec;
mod explain;
pub(crate) mod fork;
mod handle;
mod repro;
mod tensor;

pub use checks::*;
pub use cuda::*;
pub use error::*;
pub use exec::*;
pub use explain::*;
pub use handle::{ndx_batch_t, ndx_context_t, ndx_future_t, ndx_tensor_t};
pub use repro::*;
pub use tensor::*;

use std::ffi::{CStr, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use crate::error::{DEFAULT_DEPTH, EntryGuard, Error, Result, Site};

/// The message of a caught panic.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".to_string()
    }
}

/// Gives an error that has no site the site of the entry point's caller.
#[inline(always)]
fn with_entry_site(e: Error) -> Error {
    if e.site().is_some() {
        e
    } else {
        e.with_site(Arc::new(Site::capture_native(DEFAULT_DEPTH)))
    }
}

/// Runs `f` as the body of entry point `name` and returns a value; a panic yields
/// `on_panic(error)`. Inlined into the entry point so the marker lies in its frame.
#[inline(always)]
pub(crate) fn boundary_value<T>(
    name: &'static str,
    on_panic: impl FnOnce(Error) -> T,
    f: impl FnOnce() -> T,
) -> T {
    let marker = 0u8;
    let _entry = EntryGuard::enter(std::hint::black_box(&marker) as *const u8 as usize);
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(payload) => on_panic(with_entry_site(Error::internal(format!(
            "panic in {name}: {}",
            panic_message(payload.as_ref())
        )))),
    }
}

/// Runs `f` as the body of entry point `name`: NULL on success, an owned error (with
/// the caller's site) on failure or panic.
#[inline(always)]
pub(crate) fn boundary(name: &'static str, f: impl FnOnce() -> Result<()>) -> *mut ndx_error_t {
    boundary_value(name, error_into_raw, || match f() {
        Ok(()) => std::ptr::null_mut(),
        Err(e) => error_into_raw(with_entry_site(e)),
    })
}

/// Like [`boundary`] for an entry point with one out-param (see [`out_param`]).
#[inline(always)]
pub(crate) fn boundary_out<T>(
    name: &'static str,
    out: *mut T,
    empty: T,
    f: impl FnOnce() -> Result<T>,
) -> *mut ndx_error_t {
    boundary(name, || out_param(out, empty, f))
}

/// Sets a non-NULL out-param to `empty`, for entry points that may fail before
/// [`out_param`] runs.
pub(crate) fn clear_out<T>(out: *mut T, empty: T) {
    if !out.is_null() {
        // SAFETY: non-NULL out-params point to writable storage (API contract).
        unsafe { out.write(empty) };
    }
}

/// Checks `out`, sets it to `empty` first (so it is never half-filled on error), then
/// to `f`'s value.
pub(crate) fn out_param<T>(out: *mut T, empty: T, f: impl FnOnce() -> Result<T>) -> Result<()> {
    if out.is_null() {
        return Err(Error::value("argument 'out' is NULL"));
    }
    // SAFETY: `out` is non-NULL and, per the API contract, points to writable storage
    // for one value.
    unsafe { out.write(empty) };
    let value = f()?;
    // SAFETY: as above.
    unsafe { out.write(value) };
    Ok(())
}

/// The return address of the entry point this is inlined into: the instruction after
/// the caller's call, i.e. the caller's line. One load from the entry point's own
/// frame record — available when the crate is built with frame pointers (the
/// repository's `.cargo/config.toml` forces them; `build.rs` sets `ndx_frame_pointers`
/// only then). `None` elsewhere, and under Miri, which runs no inline assembly:
/// callers then unwind one frame instead.
#[inline(always)]
pub(crate) fn caller_return_address() -> Option<usize> {
    #[cfg(all(ndx_frame_pointers, target_arch = "x86_64", not(miri)))]
    {
        let ra: usize;
        // SAFETY: with frame pointers forced, every function sets rbp to its frame
        // record in the prologue: [rbp] holds the caller's rbp, [rbp + 8] the return
        // address. Inlined into the entry point, this reads the entry point's record.
        unsafe {
            std::arch::asm!("mov {ra}, qword ptr [rbp + 8]", ra = out(reg) ra, options(nostack, readonly, preserves_flags));
        }
        Some(ra)
    }
    #[cfg(all(ndx_frame_pointers, target_arch = "aarch64", not(miri)))]
    {
        let ra: usize;
        // SAFETY: with frame pointers, x29 points at the frame record {fp, lr}; the
        // saved lr at [x29 + 8] is the entry point's return address.
        unsafe {
            std::arch::asm!("ldr {ra}, [x29, #8]", ra = out(reg) ra, options(nostack, readonly, preserves_flags));
        }
        Some(ra)
    }
    #[cfg(not(all(
        ndx_frame_pointers,
        any(target_arch = "x86_64", target_arch = "aarch64"),
        not(miri)
    )))]
    {
        None
    }
}

/// Copies a host string (NULL allowed when `optional`) into an owned `String`;
/// invalid UTF-8 is replaced, not fatal.
pub(crate) fn host_str(p: *const c_char, arg: &str) -> Result<String> {
    if p.is_null() {
        return Err(Error::value(format!("argument '{arg}' is NULL")));
    }
    // SAFETY: non-NULL, and the caller promises a NUL-terminated string.
    Ok(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// Copies a host name (an operator's or an argument's) into an owned `String`. Names
/// are keys, so one that is not UTF-8 is refused: replacing its invalid bytes, as
/// [`host_str`] does for text, would make distinct names equal.
pub(crate) fn host_name(p: *const c_char, arg: &str) -> Result<String> {
    if p.is_null() {
        return Err(Error::value(format!("argument '{arg}' is NULL")));
    }
    // SAFETY: non-NULL, and the caller promises a NUL-terminated string.
    let bytes = unsafe { CStr::from_ptr(p) }.to_bytes();
    match std::str::from_utf8(bytes) {
        Ok(name) => Ok(name.to_owned()),
        Err(e) => Err(Error::value(format!(
            "argument '{arg}' (\"{}\") is not valid UTF-8: byte 0x{:02x} at offset {}; names must be UTF-8",
            bytes.escape_ascii(),
            bytes[e.valid_up_to()],
            e.valid_up_to()
        ))),
    }
}

/// The library version as `MAJOR * 10000 + MINOR * 100 + PATCH`.
///
/// Thread-safe; never fails.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_version() -> u32 {
    crate::version_number()
}

/// The library version as a static NUL-terminated string, e.g. `"0.1.0"`.
///
/// Thread-safe; never fails; the string is static and must not be freed.
#[unsafe(no_mangle)]
pub extern "C" fn ndx_version_string() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// Test hook: panics inside an entry point with `message`, so tests can check that the
/// panic boundary turns it into an `NDX_ERROR_INTERNAL` error instead of aborting.
/// Compiled only with the cargo feature `test-hooks` (CMake option `NDX_TEST_HOOKS`).
#[cfg(feature = "test-hooks")]
#[unsafe(no_mangle)]
pub extern "C" fn ndx_test_panic(message: *const c_char) -> *mut ndx_error_t {
    boundary("ndx_test_panic", || {
        let message = host_str(message, "message")?;
        panic!("{message}");
    })
}

/// Writes `value`'s result to a caller struct whose first field is its size, refusing
/// a NULL `out` or a size smaller than ours. Once `out` is known good, every field
/// after `struct_size` is zeroed first, so a failure of `value` (a NULL handle, an
/// index out of range) never leaves the caller's struct half-filled or stale.
pub(crate) fn write_sized<T>(
    out: *mut T,
    what: &str,
    value: impl FnOnce(usize) -> Result<T>,
) -> Result<()> {
    let ours = std::mem::size_of::<T>();
    // Errors about the arguments before `out` (a NULL handle, an index out of range)
    // are reported first, in parameter order: `value` only reads, so it can run to
    // find them before `out` is refused.
    if out.is_null() {
        value(ours)?;
        return Err(Error::value("argument 'out' is NULL"));
    }
    // SAFETY: non-NULL; its first field is `struct_size` (API contract).
    let size = unsafe { *out.cast::<usize>() };
    if size < ours {
        value(ours)?;
        return Err(Error::value(format!(
            "out->struct_size is {size}, expected at least {ours} (sizeof({what}))"
        )));
    }
    let head = std::mem::size_of::<usize>();
    // SAFETY: `out` holds at least `size >= sizeof(T)` bytes; the bytes after the
    // leading `struct_size` are plain C memory the caller gave us to write (no Rust
    // value of `T` is formed from them).
    unsafe { out.cast::<u8>().add(head).write_bytes(0, ours - head) };
    let v = value(size)?;
    // SAFETY: as above.
    unsafe { out.write(v) };
    Ok(())
}

/// An options struct (`T`, beginning with `size_t struct_size`) from a non-NULL
/// caller pointer: callers built against an older header pass a smaller struct, at
/// least `min` bytes, and the fields they lack read as zero.
pub(crate) trait Options: Sized {
    /// An all-zero value (NULL pointers, zeros).
    fn zeroed() -> Self;
}

pub(crate) fn read_options<T: Options>(opts: *const T, min: usize) -> Result<T> {
    // SAFETY: non-NULL (the callers check); every options struct begins with its size.
    let size = unsafe { *opts.cast::<usize>() };
    let name = std::any::type_name::<T>()
        .rsplit("::")
        .next()
        .unwrap_or("options");
    size_check(size, min, std::mem::size_of::<T>(), "opts", name)?;
    let mut o = T::zeroed();
    // SAFETY: the caller's struct holds `size` bytes; we copy no more than that, and
    // no more than ours, over a valid value whose remaining fields stay zero.
    unsafe {
        std::ptr::copy_nonoverlapping(
            opts.cast::<u8>(),
            (&mut o as *mut T).cast::<u8>(),
            size.min(std::mem::size_of::<T>()),
        )
    };
    Ok(o)
}

/// Checks a caller's `struct_size` against `min`, the size of the fields of the oldest
/// layout still accepted; `full` is this header's `sizeof(type_name)`, what a caller
/// should set.
pub(crate) fn size_check(
    size: usize,
    min: usize,
    full: usize,
    what: &str,
    type_name: &str,
) -> Result<()> {
    if size < min {
        return Err(Error::value(format!(
            "{what}->struct_size is {size}: set it to sizeof({type_name}), which is {full} \
             (at least {min}, the fields of the oldest layout, is accepted from callers built \
             against an older header)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn a_panic_inside_an_entry_point_becomes_an_internal_error() {
        let e = boundary("ndx_pretend", || panic!("boom"));
        assert!(!e.is_null());
        // SAFETY: made by error_into_raw just above.
        let e = *unsafe { Box::from_raw(e.cast::<Error>()) };
        assert_eq!(e.kind(), ErrorKind::Internal);
        assert_eq!(e.message(), "panic in ndx_pretend: boom");
        assert!(e.site().is_some(), "the caller's site is recorded");
    }

    #[test]
    fn out_params_are_cleared_before_the_body_runs() {
        let mut out = 42usize;
        let e = boundary_out("ndx_pretend", &mut out, 0, || Err(Error::value("no")));
        assert_eq!(out, 0);
        ndx_error_free(e);
        let e = boundary_out("ndx_pretend", std::ptr::null_mut::<usize>(), 0, || Ok(1));
        assert!(!e.is_null(), "a NULL out-param is an error");
        ndx_error_free(e);
    }
}
