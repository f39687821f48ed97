#!/bin/bash
# The README is the front door: it stays short enough to read in two minutes
# (at most 120 lines, 1,500 words, no line over 400 characters), links only to
# files of this repository that exist, and every measured ratio it quotes (an
# inline code span holding a number followed by "x", as `async/sync
# throughput: 1.16x`) is a line of a raw output committed under docs/ (*.txt),
# so the README cannot drift from what the programs printed.
# Usage: readme_test.sh [README]   (mutations tried: a 121st line, a figure
# changed to 1.17x, a link to docs/nowhere.md: each fails)
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

# Quoted ratios: each verbatim in a raw output under docs/.
figures=0
while read -r figure; do
  [ -z "$figure" ] && continue
  figures=$((figures + 1))
  grep -qF -- "$figure" "$root"/docs/*.txt || fail "README quotes \`$figure\`, found in no raw output (docs/*.txt)"
done < <(grep -o '`[^`]*[0-9]x[^`]*`' "$readme" | tr -d '`')

[ "$failures" -eq 0 ] && echo "ok   README: $lines lines, $words words, its links and $figures quoted figures checked"
exit $((failures > 0))
