#include "sluice/model/config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "sluice/common/file_util.h"
#include "sluice/common/strings.h"
#include "sluice/model/tokenizer.h"

namespace sluice::model {
namespace {

using nlohmann::json;

// TinyLlama-1.1B's config.json, verbatim apart from whitespace.
constexpr const char* kLlamaConfig = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 5632,
  "max_position_embeddings": 2048,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 22,
  "num_key_value_heads": 4,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "rope_theta": 10000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.35.0",
  "use_cache": true,
  "vocab_size": 32000
})";

// Qwen2.5-0.5B's config.json: no attention_bias key (qwen2 implies it).
constexpr const char* kQwen2Config = R"({
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151643,
  "hidden_act": "silu",
  "hidden_size": 896,
  "initializer_range": 0.02,
  "intermediate_size": 4864,
  "max_position_embeddings": 32768,
  "max_window_layers": 24,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 32768,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// A small valid config to mutate one key at a time.
json MinimalConfig() {
  return {{"hidden_size", 64},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"intermediate_size", 128},
          {"vocab_size", 100}};
}

// Expects `status` to carry `code` and to mention every one of `needles`.
void ExpectError(const Status& status, StatusCode code, std::initializer_list<std::string> needles) {
  EXPECT_EQ(status.code(), code) << status.ToString();
  for (const std::string& needle : needles) {
    EXPECT_NE(status.message().find(needle), std::string::npos) << "'" << needle << "' not in: " << status.ToString();
  }
}

TEST(ParseModelConfigTest, LlamaConfig) {
  auto r = ParseModelConfig(kLlamaConfig);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const ModelConfig& c = *r;
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.num_hidden_layers, 22);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.intermediate_size, 5632);
  EXPECT_EQ(c.vocab_size, 32000);
  EXPECT_EQ(c.resolved_head_dim(), 64);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_id, 2);
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  EXPECT_EQ(c.NumParameters(), 1'100'048'384);  // TinyLlama-1.1B's published count
}

TEST(ParseModelConfigTest, Qwen2ConfigImpliesAttentionBias) {
  auto r = ParseModelConfig(kQwen2Config);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const ModelConfig& c = *r;
  EXPECT_EQ(c.model_type, "qwen2");
  EXPECT_TRUE(c.attention_bias);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.resolved_head_dim(), 64);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.NumParameters(), 494'032'768);  // Qwen2.5-0.5B's published count
}

TEST(ParseModelConfigTest, ExplicitAttentionBiasOverridesModelType) {
  json j = json::parse(kQwen2Config);
  j["attention_bias"] = false;
  auto r = ParseModelConfig(j.dump());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->attention_bias);
}

TEST(ParseModelConfigTest, DefaultsForAbsentOptionalKeys) {
  auto r = ParseModelConfig(MinimalConfig().dump());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->model_type, "llama");
  EXPECT_EQ(r->num_key_value_heads, 4);  // = num_attention_heads, as Hugging Face does
  EXPECT_FALSE(r->tie_word_embeddings);  // Hugging Face default, unlike ModelConfig{}
  EXPECT_FALSE(r->attention_bias);
  EXPECT_EQ(r->head_dim, 0);
  EXPECT_EQ(r->resolved_head_dim(), 16);
  EXPECT_EQ(r->bos_token_id, -1);
  EXPECT_EQ(r->eos_token_id, -1);

  json nulls = MinimalConfig();
  nulls["bos_token_id"] = nullptr;
  nulls["num_key_value_heads"] = nullptr;
  auto with_nulls = ParseModelConfig(nulls.dump());
  ASSERT_TRUE(with_nulls.ok()) << with_nulls.status().ToString();
  EXPECT_EQ(with_nulls->bos_token_id, -1);
  EXPECT_EQ(with_nulls->num_key_value_heads, 4);
}

TEST(ParseModelConfigTest, ExplicitHeadDimNeedNotDivideHiddenSize) {
  json j = MinimalConfig();
  j["hidden_size"] = 96;
  j["num_attention_heads"] = 5;
  j["num_key_value_heads"] = 1;
  j["head_dim"] = 32;
  auto r = ParseModelConfig(j.dump());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->resolved_head_dim(), 32);
}

