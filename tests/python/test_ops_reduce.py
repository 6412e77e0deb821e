"""Reductions through the C ABI (`ndx_invoke`, SYNC_CPU), compared with NumPy 2 on
random inputs of every dtype: sum prod mean min max all any argmin argmax, over each
choice of `axes` (absent = every axis, one axis, several, negative, unordered) with
`keepdims` absent / false / true, on compact and strided (DLPack views: transposed,
stepped, reversed, broadcast) inputs, 0-d and zero-size tensors, and the errors.

Run: NDX_LIBRARY=/path/to/libndx.so python3 -m pytest -q tests/python/test_ops_reduce.py

References (docs/operators.md, "Reductions"):
  sum prod   np.sum / np.prod with dtype=int64 (bool, signed) or uint64 (unsigned),
             exact (integers wrap modulo 2**64 in both, whatever the order); floats
             reduced in float64 and rounded once to their dtype.
  mean       np.mean of the input as float64, rounded to float64 (integers, bool) or
             to the input's float dtype; NaN over no elements.
  min max    np.min / np.max (same dtype, NaN propagates), exact.
  all any    np.all / np.any, exact.
  argmin     np.argmin / np.argmax(x, axis=, keepdims=) as int64, exact (the first
  argmax     extreme wins; the first NaN beats everything).
Float inputs of sum and mean are small multiples of 1/16, so that every float64
partial sum is exact and the reference does not depend on the order of summation.
"""

import os
import sys
import warnings
import zlib

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ndx_ctypes as ndx  # noqa: E402

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
I64, U64 = np.dtype(np.int64), np.dtype(np.uint64)
BOOL = np.dtype(np.bool_)
INTS = [np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64)]
UINTS = [np.dtype(t) for t in (np.uint8, np.uint16, np.uint32, np.uint64)]
FLOATS = [F16, F32, F64]
ALL = [BOOL] + INTS + UINTS + FLOATS

# ------------------------------------------------------------------- tolerances
# The one table: rtol of float results of sum / prod / mean, relative to the float64
# reference rounded to the result dtype (assert_allclose, equal_nan). Every other
# result (integer, bool, min/max, argmin/argmax, all/any) is compared exactly.
TOL = {F64: 1e-12, F32: 1e-5, F16: 1e-2}

# ------------------------------------------------------------------- operators

AXES_OPS = ["sum", "prod", "mean", "min", "max", "all", "any"]  # take `axes`
ARG_OPS = ["argmin", "argmax"]  # take `axis`
OPS = AXES_OPS + ARG_OPS
APPROX_OPS = ("sum", "prod", "mean")  # float results compared with TOL


def name(dt):
    return np.dtype(dt).name


def is_int(dt):
    return dt.kind in "iu"


def is_float(dt):
    return dt.kind == "f"


def _np_axis(axes):
    return None if axes is None else tuple(axes)


def reference(op, x, axes=None, keepdims=False):
    """NumPy's answer for `op` (see the module docstring). For argmin/argmax `axes`
    is the single `axis` (an int) or None."""
    dt = x.dtype
    if op in ("sum", "prod"):
        fn = np.sum if op == "sum" else np.prod
        ax = _np_axis(axes)
        if is_float(dt):
            with np.errstate(all="ignore"):  # inf - inf, overflow on rounding
                return np.asarray(fn(x.astype(F64), axis=ax, keepdims=keepdims)).astype(dt)
        acc = U64 if dt.kind == "u" else I64
        return np.asarray(fn(x, axis=ax, dtype=acc, keepdims=keepdims))
    if op == "mean":
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)
            m = np.mean(x.astype(F64), axis=_np_axis(axes), keepdims=keepdims)
        return np.asarray(m).astype(dt if is_float(dt) else F64)
    if op in ("min", "max", "all", "any"):
        fn = {"min": np.min, "max": np.max, "all": np.all, "any": np.any}[op]
        return np.asarray(fn(x, axis=_np_axis(axes), keepdims=keepdims))
    if op in ARG_OPS:
        fn = np.argmin if op == "argmin" else np.argmax
        return np.asarray(fn(x, axis=axes, keepdims=keepdims)).astype(I64)
    raise AssertionError(op)


