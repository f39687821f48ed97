#include "sluice/model/chat_template.h"

#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "bounded_json.h"
#include "sluice/common/file_util.h"
#include "utf8.h"

namespace sluice::model {

namespace {

using Json = nlohmann::ordered_json;

// Bounds that keep a broken or hostile template (a downloaded model's
// template is a program from an untrusted source) from exhausting the stack,
// memory or time: the nesting of expressions (postfix chains and filters
// included) and statements, of values; the size of any one string and of
// what one rendering produces; the steps of one rendering (each expression
// evaluated, statement run and loop iteration; a value copied or compared,
// by its size); and the bytes of the strings and lists it builds, in all
// (a bound on its memory too: nothing lives that was not built).
constexpr int kMaxNesting = 200;
constexpr int kMaxValueDepth = 500;
constexpr size_t kMaxOutputBytes = size_t{64} << 20;
constexpr int64_t kMaxSequenceLength = 10'000'000;
constexpr uint64_t kMaxSteps = 20'000'000;
constexpr uint64_t kMaxBuiltBytes = uint64_t{1} << 30;

// ------------------------------------------------------------ positions

struct Pos {
  int line = 0;
  int column = 0;
};

std::string Where(Pos pos) {
  return "chat template line " + std::to_string(pos.line) + ", column " + std::to_string(pos.column);
}

Status Error(Pos pos, const std::string& what) { return Status::InvalidArgument(Where(pos) + ": " + what); }

// ------------------------------------------------------------- budgets

// What one rendering has spent of kMaxSteps and kMaxBuiltBytes. Sticky:
// once over, every later charge fails with the first error, so a helper
// that cannot return a Status (Equal) stops early and the next charge in
// the evaluator reports it.
class RenderBudget {
 public:
  Status Spend(uint64_t steps, Pos pos) {
    if (!over_.ok()) return over_;
    steps_ += steps;
    if (steps_ > kMaxSteps) {
      over_ = Error(pos, "the rendering takes more than " + std::to_string(kMaxSteps) +
                             " steps (a loop too long, or a value too large to copy or compare this often)");
    }
    return over_;
  }
  Status Build(uint64_t bytes, Pos pos) {
    if (!over_.ok()) return over_;
    built_ += bytes;
    if (built_ > kMaxBuiltBytes) {
      over_ = Error(
          pos, "the rendering builds more than " + std::to_string(kMaxBuiltBytes >> 20) + " MiB of strings and lists");
    }
    return over_;
  }
  bool over() const { return !over_.ok(); }

 private:
  uint64_t steps_ = 0;
  uint64_t built_ = 0;
  Status over_;
};

// The budget of the rendering running on this thread (null outside one):
// the value helpers below charge it without a parameter threaded through
// every call.
thread_local RenderBudget* active_budget = nullptr;

Status Spend(uint64_t steps, Pos pos) {
  return active_budget == nullptr ? Status::Ok() : active_budget->Spend(steps, pos);
}

// A string about to grow by `more` bytes: refused past kMaxOutputBytes
// before anything is allocated.
Status CheckGrowth(size_t size, size_t more, Pos pos) {
  if (more > kMaxOutputBytes || size > kMaxOutputBytes - more) {
    return Error(pos, "a string longer than " + std::to_string(kMaxOutputBytes >> 20) + " MiB");
  }
  return Status::Ok();
}

// -------------------------------------------------------------- Unicode

using internal::AppendUtf8;

// The code point at s[*i], advancing *i; U+FFFD for a byte that starts no
// valid sequence (strings here are valid UTF-8: JSON strings and template
// source checked by Parse).
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

// Python's str.isspace(), which str.strip() and str.split() and the regex
// class \s (Jinja's whitespace control) follow.
bool IsPySpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Python's str.splitlines() boundaries (besides "\r\n", which is one).
bool IsLineBreak(char32_t c) {
  return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || (c >= 0x1C && c <= 0x1E) || c == 0x85 || c == 0x2028 ||
         c == 0x2029;
}

// Case mappings as Python's: Unicode's full mappings where they are common
// (ß, İ, the Latin ligatures ﬀ..ﬆ, ŉ, ǰ), the simple one-code-point
// mappings elsewhere (Python also applies the rarer full ones, e.g. of
// Greek with ypogegrammeni, and the final-sigma rule).
enum class Case { kUpper, kLower, kTitle };

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

// Python's str.isprintable() for one code point, which repr() follows.
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

// Python's str.title(): a cased code point after an uncased one starts a word.
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

// Python's str.capitalize(): the first code point in title case, the rest lower.
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

// Jinja's title filter (not str.title()): words start after whitespace or
// one of -({[< and take their first code point upper-cased, the rest lower.
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

// Python's str.strip / lstrip / rstrip: whitespace, or the code points of `chars`.
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

// Python's str.split() without a separator: runs of whitespace, at most
// `maxsplit` splits (negative: all), from the left or (rsplit) the right.
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

// Python's str.split(sep) / rsplit(sep) with a non-empty separator.
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

// Python's str.replace(old, new, count): an empty `old` inserts `new`
// before every code point and at the end.
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

// ---------------------------------------------------------------- values

struct Value;
struct List;
struct Dict;
struct Namespace;
using ListPtr = std::shared_ptr<const List>;
using DictPtr = std::shared_ptr<const Dict>;
using NamespacePtr = std::shared_ptr<Namespace>;

struct None {};

// Jinja's default Undefined; `what` describes what was missing, for the
// error that using it in an operation raises.
struct Undefined {
  std::string what;
};

// Something callable: a global function ("range"), a bound method
// ("str.split" with its string as `self`) or a loop's cycle().
struct Function {
  std::string name;
  std::shared_ptr<const Value> self;
};

// A Python value as a template sees it. Lists and dicts are shared and
// never changed once built (transformers renders in an immutable sandbox);
// namespaces are the one mutable kind.
struct Value {
  using Data =
      std::variant<Undefined, None, bool, int64_t, double, std::string, ListPtr, DictPtr, NamespacePtr, Function>;
  Data data;

  template <typename T>
  bool Is() const {
    return std::holds_alternative<T>(data);
  }
  template <typename T>
  const T& As() const {
    return std::get<T>(data);
  }
};

struct List {
  std::vector<Value> items;
  bool tuple = false;  // printed as (a, b)
  int depth = 1;
};

// Keys in insertion order, as Python's dicts keep them (and so tojson).
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  int depth = 1;

