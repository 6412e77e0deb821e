"""Error flags (non-interrupting checks) through the C ABI: the check operators, the
built-in categories (NAN, DIV, INDEX), the policies (OFF, COLLECT, FAIL_FAST), how
flags are reported (`ndx_context_evaluate`, `ndx_context_take_check_errors`,
`ndx_error_check_info`) and the context options that set them.

Run: NDX_LIBRARY=/path/to/libndx.so python3 -m pytest -q tests/python/test_checks.py

Reference: include/ndx.h (`ndx_check_policy_t`, `ndx_check_category_t`,
`ndx_context_set_checks`, `ndx_context_take_check_errors`, `ndx_check_info_t`,
`ndx_error_check_info`, the check fields of `ndx_context_options_t`).
"""

import ctypes
import inspect
import os
import shutil
import sys
from ctypes import POINTER, byref, c_char_p, c_size_t, c_void_p

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ndx_ctypes as ndx  # noqa: E402
from conftest import c_layout, header_dir  # noqa: E402

THIS_FILE = os.path.realpath(__file__)
SYNC = ndx.NDX_EVAL_SYNC_CPU
MODES = {"SYNC_CPU": ndx.NDX_EVAL_SYNC_CPU, "DEFERRED": ndx.NDX_EVAL_DEFERRED, "EAGER": ndx.NDX_EVAL_EAGER}
NAN, DIV, INDEX, USER = ndx.NDX_CHECK_NAN, ndx.NDX_CHECK_DIV, ndx.NDX_CHECK_INDEX, ndx.NDX_CHECK_USER
COLLECT, FAIL_FAST, OFF = ndx.NDX_CHECKS_COLLECT, ndx.NDX_CHECKS_FAIL_FAST, ndx.NDX_CHECKS_OFF

NOT_FINITE = np.array([1.0, np.nan, 2.0, np.inf], dtype=np.float32)  # 2 bad, first at 1
FINITE = np.array([1.0, -2.0, 3.0, 0.5], dtype=np.float32)


def next_line():
    """The line after the caller's: put it just before the ndx call it names."""
    return inspect.currentframe().f_back.f_lineno + 1


def where():
    """(function, line of the next line) of the caller."""
    f = inspect.currentframe().f_back
    return f.f_code.co_name, f.f_lineno + 1


# A private handle of the library, with its own prototypes (leaving `ndx.lib` alone),
# for what the binding does not wrap: DLPack export and batches.
_raw = ctypes.CDLL(ndx.LIBRARY_PATH)
for _name, _res, _args in [
    ("ndx_tensor_to_dlpack_versioned", c_void_p, [c_void_p, POINTER(POINTER(ndx.DLManagedTensorVersioned))]),
    ("ndx_batch_from_dlpack_versioned", c_void_p, [POINTER(c_void_p), c_size_t, c_void_p, POINTER(c_void_p)]),
    ("ndx_batch_release", None, [c_void_p]),
    ("ndx_invoke", c_void_p, [c_void_p, c_char_p, POINTER(ndx.ndx_input_t), c_size_t, c_void_p,
                              POINTER(ndx.ndx_invoke_options_t), POINTER(c_void_p)]),
]:
    getattr(_raw, _name).restype, getattr(_raw, _name).argtypes = _res, _args


def dlpack_view(tensor):
    """(address of element 0, shape, strides) of the tensor's DLPack export."""
    p = POINTER(ndx.DLManagedTensorVersioned)()
    ndx.check(_raw.ndx_tensor_to_dlpack_versioned(tensor.ptr, byref(p)))
    try:
        d = p.contents.dl_tensor
        return (d.data + d.byte_offset, tuple(d.shape[:d.ndim]), tuple(d.strides[:d.ndim]))
    finally:
        p.contents.deleter(p)


@pytest.fixture
def context(make_context):
    """`context(mode=SYNC, provider=True, **kw)`: a new ndx.Context (with the Python frame provider and HOST capture by default),
    released after the test (see conftest.py)."""

    def make(mode=SYNC, provider=True, **kw):
        return make_context(mode, provider, **kw)

    return make


def group_flags(err, n):
    """`err` is one check group holding `n` flags: returns them."""
    assert isinstance(err, ndx.NdxError), err
    assert err.kind == ndx.NDX_ERROR_CHECK and err.kind_name == "CheckError", (err.kind_name, err)
    assert isinstance(err, ndx.NdxCheckError)
    assert err.check_info is None, "a group is not itself a flag"
    assert err.op is None and err.sequence == 0, (err.op, err.sequence)
    assert err.message == f"{n} check{'s' if n != 1 else ''} failed (in enqueue order)", err.message
    assert len(err.related) == n, [f.message for f in err.related]
    return err.related


def assert_flag(
    flag,
    op,
    seq,
    message,
    category,
    first_index,
    count,
    occurrences=1,
    sample=-1,
    consequence_of=0,
    site=None,
):
    """One raised flag: kind, op, sequence, exact message, check info and, with
    `site = (function, line)`, the host frame of its enqueue site."""
    assert flag.kind == ndx.NDX_ERROR_CHECK and flag.kind_name == "CheckError", (flag.kind_name, flag)
    assert (flag.op, flag.sequence) == (op, seq), (flag.op, flag.sequence, flag.message)
    assert flag.message == message, flag.message
    assert flag.check_info == ndx.CheckInfo(category, first_index, count, occurrences, sample, consequence_of), (
        flag.check_info
    )
    assert flag.frames, "a flag carries its enqueue site"
    if site is not None:
        f0 = flag.frames[0]
        assert (f0.function, f0.line, f0.origin) == (*site, ndx.NDX_FRAME_HOST), flag.frames
        assert os.path.realpath(f0.file) == THIS_FILE, flag.frames
        assert f"line {site[1]}, in {site[0]}" in flag.traceback_text, flag.traceback_text


def no_flags(ctx):
    assert ctx.take_check_errors() is None
    ctx.evaluate()


