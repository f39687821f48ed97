// The GPU path against the CPU path (label gpu; docs/gpu.md): logits of a
// small Qwen2-shaped checkpoint, the rollout engine's continuous batching,
// a trainer step, a publish served through standby weights, and a short
// streaming run with both roles on the device.
//
// The device is SLUICE_TEST_DEVICE (default cuda). Without a usable CUDA
// device every test is skipped with the reason. SLUICE_TEST_DEVICE=cpu runs
// the same comparisons on the CPU's generic (non-kernel) path, which checks
// the tests themselves on a machine without a GPU.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <random>

#include "sluice/checkpoint_engine/version_store.h"
#include "sluice/common/check.h"
#include "sluice/common/file_util.h"
#include "sluice/common/logging.h"
#include "sluice/model/config.h"
#include "sluice/model/device.h"
#include "sluice/model/transformer.h"
#include "sluice/model/weights.h"
#include "sluice/pipeline/run.h"
#include "sluice/reward/task.h"
#include "sluice/rollout/engine.h"
#include "sluice/rollout/standby_weights.h"
#include "sluice/trainer/losses.h"
#include "sluice/trainer/trainer.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
namespace ce = checkpoint_engine;
using std::chrono::milliseconds;

// A crash on the device machine prints its call stack (no debugger there).
const bool kCrashBacktrace = [] {
  InstallCrashBacktrace();
  return true;
}();

// The value of a result that must be ok (the test fails loudly otherwise).
template <typename T>
T Must(Result<T> r) {
  if (!r.ok()) ADD_FAILURE() << r.status().ToString();
  SLUICE_CHECK(r.ok()) << r.status().ToString();
  return std::move(r).value();
}

// The device under test, or the reason there is none.
Result<torch::Device> TestDevice() {
  const char* env = std::getenv("SLUICE_TEST_DEVICE");
  return model::ResolveDevice(env != nullptr && *env != '\0' ? env : "cuda");
}

#define SLUICE_DEVICE_OR_SKIP(var)                                  \
  auto var##_or = TestDevice();                                     \
  if (!var##_or.ok()) GTEST_SKIP() << var##_or.status().ToString(); \
  const torch::Device var = *var##_or;                              \
  std::fprintf(stderr, "[gpu_test] device under test: %s\n", var.str().c_str())

// Qwen2's layout at a small size: q/k/v biases, an untied head, grouped
// query attention, a vocabulary larger than the byte tokenizer's.
model::ModelConfig SmallQwen2() {
  model::ModelConfig c;
  c.model_type = "qwen2";
  c.vocab_size = 512;
  c.hidden_size = 128;
  c.intermediate_size = 352;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 256;
  c.rope_theta = 1000000.0;
  c.attention_bias = true;
  c.tie_word_embeddings = false;
  c.bos_token_id = 1;
  c.eos_token_id = 2;
  EXPECT_TRUE(c.Validate().ok());
  return c;
}

// A checkpoint on disk whose weights are large enough that logits have a
// clear maximum (the default init's 0.02 gives near-ties everywhere).
fs::path SaveCheckpoint(const std::string& name) {
  auto m = std::make_shared<model::Transformer>(SmallQwen2(), 7);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : m->named_parameters()) {
      if (p.key().find("norm") == std::string::npos) p.value().mul_(5.0);
    }
  }
  fs::path dir = fs::temp_directory_path() / ("sluice-gpu-test-" + name + "-" + std::to_string(::getpid()));
  static_cast<void>(sluice::RemoveTree(dir));
  EXPECT_TRUE(model::SavePretrained(*m, dir.string()).ok());
  return dir;
}

std::vector<int64_t> RandomTokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> d(3, vocab - 1);
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (auto& t : out) t = d(rng);
  return out;
}

double MaxAbsDiff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kCPU, torch::kFloat64) - b.to(torch::kCPU, torch::kFloat64)).abs().max().item<double>();
}

double MaxAbs(const torch::Tensor& a) { return a.to(torch::kCPU, torch::kFloat64).abs().max().item<double>(); }