  const Value* Find(std::string_view key) const {
    for (const auto& [k, v] : items) {
      if (k == key) return &v;
    }
    return nullptr;
  }
  // A new key goes last; an existing one keeps its place, as in Python.
  void Set(std::string key, Value v) {
    for (auto& [k, old] : items) {
      if (k == key) {
        old = std::move(v);
        return;
      }
    }
    items.emplace_back(std::move(key), std::move(v));
  }
};

struct Namespace {
  Dict attrs;
};

template <typename T>
Value Make(T x) {
  Value v;
  v.data.emplace<T>(std::move(x));
  return v;
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

Value ListValue(std::vector<Value> items, bool tuple = false) {
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

// The bytes a value's own storage holds: a string's, or a list's or dict's
// items (strings are held by value, so copying a list copies them), not
// what the sublists it shares hold.
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

// Python's type names, for messages.
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

// Jinja's name for a value's type in its undefined-value messages.
std::string TypeRepr(const Value& v) { return v.Is<None>() ? "None" : TypeName(v) + " object"; }

// The error of using an undefined value where a value is needed.
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

// Python's ==. Numbers compare by value across int, float and bool; a list
// never equals a tuple; namespaces and functions only themselves.
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

// Python's ordering (<) of numbers, strings (by code point, as UTF-8 bytes
// order them) and lists or tuples of those: -1, 0 or 1.
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

// ------------------------------------------------------- Python printing

// Python's repr() of a float: the shortest digits that read back, in fixed
// notation with ".0" for exponents -4 to 15 and as 1e+16 elsewhere.
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

// Python's repr() of a str.
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

// Python's repr() (as str() of a list or dict prints its items).
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

// Python's str(), as {{ }}, ~ and the string filter print values; an
// undefined value prints as nothing.
Result<std::string> ToStr(const Value& v, Pos pos) {
  if (v.Is<std::string>()) return v.As<std::string>();
  if (v.Is<Undefined>()) return std::string();
  std::string out;
  SLUICE_RETURN_IF_ERROR(AppendRepr(v, &out, 0, pos));
  return out;
}

// transformers' tojson filter: json.dumps(x, ensure_ascii=False, indent=None,
// separators=None, sort_keys=False) and those keywords.
struct JsonStyle {
  bool ensure_ascii = false;
  std::optional<std::string> indent;  // none: one line
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
};

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

// ----------------------------------------------------------------- lexer

enum class Tok { kData, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEof };

struct Token {
  Tok type = Tok::kEof;
  std::string text;  // data, a name, a string's value, an operator
  int64_t i = 0;
  double f = 0;
  Pos pos;
};

std::string Describe(const Token& t) {
  switch (t.type) {
    case Tok::kData:
      return "template text";
    case Tok::kVarBegin:
      return "'{{'";
    case Tok::kVarEnd:
      return "'}}'";
    case Tok::kBlockBegin:
      return "'{%'";
    case Tok::kBlockEnd:
      return "'%}'";
    case Tok::kString:
      return "a string";
    case Tok::kInt:
    case Tok::kFloat:
      return "a number";
    case Tok::kEof:
      return "the end of the template";
    case Tok::kName:
    case Tok::kOp:
      break;
  }
  return "'" + t.text + "'";
}

bool IsNameStart(char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0 || c == '_'; }
bool IsNameChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
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

// ------------------------------------------------------------------- AST

struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;

struct Expr {
  enum class Kind {
    kConst,    // value
    kName,     // name
    kList,     // args: items
    kTuple,    // args: items
    kDict,     // args: key, value, key, value, ...
    kAttr,     // args: base; name: the attribute
    kItem,     // args: base, key
    kSlice,    // args: base, start, stop, step (null where absent)
    kCall,     // args: callee, positional arguments; kwargs
    kFilter,   // args: operand, positional arguments; kwargs; name
    kTest,     // args: operand, positional arguments; kwargs; name; negated
    kNot,      // args: operand
    kNeg,      // args: operand
    kPlus,     // args: operand
    kBinary,   // args: left, right; name: + - * / // % **
    kAnd,      // args: left, right
    kOr,       // args: left, right
    kCompare,  // args: operands; ops: == != < <= > >= in notin between them
    kCond,     // args: value, condition, value otherwise (null: undefined)
    kConcat,   // args: operands of ~
  };
  Kind kind = Kind::kConst;
  Pos pos;
  Value value;
  std::string name;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
  bool negated = false;
  int height = 1;  // of the tree this node tops: how deep evaluating it recurses
};

// An assignment target: a name, names to unpack a sequence into, or a
// namespace attribute (`ns.attr`).
struct Target {
  Pos pos;
  std::vector<std::string> names;
  bool unpack = false;
  std::string attr;
};

struct Stmt;
using Body = std::vector<std::shared_ptr<const Stmt>>;

struct Stmt {
  enum class Kind { kText, kOutput, kIf, kFor, kSet, kSetBlock, kBreak, kContinue, kGeneration };
  Kind kind = Kind::kText;
  Pos pos;
  std::string text;                                // kText
  ExprPtr expr;                                    // kOutput, kSet: the value; kFor: the iterable
  ExprPtr filter;                                  // kFor: `if` (null: none)
  Target target;                                   // kFor, kSet, kSetBlock
  std::vector<std::pair<ExprPtr, Body>> branches;  // kIf: (condition, body); `else` has a null condition
  Body body, else_body;                            // kFor (else_body: for-else), kSetBlock, kGeneration
};

// ------------------------------------------------------------ vocabulary

bool OneOf(std::string_view s, std::initializer_list<std::string_view> list) {
  return std::find(list.begin(), list.end(), s) != list.end();
}

bool IsSupportedFilter(std::string_view name) {
  return OneOf(name,
               {"abs",     "capitalize", "count",      "d",      "default", "first",  "float",  "int",        "items",
                "join",    "last",       "length",     "list",   "lower",   "map",    "reject", "rejectattr", "replace",
                "reverse", "select",     "selectattr", "string", "title",   "tojson", "trim",   "unique",     "upper"});
}

bool IsSupportedTest(std::string_view name) {
  return OneOf(name, {"defined",     "undefined", "none",        "boolean", "true",     "false",    "integer",
                      "float",       "number",    "string",      "mapping", "sequence", "iterable", "callable",
                      "odd",         "even",      "divisibleby", "eq",      "equalto",  "==",       "ne",
                      "!=",          "lt",        "lessthan",    "<",       "le",       "<=",       "gt",
                      "greaterthan", ">",         "ge",          ">=",      "in"});
}

bool IsSupportedStrMethod(std::string_view name) {
  return OneOf(
      name, {"startswith", "endswith", "strip", "lstrip", "rstrip", "split", "rsplit", "splitlines", "replace", "upper",
             "lower", "title", "capitalize", "join", "find", "count", "removeprefix", "removesuffix"});
}

bool IsSupportedDictMethod(std::string_view name) { return OneOf(name, {"items", "keys", "values", "get"}); }

// The methods of Python's str, dict and list: a template reaching one this
// class does not implement is refused rather than given an undefined value.
bool IsPyStrMethod(std::string_view name) {
  return OneOf(name,
               {"capitalize", "casefold",     "center",       "count",   "encode",     "endswith",    "expandtabs",
                "find",       "format",       "format_map",   "index",   "isalnum",    "isalpha",     "isascii",
                "isdecimal",  "isdigit",      "isidentifier", "islower", "isnumeric",  "isprintable", "isspace",
                "istitle",    "isupper",      "join",         "ljust",   "lower",      "lstrip",      "maketrans",
                "partition",  "removeprefix", "removesuffix", "replace", "rfind",      "rindex",      "rjust",
                "rpartition", "rsplit",       "rstrip",       "split",   "splitlines", "startswith",  "strip",
                "swapcase",   "title",        "translate",    "upper",   "zfill"});
}
bool IsPyDictMethod(std::string_view name) {
  return OneOf(
      name, {"clear", "copy", "fromkeys", "get", "items", "keys", "pop", "popitem", "setdefault", "update", "values"});
}
bool IsPyListMethod(std::string_view name) {
  return OneOf(name,
               {"append", "clear", "copy", "count", "extend", "index", "insert", "pop", "remove", "reverse", "sort"});
}

bool IsGlobalFunction(std::string_view name) {
  return OneOf(name, {"range", "namespace", "dict", "raise_exception", "strftime_now"});
}

// ---------------------------------------------------------------- parser

// Jinja's grammar (its parser's precedences) for the supported statements
// and expressions: `x if c else y`, or, and, not, comparisons (chained),
// + -, ~, * / // %, **, unary - +, then postfix (.attr, [item], calls) and
// filters / tests.
class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  Result<Body> ParseTemplate() {
    std::string end;
    return ParseBody({}, &end);
  }

 private:
  const Token& Cur() const { return t_[std::min(i_, t_.size() - 1)]; }
  const Token& Peek() const { return t_[std::min(i_ + 1, t_.size() - 1)]; }
  void Advance() {
    if (i_ < t_.size() - 1) ++i_;
  }
  bool IsOp(std::string_view op) const { return Cur().type == Tok::kOp && Cur().text == op; }
  bool IsName(std::string_view name) const { return Cur().type == Tok::kName && Cur().text == name; }

  Status Unexpected(const std::string& wanted) const {
    return Error(Cur().pos, "expected " + wanted + ", found " + Describe(Cur()));
  }
  Status ExpectOp(std::string_view op) {
    if (!IsOp(op)) return Unexpected("'" + std::string(op) + "'");
    Advance();
    return Status::Ok();
  }
  Status ExpectBlockEnd(std::string_view statement) {
    if (Cur().type != Tok::kBlockEnd) return Unexpected("'%}' to end the '" + std::string(statement) + "' statement");
    Advance();
    return Status::Ok();
  }
  Result<std::string> ExpectName(const std::string& what) {
    if (Cur().type != Tok::kName) return Unexpected(what);
    std::string name = Cur().text;
    Advance();
    return name;
  }

  static std::shared_ptr<Expr> Node(Expr::Kind kind, Pos pos) {
    auto e = std::make_shared<Expr>();
    e->kind = kind;
    e->pos = pos;
    return e;
  }

  // A node whose operands are all in place: its height checked against the
  // nesting limit. Chains the parser builds in loops (x.a.a..., |f|f...,
  // a + b + ..., `or`, `and`) do not recurse in the parser, so its depth_
  // does not see them; evaluating them does recurse, and so does freeing
  // them.
  Result<ExprPtr> Grown(std::shared_ptr<Expr> n) const {
    int below = 0;
    for (const ExprPtr& a : n->args) {
      if (a) below = std::max(below, a->height);
    }
    for (const auto& [key, value] : n->kwargs) {
      if (value) below = std::max(below, value->height);
    }
    n->height = below + 1;
    if (n->height > kMaxNesting) {
      return Error(n->pos, "an expression nests too deeply (over " + std::to_string(kMaxNesting) +
                               " levels of attributes, items, calls, filters or operators)");
    }
    return ExprPtr(std::move(n));
  }

  // ---------------------------------------------------------- statements

  // Parses until a `{% name %}` whose name is in `ends` (left unconsumed,
  // after its '{%'; *end is the name) or the end of the template (*end
  // empty).
  Result<Body> ParseBody(std::initializer_list<std::string_view> ends, std::string* end) {
    if (++depth_ > kMaxNesting) return Error(Cur().pos, "the template nests too deeply (over 200 levels)");
    Body body;
    end->clear();
    while (Cur().type != Tok::kEof) {
      const Token& t = Cur();
      if (t.type == Tok::kData) {
        auto s = std::make_shared<Stmt>();
        s->kind = Stmt::Kind::kText;
        s->pos = t.pos;
        s->text = t.text;
        body.push_back(std::move(s));
        Advance();
        continue;
      }
      if (t.type == Tok::kVarBegin) {
        auto s = std::make_shared<Stmt>();
        s->kind = Stmt::Kind::kOutput;
        s->pos = t.pos;
        Advance();
        SLUICE_ASSIGN_OR_RETURN(s->expr, ParseTuple(false, true, {}, false));
        if (Cur().type != Tok::kVarEnd) return Unexpected("'}}'");
        Advance();
        body.push_back(std::move(s));
        continue;
      }
      if (t.type != Tok::kBlockBegin) return Unexpected("template text or a tag");
      Advance();
      if (Cur().type != Tok::kName) return Unexpected("a statement name");
      const std::string word = Cur().text;
      const Pos pos = Cur().pos;
      if (OneOf(word, ends)) {
        *end = word;
        --depth_;
        return body;
      }
      std::shared_ptr<Stmt> s;
      if (word == "if") {
        SLUICE_ASSIGN_OR_RETURN(s, ParseIf());
      } else if (word == "for") {
        SLUICE_ASSIGN_OR_RETURN(s, ParseFor());
      } else if (word == "set") {
        SLUICE_ASSIGN_OR_RETURN(s, ParseSet());
      } else if (word == "break" || word == "continue") {
        if (loops_ == 0) return Error(pos, "'" + word + "' outside a for loop");
        Advance();
        SLUICE_RETURN_IF_ERROR(ExpectBlockEnd(word));
        s = std::make_shared<Stmt>();
        s->kind = word == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
      } else if (word == "generation") {
        Advance();
        SLUICE_RETURN_IF_ERROR(ExpectBlockEnd(word));
        s = std::make_shared<Stmt>();
        s->kind = Stmt::Kind::kGeneration;
        std::string inner;
        SLUICE_ASSIGN_OR_RETURN(s->body, ParseClosedBody(word, pos, {"endgeneration"}, &inner));
        SLUICE_RETURN_IF_ERROR(CloseStatement("endgeneration"));
      } else if (OneOf(word, {"elif", "else", "endif", "endfor", "endset", "endgeneration"})) {
        if (ends.size() == 0) return Error(pos, "'" + word + "' without its opening statement");
        std::string wanted;
        for (std::string_view e : ends) wanted += (wanted.empty() ? "'" : " or '") + std::string(e) + "'";
        return Error(pos, "'" + word + "' where " + wanted + " was expected");
      } else {
        return Error(pos, "statement '" + word + "' is not supported (supported: if, for, set, break, continue)");
      }
      s->pos = pos;
      body.push_back(std::move(s));
    }
    --depth_;
    return body;
  }

  // A body that must end with one of `ends`: an error naming the opening
  // statement otherwise.
  Result<Body> ParseClosedBody(const std::string& opener, Pos pos, std::initializer_list<std::string_view> ends,
                               std::string* end) {
    SLUICE_ASSIGN_OR_RETURN(Body body, ParseBody(ends, end));
    if (end->empty()) {
      std::string wanted;
      for (std::string_view e : ends) wanted += (wanted.empty() ? "'" : " or '") + std::string(e) + "'";
      return Error(pos, "'" + opener + "' is never closed (expected " + wanted + ")");
    }
    return body;
  }

  Status CloseStatement(std::string_view word) {
    Advance();  // the end word
    return ExpectBlockEnd(word);
  }

  Result<std::shared_ptr<Stmt>> ParseIf() {
    const Pos pos = Cur().pos;
    Advance();
    auto s = std::make_shared<Stmt>();
    s->kind = Stmt::Kind::kIf;
    SLUICE_ASSIGN_OR_RETURN(ExprPtr cond, ParseExpression());
    SLUICE_RETURN_IF_ERROR(ExpectBlockEnd("if"));
    std::string end;
    while (true) {
      SLUICE_ASSIGN_OR_RETURN(Body body, ParseClosedBody("if", pos, {"elif", "else", "endif"}, &end));
      s->branches.emplace_back(cond, std::move(body));
      if (end == "elif") {
        Advance();
        SLUICE_ASSIGN_OR_RETURN(cond, ParseExpression());
        SLUICE_RETURN_IF_ERROR(ExpectBlockEnd("elif"));
        continue;
      }
      if (end == "else") {
        Advance();
        SLUICE_RETURN_IF_ERROR(ExpectBlockEnd("else"));
        SLUICE_ASSIGN_OR_RETURN(Body other, ParseClosedBody("if", pos, {"endif"}, &end));
        s->branches.emplace_back(nullptr, std::move(other));
      }
      SLUICE_RETURN_IF_ERROR(CloseStatement("endif"));
      return s;
    }
  }

  // Names (`x`, `k, v`, `(k, v)`) or, with `namespace_attr`, `ns.attr`.
  Result<Target> ParseTarget(bool namespace_attr, std::string_view end_name) {
    Target target;
    target.pos = Cur().pos;
    if (namespace_attr && Cur().type == Tok::kName && Peek().type == Tok::kOp && Peek().text == ".") {
      target.names.push_back(Cur().text);
      Advance();
      Advance();
      SLUICE_ASSIGN_OR_RETURN(target.attr, ExpectName("an attribute name"));
      return target;
    }
    const bool parenthesized = IsOp("(");
    if (parenthesized) Advance();
    while (true) {
      SLUICE_ASSIGN_OR_RETURN(std::string name, ExpectName("a variable name to assign"));
      if (OneOf(name, {"true", "false", "none", "True", "False", "None"})) {
        return Error(target.pos, "cannot assign to '" + name + "'");
      }
      target.names.push_back(std::move(name));
      if (!IsOp(",")) break;
      Advance();
      target.unpack = true;
      if ((parenthesized && IsOp(")")) || (!end_name.empty() && IsName(end_name)) || IsOp("=") ||
          Cur().type == Tok::kBlockEnd) {
        break;
      }
    }
    if (parenthesized) {
      SLUICE_RETURN_IF_ERROR(ExpectOp(")"));
      target.unpack = true;
    }
    return target;
  }

  Result<std::shared_ptr<Stmt>> ParseFor() {
    const Pos pos = Cur().pos;
    Advance();
    auto s = std::make_shared<Stmt>();
    s->kind = Stmt::Kind::kFor;
    SLUICE_ASSIGN_OR_RETURN(s->target, ParseTarget(false, "in"));
    if (!IsName("in")) return Unexpected("'in'");
    Advance();
    SLUICE_ASSIGN_OR_RETURN(s->expr, ParseTuple(false, false, "recursive", false));
    if (IsName("if")) {
      Advance();
      SLUICE_ASSIGN_OR_RETURN(s->filter, ParseExpression());
    }
    if (IsName("recursive")) return Error(Cur().pos, "recursive for loops are not supported");
    SLUICE_RETURN_IF_ERROR(ExpectBlockEnd("for"));
    std::string end;
    ++loops_;
    SLUICE_ASSIGN_OR_RETURN(s->body, ParseClosedBody("for", pos, {"else", "endfor"}, &end));
    --loops_;
    if (end == "else") {
      Advance();
      SLUICE_RETURN_IF_ERROR(ExpectBlockEnd("else"));
      // break and continue in a for-else belong to an enclosing loop, if any.
      SLUICE_ASSIGN_OR_RETURN(s->else_body, ParseClosedBody("for", pos, {"endfor"}, &end));
    }
    SLUICE_RETURN_IF_ERROR(CloseStatement("endfor"));
    return s;
  }

  Result<std::shared_ptr<Stmt>> ParseSet() {
    const Pos pos = Cur().pos;
    Advance();
    auto s = std::make_shared<Stmt>();
    SLUICE_ASSIGN_OR_RETURN(s->target, ParseTarget(true, ""));
    if (IsOp("=")) {
      Advance();
      s->kind = Stmt::Kind::kSet;
      SLUICE_ASSIGN_OR_RETURN(s->expr, ParseTuple(false, true, {}, false));
      SLUICE_RETURN_IF_ERROR(ExpectBlockEnd("set"));
      return s;
    }
    if (IsOp("|")) return Error(Cur().pos, "filters on a {% set %} block are not supported");
    SLUICE_RETURN_IF_ERROR(ExpectBlockEnd("set"));
    s->kind = Stmt::Kind::kSetBlock;
    std::string end;
    SLUICE_ASSIGN_OR_RETURN(s->body, ParseClosedBody("set", pos, {"endset"}, &end));
    SLUICE_RETURN_IF_ERROR(CloseStatement("endset"));
    return s;
  }

  // --------------------------------------------------------- expressions

  Result<ExprPtr> ParseExpression(bool with_conditional = true) {
    if (++depth_ > kMaxNesting) return Error(Cur().pos, "the template nests too deeply (over 200 levels)");
    Result<ExprPtr> e = with_conditional ? ParseConditional() : ParseOr();
    --depth_;
    return e;
  }

  // One expression, or a tuple of comma-separated ones.
  Result<ExprPtr> ParseTuple(bool simplified, bool with_conditional, std::string_view end_name,
                             bool explicit_parentheses) {
    const Pos pos = Cur().pos;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) SLUICE_RETURN_IF_ERROR(ExpectOp(","));
      if (Cur().type == Tok::kVarEnd || Cur().type == Tok::kBlockEnd || Cur().type == Tok::kEof || IsOp(")") ||
          (!end_name.empty() && IsName(end_name))) {
        break;
      }
      ExprPtr item;
      if (simplified) {
        SLUICE_ASSIGN_OR_RETURN(item, ParsePrimary());
      } else {
        SLUICE_ASSIGN_OR_RETURN(item, ParseExpression(with_conditional));
      }
      items.push_back(std::move(item));
      if (!IsOp(",")) break;
      is_tuple = true;
    }
    if (!is_tuple) {
      if (!items.empty()) return items[0];
      if (!explicit_parentheses) return Unexpected("an expression");
    }
    auto e = Node(Expr::Kind::kTuple, pos);
    e->args = std::move(items);
    return Grown(std::move(e));
  }

