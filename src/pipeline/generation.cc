#include "generation.h"

#include <algorithm>
#include <atomic>
#include <thread>

#include "sluice/common/check.h"

namespace sluice::pipeline {

Result<std::vector<model::TokenId>> EncodePrompt(const model::Tokenizer& tokenizer, const std::string& text,
                                                 const model::PromptFormat& format) {
  if (format.chat) {
    SLUICE_ASSIGN_OR_RETURN(const std::string rendered, format.Apply(text));
    return tokenizer.Encode(rendered);
  }
  std::vector<model::TokenId> ids;
  if (tokenizer.bos_id() >= 0) ids.push_back(tokenizer.bos_id());
  SLUICE_ASSIGN_OR_RETURN(const std::vector<model::TokenId> text_ids, tokenizer.Encode(text));
  ids.insert(ids.end(), text_ids.begin(), text_ids.end());
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

std::vector<double> ScoreAnswers(const model::Tokenizer& tokenizer, const reward::Task& task,
                                 const std::vector<const reward::Example*>& examples,
                                 const std::vector<const std::vector<model::TokenId>*>& answers) {
  SLUICE_CHECK(examples.size() == answers.size()) << examples.size() << " examples, " << answers.size() << " answers";
  std::vector<std::string> texts;
  texts.reserve(answers.size());
  for (const auto* answer : answers) texts.push_back(model::DecodeKnown(tokenizer, *answer));
  std::vector<double> rewards(texts.size());
  std::atomic<size_t> next{0};
  auto score = [&] {
    for (size_t i = next.fetch_add(1); i < texts.size(); i = next.fetch_add(1)) {
      rewards[i] = task.Score(*examples[i], texts[i]);
    }
  };
  const size_t threads = std::min<size_t>(static_cast<size_t>(std::max(1, task.max_parallel_scores())), texts.size());
  std::vector<std::jthread> helpers;
  for (size_t t = 1; t < threads; ++t) helpers.emplace_back(score);
  score();
  for (std::jthread& helper : helpers) helper.join();  // each may still be scoring its last answer
  return rewards;
}

}  // namespace sluice::pipeline
