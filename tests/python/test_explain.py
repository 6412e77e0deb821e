"""The explain report through the C ABI: graphs (one per flush of DEFERRED work),
graph breaks (flushes forced before results were asked for) with their reason,
sequence number and site, invocations per mode, raised check flags, the JSON text,
and the accessors' argument errors.

Run: NDX_LIBRARY=/path/to/libndx.so python3 -m pytest -q tests/python/test_explain.py

Reference: include/ndx.h (`ndx_context_explain`, `ndx_explain_t`, `ndx_explain_free`,
`ndx_explain_summary[_t]`, `ndx_explain_graph[_count]`, `ndx_explain_graph_t`,
`ndx_explain_break[_count]`, `ndx_graph_break_t`, `ndx_explain_json`,
`ndx_flush_reason_t`).

Sites: a CONSUMER break names the consuming invocation's site (the Python line with
the frame provider and HOST/ALL capture, or an explicit `location`); DATA_READ and
EXPORT breaks name the native caller of `ndx_tensor_copy_to` / `ndx_tensor_to_dlpack*`,
which from Python is inside the interpreter: their file and line are asserted only
from a small C program (`test_c_caller_is_the_site_of_data_read_and_export`).
"""

import ctypes
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from ctypes import CFUNCTYPE, POINTER, Structure, byref, c_char_p, c_int64, c_size_t, c_uint32, c_void_p

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ndx_ctypes as ndx  # noqa: E402
from conftest import c_layout, header_dir  # noqa: E402

THIS_FILE = os.path.realpath(__file__)
DEFERRED, EAGER = ndx.NDX_EVAL_DEFERRED, ndx.NDX_EVAL_EAGER
SYNC_CPU, SYNC_FULL = ndx.NDX_EVAL_SYNC_CPU, ndx.NDX_EVAL_SYNC_FULL
EVALUATE, WAIT, POLL = ndx.NDX_FLUSH_EVALUATE, ndx.NDX_FLUSH_WAIT, ndx.NDX_FLUSH_POLL
DATA_READ, EXPORT = ndx.NDX_FLUSH_DATA_READ, ndx.NDX_FLUSH_EXPORT
CONSUMER, METADATA = ndx.NDX_FLUSH_CONSUMER, ndx.NDX_FLUSH_METADATA
BREAK_REASONS = {DATA_READ, EXPORT, CONSUMER, METADATA}
# The reason names of the JSON text.
REASON_NAMES = {
    EVALUATE: "evaluate",
    WAIT: "wait",
    POLL: "poll",
    DATA_READ: "data_read",
    EXPORT: "export",
    CONSUMER: "consumer",
    METADATA: "metadata",
}
DETAIL_CAP = 4096  # graphs and breaks kept in detail (ndx_context_explain)

X = np.arange(4, dtype=np.float32)
Y = np.full(4, 0.5, dtype=np.float32)

# A private handle of the library, with its own prototypes (leaving `ndx.lib` alone),
# for what the binding does not wrap: DLPack export and host operators.


class ndx_op_schema_t(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("n_inputs", c_size_t),
        ("n_outputs", c_size_t),
        ("n_args", c_size_t),
        ("arg_names", c_void_p),
        ("arg_types", c_void_p),
        ("output_dtypes", c_void_p),
        ("output_ndims", c_void_p),
        ("output_layouts", c_void_p),
        ("flags", c_uint32),
    ]


KERNEL_T = CFUNCTYPE(c_void_p, c_void_p, POINTER(c_void_p), c_size_t, c_void_p, POINTER(c_void_p), c_size_t)

_raw = ctypes.CDLL(ndx.LIBRARY_PATH)
for _name, _res, _args in [
    ("ndx_tensor_to_dlpack_versioned", c_void_p, [c_void_p, POINTER(POINTER(ndx.DLManagedTensorVersioned))]),
    ("ndx_tensor_to_dlpack", c_void_p, [c_void_p, POINTER(POINTER(ndx.DLManagedTensor))]),
    ("ndx_register_op", c_void_p, [c_void_p, c_char_p, POINTER(ndx_op_schema_t), KERNEL_T, c_void_p,
                                   ndx.USER_FREE_T]),
]:
    getattr(_raw, _name).restype, getattr(_raw, _name).argtypes = _res, _args


def next_line():
    """The line after the caller's: put it just before the ndx call it names."""
    return inspect.currentframe().f_back.f_lineno + 1


def same_file(path):
    return path is not None and os.path.realpath(path) == THIS_FILE


@pytest.fixture
def context(make_context):
    """`context(mode=DEFERRED, provider=False, **kw)`: a new ndx.Context (without a frame provider by default),
    released after the test (see conftest.py)."""

    def make(mode=DEFERRED, provider=False, **kw):
        return make_context(mode, provider, **kw)

    return make


def expected_json(ex):
    """The JSON object `ndx_explain_json` must print for what the accessors read."""
    s = ex.summary
    return {
        "ndx_explain": 1,
        "graphs_total": s.graphs,
        "breaks_total": s.breaks,
        "ops": s.ops,
        "graph_ops": s.graph_ops,
        "invocations": {"sync_cpu": s.sync_cpu, "sync_full": s.sync_full, "deferred": s.deferred, "eager": s.eager},
        "checks_raised": s.checks_raised,
        "graphs": [{"reason": REASON_NAMES[g.reason], "ops": g.ops, "time_ns": g.time_ns, "seq": g.seq}
                   for g in ex.graphs],
        "breaks": [{"graph": b.graph, "reason": REASON_NAMES[b.reason], "seq": b.seq, "file": b.file,
                    "line": b.line, "function": b.function} for b in ex.breaks],
    }


