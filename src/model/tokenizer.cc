#include "sluice/model/tokenizer.h"

namespace sluice::model {

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
