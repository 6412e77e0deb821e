//! Property tests that drive the C API (`ndx::ffi`) with random and hostile input.
//!
//! The library's promise: bad input gets an `ndx_error_t` of a caller-facing kind
//! (never NDX_ERROR_INTERNAL, which is what a panic caught at the boundary becomes),
//! and nothing is lost or freed twice (the producer deleters are counted).

mod common;

use std::ffi::{CString, c_void};

use common::*;
use dlpark::DlpackFlags;
use dlpark::ffi::{DLDataType, DLDataTypeCode, DLDevice, DLDeviceType};
use ndx::ffi::*;
use proptest::prelude::*;

const INTERNAL: i32 = ndx_error_kind_t::NDX_ERROR_INTERNAL as i32;

/// Takes an error that must exist and must not be INTERNAL; its kind and message.
fn caller_error(e: *mut ndx_error_t, what: &str) -> (i32, String) {
    let (kind, msg) = take_error(e).unwrap_or_else(|| panic!("{what}: expected an error"));
    assert_ne!(
        kind, INTERNAL,
        "{what}: internal error (a caught panic?): {msg}"
    );
    assert!(!msg.is_empty(), "{what}: error without a message");
    (kind, msg)
}

/// Frees an error if there is one, failing on INTERNAL.
fn no_internal(e: *mut ndx_error_t, what: &str) -> Option<(i32, String)> {
    (!e.is_null()).then(|| caller_error(e, what))
}

