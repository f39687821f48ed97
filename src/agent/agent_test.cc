#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "sluice/agent/action.h"
#include "sluice/agent/calculator.h"
#include "sluice/agent/environment.h"

namespace sluice::agent {
namespace {

using nlohmann::json;

// Qwen-style (hermes) calls anywhere in the turn, each with its id; the
// turn's text kept as sampled. Fails if a call is lost, its arguments are
// not the object written (or a string holding one), or the ids repeat.
TEST(ToolCallTest, HermesCallsAreReadWhereverTheyStand) {
  const std::string text =
      "Let me compute.\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"12*34\"}}\n"
      "</tool_call>then <tool_call>{\"name\": \"search\", \"arguments\": \"{\\\"q\\\": \\\"x\\\"}\"}</tool_call>";
  const Action a = ParseAction(text, ToolCallFormat::kHermes, 3);
  EXPECT_EQ(a.content, text);
  ASSERT_EQ(a.tool_calls.size(), 2u);
  EXPECT_EQ(a.tool_calls[0].name, "calculator");
  EXPECT_EQ(json::parse(a.tool_calls[0].arguments), json({{"expression", "12*34"}}));
  EXPECT_EQ(a.tool_calls[0].id, "call_3_0");
  EXPECT_EQ(a.tool_calls[1].name, "search");
  EXPECT_EQ(json::parse(a.tool_calls[1].arguments), json({{"q", "x"}}));
  EXPECT_EQ(a.tool_calls[1].id, "call_3_1");
  EXPECT_TRUE(a.tool_calls[0].error.empty() && a.tool_calls[1].error.empty());
  EXPECT_TRUE(ParseAction("The answer is 408.", ToolCallFormat::kHermes, 0).tool_calls.empty());
}

// A malformed call reaches the environment flagged, never a crash: not
// JSON, no name, arguments not an object, no closing tag; and a turn of
// 1000 calls is read up to the limit, the rest one flagged call.
TEST(ToolCallTest, MalformedCallsAreFlaggedNotDropped) {
  for (const std::string body :
       {"{\"name\": \"calculator\", \"arguments\": {\"expression\": ", "[1, 2]", "{\"arguments\": {}}",
        "{\"name\": \"calculator\", \"arguments\": 7}", "{\"name\": \"\"}"}) {
    const Action a = ParseAction("<tool_call>" + body + "</tool_call>", ToolCallFormat::kHermes, 0);
    ASSERT_EQ(a.tool_calls.size(), 1u) << body;
    EXPECT_FALSE(a.tool_calls[0].error.empty()) << body;
    EXPECT_TRUE(a.tool_calls[0].arguments.empty()) << body;
  }
  const Action open = ParseAction("x <tool_call>{\"name\": \"calculator\"", ToolCallFormat::kHermes, 0);
  ASSERT_EQ(open.tool_calls.size(), 1u);
  EXPECT_NE(open.tool_calls[0].error.find("without its </tool_call>"), std::string::npos) << open.tool_calls[0].error;
  std::string many;
  for (int i = 0; i < 1000; ++i) many += "<tool_call>{\"name\": \"calculator\", \"arguments\": {}}</tool_call>";
  const Action flood = ParseAction(many, ToolCallFormat::kHermes, 1);
  ASSERT_EQ(flood.tool_calls.size(), kMaxToolCalls + 1);
  EXPECT_TRUE(flood.tool_calls[kMaxToolCalls - 1].error.empty());
  EXPECT_NE(flood.tool_calls.back().error.find("968 more"), std::string::npos) << flood.tool_calls.back().error;
}

// Llama 3's JSON calls: the whole turn one object (after <|python_tag|> or
// not), "parameters" or "arguments"; prose and non-call JSON are no call;
// a broken call is flagged.
TEST(ToolCallTest, Llama3JsonCalls) {
  Action a = ParseAction("<|python_tag|>{\"name\": \"calculator\", \"parameters\": {\"expression\": \"2+2\"}}",
                         ToolCallFormat::kLlama3, 0);
  ASSERT_EQ(a.tool_calls.size(), 1u);
  EXPECT_EQ(a.tool_calls[0].name, "calculator");
  EXPECT_EQ(json::parse(a.tool_calls[0].arguments), json({{"expression", "2+2"}}));
  a = ParseAction(" {\"name\": \"f\", \"arguments\": {}} ", ToolCallFormat::kLlama3, 0);
  ASSERT_EQ(a.tool_calls.size(), 1u);
  EXPECT_EQ(a.tool_calls[0].arguments, "{}");
  EXPECT_TRUE(ParseAction("It is 4.", ToolCallFormat::kLlama3, 0).tool_calls.empty());
  EXPECT_TRUE(ParseAction("{\"answer\": 4}", ToolCallFormat::kLlama3, 0).tool_calls.empty());
  a = ParseAction("{\"name\": \"calculator\", \"parameters\": {", ToolCallFormat::kLlama3, 0);
  ASSERT_EQ(a.tool_calls.size(), 1u);
  EXPECT_FALSE(a.tool_calls[0].error.empty());
  EXPECT_EQ(ParseToolCallFormat("hermes").value(), ToolCallFormat::kHermes);
  EXPECT_STREQ(ToolCallFormatName(ToolCallFormat::kLlama3), "llama3");
  EXPECT_EQ(ParseToolCallFormat("qwen").status().code(), StatusCode::kInvalidArgument);
}

// Exact integer arithmetic; every overflow, inexact division and malformed
// or oversized expression refused with a reason. Fails if precedence,
// unary signs or an overflow check is wrong.
TEST(CalculatorTest, ExactOrRefusedWithAReason) {
  EXPECT_EQ(EvaluateArithmetic("1 + 2 * 3").value(), 7);
  EXPECT_EQ(EvaluateArithmetic("(1 + 2) * 3").value(), 9);
  EXPECT_EQ(EvaluateArithmetic("-4 - -6").value(), 2);
  EXPECT_EQ(EvaluateArithmetic("84 / 4 / 3").value(), 7);
  EXPECT_EQ(EvaluateArithmetic("123456789 * 987654321").value(), 121932631112635269);
  EXPECT_EQ(EvaluateArithmetic("9223372036854775807").value(), INT64_MAX);
  EXPECT_EQ(EvaluateArithmetic("-9223372036854775807 - 1").value(), INT64_MIN);
  for (const char* overflow : {"9223372036854775808", "9223372036854775807 + 1", "4294967296 * 4294967296",
                               "(-9223372036854775807 - 1) / -1", "-(-9223372036854775807 - 1)"}) {
    EXPECT_EQ(EvaluateArithmetic(overflow).status().code(), StatusCode::kOutOfRange) << overflow;
  }
  EXPECT_EQ(EvaluateArithmetic("7 / 0").status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(EvaluateArithmetic("7 / 2").status().code(), StatusCode::kOutOfRange);
  for (const char* bad : {"", "1 +", "(1 + 2", "1 2", "2 ** 3", "x", "1e3", "3.5"}) {
    const Status st = EvaluateArithmetic(bad).status();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find("at character"), std::string::npos) << st.ToString();
  }
  EXPECT_EQ(EvaluateArithmetic(std::string(40, '(') + "1" + std::string(40, ')')).status().code(),
            StatusCode::kOutOfRange);
  EXPECT_EQ(EvaluateArithmetic(std::string(200, '-') + "1").status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(EvaluateArithmetic(std::string(kMaxExpressionBytes + 1, '1')).status().code(), StatusCode::kOutOfRange);
}

// The built-in calculator environment: the row's prompt with the tool
// offered; each call answered in order (its value, or why not); a turn
// without calls ends the episode for the task's reward.
TEST(CalculatorEnvironmentTest, AnswersEachCallAndEndsOnATurnWithout) {
  std::unique_ptr<Environment> env = MakeCalculatorEnvironment();
  EXPECT_EQ(env->Reset("[1]").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(env->Reset("{\"question\": \"?\"}").status().code(), StatusCode::kInvalidArgument);
  Result<Opening> opening = env->Reset("{\"prompt\": \"What is 1234 * 5678?\", \"answer\": \"7006652\"}");
  ASSERT_TRUE(opening.ok()) << opening.status().ToString();
  ASSERT_EQ(opening->messages.size(), 1u);
  EXPECT_EQ(opening->messages[0].role, "user");
  EXPECT_EQ(opening->messages[0].content, "What is 1234 * 5678?");
  const json tools = json::parse(opening->tools);
  ASSERT_TRUE(tools.is_array() && tools.size() == 1);
  EXPECT_EQ(tools[0]["function"]["name"], "calculator");

  const Action turn = ParseAction(
      "<tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": \"1234 * 5678\"}}</tool_call>"
      "<tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": \"1 / 0\"}}</tool_call>"
      "<tool_call>{\"name\": \"web\", \"arguments\": {}}</tool_call><tool_call>oops</tool_call>"
      "<tool_call>{\"name\": \"calculator\", \"arguments\": {\"expr\": \"1\"}}</tool_call>",
      ToolCallFormat::kHermes, 1);
  Result<StepResult> step = env->Step(turn);
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  EXPECT_FALSE(step->done);
  EXPECT_FALSE(step->reward.has_value());
  ASSERT_EQ(step->messages.size(), 5u);
  EXPECT_EQ(step->messages[0].role, "tool");
  EXPECT_EQ(step->messages[0].content, "7006652");
  EXPECT_EQ(step->messages[0].tool_call_id, "call_1_0");
  EXPECT_NE(step->messages[1].content.find("division by zero"), std::string::npos);
  EXPECT_NE(step->messages[2].content.find("no tool 'web'"), std::string::npos);
  EXPECT_NE(step->messages[3].content.find("not a JSON object"), std::string::npos);
  EXPECT_NE(step->messages[4].content.find("\"expression\""), std::string::npos);
  EXPECT_EQ(step->messages[4].tool_call_id, "call_1_4");
  step = env->Step(ParseAction("The product is 7006652.", ToolCallFormat::kHermes, 2));
  ASSERT_TRUE(step.ok());
  EXPECT_TRUE(step->done);
  EXPECT_TRUE(step->messages.empty());
}

}  // namespace
}  // namespace sluice::agent
