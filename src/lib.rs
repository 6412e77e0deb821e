//! ndx: a tensor operator runtime with a C ABI whose errors point at the line that
//! asked for the work. See `DESIGN.md` and `include/ndx.h`.

// The header comes from `ffi` alone: the core modules are not part of the C API.
/// cbindgen:ignore
pub mod checks;
/// cbindgen:ignore
pub mod cuda;
/// cbindgen:ignore
pub mod debug;
/// cbindgen:ignore
pub mod error;
/// cbindgen:ignore
pub mod exec;
pub mod ffi;
/// cbindgen:ignore
pub mod ops;
/// cbindgen:ignore
pub mod tensor;

/// The crate version packed as `MAJOR * 10000 + MINOR * 100 + PATCH`.
pub fn version_number() -> u32 {
    let p = |s: &str| s.parse::<u32>().unwrap_or(0);
    p(env!("CARGO_PKG_VERSION_MAJOR")) * 10000
        + p(env!("CARGO_PKG_VERSION_MINOR")) * 100
        + p(env!("CARGO_PKG_VERSION_PATCH"))
}
