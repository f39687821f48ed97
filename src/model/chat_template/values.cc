#include "chat_template/values.h"

#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <sstream>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "bounded_json.h"

namespace sluice::model::jinja {

std::string Where(Pos pos) {
  return "chat template line " + std::to_string(pos.line) + ", column " + std::to_string(pos.column);
}

Status Error(Pos pos, const std::string& what) { return Status::InvalidArgument(Where(pos) + ": " + what); }
thread_local RenderBudget* active_budget = nullptr;

Status Spend(uint64_t steps, Pos pos) {
  return active_budget == nullptr ? Status::Ok() : active_budget->Spend(steps, pos);
}

Status CheckGrowth(size_t size, size_t more, Pos pos) {
  if (more > kMaxOutputBytes || size > kMaxOutputBytes - more) {
    return Error(pos, "a string longer than " + std::to_string(kMaxOutputBytes >> 20) + " MiB");
  }
  return Status::Ok();
}

char32_t NextCodePoint(std::string_view s, size_t* i) {
  utf8proc_int32_t cp = 0;
  const utf8proc_ssize_t n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + *i),
                                              static_cast<utf8proc_ssize_t>(s.size() - *i), &cp);
  if (n <= 0) {
    *i += 1;
    return 0xFFFD;
  }
  *i += static_cast<size_t>(n);
  return static_cast<char32_t>(cp);
}

std::u32string Decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) out.push_back(NextCodePoint(s, &i));
  return out;
}

std::string Encode(std::u32string_view cps) {
  std::string out;
  out.reserve(cps.size());
  for (char32_t c : cps) AppendUtf8(c, &out);
  return out;
}

int64_t CodePointCount(std::string_view s) {
  int64_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80 ? 1 : 0;
  return n;
}

bool IsPySpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool IsLineBreak(char32_t c) {
  return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || (c >= 0x1C && c <= 0x1E) || c == 0x85 || c == 0x2028 ||
         c == 0x2029;
}

void AppendCase(char32_t c, Case to, std::string* out) {
  struct Special {
    char32_t c;
    const char* upper;
    const char* lower;
    const char* title;
  };
  static constexpr Special kSpecial[] = {
      {0x00DF, "SS", "\u00DF", "Ss"},           {0x0130, "\u0130", "i\u0307", "\u0130"},
      {0x0149, "\u02BCN", "\u0149", "\u02BCN"}, {0x01F0, "J\u030C", "\u01F0", "J\u030C"},
      {0xFB00, "FF", "\uFB00", "Ff"},           {0xFB01, "FI", "\uFB01", "Fi"},
      {0xFB02, "FL", "\uFB02", "Fl"},           {0xFB03, "FFI", "\uFB03", "Ffi"},
      {0xFB04, "FFL", "\uFB04", "Ffl"},         {0xFB05, "ST", "\uFB05", "St"},
      {0xFB06, "ST", "\uFB06", "St"},
  };
  for (const Special& s : kSpecial) {
    if (s.c == c) {
      *out += to == Case::kUpper ? s.upper : to == Case::kLower ? s.lower : s.title;
      return;
    }
  }
  const auto cp = static_cast<utf8proc_int32_t>(c);
  AppendUtf8(static_cast<char32_t>(to == Case::kUpper   ? utf8proc_toupper(cp)
                                   : to == Case::kLower ? utf8proc_tolower(cp)
                                                        : utf8proc_totitle(cp)),
             out);
}

bool IsCased(char32_t c) {
  const utf8proc_category_t cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}

bool IsPrintable(char32_t c) {
  if (c == ' ') return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

std::string MapCase(std::string_view s, Case to) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) AppendCase(NextCodePoint(s, &i), to, &out);
  return out;
}

std::string PyTitle(std::string_view s) {
  std::string out;
  bool previous_cased = false;
  for (size_t i = 0; i < s.size();) {
    const char32_t c = NextCodePoint(s, &i);
    AppendCase(c, previous_cased ? Case::kLower : Case::kTitle, &out);
    previous_cased = IsCased(c);
  }
  return out;
}