  Result<ExprPtr> ParseConditional() {
    SLUICE_ASSIGN_OR_RETURN(ExprPtr e, ParseOr());
    while (IsName("if")) {
      const Pos pos = Cur().pos;
      Advance();
      SLUICE_ASSIGN_OR_RETURN(ExprPtr cond, ParseOr());
      ExprPtr other;
      if (IsName("else")) {
        Advance();
        SLUICE_ASSIGN_OR_RETURN(other, ParseExpression());
      }
      auto c = Node(Expr::Kind::kCond, pos);
      c->args = {e, cond, other};
      SLUICE_ASSIGN_OR_RETURN(e, Grown(std::move(c)));
    }
    return e;
  }

  Result<ExprPtr> ParseOr() {
    SLUICE_ASSIGN_OR_RETURN(ExprPtr e, ParseAnd());
    while (IsName("or")) {
      auto n = Node(Expr::Kind::kOr, Cur().pos);
      Advance();
      SLUICE_ASSIGN_OR_RETURN(ExprPtr right, ParseAnd());
      n->args = {e, right};
      SLUICE_ASSIGN_OR_RETURN(e, Grown(std::move(n)));
    }
    return e;
  }

  Result<ExprPtr> ParseAnd() {
    SLUICE_ASSIGN_OR_RETURN(ExprPtr e, ParseNot());
    while (IsName("and")) {
      auto n = Node(Expr::Kind::kAnd, Cur().pos);
      Advance();
      SLUICE_ASSIGN_OR_RETURN(ExprPtr right, ParseNot());
      n->args = {e, right};
      SLUICE_ASSIGN_OR_RETURN(e, Grown(std::move(n)));
    }
    return e;
  }

  Result<ExprPtr> ParseNot() {
    if (IsName("not")) {
      auto n = Node(Expr::Kind::kNot, Cur().pos);
      Advance();
      if (++depth_ > kMaxNesting) return Error(n->pos, "the template nests too deeply (over 200 levels)");
      SLUICE_ASSIGN_OR_RETURN(ExprPtr operand, ParseNot());
      --depth_;
      n->args = {operand};
      return Grown(std::move(n));
    }
    return ParseCompare();
  }

  Result<ExprPtr> ParseCompare() {
    const Pos pos = Cur().pos;
    SLUICE_ASSIGN_OR_RETURN(ExprPtr first, ParseMath1());
    std::vector<ExprPtr> operands = {first};
    std::vector<std::string> ops;
    while (true) {
      if (Cur().type == Tok::kOp && OneOf(Cur().text, {"==", "!=", "<", "<=", ">", ">="})) {
        ops.push_back(Cur().text);
        Advance();
      } else if (IsName("in")) {
        ops.emplace_back("in");
        Advance();
      } else if (IsName("not") && Peek().type == Tok::kName && Peek().text == "in") {
        ops.emplace_back("notin");
        Advance();
        Advance();
      } else {
        break;
      }
      SLUICE_ASSIGN_OR_RETURN(ExprPtr next, ParseMath1());
      operands.push_back(std::move(next));
    }
    if (ops.empty()) return first;
    auto n = Node(Expr::Kind::kCompare, pos);
    n->args = std::move(operands);
    n->ops = std::move(ops);
    return Grown(std::move(n));
  }

  Result<ExprPtr> Binary(ExprPtr left, ExprPtr right, const std::string& op, Pos pos) const {
    auto n = Node(Expr::Kind::kBinary, pos);
    n->name = op;
    n->args = {std::move(left), std::move(right)};
    return Grown(std::move(n));
  }

  Result<ExprPtr> ParseMath1() {
    SLUICE_ASSIGN_OR_RETURN(ExprPtr e, ParseConcat());
    while (IsOp("+") || IsOp("-")) {
      const std::string op = Cur().text;
      const Pos pos = Cur().pos;
      Advance();
      SLUICE_ASSIGN_OR_RETURN(ExprPtr right, ParseConcat());
      SLUICE_ASSIGN_OR_RETURN(e, Binary(e, right, op, pos));
    }
    return e;
  }

  Result<ExprPtr> ParseConcat() {
    const Pos pos = Cur().pos;
    SLUICE_ASSIGN_OR_RETURN(ExprPtr first, ParseMath2());
    std::vector<ExprPtr> parts = {first};
    while (IsOp("~")) {
      Advance();
      SLUICE_ASSIGN_OR_RETURN(ExprPtr next, ParseMath2());
      parts.push_back(std::move(next));
    }
    if (parts.size() == 1) return first;
    auto n = Node(Expr::Kind::kConcat, pos);
    n->args = std::move(parts);
    return Grown(std::move(n));
  }

  Result<ExprPtr> ParseMath2() {
    SLUICE_ASSIGN_OR_RETURN(ExprPtr e, ParsePow());
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const std::string op = Cur().text;
      const Pos pos = Cur().pos;
      Advance();
      SLUICE_ASSIGN_OR_RETURN(ExprPtr right, ParsePow());
      SLUICE_ASSIGN_OR_RETURN(e, Binary(e, right, op, pos));
    }
    return e;
  }

  // Left-associative and below unary minus, as in Jinja (-2 ** 2 is 4).
  Result<ExprPtr> ParsePow() {
    SLUICE_ASSIGN_OR_RETURN(ExprPtr e, ParseUnary(true));
    while (IsOp("**")) {
      const Pos pos = Cur().pos;
      Advance();
      SLUICE_ASSIGN_OR_RETURN(ExprPtr right, ParseUnary(true));
      SLUICE_ASSIGN_OR_RETURN(e, Binary(e, right, "**", pos));
    }
    return e;
  }

  Result<ExprPtr> ParseUnary(bool with_filter) {
    if (++depth_ > kMaxNesting) return Error(Cur().pos, "the template nests too deeply (over 200 levels)");
    ExprPtr e;
    if (IsOp("-") || IsOp("+")) {
      auto n = Node(IsOp("-") ? Expr::Kind::kNeg : Expr::Kind::kPlus, Cur().pos);
      Advance();
      SLUICE_ASSIGN_OR_RETURN(ExprPtr operand, ParseUnary(false));
      n->args = {operand};
      SLUICE_ASSIGN_OR_RETURN(e, Grown(std::move(n)));
    } else {
      SLUICE_ASSIGN_OR_RETURN(e, ParsePrimary());
    }
    SLUICE_ASSIGN_OR_RETURN(e, ParsePostfix(e));
    if (with_filter) {
      SLUICE_ASSIGN_OR_RETURN(e, ParseFilterExpr(e));
    }
    --depth_;
    return e;
  }

  Result<ExprPtr> ParsePrimary() {
    const Token& t = Cur();
    const Pos pos = t.pos;
    if (t.type == Tok::kName) {
      auto n = Node(Expr::Kind::kConst, pos);
      if (t.text == "true" || t.text == "True") {
        n->value = Bool(true);
      } else if (t.text == "false" || t.text == "False") {
        n->value = Bool(false);
      } else if (t.text == "none" || t.text == "None") {
        n->value = NoneValue();
      } else {
        n->kind = Expr::Kind::kName;
        n->name = t.text;
      }
      Advance();
      return ExprPtr(n);
    }
    if (t.type == Tok::kString) {
      std::string s = t.text;
      Advance();
      while (Cur().type == Tok::kString) {  // adjacent literals join, as in Python
        s += Cur().text;
        Advance();
      }
      auto n = Node(Expr::Kind::kConst, pos);
      n->value = Str(std::move(s));
      return ExprPtr(n);
    }
    if (t.type == Tok::kInt || t.type == Tok::kFloat) {
      auto n = Node(Expr::Kind::kConst, pos);
      n->value = t.type == Tok::kInt ? Int(t.i) : Float(t.f);
      Advance();
      return ExprPtr(n);
    }
    if (IsOp("(")) {
      Advance();
      SLUICE_ASSIGN_OR_RETURN(ExprPtr e, ParseTuple(false, true, {}, true));
      SLUICE_RETURN_IF_ERROR(ExpectOp(")"));
      return e;
    }
    if (IsOp("[")) {
      Advance();
      auto n = Node(Expr::Kind::kList, pos);
      while (!IsOp("]")) {
        if (!n->args.empty()) SLUICE_RETURN_IF_ERROR(ExpectOp(","));
        if (IsOp("]")) break;
        SLUICE_ASSIGN_OR_RETURN(ExprPtr item, ParseExpression());
        n->args.push_back(std::move(item));
      }
      Advance();
      return Grown(std::move(n));
    }
    if (IsOp("{")) {
      Advance();
      auto n = Node(Expr::Kind::kDict, pos);
      while (!IsOp("}")) {
        if (!n->args.empty()) SLUICE_RETURN_IF_ERROR(ExpectOp(","));
        if (IsOp("}")) break;
        SLUICE_ASSIGN_OR_RETURN(ExprPtr key, ParseExpression());
        SLUICE_RETURN_IF_ERROR(ExpectOp(":"));
        SLUICE_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
        n->args.push_back(std::move(key));
        n->args.push_back(std::move(value));
      }
      Advance();
      return Grown(std::move(n));
    }
    return Unexpected("an expression");
  }

  Result<ExprPtr> ParsePostfix(ExprPtr e) {
    while (true) {
      if (IsOp(".")) {
        const Pos pos = Cur().pos;
        Advance();
        if (Cur().type == Tok::kName) {
          auto n = Node(Expr::Kind::kAttr, Cur().pos);
          n->name = Cur().text;
          n->args = {e};
          SLUICE_ASSIGN_OR_RETURN(e, Grown(std::move(n)));
        } else if (Cur().type == Tok::kInt) {  // x.0 is x[0]
          auto key = Node(Expr::Kind::kConst, Cur().pos);
          key->value = Int(Cur().i);
          auto n = Node(Expr::Kind::kItem, pos);
          n->args = {e, key};
          SLUICE_ASSIGN_OR_RETURN(e, Grown(std::move(n)));
        } else {
          return Unexpected("an attribute name after '.'");
        }
        Advance();
      } else if (IsOp("[")) {
        SLUICE_ASSIGN_OR_RETURN(e, ParseSubscript(e));
      } else if (IsOp("(")) {
        SLUICE_ASSIGN_OR_RETURN(e, ParseCall(e));
      } else {
        return e;
      }
    }
  }

  // [key] or [start:stop:step], each part optional.
  Result<ExprPtr> ParseSubscript(ExprPtr base) {
    const Pos pos = Cur().pos;
    Advance();
    ExprPtr parts[3];
    bool slice = false;
    if (!IsOp(":")) {
      SLUICE_ASSIGN_OR_RETURN(parts[0], ParseExpression());
    }
    if (IsOp(":")) {
      slice = true;
      Advance();
      if (!IsOp(":") && !IsOp("]")) {
        SLUICE_ASSIGN_OR_RETURN(parts[1], ParseExpression());
      }
      if (IsOp(":")) {
        Advance();
        if (!IsOp("]")) {
          SLUICE_ASSIGN_OR_RETURN(parts[2], ParseExpression());
        }
      }
    }
    if (IsOp(",")) return Error(Cur().pos, "subscripts with several items (x[a, b]) are not supported");
    SLUICE_RETURN_IF_ERROR(ExpectOp("]"));
    auto n = Node(slice ? Expr::Kind::kSlice : Expr::Kind::kItem, pos);
    if (slice) {
      n->args = {std::move(base), parts[0], parts[1], parts[2]};
    } else {
      n->args = {std::move(base), parts[0]};
    }
    return Grown(std::move(n));
  }

  // Call arguments into e->args (after what is there) and e->kwargs.
  Status ParseArgs(Expr* e) {
    SLUICE_RETURN_IF_ERROR(ExpectOp("("));
    bool first = true;
    while (!IsOp(")")) {
      if (!first) SLUICE_RETURN_IF_ERROR(ExpectOp(","));
      first = false;
      if (IsOp(")")) break;
      if (IsOp("*") || IsOp("**")) return Error(Cur().pos, "*args and **kwargs in calls are not supported");
      if (Cur().type == Tok::kName && Peek().type == Tok::kOp && Peek().text == "=") {
        std::string key = Cur().text;
        Advance();
        Advance();
        SLUICE_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
        e->kwargs.emplace_back(std::move(key), std::move(value));
      } else {
        if (!e->kwargs.empty()) return Error(Cur().pos, "a positional argument after a keyword argument");
        SLUICE_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
        e->args.push_back(std::move(value));
      }
    }
    Advance();
    return Status::Ok();
  }

  Result<ExprPtr> ParseCall(ExprPtr callee) {
    const Pos pos = Cur().pos;
    if (callee->kind == Expr::Kind::kName && OneOf(callee->name, {"lipsum", "cycler", "joiner"})) {
      return Error(callee->pos, "function '" + callee->name + "' is not supported");
    }
    // A call of a Python method this class lacks can only fail (values from
    // JSON are never callable), so it is refused here.
    if (callee->kind == Expr::Kind::kAttr &&
        (IsPyStrMethod(callee->name) || IsPyDictMethod(callee->name) || IsPyListMethod(callee->name)) &&
        !IsSupportedStrMethod(callee->name) && !IsSupportedDictMethod(callee->name)) {
      return Error(callee->pos, "method '" + callee->name + "' is not supported");
    }
    auto n = Node(Expr::Kind::kCall, pos);
    n->args = {std::move(callee)};
    SLUICE_RETURN_IF_ERROR(ParseArgs(n.get()));
    return Grown(std::move(n));
  }

  Result<ExprPtr> ParseFilterExpr(ExprPtr e) {
    while (true) {
      if (IsOp("|")) {
        Advance();
        const Pos pos = Cur().pos;
        SLUICE_ASSIGN_OR_RETURN(std::string name, ExpectName("a filter name after '|'"));
        if (IsOp(".") || !IsSupportedFilter(name)) return Error(pos, "filter '" + name + "' is not supported");
        auto n = Node(Expr::Kind::kFilter, pos);
        n->name = std::move(name);
        n->args = {e};
        if (IsOp("(")) SLUICE_RETURN_IF_ERROR(ParseArgs(n.get()));
        SLUICE_ASSIGN_OR_RETURN(e, Grown(std::move(n)));
      } else if (IsName("is")) {
        Advance();
        const bool negated = IsName("not");
        if (negated) Advance();
        const Pos pos = Cur().pos;
        SLUICE_ASSIGN_OR_RETURN(std::string name, ExpectName("a test name after 'is'"));
        if (IsOp(".") || !IsSupportedTest(name)) return Error(pos, "test '" + name + "' is not supported");
        auto n = Node(Expr::Kind::kTest, pos);
        n->name = std::move(name);
        n->negated = negated;
        n->args = {e};
        if (IsOp("(")) {
          SLUICE_RETURN_IF_ERROR(ParseArgs(n.get()));
        } else if ((Cur().type == Tok::kName || Cur().type == Tok::kString || Cur().type == Tok::kInt ||
                    Cur().type == Tok::kFloat || IsOp("[") || IsOp("{")) &&
                   !IsName("else") && !IsName("or") && !IsName("and")) {
          // One argument without parentheses: `x is divisibleby 3`.
          if (IsName("is")) return Error(Cur().pos, "tests cannot be chained with 'is'");
          SLUICE_ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
          SLUICE_ASSIGN_OR_RETURN(arg, ParsePostfix(arg));
          n->args.push_back(std::move(arg));
        }
        SLUICE_ASSIGN_OR_RETURN(e, Grown(std::move(n)));
      } else if (IsOp("(")) {
        SLUICE_ASSIGN_OR_RETURN(e, ParseCall(e));
      } else {
        return e;
      }
    }
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;
  int loops_ = 0;
};

