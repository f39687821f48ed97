#include "sluice/model/transformer.h"

#include <ATen/CPUGeneratorImpl.h>

#include <string>

#include "decode_kernels.h"
#include "sluice/common/check.h"

namespace sluice::model {
namespace {

namespace F = torch::nn::functional;
using torch::indexing::Slice;

// HF "rotate_half": (x1, x2) -> (-x2, x1) over the two halves of head_dim.
torch::Tensor RotateHalf(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// x: [..., heads, D]; cos/sin broadcast over the heads dimension.
torch::Tensor ApplyRope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  return x * cos + RotateHalf(x) * sin;
}

// Llama 3.1's rope_scaling: frequencies whose wavelength is longer than the
// pretraining context / low_freq_factor are divided by `factor`, those
// shorter than context / high_freq_factor kept, and those between blended
// linearly in context / wavelength.
torch::Tensor Llama3Frequencies(const torch::Tensor& inv_freq, const RopeScaling& r) {
  const double context = static_cast<double>(r.original_max_position_embeddings);
  const auto wavelength = 2 * M_PI / inv_freq;
  const auto slowed = inv_freq / r.factor;
  const auto blend = ((context / wavelength) - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
  const auto medium = (1 - blend) * slowed + blend * inv_freq;
  return torch::where(wavelength > context / r.low_freq_factor, slowed,
                      torch::where(wavelength < context / r.high_freq_factor, inv_freq, medium));
}

torch::nn::Linear MakeLinear(int64_t in, int64_t out, bool bias) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

// Whether the elementwise kernels apply: the cached path's packed [N, ...]
// float32 CPU tensors outside autograd (training and full-sequence passes
// keep libtorch's operations).
bool ElementwiseKernelsApply(const torch::Tensor& x, int64_t packed_dims) {
  return x.dim() == packed_dims && x.is_cpu() && x.scalar_type() == torch::kFloat32 && x.is_contiguous() &&
         !torch::GradMode::is_enabled() && DecodeKernelsEnabled();
}

// x [rows, in] * w[out, in]^T (+ bias): a few float32 CPU rows outside
// autograd (the decode path) go to SmallLinear (SmallLinearBf16 for bfloat16
// weights), split by output rows over the intra-op threads; everything else
// to BLAS through F::linear, weights stored narrower than x widened first.
torch::Tensor Project(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias) {
  const bool bf16 = w.scalar_type() == torch::kBFloat16;
  const int64_t max_rows = bf16 ? kSmallLinearBf16MaxRows : SmallLinearMaxRows();
  const bool small = ElementwiseKernelsApply(x, 2) && x.size(0) > 0 && x.size(0) <= max_rows && w.is_cpu() &&
                     (w.scalar_type() == torch::kFloat32 || bf16) &&
                     (!bias.defined() || bias.scalar_type() == torch::kFloat32) && DecodeKernelsSupported();
  if (!small) {
    if (w.scalar_type() == x.scalar_type()) return F::linear(x, w, bias);
    return F::linear(x, w.to(x.scalar_type()), bias.defined() ? bias.to(x.scalar_type()) : bias);
  }
  SLUICE_CHECK(w.dim() == 2 && w.size(1) == x.size(1)) << "linear: input " << x.sizes() << ", weight " << w.sizes();
  const auto wc = w.contiguous();  // x is contiguous (ElementwiseKernelsApply)
  const auto bc = bias.defined() ? bias.contiguous() : bias;
  const int64_t rows = x.size(0), in = x.size(1), outs = wc.size(0);
  auto y = torch::empty({rows, outs}, x.options());
  const float* xp = x.data_ptr<float>();
  const void* wp = wc.data_ptr();
  const float* bp = bc.defined() ? bc.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  // Blocks of output rows; a thread takes at least ~64k multiply-adds.
  constexpr int64_t kBlock = kSmallLinearOutputBlock;
  const int64_t blocks = (outs + kBlock - 1) / kBlock;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / (kBlock * rows * in));
  at::parallel_for(0, blocks, grain, [&](int64_t b, int64_t e) {
    const int64_t o = kBlock * b, n = std::min(kBlock * e, outs) - o;
    const float* bo = bp != nullptr ? bp + o : nullptr;
    if (bf16) {
      SmallLinearBf16(xp, static_cast<const uint16_t*>(wp) + o * in, bo, yp + o, rows, in, n, outs);
    } else {
      SmallLinear(xp, static_cast<const float*>(wp) + o * in, bo, yp + o, rows, in, n, outs);
    }
  });
  return y;
}

torch::Tensor Project(const torch::nn::Linear& layer, const torch::Tensor& x) {
  return Project(x, layer->weight, layer->bias);
}

// Cached path: x [N, heads, D] fresh from a projection; cos/sin [N, 1, D].
torch::Tensor RopePacked(torch::Tensor x, const torch::Tensor& cos, const torch::Tensor& sin) {
  if (!ElementwiseKernelsApply(x, 3) || cos.scalar_type() != torch::kFloat32) {
    return ApplyRope(x, cos, sin);
  }
  const auto c = cos.contiguous(), s = sin.contiguous();
  RopeRows(x.data_ptr<float>(), c.data_ptr<float>(), s.data_ptr<float>(), x.size(0), x.size(1), x.size(2));
  return x;
}

}  // namespace

KvCache KvCache::Allocate(const ModelConfig& config, int64_t num_slots, int64_t max_len, torch::Device device,
                          torch::Dtype dtype) {
  KvCache cache;
  cache.num_slots = num_slots;
  cache.max_len = max_len;
  auto opts = torch::TensorOptions().device(device).dtype(dtype);
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    cache.keys.push_back(
        torch::zeros({num_slots, config.num_key_value_heads, max_len, config.resolved_head_dim()}, opts));
    cache.values.push_back(torch::zeros_like(cache.keys.back()));
  }
  return cache;
}