std::string PyCapitalize(std::string_view s) {
  std::string out;
  bool first = true;
  for (size_t i = 0; i < s.size();) {
    const char32_t c = NextCodePoint(s, &i);
    AppendCase(c, first ? Case::kTitle : Case::kLower, &out);
    first = false;
  }
  return out;
}

std::string JinjaTitle(std::string_view s) {
  std::string out;
  bool word_start = true;
  for (size_t i = 0; i < s.size();) {
    const char32_t c = NextCodePoint(s, &i);
    if (IsPySpace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<') {
      AppendUtf8(c, &out);
      word_start = true;
    } else {
      AppendCase(c, word_start ? Case::kUpper : Case::kLower, &out);
      word_start = false;
    }
  }
  return out;
}

std::string PyStrip(std::string_view s, const std::optional<std::u32string>& chars, bool left, bool right) {
  const std::u32string cps = Decode(s);
  auto drop = [&](char32_t c) { return chars ? chars->find(c) != std::u32string::npos : IsPySpace(c); };
  size_t b = 0, e = cps.size();
  if (left) {
    while (b < e && drop(cps[b])) ++b;
  }
  if (right) {
    while (e > b && drop(cps[e - 1])) --e;
  }
  return Encode(std::u32string_view(cps).substr(b, e - b));
}

