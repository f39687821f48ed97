#!/usr/bin/env bash
# Convergence parity (docs/design.md, how performance is measured):
# does the async pipeline learn as well as the synchronous one, per sample
# trained? On the built-in arithmetic task, from one shared warm start:
#
# The default set (the headline study, docs/parity-lr5), every run at lr 5e-5:
#   sync-lr5             pipeline.mode=sync (rollout/reward/trainer over the hub, staleness 0)
#   async-s1/s2/s4-tis-lr5  pipeline.mode=async, max_staleness 1, 2, 4, token-level truncated IS
#   async-s4-nocorr-lr5  the largest staleness with the correction off (the ablation)
# The first study (docs/parity), at lr 1e-4:
#   sync, async-s1/2/4 (decoupled PPO), async-s4-nocorr, async-s2-tis, async-s4-tis
# Staleness-4 trials at lr 1e-4: async-s4-tis-cap1 (is_cap 1), async-s4-seqtis (sequence-level
# TIS), async-s4-tis-kl / sync-kl (KL anchor 0.05), async-s4-tis-kl2 (KL 0.2), async-s4-tis-lr5.
# bfloat16 rollout weights (docs/rollout.md), at lr 5e-5: sync-bf16-lr5, sync-bf16-tis-lr5, async-s2-tis-bf16-lr5,
# async-s2-nocorr-bf16-lr5 (against sync-lr5 and async-s2-tis-lr5).
# PPO against the behaviour policy (no recomputed proximal policy, no IS weight: the clipped ratio
# pi/pi_behav is the only correction), at lr 5e-5: async-s2-ppo-lr5, async-s4-ppo-lr5.
#
# each with SEEDS seeds (default 5; the seed drives prompt order, sampling and the held-out set; the warm
# start is shared so the curves start from the same policy). Then
# `sluice report --compare` writes the curves (held-out accuracy and reward vs
# samples trained, mean and seed range) and a table to OUT/.
#
#   scripts/convergence_parity.sh                  # defaults below
#   STEPS=40 SEEDS="0 1" OUT=/tmp/parity scripts/convergence_parity.sh
#   DOCS=docs/parity-lr5 scripts/convergence_parity.sh  # also copy the table and chart there
#
# Same cores for every run: each role gets ROLE_THREADS intra-op threads.
set -euo pipefail
cd "$(dirname "$0")/.."

SLUICE=${SLUICE:-build/release/apps/sluice}
CONFIG=${CONFIG:-configs/arithmetic.yaml}
OUT=${OUT:-runs/parity}
STEPS=${STEPS:-60}
SEEDS=${SEEDS:-"0 1 2 3 4"}
SFT_STEPS=${SFT_STEPS:-1500}
EVAL_SIZE=${EVAL_SIZE:-500}
EVAL_INTERVAL=${EVAL_INTERVAL:-10}
ROLE_THREADS=${ROLE_THREADS:-1}
# The headline study (docs/parity-lr5) at lr 5e-5; the first study (docs/parity) at the 1e-4 of the
# time: CONFIGS="sync async-s1 async-s2 async-s4 async-s4-nocorr async-s2-tis async-s4-tis"
CONFIGS=${CONFIGS:-"sync-lr5 async-s1-tis-lr5 async-s2-tis-lr5 async-s4-tis-lr5 async-s4-nocorr-lr5"}
DOCS=${DOCS:-}

[ -x "$SLUICE" ] || { echo "error: $SLUICE not built (./setup.sh build)" >&2; exit 1; }
mkdir -p "$OUT"
log() { printf '\033[1m[parity]\033[0m %s\n' "$*" >&2; }

# 1. One warm start shared by every run (skipped when already there).
BASE="$OUT/warm-start"
if [ ! -f "$BASE/final/config.json" ]; then
  log "warm start: $SFT_STEPS supervised steps -> $BASE/final"
  rm -rf "$BASE"  # an unfinished one
  "$SLUICE" train --config="$CONFIG" run.dir="$BASE" run.progress=lines sft.steps="$SFT_STEPS" rl.steps=0 \
    eval.size="$EVAL_SIZE" >/dev/null
fi