def expected_dtype(op, dt):
    if op in ("sum", "prod"):
        return dt if is_float(dt) else (U64 if dt.kind == "u" else I64)
    if op == "mean":
        return dt if is_float(dt) else F64
    if op in ("min", "max"):
        return dt
    if op in ("all", "any"):
        return BOOL
    return I64


def test_reference_dtypes():
    """The references have the dtypes docs/operators.md gives."""
    x = np.ones((2, 3), np.float64)
    for op in OPS:
        for dt in ALL:
            assert reference(op, x.astype(dt)).dtype == expected_dtype(op, dt), (op, dt)


# ------------------------------------------------------------------- inputs


def rng_for(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _ints(rng, dt, shape, lo, hi):
    info = np.iinfo(dt)
    return rng.integers(max(lo, info.min), min(hi, info.max), size=shape, dtype=dt, endpoint=True)


def _choice(rng, values, shape, p=None):
    return np.asarray(rng.choice(np.asarray(values, dtype=F64), size=shape, p=p))


def make_input(rng, op, dt, shape):
    return np.asarray(_make_input(rng, op, dt, shape))


def _make_input(rng, op, dt, shape):
    """Random values of `dt` and `shape` suited to `op`:

    sum       ints: the full range with min/max (wrapping is exact in both);
              floats: k/16, |k| <= 128 (float64 sums exact; exact in float16)
    mean      ints: the full range up to 32 bits, +-2**40 for 64 bits (float64 sums
              exact); floats as sum
    prod      ints from {-2, -1, 1, 2} (unsigned {1, 2, 3}) with a few zeros;
              floats: +-[0.5, 1.5] (no overflow / underflow in float16)
    min max   ints: the full range with min/max; floats: normal * 8
    argmin    few distinct values, so that ties occur (the first one wins)
    argmax
    all       mostly non-zero (floats: +-1.5, 0.25, nan, +-inf), ~15% zeros (+-0)
    any       mostly zero, ~15% non-zero
    bool      uniform, except all (mostly true) and any (mostly false)
    """
    shape = tuple(shape)
    if dt == BOOL:
        p = {"all": 0.85, "any": 0.15}.get(op, 0.5)
        return rng.random(shape) < p
    if op in ("all", "any"):
        nz = rng.random(shape) < (0.85 if op == "all" else 0.15)
        if is_int(dt):
            lo = -3 if dt.kind == "i" else 1
            vals = _ints(rng, dt, shape, lo, 3)
            vals[vals == 0] = 1
            return np.where(nz, vals, 0).astype(dt)
        vals = _choice(rng, [1.5, -2.0, 0.25, np.nan, np.inf, -np.inf], shape)
        zeros = _choice(rng, [0.0, -0.0], shape)
        return np.where(nz, vals, zeros).astype(dt)
    if is_int(dt):
        info = np.iinfo(dt)
        if op in ("sum", "min", "max"):
            x = _ints(rng, dt, shape, info.min, info.max)
            flat = x.reshape(-1)
            edges = [info.min, info.max, 0, 1]
            if flat.size >= 8:
                flat[rng.choice(flat.size, size=4, replace=False)] = np.array(edges, dtype=dt)
            return x
        if op == "mean":
            return _ints(rng, dt, shape, -(2**40), 2**40)  # clipped to the dtype
        if op == "prod":
            vals = [-2, -1, 1, 2] if dt.kind == "i" else [1, 2, 3]
            x = _choice(rng, vals, shape)
            x[rng.random(shape) < 0.03] = 0
            return x.astype(dt)
        if op in ARG_OPS:
            return _ints(rng, dt, shape, -3 if dt.kind == "i" else 0, 3)
        raise AssertionError(op)
    # floats
    if op in ("sum", "mean"):
        return (rng.integers(-128, 128, size=shape, endpoint=True) / 16).astype(dt)
    if op == "prod":
        mag = rng.uniform(0.5, 1.5, shape)
        return np.where(rng.random(shape) < 0.5, -mag, mag).astype(dt)
    if op in ("min", "max"):
        return (rng.standard_normal(shape) * 8).astype(dt)
    if op in ARG_OPS:
        return _choice(rng, [-1.5, -1.0, 0.0, 1.0, 1.5, 2.0], shape).astype(dt)
    raise AssertionError(op)


# Layouts: "compact" arrays of several shapes; strided views (not compact) of the
# logical shapes (4, 5, 6) and (7,), made by `make(base_shape)`.
COMPACT_SHAPES = [(4, 5, 6), (7,), (), (3, 1, 4)]
LAYOUTS = ["compact", "T", "step", "neg", "bcast"]


def inputs_for(make, layout):
    if layout == "compact":
        return [make(s) for s in COMPACT_SHAPES]
    if layout == "T":  # reversed axes, a partial transpose, a column
        return [make((6, 5, 4)).T, make((5, 4, 6)).transpose(1, 0, 2), make((7, 3))[:, 1]]
    if layout == "step":  # every 2nd along the outer and the inner axis
        return [make((8, 5, 12))[::2, :, ::2], make((14,))[::2]]
    if layout == "neg":  # negative strides
        return [make((4, 5, 6))[::-1, :, ::-1], make((7,))[::-1]]
    if layout == "bcast":  # zero strides
        return [np.broadcast_to(make((4, 1, 6)), (4, 5, 6)), np.broadcast_to(make((1,)), (7,))]
    raise AssertionError(layout)


def axes_choices(ndim):
    """`axes` values for a tensor of `ndim` (None: the argument is absent)."""
    if ndim == 0:
        return [None, ()]
    if ndim == 1:
        return [None, (0,), (-1,)]
    return [None, (0,), (1,), (2,), (-1,), (0, 2), (2, 0), (-1, -2), (-3, 1), (0, 1, 2)]


def axis_choices(ndim):
    """argmin/argmax `axis` values (None: absent, over the flattened tensor)."""
    if ndim == 0:
        return [None]
    if ndim == 1:
        return [None, 0, -1]
    return [None, 0, 1, 2, -1, -3]


KEEPDIMS = [None, False, True]  # None: the argument is absent (default false)

# ------------------------------------------------------------------- calling ndx


@pytest.fixture(scope="module")
def ctx():
    c = ndx.Context(mode=ndx.NDX_EVAL_SYNC_CPU)
    yield c
    c.release()


def compact_strides(shape):
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(out))


