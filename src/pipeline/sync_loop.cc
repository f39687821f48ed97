#include "sluice/pipeline/sync_loop.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "loop_state.h"
#include "sluice/common/file_util.h"
#include "sluice/common/logging.h"
#include "sluice/common/random.h"
#include "sluice/model/safetensors.h"
#include "sluice/model/weights.h"

namespace sluice::pipeline {

using nlohmann::json;

Status LoopOptions::Validate() const {
  auto bad = [](const std::string& key, const std::string& why) {
    return Status::InvalidArgument("option " + key + ": " + why);
  };
  if (run_dir.empty()) return bad("run.dir", "must be set");
  if (rl.steps < 0) return bad("rl.steps", "must be >= 0");
  if (rl.prompts_per_step < 1) return bad("rl.prompts_per_step", "must be >= 1");
  if (rl.group_size < 2) {
    return bad("rl.group_size", "must be >= 2: GRPO normalizes rewards within a group of answers to one prompt, got " +
                                    std::to_string(rl.group_size));
  }
  if (rl.rollout_slots < 1) return bad("rl.slots", "must be >= 1");
  SLUICE_RETURN_IF_ERROR(rl.sampling.Validate());
  SLUICE_RETURN_IF_ERROR(rl.trainer.Validate());
  const float sampled_temperature = rl.sampling.temperature > 0 ? rl.sampling.temperature : 1.0f;
  if (rl.trainer.temperature != sampled_temperature) {
    return bad("rl.trainer.temperature", "must equal the rollout temperature (" + std::to_string(sampled_temperature) +
                                             ") so trainer and rollout logprobs describe the same distribution");
  }
  if (sft.steps < 0) return bad("sft.steps", "must be >= 0");
  if (sft.batch_size < 1) return bad("sft.batch_size", "must be >= 1");
  if (!(sft.shortcut_fraction >= 0 && sft.shortcut_fraction <= 1))
    return bad("sft.shortcut_fraction", "must be in [0, 1]");
  if (eval.interval < 0) return bad("eval.interval", "must be >= 0");
  if (eval.size < 1) return bad("eval.size", "must be >= 1");
  if (eval.max_new_tokens < 1) return bad("eval.max_new_tokens", "must be >= 1");
  if (checkpoint_interval < 0) return bad("checkpoint.interval", "must be >= 0");
  if (pipeline.max_staleness < 0) return bad("pipeline.max_staleness", "must be >= 0");
  if (pipeline.sync_interval < 1) return bad("pipeline.sync_interval", "must be >= 1");
  if (pipeline.processes && pipeline.mode == PipelineMode::kDirect) {
    return bad("pipeline.processes", "needs a streaming mode (sync, one_step_off or async), not direct");
  }
  if (pipeline.rollout_engines < 1 || pipeline.rollout_engines > rl.rollout_slots) {
    return bad("pipeline.rollout_engines", "must be in [1, rl.rollout_slots]");
  }
  if (pipeline.rollout_threads < 0 || pipeline.trainer_threads < 0) {
    return bad("pipeline.rollout_threads/trainer_threads", "must be >= 0 (0: the process setting)");
  }
  if (pipeline.train_order == TrainOrder::kCompletion && pipeline.EffectiveMaxStaleness() > 0) {
    return bad("pipeline.train_order",
               "'completion' cannot keep pipeline.max_staleness in " + PipelineModeName(pipeline.mode) +
                   " mode (a long answer can be outlasted by any number of steps of short ones); use 'prompt'");
  }
  return Status::Ok();
}

ThreadBudget LoopOptions::Threads(int32_t process_threads) const {
  const PipelineOptions& po = pipeline;
  ThreadBudget b;
  const bool direct = po.mode == PipelineMode::kDirect;
  b.roles_alternate = direct || po.mode == PipelineMode::kSync;
  const int32_t rollout_threads = !direct && po.rollout_threads > 0 ? po.rollout_threads : process_threads;
  const int32_t trainer_threads = !direct && po.trainer_threads > 0 ? po.trainer_threads : process_threads;
  b.rollout_engines = direct ? 1 : std::max(1, po.rollout_engines);
  b.threads_per_engine = direct ? process_threads : std::max(1, rollout_threads / b.rollout_engines);
  if (po.Lending()) {
    b.trainer_workers = po.trainer_threads;
    b.lent_workers = po.rollout_threads;
  } else {
    b.trainer_workers = rl.trainer.micro_batch_threads;
  }
  b.threads_per_worker = b.trainer_workers + b.lent_workers > 1 ? 1 : trainer_threads;
  const int32_t rollout = b.rollout_engines * b.threads_per_engine, trainer = b.trainer_workers * b.threads_per_worker;
  b.max_busy = b.roles_alternate ? std::max(rollout, trainer + b.lent_workers) : rollout + trainer;
  return b;
}

std::string ThreadBudget::ToString() const {
  auto n = [](int32_t k, const char* what) { return std::to_string(k) + " " + what + (k == 1 ? "" : "s"); };
  std::string out = "rollout " + n(rollout_engines, "engine") + " x " + n(threads_per_engine, "thread") + ", trainer " +
                    n(trainer_workers, "worker") + " x " + n(threads_per_worker, "thread");
  if (lent_workers > 0) out += " + " + n(lent_workers, "worker") + " on the rollout's cores while it idles";
  out += roles_alternate ? " (roles alternate)" : " (roles overlap)";
  return out + ": at most " + std::to_string(max_busy) + " busy";
}

std::string StepRecord::ToJson() const {
  json j = {{"step", step},
            {"reward_mean", reward_mean},
            {"accuracy", accuracy},
            {"response_len_mean", response_len_mean},
            {"response_len_max", response_len_max},
            {"groups_kept", groups_kept},
            {"samples_trained", samples_trained},
            {"generated_tokens", generated_tokens},
            {"gen_seconds", gen_seconds},
            {"train_seconds", train_seconds},
            {"elapsed_seconds", elapsed_seconds}};
  j.update(MetricsJson(train));
  j.update({{"version", version},
            {"staleness_mean", staleness_mean},
            {"staleness_max", staleness_max},
            {"token_staleness_mean", token_staleness_mean},
            {"wait_seconds", wait_seconds},
            {"queue_ready", queue_ready}});
  if (duplicate_groups > 0) j["duplicate_groups"] = duplicate_groups;
  if (!prompts.empty()) j["prompts"] = prompts;
  if (!staleness_hist.empty()) {
    j.update({{"rollout_tokens", rollout_tokens},
              {"rollout_busy", rollout_busy},
              {"trainer_busy", trainer_busy},
              {"staleness_hist", staleness_hist}});
  }
  if (has_eval) {
    j["eval_accuracy"] = eval.accuracy;
    j["eval_reward"] = eval.mean_reward;
    j["eval_response_len"] = eval.mean_length;
    if (eval.sampled_accuracy >= 0) j["eval_sampled_accuracy"] = eval.sampled_accuracy;
  }
  return j.dump();
}

SyncLoop::SyncLoop(std::unique_ptr<State> state) : state_(std::move(state)) {}
SyncLoop::~SyncLoop() = default;

Result<std::unique_ptr<SyncLoop>> SyncLoop::Create(std::shared_ptr<model::Transformer> policy,
                                                   std::shared_ptr<const reward::Task> task,
                                                   const LoopOptions& options) {
  SLUICE_RETURN_IF_ERROR(options.Validate());
  if (!policy || !task) return Status::InvalidArgument("the loop needs a model and a task");
  auto s = std::make_unique<State>();
  if (policy->config().vocab_size < s->tokenizer.vocab_size()) {
    return Status::InvalidArgument("model vocab_size " + std::to_string(policy->config().vocab_size) +
                                   " is smaller than the byte tokenizer's " +
                                   std::to_string(s->tokenizer.vocab_size()));
  }
  if (task->size(reward::Split::kTrain) == 0)
    return Status::InvalidArgument("task '" + task->name() + "' has no train examples");
  if (task->size(reward::Split::kEval) == 0)
    return Status::InvalidArgument("task '" + task->name() + "' has no eval examples");
  s->policy = std::move(policy);
  s->task = std::move(task);
  s->options = options;
  std::error_code ec;
  fs::create_directories(options.run_dir, ec);
  if (ec) return Status::Unavailable(options.run_dir + ": cannot create run directory: " + ec.message());
  rollout::EngineOptions engine_options;
  engine_options.num_slots = options.rl.rollout_slots;
  engine_options.eos_token_id = s->tokenizer.eos_id();
  SLUICE_ASSIGN_OR_RETURN(s->engine,
                          rollout::RolloutEngine::Create(rollout::PolicySnapshot{s->policy, 0}, engine_options));
  State* raw = s.get();
  // Sync mode: the engine is idle while the trainer updates the shared model in
  // place; at the next step it serves the new version.
  s->engine->SetWeightSwapHook([raw](rollout::PolicyVersion current) -> std::optional<rollout::PolicySnapshot> {
    if (raw->version > current) return rollout::PolicySnapshot{raw->policy, raw->version};
    return std::nullopt;
  });
  return std::unique_ptr<SyncLoop>(new SyncLoop(std::move(s)));
}

Status SyncLoop::WarmStart(const ProgressFn& progress) {
  State& s = *state_;
  const SftOptions& sft = s.options.sft;
  if (sft.steps == 0) return Status::Ok();
  const fs::path out = fs::path(s.options.run_dir) / "sft";
  std::error_code ec;
  if (s.options.resume && fs::exists(out / "config.json", ec)) {
    SLUICE_ASSIGN_OR_RETURN(TensorMap weights, model::LoadCheckpointTensors(out.string()));
    SLUICE_LOG(INFO) << "warm start: reusing " << out.string();
    return model::LoadWeights(*s.policy, weights);
  }
  if (!s.task->has_solutions()) {
    return Status::FailedPrecondition("sft.steps > 0 but task '" + s.task->name() + "' provides no solutions");
  }
  trainer::TrainerOptions topt = s.options.rl.trainer;
  topt.optimizer = sft.optimizer;
  topt.temperature = 1.0f;
  topt.loss.kl_coef = 0.0;  // plain cross-entropy: no reference needed
  SLUICE_ASSIGN_OR_RETURN(auto sft_trainer, trainer::Trainer::Create(s.policy, nullptr, topt));
  const uint64_t n = s.task->size(reward::Split::kTrain);
  for (int64_t step = 0; step < sft.steps; ++step) {
    std::vector<trainer::SftExample> batch;
    for (int64_t i = 0; i < sft.batch_size; ++i) {
      const uint64_t cursor = static_cast<uint64_t>(step * sft.batch_size + i);
      SLUICE_ASSIGN_OR_RETURN(reward::Example ex,
                              s.task->Get(reward::Split::kTrain, PermutedIndex(s.options.seed ^ kSftSalt, cursor, n)));
      if (ex.solution.empty()) continue;
      const bool shortcut = sft.shortcut_fraction > 0 &&
                            UnitInterval(HashCombine(s.options.seed ^ kShortcutSalt, cursor)) < sft.shortcut_fraction;
      const std::string target = shortcut ? std::string(1, reward::kAnswerMarker) + ex.answer : ex.solution;
      trainer::SftExample e{s.EncodePrompt(ex.prompt), s.tokenizer.Encode(target)};
      e.target.push_back(s.tokenizer.eos_id());
      batch.push_back(std::move(e));
    }
    if (batch.empty()) continue;
    SLUICE_ASSIGN_OR_RETURN(trainer::StepMetrics m, sft_trainer->SftStep(batch));
    if (progress) {
      StepRecord r;
      r.step = step + 1;
      r.total_steps = sft.steps;
      r.train = m;
      progress("sft", step + 1, sft.steps, &r);
    }
  }
  return model::SavePretrained(*s.policy, out.string());
}

std::string EvalResult::DifficultySummary() const {
  std::string out;
  for (const auto& [difficulty, bucket] : by_difficulty) {
    if (difficulty <= 0 || bucket.total == 0) continue;
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%s%d:%.0f%%(%lld)", out.empty() ? "" : " ", difficulty,
                  100.0 * static_cast<double>(bucket.correct) / static_cast<double>(bucket.total),
                  static_cast<long long>(bucket.total));
    out += buf;
  }
  return out;
}