def assert_consistent(ex):
    """What holds for every snapshot (below the detail cap): totals against the
    records, each break against the graph it flushed, the JSON against the
    accessors (exactly)."""
    s = ex.summary
    assert s.ops == s.sync_cpu + s.sync_full + s.deferred + s.eager, s
    assert (s.graphs, s.breaks) == (len(ex.graphs), len(ex.breaks)), s
    assert s.graph_ops == sum(g.ops for g in ex.graphs) <= s.deferred, (s, ex.graphs)
    assert [g for g in ex.graphs if g.reason in BREAK_REASONS] == [ex.graphs[b.graph] for b in ex.breaks]
    for b in ex.breaks:
        assert b.reason in BREAK_REASONS, b
        g = ex.graphs[b.graph]
        assert (g.reason, g.seq) == (b.reason, b.seq), (g, b)
    for g in ex.graphs:
        assert g.reason in REASON_NAMES and g.ops >= 1 and g.seq >= 1 and g.time_ns >= -1, g
    assert json_running_as_minus_one(ex) == expected_json(ex), ex.json


def json_running_as_minus_one(ex):
    """`ex.json`, with the `null` time the JSON gives a running graph read as -1 (what
    the accessor says): that one disagreement is test_json_time_of_a_running_graph."""
    j = json.loads(json.dumps(ex.json))
    for g, rec in zip(j["graphs"], ex.graphs):
        if g["time_ns"] is None and rec.time_ns == -1:
            g["time_ns"] = -1
    return j


def explain(ctx):
    """`ctx.explain()`, checked with `assert_consistent`."""
    ex = ctx.explain()
    assert isinstance(ex, ndx.Explain)
    assert_consistent(ex)
    return ex


def records(ex):
    """(graphs without their times, breaks without their sites)."""
    return ([(g.reason, g.ops, g.seq) for g in ex.graphs], [(b.reason, b.graph, b.seq) for b in ex.breaks])


def summary(graphs=0, breaks=0, graph_ops=0, sync_cpu=0, sync_full=0, deferred=0, eager=0, checks_raised=0):
    return ndx.ExplainSummary(graphs, breaks, sync_cpu + sync_full + deferred + eager, graph_ops, sync_cpu,
                              sync_full, deferred, eager, checks_raised)


class Snapshot:
    """A native `ndx_explain_t*` (for the raw accessors), freed on exit."""

    def __init__(self, ctx):
        out = c_void_p()
        ndx.check(ndx.lib.ndx_context_explain(ctx.ptr, byref(out)))
        assert out.value
        self.ptr = out.value

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        ndx.lib.ndx_explain_free(self.ptr)

    def read(self):
        ex = ndx.Explain.from_borrowed(self.ptr)
        assert_consistent(ex)
        return ex


def export(tensor, versioned):
    """Exports through DLPack and frees the export at once (its deleter)."""
    if versioned:
        p = POINTER(ndx.DLManagedTensorVersioned)()
        ndx.check(_raw.ndx_tensor_to_dlpack_versioned(tensor.ptr, byref(p)))
    else:
        p = POINTER(ndx.DLManagedTensor)()
        ndx.check(_raw.ndx_tensor_to_dlpack(tensor.ptr, byref(p)))
    d = p.contents.dl_tensor
    values = np.ctypeslib.as_array(ctypes.cast(d.data + d.byte_offset, POINTER(ctypes.c_float)), (d.shape[0],)).copy()
    p.contents.deleter(p)
    return values


def invoke_at(ctx, op, inputs, mode, file, line, function):
    """`ndx_invoke` with an explicit `location` (what NDX_HERE fills in C)."""
    tensors = [ndx.as_tensor(x) for x in inputs]
    arr = (ndx.ndx_input_t * len(tensors))()
    for i, t in enumerate(tensors):
        arr[i].tensor = t.ptr
    opts = ndx.ndx_invoke_options_t()
    opts.struct_size = ctypes.sizeof(opts)
    opts.mode = mode
    opts.location.file, opts.location.line, opts.location.function = file.encode(), line, function.encode()
    out = c_void_p()
    ndx.check(ndx.lib.ndx_invoke(ctx.ptr, op.encode(), arr, len(tensors), None, byref(opts), byref(out)))
    return ndx.Future(out.value)


# ----------------------------------------------------------------------- host operators
# A host operator's output shape is known only after it ran: reading it is a
# METADATA break. Kernels and schemas live as long as the module (never freed).

_kernels = []


def copy_input(inputs):
    """The float32 data of `inputs[0]` (borrowed), as a NumPy array."""
    t = ndx.Tensor(inputs[0])
    try:
        return t.numpy()
    finally:
        t.ptr = None  # borrowed: not released here


def output_from(arr, outputs):
    shape = (c_int64 * 1)(arr.shape[0])
    out = c_void_p()
    err = ndx.lib.ndx_tensor_from_host(arr.ctypes.data, ndx.NDX_DTYPE_FLOAT32, 1, shape, None, None, byref(out))
    if err:
        return err
    outputs[0] = out.value
    return None


def register_host_op(ctx, name, fn):
    """Registers `name` (1 input, 1 output): `fn(input array) -> output array`."""

    def kernel(user, inputs, n_inputs, args, outputs, n_outputs):
        return output_from(np.ascontiguousarray(fn(copy_input(inputs)), dtype=np.float32), outputs)

    k = KERNEL_T(kernel)
    _kernels.append(k)
    schema = ndx_op_schema_t()
    schema.struct_size = ctypes.sizeof(schema)
    schema.n_inputs = schema.n_outputs = 1
    ndx.check(_raw.ndx_register_op(ctx.ptr, name.encode(), byref(schema), k, None, ndx.USER_FREE_T()))


# ----------------------------------------------------------------------- graphs


def test_new_context_explains_nothing(context):
    ex = explain(context())
    assert ex.summary == summary()
    assert (ex.graphs, ex.breaks) == ([], [])
    assert ex.json["graphs"] == [] and ex.json["breaks"] == []


def test_evaluate_runs_the_recorded_work_as_one_graph(context):
    ctx = context()
    a = ctx.invoke("add", [X, Y])  # 1
    b = ctx.invoke("neg", [a.tensor(0)])  # 2: downstream of 1
    c = ctx.invoke("mul", [X, X])  # 3: independent
    ex = explain(ctx)
    assert ex.summary == summary(deferred=3), "recording runs nothing"
    assert ex.graphs == []
    ctx.evaluate()
    ex = explain(ctx)
    assert ex.summary == summary(graphs=1, graph_ops=3, deferred=3)
    assert records(ex) == ([(EVALUATE, 3, 1)], [])
    assert ex.graphs[0].time_ns >= 0, "evaluate returns after the graph completed"
    assert ex.json["graphs"][0]["reason"] == "evaluate"
    # Nothing pending: evaluating again makes no graph; reading finished work neither.
    ctx.evaluate()
    np.testing.assert_array_equal(b.result(), -(X + Y))
    np.testing.assert_array_equal(c.tensor(0).numpy(), X * X)
    assert explain(ctx) == ex


