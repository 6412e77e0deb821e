"""Shape operators through the C ABI (`ndx_invoke`, SYNC_CPU), compared with NumPy 2:
reshape transpose slice flip squeeze expand_dims pad, on bool int8 int32 uint16 int64
float16 float32 float64, shapes 0-d, 1-d, (2, 3, 4), (1, 3, 1, 4) and a zero-size one,
compact and strided inputs (DLPack views: transposed, stepped, reversed, broadcast),
and the errors at `ndx_invoke`. Outputs are checked for dtype, shape, values (bit for
bit; two NaNs are equal) and compact strides, and the input for being left unchanged.

Run: NDX_LIBRARY=/path/to/libndx.so python3 -m pytest -q tests/python/test_ops_shape.py

References (arguments are ndx_args: int arrays, ints, floats):
  reshape(shape)             np.reshape(x, shape): C order, one -1
  transpose(perm?)           np.transpose(x, perm); default reverses the axes;
                             negative entries count from the end
  slice(start, end, step?,   x[s] with s[axes[i]] = slice(start[i], end[i], step[i]);
        axes?)               axes default 0, 1, ...; step default 1; bounds clamp
  flip(axes?)                np.flip(x, axis=tuple(axes)); default every axis
  squeeze(axes?)             np.squeeze(x, axis=tuple(axes)); default every size-1 axis
  expand_dims(axis)          np.expand_dims(x, axis); negative counts from the end of
                             the result
  pad(widths, value?)        np.pad(x, pairs, constant_values=np.array(value).astype(
                             dtype)); widths = before0, after0, before1, ...; value
                             default 0. (A 0-d input with widths []: x itself; NumPy's
                             np.pad fails on an empty pad_width.)
Pad values are chosen so that NumPy's conversion is defined (no float outside an
integer dtype's range, no NaN to an integer).

Errors, all at `ndx_invoke`: ValueError for a size mismatch (naming both shapes), two
-1s or another negative size in reshape, a perm that is not a permutation, step 0,
slice argument lengths that disagree, squeezing an axis whose size is not 1, a
negative or missing pad width, a repeated axis, a missing required argument, and sizes
that overflow int64 (reshape, pad); IndexError for an axis out of range (slice, flip,
squeeze, expand_dims); TypeError for an argument of the wrong type. Arguments at the
int64 limits (axes, bounds, steps, sizes) are tried too.
"""

import itertools
import os
import sys
import warnings
import zlib

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ndx_ctypes as ndx  # noqa: E402

BOOL = np.dtype(np.bool_)
I8, I32, I64 = np.dtype(np.int8), np.dtype(np.int32), np.dtype(np.int64)
U16 = np.dtype(np.uint16)
F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
DTYPES = [BOOL, I8, I32, U16, I64, F16, F32, F64]

OPS = ["reshape", "transpose", "slice", "flip", "squeeze", "expand_dims", "pad"]

SHAPES = [(), (6,), (2, 3, 4), (1, 3, 1, 4), (2, 0, 3)]
LAYOUTS = ["compact", "T", "step", "neg", "bcast"]

I64_MAX, I64_MIN = 2**63 - 1, -(2**63)


def name(dt):
    return np.dtype(dt).name


def rng_for(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


# ------------------------------------------------------------------- inputs


def make_values(rng, dt, shape):
    """Random values of `dt`: bool uniform; integers over the full range; floats
    normal * 100 with ~10% NaN, +-inf, +-0."""
    shape = tuple(shape)
    if dt == BOOL:
        return np.asarray(rng.random(shape) < 0.5)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True)
    x = rng.standard_normal(shape) * 100
    special = rng.random(shape) < 0.1
    picks = rng.choice(np.array([np.nan, np.inf, -np.inf, -0.0, 0.0]), size=shape)
    return np.asarray(np.where(special, picks, x)).astype(dt)


def view(make, shape, layout):
    """An array of logical `shape` in `layout` (None: no such view of a 0-d shape)."""
    shape = tuple(shape)
    n = len(shape)
    if layout == "compact":
        return make(shape)
    if n == 0:
        return None
    idx = [slice(None)] * n
    if layout == "T":  # reversed axes (1-d: a column of a matrix)
        if n == 1:
            return make((shape[0], 3))[:, 1]
        return make(shape[::-1]).T
    if layout == "step":  # every 2nd along the first and the last axis
        base = list(shape)
        base[0] *= 2
        idx[0] = slice(None, None, 2)
        if n > 1:
            base[-1] *= 2
            idx[-1] = slice(None, None, 2)
        return make(tuple(base))[tuple(idx)]
    if layout == "neg":  # the first and the last axis reversed
        idx[0] = slice(None, None, -1)
        idx[-1] = slice(None, None, -1)
        return make(shape)[tuple(idx)]
    if layout == "bcast":  # a zero stride on axis 1 (1-d: axis 0)
        ax = 1 if n > 1 else 0
        base = list(shape)
        base[ax] = 1
        return np.broadcast_to(make(tuple(base)), shape)
    raise AssertionError(layout)