TEST(ParseModelConfigTest, RoundTripThroughJson) {
  for (const char* text : {kLlamaConfig, kQwen2Config}) {
    auto original = ParseModelConfig(text);
    ASSERT_TRUE(original.ok());
    auto again = ParseModelConfig(ModelConfigToJson(*original));
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    const ModelConfig& a = *original;
    const ModelConfig& b = *again;
    EXPECT_EQ(a.model_type, b.model_type);
    EXPECT_EQ(a.hidden_size, b.hidden_size);
    EXPECT_EQ(a.num_hidden_layers, b.num_hidden_layers);
    EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
    EXPECT_EQ(a.num_key_value_heads, b.num_key_value_heads);
    EXPECT_EQ(a.intermediate_size, b.intermediate_size);
    EXPECT_EQ(a.vocab_size, b.vocab_size);
    EXPECT_EQ(a.resolved_head_dim(), b.resolved_head_dim());
    EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
    EXPECT_EQ(a.rope_theta, b.rope_theta);
    EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
    EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
    EXPECT_EQ(a.attention_bias, b.attention_bias);
    EXPECT_EQ(a.bos_token_id, b.bos_token_id);
    EXPECT_EQ(a.eos_token_id, b.eos_token_id);
    EXPECT_EQ(a.torch_dtype, b.torch_dtype);
    EXPECT_EQ(a.NumParameters(), b.NumParameters());
  }
}

TEST(ParseModelConfigTest, RoundTripKeepsAbsentTokenIdsAbsent) {
  ModelConfig c;  // bos/eos -1
  auto again = ParseModelConfig(ModelConfigToJson(c));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->bos_token_id, -1);
  EXPECT_EQ(again->eos_token_id, -1);
  EXPECT_EQ(again->tie_word_embeddings, c.tie_word_embeddings);
  EXPECT_FALSE(json::parse(ModelConfigToJson(c)).contains("eos_token_id"));
}

TEST(ParseModelConfigTest, MissingRequiredKeyIsNamed) {
  for (const char* key :
       {"hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"}) {
    SCOPED_TRACE(key);
    json j = MinimalConfig();
    j.erase(key);
    auto r = ParseModelConfig(j.dump(), "my/config.json");
    ExpectError(r.status(), StatusCode::kInvalidArgument, {Quoted(key), "missing", "my/config.json"});
  }
}

TEST(ParseModelConfigTest, WrongTypesAreNamed) {
  struct Case {
    const char* key;
    json value;
  };
  for (const Case& c : {Case{"hidden_size", "64"}, Case{"hidden_size", 64.5}, Case{"num_key_value_heads", true},
                        Case{"rms_norm_eps", "small"}, Case{"tie_word_embeddings", 1}, Case{"model_type", 7},
                        Case{"torch_dtype", json::array()}, Case{"eos_token_id", json::array({"1"})}}) {
    SCOPED_TRACE(c.key);
    json j = MinimalConfig();
    j[c.key] = c.value;
    auto r = ParseModelConfig(j.dump());
    ExpectError(r.status(), StatusCode::kInvalidArgument, {Quoted(c.key), "must be"});
  }
}

TEST(ParseModelConfigTest, HeadsMustDivideHiddenSize) {
  json j = MinimalConfig();
  j["num_attention_heads"] = 5;
  j["num_key_value_heads"] = 1;
  ExpectError(ParseModelConfig(j.dump()).status(), StatusCode::kInvalidArgument,
              {"'num_attention_heads'", "hidden_size 64"});
}

TEST(ParseModelConfigTest, KvHeadsMustDivideHeads) {
  json j = MinimalConfig();
  j["num_key_value_heads"] = 3;
  ExpectError(ParseModelConfig(j.dump()).status(), StatusCode::kInvalidArgument, {"'num_key_value_heads'"});
}

