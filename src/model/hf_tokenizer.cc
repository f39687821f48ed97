#include "sluice/model/hf_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

namespace sluice::model {

namespace {

using nlohmann::json;

// ------------------------------------------------------------------ UTF-8

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// The code point at text[*i] (advancing *i), or -1 for a byte that does not
// start a valid sequence (*i advances by one).
int32_t NextCodePoint(std::string_view text, size_t* i) {
  utf8proc_int32_t cp = -1;
  const utf8proc_ssize_t n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + *i),
                                              static_cast<utf8proc_ssize_t>(text.size() - *i), &cp);
  if (n <= 0) {
    *i += 1;
    return -1;
  }
  *i += static_cast<size_t>(n);
  return cp;
}

bool IsWhitespace(int32_t cp) {
  if (cp < 0) return false;
  if (cp == ' ' || (cp >= '\t' && cp <= '\r') || cp == 0x85) return true;
  const utf8proc_category_t c = utf8proc_category(cp);
  return c == UTF8PROC_CATEGORY_ZS || c == UTF8PROC_CATEGORY_ZL || c == UTF8PROC_CATEGORY_ZP;
}

bool IsWordChar(int32_t cp) {
  if (cp < 0) return false;
  if (cp == '_') return true;
  const utf8proc_category_t c = utf8proc_category(cp);
  return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) ||
         (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO);
}

// ------------------------------------------------------------ byte level

// GPT-2's reversible map of bytes to printable code points: the printable
// Latin-1 bytes stand for themselves, the other 68 take 256, 257, ... in
// byte order.
struct ByteLevelTables {
  std::array<std::string, 256> byte_to_text;
  std::unordered_map<uint32_t, uint8_t> code_point_to_byte;
  ByteLevelTables() {
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      const uint32_t cp = printable ? b : next++;
      AppendUtf8(cp, &byte_to_text[b]);
      code_point_to_byte[cp] = static_cast<uint8_t>(b);
    }
  }
};

const ByteLevelTables& ByteLevel() {
  static const ByteLevelTables tables;
  return tables;
}

// GPT-2's pre-tokenizer pattern (ByteLevel with use_regex).
constexpr char kGpt2Pattern[] = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// ------------------------------------------------------------------ regex

// A PCRE2 pattern compiled for UTF-8 with Unicode properties (\s, \w and
// case folding by Unicode, as Oniguruma does in the Rust library), JIT
// compiled where available. Invalid UTF-8 in the subject never matches
// instead of failing the match.
class Regex {
 public:
  static Result<std::shared_ptr<Regex>> Compile(const std::string& pattern, bool literal, const std::string& origin) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    uint32_t options = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF;
    if (literal) options |= PCRE2_LITERAL;
    pcre2_code* code =
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &error, &offset, nullptr);
    if (code == nullptr) {
      std::array<PCRE2_UCHAR, 256> message{};
      pcre2_get_error_message(error, message.data(), message.size());
      return Status::InvalidArgument(origin + ": pattern '" + pattern + "' does not compile at offset " +
                                     std::to_string(offset) + ": " + reinterpret_cast<const char*>(message.data()));
    }
    auto regex = std::shared_ptr<Regex>(new Regex(code));
    regex->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
    return regex;
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // The [begin, end) byte ranges of the non-empty matches in `text`, left to right.
  std::vector<std::pair<size_t, size_t>> Matches(std::string_view text) const {
    std::vector<std::pair<size_t, size_t>> out;
    pcre2_match_data* data = pcre2_match_data_create_from_pattern(code_, nullptr);
    size_t start = 0;
    while (start < text.size()) {
      const int rc =
          jit_ ? pcre2_jit_match(code_, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), start, 0, data, nullptr)
               : pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), start, 0, data, nullptr);
      if (rc < 0) break;
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
      const size_t b = ovector[0], e = ovector[1];
      if (e > b) {
        out.emplace_back(b, e);
        start = e;
      } else {
        // An empty match: step over one code point (or one invalid byte).
        size_t next = b;
        NextCodePoint(text, &next);
        start = next;
      }
    }
    pcre2_match_data_free(data);
    return out;
  }

 private:
  explicit Regex(pcre2_code* code) : code_(code) {}
  pcre2_code* code_;
  bool jit_ = false;
};

