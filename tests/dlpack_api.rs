//! DLPack import/export and host memory through the C API, called from Rust: deleter
//! call counts on success and on every failure path, one test per invalid field,
//! strided reads, read-only, round trips and stacking.

mod common;

use std::ffi::{CStr, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use dlpark::DlpackFlags;
use dlpark::ffi::{
    DLDataType, DLDataTypeCode, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned,
};
use ndx::ffi::ndx_error_kind_t::*;
use ndx::ffi::*;

fn import_v(m: *mut DLManagedTensorVersioned) -> Result<*mut ndx_tensor_t, (i32, String)> {
    let mut t = std::ptr::null_mut();
    match take_error(ndx_tensor_from_dlpack_versioned(
        m,
        std::ptr::null(),
        &mut t,
    )) {
        None => Ok(t),
        Some(e) => {
            assert!(t.is_null(), "out-param must stay NULL on error");
            Err(e)
        }
    }
}

fn import_l(m: *mut DLManagedTensor) -> Result<*mut ndx_tensor_t, (i32, String)> {
    let mut t = std::ptr::null_mut();
    match take_error(ndx_tensor_from_dlpack(m, std::ptr::null(), &mut t)) {
        None => Ok(t),
        Some(e) => Err(e),
    }
}

fn base() -> Spec {
    Spec::f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])
}

#[test]
fn import_is_zero_copy_and_the_deleter_runs_once_at_the_last_release() {
    for legacy in [false, true] {
        let spec = base();
        let (t, count) = if legacy {
            let (m, c) = spec.legacy();
            (import_l(m).expect("import"), c)
        } else {
            let (m, c) = spec.versioned();
            (import_v(m).expect("import"), c)
        };
        assert_eq!(values_f32(t), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(shape_of(t), [2, 3]);
        assert_eq!(strides_of(t), [3, 1]);
        ok(ndx_tensor_retain(t));
        ndx_tensor_release(t);
        assert_eq!(calls(&count), 0);
        ndx_tensor_release(t);
        assert_eq!(calls(&count), 1);
    }
}

/// Each invalid field: kind, message fragment, and the caller still owns the tensor.
#[test]
fn every_invalid_field_fails_naming_it_and_leaves_the_tensor_with_the_caller() {
    type Mutate = fn(&mut Spec);
    let cases: &[(&str, Mutate, i32, &str)] = &[
        (
            "ndim -1",
            |s| s.ndim = Some(-1),
            NDX_ERROR_VALUE as i32,
            "ndim is -1, expected 0 to 64",
        ),
        (
            "ndim 1000",
            |s| s.ndim = Some(1000),
            NDX_ERROR_VALUE as i32,
            "ndim is 1000",
        ),
        (
            "null shape",
            |s| s.null_shape = true,
            NDX_ERROR_VALUE as i32,
            "shape is NULL but ndim is 2",
        ),
        (
            "negative dim",
            |s| s.shape[1] = -3,
            NDX_ERROR_VALUE as i32,
            "shape[1] is -3",
        ),
        (
            "complex dtype",
            |s| {
                s.dtype = DLDataType {
                    code: DLDataTypeCode::COMPLEX,
                    bits: 64,
                    lanes: 1,
                }
            },
            NDX_ERROR_TYPE as i32,
            "dtype code 5 (complex), bits 64, lanes 1 is not supported",
        ),
        (
            "4 lanes",
            |s| s.dtype.lanes = 4,
            NDX_ERROR_TYPE as i32,
            "lanes 4",
        ),
        (
            "odd bits",
            |s| s.dtype.bits = 24,
            NDX_ERROR_TYPE as i32,
            "bits 24",
        ),
        (
            "OpenCL device",
            |s| s.device.device_type = DLDeviceType::OPENCL,
            NDX_ERROR_VALUE as i32,
            "device type 4 (kDLOpenCL) is not supported",
        ),
        (
            "negative device id",
            |s| s.device.device_id = -1,
            NDX_ERROR_VALUE as i32,
            "device id is -1",
        ),
        (
            "NULL data",
            |s| s.null_data = true,
            NDX_ERROR_VALUE as i32,
            "data is NULL but the tensor has 6 elements",
        ),
        (
            "stride overflow",
            |s| s.strides = Some(vec![i64::MAX / 2, 1]),
            NDX_ERROR_VALUE as i32,
            "overflows the address space",
        ),
        (
            "size overflow",
            |s| s.shape = vec![i64::MAX, 4],
            NDX_ERROR_VALUE as i32,
            "overflows the address space",
        ),
        (
            // A broadcast view spans a few bytes, but its elements do not fit compacted.
            "zero-stride size overflow",
            |s| {
                s.shape = vec![1 << 61, 3];
                s.strides = Some(vec![0, 1]);
            },
            NDX_ERROR_VALUE as i32,
            "shape [2305843009213693952, 3] of itemsize 4 is too large to address: its \
             compact size (6917529027641081856 elements x 4 bytes) overflows",
        ),
    ];
    for (name, mutate, kind, fragment) in cases {
        let mut spec = base();
        mutate(&mut spec);
        for legacy in [false, true] {
            let (result, count, drop_it): (_, Count, Box<dyn FnOnce()>) = if legacy {
                let (m, c) = spec.legacy();
                (import_l(m), c, Box::new(move || drop_legacy(m)))
            } else {
                let (m, c) = spec.versioned();
                (import_v(m), c, Box::new(move || drop_versioned(m)))
            };
            let (k, msg) = result.expect_err(name);
            assert_eq!(k, *kind, "{name}: {msg}");
            assert!(msg.contains(fragment), "{name}: {msg:?} lacks {fragment:?}");
            assert_eq!(calls(&count), 0, "{name}: the caller still owns the tensor");
            drop_it();
            assert_eq!(calls(&count), 1);
        }
    }
}

/// Each DLPack device type and type code ndx does not take is named in the refusal by
/// its `kDL*` name or kind (an unassigned one as "unknown"), and the caller keeps the
/// tensor.
#[test]
fn unsupported_device_types_and_dtype_codes_are_refused_by_name() {
    let devices = [
        (4, "kDLOpenCL"),
        (5, "unknown"),
        (7, "kDLVulkan"),
        (8, "kDLMetal"),
        (9, "kDLVPI"),
        (10, "kDLROCM"),
        (11, "kDLROCMHost"),
        (12, "kDLExtDev"),
        (14, "kDLOneAPI"),
        (15, "kDLWebGPU"),
        (16, "kDLHexagon"),
        (17, "kDLMAIA"),
        (18, "kDLTrn"),
        (99, "unknown"),
    ];
    let codes = [
        (3, "opaque handle"),
        (7, "float8"),
        (14, "float8"),
        (15, "float6"),
        (16, "float6"),
        (17, "float4"),
        (200, "unknown"),
    ];
    let refusals = devices
        .iter()
        .map(|&(t, name)| {
            let mut spec = base();
            spec.device.device_type = DLDeviceType(t);
            (
                spec,
                NDX_ERROR_VALUE as i32,
                format!("device type {t} ({name}) is not supported"),
            )
        })
        .chain(codes.iter().map(|&(c, name)| {
            let mut spec = base();
            spec.dtype = DLDataType {
                code: DLDataTypeCode(c),
                bits: 8,
                lanes: 1,
            };
            (
                spec,
                NDX_ERROR_TYPE as i32,
                format!("dtype code {c} ({name}), bits 8, lanes 1 is not supported"),
            )
        }));
    for (spec, kind, says) in refusals {
        let (m, count) = spec.versioned();
        let (k, msg) = import_v(m).expect_err(&says);
        assert_eq!(
            (k, msg.contains(&says)),
            (kind, true),
            "{msg:?} lacks {says:?}"
        );
        assert_eq!(calls(&count), 0, "{says}: the caller still owns the tensor");
        drop_versioned(m);
        assert_eq!(calls(&count), 1);
    }
}

/// A shape or strides array at an odd address (a broken producer) is refused, naming
/// it, instead of being read (`slice::from_raw_parts` aborts a debug build there);
/// the caller still owns the tensor.
#[test]
fn misaligned_shape_and_strides_arrays_are_refused() {
    // [2, 3] and [3, 1] as native-endian bytes, one byte into an 8-aligned buffer.
    let mut words = [0u64; 3];
    for (field, values) in [("shape", [2i64, 3]), ("strides", [3i64, 1])] {
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut words);
        bytes[1..9].copy_from_slice(&values[0].to_ne_bytes());
        bytes[9..17].copy_from_slice(&values[1].to_ne_bytes());
        let odd = bytes[1..].as_mut_ptr().cast::<i64>();
        let (m, count) = base().versioned();
        // SAFETY: `m` is a live producer tensor of this test; only the pointer changes.
        let kept = unsafe {
            let dl = &mut (*m).dl_tensor;
            if field == "shape" {
                std::mem::replace(&mut dl.shape, odd)
            } else {
                std::mem::replace(&mut dl.strides, odd)
            }
        };
        let (kind, msg) = import_v(m).expect_err(field);
        assert_eq!(kind, NDX_ERROR_VALUE as i32, "{msg}");
        assert!(msg.contains(&format!("{field} (0x")), "{msg}");
        assert!(msg.ends_with("is not aligned to 8 bytes"), "{msg}");
        assert_eq!(calls(&count), 0, "the caller still owns the tensor");
        // SAFETY: as above, putting the producer's own pointer back.
        unsafe {
            let dl = &mut (*m).dl_tensor;
            if field == "shape" {
                dl.shape = kept;
            } else {
                dl.strides = kept;
            }
        }
        drop_versioned(m);
        assert_eq!(calls(&count), 1);
    }
}

