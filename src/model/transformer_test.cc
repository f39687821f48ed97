// Behaviour of the transformer: causality, KV-cache equivalence, and agreement
// with a deliberately naive reference written from the Llama equations.
#include "sluice/model/transformer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "decode_kernels.h"
#include "sluice/model/config.h"
#include "sluice/model/weights.h"

namespace sluice::model {
namespace {

struct Variant {
  bool tied;
  bool bias;
  int64_t kv_heads;
  std::string model_type = "llama";
  int64_t head_dim = 0;      // 0: hidden / heads
  bool llama3_rope = false;  // rope_scaling of type llama3, with every regime in use
};

ModelConfig SmallConfig(const Variant& v) {
  ModelConfig c;
  c.model_type = v.model_type;
  c.head_dim = v.head_dim;
  if (v.llama3_rope) {
    // Wavelengths here run from 6 to ~1400 positions: with a pretraining
    // context of 32, some are kept (< 8), some slowed 8x (> 32), some blended.
    c.rope_scaling = RopeScaling{"llama3", 8.0, 1.0, 4.0, 32};
  }
  c.hidden_size = 32;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = v.kv_heads;
  c.intermediate_size = 48;
  c.vocab_size = 50;
  c.max_position_embeddings = 64;
  c.tie_word_embeddings = v.tied;
  c.attention_bias = v.bias;
  c.rope_theta = 500.0;
  return c;
}

torch::Tensor RandomTokens(int64_t b, int64_t t, int64_t vocab, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  return torch::randint(0, vocab, {b, t}, gen, torch::kInt64);
}

// Perturbs all parameters so biases and norms are not trivially 0/1.
void Perturb(Transformer& m, uint64_t seed) {
  torch::NoGradGuard g;
  auto gen = at::detail::createCPUGenerator(seed);
  for (auto& p : m.parameters()) p.add_(torch::randn(p.sizes(), gen) * 0.05);
}

class TransformerTest : public ::testing::TestWithParam<Variant> {
 protected:
  void SetUp() override {
    config_ = SmallConfig(GetParam());
    model_ = std::make_shared<Transformer>(config_, 7);
    Perturb(*model_, 8);
  }
  void CheckCachedDecoding();
  void CheckPrefillsAndDecodesInOnePass();
  ModelConfig config_;
  std::shared_ptr<Transformer> model_;
};

TEST_P(TransformerTest, NamesFollowHuggingFace) {
  auto params = model_->named_parameters();
  EXPECT_TRUE(params.contains("model.embed_tokens.weight"));
  EXPECT_TRUE(params.contains("model.layers.1.self_attn.k_proj.weight"));
  EXPECT_TRUE(params.contains("model.layers.0.mlp.gate_proj.weight"));
  EXPECT_TRUE(params.contains("model.layers.0.post_attention_layernorm.weight"));
  EXPECT_TRUE(params.contains("model.norm.weight"));
  EXPECT_EQ(params.contains("lm_head.weight"), !config_.tie_word_embeddings);
  EXPECT_EQ(params.contains("model.layers.0.self_attn.q_proj.bias"), config_.attention_bias);
  EXPECT_FALSE(params.contains("model.layers.0.self_attn.o_proj.bias"));
  int64_t total = 0;
  for (const auto& p : params) total += p.value().numel();
  EXPECT_EQ(total, config_.NumParameters());
  EXPECT_EQ(params["model.layers.0.self_attn.k_proj.weight"].size(0),
            config_.num_key_value_heads * config_.resolved_head_dim());
  EXPECT_EQ(params.contains("model.layers.1.self_attn.q_norm.weight"), config_.model_type == "qwen3");
  EXPECT_EQ(params.contains("model.layers.1.self_attn.k_norm.weight"), config_.model_type == "qwen3");
}

TEST_P(TransformerTest, ChangingAFutureTokenNeverChangesEarlierLogits) {
  torch::NoGradGuard g;
  auto tokens = RandomTokens(2, 12, config_.vocab_size, 1);
  auto base = model_->Forward(tokens);
  for (int64_t pos : {3, 7, 11}) {
    auto changed = tokens.clone();
    changed.index_put_({torch::indexing::Slice(), pos},
                       (tokens.index({torch::indexing::Slice(), pos}) + 1) % config_.vocab_size);
    auto out = model_->Forward(changed);
    EXPECT_TRUE(torch::equal(out.narrow(1, 0, pos), base.narrow(1, 0, pos))) << "position " << pos;
    EXPECT_FALSE(torch::allclose(out.narrow(1, pos, 1), base.narrow(1, pos, 1))) << "position " << pos;
  }
}

// Decode rows are attended by the CPU kernels outside autograd (where the
// CPU has them; projections by the AVX2 and, where present, the AVX-512
// kernel) and by libtorch with autograd on: every path is checked.
TEST_P(TransformerTest, CachedDecodingMatchesFullRecomputation) {
  const bool had_avx512 = SmallLinearAvx512();
  for (int path = 0; path < 3; ++path) {
    const bool grad = path == 2;
    SetSmallLinearAvx512(path == 1);
    if (path == 1 && !SmallLinearAvx512()) continue;  // this CPU has no AVX-512
    torch::AutoGradMode mode(grad);
    SCOPED_TRACE(grad ? "libtorch path (autograd on)" : path == 1 ? "decode kernels, AVX-512" : "decode kernels");
    if (!grad) {
      EXPECT_EQ(model_->AttendsDecodeRowsInPlace(), DecodeAttentionApplies(config_.resolved_head_dim()));
    }
    CheckCachedDecoding();
  }
  SetSmallLinearAvx512(had_avx512);
}

void TransformerTest::CheckCachedDecoding() {
  const int64_t T = 20, P = 6;
  auto tokens = RandomTokens(3, T, config_.vocab_size, 2);
  auto full = model_->Forward(tokens);  // [3, T, V]
  // Rows live in non-consecutive slots 4, 1, 2 of a 5-slot cache (gather path),
  // then slots 0..2 (in-place path).
  for (std::vector<int64_t> slots : {std::vector<int64_t>{4, 1, 2}, std::vector<int64_t>{0, 1, 2}}) {
    auto cache = KvCache::Allocate(config_, 5, 32, torch::kCPU);
    auto prefill = model_->ForwardCached(tokens.narrow(1, 0, P), slots, {0, 0, 0}, &cache);
    EXPECT_TRUE(torch::allclose(prefill, full.narrow(1, 0, P), 1e-5, 1e-5));
    for (int64_t t = P; t < T; ++t) {
      auto step = model_->ForwardCached(tokens.narrow(1, t, 1), slots, {t, t, t}, &cache);
      EXPECT_TRUE(torch::allclose(step, full.narrow(1, t, 1), 1e-5, 1e-5)) << "t=" << t;
    }
  }
}

// A CPU model placed in bfloat16 keeps its vectors and its computation in
// float32: its logits are those of the float32 model whose matrices were
// rounded to bfloat16, through the full forward (BLAS on widened weights) and
// through cached decoding (the bfloat16 kernels; libtorch with autograd on).
TEST_P(TransformerTest, Bf16MatricesOnTheCpuComputeInFloat32) {
  auto placed = CloneModel(*model_, torch::kCPU, torch::kBFloat16);
  auto rounded = CloneModel(*model_);
  {
    torch::NoGradGuard g;
    for (auto& p : placed->named_parameters()) {
      EXPECT_EQ(p.value().scalar_type(), p.value().dim() == 2 ? torch::kBFloat16 : torch::kFloat32) << p.key();
    }
    for (auto& p : rounded->parameters()) {
      if (p.dim() == 2) p.copy_(p.to(torch::kBFloat16).to(torch::kFloat32));
    }
  }
  EXPECT_EQ(placed->compute_dtype(), torch::kFloat32);
  auto copy = CloneModel(*placed);  // a standby buffer keeps the layout
  for (auto& p : copy->named_parameters()) {
    EXPECT_EQ(p.value().scalar_type(), placed->named_parameters()[p.key()].scalar_type()) << p.key();
  }
  const int64_t T = 12, P = 5;
  auto tokens = RandomTokens(2, T, config_.vocab_size, 9);
  auto want = rounded->Forward(tokens);
  EXPECT_TRUE(torch::allclose(placed->Forward(tokens), want, 1e-5, 1e-5));
  EXPECT_FALSE(torch::allclose(model_->Forward(tokens), want, 1e-5, 1e-5)) << "rounding changed nothing: no test";
  for (bool grad : {false, true}) {
    torch::AutoGradMode mode(grad);
    SCOPED_TRACE(grad ? "libtorch path (autograd on)" : "decode kernels");
    if (!grad) {
      EXPECT_EQ(placed->AttendsDecodeRowsInPlace(), DecodeAttentionApplies(config_.resolved_head_dim()));
    }
    auto cache = KvCache::Allocate(config_, 3, 16, torch::kCPU, placed->compute_dtype());
    auto prefill = placed->ForwardCached(tokens.narrow(1, 0, P), {2, 0}, {0, 0}, &cache);
    EXPECT_TRUE(torch::allclose(prefill, want.narrow(1, 0, P), 1e-5, 1e-5));
    for (int64_t t = P; t < T; ++t) {
      auto step = placed->ForwardCached(tokens.narrow(1, t, 1), {2, 0}, {t, t}, &cache);
      EXPECT_TRUE(torch::allclose(step, want.narrow(1, t, 1), 1e-5, 1e-5)) << "t=" << t;
    }
  }
}

TEST_P(TransformerTest, RowsAtDifferentPositionsDecodeIndependently) {
  torch::NoGradGuard g;
  auto a = RandomTokens(1, 9, config_.vocab_size, 3), b = RandomTokens(1, 4, config_.vocab_size, 4);
  auto full_a = model_->Forward(a), full_b = model_->Forward(b);
  auto cache = KvCache::Allocate(config_, 2, 16, torch::kCPU);
  model_->ForwardCached(a.narrow(1, 0, 8), {0}, {0}, &cache);
  model_->ForwardCached(b.narrow(1, 0, 3), {1}, {0}, &cache);
  auto step = model_->ForwardCached(torch::cat({a.narrow(1, 8, 1), b.narrow(1, 3, 1)}), {0, 1}, {8, 3}, &cache);
  EXPECT_TRUE(torch::allclose(step[0][0], full_a[0][8], 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(step[1][0], full_b[0][3], 1e-5, 1e-5));
}

TEST_P(TransformerTest, PrefillsAndDecodesShareOnePass) {
  for (bool grad : {false, true}) {
    torch::AutoGradMode mode(grad);
    SCOPED_TRACE(grad ? "libtorch path (autograd on)" : "decode kernels");
    CheckPrefillsAndDecodesInOnePass();
  }
}

void TransformerTest::CheckPrefillsAndDecodesInOnePass() {
  auto a = RandomTokens(1, 9, config_.vocab_size, 6), b = RandomTokens(1, 7, config_.vocab_size, 7),
       c = RandomTokens(1, 5, config_.vocab_size, 8);
  auto full_a = model_->Forward(a)[0], full_b = model_->Forward(b)[0], full_c = model_->Forward(c)[0];
  auto cache = KvCache::Allocate(config_, 4, 16, torch::kCPU);
  // a (slot 3) and b (slot 0) are mid-decode; c (slot 1) arrives and is prefilled in the same pass.
  model_->ForwardCached(a.narrow(1, 0, 8), {3}, {0}, &cache);
  model_->ForwardCached(b.narrow(1, 0, 6), {0}, {0}, &cache);
  auto packed = torch::cat({a[0].narrow(0, 8, 1), b[0].narrow(0, 6, 1), c[0]});
  std::vector<CachedBlock> blocks = {CachedBlock{{3, 0}, {8, 6}, 1}, CachedBlock{{1}, {0}, 5}};
  auto all = model_->ForwardBlocks(packed, blocks, &cache, /*last_only=*/false);
  ASSERT_EQ(all.size(0), 7);
  EXPECT_TRUE(torch::allclose(all[0], full_a[8], 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(all[1], full_b[6], 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(all.narrow(0, 2, 5), full_c, 1e-5, 1e-5));
  // last_only: one row per sequence, the same values.
  auto cache2 = KvCache::Allocate(config_, 4, 16, torch::kCPU);
  model_->ForwardCached(a.narrow(1, 0, 8), {3}, {0}, &cache2);
  model_->ForwardCached(b.narrow(1, 0, 6), {0}, {0}, &cache2);
  auto last = model_->ForwardBlocks(packed, blocks, &cache2, /*last_only=*/true);
  ASSERT_EQ(last.size(0), 3);
  EXPECT_TRUE(torch::allclose(last[2], full_c[4], 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(last[0], full_a[8], 1e-5, 1e-5));
}

// A naive forward written straight from the Llama equations, one head at a
// time with explicit repetition of the kv heads, sharing no code with the model.
torch::Tensor NaiveForward(Transformer& m, const ModelConfig& c, const torch::Tensor& tokens) {
  auto p = m.named_parameters();
  const int64_t T = tokens.size(1), H = c.num_attention_heads, KV = c.num_key_value_heads;
  const int64_t D = c.head_dim > 0 ? c.head_dim : c.hidden_size / H;
  // Frequency i of RoPE, with Llama 3.1's scaling written out case by case.
  auto frequency = [&](int64_t i) {
    const double f = std::pow(c.rope_theta, -2.0 * static_cast<double>(i) / static_cast<double>(D));
    if (c.rope_scaling.type != "llama3") return f;
    const RopeScaling& r = c.rope_scaling;
    const double ctx = static_cast<double>(r.original_max_position_embeddings), wavelength = 2 * M_PI / f;
    if (wavelength < ctx / r.high_freq_factor) return f;
    if (wavelength > ctx / r.low_freq_factor) return f / r.factor;
    const double s = (ctx / wavelength - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
    return (1 - s) * f / r.factor + s * f;
  };
  auto rms = [&](const torch::Tensor& x, const torch::Tensor& w) {
    return w * (x / torch::sqrt((x * x).mean(-1, true) + c.rms_norm_eps));
  };
  auto linear = [&](const torch::Tensor& x, const std::string& name, bool bias) {
    auto y = torch::matmul(x, p[name + ".weight"].t());
    return bias ? y + p[name + ".bias"] : y;
  };
  auto rope = [&](const torch::Tensor& x /*[T, D]*/) {
    auto out = torch::empty_like(x);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t i = 0; i < D / 2; ++i) {
        double angle = static_cast<double>(t) * frequency(i);
        auto x1 = x[t][i], x2 = x[t][i + D / 2];
        out[t][i] = x1 * std::cos(angle) - x2 * std::sin(angle);
        out[t][i + D / 2] = x2 * std::cos(angle) + x1 * std::sin(angle);
      }
    }
    return out;
  };
  auto h = p["model.embed_tokens.weight"].index_select(0, tokens[0]);  // [T, hidden]
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    std::string pre = "model.layers." + std::to_string(l) + ".";
    auto x = rms(h, p[pre + "input_layernorm.weight"]);
    auto q = linear(x, pre + "self_attn.q_proj", c.attention_bias);
    auto k = linear(x, pre + "self_attn.k_proj", c.attention_bias);
    auto v = linear(x, pre + "self_attn.v_proj", c.attention_bias);
    std::vector<torch::Tensor> heads;
    for (int64_t head = 0; head < H; ++head) {
      int64_t kvh = head / (H / KV);
      auto qh = q.narrow(1, head * D, D), kh = k.narrow(1, kvh * D, D);
      if (c.model_type == "qwen3") {  // per-head RMSNorm of q and k, before RoPE
        qh = rms(qh, p[pre + "self_attn.q_norm.weight"]);
        kh = rms(kh, p[pre + "self_attn.k_norm.weight"]);
      }
      qh = rope(qh);
      kh = rope(kh);
      auto vh = v.narrow(1, kvh * D, D);
      auto scores = torch::matmul(qh, kh.t()) / std::sqrt(static_cast<double>(D));
      auto mask = torch::ones({T, T}, torch::kBool).triu(1);
      heads.push_back(torch::matmul(torch::softmax(scores.masked_fill(mask, -1e30), -1), vh));
    }
    h = h + linear(torch::cat(heads, 1), pre + "self_attn.o_proj", false);
    auto y = rms(h, p[pre + "post_attention_layernorm.weight"]);
    auto gate = linear(y, pre + "mlp.gate_proj", false), up = linear(y, pre + "mlp.up_proj", false);
    h = h + linear(gate * torch::sigmoid(gate) * up, pre + "mlp.down_proj", false);
  }
  h = rms(h, p["model.norm.weight"]);
  auto out_w = c.tie_word_embeddings ? p["model.embed_tokens.weight"] : p["lm_head.weight"];
  return torch::matmul(h, out_w.t()).unsqueeze(0);
}

TEST_P(TransformerTest, MatchesNaiveReference) {
  torch::NoGradGuard g;
  auto tokens = RandomTokens(1, 10, config_.vocab_size, 5);
  auto got = model_->Forward(tokens);
  auto want = NaiveForward(*model_, config_, tokens);
  EXPECT_TRUE(torch::allclose(got, want, 1e-4, 1e-4)) << (got - want).abs().max().item<float>();
}

INSTANTIATE_TEST_SUITE_P(Variants, TransformerTest,
                         ::testing::Values(Variant{true, false, 2}, Variant{false, true, 4}, Variant{false, false, 1},
                                           // Qwen3: q/k head norms, head_dim 16 != hidden 32 / 4 heads.
                                           Variant{true, false, 2, "qwen3", 16},
                                           // Llama 3.1/3.2: rope_scaling llama3.
                                           Variant{false, false, 2, "llama", 0, true}),
                         [](const auto& info) {
                           return std::string(info.param.model_type == "qwen3" ? "Qwen3" : "") +
                                  (info.param.llama3_rope ? "Llama3Rope" : "") + (info.param.tied ? "Tied" : "Untied") +
                                  (info.param.bias ? "Bias" : "") + "Kv" + std::to_string(info.param.kv_heads);
                         });

TEST(TransformerInit, SameSeedSameWeightsDifferentSeedDifferent) {
  ModelConfig c = SmallConfig(Variant{true, false, 2});
  Transformer a(c, 1), b(c, 1), d(c, 2);
  auto pa = a.named_parameters(), pb = b.named_parameters(), pd = d.named_parameters();
  for (const auto& p : pa) EXPECT_TRUE(torch::equal(p.value(), pb[p.key()])) << p.key();
  EXPECT_FALSE(torch::equal(pa["model.embed_tokens.weight"], pd["model.embed_tokens.weight"]));
}

// The small-batch linear kernels against BLAS (AVX2, and AVX-512 where the CPU
// has it): row and output counts off their blockings (2x4, 4x6), inputs off
// their 8- and 16-lane chunks, with and without bias, into a wider output
// (ldy); and a row's result is bit-identical whichever rows it is computed
// with (no dependence on the decode batch).
TEST(SmallLinearTest, MatchesBlasAndEachRowIsIndependentOfTheBatch) {
  const bool had_avx512 = SmallLinearAvx512();
  for (bool avx512 : {false, true}) {
    SetSmallLinearAvx512(avx512);
    if (avx512 && !SmallLinearAvx512()) continue;  // this CPU has no AVX-512
    torch::manual_seed(3);
    for (int64_t in : {5, 8, 37, 256}) {
      for (int64_t outs : {1, 3, 4, 6, 9, 13}) {
        for (int64_t rows : {1, 2, 3, 4, 5, 9}) {
          auto x = torch::randn({rows, in}), w = torch::randn({outs, in}), bias = torch::randn({outs});
          const int64_t ldy = outs + 2;
          auto y = torch::full({rows, ldy}, 7.0f);
          SmallLinear(x.data_ptr<float>(), w.data_ptr<float>(), bias.data_ptr<float>(), y.data_ptr<float>(), rows, in,
                      outs, ldy);
          auto want = torch::nn::functional::linear(x, w, bias);
          const std::string where = (avx512 ? "avx512 " : "avx2 ") + std::to_string(in) + " " + std::to_string(outs) +
                                    " " + std::to_string(rows);
          EXPECT_TRUE(torch::allclose(y.narrow(1, 0, outs), want, 1e-4, 1e-4)) << where;
          EXPECT_TRUE(torch::all(y.narrow(1, outs, 2) == 7.0f).item<bool>()) << "wrote past outs: " << where;
          auto alone = torch::empty({1, outs});
          SmallLinear(x[rows - 1].data_ptr<float>(), w.data_ptr<float>(), nullptr, alone.data_ptr<float>(), 1, in, outs,
                      outs);
          auto batched = torch::empty({rows, outs});
          SmallLinear(x.data_ptr<float>(), w.data_ptr<float>(), nullptr, batched.data_ptr<float>(), rows, in, outs,
                      outs);
          EXPECT_TRUE(torch::equal(alone[0], batched[rows - 1])) << where;
        }
      }
    }
  }
  SetSmallLinearAvx512(had_avx512);
}

// bfloat16 weights: exactly SmallLinear on the same weights widened to
// float32 (the widening is exact and the sums run in the same order), in both
// kernels, across the blockings and the 8/16-lane tails.
TEST(SmallLinearTest, Bf16WeightsGiveExactlyTheFloat32ResultOfTheWidenedWeights) {
  const bool had_avx512 = SmallLinearAvx512();
  for (bool avx512 : {false, true}) {
    SetSmallLinearAvx512(avx512);
    if (avx512 && !SmallLinearAvx512()) continue;  // this CPU has no AVX-512
    torch::manual_seed(4);
    for (int64_t in : {5, 8, 23, 37, 256}) {
      for (int64_t outs : {1, 4, 6, 13}) {
        for (int64_t rows : {1, 2, 3, 5, 9}) {
          auto x = torch::randn({rows, in}), bias = torch::randn({outs});
          auto w16 = torch::randn({outs, in}).to(torch::kBFloat16);
          auto w32 = w16.to(torch::kFloat32);
          auto got = torch::empty({rows, outs}), want = torch::empty({rows, outs});
          SmallLinearBf16(x.data_ptr<float>(), static_cast<const uint16_t*>(w16.data_ptr()), bias.data_ptr<float>(),
                          got.data_ptr<float>(), rows, in, outs, outs);
          SmallLinear(x.data_ptr<float>(), w32.data_ptr<float>(), bias.data_ptr<float>(), want.data_ptr<float>(), rows,
                      in, outs, outs);
          EXPECT_TRUE(torch::equal(got, want)) << (avx512 ? "avx512 " : "avx2 ") << in << " " << outs << " " << rows;
        }
      }
    }
  }
  SetSmallLinearAvx512(had_avx512);
}

// The decode attention kernel against softmax(q k^T / sqrt(D)) v in libtorch:
// contexts of 1 to 77 positions (8-lane chunks and tails), grouped heads,
// scores spread wide enough to exercise the exponential's range.
TEST(DecodeAttentionTest, MatchesSoftmaxAttentionOverEachRowsOwnContext) {
  if (!DecodeAttentionApplies(32)) GTEST_SKIP() << "no AVX2/FMA on this CPU";
  torch::manual_seed(5);
  // Head sizes of 4 and 9 8-lane chunks (the values are summed 8 chunks at a time).
  for (int64_t D : {32, 72}) {
    for (int64_t kv : {1, 2, 4}) {
      const int64_t H = 4, slots = 3, max_len = 80;
      auto keys = torch::randn({slots, kv, max_len, D}) * 3, values = torch::randn({slots, kv, max_len, D});
      auto q = torch::randn({4, H, D}) * 3;
      const std::vector<int64_t> slot = {2, 0, 1, 2}, len = {77, 1, 8, 9};
      auto out = torch::empty({4, H, D});
      const double scale = 1 / std::sqrt(static_cast<double>(D));
      const DecodeAttentionShape shape{H, kv, D, max_len, static_cast<float>(scale)};
      DecodeAttention(q.data_ptr<float>(), keys.data_ptr<float>(), values.data_ptr<float>(), slot.data(), len.data(),
                      out.data_ptr<float>(), shape, 0, 4);
      for (int64_t r = 0; r < 4; ++r) {
        for (int64_t h = 0; h < H; ++h) {
          auto k = keys[slot[r]][h / (H / kv)].narrow(0, 0, len[r]);
          auto v = values[slot[r]][h / (H / kv)].narrow(0, 0, len[r]);
          auto want = torch::softmax(torch::mv(k, q[r][h]) * scale, 0).matmul(v);
          EXPECT_TRUE(torch::allclose(out[r][h], want, 1e-5, 1e-5))
              << "D " << D << " kv " << kv << " row " << r << " head " << h;
        }
      }
    }
  }
}

}  // namespace
}  // namespace sluice::model