/// `cases` per property (modest, for CI), unless `PROPTEST_CASES` asks for more (a
/// longer search: `PROPTEST_CASES=20000 cargo test --test fuzz_api`).
fn config(cases: u32) -> ProptestConfig {
    let asked = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok());
    ProptestConfig {
        cases: asked.unwrap_or(cases),
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------------------------
// DLPack import
// ---------------------------------------------------------------------------------

/// Backing bytes of every produced tensor: imports that validate read only what the
/// geometry covers, and this test reads data only when the geometry fits in it.
const BACKING: usize = 256;

fn extent() -> impl Strategy<Value = i64> {
    prop_oneof![
        30 => 0i64..5,
        1 => -3i64..0,
        1 => Just(i64::MIN),
        1 => Just(i64::MAX),
        1 => Just(1i64 << 32),
        1 => Just(1i64 << 62),
        1 => any::<i64>(),
    ]
}

fn stride() -> impl Strategy<Value = i64> {
    prop_oneof![
        24 => -4i64..5,
        1 => Just(i64::MIN),
        1 => Just(i64::MAX),
        1 => Just(1i64 << 40),
        1 => any::<i64>(),
    ]
}

fn dl_dtype() -> impl Strategy<Value = DLDataType> {
    let valid = (1i32..=13).prop_map(|d| dl_of(d).0);
    let code = prop_oneof![4 => 0u8..7, 1 => any::<u8>()];
    let bits = prop_oneof![4 => prop::sample::select(vec![8u8, 16, 32, 64]), 1 => any::<u8>()];
    let lanes = prop_oneof![6 => Just(1u16), 1 => any::<u16>()];
    let random = (code, bits, lanes).prop_map(|(code, bits, lanes)| DLDataType {
        code: DLDataTypeCode(code),
        bits,
        lanes,
    });
    prop_oneof![4 => valid, 1 => random]
}

fn dl_device() -> impl Strategy<Value = DLDevice> {
    let ty = prop_oneof![
        12 => Just(1u32),
        1 => prop::sample::select(vec![2u32, 3, 13]),
        1 => any::<u32>(),
    ];
    let id = prop_oneof![12 => Just(0i32), 1 => any::<i32>()];
    (ty, id).prop_map(|(ty, id)| DLDevice {
        device_type: DLDeviceType(ty),
        device_id: id,
    })
}

/// An import options struct, described.
#[derive(Debug, Clone)]
struct Opts {
    struct_size: usize,
    layout: Option<String>,
    read_only: bool,
}

fn import_opts() -> impl Strategy<Value = Option<Opts>> {
    let full = std::mem::size_of::<ndx_import_options_t>();
    let size = prop_oneof![8 => Just(full), 1 => 0usize..full, 1 => Just(full + 64)];
    let layout = prop::option::of(prop_oneof![
        Just(String::new()),
        "[A-Za-z]{0,5}",
        "[ -~]{0,4}",
        Just("HWC".to_string()),
    ]);
    prop::option::of(
        (size, layout, any::<bool>()).prop_map(|(struct_size, layout, read_only)| Opts {
            struct_size,
            layout,
            read_only,
        }),
    )
}

/// Options with room to spare, so a `struct_size` larger than ours stays in bounds.
#[repr(C)]
struct PaddedOpts {
    opts: ndx_import_options_t,
    _pad: [u8; 64],
}

/// The C options for `o` (its layout string must outlive the call).
fn c_opts(o: &Opts, layout: &Option<CString>) -> PaddedOpts {
    PaddedOpts {
        opts: ndx_import_options_t {
            struct_size: o.struct_size,
            layout: layout.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            read_only: o.read_only,
            stream: std::ptr::null_mut(),
        },
        _pad: [0; 64],
    }
}

#[derive(Debug, Clone)]
struct Hostile {
    shape: Vec<i64>,
    strides: Option<Vec<i64>>,
    /// An ndim that differs from the shape's length: only values outside 0..=32 (so
    /// the library must refuse it before reading) or smaller than the length.
    ndim: Option<i32>,
    dtype: DLDataType,
    device: DLDevice,
    byte_offset: u64,
    null_data: bool,
    null_shape: bool,
    flags: u64,
    major: u32,
    opts: Option<Opts>,
    null_out: bool,
}

fn hostile() -> impl Strategy<Value = Hostile> {
    let shape_strides = prop::collection::vec((extent(), stride()), 0..6);
    let ndim = prop_oneof![
        16 => Just(None),
        1 => prop::sample::select(vec![-1i32, i32::MIN, 33, 1000, i32::MAX]).prop_map(Some),
        1 => (0i32..6).prop_map(|n| Some(-n - 1)),
        1 => (0i32..6).prop_map(Some), // clipped to the shape's length below
    ];
    let byte_offset = prop_oneof![
        12 => Just(0u64),
        4 => 0u64..64,
        1 => Just(u64::MAX),
        1 => Just(1u64 << 63),
        1 => any::<u64>(),
    ];
    let major = prop_oneof![16 => Just(1u32), 1 => Just(0u32), 1 => any::<u32>()];
    let flags = prop_oneof![4 => 0u64..8, 1 => any::<u64>()];
    (
        (
            shape_strides,
            any::<bool>(),
            ndim,
            dl_dtype(),
            dl_device(),
            byte_offset,
        ),
        (
            prop::bool::weighted(0.05),
            prop::bool::weighted(0.05),
            flags,
            major,
            import_opts(),
            prop::bool::weighted(0.03),
        ),
    )
        .prop_map(
            |(
                (dims, with_strides, ndim, dtype, device, byte_offset),
                (null_data, null_shape, flags, major, opts, null_out),
            )| {
                let (shape, strides): (Vec<i64>, Vec<i64>) = dims.into_iter().unzip();
                let ndim = ndim.map(|n| {
                    if (0..=32).contains(&n) {
                        n.min(shape.len() as i32)
                    } else {
                        n
                    }
                });
                Hostile {
                    shape,
                    strides: with_strides.then_some(strides),
                    ndim,
                    dtype,
                    device,
                    byte_offset,
                    null_data,
                    null_shape,
                    flags,
                    major,
                    opts,
                    null_out,
                }
            },
        )
}

impl Hostile {
    fn spec(&self) -> Spec {
        Spec {
            data: (0..BACKING).map(|i| i as u8).collect(),
            dtype: self.dtype,
            device: self.device,
            shape: self.shape.clone(),
            strides: self.strides.clone(),
            byte_offset: self.byte_offset,
            ndim: self.ndim,
            null_data: self.null_data,
            null_shape: self.null_shape,
            flags: DlpackFlags::from_bits_retain(self.flags),
            major: self.major,
        }
    }

    /// Whether the elements the tensor describes lie inside the backing bytes, aligned,
    /// on the host: then reading them is within the producer's promise.
    fn readable(&self, shape: &[i64], strides: &[i64], itemsize: usize) -> bool {
        if self.device.device_type != DLDeviceType::CPU {
            return false;
        }
        if shape.contains(&0) {
            return true;
        }
        if !self.byte_offset.is_multiple_of(itemsize as u64) {
            return false;
        }
        let (mut lo, mut hi) = (0i128, 0i128);
        for (&d, &s) in shape.iter().zip(strides) {
            let reach = (d as i128 - 1) * s as i128;
            if reach < 0 { lo += reach } else { hi += reach }
        }
        let item = itemsize as i128;
        let lo = self.byte_offset as i128 + lo * item;
        let hi = self.byte_offset as i128 + (hi + 1) * item;
        lo >= 0 && hi <= BACKING as i128
    }
}

/// Checks a tensor that an import accepted: its metadata is what was given, and (when
/// its elements lie in the backing) it copies out and exports.
fn check_imported(t: *mut ndx_tensor_t, h: &Hostile) {
    let shape = shape_of(t);
    let ndim = h.ndim.unwrap_or(h.shape.len() as i32) as usize;
    assert_eq!(shape, h.shape[..ndim], "the imported shape");
    let strides = strides_of(t);
    if let Some(s) = &h.strides
        && ndim > 0
    {
        assert_eq!(strides, s[..ndim], "the imported strides");
    }
    let (mut numel, mut nbytes) = (0usize, 0usize);
    ok(ndx_tensor_numel(t, &mut numel));
    ok(ndx_tensor_nbytes(t, &mut nbytes));
    let expect: u128 = shape.iter().map(|&d| d as u128).product();
    assert_eq!(numel as u128, expect);
    let mut dtype = 0;
    ok(ndx_tensor_dtype(t, &mut dtype));
    let itemsize = nbytes.checked_div(numel).unwrap_or(0);
    if numel > 0 {
        assert_eq!(nbytes, numel * itemsize);
    }
    // (A broadcast view of a few bytes may describe far more elements than a test
    // should copy out.)
    if numel > 0 && nbytes <= 1 << 16 && h.readable(&shape, &strides, itemsize) {
        let mut buf = vec![0u8; nbytes];
        ok(ndx_tensor_copy_to(t, buf.as_mut_ptr().cast(), buf.len()));
        let e = ndx_tensor_copy_to(t, buf.as_mut_ptr().cast(), nbytes - 1);
        caller_error(e, "copy_to into a short buffer");
    }
    // Export and give the export back: ndx's storage stays alive until its deleter.
    let mut m = std::ptr::null_mut();
    let e = ndx_tensor_to_dlpack_versioned(t, &mut m);
    if let Some((kind, msg)) = no_internal(e, "export") {
        // CUDA memory may need a driver to order the export; host memory exports.
        assert_ne!(
            h.device.device_type,
            DLDeviceType::CPU,
            "export of an accepted host tensor failed: kind {kind}: {msg}"
        );
        return;
    }
    assert!(!m.is_null());
    // SAFETY: a live export ndx made; its deleter is called once.
    unsafe { ((*m).deleter.expect("export deleter"))(m) };
}

/// Calls `import` with `h`'s options (or NULL) and out-param (or NULL): its error and
/// the tensor it gave.
fn import_with(
    h: &Hostile,
    import: impl FnOnce(*const ndx_import_options_t, *mut *mut ndx_tensor_t) -> *mut ndx_error_t,
) -> (*mut ndx_error_t, *mut ndx_tensor_t) {
    let layout = h
        .opts
        .as_ref()
        .and_then(|o| o.layout.as_ref())
        .and_then(|s| CString::new(s.as_str()).ok());
    let opts = h.opts.as_ref().map(|o| c_opts(o, &layout));
    let opts_ptr = opts
        .as_ref()
        .map_or(std::ptr::null(), |o| &o.opts as *const _);
    let mut t: *mut ndx_tensor_t = std::ptr::null_mut();
    let out = if h.null_out {
        std::ptr::null_mut()
    } else {
        &mut t as *mut _
    };
    let e = import(opts_ptr, out);
    (e, t)
}

/// One versioned import of `h`: checks the ownership contract. Returns whether it
/// was accepted.
fn import_versioned_once(h: &Hostile) -> bool {
    let (m, count) = h.spec().versioned();
    let (e, t) = import_with(h, |opts, out| {
        ndx_tensor_from_dlpack_versioned(m, opts, out)
    });
    if e.is_null() {
        assert!(!h.null_out, "a NULL out-param was accepted");
        assert!(!t.is_null());
        assert_eq!(h.major, 1, "an unknown major version was accepted");
        assert_eq!(calls(&count), 0, "deleter called while the tensor lives");
        check_imported(t, h);
        assert_eq!(calls(&count), 0, "deleter called while the tensor lives");
        ndx_tensor_release(t);
        assert_eq!(calls(&count), 1, "deleter calls after the last release");
        true
    } else {
        let (kind, msg) = caller_error(e, "versioned import");
        assert!(t.is_null(), "out set on failure: {msg}");
        if h.major != 1 {
            // The specification: the consumer calls the deleter of an unknown version.
            assert_eq!(kind, ndx_error_kind_t::NDX_ERROR_VALUE as i32, "{msg}");
            assert_eq!(calls(&count), 1, "unknown version, deleter calls: {msg}");
        } else {
            assert_eq!(calls(&count), 0, "deleter called on a failed import: {msg}");
            drop_versioned(m);
            assert_eq!(calls(&count), 1);
        }
        false
    }
}

/// One legacy import of `h` (no version, no flags).
fn import_legacy_once(h: &Hostile) -> bool {
    let (m, count) = h.spec().legacy();
    let (e, t) = import_with(h, |opts, out| ndx_tensor_from_dlpack(m, opts, out));
    if e.is_null() {
        assert!(!h.null_out, "a NULL out-param was accepted");
        assert!(!t.is_null());
        check_imported(t, h);
        assert_eq!(calls(&count), 0, "deleter called while the tensor lives");
        ndx_tensor_release(t);
        assert_eq!(calls(&count), 1, "deleter calls after the last release");
        true
    } else {
        let (_, msg) = caller_error(e, "legacy import");
        assert!(t.is_null(), "out set on failure: {msg}");
        assert_eq!(calls(&count), 0, "deleter called on a failed import: {msg}");
        drop_legacy(m);
        assert_eq!(calls(&count), 1);
        false
    }
}

proptest! {
    #![proptest_config(config(400))]

    #[test]
    fn versioned_dlpack_import_errs_cleanly_or_owns_the_tensor(h in hostile()) {
        import_versioned_once(&h);
    }

    #[test]
    fn legacy_dlpack_import_errs_cleanly_or_owns_the_tensor(h in hostile()) {
        import_legacy_once(&h);
    }
}

// ---------------------------------------------------------------------------------
// Invocations
// ---------------------------------------------------------------------------------

/// How many inputs an operator takes: exactly `n`, or 1 to 3 (variadic).
#[derive(Debug, Clone, Copy)]
enum Arity {
    Exactly(usize),
    Variadic,
}

/// The built-in operators (src/ops) with their arity and argument names, and names
/// that are no operator.
const OPS: &[(&str, Arity, &[&str])] = {
    use Arity::*;
    const RED: &[&str] = &["axes", "keepdims"];
    const ARG: &[&str] = &["axis", "keepdims"];
    &[
        ("add", Exactly(2), &[]),
        ("sub", Exactly(2), &[]),
        ("mul", Exactly(2), &[]),
        ("div", Exactly(2), &[]),
        ("floordiv", Exactly(2), &[]),
        ("mod", Exactly(2), &[]),
        ("pow", Exactly(2), &[]),
        ("minimum", Exactly(2), &[]),
        ("maximum", Exactly(2), &[]),
        ("eq", Exactly(2), &[]),
        ("ne", Exactly(2), &[]),
        ("lt", Exactly(2), &[]),
        ("le", Exactly(2), &[]),
        ("gt", Exactly(2), &[]),
        ("ge", Exactly(2), &[]),
        ("logical_and", Exactly(2), &[]),
        ("logical_or", Exactly(2), &[]),
        ("logical_xor", Exactly(2), &[]),
        ("neg", Exactly(1), &[]),
        ("abs", Exactly(1), &[]),
        ("sign", Exactly(1), &[]),
        ("relu", Exactly(1), &[]),
        ("floor", Exactly(1), &[]),
        ("ceil", Exactly(1), &[]),
        ("round", Exactly(1), &[]),
        ("sqrt", Exactly(1), &[]),
        ("rsqrt", Exactly(1), &[]),
        ("exp", Exactly(1), &[]),
        ("log", Exactly(1), &[]),
        ("sin", Exactly(1), &[]),
        ("cos", Exactly(1), &[]),
        ("tanh", Exactly(1), &[]),
        ("sigmoid", Exactly(1), &[]),
        ("isnan", Exactly(1), &[]),
        ("isfinite", Exactly(1), &[]),
        ("logical_not", Exactly(1), &[]),
        ("clamp", Exactly(1), &["lo", "hi"]),
        ("where", Exactly(3), &[]),
        ("sum", Exactly(1), RED),
        ("prod", Exactly(1), RED),
        ("mean", Exactly(1), RED),
        ("min", Exactly(1), RED),
        ("max", Exactly(1), RED),
        ("all", Exactly(1), RED),
        ("any", Exactly(1), RED),
        ("argmin", Exactly(1), ARG),
        ("argmax", Exactly(1), ARG),
        ("reshape", Exactly(1), &["shape"]),
        ("squeeze", Exactly(1), &["axes"]),
        ("expand_dims", Exactly(1), &["axis"]),
        ("transpose", Exactly(1), &["perm"]),
        ("slice", Exactly(1), &["start", "end", "step", "axes"]),
        ("flip", Exactly(1), &["axes"]),
        ("pad", Exactly(1), &["widths", "value"]),
        ("concat", Variadic, &["axis"]),
        ("batch_to_tensor", Variadic, &[]),
        ("stack", Variadic, &["axis"]),
        ("crop", Exactly(1), &["x", "y", "w", "h"]),
        ("resize", Exactly(1), &["h", "w", "interp"]),
        ("rgb_to_gray", Exactly(1), &[]),
        ("flip_horizontal", Exactly(1), &[]),
        ("flip_vertical", Exactly(1), &[]),
        ("normalize", Exactly(1), &["mean", "std"]),
        ("check", Exactly(1), &["message"]),
        ("check_finite", Exactly(1), &[]),
        ("check_range", Exactly(1), &["lo", "hi"]),
        ("check_shape", Exactly(1), &["pattern"]),
        ("to_device", Exactly(1), &["device"]),
        ("to_host", Exactly(1), &[]),
        ("cast", Exactly(1), &["dtype"]),
        // not operators
        ("", Variadic, &[]),
        ("ADD", Exactly(2), &[]),
        ("no_such_op", Exactly(1), &[]),
        ("add ", Exactly(2), &[]),
    ]
};

/// Argument names the built-ins take, and some they do not.
const ARG_NAMES: &[&str] = &[
    "axis", "axes", "keepdims", "shape", "perm", "start", "end", "step", "widths", "value", "x",
    "y", "w", "h", "interp", "mean", "std", "lo", "hi", "message", "pattern", "device", "dtype",
    "bogus", "",
];

#[derive(Debug, Clone)]
enum ArgVal {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    Ints(Vec<i64>),
    Floats(Vec<f64>),
    DType(i32),
}

/// Small integers and extreme ones. No large positive value that an operator would
/// honour: `pad` widths or `resize` extents of 2^31 make real outputs of gigabytes
/// (ndx allocates what it is asked for; refused, with NDX_ERROR_MEMORY, only when
/// the allocation fails), which a test must not do.
fn small_int() -> impl Strategy<Value = i64> {
    prop_oneof![
        8 => -4i64..6,
        1 => prop::sample::select(vec![
            i64::MIN,
            i64::MAX,
            i64::MIN + 1,
            i64::MAX / 2,
            -(1 << 31),
            -(1 << 40),
        ]),
    ]
}

fn float_val() -> impl Strategy<Value = f64> {
    prop_oneof![
        6 => -4.0f64..4.0,
        1 => prop::sample::select(vec![
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            0.0,
            -0.0,
            f64::MAX,
            f64::MIN_POSITIVE,
            1e300,
        ]),
    ]
}

fn arg_val() -> impl Strategy<Value = ArgVal> {
    prop_oneof![
        3 => small_int().prop_map(ArgVal::Int),
        1 => float_val().prop_map(ArgVal::Float),
        1 => any::<bool>().prop_map(ArgVal::Bool),
        1 => prop_oneof![
            Just("linear".to_string()),
            Just("nearest".to_string()),
            "[ -~]{0,8}",
        ]
        .prop_map(ArgVal::Str),
        3 => prop::collection::vec(small_int(), 0..5).prop_map(ArgVal::Ints),
        1 => prop::collection::vec(float_val(), 0..5).prop_map(ArgVal::Floats),
        1 => (-1i32..16).prop_map(ArgVal::DType),
    ]
}

/// A value of the type argument `name` has in the built-ins' schemas.
fn typed_val(name: &'static str) -> BoxedStrategy<ArgVal> {
    match name {
        "axis" | "x" | "y" | "w" | "h" | "device" => small_int().prop_map(ArgVal::Int).boxed(),
        "keepdims" => any::<bool>().prop_map(ArgVal::Bool).boxed(),
        "lo" | "hi" | "value" => float_val().prop_map(ArgVal::Float).boxed(),
        "mean" | "std" => prop::collection::vec(float_val(), 0..4)
            .prop_map(ArgVal::Floats)
            .boxed(),
        "interp" | "message" => prop_oneof![
            Just("linear".to_string()),
            Just("nearest".to_string()),
            "[ -~]{0,8}",
        ]
        .prop_map(ArgVal::Str)
        .boxed(),
        "dtype" => prop_oneof![8 => 1i32..=13, 1 => -1i32..16]
            .prop_map(ArgVal::DType)
            .boxed(),
        _ => prop::collection::vec(small_int(), 0..5)
            .prop_map(ArgVal::Ints)
            .boxed(),
    }
}

/// Arguments for an operator taking `names`: mostly its own, mostly well typed.
fn args_for(names: &'static [&'static str]) -> BoxedStrategy<Vec<(&'static str, ArgVal)>> {
    let stray = prop::sample::select(ARG_NAMES)
        .prop_flat_map(|name| prop_oneof![typed_val(name), arg_val()].prop_map(move |v| (name, v)));
    if names.is_empty() {
        return prop_oneof![6 => Just(Vec::new()), 1 => prop::collection::vec(stray, 1..3)].boxed();
    }
    let own = prop::sample::select(names).prop_flat_map(|name| {
        prop_oneof![12 => typed_val(name), 1 => arg_val()].prop_map(move |v| (name, v))
    });
    let one = prop_oneof![12 => own, 1 => stray];
    prop::collection::vec(one, 0..=names.len() + 1).boxed()
}

