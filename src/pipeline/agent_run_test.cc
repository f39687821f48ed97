// Agent runs end to end, in every mode: trajectories of several turns
// against a scripted environment, trained from the hub (or the direct
// loop), written to trajectories.jsonl.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "agent_driver.h"
#include "agent_test_util.h"
#include "sluice/agent/python_environment.h"
#include "sluice/common/file_util.h"
#include "sluice/model/transformer.h"
#include "sluice/pipeline/run.h"

namespace sluice::pipeline {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using agent_test::EndingModel;

// Two tool results, then done with a reward of its own (0 or 1, varying
// across a group so every group trains).
class TwoToolResults : public agent::Environment {
 public:
  explicit TwoToolResults(int64_t nonce) : nonce_(nonce) {}
  Result<agent::Opening> Reset(const std::string& row) override {
    const json j = json::parse(row);
    return agent::Opening{{{"user", j["prompt"].get<std::string>(), ""}}, ""};
  }
  Result<agent::StepResult> Step(const agent::Action&) override {
    if (steps_ == 2) return agent::StepResult{{}, static_cast<double>(nonce_ % 2), true};
    return agent::StepResult{
        {{"tool", "result-" + std::to_string(steps_++) + "-" + std::to_string(nonce_), "c"}}, std::nullopt, false};
  }

 private:
  int64_t nonce_;
  int steps_ = 0;
};

// Answers each of `turns` steps with a user message after `wait`, then
// done with reward 1 or 0 (by its nonce).
class SlowTurns : public agent::Environment {
 public:
  SlowTurns(int64_t nonce, int turns, std::chrono::milliseconds wait) : nonce_(nonce), turns_(turns), wait_(wait) {}
  Result<agent::Opening> Reset(const std::string&) override { return agent::Opening{{{"user", "go", ""}}, ""}; }
  Result<agent::StepResult> Step(const agent::Action&) override {
    std::this_thread::sleep_for(wait_);
    if (++steps_ == turns_) return agent::StepResult{{}, static_cast<double>(nonce_ % 2), true};
    return agent::StepResult{{{"user", "more", ""}}, std::nullopt, false};
  }

 private:
  int64_t nonce_;
  int turns_;
  std::chrono::milliseconds wait_;
  int steps_ = 0;
};

class AgentRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("sluice_agent_run_" + std::to_string(::getpid()));
    static_cast<void>(RemoveTree(root_));
    reward::TaskOptions t;
    t.name = "arithmetic";
    t.seed = 1;
    t.eval_size = 8;
    t.arithmetic.max_ops = 1;
    task_ = std::shared_ptr<const reward::Task>(std::move(reward::MakeTask(t)).value());
  }
  void TearDown() override { static_cast<void>(RemoveTree(root_)); }
  fs::path root_;
  std::shared_ptr<const reward::Task> task_;
};