// ---------------------------------------------------------- the pipeline

struct Split {
  std::shared_ptr<Regex> regex;
  bool keep_matches_and_gaps = true;  // Isolated; false: Removed (drop the matches)
};

struct PreTokenizer {
  enum class Kind { kSplit, kByteLevel } kind = Kind::kSplit;
  Split split;
  bool add_prefix_space = false;            // ByteLevel
  std::shared_ptr<Regex> byte_level_regex;  // ByteLevel with use_regex
};

struct AddedToken {
  TokenId id = 0;
  std::string content;
  bool special = false, lstrip = false, rstrip = false, single_word = false;
};

Result<std::string> ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound(path.string() + ": cannot open");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

struct HfTokenizer::Impl {
  std::string origin;
  std::unordered_map<std::string, TokenId> vocab;                    // model vocabulary and added tokens
  std::vector<std::string> id_to_token;                              // "" for unused ids
  std::vector<uint8_t> is_special;                                   // per id
  std::unordered_map<uint64_t, std::pair<int32_t, TokenId>> merges;  // (left, right) -> (rank, merged)
  std::array<TokenId, 256> byte_ids{};
  bool ignore_merges = false;
  bool nfc = false;
  std::vector<PreTokenizer> pre_tokenizers;
  std::vector<AddedToken> added;                         // longest first within each first byte
  std::array<std::vector<int32_t>, 256> added_by_first;  // indices into `added`
  TokenId bos = -1, eos = -1, pad = -1;

  static uint64_t Pair(TokenId a, TokenId b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

  // BPE over one pre-tokenized piece (raw bytes).
  void EncodePiece(std::string_view piece, std::vector<TokenId>* out) const {
    if (piece.empty()) return;
    if (ignore_merges) {
      std::string mapped;
      for (unsigned char b : piece) mapped += ByteLevel().byte_to_text[b];
      auto it = vocab.find(mapped);
      if (it != vocab.end()) {
        out->push_back(it->second);
        return;
      }
    }
    std::vector<TokenId> symbols;
    symbols.reserve(piece.size());
    for (unsigned char b : piece) symbols.push_back(byte_ids[b]);
    // Merge the lowest-ranked adjacent pair until none is mergeable. Pieces
    // are words, so the quadratic scan is short; runs of thousands of
    // spaces cost milliseconds.
    while (symbols.size() > 1) {
      int32_t best_rank = INT32_MAX;
      size_t best = 0;
      TokenId merged = 0;
      for (size_t i = 0; i + 1 < symbols.size(); ++i) {
        auto it = merges.find(Pair(symbols[i], symbols[i + 1]));
        if (it != merges.end() && it->second.first < best_rank) {
          best_rank = it->second.first;
          best = i;
          merged = it->second.second;
        }
      }
      if (best_rank == INT32_MAX) break;
      // Merge every non-overlapping occurrence of the best pair, left to right.
      const TokenId left = symbols[best], right = symbols[best + 1];
      size_t w = 0;
      for (size_t i = 0; i < symbols.size();) {
        if (i + 1 < symbols.size() && symbols[i] == left && symbols[i + 1] == right) {
          symbols[w++] = merged;
          i += 2;
        } else {
          symbols[w++] = symbols[i++];
        }
      }
      symbols.resize(w);
    }
    out->insert(out->end(), symbols.begin(), symbols.end());
  }

  // Normalizes, pre-tokenizes and encodes text that holds no added token.
  void EncodeSegment(std::string_view text, std::vector<TokenId>* out) const {
    if (text.empty()) return;
    std::string normalized;
    if (nfc && std::any_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) >= 0x80; })) {
      utf8proc_uint8_t* result = nullptr;
      const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                              static_cast<utf8proc_ssize_t>(text.size()), &result,
                                              static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
      if (n >= 0) {
        normalized.assign(reinterpret_cast<const char*>(result), static_cast<size_t>(n));
        text = normalized;
      }  // invalid UTF-8: left as it is (its bytes are encoded one by one)
      std::free(result);
    }
    std::vector<std::string_view> pieces{text};
    for (const PreTokenizer& p : pre_tokenizers) {
      std::vector<std::string_view> next;
      for (std::string_view piece : pieces) {
        const Regex* regex = p.kind == PreTokenizer::Kind::kSplit ? p.split.regex.get() : p.byte_level_regex.get();
        if (regex == nullptr) {
          next.push_back(piece);
          continue;
        }
        // Isolated: the matches and the text between them are pieces;
        // Removed: only the text between matches.
        const bool keep_matches = p.kind == PreTokenizer::Kind::kByteLevel || p.split.keep_matches_and_gaps;
        size_t at = 0;
        for (auto [b, e] : regex->Matches(piece)) {
          if (b > at) next.push_back(piece.substr(at, b - at));
          if (keep_matches) next.push_back(piece.substr(b, e - b));
          at = e;
        }
        if (at < piece.size()) next.push_back(piece.substr(at));
      }
      pieces = std::move(next);
    }
    for (std::string_view piece : pieces) EncodePiece(piece, out);
  }

  // The added token matching at text[i] (longest first), with the span it
  // covers once lstrip / rstrip take the whitespace around it.
  const AddedToken* MatchAdded(std::string_view text, size_t i, size_t* end) const {
    for (int32_t index : added_by_first[static_cast<unsigned char>(text[i])]) {
      const AddedToken& t = added[static_cast<size_t>(index)];
      if (text.compare(i, t.content.size(), t.content) != 0) continue;
      size_t e = i + t.content.size();
      if (t.single_word) {
        size_t before = i;
        // The code point before i: step back over continuation bytes.
        while (before > 0 && (static_cast<unsigned char>(text[before - 1]) & 0xC0) == 0x80) --before;
        if (before > 0) {
          size_t p = before - 1;
          while (p > 0 && (static_cast<unsigned char>(text[p]) & 0xC0) == 0x80) --p;
          size_t q = p;
          if (IsWordChar(NextCodePoint(text, &q))) continue;
        }
        size_t q = e;
        if (q < text.size() && IsWordChar(NextCodePoint(text, &q))) continue;
      }
      if (t.rstrip) {
        for (size_t q = e; q < text.size();) {
          size_t r = q;
          if (!IsWhitespace(NextCodePoint(text, &r))) break;
          e = q = r;
        }
      }
      *end = e;
      return &t;
    }
    return nullptr;
  }
};

