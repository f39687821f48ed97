#include "sluice/trainer/losses.h"

#include <cmath>
#include <iterator>
#include <map>
#include <optional>

#include "sluice/common/check.h"
#include "sluice/common/enum_names.h"

namespace sluice::trainer {

Result<std::vector<double>> GroupAdvantages(const std::vector<double>& rewards, const std::vector<GroupId>& group_ids,
                                            bool divide_by_std, double eps) {
  if (rewards.size() != group_ids.size()) {
    return Status::InvalidArgument("GroupAdvantages: " + std::to_string(rewards.size()) + " rewards but " +
                                   std::to_string(group_ids.size()) + " group ids");
  }
  struct Acc {
    double sum = 0, sum_sq = 0;
    int64_t n = 0;
  };
  std::map<uint64_t, Acc> groups;
  for (size_t i = 0; i < rewards.size(); ++i) {
    Acc& a = groups[group_ids[i]];
    a.sum += rewards[i];
    a.n += 1;
  }
  for (auto& [id, a] : groups) {
    if (a.n < 2) {
      return Status::InvalidArgument("GRPO group " + std::to_string(id) +
                                     " has a single sample; group advantages need at least 2 samples per prompt");
    }
  }
  for (size_t i = 0; i < rewards.size(); ++i) {
    Acc& a = groups[group_ids[i]];
    double d = rewards[i] - a.sum / a.n;
    a.sum_sq += d * d;
  }
  std::vector<double> out(rewards.size());
  for (size_t i = 0; i < rewards.size(); ++i) {
    const Acc& a = groups[group_ids[i]];
    double centered = rewards[i] - a.sum / a.n;
    out[i] = divide_by_std ? centered / (std::sqrt(a.sum_sq / (a.n - 1)) + eps) : centered;
  }
  return out;
}

Result<LossAggregation> ParseLossAggregation(const std::string& name) {
  if (name == "token-mean") return LossAggregation::kTokenMean;
  if (name == "seq-mean") return LossAggregation::kSequenceMean;
  return Status::InvalidArgument("loss aggregation '" + name + "' is not one of {token-mean, seq-mean}");
}

Result<KlEstimator> ParseKlEstimator(const std::string& name) {
  if (name == "k1") return KlEstimator::kK1;
  if (name == "k3") return KlEstimator::kK3;
  return Status::InvalidArgument("KL estimator '" + name + "' is not one of {k1, k3}");
}

Result<OffPolicyCorrection> ParseOffPolicyCorrection(const std::string& name) {
  if (name == "none") return OffPolicyCorrection::kNone;
  if (name == "decoupled") return OffPolicyCorrection::kDecoupled;
  if (name == "tis") return OffPolicyCorrection::kTokenTis;
  if (name == "seq-tis") return OffPolicyCorrection::kSequenceTis;
  if (name == "behavior") return OffPolicyCorrection::kBehavior;
  return Status::InvalidArgument("off-policy correction '" + name +
                                 "' is not one of {none, decoupled, tis, seq-tis, behavior}");
}

PolicyVersion OldestSampledVersion(const RolloutSample& s, PolicyVersion otherwise) {
  std::optional<PolicyVersion> oldest;
  for (PolicyVersion v : s.versions) {
    if (v >= 0 && (!oldest || v < *oldest)) oldest = v;
  }
  return oldest.value_or(otherwise);
}

std::string OffPolicyCorrectionName(OffPolicyCorrection c) {
  static constexpr const char* kNames[] = {"none", "decoupled", "tis", "seq-tis", "behavior"};
  static_assert(std::size(kNames) == static_cast<size_t>(OffPolicyCorrection::kBehavior) + 1);
  return EnumName(kNames, c);
}

torch::Tensor KlPenalty(const torch::Tensor& logprobs, const torch::Tensor& ref_logprobs, KlEstimator estimator) {
  auto diff = ref_logprobs - logprobs;
  if (estimator == KlEstimator::kK1) return -diff;
  // Clamped as verl does, so one wild token cannot blow up the loss.
  auto d = diff.clamp(-20.0, 20.0);
  return (torch::exp(d) - d - 1.0).clamp(-10.0, 10.0);
}

torch::Tensor Entropy(const torch::Tensor& logits) {
  auto logp = torch::log_softmax(logits.to(torch::kFloat32), -1);
  return -(logp.exp() * logp).sum(-1);
}

torch::Tensor Aggregate(const torch::Tensor& values, const torch::Tensor& mask, LossAggregation aggregation,
                        double normalizer) {
  SLUICE_CHECK(normalizer > 0) << "normalizer " << normalizer;
  auto masked = values * mask;
  if (aggregation == LossAggregation::kTokenMean) return masked.sum() / normalizer;
  auto per_seq_tokens = mask.sum(-1).clamp_min(1.0);
  return (masked.sum(-1) / per_seq_tokens).sum() / normalizer;
}

PolicyLossResult PolicyLoss(const PolicyLossInputs& in, const PolicyLossOptions& options, double normalizer) {
  PolicyLossResult r;
  auto log_ratio = (in.logprobs - in.old_logprobs).clamp(-20.0, 20.0);
  auto ratio = torch::exp(log_ratio);
  auto unclipped = -in.advantages * ratio;
  auto clipped = -in.advantages * ratio.clamp(1.0 - options.clip_low, 1.0 + options.clip_high);
  auto pg = torch::maximum(unclipped, clipped);
  torch::Tensor is_weight, is_capped, applied;  // detached, [B, T]
  // kBehavior needs no weight: the caller passes the behaviour logprobs as old_logprobs.
  if (options.correction != OffPolicyCorrection::kNone && options.correction != OffPolicyCorrection::kBehavior) {
    torch::NoGradGuard no_grad;
    SLUICE_CHECK(in.behavior_logprobs.defined()) << "an off-policy correction needs behaviour logprobs";
    auto log_w = (in.old_logprobs.detach() - in.behavior_logprobs) * in.mask;
    switch (options.correction) {
      case OffPolicyCorrection::kDecoupled:
        is_weight = torch::exp(log_w.clamp(-20.0, 20.0));
        is_capped = (is_weight > options.is_cap).to(torch::kFloat32);
        applied = is_weight * (1.0 - is_capped);
        break;
      case OffPolicyCorrection::kTokenTis:
        is_weight = torch::exp(log_w.clamp(-20.0, 20.0));
        is_capped = (is_weight > options.is_cap).to(torch::kFloat32);
        applied = is_weight.clamp_max(options.is_cap);
        break;
      case OffPolicyCorrection::kSequenceTis: {
        auto seq = torch::exp(log_w.sum(1, /*keepdim=*/true).clamp(-20.0, 20.0));  // [B, 1]
        is_weight = seq.expand_as(log_w);
        is_capped = (is_weight > options.is_cap).to(torch::kFloat32);
        applied = is_weight.clamp_max(options.is_cap);
        break;
      }
      case OffPolicyCorrection::kNone:
      case OffPolicyCorrection::kBehavior:
        break;
    }
  }
  if (applied.defined()) pg = pg * applied;  // outside the no-grad scope: the weight is a constant factor
  auto per_token = pg;
  torch::Tensor kl;
  if (options.kl_coef > 0) {
    SLUICE_CHECK(in.ref_logprobs.defined()) << "kl_coef > 0 needs reference logprobs";
    kl = KlPenalty(in.logprobs, in.ref_logprobs, options.kl_estimator);
    per_token = pg + options.kl_coef * kl;
  }
  r.loss = Aggregate(per_token, in.mask, options.aggregation, normalizer);
  torch::NoGradGuard no_grad;
  r.tokens = in.mask.sum().item<double>();
  r.pg_loss_sum = (pg * in.mask).sum().item<double>();
  r.clipped_tokens = ((clipped > unclipped).to(torch::kFloat32) * in.mask).sum().item<double>();
  r.ratio_sum = (ratio * in.mask).sum().item<double>();
  if (kl.defined()) r.kl_sum = (kl * in.mask).sum().item<double>();
  if (is_weight.defined()) {
    r.is_weight_sum = (is_weight * in.mask).sum().item<double>();
    r.is_capped_tokens = (is_capped * in.mask).sum().item<double>();
  }
  return r;
}

}  // namespace sluice::trainer