// ------------------------------------------------------------- arguments

struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keywords;
};

// Binds arguments to parameter names as Python does: positionally, then by
// keyword; an absent one is nullopt.
Result<std::vector<std::optional<Value>>> Bind(const Args& args, std::initializer_list<std::string_view> names,
                                               const std::string& what, Pos pos) {
  if (args.positional.size() > names.size()) {
    return Error(pos, what + " takes at most " + std::to_string(names.size()) + " argument(s), " +
                          std::to_string(args.positional.size()) + " given");
  }
  std::vector<std::optional<Value>> out(names.size());
  for (size_t i = 0; i < args.positional.size(); ++i) out[i] = args.positional[i];
  for (const auto& [key, value] : args.keywords) {
    const auto* it = std::find(names.begin(), names.end(), key);
    if (it == names.end()) return Error(pos, what + " got an unexpected keyword argument '" + key + "'");
    const auto k = static_cast<size_t>(it - names.begin());
    if (out[k]) return Error(pos, what + " got two values for argument '" + key + "'");
    out[k] = value;
  }
  return out;
}

// An argument that must be a string when given (absent or none: nullopt).
Result<std::optional<std::string>> OptionalString(const std::optional<Value>& v, const std::string& what, Pos pos) {
  if (!v || v->Is<None>()) return std::optional<std::string>();
  if (v->Is<Undefined>()) return UndefinedError(pos, *v);
  if (!v->Is<std::string>()) return Error(pos, what + " must be a string, not " + TypeName(*v));
  return std::optional<std::string>(v->As<std::string>());
}

Result<std::optional<int64_t>> OptionalInt(const std::optional<Value>& v, const std::string& what, Pos pos) {
  if (!v || v->Is<None>()) return std::optional<int64_t>();
  if (v->Is<Undefined>()) return UndefinedError(pos, *v);
  if (!IsIntegral(*v)) return Error(pos, what + " must be an integer, not " + TypeName(*v));
  return std::optional<int64_t>(AsInt(*v));
}

// ----------------------------------------------------------------- render

enum class Flow { kNormal, kBreak, kContinue };

class Renderer {
 public:
  Renderer(const std::tm& now, std::string* out) : now_(now), out_(out), outer_budget_(active_budget) {
    frames_.emplace_back();
    active_budget = &budget_;
  }

  // Namespaces may hold each other in cycles; emptying them at the end frees
  // every one.
  ~Renderer() {
    for (const NamespacePtr& ns : namespaces_) ns->attrs.items.clear();
    active_budget = outer_budget_;
  }
  Renderer(const Renderer&) = delete;
  Renderer& operator=(const Renderer&) = delete;

  void SetGlobal(const std::string& name, Value v) { frames_.front()[name] = std::move(v); }

  Result<Flow> Exec(const Body& body) {
    for (const auto& s : body) {
      SLUICE_ASSIGN_OR_RETURN(Flow flow, ExecOne(*s));
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

 private:
  using Frame = std::unordered_map<std::string, Value>;

  Status Append(std::string_view text, Pos pos) {
    if (out_->size() + text.size() > kMaxOutputBytes) {
      return Error(pos, "the rendering grows past " + std::to_string(kMaxOutputBytes >> 20) + " MiB");
    }
    out_->append(text);
    return Status::Ok();
  }

  Result<Flow> ExecOne(const Stmt& s) {
    SLUICE_RETURN_IF_ERROR(budget_.Spend(1, s.pos));
    switch (s.kind) {
      case Stmt::Kind::kText:
        SLUICE_RETURN_IF_ERROR(Append(s.text, s.pos));
        return Flow::kNormal;
      case Stmt::Kind::kOutput: {
        SLUICE_ASSIGN_OR_RETURN(Value v, Eval(*s.expr));
        SLUICE_ASSIGN_OR_RETURN(std::string text, ToStr(v, s.expr->pos));
        SLUICE_RETURN_IF_ERROR(Append(text, s.pos));
        return Flow::kNormal;
      }
      case Stmt::Kind::kIf:
        for (const auto& [cond, body] : s.branches) {
          bool take = cond == nullptr;
          if (!take) {
            SLUICE_ASSIGN_OR_RETURN(Value v, Eval(*cond));
            take = Truthy(v);
          }
          if (take) return Exec(body);
        }
        return Flow::kNormal;
      case Stmt::Kind::kFor:
        return ExecFor(s);
      case Stmt::Kind::kSet: {
        SLUICE_ASSIGN_OR_RETURN(Value v, Eval(*s.expr));
        SLUICE_RETURN_IF_ERROR(Assign(s.target, std::move(v)));
        return Flow::kNormal;
      }
      case Stmt::Kind::kSetBlock: {
        std::string captured;
        std::string* outer = out_;
        out_ = &captured;
        Result<Flow> flow = Exec(s.body);
        out_ = outer;
        SLUICE_RETURN_IF_ERROR(flow.status());
        SLUICE_RETURN_IF_ERROR(Assign(s.target, Str(std::move(captured))));
        return *flow;
      }
      case Stmt::Kind::kBreak:
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        return Flow::kContinue;
      case Stmt::Kind::kGeneration:
        return Exec(s.body);
    }
    return Flow::kNormal;
  }

  // The items a for loop or a filter iterates: a list's items, a dict's
  // keys, a string's code points; nothing for an undefined value.
  static Result<std::vector<Value>> Iterate(const Value& v, Pos pos) {
    SLUICE_RETURN_IF_ERROR(Spend(1 + ShallowBytes(v) / 64, pos));  // the items are copied
    std::vector<Value> items;
    if (v.Is<ListPtr>()) return v.As<ListPtr>()->items;
    if (v.Is<DictPtr>()) {
      for (const auto& [k, item] : v.As<DictPtr>()->items) items.push_back(Str(k));
      return items;
    }
    if (v.Is<std::string>()) {
      const std::string& s = v.As<std::string>();
      for (size_t i = 0; i < s.size();) {
        const size_t start = i;
        NextCodePoint(s, &i);
        items.push_back(Str(s.substr(start, i - start)));
      }
      return items;
    }
    if (v.Is<Undefined>()) return items;
    return Error(pos, "cannot iterate over a value of type " + TypeName(v));
  }

  Status Assign(const Target& target, Value v) {
    if (!target.attr.empty()) {
      const Value ns = Lookup(target.names[0]);
      if (!ns.Is<NamespacePtr>()) {
        return Error(target.pos, "cannot set attribute '" + target.attr + "' of '" + target.names[0] +
                                     "', which is not a namespace()");
      }
      ns.As<NamespacePtr>()->attrs.Set(target.attr, std::move(v));
      return Status::Ok();
    }
    if (!target.unpack) {
      frames_.back()[target.names[0]] = std::move(v);
      return Status::Ok();
    }
    if (v.Is<Undefined>()) return UndefinedError(target.pos, v);
    SLUICE_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v, target.pos));
    if (items.size() != target.names.size()) {
      return Error(target.pos, "cannot unpack " + std::to_string(items.size()) + " value(s) into " +
                                   std::to_string(target.names.size()) + " names");
    }
    for (size_t i = 0; i < items.size(); ++i) frames_.back()[target.names[i]] = std::move(items[i]);
    return Status::Ok();
  }

  // Jinja's loop scoping: each iteration runs in a fresh frame over the
  // enclosing ones, so what the body sets lasts until that iteration ends.
  Result<Flow> ExecFor(const Stmt& s) {
    SLUICE_ASSIGN_OR_RETURN(Value iterable, Eval(*s.expr));
    SLUICE_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(iterable, s.expr->pos));
    if (s.filter) {
      std::vector<Value> kept;
      for (Value& item : items) {
        frames_.emplace_back();
        const Status assigned = Assign(s.target, item);
        Result<Value> keep = assigned.ok() ? Eval(*s.filter) : Result<Value>(assigned);
        frames_.pop_back();
        SLUICE_RETURN_IF_ERROR(keep.status());
        if (Truthy(*keep)) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    const auto n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      SLUICE_RETURN_IF_ERROR(budget_.Spend(kLoopIterationSteps, s.pos));
      frames_.emplace_back();
      Dict loop;
      loop.items = {
          {"index", Int(i + 1)},   {"index0", Int(i)},         {"revindex", Int(n - i)}, {"revindex0", Int(n - i - 1)},
          {"first", Bool(i == 0)}, {"last", Bool(i == n - 1)}, {"length", Int(n)},       {"depth", Int(1)},
          {"depth0", Int(0)}};
      if (i > 0) loop.items.emplace_back("previtem", items[static_cast<size_t>(i - 1)]);
      if (i + 1 < n) loop.items.emplace_back("nextitem", items[static_cast<size_t>(i + 1)]);
      loop.items.emplace_back("cycle", Make<Function>(Function{"loop.cycle", std::make_shared<const Value>(Int(i))}));
      frames_.back()["loop"] = DictValue(std::move(loop));
      const Status assigned = Assign(s.target, items[static_cast<size_t>(i)]);
      Result<Flow> flow = assigned.ok() ? Exec(s.body) : Result<Flow>(assigned);
      frames_.pop_back();
      SLUICE_RETURN_IF_ERROR(flow.status());
      if (*flow == Flow::kBreak) break;
    }
    if (n == 0 && !s.else_body.empty()) {
      frames_.emplace_back();
      Result<Flow> flow = Exec(s.else_body);
      frames_.pop_back();
      return flow;
    }
    return Flow::kNormal;
  }

  Value Lookup(const std::string& name) const {
    for (auto frame = frames_.rbegin(); frame != frames_.rend(); ++frame) {
      const auto it = frame->find(name);
      if (it != frame->end()) return it->second;
    }
    if (IsGlobalFunction(name)) return Make<Function>(Function{name, nullptr});
    return Undef("'" + name + "' is undefined");
  }

