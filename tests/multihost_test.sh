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
#   remote-rollout  two trainer ranks on hosts 0-1 (the hub with rank 0) and
#                 two rollout replicas on host 2 (cluster.rollout_ranks=2,
#                 none on rank 0's host): the replicas call the hub over TCP
#                 and receive every version over the CheckpointEngine
#                 broadcast; the run trains what the single rank trains (sync
#                 mode: the same losses)
#   async-cluster an async run with rollout replicas on rank 0's host and on
#                 host 1, and the one reward worker on host 2 (cluster.
#                 reward_ranks=1, none on rank 0's host) completes, every
#                 prompt trained once; the run's trace (run.trace) has the
#                 processes elsewhere (their threads, on rank 0's clock) and
#                 the trainer's records the replica elsewhere's tokens
#   rejoin        the only rollout replica, on host 1, is SIGKILLed mid-run and
#                 started again there (as a host's supervisor would): it is
#                 sent the current version, takes up the stream (what the dead
#                 one held comes back when its leases run out), and the run
#                 trains every prompt once
#   host-restart  with pipeline.max_restarts the replica's `sluice train` on
#                 host 1 is that host's supervisor: its child (the replica)
#                 SIGKILLed mid-run is started again there, what it held is
#                 given back at once (600 s leases would outlast the test),
#                 and the run trains every prompt once
#   chaos         two supervised replicas on hosts 1-2 and the reward worker
#                 on host 2; three or four SIGKILLs of a random one of them,
#                 one every 3 steps trained, during an async run: it
#                 finishes (a step at least every 60 s), every prompt trained
#                 once
#   grow          a rollout replica and a reward worker join a running async
#                 run from host 2 (`sluice train --join`, beyond the launch);
#                 rank 0's live counters (run.metrics_listen) show the
#                 joined replica and the tokens of the replicas elsewhere;
#                 the joined replica, supervised there, is SIGKILLed once it
#                 serves and comes back as the same replica, receiving the
#                 current version mid-run, and generates; the run trains
#                 every prompt once; rank 0's watchdog names the joined
#                 worker while it is frozen; a joiner with another config is
#                 turned away (no number taken) and the run goes on
#   storage       the hub's rows spread over a storage unit on rank 0's host
#                 and one on host 2 (cluster.storage_ranks=1): the roles on
#                 hosts 0-1 write and read the bytes of host 2's rows there;
#                 an async run completes, every prompt trained once, and the
#                 storage rank served requests and stopped after the hub;
#                 a storage rank SIGKILLed mid-run ends the run (an error
#                 naming its server, within the ranks' timeout), not a hang
#   torchrun      real torchrun agents (--max_restarts, static rendezvous, the
#                 agent's store) on the three hosts: trainer ranks 0-1 on
#                 hosts 0-1, a rollout replica and a hub storage rank on host
#                 2; the storage rank, then rank 0 (the hub) SIGKILLed mid-run,
#                 each after the run moved on: every host's ranks fail that
#                 attempt and torchrun starts them all again, the run resumes
#                 from its latest checkpoint each time and finishes, every
#                 prompt trained once, every agent exits 0
#   torchrun-c10d the same under torchrun's c10d rendezvous (hosts numbered as
#                 they arrive, each host named, each attempt's rank 0 serving
#                 its own store): the storage rank, rank 0, trainer rank 1
#                 SIGKILLed; a host whose agent starts rank 0 again without
#                 counting a restart (another host failed) still resumes
#   torchrun-soak (only when named; labelled long) the same with five kills:
#                 trainer rank 1, the storage rank, rank 0, the replica,
#                 trainer rank 1
#   stall         the replica on host 1 is frozen (SIGSTOP): rank 0's watchdog,
#                 reading the heartbeats processes elsewhere report to the
#                 ranks' store, names it, its host and what it was doing, and
#                 (pipeline.stop_on_stall) stops the run; the same for a hub
#                 storage rank (cluster.storage_ranks) frozen, shown in rank 0's
#                 live counters while it serves
#   config        a rank started with another config is refused, names both
#                 digests, and rank 0's run stops instead of waiting for it; so
#                 is one whose host holds another model at the same model.path
#                 (naming the files that differ)
#   unreachable   a rank whose rendezvous host does not answer gives up after
#                 pipeline.rank_timeout_seconds, naming the store
#
# Needs root and `ip` (network namespaces); exits 77 (skipped) otherwise.
# KEEP=1 keeps the logs and run directories (their directory is printed);
# CASES="chaos stall" runs only the cases named.
set -uo pipefail
SLUICE=$1
source "$(dirname "$0")/netns_hosts.sh"
failures=0
want() { [ -z "${CASES:-}" ] || [[ " $CASES " == *" $1 "* ]]; }
named() { [[ " ${CASES:-} " == *" $1 "* ]]; }
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