TEST(ParseModelConfigTest, NonPositiveValuesAreNamed) {
  for (const char* key : {"hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                          "intermediate_size", "vocab_size", "max_position_embeddings"}) {
    for (int value : {0, -4}) {
      SCOPED_TRACE(std::string(key) + "=" + std::to_string(value));
      json j = MinimalConfig();
      j[key] = value;
      ExpectError(ParseModelConfig(j.dump()).status(), StatusCode::kInvalidArgument, {Quoted(key)});
    }
  }
  for (const char* key : {"rms_norm_eps", "rope_theta"}) {
    SCOPED_TRACE(key);
    json j = MinimalConfig();
    j[key] = 0.0;
    ExpectError(ParseModelConfig(j.dump()).status(), StatusCode::kInvalidArgument, {Quoted(key)});
  }
  json j = MinimalConfig();
  j["head_dim"] = -8;
  ExpectError(ParseModelConfig(j.dump()).status(), StatusCode::kInvalidArgument, {"'head_dim'"});
}

TEST(ParseModelConfigTest, OddHeadDimIsRejected) {
  json j = MinimalConfig();
  j["hidden_size"] = 60;  // 60 / 4 = 15
  ExpectError(ParseModelConfig(j.dump()).status(), StatusCode::kInvalidArgument, {"'head_dim'", "even", "15"});
  json explicit_odd = MinimalConfig();
  explicit_odd["head_dim"] = 7;
  ExpectError(ParseModelConfig(explicit_odd.dump()).status(), StatusCode::kInvalidArgument, {"'head_dim'"});
}

TEST(ParseModelConfigTest, TokenIdsOutsideVocabularyAreRejected) {
  for (const char* key : {"bos_token_id", "eos_token_id"}) {
    SCOPED_TRACE(key);
    for (int id : {100, -2}) {  // vocab_size is 100; -1 alone means "none"
      json j = MinimalConfig();
      j[key] = id;
      ExpectError(ParseModelConfig(j.dump()).status(), StatusCode::kInvalidArgument, {Quoted(key)});
    }
  }
}

TEST(ParseModelConfigTest, ListOfEosTokenIdsUsesTheFirst) {
  json j = MinimalConfig();
  j["eos_token_id"] = {7, 9};
  auto c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->eos_token_id, 7);
  j["eos_token_id"] = {"x"};
  ExpectError(ParseModelConfig(j.dump()).status(), StatusCode::kInvalidArgument, {"'eos_token_id'"});
}

TEST(ParseModelConfigTest, UnsupportedModelTypeAndDtype) {
  json j = MinimalConfig();
  j["model_type"] = "mistral";
  ExpectError(ParseModelConfig(j.dump()).status(), StatusCode::kInvalidArgument, {"'model_type'", "mistral"});
  json d = MinimalConfig();
  d["torch_dtype"] = "float64";
  ExpectError(ParseModelConfig(d.dump()).status(), StatusCode::kInvalidArgument, {"'torch_dtype'", "float64"});
}

TEST(ParseModelConfigTest, InvalidOrNonObjectJson) {
  ExpectError(ParseModelConfig("{\"hidden_size\": ", "bad.json").status(), StatusCode::kInvalidArgument,
              {"bad.json", "not valid JSON"});
  ExpectError(ParseModelConfig("", "empty.json").status(), StatusCode::kInvalidArgument, {"not valid JSON"});
  ExpectError(ParseModelConfig("[1, 2]", "list.json").status(), StatusCode::kInvalidArgument,
              {"list.json", "not a JSON object"});
  ExpectError(ParseModelConfig("42").status(), StatusCode::kInvalidArgument, {"not a JSON object"});
}

// Qwen3-0.6B's config.json: per-head q/k norms (model_type qwen3), head_dim
// 128 while hidden_size / heads is 64.
constexpr const char* kQwen3Config = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
  "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
  "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
  "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": true,
  "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936
})";

// Llama-3.2-1B's config.json: rope_scaling of type llama3.
constexpr const char* kLlama32Config = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8, "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256
})";

TEST(ParseModelConfigTest, Qwen3Config) {
  auto c = ParseModelConfig(kQwen3Config);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->model_type, "qwen3");
  EXPECT_TRUE(c->qk_norm());
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->resolved_head_dim(), 128);
  EXPECT_TRUE(c->tie_word_embeddings);
  // 0.6B with tied embeddings: 0.44B without them (q/k norms are 2 x 128 per layer).
  EXPECT_EQ(c->NumParameters(), 596049920);
  auto again = ParseModelConfig(ModelConfigToJson(*c));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->model_type, "qwen3");
  EXPECT_NE(ModelConfigToJson(*c).find("Qwen3ForCausalLM"), std::string::npos);
}

