# Sourced by tests/multihost_test.sh and bench/multihost_recovery.sh: three
# "hosts", network namespaces joined by veth pairs to a bridge in a namespace
# of its own, made here and removed on exit, with what both run on them.
#
# Sets: tmp (a directory removed on exit unless KEEP=1), tag, hosts (the
# three namespaces), net (their /24: host h is ${net}$((h + 1))), pids
# (background processes killed on exit). Needs root and iproute2; exits 77
# (skipped) otherwise.
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
  for n in "$sw" "${hosts[@]}"; do
    ip netns pids "$n" 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del "$n" 2>/dev/null
    rm -rf "/etc/netns/$n"
  done
  if [ -n "${KEEP:-}" ]; then echo "kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT

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

# Waits until run directory $1 has $2 steps, as long as a step comes every
# $3 s; false if one did not.
wait_progress() {
  local last=-1 since=$SECONDS n
  while true; do
    n=$(cat "$1/metrics.jsonl" 2>/dev/null | wc -l)
    [ "$n" -ge "$2" ] && return 0
    [ "$n" -ne "$last" ] && { last=$n; since=$SECONDS; }
    [ $((SECONDS - since)) -ge "$3" ] && return 1
    sleep 0.2
  done
}

# True if run directory $1 trained steps 1..$2, each prompt once (3 per step), by its
# metrics and by its hub's ack log (tests/ack_ledger_check.py, which says what is wrong).
trained_once() {
  /usr/bin/python3 - "$1" "$2" <<'PY' || return 1
import json, sys
steps = int(sys.argv[2])
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
assert [r["step"] for r in rows] == list(range(1, steps + 1)), [r["step"] for r in rows]
assert sorted(p for r in rows for p in r["prompts"]) == list(range(3 * steps))
PY
  local ledger
  ledger=$(/usr/bin/python3 "$(dirname "${BASH_SOURCE[0]}")/ack_ledger_check.py" "$1" "$2" 3) || { echo "$ledger"; return 1; }
}

# torchrun_agents SLUICE DIR RESTARTS RDZV CONFIG...: one real torchrun agent per host (host 2 runs
# two ranks), each host named "$tag-n<h>" in a UTS namespace of its own, every one running
# `SLUICE train CONFIG...`; agent h logs to DIR/node<h>.log, its pid goes to pids. RDZV static:
# the agents' store on host 0 (host h is node h); c10d: torchrun's c10d rendezvous, hosts
# numbered as they arrive, each attempt's rank 0 serving a store of its own at its host's name
# (every host's /etc/hosts maps the three names).
# (--redirects/--tee: Debian 12's torchrun on Python 3.11 cannot start workers with their default 0)
torchrun_agents() {
  local sluice=$1 d=$2 restarts=$3 mode=$4 h rdzv names=""
  shift 4
  if [ "$mode" = c10d ]; then
    rdzv=(--rdzv_backend=c10d --rdzv_endpoint="${net}1:29572" --rdzv_id="$(basename "$d")-$$")
    for h in 0 1 2; do names="$names$net$((h + 1)) $tag-n$h\n"; done
    for h in "${hosts[@]}"; do
      mkdir -p "/etc/netns/$h" && printf "127.0.0.1 localhost\n$names" > "/etc/netns/$h/hosts"
    done
  else
    rdzv=(--master_addr="${net}1" --master_port=29571)
  fi
  mkdir -p "$d"
  for h in 1 2 0; do
    ip netns exec "${hosts[$h]}" unshare -u sh -c 'hostname "$0" && exec "$@"' "$tag-n$h" \
      timeout 300 torchrun --nnodes=3 --nproc_per_node=$((h == 2 ? 2 : 1)) \
      --node_rank="$h" "${rdzv[@]}" --max_restarts="$restarts" --monitor_interval=1 \
      --redirects=1 --tee=1 --log_dir="$d/logs$h" --no_python "$sluice" train "$@" > "$d/node$h.log" 2>&1 &
    pids+=($!)
  done
}

# kill_torchrun_rank SLUICE RANK: SIGKILLs the `SLUICE train` a torchrun agent started as RANK (not
# the role processes rank 0 starts), on whichever host; prints "rank R (pid P) on host H".
kill_torchrun_rank() {
  local sluice=$1 rank=$2 h p
  for p in $(for h in 0 1 2; do ip netns pids "${hosts[$h]}" | sed "s/$/:$h/"; done); do
    h=${p#*:} p=${p%:*}
    [ "/proc/$p/exe" -ef "$sluice" ] || continue  # (no fork per process: the kill comes on time)
    grep -q torchrun "/proc/$(awk '/^PPid/ {print $2}' "/proc/$p/status" 2>/dev/null)/cmdline" 2>/dev/null || continue
    tr '\0' '\n' 2>/dev/null < "/proc/$p/environ" | grep -qx "RANK=$rank" || continue
    kill -9 "$p" && echo "rank $rank (pid $p) on host $h" && return 0
  done
  return 1
}
