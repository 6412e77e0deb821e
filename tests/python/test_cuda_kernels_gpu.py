"""The committed PTX (src/cuda/ptx/*.ptx) run on a real GPU through the CUDA driver.

The same kernels, inputs and references as the host emulation of
tests/python/test_cuda_ptx.py (whose helpers this module imports), but JIT-compiled
by the driver and launched with cuLaunchKernel exactly as src/cuda/kernels/ABI.md
says (parameter lists, struct layouts, 1-D launch shapes, temp sizes, flag records),
through the ctypes wrapper tests/python/cuda_driver.py. No CuPy, PyTorch or CUDA
toolkit: only libcuda.so.1. It does not use libndx.

Always run (no GPU needed): the ABI struct mirrors' sizes and offsets, the
kernelParams packing, and every kernel's parameter list as launched here against
the `.param` declarations of its PTX `.entry`.

GPU tests skip, with the reason, when the driver is unavailable (no libcuda.so.1,
cuInit fails, no device, or NDX_CUDA_DISABLE=1); NDX_REQUIRE_CUDA=1 makes them fail
instead. On a GPU they check: every .entry resolves; binary (compact and broadcast,
every op and dtype, flags), cast (all pairs), reductions (two passes with ABI.md's
chunk rule and exact temp sizes, up to 2^24 elements), normalize, resize (linear,
nearest, u8 area2; OpenCV when importable), checks; and that the grid and block sizes
do not change any result. Outputs and temp buffers are allocated with a poisoned
guard tail that must survive (no write out of bounds), and outputs start poisoned
(every element must be written).

Run: python3 -m pytest -q -rs tests/python/test_cuda_kernels_gpu.py
(tests/python/conftest.py imports ndx_ctypes, which needs libndx.so; where it is not
built add --noconftest: this module uses no fixture of conftest.py.)
"""

from __future__ import annotations

import ctypes
import math
import os
import re
import sys
from functools import partial

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cuda_driver as cd  # noqa: E402
import test_cuda_ptx as ref  # noqa: E402  (references and cases; needs neither NVRTC nor g++)

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")

DT, FLOATS, U64_MAX = ref.DT, ref.FLOATS, ref.U64_MAX
need_bf16, rng_for, sample, assert_same, flag_of = ref.need_bf16, ref.rng_for, ref.sample, ref.assert_same, ref.flag_of
PTX_FILES = sorted(f for f in os.listdir(ref.PTX_DIR) if f.endswith(".ptx"))
BLOCK = 256  # ABI.md: use 256
GUARD = 256  # poisoned bytes after every output / temp buffer
POISON = 0xA5
OPS = ["add", "sub", "mul", "div"]

# --------------------------------------------------------------------------- signatures
# Every kernel's parameter list (ABI.md), as ctypes types. Pointers and u64 are both
# c_uint64. Used to launch, and checked against the PTX below.

P = U64 = ctypes.c_uint64
F64 = ctypes.c_double


def signature(name):
    if name == "ndx_flags_reset":
        return [P, U64]
    if name == "ndx_check_bool" or name.startswith("ndx_check_finite_"):
        return [P, U64, P]
    if name.startswith("ndx_check_range_"):
        return [P, U64, F64, F64, P]
    if name.startswith("ndx_cast_"):
        return [P, P, U64]
    if name.startswith("ndx_normalize_"):
        return [P, P, U64, U64, U64, P, P, U64]
    if name.startswith("ndx_resize_"):
        return [P, P, cd.NdxResizeGeom]
    if re.fullmatch(r"ndx_(sum|mean|max)_\w+_(partial|final)", name):
        return [P, P, U64, U64, U64, U64]
    m = re.fullmatch(r"ndx_(add|sub|mul|div)_(f32|f16|bf16|u8|i32)(_bcast)?", name)
    if m:
        return [P, P, P, U64] + ([cd.NdxBcast2] if m.group(3) else []) + [P, P]
    raise KeyError(f"no signature for {name}")