TEST(GpuTest, LogitsMatchTheCpuOnAQwen2Checkpoint) {
  SLUICE_DEVICE_OR_SKIP(device);
  const fs::path dir = SaveCheckpoint("logits");
  auto cpu = *model::LoadPretrained(dir.string(), torch::kCPU);
  auto dev = *model::LoadPretrained(dir.string(), device);
  static_cast<void>(sluice::RemoveTree(dir));
  torch::NoGradGuard no_grad;
  auto tokens = torch::tensor(RandomTokens(2 * 48, 512, 1)).view({2, 48});
  const auto want = cpu->Forward(tokens);
  const auto got = dev->Forward(tokens.to(device));
  EXPECT_TRUE(got.device() == device);
  const double scale = MaxAbs(want);
  EXPECT_GT(scale, 1.0) << "logits too flat to compare";
  EXPECT_LT(MaxAbsDiff(want, got), 1e-4 * scale) << "float32 on " << device.str();

  // The cached (rollout) path on the device: prefill 40 tokens, then decode
  // the next 8 one at a time; each position's logits as the full pass's.
  model::KvCache cache = model::KvCache::Allocate(dev->config(), 2, 64, device);
  auto seq = tokens.to(device);
  auto prefill = dev->ForwardCached(seq.narrow(1, 0, 40), {0, 1}, {0, 0}, &cache);
  EXPECT_LT(MaxAbsDiff(want.narrow(1, 0, 40), prefill), 1e-4 * scale);
  for (int64_t t = 40; t < 48; ++t) {
    auto step = dev->ForwardCached(seq.narrow(1, t, 1), {0, 1}, {t, t}, &cache);
    EXPECT_LT(MaxAbsDiff(want.narrow(1, t, 1), step), 1e-4 * scale) << "decode position " << t;
  }

  // bfloat16 weights (the rollout's dtype on a GPU): close, not equal.
  auto bf16 = model::CloneModel(*dev, device, torch::kBFloat16);
  const auto low = bf16->Forward(tokens.to(device));
  EXPECT_EQ(low.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::isfinite(low).all().item<bool>());
  EXPECT_LT(MaxAbsDiff(want, low), 0.1 * scale) << "bfloat16 on " << device.str();
  const auto agree = (want.argmax(-1) == low.argmax(-1).to(torch::kCPU)).to(torch::kFloat32).mean().item<float>();
  EXPECT_GT(agree, 0.8f) << "bfloat16 greedy tokens agree with float32 at only " << agree;
}

// Requests of varied prompt and answer lengths, more than the engine's
// slots, so sequences join and leave the batch mid-flight.
std::vector<rollout::GenerationRequest> MixedGreedyRequests(int n) {
  std::vector<rollout::GenerationRequest> out;
  for (int i = 0; i < n; ++i) {
    rollout::GenerationRequest r;
    r.id = static_cast<uint64_t>(i);
    for (int64_t t : RandomTokens(4 + (i * 7) % 23, 512, 100 + static_cast<uint32_t>(i))) r.prompt.push_back(t);
    r.sampling.temperature = 0;
    r.sampling.max_new_tokens = 6 + (i * 11) % 37;
    out.push_back(r);
  }
  return out;
}

// Every generated token checked against a CPU full forward of the same
// sequence: its logprob, and that it is the CPU's greedy choice up to `tol`.
void ExpectGreedyAgreesWithCpu(model::Transformer& cpu, const std::vector<rollout::GenerationRequest>& requests,
                               const std::vector<rollout::GenerationResult>& results, double logprob_tol,
                               double choice_tol) {
  ASSERT_EQ(results.size(), requests.size());
  torch::NoGradGuard no_grad;
  for (const auto& r : results) {
    const auto& req = requests.at(r.id);
    ASSERT_EQ(r.tokens.size(), static_cast<size_t>(req.sampling.max_new_tokens)) << "request " << r.id;
    std::vector<int64_t> seq(req.prompt.begin(), req.prompt.end());
    seq.insert(seq.end(), r.tokens.begin(), r.tokens.end());
    auto logp = torch::log_softmax(cpu.Forward(torch::tensor(seq).view({1, -1})), -1)[0];
    for (size_t i = 0; i < r.tokens.size(); ++i) {
      const int64_t pos = static_cast<int64_t>(req.prompt.size() + i) - 1;
      const double want = logp[pos][r.tokens[i]].item<double>();
      const double best = logp[pos].max().item<double>();
      EXPECT_NEAR(r.logprobs[i], want, logprob_tol) << "request " << r.id << " token " << i;
      EXPECT_GE(want, best - choice_tol) << "request " << r.id << " token " << i << " is not the greedy choice";
    }
  }
}