def test_evaluate_without_deferred_work_makes_no_graph(context):
    ctx = context(mode=EAGER)
    ctx.invoke("add", [X, Y]).wait()
    ctx.invoke("add", [X, Y], mode=SYNC_CPU)
    ctx.evaluate()
    ex = explain(ctx)
    assert ex.summary == summary(eager=1, sync_cpu=1)
    assert ex.graphs == []


def test_evaluate_flushes_only_what_is_still_recorded(context):
    ctx = context()
    first = ctx.invoke("add", [X, Y])  # 1
    first.wait()  # a WAIT graph of 1
    ctx.invoke("mul", [X, Y])  # 2
    ctx.invoke("sub", [X, Y])  # 3
    ctx.evaluate()
    ex = explain(ctx)
    assert ex.summary == summary(graphs=2, graph_ops=3, deferred=3)
    assert [(g.reason, g.ops) for g in ex.graphs] == [(WAIT, 1), (EVALUATE, 2)]
    assert ex.graphs[0].seq == 1


def test_evaluate_graph_seq_is_its_first_invocation(context):
    ctx = context()
    ctx.invoke("add", [X, Y]).wait()  # 1: run by a WAIT graph
    ctx.invoke("mul", [X, Y])  # 2: the first one the evaluate graph runs
    ctx.invoke("sub", [X, Y])  # 3
    ctx.evaluate()
    assert records(explain(ctx))[0] == [(WAIT, 1, 1), (EVALUATE, 2, 2)]


def test_wait_is_a_graph_not_a_break(context):
    ctx = context()
    a = ctx.invoke("add", [X, Y])  # 1
    b = ctx.invoke("neg", [a.tensor(0)])  # 2
    other = ctx.invoke("mul", [X, X])  # 3: not upstream of 2
    b.wait()
    ex = explain(ctx)
    assert ex.summary == summary(graphs=1, graph_ops=2, deferred=3)
    assert records(ex) == ([(WAIT, 2, 2)], [])
    assert ex.graphs[0].time_ns >= 0, "the graph completed before wait returned"
    # Waiting again, waiting on the upstream, reading finished outputs: no new graph.
    b.wait()
    a.wait()
    np.testing.assert_array_equal(b.tensor(0).numpy(), -(X + Y))
    assert explain(ctx) == ex
    other.wait()
    assert records(explain(ctx)) == ([(WAIT, 2, 2), (WAIT, 1, 3)], [])


def test_poll_is_a_graph_not_a_break(context):
    ctx = context()
    a = ctx.invoke("add", [X, Y])  # 1
    b = ctx.invoke("neg", [a.tensor(0)])  # 2
    assert b.poll() in (ndx.NDX_FUTURE_PENDING, ndx.NDX_FUTURE_READY)
    ex = explain(ctx)
    assert ex.summary == summary(graphs=1, graph_ops=2, deferred=2)
    assert records(ex) == ([(POLL, 2, 2)], [])
    # The work is submitted: polling again and waiting make no other graph.
    b.poll()
    b.wait()
    ex = explain(ctx)
    assert records(ex) == ([(POLL, 2, 2)], [])
    assert ex.graphs[0].time_ns >= 0
    assert ex.json["graphs"][0]["reason"] == "poll"


def test_running_graph_time_is_minus_one_and_snapshots_do_not_change(context):
    """A graph still running has time_ns -1; a snapshot keeps what it read."""
    ctx = context()
    release = threading.Event()
    register_host_op(ctx, "blocked_copy", lambda a: a if release.wait(30) else a * 0)
    fut = ctx.invoke("blocked_copy", [X])  # 1
    try:
        assert fut.poll() == ndx.NDX_FUTURE_PENDING
        with Snapshot(ctx) as running:
            before = running.read()
            assert records(before) == ([(POLL, 1, 1)], [])
            assert before.graphs[0].time_ns == -1
            release.set()
            np.testing.assert_array_equal(fut.result(), X)
            after = explain(ctx)
            assert records(after) == records(before)
            assert after.graphs[0].time_ns >= 0
            ctx.invoke("add", [X, Y]).wait()
            assert running.read() == before, "a snapshot does not follow the context"
    finally:
        release.set()


def test_json_time_of_a_running_graph(context):
    ctx = context()
    release = threading.Event()
    register_host_op(ctx, "blocked_copy", lambda a: a if release.wait(30) else a * 0)
    fut = ctx.invoke("blocked_copy", [X])
    try:
        fut.poll()
        ex = ctx.explain()
        assert ex.graphs[0].time_ns == -1
        assert ex.json["graphs"][0]["time_ns"] == -1
    finally:
        release.set()
        fut.wait()


# ----------------------------------------------------------------------- breaks


def test_data_read_of_a_pending_output_is_a_break(context):
    ctx = context()
    a = ctx.invoke("add", [X, Y])  # 1
    b = ctx.invoke("neg", [a.tensor(0)])  # 2
    ctx.invoke("mul", [X, X])  # 3: independent, stays recorded
    out = b.tensor(0)
    np.testing.assert_array_equal(out.numpy(), -(X + Y))  # ndx_tensor_copy_to
    ex = explain(ctx)
    assert ex.summary == summary(graphs=1, breaks=1, graph_ops=2, deferred=3)
    assert records(ex) == ([(DATA_READ, 2, 2)], [(DATA_READ, 0, 2)])
    assert ex.graphs[0].time_ns >= 0
    # The site is the native caller of ndx_tensor_copy_to (inside the interpreter):
    # never this file's line, even with a frame provider (see the C test below).
    assert not same_file(ex.breaks[0].file)
    assert ex.json["breaks"][0]["reason"] == "data_read"
    # Reading computed data again (this output, or its upstream) is no break.
    np.testing.assert_array_equal(out.numpy(), -(X + Y))
    np.testing.assert_array_equal(a.tensor(0).numpy(), X + Y)
    assert explain(ctx) == ex
    ctx.evaluate()
    ex = explain(ctx)
    assert [(g.reason, g.ops) for g in ex.graphs] == [(DATA_READ, 2), (EVALUATE, 1)]
    assert records(ex)[1] == [(DATA_READ, 0, 2)]