  // Jinja's getattr in transformers' sandbox: a method first, then an item
  // of a dict; otherwise undefined (an error for an undefined value).
  static Result<Value> GetAttr(const Value& base, const std::string& name, Pos pos) {
    if (base.Is<Undefined>()) return UndefinedError(pos, base);
    if (base.Is<NamespacePtr>()) {
      const Value* v = base.As<NamespacePtr>()->attrs.Find(name);
      if (v) return *v;
    }
    bool python_method = false;
    if (base.Is<std::string>()) {
      if (IsSupportedStrMethod(name))
        return Make<Function>(Function{"str." + name, std::make_shared<const Value>(base)});
      python_method = IsPyStrMethod(name);
    } else if (base.Is<DictPtr>()) {
      if (IsSupportedDictMethod(name)) {
        return Make<Function>(Function{"dict." + name, std::make_shared<const Value>(base)});
      }
      python_method = IsPyDictMethod(name);
      if (!python_method) {
        const Value* v = base.As<DictPtr>()->Find(name);
        if (v) return *v;
      }
    } else if (base.Is<ListPtr>()) {
      python_method = IsPyListMethod(name);
    }
    if (python_method) return Error(pos, "method '" + name + "' of " + TypeName(base) + " is not supported");
    return Undef("'" + TypeRepr(base) + "' has no attribute '" + name + "'");
  }

  // Jinja's getitem: an item, else (for a string key) an attribute.
  static Result<Value> GetItem(const Value& base, const Value& key, Pos pos) {
    if (base.Is<Undefined>()) return UndefinedError(pos, base);
    if (base.Is<DictPtr>() && key.Is<std::string>()) {
      const Value* v = base.As<DictPtr>()->Find(key.As<std::string>());
      if (v) return *v;
    }
    if ((base.Is<ListPtr>() || base.Is<std::string>()) && IsIntegral(key)) {
      int64_t i = AsInt(key);
      if (base.Is<ListPtr>()) {
        const auto& items = base.As<ListPtr>()->items;
        const auto size = static_cast<int64_t>(items.size());
        if (i < 0) i += size;
        if (i >= 0 && i < size) return items[static_cast<size_t>(i)];
      } else {
        const std::u32string cps = Decode(base.As<std::string>());
        const auto size = static_cast<int64_t>(cps.size());
        if (i < 0) i += size;
        if (i >= 0 && i < size) return Str(Encode(cps.substr(static_cast<size_t>(i), 1)));
      }
      return Undef(TypeRepr(base) + " has no element " + std::to_string(AsInt(key)));
    }
    if (key.Is<std::string>()) return GetAttr(base, key.As<std::string>(), pos);
    std::string key_repr;
    SLUICE_RETURN_IF_ERROR(AppendRepr(key, &key_repr, 0, pos));
    return Undef(TypeRepr(base) + " has no element " + key_repr);
  }

  // Python's slicing of lists, tuples and strings (by code point). Jinja
  // slices with Python's own subscript, so what cannot be sliced is an error.
  Result<Value> Slice(const Expr& e) {
    SLUICE_ASSIGN_OR_RETURN(Value base, Eval(*e.args[0]));
    if (base.Is<Undefined>()) return UndefinedError(e.pos, base);
    std::optional<int64_t> bounds[3];
    for (size_t k = 0; k < 3; ++k) {
      if (!e.args[k + 1]) continue;
      SLUICE_ASSIGN_OR_RETURN(Value v, Eval(*e.args[k + 1]));
      if (v.Is<None>()) continue;
      if (!IsIntegral(v)) return Error(e.pos, "slice bounds must be integers or none, not " + TypeName(v));
      bounds[k] = AsInt(v);
    }
    if (!base.Is<ListPtr>() && !base.Is<std::string>()) {
      return Error(e.pos, "a value of type " + TypeName(base) + " cannot be sliced");
    }
    const int64_t step = bounds[2].value_or(1);
    if (step == 0) return Error(e.pos, "slice step cannot be zero");
    std::u32string cps;
    if (base.Is<std::string>()) cps = Decode(base.As<std::string>());
    const int64_t len =
        base.Is<ListPtr>() ? static_cast<int64_t>(base.As<ListPtr>()->items.size()) : static_cast<int64_t>(cps.size());
    auto adjust = [&](std::optional<int64_t> v, bool is_start) -> int64_t {
      if (!v) return step < 0 ? (is_start ? len - 1 : -1) : (is_start ? 0 : len);
      int64_t x = *v;
      if (x < 0) {
        x = x < -len ? (step < 0 ? -1 : 0) : x + len;
      } else if (x >= len) {
        x = step < 0 ? len - 1 : len;
      }
      return x;
    };
    const int64_t start = adjust(bounds[0], true), stop = adjust(bounds[1], false);
    std::vector<size_t> picked;
    for (__int128 i = start; step > 0 ? i < stop : i > stop; i += step) picked.push_back(static_cast<size_t>(i));
    if (base.Is<ListPtr>()) {
      std::vector<Value> items;
      items.reserve(picked.size());
      for (size_t i : picked) items.push_back(base.As<ListPtr>()->items[i]);
      return ListValue(std::move(items), base.As<ListPtr>()->tuple);
    }
    std::u32string out;
    for (size_t i : picked) out += cps[i];
    return Str(Encode(out));
  }

  Result<Args> EvalArgs(const Expr& e, size_t first) {
    Args args;
    for (size_t i = first; i < e.args.size(); ++i) {
      SLUICE_ASSIGN_OR_RETURN(Value v, Eval(*e.args[i]));
      args.positional.push_back(std::move(v));
    }
    for (const auto& [key, expr] : e.kwargs) {
      SLUICE_ASSIGN_OR_RETURN(Value v, Eval(*expr));
      args.keywords.emplace_back(key, std::move(v));
    }
    return args;
  }

  std::string Strftime(const std::string& format) const {
    if (format.empty()) return "";
    std::vector<char> buf(256);
    for (int tries = 0; tries < 6; ++tries) {
      const size_t n = std::strftime(buf.data(), buf.size(), format.c_str(), &now_);
      if (n > 0) return std::string(buf.data(), n);
      buf.resize(buf.size() * 8);
    }
    return "";
  }

  Result<Value> Call(const Value& f, const Args& args, Pos pos) {
    if (f.Is<Undefined>()) return Error(pos, f.As<Undefined>().what + ", so it cannot be called");
    if (!f.Is<Function>()) return Error(pos, "a value of type " + TypeName(f) + " cannot be called");
    const Function& fn = f.As<Function>();
    if (fn.name.rfind("str.", 0) == 0) return CallStrMethod(fn.name.substr(4), fn.self->As<std::string>(), args, pos);
    if (fn.name.rfind("dict.", 0) == 0) return CallDictMethod(fn.name.substr(5), *fn.self->As<DictPtr>(), args, pos);
    if (fn.name == "loop.cycle") {
      if (args.positional.empty()) return Error(pos, "loop.cycle() needs at least one value");
      return args.positional[static_cast<size_t>(AsInt(*fn.self)) % args.positional.size()];
    }
    if (fn.name == "raise_exception") {
      std::string message;
      if (!args.positional.empty()) {
        SLUICE_ASSIGN_OR_RETURN(message, ToStr(args.positional[0], pos));
      }
      return Error(pos, "raise_exception: " + message);
    }
    if (fn.name == "strftime_now") {
      SLUICE_ASSIGN_OR_RETURN(auto a, Bind(args, {"format"}, "strftime_now()", pos));
      SLUICE_ASSIGN_OR_RETURN(auto format, OptionalString(a[0], "strftime_now()'s format", pos));
      if (!format) return Error(pos, "strftime_now() needs a format");
      return Str(Strftime(*format));
    }
    if (fn.name == "namespace" || fn.name == "dict") {
      Dict attrs;
      if (args.positional.size() > 1) return Error(pos, fn.name + "() takes at most one positional argument");
      if (!args.positional.empty()) {
        const Value& init = args.positional[0];
        if (!init.Is<DictPtr>()) return Error(pos, fn.name + "() takes a dict, not " + TypeName(init));
        attrs = *init.As<DictPtr>();
      }
      for (const auto& [key, value] : args.keywords) attrs.Set(key, value);
      if (fn.name == "dict") return DictValue(std::move(attrs));
      auto ns = std::make_shared<Namespace>();
      ns->attrs = std::move(attrs);
      namespaces_.push_back(ns);
      return Make<NamespacePtr>(std::move(ns));
    }
    if (fn.name == "range") {
      if (!args.keywords.empty() || args.positional.empty() || args.positional.size() > 3) {
        return Error(pos, "range() takes 1 to 3 integers");
      }
      int64_t n[3] = {0, 0, 1};
      for (size_t i = 0; i < args.positional.size(); ++i) {
        if (!IsIntegral(args.positional[i])) return Error(pos, "range() takes integers");
        n[args.positional.size() == 1 ? 1 : i] = AsInt(args.positional[i]);
      }
      if (n[2] == 0) return Error(pos, "range() step cannot be zero");
      std::vector<Value> items;
      for (__int128 i = n[0]; n[2] > 0 ? i < n[1] : i > n[1]; i += n[2]) {
        if (static_cast<int64_t>(items.size()) >= kMaxSequenceLength) return Error(pos, "range() is too long");
        items.push_back(Int(static_cast<int64_t>(i)));
      }
      return ListValue(std::move(items));
    }
    return Error(pos, "function '" + fn.name + "' is not supported");
  }

