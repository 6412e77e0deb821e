"""CUDA discovery through ctypes, on any machine: with no usable driver (CI) the
count is 0 and CUDA requests raise the CudaError subclass saying why; with a driver,
device ids past the count are refused. NDX_CUDA_DISABLE=1 hides a present driver.

Run: NDX_LIBRARY=/path/to/libndx.so python3 -m pytest -q tests/python/test_cuda.py
"""

import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ndx_ctypes as ndx  # noqa: E402


def device_check(i):
    try:
        ndx.check(ndx.lib.ndx_cuda_device_check(i))
    except ndx.NdxError as e:
        return e
    return None


def test_count_and_check_agree():
    n = ndx.lib.ndx_cuda_device_count()
    assert n >= 0
    if n == 0:
        e = device_check(0)
        assert e is not None and e.kind == ndx.NDX_ERROR_CUDA
        assert e.kind_name == "CudaError"
        assert any(
            why in e.message
            for why in ("libcuda.so could not be loaded", "cuInit failed", "NDX_CUDA_DISABLE")
        ), e.message
    else:
        assert device_check(n - 1) is None
        e = device_check(n)
        assert e.kind == ndx.NDX_ERROR_CUDA
        assert f"device {n} does not exist, {n} device" in e.message
    assert device_check(-1).kind == ndx.NDX_ERROR_CUDA


def test_disabled_by_the_environment():
    # A fresh process: the driver is looked for once, on the first CUDA question.
    code = (
        "import ndx_ctypes as ndx\n"
        "print(ndx.lib.ndx_cuda_device_count())\n"
        "try:\n"
        "    ndx.check(ndx.lib.ndx_cuda_device_check(0))\n"
        "except ndx.NdxError as e:\n"
        "    print(e.kind_name, e.message)\n"
    )
    env = dict(os.environ, NDX_CUDA_DISABLE="1", NDX_LIBRARY=os.path.abspath(ndx.library_path()))
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=os.path.dirname(os.path.abspath(__file__)),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "0",
        "CudaError CUDA is disabled by NDX_CUDA_DISABLE=1",
    ]


def test_the_import_stream_is_ignored_for_host_memory():
    np = pytest.importorskip("numpy")
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    for stream in (0x1234, ndx.STREAM_NO_SYNC, 0):
        t = ndx.tensor_from_numpy(a, stream=stream)
        out = ctypes.c_void_p()
        ndx.check(ndx.lib.ndx_tensor_to_dlpack_versioned_stream(t.ptr, 0x1234, ctypes.byref(out)))
        m = ndx.DLManagedTensorVersioned.from_address(out.value)
        got = np.ctypeslib.as_array(ctypes.cast(m.dl_tensor.data, ctypes.POINTER(ctypes.c_float)), (6,))
        assert got.tolist() == a.ravel().tolist()
        m.deleter(ctypes.pointer(m))
        del t


def test_exporting_null_raises_a_value_error():
    out = ctypes.c_void_p(7)
    with pytest.raises(ndx.NdxError) as e:
        ndx.check(ndx.lib.ndx_tensor_to_dlpack_versioned_stream(None, None, ctypes.byref(out)))
    assert e.value.kind == ndx.NDX_ERROR_VALUE
    assert "argument 'tensor' is NULL" in e.value.message
    assert out.value is None


def test_the_context_default_device_of_to_device():
    # A negative id is refused when the context is made; any other is checked by
    # to_device at invoke (contexts are made on machines without a GPU too).
    with pytest.raises(ndx.NdxError) as err:
        ndx.Context(cuda_device=-1)
    assert err.value.kind == ndx.NDX_ERROR_VALUE
    assert "opts->cuda_device is -1, not a CUDA device id (0 or more)" in err.value.message
    n = ndx.lib.ndx_cuda_device_count()
    ctx = ndx.Context(mode=ndx.NDX_EVAL_SYNC_CPU, cuda_device=n + 4)
    try:
        with pytest.raises(ndx.NdxError) as err:
            ctx.invoke("to_device", [ndx.tensor_from_numpy(np.ones(3, np.float32))])
        assert err.value.kind == ndx.NDX_ERROR_CUDA
        if n > 0:
            assert f"operator 'to_device': device {n + 4} does not exist" in err.value.message
    finally:
        ctx.release()
