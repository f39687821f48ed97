// Tasks whose examples are generated on demand from a seed (arithmetic,
// sort). A ProblemGenerator knows one kind of problem; GeneratedTask adds the
// splits, the held-out eval set and scoring.
#ifndef SLUICE_REWARD_GENERATED_TASK_H_
#define SLUICE_REWARD_GENERATED_TASK_H_

#include <memory>
#include <string>

#include "rng.h"
#include "sluice/reward/task.h"

namespace sluice::reward::internal {

// Thread safety: implementations are immutable; methods are const.
class ProblemGenerator {
 public:
  virtual ~ProblemGenerator() = default;
  virtual std::string name() const = 0;
  // Draws the parameter that decides a problem's size (number of
  // operations, list length). Redraws across the train/eval split keep it.
  virtual int DrawShape(Rng& rng) const = 0;
  // Draws a problem of that shape; fills prompt, answer and solution.
  virtual Example Generate(int shape, Rng& rng) const = 0;
};

// Builds the eval split eagerly (eval_size examples) so that train draws can
// be checked against it. Preconditions: generator non-null, train_size >= 1.
// Errors: FailedPrecondition if the held-out part of the problem space
// (eval_fraction of the prompts, chosen by a hash of the prompt) is empty.
Result<std::unique_ptr<Task>> MakeGeneratedTask(std::unique_ptr<ProblemGenerator> generator, uint64_t seed,
                                                uint64_t train_size, uint64_t eval_size, double eval_fraction);

Result<std::unique_ptr<ProblemGenerator>> MakeArithmeticGenerator(const ArithmeticOptions& options);
Result<std::unique_ptr<ProblemGenerator>> MakeSortGenerator(const SortOptions& options);

}  // namespace sluice::reward::internal

#endif  // SLUICE_REWARD_GENERATED_TASK_H_
