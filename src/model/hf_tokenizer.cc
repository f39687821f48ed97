#include "sluice/model/hf_tokenizer.h"

#include "bounded_json.h"
#include "sluice/common/file_util.h"
#include "sluice/common/strings.h"
#include "utf8.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <unordered_map>

namespace sluice::model {

namespace {

using nlohmann::json;

// ------------------------------------------------------------------ UTF-8

using internal::AppendUtf8;

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

  // The [begin, end) byte ranges of the non-empty matches in `text`, left
  // to right. Errors: ResourceExhausted when the regex engine gives up (its
  // match, depth or heap limit, the JIT's stack, memory): ending the matches
  // there would make the rest of the text one piece and change the ids.
  Result<std::vector<std::pair<size_t, size_t>>> Matches(std::string_view text) const {
    std::vector<std::pair<size_t, size_t>> out;
    pcre2_match_data* data = pcre2_match_data_create_from_pattern(code_, nullptr);
    if (data == nullptr) return Status::ResourceExhausted("tokenizer regex: no memory for its match data");
    size_t start = 0;
    while (start < text.size()) {
      const int rc =
          jit_ ? pcre2_jit_match(code_, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), start, 0, data, nullptr)
               : pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), start, 0, data, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        pcre2_match_data_free(data);
        std::array<PCRE2_UCHAR, 256> message{};
        pcre2_get_error_message(rc, message.data(), message.size());
        return Status::ResourceExhausted("tokenizer regex failed at byte " + std::to_string(start) + " of a " +
                                         std::to_string(text.size()) +
                                         "-byte piece: " + reinterpret_cast<const char*>(message.data()));
      }
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

// Metaspace's settings, shared by the pre-tokenizer and the decoder.
struct Metaspace {
  // Where the pre-tokenizer puts a replacement before a piece that does not
  // start with one: every piece, only the piece that starts the input text
  // (not one after an added token), or none. The decoder drops the first
  // token's replacements unless kNever.
  enum class Prepend { kAlways, kFirst, kNever } prepend = Prepend::kAlways;
  std::string replacement;  // one character, UTF-8
  bool split = true;        // pre-tokenizer: a piece starts at each replacement
};

struct PreTokenizer {
  enum class Kind { kSplit, kByteLevel, kMetaspace } kind = Kind::kSplit;
  Split split;
  bool add_prefix_space = false;            // ByteLevel
  std::shared_ptr<Regex> byte_level_regex;  // ByteLevel with use_regex
  Metaspace metaspace;                      // Metaspace
};

// The normalizer's steps, applied in order to text between added tokens.
struct NormalizerStep {
  enum class Kind { kNfc, kPrepend, kReplace } kind = Kind::kNfc;
  std::string text;         // kPrepend: what is prepended; kReplace: what is replaced
  std::string replacement;  // kReplace
};

// The decoder's steps for SentencePiece-style vocabularies, applied in order
// to the list of token strings (each step as the Rust library applies it:
// per token, except Fuse, which joins them into one).
struct DecoderStep {
  enum class Kind { kReplace, kByteFallback, kFuse, kStrip, kMetaspace } kind = Kind::kFuse;
  std::string text, replacement;  // kReplace; kStrip: the character stripped
  int64_t start = 0, stop = 0;    // kStrip: how many at the start and at the end
  Metaspace metaspace;            // kMetaspace
};

// "<0x41>" -> 0x41, or -1: the byte tokens of a byte-fallback vocabulary.
int ByteFallbackValue(std::string_view token) {
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token[5] != '>') return -1;
  int v = 0;
  for (char c : token.substr(3, 2)) {
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

void ReplaceAll(std::string* text, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  size_t at = 0;
  for (size_t hit; (hit = text->find(from, at)) != std::string::npos; at = hit + from.size()) {
    out.append(*text, at, hit - at);
    out.append(to);
  }
  if (at == 0) return;
  out.append(*text, at, std::string::npos);
  *text = std::move(out);
}

struct AddedToken {
  TokenId id = 0;
  std::string content;
  bool special = false, lstrip = false, rstrip = false, single_word = false;
};

Result<std::string> ReadFile(const std::filesystem::path& path) { return ReadFileToString(path.string()); }

}  // namespace

struct HfTokenizer::Impl {
  std::string origin;
  std::unordered_map<std::string, TokenId> vocab;                    // model vocabulary and added tokens
  std::vector<std::string> id_to_token;                              // "" for unused ids
  std::vector<uint8_t> is_special;                                   // per id
  std::unordered_map<uint64_t, std::pair<int32_t, TokenId>> merges;  // (left, right) -> (rank, merged)
  // Byte-level BPE (GPT-2, Qwen, Llama 3): pieces are bytes mapped to
  // printable characters, byte_ids[b] the symbol of byte b. Otherwise
  // SentencePiece-style BPE (Llama 2, Mistral): symbols are characters, one
  // outside the vocabulary becomes its UTF-8 bytes' <0xXX> tokens
  // (byte_fallback, byte_ids) or the unknown token.
  bool byte_level = true;
  std::array<TokenId, 256> byte_ids{};
  bool byte_fallback = false;
  TokenId unk = -1;
  bool fuse_unk = false;
  bool ignore_merges = false;
  std::vector<NormalizerStep> normalizers;
  std::vector<DecoderStep> decoders;  // SentencePiece-style only
  std::vector<PreTokenizer> pre_tokenizers;
  std::vector<AddedToken> added;                         // longest first within each first byte
  std::array<std::vector<int32_t>, 256> added_by_first;  // indices into `added`
  TokenId bos = -1, eos = -1, pad = -1;