# ----------------------------------------------------------------------- the operators

PASS_THROUGH = {
    # op: (args, array whose elements fail the check, array that passes)
    "check": ({"message": "positive"}, np.array([[True, False, True], [False, True, True]]), np.ones((2, 3), bool)),
    "check_finite": (None, np.array([[1.0, np.nan, 3.0], [-np.inf, 5.0, 6.0]]), np.zeros((2, 3))),
    "check_range": ({"lo": -1.0, "hi": 4.0}, np.array([[1, 7, -3], [0, 4, 9]], np.int32), np.zeros((2, 3), np.int32)),
    "check_shape": ({"pattern": [-1, 2]}, np.zeros((2, 3), np.uint8), np.zeros((4, 2), np.uint8)),
}


@pytest.mark.parametrize("policy", [OFF, COLLECT], ids=["OFF", "COLLECT"])
@pytest.mark.parametrize("failing", [True, False], ids=["failing", "passing"])
@pytest.mark.parametrize("op", sorted(PASS_THROUGH))
def test_operator_passes_its_input_through(context, op, failing, policy):
    """The output of a compact input is the input itself: same dtype, shape and
    values, and the same memory: a write into the imported array after the work is
    done shows in the output, and its DLPack export has the input's address."""
    args, bad, good = PASS_THROUGH[op]
    base = np.array(bad if failing else good, copy=True)
    ctx = context(check_policy=policy)
    t = ndx.tensor_from_numpy(base)
    fut = ctx.invoke(op, [t], args=args)
    fut.wait()
    out = fut.tensor(0)
    assert (out.dtype, out.shape) == (t.dtype, t.shape)
    assert dlpack_view(out) == (base.ctypes.data, base.shape, (base.shape[1], 1))
    np.testing.assert_array_equal(out.numpy(), base, strict=True)
    base[...] = np.flip(base)  # nothing reads it any more: allowed
    np.testing.assert_array_equal(out.numpy(), base, strict=True)
    err = ctx.take_check_errors()
    if policy == COLLECT and failing:
        (flag,) = group_flags(err, 1)
        assert flag.op == op and flag.check_info.category == USER, flag
    else:
        assert err is None, err
    ctx.evaluate()


def test_output_strides_of_a_passed_through_view(context):
    base = np.arange(6.0).reshape(2, 3)
    t = ndx.tensor_from_numpy(base[:, ::-1])
    fut = context(check_policy=COLLECT).invoke("check_finite", [t])
    fut.wait()
    # Outputs are compact: a strided view passes through as a compact copy.
    assert t.strides == (3, -1)
    assert fut.tensor(0).strides == (3, 1)
    np.testing.assert_array_equal(fut.result(), base[:, ::-1], strict=True)


@pytest.mark.parametrize("op", sorted(PASS_THROUGH))
def test_debug_backend_accepts_the_pass_through(context, op):
    """The `debug` backend reports outputs sharing an input's memory, except a
    built-in passing an input through as it is."""
    args, _, good = PASS_THROUGH[op]
    ctx = context(check_policy=COLLECT, backend="debug")
    fut = ctx.invoke(op, [good], args=args)
    np.testing.assert_array_equal(fut.result(), good, strict=True)
    no_flags(ctx)


def test_each_operator_reports_what_failed(context):
    ctx = context(check_policy=COLLECT)
    fn = "test_each_operator_reports_what_failed"
    lines = []
    lines.append(next_line())
    ctx.invoke("check", [np.array([True, False, False, True])], args={"message": "all positive"})
    lines.append(next_line())
    ctx.invoke("check", [np.array([[True, False], [False, False]])])  # default message "check"
    lines.append(next_line())
    ctx.invoke("check_finite", [NOT_FINITE])
    lines.append(next_line())
    ctx.invoke("check_range", [np.array([0.0, 5.0, -1.0, 2.0, np.nan])], args={"lo": 0.0, "hi": 2.0})  # NaN is outside
    lines.append(next_line())
    ctx.invoke("check_range", [np.array([3, 1, 0, 9], np.int32)], args={"lo": 2})  # hi: +inf
    lines.append(next_line())
    ctx.invoke("check_shape", [np.zeros((2, 3, 4))], args={"pattern": [2, -1, 5]})
    lines.append(next_line())
    ctx.invoke("check_shape", [np.zeros((2, 3, 4))], args={"pattern": [2, -1]})  # rank differs
    flags = group_flags(ctx.take_check_errors(), 7)
    u = "USER check failed: "
    assert_flag(flags[0], "check", 1, u + "all positive: 2 of 4 elements false (first at flat index 1)", USER, 1, 2,
                site=(fn, lines[0]))
    assert_flag(flags[1], "check", 2, u + "check: 3 of 4 elements false (first at flat index 1)", USER, 1, 3,
                site=(fn, lines[1]))
    assert_flag(flags[2], "check_finite", 3, u + "2 of 4 elements not finite (first at flat index 1)", USER, 1, 2,
                site=(fn, lines[2]))
    assert_flag(flags[3], "check_range", 4, u + "3 of 5 elements outside [0, 2] (first at flat index 1)", USER, 1, 3,
                site=(fn, lines[3]))
    assert_flag(flags[4], "check_range", 5, u + "2 of 4 elements outside [2, inf] (first at flat index 1)", USER, 1,
                2, site=(fn, lines[4]))
    # check_shape: first_index is the first mismatching axis (the rank, when it differs).
    shape_msg = u + "shape [2, 3, 4] does not match the pattern {} (-1: any size)"
    assert flags[5].message.startswith(shape_msg.format("[2, -1, 5]")), flags[5].message
    assert flags[5].check_info == ndx.CheckInfo(USER, 2, 1, 1, -1, 0), flags[5].check_info
    assert flags[6].message.startswith(shape_msg.format("[2, -1]")), flags[6].message
    assert flags[6].check_info == ndx.CheckInfo(USER, 2, 1, 1, -1, 0), flags[6].check_info
    assert [(f.op, f.sequence) for f in flags[5:]] == [("check_shape", 6), ("check_shape", 7)]
    no_flags(ctx)


