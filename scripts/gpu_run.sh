#!/usr/bin/env bash
# Runs ndx's CUDA tests and benchmark on a machine with an NVIDIA GPU, from the .gpu/
# bundle that scripts/gpu_bundle.sh built. Every step runs even when an earlier one
# fails (one call of a lent machine should tell everything); each step's output goes
# to $OUT/<step>.log (or /tmp/ndx-gpu) and a summary with each exit status is printed
# last. The exit status is that of the first failing step.
#
#   bash scripts/gpu_run.sh                  # every step: gpu cuda_api c_test pytest bench
#   bash scripts/gpu_run.sh pytest bench     # only these, e.g. to rerun what failed
#
# The steps' time limits add up to 570 s, under the device tool's 600 s per command,
# so a run that hangs still comes back with its logs and summary.
set -uo pipefail
cd "$(dirname "$0")/.."
gpu=$(pwd)/.gpu
logs=${OUT:-/tmp/ndx-gpu}
mkdir -p "$logs"
[ -f "$gpu/libndx.so" ] || { echo "no $gpu/libndx.so: run scripts/gpu_bundle.sh first" >&2; exit 2; }
ln -sf libndx.so "$gpu/libndx.so.0"
python3 -c 'import pytest' 2>/dev/null || export PYTHONPATH="$gpu/site${PYTHONPATH:+:$PYTHONPATH}"
export NDX_LIBRARY="$gpu/libndx.so"

steps=(gpu cuda_api c_test pytest bench)
wanted=("$@")
[ ${#wanted[@]} -gt 0 ] || wanted=("${steps[@]}")
for w in "${wanted[@]}"; do
  [[ " ${steps[*]} " == *" $w "* ]] || { echo "unknown step '$w' (steps: ${steps[*]})" >&2; exit 2; }
done

status=0
summary=()
step() {
  local name=$1 limit=$2
  shift 2
  [[ " ${wanted[*]} " == *" $name "* ]] || return 0
  local t0=$SECONDS
  printf '\n==> %s: %s\n' "$name" "$*"
  timeout "$limit" "$@" > "$logs/$name.log" 2>&1
  local rc=$?
  tail -n 40 "$logs/$name.log"
  summary+=("$(printf '%-10s rc=%-3s %4ss' "$name" "$rc" "$((SECONDS - t0))")")
  [ "$rc" -ne 0 ] && [ "$status" -eq 0 ] && status=$rc
  return 0
}

step gpu 20 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
step cuda_api 100 "$gpu/cuda_api" --nocapture --test-threads=4
step c_test 40 env LD_LIBRARY_PATH="$gpu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$gpu/c_test_cuda"
step pytest 240 env NDX_REQUIRE_CUDA=1 python3 -m pytest -q -p no:cacheprovider -rs \
  tests/python/test_cuda.py tests/python/test_cuda_kernels_gpu.py \
  tests/python/test_cuda_ops.py tests/python/test_cuda_interop.py
step bench 170 python3 benches/cuda_bench.py

printf '\n==> summary\n'
printf '%s\n' "${summary[@]}"
exit "$status"