RmsNorm::RmsNorm(int64_t dim, double eps) : eps_(eps) { weight_ = register_parameter("weight", torch::ones({dim})); }

torch::Tensor RmsNorm::Forward(const torch::Tensor& x) {
  if (ElementwiseKernelsApply(x, 2) && weight_.scalar_type() == torch::kFloat32) {
    auto y = torch::empty_like(x);
    RmsNormRows(x.data_ptr<float>(), weight_.data_ptr<float>(), static_cast<float>(eps_), y.data_ptr<float>(),
                x.size(0), x.size(1));
    return y;
  }
  auto xf = x.to(torch::kFloat32);
  auto normed = xf * torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  return weight_ * normed.to(x.scalar_type());
}

Attention::Attention(const ModelConfig& c)
    : num_heads_(c.num_attention_heads), num_kv_heads_(c.num_key_value_heads), head_dim_(c.resolved_head_dim()) {
  q_proj_ = register_module("q_proj", MakeLinear(c.hidden_size, num_heads_ * head_dim_, c.attention_bias));
  k_proj_ = register_module("k_proj", MakeLinear(c.hidden_size, num_kv_heads_ * head_dim_, c.attention_bias));
  v_proj_ = register_module("v_proj", MakeLinear(c.hidden_size, num_kv_heads_ * head_dim_, c.attention_bias));
  o_proj_ = register_module("o_proj", MakeLinear(num_heads_ * head_dim_, c.hidden_size, false));
  if (c.qk_norm()) {
    q_norm_ = register_module("q_norm", std::make_shared<RmsNorm>(head_dim_, c.rms_norm_eps));
    k_norm_ = register_module("k_norm", std::make_shared<RmsNorm>(head_dim_, c.rms_norm_eps));
  }
}

torch::Tensor Attention::HeadNorm(const std::shared_ptr<RmsNorm>& norm, torch::Tensor x) const {
  if (!norm) return x;
  const auto shape = x.sizes().vec();
  return norm->Forward(x.reshape({-1, head_dim_})).view(shape);
}

