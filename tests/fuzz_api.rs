//! Property tests that drive the C API (`ndx::ffi`) with random and hostile input.
//!
//! The library's promise: bad input gets an `ndx_error_t` of a caller-facing kind
//! (never NDX_ERROR_INTERNAL, which is what a panic caught at the boundary becomes),
//! and nothing is lost or freed twice (the producer deleters are counted).

mod common;

use std::ffi::{CString, c_void};

use common::*;
use dlpark::DlpackFlags;
use dlpark::ffi::{
    DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLManagedTensorVersioned, DLPackVersion,
    DLTensor,
};
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
    /// An ndim that differs from the shape's length: only values outside 0..=64 (so
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
        1 => prop::sample::select(vec![-1i32, i32::MIN, 65, 1000, i32::MAX]).prop_map(Some),
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
                let ndim = fitted_ndim(ndim, shape.len());
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

/// A chosen ndim: a valid one (0..=64) at most the shape's length (the shape array
/// holds no more), an invalid one as it is.
fn fitted_ndim(ndim: Option<i32>, len: usize) -> Option<i32> {
    ndim.map(|n| {
        if (0..=64).contains(&n) {
            n.min(len as i32)
        } else {
            n
        }
    })
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

/// Calls `f` with the C options `opts` describes (NULL for `None`).
fn with_opts<R>(opts: &Option<Opts>, f: impl FnOnce(*const ndx_import_options_t) -> R) -> R {
    let layout = opts
        .as_ref()
        .and_then(|o| o.layout.as_ref())
        .and_then(|s| CString::new(s.as_str()).ok());
    let c = opts.as_ref().map(|o| c_opts(o, &layout));
    f(c.as_ref().map_or(std::ptr::null(), |o| &o.opts as *const _))
}

/// Calls `import` with `h`'s options (or NULL) and out-param (or NULL): its error and
/// the tensor it gave.
fn import_with(
    h: &Hostile,
    import: impl FnOnce(*const ndx_import_options_t, *mut *mut ndx_tensor_t) -> *mut ndx_error_t,
) -> (*mut ndx_error_t, *mut ndx_tensor_t) {
    let mut t: *mut ndx_tensor_t = std::ptr::null_mut();
    let out = if h.null_out {
        std::ptr::null_mut()
    } else {
        &mut t as *mut _
    };
    let e = with_opts(&h.opts, |opts| import(opts, out));
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
// Bulk DLPack import (batches)
// ---------------------------------------------------------------------------------

/// A sample that agrees with `(dtype, ndim, device)`: small extents, compact or small
/// strides, mostly version 1.
fn agreeing_sample(
    dtype: DLDataType,
    ndim: usize,
    device: DLDevice,
) -> impl Strategy<Value = Hostile> {
    let major = prop_oneof![30 => Just(1u32), 1 => Just(0u32), 1 => any::<u32>()];
    (
        prop::collection::vec((0i64..4, -4i64..5), ndim),
        any::<bool>(),
        0u64..8,
        major,
    )
        .prop_map(move |(dims, with_strides, flags, major)| {
            let (shape, strides): (Vec<i64>, Vec<i64>) = dims.into_iter().unzip();
            Hostile {
                shape,
                strides: with_strides.then_some(strides),
                ndim: None,
                dtype,
                device,
                byte_offset: 0,
                null_data: false,
                null_shape: false,
                flags,
                major,
                opts: None,
                null_out: false,
            }
        })
}

/// A bulk import: samples (`None`: a NULL entry), maybe one pointer listed twice,
/// options and out-param as for single imports.
#[derive(Debug, Clone)]
struct Bulk {
    samples: Vec<Option<Hostile>>,
    /// Entry `.1` is replaced by entry `.0` (`.0 < .1`).
    dup: Option<(usize, usize)>,
    null_array: bool,
    opts: Option<Opts>,
    null_out: bool,
}

fn bulk() -> impl Strategy<Value = Bulk> {
    let count = prop_oneof![1 => Just(0usize), 4 => Just(1usize), 6 => 2usize..6, 1 => 6usize..40];
    let base = ((1i32..=13).prop_map(|d| dl_of(d).0), 0usize..4, dl_device());
    (count, base)
        .prop_flat_map(|(n, (dtype, ndim, device))| {
            let sample = prop_oneof![
                16 => agreeing_sample(dtype, ndim, device).prop_map(Some),
                2 => hostile().prop_map(Some),
                1 => Just(None),
            ];
            let dup = prop::option::weighted(0.05, (0..n.max(1), 0..n.max(1)));
            (
                prop::collection::vec(sample, n),
                dup,
                prop::bool::weighted(0.02),
                import_opts(),
                prop::bool::weighted(0.02),
            )
        })
        .prop_map(|(samples, dup, null_array, opts, null_out)| Bulk {
            dup: dup
                .filter(|(i, j)| i != j)
                .map(|(i, j)| (i.min(j), i.max(j))),
            samples,
            null_array,
            opts,
            null_out,
        })
}

/// What a sample is to ndx on its own (through a single import with the same
/// options): `None` when refused, else its dtype, ndim and device.
fn alone(h: &Hostile, opts: *const ndx_import_options_t) -> Option<(i32, i32, DLDevice)> {
    let mut one = h.clone();
    one.major = 1;
    let (m, count) = one.spec().versioned();
    let mut t = std::ptr::null_mut();
    let e = ndx_tensor_from_dlpack_versioned(m, opts, &mut t);
    if !e.is_null() {
        caller_error(e, "single import");
        drop_versioned(m);
        assert_eq!(calls(&count), 1);
        return None;
    }
    let (mut dtype, mut ndim) = (0, 0);
    let mut device = DLDevice {
        device_type: DLDeviceType(0),
        device_id: 0,
    };
    ok(ndx_tensor_dtype(t, &mut dtype));
    ok(ndx_tensor_ndim(t, &mut ndim));
    ok(ndx_tensor_device(t, &mut device));
    ndx_tensor_release(t);
    assert_eq!(calls(&count), 1);
    Some((dtype, ndim, device))
}

/// The index of the first sample a bulk import must refuse: a NULL entry or one
/// refused on its own, else the first that disagrees with sample 0 (every sample is
/// validated before they are compared).
fn first_bad_sample(b: &Bulk, opts: *const ndx_import_options_t) -> Option<usize> {
    let mut metas = Vec::new();
    for (i, s) in b.samples.iter().enumerate() {
        match s.as_ref().and_then(|h| alone(h, opts)) {
            Some(meta) => metas.push(meta),
            None => return Some(i),
        }
    }
    let (dtype, ndim, device) = *metas.first()?;
    metas.iter().position(|&(d, n, dev)| {
        d != dtype
            || n != ndim
            || dev.device_type != device.device_type
            || dev.device_id != device.device_id
    })
}

/// One bulk import of `b` (`legacy`: through `ndx_batch_from_dlpack`): either a
/// caller-facing error that leaves every tensor with the caller (but those of an
/// unknown major version, whose deleters ndx calls) and names the sample at fault, or
/// a batch of every sample whose release calls each deleter once.
fn bulk_once(b: &Bulk, legacy: bool) {
    let n = b.samples.len();
    let produced: Vec<Option<(*mut c_void, Count, u32)>> = b
        .samples
        .iter()
        .map(|s| {
            s.as_ref().map(|h| {
                if legacy {
                    let (m, c) = h.spec().legacy();
                    (m.cast::<c_void>(), c, 1)
                } else {
                    let (m, c) = h.spec().versioned();
                    (m.cast::<c_void>(), c, h.major)
                }
            })
        })
        .collect();
    let mut ptrs: Vec<*mut c_void> = produced
        .iter()
        .map(|p| p.as_ref().map_or(std::ptr::null_mut(), |p| p.0))
        .collect();
    if let Some((i, j)) = b.dup {
        ptrs[j] = ptrs[i];
    }
    let listed = |k: usize| b.dup.map_or(k, |(i, j)| if k == j { i } else { k });
    let array = if b.null_array {
        std::ptr::null()
    } else {
        ptrs.as_ptr()
    };
    let mut batch: *mut ndx_batch_t = std::ptr::null_mut();
    let out = if b.null_out {
        std::ptr::null_mut()
    } else {
        &mut batch as *mut _
    };
    let (e, bad) = with_opts(&b.opts, |opts| {
        let e = if legacy {
            ndx_batch_from_dlpack(array.cast(), n, opts, out)
        } else {
            ndx_batch_from_dlpack_versioned(array.cast(), n, opts, out)
        };
        // The samples as listed, judged one by one with the same options.
        let listed_bulk = Bulk {
            samples: (0..n).map(|k| b.samples[listed(k)].clone()).collect(),
            ..b.clone()
        };
        (e, first_bad_sample(&listed_bulk, opts))
    });
    // Options older than the oldest layout are refused before any sample is read.
    let short_opts = b
        .opts
        .as_ref()
        .is_some_and(|o| o.struct_size < std::mem::offset_of!(ndx_import_options_t, stream));
    let dup = b.dup.filter(|&(i, _)| !ptrs[i].is_null());
    let array_read = !b.null_array && n > 0;
    // Versioned: unknown majors are released (after the repeat check) whatever else.
    let unknown: Vec<usize> = if legacy || !array_read || dup.is_some() {
        Vec::new()
    } else {
        (0..n)
            .filter(|&k| !ptrs[k].is_null() && produced[k].as_ref().is_some_and(|p| p.2 != 1))
            .collect()
    };
    if e.is_null() {
        assert!(!b.null_out && array_read && !short_opts, "accepted: {b:?}");
        assert!(dup.is_none() && unknown.is_empty(), "accepted: {b:?}");
        assert_eq!(bad, None, "a bad sample was accepted");
        let mut size = 0usize;
        ok(ndx_batch_size(batch, &mut size));
        assert_eq!(size, n);
        for (k, s) in b.samples.iter().enumerate() {
            let h = s.as_ref().expect("a NULL sample was accepted");
            let mut t = std::ptr::null_mut();
            ok(ndx_batch_sample(batch, k, &mut t));
            check_imported(t, h);
            ndx_tensor_release(t);
        }
        for p in produced.iter().flatten() {
            assert_eq!(calls(&p.1), 0, "deleter called while the batch lives");
        }
        ndx_batch_release(batch);
        for (k, p) in produced.iter().enumerate() {
            let c = &p.as_ref().unwrap().1;
            assert_eq!(calls(c), 1, "sample {k}: deleter calls after the release");
        }
        return;
    }
    let (kind, msg) = caller_error(e, "bulk import");
    assert!(batch.is_null(), "out set on failure: {msg}");
    if let Some((i, j)) = dup.filter(|_| array_read && (!legacy || !b.null_out && !short_opts)) {
        assert!(
            msg.contains(&format!("tensors[{i}] and tensors[{j}]")),
            "{msg}"
        );
    } else if !unknown.is_empty() {
        assert_eq!(kind, ndx_error_kind_t::NDX_ERROR_VALUE as i32, "{msg}");
        for &k in &unknown {
            assert!(msg.contains(&format!("tensors[{k}] (major")), "{msg}");
        }
    } else if let Some(k) = bad.filter(|_| !b.null_out && array_read && !short_opts) {
        assert!(
            msg.contains(&format!("tensors[{k}]")),
            "expected sample {k}: {msg}"
        );
    } else {
        assert!(
            b.null_out || !array_read || short_opts,
            "refused without a reason the test knows: {msg}"
        );
    }
    for (k, p) in produced.iter().enumerate() {
        let Some((m, c, _)) = p else { continue };
        if unknown.contains(&k) {
            assert_eq!(calls(c), 1, "sample {k} of an unknown version: {msg}");
            continue;
        }
        assert_eq!(
            calls(c),
            0,
            "sample {k}: deleter called on a failed import: {msg}"
        );
        if legacy {
            drop_legacy(m.cast());
        } else {
            drop_versioned(m.cast());
        }
        assert_eq!(calls(c), 1);
    }
}

proptest! {
    #![proptest_config(config(300))]

    #[test]
    fn versioned_bulk_import_errs_cleanly_or_owns_every_sample(b in bulk()) {
        bulk_once(&b, false);
    }

    #[test]
    fn legacy_bulk_import_errs_cleanly_or_owns_every_sample(b in bulk()) {
        bulk_once(&b, true);
    }
}

// ---------------------------------------------------------------------------------
// Host memory: ndx_tensor_from_host and ndx_tensor_wrap_host
// ---------------------------------------------------------------------------------

/// Bytes of the caller's buffer the host constructors are given a pointer into.
const HOST_BACKING: usize = 512;

#[derive(Debug, Clone)]
struct HostCase {
    /// An `ndx_dtype_t`, or a value that is none.
    dtype: i32,
    shape: Vec<i64>,
    strides: Option<Vec<i64>>,
    /// As in [`Hostile`]: outside 0..=64, or at most the shape's length.
    ndim: Option<i32>,
    /// Byte offset of `data` into the buffer (mostly a multiple of 8).
    offset: usize,
    null_data: bool,
    null_shape: bool,
    opts: Option<Opts>,
    null_out: bool,
    /// `ndx_tensor_wrap_host` (with a counting deleter or none) instead of a copy.
    wrap: bool,
    deleter: bool,
}

fn host_case() -> impl Strategy<Value = HostCase> {
    let dtype = prop_oneof![
        12 => 1i32..=13,
        1 => prop::sample::select(vec![0i32, -1, 14, 100, i32::MIN, i32::MAX]),
    ];
    let dims = prop_oneof![
        3 => prop::collection::vec((0i64..5, -4i64..5), 0..5),
        1 => prop::collection::vec((extent(), stride()), 0..6),
    ];
    let ndim = prop_oneof![
        16 => Just(None),
        1 => prop::sample::select(vec![-1i32, i32::MIN, 65, 1000, i32::MAX]).prop_map(Some),
        1 => (0i32..6).prop_map(Some),
    ];
    let offset = prop_oneof![
        6 => (0usize..=HOST_BACKING / 8).prop_map(|e| e * 8),
        1 => 0usize..=HOST_BACKING,
    ];
    (
        (dtype, dims, any::<bool>(), ndim, offset),
        (
            prop::bool::weighted(0.05),
            prop::bool::weighted(0.05),
            import_opts(),
            prop::bool::weighted(0.03),
            any::<bool>(),
            any::<bool>(),
        ),
    )
        .prop_map(
            |(
                (dtype, dims, with_strides, ndim, offset),
                (null_data, null_shape, opts, null_out, wrap, deleter),
            )| {
                let (shape, strides): (Vec<i64>, Vec<i64>) = dims.into_iter().unzip();
                let ndim = fitted_ndim(ndim, shape.len());
                HostCase {
                    dtype,
                    shape,
                    strides: with_strides.then_some(strides),
                    ndim,
                    offset,
                    null_data,
                    null_shape,
                    opts,
                    null_out,
                    wrap,
                    deleter,
                }
            },
        )
}

/// The element strides of a compact tensor of `shape`, if they fit in i64.
fn compact(shape: &[i64]) -> Option<Vec<i64>> {
    let mut strides = vec![0i64; shape.len()];
    let mut acc = 1i64;
    for i in (0..shape.len()).rev() {
        strides[i] = acc;
        acc = acc.checked_mul(shape[i].max(1))?;
    }
    Some(strides)
}

/// The bytes at `shape`/`strides` (elements of `item` bytes) from byte `at` of
/// `bytes`, in row-major order.
fn gather(bytes: &[u8], at: usize, shape: &[i64], strides: &[i64], item: usize) -> Vec<u8> {
    let numel: i64 = shape.iter().product();
    let mut out = Vec::new();
    let mut index = vec![0i64; shape.len()];
    for _ in 0..numel {
        let el: i64 = index.iter().zip(strides).map(|(i, s)| i * s).sum();
        let b = (at as i64 + el * item as i64) as usize;
        out.extend_from_slice(&bytes[b..b + item]);
        for d in (0..shape.len()).rev() {
            index[d] += 1;
            if index[d] < shape[d] {
                break;
            }
            index[d] = 0;
        }
    }
    out
}

/// Counts the calls of a wrapped buffer's deleter and checks its `data` argument.
#[derive(Default)]
struct HostDeleter {
    calls: std::sync::atomic::AtomicUsize,
    wrong_data: std::sync::atomic::AtomicUsize,
    data: usize,
}

unsafe extern "C" fn count_host_delete(data: *mut c_void, user: *mut c_void) {
    // SAFETY: `user` is the test's live `HostDeleter`.
    let d = unsafe { &*user.cast::<HostDeleter>() };
    if data as usize != d.data {
        d.wrong_data
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    d.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
}

/// One host construction: a caller-facing error (no deleter call), or a tensor with
/// the given geometry whose values are the buffer's (and, wrapped, whose deleter runs
/// once at release). Calls only what stays inside the buffer's promise: a copy whose
/// elements are in the buffer, or a wrap (which reads nothing).
fn host_once(c: &HostCase) {
    use std::sync::atomic::Ordering::SeqCst;
    let buffer: Vec<u64> = (0..HOST_BACKING as u64 / 8)
        .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (i << 3))
        .collect();
    let bytes: Vec<u8> = buffer.iter().flat_map(|v| v.to_ne_bytes()).collect();
    let mut mem = bytes.clone();
    let data = if c.null_data {
        std::ptr::null_mut()
    } else {
        // SAFETY: `offset` is at most the buffer's length.
        unsafe { mem.as_mut_ptr().add(c.offset) }.cast::<c_void>()
    };
    let ndim = c.ndim.unwrap_or(c.shape.len() as i32);
    let valid_ndim = (0..=64).contains(&ndim);
    let n = if valid_ndim { ndim as usize } else { 0 };
    let shape = &c.shape[..n.min(c.shape.len())];
    let strides = c.strides.as_ref().map(|s| &s[..shape.len()]);
    let item = (1..=13).contains(&c.dtype).then(|| dl_of(c.dtype).1);
    // The geometry as ndx should judge it: refused (negative extents, sizes that do
    // not fit), or its element count and the bytes it reaches from `data`.
    let numel = shape.iter().try_fold(1i128, |acc, &d| {
        (d >= 0).then(|| acc * d as i128).filter(|&n| n < 1 << 64)
    });
    let addressable = item.is_some_and(|item| {
        numel.is_some_and(|n| n * (item as i128) <= isize::MAX as i128) && compact(shape).is_some()
    });
    let layout_ok = c.opts.as_ref().is_none_or(|o| {
        let l = o.layout.as_deref().unwrap_or("");
        o.struct_size < std::mem::offset_of!(ndx_import_options_t, stream)
            || l.is_empty()
            || l.len() == shape.len()
                && l.bytes().all(|b| b.is_ascii_alphabetic())
                && l.bytes().collect::<std::collections::HashSet<_>>().len() == l.len()
    });
    let opts_ok = c
        .opts
        .as_ref()
        .is_none_or(|o| o.struct_size >= std::mem::offset_of!(ndx_import_options_t, stream));
    let well_formed = valid_ndim
        && !(c.null_shape && ndim > 0)
        && addressable
        && opts_ok
        && layout_ok
        && !c.null_out;
    let numel = numel.unwrap_or(0);
    // The bytes the elements reach, relative to `data`.
    let used_strides = strides.map(<[i64]>::to_vec).or_else(|| compact(shape));
    let in_bounds = numel == 0
        || !c.null_data
            && used_strides.as_ref().is_some_and(|s| {
                let item = item.unwrap_or(1) as i128;
                let (mut lo, mut hi) = (0i128, 0i128);
                for (&d, &st) in shape.iter().zip(s) {
                    // (Far beyond the buffer is far enough: no i128 overflow.)
                    let reach = ((d as i128 - 1) * st as i128).clamp(-1 << 80, 1 << 80);
                    if reach < 0 { lo += reach } else { hi += reach }
                }
                c.offset as i128 + lo * item >= 0
                    && c.offset as i128 + (hi + 1) * item <= HOST_BACKING as i128
            });
    let nbytes = numel * item.unwrap_or(1) as i128;
    if !c.wrap && well_formed && !c.null_data && (!in_bounds || nbytes > 1 << 16) {
        // A copy would read outside the buffer (the caller's promise broken) or make
        // a huge tensor (ndx allocates what it is asked for): not called. (NULL data
        // with elements is refused before anything is read.)
        return;
    }
    let user = HostDeleter {
        data: data as usize,
        ..HostDeleter::default()
    };
    let shape_ptr = if c.null_shape {
        std::ptr::null()
    } else {
        c.shape.as_ptr()
    };
    let strides_ptr = c.strides.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
    let mut t: *mut ndx_tensor_t = std::ptr::null_mut();
    let out = if c.null_out {
        std::ptr::null_mut()
    } else {
        &mut t as *mut _
    };
    let e = with_opts(&c.opts, |opts| {
        if c.wrap {
            ndx_tensor_wrap_host(
                data,
                c.dtype,
                ndim,
                shape_ptr,
                strides_ptr,
                c.deleter.then_some(count_host_delete as _),
                (&raw const user).cast_mut().cast(),
                opts,
                out,
            )
        } else {
            ndx_tensor_from_host(data, c.dtype, ndim, shape_ptr, strides_ptr, opts, out)
        }
    });
    // ndx refuses some empty tensors whose extents other than the zero ones multiply
    // past the address space (int32 [2^62, 0]: "too large to address"); whether it
    // should is a design question, so either outcome passes here.
    let huge_empty = numel == 0
        && shape
            .iter()
            .try_fold(item.unwrap_or(1) as i128, |acc, &d| {
                (acc * d.max(1) as i128 <= isize::MAX as i128).then(|| acc * d.max(1) as i128)
            })
            .is_none();
    let must_accept = well_formed && in_bounds && item.is_some() && !huge_empty;
    if !e.is_null() {
        let (_, msg) = caller_error(e, "host constructor");
        assert!(t.is_null(), "out set on failure: {msg}");
        assert!(!must_accept, "a valid host tensor was refused: {msg}");
        assert_eq!(
            user.calls.load(SeqCst),
            0,
            "deleter called on failure: {msg}"
        );
        return;
    }
    assert!(well_formed && item.is_some(), "accepted: {c:?}");
    let item = item.unwrap();
    assert_eq!(shape_of(t), shape, "the shape");
    let (mut dtype, mut size) = (0, 0usize);
    ok(ndx_tensor_dtype(t, &mut dtype));
    assert_eq!(dtype, c.dtype);
    ok(ndx_tensor_numel(t, &mut size));
    assert_eq!(size as i128, numel);
    let expect_strides = if c.wrap && !shape.is_empty() {
        used_strides.clone().unwrap()
    } else {
        compact(shape).unwrap()
    };
    assert_eq!(strides_of(t), expect_strides, "the strides");
    // The tensor's bytes against the ones the caller's buffer held at the call.
    let read_back = |what: &str| {
        let mut got = vec![0u8; nbytes as usize];
        ok(ndx_tensor_copy_to(t, got.as_mut_ptr().cast(), got.len()));
        let want = gather(
            &bytes,
            c.offset,
            shape,
            used_strides.as_ref().unwrap(),
            item,
        );
        assert_eq!(got, want, "{what}");
    };
    if in_bounds && numel > 0 && nbytes <= 1 << 16 {
        read_back("the values");
    }
    if !c.wrap {
        // A copy: the caller's buffer may change at once.
        mem.iter_mut().for_each(|b| *b = !*b);
        if numel > 0 && nbytes <= 1 << 16 {
            read_back("the copied values after the buffer changed");
        }
    }
    assert_eq!(
        user.calls.load(SeqCst),
        0,
        "deleter called while the tensor lives"
    );
    ndx_tensor_release(t);
    let expect = usize::from(c.wrap && c.deleter);
    assert_eq!(
        user.calls.load(SeqCst),
        expect,
        "deleter calls after the release"
    );
    assert_eq!(
        user.wrong_data.load(SeqCst),
        0,
        "the deleter's data pointer"
    );
    drop(mem);
}

proptest! {
    #![proptest_config(config(400))]

    #[test]
    fn host_constructors_err_cleanly_or_describe_the_memory(c in host_case()) {
        host_once(&c);
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
    /// The samples of each such batch: copies of the input with other values.
    samples: usize,
    /// Every other input batch has one sample more (refused).
    ragged: bool,
    /// Tensor inputs are imported through DLPack (0), or wrapped host memory with
    /// room around it (1), at an odd address (2).
    memory: u8,
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
            let batch = (
                prop::bool::weighted(0.1),
                1usize..4,
                prop::bool::weighted(0.1),
                prop_oneof![8 => Just(0u8), 1 => Just(1u8), 1 => Just(2u8)],
            );
            (Just(op), inputs, batch, args_for(names))
        })
        .prop_map(
            |(op, inputs, (as_batch, samples, ragged, memory), args)| Invocation {
                op,
                inputs,
                as_batch,
                samples,
                ragged,
                memory,
                args,
            },
        )
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

/// Host memory the test lends to `ndx_tensor_wrap_host`, freed by the deleter.
struct Wrapped {
    bytes: Vec<u8>,
    count: Count,
}

unsafe extern "C" fn delete_wrapped(_data: *mut c_void, user: *mut c_void) {
    // SAFETY: the `Wrapped` that `wrap_misaligned` gave away; called once.
    let w = unsafe { Box::from_raw(user.cast::<Wrapped>()) };
    w.count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
}

/// Bytes around wrapped inputs, where out tensors that overlap them may lie.
const ROOM: usize = 4096;

/// The bytes of a wrapped input's buffer, `[start, end)`, and of its element 0.
#[derive(Debug, Clone, Copy)]
struct Region {
    start: usize,
    end: usize,
    origin: usize,
}

/// `spec`'s elements copied into a buffer with [`ROOM`] bytes around them (one more
/// before when `misaligned`) and wrapped there.
fn wrap_copy(
    spec: &Spec,
    opts: &ndx_import_options_t,
    misaligned: bool,
) -> (*mut ndx_tensor_t, Count, Region) {
    let count = Count::default();
    let skip = ROOM + usize::from(misaligned);
    let mut w = Box::new(Wrapped {
        bytes: vec![0u8; skip + spec.data.len() + ROOM],
        count: count.clone(),
    });
    w.bytes[skip..skip + spec.data.len()].copy_from_slice(&spec.data);
    let dtype = (1..=13).find(|&d| dl_of(d).0 == spec.dtype).unwrap();
    let start = w.bytes.as_ptr() as usize;
    let region = Region {
        start,
        end: start + w.bytes.len(),
        origin: start + skip + spec.byte_offset as usize,
    };
    // SAFETY: the element-0 offset lies inside the copied data.
    let data = unsafe { w.bytes.as_mut_ptr().add(skip + spec.byte_offset as usize) };
    let strides = spec.strides.as_ref().unwrap();
    let mut t = std::ptr::null_mut();
    ok(ndx_tensor_wrap_host(
        data.cast(),
        dtype,
        spec.shape.len() as i32,
        spec.shape.as_ptr(),
        strides.as_ptr(),
        Some(delete_wrapped),
        Box::into_raw(w).cast(),
        opts,
        &mut t,
    ));
    (t, count, region)
}

/// `spec`'s elements copied into a new buffer in `buffers` with [`ROOM`] bytes around
/// them (one more before when `misaligned`), and a DLPack view of them there.
fn view_copy(
    spec: &Spec,
    misaligned: bool,
    buffers: &mut Vec<Vec<u8>>,
) -> (*mut DLManagedTensorVersioned, Count, Region) {
    let skip = ROOM + usize::from(misaligned);
    let mut bytes = vec![0u8; skip + spec.data.len() + ROOM];
    bytes[skip..skip + spec.data.len()].copy_from_slice(&spec.data);
    let dtype = (1..=13).find(|&d| dl_of(d).0 == spec.dtype).unwrap();
    let start = bytes.as_ptr() as usize;
    let at = skip + spec.byte_offset as usize;
    let region = Region {
        start,
        end: start + bytes.len(),
        origin: start + at,
    };
    // SAFETY: the element-0 offset lies inside the copied data.
    let data = unsafe { bytes.as_mut_ptr().add(at) };
    let strides = spec.strides.as_ref().unwrap();
    let (m, count) = view(data, dtype, &spec.shape, strides, false);
    buffers.push(bytes);
    (m, count, region)
}

/// The imported inputs of an invocation (tensors, or batches of copies), with
/// their producers' deleter counts.
struct Inputs {
    counts: Vec<Count>,
    tensors: Vec<*mut ndx_tensor_t>,
    batches: Vec<*mut ndx_batch_t>,
    /// The memory of each wrapped tensor input.
    regions: Vec<Region>,
    /// The memory of each sample of each batch input made of views (DLPack views of
    /// `buffers`).
    batch_regions: Vec<Vec<Region>>,
    buffers: Vec<Vec<u8>>,
}

impl Inputs {
    fn import(inv: &Invocation) -> Inputs {
        let mut inputs = Inputs {
            counts: Vec::new(),
            tensors: Vec::new(),
            batches: Vec::new(),
            regions: Vec::new(),
            batch_regions: Vec::new(),
            buffers: Vec::new(),
        };
        for (i, s) in inv.inputs.iter().enumerate() {
            let layout = s.layout.map(|l| CString::new(l).unwrap());
            let opts = ndx_import_options_t {
                struct_size: std::mem::size_of::<ndx_import_options_t>(),
                layout: layout.as_ref().map_or(std::ptr::null(), |l| l.as_ptr()),
                read_only: false,
                stream: std::ptr::null_mut(),
            };
            if inv.as_batch {
                let n = inv.samples + usize::from(inv.ragged && i % 2 == 1);
                let mut regions = Vec::new();
                let (ms, counts): (Vec<_>, Vec<_>) = (0..n as u64)
                    .map(|j| {
                        let mut sample = s.clone();
                        sample.seed = s.seed.wrapping_add(j);
                        if inv.memory == 0 {
                            return sample.spec().versioned();
                        }
                        let (m, count, region) =
                            view_copy(&sample.spec(), inv.memory == 2, &mut inputs.buffers);
                        regions.push(region);
                        (m, count)
                    })
                    .unzip();
                if inv.memory > 0 {
                    inputs.batch_regions.push(regions);
                }
                inputs.counts.extend(counts);
                inputs.batches.push(import_batch(&ms, &opts));
            } else if inv.memory > 0 {
                let (t, count, region) = wrap_copy(&s.spec(), &opts, inv.memory == 2);
                inputs.counts.push(count);
                inputs.tensors.push(t);
                inputs.regions.push(region);
            } else {
                let (m, count) = s.spec().versioned();
                inputs.counts.push(count);
                let mut t = std::ptr::null_mut();
                ok(ndx_tensor_from_dlpack_versioned(m, &opts, &mut t));
                inputs.tensors.push(t);
            }
        }
        inputs
    }

    fn list(&self) -> Vec<ndx_input_t> {
        self.tensors
            .iter()
            .map(|&t| ndx_input_t {
                tensor: t,
                batch: std::ptr::null(),
            })
            .chain(self.batches.iter().map(|&b| ndx_input_t {
                tensor: std::ptr::null(),
                batch: b,
            }))
            .collect()
    }

    /// Releases the handles and returns the deleter counts, to check once the context
    /// (whose workers may still hold references) is gone.
    fn release(self) -> (Vec<Count>, Vec<Vec<u8>>) {
        for t in self.tensors {
            ndx_tensor_release(t);
        }
        for b in self.batches {
            ndx_batch_release(b);
        }
        (self.counts, self.buffers)
    }
}

fn every_deleter_once(counts: &[Count]) {
    for (i, c) in counts.iter().enumerate() {
        assert_eq!(
            calls(c),
            1,
            "input {i}: deleter calls after everything was released"
        );
    }
}

fn args_of(inv: &Invocation) -> *mut ndx_args_t {
    let mut args = std::ptr::null_mut();
    ok(ndx_args_new(&mut args));
    for (name, v) in &inv.args {
        set_arg(args, name, v);
    }
    args
}

/// A context in `mode` that captures no frames (faster).
fn quiet_ctx(mode: i32) -> Ctx {
    let ctx = Ctx::new(mode);
    ok(ndx_context_set_capture_policy(
        ctx.0,
        ndx_capture_policy_t::NDX_CAPTURE_OFF as i32,
        0,
    ));
    ctx
}

/// Output `i` of a completed future: the tensor, or the batch.
fn future_output(f: *mut ndx_future_t, i: usize) -> Result<*mut ndx_tensor_t, *mut ndx_batch_t> {
    let mut t = std::ptr::null_mut();
    let e = ndx_future_tensor(f, i, &mut t);
    if e.is_null() {
        return Ok(t);
    }
    caller_error(e, "ndx_future_tensor");
    let mut b = std::ptr::null_mut();
    ok(ndx_future_batch(f, i, &mut b));
    Err(b)
}

/// Waits for `f` and reads every output when it succeeded; checks the error when it
/// failed. Whether it succeeded.
fn settle(f: *mut ndx_future_t, mode: i32) -> bool {
    assert!(!f.is_null());
    let status = ndx_future_poll(f);
    if mode == ndx_eval_mode_t::NDX_EVAL_SYNC_CPU as i32 {
        assert_ne!(
            status,
            ndx_future_status_t::NDX_FUTURE_PENDING as i32,
            "a SYNC_CPU future is complete on return"
        );
    }
    let e = ndx_future_wait(f, -1);
    if !e.is_null() {
        caller_error(e, "the wait's error");
        assert_eq!(
            ndx_future_poll(f),
            ndx_future_status_t::NDX_FUTURE_FAILED as i32
        );
        caller_error(ndx_future_error(f), "the future's error");
        return false;
    }
    assert_eq!(
        ndx_future_poll(f),
        ndx_future_status_t::NDX_FUTURE_READY as i32
    );
    let mut n = 0usize;
    ok(ndx_future_output_count(f, &mut n));
    for i in 0..n {
        match future_output(f, i) {
            Ok(t) => {
                read_output_tensor(t);
                ndx_tensor_release(t);
            }
            Err(b) => {
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
    }
    true
}

/// Runs one invocation in SYNC_CPU on a fresh context; checks the outcome and that
/// every producer deleter ran exactly once once everything is released.
fn invoke_once(inv: &Invocation) {
    const SYNC: i32 = ndx_eval_mode_t::NDX_EVAL_SYNC_CPU as i32;
    let inputs = Inputs::import(inv);
    let args = args_of(inv);
    let ctx = quiet_ctx(SYNC);
    let op = CString::new(inv.op).unwrap();
    match invoke_with(&ctx, &op, &inputs.list(), args, &invoke_options(SYNC, &[])) {
        Err(e) => {
            caller_error(e, "ndx_invoke");
        }
        Ok(f) => {
            settle(f, SYNC);
            ndx_future_release(f);
        }
    }
    ndx_args_free(args);
    let (counts, _buffers) = inputs.release();
    drop(ctx); // waits for workers that might still hold references
    every_deleter_once(&counts);
}

proptest! {
    #![proptest_config(config(500))]

    #[test]
    fn sync_invocations_succeed_or_fail_cleanly(inv in invocation()) {
        invoke_once(&inv);
    }
}

/// How a test lets go of an EAGER or DEFERRED invocation.
#[derive(Debug, Clone, Copy)]
enum Finish {
    /// Waits for the future and reads its outputs.
    Wait,
    /// Releases the future unobserved and evaluates the context.
    Evaluate,
    /// Releases the future unobserved, then the context (DEFERRED work is cancelled).
    Drop,
}

#[derive(Debug, Clone)]
struct Staged {
    inv: Invocation,
    mode: i32,
    /// Whether the mode comes from the invoke options (else from the context).
    in_opts: bool,
    /// Each tensor input goes through a pending `to_host` first.
    chain: bool,
    finish: Finish,
}

fn staged() -> impl Strategy<Value = Staged> {
    let mode = prop::sample::select(vec![
        ndx_eval_mode_t::NDX_EVAL_EAGER as i32,
        ndx_eval_mode_t::NDX_EVAL_DEFERRED as i32,
    ]);
    let finish = prop_oneof![
        6 => Just(Finish::Wait),
        1 => Just(Finish::Evaluate),
        1 => Just(Finish::Drop),
    ];
    (
        invocation(),
        mode,
        any::<bool>(),
        prop::bool::weighted(0.3),
        finish,
    )
        .prop_map(|(inv, mode, in_opts, chain, finish)| Staged {
            inv,
            mode,
            in_opts,
            chain,
            finish,
        })
}

/// Runs one invocation in EAGER or DEFERRED mode (maybe on pending inputs): no
/// INTERNAL error anywhere, and every producer deleter runs once when all is released.
fn staged_once(s: &Staged) {
    let inputs = Inputs::import(&s.inv);
    let args = args_of(&s.inv);
    let ctx = quiet_ctx(if s.in_opts {
        ndx_eval_mode_t::NDX_EVAL_SYNC_CPU as i32
    } else {
        s.mode
    });
    let mode = if s.in_opts { s.mode } else { 0 };
    let mut list = inputs.list();
    let mut pending = Vec::new();
    if s.chain {
        for input in list.iter_mut().filter(|i| !i.tensor.is_null()) {
            let one = [ndx_input_t {
                tensor: input.tensor,
                batch: std::ptr::null(),
            }];
            match invoke_with(
                &ctx,
                c"to_host",
                &one,
                std::ptr::null(),
                &invoke_options(mode, &[]),
            ) {
                Err(e) => {
                    caller_error(e, "to_host");
                }
                Ok(f) => {
                    let mut t = std::ptr::null_mut();
                    ok(ndx_future_tensor(f, 0, &mut t));
                    ndx_future_release(f);
                    input.tensor = t;
                    pending.push(t);
                }
            }
        }
    }
    let op = CString::new(s.inv.op).unwrap();
    match invoke_with(&ctx, &op, &list, args, &invoke_options(mode, &[])) {
        Err(e) => {
            caller_error(e, "ndx_invoke");
        }
        Ok(f) => {
            if let Finish::Wait = s.finish {
                settle(f, s.mode);
            }
            ndx_future_release(f);
        }
    }
    ndx_args_free(args);
    for t in pending {
        ndx_tensor_release(t);
    }
    let (counts, _buffers) = inputs.release();
    if !matches!(s.finish, Finish::Drop) {
        no_internal(ndx_context_evaluate(ctx.0), "ndx_context_evaluate");
    }
    drop(ctx);
    every_deleter_once(&counts);
}

proptest! {
    #![proptest_config(config(300))]

    #[test]
    fn eager_and_deferred_invocations_succeed_or_fail_cleanly(s in staged()) {
        staged_once(&s);
    }
}

// ---------------------------------------------------------------------------------
// Out tensors
// ---------------------------------------------------------------------------------

/// A DLPack tensor over memory the test owns (and keeps alive), counting its deleter:
/// the samples of out batches, which may share one buffer.
#[repr(C)]
struct View {
    managed: DLManagedTensorVersioned,
    shape: Vec<i64>,
    strides: Vec<i64>,
    count: Count,
}

unsafe extern "C" fn delete_view(m: *mut DLManagedTensorVersioned) {
    // SAFETY: made by `view`; called once.
    let v = unsafe { Box::from_raw(m.cast::<View>()) };
    v.count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
}

fn view(
    data: *mut u8,
    dtype: i32,
    shape: &[i64],
    strides: &[i64],
    read_only: bool,
) -> (*mut DLManagedTensorVersioned, Count) {
    let count = Count::default();
    let mut v = Box::new(View {
        managed: DLManagedTensorVersioned {
            version: DLPackVersion { major: 1, minor: 0 },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_view),
            flags: if read_only {
                DlpackFlags::READ_ONLY
            } else {
                DlpackFlags::empty()
            },
            dl_tensor: DLTensor {
                data: data.cast(),
                device: cpu(),
                ndim: shape.len() as i32,
                dtype: dl_of(dtype).0,
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
        },
        shape: shape.to_vec(),
        strides: strides.to_vec(),
        count: count.clone(),
    });
    v.managed.dl_tensor.shape = v.shape.as_mut_ptr();
    v.managed.dl_tensor.strides = v.strides.as_mut_ptr();
    (Box::into_raw(v).cast(), count)
}

/// How an out entry is made from its output's dtype and shape.
#[derive(Debug, Clone)]
enum OutKind {
    /// Neither tensor nor batch: ndx allocates.
    Null,
    /// Compact memory of the output's dtype and shape.
    Exact,
    /// Every other element, axis 0 reversed.
    Strided,
    ReadOnly,
    /// Another dtype.
    WrongDtype,
    /// Another shape: a trailing 1 added, axis 0 one longer, or the last axis dropped.
    WrongShape(u8),
    /// Stride 0 on the first axis longer than 1.
    Broadcast,
    /// Input `k` (an input of the same invocation) as the out tensor or batch.
    Input(usize),
    /// Both a tensor and a batch.
    Both,
    /// A batch's samples in one buffer, each `step / 4` of the largest sample's size
    /// after the previous one (so from all in one place to gaps between them); for a
    /// tensor, like `Exact`.
    Packed(u8),
    /// A batch of one sample more (for a tensor, like `WrongShape(0)`).
    WrongCount,
    /// The output of a `to_host` of `Exact` memory, pending when `.0` (DEFERRED).
    Chained(bool),
    /// Like `Exact`, at an odd address.
    Misaligned,
    /// Compact memory `.1` elements from element 0 of wrapped input `.0` (so it
    /// overlaps the input, or lies next to it; for a batch, each sample over the next
    /// sample's input); otherwise like `Exact`.
    Shifted(usize, i8),
}

fn out_kind() -> impl Strategy<Value = OutKind> {
    prop_oneof![
        1 => Just(OutKind::Null),
        4 => Just(OutKind::Exact),
        3 => Just(OutKind::Strided),
        1 => Just(OutKind::ReadOnly),
        1 => Just(OutKind::WrongDtype),
        1 => (0u8..3).prop_map(OutKind::WrongShape),
        1 => Just(OutKind::Broadcast),
        2 => (0usize..3).prop_map(OutKind::Input),
        1 => Just(OutKind::Both),
        3 => (0u8..6).prop_map(OutKind::Packed),
        1 => Just(OutKind::WrongCount),
        1 => any::<bool>().prop_map(OutKind::Chained),
        1 => Just(OutKind::Misaligned),
        2 => (0usize..3, -6i8..7).prop_map(|(k, shift)| OutKind::Shifted(k, shift)),
    ]
}

#[derive(Debug, Clone)]
struct OutCase {
    inv: Invocation,
    outs: Vec<OutKind>,
    mode: i32,
}

fn out_case() -> impl Strategy<Value = OutCase> {
    let outs = prop_oneof![
        1 => Just(Vec::new()),
        12 => prop::collection::vec(out_kind(), 1),
        1 => prop::collection::vec(out_kind(), 2),
    ];
    let mode = prop::sample::select(vec![
        ndx_eval_mode_t::NDX_EVAL_SYNC_CPU as i32,
        ndx_eval_mode_t::NDX_EVAL_EAGER as i32,
        ndx_eval_mode_t::NDX_EVAL_DEFERRED as i32,
    ]);
    // More per-sample invocations and wrapped inputs than elsewhere: out batches, and
    // out tensors over inputs, have more to check.
    let batch = prop::bool::weighted(0.3);
    let memory = prop_oneof![2 => Just(0u8), 1 => Just(1u8), 1 => Just(2u8)];
    (invocation(), outs, mode, batch, memory).prop_map(|(mut inv, outs, mode, batch, memory)| {
        inv.as_batch |= batch;
        inv.memory = inv.memory.max(memory);
        OutCase { inv, outs, mode }
    })
}

/// A tensor's dtype, shape and compact bytes.
#[derive(Debug, Clone, PartialEq)]
struct Sample {
    dtype: i32,
    shape: Vec<i64>,
    bytes: Vec<u8>,
}

fn sample_of(t: *const ndx_tensor_t) -> Sample {
    let mut dtype = 0;
    ok(ndx_tensor_dtype(t, &mut dtype));
    let mut nbytes = 0usize;
    ok(ndx_tensor_nbytes(t, &mut nbytes));
    assert!(nbytes <= 1 << 20, "an output of {nbytes} bytes");
    let mut bytes = vec![0u8; nbytes];
    ok(ndx_tensor_copy_to(t, bytes.as_mut_ptr().cast(), nbytes));
    Sample {
        dtype,
        shape: shape_of(t),
        bytes,
    }
}

fn samples_of(b: *const ndx_batch_t) -> Vec<Sample> {
    let mut size = 0usize;
    ok(ndx_batch_size(b, &mut size));
    (0..size)
        .map(|j| {
            let mut t = std::ptr::null_mut();
            ok(ndx_batch_sample(b, j, &mut t));
            let s = sample_of(t);
            ndx_tensor_release(t);
            s
        })
        .collect()
}

/// An output of the reference run: a tensor or a batch's samples.
#[derive(Debug, Clone, PartialEq)]
enum Produced {
    Tensor(Sample),
    Batch(Vec<Sample>),
}

fn outputs_of(f: *mut ndx_future_t) -> Vec<Produced> {
    let mut n = 0usize;
    ok(ndx_future_output_count(f, &mut n));
    (0..n)
        .map(|i| match future_output(f, i) {
            Ok(t) => {
                let s = sample_of(t);
                ndx_tensor_release(t);
                Produced::Tensor(s)
            }
            Err(b) => {
                let s = samples_of(b);
                ndx_batch_release(b);
                Produced::Batch(s)
            }
        })
        .collect()
}

/// Memory the test lends as out tensors, alive and in place until the end.
#[derive(Default)]
struct Lent {
    buffers: Vec<Vec<u64>>,
    tensors: Vec<*mut ndx_tensor_t>,
    batches: Vec<*mut ndx_batch_t>,
    counts: Vec<Count>,
    /// The context of `Chained` out tensors.
    ctx: Option<Ctx>,
}

/// An out entry's fitness as the test knows it: `Some(true)` when it fits its output
/// (ndx must accept it), `Some(false)` when it does not (ndx must refuse it).
type Fit = Option<bool>;

impl Lent {
    /// A zeroed buffer of at least `bytes` bytes: its address.
    fn buffer(&mut self, bytes: usize) -> *mut u8 {
        self.buffers.push(vec![0u64; bytes.div_ceil(8).max(1)]);
        self.buffers.last_mut().unwrap().as_mut_ptr().cast()
    }

    /// The geometry `kind` gives an output of `(dtype, shape)`: dtype, shape, strides,
    /// read-only, and whether it fits.
    fn geometry(dtype: i32, shape: &[i64], kind: &OutKind) -> (i32, Vec<i64>, Vec<i64>, bool, Fit) {
        let mut shape = shape.to_vec();
        let mut dtype = dtype;
        let mut read_only = false;
        let mut fit = Some(true);
        let mut strides = compact(&shape).unwrap();
        let numel: i64 = shape.iter().product();
        match kind {
            OutKind::Strided if numel > 0 && !shape.is_empty() => {
                strides.iter_mut().for_each(|s| *s *= 2);
                strides[0] = -strides[0];
            }
            OutKind::ReadOnly => {
                read_only = true;
                fit = Some(false);
            }
            OutKind::WrongDtype => {
                dtype = dtype % 13 + 1;
                fit = Some(false);
            }
            OutKind::WrongShape(_) | OutKind::WrongCount => {
                let k = match kind {
                    OutKind::WrongShape(k) => *k,
                    _ => 0,
                };
                match (k, shape.len()) {
                    (0, _) => shape.push(1),
                    (1, 0) => shape.push(2),
                    (1, _) => shape[0] += 1,
                    (_, 0) => shape.push(0),
                    _ => {
                        shape.pop();
                    }
                }
                strides = compact(&shape).unwrap();
                fit = Some(false);
            }
            OutKind::Broadcast => {
                if let Some(i) = shape.iter().position(|&d| d > 1) {
                    strides[i] = 0;
                    // (Without elements, nothing overlaps.)
                    fit = Some(numel == 0);
                }
            }
            _ => {}
        }
        (dtype, shape, strides, read_only, fit)
    }

    /// Bytes a view of `shape`/`strides` spans, and the offset of its element 0.
    fn span(shape: &[i64], strides: &[i64], item: usize) -> (usize, usize) {
        if shape.contains(&0) {
            return (0, 0);
        }
        let (mut lo, mut hi) = (0i64, 0i64);
        for (&d, &s) in shape.iter().zip(strides) {
            let reach = (d - 1) * s;
            if reach < 0 { lo += reach } else { hi += reach }
        }
        (((hi - lo + 1) as usize) * item, (-lo) as usize * item)
    }

    /// An out tensor for an output of `(dtype, shape)`.
    fn tensor(&mut self, dtype: i32, shape: &[i64], kind: &OutKind) -> (*mut ndx_tensor_t, Fit) {
        if let &OutKind::Chained(pending) = kind {
            let (t, _) = self.tensor(dtype, shape, &OutKind::Exact);
            let ctx = self
                .ctx
                .get_or_insert_with(|| quiet_ctx(ndx_eval_mode_t::NDX_EVAL_SYNC_CPU as i32));
            let mode = if pending {
                ndx_eval_mode_t::NDX_EVAL_DEFERRED
            } else {
                ndx_eval_mode_t::NDX_EVAL_SYNC_CPU
            };
            let input = [ndx_input_t {
                tensor: t,
                batch: std::ptr::null(),
            }];
            let opts = invoke_options(mode as i32, &[]);
            let f = invoke_with(ctx, c"to_host", &input, std::ptr::null(), &opts)
                .unwrap_or_else(|e| panic!("to_host: {:?}", take_error(e)));
            let mut out = std::ptr::null_mut();
            ok(ndx_future_tensor(f, 0, &mut out));
            ndx_future_release(f);
            self.tensors.push(out);
            // A pending output holds no data yet: refused.
            return (out, pending.then_some(false));
        }
        let (dtype, shape, strides, read_only, fit) = Lent::geometry(dtype, shape, kind);
        let item = dl_of(dtype).1;
        let (span, origin) = Lent::span(&shape, &strides, item);
        let misaligned = usize::from(matches!(kind, OutKind::Misaligned));
        // SAFETY: `origin` lies inside the buffer of `span` bytes (or both are 0).
        let data = unsafe { self.buffer(span + misaligned).add(origin + misaligned) };
        (self.wrap(data, dtype, &shape, &strides, read_only), fit)
    }

    /// A compact out tensor for an output of `(dtype, shape)` at `at` bytes from
    /// element 0 of the input in `region`, when it fits in the region's buffer.
    fn shifted(
        &mut self,
        dtype: i32,
        shape: &[i64],
        region: Region,
        at: isize,
    ) -> Option<*mut ndx_tensor_t> {
        let strides = compact(shape).unwrap();
        let (span, _) = Lent::span(shape, &strides, dl_of(dtype).1);
        let start = region.origin.checked_add_signed(at)?;
        (start >= region.start && start + span <= region.end)
            .then(|| self.wrap(start as *mut u8, dtype, shape, &strides, false))
    }

    fn wrap(
        &mut self,
        data: *mut u8,
        dtype: i32,
        shape: &[i64],
        strides: &[i64],
        read_only: bool,
    ) -> *mut ndx_tensor_t {
        let t = wrap_host(data.cast(), dtype, shape, Some(strides), read_only);
        self.tensors.push(t);
        t
    }

    /// A compact out batch for a batch output of `samples` (dtype, shape), sample `j`
    /// at `shift` elements from element 0 of the input sample in `regions[j + 1]`
    /// (cyclically: over another sample's input), when it fits in that buffer.
    fn batch_over(
        &mut self,
        samples: &[(i32, Vec<i64>)],
        regions: &[Region],
        shift: i8,
    ) -> *mut ndx_batch_t {
        let (ms, counts): (Vec<_>, Vec<_>) = samples
            .iter()
            .enumerate()
            .map(|(j, (dtype, shape))| {
                let r = regions[(j + 1) % regions.len()];
                let strides = compact(shape).unwrap();
                let item = dl_of(*dtype).1;
                let (span, _) = Lent::span(shape, &strides, item);
                let data = r
                    .origin
                    .checked_add_signed(shift as isize * item as isize)
                    .filter(|&at| at >= r.start && at + span <= r.end)
                    .map_or_else(|| self.buffer(span), |at| at as *mut u8);
                view(data, *dtype, shape, &strides, false)
            })
            .unzip();
        self.counts.extend(counts);
        let b = import_batch(&ms, std::ptr::null());
        self.batches.push(b);
        b
    }

    /// An out batch for a batch output of `samples` (dtype, shape).
    fn batch(&mut self, samples: &[(i32, Vec<i64>)], kind: &OutKind) -> (*mut ndx_batch_t, Fit) {
        let mut fit = Some(true);
        let mut views = Vec::new();
        if let OutKind::Packed(step) = kind {
            let item = dl_of(samples[0].0).1;
            let sizes: Vec<usize> = samples
                .iter()
                .map(|(_, s)| s.iter().product::<i64>() as usize * item)
                .collect();
            let gap = sizes.iter().max().unwrap() * *step as usize / 4 / item * item;
            let base = self.buffer(gap * samples.len() + sizes.iter().max().unwrap());
            for (j, (dtype, shape)) in samples.iter().enumerate() {
                // SAFETY: inside the buffer, sized for the last sample at the last gap.
                let at = unsafe { base.add(j * gap) };
                views.push(view(at, *dtype, shape, &compact(shape).unwrap(), false));
            }
            // Samples that touch bytes share some when they start less than a
            // sample's size apart.
            let touching: Vec<(usize, usize)> = sizes
                .iter()
                .enumerate()
                .filter(|&(_, &s)| s > 0)
                .map(|(j, &s)| (j * gap, j * gap + s))
                .collect();
            if touching
                .iter()
                .enumerate()
                .any(|(a, x)| touching[a + 1..].iter().any(|y| x.0 < y.1 && y.0 < x.1))
            {
                fit = Some(false);
            }
        } else {
            let extra = matches!(kind, OutKind::WrongCount).then(|| samples[0].clone());
            if extra.is_some() {
                fit = Some(false);
            }
            for (j, (dtype, shape)) in samples.iter().chain(&extra).enumerate() {
                // Batch samples agree in dtype and ndim: a wrong shape in sample 0 only.
                let kind = match kind {
                    OutKind::WrongShape(_) if shape.is_empty() => &OutKind::Exact,
                    OutKind::WrongShape(_) if j > 0 => &OutKind::Exact,
                    OutKind::WrongShape(_) => &OutKind::WrongShape(1),
                    OutKind::WrongCount | OutKind::Chained(_) | OutKind::Shifted(..) => {
                        &OutKind::Exact
                    }
                    k => k,
                };
                let (dtype, shape, strides, read_only, f) = Lent::geometry(*dtype, shape, kind);
                let item = dl_of(dtype).1;
                let (span, origin) = Lent::span(&shape, &strides, item);
                let misaligned = usize::from(matches!(kind, OutKind::Misaligned));
                // SAFETY: as in `tensor`.
                let data = unsafe { self.buffer(span + misaligned).add(origin + misaligned) };
                views.push(view(data, dtype, &shape, &strides, read_only));
                if f == Some(false) {
                    fit = f;
                }
            }
        }
        let (ms, counts): (Vec<_>, Vec<_>) = views.into_iter().unzip();
        self.counts.extend(counts);
        let b = import_batch(&ms, std::ptr::null());
        self.batches.push(b);
        (b, fit)
    }

    fn release(self) -> (Vec<Count>, Vec<Vec<u64>>) {
        for t in self.tensors {
            ndx_tensor_release(t);
        }
        for b in self.batches {
            ndx_batch_release(b);
        }
        drop(self.ctx);
        (self.counts, self.buffers)
    }
}

/// An invocation with out tensors, against the same invocation without them (SYNC):
/// a call-time error exactly when the reference erred or an out entry does not fit
/// (unless the test cannot tell), else the reference's outcome, its values in the out
/// tensors and in the future's outputs.
fn out_once(c: &OutCase) {
    const SYNC: i32 = ndx_eval_mode_t::NDX_EVAL_SYNC_CPU as i32;
    let inputs = Inputs::import(&c.inv);
    let list = inputs.list();
    let args = args_of(&c.inv);
    let op = CString::new(c.inv.op).unwrap();
    // The reference: outputs ndx allocates.
    let reference: Option<(Vec<Produced>, bool)> = {
        let ctx = quiet_ctx(SYNC);
        match invoke_with(&ctx, &op, &list, args, &invoke_options(SYNC, &[])) {
            Err(e) => {
                caller_error(e, "reference ndx_invoke");
                None
            }
            Ok(f) => {
                let e = ndx_future_wait(f, -1);
                let r = if e.is_null() {
                    Some((outputs_of(f), true))
                } else {
                    caller_error(e, "reference wait");
                    None
                };
                ndx_future_release(f);
                r.or(Some((Vec::new(), false)))
            }
        }
    };
    let ready = reference.as_ref().filter(|r| r.1).map(|r| &r.0);
    // The outputs' metadata (a guess from input 0 when the reference has none).
    let metas: Vec<Produced> = ready.cloned().unwrap_or_else(|| {
        let (dtype, shape) = c
            .inv
            .inputs
            .first()
            .map_or((12, Vec::new()), |s| (s.dtype, s.shape.clone()));
        let one = Sample {
            dtype,
            shape,
            bytes: Vec::new(),
        };
        vec![if c.inv.as_batch {
            Produced::Batch(vec![one; c.inv.samples])
        } else {
            Produced::Tensor(one)
        }]
    });
    let mut lent = Lent::default();
    let mut fits: Vec<Fit> = Vec::new();
    let mut handles: Vec<Option<Result<*mut ndx_tensor_t, *mut ndx_batch_t>>> = Vec::new();
    let entries: Vec<ndx_output_t> = c
        .outs
        .iter()
        .enumerate()
        .map(|(i, kind)| {
            let meta = metas.get(i).unwrap_or(&metas[0]);
            let (tensor, batch, fit): (*const ndx_tensor_t, *const ndx_batch_t, Fit) =
                match (kind, meta) {
                    (OutKind::Null, _) => (std::ptr::null(), std::ptr::null(), Some(true)),
                    (OutKind::Input(k), _) => list
                        .get(*k)
                        .map_or((std::ptr::null(), std::ptr::null(), Some(true)), |input| {
                            (input.tensor, input.batch, None)
                        }),
                    (&OutKind::Shifted(k, shift), Produced::Tensor(s)) => {
                        let at = shift as isize * dl_of(s.dtype).1 as isize;
                        let t = inputs
                            .regions
                            .get(k)
                            .and_then(|&r| lent.shifted(s.dtype, &s.shape, r, at))
                            .unwrap_or_else(|| lent.tensor(s.dtype, &s.shape, &OutKind::Exact).0);
                        (t, std::ptr::null(), Some(true))
                    }
                    (&OutKind::Shifted(k, shift), Produced::Batch(s))
                        if k < inputs.batch_regions.len() =>
                    {
                        let metas: Vec<_> = s.iter().map(|s| (s.dtype, s.shape.clone())).collect();
                        let b = lent.batch_over(&metas, &inputs.batch_regions[k], shift);
                        (std::ptr::null(), b, Some(true))
                    }
                    (OutKind::Both, Produced::Tensor(s)) => {
                        let (t, _) = lent.tensor(s.dtype, &s.shape, &OutKind::Exact);
                        let (b, _) = lent.batch(&[(s.dtype, s.shape.clone())], &OutKind::Exact);
                        (t, b, Some(false))
                    }
                    (OutKind::Both, Produced::Batch(s)) => {
                        let (t, _) = lent.tensor(s[0].dtype, &s[0].shape, &OutKind::Exact);
                        let metas: Vec<_> = s.iter().map(|s| (s.dtype, s.shape.clone())).collect();
                        let (b, _) = lent.batch(&metas, &OutKind::Exact);
                        (t, b, Some(false))
                    }
                    (kind, Produced::Tensor(s)) => {
                        let (t, fit) = lent.tensor(s.dtype, &s.shape, kind);
                        (t, std::ptr::null(), fit)
                    }
                    (kind, Produced::Batch(s)) => {
                        let metas: Vec<_> = s.iter().map(|s| (s.dtype, s.shape.clone())).collect();
                        let (b, fit) = lent.batch(&metas, kind);
                        (std::ptr::null(), b, fit)
                    }
                };
            fits.push(fit);
            handles.push(match (tensor.is_null(), batch.is_null()) {
                (false, true) => Some(Ok(tensor.cast_mut())),
                (true, false) => Some(Err(batch.cast_mut())),
                _ => None,
            });
            ndx_output_t { tensor, batch }
        })
        .collect();
    let count_fits = c.outs.is_empty() || ready.is_some_and(|r| r.len() == c.outs.len());
    let count_wrong = !c.outs.is_empty() && ready.is_some_and(|r| r.len() != c.outs.len());
    // (Entries made from guessed metadata may fit by chance.)
    let misfit = ready.is_some() && fits.contains(&Some(false));
    let must_refuse = reference.is_none() || count_wrong || misfit;
    let must_accept = ready.is_some() && count_fits && fits.iter().all(|&f| f == Some(true));

    let ctx = quiet_ctx(c.mode);
    match invoke_with(&ctx, &op, &list, args, &invoke_options(0, &entries)) {
        Err(e) => {
            let (_, msg) = caller_error(e, "ndx_invoke with out tensors");
            assert!(!must_accept, "out tensors that fit were refused: {msg}");
        }
        Ok(f) => {
            assert!(!must_refuse, "accepted out tensors that do not fit: {c:?}");
            let e = ndx_future_wait(f, -1);
            match ready {
                Some(want) => {
                    if let Some((_, msg)) = take_error(e) {
                        panic!("failed with out tensors, but not without: {msg}");
                    }
                    assert_eq!(&outputs_of(f), want, "the future's outputs");
                    for (i, h) in handles.iter().enumerate() {
                        let got = match h {
                            Some(Ok(t)) => Produced::Tensor(sample_of(*t)),
                            Some(Err(b)) => Produced::Batch(samples_of(*b)),
                            None => continue,
                        };
                        assert_eq!(got, want[i], "out entry {i} after the work");
                    }
                }
                None => {
                    assert!(!e.is_null(), "succeeded with out tensors, but not without");
                    caller_error(e, "the wait's error");
                }
            }
            ndx_future_release(f);
        }
    }
    ndx_args_free(args);
    let (lent_counts, buffers) = lent.release();
    let (counts, _buffers) = inputs.release();
    drop(ctx);
    drop(buffers);
    every_deleter_once(&counts);
    every_deleter_once(&lent_counts);
}

proptest! {
    #![proptest_config(config(300))]

    #[test]
    fn out_tensors_are_refused_cleanly_or_hold_the_result(c in out_case()) {
        out_once(&c);
    }
}

// ---------------------------------------------------------------------------------
// Stacking imported batches: ndx_batch_to_tensor
// ---------------------------------------------------------------------------------

/// Bytes behind every sample of a stacked batch: room for a view that reaches 36
/// elements of 8 bytes before and after its element 0.
const STACK_BACKING: usize = 1024;

#[derive(Debug, Clone)]
struct StackSample {
    shape: Vec<i64>,
    strides: Option<Vec<i64>>,
    /// Elements past the least byte_offset that keeps the view in the backing.
    extra: u64,
    /// NULL data (kept only when the sample has no elements).
    null_data: bool,
    seed: u8,
}

/// A batch imported from DLPack (legacy or versioned, on the host or pinned host
/// memory, with a layout or none), then stacked; or a NULL batch or out-param.
#[derive(Debug, Clone)]
struct StackCase {
    dtype: i32,
    samples: Vec<StackSample>,
    layout: Option<String>,
    legacy: bool,
    device: u32,
    null_batch: bool,
    null_out: bool,
    /// The eval mode the `batch_to_tensor` operator is invoked in on the same batch.
    op_mode: i32,
    /// Whether that invocation writes into an out tensor (when the batch is uniform).
    with_out: bool,
}

fn stack_case() -> impl Strategy<Value = StackCase> {
    let base = (
        1i32..=13,
        0usize..4,
        prop_oneof![8 => Just(1u32), 1 => Just(3u32)],
    );
    base.prop_flat_map(|(dtype, ndim, device)| {
        let dims = || prop::collection::vec(prop_oneof![6 => 1i64..4, 1 => Just(0i64)], ndim);
        (dims(), 1usize..7).prop_flat_map(move |(shape0, n)| {
            let shape = prop_oneof![
                6 => Just(shape0.clone()),
                1 => prop::collection::vec(0i64..4, ndim),
            ];
            let sample = (
                shape,
                prop::option::of(prop::collection::vec(-4i64..5, ndim)),
                0u64..4,
                prop::bool::weighted(0.3),
                any::<u8>(),
            )
                .prop_map(|(shape, strides, extra, null_data, seed)| StackSample {
                    shape,
                    strides,
                    extra,
                    null_data,
                    seed,
                });
            let layout = prop::option::of(prop::sample::select(vec!["HWC", "CHW", "NHW"]))
                .prop_map(move |l| l.map(|l| l[..ndim].to_string()));
            (
                prop::collection::vec(sample, n),
                layout,
                any::<bool>(),
                prop::bool::weighted(0.03),
                prop::bool::weighted(0.03),
                prop::sample::select(vec![1i32, 3, 4]),
                any::<bool>(),
            )
                .prop_map(
                    move |(samples, layout, legacy, null_batch, null_out, op_mode, with_out)| {
                        StackCase {
                            dtype,
                            samples,
                            layout,
                            legacy,
                            device,
                            null_batch,
                            null_out,
                            op_mode,
                            with_out,
                        }
                    },
                )
        })
    })
}

impl StackSample {
    /// The producer tensor (its bytes fit the view) and the compact bytes it holds.
    fn spec(&self, dtype: i32) -> (Spec, Vec<u8>) {
        let (dl, item) = dl_of(dtype);
        let strides = self
            .strides
            .clone()
            .or_else(|| compact(&self.shape))
            .expect("small shapes have compact strides");
        let (mut lo, mut hi) = (0i64, 0i64);
        for (&d, &s) in self.shape.iter().zip(&strides) {
            let reach = (d - 1).max(0) * s;
            if reach < 0 { lo += reach } else { hi += reach }
        }
        let byte_offset = (self.extra as i64 - lo) as u64 * item as u64;
        assert!(byte_offset as usize + (hi as usize + 1) * item <= STACK_BACKING);
        let data: Vec<u8> = (0..STACK_BACKING)
            .map(|i| {
                let b = (i as u8).wrapping_mul(31).wrapping_add(self.seed);
                if dtype == 1 { b & 1 } else { b }
            })
            .collect();
        let numel: i64 = self.shape.iter().product();
        let expect = gather(&data, byte_offset as usize, &self.shape, &strides, item);
        let spec = Spec {
            data,
            dtype: dl,
            device: cpu(),
            shape: self.shape.clone(),
            strides: self.strides.clone(),
            byte_offset,
            ndim: None,
            null_data: self.null_data && numel == 0,
            null_shape: false,
            flags: DlpackFlags::empty(),
            major: 1,
        };
        (spec, expect)
    }
}

/// One stacking: the import of every sample succeeds; then `ndx_batch_to_tensor`
/// gives either NDX_ERROR_VALUE naming the first sample whose shape differs from
/// sample 0's, or a compact host tensor `[n, shape...]` holding the samples' elements
/// in order (compared with a gather from the producer's bytes), still valid after the
/// batch is gone; every producer deleter runs exactly once, at the batch's release.
impl StackCase {
    /// The layout of the stacked tensor: the samples' with "N" in front, or none.
    fn stacked_layout(&self) -> String {
        self.layout
            .as_ref()
            .filter(|l| !l.is_empty() && !l.contains('N'))
            .map_or(String::new(), |l| format!("N{l}"))
    }
}

/// `ndx_tensor_layout` of `t`.
fn layout_of(t: *const ndx_tensor_t) -> String {
    let mut l = std::ptr::null();
    ok(ndx_tensor_layout(t, &mut l));
    cstr(l)
}

fn stack_once(c: &StackCase) {
    let n = c.samples.len();
    let mut expected = Vec::new();
    let mut managed: Vec<*mut c_void> = Vec::new();
    let mut counts = Vec::new();
    for s in &c.samples {
        let (mut spec, bytes) = s.spec(c.dtype);
        spec.device = DLDevice {
            device_type: DLDeviceType(c.device),
            device_id: 0,
        };
        expected.push(bytes);
        let (m, count) = if c.legacy {
            let (m, count) = spec.legacy();
            (m.cast::<c_void>(), count)
        } else {
            let (m, count) = spec.versioned();
            (m.cast::<c_void>(), count)
        };
        managed.push(m);
        counts.push(count);
    }
    let layout = c.layout.as_ref().map(|l| CString::new(l.as_str()).unwrap());
    let opts = import_options(layout.as_deref(), false);
    let mut batch = std::ptr::null_mut();
    let e = if c.legacy {
        ndx_batch_from_dlpack(managed.as_ptr().cast(), n, &opts, &mut batch)
    } else {
        ndx_batch_from_dlpack_versioned(managed.as_ptr().cast(), n, &opts, &mut batch)
    };
    if let Some((_, msg)) = no_internal(e, "bulk import") {
        // Pinned host memory needs a CUDA driver to be ordered; host memory imports.
        assert_ne!(c.device, 1, "a valid host batch was refused: {msg}");
        for (m, count) in managed.iter().zip(&counts) {
            if c.legacy {
                drop_legacy(m.cast());
            } else {
                drop_versioned(m.cast());
            }
            assert_eq!(calls(count), 1);
        }
        return;
    }
    let mut stacked: *mut ndx_tensor_t = std::ptr::null_mut();
    let out = if c.null_out {
        std::ptr::null_mut()
    } else {
        &mut stacked as *mut _
    };
    let e = ndx_batch_to_tensor(
        if c.null_batch {
            std::ptr::null()
        } else {
            batch
        },
        out,
    );
    let shape0 = &c.samples[0].shape;
    let ragged = c.samples.iter().position(|s| &s.shape != shape0);
    let mut uniform = false;
    ok(ndx_batch_is_uniform(batch, &mut uniform));
    assert_eq!(uniform, ragged.is_none());
    if c.null_batch || c.null_out {
        let (kind, msg) = caller_error(e, "stack with a NULL argument");
        assert_eq!(kind, ndx_error_kind_t::NDX_ERROR_VALUE as i32, "{msg}");
        assert!(stacked.is_null(), "out set on failure: {msg}");
    } else if let Some(i) = ragged {
        let (kind, msg) = caller_error(e, "stack a ragged batch");
        assert_eq!(kind, ndx_error_kind_t::NDX_ERROR_VALUE as i32, "{msg}");
        assert!(msg.contains(&format!("sample {i} has shape")), "{msg}");
        assert!(stacked.is_null(), "out set on failure: {msg}");
    } else if let Some((_, msg)) = no_internal(e, "stack") {
        assert_ne!(c.device, 1, "a uniform host batch was not stacked: {msg}");
        assert!(stacked.is_null(), "out set on failure: {msg}");
    } else {
        let mut want_shape = vec![n as i64];
        want_shape.extend_from_slice(shape0);
        assert_eq!(shape_of(stacked), want_shape);
        assert_eq!(strides_of(stacked), compact(&want_shape).unwrap());
        let mut dtype = 0;
        ok(ndx_tensor_dtype(stacked, &mut dtype));
        assert_eq!(dtype, c.dtype);
        let mut device = cpu();
        ok(ndx_tensor_device(stacked, &mut device));
        assert_eq!(device.device_type, DLDeviceType::CPU);
        assert_eq!(layout_of(stacked), c.stacked_layout());
        let want: Vec<u8> = expected.concat();
        let mut nbytes = 0usize;
        ok(ndx_tensor_nbytes(stacked, &mut nbytes));
        assert_eq!(nbytes, want.len());
        let mut got = vec![0u8; nbytes];
        ok(ndx_tensor_copy_to(stacked, got.as_mut_ptr().cast(), nbytes));
        assert_eq!(got, want, "the stacked elements");
    }
    if !c.null_batch {
        stack_by_operator(c, batch, ragged, &expected.concat());
    }
    for count in &counts {
        assert_eq!(calls(count), 0, "deleter called while the batch lives");
    }
    ndx_batch_release(batch);
    for (k, count) in counts.iter().enumerate() {
        assert_eq!(
            calls(count),
            1,
            "sample {k}: deleter calls after the release"
        );
    }
    if !stacked.is_null() {
        // A copy: it outlives the producers' memory.
        let mut nbytes = 0usize;
        ok(ndx_tensor_nbytes(stacked, &mut nbytes));
        let mut got = vec![0u8; nbytes];
        ok(ndx_tensor_copy_to(stacked, got.as_mut_ptr().cast(), nbytes));
        assert_eq!(
            got,
            expected.concat(),
            "the stacked elements, batch released"
        );
        ndx_tensor_release(stacked);
    }
}

/// The `batch_to_tensor` operator on `batch`, in `c.op_mode`, into an out tensor when
/// `c.with_out` and the batch is uniform: refused at `ndx_invoke` naming the first
/// ragged sample, or an output (and out tensor) holding `want`, with the stacked layout.
fn stack_by_operator(c: &StackCase, batch: *const ndx_batch_t, ragged: Option<usize>, want: &[u8]) {
    let ctx = Ctx::new(c.op_mode);
    let input = [ndx_input_t {
        tensor: std::ptr::null(),
        batch,
    }];
    let mut shape = vec![c.samples.len() as i64];
    shape.extend_from_slice(&c.samples[0].shape);
    let mut buf = vec![0u64; want.len().div_ceil(8)];
    let out = (c.with_out && ragged.is_none())
        .then(|| wrap_host(buf.as_mut_ptr().cast(), c.dtype, &shape, None, false));
    let outputs: Vec<ndx_output_t> = out
        .iter()
        .map(|&tensor| ndx_output_t {
            tensor,
            batch: std::ptr::null(),
        })
        .collect();
    let opts = invoke_options(0, &outputs);
    let r = invoke_with(&ctx, c"batch_to_tensor", &input, std::ptr::null(), &opts);
    match (r, ragged) {
        (Err(e), Some(i)) => {
            let (kind, msg) = caller_error(e, "batch_to_tensor of a ragged batch");
            assert_eq!(kind, ndx_error_kind_t::NDX_ERROR_VALUE as i32, "{msg}");
            assert!(msg.contains(&format!("sample {i} has shape")), "{msg}");
        }
        (Err(e), None) => {
            let (_, msg) = caller_error(e, "batch_to_tensor");
            assert_ne!(c.device, 1, "a uniform host batch was refused: {msg}");
        }
        (Ok(f), Some(i)) => {
            ndx_future_release(f);
            panic!("batch_to_tensor of a batch ragged at sample {i} was accepted");
        }
        (Ok(f), None) => {
            let e = ndx_future_wait(f, 20_000_000_000);
            if let Some((_, msg)) = no_internal(e, "batch_to_tensor's run") {
                assert_ne!(c.device, 1, "batch_to_tensor of a host batch failed: {msg}");
            } else {
                let mut t = std::ptr::null_mut();
                ok(ndx_future_tensor(f, 0, &mut t));
                assert_eq!(shape_of(t), shape);
                let mut got = vec![0u8; want.len()];
                ok(ndx_tensor_copy_to(t, got.as_mut_ptr().cast(), got.len()));
                assert_eq!(got, want, "the operator's stacked elements");
                assert_eq!(layout_of(t), c.stacked_layout());
                ndx_tensor_release(t);
                if out.is_some() {
                    let bytes: &[u8] = bytemuck::cast_slice(&buf);
                    assert_eq!(&bytes[..want.len()], want, "the out tensor's elements");
                }
            }
            ndx_future_release(f);
        }
    }
    if let Some(o) = out {
        ndx_tensor_release(o);
    }
}

proptest! {
    #![proptest_config(config(300))]

    #[test]
    fn imported_batches_stack_or_name_the_ragged_sample(c in stack_case()) {
        stack_once(&c);
    }
}

// ---------------------------------------------------------------------------------
// Extreme operator arguments
// ---------------------------------------------------------------------------------
//
// Every operator that takes arguments, with values at and past the limits (i64::MIN
// and MAX, 2^31, 2^32, 2^62, NaN and infinities, repeated axes, empty and 40-entry
// arrays, wrong types), on small tensors (0-d and zero-size too) and on broadcast views
// of huge shapes, in SYNC_CPU and EAGER: no INTERNAL error (a panic, such as integer
// overflow in a debug build), no abort; on small inputs the outcome a simple
// reference gives (fails when the arguments are invalid; else the shape, and the
// elements for the operators that only move them).

/// Integers at and past every limit shape arithmetic meets, and the small ones.
const EXTREMES: &[i64] = &[
    i64::MIN,
    i64::MIN + 1,
    i64::MAX,
    i64::MAX - 1,
    -(1 << 62),
    1 << 62,
    -(1 << 32),
    1 << 32,
    -(1 << 31),
    1 << 31,
    -(1 << 31) - 1,
    (1 << 31) - 1,
    -(1 << 40),
    1 << 40,
];

/// A bound, axis or index: small, just outside a small range, or extreme.
fn bound() -> impl Strategy<Value = i64> {
    prop_oneof![
        6 => -5i64..6,
        2 => prop::sample::select(EXTREMES),
    ]
}

/// Sizes from 2^48 elements up: every system refuses an output that large (it is
/// beyond the address space), whatever its overcommit policy; a smaller one of GiBs
/// might really be allocated and filled.
const REFUSED: i64 = 1 << 48;

/// A size the operator honours (`pad` widths, `resize` extents): small, negative, or
/// so large that the output is refused (at least [`REFUSED`] elements, or not
/// addressable). Never 2^31 or 2^32 alone.
fn size_arg() -> impl Strategy<Value = i64> {
    prop_oneof![
        6 => -2i64..4,
        2 => prop::sample::select(vec![
            i64::MIN,
            i64::MIN + 1,
            i64::MAX,
            i64::MAX - 1,
            -(1 << 62),
            1 << 62,
            -(1 << 32),
            -(1 << 31),
            1 << 48,
            (1 << 62) + 1,
        ]),
    ]
}

/// An int array of `bound`s: mostly as long as the rank, sometimes empty or 40 long.
fn bounds(rank: usize) -> BoxedStrategy<Vec<i64>> {
    prop_oneof![
        8 => prop::collection::vec(bound(), rank.max(1)..=rank.max(1)),
        2 => prop::collection::vec(bound(), 0..=rank + 1),
        1 => prop::collection::vec(bound(), 40..=40),
    ]
    .boxed()
}

/// A float at the limits.
fn extreme_float() -> impl Strategy<Value = f64> {
    prop_oneof![
        4 => -3.0f64..3.0,
        2 => prop::sample::select(vec![
            f64::NAN,
            -f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            0.0,
            -0.0,
            f64::MAX,
            f64::MIN,
            f64::MIN_POSITIVE,
            5e-324,
            9.3e18,
            -9.3e18,
            1e300,
        ]),
    ]
}

/// A wrongly typed argument value.
fn wrong_type() -> impl Strategy<Value = ArgVal> {
    prop_oneof![
        bound().prop_map(ArgVal::Int),
        extreme_float().prop_map(ArgVal::Float),
        any::<bool>().prop_map(ArgVal::Bool),
        Just(ArgVal::Str("linear".into())),
        prop::collection::vec(bound(), 0..3).prop_map(ArgVal::Ints),
        prop::collection::vec(extreme_float(), 0..3).prop_map(ArgVal::Floats),
        (1i32..=13).prop_map(ArgVal::DType),
    ]
}

/// The operators that take arguments, their input count, and a strategy for their
/// arguments given the rank of the first input.
fn extreme_args(op: &'static str, rank: usize) -> BoxedStrategy<Vec<(&'static str, ArgVal)>> {
    let int = |name: &'static str| bound().prop_map(move |v| (name, ArgVal::Int(v)));
    // Crop windows: mostly inside a small image.
    let coord = |name: &'static str| {
        prop_oneof![3 => 0i64..3, 1 => bound()].prop_map(move |v| (name, ArgVal::Int(v)))
    };
    let size = |name: &'static str| size_arg().prop_map(move |v| (name, ArgVal::Int(v)));
    let ints = move |name: &'static str| bounds(rank).prop_map(move |v| (name, ArgVal::Ints(v)));
    let float = |name: &'static str| extreme_float().prop_map(move |v| (name, ArgVal::Float(v)));
    let floats = |name: &'static str| {
        prop_oneof![
            4 => prop::collection::vec(extreme_float(), 1..=3),
            1 => prop::collection::vec(extreme_float(), 0..=40),
        ]
        .prop_map(move |v| (name, ArgVal::Floats(v)))
    };
    let keepdims = any::<bool>().prop_map(|b| ("keepdims", ArgVal::Bool(b)));
    let opt = |s: BoxedStrategy<(&'static str, ArgVal)>| prop::option::weighted(0.8, s);
    let args: BoxedStrategy<Vec<Option<(&'static str, ArgVal)>>> = match op {
        "slice" => prop_oneof![
            // One entry per sliced axis (as many as the rank or fewer), axes distinct.
            (0..=rank.max(1)).prop_flat_map(move |k| {
                let v = move || prop::collection::vec(bound(), k);
                (
                    v(),
                    v(),
                    prop::option::weighted(0.7, v()),
                    prop::option::weighted(
                        0.5,
                        Just((0..rank as i64).collect::<Vec<_>>()).prop_shuffle(),
                    ),
                    any::<bool>(),
                )
                    .prop_map(move |(a, b, c, d, neg)| {
                        let d = d.map(|d: Vec<i64>| {
                            d.into_iter()
                                .take(k)
                                .map(|a| if neg { a - rank as i64 } else { a })
                                .collect()
                        });
                        vec![
                            Some(("start", ArgVal::Ints(a))),
                            Some(("end", ArgVal::Ints(b))),
                            c.map(|c| ("step", ArgVal::Ints(c))),
                            d.map(|d| ("axes", ArgVal::Ints(d))),
                        ]
                    })
            }),
            (
                ints("start"),
                ints("end"),
                opt(ints("step").boxed()),
                opt(ints("axes").boxed()),
            )
                .prop_map(|(a, b, c, d)| vec![Some(a), Some(b), c, d]),
        ]
        .boxed(),
        "pad" => (
            prop_oneof![
                4 => prop::collection::vec(size_arg(), 2 * rank..=2 * rank),
                1 => prop::collection::vec(size_arg(), 0..=40),
            ]
            .prop_map(|v| ("widths", ArgVal::Ints(v))),
            opt(float("value").boxed()),
        )
            .prop_map(|(a, b)| vec![Some(a), b])
            .boxed(),
        "reshape" => prop_oneof![
            ints("shape"),
            // Around the most dimensions a tensor may have (64): ones and one -1.
            (30usize..=70, any::<prop::sample::Index>()).prop_map(|(k, i)| {
                let mut v = vec![1i64; k];
                v[i.index(k)] = -1;
                ("shape", ArgVal::Ints(v))
            }),
            prop::collection::vec(prop_oneof![3 => -1i64..4, 1 => Just(0)], 0..=5)
                .prop_map(|v| ("shape", ArgVal::Ints(v))),
        ]
        .prop_map(|a| vec![Some(a)])
        .boxed(),
        "transpose" | "flip" | "squeeze" | "check_shape" => {
            let name = match op {
                "transpose" => "perm",
                "check_shape" => "pattern",
                _ => "axes",
            };
            opt(ints(name).boxed()).prop_map(|a| vec![a]).boxed()
        }
        "expand_dims" | "concat" | "stack" => {
            opt(int("axis").boxed()).prop_map(|a| vec![a]).boxed()
        }
        "argmax" | "argmin" => (opt(int("axis").boxed()), opt(keepdims.boxed()))
            .prop_map(|(a, b)| vec![a, b])
            .boxed(),
        "sum" | "prod" | "mean" | "min" | "max" | "all" | "any" => (
            opt(prop_oneof![ints("axes"), int("axes")].boxed()),
            opt(keepdims.boxed()),
        )
            .prop_map(|(a, b)| vec![a, b])
            .boxed(),
        "crop" => (coord("x"), coord("y"), coord("w"), coord("h"))
            .prop_map(|(a, b, c, d)| vec![Some(a), Some(b), Some(c), Some(d)])
            .boxed(),
        "resize" => (
            size("h"),
            size("w"),
            opt(
                prop_oneof![Just("linear"), Just("nearest"), Just("cubic"), Just("")]
                    .prop_map(|s| ("interp", ArgVal::Str(s.into())))
                    .boxed(),
            ),
        )
            .prop_map(|(a, b, c)| vec![Some(a), Some(b), c])
            .boxed(),
        "clamp" | "check_range" => (opt(float("lo").boxed()), opt(float("hi").boxed()))
            .prop_map(|(a, b)| vec![a, b])
            .boxed(),
        "normalize" => (
            prop_oneof![floats("mean"), float("mean")],
            prop_oneof![floats("std"), float("std")],
        )
            .prop_map(|(a, b)| vec![Some(a), Some(b)])
            .boxed(),
        "cast" => prop_oneof![1i32..=13, -1i32..16]
            .prop_map(|d| vec![Some(("dtype", ArgVal::DType(d)))])
            .boxed(),
        "to_device" => int("device").prop_map(|a| vec![Some(a)]).boxed(),
        _ => unreachable!("{op}"),
    };
    // Now and then one argument of the wrong type.
    (
        args,
        prop::option::weighted(0.1, (any::<prop::sample::Index>(), wrong_type())),
    )
        .prop_map(|(args, wrong)| {
            let mut args: Vec<_> = args.into_iter().flatten().collect();
            if let Some((i, v)) = wrong
                && !args.is_empty()
            {
                let k = i.index(args.len());
                args[k].1 = v;
            }
            args
        })
        .boxed()
}

/// The operators `extreme_args` knows, with their number of inputs.
const EXTREME_OPS: &[(&str, usize)] = &[
    ("slice", 1),
    ("pad", 1),
    ("reshape", 1),
    ("transpose", 1),
    ("flip", 1),
    ("squeeze", 1),
    ("expand_dims", 1),
    ("crop", 1),
    ("resize", 1),
    ("clamp", 1),
    ("check_range", 1),
    ("check_shape", 1),
    ("normalize", 1),
    ("cast", 1),
    ("sum", 1),
    ("prod", 1),
    ("mean", 1),
    ("min", 1),
    ("max", 1),
    ("all", 1),
    ("any", 1),
    ("argmax", 1),
    ("argmin", 1),
    ("concat", 2),
    ("stack", 2),
    ("to_device", 1),
];

/// An input of an extreme-argument invocation: a small compact host tensor whose
/// element `i` is `i % 100 + 1` (bool: `i % 2`), or a broadcast view (every stride 0)
/// of one element over a huge shape (extents of [`REFUSED`] and more, so that an
/// output keeping one is refused rather than allocated).
#[derive(Debug, Clone)]
struct Operand {
    dtype: i32,
    shape: Vec<i64>,
    broadcast: bool,
    layout: Option<&'static str>,
    /// A small operand's elements lie in reverse (every stride negated) ...
    reversed: bool,
    /// ... and its extents of 1 have this stride (any value is valid there).
    unit_stride: Option<i64>,
}

/// An operand; an image (3-d, with a layout) mostly when `image`.
fn operand(image: bool) -> impl Strategy<Value = Operand> {
    let ranks = if image { 3usize..=3 } else { 0usize..=4 };
    let ranks = prop_oneof![3 => ranks, 1 => 0usize..=4];
    let small = ranks
        .prop_flat_map(|r| prop::collection::vec(prop_oneof![4 => 1i64..4, 1 => Just(0i64)], r));
    let huge = prop::collection::vec(
        prop_oneof![
            2 => 1i64..4,
            1 => Just(0i64),
            3 => prop::sample::select(vec![REFUSED, 1 << 62, i64::MAX]),
        ],
        1..=4,
    );
    (
        prop::sample::select(vec![12, 12, 12, 6, 4, 5, 13, 1, 10]),
        prop_oneof![4 => small.prop_map(|s| (s, false)), 1 => huge.prop_map(|s| (s, true))],
        any::<bool>(),
        prop::bool::weighted(0.2),
        prop::option::weighted(
            0.2,
            prop::sample::select(vec![i64::MIN, i64::MAX, i64::MIN + 1, 1 << 62, -(1 << 40)]),
        ),
    )
        .prop_map(|(dtype, (shape, broadcast), hwc, reversed, unit_stride)| {
            let layout = (shape.len() == 3).then_some(if hwc { "HWC" } else { "CHW" });
            Operand {
                dtype,
                shape,
                broadcast,
                layout,
                reversed,
                unit_stride,
            }
        })
}

#[derive(Debug, Clone)]
struct Extreme {
    op: &'static str,
    inputs: Vec<Operand>,
    args: Vec<(&'static str, ArgVal)>,
    /// EAGER, else SYNC_CPU.
    eager: bool,
    /// Checks on (every category, COLLECT: flags are reported, nothing fails).
    checks: bool,
}

fn extreme() -> impl Strategy<Value = Extreme> {
    (0..EXTREME_OPS.len(), any::<bool>())
        .prop_flat_map(|(i, eager)| {
            let (op, _) = EXTREME_OPS[i];
            let image = matches!(op, "crop" | "resize" | "normalize");
            (Just(i), operand(image), Just(eager))
        })
        .prop_flat_map(|(i, first, eager)| {
            let (op, n) = EXTREME_OPS[i];
            let rest = prop::collection::vec(
                prop_oneof![3 => Just(first.clone()), 1 => operand(false)],
                n - 1,
            );
            let args = extreme_args(op, first.shape.len());
            let checks = prop::bool::weighted(0.2);
            (Just(op), Just(first), rest, args, (Just(eager), checks))
        })
        .prop_map(|(op, first, rest, mut args, (eager, checks))| {
            // On a huge view, bounds and windows select as much as they say: one between
            // 2^20 and REFUSED would make a real output of GiBs.
            if first.broadcast {
                let safe = |v: &mut i64| {
                    if v.unsigned_abs() > 1 << 20 && v.unsigned_abs() < REFUSED as u64 {
                        *v = REFUSED * v.signum();
                    }
                };
                for (_, v) in &mut args {
                    match v {
                        ArgVal::Int(v) => safe(v),
                        ArgVal::Ints(v) => v.iter_mut().for_each(safe),
                        _ => {}
                    }
                }
            }
            Extreme {
                op,
                inputs: std::iter::once(first).chain(rest).collect(),
                args,
                eager,
                checks,
            }
        })
}

/// The value of element `i` of a small operand.
fn operand_value(dtype: i32, i: usize) -> f64 {
    if dtype == 1 {
        (i % 2) as f64
    } else {
        (i % 100 + 1) as f64
    }
}

/// The elements of a host tensor of dtype bool, int32, int64, uint8, float16 (as
/// raw bits: only compared), float32 or float64, as f64.
fn values_f64(t: *const ndx_tensor_t, dtype: i32) -> Vec<f64> {
    let mut nbytes = 0usize;
    ok(ndx_tensor_nbytes(t, &mut nbytes));
    assert!(nbytes <= 1 << 24, "an output of {nbytes} bytes");
    let mut buf = vec![0u8; nbytes];
    ok(ndx_tensor_copy_to(t, buf.as_mut_ptr().cast(), nbytes));
    let item = dl_of(dtype).1;
    buf.chunks_exact(item)
        .map(|c| match dtype {
            1 | 6 => c[0] as f64,
            4 => i32::from_ne_bytes(c.try_into().unwrap()) as f64,
            5 => i64::from_ne_bytes(c.try_into().unwrap()) as f64,
            10 => u16::from_ne_bytes(c.try_into().unwrap()) as f64,
            12 => f32::from_ne_bytes(c.try_into().unwrap()) as f64,
            13 => f64::from_ne_bytes(c.try_into().unwrap()),
            _ => f64::NAN,
        })
        .collect()
}

/// The host input `o`: compact elements, or a broadcast view of one element (None
/// when ndx refuses its shape).
fn make_operand(o: &Operand, keep: &mut Vec<Vec<u8>>) -> Option<*mut ndx_tensor_t> {
    let (_, item) = dl_of(o.dtype);
    let numel = if o.broadcast {
        1
    } else {
        o.shape.iter().product::<i64>() as usize
    };
    let mut bytes = vec![0u8; numel.max(1) * item + 8];
    for i in 0..numel {
        let v = operand_value(o.dtype, i);
        let b: Vec<u8> = match o.dtype {
            1 | 6 => vec![v as u8],
            4 => (v as i32).to_ne_bytes().to_vec(),
            5 => (v as i64).to_ne_bytes().to_vec(),
            10 => half_bits(v).to_ne_bytes().to_vec(),
            12 => (v as f32).to_ne_bytes().to_vec(),
            13 => v.to_ne_bytes().to_vec(),
            _ => unreachable!(),
        };
        let at = if o.reversed { numel - 1 - i } else { i };
        bytes[at * item..(at + 1) * item].copy_from_slice(&b);
    }
    let mut strides = vec![0i64; o.shape.len()];
    let mut origin = 0usize;
    if !o.broadcast {
        let mut acc = 1i64;
        for d in (0..o.shape.len()).rev() {
            strides[d] = if o.reversed { -acc } else { acc };
            if o.shape[d] == 1 {
                strides[d] = o.unit_stride.unwrap_or(strides[d]);
            }
            acc *= o.shape[d].max(1);
        }
        if o.reversed && numel > 0 {
            origin = (numel - 1) * item;
        }
    }
    let layout = o.layout.map(|l| CString::new(l).unwrap());
    let opts = import_options(layout.as_deref(), false);
    let mut t = std::ptr::null_mut();
    let e = ndx_tensor_wrap_host(
        bytes[origin..].as_mut_ptr().cast(),
        o.dtype,
        o.shape.len() as i32,
        o.shape.as_ptr(),
        strides.as_ptr(),
        None,
        std::ptr::null_mut(),
        &opts,
        &mut t,
    );
    keep.push(bytes);
    // A broadcast whose element count overflows the address space is refused.
    no_internal(e, "ndx_tensor_wrap_host").map_or(Some(t), |_| {
        assert!(o.broadcast, "a small operand was refused");
        None
    })
}

/// Small integers as IEEE half bits (exact below 2048).
fn half_bits(v: f64) -> u16 {
    if v == 0.0 {
        return 0;
    }
    let e = v.log2().floor() as i32;
    let m = ((v / 2f64.powi(e) - 1.0) * 1024.0) as u16;
    (((e + 15) as u16) << 10) | m
}

/// What a valid invocation on small inputs yields: its shape, and for the operators
/// that only move elements, the input element (flat index) or fill value each output
/// element holds.
struct Expected {
    shape: Vec<i64>,
    from: Option<Vec<Result<usize, f64>>>,
}

fn arg<'a>(x: &'a Extreme, name: &str) -> Option<&'a ArgVal> {
    x.args
        .iter()
        .rev()
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v)
}

/// An int array argument (a single int counts as one).
fn arg_ints(x: &Extreme, name: &str) -> Option<Result<Vec<i64>, ()>> {
    arg(x, name).map(|v| match v {
        ArgVal::Ints(v) => Ok(v.clone()),
        ArgVal::Int(v) => Ok(vec![*v]),
        _ => Err(()),
    })
}

fn arg_int(x: &Extreme, name: &str) -> Option<Result<i64, ()>> {
    arg(x, name).map(|v| match v {
        ArgVal::Int(v) => Ok(*v),
        _ => Err(()),
    })
}

/// `axes` normalized against `ndim` (sorted), or None when one is out of range or
/// repeated.
fn ref_axes(axes: &[i64], ndim: usize) -> Option<Vec<usize>> {
    let n = ndim as i128;
    let mut out = Vec::new();
    for &a in axes {
        let a = a as i128;
        if a < -n || a >= n {
            return None;
        }
        let a = (if a < 0 { a + n } else { a }) as usize;
        if out.contains(&a) {
            return None;
        }
        out.push(a);
    }
    out.sort_unstable();
    Some(out)
}

/// Every index of `shape` in C order.
fn indices(shape: &[i64]) -> Vec<Vec<i64>> {
    let n: i64 = shape.iter().product();
    (0..n)
        .map(|mut k| {
            let mut idx = vec![0i64; shape.len()];
            for d in (0..shape.len()).rev() {
                idx[d] = k % shape[d];
                k /= shape[d];
            }
            idx
        })
        .collect()
}

fn flat(idx: &[i64], shape: &[i64]) -> usize {
    idx.iter()
        .zip(shape)
        .fold(0i64, |acc, (&i, &d)| acc * d + i) as usize
}

/// A move of elements: output shape, and the input index each output index reads
/// (None: the fill value).
fn moved(
    shape: &[i64],
    out: Vec<i64>,
    fill: f64,
    f: impl Fn(&[i64]) -> Option<Vec<i64>>,
) -> Expected {
    let from = indices(&out)
        .iter()
        .map(|o| f(o).map_or(Err(fill), |i| Ok(flat(&i, shape))))
        .collect();
    Expected {
        shape: out,
        from: Some(from),
    }
}

/// The reference for `x` on a small first input: Ok(Some) when valid with a known
/// result, Ok(None) when valid or not as far as this reference knows, Err when the
/// arguments are invalid (the invocation must fail).
fn reference(x: &Extreme) -> Result<Option<Expected>, ()> {
    let s = &x.inputs[0].shape;
    let n = s.len();
    let wrong_typed =
        |name: &str, want: fn(&ArgVal) -> bool| arg(x, name).is_some_and(|v| !want(v));
    // A single int counts as an int array of one.
    let is_ints = |v: &ArgVal| matches!(v, ArgVal::Ints(_) | ArgVal::Int(_));
    let is_int = |v: &ArgVal| matches!(v, ArgVal::Int(_));
    let same = |shape: Vec<i64>| Expected { shape, from: None };
    match x.op {
        "slice" => {
            if ["start", "end", "step", "axes"]
                .iter()
                .any(|a| wrong_typed(a, is_ints))
            {
                return Err(());
            }
            let start = arg_ints(x, "start").unwrap().unwrap();
            let end = arg_ints(x, "end").unwrap().unwrap();
            let k = start.len();
            let step = arg_ints(x, "step").map_or(vec![1; k], Result::unwrap);
            let axes = arg_ints(x, "axes").map_or((0..k as i64).collect(), Result::unwrap);
            if end.len() != k || step.len() != k || axes.len() != k {
                return Err(());
            }
            ref_axes(&axes, n).ok_or(())?;
            if step.contains(&0) {
                return Err(());
            }
            // Per axis: first index and step, in i128; Python's slice.indices.
            let mut out = s.clone();
            let mut first = vec![0i128; n];
            let mut by = vec![1i128; n];
            for j in 0..k {
                let a = axes[j] as i128;
                let a = (if a < 0 { a + n as i128 } else { a }) as usize;
                let len = s[a] as i128;
                let st = step[j] as i128;
                let adj = |v: i128| if v < 0 { v + len } else { v };
                let (lo, hi) = if st > 0 { (0, len) } else { (-1, len - 1) };
                let b = adj(start[j] as i128).clamp(lo, hi);
                let e = adj(end[j] as i128).clamp(lo, hi);
                let count = if st > 0 {
                    if e > b { (e - b - 1) / st + 1 } else { 0 }
                } else if b > e {
                    (b - e - 1) / -st + 1
                } else {
                    0
                };
                out[a] = count as i64;
                first[a] = b;
                by[a] = st;
            }
            Ok(Some(moved(s, out, 0.0, |o| {
                Some(
                    o.iter()
                        .enumerate()
                        .map(|(d, &i)| (first[d] + i as i128 * by[d]) as i64)
                        .collect(),
                )
            })))
        }
        "flip" => {
            if wrong_typed("axes", is_ints) {
                return Err(());
            }
            let axes = match arg_ints(x, "axes") {
                None => (0..n).collect(),
                Some(a) => ref_axes(&a.unwrap(), n).ok_or(())?,
            };
            Ok(Some(moved(s, s.clone(), 0.0, |o| {
                Some(
                    o.iter()
                        .enumerate()
                        .map(|(d, &i)| if axes.contains(&d) { s[d] - 1 - i } else { i })
                        .collect(),
                )
            })))
        }
        "transpose" => {
            if wrong_typed("perm", is_ints) {
                return Err(());
            }
            let perm = match arg_ints(x, "perm") {
                None => (0..n).rev().collect(),
                Some(p) => {
                    let p = p.unwrap();
                    if p.len() != n {
                        return Err(());
                    }
                    let a = ref_axes(&p, n).ok_or(())?;
                    debug_assert_eq!(a.len(), n);
                    p.iter()
                        .map(|&v| {
                            if v < 0 {
                                (v + n as i64) as usize
                            } else {
                                v as usize
                            }
                        })
                        .collect::<Vec<_>>()
                }
            };
            let out = perm.iter().map(|&p| s[p]).collect();
            Ok(Some(moved(s, out, 0.0, |o| {
                let mut i = vec![0i64; n];
                for (d, &p) in perm.iter().enumerate() {
                    i[p] = o[d];
                }
                Some(i)
            })))
        }
        "pad" => {
            if wrong_typed("widths", is_ints)
                || wrong_typed("value", |v| matches!(v, ArgVal::Float(_) | ArgVal::Int(_)))
            {
                return Err(());
            }
            let w = arg_ints(x, "widths").unwrap().unwrap();
            if w.len() != 2 * n || w.iter().any(|&v| v < 0) {
                return Err(());
            }
            let out: Vec<i128> = (0..n)
                .map(|d| s[d] as i128 + w[2 * d] as i128 + w[2 * d + 1] as i128)
                .collect();
            if out.iter().any(|&d| d > 1 << 20) || out.iter().product::<i128>() > 1 << 20 {
                return Ok(None); // refused: too large
            }
            let out: Vec<i64> = out.iter().map(|&d| d as i64).collect();
            let value = match arg(x, "value") {
                None => 0.0,
                Some(ArgVal::Float(v)) => *v,
                Some(ArgVal::Int(v)) => *v as f64,
                _ => unreachable!(),
            };
            Ok(Some(moved(s, out, value, |o| {
                let i: Vec<i64> = o.iter().enumerate().map(|(d, &i)| i - w[2 * d]).collect();
                i.iter().zip(s).all(|(&i, &d)| i >= 0 && i < d).then_some(i)
            })))
        }
        "reshape" => {
            if wrong_typed("shape", is_ints) {
                return Err(());
            }
            let t = arg_ints(x, "shape").unwrap().unwrap();
            let numel: i128 = s.iter().map(|&d| d as i128).product();
            if t.iter().filter(|&&d| d == -1).count() > 1 || t.iter().any(|&d| d < -1) {
                return Err(());
            }
            let known = t
                .iter()
                .filter(|&&d| d != -1)
                .try_fold(1i128, |acc, &d| acc.checked_mul(d as i128))
                .filter(|&k| k <= i64::MAX as i128)
                .ok_or(())?;
            let mut out = t.clone();
            if let Some(i) = t.iter().position(|&d| d == -1) {
                if known == 0 || numel % known != 0 {
                    return Err(());
                }
                out[i] = (numel / known) as i64;
            } else if known != numel {
                return Err(());
            }
            // Compact strides must fit int64 (a zero-size shape with huge extents).
            let mut acc = 1i128;
            for &d in out.iter().rev() {
                acc *= d.max(1) as i128;
                if acc > i64::MAX as i128 {
                    return Ok(None);
                }
            }
            Ok(Some(moved(s, out.clone(), 0.0, |o| {
                let k = flat(o, &out);
                let mut i = vec![0i64; n];
                let mut k = k as i64;
                for d in (0..n).rev() {
                    i[d] = k % s[d];
                    k /= s[d];
                }
                Some(i)
            })))
        }
        "squeeze" => {
            if wrong_typed("axes", is_ints) {
                return Err(());
            }
            let axes = match arg_ints(x, "axes") {
                None => (0..n).filter(|&d| s[d] == 1).collect(),
                Some(a) => ref_axes(&a.unwrap(), n).ok_or(())?,
            };
            if axes.iter().any(|&a| s[a] != 1) {
                return Err(());
            }
            let out = (0..n).filter(|d| !axes.contains(d)).map(|d| s[d]).collect();
            Ok(Some(same(out)))
        }
        "expand_dims" => {
            let Some(a) = arg_int(x, "axis") else {
                return Err(());
            };
            let a = a.map_err(|_| ())? as i128;
            let m = n as i128 + 1;
            if a < -m || a >= m {
                return Err(());
            }
            let mut out = s.clone();
            out.insert((if a < 0 { a + m } else { a }) as usize, 1);
            Ok(Some(same(out)))
        }
        "sum" | "prod" | "mean" | "min" | "max" | "all" | "any" => {
            if wrong_typed("keepdims", |v| matches!(v, ArgVal::Bool(_))) {
                return Err(());
            }
            let axes = match arg(x, "axes") {
                None => (0..n).collect(),
                Some(ArgVal::Int(a)) => ref_axes(&[*a], n).ok_or(())?,
                Some(ArgVal::Ints(a)) => ref_axes(a, n).ok_or(())?,
                Some(_) => return Err(()),
            };
            let keep = matches!(arg(x, "keepdims"), Some(ArgVal::Bool(true)));
            let empty = axes.iter().any(|&a| s[a] == 0);
            // Like NumPy, an empty output needs no identity.
            let kept: i64 = (0..n).filter(|d| !axes.contains(d)).map(|d| s[d]).product();
            if matches!(x.op, "min" | "max") && empty && kept > 0 {
                return Err(());
            }
            let out = (0..n)
                .filter_map(|d| match (axes.contains(&d), keep) {
                    (true, true) => Some(1),
                    (true, false) => None,
                    (false, _) => Some(s[d]),
                })
                .collect();
            Ok(Some(same(out)))
        }
        "argmax" | "argmin" => {
            if wrong_typed("keepdims", |v| matches!(v, ArgVal::Bool(_)))
                || wrong_typed("axis", is_int)
            {
                return Err(());
            }
            let keep = matches!(arg(x, "keepdims"), Some(ArgVal::Bool(true)));
            let out = match arg_int(x, "axis") {
                None => {
                    if s.contains(&0) {
                        return Err(());
                    }
                    if keep { vec![1; n] } else { vec![] }
                }
                Some(a) => {
                    let a = ref_axes(&[a.unwrap()], n).ok_or(())?[0];
                    if s.contains(&0) {
                        // An empty output may or may not be an error.
                        return if s[a] == 0
                            && s.iter().product::<i64>() == 0
                            && (0..n).all(|d| d == a || s[d] > 0)
                        {
                            Err(())
                        } else {
                            Ok(None)
                        };
                    }
                    let mut out = s.clone();
                    if keep {
                        out[a] = 1
                    } else {
                        out.remove(a);
                    }
                    out
                }
            };
            Ok(Some(same(out)))
        }
        "clamp" | "cast" | "normalize" | "check_range" => Ok(None),
        "crop" => {
            if ["x", "y", "w", "h"].iter().any(|a| wrong_typed(a, is_int))
                || x.inputs[0].layout.is_none()
            {
                return Err(());
            }
            let g = |a| arg_int(x, a).unwrap().unwrap() as i128;
            let (cx, cy, w, h) = (g("x"), g("y"), g("w"), g("h"));
            let hwc = x.inputs[0].layout == Some("HWC");
            let (ih, iw) = if hwc { (s[0], s[1]) } else { (s[1], s[2]) };
            // The window is never empty.
            if cx < 0 || cy < 0 || w < 1 || h < 1 || cx + w > iw as i128 || cy + h > ih as i128 {
                return Err(());
            }
            let out = if hwc {
                vec![h as i64, w as i64, s[2]]
            } else {
                vec![s[0], h as i64, w as i64]
            };
            Ok(Some(moved(s, out, 0.0, |o| {
                Some(if hwc {
                    vec![o[0] + cy as i64, o[1] + cx as i64, o[2]]
                } else {
                    vec![o[0], o[1] + cy as i64, o[2] + cx as i64]
                })
            })))
        }
        "resize" => {
            if ["h", "w"].iter().any(|a| wrong_typed(a, is_int)) || x.inputs[0].layout.is_none() {
                return Err(());
            }
            let (h, w) = (
                arg_int(x, "h").unwrap().unwrap(),
                arg_int(x, "w").unwrap().unwrap(),
            );
            let interp = arg(x, "interp");
            if !matches!(interp, None | Some(ArgVal::Str(_)))
                || matches!(interp, Some(ArgVal::Str(i)) if i != "linear" && i != "nearest")
            {
                return Err(());
            }
            let hwc = x.inputs[0].layout == Some("HWC");
            let (ih, iw, c) = if hwc {
                (s[0], s[1], s[2])
            } else {
                (s[1], s[2], s[0])
            };
            if c == 0 && h >= 1 && w >= 1 {
                return Ok(None); // no channels: maybe no pixels either
            }
            if h < 1 || w < 1 || ih == 0 || iw == 0 || x.inputs[0].dtype == 1 {
                return Err(());
            }
            if h > 1 << 20 || w > 1 << 20 {
                return Ok(None);
            }
            Ok(Some(same(if hwc {
                vec![h, w, s[2]]
            } else {
                vec![s[0], h, w]
            })))
        }
        "concat" | "stack" => {
            let b = &x.inputs[1];
            if b.broadcast || wrong_typed("axis", is_int) {
                return Ok(None);
            }
            let a = arg_int(x, "axis").map_or(0, Result::unwrap) as i128;
            let m = n as i128 + i128::from(x.op == "stack");
            if a < -m || a >= m || (x.op == "concat" && n == 0) {
                return Err(());
            }
            let a = (if a < 0 { a + m } else { a }) as usize;
            if x.op == "stack" {
                if b.shape != *s {
                    return Err(());
                }
                let mut out = s.clone();
                out.insert(a, 2);
                return Ok(Some(same(out)));
            }
            if b.shape.len() != n || (0..n).any(|d| d != a && b.shape[d] != s[d]) {
                return Err(());
            }
            let mut out = s.clone();
            out[a] += b.shape[a];
            Ok(Some(same(out)))
        }
        _ => Ok(None),
    }
}

/// Runs one extreme invocation in SYNC_CPU or EAGER on a fresh context (checks on or
/// off): no INTERNAL error, and on small inputs the reference's verdict, shape and
/// elements.
fn extreme_once(x: &Extreme) {
    let mode = if x.eager {
        ndx_eval_mode_t::NDX_EVAL_EAGER as i32
    } else {
        ndx_eval_mode_t::NDX_EVAL_SYNC_CPU as i32
    };
    let mut keep = Vec::new();
    let made: Vec<_> = x
        .inputs
        .iter()
        .map(|o| make_operand(o, &mut keep))
        .collect();
    if made.iter().any(Option::is_none) {
        // An operand was refused: release those made before (or after) it.
        for t in made.into_iter().flatten() {
            ndx_tensor_release(t);
        }
        return;
    }
    let tensors: Vec<_> = made.into_iter().flatten().collect();
    let list: Vec<ndx_input_t> = tensors
        .iter()
        .map(|&t| ndx_input_t {
            tensor: t,
            batch: std::ptr::null(),
        })
        .collect();
    let mut args = std::ptr::null_mut();
    ok(ndx_args_new(&mut args));
    for (name, v) in &x.args {
        set_arg(args, name, v);
    }
    let ctx = quiet_ctx(mode);
    if x.checks {
        ok(ndx_context_set_checks(
            ctx.0,
            ndx_check_policy_t::NDX_CHECKS_COLLECT as i32,
            0,
            0,
        ));
    }
    let op = CString::new(x.op).unwrap();
    let outcome = match invoke_with(&ctx, &op, &list, args, &invoke_options(mode, &[])) {
        Err(e) => Err(caller_error(e, "ndx_invoke")),
        Ok(f) => {
            let e = ndx_future_wait(f, -1);
            let r = if e.is_null() {
                let mut t = std::ptr::null_mut();
                ok(ndx_future_tensor(f, 0, &mut t));
                Ok(t)
            } else {
                Err(caller_error(e, "the invocation's work"))
            };
            ndx_future_release(f);
            r
        }
    };
    let small = x.inputs.iter().all(|o| !o.broadcast);
    let want = if small { reference(x) } else { Ok(None) };
    // An output of more dimensions than a tensor may have is refused.
    let want = want.and_then(|w| match w {
        Some(w) if w.shape.len() > NDX_MAX_NDIM as usize => Err(()),
        w => Ok(w),
    });
    match (outcome, want) {
        (Err(_), Err(())) | (Err(_), Ok(None)) => {}
        (Err((kind, msg)), Ok(Some(w))) => {
            // Only an output too large to allocate, or to address (its sizes times
            // the itemsize past isize::MAX before a zero one) may fail.
            let numel: i128 = w.shape.iter().map(|&d| d as i128).product();
            let mut bytes = 8i128;
            let unaddressable = w.shape.iter().any(|&d| {
                bytes = bytes.saturating_mul(d.max(1) as i128);
                bytes > isize::MAX as i128
            });
            assert!(
                numel > 1 << 20 || unaddressable,
                "valid arguments failed (kind {kind}): {msg}; expected shape {:?}",
                w.shape
            );
        }
        (Ok(t), want) => {
            assert!(
                want.is_ok(),
                "invalid arguments succeeded with shape {:?} ({} {:?})",
                shape_of(t),
                x.op,
                x.args
            );
            let shape = shape_of(t);
            let mut dtype = 0;
            ok(ndx_tensor_dtype(t, &mut dtype));
            let got = values_f64(t, dtype);
            if let Ok(Some(w)) = want {
                assert_eq!(shape, w.shape, "the output's shape");
                if let Some(from) = w.from
                    && matches!(dtype, 4 | 5 | 6 | 12 | 13)
                {
                    assert_eq!(got.len(), from.len());
                    let d0 = x.inputs[0].dtype;
                    for (k, (g, f)) in got.iter().zip(&from).enumerate() {
                        match f {
                            Ok(i) => assert_eq!(*g, operand_value(d0, *i), "element {k}"),
                            // The fill value converted like cast: floats only.
                            Err(v) if dtype == 13 => {
                                assert!(
                                    g == v || (g.is_nan() && v.is_nan()),
                                    "fill {k}: {g} vs {v}"
                                )
                            }
                            Err(v) if dtype == 12 => {
                                let v = *v as f32 as f64;
                                assert!(
                                    *g == v || (g.is_nan() && v.is_nan()),
                                    "fill {k}: {g} vs {v}"
                                )
                            }
                            Err(_) => {}
                        }
                    }
                }
            }
            ndx_tensor_release(t);
        }
    }
    ndx_args_free(args);
    for t in tensors {
        ndx_tensor_release(t);
    }
    no_internal(ndx_context_evaluate(ctx.0), "ndx_context_evaluate");
    no_internal(
        ndx_context_take_check_errors(ctx.0),
        "ndx_context_take_check_errors",
    );
    drop(ctx);
    drop(keep);
}

proptest! {
    #![proptest_config(config(1000))]

    #[test]
    fn extreme_arguments_err_cleanly_or_match_the_reference(x in extreme()) {
        extreme_once(&x);
    }
}

// ---------------------------------------------------------------------------------
// Reductions of strided views against a reference
// ---------------------------------------------------------------------------------

/// A reduction of a view of caller memory: the view's shape, how each of its axes
/// lies in a compact buffer, and the reduction's arguments. The values are small
/// integers (and NaN here and there in floats), so that every sum and product is
/// exact in `f64` whatever the order of its terms: the reference is exact.
#[derive(Debug, Clone)]
struct ViewReduction {
    op: &'static str,
    dtype: i32,
    /// The view's shape.
    shape: Vec<i64>,
    /// Axis `q` of the view is axis `perm[q]` of the buffer.
    perm: Vec<usize>,
    /// Per view axis: 0 forward, 1 reversed, 2 every other element, 3 broadcast
    /// (stride 0), 4 every other element reversed.
    how: Vec<u8>,
    /// `axes` (sum .. any: an array, or one int when `.1`) or `axis` (argmin,
    /// argmax); None: the default.
    axes: Option<(Vec<i64>, bool)>,
    keepdims: Option<bool>,
    /// Float inputs hold a NaN now and then.
    nan: bool,
    /// Float inputs hold random values (whose sums and products round), which
    /// `sum`, `prod` and `mean` must reduce like a compact copy of the view.
    random: bool,
    seed: u64,
}

const VIEW_REDUCTIONS: &[&str] = &[
    "sum", "prod", "mean", "min", "max", "all", "any", "argmin", "argmax",
];

/// The shape of a view: rank 0 to 4, mostly small extents (some 0); now and then a
/// long axis (past the kernels' runs of 2048 outputs and 8 KiB rows), rarely one
/// of 70000 and more (past the 2^18 element-operations where work is cut into
/// pieces for the pool). At most 40000 elements, or 400000 with such an axis.
fn view_shape() -> impl Strategy<Value = Vec<i64>> {
    let extent = prop_oneof![12 => 1i64..5, 1 => Just(0i64), 2 => 5i64..40];
    let shape = (0usize..=4).prop_flat_map(move |r| prop::collection::vec(extent.clone(), r));
    let len = prop_oneof![10 => 500i64..5000, 1 => 70_000i64..150_000];
    let long = prop::option::weighted(0.3, (any::<prop::sample::Index>(), len));
    (shape, long).prop_map(|(mut shape, long)| {
        let mut cap = 40_000;
        if let Some((i, n)) = long
            && !shape.is_empty()
        {
            let i = i.index(shape.len());
            shape[i] = n;
            cap = if n >= 70_000 { 400_000 } else { cap };
        }
        while shape.iter().map(|&d| d.max(1)).product::<i64>() > cap {
            let big = (0..shape.len()).max_by_key(|&i| shape[i]).unwrap();
            shape[big] /= 2;
        }
        shape
    })
}

fn view_reduction() -> impl Strategy<Value = ViewReduction> {
    (
        prop::sample::select(VIEW_REDUCTIONS),
        prop::sample::select(vec![1, 2, 4, 5, 6, 10, 11, 12, 12, 13, 13]),
        view_shape(),
        any::<bool>(),
        (prop::bool::weighted(0.2), prop::bool::weighted(0.3)),
        any::<u64>(),
    )
        .prop_flat_map(|(op, dtype, shape, keep_default, (nan, random), seed)| {
            let r = shape.len();
            let perm = Just((0..r).collect::<Vec<_>>()).prop_shuffle();
            let how = prop::collection::vec(
                prop_oneof![4 => Just(0u8), 2 => Just(1u8), 1 => Just(2u8), 1 => Just(3u8), 1 => Just(4u8)],
                r,
            );
            let arg = matches!(op, "argmin" | "argmax");
            let ri = r as i64;
            let axes = if arg {
                prop::option::of((0..ri.max(1)).prop_flat_map(move |a| {
                    prop_oneof![Just(a), Just(a - ri)].prop_map(|a| (vec![a], true))
                }))
                .prop_map(move |a| a.filter(|_| ri > 0))
                .boxed()
            } else {
                prop::option::weighted(
                    0.8,
                    (
                        Just((0..ri).collect::<Vec<_>>()).prop_shuffle(),
                        0..=r,
                        prop::collection::vec(any::<bool>(), r),
                        any::<bool>(),
                    )
                        .prop_map(move |(all, k, neg, one)| {
                            let v: Vec<i64> = all[..k]
                                .iter()
                                .map(|&a| if neg[a as usize] { a - ri } else { a })
                                .collect();
                            let one = one && v.len() == 1;
                            (v, one)
                        }),
                )
                .boxed()
            };
            (
                Just(op),
                Just(dtype),
                Just(shape),
                perm,
                how,
                axes,
                (Just(keep_default), any::<bool>(), Just((nan, random)), Just(seed)),
            )
        })
        .prop_map(
            |(op, dtype, shape, perm, how, axes, (keep_default, keepdims, (nan, random), seed))| {
                ViewReduction {
                    op,
                    dtype,
                    shape,
                    perm,
                    how,
                    axes,
                    keepdims: (!keep_default).then_some(keepdims),
                    nan,
                    random,
                    seed,
                }
            },
        )
}

/// Element values of a view reduction's buffer, as exact `f64`s.
fn view_values(c: &ViewReduction, n: usize) -> Vec<f64> {
    let mut state = c.seed | 1;
    let float = matches!(c.dtype, 10..=13);
    let unsigned = c.dtype == 6;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let r = state >> 8;
            if c.nan && float && r.is_multiple_of(50) {
                return f64::NAN;
            }
            if c.dtype == 1 {
                return (r & 1) as f64;
            }
            if c.random && float {
                let v = (r % 1_000_003) as f64 / 997.0 - 500.0;
                return match round_to(c.dtype, v) {
                    Num::Float(v) => v,
                    Num::Int(_) => unreachable!(),
                };
            }
            let v = if c.op == "prod" {
                // Products stay exact: ones of either sign, a few zeros and twos.
                match r % 100 {
                    0..=3 => 0.0,
                    4 => 2.0,
                    x if x % 2 == 0 => 1.0,
                    _ => -1.0,
                }
            } else {
                (r % 7) as f64 - 3.0
            };
            if unsigned { v.abs() } else { v }
        })
        .collect()
}

