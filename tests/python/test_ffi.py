"""The Python embedding path of libndx through ctypes: host frames from a Python
frame provider, error chains, unobserved failures, DLPack import/export ownership.

Run: NDX_LIBRARY=/path/to/libndx.so python3 -m pytest -q tests/python
"""

import ctypes
import gc
import inspect
import os
import shutil
import sys
import threading
import weakref

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ndx_ctypes as ndx  # noqa: E402
from conftest import c_layout  # noqa: E402

THIS_FILE = os.path.realpath(__file__)


def same_file(path):
    return path is not None and os.path.realpath(path) == THIS_FILE


def host_frames(err):
    return [f for f in err.frames if f.origin == ndx.NDX_FRAME_HOST]


# ----------------------------------------------------------------------- helpers
# The sites below record the line of their ndx call, taken from inspect (the line
# after the assignment), in `lines`.

lines = {}


def inner(ctx, a, b):
    lines["inner"] = inspect.currentframe().f_lineno + 1
    return ctx.invoke("div", [a, b], mode=ndx.NDX_EVAL_EAGER)


def outer(ctx, a, b):
    lines["outer"] = inspect.currentframe().f_lineno + 1
    return inner(ctx, a, b)


def consume(ctx, upstream, c):
    lines["consume"] = inspect.currentframe().f_lineno + 1
    return ctx.invoke("add", [upstream.tensor(0), c], mode=ndx.NDX_EVAL_EAGER)


def div_by_zero_inputs():
    a = np.array([7, 8, 9, 10], dtype=np.int32)
    b = np.array([1, 2, 0, 5], dtype=np.int32)
    return a, b


@pytest.fixture
def ctx():
    c = ndx.Context()
    yield c
    c.release()


def expect_failure(fut):
    with pytest.raises(ndx.NdxError) as info:
        fut.wait()
    return info.value


def check_div_site(err, policy):
    assert err.kind == ndx.NDX_ERROR_VALUE
    assert err.kind_name == "ValueError"
    assert isinstance(err, ValueError)
    assert err.op == "div"
    assert err.sequence >= 1
    assert "division by zero" in err.message
    frames = err.frames
    assert len(frames) >= 2, frames
    f0, f1 = frames[0], frames[1]
    assert (f0.function, f0.line, f0.origin) == ("inner", lines["inner"], ndx.NDX_FRAME_HOST), frames
    assert same_file(f0.file), frames
    assert (f1.function, f1.line, f1.origin) == ("outer", lines["outer"], ndx.NDX_FRAME_HOST), frames
    assert same_file(f1.file), frames
    # No frame of the binding itself, and the caller of outer() (this test) next.
    assert not any(f.file and f.file.endswith("ndx_ctypes.py") for f in frames), frames
    assert frames[2].function.startswith("test_"), frames
    host = host_frames(err)
    # Host frames come first, native ones (ALL only) after them.
    assert frames[: len(host)] == host, frames
    if policy == ndx.NDX_CAPTURE_HOST:
        assert host == frames, "HOST records no native frames when host frames exist"
    else:
        assert len(frames) > len(host), "ALL also records native frames of an EAGER invoke"
    # The Python-style text names both lines, outermost first.
    text = err.traceback_text
    at_outer = text.index(f'File "{f1.file}", line {lines["outer"]}, in outer')
    at_inner = text.index(f'File "{f0.file}", line {lines["inner"]}, in inner')
    assert at_outer < at_inner, text
    assert "in invocation #" in text and "of operator 'div'" in text, text
    assert text.rstrip().endswith(f"ValueError: {err.message}"), text


# ----------------------------------------------------------------------- frames


@pytest.mark.parametrize("policy", [ndx.NDX_CAPTURE_HOST, ndx.NDX_CAPTURE_ALL], ids=["HOST", "ALL"])
def test_eager_failure_reports_python_frames(ctx, policy):
    # No string cache: every call encodes new bytes objects, which the provider drops
    # (forget) right after ndx_invoke returns. ndx must have copied them: a dangling
    # pointer would read freed memory, overwritten here by collection and new strings.
    provider = ctx.set_frame_provider(ndx.PythonFrameProvider(cache=False))
    ctx.set_capture_policy(policy)
    a, b = div_by_zero_inputs()
    first = None
    for _ in range(50):
        fut = outer(ctx, a, b)
        provider.forget()
        gc.collect()
        junk = [("x" * len(THIS_FILE)).encode() for _ in range(64)]
        err = expect_failure(fut)
        fut.release()
        del junk
        check_div_site(err, policy)
        gc.collect()
        if first is None:
            first = host_frames(err)
        else:
            assert host_frames(err) == first
        # An error read again after a collection is unchanged too.
        assert err.frames[: len(first)] == first
    assert provider.errors == 0
    assert provider.calls >= 50


