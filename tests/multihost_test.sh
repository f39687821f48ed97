#!/usr/bin/env bash
# Trainer ranks on several "hosts": network namespaces this test creates
# (joined by veth pairs to a bridge in a namespace of its own) and removes,
# each running `sluice train` with torchrun's variables as torchrun would set
# them. Rank 0's host runs the launcher (hub, rollout, reward, trainer rank
# 0); the other hosts' ranks reach it over their network stack only (hub over
# TCP with its token, no shared memory, Gloo between the namespaces).
#
#   three-hosts   three ranks on three hosts train the run a single rank
#                 trains (sync mode, same seed: same prompts, losses and
#                 gradient norms within float rounding), every prompt once
#   config        a rank started with another config is refused, names both
#                 digests, and rank 0's run stops instead of waiting for it
#   unreachable   a rank whose rendezvous host does not answer gives up after
#                 pipeline.rank_timeout_seconds, naming the store
#
# Needs root and `ip` (network namespaces); exits 77 (skipped) otherwise.
set -uo pipefail
SLUICE=$1
if [ "$(id -u)" -ne 0 ] || ! command -v ip > /dev/null || ! ip netns list > /dev/null 2>&1; then
  echo "skipped: network namespaces need root and iproute2"
  exit 77
fi
tmp=$(mktemp -d)
tag=slmh$$
sw=$tag-sw
hosts=("$tag-h0" "$tag-h1" "$tag-h2")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  for n in "$sw" "${hosts[@]}"; do ip netns pids "$n" 2>/dev/null | xargs -r kill -9 2>/dev/null; ip netns del "$n" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

net=10.$((RANDOM % 200 + 20)).$((RANDOM % 250)).
ip netns add "$sw" && ip -n "$sw" link add br0 type bridge && ip -n "$sw" link set br0 up || { echo "FAIL netns setup"; exit 1; }
for i in 0 1 2; do
  h=${hosts[$i]}
  ip netns add "$h" \
    && ip link add "e$i-$$" netns "$h" type veth peer name "p$i" netns "$sw" \
    && ip -n "$sw" link set "p$i" master br0 && ip -n "$sw" link set "p$i" up \
    && ip -n "$h" addr add "$net$((i + 1))/24" dev "e$i-$$" && ip -n "$h" link set "e$i-$$" up \
    && ip -n "$h" link set lo up || { echo "FAIL netns setup of $h"; exit 1; }
done

rewards="$(dirname "$0")/data/rewards/arithmetic_reward.py"
run=(model.preset=tiny sft.steps=0 rl.steps=6 rl.prompts_per_step=3 rl.group_size=2 rl.max_new_tokens=8
     rl.dynamic_sampling=false eval.size=4 eval.max_new_tokens=8 eval.interval=0 run.threads=1 run.progress=off
     pipeline.mode=sync pipeline.processes=true pipeline.rollout_threads=1 pipeline.trainer_threads=1
     trainer.mini_batches=2 trainer.lr=1e-3 reward.python="$rewards:length_score" pipeline.rank_timeout_seconds=60)
# rank i of `world` on host i, with torchrun's variables.
start_rank() {
  local i=$1 world=$2 log=$3; shift 3
  ip netns exec "${hosts[$i]}" env RANK="$i" WORLD_SIZE="$world" LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 GROUP_RANK="$i" \
    MASTER_ADDR="${net}1" MASTER_PORT=29561 timeout 240 "$SLUICE" train "$@" > "$log" 2>&1 &
  pids+=($!)
}

# --- three-hosts
"$SLUICE" train "${run[@]}" run.dir="$tmp/one" > "$tmp/one.log" 2>&1 || fail "single-rank run: $(tail -3 "$tmp/one.log")"
start_rank 1 3 "$tmp/r1.log" "${run[@]}" run.dir="$tmp/three"
start_rank 2 3 "$tmp/r2.log" "${run[@]}" run.dir="$tmp/three"
start_rank 0 3 "$tmp/r0.log" "${run[@]}" run.dir="$tmp/three"
for p in "${pids[@]}"; do wait "$p" || fail "three-hosts: a rank exited $?"; done
pids=()
grep -q "trainer rank 1: done" "$tmp/r1.log" && grep -q "trainer rank 2: done" "$tmp/r2.log" \
  || fail "three-hosts: ranks 1-2 did not finish: $(tail -2 "$tmp/r1.log" "$tmp/r2.log")"
/usr/bin/python3 - "$tmp/one" "$tmp/three" <<'PY' && echo "ok   three-hosts" || fail "three-hosts: metrics differ"
import json, sys
one, three = ([json.loads(l) for l in open(d + "/metrics.jsonl")] for d in sys.argv[1:])
assert len(one) == len(three) == 6, (len(one), len(three))
for a, b in zip(one, three):
    assert a["prompts"] == b["prompts"] and a["train_tokens"] == b["train_tokens"], (a["step"], a, b)
    for key in ("loss", "pg_loss", "grad_norm", "entropy", "reward_mean"):
        assert abs(a[key] - b[key]) <= 1e-5 * (1 + abs(a[key])), (a["step"], key, a[key], b[key])
assert any(a["grad_norm"] > 0 for a in one)
assert sorted(p for r in three for p in r["prompts"]) == list(range(18))
PY

# --- config: rank 1 with another learning rate
start_rank 1 2 "$tmp/c1.log" "${run[@]}" run.dir="$tmp/cfg" trainer.lr=2e-3
start_rank 0 2 "$tmp/c0.log" "${run[@]}" run.dir="$tmp/cfg"
for p in "${pids[@]}"; do wait "$p"; done
pids=()
grep -q "trainer rank 1 of 2: this process's config (digest [0-9a-f]*) differs from rank 0's" "$tmp/c1.log" \
  && grep -q "differs from rank 0's" "$tmp/c0.log" && ! grep -q "held-out accuracy:" "$tmp/c0.log" \
  && echo "ok   config" || fail "config: $(tail -2 "$tmp/c1.log" "$tmp/c0.log")"

# --- unreachable: nobody serves the rendezvous
start=$(date +%s)
start_rank 1 2 "$tmp/u1.log" "${run[@]}" run.dir="$tmp/unr" pipeline.rank_timeout_seconds=3
wait "${pids[0]}"; rc=$?
pids=()
took=$(( $(date +%s) - start ))
[ "$rc" -ne 0 ] && [ "$took" -lt 60 ] && grep -q "rendezvous store at ${net}1:29561" "$tmp/u1.log" \
  && echo "ok   unreachable" || fail "unreachable: rc=$rc after ${took}s: $(tail -2 "$tmp/u1.log")"

[ "$failures" -eq 0 ] || exit 1
