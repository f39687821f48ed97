#!/bin/bash
# Every sluice plan figure in docs/simulator.md ("GPU clusters"): scripts/plan_regimes.sh > docs/plan_regimes.txt
S=${1:-build/release/apps/sluice}
echo "Raw output of every sluice plan figure in docs/simulator.md (\"GPU clusters\"), from scripts/plan_regimes.sh."; echo
run() { echo "\$ sluice plan $*"; $S plan "$@" 2>&1; echo; }
for r in seed-2k-16k areal-1.5b areal-7b verl-async-7b-32 verl-async-7b-64 verl-async-7b; do run --regime=$r; done
run --regime=verl-async-7b --colocated-train-slowdown=1
run --regime=verl-async-7b-32 --colocated-train-slowdown=1
run --regime=seed-2k-16k --prompts=32
run --regime=seed-2k-16k --gpus=256
run --regime=seed-2k-16k --gpus=128 --staleness=8
run --regime=seed-2k-16k --hardware=h20
run --regime=seed-2k-16k --model=qwen2.5-32b --train-mp=4
run --regime=seed-2k-16k --median=2048 --spread=1.3
