// What a training run measures: the held-out evaluation, one record per RL
// step (a line of run_dir/metrics.jsonl, docs/formats.md), the streaming
// modes' summary, and the progress callback that sees each record.
#ifndef SLUICE_PIPELINE_METRICS_H_
#define SLUICE_PIPELINE_METRICS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "sluice/trainer/types.h"

namespace sluice::pipeline {

struct EvalResult {
  double accuracy = 0;  // fraction of examples whose greedy answer has reward 1
  double mean_reward = 0;
  double mean_length = 0;  // response tokens (greedy)
  int64_t examples = 0;
  // Mean accuracy of eval.samples sampled answers per example; -1 if not measured.
  double sampled_accuracy = -1;
  // Answers whose reward function failed (reward.python) in this evaluation.
  int64_t reward_errors = 0;
  // Agent runs: the share of greedy trajectories that called a tool at
  // least once; -1 otherwise.
  double tool_use = -1;
  // Greedy accuracy by the example's difficulty (reward::Example::difficulty).
  struct Bucket {
    int64_t correct = 0, total = 0;
  };
  std::map<int, Bucket> by_difficulty;
  // "1:95% 2:60% ..." (empty when the task reports no difficulty).
  std::string DifficultySummary() const;
};

// One line of metrics.jsonl (also handed to the progress callback).
struct StepRecord {
  int64_t step = 0;  // RL step, 1-based
  int64_t total_steps = 0;
  double reward_mean = 0, accuracy = 0, response_len_mean = 0;
  int64_t response_len_max = 0;
  int64_t groups_kept = 0, samples_trained = 0;
  int64_t generated_tokens = 0;
  double gen_seconds = 0, train_seconds = 0, elapsed_seconds = 0;
  trainer::StepMetrics train;
  // Streaming modes: weight version trained with, staleness of the trained
  // samples (trainer version - version of each sample's first token), and how
  // long the trainer waited for data this step.
  int64_t version = 0;
  double staleness_mean = 0;
  int64_t staleness_max = 0;
  double token_staleness_mean = 0;
  double wait_seconds = 0;
  int64_t queue_ready = 0;  // rows waiting for the trainer when the step began
  // Streaming modes, over this step's wall interval (previous step's end to
  // this one's): tokens the rollout generated, and the fraction of the
  // interval each role was busy (rollout: decoding; trainer: training).
  int64_t rollout_tokens = 0;
  double rollout_busy = 0, trainer_busy = 0;
  // staleness_hist[k]: trained samples whose first token is k versions old.
  std::vector<int64_t> staleness_hist;
  // Prompt cursors consumed by the step (kept or dropped), read from the
  // rows the trainer took.
  std::vector<uint64_t> prompts;
  // Streaming modes: groups the hub delivered again after the trainer had
  // taken them, because their lease (pipeline.lease_seconds) ran out or a
  // trainer died holding them. Trained once regardless: a copy of a group
  // already trained is acked and dropped; one still waiting for its step
  // replaces the expired lease.
  int64_t duplicate_groups = 0;
  // Answers that got reward.error_reward because the Python reward failed on
  // them (reward.python: it raised, timed out, or returned no number), RL
  // rollouts and held-out evaluations together, since this process started
  // the run (reward::Task::score_errors); 0 with the built-in rewards.
  int64_t reward_errors = 0;
  // pipeline.trainer_ranks > 1, one entry per rank: the seconds its part of
  // the update took, of them in collectives (waiting for the others
  // included: a rank with more work makes the others wait), and the tokens
  // of its shard.
  std::vector<double> rank_train_seconds, rank_collective_seconds;
  std::vector<int64_t> rank_tokens;
  // pipeline.rollout_replicas > 1, one entry per replica: the tokens it
  // generated over the step's interval (they add up to rollout_tokens) and
  // the share of the interval it decoded.
  std::vector<int64_t> replica_tokens;
  std::vector<double> replica_busy;
  // Agent runs (agent.env set), over the step's trajectories (trained or
  // dropped with their group): model turns and tool calls per trajectory,
  // the share that called a tool at least once, the tool calls that could
  // not be read, and how many ended for each reason ("done", "max_turns", ...).
  bool agent = false;
  double agent_turns_mean = 0, agent_tool_calls_mean = 0, agent_tool_use = 0;
  int64_t agent_malformed_calls = 0;
  std::map<std::string, int64_t> agent_end_reasons;
  bool has_eval = false;
  EvalResult eval;
  std::string ToJson() const;
};

// Streaming modes: what a run's Train() measured (zeros in direct mode).
struct StreamSummary {
  double wall_seconds = 0;          // RL wall time
  double rollout_busy_seconds = 0;  // rollout steps with sequences running
  int64_t rollout_tokens = 0;       // tokens generated (including ones never trained)
  double rollout_occupancy = 0;     // mean share of the engine's slots decoding per decode step
  // pipeline.processes: the role processes' calls to the hub, and how many
  // of them came through its fast paths (shared-memory rings, direct TCP).
  int64_t hub_requests = 0, hub_ring_requests = 0, hub_direct_requests = 0;
};

// Progress of a run: `phase` is "sft" or "rl", `record` the step's (may be null).
using ProgressFn = std::function<void(const std::string& phase, int64_t done, int64_t total, const StepRecord* record)>;

}  // namespace sluice::pipeline

#endif  // SLUICE_PIPELINE_METRICS_H_