@pytest.mark.parametrize("versioned", [True, False], ids=["versioned", "legacy"])
def test_dlpack_export_of_a_pending_output_is_a_break(context, versioned):
    ctx = context(provider=True)
    a = ctx.invoke("add", [X, Y])  # 1
    b = ctx.invoke("mul", [a.tensor(0), Y])  # 2
    ctx.invoke("sub", [X, Y])  # 3: independent
    np.testing.assert_array_equal(export(b.tensor(0), versioned), (X + Y) * Y)
    ex = explain(ctx)
    assert ex.summary == summary(graphs=1, breaks=1, graph_ops=2, deferred=3)
    assert records(ex) == ([(EXPORT, 2, 2)], [(EXPORT, 0, 2)])
    assert ex.graphs[0].time_ns >= 0
    assert not same_file(ex.breaks[0].file), "the native caller of the export, not the Python line"
    assert ex.json["breaks"][0]["reason"] == "export"
    # Exporting computed data again is no break.
    export(b.tensor(0), versioned)
    export(a.tensor(0), versioned)
    assert explain(ctx) == ex


@pytest.mark.parametrize("mode", [SYNC_CPU, SYNC_FULL, EAGER], ids=["SYNC_CPU", "SYNC_FULL", "EAGER"])
def test_consumer_of_a_deferred_value_is_a_break(context, mode):
    ctx = context()
    a = ctx.invoke("add", [X, Y])  # 1
    b = ctx.invoke("neg", [a.tensor(0)])  # 2: the value the consumer needs
    ctx.invoke("mul", [X, X])  # 3: not upstream of the consumer
    c = ctx.invoke("abs", [b.tensor(0)], mode=mode)  # 4
    np.testing.assert_array_equal(c.result(), X + Y)
    ex = explain(ctx)
    counts = {SYNC_CPU: "sync_cpu", SYNC_FULL: "sync_full", EAGER: "eager"}
    assert ex.summary == summary(graphs=1, breaks=1, graph_ops=2, deferred=3, **{counts[mode]: 1})
    (g,), (brk,) = ex.graphs, ex.breaks
    assert (g.reason, g.ops, brk.reason, brk.graph) == (CONSUMER, 2, CONSUMER, 0)
    assert g.time_ns >= 0
    assert ex.json["breaks"][0]["reason"] == "consumer"
    if mode != EAGER:  # EAGER: test_eager_consumer_break_names_the_needed_invocation
        assert (g.seq, brk.seq) == (2, 2)


def test_eager_consumer_break_names_the_needed_invocation(context):
    ctx = context()
    a = ctx.invoke("add", [X, Y])  # 1
    b = ctx.invoke("neg", [a.tensor(0)])  # 2
    ctx.invoke("abs", [b.tensor(0)], mode=EAGER).wait()  # 3
    assert records(explain(ctx)) == ([(CONSUMER, 2, 2)], [(CONSUMER, 0, 2)])


@pytest.mark.parametrize("mode", [SYNC_CPU, EAGER], ids=["SYNC_CPU", "EAGER"])
@pytest.mark.parametrize("policy", [ndx.NDX_CAPTURE_HOST, ndx.NDX_CAPTURE_ALL], ids=["HOST", "ALL"])
def test_consumer_break_site_is_the_consumers_python_line(context, policy, mode):
    ctx = context(provider=True, capture=policy)
    up = ctx.invoke("add", [X, Y])  # another line: not the site
    line = next_line()
    ctx.invoke("neg", [up.tensor(0)], mode=mode).wait()
    (brk,) = explain(ctx).breaks
    assert brk.reason == CONSUMER
    assert (brk.function, brk.line) == ("test_consumer_break_site_is_the_consumers_python_line", line), brk
    assert same_file(brk.file), brk


@pytest.mark.parametrize(
    "policy",
    [ndx.NDX_CAPTURE_OFF, ndx.NDX_CAPTURE_HOST, ndx.NDX_CAPTURE_NATIVE, ndx.NDX_CAPTURE_ALL],
    ids=["OFF", "HOST", "NATIVE", "ALL"],
)
@pytest.mark.parametrize("provider", [False, True], ids=["native", "provider"])
def test_consumer_break_site_is_the_explicit_location(context, policy, provider):
    ctx = context(provider=provider, capture=policy)
    up = ctx.invoke("add", [X, Y])  # 1
    invoke_at(ctx, "neg", [up.tensor(0)], SYNC_CPU, "consumer.c", 42, "consume")  # 2
    ex = explain(ctx)
    assert ex.breaks == [ndx.GraphBreak(CONSUMER, 0, 1, "consumer.c", 42, "consume")]
    assert ex.json["breaks"] == [
        {"graph": 0, "reason": "consumer", "seq": 1, "file": "consumer.c", "line": 42, "function": "consume"}
    ]


def test_deferred_consumer_is_no_break(context):
    ctx = context()
    a = ctx.invoke("add", [X, Y])
    b = ctx.invoke("neg", [a.tensor(0)])
    c = ctx.invoke("mul", [b.tensor(0), a.tensor(0)])
    assert explain(ctx).summary == summary(deferred=3)
    np.testing.assert_array_equal(c.result(), -(X + Y) * (X + Y))
    assert records(explain(ctx)) == ([(WAIT, 3, 3)], [])