TEST(GpuTest, EngineContinuousBatchingMatchesTheCpu) {
  SLUICE_DEVICE_OR_SKIP(device);
  const fs::path dir = SaveCheckpoint("engine");
  auto cpu = *model::LoadPretrained(dir.string(), torch::kCPU);
  auto dev = *model::LoadPretrained(dir.string(), device);
  static_cast<void>(sluice::RemoveTree(dir));
  const auto requests = MixedGreedyRequests(24);
  for (torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16}) {
    SCOPED_TRACE(dtype == torch::kFloat32 ? "float32" : "bfloat16");
    auto served = model::CloneModel(*dev, device, dtype);
    rollout::EngineOptions o;
    o.num_slots = 8;
    o.max_seq_len = 128;
    o.eos_token_id = 0;
    auto engine = Must(rollout::RolloutEngine::Create({served, 0}, o));
    for (const auto& r : requests) ASSERT_TRUE(engine->Submit(r).ok());
    auto results = engine->RunUntilIdle();
    ASSERT_TRUE(results.ok()) << results.status().ToString();
    std::sort(results->begin(), results->end(), [](const auto& a, const auto& b) { return a.id < b.id; });
    if (dtype == torch::kFloat32) {
      ExpectGreedyAgreesWithCpu(*cpu, requests, *results, 2e-3, 2e-3);
    } else {
      ExpectGreedyAgreesWithCpu(*cpu, requests, *results, 0.25, 0.5);
    }
    EXPECT_GT(engine->stats().decode_steps, 0);
  }
}

// A GRPO batch of sequences of varied lengths with their advantages.
std::vector<trainer::RolloutSample> Batch() {
  std::vector<trainer::RolloutSample> out;
  std::vector<double> rewards;
  std::vector<GroupId> groups;
  for (int i = 0; i < 8; ++i) {
    trainer::RolloutSample s;
    s.id = static_cast<uint64_t>(i);
    s.group_id = static_cast<GroupId>(i / 4);
    for (int64_t t : RandomTokens(5 + i % 3, 512, 300 + static_cast<uint32_t>(i / 4))) s.prompt.push_back(t);
    for (int64_t t : RandomTokens(4 + (i * 5) % 13, 512, 400 + static_cast<uint32_t>(i))) s.response.push_back(t);
    s.behavior_logprobs.assign(s.response.size(), -6.0f);
    s.versions.assign(s.response.size(), 0);
    s.reward = static_cast<double>(i % 2);
    rewards.push_back(s.reward);
    groups.push_back(s.group_id);
    out.push_back(std::move(s));
  }
  auto adv = *trainer::GroupAdvantages(rewards, groups, true);
  for (size_t i = 0; i < out.size(); ++i) out[i].advantage = adv[i];
  return out;
}

