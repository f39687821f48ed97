// Tokenizers in the Hugging Face `tokenizer.json` format: byte-level BPE as
// GPT-2, Qwen2/2.5/3 and Llama 3 use it, and SentencePiece-style BPE with
// byte fallback as Llama 2 and Mistral's models use it (with a Prepend /
// Replace normalizer, or a Metaspace pre-tokenizer).
//
// Supported components (anything else is refused by name when loading):
//   normalizer     null, NFC, Prepend, Replace with a String pattern, or a
//                  Sequence of them
//   pre_tokenizer  ByteLevel (with or without GPT-2's regex), Split with a
//                  Regex or String pattern (behaviour Isolated or Removed,
//                  not inverted), Metaspace (SentencePiece-style only), or a
//                  Sequence of them; regexes run on PCRE2 with Unicode
//                  properties, as the Rust library's onig does. Metaspace
//                  turns spaces into its replacement character, puts one
//                  before a piece that does not start with it (every piece
//                  for prepend_scheme "always", only one that starts the
//                  input text for "first", none for "never"; the older
//                  add_prefix_space true/false means always/never) and with
//                  split starts a new piece at each replacement, as the Rust
//                  library does
//   model          BPE with ranked merges ("a b" strings or ["a", "b"]
//                  pairs), ignore_merges, unk_token with fuse_unk, no subword
//                  prefix or suffix; byte-level (a ByteLevel or no decoder)
//                  or SentencePiece-style (byte_fallback to <0xXX> tokens,
//                  or any other decoder): characters are the symbols and one
//                  outside the vocabulary becomes its bytes' tokens or unk
//   decoder        ByteLevel (or null) for byte-level; Replace (String),
//                  ByteFallback, Fuse, Strip and Metaspace, or a Sequence of
//                  them, for SentencePiece-style. Metaspace turns its
//                  replacement back into spaces, except in the first token,
//                  which loses them all unless prepend_scheme is "never"
//   added_tokens   matched in the raw text before anything else, leftmost
//                  and longest first, with lstrip, rstrip and single_word;
//                  the text between them is normalized piece by piece, as
//                  the Rust library does (so Llama 2's Prepend("▁") starts
//                  every piece). The Rust library matches a token with
//                  `normalized` true in normalized text: the same for
//                  byte-level tokenizers (NFC leaves token texts as they
//                  are); with a SentencePiece-style normalizer it is refused
// Encode adds no special tokens (no post-processor): prompts and chat
// templates carry the ones they need as text.
//
// Thread safety: immutable after Load; every method may be called
// concurrently.
#ifndef SLUICE_MODEL_HF_TOKENIZER_H_
#define SLUICE_MODEL_HF_TOKENIZER_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/common/status.h"
#include "sluice/model/tokenizer.h"

namespace sluice::model {

class HfTokenizer final : public Tokenizer {
 public:
  // Reads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json
  // (bos_token, eos_token, pad_token). Errors: NotFound (no tokenizer.json),
  // InvalidArgument naming the file and the key (malformed JSON, a merge of
  // tokens not in the vocabulary, an id out of range, a bad regex),
  // Unimplemented naming a component type this class does not support.
  static Result<std::unique_ptr<HfTokenizer>> Load(const std::string& dir);
  // The same from the files' text; `origin` names them in errors.
  static Result<std::unique_ptr<HfTokenizer>> FromJson(const std::string& tokenizer_json,
                                                       const std::string& config_json, const std::string& origin);
  ~HfTokenizer() override;

  // Errors: ResourceExhausted (naming tokenizer.json) when a regex of its
  // pre-tokenizers hits the engine's match, depth or memory limits.
  Result<std::vector<TokenId>> Encode(std::string_view text) const override;
  // Concatenates the tokens' bytes; special added tokens are left out when
  // skip_special. Errors: OutOfRange for an id outside the vocabulary.
  Result<std::string> Decode(const std::vector<TokenId>& ids, bool skip_special = true) const override;
  int64_t vocab_size() const override;
  bool Knows(TokenId id) const override;
  TokenId bos_id() const override;
  TokenId eos_id() const override;
  TokenId pad_id() const override;
  // The id of a token's exact text (a vocabulary entry or an added token), or -1.
  TokenId TokenToId(std::string_view token) const;

  struct Impl;

 private:
  explicit HfTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The tokenizer of a model directory: its tokenizer.json when it has one,
// else (and for an empty `model_dir`) the built-in byte tokenizer.
Result<std::shared_ptr<const Tokenizer>> LoadTokenizer(const std::string& model_dir);

// Copies tokenizer.json and tokenizer_config.json from `from_dir` into
// `to_dir` where they exist (nothing for an empty `from_dir`), so a
// checkpoint keeps the tokenizer of the model it came from.
Status CopyTokenizerFiles(const std::string& from_dir, const std::string& to_dir);

}  // namespace sluice::model

#endif  // SLUICE_MODEL_HF_TOKENIZER_H_
