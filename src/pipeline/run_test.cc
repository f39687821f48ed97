#include "sluice/pipeline/run.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>

#include "common/testing/skip.h"
#include "role_test_util.h"
#include "sluice/common/file_util.h"
#include "sluice/common/shm.h"
#include "sluice/model/weights.h"
#include "sluice/pipeline/evaluator.h"
#include "sluice/pipeline/options_table.h"
#include "sluice/trainer/trainer.h"
#include "stream_roles.h"

namespace sluice::pipeline {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A user-defined task (the Task interface is how users add their own): the
// reward is 1 when the response starts with an even byte, so even a random
// model gets a mix of rewards and every RL step has a learning signal.
class EvenFirstByteTask : public reward::Task {
 public:
  std::string name() const override { return "even-first-byte"; }
  Result<reward::Example> Get(reward::Split split, uint64_t index) const override {
    if (index >= size(split)) return Status::OutOfRange("index");
    reward::Example e;
    e.index = index;
    e.prompt = std::string(split == reward::Split::kTrain ? "t" : "e") + std::to_string(index) + ":";
    e.answer = "0";
    e.solution = "0#0";
    return e;
  }
  uint64_t size(reward::Split split) const override { return split == reward::Split::kTrain ? 1000 : 20; }
  double Score(const reward::Example&, std::string_view response) const override {
    return !response.empty() && static_cast<unsigned char>(response[0]) % 2 == 0 ? 1.0 : 0.0;
  }
  bool has_solutions() const override { return true; }
};

// Small runs: a few warm-start steps, then `steps` RL steps of 3 prompts x 4 answers.
RunOptions BaseOptions(const std::string& run_dir, int64_t steps) {
  RunOptions o;
  o.run_dir = run_dir;
  o.seed = 7;
  o.checkpoint_interval = 2;
  o.sft.steps = 3;
  o.sft.batch_size = 8;
  o.sft.optimizer.lr = 3e-3;
  o.rl.steps = steps;
  o.rl.prompts_per_step = 3;
  o.rl.group_size = 4;
  o.rl.rollout_slots = 8;
  o.rl.sampling.max_new_tokens = 12;
  o.rl.trainer.optimizer.lr = 1e-3;
  o.rl.trainer.loss.kl_coef = 0.05;
  o.eval.interval = 2;
  o.eval.size = 8;
  o.eval.max_new_tokens = 12;
  return o;
}

class TrainingRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("sluice_run_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    static_cast<void>(sluice::RemoveTree(root_));
    reward::TaskOptions t;
    t.name = "arithmetic";
    t.seed = 1;
    t.eval_size = 16;
    t.arithmetic.max_ops = 2;
    task_ = std::shared_ptr<const reward::Task>(std::move(reward::MakeTask(t)).value());
  }
  void TearDown() override { static_cast<void>(sluice::RemoveTree(root_)); }

  RunOptions Options(const std::string& name, int64_t steps) { return BaseOptions((root_ / name).string(), steps); }

  std::shared_ptr<model::Transformer> FreshModel() {
    model::ModelConfig c = *model::PresetModelConfig("tiny");
    c.max_position_embeddings = 64;
    return std::make_shared<model::Transformer>(c, 3);
  }

  static std::vector<json> ReadMetrics(const std::string& run_dir) {
    std::vector<json> out;
    std::ifstream in(fs::path(run_dir) / "metrics.jsonl");
    std::string line;
    while (std::getline(in, line)) out.push_back(json::parse(line));
    return out;
  }

  fs::path root_;
  std::shared_ptr<const reward::Task> task_;
};

TEST_F(TrainingRunTest, ResumedRunReproducesTheUninterruptedRun) {
  task_ = std::make_shared<EvenFirstByteTask>();
  // Uninterrupted: 4 steps.
  auto full = std::move(TrainingRun::Create(FreshModel(), task_, Options("full", 4))).value();
  Status st = full->WarmStart(nullptr);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_TRUE(full->Train(nullptr).ok());
  // Interrupted after step 2 (its checkpoint), then resumed by a new process-like loop.
  auto first = std::move(TrainingRun::Create(FreshModel(), task_, Options("split", 2))).value();
  ASSERT_TRUE(first->WarmStart(nullptr).ok());
  ASSERT_TRUE(first->Train(nullptr).ok());
  RunOptions resumed_options = Options("split", 4);
  resumed_options.resume = true;
  auto resumed = std::move(TrainingRun::Create(FreshModel(), task_, resumed_options)).value();
  ASSERT_TRUE(resumed->WarmStart(nullptr).ok());
  ASSERT_TRUE(resumed->Train(nullptr).ok());
  EXPECT_EQ(resumed->step(), 4);

  auto a = ReadMetrics((root_ / "full").string()), b = ReadMetrics((root_ / "split").string());
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  for (size_t i = 0; i < a.size(); ++i) {
    for (const char* key : {"step", "reward_mean", "accuracy", "response_len_mean", "generated_tokens", "loss",
                            "pg_loss", "kl", "entropy", "grad_norm", "lr"}) {
      EXPECT_EQ(a[i][key], b[i][key]) << "step " << i + 1 << " key " << key;
    }
    EXPECT_EQ(a[i].contains("eval_accuracy"), b[i].contains("eval_accuracy"));
  }
  EXPECT_GT(a[3]["kl"].get<double>(), 0.0) << "the KL term is active against the stored reference";
  EXPECT_GT(a[3]["samples_trained"].get<int64_t>(), 0);
  EXPECT_TRUE(fs::exists(root_ / "split" / "checkpoints" / "step_000004" / "model.safetensors"));
  EXPECT_TRUE(fs::exists(root_ / "split" / "checkpoints" / "step_000002" / "optimizer.safetensors"));
}

TEST_F(TrainingRunTest, ResumeWithoutACheckpointStartsFresh) {
  task_ = std::make_shared<EvenFirstByteTask>();
  RunOptions o = Options("fresh", 1);
  o.sft.steps = 0;
  o.checkpoint_interval = 0;
  fs::create_directories(o.run_dir);
  std::ofstream(fs::path(o.run_dir) / "metrics.jsonl") << "{\"step\": 1}\n{\"step\": 2}\n";
  o.resume = true;  // but there is no checkpoints/latest
  auto loop = std::move(TrainingRun::Create(FreshModel(), task_, o)).value();
  ASSERT_TRUE(loop->Train(nullptr).ok());
  auto lines = ReadMetrics(o.run_dir);
  ASSERT_EQ(lines.size(), 1u) << "stale lines of an earlier attempt are not kept";
  EXPECT_TRUE(lines[0].contains("reward_mean"));
}

TEST_F(TrainingRunTest, DynamicSamplingDropsGroupsWithoutSignal) {
  // A fresh model never answers correctly: every group is all-zero reward.
  RunOptions o = Options("dynamic", 2);
  o.sft.steps = 0;
  o.rl.dynamic_sampling = true;
  auto model = FreshModel();
  auto before = *model::ExportWeights(*model);
  auto loop = std::move(TrainingRun::Create(model, task_, o)).value();
  ASSERT_TRUE(loop->Train(nullptr).ok());
  ASSERT_EQ(loop->history().size(), 2u);
  for (const auto& r : loop->history()) {
    EXPECT_EQ(r.reward_mean, 0.0);
    EXPECT_EQ(r.groups_kept, 0);
    EXPECT_EQ(r.samples_trained, 0);
  }
  auto after = *model::ExportWeights(*model);
  for (const auto& [name, t] : before) EXPECT_EQ(std::memcmp(t.data, after.at(name).data, t.nbytes), 0) << name;
}

