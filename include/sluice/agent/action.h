// The model's side of a multi-turn conversation as an environment sees it:
// the messages of the conversation, the tool calls the model wrote in its
// turn, and how each model family writes them.
//
// Thread safety: values and pure functions.
#ifndef SLUICE_AGENT_ACTION_H_
#define SLUICE_AGENT_ACTION_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/common/status.h"

namespace sluice::agent {

// A message of a conversation, as the chat template renders it.
struct Message {
  std::string role;  // system, user, assistant, tool
  std::string content;
  std::string tool_call_id;  // role tool: the call it answers
};

// A tool call the model wrote in its turn.
struct ToolCall {
  std::string id;         // unique in the trajectory: "call_<turn>_<index>"
  std::string name;       // "" when the call names no tool (see error)
  std::string arguments;  // a JSON object as text; "" when the call has none that is one (see error)
  std::string error;      // "" for a well-formed call, else what is wrong with it
};

// The model's turn: its text as sampled (tool-call markup included) and the
// calls read from it.
struct Action {
  std::string content;
  std::vector<ToolCall> tool_calls;
};

// How a model family writes tool calls.
enum class ToolCallFormat {
  // <tool_call>{"name": ..., "arguments": {...}}</tool_call>, a block per
  // call anywhere in the turn: Qwen2.5, Qwen3 and Sluice's built-in template.
  kHermes,
  // The whole turn one JSON object {"name": ..., "parameters": {...}},
  // optionally after <|python_tag|>: Llama 3.1-3.3's JSON tool calling.
  kLlama3,
};
// "hermes", "llama3"; InvalidArgument naming the known ones.
Result<ToolCallFormat> ParseToolCallFormat(std::string_view name);
const char* ToolCallFormatName(ToolCallFormat format);

// Calls read from one turn at most; more become one call whose error says
// how many were not read.
inline constexpr size_t kMaxToolCalls = 32;

// The tool calls of a turn's text (turn: its index in the trajectory, for
// the calls' ids). Never fails: a call that cannot be read comes back with
// its `error` set, for the environment to answer and the caller to count.
// Arguments written as a JSON string holding an object are accepted.
Action ParseAction(std::string_view text, ToolCallFormat format, int64_t turn);

}  // namespace sluice::agent

#endif  // SLUICE_AGENT_ACTION_H_