#[test]
fn null_tensor_and_null_out_are_value_errors() {
    expect_err(
        ndx_tensor_from_dlpack_versioned(
            std::ptr::null_mut(),
            std::ptr::null(),
            &mut std::ptr::null_mut(),
        ),
        NDX_ERROR_VALUE,
        "argument 'tensor' is NULL",
    );
    let (m, count) = base().versioned();
    expect_err(
        ndx_tensor_from_dlpack_versioned(m, std::ptr::null(), std::ptr::null_mut()),
        NDX_ERROR_VALUE,
        "argument 'out' is NULL",
    );
    assert_eq!(calls(&count), 0);
    drop_versioned(m);
}

#[test]
fn unknown_major_version_is_released_as_the_spec_requires() {
    let mut spec = base();
    spec.major = 2;
    let (m, count) = spec.versioned();
    let (k, msg) = import_v(m).expect_err("major 2");
    assert_eq!(k, NDX_ERROR_VALUE as i32);
    assert!(
        msg.contains("DLPack major version 2 is not supported"),
        "{msg}"
    );
    assert!(msg.contains("deleter has been called"), "{msg}");
    assert_eq!(calls(&count), 1);
}

#[test]
fn unknown_versions_are_released_even_when_other_arguments_are_wrong() {
    let mut spec = base();
    spec.major = 2;
    let (m, count) = spec.versioned();
    expect_err(
        ndx_tensor_from_dlpack_versioned(m, std::ptr::null(), std::ptr::null_mut()),
        NDX_ERROR_VALUE,
        "major version 2",
    );
    assert_eq!(calls(&count), 1);
    let (ptrs, counts) = batch_v(&[base(), spec.clone()]);
    let bad_opts = ndx_import_options_t {
        struct_size: 1,
        layout: std::ptr::null(),
        read_only: false,
        stream: std::ptr::null_mut(),
    };
    let mut b = std::ptr::null_mut();
    expect_err(
        ndx_batch_from_dlpack_versioned(ptrs.as_ptr(), 2, &bad_opts, &mut b),
        NDX_ERROR_VALUE,
        "tensors[1] (major 2)",
    );
    assert_eq!(counts.iter().map(calls).collect::<Vec<_>>(), [0, 1]);
    drop_versioned(ptrs[0]);
}

#[test]
fn layout_option_is_validated_and_kept() {
    let opts = ndx_import_options_t {
        struct_size: std::mem::size_of::<ndx_import_options_t>(),
        layout: c"HW".as_ptr(),
        read_only: false,
        stream: std::ptr::null_mut(),
    };
    let (m, count) = base().versioned();
    let mut t = std::ptr::null_mut();
    ok(ndx_tensor_from_dlpack_versioned(m, &opts, &mut t));
    let mut layout = std::ptr::null();
    ok(ndx_tensor_layout(t, &mut layout));
    // SAFETY: borrowed from the live tensor.
    assert_eq!(unsafe { CStr::from_ptr(layout) }, c"HW");
    ndx_tensor_release(t);
    assert_eq!(calls(&count), 1);

    let bad = ndx_import_options_t {
        layout: c"HWC".as_ptr(),
        ..opts
    };
    let (m, count) = base().versioned();
    expect_err(
        ndx_tensor_from_dlpack_versioned(m, &bad, &mut t),
        NDX_ERROR_VALUE,
        "layout \"HWC\" has 3 letters but the tensor has ndim 2",
    );
    assert_eq!(calls(&count), 0);
    drop_versioned(m);

    let small = ndx_import_options_t {
        struct_size: 4,
        ..opts
    };
    let (m, _count) = base().versioned();
    expect_err(
        ndx_tensor_from_dlpack_versioned(m, &small, &mut t),
        NDX_ERROR_VALUE,
        "opts->struct_size is 4",
    );
    drop_versioned(m);
}