def inputs_for(rng, dt, layout, shapes=SHAPES):
    out = []
    for shape in shapes:
        x = view(lambda s: make_values(rng, dt, s), shape, layout)
        if x is None:
            continue
        assert x.shape == tuple(shape), (layout, x.shape, shape)
        if layout != "compact" and x.size > 1:
            assert not x.flags.c_contiguous, (layout, shape, x.strides)
        out.append(x)
    return out


# ------------------------------------------------------------------- argument choices


RESHAPES = {
    (): [(), (1,), (1, 1), (-1,), (1, -1, 1)],
    (6,): [(6,), (2, 3), (3, 2), (-1,), (3, -1), (-1, 1, 2), (1, 6, 1), (6, 1)],
    (2, 3, 4): [
        (24,), (-1,), (4, 6), (2, 12), (4, 3, 2), (2, -1), (-1, 4), (1, 24),
        (2, 3, 4), (2, 3, 2, 2), (3, -1, 2), (1, 1, 24, 1),
    ],
    (1, 3, 1, 4): [(12,), (3, 4), (-1, 2), (1, 1, 12), (1, 3, 1, 4), (4, 1, 3), (-1,)],
    (2, 0, 3): [(0,), (-1,), (0, 6), (3, 0, 2), (6, 0), (0, 2, 3, 1), (-1, 3), (2, -1), (2, 0, 3)],
}

# (start, end, step, axes); None leaves step / axes out.
SLICES = {
    (): [([], [], None, None), ([], [], [], []), ([], [], [], None)],
    (6,): [
        ([1], [4], None, None),
        ([0], [6], [2], None),
        ([5], [-100], [-1], None),  # the whole axis reversed
        ([-2], [100], None, None),
        ([-100], [100], [3], None),
        ([4], [1], None, None),  # empty
        ([4], [1], [-2], None),
        ([-1], [-7], [-1], [-1]),
        ([I64_MAX], [I64_MIN], [-1], None),  # extreme bounds clamp
        ([I64_MIN], [I64_MAX], [1], [0]),
        ([0], [6], [10**18], None),  # one element
        ([3], [3], None, None),
        ([100], [200], None, None),
        ([-100], [-50], [-1], None),
    ],
    (2, 3, 4): [
        ([0, 1], [2, 3], None, None),  # default axes 0, 1
        ([1], [3], [1], [2]),
        ([3, 0], [-100, 100], [-2, 2], [2, 0]),
        ([-1], [-100], [-1], [1]),
        ([0, 0, 0], [2, 3, 4], [1, 1, 1], None),  # the identity
        ([1], [1], None, [0]),  # empty
        ([-100, -100, -100], [100, 100, 100], [-1, -1, -1], None),  # empty
        ([100, 100, 100], [-100, -100, -100], [-1, -2, -3], None),
        ([1, -2], [-1, 100], [1, -1], [-1, -3]),
        ([], [], None, None),
        ([0, 2], [4, 0], [3, -1], [2, 1]),
    ],
    (1, 3, 1, 4): [
        ([0, 1], [1, 3], [1, 1], [0, 3]),
        ([0], [0], None, [2]),
        ([2, 3], [-100, -100], [-1, -2], [1, 3]),
    ],
    (2, 0, 3): [
        ([0], [5], None, [1]),
        ([1, 2], [0, 0], [-1, -1], [0, 2]),
        ([0, 0, 1], [2, 0, 3], [1, 1, 1], None),
    ],
}


