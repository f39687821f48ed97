#include "sluice/model/chat_template.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <map>
#include <optional>
#include <sstream>
#include <vector>

namespace sluice::model {

namespace {

using Json = nlohmann::ordered_json;

// ------------------------------------------------------------------ values

// A Jinja value: JSON data, Jinja's Undefined, a namespace (mutable through
// `set ns.x`), or a callable (a global function or a bound method).
struct Value {
  enum class Kind { kUndefined, kData, kNamespace, kCallable } kind = Kind::kUndefined;
  Json data;
  std::shared_ptr<Json> ns;
  std::string callable;  // "namespace", "range", "raise_exception", "strftime_now", or "method:<name>"
  Json self;             // a bound method's receiver

  static Value Of(Json j) {
    Value v;
    v.kind = Kind::kData;
    v.data = std::move(j);
    return v;
  }
  bool defined() const { return kind != Kind::kUndefined; }
};

struct RenderError {
  std::string message;
};

[[noreturn]] void Fail(int line, const std::string& what) {
  throw RenderError{"chat template line " + std::to_string(line) + ": " + what};
}

bool Truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kNamespace:
    case Value::Kind::kCallable:
      return true;
    case Value::Kind::kData:
      break;
  }
  const Json& j = v.data;
  if (j.is_null()) return false;
  if (j.is_boolean()) return j.get<bool>();
  if (j.is_number_integer()) return j.get<int64_t>() != 0;
  if (j.is_number()) return j.get<double>() != 0.0;
  if (j.is_string()) return !j.get_ref<const std::string&>().empty();
  return !j.empty();
}

// Python's repr of a float: the shortest digits that read back, with ".0"
// for integral values and Python's exponent form.
std::string PyFloat(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), d);
  std::string s(buf, end);
  const size_t e = s.find('e');
  if (e != std::string::npos) {
    // C++ prints 1e-05 as "1e-05"; Python too. "1e+20" as "1e+20": same.
    return s;
  }
  if (s.find('.') == std::string::npos) s += ".0";
  return s;
}

void PyRepr(const Json& j, std::string* out);

// str() of a value, as Jinja prints it.
std::string PyStr(const Json& j) {
  if (j.is_string()) return j.get<std::string>();
  std::string out;
  PyRepr(j, &out);
  return out;
}

void PyRepr(const Json& j, std::string* out) {
  if (j.is_null()) {
    *out += "None";
  } else if (j.is_boolean()) {
    *out += j.get<bool>() ? "True" : "False";
  } else if (j.is_number_integer() || j.is_number_unsigned()) {
    *out += j.dump();
  } else if (j.is_number()) {
    *out += PyFloat(j.get<double>());
  } else if (j.is_string()) {
    const std::string& s = j.get_ref<const std::string&>();
    const char q = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
    *out += q;
    for (char c : s) {
      if (c == q || c == '\\') *out += '\\';
      if (c == '\n') {
        *out += "\\n";
        continue;
      }
      *out += c;
    }
    *out += q;
  } else if (j.is_array()) {
    *out += '[';
    for (size_t i = 0; i < j.size(); ++i) {
      if (i) *out += ", ";
      PyRepr(j[i], out);
    }
    *out += ']';
  } else {
    *out += '{';
    bool first = true;
    for (const auto& [k, v] : j.items()) {
      if (!first) *out += ", ";
      first = false;
      PyRepr(Json(k), out);
      *out += ": ";
      PyRepr(v, out);
    }
    *out += '}';
  }
}

// Python's json.dumps(ensure_ascii=False, indent=indent) with its default
// separators, keys in their order: transformers' tojson filter.
void PyJson(const Json& j, int indent, int depth, std::string* out) {
  auto newline = [&](int d) {
    if (indent < 0) return;
    *out += '\n';
    out->append(static_cast<size_t>(indent * d), ' ');
  };
  if (j.is_string()) {
    *out += '"';
    for (unsigned char c : j.get_ref<const std::string&>()) {
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
          if (c < 0x20 || c == 0x7f) {
            char buf[8];
            std::snprintf(buf, sizeof(buf), "\\u%04x", c);
            *out += buf;
          } else {
            *out += static_cast<char>(c);
          }
      }
    }
    *out += '"';
  } else if (j.is_null()) {
    *out += "null";
  } else if (j.is_boolean()) {
    *out += j.get<bool>() ? "true" : "false";
  } else if (j.is_number_float()) {
    *out += PyFloat(j.get<double>());
  } else if (j.is_number()) {
    *out += j.dump();
  } else if (j.is_array()) {
    if (j.empty()) {
      *out += "[]";
      return;
    }
    *out += '[';
    for (size_t i = 0; i < j.size(); ++i) {
      if (i) *out += indent < 0 ? ", " : ",";
      newline(depth + 1);
      PyJson(j[i], indent, depth + 1, out);
    }
    newline(depth);
    *out += ']';
  } else {
    if (j.empty()) {
      *out += "{}";
      return;
    }
    *out += '{';
    bool first = true;
    for (const auto& [k, v] : j.items()) {
      if (!first) *out += indent < 0 ? ", " : ",";
      first = false;
      newline(depth + 1);
      PyJson(Json(k), indent, depth + 1, out);
      *out += ": ";
      PyJson(v, indent, depth + 1, out);
    }
    newline(depth);
    *out += '}';
  }
}

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string Strip(const std::string& s, const std::string* chars, bool left, bool right) {
  auto drop = [&](char c) { return chars ? chars->find(c) != std::string::npos : IsSpace(c); };
  size_t b = 0, e = s.size();
  if (left) {
    while (b < e && drop(s[b])) ++b;
  }
  if (right) {
    while (e > b && drop(s[e - 1])) --e;
  }
  return s.substr(b, e - b);
}

// ------------------------------------------------------------- expressions

struct Token {
  enum class Kind { kName, kString, kInt, kFloat, kOp, kEnd } kind = Kind::kEnd;
  std::string text;
  int64_t i = 0;
  double f = 0;
};

