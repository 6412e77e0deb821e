"""ndx in a process forked after ndx ran (multiprocessing's "fork" start method, the
default on Linux before Python 3.14; data-loader workers): the child has none of the
parent's worker threads, so it gets a pool of its own, new contexts work there in
every mode, and what it inherited fails with a clear error instead of hanging:
a context made before the fork, a future that had not completed, a pending tensor
as an input. Forks taken while the parent's workers allocate leave no lock held in
the child. The parent goes on as before.

Each child reports over a pipe and leaves with os._exit; the parent kills one that
does not finish in time (a hang is the failure these tests exist for).

Run: NDX_LIBRARY=/path/to/libndx.so python3 -m pytest -q tests/python/test_fork.py
"""

import json
import os
import select
import signal
import sys
import time
import traceback

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ndx_ctypes as ndx  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

CHILD_SECONDS = 60


def in_child(body):
    """Runs `body()` in a forked child and returns what it returned (JSON), or raises
    with the child's traceback; a child still running after CHILD_SECONDS is killed
    and the test fails."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        code = 0
        try:
            out = {"ok": body()}
        except BaseException:
            out = {"error": traceback.format_exc()}
            code = 1
        try:
            os.write(w, json.dumps(out).encode())
        finally:
            os._exit(code)
    os.close(w)
    chunks = []
    deadline = time.monotonic() + CHILD_SECONDS
    try:
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([r], [], [], max(left, 0))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                pytest.fail(f"the forked child hung (killed after {CHILD_SECONDS} s)")
            b = os.read(r, 1 << 16)
            if not b:
                break
            chunks.append(b)
    finally:
        os.close(r)
    _, status = os.waitpid(pid, 0)
    out = json.loads(b"".join(chunks) or b"{}")
    if "error" in out:
        pytest.fail("in the forked child:\n" + out["error"])
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    return out["ok"]


def error_of(call):
    try:
        call()
    except ndx.NdxError as e:
        return [e.kind, e.message]
    return None


def test_new_contexts_work_in_a_forked_child_in_every_mode():
    parent = ndx.Context(mode=ndx.NDX_EVAL_EAGER)
    a = np.arange(1 << 22, dtype=np.float32)
    # The pool exists and has run work before the fork.
    np.testing.assert_array_equal(parent.invoke("add", [a, a]).result(), a + a)

    def child():
        results = {}
        for name in ["SYNC_CPU", "SYNC_FULL", "DEFERRED", "EAGER"]:
            c = ndx.Context(mode=getattr(ndx, "NDX_EVAL_" + name))
            # Large enough to be split across the pool.
            f = c.invoke("mul", [a, a])
            f.wait(timeout=30.0)
            got = f.result()
            results[name] = bool(np.array_equal(got, a * a))
            f.release()
            c.release()
        return results

    assert in_child(child) == {"SYNC_CPU": True, "SYNC_FULL": True, "DEFERRED": True, "EAGER": True}
    # The parent's pool and context go on.
    np.testing.assert_array_equal(parent.invoke("sub", [a, a]).result(), a - a)
    parent.release()


def test_what_the_child_inherited_fails_clearly_and_the_parent_goes_on():
    parent = ndx.Context(mode=ndx.NDX_EVAL_DEFERRED)
    x = np.arange(6, dtype=np.float32)
    done = parent.invoke("add", [x, x], mode=ndx.NDX_EVAL_SYNC_CPU)
    pending = parent.invoke("mul", [x, x])  # DEFERRED: recorded, not run
    pending_out = pending.tensor(0)

    def child():
        out = {}
        out["invoke"] = error_of(lambda: parent.invoke("add", [x, x]))
        out["evaluate"] = error_of(parent.evaluate)
        out["poll"] = pending.poll()
        out["wait"] = error_of(lambda: pending.wait(timeout=5.0))
        out["error"] = [pending.error().kind, pending.error().message]
        out["read"] = error_of(pending_out.numpy)
        fresh = ndx.Context(mode=ndx.NDX_EVAL_EAGER)
        out["as_input"] = error_of(lambda: fresh.invoke("add", [pending_out, x]))
        # Complete before the fork: its data is the child's copy, usable anywhere.
        out["done"] = done.result().tolist()
        with done.tensor(0) as t:
            out["done_in_new"] = fresh.invoke("add", [t, x]).result().tolist()
        # Releasing what was inherited waits for nothing.
        t0 = time.monotonic()
        pending_out.release()
        pending.release()
        parent.release()
        out["release_seconds"] = time.monotonic() - t0
        fresh.release()
        return out

    got = in_child(child)
    stale_ctx = "argument 'ctx': the context was created before this process forked"
    lost = "('mul') had not completed when the process forked; it never completes in the child"
    assert got["invoke"][0] == ndx.NDX_ERROR_VALUE and stale_ctx in got["invoke"][1], got["invoke"]
    assert got["evaluate"][0] == ndx.NDX_ERROR_VALUE and stale_ctx in got["evaluate"][1]
    assert got["poll"] == ndx.NDX_FUTURE_FAILED
    for key in ["wait", "error", "read"]:
        assert got[key][0] == ndx.NDX_ERROR_RUNTIME and lost in got[key][1], (key, got[key])
    assert got["as_input"][0] == ndx.NDX_ERROR_VALUE, got["as_input"]
    assert got["as_input"][1].startswith("input 0: invocation #") and lost in got["as_input"][1]
    assert got["done"] == (x + x).tolist()
    assert got["done_in_new"] == (x + x + x).tolist()
    assert got["release_seconds"] < 10
    # In the parent the deferred work runs as if nothing happened.
    assert pending.poll() != ndx.NDX_FUTURE_FAILED
    np.testing.assert_array_equal(pending.result(), x * x)
    pending_out.release()
    pending.release()
    parent.release()


def test_forks_while_the_workers_allocate_leave_no_lock_held_in_the_child():
    # Each fork lands while the parent's workers allocate and free outputs (the host
    # buffer cache); the child then allocates itself. A smoke test: the deterministic
    # check (a lock held across the fork) is ffi::fork's unit test.
    parent = ndx.Context(mode=ndx.NDX_EVAL_EAGER)
    # One import, held here: were each invocation to import `a`, its last reference
    # would go on a worker, whose NumPy deleter makes a Python thread state there; a
    # fork at that moment can hang the child inside CPython itself (gh-112275: its
    # runtime lock copied held; 3.11.7 here has the bug), whatever ndx does.
    a = np.ones((64, 1024), np.float32)
    ta = ndx.tensor_from_numpy(a)
    for i in range(12):
        busy = [parent.invoke("add", [ta, ta]) for _ in range(64)]

        def child(i=i):
            c = ndx.Context(mode=ndx.NDX_EVAL_EAGER)
            b = np.full((64, 1024), float(i), np.float32)
            futures = [c.invoke("add", [b, b]) for _ in range(8)]
            ok = all(np.array_equal(f.result(), b + b) for f in futures)
            for f in futures:
                f.release()
            c.release()
            return ok

        assert in_child(child) is True, i
        for f in busy:
            f.wait()
            f.release()
    ta.release()
    parent.release()
