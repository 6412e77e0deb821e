"""A small ctypes wrapper over the CUDA driver API (libcuda.so.1), for the tests.

Only what tests/python/test_cuda_kernels_gpu.py needs to run the committed PTX of
src/cuda/ptx/ by hand, with the launch contract of src/cuda/kernels/ABI.md: device 0's
primary context, device memory, streams, modules loaded from PTX text, functions and
`cuLaunchKernel` with a `kernelParams` array. No CuPy, no PyTorch, no CUDA toolkit:
only the driver library, which the NVIDIA driver installs.

    ok, why = cuda_driver.available()     # (False, reason) without a usable driver
    ctx = cuda_driver.Context()           # retains device 0's primary context
    buf = ctx.upload(np.arange(10, dtype=np.float32))
    fn = ctx.load_ptx("src/cuda/ptx/cast.ptx").function("ndx_cast_f32_i32")
    out = ctx.alloc(40)
    ctx.launch(fn, grid=1, block=256, params=[out, buf, 10])
    ctx.synchronize()
    ctx.download(out, (10,), np.int32)

`available()` is False when NDX_CUDA_DISABLE=1, when libcuda.so.1 does not load, when
cuInit fails or when there is no device; it never raises. Every failing driver call
raises `CudaError` naming the call and the error (cuGetErrorName, cuGetErrorString).

Kernel parameters (`pack_params`): each value becomes one ctypes object and the
`void**` array points at them, in order. `int` -> c_uint64 (device pointers and u64
alike), `float` -> c_double, `DeviceBuffer` -> c_uint64 of its address, `None` ->
c_uint64(0) (a NULL pointer); ctypes scalars (c_uint32, ...) and Structures
(`NdxBcast2`, `NdxResizeGeom`, ...) are passed as they are, structs by value.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from typing import Iterable, Optional, Sequence, Tuple, Union

import numpy as np

# --------------------------------------------------------------------------- ABI structs
# Mirrors of the structs of src/cuda/kernels/ABI.md (and ndx_common.cuh / binary.cu /
# resize.cu): test_cuda_kernels_gpu.py checks their sizes and offsets.


class NdxBcast2(ctypes.Structure):
    """`struct ndx_bcast2`: 200 bytes, alignment 8; shape and strides in elements."""

    _fields_ = [
        ("ndim", ctypes.c_uint32),  # offset 0
        ("reserved", ctypes.c_uint32),  # offset 4, set to 0
        ("shape", ctypes.c_int64 * 8),  # offset 8
        ("a_strides", ctypes.c_int64 * 8),  # offset 72
        ("b_strides", ctypes.c_int64 * 8),  # offset 136
    ]


class NdxResizeGeom(ctypes.Structure):
    """`struct ndx_resize_geom`: 48 bytes, alignment 8."""

    _fields_ = [(n, ctypes.c_uint64) for n in ("planes", "in_h", "in_w", "c", "out_h", "out_w")]


class NdxFlag(ctypes.Structure):
    """`struct ndx_flag`: 16 bytes, alignment 8 (device memory; reset to {0, ~0})."""

    _fields_ = [("count", ctypes.c_uint64), ("first_index", ctypes.c_uint64)]


U64_MAX = (1 << 64) - 1
FLAG_RESET = (0, U64_MAX)

# --------------------------------------------------------------------------- errors


class CudaError(RuntimeError):
    """A driver call returned something other than CUDA_SUCCESS."""

    def __init__(self, call: str, code: int, name: str, text: str):
        super().__init__(f"{call} failed: {name} ({code}): {text}")
        self.call, self.code, self.name, self.text = call, code, name, text


# --------------------------------------------------------------------------- loading

_CUresult = ctypes.c_int
_P = ctypes.c_void_p
_U64 = ctypes.c_uint64  # CUdeviceptr
_SZ = ctypes.c_size_t
_UINT = ctypes.c_uint
_INT = ctypes.c_int

# name -> argtypes; every function returns CUresult. The `_v2` names are the ones
# the CUDA headers map cuMemAlloc & co. to (the unsuffixed symbols are the old 32-bit
# ABI).
_PROTOTYPES = {
    "cuInit": [_UINT],
    "cuDriverGetVersion": [ctypes.POINTER(_INT)],
    "cuGetErrorName": [_CUresult, ctypes.POINTER(ctypes.c_char_p)],
    "cuGetErrorString": [_CUresult, ctypes.POINTER(ctypes.c_char_p)],
    "cuDeviceGetCount": [ctypes.POINTER(_INT)],
    "cuDeviceGet": [ctypes.POINTER(_INT), _INT],
    "cuDeviceGetName": [ctypes.c_char_p, _INT, _INT],
    "cuDeviceGetAttribute": [ctypes.POINTER(_INT), _INT, _INT],
    "cuDevicePrimaryCtxRetain": [ctypes.POINTER(_P), _INT],
    "cuDevicePrimaryCtxRelease_v2": [_INT],
    "cuCtxSetCurrent": [_P],
    "cuCtxSynchronize": [],
    "cuMemAlloc_v2": [ctypes.POINTER(_U64), _SZ],
    "cuMemFree_v2": [_U64],
    "cuMemcpyHtoD_v2": [_U64, _P, _SZ],
    "cuMemcpyDtoH_v2": [_P, _U64, _SZ],
    "cuMemsetD8_v2": [_U64, ctypes.c_ubyte, _SZ],
    "cuStreamCreate": [ctypes.POINTER(_P), _UINT],
    "cuStreamSynchronize": [_P],
    "cuStreamDestroy_v2": [_P],
    "cuModuleLoadDataEx": [ctypes.POINTER(_P), _P, _UINT, ctypes.POINTER(_INT), ctypes.POINTER(_P)],
    "cuModuleUnload": [_P],
    "cuModuleGetFunction": [ctypes.POINTER(_P), _P, ctypes.c_char_p],
    "cuLaunchKernel": [_P, _UINT, _UINT, _UINT, _UINT, _UINT, _UINT, _UINT, _P, ctypes.POINTER(_P), ctypes.POINTER(_P)],
}

CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
CU_JIT_ERROR_LOG_BUFFER = 5
CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6

_state: dict = {}  # "lib" (the CDLL, initialised) or "reason" (why not), once loaded


def _load() -> Tuple[Optional[ctypes.CDLL], str]:
    if "lib" in _state or "reason" in _state:
        return _state.get("lib"), _state.get("reason", "")
    lib, reason = None, ""
    if os.environ.get("NDX_CUDA_DISABLE") == "1":
        reason = "NDX_CUDA_DISABLE=1"
    else:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            for name, argtypes in _PROTOTYPES.items():
                fn = getattr(lib, name)
                fn.argtypes, fn.restype = argtypes, _CUresult
        except (OSError, AttributeError) as e:
            lib, reason = None, f"libcuda.so.1 is not usable: {e}"
    if lib is not None:
        rc = lib.cuInit(0)
        count = _INT(0)
        if rc != 0:
            reason = f"cuInit failed: {_error_name(lib, rc)} ({rc})"
        elif lib.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value < 1:
            reason = "no CUDA device"
        if reason:
            lib = None
    if lib is None:
        _state["reason"] = reason
    else:
        _state["lib"] = lib
    return lib, reason


def available() -> Tuple[bool, str]:
    """(True, "") when the driver loaded, cuInit succeeded and device 0 exists;
    else (False, why)."""
    lib, reason = _load()
    return (lib is not None, reason)


def _error_name(lib, rc: int) -> str:
    s = ctypes.c_char_p()
    if lib.cuGetErrorName(rc, ctypes.byref(s)) == 0 and s.value:
        return s.value.decode()
    return "CUDA_ERROR_UNKNOWN_CODE"


def _driver():
    lib, reason = _load()
    if lib is None:
        raise RuntimeError(f"the CUDA driver is not available: {reason}")
    return lib


def check(rc: int, call: str) -> None:
    """Raises CudaError for a CUresult other than 0."""
    if rc != 0:
        lib = _driver()
        text = ctypes.c_char_p()
        lib.cuGetErrorString(rc, ctypes.byref(text))
        raise CudaError(call, rc, _error_name(lib, rc), (text.value or b"").decode())


def _call(name: str, *args) -> None:
    check(getattr(_driver(), name)(*args), name)


# --------------------------------------------------------------------------- parameters

ParamValue = Union[int, float, None, "DeviceBuffer", ctypes._SimpleCData, ctypes.Structure]


class KernelParams:
    """The `void** kernelParams` of cuLaunchKernel and the ctypes objects it points
    at (kept alive with it). `values[i]` is the i-th argument as passed."""

    def __init__(self, params: Iterable[ParamValue]):
        self.values = [to_ctypes(p) for p in params]
        self.array = (_P * max(1, len(self.values)))(*[ctypes.addressof(v) for v in self.values])

    def __len__(self):
        return len(self.values)

    def sizes(self):
        return [ctypes.sizeof(v) for v in self.values]


def to_ctypes(p: ParamValue):
    """One kernel argument as a ctypes object (see the module docstring)."""
    if isinstance(p, (ctypes._SimpleCData, ctypes.Structure, ctypes.Array)):
        return p
    if p is None:
        return _U64(0)
    if isinstance(p, DeviceBuffer):
        return _U64(p.ptr)
    if isinstance(p, (bool, np.bool_)):
        raise TypeError("bool kernel argument: pass ctypes.c_uint8/c_uint32 explicitly")
    if isinstance(p, (int, np.integer)):
        if not 0 <= int(p) <= U64_MAX:
            raise ValueError(f"{p} does not fit a u64 kernel argument")
        return _U64(int(p))
    if isinstance(p, (float, np.floating)):
        return ctypes.c_double(float(p))
    raise TypeError(f"unsupported kernel argument {p!r} ({type(p).__name__})")


def pack_params(params: Iterable[ParamValue]) -> KernelParams:
    return KernelParams(params)


# --------------------------------------------------------------------------- objects


class DeviceBuffer:
    """`nbytes` of device memory at `ptr` (freed by `free()` or its Context)."""

    def __init__(self, ctx: "Context", ptr: int, nbytes: int):
        self.ctx, self.ptr, self.nbytes = ctx, ptr, nbytes

    def __int__(self):
        return self.ptr

    def offset(self, nbytes: int) -> int:
        """The address `nbytes` past the start (a plain int, e.g. a view's origin)."""
        return self.ptr + nbytes

    def free(self) -> None:
        if self.ptr:
            self.ctx._live.discard(self)
            _call("cuMemFree_v2", _U64(self.ptr))
            self.ptr = 0

    def __repr__(self):
        return f"DeviceBuffer(0x{self.ptr:x}, {self.nbytes})"


class Stream:
    def __init__(self):
        h = _P()
        _call("cuStreamCreate", ctypes.byref(h), 0)
        self.handle = h

    def synchronize(self) -> None:
        _call("cuStreamSynchronize", self.handle)

    def destroy(self) -> None:
        if self.handle:
            _call("cuStreamDestroy_v2", self.handle)
            self.handle = None


class Function:
    def __init__(self, handle, name: str):
        self.handle, self.name = handle, name


class Module:
    """One PTX module; `function(name)` resolves an `.entry` (CudaError if absent)."""

    def __init__(self, ptx: bytes, label: str = "<ptx>"):
        if not ptx.endswith(b"\0"):
            ptx += b"\0"  # cuModuleLoadData wants NUL-terminated text
        self.label = label
        self._text = ctypes.create_string_buffer(ptx, len(ptx))
        log = ctypes.create_string_buffer(16384)
        opts = (_INT * 2)(CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES)
        vals = (_P * 2)(ctypes.addressof(log), len(log))  # the size travels as the pointer value
        h = _P()
        rc = _driver().cuModuleLoadDataEx(ctypes.byref(h), self._text, 2, opts, vals)
        if rc != 0:
            try:
                check(rc, f"cuModuleLoadDataEx({label})")
            except CudaError as e:
                jit = log.value.decode(errors="replace").strip()
                raise CudaError(e.call, e.code, e.name, e.text + (f"\nJIT log:\n{jit}" if jit else "")) from None
        self.handle = h
        self._functions = {}

    def function(self, name: str) -> Function:
        if name not in self._functions:
            h = _P()
            _call("cuModuleGetFunction", ctypes.byref(h), self.handle, name.encode())
            self._functions[name] = Function(h, name)
        return self._functions[name]

    def unload(self) -> None:
        if self.handle:
            _call("cuModuleUnload", self.handle)
            self.handle = None


def _dim3(v: Union[int, Sequence[int]]) -> Tuple[int, int, int]:
    t = (v,) if isinstance(v, int) else tuple(v)
    t = t + (1,) * (3 - len(t))
    if len(t) != 3 or any(x < 1 for x in t):
        raise ValueError(f"bad launch dimensions {v!r}")
    return t


class Context:
    """Device `ordinal`'s primary context, made current on this thread. Tracks the
    buffers it allocated: `close()` frees them, `scope()` frees those allocated
    inside a `with` block."""

    def __init__(self, ordinal: int = 0):
        _driver()
        dev, ctx = _INT(), _P()
        _call("cuDeviceGet", ctypes.byref(dev), ordinal)
        _call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev.value)
        self.device, self.handle = dev.value, ctx
        _call("cuCtxSetCurrent", ctx)
        self._live = set()
        name = ctypes.create_string_buffer(256)
        _call("cuDeviceGetName", name, 256, self.device)
        self.name = name.value.decode()
        major, minor, ver = _INT(), _INT(), _INT()
        _call("cuDeviceGetAttribute", ctypes.byref(major), CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.device)
        _call("cuDeviceGetAttribute", ctypes.byref(minor), CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self.device)
        _call("cuDriverGetVersion", ctypes.byref(ver))
        self.compute_capability = (major.value, minor.value)
        self.driver_version = ver.value  # e.g. 13000 for CUDA 13.0

    # memory
    def alloc(self, nbytes: int) -> DeviceBuffer:
        """`nbytes` of device memory (at least 1 byte is allocated)."""
        p = _U64()
        _call("cuMemAlloc_v2", ctypes.byref(p), max(1, int(nbytes)))
        buf = DeviceBuffer(self, p.value, int(nbytes))
        self._live.add(buf)
        return buf

    def memset8(self, buf: DeviceBuffer, byte: int, nbytes: Optional[int] = None) -> None:
        n = buf.nbytes if nbytes is None else nbytes
        if n:
            _call("cuMemsetD8_v2", _U64(buf.ptr), byte, n)

    def htod(self, dst: Union[DeviceBuffer, int], src: np.ndarray) -> None:
        src = np.asarray(src, order="C")
        if src.nbytes:
            _call("cuMemcpyHtoD_v2", _U64(int(dst)), src.ctypes.data, src.nbytes)

    def dtoh(self, dst: np.ndarray, src: Union[DeviceBuffer, int]) -> np.ndarray:
        if not dst.flags.c_contiguous:
            raise ValueError("dtoh needs a C-contiguous destination")
        if dst.nbytes:
            _call("cuMemcpyDtoH_v2", dst.ctypes.data, _U64(int(src)), dst.nbytes)
        return dst

    def upload(self, array: np.ndarray) -> DeviceBuffer:
        """A new buffer holding a C-contiguous copy of `array`."""
        array = np.asarray(array, order="C")
        buf = self.alloc(array.nbytes)
        self.htod(buf, array)
        return buf

    def download(self, src: Union[DeviceBuffer, int], shape, dtype) -> np.ndarray:
        return self.dtoh(np.empty(shape, dtype), src)

    @contextlib.contextmanager
    def scope(self):
        before = set(self._live)
        try:
            yield self
        finally:
            for b in list(self._live - before):
                b.free()

    # execution
    def stream(self) -> Stream:
        return Stream()

    def load_ptx(self, path: str) -> Module:
        with open(path, "rb") as f:
            return Module(f.read(), label=os.path.basename(path))

    def launch(self, fn: Function, grid, block, params: Union[KernelParams, Iterable[ParamValue]],
               stream: Optional[Stream] = None, shared_mem: int = 0) -> None:
        """cuLaunchKernel (asynchronous: synchronise the stream before reading)."""
        kp = params if isinstance(params, KernelParams) else KernelParams(params)
        g, b = _dim3(grid), _dim3(block)
        h = stream.handle if stream is not None else None
        check(
            _driver().cuLaunchKernel(fn.handle, *g, *b, shared_mem, h, kp.array, None),
            f"cuLaunchKernel({fn.name}, grid={g}, block={b})",
        )

    def synchronize(self) -> None:
        _call("cuCtxSynchronize")

    def close(self) -> None:
        for b in list(self._live):
            b.free()
        if self.handle:
            _call("cuDevicePrimaryCtxRelease_v2", self.device)
            self.handle = None
