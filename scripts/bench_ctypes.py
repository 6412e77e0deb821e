#!/usr/bin/env python3
"""Per-invocation cost of libndx from Python through ctypes.

  NDX_LIBRARY=/path/to/libndx.so python3 scripts/bench_ctypes.py [--number N] [--repeat R]

Measures, with `timeit` (best of R runs of N calls each):
  (a) a DEFERRED `add` of two small float32 tensors, future released each time,
      capture policy OFF;
  (b) the same with the Python frame provider and capture policy HOST;
  (c) an EAGER `add` + `ndx_future_wait` round trip (policy OFF), future released;
and compares each with 300 us, the low end of NVIDIA DALI dynamic mode's
per-invocation cost quoted in our issue. Each call is built once (inputs, options;
`ndx_ctypes.Invocation`), so an invoke is one foreign call, plus one to release the
future. Deferred invocations stay recorded until `ndx_context_evaluate`, which runs
between timed runs (untimed).
"""

import argparse
import os
import sys
import timeit

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))

import numpy as np  # noqa: E402

import ndx_ctypes as ndx  # noqa: E402

DALI_US = 300.0


def best_us(stmt, number, repeat, between=None):
    timer = timeit.Timer(stmt)
    best = float("inf")
    for _ in range(repeat):
        best = min(best, timer.timeit(number))
        if between is not None:
            between()
    return best / number * 1e6


def report(label, us):
    print(f"{label}: {us:.2f} us/call ({DALI_US / us:.0f}x cheaper than {DALI_US:.0f} us)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--number", type=int, default=20000, help="calls per timed run")
    ap.add_argument("--repeat", type=int, default=5, help="timed runs (best is reported)")
    opt = ap.parse_args()
    n, r = opt.number, opt.repeat

    print(f"libndx {ndx.lib.ndx_version_string().decode()} from {ndx.LIBRARY_PATH}")
    print(f"python {sys.version.split()[0]}, numpy {np.__version__}; best of {r} x {n} calls")

    a = np.arange(16, dtype=np.float32)
    b = np.ones(16, dtype=np.float32)
    release = ndx.lib.ndx_future_release
    wait = ndx.lib.ndx_future_wait

    # Floor: one no-op foreign call through ctypes.
    version = ndx.lib.ndx_version
    report("ctypes empty call (ndx_version)", best_us(version, n, r))

    with ndx.Context(capture=ndx.NDX_CAPTURE_OFF) as ctx:
        inv = ctx.prepare("add", [a, b], mode=ndx.NDX_EVAL_DEFERRED)
        invoke = inv.invoke_raw

        def deferred():
            release(invoke())

        us_a = best_us(deferred, n, r, ctx.evaluate)
        report("(a) ctypes deferred invoke, capture OFF", us_a)

        provider = ctx.set_frame_provider()
        ctx.set_capture_policy(ndx.NDX_CAPTURE_HOST)
        us_b = best_us(deferred, n, r, ctx.evaluate)
        report("(b) ctypes deferred invoke, Python frame provider + HOST", us_b)
        print(f"    frame provider cost: {us_b - us_a:.2f} us/call for {provider.last_count} "
              f"Python frames")

        def nested(depth):  # the same call from `depth` more Python frames
            return nested(depth - 1) if depth else deferred()

        us_b16 = best_us(lambda: nested(20), n, r, ctx.evaluate)
        report("(b') the same from 20 nested Python calls", us_b16)
        print(f"    frame provider cost: {us_b16 - us_a:.2f} us/call for {provider.last_count} "
              f"Python frames (the capture depth), 20 Python calls included")
        if provider.errors:
            raise SystemExit(f"the frame provider failed {provider.errors} times")
        ctx.set_frame_provider(None)
        ctx.set_capture_policy(ndx.NDX_CAPTURE_OFF)

        eager = ctx.prepare("add", [a, b], mode=ndx.NDX_EVAL_EAGER)
        invoke_eager = eager.invoke_raw

        def round_trip():
            fut = invoke_eager()
            err = wait(fut, -1)
            release(fut)
            if err:
                raise ndx.NdxError.from_ptr(err)

        report("(c) ctypes eager invoke + wait round trip, capture OFF", best_us(round_trip, n, r))

        poll = ndx.lib.ndx_future_poll

        def spin_trip():
            fut = invoke_eager()
            while poll(fut) == ndx.NDX_FUTURE_PENDING:
                pass
            release(fut)

        # Where (c) goes: the same round trip without blocking (busy polling), so the
        # difference is the waiting thread's sleep and wake-up inside ndx_future_wait.
        report("(c') ctypes eager invoke + busy poll round trip, capture OFF", best_us(spin_trip, n, r))

        # Sanity: the benchmarked invocation computes the right thing.
        np.testing.assert_array_equal(eager().result(), a + b)
        ctx.evaluate()


if __name__ == "__main__":
    main()
