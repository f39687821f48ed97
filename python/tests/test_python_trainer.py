"""The Python trainer example (python/examples/grpo_trainer.py) as the trainer
role of real `sluice train` runs (pipeline.trainer_command): the launcher,
the C++ rollout and reward processes and the example are each a process,
joined by the hub and the shared-memory weight store. Then the ways a
trainer command can fail, each ending the run with an error that says so.

The `sluice` binary comes from $SLUICE_BINARY (CTest sets it), else from
build/release/apps/ of this checkout.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "python" / "examples" / "grpo_trainer.py"

# A tiny untrained model, short answers, the roles as processes.
BASE = [
    "model.preset=tiny", "sft.steps=0", "rl.steps=4", "rl.prompts_per_step=3", "rl.group_size=4",
    "rl.max_new_tokens=8", "rl.dynamic_sampling=false", "eval.size=4", "eval.max_new_tokens=8", "eval.interval=0",
    "run.threads=1", "run.progress=lines", "pipeline.processes=true", "pipeline.rollout_threads=1",
    "pipeline.trainer_threads=1", "trainer.lr=0.01",
]

# Rewards with signal for an untrained model (so the weights move): whether
# the answer's length is even.
REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(len(solution_str) % 2 == 0)
'''


def sluice_binary() -> str:
    path = os.environ.get("SLUICE_BINARY") or str(REPO / "build" / "release" / "apps" / "sluice")
    if not os.access(path, os.X_OK):
        pytest.fail(f"no sluice binary at {path} (build it, or set SLUICE_BINARY)")
    return path


def train(run_dir: pathlib.Path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([sluice_binary(), "train", *BASE, f"run.dir={run_dir}", *overrides],
                          capture_output=True, text=True, timeout=240)


def example_command() -> str:
    return f"pipeline.trainer_command=OMP_NUM_THREADS=1 {sys.executable} {EXAMPLE}"


def leftover_segments(run: subprocess.CompletedProcess) -> list:
    """The run's weight store and role board, if still in /dev/shm."""
    store = [line.split("weight store ")[1].split(" ")[0] for line in run.stderr.splitlines() if "weight store run-" in line]
    return [name for name in os.listdir("/dev/shm") for s in store if s in name]


@pytest.mark.parametrize("mode", ["sync", "one_step_off", "async"])
def test_the_example_trains_every_group_once(tmp_path, mode):
    (tmp_path / "parity_reward.py").write_text(REWARD)
    run_dir = tmp_path / "run"
    run = train(run_dir, f"pipeline.mode={mode}", "pipeline.max_staleness=2", example_command(),
                f"reward.python={tmp_path / 'parity_reward.py'}:compute_score", "run.trace=true")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "the trainer command trained 4 steps and published version 4" in run.stderr
    assert "held-out accuracy" in run.stdout
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["version"] for r in rows] == [1, 2, 3, 4]
    # Every prompt trained exactly once, each step its own prompts.
    assert [p for r in rows for p in r["prompts"]] == list(range(12))
    # The example's PyTorch model computes what the C++ rollout sampled with:
    # answers generated wholly by the version being trained have the same
    # logprobs. (Step 1 trains on version 0's answers in every mode.)
    assert all(r["same_version_logprob_gap_max"] < 1e-3 for r in rows), rows
    assert rows[0]["rollout_logprob_gap_mean"] < 1e-5
    # The weights moved, and the run's final model is the last published version.
    init = (run_dir / "roles" / "init" / "model.safetensors").read_bytes()
    final = (run_dir / "final" / "model.safetensors").read_bytes()
    assert init != final
    assert (run_dir / "report.html").exists()
    assert leftover_segments(run) == []
    # run.trace: the example's spans join the C++ roles' in the run's trace.
    events = json.loads((run_dir / "trace.json").read_text())
    spans = [(e["pid"], e["name"]) for e in events if e["ph"] == "X"]
    assert spans.count((1, "train step")) == 4 and spans.count((1, "publish")) == 4, spans
    assert (2, "decode step") in spans and (3, "score") in spans
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names[1] == "trainer (python)", names


