// A model's conversation format: its chat template and its tokenizer, the
// two things that turn messages into the token ids a model reads. Every
// model Sluice loads has one: a model directory with a tokenizer.json and a
// chat template uses them; the built-in models (the byte tokenizer, no
// template) use Sluice's built-in template (BuiltinChatTemplate).
//
// The built-in template, for a conversation of messages m with tools t:
//
//   tools: calculator, search\n          (when tools are offered: their names)
//   system: <content>\n                  (a system, user or tool message:
//   user: <content>\n                     its role, ": ", its content, a newline)
//   assistant: <content><eos>            (an assistant message: the model's
//                                         turn, ended by the end-of-sequence
//                                         token, and its structured tool calls,
//                                         if it has any, as
//                                         <tool_call>{"name": ..., "arguments": ...}</tool_call>)
//   assistant:                           (the generation prompt: "assistant: ")
//
// A model writes a tool call in its turn as <tool_call>{"name": "calculator",
// "arguments": {"expression": "12*34"}}</tool_call> (the markup Qwen2.5 and
// Qwen3 use); the schemas of the tools are not shown, only their names (the
// built-in models are small: every byte is a token).
//
// Thread safety: immutable after construction; everything may run
// concurrently.
#ifndef SLUICE_MODEL_CHAT_FORMAT_H_
#define SLUICE_MODEL_CHAT_FORMAT_H_

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/common/status.h"
#include "sluice/model/chat_template.h"
#include "sluice/model/tokenizer.h"

namespace sluice::model {

// The built-in template's Jinja source (see the file comment).
const char* BuiltinChatTemplate();

class ChatFormat {
 public:
  // The byte tokenizer and the built-in template.
  static ChatFormat Builtin();
  // `model_dir`'s: "" or a directory without tokenizer.json is a built-in
  // model's (Builtin()); one with tokenizer.json needs a chat template
  // (FailedPrecondition naming the directory when it has none; the errors
  // of HfTokenizer::Load and ChatTemplate::Load otherwise).
  static Result<ChatFormat> Load(const std::string& model_dir);

  // Renders a conversation (a JSON object of template variables, as
  // ChatTemplate::Render takes it).
  Result<std::string> Render(const nlohmann::ordered_json& context) const;
  // A rendering's token ids: the tokenizer's, with the built-in template's
  // "<eos>" read as the byte tokenizer's end-of-sequence token (a Hugging
  // Face tokenizer reads its special tokens in text itself).
  Result<std::vector<TokenId>> Encode(std::string_view rendered) const;
  // The text of ids, special tokens kept ("<eos>" for the byte tokenizer's).
  Result<std::string> Decode(const std::vector<TokenId>& ids) const;

  const Tokenizer& tokenizer() const { return *tokenizer_; }
  std::shared_ptr<const Tokenizer> shared_tokenizer() const { return tokenizer_; }
  const ChatTemplate& chat_template() const { return *template_; }
  bool builtin() const { return builtin_; }

 private:
  ChatFormat(std::shared_ptr<const ChatTemplate> chat, std::shared_ptr<const Tokenizer> tokenizer, bool builtin);

  std::shared_ptr<const ChatTemplate> template_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  bool builtin_ = false;
};

}  // namespace sluice::model

#endif  // SLUICE_MODEL_CHAT_FORMAT_H_
