"""Operators on CUDA tensors through ctypes, against ndx's CPU kernels on the same data.

Runs where a CUDA device answers: a GPU, or the emulated driver of tests/cuda_emu
(tests/python/test_cuda_emulated.py runs this module under it, so CI exercises the
launchers without a GPU). Elsewhere every test skips saying why; NDX_REQUIRE_CUDA=1
turns that skip into a failure.

Run: NDX_LIBRARY=/path/to/libndx.so python3 -m pytest -q tests/python/test_cuda_ops.py
"""

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ndx_ctypes as ndx  # noqa: E402

try:
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is in the test requirements
    BF16 = None

@pytest.fixture(scope="module", autouse=True)
def need_device():
    if ndx.lib.ndx_cuda_device_count() > 0:
        return
    why = "no CUDA device: " + (
        ndx.NdxError.from_ptr(ndx.lib.ndx_cuda_device_check(0)).message
        if ndx.lib.ndx_cuda_device_check(0)
        else "none found"
    )
    if os.environ.get("NDX_REQUIRE_CUDA") == "1":
        pytest.fail(why + " (NDX_REQUIRE_CUDA=1)")
    pytest.skip(why)


@pytest.fixture(params=[(ndx.NDX_EVAL_SYNC_CPU, None), (ndx.NDX_EVAL_SYNC_FULL, None),
                        (ndx.NDX_EVAL_EAGER, None), (ndx.NDX_EVAL_DEFERRED, None),
                        (ndx.NDX_EVAL_EAGER, "debug")],
                ids=["sync_cpu", "sync_full", "eager", "deferred", "eager_debug"])
def ctx(request):
    # eager_debug: every invocation on the device also passes the `debug` backend's
    # checks (outputs as inferred, no aliasing, inputs unchanged).
    mode, backend = request.param
    c = ndx.Context(mode=mode, backend=backend)
    yield c
    c.release()


@pytest.fixture(scope="module")
def cpu():
    c = ndx.Context(mode=ndx.NDX_EVAL_SYNC_CPU)
    yield c
    c.release()


def tensor(arr):
    """An ndx host tensor holding a copy of `arr` (bfloat16 through its bits)."""
    arr = np.asarray(arr)
    if BF16 is not None and arr.dtype == BF16:
        return ndx.tensor_from_host(arr.view(np.uint16), ndx.NDX_DTYPE_BFLOAT16)
    return ndx.tensor_from_numpy(np.ascontiguousarray(arr))


def to_dev(ctx, arr, **kw):
    return ctx.invoke("to_device", [tensor(arr) if not isinstance(arr, ndx.Tensor) else arr], args=kw or None).tensor()


def to_np(ctx, t):
    return ctx.invoke("to_host", [t]).result()


def run_both(ctx, cpu, op, arrays, **args):
    """`op` on the GPU (inputs moved there) and on the CPU: both results as arrays."""
    gpu_in = [to_dev(ctx, a) for a in arrays]
    out = ctx.invoke(op, gpu_in, args=args or None).tensor()
    assert out.device == (2, 0)  # kDLCUDA:0
    got = to_np(ctx, out)
    want = cpu.invoke(op, [tensor(a) for a in arrays], args=args or None).result()
    return got, want


def same(got, want):
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_array_equal(np.atleast_1d(got).view(np.uint8), np.atleast_1d(want).view(np.uint8))


def sample(dtype, shape, seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind in "ui":
        return rng.integers(1, 50, size=shape).astype(dtype)
    return (rng.standard_normal(shape) * 10).astype(np.float32).astype(dtype)


DTYPES = [np.float32, np.float16, np.uint8, np.int32] + ([BF16] if BF16 is not None else [])


def test_round_trip_keeps_every_byte_and_dtype(ctx):
    for dt in DTYPES + [np.float64, np.int64, np.bool_]:
        a = sample(np.float32, (3, 5)).astype(dt)
        t = to_dev(ctx, a)
        assert t.device == (2, 0)
        same(to_np(ctx, t), a)


def test_round_trip_of_a_strided_host_view_and_an_empty_tensor(ctx):
    a = np.arange(24, dtype=np.int32).reshape(4, 6)[::2, 1::2]
    same(to_np(ctx, to_dev(ctx, ndx.tensor_from_numpy(a))), np.ascontiguousarray(a))
    e = np.zeros((0, 3), np.float32)
    same(to_np(ctx, to_dev(ctx, e)), e)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: np.dtype(d).name)
