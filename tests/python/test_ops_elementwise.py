"""Elementwise operators through the C ABI (`ndx_invoke`, SYNC_CPU), compared with
NumPy 2 on random inputs of every dtype: NEP 50 promotion, broadcasting, strided
(DLPack views) inputs, compact outputs, and the errors the operators raise.

Run: NDX_LIBRARY=/path/to/libndx.so python3 -m pytest -q tests/python/test_ops_elementwise.py

bfloat16 is tested only when `ml_dtypes` is importable (NumPy has no bfloat16); its
inputs are made with `ndx_tensor_from_host` (NumPy cannot export it through DLPack)
and its references are computed in float32/float64.
"""

import math
import os
import sys
import zlib

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ndx_ctypes as ndx  # noqa: E402

try:
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
    HAVE_BF16 = True
except ImportError:  # pragma: no cover - depends on the environment
    # A stand-in that equals no dtype tested (not None: np.dtype(None) is float64,
    # so `dtype == None` is True for float64).
    BF16 = np.dtype([("bfloat16_unavailable", np.uint16)])
    HAVE_BF16 = False

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)

# ------------------------------------------------------------------- tolerances
# The one table: (rtol, atol) by class of operator and result dtype. Integer and bool
# results are compared exactly (assert_array_equal); floats with assert_allclose
# (equal_nan=True) after both sides are widened to float64.
#   "arith": add sub mul div floordiv mod minimum maximum neg abs sign relu floor
#            ceil round clamp where (correctly rounded or exact operations).
#   "math":  sqrt exp log sin cos tanh sigmoid rsqrt pow. The reference is computed
#            in float64 and rounded to the result dtype; ndx may compute in the
#            narrower type, so allow a few ULP (f32: ~32 ULP, f16: ~2 ULP) and an
#            absolute floor for results near zero (sin/cos near their roots,
#            sigmoid/exp underflowing to float16 subnormals).
TOL = {
    "arith": {
        F64: (1e-12, 0.0),
        F32: (1e-6, 0.0),
        F16: (1e-3, 0.0),
    },
    "math": {
        F64: (1e-12, 1e-14),
        F32: (4e-6, 1e-7),
        F16: (2e-3, 1e-5),
    },
}
if HAVE_BF16:
    TOL["arith"][BF16] = (1e-2, 0.0)  # bfloat16 eps = 2**-7
    TOL["math"][BF16] = (2e-2, 1e-3)

# ------------------------------------------------------------------- dtypes

INTS = [np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64)]
UINTS = [np.dtype(t) for t in (np.uint8, np.uint16, np.uint32, np.uint64)]
FLOATS = [F16, F32, F64] + ([BF16] if HAVE_BF16 else [])
BOOL = np.dtype(np.bool_)
INTEGERS = INTS + UINTS
NUMERIC = INTEGERS + FLOATS  # every dtype the arithmetic and math ops accept
ALL = [BOOL] + NUMERIC

NDX_DTYPE = {np.dtype(name): code for code, name in ndx._NP_DTYPES.items()}
if HAVE_BF16:
    NDX_DTYPE[BF16] = ndx.NDX_DTYPE_BFLOAT16

# Integer -> float type of the math ops (sqrt, exp, ...): what NumPy picks.
MATH_DTYPE = {
    np.dtype(np.int8): F16,
    np.dtype(np.uint8): F16,
    np.dtype(np.int16): F32,
    np.dtype(np.uint16): F32,
    np.dtype(np.int32): F64,
    np.dtype(np.uint32): F64,
    np.dtype(np.int64): F64,
    np.dtype(np.uint64): F64,
    F16: F16,
    F32: F32,
    F64: F64,
}
if HAVE_BF16:
    MATH_DTYPE[BF16] = BF16


def test_math_dtype_table_is_numpys():
    for dt, want in MATH_DTYPE.items():
        if dt != BF16:
            assert np.sqrt(np.ones(1, dt)).dtype == want, dt


def is_int(dt):
    return dt.kind in "iu"


def is_float(dt):
    return dt.kind == "f" or dt == BF16


def name(dt):
    return "bfloat16" if dt == BF16 else dt.name


def result_dtype(*dts):
    """np.result_type (NEP 50, arrays only); with bfloat16 the ndx rule: bf16 with
    bool/int8/uint8/bf16 -> bf16, with float16 -> float32, otherwise like float16."""
    if not HAVE_BF16 or BF16 not in dts:
        return np.result_type(*dts)
    acc = dts[0]
    for dt in dts[1:]:
        acc = _promote_bf16(acc, dt)
    return acc


def _promote_bf16(a, b):
    if a != BF16 and b != BF16:
        return np.result_type(a, b)
    other = b if a == BF16 else a
    if other == BF16 or other in (BOOL, np.dtype(np.int8), np.dtype(np.uint8)):
        return BF16
    if other == F16:
        return F32
    return np.result_type(F16, other)  # int16 -> f32, int32 -> f64, f32 -> f32, ...


def np_view(x):
    """A NumPy array NumPy can compute with: bfloat16 widened to float32 (exact)."""
    return x.astype(F32) if x.dtype == BF16 else x


def compute_dtype(res):
    return F32 if res == BF16 else res


# ------------------------------------------------------------------- inputs


def rng_for(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def ints(rng, dt, shape, lo=None, hi=None):
    info = np.iinfo(dt)
    lo = info.min if lo is None else max(lo, info.min)
    hi = info.max if hi is None else min(hi, info.max)
    return rng.integers(lo, hi, size=shape, dtype=dt, endpoint=True)


def floats(rng, dt, x):
    """`x` (float64) as dtype `dt`."""
    return np.asarray(x, dtype=np.float64).astype(dt)


def _put(arr, values):
    """Writes `values` at the first positions of `arr` (flat), as many as fit."""
    flat = arr.reshape(-1)
    n = min(len(values), flat.size)
    if is_int(arr.dtype):
        flat[:n] = np.array(values[:n], dtype=arr.dtype)
    else:
        flat[:n] = np.asarray(values[:n], dtype=np.float64).astype(arr.dtype)
    return arr


def _scatter(rng, arr, values):
    """Writes `values` at random distinct positions of `arr`."""
    flat = arr.reshape(-1)
    n = min(len(values), flat.size)
    idx = rng.choice(flat.size, size=n, replace=False)
    if is_int(arr.dtype):
        flat[idx] = np.array(values[:n], dtype=arr.dtype)
    else:
        flat[idx] = np.asarray(values[:n], dtype=np.float64).astype(arr.dtype)
    return arr


SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, np.nan]