// Every mode trains every trajectory once, each as the environment made
// it: three model turns (the end token each, trained: mask 1, a version)
// and the two tool results between them, each present, rendered by the
// built-in template and not trained (mask 0, no version); the reward is
// the environment's. Fails if environment tokens are trained, a tool
// result is dropped, a trajectory is lost or trained twice.
TEST_F(AgentRunTest, EveryModeTrainsTheTrajectoriesTheEnvironmentShaped) {
  constexpr int64_t kSteps = 3, kPrompts = 2, kGroup = 2;
  for (PipelineMode mode : {PipelineMode::kDirect, PipelineMode::kSync, PipelineMode::kAsync}) {
    const std::string name = PipelineModeName(mode);
    SCOPED_TRACE(name);
    RunOptions o;
    o.run_dir = (root_ / name).string();
    o.seed = 5;
    o.sft.steps = 0;
    o.rl.steps = kSteps;
    o.rl.prompts_per_step = kPrompts;
    o.rl.group_size = kGroup;
    o.rl.rollout_slots = 4;
    o.rl.sampling.max_new_tokens = 8;
    o.rl.trainer.optimizer.lr = 1e-4;
    o.eval.interval = 0;
    o.eval.size = 2;
    o.eval.max_new_tokens = 4;
    o.pipeline.mode = mode;
    o.pipeline.max_staleness = mode == PipelineMode::kAsync ? 2 : 0;
    o.agent.env = "calculator";  // replaced by the hook
    o.agent.env_workers = 2;
    RunHooks hooks;
    std::atomic<int64_t> made{0};
    hooks.make_environment = [&](uint64_t) -> Result<std::unique_ptr<agent::Environment>> {
      return std::unique_ptr<agent::Environment>(new TwoToolResults(made++));
    };
    std::map<uint64_t, int> inspected;
    hooks.inspect_batch = [&](int64_t, const std::vector<trainer::RolloutSample>& samples) {
      for (const auto& smp : samples) {
        ++inspected[smp.id];
        ASSERT_EQ(smp.versions.size(), smp.response.size());
        for (size_t i = 0; i < smp.response.size(); ++i) {
          // Sampled exactly where the model spoke: the end tokens.
          EXPECT_EQ(smp.versions[i] >= 0, smp.response[i] == model::ByteTokenizer::kEos) << "token " << i;
        }
      }
    };
    auto run = TrainingRun::Create(EndingModel(), task_, o, hooks);
    ASSERT_TRUE(run.ok()) << run.status().ToString();
    Status trained = (*run)->Train(nullptr);
    ASSERT_TRUE(trained.ok()) << trained.ToString();

    std::ifstream in(fs::path(o.run_dir) / kTrajectoriesFile);
    std::map<int64_t, int> seen;
    std::string line;
    while (std::getline(in, line)) {
      const json j = json::parse(line);
      ++seen[j["sample_id"].get<int64_t>()];
      const auto& tokens = j["tokens"];
      ASSERT_EQ(j["mask"].size(), tokens.size());
      EXPECT_EQ(j["end_reason"], "done");
      std::vector<std::string> roles, tool_contents;
      for (const json& turn : j["turns"]) {
        roles.push_back(turn["role"]);
        const int64_t start = turn["start"], end = turn["end"];
        std::string text;
        for (int64_t i = start; i < end; ++i) {
          const int64_t id = tokens[static_cast<size_t>(i)];
          text += id < 256 ? std::string(1, static_cast<char>(id)) : "<eos>";
          EXPECT_EQ(j["mask"][static_cast<size_t>(i)], turn["role"] == "assistant" ? 1 : 0) << text;
          EXPECT_EQ(j["versions"][static_cast<size_t>(i)].is_null(), turn["role"] != "assistant");
        }
        if (turn["role"] == "tool") {
          tool_contents.push_back(turn["content"]);
          EXPECT_EQ(text.rfind("tool: " + turn["content"].get<std::string>() + "\nassistant: ", 0), 0u) << text;
        }
        if (turn["role"] == "assistant") {
          EXPECT_EQ(text, "<eos>");
        }
      }
      EXPECT_EQ(roles, (std::vector<std::string>{"user", "assistant", "tool", "assistant", "tool", "assistant"}));
      ASSERT_EQ(tool_contents.size(), 2u);
      EXPECT_EQ(tool_contents[0].rfind("result-0-", 0), 0u);
      EXPECT_EQ(tool_contents[1].rfind("result-1-", 0), 0u);
      const int64_t nonce = std::stoll(tool_contents[0].substr(9));
      EXPECT_EQ(j["reward"].get<double>(), static_cast<double>(nonce % 2));
    }
    EXPECT_EQ(seen.size(), static_cast<size_t>(kSteps * kPrompts * kGroup)) << "every trajectory, once";
    for (const auto& [id, times] : seen) EXPECT_EQ(times, 1) << "sample " << id;
    if (mode != PipelineMode::kDirect) {
      EXPECT_EQ(inspected.size(), seen.size());
    }
    // The steps' metrics count the turns and how the trajectories ended;
    // the held-out evaluation (at the end) ran trajectories too, scored by
    // the environment's rewards (0 or 1 by the environment's nonce).
    std::ifstream metrics(fs::path(o.run_dir) / "metrics.jsonl");
    int64_t lines = 0, evals = 0;
    while (std::getline(metrics, line)) {
      const json m = json::parse(line);
      ++lines;
      if (m.contains("eval_accuracy")) {
        ++evals;
        EXPECT_EQ(m["eval_tool_use"], 0.0);
        EXPECT_GT(m["eval_reward"].get<double>(), 0.0);
        EXPECT_LT(m["eval_reward"].get<double>(), 1.0);
      }
      EXPECT_EQ(m["agent_turns_mean"], 3.0);
      EXPECT_EQ(m["agent_end_reasons"], json({{"done", kPrompts * kGroup}}));
      EXPECT_EQ(m["agent_tool_use"], 0.0);  // the model never wrote a call
    }
    EXPECT_EQ(lines, kSteps);
    EXPECT_GE(evals, 1);
  }
}