std::vector<Token> Lex(std::string_view s, int line) {
  std::vector<Token> out;
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (IsSpace(c)) {
      ++i;
      continue;
    }
    Token t;
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t e = i;
      while (e < s.size() && (std::isalnum(static_cast<unsigned char>(s[e])) || s[e] == '_')) ++e;
      t.kind = Token::Kind::kName;
      t.text = std::string(s.substr(i, e - i));
      i = e;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t e = i;
      while (e < s.size() && std::isdigit(static_cast<unsigned char>(s[e]))) ++e;
      bool is_float = false;
      if (e + 1 < s.size() && s[e] == '.' && std::isdigit(static_cast<unsigned char>(s[e + 1]))) {
        is_float = true;
        ++e;
        while (e < s.size() && std::isdigit(static_cast<unsigned char>(s[e]))) ++e;
      }
      const std::string text(s.substr(i, e - i));
      if (is_float) {
        t.kind = Token::Kind::kFloat;
        t.f = std::stod(text);
      } else {
        t.kind = Token::Kind::kInt;
        auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), t.i);
        if (ec != std::errc()) Fail(line, "number '" + text + "' is out of range");
      }
      i = e;
    } else if (c == '\'' || c == '"') {
      std::string v;
      size_t e = i + 1;
      for (; e < s.size() && s[e] != c; ++e) {
        if (s[e] == '\\' && e + 1 < s.size()) {
          const char n = s[++e];
          v += n == 'n' ? '\n' : n == 't' ? '\t' : n == 'r' ? '\r' : n;
        } else {
          v += s[e];
        }
      }
      if (e >= s.size()) Fail(line, "unterminated string literal");
      t.kind = Token::Kind::kString;
      t.text = std::move(v);
      i = e + 1;
    } else {
      static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "(", ")", "[", "]", "{", "}", ",",
                                   ".",  ":",  "|",  "+",  "-",  "*",  "/", "%", "~", "<", ">", "="};
      bool found = false;
      for (const char* op : kOps) {
        if (s.substr(i, std::strlen(op)) == op) {
          t.kind = Token::Kind::kOp;
          t.text = op;
          i += std::strlen(op);
          found = true;
          break;
        }
      }
      if (!found) Fail(line, std::string("unexpected character '") + c + "'");
    }
    out.push_back(std::move(t));
  }
  out.push_back(Token{});
  return out;
}

struct Expr {
  enum class Kind {
    kLiteral,
    kName,
    kList,
    kDict,
    kAttr,
    kItem,
    kSlice,
    kCall,
    kFilter,
    kTest,
    kUnary,
    kBinary,
    kCond
  } kind = Kind::kLiteral;
  Json literal;
  std::string name;                         // kName, kAttr, kFilter, kTest, operator of kUnary / kBinary
  std::vector<std::shared_ptr<Expr>> args;  // operands, list items, call / filter arguments
  std::vector<std::pair<std::string, std::shared_ptr<Expr>>> kwargs;  // call keyword arguments; dict items
  bool negated = false;                                               // `is not`
  int line = 0;
};
using ExprPtr = std::shared_ptr<Expr>;

class ExprParser {
 public:
  ExprParser(std::vector<Token> tokens, int line) : t_(std::move(tokens)), line_(line) {}

  ExprPtr ParseAll() {
    ExprPtr e = Parse();
    if (Peek().kind != Token::Kind::kEnd) Fail(line_, "unexpected '" + Peek().text + "' in expression");
    return e;
  }
  // Nesting is bounded so that a hostile template cannot exhaust the stack.
  ExprPtr Parse() {
    if (++depth_ > kMaxDepth) Fail(line_, "expression nested deeper than " + std::to_string(kMaxDepth));
    ExprPtr e = Conditional();
    --depth_;
    return e;
  }
  static constexpr int kMaxDepth = 128;
  const Token& Peek(size_t k = 0) const { return t_[std::min(pos_ + k, t_.size() - 1)]; }
  bool IsOp(const char* op, size_t k = 0) const { return Peek(k).kind == Token::Kind::kOp && Peek(k).text == op; }
  bool IsName(const char* n, size_t k = 0) const { return Peek(k).kind == Token::Kind::kName && Peek(k).text == n; }
  Token Next() { return t_[std::min(pos_++, t_.size() - 1)]; }
  void Expect(const char* op) {
    if (!IsOp(op)) Fail(line_, std::string("expected '") + op + "', found '" + Peek().text + "'");
    ++pos_;
  }
  std::string ExpectName() {
    if (Peek().kind != Token::Kind::kName) Fail(line_, "expected a name, found '" + Peek().text + "'");
    return Next().text;
  }
  bool AtEnd() const { return Peek().kind == Token::Kind::kEnd; }

