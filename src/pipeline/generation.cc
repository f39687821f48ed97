#include "generation.h"

#include <algorithm>

#include "sluice/common/check.h"

namespace sluice::pipeline {

std::vector<model::TokenId> EncodePrompt(const model::Tokenizer& tokenizer, const std::string& text,
                                         const model::PromptFormat& format) {
  if (format.chat) {
    Result<std::string> rendered = format.Apply(text);
    SLUICE_CHECK(rendered.ok()) << rendered.status().ToString();
    return tokenizer.Encode(*rendered);
  }
  std::vector<model::TokenId> ids;
  if (tokenizer.bos_id() >= 0) ids.push_back(tokenizer.bos_id());
  for (model::TokenId t : tokenizer.Encode(text)) ids.push_back(t);
  return ids;
}

Result<std::vector<rollout::GenerationResult>> GenerateAll(rollout::RolloutEngine& engine,
                                                           std::vector<rollout::GenerationRequest> requests) {
  for (auto& r : requests) {
    Status submitted = engine.Submit(std::move(r));
    if (!submitted.ok()) {
      // Finish and drop what was already queued, so the engine is empty again.
      auto drained = engine.RunUntilIdle();
      return drained.ok() ? submitted : drained.status();
    }
  }
  SLUICE_ASSIGN_OR_RETURN(auto results, engine.RunUntilIdle());
  std::sort(results.begin(), results.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  return results;
}

Result<double> ScoreAnswer(const model::Tokenizer& tokenizer, const reward::Task& task, const reward::Example& ex,
                           const std::vector<model::TokenId>& answer) {
  return task.Score(ex, model::DecodeKnown(tokenizer, answer));
}

}  // namespace sluice::pipeline