namespace {

// q: [B, T, H, D]; keys/values: [B, KV, L, D]; allowed: [B or 1, T, L].
// Returns [B, T, H * D]. Query heads are grouped by the kv head they share
// (head h uses kv head h / (H / KV)), so keys and values are never repeated.
torch::Tensor Attend(const torch::Tensor& q, const torch::Tensor& keys, const torch::Tensor& values,
                     const torch::Tensor& allowed) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), D = q.size(3);
  const int64_t KV = keys.size(1), L = keys.size(2), rep = H / KV;
  auto qg = q.view({B, T, KV, rep, D}).permute({0, 2, 3, 1, 4}).reshape({B, KV, rep * T, D});
  auto scores = torch::matmul(qg, keys.transpose(2, 3)).mul_(1.0 / std::sqrt(static_cast<double>(D)));
  auto masked =
      scores.view({B, KV, rep, T, L})
          .masked_fill(allowed.logical_not().unsqueeze(1).unsqueeze(1), -std::numeric_limits<float>::infinity());
  auto probs = torch::softmax(masked.to(torch::kFloat32), -1).to(q.scalar_type()).view({B, KV, rep * T, L});
  return torch::matmul(probs, values)  // [B, KV, rep*T, D]
      .view({B, KV, rep, T, D})
      .permute({0, 3, 1, 2, 4})
      .reshape({B, T, H * D});
}

}  // namespace

torch::Tensor Attention::Forward(const torch::Tensor& x, const AttentionContext& ctx, int64_t layer) {
  if (ctx.cache == nullptr) {
    const int64_t B = x.size(0), T = x.size(1);
    auto q = ApplyRope(HeadNorm(q_norm_, Project(q_proj_, x).view({B, T, num_heads_, head_dim_})), ctx.cos, ctx.sin);
    auto k = ApplyRope(HeadNorm(k_norm_, Project(k_proj_, x).view({B, T, num_kv_heads_, head_dim_})), ctx.cos, ctx.sin);
    auto v = Project(v_proj_, x).view({B, T, num_kv_heads_, head_dim_});
    return Project(o_proj_, Attend(q, k.permute({0, 2, 1, 3}), v.permute({0, 2, 1, 3}), ctx.causal));
  }
  const int64_t N = x.size(0);
  // Packed tokens: [N, heads, D]; rope tables are [N, D].
  auto q = RopePacked(HeadNorm(q_norm_, Project(q_proj_, x).view({N, num_heads_, head_dim_})), ctx.cos, ctx.sin);
  auto k = RopePacked(HeadNorm(k_norm_, Project(k_proj_, x).view({N, num_kv_heads_, head_dim_})), ctx.cos, ctx.sin);
  auto v = Project(v_proj_, x).view({N, num_kv_heads_, head_dim_});
  torch::Tensor& ck = ctx.cache->keys[layer];
  torch::Tensor& cv = ctx.cache->values[layer];
  // Advanced indices around a slice: the indexed view is [N, kv, D], k's own layout.
  ck.index_put_({ctx.cache_rows, Slice(), ctx.cache_positions}, k.to(ck.scalar_type()));
  cv.index_put_({ctx.cache_rows, Slice(), ctx.cache_positions}, v.to(cv.scalar_type()));
  std::vector<torch::Tensor> outs;
  outs.reserve(ctx.blocks.size());
  for (const BlockAttention& b : ctx.blocks) {
    if (b.per_row) {
      auto qb = q.narrow(0, b.token_offset, b.rows).contiguous();
      auto out = torch::empty({b.rows, num_heads_ * head_dim_}, qb.options());
      const DecodeAttentionShape shape{num_heads_, num_kv_heads_, head_dim_, ck.size(2),
                                       static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim_)))};
      const float* qp = qb.data_ptr<float>();
      const float* kp = ck.data_ptr<float>();
      const float* vp = cv.data_ptr<float>();
      float* op = out.data_ptr<float>();
      at::parallel_for(0, b.rows, 1, [&](int64_t begin, int64_t end) {
        DecodeAttention(qp, kp, vp, b.row_slots.data(), b.row_lens.data(), op, shape, begin, end);
      });
      outs.push_back(std::move(out));
      continue;
    }
    torch::Tensor keys, values;  // [rows, kv, L, D]
    if (b.slot_begin >= 0) {
      keys = ck.narrow(0, b.slot_begin, b.rows).narrow(2, 0, b.attend_len);
      values = cv.narrow(0, b.slot_begin, b.rows).narrow(2, 0, b.attend_len);
    } else {
      // Narrow first: the gather copies the attended positions only.
      keys = ck.narrow(2, 0, b.attend_len).index_select(0, b.slots);
      values = cv.narrow(2, 0, b.attend_len).index_select(0, b.slots);
    }
    auto qb = q.narrow(0, b.token_offset, b.rows * b.length).view({b.rows, b.length, num_heads_, head_dim_});
    outs.push_back(Attend(qb, keys.to(x.scalar_type()), values.to(x.scalar_type()), b.allowed)
                       .view({b.rows * b.length, num_heads_ * head_dim_}));
  }
  return Project(o_proj_, outs.size() == 1 ? outs[0] : torch::cat(outs, 0));
}

