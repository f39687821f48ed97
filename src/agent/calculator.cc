// The built-in calculator tool (calculator.h): a recursive-descent reader
// of integer arithmetic, each operation checked for overflow.
#include "sluice/agent/calculator.h"

#include <cctype>
#include <string>

namespace sluice::agent {
namespace {

class Reader {
 public:
  explicit Reader(std::string_view s) : s_(s) {}

  Result<int64_t> Whole() {
    SLUICE_ASSIGN_OR_RETURN(const int64_t v, Sum(0));
    SkipSpaces();
    if (at_ != s_.size()) return Unexpected("an operator or the end");
    return v;
  }

 private:
  Result<int64_t> Sum(int depth) {
    SLUICE_ASSIGN_OR_RETURN(int64_t v, Product(depth));
    while (true) {
      SkipSpaces();
      if (at_ == s_.size() || (s_[at_] != '+' && s_[at_] != '-')) return v;
      const char op = s_[at_++];
      SLUICE_ASSIGN_OR_RETURN(const int64_t rhs, Product(depth));
      if (op == '+' ? __builtin_add_overflow(v, rhs, &v) : __builtin_sub_overflow(v, rhs, &v)) return Overflow();
    }
  }

  Result<int64_t> Product(int depth) {
    SLUICE_ASSIGN_OR_RETURN(int64_t v, Factor(depth));
    while (true) {
      SkipSpaces();
      if (at_ == s_.size() || (s_[at_] != '*' && s_[at_] != '/')) return v;
      const char op = s_[at_++];
      SLUICE_ASSIGN_OR_RETURN(const int64_t rhs, Factor(depth));
      if (op == '*') {
        if (__builtin_mul_overflow(v, rhs, &v)) return Overflow();
        continue;
      }
      if (rhs == 0) return Status::OutOfRange("division by zero");
      if (v == INT64_MIN && rhs == -1) return Overflow();
      if (v % rhs != 0) {
        return Status::OutOfRange(std::to_string(v) + " / " + std::to_string(rhs) + " is not a whole number");
      }
      v /= rhs;
    }
  }

  Result<int64_t> Factor(int depth) {
    if (depth >= kMaxExpressionDepth) {
      return Status::OutOfRange("the expression nests deeper than " + std::to_string(kMaxExpressionDepth));
    }
    SkipSpaces();
    if (at_ == s_.size()) return Unexpected("a number");
    const char c = s_[at_];
    if (c == '-' || c == '+') {
      ++at_;
      SLUICE_ASSIGN_OR_RETURN(const int64_t v, Factor(depth + 1));
      if (c == '+') return v;
      if (v == INT64_MIN) return Overflow();
      return -v;
    }
    if (c == '(') {
      ++at_;
      SLUICE_ASSIGN_OR_RETURN(const int64_t v, Sum(depth + 1));
      SkipSpaces();
      if (at_ == s_.size() || s_[at_] != ')') return Unexpected("')'");
      ++at_;
      return v;
    }
    if (!std::isdigit(static_cast<unsigned char>(c))) return Unexpected("a number");
    int64_t v = 0;
    while (at_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[at_]))) {
      if (__builtin_mul_overflow(v, int64_t{10}, &v) || __builtin_add_overflow(v, int64_t{s_[at_] - '0'}, &v)) {
        return Overflow();
      }
      ++at_;
    }
    return v;
  }

  void SkipSpaces() {
    while (at_ < s_.size() && (s_[at_] == ' ' || s_[at_] == '\t')) ++at_;
  }
  Status Unexpected(const char* wanted) const {
    const std::string found = at_ < s_.size() ? "'" + std::string(1, s_[at_]) + "'" : "the end";
    return Status::InvalidArgument("expected " + std::string(wanted) + " at character " + std::to_string(at_ + 1) +
                                   ", found " + found);
  }
  static Status Overflow() { return Status::OutOfRange("the value does not fit a 64-bit integer"); }

  std::string_view s_;
  size_t at_ = 0;
};

}  // namespace

Result<int64_t> EvaluateArithmetic(std::string_view expression) {
  if (expression.size() > kMaxExpressionBytes) {
    return Status::OutOfRange("the expression is " + std::to_string(expression.size()) + " bytes, over " +
                              std::to_string(kMaxExpressionBytes));
  }
  return Reader(expression).Whole();
}

}  // namespace sluice::agent