fn encode(dtype: i32, v: f64) -> Vec<u8> {
    match dtype {
        1 | 6 => vec![v as u8],
        2 => (v as i8).to_ne_bytes().to_vec(),
        4 => (v as i32).to_ne_bytes().to_vec(),
        5 => (v as i64).to_ne_bytes().to_vec(),
        10 => half::f16::from_f64(v).to_bits().to_ne_bytes().to_vec(),
        11 => half::bf16::from_f64(v).to_bits().to_ne_bytes().to_vec(),
        12 => (v as f32).to_ne_bytes().to_vec(),
        13 => v.to_ne_bytes().to_vec(),
        _ => unreachable!("{dtype}"),
    }
}

/// An output element: integers (and bool) as their 64-bit two's complement, floats
/// as `f64`.
#[derive(Debug, Clone, Copy)]
enum Num {
    Int(u64),
    Float(f64),
}

impl PartialEq for Num {
    fn eq(&self, other: &Num) -> bool {
        match (self, other) {
            (Num::Int(a), Num::Int(b)) => a == b,
            (Num::Float(a), Num::Float(b)) => a == b || (a.is_nan() && b.is_nan()),
            _ => false,
        }
    }
}

fn decode_all(t: *const ndx_tensor_t) -> (i32, Vec<Num>) {
    let mut dtype = 0;
    ok(ndx_tensor_dtype(t, &mut dtype));
    let mut nbytes = 0usize;
    ok(ndx_tensor_nbytes(t, &mut nbytes));
    let mut buf = vec![0u8; nbytes];
    ok(ndx_tensor_copy_to(t, buf.as_mut_ptr().cast(), nbytes));
    let item = dl_of(dtype).1;
    let v = buf
        .chunks_exact(item)
        .map(|c| match dtype {
            1 | 6 => Num::Int(c[0] as u64),
            2 => Num::Int(c[0] as i8 as i64 as u64),
            3 => Num::Int(i16::from_ne_bytes(c.try_into().unwrap()) as i64 as u64),
            4 => Num::Int(i32::from_ne_bytes(c.try_into().unwrap()) as i64 as u64),
            5 => Num::Int(i64::from_ne_bytes(c.try_into().unwrap()) as u64),
            7 => Num::Int(u16::from_ne_bytes(c.try_into().unwrap()) as u64),
            8 => Num::Int(u32::from_ne_bytes(c.try_into().unwrap()) as u64),
            9 => Num::Int(u64::from_ne_bytes(c.try_into().unwrap())),
            10 => {
                Num::Float(half::f16::from_bits(u16::from_ne_bytes(c.try_into().unwrap())).to_f64())
            }
            11 => Num::Float(
                half::bf16::from_bits(u16::from_ne_bytes(c.try_into().unwrap())).to_f64(),
            ),
            12 => Num::Float(f32::from_ne_bytes(c.try_into().unwrap()) as f64),
            13 => Num::Float(f64::from_ne_bytes(c.try_into().unwrap())),
            _ => unreachable!("{dtype}"),
        })
        .collect();
    (dtype, v)
}