def test_a_trainer_that_stops_early_ends_the_run(tmp_path):
    # Exits 0 at once: the rollout would wait for its acks forever.
    run = train(tmp_path / "run", "pipeline.mode=one_step_off", "pipeline.trainer_command=true")
    assert run.returncode != 0
    assert "pipeline.trainer_command exited with status 0 having acked 0 of the run's 48 answers" in run.stderr, \
        run.stderr[-3000:]
    assert leftover_segments(run) == []


def test_a_failing_trainer_ends_the_run(tmp_path):
    run = train(tmp_path / "run", "pipeline.mode=async", "pipeline.trainer_command=echo dying >&2; exit 3")
    assert run.returncode != 0
    assert "dying" in run.stderr
    assert "child 'trainer'" in run.stderr and "exit status 3" in run.stderr, run.stderr[-3000:]


def test_a_trainer_that_acks_without_publishing_is_refused(tmp_path):
    # Takes and acks every group, never publishes: the run's result would be
    # the starting weights.
    script = tmp_path / "ack_only.py"
    script.write_text('''
import json, os
from sluice import transfer_queue
info = json.load(open(os.environ["SLUICE_RUN_INFO"]))
hub = transfer_queue.connect(info["hub"])
for _ in range((info["steps"] - info["start_step"]) * info["prompts_per_step"]):
    meta = hub.get_meta(info["columns"], info["group_size"], info["partition"], task_name=info["task"],
                        sampling_config={"group_size": info["group_size"]}, timeout=60)
    hub.ack(meta)
''')
    # One version per run: the rollout may generate every prompt on version 0.
    run = train(tmp_path / "run", "pipeline.mode=sync", "pipeline.sync_interval=4",
                f"pipeline.trainer_command={sys.executable} {script}")
    assert run.returncode != 0
    assert "exited 0 without publishing a weight version after 0" in run.stderr, run.stderr[-3000:]


def test_a_trainer_that_publishes_nan_weights_is_refused(tmp_path):
    # Acks every group, then publishes weights of NaN: the run ended with
    # exit 0, reported 0% -> 0% and wrote a final/ of NaN.
    script = tmp_path / "nan_weights.py"
    script.write_text('''
import json, os, torch
from sluice import checkpoint_engine, transfer_queue
info = json.load(open(os.environ["SLUICE_RUN_INFO"]))
reader = checkpoint_engine.ShmSubscriber(info["weight_store"], shm_prefix=info["shm_prefix"])
with reader.acquire() as weights:
    nan = {name: torch.full_like(t, float("nan")) for name, t in weights.items()}
    version = weights.version
publisher = checkpoint_engine.ShmPublisher(info["weight_store"], reader.layout, shm_prefix=info["shm_prefix"])
reader.close()
hub = transfer_queue.connect(info["hub"])
for _ in range((info["steps"] - info["start_step"]) * info["prompts_per_step"]):
    meta = hub.get_meta(info["columns"], info["group_size"], info["partition"], task_name=info["task"],
                        sampling_config={"group_size": info["group_size"]}, timeout=60)
    hub.ack(meta)
publisher.publish(nan, version + 1)
''')
    run = train(tmp_path / "run", "pipeline.mode=sync", "pipeline.sync_interval=4",
                f"pipeline.trainer_command={sys.executable} {script}")
    assert run.returncode != 0
    assert "pipeline.trainer_command published version 1: tensor" in run.stderr and "holds NaN or inf values" in \
        run.stderr, run.stderr[-3000:]
    assert not (tmp_path / "run" / "final" / "model.safetensors").exists()


@pytest.mark.parametrize("overrides,message", [
    (["pipeline.mode=async", "pipeline.processes=false", "pipeline.trainer_command=true"],
     "pipeline.trainer_command: needs pipeline.processes=true"),
    (["pipeline.mode=async", "pipeline.trainer_command='  '"], "pipeline.trainer_command: must be a command line"),
])
def test_bad_trainer_commands_are_refused_before_the_run(tmp_path, overrides, message):
    run = train(tmp_path / "run", *overrides)
    assert run.returncode == 2, run.stderr[-2000:]
    assert message in run.stderr
    assert not (tmp_path / "run").exists()
