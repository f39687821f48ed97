#!/bin/bash
# The README is the front door: it stays short enough to read in two minutes
# (at most 120 lines, 1,500 words, no line over 400 characters), links only to
# files of this repository that exist. Its figures are checked with every other
# doc's by tests/docs_figures_test.sh.
# Usage: readme_test.sh [README]   (mutations tried: a 121st line, a link to
# docs/nowhere.md: each fails)
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
readme=${1:-$root/README.md}
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

lines=$(wc -l < "$readme")
words=$(wc -w < "$readme")
[ "$lines" -le 120 ] || fail "README has $lines lines (at most 120)"
[ "$words" -le 1500 ] || fail "README has $words words (at most 1500)"
long=$(awk 'length($0) > 400 { print NR }' "$readme" | tr '\n' ' ')
[ -z "$long" ] || fail "README lines over 400 characters: $long"

# Links: relative ones must name a file or directory of the repository.
while read -r target; do
  case "$target" in
    http://* | https://*) fail "README links outside the repository: $target" ;;
    '#'*) ;;
    *) [ -e "$root/${target%%#*}" ] || fail "README links to $target, which does not exist" ;;
  esac
done < <(grep -o '](\([^)]*\))' "$readme" | sed 's/^](//; s/)$//')

[ "$failures" -eq 0 ] && echo "ok   README: $lines lines, $words words, its links checked (its figures: docs_figures_test.sh)"
exit $((failures > 0))
