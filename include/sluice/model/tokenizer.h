// Tokenizers turn text into token ids and back. The built-in ByteTokenizer
// maps each UTF-8 byte to its own id (0..255) plus three special tokens; a
// BPE tokenizer read from `tokenizer.json` can implement the same interface.
//
// Thread safety: implementations are immutable after construction; all
// methods are const and may be called concurrently.
#ifndef SLUICE_MODEL_TOKENIZER_H_
#define SLUICE_MODEL_TOKENIZER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/common/status.h"

namespace sluice::model {

using TokenId = int32_t;

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Errors (a Hugging Face tokenizer): ResourceExhausted when a
  // pre-tokenizer's regex engine gives up on the text (never a silent
  // change of the ids).
  virtual Result<std::vector<TokenId>> Encode(std::string_view text) const = 0;
  // Errors: OutOfRange for an id outside the vocabulary.
  virtual Result<std::string> Decode(const std::vector<TokenId>& ids, bool skip_special = true) const = 0;
  virtual int64_t vocab_size() const = 0;
  // Whether `id` is a token (the vocabulary may have unused ids).
  virtual bool Knows(TokenId id) const = 0;
  virtual TokenId bos_id() const = 0;
  virtual TokenId eos_id() const = 0;
  virtual TokenId pad_id() const = 0;
};

// Decodes `ids`, leaving out those the tokenizer does not know, as Hugging
// Face's decode does: a model's vocabulary is often padded past its
// tokenizer's, and a model can sample those ids.
std::string DecodeKnown(const Tokenizer& tokenizer, const std::vector<TokenId>& ids, bool skip_special = true);

// Decodes ids as they are generated: each Push returns the text its token
// completes, holding back text that the next tokens may still change: a
// trailing incomplete UTF-8 sequence (a byte-level token often ends inside a
// character) or a trailing U+FFFD (a byte-fallback token run not finished
// yet). It decodes a short window of recent ids and returns what the newest
// ones add, so decoders that look at neighbouring tokens (Strip, ByteFallback)
// give the same text as decoding everything at once.
class StreamingDecoder {
 public:
  explicit StreamingDecoder(const Tokenizer& tokenizer, bool skip_special = true)
      : tokenizer_(tokenizer), skip_special_(skip_special) {}
  // Errors: OutOfRange for an id outside the vocabulary (nothing is consumed).
  Result<std::string> Push(TokenId id);
  // What is still held back at the very end.
  std::string Finish();

 private:
  Result<std::string> DecodeRange(size_t begin, size_t end) const;

  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::vector<TokenId> ids_;
  size_t prefix_ = 0;  // the window's start: ids before it are out for good
  size_t read_ = 0;    // ids_[prefix_, read_) are out; ids_[read_, end) are held back
};

class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr TokenId kPad = 256;
  static constexpr TokenId kBos = 257;
  static constexpr TokenId kEos = 258;
  static constexpr int64_t kVocabSize = 259;

  Result<std::vector<TokenId>> Encode(std::string_view text) const override;  // never fails
  Result<std::string> Decode(const std::vector<TokenId>& ids, bool skip_special = true) const override;
  int64_t vocab_size() const override { return kVocabSize; }
  bool Knows(TokenId id) const override { return id >= 0 && id < kVocabSize; }
  TokenId bos_id() const override { return kBos; }
  TokenId eos_id() const override { return kEos; }
  TokenId pad_id() const override { return kPad; }
};

}  // namespace sluice::model

#endif  // SLUICE_MODEL_TOKENIZER_H_