def test_host_policy_without_provider_falls_back_to_native_caller(ctx):
    ctx.set_capture_policy(ndx.NDX_CAPTURE_HOST)
    a, b = div_by_zero_inputs()
    err = expect_failure(outer(ctx, a, b))
    assert err.op == "div"
    assert err.frames, "the native caller frame is recorded when there are no host frames"
    assert all(f.origin == ndx.NDX_FRAME_NATIVE for f in err.frames), err.frames


def test_capture_off_does_not_call_the_provider(ctx):
    provider = ctx.set_frame_provider()
    ctx.set_capture_policy(ndx.NDX_CAPTURE_OFF)
    a, b = div_by_zero_inputs()
    err = expect_failure(outer(ctx, a, b))
    assert provider.calls == 0
    assert host_frames(err) == []


def test_frames_from_concurrent_threads(ctx):
    """The provider's per-thread keep-alive: each thread's error names its own lines."""
    provider = ctx.set_frame_provider()
    ctx.set_capture_policy(ndx.NDX_CAPTURE_HOST)
    a, b = div_by_zero_inputs()
    failures = []

    def worker(k):
        try:
            for _ in range(25):
                line = inspect.currentframe().f_lineno + 1
                fut = ctx.invoke("div", [a, b])
                try:
                    fut.wait()
                    failures.append((k, "no error"))
                except ndx.NdxError as e:
                    f0 = e.frames[0]
                    if (f0.function, f0.line) != ("worker", line) or not same_file(f0.file):
                        failures.append((k, e.frames[:2]))
                fut.release()
        except BaseException as e:  # pragma: no cover - reported below
            failures.append((k, repr(e)))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert provider.errors == 0


def test_chain_reports_both_sites(ctx):
    ctx.set_frame_provider()
    ctx.set_capture_policy(ndx.NDX_CAPTURE_HOST)
    a, b = div_by_zero_inputs()
    up = outer(ctx, a, b)
    down = consume(ctx, up, np.ones(4, dtype=np.int32))
    err = expect_failure(down)
    # The link of the invocation that used the failed output: its own site.
    assert err.op == "add"
    assert err.kind_name == "ValueError"
    assert "failed" in err.message and "'div'" in err.message, err.message
    f0 = err.frames[0]
    assert (f0.function, f0.line, f0.origin) == ("consume", lines["consume"], ndx.NDX_FRAME_HOST)
    assert same_file(f0.file)
    # Its cause: the div, with the div's site.
    cause = err.cause
    assert cause is not None and err.__cause__ is cause
    assert cause.op == "div" and cause.sequence < err.sequence
    check_div_site(cause, ndx.NDX_CAPTURE_HOST)
    assert cause.cause is None
    text = err.traceback_text
    sep = "The above exception was the direct cause of the following exception:"
    assert text.index(f"line {lines['inner']}, in inner") < text.index(sep)
    assert text.index(sep) < text.index(f"line {lines['consume']}, in consume"), text
    up.release()
    down.release()
    # Waiting on the downstream failure observed the upstream one as well.
    ctx.evaluate()


def test_evaluate_reports_unobserved_failure(ctx):
    ctx.set_frame_provider()
    ctx.set_capture_policy(ndx.NDX_CAPTURE_HOST)
    a, b = div_by_zero_inputs()
    fut = outer(ctx, a, b)
    fut.release()  # never polled, waited on or read
    with pytest.raises(ndx.NdxError) as info:
        ctx.evaluate()
    err = info.value
    assert err.kind_name == "RuntimeError"
    assert "1 invocation failed without being observed" in err.message
    assert len(err.related) == 1
    check_div_site(err.related[0], ndx.NDX_CAPTURE_HOST)
    assert f"line {lines['inner']}, in inner" in err.traceback_text
    ctx.evaluate()  # each failure is reported once


