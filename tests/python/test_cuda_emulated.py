"""ndx's CUDA paths on the emulated driver of tests/cuda_emu, so machines without a GPU
(CI) run the launchers, the allocator, stream ordering and fault attribution.

The emulated libcuda.so.1 runs only in subprocesses (see cuda_emu.py). On a machine
with a real GPU, tests/python/test_cuda_ops.py runs against it directly as well.

Run: NDX_LIBRARY=/path/to/libndx.so python3 -m pytest -q tests/python/test_cuda_emulated.py
"""

import os
import re
import sys
import textwrap

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cuda_emu  # noqa: E402
import ndx_ctypes as ndx  # noqa: E402

LIB = os.path.abspath(ndx.library_path())


def env(**extra):
    return cuda_emu.emu_env(NDX_LIBRARY=LIB, NDX_REQUIRE_CUDA="1", **extra)


def run_script(tmp_path, name, text, **extra):
    """Runs `text` as the script `name` under the emulated driver; its stdout."""
    script = tmp_path / name
    script.write_text(text)
    r = cuda_emu.run_under_emu([str(script)], env=env(NDX_EMU_ASYNC="1", **extra), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def passed(r):
    m = re.search(r"(\d+) passed", r.stdout)
    return int(m.group(1)) if m else 0


def test_every_operator_test_passes_on_the_emulated_gpu():
    r = cuda_emu.run_under_emu(
        ["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/python/test_cuda_ops.py"],
        env=env(), timeout=600,
    )
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert passed(r) > 300, r.stdout[-2000:]


def test_operators_are_stream_ordered_when_the_stream_runs_later():
    # Every stream operation now runs on a worker thread, each launch 2 ms late: the
    # results stay right only if ndx orders its copies and launches on its events.
    r = cuda_emu.run_under_emu(
        ["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/python/test_cuda_ops.py",
         "-k", "chain or round_trip or (binary and float32) or reductions and int32 or checks"],
        env=env(NDX_EMU_ASYNC="1", NDX_EMU_KERNEL_DELAY_MS="2"), timeout=600,
    )
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert passed(r) >= 40, r.stdout[-2000:]


FAULT = textwrap.dedent(
    """\
    import numpy as np
    import ndx_ctypes as ndx
    ctx = ndx.Context(mode=ndx.NDX_EVAL_SYNC_CPU, capture=ndx.NDX_CAPTURE_HOST)
    ctx.set_frame_provider()
    a = ctx.invoke("to_device", [np.arange(64, dtype=np.float32)]).tensor()
    b = ctx.invoke("add", [a, a]).tensor()
    c = ctx.invoke("mul", [b, b]).tensor()  # line 7: its kernel faults
    d = ctx.invoke("sub", [c, b]).tensor()
    try:
        ctx.invoke("to_host", [d]).result()  # line 10: where the fault is noticed
        print("no error")
    except ndx.NdxError as e:
        print("KIND", e.kind)
        print("MESSAGE", e.message)
        cause = e.cause
        if cause is not None:
            print("CAUSE", cause.message)
            print("CAUSE_OP", cause.op, cause.sequence)
            print("CAUSE_FRAME", [(f.file, f.line) for f in cause.frames if f.file.endswith("fault.py")])
        print("FRAME", [(f.file, f.line) for f in e.frames if f.file.endswith("fault.py")])
    try:
        ctx.invoke("to_device", [np.ones(3, np.float32)]).result()
    except ndx.NdxError as e:
        print("AFTER", e.kind, e.message)
    """
)


def test_a_sticky_fault_is_attributed_to_the_invocation_whose_kernel_faulted(tmp_path):
    # Kernels run 100 ms late, so the fault surfaces where the script notices it (line
    # 10), not at a later launch that happens to come after the faulting kernel ran.
    out = run_script(tmp_path, "fault.py", FAULT, NDX_EMU_FAULT_KERNEL="ndx_mul_f32",
                     NDX_EMU_KERNEL_DELAY_MS="100")
    assert f"KIND {ndx.NDX_ERROR_CUDA}" in out, out
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in out and "unusable from now on" in out, out
    assert "the fault is attributed to 'mul' (#3)" in out, out
    assert "after the last that completed ('add' (#2))" in out, out
    assert "CAUSE_OP mul 3" in out, out
    assert re.search(r"CAUSE_FRAME \[\('[^']*fault\.py', 7\)\]", out), out
    assert re.search(r"FRAME \[\('[^']*fault\.py', 10\)\]", out), out
    assert re.search(rf"AFTER {ndx.NDX_ERROR_CUDA} .*CUDA_ERROR_ILLEGAL_ADDRESS", out), out


def test_without_stream_memory_operations_a_fault_is_reported_but_not_attributed(tmp_path):
    # A stale progress word must not blame the wrong invocation: no cause then.
    out = run_script(tmp_path, "fault.py", FAULT, NDX_EMU_FAULT_KERNEL="ndx_mul_f32",
                     NDX_EMU_NO_STREAM_MEMOPS="1")
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in out and "unusable from now on" in out, out
    assert "attributed" not in out, out


DEBUG_ON_DEVICE = textwrap.dedent(
    """\
    import numpy as np
    import ndx_ctypes as ndx
    x = np.arange(1, 9, dtype=np.float32).reshape(2, 4)
    for mode in (ndx.NDX_EVAL_SYNC_CPU, ndx.NDX_EVAL_EAGER):
        for fault in range(1, 6):
            for backend in ("default", "debug"):
                ctx = ndx.Context(mode=mode, backend=backend, capture=ndx.NDX_CAPTURE_HOST)
                ctx.set_frame_provider()
                d = ctx.invoke("to_device", [x]).tensor()
                op = "sum" if fault == ndx.NDX_TEST_CUDA_FAULT_ALIASES_INPUT else "add"
                ndx.check(ndx.lib.ndx_test_cuda_fault(op.encode(), fault))
                f = ctx.invoke(op, [d, d] if op == "add" else [d])  # line 12
                try:
                    f.wait()
                    print("RUN", mode, fault, backend, "ok")
                except ndx.NdxError as e:
                    lines = [f.line for f in e.frames if f.file.endswith("debug.py")]
                    print("RUN", mode, fault, backend, e.kind, e.op, e.sequence, lines, e.message)
                ctx.release()
    """
)


def test_the_debug_backend_reports_a_faulty_run_on_the_device_at_its_line(tmp_path):
    # The test hook makes one run on the device misbehave (the built-in kernels do not):
    # the `debug` backend fails it with NDX_ERROR_BACKEND at the script's line, in SYNC
    # and EAGER modes, on slow asynchronous streams; the default backend trusts it.
    if not ndx.HAS_TEST_HOOKS:
        pytest.skip("the library was built without the cargo feature test-hooks")
    out = run_script(tmp_path, "debug.py", DEBUG_ON_DEVICE, NDX_EMU_KERNEL_DELAY_MS="20")
    what = {
        1: "operator 'add' wrote into its input 0 (shape [2, 4], dtype float32)",
        2: "operator 'sum' output 0 shares memory with input 0",
        3: "operator 'add' output 0 has dtype int32, its schema declares float32",
        4: "operator 'add' output 0 has shape [8], its schema declares shape [2, 4]",
        5: "operator 'add' output 0 has layout \"WW\", its schema declares \"\"",
    }
    for mode in (ndx.NDX_EVAL_SYNC_CPU, ndx.NDX_EVAL_EAGER):
        for fault, message in what.items():
            op = "sum" if fault == 2 else "add"
            assert f"RUN {mode} {fault} default ok" in out, out
            want = (f"RUN {mode} {fault} debug {ndx.NDX_ERROR_BACKEND} {op} 2 [12] "
                    f"debug backend: {message}")
            assert want in out, out


CONCURRENT_FAULT = textwrap.dedent(
    """\
    import threading
    import numpy as np
    import ndx_ctypes as ndx
    ctx = ndx.Context(mode=ndx.NDX_EVAL_EAGER, num_threads=2)
    up = ctx.invoke("to_device", [np.arange(64, dtype=np.float32)])
    up.wait()  # a copy, not a launch
    x = up.tensor()
    # Two workers enqueue at once: the add's launch call returns 0.5 s late, and the
    # mul (whose kernel faults) is enqueued meanwhile by the other worker.
    a = ctx.invoke("add", [x, x])
    m = ctx.invoke("mul", [x, x])
    for name, f in (("ADD", a), ("MUL", m)):
        try:
            f.wait()
            print(name, "ok")
        except ndx.NdxError as e:
            c = e.cause
            print(name, "failed", e.kind, c.op if c else None, c.sequence if c else None, e.message)
    """
)


def test_a_fault_is_attributed_to_its_invocation_when_workers_enqueue_concurrently(tmp_path):
    # Each invocation's work and its progress tag are enqueued with no other
    # invocation's work between them, so a fault enqueued by another worker while the
    # add was being launched is blamed on that worker's mul, never on the add.
    # The wait for the add's event returns 200 ms late: the mul's kernel has faulted
    # by then, and the mul is still being enqueued (its launch call returns at 500 ms),
    # so the add's wait sees the fault of work not yet in the ledger, and must still
    # blame the mul.
    out = run_script(tmp_path, "concurrent.py", CONCURRENT_FAULT,
                     NDX_EMU_FAULT_KERNEL="ndx_mul_f32", NDX_EMU_LAUNCH_CALL_DELAY_MS="500",
                     NDX_EMU_EVENT_SYNC_DELAY_MS="200")
    assert re.search(rf"MUL failed {ndx.NDX_ERROR_CUDA} mul 3 .*CUDA_ERROR_ILLEGAL_ADDRESS", out), out
    # The add completed before the fault (only on a machine too busy to keep the
    # timing above), or failed with the fault blamed on the mul.
    assert re.search(rf"ADD (ok|failed {ndx.NDX_ERROR_CUDA} mul 3 )", out), out


ORDERING = textwrap.dedent(
    """\
    import ctypes
    import numpy as np
    import cuda_driver as cd
    import ndx_ctypes as ndx

    n = 512
    cu = cd.Context()
    add = cu.load_ptx("src/cuda/ptx/binary.ptx").function("ndx_add_f32")
    a, b = cu.upload(np.full(n, 1, np.float32)), cu.upload(np.full(n, 2, np.float32))
    out = cu.alloc(4 * n)
    producer = cu.stream()
    shape = (ctypes.c_int64 * 1)(n)
    ctx = ndx.Context(mode=ndx.NDX_EVAL_SYNC_CPU)
    deleted = []
    keep = []

    def produce_then_read(stream):
        cu.memset8(out, 0)
        # The producer's kernel runs late (NDX_EMU_KERNEL_DELAY_MS) on its own stream.
        cu.launch(add, 2, 256, [out, a, b, n, 0, 0], stream=producer)
        m = ndx.DLManagedTensorVersioned()
        m.version.major = 1
        m.dl_tensor.data = out.ptr
        m.dl_tensor.device.device_type, m.dl_tensor.device.device_id = 2, 0
        m.dl_tensor.ndim = 1
        m.dl_tensor.dtype.code, m.dl_tensor.dtype.bits, m.dl_tensor.dtype.lanes = 2, 32, 1
        m.dl_tensor.shape = shape
        m.deleter = ndx.DLManagedTensorVersionedDeleter(lambda p: deleted.append(1))
        keep.append(m)
        opts = ndx.ndx_import_options_t(ctypes.sizeof(ndx.ndx_import_options_t), None, False, stream)
        t = ctypes.c_void_p()
        ndx.check(ndx.lib.ndx_tensor_from_dlpack_versioned(ctypes.addressof(m), ctypes.byref(opts), ctypes.byref(t)))
        t = ndx.Tensor(t.value)
        got = ctx.invoke("to_host", [t]).result()
        t.release()
        producer.synchronize()
        return got

    ordered = produce_then_read(producer.handle.value)
    unordered = produce_then_read(ndx.STREAM_NO_SYNC)
    print("ORDERED", float(ordered.min()), float(ordered.max()))
    print("UNORDERED", float(unordered.max()))
    print("DELETED", len(deleted))
    """
)


def test_an_import_is_ordered_after_the_producers_stream_with_a_negative_control(tmp_path):
    out = run_script(tmp_path, "ordering.py", ORDERING, NDX_EMU_KERNEL_DELAY_MS="1000")
    # With the producer's stream, ndx's read waits for the late kernel: every 1 + 2.
    assert "ORDERED 3.0 3.0" in out, out
    # Told not to order (NDX_STREAM_NO_SYNC), it reads before the kernel ran: the
    # control that proves the first read was ordered, not lucky.
    assert "UNORDERED 0.0" in out, out
    assert "DELETED 2" in out, out


MANAGED = textwrap.dedent(
    """\
    import ctypes
    import numpy as np
    import cuda_driver as cd
    import ndx_ctypes as ndx

    n = 512
    cu = cd.Context()
    add = cu.load_ptx("src/cuda/ptx/binary.ptx").function("ndx_add_f32")
    a, b = cu.upload(np.full(n, 1, np.float32)), cu.upload(np.full(n, 2, np.float32))
    out = cu.alloc(4 * n)
    producer = cu.stream()
    shape = (ctypes.c_int64 * 1)(n)
    ctx = ndx.Context(mode=ndx.NDX_EVAL_SYNC_CPU)
    zeros = ndx.tensor_from_numpy(np.zeros(n, np.float32))
    keep = []

    def produce_then_read(stream, read):
        cu.memset8(out, 0)
        # The producer's kernel runs late (NDX_EMU_KERNEL_DELAY_MS) on its own stream.
        cu.launch(add, 2, 256, [out, a, b, n, 0, 0], stream=producer)
        m = ndx.DLManagedTensorVersioned()
        m.version.major = 1
        m.dl_tensor.data = out.ptr
        # kDLCUDAManaged: memory the host reads directly (the emulator's device memory is).
        m.dl_tensor.device.device_type, m.dl_tensor.device.device_id = 13, 0
        m.dl_tensor.ndim = 1
        m.dl_tensor.dtype.code, m.dl_tensor.dtype.bits, m.dl_tensor.dtype.lanes = 2, 32, 1
        m.dl_tensor.shape = shape
        m.deleter = ndx.DLManagedTensorVersionedDeleter(lambda p: None)
        keep.append(m)
        opts = ndx.ndx_import_options_t(ctypes.sizeof(ndx.ndx_import_options_t), None, False, stream)
        t = ctypes.c_void_p()
        ndx.check(ndx.lib.ndx_tensor_from_dlpack_versioned(ctypes.addressof(m), ctypes.byref(opts), ctypes.byref(t)))
        t = ndx.Tensor(t.value)
        got = read(t)
        t.release()
        producer.synchronize()
        return got

    reads = {
        "copy_to": lambda t: t.numpy(),
        "cpu_op": lambda t: ctx.invoke("add", [t, zeros]).result(),
        "to_device": lambda t: ctx.invoke("to_host", [ctx.invoke("to_device", [t]).tensor()]).result(),
    }
    for name, read in reads.items():
        print("ORDERED", name, float(produce_then_read(producer.handle.value, read).min()))
    print("UNORDERED", float(produce_then_read(ndx.STREAM_NO_SYNC, reads["copy_to"]).max()))
    """
)


def test_managed_memory_is_read_by_the_host_after_the_producers_stream(tmp_path):
    out = run_script(tmp_path, "managed.py", MANAGED, NDX_EMU_KERNEL_DELAY_MS="500")
    # kDLCUDAManaged memory is read on the host: by ndx_tensor_copy_to, by a CPU
    # operator and by to_device's upload. Each waits for the producer's late kernel.
    for read in ("copy_to", "cpu_op", "to_device"):
        assert f"ORDERED {read} 3.0" in out, out
    # The negative control: told not to order, the read comes before the kernel ran.
    assert "UNORDERED 0.0" in out, out


PART_WAY = textwrap.dedent(
    """\
    import ctypes
    import numpy as np
    import cuda_driver as cd
    import ndx_ctypes as ndx

    emu = ctypes.CDLL("libcuda.so.1")
    emu.ndx_emu_kernels_run.restype, emu.ndx_emu_kernels_run.argtypes = ctypes.c_ulonglong, []
    emu.ndx_emu_launch_count.restype, emu.ndx_emu_launch_count.argtypes = ctypes.c_ulonglong, []
    cu = cd.Context()
    n = 1024
    src = cu.upload(np.full(n, 7, np.uint8))
    shape = (ctypes.c_int64 * 2)(n, 1)
    seen = []

    def deleter(p):
        # The cast kernel reading this memory must have run before its owner gets it back.
        seen.append((emu.ndx_emu_launch_count(), emu.ndx_emu_kernels_run()))

    m = ndx.DLManagedTensorVersioned()
    m.version.major = 1
    m.dl_tensor.data = src.ptr
    m.dl_tensor.device.device_type, m.dl_tensor.device.device_id = 2, 0
    m.dl_tensor.ndim = 2
    m.dl_tensor.dtype.code, m.dl_tensor.dtype.bits, m.dl_tensor.dtype.lanes = 1, 8, 1
    m.dl_tensor.shape = shape
    m.deleter = ndx.DLManagedTensorVersionedDeleter(deleter)
    opts = ndx.ndx_import_options_t(ctypes.sizeof(ndx.ndx_import_options_t), None, False, ndx.STREAM_NO_SYNC)
    t = ctypes.c_void_p()
    ndx.check(ndx.lib.ndx_tensor_from_dlpack_versioned(ctypes.addressof(m), ctypes.byref(opts), ctypes.byref(t)))
    a = ndx.Tensor(t.value)
    ctx = ndx.Context(mode=ndx.NDX_EVAL_SYNC_CPU)
    b = ctx.invoke("to_device", [np.ones((1, 1 << 18), np.float32)]).tensor()  # 1 MiB
    f = ctx.invoke("add", [a, b])  # casts a to float32 (a kernel reading a), then 1 GiB for the output
    try:
        f.wait()
        print("no error")
    except ndx.NdxError as e:
        print("FAILED", e.kind, e.message)
    a.release()
    launched, ran = seen[0]
    print("AT_DELETE launched", launched, "ran", ran)
    """
)


def test_an_import_read_by_an_invocation_that_failed_part_way_is_released_after_its_work(tmp_path):
    # The add casts the uint8 import on the device (a kernel reading it, 1 s late),
    # then fails for want of memory for its output. The producer's deleter, which may
    # free the memory, runs only once that kernel has run.
    out = run_script(tmp_path, "part_way.py", PART_WAY, NDX_EMU_KERNEL_DELAY_MS="1000",
                     NDX_EMU_MEM_BYTES=str(64 << 20))
    assert f"FAILED {ndx.NDX_ERROR_MEMORY} CUDA out of memory on kDLCUDA:0" in out, out
    assert "AT_DELETE launched 1 ran 1" in out, out


def test_the_gpu_benchmark_runs_end_to_end_on_tiny_sizes():
    # Keeps benches/cuda_bench.py working where no GPU is; its figures mean nothing here.
    r = cuda_emu.run_under_emu(
        ["benches/cuda_bench.py", "--elements", "5000", "--repeat", "2", "--tensors", "16", "--iters", "5",
         "--upload-elements", "300000"],
        env=env(), timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    for key in ('"add_fraction_of_copy"', '"per_tensor_us"', '"gpu_us_per_invocation"', '"gpu_chain_us_per_invocation"', '"ndx_over_pageable"'):
        assert key in r.stdout, r.stdout


POLL = textwrap.dedent(
    """\
    import numpy as np
    import ndx_ctypes as ndx
    ctx = ndx.Context(mode=ndx.NDX_EVAL_EAGER)
    x = ctx.invoke("to_device", [np.arange(1000, dtype=np.float32)]).tensor()
    f = ctx.invoke("add", [x, x])  # its kernel runs 1 s late (NDX_EMU_KERNEL_DELAY_MS)
    print("POLL", f.poll())
    f.wait()
    print("AFTER", f.poll())
    print("SUM", float(ctx.invoke("to_host", [f.tensor()]).result().sum()))
    """
)


def test_an_eager_future_is_pending_until_its_gpu_work_is_done(tmp_path):
    out = run_script(tmp_path, "poll.py", POLL, NDX_EMU_KERNEL_DELAY_MS="1000")
    # poll never blocks: it answered PENDING while the kernel was still queued.
    assert f"POLL {ndx.NDX_FUTURE_PENDING}" in out, out
    assert f"AFTER {ndx.NDX_FUTURE_READY}" in out, out
    assert "SUM 999000.0" in out, out


WORKER = textwrap.dedent(
    """\
    import time
    import numpy as np
    import ndx_ctypes as ndx
    ctx = ndx.Context(mode=ndx.NDX_EVAL_EAGER, num_threads=1)  # the pool's only worker
    up = ctx.invoke("to_device", [np.arange(1000, dtype=np.float32)])
    up.wait()  # a copy: no kernel delay
    x = up.tensor()
    t0 = time.monotonic()
    g = ctx.invoke("add", [x, x])  # its kernel runs 1 s late (NDX_EMU_KERNEL_DELAY_MS)
    c = ctx.invoke("add", [np.ones(4, np.float32), np.ones(4, np.float32)])
    c.wait()
    cpu_done = time.monotonic() - t0
    g.wait()
    gpu_done = time.monotonic() - t0
    print("CPU_DONE_BEFORE_GPU", cpu_done < 0.5 and gpu_done > 0.9, round(cpu_done, 3), round(gpu_done, 3))
    print("CPU", c.result().tolist())
    print("SUM", float(ctx.invoke("to_host", [g.tensor()]).result().sum()))
    """
)


def test_gpu_work_in_flight_does_not_hold_a_worker(tmp_path):
    # With one worker, an EAGER CPU invocation queued behind a slow GPU one runs at
    # once: the wait for the GPU work is the device's completion thread's, not the
    # worker's. (A worker blocking on the event would finish the CPU add after 1 s.)
    out = run_script(tmp_path, "worker.py", WORKER, NDX_EMU_KERNEL_DELAY_MS="1000")
    assert "CPU_DONE_BEFORE_GPU True" in out, out
    assert "CPU [2.0, 2.0, 2.0, 2.0]" in out, out
    assert "SUM 999000.0" in out, out


PIPELINE = textwrap.dedent(
    """\
    import ctypes
    import time
    import numpy as np
    import ndx_ctypes as ndx
    cu = ctypes.CDLL("libcuda.so.1")  # the emulated driver ndx loaded
    cu.ndx_emu_launch_count.restype, cu.ndx_emu_launch_count.argtypes = ctypes.c_uint64, []

    def uploaded(ctx, array):
        up = ctx.invoke("to_device", [array])
        up.wait()  # a copy: no kernel delay
        return up.tensor()

    def launched(before, n, first):
        # Waits until n kernels were launched since `before` (10 s at most); the
        # count, and whether `first` was still pending then (its kernel 1 s late).
        t0 = time.monotonic()
        while cu.ndx_emu_launch_count() - before < n and time.monotonic() - t0 < 10:
            time.sleep(0.005)
        return cu.ndx_emu_launch_count() - before, first.poll() == ndx.NDX_FUTURE_PENDING

    ctx = ndx.Context(mode=ndx.NDX_EVAL_EAGER)
    x = uploaded(ctx, np.arange(1000, dtype=np.float32))
    before = cu.ndx_emu_launch_count()
    a = ctx.invoke("add", [x, x])  # every kernel runs 1 s late (NDX_EMU_KERNEL_DELAY_MS)
    b = ctx.invoke("add", [a.tensor(), a.tensor()])
    c = ctx.invoke("mul", [b.tensor(), x])
    print("CHAIN_LAUNCHED", *launched(before, 3, a))
    got = ctx.invoke("to_host", [c.tensor()]).result().astype(np.float64)
    print("CHAIN", bool(np.array_equal(got, 4.0 * np.arange(1000.0) ** 2)))

    # A consumer enqueued behind a check that fails (FAIL_FAST) fails with it as cause.
    strict = ndx.Context(mode=ndx.NDX_EVAL_EAGER, check_policy=ndx.NDX_CHECKS_FAIL_FAST,
                         check_categories=ndx.NDX_CHECK_USER)
    bad = uploaded(strict, np.array([1, np.nan, 3], np.float32))
    before = cu.ndx_emu_launch_count()
    k = strict.invoke("check_finite", [bad])  # flag reset + check kernel
    y = strict.invoke("add", [k.tensor(), k.tensor()])
    print("CHECKED_LAUNCHED", *launched(before, 3, k))
    try:
        y.wait()
        print("no error")
    except ndx.NdxError as e:
        print("KIND", e.kind)
        print("MESSAGE", e.message)
        print("CAUSE", e.cause.kind, e.cause.message)
    """
)


def test_eager_gpu_work_is_enqueued_behind_running_work_without_waiting_for_it(tmp_path):
    # Each invocation of the chain is launched while the first one's kernel is still
    # queued: it runs on the same stream, so the stream orders it. Waiting for each
    # producer to complete first would launch the third kernel only after the first
    # one completed (the first future no longer pending).
    out = run_script(tmp_path, "pipeline.py", PIPELINE, NDX_EMU_KERNEL_DELAY_MS="1000")
    assert "CHAIN_LAUNCHED 3 True" in out, out
    assert "CHAIN True" in out, out
    # Its producer's failure is found when the consumer completes, after the producer.
    assert "CHECKED_LAUNCHED 3 True" in out, out
    assert f"KIND {ndx.NDX_ERROR_CHECK}" in out, out
    assert re.search(r"MESSAGE input 0 of 'add' \(#\d+\) failed: it is the output of "
                     r"'check_finite' \(#\d+\), which failed", out), out
    assert re.search(rf"CAUSE {ndx.NDX_ERROR_CHECK} .*not finite", out), out


DOWNLOAD = textwrap.dedent(
    """\
    import ctypes
    import time
    import numpy as np
    import ndx_ctypes as ndx
    cu = ctypes.CDLL("libcuda.so.1")  # the emulated driver ndx loaded
    for hook in ("launch_count", "kernels_run", "copy_count"):
        f = getattr(cu, "ndx_emu_" + hook)
        f.restype, f.argtypes = ctypes.c_uint64, []

    def until(count, n):
        # Waits until the counter `count` reached n (10 s at most); whether it did.
        t0 = time.monotonic()
        while count() < n and time.monotonic() - t0 < 10:
            time.sleep(0.005)
        return count() >= n

    ctx = ndx.Context(mode=ndx.NDX_EVAL_EAGER)
    up = ctx.invoke("to_device", [np.arange(1000, dtype=np.float32)])
    up.wait()  # a copy: no kernel delay
    x = up.tensor()
    launched, ran, copies = (cu.ndx_emu_launch_count(), cu.ndx_emu_kernels_run(),
                             cu.ndx_emu_copy_count())
    a = ctx.invoke("add", [x, x])  # every kernel runs 1 s late (NDX_EMU_KERNEL_DELAY_MS)
    print("A_LAUNCHED", until(lambda: cu.ndx_emu_launch_count() - launched, 1))
    # The download's copy is queued behind the add's kernel: it waits for it.
    h = ctx.invoke("to_host", [x])
    print("COPY_QUEUED", until(lambda: cu.ndx_emu_copy_count() - copies, 1))
    # Another invocation is queued behind the copy while the download waits.
    b = ctx.invoke("mul", [x, x])
    print("B_LAUNCHED", until(lambda: cu.ndx_emu_launch_count() - launched, 2),
          h.poll() == ndx.NDX_FUTURE_PENDING)
    got = h.result()
    print("KERNELS_RUN_AT_DOWNLOAD", cu.ndx_emu_kernels_run() - ran)
    print("DOWNLOAD", bool(np.array_equal(got, np.arange(1000, dtype=np.float32))))
    print("B", bool(np.array_equal(ctx.invoke("to_host", [b.tensor()]).result(),
                                   np.arange(1000, dtype=np.float32) ** 2)))
    """
)


def test_a_download_waits_for_its_copy_not_for_work_queued_after_it(tmp_path):
    # to_host waits for the work queued before its copy (the add) and for the copy,
    # not for the mul another worker queued behind it while it waited. A wait for the
    # whole stream (cuStreamSynchronize) would return after the mul ran too: 2 kernels.
    out = run_script(tmp_path, "download.py", DOWNLOAD, NDX_EMU_KERNEL_DELAY_MS="1000")
    for line in ("A_LAUNCHED True", "COPY_QUEUED True", "B_LAUNCHED True True",
                 "KERNELS_RUN_AT_DOWNLOAD 1", "DOWNLOAD True", "B True"):
        assert line in out, out


TO_HOST_BLOCKING = textwrap.dedent(
    """\
    import ctypes
    import time
    import numpy as np
    import ndx_ctypes as ndx
    emu = ctypes.CDLL("libcuda.so.1")  # the emulated driver ndx loaded
    emu.ndx_emu_launch_count.restype, emu.ndx_emu_launch_count.argtypes = ctypes.c_uint64, []
    ctx = ndx.Context(mode=ndx.NDX_EVAL_EAGER, num_threads=2)
    up = ctx.invoke("to_device", [np.arange(1000, dtype=np.float32)])
    up.wait()  # a copy: no kernel delay
    x = up.tensor()
    before = emu.ndx_emu_launch_count()
    t0 = time.monotonic()
    a = ctx.invoke("add", [x, x])  # every kernel runs 1 s late: done at 1 s
    # The stream runs a before b only if a is launched first (the workers race).
    while emu.ndx_emu_launch_count() - before < 1 and time.monotonic() - t0 < 10:
        time.sleep(0.005)
    b = ctx.invoke("mul", [x, x])  # done at 2 s
    h = ctx.invoke("to_host", [a.tensor()])  # runs at 1 s; its copy waits for b
    a.wait()
    time.sleep(0.3)
    c = ctx.invoke("sub", [x, x])  # the other worker enqueues it while h is copying
    while emu.ndx_emu_launch_count() - before < 3 and time.monotonic() - t0 < 10:
        time.sleep(0.005)
    print("C_LAUNCHED_AT", round(time.monotonic() - t0, 2))
    print("HOST", bool(np.array_equal(h.result(), 2 * np.arange(1000, dtype=np.float32))))
    print("SUB", float(ctx.invoke("to_host", [c.tensor()]).result().sum()))
    """
)


def test_a_to_host_waiting_for_the_stream_does_not_stop_other_workers_enqueueing(tmp_path):
    # A to_host's copy into pageable memory blocks until the stream reaches it; it
    # holds no turn meanwhile, so another worker's kernel is launched at once (1.3 s),
    # not once the copy returns (2 s).
    out = run_script(tmp_path, "to_host.py", TO_HOST_BLOCKING, NDX_EMU_KERNEL_DELAY_MS="1000")
    launched = float(re.search(r"C_LAUNCHED_AT ([0-9.]+)", out).group(1))
    assert launched < 1.8, out
    assert "HOST True" in out and "SUB 0.0" in out, out


RUN_AHEAD = textwrap.dedent(
    """\
    import numpy as np
    import ndx_ctypes as ndx
    ctx = ndx.Context(mode=ndx.NDX_EVAL_EAGER)
    up = ctx.invoke("to_device", [np.ones(1 << 18, np.float32)])  # 1 MiB
    up.wait()
    x = up.tensor()
    f = ctx.invoke("add", [x, x])
    for _ in range(11):  # 12 MiB of outputs on a 6 MiB device, launched far ahead
        f = ctx.invoke("add", [f.tensor(), x])
    try:
        got = ctx.invoke("to_host", [f.tensor()]).result()
        print("CHAIN", float(got.min()), float(got.max()))
    except ndx.NdxError as e:
        chain = [e]
        while chain[-1].cause is not None:
            chain.append(chain[-1].cause)
        root = chain[-1]  # where the fault is attributed
        print("FAILED", e.kind, root.op, root.sequence, " | ".join(c.message for c in chain))
    """
)


def test_a_chain_running_ahead_of_the_gpu_waits_for_memory_instead_of_failing(tmp_path):
    # Launched ahead of the GPU, each add holds its input until it completes; an
    # allocation that finds the device full waits for the invocations in flight to
    # complete (and let go of their inputs) and tries again, so only a working set
    # that does not fit at all fails.
    out = run_script(tmp_path, "ahead.py", RUN_AHEAD, NDX_EMU_KERNEL_DELAY_MS="100",
                     NDX_EMU_MEM_BYTES=str(6 << 20))
    assert "CHAIN 13.0 13.0" in out, out


def test_a_fault_while_a_worker_waits_for_memory_is_attributed_without_a_hang(tmp_path):
    # The second add's kernel faults while a worker, enqueueing a later add, waits for
    # the invocations in flight to complete and free memory. The completion thread
    # attributes the fault meanwhile: it must not wait for that worker's turn (the
    # worker waits for it), and the invocation being enqueued is in the ledger already.
    out = run_script(tmp_path, "ahead_fault.py", RUN_AHEAD, NDX_EMU_KERNEL_DELAY_MS="100",
                     NDX_EMU_MEM_BYTES=str(6 << 20), NDX_EMU_FAULT_KERNEL="ndx_add_f32:2")
    assert re.search(rf"FAILED {ndx.NDX_ERROR_CUDA} add 3 .*CUDA_ERROR_ILLEGAL_ADDRESS.*"
                     r"the fault is attributed to 'add' \(#3\)", out), out


FAILED_ENQUEUE = textwrap.dedent(
    """\
    import numpy as np
    import ndx_ctypes as ndx
    ctx = ndx.Context(mode=ndx.NDX_EVAL_EAGER)
    x = ctx.invoke("to_device", [np.ones(1000, np.float32)])
    x.wait()
    try:
        ctx.invoke("to_device", [np.ones(1 << 20, np.float32)]).wait()  # 4 MiB: too big
    except ndx.NdxError as e:
        print("UPLOAD", e.kind)
    m = ctx.invoke("mul", [x.tensor(), x.tensor()])  # its kernel faults
    try:
        m.wait()
        print("no error")
    except ndx.NdxError as e:
        c = e.cause
        print("FAILED", e.kind, c.op if c else None, c.sequence if c else None)
    """
)


def test_an_invocation_that_failed_while_enqueueing_is_not_blamed_for_a_later_fault(tmp_path):
    # The upload (#2) fails for want of memory after taking its turn; it still writes
    # its tag, so the mul's fault is blamed on the mul (#3), not on the upload.
    out = run_script(tmp_path, "failed_enqueue.py", FAILED_ENQUEUE,
                     NDX_EMU_MEM_BYTES=str(2 << 20), NDX_EMU_FAULT_KERNEL="ndx_mul_f32")
    assert f"UPLOAD {ndx.NDX_ERROR_MEMORY}" in out, out
    assert f"FAILED {ndx.NDX_ERROR_CUDA} mul 3" in out, out


SECOND_LAUNCH = textwrap.dedent(
    """\
    import numpy as np
    import ndx_ctypes as ndx
    ctx = ndx.Context(mode=ndx.NDX_EVAL_EAGER)
    x = ctx.invoke("to_device", [np.ones(64, np.float16)])
    y = ctx.invoke("to_device", [np.ones(64, np.float32)])
    x.wait()  # the uploads complete before the fault
    y.wait()
    s = ctx.invoke("add", [x.tensor(), y.tensor()])  # casts x to f32 first
    try:
        s.wait()
        print("no error")
    except ndx.NdxError as e:
        c = e.cause
        print("FAILED", e.kind, c.op if c else None, c.sequence if c else None, e.message)
    """
)


def test_a_fault_noticed_by_the_invocations_own_next_launch_is_attributed_to_it(tmp_path):
    # The add's cast kernel faults while its launch call returns (200 ms late), so
    # the add's own next driver call (its output's allocation) reports the fault: the
    # add is in the ledger from its turn's start, so the fault is blamed on it, not
    # left without a cause.
    out = run_script(tmp_path, "second_launch.py", SECOND_LAUNCH,
                     NDX_EMU_FAULT_KERNEL="ndx_cast_f16_f32", NDX_EMU_LAUNCH_CALL_DELAY_MS="200")
    assert re.search(rf"FAILED {ndx.NDX_ERROR_CUDA} add 3 .*CUDA_ERROR_ILLEGAL_ADDRESS", out), out


OOM = textwrap.dedent(
    """\
    import numpy as np
    import ndx_ctypes as ndx
    ctx = ndx.Context(mode=ndx.NDX_EVAL_SYNC_CPU)
    small = ctx.invoke("to_device", [np.ones(1000, np.float32)]).tensor()
    try:
        ctx.invoke("to_device", [np.ones(1 << 20, np.float32)]).wait()  # 4 MiB
    except ndx.NdxError as e:
        print("KIND", e.kind)
        print("MESSAGE", e.message)
    print("STILL", float(ctx.invoke("to_host", [small]).result().sum()))
    """
)


def test_device_exhaustion_is_a_memory_error_with_the_sizes(tmp_path):
    out = run_script(tmp_path, "oom.py", OOM, NDX_EMU_MEM_BYTES=str(2 << 20))
    assert f"KIND {ndx.NDX_ERROR_MEMORY}" in out, out
    assert "CUDA out of memory on kDLCUDA:0: asked for 4.00 MiB (4194304 bytes)" in out, out
    assert "free of 2.00 MiB" in out, out
    assert "STILL 1000.0" in out, out


EXPORT = textwrap.dedent(
    """\
    import ctypes
    import numpy as np
    import cuda_driver as cd
    import ndx_ctypes as ndx

    cu = cd.Context()
    ctx = ndx.Context(mode=ndx.NDX_EVAL_SYNC_CPU)  # returns with the kernel still queued
    ndx.lib.ndx_tensor_to_dlpack.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
    ndx.lib.ndx_tensor_to_dlpack.restype = ctypes.c_void_p

    def read(ptr):
        return cu.download(ptr, (256,), np.float32)  # cuMemcpyDtoH: the legacy stream

    for form in ("legacy", "no_sync"):
        x = ctx.invoke("to_device", [np.arange(256, dtype=np.float32) + len(form)]).tensor()
        y = ctx.invoke("add", [x, x]).tensor()  # its kernel runs 1 s late
        out = ctypes.c_void_p()
        if form == "legacy":
            ndx.check(ndx.lib.ndx_tensor_to_dlpack(y.ptr, ctypes.byref(out)))
            m = ndx.DLManagedTensor.from_address(out.value)
        else:
            ndx.check(ndx.lib.ndx_tensor_to_dlpack_versioned_stream(y.ptr, ndx.STREAM_NO_SYNC, ctypes.byref(out)))
            m = ndx.DLManagedTensorVersioned.from_address(out.value)
        got = read(m.dl_tensor.data)
        print(form.upper(), bool(np.array_equal(got, 2 * (np.arange(256, dtype=np.float32) + len(form)))))
        ctx.invoke("to_host", [y]).result()  # let the kernel finish before the export goes
        m.deleter(ctypes.cast(out.value, ctypes.POINTER(type(m))))
    """
)


UPLOAD = textwrap.dedent(
    """\
    import ctypes
    import numpy as np
    import cuda_driver as cd
    import ndx_ctypes as ndx

    cu = cd.Context()
    ctx = ndx.Context(mode=ndx.NDX_EVAL_SYNC_CPU)  # returns with the kernel still queued
    x = ctx.invoke("to_device", [np.full(256, 3, np.float32)]).tensor()
    y = ctx.invoke("add", [x, x]).tensor()  # its kernel runs 1 s late
    src = np.arange(1 << 20, dtype=np.float32)
    z = ctx.invoke("to_device", [src]).tensor()
    # Did the upload wait for the add? Read y's memory now, unordered (the legacy stream).
    out = ctypes.c_void_p()
    ndx.check(ndx.lib.ndx_tensor_to_dlpack_versioned_stream(y.ptr, ndx.STREAM_NO_SYNC, ctypes.byref(out)))
    m = ndx.DLManagedTensorVersioned.from_address(out.value)
    early = cu.download(m.dl_tensor.data, (256,), np.float32)
    print("ADD_DONE_AT_UPLOAD", bool((early == 6).all()))
    src[:] = -1  # the upload was staged: the caller may reuse its memory at once
    print("UPLOAD", bool(np.array_equal(ctx.invoke("to_host", [z]).result(), np.arange(1 << 20, dtype=np.float32))))
    print("ADD", bool((ctx.invoke("to_host", [y]).result() == 6).all()))
    m.deleter(ctypes.cast(out.value, ctypes.POINTER(type(m))))
    # Larger than the pinned cap (64 MiB) in one upload, and many in a row: pieces
    # cycle through the blocks, each waiting for its block's previous copy.
    big = np.random.default_rng(0).integers(0, 1 << 30, size=(24 << 20,), dtype=np.int32)
    ups = [ctx.invoke("to_device", [big + k]).tensor() for k in range(3)]
    print("BIG", all(np.array_equal(ctx.invoke("to_host", [u]).result(), big + k) for k, u in enumerate(ups)))
    """
)


def test_uploads_are_staged_and_do_not_wait_for_queued_kernels(tmp_path):
    # The emulated driver, like a real one, synchronises the stream before a copy from
    # pageable memory: an upload that went straight from the caller's array would have
    # waited for the late add. Staged through pinned memory it does not.
    out = run_script(tmp_path, "upload.py", UPLOAD, NDX_EMU_KERNEL_DELAY_MS="1000")
    assert "ADD_DONE_AT_UPLOAD False" in out, out
    assert "UPLOAD True" in out and "ADD True" in out, out
    assert "BIG True" in out, out


def test_exports_order_the_consumers_stream_after_pending_work(tmp_path):
    out = run_script(tmp_path, "export.py", EXPORT, NDX_EMU_KERNEL_DELAY_MS="1000")
    # The legacy export orders the legacy default stream: the read sees the sum.
    assert "LEGACY True" in out, out
    # NDX_STREAM_NO_SYNC orders nothing: the same read comes before the kernel ran.
    assert "NO_SYNC False" in out, out


REUSE = textwrap.dedent(
    """\
    import ctypes
    import numpy as np
    import cuda_driver as cd
    import ndx_ctypes as ndx

    n = 256
    cu = cd.Context()
    add = cu.load_ptx("src/cuda/ptx/binary.ptx").function("ndx_add_f32")
    sums = cu.alloc(4 * n)
    ctx = ndx.Context(mode=ndx.NDX_EVAL_SYNC_FULL)
    lib = ndx.lib
    for name in ("ndx_tensor_to_dlpack", "ndx_tensor_to_dlpack_versioned"):
        getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
        getattr(lib, name).restype = ctypes.c_void_p
    original = np.arange(n, dtype=np.float32)
    other = original + 1000

    def upload(values):
        f = ctx.invoke("to_device", [values])
        t = f.tensor()
        f.release()
        return t

    def data_ptr(t):
        out = ctypes.c_void_p()
        ndx.check(lib.ndx_tensor_to_dlpack_versioned_stream(t.ptr, ndx.STREAM_NO_SYNC, ctypes.byref(out)))
        m = ndx.DLManagedTensorVersioned.from_address(out.value)
        p = m.dl_tensor.data
        m.deleter(ctypes.cast(out.value, ctypes.POINTER(type(m))))
        return p

    for form in ("stream", "versioned", "legacy", "no_sync"):
        consumer = cu.stream() if form in ("stream", "no_sync") else None
        x = upload(original)
        out = ctypes.c_void_p()
        if form == "legacy":
            ndx.check(lib.ndx_tensor_to_dlpack(x.ptr, ctypes.byref(out)))
            m = ndx.DLManagedTensor.from_address(out.value)
        else:
            if form == "versioned":
                ndx.check(lib.ndx_tensor_to_dlpack_versioned(x.ptr, ctypes.byref(out)))
            else:
                s = consumer.handle.value if form == "stream" else ndx.STREAM_NO_SYNC
                ndx.check(lib.ndx_tensor_to_dlpack_versioned_stream(x.ptr, s, ctypes.byref(out)))
            m = ndx.DLManagedTensorVersioned.from_address(out.value)
        x.release()  # the export holds the memory now
        p = m.dl_tensor.data
        # The consumer reads the memory on its stream (the legacy one for the forms
        # without a stream), its kernel late, and drops its tensor at once.
        cu.launch(add, 1, 256, [sums, p, p, n, 0, 0], stream=consumer)
        m.deleter(ctypes.cast(out.value, ctypes.POINTER(type(m))))
        # ndx's next allocation of the size class reuses the block and writes it.
        y = upload(other)
        reused = data_ptr(y) == p
        cu.synchronize()
        got = cu.download(sums, (n,), np.float32)
        read = "ORIGINAL" if np.array_equal(got, 2 * original) else "OTHER" if np.array_equal(got, 2 * other) else got
        print(form.upper(), "REUSED", reused, "READ", read, "Y", bool(np.array_equal(ctx.invoke("to_host", [y]).result(), other)))
        y.release()
        if consumer is not None:
            consumer.destroy()
    """
)


def test_exported_memory_is_reused_only_after_the_consumers_queued_work(tmp_path):
    out = run_script(tmp_path, "reuse.py", REUSE, NDX_EMU_KERNEL_DELAY_MS="1000")
    # The consumer's kernel reads the export 1 s late; its deleter ran at once. ndx's
    # upload into the reused block waits for an event the deleter recorded on the
    # consumer's stream (the legacy one for the forms that name none).
    for form in ("STREAM", "VERSIONED", "LEGACY"):
        assert f"{form} REUSED True READ ORIGINAL Y True" in out, out
    # The control: with NDX_STREAM_NO_SYNC the consumer must call the deleter only
    # once its work is done; called early, the upload overwrites what the kernel reads.
    assert "NO_SYNC REUSED True READ OTHER Y True" in out, out


REEXPORT = textwrap.dedent(
    """\
    import ctypes
    import numpy as np
    import cuda_driver as cd
    import ndx_ctypes as ndx

    n = 256
    cu = cd.Context()
    add = cu.load_ptx("src/cuda/ptx/binary.ptx").function("ndx_add_f32")
    values = np.arange(n, dtype=np.float32)
    lent, sums = cu.upload(values), cu.alloc(4 * n)
    consumer = cu.stream()
    idle = []

    def deleter(p):  # the producer's: would free or reuse `lent`
        idle.append(cd._driver().cuStreamQuery(consumer.handle) == 0)

    m = ndx.DLManagedTensorVersioned()
    shape = (ctypes.c_int64 * 1)(n)
    m.version.major = 1
    m.dl_tensor.data = lent.ptr
    m.dl_tensor.device.device_type, m.dl_tensor.device.device_id = 2, 0
    m.dl_tensor.ndim, m.dl_tensor.shape = 1, shape
    m.dl_tensor.dtype.code, m.dl_tensor.dtype.bits, m.dl_tensor.dtype.lanes = 2, 32, 1
    m.deleter = ndx.DLManagedTensorVersionedDeleter(deleter)
    opts = ndx.ndx_import_options_t(ctypes.sizeof(ndx.ndx_import_options_t), None, False, ndx.STREAM_NO_SYNC)
    t = ctypes.c_void_p()
    ndx.check(ndx.lib.ndx_tensor_from_dlpack_versioned(ctypes.addressof(m), ctypes.byref(opts), ctypes.byref(t)))
    t = ndx.Tensor(t.value)
    out = ctypes.c_void_p()
    ndx.check(ndx.lib.ndx_tensor_to_dlpack_versioned_stream(t.ptr, consumer.handle.value, ctypes.byref(out)))
    t.release()  # the export holds the import now
    e = ndx.DLManagedTensorVersioned.from_address(out.value)
    # The consumer reads it on its stream, its kernel late, and drops its tensor at once:
    # ndx holds no other reference, so the producer's deleter runs.
    cu.launch(add, 1, 256, [sums, lent, lent, n, 0, 0], stream=consumer)
    e.deleter(ctypes.cast(out.value, ctypes.POINTER(type(e))))
    print("DELETED", len(idle), "CONSUMER_IDLE", idle)
    consumer.synchronize()
    print("SUMS", bool(np.array_equal(cu.download(sums, (n,), np.float32), 2 * values)))
    """
)


def test_a_reexported_imports_producer_deleter_waits_for_the_consumer(tmp_path):
    out = run_script(tmp_path, "reexport.py", REEXPORT, NDX_EMU_KERNEL_DELAY_MS="1000")
    # The producer's deleter may free the memory: it runs once the consumer's late
    # kernel that reads it is done, not when the consumer dropped its tensor.
    assert "DELETED 1 CONSUMER_IDLE [True]" in out, out
    assert "SUMS True" in out, out


BATCH_IMPORT = textwrap.dedent(
    """\
    import ctypes
    import time
    import numpy as np
    import cuda_driver as cd
    import ndx_ctypes as ndx

    cu = cd.Context()
    lib = ndx.lib
    P = ctypes.c_void_p
    for name, args in {
        "ndx_batch_from_dlpack_versioned": [P, ctypes.c_size_t, P, ctypes.POINTER(P)],
        "ndx_future_batch": [P, ctypes.c_size_t, ctypes.POINTER(P)],
        "ndx_batch_sample": [P, ctypes.c_size_t, ctypes.POINTER(P)],
        "ndx_batch_device": [P, ctypes.POINTER(ndx.DLDevice)],
    }.items():
        getattr(lib, name).argtypes, getattr(lib, name).restype = args, P
    lib.ndx_batch_release.argtypes, lib.ndx_batch_release.restype = [P], None

    # Three samples of different lengths in device memory, imported as one batch.
    sizes = [5, 17, 300]
    bufs = [cu.upload(np.arange(n, dtype=np.float32) + 100 * i) for i, n in enumerate(sizes)]
    deleted = []
    deleter = ndx.DLManagedTensorVersionedDeleter(lambda p: deleted.append(1))
    keep, arr = [], (P * 3)()
    for i, (b, n) in enumerate(zip(bufs, sizes)):
        m = ndx.DLManagedTensorVersioned()
        shape = (ctypes.c_int64 * 1)(n)
        m.version.major, m.deleter = 1, deleter
        m.dl_tensor.data = b.ptr
        m.dl_tensor.device.device_type = 2
        m.dl_tensor.ndim, m.dl_tensor.shape = 1, shape
        m.dl_tensor.dtype.code, m.dl_tensor.dtype.bits, m.dl_tensor.dtype.lanes = 2, 32, 1
        keep.append((m, shape))
        arr[i] = ctypes.addressof(m)
    batch = P()
    ndx.check(lib.ndx_batch_from_dlpack_versioned(arr, 3, None, ctypes.byref(batch)))
    """
)

BATCH = BATCH_IMPORT + textwrap.dedent(
    """\
    ctx = ndx.Context(mode=ndx.NDX_EVAL_EAGER)
    two = ctx.invoke("to_device", [np.array(2.0, dtype=np.float32)]).tensor()
    ins = (ndx.ndx_input_t * 2)()
    ins[0].batch, ins[1].tensor = batch, two.ptr
    fut = P()
    ndx.check(lib.ndx_invoke(ctx.ptr, b"mul", ins, 2, None, None, ctypes.byref(fut)))
    f = ndx.Future(fut.value)
    out = P()
    ndx.check(lib.ndx_future_batch(f.ptr, 0, ctypes.byref(out)))
    dev = ndx.DLDevice()
    ndx.check(lib.ndx_batch_device(out, ctypes.byref(dev)))
    print("DEVICE", dev.device_type, dev.device_id)
    for i, n in enumerate(sizes):
        s = P()
        ndx.check(lib.ndx_batch_sample(out, i, ctypes.byref(s)))
        got = ctx.invoke("to_host", [ndx.Tensor(s.value)]).result()
        print("SAMPLE", i, bool(np.array_equal(got, 2 * (np.arange(n, dtype=np.float32) + 100 * i))))
    lib.ndx_batch_release(out)
    lib.ndx_batch_release(batch)
    f.release()
    two.release()
    ctx.release()
    print("DELETED", len(deleted))
    """
)


def test_a_batch_of_cuda_samples_runs_per_sample_on_the_device(tmp_path):
    out = run_script(tmp_path, "batch.py", BATCH, NDX_EMU_KERNEL_DELAY_MS="5")
    assert "DEVICE 2 0" in out, out
    for i in range(3):
        assert f"SAMPLE {i} True" in out, out
    assert "DELETED 3" in out, out


BATCH_PIPELINE = BATCH_IMPORT + textwrap.dedent(
    """\
    emu = ctypes.CDLL("libcuda.so.1")  # the emulated driver ndx loaded
    emu.ndx_emu_launch_count.restype, emu.ndx_emu_launch_count.argtypes = ctypes.c_uint64, []
    ctx = ndx.Context(mode=ndx.NDX_EVAL_EAGER)
    up = ctx.invoke("to_device", [np.array(2.0, dtype=np.float32)])
    up.wait()  # a copy: no kernel delay
    two = up.tensor()

    def batch_op(op, b):
        ins = (ndx.ndx_input_t * 2)()
        ins[0].batch, ins[1].tensor = b, two.ptr
        fut = P()
        ndx.check(lib.ndx_invoke(ctx.ptr, op.encode(), ins, 2, None, None, ctypes.byref(fut)))
        f = ndx.Future(fut.value)
        out = P()
        ndx.check(lib.ndx_future_batch(f.ptr, 0, ctypes.byref(out)))
        return f, out

    before = emu.ndx_emu_launch_count()
    f1, b1 = batch_op("mul", batch)  # a kernel per sample, each 300 ms late
    f2, b2 = batch_op("add", b1)     # reads the mul's samples before they exist
    t0 = time.monotonic()
    while emu.ndx_emu_launch_count() - before < 6 and time.monotonic() - t0 < 10:
        time.sleep(0.005)
    print("LAUNCHED", emu.ndx_emu_launch_count() - before, f1.poll() == ndx.NDX_FUTURE_PENDING)
    for i, n in enumerate(sizes):
        s = P()
        ndx.check(lib.ndx_batch_sample(b2, i, ctypes.byref(s)))
        got = ctx.invoke("to_host", [ndx.Tensor(s.value)]).result()
        want = 2 * (np.arange(n, dtype=np.float32) + 100 * i) + 2
        print("SAMPLE", i, bool(np.array_equal(got, want)))
    for b in (b1, b2, batch):
        lib.ndx_batch_release(b)
    """
)


def test_eager_batch_invocations_on_the_gpu_are_pipelined(tmp_path):
    # The add's per-sample kernels are launched while the mul's are still queued: a
    # batch consumer reads its producer's launched samples, as a tensor consumer does.
    # Waiting for the mul to complete would launch the add's kernels only once the
    # mul's future is ready.
    out = run_script(tmp_path, "batch_pipeline.py", BATCH_PIPELINE,
                     NDX_EMU_KERNEL_DELAY_MS="300")
    assert "LAUNCHED 6 True" in out, out
    for i in range(3):
        assert f"SAMPLE {i} True" in out, out
