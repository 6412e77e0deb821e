"""GPU benchmarks through the real C ABI (ctypes), for machines with a CUDA device:

1. elementwise `add` of float32 at N elements (default 256M) in SYNC_FULL mode, as a
   fraction of the bandwidth of a device-to-device copy measured in the same run
   (bytes moved: 3N*4 for the add, 2N*4 for the copy); goal >= 0.8;
2. bulk import of 1024 CUDA DLPack tensors as one batch (one event for the batch);
3. per-invocation overhead in EAGER mode with GPU work (a 1024-element add, waited
   for), next to the same add on host tensors in the same run; and per invocation of
   a chain of such adds, each reading the last one's output, waited for once at the
   end (GPU invocations are launched while their producers still run);
4. `to_device` of a 64 MiB host array in SYNC_FULL mode (staged through pinned
   blocks), next to the driver's own copies in the same run: `cuMemcpyHtoD` from the
   same pageable array and from page-locked memory.

Prints one JSON object. Needs numpy and tests/python/{ndx_ctypes,cuda_driver}.py.

    NDX_LIBRARY=target/release/libndx.so python3 benches/cuda_bench.py
    python3 benches/cuda_bench.py --elements 1000000 --repeat 5   # a quick look

On the emulated driver of tests/cuda_emu the figures mean nothing; the test suite
runs it there with tiny sizes only to keep it working.
"""

import argparse
import ctypes
import json
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
import cuda_driver as cd  # noqa: E402
import ndx_ctypes as ndx  # noqa: E402

F32 = (2, 32, 1)  # kDLFloat, 32 bits, 1 lane


class DeviceTensors:
    """Hand-made DLManagedTensorVersioned views of device memory; the deleter counts."""

    def __init__(self):
        self.deleted = 0
        self._keep = []
        self._deleter = ndx.DLManagedTensorVersionedDeleter(self._delete)

    def _delete(self, _ptr):
        self.deleted += 1

    def make(self, ptr: int, n: int) -> ctypes.c_void_p:
        m = ndx.DLManagedTensorVersioned()
        shape = (ctypes.c_int64 * 1)(n)
        m.version.major = 1
        m.deleter = self._deleter
        m.dl_tensor.data = ptr
        m.dl_tensor.device.device_type, m.dl_tensor.device.device_id = 2, 0
        m.dl_tensor.ndim = 1
        m.dl_tensor.dtype.code, m.dl_tensor.dtype.bits, m.dl_tensor.dtype.lanes = F32
        m.dl_tensor.shape = shape
        self._keep.append((m, shape))
        return ctypes.c_void_p(ctypes.addressof(m))


def import_one(maker: DeviceTensors, ptr: int, n: int) -> ndx.Tensor:
    opts = ndx.ndx_import_options_t(ctypes.sizeof(ndx.ndx_import_options_t), None, False, ndx.STREAM_NO_SYNC)
    out = ctypes.c_void_p()
    ndx.check(ndx.lib.ndx_tensor_from_dlpack_versioned(maker.make(ptr, n), ctypes.byref(opts), ctypes.byref(out)))
    return ndx.Tensor(out.value)


