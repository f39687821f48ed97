#include "sluice/reward/task.h"

#include <utility>

#include "generated_task.h"
#include "jsonl_task.h"

namespace sluice::reward {
namespace {

// Bounds the eagerly built eval split (about 100 bytes an example).
constexpr uint64_t kMaxEvalSize = 1000000;

Status CheckSizes(const TaskOptions& options) {
  if (options.train_size < 1) return Status::InvalidArgument("task option 'train_size' must be >= 1, got 0");
  if (options.eval_size > kMaxEvalSize) {
    return Status::InvalidArgument("task option 'eval_size' must be <= " + std::to_string(kMaxEvalSize) + ", got " +
                                   std::to_string(options.eval_size));
  }
  if (!(options.eval_fraction > 0 && options.eval_fraction <= 0.5)) {
    return Status::InvalidArgument("task option 'eval_fraction' must be in (0, 0.5], got " +
                                   std::to_string(options.eval_fraction));
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<Task>> MakeTask(const TaskOptions& options) {
  if (options.name == "arithmetic" || options.name == "sort") {
    SLUICE_RETURN_IF_ERROR(CheckSizes(options));
    std::unique_ptr<internal::ProblemGenerator> generator;
    if (options.name == "arithmetic") {
      SLUICE_ASSIGN_OR_RETURN(generator, internal::MakeArithmeticGenerator(options.arithmetic));
    } else {
      SLUICE_ASSIGN_OR_RETURN(generator, internal::MakeSortGenerator(options.sort));
    }
    return internal::MakeGeneratedTask(std::move(generator), options.seed, options.train_size, options.eval_size,
                                       options.eval_fraction);
  }
  if (options.name == "jsonl") return internal::MakeJsonlTask(options.jsonl);
  if (options.name == "math") {
    JsonlOptions math = options.jsonl;
    math.math = true;
    return internal::MakeJsonlTask(math);
  }
  return Status::InvalidArgument("task option 'name': unknown task '" + options.name +
                                 "' (allowed: arithmetic, sort, jsonl, math)");
}

}  // namespace sluice::reward
