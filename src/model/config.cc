#include "sluice/model/config.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>
#include <vector>

#include "bounded_json.h"
#include "sluice/common/file_util.h"
#include "sluice/common/random.h"
#include "sluice/model/tokenizer.h"

namespace sluice::model {

using nlohmann::json;

int64_t ModelConfig::NumParameters() const {
  const int64_t hd = resolved_head_dim();
  const int64_t q = num_attention_heads * hd, kv = num_key_value_heads * hd;
  int64_t per_layer = 2 * hidden_size                         // two RMSNorms
                      + hidden_size * (q + 2 * kv)            // q, k, v
                      + q * hidden_size                       // o
                      + 3 * hidden_size * intermediate_size;  // gate, up, down
  if (attention_bias) per_layer += q + 2 * kv;
  if (qk_norm()) per_layer += 2 * hd;
  int64_t total = vocab_size * hidden_size + num_hidden_layers * per_layer + hidden_size;
  if (!tie_word_embeddings) total += vocab_size * hidden_size;
  return total;
}

Status ModelConfig::Validate() const {
  auto bad = [](const std::string& key, const std::string& why) {
    return Status::InvalidArgument("config key '" + key + "': " + why);
  };
  if (model_type != "llama" && model_type != "qwen2" && model_type != "qwen3") {
    return bad("model_type", "'" + model_type + "' is not supported (allowed: llama, qwen2, qwen3)");
  }
  for (auto [key, value] : {std::pair<const char*, int64_t>{"hidden_size", hidden_size},
                            {"num_hidden_layers", num_hidden_layers},
                            {"num_attention_heads", num_attention_heads},
                            {"num_key_value_heads", num_key_value_heads},
                            {"intermediate_size", intermediate_size},
                            {"vocab_size", vocab_size},
                            {"max_position_embeddings", max_position_embeddings}}) {
    if (value <= 0) return bad(key, "must be a positive integer, got " + std::to_string(value));
  }
  // Far above any model this runs, and low enough that sizes computed from
  // them cannot overflow: a typo is an error here, not an allocation that
  // takes the machine's memory.
  for (auto [key, value, limit] : {std::tuple<const char*, int64_t, int64_t>{"hidden_size", hidden_size, 1 << 16},
                                   {"num_hidden_layers", num_hidden_layers, 1 << 10},
                                   {"num_attention_heads", num_attention_heads, 1 << 10},
                                   {"num_key_value_heads", num_key_value_heads, 1 << 10},
                                   {"intermediate_size", intermediate_size, 1 << 20},
                                   {"vocab_size", vocab_size, 1 << 22},
                                   {"max_position_embeddings", max_position_embeddings, 1 << 20},
                                   {"head_dim", head_dim, 1 << 12}}) {
    if (value > limit) {
      return bad(key, std::to_string(value) + " is over the limit of " + std::to_string(limit));
    }
  }
  if (head_dim < 0) return bad("head_dim", "must be positive when given");
  if (head_dim == 0 && hidden_size % num_attention_heads != 0) {
    return bad("num_attention_heads",
               std::to_string(num_attention_heads) + " heads do not divide hidden_size " + std::to_string(hidden_size));
  }
  if (num_attention_heads % num_key_value_heads != 0) {
    return bad("num_key_value_heads", std::to_string(num_key_value_heads) + " does not divide num_attention_heads " +
                                          std::to_string(num_attention_heads));
  }
  if (resolved_head_dim() % 2 != 0) {
    return bad("head_dim", "rotary embeddings need an even head dimension, got " + std::to_string(resolved_head_dim()));
  }
  if (!(rms_norm_eps > 0)) return bad("rms_norm_eps", "must be > 0");
  if (!(rope_theta > 0)) return bad("rope_theta", "must be > 0");
  if (eos_token_id < -1 || eos_token_id >= vocab_size) return bad("eos_token_id", "is outside the vocabulary");
  if (bos_token_id < -1 || bos_token_id >= vocab_size) return bad("bos_token_id", "is outside the vocabulary");
  if (!rope_scaling.type.empty()) {
    const RopeScaling& r = rope_scaling;
    if (r.type != "llama3") return bad("rope_scaling", "type '" + r.type + "' is not supported (allowed: llama3)");
    if (!(r.factor >= 1 && r.factor <= 1024)) return bad("rope_scaling.factor", "must be in [1, 1024]");
    if (!(r.low_freq_factor > 0 && r.high_freq_factor > r.low_freq_factor && r.high_freq_factor <= 1e6)) {
      return bad("rope_scaling", "needs 0 < low_freq_factor < high_freq_factor");
    }
    if (r.original_max_position_embeddings <= 0 || r.original_max_position_embeddings > (1 << 20)) {
      return bad("rope_scaling.original_max_position_embeddings", "must be in [1, 1048576]");
    }
  }
  if (torch_dtype != "float32" && torch_dtype != "bfloat16" && torch_dtype != "float16") {
    return bad("torch_dtype", "'" + torch_dtype + "' is not supported (allowed: float32, bfloat16, float16)");
  }
  return Status::Ok();
}

namespace {

// Reads an integer key; `required` keys must be present.
Status ReadInt(const json& j, const char* key, bool required, int64_t* out) {
  if (!j.contains(key) || j[key].is_null()) {
    return required ? Status::InvalidArgument(std::string("config key '") + key + "' is missing") : Status::Ok();
  }
  if (!j[key].is_number_integer()) {
    return Status::InvalidArgument(std::string("config key '") + key + "' must be an integer, got " + j[key].dump());
  }
  *out = j[key].get<int64_t>();
  return Status::Ok();
}

Status ReadDouble(const json& j, const char* key, double* out) {
  if (!j.contains(key) || j[key].is_null()) return Status::Ok();
  if (!j[key].is_number()) {
    return Status::InvalidArgument(std::string("config key '") + key + "' must be a number, got " + j[key].dump());
  }
  *out = j[key].get<double>();
  return Status::Ok();
}

Status ReadBool(const json& j, const char* key, bool* out) {
  if (!j.contains(key) || j[key].is_null()) return Status::Ok();
  if (!j[key].is_boolean()) {
    return Status::InvalidArgument(std::string("config key '") + key + "' must be true or false, got " + j[key].dump());
  }
  *out = j[key].get<bool>();
  return Status::Ok();
}

Status ReadString(const json& j, const char* key, std::string* out) {
  if (!j.contains(key) || j[key].is_null()) return Status::Ok();
  if (!j[key].is_string()) {
    return Status::InvalidArgument(std::string("config key '") + key + "' must be a string, got " + j[key].dump());
  }
  *out = j[key].get<std::string>();
  return Status::Ok();
}

// rope_scaling: null, absent or type "default" is none; "llama3" with its four
// keys; any other type (yarn, linear, dynamic, longrope, ...) is refused by
// name rather than computed wrongly.
Status ReadRopeScaling(const json& j, RopeScaling* out) {
  if (!j.contains("rope_scaling") || j["rope_scaling"].is_null()) return Status::Ok();
  const json& r = j["rope_scaling"];
  if (!r.is_object()) {
    return Status::InvalidArgument("config key 'rope_scaling' must be an object, got " + r.dump());
  }
  std::string type;
  SLUICE_RETURN_IF_ERROR(ReadString(r, "rope_type", &type));  // transformers >= 4.43
  if (type.empty()) SLUICE_RETURN_IF_ERROR(ReadString(r, "type", &type));
  if (type.empty() || type == "default") return Status::Ok();
  if (type != "llama3") {
    return Status::Unimplemented("config key 'rope_scaling': type '" + type +
                                 "' is not supported (supported: llama3; yarn, linear, dynamic and longrope are not)");
  }
  out->type = type;
  auto need = [&](const char* key) -> Status {
    if (!r.contains(key))
      return Status::InvalidArgument(std::string("config key 'rope_scaling.") + key + "' is missing");
    return Status::Ok();
  };
  for (const char* key : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
    SLUICE_RETURN_IF_ERROR(need(key));
  }
  SLUICE_RETURN_IF_ERROR(ReadDouble(r, "factor", &out->factor));
  SLUICE_RETURN_IF_ERROR(ReadDouble(r, "low_freq_factor", &out->low_freq_factor));
  SLUICE_RETURN_IF_ERROR(ReadDouble(r, "high_freq_factor", &out->high_freq_factor));
  return ReadInt(r, "original_max_position_embeddings", true, &out->original_max_position_embeddings);
}

}  // namespace

Result<ModelConfig> ParseModelConfig(const std::string& json_text, const std::string& origin) {
  SLUICE_ASSIGN_OR_RETURN(json j, ParseBoundedJson<json>(json_text, origin));
  if (j.is_discarded()) return Status::InvalidArgument(origin + ": not valid JSON");
  if (!j.is_object()) return Status::InvalidArgument(origin + ": not a JSON object");
  ModelConfig c;
  auto status = [&]() -> Status {
    SLUICE_RETURN_IF_ERROR(ReadString(j, "model_type", &c.model_type));
    SLUICE_RETURN_IF_ERROR(ReadInt(j, "hidden_size", true, &c.hidden_size));
    SLUICE_RETURN_IF_ERROR(ReadInt(j, "num_hidden_layers", true, &c.num_hidden_layers));
    SLUICE_RETURN_IF_ERROR(ReadInt(j, "num_attention_heads", true, &c.num_attention_heads));
    c.num_key_value_heads = c.num_attention_heads;
    SLUICE_RETURN_IF_ERROR(ReadInt(j, "num_key_value_heads", false, &c.num_key_value_heads));
    SLUICE_RETURN_IF_ERROR(ReadInt(j, "intermediate_size", true, &c.intermediate_size));
    SLUICE_RETURN_IF_ERROR(ReadInt(j, "vocab_size", true, &c.vocab_size));
    SLUICE_RETURN_IF_ERROR(ReadInt(j, "head_dim", false, &c.head_dim));
    SLUICE_RETURN_IF_ERROR(ReadDouble(j, "rms_norm_eps", &c.rms_norm_eps));
    SLUICE_RETURN_IF_ERROR(ReadDouble(j, "rope_theta", &c.rope_theta));
    SLUICE_RETURN_IF_ERROR(ReadInt(j, "max_position_embeddings", false, &c.max_position_embeddings));
    c.tie_word_embeddings = false;  // the Hugging Face default when the key is absent
    SLUICE_RETURN_IF_ERROR(ReadBool(j, "tie_word_embeddings", &c.tie_word_embeddings));
    c.attention_bias = c.model_type == "qwen2";
    SLUICE_RETURN_IF_ERROR(ReadBool(j, "attention_bias", &c.attention_bias));
    SLUICE_RETURN_IF_ERROR(ReadInt(j, "bos_token_id", false, &c.bos_token_id));
    // Llama 3 style configs list several end tokens; the engine stops on one,
    // the first (the others are noted in docs/notes as not yet honoured).
    if (j.contains("eos_token_id") && j["eos_token_id"].is_array() && !j["eos_token_id"].empty()) {
      json first = {{"eos_token_id", j["eos_token_id"][0]}};
      SLUICE_RETURN_IF_ERROR(ReadInt(first, "eos_token_id", false, &c.eos_token_id));
    } else {
      SLUICE_RETURN_IF_ERROR(ReadInt(j, "eos_token_id", false, &c.eos_token_id));
    }
    SLUICE_RETURN_IF_ERROR(ReadString(j, "torch_dtype", &c.torch_dtype));
    SLUICE_RETURN_IF_ERROR(ReadRopeScaling(j, &c.rope_scaling));
    // Architecture switches the model does not implement: accepting them would
    // silently compute something other than what the checkpoint was trained for.
    std::string hidden_act = "silu";
    SLUICE_RETURN_IF_ERROR(ReadString(j, "hidden_act", &hidden_act));
    if (hidden_act != "silu") {
      return Status::Unimplemented("config key 'hidden_act': '" + hidden_act + "' is not supported (only silu)");
    }
    for (const char* key : {"mlp_bias", "use_sliding_window"}) {
      bool enabled = false;
      SLUICE_RETURN_IF_ERROR(ReadBool(j, key, &enabled));
      if (enabled) return Status::Unimplemented(std::string("config key '") + key + "': true is not supported");
    }
    return c.Validate();
  }();
  if (!status.ok()) return status.WithContext(origin);
  return c;
}

Result<ModelConfig> LoadModelConfig(const std::string& path) {
  Result<std::string> text = ReadFileToString(path);
  if (!text.ok() && text.status().code() == StatusCode::kNotFound) {
    return Status::NotFound(path + ": cannot open model config");
  }
  if (!text.ok()) return text.status();
  return ParseModelConfig(*text, path);
}

Status CheckSameArchitecture(const std::string& dir, const ModelConfig& model) {
  SLUICE_ASSIGN_OR_RETURN(ModelConfig there, LoadModelConfig((std::filesystem::path(dir) / "config.json").string()));
  std::string diff;
  auto compare = [&](const char* key, const auto& a, const auto& b) {
    if (a == b) return;
    std::ostringstream line;
    line << (diff.empty() ? "" : ", ") << key << " " << a << " there, " << b << " here";
    diff += line.str();
  };
  compare("model_type", there.model_type, model.model_type);
  compare("hidden_size", there.hidden_size, model.hidden_size);
  compare("num_hidden_layers", there.num_hidden_layers, model.num_hidden_layers);
  compare("num_attention_heads", there.num_attention_heads, model.num_attention_heads);
  compare("num_key_value_heads", there.num_key_value_heads, model.num_key_value_heads);
  compare("intermediate_size", there.intermediate_size, model.intermediate_size);
  compare("vocab_size", there.vocab_size, model.vocab_size);
  compare("head_dim", there.resolved_head_dim(), model.resolved_head_dim());
  compare("max_position_embeddings", there.max_position_embeddings, model.max_position_embeddings);
  compare("tie_word_embeddings", there.tie_word_embeddings, model.tie_word_embeddings);
  compare("attention_bias", there.attention_bias, model.attention_bias);
  compare("rope_theta", there.rope_theta, model.rope_theta);
  compare("rms_norm_eps", there.rms_norm_eps, model.rms_norm_eps);
  compare("rope_scaling", there.rope_scaling.type.empty() ? "none" : there.rope_scaling.type,
          model.rope_scaling.type.empty() ? "none" : model.rope_scaling.type);
  if (!(there.rope_scaling == model.rope_scaling) && there.rope_scaling.type == model.rope_scaling.type) {
    compare("rope_scaling.factor", there.rope_scaling.factor, model.rope_scaling.factor);
    compare("rope_scaling.original_max_position_embeddings", there.rope_scaling.original_max_position_embeddings,
            model.rope_scaling.original_max_position_embeddings);
  }
  if (diff.empty()) return Status::Ok();
  return Status::FailedPrecondition(dir + " holds another model than this run's (" + diff + ")");
}

Result<std::map<std::string, std::string>> ModelFilesDigests(const std::string& dir) {
  namespace fs = std::filesystem;
  constexpr size_t kMaxFiles = 4096;
  constexpr uintmax_t kMaxWholeFile = uintmax_t{64} << 20;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) return Status::NotFound(dir + ": cannot list the model directory: " + ec.message());
  std::map<std::string, std::string> out;
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) return Status::NotFound(dir + ": cannot list the model directory: " + ec.message());
    const std::string name = it->path().filename().string();
    if (name.empty() || name[0] == '.' || !it->is_regular_file(ec)) continue;
    if (out.size() == kMaxFiles) {
      return Status::InvalidArgument(dir + ": holds over " + std::to_string(kMaxFiles) +
                                     " files: not a model directory");
    }
    const uintmax_t size = it->file_size(ec);
    std::ifstream in(it->path(), std::ios::binary);
    if (ec || !in) return Status::NotFound(it->path().string() + ": cannot read");
    std::string bytes;
    const bool safetensors = name.size() > 12 && name.ends_with(".safetensors");
    if (safetensors) {
      // The 8-byte little-endian header length, then the header (its length
      // checked against the file's: a torn file shows as its size).
      unsigned char n[8] = {};
      in.read(reinterpret_cast<char*>(n), 8);
      uint64_t header = 0;
      for (int i = 7; i >= 0; --i) header = header << 8 | n[i];
      if (in.gcount() == 8 && header <= size - 8) {
        bytes.resize(static_cast<size_t>(header));
        in.read(bytes.data(), static_cast<std::streamsize>(header));
        bytes.insert(0, reinterpret_cast<const char*>(n), 8);
      } else {
        in.clear();  // (a file shorter than its 8 bytes)
        bytes = "size " + std::to_string(size);
      }
    } else if (size > kMaxWholeFile) {
      bytes = "size " + std::to_string(size);
    } else {
      bytes.resize(static_cast<size_t>(size));
      in.read(bytes.data(), static_cast<std::streamsize>(size));
    }
    if (!in) return Status::NotFound(it->path().string() + ": cannot read");
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(Fnv1a(bytes)));
    out[name] = hex;
  }
  return out;
}

