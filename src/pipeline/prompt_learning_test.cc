// Learning from a reward that depends on the prompt, in the default suite
// (about half a minute on two cores): the asynchronous pipeline at staleness
// 4 with the product's correction for it (trainer.off_policy_correction
// `behavior`, PPO clipped around the policy that sampled each token), the
// rollout, reward and trainer as processes, must teach a fresh model an
// answer that changes with the prompt, and it must hold on held-out prompts
// the run never sees. Beside the held-out accuracy the test checks what the
// run measures about its own samples: they really are stale (up to 4 versions); the
// behaviour logprobs the rollout recorded are the sampler's (at step 1, where
// the trainer holds the sampler's weights, they equal the trainer's up to
// rounding); and at the stale steps the PPO ratio is taken against them, so
// the trainer clips the tokens the policy has already moved past.
//
// The task: a prompt is a number; an answer earns 1 when its first byte has
// the number's parity. A policy that ignores the prompt earns 1/2 on the
// held-out numbers, which are the multiples of 7 (the training numbers never
// are), half of them odd.
//
// Mutations tried, each reverted (seed 1 unless said; as written, seeds 1-5
// reach 100% held-out greedy and 97.5-98.5% sampled, with a logprob gap of
// 0.21-0.22 and a clip fraction of 0.18-0.21 at the stale steps):
//  * trainer.off_policy_correction=none in Options (recompute on, as `auto`
//    sets it for none). Fails: clip fraction (0 on seeds 1-3), and on seed 1
//    held-out accuracy too (89.3%). Learning alone does not catch it: seeds
//    2 and 3 reach 100%. With one-token decisions a stale uncorrected
//    gradient still raises the rewarded bytes and lowers the others; at lr
//    7e-3 or 1e-2 the uncorrected run collapses its entropy and stalls in 10
//    of 12 runs (50-87% held-out), but the corrected run then stalls in 4 of
//    12 (50-82%), so no step size told them apart by accuracy.
//  * Behaviour logprobs of the wrong version: the trainer's own recomputed
//    logprobs (the version it trains, 4 newer than the sampler) in place of
//    the rollout's (trainer.cc, RlStep: `b.behavior = prox`), as when
//    answers are rescored with the training weights. Fails: logprob gap and
//    clip fraction (both 0, seeds 1-3); held-out accuracy on seeds 1 (89.3%)
//    and 2 (50%).
//  * The rollout's logprobs attached one token late (engine.cc, RunStep:
//    each token gets its predecessor's, the first 0). Fails: the step-1 gap
//    (6.2), the reward and held-out accuracy (50%).
//  * Advantages negated (trainer.cc, Pack). Fails: the reward (0.21) and
//    held-out accuracy (0% greedy, 9% sampled).
//  * The reward role handing Score the example without its prompt (as it
//    did before this test; stream_roles.cc, RunReward). Fails: nothing
//    scores (reward 0), held-out accuracy stays at 56%, no gap, no clipping.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "common/testing/skip.h"
#include "role_test_util.h"
#include "sluice/common/file_util.h"
#include "sluice/model/weights.h"
#include "sluice/pipeline/run.h"