def operand(rng, dt, shape, kind):
    """Random values of dtype `dt` and `shape` suited to an operand `kind`:

    wide      ints: the full range with min, max, 0, -1 included (wrapping);
              floats: normal * 8
    nanwide   like wide, floats also hold NaN, +-inf and +-0
    dividend  ints: the full range but min (no min // -1 overflow); floats normal * 8
    divisor   ints: non-zero, half small (|v| <= 9, incl. +-1), half full-range;
              floats: +-[0.25, 4]
    base      ints [-3, 3] (unsigned [0, 3]); floats [0.5, 2]
    exponent  ints [0, 4]; floats [-3, 3]
    cmp       few distinct values so that ties occur: ints [-3, 3] / [0, 6]; floats
              from {+-1.5, +-1, +-0, nan, +-inf}
    truth     ints [-2, 2] / [0, 2]; floats from {0, -0, 1.5, -2, nan, inf}
    bool      only for bool
    """
    shape = tuple(shape)
    size = int(np.prod(shape, dtype=np.int64))
    if dt == BOOL:
        return rng.integers(0, 2, size=shape).astype(bool)
    signed = dt.kind == "i"
    if is_int(dt):
        info = np.iinfo(dt)
        if kind in ("wide", "nanwide"):
            x = ints(rng, dt, shape)
            edges = [info.min, info.max, 0] + ([-1] if signed else [1])
            return _scatter(rng, x, edges) if size >= 8 else x
        if kind == "dividend":
            return ints(rng, dt, shape, lo=info.min + 1)
        if kind == "divisor":
            small = ints(rng, dt, shape, -9, 9)
            big = ints(rng, dt, shape)
            x = np.where(rng.random(shape) < 0.5, small, big).astype(dt)
            x[x == 0] = 1
            if size >= 8:
                _scatter(rng, x, [1, -1, 2, -2] if signed else [1, 2, 3, info.max])
            return x
        if kind == "base":
            return ints(rng, dt, shape, -3 if signed else 0, 3)
        if kind == "exponent":
            return ints(rng, dt, shape, 0, 4)
        if kind == "cmp":
            return ints(rng, dt, shape, -3 if signed else 0, 3 if signed else 6)
        if kind == "truth":
            return ints(rng, dt, shape, -2 if signed else 0, 2)
        raise AssertionError(kind)
    # floats (bfloat16 included: values are rounded from float64)
    if kind in ("wide", "dividend"):
        return floats(rng, dt, rng.standard_normal(shape) * 8)
    if kind == "nanwide":
        x = floats(rng, dt, rng.standard_normal(shape) * 8)
        return _scatter(rng, x, SPECIALS) if size >= 12 else x
    if kind == "divisor":
        mag = rng.uniform(0.25, 4, shape)
        return floats(rng, dt, np.where(rng.random(shape) < 0.5, -mag, mag))
    if kind == "base":
        return floats(rng, dt, rng.uniform(0.5, 2, shape))
    if kind == "exponent":
        return floats(rng, dt, rng.uniform(-3, 3, shape))
    if kind == "cmp":
        return floats(rng, dt, rng.choice([-1.5, -1, -0.0, 0.0, 1, 1.5, np.nan, np.inf, -np.inf], shape))
    if kind == "truth":
        return floats(rng, dt, rng.choice([0.0, -0.0, 1.5, -2.0, np.nan, np.inf], shape))
    raise AssertionError(kind)


def math_operand(rng, op, dt, shape):
    """Inputs in the domain of a math op (positive for sqrt/log/rsqrt; exp without
    overflow in float16)."""
    lo, hi = {
        "sqrt": (1, 10000),
        "log": (1, 10000),
        "rsqrt": (1, 10000),
        "exp": (-10, 10),
        "sin": (-20, 20),
        "cos": (-20, 20),
        "tanh": (-20, 20),
        "sigmoid": (-20, 20),
    }[op]
    if is_int(dt):
        return ints(rng, dt, shape, lo, hi)
    flo, fhi = {
        "sqrt": (0.01, 100),
        "log": (0.01, 100),
        "rsqrt": (0.01, 100),
        "exp": (-10, 10),
        "sin": (-6, 6),
        "cos": (-6, 6),
        "tanh": (-8, 8),
        "sigmoid": (-8, 8),
    }[op]
    return floats(rng, dt, rng.uniform(flo, fhi, shape))


def rounding_operand(rng, dt, shape):
    """floor/ceil/round inputs: halves (ties for round), random values, specials."""
    if is_int(dt):
        return operand(rng, dt, shape, "wide")
    halves = rng.integers(-40, 40, size=shape) / 2
    x = np.where(rng.random(shape) < 0.5, halves, rng.standard_normal(shape) * 10)
    x = floats(rng, dt, x)
    return _put(x, [0.5, -0.5, 1.5, -1.5, 2.5, -2.5, np.nan, np.inf, -np.inf, -0.0])


# Strided views of a given logical shape (2-d), made from a larger base array.


def strided(make, shape, how):
    """A view of logical `shape` whose memory is not compact, filled by
    `make(base_shape)`: "T" a transposed array, "step" every 2nd row, "inner" every
    3rd column from the 2nd, "neg" rows reversed, "bcast" a broadcast (zero-stride)
    row."""
    r, c = shape
    if how == "T":
        return make((c, r)).T
    if how == "step":
        return make((2 * r, c))[::2]
    if how == "inner":
        return make((r, 3 * c))[:, 1::3]
    if how == "neg":
        return make((r, c))[::-1]
    if how == "bcast":
        return np.broadcast_to(make((1, c)), (r, c))
    raise AssertionError(how)


STRIDES = ["T", "step", "inner", "neg", "bcast"]

# ------------------------------------------------------------------- calling ndx