def ptx_params(path):
    """{entry: [(ptx type, size, alignment)]} from a PTX file's `.entry` declarations."""
    text = open(path).read()
    scalar = {"u64": 8, "s64": 8, "b64": 8, "f64": 8, "u32": 4, "s32": 4, "b32": 4, "f32": 4}
    out = {}
    for name, body in re.findall(r"^\.visible \.entry (\w+)\((.*?)\)\s*\{", text, re.M | re.S):
        params = []
        for decl in filter(None, (d.strip() for d in body.split(","))):
            m = re.fullmatch(r"\.param \.(\w+) \w+", decl)
            if m:
                params.append((m.group(1), scalar[m.group(1)], scalar[m.group(1)]))
                continue
            m = re.fullmatch(r"\.param \.align (\d+) \.b8 \w+\[(\d+)\]", decl)
            assert m, f"{name}: unexpected parameter {decl!r}"
            params.append(("b8", int(m.group(2)), int(m.group(1))))
        out[name] = params
    return out


def expected_param(t):
    if issubclass(t, ctypes.Structure):
        return ("b8", ctypes.sizeof(t), ctypes.alignment(t))
    return ({ctypes.c_uint64: "u64", ctypes.c_double: "f64", ctypes.c_uint32: "u32"}[t], ctypes.sizeof(t), ctypes.sizeof(t))


# --------------------------------------------------------------------------- no GPU needed


def test_struct_layouts_match_abi_doc():
    B, G, F = cd.NdxBcast2, cd.NdxResizeGeom, cd.NdxFlag
    assert ctypes.sizeof(B) == 200 and ctypes.alignment(B) == 8
    assert [getattr(B, f).offset for f in ("ndim", "reserved", "shape", "a_strides", "b_strides")] == [0, 4, 8, 72, 136]
    assert ctypes.sizeof(G) == 48 and ctypes.alignment(G) == 8
    assert [getattr(G, f).offset for f in ("planes", "in_h", "in_w", "c", "out_h", "out_w")] == [0, 8, 16, 24, 32, 40]
    assert ctypes.sizeof(F) == 16 and ctypes.alignment(F) == 8
    assert (F.count.offset, F.first_index.offset) == (0, 8)
    # The emulation tests' mirrors agree.
    for mine, theirs in ((B, ref.Bcast2), (G, ref.ResizeGeom)):
        assert ctypes.sizeof(mine) == ctypes.sizeof(theirs)
        assert [getattr(mine, f).offset for f, _ in mine._fields_] == [getattr(theirs, f).offset for f, _ in theirs._fields_]


def test_kernel_params_packing():
    p = cd.NdxBcast2()
    p.ndim, p.shape[0], p.a_strides[1], p.b_strides[7] = 3, 4, -5, 6
    kp = cd.pack_params([0x7F0000001000, 3, 1.5, ctypes.c_uint32(7), p, None, U64_MAX])
    assert len(kp) == 7 and kp.sizes() == [8, 8, 8, 4, 200, 8, 8]
    arr = kp.array
    read = lambda i, t: ctypes.cast(arr[i], ctypes.POINTER(t)).contents.value  # noqa: E731
    assert read(0, ctypes.c_uint64) == 0x7F0000001000
    assert read(1, ctypes.c_uint64) == 3
    assert read(2, ctypes.c_double) == 1.5
    assert read(3, ctypes.c_uint32) == 7
    assert ctypes.string_at(arr[4], 200) == bytes(p)
    got = cd.NdxBcast2.from_buffer_copy(ctypes.string_at(arr[4], 200))
    assert (got.ndim, got.shape[0], got.a_strides[1], got.b_strides[7]) == (3, 4, -5, 6)
    assert read(5, ctypes.c_uint64) == 0 and read(6, ctypes.c_uint64) == U64_MAX
    for bad in (-1, 1 << 64, True, "x"):
        with pytest.raises((TypeError, ValueError)):
            cd.pack_params([bad])
    assert len(cd.pack_params([])) == 0


def test_launch_signatures_match_ptx_params():
    """What this module passes to each kernel (ABI.md's lists) against the `.param`
    list of its PTX `.entry`: count, kind, size and alignment."""
    doc = ref.abi_entries()
    for f in PTX_FILES:
        params = ptx_params(os.path.join(ref.PTX_DIR, f))
        assert sorted(params) == sorted(doc[f]), f
        for name, plist in params.items():
            want = [expected_param(t) for t in signature(name)]
            assert plist == want, f"{f}: {name}: PTX {plist} vs launched {want}"


def test_unavailable_driver_reports_a_reason():
    ok, why = cd.available()
    assert isinstance(ok, bool) and isinstance(why, str)
    assert ok or why


# --------------------------------------------------------------------------- GPU fixture