def test_passing_checks_raise_nothing(context):
    ctx = context(check_policy=COLLECT)
    ctx.invoke("check", [np.ones(5, bool)], args={"message": "fine"})
    ctx.invoke("check_finite", [FINITE])
    ctx.invoke("check_finite", [np.array([2**31 - 1, -(2**31)], np.int32)])  # integers are finite
    ctx.invoke("check_range", [np.array([-1.0, 0.0, 1.0])], args={"lo": -1.0, "hi": 1.0})  # bounds included
    ctx.invoke("check_range", [np.array([1e300, -1e300])])  # no bounds: (-inf, inf)
    ctx.invoke("check_shape", [np.zeros((2, 3))], args={"pattern": [-1, 3]})
    ctx.invoke("check_shape", [np.zeros((), np.float32)], args={"pattern": []})
    no_flags(ctx)


# ----------------------------------------------------------------------- reports


@pytest.mark.parametrize("report", ["evaluate", "take"])
@pytest.mark.parametrize("mode", MODES.values(), ids=MODES.keys())
def test_flags_reported_once_in_enqueue_order(context, mode, report):
    """COLLECT: computation goes on; the flags come back in enqueue order, with op,
    sequence number, message, check info and the Python line of the enqueue site,
    through `ndx_context_evaluate` (a CheckError group) or
    `ndx_context_take_check_errors`, and are reported once."""
    ctx = context(mode=mode, check_policy=COLLECT)
    fn = "test_flags_reported_once_in_enqueue_order"
    lines = [next_line()]
    a = ctx.invoke("check_finite", [NOT_FINITE])
    lines.append(next_line())
    b = ctx.invoke("check_range", [np.array([10, 20, 30, 40, 50], np.int64)], args={"lo": 15.0, "hi": 35.0})
    c = ctx.invoke("neg", [FINITE])  # no flag
    lines.append(next_line())
    d = ctx.invoke("check", [np.array([False, True, False])], args={"message": "mask"})
    futures = [a, b, c, d]
    if mode == ndx.NDX_EVAL_DEFERRED:
        assert ctx.take_check_errors() is None, "nothing has run yet"
    if report == "evaluate":
        if mode == ndx.NDX_EVAL_DEFERRED:
            for f in futures:
                f.release()  # evaluate runs what is recorded
        with pytest.raises(ndx.NdxError) as info:
            ctx.evaluate()
        err = info.value
    else:
        for f in futures:
            f.wait()
        err = ctx.take_check_errors()
    flags = group_flags(err, 3)
    assert_flag(flags[0], "check_finite", 1, "USER check failed: 2 of 4 elements not finite (first at flat index 1)",
                USER, 1, 2, site=(fn, lines[0]))
    assert_flag(flags[1], "check_range", 2, "USER check failed: 3 of 5 elements outside [15, 35] (first at flat "
                "index 0)", USER, 0, 3, site=(fn, lines[1]))
    assert_flag(flags[2], "check", 4, "USER check failed: mask: 2 of 3 elements false (first at flat index 0)",
                USER, 0, 2, site=(fn, lines[2]))
    assert f"line {lines[0]}, in {fn}" in err.traceback_text, err.traceback_text
    no_flags(ctx)  # reported once, by either path
    if report == "evaluate" and mode != ndx.NDX_EVAL_DEFERRED:
        np.testing.assert_array_equal(a.result(), NOT_FINITE, strict=True)  # not failed
        np.testing.assert_array_equal(c.result(), -FINITE, strict=True)


def test_deferred_work_raises_nothing_before_it_runs(context):
    ctx = context(mode=ndx.NDX_EVAL_DEFERRED, check_policy=COLLECT)
    fut = ctx.invoke("check_finite", [NOT_FINITE])
    other = ctx.invoke("check", [np.zeros(2, bool)])
    assert ctx.take_check_errors() is None, "nothing has run"
    fut.wait()  # runs the first only
    (flag,) = group_flags(ctx.take_check_errors(), 1)
    assert (flag.op, flag.sequence) == ("check_finite", 1)
    other.release()
    with pytest.raises(ndx.NdxError) as info:
        ctx.evaluate()
    (flag,) = group_flags(info.value, 1)
    assert (flag.op, flag.sequence) == ("check", 2)
    no_flags(ctx)


def test_frames_without_a_frame_provider(context):
    """Without a frame provider the flag still carries its (native) site."""
    ctx = context(mode=ndx.NDX_EVAL_EAGER, provider=False, check_policy=COLLECT)
    ctx.invoke("check_finite", [NOT_FINITE]).wait()
    (flag,) = group_flags(ctx.take_check_errors(), 1)
    assert flag.frames and all(f.origin == ndx.NDX_FRAME_NATIVE for f in flag.frames), flag.frames
    assert flag.check_info == ndx.CheckInfo(USER, 1, 2, 1, -1, 0)


def test_evaluate_groups_flags_after_other_failures(context):
    """Unobserved failures and flags together: one RuntimeError whose related errors
    are the failures, then the check group last."""
    ctx = context(mode=ndx.NDX_EVAL_EAGER, check_policy=COLLECT)
    ctx.invoke("check_finite", [NOT_FINITE])
    ctx.set_backend("inject_runtime_error:neg")
    line = next_line()
    ctx.invoke("neg", [FINITE])
    with pytest.raises(ndx.NdxError) as info:
        ctx.evaluate()
    err = info.value
    assert err.kind == ndx.NDX_ERROR_RUNTIME and isinstance(err, RuntimeError), err
    assert err.message == (
        "1 invocation failed without being observed; the last related error is the group of raised check flags"
    ), err.message
    assert len(err.related) == 2, [e.message for e in err.related]
    failure, group = err.related
    assert failure.kind == ndx.NDX_ERROR_RUNTIME and failure.op == "neg" and failure.sequence == 2, failure
    assert failure.frames[0].line == line and failure.check_info is None
    (flag,) = group_flags(group, 1)
    assert_flag(flag, "check_finite", 1, "USER check failed: 2 of 4 elements not finite (first at flat index 1)",
                USER, 1, 2)
    no_flags(ctx)