  static Result<Value> CallStrMethod(const std::string& name, const std::string& s, const Args& args, Pos pos) {
    const std::string what = "str." + name + "()";
    if (OneOf(name, {"upper", "lower", "title", "capitalize"})) {
      SLUICE_RETURN_IF_ERROR(Bind(args, {}, what, pos).status());
      if (name == "upper") return Str(MapCase(s, Case::kUpper));
      if (name == "lower") return Str(MapCase(s, Case::kLower));
      if (name == "title") return Str(PyTitle(s));
      return Str(PyCapitalize(s));
    }
    if (name == "startswith" || name == "endswith") {
      SLUICE_ASSIGN_OR_RETURN(auto a, Bind(args, {"prefix"}, what, pos));
      if (!a[0]) return Error(pos, what + " needs an argument");
      std::vector<std::string> candidates;
      if (a[0]->Is<std::string>()) {
        candidates.push_back(a[0]->As<std::string>());
      } else if (a[0]->Is<ListPtr>() && a[0]->As<ListPtr>()->tuple) {
        for (const Value& v : a[0]->As<ListPtr>()->items) {
          if (!v.Is<std::string>()) return Error(pos, what + " takes strings");
          candidates.push_back(v.As<std::string>());
        }
      } else {
        return Error(pos, what + " takes a string or a tuple of strings, not " + TypeName(*a[0]));
      }
      for (const std::string& c : candidates) {
        if (c.size() <= s.size() && (name == "startswith" ? s.compare(0, c.size(), c) == 0
                                                          : s.compare(s.size() - c.size(), c.size(), c) == 0)) {
          return Bool(true);
        }
      }
      return Bool(false);
    }
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      SLUICE_ASSIGN_OR_RETURN(auto a, Bind(args, {"chars"}, what, pos));
      SLUICE_ASSIGN_OR_RETURN(auto chars, OptionalString(a[0], what, pos));
      std::optional<std::u32string> set;
      if (chars) set = Decode(*chars);
      return Str(PyStrip(s, set, name != "rstrip", name != "lstrip"));
    }
    if (name == "split" || name == "rsplit") {
      SLUICE_ASSIGN_OR_RETURN(auto a, Bind(args, {"sep", "maxsplit"}, what, pos));
      SLUICE_ASSIGN_OR_RETURN(auto sep, OptionalString(a[0], what, pos));
      SLUICE_ASSIGN_OR_RETURN(auto maxsplit, OptionalInt(a[1], what, pos));
      if (!sep) return StringList(PySplitWhitespace(s, maxsplit.value_or(-1), name == "rsplit"));
      if (sep->empty()) return Error(pos, what + ": empty separator");
      return StringList(PySplit(s, *sep, maxsplit.value_or(-1), name == "rsplit"));
    }
    if (name == "splitlines") {
      SLUICE_ASSIGN_OR_RETURN(auto a, Bind(args, {"keepends"}, what, pos));
      const bool keep = a[0] && Truthy(*a[0]);
      const std::u32string cps = Decode(s);
      std::vector<std::string> lines;
      size_t start = 0;
      for (size_t i = 0; i < cps.size(); ++i) {
        if (!IsLineBreak(cps[i])) continue;
        size_t end = i + 1;
        if (cps[i] == '\r' && end < cps.size() && cps[end] == '\n') ++end;
        lines.push_back(Encode(std::u32string_view(cps).substr(start, (keep ? end : i) - start)));
        start = end;
        i = end - 1;
      }
      if (start < cps.size()) lines.push_back(Encode(std::u32string_view(cps).substr(start)));
      return StringList(lines);
    }
    if (name == "replace") {
      SLUICE_ASSIGN_OR_RETURN(auto a, Bind(args, {"old", "new", "count"}, what, pos));
      SLUICE_ASSIGN_OR_RETURN(auto old, OptionalString(a[0], what, pos));
      SLUICE_ASSIGN_OR_RETURN(auto repl, OptionalString(a[1], what, pos));
      SLUICE_ASSIGN_OR_RETURN(auto count, OptionalInt(a[2], what, pos));
      if (!old || !repl) return Error(pos, what + " needs two strings");
      SLUICE_ASSIGN_OR_RETURN(std::string replaced, PyReplace(s, *old, *repl, count.value_or(-1), pos));
      return Str(std::move(replaced));
    }
    if (name == "join") {
      SLUICE_ASSIGN_OR_RETURN(auto a, Bind(args, {"iterable"}, what, pos));
      if (!a[0]) return Error(pos, what + " needs an argument");
      SLUICE_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(*a[0], pos));
      std::string out;
      for (size_t i = 0; i < items.size(); ++i) {
        if (!items[i].Is<std::string>()) return Error(pos, what + " takes strings, not " + TypeName(items[i]));
        SLUICE_RETURN_IF_ERROR(
            CheckGrowth(out.size(), (i > 0 ? s.size() : 0) + items[i].As<std::string>().size(), pos));
        if (i > 0) out += s;
        out += items[i].As<std::string>();
      }
      return Str(std::move(out));
    }
    if (name == "find" || name == "count") {
      SLUICE_ASSIGN_OR_RETURN(auto a, Bind(args, {"sub"}, what, pos));
      SLUICE_ASSIGN_OR_RETURN(auto sub, OptionalString(a[0], what, pos));
      if (!sub) return Error(pos, what + " needs a string");
      if (name == "find") {
        const size_t at = s.find(*sub);
        return Int(at == std::string::npos ? -1 : CodePointCount(std::string_view(s).substr(0, at)));
      }
      if (sub->empty()) return Int(CodePointCount(s) + 1);
      int64_t n = 0;
      for (size_t at = s.find(*sub); at != std::string::npos; at = s.find(*sub, at + sub->size())) ++n;
      return Int(n);
    }
    // removeprefix, removesuffix
    SLUICE_ASSIGN_OR_RETURN(auto a, Bind(args, {"affix"}, what, pos));
    SLUICE_ASSIGN_OR_RETURN(auto affix, OptionalString(a[0], what, pos));
    if (!affix) return Error(pos, what + " needs a string");
    if (name == "removeprefix") return Str(s.rfind(*affix, 0) == 0 ? s.substr(affix->size()) : s);
    const bool ends = affix->size() <= s.size() && s.compare(s.size() - affix->size(), affix->size(), *affix) == 0;
    return Str(ends ? s.substr(0, s.size() - affix->size()) : s);
  }

  static Value Items(const Dict& d) {
    std::vector<Value> items;
    items.reserve(d.items.size());
    for (const auto& [k, v] : d.items) items.push_back(ListValue({Str(k), v}, true));
    return ListValue(std::move(items));
  }

  static Result<Value> CallDictMethod(const std::string& name, const Dict& d, const Args& args, Pos pos) {
    const std::string what = "dict." + name + "()";
    if (name == "get") {
      SLUICE_ASSIGN_OR_RETURN(auto a, Bind(args, {"key", "default"}, what, pos));
      if (!a[0]) return Error(pos, what + " needs a key");
      if (a[0]->Is<std::string>()) {
        const Value* v = d.Find(a[0]->As<std::string>());
        if (v) return *v;
      }
      return a[1] ? *a[1] : NoneValue();
    }
    SLUICE_RETURN_IF_ERROR(Bind(args, {}, what, pos).status());
    if (name == "items") return Items(d);
    std::vector<Value> out;
    for (const auto& [k, v] : d.items) out.push_back(name == "keys" ? Str(k) : v);
    return ListValue(std::move(out));
  }

  // --------------------------------------------------------------- tests

  static Result<bool> Test(const std::string& name, const Value& v, const Args& args, Pos pos) {
    const std::string what = "test '" + name + "'";
    if (OneOf(name, {"eq", "equalto", "==", "ne", "!=", "lt", "lessthan", "<", "le", "<=", "gt", "greaterthan", ">",
                     "ge", ">=", "in", "divisibleby"})) {
      SLUICE_ASSIGN_OR_RETURN(auto a, Bind(args, {"other"}, what, pos));
      if (!a[0]) return Error(pos, what + " needs a value to compare with");
      const Value& other = *a[0];
      if (OneOf(name, {"eq", "equalto", "=="})) return Equal(v, other);
      if (OneOf(name, {"ne", "!="})) return !Equal(v, other);
      if (name == "in") return Contains(other, v, pos);
      if (name == "divisibleby") {
        if (!IsIntegral(v) || !IsIntegral(other)) return Error(pos, what + " takes integers");
        if (AsInt(other) == 0) return Error(pos, what + ": division by zero");
        return AsInt(v) % AsInt(other) == 0;
      }
      SLUICE_ASSIGN_OR_RETURN(int c, Compare(v, other, pos, name));
      if (OneOf(name, {"lt", "lessthan", "<"})) return c < 0;
      if (OneOf(name, {"le", "<="})) return c <= 0;
      if (OneOf(name, {"gt", "greaterthan", ">"})) return c > 0;
      return c >= 0;
    }
    SLUICE_RETURN_IF_ERROR(Bind(args, {}, what, pos).status());
    if (name == "defined") return !v.Is<Undefined>();
    if (name == "undefined") return v.Is<Undefined>();
    if (name == "none") return v.Is<None>();
    if (name == "boolean") return v.Is<bool>();
    if (name == "true") return v.Is<bool>() && v.As<bool>();
    if (name == "false") return v.Is<bool>() && !v.As<bool>();
    if (name == "integer") return v.Is<int64_t>();
    if (name == "float") return v.Is<double>();
    if (name == "number") return IsNumber(v);
    if (name == "string") return v.Is<std::string>();
    if (name == "mapping") return v.Is<DictPtr>();
    // What Python's len() and iter() accept (an undefined value has both).
    if (name == "sequence" || name == "iterable") {
      return v.Is<std::string>() || v.Is<ListPtr>() || v.Is<DictPtr>() || v.Is<Undefined>();
    }
    if (name == "callable") return v.Is<Function>();
    if (name == "odd" || name == "even") {
      if (!IsIntegral(v)) return Error(pos, what + " takes an integer, not " + TypeName(v));
      return (AsInt(v) % 2 != 0) == (name == "odd");
    }
    return Error(pos, what + " is not supported");
  }

  // Python's `needle in haystack`.
  static Result<bool> Contains(const Value& haystack, const Value& needle, Pos pos) {
    if (haystack.Is<std::string>()) {
      if (needle.Is<Undefined>()) return UndefinedError(pos, needle);
      if (!needle.Is<std::string>()) return Error(pos, "'in <string>' needs a string, not " + TypeName(needle));
      return haystack.As<std::string>().find(needle.As<std::string>()) != std::string::npos;
    }
    if (haystack.Is<ListPtr>()) {
      for (const Value& item : haystack.As<ListPtr>()->items) {
        if (Equal(item, needle)) return true;
      }
      return false;
    }
    if (haystack.Is<DictPtr>()) {
      return needle.Is<std::string>() && haystack.As<DictPtr>()->Find(needle.As<std::string>()) != nullptr;
    }
    if (haystack.Is<Undefined>()) return false;  // it iterates as empty
    return Error(pos, "'in' needs a container, not " + TypeName(haystack));
  }

  // ------------------------------------------------------------- filters

  // Jinja's attribute getter for map, selectattr, join, unique: "a.b" or "0" steps.
  static Result<Value> GetPath(const Value& v, const std::string& path, Pos pos) {
    Value cur = v;
    size_t at = 0;
    while (true) {
      const size_t dot = path.find('.', at);
      const std::string part = path.substr(at, dot == std::string::npos ? std::string::npos : dot - at);
      int64_t index = 0;
      const auto [ptr, ec] = std::from_chars(part.data(), part.data() + part.size(), index);
      const bool numeric = !part.empty() && ec == std::errc() && ptr == part.data() + part.size();
      SLUICE_ASSIGN_OR_RETURN(cur, GetItem(cur, numeric ? Int(index) : Str(part), pos));
      if (dot == std::string::npos) return cur;
      at = dot + 1;
    }
  }

  Result<Value> Filter(const std::string& name, const Value& v, const Args& args, Pos pos) {
    const std::string what = "filter '" + name + "'";
    if (name == "default" || name == "d") {
      SLUICE_ASSIGN_OR_RETURN(auto a, Bind(args, {"default_value", "boolean"}, what, pos));
      const bool use_default = v.Is<Undefined>() || (a[1] && Truthy(*a[1]) && !Truthy(v));
      if (use_default) return a[0] ? *a[0] : Str("");
      return v;
    }
    if (name == "tojson") {
      SLUICE_ASSIGN_OR_RETURN(auto a, Bind(args, {"ensure_ascii", "indent", "separators", "sort_keys"}, what, pos));
      JsonStyle style;
      style.ensure_ascii = a[0] && Truthy(*a[0]);
      if (a[1] && !a[1]->Is<None>()) {
        if (a[1]->Is<std::string>()) {
          style.indent = a[1]->As<std::string>();
        } else if (IsIntegral(*a[1])) {
          style.indent = std::string(static_cast<size_t>(std::clamp<int64_t>(AsInt(*a[1]), 0, 1000)), ' ');
        } else {
          return Error(pos, "tojson: indent must be an integer or a string");
        }
        style.item_separator = ",";
      }
      if (a[2] && !a[2]->Is<None>()) {
        const Value& seps = *a[2];
        if (!seps.Is<ListPtr>() || seps.As<ListPtr>()->items.size() != 2 ||
            !seps.As<ListPtr>()->items[0].Is<std::string>() || !seps.As<ListPtr>()->items[1].Is<std::string>()) {
          return Error(pos, "tojson: separators must be two strings");
        }
        style.item_separator = seps.As<ListPtr>()->items[0].As<std::string>();
        style.key_separator = seps.As<ListPtr>()->items[1].As<std::string>();
      }
      style.sort_keys = a[3] && Truthy(*a[3]);
      std::string out;
      SLUICE_RETURN_IF_ERROR(AppendJson(v, style, 0, &out, pos));
      return Str(std::move(out));
    }
    if (name == "length" || name == "count") {
      SLUICE_RETURN_IF_ERROR(Bind(args, {}, what, pos).status());
      if (v.Is<std::string>()) return Int(CodePointCount(v.As<std::string>()));
      if (v.Is<ListPtr>()) return Int(static_cast<int64_t>(v.As<ListPtr>()->items.size()));
      if (v.Is<DictPtr>()) return Int(static_cast<int64_t>(v.As<DictPtr>()->items.size()));
      if (v.Is<Undefined>()) return Int(0);
      return Error(pos, "a value of type " + TypeName(v) + " has no length");
    }
    if (OneOf(name, {"string", "trim", "lower", "upper", "capitalize", "title", "replace"})) {
      SLUICE_ASSIGN_OR_RETURN(std::string s, ToStr(v, pos));
      if (name == "trim") {
        SLUICE_ASSIGN_OR_RETURN(auto a, Bind(args, {"chars"}, what, pos));
        SLUICE_ASSIGN_OR_RETURN(auto chars, OptionalString(a[0], what, pos));
        std::optional<std::u32string> set;
        if (chars) set = Decode(*chars);
        return Str(PyStrip(s, set, true, true));
      }
      if (name == "replace") {
        SLUICE_ASSIGN_OR_RETURN(auto a, Bind(args, {"old", "new", "count"}, what, pos));
        if (!a[0] || !a[1]) return Error(pos, what + " needs two strings");
        SLUICE_ASSIGN_OR_RETURN(std::string old, ToStr(*a[0], pos));
        SLUICE_ASSIGN_OR_RETURN(std::string repl, ToStr(*a[1], pos));
        SLUICE_ASSIGN_OR_RETURN(auto count, OptionalInt(a[2], what, pos));
        SLUICE_ASSIGN_OR_RETURN(std::string replaced, PyReplace(s, old, repl, count.value_or(-1), pos));
        return Str(std::move(replaced));
      }
      SLUICE_RETURN_IF_ERROR(Bind(args, {}, what, pos).status());
      if (name == "string") return Str(std::move(s));
      if (name == "lower") return Str(MapCase(s, Case::kLower));
      if (name == "upper") return Str(MapCase(s, Case::kUpper));
      if (name == "capitalize") return Str(PyCapitalize(s));
      return Str(JinjaTitle(s));
    }
    if (name == "first" || name == "last") {
      SLUICE_RETURN_IF_ERROR(Bind(args, {}, what, pos).status());
      SLUICE_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v, pos));
      if (items.empty()) return Undef(what + ": the sequence is empty");
      return name == "first" ? items.front() : items.back();
    }
    if (name == "join") {
      SLUICE_ASSIGN_OR_RETURN(auto a, Bind(args, {"d", "attribute"}, what, pos));
      SLUICE_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v, pos));
      std::string sep;
      if (a[0]) {
        SLUICE_ASSIGN_OR_RETURN(sep, ToStr(*a[0], pos));
      }
      SLUICE_ASSIGN_OR_RETURN(auto attribute, OptionalString(a[1], what, pos));
      std::string out;
      for (size_t i = 0; i < items.size(); ++i) {
        Value item = items[i];
        if (attribute) {
          SLUICE_ASSIGN_OR_RETURN(item, GetPath(item, *attribute, pos));
        }
        SLUICE_ASSIGN_OR_RETURN(std::string s, ToStr(item, pos));
        SLUICE_RETURN_IF_ERROR(CheckGrowth(out.size(), (i > 0 ? sep.size() : 0) + s.size(), pos));
        if (i > 0) out += sep;
        out += s;
      }
      return Str(std::move(out));
    }
    if (name == "items") {
      SLUICE_RETURN_IF_ERROR(Bind(args, {}, what, pos).status());
      if (v.Is<Undefined>()) return ListValue({});
      if (!v.Is<DictPtr>()) return Error(pos, what + " needs a mapping, not " + TypeName(v));
      return Items(*v.As<DictPtr>());
    }
    if (name == "list" || name == "reverse") {
      SLUICE_RETURN_IF_ERROR(Bind(args, {}, what, pos).status());
      if (name == "reverse" && v.Is<std::string>()) {
        std::u32string cps = Decode(v.As<std::string>());
        std::reverse(cps.begin(), cps.end());
        return Str(Encode(cps));
      }
      SLUICE_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v, pos));
      if (name == "reverse") std::reverse(items.begin(), items.end());
      return ListValue(std::move(items));
    }
    if (name == "unique") {
      SLUICE_ASSIGN_OR_RETURN(auto a, Bind(args, {"case_sensitive", "attribute"}, what, pos));
      const bool case_sensitive = a[0] && Truthy(*a[0]);
      SLUICE_ASSIGN_OR_RETURN(auto attribute, OptionalString(a[1], what, pos));
      SLUICE_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v, pos));
      std::vector<Value> out, seen;
      for (const Value& item : items) {
        Value key = item;
        if (attribute) {
          SLUICE_ASSIGN_OR_RETURN(key, GetPath(item, *attribute, pos));
        }
        if (!case_sensitive && key.Is<std::string>()) key = Str(MapCase(key.As<std::string>(), Case::kLower));
        if ((key.Is<ListPtr>() && !key.As<ListPtr>()->tuple) || key.Is<DictPtr>()) {
          return Error(pos, what + ": a value of type " + TypeName(key) + " is not hashable");
        }
        if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return Equal(s, key); })) {
          seen.push_back(key);
          out.push_back(item);
        }
      }
      return ListValue(std::move(out));
    }
    if (name == "abs") {
      SLUICE_RETURN_IF_ERROR(Bind(args, {}, what, pos).status());
      if (v.Is<double>()) return Float(std::fabs(v.As<double>()));
      if (IsIntegral(v)) return CheckedInt(AsInt(v) == std::numeric_limits<int64_t>::min(), std::llabs(AsInt(v)), pos);
      return Error(pos, what + " needs a number, not " + TypeName(v));
    }
    if (name == "int" || name == "float") return ToNumber(name == "int", v, args, what, pos);
    if (name == "map") return Map(v, args, pos);
    if (OneOf(name, {"select", "reject", "selectattr", "rejectattr"})) return Select(name, v, args, pos);
    return Error(pos, what + " is not supported");
  }

  // Jinja's int and float filters: Python's int() / float(), the default
  // for what does not convert.
  static Result<Value> ToNumber(bool to_int, const Value& v, const Args& args, const std::string& what, Pos pos) {
    SLUICE_ASSIGN_OR_RETURN(auto a,
                            to_int ? Bind(args, {"default", "base"}, what, pos) : Bind(args, {"default"}, what, pos));
    if (to_int && a[1] && !(IsIntegral(*a[1]) && AsInt(*a[1]) == 10)) {
      return Error(pos, what + ": only base 10 is supported");
    }
    const Value fallback = a[0] ? *a[0] : (to_int ? Int(0) : Float(0.0));
    std::optional<double> d;
    std::optional<int64_t> i;
    if (IsIntegral(v)) {
      i = AsInt(v);
      d = static_cast<double>(*i);
    } else if (v.Is<double>()) {
      d = v.As<double>();
    } else if (v.Is<std::string>()) {
      const std::string s = PyStrip(v.As<std::string>(), std::nullopt, true, true);
      std::string clean;
      for (size_t k = 0; k < s.size(); ++k) {
        // Python allows single underscores between digits.
        if (s[k] == '_' && k > 0 && k + 1 < s.size() && IsDigit(s[k - 1]) && IsDigit(s[k + 1])) continue;
        clean += s[k];
      }
      int64_t parsed = 0;
      const char* b = clean.data() + (!clean.empty() && clean[0] == '+' ? 1 : 0);
      const auto [ptr, ec] = std::from_chars(b, clean.data() + clean.size(), parsed);
      if (!clean.empty() && ec == std::errc() && ptr == clean.data() + clean.size()) {
        i = parsed;
        d = static_cast<double>(parsed);
      } else if (!clean.empty() && clean.find_first_of("xXpP") == std::string::npos) {
        char* end = nullptr;
        const double x = std::strtod(clean.c_str(), &end);
        if (end == clean.c_str() + clean.size()) d = x;
      }
    }
    if (!d) return fallback;
    if (!to_int) return Float(*d);
    if (i) return Int(*i);
    if (!std::isfinite(*d) || std::fabs(*d) >= 9.2e18) return fallback;
    return Int(static_cast<int64_t>(std::trunc(*d)));
  }

  // map(attribute='x', default=...) or map('filter', args...).
  Result<Value> Map(const Value& v, const Args& args, Pos pos) {
    SLUICE_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v, pos));
    std::vector<Value> out;
    if (args.positional.empty()) {
      SLUICE_ASSIGN_OR_RETURN(auto a, Bind(args, {"attribute", "default"}, "filter 'map'", pos));
      SLUICE_ASSIGN_OR_RETURN(auto attribute, OptionalString(a[0], "map's attribute", pos));
      if (!attribute) return Error(pos, "filter 'map' needs a filter name or attribute=");
      for (const Value& item : items) {
        SLUICE_ASSIGN_OR_RETURN(Value x, GetPath(item, *attribute, pos));
        out.push_back(x.Is<Undefined>() && a[1] ? *a[1] : x);
      }
      return ListValue(std::move(out));
    }
    if (!args.positional[0].Is<std::string>()) return Error(pos, "filter 'map' needs a filter name");
    const std::string filter = args.positional[0].As<std::string>();
    if (!IsSupportedFilter(filter)) return Error(pos, "filter '" + filter + "' is not supported");
    Args rest = args;
    rest.positional.erase(rest.positional.begin());
    for (const Value& item : items) {
      SLUICE_ASSIGN_OR_RETURN(Value x, Filter(filter, item, rest, pos));
      out.push_back(std::move(x));
    }
    return ListValue(std::move(out));
  }

  // select/reject(test, args...) and selectattr/rejectattr(attribute, test, args...).
  static Result<Value> Select(const std::string& name, const Value& v, const Args& args, Pos pos) {
    const bool by_attribute = name.find("attr") != std::string::npos;
    const bool keep_if = name.rfind("select", 0) == 0;
    if (!args.keywords.empty()) return Error(pos, "filter '" + name + "' takes no keyword arguments");
    size_t next = 0;
    std::string attribute;
    if (by_attribute) {
      if (args.positional.empty() || !args.positional[0].Is<std::string>()) {
        return Error(pos, "filter '" + name + "' needs an attribute name");
      }
      attribute = args.positional[next++].As<std::string>();
    }
    std::string test;
    if (next < args.positional.size()) {
      if (!args.positional[next].Is<std::string>()) return Error(pos, "filter '" + name + "' needs a test name");
      test = args.positional[next++].As<std::string>();
      if (!IsSupportedTest(test)) return Error(pos, "test '" + test + "' is not supported");
    }
    Args test_args;
    test_args.positional.assign(args.positional.begin() + static_cast<std::ptrdiff_t>(next), args.positional.end());
    SLUICE_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v, pos));
    std::vector<Value> out;
    for (const Value& item : items) {
      Value x = item;
      if (by_attribute) {
        SLUICE_ASSIGN_OR_RETURN(x, GetPath(item, attribute, pos));
      }
      bool pass = Truthy(x);
      if (!test.empty()) {
        SLUICE_ASSIGN_OR_RETURN(pass, Test(test, x, test_args, pos));
      }
      if (pass == keep_if) out.push_back(item);
    }
    return ListValue(std::move(out));
  }

  // ----------------------------------------------------------- operators

  static Result<Value> CheckedInt(bool overflow, int64_t r, Pos pos) {
    if (overflow) return Error(pos, "integer overflow (integers are 64-bit here)");
    return Int(r);
  }

  // Python's floor division and modulo of floats.
  static std::pair<double, double> FloatDivMod(double a, double b) {
    double mod = std::fmod(a, b);
    double div = (a - mod) / b;
    if (mod != 0) {
      if ((b < 0) != (mod < 0)) {
        mod += b;
        div -= 1.0;
      }
    } else {
      mod = std::copysign(0.0, b);
    }
    double floordiv = 0;
    if (div != 0) {
      floordiv = std::floor(div);
      if (div - floordiv > 0.5) floordiv += 1.0;
    } else {
      floordiv = std::copysign(0.0, a / b);
    }
    return {floordiv, mod};
  }

  static Result<Value> Repeat(const Value& seq, int64_t n, Pos pos) {
    n = std::max<int64_t>(n, 0);
    if (seq.Is<std::string>()) {
      const std::string& s = seq.As<std::string>();
      if (!s.empty() && n > static_cast<int64_t>(kMaxOutputBytes / s.size())) return Error(pos, "a string too long");
      std::string out;
      for (int64_t i = 0; i < n; ++i) out += s;
      return Str(std::move(out));
    }
    const List& list = *seq.As<ListPtr>();
    if (!list.items.empty() && n > kMaxSequenceLength / static_cast<int64_t>(list.items.size())) {
      return Error(pos, "a list too long");
    }
    const uint64_t bytes = ShallowBytes(seq);
    if (bytes > 0 && static_cast<uint64_t>(n) > kMaxBuiltBytes / bytes) {
      return Error(pos, "a list larger than " + std::to_string(kMaxBuiltBytes >> 20) + " MiB");
    }
    std::vector<Value> out;
    for (int64_t i = 0; i < n; ++i) out.insert(out.end(), list.items.begin(), list.items.end());
    return ListValue(std::move(out), list.tuple);
  }

  static Result<Value> Arithmetic(const std::string& op, const Value& a, const Value& b, Pos pos) {
    if (a.Is<Undefined>()) return UndefinedError(pos, a);
    if (b.Is<Undefined>()) return UndefinedError(pos, b);
    if (op == "+" && a.Is<std::string>() && b.Is<std::string>()) {
      SLUICE_RETURN_IF_ERROR(CheckGrowth(a.As<std::string>().size(), b.As<std::string>().size(), pos));
      return Str(a.As<std::string>() + b.As<std::string>());
    }
    if (op == "+" && a.Is<ListPtr>() && b.Is<ListPtr>() && a.As<ListPtr>()->tuple == b.As<ListPtr>()->tuple) {
      if (a.As<ListPtr>()->items.size() + b.As<ListPtr>()->items.size() > static_cast<size_t>(kMaxSequenceLength) ||
          ShallowBytes(a) + ShallowBytes(b) > kMaxBuiltBytes) {
        return Error(pos, "a list too long");
      }
      std::vector<Value> items = a.As<ListPtr>()->items;
      items.insert(items.end(), b.As<ListPtr>()->items.begin(), b.As<ListPtr>()->items.end());
      return ListValue(std::move(items), a.As<ListPtr>()->tuple);
    }
    if (op == "*" && (a.Is<std::string>() || a.Is<ListPtr>()) && IsIntegral(b)) return Repeat(a, AsInt(b), pos);
    if (op == "*" && (b.Is<std::string>() || b.Is<ListPtr>()) && IsIntegral(a)) return Repeat(b, AsInt(a), pos);
    if (op == "%" && a.Is<std::string>()) return Error(pos, "string formatting with '%' is not supported");
    if (!IsNumber(a) || !IsNumber(b)) {
      return Error(pos, "unsupported operand types for " + op + ": " + TypeName(a) + " and " + TypeName(b));
    }
    if (IsIntegral(a) && IsIntegral(b) && op != "/") {
      const int64_t x = AsInt(a), y = AsInt(b);
      int64_t r = 0;
      bool overflow = false;
      if (op == "+" || op == "-" || op == "*") {
        overflow = op == "+"   ? __builtin_add_overflow(x, y, &r)
                   : op == "-" ? __builtin_sub_overflow(x, y, &r)
                               : __builtin_mul_overflow(x, y, &r);
        return CheckedInt(overflow, r, pos);
      }
      if (op == "**") {
        if (y < 0) {
          if (x == 0) return Error(pos, "zero to a negative power");
          return Float(std::pow(static_cast<double>(x), static_cast<double>(y)));
        }
        int64_t result = 1, base = x, e = y;
        while (e > 0 && !overflow) {
          if ((e & 1) != 0) overflow = __builtin_mul_overflow(result, base, &result);
          e >>= 1;
          if (e > 0 && !overflow) overflow = __builtin_mul_overflow(base, base, &base);
        }
        return CheckedInt(overflow, result, pos);
      }
      if (y == 0) return Error(pos, "division by zero");
      if (x == std::numeric_limits<int64_t>::min() && y == -1) return op == "//" ? CheckedInt(true, 0, pos) : Int(0);
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {  // Python floors
        q -= 1;
        m += y;
      }
      return Int(op == "//" ? q : m);
    }
    const double x = AsDouble(a), y = AsDouble(b);
    if (op == "+") return Float(x + y);
    if (op == "-") return Float(x - y);
    if (op == "*") return Float(x * y);
    if (op == "**") {
      if (x == 0 && y < 0) return Error(pos, "zero to a negative power");
      if (x < 0 && y != std::floor(y)) return Error(pos, "a negative number to a fractional power");
      return Float(std::pow(x, y));
    }
    if (y == 0) return Error(pos, "division by zero");
    if (op == "/") return Float(x / y);
    const auto [div, mod] = FloatDivMod(x, y);
    return Float(op == "//" ? div : mod);
  }

  // ---------------------------------------------------------- evaluation

  // Evaluates `e`, charging the budget a step for the node, one per 64
  // bytes of a string it yields (strings are copied by value), and the
  // bytes of a string or list it builds.
  Result<Value> Eval(const Expr& e) {
    SLUICE_RETURN_IF_ERROR(budget_.Spend(1, e.pos));
    SLUICE_ASSIGN_OR_RETURN(Value v, EvalNode(e));
    SLUICE_RETURN_IF_ERROR(budget_.Spend(v.Is<std::string>() ? v.As<std::string>().size() / 64 : 0, e.pos));
    switch (e.kind) {
      case Expr::Kind::kConst:
      case Expr::Kind::kName:
      case Expr::Kind::kAttr:
      case Expr::Kind::kItem:
      case Expr::Kind::kCond:
      case Expr::Kind::kAnd:
      case Expr::Kind::kOr:
        break;  // a value that exists already
      default:
        SLUICE_RETURN_IF_ERROR(budget_.Build(ShallowBytes(v), e.pos));
    }
    return v;
  }

  Result<Value> EvalNode(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kConst:
        return e.value;
      case Expr::Kind::kName:
        return Lookup(e.name);
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        std::vector<Value> items;
        for (const auto& a : e.args) {
          SLUICE_ASSIGN_OR_RETURN(Value v, Eval(*a));
          if (DepthOf(v) >= kMaxValueDepth) return Error(e.pos, "a value nested too deeply");
          items.push_back(std::move(v));
        }
        return ListValue(std::move(items), e.kind == Expr::Kind::kTuple);
      }
      case Expr::Kind::kDict: {
        Dict dict;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          SLUICE_ASSIGN_OR_RETURN(Value key, Eval(*e.args[i]));
          SLUICE_ASSIGN_OR_RETURN(Value v, Eval(*e.args[i + 1]));
          if (!key.Is<std::string>()) return Error(e.args[i]->pos, "dict keys must be strings here");
          if (DepthOf(v) >= kMaxValueDepth) return Error(e.pos, "a value nested too deeply");
          dict.Set(key.As<std::string>(), std::move(v));
        }
        return DictValue(std::move(dict));
      }
      case Expr::Kind::kAttr: {
        SLUICE_ASSIGN_OR_RETURN(Value base, Eval(*e.args[0]));
        return GetAttr(base, e.name, e.pos);
      }
      case Expr::Kind::kItem: {
        SLUICE_ASSIGN_OR_RETURN(Value base, Eval(*e.args[0]));
        SLUICE_ASSIGN_OR_RETURN(Value key, Eval(*e.args[1]));
        return GetItem(base, key, e.pos);
      }
      case Expr::Kind::kSlice:
        return Slice(e);
      case Expr::Kind::kCall: {
        SLUICE_ASSIGN_OR_RETURN(Value f, Eval(*e.args[0]));
        SLUICE_ASSIGN_OR_RETURN(Args args, EvalArgs(e, 1));
        return Call(f, args, e.args[0]->pos);
      }
      case Expr::Kind::kFilter: {
        SLUICE_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        SLUICE_ASSIGN_OR_RETURN(Args args, EvalArgs(e, 1));
        return Filter(e.name, v, args, e.pos);
      }
      case Expr::Kind::kTest: {
        SLUICE_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        SLUICE_ASSIGN_OR_RETURN(Args args, EvalArgs(e, 1));
        SLUICE_ASSIGN_OR_RETURN(bool pass, Test(e.name, v, args, e.pos));
        return Bool(pass != e.negated);
      }
      case Expr::Kind::kNot: {
        SLUICE_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        return Bool(!Truthy(v));
      }
      case Expr::Kind::kNeg:
      case Expr::Kind::kPlus: {
        SLUICE_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        if (v.Is<Undefined>()) return UndefinedError(e.pos, v);
        if (!IsNumber(v)) return Error(e.pos, "a sign before a value of type " + TypeName(v));
        if (e.kind == Expr::Kind::kPlus) return v.Is<bool>() ? Int(AsInt(v)) : v;
        if (v.Is<double>()) return Float(-v.As<double>());
        return CheckedInt(AsInt(v) == std::numeric_limits<int64_t>::min(), -AsInt(v), e.pos);
      }
      case Expr::Kind::kBinary: {
        SLUICE_ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
        SLUICE_ASSIGN_OR_RETURN(Value b, Eval(*e.args[1]));
        return Arithmetic(e.name, a, b, e.pos);
      }
      case Expr::Kind::kAnd:
      case Expr::Kind::kOr: {
        SLUICE_ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
        if (Truthy(a) == (e.kind == Expr::Kind::kOr)) return a;
        return Eval(*e.args[1]);
      }
      case Expr::Kind::kCompare: {
        SLUICE_ASSIGN_OR_RETURN(Value left, Eval(*e.args[0]));
        for (size_t i = 0; i < e.ops.size(); ++i) {
          SLUICE_ASSIGN_OR_RETURN(Value right, Eval(*e.args[i + 1]));
          const std::string& op = e.ops[i];
          bool holds = false;
          if (op == "==" || op == "!=") {
            holds = Equal(left, right) == (op == "==");
          } else if (op == "in" || op == "notin") {
            SLUICE_ASSIGN_OR_RETURN(bool found, Contains(right, left, e.pos));
            holds = found == (op == "in");
          } else {
            SLUICE_ASSIGN_OR_RETURN(int c, Compare(left, right, e.pos, op));
            holds = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
          }
          if (!holds) return Bool(false);
          left = std::move(right);
        }
        return Bool(true);
      }
      case Expr::Kind::kCond: {
        SLUICE_ASSIGN_OR_RETURN(Value cond, Eval(*e.args[1]));
        if (Truthy(cond)) return Eval(*e.args[0]);
        if (e.args[2]) return Eval(*e.args[2]);
        return Undef("the conditional expression has no else branch");
      }
      case Expr::Kind::kConcat: {
        std::string out;
        for (const auto& a : e.args) {
          SLUICE_ASSIGN_OR_RETURN(Value v, Eval(*a));
          SLUICE_ASSIGN_OR_RETURN(std::string s, ToStr(v, a->pos));
          SLUICE_RETURN_IF_ERROR(CheckGrowth(out.size(), s.size(), e.pos));
          out += s;
        }
        return Str(std::move(out));
      }
    }
    return Error(e.pos, "unknown expression");
  }

  // A loop iteration builds its frame and its `loop` dict: a few steps.
  static constexpr uint64_t kLoopIterationSteps = 8;

  std::tm now_;
  std::string* out_;
  std::vector<Frame> frames_;
  std::vector<NamespacePtr> namespaces_;
  RenderBudget budget_;
  RenderBudget* outer_budget_;  // a rendering's within another's: none here, but restored all the same
};