Mlp::Mlp(const ModelConfig& c) {
  gate_proj_ = register_module("gate_proj", MakeLinear(c.hidden_size, c.intermediate_size, false));
  up_proj_ = register_module("up_proj", MakeLinear(c.hidden_size, c.intermediate_size, false));
  down_proj_ = register_module("down_proj", MakeLinear(c.intermediate_size, c.hidden_size, false));
}

torch::Tensor Mlp::Forward(const torch::Tensor& x) {
  auto gate = Project(gate_proj_, x), up = Project(up_proj_, x);
  if (ElementwiseKernelsApply(gate, 2) && ElementwiseKernelsApply(up, 2)) {
    SiluMulInPlace(gate.data_ptr<float>(), up.data_ptr<float>(), gate.numel());
    return Project(down_proj_, gate);
  }
  return Project(down_proj_, F::silu(gate) * up);
}

DecoderLayer::DecoderLayer(const ModelConfig& c) {
  input_layernorm_ = register_module("input_layernorm", std::make_shared<RmsNorm>(c.hidden_size, c.rms_norm_eps));
  self_attn_ = register_module("self_attn", std::make_shared<Attention>(c));
  post_attention_layernorm_ =
      register_module("post_attention_layernorm", std::make_shared<RmsNorm>(c.hidden_size, c.rms_norm_eps));
  mlp_ = register_module("mlp", std::make_shared<Mlp>(c));
}

torch::Tensor DecoderLayer::Forward(const torch::Tensor& x, const AttentionContext& ctx, int64_t layer) {
  auto h = x + self_attn_->Forward(input_layernorm_->Forward(x), ctx, layer);
  return h + mlp_->Forward(post_attention_layernorm_->Forward(h));
}

DecoderStack::DecoderStack(const ModelConfig& c) {
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(c.vocab_size, c.hidden_size));
  // Module names may not contain dots: a holder named "layers" with children
  // "0", "1", ... yields the HF names "layers.<i>.".
  auto holder = register_module("layers", std::make_shared<torch::nn::Module>());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    layers.push_back(holder->register_module(std::to_string(i), std::make_shared<DecoderLayer>(c)));
  }
  norm = register_module("norm", std::make_shared<RmsNorm>(c.hidden_size, c.rms_norm_eps));
}

