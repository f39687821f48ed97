// The built-in calculator environment (environment.h).
#include "sluice/agent/environment.h"

#include <nlohmann/json.hpp>

#include "sluice/agent/calculator.h"

namespace sluice::agent {
namespace {

using nlohmann::json;

class CalculatorEnvironment final : public Environment {
 public:
  Result<Opening> Reset(const std::string& row) override {
    const json j = json::parse(row, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return Status::InvalidArgument("the row is not a JSON object");
    const auto prompt = j.find("prompt");
    if (prompt == j.end() || !prompt->is_string()) {
      return Status::InvalidArgument("the row has no string \"prompt\"");
    }
    Opening opening;
    opening.messages.push_back({"user", prompt->get<std::string>(), ""});
    opening.tools = "[" + CalculatorToolSchema() + "]";
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

 private:
  static std::string Answer(const ToolCall& call) {
    if (!call.error.empty()) return "error: " + call.error;
    if (call.name != "calculator") return "error: there is no tool '" + call.name + "' (the tool is calculator)";
    const json args = json::parse(call.arguments, nullptr, /*allow_exceptions=*/false);
    const auto expression = args.is_object() ? args.find("expression") : args.end();
    if (!args.is_object() || expression == args.end() || !expression->is_string()) {
      return "error: calculator takes a string \"expression\"";
    }
    Result<int64_t> value = EvaluateArithmetic(expression->get<std::string>());
    return value.ok() ? std::to_string(*value) : "error: " + value.status().message();
  }
};

}  // namespace

std::string CalculatorToolSchema() {
  return json{{"type", "function"},
              {"function",
               {{"name", "calculator"},
                {"description", "Exact integer arithmetic: + - * / and parentheses"},
                {"parameters",
                 {{"type", "object"},
                  {"properties", {{"expression", {{"type", "string"}, {"description", "e.g. 1234 * (56 - 7)"}}}}},
                  {"required", {"expression"}}}}}}}
      .dump();
}

std::unique_ptr<Environment> MakeCalculatorEnvironment() { return std::make_unique<CalculatorEnvironment>(); }

}  // namespace sluice::agent