#[test]
fn strided_views_with_byte_offset_and_negative_strides_read_correctly() {
    // A 3x4 buffer [0..12); view its transpose 4x3 starting one row in (byte_offset).
    let values: Vec<f32> = (0..16).map(|v| v as f32).collect();
    let mut spec = Spec::f32s(&values, &[3, 3]);
    spec.strides = Some(vec![1, 4]);
    spec.byte_offset = 4 * 4;
    let (m, count) = spec.versioned();
    let t = import_v(m).expect("strided");
    assert_eq!(
        values_f32(t),
        [4.0, 8.0, 12.0, 5.0, 9.0, 13.0, 6.0, 10.0, 14.0]
    );
    ndx_tensor_release(t);
    assert_eq!(calls(&count), 1);

    // A flipped row: element 0 is the last of the buffer, stride -1.
    let mut spec = Spec::f32s(&[1.0, 2.0, 3.0, 4.0], &[4]);
    spec.strides = Some(vec![-1]);
    spec.byte_offset = 12;
    let (m, _) = spec.versioned();
    let t = import_v(m).expect("flipped");
    assert_eq!(values_f32(t), [4.0, 3.0, 2.0, 1.0]);
    ndx_tensor_release(t);

    // A broadcast row (stride 0).
    let mut spec = Spec::f32s(&[7.0, 8.0], &[3, 2]);
    spec.strides = Some(vec![0, 1]);
    let (m, _) = spec.versioned();
    let t = import_v(m).expect("broadcast");
    assert_eq!(values_f32(t), [7.0, 8.0, 7.0, 8.0, 7.0, 8.0]);
    let mut small = [0f32; 5];
    expect_err(
        ndx_tensor_copy_to(t, small.as_mut_ptr().cast(), 20),
        NDX_ERROR_VALUE,
        "buffer too small: the tensor has 24 bytes",
    );
    ndx_tensor_release(t);
}

/// `t + t` in SYNC_CPU: its f32 values.
fn doubled(t: *const ndx_tensor_t) -> Vec<f32> {
    sync_values(c"add", &[t, t])
}

/// Operator `op` (no arguments) of `inputs` in SYNC_CPU: its f32 values.
fn sync_values(op: &CStr, inputs: &[*const ndx_tensor_t]) -> Vec<f32> {
    let ctx = Ctx::new(ndx_eval_mode_t::NDX_EVAL_SYNC_CPU as i32);
    let inputs: Vec<ndx_input_t> = inputs
        .iter()
        .map(|&t| ndx_input_t {
            tensor: t,
            batch: std::ptr::null(),
        })
        .collect();
    let mut f = std::ptr::null_mut();
    ok(ndx_invoke(
        ctx.0,
        op.as_ptr(),
        inputs.as_ptr(),
        inputs.len(),
        std::ptr::null(),
        std::ptr::null(),
        &mut f,
    ));
    ok(ndx_future_wait(f, -1));
    let mut out = std::ptr::null_mut();
    ok(ndx_future_tensor(f, 0, &mut out));
    let v = values_f32(out);
    ndx_tensor_release(out);
    ndx_future_release(f);
    v
}

#[test]
fn any_stride_of_an_extent_of_one_is_accepted_and_never_stepped() {
    // Found by tests/fuzz_api.rs: a dimension of extent 1 never moves an offset, so
    // DLPack allows any stride there; scaling or adding an extreme one overflowed
    // (a panic, NDX_ERROR_INTERNAL, in builds with overflow checks).
    for huge in [i64::MIN, i64::MAX, i64::MAX / 4] {
        // Innermost extent 1: reading the copy out.
        let mut spec = Spec::f32s(&[1.0, 2.0, 3.0], &[2, 1]);
        spec.strides = Some(vec![2, huge]);
        let (m, count) = spec.versioned();
        let t = import_v(m).expect("an extent of 1 takes any stride");
        assert_eq!(strides_of(t), [2, huge], "the producer's strides are kept");
        assert_eq!(values_f32(t), [1.0, 3.0]);
        ndx_tensor_release(t);
        assert_eq!(calls(&count), 1);

        // Outer extent 1 between two others: an operator's strided walk.
        let mut spec = Spec::f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 1, 2]);
        spec.strides = Some(vec![4, huge, 1]);
        let (m, count) = spec.versioned();
        let t = import_v(m).expect("an extent of 1 takes any stride");
        assert_eq!(doubled(t), [2.0, 4.0, 10.0, 12.0]);
        ndx_tensor_release(t);
        assert_eq!(calls(&count), 1);
    }
}

#[test]
fn flip_leaves_the_stride_of_an_extent_of_one_alone() {
    // Found by tests/fuzz_api.rs (flip of an int64 [1] with stride i64::MIN): flip
    // negated the stride of every flipped axis, which overflows for i64::MIN (a panic,
    // NDX_ERROR_INTERNAL, in builds with overflow checks); an extent of 0 or 1 needs
    // no flipping.
    let mut spec = Spec::f32s(&[1.0, 2.0], &[1]);
    spec.strides = Some(vec![i64::MIN]);
    let (m, count) = spec.versioned();
    let t = import_v(m).expect("an extent of 1 takes any stride");
    assert_eq!(sync_values(c"flip", &[t]), [1.0]);
    ndx_tensor_release(t);
    assert_eq!(calls(&count), 1);

    let mut spec = Spec::f32s(&[1.0, 2.0, 3.0, 4.0, 5.0], &[2, 1]);
    spec.strides = Some(vec![4, i64::MIN]);
    let (m, count) = spec.versioned();
    let t = import_v(m).expect("an extent of 1 takes any stride");
    assert_eq!(sync_values(c"flip", &[t]), [5.0, 1.0]);
    ndx_tensor_release(t);
    assert_eq!(calls(&count), 1);

    // The image flips, on a CHW image one pixel wide (found the same way).
    let mut spec = Spec::f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0], &[1, 2, 1]);
    spec.strides = Some(vec![6, 4, i64::MIN]);
    let (m, count) = spec.versioned();
    let layout = c"CHW";
    let opts = ndx_import_options_t {
        struct_size: std::mem::size_of::<ndx_import_options_t>(),
        layout: layout.as_ptr(),
        read_only: false,
        stream: std::ptr::null_mut(),
    };
    let mut t = std::ptr::null_mut();
    ok(ndx_tensor_from_dlpack_versioned(m, &opts, &mut t));
    assert_eq!(sync_values(c"flip_horizontal", &[t]), [1.0, 5.0]);
    assert_eq!(sync_values(c"flip_vertical", &[t]), [5.0, 1.0]);
    ndx_tensor_release(t);
    assert_eq!(calls(&count), 1);
}