@pytest.mark.parametrize("mode", [SYNC_CPU, EAGER], ids=["SYNC_CPU", "EAGER"])
def test_consumer_of_a_computed_deferred_value_is_no_break(context, mode):
    ctx = context()
    a = ctx.invoke("add", [X, Y])  # 1
    a.wait()
    ctx.invoke("neg", [a.tensor(0)], mode=mode).wait()  # 2: its input is ready
    assert records(explain(ctx)) == ([(WAIT, 1, 1)], [])


def test_host_operator_metadata_is_a_break(context):
    ctx = context()
    register_host_op(ctx, "halve", lambda a: a[::2])
    a = ctx.invoke("halve", [X])  # 1
    out = a.tensor(0)
    assert explain(ctx).summary == summary(deferred=1)
    assert out.shape == (2,)  # only running it can tell
    ex = explain(ctx)
    assert records(ex) == ([(METADATA, 1, 1)], [(METADATA, 0, 1)])
    assert ex.json["breaks"][0]["reason"] == "metadata"
    # A DEFERRED built-in that consumes it needs its shape at ndx_invoke.
    b = ctx.invoke("halve", [Y])  # 2
    c = ctx.invoke("neg", [b.tensor(0)])  # 3
    ex = explain(ctx)
    assert records(ex) == ([(METADATA, 1, 1), (METADATA, 1, 2)], [(METADATA, 0, 1), (METADATA, 1, 2)])
    np.testing.assert_array_equal(c.result(), -Y[::2])
    ex = explain(ctx)
    assert ex.summary == summary(graphs=3, breaks=2, graph_ops=3, deferred=3)
    assert records(ex)[0][2] == (WAIT, 1, 3)


# ----------------------------------------------------------------------- counts


def test_eager_and_sync_work_make_no_graphs(context):
    ctx = context(mode=EAGER)
    a = ctx.invoke("add", [X, Y])
    b = ctx.invoke("neg", [a.tensor(0)], mode=SYNC_CPU)
    c = ctx.invoke("mul", [b.tensor(0), X], mode=SYNC_FULL)
    d = ctx.invoke("abs", [c.tensor(0)])
    np.testing.assert_array_equal(d.result(), np.abs(-(X + Y) * X))
    d.tensor(0).numpy()
    export(c.tensor(0), True)
    ctx.evaluate()
    ex = explain(ctx)
    assert ex.summary == summary(sync_cpu=1, sync_full=1, eager=2)
    assert (ex.graphs, ex.breaks) == ([], [])
    assert ex.json["invocations"] == {"sync_cpu": 1, "sync_full": 1, "deferred": 0, "eager": 2}


def test_invocations_are_counted_per_mode(context):
    ctx = context(mode=DEFERRED)
    ctx.invoke("add", [X, Y])  # the context's mode: DEFERRED
    ctx.invoke("add", [X, Y], mode=DEFERRED)
    for _ in range(3):
        ctx.invoke("add", [X, Y], mode=SYNC_CPU)
    ctx.invoke("add", [X, Y], mode=SYNC_FULL)
    for _ in range(4):
        ctx.invoke("add", [X, Y], mode=EAGER).wait()
    inv = ctx.prepare("mul", [X, Y])  # prepared: counted like any invocation
    inv()
    inv()
    # Call-time failures enqueue nothing; a failing invocation is counted.
    with pytest.raises(ndx.NdxValueError):
        ctx.invoke("no_such_op", [X])
    with pytest.raises(ndx.NdxError):
        ctx.invoke("add", [X])
    err = ctx.invoke("div", [np.array([1], np.int32), np.array([0], np.int32)], mode=SYNC_CPU).error()
    assert err is not None and err.kind == ndx.NDX_ERROR_VALUE
    ctx.set_eval_mode(SYNC_FULL)
    ctx.invoke("add", [X, Y])
    ex = explain(ctx)
    assert ex.summary == summary(deferred=4, sync_cpu=4, sync_full=2, eager=4)
    assert ex.summary.ops == 14
    assert ex.json["invocations"] == {"sync_cpu": 4, "sync_full": 2, "deferred": 4, "eager": 4}
    ctx.evaluate()
    assert explain(ctx).summary == summary(graphs=1, graph_ops=4, deferred=4, sync_cpu=4, sync_full=2, eager=4)


NOT_FINITE = np.array([1.0, np.nan, 2.0, np.inf], dtype=np.float32)  # a failing check_finite


@pytest.mark.parametrize("mode", [SYNC_CPU, DEFERRED], ids=["SYNC_CPU", "DEFERRED"])
def test_checks_raised_counts_every_flag(context, mode):
    """COLLECT: every raised flag counts, folded ones each time; passing checks and
    deferred work not yet run count nothing; reporting the flags keeps the count."""
    ctx = context(mode=mode, provider=True, check_policy=ndx.NDX_CHECKS_COLLECT)
    for _ in range(3):
        ctx.invoke("check_finite", [NOT_FINITE])  # one site: folded into one flag, counted 3 times
    ctx.invoke("check", [np.zeros(3, bool)])  # 1
    ctx.invoke("check", [np.ones(3, bool)])  # passes: 0
    ctx.invoke("div", [np.array([1, 2], np.int32), np.array([0, 1], np.int32)])  # DIV: 1
    ctx.invoke("div", [np.array([1.0, 2.0]), np.array([0.0, 1.0])])  # DIV and NAN (inf from finite): 2
    if mode == DEFERRED:
        assert explain(ctx).summary.checks_raised == 0, "nothing has run"
        ctx.invoke("neg", [X]).wait()  # an unrelated graph runs none of them
        assert explain(ctx).summary.checks_raised == 0
        with pytest.raises(ndx.NdxError) as info:
            ctx.evaluate()
        err = info.value
    else:
        err = ctx.take_check_errors()
    assert err.kind == ndx.NDX_ERROR_CHECK and len(err.related) == 5, [f.message for f in err.related]
    ex = explain(ctx)
    assert ex.summary.checks_raised == 7
    assert ex.json["checks_raised"] == 7
    assert ctx.take_check_errors() is None
    assert explain(ctx).summary.checks_raised == 7, "reported flags stay counted"


