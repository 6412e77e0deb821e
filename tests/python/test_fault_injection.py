"""The fault-injection backends (`ndx_context_set_backend`, include/ndx.h) with every
built-in operator, in every eval mode (SYNC_CPU, SYNC_FULL, DEFERRED, EAGER).

Run: NDX_LIBRARY=/path/to/libndx.so python3 -m pytest -q tests/python/test_fault_injection.py

Backends (docs: "Debug backends and explain" of the design, `ndx_context_set_backend`):
  inject_compile_error:OP   every invocation of OP fails at `ndx_invoke` itself:
                            NDX_ERROR_BACKEND, "injected compile error in operator
                            'OP' (backend inject_compile_error:OP)", error op OP.
  inject_runtime_error:OP   `ndx_invoke` succeeds; the future fails with
                            NDX_ERROR_RUNTIME, "injected runtime error in operator
                            'OP' (backend inject_runtime_error:OP)": already FAILED on
                            return in the SYNC modes, nothing run before a wait (or
                            evaluate) in DEFERRED. Reading the output fails the same
                            way; an invocation that consumes the output fails with the
                            injected error as its cause; `ndx_context_evaluate` reports
                            a failure nobody observed.
  inject_accuracy_error:OP  no error; every output is the correct result + 1 in its
                            own dtype (integers wrap, bool becomes all true).

The correct result is the same invocation on the default backend (SYNC_CPU), so each
operator's own semantics are tested elsewhere (test_ops_*.py); here only the
injected difference is. An injection names one operator: with OP any other operator
(a built-in whose name shares the longest prefix, e.g. "flip" for "flip_horizontal",
and the operator's name with a suffix, e.g. "add_"), every operator gives exactly the
default backend's result.

How the backend is chosen: the injecting tests set it with the context option
(`ndx_context_options_t.backend`), the pass-through tests with
`ndx_context_set_backend` after creation; `test_backend_applies_to_later_invocations`
checks that switching works both ways and does not touch work already recorded.
"""

import os
import sys
from typing import NamedTuple, Optional

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ndx_ctypes as ndx  # noqa: E402

MODES = {
    "SYNC_CPU": ndx.NDX_EVAL_SYNC_CPU,
    "SYNC_FULL": ndx.NDX_EVAL_SYNC_FULL,
    "DEFERRED": ndx.NDX_EVAL_DEFERRED,
    "EAGER": ndx.NDX_EVAL_EAGER,
}
SYNC_MODES = {ndx.NDX_EVAL_SYNC_CPU, ndx.NDX_EVAL_SYNC_FULL}
KINDS = ["compile", "runtime", "accuracy"]


def backend(kind, op):
    return f"inject_{kind}_error:{op}"


# ------------------------------------------------------------------- recipes


class DType(NamedTuple):
    """A dtype argument (`ndx_args_set_dtype`) in a recipe's arguments."""

    code: int


class Recipe(NamedTuple):
    """One valid invocation: input arrays, named arguments (plain values as
    `ndx.Args` sets them by type, or DType) and the inputs' layout."""

    inputs: tuple
    args: Optional[dict] = None
    layout: Optional[str] = None


def arr(values, dt):
    return np.array(values, dtype=dt)


# Inputs: small, with values every operator accepts (no zero divisor, positive
# operands of sqrt/log/rsqrt, non-negative integer exponents), in a spread of dtypes
# so that the +1 of the accuracy backend is seen in many of them (uint8 255 and int8
# 127 wrap).
F16 = arr([[1.5, -2.25, 3.0], [0.5, 4.0, -1.0]], np.float16)
F32 = arr([[1.5, -2.25, 3.0], [0.5, 4.0, -1.0]], np.float32)
F32_ROW = arr([0.75, 2.0, -1.5], np.float32)  # broadcasts against (2, 3)
F64 = arr([[1.25, -2.5, 3.75], [0.5, 4.5, -1.0]], np.float64)
F64_ROW = arr([2.0, -0.5, 1.5], np.float64)
POS = arr([[0.25, 1.0, 2.0], [4.0, 9.0, 0.5]], np.float32)  # sqrt, log, rsqrt
SPECIAL = arr([1.0, np.nan, np.inf, -np.inf, -0.0], np.float32)
I8 = arr([[127, -128, 5], [-3, 0, 7]], np.int8)
I8_ROW = arr([2, -3, 4], np.int8)
I32 = arr([[2, -3, 4], [5, 0, -1]], np.int32)
EXPONENT = arr([3, 0, 2], np.int32)
I64 = arr([[10, -20, 30], [-7, 8, 9]], np.int64)
U8 = arr([[255, 0, 17], [3, 200, 9]], np.uint8)
U16 = arr([[7, 65535, 2], [9, 3, 1]], np.uint16)
U64 = arr([[5, 9, 2], [7, 1, 3]], np.uint64)
BOOL = arr([[True, False, True], [False, False, True]], np.bool_)
BOOL_ROW = arr([True, False, False], np.bool_)
SQUEEZABLE = arr([[[1.5], [-2.0], [3.0]]], np.float32)  # (1, 3, 1)
IMAGE = (np.arange(4 * 6 * 3).reshape(4, 6, 3) * 7 % 256).astype(np.uint8)  # (H, W, C)
IMAGE[0, 0] = 255  # an uint8 255 that +1 wraps