/// Runs `op` with `args` on `t` in SYNC_CPU: the output's shape and layout, or the
/// error.
fn op_shape(
    op: &CStr,
    t: *const ndx_tensor_t,
    args: &Args,
) -> Result<(Vec<i64>, String), (i32, String)> {
    let ctx = Ctx::new(ndx_eval_mode_t::NDX_EVAL_SYNC_CPU as i32);
    let inputs = [ndx_input_t {
        tensor: t,
        batch: std::ptr::null(),
    }];
    let f = invoke_with(&ctx, op, &inputs, args.0, &invoke_options(0, &[]))
        .map_err(|e| take_error(e).expect("an error"))?;
    let waited = take_error(ndx_future_wait(f, -1));
    let result = match waited {
        Some(e) => Err(e),
        None => {
            let mut out = std::ptr::null_mut();
            ok(ndx_future_tensor(f, 0, &mut out));
            let mut layout = std::ptr::null();
            ok(ndx_tensor_layout(out, &mut layout));
            let r = (shape_of(out), cstr(layout));
            ndx_tensor_release(out);
            Ok(r)
        }
    };
    ndx_future_release(f);
    result
}

#[test]
fn empty_imports_with_extreme_strides_go_through_flips_slices_crops_and_reductions() {
    // An empty tensor reads no element, so DLPack lets its strides be anything and the
    // import keeps them. Flips, slices, crops and the in-memory-order reductions scaled
    // or negated them: a panic (NDX_ERROR_INTERNAL, "attempt to multiply with
    // overflow") in builds with overflow checks.
    type Case = (&'static CStr, fn() -> Args, [i64; 3], &'static [i64]);
    let cases: &[Case] = &[
        (
            c"flip",
            || Args::new().ints(c"axes", &[1]),
            [0, 5, 3],
            &[0, 5, 3],
        ),
        (c"flip", Args::new, [5, 0, 3], &[5, 0, 3]),
        (
            c"slice",
            || {
                Args::new()
                    .ints(c"start", &[4])
                    .ints(c"end", &[0])
                    .ints(c"step", &[-2])
                    .ints(c"axes", &[1])
            },
            [0, 5, 3],
            &[0, 2, 3],
        ),
        (c"flip_horizontal", Args::new, [0, 5, 3], &[0, 5, 3]),
        (c"flip_vertical", Args::new, [5, 0, 3], &[5, 0, 3]),
        (
            c"crop",
            || {
                Args::new()
                    .int(c"x", 1)
                    .int(c"y", 1)
                    .int(c"w", 2)
                    .int(c"h", 3)
            },
            [5, 5, 0],
            &[3, 2, 0],
        ),
        (
            c"max",
            || Args::new().ints(c"axes", &[1]),
            [0, 5, 3],
            &[0, 3],
        ),
        (
            c"all",
            || Args::new().ints(c"axes", &[0]),
            [5, 0, 3],
            &[0, 3],
        ),
    ];
    for huge in [i64::MIN, i64::MAX, i64::MAX / 3] {
        for (op, args, shape, expect) in cases {
            let mut spec = Spec::f32s(&[], shape);
            spec.strides = Some(vec![huge; 3]);
            let (m, count) = spec.versioned();
            let opts = import_options(Some(c"HWC"), false);
            let mut t = std::ptr::null_mut();
            ok(ndx_tensor_from_dlpack_versioned(m, &opts, &mut t));
            assert_eq!(strides_of(t), [huge; 3], "the producer's strides are kept");
            let what = format!("{op:?} of {shape:?} with strides {huge}");
            let (got, layout) =
                op_shape(op, t, &args()).unwrap_or_else(|e| panic!("{what}: {e:?}"));
            assert_eq!(got, *expect, "{what}");
            let image = op.to_bytes().starts_with(b"flip_") || op == &c"crop";
            assert_eq!(layout, if image { "HWC" } else { "" }, "{what}");
            ndx_tensor_release(t);
            assert_eq!(calls(&count), 1, "{what}");
        }
    }
}

#[test]
fn read_only_is_honoured_on_export_and_legacy_export_refuses_it() {
    let mut spec = base();
    spec.flags = DlpackFlags::READ_ONLY | DlpackFlags::IS_COPIED;
    let (m, count) = spec.versioned();
    let t = import_v(m).expect("import");
    let mut ro = false;
    ok(ndx_tensor_is_read_only(t, &mut ro));
    assert!(ro);
    let mut out = std::ptr::null_mut();
    ok(ndx_tensor_to_dlpack_versioned(t, &mut out));
    // SAFETY: a live export.
    let flags = unsafe { (*out).flags };
    assert!(flags.contains(DlpackFlags::READ_ONLY | DlpackFlags::IS_COPIED));
    let mut legacy = std::ptr::null_mut();
    expect_err(
        ndx_tensor_to_dlpack(t, &mut legacy),
        NDX_ERROR_VALUE,
        "read-only",
    );
    assert!(legacy.is_null());
    ndx_tensor_release(t);
    assert_eq!(calls(&count), 0, "the export keeps the storage alive");
    drop_versioned(out);
    assert_eq!(calls(&count), 1);
}

#[test]
fn export_then_reimport_keeps_values_dtype_shape_strides_and_layout() {
    let values: Vec<f32> = (0..12).map(|v| v as f32 * 0.5).collect();
    let mut spec = Spec::f32s(&values, &[3, 4]);
    spec.strides = Some(vec![1, 3]);
    let (m, count) = spec.versioned();
    let opts = ndx_import_options_t {
        struct_size: std::mem::size_of::<ndx_import_options_t>(),
        layout: c"HW".as_ptr(),
        read_only: false,
        stream: std::ptr::null_mut(),
    };
    let mut t = std::ptr::null_mut();
    ok(ndx_tensor_from_dlpack_versioned(m, &opts, &mut t));
    let before = values_f32(t);
    for legacy in [false, true] {
        let mut back = std::ptr::null_mut();
        if legacy {
            let mut out = std::ptr::null_mut();
            ok(ndx_tensor_to_dlpack(t, &mut out));
            ok(ndx_tensor_from_dlpack(out, &opts, &mut back));
        } else {
            let mut out = std::ptr::null_mut();
            ok(ndx_tensor_to_dlpack_versioned(t, &mut out));
            ok(ndx_tensor_from_dlpack_versioned(out, &opts, &mut back));
        }
        assert_eq!(values_f32(back), before);
        assert_eq!(shape_of(back), [3, 4]);
        assert_eq!(strides_of(back), [1, 3]);
        let mut dtype = 0;
        ok(ndx_tensor_dtype(back, &mut dtype));
        assert_eq!(dtype, ndx_dtype_t::NDX_DTYPE_FLOAT32 as i32);
        let mut layout = std::ptr::null();
        ok(ndx_tensor_layout(back, &mut layout));
        // SAFETY: borrowed from the live tensor.
        assert_eq!(unsafe { CStr::from_ptr(layout) }, c"HW");
        ndx_tensor_release(back);
    }
    assert_eq!(calls(&count), 0);
    ndx_tensor_release(t);
    assert_eq!(calls(&count), 1);
}

fn batch_v(specs: &[Spec]) -> (Vec<*mut DLManagedTensorVersioned>, Vec<Count>) {
    specs.iter().map(Spec::versioned).unzip()
}

