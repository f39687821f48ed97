#include "sampler.h"

#include "sluice/common/check.h"
#include "sluice/common/random.h"

namespace sluice::rollout {
double StreamUniform(uint64_t seed, uint64_t index) { return UnitInterval(HashCombine(seed, index)); }

SampledTokens SampleTokens(const torch::Tensor& logits, const std::vector<SampleRow>& rows) {
  SLUICE_CHECK_EQ(logits.dim(), 2);
  const int64_t B = logits.size(0), V = logits.size(1);
  SLUICE_CHECK_EQ(static_cast<int64_t>(rows.size()), B);
  SampledTokens out;
  if (B == 0) return out;

  std::vector<float> temps(B), top_p(B);
  std::vector<int64_t> top_k(B), greedy(B);
  std::vector<double> uniform(B);
  for (int64_t b = 0; b < B; ++b) {
    const SampleRow& r = rows[b];
    greedy[b] = r.temperature <= 0.0f;
    temps[b] = greedy[b] ? 1.0f : r.temperature;
    top_k[b] = (r.top_k <= 0 || r.top_k > V) ? V : r.top_k;
    top_p[b] = r.top_p;
    uniform[b] = r.uniform;
  }
  auto dev = logits.device();
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(dev);
  auto i64 = torch::TensorOptions().dtype(torch::kInt64).device(dev);
  auto t_temp = torch::tensor(temps).to(f32).unsqueeze(1);
  auto t_topk = torch::tensor(top_k).to(i64).unsqueeze(1);
  auto t_topp = torch::tensor(top_p).to(f32).unsqueeze(1);
  auto t_unif = torch::tensor(uniform, torch::kFloat64).to(dev).unsqueeze(1);
  auto t_greedy = torch::tensor(greedy).to(i64).to(torch::kBool);

  auto scaled = logits.to(torch::kFloat32) / t_temp;
  auto logp = torch::log_softmax(scaled, -1);
  // A stable descending sort breaks ties by the lower token id, as argmax does.
  auto [sorted, order] = scaled.sort(/*stable=*/true, /*dim=*/-1, /*descending=*/true);
  auto rank = torch::arange(V, i64).unsqueeze(0);
  auto keep = rank < t_topk;
  auto probs = torch::softmax(sorted.masked_fill(keep.logical_not(), -std::numeric_limits<float>::infinity()), -1);
  // Nucleus: keep a token while the mass before it is below top_p (the first always stays).
  auto mass_before = probs.cumsum(-1) - probs;
  // top_p >= 1 means off: float rounding in the cumsum must not cut the tail.
  keep = keep.logical_and(mass_before < t_topp).logical_or(keep.logical_and(t_topp >= 1.0f));
  auto kept = probs.masked_fill(keep.logical_not(), 0.0).to(torch::kFloat64);
  auto cdf = kept.cumsum(-1);
  auto target = t_unif * cdf.narrow(1, V - 1, 1);
  auto last_kept = keep.sum(-1, /*keepdim=*/true) - 1;
  auto choice = torch::minimum((cdf <= target).sum(-1, /*keepdim=*/true), last_kept);
  choice = torch::where(t_greedy.unsqueeze(1), torch::zeros_like(choice), choice);
  auto tokens = order.gather(1, choice);
  auto token_logp = logp.gather(1, tokens);

  auto tokens_cpu = tokens.squeeze(1).to(torch::kCPU).to(torch::kInt64).contiguous();
  auto logp_cpu = token_logp.squeeze(1).to(torch::kCPU).contiguous();
  out.tokens.resize(B);
  out.logprobs.resize(B);
  const int64_t* tp = tokens_cpu.data_ptr<int64_t>();
  const float* lp = logp_cpu.data_ptr<float>();
  for (int64_t b = 0; b < B; ++b) {
    out.tokens[b] = static_cast<model::TokenId>(tp[b]);
    out.logprobs[b] = lp[b];
  }
  return out;
}

}  // namespace sluice::rollout
