#include "sluice/model/chat_template.h"

// The chat template's front: loading it from a model directory and rendering
// it. The language itself lives in chat_template/: values.h (Jinja's and
// Python's values), lexer.h, ast.h, parser.h and interpreter.h.
#include <ctime>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bounded_json.h"
#include "chat_template/interpreter.h"
#include "chat_template/lexer.h"
#include "chat_template/parser.h"
#include "chat_template/values.h"
#include "sluice/common/file_util.h"

namespace sluice::model {

namespace {

using Json = nlohmann::ordered_json;

Result<std::string> ReadFile(const std::filesystem::path& path) { return ReadFileToString(path.string()); }

}  // namespace

struct ChatTemplate::Program {
  jinja::Body body;
  std::shared_ptr<const Program> tool_use;  // a {name: "tool_use"} template, for contexts with tools
};

Result<ChatTemplate> ChatTemplate::Parse(std::string_view source) {
  // Checked once here, so that everything after may assume valid UTF-8.
  for (size_t i = 0; i < source.size();) {
    const size_t start = i;
    if (jinja::NextCodePoint(source, &i) == 0xFFFD && source.compare(start, 3, "\xEF\xBF\xBD") != 0) {
      return Status::InvalidArgument("chat template: not valid UTF-8 at byte " + std::to_string(start));
    }
  }
  SLUICE_ASSIGN_OR_RETURN(std::vector<jinja::Token> tokens, jinja::Lex(source));
  auto program = std::make_shared<Program>();
  SLUICE_ASSIGN_OR_RETURN(program->body, jinja::ParseTemplate(std::move(tokens)));
  ChatTemplate t;
  t.program_ = std::move(program);
  return t;
}

Result<ChatTemplate> ChatTemplate::Load(const std::string& model_dir) {
  const std::filesystem::path dir(model_dir);
  const std::filesystem::path path = dir / "tokenizer_config.json";
  SLUICE_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  SLUICE_ASSIGN_OR_RETURN(const Json config, ParseBoundedJson<Json>(text, path.string()));
  if (config.is_discarded() || !config.is_object()) {
    return Status::InvalidArgument(path.string() + ": not a JSON object");
  }
  auto parse = [](const std::string& source, const std::string& origin) -> Result<ChatTemplate> {
    Result<ChatTemplate> t = Parse(source);
    if (!t.ok()) return t.status().WithContext(origin);
    return t;
  };
  std::optional<ChatTemplate> chosen;
  const std::filesystem::path jinja = dir / "chat_template.jinja";
  std::error_code error;
  if (std::filesystem::exists(jinja, error)) {  // transformers prefers it to the config's
    SLUICE_ASSIGN_OR_RETURN(std::string source, ReadFile(jinja));
    SLUICE_ASSIGN_OR_RETURN(chosen, parse(source, jinja.string()));
  } else {
    const auto ct = config.find("chat_template");
    if (ct == config.end() || ct->is_null()) return Status::NotFound(path.string() + ": no chat_template");
    if (ct->is_string()) {
      SLUICE_ASSIGN_OR_RETURN(chosen, parse(ct->get<std::string>(), path.string()));
    } else if (ct->is_array()) {
      std::optional<ChatTemplate> tool_use;
      for (const Json& entry : *ct) {
        if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
            !entry.contains("template") || !entry["template"].is_string()) {
          return Status::InvalidArgument(path.string() + ": chat_template entries must be {\"name\", \"template\"}");
        }
        const std::string name = entry["name"].get<std::string>();
        if (name != "default" && name != "tool_use") continue;
        SLUICE_ASSIGN_OR_RETURN(ChatTemplate t,
                                parse(entry["template"].get<std::string>(), path.string() + " (" + name + ")"));
        (name == "default" ? chosen : tool_use) = std::move(t);
      }
      if (!chosen) return Status::NotFound(path.string() + ": chat_template has no \"default\" entry");
      if (tool_use) {
        auto program = std::make_shared<Program>(*chosen->program_);
        program->tool_use = tool_use->program_;
        chosen->program_ = std::move(program);
      }
    } else {
      return Status::InvalidArgument(path.string() + ": chat_template is neither a string nor a list");
    }
  }
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
    SLUICE_ASSIGN_OR_RETURN(std::optional<std::string> token, SpecialTokenText(config, key, path.string()));
    if (token) chosen->special_tokens_[key] = *token;
  }
  return std::move(*chosen);
}

Result<std::string> ChatTemplate::Render(const nlohmann::ordered_json& context) const {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);  // datetime.now(): local time, as transformers formats it
  return RenderAt(context, local);
}

Result<std::string> ChatTemplate::Render(const nlohmann::ordered_json& context, const std::tm& now) const {
  std::tm normalized = now;
  timegm(&normalized);  // fills in the weekday and the day of the year from the date
  return RenderAt(context, normalized);
}

Result<std::string> ChatTemplate::RenderAt(const nlohmann::ordered_json& context, const std::tm& now) const {
  if (!context.is_object()) return Status::InvalidArgument("chat template context: not a JSON object");
  if (!program_) return Status::FailedPrecondition("chat template: rendering an empty ChatTemplate");
  const auto tools = context.find("tools");
  const bool with_tools = tools != context.end() && !tools->is_null();
  const Program& program = with_tools && program_->tool_use ? *program_->tool_use : *program_;
  // What apply_chat_template passes besides the caller's variables (later
  // ones win).
  std::vector<std::pair<std::string, jinja::Value>> globals = {
      {"tools", jinja::NoneValue()}, {"documents", jinja::NoneValue()}, {"add_generation_prompt", jinja::Bool(false)}};
  for (const auto& [key, value] : special_tokens_.items()) {
    globals.emplace_back(key, jinja::Str(value.get<std::string>()));
  }
  for (const auto& [key, value] : context.items()) {
    SLUICE_ASSIGN_OR_RETURN(jinja::Value v, jinja::FromJson(value, 0));
    globals.emplace_back(key, std::move(v));
  }
  std::string out;
  SLUICE_RETURN_IF_ERROR(jinja::Render(program.body, globals, now, &out));
  return out;
}

Result<std::string> PromptFormat::Apply(const std::string& prompt) const {
  if (!chat) return prompt;
  nlohmann::ordered_json context = variables.is_object() ? variables : nlohmann::ordered_json::object();
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
  messages.push_back({{"role", "user"}, {"content", prompt}});
  context["messages"] = std::move(messages);
  context["add_generation_prompt"] = true;
  return chat->Render(context);
}

}  // namespace sluice::model
