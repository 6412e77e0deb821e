//! The joining and image operators through the C API, called from Rust: concat (values,
//! int8 + uint8 + float16 promoted to float16, a shape mismatch refused at `ndx_invoke`),
//! stack, crop, resize (OpenCV's linear rule for uint8, bad sizes, an unknown interp,
//! bool), rgb_to_gray, normalize, a ragged batch of HWC images imported with a layout and
//! resized per sample, and the same resize in DEFERRED and EAGER modes.
//!
//! Expected values are worked out by hand (the resize and gray values agree with
//! `cv2.resize(INTER_LINEAR)` and `cv2.cvtColor(COLOR_RGB2GRAY)`), never computed by ndx.
//! Mirrors `tests/c/test_ops_image.c`.

mod common;

use std::ffi::{CStr, c_void};

use common::*;
use dlpark::DlpackFlags;
use dlpark::ffi::{DLDataType, DLDataTypeCode};
use ndx::ffi::ndx_error_kind_t::*;
use ndx::ffi::*;

// ---- helpers ---------------------------------------------------------------------------

const U8: i32 = ndx_dtype_t::NDX_DTYPE_UINT8 as i32;
const I8: i32 = ndx_dtype_t::NDX_DTYPE_INT8 as i32;
const I32: i32 = ndx_dtype_t::NDX_DTYPE_INT32 as i32;
const I64: i32 = ndx_dtype_t::NDX_DTYPE_INT64 as i32;
const U64: i32 = ndx_dtype_t::NDX_DTYPE_UINT64 as i32;
const F16: i32 = ndx_dtype_t::NDX_DTYPE_FLOAT16 as i32;
const F32: i32 = ndx_dtype_t::NDX_DTYPE_FLOAT32 as i32;
const BOOL: i32 = ndx_dtype_t::NDX_DTYPE_BOOL as i32;
const DEFERRED: i32 = ndx_eval_mode_t::NDX_EVAL_DEFERRED as i32;
const EAGER: i32 = ndx_eval_mode_t::NDX_EVAL_EAGER as i32;
const SYNC_CPU: i32 = ndx_eval_mode_t::NDX_EVAL_SYNC_CPU as i32;

/// This file, NUL-terminated, for the explicit invocation location.
const THIS_FILE: &CStr = match CStr::from_bytes_with_nul(concat!(file!(), "\0").as_bytes()) {
    Ok(s) => s,
    Err(_) => panic!("file!() has a NUL"),
};

impl T {
    /// A host tensor copied from `data` (`shape`, `dtype`), with `layout` (None: none).
    fn host<E: Copy>(data: &[E], dtype: i32, shape: &[i64], layout: Option<&CStr>) -> T {
        let opts = import_options(layout, false);
        let mut t = std::ptr::null_mut();
        ok(ndx_tensor_from_host(
            data.as_ptr().cast::<c_void>(),
            dtype,
            shape.len() as i32,
            shape.as_ptr(),
            std::ptr::null(),
            if layout.is_some() {
                &opts
            } else {
                std::ptr::null()
            },
            &mut t,
        ));
        assert!(!t.is_null());
        T(t)
    }

    fn dtype(&self) -> i32 {
        let mut d = 0;
        ok(ndx_tensor_dtype(self.0, &mut d));
        d
    }

    fn shape(&self) -> Vec<i64> {
        shape_of(self.0)
    }

    fn layout(&self) -> String {
        let mut l = std::ptr::null();
        ok(ndx_tensor_layout(self.0, &mut l));
        cstr(l)
    }

    fn bytes(&self) -> Vec<u8> {
        let mut n = 0usize;
        ok(ndx_tensor_nbytes(self.0, &mut n));
        let mut out = vec![0u8; n];
        ok(ndx_tensor_copy_to(self.0, out.as_mut_ptr().cast(), n));
        out
    }

    /// dtype, shape and layout at once.
    fn meta(&self) -> (i32, Vec<i64>, String) {
        (self.dtype(), self.shape(), self.layout())
    }
}

impl Args {
    fn crop(x: i64, y: i64, w: i64, h: i64) -> Args {
        Args::new()
            .int(c"x", x)
            .int(c"y", y)
            .int(c"w", w)
            .int(c"h", h)
    }

    fn resize(h: i64, w: i64, interp: Option<&CStr>) -> Args {
        let a = Args::new().int(c"h", h).int(c"w", w);
        match interp {
            Some(i) => a.string(c"interp", i),
            None => a,
        }
    }
}