TEST_F(TrainingRunTest, WarmStartWritesACheckpointAndLearnsTheFormat) {
  RunOptions o = Options("sft", 0);
  o.sft.steps = 60;
  o.sft.batch_size = 32;
  o.sft.optimizer.lr = 1e-2;
  o.eval.max_new_tokens = 40;
  auto model = FreshModel();
  auto loop = std::move(TrainingRun::Create(model, task_, o)).value();
  auto before = loop->Evaluate();
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  Status st = loop->WarmStart(nullptr);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(fs::exists(root_ / "sft" / "sft" / "config.json"));
  auto loaded = model::LoadPretrained((root_ / "sft" / "sft").string());
  ASSERT_TRUE(loaded.ok());
  auto after = loop->Evaluate();
  ASSERT_TRUE(after.ok());
  // The warm-started model stops at EOS with short answers instead of rambling
  // to the limit (the run's one evaluator reads the weights as they are at
  // each call: the warm start changed them in place).
  EXPECT_LT(after->mean_length, before->mean_length);
  // An evaluator on its own (as `sluice eval` uses it, no training run) sees
  // the same weights the same way, and the run's evaluation is that evaluator.
  auto evaluator = Evaluator::Create(model, task_, EvaluatorOptionsFor(o));
  ASSERT_TRUE(evaluator.ok()) << evaluator.status().ToString();
  auto alone = (*evaluator)->Evaluate();
  ASSERT_TRUE(alone.ok()) << alone.status().ToString();
  EXPECT_EQ(alone->accuracy, after->accuracy);
  EXPECT_EQ(alone->mean_length, after->mean_length);
  EXPECT_EQ(alone->mean_reward, after->mean_reward);
}

TEST_F(TrainingRunTest, EvaluatorRejectsBadOptionsNamingTheKey) {
  auto model = FreshModel();
  RunOptions o = Options("evaluator", 0);
  auto expect_bad = [&](EvaluatorOptions bad, const std::string& key) {
    auto r = Evaluator::Create(model, task_, bad);
    ASSERT_FALSE(r.ok()) << key;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(key), std::string::npos) << r.status().ToString();
  };
  EvaluatorOptions bad = EvaluatorOptionsFor(o);
  bad.eval.size = 0;
  expect_bad(bad, "eval.size");
  bad = EvaluatorOptionsFor(o);
  bad.eval.samples = -1;
  expect_bad(bad, "eval.samples");
  bad = EvaluatorOptionsFor(o);
  bad.eval.max_new_tokens = 0;
  expect_bad(bad, "eval.max_new_tokens");
  EXPECT_FALSE(Evaluator::Create(nullptr, task_, EvaluatorOptionsFor(o)).ok());
}

TEST_F(TrainingRunTest, EvaluationReportsSampledAccuracyAndADifficultyBreakdown) {
  RunOptions o = Options("eval", 0);
  o.eval.size = 12;
  auto loop = std::move(TrainingRun::Create(FreshModel(), task_, o)).value();
  auto greedy_only = loop->Evaluate();
  ASSERT_TRUE(greedy_only.ok()) << greedy_only.status().ToString();
  EXPECT_EQ(greedy_only->sampled_accuracy, -1);

  o.eval.samples = 3;
  loop = std::move(TrainingRun::Create(FreshModel(), task_, o)).value();
  auto e = loop->Evaluate();
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->examples, 12);
  EXPECT_GE(e->sampled_accuracy, 0);
  EXPECT_LE(e->sampled_accuracy, 1);
  // The greedy answers are the same whether or not samples are drawn next to them.
  EXPECT_EQ(e->accuracy, greedy_only->accuracy);
  EXPECT_EQ(e->mean_length, greedy_only->mean_length);
  // Every example lands in the bucket of its difficulty (max_ops = 2: 1 or 2 operations).
  int64_t total = 0, correct = 0;
  for (const auto& [difficulty, bucket] : e->by_difficulty) {
    EXPECT_TRUE(difficulty == 1 || difficulty == 2) << difficulty;
    total += bucket.total;
    correct += bucket.correct;
  }
  EXPECT_EQ(total, 12);
  EXPECT_DOUBLE_EQ(static_cast<double>(correct) / 12, e->accuracy);
  for (uint64_t i = 0; i < 12; ++i) {
    const int d = task_->Get(reward::Split::kEval, i)->difficulty;
    EXPECT_TRUE(d == 1 || d == 2) << d;
  }
}

TEST_F(TrainingRunTest, ShortcutWarmStartTeachesBareAnswers) {
  // With every target a bare answer, the warm-started model answers "#..." at
  // once: much shorter greedy answers than with worked solutions.
  auto mean_length_after_sft = [&](double shortcut) {
    RunOptions o = Options(shortcut > 0 ? "shortcut" : "worked", 0);
    o.sft.steps = 60;
    o.sft.batch_size = 32;
    o.sft.optimizer.lr = 1e-2;
    o.sft.shortcut_fraction = shortcut;
    o.eval.max_new_tokens = 40;
    auto loop = std::move(TrainingRun::Create(FreshModel(), task_, o)).value();
    EXPECT_TRUE(loop->WarmStart(nullptr).ok());
    return loop->Evaluate()->mean_length;
  };
  const double worked = mean_length_after_sft(0.0);
  const double bare = mean_length_after_sft(1.0);
  EXPECT_LT(bare, 0.6 * worked) << "bare " << bare << " worked " << worked;
}

// The direct loop and sync mode over the hub train the same batches with the
// same weights: identical rewards and losses, step by step.
TEST_F(TrainingRunTest, SyncModeOverTheHubReproducesTheDirectLoop) {
  task_ = std::make_shared<EvenFirstByteTask>();  // every step has a learning signal
  auto run = [&](PipelineMode mode, int32_t engines) {
    RunOptions o = Options(PipelineModeName(mode) + std::to_string(engines), 4);
    o.pipeline.mode = mode;
    o.pipeline.rollout_engines = engines;
    o.rl.dynamic_sampling = true;
    auto loop = std::move(TrainingRun::Create(FreshModel(), task_, o)).value();
    Status st = loop->Train(nullptr);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return loop->history();
  };
  const auto direct = run(PipelineMode::kDirect, 1);
  // Two data-parallel engines too: an answer does not depend on which engine
  // or batch generated it.
  for (int32_t engines : {1, 2}) {
    SCOPED_TRACE("rollout engines: " + std::to_string(engines));
    const auto sync = run(PipelineMode::kSync, engines);
    ASSERT_EQ(direct.size(), 4u);
    ASSERT_EQ(sync.size(), 4u);
    for (size_t i = 0; i < direct.size(); ++i) {
      EXPECT_EQ(sync[i].prompts, direct[i].prompts) << "step " << i + 1;
      EXPECT_EQ(sync[i].reward_mean, direct[i].reward_mean) << "step " << i + 1;
      EXPECT_EQ(sync[i].samples_trained, direct[i].samples_trained) << "step " << i + 1;
      EXPECT_EQ(sync[i].generated_tokens, direct[i].generated_tokens) << "step " << i + 1;
      EXPECT_NEAR(sync[i].train.loss, direct[i].train.loss, 1e-6) << "step " << i + 1;
      EXPECT_NEAR(sync[i].train.grad_norm, direct[i].train.grad_norm, 1e-5) << "step " << i + 1;
      EXPECT_EQ(sync[i].staleness_max, 0);
      if (direct[i].has_eval) {
        EXPECT_EQ(sync[i].eval.accuracy, direct[i].eval.accuracy);
      }
    }
  }
  // Not vacuous: the runs trained, and the weights moved between steps.
  int64_t trained = 0;
  for (const auto& r : direct) trained += r.samples_trained;
  EXPECT_GT(trained, 0);
  EXPECT_GT(direct.back().train.grad_norm, 0);
  EXPECT_NE(direct.front().reward_mean, direct.back().reward_mean);
}

