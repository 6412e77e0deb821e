"""Out tensors (`ndx_invoke_options_t.outputs`) through the C ABI from Python: NumPy
arrays imported through DLPack receive the results without a copy back, in every
mode, for compact, strided and in-place outs and for every dtype of the elementwise
suite; mismatches are refused at `ndx_invoke` naming the out tensor; `batch_to_tensor`
stacks tensors into an out array.

Run: NDX_LIBRARY=/path/to/libndx.so python3 -m pytest -q tests/python/test_out.py
"""

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ndx_ctypes as ndx  # noqa: E402

MODES = {"SYNC_CPU": ndx.NDX_EVAL_SYNC_CPU, "DEFERRED": ndx.NDX_EVAL_DEFERRED, "EAGER": ndx.NDX_EVAL_EAGER}
DTYPES = ["int8", "uint8", "int16", "int32", "int64", "uint64", "float16", "float32", "float64"]


@pytest.fixture
def ctx(make_context):
    return make_context(ndx.NDX_EVAL_EAGER, False)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_results_land_in_the_numpy_array(make_context, mode, dtype):
    c = make_context(MODES[mode], False)
    rng = np.random.default_rng(7)
    a = rng.integers(0, 50, (3, 5)).astype(dtype)
    b = rng.integers(1, 50, (5,)).astype(dtype)
    out = np.zeros((3, 5), dtype)
    f = c.invoke("add", [a, b], out=[out])
    f.wait()
    np.testing.assert_array_equal(out, np.add(a, b))
    np.testing.assert_array_equal(f.result(), out)


def test_a_strided_column_and_a_reversed_view(ctx):
    grid = np.zeros((4, 3), np.float32)
    x = np.arange(4, dtype=np.float32)
    ctx.invoke("sqrt", [x], out=[grid[:, 1]]).wait()
    np.testing.assert_array_equal(grid[:, 1], np.sqrt(x))
    assert not grid[:, 0].any() and not grid[:, 2].any(), "only the column is written"
    rev = np.zeros(4, np.float32)
    ctx.invoke("neg", [x], out=[rev[::-1]]).wait()
    np.testing.assert_array_equal(rev, -x[::-1])


def test_in_place_over_an_input(ctx):
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    want = x[::-1] * x
    ctx.invoke("mul", [x[::-1], x], out=[x]).wait()
    np.testing.assert_array_equal(x, want)


def test_reductions_casts_and_images_write_their_outs(ctx):
    m = np.arange(12, dtype=np.float64).reshape(3, 4)
    sums = np.zeros(4, np.float64)
    ctx.invoke("sum", [m], args={"axes": [0]}, out=[sums]).wait()
    np.testing.assert_array_equal(sums, m.sum(axis=0))
    as_u8 = np.zeros((3, 4), np.uint8)
    ctx.invoke("cast", [m], args=ndx.Args().set_dtype("dtype", ndx.NDX_DTYPE_UINT8), out=[as_u8]).wait()
    np.testing.assert_array_equal(as_u8, m.astype(np.uint8))
    img = (np.arange(4 * 6 * 3) % 251).astype(np.uint8).reshape(4, 6, 3)
    norm = np.zeros((4, 6, 3), np.float32)
    t = ndx.tensor_from_numpy(img, layout="HWC")
    ctx.invoke("normalize", [t], args={"mean": [1.0], "std": [2.0]}, out=[norm]).wait()
    np.testing.assert_allclose(norm, (img.astype(np.float64) - 1.0) / 2.0, rtol=1e-6)


def test_batch_to_tensor_into_an_out_array(ctx):
    rows = [np.full(3, i, np.float32) for i in range(4)]
    out = np.zeros((4, 3), np.float32)
    f = ctx.invoke("batch_to_tensor", rows, out=[out])
    f.wait()
    np.testing.assert_array_equal(out, np.stack(rows))
    with pytest.raises(ndx.NdxError, match=r"sample 2 has shape \[2\], sample 0 has shape \[3\]"):
        ctx.invoke("batch_to_tensor", [rows[0], rows[1], np.zeros(2, np.float32)])


@pytest.mark.parametrize(
    "out, fragment",
    [
        (np.zeros((2, 3), np.float64), r"outputs\[0\] is float64 \[2, 3\], expected float32 \[2, 3\]"),
        (np.zeros((3, 2), np.float32), r"outputs\[0\] is float32 \[3, 2\], expected float32 \[2, 3\]"),
        (np.broadcast_to(np.zeros(3, np.float32), (2, 3)), r"outputs\[0\] is read-only"),
        (
            np.lib.stride_tricks.as_strided(np.zeros(3, np.float32), (2, 3), (4, 4)),
            r"outputs\[0\] has strides \[1, 1\] for shape \[2, 3\]",
        ),
    ],
)
def test_mismatches_are_refused_at_invoke(ctx, out, fragment):
    a = np.ones((2, 3), np.float32)
    before = np.array(out, copy=True)
    with pytest.raises(ndx.NdxError, match=fragment):
        ctx.invoke("add", [a, a], out=[out])
    np.testing.assert_array_equal(out, before)


def test_a_read_only_array_is_refused(ctx):
    a = np.ones(3, np.float32)
    out = np.zeros(3, np.float32)
    out.flags.writeable = False
    with pytest.raises(ndx.NdxError, match=r"outputs\[0\] is read-only"):
        ctx.invoke("neg", [a], out=[out])
