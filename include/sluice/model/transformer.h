// A decoder-only transformer with the Llama / Qwen2 architecture: RMSNorm,
// rotary position embeddings (rope_theta), SwiGLU MLP, grouped-query
// attention, optional tied embeddings and q/k/v biases. Parameter names are
// the Hugging Face names ("model.layers.0.self_attn.q_proj.weight", ...), so
// named_parameters() is the checkpoint's state dict.
//
// Two entry points share one attention implementation:
//  * Forward(tokens) — full causal forward over a right-padded batch
//    (training, scoring, reference logits);
//  * ForwardCached(tokens, slots, starts, cache) — incremental forward that
//    writes keys/values into a preallocated KvCache at each row's positions
//    and attends over that row's cached prefix (prefill and decode).
//
// Thread safety: a Transformer may run concurrent forwards under NoGradGuard
// when each uses its own KvCache; mutating the weights (optimizer step, load)
// needs exclusive access. The rollout engine never mutates a model it serves:
// it swaps whole models at step boundaries.
#ifndef SLUICE_MODEL_TRANSFORMER_H_
#define SLUICE_MODEL_TRANSFORMER_H_

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "sluice/model/config.h"

namespace sluice::model {

// Keys and values for `num_slots` sequences of up to `max_len` positions,
// allocated once: per layer [num_slots, num_kv_heads, max_len, head_dim]. The
// layout lets a contiguous range of slots be attended as a strided view
// (no per-step gather); see ForwardCached.
struct KvCache {
  std::vector<torch::Tensor> keys;
  std::vector<torch::Tensor> values;
  int64_t num_slots = 0;
  int64_t max_len = 0;

  static KvCache Allocate(const ModelConfig& config, int64_t num_slots, int64_t max_len, torch::Device device,
                          torch::Dtype dtype = torch::kFloat32);
};

class RmsNorm : public torch::nn::Module {
 public:
  RmsNorm(int64_t dim, double eps);
  torch::Tensor Forward(const torch::Tensor& x);

 private:
  torch::Tensor weight_;
  double eps_;
};

// What one forward pass shares across layers (built once per pass).
struct AttentionContext {
  torch::Tensor cos, sin;   // [B, T, head_dim]
  torch::Tensor allowed;    // [B or 1, T, L] bool: query t may attend key j
  KvCache* cache = nullptr; // null: keys are this pass's own tokens
  torch::Tensor rows;       // [B, T] cache row of each token
  torch::Tensor positions;  // [B, T] cache position of each token
  torch::Tensor slots;      // [B] cache rows (gathered when not a range)
  int64_t slot_begin = -1;  // >= 0: slots are slot_begin.. slot_begin+B-1
  int64_t attend_len = 0;   // L
};

class Attention : public torch::nn::Module {
 public:
  explicit Attention(const ModelConfig& config);
  // x: [B, T, hidden]. With a cache, this pass's keys/values are written at
  // (rows, positions) of cache layer `layer` before attending.
  torch::Tensor Forward(const torch::Tensor& x, const AttentionContext& ctx, int64_t layer);

 private:
  int64_t num_heads_, num_kv_heads_, head_dim_;
  torch::nn::Linear q_proj_{nullptr}, k_proj_{nullptr}, v_proj_{nullptr}, o_proj_{nullptr};
};

class Mlp : public torch::nn::Module {
 public:
  explicit Mlp(const ModelConfig& config);
  torch::Tensor Forward(const torch::Tensor& x);

 private:
  torch::nn::Linear gate_proj_{nullptr}, up_proj_{nullptr}, down_proj_{nullptr};
};

class DecoderLayer : public torch::nn::Module {
 public:
  explicit DecoderLayer(const ModelConfig& config);
  torch::Tensor Forward(const torch::Tensor& x, const AttentionContext& ctx, int64_t layer);

 private:
  std::shared_ptr<RmsNorm> input_layernorm_, post_attention_layernorm_;
  std::shared_ptr<Attention> self_attn_;
  std::shared_ptr<Mlp> mlp_;
};

// The "model." prefix of the Hugging Face names.
class DecoderStack : public torch::nn::Module {
 public:
  explicit DecoderStack(const ModelConfig& config);
  torch::nn::Embedding embed_tokens{nullptr};
  std::vector<std::shared_ptr<DecoderLayer>> layers;
  std::shared_ptr<RmsNorm> norm;
};

class Transformer : public torch::nn::Module {
 public:
  // Parameters are initialized as Hugging Face does (normal(0, 0.02) for
  // projections and embeddings, ones for norms, zeros for biases) from `seed`.
  Transformer(const ModelConfig& config, uint64_t seed);

  const ModelConfig& config() const { return config_; }

  // tokens: [B, T] int64, right-padded; positions are 0..T-1 for every row.
  // Returns logits [B, T, vocab] (float32).
  torch::Tensor Forward(const torch::Tensor& tokens);

  // tokens: [B, T] int64; slots[b], starts[b]: cache row and first position
  // of row b. Preconditions (checked): starts[b] + T <= min(cache->max_len,
  // max_position_embeddings), slots distinct and < cache->num_slots; the
  // cache already holds positions [0, starts[b]) of each row. When the slots
  // are consecutive the cache is read in place, otherwise gathered.
  // Returns logits [B, T, vocab].
  torch::Tensor ForwardCached(const torch::Tensor& tokens, const std::vector<int64_t>& slots,
                              const std::vector<int64_t>& starts, KvCache* cache);

  // The output projection ([vocab, hidden]); the embedding when tied.
  torch::Tensor output_weight() const;

 private:
  torch::Tensor Run(const torch::Tensor& tokens, const torch::Tensor& positions, AttentionContext& ctx);

  ModelConfig config_;
  std::shared_ptr<DecoderStack> model_;
  torch::nn::Linear lm_head_{nullptr};
  torch::Tensor rope_cos_, rope_sin_;  // [max_position_embeddings, head_dim]
};

}  // namespace sluice::model

#endif  // SLUICE_MODEL_TRANSFORMER_H_
