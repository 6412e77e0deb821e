//! Out tensors (`ndx_invoke_options_t.outputs`) and the `batch_to_tensor` operator
//! through the C API, called from Rust: results land in caller memory in every mode
//! (compact, strided, in place over an input, after a promoting cast), the future's
//! output is a view of that memory, batches write per sample, and every mismatch is
//! refused at `ndx_invoke` with a message naming the out tensor (or, for a host
//! operator that infers nothing, fails the future). Mirrors `tests/c/test_out.c`.

mod common;

use std::ffi::{CStr, c_void};

use common::*;
use ndx::ffi::ndx_error_kind_t::*;
use ndx::ffi::*;

const F32: i32 = ndx_dtype_t::NDX_DTYPE_FLOAT32 as i32;
const F64: i32 = ndx_dtype_t::NDX_DTYPE_FLOAT64 as i32;
const I8: i32 = ndx_dtype_t::NDX_DTYPE_INT8 as i32;
const SYNC: i32 = ndx_eval_mode_t::NDX_EVAL_SYNC_CPU as i32;
const DEFERRED: i32 = ndx_eval_mode_t::NDX_EVAL_DEFERRED as i32;
const EAGER: i32 = ndx_eval_mode_t::NDX_EVAL_EAGER as i32;

impl T {
    /// A view of the caller's `data` (no copy, no deleter), maybe strided or read-only.
    fn wrap<E>(data: &mut [E], dtype: i32, shape: &[i64], strides: Option<&[i64]>) -> T {
        T::raw(data.as_mut_ptr().cast(), dtype, shape, strides, false)
    }

    /// A view of caller memory at `data` (the tests keep it alive and in bounds).
    fn raw(
        data: *mut c_void,
        dtype: i32,
        shape: &[i64],
        strides: Option<&[i64]>,
        read_only: bool,
    ) -> T {
        T(wrap_host(data, dtype, shape, strides, read_only))
    }

    fn out(&self) -> ndx_output_t {
        ndx_output_t {
            tensor: self.0,
            batch: std::ptr::null(),
        }
    }
}

/// `ndx_invoke` with out tensors (and the context's mode when `mode` is 0).
fn invoke(
    ctx: &Ctx,
    op: &CStr,
    inputs: &[ndx_input_t],
    args: *const ndx_args_t,
    outputs: &[ndx_output_t],
    mode: i32,
) -> Result<*mut ndx_future_t, *mut ndx_error_t> {
    let opts = invoke_options(mode, outputs);
    invoke_with(ctx, op, inputs, args, &opts)
}

/// Waits for `f` (which must succeed) and returns its output 0.
fn output(f: *mut ndx_future_t) -> T {
    ok(ndx_future_wait(f, -1));
    let mut t = std::ptr::null_mut();
    ok(ndx_future_tensor(f, 0, &mut t));
    ndx_future_release(f);
    T(t)
}

/// The address of element 0 of a tensor (through a DLPack export).
fn data_address(t: &T) -> usize {
    let mut m = std::ptr::null_mut();
    ok(ndx_tensor_to_dlpack_versioned(t.0, &mut m));
    // SAFETY: a live export we own until its deleter runs below.
    let addr = unsafe { (*m).dl_tensor.data as usize + (*m).dl_tensor.byte_offset as usize };
    // SAFETY: releasing our export once through its own deleter.
    unsafe { ((*m).deleter.expect("deleter"))(m) };
    addr
}

fn expect_invoke_err(
    ctx: &Ctx,
    op: &CStr,
    inputs: &[ndx_input_t],
    outputs: &[ndx_output_t],
    kind: ndx_error_kind_t,
    fragment: &str,
) {
    match invoke(ctx, op, inputs, std::ptr::null(), outputs, 0) {
        Ok(f) => {
            ndx_future_release(f);
            panic!("'{op:?}' was accepted; expected {fragment:?}");
        }
        Err(e) => expect_err(e, kind, fragment),
    }
}

