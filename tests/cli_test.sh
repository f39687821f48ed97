#!/usr/bin/env bash
# End to end through the real `sluice` binary: write a checkpoint, load it,
# generate; and bad input at the command line gets a clear error and exit 2.
set -uo pipefail
SLUICE=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0

expect() {  # expect NAME WANT_RC NEEDLE -- command...
  local name=$1 want=$2 needle=$3
  shift 4
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  if [ "$rc" -ne "$want" ] || ! grep -qF -- "$needle" <<<"$out"; then
    echo "FAIL $name: rc=$rc (want $want), output lacks '$needle':"
    echo "$out" | tail -5
    failures=$((failures + 1))
  else
    echo "ok   $name"
  fi
}

expect init 0 "wrote tiny model" -- "$SLUICE" init --preset tiny --out "$tmp/m"
[ -f "$tmp/m/config.json" ] && [ -f "$tmp/m/model.safetensors" ] || { echo "FAIL checkpoint files missing"; failures=$((failures + 1)); }
expect generate 0 "tokens/s" -- "$SLUICE" generate --model "$tmp/m" --num-samples 2 --max-new-tokens 8 --threads 1
expect greedy-static 0 "static batching" -- "$SLUICE" generate --model "$tmp/m" --temperature 0 --scheduling static --max-new-tokens 4 --threads 1
expect help 0 "--slots" -- "$SLUICE" generate --help
expect unknown-command 2 "unknown command" -- "$SLUICE" fly
expect unknown-flag 2 "unknown flag --slot" -- "$SLUICE" generate --slot 3
expect zero-slots 2 "--slots must be in [1, 4096]" -- "$SLUICE" generate --model "$tmp/m" --slots 0
expect bad-choice 2 "continuous, static" -- "$SLUICE" generate --model "$tmp/m" --scheduling fast
expect missing-model 2 "config.json" -- "$SLUICE" generate --model "$tmp/nowhere"
expect bad-preset 2 "unknown model preset 'huge'" -- "$SLUICE" init --preset huge --out "$tmp/x"
expect long-prompt 2 "no room for a response" -- "$SLUICE" generate --preset tiny --prompt "$(head -c 1100 /dev/zero | tr '\0' a)"

cp -r "$tmp/m" "$tmp/trunc"
truncate -s -100 "$tmp/trunc/model.safetensors"
expect truncated 1 "past the data buffer" -- "$SLUICE" generate --model "$tmp/trunc"
cp -r "$tmp/m" "$tmp/badcfg"
echo '{"hidden_size": 32}' > "$tmp/badcfg/config.json"
expect bad-config 2 "'num_hidden_layers' is missing" -- "$SLUICE" generate --model "$tmp/badcfg"

[ "$failures" -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