/// A small valid host tensor: dtype, shape, layout, and per-dimension stride tricks
/// (0: compact, 1: reversed, 2: broadcast with stride 0, 3: an extreme stride on an
/// extent of 1).
#[derive(Debug, Clone)]
struct SmallTensor {
    dtype: i32,
    shape: Vec<i64>,
    layout: Option<&'static str>,
    tricks: Vec<u8>,
    seed: u64,
}

/// A tensor like `(dtype, shape)`: mostly that dtype, and that shape, a broadcast of
/// it (some extents 1, leading ones dropped) or another shape.
fn like(dtype: i32, shape: Vec<i64>) -> impl Strategy<Value = SmallTensor> {
    let n = shape.len();
    let dtype = prop_oneof![3 => Just(dtype), 1 => 1i32..=13];
    let shape = prop_oneof![
        3 => Just(shape.clone()),
        2 => (prop::collection::vec(prop::bool::weighted(0.3), n), 0..=n).prop_map(
            move |(ones, drop)| {
                shape
                    .iter()
                    .zip(&ones)
                    .map(|(&d, &one)| if one { 1 } else { d })
                    .skip(drop)
                    .collect::<Vec<_>>()
            }
        ),
        1 => prop::collection::vec(0i64..5, 0..5),
    ];
    (
        dtype,
        shape,
        prop::collection::vec(prop_oneof![6 => Just(0u8), 1 => 1u8..4], 4),
        any::<bool>(),
        any::<u64>(),
    )
        .prop_map(|(dtype, shape, mut tricks, with_layout, seed)| {
            tricks.truncate(shape.len());
            let layout = match (with_layout, shape.len()) {
                (true, 1) => Some("C"),
                (true, 2) => Some("HW"),
                (true, 3) => Some(if seed.is_multiple_of(2) { "HWC" } else { "CHW" }),
                _ => None,
            };
            SmallTensor {
                dtype,
                shape,
                layout,
                tricks,
                seed,
            }
        })
}