/// `ndx_invoke` with an explicit location (this file, `line`) and an eval mode (0: the
/// context's): the future, or the call-time error (then the out-param must be NULL).
fn invoke(
    ctx: &Ctx,
    op: &CStr,
    inputs: &[ndx_input_t],
    args: Option<&Args>,
    mode: i32,
    line: u32,
) -> Result<*mut ndx_future_t, *mut ndx_error_t> {
    let opts = ndx_invoke_options_t {
        location: ndx_location_t {
            file: THIS_FILE.as_ptr(),
            line,
            function: c"invoke".as_ptr(),
        },
        mode,
        ..Default::default()
    };
    let mut f = 0x5a5a_5a5ausize as *mut ndx_future_t; // a sentinel: must be reset
    let e = ndx_invoke(
        ctx.0,
        op.as_ptr(),
        inputs.as_ptr(),
        inputs.len(),
        args.map_or(std::ptr::null(), |a| a.0.cast_const()),
        &opts,
        &mut f,
    );
    if e.is_null() {
        assert!(!f.is_null(), "a future");
        Ok(f)
    } else {
        assert!(
            f.is_null(),
            "the future out-param is NULL after a call-time error"
        );
        Err(e)
    }
}

/// Waits for `f` (which must succeed), returns its output 0 and releases the future.
fn finish(f: *mut ndx_future_t) -> T {
    ok(ndx_future_wait(f, -1));
    assert_eq!(
        ndx_future_poll(f),
        ndx_future_status_t::NDX_FUTURE_READY as i32
    );
    let mut t = std::ptr::null_mut();
    ok(ndx_future_tensor(f, 0, &mut t));
    ndx_future_release(f);
    T(t)
}

/// Invokes `op`, which must be accepted and succeed; returns output 0.
fn run(ctx: &Ctx, op: &CStr, inputs: &[ndx_input_t], args: Option<&Args>) -> T {
    match invoke(ctx, op, inputs, args, 0, line!()) {
        Ok(f) => finish(f),
        Err(e) => {
            ok(e);
            unreachable!()
        }
    }
}

/// Invokes `op`, which must fail AT `ndx_invoke` with `kind` and a message containing
/// `fragment`; checks the error's operator and that frame 0 is the explicit location.
#[allow(clippy::too_many_arguments)]
fn expect_invoke_err(
    ctx: &Ctx,
    op: &CStr,
    inputs: &[ndx_input_t],
    args: Option<&Args>,
    mode: i32,
    kind: ndx_error_kind_t,
    fragment: &str,
) {
    let line = line!() + 1;
    match invoke(ctx, op, inputs, args, mode, line) {
        Ok(f) => {
            let got = take_error(ndx_future_wait(f, -1));
            ndx_future_release(f);
            panic!(
                "{op:?} was accepted by ndx_invoke (its work ended with {got:?}); expected \
                 {kind:?} containing {fragment:?}"
            );
        }
        Err(e) => {
            assert_eq!(cstr(ndx_error_op(e)), op.to_str().unwrap());
            assert!(ndx_error_frame_count(e) >= 1);
            let fr = frame(e, 0);
            assert_eq!(
                (cstr(fr.file), fr.line, cstr(fr.function), fr.origin),
                (
                    file!().to_string(),
                    line,
                    "invoke".to_string(),
                    ndx_frame_origin_t::NDX_FRAME_HOST
                )
            );
            expect_err(e, kind, fragment);
        }
    }
}

fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