// Every mode trains each answer exactly once, none lost, and no sample lags
// the trainer by more than the mode's staleness bound. Counted from the
// samples the trainer really trained (their ids come from the hub's rows),
// on long and short answers, so that in the stale modes staleness above 0
// does happen.
TEST_F(TrainingRunTest, StreamingModesTrainEveryAnswerOnceWithinTheStalenessBound) {
  struct Case {
    PipelineMode mode;
    int64_t max_staleness;
    rollout::SwitchPolicy policy;
    TrainOrder order = TrainOrder::kPrompt;
    int32_t engines = 1;
  };
  task_ = std::make_shared<EvenFirstByteTask>();
  constexpr int64_t kSteps = 6, kPrompts = 3, kGroup = 4;
  for (const Case& c : {Case{PipelineMode::kSync, 0, rollout::SwitchPolicy::kInFlight},
                        Case{PipelineMode::kSync, 0, rollout::SwitchPolicy::kInFlight, TrainOrder::kCompletion},
                        Case{PipelineMode::kOneStepOff, 1, rollout::SwitchPolicy::kInFlight},
                        Case{PipelineMode::kAsync, 2, rollout::SwitchPolicy::kInFlight},
                        Case{PipelineMode::kAsync, 3, rollout::SwitchPolicy::kAtBoundary},
                        Case{PipelineMode::kAsync, 2, rollout::SwitchPolicy::kInFlight, TrainOrder::kPrompt, 2}}) {
    const std::string name = PipelineModeName(c.mode) + std::to_string(c.max_staleness) +
                             (c.order == TrainOrder::kPrompt ? "-prompt" : "-completion") + "-engines" +
                             std::to_string(c.engines) +
                             (c.policy == rollout::SwitchPolicy::kInFlight ? "-inflight" : "-boundary");
    SCOPED_TRACE(name);
    RunOptions o = Options(name, kSteps);
    o.pipeline.mode = c.mode;
    o.pipeline.rollout_engines = c.engines;
    o.pipeline.max_staleness = c.max_staleness;
    o.pipeline.switch_policy = c.policy;
    o.pipeline.train_order = c.order;
    o.rl.trainer.loss.correction =
        c.max_staleness > 0 ? trainer::OffPolicyCorrection::kTokenTis : trainer::OffPolicyCorrection::kNone;
    // A long tail: one answer in six is 8x the others.
    RunHooks hooks;
    hooks.forced_length = [](uint64_t cursor, int64_t g) {
      return static_cast<int32_t>((cursor * kGroup + static_cast<uint64_t>(g)) % 6 == 0 ? 40 : 5);
    };
    o.eval.interval = 0;
    std::map<uint64_t, int> trained_ids;  // sample id -> times trained
    int64_t staleness_max = 0;
    hooks.inspect_batch = [&](int64_t step, const std::vector<trainer::RolloutSample>& samples) {
      std::set<uint64_t> groups;
      for (const auto& smp : samples) {
        ++trained_ids[smp.id];
        groups.insert(static_cast<uint64_t>(smp.group_id));
        EXPECT_EQ(smp.id / kGroup, static_cast<uint64_t>(smp.group_id)) << "sample " << smp.id;
      }
      EXPECT_EQ(groups.size(), static_cast<size_t>(kPrompts)) << "step " << step << ": whole groups, P of them";
      if (c.order == TrainOrder::kPrompt) {  // each step trains exactly its own prompts, as the direct loop does
        const uint64_t first = static_cast<uint64_t>((step - 1) * kPrompts);
        EXPECT_EQ(groups, std::set<uint64_t>({first, first + 1, first + 2})) << "step " << step;
      }
    };
    auto loop = std::move(TrainingRun::Create(FreshModel(), task_, o, hooks)).value();
    Status st = loop->Train(nullptr);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_EQ(trained_ids.size(), static_cast<size_t>(kSteps * kPrompts * kGroup)) << "every answer trained";
    EXPECT_EQ(trained_ids.begin()->first, 0u);
    EXPECT_EQ(trained_ids.rbegin()->first, static_cast<uint64_t>(kSteps * kPrompts * kGroup - 1)) << "none skipped";
    for (const auto& [id, times] : trained_ids) EXPECT_EQ(times, 1) << "sample " << id;
    std::set<uint64_t> recorded;
    for (const StepRecord& r : loop->history()) {
      EXPECT_EQ(r.prompts.size(), static_cast<size_t>(kPrompts)) << "step " << r.step;
      recorded.insert(r.prompts.begin(), r.prompts.end());
      EXPECT_EQ(r.duplicate_groups, 0);
      EXPECT_LE(r.staleness_max, c.max_staleness) << "step " << r.step;
      EXPECT_LE(r.token_staleness_mean, static_cast<double>(c.max_staleness));
      staleness_max = std::max(staleness_max, r.staleness_max);
    }
    EXPECT_EQ(recorded.size(), static_cast<size_t>(kSteps * kPrompts)) << "the metrics name every prompt once";
    if (c.max_staleness > 0) {
      EXPECT_GT(staleness_max, 0) << "not vacuous: some samples were stale";
    } else {
      EXPECT_EQ(staleness_max, 0);
    }
    const StreamSummary summary = loop->stream_summary();
    EXPECT_GT(summary.rollout_occupancy, 0.0);
    EXPECT_LE(summary.rollout_occupancy, 1.0);
    EXPECT_GT(summary.rollout_tokens, 0);
  }
}

// A trainer that drops groups it has taken without acking them (as one that
// died holding them would) gets them again from the hub once their leases
// run out, and the run still trains every answer exactly once.
// A run whose updates are all skipped (the gradient is NaN: here every
// reward is) stops with an error instead of finishing having trained nothing.
TEST_F(TrainingRunTest, ARunThatKeepsSkippingUpdatesFails) {
  struct NanRewardTask : EvenFirstByteTask {
    double Score(const reward::Example&, std::string_view) const override {
      return std::numeric_limits<double>::quiet_NaN();
    }
  };
  task_ = std::make_shared<NanRewardTask>();
  RunOptions o = Options("nan_rewards", 6);
  o.sft.steps = 0;
  o.eval.interval = 0;
  o.rl.dynamic_sampling = false;
  auto run = std::move(TrainingRun::Create(FreshModel(), task_, o)).value();
  Status st = run->Train(nullptr);
  EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st.ToString();
  EXPECT_NE(st.message().find("not finite in 3 updates in a row"), std::string::npos) << st.ToString();
  EXPECT_EQ(run->history().size(), 2u) << "stopped at the third skipped update";
}

// A metrics line that cannot be written (here: metrics.jsonl is /dev/full,
// as on a full disk) stops the run at that step with an error naming the
// file, in the direct loop and in the streaming trainer.
TEST_F(TrainingRunTest, AMetricsWriteThatFailsStopsTheRun) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full here";
  task_ = std::make_shared<EvenFirstByteTask>();
  for (PipelineMode mode : {PipelineMode::kDirect, PipelineMode::kSync}) {
    SCOPED_TRACE(PipelineModeName(mode));
    RunOptions o = Options("full_disk_" + PipelineModeName(mode), 3);
    o.pipeline.mode = mode;
    o.eval.interval = 0;
    fs::create_directories(o.run_dir);
    fs::create_symlink("/dev/full", fs::path(o.run_dir) / "metrics.jsonl");
    auto run = std::move(TrainingRun::Create(FreshModel(), task_, o)).value();
    Status st = run->Train(nullptr);
    EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
    EXPECT_NE(st.message().find("metrics.jsonl"), std::string::npos) << st.ToString();
    EXPECT_NE(st.message().find("No space left"), std::string::npos) << st.ToString();
    EXPECT_LE(run->history().size(), 1u) << "the run went on after a failed write";
  }
}

