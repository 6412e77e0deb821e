"""A small ctypes binding of libndx, for the Python tests and scripts.

Not a package: just what `tests/python` and `scripts/bench_ctypes.py` use.

The library is loaded from `$NDX_LIBRARY` (a path to libndx.so), else from
`build/cargo/release/libndx.so` (the CMake build) or `target/release/libndx.so`
(a plain cargo build) under the repository root.

Ownership follows `include/ndx.h`: every handle a function returns is a new
reference that the wrapper object releases (`release()`, or when it is collected);
errors are owned values that `NdxError.from_ptr` turns into an exception and frees.

DLPack (`tensor_from_numpy`): the consumer of a `__dlpack__` capsule takes the
`DLManagedTensor[Versioned]*` out of it and, once it owns the tensor, renames the
capsule to "used_dltensor[_versioned]" so that the capsule's destructor (NumPy's)
does not call the deleter a second time. ndx then calls the deleter exactly once,
when the last reference to the tensor goes.
"""

from __future__ import annotations

import ctypes
import json
import os
import struct
import sys
import threading
from ctypes import (
    CFUNCTYPE,
    POINTER,
    Structure,
    byref,
    c_bool,
    c_char_p,
    c_int32,
    c_int64,
    c_size_t,
    c_uint8,
    c_uint16,
    c_uint32,
    c_uint64,
    c_void_p,
)
from typing import NamedTuple, Optional

# --------------------------------------------------------------------------- loading

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
_CANDIDATES = (
    os.path.join(REPO_ROOT, "build", "cargo", "release", "libndx.so"),
    os.path.join(REPO_ROOT, "target", "release", "libndx.so"),
)


def library_path() -> str:
    """The libndx.so this module loads (see the module docstring)."""
    env = os.environ.get("NDX_LIBRARY")
    if env:
        if not os.path.isfile(env):
            raise OSError(f"NDX_LIBRARY={env!r} is not a file")
        return env
    for path in _CANDIDATES:
        if os.path.isfile(path):
            return path
    raise OSError(
        "libndx.so not found: set NDX_LIBRARY, or build it (cmake --build build, "
        "or cargo build --release); looked at " + ", ".join(_CANDIDATES)
    )


LIBRARY_PATH = library_path()
lib = ctypes.CDLL(LIBRARY_PATH)

# --------------------------------------------------------------------------- enums

NDX_FRAME_NATIVE = 1
NDX_FRAME_HOST = 2

NDX_ERROR_VALUE = 1
NDX_ERROR_TYPE = 2
NDX_ERROR_INDEX = 3
NDX_ERROR_RUNTIME = 4
NDX_ERROR_MEMORY = 5
NDX_ERROR_NOT_IMPLEMENTED = 6
NDX_ERROR_CUDA = 7
NDX_ERROR_TIMEOUT = 8
NDX_ERROR_CANCELLED = 9
NDX_ERROR_CHECK = 10
NDX_ERROR_BACKEND = 11
NDX_ERROR_INTERNAL = 12

# ndx_test_cuda_fault_t (test hooks)
NDX_TEST_CUDA_FAULT_NONE = 0
NDX_TEST_CUDA_FAULT_WRITES_INPUT = 1
NDX_TEST_CUDA_FAULT_ALIASES_INPUT = 2
NDX_TEST_CUDA_FAULT_WRONG_DTYPE = 3
NDX_TEST_CUDA_FAULT_WRONG_SHAPE = 4
NDX_TEST_CUDA_FAULT_WRONG_LAYOUT = 5

NDX_DTYPE_BOOL = 1
NDX_DTYPE_INT8 = 2
NDX_DTYPE_INT16 = 3
NDX_DTYPE_INT32 = 4
NDX_DTYPE_INT64 = 5
NDX_DTYPE_UINT8 = 6
NDX_DTYPE_UINT16 = 7
NDX_DTYPE_UINT32 = 8
NDX_DTYPE_UINT64 = 9
NDX_DTYPE_FLOAT16 = 10
NDX_DTYPE_BFLOAT16 = 11
NDX_DTYPE_FLOAT32 = 12
NDX_DTYPE_FLOAT64 = 13

NDX_EVAL_CONTEXT_DEFAULT = 0
NDX_EVAL_SYNC_CPU = 1
NDX_EVAL_SYNC_FULL = 2
NDX_EVAL_DEFERRED = 3
NDX_EVAL_EAGER = 4

NDX_CAPTURE_OFF = 1
NDX_CAPTURE_HOST = 2
NDX_CAPTURE_NATIVE = 3
NDX_CAPTURE_ALL = 4

NDX_FUTURE_PENDING = 0
NDX_FUTURE_READY = 1
NDX_FUTURE_FAILED = 2

NDX_CHECKS_OFF = 1
NDX_CHECKS_COLLECT = 2
NDX_CHECKS_FAIL_FAST = 3

NDX_CHECK_NAN = 1
NDX_CHECK_DIV = 2
NDX_CHECK_INDEX = 4
NDX_CHECK_USER = 8
NDX_CHECK_ALL = 15

NDX_FLUSH_EVALUATE = 1
NDX_FLUSH_WAIT = 2
NDX_FLUSH_POLL = 3
NDX_FLUSH_DATA_READ = 4  # the last four are graph breaks
NDX_FLUSH_EXPORT = 5
NDX_FLUSH_CONSUMER = 6
NDX_FLUSH_METADATA = 7

kDLCPU = 1
DLPACK_FLAG_BITMASK_READ_ONLY = 1 << 0
DLPACK_FLAG_BITMASK_IS_COPIED = 1 << 1

# --------------------------------------------------------------------------- structs
# Mirrors of include/ndx.h and include/ndx_dlpack.h, field for field.


class ndx_frame_t(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("function", c_char_p),
        ("file", c_char_p),
        ("line", c_uint32),
        ("column", c_uint32),
        ("ip", c_size_t),
        ("origin", c_int32),
    ]


class ndx_input_t(Structure):
    _fields_ = [("tensor", c_void_p), ("batch", c_void_p)]


class ndx_location_t(Structure):
    _fields_ = [("file", c_char_p), ("line", c_uint32), ("function", c_char_p)]


class ndx_output_t(Structure):
    _fields_ = [("tensor", c_void_p), ("batch", c_void_p)]


class ndx_invoke_options_t(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("location", ndx_location_t),
        ("mode", c_int32),
        ("outputs", POINTER(ndx_output_t)),
        ("n_outputs", c_size_t),
    ]


class ndx_host_frame_t(Structure):
    _fields_ = [("function", c_char_p), ("file", c_char_p), ("line", c_uint32)]


