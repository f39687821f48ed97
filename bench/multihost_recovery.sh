#!/usr/bin/env bash
# What a dead process costs a run across hosts: the same async run on three
# "hosts" (network namespaces on this machine, tests/netns_hosts.sh) under
# real torchrun agents (--max_restarts=1), interleaved, with no kill and with
# one SIGKILL of each kind of process: the hub storage rank, rank 0 (the
# hub, rollout and reward, trainer rank 0), trainer rank 1 on its own host,
# the rollout replica elsewhere. Each kill fails the attempt on every host and
# torchrun starts every host's ranks again from the latest checkpoint. Every
# run gets the same config, hosts, cores and work; the table gives each
# mode's wall time (median, min-max) and the seconds lost per kill against
# the no-kill runs of the same invocation. Each run must finish every step
# with every prompt trained once and every agent exiting 0, or the
# benchmark fails.
#
#   bench/multihost_recovery.sh build/release/apps/sluice [REPEATS=2] [STEPS=30] [KILL_AT=10] [RDZV=static|c10d]
#
# Needs root, iproute2 and torchrun (Debian's python3-torch); exits 77 without.
set -uo pipefail
SLUICE=$(readlink -f "${1:?usage: $0 path/to/sluice [repeats] [steps] [kill-at] [static|c10d]}")
repeats=${2:-2} steps=${3:-30} kill_at=${4:-10} rdzv=${5:-static}
here=$(cd "$(dirname "$0")" && pwd)
command -v torchrun > /dev/null || { echo "skipped: no torchrun (Debian's python3-torch)"; exit 77; }
[ "$kill_at" -ge 2 ] && [ "$steps" -ge $((kill_at + 10)) ] || { echo "error: need 2 <= KILL_AT <= STEPS - 10"; exit 2; }
source "$here/../tests/netns_hosts.sh"

config=(model.preset=tiny sft.steps=0 rl.steps="$steps" rl.prompts_per_step=3 rl.group_size=2 rl.max_new_tokens=32
        rl.dynamic_sampling=false eval.size=4 eval.max_new_tokens=8 eval.interval=0 run.threads=1 run.progress=off
        pipeline.mode=async pipeline.processes=true pipeline.rollout_threads=1 pipeline.trainer_threads=1
        trainer.mini_batches=2 trainer.lr=1e-3 reward.python="$here/../tests/data/rewards/arithmetic_reward.py:length_score"
        checkpoint.interval=2 cluster.rollout_ranks=1 cluster.storage_ranks=1 pipeline.rank_timeout_seconds=60)
# mode name, the rank killed (trainer ranks 0-1, the replica 2, the storage rank 3; - for none)
modes=("none:-" "storage rank:3" "rank 0 (hub):0" "trainer rank 1:1" "rollout replica:2")
declare -A walls
failed=0 i=0
for r in $(seq "$repeats"); do
  for m in "${modes[@]}"; do
    name=${m%%:*} rank=${m##*:} d="$tmp/run-$((i += 1))"
    start=$(date +%s.%N)
    torchrun_agents "$SLUICE" "$d" 1 "$rdzv" "${config[@]}" run.dir="$d/run"
    killed=0
    if [ "$rank" != - ] && wait_progress "$d/run" "$kill_at" 120 && kill_torchrun_rank "$SLUICE" "$rank" > /dev/null; then
      killed=1
    fi
    rcs=""
    for p in "${pids[@]}"; do wait "$p"; rcs="$rcs $?"; done
    pids=()
    wall=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN {print b - a}')
    if [ "$rcs" != " 0 0 0" ] || ! trained_once "$d/run" "$steps" 2> /dev/null || { [ "$rank" != - ] && [ "$killed" -ne 1 ]; }; then
      echo "FAIL $name (repeat $r): agents exited$rcs, killed $killed; logs in $d"
      KEEP=1 failed=1
      continue
    fi
    walls[$name]="${walls[$name]:-} $wall"
    printf '  repeat %d  %-16s %6.1f s\n' "$r" "$name" "$wall"
  done
done
[ "$failed" -eq 0 ] || exit 1

median() { printf '%s\n' $1 | sort -g | awk '{v[NR] = $1} END {print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'; }
range() { printf '%s\n' $1 | sort -g | awk 'NR == 1 {lo = $1} {hi = $1} END {printf "%.1f-%.1f", lo, hi}'; }
echo
echo "multihost recovery: 3 hosts (network namespaces on one machine, $(nproc) cores shared), torchrun $rdzv rendezvous,"
echo "async, $steps steps of 3 prompts x 2 answers (tiny model), checkpoint every 2 steps, one kill at step $kill_at, $repeats repeats"
printf '%-18s %-24s %-18s %s\n' "killed" "wall s: median (range)" "lost per kill (s)" "vs no kill"
base=$(median "${walls[none]}")
for m in "${modes[@]}"; do
  name=${m%%:*} med=$(median "${walls[${m%%:*}]}")
  lost=$([ "$name" = none ] && echo "-" || awk -v a="$med" -v b="$base" 'BEGIN {printf "%+.1f", a - b}')
  ratio=$(awk -v a="$med" -v b="$base" 'BEGIN {printf "%.2fx", a / b}')
  printf '%-18s %-24s %-18s %s\n' "$name" "$(printf '%.1f' "$med") ($(range "${walls[$name]}"))" "$lost" "$ratio"
done
