"""The CUDA kernels (src/cuda/kernels/*.cu) and their committed PTX (src/cuda/ptx/).

No GPU is needed:
  - test_committed_ptx_is_in_sync: `scripts/build_ptx.py --check` recompiles every
    kernel with NVRTC (the pinned PyPI wheel) and passes;
  - test_check_fails_*: the checker does fail: on a compile error (naming the file
    and line), on a stale, a missing and an orphan PTX file;
  - test_ptx_entries_match_abi_doc: every PTX file declares exactly the `.entry`
    names listed for it in src/cuda/kernels/ABI.md;
  - test_emulated_*: the kernels' semantics, on the CPU: each .cu is compiled by g++
    with src/cuda/kernels/host_emulation.h (every GPU thread an OS thread, warp
    intrinsics behind a barrier) and its kernels are launched through ctypes with
    the parameter lists and struct layouts of ABI.md, then compared with NumPy,
    ml_dtypes, OpenCV and exact (fractions) references.

NVRTC tests skip when the wheel is not installed (`python3 -m pip install
"$(python3 scripts/build_ptx.py --requirement)"`) unless NDX_REQUIRE_NVRTC=1, which
makes them fail instead. The emulation tests skip without g++.

Run: python3 -m pytest -q tests/python/test_cuda_ptx.py
"""

from __future__ import annotations

import ctypes
import importlib.util
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import zlib
from fractions import Fraction
from functools import partial

import numpy as np
import pytest

# The references overflow to inf on purpose (float16, casts).
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "scripts", "build_ptx.py")
KERNELS = os.path.join(ROOT, "src", "cuda", "kernels")
PTX_DIR = os.path.join(ROOT, "src", "cuda", "ptx")
ABI_DOC = os.path.join(KERNELS, "ABI.md")

U64_MAX = (1 << 64) - 1