def choices(op, shape, dt=F64):
    """Keyword argument dicts for `op` on `shape` (None: the argument is absent);
    pad values suit `dt`."""
    n = len(shape)
    if op == "reshape":
        return [{"shape": s} for s in RESHAPES[shape]]
    if op == "transpose":
        perms = [None] + [list(p) for p in itertools.permutations(range(n))]
        perms += [[a - n for a in p] for p in list(itertools.permutations(range(n)))[1::3]]
        if n >= 2:
            perms.append([-1] + list(range(n - 1)))  # mixed signs
        return [{"perm": p} for p in perms]
    if op == "slice":
        return [{"start": a, "end": b, "step": c, "axes": d} for a, b, c, d in SLICES[shape]]
    if op == "flip":
        axes = [None, []] + [[a] for a in range(n)] + [[a - n] for a in range(n)]
        if n >= 2:
            axes += [[0, n - 1], [n - 1, 0], [-1, -2], list(range(n))]
        return [{"axes": a} for a in axes]
    if op == "squeeze":
        ones = [a for a in range(n) if shape[a] == 1]
        axes = [None, []] + [[a] for a in ones] + [[a - n] for a in ones]
        if len(ones) > 1:
            axes += [ones, ones[::-1], [ones[0], ones[-1] - n]]
        return [{"axes": a} for a in axes]
    if op == "expand_dims":
        return [{"axis": a} for a in range(-(n + 1), n + 1)]
    if op == "pad":
        widths = [[0] * (2 * n), [1] * (2 * n)]
        if n:
            widths.append([(i * 5 + 1) % 3 for i in range(2 * n)])
            widths.append([0] * (2 * n - 1) + [4])
            widths.append([3] + [0] * (2 * n - 1))
        out = [{"widths": w} for w in widths]
        return out + [{"widths": widths[-1], "value": v} for v in pad_values(dt)]
    raise AssertionError(op)


def pad_values(dt):
    """Pad values whose conversion to `dt` (np.array(value).astype(dt)) is defined."""
    vals = [0.0, 7.0, 2.75, 0.1]
    if dt == BOOL:
        return vals + [-3.5, np.nan, -0.0]
    if dt.kind == "f":
        return vals + [-3.5, -0.0, np.nan, np.inf, -np.inf, 1e5, 1e40, 1e-8, 65519.0, 1 / 3]
    info = np.iinfo(dt)
    vals = vals + [99.99]
    if dt.kind == "i":
        vals += [-3.5, -0.0, -0.9, float(info.min)]  # -2**k is exact in float64
    vals.append(float(info.max) if info.bits < 64 else float(2**62))
    return vals


def make_args(kw):
    """ndx_args from a dict: lists / tuples as int arrays, ints as ints, floats as
    floats; None leaves the argument out."""
    args = ndx.Args()
    for key, v in kw.items():
        if v is None:
            continue
        if isinstance(v, (list, tuple)):
            args.set_int_array(key, list(v))
        elif isinstance(v, float):
            args.set_float(key, v)
        else:
            args.set_int(key, int(v))
    return args


# ------------------------------------------------------------------- references


def reference(op, x, kw):
    if op == "reshape":
        return np.reshape(x, kw["shape"])
    if op == "transpose":
        return np.transpose(x, kw.get("perm"))
    if op == "slice":
        idx = [slice(None)] * x.ndim
        start, end = kw["start"], kw["end"]
        step = kw.get("step") or [1] * len(start)
        axes = kw.get("axes")
        axes = list(range(len(start))) if axes is None else axes
        for s, e, st, ax in zip(start, end, step, axes, strict=True):
            idx[ax % x.ndim] = slice(s, e, st)
        return x[tuple(idx)]
    if op == "flip":
        axes = kw.get("axes")
        return np.flip(x, axis=None if axes is None else tuple(axes))
    if op == "squeeze":
        axes = kw.get("axes")
        return np.squeeze(x, axis=None if axes is None else tuple(axes))
    if op == "expand_dims":
        return np.expand_dims(x, kw["axis"])
    if op == "pad":
        value = kw.get("value")
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)
            fill = np.array(0.0 if value is None else value).astype(x.dtype)
        if x.ndim == 0:
            assert kw["widths"] == []
            return x.copy()
        pairs = np.asarray(kw["widths"], dtype=np.int64).reshape(x.ndim, 2)
        return np.pad(x, pairs, mode="constant", constant_values=fill)
    raise AssertionError(op)


def test_references():
    """A few reference values computed by hand."""
    x = np.arange(24).reshape(2, 3, 4)
    assert reference("slice", x, {"start": [3], "end": [-100], "step": [-2], "axes": [2]}).tolist() == x[:, :, ::-2].tolist()
    assert reference("slice", np.arange(6), {"start": [I64_MAX], "end": [I64_MIN], "step": [-1]}).tolist() == [5, 4, 3, 2, 1, 0]
    assert reference("pad", np.array([1, 2], np.int8), {"widths": [1, 2], "value": -3.5}).tolist() == [-3, 1, 2, -3, -3]
    assert reference("pad", np.array([True]), {"widths": [1, 0], "value": 0.1}).tolist() == [True, True]
    assert reference("pad", np.array([1.0], np.float16), {"widths": [0, 1], "value": 1e5}).tolist() == [1.0, np.inf]
    assert reference("expand_dims", x, {"axis": -1}).shape == (2, 3, 4, 1)
    assert reference("expand_dims", x, {"axis": -4}).shape == (1, 2, 3, 4)
    assert reference("transpose", x, {"perm": [-1, 0, 1]}).shape == (4, 2, 3)


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