TEST_F(TrainingRunTest, GroupsATrainerLostAreRedeliveredAfterTheirLease) {
  task_ = std::make_shared<EvenFirstByteTask>();
  constexpr int64_t kSteps = 4, kPrompts = 3, kGroup = 4;
  RunOptions o = Options("lost_groups", kSteps);
  o.pipeline.mode = PipelineMode::kAsync;
  o.pipeline.max_staleness = 2;
  o.pipeline.lease_seconds = 1;
  o.rl.trainer.loss.correction = trainer::OffPolicyCorrection::kTokenTis;
  o.eval.interval = 0;
  const std::set<uint64_t> lose = {1, 7};  // in the first and the third step
  std::map<uint64_t, int> taken;           // prompt cursor -> deliveries
  std::map<uint64_t, int> trained_ids;     // sample id -> times trained
  std::mutex mu;
  RunHooks hooks;
  hooks.lose_taken_group = [&](uint64_t cursor) {
    std::lock_guard<std::mutex> lock(mu);
    return ++taken[cursor] == 1 && lose.count(cursor) > 0;
  };
  hooks.inspect_batch = [&](int64_t, const std::vector<trainer::RolloutSample>& samples) {
    for (const auto& smp : samples) ++trained_ids[smp.id];
  };
  auto loop = std::move(TrainingRun::Create(FreshModel(), task_, o, hooks)).value();
  const auto start = std::chrono::steady_clock::now();
  Status st = loop->Train(nullptr);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::seconds(1)) << "the lost groups waited for a lease";
  for (uint64_t cursor : lose) EXPECT_EQ(taken[cursor], 2) << "prompt " << cursor << " delivered again once";
  EXPECT_EQ(taken.size(), static_cast<size_t>(kSteps * kPrompts));
  ASSERT_EQ(trained_ids.size(), static_cast<size_t>(kSteps * kPrompts * kGroup));
  for (const auto& [id, times] : trained_ids) EXPECT_EQ(times, 1) << "sample " << id;
  // The groups held beside a lost one wait a lease for it, so theirs run out
  // too and come back (duplicate_groups): kept under the new lease, not
  // acked early, so admission never runs ahead of training.
  for (const StepRecord& r : loop->history()) EXPECT_LE(r.staleness_max, 2) << "step " << r.step;
}

// A rollout replica that dies between a prompt's last answer and its ack
// (here: the ack dropped, the lease left to run out) leaves a prompt whose
// answers are all in the hub. Handed out again, it is acked, not generated
// again: generated again after the trainer consumed the answers, its group
// would reach the trainer twice. Prompt 1 comes back after the trainer
// trained it (step 1), prompt 22 while its answers wait in the hub (step 8:
// the rollout runs up to 8 steps ahead of a trainer that takes 250 ms a
// step, so both leases run out at about step 4, while the rollout still
// takes the prompts of steps 13-16). Mutations: without the rollout's look
// for the answers in the hub, prompt 22's are generated twice; without its
// look at the trainer's version, prompt 1's (and its group reaches the
// trainer twice). Both fail.
TEST_F(TrainingRunTest, APromptHandedOutAgainWithItsAnswersWrittenIsNotGeneratedAgain) {
  constexpr int64_t kSteps = 16, kPrompts = 3, kGroup = 2;
  RunOptions o = Options("lost_prompt_ack", kSteps);
  o.rl.prompts_per_step = kPrompts;
  o.rl.group_size = kGroup;
  o.pipeline.mode = PipelineMode::kAsync;
  o.pipeline.max_staleness = 8;
  o.pipeline.worker_lease_seconds = 1;
  o.rl.trainer.loss.correction = trainer::OffPolicyCorrection::kTokenTis;
  o.eval.interval = 0;
  o.rl.dynamic_sampling = false;
  std::mutex mu;
  std::map<std::pair<uint64_t, int64_t>, int> submitted;  // (prompt, answer) -> times generated
  std::map<uint64_t, int> trained_ids;                    // sample id -> times trained
  std::set<uint64_t> lost;
  RunHooks hooks;
  hooks.forced_length = [&](uint64_t c, int64_t g) {
    std::lock_guard<std::mutex> lock(mu);
    ++submitted[{c, g}];
    return 6;
  };
  hooks.lose_prompt_ack = [&](uint64_t c) {
    std::lock_guard<std::mutex> lock(mu);
    return (c == 1 || c == 22) && lost.insert(c).second;
  };
  hooks.inspect_batch = [&](int64_t, const std::vector<trainer::RolloutSample>& samples) {
    {
      std::lock_guard<std::mutex> lock(mu);
      for (const auto& smp : samples) ++trained_ids[smp.id];
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  };
  auto run = std::move(TrainingRun::Create(FreshModel(), task_, o, hooks)).value();
  Status st = run->Train(nullptr);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(lost, (std::set<uint64_t>{1, 22})) << "the faults were not injected";
  ASSERT_EQ(trained_ids.size(), static_cast<size_t>(kSteps * kPrompts * kGroup));
  for (const auto& [id, times] : trained_ids) EXPECT_EQ(times, 1) << "sample " << id;
  EXPECT_EQ(submitted.size(), static_cast<size_t>(kSteps * kPrompts * kGroup));
  for (const auto& [key, times] : submitted) {
    EXPECT_EQ(times, 1) << "answer " << key.second << " of prompt " << key.first << " generated " << times << " times";
  }
  int64_t duplicates = 0;
  for (const StepRecord& r : run->history()) duplicates += r.duplicate_groups;
  EXPECT_EQ(duplicates, 0) << "a group reached the trainer twice";
}

// Regression: train_order=completion with stale modes could not keep the
// staleness bound (a long answer outlasted by any number of steps of short
// ones); the combination is refused, naming the key.
TEST_F(TrainingRunTest, CompletionOrderIsRefusedWhereSamplesMayBeStale) {
  for (PipelineMode mode : {PipelineMode::kOneStepOff, PipelineMode::kAsync}) {
    RunOptions o = Options("completion", 2);
    o.pipeline.mode = mode;
    o.pipeline.train_order = TrainOrder::kCompletion;
    auto r = TrainingRun::Create(FreshModel(), task_, o);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << PipelineModeName(mode);
    EXPECT_NE(r.status().message().find("pipeline.train_order"), std::string::npos) << r.status().ToString();
  }
  RunOptions o = Options("completion", 2);
  o.pipeline.mode = PipelineMode::kSync;
  o.pipeline.train_order = TrainOrder::kCompletion;
  EXPECT_TRUE(TrainingRun::Create(FreshModel(), task_, o).ok()) << "sync: every sample is fresh in any order";
}

// A rollout replica paused (SIGSTOP) past its lease and resumed read rows
// another replica had finished meanwhile: the hub had freed them, and the
// NotFound ("row has no column 'prompt'") ended the run. The take is
// dropped now; rows still held are read as ever. (Mutation: return
// data.status() for every NotFound in ReadLeasedRows, and this fails.)
TEST(ReadLeasedRowsTest, RowsWhoseLeaseWasLostAreDroppedNotTheRun) {
  tq::HubOptions options;
  options.controller.columns = {{"prompt", DType::kI32, {tq::kRaggedDim}}};
  options.controller.tasks = {"rollout"};
  options.storage_units = 1;
  auto hub = tq::TransferQueueHub::Create(options);
  ASSERT_TRUE(hub.ok()) << hub.status().ToString();
  tq::TransferQueueClient client = (*hub)->client();
  ASSERT_TRUE(client.CreatePartition("p").ok());
  auto put = [&](int32_t token) {
    tq::ColumnBatch cols;
    cols["prompt"] = {HostTensor::Copy(DType::kI32, {1}, &token, sizeof(token))};
    ASSERT_TRUE(client.PutRows("p", {tq::RowTags{}}, cols).ok());
  };
  put(7);
  tq::GetMetaRequest take{
      "rollout", {"prompt"}, 1, "p", {}, std::chrono::milliseconds(0), std::chrono::milliseconds(60000), "paused/1"};
  auto paused = client.GetMeta(take);
  ASSERT_TRUE(paused.ok()) << paused.status().ToString();
  // Its lease ends (as when it runs out; here at once), another takes the
  // row, finishes it, and the hub frees it.
  ASSERT_TRUE((*hub)->controller()->ReleaseHolder({"paused/1"}).ok());
  take.holder = "other/2";
  auto other = client.GetMeta(take);
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  ASSERT_TRUE(client.Ack(other->lease_id).ok());
  auto lost = ReadLeasedRows(client, *paused, std::chrono::seconds(60), "rollout");
  ASSERT_TRUE(lost.ok()) << lost.status().ToString();
  EXPECT_FALSE(lost->has_value());
  put(8);
  auto held = client.GetMeta(take);
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  auto read = ReadLeasedRows(client, *held, std::chrono::seconds(60), "rollout");
  ASSERT_TRUE(read.ok() && read->has_value()) << read.status().ToString();
  EXPECT_EQ((*read)->columns.at("prompt").size(), 1u);
}

// The trainer's progress records in the hub: read in order up to the first
// step not recorded, a record written again stands when it says the same,
// and a record that contradicts one (or goes back in version) is data loss.
// An in-process hub with the run's schema and partitions (groups of 2).
Result<std::unique_ptr<tq::TransferQueueHub>> RunSchemaHub() {
  tq::HubOptions options;
  options.controller.columns = HubColumns();
  options.controller.tasks = HubTasks();
  options.storage_units = 1;
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<tq::TransferQueueHub> hub, tq::TransferQueueHub::Create(options));
  tq::TransferQueueClient client = hub->client();
  SLUICE_RETURN_IF_ERROR(CreateHubPartitions(client, 2));
  return hub;
}