ELEMENTWISE = {
    "add": Recipe((F32, F32_ROW)),
    "sub": Recipe((I8, I8_ROW)),
    "mul": Recipe((U16, U16)),
    "div": Recipe((F64, F64_ROW)),
    "floordiv": Recipe((I32, arr([2, -3, 5], np.int32))),
    "mod": Recipe((F32, F32_ROW)),
    "pow": Recipe((I32, EXPONENT)),
    "minimum": Recipe((F16, F16[::-1])),
    "maximum": Recipe((U64, U64[:, ::-1])),
    "eq": Recipe((I32, I32[::-1])),
    "ne": Recipe((F32, F32[:, :1])),
    "lt": Recipe((I64, I64[::-1])),
    "le": Recipe((F64, F64_ROW)),
    "gt": Recipe((U8, U8[::-1])),
    "ge": Recipe((I8, I8_ROW)),
    "logical_and": Recipe((BOOL, BOOL_ROW)),
    "logical_or": Recipe((BOOL, BOOL_ROW)),
    "logical_xor": Recipe((BOOL, I32)),
    "neg": Recipe((I8,)),
    "abs": Recipe((F64,)),
    "sign": Recipe((I64,)),
    "relu": Recipe((F16,)),
    "floor": Recipe((F32,)),
    "ceil": Recipe((F64,)),
    "round": Recipe((F32,)),
    "sqrt": Recipe((POS,)),
    "exp": Recipe((F32,)),
    "log": Recipe((POS,)),
    "sin": Recipe((F64,)),
    "cos": Recipe((F32,)),
    "tanh": Recipe((F16,)),
    "sigmoid": Recipe((F64,)),
    "rsqrt": Recipe((POS,)),
    "isnan": Recipe((SPECIAL,)),
    "isfinite": Recipe((SPECIAL,)),
    "logical_not": Recipe((BOOL,)),
    "clamp": Recipe((F32,), {"lo": -1.0, "hi": 2.0}),
    "where": Recipe((BOOL, F32, F32_ROW)),
    "cast": Recipe((F32,), {"dtype": DType(ndx.NDX_DTYPE_INT32)}),
}
REDUCTIONS = {
    "sum": Recipe((I32,), {"axes": [1]}),
    "prod": Recipe((F64,), {"axes": [0]}),
    "mean": Recipe((U8,), {"axes": [1], "keepdims": True}),
    "min": Recipe((F32,)),
    "max": Recipe((I8,), {"axes": [0]}),
    "all": Recipe((BOOL,), {"axes": [1]}),
    "any": Recipe((BOOL,), {"axes": [0]}),
    "argmin": Recipe((F64,), {"axis": 1}),
    "argmax": Recipe((I32,)),
}
SHAPE_OPS = {
    "reshape": Recipe((F32,), {"shape": [3, -1]}),
    "transpose": Recipe((I64,)),
    "slice": Recipe((U8,), {"start": [0, 1], "end": [2, 3]}),
    "flip": Recipe((F16,), {"axes": [1]}),
    "squeeze": Recipe((SQUEEZABLE,)),
    "expand_dims": Recipe((I8,), {"axis": 1}),
    "pad": Recipe((F32,), {"widths": [1, 0, 0, 2], "value": 0.5}),
    "concat": Recipe((F32, I8, F64), {"axis": 0}),
    "stack": Recipe((U8, U8[::-1]), {"axis": 1}),
    "batch_to_tensor": Recipe((U16, U16[::-1])),
}
IMAGE_OPS = {
    "crop": Recipe((IMAGE,), {"x": 1, "y": 1, "w": 3, "h": 2}, "HWC"),
    "flip_horizontal": Recipe((IMAGE,), None, "HWC"),
    "flip_vertical": Recipe((IMAGE,), None, "HWC"),
    "normalize": Recipe((IMAGE,), {"mean": [0.5, 1.0, 2.0], "std": [2.0, 4.0, 8.0]}, "HWC"),
    "resize": Recipe((IMAGE,), {"h": 2, "w": 3}, "HWC"),
    "rgb_to_gray": Recipe((IMAGE,), None, "HWC"),
}
# The check operators pass their input through; the contexts here keep the default
# check policy (OFF), so they look at nothing, and the inputs would pass anyway.
CHECK_OPS = {
    "check": Recipe((BOOL,), {"message": "recipe"}),
    "check_finite": Recipe((F32,)),
    "check_range": Recipe((I32,), {"lo": -5.0, "hi": 5.0}),
    "check_shape": Recipe((U8,), {"pattern": [2, -1]}),
}
RECIPES = {**ELEMENTWISE, **REDUCTIONS, **SHAPE_OPS, **IMAGE_OPS, **CHECK_OPS}
OPS = sorted(RECIPES)