def run(ctx, op, x, args, what=""):
    """Invokes `op` (SYNC_CPU) on `x`; returns its single output as a NumPy array,
    after checking that the output is compact and `x` was left unchanged."""
    before = np.array(x, copy=True)
    t = ndx.tensor_from_numpy(x)
    fut = ctx.invoke(op, [t], mode=ndx.NDX_EVAL_SYNC_CPU, args=args)
    try:
        assert fut.poll() != ndx.NDX_FUTURE_PENDING, f"{what}: SYNC_CPU: pending after invoke"
        fut.wait()
        assert fut.output_count() == 1, what
        with fut.tensor(0) as out:
            shape = out.shape
            if int(np.prod(shape, dtype=np.int64)) > 0:
                strides = out.strides
                want = compact_strides(shape)
                assert all(s == w for s, w, n in zip(strides, want, shape) if n > 1), (
                    f"{what}: output strides {strides} of shape {shape} are not compact"
                )
            got = out.numpy()
    finally:
        fut.release()
        t.release()
    assert_same(x, before, f"{what}: the input was modified")
    return got


def invoke_error(ctx, op, x, args):
    """The NdxError that `ndx_invoke` itself returns."""
    t = ndx.tensor_from_numpy(x)
    try:
        with pytest.raises(ndx.NdxError) as info:
            ctx.invoke(op, [t], mode=ndx.NDX_EVAL_SYNC_CPU, args=args).release()
        return info.value
    finally:
        t.release()


_BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def assert_same(got, want, what):
    """Same dtype and shape, and the same values bit for bit (two NaNs are equal)."""
    want = np.asarray(want)
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, numpy {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape}, numpy {want.shape}"
    if want.dtype.kind == "f":
        g = np.ascontiguousarray(got)
        w = np.ascontiguousarray(want)
        bad = (g.view(_BITS[g.itemsize]) != w.view(_BITS[w.itemsize])) & ~(np.isnan(g) & np.isnan(w))
    else:
        bad = got != want
    if np.any(bad):
        i = tuple(int(k) for k in np.argwhere(bad)[0])
        raise AssertionError(
            f"{what}: {int(np.count_nonzero(bad))} of {want.size} elements differ; "
            f"first at {i}: ndx {got[i]!r}, numpy {want[i]!r}\nndx:\n{got}\nnumpy:\n{want}"
        )


def describe(op, x, kw):
    layout = "" if x.flags.c_contiguous else f" strides={x.strides}"
    given = ", ".join(f"{k}={v}" for k, v in kw.items() if v is not None)
    return f"{op}({name(x.dtype)}{list(x.shape)}{layout}, {given})"


def check(ctx, op, x, kw):
    what = describe(op, x, kw)
    got = run(ctx, op, x, make_args(kw), what)
    assert_same(got, reference(op, x, kw), what)


# ------------------------------------------------------------------- the matrix


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dt", DTYPES, ids=name)
@pytest.mark.parametrize("op", OPS)
def test_shape_op(ctx, op, dt, layout):
    rng = rng_for("shape", op, name(dt), layout)
    for x in inputs_for(rng, dt, layout):
        for kw in choices(op, x.shape, dt):
            check(ctx, op, x, kw)


@pytest.mark.parametrize("dt", [BOOL, I8, F16, F64], ids=name)
@pytest.mark.parametrize("op", OPS)
def test_larger_inputs(ctx, op, dt):
    """Larger inputs: compact, transposed + stepped + reversed, and a 2-d column."""
    rng = rng_for("large", op, name(dt))
    base = make_values(rng, dt, (37, 64, 9))
    for x in (base, base.transpose(2, 0, 1)[::-1, :, ::3], base[5:30:2, ::-1, 4]):
        if op == "reshape":
            kws = [{"shape": [-1]}, {"shape": list(x.shape[::-1])}, {"shape": [x.shape[0], -1]}]
        elif op == "slice":
            kws = [
                {"start": [1, -1], "end": [100, -100], "step": [2, -3], "axes": [0, -1]},
                {"start": [3], "end": [-2]},
                {"start": [-5, 2], "end": [-100, 11], "step": [-1, 4]},
            ]
        else:
            kws = choices(op, x.shape, dt)[:12]
        for kw in kws:
            check(ctx, op, x, kw)


def _reshape_choices_fit():
    for shape, news in RESHAPES.items():
        for new in news:
            assert np.reshape(np.zeros(shape), new) is not None


