// The built-in calculator tool: exact integer arithmetic on what a model
// writes (+ - * /, parentheses, unary signs, decimal integers), bounded in
// length and nesting, every overflow and inexact division refused.
//
// Thread safety: pure functions.
#ifndef SLUICE_AGENT_CALCULATOR_H_
#define SLUICE_AGENT_CALCULATOR_H_

#include <cstdint>
#include <string_view>

#include "sluice/common/status.h"

namespace sluice::agent {

inline constexpr size_t kMaxExpressionBytes = 256;
inline constexpr int kMaxExpressionDepth = 32;

// The value of `expression`. InvalidArgument saying where for a malformed
// one; OutOfRange for a value past 64-bit integers, a division by zero or
// one that leaves a remainder, an expression over kMaxExpressionBytes or
// nested deeper than kMaxExpressionDepth.
Result<int64_t> EvaluateArithmetic(std::string_view expression);

}  // namespace sluice::agent

#endif  // SLUICE_AGENT_CALCULATOR_H_
