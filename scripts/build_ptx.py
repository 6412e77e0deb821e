#!/usr/bin/env python3
"""Compiles ndx's CUDA kernels (src/cuda/kernels/*.cu) to PTX with NVRTC, ahead of time.

The PTX is committed under src/cuda/ptx/ and loaded at run time with the driver API,
so ndx needs only libcuda on a GPU machine and no CUDA toolkit anywhere. Like the
cbindgen header, the committed PTX must stay in sync with its sources: CI runs

    python3 scripts/build_ptx.py --check

which recompiles everything and fails, naming the file and the first differing line,
when a committed .ptx differs from the fresh output (or is missing, or has no source).

NVRTC comes from the PyPI wheel pinned below (no GPU needed):

    python3 -m pip install "$(python3 scripts/build_ptx.py --requirement)"

It is found through the installed `nvidia` package (nvidia/cuda_nvrtc/lib/
libnvrtc.so.12), or at the path in the environment variable NDX_NVRTC_LIBRARY. The
PTX starts with NVRTC's version comment, so another NVRTC version fails the check:
regenerate only with the pinned one.

Each `X.cu` becomes `X.ptx`. The `*.cuh` files of the source directory are handed to
NVRTC as in-memory headers (by file name), so `#include "ndx_common.cuh"` works and
nothing on the include path of this machine can leak in; the sources include no CUDA
header. Compiler options (fixed, so the output is reproducible):

    --gpu-architecture=compute_70  PTX for Volta and later (the driver JIT-compiles it
                                   for the GPU it runs on); the lowest target with
                                   cvt.f32.f16 / cvt.rn.f16.f32 and 64-bit atomicMin
    --std=c++17
    --fmad=false                   no fused multiply-add contraction: float results
                                   equal the CPU kernels' (Rust never contracts)
    --ftz=false --prec-div=true --prec-sqrt=true
                                   IEEE denormals, division and square root (NVRTC's
                                   defaults, spelled out)
    --no-source-include            no implicit include path from the source's folder
    -DNDX_NVRTC=1

No debug or line information is emitted, so the PTX holds no file paths.

Usage:
    build_ptx.py                 write src/cuda/ptx/*.ptx
    build_ptx.py --check         compile and compare with the committed PTX
    build_ptx.py --src DIR --out DIR [--check]
    build_ptx.py --requirement   print the pip requirement of the pinned NVRTC
Exit status: 0 success, 1 a compile error or a difference, 2 NVRTC not found or
unusable (or bad usage).
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import importlib.util
import os
import re
import sys

NVRTC_REQUIREMENT = "nvidia-cuda-nvrtc-cu12==12.8.93"
NVRTC_VERSION = (12, 8)

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
DEFAULT_SRC = os.path.join(REPO_ROOT, "src", "cuda", "kernels")
DEFAULT_OUT = os.path.join(REPO_ROOT, "src", "cuda", "ptx")

OPTIONS = [
    "--gpu-architecture=compute_70",
    "--std=c++17",
    "--fmad=false",
    "--ftz=false",
    "--prec-div=true",
    "--prec-sqrt=true",
    "--no-source-include",
    "-DNDX_NVRTC=1",
]


class NvrtcMissing(Exception):
    """NVRTC could not be found or loaded."""


def find_nvrtc() -> str | None:
    """The path of libnvrtc.so.12: NDX_NVRTC_LIBRARY, else the `nvidia` wheel's."""
    env = os.environ.get("NDX_NVRTC_LIBRARY")
    if env:
        return env
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return None
    for base in spec.submodule_search_locations:
        for name in ("libnvrtc.so.12", "libnvrtc.so"):
            path = os.path.join(base, "cuda_nvrtc", "lib", name)
            if os.path.isfile(path):
                return path
    return None