# ----------------------------------------------------------------------- FAIL_FAST


def test_fail_fast_fails_the_invocation(context):
    ctx = context(check_policy=FAIL_FAST)
    site = where()
    fut = ctx.invoke("check_range", [np.array([0.5, 3.0, -2.0, 1.0])], args={"lo": 0.0, "hi": 1.0})
    assert fut.poll() == ndx.NDX_FUTURE_FAILED, "SYNC_CPU: failed when invoke returned"
    err = fut.error()
    assert isinstance(err, ndx.NdxCheckError)
    assert_flag(err, "check_range", 1, "USER check failed: 2 of 4 elements outside [0, 1] (first at flat index 1)",
                USER, 1, 2, site=site)
    assert err.traceback_text.rstrip().endswith(f"CheckError: {err.message}"), err.traceback_text
    with pytest.raises(ndx.NdxCheckError):
        fut.tensor(0).numpy()
    no_flags(ctx)  # observed; nothing collected under FAIL_FAST


@pytest.mark.parametrize("mode", MODES.values(), ids=MODES.keys())
def test_fail_fast_failure_propagates_downstream(context, mode):
    ctx = context(mode=mode, check_policy=FAIL_FAST)
    site = where()
    up = ctx.invoke("check_finite", [NOT_FINITE])
    down = ctx.invoke("neg", [up.tensor(0)])  # accepted at invoke
    with pytest.raises(ndx.NdxError) as info:
        down.wait()
    err = info.value
    assert err.kind == ndx.NDX_ERROR_CHECK and (err.op, err.sequence) == ("neg", 2), err
    assert err.message == "input 0 of 'neg' (#2) failed: it is the output of 'check_finite' (#1), which failed"
    assert err.check_info is None, "the consumer raised no flag itself"
    assert_flag(err.cause, "check_finite", 1, "USER check failed: 2 of 4 elements not finite (first at flat "
                "index 1)", USER, 1, 2, site=site)
    no_flags(ctx)


def test_fail_fast_integer_division_by_zero(context):
    """DIV under FAIL_FAST: a CheckError instead of the ValueError of OFF."""
    ctx = context(check_policy=FAIL_FAST)
    fut = ctx.invoke("div", [np.array([6, 7, 8], np.int32), np.array([2, 0, 0], np.int32)])
    err = fut.error()
    assert err is not None and err.kind == ndx.NDX_ERROR_CHECK, err
    assert err.message.startswith("DIV check failed: 2 elements divided by zero (first at flat index 1)"), err.message
    assert err.check_info == ndx.CheckInfo(DIV, 1, 2, 1, -1, 0)


def test_unobserved_fail_fast_failure_is_reported_by_evaluate(context):
    ctx = context(mode=ndx.NDX_EVAL_DEFERRED, check_policy=FAIL_FAST)
    site = where()
    ctx.invoke("check", [np.array([True, False, False])], args={"message": "m"}).release()
    with pytest.raises(ndx.NdxError) as info:
        ctx.evaluate()
    err = info.value
    assert err.kind == ndx.NDX_ERROR_RUNTIME and err.message == "1 invocation failed without being observed"
    (flag,) = err.related
    assert_flag(flag, "check", 1, "USER check failed: m: 2 of 3 elements false (first at flat index 1)", USER, 1, 2,
                site=site)
    no_flags(ctx)


# ----------------------------------------------------------------------- OFF


def test_off_is_the_default_and_raises_nothing(context):
    ctx = context()  # no check options: OFF
    futs = [
        ctx.invoke("check", [np.zeros(3, bool)], args={"message": "never"}),
        ctx.invoke("check_finite", [NOT_FINITE]),
        ctx.invoke("check_range", [np.array([9.0])], args={"lo": 0.0, "hi": 1.0}),
        ctx.invoke("check_shape", [np.zeros((2, 2))], args={"pattern": [3]}),
        ctx.invoke("add", [np.float32([3e38]), np.float32([3e38])]),
        ctx.invoke("slice", [np.arange(5)], args={"start": [-9], "end": [7]}),
        ctx.invoke("div", [np.array([1.0]), np.array([0.0])]),
    ]
    for f in futs:
        f.wait()
    np.testing.assert_array_equal(futs[4].result(), np.float32([np.inf]), strict=True)
    no_flags(ctx)
    # Integer division by zero stays an error when DIV is not checked.
    err = ctx.invoke("div", [np.array([1, 2], np.int32), np.array([1, 0], np.int32)]).error()
    assert err is not None and err.kind == ndx.NDX_ERROR_VALUE and "division by zero" in err.message, err
    assert err.check_info is None
    ctx.set_checks(COLLECT)
    ctx.set_checks(OFF)
    ctx.invoke("check", [np.zeros(3, bool)]).wait()
    no_flags(ctx)


# ----------------------------------------------------------------------- built-in categories


def test_nan_from_float32_overflow(context):
    ctx = context(check_policy=COLLECT)
    a = np.float32([3e38, 1.0, -3e38, 2.0])
    b = np.float32([3e38, 2.0, -3e38, 2.0])
    with np.errstate(over="ignore"):
        want = a + b
    assert np.isinf(want).sum() == 2
    site = where()
    out = ctx.invoke("add", [a, b]).result()
    np.testing.assert_array_equal(out, want, strict=True)  # computation goes on
    (flag,) = group_flags(ctx.take_check_errors(), 1)
    assert_flag(flag, "add", 1, "NAN check failed: 2 elements became NaN or infinite from finite inputs (first at "
                "flat index 0)", NAN, 0, 2, site=site)