Result<std::string> ReadFile(const std::filesystem::path& path) { return ReadFileToString(path.string()); }

}  // namespace

struct ChatTemplate::Program {
  Body body;
  std::shared_ptr<const Program> tool_use;  // a {name: "tool_use"} template, for contexts with tools
};

Result<ChatTemplate> ChatTemplate::Parse(std::string_view source) {
  // Checked once here, so that everything after may assume valid UTF-8.
  for (size_t i = 0; i < source.size();) {
    const size_t start = i;
    if (NextCodePoint(source, &i) == 0xFFFD && source.compare(start, 3, "\xEF\xBF\xBD") != 0) {
      return Status::InvalidArgument("chat template: not valid UTF-8 at byte " + std::to_string(start));
    }
  }
  SLUICE_ASSIGN_OR_RETURN(std::vector<Token> tokens, Lexer(source).Run());
  auto program = std::make_shared<Program>();
  SLUICE_ASSIGN_OR_RETURN(program->body, Parser(std::move(tokens)).ParseTemplate());
  ChatTemplate t;
  t.program_ = std::move(program);
  return t;
}

Result<ChatTemplate> ChatTemplate::Load(const std::string& model_dir) {
  const std::filesystem::path dir(model_dir);
  const std::filesystem::path path = dir / "tokenizer_config.json";
  SLUICE_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  SLUICE_ASSIGN_OR_RETURN(const Json config, ParseBoundedJson<Json>(text, path.string()));
  if (config.is_discarded() || !config.is_object()) {
    return Status::InvalidArgument(path.string() + ": not a JSON object");
  }
  auto parse = [](const std::string& source, const std::string& origin) -> Result<ChatTemplate> {
    Result<ChatTemplate> t = Parse(source);
    if (!t.ok()) return t.status().WithContext(origin);
    return t;
  };
  std::optional<ChatTemplate> chosen;
  const std::filesystem::path jinja = dir / "chat_template.jinja";
  std::error_code error;
  if (std::filesystem::exists(jinja, error)) {  // transformers prefers it to the config's
    SLUICE_ASSIGN_OR_RETURN(std::string source, ReadFile(jinja));
    SLUICE_ASSIGN_OR_RETURN(chosen, parse(source, jinja.string()));
  } else {
    const auto ct = config.find("chat_template");
    if (ct == config.end() || ct->is_null()) return Status::NotFound(path.string() + ": no chat_template");
    if (ct->is_string()) {
      SLUICE_ASSIGN_OR_RETURN(chosen, parse(ct->get<std::string>(), path.string()));
    } else if (ct->is_array()) {
      std::optional<ChatTemplate> tool_use;
      for (const Json& entry : *ct) {
        if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
            !entry.contains("template") || !entry["template"].is_string()) {
          return Status::InvalidArgument(path.string() + ": chat_template entries must be {\"name\", \"template\"}");
        }
        const std::string name = entry["name"].get<std::string>();
        if (name != "default" && name != "tool_use") continue;
        SLUICE_ASSIGN_OR_RETURN(ChatTemplate t,
                                parse(entry["template"].get<std::string>(), path.string() + " (" + name + ")"));
        (name == "default" ? chosen : tool_use) = std::move(t);
      }
      if (!chosen) return Status::NotFound(path.string() + ": chat_template has no \"default\" entry");
      if (tool_use) {
        auto program = std::make_shared<Program>(*chosen->program_);
        program->tool_use = tool_use->program_;
        chosen->program_ = std::move(program);
      }
    } else {
      return Status::InvalidArgument(path.string() + ": chat_template is neither a string nor a list");
    }
  }
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
    SLUICE_ASSIGN_OR_RETURN(std::optional<std::string> token, SpecialTokenText(config, key, path.string()));
    if (token) chosen->special_tokens_[key] = *token;
  }
  return std::move(*chosen);
}

