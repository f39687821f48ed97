#include "sluice/pipeline/evaluator.h"

#include <algorithm>

#include "agent_driver.h"
#include "generation.h"
#include "sluice/common/random.h"
#include "sluice/model/transformer.h"

namespace sluice::pipeline {

EvaluatorOptions EvaluatorOptionsFor(const RunOptions& run) {
  EvaluatorOptions o;
  o.eval = run.eval;
  o.sampling = run.rl.sampling;
  o.seed = run.seed;
  o.slots = run.rl.rollout_slots;
  o.agent = run.agent;
  o.tokenizer_dir = run.tokenizer_dir;
  return o;
}

Result<model::PromptFormat> PromptFormatFor(const PromptOptions& options, const std::string& model_dir) {
  model::PromptFormat format;
  if (options.chat_template == "auto" && !model_dir.empty()) {
    Result<model::ChatTemplate> chat = model::ChatTemplate::Load(model_dir);
    if (chat.ok()) {
      format.chat = std::make_shared<const model::ChatTemplate>(std::move(chat).value());
    } else if (chat.status().code() != StatusCode::kNotFound) {
      return chat.status();
    }
  }
  format.system = options.system_prompt;
  if (options.enable_thinking != "auto") format.variables["enable_thinking"] = options.enable_thinking == "true";
  return format;
}

Result<std::unique_ptr<Evaluator>> Evaluator::Create(std::shared_ptr<model::Transformer> policy,
                                                     std::shared_ptr<const reward::Task> task,
                                                     const EvaluatorOptions& options) {
  if (!policy || !task) return Status::InvalidArgument("the evaluator needs a model and a task");
  if (options.eval.size < 1) return Status::InvalidArgument("option eval.size: must be >= 1");
  if (options.eval.max_new_tokens < 1) return Status::InvalidArgument("option eval.max_new_tokens: must be >= 1");
  if (options.eval.samples < 0) return Status::InvalidArgument("option eval.samples: must be >= 0");
  if (options.slots < 1) return Status::InvalidArgument("evaluator slots must be >= 1");
  if (options.eval.samples > 0) SLUICE_RETURN_IF_ERROR(options.sampling.Validate());
  EvaluatorOptions resolved = options;
  if (!resolved.tokenizer) resolved.tokenizer = std::make_shared<model::ByteTokenizer>();
  if (policy->config().vocab_size < resolved.tokenizer->vocab_size()) {
    return Status::InvalidArgument("model vocab_size " + std::to_string(policy->config().vocab_size) +
                                   " is smaller than its tokenizer's " +
                                   std::to_string(resolved.tokenizer->vocab_size()));
  }
  if (task->size(reward::Split::kEval) == 0)
    return Status::InvalidArgument("task '" + task->name() + "' has no eval examples");
  return std::unique_ptr<Evaluator>(new Evaluator(std::move(policy), std::move(task), resolved));
}

Evaluator::Evaluator(std::shared_ptr<model::Transformer> policy, std::shared_ptr<const reward::Task> task,
                     const EvaluatorOptions& options)
    : policy_(std::move(policy)), task_(std::move(task)), options_(options) {}

Status Evaluator::AgentEvaluation(rollout::RolloutEngine& engine, const std::vector<reward::Example>& examples,
                                  const std::vector<rollout::GenerationRequest>& requests, int64_t per_example,
                                  std::vector<rollout::GenerationResult>* results, std::vector<double>* rewards,
                                  EvalResult* e) {
  SLUICE_ASSIGN_OR_RETURN(AgentSettings settings, AgentSettingsFor(options_.agent, options_.tokenizer_dir,
                                                                   policy_->config(), options_.eval.max_new_tokens));
  if (options_.make_environment) settings.make_env = options_.make_environment;
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<AgentDriver> driver, AgentDriver::Create(std::move(settings), &engine));
  for (const rollout::GenerationRequest& r : requests) {
    driver->Start(r.id, AgentRow(examples[r.id / static_cast<uint64_t>(per_example)]), r.sampling);
  }
  SLUICE_ASSIGN_OR_RETURN(std::vector<AgentDriver::Finished> ended,
                          RunTrajectories(*driver, engine, requests.size(), [] { return false; }));
  results->assign(requests.size(), {});
  rewards->assign(requests.size(), 0.0);
  int64_t greedy_tool_users = 0;
  for (AgentDriver::Finished& f : ended) {
    const size_t j = static_cast<size_t>(f.id);
    AgentAnswer a = AnswerOfTrajectory(f, requests[j].prompt, options_.tokenizer->eos_id());
    SLUICE_ASSIGN_OR_RETURN(const agent::TrajectorySummary summary, agent::ReadTrajectorySummary(a.summary));
    (*rewards)[j] = summary.env_reward ? *summary.env_reward
                                       : task_->Score(examples[j / static_cast<size_t>(per_example)], summary.content);
    if (j % static_cast<size_t>(per_example) == 0 && summary.tool_calls > 0) ++greedy_tool_users;
    (*results)[j].id = f.id;
    (*results)[j].tokens = std::move(a.response);
  }
  e->tool_use = static_cast<double>(greedy_tool_users) / static_cast<double>(std::max<size_t>(examples.size(), 1));
  return Status::Ok();
}

