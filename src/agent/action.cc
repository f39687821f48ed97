// Reading the tool calls of a model's turn (action.h).
#include "sluice/agent/action.h"

#include <iterator>
#include <nlohmann/json.hpp>

#include "sluice/common/enum_names.h"

namespace sluice::agent {
namespace {

using nlohmann::json;

constexpr const char* kFormatNames[] = {"hermes", "llama3"};
static_assert(std::size(kFormatNames) == static_cast<size_t>(ToolCallFormat::kLlama3) + 1);

constexpr std::string_view kOpen = "<tool_call>", kClose = "</tool_call>", kPythonTag = "<|python_tag|>";

std::string_view Trim(std::string_view s) {
  const size_t first = s.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return {};
  const size_t last = s.find_last_not_of(" \t\r\n");
  return s.substr(first, last - first + 1);
}

// A quoted excerpt of what the model wrote, for an error.
std::string Excerpt(std::string_view s) {
  constexpr size_t kMost = 80;
  std::string out = "'" + std::string(s.substr(0, kMost)) + (s.size() > kMost ? "...'" : "'");
  return out;
}

// The call written as `text`, parsed as `j`: an object with a string "name"
// and its arguments under `arguments_key` (an object, or a string holding one).
ToolCall ReadCall(const json& j, std::string_view text, const char* arguments_key) {
  ToolCall call;
  if (j.is_discarded() || !j.is_object()) {
    call.error = "the tool call is not a JSON object: " + Excerpt(text);
    return call;
  }
  const auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get<std::string>().empty()) {
    call.error = "the tool call names no tool (a string \"name\"): " + Excerpt(text);
    return call;
  }
  call.name = name->get<std::string>();
  const auto args = j.find(arguments_key);
  if (args == j.end() || args->is_null()) {
    call.arguments = "{}";
    return call;
  }
  json value = *args;
  if (value.is_string()) {
    const std::string inner = value.get<std::string>();
    value = json::parse(inner, nullptr, /*allow_exceptions=*/false);
  }
  if (value.is_discarded() || !value.is_object()) {
    call.error = std::string("the tool call's \"") + arguments_key + "\" is not a JSON object";
    return call;
  }
  call.arguments = value.dump();
  return call;
}

json ParseJson(std::string_view text) { return json::parse(text.begin(), text.end(), nullptr, false); }

void ReadHermes(std::string_view text, std::vector<ToolCall>* calls, size_t* unread) {
  for (size_t at = text.find(kOpen); at != std::string_view::npos; at = text.find(kOpen, at)) {
    const size_t body = at + kOpen.size();
    const size_t close = text.find(kClose, body);
    if (calls->size() >= kMaxToolCalls) {
      ++*unread;
    } else if (close == std::string_view::npos) {
      ToolCall call;
      call.error = "a <tool_call> without its </tool_call>: " + Excerpt(text.substr(at));
      calls->push_back(std::move(call));
    } else {
      const std::string_view call = Trim(text.substr(body, close - body));
      calls->push_back(ReadCall(ParseJson(call), call, "arguments"));
    }
    if (close == std::string_view::npos) break;
    at = close + kClose.size();
  }
}

void ReadLlama3(std::string_view text, std::vector<ToolCall>* calls) {
  std::string_view rest = Trim(text);
  if (rest.substr(0, kPythonTag.size()) == kPythonTag) rest = Trim(rest.substr(kPythonTag.size()));
  if (rest.empty() || rest.front() != '{') return;  // prose: no call
  const json j = ParseJson(rest);
  // A JSON object that is not a call ({"answer": 3}) is the model's text.
  if (!j.is_discarded() && (!j.is_object() || !j.contains("name"))) return;
  calls->push_back(ReadCall(j, rest, !j.is_discarded() && j.contains("arguments") ? "arguments" : "parameters"));
}

}  // namespace

Result<ToolCallFormat> ParseToolCallFormat(std::string_view name) {
  if (std::optional<ToolCallFormat> f = EnumNamed<ToolCallFormat>(kFormatNames, name)) return *f;
  return Status::InvalidArgument("tool-call format '" + std::string(name) + "' is not one of {hermes, llama3}");
}

const char* ToolCallFormatName(ToolCallFormat format) { return EnumName(kFormatNames, format); }

Action ParseAction(std::string_view text, ToolCallFormat format, int64_t turn) {
  Action action;
  action.content = std::string(text);
  size_t unread = 0;
  switch (format) {
    case ToolCallFormat::kHermes:
      ReadHermes(text, &action.tool_calls, &unread);
      break;
    case ToolCallFormat::kLlama3:
      ReadLlama3(text, &action.tool_calls);
      break;
  }
  if (unread > 0) {
    ToolCall call;
    call.error = std::to_string(unread) + " more tool call(s) past the limit of " + std::to_string(kMaxToolCalls) +
                 " in one turn were not read";
    action.tool_calls.push_back(std::move(call));
  }
  for (size_t i = 0; i < action.tool_calls.size(); ++i) {
    action.tool_calls[i].id = "call_" + std::to_string(turn) + "_" + std::to_string(i);
  }
  return action;
}

}  // namespace sluice::agent