 private:
  ExprPtr Make(Expr::Kind k, std::string name = "") {
    auto e = std::make_shared<Expr>();
    e->kind = k;
    e->name = std::move(name);
    e->line = line_;
    return e;
  }
  ExprPtr Binary(const std::string& op, ExprPtr a, ExprPtr b) {
    ExprPtr e = Make(Expr::Kind::kBinary, op);
    e->args = {std::move(a), std::move(b)};
    return e;
  }
  ExprPtr Conditional() {
    ExprPtr a = Or();
    if (IsName("if")) {
      ++pos_;
      ExprPtr cond = Or();
      ExprPtr other;
      if (IsName("else")) {
        ++pos_;
        other = Conditional();
      }
      ExprPtr e = Make(Expr::Kind::kCond);
      e->args = {cond, a, other};
      return e;
    }
    return a;
  }
  ExprPtr Or() {
    ExprPtr a = And();
    while (IsName("or")) {
      ++pos_;
      a = Binary("or", a, And());
    }
    return a;
  }
  ExprPtr And() {
    ExprPtr a = Not();
    while (IsName("and")) {
      ++pos_;
      a = Binary("and", a, Not());
    }
    return a;
  }
  ExprPtr Not() {
    if (IsName("not")) {
      ++pos_;
      ExprPtr e = Make(Expr::Kind::kUnary, "not");
      e->args = {Not()};
      return e;
    }
    return Compare();
  }
  ExprPtr Compare() {
    ExprPtr a = Math1();
    while (true) {
      if (Peek().kind == Token::Kind::kOp &&
          (IsOp("==") || IsOp("!=") || IsOp("<") || IsOp(">") || IsOp("<=") || IsOp(">="))) {
        const std::string op = Next().text;
        a = Binary(op, a, Math1());
      } else if (IsName("in")) {
        ++pos_;
        a = Binary("in", a, Math1());
      } else if (IsName("not") && IsName("in", 1)) {
        pos_ += 2;
        a = Binary("not in", a, Math1());
      } else {
        return a;
      }
    }
  }
  ExprPtr Math1() {
    ExprPtr a = Concat();
    while ((IsOp("+") || IsOp("-"))) {
      const std::string op = Next().text;
      a = Binary(op, a, Concat());
    }
    return a;
  }
  ExprPtr Concat() {
    ExprPtr a = Math2();
    while (IsOp("~")) {
      ++pos_;
      a = Binary("~", a, Math2());
    }
    return a;
  }
  ExprPtr Math2() {
    ExprPtr a = Unary();
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const std::string op = Next().text;
      a = Binary(op, a, Unary());
    }
    return a;
  }
  ExprPtr Unary() {
    if (IsOp("-") || IsOp("+")) {
      ExprPtr e = Make(Expr::Kind::kUnary, Next().text);
      e->args = {Unary()};
      return e;
    }
    return FilterTest(Postfix(Primary()));
  }
  void CallArgs(const ExprPtr& call) {
    Expect("(");
    while (!IsOp(")")) {
      if (Peek().kind == Token::Kind::kName && IsOp("=", 1)) {
        std::string key = Next().text;
        ++pos_;
        call->kwargs.emplace_back(std::move(key), Parse());
      } else {
        call->args.push_back(Parse());
      }
      if (!IsOp(")")) Expect(",");
    }
    Expect(")");
  }
  ExprPtr Postfix(ExprPtr e) {
    while (true) {
      if (IsOp(".")) {
        ++pos_;
        ExprPtr a = Make(Expr::Kind::kAttr, ExpectName());
        a->args = {e};
        e = a;
      } else if (IsOp("[")) {
        ++pos_;
        ExprPtr parts[3];
        bool slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!IsOp(":") && !IsOp("]")) parts[k] = Parse();
          if (k < 2 && IsOp(":")) {
            ++pos_;
            slice = true;
          } else {
            break;
          }
        }
        Expect("]");
        ExprPtr item = Make(slice ? Expr::Kind::kSlice : Expr::Kind::kItem);
        item->args = {e, parts[0], parts[1], parts[2]};
        e = item;
      } else if (IsOp("(")) {
        ExprPtr call = Make(Expr::Kind::kCall);
        call->args = {e};
        CallArgs(call);
        e = call;
      } else {
        return e;
      }
    }
  }
  ExprPtr FilterTest(ExprPtr e) {
    static const std::vector<std::string> kFilters = {"default", "d",     "tojson",  "length",  "count",     "trim",
                                                      "string",  "lower", "upper",   "first",   "last",      "join",
                                                      "items",   "list",  "reverse", "replace", "capitalize"};
    static const std::vector<std::string> kTests = {"defined",  "undefined", "none",    "string",  "number",
                                                    "integer",  "float",     "boolean", "mapping", "iterable",
                                                    "sequence", "true",      "false",   "callable"};
    while (true) {
      if (IsOp("|")) {
        ++pos_;
        ExprPtr f = Make(Expr::Kind::kFilter, ExpectName());
        if (std::find(kFilters.begin(), kFilters.end(), f->name) == kFilters.end()) {
          Fail(line_, "filter '" + f->name + "' is not supported");
        }
        f->args = {e};
        if (IsOp("(")) {
          ExprPtr holder = Make(Expr::Kind::kCall);
          CallArgs(holder);
          for (auto& a : holder->args) f->args.push_back(a);
          f->kwargs = holder->kwargs;
        }
        e = f;
      } else if (IsName("is")) {
        ++pos_;
        ExprPtr t = Make(Expr::Kind::kTest);
        if (IsName("not")) {
          ++pos_;
          t->negated = true;
        }
        t->name = ExpectName();
        if (std::find(kTests.begin(), kTests.end(), t->name) == kTests.end()) {
          Fail(line_, "test '" + t->name + "' is not supported");
        }
        t->args = {e};
        e = t;
      } else {
        return e;
      }
    }
  }
  ExprPtr Primary() {
    const Token tok = Next();
    switch (tok.kind) {
      case Token::Kind::kString: {
        ExprPtr e = Make(Expr::Kind::kLiteral);
        std::string s = tok.text;
        while (Peek().kind == Token::Kind::kString) s += Next().text;  // adjacent literals join
        e->literal = s;
        return e;
      }
      case Token::Kind::kInt: {
        ExprPtr e = Make(Expr::Kind::kLiteral);
        e->literal = tok.i;
        return e;
      }
      case Token::Kind::kFloat: {
        ExprPtr e = Make(Expr::Kind::kLiteral);
        e->literal = tok.f;
        return e;
      }
      case Token::Kind::kName: {
        if (tok.text == "true" || tok.text == "True" || tok.text == "false" || tok.text == "False") {
          ExprPtr e = Make(Expr::Kind::kLiteral);
          e->literal = tok.text == "true" || tok.text == "True";
          return e;
        }
        if (tok.text == "none" || tok.text == "None") return Make(Expr::Kind::kLiteral);
        return Make(Expr::Kind::kName, tok.text);
      }
      case Token::Kind::kOp:
        if (tok.text == "(") {
          ExprPtr e = Parse();
          if (IsOp(",")) {  // a tuple: as a list
            ExprPtr list = Make(Expr::Kind::kList);
            list->args = {e};
            while (IsOp(",")) {
              ++pos_;
              if (IsOp(")")) break;
              list->args.push_back(Parse());
            }
            e = list;
          }
          Expect(")");
          return e;
        }
        if (tok.text == "[") {
          ExprPtr e = Make(Expr::Kind::kList);
          while (!IsOp("]")) {
            e->args.push_back(Parse());
            if (!IsOp("]")) Expect(",");
          }
          Expect("]");
          return e;
        }
        if (tok.text == "{") {
          ExprPtr e = Make(Expr::Kind::kDict);
          while (!IsOp("}")) {
            ExprPtr key = Parse();
            Expect(":");
            e->args.push_back(key);
            e->args.push_back(Parse());
            if (!IsOp("}")) Expect(",");
          }
          Expect("}");
          return e;
        }
        break;
      case Token::Kind::kEnd:
        Fail(line_, "expression ends early");
    }
    Fail(line_, "unexpected '" + tok.text + "' in expression");
  }

  std::vector<Token> t_;
  size_t pos_ = 0;
  int line_;
  int depth_ = 0;
};

// ------------------------------------------------------------------ nodes

}  // namespace

struct ChatTemplate::Node {
  enum class Kind { kBlock, kText, kOutput, kIf, kFor, kSet } kind = Kind::kBlock;
  std::string text;                                                 // kText
  ExprPtr expr;                                                     // kOutput, kFor iterable, kSet value
  std::vector<std::pair<ExprPtr, std::shared_ptr<Node>>> branches;  // kIf: (condition or null for else, body)
  std::vector<std::string> targets;                                 // kFor loop variables; kSet: name [, attr]
  std::shared_ptr<Node> body, otherwise;                            // kFor
  std::vector<std::shared_ptr<Node>> children;                      // kBlock
  int line = 0;
};

