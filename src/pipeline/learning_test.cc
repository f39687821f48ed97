// Labelled `long` (not in the default suite, ~4 minutes on 2 cores): a short
// run on the arithmetic task — brief warm start, then synchronous GRPO — must
// raise the training reward by a clear margin. Held-out accuracy is printed,
// not asserted: see the notes in docs/training.md on what RL does to it.
#include <gtest/gtest.h>

#include <filesystem>

#include "sluice/pipeline/sync_loop.h"

namespace sluice::pipeline {
namespace {

TEST(LearningTest, ShortRlRunRaisesRewardByAClearMargin) {
  torch::set_num_threads(2);
  reward::TaskOptions t;
  t.name = "arithmetic";
  t.seed = 3;
  t.arithmetic.max_ops = 3;
  t.arithmetic.ops_exponent = 1.0;
  std::shared_ptr<const reward::Task> task = std::move(reward::MakeTask(t)).value();
  auto model = std::make_shared<model::Transformer>(*model::PresetModelConfig("1m"), 3);
  LoopOptions o;
  o.run_dir = (std::filesystem::temp_directory_path() / ("sluice_learning_" + std::to_string(::getpid()))).string();
  o.seed = 3;
  o.checkpoint_interval = 0;
  o.sft.steps = 200;
  o.sft.batch_size = 64;
  o.sft.optimizer.lr = 2e-3;
  o.sft.optimizer.warmup_steps = 20;
  o.sft.optimizer.decay_steps = 180;
  o.rl.steps = 100;
  o.rl.prompts_per_step = 16;
  o.rl.group_size = 16;
  o.rl.dynamic_sampling = true;
  o.rl.sampling.max_new_tokens = 48;
  o.rl.trainer.optimizer.lr = 1e-4;
  o.rl.trainer.optimizer.warmup_steps = 5;
  o.rl.trainer.loss.aggregation = trainer::LossAggregation::kSequenceMean;
  o.eval.interval = 0;
  o.eval.size = 200;
  o.eval.max_new_tokens = 48;
  auto loop = std::move(SyncLoop::Create(model, task, o)).value();
  ASSERT_TRUE(loop->WarmStart(nullptr).ok());
  auto before = loop->Evaluate();
  ASSERT_TRUE(before.ok());
  ASSERT_TRUE(loop->Train(nullptr).ok());
  auto after = loop->Evaluate();
  ASSERT_TRUE(after.ok());
  const auto& h = loop->history();
  double early = 0, late = 0;
  for (int i = 0; i < 10; ++i) {
    early += h[i].reward_mean / 10;
    late += h[h.size() - 1 - i].reward_mean / 10;
  }
  std::printf("held-out accuracy %.3f -> %.3f; train reward (first/last 10 steps) %.3f -> %.3f\n", before->accuracy,
              after->accuracy, early, late);
  EXPECT_GT(late, early + 0.10);
  std::filesystem::remove_all(o.run_dir);
}

}  // namespace
}  // namespace sluice::pipeline
