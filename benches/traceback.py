"""Formatting the error of a long failed pipeline through the real C ABI (ctypes).

A `floordiv` by zero fails, then N-1 `neg` invocations each read the last one's output,
all enqueued at the same line of this script in EAGER mode with the NATIVE capture
policy, so every link of the final error's cause chain has a site whose native frames
(Python's interpreter, ctypes, libffi, libc) share their return addresses with the
others. Times `ndx_error_format` of that chain (the first call symbolises every
site), then a second, fresh chain made the same way, then formatting the first chain
again (sites already resolved). Prints one JSON object.

    NDX_LIBRARY=target/debug/libndx.so python3 benches/traceback.py --links 200

Needs numpy and tests/python/ndx_ctypes.py. Compare runs of the same build on the same
machine only: these machines are shared.
"""

import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
import ndx_ctypes as ndx  # noqa: E402


def failed_chain(ctx, links):
    """The owned `ndx_error_t*` of the last of `links` dependent invocations."""
    a = ndx.tensor_from_numpy(np.array([1, 2], dtype=np.int32))
    zero = ndx.tensor_from_numpy(np.array([1, 0], dtype=np.int32))
    futures = [ctx.invoke("floordiv", [a, zero])]
    for _ in range(links - 1):
        futures.append(ctx.invoke("neg", [futures[-1].tensor(0)]))
    last = futures[-1]
    while ndx.lib.ndx_future_poll(last.ptr) == ndx.NDX_FUTURE_PENDING:
        time.sleep(0.001)
    err = ndx.lib.ndx_future_error(last.ptr)
    assert err, "the pipeline did not fail"
    return err


def timed_format(err):
    t = time.perf_counter()
    text = ndx.format_error(err)
    return time.perf_counter() - t, text


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--links", type=int, default=200)
    p.add_argument("--depth", type=int, default=0, help="capture depth (0: default)")
    args = p.parse_args()
    ctx = ndx.Context(
        mode=ndx.NDX_EVAL_EAGER, capture=ndx.NDX_CAPTURE_NATIVE, depth=args.depth
    )
    first = failed_chain(ctx, args.links)
    first_s, text = timed_format(first)
    second = failed_chain(ctx, args.links)
    second_s, _ = timed_format(second)
    again_s, again = timed_format(first)
    assert again == text
    frames = ndx.lib.ndx_error_frame_count(first)
    for err in (first, second):
        ndx.lib.ndx_error_free(err)
    ctx.release()
    print(
        json.dumps(
            {
                "links": args.links,
                "native_frames_per_link": frames,
                "traceback_lines": text.count("\n"),
                "format_first_chain_s": round(first_s, 4),
                "format_second_chain_s": round(second_s, 4),
                "format_first_chain_again_s": round(again_s, 6),
                "first_chain_ms_per_link": round(first_s * 1e3 / args.links, 3),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
