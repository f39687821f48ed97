// The "sort" generator: sort a list of decimal digits (format in task.h).

#include <algorithm>
#include <string>

#include "generated_task.h"

namespace sluice::reward::internal {
namespace {

class SortGenerator final : public ProblemGenerator {
 public:
  explicit SortGenerator(const SortOptions& options) : options_(options) {}

  std::string name() const override { return "sort"; }

  int DrawShape(Rng& rng) const override {
    return static_cast<int>(rng.Uniform(options_.min_length, options_.max_length));
  }

  Example Generate(int length, Rng& rng) const override {
    std::string digits;
    for (int i = 0; i < length; ++i) digits += static_cast<char>('0' + rng.Uniform(0, 9));
    Example example;
    example.prompt = "sort:" + digits + "=";
    std::sort(digits.begin(), digits.end());
    example.answer = digits;
    example.solution = digits + kAnswerMarker + digits;
    return example;
  }

 private:
  const SortOptions options_;
};

}  // namespace

Result<std::unique_ptr<ProblemGenerator>> MakeSortGenerator(const SortOptions& options) {
  if (options.min_length < 1 || options.min_length > 64) {
    return Status::InvalidArgument("task option 'sort.min_length' must be in [1, 64], got " +
                                   std::to_string(options.min_length));
  }
  if (options.max_length < options.min_length || options.max_length > 64) {
    return Status::InvalidArgument(
        "task option 'sort.max_length' must be in [sort.min_length = " + std::to_string(options.min_length) +
        ", 64], got " + std::to_string(options.max_length));
  }
  return std::unique_ptr<ProblemGenerator>(new SortGenerator(options));
}

}  // namespace sluice::reward::internal