TEST(ParseModelConfigTest, Llama3RopeScaling) {
  auto c = ParseModelConfig(kLlama32Config);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->rope_scaling, (RopeScaling{"llama3", 32.0, 1.0, 4.0, 8192}));
  auto again = ParseModelConfig(ModelConfigToJson(*c));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->rope_scaling, c->rope_scaling);
  // "type" (older transformers) names the type too; "default" is none.
  json j = json::parse(kLlama32Config);
  j["rope_scaling"].erase("rope_type");
  j["rope_scaling"]["type"] = "llama3";
  EXPECT_EQ(ParseModelConfig(j.dump())->rope_scaling.type, "llama3");
  j["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_EQ(ParseModelConfig(j.dump())->rope_scaling.type, "");
}

TEST(ParseModelConfigTest, OtherRopeScalingIsRefusedByName) {
  for (const char* type : {"yarn", "linear", "dynamic", "longrope"}) {
    json j = MinimalConfig();
    j["rope_scaling"] = {{"rope_type", type}, {"factor", 4.0}};
    ExpectError(ParseModelConfig(j.dump()).status(), StatusCode::kUnimplemented,
                {"'rope_scaling'", std::string("'") + type + "'"});
  }
  json j = json::parse(kLlama32Config);
  j["rope_scaling"].erase("low_freq_factor");
  ExpectError(ParseModelConfig(j.dump()).status(), StatusCode::kInvalidArgument, {"rope_scaling.low_freq_factor"});
  j = json::parse(kLlama32Config);
  j["rope_scaling"]["high_freq_factor"] = 0.5;  // below low_freq_factor
  ExpectError(ParseModelConfig(j.dump()).status(), StatusCode::kInvalidArgument, {"'rope_scaling'"});
  j["rope_scaling"] = "llama3";
  ExpectError(ParseModelConfig(j.dump()).status(), StatusCode::kInvalidArgument, {"must be an object"});
}

TEST(ParseModelConfigTest, UnsupportedArchitectureFeaturesAreUnimplemented) {
  // Each would silently compute something other than what the checkpoint was trained for.
  struct Case {
    const char* key;
    json value;
  };
  for (const Case& c : {Case{"hidden_act", "gelu"}, Case{"mlp_bias", true}, Case{"use_sliding_window", true}}) {
    SCOPED_TRACE(c.key);
    json j = MinimalConfig();
    j[c.key] = c.value;
    ExpectError(ParseModelConfig(j.dump()).status(), StatusCode::kUnimplemented, {Quoted(c.key)});
  }
  json ok = MinimalConfig();
  ok["hidden_act"] = "silu";
  ok["mlp_bias"] = false;
  ok["use_sliding_window"] = false;
  EXPECT_TRUE(ParseModelConfig(ok.dump()).ok());
}

TEST(PresetModelConfigTest, PresetsAreValidByteLevelModels) {
  for (const char* name : {"tiny", "1m", "5m", "20m"}) {
    SCOPED_TRACE(name);
    auto r = PresetModelConfig(name);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(r->Validate().ok());
    EXPECT_EQ(r->vocab_size, ByteTokenizer::kVocabSize);
    EXPECT_EQ(r->bos_token_id, ByteTokenizer::kBos);
    EXPECT_EQ(r->eos_token_id, ByteTokenizer::kEos);
    // A preset survives config.json unchanged.
    auto again = ParseModelConfig(ModelConfigToJson(*r));
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_EQ(again->NumParameters(), r->NumParameters());
  }
}

TEST(PresetModelConfigTest, ParameterCountsMatchNames) {
  struct Case {
    const char* name;
    double params;
  };
  for (const Case& c : {Case{"1m", 1e6}, Case{"5m", 5e6}, Case{"20m", 20e6}}) {
    SCOPED_TRACE(c.name);
    auto r = PresetModelConfig(c.name);
    ASSERT_TRUE(r.ok());
    const double n = static_cast<double>(r->NumParameters());
    EXPECT_GT(n, 0.75 * c.params) << n;
    EXPECT_LT(n, 1.25 * c.params) << n;
  }
  auto tiny = PresetModelConfig("tiny");
  auto one = PresetModelConfig("1m");
  ASSERT_TRUE(tiny.ok() && one.ok());
  EXPECT_LT(tiny->NumParameters(), one->NumParameters() / 10);
}

