#include "generated_task.h"

#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "sluice/common/check.h"

namespace sluice::reward::internal {
namespace {

// Stream ids keep the train and eval draws of one seed independent.
constexpr uint64_t kTrainStream = 1;
constexpr uint64_t kEvalStream = 2;

// A train candidate whose prompt is held out is redrawn with the same shape
// this many times (so held-out prompts do not skew the shape distribution),
// then with fresh shapes, and finally given up on.
constexpr uint64_t kSameShapeAttempts = 64;
constexpr uint64_t kMaxAttempts = 4096;

class GeneratedTask final : public Task {
 public:
  GeneratedTask(std::unique_ptr<ProblemGenerator> generator, uint64_t seed, uint64_t train_size, uint64_t eval_size)
      : generator_(std::move(generator)), seed_(seed), train_size_(train_size) {
    eval_.reserve(eval_size);
    for (uint64_t i = 0; i < eval_size; ++i) {
      Rng rng(seed_, kEvalStream, i, 0);
      const int shape = generator_->DrawShape(rng);
      Example example = generator_->Generate(shape, rng);
      example.index = i;
      example.difficulty = shape;
      eval_prompts_.insert(example.prompt);
      eval_.push_back(std::move(example));
    }
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

    Rng first(seed_, kTrainStream, index, 0);
    int shape = generator_->DrawShape(first);
    Example example = generator_->Generate(shape, first);
    for (uint64_t attempt = 1; eval_prompts_.count(example.prompt) != 0; ++attempt) {
      if (attempt == kMaxAttempts) {
        return Status::FailedPrecondition(name() + " task: train example " + std::to_string(index) + ": " +
                                          std::to_string(kMaxAttempts) +
                                          " candidates all collide with the held-out eval split; lower eval_size "
                                          "or widen the problem space");
      }
      Rng rng(seed_, kTrainStream, index, attempt);
      if (attempt >= kSameShapeAttempts) shape = generator_->DrawShape(rng);
      example = generator_->Generate(shape, rng);
    }
    example.index = index;
    example.difficulty = shape;
    return example;
  }

  double Score(const Example& example, std::string_view response) const override {
    if (response.find(kAnswerMarker) == std::string_view::npos) return 0.0;
    return ExtractFinalAnswer(response) == example.answer ? 1.0 : 0.0;
  }

 private:
  const std::unique_ptr<ProblemGenerator> generator_;
  const uint64_t seed_;
  const uint64_t train_size_;
  std::vector<Example> eval_;
  std::unordered_set<std::string> eval_prompts_;
};

}  // namespace

std::unique_ptr<Task> MakeGeneratedTask(std::unique_ptr<ProblemGenerator> generator, uint64_t seed, uint64_t train_size,
                                        uint64_t eval_size) {
  SLUICE_CHECK(generator != nullptr);
  SLUICE_CHECK(train_size >= 1);
  return std::make_unique<GeneratedTask>(std::move(generator), seed, train_size, eval_size);
}

}  // namespace sluice::reward::internal