def test_reference_choices_are_valid():
    """Every choice is accepted by NumPy (so that errors below are the only errors)."""
    _reshape_choices_fit()
    for dt in DTYPES:
        for op in OPS:
            for shape in SHAPES:
                for kw in choices(op, shape, dt):
                    reference(op, np.zeros(shape, dt), kw)


# ------------------------------------------------------------------- single ints


@pytest.mark.parametrize(
    "op,key,value,kw",
    [
        ("reshape", "shape", -1, {"shape": [-1]}),
        ("reshape", "shape", 24, {"shape": [24]}),
        ("flip", "axes", 1, {"axes": [1]}),
        ("flip", "axes", -1, {"axes": [-1]}),
        ("transpose", "perm", 0, None),  # on a 1-d input
    ],
)
def test_single_int_for_an_int_array(ctx, op, key, value, kw):
    """An int is accepted where an int array is expected (it counts as one entry)."""
    x = make_values(rng_for("single", op, key, value), F32, (2, 3, 4) if kw else (5,))
    kw = kw or {key: [value]}
    args = ndx.Args().set_int(key, value)
    what = describe(op, x, {key: value})
    assert_same(run(ctx, op, x, args, what), reference(op, x, kw), what)


def test_single_int_squeeze_axes(ctx):
    x = make_values(rng_for("single squeeze"), I32, (1, 3, 1, 4))
    for a in (0, 2, -2, -4):
        args = ndx.Args().set_int("axes", a)
        what = describe("squeeze", x, {"axes": a})
        assert_same(run(ctx, "squeeze", x, args, what), np.squeeze(x, axis=a), what)


def test_pad_value_as_int(ctx):
    """`value` given with ndx_args_set_int (accepted for a float argument)."""
    for dt in DTYPES:
        x = make_values(rng_for("pad int", name(dt)), dt, (2, 3))
        for v in (0, 5, 1):
            args = ndx.Args().set_int_array("widths", [1, 0, 0, 2]).set_int("value", v)
            what = describe("pad", x, {"widths": [1, 0, 0, 2], "value": v})
            want = np.pad(x, ((1, 0), (0, 2)), constant_values=np.array(v).astype(dt))
            assert_same(run(ctx, "pad", x, args, what), want, what)


# ------------------------------------------------------------------- errors

X3 = np.arange(24, dtype=np.float32).reshape(2, 3, 4)


def shape_mentioned(message, shape):
    """Whether `message` shows `shape` as [2, 3, 4], (2, 3, 4) or 2x3x4."""
    inner = ", ".join(str(n) for n in shape)
    forms = [f"[{inner}]", f"({inner})", "x".join(str(n) for n in shape)]
    if len(shape) == 1:
        forms.append(f"({shape[0]},)")
    return any(f in message for f in forms)


def pid(v):
    """Test ids: arrays by dtype and shape."""
    if isinstance(v, np.ndarray):
        return f"{name(v.dtype)}{list(v.shape)}"
    return str(v)


def expect_error(ctx, op, x, kw, kind):
    what = describe(op, x, kw)
    err = invoke_error(ctx, op, x, make_args(kw))
    kinds = {ndx.NDX_ERROR_VALUE: "ValueError", ndx.NDX_ERROR_INDEX: "IndexError", ndx.NDX_ERROR_TYPE: "TypeError"}
    assert err.kind == kind, f"{what}: {err.kind_name} ({err.message}), expected {kinds[kind]}"
    assert err.kind_name == kinds[kind], (what, err.kind_name)
    return err


@pytest.mark.parametrize(
    "x,shape",
    [
        (X3, [5, 5]),
        (X3, [25]),
        (X3, [2, 3, 5]),
        (X3, [0]),
        (X3, []),
        (np.array(1.5), [2]),
        (np.array(1.5), [0]),
        (np.zeros((2, 0, 3), np.int8), [1]),
        (np.zeros((2, 0, 3), np.int8), []),
        (np.zeros((6,), np.int8), [4, 2]),
    ],
    ids=pid,
)
def test_reshape_numel_mismatch(ctx, x, shape):
    with pytest.raises(ValueError):
        np.reshape(x, shape)
    err = expect_error(ctx, "reshape", x, {"shape": shape}, ndx.NDX_ERROR_VALUE)
    assert shape_mentioned(err.message, x.shape), (shape, err.message)
    assert shape_mentioned(err.message, shape), (shape, err.message)


@pytest.mark.parametrize("shape", [[5, -1], [-1, 7], [-1, 5, 2]], ids=str)
def test_reshape_minus_one_that_does_not_divide(ctx, shape):
    with pytest.raises(ValueError):
        np.reshape(X3, shape)
    expect_error(ctx, "reshape", X3, {"shape": shape}, ndx.NDX_ERROR_VALUE)