# Every built-in operator of docs/operators.md (a guard against a dropped name).
BUILTINS = set(
    "add sub mul div floordiv mod pow minimum maximum eq ne lt le gt ge logical_and "
    "logical_or logical_xor logical_not neg abs sign sqrt exp log sin cos tanh sigmoid "
    "rsqrt relu floor ceil round isnan isfinite clamp where cast "
    "sum prod mean min max all any argmin argmax "
    "reshape transpose slice flip squeeze expand_dims pad concat stack batch_to_tensor "
    "crop resize flip_horizontal flip_vertical normalize rgb_to_gray "
    "check check_finite check_range check_shape".split()
)


def neighbour(op):
    """The other built-in whose name shares the longest prefix with `op` (a name an
    injection must not be confused with: "flip" / "flip_horizontal", "min" /
    "minimum", "log" / "logical_and", ...)."""

    def common(other):
        return len(os.path.commonprefix([op, other]))

    return max(sorted(BUILTINS - {op}), key=common)


OTHER_NAMES = {"neighbour": neighbour}

# ------------------------------------------------------------------- calling ndx


def make_args(spec):
    if spec is None:
        return None
    args = ndx.Args()
    for key, value in spec.items():
        if isinstance(value, DType):
            args.set_dtype(key, value.code)
        else:
            args.set(key, value)
    return args


def invoke(ctx, op, mode=ndx.NDX_EVAL_CONTEXT_DEFAULT):
    """Invokes `op` with its recipe; returns the future (raises call-time errors)."""
    r = RECIPES[op]
    tensors = [ndx.tensor_from_numpy(x, layout=r.layout) for x in r.inputs]
    return ctx.invoke(op, tensors, mode=mode, args=make_args(r.args))


def outputs(fut):
    """Waits for `fut` and returns its outputs as NumPy arrays."""
    fut.wait()
    return [fut.tensor(i).numpy() for i in range(fut.output_count())]


_REFERENCE = {}


def reference(op):
    """The outputs of `op`'s recipe on the default backend (SYNC_CPU), computed once."""
    if op not in _REFERENCE:
        with ndx.Context(mode=ndx.NDX_EVAL_SYNC_CPU) as ctx:
            _REFERENCE[op] = outputs(invoke(ctx, op))
    return _REFERENCE[op]


def plus_one(x):
    """`x` + 1 in its own dtype, as the accuracy backend perturbs an output: integers
    wrap, floats round to their dtype, bool becomes true."""
    if x.dtype == np.bool_:
        return np.ones_like(x)
    return np.add(x, np.ones((), x.dtype), dtype=x.dtype)


def assert_same(got, want, what):
    """Same number of outputs; each of the same dtype, shape and values (NaN equals
    NaN)."""
    assert len(got) == len(want), f"{what}: {len(got)} outputs, want {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype, f"{what}: output {i} dtype {g.dtype}, want {w.dtype}"
        assert g.shape == w.shape, f"{what}: output {i} shape {g.shape}, want {w.shape}"
        np.testing.assert_array_equal(g, w, err_msg=f"{what}: output {i}", strict=True)


def assert_inputs_unchanged(op, before):
    for i, (x, b) in enumerate(zip(RECIPES[op].inputs, before)):
        np.testing.assert_array_equal(x, b, err_msg=f"{op}: input {i} was modified", strict=True)