def test_binary_ops_match_the_cpu(ctx, cpu, op, dt):
    a, b = sample(dt, (4, 37), 1), sample(dt, (4, 37), 2)
    same(*run_both(ctx, cpu, op, [a, b]))
    # broadcasting: a column against a row, and a scalar
    same(*run_both(ctx, cpu, op, [sample(dt, (5, 1), 3), sample(dt, (1, 7), 4)]))
    same(*run_both(ctx, cpu, op, [sample(dt, (3, 4), 5), sample(dt, (), 6)]))


def test_mixed_dtypes_are_promoted_like_the_cpu(ctx, cpu):
    same(*run_both(ctx, cpu, "add", [sample(np.uint8, (6,)), sample(np.float32, (6,))]))
    same(*run_both(ctx, cpu, "mul", [sample(np.uint8, (2, 3)), sample(np.int32, (3,))]))


def test_float_division_by_zero_is_ieee(ctx, cpu):
    a = np.array([1, -1, 0, 2], np.float32)
    b = np.array([0, 0, 0, 4], np.float32)
    got, want = run_both(ctx, cpu, "div", [a, b])
    same(got, want)
    assert np.isinf(got[0]) and np.isnan(got[2])


@pytest.mark.parametrize("src", DTYPES + [np.bool_], ids=lambda d: np.dtype(d).name)
def test_cast_matches_the_cpu(ctx, cpu, src):
    a = sample(np.float32, (9,), 7)
    a[:3] = [0.0, -3.7, 300.5]
    a = a.astype(src)
    for to in [ndx.NDX_DTYPE_FLOAT32, ndx.NDX_DTYPE_FLOAT16, ndx.NDX_DTYPE_BFLOAT16, ndx.NDX_DTYPE_UINT8,
               ndx.NDX_DTYPE_INT32, ndx.NDX_DTYPE_BOOL]:
        gpu = ctx.invoke("cast", [to_dev(ctx, a)], args=ndx.Args().set_dtype("dtype", to)).tensor()
        want = cpu.invoke("cast", [tensor(a)], args=ndx.Args().set_dtype("dtype", to)).result()
        same(to_np(ctx, gpu), want)


@pytest.mark.parametrize("op", ["sum", "mean", "max"])
@pytest.mark.parametrize("dt", DTYPES + [np.bool_], ids=lambda d: np.dtype(d).name)
def test_reductions_match_the_cpu(ctx, cpu, op, dt):
    a = sample(dt, (3, 4, 5), 8)
    for axes in [None, [0], [1], [2], [0, 1], [1, 2]]:
        kw = {} if axes is None else {"axes": axes}
        got, want = run_both(ctx, cpu, op, [a], **kw)
        if np.dtype(got.dtype).kind == "f" and op != "max":
            # float sums are accumulated in another order (ABI.md): within an ulp
            np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=2e-3 if dt != np.float32 else 1e-6)
            assert got.dtype == want.dtype and got.shape == want.shape
        else:
            same(got, want)
    got, want = run_both(ctx, cpu, op, [a], axes=[1], keepdims=True)
    assert got.shape == want.shape == (3, 1, 5)