std::vector<std::string> PySplitWhitespace(std::string_view s, int64_t maxsplit, bool from_right) {
  std::u32string cps = Decode(s);
  if (from_right) std::reverse(cps.begin(), cps.end());
  std::vector<std::string> out;
  size_t i = 0;
  while (true) {
    while (i < cps.size() && IsPySpace(cps[i])) ++i;
    if (i == cps.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      size_t e = cps.size();
      while (e > i && IsPySpace(cps[e - 1])) --e;
      std::u32string rest = cps.substr(i, e - i);
      if (from_right) std::reverse(rest.begin(), rest.end());
      out.push_back(Encode(rest));
      break;
    }
    size_t e = i;
    while (e < cps.size() && !IsPySpace(cps[e])) ++e;
    std::u32string word = cps.substr(i, e - i);
    if (from_right) std::reverse(word.begin(), word.end());
    out.push_back(Encode(word));
    i = e;
  }
  if (from_right) std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> PySplit(const std::string& s, const std::string& sep, int64_t maxsplit, bool from_right) {
  std::vector<std::string> out;
  if (!from_right) {
    size_t at = 0;
    for (size_t hit = 0;
         (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) && (hit = s.find(sep, at)) != std::string::npos;
         at = hit + sep.size()) {
      out.push_back(s.substr(at, hit - at));
    }
    out.push_back(s.substr(at));
    return out;
  }
  size_t end = s.size();
  int64_t splits = 0;
  while ((maxsplit < 0 || splits < maxsplit) && end >= sep.size()) {
    const size_t hit = s.rfind(sep, end - sep.size());
    if (hit == std::string::npos) break;
    out.push_back(s.substr(hit + sep.size(), end - hit - sep.size()));
    end = hit;
    ++splits;
  }
  out.push_back(s.substr(0, end));
  std::reverse(out.begin(), out.end());
  return out;
}

Result<std::string> PyReplace(const std::string& s, const std::string& old, const std::string& repl, int64_t count,
                              Pos pos) {
  std::string out;
  int64_t done = 0;
  if (old.empty()) {
    size_t i = 0;
    while (true) {
      if (count < 0 || done < count) {
        SLUICE_RETURN_IF_ERROR(CheckGrowth(out.size(), repl.size() + s.size() - i, pos));
        out += repl;
        ++done;
      }
      if (i >= s.size()) break;
      const size_t start = i;
      NextCodePoint(s, &i);
      out.append(s, start, i - start);
    }
    return out;
  }
  size_t at = 0;
  for (size_t hit = 0; (count < 0 || done < count) && (hit = s.find(old, at)) != std::string::npos;
       at = hit + old.size()) {
    SLUICE_RETURN_IF_ERROR(CheckGrowth(out.size(), hit - at + repl.size(), pos));
    out.append(s, at, hit - at);
    out += repl;
    ++done;
  }
  out.append(s, at, std::string::npos);
  return out;
}

Value Str(std::string s) { return Make<std::string>(std::move(s)); }

Value Int(int64_t i) { return Make<int64_t>(i); }

Value Float(double d) { return Make<double>(d); }

Value Bool(bool b) { return Make<bool>(b); }

Value NoneValue() { return Make<None>(None{}); }

Value Undef(std::string what) { return Make<Undefined>(Undefined{std::move(what)}); }

int DepthOf(const Value& v) {
  if (v.Is<ListPtr>()) return v.As<ListPtr>()->depth;
  if (v.Is<DictPtr>()) return v.As<DictPtr>()->depth;
  return 0;
}

Value ListValue(std::vector<Value> items, bool tuple) {
  auto list = std::make_shared<List>();
  for (const Value& v : items) list->depth = std::max(list->depth, DepthOf(v) + 1);
  list->items = std::move(items);
  list->tuple = tuple;
  return Make<ListPtr>(std::move(list));
}

Value DictValue(Dict dict) {
  dict.depth = 1;
  for (const auto& [k, v] : dict.items) dict.depth = std::max(dict.depth, DepthOf(v) + 1);
  return Make<DictPtr>(std::make_shared<const Dict>(std::move(dict)));
}

uint64_t ShallowBytes(const Value& v) {
  auto item_bytes = [](const Value& item) {
    return sizeof(Value) + (item.Is<std::string>() ? item.As<std::string>().size() : 0);
  };
  uint64_t n = 0;
  if (v.Is<std::string>()) {
    n = v.As<std::string>().size();
  } else if (v.Is<ListPtr>()) {
    for (const Value& item : v.As<ListPtr>()->items) n += item_bytes(item);
  } else if (v.Is<DictPtr>()) {
    for (const auto& [k, item] : v.As<DictPtr>()->items) n += k.size() + item_bytes(item);
  }
  return n;
}

Value StringList(const std::vector<std::string>& items) {
  std::vector<Value> out;
  out.reserve(items.size());
  for (const std::string& s : items) out.push_back(Str(s));
  return ListValue(std::move(out));
}

bool IsNumber(const Value& v) { return v.Is<bool>() || v.Is<int64_t>() || v.Is<double>(); }

bool IsIntegral(const Value& v) { return v.Is<bool>() || v.Is<int64_t>(); }  // Python's bool is an int

int64_t AsInt(const Value& v) { return v.Is<bool>() ? (v.As<bool>() ? 1 : 0) : v.As<int64_t>(); }

double AsDouble(const Value& v) { return v.Is<double>() ? v.As<double>() : static_cast<double>(AsInt(v)); }

std::string TypeName(const Value& v) {
  if (v.Is<Undefined>()) return "undefined";
  if (v.Is<None>()) return "none";
  if (v.Is<bool>()) return "bool";
  if (v.Is<int64_t>()) return "int";
  if (v.Is<double>()) return "float";
  if (v.Is<std::string>()) return "str";
  if (v.Is<ListPtr>()) return v.As<ListPtr>()->tuple ? "tuple" : "list";
  if (v.Is<DictPtr>()) return "dict";
  if (v.Is<NamespacePtr>()) return "namespace";
  return "function";
}

std::string TypeRepr(const Value& v) { return v.Is<None>() ? "None" : TypeName(v) + " object"; }

Status UndefinedError(Pos pos, const Value& v) { return Error(pos, v.As<Undefined>().what); }

bool Truthy(const Value& v) {
  if (v.Is<Undefined>() || v.Is<None>()) return false;
  if (v.Is<bool>()) return v.As<bool>();
  if (v.Is<int64_t>()) return v.As<int64_t>() != 0;
  if (v.Is<double>()) return v.As<double>() != 0.0;
  if (v.Is<std::string>()) return !v.As<std::string>().empty();
  if (v.Is<ListPtr>()) return !v.As<ListPtr>()->items.empty();
  if (v.Is<DictPtr>()) return !v.As<DictPtr>()->items.empty();
  return true;
}

bool Equal(const Value& a, const Value& b) {
  // A list may hold one sublist many times: comparing such values is
  // exponential in their nesting, so each comparison is a step (a string
  // comparison one per 64 bytes); over budget, the answer is moot.
  const uint64_t bytes = a.Is<std::string>() ? a.As<std::string>().size() : 0;
  if (!Spend(1 + bytes / 64, Pos{}).ok()) return false;
  if (IsNumber(a) && IsNumber(b)) {
    if (IsIntegral(a) && IsIntegral(b)) return AsInt(a) == AsInt(b);
    return AsDouble(a) == AsDouble(b);
  }
  if (a.data.index() != b.data.index()) return false;
  if (a.Is<Undefined>() || a.Is<None>()) return true;
  if (a.Is<std::string>()) return a.As<std::string>() == b.As<std::string>();
  if (a.Is<ListPtr>()) {
    const List& x = *a.As<ListPtr>();
    const List& y = *b.As<ListPtr>();
    if (x.tuple != y.tuple || x.items.size() != y.items.size()) return false;
    for (size_t i = 0; i < x.items.size(); ++i) {
      if (!Equal(x.items[i], y.items[i])) return false;
    }
    return true;
  }
  if (a.Is<DictPtr>()) {
    const Dict& x = *a.As<DictPtr>();
    const Dict& y = *b.As<DictPtr>();
    if (x.items.size() != y.items.size()) return false;
    for (const auto& [k, v] : x.items) {
      const Value* other = y.Find(k);
      if (other == nullptr || !Equal(v, *other)) return false;
    }
    return true;
  }
  if (a.Is<NamespacePtr>()) return a.As<NamespacePtr>() == b.As<NamespacePtr>();
  return false;
}

Result<int> Compare(const Value& a, const Value& b, Pos pos, std::string_view op) {
  if (a.Is<Undefined>()) return UndefinedError(pos, a);
  if (b.Is<Undefined>()) return UndefinedError(pos, b);
  if (IsNumber(a) && IsNumber(b)) {
    if (IsIntegral(a) && IsIntegral(b)) return AsInt(a) < AsInt(b) ? -1 : AsInt(a) > AsInt(b) ? 1 : 0;
    const double x = AsDouble(a), y = AsDouble(b);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.Is<std::string>() && b.Is<std::string>()) {
    const int c = a.As<std::string>().compare(b.As<std::string>());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.Is<ListPtr>() && b.Is<ListPtr>() && a.As<ListPtr>()->tuple == b.As<ListPtr>()->tuple) {
    const auto& x = a.As<ListPtr>()->items;
    const auto& y = b.As<ListPtr>()->items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (Equal(x[i], y[i])) continue;
      return Compare(x[i], y[i], pos, op);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  return Error(pos, "'" + std::string(op) + "' is not supported between " + TypeName(a) + " and " + TypeName(b));
}

std::string PyFloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string s(buf, result.ptr);
  std::string sign;
  if (s[0] == '-') {
    sign = "-";
    s.erase(0, 1);
  }
  const size_t e = s.find('e');
  std::string digits;
  for (char c : s.substr(0, e)) {
    if (c != '.') digits += c;
  }
  const int decimal_point = std::atoi(s.c_str() + e + 1) + 1;  // value = 0.DIGITS * 10^decimal_point
  std::string out;
  if (decimal_point > -4 && decimal_point <= 16) {
    if (decimal_point <= 0) {
      out = "0." + std::string(static_cast<size_t>(-decimal_point), '0') + digits;
    } else if (decimal_point >= static_cast<int>(digits.size())) {
      out = digits + std::string(static_cast<size_t>(decimal_point) - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, static_cast<size_t>(decimal_point)) + "." +
            digits.substr(static_cast<size_t>(decimal_point));
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    const int exponent = decimal_point - 1;
    const std::string x = std::to_string(std::abs(exponent));
    out += std::string(exponent < 0 ? "e-" : "e+") + (x.size() < 2 ? "0" : "") + x;
  }
  return sign + out;
}

void AppendHex(uint32_t v, int width, std::string* out) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%0*x", width, v);
  *out += buf;
}

void AppendStrRepr(std::string_view s, std::string* out) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  *out += quote;
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    const char32_t c = NextCodePoint(s, &i);
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      *out += '\\';
      *out += static_cast<char>(c);
    } else if (c == '\t') {
      *out += "\\t";
    } else if (c == '\n') {
      *out += "\\n";
    } else if (c == '\r') {
      *out += "\\r";
    } else if (c < 0x20 || c == 0x7F) {
      *out += "\\x";
      AppendHex(c, 2, out);
    } else if (c < 0x7F || IsPrintable(c)) {
      out->append(s, start, i - start);
    } else if (c <= 0xFF) {
      *out += "\\x";
      AppendHex(c, 2, out);
    } else if (c <= 0xFFFF) {
      *out += "\\u";
      AppendHex(c, 4, out);
    } else {
      *out += "\\U";
      AppendHex(c, 8, out);
    }
  }
  *out += quote;
}