/// A float result rounded once to `dtype`.
fn round_to(dtype: i32, v: f64) -> Num {
    Num::Float(match dtype {
        10 => half::f16::from_f64(v).to_f64(),
        11 => half::bf16::from_f64(v).to_f64(),
        12 => v as f32 as f64,
        _ => v,
    })
}

/// The reference: output dtype, shape and elements, or `Err` where the reduction
/// fails (over no elements).
fn view_reference(c: &ViewReduction, x: &[f64]) -> Result<(i32, Vec<i64>, Vec<Num>), ()> {
    let r = c.shape.len();
    let arg = matches!(c.op, "argmin" | "argmax");
    let keepdims = c.keepdims.unwrap_or(false);
    let norm = |a: i64| (if a < 0 { a + r as i64 } else { a }) as usize;
    let axes: Vec<usize> = match &c.axes {
        None => (0..r).collect(),
        Some((v, _)) => v.iter().map(|&a| norm(a)).collect(),
    };
    let reduced: Vec<bool> = (0..r).map(|a| axes.contains(&a)).collect();
    // argmin/argmax without an axis reduce the flattened tensor.
    let flat = arg && c.axes.is_none();
    let out_shape: Vec<i64> = if flat {
        if keepdims { vec![1; r] } else { vec![] }
    } else {
        (0..r)
            .filter_map(|a| match (reduced[a], keepdims) {
                (false, _) => Some(c.shape[a]),
                (true, true) => Some(1),
                (true, false) => None,
            })
            .collect()
    };
    let n_out: usize = out_shape.iter().map(|&d| d as usize).product();
    let count: usize = if flat {
        x.len()
    } else {
        axes.iter().map(|&a| c.shape[a] as usize).product()
    };
    let float = matches!(c.dtype, 10..=13);
    let out_dtype = match c.op {
        "sum" | "prod" if float => c.dtype,
        "sum" | "prod" if c.dtype == 6 => 9,
        "sum" | "prod" => 5,
        "mean" if float => c.dtype,
        "mean" => 13,
        "all" | "any" => 1,
        "argmin" | "argmax" => 5,
        _ => c.dtype,
    };
    if arg && count == 0 {
        return Err(());
    }
    if matches!(c.op, "min" | "max") && count == 0 && n_out > 0 {
        return Err(());
    }
    // Each output's elements in logical order, with their index along the reduction.
    let mut groups: Vec<Vec<(f64, i64)>> = vec![Vec::new(); n_out];
    let mut idx = vec![0i64; r];
    for (i, &v) in x.iter().enumerate() {
        let mut o = 0usize;
        let mut k = 0i64;
        for a in 0..r {
            if !reduced[a] && !flat {
                o = o * c.shape[a] as usize + idx[a] as usize;
            } else {
                k = k * c.shape[a] + idx[a];
            }
        }
        groups[o].push((v, if flat { i as i64 } else { k }));
        for a in (0..r).rev() {
            idx[a] += 1;
            if idx[a] < c.shape[a] {
                break;
            }
            idx[a] = 0;
        }
    }
    let out = groups
        .iter()
        .map(|g| {
            let vals = g.iter().map(|p| p.0);
            let int = |v: i64| Num::Int(v as u64);
            match c.op {
                "sum" if float => round_to(out_dtype, vals.sum()),
                "sum" => int(vals.map(|v| v as i64).sum()),
                "prod" if float => round_to(out_dtype, vals.product()),
                "prod" => int(vals.fold(1i64, |a, v| a.wrapping_mul(v as i64))),
                "mean" => round_to(out_dtype, vals.sum::<f64>() / g.len() as f64),
                "all" => int(vals.fold(1, |a, v| a & i64::from(v != 0.0))),
                "any" => int(vals.fold(0, |a, v| a | i64::from(v != 0.0))),
                "min" | "max" => {
                    let max = c.op == "max";
                    let m = vals.fold(None, |a: Option<f64>, v| match a {
                        None => Some(v),
                        Some(a) if a.is_nan() => Some(a),
                        Some(_) if v.is_nan() => Some(v),
                        Some(a) => Some(if max { a.max(v) } else { a.min(v) }),
                    });
                    let m = m.unwrap();
                    if float { Num::Float(m) } else { int(m as i64) }
                }
                _ => {
                    let max = c.op == "argmax";
                    let mut best: Option<(f64, i64)> = None;
                    for &(v, k) in g {
                        best = match best {
                            None => Some((v, k)),
                            Some(b) if b.0.is_nan() => Some(b),
                            Some(_) if v.is_nan() => Some((v, k)),
                            Some(b) if (max && v > b.0) || (!max && v < b.0) => Some((v, k)),
                            b => b,
                        };
                    }
                    int(best.unwrap().1)
                }
            }
        })
        .collect();
    Ok((out_dtype, out_shape, out))
}

