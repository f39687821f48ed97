// Learning in the default suite (well under a minute on two cores): the
// asynchronous pipeline with the rollout, reward and trainer as processes
// (staleness 2, truncated IS) must move a fresh model toward what the reward
// asks, end to end: rewards reach the trainer through the hub, its updates
// reach the rollout through the weight store, and the held-out greedy
// answers (prompts the run never trains on) change accordingly. It fails if
// any link breaks or an advantage's sign flips.
//
// The task: a prompt is a number; an answer earns 1 when its first byte is
// even. A fresh model's greedy first byte is even for about half the prompts.
// Train and held-out numbers are disjoint (held-out: multiples of 7).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "common/testing/skip.h"
#include "role_test_util.h"
#include "sluice/common/file_util.h"
#include "sluice/model/weights.h"
#include "sluice/pipeline/run.h"

namespace sluice::pipeline {
namespace {

namespace fs = std::filesystem;

class EvenFirstByteTask : public reward::Task {
 public:
  std::string name() const override { return "even-first-byte"; }
  Result<reward::Example> Get(reward::Split split, uint64_t index) const override {
    if (index >= size(split)) return Status::OutOfRange("index");
    uint64_t n = 0;
    if (split == reward::Split::kEval) {
      n = 7 * (13 * index + 1);
    } else {
      n = (index * 37 + 1) % 100003;  // spread over 1..5 digits
      if (n % 7 == 0) ++n;            // never a held-out number
    }
    reward::Example e;
    e.index = index;
    e.prompt = std::to_string(n);
    e.answer = "even";
    return e;
  }
  uint64_t size(reward::Split split) const override { return split == reward::Split::kTrain ? 20000 : 300; }
  double Score(const reward::Example& example, std::string_view response) const override {
    return !response.empty() && static_cast<unsigned char>(response[0]) % 2 == 0 ? 1.0 : 0.0;
  }
  bool has_solutions() const override { return false; }
};

constexpr char kRoleFilter[] = "--gtest_filter=AsyncLearningRole.Run";

// The launcher's and every role's options.
RunOptions Options(const std::string& run_dir) {
  RunOptions o;
  o.run_dir = run_dir;
  o.seed = 5;
  o.checkpoint_interval = 0;
  o.rl.steps = 30;
  o.rl.prompts_per_step = 16;
  o.rl.group_size = 8;
  o.rl.rollout_slots = 64;
  o.rl.sampling.max_new_tokens = 2;
  o.rl.trainer.optimizer.lr = 3e-3;
  o.rl.trainer.optimizer.warmup_steps = 2;
  o.rl.trainer.loss.correction = trainer::OffPolicyCorrection::kTokenTis;
  o.eval.interval = 0;
  o.eval.size = 300;
  o.eval.max_new_tokens = 1;
  o.pipeline.mode = PipelineMode::kAsync;
  o.pipeline.max_staleness = 2;
  o.pipeline.rollout_threads = 1;
  o.pipeline.trainer_threads = 1;
  o.pipeline.processes = true;
  o.pipeline.wiring.role_command = role_test::RoleCommand(kRoleFilter, run_dir);
  return o;
}

TEST(AsyncLearningRole, Run) {
  const std::optional<role_test::RoleArguments> role = role_test::RoleFromArguments();
  if (!role) SLUICE_CHILD_ENTRY_ONLY("AsyncLearningTest");
  role_test::RunAsRole(*role, std::make_shared<EvenFirstByteTask>(), Options);
}

TEST(AsyncLearningTest, RolesAsProcessesLearnFromRewardAloneAndItHoldsOnHeldOutPrompts) {
  torch::set_num_threads(2);
  const std::string run_dir =
      (fs::temp_directory_path() / ("sluice_async_learning_" + std::to_string(::getpid()))).string();
  static_cast<void>(sluice::RemoveTree(run_dir));
  auto task = std::make_shared<EvenFirstByteTask>();
  // The held-out prompts are never trained on.
  std::set<std::string> train_prompts;
  for (uint64_t i = 0; i < 2000; ++i) train_prompts.insert(task->Get(reward::Split::kTrain, i)->prompt);
  for (uint64_t i = 0; i < task->size(reward::Split::kEval); ++i) {
    EXPECT_EQ(train_prompts.count(task->Get(reward::Split::kEval, i)->prompt), 0u);
  }

  model::ModelConfig config = *model::PresetModelConfig("1m");
  config.max_position_embeddings = 64;
  auto loop =
      std::move(TrainingRun::Create(std::make_shared<model::Transformer>(config, 11), task, Options(run_dir))).value();
  auto before = loop->Evaluate();
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  Status st = loop->Train(nullptr);
  ASSERT_TRUE(st.ok()) << st.ToString();
  auto after = loop->Evaluate();
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  int64_t steps = 0, stale = 0;
  std::ifstream metrics(fs::path(run_dir) / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    ++steps;
    const auto at = line.find("\"staleness_max\":");
    if (at != std::string::npos) stale = std::max<int64_t>(stale, std::stoll(line.substr(at + 16)));
  }
  std::printf("held-out accuracy %.1f%% -> %.1f%% (%lld examples), %lld steps, max staleness %lld\n",
              100 * before->accuracy, 100 * after->accuracy, static_cast<long long>(after->examples),
              static_cast<long long>(steps), static_cast<long long>(stale));
  EXPECT_EQ(steps, 30) << "the trainer process trained every step";
  EXPECT_LE(stale, 2);
  EXPECT_LT(before->accuracy, 0.8) << "a fresh model does not answer as the reward asks";
  EXPECT_GE(after->accuracy, 0.95) << "learned from reward alone, and it holds on held-out prompts";
  if (!::testing::Test::HasFailure()) static_cast<void>(sluice::RemoveTree(run_dir));  // kept for a look otherwise
}

}  // namespace
}  // namespace sluice::pipeline
