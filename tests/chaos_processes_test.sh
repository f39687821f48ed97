#!/usr/bin/env bash
# Chaos with the roles as processes (pipeline.max_restarts): during one async
# run, SIGKILL a role process (trainer, rollout or reward in turn, among them
# a second trainer rank) several times, each after the run has moved on since
# the last kill. The launcher restarts the roles from the latest checkpoint
# each time; the run must finish, and the rows the trainer consumed (the
# prompts of every step in the metrics the run keeps) must cover every prompt
# exactly once. Bounded: at most `kills` kills (argument 2, default 4) and 240 s
# of killing; argument 3: the run's steps (default 40).
set -uo pipefail
SLUICE=$1
kills=${2:-4}
tmp=$(mktemp -d)
launcher=
cleanup() {
  [ -n "$launcher" ] && kill -9 "$launcher" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL $*"; tail -5 "$tmp/run.log"; exit 1; }

steps=${3:-40}
prompts=3
"$SLUICE" train model.preset=tiny sft.steps=0 rl.steps=$steps rl.prompts_per_step=$prompts rl.group_size=2 \
  rl.max_new_tokens=8 rl.dynamic_sampling=false eval.size=4 eval.max_new_tokens=8 eval.interval=0 run.threads=1 \
  run.progress=off checkpoint.interval=2 pipeline.mode=async pipeline.max_staleness=2 pipeline.processes=true \
  pipeline.rollout_threads=1 pipeline.trainer_threads=1 pipeline.trainer_ranks=2 pipeline.max_restarts=$((kills + 1)) \
  run.dir="$tmp/run" > "$tmp/run.log" 2>&1 &
launcher=$!
children_of() { grep -ls "^PPid:[[:space:]]*$1\$" /proc/[0-9]*/status 2>/dev/null | cut -d/ -f3; }
role_of() { tr '\0' ' ' < "/proc/$1/cmdline" 2>/dev/null | grep -o -- '--role=[a-z]*\( .*--trainer-rank=[0-9]*\)\?' | sed 's/ .*--trainer-rank=/ rank /'; }
steps_done() { cat "$tmp/run/metrics.jsonl" 2>/dev/null | grep -c '"step"'; }
targets=(rollout trainer reward "trainer rank 1")  # in turn
killed=0
deadline=$(( $(date +%s) + 240 ))
last=0
while [ "$killed" -lt "$kills" ] && kill -0 "$launcher" 2>/dev/null && [ "$(date +%s)" -lt "$deadline" ]; do
  n=$(steps_done)
  if [ "$n" -ge $((last + 2)) ] && [ "$n" -lt $((steps - 4)) ]; then
    want=${targets[$((killed % ${#targets[@]}))]}
    for pid in $(children_of "$launcher"); do
      r=$(role_of "$pid")
      case "$want" in
        "trainer rank 1") [[ "$r" == "--role=trainer rank 1" ]] || continue ;;
        trainer) [[ "$r" == "--role=trainer rank 0" || "$r" == "--role=trainer" ]] || continue ;;
        *) [[ "$r" == "--role=$want"* ]] || continue ;;
      esac
      kill -9 "$pid" && killed=$((killed + 1)) && echo "killed the $want process ($pid) after $n steps"
      break
    done
    # Wait for the restart (the metrics are cut back to the checkpoint) before counting again.
    for _ in $(seq 200); do grep -q "restarting from" "$tmp/run.log" && [ "$(grep -c 'restarting from' "$tmp/run.log")" -ge "$killed" ] && break; sleep 0.1; done
    last=$(steps_done)
  fi
  sleep 0.05
done
for _ in $(seq 2400); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.1; done
wait "$launcher"; rc=$?
launcher=
[ "$rc" -eq 0 ] || fail "the run ended with $rc after $killed kills"
[ "$killed" -eq "$kills" ] || fail "only $killed of $kills kills happened (the run was too quick?)"
restarts=$(grep -c "restart [0-9]* of" "$tmp/run.log")
[ "$restarts" -eq "$kills" ] || fail "$restarts restarts logged for $kills kills"
trained=$(grep -o '"prompts":\[[0-9,]*\]' "$tmp/run/metrics.jsonl" | grep -o '[0-9][0-9]*' | sort -n | tr '\n' ' ')
[ "$trained" = "$(seq 0 $((steps * prompts - 1)) | tr '\n' ' ')" ] \
  || fail "trained prompts '$trained', want 0..$((steps * prompts - 1)) once each"
[ "$(grep -c '"step"' "$tmp/run/metrics.jsonl")" -eq "$steps" ] || fail "not every step once in metrics.jsonl"
echo "ok   chaos: $kills role processes killed, $restarts restarts, every prompt trained once"