/// Where a view's elements lie in a compact buffer.
struct Placement {
    /// The buffer's element count.
    elements: usize,
    /// The view's strides, and its element 0 (in elements from the buffer's start).
    strides: Vec<i64>,
    origin: usize,
    /// The buffer index of each of the view's elements, in logical order.
    logical: Vec<usize>,
}

/// A view of `shape` whose axis `q` is axis `perm[q]` of a compact buffer, laid out
/// by `how[q]`: 0 forward, 1 reversed, 2 every other element, 3 broadcast (stride 0),
/// 4 every other element reversed.
fn place(shape: &[i64], perm: &[usize], how: &[u8]) -> Placement {
    let r = shape.len();
    let mut bshape = vec![0i64; r];
    for q in 0..r {
        bshape[perm[q]] = match how[q] {
            2 | 4 => 2 * shape[q],
            3 => 1,
            _ => shape[q],
        };
    }
    let mut bstrides = vec![0i64; r];
    let mut acc = 1i64;
    for a in (0..r).rev() {
        bstrides[a] = acc;
        acc *= bshape[a].max(1);
    }
    let numel: i64 = shape.iter().product();
    let mut strides = vec![0i64; r];
    let mut origin = 0i64;
    for q in 0..r {
        let s = bstrides[perm[q]];
        strides[q] = match how[q] {
            0 => s,
            1 => -s,
            2 => 2 * s,
            3 => 0,
            _ => -2 * s,
        };
        if strides[q] < 0 && numel > 0 {
            origin += (shape[q] - 1) * -strides[q];
        }
    }
    let mut logical = Vec::with_capacity(numel as usize);
    let mut idx = vec![0i64; r];
    for _ in 0..numel {
        logical.push((origin + (0..r).map(|q| idx[q] * strides[q]).sum::<i64>()) as usize);
        for q in (0..r).rev() {
            idx[q] += 1;
            if idx[q] < shape[q] {
                break;
            }
            idx[q] = 0;
        }
    }
    Placement {
        elements: bshape.iter().product::<i64>() as usize,
        strides,
        origin: if numel > 0 { origin as usize } else { 0 },
        logical,
    }
}

