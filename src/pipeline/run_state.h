// Private to sluice_pipeline: a training run's state, shared by the direct
// loop (run.cc) and the streaming modes over the TransferQueue
// (stream_train.cc, stream_roles.cc, the role objects, stream_launch.cc and
// launch_attempt.cc).
#ifndef SLUICE_PIPELINE_RUN_STATE_H_
#define SLUICE_PIPELINE_RUN_STATE_H_

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "agent_driver.h"
#include "generation.h"
#include "metrics_log.h"
#include "role_support.h"
#include "sluice/common/file_util.h"
#include "sluice/common/logging.h"
#include "sluice/common/random.h"
#include "sluice/model/hf_tokenizer.h"
#include "sluice/model/safetensors.h"
#include "sluice/model/tokenizer.h"
#include "sluice/model/weights.h"
#include "sluice/pipeline/evaluator.h"
#include "sluice/pipeline/run.h"
#include "sluice/trainer/trainer.h"

namespace sluice::pipeline {

namespace fs = std::filesystem;

// The cursor-th prompt of a seeded sequence of permutations of [0, n): each
// epoch visits every index once, in an order fixed by (seed, epoch).
inline uint64_t PermutedIndex(uint64_t seed, uint64_t cursor, uint64_t n) {
  if (n <= 1) return 0;
  const uint64_t epoch = cursor / n, pos = cursor % n;
  const uint64_t h = HashCombine(seed, epoch);
  uint64_t a = 1 + h % (n - 1);
  while (std::gcd(a, n) != 1) a = a % (n - 1) + 1;
  const uint64_t b = HashCombine(h, 1) % n;
  return static_cast<uint64_t>((static_cast<unsigned __int128>(a) * pos + b) % n);
}

constexpr uint64_t kSftSalt = 0x5f7;
constexpr uint64_t kShortcutSalt = 0x5c07;
constexpr uint64_t kToolCallSalt = 0x7ca11;

struct TrainingRun::State {
  std::shared_ptr<model::Transformer> policy;
  std::shared_ptr<model::Transformer> reference;
  std::shared_ptr<const reward::Task> task;
  RunOptions options;
  // RunOptions::devices resolved: the policy lives on trainer_device; the
  // streaming rollout serves a copy on rollout_device in rollout_dtype.
  torch::Device trainer_device{torch::kCPU};
  torch::Device rollout_device{torch::kCPU};
  torch::ScalarType rollout_dtype = torch::kFloat32;
  RunHooks hooks;
  std::shared_ptr<const model::Tokenizer> tokenizer;  // the model's (RunOptions::tokenizer_dir) or bytes
  model::PromptFormat prompt_format;                  // its chat template (RunOptions::prompts), or none
  std::unique_ptr<rollout::RolloutEngine> engine;
  std::unique_ptr<trainer::Trainer> trainer;
  // The trainer role's data-parallel ranks (pipeline.trainer_ranks > 1);
  // null with one. Ranks above 0 follow rank 0's steps and write nothing.
  std::shared_ptr<trainer::DataParallelGroup> data_parallel;
  bool follower() const { return data_parallel && data_parallel->rank() > 0; }
  std::unique_ptr<Evaluator> evaluator;
  rollout::PolicyVersion version = 0;
  int64_t step = 0;
  int64_t skipped_in_a_row = 0;  // updates skipped (gradient norm not finite) since the last applied one
  double elapsed_offset = 0;     // training seconds before this process (from the checkpoint)
  double elapsed_total = 0;      // elapsed_offset + this process's training time so far
  std::vector<StepRecord> history;
  StreamSummary stream_stats;
  // A role process started by a launcher: who holds the hub leases it takes
  // ("<process name>/<pid>"), so that the launcher can release them at once
  // when it sees the process die (tq::Controller::ReleaseHolder). Empty
  // otherwise.
  std::string lease_holder;

  Result<std::vector<model::TokenId>> EncodePrompt(const std::string& text) const {
    return pipeline::EncodePrompt(*tokenizer, text, prompt_format);
  }
  // The token that ends an answer: the tokenizer's, else the model config's (-1: none).
  model::TokenId EosId() const {
    return tokenizer->eos_id() >= 0 ? tokenizer->eos_id() : static_cast<model::TokenId>(policy->config().eos_token_id);
  }
  // SavePretrained, with the run's tokenizer files beside the weights.
  Status SaveModel(const std::string& dir) const {
    SLUICE_RETURN_IF_ERROR(model::SavePretrained(*policy, dir));
    return model::CopyTokenizerFiles(options.tokenizer_dir, dir);
  }