@pytest.fixture(scope="module")
def ctx():
    c = ndx.Context(mode=ndx.NDX_EVAL_SYNC_CPU)
    yield c
    c.release()


def to_tensor(x):
    if isinstance(x, ndx.Tensor):
        return x
    if x.dtype == BF16:
        return ndx.tensor_from_host(x.view(np.uint16), ndx.NDX_DTYPE_BFLOAT16)
    return ndx.tensor_from_numpy(x)


def compact_strides(shape):
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(out))


def run(ctx, op, *inputs, args=None):
    """Invokes `op` (SYNC_CPU) and returns its single output as a NumPy array, after
    checking that it is compact."""
    tensors = [to_tensor(x) for x in inputs]
    fut = ctx.invoke(op, tensors, mode=ndx.NDX_EVAL_SYNC_CPU, args=args)
    try:
        assert fut.poll() != ndx.NDX_FUTURE_PENDING, "SYNC_CPU: done before invoke returned"
        fut.wait()
        assert fut.output_count() == 1
        with fut.tensor(0) as t:
            shape = t.shape
            if int(np.prod(shape, dtype=np.int64)) > 0:
                strides = t.strides
                want = compact_strides(shape)
                assert all(
                    s == w for s, w, n in zip(strides, want, shape) if n > 1
                ), f"{op}: output strides {strides} of shape {shape} are not compact"
            return t.numpy()
    finally:
        fut.release()
        for t in tensors:
            t.release()


def invoke_error(ctx, op, *inputs, args=None):
    """The NdxError that `ndx_invoke` itself returns."""
    tensors = [to_tensor(x) for x in inputs]
    with pytest.raises(ndx.NdxError) as info:
        fut = ctx.invoke(op, tensors, mode=ndx.NDX_EVAL_SYNC_CPU, args=args)
        fut.release()
    return info.value


def execution_error(ctx, op, *inputs, args=None):
    """The NdxError of an invocation that is accepted but fails when it runs."""
    tensors = [to_tensor(x) for x in inputs]
    fut = ctx.invoke(op, tensors, mode=ndx.NDX_EVAL_SYNC_CPU, args=args)  # must not raise
    try:
        assert fut.poll() == ndx.NDX_FUTURE_FAILED, "SYNC_CPU: failed before invoke returned"
        with pytest.raises(ndx.NdxError) as info:
            fut.wait()
        return info.value
    finally:
        fut.release()


def clamp_args(lo=None, hi=None):
    args = ndx.Args()
    if lo is not None:
        args.set_float("lo", lo)
    if hi is not None:
        args.set_float("hi", hi)
    return args


def check(got, want, cls, what=""):
    """Dtype, shape and values; exact for ints and bool, TOL[cls] for floats."""
    want = np.asarray(want)
    assert name(got.dtype) == name(want.dtype), f"{what}: dtype {name(got.dtype)}, numpy {name(want.dtype)}"
    assert got.shape == want.shape, f"{what}: shape {got.shape}, numpy {want.shape}"
    if is_float(want.dtype):
        rtol, atol = TOL[cls][want.dtype]
        np.testing.assert_allclose(
            got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol, equal_nan=True, err_msg=what
        )
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


def describe(op, *xs):
    return f"{op}(" + ", ".join(f"{name(x.dtype)}{list(x.shape)}" for x in xs) + ")"


# ------------------------------------------------------------------- references

ARITH = ["add", "sub", "mul", "div", "floordiv", "mod", "pow", "minimum", "maximum"]
COMPARISONS = {
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
}
LOGICAL = {"logical_and": np.logical_and, "logical_or": np.logical_or, "logical_xor": np.logical_xor}
BINARY = ARITH + list(COMPARISONS) + list(LOGICAL)

OPERAND_KINDS = {
    "add": ("wide", "wide"),
    "sub": ("wide", "wide"),
    "mul": ("wide", "wide"),
    "div": ("dividend", "divisor"),
    "floordiv": ("dividend", "divisor"),
    "mod": ("dividend", "divisor"),
    "pow": ("base", "exponent"),
    "minimum": ("nanwide", "nanwide"),
    "maximum": ("nanwide", "nanwide"),
    **{op: ("cmp", "cmp") for op in COMPARISONS},
    **{op: ("truth", "truth") for op in LOGICAL},
}

_ARITH_NP = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "floordiv": np.floor_divide,
    "mod": np.remainder,
    "minimum": np.minimum,
    "maximum": np.maximum,
}


def binary_class(op):
    return "math" if op == "pow" else "arith"


def ref_binary(op, a, b):
    """NumPy's result (dtype included) of binary `op`: inputs cast to the promoted
    dtype as a ufunc loop would (bfloat16 computed in float32, then rounded)."""
    res = result_dtype(a.dtype, b.dtype)
    if op in LOGICAL:
        return LOGICAL[op](np_view(a), np_view(b))
    comp = compute_dtype(res)
    x, y = np_view(a).astype(comp), np_view(b).astype(comp)
    with np.errstate(all="ignore"):
        if op in COMPARISONS:
            if is_int(a.dtype) and is_int(b.dtype):
                # NumPy compares integers exactly, uint64 with signed ones too
                # (its qQ loops), not in their promoted float64.
                return COMPARISONS[op](a, b)
            return COMPARISONS[op](x, y)
        if op == "div":
            # ndx deviation (decided, docs/operators.md): the promoted dtype decides.
            # div of two integer inputs is integer floor division (np.floor_divide),
            # not np.divide's true division; integer pairs whose promoted type is a
            # float (int64 with uint64 -> float64) get true division, like every
            # float result (floordiv is np.floor_divide for every pair).
            out = np.floor_divide(x, y) if is_int(res) else np.true_divide(x, y)
        elif op == "pow":
            if is_int(res):
                out = np.power(x, y)
            else:
                out = np.power(x.astype(F64), y.astype(F64))
        else:
            out = _ARITH_NP[op](x, y)
    return out.astype(res)


def _relu(x):
    return np.maximum(x, np.zeros((), x.dtype))


