// Held-out evaluation of a policy on a task: greedy decoding of the first
// `eval.size` eval examples, scored by the task (and, with eval.samples > 0,
// that many sampled answers per example). Needs no training run: `sluice
// eval` uses it on a checkpoint, and a TrainingRun uses one between steps.
//
// Each Evaluate() reads the policy's weights as they are then (a fresh
// rollout engine per call, so in-place updates between calls are seen).
// Thread safety: not thread-safe; the policy must not be updated during a
// call.
#ifndef SLUICE_PIPELINE_EVALUATOR_H_
#define SLUICE_PIPELINE_EVALUATOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "sluice/agent/environment.h"
#include "sluice/common/status.h"
#include "sluice/model/chat_template.h"
#include "sluice/pipeline/metrics.h"
#include "sluice/pipeline/options.h"
#include "sluice/reward/task.h"
#include "sluice/rollout/engine.h"

namespace sluice::model {
class Transformer;
}

namespace sluice::pipeline {

struct EvaluatorOptions {
  EvalOptions eval;
  // Settings of the sampled answers (eval.samples > 0); their seeds derive
  // from `seed` and the answer's index.
  rollout::SamplingParams sampling;
  uint64_t seed = 0;
  int32_t slots = 64;                                 // sequences decoded at once
  std::shared_ptr<const model::Tokenizer> tokenizer;  // null: the byte tokenizer
  model::PromptFormat prompt_format;                  // how prompts reach the model (the run's)
  // Agent runs (agent.env set): each held-out example is a trajectory
  // against the environment (greedy; eval.max_new_tokens per model turn),
  // scored by the environment's reward or the task's on its last turn, in
  // the chat format of the model in `tokenizer_dir`. `make_environment`,
  // when set, replaces agent.env's environments (RunHooks).
  AgentOptions agent;
  std::string tokenizer_dir;
  agent::EnvironmentFactory make_environment;
};

// A run's evaluation settings: eval.*, the RL sampling settings, the run's
// seed and its rollout slots.
EvaluatorOptions EvaluatorOptionsFor(const RunOptions& run);

// How prompts reach the model of `model_dir` under `options`: its chat
// template when it has one and chat_template is auto. Errors: a template
// that does not parse (InvalidArgument naming the file and line).
Result<model::PromptFormat> PromptFormatFor(const PromptOptions& options, const std::string& model_dir);

class Evaluator {
 public:
  // InvalidArgument for bad options, a missing policy or task, a task with no
  // eval examples or a vocabulary larger than the model's.
  static Result<std::unique_ptr<Evaluator>> Create(std::shared_ptr<model::Transformer> policy,
                                                   std::shared_ptr<const reward::Task> task,
                                                   const EvaluatorOptions& options);

  Result<EvalResult> Evaluate();

 private:
  // Agent runs: the requests as trajectories on `engine` (per_example of
  // them per example, the greedy one first); their answers and rewards,
  // and e->tool_use.
  Status AgentEvaluation(rollout::RolloutEngine& engine, const std::vector<reward::Example>& examples,
                         const std::vector<rollout::GenerationRequest>& requests, int64_t per_example,
                         std::vector<rollout::GenerationResult>* results, std::vector<double>* rewards, EvalResult* e);
  Evaluator(std::shared_ptr<model::Transformer> policy, std::shared_ptr<const reward::Task> task,
            const EvaluatorOptions& options);
  std::shared_ptr<model::Transformer> policy_;
  std::shared_ptr<const reward::Task> task_;
  EvaluatorOptions options_;
};

}  // namespace sluice::pipeline

#endif  // SLUICE_PIPELINE_EVALUATOR_H_