TEST(GpuTest, TrainerStepMatchesTheCpu) {
  SLUICE_DEVICE_OR_SKIP(device);
  const fs::path dir = SaveCheckpoint("trainer");
  trainer::TrainerOptions o;
  o.optimizer.lr = 1e-3;
  o.mini_batches = 2;
  o.micro_batch_tokens = 48;  // several micro-batches: accumulation on the device too
  auto run = [&](torch::Device d, bool bf16) {
    auto m = *model::LoadPretrained(dir.string(), d);
    trainer::TrainerOptions to = o;
    to.bf16_autocast = bf16;
    auto t = Must(trainer::Trainer::Create(m, nullptr, to));
    auto metrics = t->RlStep(Batch());
    EXPECT_TRUE(metrics.ok()) << metrics.status().ToString();
    return std::make_pair(metrics.ok() ? *metrics : trainer::StepMetrics{}, m);
  };
  auto [want, cpu] = run(torch::kCPU, false);
  auto [got, dev] = run(device, false);
  static_cast<void>(sluice::RemoveTree(dir));
  EXPECT_NEAR(got.loss, want.loss, 1e-4 * (1 + std::abs(want.loss)));
  EXPECT_NEAR(got.grad_norm, want.grad_norm, 1e-3 * want.grad_norm);
  EXPECT_GT(want.grad_norm, 0);
  // AdamW divides each element's step by its gradient's running magnitude, so
  // an element whose gradient is tiny (its value set by summation order alone)
  // may move differently on the two devices, by up to the learning rate per
  // step. Nearly all elements agree to 1e-4, and the mean difference stays at
  // rounding level; a wrong gradient would move most elements by ~lr (1e-3).
  auto wp = cpu->named_parameters();
  int64_t elements = 0, apart = 0;
  double total = 0, worst = 0;
  for (auto& p : dev->named_parameters()) {
    auto d = (wp[p.key()].to(torch::kCPU, torch::kFloat64) - p.value().to(torch::kCPU, torch::kFloat64)).abs();
    elements += d.numel();
    apart += (d > 1e-4).sum().item<int64_t>();
    total += d.sum().item<double>();
    worst = std::max(worst, d.max().item<double>());
  }
  std::printf(
      "[gpu_test] parameters after two AdamW steps: %lld of %lld elements differ by more than 1e-4, "
      "mean difference %.3g, largest %.3g\n",
      static_cast<long long>(apart), static_cast<long long>(elements), total / elements, worst);
  EXPECT_LE(apart, elements / 100) << "parameters after two AdamW steps";
  EXPECT_LT(total / elements, 1e-5) << "parameters after two AdamW steps";
  EXPECT_LE(worst, 2 * 2 * o.optimizer.lr + 1e-6) << "no element moved further than two Adam steps allow";
  if (device.is_cuda()) {  // bf16 autocast: the same step to bfloat16's precision
    auto dir2 = SaveCheckpoint("trainer-bf16");
    auto m = *model::LoadPretrained(dir2.string(), device);
    static_cast<void>(sluice::RemoveTree(dir2));
    trainer::TrainerOptions to = o;
    to.bf16_autocast = true;
    auto t = Must(trainer::Trainer::Create(m, nullptr, to));
    auto metrics = t->RlStep(Batch());
    ASSERT_TRUE(metrics.ok()) << metrics.status().ToString();
    EXPECT_NEAR(metrics->loss, want.loss, 0.05 * (1 + std::abs(want.loss)));
    EXPECT_NEAR(metrics->grad_norm, want.grad_norm, 0.1 * want.grad_norm);
    EXPECT_EQ(m->parameters().front().scalar_type(), torch::kFloat32) << "master weights stay float32";
  }
}