TEST(PresetModelConfigTest, UnknownPresetIsAnError) {
  ExpectError(PresetModelConfig("7b").status(), StatusCode::kInvalidArgument, {"'7b'", "tiny"});
  EXPECT_FALSE(PresetModelConfig("").ok());
}

TEST(ModelConfigFileTest, SaveThenLoad) {
  const std::string dir = testing::TempDir() + "sluice_config_test_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/config.json";
  auto preset = PresetModelConfig("5m");
  ASSERT_TRUE(preset.ok());
  ASSERT_TRUE(SaveModelConfig(path, *preset).ok());
  auto loaded = LoadModelConfig(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(loaded->hidden_size, preset->hidden_size);
  EXPECT_EQ(loaded->NumParameters(), preset->NumParameters());

  std::ofstream(path) << "{\"hidden_size\": 64}";
  ExpectError(LoadModelConfig(path).status(), StatusCode::kInvalidArgument, {path, "'num_hidden_layers'"});
  static_cast<void>(sluice::RemoveTree(dir));
}

// A model directory's files as processes on several hosts compare them:
// what the model is (config, tokenizer, the weights' header), not the weights' values.
TEST(ModelConfigFileTest, FilesDigestsTellModelsApart) {
  const std::string dir = testing::TempDir() + "sluice_digest_test_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir + "/original");
  auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(dir + "/" + name, std::ios::binary) << bytes;
  };
  // A safetensors file: 8-byte little-endian header length, header, data.
  const std::string header = R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  auto safetensors = [&](const std::string& data) {
    std::string n(8, '\0');
    n[0] = static_cast<char>(header.size());
    return n + header + data;
  };
  write("config.json", "{\"hidden_size\": 64}");
  write("tokenizer.json", "{}");
  write("model.safetensors", safetensors("abcd"));
  write("short.safetensors", "xyz");
  write(".hidden", "left out");
  write("original/consolidated.pth", "left out");
  Result<std::map<std::string, std::string>> a = ModelFilesDigests(dir);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->size(), 4u);  // config.json, model.safetensors, short.safetensors, tokenizer.json
  for (const auto& [name, digest] : *a) EXPECT_EQ(digest.size(), 16u) << name;
  // Other weights' values under the same header: the same model.
  write("model.safetensors", safetensors("efgh"));
  Result<std::map<std::string, std::string>> b = ModelFilesDigests(dir);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*a, *b);
  // Another tokenizer: not.
  write("tokenizer.json", "{\"model\": {}}");
  b = ModelFilesDigests(dir);
  ASSERT_TRUE(b.ok());
  EXPECT_NE(a->at("tokenizer.json"), b->at("tokenizer.json"));
  EXPECT_EQ(a->at("config.json"), b->at("config.json"));
  EXPECT_EQ(DescribeFilesDifference(*a, *a, "rank 0's host"), "");
  b->erase("config.json");
  (*b)["vocab.json"] = "0123456789abcdef";
  EXPECT_EQ(DescribeFilesDifference(*a, *b, "rank 0's host"),
            "config.json only here, tokenizer.json differs, vocab.json only on rank 0's host");
  for (int i = 0; i < 8; ++i) (*b)["extra" + std::to_string(i)] = "x";
  EXPECT_EQ(DescribeFilesDifference(*a, *b, "rank 0's host"),
            "config.json only here, tokenizer.json differs, extra0 only on rank 0's host, extra1 only on rank 0's "
            "host, extra2 only on rank 0's host, extra3 only on rank 0's host and 5 more");
  ExpectError(ModelFilesDigests(dir + "/none").status(), StatusCode::kNotFound, {dir + "/none"});
  static_cast<void>(sluice::RemoveTree(dir));
}

TEST(ModelConfigFileTest, MissingFileIsNotFound) {
  auto r = LoadModelConfig("/nonexistent/sluice/config.json");
  ExpectError(r.status(), StatusCode::kNotFound, {"/nonexistent/sluice/config.json"});
}

}  // namespace
}  // namespace sluice::model
