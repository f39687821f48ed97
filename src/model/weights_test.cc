#include "sluice/model/weights.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "sluice/common/file_util.h"

namespace sluice::model {
namespace {

namespace fs = std::filesystem;

class WeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("sluice_weights_test_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    static_cast<void>(sluice::RemoveTree(dir_));
    config_ = *PresetModelConfig("tiny");
    config_.tie_word_embeddings = false;
    model_ = std::make_shared<Transformer>(config_, 3);
  }
  void TearDown() override { static_cast<void>(sluice::RemoveTree(dir_)); }

  static bool SameParameters(Transformer& a, Transformer& b) {
    auto pa = a.named_parameters(), pb = b.named_parameters();
    if (pa.size() != pb.size()) return false;
    for (const auto& p : pa) {
      if (!pb.contains(p.key()) || !torch::equal(p.value(), pb[p.key()])) return false;
    }
    return true;
  }

  fs::path dir_;
  ModelConfig config_;
  std::shared_ptr<Transformer> model_;
};

TEST_F(WeightsTest, SaveThenLoadIsBitExactAndComputesTheSameLogits) {
  ASSERT_TRUE(SavePretrained(*model_, dir_.string()).ok());
  EXPECT_TRUE(fs::exists(dir_ / "config.json"));
  EXPECT_TRUE(fs::exists(dir_ / "model.safetensors"));
  auto loaded = LoadPretrained(dir_.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_TRUE(SameParameters(*model_, **loaded));
  torch::NoGradGuard g;
  auto tokens = torch::randint(0, config_.vocab_size, {2, 9}, torch::kInt64);
  EXPECT_TRUE(torch::equal(model_->Forward(tokens), (*loaded)->Forward(tokens)));
}

// A trainer command that published NaN weights ended its run with exit 0
// and a final/ of NaN, which LoadPretrained then refused.
TEST_F(WeightsTest, NonFiniteWeightsAreNeitherSavedNorLoaded) {
  {
    torch::NoGradGuard g;
    model_->named_parameters()["model.norm.weight"][3] = std::nanf("");
  }
  const Status saved = SavePretrained(*model_, dir_.string());
  EXPECT_EQ(saved.code(), StatusCode::kDataLoss);
  EXPECT_NE(saved.message().find("tensor 'model.norm.weight' holds NaN or inf values"), std::string::npos)
      << saved.ToString();
  EXPECT_FALSE(fs::exists(dir_ / "model.safetensors"));
}

TEST_F(WeightsTest, ShardedCheckpointLoadsTheSame) {
  CheckpointWriteOptions options;
  options.max_shard_bytes = 20000;
  ASSERT_TRUE(SavePretrained(*model_, dir_.string(), DType::kF32, options).ok());
  EXPECT_TRUE(fs::exists(dir_ / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(dir_ / "model.safetensors"));
  auto loaded = LoadPretrained(dir_.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_TRUE(SameParameters(*model_, **loaded));
}

TEST_F(WeightsTest, HalfPrecisionCheckpointsRoundToTheNearestValue) {
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    ASSERT_TRUE(SavePretrained(*model_, dir_.string(), dtype).ok());
    auto config = LoadModelConfig((dir_ / "config.json").string());
    ASSERT_TRUE(config.ok());
    EXPECT_EQ(config->torch_dtype, dtype == DType::kBF16 ? "bfloat16" : "float16");
    auto stored = LoadCheckpointTensors(dir_.string());
    ASSERT_TRUE(stored.ok());
    EXPECT_EQ(stored->at("model.norm.weight").dtype, dtype);
    auto loaded = LoadPretrained(dir_.string());
    ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
    auto pa = model_->named_parameters(), pb = (*loaded)->named_parameters();
    auto torch_dtype = dtype == DType::kBF16 ? torch::kBFloat16 : torch::kFloat16;
    for (const auto& p : pa) {
      // Loading converts exactly what was stored: the float32 value of the rounded number.
      EXPECT_TRUE(torch::equal(p.value().to(torch_dtype).to(torch::kFloat32), pb[p.key()])) << p.key();
    }
    static_cast<void>(sluice::RemoveTree(dir_));
  }
}

TEST_F(WeightsTest, MissingTensorIsNamed) {
  auto weights = *ExportWeights(*model_);
  weights.erase("model.layers.1.mlp.up_proj.weight");
  Transformer fresh(config_, 0);
  Status s = LoadWeights(fresh, weights);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("model.layers.1.mlp.up_proj.weight"), std::string::npos) << s.ToString();
}

TEST_F(WeightsTest, MisShapedTensorIsNamedWithBothShapes) {
  auto weights = *ExportWeights(*model_);
  std::vector<float> wrong(10 * 32, 0.0f);
  weights["model.layers.0.self_attn.k_proj.weight"] =
      HostTensor::Copy(DType::kF32, {10, 32}, wrong.data(), wrong.size() * 4);
  Transformer fresh(config_, 0);
  auto untouched = CloneModel(fresh);
  Status s = LoadWeights(fresh, weights);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(SameParameters(fresh, *untouched)) << "a rejected checkpoint leaves the model unchanged";
  EXPECT_NE(s.message().find("k_proj.weight"), std::string::npos);
  EXPECT_NE(s.message().find("[10, 32]"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("[16, 32]"), std::string::npos) << s.ToString();
}

TEST_F(WeightsTest, UnknownTensorAndIntegerDtypeAreRejected) {
  auto weights = *ExportWeights(*model_);
  auto extra = weights;
  extra["model.layers.9.mlp.up_proj.weight"] = weights["model.norm.weight"];
  Transformer fresh(config_, 0);
  Status s = LoadWeights(fresh, extra);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("model.layers.9.mlp.up_proj.weight"), std::string::npos);

  auto ints = weights;
  std::vector<int32_t> raw(32, 1);
  ints["model.norm.weight"] = HostTensor::Copy(DType::kI32, {32}, raw.data(), raw.size() * 4);
  s = LoadWeights(fresh, ints);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("I32"), std::string::npos) << s.ToString();
}

TEST_F(WeightsTest, TiedModelIgnoresARedundantLmHead) {
  ModelConfig tied = config_;
  tied.tie_word_embeddings = true;
  Transformer a(tied, 4), b(tied, 5);
  auto weights = *ExportWeights(a);
  weights["lm_head.weight"] = weights["model.embed_tokens.weight"];
  ASSERT_TRUE(LoadWeights(b, weights).ok());
  EXPECT_TRUE(SameParameters(a, b));
}

TEST_F(WeightsTest, BadConfigJsonFailsLoadingWithTheKey) {
  ASSERT_TRUE(SavePretrained(*model_, dir_.string()).ok());
  std::ofstream(dir_ / "config.json") << R"({"hidden_size": 30, "num_hidden_layers": 2, "num_attention_heads": 4,
      "intermediate_size": 64, "vocab_size": 259})";
  auto loaded = LoadPretrained(dir_.string());
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.status().message().find("num_attention_heads"), std::string::npos) << loaded.status().ToString();
  fs::remove(dir_ / "config.json");
  EXPECT_EQ(LoadPretrained(dir_.string()).status().code(), StatusCode::kNotFound);
}