class ndx_context_options_t(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("eval_mode", c_int32),
        ("capture_policy", c_int32),
        ("capture_depth", c_uint32),
        ("num_threads", c_uint32),
        ("backend", c_char_p),
        ("process_events_callbacks", c_bool),
        ("check_policy", c_int32),
        ("check_categories", c_uint32),
        ("check_capacity", c_uint32),
        ("repro_max_bytes", ctypes.c_int64),
        ("cuda_device", c_int32),
    ]


class ndx_check_info_t(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("category", c_uint32),
        ("first_index", c_uint64),
        ("count", c_uint64),
        ("occurrences", c_uint64),
        ("sample", c_int64),
        ("consequence_of", c_uint64),
    ]


class ndx_explain_summary_t(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("graphs", c_uint64),
        ("breaks", c_uint64),
        ("ops", c_uint64),
        ("graph_ops", c_uint64),
        ("sync_cpu", c_uint64),
        ("sync_full", c_uint64),
        ("deferred", c_uint64),
        ("eager", c_uint64),
        ("checks_raised", c_uint64),
    ]


class ndx_explain_graph_t(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("reason", c_int32),
        ("ops", c_uint64),
        ("time_ns", c_int64),
        ("seq", c_uint64),
    ]


class ndx_graph_break_t(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("reason", c_int32),
        ("graph", c_size_t),
        ("seq", c_uint64),
        ("file", c_char_p),
        ("line", c_uint32),
        ("function", c_char_p),
    ]


class ndx_import_options_t(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("layout", c_char_p),
        ("read_only", c_bool),
        ("stream", c_void_p),
    ]


# NDX_STREAM_NO_SYNC: a CUstream value meaning "do not order" ((void*)-1).
STREAM_NO_SYNC = (1 << (8 * ctypes.sizeof(c_void_p))) - 1


class DLPackVersion(Structure):
    _fields_ = [("major", c_uint32), ("minor", c_uint32)]