def make_args(op, axes=None, keepdims=None):
    """ndx_args for `op`: `axes` (an int array) or, for argmin/argmax, `axis` (an
    int); None leaves an argument out."""
    args = ndx.Args()
    if axes is not None:
        if op in ARG_OPS:
            args.set_int("axis", axes)
        else:
            args.set_int_array("axes", list(axes))
    if keepdims is not None:
        args.set_bool("keepdims", keepdims)
    return args


def run(ctx, op, x, args=None):
    """Invokes `op` (SYNC_CPU) on `x` and returns its single output as a NumPy array,
    after checking that the output is compact."""
    t = ndx.tensor_from_numpy(x)
    fut = ctx.invoke(op, [t], mode=ndx.NDX_EVAL_SYNC_CPU, args=args)
    try:
        assert fut.poll() != ndx.NDX_FUTURE_PENDING, "SYNC_CPU: done before invoke returned"
        fut.wait()
        assert fut.output_count() == 1
        with fut.tensor(0) as out:
            shape = out.shape
            if int(np.prod(shape, dtype=np.int64)) > 0:
                strides = out.strides
                want = compact_strides(shape)
                assert all(
                    s == w for s, w, n in zip(strides, want, shape) if n > 1
                ), f"{op}: output strides {strides} of shape {shape} are not compact"
            return out.numpy()
    finally:
        fut.release()
        t.release()