def test_deferred_failure_reports_python_frames(ctx):
    ctx.set_frame_provider()
    ctx.set_capture_policy(ndx.NDX_CAPTURE_HOST)
    a, b = div_by_zero_inputs()
    line = inspect.currentframe().f_lineno + 1
    fut = ctx.invoke("div", [a, b], mode=ndx.NDX_EVAL_DEFERRED)
    assert fut.poll() in (ndx.NDX_FUTURE_PENDING, ndx.NDX_FUTURE_FAILED)
    err = expect_failure(fut)
    f0 = err.frames[0]
    assert (f0.function, f0.line) == ("test_deferred_failure_reports_python_frames", line)


def test_call_time_error_carries_python_frame(ctx):
    ctx.set_frame_provider()
    ctx.set_capture_policy(ndx.NDX_CAPTURE_HOST)
    a, b = div_by_zero_inputs()
    with pytest.raises(ndx.NdxError) as info:
        line = inspect.currentframe().f_lineno + 1
        ctx.invoke("no_such_op", [a, b])
    err = info.value
    assert err.kind_name == "ValueError" and "no_such_op" in err.message
    f0 = err.frames[0]
    assert (f0.function, f0.line, f0.origin) == (
        "test_call_time_error_carries_python_frame",
        line,
        ndx.NDX_FRAME_HOST,
    )


def test_unreadable_options_error_carries_python_frame(ctx):
    """Refused while ndx_invoke reads its options (an unknown eval mode), before any
    operator lookup: the error names the Python line all the same."""
    ctx.set_frame_provider()
    ctx.set_capture_policy(ndx.NDX_CAPTURE_HOST)
    a, b = div_by_zero_inputs()
    with pytest.raises(ndx.NdxError) as info:
        line = inspect.currentframe().f_lineno + 1
        ctx.invoke("add", [a, b], mode=99)
    err = info.value
    assert err.kind_name == "ValueError" and "opts->mode" in err.message
    f0 = err.frames[0]
    assert (f0.function, f0.line, f0.origin) == (
        "test_unreadable_options_error_carries_python_frame",
        line,
        ndx.NDX_FRAME_HOST,
    )


def test_a_failure_down_a_long_pipeline_becomes_one_exception_chain(ctx):
    """A failure passed down 1500 dependent invocations: the exception has all 1501
    links, built without recursing once per link (a RecursionError replaced the real
    error) and without formatting the whole chain again for every link."""
    ctx.set_frame_provider()
    ctx.set_capture_policy(ndx.NDX_CAPTURE_HOST)  # host frames: nothing to symbolise
    a, b = div_by_zero_inputs()
    depth = 1500
    futs = [ctx.invoke("div", [a, b], mode=ndx.NDX_EVAL_DEFERRED)]
    for _ in range(depth):
        futs.append(ctx.invoke("add", [futs[-1].tensor(0), a], mode=ndx.NDX_EVAL_DEFERRED))
    err = expect_failure(futs[-1])
    chain = list(err.chain())
    assert len(chain) == depth + 1
    assert [e.sequence for e in chain] == list(range(depth + 1, 0, -1))
    root = chain[-1]
    assert root.op == "div" and "division by zero" in root.message and root.cause is None
    assert chain[-2].__cause__ is root
    # Each link's text is its own chain's: the root's alone; a chain of up to 64 links
    # whole; a longer one its 32 links at each end and a line counting the rest.
    assert root.traceback_text.rstrip().endswith(f"ValueError: {root.message}")
    assert "direct cause" not in root.traceback_text
    sep = "The above exception was the direct cause of the following exception:"
    assert chain[-64].traceback_text.count(sep) == 63
    assert "left out" not in chain[-64].traceback_text
    for link, n in [(err, depth + 1), (chain[1], depth)]:
        assert link.traceback_text.count(sep) == 64
        assert f"[... {n - 64} more links of this chain of {n} left out" in link.traceback_text
    for f in futs:
        f.release()


def test_provider_lifetime(ctx):
    """ndx's user_free releases the CFUNCTYPE when replaced and when the context goes."""
    before = ndx.live_provider_count()
    first = ctx.set_frame_provider()
    assert ndx.live_provider_count() == before + 1
    ctx.set_frame_provider()  # replaces: user_free for the first
    assert ndx.live_provider_count() == before + 1
    ctx.set_frame_provider(None)
    assert ndx.live_provider_count() == before
    ctx.set_frame_provider()
    ctx.release()
    assert ndx.live_provider_count() == before
    assert first.errors == 0


