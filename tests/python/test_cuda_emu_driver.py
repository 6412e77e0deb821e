"""The emulated CUDA driver (tests/cuda_emu) itself: that the committed PTX kernels
run through it exactly as on a GPU, and that its error paths, sticky faults and
asynchronous mode behave as its header comment says.

Everything runs in subprocesses with LD_LIBRARY_PATH pointing at the emulation
(tests/python/cuda_emu.py explains why). The scripts drive libcuda.so.1 with raw
ctypes calls (PRELUDE) so that every return code can be checked. No GPU needed; skips
without g++.

Run: python3 -m pytest -q tests/python/test_cuda_emu_driver.py
"""

from __future__ import annotations

import os
import re
import sys
import textwrap

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cuda_emu  # noqa: E402

# Shared by the scripts: the driver with argtypes, a current primary context, and
# helpers. `ok` asserts CUDA_SUCCESS; the raw functions return the CUresult.
PRELUDE = r'''
import ctypes, time
import numpy as np

P, U64, SZ, UI, I = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int
cu = ctypes.CDLL("libcuda.so.1")
PROTOS = {
    "cuInit": [UI], "cuDriverGetVersion": [ctypes.POINTER(I)],
    "cuGetErrorName": [I, ctypes.POINTER(ctypes.c_char_p)],
    "cuGetErrorString": [I, ctypes.POINTER(ctypes.c_char_p)],
    "cuDeviceGetCount": [ctypes.POINTER(I)], "cuDeviceGet": [ctypes.POINTER(I), I],
    "cuDeviceGetName": [ctypes.c_char_p, I, I], "cuDeviceGetAttribute": [ctypes.POINTER(I), I, I],
    "cuDeviceTotalMem_v2": [ctypes.POINTER(SZ), I],
    "cuDevicePrimaryCtxRetain": [ctypes.POINTER(P), I], "cuDevicePrimaryCtxRelease_v2": [I],
    "cuDevicePrimaryCtxReset_v2": [I],
    "cuCtxSetCurrent": [P], "cuCtxGetCurrent": [ctypes.POINTER(P)], "cuCtxSynchronize": [],
    "cuMemAlloc_v2": [ctypes.POINTER(U64), SZ], "cuMemFree_v2": [U64],
    "cuMemAllocAsync": [ctypes.POINTER(U64), SZ, P], "cuMemFreeAsync": [U64, P],
    "cuMemGetInfo_v2": [ctypes.POINTER(SZ), ctypes.POINTER(SZ)],
    "cuMemHostAlloc": [ctypes.POINTER(P), SZ, UI], "cuMemFreeHost": [P],
    "cuMemHostGetDevicePointer_v2": [ctypes.POINTER(U64), P, UI],
    "cuMemcpyHtoD_v2": [U64, P, SZ], "cuMemcpyDtoH_v2": [P, U64, SZ], "cuMemcpyDtoD_v2": [U64, U64, SZ],
    "cuMemcpyHtoDAsync_v2": [U64, P, SZ, P], "cuMemcpyDtoHAsync_v2": [P, U64, SZ, P],
    "cuMemsetD8_v2": [U64, ctypes.c_ubyte, SZ], "cuMemsetD32_v2": [U64, UI, SZ],
    "cuMemsetD32Async": [U64, UI, SZ, P],
    "cuStreamCreate": [ctypes.POINTER(P), UI], "cuStreamDestroy_v2": [P],
    "cuStreamSynchronize": [P], "cuStreamQuery": [P], "cuStreamWaitEvent": [P, P, UI],
    "cuStreamWriteValue64": [P, U64, U64, UI], "cuStreamWriteValue32_v2": [P, U64, UI, UI],
    "cuEventCreate": [ctypes.POINTER(P), UI], "cuEventDestroy_v2": [P], "cuEventRecord": [P, P],
    "cuEventQuery": [P], "cuEventSynchronize": [P],
    "cuEventElapsedTime": [ctypes.POINTER(ctypes.c_float), P, P],
    "cuModuleLoadData": [ctypes.POINTER(P), P], "cuModuleUnload": [P],
    "cuModuleGetFunction": [ctypes.POINTER(P), P, ctypes.c_char_p],
    "cuLaunchKernel": [P, UI, UI, UI, UI, UI, UI, UI, P, ctypes.POINTER(P), ctypes.POINTER(P)],
}
for _n, _a in PROTOS.items():
    getattr(cu, _n).argtypes, getattr(cu, _n).restype = _a, I
cu.ndx_emu_launch_count.restype, cu.ndx_emu_launch_count.argtypes = U64, []
cu.ndx_emu_reset.restype, cu.ndx_emu_reset.argtypes = None, []

def ok(rc, what=""):
    assert rc == 0, f"{what}: CUresult {rc}"

def out(ctype, fn, *args):
    v = ctype()
    ok(fn(ctypes.byref(v), *args), fn.__name__)
    return v.value

def init():
    ok(cu.cuInit(0), "cuInit")
    ctx = out(P, cu.cuDevicePrimaryCtxRetain, 0)
    ok(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return ctx

def alloc(nbytes):
    return out(U64, cu.cuMemAlloc_v2, nbytes)

def upload(a):
    a = np.ascontiguousarray(a)
    d = alloc(a.nbytes)
    ok(cu.cuMemcpyHtoD_v2(d, a.ctypes.data, a.nbytes), "htod")
    return d

def download(d, n, dtype):
    a = np.empty(n, dtype)
    ok(cu.cuMemcpyDtoH_v2(a.ctypes.data, d, a.nbytes), "dtoh")
    return a

def peek(d, n, dtype):
    """Reads emulated device memory directly (it is host memory), bypassing the
    driver, e.g. once the context is faulted."""
    return np.frombuffer((ctypes.c_char * (n * np.dtype(dtype).itemsize)).from_address(d), dtype).copy()

def load(module):
    text = open(f"src/cuda/ptx/{module}.ptx", "rb").read() + b"\0"
    return out(P, cu.cuModuleLoadData, text)

def function(mod, name):
    return out(P, cu.cuModuleGetFunction, mod, name.encode())

def stream(flags=0):
    return out(P, cu.cuStreamCreate, flags)

def event(flags=0):
    return out(P, cu.cuEventCreate, flags)

def launch(f, grid, block, args, s=None, **kw):
    """cuLaunchKernel with u64 arguments (pointers and sizes); returns the CUresult."""
    vals = [U64(a) for a in args]
    arr = (P * max(1, len(vals)))(*[ctypes.addressof(v) for v in vals])
    dims = kw.get("dims", (grid, 1, 1, block, 1, 1))
    return cu.cuLaunchKernel(f, *dims, kw.get("shmem", 0), s, arr, kw.get("extra"))

def error_name(code):
    s = ctypes.c_char_p()
    rc = cu.cuGetErrorName(code, ctypes.byref(s))
    return rc, s.value and s.value.decode()
'''