fn u16_bytes(v: &[u16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

// ---- concat and stack --------------------------------------------------------------------

#[test]
fn concat_joins_values_along_an_axis() {
    let ctx = Ctx::new(EAGER);
    let a = T::host(&[1i32, 2, 3, 4], I32, &[2, 2], None);
    let b = T::host(&[5i32, 6], I32, &[1, 2], None);
    let c = T::host(&[7i32, 8], I32, &[2, 1], None);

    // (2,2) + (1,2) along axis 0 -> (3,2).
    let axis0 = Args::new().int(c"axis", 0);
    let r = run(&ctx, c"concat", &[a.input(), b.input()], Some(&axis0));
    assert_eq!(r.meta(), (I32, vec![3, 2], String::new()));
    assert_eq!(r.bytes(), i32_bytes(&[1, 2, 3, 4, 5, 6]));
    // The default axis is 0.
    let r = run(&ctx, c"concat", &[a.input(), b.input()], None);
    assert_eq!(r.bytes(), i32_bytes(&[1, 2, 3, 4, 5, 6]));
    // (2,2) + (2,1) along axis -1 -> (2,3): rows interleave.
    let last = Args::new().int(c"axis", -1);
    let r = run(&ctx, c"concat", &[a.input(), c.input()], Some(&last));
    assert_eq!(r.meta(), (I32, vec![2, 3], String::new()));
    assert_eq!(r.bytes(), i32_bytes(&[1, 2, 7, 3, 4, 8]));
}

#[test]
fn concat_of_int8_uint8_float16_is_float16() {
    let ctx = Ctx::new(EAGER);
    let i8s = T::host(&[-1i8, 2], I8, &[2], None);
    let u8s = T::host(&[200u8, 3], U8, &[2], None);
    let f16s = T::host(&[0x3800u16 /* 0.5 */, 0x3E00 /* 1.5 */], F16, &[2], None);
    let r = run(
        &ctx,
        c"concat",
        &[i8s.input(), u8s.input(), f16s.input()],
        None,
    );
    assert_eq!(r.meta(), (F16, vec![6], String::new()));
    // -1, 2, 200, 3, 0.5, 1.5 as IEEE half bit patterns.
    assert_eq!(
        r.bytes(),
        u16_bytes(&[0xBC00, 0x4000, 0x5A40, 0x4200, 0x3800, 0x3E00])
    );
}

#[test]
fn concat_of_mismatched_shapes_fails_at_invoke() {
    let ctx = Ctx::new(EAGER);
    let a = T::host(&[1i32, 2, 3, 4], I32, &[2, 2], None);
    let d = T::host(&[9i32, 9, 9], I32, &[1, 3], None);
    let axis0 = Args::new().int(c"axis", 0);
    for mode in [0, DEFERRED, EAGER] {
        expect_invoke_err(
            &ctx,
            c"concat",
            &[a.input(), d.input()],
            Some(&axis0),
            mode,
            NDX_ERROR_VALUE,
            "input 1 has shape",
        );
    }
    expect_invoke_err(
        &ctx,
        c"concat",
        &[a.input(), d.input()],
        Some(&axis0),
        0,
        NDX_ERROR_VALUE,
        "input 1 has shape [1, 3], which does not match input 0's [2, 2]",
    );
}

/// Broadcast views (stride 0) of 2^62 elements: concatenated, their extents add up
/// past int64. The sum once overflowed (a panic: NDX_ERROR_INTERNAL in debug builds).
#[test]
fn concat_whose_extents_overflow_int64_fails_at_invoke() {
    let ctx = Ctx::new(EAGER);
    let mut one = [7u8];
    let huge = wrap_host(
        one.as_mut_ptr().cast(),
        U8,
        &[1 << 62, 1],
        Some(&[0, 0]),
        false,
    );
    let input = || ndx_input_t {
        tensor: huge,
        batch: std::ptr::null(),
    };
    for mode in [0, DEFERRED] {
        expect_invoke_err(
            &ctx,
            c"concat",
            &[input(), input()],
            None,
            mode,
            NDX_ERROR_VALUE,
            "operator 'concat': the extents along axis 0 add up past int64 at input 1 (shape [4611686018427387904, 1])",
        );
    }
    ndx_tensor_release(huge);
}

/// An empty broadcast view of [0, 2^62] and a [0, 1] tensor, concatenated along the
/// last axis: an empty output of [0, 2^62 + 1]. Its first input's block along the
/// axis (2^62 float32) once overflowed when counted in bytes (a panic while running:
/// NDX_ERROR_INTERNAL in debug builds). Found by extreme_arguments in fuzz_api.
#[test]
fn concat_of_empty_inputs_with_huge_inner_extents_is_empty() {
    let mut one = [0f32; 1];
    let huge = wrap_host(
        one.as_mut_ptr().cast(),
        F32,
        &[0, 1 << 62],
        Some(&[0, 0]),
        false,
    );
    let small = T::host(&[] as &[f32], F32, &[0, 1], None);
    let last = Args::new().int(c"axis", -1);
    for mode in [SYNC_CPU, EAGER] {
        let ctx = Ctx::new(mode);
        let input = ndx_input_t {
            tensor: huge,
            batch: std::ptr::null(),
        };
        let r = run(&ctx, c"concat", &[input, small.input()], Some(&last));
        assert_eq!(r.meta(), (F32, vec![0, (1 << 62) + 1], String::new()));
        assert!(r.bytes().is_empty());
    }
    ndx_tensor_release(huge);
}

#[test]
fn stack_of_two_vectors_is_a_matrix() {
    let ctx = Ctx::new(EAGER);
    let p = T::host(&[1i32, 2], I32, &[2], None);
    let q = T::host(&[3i32, 4], I32, &[2], None);
    let r = run(&ctx, c"stack", &[p.input(), q.input()], None);
    assert_eq!(r.meta(), (I32, vec![2, 2], String::new()));
    assert_eq!(r.bytes(), i32_bytes(&[1, 2, 3, 4]));
    let axis1 = Args::new().int(c"axis", 1);
    let r = run(&ctx, c"stack", &[p.input(), q.input()], Some(&axis1));
    assert_eq!(r.meta(), (I32, vec![2, 2], String::new()));
    assert_eq!(r.bytes(), i32_bytes(&[1, 3, 2, 4]));
}

// ---- crop ------------------------------------------------------------------------------------

#[test]
fn crop_takes_the_window_and_keeps_the_layout() {
    let ctx = Ctx::new(EAGER);
    let v: Vec<u8> = (0..24).collect();
    let img = T::host(&v, U8, &[3, 4, 2], Some(c"HWC"));
    let plain = T::host(&v, U8, &[3, 4, 2], None);

    let window = Args::crop(1, 1, 2, 2);
    let r = run(&ctx, c"crop", &[img.input()], Some(&window));
    assert_eq!(r.meta(), (U8, vec![2, 2, 2], "HWC".to_string()));
    // Rows 1-2, columns 1-2, both channels: pixel (y, x) starts at byte 8y + 2x.
    assert_eq!(r.bytes(), [10, 11, 12, 13, 18, 19, 20, 21]);

    // x + w = 5 > 4.
    let outside = Args::crop(3, 1, 2, 2);
    expect_invoke_err(
        &ctx,
        c"crop",
        &[img.input()],
        Some(&outside),
        0,
        NDX_ERROR_VALUE,
        "not inside the 4x3 image",
    );
    expect_invoke_err(
        &ctx,
        c"crop",
        &[img.input()],
        Some(&outside),
        0,
        NDX_ERROR_VALUE,
        "crop window x=3 y=1 w=2 h=2",
    );
    // y + h = 4 > 3.
    let too_low = Args::crop(0, 2, 1, 2);
    expect_invoke_err(
        &ctx,
        c"crop",
        &[img.input()],
        Some(&too_low),
        0,
        NDX_ERROR_VALUE,
        "not inside the 4x3 image",
    );
    // The message says which rule the window breaks (it named only the window).
    for (window, why) in [
        (outside, "x + w = 5 is past the width 4"),
        (too_low, "y + h = 4 is past the height 3"),
        (Args::crop(-2, 0, 1, 1), "x = -2; expected a value >= 0"),
        (Args::crop(0, -1, 1, 1), "y = -1; expected a value >= 0"),
        (Args::crop(0, 0, 0, 1), "w = 0; expected a size >= 1"),
        (Args::crop(0, 0, 1, -3), "h = -3; expected a size >= 1"),
        (Args::crop(2, 0, i64::MAX, 1), "x + w overflows int64"),
    ] {
        expect_invoke_err(
            &ctx,
            c"crop",
            &[img.input()],
            Some(&window),
            0,
            NDX_ERROR_VALUE,
            &format!("is not inside the 4x3 image: {why}"),
        );
    }
    // No layout.
    expect_invoke_err(
        &ctx,
        c"crop",
        &[plain.input()],
        Some(&window),
        0,
        NDX_ERROR_VALUE,
        "layout \"HWC\" or \"CHW\"",
    );
}

// ---- resize -----------------------------------------------------------------------------------

/// [[0, 100], [200, 255]] as a 2x2x1 HWC image.
const SMALL: [u8; 4] = [0, 100, 200, 255];

/// Its 4x4 linear resize, by hand (docs/operators.md): source coordinate
/// (d + 0.5) / 2 - 0.5 = -0.25, 0.25, 0.75, 1.25. Columns: the clamped ones (d = 0, 3)
/// take weight 0, so the rows become [0, 25, 75, 100] and [200, 213.75, 241.25, 255].
/// Rows: d = 0 blends row 0 with itself, d = 1 is 0.75 row 0 + 0.25 row 1, d = 2 the
/// reverse, d = 3 row 1: [50, 72.19, 116.56, 138.75], [150, 166.56, 199.69, 216.25],
/// rounded. Equal to cv2.resize(INTER_LINEAR).
const RESIZED_4X4: [u8; 16] = [
    0, 25, 75, 100, //
    50, 72, 117, 139, //
    150, 167, 200, 216, //
    200, 214, 241, 255,
];

#[test]
fn resize_uint8_linear_follows_opencv() {
    let ctx = Ctx::new(EAGER);
    let img = T::host(&SMALL, U8, &[2, 2, 1], Some(c"HWC"));
    for interp in [Some(c"linear"), None] {
        let a = Args::resize(4, 4, interp);
        let r = run(&ctx, c"resize", &[img.input()], Some(&a));
        assert_eq!(r.meta(), (U8, vec![4, 4, 1], "HWC".to_string()));
        assert_eq!(r.bytes(), RESIZED_4X4, "interp {interp:?}");
    }
    // nearest: source pixel min(floor((d + 0.5) * 2 / 4), 1) = 0, 0, 1, 1.
    let a = Args::resize(4, 4, Some(c"nearest"));
    let r = run(&ctx, c"resize", &[img.input()], Some(&a));
    assert_eq!(r.meta(), (U8, vec![4, 4, 1], "HWC".to_string()));
    assert_eq!(
        r.bytes(),
        [
            0, 0, 100, 100, 0, 0, 100, 100, 200, 200, 255, 255, 200, 200, 255, 255
        ]
    );
}

#[test]
fn resize_rejects_bad_requests_at_invoke() {
    let ctx = Ctx::new(EAGER);
    let img = T::host(&SMALL, U8, &[2, 2, 1], Some(c"HWC"));
    let zero_h = Args::resize(0, 4, None);
    expect_invoke_err(
        &ctx,
        c"resize",
        &[img.input()],
        Some(&zero_h),
        0,
        NDX_ERROR_VALUE,
        "resize to",
    );
    expect_invoke_err(
        &ctx,
        c"resize",
        &[img.input()],
        Some(&zero_h),
        0,
        NDX_ERROR_VALUE,
        "resize to h = 0, w = 4: argument 'h' is 0; expected a size >= 1",
    );
    let cubic = Args::resize(4, 4, Some(c"cubic"));
    expect_invoke_err(
        &ctx,
        c"resize",
        &[img.input()],
        Some(&cubic),
        0,
        NDX_ERROR_VALUE,
        "interp",
    );
    expect_invoke_err(
        &ctx,
        c"resize",
        &[img.input()],
        Some(&cubic),
        0,
        NDX_ERROR_VALUE,
        "\"cubic\"",
    );
    let bools = T::host(&[0u8, 1, 1, 0], BOOL, &[2, 2, 1], Some(c"HWC"));
    let ok_size = Args::resize(4, 4, None);
    expect_invoke_err(
        &ctx,
        c"resize",
        &[bools.input()],
        Some(&ok_size),
        0,
        NDX_ERROR_TYPE,
        "bool",
    );
}

/// An output whose byte size overflows is refused at `ndx_invoke` in every mode (a
/// DEFERRED one included, whose pending output would otherwise lend metadata it cannot
/// represent), naming the argument: resize's `h`, and for any other operator the output.
#[test]
fn outputs_too_large_to_address_are_refused_at_invoke() {
    let img = T::host(&SMALL, U8, &[2, 2, 1], Some(c"HWC"));
    let huge = Args::resize(1 << 62, 4, None);
    for mode in [DEFERRED, EAGER] {
        let ctx = Ctx::new(mode);
        expect_invoke_err(
            &ctx,
            c"resize",
            &[img.input()],
            Some(&huge),
            0,
            NDX_ERROR_VALUE,
            "resize to h = 4611686018427387904, w = 4: the output of shape \
             [4611686018427387904, 4, 1] (uint8) is too large to address",
        );
        // The generic check behind every operator: a broadcast of two zero-stride views.
        let one = [1i8];
        let wrap = |shape: &[i64]| {
            let mut t = std::ptr::null_mut();
            ok(ndx_tensor_wrap_host(
                one.as_ptr().cast_mut().cast::<c_void>(),
                I8,
                2,
                shape.as_ptr(),
                [0i64, 0].as_ptr(),
                None,
                std::ptr::null_mut(),
                std::ptr::null(),
                &mut t,
            ));
            T(t)
        };
        let (col, row) = (wrap(&[1 << 32, 1]), wrap(&[1, 1 << 32]));
        expect_invoke_err(
            &ctx,
            c"add",
            &[col.input(), row.input()],
            None,
            0,
            NDX_ERROR_VALUE,
            "operator 'add': output 0: shape [4294967296, 4294967296] of int8 (itemsize 1) \
             is too large to address",
        );
    }
}

/// An output that fits the address space but not the machine (768 TiB) fails when its
/// work runs with `NDX_ERROR_MEMORY`, naming the output, the size asked for and what the
/// system had available, at the invocation's own line; nothing is left half-made.
#[test]
fn outputs_too_large_for_the_machine_fail_with_a_memory_error() {
    let img = T::host(&[7u8; 12], U8, &[2, 2, 3], Some(c"HWC"));
    let huge = Args::resize(1 << 24, 1 << 24, None);
    for mode in [SYNC_CPU, EAGER] {
        let ctx = Ctx::new(mode);
        let line = line!() + 1;
        let e = match invoke(&ctx, c"resize", &[img.input()], Some(&huge), 0, line) {
            Ok(f) => {
                let e = ndx_future_wait(f, -1);
                ndx_future_release(f);
                e
            }
            Err(e) => e,
        };
        assert!(!e.is_null(), "mode {mode}: the 768 TiB resize failed");
        assert_eq!(cstr(ndx_error_op(e)), "resize");
        assert_eq!(frame(e, 0).line, line, "mode {mode}: the invocation's line");
        let (kind, msg) = take_error(e).unwrap();
        assert_eq!(kind, NDX_ERROR_MEMORY as i32, "mode {mode}: {msg}");
        for fragment in [
            "the output of shape [16777216, 16777216, 3] (uint8): cannot allocate \
             768.00 TiB (844424930131968 bytes) of host memory: ",
            " available; ndx released ",
        ] {
            assert!(
                msg.contains(fragment),
                "mode {mode}: {msg:?} lacks {fragment:?}"
            );
        }
        // The context still works.
        let small = Args::resize(1, 1, None);
        assert_eq!(
            run(&ctx, c"resize", &[img.input()], Some(&small)).bytes(),
            [7, 7, 7]
        );
    }
}

// ---- rgb_to_gray and normalize -------------------------------------------------------------

#[test]
fn rgb_to_gray_uses_opencv_fixed_point() {
    let ctx = Ctx::new(EAGER);
    // (255 * 9798 + 2^14) >> 15 = 76, (255 * 19235 + 2^14) >> 15 = 150.
    let img = T::host(&[255u8, 0, 0, 0, 255, 0], U8, &[1, 2, 3], Some(c"HWC"));
    let r = run(&ctx, c"rgb_to_gray", &[img.input()], None);
    assert_eq!(r.meta(), (U8, vec![1, 2, 1], "HWC".to_string()));
    assert_eq!(r.bytes(), [76, 150]);

    let two = T::host(&[1u8, 2, 3, 4], U8, &[1, 2, 2], Some(c"HWC"));
    expect_invoke_err(
        &ctx,
        c"rgb_to_gray",
        &[two.input()],
        None,
        0,
        NDX_ERROR_VALUE,
        "3 or 4 channels",
    );
}

#[test]
fn normalize_chw_per_channel() {
    let ctx = Ctx::new(EAGER);
    // Channel 0 = [4, 0], channel 1 = [7, 2]; mean [1, 2], std [2, 4]:
    // (4-1)/2, (0-1)/2, (7-2)/4, (2-2)/4 = 1.5, -0.5, 1.25, 0.
    let img = T::host(&[4u8, 0, 7, 2], U8, &[2, 1, 2], Some(c"CHW"));
    let a = Args::new()
        .floats(c"mean", &[1.0, 2.0])
        .floats(c"std", &[2.0, 4.0]);
    let r = run(&ctx, c"normalize", &[img.input()], Some(&a));
    assert_eq!(r.meta(), (F32, vec![2, 1, 2], "CHW".to_string()));
    assert_eq!(r.bytes(), f32_bytes(&[1.5, -0.5, 1.25, 0.0]));
    assert_eq!(values_f32(r.0), [1.5, -0.5, 1.25, 0.0]);
}

/// An int array for `mean` / `std` (a float-array argument) is converted, as a single
/// int is: `std = [1, 1, 1]` written with `ndx_args_set_int_array` used to fail with
/// NDX_ERROR_TYPE "argument 'std' is an int array, expected a float array".
#[test]
fn normalize_takes_int_arrays() {
    let ctx = Ctx::new(EAGER);
    // Pixels (4, 7) and (0, 2); mean [1, 2], std [2, 5]: 1.5, 1, -0.5, 0.
    let img = T::host(&[4u8, 7, 0, 2], U8, &[1, 2, 2], Some(c"HWC"));
    let a = Args::new().ints(c"mean", &[1, 2]).ints(c"std", &[2, 5]);
    let r = run(&ctx, c"normalize", &[img.input()], Some(&a));
    assert_eq!(r.meta(), (F32, vec![1, 2, 2], "HWC".to_string()));
    assert_eq!(values_f32(r.0), [1.5, 1.0, -0.5, 0.0]);
    // Mixed: a float array with an int array, and a zero in the int array is refused.
    let mixed = Args::new()
        .floats(c"mean", &[1.0, 2.0])
        .ints(c"std", &[2, 5]);
    let r = run(&ctx, c"normalize", &[img.input()], Some(&mixed));
    assert_eq!(values_f32(r.0), [1.5, 1.0, -0.5, 0.0]);
    let zero = Args::new().ints(c"mean", &[0]).ints(c"std", &[1, 0]);
    expect_invoke_err(
        &ctx,
        c"normalize",
        &[img.input()],
        Some(&zero),
        0,
        NDX_ERROR_VALUE,
        "'std'",
    );
}

/// A zero in `std` said only "'std' contains 0"; the message names the argument, the
/// index and value of its first zero, and what was expected.
#[test]
fn normalize_zero_std_names_its_index() {
    let ctx = Ctx::new(EAGER);
    let img = T::host(&[4u8, 7, 0, 2, 1, 1], U8, &[1, 2, 3], Some(c"HWC"));
    let a = Args::new()
        .floats(c"mean", &[0.0])
        .floats(c"std", &[1.0, -0.0, 0.0]);
    expect_invoke_err(
        &ctx,
        c"normalize",
        &[img.input()],
        Some(&a),
        0,
        NDX_ERROR_VALUE,
        "operator 'normalize': argument 'std' [1.0, -0.0, 0.0] has -0.0 at index 1; expected a non-zero \
         value",
    );
}

/// A `mean` or `std` of the wrong length said how many values it had and how many
/// channels the image has, but not what it accepts: one value, or one per channel.
#[test]
fn normalize_wrong_count_says_what_it_accepts() {
    let ctx = Ctx::new(EAGER);
    let img = T::host(&[4u8, 7, 0, 2, 1, 1], U8, &[1, 2, 3], Some(c"HWC"));
    let a = Args::new()
        .floats(c"mean", &[0.0, 1.0])
        .floats(c"std", &[1.0]);
    expect_invoke_err(
        &ctx,
        c"normalize",
        &[img.input()],
        Some(&a),
        0,
        NDX_ERROR_VALUE,
        "operator 'normalize': argument 'mean' has 2 values, the image has 3 channels; expected 1 \
         (for every channel) or 3",
    );
}

/// A reduction whose output keeps the input's rank keeps its layout: `argmax` /
/// `argmin` with keepdims gave no layout where `max` with keepdims gave "HWC" (so the
/// per-pixel argmax of an HWC image was no image for `resize`), and `sum` over no axis
/// (`axes = []`, the tensor unchanged in shape) dropped it unless keepdims was set.
#[test]
fn reductions_that_keep_the_rank_keep_the_layout() {
    let ctx = Ctx::new(EAGER);
    // Pixels (1, 9, 3), (7, 2, 7), (0, 0, 5), (4, 4, 4).
    let img = T::host(
        &[1u8, 9, 3, 7, 2, 7, 0, 0, 5, 4, 4, 4],
        U8,
        &[2, 2, 3],
        Some(c"HWC"),
    );
    let keep = |a: Args, on: bool| {
        ok(ndx_args_set_bool(a.0, c"keepdims".as_ptr(), on));
        a
    };
    let i64_bytes = |v: &[i64]| v.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();

    let am = run(
        &ctx,
        c"argmax",
        &[img.input()],
        Some(&keep(Args::new().int(c"axis", 2), true)),
    );
    assert_eq!(am.meta(), (I64, vec![2, 2, 1], "HWC".to_string()));
    assert_eq!(am.bytes(), i64_bytes(&[1, 0, 2, 0]));
    let an = run(
        &ctx,
        c"argmin",
        &[img.input()],
        Some(&keep(Args::new(), true)),
    );
    assert_eq!(an.meta(), (I64, vec![1, 1, 1], "HWC".to_string()));
    assert_eq!(an.bytes(), i64_bytes(&[6]));
    let flat = run(
        &ctx,
        c"argmax",
        &[img.input()],
        Some(&keep(Args::new().int(c"axis", -1), false)),
    );
    assert_eq!(flat.meta(), (I64, vec![2, 2], String::new()));
    // The argmax image is an image: resize takes it.
    let r = run(
        &ctx,
        c"resize",
        &[am.input()],
        Some(&Args::resize(1, 2, Some(c"nearest"))),
    );
    assert_eq!(r.meta(), (I64, vec![1, 2, 1], "HWC".to_string()));

    let none = run(
        &ctx,
        c"sum",
        &[img.input()],
        Some(&Args::new().ints(c"axes", &[])),
    );
    assert_eq!(none.meta(), (U64, vec![2, 2, 3], "HWC".to_string()));
    let mx = run(
        &ctx,
        c"max",
        &[img.input()],
        Some(&keep(Args::new().ints(c"axes", &[2]), true)),
    );
    assert_eq!(mx.meta(), (U8, vec![2, 2, 1], "HWC".to_string()));
    assert_eq!(mx.bytes(), [9, 7, 5, 4]);
    let sm = run(
        &ctx,
        c"sum",
        &[img.input()],
        Some(&Args::new().ints(c"axes", &[2])),
    );
    assert_eq!(sm.meta().2, "");
}

/// An elementwise result took the layout of its first input that had one, so an "HWC"
/// image plus a "CHW" tensor of the same shape claimed to be "HWC". Inputs of the
/// output's shape whose layouts differ now give no layout; where they agree, or only
/// one has one, it is kept.
#[test]
fn elementwise_layouts_that_disagree_give_none() {
    let ctx = Ctx::new(EAGER);
    let v = [1u8, 2, 3, 4, 5, 6];
    let hwc = T::host(&v, U8, &[1, 2, 3], Some(c"HWC"));
    let chw = T::host(&v, U8, &[1, 2, 3], Some(c"CHW"));
    let plain = T::host(&v, U8, &[1, 2, 3], None);
    let layout = |op: &CStr, ins: &[&T]| {
        let inputs: Vec<ndx_input_t> = ins.iter().map(|t| t.input()).collect();
        run(&ctx, op, &inputs, None).meta().2
    };
    assert_eq!(layout(c"add", &[&hwc, &chw]), "");
    assert_eq!(layout(c"add", &[&chw, &hwc]), "");
    assert_eq!(layout(c"eq", &[&hwc, &chw]), "");
    assert_eq!(layout(c"add", &[&hwc, &hwc]), "HWC");
    assert_eq!(layout(c"add", &[&plain, &chw]), "CHW");
    assert_eq!(layout(c"where", &[&plain, &hwc, &hwc]), "HWC");
    assert_eq!(layout(c"where", &[&chw, &hwc, &hwc]), "");
}

// ---- a ragged batch -------------------------------------------------------------------------

fn u8_spec(values: &[u8], shape: &[i64]) -> Spec {
    Spec {
        data: values.to_vec(),
        dtype: DLDataType {
            code: DLDataTypeCode::UINT,
            bits: 8,
            lanes: 1,
        },
        device: cpu(),
        shape: shape.to_vec(),
        strides: None,
        byte_offset: 0,
        ndim: None,
        null_data: false,
        null_shape: false,
        flags: DlpackFlags::empty(),
        major: 1,
    }
}

/// Two HWC uint8 images imported as one batch with layout "HWC" (DLPack is the only way
/// the C API builds a batch): 2x2x1 SMALL and 3x5x1 with pixel (y, x) = 50y + 10x.
/// Resized to 2x2: the first keeps its pixels (same size); the second samples
/// x = 0.75, 3.25 and y = 0.25, 1.75, and a linear blend of a linear image is exact:
/// 50y + 10x = 20, 45, 95, 120 (cv2.resize agrees).
#[test]
fn resize_of_a_ragged_batch_runs_per_sample() {
    let ctx = Ctx::new(EAGER);
    let big: Vec<u8> = (0..15)
        .map(|i| (50 * (i / 5) + 10 * (i % 5)) as u8)
        .collect();
    let specs = [u8_spec(&SMALL, &[2, 2, 1]), u8_spec(&big, &[3, 5, 1])];
    let (ptrs, counts): (Vec<_>, Vec<_>) = specs.iter().map(Spec::versioned).unzip();
    let opts = import_options(Some(c"HWC"), false);
    let batch = import_batch(&ptrs, &opts);
    let mut uniform = true;
    ok(ndx_batch_is_uniform(batch, &mut uniform));
    assert!(!uniform, "the input batch is ragged");

    let a = Args::resize(2, 2, None);
    let input = ndx_input_t {
        tensor: std::ptr::null(),
        batch,
    };
    let f = invoke(&ctx, c"resize", &[input], Some(&a), 0, line!()).unwrap_or_else(|e| {
        ok(e);
        unreachable!()
    });
    ok(ndx_future_wait(f, -1));
    // The output is a batch, not a tensor.
    let mut not_tensor = std::ptr::null_mut();
    let (kind, _) = take_error(ndx_future_tensor(f, 0, &mut not_tensor)).expect("an error");
    assert_eq!(kind, NDX_ERROR_TYPE as i32);
    assert!(not_tensor.is_null());
    let mut out = std::ptr::null_mut();
    ok(ndx_future_batch(f, 0, &mut out));
    ndx_future_release(f);

    let (mut n, mut dtype, mut ndim, mut layout) = (0usize, 0i32, 0i32, std::ptr::null());
    ok(ndx_batch_size(out, &mut n));
    ok(ndx_batch_dtype(out, &mut dtype));
    ok(ndx_batch_ndim(out, &mut ndim));
    ok(ndx_batch_layout(out, &mut layout));
    assert_eq!(
        (n, dtype, ndim, cstr(layout)),
        (2, U8, 3, "HWC".to_string())
    );
    ok(ndx_batch_is_uniform(out, &mut uniform));
    assert!(uniform, "every sample is 2x2x1 now");
    let expected: [[u8; 4]; 2] = [[0, 100, 200, 255], [20, 45, 95, 120]];
    for (i, want) in expected.iter().enumerate() {
        let mut s = std::ptr::null_mut();
        ok(ndx_batch_sample(out, i, &mut s));
        let s = T(s);
        assert_eq!(
            s.meta(),
            (U8, vec![2, 2, 1], "HWC".to_string()),
            "sample {i}"
        );
        assert_eq!(s.bytes(), want, "sample {i}");
    }
    // Uniform now: it stacks into one (2, 2, 2, 1) tensor with layout "NHWC".
    let mut stacked = std::ptr::null_mut();
    ok(ndx_batch_to_tensor(out, &mut stacked));
    let stacked = T(stacked);
    assert_eq!(stacked.meta(), (U8, vec![2, 2, 2, 1], "NHWC".to_string()));
    assert_eq!(stacked.bytes(), [0, 100, 200, 255, 20, 45, 95, 120]);
    drop(stacked);

    ndx_batch_release(out);
    ndx_batch_release(batch);
    drop(ctx);
    assert_eq!(counts.iter().map(calls).collect::<Vec<_>>(), [1, 1]);
}

// ---- eval modes ----------------------------------------------------------------------------------

#[test]
fn resize_gives_the_same_bytes_deferred_and_eager() {
    let img = T::host(&SMALL, U8, &[2, 2, 1], Some(c"HWC"));
    let a = Args::resize(4, 4, Some(c"linear"));
    for (mode, other) in [(DEFERRED, EAGER), (EAGER, DEFERRED)] {
        // The context's own mode, then the mode given per invocation to a context whose
        // default is the other one.
        for per_call in [false, true] {
            let ctx = Ctx::new(if per_call { other } else { mode });
            let call_mode = if per_call { mode } else { 0 };
            let f = invoke(
                &ctx,
                c"resize",
                &[img.input()],
                Some(&a),
                call_mode,
                line!(),
            )
            .unwrap_or_else(|e| {
                ok(e);
                unreachable!()
            });
            // Metadata is known before the work ran.
            let mut t = std::ptr::null_mut();
            ok(ndx_future_tensor(f, 0, &mut t));
            let pending = T(t);
            assert_eq!(pending.meta(), (U8, vec![4, 4, 1], "HWC".to_string()));
            if mode == DEFERRED {
                // Neither submits nor blocks: nothing has run, nothing failed.
                assert!(ndx_future_error(f).is_null());
            }
            ok(ndx_future_wait(f, -1));
            assert_eq!(
                ndx_future_poll(f),
                ndx_future_status_t::NDX_FUTURE_READY as i32
            );
            assert_eq!(
                pending.bytes(),
                RESIZED_4X4,
                "mode {mode}, per call {per_call}"
            );
            ndx_future_release(f);
            // A bad size is refused at ndx_invoke in this mode too.
            let bad = Args::resize(4, 0, None);
            expect_invoke_err(
                &ctx,
                c"resize",
                &[img.input()],
                Some(&bad),
                call_mode,
                NDX_ERROR_VALUE,
                "resize to h = 4, w = 0: argument 'w' is 0; expected a size >= 1",
            );
            ok(ndx_context_evaluate(ctx.0));
        }
    }
}