HfTokenizer::HfTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HfTokenizer::~HfTokenizer() = default;

Result<std::unique_ptr<HfTokenizer>> HfTokenizer::Load(const std::string& dir) {
  const std::filesystem::path root(dir);
  SLUICE_ASSIGN_OR_RETURN(std::string tokenizer, ReadFile(root / "tokenizer.json"));
  std::string config;
  std::error_code ec;
  if (std::filesystem::exists(root / "tokenizer_config.json", ec)) {
    SLUICE_ASSIGN_OR_RETURN(config, ReadFile(root / "tokenizer_config.json"));
  }
  return FromJson(tokenizer, config, (root / "tokenizer.json").string());
}

namespace {

Status Unsupported(const std::string& origin, const std::string& what, const json& value) {
  return Status::Unimplemented(origin + ": " + what + " " + value.dump() + " is not supported");
}

Status ParseNormalizer(const json& n, const std::string& origin, bool* nfc) {
  if (n.is_null()) return Status::Ok();
  if (!n.is_object() || !n.contains("type")) return Status::InvalidArgument(origin + ": normalizer has no type");
  const std::string type = n["type"].is_string() ? n["type"].get<std::string>() : "";
  if (type == "NFC") {
    *nfc = true;
    return Status::Ok();
  }
  if (type == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array()) {
    for (const json& inner : n["normalizers"]) SLUICE_RETURN_IF_ERROR(ParseNormalizer(inner, origin, nfc));
    return Status::Ok();
  }
  return Unsupported(origin, "normalizer type", n["type"]);
}

Status ParsePreTokenizer(const json& p, const std::string& origin, std::vector<PreTokenizer>* out) {
  if (p.is_null()) return Status::Ok();
  if (!p.is_object() || !p.contains("type") || !p["type"].is_string()) {
    return Status::InvalidArgument(origin + ": pre_tokenizer has no type");
  }
  const std::string type = p["type"].get<std::string>();
  if (type == "Sequence") {
    if (!p.contains("pretokenizers") || !p["pretokenizers"].is_array()) {
      return Status::InvalidArgument(origin + ": pre_tokenizer Sequence has no 'pretokenizers' list");
    }
    for (const json& inner : p["pretokenizers"]) SLUICE_RETURN_IF_ERROR(ParsePreTokenizer(inner, origin, out));
    return Status::Ok();
  }
  PreTokenizer t;
  if (type == "ByteLevel") {
    t.kind = PreTokenizer::Kind::kByteLevel;
    if (p.value("add_prefix_space", false)) {
      return Status::Unimplemented(origin + ": pre_tokenizer ByteLevel with add_prefix_space true is not supported");
    }
    if (p.value("use_regex", true)) {
      SLUICE_ASSIGN_OR_RETURN(t.byte_level_regex, Regex::Compile(kGpt2Pattern, false, origin));
    }
    out->push_back(std::move(t));
    return Status::Ok();
  }
  if (type == "Split") {
    if (!p.contains("pattern") || !p["pattern"].is_object()) {
      return Status::InvalidArgument(origin + ": pre_tokenizer Split has no pattern");
    }
    const json& pattern = p["pattern"];
    const bool literal = pattern.contains("String");
    const json& text = literal ? pattern["String"] : pattern.value("Regex", json());
    if (!text.is_string()) return Status::InvalidArgument(origin + ": Split pattern is neither Regex nor String");
    if (p.value("invert", false)) return Unsupported(origin, "Split with invert", p["invert"]);
    const std::string behavior = p.value("behavior", std::string("Isolated"));
    if (behavior != "Isolated" && behavior != "Removed") {
      return Unsupported(origin, "Split behavior", p["behavior"]);
    }
    t.split.keep_matches_and_gaps = behavior == "Isolated";
    SLUICE_ASSIGN_OR_RETURN(t.split.regex, Regex::Compile(text.get<std::string>(), literal, origin));
    out->push_back(std::move(t));
    return Status::Ok();
  }
  return Unsupported(origin, "pre_tokenizer type", p["type"]);
}

// A bos/eos/pad entry of tokenizer_config.json: a string or {"content": ...}.
std::string SpecialTokenText(const json& config, const char* key) {
  if (!config.is_object() || !config.contains(key)) return "";
  const json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return "";
}

}  // namespace

