#include "chat_template/lexer.h"

#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <optional>
#include <sstream>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "sluice/common/enum_names.h"

namespace sluice::model::jinja {
namespace {

bool IsNameStart(char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0 || c == '_'; }
bool IsNameChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_'; }
int HexValue(char c) {
  if (IsDigit(c)) return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return 99;
}

// Splits a template into text and tag tokens as Jinja's lexer does with
// transformers' settings: trim_blocks (a block or comment tag eats the one
// newline after it), lstrip_blocks (the spaces and tabs before a block or
// comment tag that starts its line go), '-' (all whitespace on that side
// goes), '+' (neither of the first two applies), and keep_trailing_newline
// off (the source's one final newline goes). Line ends are normalized to
// "\n" first, as Jinja does.
class Lexer {
 public:
  explicit Lexer(std::string_view source) {
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_ += source[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  Result<std::vector<Token>> Run() {
    const size_t n = src_.size();
    while (pos_ < n) {
      size_t open = std::string::npos;
      for (size_t k = src_.find('{', pos_); k != std::string::npos && k + 1 < n; k = src_.find('{', k + 1)) {
        if (src_[k + 1] == '{' || src_[k + 1] == '%' || src_[k + 1] == '#') {
          open = k;
          break;
        }
      }
      if (open == std::string::npos) {
        Push(Tok::kData, src_.substr(pos_), pos_);
        break;
      }
      std::string text = src_.substr(pos_, open - pos_);
      const char type = src_[open + 1];
      size_t after = open + 2;
      const char sign = after < n && (src_[after] == '-' || src_[after] == '+') ? src_[after] : '\0';
      if (sign != '\0') ++after;
      if (sign == '-') {
        text = PyStrip(text, std::nullopt, false, true);
      } else if (sign != '+' && type != '{') {
        const size_t nl = text.rfind('\n');
        const size_t line_start = nl == std::string::npos ? 0 : nl + 1;
        if ((line_start > 0 || line_starting_) && text.find_first_not_of(" \t", line_start) == std::string::npos) {
          text.resize(line_start);
        }
      }
      if (!text.empty()) Push(Tok::kData, std::move(text), pos_);
      if (type == '#') {
        SLUICE_RETURN_IF_ERROR(SkipComment(open, after));
      } else {
        SLUICE_RETURN_IF_ERROR(LexTag(type, open, after));
      }
    }
    Token eof;
    eof.type = Tok::kEof;
    eof.pos = PosAt(n);
    tokens_.push_back(std::move(eof));
    return std::move(tokens_);
  }

 private:
  // Tokens come in order: the column counts on from the last token's when
  // it is on the same line, so a template of one long line lexes in linear
  // time (counting from the line's start each time was quadratic).
  Pos PosAt(size_t offset) {
    const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    const auto line = static_cast<size_t>(it - line_starts_.begin());  // 1-based
    const size_t start = line_starts_[line - 1];
    size_t from = start;
    int column = 1;
    if (last_offset_ >= start && last_offset_ <= offset && last_pos_.line == static_cast<int>(line)) {
      from = last_offset_;
      column = last_pos_.column;
    }
    last_pos_ = {static_cast<int>(line),
                 column + static_cast<int>(CodePointCount(std::string_view(src_).substr(from, offset - from)))};
    last_offset_ = offset;
    return last_pos_;
  }

  void Push(Tok type, std::string text, size_t offset) {
    Token t;
    t.type = type;
    t.text = std::move(text);
    t.pos = PosAt(offset);
    tokens_.push_back(std::move(t));
  }

  // The end of the whitespace at src_[i] (Python's \s*).
  size_t SkipWhitespace(size_t i) const {
    while (i < src_.size()) {
      size_t next = i;
      if (!IsPySpace(NextCodePoint(src_, &next))) break;
      i = next;
    }
    return i;
  }

  // After a tag: the lexer is at a line's start when the tag ate its newline.
  void EndTag(size_t end) {
    pos_ = end;
    line_starting_ = end > 0 && src_[end - 1] == '\n';
  }

  Status SkipComment(size_t open, size_t after) {
    const size_t close = src_.find("#}", after);
    if (close == std::string::npos) return Error(PosAt(open), "comment '{#' is never closed with '#}'");
    size_t end = close + 2;
    const char sign = close > after ? src_[close - 1] : '\0';
    if (sign == '-') {
      end = SkipWhitespace(end);
    } else if (sign != '+' && end < src_.size() && src_[end] == '\n') {
      ++end;
    }
    EndTag(end);
    return Status::Ok();
  }

  // The tokens of a {{ }} or {% %} tag from `after` (past the opener and its
  // sign) to its end, which only counts outside brackets and strings.
  Status LexTag(char type, size_t open, size_t after) {
    const size_t n = src_.size();
    Push(type == '{' ? Tok::kVarBegin : Tok::kBlockBegin, type == '{' ? "{{" : "{%", open);
    if (type == '%') {
      const size_t word = SkipWhitespace(after);
      size_t e = word;
      while (e < n && IsNameChar(src_[e])) ++e;
      if (src_.compare(word, e - word, "raw") == 0) return Error(PosAt(word), "statement 'raw' is not supported");
    }
    std::vector<char> brackets;
    size_t p = after;
    while (true) {
      if (brackets.empty()) {
        size_t end = std::string::npos;
        if (type == '{') {
          if (src_.compare(p, 3, "-}}") == 0) {
            end = SkipWhitespace(p + 3);
          } else if (src_.compare(p, 2, "}}") == 0) {
            end = p + 2;
          }
        } else if (src_.compare(p, 3, "+%}") == 0) {
          end = p + 3;
        } else if (src_.compare(p, 3, "-%}") == 0) {
          end = SkipWhitespace(p + 3);
        } else if (src_.compare(p, 2, "%}") == 0) {
          end = p + 2;
          if (end < n && src_[end] == '\n') ++end;
        }
        if (end != std::string::npos) {
          Push(type == '{' ? Tok::kVarEnd : Tok::kBlockEnd, type == '{' ? "}}" : "%}", p);
          EndTag(end);
          return Status::Ok();
        }
      }
      if (p >= n) {
        return Error(PosAt(open), type == '{' ? "'{{' is never closed with '}}'" : "'{%' is never closed with '%}'");
      }
      size_t next = p;
      const char32_t c = NextCodePoint(src_, &next);
      if (IsPySpace(c)) {
        p = next;
        continue;
      }
      Token t;
      t.pos = PosAt(p);
      const char ch = src_[p];
      if (ch == '\'' || ch == '"') {
        size_t e = p + 1;
        while (e < n && src_[e] != ch) e += src_[e] == '\\' ? 2 : 1;
        if (e >= n) return Error(t.pos, "string literal is never closed");
        t.type = Tok::kString;
        SLUICE_ASSIGN_OR_RETURN(t.text, Unescape(std::string_view(src_).substr(p + 1, e - p - 1), t.pos));
        p = e + 1;
      } else if (IsDigit(ch)) {
        SLUICE_ASSIGN_OR_RETURN(p, LexNumber(p, &t));
      } else if (IsNameStart(ch)) {
        size_t e = p;
        while (e < n && IsNameChar(src_[e])) ++e;
        t.type = Tok::kName;
        t.text = src_.substr(p, e - p);
        p = e;
      } else {
        static constexpr const char* kOperators[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*",
                                                     "/",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                                     "<",  ">",  "=",  ".",  ":",  "|",  ",", ";"};
        const char* op = nullptr;
        for (const char* candidate : kOperators) {
          if (src_.compare(p, std::strlen(candidate), candidate) == 0) {
            op = candidate;
            break;
          }
        }
        if (op == nullptr) return Error(t.pos, "unexpected character '" + src_.substr(p, next - p) + "' in a tag");
        t.type = Tok::kOp;
        t.text = op;
        p += t.text.size();
        if (t.text == "(" || t.text == "[" || t.text == "{") {
          brackets.push_back(t.text[0]);
        } else if (t.text == ")" || t.text == "]" || t.text == "}") {
          const char want = t.text == ")" ? '(' : t.text == "]" ? '[' : '{';
          if (brackets.empty() || brackets.back() != want) return Error(t.pos, "unexpected '" + t.text + "'");
          brackets.pop_back();
        }
      }
      tokens_.push_back(std::move(t));
    }
  }

  // Digits from src_[i] with single underscores between them; the end (i if none).
  size_t Digits(size_t i, int base) const {
    size_t e = i;
    while (e < src_.size() && HexValue(src_[e]) < base) {
      ++e;
      if (e + 1 < src_.size() && src_[e] == '_' && HexValue(src_[e + 1]) < base) ++e;
    }
    return e;
  }

  // An integer (decimal, 0x, 0o, 0b, with '_' between digits) or a float
  // (digits with a fraction and/or an exponent), as Jinja reads them.
  Result<size_t> LexNumber(size_t p, Token* t) {
    const size_t n = src_.size();
    int base = 10;
    size_t b = p;
    if (src_[p] == '0' && p + 1 < n && std::strchr("xXoObB", src_[p + 1]) != nullptr) {
      const char kind = static_cast<char>(std::tolower(static_cast<unsigned char>(src_[p + 1])));
      base = kind == 'x' ? 16 : kind == 'o' ? 8 : 2;
      b = p + 2;
      if (b < n && src_[b] == '_') ++b;
    }
    size_t e = Digits(b, base);
    if (e == b) return Error(PosAt(p), "a number with no digits");
    bool is_float = false;
    // A number right after '.' is an item index (x.0.1), never a fraction.
    const bool after_dot = p > 0 && src_[p - 1] == '.';
    if (base == 10 && !after_dot) {
      if (e + 1 < n && src_[e] == '.' && IsDigit(src_[e + 1])) {
        e = Digits(e + 1, 10);
        is_float = true;
      }
      if (e < n && (src_[e] == 'e' || src_[e] == 'E')) {
        size_t x = e + 1;
        if (x < n && (src_[x] == '+' || src_[x] == '-')) ++x;
        if (x < n && IsDigit(src_[x])) {
          e = Digits(x, 10);
          is_float = true;
        }
      }
    }
    std::string clean;
    for (size_t i = b; i < e; ++i) {
      if (src_[i] != '_') clean += src_[i];
    }
    t->text = src_.substr(p, e - p);
    if (is_float) {
      t->type = Tok::kFloat;
      t->f = std::strtod(clean.c_str(), nullptr);
      return e;
    }
    t->type = Tok::kInt;
    const auto [ptr, ec] = std::from_chars(clean.data(), clean.data() + clean.size(), t->i, base);
    if (ec != std::errc() || ptr != clean.data() + clean.size()) {
      return Error(PosAt(p), "integer " + t->text + " is outside the 64-bit range");
    }
    return e;
  }

  // A string literal's escapes, as Python's unicode-escape codec reads them.
  static Result<std::string> Unescape(std::string_view raw, Pos pos) {
    std::string out;
    for (size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] != '\\' || i + 1 >= raw.size()) {
        out += raw[i];
        continue;
      }
      const char c = raw[++i];
      switch (c) {
        case '\n':
          break;  // a line continuation
        case '\\':
        case '\'':
        case '"':
          out += c;
          break;
        case 'a':
          out += '\a';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'v':
          out += '\v';
          break;
        case 'x':
        case 'u':
        case 'U': {
          const size_t width = c == 'x' ? 2 : c == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (size_t k = 1; k <= width; ++k) {
            if (i + k >= raw.size() || HexValue(raw[i + k]) > 15) {
              return Error(pos, std::string("string literal: truncated \\") + c + " escape");
            }
            cp = cp * 16 + static_cast<uint32_t>(HexValue(raw[i + k]));
          }
          i += width;
          if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
            return Error(pos, "string literal: an escape of an invalid code point");
          }
          AppendUtf8(cp, &out);
          break;
        }
        case 'N':
          return Error(pos, "string literal: \\N{...} escapes are not supported");
        default:
          if (c >= '0' && c <= '7') {
            uint32_t cp = 0;
            size_t k = 0;
            for (; k < 3 && i + k < raw.size() && raw[i + k] >= '0' && raw[i + k] <= '7'; ++k) {
              cp = cp * 8 + static_cast<uint32_t>(raw[i + k] - '0');
            }
            i += k - 1;
            AppendUtf8(cp, &out);
          } else {  // an unknown escape stays as it is, as in Python
            out += '\\';
            out += c;
          }
      }
    }
    return out;
  }

  std::string src_;
  std::vector<size_t> line_starts_;
  size_t last_offset_ = 0;  // PosAt's last answer, where it counts on from
  Pos last_pos_{1, 1};
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  bool line_starting_ = true;
};

}  // namespace

std::string Describe(const Token& t) {
  // "" for the tokens described by their text (names and operators).
  static constexpr const char* kDescriptions[] = {
      "template text",          "'{{'", "'}}'", "'{%'", "'%}'", "", "a string", "a number", "a number", "",
      "the end of the template"};
  static_assert(std::size(kDescriptions) == static_cast<size_t>(Tok::kEof) + 1);
  const std::string described = EnumName(kDescriptions, t.type, "");
  return described.empty() ? "'" + t.text + "'" : described;
}

Result<std::vector<Token>> Lex(std::string_view source) { return Lexer(source).Run(); }

}  // namespace sluice::model::jinja
