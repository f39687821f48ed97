#include "chat_template/interpreter.h"

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

namespace sluice::model::jinja {
namespace {

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

}  // namespace

Status Render(const Body& body, const std::vector<std::pair<std::string, Value>>& globals, const std::tm& now,
              std::string* out) {
  Renderer r(now, out);
  for (const auto& [name, value] : globals) r.SetGlobal(name, value);
  return r.Exec(body).status();
}

}  // namespace sluice::model::jinja