ELEMENTS_BECAME = "NAN check failed: {} elements became NaN or infinite from finite inputs (first at flat index 1)"
NAN_CASES = {
    # op: (inputs, args, NumPy result, message)
    "exp": ((np.float32([0.0, 1000.0, 90.0]),), None, np.float32([1.0, np.inf, np.inf]), ELEMENTS_BECAME.format(2)),
    "log": ((np.float32([1.0, 0.0, 0.0]),), None, np.float32([0.0, -np.inf, -np.inf]), ELEMENTS_BECAME.format(2)),
    "sqrt": ((np.array([4.0, -1.0, -2.0]),), None, np.array([2.0, np.nan, np.nan]), ELEMENTS_BECAME.format(2)),
    "mul": ((np.array([2.0, 1e200, -1e300]), np.array([3.0, 1e200, 1e300])), None, np.array([6.0, np.inf, -np.inf]),
            ELEMENTS_BECAME.format(2)),
    "cast": ((np.array([1.0, 1e300, -1e300]),), {"dtype": ndx.NDX_DTYPE_FLOAT32}, np.float32([1.0, np.inf, -np.inf]),
             "NAN check failed: output 0 has 2 NaN or infinite elements from finite inputs (first at flat index 1)"),
    "sum": ((np.float32([[1.0, 3e38], [2.0, 3e38]]),), {"axes": [0]}, np.float32([3.0, np.inf]),
            "NAN check failed: output 0 has 1 NaN or infinite element from finite inputs (first at flat index 1)"),
}


@pytest.mark.parametrize("op", sorted(NAN_CASES))
def test_nan_category(context, op):
    """Math functions, reductions and casts flag NaN/Inf made from finite inputs."""
    inputs, args, want, message = NAN_CASES[op]
    ctx = context(check_policy=COLLECT)
    a = ndx.Args()
    for k, v in (args or {}).items():
        a.set_dtype(k, v) if k == "dtype" else a.set(k, v)
    site = where()
    out = ctx.invoke(op, list(inputs), args=a).result()
    np.testing.assert_array_equal(out, want, strict=True)
    (flag,) = group_flags(ctx.take_check_errors(), 1)
    count = int(np.sum(~np.isfinite(want)))
    assert_flag(flag, op, 1, message, NAN, 1, count, site=site)


def test_nan_flags_of_a_strided_view_index_its_logical_elements(context):
    """A unary operator reads a transposed view in place (no compact copy) and flags the
    NaNs it made at their logical flat indices, not the NaN it was given."""
    ctx = context(check_policy=COLLECT)
    base = np.array([[1.0, -1.0, 2.0], [np.nan, 3.0, -2.0]], np.float32)
    view = base.T  # logical order 1, nan, -1, 3, 2, -2
    site = where()
    out = ctx.invoke("log", [ndx.tensor_from_numpy(view)]).result()
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(out, np.log(view), strict=True)
    (flag,) = group_flags(ctx.take_check_errors(), 1)
    assert_flag(flag, "log", 1,
                "NAN check failed: 2 elements became NaN or infinite from finite inputs (first at flat "
                "index 2)", NAN, 2, 2, site=site)


def test_nan_not_raised_for_non_finite_inputs(context):
    ctx = context(check_policy=COLLECT)
    out = ctx.invoke("mul", [np.array([np.nan, np.inf, 1.0]), np.array([1.0, 2.0, 3.0])]).result()
    np.testing.assert_array_equal(out, [np.nan, np.inf, 3.0])
    ctx.invoke("exp", [np.float32([np.inf])]).wait()
    ctx.invoke("sum", [np.array([np.nan, 1.0])]).wait()
    no_flags(ctx)


@pytest.mark.parametrize("op,want", [("div", [3, 0, 0, -2]), ("floordiv", [3, 0, 0, -2]), ("mod", [0, 0, 0, 1])])
def test_integer_division_by_zero_gives_zero_and_a_flag(context, op, want):
    ctx = context(check_policy=COLLECT)
    a = np.array([6, 7, 8, -3], np.int32)
    b = np.array([2, 0, 0, 2], np.int32)
    site = where()
    out = ctx.invoke(op, [a, b]).result()
    np.testing.assert_array_equal(out, np.array(want, np.int32), strict=True)
    (flag,) = group_flags(ctx.take_check_errors(), 1)
    assert_flag(flag, op, 1, "DIV check failed: 2 elements divided by zero (first at flat index 1)", DIV, 1, 2,
                site=site)


def test_float_division_by_zero_flags_div_and_nan(context):
    ctx = context(check_policy=COLLECT)
    out = ctx.invoke("div", [np.array([1.0, 2.0, 0.0]), np.array([0.0, 1.0, 0.0])]).result()
    np.testing.assert_array_equal(out, [np.inf, 2.0, np.nan])
    flags = group_flags(ctx.take_check_errors(), 2)
    got = {f.check_info.category: f for f in flags}
    assert set(got) == {DIV, NAN}
    assert got[DIV].check_info == ndx.CheckInfo(DIV, 0, 2, 1, -1, 0)
    assert got[NAN].check_info == ndx.CheckInfo(NAN, 0, 2, 1, -1, 0)
    assert all((f.op, f.sequence) == ("div", 1) for f in flags)


def test_division_by_zero_is_an_error_when_div_is_not_checked(context):
    ctx = context(check_policy=COLLECT, check_categories=USER | NAN)
    err = ctx.invoke("div", [np.array([1], np.int32), np.array([0], np.int32)]).error()
    assert err is not None and err.kind == ndx.NDX_ERROR_VALUE and "division by zero" in err.message, err
    no_flags(ctx)