Transformer::Transformer(const ModelConfig& config, uint64_t seed) : config_(config) {
  SLUICE_CHECK_OK(config_.Validate());
  model_ = register_module("model", std::make_shared<DecoderStack>(config_));
  if (!config_.tie_word_embeddings) {
    lm_head_ = register_module("lm_head", MakeLinear(config_.hidden_size, config_.vocab_size, false));
  }
  torch::NoGradGuard no_grad;
  auto gen = at::detail::createCPUGenerator(seed);
  for (auto& p : named_parameters()) {
    const std::string& name = p.key();
    torch::Tensor& t = p.value();
    if (name.ends_with("norm.weight")) {
      t.fill_(1.0);
    } else if (name.ends_with(".bias")) {
      t.zero_();
    } else {
      t.normal_(0.0, 0.02, gen);
    }
  }
  // Rotary tables, as HF computes them: inv_freq_i = theta^(-2i/D), angle = pos * inv_freq.
  const int64_t D = config_.resolved_head_dim();
  auto inv_freq = torch::pow(config_.rope_theta, -torch::arange(0, D, 2, torch::kFloat64) / static_cast<double>(D));
  if (config_.rope_scaling.type == "llama3") inv_freq = Llama3Frequencies(inv_freq, config_.rope_scaling);
  auto pos = torch::arange(config_.max_position_embeddings, torch::kFloat64);
  auto angles = torch::outer(pos, inv_freq);
  auto emb = torch::cat({angles, angles}, -1);
  rope_cos_ = register_buffer("rope_cos", emb.cos().to(torch::kFloat32));
  rope_sin_ = register_buffer("rope_sin", emb.sin().to(torch::kFloat32));
}

torch::Tensor Transformer::output_weight() const {
  return config_.tie_word_embeddings ? model_->embed_tokens->weight : lm_head_->weight;
}

torch::Tensor Transformer::Hidden(const torch::Tensor& tokens, const torch::Tensor& positions, AttentionContext& ctx) {
  const int64_t D = config_.resolved_head_dim();
  std::vector<int64_t> table_shape(positions.sizes().begin(), positions.sizes().end());
  table_shape.push_back(D);
  auto flat = positions.reshape({-1});
  ctx.cos = rope_cos_.index_select(0, flat).view(table_shape);
  ctx.sin = rope_sin_.index_select(0, flat).view(table_shape);
  if (ctx.cache != nullptr) {  // packed layout [N, heads, D] broadcasts over heads
    ctx.cos = ctx.cos.unsqueeze(-2);
    ctx.sin = ctx.sin.unsqueeze(-2);
  } else {  // [B, T, heads, D]
    ctx.cos = ctx.cos.unsqueeze(2);
    ctx.sin = ctx.sin.unsqueeze(2);
  }
  auto h = model_->embed_tokens->forward(tokens);
  const torch::ScalarType compute = compute_dtype();
  if (h.scalar_type() != compute) h = h.to(compute);  // bfloat16 matrices computed in float32
  if (compute != ctx.cos.scalar_type()) {             // a bfloat16 model: rotate in its dtype, as HF does
    ctx.cos = ctx.cos.to(compute);
    ctx.sin = ctx.sin.to(compute);
  }
  for (size_t i = 0; i < model_->layers.size(); ++i) h = model_->layers[i]->Forward(h, ctx, static_cast<int64_t>(i));
  return model_->norm->Forward(h);
}

torch::Tensor Transformer::Logits(const torch::Tensor& hidden) {
  if (hidden.dim() == 2) return Project(hidden, output_weight(), {}).to(torch::kFloat32);
  return torch::matmul(hidden, output_weight().to(hidden.scalar_type()).t()).to(torch::kFloat32);
}

torch::Tensor Transformer::Forward(const torch::Tensor& tokens) {
  SLUICE_CHECK_EQ(tokens.dim(), 2);
  const int64_t T = tokens.size(1);
  SLUICE_CHECK_LE(T, config_.max_position_embeddings);
  auto device = tokens.device();
  auto positions =
      torch::arange(T, torch::TensorOptions().dtype(torch::kInt64).device(device)).unsqueeze(0).expand(tokens.sizes());
  AttentionContext ctx;
  ctx.causal = torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(device)).tril().unsqueeze(0);
  return Logits(Hidden(tokens, positions, ctx));
}