Result<EvalResult> SyncLoop::Evaluate() {
  State& s = *state_;
  const int64_t n = std::min<int64_t>(s.options.eval.size, static_cast<int64_t>(s.task->size(reward::Split::kEval)));
  const int64_t samples = s.options.eval.samples;
  std::vector<reward::Example> examples;
  std::vector<rollout::GenerationRequest> requests;
  for (int64_t i = 0; i < n; ++i) {
    SLUICE_ASSIGN_OR_RETURN(reward::Example ex, s.task->Get(reward::Split::kEval, static_cast<uint64_t>(i)));
    rollout::GenerationRequest r;
    r.prompt = s.EncodePrompt(ex.prompt);
    // Request i * (samples + 1) is the greedy answer, the next `samples` are sampled.
    for (int64_t k = 0; k <= samples; ++k) {
      r.id = static_cast<uint64_t>(i * (samples + 1) + k);
      if (k == 0) {
        r.sampling.temperature = 0.0f;
      } else {
        r.sampling = s.options.rl.sampling;
        r.sampling.seed = HashCombine(HashCombine(s.options.seed, 0xe7a1), r.id);
      }
      r.sampling.max_new_tokens = s.options.eval.max_new_tokens;
      requests.push_back(r);
    }
    examples.push_back(std::move(ex));
  }
  SLUICE_ASSIGN_OR_RETURN(auto results, s.Generate(std::move(requests)));
  EvalResult e;
  e.examples = n;
  double sampled_correct = 0;
  for (int64_t i = 0; i < n; ++i) {
    const auto& greedy = results[static_cast<size_t>(i * (samples + 1))];
    SLUICE_ASSIGN_OR_RETURN(double reward, s.Score(examples[i], greedy));
    const bool correct = reward >= 1.0;
    e.mean_reward += reward;
    e.accuracy += correct ? 1.0 : 0.0;
    e.mean_length += static_cast<double>(greedy.tokens.size());
    EvalResult::Bucket& bucket = e.by_difficulty[examples[i].difficulty];
    bucket.total += 1;
    bucket.correct += correct ? 1 : 0;
    for (int64_t k = 1; k <= samples; ++k) {
      SLUICE_ASSIGN_OR_RETURN(double r, s.Score(examples[i], results[static_cast<size_t>(i * (samples + 1) + k)]));
      sampled_correct += r >= 1.0 ? 1.0 : 0.0;
    }
  }
  e.mean_reward /= std::max<int64_t>(n, 1);
  e.accuracy /= std::max<int64_t>(n, 1);
  e.mean_length /= std::max<int64_t>(n, 1);
  if (samples > 0) e.sampled_accuracy = sampled_correct / static_cast<double>(std::max<int64_t>(n * samples, 1));
  return e;
}

