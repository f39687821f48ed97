// A decoder-only transformer with the Llama / Qwen2 architecture: RMSNorm,
// rotary position embeddings (rope_theta), SwiGLU MLP, grouped-query
// attention, optional tied embeddings and q/k/v biases. Parameter names are
// the Hugging Face names ("model.layers.0.self_attn.q_proj.weight", ...), so
// named_parameters() is the checkpoint's state dict.
//
// Two entry points share one attention implementation:
//  * Forward(tokens) — full causal forward over a right-padded batch
//    (training, scoring, reference logits);
//  * ForwardBlocks(tokens, blocks, cache) — incremental forward that writes
//    keys/values into a preallocated KvCache at each row's positions and
//    attends over that row's cached prefix; prefills and decodes of many
//    sequences share one pass.
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
  const torch::Tensor& weight() const { return weight_; }

 private:
  torch::Tensor weight_;
  double eps_;
};

// One rectangular block of a cached forward pass: `slots.size()` sequences,
// each feeding `length` new tokens starting at its position starts[i].
// A decode step is one block of length 1; a prompt prefill is a block of one
// sequence of the prompt's length.
struct CachedBlock {
  std::vector<int64_t> slots;
  std::vector<int64_t> starts;
  int64_t length = 1;
};

// Per-block attention geometry, built once per pass (private to the model).
struct BlockAttention {
  int64_t token_offset = 0;  // first packed token of the block
  int64_t rows = 0, length = 0;
  int64_t slot_begin = -1;  // >= 0: slots are slot_begin.. slot_begin+rows-1 (read in place)
  torch::Tensor slots;      // [rows] (gathered when not a range)
  int64_t attend_len = 0;   // L = max(start) + length
  torch::Tensor allowed;    // [rows, length, L] bool
  // Decode rows (length 1) attended in place by the CPU kernel, each over
  // its own context (slots and allowed are then unset).
  bool per_row = false;
  std::vector<int64_t> row_slots, row_lens;  // per_row: slot and context length of each row
};

// What one forward pass shares across layers.
struct AttentionContext {
  torch::Tensor cos, sin;                     // [..., head_dim], matching the token layout
  KvCache* cache = nullptr;                   // null: uncached pass over [B, T] tokens, causal
  torch::Tensor causal;                       // uncached: [1, T, T] bool
  torch::Tensor cache_rows, cache_positions;  // cached: [N] per packed token
  std::vector<BlockAttention> blocks;         // cached
};

class Attention : public torch::nn::Module {
 public:
  explicit Attention(const ModelConfig& config);
  // Uncached: x is [B, T, hidden]. Cached: x is [N, hidden], the packed
  // tokens of all blocks; their keys/values are written into cache layer
  // `layer` first, then each block attends over its rows' cached prefixes.
  torch::Tensor Forward(const torch::Tensor& x, const AttentionContext& ctx, int64_t layer);

 private:
  // Qwen3's RMSNorm over each head of q or k (before RoPE); identity when
  // `norm` is null (Llama, Qwen2).
  torch::Tensor HeadNorm(const std::shared_ptr<RmsNorm>& norm, torch::Tensor x) const;

  int64_t num_heads_, num_kv_heads_, head_dim_;
  torch::nn::Linear q_proj_{nullptr}, k_proj_{nullptr}, v_proj_{nullptr}, o_proj_{nullptr};
  std::shared_ptr<RmsNorm> q_norm_, k_norm_;  // qwen3 only
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

  // One pass over several blocks (see CachedBlock). `tokens` holds the
  // blocks' tokens packed in order: block by block, row by row ([N] int64).
  // Projections and MLPs run once over all N tokens; attention runs per block.
  // Returns logits [N, vocab], or with last_only the logits of each sequence's
  // last token [sum of rows, vocab] (the output projection then runs on those
  // rows only). Preconditions (checked): starts[i] + length <=
  // min(cache->max_len, max_position_embeddings); slots distinct across the
  // pass and < cache->num_slots; positions [0, starts[i]) of each slot hold
  // that sequence's earlier keys/values.
  torch::Tensor ForwardBlocks(const torch::Tensor& tokens, const std::vector<CachedBlock>& blocks, KvCache* cache,
                              bool last_only);

  // Whether ForwardBlocks attends decode rows (length 1) each over its own
  // context, in place (float32 on a CPU with the decode kernels, outside
  // autograd): one block of decode rows of any lengths then costs no padding
  // or gathering, so callers need not split them by length.
  bool AttendsDecodeRowsInPlace() const;

  // Convenience for one block: tokens [B, T]; returns logits [B, T, vocab].
  torch::Tensor ForwardCached(const torch::Tensor& tokens, const std::vector<int64_t>& slots,
                              const std::vector<int64_t>& starts, KvCache* cache);

  // The output projection ([vocab, hidden]); the embedding when tied.
  torch::Tensor output_weight() const;

  // The dtype hidden states and the KV cache are computed in: the model's,
  // except that a model with bfloat16 matrices and float32 vectors (norms,
  // biases: see PlaceModel) computes in float32, widening each weight as a
  // projection reads it.
  torch::ScalarType compute_dtype() const;

 private:
  // Embeddings -> layers -> final norm: hidden states shaped like `tokens`.
  torch::Tensor Hidden(const torch::Tensor& tokens, const torch::Tensor& positions, AttentionContext& ctx);
  torch::Tensor Logits(const torch::Tensor& hidden);

  ModelConfig config_;
  std::shared_ptr<DecoderStack> model_;
  torch::nn::Linear lm_head_{nullptr};
  torch::Tensor rope_cos_, rope_sin_;  // [max_position_embeddings, head_dim]
};

}  // namespace sluice::model

#endif  // SLUICE_MODEL_TRANSFORMER_H_