torch::Tensor Transformer::ForwardBlocks(const torch::Tensor& tokens, const std::vector<CachedBlock>& blocks,
                                         KvCache* cache, bool last_only) {
  SLUICE_CHECK(cache != nullptr);
  SLUICE_CHECK_EQ(tokens.dim(), 1);
  const int64_t limit = std::min(cache->max_len, config_.max_position_embeddings);
  auto device = tokens.device();
  auto i64 = torch::TensorOptions().dtype(torch::kInt64);
  // Host-side geometry: per-token cache rows/positions, per-block masks.
  std::vector<int64_t> rows, positions, last;
  std::vector<bool> used(cache->num_slots, false);
  AttentionContext ctx;
  ctx.cache = cache;
  const bool in_place = AttendsDecodeRowsInPlace() && cache->keys.front().scalar_type() == torch::kFloat32 &&
                        cache->keys.front().is_cpu() && cache->keys.front().is_contiguous() &&
                        cache->values.front().is_contiguous();
  int64_t offset = 0;
  for (const CachedBlock& block : blocks) {
    const int64_t B = static_cast<int64_t>(block.slots.size()), T = block.length;
    SLUICE_CHECK_EQ(static_cast<int64_t>(block.starts.size()), B);
    SLUICE_CHECK(T >= 1 && B >= 1) << "empty block";
    BlockAttention attn;
    attn.token_offset = offset;
    attn.rows = B;
    attn.length = T;
    int64_t max_start = 0;
    bool consecutive = true;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t slot = block.slots[b], start = block.starts[b];
      SLUICE_CHECK(slot >= 0 && slot < cache->num_slots) << "slot " << slot;
      SLUICE_CHECK(!used[slot]) << "slot " << slot << " appears twice in one pass";
      used[slot] = true;
      SLUICE_CHECK(start >= 0 && start + T <= limit) << "start " << start << " + " << T << " > " << limit;
      max_start = std::max(max_start, start);
      consecutive = consecutive && slot == block.slots[0] + b;
      for (int64_t t = 0; t < T; ++t) {
        rows.push_back(slot);
        positions.push_back(start + t);
      }
      last.push_back(offset + (b + 1) * T - 1);
    }
    attn.attend_len = max_start + T;
    if (T == 1 && in_place) {
      attn.per_row = true;
      attn.row_slots = block.slots;
      for (int64_t start : block.starts) attn.row_lens.push_back(start + 1);
      ctx.blocks.push_back(std::move(attn));
      offset += B;
      continue;
    }
    attn.slot_begin = consecutive ? block.slots[0] : -1;
    attn.slots = torch::tensor(block.slots, i64).to(device);
    auto starts = torch::tensor(block.starts, i64).to(device);
    auto query_pos = starts.unsqueeze(1) + torch::arange(T, i64.device(device)).unsqueeze(0);  // [B, T]
    auto key_pos = torch::arange(attn.attend_len, i64.device(device)).view({1, 1, attn.attend_len});
    attn.allowed = key_pos <= query_pos.unsqueeze(2);  // [B, T, L]
    ctx.blocks.push_back(std::move(attn));
    offset += B * T;
  }
  SLUICE_CHECK_EQ(tokens.size(0), offset);
  ctx.cache_rows = torch::tensor(rows, i64).to(device);
  ctx.cache_positions = torch::tensor(positions, i64).to(device);
  auto hidden = Hidden(tokens, ctx.cache_positions, ctx);  // [N, hidden]
  if (last_only) hidden = hidden.index_select(0, torch::tensor(last, i64).to(device));
  return Logits(hidden);
}

bool Transformer::AttendsDecodeRowsInPlace() const {
  return model_->embed_tokens->weight.is_cpu() && compute_dtype() == torch::kFloat32 &&
         !torch::GradMode::is_enabled() && DecodeAttentionApplies(config_.resolved_head_dim());
}

torch::ScalarType Transformer::compute_dtype() const { return model_->norm->weight().scalar_type(); }

torch::Tensor Transformer::ForwardCached(const torch::Tensor& tokens, const std::vector<int64_t>& slots,
                                         const std::vector<int64_t>& starts, KvCache* cache) {
  SLUICE_CHECK_EQ(tokens.dim(), 2);
  const int64_t B = tokens.size(0), T = tokens.size(1);
  auto logits = ForwardBlocks(tokens.reshape({-1}), {CachedBlock{slots, starts, T}}, cache, /*last_only=*/false);
  return logits.view({B, T, -1});
}

}  // namespace sluice::model
