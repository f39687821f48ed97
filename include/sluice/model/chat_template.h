// Chat templates: the `chat_template` of a model's tokenizer_config.json,
// rendered as Hugging Face transformers' apply_chat_template renders it:
// Jinja2 with trim_blocks and lstrip_blocks (a single trailing newline of
// the template dropped, as Jinja does), the loop controls extension,
// Python's semantics for values, and transformers' globals and filter
// (raise_exception, strftime_now, tojson as json.dumps with
// ensure_ascii=False).
//
// Supported, a subset that covers the Qwen2.5, Qwen3 and Llama 3.x templates
// and the common constructs of others:
//   tags         {{ }}, {% %}, {# #}, whitespace control with '-' and '+'
//   statements   if/elif/else, for (one or more targets, an `if` filter,
//                else; loop.index/index0/revindex/revindex0/first/last/
//                length/previtem/nextitem/depth/cycle), break, continue,
//                set (names, tuples, namespace attributes, {% set x %}
//                blocks), generation (rendered as its body)
//   expressions  literals (strings with Python escapes, ints, floats,
//                true/false/none, lists, tuples, dicts), names, `.attr`,
//                `[item]`, slices ([::-1]), calls, + - * / // % ** ~,
//                comparisons (chained), and/or/not, in/not in,
//                `x if c else y`, `is` / `is not` tests
//   tests        defined, undefined, none, boolean, true, false, integer,
//                float, number, string, mapping, sequence, iterable,
//                callable, odd, even, divisibleby, eq/equalto/==, ne/!=,
//                lt/<, le/<=, gt/>, ge/>=, in
//   filters      abs, capitalize, count, d/default, first, float, int,
//                items, join, last, length, list, lower, map, reject,
//                rejectattr, replace, reverse, select, selectattr, string,
//                title, tojson, trim, unique, upper
//   functions    namespace, range, dict, raise_exception, strftime_now
//   methods      of strings: startswith, endswith, strip, lstrip, rstrip,
//                split, rsplit, splitlines, replace, upper, lower, title,
//                capitalize, join, find, count, removeprefix, removesuffix;
//                of dicts: items, keys, values, get
// Undefined names are Jinja's default Undefined: falsy, printed as nothing,
// iterated as empty, `is defined` false; taking an attribute or item of one
// is an error, as in Jinja. Strings are indexed, sliced and measured by
// code point, as Python does. Integers are 64-bit: an overflow is an error.
//
// Anything else is refused by name with its line and column: at Parse for a
// statement, filter, test, global function or method this class does not
// support (macros, call blocks, include, raw, ...) and for syntax errors
// (an unterminated tag, string or block); at Render for what only values
// show (an attribute of an undefined value, adding a string to a number,
// looping over a number, raise_exception). Every error is InvalidArgument.
//
// Thread safety: a parsed template is immutable; Render may run
// concurrently.
#ifndef SLUICE_MODEL_CHAT_TEMPLATE_H_
#define SLUICE_MODEL_CHAT_TEMPLATE_H_

#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "sluice/common/status.h"

namespace sluice::model {

class ChatTemplate {
 public:
  // Parses template source. Errors: InvalidArgument naming the line, column
  // and construct ("chat template line 3, column 9: filter 'indent' is not
  // supported").
  static Result<ChatTemplate> Parse(std::string_view source);

  // A model directory's chat template: chat_template.jinja when there is
  // one (transformers prefers it), else tokenizer_config.json's
  // `chat_template` (a string, or a list of {name, template} whose
  // "default" entry is taken, and whose "tool_use" entry renders contexts
  // with tools, as transformers picks them); and tokenizer_config.json's
  // bos/eos/unk/pad tokens (strings or {"content": ...}), passed to every
  // rendering as transformers passes its special tokens. NotFound when the
  // directory has no tokenizer_config.json or no chat template;
  // InvalidArgument (naming the file) for malformed JSON or a template
  // that does not parse.
  static Result<ChatTemplate> Load(const std::string& model_dir);

  // Renders with `context`, a JSON object of template variables: messages,
  // add_generation_prompt, tools, enable_thinking, ... as
  // apply_chat_template passes them (tools and documents are none and
  // add_generation_prompt false unless set; the special tokens from Load
  // unless set). strftime_now formats the current local time.
  Result<std::string> Render(const nlohmann::ordered_json& context) const;
  // The same with strftime_now formatting `now` (a local time) instead:
  // reproducible renderings for tests.
  Result<std::string> Render(const nlohmann::ordered_json& context, const std::tm& now) const;

  struct Program;

 private:
  Result<std::string> RenderAt(const nlohmann::ordered_json& context, const std::tm& now) const;

  std::shared_ptr<const Program> program_;
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();  // bos_token, ... from Load
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
