// The "arithmetic" generator: chains of single-step additions and
// subtractions with a written scratchpad (format documented in task.h).

#include <cmath>
#include <string>
#include <vector>

#include "generated_task.h"

namespace sluice::reward::internal {
namespace {

class ArithmeticGenerator final : public ProblemGenerator {
 public:
  explicit ArithmeticGenerator(const ArithmeticOptions& options) : options_(options) {
    // Cumulative P(k ops) ∝ k^-exponent: a heavy (power-law) tail, so a few
    // problems are many times longer than the typical one.
    double total = 0;
    for (int k = 1; k <= options_.max_ops; ++k) total += std::pow(static_cast<double>(k), -options_.ops_exponent);
    double running = 0;
    for (int k = 1; k <= options_.max_ops; ++k) {
      running += std::pow(static_cast<double>(k), -options_.ops_exponent) / total;
      ops_cdf_.push_back(running);
    }
    ops_cdf_.back() = 1.0;
  }

  std::string name() const override { return "arithmetic"; }

  int DrawShape(Rng& rng) const override {
    const double u = rng.UniformDouble();
    int k = 0;
    while (k + 1 < static_cast<int>(ops_cdf_.size()) && ops_cdf_[k] <= u) ++k;
    return k + 1;
  }

  Example Generate(int ops, Rng& rng) const override {
    Example example;
    int64_t value = rng.Uniform(1, options_.max_operand);
    example.prompt = std::to_string(value);
    std::vector<std::string> terms;  // "+3", "-5", ... in order
    std::vector<int64_t> values;     // running total after each operation
    for (int step = 0; step < ops; ++step) {
      const int64_t operand = rng.Uniform(1, options_.max_operand);
      bool plus = rng.Coin();
      // Validation guarantees one of the two directions stays in range.
      if (!plus && value - operand < 0) plus = true;
      if (plus && value + operand > options_.max_total) plus = false;
      const int64_t next = plus ? value + operand : value - operand;
      const char op = plus ? '+' : '-';
      terms.push_back(op + std::to_string(operand));
      example.prompt += terms.back();
      if (options_.scratchpad == "steps") {
        if (step > 0) example.solution += ',';
        example.solution += std::to_string(value) + terms.back() + '=' + std::to_string(next);
      }
      values.push_back(next);
      value = next;
    }
    if (options_.scratchpad == "reduce") {
      for (int step = 0; step < ops; ++step) {
        if (step > 0) example.solution += '=';
        example.solution += std::to_string(values[step]);
        for (int rest = step + 1; rest < ops; ++rest) example.solution += terms[rest];
      }
    }
    example.prompt += '=';
    example.answer = std::to_string(value);
    example.solution += kAnswerMarker + example.answer;
    return example;
  }

 private:
  const ArithmeticOptions options_;
  std::vector<double> ops_cdf_;  // ops_cdf_[k - 1] = P(ops <= k)
};

Status CheckRange(const char* key, int64_t value, int64_t min, int64_t max) {
  if (value < min || value > max) {
    return Status::InvalidArgument(std::string("task option '") + key + "' must be in [" + std::to_string(min) + ", " +
                                   std::to_string(max) + "], got " + std::to_string(value));
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<ProblemGenerator>> MakeArithmeticGenerator(const ArithmeticOptions& options) {
  SLUICE_RETURN_IF_ERROR(CheckRange("arithmetic.max_ops", options.max_ops, 1, 64));
  SLUICE_RETURN_IF_ERROR(CheckRange("arithmetic.max_operand", options.max_operand, 1, 999));
  SLUICE_RETURN_IF_ERROR(
      CheckRange("arithmetic.max_total", options.max_total, 2 * int64_t{options.max_operand} - 1, 1000000));
  if (options.scratchpad != "steps" && options.scratchpad != "reduce") {
    return Status::InvalidArgument("task option 'arithmetic.scratchpad' must be steps or reduce, got '" +
                                   options.scratchpad + "'");
  }
  if (!(options.ops_exponent >= 0 && options.ops_exponent <= 10)) {
    return Status::InvalidArgument("task option 'arithmetic.ops_exponent' must be in [0, 10], got " +
                                   std::to_string(options.ops_exponent));
  }
  return std::unique_ptr<ProblemGenerator>(new ArithmeticGenerator(options));
}

}  // namespace sluice::reward::internal