def timed(fn, repeat: int) -> list:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def bench_add_vs_copy(cu, n: int, repeat: int) -> dict:
    nbytes = 4 * n
    a = cu.upload(np.random.default_rng(0).standard_normal(n, dtype=np.float32))
    b = cu.upload(np.ones(n, np.float32))
    dst = cu.alloc(nbytes)
    cu.synchronize()

    def copy():
        cd._call("cuMemcpyDtoD_v2", cd._U64(dst.ptr), cd._U64(a.ptr), nbytes)
        cu.synchronize()

    copy()  # warm-up
    t_copy = min(timed(copy, repeat))
    maker = DeviceTensors()
    ta, tb = import_one(maker, a.ptr, n), import_one(maker, b.ptr, n)
    ctx = ndx.Context(mode=ndx.NDX_EVAL_SYNC_FULL)
    keep = []

    def add():
        f = ctx.invoke("add", [ta, tb])
        f.wait()
        keep.append(f)  # released after timing: its output block goes back to the pool
        if len(keep) > 1:
            keep.pop(0).release()

    add()  # warm-up: loads the module, fills the pool
    t_add = min(timed(add, repeat))
    # Correctness of what was timed: a sample of the last output.
    out = keep[-1].tensor()
    host = ctx.invoke("to_host", [out]).result()
    sample = cu.download(a, (n,), np.float32)[:: max(1, n // 4096)]
    assert np.array_equal(host[:: max(1, n // 4096)], sample + 1), "add gave wrong values"
    for x in keep + [out, ta, tb]:
        x.release()
    ctx.release()
    for buf in (a, b, dst):
        buf.free()
    copy_bw = 2 * nbytes / t_copy
    add_bw = 3 * nbytes / t_add
    return {
        "elements": n,
        "copy_ms": round(t_copy * 1e3, 3),
        "add_ms": round(t_add * 1e3, 3),
        "copy_GBps": round(copy_bw / 1e9, 1),
        "add_GBps": round(add_bw / 1e9, 1),
        "add_fraction_of_copy": round(add_bw / copy_bw, 3),
    }


def bench_bulk_import(cu, count: int, repeat: int) -> dict:
    n = 1024
    buf = cu.alloc(4 * n * count)
    maker = DeviceTensors()
    opts = ndx.ndx_import_options_t(ctypes.sizeof(ndx.ndx_import_options_t), None, False, None)
    lib = ndx.lib
    lib.ndx_batch_from_dlpack_versioned.restype = ctypes.c_void_p
    lib.ndx_batch_from_dlpack_versioned.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                                   ctypes.POINTER(ctypes.c_void_p)]
    lib.ndx_batch_release.argtypes = [ctypes.c_void_p]
    lib.ndx_batch_release.restype = None
    times = []
    for _ in range(repeat):
        arr = (ctypes.c_void_p * count)(*[maker.make(buf.ptr + 4 * n * i, n).value for i in range(count)])
        out = ctypes.c_void_p()
        t0 = time.perf_counter()
        ndx.check(lib.ndx_batch_from_dlpack_versioned(arr, count, ctypes.byref(opts), ctypes.byref(out)))
        times.append(time.perf_counter() - t0)
        lib.ndx_batch_release(out)
    assert maker.deleted == count * repeat, (maker.deleted, count * repeat)
    buf.free()
    best = min(times)
    return {"tensors": count, "import_us": round(best * 1e6, 1), "per_tensor_us": round(best * 1e6 / count, 3)}


def bench_eager_overhead(cu, iters: int) -> dict:
    n = 1024
    x = np.arange(n, dtype=np.float32)
    ctx = ndx.Context(mode=ndx.NDX_EVAL_EAGER)
    dev = ctx.invoke("to_device", [x]).tensor()
    host = ndx.tensor_from_numpy(x)

    def loop(t):
        ctx.invoke("add", [t, t]).wait()  # warm-up
        t0 = time.perf_counter()
        for _ in range(iters):
            ctx.invoke("add", [t, t]).wait()
        return (time.perf_counter() - t0) / iters

    def chain(t):
        t0 = time.perf_counter()
        f = ctx.invoke("add", [t, t])
        for _ in range(iters - 1):
            f = ctx.invoke("add", [f.tensor(), t])
        f.wait()
        return (time.perf_counter() - t0) / iters

    gpu = statistics.median([loop(dev) for _ in range(3)])
    cpu = statistics.median([loop(host) for _ in range(3)])
    gpu_chain = statistics.median([chain(dev) for _ in range(3)])
    cpu_chain = statistics.median([chain(host) for _ in range(3)])
    dev.release()
    host.release()
    ctx.release()
    return {"elements": n, "gpu_us_per_invocation": round(gpu * 1e6, 2),
            "cpu_us_per_invocation": round(cpu * 1e6, 2), "gpu_over_cpu": round(gpu / cpu, 2),
            "gpu_chain_us_per_invocation": round(gpu_chain * 1e6, 2),
            "cpu_chain_us_per_invocation": round(cpu_chain * 1e6, 2),
            "gpu_chain_over_cpu_chain": round(gpu_chain / cpu_chain, 2)}


def bench_upload(cu, n: int, repeat: int) -> dict:
    nbytes = 4 * n
    src = np.random.default_rng(1).standard_normal(n, dtype=np.float32)
    dst = cu.alloc(nbytes)
    ctx = ndx.Context(mode=ndx.NDX_EVAL_SYNC_FULL)

    def ndx_upload():
        ctx.invoke("to_device", [src]).release()

    def pageable():
        cu.htod(dst, src)

    pinned_ptr = ctypes.c_void_p()
    cd._call("cuMemHostAlloc", ctypes.byref(pinned_ptr), ctypes.c_size_t(nbytes), ctypes.c_uint(0))
    ctypes.memmove(pinned_ptr.value, src.ctypes.data, nbytes)

    def pinned():
        cd._call("cuMemcpyHtoD_v2", cd._U64(dst.ptr), ctypes.c_void_p(pinned_ptr.value), ctypes.c_size_t(nbytes))

    out = {"bytes": nbytes}
    for name, fn in (("ndx_to_device", ndx_upload), ("driver_pageable", pageable), ("driver_pinned", pinned)):
        fn()  # warm-up
        out[name + "_GBps"] = round(nbytes / min(timed(fn, repeat)) / 1e9, 2)
    got = ctx.invoke("to_host", [ctx.invoke("to_device", [src]).tensor()]).result()
    assert np.array_equal(got, src), "to_device gave wrong values"
    cd._call("cuMemFreeHost", ctypes.c_void_p(pinned_ptr.value))
    dst.free()
    ctx.release()
    out["ndx_over_pageable"] = round(out["ndx_to_device_GBps"] / out["driver_pageable_GBps"], 2)
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--elements", type=int, default=256 << 20)
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--tensors", type=int, default=1024)
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--upload-elements", type=int, default=16 << 20)
    a = p.parse_args(argv)
    if ndx.lib.ndx_cuda_device_count() == 0:
        sys.exit("no CUDA device: " + ndx.NdxError.from_ptr(ndx.lib.ndx_cuda_device_check(0)).message)
    cu = cd.Context()
    result = {
        "device": cu.name,
        "add_vs_copy": bench_add_vs_copy(cu, a.elements, a.repeat),
        "bulk_import": bench_bulk_import(cu, a.tensors, a.repeat),
        "eager_overhead": bench_eager_overhead(cu, a.iters),
        "upload": bench_upload(cu, a.upload_elements, a.repeat),
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