def assert_injected_runtime_error(err, op, what):
    """`err` is the injected runtime error of `op`: kind, message, op, site."""
    assert isinstance(err, ndx.NdxError), f"{what}: no error"
    assert err.kind == ndx.NDX_ERROR_RUNTIME and err.kind_name == "RuntimeError", (what, err.kind_name, err)
    assert isinstance(err, RuntimeError), what
    assert f"injected runtime error in operator '{op}'" in err.message, (what, err.message)
    assert f"(backend {backend('runtime', op)})" in err.message, (what, err.message)
    assert err.op == op, (what, err.op)
    assert err.sequence >= 1, (what, err.sequence)
    assert err.frames, f"{what}: the error has no site"
    assert err.cause is None, (what, err.cause)


@pytest.fixture
def context():
    """`context(mode=..., backend=...)`: a new ndx.Context, released after the test."""
    made = []

    def make(**kw):
        made.append(ndx.Context(**kw))
        return made[-1]

    yield make
    for c in made:
        c.release()


# ------------------------------------------------------------------- the recipes


def test_every_builtin_has_a_recipe():
    assert set(RECIPES) == BUILTINS
    assert all(neighbour(op) != op and neighbour(op) in BUILTINS for op in OPS)
    assert neighbour("flip_horizontal") == "flip_vertical" and neighbour("min") == "minimum"


@pytest.mark.parametrize("op", OPS)
def test_recipe_is_valid_on_the_default_backend(op):
    """Each recipe runs on the default backend and gives non-empty outputs whose +1
    differs from them (so the accuracy tests can tell)."""
    outs = reference(op)
    assert outs, op
    for out in outs:
        assert out.size > 0, op
        assert not np.array_equal(plus_one(out), out, equal_nan=True), f"{op}: +1 cannot be seen"


# ------------------------------------------------------------------- the injected op


def check_compile(ctx, op, mode):
    with pytest.raises(ndx.NdxError) as info:
        invoke(ctx, op)
    err = info.value
    what = f"{op} under {backend('compile', op)}"
    assert err.kind == ndx.NDX_ERROR_BACKEND and err.kind_name == "BackendError", (what, err.kind_name, err)
    assert f"injected compile error in operator '{op}'" in err.message, (what, err.message)
    assert f"(backend {backend('compile', op)})" in err.message, (what, err.message)
    assert err.op == op, (what, err.op)
    assert err.frames, f"{what}: the error has no site"
    assert err.cause is None, (what, err.cause)


def check_runtime(ctx, op, mode):
    what = f"{op} under {backend('runtime', op)}"
    fut = invoke(ctx, op)  # must not raise
    if mode in SYNC_MODES:
        assert fut.poll() == ndx.NDX_FUTURE_FAILED, f"{what}: not FAILED when invoke returned"
        assert_injected_runtime_error(fut.error(), op, what)
    elif mode == ndx.NDX_EVAL_DEFERRED:
        assert fut.error() is None, f"{what}: DEFERRED work ran before it was needed"
    # The output's metadata is known without running it.
    want = reference(op)[0]
    out = fut.tensor(0)
    assert (out.shape, ndx._NP_DTYPES[out.dtype]) == (want.shape, want.dtype.name), what
    with pytest.raises(ndx.NdxError) as info:
        fut.wait()
    assert_injected_runtime_error(info.value, op, f"{what}: wait")
    assert fut.poll() == ndx.NDX_FUTURE_FAILED, what
    assert_injected_runtime_error(fut.error(), op, f"{what}: ndx_future_error")
    with pytest.raises(ndx.NdxError) as info:
        out.numpy()
    assert_injected_runtime_error(info.value, op, f"{what}: reading the output")
    ctx.evaluate()  # observed: nothing more to report


def check_accuracy(ctx, op, mode):
    got = outputs(invoke(ctx, op))
    assert_same(got, [plus_one(w) for w in reference(op)], f"{op} under {backend('accuracy', op)}")


CHECKS = {"compile": check_compile, "runtime": check_runtime, "accuracy": check_accuracy}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", MODES.values(), ids=MODES.keys())
@pytest.mark.parametrize("op", OPS)
def test_injected_op(context, op, mode, kind):
    """The named operator fails (compile, runtime) or is perturbed (accuracy); the
    inputs are left unchanged and the context keeps working."""
    before = [np.array(x, copy=True) for x in RECIPES[op].inputs]
    ctx = context(mode=mode, backend=backend(kind, op))
    CHECKS[kind](ctx, op, mode)
    assert_inputs_unchanged(op, before)
    ctx.set_backend("default")
    assert_same(outputs(invoke(ctx, op)), reference(op), f"{op} on 'default' after {backend(kind, op)}")


