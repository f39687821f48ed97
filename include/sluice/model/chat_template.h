// Chat templates: the `chat_template` of a model's tokenizer_config.json
// rendered as Hugging Face transformers renders it (Jinja2 with trim_blocks
// and lstrip_blocks, its `tojson` filter and `raise_exception` /
// `strftime_now` functions), for the constructs the Qwen2.5, Qwen3 and
// Llama 3.x templates use:
//   {{ }}, {% if/elif/else %}, {% for x in xs %} / {% for k, v in ... %}
//   with loop.index/index0/first/last/length, {% set %} (names and
//   namespace attributes), {# #}, whitespace control with '-';
//   literals, lists, dicts, attribute/item access, slices, + - * / // %,
//   ~, comparisons, and/or/not, in/not in, `x if c else y`, tests
//   (defined, undefined, none, string, number, integer, float, boolean,
//   mapping, iterable, sequence, true, false, callable), filters (length,
//   count, tojson, trim, string, lower, upper, capitalize, first, last,
//   join, default, items, list, reverse, replace), string methods
//   (startswith, endswith, strip, lstrip, rstrip, split, replace, upper,
//   lower, title) and dict methods (items, keys, values, get), namespace(),
//   range().
// Anything else is refused by name with its line when the template is
// parsed (macros, call blocks, includes, other filters or tests); a value
// an operation cannot take is an error naming the line when rendering.
// Undefined names are Jinja's default Undefined: falsy, empty when printed,
// `is defined` false.
//
// Thread safety: a parsed template is immutable; Render may run
// concurrently.
#ifndef SLUICE_MODEL_CHAT_TEMPLATE_H_
#define SLUICE_MODEL_CHAT_TEMPLATE_H_

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "sluice/common/status.h"

namespace sluice::model {

class ChatTemplate {
 public:
  // Parses template source. Errors: InvalidArgument naming the line and the
  // construct (an unterminated tag, an unsupported statement or filter).
  static Result<ChatTemplate> Parse(std::string_view source);

  // A model directory's tokenizer_config.json: its `chat_template` (a
  // string, or a list of {name, template} whose "default" entry is taken)
  // and its bos_token / eos_token, passed to every rendering. NotFound when
  // the directory has no tokenizer_config.json or it has no chat_template.
  static Result<ChatTemplate> Load(const std::string& model_dir);

  // Renders with `context` (a JSON object: messages, add_generation_prompt,
  // enable_thinking, tools, ... as transformers' apply_chat_template passes
  // them; bos_token / eos_token from Load unless the context sets them).
  // `today` ("YYYY-MM-DD") is the date strftime_now formats; empty: the
  // current UTC date. Errors: InvalidArgument for raise_exception (its
  // message) and for operations on values of the wrong type, naming the line.
  Result<std::string> Render(const nlohmann::ordered_json& context, const std::string& today = "") const;

  struct Node;

 private:
  std::shared_ptr<const Node> root_;
  std::string bos_token_, eos_token_;
};

// How a task's prompt text becomes the model's input text: through the
// model's chat template as the user's message (an optional system message
// first, the generation prompt after), or as it is.
struct PromptFormat {
  std::shared_ptr<const ChatTemplate> chat;                             // null: the prompt text as it is
  std::string system;                                                   // a system message, when not empty
  nlohmann::ordered_json variables = nlohmann::ordered_json::object();  // more template variables
  Result<std::string> Apply(const std::string& prompt) const;
};

}  // namespace sluice::model

#endif  // SLUICE_MODEL_CHAT_TEMPLATE_H_