  // GRPO advantages over `samples` (grouped by group_id), then one trainer
  // update; fills rec->train and rec->samples_trained. No-op when empty.
  Status TrainOnGroups(std::vector<trainer::RolloutSample>& samples, StepRecord* rec) {
    if (samples.empty()) return Status::Ok();
    std::vector<double> rewards;
    std::vector<GroupId> group_ids;
    for (const auto& smp : samples) {
      rewards.push_back(smp.reward);
      group_ids.push_back(smp.group_id);
    }
    SLUICE_ASSIGN_OR_RETURN(auto adv, trainer::GroupAdvantages(rewards, group_ids, options.rl.divide_adv_by_std));
    for (size_t i = 0; i < samples.size(); ++i) samples[i].advantage = adv[i];
    if (options.agent.enabled() && !follower()) {
      SLUICE_RETURN_IF_ERROR(AppendTrajectories(options.run_dir, rec->step, samples));
    }
    const auto start = std::chrono::steady_clock::now();
    const double collective_before = data_parallel ? data_parallel->collective_seconds() : 0;
    SLUICE_ASSIGN_OR_RETURN(rec->train, trainer->RlStep(samples));
    if (data_parallel && data_parallel->size() > 1) {
      // Every rank's seconds and tokens, for rank 0's metrics line.
      const int64_t rank = data_parallel->rank(), ranks = data_parallel->size();
      std::vector<double> slots(static_cast<size_t>(3 * ranks), 0.0);
      slots[3 * rank] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      slots[3 * rank + 1] = data_parallel->collective_seconds() - collective_before;
      for (const auto& mini :
           trainer::DataParallelShard(samples.size(), options.rl.trainer.mini_batches, rank, ranks)) {
        for (size_t i : mini)
          slots[3 * rank + 2] += static_cast<double>(samples[i].prompt.size() + samples[i].response.size());
      }
      SLUICE_RETURN_IF_ERROR(data_parallel->AllReduce(slots, trainer::DataParallelGroup::Reduce::kSum));
      rec->rank_train_seconds.clear(), rec->rank_collective_seconds.clear(), rec->rank_tokens.clear();
      for (int64_t r = 0; r < ranks; ++r) {
        rec->rank_train_seconds.push_back(slots[3 * r]);
        rec->rank_collective_seconds.push_back(slots[3 * r + 1]);
        rec->rank_tokens.push_back(static_cast<int64_t>(slots[3 * r + 2]));
      }
    }
    rec->samples_trained = static_cast<int64_t>(samples.size());
    // The trainer skips an update whose gradient is not finite (one bad
    // batch); a run where that keeps happening trains nothing, so it stops.
    skipped_in_a_row = std::isfinite(rec->train.grad_norm) ? 0 : skipped_in_a_row + 1;
    const int64_t limit = std::min<int64_t>(3, std::max<int64_t>(options.rl.steps, 1));
    if (skipped_in_a_row >= limit) {
      return Status::DataLoss("RL step " + std::to_string(rec->step) + ": the gradient norm was not finite in " +
                              std::to_string(skipped_in_a_row) +
                              " updates in a row, so each was skipped and the run trains nothing: the policy "
                              "weights or the loss hold NaN or inf (a damaged checkpoint, a learning rate too high?)");
    }
    return Status::Ok();
  }

  // The end of an RL step (s.step already counts it): held-out evaluation
  // when due, the metrics line, the history, a checkpoint when due, progress.
  Status FinishStep(StepRecord& rec, MetricsLog& metrics, const std::function<Result<EvalResult>()>& evaluate,
                    const ProgressFn& progress) {
    const EvalOptions& ev = options.eval;
    if ((ev.interval > 0 && step % ev.interval == 0) || step == options.rl.steps) {
      SLUICE_ASSIGN_OR_RETURN(rec.eval, evaluate());
      rec.has_eval = true;
      // reward_errors counts every failure so far; the evaluation's came
      // after it was taken (the final evaluation's were never written).
      rec.reward_errors += rec.eval.reward_errors;
    }
    SLUICE_RETURN_IF_ERROR(metrics.Append(rec.ToJson()));
    history.push_back(rec);
    if ((options.checkpoint_interval > 0 && step % options.checkpoint_interval == 0) || step == options.rl.steps) {
      SLUICE_RETURN_IF_ERROR(SaveCheckpoint());
    }
    if (progress) progress("rl", step, options.rl.steps, &rec);
    return Status::Ok();
  }

  fs::path CheckpointRoot() const { return fs::path(options.run_dir) / "checkpoints"; }

  // Generation of `requests` on the current weights.
  // The direct loop's rollout of an agent run: each request (its id, prompt
  // and sampling) a trajectory on the run's engine, against an environment
  // opened on its example's row (examples[id / group_size]); returns each
  // as an answer (in request order), its summary and its reward (the
  // environment's, or the task's on the model's last turn). (run.cc)
  Result<std::tuple<std::vector<rollout::GenerationResult>, std::vector<std::string>, std::vector<double>>>
  AgentRollouts(const std::vector<reward::Example>& examples, const std::vector<rollout::GenerationRequest>& requests);

