// Private to sluice_pipeline: multi-turn trajectories on a rollout engine.
// The driver opens each trajectory with its environment, submits each model
// turn to the engine as a request (the whole trajectory so far is its
// prompt), hands each finished turn to the environment and the
// environment's answer back to the trajectory, until it ends.
//
// A trajectory waiting for its environment holds no decode slot: its
// request has finished, and the engine decodes the others. Its next turn is
// a new request whose prompt is prefilled again (counted: reprefilled
// tokens); no KV cache is kept across an environment call.
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
#include "sluice/rollout/engine.h"

namespace sluice::pipeline {

// Makes a trajectory's environment (one per trajectory).
using EnvironmentFactory = std::function<Result<std::unique_ptr<agent::Environment>>()>;

struct AgentSettings {
  EnvironmentFactory make_env;
  std::shared_ptr<const model::ChatFormat> format;
  agent::ToolCallFormat calls = agent::ToolCallFormat::kHermes;
  agent::TrajectoryLimits limits;
  int32_t env_workers = 4;
  double env_timeout_seconds = 60;  // one reset or step
  double max_env_seconds = 600;     // a trajectory's calls together

  // InvalidArgument naming the setting.
  Status Validate() const;
};

struct AgentCounters {
  int64_t model_turns = 0;
  int64_t env_calls = 0;
  int64_t tool_calls = 0;
  int64_t malformed_tool_calls = 0;
  int64_t truncated_messages = 0;
  int64_t reprefilled_tokens = 0;  // prompt tokens of turns after the first
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

}  // namespace sluice::pipeline

#endif  // SLUICE_SRC_PIPELINE_AGENT_DRIVER_H_