Result<std::string> ChatTemplate::Render(const nlohmann::ordered_json& context) const {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);  // datetime.now(): local time, as transformers formats it
  return RenderAt(context, local);
}

Result<std::string> ChatTemplate::Render(const nlohmann::ordered_json& context, const std::tm& now) const {
  std::tm normalized = now;
  timegm(&normalized);  // fills in the weekday and the day of the year from the date
  return RenderAt(context, normalized);
}

Result<std::string> ChatTemplate::RenderAt(const nlohmann::ordered_json& context, const std::tm& now) const {
  if (!context.is_object()) return Status::InvalidArgument("chat template context: not a JSON object");
  if (!program_) return Status::FailedPrecondition("chat template: rendering an empty ChatTemplate");
  const auto tools = context.find("tools");
  const bool with_tools = tools != context.end() && !tools->is_null();
  const Program& program = with_tools && program_->tool_use ? *program_->tool_use : *program_;
  std::string out;
  Renderer r(now, &out);
  // What apply_chat_template passes besides the caller's variables.
  r.SetGlobal("tools", NoneValue());
  r.SetGlobal("documents", NoneValue());
  r.SetGlobal("add_generation_prompt", Bool(false));
  for (const auto& [key, value] : special_tokens_.items()) r.SetGlobal(key, Str(value.get<std::string>()));
  for (const auto& [key, value] : context.items()) {
    SLUICE_ASSIGN_OR_RETURN(Value v, FromJson(value, 0));
    r.SetGlobal(key, std::move(v));
  }
  SLUICE_RETURN_IF_ERROR(r.Exec(program.body).status());
  return out;
}

Result<std::string> PromptFormat::Apply(const std::string& prompt) const {
  if (!chat) return prompt;
  nlohmann::ordered_json context = variables.is_object() ? variables : nlohmann::ordered_json::object();
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
  messages.push_back({{"role", "user"}, {"content", prompt}});
  context["messages"] = std::move(messages);
  context["add_generation_prompt"] = true;
  return chat->Render(context);
}

}  // namespace sluice::model