Status AppendRepr(const Value& v, std::string* out, int depth, Pos pos) {
  if (depth > kMaxValueDepth) return Error(pos, "a value nested too deeply to print");
  // A list holding one sublist many times prints exponentially long.
  SLUICE_RETURN_IF_ERROR(CheckGrowth(out->size(), v.Is<std::string>() ? v.As<std::string>().size() : 0, pos));
  SLUICE_RETURN_IF_ERROR(Spend(1, pos));
  if (v.Is<std::string>()) {
    AppendStrRepr(v.As<std::string>(), out);
  } else if (v.Is<Undefined>()) {
    *out += "Undefined";
  } else if (v.Is<None>()) {
    *out += "None";
  } else if (v.Is<bool>()) {
    *out += v.As<bool>() ? "True" : "False";
  } else if (v.Is<int64_t>()) {
    *out += std::to_string(v.As<int64_t>());
  } else if (v.Is<double>()) {
    *out += PyFloatRepr(v.As<double>());
  } else if (v.Is<ListPtr>()) {
    const List& list = *v.As<ListPtr>();
    *out += list.tuple ? '(' : '[';
    for (size_t i = 0; i < list.items.size(); ++i) {
      if (i > 0) *out += ", ";
      SLUICE_RETURN_IF_ERROR(AppendRepr(list.items[i], out, depth + 1, pos));
    }
    if (list.tuple && list.items.size() == 1) *out += ',';
    *out += list.tuple ? ')' : ']';
  } else if (v.Is<DictPtr>() || v.Is<NamespacePtr>()) {
    const Dict& dict = v.Is<DictPtr>() ? *v.As<DictPtr>() : v.As<NamespacePtr>()->attrs;
    if (v.Is<NamespacePtr>()) *out += "<Namespace ";
    *out += '{';
    bool first = true;
    for (const auto& [k, item] : dict.items) {
      if (!first) *out += ", ";
      first = false;
      AppendStrRepr(k, out);
      *out += ": ";
      SLUICE_RETURN_IF_ERROR(AppendRepr(item, out, depth + 1, pos));
    }
    *out += '}';
    if (v.Is<NamespacePtr>()) *out += '>';
  } else {
    return Error(pos, "cannot print function '" + v.As<Function>().name + "' (call it)");
  }
  return Status::Ok();
}