Result<EvalResult> Evaluator::Evaluate() {
  const model::Tokenizer& tokenizer = *options_.tokenizer;
  const int64_t n = std::min<int64_t>(options_.eval.size, static_cast<int64_t>(task_->size(reward::Split::kEval)));
  const int64_t samples = options_.eval.samples;
  std::vector<reward::Example> examples;
  std::vector<rollout::GenerationRequest> requests;
  for (int64_t i = 0; i < n; ++i) {
    SLUICE_ASSIGN_OR_RETURN(reward::Example ex, task_->Get(reward::Split::kEval, static_cast<uint64_t>(i)));
    rollout::GenerationRequest r;
    // A template or tokenizer that fails says so, naming the example.
    Result<std::vector<model::TokenId>> prompt = EncodePrompt(tokenizer, ex.prompt, options_.prompt_format);
    if (!prompt.ok()) {
      return prompt.status().WithContext(ex.source.empty() ? "eval example " + std::to_string(i) : ex.source);
    }
    r.prompt = std::move(*prompt);
    // Request i * (samples + 1) is the greedy answer, the next `samples` are sampled.
    for (int64_t k = 0; k <= samples; ++k) {
      r.id = static_cast<uint64_t>(i * (samples + 1) + k);
      if (k == 0) {
        r.sampling.temperature = 0.0f;
      } else {
        r.sampling = options_.sampling;
        r.sampling.seed = HashCombine(HashCombine(options_.seed, 0xe7a1), r.id);
      }
      r.sampling.max_new_tokens = options_.eval.max_new_tokens;
      requests.push_back(r);
    }
    examples.push_back(std::move(ex));
  }
  rollout::EngineOptions engine_options;
  engine_options.num_slots = options_.slots;
  engine_options.eos_token_id = tokenizer.eos_id();
  engine_options.kept_cache_bytes = options_.agent.KeptCacheBytes();
  SLUICE_ASSIGN_OR_RETURN(auto engine,
                          rollout::RolloutEngine::Create(rollout::PolicySnapshot{policy_, 0}, engine_options));
  // Result j answers example j / (samples + 1) (its greedy answer first).
  const uint64_t errors_before = task_->score_errors();
  std::vector<rollout::GenerationResult> results;
  std::vector<double> rewards;
  EvalResult e;
  if (options_.agent.enabled()) {
    SLUICE_RETURN_IF_ERROR(AgentEvaluation(*engine, examples, requests, samples + 1, &results, &rewards, &e));
  } else {
    SLUICE_ASSIGN_OR_RETURN(results, GenerateAll(*engine, std::move(requests)));
    std::vector<const reward::Example*> scored_examples;
    std::vector<const std::vector<model::TokenId>*> answers;
    for (size_t j = 0; j < results.size(); ++j) {
      scored_examples.push_back(&examples[j / static_cast<size_t>(samples + 1)]);
      answers.push_back(&results[j].tokens);
    }
    rewards = ScoreAnswers(tokenizer, *task_, scored_examples, answers);
  }
  e.reward_errors = static_cast<int64_t>(task_->score_errors() - errors_before);
  e.examples = n;
  double sampled_correct = 0;
  for (int64_t i = 0; i < n; ++i) {
    const auto& greedy = results[static_cast<size_t>(i * (samples + 1))];
    const double reward = rewards[static_cast<size_t>(i * (samples + 1))];
    const bool correct = reward >= 1.0;
    e.mean_reward += reward;
    e.accuracy += correct ? 1.0 : 0.0;
    e.mean_length += static_cast<double>(greedy.tokens.size());
    EvalResult::Bucket& bucket = e.by_difficulty[examples[i].difficulty];
    bucket.total += 1;
    bucket.correct += correct ? 1 : 0;
    for (int64_t k = 1; k <= samples; ++k) {
      sampled_correct += rewards[static_cast<size_t>(i * (samples + 1) + k)] >= 1.0 ? 1.0 : 0.0;
    }
  }
  e.mean_reward /= std::max<int64_t>(n, 1);
  e.accuracy /= std::max<int64_t>(n, 1);
  e.mean_length /= std::max<int64_t>(n, 1);
  if (samples > 0) e.sampled_accuracy = sampled_correct / static_cast<double>(std::max<int64_t>(n * samples, 1));
  return e;
}

}  // namespace sluice::pipeline