Status SyncLoop::PrepareTraining() {
  State& s = *state_;
  const RlOptions& rl = s.options.rl;
  if (s.options.rl.trainer.loss.kl_coef > 0) {
    // The frozen reference is the policy RL starts from, kept on disk so a
    // resumed run penalizes against the same weights.
    const fs::path ref_dir = fs::path(s.options.run_dir) / "reference";
    std::error_code ec;
    if (!(s.options.resume && fs::exists(ref_dir / "config.json", ec))) {
      SLUICE_RETURN_IF_ERROR(model::SavePretrained(*s.policy, ref_dir.string()));
    }
    SLUICE_ASSIGN_OR_RETURN(s.reference,
                            model::LoadPretrained(ref_dir.string(), s.policy->parameters().front().device()));
  }
  if (s.options.pipeline.trainer_threads > 0) SetIntraOpThreadsHere(s.options.pipeline.trainer_threads);
  SLUICE_ASSIGN_OR_RETURN(s.trainer, trainer::Trainer::Create(s.policy, s.reference, rl.trainer));
  bool loaded = false;
  if (s.options.resume) SLUICE_RETURN_IF_ERROR(s.LoadLatestCheckpoint(&loaded));
  if (!loaded) std::ofstream(fs::path(s.options.run_dir) / "metrics.jsonl", std::ios::trunc);
  return Status::Ok();
}