@pytest.mark.parametrize("policy", [ndx.NDX_CHECKS_OFF, ndx.NDX_CHECKS_FAIL_FAST], ids=["OFF", "FAIL_FAST"])
def test_checks_raised_by_policy(context, policy):
    ctx = context(mode=SYNC_CPU, check_policy=policy)
    futures = [
        ctx.invoke("check_finite", [NOT_FINITE]),
        ctx.invoke("check", [np.zeros(2, bool)]),
        ctx.invoke("check_range", [np.array([5, 6], np.int32)], args={"lo": 0.0, "hi": 1.0}),
        ctx.invoke("check", [np.ones(2, bool)]),
    ]
    failed = [f.error() is not None for f in futures]
    if policy == ndx.NDX_CHECKS_OFF:
        assert failed == [False] * 4
        assert explain(ctx).summary.checks_raised == 0
    else:
        assert failed == [True, True, True, False]  # each fails at its first flag
        assert explain(ctx).summary.checks_raised == 3


# ----------------------------------------------------------------------- JSON


def test_json_agrees_with_the_accessors_for_every_reason(context):
    ctx = context(provider=True, check_policy=ndx.NDX_CHECKS_COLLECT)
    register_host_op(ctx, "copy", lambda a: a)
    ctx.invoke("mul", [X, Y])  # 1: EVALUATE
    ctx.evaluate()
    ctx.invoke("add", [X, Y]).wait()  # 2: WAIT
    p = ctx.invoke("add", [X, Y])  # 3: POLL
    p.poll()
    p.wait()
    ctx.invoke("add", [X, Y]).tensor(0).numpy()  # 4: DATA_READ
    export(ctx.invoke("add", [X, Y]).tensor(0), True)  # 5: EXPORT
    up = ctx.invoke("add", [X, Y])  # 6
    line = next_line()
    ctx.invoke("neg", [up.tensor(0)], mode=SYNC_CPU)  # 7: CONSUMER
    assert ctx.invoke("copy", [X]).tensor(0).shape == (4,)  # 8: METADATA
    ctx.invoke("check", [np.zeros(2, bool)], mode=EAGER).wait()  # 9
    assert ctx.take_check_errors().kind == ndx.NDX_ERROR_CHECK
    ex = explain(ctx)  # asserts json == the accessors, exactly
    assert records(ex) == (
        [(EVALUATE, 1, 1), (WAIT, 1, 2), (POLL, 1, 3), (DATA_READ, 1, 4), (EXPORT, 1, 5), (CONSUMER, 1, 6),
         (METADATA, 1, 8)],
        [(DATA_READ, 3, 4), (EXPORT, 4, 5), (CONSUMER, 5, 6), (METADATA, 6, 8)],
    )
    assert ex.summary == summary(graphs=7, breaks=4, graph_ops=7, deferred=7, sync_cpu=1, eager=1, checks_raised=1)
    j = ex.json
    assert [g["reason"] for g in j["graphs"]] == [
        "evaluate", "wait", "poll", "data_read", "export", "consumer", "metadata"]
    assert [b["reason"] for b in j["breaks"]] == ["data_read", "export", "consumer", "metadata"]
    assert (j["graphs_total"], j["breaks_total"], j["ops"], j["graph_ops"], j["checks_raised"]) == (7, 4, 9, 7, 1)
    assert j["breaks"][2]["line"] == line and same_file(j["breaks"][2]["file"])
    assert j["breaks"][2]["function"] == "test_json_agrees_with_the_accessors_for_every_reason"
    assert all(g["time_ns"] >= 0 for g in j["graphs"])


def test_json_is_snprintf_like(context):
    ctx = context(provider=True)
    ctx.invoke("add", [X, Y]).wait()
    up = ctx.invoke("add", [X, Y])
    ctx.invoke("neg", [up.tensor(0)], mode=SYNC_CPU)
    with Snapshot(ctx) as snap:
        n = ndx.lib.ndx_explain_json(snap.ptr, None, 0)
        full = ndx.explain_json(snap.ptr).encode()
        assert n == len(full) > 0
        json.loads(full)
        assert ndx.lib.ndx_explain_json(snap.ptr, None, 0) == n, "the same text each time"
        for cap in (1, 2, 10, n - 1, n, n + 1, n + 64):
            buf = ctypes.create_string_buffer(b"\xa5" * (n + 80), n + 80)
            assert ndx.lib.ndx_explain_json(snap.ptr, buf, cap) == n, cap
            kept = min(cap - 1, n)
            assert buf.raw[:kept] == full[:kept], cap
            assert buf.raw[kept] == 0, f"NUL-terminated (cap {cap})"
            assert buf.raw[kept + 1:] == b"\xa5" * (n + 80 - kept - 1), f"nothing written past the NUL (cap {cap})"
        buf = ctypes.create_string_buffer(b"\xa5" * 4, 4)
        assert ndx.lib.ndx_explain_json(snap.ptr, buf, 0) == n
        assert buf.raw == b"\xa5" * 4, "cap 0 writes nothing"


# ----------------------------------------------------------------------- accessor errors


def test_graph_and_break_index_out_of_range(context):
    ctx = context()
    ctx.invoke("add", [X, Y]).tensor(0).numpy()  # one graph, one break
    ctx.invoke("add", [X, Y]).wait()  # a second graph
    with Snapshot(ctx) as snap:
        assert (ndx.lib.ndx_explain_graph_count(snap.ptr), ndx.lib.ndx_explain_break_count(snap.ptr)) == (2, 1)
        for index in (2, 3, 2**63, 2**64 - 1):
            g = ndx.ndx_explain_graph_t(ctypes.sizeof(ndx.ndx_explain_graph_t), 99, 98, 97, 96)
            with pytest.raises(IndexError) as info:
                ndx.check(ndx.lib.ndx_explain_graph(snap.ptr, index, byref(g)))
            err = info.value
            assert isinstance(err, ndx.NdxIndexError) and err.kind == ndx.NDX_ERROR_INDEX
            assert err.message == f"graph index {index} is out of range: the snapshot has 2 graphs", err.message
            # Out-params are NULL/0 on error: the fields after struct_size read zero.
            assert (g.struct_size, g.reason, g.ops, g.time_ns, g.seq) == (ctypes.sizeof(g), 0, 0, 0, 0), "out zeroed"
        for index in (1, 7, 2**64 - 1):
            b = ndx.ndx_graph_break_t(ctypes.sizeof(ndx.ndx_graph_break_t), 99, 98, 97)
            with pytest.raises(IndexError) as info:
                ndx.check(ndx.lib.ndx_explain_break(snap.ptr, index, byref(b)))
            err = info.value
            assert isinstance(err, ndx.NdxIndexError) and err.kind == ndx.NDX_ERROR_INDEX
            assert err.message == f"break index {index} is out of range: the snapshot has 1 break", err.message
            assert (b.reason, b.graph, b.seq, b.line) == (0, 0, 0, 0) and not b.file, "out zeroed"