class DLDevice(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class DLTensor(Structure):
    _fields_ = [
        ("data", c_void_p),
        ("device", DLDevice),
        ("ndim", c_int32),
        ("dtype", DLDataType),
        ("shape", POINTER(c_int64)),
        ("strides", POINTER(c_int64)),
        ("byte_offset", c_uint64),
    ]


class DLManagedTensorVersioned(Structure):
    pass


DLManagedTensorVersionedDeleter = CFUNCTYPE(None, POINTER(DLManagedTensorVersioned))
DLManagedTensorVersioned._fields_ = [
    ("version", DLPackVersion),
    ("manager_ctx", c_void_p),
    ("deleter", DLManagedTensorVersionedDeleter),
    ("flags", c_uint64),
    ("dl_tensor", DLTensor),
]


class DLManagedTensor(Structure):
    pass


DLManagedTensorDeleter = CFUNCTYPE(None, POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", c_void_p),
    ("deleter", DLManagedTensorDeleter),
]

# Callback types.
FRAME_PROVIDER_T = CFUNCTYPE(c_size_t, c_void_p, POINTER(ndx_host_frame_t), c_size_t)
USER_FREE_T = CFUNCTYPE(None, c_void_p)

# --------------------------------------------------------------------------- prototypes

_err = c_void_p  # ndx_error_t*: None on success


def _proto(name, restype, *argtypes):
    fn = getattr(lib, name)
    fn.restype = restype
    fn.argtypes = list(argtypes)
    return fn


_proto("ndx_version", c_uint32)
_proto("ndx_version_string", c_char_p)
# CUDA discovery
_proto("ndx_cuda_device_count", c_int32)
_proto("ndx_cuda_device_check", c_void_p, c_int32)
# Test hooks: only in a library built with the cargo feature test-hooks.
HAS_TEST_HOOKS = hasattr(lib, "ndx_test_cuda_fault")
if HAS_TEST_HOOKS:
    _proto("ndx_test_cuda_fault", c_void_p, c_char_p, c_int32)
# errors
_proto("ndx_error_kind", c_int32, c_void_p)
_proto("ndx_error_kind_name", c_char_p, c_int32)
_proto("ndx_error_message", c_char_p, c_void_p)
_proto("ndx_error_frame_count", c_size_t, c_void_p)
_proto("ndx_error_frame", _err, c_void_p, c_size_t, POINTER(ndx_frame_t))
_proto("ndx_error_cause", c_void_p, c_void_p)
_proto("ndx_error_related_count", c_size_t, c_void_p)
_proto("ndx_error_related", c_void_p, c_void_p, c_size_t)
_proto("ndx_error_op", c_char_p, c_void_p)
_proto("ndx_error_sequence", c_uint64, c_void_p)
_proto("ndx_error_sample", c_int64, c_void_p)
_proto("ndx_error_format", c_size_t, c_void_p, c_void_p, c_size_t)
_proto("ndx_error_free", None, c_void_p)
_proto("ndx_error_check_info", c_bool, c_void_p, POINTER(ndx_check_info_t))
_proto("ndx_error_repro", c_size_t, c_void_p, c_void_p, c_size_t)
_proto("ndx_repro_run", _err, c_void_p, c_char_p, POINTER(c_void_p))
_proto("ndx_context_set_repro_max_bytes", _err, c_void_p, ctypes.c_uint64)
# contexts
_proto("ndx_context_new", _err, POINTER(ndx_context_options_t), POINTER(c_void_p))
_proto("ndx_context_release", None, c_void_p)
_proto("ndx_context_set_eval_mode", _err, c_void_p, c_int32)
_proto("ndx_context_set_capture_policy", _err, c_void_p, c_int32, c_uint32)
_proto("ndx_context_set_backend", _err, c_void_p, c_char_p)
_proto("ndx_context_set_frame_provider", _err, c_void_p, FRAME_PROVIDER_T, c_void_p, USER_FREE_T)
_proto("ndx_context_evaluate", _err, c_void_p)
_proto("ndx_context_set_checks", _err, c_void_p, c_int32, c_uint32, c_uint32)
_proto("ndx_context_take_check_errors", _err, c_void_p)
# explain
_proto("ndx_context_explain", _err, c_void_p, POINTER(c_void_p))
_proto("ndx_explain_free", None, c_void_p)
_proto("ndx_explain_summary", _err, c_void_p, POINTER(ndx_explain_summary_t))
_proto("ndx_explain_graph_count", c_size_t, c_void_p)
_proto("ndx_explain_graph", _err, c_void_p, c_size_t, POINTER(ndx_explain_graph_t))
_proto("ndx_explain_break_count", c_size_t, c_void_p)
_proto("ndx_explain_break", _err, c_void_p, c_size_t, POINTER(ndx_graph_break_t))
_proto("ndx_explain_json", c_size_t, c_void_p, c_void_p, c_size_t)
# args
_proto("ndx_args_new", _err, POINTER(c_void_p))
_proto("ndx_args_free", None, c_void_p)
_proto("ndx_args_set_int", _err, c_void_p, c_char_p, c_int64)
_proto("ndx_args_set_float", _err, c_void_p, c_char_p, ctypes.c_double)
_proto("ndx_args_set_bool", _err, c_void_p, c_char_p, c_bool)
_proto("ndx_args_set_string", _err, c_void_p, c_char_p, c_char_p)
_proto("ndx_args_set_dtype", _err, c_void_p, c_char_p, c_int32)
_proto("ndx_args_set_int_array", _err, c_void_p, c_char_p, POINTER(c_int64), c_size_t)
_proto("ndx_args_set_float_array", _err, c_void_p, c_char_p, POINTER(ctypes.c_double), c_size_t)
# invocations and futures
_proto(
    "ndx_invoke",
    _err,
    c_void_p,  # ctx
    c_char_p,  # op
    POINTER(ndx_input_t),
    c_size_t,
    c_void_p,  # args
    POINTER(ndx_invoke_options_t),
    POINTER(c_void_p),  # out future
)
_proto("ndx_future_poll", c_int32, c_void_p)
_proto("ndx_future_wait", _err, c_void_p, c_int64)
_proto("ndx_future_error", _err, c_void_p)
_proto("ndx_future_output_count", _err, c_void_p, POINTER(c_size_t))
_proto("ndx_future_tensor", _err, c_void_p, c_size_t, POINTER(c_void_p))
_proto("ndx_future_release", None, c_void_p)
# tensors
_proto(
    "ndx_tensor_from_dlpack_versioned",
    _err,
    c_void_p,
    POINTER(ndx_import_options_t),
    POINTER(c_void_p),
)
_proto("ndx_tensor_from_dlpack", _err, c_void_p, POINTER(ndx_import_options_t), POINTER(c_void_p))
_proto("ndx_tensor_copy_to", _err, c_void_p, c_void_p, c_size_t)
_proto("ndx_tensor_to_dlpack_versioned_stream", _err, c_void_p, c_void_p, POINTER(c_void_p))
_proto("ndx_tensor_release", None, c_void_p)
_proto("ndx_tensor_dtype", _err, c_void_p, POINTER(c_int32))
_proto("ndx_tensor_device", _err, c_void_p, POINTER(DLDevice))
_proto("ndx_tensor_ndim", _err, c_void_p, POINTER(c_int32))
_proto("ndx_tensor_shape", _err, c_void_p, POINTER(POINTER(c_int64)))
_proto("ndx_tensor_layout", _err, c_void_p, POINTER(c_char_p))
_proto("ndx_tensor_nbytes", _err, c_void_p, POINTER(c_size_t))
_proto("ndx_tensor_strides", _err, c_void_p, POINTER(POINTER(c_int64)))
_proto(
    "ndx_tensor_from_host",
    _err,
    c_void_p,  # data
    c_int32,  # dtype
    c_int32,  # ndim
    POINTER(c_int64),  # shape
    POINTER(c_int64),  # strides (elements; NULL: compact)
    POINTER(ndx_import_options_t),
    POINTER(c_void_p),
)
_proto("ndx_tensor_is_read_only", _err, c_void_p, POINTER(c_bool))
_proto("ndx_dtype_name", c_char_p, c_int32)

# The capsule API (PyDLL: called with the GIL held).
_capi = ctypes.pythonapi
_capi.PyCapsule_GetPointer.restype = c_void_p
_capi.PyCapsule_GetPointer.argtypes = [ctypes.py_object, c_char_p]
_capi.PyCapsule_SetName.restype = ctypes.c_int
_capi.PyCapsule_SetName.argtypes = [ctypes.py_object, c_char_p]
_capi.PyCapsule_IsValid.restype = ctypes.c_int
_capi.PyCapsule_IsValid.argtypes = [ctypes.py_object, c_char_p]

# --------------------------------------------------------------------------- errors


class Frame(NamedTuple):
    """One frame of an error's capture site (innermost first in `NdxError.frames`)."""

    function: Optional[str]
    file: Optional[str]
    line: int
    origin: int  # NDX_FRAME_NATIVE or NDX_FRAME_HOST


class CheckInfo(NamedTuple):
    """What one raised check flag reports (`ndx_error_check_info`)."""

    category: int  # one NDX_CHECK_* bit
    first_index: int
    count: int
    occurrences: int
    sample: int  # -1 when the input was a tensor
    consequence_of: int  # 0 when a root cause


def _text(b: Optional[bytes]) -> Optional[str]:
    return None if b is None else b.decode("utf-8", "replace")


class ExplainSummary(NamedTuple):
    """The totals of an explain snapshot (`ndx_explain_summary_t`, field for field)."""

    graphs: int
    breaks: int
    ops: int
    graph_ops: int
    sync_cpu: int
    sync_full: int
    deferred: int
    eager: int
    checks_raised: int


class ExplainGraph(NamedTuple):
    """One evaluated graph (`ndx_explain_graph_t`)."""

    reason: int  # an NDX_FLUSH_* value
    ops: int
    time_ns: int  # -1 while some of it still runs
    seq: int


class GraphBreak(NamedTuple):
    """One graph break (`ndx_graph_break_t`), its strings copied."""

    reason: int  # NDX_FLUSH_DATA_READ, _EXPORT, _CONSUMER or _METADATA
    graph: int  # index into `Explain.graphs`
    seq: int
    file: Optional[str]
    line: int
    function: Optional[str]


class Explain(NamedTuple):
    """What `Context.explain` returns: a plain copy of an `ndx_explain_t` snapshot
    (the native snapshot is already freed): `summary`, the `graphs` and `breaks`
    records in order, and `json`, the parsed text of `ndx_explain_json`."""

    summary: ExplainSummary
    graphs: list
    breaks: list
    json: dict

    @classmethod
    def from_borrowed(cls, ptr: int) -> "Explain":
        """Reads an `ndx_explain_t*` without freeing it."""
        s = ndx_explain_summary_t()
        s.struct_size = ctypes.sizeof(ndx_explain_summary_t)
        check(lib.ndx_explain_summary(ptr, byref(s)))
        summary = ExplainSummary(*(getattr(s, f) for f in ExplainSummary._fields))
        graphs = []
        g = ndx_explain_graph_t()
        for i in range(lib.ndx_explain_graph_count(ptr)):
            g.struct_size = ctypes.sizeof(ndx_explain_graph_t)
            check(lib.ndx_explain_graph(ptr, i, byref(g)))
            graphs.append(ExplainGraph(g.reason, g.ops, g.time_ns, g.seq))
        breaks = []
        b = ndx_graph_break_t()
        for i in range(lib.ndx_explain_break_count(ptr)):
            b.struct_size = ctypes.sizeof(ndx_graph_break_t)
            check(lib.ndx_explain_break(ptr, i, byref(b)))
            breaks.append(GraphBreak(b.reason, b.graph, b.seq, _text(b.file), b.line, _text(b.function)))
        return cls(summary, graphs, breaks, json.loads(explain_json(ptr)))


def explain_json(ptr: int) -> str:
    """`ndx_explain_json` of a (borrowed) `ndx_explain_t*`."""
    n = lib.ndx_explain_json(ptr, None, 0)
    buf = ctypes.create_string_buffer(n + 1)
    lib.ndx_explain_json(ptr, buf, n + 1)
    return buf.value.decode("utf-8", "replace")


class NdxError(Exception):
    """An ndx error: kind, message, capture-site frames, cause chain, related errors.

    `frames` is a list of `Frame(function, file, line, origin)`, innermost first;
    `cause` the next link of the chain (also set as `__cause__`, so Python prints
    the chain); `related` the errors this one groups; `traceback_text` the text of
    `ndx_error_format` for the chain from this link on (read when first asked); `check_info` a `CheckInfo` when the
    error is one raised check flag, else None; `repro` the repro document (JSON text)
    of the invocation that failed first in the chain, else None. Instances of the kind's subclass (e.g.
    `NdxValueError`) are also instances of the matching built-in exception.
    """

    def __init__(
        self,
        kind: int,
        message: str,
        frames=(),
        cause: Optional["NdxError"] = None,
        related=(),
        op: Optional[str] = None,
        sequence: int = 0,
        traceback_text: Optional[str] = "",
        check_info: Optional[CheckInfo] = None,
        repro: Optional[str] = None,
    ):
        super().__init__(message)
        self.kind = kind
        self.kind_name = _text(lib.ndx_error_kind_name(kind)) or f"kind {kind}"
        self.message = message
        self.frames = list(frames)
        self.cause = cause
        self.related = list(related)
        self.op = op
        self.sequence = sequence
        self._traceback_text = traceback_text
        self._source = None
        self.check_info = check_info
        self.repro = repro
        if cause is not None:
            self.__cause__ = cause

    def __str__(self) -> str:
        where = f" (invocation #{self.sequence} of '{self.op}')" if self.op else ""
        return f"{self.message}{where}"

    def chain(self):
        """This error, then its causes, outermost first."""
        e = self
        while e is not None:
            yield e
            e = e.cause

    @property
    def traceback_text(self) -> str:
        """`ndx_error_format` of this link's chain (read from ndx when first asked)."""
        if self._traceback_text is None:
            _owner, ptr = self._source
            self._traceback_text = format_error(ptr)
            self._source = None
        return self._traceback_text

    @traceback_text.setter
    def traceback_text(self, text: str) -> None:
        self._traceback_text = text

    @classmethod
    def from_borrowed(cls, ptr: int) -> "NdxError":
        """Builds an exception from an `ndx_error_t*` without freeing it (from an
        owned copy, which the exception keeps for its text)."""
        return cls.from_ptr(lib.ndx_error_clone(ptr))

    @classmethod
    def from_ptr(cls, ptr: int) -> "NdxError":
        """Builds an exception from an owned `ndx_error_t*`, which it takes: it is freed
        when no exception built from it (its causes included) is left."""
        return cls._chain(ptr, _OwnedError(ptr))

    @classmethod
    def _chain(cls, ptr: int, owner: "_OwnedError") -> "NdxError":
        """The exceptions of `ptr`'s chain, built from the root cause outwards: a loop,
        not a recursion per link, as a failure passed down a long pipeline has a link
        per invocation."""
        links = []
        while ptr:
            links.append(ptr)
            ptr = lib.ndx_error_cause(ptr)
        cause = None
        for link in reversed(links):
            cause = cls._link(link, owner, cause)
        return cause

    @classmethod
    def _link(cls, ptr: int, owner: "_OwnedError", cause: Optional["NdxError"]) -> "NdxError":
        """The exception of one link of a chain (borrowed from `owner`), whose cause is
        already built."""
        kind = lib.ndx_error_kind(ptr)
        message = _text(lib.ndx_error_message(ptr)) or ""
        frames = []
        fr = ndx_frame_t()
        for i in range(lib.ndx_error_frame_count(ptr)):
            fr.struct_size = ctypes.sizeof(ndx_frame_t)
            e = lib.ndx_error_frame(ptr, i, byref(fr))
            if e:  # cannot happen for i < count; do not lose it if it does
                raise NdxError.from_ptr(e)
            frames.append(Frame(_text(fr.function), _text(fr.file), fr.line, fr.origin))
        related = [
            cls._chain(lib.ndx_error_related(ptr, i), owner)
            for i in range(lib.ndx_error_related_count(ptr))
        ]
        info = ndx_check_info_t()
        info.struct_size = ctypes.sizeof(ndx_check_info_t)
        check_info = None
        if lib.ndx_error_check_info(ptr, byref(info)):
            check_info = CheckInfo(*(getattr(info, f) for f in CheckInfo._fields))
        klass = _KIND_CLASSES.get(kind, NdxError)
        err = klass(
            kind,
            message,
            frames,
            cause,
            related,
            _text(lib.ndx_error_op(ptr)),
            lib.ndx_error_sequence(ptr),
            None,
            check_info,
            repro_document(ptr),
        )
        # Formatting every link's chain up front would cost N^2/2 links for N links.
        err._source = (owner, ptr)
        return err


class _OwnedError:
    """An owned `ndx_error_t*`, freed when the last exception built from it goes."""

    __slots__ = ("ptr",)

    def __init__(self, ptr: int):
        self.ptr = ptr

    def __del__(self):
        ptr, self.ptr = self.ptr, None
        if ptr and lib is not None:
            lib.ndx_error_free(ptr)


def repro_document(ptr: int) -> Optional[str]:
    """`ndx_error_repro` of a (borrowed) `ndx_error_t*`, or None when it has none."""
    n = lib.ndx_error_repro(ptr, None, 0)
    if n == 0:
        return None
    buf = ctypes.create_string_buffer(n + 1)
    lib.ndx_error_repro(ptr, buf, n + 1)
    return buf.value.decode("utf-8", "replace")


def format_error(ptr: int) -> str:
    """`ndx_error_format` of a (borrowed) `ndx_error_t*`."""
    n = lib.ndx_error_format(ptr, None, 0)
    buf = ctypes.create_string_buffer(n + 1)
    lib.ndx_error_format(ptr, buf, n + 1)
    return buf.value.decode("utf-8", "replace")


def _kind_class(kind: int, builtin):
    name = "Ndx" + (_text(lib.ndx_error_kind_name(kind)) or f"Kind{kind}")
    bases = (NdxError,) if builtin is None else (NdxError, builtin)
    return type(name, bases, {"__module__": __name__})


_KIND_CLASSES = {
    NDX_ERROR_VALUE: _kind_class(NDX_ERROR_VALUE, ValueError),
    NDX_ERROR_TYPE: _kind_class(NDX_ERROR_TYPE, TypeError),
    NDX_ERROR_INDEX: _kind_class(NDX_ERROR_INDEX, IndexError),
    NDX_ERROR_RUNTIME: _kind_class(NDX_ERROR_RUNTIME, RuntimeError),
    NDX_ERROR_MEMORY: _kind_class(NDX_ERROR_MEMORY, MemoryError),
    NDX_ERROR_NOT_IMPLEMENTED: _kind_class(NDX_ERROR_NOT_IMPLEMENTED, NotImplementedError),
    NDX_ERROR_CUDA: _kind_class(NDX_ERROR_CUDA, None),
    NDX_ERROR_TIMEOUT: _kind_class(NDX_ERROR_TIMEOUT, TimeoutError),
    NDX_ERROR_CANCELLED: _kind_class(NDX_ERROR_CANCELLED, None),
    NDX_ERROR_CHECK: _kind_class(NDX_ERROR_CHECK, None),
    NDX_ERROR_BACKEND: _kind_class(NDX_ERROR_BACKEND, None),
    NDX_ERROR_INTERNAL: _kind_class(NDX_ERROR_INTERNAL, None),
}
globals().update({cls.__name__: cls for cls in _KIND_CLASSES.values()})


def check(err) -> None:
    """Raises the NdxError for a non-NULL `ndx_error_t*` (and frees it)."""
    if err:
        raise NdxError.from_ptr(err)


# --------------------------------------------------------------------------- frame provider


class PythonFrameProvider:
    """Reports the calling Python stack to ndx at `ndx_invoke` (innermost first).

    Skips its own frame and every frame of this module (the binding), so frame 0 is
    the user's line that called `Context.invoke`. Writes at most `capacity` frames
    (ndx passes the context's capture depth at the time of the invoke).

    String lifetime: ndx copies the strings as soon as the callback returns, so they
    must outlive only the callback. The bytes a call wrote pointers to are kept in a
    thread-local list until the next call on the same thread (per thread, so that
    concurrent invocations do not free each other's strings).

    Cost: each frame is one packed `ndx_host_frame_t`, cached per (code object,
    instruction offset) — reading `f_lineno` decodes the line table, `f_lasti` does
    not — and all frames are written with one memmove. `cache=False` encodes fresh
    bytes on every call instead (tests use it to show that ndx copies the strings).
    """

    def __init__(self, skip_files=(), cache: bool = True):
        # co_filename of this module's code (what the frames carry), not __file__.
        self.skip_files = {PythonFrameProvider._provide.__code__.co_filename, *skip_files}
        self._local = threading.local()
        self._names = {}  # id(code) -> (pointers, function, file, code)
        self._sites = {} if cache else None  # (id(code), f_lasti) -> (struct, names)
        self.calls = 0
        self.errors = 0
        self.last_count = 0  # frames written by the last call
        self.callback = FRAME_PROVIDER_T(self._provide)

    def forget(self) -> None:
        """Drops this thread's strings of the last call (ndx has copied them)."""
        self._local.keep = None

    def _site(self, f):
        """The packed ndx_host_frame_t of frame `f`, with what keeps it valid."""
        code = f.f_code
        names = self._names.get(id(code)) if self._sites is not None else None
        if names is None:
            fn = code.co_name.encode("utf-8", "replace")
            file = code.co_filename.encode("utf-8", "replace")
            # Pointers into the bytes objects' buffers (CPython never moves them). The
            # entry holds the code object, so its id is not reused while cached.
            names = (_PTR2.pack(_bytes_address(fn), _bytes_address(file)), fn, file, code)
            if self._sites is not None:
                if len(self._names) > 4096:
                    self._names.clear()  # in-use entries are kept alive by `keep`
                self._names[id(code)] = names
        return (names[0] + _LINE.pack(f.f_lineno or 0), names)

    def _provide(self, user, frames, capacity):
        try:
            self.calls += 1
            keep = []  # the sites written; their bytes hold the strings pointed to
            f = sys._getframe(1)  # skip this callback's own frame
            skip = self.skip_files
            sites = self._sites
            n = 0
            while f is not None and n < capacity:
                code = f.f_code
                if code.co_filename not in skip:
                    if sites is None:
                        site = self._site(f)
                    else:
                        key = (id(code), f.f_lasti)
                        site = sites.get(key)
                        if site is None:
                            if len(sites) > 65536:
                                sites.clear()
                            site = sites[key] = self._site(f)
                    keep.append(site)
                    n += 1
                f = f.f_back
            # Replaces (frees) this thread's strings of the previous call: ndx copied
            # them when that callback returned.
            self._local.keep = keep
            self.last_count = n
            if n:
                data = b"".join([site[0] for site in keep])  # n structs, one write
                ctypes.memmove(ctypes.addressof(frames.contents), data, len(data))
            return n
        except BaseException:  # never let an exception cross into ndx
            self.errors += 1
            return 0


_PTR2 = struct.Struct("PP")  # ndx_host_frame_t.function, .file
_LINE = struct.Struct("I4x")  # ndx_host_frame_t.line and the tail padding
assert _PTR2.size + _LINE.size == ctypes.sizeof(ndx_host_frame_t)
assert ndx_host_frame_t.line.offset == _PTR2.size


def _bytes_address(b: bytes) -> int:
    return ctypes.cast(b, c_void_p).value


# A registry of live CFUNCTYPE providers, keyed by the `user` pointer given to ndx;
# ndx's `user_free` removes an entry once it no longer calls that provider (replaced,
# or its context freed), so the callback object lives exactly as long as ndx needs it.
_live_providers: dict = {}
_live_lock = threading.Lock()
_next_key = [1]


def _user_free(user):
    with _live_lock:
        _live_providers.pop(user, None)


_USER_FREE = USER_FREE_T(_user_free)  # module-global: must never be collected

# --------------------------------------------------------------------------- tensors

_NP_DTYPES = {
    NDX_DTYPE_BOOL: "bool",
    NDX_DTYPE_INT8: "int8",
    NDX_DTYPE_INT16: "int16",
    NDX_DTYPE_INT32: "int32",
    NDX_DTYPE_INT64: "int64",
    NDX_DTYPE_UINT8: "uint8",
    NDX_DTYPE_UINT16: "uint16",
    NDX_DTYPE_UINT32: "uint32",
    NDX_DTYPE_UINT64: "uint64",
    NDX_DTYPE_FLOAT16: "float16",
    NDX_DTYPE_FLOAT32: "float32",
    NDX_DTYPE_FLOAT64: "float64",
}

try:  # bfloat16 has a NumPy dtype only through ml_dtypes (optional)
    import ml_dtypes as _ml_dtypes

    _NP_DTYPES[NDX_DTYPE_BFLOAT16] = _ml_dtypes.bfloat16
except ImportError:
    _ml_dtypes = None

# Capsule names. PyCapsule_SetName stores the pointer it is given, so the new names
# must outlive every capsule: module-level bytes objects, never collected.
_DLTENSOR = b"dltensor"
_DLTENSOR_VERSIONED = b"dltensor_versioned"
_USED_DLTENSOR = b"used_dltensor"
_USED_DLTENSOR_VERSIONED = b"used_dltensor_versioned"


class Tensor:
    """An owned reference to an `ndx_tensor_t`."""

    __slots__ = ("ptr", "__weakref__")

    def __init__(self, ptr: int):
        self.ptr = ptr

    def release(self) -> None:
        ptr, self.ptr = self.ptr, None
        if ptr:
            lib.ndx_tensor_release(ptr)

    def __del__(self):
        try:
            self.release()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    @property
    def dtype(self) -> int:
        out = c_int32()
        check(lib.ndx_tensor_dtype(self.ptr, byref(out)))
        return out.value

    @property
    def shape(self) -> tuple:
        ndim = c_int32()
        check(lib.ndx_tensor_ndim(self.ptr, byref(ndim)))
        shape = POINTER(c_int64)()
        check(lib.ndx_tensor_shape(self.ptr, byref(shape)))
        return tuple(shape[i] for i in range(ndim.value))

    @property
    def layout(self) -> str:
        """The layout string ("" when none)."""
        out = c_char_p()
        check(lib.ndx_tensor_layout(self.ptr, byref(out)))
        return (out.value or b"").decode()

    @property
    def strides(self) -> tuple:
        """The strides in elements."""
        ndim = c_int32()
        check(lib.ndx_tensor_ndim(self.ptr, byref(ndim)))
        strides = POINTER(c_int64)()
        check(lib.ndx_tensor_strides(self.ptr, byref(strides)))
        return tuple(strides[i] for i in range(ndim.value))

    @property
    def read_only(self) -> bool:
        out = c_bool()
        check(lib.ndx_tensor_is_read_only(self.ptr, byref(out)))
        return out.value

    @property
    def device(self) -> tuple:
        """`(device_type, device_id)` of the memory (DLPack codes: 1 CPU, 2 CUDA)."""
        dev = DLDevice()
        check(lib.ndx_tensor_device(self.ptr, byref(dev)))
        return dev.device_type, dev.device_id

    def numpy(self):
        """A new NumPy array holding a copy of the data (waits for pending work)."""
        return tensor_to_numpy(self)


def dlpack_import(
    capsule, layout: Optional[str] = None, read_only: bool = False, stream: Optional[int] = None
) -> Tensor:
    """Imports a `__dlpack__` capsule (versioned or legacy) into a new Tensor.

    `stream` is the raw `CUstream` (an integer) the producer's writes are ordered on,
    for CUDA memory: None is the legacy default stream (0), `STREAM_NO_SYNC` none.

    On success ndx owns the managed tensor and the capsule is renamed "used_..." so
    its destructor leaves the deleter alone. On failure the capsule keeps it (and
    its destructor calls the deleter) — except for a versioned tensor whose major
    version is not 1, whose deleter ndx calls itself (DLPack rule): then the capsule
    is renamed too so the deleter does not run twice.
    """
    if _capi.PyCapsule_IsValid(capsule, _DLTENSOR_VERSIONED):
        versioned = True
        ptr = _capi.PyCapsule_GetPointer(capsule, _DLTENSOR_VERSIONED)
    elif _capi.PyCapsule_IsValid(capsule, _DLTENSOR):
        versioned = False
        ptr = _capi.PyCapsule_GetPointer(capsule, _DLTENSOR)
    else:
        raise ValueError("not an unused DLPack capsule ('dltensor' or 'dltensor_versioned')")
    opts = None
    if layout is not None or read_only or stream is not None:
        opts = ndx_import_options_t(
            ctypes.sizeof(ndx_import_options_t),
            None if layout is None else layout.encode(),
            read_only,
            stream,
        )
    out = c_void_p()
    if versioned:
        major = DLManagedTensorVersioned.from_address(ptr).version.major
        err = lib.ndx_tensor_from_dlpack_versioned(ptr, opts, byref(out))
        if not err or major != 1:
            _capi.PyCapsule_SetName(capsule, _USED_DLTENSOR_VERSIONED)
    else:
        err = lib.ndx_tensor_from_dlpack(ptr, opts, byref(out))
        if not err:
            _capi.PyCapsule_SetName(capsule, _USED_DLTENSOR)
    check(err)
    return Tensor(out.value)


def tensor_from_numpy(arr, versioned: bool = True, **kw) -> Tensor:
    """Imports a NumPy array (any object with `__dlpack__`) without copying."""
    if versioned:
        try:
            capsule = arr.__dlpack__(max_version=(1, 0))
        except TypeError:  # a producer without max_version (NumPy < 2.1)
            capsule = arr.__dlpack__()
    else:
        capsule = arr.__dlpack__()
    return dlpack_import(capsule, **kw)


def tensor_from_host(arr, dtype: int) -> Tensor:
    """A new compact ndx tensor of ndx dtype `dtype` holding a copy of the NumPy array
    `arr`'s elements, read with its own strides (`ndx_tensor_from_host`). `arr`'s
    items must have the size of `dtype` (e.g. the raw bits of bfloat16, which
    DLPack export from NumPy does not support)."""
    import numpy as np

    arr = np.asarray(arr)
    item = arr.dtype.itemsize
    if any(st % item for st in arr.strides):
        raise ValueError("strides that are not a multiple of the item size")
    ndim = arr.ndim
    shape = (c_int64 * max(ndim, 1))(*arr.shape)
    strides = (c_int64 * max(ndim, 1))(*[st // item for st in arr.strides])
    data = arr.ctypes.data if arr.size else None
    out = c_void_p()
    check(lib.ndx_tensor_from_host(data, dtype, ndim, shape, strides, None, byref(out)))
    return Tensor(out.value)


def tensor_to_numpy(tensor: Tensor):
    """Copies an ndx tensor into a new NumPy array of its dtype and shape."""
    import numpy as np

    dt = tensor.dtype
    name = _NP_DTYPES.get(dt)
    if name is None:
        raise TypeError(f"no NumPy dtype for ndx dtype {_text(lib.ndx_dtype_name(dt))}")
    arr = np.empty(tensor.shape, dtype=name)
    check(lib.ndx_tensor_copy_to(tensor.ptr, arr.ctypes.data, arr.nbytes))
    return arr


def as_tensor(x) -> Tensor:
    return x if isinstance(x, Tensor) else tensor_from_numpy(x)


# --------------------------------------------------------------------------- futures


class Future:
    """An owned reference to an `ndx_future_t`."""

    __slots__ = ("ptr",)

    def __init__(self, ptr: int):
        self.ptr = ptr

    def release(self) -> None:
        ptr, self.ptr = self.ptr, None
        if ptr:
            lib.ndx_future_release(ptr)

    def __del__(self):
        try:
            self.release()
        except Exception:
            pass

    def poll(self) -> int:
        return lib.ndx_future_poll(self.ptr)

    def wait(self, timeout: Optional[float] = None) -> None:
        """Waits; raises the invocation's NdxError if it failed."""
        ns = -1 if timeout is None else int(timeout * 1e9)
        check(lib.ndx_future_wait(self.ptr, ns))

    def error(self) -> Optional[NdxError]:
        err = lib.ndx_future_error(self.ptr)
        return NdxError.from_ptr(err) if err else None

    def output_count(self) -> int:
        n = c_size_t()
        check(lib.ndx_future_output_count(self.ptr, byref(n)))
        return n.value

    def tensor(self, index: int = 0) -> Tensor:
        out = c_void_p()
        check(lib.ndx_future_tensor(self.ptr, index, byref(out)))
        return Tensor(out.value)

    def result(self, index: int = 0):
        """Waits and returns output `index` as a NumPy array."""
        self.wait()
        with self.tensor(index) as t:
            return t.numpy()


# --------------------------------------------------------------------------- arguments


class Args:
    """An owned `ndx_args_t` builder. `Args(lo=0.5, keepdims=True)` sets each keyword
    by its Python type: bool, int, float, str, or a list/tuple of ints or of floats;
    the `set_*` methods set one explicitly (`set_dtype` for a dtype argument).
    Methods return `self`, so calls chain. Pass it as `args=` to `Context.invoke` /
    `Context.prepare`; `ndx_invoke` copies it, so it may be changed or freed after."""

    __slots__ = ("ptr",)

    def __init__(self, **values):
        out = c_void_p()
        check(lib.ndx_args_new(byref(out)))
        self.ptr = out.value
        for name, value in values.items():
            self.set(name, value)

    def release(self) -> None:
        ptr, self.ptr = self.ptr, None
        if ptr:
            lib.ndx_args_free(ptr)

    def __del__(self):
        try:
            self.release()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def set(self, name: str, value) -> "Args":
        if isinstance(value, bool):
            return self.set_bool(name, value)
        if isinstance(value, int):
            return self.set_int(name, value)
        if isinstance(value, float):
            return self.set_float(name, value)
        if isinstance(value, str):
            return self.set_string(name, value)
        if isinstance(value, (list, tuple)):
            if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
                return self.set_int_array(name, value)
            return self.set_float_array(name, value)
        # NumPy scalars and other numbers
        if hasattr(value, "dtype") and getattr(value.dtype, "kind", "") in "iu":
            return self.set_int(name, int(value))
        return self.set_float(name, float(value))

    def set_int(self, name: str, value: int) -> "Args":
        check(lib.ndx_args_set_int(self.ptr, name.encode(), int(value)))
        return self

    def set_float(self, name: str, value: float) -> "Args":
        check(lib.ndx_args_set_float(self.ptr, name.encode(), float(value)))
        return self

    def set_bool(self, name: str, value: bool) -> "Args":
        check(lib.ndx_args_set_bool(self.ptr, name.encode(), bool(value)))
        return self

    def set_string(self, name: str, value: str) -> "Args":
        check(lib.ndx_args_set_string(self.ptr, name.encode(), value.encode()))
        return self

    def set_dtype(self, name: str, dtype: int) -> "Args":
        check(lib.ndx_args_set_dtype(self.ptr, name.encode(), int(dtype)))
        return self

    def set_int_array(self, name: str, values) -> "Args":
        arr = (c_int64 * max(len(values), 1))(*[int(v) for v in values])
        check(lib.ndx_args_set_int_array(self.ptr, name.encode(), arr, len(values)))
        return self

    def set_float_array(self, name: str, values) -> "Args":
        arr = (ctypes.c_double * max(len(values), 1))(*[float(v) for v in values])
        check(lib.ndx_args_set_float_array(self.ptr, name.encode(), arr, len(values)))
        return self


def _args_ptr(args) -> tuple:
    """The `ndx_args_t*` for `args`: None, an Args, a dict (built into a temporary
    Args, returned with it to keep it alive), or a raw pointer (int)."""
    if args is None or isinstance(args, int):
        return args, None
    if isinstance(args, dict):
        args = Args(**args)
    return args.ptr, args


# --------------------------------------------------------------------------- contexts


class Invocation:
    """An invocation prepared once (operator, inputs, options) and run many times:
    each `invoke_raw()` is exactly one foreign call (`ndx_invoke`). One Invocation
    object must not be invoked from several threads at once (its out-param is shared);
    prepare one per thread."""

    def __init__(self, ctx: "Context", op: str, inputs, mode: int = NDX_EVAL_CONTEXT_DEFAULT, args=None):
        self.ctx = ctx
        self.tensors = [as_tensor(x) for x in inputs]  # keeps the handles alive
        self.op = op.encode()
        self.n = len(self.tensors)
        self.inputs = (ndx_input_t * max(self.n, 1))()
        for i, t in enumerate(self.tensors):
            self.inputs[i].tensor = t.ptr
        self.opts = ndx_invoke_options_t()
        self.opts.struct_size = ctypes.sizeof(ndx_invoke_options_t)
        self.opts.mode = mode
        self.args, self._args_keep = _args_ptr(args)
        self._out = c_void_p()
        self._out_ref = byref(self._out)
        self._opts_ref = byref(self.opts)
        self._invoke = lib.ndx_invoke

    def invoke_raw(self) -> int:
        """Invokes; returns the new `ndx_future_t*` (an int) for the caller to
        release with `lib.ndx_future_release`. Raises NdxError on call-time errors."""
        err = self._invoke(
            self.ctx.ptr, self.op, self.inputs, self.n, self.args, self._opts_ref, self._out_ref
        )
        if err:
            raise NdxError.from_ptr(err)
        return self._out.value

    def __call__(self) -> Future:
        return Future(self.invoke_raw())


class Context:
    """An owned reference to an `ndx_context_t`."""

    def __init__(
        self,
        mode: int = 0,
        capture: int = 0,
        depth: int = 0,
        backend: Optional[str] = None,
        num_threads: int = 0,
        check_policy: int = 0,
        check_categories: int = 0,
        check_capacity: int = 0,
        repro_max_bytes: int = 0,
        cuda_device: int = 0,
    ):
        opts = ndx_context_options_t()
        opts.struct_size = ctypes.sizeof(ndx_context_options_t)
        opts.eval_mode = mode
        opts.capture_policy = capture
        opts.capture_depth = depth
        opts.num_threads = num_threads
        opts.backend = None if backend is None else backend.encode()
        opts.check_policy = check_policy
        opts.check_categories = check_categories
        opts.check_capacity = check_capacity
        opts.repro_max_bytes = repro_max_bytes
        opts.cuda_device = cuda_device
        out = c_void_p()
        check(lib.ndx_context_new(byref(opts), byref(out)))
        self.ptr = out.value
        self.provider = None

    def release(self) -> None:
        ptr, self.ptr = self.ptr, None
        if ptr:
            lib.ndx_context_release(ptr)

    def __del__(self):
        try:
            self.release()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def set_capture_policy(self, policy: int, depth: int = 0) -> None:
        check(lib.ndx_context_set_capture_policy(self.ptr, policy, depth))

    def set_eval_mode(self, mode: int) -> None:
        check(lib.ndx_context_set_eval_mode(self.ptr, mode))

    def set_backend(self, name: str) -> None:
        check(lib.ndx_context_set_backend(self.ptr, name.encode()))

    def set_checks(self, policy: int, categories: int = 0, capacity: int = 0) -> None:
        """`ndx_context_set_checks`: an NDX_CHECKS_* policy, a mask of NDX_CHECK_*
        categories (0: all) and the distinct flags kept between reports (0: 1024)."""
        check(lib.ndx_context_set_checks(self.ptr, policy, categories, capacity))

    def take_check_errors(self) -> Optional[NdxError]:
        """`ndx_context_take_check_errors`: the NdxError (CheckError) grouping the
        flags collected so far, in enqueue order, or None when there is none."""
        err = lib.ndx_context_take_check_errors(self.ptr)
        return NdxError.from_ptr(err) if err else None

    def set_repro_max_bytes(self, max_bytes: int) -> None:
        """`ndx_context_set_repro_max_bytes` (0: metadata only)."""
        check(lib.ndx_context_set_repro_max_bytes(self.ptr, max_bytes))

    def repro_run(self, document: str) -> "Future":
        """`ndx_repro_run`: replays a repro document; the future of the replay."""
        out = c_void_p()
        check(lib.ndx_repro_run(self.ptr, document.encode(), byref(out)))
        return Future(out.value)

    def explain(self) -> Explain:
        """`ndx_context_explain`: an `Explain` copy of what the context evaluated so far
        (graphs, graph breaks, invocations per mode, check flags)."""
        out = c_void_p()
        check(lib.ndx_context_explain(self.ptr, byref(out)))
        try:
            return Explain.from_borrowed(out.value)
        finally:
            lib.ndx_explain_free(out.value)

    def set_frame_provider(self, provider: Optional[PythonFrameProvider] = "default"):
        """Registers `provider` (a new PythonFrameProvider by default; None removes
        it). Returns the provider. Its CFUNCTYPE stays alive until ndx calls
        `user_free` for it (replaced, or the context freed)."""
        if provider == "default":
            provider = PythonFrameProvider()
        if provider is None:
            check(
                lib.ndx_context_set_frame_provider(self.ptr, FRAME_PROVIDER_T(), None, USER_FREE_T())
            )
            self.provider = None
            return None
        with _live_lock:
            key = _next_key[0]
            _next_key[0] += 1
            _live_providers[key] = provider.callback
        err = lib.ndx_context_set_frame_provider(self.ptr, provider.callback, key, _USER_FREE)
        # On failure ndx has dropped `user` (and called user_free); check() raises.
        check(err)
        self.provider = provider
        return provider

    def prepare(self, op: str, inputs, mode: int = NDX_EVAL_CONTEXT_DEFAULT, args=None) -> Invocation:
        return Invocation(self, op, inputs, mode, args)

    def invoke(
        self, op: str, inputs, mode: int = NDX_EVAL_CONTEXT_DEFAULT, args=None, out=None
    ) -> Future:
        """Invokes `op` on `inputs` (Tensors, or arrays imported through DLPack) with
        named `args` (None, an `Args`, or a dict of keyword values for `Args`). `out`:
        None, or one out tensor per output (a Tensor, an array imported through DLPack
        without copying, or None to let ndx allocate that output)."""
        args_ptr, _keep = _args_ptr(args)
        tensors = [as_tensor(x) for x in inputs]
        arr = (ndx_input_t * max(len(tensors), 1))()
        for i, t in enumerate(tensors):
            arr[i].tensor = t.ptr
        opts = ndx_invoke_options_t()
        opts.struct_size = ctypes.sizeof(ndx_invoke_options_t)
        opts.mode = mode
        if out is not None:
            out_tensors = [None if o is None else as_tensor(o) for o in out]
            outs = (ndx_output_t * max(len(out_tensors), 1))()
            for i, t in enumerate(out_tensors):
                outs[i].tensor = None if t is None else t.ptr
            opts.outputs = ctypes.cast(outs, POINTER(ndx_output_t))
            opts.n_outputs = len(out_tensors)
        out = c_void_p()
        check(lib.ndx_invoke(self.ptr, op.encode(), arr, len(tensors), args_ptr, byref(opts), byref(out)))
        return Future(out.value)

    def evaluate(self) -> None:
        """`ndx_context_evaluate`: raises the NdxError grouping unobserved failures."""
        check(lib.ndx_context_evaluate(self.ptr))


def live_provider_count() -> int:
    """How many frame-provider callbacks ndx may still call (for leak tests)."""
    with _live_lock:
        return len(_live_providers)
