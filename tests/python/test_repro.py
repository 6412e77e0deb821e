"""Repro documents through the C ABI: a real kernel failure's document (with its input
bytes) is saved to a file and replayed in a fresh process to the same error kind and
message; metadata-only documents and malformed ones are refused clearly."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import ndx_ctypes as ndx

HERE = os.path.dirname(os.path.abspath(__file__))

REPLAY = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import ndx_ctypes as ndx
doc = open(sys.argv[2]).read()
with ndx.Context() as ctx:
    fut = ctx.repro_run(doc)
    err = fut.error() if fut.poll() == ndx.NDX_FUTURE_FAILED else None
    if err is None:
        try:
            fut.wait()
        except ndx.NdxError as e:
            err = e
    print(json.dumps(None if err is None else {"kind": err.kind_name, "message": err.message, "op": err.op}))
"""

# Real kernel failures (found while running, not injected): op, inputs, args.
FAILURES = {
    "floordiv": ([np.int32([[7, 8], [9, 10]]), np.int32([3, 0])], None),
    "mod": ([np.int64([5, 6, 7]), np.int64([1, 0, 2])], None),
    "pow": ([np.int16([2, 3]), np.int16([1, -1])], None),
}


def failed(fut) -> ndx.NdxError:
    with pytest.raises(ndx.NdxError) as info:
        fut.wait()
    return info.value


@pytest.mark.parametrize("mode", [ndx.NDX_EVAL_EAGER, ndx.NDX_EVAL_DEFERRED, ndx.NDX_EVAL_SYNC_CPU])
@pytest.mark.parametrize("op", sorted(FAILURES))
def test_saved_repro_replays_in_a_fresh_process(tmp_path, op, mode):
    inputs, args = FAILURES[op]
    with ndx.Context(mode=mode) as ctx:
        err = failed(ctx.invoke(op, inputs, args=args))
    assert err.kind == ndx.NDX_ERROR_VALUE and err.op == op, err
    doc = json.loads(err.repro)
    assert doc["op"] == op and doc["bytes_included"] is True
    assert [i["shape"] for i in doc["inputs"]] == [list(x.shape) for x in inputs]
    assert [i["dtype"] for i in doc["inputs"]] == [str(x.dtype) for x in inputs]
    assert bytes.fromhex(doc["inputs"][1]["bytes"]) == inputs[1].tobytes()
    assert doc["error"] == {"kind": err.kind_name, "message": err.message}
    assert doc["backend"] == "default" and doc["ndx_version"]
    path = tmp_path / "repro.json"
    path.write_text(err.repro)
    out = subprocess.run(
        [sys.executable, "-c", REPLAY, HERE, str(path)],
        check=True,
        capture_output=True,
        text=True,
        env=dict(os.environ),
    )
    got = json.loads(out.stdout)
    assert got == {"kind": err.kind_name, "message": err.message, "op": op}, out.stderr


def test_a_dependent_finds_the_document_of_the_first_failure():
    with ndx.Context(mode=ndx.NDX_EVAL_DEFERRED) as ctx:
        first = ctx.invoke("floordiv", [np.int32([1]), np.int32([0])])
        second = ctx.invoke("neg", [first.tensor(0)])
        err = failed(second)
    assert err.op == "neg" and err.cause is not None and err.cause.op == "floordiv"
    assert json.loads(err.repro)["op"] == "floordiv"


def test_metadata_only_documents_cannot_be_replayed():
    with ndx.Context(mode=ndx.NDX_EVAL_SYNC_CPU, repro_max_bytes=-1) as ctx:
        err = failed(ctx.invoke("floordiv", [np.int32([1, 2]), np.int32([0, 1])]))
        doc = json.loads(err.repro)
        assert doc["bytes_included"] is False and doc["inputs"][0]["bytes"] is None
        assert doc["input_bytes"] == 16
        with pytest.raises(ndx.NdxError) as info:
            ctx.repro_run(err.repro)
        assert info.value.kind == ndx.NDX_ERROR_VALUE
        assert "inputs[0] has no bytes" in info.value.message
        # Raised, the cap lets the same failure carry its bytes.
        ctx.set_repro_max_bytes(16)
        err = failed(ctx.invoke("floordiv", [np.int32([1, 2]), np.int32([0, 1])]))
        assert json.loads(err.repro)["bytes_included"] is True


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("{", "repro document: not valid JSON"),
        ('{"ndx_repro": 2}', "format 2 is not supported"),
        ('{"ndx_repro": 1, "op": "add", "args": [], "inputs": [{"dtype": "float99"}], "mode": "eager"}',
         "inputs[0]: unknown dtype 'float99'"),
    ],
)
def test_malformed_documents_are_value_errors(text, fragment):
    with ndx.Context() as ctx:
        with pytest.raises(ndx.NdxError) as info:
            ctx.repro_run(text)
    assert info.value.kind == ndx.NDX_ERROR_VALUE and fragment in info.value.message, info.value


def test_errors_without_an_invocation_have_no_document():
    with ndx.Context() as ctx:
        with pytest.raises(ndx.NdxError) as info:
            ctx.invoke("no_such_op", [np.int32([1])])
    assert info.value.repro is None


@pytest.mark.parametrize("mode", [ndx.NDX_EVAL_EAGER, ndx.NDX_EVAL_DEFERRED, ndx.NDX_EVAL_SYNC_CPU])
def test_a_fail_fast_check_failure_carries_a_document_that_replays(mode):
    # A check that fails its invocation (FAIL_FAST) fails it while running, as a
    # kernel error does: its document replays on a context with the same checks.
    x = np.float32([1.0, np.nan, 3.0])
    checks = dict(check_policy=ndx.NDX_CHECKS_FAIL_FAST, check_categories=ndx.NDX_CHECK_USER)
    with ndx.Context(mode=mode, **checks) as ctx:
        err = failed(ctx.invoke("check_finite", [x]))
        assert err.kind == ndx.NDX_ERROR_CHECK and err.op == "check_finite", err
        doc = json.loads(err.repro)
        assert doc["op"] == "check_finite" and doc["sample"] is None
        assert doc["error"] == {"kind": err.kind_name, "message": err.message}
        assert bytes.fromhex(doc["inputs"][0]["bytes"]) == x.tobytes()
        again = failed(ctx.repro_run(err.repro))
        assert (again.kind, again.op) == (err.kind, err.op), again
        assert "not finite" in again.message and "not finite" in err.message, err.message


def test_noexcept_wraps_a_fail_fast_check_failure():
    # Every execution failure becomes a BACKEND error with the original as its cause.
    with ndx.Context(backend="noexcept", check_policy=ndx.NDX_CHECKS_FAIL_FAST,
                     check_categories=ndx.NDX_CHECK_USER) as ctx:
        err = failed(ctx.invoke("check_finite", [np.float32([np.nan])]))
    assert err.kind == ndx.NDX_ERROR_BACKEND, err
    assert err.message == "unexpected error when running check_finite", err.message
    assert err.cause is not None and err.cause.kind == ndx.NDX_ERROR_CHECK, err.cause
    assert json.loads(err.repro)["op"] == "check_finite"  # found in the cause chain