TEST(GpuTest, PublishedWeightsAreServedOnTheDevice) {
  SLUICE_DEVICE_OR_SKIP(device);
  // The trainer's float32 model on the device publishes; the rollout serves a
  // bfloat16 copy on the device, refreshed through a standby buffer.
  auto policy = std::make_shared<model::Transformer>(SmallQwen2(), 3);
  policy->to(device);
  auto initial = *model::ExportWeights(*policy);
  ce::VersionStoreOptions so;
  so.layout = ce::LayoutOf(initial);
  auto store = Must(ce::VersionStore::Create(so));
  ASSERT_TRUE(store->Publish(0, initial).ok());
  auto served = model::CloneModel(*policy, device, torch::kBFloat16);
  auto standby = Must(rollout::StandbyWeights::Create(served, 0, *store));
  rollout::EngineOptions eo;
  eo.num_slots = 2;
  eo.max_seq_len = 64;
  eo.eos_token_id = 0;
  auto engine = Must(rollout::RolloutEngine::Create({served, 0}, eo));
  std::optional<rollout::PolicySnapshot> handed;  // what the standby buffer hands the engine
  engine->SetWeightSwapHook([hook = standby->Hook(), &handed](rollout::PolicyVersion current) {
    auto snap = hook(current);
    if (snap) handed = snap;
    return snap;
  });

  {  // version 1: every weight changed on the device
    torch::NoGradGuard no_grad;
    for (auto& p : policy->parameters()) p.add_(0.01);
  }
  ASSERT_TRUE(store->Publish(1, *model::ExportWeights(*policy)).ok());
  ASSERT_TRUE(standby->WaitUntilReady(1, milliseconds(30000)).ok());
  rollout::GenerationRequest r;
  r.id = 1;
  r.prompt = {5, 6, 7};
  r.sampling.temperature = 0;
  r.sampling.max_new_tokens = 4;
  ASSERT_TRUE(engine->Submit(r).ok());
  auto results = engine->RunUntilIdle();
  ASSERT_TRUE(results.ok()) << results.status().ToString();
  ASSERT_EQ(results->size(), 1u);
  EXPECT_EQ((*results)[0].versions.front(), 1) << "the first token already comes from the published version";
  EXPECT_EQ(engine->policy_version(), 1);
  // What the engine serves is version 1 in bfloat16, on the device (on a
  // CPU, its matrices: vectors stay float32, see model::PlaceModel).
  ASSERT_TRUE(handed.has_value());
  EXPECT_EQ(handed->version, 1);
  auto want = policy->named_parameters();
  for (auto& p : handed->model->named_parameters()) {
    EXPECT_TRUE(p.value().device() == device) << p.key();
    const auto dtype = device.is_cpu() && p.value().dim() != 2 ? torch::kFloat32 : torch::kBFloat16;
    EXPECT_EQ(p.value().scalar_type(), dtype) << p.key();
    EXPECT_TRUE(torch::equal(p.value().to(torch::kCPU), want[p.key()].to(torch::kCPU, dtype))) << p.key();
  }
  standby->Stop();
}

TEST(GpuTest, AsyncRunTrainsWithBothRolesOnTheDevice) {
  SLUICE_DEVICE_OR_SKIP(device);
  reward::TaskOptions to;
  to.name = "arithmetic";
  to.seed = 1;
  std::shared_ptr<const reward::Task> task(Must(reward::MakeTask(to)));
  pipeline::RunOptions o;
  o.run_dir = (fs::temp_directory_path() / ("sluice-gpu-test-run-" + std::to_string(::getpid()))).string();
  static_cast<void>(sluice::RemoveTree(o.run_dir));
  o.checkpoint_interval = 0;
  o.rl.steps = 3;
  o.rl.prompts_per_step = 4;
  o.rl.group_size = 4;
  o.rl.rollout_slots = 16;
  o.rl.sampling.max_new_tokens = 24;
  o.eval.interval = 0;
  o.eval.size = 8;
  o.eval.max_new_tokens = 8;
  o.pipeline.mode = pipeline::PipelineMode::kAsync;
  o.devices.trainer = device.str();
  o.devices.rollout = device.str();
  auto config = *model::PresetModelConfig("1m");
  auto policy = std::make_shared<model::Transformer>(config, 5);
  auto run = pipeline::TrainingRun::Create(policy, task, o);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  Status trained = (*run)->Train(nullptr);
  ASSERT_TRUE(trained.ok()) << trained.ToString();
  ASSERT_EQ((*run)->history().size(), 3u);
  for (const auto& rec : (*run)->history()) {
    EXPECT_GT(rec.samples_trained, 0);
    EXPECT_TRUE(std::isfinite(rec.train.loss));
  }
  EXPECT_TRUE(policy->parameters().front().device() == device) << "the trainer's model lives on the device";
  static_cast<void>(sluice::RemoveTree(o.run_dir));
}

}  // namespace
}  // namespace sluice