# ----------------------------------------------------------------------- success


def test_sync_cpu_add_matches_numpy(ctx):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 5)).astype(np.float32)
    b = rng.standard_normal((3, 5)).astype(np.float32)
    fut = ctx.invoke("add", [a, b], mode=ndx.NDX_EVAL_SYNC_CPU)
    assert fut.poll() == ndx.NDX_FUTURE_READY  # done before invoke returned
    assert fut.output_count() == 1
    out = fut.result()
    assert out.dtype == np.float32 and out.shape == (3, 5)
    np.testing.assert_array_equal(out, a + b)


def test_prepared_invocation(ctx):
    a = np.arange(4, dtype=np.float32)
    b = np.full(4, 0.5, dtype=np.float32)
    inv = ctx.prepare("add", [a, b], mode=ndx.NDX_EVAL_DEFERRED)
    for _ in range(10):
        ptr = inv.invoke_raw()
        ndx.lib.ndx_future_release(ptr)
    fut = inv()
    np.testing.assert_array_equal(fut.result(), a + b)
    ctx.evaluate()


# ----------------------------------------------------------------------- DLPack


@pytest.mark.parametrize("versioned", [True, False], ids=["versioned", "legacy"])
def test_dlpack_round_trip(versioned):
    arr = np.arange(24, dtype=np.float32).reshape(2, 3, 4) * 0.25
    with ndx.tensor_from_numpy(arr, versioned=versioned) as t:
        assert t.dtype == ndx.NDX_DTYPE_FLOAT32
        assert t.shape == (2, 3, 4)
        back = t.numpy()
    assert back.dtype == np.float32
    np.testing.assert_array_equal(back, arr)


def test_dlpack_strided_view_round_trip():
    base = np.arange(30, dtype=np.float32).reshape(5, 6)
    view = base[::2, 1::2]  # non-compact strides, non-zero offset
    with ndx.tensor_from_numpy(view) as t:
        np.testing.assert_array_equal(t.numpy(), view)


def test_dlpack_read_only_flag():
    arr = np.arange(3, dtype=np.float32)
    arr.flags.writeable = False
    with ndx.tensor_from_numpy(arr) as t:
        assert t.read_only


def test_imported_memory_outlives_the_array():
    n = 1 << 16
    arr = np.arange(n, dtype=np.float32)
    expected = arr.copy()
    alive = weakref.ref(arr)
    base_refs = sys.getrefcount(arr)
    t = ndx.tensor_from_numpy(arr)
    # NumPy's manager holds one reference to the array for ndx.
    assert sys.getrefcount(arr) == base_refs + 1
    del arr
    gc.collect()
    assert alive() is not None, "ndx's reference keeps the array alive"
    # Churn the allocator so freed memory would be reused and overwritten.
    junk = [np.full(n, -1.0, dtype=np.float32) for _ in range(8)]
    np.testing.assert_array_equal(t.numpy(), expected)
    # Also as an operator input after the Python reference is gone.
    with ndx.Context() as c:
        out = c.invoke("add", [t, expected], mode=ndx.NDX_EVAL_SYNC_CPU).result()
    np.testing.assert_array_equal(out, expected * 2)
    del junk, out
    t.release()  # the deleter runs: the array goes
    gc.collect()
    assert alive() is None


def test_numpy_deleter_runs_once():
    arr = np.arange(8, dtype=np.int32)
    base_refs = sys.getrefcount(arr)
    for versioned in (True, False):
        for _ in range(20):
            t = ndx.tensor_from_numpy(arr, versioned=versioned)
            assert sys.getrefcount(arr) == base_refs + 1
            t.release()
            gc.collect()
            # Once: a second call would drop a reference NumPy never took.
            assert sys.getrefcount(arr) == base_refs


def test_capsule_is_marked_used_only_on_success():
    arr = np.arange(4, dtype=np.float64)
    cap = arr.__dlpack__(max_version=(1, 0))
    t = ndx.dlpack_import(cap)
    assert ndx._capi.PyCapsule_IsValid(cap, b"used_dltensor_versioned")
    with pytest.raises(ValueError):
        ndx.dlpack_import(cap)  # a used capsule cannot be imported again
    del cap
    gc.collect()
    np.testing.assert_array_equal(t.numpy(), arr)
    t.release()

    # A rejected import leaves the tensor with the capsule, whose destructor frees it.
    c = np.zeros(3, dtype=np.complex64)
    base_refs = sys.getrefcount(c)
    cap = c.__dlpack__(max_version=(1, 0))
    with pytest.raises(ndx.NdxError) as info:
        ndx.dlpack_import(cap)
    assert info.value.kind_name == "TypeError"
    assert "complex" in info.value.message
    assert ndx._capi.PyCapsule_IsValid(cap, b"dltensor_versioned")
    del cap, info  # the traceback's frames refer to the capsule too
    gc.collect()
    assert sys.getrefcount(c) == base_refs


