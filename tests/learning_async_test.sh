#!/usr/bin/env bash
# Learning, in the default suite (about a minute on two cores): the main job
# in small. A short warm start on the arithmetic task where half the targets
# are bare answers (so the warm-started model often answers without working
# it out), then asynchronous GRPO with the rollout, reward and trainer as
# processes (staleness 2, truncated IS). Held-out greedy accuracy, on problems
# the run never trains on, must rise by at least MARGIN points.
set -uo pipefail
SLUICE=$1
MARGIN=${MARGIN:-8}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

args=(run.dir="$tmp/run" run.seed=0 run.threads=2 run.progress=lines
      model.preset=1m task.name=arithmetic task.eval_size=400 task.arithmetic.max_ops=3
      task.arithmetic.ops_exponent=1.0 task.arithmetic.scratchpad=steps
      sft.steps=250 sft.batch_size=64 sft.lr=3e-3 sft.warmup_steps=20 sft.shortcut_fraction=0.5
      rl.steps=24 rl.prompts_per_step=16 rl.group_size=8 rl.temperature=1.0 rl.max_new_tokens=48 rl.slots=64
      rl.dynamic_sampling=true trainer.lr=1e-4 trainer.warmup_steps=2 trainer.loss_agg=seq-mean
      eval.interval=0 eval.size=400 eval.max_new_tokens=48 checkpoint.interval=0
      pipeline.mode=async pipeline.max_staleness=2 pipeline.processes=true
      pipeline.rollout_threads=1 pipeline.trainer_threads=1)
start=$(date +%s)
"$SLUICE" train "${args[@]}" > "$tmp/log" 2>&1 || { echo "FAIL train:"; tail -20 "$tmp/log"; exit 1; }
line=$(grep "held-out accuracy: .* before RL -> .* after RL" "$tmp/log") || { echo "FAIL no accuracy line"; tail -5 "$tmp/log"; exit 1; }
before=$(sed -E 's/.*: ([0-9.]+)% before RL.*/\1/' <<<"$line")
after=$(sed -E 's/.* -> ([0-9.]+)% after RL.*/\1/' <<<"$line")
stale=$(grep -o '"staleness_max":[0-9]*' "$tmp/run/metrics.jsonl" | cut -d: -f2 | sort -n | tail -1)
echo "held-out accuracy ${before}% -> ${after}% (margin ${MARGIN} points), max staleness ${stale}, $(( $(date +%s) - start )) s"
[ -n "$stale" ] && [ "$stale" -le 2 ] || { echo "FAIL staleness_max '$stale' outside 0..2"; exit 1; }
awk -v b="$before" -v a="$after" -v m="$MARGIN" 'BEGIN { exit !(a >= b + m) }' \
  || { echo "FAIL held-out accuracy rose by less than $MARGIN points"; exit 1; }
echo "ok   async GRPO with roles as processes raised held-out accuracy"
