// A chat template's values, as Jinja and Python give them: None, bools,
// numbers, strings, lists, dicts, namespaces, functions; their Python
// printing and JSON; the Unicode string operations Python's str offers; the
// source positions errors name; and the budgets that bound one rendering.
#ifndef SLUICE_MODEL_CHAT_TEMPLATE_VALUES_H_
#define SLUICE_MODEL_CHAT_TEMPLATE_VALUES_H_

#include <cstdint>
#include <ctime>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "sluice/common/status.h"
#include "utf8.h"

namespace sluice::model::jinja {

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

std::string Where(Pos pos);

Status Error(Pos pos, const std::string& what);

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
extern thread_local RenderBudget* active_budget;

Status Spend(uint64_t steps, Pos pos);

// A string about to grow by `more` bytes: refused past kMaxOutputBytes
// before anything is allocated.
Status CheckGrowth(size_t size, size_t more, Pos pos);

// -------------------------------------------------------------- Unicode

// An ASCII digit (what Python's and Jinja's number syntax accepts).
inline bool IsDigit(char c) { return c >= '0' && c <= '9'; }

using internal::AppendUtf8;

// The code point at s[*i], advancing *i; U+FFFD for a byte that starts no
// valid sequence (strings here are valid UTF-8: JSON strings and template
// source checked by Parse).
char32_t NextCodePoint(std::string_view s, size_t* i);

std::u32string Decode(std::string_view s);

std::string Encode(std::u32string_view cps);

int64_t CodePointCount(std::string_view s);

// Python's str.isspace(), which str.strip() and str.split() and the regex
// class \s (Jinja's whitespace control) follow.
bool IsPySpace(char32_t c);

// Python's str.splitlines() boundaries (besides "\r\n", which is one).
bool IsLineBreak(char32_t c);

// Case mappings as Python's: Unicode's full mappings where they are common
// (ß, İ, the Latin ligatures ﬀ..ﬆ, ŉ, ǰ), the simple one-code-point
// mappings elsewhere (Python also applies the rarer full ones, e.g. of
// Greek with ypogegrammeni, and the final-sigma rule).
enum class Case { kUpper, kLower, kTitle };

void AppendCase(char32_t c, Case to, std::string* out);

bool IsCased(char32_t c);

// Python's str.isprintable() for one code point, which repr() follows.
bool IsPrintable(char32_t c);

std::string MapCase(std::string_view s, Case to);

// Python's str.title(): a cased code point after an uncased one starts a word.
std::string PyTitle(std::string_view s);

// Python's str.capitalize(): the first code point in title case, the rest lower.
std::string PyCapitalize(std::string_view s);

// Jinja's title filter (not str.title()): words start after whitespace or
// one of -({[< and take their first code point upper-cased, the rest lower.
std::string JinjaTitle(std::string_view s);

// Python's str.strip / lstrip / rstrip: whitespace, or the code points of `chars`.
std::string PyStrip(std::string_view s, const std::optional<std::u32string>& chars, bool left, bool right);

// Python's str.split() without a separator: runs of whitespace, at most
// `maxsplit` splits (negative: all), from the left or (rsplit) the right.
std::vector<std::string> PySplitWhitespace(std::string_view s, int64_t maxsplit, bool from_right);

// Python's str.split(sep) / rsplit(sep) with a non-empty separator.
std::vector<std::string> PySplit(const std::string& s, const std::string& sep, int64_t maxsplit, bool from_right);

// Python's str.replace(old, new, count): an empty `old` inserts `new`
// before every code point and at the end.
Result<std::string> PyReplace(const std::string& s, const std::string& old, const std::string& repl, int64_t count,
                              Pos pos);

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
Value Str(std::string s);
Value Int(int64_t i);
Value Float(double d);
Value Bool(bool b);
Value NoneValue();
Value Undef(std::string what);

int DepthOf(const Value& v);

Value ListValue(std::vector<Value> items, bool tuple = false);

Value DictValue(Dict dict);

// The bytes a value's own storage holds: a string's, or a list's or dict's
// items (strings are held by value, so copying a list copies them), not
// what the sublists it shares hold.
uint64_t ShallowBytes(const Value& v);

Value StringList(const std::vector<std::string>& items);

bool IsNumber(const Value& v);
bool IsIntegral(const Value& v);
int64_t AsInt(const Value& v);
double AsDouble(const Value& v);

// Python's type names, for messages.
std::string TypeName(const Value& v);

// Jinja's name for a value's type in its undefined-value messages.
std::string TypeRepr(const Value& v);

// The error of using an undefined value where a value is needed.
Status UndefinedError(Pos pos, const Value& v);

bool Truthy(const Value& v);

// Python's ==. Numbers compare by value across int, float and bool; a list
// never equals a tuple; namespaces and functions only themselves.
bool Equal(const Value& a, const Value& b);

// Python's ordering (<) of numbers, strings (by code point, as UTF-8 bytes
// order them) and lists or tuples of those: -1, 0 or 1.
Result<int> Compare(const Value& a, const Value& b, Pos pos, std::string_view op);

// ------------------------------------------------------- Python printing

// Python's repr() of a float: the shortest digits that read back, in fixed
// notation with ".0" for exponents -4 to 15 and as 1e+16 elsewhere.
std::string PyFloatRepr(double d);

void AppendHex(uint32_t v, int width, std::string* out);

// Python's repr() of a str.
void AppendStrRepr(std::string_view s, std::string* out);

// Python's repr() (as str() of a list or dict prints its items).
Status AppendRepr(const Value& v, std::string* out, int depth, Pos pos);

// Python's str(), as {{ }}, ~ and the string filter print values; an
// undefined value prints as nothing.
Result<std::string> ToStr(const Value& v, Pos pos);

// transformers' tojson filter: json.dumps(x, ensure_ascii=False, indent=None,
// separators=None, sort_keys=False) and those keywords.
struct JsonStyle {
  bool ensure_ascii = false;
  std::optional<std::string> indent;  // none: one line
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
};

void AppendJsonString(std::string_view s, bool ensure_ascii, std::string* out);

Status AppendJson(const Value& v, const JsonStyle& style, int level, std::string* out, Pos pos);

Result<Value> FromJson(const Json& j, int depth);

}  // namespace sluice::model::jinja

#endif  // SLUICE_MODEL_CHAT_TEMPLATE_VALUES_H_
