"""CUDA DLPack interop with PyTorch and CuPy through ctypes: their CUDA tensors into
ndx (with their stream), ndx's results back (ordered on the consumer's stream), a
spinning producer kernel with a negative control, and a bulk import refusing a sample
on another device.

Needs a GPU and the frameworks (the lent GPU machines have PyTorch and CuPy); skips
elsewhere, saying why. Run:

    NDX_LIBRARY=/path/to/libndx.so python3 -m pytest -q tests/python/test_cuda_interop.py
"""

import ctypes
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ndx_ctypes as ndx  # noqa: E402

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype = ctypes.py_object
_new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


@pytest.fixture(scope="module", autouse=True)
def need_gpu():
    if ndx.lib.ndx_cuda_device_count() == 0 or not torch.cuda.is_available():
        why = "no CUDA device for ndx and PyTorch"
        if os.environ.get("NDX_REQUIRE_CUDA") == "1":
            pytest.fail(why + " (NDX_REQUIRE_CUDA=1)")
        pytest.skip(why)


@pytest.fixture
def ctx():
    c = ndx.Context(mode=ndx.NDX_EVAL_EAGER)
    yield c
    c.release()


def raw_stream(stream):
    """The `CUstream` a Python `__dlpack__(stream=...)` integer stands for (the
    translation the design leaves to bindings): None and 1 are the legacy default
    stream, 2 the per-thread default stream, -1 "do not order"."""
    if stream is None or stream == 1:
        return None
    if stream == -1:
        return ndx.STREAM_NO_SYNC
    return stream


class Exported:
    """An ndx tensor offered to a framework through the DLPack protocol."""

    def __init__(self, tensor):
        self.tensor = tensor

    def __dlpack_device__(self):
        return self.tensor.device

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        out = ctypes.c_void_p()
        if max_version is not None and max_version[0] >= 1:
            ndx.check(ndx.lib.ndx_tensor_to_dlpack_versioned_stream(self.tensor.ptr, raw_stream(stream),
                                                                    ctypes.byref(out)))
            return _new_capsule(out.value, b"dltensor_versioned", None)
        # Legacy consumers: the legacy default stream is ordered (the only one the
        # legacy export knows); a consumer on another stream must sync itself.
        ndx.lib.ndx_tensor_to_dlpack.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
        ndx.lib.ndx_tensor_to_dlpack.restype = ctypes.c_void_p
        ndx.check(ndx.lib.ndx_tensor_to_dlpack(self.tensor.ptr, ctypes.byref(out)))
        return _new_capsule(out.value, b"dltensor", None)


def from_torch(x, stream=None):
    s = torch.cuda.current_stream() if stream is None else stream
    try:
        capsule = x.__dlpack__(max_version=(1, 0))
    except TypeError:
        capsule = x.__dlpack__()
    return ndx.dlpack_import(capsule, stream=s.cuda_stream)


def test_a_torch_tensor_round_trips_through_ndx_without_copies(ctx):
    x = torch.arange(100_000, dtype=torch.float32, device="cuda") * 0.5
    t = from_torch(x)
    assert t.device == (2, x.device.index or 0)
    y = ctx.invoke("add", [t, t]).tensor()
    z = torch.from_dlpack(Exported(y))
    assert z.device.type == "cuda" and z.dtype == torch.float32
    assert torch.equal(z, x * 2)
    # The same memory: writing through torch is seen by ndx.
    z.fill_(7.0)
    torch.cuda.synchronize()
    assert float(ctx.invoke("to_host", [y]).result()[12345]) == 7.0


def test_a_cupy_array_round_trips_through_ndx():
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
    c = ndx.Context(mode=ndx.NDX_EVAL_SYNC_CPU)
    a = cupy.arange(4096, dtype=cupy.float16).reshape(64, 64)
    stream = cupy.cuda.get_current_stream()
    t = ndx.dlpack_import(a.__dlpack__(), stream=stream.ptr or None)
    s = c.invoke("sum", [t], args={"axes": [1]}).tensor()
    back = cupy.from_dlpack(Exported(s))
    want = a.astype(cupy.float64).sum(axis=1).astype(cupy.float16)
    np.testing.assert_array_equal(cupy.asnumpy(back), cupy.asnumpy(want))
    c.release()


@pytest.mark.parametrize("order", [True, False], ids=["with_the_producer_stream", "negative_control"])
def test_a_spinning_producer_is_waited_for(ctx, order):
    # The producer's stream spins for ~0.5 s, then fills the tensor. Imported with that
    # stream, ndx's read waits for the fill; imported with NDX_STREAM_NO_SYNC it reads
    # the zeros that were there: the control proves the ordering is what made the
    # first read right.
    producer = torch.cuda.Stream()
    x = torch.zeros(1 << 20, dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(producer):
        torch.cuda._sleep(int(1e9))
        x.fill_(42.0)
    capsule = x.__dlpack__()
    t = ndx.dlpack_import(capsule, stream=producer.cuda_stream if order else ndx.STREAM_NO_SYNC)
    got = ctx.invoke("to_host", [t]).result()
    producer.synchronize()
    if order:
        assert (got == 42.0).all()
    else:
        assert (got == 0.0).all(), "the unordered read should have come before the producer's fill"


def test_a_bulk_import_names_the_sample_on_another_device():
    n = torch.cuda.device_count()
    xs = [torch.full((8,), float(i), device="cuda:0") for i in range(3)]
    keep, deleted = [], []
    deleter = ndx.DLManagedTensorVersionedDeleter(lambda p: deleted.append(1))
    shape = (ctypes.c_int64 * 1)(8)
    arr = (ctypes.c_void_p * 3)()
    for i, x in enumerate(xs):
        m = ndx.DLManagedTensorVersioned()
        m.version.major = 1
        m.deleter = deleter
        m.dl_tensor.data = x.data_ptr()
        # Sample 2 claims the next device (which may not exist: the id check comes first).
        m.dl_tensor.device.device_type, m.dl_tensor.device.device_id = 2, (1 if i == 2 else 0)
        m.dl_tensor.ndim = 1
        m.dl_tensor.dtype.code, m.dl_tensor.dtype.bits, m.dl_tensor.dtype.lanes = 2, 32, 1
        m.dl_tensor.shape = shape
        keep.append(m)
        arr[i] = ctypes.addressof(m)
    ndx.lib.ndx_batch_from_dlpack_versioned.restype = ctypes.c_void_p
    ndx.lib.ndx_batch_from_dlpack_versioned.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                                       ctypes.POINTER(ctypes.c_void_p)]
    out = ctypes.c_void_p()
    err = ndx.lib.ndx_batch_from_dlpack_versioned(arr, 3, None, ctypes.byref(out))
    assert err, f"a batch spanning devices was accepted ({n} device(s))"
    e = ndx.NdxError.from_ptr(err)
    assert e.kind == ndx.NDX_ERROR_VALUE and "tensors[2]" in e.message, e.message
    assert not out.value and not deleted, "nothing taken on failure"