KEEP_UNARY = {  # same dtype out
    "neg": np.negative,
    "abs": np.abs,
    "sign": np.sign,
    "relu": _relu,
    "floor": np.floor,
    "ceil": np.ceil,
    "round": np.round,
}
MATH_UNARY = {  # float out (MATH_DTYPE); reference in float64
    "sqrt": np.sqrt,
    "exp": np.exp,
    "log": np.log,
    "sin": np.sin,
    "cos": np.cos,
    "tanh": np.tanh,
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
}
BOOL_UNARY = {"isnan": np.isnan, "isfinite": np.isfinite, "logical_not": np.logical_not}
UNARY = list(KEEP_UNARY) + list(MATH_UNARY) + list(BOOL_UNARY)


def unary_input(rng, op, dt, shape):
    if op in MATH_UNARY:
        return math_operand(rng, op, dt, shape)
    if op in ("floor", "ceil", "round"):
        return rounding_operand(rng, dt, shape)
    if op == "relu":
        x = operand(rng, dt, shape, "wide")
        return _put(x, [np.inf, -np.inf, 0.0, -0.0]) if is_float(dt) else x
    if op == "logical_not":
        return operand(rng, dt, shape, "truth")
    return operand(rng, dt, shape, "nanwide")


def ref_unary(op, x):
    with np.errstate(all="ignore"):
        if op in MATH_UNARY:
            return MATH_UNARY[op](np_view(x).astype(F64)).astype(MATH_DTYPE[x.dtype])
        if op in BOOL_UNARY:
            return BOOL_UNARY[op](np_view(x))
        if is_int(x.dtype) and op in ("floor", "ceil", "round"):
            return x.copy()  # identity for integers
        return KEEP_UNARY[op](np_view(x)).astype(x.dtype)


def unary_class(op):
    return "math" if op in MATH_UNARY else "arith"


def unary_dtypes(op):
    return ALL if op in BOOL_UNARY else NUMERIC


def binary_dtypes(op):
    return NUMERIC if op in ARITH else ALL


def ids(dts):
    return [name(d) for d in dts]


# Broadcast layouts of the per-dtype tests: (shape of a, shape of b).
LAYOUTS = {"bcast": ((3, 1, 4), (5, 1)), "flat": ((256,), (256,))}

# ------------------------------------------------------------------- binary ops


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize(
    "op,dt",
    [(op, dt) for op in BINARY for dt in binary_dtypes(op)],
    ids=[f"{op}-{name(dt)}" for op in BINARY for dt in binary_dtypes(op)],
)
def test_binary_same_dtype(ctx, op, dt, layout):
    rng = rng_for(op, name(dt), layout)
    sa, sb = LAYOUTS[layout]
    ka, kb = OPERAND_KINDS[op]
    a, b = operand(rng, dt, sa, ka), operand(rng, dt, sb, kb)
    got = run(ctx, op, a, b)
    check(got, ref_binary(op, a, b), binary_class(op), describe(op, a, b))


# Mixed dtypes: the promoted output dtype (np.result_type, NEP 50) and its values.
PROMOTION_PAIRS = [
    ("int8", "uint8"),  # int16
    ("int16", "uint16"),  # int32
    ("int32", "uint32"),  # int64
    ("int64", "uint64"),  # float64
    ("uint16", "int8"),  # int32
    ("uint8", "int64"),  # int64
    ("int8", "float16"),  # float16
    ("uint8", "float16"),  # float16
    ("int16", "float16"),  # float32
    ("int32", "float32"),  # float64
    ("uint64", "float32"),  # float64
    ("float16", "float32"),  # float32
    ("float32", "float64"),  # float64
    ("int8", "int64"),  # int64
]
_PAIRS_BOTH_WAYS = [(np.dtype(x), np.dtype(y)) for x, y in PROMOTION_PAIRS] + [
    (np.dtype(y), np.dtype(x)) for x, y in PROMOTION_PAIRS
]


@pytest.mark.parametrize(
    "op,da,db",
    [(op, da, db) for op in BINARY for da, db in _PAIRS_BOTH_WAYS],
    ids=[f"{op}-{name(da)}-{name(db)}" for op in BINARY for da, db in _PAIRS_BOTH_WAYS],
)
def test_binary_promotion(ctx, op, da, db):
    rng = rng_for("promotion", op, name(da), name(db))
    ka, kb = OPERAND_KINDS[op]
    a, b = operand(rng, da, (3, 1, 4), ka), operand(rng, db, (5, 1), kb)
    want = ref_binary(op, a, b)
    if op not in COMPARISONS and op not in LOGICAL:
        assert want.dtype == result_dtype(da, db)
    got = run(ctx, op, a, b)
    check(got, want, binary_class(op), describe(op, a, b))


_MATRIX = [(da, db) for da in ALL for db in ALL]


@pytest.mark.parametrize("op", ["add", "lt"])
@pytest.mark.parametrize("da,db", _MATRIX, ids=[f"{name(a)}-{name(b)}" for a, b in _MATRIX])
def test_promotion_matrix(ctx, op, da, db):
    """Every dtype pair: add (numeric) and lt (every dtype, bool included)."""
    if op == "add" and BOOL in (da, db):
        pytest.skip("bool is rejected by arithmetic (test_bool_rejected)")
    rng = rng_for("matrix", op, name(da), name(db))
    a, b = operand(rng, da, (4, 3), "cmp"), operand(rng, db, (3,), "cmp")
    if op == "add":
        a, b = operand(rng, da, (4, 3), "wide"), operand(rng, db, (3,), "wide")
    want = ref_binary(op, a, b)
    got = run(ctx, op, a, b)
    if op == "add":
        assert name(got.dtype) == name(result_dtype(da, db))
    check(got, want, "arith", describe(op, a, b))


BROADCAST_SHAPES = [
    ((3, 1, 4), (5, 1)),
    ((5, 1), (3, 1, 4)),
    ((2, 3, 4), (4,)),
    ((4,), (2, 3, 4)),
    ((4, 1), (1, 4)),
    ((2, 1, 3, 1), (1, 4, 1, 5)),
    ((), (3,)),
    ((3, 2), ()),
    ((), ()),
    ((1,), (1,)),
    ((0, 3), (1, 3)),
    ((0,), ()),
]


