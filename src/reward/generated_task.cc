#include "generated_task.h"

#include <string>
#include <utility>
#include <vector>

#include "sluice/common/check.h"
#include "sluice/common/random.h"

namespace sluice::reward::internal {
namespace {

// Stream ids keep the train and eval draws of one seed independent.
constexpr uint64_t kTrainStream = 1;
constexpr uint64_t kEvalStream = 2;

// A candidate on the wrong side of the split is redrawn with the same shape
// this many times (so the split does not skew the shape distribution), then
// with fresh shapes, and finally given up on.
constexpr uint64_t kSameShapeAttempts = 64;
constexpr uint64_t kMaxAttempts = 4096;

class GeneratedTask final : public Task {
 public:
  GeneratedTask(std::unique_ptr<ProblemGenerator> generator, uint64_t seed, uint64_t train_size, double eval_fraction)
      : generator_(std::move(generator)), seed_(seed), train_size_(train_size), eval_fraction_(eval_fraction) {}

  // Builds the eval split. FailedPrecondition if the held-out part of the
  // problem space is empty.
  Status BuildEval(uint64_t eval_size) {
    eval_.reserve(eval_size);
    for (uint64_t i = 0; i < eval_size; ++i) {
      SLUICE_ASSIGN_OR_RETURN(Example example, Draw(Split::kEval, i));
      eval_.push_back(std::move(example));
    }
    return Status::Ok();
  }

  std::string name() const override { return generator_->name(); }

  uint64_t size(Split split) const override { return split == Split::kTrain ? train_size_ : eval_.size(); }

  bool has_solutions() const override { return true; }

  Result<Example> Get(Split split, uint64_t index) const override {
    if (index >= size(split)) {
      return Status::OutOfRange(name() + " task: " + std::string(SplitName(split)) + " index " + std::to_string(index) +
                                " is past the split's " + std::to_string(size(split)) + " examples");
    }
    if (split == Split::kEval) return eval_[index];
    return Draw(Split::kTrain, index);
  }

  double Score(const Example& example, std::string_view response) const override {
    if (response.find(kAnswerMarker) == std::string_view::npos) return 0.0;
    return ExtractFinalAnswer(response) == example.answer ? 1.0 : 0.0;
  }

 private:
  // Whether a prompt belongs to the held-out part of the problem space.
  bool HeldOut(const std::string& prompt) const {
    return UnitInterval(Mix64(Fnv1a(prompt) ^ Mix64(seed_ ^ 0x5e1dull))) < eval_fraction_;
  }

  // Example `index` of `split`: drawn i.i.d. (shape first), redrawn until its
  // prompt lies on the split's side of the hash split.
  Result<Example> Draw(Split split, uint64_t index) const {
    const bool want_held_out = split == Split::kEval;
    const uint64_t stream = want_held_out ? kEvalStream : kTrainStream;
    Rng first(seed_, stream, index, 0);
    int shape = generator_->DrawShape(first);
    Example example = generator_->Generate(shape, first);
    for (uint64_t attempt = 1; HeldOut(example.prompt) != want_held_out; ++attempt) {
      if (attempt == kMaxAttempts) {
        return Status::FailedPrecondition(
            name() + " task: " + std::string(SplitName(split)) + " example " + std::to_string(index) + ": " +
            std::to_string(kMaxAttempts) + " candidates all fall in the " + (want_held_out ? "train" : "held-out") +
            " part of the problem space; change eval_fraction or widen the problem space");
      }
      Rng rng(seed_, stream, index, attempt);
      if (attempt >= kSameShapeAttempts) shape = generator_->DrawShape(rng);
      example = generator_->Generate(shape, rng);
    }
    example.index = index;
    example.split = split;
    example.difficulty = shape;
    return example;
  }

  const std::unique_ptr<ProblemGenerator> generator_;
  const uint64_t seed_;
  const uint64_t train_size_;
  const double eval_fraction_;
  std::vector<Example> eval_;
};

}  // namespace

Result<std::unique_ptr<Task>> MakeGeneratedTask(std::unique_ptr<ProblemGenerator> generator, uint64_t seed,
                                                uint64_t train_size, uint64_t eval_size, double eval_fraction) {
  SLUICE_CHECK(generator != nullptr);
  SLUICE_CHECK(train_size >= 1);
  auto task = std::make_unique<GeneratedTask>(std::move(generator), seed, train_size, eval_fraction);
  SLUICE_RETURN_IF_ERROR(task->BuildEval(eval_size));
  return std::unique_ptr<Task>(std::move(task));
}

}  // namespace sluice::reward::internal
