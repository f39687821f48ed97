// A parsed chat template: expressions, assignment targets and statements,
// and the names of the filters, tests, methods and functions it may call.
#ifndef SLUICE_MODEL_CHAT_TEMPLATE_AST_H_
#define SLUICE_MODEL_CHAT_TEMPLATE_AST_H_

#include <cstdint>
#include <ctime>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "chat_template/values.h"

namespace sluice::model::jinja {

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

bool OneOf(std::string_view s, std::initializer_list<std::string_view> list);

bool IsSupportedFilter(std::string_view name);

bool IsSupportedTest(std::string_view name);

bool IsSupportedStrMethod(std::string_view name);

bool IsSupportedDictMethod(std::string_view name);

// The methods of Python's str, dict and list: a template reaching one this
// class does not implement is refused rather than given an undefined value.
bool IsPyStrMethod(std::string_view name);
bool IsPyDictMethod(std::string_view name);
bool IsPyListMethod(std::string_view name);

bool IsGlobalFunction(std::string_view name);

}  // namespace sluice::model::jinja

#endif  // SLUICE_MODEL_CHAT_TEMPLATE_AST_H_