fn view_reduction_once(c: &ViewReduction) {
    let item = dl_of(c.dtype).1;
    let p = place(&c.shape, &c.perm, &c.how);
    let bvals = view_values(c, p.elements);
    let mut bytes: Vec<u8> = bvals.iter().flat_map(|&v| encode(c.dtype, v)).collect();
    bytes.resize(bytes.len().max(item) + 8, 0);
    let x: Vec<f64> = p.logical.iter().map(|&i| bvals[i]).collect();
    let strides = p.strides.clone();
    let t = wrap_host(
        bytes[p.origin * item..].as_mut_ptr().cast(),
        c.dtype,
        &c.shape,
        Some(&strides),
        false,
    );
    let mut args = std::ptr::null_mut();
    ok(ndx_args_new(&mut args));
    let arg = matches!(c.op, "argmin" | "argmax");
    if let Some((v, one)) = &c.axes {
        let name = CString::new(if arg { "axis" } else { "axes" }).unwrap();
        if *one {
            ok(ndx_args_set_int(args, name.as_ptr(), v[0]));
        } else {
            ok(ndx_args_set_int_array(
                args,
                name.as_ptr(),
                v.as_ptr(),
                v.len(),
            ));
        }
    }
    if let Some(k) = c.keepdims {
        ok(ndx_args_set_bool(args, c"keepdims".as_ptr(), k));
    }
    let got = sync_outcome(c.op, &[t], args, "the reduction");
    // Random float sums, products and means round: a compact copy of the view is
    // the reference (bit for bit in float64, whose order the view keeps; within
    // two units of the last place in narrow floats, which may add in memory order).
    let rounds = c.random && matches!(c.dtype, 10..=13) && matches!(c.op, "sum" | "prod" | "mean");
    let want = if rounds {
        let compact: Vec<u8> = p
            .logical
            .iter()
            .flat_map(|&k| bytes[k * item..(k + 1) * item].to_vec())
            .collect();
        let copy = T::copy(&compact, c.dtype, &c.shape);
        ew_outcome(c.op, &[copy.0], args).map_err(|_| ())
    } else {
        view_reference(c, &x)
    };
    let bits = match c.dtype {
        10 => 10,
        11 => 7,
        12 => 23,
        _ => 52,
    };
    let close = |g: Num, w: Num| match (g, w) {
        (Num::Float(g), Num::Float(w)) if rounds && c.dtype != 13 => {
            g == w || (g.is_nan() && w.is_nan()) || (g - w).abs() <= w.abs() * 2f64.powi(1 - bits)
        }
        (Num::Float(g), Num::Float(w)) if rounds => {
            (g.is_nan() && w.is_nan()) || g.to_bits() == w.to_bits()
        }
        (g, w) => g == w,
    };
    match (got, want) {
        (Ok(g), Ok(w)) => {
            assert_eq!((g.0, &g.1), (w.0, &w.1), "output dtype and shape");
            if let Some(k) = (0..g.2.len()).find(|&k| !close(g.2[k], w.2[k])) {
                panic!(
                    "element {k} of {}: {:?}, expected {:?} (strides {strides:?})",
                    g.2.len(),
                    g.2[k],
                    w.2[k]
                );
            }
        }
        (Err((kind, msg)), Ok(w)) => panic!("failed (kind {kind}): {msg}; expected {:?}", w.1),
        (Ok(g), Err(())) => panic!("succeeded with shape {:?}; expected an error", g.1),
        (Err((kind, msg)), Err(())) => {
            assert_eq!(kind, ndx_error_kind_t::NDX_ERROR_VALUE as i32, "{msg}");
        }
    }
    ndx_args_free(args);
    ndx_tensor_release(t);
    drop(bytes);
}