TEST_F(WeightsTest, CheckpointForADifferentConfigIsRejected) {
  ASSERT_TRUE(SavePretrained(*model_, dir_.string()).ok());
  ModelConfig bigger = config_;
  bigger.intermediate_size = 96;
  ASSERT_TRUE(SaveModelConfig((dir_ / "config.json").string(), bigger).ok());
  auto loaded = LoadPretrained(dir_.string());
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.status().message().find("gate_proj"), std::string::npos) << loaded.status().ToString();
}

TEST_F(WeightsTest, AConfigFarLargerThanItsCheckpointIsRefusedBeforeBuilding) {
  ASSERT_TRUE(SavePretrained(*model_, dir_.string()).ok());
  ModelConfig deep = config_;
  deep.num_hidden_layers = 1000;  // within the config limit, ~1000x the checkpoint
  ASSERT_TRUE(SaveModelConfig((dir_ / "config.json").string(), deep).ok());
  auto loaded = LoadPretrained(dir_.string());
  EXPECT_EQ(loaded.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(loaded.status().message().find("but the checkpoint holds"), std::string::npos)
      << loaded.status().ToString();
}

TEST_F(WeightsTest, NonFiniteWeightsAreRefused) {
  {
    torch::NoGradGuard g;
    model_->named_parameters()["model.layers.0.mlp.up_proj.weight"][0][1] = std::nanf("");
  }
  // Written as another program would (SavePretrained refuses them).
  auto exported = ExportWeights(*model_);
  ASSERT_TRUE(exported.ok());
  ASSERT_TRUE(SaveCheckpointTensors(dir_.string(), *exported).ok());
  ASSERT_TRUE(SaveModelConfig((dir_ / "config.json").string(), config_).ok());
  auto loaded = LoadPretrained(dir_.string());
  EXPECT_EQ(loaded.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(loaded.status().message().find("model.layers.0.mlp.up_proj.weight' holds NaN"), std::string::npos)
      << loaded.status().ToString();
}

TEST_F(WeightsTest, CloneIsIndependent) {
  auto copy = CloneModel(*model_);
  EXPECT_TRUE(SameParameters(*model_, *copy));
  torch::NoGradGuard g;
  copy->named_parameters()["model.norm.weight"].add_(1.0);
  EXPECT_FALSE(SameParameters(*model_, *copy));
}

}  // namespace
}  // namespace sluice::model