class Nvrtc:
    """The few NVRTC entry points the build needs, through ctypes."""

    def __init__(self, path: str):
        try:
            # The builtins library lies beside libnvrtc; load it first so that
            # libnvrtc's dlopen of it succeeds whatever the loader's search path.
            for b in sorted(glob.glob(os.path.join(os.path.dirname(path), "libnvrtc-builtins.so*"))):
                if ".alt." not in b:
                    ctypes.CDLL(b, mode=ctypes.RTLD_GLOBAL)
            self.lib = ctypes.CDLL(path)
        except OSError as e:
            raise NvrtcMissing(f"cannot load NVRTC from {path}: {e}") from e
        lib = self.lib
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        lib.nvrtcGetErrorString.argtypes = [ctypes.c_int]
        lib.nvrtcVersion.argtypes = [ctypes.POINTER(ctypes.c_int)] * 2
        lib.nvrtcCreateProgram.argtypes = [
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.c_char_p,
            ctypes.c_char_p,
            ctypes.c_int,
            ctypes.POINTER(ctypes.c_char_p),
            ctypes.POINTER(ctypes.c_char_p),
        ]
        lib.nvrtcCompileProgram.argtypes = [
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.POINTER(ctypes.c_char_p),
        ]
        lib.nvrtcGetProgramLogSize.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
        lib.nvrtcGetProgramLog.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.nvrtcGetPTXSize.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
        lib.nvrtcGetPTX.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.nvrtcDestroyProgram.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        self.path = path

    def _ok(self, code: int, what: str) -> None:
        if code != 0:
            msg = self.lib.nvrtcGetErrorString(code).decode()
            raise RuntimeError(f"{what}: {msg} ({code})")

    def version(self) -> tuple[int, int]:
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._ok(self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
        return major.value, minor.value

    def compile(self, source: bytes, name: str, headers: dict[str, bytes]) -> tuple[bytes | None, str]:
        """(PTX or None on a compile error, NVRTC's log)."""
        prog = ctypes.c_void_p()
        names = list(headers)
        hdr_src = (ctypes.c_char_p * max(1, len(names)))(*[headers[n] for n in names])
        hdr_names = (ctypes.c_char_p * max(1, len(names)))(*[n.encode() for n in names])
        self._ok(
            self.lib.nvrtcCreateProgram(
                ctypes.byref(prog), source, name.encode(), len(names), hdr_src, hdr_names
            ),
            "nvrtcCreateProgram",
        )
        try:
            opts = (ctypes.c_char_p * len(OPTIONS))(*[o.encode() for o in OPTIONS])
            rc = self.lib.nvrtcCompileProgram(prog, len(OPTIONS), opts)
            size = ctypes.c_size_t()
            self._ok(self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)), "log size")
            buf = ctypes.create_string_buffer(size.value)
            self._ok(self.lib.nvrtcGetProgramLog(prog, buf), "log")
            log = buf.value.decode(errors="replace")
            if rc != 0:
                return None, log
            self._ok(self.lib.nvrtcGetPTXSize(prog, ctypes.byref(size)), "PTX size")
            buf = ctypes.create_string_buffer(size.value)
            self._ok(self.lib.nvrtcGetPTX(prog, buf), "PTX")
            return buf.raw[: size.value].rstrip(b"\0"), log
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(prog))


def display_name(path: str) -> str:
    """A path as the log should show it: relative to the repository when inside it."""
    path = os.path.abspath(path)
    rel = os.path.relpath(path, REPO_ROOT)
    return path if rel.startswith("..") else rel


def gcc_style(log: str) -> str:
    """NVRTC writes `file(12): error: ...`; make it `file:12: error: ...`."""
    return re.sub(r"^(.+?)\((\d+)\): ", r"\1:\2: ", log, flags=re.MULTILINE)