namespace sluice::pipeline {
namespace {

namespace fs = std::filesystem;

class PromptParityTask : public reward::Task {
 public:
  std::string name() const override { return "prompt-parity"; }
  Result<reward::Example> Get(reward::Split split, uint64_t index) const override {
    if (index >= size(split)) return Status::OutOfRange("index");
    uint64_t n = 0;
    if (split == reward::Split::kEval) {
      n = 7 * (13 * index + 1);  // parity alternates with the index
    } else {
      n = (index * 37 + 1) % 100003;  // spread over 1..5 digits, both parities alike
      if (n % 7 == 0) n += 2;         // never a held-out number, parity kept
    }
    reward::Example e;
    e.index = index;
    e.split = split;
    e.prompt = std::to_string(n);
    e.answer.assign(1, n % 2 == 0 ? '0' : '1');
    return e;
  }
  uint64_t size(reward::Split split) const override { return split == reward::Split::kTrain ? 20000 : 300; }
  // From the prompt itself (the reward role must hand Score the whole
  // example: with an empty prompt nothing scores and nothing is learned).
  double Score(const reward::Example& example, std::string_view response) const override {
    if (response.empty() || example.prompt.empty()) return 0.0;
    const bool odd = static_cast<unsigned char>(response[0]) % 2 == 1;
    return odd == ((example.prompt.back() - '0') % 2 == 1) ? 1.0 : 0.0;
  }
  bool has_solutions() const override { return false; }
};

constexpr char kRoleFilter[] = "--gtest_filter=PromptLearningRole.Run";
constexpr int64_t kSteps = 80;
constexpr int64_t kStaleness = 4;

// The launcher's and every role's options: what `sluice train` sets for
// pipeline.mode=async, pipeline.max_staleness=4 (correction `behavior`),
// with trainer.recompute_old_logprobs=true so that the trainer measures how
// far its policy lies from the behaviour logprobs (the loss does not use the
// recomputed ones under `behavior`).
RunOptions Options(const std::string& run_dir) {
  RunOptions o;
  o.run_dir = run_dir;
  o.seed = 1;
  o.checkpoint_interval = 0;
  o.rl.steps = kSteps;
  o.rl.prompts_per_step = 16;
  o.rl.group_size = 8;
  o.rl.rollout_slots = 64;
  o.rl.sampling.max_new_tokens = 2;
  o.rl.trainer.optimizer.lr = 3e-3;
  o.rl.trainer.optimizer.warmup_steps = 2;
  o.rl.trainer.loss.correction = trainer::OffPolicyCorrection::kBehavior;
  o.rl.trainer.recompute_old_logprobs = true;
  o.eval.interval = 0;
  o.eval.size = 300;
  o.eval.max_new_tokens = 1;
  o.eval.samples = 8;  // the sampled accuracy: where the policy puts its mass, not only its argmax
  o.pipeline.mode = PipelineMode::kAsync;
  o.pipeline.max_staleness = kStaleness;
  o.pipeline.rollout_threads = 1;
  o.pipeline.trainer_threads = 1;
  o.pipeline.processes = true;
  o.pipeline.wiring.role_command = role_test::RoleCommand(kRoleFilter, run_dir);
  return o;
}

TEST(PromptLearningRole, Run) {
  const std::optional<role_test::RoleArguments> role = role_test::RoleFromArguments();
  if (!role) SLUICE_CHILD_ENTRY_ONLY("PromptLearningTest");
  role_test::RunAsRole(*role, std::make_shared<PromptParityTask>(), Options);
}

// One line of metrics.jsonl, the fields this test reads.
struct Step {
  double accuracy = 0, staleness_mean = 0, clip_frac = 0, gap_mean = 0, gap_max = 0;
  int64_t staleness_max = 0;
};

std::vector<Step> ReadSteps(const std::string& run_dir) {
  std::vector<Step> steps;
  std::ifstream in(fs::path(run_dir) / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (!j.contains("staleness_max")) continue;  // not an RL step's line
    Step s;
    s.accuracy = j.at("accuracy").get<double>();
    s.staleness_mean = j.at("staleness_mean").get<double>();
    s.staleness_max = j.at("staleness_max").get<int64_t>();
    s.clip_frac = j.at("clip_frac").get<double>();
    s.gap_mean = j.at("rollout_logprob_gap_mean").get<double>();
    s.gap_max = j.at("rollout_logprob_gap_max").get<double>();
    steps.push_back(s);
  }
  return steps;
}

TEST(PromptLearningTest, AsyncAtStalenessFourLearnsAPromptDependentRewardAndClipsAgainstTheSampler) {
  torch::set_num_threads(2);
  const std::string run_dir =
      (fs::temp_directory_path() / ("sluice_prompt_learning_" + std::to_string(::getpid()))).string();
  static_cast<void>(sluice::RemoveTree(run_dir));
  auto task = std::make_shared<PromptParityTask>();
  // The held-out prompts are never trained on, and half of them are odd.
  std::set<std::string> train_prompts;
  for (uint64_t i = 0; i < task->size(reward::Split::kTrain); ++i) {
    train_prompts.insert(task->Get(reward::Split::kTrain, i)->prompt);
  }
  int64_t odd = 0;
  for (uint64_t i = 0; i < task->size(reward::Split::kEval); ++i) {
    const reward::Example e = *task->Get(reward::Split::kEval, i);
    EXPECT_EQ(train_prompts.count(e.prompt), 0u) << e.prompt;
    odd += e.answer == "1" ? 1 : 0;
  }
  EXPECT_NEAR(static_cast<double>(odd) / static_cast<double>(task->size(reward::Split::kEval)), 0.5, 0.01);

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

  const std::vector<Step> steps = ReadSteps(run_dir);
  ASSERT_EQ(static_cast<int64_t>(steps.size()), kSteps) << "the trainer process trained every step";
  // The second half of the run, where the rollout is as far ahead as allowed.
  int64_t stale_max = 0;
  double stale_late = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    stale_max = std::max(stale_max, steps[i].staleness_max);
    if (i >= steps.size() / 2) stale_late += steps[i].staleness_mean / static_cast<double>(steps.size() / 2);
  }
  // The steps whose samples are at least 2 versions old: how far the policy
  // had moved from the sampler, and how many tokens the loss clipped.
  double clip = 0, gap = 0, stale_steps = 0, reward_late = 0;
  for (const Step& s : steps) {
    if (s.staleness_mean < 2) continue;
    clip += s.clip_frac;
    gap += s.gap_mean;
    stale_steps += 1;
  }
  clip /= std::max(stale_steps, 1.0);
  gap /= std::max(stale_steps, 1.0);
  for (size_t i = steps.size() - 10; i < steps.size(); ++i) reward_late += steps[i].accuracy / 10;
  std::printf(
      "held-out accuracy %.1f%% -> %.1f%% greedy, %.1f%% -> %.1f%% sampled; staleness max %lld, mean %.2f in the "
      "second half; step 1 logprob gap max %.2e; over %g stale steps: logprob gap mean %.3f, clip fraction %.3f; "
      "reward over the last 10 steps %.3f\n",
      100 * before->accuracy, 100 * after->accuracy, 100 * before->sampled_accuracy, 100 * after->sampled_accuracy,
      static_cast<long long>(stale_max), stale_late, steps[0].gap_max, stale_steps, gap, clip, reward_late);