/// `ndx_dtype_t` to its DLPack type and size.
fn dl_of(dtype: i32) -> (DLDataType, usize) {
    let (code, bits) = match dtype {
        1 => (6, 8),
        2 => (0, 8),
        3 => (0, 16),
        4 => (0, 32),
        5 => (0, 64),
        6 => (1, 8),
        7 => (1, 16),
        8 => (1, 32),
        9 => (1, 64),
        10 => (2, 16),
        11 => (4, 16),
        12 => (2, 32),
        13 => (2, 64),
        _ => unreachable!(),
    };
    (
        DLDataType {
            code: DLDataTypeCode(code),
            bits,
            lanes: 1,
        },
        bits as usize / 8,
    )
}

impl SmallTensor {
    /// The producer tensor: random bytes (0/1 for bool) under the stride tricks.
    fn spec(&self) -> Spec {
        let (dl, item) = dl_of(self.dtype);
        let mut strides = vec![0i64; self.shape.len()];
        let mut acc = 1i64;
        for i in (0..self.shape.len()).rev() {
            strides[i] = acc;
            acc *= self.shape[i].max(1);
        }
        let numel: i64 = self.shape.iter().product();
        let mut offset = 0i64;
        for (i, &t) in self.tricks.iter().enumerate() {
            match t {
                1 if self.shape[i] > 0 => {
                    offset += (self.shape[i] - 1) * strides[i];
                    strides[i] = -strides[i];
                }
                2 => strides[i] = 0,
                // Any stride is valid on an extent of 1: an extreme one.
                3 if self.shape[i] == 1 => {
                    strides[i] = [i64::MIN, i64::MAX, i64::MAX / 3][self.seed as usize % 3]
                }
                _ => {}
            }
        }
        let n = acc.max(1) as usize * item;
        let mut state = self.seed | 1;
        let data = (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                if self.dtype == 1 {
                    (state & 1) as u8
                } else {
                    state as u8
                }
            })
            .collect();
        let mut spec = Spec::f32s(&[], &self.shape);
        spec.data = data;
        spec.dtype = dl;
        spec.strides = Some(strides);
        spec.byte_offset = if numel == 0 {
            0
        } else {
            (offset as usize * item) as u64
        };
        spec
    }
}

