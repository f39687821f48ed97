// Model configuration read from / written to a Hugging Face `config.json`
// (Llama / Qwen2 decoder-only architecture).
//
// Thread safety: plain values.
#ifndef SLUICE_MODEL_CONFIG_H_
#define SLUICE_MODEL_CONFIG_H_

#include <cstdint>
#include <map>
#include <string>

#include "sluice/common/status.h"

namespace sluice::model {

// rope_scaling of a config.json. Supported: none, and Llama 3.1's "llama3"
// (long wavelengths slowed by `factor`, short ones kept, a smooth blend
// between, relative to the context the model was pretrained with).
struct RopeScaling {
  std::string type;  // "" (none) or "llama3"
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
  friend bool operator==(const RopeScaling&, const RopeScaling&) = default;
};

struct ModelConfig {
  // "llama", "qwen2" (attention biases by default) or "qwen3" (an RMSNorm
  // over each head of q and k before RoPE: q_norm, k_norm).
  std::string model_type = "llama";
  int64_t hidden_size = 128;
  int64_t num_hidden_layers = 4;
  int64_t num_attention_heads = 4;
  int64_t num_key_value_heads = 2;  // grouped-query attention when < num_attention_heads
  int64_t intermediate_size = 384;
  int64_t vocab_size = 259;
  int64_t head_dim = 0;  // 0: hidden_size / num_attention_heads
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  int64_t max_position_embeddings = 512;
  bool tie_word_embeddings = true;
  bool attention_bias = false;  // q/k/v projection biases (Qwen2: true)
  int64_t bos_token_id = -1;    // -1: none
  int64_t eos_token_id = -1;
  std::string torch_dtype = "float32";  // dtype the weights are saved in
  RopeScaling rope_scaling;

  bool qk_norm() const { return model_type == "qwen3"; }
  int64_t resolved_head_dim() const { return head_dim > 0 ? head_dim : hidden_size / num_attention_heads; }
  // Total parameter count implied by the shapes.
  int64_t NumParameters() const;
  // Checks every invariant the model relies on; InvalidArgument naming the key.
  Status Validate() const;
};

// Parses config.json text. Required keys: hidden_size, num_hidden_layers,
// num_attention_heads, intermediate_size, vocab_size. Optional keys fall back
// to the defaults above (num_key_value_heads to num_attention_heads, as HF does).
// Errors: InvalidArgument naming the key (missing, wrong type, bad value);
// Unimplemented naming the key for features the model lacks (rope_scaling,
// hidden_act other than silu, mlp_bias or use_sliding_window true).
Result<ModelConfig> ParseModelConfig(const std::string& json_text, const std::string& origin = "config.json");
Result<ModelConfig> LoadModelConfig(const std::string& path);
std::string ModelConfigToJson(const ModelConfig& config);
Status SaveModelConfig(const std::string& path, const ModelConfig& config);

// Checks that the checkpoint in `dir` (its config.json) has the architecture
// of `model`: every key that shapes a tensor or the computation. FailedPrecondition
// listing each difference ("num_hidden_layers 2 there, 4 here"); NotFound or
// InvalidArgument from reading config.json.
Status CheckSameArchitecture(const std::string& dir, const ModelConfig& model);

// What makes the checkpoint in `dir` the model it is, apart from its
// weights' values, file by file: each regular file's name (subdirectories
// and hidden files left out) and a 16-hex-digit digest of its contents; of a
// *.safetensors file its header only (tensor names, dtypes, shapes,
// offsets), of any other file over 64 MiB its size only. Processes on
// several hosts compare theirs to load the same model (the config.json,
// tokenizer and chat template above all). NotFound: `dir` cannot be
// listed; InvalidArgument: it holds over 4096 files.
Result<std::map<std::string, std::string>> ModelFilesDigests(const std::string& dir);
// How two such digests differ, for a message: "config.json differs,
// tokenizer_config.json only here, vocab.json only on <there>" (six at
// most, then how many more); empty when they are the same.
std::string DescribeFilesDifference(const std::map<std::string, std::string>& here,
                                    const std::map<std::string, std::string>& there, const std::string& where);

// Built-in presets for demos, tests and benchmarks ("tiny" ~27K, "1m" ~1M,
// "5m", "20m" parameters), all with the byte-level tokenizer's vocabulary.
Result<ModelConfig> PresetModelConfig(const std::string& name);

}  // namespace sluice::model

#endif  // SLUICE_MODEL_CONFIG_H_
