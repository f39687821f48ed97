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

# sluice train / eval: a tiny end-to-end run, resume, and config and data errors.
small=(model.preset=tiny sft.steps=2 sft.batch_size=4 rl.steps=2 rl.prompts_per_step=2 rl.group_size=2
       rl.max_new_tokens=8 eval.size=4 eval.max_new_tokens=8 run.threads=1 run.progress=lines)
expect train 0 "held-out accuracy" -- "$SLUICE" train "${small[@]}" run.dir="$tmp/run" checkpoint.interval=1
[ -f "$tmp/run/final/model.safetensors" ] && [ -f "$tmp/run/checkpoints/step_000002/optimizer.safetensors" ] \
  && [ "$(wc -l < "$tmp/run/metrics.jsonl")" -eq 2 ] || { echo "FAIL train outputs missing"; failures=$((failures + 1)); }
expect resume 0 "held-out accuracy" -- "$SLUICE" train "${small[@]}" run.dir="$tmp/run" run.resume=true rl.steps=3
[ "$(wc -l < "$tmp/run/metrics.jsonl")" -eq 3 ] || { echo "FAIL resume did not continue at step 3"; failures=$((failures + 1)); }
expect eval 0 "held-out accuracy" -- "$SLUICE" eval --model "$tmp/run/final" eval.size=4 eval.max_new_tokens=8
[ -f "$tmp/run/report.html" ] || { echo "FAIL train wrote no report.html"; failures=$((failures + 1)); }
expect report 0 "report.html" -- "$SLUICE" report "$tmp/run"
expect report-not-a-run 2 "no metrics" -- "$SLUICE" report "$tmp/nowhere"
expect async 0 "held-out accuracy" -- "$SLUICE" train "${small[@]}" run.dir="$tmp/async" pipeline.mode=async \
  pipeline.max_staleness=1 trainer.off_policy_correction=tis
grep -q '"staleness_max"' "$tmp/async/metrics.jsonl" || { echo "FAIL async run wrote no staleness"; failures=$((failures + 1)); }

# Process mode: trainer, rollout and reward each in its own process over shared
# memory. Every prompt is trained exactly once, staleness stays within the bound.
proc=(model.preset=tiny sft.steps=0 rl.steps=6 rl.prompts_per_step=3 rl.group_size=2 rl.max_new_tokens=8
      rl.dynamic_sampling=false eval.size=4 eval.max_new_tokens=8 eval.interval=0 run.threads=1 run.progress=lines
      pipeline.mode=async pipeline.max_staleness=2 pipeline.processes=true pipeline.rollout_threads=1
      pipeline.trainer_threads=1)
expect processes 0 "held-out accuracy" -- "$SLUICE" train "${proc[@]}" run.dir="$tmp/proc"
trained=$(grep -o '"prompts":\[[0-9,]*\]' "$tmp/proc/metrics.jsonl" | grep -o '[0-9][0-9]*' | sort -n | tr '\n' ' ')
[ "$trained" = "$(seq 0 17 | tr '\n' ' ')" ] || { echo "FAIL processes: trained prompts '$trained', want 0..17 once each"; failures=$((failures + 1)); }
stale=$(grep -o '"staleness_max":[0-9]*' "$tmp/proc/metrics.jsonl" | cut -d: -f2 | sort -n | tail -1)
[ -n "$stale" ] && [ "$stale" -le 2 ] || { echo "FAIL processes: staleness_max '$stale' > 2"; failures=$((failures + 1)); }

# SIGINT mid-run: the launcher stops every role; no process or segment of the run is left.
children_of() { grep -ls "^PPid:[[:space:]]*$1\$" /proc/[0-9]*/status 2>/dev/null | cut -d/ -f3; }
"$SLUICE" train "${proc[@]}" run.dir="$tmp/int" rl.steps=1000000 > "$tmp/int.log" 2>&1 &
launcher=$!
for _ in $(seq 300); do [ "$(children_of $launcher | wc -l)" -ge 3 ] && break; sleep 0.1; done
roles=$(children_of $launcher)
[ "$(echo "$roles" | wc -w)" -eq 3 ] || { echo "FAIL sigint: roles '$roles' did not start"; failures=$((failures + 1)); }
for _ in $(seq 300); do grep -q '"step":2' "$tmp/int/metrics.jsonl" 2>/dev/null && break; sleep 0.1; done
kill -INT $launcher
for _ in $(seq 300); do kill -0 $launcher 2>/dev/null || break; sleep 0.1; done
wait $launcher; rc=$?
[ "$rc" -ne 0 ] && grep -q "Aborted" "$tmp/int.log" || { echo "FAIL sigint: rc=$rc"; tail -3 "$tmp/int.log"; failures=$((failures + 1)); }
for pid in $roles; do
  kill -0 "$pid" 2>/dev/null && { echo "FAIL sigint: role process $pid still runs"; kill -9 "$pid"; failures=$((failures + 1)); }
done
left=$(ls /dev/shm | grep -E "(^|[.-])$launcher-" || true)
[ -z "$left" ] || { echo "FAIL sigint: shared memory left behind: $left"; failures=$((failures + 1)); }
[ "$failures" -eq 0 ] && echo "ok   processes and sigint"

expect bad-mode 2 "pipeline.mode" -- "$SLUICE" train pipeline.mode=fast
expect eval-needs-model 2 "--model is required" -- "$SLUICE" eval
expect unknown-key 2 "trainer.lr" -- "$SLUICE" train trainer.lrr=1
expect bad-type 2 "rl.steps" -- "$SLUICE" train rl.steps=many
expect bad-enum 2 "token-mean" -- "$SLUICE" train trainer.loss_agg=mean
expect group-of-one 2 "rl.group_size" -- "$SLUICE" train "${small[@]}" run.dir="$tmp/g1" rl.group_size=1
expect missing-config 2 "nowhere.yaml" -- "$SLUICE" train --config="$tmp/nowhere.yaml"
printf 'trainer:\n  lr: [1, 2]\n' > "$tmp/bad.yaml"
expect yaml-sequence 2 "bad.yaml:2" -- "$SLUICE" train --config="$tmp/bad.yaml"
printf '{"prompt": "1+1=", "answer": "2"}\n{"prompt": 3}\n' > "$tmp/bad.jsonl"
expect jsonl-line 2 "bad.jsonl:2" -- "$SLUICE" train "${small[@]}" run.dir="$tmp/j" task.name=jsonl task.jsonl.train_path="$tmp/bad.jsonl"
printf '\n\n' > "$tmp/empty.jsonl"
expect jsonl-empty 2 "empty.jsonl" -- "$SLUICE" train "${small[@]}" run.dir="$tmp/j" task.name=jsonl task.jsonl.train_path="$tmp/empty.jsonl"
expect jsonl-missing 2 "missing.jsonl" -- "$SLUICE" train "${small[@]}" run.dir="$tmp/j" task.name=jsonl task.jsonl.train_path="$tmp/missing.jsonl"

[ "$failures" -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