#[test]
fn add_writes_into_the_out_tensor_in_every_mode() {
    for mode in [SYNC, EAGER, DEFERRED] {
        let ctx = Ctx::new(mode);
        let a = T::copy(&[1f32, 2., 3., 4., 5., 6.], F32, &[2, 3]);
        let b = T::copy(&[10f32, 20., 30.], F32, &[3]);
        let mut buf = vec![0f32; 6];
        let out = T::wrap(&mut buf, F32, &[2, 3], None);
        let f = invoke(
            &ctx,
            c"add",
            &[a.input(), b.input()],
            std::ptr::null(),
            &[out.out()],
            0,
        )
        .unwrap_or_else(|e| {
            ok(e);
            unreachable!()
        });
        let r = output(f);
        assert_eq!(
            values_f32(r.0),
            [11., 22., 33., 14., 25., 36.],
            "mode {mode}"
        );
        assert_eq!(data_address(&r), buf.as_ptr() as usize, "mode {mode}");
        drop((r, out));
        assert_eq!(buf, [11., 22., 33., 14., 25., 36.], "mode {mode}");
    }
}

/// An out tensor at an address its dtype is not aligned to (nothing asks for more)
/// gets the result in every mode: the kernel does not write its output there
/// directly, through typed slices that need alignment (its cast panicked, an INTERNAL
/// failure of the future); the result is copied in.
#[test]
fn a_misaligned_out_tensor_gets_the_result_in_every_mode() {
    for mode in [SYNC, EAGER, DEFERRED] {
        let ctx = Ctx::new(mode);
        let a = T::copy(&[1f32, -2., 3.], F32, &[3]);
        let mut buf = [0u32; 4];
        // SAFETY: byte 1 of 16; the 12 bytes of the out tensor stay inside.
        let at = unsafe { buf.as_mut_ptr().cast::<u8>().add(1) };
        let out = T::raw(at.cast(), F32, &[3], None, false);
        let f = invoke(
            &ctx,
            c"neg",
            &[a.input()],
            std::ptr::null(),
            &[out.out()],
            0,
        )
        .unwrap_or_else(|e| {
            ok(e);
            unreachable!()
        });
        let r = output(f);
        assert_eq!(values_f32(r.0), [-1., 2., -3.], "mode {mode}");
        assert_eq!(data_address(&r), at as usize, "mode {mode}");
        drop((r, out));
        // SAFETY: the 16 bytes of `buf`, which nothing else uses any more.
        let bytes = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), 16) };
        let written: Vec<f32> = bytes[1..13]
            .chunks(4)
            .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(written, [-1., 2., -3.], "mode {mode}");
    }
}

#[test]
fn deferred_work_writes_only_when_it_runs() {
    let ctx = Ctx::new(DEFERRED);
    let a = T::copy(&[1f32, 2.], F32, &[2]);
    let mut buf = vec![-1f32; 2];
    let out = T::wrap(&mut buf, F32, &[2], None);
    let args = args_with(|a| ok(ndx_args_set_float(a, c"lo".as_ptr(), 1.5)));
    let f = invoke(&ctx, c"clamp", &[a.input()], args.0, &[out.out()], 0).unwrap();
    // SAFETY: reading the caller's buffer, which nothing writes while DEFERRED work
    // is only recorded.
    let before = unsafe { std::ptr::read_volatile(buf.as_ptr()) };
    assert_eq!(before, -1.0);
    ok(ndx_context_evaluate(ctx.0));
    ndx_future_release(f);
    drop(out);
    assert_eq!(buf, [1.5, 2.0]);
}

#[test]
fn strided_out_tensors_are_written_element_by_element() {
    let ctx = Ctx::new(SYNC);
    let a = T::copy(&[1f32, 2., 3., 4.], F32, &[2, 2]);
    // Columns 1 and 2 of a 2 x 4 buffer, and the reversed rows of a 4-element one.
    let mut buf = vec![0f32; 8];
    let shifted = T::raw(
        buf[1..].as_mut_ptr().cast(),
        F32,
        &[2, 2],
        Some(&[4, 1]),
        false,
    );
    let r = output(
        invoke(
            &ctx,
            c"neg",
            &[a.input()],
            std::ptr::null(),
            &[shifted.out()],
            0,
        )
        .unwrap(),
    );
    assert_eq!(values_f32(r.0), [-1., -2., -3., -4.]);
    assert_eq!(strides_of(r.0), [4, 1], "the result is the out view");
    drop((r, shifted));
    assert_eq!(buf, [0., -1., -2., 0., 0., -3., -4., 0.]);

    let mut rev = vec![0f32; 4];
    let reversed = T::raw(rev[3..].as_mut_ptr().cast(), F32, &[4], Some(&[-1]), false);
    let v = T::copy(&[1f32, 2., 3., 4.], F32, &[4]);
    drop(output(
        invoke(
            &ctx,
            c"abs",
            &[v.input()],
            std::ptr::null(),
            &[reversed.out()],
            0,
        )
        .unwrap(),
    ));
    drop(reversed);
    assert_eq!(rev, [4., 3., 2., 1.]);
}