def invoke_error(ctx, op, x, args=None):
    """The NdxError that `ndx_invoke` itself returns."""
    t = ndx.tensor_from_numpy(x)
    try:
        with pytest.raises(ndx.NdxError) as info:
            ctx.invoke(op, [t], mode=ndx.NDX_EVAL_SYNC_CPU, args=args).release()
        return info.value
    finally:
        t.release()


def execution_error(ctx, op, x, args=None):
    """The NdxError of an invocation that is accepted but fails when it runs."""
    t = ndx.tensor_from_numpy(x)
    fut = ctx.invoke(op, [t], mode=ndx.NDX_EVAL_SYNC_CPU, args=args)  # must not raise
    try:
        assert fut.poll() == ndx.NDX_FUTURE_FAILED, "SYNC_CPU: failed before invoke returned"
        with pytest.raises(ndx.NdxError) as info:
            fut.wait()
        return info.value
    finally:
        fut.release()
        t.release()


def check(op, got, want, what=""):
    """Dtype, shape and values: TOL for float sum/prod/mean, exact otherwise."""
    want = np.asarray(want)
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, numpy {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape}, numpy {want.shape}"
    if op in APPROX_OPS and is_float(want.dtype):
        np.testing.assert_allclose(
            got.astype(F64), want.astype(F64), rtol=TOL[want.dtype], atol=0, equal_nan=True, err_msg=what
        )
    else:
        np.testing.assert_array_equal(got, want, err_msg=what, strict=True)


def describe(op, x, axes, keepdims):
    layout = "" if x.flags.c_contiguous else f" strides={x.strides}"
    key = "axis" if op in ARG_OPS else "axes"
    return f"{op}({name(x.dtype)}{list(x.shape)}{layout}, {key}={axes}, keepdims={keepdims})"


def check_all_choices(ctx, op, x):
    """`op` on `x` for every axes (axis) choice and keepdims absent / false / true."""
    choices = axis_choices(x.ndim) if op in ARG_OPS else axes_choices(x.ndim)
    for axes in choices:
        for keepdims in KEEPDIMS:
            what = describe(op, x, axes, keepdims)
            got = run(ctx, op, x, make_args(op, axes, keepdims))
            check(op, got, reference(op, x, axes, bool(keepdims)), what)


# ------------------------------------------------------------------- the matrix


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dt", ALL, ids=name)
@pytest.mark.parametrize("op", OPS)
def test_reduce(ctx, op, dt, layout):
    rng = rng_for("reduce", op, name(dt), layout)
    for x in inputs_for(lambda shape: make_input(rng, op, dt, shape), layout):
        if layout != "compact" and x.ndim > 0 and x.size > 1:
            assert not x.flags.c_contiguous, (layout, x.strides)
        check_all_choices(ctx, op, x)


@pytest.mark.parametrize("op", ARG_OPS)
def test_argmin_argmax_of_a_view_split_into_pieces_keep_the_first_extreme(ctx, op):
    """Over an axis of more than 2^18 elements of a reversed view, each output's
    argmin/argmax is found piece by piece and the pieces' answers joined in order: with
    the extremes repeated in every piece, the first one in logical order must win."""
    rng = rng_for("pieces", op)
    x = rng.integers(0, 3, size=(270000, 2), dtype=np.int32)
    for view, axis in ((x[::-1], 0), (x[::-1].T, 1)):
        assert not view.flags.c_contiguous
        got = run(ctx, op, view, make_args(op, axis))
        check(op, got, reference(op, view, axis), describe(op, view, axis, False))


