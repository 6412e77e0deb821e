#!/usr/bin/env bash
# Runs every test of ndx: formatting, lints, Rust tests, the C/C++ tests and examples
# (ctest, valgrind included), and checks that the committed header is in sync.
# Needs: a Rust toolchain with rustfmt and clippy, cmake, a C/C++ compiler, valgrind,
# pkg-config, python3 with pip (for the official dlpack.h used by one compatibility
# test), numpy and pytest (the Python FFI tests), opencv-python-headless and
# ml_dtypes (references for the image operators and bfloat16), pyflakes (lint of the
# Python files), and the NVRTC wheel named by `scripts/build_ptx.py --requirement`
# (compiles the CUDA kernel sources; no GPU needed; without it the PTX checks skip
# unless NDX_REQUIRE_NVRTC=1), and g++ (the emulated CUDA driver the CUDA tests run on
# where there is no GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${NDX_BUILD_DIR:-build}

step() { printf '\n==> %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --check

step "cargo clippy (default features and test-hooks)"
cargo clippy --all-targets -- -D warnings
cargo clippy --all-targets --features test-hooks -- -D warnings

step "cargo test"
cargo test

# Python lints (unused imports, undefined names) of the FFI tests and scripts.
step "pyflakes"
if python3 -m pyflakes --version >/dev/null 2>&1; then
  python3 -m pyflakes tests/python tests/cuda_emu scripts
else
  echo "note: pyflakes not installed (pip install pyflakes); Python lint skipped"
fi

# The call-site tests again in a build with line tables only (a common profile for
# users who want file and line in backtraces and nothing more): inlined frames have no
# path in their names there, and sites must still point at the caller's line.
step "cargo test of call sites with debug = line-tables-only"
CARGO_PROFILE_DEV_DEBUG=line-tables-only CARGO_TARGET_DIR=target/line-tables \
  cargo test --test checks_api --test error_api

# The CUDA tests again, on the emulated driver of tests/cuda_emu (g++; no GPU): the
# tests that need a device run the launchers, the pool and the copies (with the test
# hooks, which the debug backend's device test needs).
step "cargo test --test cuda_api on the emulated CUDA driver"
emu_dir="$(dirname "$(python3 tests/cuda_emu/build.py "$build/cuda_emu")")"
LD_LIBRARY_PATH="$emu_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" cargo test --test cuda_api --features test-hooks

# An official dlpack.h (from the apache-tvm-ffi wheel) for the include-order tests.
dlpack_dir=${NDX_OFFICIAL_DLPACK_INCLUDE_DIR:-}
if [ -z "$dlpack_dir" ]; then
  third="$build/third_party"
  if [ ! -f "$third/include/dlpack/dlpack.h" ]; then
    mkdir -p "$third"
    if python3 -m pip download -q --no-deps apache-tvm-ffi==0.1.15.post2 -d "$third/wheel" 2>/dev/null; then
      python3 - "$third" <<'PY'
import glob, os, sys, zipfile
third = sys.argv[1]
wheel = glob.glob(os.path.join(third, "wheel", "*.whl"))[0]
os.makedirs(os.path.join(third, "include", "dlpack"), exist_ok=True)
with zipfile.ZipFile(wheel) as z:
    data = z.read("tvm_ffi/include/dlpack/dlpack.h")
open(os.path.join(third, "include", "dlpack", "dlpack.h"), "wb").write(data)
PY
    fi
  fi
  if [ -f "$third/include/dlpack/dlpack.h" ]; then
    dlpack_dir="$(cd "$third/include" && pwd)"
  elif [ "${NDX_REQUIRE_OFFICIAL_DLPACK:-0}" = 1 ]; then
    echo "could not fetch an official dlpack.h (apache-tvm-ffi wheel)" >&2
    exit 1
  else
    echo "note: no official dlpack.h available; the dlpack_order_* tests are skipped"
  fi
fi

step "CUDA kernels: committed PTX in sync with src/cuda/kernels (NVRTC)"
status=0
python3 scripts/build_ptx.py --check || status=$?
if [ "$status" = 2 ] && [ "${NDX_REQUIRE_NVRTC:-0}" != 1 ]; then
  echo "note: NVRTC not installed ($(python3 scripts/build_ptx.py --requirement)); PTX check skipped"
elif [ "$status" != 0 ]; then
  exit "$status"
fi

step "cmake configure and build ($build)"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DNDX_OFFICIAL_DLPACK_INCLUDE_DIR="$dlpack_dir"
cmake --build "$build" -j"$(nproc)"

step "generated header in sync with git"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  if ! git diff --exit-code -- include/; then
    echo "include/ndx.h changed during the build: regenerate it (cargo build) and commit it" >&2
    exit 1
  fi
else
  echo "not a git checkout: header sync check skipped"
fi

step "ctest (C and C++ tests, examples under valgrind, install consumers)"
# --timeout: a test that hangs fails on its own after 10 minutes (the slowest, valgrind
# runs included, take well under one) instead of holding up CI until it is killed.
ctest --test-dir "$build" --output-on-failure -j"$(nproc)" --timeout 600

step "Python FFI tests (ctypes + pytest) against $build/cargo/release/libndx.so"
NDX_LIBRARY="$(cd "$build" && pwd)/cargo/release/libndx.so" python3 -m pytest -q -p no:cacheprovider tests/python