def run_script(body: str, timeout: float = 120, **env):
    """Runs PRELUDE + body under the emulation with `env` added; asserts it exited 0
    and returns its stdout."""
    r = cuda_emu.run_under_emu(PRELUDE + textwrap.dedent(body), env=cuda_emu.emu_env(**env), timeout=timeout)
    assert r.returncode == 0, f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return r.stdout


@pytest.fixture(scope="module")
def emu():
    return cuda_emu.emu_dir()


# ------------------------------------------------------------------------- the build


def test_build_is_cached(emu):
    lib = os.path.join(emu, "libcuda.so.1")
    assert os.path.islink(os.path.join(emu, "libcuda.so"))
    assert os.readlink(os.path.join(emu, "libcuda.so")) == "libcuda.so.1"
    before = os.stat(lib).st_mtime_ns
    assert cuda_emu.builder().build(emu) == lib
    assert os.stat(lib).st_mtime_ns == before, "an unchanged tree must not rebuild"
    mods = sorted(f for f in os.listdir(emu) if f.startswith("ndx_emu_") and f.endswith(".so"))
    assert mods == [f"ndx_emu_{m}.so" for m in ("binary", "cast", "check", "normalize", "reduce", "resize")]


# -------------------------------------------------------- the GPU kernel tests, emulated