// Async: trajectories whose environment is slow see the trainer publish
// while they wait, and their later turns are sampled by the newer weights.
// Such a trajectory is finished, not restarted: each token keeps the
// version that sampled it (non-decreasing along the trajectory), the
// trainer corrects them token by token, and the sample's staleness is its
// oldest token's. Fails if a turn is tagged with a version other than the
// one serving it, or versions run backwards.
TEST_F(AgentRunTest, TrajectoriesSpanningAWeightSwitchKeepEachTokensVersion) {
  RunOptions o;
  o.run_dir = (root_ / "span").string();
  o.seed = 9;
  o.sft.steps = 0;
  o.rl.steps = 6;
  o.rl.prompts_per_step = 2;
  o.rl.group_size = 2;
  o.rl.rollout_slots = 8;
  o.rl.sampling.max_new_tokens = 4;
  o.rl.trainer.optimizer.lr = 1e-4;
  o.rl.trainer.loss.correction = trainer::OffPolicyCorrection::kBehavior;
  o.eval.interval = 0;
  o.eval.size = 2;
  o.eval.max_new_tokens = 4;
  o.pipeline.mode = PipelineMode::kAsync;
  o.pipeline.max_staleness = 2;
  o.agent.env = "calculator";
  o.agent.env_workers = 8;
  o.agent.max_turns = 8;
  RunHooks hooks;
  std::atomic<int64_t> made{0};
  hooks.make_environment = [&](uint64_t) -> Result<std::unique_ptr<agent::Environment>> {
    return std::unique_ptr<agent::Environment>(new SlowTurns(made++, 4, std::chrono::milliseconds(40)));
  };
  int64_t spanning = 0, trained = 0;
  hooks.inspect_batch = [&](int64_t, const std::vector<trainer::RolloutSample>& samples) {
    for (const auto& smp : samples) {
      ++trained;
      std::vector<PolicyVersion> sampled;
      for (PolicyVersion v : smp.versions) {
        if (v >= 0) sampled.push_back(v);
      }
      ASSERT_EQ(sampled.size(), 4u) << "four turns, an end token each";
      EXPECT_TRUE(std::is_sorted(sampled.begin(), sampled.end())) << "sample " << smp.id;
      spanning += sampled.front() != sampled.back() ? 1 : 0;
    }
  };
  auto run = TrainingRun::Create(EndingModel(), task_, o, hooks);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  Status st = (*run)->Train(nullptr);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(trained, 6 * 2 * 2);
  EXPECT_GT(spanning, 0) << "not vacuous: some trajectory's turns were sampled by two versions";
}

// Python environments whose worker processes die mid-run (a step that
// exits the process, for one trajectory in three): the dead worker is
// replaced, the trajectories that were in it end as env_error, and every
// trajectory of every prompt is still trained exactly once, in sync and
// async. Skipped without a Python interpreter. Fails if a worker's death
// loses or duplicates a sample, or stops the run.
TEST_F(AgentRunTest, EveryPromptIsTrainedOnceWithEnvironmentWorkersKilled) {
  const fs::path dir = root_ / "py";
  fs::create_directories(dir);
  std::ofstream(dir / "envs.py") << R"py(
import os
class Dies:
    def __init__(self, config):
        self.n = 0
    def reset(self, row):
        self.index = row["index"]
        return {"messages": [{"role": "user", "content": "go"}]}
    def step(self, action):
        self.n += 1
        if self.index % 3 == 0 and self.n == 2:
            os._exit(7)
        return {"messages": [{"role": "user", "content": "more"}], "reward": float(self.n % 2), "done": self.n >= 3}
)py";
  agent::PythonEnvironmentOptions po;
  po.spec = (dir / "envs.py").string() + ":Dies";
  po.executable = ::access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
  po.workers = 2;
  if (!agent::CheckPythonEnvironment(po).ok()) GTEST_SKIP() << "no usable Python interpreter";
  constexpr int64_t kSteps = 3, kPrompts = 3, kGroup = 2;
  for (PipelineMode mode : {PipelineMode::kSync, PipelineMode::kAsync}) {
    SCOPED_TRACE(PipelineModeName(mode));
    auto pool = agent::PythonEnvironmentPool::Create(po);
    ASSERT_TRUE(pool.ok()) << pool.status().ToString();
    RunOptions o;
    o.run_dir = (root_ / ("killed-" + PipelineModeName(mode))).string();
    o.seed = 3;
    o.sft.steps = 0;
    o.rl.steps = kSteps;
    o.rl.prompts_per_step = kPrompts;
    o.rl.group_size = kGroup;
    o.rl.rollout_slots = 4;
    o.rl.sampling.max_new_tokens = 4;
    o.rl.trainer.optimizer.lr = 1e-4;
    o.eval.interval = 0;
    o.eval.size = 2;
    o.eval.max_new_tokens = 4;
    o.pipeline.mode = mode;
    o.pipeline.max_staleness = mode == PipelineMode::kAsync ? 2 : 0;
    o.agent.env = "calculator";  // replaced by the hook: the pool's Python environments
    o.agent.env_workers = 2;
    RunHooks hooks;
    hooks.make_environment = [p = *pool](uint64_t) -> Result<std::unique_ptr<agent::Environment>> { return p->Make(); };
    std::map<uint64_t, int> trained;
    hooks.inspect_batch = [&](int64_t, const std::vector<trainer::RolloutSample>& samples) {
      for (const auto& smp : samples) ++trained[smp.id];
    };
    auto run = TrainingRun::Create(EndingModel(), task_, o, hooks);
    ASSERT_TRUE(run.ok()) << run.status().ToString();
    Status st = (*run)->Train(nullptr);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(trained.size(), static_cast<size_t>(kSteps * kPrompts * kGroup));
    for (const auto& [id, times] : trained) EXPECT_EQ(times, 1) << "sample " << id;
    std::ifstream in(fs::path(o.run_dir) / kTrajectoriesFile);
    std::map<std::string, int> reasons;
    std::string line;
    while (std::getline(in, line)) ++reasons[json::parse(line)["end_reason"].get<std::string>()];
    EXPECT_GT(reasons["env_error"], 0) << "not vacuous: workers died";
    EXPECT_GT(reasons["done"], 0);
  }
}

}  // namespace
}  // namespace sluice::pipeline