rewards="$(dirname "$0")/data/rewards/arithmetic_reward.py"
run=(model.preset=tiny sft.steps=0 rl.steps=6 rl.prompts_per_step=3 rl.group_size=2 rl.max_new_tokens=8
     rl.dynamic_sampling=false eval.size=4 eval.max_new_tokens=8 eval.interval=0 run.threads=1 run.progress=off
     pipeline.mode=sync pipeline.processes=true pipeline.rollout_threads=1 pipeline.trainer_threads=1
     trainer.mini_batches=2 trainer.lr=1e-3 reward.python="$rewards:length_score" pipeline.rank_timeout_seconds=60)
# rank i of `world` on host h, with torchrun's variables.
start_rank_on() {
  local h=$1 i=$2 world=$3 log=$4; shift 4
  ip netns exec "${hosts[$h]}" env RANK="$i" WORLD_SIZE="$world" LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 GROUP_RANK="$h" \
    MASTER_ADDR="${net}1" MASTER_PORT=29561 timeout 240 "$SLUICE" train "$@" > "$log" 2>&1 &
  pids+=($!)
}
# rank i of `world` on host i.
start_rank() { start_rank_on "$1" "$@"; }
# Waits (at most 30 s) until run directory $1 has trained $2 steps; prints how many it has.
wait_steps() {
  for _ in $(seq 600); do
    [ "$(cat "$1/metrics.jsonl" 2>/dev/null | wc -l)" -ge "$2" ] && break
    sleep 0.05
  done
  cat "$1/metrics.jsonl" 2>/dev/null | wc -l
}
# The replicas and workers that hosts $@'s `sluice train` supervise (pipeline.max_restarts):
# sluice processes with SLUICE_SUPERVISED_RANK set (not their reward.python workers).
supervised_children() {
  local h p exe
  exe=$(readlink -f "$SLUICE")
  for h in "$@"; do
    for p in $(ip netns pids "${hosts[$h]}"); do
      [ "$(readlink -f "/proc/$p/exe" 2>/dev/null)" = "$exe" ] \
        && tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "SLUICE_SUPERVISED_RANK=1" && echo "$p"
    done
  done
}
# The `sluice` processes in host $1's namespace.
sluice_pids() { ip netns pids "${hosts[$1]}" | xargs -r ps -o pid=,args= -p | awk -v s="$SLUICE" '$2 == s {print $1}'; }
# Rank 0's live counters (run.metrics_listen), at the address its log $1 gives, read from host 0.
live_counters() {
  local url
  url=$(grep -o "live counters: http://[^ ]*" "$1" | head -1 | cut -d' ' -f3)
  ip netns exec "${hosts[0]}" /usr/bin/python3 -c \
    "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())" "$url" 2>&1
}
# Freezes (SIGSTOP) host 1's sluice processes until rank 0 (pids[1]) ends, then kills them; sets
# frozen (their pids), rc (rank 0's exit status) and took (seconds from the freeze).
freeze_host1_until_rank0_ends() {
  local start
  frozen=$(sluice_pids 1)
  [ -n "$frozen" ] && kill -STOP $frozen
  start=$(date +%s)
  wait "${pids[1]}"; rc=$?
  took=$(( $(date +%s) - start ))
  [ -n "$frozen" ] && kill -9 $frozen
  wait "${pids[0]}" 2>/dev/null
  pids=()
}
# The single-rank run the sync cases compare with.
if want three-hosts || want remote-rollout; then
  "$SLUICE" train "${run[@]}" run.dir="$tmp/one" > "$tmp/one.log" 2>&1 || fail "single-rank run: $(tail -3 "$tmp/one.log")"
fi

# --- three-hosts
if want three-hosts; then
  start_rank 1 3 "$tmp/r1.log" "${run[@]}" run.dir="$tmp/three"
  start_rank 2 3 "$tmp/r2.log" "${run[@]}" run.dir="$tmp/three"
  start_rank 0 3 "$tmp/r0.log" "${run[@]}" run.dir="$tmp/three"
  for p in "${pids[@]}"; do wait "$p" || fail "three-hosts: a rank exited $?"; done
  pids=()
  grep -q "trainer rank 1: done" "$tmp/r1.log" && grep -q "trainer rank 2: done" "$tmp/r2.log" \
    || fail "three-hosts: ranks 1-2 did not finish: $(tail -n 2 "$tmp/r1.log" "$tmp/r2.log")"
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
fi

