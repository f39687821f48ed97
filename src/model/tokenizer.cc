#include "sluice/model/tokenizer.h"

namespace sluice::model {

namespace {

// Bytes a UTF-8 sequence starting with `lead` has (0: not a lead byte).
int SequenceLength(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

}  // namespace

std::string DecodeKnown(const Tokenizer& tokenizer, const std::vector<TokenId>& ids, bool skip_special) {
  std::vector<TokenId> known;
  known.reserve(ids.size());
  for (TokenId id : ids) {
    if (tokenizer.Knows(id)) known.push_back(id);
  }
  auto text = tokenizer.Decode(known, skip_special);
  return text.ok() ? *text : std::string();
}

Result<std::string> StreamingDecoder::DecodeRange(size_t begin, size_t end) const {
  return tokenizer_.Decode(
      std::vector<TokenId>(ids_.begin() + static_cast<ptrdiff_t>(begin), ids_.begin() + static_cast<ptrdiff_t>(end)),
      skip_special_);
}

Result<std::string> StreamingDecoder::Push(TokenId id) {
  ids_.push_back(id);
  Result<std::string> full = DecodeRange(prefix_, ids_.size());
  if (!full.ok()) {
    ids_.pop_back();
    return full.status();
  }
  SLUICE_ASSIGN_OR_RETURN(std::string out, DecodeRange(prefix_, read_));
  if (full->size() <= out.size()) return std::string();
  // Hold back while the text ends inside a character or with U+FFFD.
  const std::string& text = *full;
  const size_t n = text.size();
  if (n >= 3 && text.compare(n - 3, 3, "\xEF\xBF\xBD") == 0) return std::string();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const unsigned char c = static_cast<unsigned char>(text[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    if (SequenceLength(c) > static_cast<int>(back)) return std::string();
    break;
  }
  std::string added = text.substr(out.size());
  prefix_ = read_;
  read_ = ids_.size();
  return added;
}

std::string StreamingDecoder::Finish() {
  Result<std::string> full = DecodeRange(prefix_, ids_.size());
  Result<std::string> out = DecodeRange(prefix_, read_);
  prefix_ = read_ = ids_.size();
  if (!full.ok() || !out.ok() || full->size() <= out->size()) return std::string();
  return full->substr(out->size());
}

Result<std::vector<TokenId>> ByteTokenizer::Encode(std::string_view text) const {
  std::vector<TokenId> ids;
  ids.reserve(text.size());
  for (char c : text) ids.push_back(static_cast<TokenId>(static_cast<unsigned char>(c)));
  return ids;
}

Result<std::string> ByteTokenizer::Decode(const std::vector<TokenId>& ids, bool skip_special) const {
  std::string out;
  out.reserve(ids.size());
  for (TokenId id : ids) {
    if (id < 0 || id >= kVocabSize) {
      return Status::OutOfRange("token id " + std::to_string(id) + " is outside the byte vocabulary [0, " +
                                std::to_string(kVocabSize) + ")");
    }
    if (id < 256) {
      out.push_back(static_cast<char>(id));
    } else if (!skip_special) {
      out += id == kPad ? "<pad>" : id == kBos ? "<bos>" : "<eos>";
    }
  }
  return out;
}

}  // namespace sluice::model
