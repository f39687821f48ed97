// Private to sluice_pipeline: multi-turn trajectories on a rollout engine.
// The driver opens each trajectory with its environment, submits each model
// turn to the engine as a request (the whole trajectory so far is its
// prompt), hands each finished turn to the environment and the
// environment's answer back to the trajectory, until it ends.
//
// A trajectory waiting for its environment holds no decode slot: its
// request has finished, and the engine decodes the others. Its next turn is
// a new request (the same id) whose prompt continues the last: each turn
// asks the engine to keep its keys and values (keep_cache), so the next
// prefills only the tokens added since, while the caches kept fit the
// engine's budget (agent.kept_cache_mib); past it the oldest are dropped
// and prefilled again (EngineStats counts both). A trajectory that ends
// drops its cache.
//
// Environment calls (reset, step) run on agent.env_workers threads, at most
// that many at once. A call past env_timeout_seconds ends its trajectory
// (env_timeout) when the deadline passes, whether or not the call returns;
// its thread is taken until it does (a C++ environment is trusted code and
// cannot be interrupted; Python environments run in worker processes that
// are killed). An environment that fails ends its trajectory (env_error).
//
// Thread safety: one owner thread calls everything; the pool's threads only
// run environment calls.
#ifndef SLUICE_SRC_PIPELINE_AGENT_DRIVER_H_
#define SLUICE_SRC_PIPELINE_AGENT_DRIVER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sluice/agent/environment.h"
#include "sluice/agent/trajectory.h"
#include "sluice/common/status.h"
#include "sluice/model/chat_format.h"
#include "sluice/model/config.h"
#include "sluice/pipeline/metrics.h"
#include "sluice/pipeline/options.h"
#include "sluice/reward/task.h"
#include "sluice/rollout/engine.h"
#include "sluice/trainer/types.h"

namespace sluice::pipeline {

struct AgentSettings {
  agent::EnvironmentFactory make_env;
  std::shared_ptr<const model::ChatFormat> format;
  agent::ToolCallFormat calls = agent::ToolCallFormat::kHermes;
  agent::TrajectoryLimits limits;
  int32_t env_workers = 4;
  double env_timeout_seconds = 60;  // one reset or step
  double max_env_seconds = 600;     // a trajectory's calls together

  // InvalidArgument naming the setting.
  Status Validate() const;
};

// The run's agent settings: agent.* over the model (its chat format from
// `tokenizer_dir`, its context, its family for agent.tool_call_format auto)
// and a model turn's tokens (rl.max_new_tokens). Errors: an environment
// Sluice does not have, the chat format's (ChatFormat::Load), a max_tokens
// past the model's context.
Result<AgentSettings> AgentSettingsFor(const AgentOptions& agent, const std::string& tokenizer_dir,
                                       const model::ModelConfig& model, int32_t max_turn_tokens);

// A warm-start example of an agent run with the calculator
// (sft.tool_call_fraction): `example` as the conversation the run's
// trajectories hold, in their chat format and token layout. With
// `call_tool`, the model's first turn calls the calculator with the problem
// (the example's prompt less its final '='), the tool answers, and the
// second turn is the answer marker and the answer; else one turn answers
// `answer_text`. Each turn ends with `eos`. Prompt: the opening; target:
// the rest, trained where the model speaks. FailedPrecondition when the
// calculator's answer is not the example's.
Result<trainer::SftExample> AgentWarmStartExample(const AgentSettings& settings, const reward::Example& example,
                                                  const std::string& answer_text, bool call_tool, model::TokenId eos);

// A task's example as an environment's reset receives it: {"prompt": ...,
// "answer": ..., "index": ...} (JSON text).
std::string AgentRow(const reward::Example& example);

// The summary of a trajectory that never opened (Trajectory::Summary's
// shape, no turns).
std::string UnopenedSummary(agent::EndReason reason, const std::string& detail);

// A trajectory that ended as the answer the trainer trains: the opening as
// its prompt, the rest as its response (versions -1 where the model did not
// sample), and its summary. One that never opened (its environment failed
// at reset) is `task_prompt` and one `eos` token the policy did not
// sample: the group is trained with its reward (the task's, of nothing
// said) and no gradient from it.
struct AgentAnswer {
  std::vector<model::TokenId> prompt, response;
  std::vector<float> logprobs;
  std::vector<PolicyVersion> versions;
  std::string summary;
};

// An agent run's trained trajectories, a line each (docs/agents.md).
inline constexpr char kTrajectoriesFile[] = "trajectories.jsonl";
// Appends the samples of RL step `step` that are agent trajectories (their
// advantages set) to run_dir/trajectories.jsonl. Unavailable naming the
// file when a line cannot be written; DataLoss for a malformed sample.
Status AppendTrajectories(const std::string& run_dir, int64_t step, const std::vector<trainer::RolloutSample>& samples);

// The step's agent metrics (StepRecord::agent_*) over the summaries of its
// trajectories. DataLoss for one that is not a summary.
Status CountAgentStep(const std::vector<std::string>& summaries, StepRecord* rec);

struct AgentCounters {
  int64_t model_turns = 0;
  int64_t env_calls = 0;
  int64_t truncated_messages = 0;
  double env_seconds = 0;
};

class AgentDriver {
 public:
  // A trajectory that ended. Without `trajectory`, its opening failed
  // (`reason` and `detail` say how): nothing was sampled.
  struct Finished {
    uint64_t id = 0;
    std::optional<agent::Trajectory> trajectory;
    agent::EndReason reason = agent::EndReason::kNone;
    std::string detail;
    double env_seconds = 0;
  };