/// The same tensor listed twice would get its deleter called twice: refused before any
/// deleter runs (unknown major versions included), naming both indices.
#[test]
fn bulk_import_refuses_the_same_tensor_twice() {
    for variant in ["versioned", "versioned, major 2", "legacy"] {
        let specs = [base(), base(), base()];
        let mut b = std::ptr::null_mut();
        let (e, counts, drop_all): (_, Vec<Count>, Box<dyn FnOnce()>) = if variant == "legacy" {
            let (ptrs, counts): (Vec<_>, Vec<_>) = specs.iter().map(Spec::legacy).unzip();
            let dup = [ptrs[0], ptrs[1], ptrs[2], ptrs[1]];
            let e = ndx_batch_from_dlpack(dup.as_ptr(), 4, std::ptr::null(), &mut b);
            (
                e,
                counts,
                Box::new(move || ptrs.into_iter().for_each(drop_legacy)),
            )
        } else {
            let (ptrs, counts) = batch_v(&specs);
            if variant == "versioned, major 2" {
                let p = ptrs[1];
                // SAFETY: a live tensor the test owns.
                unsafe { (*p).version.major = 2 };
            }
            let dup = [ptrs[0], ptrs[1], ptrs[2], ptrs[1]];
            let e = ndx_batch_from_dlpack_versioned(dup.as_ptr(), 4, std::ptr::null(), &mut b);
            (
                e,
                counts,
                Box::new(move || ptrs.into_iter().for_each(drop_versioned)),
            )
        };
        expect_err(
            e,
            NDX_ERROR_VALUE,
            "tensors[1] and tensors[3] are the same tensor",
        );
        assert!(b.is_null(), "{variant}");
        assert_eq!(
            counts.iter().map(calls).collect::<Vec<_>>(),
            [0, 0, 0],
            "{variant}: no deleter ran"
        );
        drop_all();
        assert_eq!(
            counts.iter().map(calls).collect::<Vec<_>>(),
            [1, 1, 1],
            "{variant}"
        );
    }
}

#[test]
fn bulk_import_takes_all_on_success_and_none_on_failure() {
    let specs = vec![
        Spec::f32s(&[1.0; 6], &[2, 3]),
        Spec::f32s(&[2.0; 4], &[2, 2]),
        Spec::f32s(&[3.0; 6], &[3, 2]),
    ];
    let (ptrs, counts) = batch_v(&specs);
    let b = import_batch(&ptrs, std::ptr::null());
    let (mut n, mut uniform) = (0usize, true);
    ok(ndx_batch_size(b, &mut n));
    ok(ndx_batch_is_uniform(b, &mut uniform));
    assert_eq!((n, uniform), (3, false));
    let mut s = std::ptr::null_mut();
    ok(ndx_batch_sample(b, 2, &mut s));
    assert_eq!(shape_of(s), [3, 2]);
    assert_eq!(values_f32(s), [3.0; 6]);
    let mut none = std::ptr::null_mut();
    expect_err(
        ndx_batch_sample(b, 3, &mut none),
        NDX_ERROR_INDEX,
        "sample index 3 is out of range for a batch of 3",
    );
    let mut stacked = std::ptr::null_mut();
    expect_err(
        ndx_batch_to_tensor(b, &mut stacked),
        NDX_ERROR_VALUE,
        "sample 1 has shape [2, 2], sample 0 has shape [2, 3]",
    );
    ndx_batch_release(b);
    assert_eq!(
        counts.iter().map(calls).collect::<Vec<_>>(),
        [1, 1, 0],
        "sample 2 is still referenced"
    );
    ndx_tensor_release(s);
    assert_eq!(counts.iter().map(calls).collect::<Vec<_>>(), [1, 1, 1]);
}

#[test]
fn bulk_import_disagreements_name_the_sample_expected_and_actual() {
    type Mutate = fn(&mut Spec);
    let cases: &[(Mutate, &str)] = &[
        (
            |s| s.dtype.bits = 64,
            "tensors[2]: dtype is float64, expected float32 like tensors[0]",
        ),
        (
            |s| s.shape = vec![6],
            "tensors[2]: ndim is 1, expected 2 like tensors[0]",
        ),
        (
            |s| s.device.device_type = DLDeviceType::CUDAHOST,
            "tensors[2]: device type is kDLCUDAHost, expected kDLCPU like tensors[0]",
        ),
        (
            |s| s.device.device_id = 1,
            "tensors[2]: device id is 1, expected 0 like tensors[0]",
        ),
        (|s| s.shape[0] = -1, "tensors[2]: shape[0] is -1"),
    ];
    for (mutate, fragment) in cases {
        let mut specs = vec![base(), base(), base()];
        mutate(&mut specs[2]);
        for legacy in [false, true] {
            let mut b = std::ptr::null_mut();
            let counts: Vec<Count>;
            let err;
            if legacy {
                let (ptrs, c): (Vec<_>, Vec<_>) = specs.iter().map(Spec::legacy).unzip();
                err = ndx_batch_from_dlpack(ptrs.as_ptr(), 3, std::ptr::null(), &mut b);
                counts = c;
                assert!(counts.iter().all(|c| calls(c) == 0));
                ptrs.into_iter().for_each(drop_legacy);
            } else {
                let (ptrs, c) = batch_v(&specs);
                err = ndx_batch_from_dlpack_versioned(ptrs.as_ptr(), 3, std::ptr::null(), &mut b);
                counts = c;
                assert!(counts.iter().all(|c| calls(c) == 0));
                ptrs.into_iter().for_each(drop_versioned);
            }
            assert!(b.is_null());
            let (_, msg) = take_error(err).expect("error");
            assert!(msg.contains(fragment), "{msg:?} lacks {fragment:?}");
            assert!(
                msg.contains("every tensor still belongs to the caller"),
                "{msg}"
            );
        }
    }
}

#[test]
fn bulk_import_checks_every_version_first_and_releases_only_unknown_ones() {
    let mut specs = vec![base(), base(), base(), base()];
    specs[1].major = 2;
    specs[3].major = 3;
    specs[2].shape[0] = -5; // would fail validation, but versions come first
    let (ptrs, counts) = batch_v(&specs);
    let mut b = std::ptr::null_mut();
    let (_, msg) = take_error(ndx_batch_from_dlpack_versioned(
        ptrs.as_ptr(),
        4,
        std::ptr::null(),
        &mut b,
    ))
    .expect("error");
    assert!(
        msg.contains("tensors[1] (major 2), tensors[3] (major 3)"),
        "{msg}"
    );
    assert!(msg.contains("their deleters have been called"), "{msg}");
    assert_eq!(counts.iter().map(calls).collect::<Vec<_>>(), [0, 1, 0, 1]);
    drop_versioned(ptrs[0]);
    drop_versioned(ptrs[2]);
}

