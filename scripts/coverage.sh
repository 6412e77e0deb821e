#!/usr/bin/env bash
# Line coverage of src/ by every test: which lines no test runs. The Rust tests (the
# CUDA ones again on the emulated driver of tests/cuda_emu, as scripts/test.sh runs
# them), then the C tests and examples and the Python FFI tests against one
# instrumented libndx.so. A line counts as covered when any of them ran it: the Rust
# test binaries and the shared library are separate builds, whose counters are read
# separately and joined per line (given both builds of a function at once, llvm-cov
# reports them as mismatched data).
# Not part of scripts/test.sh: it is for finding untested code, not a gate. It needs
# the llvm-tools component (`rustup component add llvm-tools-preview`), the build of
# scripts/test.sh's cmake step (for the C programs; without it they are left out) and
# what the Python tests need. About 10 minutes on 2 cores, and 11 GB under
# target/coverage: every crate is built instrumented, twice (debug for the Rust tests,
# release for the library).
#
#   scripts/coverage.sh        # prints the table; writes target/coverage/{summary,missed}.txt
#
# missed.txt lists every line no test ran, with its text, by file. Generic code is
# counted per instantiation and joined: a line of a kernel shows as run when any
# dtype ran it. Exits non-zero when a test failed (the figures then miss its lines).
set -uo pipefail
cd "$(dirname "$0")/.."
build=${NDX_BUILD_DIR:-build}
host=$(rustc -vV | sed -n 's/^host: //p')
tools="$(rustc --print sysroot)/lib/rustlib/$host/bin"
if [ ! -x "$tools/llvm-profdata" ] || [ ! -x "$tools/llvm-cov" ]; then
  echo "llvm-profdata/llvm-cov not found in $tools: rustup component add llvm-tools-preview" >&2
  exit 2
fi
out="$PWD/target/coverage"
prof="$out/prof"
rm -rf "$prof" "$out/lib"
mkdir -p "$prof/rust" "$prof/lib" "$prof/other" "$out/lib"
export CARGO_TARGET_DIR="$out/build"
export RUSTFLAGS="-Cinstrument-coverage"
# Every crate is instrumented, proc macros and build scripts too: what they write
# goes here, not into the working directory; the steps below name their own places.
export LLVM_PROFILE_FILE="$prof/other/%p-%m.profraw"
status=0
step() { printf '\n==> %s\n' "$*"; }
run() { "$@" || { echo "FAILED: $*" >&2; status=1; }; }

step "Rust tests (test-hooks), then cuda_api on the emulated driver"
emu_dir="$(dirname "$(python3 tests/cuda_emu/build.py "$build/cuda_emu")")"
LLVM_PROFILE_FILE="$prof/rust/%p-%m.profraw" run cargo test -q --features test-hooks --no-fail-fast
LLVM_PROFILE_FILE="$prof/rust/%p-%m.profraw" LD_LIBRARY_PATH="$emu_dir" \
  run cargo test -q --features test-hooks --test cuda_api
# The binaries those runs were, for llvm-cov (the library's unit tests included).
mapfile -t rust_bins < <(cargo test -q --features test-hooks --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])')

step "instrumented libndx.so (release, test-hooks)"
run cargo build -q --release --features test-hooks --lib
lib="$CARGO_TARGET_DIR/release/libndx.so"
ln -sf "$lib" "$out/lib/libndx.so.0"

if compgen -G "$build/c_test_*" >/dev/null; then
  step "C tests and examples of $build against it"
  for t in "$build"/c_test_* "$build"/cxx_test_* "$build"/example_*; do
    case $t in *_O2) continue ;; esac
    [ -x "$t" ] || continue
    LLVM_PROFILE_FILE="$prof/lib/c-%p-%m.profraw" LD_LIBRARY_PATH="$out/lib:$emu_dir" \
      run "$t" >/dev/null
  done
else
  echo "note: no C test programs in $build (run scripts/test.sh or its cmake step first); left out"
fi

step "Python FFI tests against it (the CUDA ones on the emulated driver, in subprocesses)"
LLVM_PROFILE_FILE="$prof/lib/py-%p-%m.profraw" NDX_LIBRARY="$lib" \
  run python3 -m pytest -q -p no:cacheprovider tests/python

step "report"
"$tools/llvm-profdata" merge -sparse "$prof"/rust/*.profraw -o "$out/rust.profdata" || exit 1
"$tools/llvm-profdata" merge -sparse "$prof"/lib/*.profraw -o "$out/lib.profdata" || exit 1
# llvm-cov takes the first binary as is and each further one after -object.
objects=("${rust_bins[0]}")
for b in "${rust_bins[@]:1}"; do objects+=(-object "$b"); done
"$tools/llvm-cov" export -format=lcov -instr-profile="$out/rust.profdata" \
  "${objects[@]}" >"$out/rust.lcov" 2>/dev/null || exit 1
"$tools/llvm-cov" export -format=lcov -instr-profile="$out/lib.profdata" "$lib" \
  >"$out/lib.lcov" 2>/dev/null || exit 1
python3 - "$out" "$PWD" <<'PY'
import collections, os, sys

out, repo = sys.argv[1], sys.argv[2]


def lines(path):
    """{file under src/: {line: count}} of an lcov file, instantiations joined."""
    seen = collections.defaultdict(dict)
    name = None
    for row in open(path):
        if row.startswith("SF:"):
            f = os.path.relpath(row[3:].strip(), repo)
            name = f if f.startswith("src/") else None
        elif row.startswith("DA:") and name:
            n, c = map(int, row[3:].split(",")[:2])
            seen[name][n] = max(seen[name].get(n, 0), c)
    return seen


rust, lib = lines(os.path.join(out, "rust.lcov")), lines(os.path.join(out, "lib.lcov"))
table, missed, total, unrun = [], [], 0, 0
for f in sorted(set(rust) | set(lib)):
    counted = set(rust.get(f, {})) | set(lib.get(f, {}))
    gone = [n for n in sorted(counted) if not rust.get(f, {}).get(n) and not lib.get(f, {}).get(n)]
    total, unrun = total + len(counted), unrun + len(gone)
    table.append(f"{f:32} {len(counted):6} {len(gone):6} {100 * (1 - len(gone) / len(counted)):6.1f}%")
    if gone:
        text = open(os.path.join(repo, f)).read().split("\n")
        missed.append(f"== {f} ({len(gone)})")
        missed += [f"{n:6}: {text[n - 1]}" for n in gone]
table.append(f"{'total':32} {total:6} {unrun:6} {100 * (1 - unrun / total):6.1f}%")
head = f"{'file':32} {'lines':>6} {'unrun':>6} {'cover':>7}"
open(os.path.join(out, "summary.txt"), "w").write("\n".join([head] + table) + "\n")
open(os.path.join(out, "missed.txt"), "w").write("\n".join(missed) + "\n")
print("\n".join([head] + table))
print(f"\nlines no test ran: {os.path.join(out, 'missed.txt')}")
PY
exit $status