@pytest.mark.parametrize("shapes", BROADCAST_SHAPES, ids=[f"{a}-{b}" for a, b in BROADCAST_SHAPES])
@pytest.mark.parametrize("op", BINARY)
def test_binary_broadcast_shapes(ctx, op, shapes):
    dt = F64 if op in ARITH else np.dtype(np.int32)
    rng = rng_for("shapes", op, shapes)
    ka, kb = OPERAND_KINDS[op]
    a, b = operand(rng, dt, shapes[0], ka), operand(rng, dt, shapes[1], kb)
    got = run(ctx, op, a, b)
    want = ref_binary(op, a, b)
    assert got.shape == np.broadcast_shapes(*shapes)
    check(got, want, binary_class(op), describe(op, a, b))


def test_strided_import_keeps_strides():
    """The strided tests below do pass non-compact tensors (no copy at import)."""
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    for view in (base.T, base[::2], base[:, 1::3]):
        with ndx.tensor_from_numpy(view) as t:
            assert t.strides == tuple(s // view.itemsize for s in view.strides)
            np.testing.assert_array_equal(t.numpy(), view)


@pytest.mark.parametrize("dt", [np.dtype(np.int16), F64], ids=name)
@pytest.mark.parametrize("how_b", STRIDES)
@pytest.mark.parametrize("how_a", ["T", "step", "inner", "neg"])
@pytest.mark.parametrize("op", BINARY)
def test_binary_strided(ctx, op, how_a, how_b, dt):
    rng = rng_for("strided", op, how_a, how_b, name(dt))
    ka, kb = OPERAND_KINDS[op]
    a = strided(lambda s: operand(rng, dt, s, ka), (6, 5), how_a)
    b = strided(lambda s: operand(rng, dt, s, kb), (6, 5), how_b)
    assert not a.flags.c_contiguous and not b.flags.c_contiguous
    got = run(ctx, op, a, b)
    check(got, ref_binary(op, a, b), binary_class(op), f"{describe(op, a, b)} {how_a}/{how_b}")


@pytest.mark.parametrize("op", BINARY)
def test_binary_strided_and_broadcast(ctx, op):
    """A transposed (6, 5) view with a [::2] slice of shape (5,)."""
    rng = rng_for("strided-bcast", op)
    ka, kb = OPERAND_KINDS[op]
    a = operand(rng, F32, (5, 6), ka).T
    b = operand(rng, np.dtype(np.int32), (10,), kb)[::2]
    got = run(ctx, op, a, b)
    check(got, ref_binary(op, a, b), binary_class(op), describe(op, a, b))


# ------------------------------------------------------------------- arithmetic edges


@pytest.mark.parametrize("dt", INTEGERS, ids=name)
@pytest.mark.parametrize("op", ["add", "sub", "mul"])
def test_integer_wraparound(ctx, op, dt):
    info = np.iinfo(dt)
    edge = np.array([info.min, info.max, info.max - 1, info.min + 1, 0, 1], dtype=dt)
    a, b = edge[:, None], edge[None, :]
    with np.errstate(all="ignore"):
        want = _ARITH_NP[op](a, b)
    check(run(ctx, op, a, b), want, "arith", describe(op, a, b))


@pytest.mark.parametrize("dt", INTS, ids=name)
@pytest.mark.parametrize("op", ["div", "floordiv", "mod"])
def test_integer_floor_semantics(ctx, op, dt):
    """Python sign rules: the quotient rounds toward -inf, the remainder takes the
    divisor's sign. (div of integers is floor division in ndx: see ref_binary.)"""
    a = np.array([7, -7, 7, -7, 0, 1, -1, 6, -6, 5], dtype=dt)[:, None]
    b = np.array([2, 2, -2, -2, 3, -3, 1, -1, 4, -4, 7], dtype=dt)[None, :]
    want = np.floor_divide(a, b) if op in ("div", "floordiv") else np.remainder(a, b)
    check(run(ctx, op, a, b), want, "arith", describe(op, a, b))


@pytest.mark.parametrize("signed", [np.int8, np.int32, np.int64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", list(COMPARISONS))
def test_uint64_compares_exactly_with_signed_integers(ctx, op, signed):
    """uint64 with a signed integer promotes to float64, which holds neither exactly:
    2^53 + 1 rounds to 2^53 and 2^63 - 1 to 2^63. ndx compares the values, as NumPy."""
    big = [2**53 + 1, 2**53, 2**63 - 1, 2**63, 2**64 - 1, 0, 1]
    u = np.array(big, np.uint64)[None, :]
    info = np.iinfo(signed)
    s = np.array([v for v in [2**53, 2**53 + 1, 2**63 - 1, -1, info.min, 0, 1] if info.min <= v <= info.max],
                 signed)[:, None]
    for a, b in ((s, u), (u, s), (s[::-1], u[:, ::-2])):
        got = run(ctx, op, a, b)
        assert got.dtype == np.bool_
        np.testing.assert_array_equal(got, COMPARISONS[op](a, b), err_msg=describe(op, a, b))


@pytest.mark.parametrize("dt", [F16, F32, F64], ids=name)
@pytest.mark.parametrize("op", ["floordiv", "mod"])
def test_float_floor_semantics(ctx, op, dt):
    """np.floor_divide / np.remainder on floats: sign rules with negative operands
    and the cases where floor(a / b) is not the answer (1 // 0.1 == 9)."""
    pairs = [
        (7.5, 2.0),
        (-7.5, 2.0),
        (7.5, -2.0),
        (-7.5, -2.0),
        (1.0, 0.1),
        (0.7, 0.1),
        (-1.0, 0.1),
        (5.0, 0.5),
        (-1e-20, 1.0),
        (1e-20, -1.0),
        (3.0, 3.0),
        (-3.0, 3.0),
        (0.0, -2.0),
        (-0.0, 2.0),
    ]
    a = np.array([p[0] for p in pairs], dtype=dt)
    b = np.array([p[1] for p in pairs], dtype=dt)
    fn = np.floor_divide if op == "floordiv" else np.remainder
    with np.errstate(all="ignore"):
        want = fn(a, b)
    check(run(ctx, op, a, b), want, "arith", describe(op, a, b))


FLOAT_SPECIAL_A = [-3.5, -1.0, -0.0, 0.0, 1.0, 2.5, np.inf, -np.inf, np.nan]
FLOAT_SPECIAL_B = [-2.0, -0.5, 0.5, 2.0, 0.0, -0.0, np.inf, -np.inf, np.nan]


@pytest.mark.parametrize("dt", [F16, F32, F64], ids=name)
@pytest.mark.parametrize("op", ARITH)
def test_float_special_values(ctx, op, dt):
    """Every pair of {finite, +-0, +-inf, nan}: IEEE results like NumPy's."""
    a = np.array(FLOAT_SPECIAL_A, dtype=dt)[:, None]
    b = np.array(FLOAT_SPECIAL_B, dtype=dt)[None, :]
    check(run(ctx, op, a, b), ref_binary(op, a, b), binary_class(op), describe(op, a, b))


@pytest.mark.parametrize("dt", FLOATS, ids=name)
@pytest.mark.parametrize("op", ["div", "floordiv", "mod"])
def test_float_division_by_zero(ctx, op, dt):
    """Floats by +-0: inf / nan like NumPy (no error)."""
    a = operand(rng_for("fdiv0", op, name(dt)), dt, (8,), "wide")
    a = _put(a, [0.0, -0.0, np.nan, np.inf])
    b = np.array([0.0, -0.0, 0.0, -0.0, 0.0, -0.0, 0.0, -0.0]).astype(dt)
    check(run(ctx, op, a, b), ref_binary(op, a, b), "arith", describe(op, a, b))


@pytest.mark.parametrize("dt", INTEGERS, ids=name)
@pytest.mark.parametrize("op", ["div", "floordiv", "mod"])
def test_integer_division_by_zero_fails_at_execution(ctx, op, dt):
    a = np.array([7, 8, 9, 10], dtype=dt)
    b = np.array([1, 2, 0, 5], dtype=dt)
    err = execution_error(ctx, op, a, b)
    assert err.kind == ndx.NDX_ERROR_VALUE and err.kind_name == "ValueError", err
    assert err.op == op
    if op == "div":
        assert "division by zero" in err.message, err.message
    else:
        assert "by zero" in err.message, err.message


def test_integer_division_by_zero_after_promotion(ctx):
    a = np.array([1, 2, 3], dtype=np.int8)
    b = np.array([1, 0, 1], dtype=np.uint8)  # int16
    for op in ("div", "floordiv", "mod"):
        err = execution_error(ctx, op, a, b)
        assert err.kind_name == "ValueError" and "by zero" in err.message, (op, err.message)


@pytest.mark.parametrize("da,db", [(d, d) for d in INTS] + [(np.dtype(np.uint8), np.dtype(np.int8))],
                         ids=lambda d: name(d))
def test_integer_negative_power_fails_at_execution(ctx, da, db):
    a = np.array([1, 2, 3, 2], dtype=da)
    b = np.array([1, 2, -1, 0], dtype=db)
    err = execution_error(ctx, "pow", a, b)
    assert err.kind == ndx.NDX_ERROR_VALUE, err
    assert "negative integer powers" in err.message, err.message


def test_integer_power_values(ctx):
    """Small bases and exponents, including 0 ** 0 == 1 and negative bases."""
    for dt in INTEGERS:
        lo = -3 if dt.kind == "i" else 0
        a = np.arange(lo, 4, dtype=dt)[:, None]
        b = np.arange(0, 5, dtype=dt)[None, :]
        check(run(ctx, "pow", a, b), np.power(a, b), "arith", describe("pow", a, b))


# ------------------------------------------------------------------- unary ops


@pytest.mark.parametrize(
    "op,dt",
    [(op, dt) for op in UNARY for dt in unary_dtypes(op)],
    ids=[f"{op}-{name(dt)}" for op in UNARY for dt in unary_dtypes(op)],
)
@pytest.mark.parametrize("layout", ["compact", "strided"])
def test_unary(ctx, op, dt, layout):
    rng = rng_for("unary", op, name(dt), layout)
    if layout == "compact":
        x = unary_input(rng, op, dt, (3, 5, 4))
    else:
        x = unary_input(rng, op, dt, (7, 12)).T[::2]  # (6, 7), transposed and sliced
        assert not x.flags.c_contiguous
    want = ref_unary(op, x)
    if op in MATH_UNARY:
        assert want.dtype == MATH_DTYPE[dt]
    elif op in BOOL_UNARY:
        assert want.dtype == BOOL
    else:
        assert want.dtype == dt
    check(run(ctx, op, x), want, unary_class(op), describe(op, x))


@pytest.mark.parametrize("dt", INTEGERS, ids=name)
def test_neg_abs_sign_integer_edges(ctx, dt):
    info = np.iinfo(dt)
    x = np.array([info.min, info.min + 1, -1, 0, 1, info.max], dtype=dt) if dt.kind == "i" else np.array(
        [0, 1, 2, info.max - 1, info.max], dtype=dt
    )
    for op in ("neg", "abs", "sign", "relu"):
        with np.errstate(all="ignore"):
            want = KEEP_UNARY[op](x)
        check(run(ctx, op, x), want, "arith", describe(op, x))


@pytest.mark.parametrize("dt", [np.dtype(np.int8), np.dtype(np.int32), F32, F64], ids=name)
@pytest.mark.parametrize("op", UNARY + ["clamp", "where"])
def test_zero_size(ctx, op, dt):
    """Tensors with no elements: an empty output of the right dtype and shape."""
    x = np.zeros((0, 3), dtype=dt)
    if op == "where":
        inputs, want = (np.zeros((0, 1), bool), x, np.ones((3,), dt)), np.zeros((0, 3), dt)
    else:
        inputs, want = (x,), ref_unary(op, x) if op != "clamp" else x.copy()
    check(run(ctx, op, *inputs), want, unary_class(op), describe(op, *inputs))


@pytest.mark.parametrize("dt", FLOATS, ids=name)
def test_relu_nan_propagates(ctx, dt):
    """relu(x) = max(x, 0) like np.maximum: NaN stays NaN (as in torch.relu)."""
    x = np.array([np.nan, -1.0, 2.0], dtype=F64).astype(dt)
    check(run(ctx, "relu", x), _relu(np_view(x)).astype(dt), "arith", describe("relu", x))


@pytest.mark.parametrize("dt", FLOATS, ids=name)
def test_round_half_to_even(ctx, dt):
    x = np.array([0.5, 1.5, 2.5, 3.5, -0.5, -1.5, -2.5, 4.5, 0.49, -0.51], dtype=F64).astype(dt)
    want = np.round(np_view(x)).astype(dt)
    check(run(ctx, "round", x), want, "arith", describe("round", x))


@pytest.mark.parametrize("dt", FLOATS, ids=name)
def test_sign_of_specials(ctx, dt):
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-3, -1e-3], dtype=F64).astype(dt)
    want = np.sign(np_view(x)).astype(dt)
    check(run(ctx, "sign", x), want, "arith", describe("sign", x))


# ------------------------------------------------------------------- clamp


def _clip(x, lo, hi):
    if lo is None and hi is None:
        return x.copy()
    if is_int(x.dtype):  # integer-valued bounds, clipped in the input's integer type
        lo = None if lo is None else int(lo)
        hi = None if hi is None else int(hi)
        return np.clip(x, lo, hi).astype(x.dtype)
    return np.clip(np_view(x), lo, hi).astype(x.dtype)


def clamp_bounds(dt):
    if is_float(dt):
        return [(-0.5, 0.75), (-2.0, None), (None, 1.5), (0.25, 0.25), (None, None)]
    if dt.kind == "i":
        return [(-5.0, 7.0), (-100.0, None), (None, 3.0), (0.0, 0.0), (None, None)]
    return [(3.0, 100.0), (10.0, None), (None, 5.0), (7.0, 7.0), (None, None)]


@pytest.mark.parametrize("strided_input", [False, True], ids=["compact", "strided"])
@pytest.mark.parametrize("dt", NUMERIC, ids=name)
def test_clamp(ctx, dt, strided_input):
    rng = rng_for("clamp", name(dt), strided_input)
    for lo, hi in clamp_bounds(dt):
        if strided_input:
            x = operand(rng, dt, (9, 8), "nanwide").T[:, ::2]
        elif is_float(dt):
            x = operand(rng, dt, (4, 5), "nanwide")
        else:  # values around the bounds, and the extremes
            x = _put(ints(rng, dt, (4, 5), -10, 110), [np.iinfo(dt).min, np.iinfo(dt).max])
        got = run(ctx, "clamp", x, args=clamp_args(lo, hi))
        check(got, _clip(x, lo, hi), "arith", f"clamp({name(dt)}, lo={lo}, hi={hi})")


@pytest.mark.parametrize("dt", INTEGERS, ids=name)
def test_clamp_integer_fractional_bounds(ctx, dt):
    """docs/operators.md: for integers `lo` rounds up and `hi` rounds down."""
    x = np.arange(0, 12, dtype=dt) if dt.kind == "u" else np.arange(-6, 6, dtype=dt)
    lo, hi = (2.5, 7.7) if dt.kind == "u" else (-2.5, 3.7)
    want = np.clip(x, math.ceil(lo), math.floor(hi)).astype(dt)
    check(run(ctx, "clamp", x, args=clamp_args(lo, hi)), want, "arith", f"clamp({name(dt)}, {lo}, {hi})")


def test_clamp_lo_above_hi_fails_at_invoke(ctx):
    x = np.arange(4, dtype=np.float32)
    err = invoke_error(ctx, "clamp", x, args=clamp_args(2.0, 1.0))
    assert err.kind == ndx.NDX_ERROR_VALUE and err.kind_name == "ValueError", err



@pytest.mark.parametrize("dt", [np.int32, np.float32], ids=lambda d: np.dtype(d).name)
def test_clamp_nan_bound_fails_at_invoke(ctx, dt):
    """A NaN bound was taken as 0 by integers (clamp(-5, lo=NaN) == 0) and ignored
    by floats (np.clip would give NaN everywhere): refused instead."""
    x = np.array([-5, 3, 7], dtype=dt)
    for lo, hi, which in ((math.nan, None, "lo"), (None, math.nan, "hi"), (0.0, math.nan, "hi")):
        err = invoke_error(ctx, "clamp", x, args=clamp_args(lo, hi))
        assert err.kind == ndx.NDX_ERROR_VALUE, err
        assert f"argument '{which}' is NaN, not a bound" in str(err), err


@pytest.mark.parametrize("src", [np.int64, np.uint64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("dst", [F16, F32, F64], ids=name)
def test_cast_of_wide_integers_rounds_once_as_numpy(ctx, src, dst):
    """int64/uint64 to floats round once to nearest even, as NumPy's astype: values
    just past the halfway point between two float32s (2^60 + 2^36 + 1) went through
    float64 first, lost the 1, and the tie went down."""
    info = np.iinfo(src)
    vals = set()
    for k in range(24, 64):
        for off in (0, 1, 2 ** (k - 24), 2 ** (k - 24) + 1, 2 ** (k - 24) - 1, 3 * 2 ** (k - 24) + 1):
            for sign in (1, -1):
                v = sign * (2**k + off)
                if info.min <= v <= info.max:
                    vals.add(v)
    vals.update([info.min, info.max, 0, 1, 65504, 65519, 65520])
    x = np.array(sorted(vals), dtype=src)
    got = run(ctx, "cast", x, args=ndx.Args().set_dtype("dtype", NDX_DTYPE[np.dtype(dst)]))
    with np.errstate(all="ignore"):
        want = x.astype(dst)
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8), err_msg=f"{np.dtype(src).name} to {name(dst)}")

# ------------------------------------------------------------------- where

WHERE_SHAPES = [
    ((3, 1, 4), (5, 1), (4,)),
    ((4,), (3, 1, 4), (5, 1)),
    ((5, 1), (4,), (3, 1, 4)),
    ((2, 3), (2, 3), (2, 3)),
    ((), (3,), ()),
]


@pytest.mark.parametrize("dt", ALL, ids=name)
def test_where_same_dtype(ctx, dt):
    rng = rng_for("where", name(dt))
    for sc, sa, sb in WHERE_SHAPES:
        cond = operand(rng, dt, sc, "truth")  # cond of the same dtype too
        a, b = operand(rng, dt, sa, "nanwide"), operand(rng, dt, sb, "nanwide")
        want = np.where(np_view(cond).astype(bool), np_view(a), np_view(b)).astype(result_dtype(a.dtype, b.dtype))
        check(run(ctx, "where", cond, a, b), want, "arith", describe("where", cond, a, b))


@pytest.mark.parametrize("dc", ALL, ids=name)
def test_where_condition_dtypes(ctx, dc):
    """Any dtype as the condition (truthiness: NaN and -0.0 included)."""
    rng = rng_for("where-cond", name(dc))
    cond = operand(rng, dc, (3, 1, 4), "truth")
    a = operand(rng, F32, (5, 1), "wide")
    b = operand(rng, F32, (4,), "wide")
    want = np.where(np_view(cond).astype(bool), a, b)
    check(run(ctx, "where", cond, a, b), want, "arith", describe("where", cond, a, b))


@pytest.mark.parametrize("da,db", _PAIRS_BOTH_WAYS + [(BOOL, np.dtype(np.int8)), (np.dtype(np.uint8), BOOL)],
                         ids=lambda d: name(d))
def test_where_promotion(ctx, da, db):
    rng = rng_for("where-promo", name(da), name(db))
    cond = operand(rng, BOOL, (3, 1, 4), "truth")
    a, b = operand(rng, da, (5, 1), "wide"), operand(rng, db, (4,), "wide")
    res = result_dtype(da, db)
    want = np.where(cond, np_view(a), np_view(b)).astype(res)
    got = run(ctx, "where", cond, a, b)
    check(got, want, "arith", describe("where", cond, a, b))


def test_where_strided(ctx):
    rng = rng_for("where-strided")
    cond = operand(rng, np.dtype(np.int32), (5, 6), "truth").T  # (6, 5)
    a = operand(rng, F64, (12, 5), "nanwide")[::2]
    b = np.broadcast_to(operand(rng, np.dtype(np.int16), (5,), "wide"), (6, 5))
    want = np.where(cond.astype(bool), a, b)
    check(run(ctx, "where", cond, a, b), want, "arith", describe("where", cond, a, b))


# ------------------------------------------------------------------- errors

BOOL_REJECTING_BINARY = ARITH  # add sub mul div floordiv mod pow minimum maximum
BOOL_REJECTING_UNARY = list(KEEP_UNARY) + list(MATH_UNARY) + ["clamp"]


@pytest.mark.parametrize("other", [BOOL, np.dtype(np.int8), F32], ids=name)
@pytest.mark.parametrize("op", BOOL_REJECTING_BINARY)
def test_bool_rejected_by_binary_arithmetic(ctx, op, other):
    t = np.array([True, False, True])
    o = np.ones(3, dtype=other)
    for a, b in ((t, o), (o, t)):
        err = invoke_error(ctx, op, a, b)
        assert err.kind == ndx.NDX_ERROR_TYPE and err.kind_name == "TypeError", (describe(op, a, b), err)


@pytest.mark.parametrize("op", BOOL_REJECTING_UNARY)
def test_bool_rejected_by_unary_math(ctx, op):
    t = np.array([True, False, True])
    err = invoke_error(ctx, op, t)
    assert err.kind == ndx.NDX_ERROR_TYPE and err.kind_name == "TypeError", (op, err)


def _shape_texts(shape):
    inner = ", ".join(str(n) for n in shape)
    texts = {f"[{inner}]", f"({inner})", f"[{inner.replace(' ', '')}]", f"({inner.replace(' ', '')})"}
    if len(shape) == 1:
        texts.add(f"({shape[0]},)")
    return texts


MISMATCHED = [((3,), (4,)), ((2, 3), (3, 2)), ((5, 2, 4), (3, 4))]


@pytest.mark.parametrize("shapes", MISMATCHED, ids=[f"{a}-{b}" for a, b in MISMATCHED])
@pytest.mark.parametrize("op", BINARY + ["where"])
def test_shape_mismatch_fails_at_invoke(ctx, op, shapes):
    sa, sb = shapes
    dt = np.dtype(np.float32)
    a, b = np.ones(sa, dt), np.ones(sb, dt)
    inputs = (np.ones(sa, bool), a, b) if op == "where" else (a, b)
    err = invoke_error(ctx, op, *inputs)
    assert err.kind == ndx.NDX_ERROR_VALUE and err.kind_name == "ValueError", err
    msg = err.message
    assert "cannot be broadcast" in msg, msg
    for s in (sa, sb):
        assert any(t in msg for t in _shape_texts(s)), f"shape {s} not in {msg!r}"


def test_input_count_is_checked(ctx):
    x = np.ones(3, np.float32)
    for op, inputs in (("add", (x,)), ("neg", (x, x)), ("where", (x, x))):
        with pytest.raises(ndx.NdxError):
            ctx.invoke(op, inputs, mode=ndx.NDX_EVAL_SYNC_CPU).release()


@pytest.mark.skipif(not HAVE_BF16, reason="ml_dtypes is not installed")
@pytest.mark.parametrize(
    "other,want",
    [("float16", "float32"), ("float32", "float32"), ("float64", "float64"), ("int8", "bfloat16"),
     ("uint8", "bfloat16"), ("int16", "float32"), ("int32", "float64"), ("bfloat16", "bfloat16")],
)
def test_bfloat16_promotion_rule(ctx, other, want):
    o = np.dtype(ml_dtypes.bfloat16) if other == "bfloat16" else np.dtype(other)
    a = np.array([1.5, -2.0, 3.0], dtype=BF16)
    b = np.array([2, 1, 3], dtype=o)
    got = run(ctx, "add", a, b)
    assert name(got.dtype) == want
    assert name(result_dtype(BF16, o)) == want


# Every operator of the spec is exercised above (a guard against a dropped name).
def test_every_operator_is_covered():
    covered = set(BINARY) | set(UNARY) | {"clamp", "where"}
    spec = set(
        "add sub mul div floordiv mod pow minimum maximum eq ne lt le gt ge logical_and "
        "logical_or logical_xor logical_not neg abs sign sqrt exp log sin cos tanh sigmoid "
        "rsqrt relu floor ceil round isnan isfinite clamp where".split()
    )
    assert covered == spec