#[test]
fn bulk_import_argument_errors() {
    let mut b = std::ptr::null_mut();
    let (ptrs, counts) = batch_v(&[base()]);
    expect_err(
        ndx_batch_from_dlpack_versioned(ptrs.as_ptr(), 0, std::ptr::null(), &mut b),
        NDX_ERROR_VALUE,
        "argument 'n' is 0",
    );
    expect_err(
        ndx_batch_from_dlpack_versioned(std::ptr::null(), 2, std::ptr::null(), &mut b),
        NDX_ERROR_VALUE,
        "argument 'tensors' is NULL",
    );
    let with_null = [ptrs[0], std::ptr::null_mut()];
    expect_err(
        ndx_batch_from_dlpack_versioned(with_null.as_ptr(), 2, std::ptr::null(), &mut b),
        NDX_ERROR_VALUE,
        "tensors[1] is NULL",
    );
    assert_eq!(calls(&counts[0]), 0);
    drop_versioned(ptrs[0]);
}

#[test]
fn cuda_tensors_import_as_metadata_without_ordering() {
    let mut spec = base();
    spec.device.device_type = DLDeviceType::CUDA;
    spec.device.device_id = 1;
    let (m, count) = spec.versioned();
    // No stream ordering asked for, so device 1 need not exist (nor a driver).
    let opts = ndx_import_options_t {
        struct_size: std::mem::size_of::<ndx_import_options_t>(),
        layout: std::ptr::null(),
        read_only: false,
        stream: usize::MAX as *mut std::ffi::c_void,
    };
    let mut t = std::ptr::null_mut();
    ok(ndx_tensor_from_dlpack_versioned(m, &opts, &mut t));
    let mut dev = ndx::tensor::Device::CPU.to_dl();
    ok(ndx_tensor_device(t, &mut dev));
    assert_eq!((dev.device_type, dev.device_id), (DLDeviceType::CUDA, 1));
    let mut buf = [0f32; 6];
    expect_err(
        ndx_tensor_copy_to(t, buf.as_mut_ptr().cast(), 24),
        NDX_ERROR_VALUE,
        "device memory",
    );
    ndx_tensor_release(t);
    assert_eq!(calls(&count), 1);

    // A batch in device memory does not stack into host memory: said naming the sample
    // and its device (it said "ndx_tensor_copy_to reads host-accessible memory only").
    let (managed, counts) = batch_v(&[spec.clone(), spec.clone()]);
    let mut b = std::ptr::null_mut();
    ok(ndx_batch_from_dlpack_versioned(
        managed.as_ptr(),
        2,
        std::ptr::null(),
        &mut b,
    ));
    let mut stacked = 0x5a5a_usize as *mut ndx_tensor_t;
    let (kind, msg) = take_error(ndx_batch_to_tensor(b, &mut stacked)).expect("an error");
    assert_eq!(kind, NDX_ERROR_VALUE as i32);
    assert!(
        msg.starts_with("cannot stack sample 0: it lives in kDLCUDA:1 device memory")
            && msg.contains("the to_host operator")
            && !msg.contains("ndx_tensor_copy_to"),
        "{msg}"
    );
    assert!(stacked.is_null());
    ndx_batch_release(b);
    assert_eq!(counts.iter().map(calls).collect::<Vec<_>>(), [1, 1]);
}

