#include "sluice/trainer/losses.h"

#include <gtest/gtest.h>

#include <cmath>

namespace sluice::trainer {
namespace {

TEST(GroupAdvantagesTest, HandComputedWithAndWithoutStd) {
  std::vector<double> rewards = {1, 0, 0, 1, 1, 1, 1, 0};
  std::vector<GroupId> groups = {7, 7, 7, 7, 9, 9, 9, 9};
  auto a = GroupAdvantages(rewards, groups, /*divide_by_std=*/true, 0.0);
  ASSERT_TRUE(a.ok());
  // Group 7: mean 0.5, unbiased std sqrt(1/3); group 9: mean 0.75, std 0.5.
  const double s7 = std::sqrt(1.0 / 3.0);
  std::vector<double> want = {0.5 / s7, -0.5 / s7, -0.5 / s7, 0.5 / s7, 0.5, 0.5, 0.5, -1.5};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR((*a)[i], want[i], 1e-12) << i;
  auto b = GroupAdvantages(rewards, groups, /*divide_by_std=*/false);
  std::vector<double> centered = {0.5, -0.5, -0.5, 0.5, 0.25, 0.25, 0.25, -0.75};
  for (size_t i = 0; i < centered.size(); ++i) EXPECT_NEAR((*b)[i], centered[i], 1e-12) << i;
}

TEST(GroupAdvantagesTest, EqualRewardsGiveZeroAndSingletonsAreRefused) {
  auto a = GroupAdvantages({1, 1, 1}, {1, 1, 1}, true);
  ASSERT_TRUE(a.ok());
  for (double v : *a) EXPECT_EQ(v, 0.0);
  auto s = GroupAdvantages({1, 0, 1}, {1, 1, 2}, true);
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("at least 2"), std::string::npos);
  EXPECT_FALSE(GroupAdvantages({1, 0}, {1}, true).ok());
}

TEST(PolicyLossTest, ClippedSurrogateMatchesHandComputation) {
  // Token 0: A = 1, r = 1.25 -> clipped to 1.2, loss -1.2.
  // Token 1: A = -1, r = 0.5 -> clipped to 0.8, loss 0.8 (max of 0.5 and 0.8).
  // Token 2: A = 2, r = 1.05 (inside the range) -> -2.1. Token 3 is padding.
  auto logp = torch::log(torch::tensor({{0.5f, 0.2f, 0.42f, 0.9f}}));
  auto old = torch::log(torch::tensor({{0.4f, 0.4f, 0.4f, 0.1f}}));
  auto adv = torch::tensor({{1.0f, -1.0f, 2.0f, 5.0f}});
  auto mask = torch::tensor({{1.0f, 1.0f, 1.0f, 0.0f}});
  PolicyLossInputs in{logp, old, old, adv, mask, {}};
  PolicyLossOptions o;
  auto r = PolicyLoss(in, o, /*normalizer=*/3.0);
  EXPECT_NEAR(r.loss.item<double>(), (-1.2 + 0.8 - 2.1) / 3.0, 1e-5);
  EXPECT_EQ(r.clipped_tokens, 2.0);
  EXPECT_EQ(r.tokens, 3.0);
  EXPECT_NEAR(r.ratio_sum, 1.25 + 0.5 + 1.05, 1e-5);
  // Asymmetric clipping (clip_high 0.3) leaves token 0 unclipped.
  o.clip_high = 0.3;
  EXPECT_NEAR(PolicyLoss(in, o, 3.0).loss.item<double>(), (-1.25 + 0.8 - 2.1) / 3.0, 1e-5);
}

TEST(PolicyLossTest, AggregationTokenMeanVsSequenceMean) {
  // Sequence 0 has two tokens of loss 1 and 3; sequence 1 one token of loss 8.
  // With ratio 1 the per-token loss is -A.
  auto zero = torch::zeros({2, 2});
  auto adv = torch::tensor({{-1.0f, -3.0f}, {-8.0f, 0.0f}});
  auto mask = torch::tensor({{1.0f, 1.0f}, {1.0f, 0.0f}});
  PolicyLossInputs in{zero, zero, zero, adv, mask, {}};
  PolicyLossOptions o;
  o.aggregation = LossAggregation::kTokenMean;
  EXPECT_NEAR(PolicyLoss(in, o, 3.0).loss.item<double>(), 12.0 / 3.0, 1e-6);
  o.aggregation = LossAggregation::kSequenceMean;
  EXPECT_NEAR(PolicyLoss(in, o, 2.0).loss.item<double>(), (2.0 + 8.0) / 2.0, 1e-6);
  // Micro-batches with the mini-batch normalizer add up to the whole.
  PolicyLossInputs first{zero.narrow(0, 0, 1), zero.narrow(0, 0, 1), zero.narrow(0, 0, 1),
                         adv.narrow(0, 0, 1),  mask.narrow(0, 0, 1), {}};
  PolicyLossInputs second{zero.narrow(0, 1, 1), zero.narrow(0, 1, 1), zero.narrow(0, 1, 1),
                          adv.narrow(0, 1, 1),  mask.narrow(0, 1, 1), {}};
  o.aggregation = LossAggregation::kTokenMean;
  EXPECT_NEAR(PolicyLoss(first, o, 3.0).loss.item<double>() + PolicyLoss(second, o, 3.0).loss.item<double>(), 4.0,
              1e-6);
}

TEST(PolicyLossTest, KlEstimatorsAndPenalty) {
  auto logp = torch::log(torch::tensor({{0.5f}}));
  auto ref = torch::log(torch::tensor({{0.25f}}));
  EXPECT_NEAR(KlPenalty(logp, ref, KlEstimator::kK1).item<double>(), std::log(2.0), 1e-6);
  EXPECT_NEAR(KlPenalty(logp, ref, KlEstimator::kK3).item<double>(), 0.5 + std::log(2.0) - 1.0, 1e-6);
  EXPECT_NEAR(KlPenalty(ref, ref, KlEstimator::kK3).item<double>(), 0.0, 1e-7);
  PolicyLossInputs in{logp, logp, logp, torch::zeros({1, 1}), torch::ones({1, 1}), ref};
  PolicyLossOptions o;
  o.kl_coef = 0.1;
  auto r = PolicyLoss(in, o, 1.0);
  EXPECT_NEAR(r.loss.item<double>(), 0.1 * (0.5 + std::log(2.0) - 1.0), 1e-6);
  EXPECT_NEAR(r.kl_sum, 0.5 + std::log(2.0) - 1.0, 1e-6);
}

TEST(PolicyLossTest, GradientIsZeroWhereTheMaskIsZero) {
  auto logp = torch::randn({2, 5}).requires_grad_(true);
  auto old = logp.detach().clone();
  auto mask = torch::tensor({{0.f, 1.f, 1.f, 0.f, 0.f}, {1.f, 1.f, 0.f, 0.f, 0.f}});
  auto adv = torch::randn({2, 5});
  PolicyLossInputs in{logp, old, old, adv, mask, {}};
  PolicyLoss(in, PolicyLossOptions{}, 4.0).loss.backward();
  auto grad = logp.grad();
  EXPECT_EQ((grad * (1 - mask)).abs().sum().item<float>(), 0.0f);
  // With ratio 1 the gradient is -A / normalizer on the masked-in tokens.
  EXPECT_TRUE(torch::allclose(grad * mask, -adv * mask / 4.0, 1e-6, 1e-6));
}

TEST(EntropyTest, UniformAndPeaked) {
  auto uniform = torch::zeros({1, 1, 4});
  EXPECT_NEAR(Entropy(uniform).item<double>(), std::log(4.0), 1e-6);
  auto peaked = torch::tensor({{{100.0f, 0.0f, 0.0f}}});
  EXPECT_NEAR(Entropy(peaked).item<double>(), 0.0, 1e-6);
}

TEST(PolicyLossTest, OffPolicyCorrectionsMatchHandComputation) {
  // Policy == proximal (r = 1, no clipping), per-token loss before weighting is -A.
  // Behaviour weights w = pi_prox / pi_behav: 0.5, 4 (above the cap 2), 1.25; token 3 is padding.
  auto prox = torch::log(torch::tensor({{0.2f, 0.8f, 0.5f, 0.3f}}));
  auto behav = torch::log(torch::tensor({{0.4f, 0.2f, 0.4f, 0.9f}}));
  auto adv = torch::tensor({{1.0f, 1.0f, 2.0f, 7.0f}});
  auto mask = torch::tensor({{1.0f, 1.0f, 1.0f, 0.0f}});
  PolicyLossInputs in{prox.clone(), prox, behav, adv, mask, {}};
  PolicyLossOptions o;
  o.is_cap = 2.0;
  o.correction = OffPolicyCorrection::kNone;
  EXPECT_NEAR(PolicyLoss(in, o, 3.0).loss.item<double>(), (-1 - 1 - 2) / 3.0, 1e-5);
  o.correction = OffPolicyCorrection::kTokenTis;  // min(w, 2): 0.5, 2, 1.25
  auto tis = PolicyLoss(in, o, 3.0);
  EXPECT_NEAR(tis.loss.item<double>(), (-0.5 - 2.0 - 2.5) / 3.0, 1e-5);
  EXPECT_NEAR(tis.is_weight_sum, 0.5 + 4.0 + 1.25, 1e-4);
  EXPECT_EQ(tis.is_capped_tokens, 1.0);
  o.correction = OffPolicyCorrection::kDecoupled;  // w, with the token above the cap masked: 0.5, 0, 1.25
  EXPECT_NEAR(PolicyLoss(in, o, 3.0).loss.item<double>(), (-0.5 - 0.0 - 2.5) / 3.0, 1e-5);
  o.correction = OffPolicyCorrection::kSequenceTis;  // prod w = 2.5 (padding excluded) -> capped at 2
  auto seq = PolicyLoss(in, o, 3.0);
  EXPECT_NEAR(seq.loss.item<double>(), 2.0 * (-1 - 1 - 2) / 3.0, 1e-5);
  EXPECT_EQ(seq.is_capped_tokens, 3.0);
  o.is_cap = 10.0;
  EXPECT_NEAR(PolicyLoss(in, o, 3.0).loss.item<double>(), 2.5 * (-1 - 1 - 2) / 3.0, 1e-4);
  // The weight is a constant: the gradient is w * the PPO gradient.
  o.correction = OffPolicyCorrection::kTokenTis;
  o.is_cap = 2.0;
  auto logp = prox.clone().requires_grad_(true);
  PolicyLossInputs g{logp, prox, behav, adv, mask, {}};
  PolicyLoss(g, o, 3.0).loss.backward();
  auto grad = logp.grad();
  EXPECT_NEAR(grad[0][0].item<double>(), -0.5 * 1.0 / 3.0, 1e-5);
  EXPECT_NEAR(grad[0][1].item<double>(), -2.0 * 1.0 / 3.0, 1e-5);
  EXPECT_NEAR(grad[0][3].item<double>(), 0.0, 1e-7);
}

TEST(ParseTest, NamesAndErrors) {
  EXPECT_EQ(*ParseOffPolicyCorrection("seq-tis"), OffPolicyCorrection::kSequenceTis);
  EXPECT_EQ(OffPolicyCorrectionName(OffPolicyCorrection::kDecoupled), "decoupled");
  EXPECT_NE(ParseOffPolicyCorrection("is").status().message().find("none, decoupled, tis, seq-tis"), std::string::npos);
  EXPECT_EQ(*ParseLossAggregation("seq-mean"), LossAggregation::kSequenceMean);
  EXPECT_NE(ParseLossAggregation("mean").status().message().find("token-mean, seq-mean"), std::string::npos);
  EXPECT_EQ(*ParseKlEstimator("k1"), KlEstimator::kK1);
  EXPECT_FALSE(ParseKlEstimator("k2").ok());
}

}  // namespace
}  // namespace sluice::trainer