Result<std::string> ToStr(const Value& v, Pos pos) {
  if (v.Is<std::string>()) return v.As<std::string>();
  if (v.Is<Undefined>()) return std::string();
  std::string out;
  SLUICE_RETURN_IF_ERROR(AppendRepr(v, &out, 0, pos));
  return out;
}

void AppendJsonString(std::string_view s, bool ensure_ascii, std::string* out) {
  *out += '"';
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    const char32_t c = NextCodePoint(s, &i);
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (c < 0x20 || (ensure_ascii && c > 0x7E)) {
          if (c > 0xFFFF) {  // a surrogate pair, as Python writes it
            const uint32_t v = c - 0x10000;
            *out += "\\u";
            AppendHex(0xD800 + (v >> 10), 4, out);
            *out += "\\u";
            AppendHex(0xDC00 + (v & 0x3FF), 4, out);
          } else {
            *out += "\\u";
            AppendHex(c, 4, out);
          }
        } else {
          out->append(s, start, i - start);
        }
    }
  }
  *out += '"';
}

Status AppendJson(const Value& v, const JsonStyle& style, int level, std::string* out, Pos pos) {
  if (level > kMaxValueDepth) return Error(pos, "tojson: a value nested too deeply");
  const size_t indent = style.indent ? style.indent->size() * static_cast<size_t>(level + 1) : 0;
  SLUICE_RETURN_IF_ERROR(
      CheckGrowth(out->size(), indent + (v.Is<std::string>() ? v.As<std::string>().size() : 0), pos));
  SLUICE_RETURN_IF_ERROR(Spend(1, pos));
  if (v.Is<None>()) {
    *out += "null";
  } else if (v.Is<bool>()) {
    *out += v.As<bool>() ? "true" : "false";
  } else if (v.Is<int64_t>()) {
    *out += std::to_string(v.As<int64_t>());
  } else if (v.Is<double>()) {
    const double d = v.As<double>();
    *out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : PyFloatRepr(d);
  } else if (v.Is<std::string>()) {
    AppendJsonString(v.As<std::string>(), style.ensure_ascii, out);
  } else if (v.Is<ListPtr>() || v.Is<DictPtr>()) {
    const bool is_list = v.Is<ListPtr>();
    const size_t n = is_list ? v.As<ListPtr>()->items.size() : v.As<DictPtr>()->items.size();
    if (n == 0) {
      *out += is_list ? "[]" : "{}";
      return Status::Ok();
    }
    std::string newline;
    if (style.indent) {
      newline = "\n";
      for (int i = 0; i <= level; ++i) newline += *style.indent;
    }
    *out += is_list ? '[' : '{';
    *out += newline;
    if (is_list) {
      const auto& items = v.As<ListPtr>()->items;
      for (size_t i = 0; i < n; ++i) {
        if (i > 0) *out += style.item_separator + newline;
        SLUICE_RETURN_IF_ERROR(AppendJson(items[i], style, level + 1, out, pos));
      }
    } else {
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& item : v.As<DictPtr>()->items) items.push_back(&item);
      if (style.sort_keys) {
        std::stable_sort(items.begin(), items.end(), [](const auto* a, const auto* b) { return a->first < b->first; });
      }
      for (size_t i = 0; i < n; ++i) {
        if (i > 0) *out += style.item_separator + newline;
        AppendJsonString(items[i]->first, style.ensure_ascii, out);
        *out += style.key_separator;
        SLUICE_RETURN_IF_ERROR(AppendJson(items[i]->second, style, level + 1, out, pos));
      }
    }
    if (style.indent) {
      *out += '\n';
      for (int i = 0; i < level; ++i) *out += *style.indent;
    }
    *out += is_list ? ']' : '}';
  } else {
    return Error(pos, "tojson: a value of type " + TypeName(v) + " is not JSON serializable");
  }
  return Status::Ok();
}

