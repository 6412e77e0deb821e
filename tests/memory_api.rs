//! Sizes that follow the data never abort the process: where an invocation needs more
//! host memory than the system grants — the compact copy of a broadcast view, the
//! accumulators of a reduction over an empty axis, an output — its work fails with
//! `NDX_ERROR_MEMORY` naming what it was for and how much, at the invocation's site,
//! and the context goes on working. (`vec![0; n]` or `Vec::with_capacity(n)` would
//! call Rust's allocation-failure handler, which aborts.)
//!
//! Every size asked for here is beyond any address space (2^44 elements and more), so
//! every system refuses it, whatever its overcommit policy.

mod common;

use std::ffi::{CStr, c_void};

use common::*;
use ndx::ffi::ndx_error_kind_t::*;
use ndx::ffi::*;

const U8: i32 = ndx_dtype_t::NDX_DTYPE_UINT8 as i32;
const F32: i32 = ndx_dtype_t::NDX_DTYPE_FLOAT32 as i32;
const SYNC_CPU: i32 = ndx_eval_mode_t::NDX_EVAL_SYNC_CPU as i32;
const DEFERRED: i32 = ndx_eval_mode_t::NDX_EVAL_DEFERRED as i32;
const EAGER: i32 = ndx_eval_mode_t::NDX_EVAL_EAGER as i32;

/// A view of `one` element repeated over `shape` (all strides 0), with a layout.
fn broadcast<E>(one: &E, dtype: i32, shape: &[i64], layout: Option<&CStr>) -> T {
    let strides = vec![0i64; shape.len()];
    let opts = import_options(layout, true);
    let mut t = std::ptr::null_mut();
    ok(ndx_tensor_wrap_host(
        (one as *const E).cast_mut().cast::<c_void>(),
        dtype,
        shape.len() as i32,
        shape.as_ptr(),
        strides.as_ptr(),
        None,
        std::ptr::null_mut(),
        &opts,
        &mut t,
    ));
    T(t)
}

/// Runs `op` in `mode` and returns its error, or `None` when it succeeded; the frame
/// of an error must be the invocation's explicit location.
fn run(ctx: &Ctx, op: &CStr, inputs: &[ndx_input_t], args: Option<&Args>) -> Option<String> {
    let line = line!() + 2;
    let opts = ndx_invoke_options_t {
        location: ndx_location_t {
            file: c"memory_api.rs".as_ptr(),
            line,
            function: c"run".as_ptr(),
        },
        ..Default::default()
    };
    let args = args.map_or(std::ptr::null(), |a| a.0.cast_const());
    let e = match invoke_with(ctx, op, inputs, args, &opts) {
        Ok(f) => {
            let e = ndx_future_wait(f, -1);
            ndx_future_release(f);
            e
        }
        Err(e) => e,
    };
    if e.is_null() {
        return None;
    }
    assert_eq!(cstr(ndx_error_op(e)), op.to_str().unwrap());
    let fr = frame(e, 0);
    assert_eq!(
        (cstr(fr.file), fr.line),
        ("memory_api.rs".to_string(), line)
    );
    let (kind, msg) = take_error(e).unwrap();
    assert_eq!(kind, NDX_ERROR_MEMORY as i32, "{msg}");
    Some(msg)
}

/// The message of a refused host allocation of `bytes`, after what it was for.
fn refused(bytes: &str) -> String {
    format!("cannot allocate {bytes} of host memory: ")
}