proptest! {
    #![proptest_config(config(300))]

    #[test]
    fn reductions_of_views_match_the_reference(c in view_reduction()) {
        view_reduction_once(&c);
    }
}

// ---------------------------------------------------------------------------------
// Elementwise, shape and joining operators on strided views against their compact
// copies
// ---------------------------------------------------------------------------------

/// An input of an elementwise invocation: a view of caller memory (see [`place`])
/// and the seed of its bytes.
#[derive(Debug, Clone)]
struct EwInput {
    dtype: i32,
    shape: Vec<i64>,
    perm: Vec<usize>,
    how: Vec<u8>,
    seed: u64,
}

#[derive(Debug, Clone)]
struct EwCase {
    op: &'static str,
    inputs: Vec<EwInput>,
    /// `cast`'s dtype.
    dtype: i32,
}

const EW_OPS: &[(&str, usize)] = &[
    ("add", 2),
    ("sub", 2),
    ("mul", 2),
    ("div", 2),
    ("floordiv", 2),
    ("mod", 2),
    ("pow", 2),
    ("minimum", 2),
    ("maximum", 2),
    ("eq", 2),
    ("lt", 2),
    ("ge", 2),
    ("logical_and", 2),
    ("logical_xor", 2),
    ("neg", 1),
    ("abs", 1),
    ("sign", 1),
    ("relu", 1),
    ("floor", 1),
    ("round", 1),
    ("sqrt", 1),
    ("exp", 1),
    ("tanh", 1),
    ("sigmoid", 1),
    ("isnan", 1),
    ("logical_not", 1),
    ("clamp", 1),
    ("cast", 1),
    ("where", 3),
    // Shape and joining operators, which compact a strided input first.
    ("transpose", 1),
    ("flip", 1),
    ("reshape", 1),
    ("squeeze", 1),
    ("expand_dims", 1),
    ("slice", 1),
    ("pad", 1),
    ("concat", 2),
    ("stack", 2),
    ("to_host", 1),
];

