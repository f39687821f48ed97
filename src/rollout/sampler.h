// Token sampling for the rollout engine (private to the rollout module).
//
// Each row is sampled independently, as a pure function of its logits, its
// parameters and one uniform number, so results do not depend on which rows
// share the batch.
#ifndef SLUICE_ROLLOUT_SAMPLER_H_
#define SLUICE_ROLLOUT_SAMPLER_H_

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "sluice/model/tokenizer.h"

namespace sluice::rollout {

struct SampleRow {
  float temperature = 1.0f;  // 0: greedy
  int32_t top_k = 0;         // 0: off
  float top_p = 1.0f;        // 1: off
  double uniform = 0.0;      // in [0, 1): the row's random draw
};

struct SampledTokens {
  std::vector<model::TokenId> tokens;
  std::vector<float> logprobs;  // log-softmax(logits / T)[token], before truncation
};

// logits: [B, V] float32 on any device. rows.size() == B.
SampledTokens SampleTokens(const torch::Tensor& logits, const std::vector<SampleRow>& rows);

// The uniform draw for token `index` of the stream `seed`: a counter-based
// hash, so it needs no state and is the same whatever else runs.
double StreamUniform(uint64_t seed, uint64_t index);

}  // namespace sluice::rollout

#endif  // SLUICE_ROLLOUT_SAMPLER_H_
