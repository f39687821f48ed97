#!/usr/bin/env bash
# Fetches, on a networked Debian 12 machine, the Debian packages that
# scripts/device/device_check.sh needs on a GPU machine without a network
# (docs/gpu.md): the libraries Sluice builds against besides libtorch, and
# pkg-config. They are downloaded (not installed) into device-deps/debs;
# carry that folder to the GPU machine with the source tree.
#
#   scripts/device/fetch_deps.sh [DIR]     (default: device-deps)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-device-deps}/debs

# Build-time packages: headers, CMake and pkg-config files, static test libraries.
BUILD=(
  pkgconf pkgconf-bin libpkgconf3
  nlohmann-json3-dev
  libyaml-cpp-dev libyaml-cpp0.7
  libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
  libutf8proc-dev libutf8proc2
  libzmq3-dev libzmq5 cppzmq-dev
  libgtest-dev libgmock-dev googletest
)
# Run-time libraries of libzmq5 that the GPU machine's system may lack; the
# check unpacks only those whose soname its system does not already have.
RUNTIME=(
  libsodium23 libpgm-5.3-0 libnorm1 libbsd0 libmd0
  libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libcom-err2 libkeyutils1
)

mkdir -p "$out/build" "$out/runtime"
fetch() {  # fetch DIR PACKAGE...: apt-get download as an ordinary file owner, into DIR
  local dir=$1
  shift
  (cd "$dir" && apt-get download -q "$@" 2>&1 | grep -v "^W: Download is performed unsandboxed" || true)
  for p in "$@"; do
    ls "$dir/${p}"_*.deb >/dev/null 2>&1 || { echo "fetch_deps: $p was not downloaded" >&2; exit 1; }
  done
}
fetch "$out/build" "${BUILD[@]}"
fetch "$out/runtime" "${RUNTIME[@]}"
du -sh "$out"
echo "fetch_deps: $(ls "$out"/build/*.deb "$out"/runtime/*.deb | wc -l) packages in $out"