Result<std::unique_ptr<HfTokenizer>> HfTokenizer::FromJson(const std::string& tokenizer_json,
                                                           const std::string& config_json, const std::string& origin) {
  json j = json::parse(tokenizer_json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::InvalidArgument(origin + ": not a JSON object");
  auto impl = std::make_unique<Impl>();
  impl->origin = origin;
  if (!j.contains("model") || !j["model"].is_object()) return Status::InvalidArgument(origin + ": no 'model'");
  const json& model = j["model"];
  const std::string type = model.value("type", std::string("BPE"));
  if (type != "BPE") return Unsupported(origin, "model type", model["type"]);
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix", "unk_token"}) {
    if (model.contains(key) && !model[key].is_null() &&
        !(model[key].is_string() && model[key].get<std::string>().empty())) {
      return Unsupported(origin, std::string("BPE ") + key, model[key]);
    }
  }
  if (model.value("byte_fallback", false)) return Unsupported(origin, "BPE byte_fallback", model["byte_fallback"]);
  if (model.contains("dropout") && !model["dropout"].is_null())
    return Unsupported(origin, "BPE dropout", model["dropout"]);
  impl->ignore_merges = model.value("ignore_merges", false);

  // Vocabulary.
  if (!model.contains("vocab") || !model["vocab"].is_object())
    return Status::InvalidArgument(origin + ": no model.vocab");
  TokenId max_id = -1;
  for (const auto& [token, id] : model["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (int64_t{1} << 24)) {
      return Status::InvalidArgument(origin + ": model.vocab['" + token + "'] is not an id in [0, 2^24)");
    }
    const TokenId v = id.get<TokenId>();
    impl->vocab.emplace(token, v);
    max_id = std::max(max_id, v);
  }
  // Added tokens.
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const json& a : j["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
          !a["content"].is_string() || a["content"].get<std::string>().empty() || a["id"].get<int64_t>() < 0 ||
          a["id"].get<int64_t>() >= (int64_t{1} << 24)) {
        return Status::InvalidArgument(origin + ": added_tokens entry " + a.dump().substr(0, 120) +
                                       " needs an id in [0, 2^24) and a non-empty content");
      }
      AddedToken t;
      t.id = a["id"].get<TokenId>();
      t.content = a["content"].get<std::string>();
      t.special = a.value("special", false);
      t.lstrip = a.value("lstrip", false);
      t.rstrip = a.value("rstrip", false);
      t.single_word = a.value("single_word", false);
      if (t.lstrip) return Unsupported(origin, "added token lstrip for " + t.content, a["lstrip"]);
      impl->vocab[t.content] = t.id;
      max_id = std::max(max_id, t.id);
      impl->added.push_back(std::move(t));
    }
  }
  impl->id_to_token.assign(static_cast<size_t>(max_id + 1), "");
  impl->is_special.assign(static_cast<size_t>(max_id + 1), 0);
  for (const auto& [token, id] : impl->vocab) impl->id_to_token[static_cast<size_t>(id)] = token;
  std::stable_sort(impl->added.begin(), impl->added.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
  for (size_t i = 0; i < impl->added.size(); ++i) {
    const AddedToken& t = impl->added[i];
    impl->id_to_token[static_cast<size_t>(t.id)] = t.content;
    impl->is_special[static_cast<size_t>(t.id)] = t.special ? 1 : 0;
    impl->added_by_first[static_cast<unsigned char>(t.content[0])].push_back(static_cast<int32_t>(i));
  }
  // Byte symbols: every byte's byte-level text must be in the vocabulary.
  for (int b = 0; b < 256; ++b) {
    auto it = impl->vocab.find(ByteLevel().byte_to_text[static_cast<size_t>(b)]);
    if (it == impl->vocab.end()) {
      return Status::InvalidArgument(origin + ": model.vocab lacks the byte-level token of byte " + std::to_string(b) +
                                     " ('" + ByteLevel().byte_to_text[static_cast<size_t>(b)] +
                                     "'): not a byte-level BPE vocabulary");
    }
    impl->byte_ids[static_cast<size_t>(b)] = it->second;
  }
  // Merges, ranked by their order.
  if (!model.contains("merges") || !model["merges"].is_array())
    return Status::InvalidArgument(origin + ": no model.merges");
  int32_t rank = 0;
  for (const json& m : model["merges"]) {
    std::string left, right;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || space == 0 || space + 1 >= s.size() ||
          s.find(' ', space + 1) != std::string::npos) {
        return Status::InvalidArgument(origin + ": merge " + std::to_string(rank) + " '" + s +
                                       "' is not two tokens separated by one space");
      }
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      return Status::InvalidArgument(origin + ": merge " + std::to_string(rank) + " " + m.dump().substr(0, 80) +
                                     " is neither \"a b\" nor [\"a\", \"b\"]");
    }
    auto a = impl->vocab.find(left), b = impl->vocab.find(right), ab = impl->vocab.find(left + right);
    if (a == impl->vocab.end() || b == impl->vocab.end() || ab == impl->vocab.end()) {
      return Status::InvalidArgument(origin + ": merge " + std::to_string(rank) + " '" + left + " " + right +
                                     "' uses a token that is not in model.vocab");
    }
    impl->merges.emplace(Impl::Pair(a->second, b->second), std::make_pair(rank, ab->second));
    ++rank;
  }
  // Normalizer, pre-tokenizer, decoder.
  SLUICE_RETURN_IF_ERROR(ParseNormalizer(j.value("normalizer", json()), origin, &impl->nfc));
  SLUICE_RETURN_IF_ERROR(ParsePreTokenizer(j.value("pre_tokenizer", json()), origin, &impl->pre_tokenizers));
  const json decoder = j.value("decoder", json());
  if (!decoder.is_null() && !(decoder.is_object() && decoder.value("type", std::string()) == "ByteLevel")) {
    return Unsupported(origin, "decoder", decoder.is_object() ? decoder.value("type", json()) : decoder);
  }
  // Special tokens named by tokenizer_config.json.
  if (!config_json.empty()) {
    json c = json::parse(config_json, nullptr, /*allow_exceptions=*/false);
    if (c.is_discarded() || !c.is_object()) {
      return Status::InvalidArgument(origin + ": its tokenizer_config.json is not a JSON object");
    }
    for (auto [key, slot] : {std::pair<const char*, TokenId*>{"bos_token", &impl->bos},
                             {"eos_token", &impl->eos},
                             {"pad_token", &impl->pad}}) {
      const std::string text = SpecialTokenText(c, key);
      if (text.empty()) continue;
      auto it = impl->vocab.find(text);
      if (it == impl->vocab.end()) {
        return Status::InvalidArgument(origin + ": tokenizer_config.json " + key + " '" + text +
                                       "' is not a token of the vocabulary");
      }
      *slot = it->second;
    }
  }
  return std::unique_ptr<HfTokenizer>(new HfTokenizer(std::move(impl)));
}

