// The built-in calculator environment (environment.h).
#include "sluice/agent/environment.h"

#include <nlohmann/json.hpp>

#include "sluice/agent/calculator.h"

namespace sluice::agent {
namespace {

using nlohmann::json;

// A built-in tool environment: the row's prompt as the user's message, one
// tool offered, each call answered by Run (its one string argument);
// a turn without calls ends the episode.
class OneToolEnvironment : public Environment {
 public:
  OneToolEnvironment(std::string tool, std::string argument, std::string schema, bool offered = true)
      : tool_(std::move(tool)), argument_(std::move(argument)), schema_(std::move(schema)), offered_(offered) {}

  Result<Opening> Reset(const std::string& row) override {
    const json j = json::parse(row, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return Status::InvalidArgument("the row is not a JSON object");
    const auto prompt = j.find("prompt");
    if (prompt == j.end() || !prompt->is_string()) {
      return Status::InvalidArgument("the row has no string \"prompt\"");
    }
    Opening opening;
    opening.messages.push_back({"user", prompt->get<std::string>(), ""});
    if (offered_) opening.tools = "[" + schema_ + "]";
    return opening;
  }

  Result<StepResult> Step(const Action& action) override {
    StepResult result;
    result.done = action.tool_calls.empty();
    for (const ToolCall& call : action.tool_calls) {
      result.messages.push_back({"tool", Answer(call), call.id});
    }
    return result;
  }

 protected:
  virtual std::string Run(const std::string& argument) = 0;

 private:
  std::string Answer(const ToolCall& call) {
    if (!offered_) return "error: no tool is offered";
    if (!call.error.empty()) return "error: " + call.error;
    if (call.name != tool_) return "error: there is no tool '" + call.name + "' (the tool is " + tool_ + ")";
    const json args = json::parse(call.arguments, nullptr, /*allow_exceptions=*/false);
    const auto value = args.is_object() ? args.find(argument_) : args.end();
    if (!args.is_object() || value == args.end() || !value->is_string()) {
      return "error: " + tool_ + " takes a string \"" + argument_ + "\"";
    }
    return Run(value->get<std::string>());
  }

  const std::string tool_, argument_, schema_;
  const bool offered_;
};

class CalculatorEnvironment final : public OneToolEnvironment {
 public:
  explicit CalculatorEnvironment(bool offered)
      : OneToolEnvironment("calculator", "expression", CalculatorToolSchema(), offered) {}

 private:
  std::string Run(const std::string& expression) override {
    Result<int64_t> value = EvaluateArithmetic(expression);
    return value.ok() ? std::to_string(*value) : "error: " + value.status().message();
  }
};

class PythonToolEnvironment final : public OneToolEnvironment {
 public:
  explicit PythonToolEnvironment(SandboxLimits limits)
      : OneToolEnvironment("python", "code", PythonToolSchema()), limits_(std::move(limits)) {}

 private:
  std::string Run(const std::string& code) override {
    Result<SandboxResult> ran = RunSandboxedPython(code, limits_);
    return ran.ok() ? ran->Describe() : "error: the code could not be run: " + ran.status().message();
  }
  const SandboxLimits limits_;
};

}  // namespace

// (In the order OpenAI's function schemas are written, which models were
// trained on: ordered_json keeps it.)
std::string CalculatorToolSchema() {
  return nlohmann::ordered_json{
      {"type", "function"},
      {"function",
       {{"name", "calculator"},
        {"description", "Exact integer arithmetic: + - * / and parentheses"},
        {"parameters",
         {{"type", "object"},
          {"properties", {{"expression", {{"type", "string"}, {"description", "e.g. 1234 * (56 - 7)"}}}}},
          {"required", {"expression"}}}}}}}
      .dump();
}

std::unique_ptr<Environment> MakeCalculatorEnvironment(bool offered) {
  return std::make_unique<CalculatorEnvironment>(offered);
}

std::string PythonToolSchema() {
  return nlohmann::ordered_json{
      {"type", "function"},
      {"function",
       {{"name", "python"},
        {"description", "Runs Python 3 code in a sandbox and returns what it prints"},
        {"parameters",
         {{"type", "object"},
          {"properties", {{"code", {{"type", "string"}, {"description", "e.g. print(2**10)"}}}}},
          {"required", {"code"}}}}}}}
      .dump();
}

std::unique_ptr<Environment> MakePythonToolEnvironment(const SandboxLimits& limits) {
  return std::make_unique<PythonToolEnvironment>(limits);
}

}  // namespace sluice::agent