@pytest.mark.parametrize("shape", [[-1, -1], [2, -1, -1], [-1, 3, -1, 1]], ids=str)
def test_reshape_two_unknowns(ctx, shape):
    expect_error(ctx, "reshape", X3, {"shape": shape}, ndx.NDX_ERROR_VALUE)


@pytest.mark.parametrize("shape", [[-2, -12], [2, -3, -4], [-24]], ids=str)
def test_reshape_negative_other_than_minus_one(ctx, shape):
    """Only -1 stands for an unknown size. (NumPy documents one -1, but quietly
    takes any negative size for it: np.reshape(x, [-24]) works; ndx refuses.)"""
    expect_error(ctx, "reshape", X3, {"shape": shape}, ndx.NDX_ERROR_VALUE)


@pytest.mark.parametrize(
    "x,shape",
    [
        (X3, [2**62 + 6, 4]),  # the product wraps to 24 in int64
        (X3, [2**61 + 3, 8, 1]),
        (np.zeros((2, 0, 3), np.float32), [2**32, 2**32]),  # wraps to 0
        (np.zeros((2, 0, 3), np.float32), [2**32, 2**32, 1]),
        (np.zeros((2, 0, 3), np.float32), [2**32, 2**32, 0]),
        (np.zeros((2, 0, 3), np.float32), [I64_MAX, I64_MAX, 0]),
    ],
    ids=pid,
)
def test_reshape_size_overflow(ctx, x, shape):
    """A shape whose size does not fit in int64 is refused at invoke (NumPy:
    ValueError), even where the int64 product wraps around to the input's size."""
    with pytest.raises(ValueError):
        np.reshape(x, shape)
    expect_error(ctx, "reshape", x, {"shape": shape}, ndx.NDX_ERROR_VALUE)


@pytest.mark.parametrize("shape", [[0, -1], [-1, 0], [2, 0, -1]], ids=str)
def test_reshape_zero_size_ambiguous_unknown(ctx, shape):
    """A -1 among sizes whose product is 0 is ambiguous on a zero-size input: NumPy's
    ValueError ("cannot reshape array of size 0 into shape (0,newaxis)")."""
    x = np.zeros((2, 0, 3), np.float32)
    with pytest.raises(ValueError):
        np.reshape(x, shape)
    expect_error(ctx, "reshape", x, {"shape": shape}, ndx.NDX_ERROR_VALUE)


@pytest.mark.parametrize(
    "perm",
    [[0, 0, 1], [0, 1], [0, 1, 2, 3], [], [2, -1, 0], [0, 1, 3], [0, 1, -4], [5, 0, 1], [I64_MIN, 0, 1]],
    ids=pid,
)
def test_transpose_not_a_permutation(ctx, perm):
    """Repeated, missing, extra or out-of-range entries: ValueError at invoke."""
    with pytest.raises(ValueError):
        np.transpose(X3, perm)
    expect_error(ctx, "transpose", X3, {"perm": perm}, ndx.NDX_ERROR_VALUE)


def test_transpose_zero_d(ctx):
    expect_error(ctx, "transpose", np.array(1.0), {"perm": [0]}, ndx.NDX_ERROR_VALUE)


@pytest.mark.parametrize(
    "kw",
    [
        {"start": [0], "end": [2], "step": [0]},
        {"start": [0, 0], "end": [2, 3], "step": [1, 0]},
        {"start": [0], "end": [2], "step": [0], "axes": [2]},
    ],
    ids=pid,
)
def test_slice_step_zero(ctx, kw):
    expect_error(ctx, "slice", X3, kw, ndx.NDX_ERROR_VALUE)


@pytest.mark.parametrize(
    "kw",
    [
        {"start": [0], "end": [1, 2]},
        {"start": [0, 0], "end": [1]},
        {"start": [0, 0], "end": [1, 1], "step": [1]},
        {"start": [0], "end": [1], "step": [1, 1]},
        {"start": [0], "end": [1], "axes": [0, 1]},
        {"start": [0, 0], "end": [1, 1], "axes": [1]},
        {"start": [0], "end": [1], "step": [1], "axes": []},
    ],
    ids=pid,
)
def test_slice_lengths_disagree(ctx, kw):
    expect_error(ctx, "slice", X3, kw, ndx.NDX_ERROR_VALUE)


