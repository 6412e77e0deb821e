#!/usr/bin/env python3
"""Operator speed through the C ABI, against references on the same machine, in one run.

  NDX_LIBRARY=/path/to/libndx.so python3 scripts/bench_ops.py [--repeat R]

Each line is the best of R timed runs (the machines are shared and noisy: compare the
ratios within one run, not figures across runs). ndx runs each operator SYNC_CPU
through `ndx_invoke`, reads nothing back, and releases the output (its buffer goes
back to ndx's cache, so a steady-state pipeline takes no fresh pages).

  add   float32, 16M elements: ndx `add` vs `memcpy` of one operand's bytes
        (`np.copyto`: 64 MiB read + 64 MiB written) as bandwidth (add moves 192 MiB,
        memcpy 128 MiB; goal >= 0.7 of memcpy's bytes per second), and vs
        `np.add(a, b, out=c)` (goal >= 1.0x NumPy's speed); then the same with an out
        tensor (ndx writes into `c` too), and with one input a transposed view (read
        in place through its strides, no compaction) against NumPy on the same views.
  sum   float32, 16M elements to a scalar: ndx `sum` vs `np.sum` (ndx accumulates in
        float64, NumPy pairwise in float32).
  sum, max, min over axis 0 of the float32 as 4096 x 4096 (each output a column),
        and max, argmax of all 16M: vs `np.sum(axis=0)` / `np.max` / `np.min` /
        `np.argmax`.
  lt, add with a broadcast row, float32 4096 x 4096: vs `np.less` / `np.add` of the
        same operands.
  clamp, round, floor, ceil, sqrt, float32 16M: vs `np.clip` / `np.round` / `np.floor`
        / `np.ceil` / `np.sqrt`.
  sum and cast to float16 of a transposed float32 4096 x 4096 view: vs `np.sum`
        (which sums in memory order, no copy) / `np.ascontiguousarray(..., float16)`.
  flip, transpose, pad, stack, concat, cast (f16, bf16 with ml_dtypes, u8, i16, i32;
        float64 to i32) and mixed-dtype add of float32 1024 x 1024: vs NumPy's
        copies, `np.pad`, `np.stack`, `np.concatenate`, `astype` and `np.add`;
        round, sqrt and neg of float16 1024 x 1024 vs `np.round` / `np.sqrt` /
        `np.negative`.
  cast float64 to int64, float32 to int64, float32 (x 1000, mostly out of range) to
        int8: vs `astype` (NumPy's out-of-range results are unspecified; ndx saturates).
  add, lt of stepped views with gaps (every 2nd / 4th column, every 2nd row and
        column): vs `np.add` / `np.less` of the same views.
  --filter TEXT runs only the lines (after the first four) whose label contains TEXT.
  resize uint8 1080x1920x3 -> 224x224, linear: ndx `resize` vs OpenCV's
        `cv2.resize(..., INTER_LINEAR)` with OpenCV's default threads (the values
        are equal bit for bit; tests/python/test_ops_image.py checks them).
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))

import numpy as np  # noqa: E402

import ndx_ctypes as ndx  # noqa: E402


def best_s(fn, repeat):
    fn()  # warm: caches, pages, the pool
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=20, help="timed runs per line (best is reported)")
    ap.add_argument(
        "--filter", default="", help="only the lines whose label contains this text (the first four lines always run)"
    )
    opt = ap.parse_args()
    r = opt.repeat
    try:
        import cv2
    except ImportError:
        cv2 = None

    print(f"libndx {ndx.lib.ndx_version_string().decode()} from {ndx.LIBRARY_PATH}")
    print(
        f"python {sys.version.split()[0]}, numpy {np.__version__}, "
        f"opencv {cv2.__version__ if cv2 else 'absent'}; {os.cpu_count()} cores; best of {r}"
    )
    ctx = ndx.Context()
    sync = ndx.NDX_EVAL_SYNC_CPU
    rng = np.random.default_rng(0)

    def ndx_op(op, inputs, args=None, out=None):
        def run():
            f = ctx.invoke(op, inputs, sync, args=args, out=out)
            t = f.tensor()
            t.release()
            f.release()

        return run

    n = 16 << 20
    a = rng.random(n, dtype=np.float32)
    b = rng.random(n, dtype=np.float32)
    c = np.empty_like(a)
    ta, tb = ndx.tensor_from_numpy(a), ndx.tensor_from_numpy(b)
    mib = a.nbytes / 2**20

    t_add = best_s(ndx_op("add", [ta, tb]), r)
    t_copy = best_s(lambda: np.copyto(c, a), r)
    t_npadd = best_s(lambda: np.add(a, b, out=c), r)
    bw_add = 3 * mib / 1024 / t_add
    bw_copy = 2 * mib / 1024 / t_copy
    print(f"{'operation':44} {'ndx':>10} {'reference':>10} {'ratio':>8}")
    print(f"{'add f32 16M: GiB/s vs memcpy GiB/s':44} {bw_add:10.1f} {bw_copy:10.1f} {bw_add / bw_copy:8.2f}")
    print(f"{'add f32 16M: ms vs np.add(out=) ms':44} {t_add * 1e3:10.2f} {t_npadd * 1e3:10.2f} {t_npadd / t_add:8.2f}")

    tc = ndx.tensor_from_numpy(c)
    t_add_out = best_s(ndx_op("add", [ta, tb], out=[tc]), r)
    print(f"{'add f32 16M into an out tensor: ms vs np.add':44} {t_add_out * 1e3:10.2f} {t_npadd * 1e3:10.2f} {t_npadd / t_add_out:8.2f}")
    a2, b2 = a.reshape(4096, 4096), b.reshape(4096, 4096)
    c2 = c.reshape(4096, 4096)
    t_strided = best_s(ndx_op("add", [ndx.tensor_from_numpy(a2.T), ndx.tensor_from_numpy(b2)], out=[c2]), r)
    t_npstrided = best_s(lambda: np.add(a2.T, b2, out=c2), r)
    print(f"{'add f32 4096^2, one input transposed: ms':44} {t_strided * 1e3:10.2f} {t_npstrided * 1e3:10.2f} {t_npstrided / t_strided:8.2f}")

    t_sum = best_s(ndx_op("sum", [ta]), r)
    t_npsum = best_s(lambda: np.sum(a), r)
    print(f"{'sum f32 16M: ms vs np.sum ms':44} {t_sum * 1e3:10.2f} {t_npsum * 1e3:10.2f} {t_npsum / t_sum:8.2f}")

    ta2 = ndx.tensor_from_numpy(a2)
    axis0 = ndx.Args().set_int_array("axes", [0])
    for label, run_ndx, run_np in [
        ("sum f32 4096^2 over axis 0", ndx_op("sum", [ta2], axis0), lambda: np.sum(a2, axis=0)),
        ("max f32 4096^2 over axis 0", ndx_op("max", [ta2], axis0), lambda: np.max(a2, axis=0)),
        ("min f32 4096^2 over axis 0", ndx_op("min", [ta2], axis0), lambda: np.min(a2, axis=0)),
        ("max f32 16M", ndx_op("max", [ta]), lambda: np.max(a)),
        ("argmax f32 16M", ndx_op("argmax", [ta]), lambda: np.argmax(a)),
        ("lt f32 4096^2", ndx_op("lt", [ta2, ndx.tensor_from_numpy(b2)]), lambda: np.less(a2, b2)),
        ("add f32 4096^2 + a row", ndx_op("add", [ta2, ndx.tensor_from_numpy(b2[0])]), lambda: np.add(a2, b2[0])),
        ("clamp f32 16M", ndx_op("clamp", [ta], ndx.Args(lo=0.25, hi=0.75)), lambda: np.clip(a, 0.25, 0.75)),
        ("round f32 16M", ndx_op("round", [ta]), lambda: np.round(a)),
        ("floor f32 16M", ndx_op("floor", [ta]), lambda: np.floor(a)),
        ("ceil f32 16M", ndx_op("ceil", [ta]), lambda: np.ceil(a)),
        ("sqrt f32 16M", ndx_op("sqrt", [ta]), lambda: np.sqrt(a)),
        # A transposed input: ndx compacts it (in tiles) before reducing or casting.
        ("sum f32 4096^2 transposed", ndx_op("sum", [ndx.tensor_from_numpy(a2.T)]),
         lambda: np.sum(a2.T)),
        ("cast f32 4096^2 T -> f16",
         ndx_op("cast", [ndx.tensor_from_numpy(a2.T)], ndx.Args().set_dtype("dtype", ndx.NDX_DTYPE_FLOAT16)),
         lambda: np.ascontiguousarray(a2.T, dtype=np.float16)),
    ]:
        if opt.filter not in label:
            continue
        t_ndx, t_np = best_s(run_ndx, r), best_s(run_np, r)
        print(f"{label + ': ms vs NumPy ms':44} {t_ndx * 1e3:10.2f} {t_np * 1e3:10.2f} {t_np / t_ndx:8.2f}")

    # Copies, joins and casts of float32 1024 x 1024 (three inputs to join).
    m = [rng.standard_normal((1024, 1024), dtype=np.float32) for _ in range(3)]
    tm = [ndx.tensor_from_numpy(x) for x in m]
    i32 = rng.integers(-1000, 1000, (1024, 1024), dtype=np.int32)
    f16 = m[1].astype(np.float16)
    f64 = m[2].astype(np.float64)
    ti32, tf16, tf64 = ndx.tensor_from_numpy(i32), ndx.tensor_from_numpy(f16), ndx.tensor_from_numpy(f64)
    f16abs = np.abs(f16)
    tf16abs = ndx.tensor_from_numpy(f16abs)
    big = m[0] * 1e3
    tbig = ndx.tensor_from_numpy(big)
    # Stepped views with gaps: every 2nd (4th) column, every 2nd row and column.
    wide = [rng.standard_normal((1024, 4096), dtype=np.float32) for _ in range(2)]
    sa, sb = wide[0][:, :2048][:, ::2], wide[1][:, :2048][:, ::2]
    qa, qb = wide[0][:, ::4], wide[1][:, ::4]
    da, db = wide[0].astype(np.float64)[:, :2048][:, ::2], wide[1].astype(np.float64)[:, :2048][:, ::2]
    ea, eb = wide[0].reshape(2048, 2048)[::2, ::2], wide[1].reshape(2048, 2048)[::2, ::2]
    tsa, tsb, tqa, tqb = (ndx.tensor_from_numpy(x) for x in (sa, sb, qa, qb))
    tda, tdb, tea, teb = (ndx.tensor_from_numpy(x) for x in (da, db, ea, eb))
    cases = [
        ("flip f32 1024^2 axis 1", ndx_op("flip", tm[:1], ndx.Args().set_int_array("axes", [1])), lambda: np.flip(m[0], 1).copy()),
        ("transpose f32 1024^2", ndx_op("transpose", tm[:1]), lambda: m[0].T.copy()),
        ("pad f32 1024^2 by 1", ndx_op("pad", tm[:1], ndx.Args().set_int_array("widths", [1, 1, 1, 1])), lambda: np.pad(m[0], 1)),
        ("stack 3 f32 1024^2 axis 2", ndx_op("stack", tm, ndx.Args().set_int("axis", 2)), lambda: np.stack(m, axis=2)),
        ("stack 3 f32 1024^2 axis 0", ndx_op("stack", tm, ndx.Args().set_int("axis", 0)), lambda: np.stack(m, axis=0)),
        ("concat 3 f32 1024^2 axis 1", ndx_op("concat", tm, ndx.Args().set_int("axis", 1)), lambda: np.concatenate(m, axis=1)),
        ("cast f32 1024^2 -> f16", ndx_op("cast", tm[:1], ndx.Args().set_dtype("dtype", ndx.NDX_DTYPE_FLOAT16)), lambda: m[0].astype(np.float16)),
        ("cast f16 1024^2 -> f32", ndx_op("cast", [tf16], ndx.Args().set_dtype("dtype", ndx.NDX_DTYPE_FLOAT32)), lambda: f16.astype(np.float32)),
        ("cast f32 1024^2 -> u8", ndx_op("cast", tm[:1], ndx.Args().set_dtype("dtype", ndx.NDX_DTYPE_UINT8)), lambda: m[0].astype(np.uint8)),
        ("cast f32 1024^2 -> i16", ndx_op("cast", tm[:1], ndx.Args().set_dtype("dtype", ndx.NDX_DTYPE_INT16)), lambda: m[0].astype(np.int16)),
        ("cast f32 1024^2 -> i32", ndx_op("cast", tm[:1], ndx.Args().set_dtype("dtype", ndx.NDX_DTYPE_INT32)), lambda: m[0].astype(np.int32)),
        ("cast f64 1024^2 -> i32", ndx_op("cast", [tf64], ndx.Args().set_dtype("dtype", ndx.NDX_DTYPE_INT32)), lambda: f64.astype(np.int32)),
        ("cast f64 1024^2 -> i64", ndx_op("cast", [tf64], ndx.Args().set_dtype("dtype", ndx.NDX_DTYPE_INT64)), lambda: f64.astype(np.int64)),
        ("cast f32 1024^2 -> i64", ndx_op("cast", tm[:1], ndx.Args().set_dtype("dtype", ndx.NDX_DTYPE_INT64)), lambda: m[0].astype(np.int64)),
        ("cast f32 1024^2 * 1e3 -> i8 (saturating)", ndx_op("cast", [tbig], ndx.Args().set_dtype("dtype", ndx.NDX_DTYPE_INT8)),
         lambda: big.astype(np.int8)),
        ("add f32 1024x2048[:, ::2] + same", ndx_op("add", [tsa, tsb]), lambda: np.add(sa, sb)),
        ("add f32 1024x4096[:, ::4] + same", ndx_op("add", [tqa, tqb]), lambda: np.add(qa, qb)),
        ("add f64 1024x2048[:, ::2] + same", ndx_op("add", [tda, tdb]), lambda: np.add(da, db)),
        ("lt f32 1024x2048[:, ::2] + same", ndx_op("lt", [tsa, tsb]), lambda: np.less(sa, sb)),
        ("add f32 2048^2[::2, ::2] + same", ndx_op("add", [tea, teb]), lambda: np.add(ea, eb)),
        ("add f32 + i32 1024^2", ndx_op("add", [tm[0], ti32]), lambda: np.add(m[0], i32)),
        ("add f32 + f16 1024^2", ndx_op("add", [tm[0], tf16]), lambda: np.add(m[0], f16)),
        ("round f16 1024^2", ndx_op("round", [tf16]), lambda: np.round(f16)),
        ("sqrt f16 1024^2 (of |x|)", ndx_op("sqrt", [tf16abs]), lambda: np.sqrt(f16abs)),
        ("neg f16 1024^2", ndx_op("neg", [tf16]), lambda: np.negative(f16)),
    ]
    try:
        import ml_dtypes

        bf = m[0].astype(ml_dtypes.bfloat16)
        tbf = ndx.tensor_from_host(bf.view(np.uint16), ndx.NDX_DTYPE_BFLOAT16)
        cases += [
            ("cast f32 1024^2 -> bf16", ndx_op("cast", tm[:1], ndx.Args().set_dtype("dtype", ndx.NDX_DTYPE_BFLOAT16)), lambda: m[0].astype(ml_dtypes.bfloat16)),
            ("cast bf16 1024^2 -> f32", ndx_op("cast", [tbf], ndx.Args().set_dtype("dtype", ndx.NDX_DTYPE_FLOAT32)), lambda: bf.astype(np.float32)),
        ]
    except ImportError:
        pass
    for label, run_ndx, run_np in cases:
        if opt.filter not in label:
            continue
        t_ndx, t_np = best_s(run_ndx, r), best_s(run_np, r)
        print(f"{label + ': ms vs NumPy ms':44} {t_ndx * 1e3:10.2f} {t_np * 1e3:10.2f} {t_np / t_ndx:8.2f}")

    img = rng.integers(0, 256, (1080, 1920, 3), dtype=np.uint8)
    timg = ndx.tensor_from_numpy(img, layout="HWC")
    args = ndx.Args().set_int("h", 224).set_int("w", 224)
    t_resize = best_s(ndx_op("resize", [timg], args), r)
    if cv2 is not None:
        t_cv = best_s(lambda: cv2.resize(img, (224, 224), interpolation=cv2.INTER_LINEAR), r)
        print(
            f"{'resize u8 1080p->224 linear: us vs cv2 us':44} {t_resize * 1e6:10.1f} "
            f"{t_cv * 1e6:10.1f} {t_cv / t_resize:8.2f}"
        )
    else:
        print(f"{'resize u8 1080p->224 linear: us (no cv2)':44} {t_resize * 1e6:10.1f}")
    print("ratio: reference time / ndx time (bandwidth: ndx / memcpy); above 1 is ndx faster")


if __name__ == "__main__":
    main()