def build_ptx_module():
    spec = importlib.util.spec_from_file_location("ndx_build_ptx", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def nvrtc():
    """The build script's module, once NVRTC is known to load; else skip (or fail
    with NDX_REQUIRE_NVRTC=1)."""
    bp = build_ptx_module()
    path = bp.find_nvrtc()
    problem = None
    if path is None:
        problem = "NVRTC not found"
    else:
        try:
            bp.Nvrtc(path).version()
        except Exception as e:  # noqa: BLE001 - any load failure means "not usable"
            problem = f"NVRTC at {path} does not load: {e}"
    if problem:
        msg = f"{problem}; install it with: python3 -m pip install {bp.NVRTC_REQUIREMENT}"
        if os.environ.get("NDX_REQUIRE_NVRTC") == "1":
            pytest.fail(msg + " (NDX_REQUIRE_NVRTC=1)")
        pytest.skip(msg)
    return bp


def run_script(*args):
    return subprocess.run(
        [sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=600
    )


# ---------------------------------------------------------------------------
# The committed PTX and its checker


def test_committed_ptx_is_in_sync(nvrtc):
    r = run_script("--check")
    assert r.returncode == 0, f"build_ptx.py --check failed:\n{r.stdout}\n{r.stderr}"
    assert "in sync" in r.stdout


def copy_tree(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    shutil.copytree(KERNELS, src)
    shutil.copytree(PTX_DIR, out)
    return src, out


def break_line(path, old, new):
    """Replaces `old` by `new` on the first line of `path` holding it; its 0-based index."""
    lines = path.read_text().split("\n")
    at = next(i for i, l in enumerate(lines) if old in l)
    lines[at] = lines[at].replace(old, new)
    path.write_text("\n".join(lines))
    return at


def test_check_fails_on_a_compile_error_naming_file_and_line(nvrtc, tmp_path):
    src, out = copy_tree(tmp_path)
    cu = src / "binary.cu"
    at = break_line(cu, "return x + y;", "retrun x + y;")
    for mode in (["--check"], []):
        r = run_script("--src", str(src), "--out", str(out), *mode)
        assert r.returncode != 0, r.stdout + r.stderr
        where = f"{cu}:{at + 1}: error"
        assert where in r.stderr, f"expected {where!r} in:\n{r.stderr}"
        assert "retrun" in r.stderr
    # Nothing was written for the failed source.
    assert (out / "binary.ptx").read_bytes() == open(os.path.join(PTX_DIR, "binary.ptx"), "rb").read()


def test_check_fails_on_stale_ptx_naming_file_and_line(nvrtc, tmp_path):
    src, out = copy_tree(tmp_path)
    at = break_line(out / "cast.ptx", "cvt.f32.f16", "cvt.f32.bf16")
    r = run_script("--src", str(src), "--out", str(out), "--check")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "cast.ptx is out of date" in r.stderr
    assert f"first difference at line {at + 1}" in r.stderr, r.stderr
    assert "cvt.f32.bf16" in r.stderr
    # Writing mode repairs it, and the check passes again.
    assert run_script("--src", str(src), "--out", str(out)).returncode == 0
    r = run_script("--src", str(src), "--out", str(out), "--check")
    assert r.returncode == 0, r.stderr


def test_check_fails_when_a_source_changes(nvrtc, tmp_path):
    src, out = copy_tree(tmp_path)
    cu = src / "resize.cu"
    cu.write_text(cu.read_text().replace("v * 2048.0f", "v * 2047.0f"))
    r = run_script("--src", str(src), "--out", str(out), "--check")
    assert r.returncode == 1 and "resize.ptx is out of date" in r.stderr, r.stderr


def test_check_fails_on_missing_and_orphan_ptx(nvrtc, tmp_path):
    src, out = copy_tree(tmp_path)
    (out / "check.ptx").unlink()
    (out / "old.ptx").write_text("// stale\n")
    r = run_script("--src", str(src), "--out", str(out), "--check")
    assert r.returncode == 1
    assert "check.ptx is missing" in r.stderr, r.stderr
    assert "old.ptx has no source" in r.stderr, r.stderr


def test_requirement_is_pinned():
    r = run_script("--requirement")
    assert r.returncode == 0
    assert re.fullmatch(r"nvidia-cuda-nvrtc-cu12==12\.\d+\.\d+\n", r.stdout), r.stdout


def test_sources_include_no_cuda_header():
    for name in os.listdir(KERNELS):
        if not name.endswith((".cu", ".cuh")):
            continue
        text = open(os.path.join(KERNELS, name)).read()
        for inc in re.findall(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', text, re.M):
            assert inc == "ndx_common.cuh", f"{name} includes {inc}"


# ---------------------------------------------------------------------------
# Entry points against ABI.md


def abi_entries():
    text = open(ABI_DOC).read()
    blocks = re.findall(r"<!-- ndx-entries: (\S+) -->\s*```text\n(.*?)```", text, re.S)
    return {name: body.split() for name, body in blocks}


def ptx_entries(path):
    return re.findall(r"^\.visible \.entry (\w+)\(", open(path).read(), re.M)


def test_ptx_entries_match_abi_doc():
    doc = abi_entries()
    files = sorted(f for f in os.listdir(PTX_DIR) if f.endswith(".ptx"))
    sources = sorted(f[:-3] + ".ptx" for f in os.listdir(KERNELS) if f.endswith(".cu"))
    assert files == sources, f"PTX files {files} vs sources {sources}"
    assert sorted(doc) == files, f"ABI.md lists entries for {sorted(doc)}, PTX files are {files}"
    for f in files:
        listed = doc[f]
        assert len(listed) == len(set(listed)), f"{f}: duplicate names in ABI.md"
        found = ptx_entries(os.path.join(PTX_DIR, f))
        missing = sorted(set(listed) - set(found))
        extra = sorted(set(found) - set(listed))
        assert not missing, f"{f}: no .entry for {missing}"
        assert not extra, f"{f}: .entry not in ABI.md: {extra}"
        text = open(os.path.join(PTX_DIR, f)).read()
        assert ".target sm_70" in text and ".address_size 64" in text


def test_ptx_size_is_reasonable():
    total = sum(os.path.getsize(os.path.join(PTX_DIR, f)) for f in os.listdir(PTX_DIR))
    assert total < 3 * 1024 * 1024, f"{total} bytes of PTX"


# ---------------------------------------------------------------------------
# Host emulation: the kernels compiled for the CPU

GRID, BLOCK = 2, 64  # 128 threads: two blocks, four warps
u64, c_double, vp = ctypes.c_uint64, ctypes.c_double, ctypes.c_void_p


class Bcast2(ctypes.Structure):
    _fields_ = [
        ("ndim", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
        ("shape", ctypes.c_int64 * 8),
        ("a_strides", ctypes.c_int64 * 8),
        ("b_strides", ctypes.c_int64 * 8),
    ]


class ResizeGeom(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("planes", "in_h", "in_w", "c", "out_h", "out_w")]


def test_struct_layouts_match_abi_doc():
    assert ctypes.sizeof(Bcast2) == 200 and ctypes.alignment(Bcast2) == 8
    assert (Bcast2.shape.offset, Bcast2.a_strides.offset, Bcast2.b_strides.offset) == (8, 72, 136)
    assert ctypes.sizeof(ResizeGeom) == 48 and ResizeGeom.out_w.offset == 40


class Emulated:
    """One .cu compiled for the CPU; `launch` runs a kernel on GRID x BLOCK threads."""

    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        self.lib.ndx_emu_begin.argtypes = [ctypes.c_uint, ctypes.c_uint]
        self.lib.ndx_emu_set_thread.argtypes = [ctypes.c_uint, ctypes.c_uint]

    def launch(self, name, argtypes, *args):
        fn = getattr(self.lib, name)
        fn.restype = None
        fn.argtypes = argtypes
        args = [a.ctypes.data if isinstance(a, np.ndarray) else a for a in args]
        self.lib.ndx_emu_begin(GRID, BLOCK)
        errors = []

        def thread(b, t):
            try:
                self.lib.ndx_emu_set_thread(b, t)
                fn(*args)
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        ts = [threading.Thread(target=thread, args=(b, t)) for b in range(GRID) for t in range(BLOCK)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        assert not any(t.is_alive() for t in ts), f"{name}: emulated launch hung (warp divergence?)"
        assert not errors, errors


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ not found: the host emulation of the kernels needs it")
    out = tmp_path_factory.mktemp("emu")
    procs = {}
    for f in sorted(os.listdir(KERNELS)):
        if f.endswith(".cu"):
            so = str(out / (f[:-3] + ".so"))
            cmd = [
                gxx, "-std=c++17", "-O1", "-ffp-contract=off", "-fPIC", "-shared", "-pthread",
                "-DNDX_HOST_EMULATION", "-include", os.path.join(KERNELS, "host_emulation.h"),
                "-I", KERNELS, "-x", "c++", os.path.join(KERNELS, f), "-o", so,
            ]
            procs[f[:-3]] = (so, subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True))
    libs = {}
    for name, (so, p) in procs.items():
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, f"g++ failed on {name}.cu:\n{err}"
        libs[name] = Emulated(so)
    return libs


try:
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover
    BF16 = None

F32, F16, U8, I32 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.uint8), np.dtype(np.int32)
DT = {"f32": F32, "f16": F16, "bf16": BF16, "u8": U8, "i32": I32}
FLOATS = ("f32", "f16", "bf16")


def need_bf16(dt):
    if dt == "bf16" and BF16 is None:
        pytest.skip("ml_dtypes is needed for bfloat16 references")


def rng_for(*key):
    """A generator seeded by the test's parameters (stable across runs)."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def flag():
    return np.array([0, U64_MAX], dtype=np.uint64)


def flag_of(mask):
    """The record a kernel should leave for a boolean mask of failing elements."""
    idx = np.flatnonzero(np.asarray(mask).ravel())
    return (len(idx), int(idx[0]) if len(idx) else U64_MAX)


def bits(a):
    a = np.ascontiguousarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def assert_same(got, want, what):
    """Bit for bit, except that any NaN equals any NaN."""
    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.shape, want.shape, got.dtype, want.dtype)
    if got.dtype.kind == "f" or got.dtype == BF16:
        g, w = got.astype(np.float64), want.astype(np.float64)
        both_nan = np.isnan(g) & np.isnan(w)
        diff = (bits(got) != bits(want)) & ~both_nan
    else:
        diff = got != want
    if diff.any():
        i = np.flatnonzero(diff.ravel())[0]
        raise AssertionError(
            f"{what}: {int(diff.sum())} of {diff.size} differ; first at {i}: "
            f"got {got.ravel()[i]!r} want {want.ravel()[i]!r}"
        )


def round_fraction(q: Fraction, p: int, emin: int, emax: int) -> float:
    """The exact value q rounded once, to nearest even, to a binary format with p
    significant bits and exponents [emin, emax] (subnormals, overflow to inf)."""
    if q == 0:
        return 0.0
    sign, m = (-1.0 if q < 0 else 1.0), abs(q)
    e = m.numerator.bit_length() - m.denominator.bit_length()
    if Fraction(2) ** e > m:
        e -= 1
    e = max(e, emin)
    ulp = Fraction(2) ** (e - p + 1)
    n = m / ulp
    r = math.floor(n)
    if n - r > Fraction(1, 2) or (n - r == Fraction(1, 2) and r % 2 == 1):
        r += 1
    v = r * ulp
    if v >= Fraction(2) ** (emax + 1):
        return sign * math.inf
    return sign * float(v)


FORMAT = {"f32": (24, -126, 127), "f16": (11, -14, 15), "bf16": (8, -126, 127)}


def exact_to(values, dt):
    """Exact values (ints or floats) rounded once to float dtype dt."""
    out = [round_fraction(Fraction(v), *FORMAT[dt]) if math.isfinite(v) else v for v in values]
    return np.array(out, dtype=np.float64).astype(np.float32).astype(DT[dt])


def sample(rng, dt, n, specials=True):
    """n values of dt: random, with the awkward ones mixed in (with `specials`,
    NaN, infinities, zeros and the integer extremes)."""
    if dt in FLOATS:
        big = {"f32": 3e38, "f16": 6e4, "bf16": 3e38}[dt]
        x = rng.normal(0, 100, n)
        x[rng.random(n) < 0.2] *= big / 1000
        x[rng.random(n) < 0.05] = 0.0
        sp = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, big, -big, 1e-6, 0.5, 2.5]
        out_type = DT[dt]
    else:
        info = np.iinfo(DT[dt])
        x = rng.integers(info.min, int(info.max) + 1, n, dtype=np.int64)
        small = rng.random(n) < 0.5
        x[small] = rng.integers(max(info.min, -9), 10, int(small.sum()))
        sp = [0, 1, -1, info.min, info.max, 7, -7, 2, -2] if dt == "i32" else [0, 1, 255, 7, 2]
        out_type = np.int64
    if specials:
        sp = sp[:n]
        x[: len(sp)] = sp
        rng.shuffle(x)
    return x.astype(np.float32 if dt in FLOATS else out_type).astype(DT[dt])


# ----- binary


def ref_binary(op, dt, a, b):
    """(result, div-by-zero mask) with NumPy: floats in float32, rounded once;
    integers wrapping; div flooring, 0 for a zero divisor."""
    if dt in FLOATS:
        x, y = a.astype(np.float32), b.astype(np.float32)
        with np.errstate(all="ignore"):
            r = {"add": x + y, "sub": x - y, "mul": x * y, "div": x / y}[op]
        return r.astype(DT[dt]), (y == 0)
    x, y = a.astype(np.int64), b.astype(np.int64)
    zero = y == 0
    if op == "div":
        r = np.where(zero, 0, x // np.where(zero, 1, y))
    else:
        r = {"add": x + y, "sub": x - y, "mul": x * y}[op]
    return r.astype(DT[dt]), zero


def is_finite(x):
    return np.isfinite(x.astype(np.float64))


def binary_argtypes(bcast):
    return [vp, vp, vp, u64] + ([Bcast2] if bcast else []) + [vp, vp]


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
@pytest.mark.parametrize("dt", list(DT))
def test_emulated_binary_compact(emu, op, dt):
    need_bf16(dt)
    rng = rng_for((op, dt))
    n = 3000
    a, b = sample(rng, dt, n), sample(rng, dt, n)
    if dt in FLOATS and op == "div":
        b[::17] = 0
    want, zero = ref_binary(op, dt, a, b)
    for watch in (True, False):
        out = np.zeros(n, DT[dt])
        nanf, divf = flag(), flag()
        emu["binary"].launch(
            f"ndx_{op}_{dt}", binary_argtypes(False), out, a, b, n,
            nanf if watch else None, divf if watch else None,
        )
        assert_same(out, want, f"{op} {dt}")
        if not watch:
            continue
        if dt in FLOATS:
            want_nan = flag_of(~is_finite(want) & is_finite(a) & is_finite(b))
        else:
            want_nan = (0, U64_MAX)
        want_div = flag_of(zero) if op == "div" else (0, U64_MAX)
        assert tuple(int(v) for v in nanf) == want_nan, f"{op} {dt} nan flag"
        assert tuple(int(v) for v in divf) == want_div, f"{op} {dt} div flag"


def test_emulated_integer_division_edges(emu):
    a = np.array([7, -7, 7, -7, -(2**31), -(2**31), 5, 0, -1, 6], np.int32)
    b = np.array([2, 2, -2, -2, -1, 1, 0, 0, 3, -4], np.int32)
    out, divf = np.zeros(10, np.int32), flag()
    emu["binary"].launch("ndx_div_i32", binary_argtypes(False), out, a, b, 10, None, divf)
    assert out.tolist() == [3, -4, -4, 3, -(2**31), -(2**31), 0, 0, -1, -2]
    assert divf.tolist() == [2, 6]
    a8, b8 = np.array([200, 7, 255], np.uint8), np.array([3, 0, 255], np.uint8)
    o8, divf = np.zeros(3, np.uint8), flag()
    emu["binary"].launch("ndx_div_u8", binary_argtypes(False), o8, a8, b8, 3, None, divf)
    assert o8.tolist() == [66, 0, 1] and divf.tolist() == [1, 1]


def bcast_params(av, bv, shape):
    """The broadcast struct for views av, bv (any strides) broadcast to shape."""
    p = Bcast2()
    p.ndim = len(shape)
    ab, bb = np.broadcast_to(av, shape), np.broadcast_to(bv, shape)
    for d, s in enumerate(shape):
        p.shape[d] = s
        p.a_strides[d] = ab.strides[d] // ab.itemsize
        p.b_strides[d] = bb.strides[d] // bb.itemsize
    return p


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
@pytest.mark.parametrize("dt", list(DT))
def test_emulated_binary_broadcast(emu, op, dt):
    need_bf16(dt)
    rng = rng_for(("bcast", op, dt))
    base_a = sample(rng, dt, 4 * 1 * 5).reshape(4, 1, 5)
    av = base_a[:, :, ::-1]  # negative stride, a broadcast dim
    base_b = sample(rng, dt, 6 * 3).reshape(6, 3)
    bv = base_b[::2, :1]  # stepped rows, shape (3, 1)
    shape = (4, 3, 5)
    want, zero = ref_binary(op, dt, *np.broadcast_arrays(av, bv))
    out, nanf, divf = np.zeros(shape, DT[dt]), flag(), flag()
    p = bcast_params(av, bv, shape)
    emu["binary"].launch(
        f"ndx_{op}_{dt}_bcast", binary_argtypes(True),
        out, av.__array_interface__["data"][0], bv.__array_interface__["data"][0],
        out.size, p, nanf, divf,
    )
    assert_same(out, np.ascontiguousarray(want), f"{op} {dt} bcast")
    if op == "div":
        assert tuple(int(v) for v in divf) == flag_of(zero)


def test_emulated_binary_broadcast_scalar_and_0d(emu):
    a = np.array([1.5], np.float32)
    b = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = np.zeros((2, 3), np.float32)
    p = bcast_params(a.reshape(()), b, (2, 3))
    emu["binary"].launch("ndx_mul_f32_bcast", binary_argtypes(True), out, a, b, 6, p, None, None)
    assert out.tolist() == (b * 1.5).tolist()
    out0 = np.zeros((), np.float32)
    p = bcast_params(a.reshape(()), a.reshape(()), ())
    emu["binary"].launch("ndx_add_f32_bcast", binary_argtypes(True), out0, a, a, 1, p, None, None)
    assert float(out0) == 3.0


# ----- cast


def ref_cast(x, s, d):
    if d == "bool":
        return (x.astype(np.float64) != 0).astype(np.uint8) if s in FLOATS else (x != 0).astype(np.uint8)
    if s not in FLOATS and d not in FLOATS:
        return x.astype(np.int64).astype(DT[d])  # wraps
    if s in FLOATS and d not in FLOATS:
        v = x.astype(np.float64)
        info = np.iinfo(DT[d])
        with np.errstate(invalid="ignore"):
            t = np.clip(np.trunc(np.nan_to_num(v, nan=0.0, posinf=np.inf, neginf=-np.inf)), info.min, info.max)
        return t.astype(DT[d])
    if s in FLOATS:  # float to float: exact via float32
        return x.astype(np.float32).astype(DT[d])
    return exact_to([int(v) for v in x], d)  # integer to float


@pytest.mark.parametrize("d", list(DT) + ["bool"])
@pytest.mark.parametrize("s", list(DT))
def test_emulated_cast(emu, s, d):
    case_cast(partial(run_cast, emu), s, d, rng_for(("cast", s, d)), 2000)


def run_cast(emu, name, x, out_dtype):
    out = np.zeros(x.size, out_dtype)
    emu["cast"].launch(name, [vp, vp, u64], out, x, x.size)
    return out


# Shared with test_cuda_kernels_gpu.py, as are the case_* functions below: `run` is this
# file's run_* helper bound to the emulation, or that file's bound to the GPU.
def case_cast(run, s, d, rng, n, infs_and_zeros=False):
    need_bf16(s)
    need_bf16(d)
    x = sample(rng, s, n)
    if s == "i32":  # values that need rounding in every float format
        x[:6] = [16777217, -16777219, 2049, 2051, 65519, 65520]
    if s in FLOATS:  # truncation, saturation, NaN
        x[:8] = np.array([1.7, -1.7, 255.9, 256.0, -0.9, 3e9, -3e9, np.nan], np.float32).astype(DT[s])
        if infs_and_zeros:
            x[8:12] = np.array([np.inf, -np.inf, -0.0, 0.0], np.float32).astype(DT[s])
    want = ref_cast(x, s, d)
    assert_same(run(f"ndx_cast_{s}_{d}", x, want.dtype), want, f"cast {s} -> {d}")


def test_emulated_cast_rounds_once():
    """The reference itself: f16 of 2049 is a tie (to even: 2048), 2051 rounds up."""
    assert exact_to([2049, 2051, 65519, 65520], "f16").astype(np.float64).tolist() == [2048, 2052, 65504, math.inf]


# ----- reductions


def chunk_rule(outer, r, inner):
    """ABI.md's recommended chunk."""
    if r == 0:
        return 1
    cdiv = lambda a, b: -(-a // b)  # noqa: E731
    if inner == 1:
        nchunks = min(max(cdiv(8192, outer), 1), cdiv(r, 1024))
    else:
        nchunks = min(max(cdiv(65536, outer * inner), 1), cdiv(r, 16))
    return cdiv(r, nchunks)


def run_reduce(emu, op, dt, x, outer, r, inner, chunk):
    lib = emu["reduce"]
    nchunks = 0 if r == 0 else -(-r // chunk)
    if op == "max":
        pdt = DT[dt]
    else:
        pdt = np.float64 if dt in FLOATS else np.uint64
    partial = np.zeros(max(1, outer * nchunks * inner), pdt)
    args = [outer, r, inner, chunk]
    sig = [vp, vp, u64, u64, u64, u64]
    if r > 0:
        lib.launch(f"ndx_{'max' if op == 'max' else 'sum'}_{dt}_partial", sig, partial, x, *args)
    if op == "sum":
        odt = DT[dt] if dt in FLOATS else (np.uint64 if dt == "u8" else np.int64)
    elif op == "mean":
        odt = DT[dt] if dt in FLOATS else np.float64
    else:
        odt = DT[dt]
    out = np.zeros(outer * inner, odt)
    lib.launch(f"ndx_{op}_{dt}_final", sig, out, partial, *args)
    return out.reshape(outer, inner)


def ref_reduce(op, dt, x3):
    outer, r, inner = x3.shape
    out = []
    for o in range(outer):
        for i in range(inner):
            col = x3[o, :, i]
            if op == "max":
                if dt not in FLOATS:
                    out.append(int(col.max()))
                    continue
                v = col.astype(np.float64)
                out.append(np.nan if np.isnan(v).any() else v.max())
                continue
            if dt in FLOATS:
                vals = col.astype(np.float64)
                if not np.isfinite(vals).all():
                    s = float(np.sum(vals))  # inf/nan: any order gives the same
                    out.append(s if op == "sum" else (s / r if r else math.nan))
                    continue
                exact = sum(Fraction(float(v)) for v in vals)
                q = exact if op == "sum" else (exact / r if r else None)
                out.append(math.nan if q is None else round_fraction(q, *FORMAT[dt]))
            else:
                s = sum(int(v) for v in col)
                if op == "sum":
                    out.append(s)
                else:
                    out.append(float(Fraction(s, r)) if r else math.nan)
    if op == "sum" and dt not in FLOATS:
        wrap = [(v % 2**64) for v in out]
        return np.array(wrap, np.uint64).view(np.uint64 if dt == "u8" else np.int64).reshape(outer, inner)
    if op == "max" and dt not in FLOATS:
        return np.array(out, np.int64).astype(DT[dt]).reshape(outer, inner)
    if op == "max":
        return np.array(out, np.float64).astype(np.float32).astype(DT[dt]).reshape(outer, inner)
    if op == "mean" and dt not in FLOATS:
        return np.array(out, np.float64).reshape(outer, inner)
    return np.array(out, np.float64).astype(np.float32).astype(DT[dt]).reshape(outer, inner)


REDUCE_SHAPES = [
    (1, 5000, 1),  # full reduction: warp mode
    (3, 40, 1),  # rows: warp mode, one chunk per row
    (7, 5, 1),  # short rows: thread mode
    (2, 33, 5),  # columns: thread mode
    (1, 300, 3),  # HWC-like: per-channel
    (4, 0, 2),  # r == 0
]


# max over no elements is rejected by the host, so it has no r == 0 case.
REDUCE_CASES = [
    (op, shape) for op in ("sum", "mean", "max") for shape in REDUCE_SHAPES
    if not (op == "max" and shape[1] == 0)
]


@pytest.mark.parametrize(
    "op,shape", REDUCE_CASES, ids=lambda v: v if isinstance(v, str) else "x".join(map(str, v))
)
@pytest.mark.parametrize("dt", list(DT))
def test_emulated_reduce(emu, dt, op, shape):
    case_reduce(partial(run_reduce, emu), dt, op, shape)


def case_reduce(run, dt, op, shape):
    need_bf16(dt)
    outer, r, inner = shape
    rng = rng_for(("reduce", dt, op, shape))
    n = outer * r * inner
    if dt in FLOATS:  # small integers: every float sum is exact, so bits must match
        x = rng.integers(-100, 101, n).astype(np.float32).astype(DT[dt])
    else:
        x = sample(rng, dt, n, specials=True) if n else np.zeros(0, DT[dt])
    x3 = x.reshape(outer, r, inner)
    want = ref_reduce(op, dt, x3)
    chunks = {chunk_rule(outer, r, inner), 1, 33}  # warp and thread modes, ragged chunks
    for chunk in sorted(chunks):
        got = run(op, dt, x, outer, r, inner, chunk)
        assert_same(got, want, f"{op} {dt} {shape} chunk={chunk}")


@pytest.mark.parametrize("dt", FLOATS)
def test_emulated_reduce_real_values_and_nan(emu, dt):
    case_reduce_real_values_and_nan(partial(run_reduce, emu), dt)


def case_reduce_real_values_and_nan(run, dt, sum_nan_stays_in_its_row=False):
    need_bf16(dt)
    rng = np.random.default_rng(7)
    outer, r, inner = 2, 3000, 1
    x = rng.normal(1, 3, outer * r).astype(np.float32).astype(DT[dt])
    x3 = x.reshape(outer, r, inner)
    chunk = chunk_rule(outer, r, inner)
    for op in ("sum", "mean"):
        got = run(op, dt, x, outer, r, inner, chunk).astype(np.float64)
        # The double sum differs from the exact one by far less than one ulp of dt.
        want = ref_reduce(op, dt, x3).astype(np.float64)
        tol = {"f32": 2**-22, "f16": 2**-9, "bf16": 2**-6}[dt]
        np.testing.assert_allclose(got, want, rtol=tol, atol=0)
    x[1234] = np.nan
    got = run("max", dt, x, outer, r, inner, chunk)
    assert np.isnan(got[0, 0].astype(np.float64)) and not np.isnan(got[1, 0].astype(np.float64))
    got = run("sum", dt, x, outer, r, inner, chunk)
    assert np.isnan(got[0, 0].astype(np.float64))
    if sum_nan_stays_in_its_row:
        assert not np.isnan(got[1, 0].astype(np.float64))


def test_emulated_chunk_rule_for_a_full_reduction_of_256m():
    assert chunk_rule(1, 256 << 20, 1) == 32768
    assert -(-(256 << 20) // 32768) == 8192


# ----- normalize


@pytest.mark.parametrize("layout", ["HWC", "CHW"])
@pytest.mark.parametrize("dt", list(DT))
def test_emulated_normalize(emu, dt, layout):
    case_normalize(partial(run_normalize, emu), dt, layout, (5, 7, 3), rng_for(("normalize", dt, layout)),
                   f"normalize {dt} {layout}")


def run_normalize(emu, dt, x, c, inner, m, s, stride):
    out = np.zeros(x.shape, np.float32)
    emu["normalize"].launch(
        f"ndx_normalize_{dt}", [vp, vp, u64, u64, u64, vp, vp, u64],
        out, x, x.size, c, inner, m, s, stride,
    )
    return out


def case_normalize(run, dt, layout, size, rng, what):
    need_bf16(dt)
    h, w, c = size
    x = sample(rng, dt, h * w * c)
    shape = (h, w, c) if layout == "HWC" else (c, h, w)
    x = x.reshape(shape)
    inner = 1 if layout == "HWC" else h * w
    for mean, std, stride in (([0.485, 0.456, 0.406], [0.229, 0.224, 0.225], 1), ([127.5], [-3.0], 0)):
        m = np.array(mean, np.float64)
        s = np.array(std, np.float64)
        bshape = [1, 1, 1]
        bshape[2 if layout == "HWC" else 0] = c
        mb = np.broadcast_to(m, (c,)).reshape(bshape)
        sb = np.broadcast_to(s, (c,)).reshape(bshape)
        with np.errstate(all="ignore"):
            want = ((x.astype(np.float64) - mb) / sb).astype(np.float32)
        assert_same(run(dt, x, c, inner, m, s, stride), want, what)


# ----- resize: the arithmetic of src/ops/resize.rs, transcribed to NumPy


def taps_cv(n_in, n_out, rows):
    scale = n_in / n_out
    lo, hi, frac = [], [], []
    for d in range(n_out):
        f = np.float32((d + 0.5) * scale - 0.5)
        fl = np.floor(f)
        fr = np.float32(f - fl)
        s = int(fl)
        if not rows and (s < 0 or s >= n_in - 1):
            fr = np.float32(0)
        lo.append(min(max(s, 0), n_in - 1))
        hi.append(min(max(s + 1, 0), n_in - 1))
        frac.append(fr)
    return np.array(lo), np.array(hi), np.array(frac, np.float32)


def taps_exact(n_in, n_out):
    scale = n_in / n_out
    lo, hi, frac = [], [], []
    for d in range(n_out):
        f = (d + 0.5) * scale - 0.5
        s = math.floor(f)
        fr = f - s
        if s < 0 or s >= n_in - 1:
            fr = 0.0
        lo.append(min(max(s, 0), n_in - 1))
        hi.append(min(max(s + 1, 0), n_in - 1))
        frac.append(fr)
    return np.array(lo), np.array(hi), np.array(frac)


def ref_resize_linear(img, oh, ow, dt):
    """img: planes x H x W x C."""
    _, ih, iw, _ = img.shape
    if dt == "i32":
        x0, x1, fx = taps_exact(iw, ow)
        y0, y1, fy = taps_exact(ih, oh)
        v = img.astype(np.float64)
        cw0, cw1 = (1.0 - fx)[None, None, :, None], fx[None, None, :, None]
        rw0, rw1 = (1.0 - fy)[None, :, None, None], fy[None, :, None, None]
        h0 = v[:, y0][:, :, x0] * cw0 + v[:, y0][:, :, x1] * cw1
        h1 = v[:, y1][:, :, x0] * cw0 + v[:, y1][:, :, x1] * cw1
        return np.rint(h0 * rw0 + h1 * rw1).astype(np.int32)
    x0, x1, fx = taps_cv(iw, ow, False)
    y0, y1, fy = taps_cv(ih, oh, True)
    if dt == "u8":
        q = lambda f: np.rint(f * np.float32(2048)).astype(np.int64)  # noqa: E731
        cw0, cw1 = q(np.float32(1) - fx)[None, None, :, None], q(fx)[None, None, :, None]
        rw0, rw1 = q(np.float32(1) - fy)[None, :, None, None], q(fy)[None, :, None, None]
        v = img.astype(np.int64)
        h0 = v[:, y0][:, :, x0] * cw0 + v[:, y0][:, :, x1] * cw1
        h1 = v[:, y1][:, :, x0] * cw0 + v[:, y1][:, :, x1] * cw1
        r = ((((h0 >> 4) * rw0) >> 16) + (((h1 >> 4) * rw1) >> 16) + 2) >> 2
        return np.clip(r, 0, 255).astype(np.uint8)
    v = img.astype(np.float32)
    one = np.float32(1)
    cw0, cw1 = (one - fx)[None, None, :, None], fx[None, None, :, None]
    rw0, rw1 = (one - fy)[None, :, None, None], fy[None, :, None, None]
    h0 = v[:, y0][:, :, x0] * cw0 + v[:, y0][:, :, x1] * cw1
    h1 = v[:, y1][:, :, x0] * cw0 + v[:, y1][:, :, x1] * cw1
    return (h0 * rw0 + h1 * rw1).astype(np.float32).astype(DT[dt])


def nearest_index(n_in, n_out):
    d = np.arange(n_out, dtype=np.int64)
    return np.minimum((2 * d + 1) * n_in // (2 * n_out), n_in - 1)


def geom(planes, ih, iw, c, oh, ow):
    g = ResizeGeom()
    g.planes, g.in_h, g.in_w, g.c, g.out_h, g.out_w = planes, ih, iw, c, oh, ow
    return g


def run_resize(emu, kernel, img, oh, ow):
    planes, ih, iw, c = img.shape
    out = np.zeros((planes, oh, ow, c), img.dtype)
    emu["resize"].launch(kernel, [vp, vp, ResizeGeom], out, np.ascontiguousarray(img), geom(planes, ih, iw, c, oh, ow))
    return out


RESIZE_CASES = [(12, 16, 5, 7), (5, 7, 12, 16), (17, 13, 40, 9), (1, 1, 4, 5), (9, 1, 3, 7), (7, 5, 1, 1), (30, 40, 15, 20)]


@pytest.mark.parametrize("case", RESIZE_CASES, ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("dt", list(DT))
def test_emulated_resize(emu, dt, case):
    case_resize(partial(run_resize, emu), dt, case)


def case_resize(run, dt, case, nearest_names_planes=False):
    need_bf16(dt)
    ih, iw, oh, ow = case
    rng = rng_for(("resize", dt, case))
    for planes, c in ((1, 3), (2, 1)):  # HWC with 3 channels; CHW of 2 planes
        if dt in FLOATS:
            img = rng.normal(0, 50, (planes, ih, iw, c)).astype(np.float32).astype(DT[dt])
        else:
            img = sample(rng, dt, planes * ih * iw * c, specials=False).reshape(planes, ih, iw, c)
        got = run(f"ndx_resize_linear_{dt}", img, oh, ow)
        assert_same(got, ref_resize_linear(img, oh, ow, dt), f"linear {dt} {case} planes={planes} c={c}")
        got = run(f"ndx_resize_nearest_{dt}", img, oh, ow)
        want = img[:, nearest_index(ih, oh)][:, :, nearest_index(iw, ow)]
        assert_same(got, want, f"nearest {dt} {case}" + (f" planes={planes} c={c}" if nearest_names_planes else ""))


def test_emulated_resize_u8_against_opencv(emu):
    case_resize_u8_against_opencv(partial(run_resize, emu), RESIZE_CASES + [(100, 160, 37, 224)])


def case_resize_u8_against_opencv(run, cases):
    cv2 = pytest.importorskip("cv2")
    rng = np.random.default_rng(11)
    for ih, iw, oh, ow in cases:
        for c in (1, 3, 4):
            img = rng.integers(0, 256, (ih, iw, c), dtype=np.uint8)
            want = cv2.resize(img, (ow, oh), interpolation=cv2.INTER_LINEAR).reshape(oh, ow, c)
            got = run("ndx_resize_linear_u8", img[None], oh, ow)[0]
            diff = np.abs(got.astype(np.int16) - want.astype(np.int16))
            assert diff.max() <= 1 and np.mean(diff == 0) >= 0.99, (ih, iw, oh, ow, c)


@pytest.mark.parametrize("c", [1, 2, 3, 5])
def test_emulated_resize_u8_halving_equals_opencv(emu, c):
    case_resize_u8_halving_equals_opencv(partial(run_resize, emu), c)


def case_resize_u8_halving_equals_opencv(run, c):
    cv2 = pytest.importorskip("cv2")
    rng = np.random.default_rng(c)
    ih, iw, oh, ow = 30, 40, 15, 20
    img = rng.integers(0, 256, (ih, iw, c), dtype=np.uint8)
    want = cv2.resize(img, (ow, oh), interpolation=cv2.INTER_LINEAR).reshape(oh, ow, c)
    kernel = "ndx_resize_linear_u8" if c in (1, 3, 4) else "ndx_resize_area2_u8"
    got = run(kernel, img[None], oh, ow)[0]
    assert_same(got, want, f"halving c={c} with {kernel}")


# ----- checks


def test_emulated_flags_reset(emu):
    f = np.array([5, 6, 7, 8, 9, 10], np.uint64)
    emu["check"].launch("ndx_flags_reset", [vp, u64], f, 3)
    assert f.tolist() == [0, U64_MAX] * 3


@pytest.mark.parametrize("dt", FLOATS)
def test_emulated_check_finite(emu, dt):
    need_bf16(dt)
    rng = np.random.default_rng(3)
    x = rng.normal(0, 1, 5000).astype(np.float32).astype(DT[dt])
    f = flag()
    emu["check"].launch(f"ndx_check_finite_{dt}", [vp, u64, vp], x, x.size, f)
    assert f.tolist() == [0, U64_MAX]
    x[[4000, 17, 999]] = np.array([np.inf, np.nan, -np.inf], np.float32).astype(DT[dt])
    f = flag()
    emu["check"].launch(f"ndx_check_finite_{dt}", [vp, u64, vp], x, x.size, f)
    assert f.tolist() == [3, 17]
    # Records accumulate across launches.
    emu["check"].launch(f"ndx_check_finite_{dt}", [vp, u64, vp], x[100:], x.size - 100, f)
    assert f.tolist() == [5, 17]


@pytest.mark.parametrize("dt", list(DT))
def test_emulated_check_range(emu, dt):
    need_bf16(dt)
    rng = np.random.default_rng(5)
    x = sample(rng, dt, 4000)
    for lo, hi in ((-10.0, 10.0), (-math.inf, math.inf), (0.0, 0.0), (3.5, 200.0)):
        v = x.astype(np.float64)
        want = flag_of(~((v >= lo) & (v <= hi)))
        f = flag()
        emu["check"].launch(f"ndx_check_range_{dt}", [vp, u64, c_double, c_double, vp], x, x.size, lo, hi, f)
        assert tuple(int(k) for k in f) == want, (dt, lo, hi)


def test_emulated_check_bool(emu):
    x = np.ones(3000, np.uint8)
    x[[2999, 1500, 64]] = 0
    f = flag()
    emu["check"].launch("ndx_check_bool", [vp, u64, vp], x, x.size, f)
    assert f.tolist() == [3, 64]
