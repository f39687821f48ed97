#!/usr/bin/env bash
# Fuzz smoke test of the wire formats: configures a clang build (libFuzzer +
# ASan + UBSan) in build/fuzz, builds the three fuzzers (the TransferQueue's
# wire format, the CheckpointEngine's rendezvous framing and broadcast
# control messages), seeds each corpus with valid messages, and fuzzes each
# for a bounded time: the TransferQueue's (by far the largest format) for
# 3/5 of SECONDS, the other two 1/5 each.
#
#   tests/fuzz_smoke.sh [SECONDS]      default 30
#
# Exits non-zero if the build fails or a fuzzer finds a crash, a sanitizer
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
cmake --build "$build" --target sluice_wire_fuzzer sluice_rendezvous_fuzzer sluice_broadcast_fuzzer -j "$jobs"

# fuzz NAME BINARY SECONDS SEED_VARIABLE
fuzz() {
  local name=$1 binary=$2 time=$3 seed_var=$4
  local corpus="$build/${name}_corpus"
  mkdir -p "$corpus"
  echo "fuzz_smoke: fuzzing the $name decoders for ${time}s (corpus $corpus)" >&2
  env "$seed_var=$corpus" "$binary" -max_total_time="$time" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    -print_final_stats=1 -artifact_prefix="$build/" "$corpus"
}
fuzz wire "$build/src/transfer_queue/sluice_wire_fuzzer" $(( seconds * 3 / 5 > 0 ? seconds * 3 / 5 : 1 )) \
  SLUICE_WIRE_FUZZ_SEED_DIR
fuzz rendezvous "$build/src/checkpoint_engine/sluice_rendezvous_fuzzer" $(( seconds / 5 > 0 ? seconds / 5 : 1 )) \
  SLUICE_FUZZ_SEED_DIR
fuzz broadcast "$build/src/checkpoint_engine/sluice_broadcast_fuzzer" $(( seconds / 5 > 0 ? seconds / 5 : 1 )) \
  SLUICE_FUZZ_SEED_DIR
echo "fuzz_smoke: no crash in ${seconds}s" >&2