@pytest.mark.parametrize("op", ["sum", "mean", "max"])
@pytest.mark.parametrize("dt", DTYPES + [np.bool_], ids=lambda d: np.dtype(d).name)
def test_reductions_over_axes_that_are_not_adjacent_match_the_cpu(ctx, cpu, op, dt):
    a = sample(dt, (3, 4, 5, 6), 9)
    # a strided view too: every other row of a transposed array
    b = sample(dt, (6, 8, 5), 10).transpose(1, 2, 0)[::2]
    for x, axes, keep in [(a, [0, 2], False), (a, [1, 3], True), (a, [0, 1, 3], False),
                          (a, [-1, 0], False), (b, [0, 2], False), (b, [0, 2], True)]:
        got, want = run_both(ctx, cpu, op, [x], axes=axes, keepdims=keep)
        assert got.shape == want.shape and got.dtype == want.dtype, (axes, keep)
        if np.dtype(got.dtype).kind == "f" and op != "max":
            np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                                       rtol=2e-3 if dt != np.float32 else 1e-6)
        else:
            same(got, want)


def test_sum_and_mean_of_nothing_and_max_of_nothing_fails(ctx, cpu):
    e = np.zeros((2, 0), np.float32)
    same(*run_both(ctx, cpu, "sum", [e], axes=[1]))
    got, _ = run_both(ctx, cpu, "mean", [e], axes=[1])
    assert np.isnan(got).all()
    with pytest.raises(ndx.NdxError) as err:
        ctx.invoke("max", [to_dev(ctx, e)], args={"axes": [1]}).wait()
    assert err.value.kind == ndx.NDX_ERROR_VALUE
    assert "zero-size reduction: operator 'max'" in err.value.message