#[test]
fn an_input_may_be_its_own_out_tensor() {
    let ctx = Ctx::new(EAGER);
    let mut buf = vec![1f32, 2., 3., 4.];
    let x = T::wrap(&mut buf, F32, &[4], None);
    // x[::-1] + x into x: every input element is read before any is overwritten.
    let reversed = T::raw(buf[3..].as_mut_ptr().cast(), F32, &[4], Some(&[-1]), false);
    let r = output(
        invoke(
            &ctx,
            c"add",
            &[reversed.input(), x.input()],
            std::ptr::null(),
            &[x.out()],
            0,
        )
        .unwrap(),
    );
    assert_eq!(values_f32(r.0), [5., 5., 5., 5.]);
    drop((r, reversed, x));
    assert_eq!(buf, [5., 5., 5., 5.]);
}

#[test]
fn promoted_and_reduced_results_land_in_the_out_tensor() {
    let ctx = Ctx::new(SYNC);
    // int8 + float32 computes in float32 after a cast of the same shape as the output.
    let a = T::copy(&[1i8, -2, 3], I8, &[3]);
    let b = T::copy(&[0.5f32, 0.25, 0.125], F32, &[3]);
    let mut buf = vec![0f32; 3];
    let out = T::wrap(&mut buf, F32, &[3], None);
    drop(output(
        invoke(
            &ctx,
            c"add",
            &[a.input(), b.input()],
            std::ptr::null(),
            &[out.out()],
            0,
        )
        .unwrap(),
    ));
    drop(out);
    assert_eq!(buf, [1.5, -1.75, 3.125]);

    let m = T::copy(&[1f64, 2., 3., 4., 5., 6.], F64, &[2, 3]);
    let mut sums = vec![0f64; 3];
    let out = T::wrap(&mut sums, F64, &[3], None);
    let args = args_with(|a| {
        ok(ndx_args_set_int_array(
            a,
            c"axes".as_ptr(),
            [0i64].as_ptr(),
            1,
        ))
    });
    drop(output(
        invoke(&ctx, c"sum", &[m.input()], args.0, &[out.out()], 0).unwrap(),
    ));
    drop(out);
    assert_eq!(sums, [5., 7., 9.]);
}

