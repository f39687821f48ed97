// What the pipeline benchmarks share (pipeline_bench, agent_bench): each
// mode's options on the same cores, and the lower bound's measurement of a
// workload's compute.
#ifndef SLUICE_BENCH_PIPELINE_MODES_H_
#define SLUICE_BENCH_PIPELINE_MODES_H_

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "sluice/common/status.h"
#include "sluice/launch/simulation.h"
#include "sluice/model/config.h"
#include "sluice/model/tokenizer.h"
#include "sluice/model/transformer.h"
#include "sluice/pipeline/options.h"
#include "sluice/reward/task.h"
#include "sluice/rollout/engine.h"
#include "sluice/trainer/losses.h"
#include "sluice/trainer/trainer.h"

namespace sluice::bench {

namespace pipeline = sluice::pipeline;
namespace model = sluice::model;
namespace rollout = sluice::rollout;

// The bound's two parts in core-seconds, measured alone on one thread: the
// trainer's (the workload's batches, answer i `train_lengths[i]` response
// tokens, trained as every mode packs them for `workers` micro-batch
// workers, no off-policy correction) and the rollout's (the
// `decode_lengths` tokens decoded at full occupancy, `slots` sequences in
// lockstep at the workload's mean context, one prefill per prompt). No mode
// can spend fewer core-seconds on either: more threads or processes at best
// keep a stage's core-seconds, and stages running at once only slow each
// other (pipeline_bench's file comment).
struct BoundParts {
  double train = 0, decode = 0;
};

inline Result<BoundParts> MeasureBound(const pipeline::RunOptions& base, const model::ModelConfig& config,
                                       const sluice::reward::Task& task, const std::vector<int32_t>& train_lengths,
                                       const std::vector<int32_t>& decode_lengths, int64_t slots, int32_t workers,
                                       uint64_t seed) {
  const int64_t P = base.rl.prompts_per_step, G = base.rl.group_size;
  const int64_t answers = static_cast<int64_t>(decode_lengths.size());
  BoundParts out;
  torch::set_num_threads(1);
  auto m = std::make_shared<model::Transformer>(config, seed);
  {
    sluice::trainer::TrainerOptions to = base.rl.trainer;
    to.loss.correction = sluice::trainer::OffPolicyCorrection::kNone;
    // The micro-batches every mode packs (for `workers` workers: sync's data
    // parallel workers, a split mode's own + lent ones), all computed on this
    // one thread: the second worker never runs.
    to.micro_batch_threads = workers;
    to.may_run = [](int32_t) { return false; };
    SLUICE_ASSIGN_OR_RETURN(auto trainer, sluice::trainer::Trainer::Create(m, nullptr, to));
    model::ByteTokenizer tok;
    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::uniform_int_distribution<int> byte(0, 255);
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t step = 0; step < base.rl.steps; ++step) {
      std::vector<sluice::trainer::RolloutSample> batch;
      std::vector<double> rewards;
      std::vector<sluice::GroupId> groups;
      for (int64_t k = 0; k < P; ++k) {
        const uint64_t cursor = static_cast<uint64_t>(step * P + k);
        SLUICE_ASSIGN_OR_RETURN(
            sluice::reward::Example ex,
            task.Get(sluice::reward::Split::kTrain, cursor % task.size(sluice::reward::Split::kTrain)));
        std::vector<model::TokenId> prompt = {tok.bos_id()};
        SLUICE_ASSIGN_OR_RETURN(const std::vector<model::TokenId> ids, tok.Encode(ex.prompt));
        prompt.insert(prompt.end(), ids.begin(), ids.end());
        for (int64_t g = 0; g < G; ++g) {
          sluice::trainer::RolloutSample smp;
          smp.id = cursor * static_cast<uint64_t>(G) + static_cast<uint64_t>(g);
          smp.group_id = static_cast<sluice::GroupId>(cursor);
          smp.prompt = prompt;
          const int32_t len = train_lengths.at(static_cast<size_t>(smp.id));
          for (int32_t i = 0; i < len; ++i) smp.response.push_back(byte(rng));
          smp.behavior_logprobs.assign(static_cast<size_t>(len), -5.0f);
          smp.versions.assign(static_cast<size_t>(len), 0);
          smp.reward = static_cast<double>(g % 2);
          rewards.push_back(smp.reward);
          groups.push_back(static_cast<sluice::GroupId>(cursor));
          batch.push_back(std::move(smp));
        }
      }
      SLUICE_ASSIGN_OR_RETURN(auto adv, sluice::trainer::GroupAdvantages(rewards, groups, base.rl.divide_adv_by_std));
      for (size_t i = 0; i < batch.size(); ++i) batch[i].advantage = adv[i];
      SLUICE_RETURN_IF_ERROR(trainer->RlStep(batch).status());
    }
    out.train = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  // Decode: lockstep runs of K steps attend, on average, the same context as
  // the workload's tokens when K = sum(L^2) / sum(L) (a token at position j
  // attends prompt + j; the workload's mean j is sum(L^2) / (2 sum L)); enough
  // runs to decode the workload's tokens, their prefill taken out and the time
  // scaled to exactly that count (an answer's first token comes from the
  // prefill). Prefill: each prompt computed once (a group shares it), `slots`
  // prompts per pass.
  double sum_sq = 0;
  int64_t total_tokens = 0;
  for (int32_t len : decode_lengths) sum_sq += static_cast<double>(len) * len, total_tokens += len;
  const int32_t lock_steps =
      std::max<int32_t>(2, static_cast<int32_t>(std::lround(sum_sq / static_cast<double>(total_tokens))));
  const int64_t per_run = slots * lock_steps;
  const int64_t runs = (total_tokens + per_run - 1) / per_run;
  auto timed_lockstep = [&](int32_t decode_steps, int64_t reps) -> Result<double> {
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < reps; ++i) {
      SLUICE_RETURN_IF_ERROR(
          rollout::RunLockstepDecode({m, 0}, static_cast<int32_t>(slots), 16, decode_steps, 1).status());
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  SLUICE_ASSIGN_OR_RETURN(double prefill_pass, timed_lockstep(1, 8));  // prefill + sampling, no decode
  prefill_pass /= 8;
  SLUICE_ASSIGN_OR_RETURN(double full, timed_lockstep(lock_steps, runs));
  const double decode_only = std::max(0.0, full - static_cast<double>(runs) * prefill_pass) *
                             static_cast<double>(total_tokens - answers) /
                             static_cast<double>(runs * (per_run - slots));
  const double prefill_all = prefill_pass * static_cast<double>(answers / G) / static_cast<double>(slots);
  out.decode = decode_only + prefill_all;
  return out;
}

// A mode's options: every mode gets the same cores (see the file comment).
// OK when `o`'s roles never keep more threads busy than `cores`; Internal
// naming the mode's budget otherwise (every mode gets the same cores).
inline Status CheckThreadBudget(const pipeline::RunOptions& o, int32_t cores) {
  const pipeline::ThreadBudget budget = o.Threads(cores);
  if (budget.max_busy <= cores) return Status::Ok();
  return Status::Internal(pipeline::PipelineModeName(o.pipeline.mode) + " would run " +
                          std::to_string(budget.max_busy) + " busy threads on " + std::to_string(cores) +
                          " cores: " + budget.ToString());
}

inline pipeline::RunOptions ModeOptions(const pipeline::RunOptions& base, pipeline::PipelineMode mode,
                                        sluice::trainer::OffPolicyCorrection correction, bool lend,
                                        const std::string& order, int64_t threads, int64_t rollout_threads,
                                        bool sync_dp) {
  const bool split = mode == pipeline::PipelineMode::kOneStepOff || mode == pipeline::PipelineMode::kAsync;
  pipeline::RunOptions o = base;
  o.pipeline.mode = mode;
  o.rl.trainer.loss.correction = split ? correction : sluice::trainer::OffPolicyCorrection::kNone;
  // As `sluice train` decides it (trainer.recompute_old_logprobs=auto): the
  // behaviour correction clips against the rollout's own logprobs, so the
  // trainer's recomputing pass is skipped.
  o.rl.trainer.recompute_old_logprobs = o.rl.trainer.loss.correction != sluice::trainer::OffPolicyCorrection::kBehavior;
  o.pipeline.lend_idle_cores = lend;
  o.pipeline.train_order = order == "prompt" ? pipeline::TrainOrder::kPrompt : pipeline::TrainOrder::kCompletion;
  sluice::launch::ShareCores(&o, static_cast<int32_t>(threads), static_cast<int32_t>(rollout_threads), sync_dp);
  return o;
}

}  // namespace sluice::bench

#endif  // SLUICE_BENCH_PIPELINE_MODES_H_