def gpu_suite(timeout, *args, **env):
    """tests/python/test_cuda_kernels_gpu.py under the emulation, NDX_REQUIRE_CUDA=1
    (a missing driver fails instead of skipping); returns pytest's summary line."""
    cmd = ["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "--noconftest",
           "tests/python/test_cuda_kernels_gpu.py", *args]
    r = cuda_emu.run_under_emu(cmd, env=cuda_emu.emu_env(NDX_REQUIRE_CUDA="1", **env), timeout=timeout)
    summary = (r.stdout.strip().splitlines() or [""])[-1]
    assert r.returncode == 0, f"{summary}\n{r.stdout[-6000:]}\n{r.stderr[-3000:]}"
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) > 0, summary
    assert not re.search(r"skipped|failed|error", summary), summary
    return summary


def test_gpu_kernel_suite_passes_under_emulation(emu):
    """Every test of the module (340; about a minute on 2 cores), synchronous mode."""
    gpu_suite(900, NDX_EMU_ASYNC="0", NDX_EMU_FAULT_KERNEL=None, NDX_EMU_KERNEL_DELAY_MS=None)


def test_gpu_kernel_subset_passes_in_async_mode(emu):
    """A representative subset with a worker thread per stream."""
    gpu_suite(600, "-k", "modules_load or binary_compact and f32 or binary_broadcast and i32 or cast and f16 "
              "or reduce and u8 or normalize and bf16 or resize and u8 or check_bool or flags_reset",
              NDX_EMU_ASYNC="1", NDX_EMU_FAULT_KERNEL=None, NDX_EMU_KERNEL_DELAY_MS=None)


# ------------------------------------------------------------------------ sticky fault


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_fault_injection_is_sticky(emu, mode):
    run_script(
        """
        init()
        mod = load("binary")
        add, sub = function(mod, "ndx_add_f32"), function(mod, "ndx_sub_f32")
        n = 1000
        a, b = upload(np.arange(n, dtype=np.float32)), upload(np.ones(n, np.float32))
        res = upload(np.full(n, -7, np.float32))
        word = upload(np.zeros(1, np.uint64))
        s = stream()
        ev = event()
        ok(launch(add, 4, 256, [res, a, b, n, 0, 0], s), "the faulting launch succeeds at the call")
        rc = cu.cuStreamWriteValue64(s, word, 42, 0)
        assert rc in (0, 700), rc  # 700 at once in sync mode: the stream already faulted
        assert cu.cuStreamSynchronize(s) == 700
        assert cu.cuCtxSynchronize() == 700
        assert peek(word, 1, np.uint64)[0] == 0, "an operation after the fault executed"
        assert (peek(res, n, np.float32) == -7).all(), "the faulted kernel ran"
        # Sticky: everything touching the context fails from now on.
        p = U64()
        assert cu.cuMemAlloc_v2(ctypes.byref(p), 256) == 700
        host = np.zeros(n, np.float32)
        assert cu.cuMemcpyDtoH_v2(host.ctypes.data, res, host.nbytes) == 700
        assert launch(sub, 4, 256, [res, a, b, n, 0, 0], s) == 700
        assert cu.cuEventRecord(ev, s) == 700
        assert cu.cuEventQuery(ev) == 700 and cu.cuEventSynchronize(ev) == 700
        assert cu.cuStreamQuery(s) == 700
        assert error_name(700) == (0, "CUDA_ERROR_ILLEGAL_ADDRESS")
        text = ctypes.c_char_p()
        ok(cu.cuGetErrorString(700, ctypes.byref(text)))
        assert text.value == b"an illegal memory access was encountered"
        assert cu.ndx_emu_launch_count() == 1
        # Recovery: a reset of the primary context (or the test hook) clears it.
        ok(cu.cuDevicePrimaryCtxReset_v2(0))  # and destroys the context's resources
        ok(cu.cuCtxSynchronize())
        assert launch(add, 4, 256, [res, a, b, n, 0, 0]) == 400
        mod = load("binary")
        add, sub = function(mod, "ndx_add_f32"), function(mod, "ndx_sub_f32")
        a, b = upload(np.arange(n, dtype=np.float32)), upload(np.ones(n, np.float32))
        res = alloc(4 * n)
        s = stream()
        ok(launch(sub, 4, 256, [res, a, b, n, 0, 0], s))
        ok(cu.cuStreamSynchronize(s))
        assert (download(res, n, np.float32) == np.arange(n) - 1).all()
        ok(launch(add, 4, 256, [res, a, b, n, 0, 0], s))  # the 2nd add: not the faulting one
        ok(cu.cuStreamSynchronize(s))
        cu.ndx_emu_reset()  # counts again from 0: the next add faults
        assert cu.ndx_emu_launch_count() == 0
        ok(launch(add, 4, 256, [res, a, b, n, 0, 0], s))
        assert cu.cuStreamSynchronize(s) == 700
        cu.ndx_emu_reset()
        ok(cu.cuStreamSynchronize(s))
        """,
        NDX_EMU_FAULT_KERNEL="ndx_add_f32", NDX_EMU_ASYNC="1" if mode == "async" else "0",
        NDX_EMU_KERNEL_DELAY_MS="50" if mode == "async" else None,
    )