Result<Value> FromJson(const Json& j, int depth) {
  if (depth > kMaxValueDepth) return Status::InvalidArgument("chat template context: nested too deeply");
  switch (j.type()) {
    case Json::value_t::null:
      return NoneValue();
    case Json::value_t::boolean:
      return Bool(j.get<bool>());
    case Json::value_t::number_integer:
      return Int(j.get<int64_t>());
    case Json::value_t::number_unsigned: {
      const auto u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return Status::InvalidArgument("chat template context: integer " + std::to_string(u) +
                                       " is outside the 64-bit range");
      }
      return Int(static_cast<int64_t>(u));
    }
    case Json::value_t::number_float:
      return Float(j.get<double>());
    case Json::value_t::string:
      return Str(j.get<std::string>());
    case Json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const Json& item : j) {
        SLUICE_ASSIGN_OR_RETURN(Value v, FromJson(item, depth + 1));
        items.push_back(std::move(v));
      }
      return ListValue(std::move(items));
    }
    case Json::value_t::object: {
      Dict dict;
      dict.items.reserve(j.size());
      for (const auto& [k, item] : j.items()) {  // keys are unique already
        SLUICE_ASSIGN_OR_RETURN(Value v, FromJson(item, depth + 1));
        dict.items.emplace_back(k, std::move(v));
      }
      return DictValue(std::move(dict));
    }
    default:
      return Status::InvalidArgument("chat template context: a binary or discarded JSON value");
  }
}

}  // namespace sluice::model::jinja