def test_slice_bound_out_of_range(context):
    ctx = context(check_policy=COLLECT)
    x = np.arange(12).reshape(3, 4)
    site = where()
    out = ctx.invoke("slice", [x], args={"start": [1], "end": [10], "axes": [1]}).result()
    np.testing.assert_array_equal(out, x[:, 1:10], strict=True)  # clamped like NumPy
    ctx.invoke("slice", [np.arange(5)], args={"start": [-9], "end": [7]}).wait()
    ctx.invoke("slice", [np.arange(5)], args={"start": [-5], "end": [5]}).wait()  # [-n, n]: in range
    flags = group_flags(ctx.take_check_errors(), 2)
    assert flags[0].message.startswith(
        "INDEX check failed: slice end 10 out of range for axis 1 of size 4 (clamped)"
    ), flags[0].message
    assert (flags[0].op, flags[0].sequence) == ("slice", 1)
    assert flags[0].check_info == ndx.CheckInfo(INDEX, 1, 1, 1, -1, 0)  # first_index: the axis
    assert (flags[0].frames[0].function, flags[0].frames[0].line) == site
    assert flags[1].message.startswith(
        "INDEX check failed: slice start -9 and end 7 out of range for axis 0 of size 5 (clamped)"
    ), flags[1].message
    assert flags[1].check_info == ndx.CheckInfo(INDEX, 0, 2, 1, -1, 0)


def test_categories_select_what_is_checked(context):
    ctx = context(check_policy=COLLECT)
    ctx.set_checks(COLLECT, DIV)
    ctx.invoke("check", [np.zeros(2, bool)]).wait()  # USER: off
    ctx.invoke("add", [np.float32([3e38]), np.float32([3e38])]).wait()  # NAN: off
    ctx.invoke("slice", [np.arange(3)], args={"start": [0], "end": [9]}).wait()  # INDEX: off
    ctx.invoke("floordiv", [np.array([4], np.int64), np.array([0], np.int64)]).wait()
    (flag,) = group_flags(ctx.take_check_errors(), 1)
    assert (flag.op, flag.sequence, flag.check_info.category) == ("floordiv", 4, DIV)
    ctx.set_checks(COLLECT, 0)  # 0: every category
    ctx.invoke("check", [np.zeros(2, bool)]).wait()
    (flag,) = group_flags(ctx.take_check_errors(), 1)
    assert flag.check_info.category == USER


def test_set_checks_keeps_flags_already_collected(context):
    ctx = context(check_policy=COLLECT)
    ctx.invoke("check_finite", [NOT_FINITE]).wait()
    ctx.set_checks(OFF)
    ctx.invoke("check_finite", [NOT_FINITE]).wait()
    (flag,) = group_flags(ctx.take_check_errors(), 1)
    assert flag.sequence == 1


# ----------------------------------------------------------------------- folding, capacity


def test_check_in_a_loop_is_folded(context):
    """A check enqueued repeatedly at one line is reported once: the first raising
    invocation's message, op and sequence, the count summed, the occurrences."""
    ctx = context(check_policy=COLLECT)
    fn = "test_check_in_a_loop_is_folded"
    data = np.array([0.5, 7.0, 8.0, -1.0, 0.25, 9.0])
    line = None
    for n in (1, 3, 4, 5, 6):
        line = next_line()
        ctx.invoke("check_range", [data[:n]], args={"lo": 0.0, "hi": 1.0})  # the first passes
    other = next_line()
    ctx.invoke("check_range", [data], args={"lo": 0.0, "hi": 1.0})  # another line: another flag
    flags = group_flags(ctx.take_check_errors(), 2)
    # Failing elements per invocation: 2 + 3 + 3 + 4 = 12, in 4 invocations (#2 to #5).
    assert_flag(flags[0], "check_range", 2, "USER check failed: 2 of 3 elements outside [0, 1] (first at flat index "
                "1); raised 4 times at this site (first by #2): 12 failing elements in all", USER, 1, 12,
                occurrences=4, site=(fn, line))
    assert_flag(flags[1], "check_range", 6, "USER check failed: 4 of 6 elements outside [0, 1] (first at flat "
                "index 1)", USER, 1, 4, site=(fn, other))


def test_capacity_drops_and_counts(context):
    ctx = context(check_policy=COLLECT, check_capacity=2)
    for _ in range(3):  # one site: folded, never dropped
        ctx.invoke("check_finite", [NOT_FINITE])
    ctx.invoke("check", [np.zeros(1, bool)])
    ctx.invoke("check", [np.zeros(2, bool)])
    ctx.invoke("check_finite", [NOT_FINITE])
    ctx.invoke("check_finite", [NOT_FINITE])
    err = ctx.take_check_errors()
    assert err.message == (
        "2 checks failed (in enqueue order); 3 more flags were dropped: the context keeps 2 distinct flags "
        "(check_capacity)"
    ), err.message
    assert [(f.op, f.sequence, f.check_info.occurrences) for f in err.related] == [
        ("check_finite", 1, 3),
        ("check", 4, 1),
    ]
    ctx.set_checks(COLLECT, 0, 1)
    ctx.invoke("check", [np.zeros(1, bool)])
    ctx.invoke("check", [np.zeros(1, bool)])
    err = ctx.take_check_errors()
    assert err.message == (
        "1 check failed (in enqueue order); 1 more flag was dropped: the context keeps 1 distinct flags "
        "(check_capacity)"
    ), err.message
    assert [f.sequence for f in err.related] == [8]
    no_flags(ctx)


# ----------------------------------------------------------------------- consequences


