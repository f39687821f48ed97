#!/usr/bin/env bash
# The device check (docs/gpu.md): on a Linux x86-64 machine with an NVIDIA
# GPU and a CUDA PyTorch installation but no network, builds Sluice against
# that PyTorch's libtorch, runs the `gpu` test label, then a short
# pipeline_bench of sync against async on a random-weight 0.5B model with
# long answers, and writes everything to one results directory.
#
#   scripts/device/device_check.sh [RESULTS_DIR]     (default: device-results)
#
# Beforehand, on a networked Debian 12 machine: scripts/device/fetch_deps.sh
# (the other libraries as Debian packages, in device-deps/debs, carried with
# the source tree). Each stage's log is in RESULTS_DIR; summary.txt says
# which stages passed. Settings (environment): SLUICE_CHECK_JOBS (build
# jobs, default all cores), SLUICE_CHECK_BENCH_ARGS (pipeline_bench flags),
# SLUICE_CHECK_BENCH_TIMEOUT (seconds, default 300, cut to what is left of
# SLUICE_CHECK_BUDGET, default 570), SLUICE_CHECK_TESTS_ONLY (1: the gpu
# tests only), PYTHON (default python3). At most six
# files: summary.txt, stages.log, machine.txt, gpu-tests-detail.log,
# pipeline_bench.json, nvidia-smi.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
src=$PWD
results=$(mkdir -p "${1:-device-results}" && cd "${1:-device-results}" && pwd)
deps_dir=$src/device-deps/debs
prefix=${SLUICE_CHECK_PREFIX:-/tmp/sluice-device-deps}
build=$src/build/device
python=${PYTHON:-python3}
jobs=${SLUICE_CHECK_JOBS:-$(nproc)}
start=$(date +%s)
summary=$results/summary.txt
: >"$summary"

note() { printf '%s [%4ds] %s\n' "$(date -u +%H:%M:%S)" $(($(date +%s) - start)) "$*" | tee -a "$summary" >&2; }
log=$results/stages.log
: >"$log"
stage() {  # stage NAME COMMAND...: runs it, its output appended to stages.log; records pass/fail and the time
  local name=$1 t0 rc
  shift
  t0=$(date +%s)
  printf '\n==== %s: %s\n' "$name" "$*" >>"$log"
  "$@" >"$results/running.log" 2>&1  # left behind if the check is killed mid-stage
  rc=$?
  cat "$results/running.log" >>"$log"
  note "$name: $([ $rc -eq 0 ] && echo pass || echo "FAIL (exit $rc)") in $(($(date +%s) - t0)) s"
  [ $rc -ne 0 ] && tail -n 40 "$results/running.log" >&2
  rm -f "$results/running.log"
  return $rc
}
# Seconds left of SLUICE_CHECK_BUDGET (default 570: the whole check in under ten minutes).
left() { echo $((${SLUICE_CHECK_BUDGET:-570} - ($(date +%s) - start))); }

# ---- the machine
{
  uname -a
  nproc
  free -g | head -2
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  "$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")'
  command -v cmake && cmake --version | head -1
  command -v ninja && ninja --version
  command -v g++ && g++ --version | head -1
} >"$results/machine.txt" 2>&1
note "machine: $(grep -m1 -E 'H100|H200|A100|NVIDIA' "$results/machine.txt" || echo 'no GPU named')"

