// Private to sluice_pipeline: prompts in, answers out, answers scored: what
// the direct loop and the evaluator share.
#ifndef SLUICE_SRC_PIPELINE_GENERATION_H_
#define SLUICE_SRC_PIPELINE_GENERATION_H_

#include <string>
#include <vector>

#include "sluice/common/status.h"
#include "sluice/model/chat_template.h"
#include "sluice/model/tokenizer.h"
#include "sluice/reward/task.h"
#include "sluice/rollout/engine.h"

namespace sluice::pipeline {

// BOS, then the prompt's tokens; with a chat template, the tokens of the
// rendered conversation (the template writes BOS itself where the model
// wants it). The format must render every prompt it is given: a run checks
// all of its task's prompts when it starts (CheckPromptsFit). Errors: the
// chat template's (InvalidArgument, ResourceExhausted past its budgets) and
// the tokenizer's.
Result<std::vector<model::TokenId>> EncodePrompt(const model::Tokenizer& tokenizer, const std::string& text,
                                                 const model::PromptFormat& format = {});

// Generates every request on `engine` (idle on entry) until it is idle again;
// results sorted by request id. On an error the engine is drained first.
Result<std::vector<rollout::GenerationResult>> GenerateAll(rollout::RolloutEngine& engine,
                                                           std::vector<rollout::GenerationRequest> requests);

// The task's rewards for answers[i] (tokens) to examples[i], scored on up to
// task.max_parallel_scores() threads at once; the same values whatever the
// parallelism. Precondition: the two have the same size.
std::vector<double> ScoreAnswers(const model::Tokenizer& tokenizer, const reward::Task& task,
                                 const std::vector<const reward::Example*>& examples,
                                 const std::vector<const std::vector<model::TokenId>*>& answers);

}  // namespace sluice::pipeline

#endif  // SLUICE_SRC_PIPELINE_GENERATION_H_