#[test]
fn mismatched_out_tensors_are_refused_at_invoke() {
    let ctx = Ctx::new(EAGER);
    let a = T::copy(&[1f32, 2., 3., 4.], F32, &[2, 2]);
    let ins = [a.input(), a.input()];
    let mut f64s = vec![0f64; 4];
    let wrong_dtype = T::wrap(&mut f64s, F64, &[2, 2], None);
    expect_invoke_err(
        &ctx,
        c"add",
        &ins,
        &[wrong_dtype.out()],
        NDX_ERROR_VALUE,
        "operator 'add': outputs[0] is float64 [2, 2], expected float32 [2, 2]",
    );
    let mut f32s = vec![0f32; 4];
    let wrong_shape = T::wrap(&mut f32s, F32, &[4], None);
    expect_invoke_err(
        &ctx,
        c"add",
        &ins,
        &[wrong_shape.out()],
        NDX_ERROR_VALUE,
        "outputs[0] is float32 [4], expected float32 [2, 2]",
    );
    drop(wrong_shape);
    let read_only = T::raw(f32s.as_mut_ptr().cast(), F32, &[2, 2], None, true);
    expect_invoke_err(
        &ctx,
        c"add",
        &ins,
        &[read_only.out()],
        NDX_ERROR_VALUE,
        "outputs[0] is read-only",
    );
    drop(read_only);
    let broadcast = T::wrap(&mut f32s, F32, &[2, 2], Some(&[0, 1]));
    expect_invoke_err(
        &ctx,
        c"add",
        &ins,
        &[broadcast.out()],
        NDX_ERROR_VALUE,
        "outputs[0] has strides [0, 1] for shape [2, 2], which give one element several indices",
    );
    drop(broadcast);
    let out = T::wrap(&mut f32s, F32, &[2, 2], None);
    expect_invoke_err(
        &ctx,
        c"add",
        &ins,
        &[out.out(), out.out()],
        NDX_ERROR_VALUE,
        "operator 'add': 2 out tensors given, but it has 1 output",
    );
    let both = ndx_output_t {
        tensor: out.0,
        batch: std::ptr::dangling::<ndx_batch_t>(),
    };
    expect_invoke_err(
        &ctx,
        c"add",
        &ins,
        &[both],
        NDX_ERROR_VALUE,
        "opts->outputs[0] has both a tensor and a batch",
    );
    let opts = ndx_invoke_options_t {
        n_outputs: 1,
        ..Default::default()
    };
    let mut f = std::ptr::null_mut();
    expect_err(
        ndx_invoke(
            ctx.0,
            c"add".as_ptr(),
            ins.as_ptr(),
            2,
            std::ptr::null(),
            &opts,
            &mut f,
        ),
        NDX_ERROR_VALUE,
        "opts->outputs is NULL but opts->n_outputs is 1",
    );
    assert!(f.is_null());
    // A pending output of another invocation holds no data yet.
    let deferred = invoke(&ctx, c"neg", &[a.input()], std::ptr::null(), &[], DEFERRED).unwrap();
    let mut pending = std::ptr::null_mut();
    ok(ndx_future_tensor(deferred, 0, &mut pending));
    let pending = T(pending);
    expect_invoke_err(
        &ctx,
        c"add",
        &ins,
        &[pending.out()],
        NDX_ERROR_VALUE,
        "opts->outputs[0] is the output of 'neg' (#1), which is still pending",
    );
    ndx_future_release(deferred);
    drop(pending);
    // Nothing was written by the refused calls.
    drop(out);
    assert_eq!(f32s, [0.0; 4]);
}

#[test]
fn old_callers_without_the_out_fields_are_accepted() {
    let ctx = Ctx::new(SYNC);
    let a = T::copy(&[1f32, -2.], F32, &[2]);
    let opts = ndx_invoke_options_t {
        struct_size: std::mem::offset_of!(ndx_invoke_options_t, outputs),
        outputs: std::ptr::dangling::<ndx_output_t>(), // beyond the old struct: never read
        n_outputs: 3,
        ..Default::default()
    };
    let mut f = std::ptr::null_mut();
    ok(ndx_invoke(
        ctx.0,
        c"abs".as_ptr(),
        &a.input(),
        1,
        std::ptr::null(),
        &opts,
        &mut f,
    ));
    assert_eq!(values_f32(output(f).0), [1., 2.]);
}

/// Owns an argument builder filled by `fill`.
struct A(*mut ndx_args_t);

impl Drop for A {
    fn drop(&mut self) {
        ndx_args_free(self.0);
    }
}

fn args_with(fill: impl FnOnce(*mut ndx_args_t)) -> A {
    let mut a = std::ptr::null_mut();
    ok(ndx_args_new(&mut a));
    fill(a);
    A(a)
}

fn batch_in(b: *const ndx_batch_t) -> ndx_input_t {
    ndx_input_t {
        tensor: std::ptr::null(),
        batch: b,
    }
}

fn batch_out(b: *const ndx_batch_t) -> ndx_output_t {
    ndx_output_t {
        tensor: std::ptr::null(),
        batch: b,
    }
}

fn sample_values(b: *const ndx_batch_t, i: usize) -> Vec<f32> {
    let mut t = std::ptr::null_mut();
    ok(ndx_batch_sample(b, i, &mut t));
    let t = T(t);
    values_f32(t.0)
}