def test_fault_injection_picks_the_nth_launch(emu):
    run_script(
        """
        init()
        add = function(load("binary"), "ndx_add_f32")
        n = 300
        a, b = upload(np.arange(n, dtype=np.float32)), upload(np.ones(n, np.float32))
        r1, r2, r3 = alloc(4 * n), alloc(4 * n), alloc(4 * n)
        ok(launch(add, 2, 256, [r1, a, b, n, 0, 0]))
        ok(cu.cuCtxSynchronize())
        assert (download(r1, n, np.float32) == np.arange(n) + 1).all()
        ok(launch(add, 2, 256, [r2, a, b, n, 0, 0]))  # the 2nd: faults when reached
        assert cu.cuCtxSynchronize() == 700
        assert launch(add, 2, 256, [r3, a, b, n, 0, 0]) == 700
        assert cu.ndx_emu_launch_count() == 2
        """,
        NDX_EMU_FAULT_KERNEL="ndx_add_f32:2", NDX_EMU_ASYNC=None, NDX_EMU_KERNEL_DELAY_MS=None,
    )


# ------------------------------------------------------------------------- async mode


def test_async_mode_orders_streams_through_events(emu):
    run_script(
        """
        init()
        mod = load("binary")
        add, mul = function(mod, "ndx_add_f32"), function(mod, "ndx_mul_f32")
        n = 4096
        x = np.arange(n, dtype=np.float32)
        a, b, two = upload(x), upload(np.ones(n, np.float32)), upload(np.full(n, 2, np.float32))
        s1, s2 = stream(1), stream(1)  # CU_STREAM_NON_BLOCKING: no implicit ordering
        ev = event()
        res, res2 = upload(np.full(n, -1, np.float32)), upload(np.full(n, -1, np.float32))
        t0 = time.monotonic()
        ok(launch(add, 16, 256, [res, a, b, n, 0, 0], s1))
        ok(cu.cuEventRecord(ev, s1))
        assert time.monotonic() - t0 < 0.5, "a launch must return at once"
        assert cu.cuEventQuery(ev) == 600  # CUDA_ERROR_NOT_READY
        assert cu.cuStreamQuery(s1) == 600
        # The consumer on s2 waits for the event, then reads the producer's output.
        ok(cu.cuStreamWaitEvent(s2, ev, 0))
        ok(launch(mul, 16, 256, [res2, res, two, n, 0, 0], s2))
        assert cu.cuStreamQuery(s2) == 600
        ok(cu.cuEventSynchronize(ev))
        assert time.monotonic() - t0 >= 0.99, "the kernel delay was not applied"
        assert cu.cuEventQuery(ev) == 0
        ok(cu.cuStreamSynchronize(s2))
        assert (download(res2, n, np.float32) == (x + 1) * 2).all()

        # Timing events: elapsed time between two records spans the delayed kernel.
        e0, e1 = event(), event()
        ok(cu.cuEventRecord(e0, s1))
        ok(launch(add, 16, 256, [res, a, b, n, 0, 0], s1))
        ok(cu.cuEventRecord(e1, s1))
        ms = ctypes.c_float()
        assert cu.cuEventElapsedTime(ctypes.byref(ms), e0, e1) == 600
        ok(cu.cuEventSynchronize(e1))
        ok(cu.cuEventElapsedTime(ctypes.byref(ms), e0, e1))
        assert ms.value >= 990, ms.value
        nt = event(2)  # CU_EVENT_DISABLE_TIMING
        ok(cu.cuEventRecord(nt, s1))
        ok(cu.cuEventSynchronize(nt))
        assert cu.cuEventElapsedTime(ctypes.byref(ms), e0, nt) == 400

        # cuMemcpyHtoDAsync stages a pageable source at the call: reusing it at once
        # is safe even behind a delayed kernel.
        src = np.full(n, 5, np.float32)
        dst = alloc(4 * n)
        ok(launch(add, 16, 256, [res, a, b, n, 0, 0], s1))
        ok(cu.cuMemcpyHtoDAsync_v2(dst, src.ctypes.data, src.nbytes, s1))
        src[:] = 9
        del src
        ok(cu.cuStreamSynchronize(s1))
        assert (download(dst, n, np.float32) == 5).all()

        # cuMemcpyDtoHAsync into pageable memory returns once the copy has run, after
        # the delayed kernel before it; into cuMemHostAlloc memory it returns at once.
        ok(cu.cuMemsetD32_v2(res, 0, n))
        ok(launch(add, 16, 256, [res, a, b, n, 0, 0], s1))
        got = np.zeros(n, np.float32)
        t0 = time.monotonic()
        ok(cu.cuMemcpyDtoHAsync_v2(got.ctypes.data, res, got.nbytes, s1))
        assert time.monotonic() - t0 >= 0.99, "a pageable download returned early"
        assert (got == x + 1).all()
        ok(cu.cuMemsetD32_v2(res, 0, n))
        pinned = out(P, cu.cuMemHostAlloc, 4 * n, 0)
        ok(launch(add, 16, 256, [res, a, b, n, 0, 0], s1))
        t0 = time.monotonic()
        ok(cu.cuMemcpyDtoHAsync_v2(pinned, res, 4 * n, s1))
        assert time.monotonic() - t0 < 0.5, "a pinned download must return at once"
        assert cu.cuStreamQuery(s1) == 600
        ok(cu.cuStreamSynchronize(s1))
        assert (peek(pinned, n, np.float32) == x + 1).all()
        ok(cu.cuMemFreeHost(pinned))

        # A synchronous copy waits for blocking streams, not for non-blocking ones: a
        # missing synchronisation shows as stale data.
        blocking = stream(0)
        for s, want in ((blocking, x + 1), (s1, -3)):
            ok(cu.cuMemsetD32_v2(res, int(np.float32(-3).view(np.uint32)), n))
            ok(launch(add, 16, 256, [res, a, b, n, 0, 0], s))
            got = download(res, n, np.float32)
            assert (got == want).all(), (s, got[:4])
            ok(cu.cuCtxSynchronize())

        # Stream-ordered free: the kernel queued before it still reads valid memory.
        tmp = out(U64, cu.cuMemAllocAsync, 4 * n, s1)
        ok(cu.cuMemcpyHtoDAsync_v2(tmp, x.ctypes.data, x.nbytes, s1))
        ok(launch(add, 16, 256, [res, tmp, b, n, 0, 0], s1))
        ok(cu.cuMemFreeAsync(tmp, s1))
        assert cu.cuMemFreeAsync(tmp, s1) == 1  # already freed
        ok(cu.cuStreamSynchronize(s1))
        assert (download(res, n, np.float32) == x + 1).all()
        for s in (s1, s2, blocking):
            ok(cu.cuStreamDestroy_v2(s))
        for e in (ev, e0, e1, nt):
            ok(cu.cuEventDestroy_v2(e))
        """,
        NDX_EMU_ASYNC="1", NDX_EMU_KERNEL_DELAY_MS="1000", NDX_EMU_FAULT_KERNEL=None,
    )


