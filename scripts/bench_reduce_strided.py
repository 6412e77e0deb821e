#!/usr/bin/env python3
"""Reductions of non-compact (transposed, stepped) inputs through the C ABI, against
NumPy on the same views, in one run.

  NDX_LIBRARY=/path/to/libndx.so python3 scripts/bench_reduce_strided.py [--repeat R] [--filter S]

Each line is the best of R timed runs of ndx (SYNC_CPU through `ndx_invoke`, the
output released) and of NumPy; compare ratios within one run. Cases: sum, max,
argmax, prod, all over all axes and over axis 0 and axis 1 of a transposed
4096 x 4096 float32 (and int32, uint8), and of a stepped view [::2, ::3].
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))

import numpy as np  # noqa: E402

import ndx_ctypes as ndx  # noqa: E402


def best_s(fn, repeat):
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=10, help="timed runs per line (best is reported)")
    ap.add_argument("--filter", default="", help="only lines whose label contains this")
    opt = ap.parse_args()
    r = opt.repeat
    print(f"libndx {ndx.lib.ndx_version_string().decode()} from {ndx.LIBRARY_PATH}; {os.cpu_count()} cores; best of {r}")
    ctx = ndx.Context()
    sync = ndx.NDX_EVAL_SYNC_CPU
    rng = np.random.default_rng(0)

    def ndx_op(op, inputs, args=None):
        def run():
            f = ctx.invoke(op, inputs, sync, args=args)
            t = f.tensor()
            t.release()
            f.release()

        return run

    f32 = rng.random((4096, 4096), dtype=np.float32)
    bases = {
        "f32 T": f32.T,
        "i32 T": (f32 * 1000).astype(np.int32).T,
        "u8 T": (f32 * 255).astype(np.uint8).T,
        "f32 [::2,::3]": f32[::2, ::3],
    }
    ops = {
        "sum": (np.sum, "axes"),
        "max": (np.max, "axes"),
        "argmax": (np.argmax, "axis"),
        "prod": (np.prod, "axes"),
        "all": (np.all, "axes"),
    }
    print(f"{'operation':36} {'ndx ms':>9} {'numpy ms':>9} {'ndx/np':>7}")
    for bname, arr in bases.items():
        t = ndx.tensor_from_numpy(arr)
        for op, (npf, argname) in ops.items():
            for axis in [None, 0, 1]:
                label = f"{op} {bname} axis {axis}"
                if opt.filter not in label:
                    continue
                if argname == "axes":
                    args = None if axis is None else ndx.Args().set_int_array("axes", [axis])
                else:
                    args = None if axis is None else ndx.Args(axis=axis)
                t_ndx = best_s(ndx_op(op, [t], args), r)
                t_np = best_s(lambda: npf(arr, axis=axis), r)
                print(f"{label:36} {t_ndx * 1e3:9.2f} {t_np * 1e3:9.2f} {t_ndx / t_np:7.2f}", flush=True)


if __name__ == "__main__":
    main()
