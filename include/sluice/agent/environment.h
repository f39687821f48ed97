// An environment of a multi-turn rollout: it opens a conversation from a
// task's row, answers each of the model's turns (its tool calls parsed),
// and says when the episode is done and, optionally, its reward. Python
// environments (`agent.env: module:Class`) have the same contract.
//
// Thread safety: one instance per trajectory, used by one thread at a time.
#ifndef SLUICE_AGENT_ENVIRONMENT_H_
#define SLUICE_AGENT_ENVIRONMENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sluice/agent/action.h"
#include "sluice/agent/sandbox.h"
#include "sluice/common/status.h"

namespace sluice::agent {

// How a conversation opens: its first messages (system, user) and the
// tools offered, a JSON array of OpenAI function schemas as text ("": none;
// it goes to the chat template's `tools`).
struct Opening {
  std::vector<Message> messages;
  std::string tools;
};

// The environment's answer to a turn: new messages (tool results, a user's
// reply), the reward when done (nullopt: the task's reward scores the last
// assistant message), and whether the episode is done.
struct StepResult {
  std::vector<Message> messages;
  std::optional<double> reward;
  bool done = false;
};

class Environment {
 public:
  virtual ~Environment() = default;
  // `row`: one line of the task's JSONL, a JSON object as text.
  virtual Result<Opening> Reset(const std::string& row) = 0;
  virtual Result<StepResult> Step(const Action& action) = 0;
};

// Makes the environment of one trajectory: `trajectory` is its id in the
// run (a training answer's: prompt cursor x group size + answer index; an
// evaluation's: its request's id).
using EnvironmentFactory = std::function<Result<std::unique_ptr<Environment>>(uint64_t trajectory)>;

// The calculator tool's schema (OpenAI function format): "calculator", one
// string argument "expression".
std::string CalculatorToolSchema();

// The built-in calculator environment: the row's "prompt" as the user's
// message with the calculator offered; each call answered with its value
// (or why there is none: a malformed call, another tool, a bad expression);
// a turn without calls ends the episode, for the task's reward to score.
// Reset: InvalidArgument for a row that is not an object with a string
// "prompt". Not `offered` (a control run without the tool): no tool in the
// opening, and every call answered that there is none.
std::unique_ptr<Environment> MakeCalculatorEnvironment(bool offered = true);

// The code-execution tool's schema: "python", one string argument "code".
std::string PythonToolSchema();

// The built-in code-execution environment: the row's "prompt" as the
// user's message with the python tool offered; each call's code runs in the
// sandbox (sandbox.h) and is answered with what it printed and how it ended
// (a malformed call, another tool: why there is no run); a turn without
// calls ends the episode, for the task's reward to score.
std::unique_ptr<Environment> MakePythonToolEnvironment(const SandboxLimits& limits);

}  // namespace sluice::agent

#endif  // SLUICE_AGENT_ENVIRONMENT_H_
