// JSON from a model directory (tokenizer.json, tokenizer_config.json,
// config.json, a safetensors header or index) is untrusted input: a
// document nested 40,000 levels deep would overflow the stack of every
// recursive reader after the parser (the components' parsers, dump()).
// The parser itself and nlohmann's destructor are iterative.
// Also the special tokens of tokenizer_config.json, which both the
// tokenizer and the chat template read.
#ifndef SLUICE_MODEL_BOUNDED_JSON_H_
#define SLUICE_MODEL_BOUNDED_JSON_H_

#include <optional>
#include <string>
#include <string_view>

#include "sluice/common/status.h"

namespace sluice::model {

// As deep as serde_json (which the Hugging Face tokenizers library reads
// tokenizer.json with) allows by default.
inline constexpr int kMaxJsonNesting = 128;

// `text` parsed as JsonT (nlohmann::json or ordered_json); a discarded value
// when it is not valid JSON, as nlohmann's parse without exceptions returns
// (callers name that in their own words). Errors: InvalidArgument
// ("<origin>: JSON nested deeper than 128 levels").
template <typename JsonT>
Result<JsonT> ParseBoundedJson(std::string_view text, const std::string& origin) {
  bool too_deep = false;
  // `depth` is that of the value the event belongs to: 0 for the document.
  auto within = [&too_deep](int depth, typename JsonT::parse_event_t, JsonT&) {
    if (depth < kMaxJsonNesting) return true;
    too_deep = true;
    return false;  // not kept: the parse goes on over it without building it
  };
  JsonT j = JsonT::parse(text.begin(), text.end(), within, /*allow_exceptions=*/false);
  if (too_deep) {
    return Status::InvalidArgument(origin + ": JSON nested deeper than " + std::to_string(kMaxJsonNesting) + " levels");
  }
  return j;
}

// A bos/eos/unk/pad entry of tokenizer_config.json: a string, or an object
// with a string "content" (an AddedToken); absent or null (Qwen's
// bos_token): nullopt. Errors: InvalidArgument naming the key and what it
// holds (a number, a list, an object without a string content): ignoring it
// would leave the model's special token unset without a word.
template <typename JsonT>
Result<std::optional<std::string>> SpecialTokenText(const JsonT& config, const char* key, const std::string& origin) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::optional<std::string>();
  if (it->is_string()) return std::optional<std::string>(it->template get<std::string>());
  if (it->is_object()) {
    const auto content = it->find("content");
    if (content != it->end() && content->is_string()) {
      return std::optional<std::string>(content->template get<std::string>());
    }
  }
  return Status::InvalidArgument(origin + ": " + key + " must be a string or an object with a string 'content', not " +
                                 it->dump().substr(0, 80));
}

}  // namespace sluice::model

#endif  // SLUICE_MODEL_BOUNDED_JSON_H_