class HandMadeTensor:
    """A DLManagedTensorVersioned built with ctypes, whose deleter counts its calls."""

    def __init__(self, values, major=1):
        self.data = (ctypes.c_float * len(values))(*values)
        self.shape = (ctypes.c_int64 * 1)(len(values))
        self.calls = 0
        self.deleter = ndx.DLManagedTensorVersionedDeleter(self._delete)
        m = ndx.DLManagedTensorVersioned()
        m.version.major, m.version.minor = major, 0
        m.deleter = self.deleter
        m.dl_tensor.data = ctypes.cast(self.data, ctypes.c_void_p)
        m.dl_tensor.device.device_type = ndx.kDLCPU
        m.dl_tensor.ndim = 1
        m.dl_tensor.dtype.code, m.dl_tensor.dtype.bits, m.dl_tensor.dtype.lanes = 2, 32, 1
        m.dl_tensor.shape = self.shape
        self.managed = m

    def _delete(self, ptr):
        assert ctypes.addressof(ptr.contents) == ctypes.addressof(self.managed)
        self.calls += 1

    def import_(self):
        out = ctypes.c_void_p()
        err = ndx.lib.ndx_tensor_from_dlpack_versioned(
            ctypes.addressof(self.managed), None, ctypes.byref(out)
        )
        ndx.check(err)
        return ndx.Tensor(out.value)


def test_deleter_runs_exactly_once_on_last_release():
    h = HandMadeTensor([1.0, 2.0, 3.0])
    t = h.import_()
    with ndx.Context() as c:
        fut = c.invoke("add", [t, t], mode=ndx.NDX_EVAL_DEFERRED)
        out = fut.tensor(0)
        t.release()
        gc.collect()
        assert h.calls == 0, "pending work keeps its input alive"
        np.testing.assert_array_equal(out.numpy(), [2.0, 4.0, 6.0])
        fut.release()
        out.release()
        c.evaluate()
    gc.collect()
    assert h.calls == 1


def test_wrong_major_version_deleter_called_by_ndx():
    h = HandMadeTensor([1.0], major=2)
    with pytest.raises(ndx.NdxError) as info:
        h.import_()
    assert h.calls == 1, "the DLPack rule: ndx calls the deleter of a tensor it cannot read"
    assert "2" in info.value.message


# ----------------------------------------------------------------------- ABI


def test_backend_injected_runtime_error_has_python_site(ctx):
    ctx.set_frame_provider()
    ctx.set_capture_policy(ndx.NDX_CAPTURE_HOST)
    ctx.set_backend("inject_runtime_error:add")
    x = np.ones(2, dtype=np.float32)
    line = inspect.currentframe().f_lineno + 1
    fut = ctx.invoke("add", [x, x])
    err = expect_failure(fut)
    assert err.op == "add"
    assert (err.frames[0].function, err.frames[0].line) == (
        "test_backend_injected_runtime_error_has_python_site",
        line,
    )


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_struct_layouts_match_header(tmp_path):
    structs = {
        "ndx_frame_t": ndx.ndx_frame_t,
        "ndx_input_t": ndx.ndx_input_t,
        "ndx_location_t": ndx.ndx_location_t,
        "ndx_invoke_options_t": ndx.ndx_invoke_options_t,
        "ndx_output_t": ndx.ndx_output_t,
        "ndx_host_frame_t": ndx.ndx_host_frame_t,
        "ndx_context_options_t": ndx.ndx_context_options_t,
        "ndx_import_options_t": ndx.ndx_import_options_t,
        "DLManagedTensorVersioned": ndx.DLManagedTensorVersioned,
        "DLManagedTensor": ndx.DLManagedTensor,
        "DLTensor": ndx.DLTensor,
    }
    include = os.path.join(ndx.REPO_ROOT, "include")
    got, expected = c_layout(tmp_path, include, structs)
    assert got == expected