  static uint64_t Pair(TokenId a, TokenId b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

  // BPE over one pre-tokenized piece.
  void EncodePiece(std::string_view piece, std::vector<TokenId>* out) const {
    if (piece.empty()) return;
    if (ignore_merges) {
      std::string mapped;
      if (byte_level) {
        for (unsigned char b : piece) mapped += ByteLevel().byte_to_text[b];
      } else {
        mapped = piece;
      }
      auto it = vocab.find(mapped);
      if (it != vocab.end()) {
        out->push_back(it->second);
        return;
      }
    }
    std::vector<TokenId> symbols;
    symbols.reserve(piece.size());
    if (byte_level) {
      for (unsigned char b : piece) symbols.push_back(byte_ids[b]);
    } else {
      for (size_t i = 0; i < piece.size();) {
        const size_t start = i;
        NextCodePoint(piece, &i);
        auto it = vocab.find(std::string(piece.substr(start, i - start)));
        if (it != vocab.end()) {
          symbols.push_back(it->second);
        } else if (byte_fallback) {
          for (size_t k = start; k < i; ++k) symbols.push_back(byte_ids[static_cast<unsigned char>(piece[k])]);
        } else if (unk >= 0 && !(fuse_unk && !symbols.empty() && symbols.back() == unk)) {
          symbols.push_back(unk);
        }
      }
    }
    Merge(&symbols);
    out->insert(out->end(), symbols.begin(), symbols.end());
  }

  // Applies the merges: always the lowest-ranked adjacent pair, the leftmost
  // of equals first (a heap of candidate pairs over a linked list, so a long
  // piece, such as a SentencePiece-style segment with no pre-tokenizer, costs
  // n log n).
  void Merge(std::vector<TokenId>* symbols) const {
    const size_t n = symbols->size();
    if (n < 2) return;
    std::vector<TokenId>& id = *symbols;
    std::vector<int64_t> prev(n), next(n);
    for (size_t i = 0; i < n; ++i) {
      prev[i] = static_cast<int64_t>(i) - 1;
      next[i] = i + 1 < n ? static_cast<int64_t>(i + 1) : -1;
    }
    struct Candidate {
      int32_t rank;
      int64_t left;
      TokenId a, b;
      bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
    };
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
    auto consider = [&](int64_t left) {
      if (left < 0 || next[static_cast<size_t>(left)] < 0) return;
      const TokenId a = id[static_cast<size_t>(left)], b = id[static_cast<size_t>(next[static_cast<size_t>(left)])];
      auto it = merges.find(Pair(a, b));
      if (it != merges.end()) heap.push(Candidate{it->second.first, left, a, b});
    };
    for (size_t i = 0; i + 1 < n; ++i) consider(static_cast<int64_t>(i));
    std::vector<uint8_t> alive(n, 1);
    while (!heap.empty()) {
      const Candidate c = heap.top();
      heap.pop();
      const auto l = static_cast<size_t>(c.left);
      const int64_t r = next[l];
      // Stale: a neighbour merged since this pair was queued.
      if (!alive[l] || r < 0 || id[l] != c.a || id[static_cast<size_t>(r)] != c.b) continue;
      id[l] = merges.at(Pair(c.a, c.b)).second;
      alive[static_cast<size_t>(r)] = 0;
      next[l] = next[static_cast<size_t>(r)];
      if (next[l] >= 0) prev[static_cast<size_t>(next[l])] = c.left;
      consider(prev[l]);
      consider(c.left);
    }
    size_t w = 0;
    for (size_t i = 0; i < n; ++i) {
      if (alive[i]) id[w++] = id[i];
    }
    id.resize(w);
  }

  // A pre-tokenized piece of a segment, and whether it starts the input
  // text (what Metaspace's prepend_scheme "first" asks).
  struct Piece {
    std::string_view text;
    bool starts_input = false;
  };

  // Metaspace: spaces become the replacement, which is prepended where the
  // scheme says unless the piece starts with one; with split, a new piece
  // starts at each replacement (which stays with the text after it).
  static void ApplyMetaspace(const Metaspace& m, const Piece& piece, std::deque<std::string>* owned,
                             std::vector<Piece>* next) {
    if (piece.text.empty()) return;
    std::string text;
    const bool prepend =
        m.prepend == Metaspace::Prepend::kAlways || (m.prepend == Metaspace::Prepend::kFirst && piece.starts_input);
    if (prepend && piece.text.compare(0, m.replacement.size(), m.replacement) != 0 && piece.text[0] != ' ') {
      text = m.replacement;
    }
    for (char c : piece.text) {
      if (c == ' ') {
        text += m.replacement;
      } else {
        text.push_back(c);
      }
    }
    const std::string_view all = owned->emplace_back(std::move(text));
    if (!m.split) {
      next->push_back(Piece{all, piece.starts_input});
      return;
    }
    size_t begin = 0;
    for (size_t hit = all.find(m.replacement, 1); hit != std::string_view::npos;
         hit = all.find(m.replacement, hit + m.replacement.size())) {
      next->push_back(Piece{all.substr(begin, hit - begin), piece.starts_input && begin == 0});
      begin = hit;
    }
    next->push_back(Piece{all.substr(begin), piece.starts_input && begin == 0});
  }

  // Normalizes, pre-tokenizes and encodes text that holds no added token;
  // starts_input: the text starts the input (no added token before it).
  Status EncodeSegment(std::string_view text, bool starts_input, std::vector<TokenId>* out) const {
    if (text.empty()) return Status::Ok();
    std::string normalized;
    for (const NormalizerStep& step : normalizers) {
      switch (step.kind) {
        case NormalizerStep::Kind::kNfc:
          if (std::any_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) >= 0x80; })) {
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
          break;
        case NormalizerStep::Kind::kPrepend:
          normalized = step.text + std::string(text);
          text = normalized;
          break;
        case NormalizerStep::Kind::kReplace: {
          std::string replaced(text);
          ReplaceAll(&replaced, step.text, step.replacement);
          normalized = std::move(replaced);
          text = normalized;
          break;
        }
      }
    }
    std::vector<Piece> pieces{Piece{text, starts_input}};
    std::deque<std::string> owned;  // the texts Metaspace rewrote
    for (const PreTokenizer& p : pre_tokenizers) {
      std::vector<Piece> next;
      for (const Piece& piece : pieces) {
        if (p.kind == PreTokenizer::Kind::kMetaspace) {
          ApplyMetaspace(p.metaspace, piece, &owned, &next);
          continue;
        }
        const Regex* regex = p.kind == PreTokenizer::Kind::kSplit ? p.split.regex.get() : p.byte_level_regex.get();
        if (regex == nullptr) {
          next.push_back(piece);
          continue;
        }
        // Isolated: the matches and the text between them are pieces;
        // Removed: only the text between matches.
        const bool keep_matches = p.kind == PreTokenizer::Kind::kByteLevel || p.split.keep_matches_and_gaps;
        auto add = [&](size_t b, size_t e) {
          next.push_back(Piece{piece.text.substr(b, e - b), piece.starts_input && b == 0});
        };
        size_t at = 0;
        SLUICE_ASSIGN_OR_RETURN(const auto matches, regex->Matches(piece.text));
        for (auto [b, e] : matches) {
          if (b > at) add(at, b);
          if (keep_matches) add(b, e);
          at = e;
        }
        if (at < piece.text.size()) add(at, piece.text.size());
      }
      pieces = std::move(next);
    }
    for (const Piece& piece : pieces) EncodePiece(piece.text, out);
    return Status::Ok();
  }