/// An input like `(dtype, shape)`: mostly that dtype; that shape, or (unless `first`)
/// a broadcast of it (extents of 1, leading ones dropped); any placement.
fn ew_input(dtype: i32, shape: Vec<i64>, first: bool) -> impl Strategy<Value = EwInput> {
    let n = shape.len();
    let dtype = prop_oneof![3 => Just(dtype), 1 => 1i32..=13];
    let broadcast = (prop::collection::vec(prop::bool::weighted(0.3), n), 0..=n);
    let broadcast = if first {
        Just(None).boxed()
    } else {
        prop::option::weighted(0.3, broadcast).boxed()
    };
    let shape = broadcast.prop_map(move |b| match b {
        None => shape.clone(),
        Some((ones, drop)) => shape
            .iter()
            .zip(&ones)
            .map(|(&d, &one)| if one { 1 } else { d })
            .skip(drop)
            .collect(),
    });
    (dtype, shape, any::<u64>()).prop_flat_map(|(dtype, shape, seed)| {
        let r = shape.len();
        (
            Just(dtype),
            Just(shape),
            Just((0..r).collect::<Vec<_>>()).prop_shuffle(),
            prop::collection::vec(
                prop_oneof![4 => Just(0u8), 2 => Just(1u8), 1 => Just(2u8), 1 => Just(3u8), 1 => Just(4u8)],
                r,
            ),
            Just(seed),
        )
            .prop_map(|(dtype, shape, perm, how, seed)| EwInput {
                dtype,
                shape,
                perm,
                how,
                seed,
            })
    })
}

