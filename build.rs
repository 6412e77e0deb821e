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

    // Frame pointers let an entry point read its caller's return address in one load
    // (src/ffi/mod.rs); without them ndx unwinds one frame instead.
    println!("cargo:rustc-check-cfg=cfg(ndx_frame_pointers)");
    println!("cargo:rerun-if-env-changed=CARGO_ENCODED_RUSTFLAGS");
    let flags = std::env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    let flags: Vec<&str> = flags.split('\x1f').collect();
    let forced = flags.iter().enumerate().any(|(i, f)| {
        let value = f
            .strip_prefix("-C")
            .map(str::trim_start)
            .filter(|v| !v.is_empty());
        let value = value.or_else(|| (*f == "-C").then(|| flags.get(i + 1).copied()).flatten());
        matches!(
            value,
            Some(
                "force-frame-pointers=yes"
                    | "force-frame-pointers=on"
                    | "force-frame-pointers=true"
                    | "force-frame-pointers"
            )
        )
    });
    if forced {
        println!("cargo:rustc-cfg=ndx_frame_pointers");
    }

    let target_os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if target_os == "linux" {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libndx.so.{major}");
    }

    let mut config =
        cbindgen::Config::from_file(root.join("cbindgen.toml")).expect("cbindgen.toml parses");
    config.trailer = Some(
        "\n/** The caller's source location, for `ndx_invoke_options_t.location`:\n *  `ndx_invoke_options_t o = {.struct_size = sizeof o, .location = NDX_HERE};` */\n#ifdef __cplusplus\n#define NDX_HERE (ndx_location_t{__FILE__, (uint32_t)__LINE__, __func__})\n#else\n#define NDX_HERE ((ndx_location_t){__FILE__, (uint32_t)__LINE__, __func__})\n#endif\n".to_string(),
    );
    config.after_includes = Some(format!(
        "\n#define NDX_VERSION_MAJOR {major}\n#define NDX_VERSION_MINOR {minor}\n#define NDX_VERSION_PATCH {patch}\n#define NDX_VERSION_STRING \"{major}.{minor}.{patch}\"\n\n/** The stream value meaning \"do not order\" (DLPack's -1): for\n *  ndx_import_options_t.stream the imported CUDA memory is ready as is; for\n *  ndx_tensor_to_dlpack_versioned_stream the consumer synchronises by itself. */\n#define NDX_STREAM_NO_SYNC ((void *)(intptr_t)-1)\n"
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