#[derive(Debug, Clone)]
struct Invocation {
    op: &'static str,
    inputs: Vec<SmallTensor>,
    /// Each input as a batch of itself (per-sample invocation) instead of a tensor.
    as_batch: bool,
    args: Vec<(&'static str, ArgVal)>,
}

fn invocation() -> impl Strategy<Value = Invocation> {
    (
        0..OPS.len(),
        1i32..=13,
        prop::collection::vec(0i64..4, 0..4),
    )
        .prop_flat_map(|(i, dtype, shape)| {
            let (op, arity, names) = OPS[i];
            let count = match arity {
                Arity::Exactly(n) => prop_oneof![8 => Just(n), 1 => 0usize..4].boxed(),
                Arity::Variadic => (0usize..4).boxed(),
            };
            let inputs =
                count.prop_flat_map(move |c| prop::collection::vec(like(dtype, shape.clone()), c));
            (Just(op), inputs, prop::bool::weighted(0.1), args_for(names))
        })
        .prop_map(|(op, inputs, as_batch, args)| Invocation {
            op,
            inputs,
            as_batch,
            args,
        })
}

/// Sets one argument; an invalid one (the dtype value) is refused with an error.
fn set_arg(a: *mut ndx_args_t, name: &str, v: &ArgVal) {
    let name = CString::new(name).unwrap();
    let n = name.as_ptr();
    let e = match v {
        ArgVal::Int(i) => ndx_args_set_int(a, n, *i),
        ArgVal::Float(f) => ndx_args_set_float(a, n, *f),
        ArgVal::Bool(b) => ndx_args_set_bool(a, n, *b),
        ArgVal::Str(s) => {
            let s = CString::new(s.as_str()).unwrap_or_default();
            ndx_args_set_string(a, n, s.as_ptr())
        }
        ArgVal::Ints(v) => ndx_args_set_int_array(a, n, v.as_ptr(), v.len()),
        ArgVal::Floats(v) => ndx_args_set_float_array(a, n, v.as_ptr(), v.len()),
        ArgVal::DType(d) => ndx_args_set_dtype(a, n, *d),
    };
    if let Some((kind, msg)) = no_internal(e, "ndx_args_set_*") {
        assert!(
            matches!(v, ArgVal::DType(d) if !(1..=13).contains(d)),
            "setting {v:?} failed: kind {kind}: {msg}"
        );
    }
}

/// Reads a finished output: metadata and (host) data.
fn read_output_tensor(t: *mut ndx_tensor_t) {
    let shape = shape_of(t);
    let mut nbytes = 0usize;
    ok(ndx_tensor_nbytes(t, &mut nbytes));
    let mut numel = 0usize;
    ok(ndx_tensor_numel(t, &mut numel));
    assert_eq!(
        numel as i128,
        shape.iter().map(|&d| d as i128).product::<i128>()
    );
    assert!(
        nbytes <= 1 << 20,
        "an output of {nbytes} bytes from small inputs"
    );
    let mut buf = vec![0u8; nbytes];
    ok(ndx_tensor_copy_to(
        t,
        buf.as_mut_ptr().cast::<c_void>(),
        nbytes,
    ));
}

/// Runs one invocation in SYNC_CPU on a fresh context; checks the outcome and that
/// every producer deleter ran exactly once once everything is released.
fn invoke_once(inv: &Invocation) {
    let mut counts = Vec::new();
    let mut tensors = Vec::new();
    let mut batches = Vec::new();
    for s in &inv.inputs {
        let layout = s.layout.map(|l| CString::new(l).unwrap());
        let opts = ndx_import_options_t {
            struct_size: std::mem::size_of::<ndx_import_options_t>(),
            layout: layout.as_ref().map_or(std::ptr::null(), |l| l.as_ptr()),
            read_only: false,
            stream: std::ptr::null_mut(),
        };
        let (m, count) = s.spec().versioned();
        counts.push(count);
        if inv.as_batch {
            let mut b = std::ptr::null_mut();
            ok(ndx_batch_from_dlpack_versioned(&m, 1, &opts, &mut b));
            batches.push(b);
        } else {
            let mut t = std::ptr::null_mut();
            ok(ndx_tensor_from_dlpack_versioned(m, &opts, &mut t));
            tensors.push(t);
        }
    }
    let inputs: Vec<ndx_input_t> = tensors
        .iter()
        .map(|&t| ndx_input_t {
            tensor: t,
            batch: std::ptr::null(),
        })
        .chain(batches.iter().map(|&b| ndx_input_t {
            tensor: std::ptr::null(),
            batch: b,
        }))
        .collect();

    let mut args = std::ptr::null_mut();
    ok(ndx_args_new(&mut args));
    for (name, v) in &inv.args {
        set_arg(args, name, v);
    }

    let ctx = Ctx::new(ndx_eval_mode_t::NDX_EVAL_SYNC_CPU as i32);
    ok(ndx_context_set_capture_policy(
        ctx.0,
        ndx_capture_policy_t::NDX_CAPTURE_OFF as i32,
        0,
    ));
    let opts = ndx_invoke_options_t {
        struct_size: std::mem::size_of::<ndx_invoke_options_t>(),
        location: ndx_location_t {
            file: std::ptr::null(),
            line: 0,
            function: std::ptr::null(),
        },
        mode: ndx_eval_mode_t::NDX_EVAL_SYNC_CPU as i32,
        outputs: std::ptr::null(),
        n_outputs: 0,
    };
    let op = CString::new(inv.op).unwrap();
    match invoke_with(&ctx, &op, &inputs, args, &opts) {
        Err(e) => {
            caller_error(e, "ndx_invoke");
        }
        Ok(f) => {
            assert!(!f.is_null());
            let status = ndx_future_poll(f);
            if status == ndx_future_status_t::NDX_FUTURE_READY as i32 {
                let mut n = 0usize;
                ok(ndx_future_output_count(f, &mut n));
                for i in 0..n {
                    let mut t = std::ptr::null_mut();
                    let e = ndx_future_tensor(f, i, &mut t);
                    if e.is_null() {
                        read_output_tensor(t);
                        ndx_tensor_release(t);
                    } else {
                        caller_error(e, "ndx_future_tensor");
                        let mut b = std::ptr::null_mut();
                        ok(ndx_future_batch(f, i, &mut b));
                        let mut size = 0usize;
                        ok(ndx_batch_size(b, &mut size));
                        for j in 0..size {
                            let mut t = std::ptr::null_mut();
                            ok(ndx_batch_sample(b, j, &mut t));
                            read_output_tensor(t);
                            ndx_tensor_release(t);
                        }
                        ndx_batch_release(b);
                    }
                }
                ok(ndx_future_wait(f, -1));
            } else {
                assert_eq!(
                    status,
                    ndx_future_status_t::NDX_FUTURE_FAILED as i32,
                    "a SYNC_CPU future is complete on return"
                );
                caller_error(ndx_future_error(f), "the future's error");
                caller_error(ndx_future_wait(f, -1), "the wait's error");
            }
            ndx_future_release(f);
        }
    }
    ndx_args_free(args);
    for t in tensors {
        ndx_tensor_release(t);
    }
    for b in batches {
        ndx_batch_release(b);
    }
    drop(ctx); // waits for workers that might still hold references
    for (i, c) in counts.iter().enumerate() {
        assert_eq!(
            calls(c),
            1,
            "input {i}: deleter calls after everything was released"
        );
    }
}

proptest! {
    #![proptest_config(config(500))]

    #[test]
    fn sync_invocations_succeed_or_fail_cleanly(inv in invocation()) {
        invoke_once(&inv);
    }
}