fn ew_case() -> impl Strategy<Value = EwCase> {
    (
        prop::sample::select(EW_OPS),
        1i32..=13,
        view_shape(),
        1i32..=13,
    )
        .prop_flat_map(|((op, n), dtype, shape, cast_to)| {
            let first = ew_input(dtype, shape.clone(), true);
            let rest = prop::collection::vec(ew_input(dtype, shape, false), n - 1);
            (Just(op), first, rest, Just(cast_to))
        })
        .prop_map(|(op, first, rest, dtype)| EwCase {
            op,
            inputs: std::iter::once(first).chain(rest).collect(),
            dtype,
        })
}

/// The bytes of a view's buffer: small integers mostly, random bits (NaNs, huge
/// values, subnormals in floats) for one element in four; bool 0 or 1.
fn ew_bytes(i: &EwInput, n: usize) -> Vec<u8> {
    let item = dl_of(i.dtype).1;
    let mut state = i.seed | 1;
    let mut out = Vec::with_capacity(n * item + 8);
    for _ in 0..n {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let r = state;
        if i.dtype == 1 {
            out.push((r & 1) as u8);
        } else if r.is_multiple_of(4) {
            out.extend_from_slice(&(r >> 3).to_ne_bytes()[..item]);
        } else {
            let v = ((r >> 8) % 7) as i64 - 3;
            let v = if matches!(i.dtype, 6..=9) { v.abs() } else { v };
            match i.dtype {
                2 | 6 => out.push(v as u8),
                3 | 7 | 10 | 11 => {
                    let b = match i.dtype {
                        10 => half::f16::from_f64(v as f64).to_bits(),
                        11 => half::bf16::from_f64(v as f64).to_bits(),
                        _ => v as u16,
                    };
                    out.extend_from_slice(&b.to_ne_bytes());
                }
                4 | 8 => out.extend_from_slice(&(v as i32).to_ne_bytes()),
                12 => out.extend_from_slice(&(v as f32).to_ne_bytes()),
                13 => out.extend_from_slice(&(v as f64).to_ne_bytes()),
                _ => out.extend_from_slice(&v.to_ne_bytes()),
            }
        }
    }
    out.resize(n.max(1) * item + 8, 0);
    out
}

/// An output's dtype, shape and elements.
type Outcome = (i32, Vec<i64>, Vec<Num>);

/// The outcome of an invocation: its output's dtype, shape and elements, or the
/// error kind.
fn ew_outcome(
    op: &str,
    inputs: &[*mut ndx_tensor_t],
    args: *const ndx_args_t,
) -> Result<Outcome, i32> {
    sync_outcome(op, inputs, args, "the invocation's work").map_err(|e| e.0)
}

/// `op` on `inputs` with `args` in SYNC_CPU on a quiet context: its output's dtype,
/// shape and elements, or the error (kind and message) of the call or of `work`.
fn sync_outcome(
    op: &str,
    inputs: &[*mut ndx_tensor_t],
    args: *const ndx_args_t,
    work: &str,
) -> Result<Outcome, (i32, String)> {
    const SYNC: i32 = ndx_eval_mode_t::NDX_EVAL_SYNC_CPU as i32;
    let ctx = quiet_ctx(SYNC);
    let op = CString::new(op).unwrap();
    let list: Vec<ndx_input_t> = inputs
        .iter()
        .map(|&t| ndx_input_t {
            tensor: t,
            batch: std::ptr::null(),
        })
        .collect();
    match invoke_with(&ctx, &op, &list, args, &invoke_options(SYNC, &[])) {
        Err(e) => Err(caller_error(e, "ndx_invoke")),
        Ok(f) => {
            let e = ndx_future_wait(f, -1);
            let r = if e.is_null() {
                let mut out = std::ptr::null_mut();
                ok(ndx_future_tensor(f, 0, &mut out));
                let (dtype, v) = decode_all(out);
                let shape = shape_of(out);
                ndx_tensor_release(out);
                Ok((dtype, shape, v))
            } else {
                Err(caller_error(e, work))
            };
            ndx_future_release(f);
            r
        }
    }
}

fn ew_once(c: &EwCase) {
    let mut keep = Vec::new();
    let mut views = Vec::new();
    let mut copies = Vec::new();
    for i in &c.inputs {
        let item = dl_of(i.dtype).1;
        let p = place(&i.shape, &i.perm, &i.how);
        let mut bytes = ew_bytes(i, p.elements);
        let compact: Vec<u8> = p
            .logical
            .iter()
            .flat_map(|&k| bytes[k * item..(k + 1) * item].to_vec())
            .collect();
        views.push(wrap_host(
            bytes[p.origin * item..].as_mut_ptr().cast(),
            i.dtype,
            &i.shape,
            Some(&p.strides),
            false,
        ));
        copies.push(T::copy(&compact, i.dtype, &i.shape));
        keep.push(bytes);
    }
    let mut args = std::ptr::null_mut();
    ok(ndx_args_new(&mut args));
    match c.op {
        "clamp" => {
            ok(ndx_args_set_float(args, c"lo".as_ptr(), -1.5));
            ok(ndx_args_set_float(args, c"hi".as_ptr(), 2.0));
        }
        "cast" => ok(ndx_args_set_dtype(args, c"dtype".as_ptr(), c.dtype)),
        "reshape" => ok(ndx_args_set_int_array(
            args,
            c"shape".as_ptr(),
            [-1].as_ptr(),
            1,
        )),
        "expand_dims" => ok(ndx_args_set_int(args, c"axis".as_ptr(), -1)),
        "slice" => {
            // Every other element of axis 0 from the second on.
            ok(ndx_args_set_int_array(
                args,
                c"start".as_ptr(),
                [1].as_ptr(),
                1,
            ));
            ok(ndx_args_set_int_array(
                args,
                c"end".as_ptr(),
                [1 << 40].as_ptr(),
                1,
            ));
            ok(ndx_args_set_int_array(
                args,
                c"step".as_ptr(),
                [2].as_ptr(),
                1,
            ));
        }
        "pad" => {
            let widths: Vec<i64> = (0..2 * c.inputs[0].shape.len() as i64)
                .map(|i| i % 3)
                .collect();
            ok(ndx_args_set_int_array(
                args,
                c"widths".as_ptr(),
                widths.as_ptr(),
                widths.len(),
            ));
            ok(ndx_args_set_float(args, c"value".as_ptr(), 7.0));
        }
        _ => {}
    }
    let got = ew_outcome(c.op, &views, args);
    let copy_list: Vec<*mut ndx_tensor_t> = copies.iter().map(|t| t.0).collect();
    let want = ew_outcome(c.op, &copy_list, args);
    match (got, want) {
        (Ok(g), Ok(w)) => {
            assert_eq!((g.0, &g.1), (w.0, &w.1), "output dtype and shape");
            // Bit for bit, but any NaN for a NaN.
            let same = |a: Num, b: Num| match (a, b) {
                (Num::Float(a), Num::Float(b)) => {
                    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
                }
                (a, b) => a == b,
            };
            if let Some(k) = (0..g.2.len()).find(|&k| !same(g.2[k], w.2[k])) {
                panic!(
                    "element {k} of {}: {:?} from the views, {:?} from compact copies",
                    g.2.len(),
                    g.2[k],
                    w.2[k]
                );
            }
        }
        (g, w) => assert_eq!(
            g.map(|g| g.1),
            w.map(|w| w.1),
            "the views and their compact copies disagree"
        ),
    }
    ndx_args_free(args);
    for t in views {
        ndx_tensor_release(t);
    }
    drop(copies);
    drop(keep);
}

proptest! {
    #![proptest_config(config(300))]

    #[test]
    fn elementwise_views_match_their_compact_copies(c in ew_case()) {
        ew_once(&c);
    }
}