TEST(TrainerRecordTest, RecordsAreReadInOrderUpToTheFirstMissingStep) {
  auto hub = RunSchemaHub();
  ASSERT_TRUE(hub.ok()) << hub.status().ToString();
  tq::TransferQueueClient client = (*hub)->client();
  const TrainerRecord start{3, 5};  // a run resumed at step 3, version 5
  auto read = ReadTrainerRecord(client, start);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(read->step, 3);
  EXPECT_EQ(read->version, 5);
  ASSERT_TRUE(WriteTrainerRecord(client, {4, 5}).ok());  // sync_interval 2: step 4 publishes nothing
  ASSERT_TRUE(WriteTrainerRecord(client, {5, 6}).ok());
  ASSERT_TRUE(WriteTrainerRecord(client, {7, 7}).ok());  // step 6 not recorded yet
  read = ReadTrainerRecord(client, start);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(read->step, 5);
  EXPECT_EQ(read->version, 6);
  ASSERT_TRUE(WriteTrainerRecord(client, {6, 6}).ok());
  read = ReadTrainerRecord(client, *read);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(read->step, 7);
  EXPECT_EQ(read->version, 7);
  EXPECT_TRUE(WriteTrainerRecord(client, {6, 6}).ok()) << "the same record again stands";
  EXPECT_EQ(WriteTrainerRecord(client, {6, 7}).code(), StatusCode::kDataLoss);
  // A record that goes back in version is refused, not trusted.
  ASSERT_TRUE(WriteTrainerRecord(client, {8, 2}).ok());
  EXPECT_EQ(ReadTrainerRecord(client, *read).status().code(), StatusCode::kDataLoss);
}

// The typed records the roles write and read are the hub's schema: each
// record's columns have there the type and rank its members give them; a
// record goes through the hub and back unchanged; a cell missing or of
// another type is DataLoss naming the column. Fails if a record's member
// and the schema disagree (say kExample made I32 in HubColumns, or
// AnswerRecord::answer_index made int64_t), or if a field is left out of
// Fields() (the round trip loses it).
TEST(HubRecordTest, RecordsMatchTheSchemaAndGoThroughTheHubUnchanged) {
  const std::vector<tq::ColumnSchema> schema = HubColumns();
  EXPECT_TRUE(CheckRecordSchema<PromptRecord>(schema).ok());
  EXPECT_TRUE(CheckRecordSchema<AnswerRecord>(schema).ok());
  EXPECT_TRUE(CheckRecordSchema<AnswerToScore>(schema).ok());
  EXPECT_TRUE(CheckRecordSchema<RewardRecord>(schema).ok());
  EXPECT_TRUE(CheckRecordSchema<AnswerTokens>(schema).ok());
  EXPECT_TRUE(CheckRecordSchema<AnswerToTrain>(schema).ok());
  EXPECT_TRUE(CheckRecordSchema<PublishedVersionRecord>(schema).ok());
  std::vector<tq::ColumnSchema> other = schema;
  for (tq::ColumnSchema& c : other) {
    if (c.name == column::kAnswerIndex) c.dtype = DType::kI64;
  }
  const Status wrong = CheckRecordSchema<AnswerRecord>(other);
  EXPECT_EQ(wrong.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.message().find("answer_index"), std::string::npos) << wrong.ToString();

  auto hub = RunSchemaHub();
  ASSERT_TRUE(hub.ok()) << hub.status().ToString();
  tq::TransferQueueClient client = (*hub)->client();
  AnswerRecord answer;
  answer.prompt = {5, 6, 7};
  answer.response = {8, 9};
  answer.logprobs = {-0.5f, -1.25f};
  answer.versions = {3, 4};
  answer.answer_index = 1;
  answer.example = 42;
  answer.reference_answer = std::string("1\0 7", 4);
  tq::RowTags tags;
  tags.group_id = 9;
  ASSERT_TRUE(client.KvPutBatch(kRolloutPartition, {AnswerKey(9, 1)}, {tags}, EncodeRecord(answer)).ok());
  auto back = client.KvGet(kRolloutPartition, AnswerKey(9, 1), RecordColumns<AnswerRecord>());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  auto decoded = DecodeRecord<AnswerRecord>(*back);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->prompt, answer.prompt);
  EXPECT_EQ(decoded->response, answer.response);
  EXPECT_EQ(decoded->logprobs, answer.logprobs);
  EXPECT_EQ(decoded->versions, answer.versions);
  EXPECT_EQ(decoded->answer_index, 1);
  EXPECT_EQ(decoded->example, 42);
  EXPECT_EQ(decoded->reference_answer, answer.reference_answer);
  // The reward's view of the same row.
  auto to_score = DecodeRecord<AnswerToScore>(*back);
  ASSERT_TRUE(to_score.ok()) << to_score.status().ToString();
  EXPECT_EQ(to_score->response, answer.response);
  EXPECT_EQ(to_score->reference_answer, answer.reference_answer);

  tq::BatchData cells;
  cells.columns = EncodeRecord(PromptRecord{{1, 2}, 3, "4", ""});
  cells.columns[column::kExample] = {HostTensor::Copy(DType::kI32, {}, &answer.answer_index, sizeof(int32_t))};
  const Status mistyped = DecodeRecord<PromptRecord>(cells, 0).status();
  EXPECT_EQ(mistyped.code(), StatusCode::kDataLoss);
  EXPECT_NE(mistyped.message().find("'example'"), std::string::npos) << mistyped.ToString();
  cells.columns.erase(column::kExample);
  const Status missing = DecodeRecord<PromptRecord>(cells, 0).status();
  EXPECT_EQ(missing.code(), StatusCode::kDataLoss);
  EXPECT_NE(missing.message().find("'example'"), std::string::npos) << missing.ToString();
}

