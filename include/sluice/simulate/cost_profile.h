// What each part of a run costs, in seconds on one thread (or one device):
// the simulator's cost model (docs/simulator.md). `sluice calibrate` measures
// one on this machine and writes it as YAML; a profile can also be written by
// hand or derived from hardware figures.
//
//   decode step   = decode_step_s + decode_row_s x rows
//                   + decode_context_s x (sum over rows of the tokens each attends)
//                   + max(memory, compute), a roofline term (0 in a CPU profile):
//                     memory  = memory_step_s + memory_context_s x attended
//                     compute = compute_row_s x rows + compute_context_s x attended
//   prefill       = prefill_prompt_s x prompts + prefill_token_s x their tokens
//                   (a group's G answers share one prompt's prefill)
//   micro-batch   = train_micro_batch_s + train_token_s x padded tokens
//                   + train_token_context_s x padded tokens x longest sample
//   trainer step  = train_step_s + its micro-batches (spread over the workers)
//                   + train_update_s per optimizer update (Layout::mini_batches);
//                   train_proximal_share of each micro-batch's cost is the
//                   pass before the update (recomputing the proximal and
//                   reference log-probabilities), which every micro-batch of
//                   the step goes through first, the workers meeting at its end
//   publish       = publish_s (the trainer); then weight_fill_s until the rollout
//                   can switch to it (its standby copy, in the background), and
//                   weight_switch_s (each rollout engine) to switch
//   reward        = reward_answer_s per answer (one scorer)
//
// Threads sharing a machine slow each other (memory bandwidth, caches), and
// not all work alike: with k of its `cores` threads busy, a rollout engine's work
// runs `Slowdown(kRollout, k)` times slower, from 1 alone to
// `rollout_slowdown` with every core busy (linear between; beyond the
// cores, time-shared), the trainer's likewise up to `trainer_slowdown`.
// cores = 0: every thread has its own hardware (a device per role), no
// slowdown.
//
// Thread safety: plain data and pure functions.
#ifndef SLUICE_SIMULATE_COST_PROFILE_H_
#define SLUICE_SIMULATE_COST_PROFILE_H_

#include <algorithm>
#include <string>

#include "sluice/common/status.h"

namespace sluice::simulate {

// The format this build writes; it reads 1 (no roofline keys), 2 (no
// proximal share) and 3.
inline constexpr int kCostProfileFormat = 3;
inline constexpr int kOldestCostProfileFormat = 1;

struct CostProfile {
  // What was measured, and where: `model` names the model's shape (a profile
  // is refused for another model), `device` and `threads` the hardware.
  std::string model;
  std::string device = "cpu";
  int64_t threads = 1;
  std::string measured_by;  // free text: the command and build that wrote it

  double decode_step_s = 0;
  double decode_row_s = 0;
  double decode_context_s = 0;
  // The roofline term of a decode step (GPU profiles, sluice/simulate/gpu.h):
  // streaming the weights once and each attended token's KV entries, against
  // the step's arithmetic; the step takes the longer.
  double memory_step_s = 0;
  double memory_context_s = 0;
  double compute_row_s = 0;
  double compute_context_s = 0;
  double prefill_prompt_s = 0;
  double prefill_token_s = 0;
  double train_step_s = 0;
  double train_micro_batch_s = 0;
  double train_token_s = 0;
  double train_token_context_s = 0;
  double train_update_s = 0;
  double train_proximal_share = 0;  // a fraction in [0, 0.95], not seconds
  double publish_s = 0;
  double weight_switch_s = 0;
  double weight_fill_s = 0;
  double reward_answer_s = 0;
  int64_t cores = 0;
  double rollout_slowdown = 1;
  double trainer_slowdown = 1;

  // InvalidArgument naming the first bad field (negative or not finite cost,
  // no model, threads < 1, cores < 0, a slowdown below 1).
  Status Validate() const;
  double DecodeStep(int64_t rows, double attended) const {
    if (rows <= 0) return 0.0;
    const double r = static_cast<double>(rows);
    return decode_step_s + decode_row_s * r + decode_context_s * attended +
           std::max(memory_step_s + memory_context_s * attended, compute_row_s * r + compute_context_s * attended);
  }
  double Prefill(int64_t prompts, int64_t tokens) const {
    return prefill_prompt_s * static_cast<double>(prompts) + prefill_token_s * static_cast<double>(tokens);
  }
  enum class Work { kRollout, kTrainer };
  double Slowdown(Work work, int64_t busy) const {
    const double all_busy = work == Work::kRollout ? rollout_slowdown : trainer_slowdown;
    if (cores <= 0 || busy <= 1) return 1.0;
    if (busy > cores) return all_busy * static_cast<double>(busy) / static_cast<double>(cores);
    if (cores == 1) return 1.0;
    return 1.0 + (all_busy - 1.0) * static_cast<double>(busy - 1) / static_cast<double>(cores - 1);
  }
  double MicroBatch(int64_t padded_tokens, int64_t longest) const {
    const double t = static_cast<double>(padded_tokens);
    return train_micro_batch_s + train_token_s * t + train_token_context_s * t * static_cast<double>(longest);
  }
};

// YAML, one key per field under `profile:`, `rollout:`, `trainer:`, `weights:`,
// `reward:` and `cpu:` (docs/simulator.md), with a format number.
std::string FormatCostProfile(const CostProfile& p);
// Errors: NotFound (no file), InvalidArgument naming the file, line and key
// (unknown key, wrong type, a format this build does not read, a bad value).
Result<CostProfile> LoadCostProfile(const std::string& path);
Result<CostProfile> ParseCostProfile(const std::string& yaml_text, const std::string& origin);

}  // namespace sluice::simulate

#endif  // SLUICE_SIMULATE_COST_PROFILE_H_
