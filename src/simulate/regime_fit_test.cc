#include "sluice/simulate/regime_fit.h"

#include <gtest/gtest.h>

#include <cmath>

#include "sluice/simulate/lengths.h"

namespace sluice::simulate {
namespace {

// A small system (a second to fit, not minutes): a 1.5B model on 8 H100,
// 32 prompts x 8 answers a step, trained slowly enough that the split
// matters.
RegimeSetting Small() {
  RegimeSetting s;
  s.accelerator = *FindAccelerator("h100");
  s.model = *FindModel("qwen2.5-1.5b");
  s.prompts = 32;
  s.group = 8;
  s.prompt_tokens = 128;
  s.max_response = 2048;
  s.steps = 6;
  s.staleness = 1;
  s.mini_batches = 2;
  return s;
}

PublishedRun Split(const char* label, int64_t rollout_gpus) {
  return {label, Policy::kPartialRollout, 8, rollout_gpus, 0, -1, -1};
}

double Miss(double model, double published) { return std::abs(model / published - 1); }

// A run's times straight from the simulator (not through PredictRun, so a
// fault there cannot hide in the "published" side too).
RunTimes Truth(const RegimeSetting& s, const PublishedRun& run) {
  Workload w;
  w.steps = s.steps;
  w.prompts_per_step = s.prompts;
  w.group_size = s.group;
  w.prompt_tokens = {static_cast<int32_t>(s.prompt_tokens)};
  w.response_tokens = CappedLogNormalLengths(s.steps * s.prompts * s.group, s.median, s.spread, s.max_response, 1);
  GpuLayout g;
  g.rollout_gpus = run.policy == Policy::kColocatedSync ? run.gpus / 2 : run.rollout_gpus;
  g.trainer_gpus = run.gpus - g.rollout_gpus;
  PolicyOptions o;
  o.max_staleness = s.staleness;
  o.micro_batch_tokens = s.prompt_tokens + s.max_response;
  o.mini_batches = s.mini_batches;
  auto setup = SetUpPolicy(run.policy, s.accelerator, s.model, g, s.efficiency, o);
  EXPECT_TRUE(setup.ok()) << setup.status().ToString();
  setup->layout.max_steps_per_event = 32;
  auto r = Simulate(w, setup->layout, setup->costs);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  const SteadyStep st = SteadyState(*r);
  return {st.step_s, st.wait_s, st.train_s - setup->costs.publish_s};
}

// The predictive check's code path: "published" runs made by the model
// itself with known lengths, MFU and colocated slowdown, at three splits of
// the same cluster. Fitting on the colocated run and one split recovers the
// unknowns and that split's times, and predicts the other two splits, whose
// times differ from it and from each other.
//
// Mutation tried: PredictRun ignoring the split's GPU counts (every split run
// simulated as half and half) makes the 2:6 and 6:2 predictions those of 4:4,
// and this test fails on both.
TEST(RegimeFitTest, FitOnOneSplitRecoversItAndPredictsTheOtherSplits) {
  RegimeSetting truth = Small();
  truth.median = 400;
  truth.spread = 0.6;
  truth.efficiency.train_compute = 0.1;
  truth.efficiency.colocated_train_slowdown = 1.5;
  std::vector<PublishedRun> runs = {
      {"colocated 8", Policy::kColocatedSync, 8, 0, 0, -1, -1}, Split("4:4", 4), Split("2:6", 2), Split("6:2", 6)};
  for (PublishedRun& r : runs) {
    const RunTimes t = Truth(truth, r);
    r.step_s = t.step_s;
    r.generate_s = t.generate_s;
    r.train_s = t.train_s;
  }
  // The splits are far enough apart for a prediction to have to move.
  EXPECT_GT(Miss(runs[2].step_s, runs[1].step_s), 0.1);
  EXPECT_GT(Miss(runs[3].step_s, runs[1].step_s), 0.1);

  RegimeSetting start = Small();  // lengths, MFU and slowdown unknown
  start.efficiency.train_compute = 0.5;
  start.efficiency.colocated_train_slowdown = 1;
  auto fit = FitRegime(start, {runs[0], runs[1]}, FitGrid{{200, 400, 800}, {0.3, 0.6}});
  ASSERT_TRUE(fit.ok()) << fit.status().ToString();
  EXPECT_EQ(fit->setting.median, 400);
  EXPECT_DOUBLE_EQ(fit->setting.spread, 0.6);
  EXPECT_NEAR(fit->setting.efficiency.train_compute, 0.1, 0.011);
  EXPECT_NEAR(fit->setting.efficiency.colocated_train_slowdown, 1.5, 0.051);
  EXPECT_FALSE(fit->mfu_at_bound);
  EXPECT_FALSE(fit->slowdown_at_bound);
  ASSERT_EQ(fit->fitted.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_LT(Miss(fit->fitted[i].step_s, runs[i].step_s), 0.03) << runs[i].label;
    EXPECT_LT(Miss(fit->fitted[i].train_s, runs[i].train_s), 0.03) << runs[i].label;
  }
  for (size_t i = 2; i < runs.size(); ++i) {
    auto p = PredictRun(fit->setting, runs[i]);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    EXPECT_LT(Miss(p->step_s, runs[i].step_s), 0.03) << runs[i].label;
    EXPECT_LT(Miss(p->train_s, runs[i].train_s), 0.03) << runs[i].label;
  }
}

TEST(RegimeFitTest, ClearErrorsForWhatCannotBeFitted) {
  const PublishedRun run = {"colocated 8", Policy::kColocatedSync, 8, 0, 100, -1, -1};
  EXPECT_NE(FitRegime(Small(), {run}, FitGrid{}).status().message().find("no medians"), std::string::npos);
  EXPECT_NE(FitRegime(Small(), {}, FitGrid{{100}, {1.0}}).status().message().find("no published runs"),
            std::string::npos);
  PublishedRun unpublished = run;
  unpublished.step_s = 0;
  EXPECT_NE(FitRegime(Small(), {unpublished}, FitGrid{{100}, {1.0}}).status().message().find("no published step"),
            std::string::npos);
  PublishedRun lopsided = Split("8:0", 8);
  EXPECT_NE(PredictRun(Small(), lopsided).status().message().find("leave both sides"), std::string::npos);
}

TEST(RegimeFitTest, VerlsPublishedRunsPairEachColocatedRunWithItsSplit) {
  const PublishedSystem& verl = VerlFullyAsync7b();
  EXPECT_NE(verl.source.find("github.com/verl-project/verl/blob/"), std::string::npos);
  ASSERT_EQ(verl.points.size(), 3u);
  for (const auto& point : verl.points) {
    ASSERT_EQ(point.size(), 2u);
    const PublishedRun& colocated = verl.runs[point[0]];
    const PublishedRun& split = verl.runs[point[1]];
    EXPECT_EQ(colocated.policy, Policy::kColocatedSync);
    EXPECT_EQ(split.policy, Policy::kPartialRollout);
    EXPECT_EQ(colocated.gpus, split.gpus);
    EXPECT_EQ(split.rollout_gpus * 2, split.gpus);
  }
}

}  // namespace
}  // namespace sluice::simulate
