#!/usr/bin/env bash
# Resume of the streaming pipeline with roles as processes: the launcher is
# killed (SIGKILL) mid-run, after a checkpoint and some steps past it; a
# `run.resume=true` run finishes the job. Over both parts every prompt is
# trained exactly once (as the trainer recorded from the rows it trained, in
# the metrics that survive the resume) and every step appears once.
set -uo pipefail
SLUICE=$1
tmp=$(mktemp -d)
launcher=
cleanup() {
  [ -n "$launcher" ] && kill -9 "$launcher" 2>/dev/null
  # A launcher killed with SIGKILL cannot remove its shared memory; its names carry its pid.
  [ -n "$launcher" ] && ls /dev/shm | grep -E "(^|[.-])$launcher-" | while read -r s; do rm -f "/dev/shm/$s"; done
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL $*"; exit 1; }

steps=40
args=(model.preset=tiny sft.steps=0 rl.steps=$steps rl.prompts_per_step=3 rl.group_size=2 rl.max_new_tokens=8
      rl.dynamic_sampling=false eval.size=4 eval.max_new_tokens=8 eval.interval=0 run.threads=1 run.progress=lines
      checkpoint.interval=3 pipeline.mode=async pipeline.max_staleness=2 pipeline.processes=true
      pipeline.rollout_threads=1 pipeline.trainer_threads=1 run.dir="$tmp/run")

children_of() { grep -ls "^PPid:[[:space:]]*$1\$" /proc/[0-9]*/status 2>/dev/null | cut -d/ -f3; }
"$SLUICE" train "${args[@]}" > "$tmp/first.log" 2>&1 &
launcher=$!
# Wait until the run is one step past a checkpoint (steps 4, 7, 10, ...), so
# that the kill most likely lands before the next one.
for _ in $(seq 1200); do
  n=$(grep -c '"step"' "$tmp/run/metrics.jsonl" 2>/dev/null)
  if [ -f "$tmp/run/checkpoints/latest" ] && [ "${n:-0}" -ge 4 ] && [ $(( ${n:-0} % 3 )) -eq 1 ]; then break; fi
  kill -0 $launcher 2>/dev/null || break
  sleep 0.02
done
roles=$(children_of $launcher)
kill -9 $launcher 2>/dev/null || fail "the first part ended before it could be killed: $(tail -3 "$tmp/first.log")"
wait $launcher 2>/dev/null
# The roles die with their launcher (SIGTERM on the parent's death).
for _ in $(seq 100); do
  alive=0
  for pid in $roles; do kill -0 "$pid" 2>/dev/null && alive=1; done
  [ $alive -eq 0 ] && break
  sleep 0.1
done
[ $alive -eq 0 ] || fail "role processes outlived the killed launcher: $roles"
killed_at=$(grep -c '"step"' "$tmp/run/metrics.jsonl")
checkpoint=$(sed 's/step_0*//' "$tmp/run/checkpoints/latest")
[ "$killed_at" -ge "$checkpoint" ] || fail "killed at step $killed_at, before the checkpoint of step $checkpoint"
[ "$killed_at" -lt "$steps" ] || fail "the first part had already finished"

"$SLUICE" train "${args[@]}" run.resume=true > "$tmp/second.log" 2>&1 || fail "resume: $(tail -5 "$tmp/second.log")"
grep -q "resumed from .*step_0*$checkpoint at step $checkpoint" "$tmp/second.log" \
  || fail "the second part did not resume from step $checkpoint: $(grep -m1 resumed "$tmp/second.log")"

got_steps=$(grep -o '"step":[0-9]*' "$tmp/run/metrics.jsonl" | cut -d: -f2 | tr '\n' ' ')
[ "$got_steps" = "$(seq 1 $steps | tr '\n' ' ')" ] || fail "steps in metrics.jsonl: '$got_steps', want 1..$steps once each"
trained=$(grep -o '"prompts":\[[0-9,]*\]' "$tmp/run/metrics.jsonl" | grep -o '[0-9][0-9]*' | sort -n | tr '\n' ' ')
[ "$trained" = "$(seq 0 $((steps * 3 - 1)) | tr '\n' ' ')" ] \
  || fail "trained prompts over both parts: '$trained', want 0..$((steps * 3 - 1)) once each"
[ -f "$tmp/run/final/model.safetensors" ] || fail "no final model"
echo "ok   killed at step $killed_at (checkpoint $checkpoint), resumed, every prompt trained once"
