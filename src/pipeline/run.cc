#include "sluice/pipeline/run.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <sstream>

#include "agent_driver.h"
#include "generation.h"
#include "run_state.h"
#include "sluice/common/file_util.h"
#include "sluice/common/logging.h"
#include "sluice/common/random.h"
#include "sluice/model/device.h"
#include "sluice/model/safetensors.h"
#include "sluice/model/weights.h"
#include "sluice/pipeline/evaluator.h"

namespace sluice::pipeline {

using nlohmann::json;

TrainingRun::TrainingRun(std::unique_ptr<State> state) : state_(std::move(state)) {}
TrainingRun::~TrainingRun() = default;

namespace {

// Every prompt must leave room for an answer in the model's context. Checked
// when the run is created, for every example of both splits (naming the file
// and line it came from), not when the step that draws it comes. Tasks larger
// than this are generated, and bound their prompt lengths by construction.
constexpr uint64_t kMaxExamplesChecked = uint64_t{1} << 20;

Status CheckPromptsFit(const reward::Task& task, const model::Tokenizer& tokenizer, const model::PromptFormat& format,
                       int64_t context) {
  for (reward::Split split : {reward::Split::kTrain, reward::Split::kEval}) {
    // Beyond the limit, the first example alone: its chat template renders.
    const uint64_t n = std::min<uint64_t>(task.size(split), task.size(split) > kMaxExamplesChecked ? 1 : UINT64_MAX);
    for (uint64_t i = 0; i < n; ++i) {
      SLUICE_ASSIGN_OR_RETURN(reward::Example ex, task.Get(split, i));
      const std::string where =
          ex.source.empty()
              ? "task '" + task.name() + "' " + std::string(reward::SplitName(split)) + " example " + std::to_string(i)
              : ex.source;
      // Rendered once: EncodePrompt returns the template's error itself.
      Result<std::vector<model::TokenId>> ids = EncodePrompt(tokenizer, ex.prompt, format);
      if (!ids.ok()) {
        return ids.status().WithContext(where +
                                        (format.chat ? ": its prompt through the chat template" : ": its prompt"));
      }
      const int64_t tokens = static_cast<int64_t>(ids->size());
      if (tokens >= context) {
        return Status::InvalidArgument(where + ": the prompt is " + std::to_string(tokens) +
                                       " tokens, which leaves no room for an answer in the " + "model's context of " +
                                       std::to_string(context) + " tokens (max_position_embeddings)");
      }
    }
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<TrainingRun>> TrainingRun::Create(std::shared_ptr<model::Transformer> policy,
                                                         std::shared_ptr<const reward::Task> task,
                                                         const RunOptions& options, RunHooks hooks) {
  SLUICE_RETURN_IF_ERROR(options.Validate());
  if (!policy || !task) return Status::InvalidArgument("the loop needs a model and a task");
  auto s = std::make_unique<State>();
  SLUICE_ASSIGN_OR_RETURN(s->tokenizer, model::LoadTokenizer(options.tokenizer_dir));
  if (policy->config().vocab_size < s->tokenizer->vocab_size()) {
    return Status::InvalidArgument("model vocab_size " + std::to_string(policy->config().vocab_size) +
                                   " is smaller than its tokenizer's " + std::to_string(s->tokenizer->vocab_size()) +
                                   (options.tokenizer_dir.empty() ? std::string(" (the byte tokenizer)")
                                                                  : " (" + options.tokenizer_dir + "/tokenizer.json)"));
  }
  if (task->size(reward::Split::kTrain) == 0)
    return Status::InvalidArgument("task '" + task->name() + "' has no train examples");
  if (task->size(reward::Split::kEval) == 0)
    return Status::InvalidArgument("task '" + task->name() + "' has no eval examples");
  SLUICE_ASSIGN_OR_RETURN(s->trainer_device, model::ResolveDevice(options.devices.trainer));
  SLUICE_ASSIGN_OR_RETURN(s->rollout_device, model::ResolveDevice(options.devices.rollout));
  SLUICE_ASSIGN_OR_RETURN(s->rollout_dtype, model::ResolveDtype(options.devices.rollout_dtype, s->rollout_device));
  if (options.pipeline.mode == PipelineMode::kDirect) s->rollout_dtype = torch::kFloat32;  // the trainer's model
  try {
    policy->to(s->trainer_device);
  } catch (const c10::Error& e) {
    return Status::ResourceExhausted("cannot move the model to " + s->trainer_device.str() + ": " +
                                     e.what_without_backtrace());
  }
  s->policy = std::move(policy);
  s->task = std::move(task);
  s->options = options;
  const std::string& precision = options.devices.trainer_precision;
  s->options.rl.trainer.bf16_autocast =
      precision == "bf16-mixed" || (precision == "auto" && s->trainer_device.is_cuda());
  if (s->options.rl.trainer.bf16_autocast && !s->trainer_device.is_cuda()) {
    return Status::InvalidArgument("option trainer.precision: bf16-mixed needs a CUDA trainer device, not " +
                                   s->trainer_device.str());
  }
  s->hooks = std::move(hooks);
  std::error_code ec;
  fs::create_directories(options.run_dir, ec);
  if (ec) return Status::Unavailable(options.run_dir + ": cannot create run directory: " + ec.message());
  rollout::EngineOptions engine_options;
  engine_options.num_slots = options.rl.rollout_slots;
  engine_options.eos_token_id = s->tokenizer->eos_id();
  engine_options.kept_cache_bytes = options.agent.KeptCacheBytes();
  SLUICE_ASSIGN_OR_RETURN(s->engine,
                          rollout::RolloutEngine::Create(rollout::PolicySnapshot{s->policy, 0}, engine_options));
  SLUICE_ASSIGN_OR_RETURN(s->prompt_format, PromptFormatFor(options.prompts, options.tokenizer_dir));
  SLUICE_RETURN_IF_ERROR(
      CheckPromptsFit(*s->task, *s->tokenizer, s->prompt_format, s->policy->config().max_position_embeddings));
  EvaluatorOptions eval_options = EvaluatorOptionsFor(options);
  eval_options.tokenizer = s->tokenizer;
  eval_options.prompt_format = s->prompt_format;
  eval_options.make_environment = s->hooks.make_environment;
  SLUICE_ASSIGN_OR_RETURN(s->evaluator, Evaluator::Create(s->policy, s->task, eval_options));
  State* raw = s.get();
  // Sync mode: the engine is idle while the trainer updates the shared model in
  // place; at the next step it serves the new version.
  s->engine->SetWeightSwapHook([raw](rollout::PolicyVersion current) -> std::optional<rollout::PolicySnapshot> {
    if (raw->version > current) return rollout::PolicySnapshot{raw->policy, raw->version};
    return std::nullopt;
  });
  return std::unique_ptr<TrainingRun>(new TrainingRun(std::move(s)));
}

Status TrainingRun::WarmStart(const ProgressFn& progress) {
  State& s = *state_;
  const SftOptions& sft = s.options.sft;
  if (sft.steps == 0) return Status::Ok();
  const fs::path out = fs::path(s.options.run_dir) / "sft";
  std::error_code ec;
  if (s.options.resume && fs::exists(out / "config.json", ec)) {
    SLUICE_RETURN_IF_ERROR(s.CheckResumedModel(out.string()));
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
  // Agent runs warm-start on conversations in their trajectories' chat
  // format: an answer at once (a built-in environment opens it; for a
  // Python environment, the task's prompt as the user's message, as the
  // built-in ones open it: its reset is not run for every example), or, for
  // sft.tool_call_fraction of them, a call of the calculator, offered
  // whether or not the run offers it (a control run without the tool starts
  // from the same weights).
  std::optional<AgentSettings> direct, calling;
  if (s.options.agent.enabled()) {
    AgentOptions builtin = s.options.agent;
    if (builtin.python()) builtin.env = "calculator", builtin.env_config = R"({"offer_tool": false})";
    SLUICE_ASSIGN_OR_RETURN(direct, AgentSettingsFor(builtin, s.options.tokenizer_dir, s.policy->config(),
                                                     s.options.rl.sampling.max_new_tokens));
    calling = direct;
    calling->make_env = [](uint64_t) -> Result<std::unique_ptr<agent::Environment>> {
      return agent::MakeCalculatorEnvironment(/*offered=*/true);
    };
  }
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
      if (direct) {
        const bool call = sft.tool_call_fraction > 0 &&
                          UnitInterval(HashCombine(s.options.seed ^ kToolCallSalt, cursor)) < sft.tool_call_fraction;
        SLUICE_ASSIGN_OR_RETURN(trainer::SftExample e,
                                AgentWarmStartExample(call ? *calling : *direct, ex, target, call, s.EosId()));
        batch.push_back(std::move(e));
        continue;
      }
      SLUICE_ASSIGN_OR_RETURN(std::vector<model::TokenId> prompt, s.EncodePrompt(ex.prompt));
      SLUICE_ASSIGN_OR_RETURN(std::vector<model::TokenId> target_ids, s.tokenizer->Encode(target));
      trainer::SftExample e{std::move(prompt), std::move(target_ids), {}};
      if (s.EosId() >= 0) e.target.push_back(s.EosId());
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
  return s.SaveModel(out.string());
}

Result<EvalResult> TrainingRun::Evaluate() { return state_->evaluator->Evaluate(); }

Status TrainingRun::PrepareTraining() {
  State& s = *state_;
  const RlOptions& rl = s.options.rl;
  if (s.options.rl.trainer.loss.kl_coef > 0 && s.follower()) {
    // Rank 0's reference reaches the other trainer ranks with its weights
    // (Trainer::Create); here only a model of its shape.
    s.reference = model::CloneModel(*s.policy);
  } else if (s.options.rl.trainer.loss.kl_coef > 0) {
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
  SLUICE_ASSIGN_OR_RETURN(s.trainer, trainer::Trainer::Create(s.policy, s.reference, rl.trainer, s.data_parallel));
  // Trainer rank 0 alone resumes (the others may be on hosts without the
  // run's directory), then hands every rank its state.
  bool loaded = false;
  if (s.options.resume && !s.follower()) SLUICE_RETURN_IF_ERROR(s.LoadLatestCheckpoint(&loaded));
  if (s.data_parallel) SLUICE_RETURN_IF_ERROR(s.trainer->SyncFromRankZero());
  if (!loaded && !s.follower()) {
    SLUICE_RETURN_IF_ERROR(MetricsLog::Clear(s.options.run_dir));
    if (s.options.agent.enabled()) SLUICE_RETURN_IF_ERROR(MetricsLog::Clear(s.options.run_dir, kTrajectoriesFile));
  }
  return Status::Ok();
}

Result<std::tuple<std::vector<rollout::GenerationResult>, std::vector<std::string>, std::vector<double>>>
TrainingRun::State::AgentRollouts(const std::vector<reward::Example>& examples,
                                  const std::vector<rollout::GenerationRequest>& requests) {
  State& s = *this;
  const size_t G = static_cast<size_t>(s.options.rl.group_size);
  SLUICE_ASSIGN_OR_RETURN(AgentSettings settings,
                          AgentSettingsFor(s.options.agent, s.options.tokenizer_dir, s.policy->config(),
                                           s.options.rl.sampling.max_new_tokens));
  if (s.hooks.make_environment) settings.make_env = s.hooks.make_environment;
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<AgentDriver> driver,
                          AgentDriver::Create(std::move(settings), s.engine.get()));
  // Each trajectory by its id in the run (cursor x group size + answer), as
  // the streaming modes number them; request i is the step's answer i.
  const uint64_t first = static_cast<uint64_t>(s.step * s.options.rl.prompts_per_step) * G;
  for (size_t i = 0; i < requests.size(); ++i) {
    driver->Start(first + i, AgentRow(examples[i / G]), requests[i].sampling);
  }
  SLUICE_ASSIGN_OR_RETURN(std::vector<AgentDriver::Finished> ended,
                          RunTrajectories(*driver, *s.engine, requests.size(), [] { return false; }));
  std::vector<rollout::GenerationResult> results(requests.size());
  std::vector<std::string> summaries(requests.size());
  std::vector<double> rewards(requests.size(), 0.0);
  for (AgentDriver::Finished& f : ended) {
    const size_t i = static_cast<size_t>(f.id - first);
    AgentAnswer a = AnswerOfTrajectory(f, requests[i].prompt, s.EosId());
    SLUICE_ASSIGN_OR_RETURN(const agent::TrajectorySummary score, agent::ReadTrajectorySummary(a.summary));
    rewards[i] = score.env_reward ? *score.env_reward : s.task->Score(examples[i / G], score.content);
    results[i].id = f.id;
    results[i].prompt = std::move(a.prompt);
    results[i].tokens = std::move(a.response);
    results[i].logprobs = std::move(a.logprobs);
    results[i].versions = std::move(a.versions);
    summaries[i] = std::move(a.summary);
  }
  return std::make_tuple(std::move(results), std::move(summaries), std::move(rewards));
}

Status TrainingRun::Train(const ProgressFn& progress, const std::atomic<bool>* stop) {
  State& s = *state_;
  const RlOptions& rl = s.options.rl;
  SLUICE_RETURN_IF_ERROR(PrepareTraining());
  if (s.options.pipeline.mode != PipelineMode::kDirect) {
    return s.options.pipeline.processes ? TrainInProcesses(stop) : TrainStreaming(progress);
  }
  const uint64_t n = s.task->size(reward::Split::kTrain);
  const auto run_start = Clock::now();
  SLUICE_ASSIGN_OR_RETURN(MetricsLog metrics, MetricsLog::Open(s.options.run_dir));
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
        SLUICE_ASSIGN_OR_RETURN(r.prompt, s.EncodePrompt(ex.prompt));
        r.sampling = rl.sampling;
        r.sampling.seed = AnswerSeed(s.options.seed, rl.prompts_per_step, rl.group_size, cursor, g);
        if (s.hooks.forced_length) r.sampling.forced_length = s.hooks.forced_length(cursor, g);
        requests.push_back(std::move(r));
      }
      examples.push_back(std::move(ex));
    }
    std::vector<rollout::GenerationResult> results;
    std::vector<std::string> trajectories;  // agent runs: each answer's summary
    std::vector<double> rewards;
    if (s.options.agent.enabled()) {
      SLUICE_ASSIGN_OR_RETURN(std::tie(results, trajectories, rewards), s.AgentRollouts(examples, requests));
    } else {
      SLUICE_ASSIGN_OR_RETURN(results, s.Generate(std::move(requests)));
    }
    auto t1 = Clock::now();
    // Reward, then GRPO groups (optionally dropping groups with no signal).
    if (!s.options.agent.enabled()) {
      std::vector<const reward::Example*> scored_examples;
      std::vector<const std::vector<model::TokenId>*> answers;
      for (size_t i = 0; i < results.size(); ++i) {
        scored_examples.push_back(&examples[i / static_cast<size_t>(rl.group_size)]);
        answers.push_back(&results[i].tokens);
      }
      rewards = ScoreAnswers(*s.tokenizer, *s.task, scored_examples, answers);
    }
    if (!trajectories.empty()) SLUICE_RETURN_IF_ERROR(CountAgentStep(trajectories, &rec));
    std::vector<trainer::RolloutSample> samples;
    double reward_sum = 0, correct = 0, len_sum = 0;
    for (int64_t k = 0; k < rl.prompts_per_step; ++k) {
      std::vector<trainer::RolloutSample> group;
      bool all_equal = true;
      for (int64_t g = 0; g < rl.group_size; ++g) {
        auto& r = results[k * rl.group_size + g];
        const double reward = rewards[static_cast<size_t>(k * rl.group_size + g)];
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
        if (!trajectories.empty())
          sample.trajectory = std::move(trajectories[static_cast<size_t>(k * rl.group_size + g)]);
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
    rec.reward_errors = static_cast<int64_t>(s.task->score_errors());
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

StreamSummary TrainingRun::stream_summary() const { return state_->stream_stats; }

void SetIntraOpThreadsHere(int threads) { torch::set_num_threads(threads); }

int64_t TrainingRun::step() const { return state_->step; }
const RunOptions& TrainingRun::options() const { return state_->options; }
const std::vector<StepRecord>& TrainingRun::history() const { return state_->history; }

}  // namespace sluice::pipeline