std::vector<TokenId> HfTokenizer::Encode(std::string_view text) const {
  std::vector<TokenId> out;
  size_t segment = 0;
  for (size_t i = 0; i < text.size();) {
    size_t end = 0;
    const AddedToken* t = impl_->added.empty() ? nullptr : impl_->MatchAdded(text, i, &end);
    if (t == nullptr) {
      ++i;
      continue;
    }
    impl_->EncodeSegment(text.substr(segment, i - segment), &out);
    out.push_back(t->id);
    i = segment = end;
  }
  impl_->EncodeSegment(text.substr(segment), &out);
  return out;
}

Result<std::string> HfTokenizer::Decode(const std::vector<TokenId>& ids, bool skip_special) const {
  std::string text;
  for (TokenId id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= impl_->id_to_token.size() ||
        impl_->id_to_token[static_cast<size_t>(id)].empty()) {
      return Status::OutOfRange("token id " + std::to_string(id) + " is not in the vocabulary");
    }
    if (skip_special && impl_->is_special[static_cast<size_t>(id)]) continue;
    text += impl_->id_to_token[static_cast<size_t>(id)];
  }
  std::string bytes;
  bytes.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const size_t start = i;
    const int32_t cp = NextCodePoint(text, &i);
    auto it =
        cp >= 0 ? ByteLevel().code_point_to_byte.find(static_cast<uint32_t>(cp)) : ByteLevel().code_point_to_byte.end();
    if (it != ByteLevel().code_point_to_byte.end()) {
      bytes.push_back(static_cast<char>(it->second));
    } else {
      bytes.append(text, start, i - start);
    }
  }
  return bytes;
}