  // `engine` outlives the driver.
  static Result<std::unique_ptr<AgentDriver>> Create(AgentSettings settings, rollout::RolloutEngine* engine);
  ~AgentDriver();  // waits for the environment calls in flight
  AgentDriver(const AgentDriver&) = delete;
  AgentDriver& operator=(const AgentDriver&) = delete;

  // Starts trajectory `id` (unique among those in flight) on `row` (a JSON
  // object, the environment's reset argument); each turn samples with
  // `sampling`, its seed mixed with the turn's index.
  void Start(uint64_t id, std::string row, const rollout::SamplingParams& sampling);

  // Takes the results of this driver's requests out of `results` (the
  // engine's Step output; others are left) and hands each turn to its
  // trajectory. Then moves the environments' answers in: next turns are
  // submitted. Returns the trajectories that ended.
  Result<std::vector<Finished>> Advance(std::vector<rollout::GenerationResult>* results);

  bool owns(uint64_t id) const { return live_.count(id) > 0; }
  size_t in_flight() const { return live_.size(); }
  // Trajectories whose environment call has not answered yet.
  size_t waiting_env() const;
  const AgentCounters& counters() const { return counters_; }

 private:
  class Pool;
  struct Live;
  AgentDriver(AgentSettings settings, rollout::RolloutEngine* engine);
  // Runs `call` (a reset, or a step when `is_step`) on the pool.
  void Call(uint64_t id, bool is_step, std::function<void(Live&)> call);
  void NextTurn(Live& live, std::vector<Finished>* ended);
  void Finish(uint64_t id, std::vector<Finished>* ended);

  const AgentSettings s_;
  rollout::RolloutEngine* const engine_;
  std::unique_ptr<Pool> pool_;
  std::map<uint64_t, std::shared_ptr<Live>> live_;
  AgentCounters counters_;
};

// `f` as its answer (AgentAnswer).
AgentAnswer AnswerOfTrajectory(const AgentDriver::Finished& f, const std::vector<model::TokenId>& task_prompt,
                               model::TokenId eos);

// Steps `engine` and `driver` until `n` trajectories have ended (or
// `stopping`); returns them. Errors: the engine's and the driver's.
Result<std::vector<AgentDriver::Finished>> RunTrajectories(AgentDriver& driver, rollout::RolloutEngine& engine,
                                                           size_t n, const std::function<bool()>& stopping);

}  // namespace sluice::pipeline

#endif  // SLUICE_SRC_PIPELINE_AGENT_DRIVER_H_