/// Kernels that compact a broadcast input first (reductions, cast, concat, pad, the
/// image operators): the copy is refused, naming the tensor; then the context still
/// computes.
#[test]
fn a_broadcast_input_too_large_to_compact_is_a_memory_error() {
    let one = 1.5f32;
    let big = broadcast(&one, F32, &[1 << 44], None);
    let pixel = 9u8;
    let image = broadcast(&pixel, U8, &[1 << 22, 1 << 22, 3], Some(c"HWC"));
    for mode in [SYNC_CPU, DEFERRED, EAGER] {
        let ctx = Ctx::new(mode);
        for op in [c"sum", c"max", c"argmax", c"all", c"concat", c"pad"] {
            let args = (op == c"pad").then(|| Args::new().ints(c"widths", &[1, 1]));
            let msg = run(&ctx, op, &[big.input()], args.as_ref())
                .unwrap_or_else(|| panic!("{op:?} of a 64 TiB view succeeded"));
            let want = format!(
                "a compact copy of the float32 tensor of shape [17592186044416]: {}",
                refused("64.00 TiB (70368744177664 bytes)")
            );
            assert!(msg.contains(&want), "{op:?}: {msg:?} lacks {want:?}");
        }
        let norm = Args::new().floats(c"mean", &[0.5]).floats(c"std", &[2.0]);
        let msg = run(&ctx, c"normalize", &[image.input()], Some(&norm)).unwrap();
        let want = format!(
            "a compact copy of the uint8 tensor of shape [4194304, 4194304, 3]: {}",
            refused("48.00 TiB (52776558133248 bytes)")
        );
        assert!(msg.contains(&want), "{msg:?} lacks {want:?}");
        // The context still works: the sum of a small view of the same element.
        let small = broadcast(&one, F32, &[4], None);
        assert_eq!(run(&ctx, c"sum", &[small.input()], None), None);
    }
}

/// A reduction over an empty axis has an output for every other index and no input
/// to bound it: its accumulators are refused, naming the output.
#[test]
fn accumulators_of_a_huge_output_over_an_empty_axis_are_a_memory_error() {
    let nothing = [0f32; 1];
    let ctx = Ctx::new(EAGER);
    for (shape, axes, out) in [
        (vec![1i64 << 44, 0], vec![1i64], "[17592186044416]"),
        (vec![0, 1 << 44], vec![0], "[17592186044416]"),
        (vec![1 << 22, 0, 1 << 22], vec![1], "[4194304, 4194304]"),
    ] {
        let empty = T(wrap_host(
            nothing.as_ptr().cast_mut().cast(),
            F32,
            &shape,
            None,
            true,
        ));
        for op in [c"sum", c"mean", c"prod"] {
            let args = Args::new().ints(c"axes", &axes);
            let msg = run(&ctx, op, &[empty.input()], Some(&args))
                .unwrap_or_else(|| panic!("{op:?} over {shape:?} succeeded"));
            let want = format!(
                "the accumulators of the output of shape {out}: {}",
                refused("128.00 TiB (140737488355328 bytes)")
            );
            assert!(
                msg.contains(&want),
                "{op:?} {shape:?}: {msg:?} lacks {want:?}"
            );
        }
    }
}

/// `normalize` with one mean and std for all channels does not repeat them per
/// channel: an image with no pixels and 2^44 channels normalises to an empty image.
#[test]
fn normalize_of_an_empty_image_with_countless_channels_succeeds() {
    let pixel = 0u8;
    let image = broadcast(&pixel, U8, &[0, 0, 1 << 44], Some(c"HWC"));
    let ctx = Ctx::new(SYNC_CPU);
    let norm = Args::new().floats(c"mean", &[0.5]).floats(c"std", &[2.0]);
    assert_eq!(run(&ctx, c"normalize", &[image.input()], Some(&norm)), None);
}

/// `ndx_tensor_from_host` of a view too large to copy says so, naming the copy, and
/// leaves the out-param NULL.
#[test]
fn from_host_of_a_view_too_large_to_copy_is_a_memory_error() {
    let one = 2.5f32;
    let (shape, strides) = ([1i64 << 44], [0i64]);
    let mut t = 0x5a5a_5a5ausize as *mut ndx_tensor_t;
    let e = ndx_tensor_from_host(
        (&one as *const f32).cast::<c_void>(),
        F32,
        1,
        shape.as_ptr(),
        strides.as_ptr(),
        std::ptr::null(),
        &mut t,
    );
    assert!(t.is_null(), "the out-param is NULL after an error");
    expect_err(
        e,
        NDX_ERROR_MEMORY,
        "the copy of shape [17592186044416] (float32): cannot allocate 64.00 TiB \
         (70368744177664 bytes) of host memory: ",
    );
}