class Dev:
    """A device array: `ptr`, shape, dtype; `nbytes` of data then GUARD poisoned bytes."""

    def __init__(self, buf, shape, dtype):
        self.buf, self.shape, self.dtype = buf, tuple(shape), np.dtype(dtype)
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        self.ptr = buf.ptr


class Gpu:
    def __init__(self):
        self.ctx = cd.Context(0)
        self.stream = self.ctx.stream()
        self.modules = {f: self.ctx.load_ptx(os.path.join(ref.PTX_DIR, f)) for f in PTX_FILES}
        self.owner = {n: f for f, names in ref.abi_entries().items() for n in names}

    def close(self):
        for m in self.modules.values():
            m.unload()
        self.stream.destroy()
        self.ctx.close()

    def function(self, name):
        return self.modules[self.owner[name]].function(name)

    # memory
    def empty(self, shape, dtype):
        shape = (shape,) if isinstance(shape, int) else shape
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        buf = self.ctx.alloc(nbytes + GUARD)
        self.ctx.memset8(buf, POISON, nbytes + GUARD)
        return Dev(buf, shape, dtype)

    def put(self, a):
        a = np.asarray(a, order="C")  # keeps 0-d arrays 0-d
        d = self.empty(a.shape, a.dtype)
        self.ctx.htod(d.buf, a)
        return d

    def get(self, d):
        raw = self.ctx.download(d.buf, (d.nbytes + GUARD,), np.uint8)
        tail = raw[d.nbytes:]
        assert (tail == POISON).all(), f"write past the end: guard byte {int(np.flatnonzero(tail != POISON)[0])}"
        return raw[: d.nbytes].view(d.dtype).reshape(d.shape)

    def flags(self, k=1):
        return self.put(np.array([[0, U64_MAX]] * k, np.uint64))

    def flag_values(self, d):
        return [tuple(int(v) for v in rec) for rec in self.get(d)]

    # launches
    def launch(self, name, work, *args, grid=None, block=BLOCK):
        """Launches `name` with ABI.md's shape for thread work `work` (or `grid`),
        then synchronises."""
        sig = signature(name)
        assert len(args) == len(sig), f"{name}: {len(args)} arguments for {len(sig)} parameters"
        params = []
        for t, a in zip(sig, args):
            if isinstance(a, Dev):
                a = a.ptr
            if issubclass(t, ctypes.Structure):
                assert isinstance(a, ctypes.Structure) and ctypes.sizeof(a) == ctypes.sizeof(t), (name, a)
                params.append(t.from_buffer_copy(bytes(a)))
            elif t is F64:
                params.append(F64(float(a)))
            else:
                v = cd.to_ctypes(a)
                assert isinstance(v, ctypes.c_uint64), (name, a)
                params.append(v)
        if grid is None:
            assert work > 0, f"{name}: no launch for empty work"
            grid = min(-(-work // block), 65535)
        self.ctx.launch(self.function(name), grid, block, params, self.stream)
        self.stream.synchronize()


@pytest.fixture(scope="module")
def gpu():
    ok, why = cd.available()
    if not ok:
        msg = f"no usable CUDA driver: {why}"
        if os.environ.get("NDX_REQUIRE_CUDA") == "1":
            pytest.fail(msg + " (NDX_REQUIRE_CUDA=1)")
        pytest.skip(msg)
    g = Gpu()
    yield g
    g.close()


@pytest.fixture
def g(gpu):
    """The module's Gpu; buffers allocated by the test are freed after it."""
    with gpu.ctx.scope():
        yield gpu


# --------------------------------------------------------------------------- modules


def test_gpu_modules_load_and_every_entry_resolves(g):
    doc = ref.abi_entries()
    for f in PTX_FILES:
        found = ref.ptx_entries(os.path.join(ref.PTX_DIR, f))
        assert sorted(found) == sorted(doc[f])
        for name in found:
            assert g.function(name).handle
    with pytest.raises(cd.CudaError) as e:
        g.modules["cast.ptx"].function("ndx_cast_f32_f64")
    assert e.value.name == "CUDA_ERROR_NOT_FOUND", e.value
    print(f"{g.ctx.name} cc {g.ctx.compute_capability} driver {g.ctx.driver_version}")


# --------------------------------------------------------------------------- binary


def run_binary_compact(g, name, a, b, watch=True, grid=None, block=BLOCK):
    n = a.size
    da, db, out = g.put(a), g.put(b), g.empty(n, a.dtype)
    fl = g.flags(2)
    nanp, divp = (fl.ptr, fl.ptr + 16) if watch else (None, None)
    g.launch(name, n, out, da, db, n, nanp, divp, grid=grid, block=block)
    return g.get(out), g.flag_values(fl)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dt", list(DT))
def test_gpu_binary_compact(g, op, dt):
    need_bf16(dt)
    rng = rng_for(("gpu", op, dt))
    n = (1 << 17) + 3
    a, b = sample(rng, dt, n), sample(rng, dt, n)
    if op == "div":
        b[::17] = 0
    want, zero = ref.ref_binary(op, dt, a, b)
    for watch in (True, False):
        out, (nanf, divf) = run_binary_compact(g, f"ndx_{op}_{dt}", a, b, watch)
        assert_same(out, want, f"{op} {dt}")
        if not watch:
            assert nanf == divf == cd.FLAG_RESET
            continue
        if dt in FLOATS:
            want_nan = flag_of(~ref.is_finite(want) & ref.is_finite(a) & ref.is_finite(b))
        else:
            want_nan = cd.FLAG_RESET
        assert nanf == want_nan, f"{op} {dt} nan flag"
        assert divf == (flag_of(zero) if op == "div" else cd.FLAG_RESET), f"{op} {dt} div flag"


def test_gpu_integer_division_edges(g):
    a = np.array([7, -7, 7, -7, -(2**31), -(2**31), 5, 0, -1, 6], np.int32)
    b = np.array([2, 2, -2, -2, -1, 1, 0, 0, 3, -4], np.int32)
    out, (_, divf) = run_binary_compact(g, "ndx_div_i32", a, b)
    assert out.tolist() == [3, -4, -4, 3, -(2**31), -(2**31), 0, 0, -1, -2]
    assert divf == (2, 6)
    out, (_, divf) = run_binary_compact(g, "ndx_div_u8", np.array([200, 7, 255], np.uint8), np.array([3, 0, 255], np.uint8))
    assert out.tolist() == [66, 0, 1] and divf == (1, 1)


def bcast_views(rng, dt, case):
    """(base_a, view a, base_b, view b, output shape): views of compact bases."""
    if case == "small":  # the emulation's: a negative stride and a broadcast dim
        ba = sample(rng, dt, 20).reshape(4, 1, 5)
        bb = sample(rng, dt, 18).reshape(6, 3)
        return ba, ba[:, :, ::-1], bb, bb[::2, :1], (4, 3, 5)
    if case == "large":
        ba = sample(rng, dt, 8 * 40 * 30).reshape(8, 1, 40, 30)
        bb = sample(rng, dt, 5 * 40).reshape(5, 40)
        return ba, ba[:, :, ::-2, :], bb, bb[:, ::2, None], (8, 5, 20, 30)
    if case == "ndim8":
        ba = sample(rng, dt, 2 * 3 * 2 * 2 * 3 * 2).reshape(2, 1, 3, 1, 2, 2, 3, 2)
        bb = sample(rng, dt, 2 * 3 * 2 * 4).reshape(1, 2, 1, 3, 1, 2, 1, 4)
        return ba, ba[..., ::-1, :1], bb, bb[..., ::-3], (2, 2, 3, 3, 2, 2, 3, 2)
    if case == "scalar_a":
        ba, bb = sample(rng, dt, 1), sample(rng, dt, 6).reshape(2, 3)
        return ba, ba.reshape(()), bb, bb.T, (3, 2)
    if case == "0d":
        ba, bb = sample(rng, dt, 1), sample(rng, dt, 1)
        return ba, ba.reshape(()), bb, bb.reshape(()), ()
    raise KeyError(case)


def addr(a):
    return a.__array_interface__["data"][0]


def run_binary_bcast(g, name, base_a, av, base_b, bv, shape, grid=None, block=BLOCK):
    da, db = g.put(base_a), g.put(base_b)
    pa, pb = da.ptr + addr(av) - addr(base_a), db.ptr + addr(bv) - addr(base_b)  # the views' origins
    n = int(np.prod(shape, dtype=np.int64))
    out, fl = g.empty(shape, base_a.dtype), g.flags(2)
    p = ref.bcast_params(av, bv, shape)
    g.launch(name, n, out, pa, pb, n, p, fl.ptr, fl.ptr + 16, grid=grid, block=block)
    return g.get(out), g.flag_values(fl)


@pytest.mark.parametrize("case", ["small", "large", "ndim8", "scalar_a", "0d"])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dt", list(DT))
def test_gpu_binary_broadcast(g, dt, op, case):
    need_bf16(dt)
    rng = rng_for(("gpu-bcast", op, dt, case))
    base_a, av, base_b, bv, shape = bcast_views(rng, dt, case)
    if op == "div" and case == "large":
        base_b[:, 4] = 0
    ab, bb = np.broadcast_arrays(av, bv)
    assert ab.shape == shape
    want, zero = ref.ref_binary(op, dt, ab, bb)
    out, (nanf, divf) = run_binary_bcast(g, f"ndx_{op}_{dt}_bcast", base_a, av, base_b, bv, shape)
    assert_same(out, np.asarray(want, order="C"), f"{op} {dt} bcast {case}")
    assert divf == (flag_of(zero) if op == "div" else cd.FLAG_RESET), f"{op} {dt} {case} div flag"
    if dt in FLOATS:
        assert nanf == flag_of(~ref.is_finite(want) & ref.is_finite(ab) & ref.is_finite(bb)), f"{op} {dt} {case} nan flag"
    else:
        assert nanf == cd.FLAG_RESET


# --------------------------------------------------------------------------- cast


def run_cast(g, name, x, out_dtype, grid=None, block=BLOCK):
    dx, out = g.put(x), g.empty(x.size, out_dtype)
    g.launch(name, x.size, out, dx, x.size, grid=grid, block=block)
    return g.get(out)


@pytest.mark.parametrize("d", list(DT) + ["bool"])
@pytest.mark.parametrize("s", list(DT))
def test_gpu_cast(g, s, d):
    ref.case_cast(partial(run_cast, g), s, d, rng_for(("gpu-cast", s, d)), 5000, infs_and_zeros=True)


def test_gpu_cast_u8_bool_normalises(g):
    x = np.arange(256, dtype=np.uint8)
    assert run_cast(g, "ndx_cast_u8_bool", x, np.uint8).tolist() == [0] + [1] * 255


# --------------------------------------------------------------------------- reductions


def partial_dtype(op, dt):
    return DT[dt] if op == "max" else (np.dtype(np.float64) if dt in FLOATS else np.dtype(np.uint64))


def out_dtype(op, dt):
    if op == "sum":
        return DT[dt] if dt in FLOATS else np.dtype(np.uint64 if dt == "u8" else np.int64)
    if op == "mean":
        return DT[dt] if dt in FLOATS else np.dtype(np.float64)
    return DT[dt]


def run_reduce(g, op, dt, x, outer, r, inner, chunk, grid=None, block=BLOCK, dx=None):
    """The two passes of ABI.md; the temp buffer is exactly outer * nchunks * inner
    elements of P (followed by the guard, checked afterwards)."""
    nchunks = 0 if r == 0 else -(-r // chunk)
    dx = g.put(x) if dx is None else dx
    args = (outer, r, inner, chunk)
    partial = None
    if r > 0:
        partial = g.empty(outer * nchunks * inner, partial_dtype(op, dt))
        w = 32 * outer * nchunks if (inner == 1 and chunk >= 32) else outer * nchunks * inner
        g.launch(f"ndx_{'max' if op == 'max' else 'sum'}_{dt}_partial", w, partial, dx, *args, grid=grid, block=block)
    out = g.empty((outer, inner), out_dtype(op, dt))
    g.launch(f"ndx_{op}_{dt}_final", 32 * outer * inner, out, partial, *args, grid=grid, block=block)
    if partial is not None:
        g.get(partial)  # the guard after the temp buffer
    return g.get(out)


def test_gpu_chunk_rule():
    assert ref.chunk_rule(1, 1 << 24, 1) == 2048
    assert ref.chunk_rule(4, 4096, 1024) == 256
    assert ref.chunk_rule(3, 5_000_001, 1) == 1831  # ragged: 2731 chunks


@pytest.mark.parametrize(
    "op,shape", ref.REDUCE_CASES, ids=lambda v: v if isinstance(v, str) else "x".join(map(str, v))
)
@pytest.mark.parametrize("dt", list(DT))
def test_gpu_reduce(g, dt, op, shape):
    ref.case_reduce(partial(run_reduce, g), dt, op, shape)  # the emulation test's inputs


@pytest.mark.parametrize("dt", FLOATS)
def test_gpu_reduce_real_values_and_nan(g, dt):
    ref.case_reduce_real_values_and_nan(partial(run_reduce, g), dt, sum_nan_stays_in_its_row=True)


LARGE_REDUCE = [
    ("f32", (1, 1 << 24, 1)),  # full reduction, warp mode: 8192 chunks of 2048
    ("f32", (4, 4096, 1024)),  # columns, thread mode: 16 chunks of 256
    ("f32", (3, 5_000_001, 1)),  # ragged chunks; a NaN in row 1
    ("f16", (1, 1 << 24, 1)),
    ("bf16", (4, 4096, 1024)),
    ("u8", (1, 1 << 24, 1)),
    ("u8", (3, 5_000_001, 1)),
    ("i32", (1, 1 << 24, 1)),
    ("i32", (4, 4096, 1024)),
]


def exact_round(values, dt):
    """Exact (integer or double) values rounded once to float dtype dt."""
    return ref.exact_to([v if isinstance(v, float) else int(v) for v in values], dt)


@pytest.mark.parametrize("dt,shape", LARGE_REDUCE, ids=lambda v: v if isinstance(v, str) else "x".join(map(str, v)))
def test_gpu_reduce_large(g, dt, shape):
    """Many chunks with ABI.md's rule; references exact (integer-valued floats sum
    exactly in double)."""
    need_bf16(dt)
    outer, r, inner = shape
    rng = rng_for(("gpu-large", dt, shape))
    n = outer * r * inner
    if dt in FLOATS:
        x = rng.integers(-100, 101, n, dtype=np.int32).astype(np.float32)
        if shape[1] == 5_000_001:
            x[r + 12345] = np.nan
        x = x.astype(DT[dt])
    elif dt == "u8":
        x = rng.integers(0, 256, n, dtype=np.uint8)
    else:
        x = rng.integers(-(2**31), 2**31, n, dtype=np.int64).astype(np.int32)
    x3 = x.reshape(outer, r, inner)
    chunk = ref.chunk_rule(outer, r, inner)
    dx = g.put(x)
    if dt in FLOATS:
        v = x3.astype(np.float64)
        s = v.sum(axis=1)  # integers below 2^53: exact in any order (NaN propagates)
        want_sum = exact_round([float(t) for t in s.ravel()], dt).reshape(outer, inner)
        want_mean = exact_round([float(t) / r for t in s.ravel()], dt).reshape(outer, inner)
        want_max = v.max(axis=1).astype(np.float32).astype(DT[dt])
    else:
        s = x3.astype(np.int64).sum(axis=1)  # below 2^55: no wrap
        want_sum = s.astype(np.uint64 if dt == "u8" else np.int64)
        want_mean = s.astype(np.float64) / r
        want_max = x3.max(axis=1)
    for op, want in (("sum", want_sum), ("mean", want_mean), ("max", want_max)):
        got = run_reduce(g, op, dt, None, outer, r, inner, chunk, dx=dx)
        assert_same(got, want, f"{op} {dt} {shape} chunk={chunk}")


# --------------------------------------------------------------------------- normalize


def run_normalize(g, dt, x, c, inner, mean, std, stride, grid=None, block=BLOCK):
    dx, dm, ds = g.put(x), g.put(np.asarray(mean, np.float64)), g.put(np.asarray(std, np.float64))
    out = g.empty(x.shape, np.float32)
    g.launch(f"ndx_normalize_{dt}", x.size, out, dx, x.size, c, inner, dm, ds, stride, grid=grid, block=block)
    return g.get(out)


@pytest.mark.parametrize("size", [(5, 7, 3), (224, 224, 3)], ids=["5x7x3", "224x224x3"])
@pytest.mark.parametrize("layout", ["HWC", "CHW"])
@pytest.mark.parametrize("dt", list(DT))
def test_gpu_normalize(g, dt, layout, size):
    rng = rng_for(("normalize", dt, layout) if size == (5, 7, 3) else ("gpu-normalize", dt, layout))
    ref.case_normalize(partial(run_normalize, g), dt, layout, size, rng, f"normalize {dt} {layout} {size}")


# --------------------------------------------------------------------------- resize


def run_resize(g, kernel, img, oh, ow, grid=None, block=BLOCK):
    planes, ih, iw, c = img.shape
    dx, out = g.put(img), g.empty((planes, oh, ow, c), img.dtype)
    geom = cd.NdxResizeGeom(planes, ih, iw, c, oh, ow)
    g.launch(kernel, planes * oh * ow * c, out, dx, geom, grid=grid, block=block)
    return g.get(out)


RESIZE_CASES = ref.RESIZE_CASES + [(480, 640, 224, 224), (100, 160, 300, 333)]


@pytest.mark.parametrize("case", RESIZE_CASES, ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("dt", list(DT))
def test_gpu_resize(g, dt, case):
    ref.case_resize(partial(run_resize, g), dt, case, nearest_names_planes=True)


def ref_area2(img):
    """Each 2 x 2 block's mean, rounded half to even. img: planes x H x W x C."""
    p, h, w, c = img.shape
    s = img.astype(np.int64).reshape(p, h // 2, 2, w // 2, 2, c).sum(axis=(2, 4))
    return np.rint(s / 4).astype(np.uint8)


@pytest.mark.parametrize("c", [2, 5, 6])
def test_gpu_resize_area2_u8(g, c):
    rng = np.random.default_rng(100 + c)
    for planes, ih, iw in ((1, 30, 40), (2, 480, 640), (1, 2, 2)):
        img = rng.integers(0, 256, (planes, ih, iw, c), dtype=np.uint8)
        # Exact ties in the first block: sums 2, 6, 10 (means 0.5, 1.5, 2.5 -> 0, 2, 2).
        for k, s in enumerate((2, 6, 10)):
            img[0, 0:2, 0:2, k % c] = np.array([[s // 2, s - s // 2], [0, 0]], np.uint8)
        got = run_resize(g, "ndx_resize_area2_u8", img, ih // 2, iw // 2)
        assert_same(got, ref_area2(img), f"area2 c={c} {ih}x{iw}")


def test_gpu_resize_u8_against_opencv(g):
    cases = ref.RESIZE_CASES + [(100, 160, 37, 224), (480, 640, 224, 224)]
    ref.case_resize_u8_against_opencv(partial(run_resize, g), cases)


@pytest.mark.parametrize("c", [1, 2, 3, 4, 5])
def test_gpu_resize_u8_halving_equals_opencv(g, c):
    ref.case_resize_u8_halving_equals_opencv(partial(run_resize, g), c)


# --------------------------------------------------------------------------- checks


def test_gpu_flags_reset(g):
    f = g.put(np.arange(10, dtype=np.uint64).reshape(5, 2) + 5)
    g.launch("ndx_flags_reset", 4, f, 4)
    assert g.flag_values(f) == [cd.FLAG_RESET] * 4 + [(13, 14)]
    big = g.put(np.ones((70000, 2), np.uint64))
    g.launch("ndx_flags_reset", 70000, big, 70000)
    assert (g.get(big) == np.array([0, U64_MAX], np.uint64)).all()


def run_check(g, name, dx, n, *extra, fl=None, grid=None, block=BLOCK):
    fl = g.flags() if fl is None else fl
    g.launch(name, n, dx, n, *extra, fl, grid=grid, block=block)
    return fl


@pytest.mark.parametrize("dt", FLOATS)
def test_gpu_check_finite(g, dt):
    need_bf16(dt)
    rng = np.random.default_rng(3)
    n = (1 << 20) + 5
    x = rng.normal(0, 1, n).astype(np.float32).astype(DT[dt])
    assert g.flag_values(run_check(g, f"ndx_check_finite_{dt}", g.put(x), n)) == [cd.FLAG_RESET]
    bad = [n - 1, 4000, 17, 999, 700000]
    x[bad] = np.array([np.nan, np.inf, np.nan, -np.inf, np.inf], np.float32).astype(DT[dt])
    dx = g.put(x)
    fl = run_check(g, f"ndx_check_finite_{dt}", dx, n)
    assert g.flag_values(fl) == [(5, 17)]
    # Records accumulate across launches; indices are relative to each launch.
    off = 100
    run_check(g, f"ndx_check_finite_{dt}", dx.ptr + off * x.itemsize, n - off, fl=fl)
    assert g.flag_values(fl) == [(9, 17)]
    fl2 = run_check(g, f"ndx_check_finite_{dt}", dx.ptr + off * x.itemsize, n - off)
    assert g.flag_values(fl2) == [(4, 999 - off)]


@pytest.mark.parametrize("dt", list(DT))
def test_gpu_check_range(g, dt):
    need_bf16(dt)
    rng = np.random.default_rng(5)
    x = sample(rng, dt, 1 << 18)
    dx = g.put(x)
    v = x.astype(np.float64)
    for lo, hi in ((-10.0, 10.0), (-math.inf, math.inf), (0.0, 0.0), (3.5, 200.0), (1.0, -1.0)):
        fl = run_check(g, f"ndx_check_range_{dt}", dx, x.size, lo, hi)
        assert g.flag_values(fl) == [flag_of(~((v >= lo) & (v <= hi)))], (dt, lo, hi)


def test_gpu_check_bool(g):
    n = 1 << 20
    x = np.ones(n, np.uint8)
    x[[n - 1, 2999, 1500, 64]] = 0
    assert g.flag_values(run_check(g, "ndx_check_bool", g.put(x), n)) == [(4, 64)]
    assert g.flag_values(run_check(g, "ndx_check_bool", g.put(np.ones(n, np.uint8)), n)) == [cd.FLAG_RESET]


# --------------------------------------------------------------------------- determinism

SHAPES = [(None, BLOCK), (1, 32), (7, 64), (1000, 1024), (65535, 256)]  # (grid, block); None: ABI.md's


def test_gpu_results_do_not_depend_on_grid_or_block(g):
    """ABI.md: no result depends on G or B (outputs and flag records, bit for bit)."""
    rng = np.random.default_rng(42)
    n = 1 << 24
    xf = rng.normal(1, 3, n).astype(np.float32)  # real values: the sums round
    xf[[5, 777777]] = [np.inf, np.nan]
    x16 = rng.normal(0, 1e4, 1 << 20).astype(np.float16)
    y16 = rng.normal(0, 1, 1 << 20).astype(np.float16)
    y16[::31] = 0
    img = rng.integers(0, 256, (1, 480, 640, 3), dtype=np.uint8)
    imgf = rng.normal(0, 1, (3, 240, 320, 1)).astype(np.float32)
    base_a, av, base_b, bv, shape = bcast_views(rng_for("det"), "f32", "large")
    dxf = g.put(xf)

    def everything(grid, block):
        kw = dict(grid=grid, block=block)
        res = {}
        for op in ("sum", "mean", "max"):
            res[f"{op} full"] = run_reduce(g, op, "f32", None, 1, n, 1, ref.chunk_rule(1, n, 1), dx=dxf, **kw)
            res[f"{op} cols"] = run_reduce(g, op, "f32", None, 4, 4096, 1024, ref.chunk_rule(4, 4096, 1024), dx=dxf, **kw)
            res[f"{op} rows"] = run_reduce(g, op, "f32", None, 4096, 4096, 1, ref.chunk_rule(4096, 4096, 1), dx=dxf, **kw)
        res["div f16"] = run_binary_compact(g, "ndx_div_f16", x16, y16, **kw)
        res["mul bcast"] = run_binary_bcast(g, "ndx_mul_f32_bcast", base_a, av, base_b, bv, shape, **kw)
        res["cast"] = run_cast(g, "ndx_cast_f32_f16", xf[: 1 << 20], np.float16, **kw)
        res["normalize"] = run_normalize(g, "u8", img[0], 3, 1, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225], 1, **kw)
        res["resize u8"] = run_resize(g, "ndx_resize_linear_u8", img, 224, 224, **kw)
        res["resize f32"] = run_resize(g, "ndx_resize_linear_f32", imgf, 100, 333, **kw)
        res["finite"] = g.flag_values(run_check(g, "ndx_check_finite_f32", dxf, n, **kw))
        return res

    def same(a, b):
        if isinstance(a, np.ndarray):
            return a.shape == b.shape and ref.bits(a).tobytes() == ref.bits(b).tobytes()
        if isinstance(a, tuple):
            return all(same(p, q) for p, q in zip(a, b))
        return a == b

    first = everything(*SHAPES[0])
    assert first["finite"] == [(2, 5)]
    assert np.isnan(first["sum full"][0, 0]) and np.isnan(first["max full"][0, 0])
    for grid, block in SHAPES[1:]:
        got = everything(grid, block)
        for k in first:
            assert same(got[k], first[k]), f"{k}: grid={grid} block={block} differs from the default launch"