  EXPECT_EQ(stale_max, kStaleness) << "the rollout ran as far ahead as allowed, and no further";
  // How far the rollout runs ahead depends on the machine's load (mean 4.0 on
  // a quiet machine, 2.6 measured under the test command's load).
  EXPECT_GE(stale_late, kStaleness / 2.0) << "samples were trained 2+ versions after they were drawn, on average";
  // Step 1 trains version 0's samples with version 0: the logprobs the
  // rollout recorded and the trainer's differ by float rounding only.
  EXPECT_EQ(steps[0].staleness_max, 0);
  EXPECT_LT(steps[0].gap_max, 1e-3) << "the behaviour logprobs are not those of the weights that sampled";
  // Four updates later the policy has moved from the one that sampled, and
  // the loss, whose ratio is pi / pi_behav, clips the tokens whose ratio
  // already left [0.8, 1.2] in the direction of their advantage. Neither is
  // so when the correction is off (the ratio against the trainer's own
  // policy is 1 in a one-epoch update) or when the recorded behaviour
  // logprobs are the trainer's version instead of the sampler's.
  EXPECT_GT(gap, 0.05) << "the recorded behaviour logprobs do not lag the policy they were trained with";
  EXPECT_GT(clip, 0.05) << "the PPO ratio is not taken against the behaviour policy";

  EXPECT_LT(before->accuracy, 0.8) << "a fresh model does not answer as the reward asks";
  EXPECT_LT(before->sampled_accuracy, 0.6);
  EXPECT_GE(reward_late, 0.85) << "the run's own reward rose";
  // Held out (chance: 50%): 100% greedy and 97.5-98.5% sampled on a quiet
  // machine (seeds 1-5), 85% and 83.6% in one CI run under the test
  // command's load, where the staleness each step sees differs. Each
  // mutation above already fails a check before these (gap, clip, reward).
  EXPECT_GE(after->accuracy, 0.75) << "learned the prompt's parity from reward alone, and it holds on held-out prompts";
  EXPECT_GE(after->sampled_accuracy, 0.7);
  if (!::testing::Test::HasFailure()) static_cast<void>(sluice::RemoveTree(run_dir));  // kept for a look otherwise
}

}  // namespace
}  // namespace sluice::pipeline