def first_difference(old: list[str], new: list[str]) -> tuple[int, str, str]:
    for i in range(max(len(old), len(new))):
        a = old[i] if i < len(old) else "<end of file>"
        b = new[i] if i < len(new) else "<end of file>"
        if a != b:
            return i + 1, a, b
    return 0, "", ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the PTX in --out instead of writing")
    ap.add_argument("--src", default=DEFAULT_SRC, help="folder of the .cu/.cuh sources")
    ap.add_argument("--out", default=DEFAULT_OUT, help="folder of the .ptx files")
    ap.add_argument("--requirement", action="store_true", help="print the pinned NVRTC pip requirement")
    args = ap.parse_args(argv)

    if args.requirement:
        print(NVRTC_REQUIREMENT)
        return 0

    path = find_nvrtc()
    if path is None:
        print(
            "build_ptx: NVRTC not found; install it with\n"
            f"    python3 -m pip install {NVRTC_REQUIREMENT}\n"
            "or set NDX_NVRTC_LIBRARY to a libnvrtc.so.12",
            file=sys.stderr,
        )
        return 2
    try:
        nvrtc = Nvrtc(path)
        version = nvrtc.version()
    except (NvrtcMissing, RuntimeError, AttributeError) as e:
        print(f"build_ptx: {e}", file=sys.stderr)
        return 2
    if version != NVRTC_VERSION:
        print(
            f"build_ptx: warning: NVRTC {version[0]}.{version[1]} at {path}; the committed PTX "
            f"comes from {NVRTC_REQUIREMENT}",
            file=sys.stderr,
        )

    sources = sorted(glob.glob(os.path.join(args.src, "*.cu")))
    if not sources:
        print(f"build_ptx: no .cu files in {args.src}", file=sys.stderr)
        return 2
    headers = {
        os.path.basename(h): open(h, "rb").read()
        for h in sorted(glob.glob(os.path.join(args.src, "*.cuh")))
    }

    failed = False
    expected = set()
    for src in sources:
        stem = os.path.splitext(os.path.basename(src))[0]
        target = os.path.join(args.out, stem + ".ptx")
        expected.add(os.path.basename(target))
        ptx, log = nvrtc.compile(open(src, "rb").read(), display_name(src), headers)
        if ptx is None:
            failed = True
            print(f"build_ptx: {display_name(src)}: compilation failed:", file=sys.stderr)
            print(gcc_style(log).rstrip(), file=sys.stderr)
            continue
        # NVRTC 12.x warns that compute_70 is deprecated; anything else is shown.
        noise = "Architectures prior to '<compute/sm>_75' are deprecated"
        rest = [l for l in log.splitlines() if l.strip() and noise not in l]
        if rest:
            print(gcc_style("\n".join(rest)), file=sys.stderr)
        if not ptx.endswith(b"\n"):
            ptx += b"\n"
        if args.check:
            if not os.path.isfile(target):
                failed = True
                print(f"build_ptx: {display_name(target)} is missing (source {display_name(src)})", file=sys.stderr)
                continue
            old = open(target, "rb").read()
            if old != ptx:
                failed = True
                line, a, b = first_difference(
                    old.decode(errors="replace").split("\n"), ptx.decode(errors="replace").split("\n")
                )
                print(
                    f"build_ptx: {display_name(target)} is out of date with {display_name(src)}: "
                    f"first difference at line {line}:\n"
                    f"  committed: {a}\n"
                    f"  fresh:     {b}\n"
                    "  regenerate with: python3 scripts/build_ptx.py",
                    file=sys.stderr,
                )
        else:
            os.makedirs(args.out, exist_ok=True)
            with open(target, "wb") as f:
                f.write(ptx)
            print(f"build_ptx: wrote {display_name(target)} ({len(ptx)} bytes)")

    stale = sorted(
        os.path.basename(p)
        for p in glob.glob(os.path.join(args.out, "*.ptx"))
        if os.path.basename(p) not in expected
    )
    for s in stale:
        failed = True
        print(
            f"build_ptx: {display_name(os.path.join(args.out, s))} has no source in "
            f"{display_name(args.src)}; delete it",
            file=sys.stderr,
        )
    if args.check and not failed:
        print(f"build_ptx: {len(sources)} PTX files in sync with their sources")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
