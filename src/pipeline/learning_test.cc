// Labelled `long` (not in the default suite, ~3 minutes on 2 cores): a short
// run on the arithmetic task — a brief warm start on the broad task, then
// synchronous GRPO on a pool of 64 prompts it has not trained on — must raise
// the reward on that pool by a clear margin. Held-out accuracy is printed, not
// asserted: see docs/training.md for where the held-out lift stands.
#include <gtest/gtest.h>

#include <filesystem>

#include "sluice/common/file_util.h"
#include "sluice/model/transformer.h"
#include "sluice/pipeline/run.h"

namespace sluice::pipeline {
namespace {

TEST(LearningTest, ShortRlRunRaisesRewardByAClearMargin) {
  torch::set_num_threads(2);
  reward::TaskOptions broad;
  broad.name = "arithmetic";
  broad.seed = 3;
  broad.arithmetic.max_ops = 3;
  broad.arithmetic.ops_exponent = 1.0;
  reward::TaskOptions pool = broad;
  pool.seed = 4;         // other problems than the warm start saw
  pool.train_size = 64;  // a fixed pool, so 60 steps revisit each prompt ~15 times
  std::shared_ptr<const reward::Task> broad_task = std::move(reward::MakeTask(broad)).value();
  std::shared_ptr<const reward::Task> pool_task = std::move(reward::MakeTask(pool)).value();
  auto model = std::make_shared<model::Transformer>(*model::PresetModelConfig("1m"), 3);

  RunOptions o;
  o.run_dir = (std::filesystem::temp_directory_path() / ("sluice_learning_" + std::to_string(::getpid()))).string();
  o.seed = 3;
  o.checkpoint_interval = 0;
  o.sft.steps = 200;
  o.sft.batch_size = 64;
  o.sft.optimizer.lr = 2e-3;
  o.sft.optimizer.warmup_steps = 20;
  o.sft.optimizer.decay_steps = 180;
  o.rl.steps = 60;
  o.rl.prompts_per_step = 16;
  o.rl.group_size = 16;
  o.rl.sampling.max_new_tokens = 48;
  o.rl.trainer.optimizer.lr = 1e-4;
  o.rl.trainer.optimizer.warmup_steps = 5;
  o.eval.interval = 0;
  o.eval.size = 200;
  o.eval.max_new_tokens = 48;
  auto warm = std::move(TrainingRun::Create(model, broad_task, o)).value();
  ASSERT_TRUE(warm->WarmStart(nullptr).ok());
  auto before = warm->Evaluate();
  ASSERT_TRUE(before.ok());

  o.sft.steps = 0;
  auto rl = std::move(TrainingRun::Create(model, pool_task, o)).value();
  ASSERT_TRUE(rl->Train(nullptr).ok());
  auto after = warm->Evaluate();
  ASSERT_TRUE(after.ok());
  const auto& h = rl->history();
  double early = 0, late = 0;
  for (int i = 0; i < 10; ++i) {
    early += h[i].reward_mean / 10;
    late += h[h.size() - 1 - i].reward_mean / 10;
  }
  std::printf("pool reward (first/last 10 steps) %.3f -> %.3f; broad held-out accuracy %.3f -> %.3f\n", early, late,
              before->accuracy, after->accuracy);
  EXPECT_GT(late, early + 0.15);
  static_cast<void>(sluice::RemoveTree(o.run_dir));
}

}  // namespace
}  // namespace sluice::pipeline