// The run's health in a shared segment: what one opening writes another
// reads (the launcher and its role processes), an opening of a segment that
// is not one is refused, and the creator's segment goes with it.
TEST(RunHealthTest, ASharedSegmentIsOneRunHealthForEveryOpening) {
  const std::string name = "/sluice-test-health-" + std::to_string(::getpid());
  auto launcher = RunHealth::CreateShared(name);
  ASSERT_TRUE(launcher.ok()) << launcher.status().ToString();
  auto role = RunHealth::OpenShared(name);
  ASSERT_TRUE(role.ok()) << role.status().ToString();
  const HealthSlot slot(PipelineRole::kRollout, 4);
  EXPECT_EQ((*launcher)->DescribeActivity(4), "starting");
  (*role)->Beat(slot);
  EXPECT_GT((*launcher)->Slot(4).beat_ns, 0);
  EXPECT_EQ((*launcher)->DescribeActivity(4), "between activities");
  {
    RoleDoing doing(**role, slot, RoleActivity::kDecodeStep, /*traced=*/false);
    EXPECT_EQ((*launcher)->DescribeActivity(4), "decode step");
  }
  EXPECT_EQ((*launcher)->DescribeActivity(4), "between activities");
  (*role)->AddDecoding(2, 100, 7);
  (*role)->AddDecoding(RunHealth::kMaxReplicas, 1, 1);  // counted in the totals only
  EXPECT_EQ((*launcher)->rollout().tokens, 8);
  EXPECT_EQ((*launcher)->replica(2).busy_us, 100);
  (*role)->Label(4, PipelineRole::kRollout, 2);
  ASSERT_TRUE((*launcher)->LabelOf(4).has_value());
  EXPECT_EQ((*launcher)->LabelOf(4)->index, 2);
  EXPECT_FALSE((*launcher)->LabelOf(5).has_value());
  // Core lending: a lent worker runs only while the rollout is idle.
  EXPECT_FALSE((*launcher)->EnterLentCore());
  EXPECT_EQ((*role)->lent_workers_running(), 0);
  (*role)->SetRolloutIdle(true);
  EXPECT_TRUE((*launcher)->EnterLentCore());
  EXPECT_EQ((*role)->lent_workers_running(), 1);
  (*launcher)->LeaveLentCore();
  EXPECT_FALSE((*role)->StopRequested());
  (*launcher)->RequestStop();
  EXPECT_TRUE((*role)->StopRequested());
  (*role)->Finished(slot);
  EXPECT_EQ((*launcher)->Slot(4).beat_ns, SlotHealth::kFinished);
  // A segment of another size is not a run health.
  const std::string other = name + "-other";
  auto wrong = SharedMemorySegment::Create(other, 64);
  ASSERT_TRUE(wrong.ok());
  EXPECT_EQ(RunHealth::OpenShared(other).status().code(), StatusCode::kDataLoss);
  ASSERT_TRUE(SharedMemorySegment::Unlink(other).ok());
  launcher->reset();
  EXPECT_EQ(RunHealth::OpenShared(name).status().code(), StatusCode::kNotFound);
}

// The thread budget each mode is given, as the benchmark prints it: sync
// alternates the roles on every core, the split modes share the cores, and
// the rollout's cores are lent to the trainer only in the split modes.
TEST(ThreadBudgetTest, NoModeHasMoreBusyThreadsThanItsCores) {
  RunOptions o;
  o.pipeline.rollout_threads = 2;
  o.pipeline.trainer_threads = 2;
  o.pipeline.rollout_engines = 2;
  o.rl.trainer.micro_batch_threads = 2;
  o.pipeline.mode = PipelineMode::kSync;
  ThreadBudget b = o.Threads(2);
  EXPECT_FALSE(o.pipeline.Lending()) << "regression: sync lent the rollout's cores to a trainer that had them all";
  EXPECT_EQ(b.trainer_workers, 2);
  EXPECT_EQ(b.lent_workers, 0);
  EXPECT_EQ(b.max_busy, 2) << b.ToString();
  o.pipeline.mode = PipelineMode::kAsync;
  o.pipeline.rollout_threads = 1;
  o.pipeline.trainer_threads = 1;
  o.pipeline.rollout_engines = 1;
  o.rl.trainer.micro_batch_threads = 1;
  b = o.Threads(2);
  EXPECT_TRUE(o.pipeline.Lending());
  EXPECT_EQ(b.trainer_workers, 1);
  EXPECT_EQ(b.lent_workers, 1);
  EXPECT_EQ(b.max_busy, 2) << b.ToString();
  EXPECT_NE(b.ToString().find("while it idles"), std::string::npos) << b.ToString();
}

// The per-token version check. Every published version perturbs every
// tensor of the trained weights by its own factor, so no two versions (and no
// torn mix of two) give the same logprobs. The check keeps each version's
// weights as published and recomputes, for every trained sample, the
// logprobs of the tokens up to its first weight switch under the version
// those tokens record: they must match what the rollout recorded. The first
// token after a switch must not match the old version where the two versions
// differ at that token (caught: a switch recorded one token early).
struct VersionCounts {
  int64_t checked_tokens = 0, mismatches = 0, switch_tokens = 0, early_switches = 0, bad_lengths = 0,
          mixed_sequences = 0, not_increasing = 0, distinct_versions = 0;

  json ToJson() const {
    return {{"checked", checked_tokens},        {"mismatches", mismatches},     {"switch_tokens", switch_tokens},
            {"early", early_switches},          {"bad_lengths", bad_lengths},   {"mixed", mixed_sequences},
            {"not_increasing", not_increasing}, {"distinct", distinct_versions}};
  }
  static VersionCounts FromJson(const json& j) {
    VersionCounts c;
    c.checked_tokens = j.at("checked");
    c.mismatches = j.at("mismatches");
    c.switch_tokens = j.at("switch_tokens");
    c.early_switches = j.at("early");
    c.bad_lengths = j.at("bad_lengths");
    c.mixed_sequences = j.at("mixed");
    c.not_increasing = j.at("not_increasing");
    c.distinct_versions = j.at("distinct");
    return c;
  }
};

// Version v's weights: the trained ones with every tensor scaled by its own
// factor (distinct for every version and tensor).
void PerturbForVersion(int64_t version, TensorMap* weights) {
  int64_t k = 0;
  for (auto& [name, t] : *weights) {
    ASSERT_EQ(t.dtype, DType::kF32) << name;
    std::vector<float> v(t.nbytes / sizeof(float));
    std::memcpy(v.data(), t.data, t.nbytes);
    const float factor = 1.0f + 0.2f * static_cast<float>(std::sin(1.7 * static_cast<double>(version) + 0.3 * ++k));
    for (float& x : v) x *= factor;
    t = HostTensor::Copy(t.dtype, t.shape, v.data(), t.nbytes);
  }
}