namespace {

using Node = ChatTemplate::Node;
using NodePtr = std::shared_ptr<Node>;

// A piece of the template source: text or a tag's inside.
struct Piece {
  enum class Kind { kText, kExpr, kStmt } kind = Piece::Kind::kText;
  std::string text;
  int line = 1;
};

// Splits the source into text and tags, applying whitespace control as
// transformers configures Jinja: '-' strips all whitespace on that side,
// trim_blocks drops the newline after a block or comment tag, lstrip_blocks
// drops spaces and tabs before one on its line.
std::vector<Piece> SplitSource(std::string_view src) {
  std::vector<Piece> pieces;
  int line = 1;
  size_t i = 0;
  bool strip_next = false, trim_next_newline = false;
  while (i <= src.size()) {
    size_t open = src.find('{', i);
    while (open != std::string_view::npos && open + 1 < src.size() && src[open + 1] != '{' && src[open + 1] != '%' &&
           src[open + 1] != '#') {
      open = src.find('{', open + 1);
    }
    if (open + 1 >= src.size()) open = std::string_view::npos;
    std::string text(src.substr(i, open == std::string_view::npos ? std::string_view::npos : open - i));
    if (strip_next) {
      size_t b = 0;
      while (b < text.size() && IsSpace(text[b])) ++b;
      text.erase(0, b);
    } else if (trim_next_newline && !text.empty() && text[0] == '\n') {
      text.erase(0, 1);
    }
    const int text_line = line;
    line += static_cast<int>(
        std::count(src.begin() + static_cast<ptrdiff_t>(i),
                   open == std::string_view::npos ? src.end() : src.begin() + static_cast<ptrdiff_t>(open), '\n'));
    if (open == std::string_view::npos) {
      pieces.push_back({Piece::Kind::kText, text, text_line});
      break;
    }
    const char type = src[open + 1];
    const bool strip_before = open + 2 < src.size() && src[open + 2] == '-';
    if (strip_before) {
      while (!text.empty() && IsSpace(text.back())) text.pop_back();
    } else if (type != '{') {
      // lstrip_blocks: only spaces and tabs between the line's start (in the
      // source, within this text) and the tag.
      const size_t nl = open == 0 ? std::string_view::npos : src.rfind('\n', open - 1);
      const size_t line_start = nl == std::string_view::npos ? 0 : nl + 1;
      if (line_start >= i &&
          std::all_of(src.begin() + static_cast<ptrdiff_t>(line_start), src.begin() + static_cast<ptrdiff_t>(open),
                      [](char c) { return c == ' ' || c == '\t'; })) {
        text.erase(text.size() - std::min(text.size(), open - line_start));
      }
    }
    pieces.push_back({Piece::Kind::kText, text, text_line});
    // The tag's end, outside string literals.
    const std::string close = type == '{' ? "}}" : type == '%' ? "%}" : "#}";
    size_t j = open + 2 + (strip_before ? 1 : 0);
    size_t end = std::string_view::npos;
    char quote = 0;
    for (size_t k = j; k + 1 < src.size(); ++k) {
      const char c = src[k];
      if (type != '#' && quote) {
        if (c == '\\') {
          ++k;
        } else if (c == quote) {
          quote = 0;
        }
        continue;
      }
      if (type != '#' && (c == '\'' || c == '"')) {
        quote = c;
        continue;
      }
      if (src.compare(k, 2, close) == 0) {
        end = k;
        break;
      }
    }
    if (end == std::string_view::npos) Fail(line, std::string("'{") + type + "' is never closed");
    bool strip_after = end > j && src[end - 1] == '-';
    std::string inside(src.substr(j, end - j - (strip_after ? 1 : 0)));
    line += static_cast<int>(std::count(inside.begin(), inside.end(), '\n'));
    if (type != '#') {
      pieces.push_back({type == '{' ? Piece::Kind::kExpr : Piece::Kind::kStmt, inside, line});
    }
    strip_next = strip_after;
    trim_next_newline = type != '{';
    i = end + 2;
  }
  return pieces;
}

class TemplateParser {
 public:
  explicit TemplateParser(std::vector<Piece> pieces) : p_(std::move(pieces)) {}

  NodePtr ParseRoot() {
    std::string stop;
    NodePtr root = ParseBlock({}, &stop);
    if (!stop.empty()) Fail(line_, "'" + stop + "' without its opening statement");
    return root;
  }

 private:
  static std::string FirstWord(const std::string& s) {
    size_t b = 0;
    while (b < s.size() && IsSpace(s[b])) ++b;
    size_t e = b;
    while (e < s.size() && (std::isalnum(static_cast<unsigned char>(s[e])) || s[e] == '_')) ++e;
    return s.substr(b, e - b);
  }

  // Parses nodes until a statement whose first word is in `stops` (left in
  // *stop with its tokens in *rest), or the end.
  NodePtr ParseBlock(const std::vector<std::string>& stops, std::string* stop, std::vector<Token>* rest = nullptr) {
    if (++depth_ > 128) Fail(line_, "statements nested deeper than 128");
    struct Leave {
      int* depth;
      ~Leave() { --*depth; }
    } leave{&depth_};
    auto block = std::make_shared<Node>();
    stop->clear();
    while (i_ < p_.size()) {
      const Piece& piece = p_[i_++];
      line_ = piece.line;
      if (piece.kind == Piece::Kind::kText) {
        if (!piece.text.empty()) {
          auto n = std::make_shared<Node>();
          n->kind = Node::Kind::kText;
          n->text = piece.text;
          block->children.push_back(n);
        }
        continue;
      }
      if (piece.kind == Piece::Kind::kExpr) {
        auto n = std::make_shared<Node>();
        n->kind = Node::Kind::kOutput;
        n->line = line_;
        n->expr = ExprParser(Lex(piece.text, line_), line_).ParseAll();
        block->children.push_back(n);
        continue;
      }
      const std::string word = FirstWord(piece.text);
      if (std::find(stops.begin(), stops.end(), word) != stops.end()) {
        *stop = word;
        if (rest) *rest = Lex(piece.text, line_);
        return block;
      }
      std::vector<Token> tokens = Lex(piece.text, line_);
      if (word == "if") {
        block->children.push_back(ParseIf(std::move(tokens)));
      } else if (word == "for") {
        block->children.push_back(ParseFor(std::move(tokens)));
      } else if (word == "set") {
        block->children.push_back(ParseSet(std::move(tokens)));
      } else if (word == "endif" || word == "endfor" || word == "elif" || word == "else") {
        *stop = word;
        return block;
      } else {
        Fail(line_, "statement '" + word + "' is not supported (supported: if, elif, else, for, set)");
      }
    }
    return block;
  }

  NodePtr ParseIf(std::vector<Token> tokens) {
    auto n = std::make_shared<Node>();
    n->kind = Node::Kind::kIf;
    n->line = line_;
    ExprParser cond(std::move(tokens), line_);
    cond.Next();  // "if"
    ExprPtr c = cond.ParseAll();
    while (true) {
      std::string stop;
      std::vector<Token> rest;
      NodePtr body = ParseBlock({"elif", "else", "endif"}, &stop, &rest);
      n->branches.emplace_back(c, body);
      if (stop == "endif") return n;
      if (stop == "elif") {
        ExprParser next(std::move(rest), line_);
        next.Next();
        c = next.ParseAll();
        continue;
      }
      if (stop == "else") {
        NodePtr other = ParseBlock({"endif"}, &stop);
        n->branches.emplace_back(nullptr, other);
        if (stop != "endif") Fail(n->line, "'if' is never closed with 'endif'");
        return n;
      }
      Fail(n->line, "'if' is never closed with 'endif'");
    }
  }

  NodePtr ParseFor(std::vector<Token> tokens) {
    auto n = std::make_shared<Node>();
    n->kind = Node::Kind::kFor;
    n->line = line_;
    ExprParser p(std::move(tokens), line_);
    p.Next();  // "for"
    n->targets.push_back(p.ExpectName());
    while (p.IsOp(",")) {
      p.Next();
      n->targets.push_back(p.ExpectName());
    }
    if (!p.IsName("in")) Fail(line_, "expected 'in' in a for statement");
    p.Next();
    n->expr = p.Parse();
    if (p.IsName("if") || p.IsName("recursive")) Fail(line_, "for with '" + p.Peek().text + "' is not supported");
    if (!p.AtEnd()) Fail(line_, "unexpected '" + p.Peek().text + "' in a for statement");
    std::string stop;
    n->body = ParseBlock({"else", "endfor"}, &stop);
    if (stop == "else") n->otherwise = ParseBlock({"endfor"}, &stop);
    if (stop != "endfor") Fail(n->line, "'for' is never closed with 'endfor'");
    return n;
  }

