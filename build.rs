//! Generates `include/ndx.h` from the Rust sources with cbindgen and gives the shared
//! library its SONAME. The header is committed; CI fails when a build changes it.

use std::path::PathBuf;

fn main() {
    let root =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").expect("cargo sets the version");
    let minor = std::env::var("CARGO_PKG_VERSION_MINOR").expect("cargo sets the version");
    let patch = std::env::var("CARGO_PKG_VERSION_PATCH").expect("cargo sets the version");

    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    println!("cargo:rerun-if-changed=build.rs");

    let target_os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if target_os == "linux" {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libndx.so.{major}");
    }

    let mut config =
        cbindgen::Config::from_file(root.join("cbindgen.toml")).expect("cbindgen.toml parses");
    config.after_includes = Some(format!(
        "\n#define NDX_VERSION_MAJOR {major}\n#define NDX_VERSION_MINOR {minor}\n#define NDX_VERSION_PATCH {patch}\n#define NDX_VERSION_STRING \"{major}.{minor}.{patch}\"\n"
    ));
    let bindings = cbindgen::Builder::new()
        .with_crate(&root)
        .with_config(config)
        .generate()
        .expect("cbindgen generates include/ndx.h");
    // `write_to_file` leaves the file untouched when the content is unchanged, so an
    // up-to-date checkout stays clean and CI can detect a stale committed header.
    bindings.write_to_file(root.join("include").join("ndx.h"));
}