STRUCTS = {
    "ndx_explain_summary_t": (ndx.ndx_explain_summary_t, lambda ptr, out: ndx.lib.ndx_explain_summary(ptr, out)),
    "ndx_explain_graph_t": (ndx.ndx_explain_graph_t, lambda ptr, out: ndx.lib.ndx_explain_graph(ptr, 0, out)),
    "ndx_graph_break_t": (ndx.ndx_graph_break_t, lambda ptr, out: ndx.lib.ndx_explain_break(ptr, 0, out)),
}


@pytest.mark.parametrize("name", sorted(STRUCTS))
def test_struct_size_too_small_is_a_value_error(context, name):
    cls, call = STRUCTS[name]
    size = ctypes.sizeof(cls)
    ctx = context()
    ctx.invoke("add", [X, Y]).tensor(0).numpy()  # one graph, one break
    with Snapshot(ctx) as snap:
        for small in (0, 8, ctypes.sizeof(c_size_t), size - 1):
            out = cls()
            ctypes.memset(byref(out), 0x5A, size)
            out.struct_size = small
            with pytest.raises(ValueError) as info:
                ndx.check(call(snap.ptr, byref(out)))
            err = info.value
            assert isinstance(err, ndx.NdxValueError)
            assert err.message == f"out->struct_size is {small}, expected at least {size} (sizeof({name}))"
            after = bytes(out)
            assert after[ctypes.sizeof(c_size_t):] == b"\x5a" * (size - ctypes.sizeof(c_size_t)), "nothing written"
        with pytest.raises(ndx.NdxValueError, match="argument 'out' is NULL"):
            ndx.check(call(snap.ptr, None))
        # A larger (newer) struct: the known fields are filled, the rest left alone.
        buf = (ctypes.c_uint8 * (size + 16))(*([0x5A] * (size + 16)))
        out = cls.from_buffer(buf)
        out.struct_size = size + 16
        ndx.check(call(snap.ptr, byref(out)))
        assert bytes(buf)[size:] == b"\x5a" * 16
        exact = cls()
        exact.struct_size = size
        ndx.check(call(snap.ptr, byref(exact)))
        fields = [f for f, _ in cls._fields_ if f != "struct_size"]
        assert [getattr(out, f) for f in fields] == [getattr(exact, f) for f in fields]


def test_null_explain(context):
    null = None
    assert ndx.lib.ndx_explain_graph_count(null) == 0
    assert ndx.lib.ndx_explain_break_count(null) == 0
    assert ndx.lib.ndx_explain_json(null, None, 0) == 0
    buf = ctypes.create_string_buffer(8)
    assert ndx.lib.ndx_explain_json(null, buf, 8) == 0
    ndx.lib.ndx_explain_free(null)  # a no-op
    s = ndx.ndx_explain_summary_t()
    s.struct_size = ctypes.sizeof(s)
    g = ndx.ndx_explain_graph_t()
    g.struct_size = ctypes.sizeof(g)
    b = ndx.ndx_graph_break_t()
    b.struct_size = ctypes.sizeof(b)
    for err in (
        ndx.lib.ndx_explain_summary(null, byref(s)),
        ndx.lib.ndx_explain_graph(null, 0, byref(g)),
        ndx.lib.ndx_explain_break(null, 0, byref(b)),
    ):
        with pytest.raises(ndx.NdxValueError, match="argument 'explain' is NULL"):
            ndx.check(err)
    out = c_void_p(1234)
    with pytest.raises(ndx.NdxValueError, match="argument 'ctx' is NULL"):
        ndx.check(ndx.lib.ndx_context_explain(None, byref(out)))
    with pytest.raises(ndx.NdxValueError, match="argument 'out' is NULL"):
        ndx.check(ndx.lib.ndx_context_explain(context().ptr, None))


def test_null_explain_json_still_terminates_the_buffer():
    buf = ctypes.create_string_buffer(b"x" * 8, 8)
    assert ndx.lib.ndx_explain_json(None, buf, 8) == 0
    assert buf.raw[0] == 0


# ----------------------------------------------------------------------- detail cap


@pytest.fixture(scope="module")
def past_the_cap():
    """DETAIL_CAP + 4 graphs: DETAIL_CAP WAIT graphs of 1 op, then 4 CONSUMER graphs
    (breaks) of 2 ops. (CONSUMER breaks with Python sites: DATA_READ breaks from
    Python make the first snapshot slow, ~70 ms each.)"""
    with ndx.Context(mode=DEFERRED) as ctx:
        up = ctx.prepare("add", [X, Y])
        for _ in range(DETAIL_CAP):
            up().wait()
        for _ in range(4):
            a = up()
            b = ctx.invoke("neg", [a.tensor(0)])
            ctx.invoke("abs", [b.tensor(0)], mode=SYNC_CPU)
        yield ctx.explain()


def test_detail_is_capped_and_totals_count_everything(past_the_cap):
    ex = past_the_cap
    s = ex.summary
    assert (s.graphs, s.breaks, s.deferred, s.sync_cpu, s.ops) == (DETAIL_CAP + 4, 4, DETAIL_CAP + 8, 4,
                                                                   DETAIL_CAP + 12)
    assert len(ex.graphs) == DETAIL_CAP
    assert ex.graphs[0].seq == 1 and ex.graphs[-1].seq == DETAIL_CAP
    assert all((g.reason, g.ops) == (WAIT, 1) for g in ex.graphs)
    j = ex.json
    assert (j["graphs_total"], j["breaks_total"], j["ops"]) == (DETAIL_CAP + 4, 4, DETAIL_CAP + 12)
    assert len(j["graphs"]) == DETAIL_CAP
    assert j["graphs"] == expected_json(ex)["graphs"] and j["breaks"] == expected_json(ex)["breaks"]
    assert j["graph_ops"] == s.graph_ops