TensorMap Copy(const TensorMap& weights) {
  TensorMap out;
  for (const auto& [name, t] : weights) out[name] = HostTensor::Copy(t.dtype, t.shape, t.data, t.nbytes);
  return out;
}

class VersionCheck {
 public:
  // `initial`: the weights the run starts from (version `first`, published unchanged).
  VersionCheck(std::shared_ptr<model::Transformer> initial, int64_t first) : scratch_(model::CloneModel(*initial)) {
    published_[first] = Copy(*model::ExportWeights(*initial));  // a snapshot: the export views the live weights
    trainer::TrainerOptions to;
    scorer_ = std::move(trainer::Trainer::Create(scratch_, nullptr, to)).value();
  }

  // The run the check is made on: async, staleness 2, long and short answers.
  static RunHooks Configure(RunOptions& o) {
    o.pipeline.mode = PipelineMode::kAsync;
    o.pipeline.max_staleness = 2;
    o.eval.interval = 0;
    o.rl.dynamic_sampling = false;
    RunHooks hooks;
    hooks.forced_length = [](uint64_t c, int64_t g) {
      return static_cast<int32_t>(g == 0 && c % 2 == 0 ? 30 : 4 + 3 * g);
    };
    // The prompts with a long answer wait once, mid-answer, for a version to
    // land: under in_flight a switch inside an answer is then certain, not
    // a matter of timing.
    hooks.hold_for_switch = [](uint64_t c) { return c % 2 == 0; };
    return hooks;
  }
  // Configure, and the check's hooks into the trainer.
  RunHooks Install(RunOptions& o, std::function<void(const VersionCounts&)> after_batch = {}) {
    RunHooks hooks = Configure(o);
    hooks.rewrite_published = [this](int64_t version, TensorMap* weights) {
      PerturbForVersion(version, weights);
      published_[version] = Copy(*weights);
    };
    hooks.inspect_batch = [this, after_batch](int64_t, const std::vector<trainer::RolloutSample>& samples) {
      Check(samples);
      if (after_batch) after_batch(counts_);
    };
    return hooks;
  }
  const VersionCounts& counts() const { return counts_; }

 private:
  // Logprobs of every response token of `smp` under version v's weights.
  std::vector<float> Logprobs(int64_t v, const trainer::RolloutSample& smp) {
    auto it = published_.find(v);
    if (it == published_.end()) return {};
    EXPECT_TRUE(model::LoadWeights(*scratch_, it->second).ok());
    auto lp = scorer_->ResponseLogprobs(*scratch_, {smp});
    EXPECT_TRUE(lp.ok()) << lp.status().ToString();
    return lp.ok() ? (*lp)[0] : std::vector<float>{};
  }

  void Check(const std::vector<trainer::RolloutSample>& samples) {
    constexpr float kSame = 1e-3f;  // rollout kernels vs the trainer's forward, one version
    for (const auto& smp : samples) {
      if (smp.versions.size() != smp.response.size() || smp.versions.empty()) {
        ++counts_.bad_lengths;
        continue;
      }
      seen_.insert(smp.versions.begin(), smp.versions.end());
      counts_.distinct_versions = static_cast<int64_t>(seen_.size());
      const int64_t first = smp.versions.front();
      size_t run = 0;  // tokens before the first switch
      while (run < smp.versions.size() && smp.versions[run] == first) ++run;
      for (size_t i = 1; i < smp.versions.size(); ++i) counts_.not_increasing += smp.versions[i] < smp.versions[i - 1];
      const std::vector<float> lp = Logprobs(first, smp);
      if (lp.size() != smp.response.size()) {
        ++counts_.mismatches;  // a version that was never published
        continue;
      }
      for (size_t i = 0; i < run; ++i) {
        ++counts_.checked_tokens;
        if (std::abs(lp[i] - smp.behavior_logprobs[i]) > kSame) {
          ++counts_.mismatches;
          if (std::getenv("DEBUG_VERSIONS")) {
            std::fprintf(stderr, "id %lu pos %zu run %zu/%zu v %ld..%ld lp %f rec %f\n", (unsigned long)smp.id, i, run,
                         smp.versions.size(), (long)first, (long)smp.versions.back(), lp[i], smp.behavior_logprobs[i]);
          }
        }
      }
      if (run < smp.versions.size()) {
        ++counts_.mixed_sequences;
        ++counts_.switch_tokens;
        // Early: the old version's logprob, where the two versions tell
        // apart (a token near certain under both does not: its logprob is
        // about 0 under either). The new version's, recomputed over the
        // whole answer, only tells whether they differ there (the rollout's
        // cache holds the tokens before the switch as the old one made them).
        const std::vector<float> next = Logprobs(smp.versions[run], smp);
        const bool distinct = next.size() != lp.size() || std::abs(lp[run] - next[run]) > 4 * kSame;
        if (distinct && std::abs(lp[run] - smp.behavior_logprobs[run]) <= kSame) ++counts_.early_switches;
      }
    }
  }

  std::shared_ptr<model::Transformer> scratch_;
  std::unique_ptr<trainer::Trainer> scorer_;
  std::map<int64_t, TensorMap> published_;
  std::set<int64_t> seen_;
  VersionCounts counts_;
};

// A fresh model's logits are near zero, so versions would differ little in
// logprob; sharpened, every perturbation moves the logprobs well past the
// rollout's numerical difference from the trainer.
void Sharpen(model::Transformer& m) {
  torch::NoGradGuard no_grad;
  m.named_parameters()["model.norm.weight"].mul_(10.0);
}

void ExpectVersionsChecked(const VersionCounts& counts, bool in_flight) {
  EXPECT_EQ(counts.bad_lengths, 0);
  EXPECT_EQ(counts.mismatches, 0) << "tokens whose logprob is not that of the version they record";
  EXPECT_EQ(counts.not_increasing, 0);
  EXPECT_EQ(counts.early_switches, 0) << "a switch recorded before the new weights produced the token";
  EXPECT_GT(counts.checked_tokens, 100) << "not vacuous";
  EXPECT_GE(counts.distinct_versions, 2) << "tokens from several versions were checked";
  std::printf("versions checked: %lld tokens, %lld versions, %lld sequences spanning a switch (%s)\n",
              static_cast<long long>(counts.checked_tokens), static_cast<long long>(counts.distinct_versions),
              static_cast<long long>(counts.mixed_sequences), in_flight ? "in_flight" : "at_boundary");
  // The run's hold_for_switch stops long answers until a version lands.
  if (in_flight) {
    EXPECT_GT(counts.mixed_sequences, 0) << "in_flight: answers held while a version landed did not switch mid-answer";
    EXPECT_EQ(counts.switch_tokens, counts.mixed_sequences);
  } else {
    EXPECT_EQ(counts.mixed_sequences, 0) << "at_boundary: a sequence never spans versions";
  }
}

// End to end through the hub, the version store and the rollout's standby
// weights: every token's recorded version is the version of the weights that
// produced it.
TEST_F(TrainingRunTest, EveryTokenRecordsTheVersionOfTheWeightsThatProducedIt) {
  task_ = std::make_shared<EvenFirstByteTask>();
  // Two engines sharing the standby weights, too.
  for (auto [policy, engines] :
       {std::pair{rollout::SwitchPolicy::kInFlight, 1}, std::pair{rollout::SwitchPolicy::kAtBoundary, 1},
        std::pair{rollout::SwitchPolicy::kInFlight, 2}}) {
    const bool in_flight = policy == rollout::SwitchPolicy::kInFlight;
    SCOPED_TRACE(std::string(in_flight ? "in_flight" : "at_boundary") + ", engines " + std::to_string(engines));
    RunOptions o =
        Options(std::string(in_flight ? "versions-inflight" : "versions-boundary") + std::to_string(engines), 6);
    auto model = FreshModel();
    Sharpen(*model);
    VersionCheck check(model, 0);
    const RunHooks hooks = check.Install(o);
    o.pipeline.rollout_engines = engines;
    o.pipeline.switch_policy = policy;
    auto loop = std::move(TrainingRun::Create(model, task_, o, hooks)).value();
    Status st = loop->Train(nullptr);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ExpectVersionsChecked(check.counts(), in_flight);
  }
}