  NodePtr ParseSet(std::vector<Token> tokens) {
    auto n = std::make_shared<Node>();
    n->kind = Node::Kind::kSet;
    n->line = line_;
    ExprParser p(std::move(tokens), line_);
    p.Next();  // "set"
    n->targets.push_back(p.ExpectName());
    if (p.IsOp(".")) {
      p.Next();
      n->targets.push_back(p.ExpectName());
    }
    if (!p.IsOp("=")) Fail(line_, "set blocks ({% set x %}...{% endset %}) are not supported");
    p.Next();
    n->expr = p.ParseAll();
    return n;
  }

  std::vector<Piece> p_;
  size_t i_ = 0;
  int line_ = 1;
  int depth_ = 0;
};

// --------------------------------------------------------------- rendering

class Renderer {
 public:
  Renderer(const Json& context, std::string today) : today_(std::move(today)) {
    scopes_.emplace_back();
    for (const auto& [k, v] : context.items()) scopes_.back()[k] = Value::Of(v);
  }

  void Run(const Node& n) {
    switch (n.kind) {
      case Node::Kind::kBlock:
        for (const auto& c : n.children) Run(*c);
        break;
      case Node::Kind::kText:
        out_ += n.text;
        break;
      case Node::Kind::kOutput: {
        Value v = Eval(*n.expr);
        if (v.kind == Value::Kind::kData) out_ += PyStr(v.data);
        if (v.kind == Value::Kind::kNamespace) out_ += "<Namespace>";
        break;
      }
      case Node::Kind::kIf:
        for (const auto& [cond, body] : n.branches) {
          if (!cond || Truthy(Eval(*cond))) {
            Run(*body);
            break;
          }
        }
        break;
      case Node::Kind::kFor:
        RunFor(n);
        break;
      case Node::Kind::kSet: {
        Value v = Eval(*n.expr);
        if (n.targets.size() == 1) {
          scopes_.back()[n.targets[0]] = std::move(v);
        } else {
          Value ns = Lookup(n.targets[0]);
          if (ns.kind != Value::Kind::kNamespace) Fail(n.line, "'" + n.targets[0] + "' is not a namespace");
          if (v.kind != Value::Kind::kData) Fail(n.line, "only data can be stored in a namespace");
          (*ns.ns)[n.targets[1]] = v.data;
        }
        break;
      }
    }
  }

  std::string& out() { return out_; }

 private:
  Value Lookup(const std::string& name) const {
    for (auto s = scopes_.rbegin(); s != scopes_.rend(); ++s) {
      auto it = s->find(name);
      if (it != s->end()) return it->second;
    }
    if (name == "namespace" || name == "range" || name == "raise_exception" || name == "strftime_now") {
      Value v;
      v.kind = Value::Kind::kCallable;
      v.callable = name;
      return v;
    }
    return Value{};
  }

  void RunFor(const Node& n) {
    Value seq = Eval(*n.expr);
    Json items = Json::array();
    if (seq.kind == Value::Kind::kData) {
      if (seq.data.is_array()) {
        items = seq.data;
      } else if (seq.data.is_object()) {
        for (const auto& [k, v] : seq.data.items()) items.push_back(k);
      } else if (seq.data.is_string()) {
        for (char c : seq.data.get<std::string>()) items.push_back(std::string(1, c));
      } else if (!seq.data.is_null()) {
        Fail(n.line, "cannot loop over " + std::string(seq.data.type_name()));
      }
    } else if (seq.kind != Value::Kind::kUndefined) {
      Fail(n.line, "cannot loop over that value");
    }
    const auto len = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < len; ++i) {
      scopes_.emplace_back();
      auto& scope = scopes_.back();
      const Json& item = items[static_cast<size_t>(i)];
      if (n.targets.size() == 1) {
        scope[n.targets[0]] = Value::Of(item);
      } else {
        if (!item.is_array() || item.size() != n.targets.size()) {
          Fail(n.line, "cannot unpack an item into " + std::to_string(n.targets.size()) + " names");
        }
        for (size_t k = 0; k < n.targets.size(); ++k) scope[n.targets[k]] = Value::Of(item[k]);
      }
      Json loop = {{"index", i + 1}, {"index0", i},         {"first", i == 0},         {"last", i == len - 1},
                   {"length", len},  {"revindex", len - i}, {"revindex0", len - 1 - i}};
      scope["loop"] = Value::Of(loop);
      Run(*n.body);
      scopes_.pop_back();
    }
    if (len == 0 && n.otherwise) Run(*n.otherwise);
  }

  static const Json& Data(const Value& v, int line, const char* what) {
    if (v.kind != Value::Kind::kData) Fail(line, std::string(what) + " of an undefined value");
    return v.data;
  }

  static int64_t Index(int64_t i, int64_t size) { return i < 0 ? i + size : i; }

  Value Attr(const Value& base, const std::string& name, int line) {
    if (base.kind == Value::Kind::kNamespace) {
      auto it = base.ns->find(name);
      return it == base.ns->end() ? Value{} : Value::Of(*it);
    }
    if (base.kind != Value::Kind::kData) return Value{};  // Undefined.attr is Undefined
    const Json& d = base.data;
    if (d.is_object()) {
      auto it = d.find(name);
      if (it != d.end()) return Value::Of(*it);
    }
    static const char* kStringMethods[] = {"startswith", "endswith", "strip", "lstrip", "rstrip",    "split",
                                           "replace",    "upper",    "lower", "title",  "capitalize"};
    static const char* kDictMethods[] = {"items", "keys", "values", "get"};
    bool method = false;
    if (d.is_string()) {
      for (const char* m : kStringMethods) method = method || name == m;
    } else if (d.is_object()) {
      for (const char* m : kDictMethods) method = method || name == m;
    }
    if (!method) return Value{};
    Value v;
    v.kind = Value::Kind::kCallable;
    v.callable = "method:" + name;
    v.self = d;
    return v;
  }

  Value Item(const Value& base, const Value& key, int line) {
    if (base.kind == Value::Kind::kNamespace && key.kind == Value::Kind::kData && key.data.is_string()) {
      return Attr(base, key.data.get<std::string>(), line);
    }
    if (base.kind != Value::Kind::kData || key.kind != Value::Kind::kData) return Value{};
    const Json& d = base.data;
    if (key.data.is_string()) return d.is_object() ? Attr(base, key.data.get<std::string>(), line) : Value{};
    if (!key.data.is_number_integer()) Fail(line, "an index must be a whole number");
    const int64_t size = d.is_array()    ? static_cast<int64_t>(d.size())
                         : d.is_string() ? static_cast<int64_t>(d.get_ref<const std::string&>().size())
                                         : -1;
    if (size < 0) return Value{};
    const int64_t i = Index(key.data.get<int64_t>(), size);
    if (i < 0 || i >= size) return Value{};
    if (d.is_array()) return Value::Of(d[static_cast<size_t>(i)]);
    return Value::Of(std::string(1, d.get_ref<const std::string&>()[static_cast<size_t>(i)]));
  }