#[test]
fn batches_write_per_sample_into_an_out_batch() {
    let ctx = Ctx::new(EAGER);
    let (input, in_counts) = f32_batch(&[(&[1., -2.], &[2]), (&[-3., 4., -5.], &[3])]);
    let (out, out_counts) = f32_batch(&[(&[0., 0.], &[2]), (&[0., 0., 0.], &[3])]);
    let ins = [batch_in(input)];
    let outs = [batch_out(out)];
    let f = invoke(&ctx, c"abs", &ins, std::ptr::null(), &outs, 0).unwrap();
    ok(ndx_future_wait(f, -1));
    ndx_future_release(f);
    assert_eq!(sample_values(out, 0), [1., 2.]);
    assert_eq!(sample_values(out, 1), [3., 4., 5.]);

    let (short, short_counts) = f32_batch(&[(&[0., 0.], &[2])]);
    let outs = [batch_out(short)];
    expect_invoke_err(
        &ctx,
        c"abs",
        &ins,
        &outs,
        NDX_ERROR_VALUE,
        "outputs[0] is a batch of 1 samples, expected 2",
    );
    let (ragged, ragged_counts) = f32_batch(&[(&[0., 0.], &[2]), (&[0., 0.], &[2])]);
    let outs = [batch_out(ragged)];
    expect_invoke_err(
        &ctx,
        c"abs",
        &ins,
        &outs,
        NDX_ERROR_VALUE,
        "outputs[0] sample 1 is float32 [2], expected float32 [3]",
    );
    let mut buf = vec![0f32; 2];
    let t = T::wrap(&mut buf, F32, &[2], None);
    expect_invoke_err(
        &ctx,
        c"abs",
        &ins,
        &[t.out()],
        NDX_ERROR_TYPE,
        "outputs[0] is a tensor, but output 0 is a batch",
    );
    for b in [input, out, short, ragged] {
        ndx_batch_release(b);
    }
    drop(ctx);
    for c in [in_counts, out_counts, short_counts, ragged_counts]
        .iter()
        .flatten()
    {
        assert_eq!(calls(c), 1, "every producer tensor is released once");
    }
}

/// An out tensor or batch must hold data: the output of an invocation that failed is
/// refused with that failure's message, a pending batch output like a pending tensor;
/// a batch for a tensor output is a type error, as `ndx_future_batch` of a tensor
/// output is. Nothing is written by the refused calls.
#[test]
fn failed_or_pending_outputs_and_batches_for_tensors_are_refused() {
    let ctx = Ctx::new(SYNC);
    let i32s = ndx_dtype_t::NDX_DTYPE_INT32 as i32;
    let (n, d) = (
        T::copy(&[1i32, 2], i32s, &[2]),
        T::copy(&[1i32, 0], i32s, &[2]),
    );
    let failed = invoke(
        &ctx,
        c"div",
        &[n.input(), d.input()],
        std::ptr::null(),
        &[],
        0,
    )
    .unwrap();
    let err = ndx_future_wait(failed, -1);
    expect_err(err, NDX_ERROR_VALUE, "division by zero");
    let mut t = std::ptr::null_mut();
    ok(ndx_future_tensor(failed, 0, &mut t));
    let failed_out = T(t);
    expect_invoke_err(
        &ctx,
        c"neg",
        &[n.input()],
        &[failed_out.out()],
        NDX_ERROR_VALUE,
        "opts->outputs[0] is the output of 'div' (#1), which failed: integer division by zero (output element 1)",
    );
    ndx_future_release(failed);

    let (input, in_counts) = f32_batch(&[(&[1., -2.], &[2]), (&[-3.], &[1])]);
    let deferred = invoke(
        &ctx,
        c"abs",
        &[batch_in(input)],
        std::ptr::null(),
        &[],
        DEFERRED,
    )
    .unwrap();
    let mut pending = std::ptr::null_mut();
    ok(ndx_future_batch(deferred, 0, &mut pending));
    expect_invoke_err(
        &ctx,
        c"neg",
        &[batch_in(input)],
        &[batch_out(pending)],
        NDX_ERROR_VALUE,
        "opts->outputs[0] is the output of 'abs' (#2), which is still pending",
    );
    let mut as_tensor = 0x5a5a_usize as *mut ndx_tensor_t;
    expect_err(
        ndx_future_tensor(deferred, 0, &mut as_tensor),
        NDX_ERROR_TYPE,
        "output 0 of 'abs' (#2) is a batch; use ndx_future_batch",
    );
    assert!(as_tensor.is_null());
    ndx_future_release(deferred);
    ndx_batch_release(pending);

    let (out, out_counts) = f32_batch(&[(&[0., 0.], &[2])]);
    let x = T::copy(&[1f32, -2.], F32, &[2]);
    expect_invoke_err(
        &ctx,
        c"neg",
        &[x.input()],
        &[batch_out(out)],
        NDX_ERROR_TYPE,
        "outputs[0] is a batch, but output 0 is a tensor",
    );
    assert_eq!(sample_values(out, 0), [0.0, 0.0], "nothing written");
    let f = invoke(&ctx, c"neg", &[x.input()], std::ptr::null(), &[], 0).unwrap();
    let mut as_batch = 0x5a5a_usize as *mut ndx_batch_t;
    expect_err(
        ndx_future_batch(f, 0, &mut as_batch),
        NDX_ERROR_TYPE,
        "output 0 of 'neg' (#3) is a tensor; use ndx_future_tensor",
    );
    assert!(as_batch.is_null());
    ndx_future_release(f);
    for b in [input, out] {
        ndx_batch_release(b);
    }
    drop(ctx);
    for c in in_counts.iter().chain(&out_counts) {
        assert_eq!(calls(c), 1, "every producer tensor is released once");
    }
}