  // The SentencePiece-style decoder over the tokens' strings.
  std::string DecodeChain(std::vector<std::string> tokens) const {
    for (const DecoderStep& step : decoders) {
      switch (step.kind) {
        case DecoderStep::Kind::kReplace:
          for (std::string& t : tokens) ReplaceAll(&t, step.text, step.replacement);
          break;
        case DecoderStep::Kind::kByteFallback: {
          // A run of <0xXX> tokens becomes its bytes when they are valid
          // UTF-8, else one U+FFFD per byte, as the Rust library does.
          std::vector<std::string> out;
          std::string run;
          size_t run_tokens = 0;
          auto flush = [&] {
            if (run_tokens == 0) return;
            if (IsValidUtf8(run)) {
              out.push_back(run);
            } else {
              std::string replacement;
              for (size_t k = 0; k < run_tokens; ++k) replacement += "\xEF\xBF\xBD";
              out.push_back(std::move(replacement));
            }
            run.clear();
            run_tokens = 0;
          };
          for (std::string& t : tokens) {
            const int byte = ByteFallbackValue(t);
            if (byte >= 0) {
              run.push_back(static_cast<char>(byte));
              ++run_tokens;
            } else {
              flush();
              out.push_back(std::move(t));
            }
          }
          flush();
          tokens = std::move(out);
          break;
        }
        case DecoderStep::Kind::kFuse: {
          std::string joined;
          for (const std::string& t : tokens) joined += t;
          tokens = {std::move(joined)};
          break;
        }
        case DecoderStep::Kind::kMetaspace:
          // Replacements become spaces, except in the first token, which
          // loses them all unless the scheme is "never" (as the Rust
          // library does: not only the one the pre-tokenizer prepended).
          for (size_t i = 0; i < tokens.size(); ++i) {
            const bool drop = i == 0 && step.metaspace.prepend != Metaspace::Prepend::kNever;
            ReplaceAll(&tokens[i], step.metaspace.replacement, drop ? "" : " ");
          }
          break;
        case DecoderStep::Kind::kStrip:
          for (std::string& t : tokens) {
            for (int64_t k = 0; k < step.start && t.compare(0, step.text.size(), step.text) == 0; ++k) {
              t.erase(0, step.text.size());
            }
            for (int64_t k = 0; k < step.stop && t.size() >= step.text.size() &&
                                t.compare(t.size() - step.text.size(), step.text.size(), step.text) == 0;
                 ++k) {
              t.erase(t.size() - step.text.size());
            }
          }
          break;
      }
    }
    std::string text;
    for (const std::string& t : tokens) text += t;
    return text;
  }