  Value Slice(const Value& base, const Expr& e) {
    const Json& d = Data(base, e.line, "a slice");
    auto part = [&](int k) -> std::optional<int64_t> {
      if (!e.args[static_cast<size_t>(k)]) return std::nullopt;
      Value v = Eval(*e.args[static_cast<size_t>(k)]);
      if (v.kind != Value::Kind::kData || !v.data.is_number_integer())
        Fail(e.line, "slice bounds must be whole numbers");
      return v.data.get<int64_t>();
    };
    const std::optional<int64_t> lo = part(1), hi = part(2), step_opt = part(3);
    const int64_t step = step_opt.value_or(1);
    if (step == 0) Fail(e.line, "slice step cannot be zero");
    const int64_t size = d.is_array()    ? static_cast<int64_t>(d.size())
                         : d.is_string() ? static_cast<int64_t>(d.get_ref<const std::string&>().size())
                                         : -1;
    if (size < 0) Fail(e.line, "only lists and strings can be sliced");
    auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
      if (!v) return dflt;
      int64_t x = Index(*v, size);
      if (step > 0) return std::clamp<int64_t>(x, 0, size);
      return std::clamp<int64_t>(x, -1, size - 1);
    };
    const int64_t begin = clamp(lo, step > 0 ? 0 : size - 1), end = clamp(hi, step > 0 ? size : -1);
    Json out = d.is_array() ? Json::array() : Json("");
    for (int64_t i = begin; step > 0 ? i < end : i > end; i += step) {
      if (d.is_array()) {
        out.push_back(d[static_cast<size_t>(i)]);
      } else {
        out.get_ref<std::string&>() += d.get_ref<const std::string&>()[static_cast<size_t>(i)];
      }
    }
    return Value::Of(out);
  }

  std::string Str(const Value& v) const { return v.kind == Value::Kind::kData ? PyStr(v.data) : ""; }

  Value CallMethod(const Value& f, const std::vector<Value>& args, int line) {
    const std::string name = f.callable.substr(7);
    const Json& self = f.self;
    auto arg_str = [&](size_t k) -> std::string {
      if (k >= args.size() || args[k].kind != Value::Kind::kData || !args[k].data.is_string()) {
        Fail(line, "." + name + "() needs a string argument");
      }
      return args[k].data.get<std::string>();
    };
    if (self.is_object()) {
      if (name == "items") {
        Json out = Json::array();
        for (const auto& [k, v] : self.items()) out.push_back(Json::array({k, v}));
        return Value::Of(out);
      }
      if (name == "keys" || name == "values") {
        Json out = Json::array();
        for (const auto& [k, v] : self.items()) out.push_back(name == "keys" ? Json(k) : v);
        return Value::Of(out);
      }
      // get
      auto it = self.find(arg_str(0));
      if (it != self.end()) return Value::Of(*it);
      return args.size() > 1 ? args[1] : Value::Of(Json());
    }
    const std::string& s = self.get_ref<const std::string&>();
    if (name == "startswith" || name == "endswith") {
      const std::string a = arg_str(0);
      const bool yes =
          a.size() <= s.size() &&
          (name == "startswith" ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0);
      return Value::Of(yes);
    }
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      std::string chars;
      const bool has = !args.empty() && args[0].kind == Value::Kind::kData && args[0].data.is_string();
      if (has) chars = args[0].data.get<std::string>();
      return Value::Of(Strip(s, has ? &chars : nullptr, name != "rstrip", name != "lstrip"));
    }
    if (name == "split") {
      Json out = Json::array();
      if (args.empty() || (args[0].kind == Value::Kind::kData && args[0].data.is_null())) {
        std::istringstream in(s);
        std::string w;
        while (in >> w) out.push_back(w);
        return Value::Of(out);
      }
      const std::string sep = arg_str(0);
      if (sep.empty()) Fail(line, "split() with an empty separator");
      size_t at = 0;
      for (size_t hit; (hit = s.find(sep, at)) != std::string::npos; at = hit + sep.size()) {
        out.push_back(s.substr(at, hit - at));
      }
      out.push_back(s.substr(at));
      return Value::Of(out);
    }
    if (name == "replace") {
      const std::string a = arg_str(0), b = arg_str(1);
      if (a.empty()) return Value::Of(s);
      std::string out;
      size_t at = 0;
      for (size_t hit; (hit = s.find(a, at)) != std::string::npos; at = hit + a.size()) {
        out += s.substr(at, hit - at) + b;
      }
      return Value::Of(out + s.substr(at));
    }
    std::string out = s;
    if (name == "upper") {
      for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    } else if (name == "lower") {
      for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    } else {  // title, capitalize (ASCII letters)
      bool start = true;
      for (size_t k = 0; k < out.size(); ++k) {
        const auto c = static_cast<unsigned char>(out[k]);
        if (std::isalpha(c)) {
          out[k] = static_cast<char>(start ? std::toupper(c) : std::tolower(c));
          start = false;
          if (name == "capitalize") start = false;
        } else if (name == "title") {
          start = true;
        }
      }
    }
    return Value::Of(out);
  }

  std::string Strftime(const std::string& format) const {
    std::time_t now = std::time(nullptr);
    std::tm tm{};
    gmtime_r(&now, &tm);
    if (!today_.empty()) {  // "YYYY-MM-DD"
      std::istringstream in(today_);
      in >> std::get_time(&tm, "%Y-%m-%d");
    }
    char buf[128];
    const size_t n = std::strftime(buf, sizeof(buf), format.c_str(), &tm);
    return std::string(buf, n);
  }

  Value Call(const Expr& e) {
    Value f = Eval(*e.args[0]);
    std::vector<Value> args;
    for (size_t k = 1; k < e.args.size(); ++k) args.push_back(Eval(*e.args[k]));
    if (f.kind != Value::Kind::kCallable) Fail(e.line, "calling something that is not a function");
    if (f.callable.rfind("method:", 0) == 0) return CallMethod(f, args, e.line);
    if (f.callable == "namespace") {
      Value ns;
      ns.kind = Value::Kind::kNamespace;
      ns.ns = std::make_shared<Json>(Json::object());
      for (const auto& [k, expr] : e.kwargs) (*ns.ns)[k] = Data(Eval(*expr), e.line, "namespace()");
      return ns;
    }
    if (f.callable == "raise_exception")
      throw RenderError{"the template raised: " + (args.empty() ? "" : Str(args[0]))};
    if (f.callable == "strftime_now") return Value::Of(Strftime(args.empty() ? "" : Str(args[0])));
    // range
    int64_t lo = 0, hi = 0, step = 1;
    std::vector<int64_t> n;
    for (const Value& a : args) {
      if (a.kind != Value::Kind::kData || !a.data.is_number_integer()) Fail(e.line, "range() needs whole numbers");
      n.push_back(a.data.get<int64_t>());
    }
    if (n.size() == 1) hi = n[0];
    if (n.size() >= 2) lo = n[0], hi = n[1];
    if (n.size() == 3) step = n[2];
    if (n.empty() || n.size() > 3 || step == 0) Fail(e.line, "range() takes 1 to 3 arguments, step not 0");
    Json out = Json::array();
    for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step) {
      out.push_back(i);
      if (out.size() > 1000000) Fail(e.line, "range() over a million items");
    }
    return Value::Of(out);
  }

  Value Filter(const Expr& e) {
    Value v = Eval(*e.args[0]);
    std::vector<Value> args;
    for (size_t k = 1; k < e.args.size(); ++k) args.push_back(Eval(*e.args[k]));
    const std::string& f = e.name;
    if (f == "default" || f == "d") {
      if (!v.defined()) return args.empty() ? Value::Of("") : args[0];
      return v;
    }
    if (f == "tojson") {
      int indent = -1;
      for (const auto& [k, expr] : e.kwargs) {
        if (k != "indent") Fail(e.line, "tojson(" + k + "=) is not supported");
        Value iv = Eval(*expr);
        if (iv.kind == Value::Kind::kData && iv.data.is_number_integer())
          indent = static_cast<int>(iv.data.get<int64_t>());
      }
      if (!args.empty() && args[0].kind == Value::Kind::kData && args[0].data.is_number_integer()) {
        indent = static_cast<int>(args[0].data.get<int64_t>());
      }
      std::string out;
      PyJson(Data(v, e.line, "tojson"), indent, 0, &out);
      return Value::Of(out);
    }
    if (!v.defined() && (f == "length" || f == "count")) return Value::Of(0);
    const Json& d = Data(v, e.line, ("filter " + f).c_str());
    if (f == "length" || f == "count") {
      return Value::Of(static_cast<int64_t>(d.is_string() ? d.get_ref<const std::string&>().size() : d.size()));
    }
    if (f == "trim") return Value::Of(Strip(PyStr(d), nullptr, true, true));
    if (f == "string") return Value::Of(PyStr(d));
    if (f == "lower" || f == "upper" || f == "capitalize") {
      Value m;
      m.kind = Value::Kind::kCallable;
      m.callable = "method:" + f;
      m.self = PyStr(d);
      return CallMethod(m, {}, e.line);
    }
    if (f == "replace") {
      Value m;
      m.kind = Value::Kind::kCallable;
      m.callable = "method:replace";
      m.self = PyStr(d);
      return CallMethod(m, args, e.line);
    }
    if (f == "first" || f == "last") {
      if (d.empty()) return Value{};
      if (d.is_string()) {
        const std::string& s = d.get_ref<const std::string&>();
        return Value::Of(std::string(1, f == "first" ? s.front() : s.back()));
      }
      if (d.is_array()) return Value::Of(f == "first" ? d.front() : d.back());
      Fail(e.line, "filter " + f + " of a " + d.type_name());
    }
    if (f == "join") {
      const std::string sep = args.empty() ? "" : Str(args[0]);
      std::string out;
      for (size_t k = 0; k < d.size(); ++k) out += (k ? sep : "") + PyStr(d[k]);
      return Value::Of(out);
    }
    if (f == "items") {
      Json out = Json::array();
      for (const auto& [k, val] : d.items()) out.push_back(Json::array({k, val}));
      return Value::Of(out);
    }
    if (f == "list") {
      if (d.is_array()) return v;
      Json out = Json::array();
      if (d.is_string()) {
        for (char c : d.get_ref<const std::string&>()) out.push_back(std::string(1, c));
      } else if (d.is_object()) {
        for (const auto& [k, val] : d.items()) out.push_back(k);
      }
      return Value::Of(out);
    }
    if (f == "reverse") {
      Json out = d;
      if (out.is_string()) {
        std::reverse(out.get_ref<std::string&>().begin(), out.get_ref<std::string&>().end());
      } else if (out.is_array()) {
        std::reverse(out.begin(), out.end());
      }
      return Value::Of(out);
    }
    Fail(e.line, "filter '" + f + "' is not supported");
  }

  bool Test(const Expr& e) {
    Value v = Eval(*e.args[0]);
    const std::string& t = e.name;
    const Json* d = v.kind == Value::Kind::kData ? &v.data : nullptr;
    if (t == "defined") return v.defined();
    if (t == "undefined") return !v.defined();
    if (t == "none") return d && d->is_null();
    if (t == "string") return d && d->is_string();
    if (t == "number") return d && d->is_number();
    if (t == "integer") return d && d->is_number_integer();
    if (t == "float") return d && d->is_number_float();
    if (t == "boolean") return d && d->is_boolean();
    if (t == "mapping") return (d && d->is_object()) || v.kind == Value::Kind::kNamespace;
    if (t == "iterable") return d && (d->is_array() || d->is_object() || d->is_string());
    if (t == "sequence") return d && (d->is_array() || d->is_string() || d->is_object());
    if (t == "true") return d && d->is_boolean() && d->get<bool>();
    if (t == "false") return d && d->is_boolean() && !d->get<bool>();
    if (t == "callable") return v.kind == Value::Kind::kCallable;
    Fail(e.line, "test '" + t + "' is not supported");
  }

  static bool Equal(const Value& a, const Value& b) {
    if (a.kind != Value::Kind::kData || b.kind != Value::Kind::kData) return a.kind == b.kind && !a.defined();
    if (a.data.is_number() && b.data.is_number()) return a.data.get<double>() == b.data.get<double>();
    return a.data == b.data;
  }

  Value BinaryOp(const Expr& e) {
    const std::string& op = e.name;
    if (op == "and") {
      Value a = Eval(*e.args[0]);
      return Truthy(a) ? Eval(*e.args[1]) : a;
    }
    if (op == "or") {
      Value a = Eval(*e.args[0]);
      return Truthy(a) ? a : Eval(*e.args[1]);
    }
    Value a = Eval(*e.args[0]), b = Eval(*e.args[1]);
    if (op == "==") return Value::Of(Equal(a, b));
    if (op == "!=") return Value::Of(!Equal(a, b));
    if (op == "~") return Value::Of(Str(a) + Str(b));
    if (op == "in" || op == "not in") {
      bool found = false;
      if (b.kind == Value::Kind::kData) {
        const Json& c = b.data;
        if (c.is_string()) {
          found = a.kind == Value::Kind::kData && a.data.is_string() &&
                  c.get_ref<const std::string&>().find(a.data.get<std::string>()) != std::string::npos;
        } else if (c.is_array()) {
          for (const Json& x : c) found = found || (a.kind == Value::Kind::kData && Equal(a, Value::Of(x)));
        } else if (c.is_object()) {
          found = a.kind == Value::Kind::kData && a.data.is_string() && c.contains(a.data.get<std::string>());
        }
      } else if (b.kind == Value::Kind::kNamespace) {
        found = a.kind == Value::Kind::kData && a.data.is_string() && b.ns->contains(a.data.get<std::string>());
      }
      return Value::Of(op == "in" ? found : !found);
    }
    const Json& x = Data(a, e.line, ("'" + op + "'").c_str());
    const Json& y = Data(b, e.line, ("'" + op + "'").c_str());
    if (op == "+" && x.is_string() && y.is_string()) return Value::Of(x.get<std::string>() + y.get<std::string>());
    if (op == "+" && x.is_array() && y.is_array()) {
      Json out = x;
      for (const Json& item : y) out.push_back(item);
      return Value::Of(out);
    }
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      int c = 0;
      if (x.is_number() && y.is_number()) {
        c = x.get<double>() < y.get<double>() ? -1 : x.get<double>() > y.get<double>() ? 1 : 0;
      } else if (x.is_string() && y.is_string()) {
        c = x.get<std::string>().compare(y.get<std::string>());
      } else {
        Fail(e.line, "cannot compare " + std::string(x.type_name()) + " and " + y.type_name());
      }
      return Value::Of(op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0);
    }
    if (!x.is_number() || !y.is_number()) {
      Fail(e.line, "'" + op + "' of " + std::string(x.type_name()) + " and " + y.type_name());
    }
    const bool ints = x.is_number_integer() && y.is_number_integer();
    if (ints && op != "/") {
      const int64_t p = x.get<int64_t>(), q = y.get<int64_t>();
      if ((op == "//" || op == "%") && q == 0) Fail(e.line, "division by zero");
      if (op == "+") return Value::Of(p + q);
      if (op == "-") return Value::Of(p - q);
      if (op == "*") return Value::Of(p * q);
      const int64_t fl = p / q - ((p % q != 0) && ((p < 0) != (q < 0)) ? 1 : 0);  // Python floors
      if (op == "//") return Value::Of(fl);
      return Value::Of(p - fl * q);
    }
    const double p = x.get<double>(), q = y.get<double>();
    if (op == "+") return Value::Of(p + q);
    if (op == "-") return Value::Of(p - q);
    if (op == "*") return Value::Of(p * q);
    if (q == 0) Fail(e.line, "division by zero");
    if (op == "/") return Value::Of(p / q);
    if (op == "//") return Value::Of(std::floor(p / q));
    return Value::Of(p - std::floor(p / q) * q);
  }

  Value Eval(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return Value::Of(e.literal);
      case Expr::Kind::kName:
        return Lookup(e.name);
      case Expr::Kind::kList: {
        Json out = Json::array();
        for (const auto& a : e.args) out.push_back(Data(Eval(*a), e.line, "a list"));
        return Value::Of(out);
      }
      case Expr::Kind::kDict: {
        Json out = Json::object();
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
          out[Str(Eval(*e.args[k]))] = Data(Eval(*e.args[k + 1]), e.line, "a dict");
        }
        return Value::Of(out);
      }
      case Expr::Kind::kAttr:
        return Attr(Eval(*e.args[0]), e.name, e.line);
      case Expr::Kind::kItem:
        return Item(Eval(*e.args[0]), Eval(*e.args[1]), e.line);
      case Expr::Kind::kSlice:
        return Slice(Eval(*e.args[0]), e);
      case Expr::Kind::kCall:
        return Call(e);
      case Expr::Kind::kFilter:
        return Filter(e);
      case Expr::Kind::kTest:
        return Value::Of(Test(e) != e.negated);
      case Expr::Kind::kUnary: {
        Value v = Eval(*e.args[0]);
        if (e.name == "not") return Value::Of(!Truthy(v));
        const Json& d = Data(v, e.line, "a sign");
        if (!d.is_number()) Fail(e.line, "a sign before a " + std::string(d.type_name()));
        if (e.name == "+") return v;
        return d.is_number_integer() ? Value::Of(-d.get<int64_t>()) : Value::Of(-d.get<double>());
      }
      case Expr::Kind::kBinary:
        return BinaryOp(e);
      case Expr::Kind::kCond:
        if (Truthy(Eval(*e.args[0]))) return Eval(*e.args[1]);
        return e.args[2] ? Eval(*e.args[2]) : Value{};
    }
    return Value{};
  }

  std::vector<std::map<std::string, Value>> scopes_;
  std::string out_;
  std::string today_;
};