// The same check with the roles as processes (weights over the
// CheckpointEngine's shared-memory store, samples over the hub's arena): the
// launcher re-executes this test binary as each role, running
// RoleProcessEntry.Run with the check's hooks; the trainer process writes its
// counts to RUN_DIR/version_counts.json.
constexpr char kRoleEntryFilter[] = "--gtest_filter=RoleProcessEntry.Run";

// The options the launcher and its role processes share (a role process
// does no warm start: the launcher hands it the warm-started policy). A role
// passes its VersionCheck to install the check's hooks in `hooks`.
RunOptions ProcessVersionOptions(const std::string& run_dir, VersionCheck* check, RunHooks* hooks) {
  RunOptions o = BaseOptions(run_dir, 6);
  o.checkpoint_interval = 0;
  o.sft.steps = 0;
  o.rl.trainer.loss.kl_coef = 0;
  o.eval.size = 4;
  o.eval.max_new_tokens = 4;
  if (check) {
    *hooks = check->Install(o, [run_dir](const VersionCounts& counts) {
      std::ofstream(fs::path(run_dir) / "version_counts.json") << counts.ToJson().dump();
    });
  } else {
    *hooks = VersionCheck::Configure(o);  // the launcher trains nothing itself
  }
  o.pipeline.processes = true;
  o.pipeline.wiring.role_command = role_test::RoleCommand(kRoleEntryFilter, run_dir);
  return o;
}

TEST(RoleProcessEntry, Run) {
  const std::optional<role_test::RoleArguments> role = role_test::RoleFromArguments();
  if (!role) SLUICE_CHILD_ENTRY_ONLY("EveryTokenRecordsItsVersionWithRolesAsProcesses");
  const RoleConnection& c = role->connection;
  const std::string& run_dir = role->run_dir;
  auto policy = model::LoadPretrained((fs::path(run_dir) / "roles" / "init").string());
  ASSERT_TRUE(policy.ok()) << policy.status().ToString();
  VersionCheck check(*policy, c.start_version);
  RunHooks hooks;
  const RunOptions o = ProcessVersionOptions(run_dir, &check, &hooks);
  auto loop = TrainingRun::Create(*policy, std::make_shared<EvenFirstByteTask>(), o, hooks);
  ASSERT_TRUE(loop.ok()) << loop.status().ToString();
  Status st = (*loop)->RunRole(c, nullptr);
  ASSERT_TRUE(st.ok()) << PipelineRoleName(c.role) << ": " << st.ToString();
}

TEST_F(TrainingRunTest, EveryTokenRecordsItsVersionWithRolesAsProcesses) {
  const std::string run_dir = (root_ / "versions-processes").string();
  RunHooks hooks;
  RunOptions o = ProcessVersionOptions(run_dir, nullptr, &hooks);
  auto model = FreshModel();
  Sharpen(*model);
  auto loop = std::move(TrainingRun::Create(model, std::make_shared<EvenFirstByteTask>(), o, hooks)).value();
  Status st = loop->Train(nullptr);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(ReadMetrics(run_dir).size(), 6u) << "six steps trained";
  std::ifstream in(fs::path(run_dir) / "version_counts.json");
  ASSERT_TRUE(in.good()) << "the trainer process wrote no counts";
  ExpectVersionsChecked(VersionCounts::FromJson(json::parse(in)), /*in_flight=*/true);
}

TEST_F(TrainingRunTest, BadOptionsNameTheKey) {
  RunOptions o = Options("bad", 1);
  o.rl.group_size = 1;
  auto r = TrainingRun::Create(FreshModel(), task_, o);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("rl.group_size"), std::string::npos) << r.status().ToString();
  o = Options("bad", 1);
  o.run_dir.clear();
  EXPECT_NE(TrainingRun::Create(FreshModel(), task_, o).status().message().find("run.dir"), std::string::npos);
  o = Options("bad", 1);
  o.sft.shortcut_fraction = 1.5;
  EXPECT_NE(TrainingRun::Create(FreshModel(), task_, o).status().message().find("sft.shortcut_fraction"),
            std::string::npos);
  o = Options("bad", 1);
  o.rl.sampling.top_p = 2;
  EXPECT_NE(TrainingRun::Create(FreshModel(), task_, o).status().message().find("top_p"), std::string::npos);
  // The config table's ranges and values, checked on options built in code.
  o = Options("bad", 1);
  o.pipeline.stall_seconds = -1;
  EXPECT_NE(o.Validate().message().find("option pipeline.stall_seconds: must be in [0, 604800], got -1"),
            std::string::npos)
      << o.Validate().ToString();
  o = Options("bad", 1);
  o.devices.rollout_dtype = "fp8";
  EXPECT_NE(o.Validate().message().find("pipeline.rollout_dtype: 'fp8' is not one of auto, float32, bfloat16"),
            std::string::npos)
      << o.Validate().ToString();
}

// Each key the RunOptions table declares sets its field, and the keys
// whose value is derived set what they decide.
TEST(RunOptionsTable, ConfigKeysSetTheirFields) {
  auto c = runtime::Config::FromYamlText(
      RunOptionsTable().schema(), "rl:\n  slots: 5\n",
      {"run.dir=/tmp/x", "pipeline.mode=async", "pipeline.switch=at_boundary", "trainer.loss_agg=seq-mean",
       "pipeline.rollout_engines=2", "trainer.lr_schedule=cosine", "trainer.warmup_steps=10", "rl.steps=50",
       "pipeline.trainer_device=cpu", "rl.temperature=0.7"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto o = RunOptionsFromConfig(*c);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->run_dir, "/tmp/x");
  EXPECT_EQ(o->rl.rollout_slots, 5);
  EXPECT_EQ(o->pipeline.mode, PipelineMode::kAsync);
  EXPECT_EQ(o->pipeline.switch_policy, rollout::SwitchPolicy::kAtBoundary);
  EXPECT_EQ(o->rl.trainer.loss.aggregation, trainer::LossAggregation::kSequenceMean);
  EXPECT_EQ(o->pipeline.rollout_engines, 2);
  EXPECT_EQ(o->rl.trainer.optimizer.decay_steps, 40) << "cosine over the optimizer steps after warm-up";
  EXPECT_EQ(o->rl.trainer.loss.correction, trainer::OffPolicyCorrection::kBehavior) << "auto, async at staleness 2";
  EXPECT_FALSE(o->rl.trainer.recompute_old_logprobs) << "auto under behavior";
  EXPECT_EQ(o->devices.trainer, "cpu");
  EXPECT_EQ(o->devices.rollout, "auto") << "streaming: model.device";
  EXPECT_FLOAT_EQ(o->rl.trainer.temperature, 0.7f);
  // A key out of range is refused with the schema's own message.
  EXPECT_FALSE(runtime::Config::FromYamlText(RunOptionsTable().schema(), "", {"rl.slots=0"}).ok());
}

}  // namespace
}  // namespace sluice::pipeline