@pytest.mark.parametrize("dt", [np.float32, np.float16, np.uint8, np.int32], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("layout", ["HWC", "CHW"])
@pytest.mark.parametrize("params", [
    {"mean": [1.0, 2.5, -3.0], "std": [2.0, 0.5, 4.0]},  # per channel (stride 1)
    {"mean": [1.5], "std": [-0.25]},                     # one for all (stride 0)
    {"mean": [1.0, 2.5, -3.0], "std": [3.0]},            # mixed: std repeated
], ids=["per_channel", "one", "mixed"])
def test_normalize_matches_the_cpu(ctx, cpu, dt, layout, params):
    shape = (5, 6, 3) if layout == "HWC" else (3, 5, 6)
    img = sample(dt, shape, 9)
    t = ctx.invoke("to_device", [ndx.tensor_from_numpy(img, layout=layout)]).tensor()
    got = to_np(ctx, ctx.invoke("normalize", [t], args=params).tensor())
    want = cpu.invoke("normalize", [ndx.tensor_from_numpy(img, layout=layout)], args=params).result()
    same(got, want)


@pytest.mark.parametrize("dt", [np.float32, np.float16, np.uint8, np.int32], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("interp", ["linear", "nearest"])
@pytest.mark.parametrize("size", [(4, 6), (16, 10), (9, 14)])
def test_resize_matches_the_cpu(ctx, cpu, dt, interp, size):
    for layout, shape in [("HWC", (8, 12, 3)), ("CHW", (2, 8, 12)), ("HWC", (8, 12, 2))]:
        img = sample(dt, shape, 10)
        h, w = size
        t = ctx.invoke("to_device", [ndx.tensor_from_numpy(img, layout=layout)]).tensor()
        got = to_np(ctx, ctx.invoke("resize", [t], args={"h": h, "w": w, "interp": interp}).tensor())
        want = cpu.invoke("resize", [ndx.tensor_from_numpy(img, layout=layout)],
                          args={"h": h, "w": w, "interp": interp}).result()
        same(got, want)


def test_checks_raise_flags_read_from_the_device(ctx):
    ctx.set_checks(ndx.NDX_CHECKS_COLLECT, ndx.NDX_CHECK_USER)
    x = np.array([0.5, 7.0, -1.0, 3.0, 9.0], np.float32)
    t = to_dev(ctx, x)
    out = ctx.invoke("check_range", [t], args={"lo": 0.0, "hi": 5.0}).tensor()
    same(to_np(ctx, out), x)  # passed through
    ctx.invoke("check_finite", [to_dev(ctx, np.array([1, np.nan, np.inf], np.float32))]).wait()
    ctx.invoke("check", [to_dev(ctx, np.array([True, False, True]))], args={"message": "mask"}).wait()
    ctx.invoke("check_shape", [t], args={"pattern": [4]}).wait()
    err = ctx.take_check_errors()
    assert err is not None and err.kind == ndx.NDX_ERROR_CHECK
    messages = [r.message for r in err.related]
    assert any("3 of 5 elements outside [0, 5]" in m for m in messages), messages
    assert any("2 of 3 elements not finite" in m for m in messages), messages
    assert any("mask: 1 of 3 elements false" in m for m in messages), messages
    assert any("does not match the pattern" in m for m in messages), messages
    assert ctx.take_check_errors() is None


def test_integer_division_by_zero_is_an_error_naming_the_element(ctx):
    a, b = np.array([4, 5, 6], np.int32), np.array([2, 0, 3], np.int32)
    f = ctx.invoke("div", [to_dev(ctx, a), to_dev(ctx, b)])
    with pytest.raises(ndx.NdxError) as err:
        f.wait()
    assert err.value.kind == ndx.NDX_ERROR_VALUE
    assert "integer division by zero (output element 1)" in err.value.message


def test_missing_kernels_fail_at_invoke_naming_op_dtype_and_device(ctx):
    t = to_dev(ctx, np.ones(4, np.float64))
    with pytest.raises(ndx.NdxError) as err:
        ctx.invoke("add", [t, t])
    assert err.value.kind == ndx.NDX_ERROR_NOT_IMPLEMENTED
    assert "operator 'add': no CUDA kernel for float64 on kDLCUDA:0" in err.value.message
    # A dtype the inputs only promote to is named with them.
    with pytest.raises(ndx.NdxError) as err:
        ctx.invoke("add", [to_dev(ctx, np.ones(4, np.int32)), to_dev(ctx, np.ones(4, np.float32))])
    assert err.value.kind == ndx.NDX_ERROR_NOT_IMPLEMENTED
    assert err.value.message.endswith(
        "operator 'add': no CUDA kernel for float64 on kDLCUDA:0 (int32 and float32 promote to it)"
    ), err.value.message
    u = to_dev(ctx, np.ones(4, np.float32))
    with pytest.raises(ndx.NdxError) as err:
        ctx.invoke("sqrt", [u])
    assert err.value.kind == ndx.NDX_ERROR_NOT_IMPLEMENTED
    assert "operator 'sqrt': no CUDA kernel for float32 on kDLCUDA:0" in err.value.message
    with pytest.raises(ndx.NdxError) as err:
        ctx.invoke("add", [u, ndx.tensor_from_numpy(np.ones(4, np.float32))])
    assert err.value.kind == ndx.NDX_ERROR_VALUE
    assert "operator 'add': input 1 is in host memory (kDLCPU:0) but input 0 is on kDLCUDA:0" in err.value.message


NINE_D = (1, 2, 1, 2, 1, 2, 1, 2, 1)


@pytest.mark.parametrize("op, dtype, shape, args, says", [
    ("cast", np.float64, (4,), {"dtype": ("dtype", ndx.NDX_DTYPE_FLOAT32)},
     "operator 'cast': no CUDA kernel for float64 on kDLCUDA:0"),
    ("cast", np.float32, (4,), {"dtype": ("dtype", ndx.NDX_DTYPE_FLOAT64)},
     "operator 'cast': no CUDA kernel for float64 on kDLCUDA:0 (as the target dtype)"),
    ("sum", np.int64, (4,), {}, "operator 'sum': no CUDA kernel for int64 on kDLCUDA:0"),
    ("max", np.int16, (4,), {}, "operator 'max': no CUDA kernel for int16 on kDLCUDA:0"),
    ("normalize", np.float64, (2, 2, 1), {"mean": [0.0], "std": [1.0]},
     "operator 'normalize': no CUDA kernel for float64 on kDLCUDA:0"),
    ("resize", np.int16, (2, 2, 1), {"h": 1, "w": 1},
     "operator 'resize': no CUDA kernel for int16 on kDLCUDA:0"),
    ("check_finite", np.int64, (4,), {},
     "operator 'check_finite': no CUDA kernel for int64 on kDLCUDA:0"),
    ("add", np.float32, NINE_D, {},
     "operator 'add': no CUDA kernel for float32 on kDLCUDA:0 with 9 dimensions (at most 8)"),
    ("sum", np.float32, NINE_D, {"axes": [0, 2]},
     "operator 'sum': no CUDA kernel for float32 on kDLCUDA:0 over the non-adjacent axes "
     "[0, 2] of 9 dimensions (at most 8)"),
], ids=["cast_from", "cast_to", "sum_int64", "max_int16", "normalize_float64", "resize_int16",
        "check_finite_int64", "add_9d", "sum_9d_gapped"])
def test_each_unsupported_combination_fails_at_invoke(ctx, op, dtype, shape, args, says):
    # Each refusal names the operator, the dtype, the device and, where the dtype has
    # kernels, what else is out of reach; nothing is enqueued.
    t = to_dev(ctx, np.ones(shape, dtype))
    inputs = [t, t] if op == "add" else [t]
    a = ndx.Args()
    for name, value in args.items():
        if isinstance(value, tuple):  # ("dtype", code): a dtype argument
            a.set_dtype(name, value[1])
        else:
            a.set(name, value)
    with pytest.raises(ndx.NdxError) as err:
        ctx.invoke(op, inputs, args=a)
    assert err.value.kind == ndx.NDX_ERROR_NOT_IMPLEMENTED, err.value.message
    assert says in err.value.message, err.value.message
    if "non-adjacent" in says:
        # Adjacent axes of the same 9-d tensor have a kernel: only the gap was refused.
        out = ctx.invoke(op, inputs, args=ndx.Args(axes=[0, 1])).tensor()
        assert to_np(ctx, out).shape == shape[2:]


def test_an_out_tensor_for_outputs_on_the_device_is_refused_at_invoke(ctx):
    x = to_dev(ctx, np.arange(3, dtype=np.float32))
    sink = np.zeros(3, np.float32)
    with pytest.raises(ndx.NdxError) as err:
        ctx.invoke("add", [x, x], out=[sink])
    assert err.value.kind == ndx.NDX_ERROR_NOT_IMPLEMENTED
    assert "operator 'add': outputs[0] is given, but the invocation runs on kDLCUDA:0" in err.value.message
    assert not sink.any()
    # to_host's output is host memory: it takes one.
    ctx.invoke("to_host", [x], out=[sink]).wait()
    np.testing.assert_array_equal(sink, [0, 1, 2])
    # Device memory is no out tensor for a host invocation either, and stays as it was.
    with pytest.raises(ndx.NdxError) as err:
        ctx.invoke("neg", [ndx.tensor_from_numpy(np.ones(3, np.float32))], out=[x])
    assert err.value.kind == ndx.NDX_ERROR_NOT_IMPLEMENTED
    assert ("operator 'neg': outputs[0] lives in kDLCUDA:0 memory; this build writes host "
            "memory only") in err.value.message, err.value.message
    np.testing.assert_array_equal(to_np(ctx, x), [0, 1, 2])


def test_the_accuracy_fault_perturbs_outputs_on_the_device(ctx):
    # inject_accuracy_error:OP adds 1 to OP's outputs, on the device as on the host.
    x = to_dev(ctx, np.array([1, 2, 3], np.int32))
    ndx.check(ndx.lib.ndx_context_set_backend(ctx.ptr, b"inject_accuracy_error:mul"))
    np.testing.assert_array_equal(to_np(ctx, ctx.invoke("mul", [x, x]).tensor()), [2, 5, 10])
    ndx.check(ndx.lib.ndx_context_set_backend(ctx.ptr, b"inject_accuracy_error:mean"))
    m = to_np(ctx, ctx.invoke("mean", [x]).tensor())
    assert m.dtype == np.float64 and m == 3.0
    ndx.check(ndx.lib.ndx_context_set_backend(ctx.ptr, b"default"))
    np.testing.assert_array_equal(to_np(ctx, ctx.invoke("mul", [x, x]).tensor()), [1, 4, 9])


def test_to_device_refuses_a_device_that_does_not_exist(ctx):
    n = ndx.lib.ndx_cuda_device_count()
    with pytest.raises(ndx.NdxError) as err:
        ctx.invoke("to_device", [tensor(np.ones(2, np.float32))], args={"device": n})
    assert err.value.kind == ndx.NDX_ERROR_CUDA
    assert f"device {n} does not exist" in err.value.message


def test_a_chain_stays_on_the_device_and_exports_with_a_stream(ctx, cpu):
    a, b = sample(np.float32, (8, 8), 11), sample(np.float32, (8,), 12)
    x = ctx.invoke("add", [to_dev(ctx, a), to_dev(ctx, b)]).tensor()
    y = ctx.invoke("mul", [x, x]).tensor()
    z = ctx.invoke("sum", [y], args={"axes": [1]}).tensor()
    want = cpu.invoke("sum", [cpu.invoke("mul", [cpu.invoke("add", [a, b]).tensor()] * 2).tensor()],
                      args={"axes": [1]}).result()
    np.testing.assert_allclose(to_np(ctx, z), want, rtol=1e-6)
    out = ndx.c_void_p()
    ndx.check(ndx.lib.ndx_tensor_to_dlpack_versioned_stream(y.ptr, ndx.STREAM_NO_SYNC, ndx.byref(out)))
    m = ndx.DLManagedTensorVersioned.from_address(out.value)
    assert (m.dl_tensor.device.device_type, m.dl_tensor.device.device_id) == (2, 0)
    m.deleter(ndx.ctypes.cast(out.value, ndx.POINTER(ndx.DLManagedTensorVersioned)))


def test_fail_fast_checks_fail_the_invocation_with_the_device_flag(ctx):
    ctx.set_checks(ndx.NDX_CHECKS_FAIL_FAST, ndx.NDX_CHECK_USER)
    t = to_dev(ctx, np.array([1, 2, 300, 4, 500], np.int32))
    f = ctx.invoke("check_range", [t], args={"lo": 0.0, "hi": 255.0})
    with pytest.raises(ndx.NdxError) as err:
        f.wait()
    assert err.value.kind == ndx.NDX_ERROR_CHECK
    assert "2 of 5 elements outside [0, 255]" in err.value.message
    assert "first at flat index 2" in err.value.message


def test_check_range_names_an_int_bound_exactly_as_the_host_does(ctx):
    """An int bound beyond 2^53 is written as given (the host's message), not as the
    double it rounds to."""
    ctx.set_checks(ndx.NDX_CHECKS_FAIL_FAST, ndx.NDX_CHECK_USER)
    t = to_dev(ctx, np.array([1, 2, 3], np.int32))
    f = ctx.invoke("check_range", [t], args={"lo": 2**53 + 1})
    with pytest.raises(ndx.NdxError) as err:
        f.wait()
    assert "3 of 3 elements outside [9007199254740993, inf]" in err.value.message, err.value.message


def test_nan_from_finite_inputs_is_flagged_by_the_kernel(ctx):
    ctx.set_checks(ndx.NDX_CHECKS_COLLECT, ndx.NDX_CHECK_NAN)
    big = np.array([3e38, 1.0, 3e38], np.float32)
    ctx.invoke("mul", [to_dev(ctx, big), to_dev(ctx, big)]).wait()  # overflows: inf
    ctx.invoke("add", [to_dev(ctx, np.array([np.nan], np.float32)), to_dev(ctx, big)]).wait()  # NaN in: no flag
    err = ctx.take_check_errors()
    assert err is not None
    messages = [r.message for r in err.related]
    assert len(messages) == 1, messages
    assert "2 NaN or infinite elements from finite inputs" in messages[0], messages