# --- remote-rollout: trainer ranks 0-1 on hosts 0-1, rollout replicas 0-1 (ranks 2-3) on host 2
if want remote-rollout; then
  remote=("${run[@]}" run.dir="$tmp/rr" cluster.rollout_ranks=2 pipeline.rollout_replicas=0)
  start_rank 1 4 "$tmp/rr1.log" "${remote[@]}"
  start_rank 2 4 "$tmp/rr2.log" "${remote[@]}"
  start_rank_on 2 3 4 "$tmp/rr3.log" "${remote[@]}"
  start_rank 0 4 "$tmp/rr0.log" "${remote[@]}"
  for p in "${pids[@]}"; do wait "$p" || fail "remote-rollout: a rank exited $?"; done
  pids=()
  # (each replica's last line: its tokens and the versions it took from the broadcast, up to the one
  # its last prompts needed or the last; the relay sends the newest, so one superseded before it was
  # sent is skipped)
  tokens=0
  for r in 0 1; do
    log="$tmp/rr$((r + 2)).log"
    grep -q "rollout replica $r of the run at" "$log" \
      && line=$(grep -E "rollout(-1)?@[^ ]*: [0-9]+ tokens generated; [0-9]+ version\(s\) received over the broadcast, the last [1-6]" "$log") \
      || fail "remote-rollout: replica $r on host 2: $(tail -3 "$log")"
    tokens=$((tokens + $(sed -E 's/.*: ([0-9]+) tokens generated.*/\1/' <<<"$line")))
  done
  # (6 steps x 3 prompts x 2 answers of 8 tokens, less answers that ended early)
  [ "$tokens" -gt 200 ] || fail "remote-rollout: the replicas generated $tokens tokens"
  # Rank 0 counts them all (their last reports come as the run ends).
  grep -q "rollout: $tokens tokens generated, $tokens of them on other hosts" "$tmp/rr0.log" \
    || fail "remote-rollout: rank 0 counted: $(grep "tokens generated, " "$tmp/rr0.log") (the replicas: $tokens)"
  /usr/bin/python3 - "$tmp/one" "$tmp/rr" "$tokens" <<'PY' && echo "ok   remote-rollout" || fail "remote-rollout: metrics differ"
import json, sys
one, rr = ([json.loads(l) for l in open(d + "/metrics.jsonl")] for d in sys.argv[1:3])
assert len(one) == len(rr) == 6, (len(one), len(rr))
# Every token is generated elsewhere: the records count them as they are
# reported (once a second: a short run's may all come after its last step).
counted = sum(r["rollout_tokens"] for r in rr)
assert counted <= int(sys.argv[3]), (counted, sys.argv[3])
for a, b in zip(one, rr):
    assert a["prompts"] == b["prompts"] and a["train_tokens"] == b["train_tokens"], (a["step"], a, b)
    assert b["staleness_max"] == 0, (b["step"], b["staleness_max"])
    for key in ("loss", "pg_loss", "grad_norm", "entropy", "reward_mean"):
        assert abs(a[key] - b[key]) <= 1e-5 * (1 + abs(a[key])), (a["step"], key, a[key], b[key])
PY
fi

# --- async-cluster: trainer rank 0 and a replica on host 0, a replica on host 1, the reward on host 2
if want async-cluster; then
  async=("${run[@]}" pipeline.mode=async cluster.rollout_ranks=1 cluster.reward_ranks=1 pipeline.reward_workers=0
         run.trace=true run.dir="$tmp/ac")
  start_rank 1 3 "$tmp/ac1.log" "${async[@]}"
  start_rank 2 3 "$tmp/ac2.log" "${async[@]}"
  start_rank 0 3 "$tmp/ac0.log" "${async[@]}"
  for p in "${pids[@]}"; do wait "$p" || fail "async-cluster: a rank exited $?"; done
  pids=()
  grep -q "rollout replica 1: done" "$tmp/ac1.log" && grep -q "reward worker 0: done" "$tmp/ac2.log" \
    && grep -Eq "rollout-1@[^ ]*: [1-9][0-9]* tokens generated" "$tmp/ac1.log" \
    || fail "async-cluster: the processes elsewhere did not finish: $(tail -n 2 "$tmp/ac1.log" "$tmp/ac2.log")"
  # Rank 0 counts the replica elsewhere's tokens, to the last.
  remote_tokens=$(grep -Eo "rollout-1@[^ ]*: [0-9]+ tokens generated" "$tmp/ac1.log" | grep -Eo "[0-9]+ tokens" | cut -d' ' -f1)
  grep -Eq "rollout: [0-9]+ tokens generated, $remote_tokens of them on other hosts" "$tmp/ac0.log" \
    || fail "async-cluster: rank 0 counted: $(grep "tokens generated, " "$tmp/ac0.log") (replica 1: $remote_tokens)"
  trained_once "$tmp/ac" 6 || fail "async-cluster: $(tail -3 "$tmp/ac0.log")"
  /usr/bin/python3 - "$tmp/ac" <<'PY' && echo "ok   async-cluster" || fail "async-cluster: trace or counters of the processes elsewhere"