std::string DescribeFilesDifference(const std::map<std::string, std::string>& here,
                                    const std::map<std::string, std::string>& there, const std::string& where) {
  std::vector<std::string> lines;
  for (const auto& [name, digest] : here) {
    auto at = there.find(name);
    if (at == there.end()) {
      lines.push_back(name + " only here");
    } else if (at->second != digest) {
      lines.push_back(name + " differs");
    }
  }
  for (const auto& [name, digest] : there) {
    if (!here.contains(name)) lines.push_back(name + " only on " + where);
  }
  constexpr size_t kListed = 6;
  std::string out;
  for (size_t i = 0; i < std::min(lines.size(), kListed); ++i) out += (i == 0 ? "" : ", ") + lines[i];
  if (lines.size() > kListed) out += " and " + std::to_string(lines.size() - kListed) + " more";
  return out;
}

std::string ModelConfigToJson(const ModelConfig& c) {
  json j = {
      {"architectures",
       {c.model_type == "qwen2"   ? "Qwen2ForCausalLM"
        : c.model_type == "qwen3" ? "Qwen3ForCausalLM"
                                  : "LlamaForCausalLM"}},
      {"model_type", c.model_type},
      {"hidden_size", c.hidden_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"intermediate_size", c.intermediate_size},
      {"vocab_size", c.vocab_size},
      {"head_dim", c.resolved_head_dim()},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_theta", c.rope_theta},
      {"max_position_embeddings", c.max_position_embeddings},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"attention_bias", c.attention_bias},
      {"hidden_act", "silu"},
      {"torch_dtype", c.torch_dtype},
  };
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_id >= 0) j["eos_token_id"] = c.eos_token_id;
  if (!c.rope_scaling.type.empty()) {
    j["rope_scaling"] = {{"rope_type", c.rope_scaling.type},
                         {"factor", c.rope_scaling.factor},
                         {"low_freq_factor", c.rope_scaling.low_freq_factor},
                         {"high_freq_factor", c.rope_scaling.high_freq_factor},
                         {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
  }
  return j.dump(2) + "\n";
}

Status SaveModelConfig(const std::string& path, const ModelConfig& config) {
  std::ofstream out(path, std::ios::trunc);
  if (!out) return Status::Unavailable(path + ": cannot write model config");
  out << ModelConfigToJson(config);
  out.flush();
  if (!out) return Status::Unavailable(path + ": write failed");
  return Status::Ok();
}

Result<ModelConfig> PresetModelConfig(const std::string& name) {
  ModelConfig c;
  c.vocab_size = ByteTokenizer::kVocabSize;
  c.bos_token_id = ByteTokenizer::kBos;
  c.eos_token_id = ByteTokenizer::kEos;
  c.tie_word_embeddings = true;
  c.max_position_embeddings = 1024;
  auto set = [&](int64_t hidden, int64_t layers, int64_t heads, int64_t kv, int64_t inter) {
    c.hidden_size = hidden;
    c.num_hidden_layers = layers;
    c.num_attention_heads = heads;
    c.num_key_value_heads = kv;
    c.intermediate_size = inter;
  };
  if (name == "tiny")
    set(32, 2, 4, 2, 64);
  else if (name == "1m")
    set(128, 5, 4, 2, 384);
  else if (name == "5m")
    set(256, 6, 8, 4, 704);
  else if (name == "20m")
    set(512, 7, 8, 4, 1408);
  else if (name == "0.5b") {  // Qwen2.5-0.5B's shape: for GPU runs and benchmarks (byte tokenizer ids < 259)
    set(896, 24, 14, 2, 4864);
    c.vocab_size = 151936;
    c.attention_bias = true;
    c.rope_theta = 1000000.0;
    c.max_position_embeddings = 4096;
  } else {
    return Status::InvalidArgument("unknown model preset '" + name + "' (allowed: tiny, 1m, 5m, 20m, 0.5b)");
  }
  SLUICE_RETURN_IF_ERROR(c.Validate());
  return c;
}

}  // namespace sluice::model
