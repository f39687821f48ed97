#include "sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>

namespace sluice::rollout {
namespace {

torch::Tensor RandomLogits(int64_t b, int64_t v, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  return torch::randn({b, v}, gen) * 2.0;
}

// Tokens allowed by top-k then top-p, computed independently in double precision.
std::set<int64_t> AllowedSet(const torch::Tensor& row, float temperature, int32_t top_k, float top_p) {
  const int64_t V = row.size(0);
  std::vector<double> logits(V);
  for (int64_t i = 0; i < V; ++i) logits[i] = row[i].item<double>() / temperature;
  std::vector<int64_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
  const int64_t k = top_k > 0 ? std::min<int64_t>(top_k, V) : V;
  double max = logits[order[0]], z = 0;
  for (int64_t i = 0; i < k; ++i) z += std::exp(logits[order[i]] - max);
  std::set<int64_t> allowed;
  double mass = 0;
  for (int64_t i = 0; i < k; ++i) {
    if (mass >= top_p - 1e-6 && !allowed.empty()) break;
    allowed.insert(order[i]);
    mass += std::exp(logits[order[i]] - max) / z;
  }
  return allowed;
}

TEST(SamplerTest, GreedyIsArgmaxWithTemperatureOneLogprob) {
  auto logits = RandomLogits(4, 30, 1);
  std::vector<SampleRow> rows(4, SampleRow{0.0f, 0, 1.0f, 0.7});
  auto out = SampleTokens(logits, rows);
  auto logp = torch::log_softmax(logits, -1);
  for (int64_t b = 0; b < 4; ++b) {
    EXPECT_EQ(out.tokens[b], logits[b].argmax().item<int64_t>());
    EXPECT_FLOAT_EQ(out.logprobs[b], logp[b][out.tokens[b]].item<float>());
  }
}

TEST(SamplerTest, TopKAndTopPNeverLeaveTheAllowedSet) {
  const int64_t V = 40;
  struct Case {
    float t;
    int32_t k;
    float p;
  };
  for (Case c :
       {Case{1.0f, 5, 1.0f}, Case{0.7f, 0, 0.5f}, Case{1.3f, 10, 0.8f}, Case{1.0f, 1, 1.0f}, Case{2.0f, 0, 0.05f}}) {
    auto logits = RandomLogits(1, V, 2);
    auto allowed = AllowedSet(logits[0], c.t, c.k, c.p);
    std::set<int64_t> seen;
    for (int i = 0; i < 2000; ++i) {
      auto out = SampleTokens(logits, {SampleRow{c.t, c.k, c.p, StreamUniform(9, i)}});
      ASSERT_TRUE(allowed.count(out.tokens[0])) << "token " << out.tokens[0] << " k=" << c.k << " p=" << c.p;
      seen.insert(out.tokens[0]);
      // The logprob is of the temperature-scaled distribution before truncation.
      EXPECT_NEAR(out.logprobs[0], torch::log_softmax(logits[0] / c.t, -1)[out.tokens[0]].item<float>(), 1e-5);
    }
    EXPECT_EQ(seen, allowed) << "every allowed token should appear in 2000 draws";
  }
}

TEST(SamplerTest, FrequenciesFollowTheSoftmax) {
  auto logits = torch::tensor({{1.0f, 0.0f, -1.0f, 0.5f, 2.0f}});
  auto probs = torch::softmax(logits[0], -1);
  std::vector<int> counts(5, 0);
  const int n = 20000;
  for (int i = 0; i < n; ++i) counts[SampleTokens(logits, {SampleRow{1.0f, 0, 1.0f, StreamUniform(3, i)}}).tokens[0]]++;
  for (int v = 0; v < 5; ++v) EXPECT_NEAR(counts[v] / static_cast<double>(n), probs[v].item<double>(), 0.015) << v;
}

TEST(SamplerTest, ARowSamplesTheSameAloneOrInABatch) {
  auto logits = RandomLogits(6, 50, 4);
  std::vector<SampleRow> rows;
  for (int b = 0; b < 6; ++b)
    rows.push_back(SampleRow{0.5f + 0.2f * b, b % 3 == 0 ? 0 : 7, b % 2 ? 0.9f : 1.0f, StreamUniform(b, 5)});
  rows[2].temperature = 0.0f;
  auto batch = SampleTokens(logits, rows);
  for (int b = 0; b < 6; ++b) {
    auto alone = SampleTokens(logits.narrow(0, b, 1), {rows[b]});
    EXPECT_EQ(alone.tokens[0], batch.tokens[b]);
    EXPECT_EQ(alone.logprobs[0], batch.logprobs[b]);
  }
}

TEST(SamplerTest, StreamUniformIsDeterministicAndInRange) {
  std::set<double> values;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    for (uint64_t i = 0; i < 50; ++i) {
      double u = StreamUniform(seed, i);
      ASSERT_GE(u, 0.0);
      ASSERT_LT(u, 1.0);
      EXPECT_EQ(u, StreamUniform(seed, i));
      values.insert(u);
    }
  }
  EXPECT_EQ(values.size(), 1000u);
}

}  // namespace
}  // namespace sluice::rollout
