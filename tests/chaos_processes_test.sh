#!/usr/bin/env bash
# Chaos with the roles as processes (pipeline.max_restarts): during one async
# run with two trainer ranks, two rollout replicas and two reward workers,
# SIGKILL a role process (a rollout replica, trainer rank 0, a reward worker,
# trainer rank 1, ... in turn) several times, each after the run has moved on
# since the last kill. A rollout replica or reward worker is started again
# alone (the hub and the others carry on; the launcher hands what it held to
# the others at once, so the workers' leases are long here: a lease left to
# run out would stall the run past the test's bound); a trainer rank's death
# restarts every role from the latest checkpoint. The run must finish, and the rows the trainer consumed (the
# prompts of every step in the metrics the run keeps) must cover every prompt
# exactly once, and no sample may lag the weights it is trained with by more than
# pipeline.max_staleness. Bounded: at most `kills` kills (argument 2, default 4) and 240 s
# of killing; argument 3: the run's steps (default 160).
set -uo pipefail
SLUICE=$1
kills=${2:-4}
tmp=$(mktemp -d)
launcher=
cleanup() {
  [ -n "$launcher" ] && kill -9 "$launcher" 2>/dev/null
  [ -n "${KEEP_TMP:-}" ] && echo "kept $tmp" || rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL $*"; tail -5 "$tmp/run.log"; exit 1; }

steps=${3:-160}
prompts=3
"$SLUICE" train model.preset=tiny sft.steps=0 rl.steps=$steps rl.prompts_per_step=$prompts rl.group_size=2 \
  rl.max_new_tokens=24 rl.dynamic_sampling=false eval.size=4 eval.max_new_tokens=8 eval.interval=0 run.threads=1 \
  run.progress=off checkpoint.interval=2 pipeline.mode=async pipeline.max_staleness=2 pipeline.processes=true \
  pipeline.rollout_threads=1 pipeline.trainer_threads=1 pipeline.trainer_ranks=2 pipeline.rollout_replicas=2 \
  pipeline.reward_workers=2 pipeline.worker_lease_seconds=600 pipeline.max_restarts=$((kills + 1)) \
  run.dir="$tmp/run" > "$tmp/run.log" 2>&1 &
launcher=$!
children_of() { grep -ls "^PPid:[[:space:]]*$1\$" /proc/[0-9]*/status 2>/dev/null | cut -d/ -f3; }
# "rollout 1", "trainer 0", ...: a role process's role and index (trainer rank, replica, worker).
role_of() {
  local args
  args=$(tr '\0' ' ' < "/proc/$1/cmdline" 2>/dev/null) || return
  local role index
  role=$(grep -o -- '--role=[a-z]*' <<< "$args" | cut -d= -f2)
  index=$(grep -o -- '--\(trainer-rank\|replica\)=[0-9]*' <<< "$args" | cut -d= -f2)
  echo "$role ${index:-0}"
}
steps_done() { cat "$tmp/run/metrics.jsonl" 2>/dev/null | grep -c '"step"'; }
targets=("rollout 1" "trainer 0" "reward 1" "trainer 1" "rollout 0" "reward 0")  # in turn
alone=0     # kills of processes started again alone
everyone=0  # kills that restart every role
killed=0
deadline=$(( $(date +%s) + 240 ))
last=0
while [ "$killed" -lt "$kills" ] && kill -0 "$launcher" 2>/dev/null && [ "$(date +%s)" -lt "$deadline" ]; do
  n=$(steps_done)
  if [ "$n" -ge $((last + 2)) ] && [ "$n" -lt $((steps - 4)) ]; then
    want=${targets[$((killed % ${#targets[@]}))]}
    for pid in $(children_of "$launcher"); do
      [ "$(role_of "$pid")" = "$want" ] || continue
      kill -9 "$pid" && killed=$((killed + 1)) && echo "killed the $want process ($pid) after $n steps"
      if [[ "$want" == trainer* ]]; then everyone=$((everyone + 1)); else alone=$((alone + 1)); fi
      break
    done
    # Wait for the restart before the next kill. A process started again alone: the run went on
    # meanwhile, so the next kill may follow at once. A trainer's: the metrics are cut back to the
    # checkpoint, count from there.
    for _ in $(seq 200); do
      [ "$(grep -c 'restarting from' "$tmp/run.log")" -ge "$everyone" ] \
        && [ "$(grep -c 'started again' "$tmp/run.log")" -ge "$alone" ] && break
      sleep 0.1
    done
    if [[ "$want" == trainer* ]]; then last=$(steps_done); else last=$((n - 1)); fi
  fi
  sleep 0.05
done
for _ in $(seq 2400); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.1; done
kill -0 "$launcher" 2>/dev/null && fail "the run did not finish within 240 s after the kills"
wait "$launcher"; rc=$?
launcher=
[ "$rc" -eq 0 ] || fail "the run ended with $rc after $killed kills"
[ "$killed" -eq "$kills" ] || fail "only $killed of $kills kills happened (the run was too quick?)"
restarts=$(grep -c "restart [0-9]* of" "$tmp/run.log")
[ "$restarts" -eq "$kills" ] || fail "$restarts restarts logged for $kills kills"
[ "$(grep -c 'restarting from' "$tmp/run.log")" -eq "$everyone" ] \
  || fail "$(grep -c 'restarting from' "$tmp/run.log") restarts of every role for $everyone trainer kills"
[ "$(grep -c 'started again' "$tmp/run.log")" -eq "$alone" ] \
  || fail "$(grep -c 'started again' "$tmp/run.log") processes started again alone for $alone rollout/reward kills"
trained=$(grep -o '"prompts":\[[0-9,]*\]' "$tmp/run/metrics.jsonl" | grep -o '[0-9][0-9]*' | sort -n | tr '\n' ' ')
[ "$trained" = "$(seq 0 $((steps * prompts - 1)) | tr '\n' ' ')" ] \
  || fail "trained prompts '$trained', want 0..$((steps * prompts - 1)) once each"
[ "$(grep -c '"step"' "$tmp/run/metrics.jsonl")" -eq "$steps" ] || fail "not every step once in metrics.jsonl"
# The same from the hub's own record of what the trainer consumed, attempt by attempt.
ledger=$(/usr/bin/python3 "$(dirname "$0")/ack_ledger_check.py" "$tmp/run" "$steps" "$prompts") || fail "$ledger"
echo "$ledger"
# One staleness bound across the replicas, kills and restarts included (pipeline.max_staleness=2).
stale=$(grep -o '"staleness_max":[0-9]*' "$tmp/run/metrics.jsonl" | cut -d: -f2 | sort -n | tail -1)
[ -n "$stale" ] && [ "$stale" -le 2 ] || fail "staleness_max '$stale' > 2"
echo "ok   chaos: $kills role processes killed ($alone started again alone, $everyone restarting every role;" \
  "$(grep -c 'is gone: released its' "$tmp/run.log") held hub leases, released at once), every prompt trained once"