// A special token of tokenizer_config.json: a string or {"content": ...}.
std::string TokenText(const Json& config, const char* key) {
  if (!config.contains(key)) return "";
  const Json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return "";
}

}  // namespace

Result<ChatTemplate> ChatTemplate::Parse(std::string_view source) {
  try {
    ChatTemplate t;
    t.root_ = TemplateParser(SplitSource(source)).ParseRoot();
    return t;
  } catch (const RenderError& e) {
    return Status::InvalidArgument(e.message);
  }
}

Result<ChatTemplate> ChatTemplate::Load(const std::string& model_dir) {
  const std::filesystem::path path = std::filesystem::path(model_dir) / "tokenizer_config.json";
  std::ifstream in(path);
  if (!in) return Status::NotFound(path.string() + ": cannot open");
  std::stringstream text;
  text << in.rdbuf();
  Json config = Json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object())
    return Status::InvalidArgument(path.string() + ": not a JSON object");
  if (!config.contains("chat_template")) return Status::NotFound(path.string() + ": no chat_template");
  const Json& ct = config["chat_template"];
  std::string source;
  if (ct.is_string()) {
    source = ct.get<std::string>();
  } else if (ct.is_array()) {
    for (const Json& entry : ct) {
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
          entry["template"].is_string()) {
        source = entry["template"].get<std::string>();
      }
    }
    if (source.empty()) return Status::NotFound(path.string() + ": chat_template has no \"default\" entry");
  } else {
    return Status::InvalidArgument(path.string() + ": chat_template is neither a string nor a list");
  }
  Result<ChatTemplate> t = Parse(source);
  if (!t.ok()) return Status::InvalidArgument(path.string() + ": " + t.status().message());
  t->bos_token_ = TokenText(config, "bos_token");
  t->eos_token_ = TokenText(config, "eos_token");
  return t;
}

Result<std::string> PromptFormat::Apply(const std::string& prompt) const {
  if (!chat) return prompt;
  Json context = variables.is_object() ? Json(variables) : Json::object();
  Json messages = Json::array();
  if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
  messages.push_back({{"role", "user"}, {"content", prompt}});
  context["messages"] = std::move(messages);
  context["add_generation_prompt"] = true;
  return chat->Render(context);
}

Result<std::string> ChatTemplate::Render(const nlohmann::ordered_json& context, const std::string& today) const {
  if (!context.is_object()) return Status::InvalidArgument("chat template context must be a JSON object");
  Json ctx = context;
  if (!ctx.contains("bos_token")) ctx["bos_token"] = bos_token_;
  if (!ctx.contains("eos_token")) ctx["eos_token"] = eos_token_;
  try {
    Renderer r(ctx, today);
    if (root_) r.Run(*root_);
    return std::move(r.out());
  } catch (const RenderError& e) {
    return Status::InvalidArgument(e.message);
  } catch (const nlohmann::json::exception& e) {
    return Status::InvalidArgument(std::string("chat template: ") + e.what());
  }
}

}  // namespace sluice::model