@pytest.mark.parametrize("dt", [np.dtype(np.int32), I64, U64, F32, F64], ids=name)
@pytest.mark.parametrize("op", OPS)
def test_larger_inputs(ctx, op, dt):
    """Inputs large enough to be split into chunks (if ndx splits reductions)."""
    rng = rng_for("large", op, name(dt))
    for shape, axes_list in (
        ((257, 129), [None, (0,), (1,)]),
        ((3, 1000, 7), [None, (1,), (0, 2), (-1,)]),
    ):
        x = make_input(rng, op, dt, shape)
        for axes in axes_list:
            if op in ARG_OPS:
                axes = None if axes is None or len(axes) > 1 else axes[0]
            what = describe(op, x, axes, False)
            check(op, run(ctx, op, x, make_args(op, axes)), reference(op, x, axes), what)
        xt = x.T[::-1]  # strided: transposed and reversed
        what = describe(op, xt, None, False)
        check(op, run(ctx, op, xt, make_args(op)), reference(op, xt), what)


# ------------------------------------------------------------------- special values


def _specials(dt):
    """(6, 5) rows: [NaN inside] [+inf] [+inf and -inf] [NaN twice, inf] [-inf, NaN]
    [finite]."""
    nan, inf = np.nan, np.inf
    rows = [
        [1.0, nan, -2.0, 0.5, 3.0],
        [1.0, inf, -2.0, 0.5, 3.0],
        [inf, 1.0, -inf, 0.5, -2.0],
        [2.0, nan, -inf, nan, inf],
        [-inf, 0.5, nan, 1.5, -1.0],
        [0.25, -0.5, 1.0, -1.5, 2.0],
    ]
    return np.array(rows, dtype=F64).astype(dt)


@pytest.mark.parametrize("dt", FLOATS, ids=name)
@pytest.mark.parametrize("op", ["sum", "prod", "mean", "min", "max", "argmin", "argmax", "all", "any"])
def test_float_special_values(ctx, op, dt):
    """NaN propagates (sum prod mean min max); inf - inf is NaN; argmin/argmax: the
    first NaN wins; NaN and inf are true for all/any."""
    base = _specials(dt)
    for x in (base, base.T, base[::-1, ::-1]):
        choices = [None, 0, 1, -1] if op in ARG_OPS else [None, (0,), (1,), (-1, 0)]
        for axes in choices:
            what = describe(op, x, axes, False)
            check(op, run(ctx, op, x, make_args(op, axes)), reference(op, x, axes), what)


@pytest.mark.parametrize("dt", ALL, ids=name)
@pytest.mark.parametrize("op", ARG_OPS)
def test_arg_first_occurrence(ctx, op, dt):
    """Ties: the first index (in logical order, also through negative and zero
    strides) wins."""
    if dt == BOOL:
        row = np.array([False, True, True, False, True, False])
    else:
        row = np.array([2, 1, 1, 2, 0, 2, 0], dtype=dt)
    rows = np.stack([row, row[::-1], np.roll(row, 2)])
    for x in (row, row[::-1], rows, rows[:, ::-1], rows.T, np.broadcast_to(row, (3,) + row.shape)):
        for axis in [None] + list(range(-x.ndim, x.ndim)):
            what = describe(op, x, axis, False)
            check(op, run(ctx, op, x, make_args(op, axis)), reference(op, x, axis), what)


@pytest.mark.parametrize("dt", FLOATS, ids=name)
@pytest.mark.parametrize("op", ARG_OPS)
def test_arg_first_nan_wins(ctx, op, dt):
    x = np.array([1.0, -np.inf, np.nan, np.inf, np.nan, 0.0], dtype=F64).astype(dt)
    for view in (x, x[::-1], x[1:], x[::2]):
        what = describe(op, view, None, False)
        got = run(ctx, op, view, make_args(op))
        check(op, got, reference(op, view), what)
        assert int(got) == int(np.flatnonzero(np.isnan(view))[0]), what