Status SyncLoop::Train(const ProgressFn& progress, const std::atomic<bool>* stop) {
  State& s = *state_;
  const RlOptions& rl = s.options.rl;
  SLUICE_RETURN_IF_ERROR(PrepareTraining());
  if (s.options.pipeline.mode != PipelineMode::kDirect) {
    return s.options.pipeline.processes ? TrainInProcesses(stop) : TrainStreaming(progress);
  }
  const uint64_t n = s.task->size(reward::Split::kTrain);
  const auto run_start = Clock::now();
  std::ofstream metrics(fs::path(s.options.run_dir) / "metrics.jsonl", std::ios::app);
  while (s.step < rl.steps) {
    StepRecord rec;
    rec.step = s.step + 1;
    rec.total_steps = rl.steps;
    // Rollout: G sampled answers per prompt on the current weights.
    auto t0 = Clock::now();
    std::vector<reward::Example> examples;
    std::vector<rollout::GenerationRequest> requests;
    for (int64_t k = 0; k < rl.prompts_per_step; ++k) {
      const uint64_t cursor = static_cast<uint64_t>(s.step * rl.prompts_per_step + k);
      rec.prompts.push_back(cursor);
      SLUICE_ASSIGN_OR_RETURN(reward::Example ex,
                              s.task->Get(reward::Split::kTrain, PermutedIndex(s.options.seed, cursor, n)));
      for (int64_t g = 0; g < rl.group_size; ++g) {
        rollout::GenerationRequest r;
        r.id = static_cast<uint64_t>(k * rl.group_size + g);
        r.prompt = s.EncodePrompt(ex.prompt);
        r.sampling = rl.sampling;
        r.sampling.seed = AnswerSeed(s.options.seed, rl.prompts_per_step, rl.group_size, cursor, g);
        if (rl.forced_length) r.sampling.forced_length = rl.forced_length(cursor, g);
        requests.push_back(std::move(r));
      }
      examples.push_back(std::move(ex));
    }
    SLUICE_ASSIGN_OR_RETURN(auto results, s.Generate(std::move(requests)));
    auto t1 = Clock::now();
    // Reward, then GRPO groups (optionally dropping groups with no signal).
    std::vector<trainer::RolloutSample> samples;
    double reward_sum = 0, correct = 0, len_sum = 0;
    for (int64_t k = 0; k < rl.prompts_per_step; ++k) {
      std::vector<trainer::RolloutSample> group;
      bool all_equal = true;
      for (int64_t g = 0; g < rl.group_size; ++g) {
        auto& r = results[k * rl.group_size + g];
        SLUICE_ASSIGN_OR_RETURN(double reward, s.Score(examples[k], r));
        reward_sum += reward;
        correct += reward >= 1.0 ? 1.0 : 0.0;
        len_sum += static_cast<double>(r.tokens.size());
        rec.response_len_max = std::max<int64_t>(rec.response_len_max, static_cast<int64_t>(r.tokens.size()));
        rec.generated_tokens += static_cast<int64_t>(r.tokens.size());
        trainer::RolloutSample sample;
        sample.id = static_cast<uint64_t>(s.step) * static_cast<uint64_t>(rl.prompts_per_step * rl.group_size) + r.id;
        sample.group_id = static_cast<GroupId>(k);
        sample.prompt = std::move(r.prompt);
        sample.response = std::move(r.tokens);
        sample.behavior_logprobs = std::move(r.logprobs);
        sample.versions = std::move(r.versions);
        sample.reward = reward;
        if (!group.empty() && reward != group.front().reward) all_equal = false;
        group.push_back(std::move(sample));
      }
      if (rl.dynamic_sampling && all_equal) continue;
      ++rec.groups_kept;
      for (auto& smp : group) samples.push_back(std::move(smp));
    }
    const double total = static_cast<double>(rl.prompts_per_step * rl.group_size);
    rec.reward_mean = reward_sum / total;
    rec.accuracy = correct / total;
    rec.response_len_mean = len_sum / total;
    SLUICE_RETURN_IF_ERROR(s.TrainOnGroups(samples, &rec));
    auto t2 = Clock::now();
    ++s.step;
    ++s.version;  // the engine serves the updated weights from the next step on
    rec.gen_seconds = std::chrono::duration<double>(t1 - t0).count();
    rec.train_seconds = std::chrono::duration<double>(t2 - t1).count();
    s.elapsed_total = s.elapsed_offset + std::chrono::duration<double>(Clock::now() - run_start).count();
    rec.elapsed_seconds = s.elapsed_total;
    SLUICE_RETURN_IF_ERROR(s.FinishStep(
        rec, metrics, [this] { return Evaluate(); }, progress));
  }
  return Status::Ok();
}

SyncLoop::StreamSummary SyncLoop::stream_summary() const { return state_->stream_stats; }

void SetIntraOpThreadsHere(int threads) { torch::set_num_threads(threads); }

int64_t SyncLoop::step() const { return state_->step; }
const std::vector<StepRecord>& SyncLoop::history() const { return state_->history; }

}  // namespace sluice::pipeline
