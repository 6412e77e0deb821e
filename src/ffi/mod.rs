//! The C ABI.
use std::ffi::c_char;

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
