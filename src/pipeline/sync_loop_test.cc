#include "sluice/pipeline/sync_loop.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>

#include "sluice/model/weights.h"

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
LoopOptions BaseOptions(const std::string& run_dir, int64_t steps) {
  LoopOptions o;
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

class SyncLoopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("sluice_sync_loop_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    reward::TaskOptions t;
    t.name = "arithmetic";
    t.seed = 1;
    t.eval_size = 16;
    t.arithmetic.max_ops = 2;
    task_ = std::shared_ptr<const reward::Task>(std::move(reward::MakeTask(t)).value());
  }
  void TearDown() override { fs::remove_all(root_); }

  LoopOptions Options(const std::string& name, int64_t steps) { return BaseOptions((root_ / name).string(), steps); }

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

TEST_F(SyncLoopTest, ResumedRunReproducesTheUninterruptedRun) {
  task_ = std::make_shared<EvenFirstByteTask>();
  // Uninterrupted: 4 steps.
  auto full = std::move(SyncLoop::Create(FreshModel(), task_, Options("full", 4))).value();
  Status st = full->WarmStart(nullptr);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_TRUE(full->Train(nullptr).ok());
  // Interrupted after step 2 (its checkpoint), then resumed by a new process-like loop.
  auto first = std::move(SyncLoop::Create(FreshModel(), task_, Options("split", 2))).value();
  ASSERT_TRUE(first->WarmStart(nullptr).ok());
  ASSERT_TRUE(first->Train(nullptr).ok());
  LoopOptions resumed_options = Options("split", 4);
  resumed_options.resume = true;
  auto resumed = std::move(SyncLoop::Create(FreshModel(), task_, resumed_options)).value();
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

TEST_F(SyncLoopTest, ResumeWithoutACheckpointStartsFresh) {
  task_ = std::make_shared<EvenFirstByteTask>();
  LoopOptions o = Options("fresh", 1);
  o.sft.steps = 0;
  o.checkpoint_interval = 0;
  fs::create_directories(o.run_dir);
  std::ofstream(fs::path(o.run_dir) / "metrics.jsonl") << "{\"step\": 1}\n{\"step\": 2}\n";
  o.resume = true;  // but there is no checkpoints/latest
  auto loop = std::move(SyncLoop::Create(FreshModel(), task_, o)).value();
  ASSERT_TRUE(loop->Train(nullptr).ok());
  auto lines = ReadMetrics(o.run_dir);
  ASSERT_EQ(lines.size(), 1u) << "stale lines of an earlier attempt are not kept";
  EXPECT_TRUE(lines[0].contains("reward_mean"));
}

TEST_F(SyncLoopTest, DynamicSamplingDropsGroupsWithoutSignal) {
  // A fresh model never answers correctly: every group is all-zero reward.
  LoopOptions o = Options("dynamic", 2);
  o.sft.steps = 0;
  o.rl.dynamic_sampling = true;
  auto model = FreshModel();
  auto before = *model::ExportWeights(*model);
  auto loop = std::move(SyncLoop::Create(model, task_, o)).value();
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

TEST_F(SyncLoopTest, WarmStartWritesACheckpointAndLearnsTheFormat) {
  LoopOptions o = Options("sft", 0);
  o.sft.steps = 60;
  o.sft.batch_size = 32;
  o.sft.optimizer.lr = 1e-2;
  o.eval.max_new_tokens = 40;
  auto model = FreshModel();
  auto loop = std::move(SyncLoop::Create(model, task_, o)).value();
  auto before = loop->Evaluate();
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  Status st = loop->WarmStart(nullptr);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(fs::exists(root_ / "sft" / "sft" / "config.json"));
  auto loaded = model::LoadPretrained((root_ / "sft" / "sft").string());
  ASSERT_TRUE(loaded.ok());
  auto after = loop->Evaluate();
  ASSERT_TRUE(after.ok());
  // The warm-started model stops at EOS with short answers instead of rambling to the limit.
  EXPECT_LT(after->mean_length, before->mean_length);
}

TEST_F(SyncLoopTest, EvaluationReportsSampledAccuracyAndADifficultyBreakdown) {
  LoopOptions o = Options("eval", 0);
  o.eval.size = 12;
  auto loop = std::move(SyncLoop::Create(FreshModel(), task_, o)).value();
  auto greedy_only = loop->Evaluate();
  ASSERT_TRUE(greedy_only.ok()) << greedy_only.status().ToString();
  EXPECT_EQ(greedy_only->sampled_accuracy, -1);

  o.eval.samples = 3;
  loop = std::move(SyncLoop::Create(FreshModel(), task_, o)).value();
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

TEST_F(SyncLoopTest, ShortcutWarmStartTeachesBareAnswers) {
  // With every target a bare answer, the warm-started model answers "#..." at
  // once: much shorter greedy answers than with worked solutions.
  auto mean_length_after_sft = [&](double shortcut) {
    LoopOptions o = Options(shortcut > 0 ? "shortcut" : "worked", 0);
    o.sft.steps = 60;
    o.sft.batch_size = 32;
    o.sft.optimizer.lr = 1e-2;
    o.sft.shortcut_fraction = shortcut;
    o.eval.max_new_tokens = 40;
    auto loop = std::move(SyncLoop::Create(FreshModel(), task_, o)).value();
    EXPECT_TRUE(loop->WarmStart(nullptr).ok());
    return loop->Evaluate()->mean_length;
  };
  const double worked = mean_length_after_sft(0.0);
  const double bare = mean_length_after_sft(1.0);
  EXPECT_LT(bare, 0.6 * worked) << "bare " << bare << " worked " << worked;
}

// The direct loop and sync mode over the hub train the same batches with the
// same weights: identical rewards and losses, step by step.
TEST_F(SyncLoopTest, SyncModeOverTheHubReproducesTheDirectLoop) {
  task_ = std::make_shared<EvenFirstByteTask>();  // every step has a learning signal
  auto run = [&](PipelineMode mode, int32_t engines) {
    LoopOptions o = Options(PipelineModeName(mode) + std::to_string(engines), 4);
    o.pipeline.mode = mode;
    o.pipeline.rollout_engines = engines;
    o.rl.dynamic_sampling = true;
    auto loop = std::move(SyncLoop::Create(FreshModel(), task_, o)).value();
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

// Every mode trains each prompt's group exactly once, none lost, and no sample
// lags the trainer by more than the mode's staleness bound.
TEST_F(SyncLoopTest, StreamingModesTrainEveryPromptOnceWithinTheStalenessBound) {
  struct Case {
    PipelineMode mode;
    int64_t max_staleness;
    rollout::SwitchPolicy policy;
    TrainOrder order;
    int32_t engines = 1;
  };
  task_ = std::make_shared<EvenFirstByteTask>();
  for (const Case& c : {Case{PipelineMode::kOneStepOff, 1, rollout::SwitchPolicy::kInFlight, TrainOrder::kCompletion},
                        Case{PipelineMode::kAsync, 2, rollout::SwitchPolicy::kInFlight, TrainOrder::kCompletion},
                        Case{PipelineMode::kAsync, 3, rollout::SwitchPolicy::kAtBoundary, TrainOrder::kCompletion},
                        Case{PipelineMode::kAsync, 2, rollout::SwitchPolicy::kInFlight, TrainOrder::kPrompt},
                        Case{PipelineMode::kAsync, 2, rollout::SwitchPolicy::kInFlight, TrainOrder::kPrompt, 2}}) {
    const bool prompt_order = c.order == TrainOrder::kPrompt;
    SCOPED_TRACE(PipelineModeName(c.mode) + " staleness " + std::to_string(c.max_staleness) +
                 (prompt_order ? " prompt order" : "") + ", engines " + std::to_string(c.engines));
    LoopOptions o =
        Options("stream" + std::to_string(c.max_staleness) + (prompt_order ? "p" : "") + std::to_string(c.engines), 6);
    o.pipeline.mode = c.mode;
    o.pipeline.rollout_engines = c.engines;
    o.pipeline.max_staleness = c.max_staleness;
    o.pipeline.switch_policy = c.policy;
    o.pipeline.train_order = c.order;
    o.rl.trainer.loss.correction = trainer::OffPolicyCorrection::kTokenTis;
    o.eval.interval = 0;
    auto loop = std::move(SyncLoop::Create(FreshModel(), task_, o)).value();
    Status st = loop->Train(nullptr);
    ASSERT_TRUE(st.ok()) << st.ToString();
    std::set<uint64_t> seen;
    for (const StepRecord& r : loop->history()) {
      EXPECT_EQ(r.prompts.size(), 3u) << "step " << r.step;
      for (uint64_t p : r.prompts) EXPECT_TRUE(seen.insert(p).second) << "prompt " << p << " trained twice";
      if (prompt_order) {  // each step trains exactly its own prompts, as the direct loop does
        const uint64_t first = static_cast<uint64_t>((r.step - 1) * 3);
        EXPECT_EQ(r.prompts, std::vector<uint64_t>({first, first + 1, first + 2})) << "step " << r.step;
      }
      EXPECT_LE(r.staleness_max, c.max_staleness) << "step " << r.step;
      EXPECT_LE(r.token_staleness_mean, static_cast<double>(c.max_staleness));
    }
    EXPECT_EQ(seen.size(), 18u);
    int64_t trained = 0;
    for (const StepRecord& r : loop->history()) trained += r.samples_trained;
    EXPECT_GT(trained, 0);
    EXPECT_EQ(*seen.rbegin(), 17u) << "prompts 0..17, none skipped";
    const SyncLoop::StreamSummary summary = loop->stream_summary();
    EXPECT_GT(summary.rollout_occupancy, 0.0);
    EXPECT_LE(summary.rollout_occupancy, 1.0);
    EXPECT_GT(summary.rollout_tokens, 0);
  }
}

// The per-token version check. Odd versions are published as weights whose
// logits are all zero (every token's logprob is exactly -log V), even ones as
// trained, so a token recorded with the wrong version shows up as a
// flat/non-flat mismatch in the trained batches.
struct VersionCounts {
  int64_t odd_tokens = 0, even_tokens = 0, mixed_sequences = 0, mismatches = 0, bad_lengths = 0;

  json ToJson() const {
    return {{"odd", odd_tokens},
            {"even", even_tokens},
            {"mixed", mixed_sequences},
            {"mismatches", mismatches},
            {"bad_lengths", bad_lengths}};
  }
  static VersionCounts FromJson(const json& j) {
    return {j.at("odd"), j.at("even"), j.at("mixed"), j.at("mismatches"), j.at("bad_lengths")};
  }
};

// Async with staleness 2, the odd versions flat, every trained batch counted
// into *counts (then `after_batch`, if set). `flat` is -log V.
void UseVersionCheck(LoopOptions& o, double flat, VersionCounts* counts, std::function<void()> after_batch = {}) {
  o.pipeline.mode = PipelineMode::kAsync;
  o.pipeline.max_staleness = 2;
  o.eval.interval = 0;
  o.rl.dynamic_sampling = false;
  o.rl.forced_length = [](uint64_t, int64_t g) { return static_cast<int32_t>(6 + 5 * g); };
  o.rl.rewrite_published = [](int64_t version, TensorMap* weights) {
    if (version % 2 == 0) return;
    HostTensor& norm = weights->at("model.norm.weight");
    std::vector<float> zeros(norm.nbytes / sizeof(float), 0.0f);
    norm = HostTensor::Copy(norm.dtype, norm.shape, zeros.data(), norm.nbytes);
  };
  o.rl.inspect_batch = [flat, counts, after_batch](int64_t, const std::vector<trainer::RolloutSample>& samples) {
    for (const auto& smp : samples) {
      if (smp.versions.size() != smp.response.size()) ++counts->bad_lengths;
      if (!smp.versions.empty() && smp.versions.front() != smp.versions.back()) ++counts->mixed_sequences;
      for (size_t i = 0; i < smp.versions.size(); ++i) {
        const bool is_flat = std::abs(smp.behavior_logprobs[i] - flat) < 1e-5;
        const bool odd = smp.versions[i] % 2 != 0;
        (odd ? counts->odd_tokens : counts->even_tokens)++;
        if (is_flat != odd) ++counts->mismatches;
      }
    }
    if (after_batch) after_batch();
  };
}

// A fresh model's logits are near zero, so its tokens' logprobs sit near
// -log V too; sharpen it (and so every even version trained from it) so that
// "flat" can only mean the zeroed weights.
void Sharpen(model::Transformer& m) {
  torch::NoGradGuard no_grad;
  m.named_parameters()["model.norm.weight"].mul_(20.0);
}

// End to end through the hub, the version store and the rollout's standby
// weights: every token's recorded version is the version of the weights that
// produced it.
TEST_F(SyncLoopTest, EveryTokenRecordsTheVersionOfTheWeightsThatProducedIt) {
  task_ = std::make_shared<EvenFirstByteTask>();
  // Two engines sharing the standby weights, too.
  for (auto [policy, engines] :
       {std::pair{rollout::SwitchPolicy::kInFlight, 1}, std::pair{rollout::SwitchPolicy::kAtBoundary, 1},
        std::pair{rollout::SwitchPolicy::kInFlight, 2}}) {
    const bool in_flight = policy == rollout::SwitchPolicy::kInFlight;
    SCOPED_TRACE(std::string(in_flight ? "in_flight" : "at_boundary") + ", engines " + std::to_string(engines));
    LoopOptions o =
        Options(std::string(in_flight ? "versions-inflight" : "versions-boundary") + std::to_string(engines), 6);
    auto model = FreshModel();
    Sharpen(*model);
    VersionCounts counts;
    UseVersionCheck(o, -std::log(static_cast<double>(model->config().vocab_size)), &counts);
    o.pipeline.rollout_engines = engines;
    o.pipeline.switch_policy = policy;
    auto loop = std::move(SyncLoop::Create(model, task_, o)).value();
    Status st = loop->Train(nullptr);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(counts.mismatches, 0);
    EXPECT_EQ(counts.bad_lengths, 0);
    EXPECT_GT(counts.odd_tokens, 0) << "not vacuous: tokens from flat (odd) versions";
    EXPECT_GT(counts.even_tokens, 0);
    if (!in_flight) {
      EXPECT_EQ(counts.mixed_sequences, 0) << "at_boundary: a sequence never spans versions";
    }
  }
}

// The same check with the roles as processes (weights over the
// CheckpointEngine's shared-memory store, samples over the hub's arena): the
// launcher re-executes this test binary as each role, running
// RoleProcessEntry.Run with the check's hooks; the trainer process writes its
// counts to RUN_DIR/version_counts.json.
constexpr char kRoleEntryFilter[] = "--gtest_filter=RoleProcessEntry.Run";

std::vector<std::string> OwnArguments() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> args;
  std::string arg;
  while (std::getline(in, arg, '\0')) args.push_back(arg);
  return args;
}

std::string ArgumentValue(const std::vector<std::string>& args, const std::string& flag) {
  for (const auto& a : args) {
    if (a.rfind(flag + "=", 0) == 0) return a.substr(flag.size() + 1);
  }
  return "";
}

// The options the launcher and its role processes share (a role process
// does no warm start: the launcher hands it the warm-started policy).
LoopOptions ProcessVersionOptions(const std::string& run_dir, double flat, VersionCounts* counts, bool role) {
  LoopOptions o = BaseOptions(run_dir, 6);
  o.checkpoint_interval = 0;
  if (role) o.sft.steps = 0;
  o.rl.trainer.loss.kl_coef = 0;
  o.eval.size = 4;
  o.eval.max_new_tokens = 4;
  std::function<void()> save;
  if (role) {
    save = [run_dir, counts] { std::ofstream(fs::path(run_dir) / "version_counts.json") << counts->ToJson().dump(); };
  }
  UseVersionCheck(o, flat, counts, save);
  o.pipeline.processes = true;
  std::error_code ec;
  o.pipeline.role_command = {fs::read_symlink("/proc/self/exe", ec).string(), kRoleEntryFilter, "--run-dir=" + run_dir};
  return o;
}

TEST(RoleProcessEntry, Run) {
  const std::vector<std::string> args = OwnArguments();
  const std::string role = ArgumentValue(args, "--role");
  if (role.empty()) GTEST_SKIP() << "runs only as a role process of EveryTokenRecordsItsVersionWithRolesAsProcesses";
  RoleConnection c;
  c.role = *ParsePipelineRole(role);
  c.hub = ArgumentValue(args, "--hub");
  c.weights = ArgumentValue(args, "--weights");
  c.board = ArgumentValue(args, "--board");
  c.start_step = std::stoll(ArgumentValue(args, "--start-step"));
  c.start_version = std::stoll(ArgumentValue(args, "--start-version"));
  const std::string run_dir = ArgumentValue(args, "--run-dir");
  auto policy = model::LoadPretrained((fs::path(run_dir) / "roles" / "init").string());
  ASSERT_TRUE(policy.ok()) << policy.status().ToString();
  VersionCounts counts;
  const double flat = -std::log(static_cast<double>((*policy)->config().vocab_size));
  auto loop = SyncLoop::Create(*policy, std::make_shared<EvenFirstByteTask>(),
                               ProcessVersionOptions(run_dir, flat, &counts, /*role=*/true));
  ASSERT_TRUE(loop.ok()) << loop.status().ToString();
  Status st = (*loop)->RunRole(c, nullptr);
  ASSERT_TRUE(st.ok()) << role << ": " << st.ToString();
}

TEST_F(SyncLoopTest, EveryTokenRecordsItsVersionWithRolesAsProcesses) {
  auto model = FreshModel();
  Sharpen(*model);
  const std::string run_dir = (root_ / "versions-processes").string();
  VersionCounts unused;
  LoopOptions o = ProcessVersionOptions(run_dir, -std::log(static_cast<double>(model->config().vocab_size)), &unused,
                                        /*role=*/false);
  auto loop = std::move(SyncLoop::Create(model, std::make_shared<EvenFirstByteTask>(), o)).value();
  Status st = loop->Train(nullptr);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(ReadMetrics(run_dir).size(), 6u) << "six steps trained";
  std::ifstream in(fs::path(run_dir) / "version_counts.json");
  ASSERT_TRUE(in.good()) << "the trainer process wrote no counts";
  const VersionCounts counts = VersionCounts::FromJson(json::parse(in));
  EXPECT_EQ(counts.mismatches, 0);
  EXPECT_EQ(counts.bad_lengths, 0);
  EXPECT_GT(counts.odd_tokens, 0) << "not vacuous: tokens from flat (odd) versions";
  EXPECT_GT(counts.even_tokens, 0);
}

TEST_F(SyncLoopTest, BadOptionsNameTheKey) {
  LoopOptions o = Options("bad", 1);
  o.rl.group_size = 1;
  auto r = SyncLoop::Create(FreshModel(), task_, o);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("rl.group_size"), std::string::npos) << r.status().ToString();
  o = Options("bad", 1);
  o.run_dir.clear();
  EXPECT_NE(SyncLoop::Create(FreshModel(), task_, o).status().message().find("run.dir"), std::string::npos);
  o = Options("bad", 1);
  o.sft.shortcut_fraction = 1.5;
  EXPECT_NE(SyncLoop::Create(FreshModel(), task_, o).status().message().find("sft.shortcut_fraction"),
            std::string::npos);
  o = Options("bad", 1);
  o.rl.sampling.top_p = 2;
  EXPECT_NE(SyncLoop::Create(FreshModel(), task_, o).status().message().find("top_p"), std::string::npos);
}

}  // namespace
}  // namespace sluice::pipeline