#[test]
fn uniform_batch_stacks_with_a_leading_dimension() {
    let specs = vec![
        Spec::f32s(&[1.0, 2.0, 3.0, 4.0], &[2, 2]),
        Spec::f32s(&[5.0, 6.0, 7.0, 8.0], &[2, 2]),
    ];
    let (ptrs, counts) = batch_v(&specs);
    let opts = ndx_import_options_t {
        struct_size: std::mem::size_of::<ndx_import_options_t>(),
        layout: c"HW".as_ptr(),
        read_only: false,
        stream: std::ptr::null_mut(),
    };
    let b = import_batch(&ptrs, &opts);
    let mut t = std::ptr::null_mut();
    ok(ndx_batch_to_tensor(b, &mut t));
    assert_eq!(shape_of(t), [2, 2, 2]);
    assert_eq!(values_f32(t), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
    let mut layout = std::ptr::null();
    ok(ndx_tensor_layout(t, &mut layout));
    // SAFETY: borrowed from the live tensor.
    assert_eq!(unsafe { CStr::from_ptr(layout) }, c"NHW");
    ndx_batch_release(b);
    assert_eq!(
        counts.iter().map(calls).collect::<Vec<_>>(),
        [1, 1],
        "the stack is a copy"
    );
    ndx_tensor_release(t);
}

static HOST_DELETES: AtomicUsize = AtomicUsize::new(0);

unsafe extern "C" fn host_deleter(data: *mut c_void, user: *mut c_void) {
    assert_eq!(data, user, "deleter receives (data, user)");
    HOST_DELETES.fetch_add(1, Ordering::SeqCst);
}

#[test]
fn host_memory_copy_and_wrap() {
    let mut buf: Vec<i32> = (0..6).collect();
    let shape = [3i64, 2];
    let strides = [1i64, 3];
    let mut t = std::ptr::null_mut();
    ok(ndx_tensor_from_host(
        buf.as_ptr().cast(),
        ndx_dtype_t::NDX_DTYPE_INT32 as i32,
        2,
        shape.as_ptr(),
        strides.as_ptr(),
        std::ptr::null(),
        &mut t,
    ));
    buf.iter_mut().for_each(|v| *v = -1); // a copy: later writes do not show
    let mut out = [0i32; 6];
    ok(ndx_tensor_copy_to(t, out.as_mut_ptr().cast(), 24));
    assert_eq!(out, [0, 3, 1, 4, 2, 5]);
    assert_eq!(strides_of(t), [2, 1]);
    ndx_tensor_release(t);

    let data = buf.as_mut_ptr().cast::<c_void>();
    expect_err(
        ndx_tensor_wrap_host(
            data,
            99,
            2,
            shape.as_ptr(),
            std::ptr::null(),
            Some(host_deleter),
            data,
            std::ptr::null(),
            &mut t,
        ),
        NDX_ERROR_VALUE,
        "argument 'dtype' is 99",
    );
    assert_eq!(
        HOST_DELETES.load(Ordering::SeqCst),
        0,
        "not called on failure"
    );
    ok(ndx_tensor_wrap_host(
        data,
        ndx_dtype_t::NDX_DTYPE_INT32 as i32,
        2,
        shape.as_ptr(),
        std::ptr::null(),
        Some(host_deleter),
        data,
        std::ptr::null(),
        &mut t,
    ));
    ok(ndx_tensor_copy_to(t, out.as_mut_ptr().cast(), 24));
    assert_eq!(out, [-1; 6]);
    ndx_tensor_release(t);
    assert_eq!(HOST_DELETES.load(Ordering::SeqCst), 1);

    expect_err(
        ndx_tensor_from_host(
            std::ptr::null(),
            12,
            2,
            shape.as_ptr(),
            std::ptr::null(),
            std::ptr::null(),
            &mut t,
        ),
        NDX_ERROR_VALUE,
        "data is NULL but the tensor has 6 elements",
    );
    expect_err(
        ndx_tensor_from_host(
            data,
            12,
            65,
            shape.as_ptr(),
            std::ptr::null(),
            std::ptr::null(),
            &mut t,
        ),
        NDX_ERROR_VALUE,
        "argument 'ndim' is 65, expected 0 to 64",
    );
    let empty = [0i64, 4];
    ok(ndx_tensor_from_host(
        std::ptr::null(),
        12,
        2,
        empty.as_ptr(),
        std::ptr::null(),
        std::ptr::null(),
        &mut t,
    ));
    let mut nbytes = 1usize;
    ok(ndx_tensor_nbytes(t, &mut nbytes));
    assert_eq!(nbytes, 0);
    ndx_tensor_release(t);
}

#[test]
fn accessors_reject_null_handles_and_clear_out_params() {
    let mut nd = 7i32;
    expect_err(
        ndx_tensor_ndim(std::ptr::null(), &mut nd),
        NDX_ERROR_VALUE,
        "argument 'tensor' is NULL",
    );
    assert_eq!(nd, 0);
    let mut n = 7usize;
    expect_err(
        ndx_batch_size(std::ptr::null(), &mut n),
        NDX_ERROR_VALUE,
        "argument 'batch' is NULL",
    );
    assert_eq!(n, 0);
    expect_err(
        ndx_tensor_retain(std::ptr::null()),
        NDX_ERROR_VALUE,
        "argument 'tensor' is NULL",
    );
    ndx_tensor_release(std::ptr::null());
    ndx_batch_release(std::ptr::null());
    // SAFETY: static strings from ndx.
    assert_eq!(unsafe { CStr::from_ptr(ndx_dtype_name(11)) }, c"bfloat16");
    assert!(ndx_dtype_name(0).is_null());
}

/// `ndx_tensor_copy_to` into the very memory the tensor reads is refused, naming `buf`:
/// it read bytes it had just overwritten (a transposed view copied onto its own buffer
/// came out scrambled, and Rust saw the same bytes as shared and exclusive at once).
#[test]
fn copy_to_refuses_a_buffer_that_overlaps_the_tensor() {
    let f32_ = ndx_dtype_t::NDX_DTYPE_FLOAT32 as i32;
    let mut buf: Vec<f32> = (0..8).map(|v| v as f32).collect();
    let base = buf.as_mut_ptr();
    // The transpose of the 2x3 matrix in buf[1..7], as a wrapped view.
    // SAFETY: inside `buf`.
    let data = unsafe { base.add(1) };
    let t = wrap_host(data.cast(), f32_, &[3, 2], Some(&[1, 3]), false);
    let mut apart = [0f32; 6];
    ok(ndx_tensor_copy_to(t, apart.as_mut_ptr().cast(), 24));
    assert_eq!(apart, [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    // Onto itself, onto its last element, and from just before its first one.
    for (at, cap) in [(1usize, 24usize), (6, 24), (0, 8), (0, usize::MAX)] {
        // SAFETY: inside `buf` or just at its start; nothing is written on refusal.
        let dst = unsafe { base.add(at) };
        let (_, msg) = take_error(ndx_tensor_copy_to(t, dst.cast(), cap))
            .unwrap_or_else(|| panic!("a copy onto buf[{at}..] was accepted"));
        assert!(
            msg.contains("argument 'buf'") && msg.contains("overlaps the tensor's memory"),
            "{msg}"
        );
    }
    assert_eq!(
        buf,
        [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0],
        "nothing written"
    );
    // Buffers next to the memory read, on either side, do not overlap it: buf[1] as a
    // one-element tensor copied into buf[2] and into buf[0].
    let one = wrap_host(data.cast(), f32_, &[1], None, false);
    // SAFETY: inside `buf`.
    ok(ndx_tensor_copy_to(one, unsafe { base.add(2) }.cast(), 4));
    ok(ndx_tensor_copy_to(one, base.cast(), 4));
    assert_eq!(buf[..3], [1.0, 1.0, 1.0]);
    ndx_tensor_release(one);
    ndx_tensor_release(t);
}

/// A zero-stride (broadcast) view spans a few bytes but its elements, compacted, would
/// not fit: refused at import, not a panic later in nbytes, copy_to, reshape or sum.
#[test]
fn zero_stride_imports_whose_compact_size_overflows_are_refused() {
    let mut buf = [0u8; 32];
    let cases: [(i32, &[i64], &[i64], &str); 2] = [
        (
            ndx_dtype_t::NDX_DTYPE_FLOAT64 as i32,
            &[1 << 61],
            &[0],
            "tensor: shape [2305843009213693952] of itemsize 8 is too large to address: its \
             compact size (2305843009213693952 elements x 8 bytes) overflows",
        ),
        (
            ndx_dtype_t::NDX_DTYPE_INT8 as i32,
            &[1 << 62, 3],
            &[0, 0],
            "tensor: shape [4611686018427387904, 3] of itemsize 1 is too large to address",
        ),
    ];
    for (dtype, shape, strides, fragment) in cases {
        let mut t = 0x5a5a_usize as *mut ndx_tensor_t;
        expect_err(
            ndx_tensor_wrap_host(
                buf.as_mut_ptr().cast(),
                dtype,
                shape.len() as i32,
                shape.as_ptr(),
                strides.as_ptr(),
                None,
                std::ptr::null_mut(),
                std::ptr::null(),
                &mut t,
            ),
            NDX_ERROR_VALUE,
            fragment,
        );
        assert!(t.is_null());
    }
}

/// The `batch_to_tensor` operator stacks tensors standing for the samples into new
/// host memory, so samples in different host-readable memories (pageable, pinned,
/// managed) stack like any others, in every mode; a whole imported batch still keeps
/// one device.
#[test]
fn batch_to_tensor_stacks_samples_from_different_host_memories() {
    let kinds = [
        DLDeviceType::CPU,
        DLDeviceType::CUDAHOST,
        DLDeviceType::CUDAMANAGED,
    ];
    let mut tensors = Vec::new();
    let mut counts = Vec::new();
    for (i, kind) in kinds.iter().enumerate() {
        let v = i as f32;
        let mut spec = Spec::f32s(&[v, v + 0.5], &[2]);
        spec.device.device_type = *kind;
        let (m, c) = spec.versioned();
        tensors.push(T(import_v(m).expect("import")));
        counts.push(c);
    }
    for mode in [
        ndx_eval_mode_t::NDX_EVAL_SYNC_CPU,
        ndx_eval_mode_t::NDX_EVAL_SYNC_FULL,
        ndx_eval_mode_t::NDX_EVAL_DEFERRED,
        ndx_eval_mode_t::NDX_EVAL_EAGER,
    ] {
        let ctx = Ctx::new(mode as i32);
        for order in [[0, 1, 2], [1, 2, 0], [2, 0, 1]] {
            let ins: Vec<ndx_input_t> = order.iter().map(|&i| tensors[i].input()).collect();
            let f = invoke_with(
                &ctx,
                c"batch_to_tensor",
                &ins,
                std::ptr::null(),
                &invoke_options(0, &[]),
            )
            .unwrap_or_else(|e| panic!("{mode:?} {order:?}: {:?}", take_error(e)));
            ok(ndx_future_wait(f, -1));
            let mut r = std::ptr::null_mut();
            ok(ndx_future_tensor(f, 0, &mut r));
            ndx_future_release(f);
            let r = T(r);
            assert_eq!(shape_of(r.0), [3, 2], "{mode:?} {order:?}");
            let expected: Vec<f32> = order
                .iter()
                .flat_map(|&i| [i as f32, i as f32 + 0.5])
                .collect();
            assert_eq!(values_f32(r.0), expected, "{mode:?} {order:?}");
        }
    }
    // A CUDA sample has no host kernel to stack it: refused at invoke (without a
    // driver: none found; with one: the host samples must move first).
    let mut spec = Spec::f32s(&[0.0, 0.5], &[2]);
    spec.device.device_type = DLDeviceType::CUDA;
    let (m, c) = spec.versioned();
    let gpu = T(import_v(m).expect("import"));
    counts.push(c);
    let ctx = Ctx::new(ndx_eval_mode_t::NDX_EVAL_DEFERRED as i32);
    let e = invoke_with(
        &ctx,
        c"batch_to_tensor",
        &[gpu.input(), tensors[0].input()],
        std::ptr::null(),
        &invoke_options(0, &[]),
    )
    .expect_err("a CUDA sample among host samples is refused at invoke");
    let (kind, msg) = take_error(e).expect("an error");
    assert!(
        [NDX_ERROR_CUDA as i32, NDX_ERROR_VALUE as i32].contains(&kind),
        "{kind}: {msg}"
    );
    assert!(msg.contains("input 0"), "{msg}");
    drop((ctx, gpu, tensors));
    assert_eq!(counts.iter().map(calls).collect::<Vec<_>>(), [1, 1, 1, 1]);
}

#[test]
fn no_output_has_more_dimensions_than_an_import_accepts() {
    // Found by review: expand_dims and reshape made tensors of more than MAX_NDIM
    // dimensions, which ndx exported but could not import again.
    let ctx = Ctx::new(ndx_eval_mode_t::NDX_EVAL_SYNC_CPU as i32);
    let x = T::copy(&[2.5f32], 12, &[]);
    let invoke = |op: &CStr, input: ndx_input_t, args: &Args| {
        invoke_with(&ctx, op, &[input], args.0, &invoke_options(0, &[]))
    };
    // The most dimensions there may be: made, exported and imported again.
    let most = vec![1i64; NDX_MAX_NDIM as usize];
    let f = invoke(c"reshape", x.input(), &Args::new().ints(c"shape", &most)).expect("64 dims");
    let mut wide = std::ptr::null_mut();
    ok(ndx_future_tensor(f, 0, &mut wide));
    ndx_future_release(f);
    assert_eq!(shape_of(wide), most);
    let mut exported = std::ptr::null_mut();
    ok(ndx_tensor_to_dlpack_versioned(wide, &mut exported));
    let back = import_v(exported).expect("ndx imports what it exported");
    assert_eq!(shape_of(back), most);
    assert_eq!(values_f32(back), [2.5]);
    ndx_tensor_release(back);

    // One more is refused when enqueued, naming the output and the limit.
    let fail = |r: Result<*mut ndx_future_t, *mut ndx_error_t>, fragment: &str| {
        let e = r.expect_err("refused at ndx_invoke");
        expect_err(e, NDX_ERROR_VALUE, fragment);
    };
    let over = vec![1i64; NDX_MAX_NDIM as usize + 1];
    fail(
        invoke(c"reshape", x.input(), &Args::new().ints(c"shape", &over)),
        "output 0 would have 65 dimensions; a tensor has at most 64 (NDX_MAX_NDIM)",
    );
    let w = ndx_input_t {
        tensor: wide,
        batch: std::ptr::null(),
    };
    fail(
        invoke(c"expand_dims", w, &Args::new().int(c"axis", 0)),
        "output 0 would have 65 dimensions",
    );
    // Per sample, the error names the sample.
    let (b, counts) = f32_batch(&[(&[1.0], &most), (&[2.0], &most)]);
    let per_sample = ndx_input_t {
        tensor: std::ptr::null(),
        batch: b,
    };
    fail(
        invoke(c"expand_dims", per_sample, &Args::new().int(c"axis", 0)),
        "sample 0: output 0 would have 65 dimensions",
    );
    // Stacking samples of 64 dimensions would make 65.
    let mut stacked = std::ptr::null_mut();
    expect_err(
        ndx_batch_to_tensor(b, &mut stacked),
        NDX_ERROR_VALUE,
        "the stacked tensor (samples of 64 dimensions) would have 65 dimensions",
    );
    assert!(stacked.is_null());
    let samples = ndx_input_t {
        tensor: std::ptr::null(),
        batch: b,
    };
    fail(
        invoke(c"batch_to_tensor", samples, &Args::new()),
        "output 0 would have 65 dimensions",
    );
    ndx_batch_release(b);
    assert_eq!(counts.iter().map(calls).collect::<Vec<_>>(), [1, 1]);
    ndx_tensor_release(wide);
}

/// Stacking broadcast samples (stride 0: a few bytes of memory standing for 2^62
/// elements) whose stack would pass the address space fails naming the stack, its
/// samples and their shape. It said "output: shape [2, 4611686018427387904] of
/// itemsize 1 is too large to address", naming an output ndx_batch_to_tensor has not.
#[test]
fn a_stack_too_large_to_address_is_named_as_the_stack() {
    let mut spec = Spec::f32s(&[1.0], &[1]);
    spec.dtype = DLDataType {
        code: DLDataTypeCode::UINT,
        bits: 8,
        lanes: 1,
    };
    spec.data = vec![7];
    spec.shape = vec![1 << 62];
    spec.strides = Some(vec![0]);
    let (ptrs, counts) = batch_v(&[spec.clone(), spec]);
    let b = import_batch(&ptrs, std::ptr::null());
    let mut t = std::ptr::null_mut();
    expect_err(
        ndx_batch_to_tensor(b, &mut t),
        NDX_ERROR_VALUE,
        "cannot stack 2 samples of shape [4611686018427387904] (uint8): the stacked tensor of \
         shape [2, 4611686018427387904] is too large to address",
    );
    assert!(t.is_null());
    ndx_batch_release(b);
    assert!(counts.iter().all(|c| calls(c) == 1));
}
