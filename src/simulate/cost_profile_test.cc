#include "sluice/simulate/cost_profile.h"

#include <gtest/gtest.h>

namespace sluice::simulate {
namespace {

TEST(CostProfileTest, RoundTripsThroughItsYaml) {
  CostProfile p;
  p.model = "llama layers=4 hidden=256";
  p.device = "cpu";
  p.threads = 1;
  p.measured_by = "sluice calibrate \"quoted\"";
  p.decode_step_s = 1.5e-3;
  p.decode_row_s = 2e-5;
  p.decode_context_s = 3.25e-8;
  p.prefill_prompt_s = 1e-4;
  p.prefill_token_s = 4e-6;
  p.train_step_s = 0.02;
  p.train_micro_batch_s = 0.003;
  p.train_token_s = 1.1e-5;
  p.train_token_context_s = 2e-9;
  p.publish_s = 0.01;
  p.weight_switch_s = 0.004;
  p.reward_answer_s = 1e-5;
  const std::string text = FormatCostProfile(p);
  auto back = ParseCostProfile(text, "profile.yaml");
  ASSERT_TRUE(back.ok()) << back.status().ToString() << "\n" << text;
  EXPECT_EQ(back->model, p.model);
  EXPECT_EQ(back->measured_by, "sluice calibrate 'quoted'");
  EXPECT_DOUBLE_EQ(back->decode_context_s, p.decode_context_s);
  EXPECT_DOUBLE_EQ(back->train_token_context_s, p.train_token_context_s);
  EXPECT_DOUBLE_EQ(back->reward_answer_s, p.reward_answer_s);
  EXPECT_DOUBLE_EQ(back->DecodeStep(4, 100), 1.5e-3 + 4 * 2e-5 + 100 * 3.25e-8);
  EXPECT_DOUBLE_EQ(back->DecodeStep(0, 0), 0.0);
}

TEST(CostProfileTest, RooflineTermTakesTheLongerOfMemoryAndCompute) {
  CostProfile p;
  p.model = "m";
  p.decode_step_s = 0.001;
  p.memory_step_s = 0.004;      // streaming the weights
  p.memory_context_s = 1e-8;    // one attended token's K and V
  p.compute_row_s = 1e-5;       // one row's matmuls
  p.compute_context_s = 1e-10;  // one attended token's attention
  // A few rows: memory bound.
  EXPECT_DOUBLE_EQ(p.DecodeStep(4, 1000), 0.001 + 0.004 + 1e-5);
  // Many rows: compute bound.
  EXPECT_DOUBLE_EQ(p.DecodeStep(1000, 0), 0.001 + 0.01);
  p.train_update_s = 0.25;
  p.train_proximal_share = 0.3;
  auto back = ParseCostProfile(FormatCostProfile(p), "p.yaml");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_DOUBLE_EQ(back->memory_step_s, 0.004);
  EXPECT_DOUBLE_EQ(back->compute_context_s, 1e-10);
  EXPECT_DOUBLE_EQ(back->train_update_s, 0.25);
  EXPECT_DOUBLE_EQ(back->train_proximal_share, 0.3);
  // Format 2 (before the proximal share) reads as no pass of its own.
  auto two = ParseCostProfile("profile:\n  format: 2\n  model: m\ntrainer:\n  step_s: 0.5\n", "two.yaml");
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  EXPECT_DOUBLE_EQ(two->train_proximal_share, 0.0);
  // Format 1 (before the roofline keys) still reads.
  auto old = ParseCostProfile("profile:\n  format: 1\n  model: m\nrollout:\n  decode_step_s: 0.5\n", "old.yaml");
  ASSERT_TRUE(old.ok()) << old.status().ToString();
  EXPECT_DOUBLE_EQ(old->DecodeStep(1, 0), 0.5);
}

TEST(CostProfileTest, RefusesWhatIsNotAProfileOfThisFormat) {
  auto none = ParseCostProfile("rollout:\n  decode_step_s: 1\n", "p.yaml");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("not a cost profile"), std::string::npos);

  auto future = ParseCostProfile("profile:\n  format: 7\n  model: m\n", "p.yaml");
  ASSERT_FALSE(future.ok());
  EXPECT_NE(future.status().message().find("format 7"), std::string::npos);

  auto unknown = ParseCostProfile("profile:\n  format: 1\n  model: m\nrollout:\n  decode_stp_s: 1\n", "p.yaml");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("decode_stp_s"), std::string::npos);

  auto negative = ParseCostProfile("profile:\n  format: 1\n  model: m\ntrainer:\n  step_s: -1\n", "p.yaml");
  ASSERT_FALSE(negative.ok());
  EXPECT_NE(negative.status().message().find("trainer.step_s"), std::string::npos);

  // A share is a fraction: the whole micro-batch cannot be the pass before it.
  auto whole = ParseCostProfile("profile:\n  format: 3\n  model: m\ntrainer:\n  proximal_share: 1\n", "p.yaml");
  ASSERT_FALSE(whole.ok());
  EXPECT_NE(whole.status().message().find("proximal_share"), std::string::npos) << whole.status().ToString();
  CostProfile direct;
  direct.model = "m";
  direct.train_proximal_share = 0.99;
  EXPECT_NE(direct.Validate().message().find("trainer.proximal_share must be at most 0.95"), std::string::npos)
      << direct.Validate().ToString();

  auto nomodel = ParseCostProfile("profile:\n  format: 1\n", "p.yaml");
  ASSERT_FALSE(nomodel.ok());
  EXPECT_NE(nomodel.status().message().find("profile.model"), std::string::npos);

  auto text = ParseCostProfile("profile:\n  format: 1\n  model: m\nweights:\n  publish_s: fast\n", "p.yaml");
  ASSERT_FALSE(text.ok());
  EXPECT_NE(text.status().message().find("publish_s"), std::string::npos);

  EXPECT_EQ(LoadCostProfile("/nonexistent/profile.yaml").status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace sluice::simulate