import json, sys
trace = json.load(open(sys.argv[1] + "/trace.json"))
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
spans = [e for e in trace if e["ph"] == "X"]
threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace if e["ph"] == "M" and e["name"] == "thread_name"}
# The replica on host 1: its engine's row, apart from host 0's threads, with its decode steps.
remote = {k for k, name in threads.items() if name.startswith("rollout-1 ")}
assert remote and all(tid >= 1 << 22 for _, tid in remote), threads
decode = [e for e in spans if (e["pid"], e["tid"]) in remote and e["name"] == "decode step"]
assert decode, "no decode steps from host 1"
# The reward worker on host 2 (the run's only one): its scores.
score = [e for e in spans if e["name"] == "score"]
assert score and all(e["tid"] >= 1 << 22 for e in score), len(score)
# On rank 0's timeline: after its prompt feeder began, and not past its own last event by much.
local = [e for e in spans if e["tid"] < 1 << 22]
first, last = min(e["ts"] for e in local), max(e["ts"] + e["dur"] for e in local)
for e in decode + score:
    assert first <= e["ts"] and e["ts"] + e["dur"] <= last + 5e6, (e, first, last)
# The trainer's records have a place for the replica on host 1's tokens (the
# second of two; reported once a second, a short run's may come after its end).
assert all(len(r["replica_tokens"]) == 2 for r in rows), rows[0]
PY
fi

# --- rejoin: kill the replica on host 1 once two steps are trained, start it again
if want rejoin; then
  rejoin=("${run[@]}" pipeline.mode=async rl.steps=16 rl.max_new_tokens=64 cluster.rollout_ranks=1 pipeline.rollout_replicas=0
          pipeline.worker_lease_seconds=2 run.dir="$tmp/rj")
  start_rank 1 2 "$tmp/rj1.log" "${rejoin[@]}"
  start_rank 0 2 "$tmp/rj0.log" "${rejoin[@]}"
  steps_at_kill=$(wait_steps "$tmp/rj" 2)
  killed=$(sluice_pids 1)
  [ -n "$killed" ] && kill -9 $killed
  wait "${pids[0]}" 2>/dev/null
  pids=("${pids[1]}")
  start_rank 1 2 "$tmp/rj1b.log" "${rejoin[@]}"
  for p in "${pids[@]}"; do wait "$p" || fail "rejoin: a rank exited $?"; done
  pids=()
  [ -n "$killed" ] && [ "$steps_at_kill" -lt 16 ] || fail "rejoin: the replica was not killed mid-run ($steps_at_kill steps)"
  grep -Eq "rollout@[^ ]*: serving version [1-9][0-9]* received over the broadcast" "$tmp/rj1b.log" \
    && grep -Eq "rollout@[^ ]*: [1-9][0-9]* tokens generated" "$tmp/rj1b.log" \
    || fail "rejoin: the restarted replica: $(tail -3 "$tmp/rj1b.log")"
  trained_once "$tmp/rj" 16 && echo "ok   rejoin" || fail "rejoin: $(tail -3 "$tmp/rj0.log")"
fi

# --- host-restart: kill the supervised replica on host 1 once two steps are trained
if want host-restart; then
  hr=("${run[@]}" pipeline.mode=async rl.steps=16 rl.max_new_tokens=64 cluster.rollout_ranks=1
      pipeline.rollout_replicas=0 pipeline.max_restarts=2 pipeline.worker_lease_seconds=600 run.dir="$tmp/hr")
  start_rank 1 2 "$tmp/hr1.log" "${hr[@]}"
  start_rank 0 2 "$tmp/hr0.log" "${hr[@]}"
  steps_at_kill=$(wait_steps "$tmp/hr" 2)
  child=$(supervised_children 1)
  [ -n "$child" ] && kill -9 "$child"
  for p in "${pids[@]}"; do wait "$p" || fail "host-restart: a rank exited $?"; done
  pids=()
  [ -n "$child" ] && [ "$steps_at_kill" -lt 16 ] || fail "host-restart: the replica was not killed mid-run ($steps_at_kill steps)"
  grep -q "rollout (pid $child) is gone: released its [0-9]* hub lease" "$tmp/hr1.log" \
    && grep -q "child .rollout. started again" "$tmp/hr1.log" \
    || fail "host-restart: host 1's supervisor: $(grep -v "^I" "$tmp/hr1.log" | tail -4)"
  trained_once "$tmp/hr" 16 && echo "ok   host-restart" || fail "host-restart: $(tail -3 "$tmp/hr0.log")"
fi

