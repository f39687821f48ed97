#!/usr/bin/env bash
# End to end through the real `sluice` binary: write a checkpoint, load it,
# generate; and bad input at the command line gets a clear error and exit 2.
set -uo pipefail
SLUICE=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0

expect() {  # expect NAME WANT_RC NEEDLE -- command...   (the output is kept in $tmp/NAME.out)
  local name=$1 want=$2 needle=$3
  shift 4
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  printf '%s\n' "$out" > "$tmp/$name.out"
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
expect tiny-temperature 2 "use 0 for greedy" -- "$SLUICE" generate --model "$tmp/m" --temperature 1e-40 --max-new-tokens 4
expect generate-positional 2 "unexpected argument '1+1='" -- "$SLUICE" generate --model "$tmp/m" 1+1=
expect init-positional 2 "unexpected argument 'extra'" -- "$SLUICE" init --preset tiny --out "$tmp/unused" extra
[ ! -e "$tmp/unused" ] || { echo "FAIL init-positional wrote a model"; failures=$((failures + 1)); }
expect bad-preset 2 "unknown model preset 'huge'" -- "$SLUICE" init --preset huge --out "$tmp/x"
expect long-prompt 2 "no room for a response" -- "$SLUICE" generate --preset tiny --prompt "$(head -c 1100 /dev/zero | tr '\0' a)"

cp -r "$tmp/m" "$tmp/trunc"
truncate -s -100 "$tmp/trunc/model.safetensors"
expect truncated 1 "past the data buffer" -- "$SLUICE" generate --model "$tmp/trunc"
cp -r "$tmp/m" "$tmp/badcfg"
echo '{"hidden_size": 32}' > "$tmp/badcfg/config.json"
expect bad-config 2 "'num_hidden_layers' is missing" -- "$SLUICE" generate --model "$tmp/badcfg"
# Absurd sizes are refused before anything of that size is allocated.
cp -r "$tmp/m" "$tmp/huge"
sed -i 's/"num_hidden_layers": *[0-9]*/"num_hidden_layers": 1000000000/' "$tmp/huge/config.json"
expect huge-layers 2 "'num_hidden_layers': 1000000000 is over the limit" -- "$SLUICE" generate --model "$tmp/huge"
cp -r "$tmp/m" "$tmp/more"
sed -i 's/"num_hidden_layers": *[0-9]*/"num_hidden_layers": 400/' "$tmp/more/config.json"  # 200x the checkpoint
expect config-bigger-than-checkpoint 2 "but the checkpoint holds" -- "$SLUICE" generate --model "$tmp/more"

# sluice train / eval: a tiny end-to-end run, resume, and config and data errors.
small=(model.preset=tiny sft.steps=2 sft.batch_size=4 rl.steps=2 rl.prompts_per_step=2 rl.group_size=2
       rl.max_new_tokens=8 eval.size=4 eval.max_new_tokens=8 run.threads=1 run.progress=lines)
expect train 0 "held-out accuracy" -- "$SLUICE" train "${small[@]}" run.dir="$tmp/run" checkpoint.interval=1
[ -f "$tmp/run/final/model.safetensors" ] && [ -f "$tmp/run/checkpoints/step_000002/optimizer.safetensors" ] \
  && [ "$(wc -l < "$tmp/run/metrics.jsonl")" -eq 2 ] || { echo "FAIL train outputs missing"; failures=$((failures + 1)); }
expect resume 0 "held-out accuracy" -- "$SLUICE" train "${small[@]}" run.dir="$tmp/run" run.resume=true rl.steps=3
[ "$(wc -l < "$tmp/run/metrics.jsonl")" -eq 3 ] || { echo "FAIL resume did not continue at step 3"; failures=$((failures + 1)); }
# An agent run (the built-in calculator environment, every mode's plumbing is in the unit tests):
# every trained trajectory in trajectories.jsonl; resumed, the lines of steps past the checkpoint
# (here a stray one) are dropped and the later steps' written once.
expect agent-train 0 "held-out accuracy" -- "$SLUICE" train "${small[@]}" run.dir="$tmp/agent" agent.env=calculator \
  pipeline.mode=async rl.steps=3
echo '{"step": 99, "sample_id": 0}' >> "$tmp/agent/trajectories.jsonl"
expect agent-resume 0 "held-out accuracy" -- "$SLUICE" train "${small[@]}" run.dir="$tmp/agent" agent.env=calculator \
  pipeline.mode=async rl.steps=4 run.resume=true
[ "$(python3 -c "import json,sys,collections; c=collections.Counter(json.loads(l)['step'] for l in open(sys.argv[1])); print(sorted(c.items()))" "$tmp/agent/trajectories.jsonl")" = "[(1, 4), (2, 4), (3, 4), (4, 4)]" ] \
  && echo "ok   agent trajectories.jsonl through a resume" \
  || { echo "FAIL agent-resume: trajectories.jsonl is not 4 trajectories for each of steps 1-4"; failures=$((failures + 1)); }
# A Python environment (agent.env=file.py:Class, agent.env_config a JSON object) in the rollout
# process's workers: every trajectory opened by it; the run's first reset hangs past
# agent.env_timeout_seconds, its worker is killed and replaced, and its trajectory ends env_timeout
# while the run goes on. A class that does not load, or an agent.env that is no class, is refused
# before the run.
cat > "$tmp/envs.py" <<'PY'
import os, time
class Echo:
    def __init__(self, config):
        self.turns, self.hang_marker, self.n = config["turns"], config["hang_marker"], 0
    def reset(self, row):
        try:
            os.close(os.open(self.hang_marker, os.O_CREAT | os.O_EXCL))
            time.sleep(30)  # the first reset of the run
        except FileExistsError:
            pass
        return {"messages": [{"role": "user", "content": "echo " + row["prompt"]}]}
    def step(self, action):
        self.n += 1
        return {"messages": [{"role": "user", "content": "again"}], "reward": None, "done": self.n >= self.turns}
PY
expect agent-python 0 "held-out accuracy" -- "$SLUICE" train "${small[@]}" run.dir="$tmp/pyenv" \
  agent.env="$tmp/envs.py:Echo" 'agent.env_config={"turns": 2, "hang_marker": "'"$tmp/hung"'"}' agent.env_timeout_seconds=1 \
  pipeline.processes=true pipeline.mode=async
/usr/bin/python3 - "$tmp/pyenv/trajectories.jsonl" "$tmp/hung" <<'PY' && echo "ok   agent-python trajectories" || { echo "FAIL agent-python trajectories"; failures=$((failures + 1)); }
import collections, json, os, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
reasons = collections.Counter(j["end_reason"] for j in lines)
assert len(lines) == 8, len(lines)
# The hung reset (the run's first: the held-out evaluation's, before RL, or a rollout's) ended
# its trajectory; at most one trained trajectory is that one.
assert os.path.exists(sys.argv[2]) and reasons["env_timeout"] <= 1, reasons
opened = [j for j in lines if j["turns"]]
assert opened and all(j["turns"][0]["content"].startswith("echo ") for j in opened), lines[0]["turns"]
PY
# The built-in code-execution tool: the run checks its sandbox runs Python, then trains; a limit
# it does not have is refused naming it.
expect agent-python-tool 0 "held-out accuracy" -- "$SLUICE" train "${small[@]}" run.dir="$tmp/pytool" \
  agent.env=python 'agent.env_config={"wall_seconds": 2}' rl.steps=1
expect agent-python-tool-limit 2 "agent.env_config.walltime (agent.env=python): is not a limit of the sandbox" -- \
  "$SLUICE" train "${small[@]}" run.dir="$tmp/pytool2" agent.env=python 'agent.env_config={"walltime": 2}'
expect agent-python-missing 2 "has no attribute 'Nope'" -- "$SLUICE" train "${small[@]}" run.dir="$tmp/pyenv2" \
  agent.env="$tmp/envs.py:Nope"
expect agent-not-a-class 2 "is neither calculator, python nor a Python class" -- "$SLUICE" train "${small[@]}" \
  run.dir="$tmp/pyenv3" agent.env=nocolon
# A torchrun --max-restarts attempt (the same command again) takes up the failed attempt's run, or
# starts it over in place when it left no checkpoint.
cp -r "$tmp/run" "$tmp/attempt" && mkdir "$tmp/attempt0" && cp "$tmp/run/config.yaml" "$tmp/attempt0/"
expect torchrun-restart 0 "torchrun restart 1: resuming from the run's latest checkpoint" -- \
  env RANK=0 WORLD_SIZE=1 TORCHELASTIC_RESTART_COUNT=1 "$SLUICE" train "${small[@]}" run.dir="$tmp/attempt" rl.steps=4
[ "$(wc -l < "$tmp/attempt/metrics.jsonl")" -eq 4 ] || { echo "FAIL torchrun-restart did not continue at step 4"; failures=$((failures + 1)); }
# With the roles as processes too: the trainer process takes up the checkpoint (its metrics lines
# and optimizer state), not only the launcher.
cp -r "$tmp/run" "$tmp/attempt-p"
expect torchrun-restart-processes 0 "torchrun restart 1: resuming from the run's latest checkpoint" -- \
  env RANK=0 WORLD_SIZE=1 TORCHELASTIC_RESTART_COUNT=1 "$SLUICE" train "${small[@]}" run.dir="$tmp/attempt-p" rl.steps=4 \
  pipeline.mode=sync pipeline.processes=true
[ "$(wc -l < "$tmp/attempt-p/metrics.jsonl")" -eq 4 ] \
  || { echo "FAIL torchrun-restart-processes did not continue at step 4"; failures=$((failures + 1)); }
expect torchrun-restart-early 0 "torchrun restart 2: no checkpoint yet, starting over" -- \
  env RANK=0 WORLD_SIZE=1 TORCHELASTIC_RESTART_COUNT=2 "$SLUICE" train "${small[@]}" run.dir="$tmp/attempt0"
[ "$(wc -l < "$tmp/attempt0/metrics.jsonl")" -eq 2 ] || { echo "FAIL torchrun-restart-early"; failures=$((failures + 1)); }
# A run directory is never reused by accident: a rerun is refused and leaves the run as it was;
# resuming needs a run to resume; overwriting replaces the earlier run's files only.
expect rerun-refused 1 "run.overwrite=true" -- "$SLUICE" train "${small[@]}" run.dir="$tmp/run"
[ "$(wc -l < "$tmp/run/metrics.jsonl")" -eq 3 ] && [ -d "$tmp/run/checkpoints/step_000003" ] \
  || { echo "FAIL rerun-refused changed the earlier run"; failures=$((failures + 1)); }
expect resume-nothing 1 "holds no run to resume" -- "$SLUICE" train "${small[@]}" run.dir="$tmp/fresh" run.resume=true
expect resume-and-overwrite 2 "exclude each other" -- "$SLUICE" train "${small[@]}" run.dir="$tmp/run" run.resume=true run.overwrite=true
# resuming with another model is refused naming what differs, and leaves the run as it was.
expect resume-other-model 1 "holds another model than this run's (hidden_size" -- \
  "$SLUICE" train "${small[@]}" run.dir="$tmp/run" run.resume=true rl.steps=4 model.preset=1m
expect resume-other-model-ckpt 1 "config.yaml) or choose another run.dir" -- \
  "$SLUICE" train "${small[@]}" run.dir="$tmp/run" run.resume=true rl.steps=4 model.preset=1m sft.steps=0
[ "$(wc -l < "$tmp/run/metrics.jsonl")" -eq 3 ] || { echo "FAIL resume-other-model changed the run"; failures=$((failures + 1)); }
cp -r "$tmp/run" "$tmp/over" && echo "my notes" > "$tmp/over/notes.txt"
expect overwrite 0 "removed the earlier run" -- "$SLUICE" train "${small[@]}" run.dir="$tmp/over" run.overwrite=true checkpoint.interval=1
[ "$(wc -l < "$tmp/over/metrics.jsonl")" -eq 2 ] && [ ! -e "$tmp/over/checkpoints/step_000003" ] && [ -f "$tmp/over/notes.txt" ] \
  && grep -q "overwrite: false" "$tmp/over/config.yaml" \
  || { echo "FAIL overwrite: the earlier run's files stayed, or another file went"; failures=$((failures + 1)); }
expect eval 0 "held-out accuracy" -- "$SLUICE" eval --model "$tmp/run/final" eval.size=4 eval.max_new_tokens=8
[ -f "$tmp/run/report.html" ] || { echo "FAIL train wrote no report.html"; failures=$((failures + 1)); }
expect report 0 "report.html" -- "$SLUICE" report "$tmp/run"
expect report-not-a-run 2 "no metrics" -- "$SLUICE" report "$tmp/nowhere"
expect async 0 "held-out accuracy" -- "$SLUICE" train "${small[@]}" run.dir="$tmp/async" pipeline.mode=async \
  pipeline.max_staleness=1 trainer.off_policy_correction=tis
grep -q '"staleness_max"' "$tmp/async/metrics.jsonl" || { echo "FAIL async run wrote no staleness"; failures=$((failures + 1)); }

# reward.python: a Python function (verl's compute_score form) scores the answers in worker
# processes. length_score pays for every character, so even an untrained model earns rewards > 0.
rewards="$(dirname "$0")/data/rewards/arithmetic_reward.py"
all_positive() {  # all_positive KEY FILE: every value of KEY in FILE is > 0 (and there is one)
  grep -o "\"$1\":[-0-9.e]*" "$2" | cut -d: -f2 | awk '{ n++; if ($1 <= 0) bad++ } END { exit !(n > 0 && bad == 0) }'
}
expect python-reward 0 "held-out accuracy" -- "$SLUICE" train "${small[@]}" run.dir="$tmp/py" \
  reward.python="$rewards:length_score"
all_positive reward_mean "$tmp/py/metrics.jsonl" && all_positive eval_reward "$tmp/py/metrics.jsonl" \
  && ! grep -q reward_errors "$tmp/py/metrics.jsonl" \
  || { echo "FAIL python-reward: rewards not from the function"; failures=$((failures + 1)); }
# A function that raises (on answers of odd length): those answers get reward.error_reward, each
# is logged with its example and counted in metrics.jsonl, and the run goes on.
"$SLUICE" train "${small[@]}" run.dir="$tmp/pyerr" reward.python="$rewards:flaky_score" reward.error_reward=-0.5 \
  > "$tmp/pyerr.log" 2>&1
rc=$?
[ "$rc" -eq 0 ] && grep -q "held-out accuracy" "$tmp/pyerr.log" \
  && grep -q "train example [0-9]*: the function raised ValueError: odd length [0-9]* (at .*arithmetic_reward.py:[0-9]* in flaky_score); reward -0.5" "$tmp/pyerr.log" \
  && grep -q '"reward_errors":[1-9]' "$tmp/pyerr/metrics.jsonl" \
  && echo "ok   python-reward-raises" \
  || { echo "FAIL python-reward-raises: rc=$rc, errors not logged or not counted"; tail -3 "$tmp/pyerr.log"; failures=$((failures + 1)); }
# Errors in the evaluations, the final one included, are counted too (the final one's were lost).
"$SLUICE" train "${small[@]}" run.dir="$tmp/pyeval" reward.python="$rewards:eval_only_error" > "$tmp/pyeval.log" 2>&1
rc=$?
# Step 1 holds the errors of the evaluation before RL; step 2 adds the final one's, and no others.
count() { local n; n=$(echo "$2" | grep -o "\"$1\":[0-9]*" | cut -d: -f2); echo "${n:-0}"; }
first=$(head -1 "$tmp/pyeval/metrics.jsonl" 2>/dev/null); last=$(tail -1 "$tmp/pyeval/metrics.jsonl" 2>/dev/null)
[ "$rc" -eq 0 ] && echo "$last" | grep -q '"step":2,' && echo "$last" | grep -q '"eval_reward_errors":[1-9]' \
  && [ "$(($(count reward_errors "$last") - $(count reward_errors "$first")))" = "$(count eval_reward_errors "$last")" ] \
  && echo "ok   python-reward-eval-errors" \
  || { echo "FAIL python-reward-eval-errors: rc=$rc, the final evaluation's errors are not in metrics.jsonl: $last"; failures=$((failures + 1)); }
# Refused before anything is built, naming the problem (the run directory is not even created).
expect python-reward-spec 2 "expected 'package.module:function'" -- "$SLUICE" train run.dir="$tmp/pybad" reward.python=rewards
expect python-reward-module 2 "cannot import module 'no_such_module_sluice': ModuleNotFoundError" -- \
  "$SLUICE" train run.dir="$tmp/pybad" reward.python=no_such_module_sluice:compute_score
expect python-reward-function 2 "has no attribute 'nothing'" -- "$SLUICE" train run.dir="$tmp/pybad" reward.python="$rewards:nothing"
expect python-reward-interpreter 2 "'no-such-python' is not on PATH" -- "$SLUICE" train run.dir="$tmp/pybad" \
  reward.python="$rewards:compute_score" reward.python_executable=no-such-python
[ ! -e "$tmp/pybad" ] || { echo "FAIL python-reward: a refused run created its run.dir"; failures=$((failures + 1)); }

# Process mode: trainer, rollout and reward each in its own process over shared
# memory. Every prompt is trained exactly once, staleness stays within the bound.
proc=(model.preset=tiny sft.steps=0 rl.steps=6 rl.prompts_per_step=3 rl.group_size=2 rl.max_new_tokens=8
      rl.dynamic_sampling=false eval.size=4 eval.max_new_tokens=8 eval.interval=0 run.threads=1 run.progress=lines
      pipeline.mode=async pipeline.max_staleness=2 pipeline.processes=true pipeline.rollout_threads=1
      pipeline.trainer_threads=1)
expect processes 0 "held-out accuracy" -- "$SLUICE" train "${proc[@]}" run.dir="$tmp/proc" run.trace=true
# The roles call the hub through its shared-memory rings (pipeline.hub_fast_paths, on by default).
grep -qE 'requests from the roles, [1-9][0-9]* through shared-memory rings' "$tmp/processes.out" &&
  echo "ok   hub-fast-paths" || { echo "FAIL hub-fast-paths: $(grep 'requests from the roles' "$tmp/processes.out")"; failures=$((failures + 1)); }
# run.trace: the launcher's and every role's timeline in one trace-event file, each role on its own
# track whether roles are processes or threads, the per-process parts merged and removed.
expect threads-trace 0 "held-out accuracy" -- "$SLUICE" train "${proc[@]}" run.dir="$tmp/thr" run.trace=true \
  pipeline.processes=false
/usr/bin/python3 - "$tmp/proc" "$tmp/thr" <<'PY' && echo "ok   trace-files" || { echo "FAIL trace-files"; failures=$((failures + 1)); }
import glob, json, sys
want = {(0, "put prompts"), (1, "wait for groups"), (1, "train step"), (1, "publish"), (1, "ack"),
        (2, "take prompts"), (2, "decode step"), (2, "write answer"), (3, "take answer"), (3, "score"),
        (3, "write reward")}
for run in sys.argv[1:]:
    events = json.load(open(run + "/trace.json"))
    spans = {(e["pid"], e["name"]) for e in events if e["ph"] == "X"}
    tracks = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert want <= spans, (run, want - spans)
    assert tracks == {0: "launcher", 1: "trainer", 2: "rollout", 3: "reward"}, (run, tracks)
    assert all(e["dur"] >= 0 for e in events if e["ph"] == "X")
    assert not glob.glob(run + "/roles/trace-*"), glob.glob(run + "/roles/trace-*")
PY
trained=$(grep -o '"prompts":\[[0-9,]*\]' "$tmp/proc/metrics.jsonl" | grep -o '[0-9][0-9]*' | sort -n | tr '\n' ' ')
[ "$trained" = "$(seq 0 17 | tr '\n' ' ')" ] || { echo "FAIL processes: trained prompts '$trained', want 0..17 once each"; failures=$((failures + 1)); }
stale=$(grep -o '"staleness_max":[0-9]*' "$tmp/proc/metrics.jsonl" | cut -d: -f2 | sort -n | tail -1)
[ -n "$stale" ] && [ "$stale" -le 2 ] || { echo "FAIL processes: staleness_max '$stale' > 2"; failures=$((failures + 1)); }
# pipeline.trainer_ranks: two data-parallel trainer processes take the steps one takes (sync mode:
# the same samples, so the same losses and gradient norms within float rounding); three ranks in
# async mode (one rank's shard of a mini-batch can be empty) train every prompt once.
ranks=("${proc[@]}" pipeline.mode=sync trainer.mini_batches=2 trainer.lr=1e-3 reward.python="$rewards:length_score")
# (One rank with the hub's fast paths off: every call through its ZeroMQ socket, the same steps.)
expect ranks-1 0 "requests from the roles, 0 through shared-memory rings, 0 through direct TCP connections" -- \
  "$SLUICE" train "${ranks[@]}" run.dir="$tmp/ranks1" pipeline.hub_fast_paths=false
expect ranks-2 0 "held-out accuracy" -- "$SLUICE" train "${ranks[@]}" run.dir="$tmp/ranks2" pipeline.trainer_ranks=2 \
  run.trace=true
expect ranks-3 0 "held-out accuracy" -- "$SLUICE" train "${proc[@]}" run.dir="$tmp/ranks3" pipeline.trainer_ranks=3 \
  trainer.mini_batches=2
# pipeline.rollout_replicas and pipeline.reward_workers: two rollout processes sharing the prompt
# stream and two reward processes generate and score the answers one of each does (sync mode:
# every answer's seed follows from its prompt and index), so the run trains the same steps.
expect replicas-2 0 "held-out accuracy" -- "$SLUICE" train "${ranks[@]}" run.dir="$tmp/replicas2" \
  pipeline.rollout_replicas=2 pipeline.reward_workers=2 run.trace=true
/usr/bin/python3 - "$tmp/ranks1" "$tmp/replicas2" <<'PY' && echo "ok   rollout-replicas" || { echo "FAIL rollout-replicas"; failures=$((failures + 1)); }
import collections, json, sys
one, two = ([json.loads(l) for l in open(d + "/metrics.jsonl")] for d in sys.argv[1:])
assert len(one) == len(two) == 6, (len(one), len(two))
for a, b in zip(one, two):
    assert a["prompts"] == b["prompts"] and a["train_tokens"] == b["train_tokens"], (a["step"], a, b)
    for key in ("loss", "grad_norm", "entropy", "reward_mean"):
        assert abs(a[key] - b[key]) <= 1e-5 * (1 + abs(a[key])), (a["step"], key, a[key], b[key])
# Both replicas and both workers did part of the work (their threads are named in the trace).
events = json.load(open(sys.argv[2] + "/trace.json"))
threads = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
work = collections.Counter(threads.get(e["tid"], "?").split(" ")[0] for e in events
                           if e["ph"] == "X" and e["name"] in ("write answer", "write reward"))
assert work["rollout"] > 0 and work["rollout-1"] > 0 and work["reward"] > 0 and work["reward-1"] > 0, work
# Each step's line says what each replica generated (adding up to the step's rollout_tokens), and the
# report draws it.
for b in two:
    assert len(b["replica_tokens"]) == len(b["replica_busy"]) == 2, b
    assert sum(b["replica_tokens"]) == b["rollout_tokens"], b
    assert all(0 <= x <= 1 for x in b["replica_busy"]), b
assert all(sum(b["replica_tokens"][k] for b in two) > 0 for k in (0, 1)), [b["replica_tokens"] for b in two]
assert all("replica_tokens" not in a for a in one)
assert "Rollout replicas: tokens generated per step" in open(sys.argv[2] + "/report.html").read()
PY
/usr/bin/python3 - "$tmp/ranks1" "$tmp/ranks2" "$tmp/ranks3" <<'PY' && echo "ok   trainer-ranks" || { echo "FAIL trainer-ranks"; failures=$((failures + 1)); }
import json, sys
one, two, three = ([json.loads(l) for l in open(d + "/metrics.jsonl")] for d in sys.argv[1:])
assert len(one) == len(two) == 6, (len(one), len(two))
for a, b in zip(one, two):
    assert a["prompts"] == b["prompts"] and a["train_tokens"] == b["train_tokens"], (a["step"], a, b)
    for key in ("loss", "pg_loss", "grad_norm", "entropy", "reward_mean"):
        assert abs(a[key] - b[key]) <= 1e-5 * (1 + abs(a[key])), (a["step"], key, a[key], b[key])
assert any(a["grad_norm"] > 0 for a in one), "some step had a gradient"
# Per-rank figures on rank 0's line: every rank trained part of each step, and the report draws them.
for b in two:
    assert len(b["rank_tokens"]) == len(b["rank_train_seconds"]) == len(b["rank_collective_seconds"]) == 2, b
    assert min(b["rank_tokens"]) > 0 and min(b["rank_train_seconds"]) > 0, b
assert "Trainer ranks: update seconds" in open(sys.argv[2] + "/report.html").read()
assert all("rank_tokens" not in a for a in one)
trained = sorted(p for r in three for p in r["prompts"])
assert trained == list(range(18)), trained
# Rank 1 has its own row on the trainer's track of the trace, with its steps' spans.
events = json.load(open(sys.argv[2] + "/trace.json"))
threads = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
rank1 = [e for e in events if e["ph"] == "X" and threads.get(e["tid"]) == "trainer rank 1"]
assert sum(e["name"] == "train step" for e in rank1) == 6, [e["name"] for e in rank1]
assert {e["name"] for e in rank1} >= {"wait for step plan", "read shard", "train step"}, rank1
assert {e["pid"] for e in rank1} == {1}, rank1  # the trainer's track
PY
# reward.python with the roles as processes: the reward role scores with the function, and workers
# start only in the processes that score (the launcher's and the trainer's evaluations, the reward
# role), never in the rollout's.
expect processes-python-reward 0 "held-out accuracy" -- env SLUICE_TEST_REWARD_LOG="$tmp/importers.log" \
  "$SLUICE" train "${proc[@]}" run.dir="$tmp/procpy" reward.python="$rewards:length_score"
importers=$(sort -u "$tmp/importers.log" 2>/dev/null | tr '\n' ' ')
all_positive reward_mean "$tmp/procpy/metrics.jsonl" && [ "$importers" = "launcher reward trainer " ] \
  || { echo "FAIL processes-python-reward: rewards not from the function, or workers in '$importers'"; failures=$((failures + 1)); }

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

# SIGKILL of the launcher: it cannot clean up (its roles die with it), so its shared memory stays
# until the next process-mode run, which removes every segment named after a dead launcher.
"$SLUICE" train "${proc[@]}" run.dir="$tmp/kill" rl.steps=1000000 > "$tmp/kill.log" 2>&1 &
launcher=$!
for _ in $(seq 300); do grep -q '"step":1' "$tmp/kill/metrics.jsonl" 2>/dev/null && break; sleep 0.1; done
kill -KILL $launcher; wait $launcher 2>/dev/null
for _ in $(seq 100); do [ -z "$(children_of $launcher)" ] && break; sleep 0.1; done
leaked=$(ls /dev/shm | grep -cE "(^|[.-])$launcher-" || true)
[ "$leaked" -ge 2 ] || { echo "FAIL sigkill: expected the dead run's segments, found $leaked"; failures=$((failures + 1)); }
expect sweep-dead-run 0 "held-out accuracy" -- "$SLUICE" train "${proc[@]}" run.dir="$tmp/after-kill" rl.steps=1
left=$(ls /dev/shm | grep -E "(^|[.-])$launcher-" || true)
[ -z "$left" ] || { echo "FAIL sigkill: the next run left the dead run's segments: $left"; failures=$((failures + 1)); }

# A stalled role (SIGSTOP) is reported by name, pid and state, and again when it moves on; with
# pipeline.stop_on_stall=true the run stops with that report and leaves no role behind.
role_pid() {  # role_pid LAUNCHER ROLE: the pid of that role's process
  for p in $(children_of "$1"); do tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | grep -q -- "--role=$2 " && echo "$p"; done
}
for action in warn stop; do
  stop_flag=false; [ $action = stop ] && stop_flag=true
  "$SLUICE" train "${proc[@]}" run.dir="$tmp/stall-$action" rl.steps=1000000 pipeline.stall_seconds=5 \
    pipeline.stop_on_stall=$stop_flag run.metrics_listen=127.0.0.1:0 > "$tmp/stall-$action.log" 2>&1 &
  launcher=$!
  for _ in $(seq 300); do grep -q '"step":1' "$tmp/stall-$action/metrics.jsonl" 2>/dev/null && break; sleep 0.1; done
  rollout=$(role_pid $launcher rollout)
  [ -n "$rollout" ] && kill -STOP "$rollout"
  report="the rollout role (pid $rollout) has made no progress for [0-9]* s (pipeline.stall_seconds=5): in '[a-z ]*' for [0-9]* s; it is stopped by a signal"
  for _ in $(seq 300); do grep -q "$report" "$tmp/stall-$action.log" && break; sleep 0.1; done
  grep -q "$report" "$tmp/stall-$action.log" \
    || { echo "FAIL stall-$action: no report of the stopped rollout"; tail -3 "$tmp/stall-$action.log"; failures=$((failures + 1)); }
  if [ $action = warn ]; then
    # The live counters (run.metrics_listen) say the same while it stalls; a second run asking for
    # the same port is refused.
    url=$(grep -o 'live counters: http://127.0.0.1:[0-9]*/metrics' "$tmp/stall-warn.log" | cut -d' ' -f3)
    /usr/bin/python3 - "$url" <<'PY' || { echo "FAIL stall-warn: live counters ($url)"; failures=$((failures + 1)); }
import re, sys, urllib.request
text = urllib.request.urlopen(sys.argv[1], timeout=10).read().decode()
values = dict(re.findall(r'^(sluice_[a-z_]+(?:\{[^}]*\})?) (\S+)$', text, re.M))
assert float(values['sluice_trainer_step']) >= 1, text
assert float(values['sluice_role_seconds_since_progress{role="rollout",index="0"}']) >= 5, text
assert float(values['sluice_role_seconds_since_progress{role="reward",index="0"}']) < 5, text
assert float(values['sluice_hub_requests_total{path="ring"}']) > 0, text
# Each family's samples follow its own HELP and TYPE lines (the exposition format).
family = None
for line in text.splitlines():
    if line.startswith('# TYPE '):
        family = line.split()[2]
    elif not line.startswith('#'):
        assert line.split('{')[0].split(' ')[0] == family, (line, family)
assert float(values['sluice_hub_acked_rows_total{task="train"}']) >= 1, text
assert float(values['sluice_rollout_tokens_total']) > 0, text
PY
    port=${url##*:}; port=${port%%/*}
    expect metrics-port-taken 1 "cannot bind 127.0.0.1:$port" -- "$SLUICE" train "${proc[@]}" rl.steps=1 \
      run.dir="$tmp/port-taken" run.metrics_listen="127.0.0.1:$port"
    kill -CONT "$rollout"
    for _ in $(seq 300); do grep -q "rollout role (pid $rollout) makes progress again" "$tmp/stall-$action.log" && break; sleep 0.1; done
    grep -q "rollout role (pid $rollout) makes progress again" "$tmp/stall-$action.log" \
      || { echo "FAIL stall-warn: the rollout's recovery was not reported"; failures=$((failures + 1)); }
    kill -0 $launcher 2>/dev/null || { echo "FAIL stall-warn: the run stopped"; failures=$((failures + 1)); }
    kill -INT $launcher
  fi
  for _ in $(seq 300); do kill -0 $launcher 2>/dev/null || break; sleep 0.1; done
  wait $launcher; rc=$?
  if [ $action = stop ]; then
    [ "$rc" -eq 1 ] && grep -q "Timeout: $report.*stopping the run (pipeline.stop_on_stall=true)" "$tmp/stall-stop.log" \
      || { echo "FAIL stall-stop: rc=$rc"; tail -3 "$tmp/stall-stop.log"; failures=$((failures + 1)); }
  fi
  [ -n "$rollout" ] && kill -0 "$rollout" 2>/dev/null && { echo "FAIL stall-$action: rollout $rollout still runs"; kill -9 "$rollout"; failures=$((failures + 1)); }
done
[ "$failures" -eq 0 ] && echo "ok   stalled roles reported"
# A stopped trainer rank above 0 is watched too: the stop names it, its activity and its state,
# beside rank 0 waiting for it.
"$SLUICE" train "${proc[@]}" run.dir="$tmp/stall-rank" rl.steps=1000000 pipeline.trainer_ranks=2 \
  pipeline.stall_seconds=3 pipeline.stop_on_stall=true > "$tmp/stall-rank.log" 2>&1 &
launcher=$!
for _ in $(seq 300); do grep -q '"step":1' "$tmp/stall-rank/metrics.jsonl" 2>/dev/null && break; sleep 0.1; done
rank1=$(for p in $(children_of $launcher); do tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | grep -q -- "--trainer-rank=1 " && echo "$p"; done)
[ -n "$rank1" ] && kill -STOP "$rank1"
for _ in $(seq 300); do kill -0 $launcher 2>/dev/null || break; sleep 0.1; done
wait $launcher; rc=$?
[ "$rc" -eq 1 ] && [ -n "$rank1" ] \
  && grep -q "Timeout: .*trainer rank 1 (pid $rank1) has made no progress for [0-9]* s (pipeline.stall_seconds=3): in '[a-z ]*' for [0-9]* s; it is stopped by a signal" "$tmp/stall-rank.log" \
  && echo "ok   stalled trainer rank reported" \
  || { echo "FAIL stall-rank: rc=$rc"; tail -3 "$tmp/stall-rank.log"; failures=$((failures + 1)); }
[ -n "$rank1" ] && kill -0 "$rank1" 2>/dev/null && { echo "FAIL stall-rank: rank 1 still runs"; kill -9 "$rank1"; failures=$((failures + 1)); }
# A trainer command that hangs (acks nothing, publishes nothing) is watched by what it does: the
# rollout's polls of the hub counted as the run's progress, and such a run waited for ever.
timeout 120 "$SLUICE" train "${proc[@]}" run.dir="$tmp/stall-command" rl.steps=3 pipeline.trainer_command="exec sleep 600" \
  pipeline.stall_seconds=2 pipeline.stall_start_seconds=2 pipeline.stop_on_stall=true > "$tmp/stall-command.log" 2>&1
rc=$?
[ "$rc" -eq 1 ] \
  && grep -q "Timeout: .*pipeline.trainer_command (pid [0-9]*) has made no progress for [0-9]* s (since it started, pipeline.stall_seconds=2): in 'starting' for [0-9]* s; it is sleeping" "$tmp/stall-command.log" \
  && echo "ok   stalled trainer command reported" \
  || { echo "FAIL stall-command: rc=$rc"; tail -3 "$tmp/stall-command.log"; failures=$((failures + 1)); }

# sluice tokenize: a model directory's tokenizer.json both ways; bad lines named.
qwen="$(dirname "$0")/data/tokenizers/qwen3"
expect tokenize 0 "[39,301,385,11,1879,0]" -- "$SLUICE" tokenize --model "$qwen" --text "Hello, world!"
printf '"<|im_start|>hi"\n"x"\n' > "$tmp/texts.jsonl"
expect tokenize-stdin 0 "[151644,71,72]" -- sh -c "\"$SLUICE\" tokenize --model \"$qwen\" < \"$tmp/texts.jsonl\""
printf '[151644,71,72,151645]\n' > "$tmp/ids.jsonl"
expect tokenize-decode 0 '"hi"' -- sh -c "\"$SLUICE\" tokenize --model \"$qwen\" --decode < \"$tmp/ids.jsonl\""
printf '"ok"\nnot json\n' > "$tmp/bad.jsonl"
expect tokenize-bad-line 2 "stdin:2: expected a JSON string" -- sh -c "\"$SLUICE\" tokenize --model \"$qwen\" < \"$tmp/bad.jsonl\""
expect tokenize-no-tokenizer 2 "has no tokenizer.json (a Hugging Face model) or config.json" -- \
  "$SLUICE" tokenize --model "$tmp" --text x
# The built-in models (no --model, or a directory without tokenizer.json): the byte tokenizer and
# the built-in chat template, whose <eos> is the end token (258).
expect tokenize-bytes 0 "[104,105]" -- "$SLUICE" tokenize --text hi
printf '[104,105,258]\n' > "$tmp/byte_ids.jsonl"
expect tokenize-bytes-decode 0 '"hi<eos>"' -- sh -c "\"$SLUICE\" tokenize --decode --keep-special < \"$tmp/byte_ids.jsonl\""
echo '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], "tools": [{"type": "function", "function": {"name": "calculator"}}]}' \
  > "$tmp/byte_chat.jsonl"
expect tokenize-bytes-chat 0 '"tools: calculator\nuser: hi\nassistant: yo<eos>"' -- \
  sh -c "\"$SLUICE\" tokenize --chat < \"$tmp/byte_chat.jsonl\""
expect tokenize-bytes-chat-ids 0 ',121,111,258]' -- sh -c "\"$SLUICE\" tokenize --chat --ids < \"$tmp/byte_chat.jsonl\""
# --chat: conversations through the model's chat template (Qwen3's, with its thinking switch).
echo '{"messages": [{"role": "user", "content": "2+2?"}], "add_generation_prompt": true, "enable_thinking": false}' \
  > "$tmp/chat.jsonl"
expect tokenize-chat 0 '"<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"' -- \
  sh -c "\"$SLUICE\" tokenize --model \"$qwen\" --chat < \"$tmp/chat.jsonl\""
echo '{"messages": "not a list"}' > "$tmp/badchat.jsonl"
expect tokenize-chat-bad 2 'stdin:1: expected a JSON object with a "messages" list' -- \
  sh -c "\"$SLUICE\" tokenize --model \"$qwen\" --chat < \"$tmp/badchat.jsonl\""
# Started by a launcher as one of several processes (each a trainer rank; tests/multihost_test.sh
# runs them): without the process mode, or with pipeline.trainer_ranks disagreeing with the launch,
# refused naming the placement; a malformed launcher variable is named.
expect torchrun-world-2 1 "rank 1 of 2 (local 1 of 2, node 0), rendezvous at 127.0.0.1:29511, from torchrun" -- \
  env RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 \
  "$SLUICE" train run.dir="$tmp/ranked"
expect torchrun-ranks-disagree 2 "pipeline.trainer_ranks=3, but launched as rank 0 of 2" -- \
  env RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 \
  "$SLUICE" train run.dir="$tmp/ranked" pipeline.mode=async pipeline.processes=true pipeline.trainer_ranks=3
# cluster.rollout_ranks / reward_ranks / storage_ranks: the last launched ranks are rollout
# replicas, reward workers and hub storage servers; counts that leave no trainer rank, or a process
# no launcher started, are refused naming the problem.
expect cluster-no-trainer 2 "cluster.rollout_ranks=1, cluster.reward_ranks=1 and cluster.storage_ranks=0, but launched as rank 0 of 2" -- \
  env RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 \
  "$SLUICE" train run.dir="$tmp/ranked" pipeline.mode=async pipeline.processes=true cluster.rollout_ranks=1 \
  cluster.reward_ranks=1
expect cluster-ranks-disagree 2 "from torchrun, and cluster.rollout_ranks=1, cluster.reward_ranks=0 and cluster.storage_ranks=0 leave 1 trainer rank(s)" -- \
  env RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 "$SLUICE" train run.dir="$tmp/ranked" \
  pipeline.mode=async pipeline.processes=true cluster.rollout_ranks=1 pipeline.trainer_ranks=2
expect cluster-not-launched 2 "cluster.reward_ranks=1, cluster.storage_ranks=0: rollout, reward and storage ranks are processes that a launcher" -- \
  "$SLUICE" train run.dir="$tmp/ranked" pipeline.mode=async pipeline.processes=true cluster.reward_ranks=1
expect cluster-storage-not-launched 2 "cluster.storage_ranks=2: rollout, reward and storage ranks are processes that a launcher" -- \
  "$SLUICE" train run.dir="$tmp/ranked" pipeline.mode=async pipeline.processes=true cluster.storage_ranks=2
expect cluster-storage-no-trainer 2 "and cluster.storage_ranks=2, but launched as rank 0 of 2" -- \
  env RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 \
  "$SLUICE" train run.dir="$tmp/ranked" pipeline.mode=async pipeline.processes=true cluster.storage_ranks=2
expect cluster-no-replica 2 "pipeline.rollout_replicas: must be at least 1" -- \
  "$SLUICE" train run.dir="$tmp/ranked" pipeline.mode=async pipeline.processes=true pipeline.rollout_replicas=0
# `sluice train --join`: only rollout replicas and reward workers join, at a rendezvous named by
# MASTER_ADDR/MASTER_PORT, with the process mode; nobody there: refused after rank_timeout_seconds
# naming the store (tests/multihost_test.sh joins real runs).
expect join-trainer 2 "--join=trainer: a process joins a run as a rollout replica (--join=rollout) or a reward worker" -- \
  "$SLUICE" train run.dir="$tmp/joined" --join=trainer
expect join-no-rendezvous 2 "--join=rollout: set MASTER_ADDR and MASTER_PORT to the run's rendezvous" -- \
  "$SLUICE" train run.dir="$tmp/joined" pipeline.mode=async pipeline.processes=true --join=rollout
expect join-no-processes 1 "--join=reward: a run's processes need pipeline.processes=true" -- \
  env MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 "$SLUICE" train run.dir="$tmp/joined" --join=reward
expect join-nobody-there 1 "cannot reach the data-parallel rendezvous store at 127.0.0.1:29511" -- \
  env MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 "$SLUICE" train run.dir="$tmp/joined" pipeline.mode=async \
  pipeline.processes=true pipeline.rank_timeout_seconds=1 --join=reward
expect slurm-bad-rank 2 "SLURM_PROCID='x'" -- env SLURM_PROCID=x SLURM_NTASKS=2 "$SLUICE" train run.dir="$tmp/ranked"
expect torchrun-bad-attempt 2 "TORCHELASTIC_RESTART_COUNT='x'" -- \
  env RANK=0 WORLD_SIZE=1 TORCHELASTIC_RESTART_COUNT=x "$SLUICE" train run.dir="$tmp/ranked"
# A Qwen3-architecture model with that tokenizer: generate encodes and decodes with it.
expect init-qwen3 0 "wrote tiny model" -- "$SLUICE" init --preset tiny --model-type qwen3 --tokenizer "$qwen" --out "$tmp/q3"
grep -q '"model_type": "qwen3"' "$tmp/q3/config.json" && [ -f "$tmp/q3/tokenizer.json" ] \
  || { echo "FAIL init-qwen3: config or tokenizer missing"; failures=$((failures + 1)); }
expect generate-qwen3 0 "user\nHello" -- "$SLUICE" generate --model "$tmp/q3" --prompt "<|im_start|>user
Hello<|im_end|>" --num-samples 1 --max-new-tokens 4 --threads 1
# Training that model on math word problems in the GSM8K layout with the README's recipe
# (configs/gsm8k.yaml, cut to a few tiny steps), roles as processes: prompts are encoded and answers
# decoded with its tokenizer.json, which every checkpoint and the final model keep.
for i in $(seq 1 40); do
  echo "{\"question\": \"Tom has $i apples and buys $i more. How many now?\", \"answer\": \"$i+$i = <<$i+$i=$((2 * i))>>$((2 * i))\\n#### $((2 * i))\"}"
done > "$tmp/q.jsonl"
expect train-qwen3 0 "held-out accuracy" -- "$SLUICE" train --config="$(dirname "$0")/../configs/gsm8k.yaml" \
  model.path="$tmp/q3" task.jsonl.train_path="$tmp/q.jsonl" \
  rl.steps=2 rl.prompts_per_step=2 rl.group_size=2 rl.max_new_tokens=4 rl.slots=8 eval.size=4 eval.max_new_tokens=4 \
  run.threads=1 run.progress=lines pipeline.mode=async pipeline.processes=true pipeline.rollout_threads=1 \
  pipeline.trainer_threads=1 checkpoint.interval=1 run.dir="$tmp/q3run"
cmp -s "$tmp/q3run/final/tokenizer.json" "$qwen/tokenizer.json" && cmp -s "$tmp/q3run/checkpoints/step_000002/tokenizer.json" "$qwen/tokenizer.json" \
  || { echo "FAIL train-qwen3: the tokenizer was not kept with the model"; failures=$((failures + 1)); }
# An agent run on a real tokenizer goes through its chat template (the Qwen3 one here, a turn of
# the calculator environment); a model whose tokenizer.json has no chat template is refused before
# the run, naming the directory.
expect agent-qwen3 0 "held-out accuracy" -- "$SLUICE" train "${small[@]}" model.path="$tmp/q3" run.dir="$tmp/q3agent" \
  agent.env=calculator rl.steps=1
/usr/bin/python3 - "$tmp/q3agent/trajectories.jsonl" <<'PY' && echo "ok   agent-qwen3 trajectories" || { echo "FAIL agent-qwen3 trajectories"; failures=$((failures + 1)); }
import json, sys
t = json.loads(open(sys.argv[1]).readline())
assert t["tokens"][0] == 151644, t["tokens"][:5]  # <|im_start|>: the chat template's
assert [turn["role"] for turn in t["turns"]][:2] == ["user", "assistant"], t["turns"]
PY
# The real-weights agent recipe (configs/agent_python.yaml, cut to one tiny step) on that model: its
# template renders the python tool into the opening, and the sandbox runs before the run starts.
expect agent-recipe 0 "held-out accuracy" -- "$SLUICE" train --config="$(dirname "$0")/../configs/agent_python.yaml" \
  model.path="$tmp/q3" task.jsonl.train_path="$tmp/q.jsonl" model.device=cpu rl.dynamic_sampling=false \
  rl.steps=1 rl.prompts_per_step=2 rl.group_size=2 rl.max_new_tokens=4 rl.slots=8 eval.size=2 eval.max_new_tokens=4 \
  trainer.micro_batch_tokens=4096 run.threads=1 run.progress=lines pipeline.processes=true pipeline.rollout_threads=1 \
  pipeline.trainer_threads=1 run.dir="$tmp/q3recipe"
/usr/bin/python3 - "$tmp/q3recipe/trajectories.jsonl" <<'PY' && echo "ok   agent-recipe trajectories" || { echo "FAIL agent-recipe trajectories"; failures=$((failures + 1)); }
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert len(lines) == 4, len(lines)  # 2 prompts x 2 trajectories
opening = lines[0]["turns"][0]
assert opening["role"] in ("system", "user"), opening
assert lines[0]["tokens"][0] == 151644, lines[0]["tokens"][:5]  # <|im_start|>
PY
/usr/bin/python3 -c 'import json,sys; t=json.loads(open(sys.argv[1]).readline()); print(json.dumps(t["tokens"][:t["turns"][1]["start"]]))' \
  "$tmp/q3recipe/trajectories.jsonl" | "$SLUICE" tokenize --model="$tmp/q3" --decode | grep -q '\\"name\\": \\"python\\"' \
  && echo "ok   agent-recipe: the opening offers the python tool" \
  || { echo "FAIL agent-recipe: the python tool is not in the opening"; failures=$((failures + 1)); }
cp -r "$tmp/q3" "$tmp/q3-no-template" && rm "$tmp/q3-no-template/tokenizer_config.json"
expect agent-no-template 1 "has a tokenizer.json but no chat template" -- "$SLUICE" train "${small[@]}" \
  model.path="$tmp/q3-no-template" run.dir="$tmp/q3agent2" agent.env=calculator
# A tokenizer.json that does not fit the model's vocabulary is refused before generating.
cp "$qwen/tokenizer.json" "$tmp/m/tokenizer.json"
expect tokenizer-mismatch 2 "does not belong to this model" -- "$SLUICE" generate --model "$tmp/m" --max-new-tokens 2
rm "$tmp/m/tokenizer.json"

# docs/config.md's table is what `sluice train --help-config` prints.
if diff <("$SLUICE" train --help-config) <(grep '^|' "$(dirname "$0")/../docs/config.md") > "$tmp/config.diff"; then
  echo "ok   help-config is docs/config.md's table"
else
  echo "FAIL docs/config.md's table differs from sluice train --help-config:"; head -6 "$tmp/config.diff"
  failures=$((failures + 1))
fi
expect bad-mode 2 "pipeline.mode" -- "$SLUICE" train pipeline.mode=fast
expect stop-on-stall-without-limit 2 "pipeline.stop_on_stall: needs pipeline.stall_seconds > 0" -- \
  "$SLUICE" train pipeline.processes=true pipeline.stall_seconds=0 pipeline.stop_on_stall=true
expect eval-needs-model 2 "--model is required" -- "$SLUICE" eval
expect unknown-key 2 "trainer.lr" -- "$SLUICE" train trainer.lrr=1
expect bad-type 2 "rl.steps" -- "$SLUICE" train rl.steps=many
expect bad-enum 2 "token-mean" -- "$SLUICE" train trainer.loss_agg=mean
expect group-of-one 2 "rl.group_size" -- "$SLUICE" train "${small[@]}" run.dir="$tmp/g1" rl.group_size=1
expect huge-batch 2 "answers per step" -- "$SLUICE" train "${small[@]}" run.dir="$tmp/g2" rl.prompts_per_step=1000000 rl.group_size=100000
expect missing-config 2 "nowhere.yaml" -- "$SLUICE" train --config="$tmp/nowhere.yaml"
expect config-is-a-directory 2 "is a directory, not a YAML file" -- "$SLUICE" train --config="$tmp"
printf 'trainer:\n  lr: [1, 2]\n' > "$tmp/bad.yaml"
expect yaml-sequence 2 "bad.yaml:2" -- "$SLUICE" train --config="$tmp/bad.yaml"
printf '{"prompt": "1+1=", "answer": "2"}\n{"prompt": 3}\n' > "$tmp/bad.jsonl"
expect jsonl-line 2 "bad.jsonl:2" -- "$SLUICE" train "${small[@]}" run.dir="$tmp/j" task.name=jsonl task.jsonl.train_path="$tmp/bad.jsonl"
{ printf '{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=", "answer": "4"}\n{"prompt": "'
  head -c 1100 /dev/zero | tr '\0' 7; printf '", "answer": "7"}\n'
  for i in $(seq 9); do printf '{"prompt": "%d+1=", "answer": "%d"}\n' "$i" "$((i + 1))"; done; } > "$tmp/long.jsonl"
expect jsonl-long-prompt 2 "long.jsonl:3: the prompt is" -- "$SLUICE" train "${small[@]}" run.dir="$tmp/j" task.name=jsonl task.jsonl.train_path="$tmp/long.jsonl"
printf '\n\n' > "$tmp/empty.jsonl"
expect jsonl-empty 2 "empty.jsonl" -- "$SLUICE" train "${small[@]}" run.dir="$tmp/j" task.name=jsonl task.jsonl.train_path="$tmp/empty.jsonl"
expect jsonl-missing 2 "missing.jsonl" -- "$SLUICE" train "${small[@]}" run.dir="$tmp/j" task.name=jsonl task.jsonl.train_path="$tmp/missing.jsonl"

# sluice calibrate / simulate: a quick cost profile of the tiny model measured
# here, then every mode of a run predicted from it.
expect calibrate 0 "cost profile written" -- "$SLUICE" calibrate --quick --out="$tmp/tiny.profile.yaml" model.preset=tiny rl.slots=16 rl.max_new_tokens=64
# The run's own step (prompts x group, its answer lengths) is one of the trainer's batches.
expect calibrate-step 0 "the run's step is measured too: 16 samples, answers of median 8 and longest 64 tokens" -- \
  "$SLUICE" calibrate --quick --out="$tmp/tiny-step.profile.yaml" model.preset=tiny rl.slots=16 rl.max_new_tokens=64 \
  rl.prompts_per_step=4 rl.group_size=4 --median=8 --tail=8
for key in decode_row_s token_s publish_s; do
  grep -qE "^  $key: [0-9]" "$tmp/tiny.profile.yaml" || { echo "FAIL calibrate: no $key in the profile"; failures=$((failures + 1)); }
done
sim=("$SLUICE" simulate --profile="$tmp/tiny.profile.yaml" model.preset=tiny rl.slots=16 rl.max_new_tokens=64 rl.steps=6 rl.prompts_per_step=4 rl.group_size=4 --median=8 --tail=8)
expect simulate 0 "async" -- "${sim[@]}"
# Each mode's line, with its wall time, and the split modes' ratio to sync.
out=$("${sim[@]}" 2>&1)
for mode in sync one_step_off async; do
  grep -qE "^$mode +[0-9]+\.[0-9] " <<<"$out" || { echo "FAIL simulate: no $mode line"; echo "$out"; failures=$((failures + 1)); }
done
grep -qE "^async .* [0-9]+\.[0-9]{2}x " <<<"$out" || { echo "FAIL simulate: no async/sync ratio"; echo "$out"; failures=$((failures + 1)); }
expect simulate-other-model 2 "calibrate for this model" -- "$SLUICE" simulate --profile="$tmp/tiny.profile.yaml" model.preset=1m

# sluice plan: every policy on a small GPU cluster, the split searched, the
# fastest named, the page written; a published regime with its comparison;
# lengths fitted to this suite's own run.
plan=("$SLUICE" plan --gpus=16 --steps=3 --prompts=8 --group=4 --median=256 --max-response=2048 --max-rows=0 --html="$tmp/plan.html")
out=$("${plan[@]}" 2>&1) || { echo "FAIL plan: $out"; failures=$((failures + 1)); }
for policy in colocated_sync split_sync one_step_off partial_rollout inflight sluice; do
  grep -qE "^$policy +[0-9]+(:[0-9]+| both) +[0-9] gpu +(128|256|512) +[0-9]+\.[0-9] " <<<"$out" ||
    { echo "FAIL plan: no $policy line"; echo "$out"; failures=$((failures + 1)); }
done
grep -qE "^colocated_sync .* 1\.00x " <<<"$out" && grep -q "^fastest: .* decoding up to [0-9]* rows" <<<"$out" ||
  { echo "FAIL plan: no baseline ratio or recommendation"; echo "$out"; failures=$((failures + 1)); }
grep -q "<svg" "$tmp/plan.html" && grep -q "Throughput" "$tmp/plan.html" ||
  { echo "FAIL plan: no chart in the page"; failures=$((failures + 1)); }
expect plan-regime 0 "reported 2.77x (41.0 h / 14.8 h), simulated" -- "$SLUICE" plan --regime=areal-1.5b --steps=3 --prompts=64
expect plan-lengths 0 "answers over" -- "$SLUICE" plan --gpus=8 --steps=3 --prompts=8 --group=4 --max-response=512 --lengths-from="$tmp/run/metrics.jsonl"

[ "$failures" -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