  Result<std::vector<rollout::GenerationResult>> Generate(std::vector<rollout::GenerationRequest> requests) {
    return GenerateAll(*engine, std::move(requests));
  }

  Status SaveCheckpoint() {
    char name[32];
    std::snprintf(name, sizeof(name), "step_%06lld", static_cast<long long>(step));
    fs::path dir = CheckpointRoot() / name;
    SLUICE_RETURN_IF_ERROR(SaveModel(dir.string()));
    SLUICE_RETURN_IF_ERROR(
        model::WriteSafetensorsFile((dir / "optimizer.safetensors").string(), trainer->OptimizerState()));
    nlohmann::json state = {{"step", step},
                            {"version", version},
                            {"optimizer_steps", trainer->optimizer_steps()},
                            {"seed", options.seed},
                            {"elapsed_seconds", elapsed_total}};
    SLUICE_RETURN_IF_ERROR(WriteFileAtomically((dir / "trainer_state.json").string(), state.dump(2) + "\n"));
    // The pointer moves last: a crash mid-save leaves the previous checkpoint current.
    return WriteFileAtomically((CheckpointRoot() / "latest").string(), std::string(name) + "\n");
  }

  // A resumed run must build the model it was started with: a checkpoint of
  // another shape is refused naming the keys that differ.
  Status CheckResumedModel(const std::string& dir) const {
    Status same = model::CheckSameArchitecture(dir, policy->config());
    if (same.ok() || same.code() != StatusCode::kFailedPrecondition) return same;
    return Status::FailedPrecondition(
        "cannot resume: " + same.message() + "; resume with the model settings the run was started with (" +
        (fs::path(options.run_dir) / "config.yaml").string() + ") or choose another run.dir");
  }

  Status LoadLatestCheckpoint(bool* loaded) {
    *loaded = false;
    std::ifstream latest(CheckpointRoot() / "latest");
    if (!latest) return Status::Ok();
    std::string name;
    std::getline(latest, name);
    fs::path dir = CheckpointRoot() / name;
    std::ifstream state_file(dir / "trainer_state.json");
    nlohmann::json state = nlohmann::json::parse(state_file, nullptr, /*allow_exceptions=*/false);
    const fs::path state_path = dir / "trainer_state.json";
    if (state.is_discarded() || !state.is_object())
      return Status::DataLoss(state_path.string() + ": missing or not JSON");
    for (const char* key : {"step", "version", "optimizer_steps", "seed"}) {
      if (!state.contains(key) || !state[key].is_number_integer()) {
        return Status::DataLoss(state_path.string() + ": '" + key + "' is missing or not an integer");
      }
    }
    if (state["seed"].get<uint64_t>() != options.seed) {
      return Status::FailedPrecondition("checkpoint " + dir.string() + " was written with seed " +
                                        std::to_string(state["seed"].get<uint64_t>()) + ", this run uses " +
                                        std::to_string(options.seed));
    }
    SLUICE_RETURN_IF_ERROR(CheckResumedModel(dir.string()));
    // Both loaders check everything before copying anything, and the weights
    // are checked against the optimizer state's names first, so a bad
    // checkpoint leaves the run as it was.
    SLUICE_ASSIGN_OR_RETURN(TensorMap weights, model::LoadCheckpointTensors(dir.string()));
    SLUICE_ASSIGN_OR_RETURN(auto opt, model::ReadSafetensorsFile((dir / "optimizer.safetensors").string()));
    for (const auto& p : policy->named_parameters()) {
      if (!weights.count(p.key()) || !opt.tensors.count(p.key() + ".exp_avg")) {
        return Status::DataLoss(dir.string() + ": checkpoint lacks '" + p.key() + "' or its optimizer state");
      }
    }
    SLUICE_RETURN_IF_ERROR(model::LoadWeights(*policy, weights));
    SLUICE_RETURN_IF_ERROR(trainer->LoadOptimizerState(opt.tensors, state["optimizer_steps"].get<int64_t>()));
    step = state["step"].get<int64_t>();
    version = state["version"].get<int64_t>();
    elapsed_offset = elapsed_total = state.value("elapsed_seconds", 0.0);
    // Keep the metrics (and trajectories) of the steps the checkpoint covers;
    // drop any later lines.
    history.clear();
    SLUICE_RETURN_IF_ERROR(MetricsLog::KeepStepsThrough(options.run_dir, "metrics.jsonl", step));
    SLUICE_RETURN_IF_ERROR(MetricsLog::KeepStepsThrough(options.run_dir, kTrajectoriesFile, step));
    *loaded = true;
    SLUICE_LOG(INFO) << "resumed from " << dir.string() << " at step " << step;
    return Status::Ok();
  }
};

}  // namespace sluice::pipeline

#endif  // SLUICE_PIPELINE_RUN_STATE_H_