def test_sync_mode_executes_at_the_call(emu):
    run_script(
        """
        init()
        add = function(load("binary"), "ndx_add_f32")
        n = 256
        a, b = upload(np.arange(n, dtype=np.float32)), upload(np.ones(n, np.float32))
        res = alloc(4 * n)
        s, ev = stream(1), event()
        ok(launch(add, 1, 256, [res, a, b, n, 0, 0], s))
        assert (peek(res, n, np.float32) == np.arange(n) + 1).all()  # before any sync
        ok(cu.cuEventRecord(ev, s))
        assert cu.cuEventQuery(ev) == 0 and cu.cuStreamQuery(s) == 0
        ok(cu.cuStreamWriteValue32_v2(s, res, 7, 0))
        assert peek(res, 1, np.uint32)[0] == 7
        assert cu.ndx_emu_launch_count() == 1
        """,
        NDX_EMU_ASYNC="0", NDX_EMU_FAULT_KERNEL=None, NDX_EMU_KERNEL_DELAY_MS=None,
    )


# --------------------------------------------------------- OOM and invalid arguments


def test_out_of_memory_and_bad_arguments(emu):
    run_script(
        """
        MiB = 1 << 20
        p = U64()
        assert cu.cuDeviceGetCount(ctypes.byref(I())) == 3  # CUDA_ERROR_NOT_INITIALIZED
        assert cu.cuMemAlloc_v2(ctypes.byref(p), 256) == 3
        assert out(I, cu.cuDriverGetVersion) == 12080  # allowed before cuInit
        assert cu.cuInit(1) == 1
        ok(cu.cuInit(0))
        assert out(I, cu.cuDeviceGetCount) == 1
        assert cu.cuDeviceGet(ctypes.byref(I()), 1) == 101
        assert cu.cuMemAlloc_v2(ctypes.byref(p), 256) == 201  # no current context
        name = ctypes.create_string_buffer(64)
        ok(cu.cuDeviceGetName(name, 64, 0))
        assert name.value == b"ndx emulated GPU"
        attrs = {75: 9, 76: 0, 16: 4, 1: 1024, 10: 32, 91: 1}
        assert {k: out(I, cu.cuDeviceGetAttribute, k, 0) for k in attrs} == attrs
        assert out(SZ, cu.cuDeviceTotalMem_v2, 0) == MiB
        init()
        assert out(P, cu.cuCtxGetCurrent) is not None

        # Memory: capacity NDX_EMU_MEM_BYTES, 256-byte granules.
        assert cu.cuMemAlloc_v2(ctypes.byref(p), 0) == 1
        assert cu.cuMemAlloc_v2(ctypes.byref(p), 2 * MiB) == 2
        half = alloc(MiB // 2)
        assert half % 256 == 0
        free, total = SZ(), SZ()
        ok(cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)))
        assert (free.value, total.value) == (MiB // 2, MiB)
        assert cu.cuMemAlloc_v2(ctypes.byref(p), MiB // 2 + 1) == 2
        small = alloc(100)
        assert cu.cuMemFree_v2(small + 8) == 1  # not the start of an allocation
        ok(cu.cuMemFree_v2(small))
        assert cu.cuMemFree_v2(small) == 1  # twice
        buf = np.zeros(64, np.uint8)
        assert cu.cuMemcpyHtoD_v2(half + MiB // 2 - 32, buf.ctypes.data, 64) == 1  # past the end
        assert cu.cuMemcpyDtoH_v2(buf.ctypes.data, 12345, 64) == 1  # not device memory
        assert cu.cuMemsetD32_v2(half + 2, 0, 4) == 1  # misaligned
        ok(cu.cuMemsetD8_v2(half, 0xAB, MiB // 2))
        assert (download(half, 16, np.uint8) == 0xAB).all()
        dup = alloc(64)
        ok(cu.cuMemcpyDtoD_v2(dup, half, 64))
        assert (download(dup, 64, np.uint8) == 0xAB).all()
        ok(cu.cuMemFree_v2(half))
        ok(cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)))
        assert free.value == MiB - 256
        pinned = out(P, cu.cuMemHostAlloc, 4096, 0)
        assert out(U64, cu.cuMemHostGetDevicePointer_v2, pinned, 0) == pinned
        ok(cu.cuMemFreeHost(pinned))
        assert cu.cuMemFreeHost(pinned) == 1

        # Modules and functions.
        m = P()
        assert cu.cuModuleLoadData(ctypes.byref(m), b"not ptx at all\\0") == 218
        mod = load("binary")
        f = P()
        assert cu.cuModuleGetFunction(ctypes.byref(f), mod, b"ndx_nope") == 500
        assert cu.cuModuleGetFunction(ctypes.byref(f), mod, b"ndx_cast_f32_f16") == 500  # another module's
        add = function(mod, "ndx_add_f32")
        assert function(mod, "ndx_add_f32") == add

        # Launch shapes outside ABI.md.
        n = 64
        a, b, res = alloc(4 * n), alloc(4 * n), alloc(4 * n)
        args = [res, a, b, n, 0, 0]
        for kw in (dict(dims=(1, 1, 1, 48, 1, 1)), dict(dims=(1, 1, 1, 2048, 1, 1)), dict(dims=(0, 1, 1, 32, 1, 1)),
                   dict(dims=(1, 2, 1, 32, 1, 1)), dict(dims=(1, 1, 1, 32, 2, 1)), dict(shmem=16),
                   dict(extra=(P * 1)())):
            assert launch(add, 1, 32, args, **kw) == 1, kw
        assert cu.cuLaunchKernel(add, 1, 1, 1, 32, 1, 1, 0, None, None, None) == 1  # no kernelParams
        bogus = P(0x1234)
        assert launch(add, 1, 32, args, bogus) == 400
        assert cu.cuStreamSynchronize(bogus) == 400 and cu.cuStreamQuery(bogus) == 400
        assert cu.cuEventQuery(bogus) == 400
        assert launch(bogus, 1, 32, args) == 400
        assert cu.cuStreamCreate(ctypes.byref(P()), 2) == 1
        for legacy in (None, P(1), P(2)):  # NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD
            ok(launch(add, 1, 32, args, legacy))
            ok(cu.cuStreamSynchronize(legacy))
        assert cu.ndx_emu_launch_count() == 3
        ok(cu.cuModuleUnload(mod))
        assert cu.cuModuleUnload(mod) == 400
        assert launch(add, 1, 32, args) == 400  # its functions went with it

        # Error names and strings.
        names = {1: "CUDA_ERROR_INVALID_VALUE", 2: "CUDA_ERROR_OUT_OF_MEMORY", 3: "CUDA_ERROR_NOT_INITIALIZED",
                 101: "CUDA_ERROR_INVALID_DEVICE", 200: "CUDA_ERROR_INVALID_IMAGE", 218: "CUDA_ERROR_INVALID_PTX",
                 400: "CUDA_ERROR_INVALID_HANDLE", 500: "CUDA_ERROR_NOT_FOUND", 600: "CUDA_ERROR_NOT_READY",
                 700: "CUDA_ERROR_ILLEGAL_ADDRESS"}
        for code, want in names.items():
            assert error_name(code) == (0, want)
            s = ctypes.c_char_p()
            ok(cu.cuGetErrorString(code, ctypes.byref(s)))
            assert s.value
        assert error_name(12345) == (1, None)

        # The last release of the primary context frees what it owned.
        ok(cu.cuDevicePrimaryCtxRelease_v2(0))
        assert cu.cuDevicePrimaryCtxRelease_v2(0) == 201
        init()
        ok(cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)))
        assert free.value == MiB
        """,
        NDX_EMU_MEM_BYTES=str(1 << 20), NDX_EMU_ASYNC=None, NDX_EMU_FAULT_KERNEL=None,
    )
