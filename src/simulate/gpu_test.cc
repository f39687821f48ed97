#include "sluice/simulate/gpu.h"

#include <gtest/gtest.h>

namespace sluice::simulate {
namespace {

TEST(GpuTest, KnownPartsAndShapesAndClearErrorsForOthers) {
  auto h100 = FindAccelerator("h100");
  ASSERT_TRUE(h100.ok());
  EXPECT_DOUBLE_EQ(h100->memory_tb_s, 3.35);
  auto none = FindAccelerator("tpu9");
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find("h200"), std::string::npos);
  EXPECT_EQ(FindModel("gpt-9").status().code(), StatusCode::kNotFound);
  // Parameter counts as the models publish them (within 1%).
  for (const auto& [name, billions] :
       {std::pair{"qwen2.5-1.5b", 1.54}, std::pair{"qwen2.5-7b", 7.62}, std::pair{"llama3.1-8b", 8.03},
        std::pair{"qwen2.5-32b", 32.8}, std::pair{"llama3.1-70b", 70.6}, std::pair{"qwen2.5-72b", 72.7}}) {
    auto m = FindModel(name);
    ASSERT_TRUE(m.ok()) << name;
    EXPECT_NEAR(m->Parameters() / 1e9, billions, 0.01 * billions) << name;
  }
  // K and V of a token: 2 x layers x kv_heads x head_dim x 2 bytes.
  EXPECT_DOUBLE_EQ(FindModel("qwen2.5-7b")->KvBytesPerToken(), 2.0 * 28 * 4 * 128 * 2);
  ModelDims bad = *FindModel("qwen2.5-7b");
  bad.kv_heads = 5;
  EXPECT_NE(bad.Validate().message().find("multiple of kv_heads"), std::string::npos);
}

TEST(GpuTest, KvCapacityAndModelsThatDoNotFit) {
  const Accelerator h100 = *FindAccelerator("h100");
  const Efficiency e;
  GpuLayout g;
  g.rollout_gpus = 8;
  g.trainer_gpus = 8;
  g.rollout_tp = 1;
  auto one = KvCapacityTokens(h100, *FindModel("qwen2.5-7b"), g, e);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  // 80 GB x 0.9 - 2 GB reserve - 15.2 GB of weights, at 57344 bytes a token.
  EXPECT_NEAR(static_cast<double>(*one), (72e9 - 2e9 - 2 * FindModel("qwen2.5-7b")->Parameters()) / 57344, 2);
  g.rollout_tp = 2;
  auto two = KvCapacityTokens(h100, *FindModel("qwen2.5-7b"), g, e);
  ASSERT_TRUE(two.ok());
  EXPECT_GT(*two, 2 * *one);  // the weights once, split over two
  g.rollout_tp = 1;
  auto big = KvCapacityTokens(h100, *FindModel("llama3.1-70b"), g, e);
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("does not fit a rollout engine of 1 x h100"), std::string::npos);
  // A trainer too small for the model's state.
  GpuLayout small = g;
  small.rollout_tp = 4;
  small.trainer_gpus = 4;
  auto s = SetUpPolicy(Policy::kSluice, h100, *FindModel("llama3.1-70b"), small, e, PolicyOptions{});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("does not train on 4 x h100"), std::string::npos);
  GpuLayout uneven = g;
  uneven.rollout_gpus = 6;
  uneven.rollout_tp = 4;
  EXPECT_NE(uneven.Validate().message().find("multiple of rollout_tp"), std::string::npos);
}

TEST(GpuTest, RooflineDecodeIsMemoryBoundAtFewRowsAndComputeBoundAtMany) {
  const Accelerator h100 = *FindAccelerator("h100");
  const ModelDims m = *FindModel("llama3.1-8b");
  Efficiency e;
  GpuLayout g;
  auto p = GpuCostProfile(h100, m, g, e);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  // One row, a short context: the weights streamed once at 75% of 3.35 TB/s.
  const double weights_s = 2 * m.MatmulParameters() / (3.35e12 * 0.75);
  EXPECT_NEAR(p->DecodeStep(1, 100), e.decode_step_s + weights_s, 0.05 * weights_s);
  // Thousands of rows: 2 x matmul parameters a row at half of 989 TFLOP/s.
  const double row_s = 2 * m.MatmulParameters() / (989e12 * 0.5);
  EXPECT_NEAR(p->DecodeStep(4096, 0), e.decode_step_s + 4096 * row_s, 0.01 * 4096 * row_s);
  // Tensor parallel halves the weights each accelerator streams, and adds
  // the all-reduces.
  g.rollout_tp = 2;
  auto tp2 = GpuCostProfile(h100, m, g, e);
  ASSERT_TRUE(tp2.ok());
  EXPECT_NEAR(tp2->memory_step_s, p->memory_step_s / 2, 1e-12);
  EXPECT_GT(tp2->decode_step_s, p->decode_step_s);
  // The trainer: train_passes forward passes a token at 40% MFU.
  EXPECT_NEAR(p->train_token_s, 5 * 2 * m.MatmulParameters() / (989e12 * 0.4), 1e-12);
}

TEST(GpuTest, PoliciesDifferOnlyInHowTheyRun) {
  const Accelerator h100 = *FindAccelerator("h100");
  const ModelDims m = *FindModel("qwen2.5-7b");
  GpuLayout g;
  g.rollout_gpus = 16;
  g.trainer_gpus = 16;
  PolicyOptions o;
  o.max_staleness = 3;
  auto colocated = SetUpPolicy(Policy::kColocatedSync, h100, m, g, Efficiency{}, o);
  auto partial = SetUpPolicy(Policy::kPartialRollout, h100, m, g, Efficiency{}, o);
  auto inflight = SetUpPolicy(Policy::kInflight, h100, m, g, Efficiency{}, o);
  auto sluice = SetUpPolicy(Policy::kSluice, h100, m, g, Efficiency{}, o);
  ASSERT_TRUE(colocated.ok() && partial.ok() && inflight.ok() && sluice.ok());
  // Colocated: every accelerator on both sides, synchronous.
  EXPECT_EQ(colocated->layout.mode, Mode::kSync);
  EXPECT_EQ(colocated->layout.rollout_engines, 32);
  EXPECT_EQ(colocated->layout.trainer_workers, 32);
  EXPECT_EQ(partial->layout.rollout_engines, 16);
  EXPECT_EQ(partial->layout.trainer_workers, 16);
  EXPECT_TRUE(partial->layout.recompute_on_switch);
  EXPECT_TRUE(partial->layout.completion_order);
  EXPECT_FALSE(inflight->layout.recompute_on_switch);
  EXPECT_TRUE(inflight->layout.completion_order);
  EXPECT_FALSE(sluice->layout.completion_order);
  EXPECT_EQ(sluice->layout.max_staleness, 3);
  // The pipeline fills a standby copy in the background (and holds it: less
  // cache); the others stop decoding while the version arrives.
  EXPECT_GT(sluice->costs.weight_fill_s, 0);
  EXPECT_LT(sluice->costs.weight_switch_s, 0.01);
  EXPECT_EQ(inflight->costs.weight_fill_s, 0);
  EXPECT_NEAR(inflight->costs.weight_switch_s, sluice->costs.weight_switch_s + sluice->costs.weight_fill_s, 1e-12);
  EXPECT_LT(sluice->kv_tokens_per_engine, inflight->kv_tokens_per_engine);
  EXPECT_EQ(ParsePolicy("sluice").value(), Policy::kSluice);
  EXPECT_NE(ParsePolicy("magic").status().message().find("colocated_sync"), std::string::npos);
}

}  // namespace
}  // namespace sluice::simulate