# --- chaos: kill a random supervised child on hosts 1-2, four times
if want chaos; then
  chaos=("${run[@]}" pipeline.mode=async rl.steps=60 rl.max_new_tokens=64 cluster.rollout_ranks=2 cluster.reward_ranks=1
         pipeline.rollout_replicas=0 pipeline.reward_workers=0 pipeline.max_restarts=4 pipeline.worker_lease_seconds=600
         run.dir="$tmp/ch")
  start_rank 1 4 "$tmp/ch1.log" "${chaos[@]}"
  start_rank 2 4 "$tmp/ch2.log" "${chaos[@]}"
  start_rank_on 2 3 4 "$tmp/ch3.log" "${chaos[@]}"
  start_rank 0 4 "$tmp/ch0.log" "${chaos[@]}"
  # A kill every 3 steps trained, of one of the children running then (a
  # victim's host may not have started it again yet).
  kills=0
  steps=0
  for _ in 1 2 3 4; do
    steps=$(wait_steps "$tmp/ch" $((steps + 3)))
    [ "$steps" -ge 50 ] && break
    mapfile -t victims < <(supervised_children 1 2)
    [ "${#victims[@]}" -ge 1 ] && kill -9 "${victims[$((RANDOM % ${#victims[@]}))]}" && kills=$((kills + 1))
  done
  # No step for 60 s: a hang (rows held by the dead?); what each host said.
  if ! wait_progress "$tmp/ch" 60 60; then
    fail "chaos: no step for 60 s at step $(wc -l < "$tmp/ch/metrics.jsonl")"
    for f in "$tmp"/ch[0-3].log; do echo "--- $(basename "$f")"; grep -v "^sluice train: rank" "$f" | tail -6; done
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  fi
  for p in "${pids[@]}"; do wait "$p" || fail "chaos: a rank exited $?"; done
  pids=()
  [ "$kills" -ge 3 ] || fail "chaos: only $kills kills landed mid-run"
  [ "$(cat "$tmp"/ch[123].log | grep -c "was killed by signal 9")" -eq "$kills" ] \
    || fail "chaos: $kills kills, but the hosts' supervisors saw $(cat "$tmp"/ch[123].log | grep -c "was killed by signal 9")"
  trained_once "$tmp/ch" 60 && echo "ok   chaos ($kills kills)" || fail "chaos: $(tail -3 "$tmp/ch0.log")"
fi

# --- grow: a rollout replica and a reward worker join from host 2 mid-run
if want grow; then
  grow=("${run[@]}" pipeline.mode=async rl.steps=150 rl.max_new_tokens=128 cluster.rollout_ranks=1
        pipeline.rollout_replicas=0 pipeline.max_restarts=2 pipeline.stall_seconds=2 run.metrics_listen=127.0.0.1:0
        run.dir="$tmp/gr")
  start_rank 1 2 "$tmp/gr1.log" "${grow[@]}"
  start_rank 0 2 "$tmp/gr0.log" "${grow[@]}"
  join_on_2() {
    local log=$1; shift
    ip netns exec "${hosts[2]}" env MASTER_ADDR="${net}1" MASTER_PORT=29561 timeout 240 "$SLUICE" train "$@" \
      > "$log" 2>&1 &
    pids+=($!)
  }
  join_on_2 "$tmp/grj1.log" "${grow[@]}" --join=rollout
  join_on_2 "$tmp/grj2.log" "${grow[@]}" --join=reward
  # Another config: turned away, the run goes on.
  join_on_2 "$tmp/grj3.log" "${grow[@]}" trainer.lr=2e-3 --join=rollout
  # The joined replica's host supervises it: killed mid-run, it comes back as replica 1.
  wait_steps "$tmp/gr" 1 > /dev/null
  for _ in $(seq 200); do
    grep -q "rollout-1@[^ ]*: serving version" "$tmp/grj1.log" && break
    sleep 0.05
  done
  steps_at_kill=$(cat "$tmp/gr/metrics.jsonl" 2>/dev/null | wc -l)
  # Rank 0's live counters: the joined replica (index 1), and tokens, all generated elsewhere.
  counters=$(sleep 1.5; live_counters "$tmp/gr0.log")
  grep -q '^sluice_role_activity{role="rollout",index="1",activity=' <<<"$counters" \
    && grep -Eq '^sluice_rollout_tokens_total [1-9]' <<<"$counters" \
    || fail "grow: rank 0's live counters: $(grep -E "tokens_total|role_activity" <<<"$counters" | head -8)"
  joined_child=$(for c in $(supervised_children 2); do
    tr '\0' '\n' < "/proc/$c/cmdline" | grep -qx -- "--join=rollout" && echo "$c"; done)
  [ -n "$joined_child" ] && kill -9 "$joined_child"
  # Rank 0's watchdog watches a joined process: the worker frozen for 4 s is named.
  frozen=$(for c in $(supervised_children 2); do
    tr '\0' '\n' < "/proc/$c/cmdline" | grep -qx -- "--join=reward" && echo "$c"; done)
  [ -n "$frozen" ] && kill -STOP "$frozen" && sleep 4 && kill -CONT "$frozen"
  wait "${pids[4]}" && fail "grow: a joiner with another config was not refused"
  grep -q "differs from rank 0's" "$tmp/grj3.log" || fail "grow: the refused joiner: $(tail -2 "$tmp/grj3.log")"
  unset 'pids[4]'
  for p in "${pids[@]}"; do wait "$p" || fail "grow: a process exited $?"; done
  pids=()
  grep -q "rollout replica 1 of the run at ${net}1:29561 (joined beyond the launch)" "$tmp/grj1.log" \
    && grep -Eq "rollout-1@[^ ]*: [1-9][0-9]* tokens generated; [1-9][0-9]* version\(s\) received" "$tmp/grj1.log" \
    && grep -q "reward worker 1 of the run at .* (joined beyond the launch)" "$tmp/grj2.log" \
    && grep -q "reward worker 1: done" "$tmp/grj2.log" \
    && grep -q "more rollout process(es) joined the run" "$tmp/gr0.log" \
    && grep -q "reward worker 1 (pid $frozen on host [^ ]*) has made no progress for" "$tmp/gr0.log" \
    || fail "grow: the joiners: $(tail -n 2 "$tmp/grj1.log" "$tmp/grj2.log")"
  [ -n "$joined_child" ] && [ "$steps_at_kill" -lt 150 ] \
    && grep -q "rollout-1 (pid $joined_child) is gone: released its" "$tmp/grj1.log" \
    && grep -q "child 'rollout-1' started again" "$tmp/grj1.log" \
    && grep -Eq "rollout-1@[^ ]*: serving version [1-9][0-9]* received" "$tmp/grj1.log" \
    && [ "$(grep -c "rollout replica 1 of the run at .* (joined beyond the launch)" "$tmp/grj1.log")" -eq 3 ] \
    || fail "grow: the joined replica's restart (killed: '$joined_child' at $steps_at_kill steps): $(tail -n 3 "$tmp/grj1.log")"
  trained_once "$tmp/gr" 150 && echo "ok   grow" || fail "grow: $(tail -3 "$tmp/gr0.log")"