overrides_for() {
  case "$1" in
    sync) echo "pipeline.mode=sync" ;;
    sync-kl) echo "pipeline.mode=sync trainer.kl_coef=0.05" ;;
    async-s1) echo "pipeline.mode=async pipeline.max_staleness=1 trainer.off_policy_correction=decoupled" ;;
    async-s2) echo "pipeline.mode=async pipeline.max_staleness=2 trainer.off_policy_correction=decoupled" ;;
    async-s4) echo "pipeline.mode=async pipeline.max_staleness=4 trainer.off_policy_correction=decoupled" ;;
    async-s4-nocorr) echo "pipeline.mode=async pipeline.max_staleness=4 trainer.off_policy_correction=none" ;;
    async-s2-tis) echo "pipeline.mode=async pipeline.max_staleness=2 trainer.off_policy_correction=tis" ;;
    async-s4-tis) echo "pipeline.mode=async pipeline.max_staleness=4 trainer.off_policy_correction=tis" ;;
    async-s4-tis-cap1) echo "pipeline.mode=async pipeline.max_staleness=4 trainer.off_policy_correction=tis trainer.is_cap=1" ;;
    async-s4-seqtis) echo "pipeline.mode=async pipeline.max_staleness=4 trainer.off_policy_correction=seq-tis" ;;
    async-s4-tis-kl) echo "pipeline.mode=async pipeline.max_staleness=4 trainer.off_policy_correction=tis trainer.kl_coef=0.05" ;;
    async-s4-tis-lr5) echo "pipeline.mode=async pipeline.max_staleness=4 trainer.off_policy_correction=tis trainer.lr=5e-5" ;;
    sync-lr5) echo "pipeline.mode=sync trainer.lr=5e-5" ;;
    async-s1-tis-lr5) echo "pipeline.mode=async pipeline.max_staleness=1 trainer.off_policy_correction=tis trainer.lr=5e-5" ;;
    async-s2-tis-lr5) echo "pipeline.mode=async pipeline.max_staleness=2 trainer.off_policy_correction=tis trainer.lr=5e-5" ;;
    async-s4-nocorr-lr5) echo "pipeline.mode=async pipeline.max_staleness=4 trainer.off_policy_correction=none trainer.lr=5e-5" ;;
    sync-bf16-lr5) echo "pipeline.mode=sync trainer.lr=5e-5 pipeline.rollout_dtype=bfloat16" ;;
    sync-bf16-tis-lr5) echo "pipeline.mode=sync trainer.lr=5e-5 pipeline.rollout_dtype=bfloat16 trainer.off_policy_correction=tis" ;;
    async-s2-tis-bf16-lr5) echo "pipeline.mode=async pipeline.max_staleness=2 trainer.off_policy_correction=tis trainer.lr=5e-5 pipeline.rollout_dtype=bfloat16" ;;
    async-s2-nocorr-bf16-lr5) echo "pipeline.mode=async pipeline.max_staleness=2 trainer.off_policy_correction=none trainer.lr=5e-5 pipeline.rollout_dtype=bfloat16" ;;
    async-s2-ppo-lr5) echo "pipeline.mode=async pipeline.max_staleness=2 trainer.recompute_old_logprobs=false trainer.off_policy_correction=none trainer.lr=5e-5" ;;
    async-s4-ppo-lr5) echo "pipeline.mode=async pipeline.max_staleness=4 trainer.recompute_old_logprobs=false trainer.off_policy_correction=none trainer.lr=5e-5" ;;
    async-s4-tis-kl2) echo "pipeline.mode=async pipeline.max_staleness=4 trainer.off_policy_correction=tis trainer.kl_coef=0.2" ;;
    *) echo "error: unknown configuration '$1'" >&2; exit 2 ;;
  esac
}

# 2. The RL runs (a finished run is kept: rerunning the script resumes the study).
compare_args=()
for config in $CONFIGS; do
  for seed in $SEEDS; do
    dir="$OUT/$config-seed$seed"
    if [ ! -f "$dir/final/config.json" ]; then
      rm -rf "$dir"
      log "$config seed $seed: $STEPS RL steps -> $dir"
      start=$(date +%s)
      # shellcheck disable=SC2046
      "$SLUICE" train --config="$CONFIG" run.dir="$dir" run.seed="$seed" run.progress=off \
        model.path="$BASE/final" sft.steps=0 rl.steps="$STEPS" \
        eval.size="$EVAL_SIZE" eval.interval="$EVAL_INTERVAL" checkpoint.interval=0 \
        pipeline.rollout_threads="$ROLE_THREADS" pipeline.trainer_threads="$ROLE_THREADS" \
        $(overrides_for "$config") >"$OUT/$config-seed$seed.log" 2>&1
      log "  done in $(( $(date +%s) - start )) s: $(grep 'held-out accuracy:' "$OUT/$config-seed$seed.log" || true)"
    fi
    compare_args+=("$config=$dir")
  done
done

# 3. Curves and table.
"$SLUICE" report --compare="$OUT" "${compare_args[@]}"
if [ -n "$DOCS" ]; then
  mkdir -p "$DOCS"
  cp "$OUT/comparison.md" "$OUT/comparison.html" "$DOCS/"
  log "copied the table and chart to $DOCS/"
fi
