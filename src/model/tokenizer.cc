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

Result<std::string> StreamingDecoder::Push(TokenId id) {
  SLUICE_ASSIGN_OR_RETURN(std::string bytes, tokenizer_.Decode({id}, skip_special_));
  pending_ += bytes;
  // Hold back the last sequence if its lead byte promises more bytes than
  // have arrived; a sequence can be at most 4 bytes, so look at the last 3.
  size_t keep = 0;
  const size_t n = pending_.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const unsigned char c = static_cast<unsigned char>(pending_[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const int length = SequenceLength(c);
    if (length > static_cast<int>(back)) keep = back;
    break;
  }
  std::string out = pending_.substr(0, n - keep);
  pending_.erase(0, n - keep);
  return out;
}

std::string StreamingDecoder::Finish() {
  std::string out;
  out.swap(pending_);
  return out;
}

std::vector<TokenId> ByteTokenizer::Encode(std::string_view text) const {
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