int64_t HfTokenizer::vocab_size() const { return static_cast<int64_t>(impl_->id_to_token.size()); }
bool HfTokenizer::Knows(TokenId id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->id_to_token.size() &&
         !impl_->id_to_token[static_cast<size_t>(id)].empty();
}
TokenId HfTokenizer::bos_id() const { return impl_->bos; }
TokenId HfTokenizer::eos_id() const { return impl_->eos; }
TokenId HfTokenizer::pad_id() const { return impl_->pad; }

TokenId HfTokenizer::TokenToId(std::string_view token) const {
  auto it = impl_->vocab.find(std::string(token));
  return it == impl_->vocab.end() ? -1 : it->second;
}

Result<std::shared_ptr<const Tokenizer>> LoadTokenizer(const std::string& model_dir) {
  std::error_code ec;
  if (model_dir.empty() || !std::filesystem::exists(std::filesystem::path(model_dir) / "tokenizer.json", ec)) {
    return std::shared_ptr<const Tokenizer>(std::make_shared<ByteTokenizer>());
  }
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<HfTokenizer> t, HfTokenizer::Load(model_dir));
  return std::shared_ptr<const Tokenizer>(std::move(t));
}

Status CopyTokenizerFiles(const std::string& from_dir, const std::string& to_dir) {
  if (from_dir.empty()) return Status::Ok();
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
    const std::filesystem::path from = std::filesystem::path(from_dir) / file;
    std::error_code ec;
    if (!std::filesystem::exists(from, ec)) continue;
    if (std::filesystem::equivalent(from, std::filesystem::path(to_dir) / file, ec)) continue;
    std::filesystem::copy_file(from, std::filesystem::path(to_dir) / file,
                               std::filesystem::copy_options::overwrite_existing, ec);
    if (ec) return Status::Unavailable("copying " + from.string() + " to " + to_dir + ": " + ec.message());
  }
  return Status::Ok();
}

}  // namespace sluice::model