# ---- the other libraries: Debian packages unpacked into a prefix
unpack() (
  set -e
  [ -d "$deps_dir/build" ] || { echo "no $deps_dir: run scripts/device/fetch_deps.sh on a networked machine"; exit 1; }
  rm -rf "$prefix"
  mkdir -p "$prefix/rt"
  for deb in "$deps_dir"/build/*.deb; do dpkg-deb -x "$deb" "$prefix" 2>/dev/null || dpkg -x "$deb" "$prefix"; done
  for deb in "$deps_dir"/runtime/*.deb; do dpkg-deb -x "$deb" "$prefix/rt" 2>/dev/null || dpkg -x "$deb" "$prefix/rt"; done
  # Run-time libraries the system already has stay the system's.
  local have
  have=$(ldconfig -p 2>/dev/null | awk '{print $1}')
  find "$prefix/rt" -name 'lib*.so.*' | while read -r lib; do
    if grep -qx "$(basename "$lib")" <<<"$have"; then rm -f "$lib"; else echo "bringing $(basename "$lib")"; fi
  done
  # pkg-config files name /usr: point them at the prefix. libzmq's private
  # requirements (static linking only) are not brought.
  find "$prefix" -name '*.pc' -exec sed -i -E "s#(^|=|-I|-L)/usr#\1$prefix/usr#g" {} +
  sed -i '/^Requires.private/d' "$prefix"/usr/lib/x86_64-linux-gnu/pkgconfig/libzmq.pc
  ls "$prefix/usr/bin"
)
stage deps unpack || exit 1
libdirs=$prefix/usr/lib/x86_64-linux-gnu:$(find "$prefix/rt" -type d -name x86_64-linux-gnu | paste -sd:)
export LD_LIBRARY_PATH=$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PKG_CONFIG_LIBDIR=$prefix/usr/lib/x86_64-linux-gnu/pkgconfig:$prefix/usr/share/pkgconfig
pkgconfig=$(command -v pkg-config || echo "$prefix/usr/bin/pkgconf")

# ---- configure and build against the PyTorch installation's libtorch
torch_prefix=$("$python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
torch_dir=$("$python" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
abi=$("$python" -c 'import torch; print(int(torch.compiled_with_cxx11_abi()))')
common=(-S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSLUICE_WERROR=OFF
  -DCMAKE_PREFIX_PATH="$prefix/usr" -DPKG_CONFIG_EXECUTABLE="$pkgconfig" -DCMAKE_CXX_COMPILER_LAUNCHER=
  -DCMAKE_POLICY_VERSION_MINIMUM=3.5 -DSLUICE_WITH_PYTHON=OFF)
# Torch_DIR first (torch.utils.cmake_prefix_path); where its CMake files
# cannot find the CUDA toolkit they ask for, the package's libraries directly.
if ! stage configure cmake "${common[@]}" -DTorch_DIR="$torch_prefix/Torch"; then
  rm -rf "$build"
  stage configure-python-torch cmake "${common[@]}" -DSLUICE_TORCH_PYTHON="$torch_dir" -DSLUICE_TORCH_CXX11_ABI="$abi" ||
    exit 1
fi
# ---- the gpu label: GPU against CPU
if stage build-tests cmake --build "$build" -j "$jobs" --target sluice_gpu_test -- -k 0; then
  if ! (cd "$build" && stage gpu-tests ctest -L gpu --output-on-failure --timeout 300); then
    # One test at a time, so a crash in one leaves the others' results.
    bin=$build/src/pipeline/sluice_gpu_test
    crashed=""
    for t in $("$bin" --gtest_list_tests | awk '/^[^ ]/ {suite = $1} /^  / {print suite $1}'); do
      CUDA_LAUNCH_BLOCKING=1 stage "gpu-test $t" timeout 300 "$bin" --gtest_filter="$t"
      [ $? -ge 128 ] && [ -z "$crashed" ] && crashed=$t
    done
    # The first test that died of a signal, under the debugger: its call stack.
    if [ -n "$crashed" ] && command -v cuda-gdb >/dev/null; then
      stage "call stack of $crashed" timeout "${SLUICE_CHECK_GDB_TIMEOUT:-150}" cuda-gdb -q -batch -ex "set pagination off" -ex run -ex bt \
        -ex "info registers rip" --args "$bin" --gtest_filter="$crashed"
    fi
  fi
  cp "$build/Testing/Temporary/LastTest.log" "$results/gpu-tests-detail.log" 2>/dev/null
fi

# ---- the CLI on the GPU, then sync against async: a random-weight 0.5B model, long-tail answers
# (SLUICE_CHECK_TESTS_ONLY=1: not these)
if [ -z "${SLUICE_CHECK_TESTS_ONLY:-}" ] && stage build-apps cmake --build "$build" -j "$jobs" --target pipeline_bench sluice -- -k 0; then
  stage generate timeout 120 "$build/apps/sluice" generate --preset 0.5b --device cuda --num-samples 8 --slots 16 \
    --max-new-tokens 128 --temperature 0.8
  bench_args=${SLUICE_CHECK_BENCH_ARGS:-"--preset 0.5b --device cuda --modes sync,async --steps 3 --prompts 8 \
--group 8 --median 160 --tail 6 --slots 64 --threads 2 --rollout-threads 1 --sync-dp=false --lend=false --staleness 2"}
  bench_timeout=$(($(left) - 10))
  [ "$bench_timeout" -gt "${SLUICE_CHECK_BENCH_TIMEOUT:-300}" ] && bench_timeout=${SLUICE_CHECK_BENCH_TIMEOUT:-300}
  if [ "$bench_timeout" -ge 60 ]; then
    # shellcheck disable=SC2086
    stage pipeline-bench timeout "$bench_timeout" "$build/bench/pipeline_bench" $bench_args \
      --json "$results/pipeline_bench.json"
  else
    note "pipeline-bench: skipped, $bench_timeout s left of the budget"
  fi
fi
command -v nvidia-smi >/dev/null && nvidia-smi >"$results/nvidia-smi.txt" 2>&1
note "done in $(($(date +%s) - start)) s; results in $results"