@pytest.mark.parametrize("mode", MODES.values(), ids=MODES.keys())
def test_consequence_of_names_the_latest_flagged_upstream(context, mode):
    ctx = context(mode=mode, check_policy=COLLECT)
    a = ctx.invoke("check_finite", [NOT_FINITE])  # 1: root
    b = ctx.invoke("neg", [a.tensor(0)])  # 2: no flag, carries 1
    c = ctx.invoke("check_range", [b.tensor(0)], args={"lo": -1.5, "hi": 0.0})  # 3: consequence of 1
    d = ctx.invoke("check_range", [FINITE], args={"lo": 0.0, "hi": 1.0})  # 4: root (other line)
    e = ctx.invoke("add", [c.tensor(0), d.tensor(0)])  # 5: no flag, carries max(3, 4)
    f = ctx.invoke("check_finite", [e.tensor(0)])  # 6: consequence of 4
    for fut in (a, b, c, d, e, f):
        fut.release()
    with pytest.raises(ndx.NdxError) as info:
        ctx.evaluate()
    flags = group_flags(info.value, 4)
    got = [(fl.op, fl.sequence, fl.check_info.consequence_of) for fl in flags]
    assert got == [("check_finite", 1, 0), ("check_range", 3, 1), ("check_range", 4, 0), ("check_finite", 6, 4)]
    assert flags[1].message.endswith("; a consequence of the flag raised by #1"), flags[1].message
    assert flags[3].message.endswith("; a consequence of the flag raised by #4"), flags[3].message
    assert "consequence" not in flags[0].message and "consequence" not in flags[2].message


# ----------------------------------------------------------------------- batches


class Batch:
    """An owned `ndx_batch_t` imported from NumPy arrays (through `_raw`)."""

    ptr = None

    def __init__(self, arrays):
        caps = [a.__dlpack__(max_version=(1, 0)) for a in arrays]
        ptrs = (c_void_p * len(caps))(*[ndx._capi.PyCapsule_GetPointer(c, b"dltensor_versioned") for c in caps])
        out = c_void_p()
        ndx.check(_raw.ndx_batch_from_dlpack_versioned(ptrs, len(caps), None, byref(out)))
        for c in caps:
            ndx._capi.PyCapsule_SetName(c, ndx._USED_DLTENSOR_VERSIONED)
        self.ptr = out.value

    def __del__(self):
        if self.ptr:
            _raw.ndx_batch_release(self.ptr)

    def invoke(self, ctx, op, args=None):
        inputs = (ndx.ndx_input_t * 1)()
        inputs[0].batch = self.ptr
        out = c_void_p()
        ndx.check(_raw.ndx_invoke(ctx.ptr, op.encode(), inputs, 1, None if args is None else args.ptr, None,
                                  byref(out)))
        return ndx.Future(out.value)


def test_batch_flag_names_the_sample(context):
    ctx = context(check_policy=COLLECT)
    batch = Batch([np.float32([1.0, 2.0]), np.float32([4.0, np.nan, np.inf]), np.float32([3.0])])
    line = next_line()
    batch.invoke(ctx, "check_finite").wait()
    (flag,) = group_flags(ctx.take_check_errors(), 1)
    assert_flag(flag, "check_finite", 1, "USER check failed: 2 of 3 elements not finite in sample 1 (first at flat "
                "index 1)", USER, 1, 2, sample=1)
    f0, f1 = flag.frames[:2]  # Batch.invoke, then this line
    assert (f0.function, f1.function, f1.line) == ("invoke", "test_batch_flag_names_the_sample", line), flag.frames
    ctx.set_checks(FAIL_FAST)
    err = batch.invoke(ctx, "check_shape", ndx.Args(pattern=[2])).error()
    assert err.kind == ndx.NDX_ERROR_CHECK and "shape [3] does not match the pattern [2]" in err.message, err
    assert "in sample 1" in err.message and err.check_info == ndx.CheckInfo(USER, 0, 1, 1, 1, 0), err.check_info


def test_batch_occurrences_count_invocations(context):
    ctx = context(check_policy=COLLECT)
    batch = Batch([np.float32([np.nan, 1.0]), np.float32([np.inf, 2.0])])
    for _ in range(3):
        batch.invoke(ctx, "check_finite").wait()
    (flag,) = group_flags(ctx.take_check_errors(), 1)
    assert flag.check_info.occurrences == 3, flag.check_info


# ----------------------------------------------------------------------- arguments


@pytest.mark.parametrize("policy", [OFF, COLLECT], ids=["OFF", "COLLECT"])
def test_bad_operator_arguments_fail_at_invoke(context, policy):
    ctx = context(check_policy=policy)
    x = np.float32([1.0])
    cases = [
        ("check_range", {"lo": 2.0, "hi": 1.0}, ndx.NDX_ERROR_VALUE, "needs lo <= hi, got lo=2 and hi=1"),
        ("check_range", {"lo": float("nan")}, ndx.NDX_ERROR_VALUE, "needs lo <= hi, got lo=NaN and hi=inf"),
        ("check", {}, ndx.NDX_ERROR_TYPE, "operator 'check': needs a bool predicate, got float32"),
        ("check_shape", {"pattern": [-2]}, ndx.NDX_ERROR_VALUE, "pattern entries are sizes or -1 (any), got -2"),
        ("check_shape", {}, ndx.NDX_ERROR_VALUE, "needs argument 'pattern'"),
        ("check_finite", {"lo": 1.0}, ndx.NDX_ERROR_VALUE, "operator 'check_finite' has no argument 'lo'"),
    ]
    for op, args, kind, fragment in cases:
        with pytest.raises(ndx.NdxError) as info:
            site = where()
            ctx.invoke(op, [x], args=args)
        err = info.value
        assert err.kind == kind and fragment in err.message, (op, args, err.kind_name, err.message)
        assert err.message.count(f"operator '{op}'") == 1, err.message  # named once
        assert err.op == op and err.check_info is None, (op, err.op)
        assert (err.frames[0].function, err.frames[0].line) == site, err.frames
    no_flags(ctx)


def test_set_checks_rejects_bad_values(context):
    ctx = context(check_policy=COLLECT)
    for policy, categories, fragment in [
        (7, 0, "is 7, not an ndx_check_policy_t value (expected 1 to 3)"),
        (0, 0, "is 0, not an ndx_check_policy_t value (expected 1 to 3)"),
        (COLLECT, 16, "argument 'categories' is 0x10: unknown bits 0x10 (NDX_CHECK_ALL is 0xf)"),
        (COLLECT, 0xFF, "argument 'categories' is 0xff: unknown bits 0xf0 (NDX_CHECK_ALL is 0xf)"),
    ]:
        with pytest.raises(ndx.NdxValueError) as info:
            ctx.set_checks(policy, categories)
        assert fragment in info.value.message, info.value.message
    # Refused settings change nothing: still COLLECT, every category.
    ctx.invoke("check", [np.zeros(1, bool)])
    (flag,) = group_flags(ctx.take_check_errors(), 1)
    assert flag.check_info.category == USER