# ------------------------------------------------------------------- other ops pass


@pytest.mark.parametrize("other", OTHER_NAMES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", MODES.values(), ids=MODES.keys())
@pytest.mark.parametrize("op", OPS)
def test_other_op_passes_untouched(context, op, mode, kind, other):
    """An injection that names another operator leaves `op` exactly as on the default
    backend: no error at invoke, at wait or from evaluate."""
    target = OTHER_NAMES[other](op)
    ctx = context(mode=mode)
    ctx.set_backend(backend(kind, target))
    what = f"{op} under {backend(kind, target)}"
    fut = invoke(ctx, op)
    assert_same(outputs(fut), reference(op), what)
    assert fut.poll() == ndx.NDX_FUTURE_READY and fut.error() is None, what
    ctx.evaluate()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("op", OPS)
def test_a_misspelt_operator_is_refused_with_the_name_meant(context, op, kind):
    """An injection naming no operator of the context (here `op` with a trailing
    underscore) is refused, with `op` as the hint: it used to be accepted and inject
    nothing, so a test of error handling passed without its fault."""
    ctx = context(mode=ndx.NDX_EVAL_SYNC_CPU)
    with pytest.raises(ndx.NdxError) as info:
        ctx.set_backend(backend(kind, op + "_"))
    assert info.value.kind == ndx.NDX_ERROR_VALUE, info.value
    assert f"names operator '{op}_'" in info.value.message, info.value.message
    assert f"did you mean '{op}'?" in info.value.message, info.value.message
    assert_same(outputs(invoke(ctx, op)), reference(op), f"{op} on 'default' after the refusal")


# ------------------------------------------------------------------- consumers


def consumer_of(op):
    """An operator that takes any dtype and shape, and is not `op`."""
    return "logical_not" if op != "logical_not" else "isfinite"


@pytest.mark.parametrize("mode", MODES.values(), ids=MODES.keys())
@pytest.mark.parametrize("op", OPS)
def test_consumer_of_injected_failure(context, op, mode):
    """An invocation that consumes the failed output is accepted at invoke and fails
    with the injected error as its cause. The context's mode is EAGER; the mode is
    given per invocation (`ndx_invoke_options_t.mode`)."""
    ctx = context(mode=ndx.NDX_EVAL_EAGER, backend=backend("runtime", op))
    down = consumer_of(op)
    up_fut = invoke(ctx, op, mode=mode)
    down_fut = ctx.invoke(down, [up_fut.tensor(0)], mode=mode)  # must not raise
    if mode in SYNC_MODES:
        assert down_fut.poll() == ndx.NDX_FUTURE_FAILED, f"{down} of {op}: not FAILED on return"
    with pytest.raises(ndx.NdxError) as info:
        down_fut.wait()
    err = info.value
    what = f"{down} of a failed {op}"
    assert err.kind == ndx.NDX_ERROR_RUNTIME, (what, err.kind_name, err)
    assert err.op == down and err.sequence == 2, (what, err.op, err.sequence)
    assert f"input 0 of '{down}' (#2) failed: it is the output of '{op}' (#1), which failed" in err.message, (
        what,
        err.message,
    )
    chain = list(err.chain())
    assert [e.op for e in chain] == [down, op], (what, [(e.op, e.message) for e in chain])
    root = chain[-1]
    assert_injected_runtime_error(root, op, f"{what}: root cause")
    assert root.sequence == 1, (what, root.sequence)
    assert_injected_runtime_error(up_fut.error(), op, f"{what}: upstream future")
    ctx.evaluate()  # both failures observed


# Consumers that pass every value through: (arguments, NumPy equivalent).
PASS_THROUGH = {"reshape": ({"shape": [-1]}, lambda x: x.reshape(-1)), "flip": (None, np.flip)}


@pytest.mark.parametrize("mode", MODES.values(), ids=MODES.keys())
@pytest.mark.parametrize("op", OPS)
def test_consumer_of_perturbed_output(context, op, mode):
    """The +1 is in the output itself (not added when it is read): an invocation
    that consumes it sees the perturbed values, and is not perturbed itself."""
    ctx = context(mode=mode, backend=backend("accuracy", op))
    down = "reshape" if op != "reshape" else "flip"
    args, same = PASS_THROUGH[down]
    up_fut = invoke(ctx, op)
    down_fut = ctx.invoke(down, [up_fut.tensor(0)], args=make_args(args))
    want = plus_one(reference(op)[0])
    assert_same(outputs(down_fut), [same(want)], f"{down} of {op} under {backend('accuracy', op)}")
    assert_same(outputs(up_fut)[:1], [want], f"{op} under {backend('accuracy', op)}")


@pytest.mark.parametrize("mode", MODES.values(), ids=MODES.keys())
@pytest.mark.parametrize("op", OPS)
def test_unobserved_injected_failure_is_reported_by_evaluate(context, op, mode):
    """Nobody waits: `ndx_context_evaluate` runs the work and reports the injected
    failure once (a RUNTIME error whose one related error is it)."""
    ctx = context(mode=mode, backend=backend("runtime", op))
    fut = invoke(ctx, op)
    with pytest.raises(ndx.NdxError) as info:
        ctx.evaluate()
    err = info.value
    assert err.kind == ndx.NDX_ERROR_RUNTIME, (op, err.kind_name, err)
    assert len(err.related) == 1, (op, [e.message for e in err.related])
    assert_injected_runtime_error(err.related[0], op, f"{op}: evaluate")
    ctx.evaluate()  # reported once
    assert fut.poll() == ndx.NDX_FUTURE_FAILED, op


# ------------------------------------------------------------------- setting the backend


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", MODES.values(), ids=MODES.keys())
def test_backend_applies_to_later_invocations(context, mode, kind):
    """`ndx_context_set_backend` switches the backend for invocations made after it,
    and back; an invocation keeps the backend it was made under, even when DEFERRED
    and run after the switch."""
    op = "add"
    ctx = context(mode=mode)
    recorded_default = invoke(ctx, op)
    ctx.set_backend(backend(kind, op))
    if kind == "compile":
        check_compile(ctx, op, mode)
        recorded_injected = None
    else:
        recorded_injected = invoke(ctx, op)
    ctx.set_backend("default")
    assert_same(outputs(recorded_default), reference(op), f"{op} made on 'default', run after the switch")
    if kind == "runtime":
        with pytest.raises(ndx.NdxError) as info:
            recorded_injected.wait()
        assert_injected_runtime_error(info.value, op, f"{op} made under the injection, run after the switch back")
    elif kind == "accuracy":
        got = outputs(recorded_injected)
        assert_same(got, [plus_one(w) for w in reference(op)], f"{op} made under the injection")
    assert_same(outputs(invoke(ctx, op)), reference(op), f"{op} after switching back to 'default'")


@pytest.mark.parametrize("kind", KINDS)
def test_option_and_setter_agree(context, kind):
    """The context option and `ndx_context_set_backend` give the same backend."""
    op = "mul"
    by_option = context(mode=ndx.NDX_EVAL_SYNC_CPU, backend=backend(kind, op))
    by_setter = context(mode=ndx.NDX_EVAL_SYNC_CPU)
    by_setter.set_backend(backend(kind, op))
    for ctx in (by_option, by_setter):
        CHECKS[kind](ctx, op, ndx.NDX_EVAL_SYNC_CPU)


@pytest.mark.parametrize("name", ["inject_compile_error:", "inject_runtime_error:", "inject_accuracy_error:",
                                  "inject_runtime_error", "inject_bogus_error:add",
                                  "inject_runtime_error:ad", "inject_compile_error:no_such_op"])
def test_malformed_backend_names_are_rejected(context, name):
    """A fault-injection backend needs the name of an operator the context has; an
    unknown backend or operator is refused (ValueError naming it) by the setter and by
    the context option alike, and the setter leaves the previous backend in place."""
    ctx = context(mode=ndx.NDX_EVAL_SYNC_CPU, backend=backend("accuracy", "add"))
    with pytest.raises(ndx.NdxError) as info:
        ctx.set_backend(name)
    assert info.value.kind == ndx.NDX_ERROR_VALUE, (name, info.value.kind_name, info.value)
    assert f"'{name}'" in info.value.message, info.value.message
    check_accuracy(ctx, "add", ndx.NDX_EVAL_SYNC_CPU)  # still the previous backend
    with pytest.raises(ndx.NdxError) as info:
        context(backend=name)
    assert info.value.kind == ndx.NDX_ERROR_VALUE, (name, info.value.kind_name, info.value)
