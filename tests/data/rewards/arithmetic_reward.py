"""Reward functions for `sluice train reward.python=...` (tests/cli_test.sh), in verl's form.

compute_score is the arithmetic task's own rule written in Python: 1.0 when the text after the
last '#' is the answer, else 0.0. length_score adds a little for every character, so a run of an
untrained model still earns rewards above 0 (a test can see that this function scored them).
flaky_score raises on answers of odd length; eval_only_error raises on every
held-out answer (and scores the training ones as compute_score).

With SLUICE_TEST_REWARD_LOG set, each worker process appends to that file, when it imports this
module, which process it scores for (its parent's --role, or "launcher").
"""
import os


def _log_importer():
    path = os.environ.get("SLUICE_TEST_REWARD_LOG")
    if not path:
        return
    try:
        with open("/proc/%d/cmdline" % os.getppid(), "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        args = []
    role = "launcher"
    for arg in args:
        if arg.startswith(b"--role="):
            role = arg[len(b"--role="):].decode()
    with open(path, "a") as log:
        log.write(role + "\n")


_log_importer()


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if "#" not in solution_str:
        return 0.0
    return 1.0 if solution_str.rsplit("#", 1)[1].strip() == ground_truth else 0.0


def length_score(data_source, solution_str, ground_truth, extra_info=None):
    assert data_source == "arithmetic" and extra_info["split"] in ("train", "eval")
    return {"score": compute_score(data_source, solution_str, ground_truth) + 0.001 * (1 + len(solution_str))}


def eval_only_error(data_source, solution_str, ground_truth, extra_info=None):
    if extra_info["split"] == "eval":
        raise ValueError("no held-out answers here")
    return compute_score(data_source, solution_str, ground_truth)


def flaky_score(data_source, solution_str, ground_truth, extra_info=None):
    if len(solution_str) % 2 == 1:
        raise ValueError("odd length %d" % len(solution_str))
    return compute_score(data_source, solution_str, ground_truth)
