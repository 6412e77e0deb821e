#!/usr/bin/env bash
# Builds what a lent GPU machine needs to run ndx's CUDA tests and benchmark, into
# .gpu/ (in .gitignore; carry it with the `device` tool's `carry: [".gpu"]`).
# The GPU machines have no Rust toolchain, no compiler and no network: everything
# compiled is built here (both are x86-64) and stripped. Then, on the GPU machine:
#   bash scripts/gpu_run.sh
# See docs/cuda.md, "Running them on a lent GPU".
set -euo pipefail
cd "$(dirname "$0")/.."
build=${NDX_BUILD_DIR:-build}
out=.gpu

rm -rf "$out"
mkdir -p "$out"

# The library, and the Rust CUDA tests as one test binary, with the test hooks: the
# CMake-built c_test_cuda (NDX_TEST_HOOKS on by default) calls them, and so do the
# debug backend's device tests.
cargo build --release --features test-hooks
test_bin=$(cargo test --release --features test-hooks --no-run --test cuda_api 2>&1 |
  grep -o 'target/release/deps/cuda_api-[0-9a-f]*' | tail -1)
cp target/release/libndx.so "$out/libndx.so"
cp "$test_bin" "$out/cuda_api"

# The C test of the CUDA API (it links libndx.so.0; gpu_run.sh links that name).
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" --target c_test_cuda -j2 >/dev/null
cp "$build/c_test_cuda" "$out/c_test_cuda"
# The C test keeps its debug information: it checks frames by file and line.
strip "$out/libndx.so" "$out/cuda_api"

# pytest, in case the machine's Python lacks it: pure-Python wheels unpacked for the
# oldest Python we may meet (their conditional dependencies included).
python3 -m pip install -q --target "$out/site" --only-binary=:all: \
  --python-version 3.9 --implementation py --no-compile pytest

du -sh "$out"/* "$out"
