#!/usr/bin/python3
"""Trained exactly once, read from the hub's own record: the ack log a run's
hub keeps in RUN_DIR/hub_acks.jsonl (docs/pipeline.md, "The hub's ack log").

Usage: ack_ledger_check.py RUN_DIR STEPS PROMPTS_PER_STEP

Each attempt's hub starts the log with {"hub":"started","from_step":S}, S the
checkpoint step it resumed after; then the controller appends a line per ack.
The trainer acks a step's P groups (one lease a group) after publishing the
step's update and before the step's checkpoint, so of attempt a's train acks,
the first (S_{a+1} - S_a) * P are the steps that survived into the next
attempt (the last attempt: up to STEPS), and any after them were trained,
then rolled back by the restart. Checked:
  * every train ack is one whole group (its rows share one group id), and no
    group is acked twice within an attempt (the hub's leases allow neither);
  * the surviving acks of all attempts cover the prompts 0..STEPS*P-1 once;
  * they are, step by step, the prompts metrics.jsonl says each step trained
    (the trainer's own record agrees with the hub's);
  * the last attempt acked nothing past the run's last step, and whatever an
    attempt acked and lost to a restart was trained again later;
  * per trainer rank: each rank's record of the hub rows it trained at each
    step (RUN_DIR/trained_rows-rank<R>.jsonl, written before it trains; the
    last line of a step is the one that survived) is its own part of the rows
    the hub acked for that step: the ranks' parts never overlap and together
    are the rows of the step's kept groups (metrics.jsonl's groups_kept).
Prints one line and exits 0, or prints what is wrong and exits 1.
Mutations tried, each fails: a train ack dropped, one duplicated, one's group
changed; a rank's line for a step dropped; a row of rank 0's given to rank 1.
"""
import glob
import json
import re
import sys


def main(run_dir, steps, per_step):
    records = {r["step"]: r for r in map(json.loads, open(f"{run_dir}/metrics.jsonl"))}
    by_step = {step: r["prompts"] for step, r in records.items()}
    if sorted(by_step) != list(range(1, steps + 1)):
        return f"metrics.jsonl has steps {sorted(by_step)}, want 1..{steps}"
    attempts = []  # [from_step, [(group, [rows]) of each train ack, in order]]
    for n, line in enumerate(open(f"{run_dir}/hub_acks.jsonl"), 1):
        entry = json.loads(line)
        if entry.get("hub") == "started":
            attempts.append([entry["from_step"], []])
            continue
        if not attempts:
            return f"hub_acks.jsonl line {n}: an ack before any hub started"
        if entry["task"] != "train":
            continue
        groups = {g for _, g in entry["rows"]}
        if len(groups) != 1 or not entry["rows"]:
            return f"hub_acks.jsonl line {n}: a train ack of rows of groups {sorted(groups)}, not one whole group"
        attempts[-1][1].append((groups.pop(), [r for r, _ in entry["rows"]]))
    if not attempts:
        return "hub_acks.jsonl records no hub"
    surviving = []
    step_rows = {}  # step -> the rows the hub acked for it, in the attempt that survived
    for a, (start, acks) in enumerate(attempts):
        acked = [g for g, _ in acks]
        if len(set(acked)) != len(acked):
            return f"attempt {a}: a group acked twice: {acked}"
        end = attempts[a + 1][0] if a + 1 < len(attempts) else steps
        if end < start:
            return f"attempt {a + 1} resumed after step {end}, before attempt {a}'s start at {start}"
        kept = (end - start) * per_step
        if len(acked) < kept:
            return f"attempt {a} (steps {start + 1}..{end}) acked {len(acked)} groups, fewer than its {kept}"
        for i, step in enumerate(range(start + 1, end + 1)):
            step_rows[step] = {r for _, rows in acks[i * per_step:(i + 1) * per_step] for r in rows}
            hub = sorted(acked[i * per_step:(i + 1) * per_step])
            if hub != sorted(by_step[step]):
                return f"step {step}: the hub's acks say groups {hub}, metrics.jsonl says {sorted(by_step[step])}"
        lost = acked[kept:]
        if a + 1 == len(attempts) and lost:
            return f"the last attempt acked groups {lost} past step {steps}"
        later = {p for s in range(end + 1, steps + 1) for p in by_step[s]}
        if not set(lost) <= later:
            return f"attempt {a} acked groups {sorted(set(lost) - later)} that no later step trained"
        surviving += acked[:kept]
    if sorted(surviving) != list(range(steps * per_step)):
        return f"the hub's surviving acks cover {sorted(surviving)}, want 0..{steps * per_step - 1} once each"
    problem, ranks = check_ranks(run_dir, steps, records, step_rows)
    if problem:
        return problem
    print(f"ok   hub ack log: {len(surviving)} groups acked once across {len(attempts)} attempt(s); "
          f"{ranks} trainer rank(s), each step's rows split among them")
    return None


def check_ranks(run_dir, steps, metrics, step_rows):
    """Each trainer rank's trained rows against the hub's acked rows, step by step."""
    files = sorted(glob.glob(f"{run_dir}/trained_rows-rank*.jsonl"))
    if not files:
        return "no trainer rank recorded the rows it trained (trained_rows-rank*.jsonl)", 0
    parts = {}  # rank -> step -> rows (the last line of a step)
    for path in files:
        rank = int(re.search(r"rank(\d+)\.jsonl$", path).group(1))
        parts[rank] = {}
        for line in open(path):
            entry = json.loads(line)
            if entry["rank"] != rank:
                return f"{path}: a line of rank {entry['rank']}", 0
            parts[rank][entry["step"]] = entry["rows"]
    if sorted(parts) != list(range(len(parts))):
        return f"trainer ranks {sorted(parts)} recorded rows, not 0..{len(parts) - 1}", 0
    for step in range(1, steps + 1):
        union = set()
        for rank in sorted(parts):
            if step not in parts[rank]:
                return f"trainer rank {rank} recorded no rows for step {step}", 0
            rows = parts[rank][step]
            if len(set(rows)) != len(rows) or union & set(rows):
                return f"step {step}: trainer rank {rank}'s rows {rows} repeat a row, or another rank's", 0
            union |= set(rows)
        if not union <= step_rows[step]:
            return (f"step {step}: the trainer ranks trained rows {sorted(union - step_rows[step])} "
                    f"the hub did not ack for that step"), 0
        kept = metrics[step].get("groups_kept")
        group = len(step_rows[step]) // max(1, len(metrics[step]["prompts"]))
        if kept is not None and len(union) != kept * group:
            return (f"step {step}: the trainer ranks trained {len(union)} rows, the step kept {kept} groups "
                    f"of {group}"), 0
    return None, len(parts)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    problem = main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
    if problem:
        print(f"FAIL hub ack log: {problem}")
        sys.exit(1)
