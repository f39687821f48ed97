#include "sluice/model/chat_format.h"

#include <filesystem>

#include "sluice/model/hf_tokenizer.h"

namespace sluice::model {

namespace {

// The byte tokenizer's end-of-sequence token as the built-in template writes it.
constexpr std::string_view kBuiltinEos = "<eos>";

}  // namespace

const char* BuiltinChatTemplate() {
  return R"JINJA({%- if tools -%}
{{- 'tools: ' -}}
{%- for tool in tools -%}
{{- (tool.function.name if tool.function is defined else tool.name) ~ (', ' if not loop.last else '') -}}
{%- endfor -%}
{{- '\n' -}}
{%- endif -%}
{%- for message in messages -%}
{%- if message.role == 'assistant' -%}
{{- 'assistant: ' ~ (message.content if message.content is string else '') -}}
{%- if message.tool_calls is defined and message.tool_calls -%}
{%- for call in message.tool_calls -%}
{%- set f = call.function if call.function is defined else call -%}
{{- '<tool_call>{"name": ' ~ (f.name | tojson) ~ ', "arguments": ' ~ (f.arguments if f.arguments is string else (f.arguments | tojson)) ~ '}</tool_call>' -}}
{%- endfor -%}
{%- endif -%}
{{- '<eos>' -}}
{%- elif message.role in ['system', 'user', 'tool'] -%}
{{- message.role ~ ': ' ~ (message.content if message.content is string else '') ~ '\n' -}}
{%- else -%}
{{- raise_exception('the built-in chat template has no role ' ~ message.role) -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- 'assistant: ' -}}
{%- endif -%})JINJA";
}

ChatFormat::ChatFormat(std::shared_ptr<const ChatTemplate> chat, std::shared_ptr<const Tokenizer> tokenizer,
                       bool builtin)
    : template_(std::move(chat)), tokenizer_(std::move(tokenizer)), builtin_(builtin) {}

ChatFormat ChatFormat::Builtin() {
  static const std::shared_ptr<const ChatTemplate> builtin = [] {
    Result<ChatTemplate> parsed = ChatTemplate::Parse(BuiltinChatTemplate());
    if (!parsed.ok()) std::abort();  // a constant; its test parses it
    return std::make_shared<const ChatTemplate>(std::move(parsed).value());
  }();
  return ChatFormat(builtin, std::make_shared<ByteTokenizer>(), /*builtin=*/true);
}

Result<ChatFormat> ChatFormat::Load(const std::string& model_dir) {
  std::error_code ec;
  if (model_dir.empty() || !std::filesystem::exists(std::filesystem::path(model_dir) / "tokenizer.json", ec)) {
    return Builtin();
  }
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<HfTokenizer> tokenizer, HfTokenizer::Load(model_dir));
  Result<ChatTemplate> chat = ChatTemplate::Load(model_dir);
  if (chat.status().code() == StatusCode::kNotFound) {
    return Status::FailedPrecondition(model_dir +
                                      " has a tokenizer.json but no chat template (chat_template.jinja "
                                      "or tokenizer_config.json's chat_template): conversations need one");
  }
  if (!chat.ok()) return chat.status();
  return ChatFormat(std::make_shared<const ChatTemplate>(std::move(chat).value()),
                    std::shared_ptr<const Tokenizer>(std::move(tokenizer)), /*builtin=*/false);
}

Result<std::string> ChatFormat::Render(const nlohmann::ordered_json& context) const {
  return template_->Render(context);
}

Result<std::vector<TokenId>> ChatFormat::Encode(std::string_view rendered) const {
  if (!builtin_) return tokenizer_->Encode(rendered);
  std::vector<TokenId> ids;
  ids.reserve(rendered.size());
  for (size_t at = 0; at <= rendered.size();) {
    const size_t hit = rendered.find(kBuiltinEos, at);
    const size_t end = hit == std::string_view::npos ? rendered.size() : hit;
    SLUICE_ASSIGN_OR_RETURN(const std::vector<TokenId> text, tokenizer_->Encode(rendered.substr(at, end - at)));
    ids.insert(ids.end(), text.begin(), text.end());
    if (hit == std::string_view::npos) break;
    ids.push_back(tokenizer_->eos_id());
    at = hit + kBuiltinEos.size();
  }
  return ids;
}

Result<std::string> ChatFormat::Decode(const std::vector<TokenId>& ids) const {
  return tokenizer_->Decode(ids, /*skip_special=*/false);
}

}  // namespace sluice::model
