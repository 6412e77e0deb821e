#!/usr/bin/env bash
# Runs ndx's Rust tests under AddressSanitizer (LeakSanitizer included) and
# ThreadSanitizer: every test binary as `cargo test` builds it, then the CUDA tests
# again on the emulated driver of tests/cuda_emu (as scripts/test.sh does), so the
# FFI, DLPack and CUDA code paths run instrumented. Then the DLPack and out-tensor
# tests under Miri, which checks the unsafe code's pointer use against Rust's
# aliasing rules (Tree Borrows), something neither sanitizer sees.
# Not part of scripts/test.sh: it needs a nightly toolchain with rust-src (std is
# rebuilt instrumented, so that its atomics and allocations are seen too) and miri,
# takes about 25 minutes on 2 cores, and leaves about 30 GB of builds under
# target/san-address and target/san-thread (the instrumented std, debug info
# included, is linked into every test binary): delete them when done.
#
#   rustup toolchain install nightly --component rust-src miri   # once
#   scripts/sanitize.sh [address|thread|miri]...                  # default: all three
#
# Exits non-zero when a test fails or a sanitizer reports anything; each binary's
# output is in target/san-<sanitizer>/logs/.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${NDX_BUILD_DIR:-build}
host=$(rustc -vV | sed -n 's/^host: //p')
sanitizers=("$@")
[ ${#sanitizers[@]} -gt 0 ] || sanitizers=(address thread miri)
for san in "${sanitizers[@]}"; do
  case $san in
    address | thread | miri) ;;
    *) echo "unknown sanitizer '$san' (address, thread or miri)" >&2; exit 2 ;;
  esac
done

# What each sanitizer is told, and why:
# - allocator_may_return_null=1: tests ask for tensors of petabytes and expect
#   NDX_ERROR_MEMORY, as from malloc; by default the sanitizers abort instead.
# - detect_stack_use_after_return=0 (address): a C entry point of ndx marks its own
#   frame with the address of a local, and capture skips frames below that address.
#   With this option on, ASan moves locals to a heap-allocated "fake stack", so the
#   mark no longer bounds the real stack and frames of ndx and of `backtrace` show in
#   the sites the tests check. A build without ASan always has the local on the stack.
# - race:crossbeam_deque::deque::Buffer (thread): the work-stealing deque under
#   rayon's pool reads a slot speculatively (Stealer::steal) while its owner writes
#   it (Worker::push), and discards the value when its compare-and-swap loses; the
#   fences that order this are not modelled by TSan, so it reports every such pair.
# - race:libcuda.so (thread): the emulated driver is C++ built without TSan. TSan
#   sees none of its loads and stores, only the calls it intercepts (malloc, free,
#   pthread), so when the driver frees an event whose shared_ptr count another
#   thread dropped, the free reads as a race with that thread's earlier wait. Races
#   in ndx's own code are still reported.
# - Tests with "fork" in their name are skipped under TSan, which refuses to start
#   threads in the child of a multi-threaded fork (it ends the child).
# - Miri runs only tests/dlpack_api.rs and tests/out_api.rs: ndx keeps a site's
#   return addresses as integers and symbolises them later, and under Miri an integer
#   address has no provenance to resolve, so tests that read frames cannot run there.
#   NDX_CUDA_DISABLE=1, as Miri cannot dlopen a driver; its pool threads outlive the
#   tests (-Zmiri-ignore-leaks); crossbeam's epoch lists break the stricter Stacked
#   Borrows model, a known report that Tree Borrows does not make.
supp=$(mktemp)
trap 'rm -f "$supp"' EXIT
printf '%s\n' 'race:crossbeam_deque::deque::Buffer' 'race:libcuda.so' > "$supp"
asan_opts="detect_leaks=1:allocator_may_return_null=1:detect_stack_use_after_return=0"
tsan_opts="halt_on_error=0 report_signal_unsafe=0 allocator_may_return_null=1 suppressions=$supp"

emu_dir="$(dirname "$(python3 tests/cuda_emu/build.py "$build/cuda_emu")")"

