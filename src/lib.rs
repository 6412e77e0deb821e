//! ndx: tensor operators with a C ABI.
pub mod ffi;

/// The crate version packed as `MAJOR * 10000 + MINOR * 100 + PATCH`.
pub fn version_number() -> u32 {
    let p = |s: &str| s.parse::<u32>().unwrap_or(0);
    p(env!("CARGO_PKG_VERSION_MAJOR")) * 10000
        + p(env!("CARGO_PKG_VERSION_MINOR")) * 100
        + p(env!("CARGO_PKG_VERSION_PATCH"))
}