#[test]
fn batch_to_tensor_stacks_a_batch_or_tensors_into_an_out_tensor() {
    let ctx = Ctx::new(DEFERRED);
    let (b, _counts) = f32_batch(&[(&[1., 2.], &[2]), (&[3., 4.], &[2]), (&[5., 6.], &[2])]);
    let ins = [batch_in(b)];
    let mut buf = vec![0f32; 6];
    let out = T::wrap(&mut buf, F32, &[3, 2], None);
    let f = invoke(
        &ctx,
        c"batch_to_tensor",
        &ins,
        std::ptr::null(),
        &[out.out()],
        0,
    )
    .unwrap();
    let mut r = std::ptr::null_mut();
    ok(ndx_future_tensor(f, 0, &mut r));
    let r = T(r);
    assert_eq!(shape_of(r.0), [3, 2], "inferred before running");
    assert_eq!(values_f32(r.0), [1., 2., 3., 4., 5., 6.]);
    ndx_future_release(f);
    drop((r, out));
    assert_eq!(buf, [1., 2., 3., 4., 5., 6.]);

    // Tensors stand for the samples; a ragged set fails at invoke naming the sample.
    let x = T::copy(&[7f32, 8.], F32, &[2]);
    let y = T::copy(&[9f32, 10., 11.], F32, &[3]);
    let r = output(
        invoke(
            &ctx,
            c"batch_to_tensor",
            &[x.input(), x.input()],
            std::ptr::null(),
            &[],
            0,
        )
        .unwrap(),
    );
    assert_eq!(shape_of(r.0), [2, 2]);
    assert_eq!(values_f32(r.0), [7., 8., 7., 8.]);
    expect_invoke_err(
        &ctx,
        c"batch_to_tensor",
        &[x.input(), y.input()],
        &[],
        NDX_ERROR_VALUE,
        "operator 'batch_to_tensor': cannot stack a ragged batch: sample 1 has shape [3], sample 0 has shape [2]",
    );
    let i8s = T::copy(&[1i8, 2], I8, &[2]);
    expect_invoke_err(
        &ctx,
        c"batch_to_tensor",
        &[x.input(), i8s.input()],
        &[],
        NDX_ERROR_TYPE,
        "sample 1 is int8, sample 0 is float32",
    );
    // So does a set whose layouts differ (the kernel could not make it a batch).
    let mut w = std::ptr::null_mut();
    let opts = import_options(Some(c"W"), false);
    let data = [7f32, 8.];
    let shape = [2i64];
    ok(ndx_tensor_from_host(
        data.as_ptr().cast(),
        F32,
        1,
        shape.as_ptr(),
        std::ptr::null(),
        &opts,
        &mut w,
    ));
    let w = T(w);
    for pair in [[w.input(), x.input()], [x.input(), w.input()]] {
        expect_invoke_err(
            &ctx,
            c"batch_to_tensor",
            &pair,
            &[],
            NDX_ERROR_VALUE,
            "sample 1 has layout",
        );
    }
    let r = output(
        invoke(
            &ctx,
            c"batch_to_tensor",
            &[w.input(), w.input()],
            std::ptr::null(),
            &[],
            0,
        )
        .unwrap(),
    );
    let mut layout = std::ptr::null();
    ok(ndx_tensor_layout(r.0, &mut layout));
    assert_eq!(cstr(layout), "NW");
    assert_eq!(values_f32(r.0), [7., 8., 7., 8.]);
    expect_invoke_err(
        &ctx,
        c"batch_to_tensor",
        &[x.input(), batch_in(b)],
        &[],
        NDX_ERROR_TYPE,
        "input 1 is a batch; give one batch, or tensors as its samples",
    );
    expect_invoke_err(
        &ctx,
        c"batch_to_tensor",
        &[],
        &[],
        NDX_ERROR_VALUE,
        "expected a batch or at least 1 tensor",
    );
    ndx_batch_release(b);
}