def test_graph_ops_counts_graphs_past_the_cap(past_the_cap):
    assert past_the_cap.summary.graph_ops == DETAIL_CAP + 8


def test_breaks_past_the_graph_cap_are_counted_not_kept(past_the_cap):
    """Break records point at graph records: the breaks of graphs past the cap are
    counted in the totals only."""
    assert past_the_cap.summary.breaks == 4
    assert len(past_the_cap.breaks) == 0


# ----------------------------------------------------------------------- C callers and ABI

DRIVER = r"""
#include <dlfcn.h>
#include <stdio.h>
#include "ndx.h"
#define SYM(name) __typeof__(&name) p_##name = (__typeof__(&name))dlsym(lib, #name); \
  if (!p_##name) { fprintf(stderr, "no %s\n", #name); return 2; }
#define CK(call) do { ndx_error_t *e_ = (call); \
  if (e_) { fprintf(stderr, "%d: %s\n", __LINE__, p_ndx_error_message(e_)); return 3; } } while (0)
int main(int argc, char **argv) {
  void *lib = dlopen(argv[1], RTLD_NOW);
  if (!lib) { fprintf(stderr, "%s\n", dlerror()); return 1; }
  SYM(ndx_error_message) SYM(ndx_context_new) SYM(ndx_tensor_from_host) SYM(ndx_invoke)
  SYM(ndx_future_tensor) SYM(ndx_tensor_copy_to) SYM(ndx_tensor_to_dlpack_versioned) SYM(ndx_context_explain)
  SYM(ndx_explain_break_count) SYM(ndx_explain_break) SYM(ndx_explain_free)
  ndx_context_options_t o = {0};
  o.struct_size = sizeof o;
  o.eval_mode = NDX_EVAL_DEFERRED;
  ndx_context_t *ctx = NULL;
  CK(p_ndx_context_new(&o, &ctx));
  float data[4] = {1, 2, 3, 4}, back[4];
  int64_t shape[1] = {4};
  ndx_tensor_t *x = NULL;
  CK(p_ndx_tensor_from_host(data, NDX_DTYPE_FLOAT32, 1, shape, NULL, NULL, &x));
  ndx_input_t in[2] = {{x, NULL}, {x, NULL}};
  ndx_future_t *f1 = NULL, *f2 = NULL;
  ndx_tensor_t *t1 = NULL, *t2 = NULL;
  CK(p_ndx_invoke(ctx, "add", in, 2, NULL, NULL, &f1));
  CK(p_ndx_invoke(ctx, "mul", in, 2, NULL, NULL, &f2));
  CK(p_ndx_future_tensor(f1, 0, &t1));
  CK(p_ndx_future_tensor(f2, 0, &t2));
  CK(p_ndx_tensor_copy_to(t1, back, sizeof back)); /* DATA_READ */
  DLManagedTensorVersioned *m = NULL;
  CK(p_ndx_tensor_to_dlpack_versioned(t2, &m)); /* EXPORT */
  m->deleter(m);
  ndx_explain_t *ex = NULL;
  CK(p_ndx_context_explain(ctx, &ex));
  for (size_t i = 0; i < p_ndx_explain_break_count(ex); i++) {
    ndx_graph_break_t b = {sizeof b};
    CK(p_ndx_explain_break(ex, i, &b));
    printf("%d\t%zu\t%llu\t%s\t%u\t%s\n", (int)b.reason, b.graph, (unsigned long long)b.seq,
           b.file ? b.file : "(null)", b.line, b.function ? b.function : "(null)");
  }
  p_ndx_explain_free(ex);
  return 0;  /* the process exits: the handles are not released */
}
"""


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_c_caller_is_the_site_of_data_read_and_export(tmp_path):
    """From native code the site of a DATA_READ / EXPORT break is the caller of
    ndx_tensor_copy_to / ndx_tensor_to_dlpack_versioned: file, line, function."""
    include = header_dir()
    src = tmp_path / "explain_driver.c"
    src.write_text(DRIVER)
    lines = {m.group(1): DRIVER[: m.start()].count("\n") + 1 for m in re.finditer(r"/\* (\w+) \*/", DRIVER)}
    exe = tmp_path / "explain_driver"
    subprocess.run(["cc", "-g", "-O0", "-I", include, str(src), "-o", str(exe), "-ldl"], check=True)
    run = subprocess.run([str(exe), ndx.LIBRARY_PATH], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    got = [line.split("\t") for line in run.stdout.splitlines()]
    assert [(int(r), int(g), int(s), os.path.realpath(f), int(ln), fn) for r, g, s, f, ln, fn in got] == [
        (DATA_READ, 0, 1, os.path.realpath(src), lines["DATA_READ"], "main"),
        (EXPORT, 1, 2, os.path.realpath(src), lines["EXPORT"], "main"),
    ]


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_explain_struct_layouts_match_header(tmp_path):
    include = header_dir()
    structs = {
        "ndx_explain_summary_t": ndx.ndx_explain_summary_t,
        "ndx_explain_graph_t": ndx.ndx_explain_graph_t,
        "ndx_graph_break_t": ndx.ndx_graph_break_t,
        "ndx_op_schema_t": ndx_op_schema_t,  # this file's own mirror
    }
    consts = ["NDX_FLUSH_EVALUATE", "NDX_FLUSH_WAIT", "NDX_FLUSH_POLL", "NDX_FLUSH_DATA_READ", "NDX_FLUSH_EXPORT",
              "NDX_FLUSH_CONSUMER", "NDX_FLUSH_METADATA", "NDX_ERROR_INDEX"]
    got, expected = c_layout(tmp_path, include, structs, consts)
    assert got == expected