# ------------------------------------------------------------------- accumulation


@pytest.mark.parametrize(
    "op,dt,values,want",
    [
        # float32: 1e8 + 1 is lost in float32, kept in float64
        ("sum", F32, [1e8, 1.0, -1e8], 1.0),
        # float16: 2048 + 1 rounds back to 2048 in float16; float64: 2052
        ("sum", F16, [2048.0, 1.0, 1.0, 1.0, 1.0], 2052.0),
        # float16: 60000 + 60000 overflows in float16; the float64 mean is 60000
        ("mean", F16, [60000.0, 60000.0, 60000.0], 60000.0),
        ("mean", F32, [3e38, 3e38, -1e38], 5e38 / 3),
        # float16 products: 256 * 256 overflows in float16, the product does not
        ("prod", F16, [256.0, 256.0, 1.0 / 1024], 64.0),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_floats_accumulate_in_float64(ctx, op, dt, values, want):
    x = np.array(values, dtype=dt)
    ref = reference(op, x)
    assert ref == np.asarray(want, F64).astype(dt)
    check(op, run(ctx, op, x, make_args(op)), ref, describe(op, x, None, False))


def test_integer_sums_wrap(ctx):
    cases = [
        ("sum", np.array([np.iinfo(I64).max, 1], I64)),
        ("sum", np.array([np.iinfo(U64).max, 2], U64)),
        ("sum", np.array([127, 127, 127], np.int8)),  # int64: no wrap in int8
        ("sum", np.array([255, 255], np.uint8)),
        ("sum", np.full(40, True)),
        ("prod", np.array([2**40, 2**30], I64)),  # wraps to 0 mod 2**64
        ("prod", np.array([-(2**62), 3], I64)),
        ("prod", np.array([2**63, 3], U64)),
        ("prod", np.array([-128, -128, -128], np.int8)),  # int64: -2**21
    ]
    for op, x in cases:
        with np.errstate(all="ignore"):
            want = reference(op, x)
        check(op, run(ctx, op, x, make_args(op)), want, describe(op, x, None, False))


@pytest.mark.parametrize("dt", [I64, U64, np.dtype(np.int32)], ids=name)
def test_mean_of_wide_integers_in_float64(ctx, dt):
    """The mean of [max, max] is max (a float64 sum), not a wrapped integer sum."""
    info = np.iinfo(dt)
    for values in ([info.max, info.max], [info.min, info.min, info.max]):
        x = np.array(values, dtype=dt)
        check("mean", run(ctx, "mean", x, make_args("mean")), reference("mean", x), describe("mean", x, None, False))


# ------------------------------------------------------------------- zero-size


ZERO_SIZE = [
    ((0,), [None, (0,)]),
    ((0, 3), [None, (0,), (1,), (0, 1)]),
    ((3, 0), [None, (0,), (-1,)]),
    ((2, 0, 4), [None, (0,), (1,), (2,), (0, 2)]),
]


@pytest.mark.parametrize("dt", [BOOL, np.dtype(np.int8), np.dtype(np.int32), U64, F16, F32, F64], ids=name)
@pytest.mark.parametrize("op", ["sum", "prod", "mean", "all", "any"])
def test_zero_size_identity(ctx, op, dt):
    """Over no elements: sum 0, prod 1, mean NaN, all true, any false (and empty
    outputs where the kept axes are empty)."""
    for shape, choices in ZERO_SIZE:
        x = np.zeros(shape, dtype=dt)
        for axes in choices:
            for keepdims in KEEPDIMS:
                what = describe(op, x, axes, keepdims)
                got = run(ctx, op, x, make_args(op, axes, keepdims))
                check(op, got, reference(op, x, axes, bool(keepdims)), what)


@pytest.mark.parametrize("dt", [BOOL, np.dtype(np.int16), U64, F16, F64], ids=name)
@pytest.mark.parametrize("op", ["min", "max", "argmin", "argmax"])
def test_zero_size_reduction_fails_at_execution(ctx, op, dt):
    """Reducing over no elements: ValueError ("zero-size") when the invocation runs;
    a zero-size input whose reduced axes are not empty gives an empty output."""
    for shape, choices in ZERO_SIZE:
        x = np.zeros(shape, dtype=dt)
        if op in ARG_OPS:
            choices = [None if a is None else a[0] for a in choices if a is None or len(a) == 1]
        for axes in choices:
            for keepdims in KEEPDIMS:
                what = describe(op, x, axes, keepdims)
                args = make_args(op, axes, keepdims)
                fails = _numpy_fails(op, x, axes)
                if fails:
                    err = execution_error(ctx, op, x, args)
                    assert err.kind == ndx.NDX_ERROR_VALUE and err.kind_name == "ValueError", (what, err)
                    assert "zero-size" in err.message, (what, err.message)
                    assert err.op == op, (what, err.op)
                else:
                    check(op, run(ctx, op, x, args), reference(op, x, axes, bool(keepdims)), what)


def _numpy_fails(op, x, axes):
    try:
        reference(op, x, axes)
        return False
    except ValueError:
        return True


def test_zero_size_cases_include_failures_and_empty_outputs():
    x = np.zeros((0, 3))
    assert _numpy_fails("min", x, None) and _numpy_fails("min", x, (0,))
    assert not _numpy_fails("min", x, (1,))
    assert _numpy_fails("argmin", np.zeros((3, 0)), 1) and not _numpy_fails("argmin", np.zeros((3, 0)), 0)


# ------------------------------------------------------------------- arguments


def test_axes_as_a_single_int(ctx):
    """An int is accepted where an int array is expected (it counts as one axis)."""
    x = make_input(rng_for("single"), "sum", F64, (4, 5, 6))
    for op in AXES_OPS:
        args = ndx.Args().set_int("axes", -2)
        check(op, run(ctx, op, x, args), reference(op, x, (-2,)), describe(op, x, -2, False))


def test_zero_d_keepdims(ctx):
    """0-d in, 0-d out, with or without keepdims (and argmin of a 0-d is 0)."""
    for dt in ALL:
        x = np.array(3, dtype=dt) if dt != BOOL else np.array(True)
        for op in OPS:
            for keepdims in KEEPDIMS:
                got = run(ctx, op, x, make_args(op, None, keepdims))
                check(op, got, reference(op, x, None, bool(keepdims)), describe(op, x, None, keepdims))
                assert got.shape == ()


# ------------------------------------------------------------------- errors


X3 = np.arange(120, dtype=np.float32).reshape(4, 5, 6)


@pytest.mark.parametrize("op", OPS)
def test_axis_out_of_range_fails_at_invoke(ctx, op):
    if op in ARG_OPS:
        cases = [(3, 3), (-4, -4), (100, 100)]
    else:
        cases = [((3,), 3), ((-4,), -4), ((0, 3), 3), ((1, -7), -7)]
    for axes, bad in cases:
        err = invoke_error(ctx, op, X3, make_args(op, axes))
        what = describe(op, X3, axes, None)
        assert err.kind == ndx.NDX_ERROR_INDEX and err.kind_name == "IndexError", (what, err)
        assert f"axis {bad} is out of range for a tensor of ndim 3" in err.message, (what, err.message)
    # A 0-d tensor has no axis 0 (for argmin/argmax NumPy accepts axis 0 and -1 on
    # 0-d arrays; ndx does not, consistently with `axes`).
    if op not in ARG_OPS:
        err = invoke_error(ctx, op, np.array(1.0), make_args(op, (0,)))
        assert err.kind == ndx.NDX_ERROR_INDEX, err
        assert "axis 0 is out of range for a tensor of ndim 0" in err.message, err.message


@pytest.mark.parametrize("op", AXES_OPS)
def test_repeated_axis_fails_at_invoke(ctx, op):
    for axes in [(1, 1), (0, -3), (2, 0, -1)]:
        err = invoke_error(ctx, op, X3, make_args(op, axes))
        assert err.kind == ndx.NDX_ERROR_VALUE and err.kind_name == "ValueError", (op, axes, err)
        with pytest.raises(ValueError):  # NumPy agrees
            np.sum(X3, axis=axes)


@pytest.mark.parametrize("op", OPS)
def test_unknown_argument_fails_at_invoke(ctx, op):
    """argmin/argmax take `axis`, not `axes`; the others `axes`, not `axis`."""
    wrong = "axes" if op in ARG_OPS else "axis"
    for args in (ndx.Args().set_int_array(wrong, [0]), ndx.Args().set_int(wrong, 0)):
        err = invoke_error(ctx, op, X3, args)
        assert err.kind == ndx.NDX_ERROR_VALUE and err.kind_name == "ValueError", (op, err)
        assert wrong in err.message, err.message


@pytest.mark.parametrize("op", OPS)
def test_wrong_argument_type_fails_at_invoke(ctx, op):
    cases = [
        ndx.Args().set_int("keepdims", 1),
        ndx.Args().set_float("keepdims", 1.0),
        ndx.Args().set_int_array("keepdims", [1]),
    ]
    if op in ARG_OPS:
        cases += [
            ndx.Args().set_float("axis", 1.0),
            ndx.Args().set_int_array("axis", [1]),
            ndx.Args().set_bool("axis", True),
        ]
    else:
        cases += [
            ndx.Args().set_float_array("axes", [1.0]),
            ndx.Args().set_float("axes", 1.0),
            ndx.Args().set_bool("axes", True),
        ]
    for args in cases:
        err = invoke_error(ctx, op, X3, args)
        assert err.kind == ndx.NDX_ERROR_TYPE and err.kind_name == "TypeError", (op, err)


@pytest.mark.parametrize("op", OPS)
def test_input_count_is_checked(ctx, op):
    x = ndx.tensor_from_numpy(X3)
    y = ndx.tensor_from_numpy(X3)
    try:
        for inputs in ([], [x, y]):
            with pytest.raises(ndx.NdxError):
                ctx.invoke(op, inputs, mode=ndx.NDX_EVAL_SYNC_CPU).release()
    finally:
        x.release()
        y.release()


def test_every_reduction_is_covered():
    assert set(OPS) == set("sum prod mean min max all any argmin argmax".split())


@pytest.mark.parametrize("op", OPS)
def test_a_broadcast_view_too_large_to_copy_is_a_memory_error(ctx, op):
    # np.broadcast_to views one float as 2^44 elements (strides 0); reducing it compacts
    # it first, and the 64 TiB copy is refused with MemoryError instead of aborting the
    # interpreter. The context goes on working.
    x = np.broadcast_to(np.float32(1.5), (2**44,))
    err = execution_error(ctx, op, x)
    assert err.kind == ndx.NDX_ERROR_MEMORY and err.kind_name == "MemoryError", (op, err)
    assert "a compact copy of the float32 tensor of shape [17592186044416]: cannot allocate " \
        "64.00 TiB (70368744177664 bytes) of host memory: " in err.message, err.message
    assert run(ctx, op, np.broadcast_to(np.float32(1.5), (4,))).shape == ()


@pytest.mark.parametrize("op", ["sum", "prod", "mean"])
def test_accumulators_of_a_huge_output_over_an_empty_axis_are_a_memory_error(ctx, op):
    x = np.zeros((2**44, 0), np.float32)
    err = execution_error(ctx, op, x, make_args(op, axes=[1]))
    assert err.kind == ndx.NDX_ERROR_MEMORY, (op, err)
    assert "the accumulators of the output of shape [17592186044416]: cannot allocate " \
        "128.00 TiB (140737488355328 bytes)" in err.message, err.message