/// A host kernel with two float32 [3] outputs that makes output 1 before output 0:
/// output 0 is [1, 2, 3], output 1 is [4, 5, 6].
unsafe extern "C" fn second_output_first(
    _user: *mut c_void,
    _inputs: *const *const ndx_tensor_t,
    _n_inputs: usize,
    _args: *const ndx_args_t,
    outputs: *mut *mut ndx_tensor_t,
    _n_outputs: usize,
) -> *mut ndx_error_t {
    let n = 3i64;
    let make = |values: &[f32; 3], k: usize| {
        // SAFETY: ndx passes `n_outputs` (2) output slots.
        let slot = unsafe { &mut *outputs.add(k) };
        let (strides, opts) = (std::ptr::null(), std::ptr::null());
        ndx_tensor_from_host(values.as_ptr().cast(), F32, 1, &n, strides, opts, slot)
    };
    let e = make(&[4., 5., 6.], 1);
    if !e.is_null() {
        return e;
    }
    make(&[1., 2., 3.], 0)
}

/// Registers `second_output_first` as operator "two" (1 input, 2 outputs) on `ctx`.
fn register_second_output_first(ctx: &Ctx) {
    let schema = common::schema(1, 2);
    ok(ndx_register_op(
        ctx.0,
        c"two".as_ptr(),
        &schema,
        Some(second_output_first),
        std::ptr::null_mut(),
        None,
    ));
}

#[test]
fn a_host_kernel_making_its_outputs_out_of_order_fills_each_out_tensor() {
    for mode in [SYNC, EAGER, DEFERRED] {
        let ctx = Ctx::new(mode);
        register_second_output_first(&ctx);
        let x = T::copy(&[0f32], F32, &[1]);
        let (mut first, mut second) = (vec![0f32; 3], vec![0f32; 3]);
        let o0 = T::wrap(&mut first, F32, &[3], None);
        let o1 = T::wrap(&mut second, F32, &[3], None);
        let f = invoke(
            &ctx,
            c"two",
            &[x.input()],
            std::ptr::null(),
            &[o0.out(), o1.out()],
            0,
        )
        .unwrap();
        ok(ndx_future_wait(f, -1));
        let mut r1 = std::ptr::null_mut();
        ok(ndx_future_tensor(f, 1, &mut r1));
        let r1 = T(r1);
        assert_eq!(values_f32(r1.0), [4., 5., 6.], "mode {mode}");
        assert_eq!(data_address(&r1), second.as_ptr() as usize, "mode {mode}");
        ndx_future_release(f);
        drop((r1, o0, o1));
        // Each output lands in its own out tensor, whatever order they were made in.
        assert_eq!(
            (first, second),
            (vec![1., 2., 3.], vec![4., 5., 6.]),
            "mode {mode}"
        );
    }
}