  // Splits `text` on the added tokens, leftmost and longest first; the
  // pieces between are normalized, pre-tokenized and encoded. An lstrip
  // token also takes the whitespace before it, an rstrip one the whitespace
  // after it.
  Status SplitOnAdded(std::string_view text, std::vector<TokenId>* out) const {
    size_t segment = 0;
    for (size_t i = 0; i < text.size() && !added.empty();) {
      size_t end = 0;
      const AddedToken* t = MatchAdded(text, i, &end);
      if (t == nullptr) {
        ++i;
        continue;
      }
      size_t before = i;
      while (t->lstrip && before > segment) {
        size_t p = before - 1;  // the code point ending at `before`
        while (p > segment && (static_cast<unsigned char>(text[p]) & 0xC0) == 0x80) --p;
        size_t q = p;
        if (!IsWhitespace(NextCodePoint(text, &q))) break;
        before = p;
      }
      SLUICE_RETURN_IF_ERROR(EncodeSegment(text.substr(segment, before - segment), segment == 0, out));
      out->push_back(t->id);
      i = segment = end;
    }
    return EncodeSegment(text.substr(segment), segment == 0, out);
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

  // FromJson's parts: model.merges, ranked by their order; the special
  // tokens tokenizer_config.json names (bos, eos, pad).
  Status ReadMerges(const json& model);
  Status ReadSpecialTokens(const std::string& config_json);
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

Status ParseNormalizer(const json& n, const std::string& origin, std::vector<NormalizerStep>* out) {
  if (n.is_null()) return Status::Ok();
  if (!n.is_object() || !n.contains("type")) return Status::InvalidArgument(origin + ": normalizer has no type");
  const std::string type = n["type"].is_string() ? n["type"].get<std::string>() : "";
  if (type == "NFC") {
    out->push_back(NormalizerStep{});
    return Status::Ok();
  }
  if (type == "Prepend") {
    if (!n.contains("prepend") || !n["prepend"].is_string()) {
      return Status::InvalidArgument(origin + ": normalizer Prepend has no 'prepend' string");
    }
    out->push_back(NormalizerStep{NormalizerStep::Kind::kPrepend, n["prepend"].get<std::string>(), ""});
    return Status::Ok();
  }
  if (type == "Replace") {
    const json pattern = n.value("pattern", json());
    if (!pattern.is_object() || !pattern.contains("String") || !pattern["String"].is_string()) {
      return Unsupported(origin, "normalizer Replace pattern (only String patterns are)", pattern);
    }
    if (!n.contains("content") || !n["content"].is_string()) {
      return Status::InvalidArgument(origin + ": normalizer Replace has no 'content' string");
    }
    out->push_back(NormalizerStep{NormalizerStep::Kind::kReplace, pattern["String"].get<std::string>(),
                                  n["content"].get<std::string>()});
    return Status::Ok();
  }
  if (type == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array()) {
    for (const json& inner : n["normalizers"]) SLUICE_RETURN_IF_ERROR(ParseNormalizer(inner, origin, out));
    return Status::Ok();
  }
  return Unsupported(origin, "normalizer type", n["type"]);
}

// The fields of a Metaspace pre-tokenizer or decoder (`what` names which):
// replacement (one character), prepend_scheme ("always", "first", "never";
// "always" when absent), split (true when absent), and the older files'
// add_prefix_space: false means "never" (a prepend_scheme other than
// "never" beside it is a contradiction), true leaves prepend_scheme as it
// is. str_rep, which older files repeat the replacement in, is ignored.
Status ParseMetaspace(const json& m, const std::string& origin, const std::string& what, Metaspace* out) {
  auto bad = [&](const char* field, const std::string& should) {
    return Status::InvalidArgument(origin + ": " + what + " '" + field + "' " + should + ", not " +
                                   (m.contains(field) ? m[field].dump() : std::string("missing")));
  };
  if (!m.contains("replacement") || !m["replacement"].is_string()) {
    return bad("replacement", "must be a string of one character");
  }
  const std::string replacement = m["replacement"].get<std::string>();
  size_t end = 0;
  if (replacement.empty() || NextCodePoint(replacement, &end) < 0 || end != replacement.size()) {
    return bad("replacement", "must be a string of one character");
  }
  out->replacement = replacement;
  for (const char* field : {"split", "add_prefix_space"}) {
    if (m.contains(field) && !m[field].is_boolean() && !m[field].is_null()) return bad(field, "must be true or false");
  }
  if (m.contains("str_rep") && !m["str_rep"].is_string() && !m["str_rep"].is_null()) {
    return bad("str_rep", "must be a string");
  }
  out->split = !m.contains("split") || !m["split"].is_boolean() || m["split"].get<bool>();
  out->prepend = Metaspace::Prepend::kAlways;
  if (m.contains("prepend_scheme")) {
    const json& scheme = m["prepend_scheme"];
    const std::string name = scheme.is_string() ? scheme.get<std::string>() : "";
    if (name == "always") {
      out->prepend = Metaspace::Prepend::kAlways;
    } else if (name == "first") {
      out->prepend = Metaspace::Prepend::kFirst;
    } else if (name == "never") {
      out->prepend = Metaspace::Prepend::kNever;
    } else {
      return bad("prepend_scheme", "must be \"always\", \"first\" or \"never\"");
    }
  }
  if (m.contains("add_prefix_space") && m["add_prefix_space"].is_boolean() && !m["add_prefix_space"].get<bool>()) {
    if (m.contains("prepend_scheme") && out->prepend != Metaspace::Prepend::kNever) {
      return Status::InvalidArgument(origin + ": " + what + " 'add_prefix_space' false contradicts 'prepend_scheme' " +
                                     m["prepend_scheme"].dump());
    }
    out->prepend = Metaspace::Prepend::kNever;
  }
  return Status::Ok();
}

// A SentencePiece-style decoder: Replace (String patterns), ByteFallback,
// Fuse, Strip and Metaspace, alone or in a Sequence.
Status ParseDecoder(const json& d, const std::string& origin, std::vector<DecoderStep>* out) {
  if (!d.is_object() || !d.contains("type") || !d["type"].is_string()) {
    return Status::InvalidArgument(origin + ": decoder has no type");
  }
  const std::string type = d["type"].get<std::string>();
  if (type == "Sequence") {
    if (!d.contains("decoders") || !d["decoders"].is_array()) {
      return Status::InvalidArgument(origin + ": decoder Sequence has no 'decoders' list");
    }
    for (const json& inner : d["decoders"]) SLUICE_RETURN_IF_ERROR(ParseDecoder(inner, origin, out));
    return Status::Ok();
  }
  DecoderStep step;
  if (type == "Replace") {
    const json pattern = d.value("pattern", json());
    if (!pattern.is_object() || !pattern.contains("String") || !pattern["String"].is_string() ||
        !d.contains("content") || !d["content"].is_string()) {
      return Unsupported(origin, "decoder Replace (only a String pattern with a content is)", d);
    }
    step.kind = DecoderStep::Kind::kReplace;
    step.text = pattern["String"].get<std::string>();
    step.replacement = d["content"].get<std::string>();
  } else if (type == "ByteFallback") {
    step.kind = DecoderStep::Kind::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = DecoderStep::Kind::kFuse;
  } else if (type == "Strip") {
    if (!d.contains("content") || !d["content"].is_string() || d["content"].get<std::string>().empty() ||
        !d.value("start", json(0)).is_number_unsigned() || !d.value("stop", json(0)).is_number_unsigned()) {
      return Status::InvalidArgument(origin + ": decoder Strip needs a 'content' character and counts 'start', 'stop'");
    }
    step.kind = DecoderStep::Kind::kStrip;
    step.text = d["content"].get<std::string>();
    step.start = d.value("start", int64_t{0});
    step.stop = d.value("stop", int64_t{0});
  } else if (type == "Metaspace") {
    step.kind = DecoderStep::Kind::kMetaspace;
    SLUICE_RETURN_IF_ERROR(ParseMetaspace(d, origin, "decoder Metaspace", &step.metaspace));
  } else {
    return Unsupported(origin, "decoder", d["type"]);
  }
  out->push_back(std::move(step));
  return Status::Ok();
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
  if (type == "Metaspace") {
    t.kind = PreTokenizer::Kind::kMetaspace;
    SLUICE_RETURN_IF_ERROR(ParseMetaspace(p, origin, "pre_tokenizer Metaspace", &t.metaspace));
    out->push_back(std::move(t));
    return Status::Ok();
  }
  return Unsupported(origin, "pre_tokenizer type", p["type"]);
}

}  // namespace

Status HfTokenizer::Impl::ReadMerges(const json& model) {
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
    auto a = vocab.find(left), b = vocab.find(right), ab = vocab.find(left + right);
    if (a == vocab.end() || b == vocab.end() || ab == vocab.end()) {
      return Status::InvalidArgument(origin + ": merge " + std::to_string(rank) + " '" + left + " " + right +
                                     "' uses a token that is not in model.vocab");
    }
    merges.emplace(Impl::Pair(a->second, b->second), std::make_pair(rank, ab->second));
    ++rank;
  }
  return Status::Ok();
}

