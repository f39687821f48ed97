#!/usr/bin/env bash
# Fuzz smoke test of the TransferQueue wire format: configures a clang build
# (libFuzzer + ASan + UBSan) in build/fuzz, builds sluice_wire_fuzzer, seeds
# a corpus with one valid request, reply and error reply of every message
# type, and fuzzes for a bounded time.
#
#   tests/fuzz_smoke.sh [SECONDS]      default 30
#
# Exits non-zero if the build fails or the fuzzer finds a crash, a sanitizer
# report, a leak, a timeout or a re-encoding mismatch (the crashing input is
# saved as build/fuzz/crash-*). Environment: SLUICE_FUZZ_BUILD_DIR (build
# directory), SLUICE_FUZZ_CXX (clang++ to use), SLUICE_FUZZ_JOBS (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-30}
build=${SLUICE_FUZZ_BUILD_DIR:-build/fuzz}
cxx=${SLUICE_FUZZ_CXX:-clang++}
jobs=${SLUICE_FUZZ_JOBS:-2}

if ! command -v "$cxx" >/dev/null; then
  echo "fuzz_smoke: $cxx not found (install clang)" >&2
  exit 2
fi

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$cxx" \
  -DSLUICE_WITH_TORCH=OFF -DSLUICE_BUILD_TESTS=OFF -DSLUICE_BUILD_BENCHMARKS=OFF -DSLUICE_BUILD_FUZZERS=ON >/dev/null
cmake --build "$build" --target sluice_wire_fuzzer -j "$jobs"

corpus="$build/wire_corpus"
mkdir -p "$corpus"
echo "fuzz_smoke: fuzzing the wire decoders for ${seconds}s (corpus $corpus)" >&2
SLUICE_WIRE_FUZZ_SEED_DIR="$corpus" "$build/src/transfer_queue/sluice_wire_fuzzer" \
  -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
  -print_final_stats=1 -artifact_prefix="$build/" "$corpus"
echo "fuzz_smoke: no crash in ${seconds}s" >&2