/// An out tensor for one output of a host kernel is not lent to the kernel's
/// allocations: the kernel made output 1 first, which took the out tensor of output 0
/// (same dtype and shape), stayed a view of it, and was overwritten with output 0 —
/// both outputs read [1, 2, 3].
#[test]
fn a_host_kernels_other_output_does_not_land_in_an_out_tensor() {
    for mode in [SYNC, EAGER, DEFERRED] {
        let ctx = Ctx::new(mode);
        register_second_output_first(&ctx);
        let x = T::copy(&[0f32], F32, &[1]);
        let mut first = vec![0f32; 3];
        let o0 = T::wrap(&mut first, F32, &[3], None);
        let none = ndx_output_t {
            tensor: std::ptr::null(),
            batch: std::ptr::null(),
        };
        let f = invoke(
            &ctx,
            c"two",
            &[x.input()],
            std::ptr::null(),
            &[o0.out(), none],
            0,
        )
        .unwrap();
        ok(ndx_future_wait(f, -1));
        let (mut r0, mut r1) = (std::ptr::null_mut(), std::ptr::null_mut());
        ok(ndx_future_tensor(f, 0, &mut r0));
        ok(ndx_future_tensor(f, 1, &mut r1));
        let (r0, r1) = (T(r0), T(r1));
        assert_eq!(values_f32(r0.0), [1., 2., 3.], "mode {mode}");
        assert_eq!(values_f32(r1.0), [4., 5., 6.], "mode {mode}");
        ndx_future_release(f);
        drop((r0, r1, o0));
        assert_eq!(first, [1., 2., 3.], "mode {mode}");
    }
}

/// A batch of f32 samples over caller memory: `(first element, length)` each. The
/// producer tensors' deleters free only their own bookkeeping.
fn batch_over(samples: &[(*mut f32, i64)]) -> (*mut ndx_batch_t, Vec<Count>) {
    let (managed, counts): (Vec<_>, Vec<_>) = samples
        .iter()
        .map(|&(data, n)| {
            let (m, count) = Spec::f32s(&vec![0.; n as usize], &[n]).versioned();
            // SAFETY: a fresh producer tensor; the test keeps `data` alive and in
            // bounds until the batch is released.
            unsafe { (*m).dl_tensor.data = data.cast() };
            (m, count)
        })
        .unzip();
    (import_batch(&managed, std::ptr::null()), counts)
}

#[test]
fn a_samples_out_tensor_may_be_another_samples_input() {
    for mode in [SYNC, EAGER, DEFERRED] {
        let ctx = Ctx::new(mode);
        // neg over the two halves of one buffer, each written over the other half.
        let mut buf = vec![1f32, 2., 3., 4.];
        let (lo, hi) = (buf.as_mut_ptr(), buf[2..].as_mut_ptr());
        let (input, _) = batch_over(&[(lo, 2), (hi, 2)]);
        let (out, _) = batch_over(&[(hi, 2), (lo, 2)]);
        let f = invoke(
            &ctx,
            c"neg",
            &[batch_in(input)],
            std::ptr::null(),
            &[batch_out(out)],
            0,
        )
        .unwrap();
        ok(ndx_future_wait(f, -1));
        ndx_future_release(f);
        assert_eq!(sample_values(out, 0), [-1., -2.], "mode {mode}");
        for b in [input, out] {
            ndx_batch_release(b);
        }
        drop(ctx);
        assert_eq!(buf, [-3., -4., -1., -2.], "mode {mode}");

        // A tensor input every sample reads, overwritten by sample 0's out tensor.
        let ctx = Ctx::new(mode);
        let mut shared = vec![10f32, 20.];
        let t = T::wrap(&mut shared, F32, &[2], None);
        let mut x = vec![1f32, 2., 3., 4.];
        let mut second = vec![0f32; 2];
        let (input, _) = batch_over(&[(x.as_mut_ptr(), 2), (x[2..].as_mut_ptr(), 2)]);
        let (out, _) = batch_over(&[(shared.as_mut_ptr(), 2), (second.as_mut_ptr(), 2)]);
        let f = invoke(
            &ctx,
            c"add",
            &[batch_in(input), t.input()],
            std::ptr::null(),
            &[batch_out(out)],
            0,
        )
        .unwrap();
        ok(ndx_future_wait(f, -1));
        ndx_future_release(f);
        for b in [input, out] {
            ndx_batch_release(b);
        }
        drop((t, ctx));
        assert_eq!(
            (shared, second),
            (vec![11., 22.], vec![13., 24.]),
            "mode {mode}"
        );
    }
}