def test_null_arguments():
    err = ndx.NdxError.from_ptr(ndx.lib.ndx_context_take_check_errors(None))
    assert err.kind == ndx.NDX_ERROR_VALUE and "'ctx'" in err.message, err
    with pytest.raises(ndx.NdxValueError, match="'ctx'"):
        ndx.check(ndx.lib.ndx_context_set_checks(None, COLLECT, 0, 0))
    info = ndx.ndx_check_info_t()
    info.struct_size = ctypes.sizeof(info)
    assert not ndx.lib.ndx_error_check_info(None, byref(info))


def test_check_info_accessor(context):
    """`ndx_error_check_info` fills at most `struct_size` bytes, and answers false
    (leaving the struct alone) for errors that are not one flag."""
    ctx = context(check_policy=COLLECT)
    ctx.invoke("check_finite", [NOT_FINITE])
    group = ndx.lib.ndx_context_take_check_errors(ctx.ptr)
    assert group
    try:
        flag = ndx.lib.ndx_error_related(group, 0)
        info = ndx.ndx_check_info_t()
        info.struct_size = ndx.ndx_check_info_t.count.offset  # an older, shorter struct
        info.count = info.occurrences = 77
        assert ndx.lib.ndx_error_check_info(flag, byref(info))
        assert (info.struct_size, info.category, info.first_index) == (ndx.ndx_check_info_t.count.offset, USER, 1)
        assert (info.count, info.occurrences) == (77, 77), "nothing written past struct_size"
        assert not ndx.lib.ndx_error_check_info(flag, None)
        info.struct_size = ctypes.sizeof(info)
        info.category = 99
        assert not ndx.lib.ndx_error_check_info(group, byref(info)), "the group is not a flag"
        assert info.category == 99
    finally:
        ndx.lib.ndx_error_free(group)


# ----------------------------------------------------------------------- context options


def test_context_options_set_the_checks(context):
    ctx = context(check_policy=COLLECT)
    ctx.invoke("check", [np.zeros(2, bool)])
    ctx.invoke("div", [np.array([1], np.int32), np.array([0], np.int32)])
    assert [f.check_info.category for f in group_flags(ctx.take_check_errors(), 2)] == [USER, DIV]

    ctx = context(check_policy=COLLECT, check_categories=DIV)
    ctx.invoke("check", [np.zeros(2, bool)])
    ctx.invoke("mod", [np.array([1], np.int32), np.array([0], np.int32)])
    assert [f.op for f in group_flags(ctx.take_check_errors(), 1)] == ["mod"]

    ctx = context(check_policy=FAIL_FAST)
    assert ctx.invoke("check", [np.zeros(2, bool)]).error().kind == ndx.NDX_ERROR_CHECK

    ctx = context(check_categories=USER, check_capacity=3)  # no policy: OFF
    ctx.invoke("check", [np.zeros(2, bool)]).wait()
    no_flags(ctx)

    ctx = context(check_policy=COLLECT, check_capacity=1)
    ctx.invoke("check", [np.zeros(2, bool)])
    ctx.invoke("check_finite", [NOT_FINITE])
    assert "1 more flag was dropped: the context keeps 1 distinct flags" in ctx.take_check_errors().message


@pytest.mark.parametrize(
    "kw,fragment",
    [
        ({"check_policy": 7}, "opts->check_policy is 7, not an ndx_check_policy_t value (expected 1 to 3)"),
        ({"check_policy": -1}, "opts->check_policy is -1"),
        ({"check_categories": 0x20}, "opts->check_categories is 0x20: unknown bits 0x20 (NDX_CHECK_ALL is 0xf)"),
        ({"check_policy": COLLECT, "check_categories": 0x1F}, "opts->check_categories is 0x1f: unknown bits 0x10"),
    ],
)
def test_context_options_reject_bad_values(kw, fragment):
    with pytest.raises(ndx.NdxValueError) as info:
        ndx.Context(**kw)
    assert fragment in info.value.message, info.value.message


def test_older_options_struct_gets_the_default_checks():
    """A caller whose struct_size ends before check_policy gets OFF, whatever the
    bytes after it hold."""
    opts = ndx.ndx_context_options_t()
    opts.struct_size = ndx.ndx_context_options_t.check_policy.offset
    opts.eval_mode = SYNC
    opts.check_policy, opts.check_categories = 7, 0xFFFF  # invalid, but not read
    out = c_void_p()
    ndx.check(ndx.lib.ndx_context_new(byref(opts), byref(out)))
    ctx = ndx.Context.__new__(ndx.Context)
    ctx.ptr, ctx.provider = out.value, None
    try:
        assert ctx.invoke("check", [np.zeros(2, bool)]).error() is None
        no_flags(ctx)
        err = ctx.invoke("div", [np.array([1], np.int32), np.array([0], np.int32)]).error()
        assert err.kind == ndx.NDX_ERROR_VALUE, err
    finally:
        ctx.release()


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_check_struct_layouts_match_header(tmp_path):
    structs = {"ndx_check_info_t": ndx.ndx_check_info_t, "ndx_context_options_t": ndx.ndx_context_options_t}
    consts = ["NDX_CHECKS_OFF", "NDX_CHECKS_COLLECT", "NDX_CHECKS_FAIL_FAST", "NDX_CHECK_NAN", "NDX_CHECK_DIV",
              "NDX_CHECK_INDEX", "NDX_CHECK_USER", "NDX_CHECK_ALL", "NDX_ERROR_CHECK"]
    got, expected = c_layout(tmp_path, header_dir(), structs, consts)
    assert got == expected