@pytest.mark.parametrize(
    "x,kw",
    [
        (X3, {"start": [0], "end": [1], "axes": [3]}),
        (X3, {"start": [0], "end": [1], "axes": [-4]}),
        (X3, {"start": [0, 0], "end": [1, 1], "axes": [0, 100]}),
        (X3, {"start": [0, 0, 0, 0], "end": [1, 1, 1, 1]}),  # default axes 0..3
        (X3, {"start": [0], "end": [1], "axes": [I64_MIN]}),
        (np.array(2.0), {"start": [0], "end": [1]}),
        (np.array(2.0), {"start": [0], "end": [1], "axes": [0]}),
    ],
    ids=pid,
)
def test_slice_axis_out_of_range(ctx, x, kw):
    expect_error(ctx, "slice", x, kw, ndx.NDX_ERROR_INDEX)


@pytest.mark.parametrize("axes,kind", [([3], "index"), ([-4], "index"), ([0, 5], "index"), ([0, 0], "value"), ([0, -3], "value")], ids=pid)
def test_flip_bad_axes(ctx, axes, kind):
    """Out of range: IndexError; repeated: ValueError (as `axes` of the reductions)."""
    with pytest.raises((ValueError, IndexError)):
        np.flip(X3, axis=tuple(axes))
    k = ndx.NDX_ERROR_INDEX if kind == "index" else ndx.NDX_ERROR_VALUE
    expect_error(ctx, "flip", X3, {"axes": axes}, k)


def test_squeeze_axis_not_one(ctx):
    """Squeezing an axis whose size is not 1: ValueError at invoke (as NumPy)."""
    x = np.zeros((1, 3, 1, 4), np.int32)
    for axes in ([1], [3], [0, 1], [-1], [0, 2, 3]):
        with pytest.raises(ValueError):
            np.squeeze(x, axis=tuple(axes))
        expect_error(ctx, "squeeze", x, {"axes": axes}, ndx.NDX_ERROR_VALUE)
    z = np.zeros((2, 0, 3), np.int32)
    for axes in ([1], [0]):
        expect_error(ctx, "squeeze", z, {"axes": axes}, ndx.NDX_ERROR_VALUE)


@pytest.mark.parametrize(
    "x,axes,kind",
    [
        (np.zeros((1, 3, 1, 4)), [4], "index"),
        (np.zeros((1, 3, 1, 4)), [-5], "index"),
        (np.zeros((1, 3, 1, 4)), [I64_MIN], "index"),
        (np.array(1.0), [0], "index"),
        (np.zeros((1, 3, 1, 4)), [0, 0], "value"),
        (np.zeros((1, 3, 1, 4)), [2, -2], "value"),
    ],
    ids=pid,
)
def test_squeeze_bad_axes(ctx, x, axes, kind):
    """Out of range: IndexError; repeated: ValueError (as `axes` of the reductions)."""
    k = ndx.NDX_ERROR_INDEX if kind == "index" else ndx.NDX_ERROR_VALUE
    expect_error(ctx, "squeeze", x, {"axes": axes}, k)


@pytest.mark.parametrize(
    "x,axis",
    [(X3, 4), (X3, -5), (X3, 100), (X3, I64_MIN), (np.array(1.0), 2), (np.array(1.0), -2), (np.zeros(6), 2), (np.zeros(6), -3)],
    ids=pid,
)
def test_expand_dims_out_of_range(ctx, x, axis):
    # NumPy's AxisError is also an IndexError; -2**63 overflows NumPy's C int.
    with pytest.raises((IndexError, OverflowError)):
        np.expand_dims(x, axis)
    expect_error(ctx, "expand_dims", x, {"axis": axis}, ndx.NDX_ERROR_INDEX)


@pytest.mark.parametrize(
    "x,widths",
    [
        (X3, [0, 0, -1, 0, 0, 0]),
        (X3, [0, 0, 0, 0, 0, -2]),
        (X3, [-1, 0, 0, 0, 0, 0]),
        (X3, [0, 0, 0, 0, 0]),
        (X3, [0, 0, 0, 0, 0, 0, 0]),
        (X3, [0, 0, 0, 0, 0, 0, 0, 0]),
        (X3, [1, 1]),
        (X3, []),
        (np.array(1.0), [1, 1]),
        (np.zeros(6), [-1, 2]),
        (np.zeros(6), [1]),
    ],
    ids=pid,
)
def test_pad_bad_widths(ctx, x, widths):
    expect_error(ctx, "pad", x, {"widths": widths}, ndx.NDX_ERROR_VALUE)