Status HfTokenizer::Impl::ReadSpecialTokens(const std::string& config_json) {
  if (config_json.empty()) return Status::Ok();
  SLUICE_ASSIGN_OR_RETURN(json c, ParseBoundedJson<json>(config_json, origin + ": its tokenizer_config.json"));
  if (c.is_discarded() || !c.is_object()) {
    return Status::InvalidArgument(origin + ": its tokenizer_config.json is not a JSON object");
  }
  for (auto [key, slot] :
       {std::pair<const char*, TokenId*>{"bos_token", &bos}, {"eos_token", &eos}, {"pad_token", &pad}}) {
    SLUICE_ASSIGN_OR_RETURN(const std::optional<std::string> token,
                            SpecialTokenText(c, key, origin + ": its tokenizer_config.json"));
    if (!token || token->empty()) continue;
    const std::string& text = *token;
    auto it = vocab.find(text);
    if (it == vocab.end()) {
      return Status::InvalidArgument(origin + ": tokenizer_config.json " + key + " '" + text +
                                     "' is not a token of the vocabulary");
    }
    *slot = it->second;
  }
  return Status::Ok();
}

Result<std::unique_ptr<HfTokenizer>> HfTokenizer::FromJson(const std::string& tokenizer_json,
                                                           const std::string& config_json, const std::string& origin) {
  SLUICE_ASSIGN_OR_RETURN(json j, ParseBoundedJson<json>(tokenizer_json, origin));
  if (j.is_discarded() || !j.is_object()) return Status::InvalidArgument(origin + ": not a JSON object");
  auto impl = std::make_unique<Impl>();
  impl->origin = origin;
  if (!j.contains("model") || !j["model"].is_object()) return Status::InvalidArgument(origin + ": no 'model'");
  const json& model = j["model"];
  const std::string type = model.value("type", std::string("BPE"));
  if (type != "BPE") return Unsupported(origin, "model type", model["type"]);
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && !model[key].is_null() &&
        !(model[key].is_string() && model[key].get<std::string>().empty())) {
      return Unsupported(origin, std::string("BPE ") + key, model[key]);
    }
  }
  impl->byte_fallback = model.value("byte_fallback", false);
  impl->fuse_unk = model.value("fuse_unk", false);
  // Byte-level unless the file says otherwise: a byte-fallback model, or a
  // decoder other than ByteLevel, is SentencePiece-style.
  const json decoder = j.value("decoder", json());
  const bool byte_level_decoder =
      decoder.is_null() || (decoder.is_object() && decoder.value("type", std::string()) == "ByteLevel");
  impl->byte_level = byte_level_decoder && !impl->byte_fallback;
  if (byte_level_decoder && impl->byte_fallback) {
    return Unsupported(origin, "BPE byte_fallback with a ByteLevel decoder", model["byte_fallback"]);
  }
  if (model.contains("dropout") && !model["dropout"].is_null())
    return Unsupported(origin, "BPE dropout", model["dropout"]);
  impl->ignore_merges = model.value("ignore_merges", false);

  // Vocabulary.
  if (!model.contains("vocab") || !model["vocab"].is_object())
    return Status::InvalidArgument(origin + ": no model.vocab");
  TokenId max_id = -1;
  // Which token each id belongs to: two tokens with one id would decode as
  // whichever came last.
  std::unordered_map<TokenId, std::string> id_owner;
  for (const auto& [token, id] : model["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (int64_t{1} << 24)) {
      return Status::InvalidArgument(origin + ": model.vocab['" + token + "'] is not an id in [0, 2^24)");
    }
    const TokenId v = id.get<TokenId>();
    const auto [owner, fresh] = id_owner.emplace(v, token);
    if (!fresh) {
      return Status::InvalidArgument(origin + ": model.vocab gives id " + std::to_string(v) + " to both '" +
                                     owner->second + "' and '" + token + "'");
    }
    impl->vocab.emplace(token, v);
    max_id = std::max(max_id, v);
  }
  // Added tokens.
  std::string normalized_added;  // one with normalized true, if any
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
      // Every added token is matched in the raw text. The Rust library
      // matches a `normalized` one in the normalized text instead, which
      // for byte-level tokenizers (NFC leaves token texts as they are) is
      // the same; a SentencePiece-style normalizer (Prepend, Replace) would
      // change the token's text, so that case is refused below.
      if (a.value("normalized", !t.special)) normalized_added = t.content;
      t.rstrip = a.value("rstrip", false);
      t.single_word = a.value("single_word", false);
      // The same token in model.vocab under the same id (Llama 2's <s>) is
      // fine; another id, or an id another token holds, is a contradiction.
      if (const auto known = impl->vocab.find(t.content); known != impl->vocab.end() && known->second != t.id) {
        return Status::InvalidArgument(origin + ": added token '" + t.content + "' has id " + std::to_string(t.id) +
                                       " but is already token " + std::to_string(known->second));
      }
      if (const auto [owner, fresh] = id_owner.emplace(t.id, t.content); !fresh && owner->second != t.content) {
        return Status::InvalidArgument(origin + ": added token '" + t.content + "' has id " + std::to_string(t.id) +
                                       ", which is already token '" + owner->second + "'");
      }
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
  if (model.contains("unk_token") && model["unk_token"].is_string() && !model["unk_token"].get<std::string>().empty()) {
    auto it = impl->vocab.find(model["unk_token"].get<std::string>());
    if (it == impl->vocab.end()) {
      return Status::InvalidArgument(origin + ": model.unk_token '" + model["unk_token"].get<std::string>() +
                                     "' is not in model.vocab");
    }
    impl->unk = it->second;
  }
  // Byte symbols: every byte's byte-level text, or its <0xXX> byte-fallback
  // token, must be in the vocabulary.
  for (int b = 0; b < 256 && !impl->byte_level; ++b) {
    if (!impl->byte_fallback) break;
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = impl->vocab.find(name);
    if (it == impl->vocab.end()) {
      return Status::InvalidArgument(origin + ": model.vocab lacks the byte-fallback token " + name);
    }
    impl->byte_ids[static_cast<size_t>(b)] = it->second;
  }
  for (int b = 0; b < 256 && impl->byte_level; ++b) {
    auto it = impl->vocab.find(ByteLevel().byte_to_text[static_cast<size_t>(b)]);
    if (it == impl->vocab.end()) {
      return Status::InvalidArgument(origin + ": model.vocab lacks the byte-level token of byte " + std::to_string(b) +
                                     " ('" + ByteLevel().byte_to_text[static_cast<size_t>(b)] +
                                     "'): not a byte-level BPE vocabulary");
    }
    impl->byte_ids[static_cast<size_t>(b)] = it->second;
  }
  SLUICE_RETURN_IF_ERROR(impl->ReadMerges(model));
  // Normalizer, pre-tokenizer, decoder.
  SLUICE_RETURN_IF_ERROR(ParseNormalizer(j.value("normalizer", json()), origin, &impl->normalizers));
  SLUICE_RETURN_IF_ERROR(ParsePreTokenizer(j.value("pre_tokenizer", json()), origin, &impl->pre_tokenizers));
  if (!impl->byte_level) {
    SLUICE_RETURN_IF_ERROR(ParseDecoder(decoder, origin, &impl->decoders));
    if (!normalized_added.empty() && !impl->normalizers.empty()) {
      return Status::Unimplemented(origin + ": added token '" + normalized_added +
                                   "' is matched in normalized text (normalized true), which a SentencePiece-style "
                                   "normalizer changes: not supported");
    }
    for (const PreTokenizer& p : impl->pre_tokenizers) {
      if (p.kind == PreTokenizer::Kind::kByteLevel) {
        return Unsupported(origin, "pre_tokenizer ByteLevel without a ByteLevel decoder", j["pre_tokenizer"]);
      }
    }
  } else {
    for (const PreTokenizer& p : impl->pre_tokenizers) {
      if (p.kind == PreTokenizer::Kind::kMetaspace) {
        return Unsupported(origin, "pre_tokenizer Metaspace with a byte-level model (a ByteLevel or no decoder)",
                           j["pre_tokenizer"]);
      }
    }
  }
  SLUICE_RETURN_IF_ERROR(impl->ReadSpecialTokens(config_json));
  return std::unique_ptr<HfTokenizer>(new HfTokenizer(std::move(impl)));
}

Result<std::vector<TokenId>> HfTokenizer::Encode(std::string_view text) const {
  std::vector<TokenId> out;
  Status encoded = impl_->SplitOnAdded(text, &out);
  if (!encoded.ok()) return encoded.WithContext(impl_->origin);
  return out;
}

Result<std::string> HfTokenizer::Decode(const std::vector<TokenId>& ids, bool skip_special) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (TokenId id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= impl_->id_to_token.size() ||
        impl_->id_to_token[static_cast<size_t>(id)].empty()) {
      return Status::OutOfRange("token id " + std::to_string(id) + " is not in the vocabulary");
    }
    if (skip_special && impl_->is_special[static_cast<size_t>(id)]) continue;
    tokens.push_back(impl_->id_to_token[static_cast<size_t>(id)]);
  }
  if (!impl_->byte_level) return impl_->DecodeChain(std::move(tokens));
  std::string text;
  for (const std::string& t : tokens) text += t;
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