status=0
summary=()

# Builds the tests with `cargo test ARGS --no-run` under sanitizer $1 and prints
# their executables, one per line.
build_tests() {
  local san=$1
  shift
  RUSTFLAGS="-Zsanitizer=$san" RUSTDOCFLAGS="-Zsanitizer=$san" \
    CARGO_TARGET_DIR="target/san-$san" \
    cargo +nightly test -Zbuild-std --target "$host" --no-run \
    --message-format=json "$@" |
    python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])'
}

# Runs one test binary; records its exit status and how many reports it printed.
run_binary() {
  local san=$1 exe=$2 tag=$3
  shift 3
  local logs="target/san-$san/logs"
  mkdir -p "$logs"
  local log
  log="$logs/$(basename "$exe")$tag.log"
  local t0=$SECONDS
  if [ "$san" = address ]; then
    env ASAN_OPTIONS="$asan_opts" "$@" "$exe" -q > "$log" 2>&1
  else
    env TSAN_OPTIONS="$tsan_opts" "$@" "$exe" -q --skip fork > "$log" 2>&1
  fi
  local rc=$?
  local reports
  reports=$(grep -c -E '^(==[0-9]+==ERROR: (Address|Leak)Sanitizer|WARNING: ThreadSanitizer)' "$log")
  summary+=("$(printf '%-8s %-40s rc=%-3s reports=%-3s %4ss' "$san" "$(basename "$exe")$tag" "$rc" "$reports" "$((SECONDS - t0))")")
  if [ "$rc" -ne 0 ] || [ "$reports" -ne 0 ]; then
    status=1
    echo "FAILED: $log" >&2
    grep -E -A20 '^(==[0-9]+==ERROR|WARNING: ThreadSanitizer)|panicked at' "$log" | head -n 60 >&2
  fi
}

# The DLPack and out-tensor tests under Miri (see above for why only these).
run_miri() {
  local log=target/san-miri/logs/miri.log
  printf '\n==> miri: tests/dlpack_api.rs and tests/out_api.rs\n'
  mkdir -p "$(dirname "$log")"
  local t0=$SECONDS
  NDX_CUDA_DISABLE=1 \
    MIRIFLAGS="-Zmiri-disable-isolation -Zmiri-permissive-provenance -Zmiri-tree-borrows -Zmiri-ignore-leaks" \
    cargo +nightly miri test --test dlpack_api --test out_api > "$log" 2>&1
  local rc=$?
  summary+=("$(printf '%-8s %-40s rc=%-3s %4ss' miri "dlpack_api out_api" "$rc" "$((SECONDS - t0))")")
  if [ "$rc" -ne 0 ]; then
    status=1
    echo "FAILED: $log" >&2
    grep -E -A30 '^error|panicked at' "$log" | head -n 60 >&2
  fi
}

# Every test binary under sanitizer $1, then the CUDA and unit tests on the emulated
# driver.
run_sanitizer() {
  local san=$1 list="target/san-$1/tests"
  printf '\n==> %s: build\n' "$san"
  mkdir -p "target/san-$san"
  build_tests "$san" > "$list.plain" || { echo "the $san build failed" >&2; exit 1; }
  build_tests "$san" --features test-hooks --lib --test cuda_api > "$list.emu" ||
    { echo "the $san build (test-hooks) failed" >&2; exit 1; }
  local exe plain emu
  mapfile -t plain < "$list.plain"
  mapfile -t emu < "$list.emu"
  printf '\n==> %s: run\n' "$san"
  for exe in "${plain[@]}"; do
    run_binary "$san" "$exe" ""
  done
  for exe in "${emu[@]}"; do
    run_binary "$san" "$exe" "+emu" env LD_LIBRARY_PATH="$emu_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  done
}

for san in "${sanitizers[@]}"; do
  case $san in
    address | thread) run_sanitizer "$san" ;;
    miri) run_miri ;;
  esac
done

printf '\n==> summary\n'
printf '%s\n' "${summary[@]}"
exit "$status"