fi

# --- storage: trainer rank 0 on host 0, a replica on host 1, a hub storage unit on host 2
if want storage; then
  storage=("${run[@]}" pipeline.mode=async rl.steps=12 cluster.rollout_ranks=1 cluster.storage_ranks=1 run.dir="$tmp/sg")
  start_rank 1 3 "$tmp/sg1.log" "${storage[@]}"
  start_rank 2 3 "$tmp/sg2.log" "${storage[@]}"
  start_rank 0 3 "$tmp/sg0.log" "${storage[@]}"
  for p in "${pids[@]}"; do wait "$p" || fail "storage: a rank exited $?"; done
  pids=()
  grep -q "hub storage unit 1 of the run at .*, serving on tcp://${net}3:" "$tmp/sg2.log" \
    && grep -Eq "hub storage unit 1: [1-9][0-9]* requests served; done" "$tmp/sg2.log" \
    && grep -q "rollout replica 1: done" "$tmp/sg1.log" \
    || fail "storage: the storage rank on host 2: $(tail -n 3 "$tmp/sg2.log")"
  trained_once "$tmp/sg" 12 || fail "storage: $(tail -3 "$tmp/sg0.log")"
  # The storage rank dies mid-run: the rows it held are gone, and the run ends saying where.
  storage=("${storage[@]}" rl.steps=60 rl.max_new_tokens=64 run.dir="$tmp/sk")
  start_rank 1 3 "$tmp/sk1.log" "${storage[@]}"
  start_rank 2 3 "$tmp/sk2.log" "${storage[@]}"
  start_rank 0 3 "$tmp/sk0.log" "${storage[@]}"
  steps_at_kill=$(wait_steps "$tmp/sk" 2)
  killed=$(sluice_pids 2)
  [ -n "$killed" ] && kill -9 $killed
  start=$SECONDS
  wait "${pids[2]}"; rc=$?
  took=$((SECONDS - start))
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  pids=()
  [ -n "$killed" ] && [ "$steps_at_kill" -lt 60 ] && [ "$rc" -ne 0 ] && [ "$took" -lt 50 ] \
    && grep -q "${net}3" "$tmp/sk0.log" \
    && echo "ok   storage" \
    || fail "storage: after the storage rank's death (at step $steps_at_kill): rank 0 rc=$rc after ${took}s: $(grep -v "^I" "$tmp/sk0.log" | tail -3)"
fi

