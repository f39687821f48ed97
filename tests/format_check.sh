#!/usr/bin/env bash
# The tree is clang-formatted (.clang-format at the root): every C++ source and
# header must be unchanged by clang-format; and none calls
# std::filesystem::remove_all. Fix with:
#   git ls-files '*.cc' '*.h' | xargs clang-format -i
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
command -v clang-format >/dev/null || { echo "FAIL clang-format is not installed (./setup.sh deps)"; exit 1; }
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.cc' '*.h')
else
  mapfile -t files < <(find apps bench include src tests -name '*.cc' -o -name '*.h' | sort)
fi
bad=()
for f in "${files[@]}"; do
  clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "FAIL ${#bad[@]} of ${#files[@]} files are not clang-formatted:"
  printf '  %s\n' "${bad[@]}"
  exit 1
fi
echo "ok   ${#files[@]} files clang-formatted"
# PyTorch's pip libtorch.so carries a crashing copy of
# std::filesystem::remove_all (docs/gpu.md): sluice::RemoveTree instead.
if grep -nE '^[^/]*(filesystem|fs)::remove_all' "${files[@]}"; then
  echo "FAIL std::filesystem::remove_all above: use sluice::RemoveTree (sluice/common/file_util.h)"
  exit 1
fi
echo "ok   no std::filesystem::remove_all"