@pytest.mark.parametrize(
    "widths",
    [[I64_MAX, 1], [I64_MAX, I64_MAX], [2**62, 2**62], [I64_MAX - 5, 0], [0, I64_MAX - 2]],
    ids=str,
)
def test_pad_size_overflow(ctx, widths):
    """Widths that make the output's size overflow int64: refused at invoke (ValueError
    or MemoryError; NumPy: ValueError), not a wrapped shape or a panic."""
    x = np.arange(6, dtype=np.float64)
    what = describe("pad", x, {"widths": widths})
    err = invoke_error(ctx, "pad", x, make_args({"widths": widths}))
    assert err.kind in (ndx.NDX_ERROR_VALUE, ndx.NDX_ERROR_MEMORY), f"{what}: {err.kind_name} ({err.message})"


@pytest.mark.parametrize(
    "start,end,step",
    [
        ([0], [6], [I64_MAX]),  # x[0:6:2**63-1] == x[:1]
        ([0], [6], [2**62]),
        ([5], [-100], [-(2**62)]),  # x[5:-100:-2**62] == x[5:6]
        ([I64_MAX], [I64_MIN], [I64_MIN]),  # x[5:6]
        ([I64_MAX], [I64_MIN], [-I64_MAX]),
        ([I64_MIN], [I64_MAX], [I64_MAX]),  # x[0:1]
        ([I64_MIN], [I64_MAX], [I64_MIN]),  # empty
        ([I64_MAX], [I64_MIN], [I64_MAX]),  # empty
    ],
    ids=str,
)
def test_slice_extreme_steps(ctx, start, end, step):
    """Steps near the int64 limits take one element (or none), like Python."""
    for dt in (I8, F64):
        x = np.arange(6).astype(dt)
        for v in (x, x[::-1]):
            check(ctx, "slice", v, {"start": start, "end": end, "step": step})


@pytest.mark.parametrize(
    "op,kw",
    [
        ("reshape", {}),
        ("slice", {"start": [0]}),
        ("slice", {"end": [1]}),
        ("slice", {}),
        ("expand_dims", {}),
        ("pad", {}),
        ("pad", {"value": 1.0}),
    ],
    ids=pid,
)
def test_required_argument_missing(ctx, op, kw):
    expect_error(ctx, op, X3, kw, ndx.NDX_ERROR_VALUE)


@pytest.mark.parametrize(
    "op,args",
    [
        ("reshape", lambda: ndx.Args().set_float_array("shape", [24.0])),
        ("reshape", lambda: ndx.Args().set_float("shape", 24.0)),
        ("transpose", lambda: ndx.Args().set_float_array("perm", [2.0, 1.0, 0.0])),
        ("slice", lambda: ndx.Args().set_float_array("start", [0.0]).set_int_array("end", [1])),
        ("flip", lambda: ndx.Args().set_bool("axes", True)),
        ("squeeze", lambda: ndx.Args().set_float_array("axes", [0.0])),
        ("expand_dims", lambda: ndx.Args().set_float("axis", 0.0)),
        ("expand_dims", lambda: ndx.Args().set_int_array("axis", [0, 1])),
        ("pad", lambda: ndx.Args().set_float_array("widths", [0.0] * 6)),
        ("pad", lambda: ndx.Args().set_int_array("widths", [0] * 6).set_string("value", "1")),
        ("pad", lambda: ndx.Args().set_int_array("widths", [0] * 6).set_float_array("value", [1.0])),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_wrong_argument_type(ctx, op, args):
    err = invoke_error(ctx, op, X3, args())
    assert err.kind == ndx.NDX_ERROR_TYPE and err.kind_name == "TypeError", (op, err.kind_name, err.message)


@pytest.mark.parametrize("op", OPS)
def test_unknown_argument(ctx, op):
    err = invoke_error(ctx, op, X3, ndx.Args().set_int("bogus", 0))
    assert err.kind == ndx.NDX_ERROR_VALUE, (op, err.kind_name, err.message)
    assert "bogus" in err.message, err.message


VALID = {
    "reshape": {"shape": [-1]},
    "transpose": {},
    "slice": {"start": [0], "end": [1]},
    "flip": {},
    "squeeze": {},
    "expand_dims": {"axis": 0},
    "pad": {"widths": [0, 1, 0, 1, 0, 1]},
}


@pytest.mark.parametrize("op", OPS)
def test_input_count_is_checked(ctx, op):
    """Valid arguments, but no input or two inputs."""
    check(ctx, op, X3, VALID[op])  # the arguments are fine with one input
    x = ndx.tensor_from_numpy(X3)
    y = ndx.tensor_from_numpy(X3)
    try:
        for inputs in ([], [x, y]):
            with pytest.raises(ndx.NdxError):
                ctx.invoke(op, inputs, mode=ndx.NDX_EVAL_SYNC_CPU, args=VALID[op]).release()
    finally:
        x.release()
        y.release()


def test_every_shape_op_is_covered():
    assert set(OPS) == set("reshape transpose slice flip squeeze expand_dims pad".split())