# --- torchrun: real agents restart every host's ranks after each SIGKILL
# torchrun_kills NAME STEPS "RANK:STEP ..." [static|c10d]: a run of STEPS steps under one torchrun
# agent per host (torchrun_agents), each kill of a rank after the run has STEP steps (not in its
# last 8: a c10d agent whose rank dies after the others finished waits for them); checks that it
# finishes.
torchrun_kills() {
  local name=$1 steps=$2 kills=($3) d="$tmp/$1" k kr ks n ino who killed=0 floor=0
  torchrun_agents "$SLUICE" "$d" ${#kills[@]} "${4:-static}" "${run[@]}" pipeline.mode=async rl.steps="$steps" \
    rl.max_new_tokens=32 checkpoint.interval=2 cluster.rollout_ranks=1 cluster.storage_ranks=1 \
    pipeline.rank_timeout_seconds=60 run.dir="$d/run"
  for k in "${kills[@]}"; do
    IFS=: read -r kr ks <<< "$k"
    wait_progress "$d/run" $((ks > floor ? ks : floor)) 60 || break
    ino=$(stat -c %i "$d/run/metrics.jsonl")
    n=$(cat "$d/run/metrics.jsonl" | wc -l)
    [ "$n" -lt $((steps - 8)) ] && who=$(kill_torchrun_rank "$SLUICE" "$kr") \
      && killed=$((killed + 1)) && echo "$name: killed $who after $n steps"
    # (the next kill once the restarted rank 0 took up the checkpoint: a new metrics.jsonl)
    for _ in $(seq 900); do [ "$(stat -c %i "$d/run/metrics.jsonl")" != "$ino" ] && break; sleep 0.1; done
    floor=$(($(cat "$d/run/metrics.jsonl" | wc -l) + 2))  # (and two steps into the new attempt)
  done
  local rcs="" p
  for p in "${pids[@]}"; do wait "$p"; rcs="$rcs $?"; done
  pids=()
  [ "$killed" -eq ${#kills[@]} ] && [ "$rcs" = " 0 0 0" ] && trained_once "$d/run" "$steps" \
    && [ "$(cat "$d"/node*.log | grep -c "torchrun restart [0-9]*[^:]*: resuming from the run's latest checkpoint")" -eq "$killed" ] \
    && echo "ok   $name ($killed kills, every host restarted each time)" \
    || fail "$name: $killed kills, agents exited$rcs: $(for h in 0 1 2; do echo "host $h:"; grep -h "^error" "$d/node$h.log" | tail -3; done)"
}
# skip_case NAME WHY: a case that cannot run here, said and logged for the test command (setup.sh).
skip_case() {
  echo "skip $1: $2"
  [ -z "${SLUICE_SKIP_LOG:-}" ] || echo "multihost: case $1 skipped: $2" >> "$SLUICE_SKIP_LOG"
}
for c in torchrun torchrun-c10d; do
  want "$c" && ! command -v torchrun > /dev/null && skip_case "$c" "no torchrun (Debian's python3-torch)"
done
if want torchrun && command -v torchrun > /dev/null; then
  torchrun_kills torchrun 48 "3:4 0:12"
fi
if want torchrun-c10d && command -v torchrun > /dev/null; then
  torchrun_kills torchrun-c10d 60 "3:4 0:12 1:20" c10d
fi
if named torchrun-soak; then
  torchrun_kills torchrun-soak 80 "1:4 3:12 0:20 2:28 1:36"
fi

# --- stall: freeze the replica on host 1 once a step is trained
if want stall; then
  # (400 steps: the freeze must land mid-run; the run stops at the stall, so they cost nothing, where
  # 40 could all be generated before the freeze on a quiet machine and the run end with 0.)
  stall=("${run[@]}" pipeline.mode=async rl.steps=400 rl.max_new_tokens=64 cluster.rollout_ranks=1
         pipeline.rollout_replicas=0 pipeline.stall_seconds=3 pipeline.stop_on_stall=true
         run.metrics_listen=127.0.0.1:0 run.dir="$tmp/st")
  start_rank 1 2 "$tmp/st1.log" "${stall[@]}"
  start_rank 0 2 "$tmp/st0.log" "${stall[@]}"
  wait_steps "$tmp/st" 1 > /dev/null
  # Frozen once its heartbeat has reached rank 0 (its reports go once a second, and rank 0 reads
  # them once a second): before that, rank 0 gives it the start's allowance (60 s), not 3 s.
  for _ in $(seq 50); do
    live_counters "$tmp/st0.log" | grep -E '^sluice_role_activity\{role="rollout",index="0",activity="[^"]*"\} 1' \
      | grep -qv 'activity="starting"' && break
    sleep 0.2
  done
  freeze_host1_until_rank0_ends
  [ -n "$frozen" ] && [ "$rc" -ne 0 ] && [ "$took" -lt 60 ] \
    && grep -q "rollout replica 0 (pid $frozen on host [^ ]*) has made no progress for" "$tmp/st0.log" \
    && grep -q "on another host: its heartbeat comes through the ranks' store" "$tmp/st0.log" \
    || fail "stall: rc=$rc after ${took}s: $(grep -m1 "no progress" "$tmp/st0.log"; tail -2 "$tmp/st0.log")"
  # A hub storage rank frozen: named the same way (it beats while its server goes round its loop).
  stall=("${run[@]}" pipeline.mode=async rl.steps=40 rl.max_new_tokens=64 cluster.storage_ranks=1
         pipeline.stall_seconds=3 pipeline.stop_on_stall=true run.metrics_listen=127.0.0.1:0 run.dir="$tmp/ss")
  start_rank 1 2 "$tmp/ss1.log" "${stall[@]}"
  start_rank 0 2 "$tmp/ss0.log" "${stall[@]}"
  wait_steps "$tmp/ss" 1 > /dev/null
  # Rank 0's live counters show it while it serves; frozen once its heartbeat has reached rank 0
  # (until then rank 0 gives it the start's allowance, 60 s, not 3 s).
  for _ in $(seq 50); do
    counters=$(live_counters "$tmp/ss0.log")
    grep -q '^sluice_role_seconds_since_progress{role="hub_storage",index="0"}' <<<"$counters" && break
    sleep 0.2
  done
  grep -q '^sluice_role_activity{role="hub_storage",index="0",activity="serve hub storage"} 1' <<<"$counters" \
    || fail "stall: rank 0's live counters: $(grep -E "role_activity" <<<"$counters" | head -4)"
  freeze_host1_until_rank0_ends
  [ -n "$frozen" ] && [ "$rc" -ne 0 ] && [ "$took" -lt 60 ] \
    && grep -q "hub storage rank 0 (pid $frozen on host [^ ]*) has made no progress for [0-9]* s (pipeline.stall_seconds=3): in 'serve hub storage' for" "$tmp/ss0.log" \
    && echo "ok   stall" || fail "stall (storage rank): rc=$rc after ${took}s: $(grep -m1 "no progress" "$tmp/ss0.log"; tail -2 "$tmp/ss0.log")"
fi

# --- config: rank 1 with another learning rate
if want config; then
  start_rank 1 2 "$tmp/c1.log" "${run[@]}" run.dir="$tmp/cfg" trainer.lr=2e-3
  start_rank 0 2 "$tmp/c0.log" "${run[@]}" run.dir="$tmp/cfg"
  for p in "${pids[@]}"; do wait "$p"; done
  pids=()
  grep -q "trainer rank 1 of 2: this process's config (digest [0-9a-f]*) differs from rank 0's" "$tmp/c1.log" \
    && grep -q "differs from rank 0's" "$tmp/c0.log" && ! grep -q "held-out accuracy:" "$tmp/c0.log" \
    || fail "config: $(tail -n 2 "$tmp/c1.log" "$tmp/c0.log")"
  # Rank 1's host holds another model at the same model.path (a relative one: each host's working
  # directory has its own): refused at start-up, naming what differs, and rank 0 stops.
  "$SLUICE" train "${run[@]}" rl.steps=1 run.dir="$tmp/mdl" > "$tmp/mdl.log" 2>&1 \
    || fail "config: making a model: $(tail -2 "$tmp/mdl.log")"
  for h in 0 1; do mkdir -p "$tmp/host$h" && cp -r "$tmp/mdl/final" "$tmp/host$h/model"; done
  echo >> "$tmp/host1/model/config.json"
  echo '{"chat_template": "{{ messages[0].content }}"}' > "$tmp/host1/model/tokenizer_config.json"
  for h in 1 0; do
    ip netns exec "${hosts[$h]}" env -C "$tmp/host$h" RANK=$h WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 \
      GROUP_RANK=$h MASTER_ADDR="${net}1" MASTER_PORT=29561 timeout 240 "$(readlink -f "$SLUICE")" train "${run[@]}" \
      model.path=model reward.python="$(readlink -f "$rewards"):length_score" run.dir="$tmp/cfgm" > "$tmp/cm$h.log" 2>&1 &
    pids+=($!)
  done
  wait "${pids[1]}"; rc=$?
  wait "${pids[0]}"
  pids=()
  differs="model.path (model) holds another model on this host than on rank 0's (config.json differs, tokenizer_config.json only here): every host must load the same model"
  [ "$rc" -ne 0 ] && grep -qF "$differs" "$tmp/cm1.log" && grep -qF "$differs" "$tmp/cm0.log" \
    && echo "ok   config" || fail "config (model): rank 0 rc=$rc: $(tail -n 2 "$tmp/cm1.log" "$tmp/cm0.log")"
fi

# --- unreachable: nobody serves the rendezvous
if want unreachable; then
  start=$(date +%s)
  start_rank 1 2 "$tmp/u1.log" "${run[@]}" run.dir="$tmp/unr" pipeline.rank_timeout_seconds=3
  wait "${pids[0]}"; rc=$?
  pids=()
  took=$(( $(date +%s) - start ))
  [ "$rc" -ne 0 ] && [ "$took" -lt 60 ] && grep -q "rendezvous store at ${net}1:29561" "$tmp/u1.log" \
    && echo "ok   unreachable" || fail "unreachable: rc=$rc after ${took}s: $(tail -2 "$tmp/u1.log")"
fi

[ "$failures" -eq 0 ] || exit 1
