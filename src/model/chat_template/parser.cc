#include "chat_template/parser.h"

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

}  // namespace

Result<Body> ParseTemplate(std::vector<Token> tokens) { return Parser(std::move(tokens)).ParseTemplate(); }

}  // namespace sluice::model::jinja
