// The RL loss math: GRPO advantages, the PPO clipped surrogate with
// selectable aggregation, KL penalties to a reference policy, entropy.
// Pure functions of tensors, tested against hand-computed values.
//
// Shapes: per-token tensors are [B, T] float32 over the response positions
// of B sequences (right-padded), with `mask` 1.0 on real response tokens and
// 0.0 on padding. Thread safety: pure functions.
#ifndef SLUICE_TRAINER_LOSSES_H_
#define SLUICE_TRAINER_LOSSES_H_

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "sluice/common/ids.h"
#include "sluice/common/status.h"
#include "sluice/trainer/types.h"

namespace sluice::trainer {

// GRPO: each sample's advantage is its reward minus its group's mean reward,
// divided by the group's standard deviation (unbiased, n - 1) plus `eps`
// unless `divide_by_std` is false. Groups are identified by `group_ids`.
// Errors: InvalidArgument when sizes differ or a group has a single member
// (its advantage would be undefined: GRPO needs at least two samples a group).
Result<std::vector<double>> GroupAdvantages(const std::vector<double>& rewards, const std::vector<GroupId>& group_ids,
                                            bool divide_by_std, double eps = 1e-6);

// Per-token KL estimate between the policy and the reference.
torch::Tensor KlPenalty(const torch::Tensor& logprobs, const torch::Tensor& ref_logprobs, KlEstimator estimator);

// Per-token entropy of the distribution given by logits [B, T, V] -> [B, T].
torch::Tensor Entropy(const torch::Tensor& logits);

// Reduces per-token values [B, T] under `mask`. `normalizer` is the count the
// sum is divided by: the mini-batch's total tokens (token mean) or total
// sequences (sequence mean), so micro-batches of one mini-batch add up to
// exactly the mini-batch's loss under gradient accumulation.
torch::Tensor Aggregate(const torch::Tensor& values, const torch::Tensor& mask, LossAggregation aggregation,
                        double normalizer);

// Everything per token the policy loss sees. `behavior_logprobs` come from
// rollout: each token's logprob under the weights version that sampled it
// (so a sequence that spans versions carries each token's own behaviour
// policy); `old_logprobs` are the proximal policy's (recomputed by the
// trainer before the update). The off-policy corrections weight each token
// by pi_prox / pi_behav from these two.
struct PolicyLossInputs {
  torch::Tensor logprobs;           // [B, T] current policy, with grad
  torch::Tensor old_logprobs;       // [B, T] proximal policy
  torch::Tensor behavior_logprobs;  // [B, T] the policy that sampled the tokens
  torch::Tensor advantages;         // [B, T]
  torch::Tensor mask;               // [B, T]
  torch::Tensor ref_logprobs;       // [B, T] or undefined when kl_coef == 0
};

struct PolicyLossResult {
  torch::Tensor loss;  // scalar, aggregated (already divided by the normalizer)
  // Metrics, as sums over masked tokens (divide by the token count):
  double pg_loss_sum = 0, kl_sum = 0, clipped_tokens = 0, ratio_sum = 0, tokens = 0;
  // Behaviour weights w (before capping) summed over tokens, and tokens whose
  // weight was capped or masked by the correction.
  double is_weight_sum = 0, is_capped_tokens = 0;
};

// PPO clipped surrogate: per token max(-A r, -A clip(r, 1 - clip_low,
// 1 + clip_high)) with r = exp(logprobs - old_logprobs), times the
// off-policy weight of options.correction, plus kl_coef * KL.
PolicyLossResult PolicyLoss(const PolicyLossInputs& in, const PolicyLossOptions& options, double normalizer);

}  // namespace sluice::trainer

#endif  // SLUICE_TRAINER_LOSSES_H_
