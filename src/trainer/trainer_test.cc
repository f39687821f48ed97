#include "sluice/trainer/trainer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>

#include "sluice/model/weights.h"
#include "sluice/rollout/engine.h"

namespace sluice::trainer {
namespace {

using model::ModelConfig;
using model::Transformer;

std::shared_ptr<Transformer> TinyModel(uint64_t seed = 3) {
  ModelConfig c = *model::PresetModelConfig("tiny");
  c.max_position_embeddings = 64;
  return std::make_shared<Transformer>(c, seed);
}

RolloutSample MakeSample(uint64_t id, std::vector<TokenId> prompt, std::vector<TokenId> response, double advantage) {
  RolloutSample s;
  s.id = id;
  s.group_id = id / 2;
  s.prompt = std::move(prompt);
  s.response = std::move(response);
  s.behavior_logprobs.assign(s.response.size(), -1.0f);
  s.versions.assign(s.response.size(), 0);
  s.advantage = advantage;
  return s;
}

std::vector<RolloutSample> FixedBatch() {
  return {MakeSample(0, {257, 10, 20}, {30, 40, 50, 258}, 1.0), MakeSample(1, {257, 11}, {31, 258}, -1.0),
          MakeSample(2, {257, 12, 22, 32, 42}, {33, 258}, 0.5), MakeSample(3, {257}, {34, 44, 54, 64, 74, 258}, -0.5)};
}

std::unique_ptr<Trainer> MakeTrainer(std::shared_ptr<Transformer> m, TrainerOptions o = {}) {
  o.optimizer.lr = 1e-2;
  auto t = Trainer::Create(std::move(m), nullptr, o);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return std::move(t).value();
}

double Sum(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += x;
  return s;
}

TEST(TrainerTest, RlStepMovesLogprobsInTheDirectionOfTheAdvantage) {
  auto m = TinyModel();
  auto trainer = MakeTrainer(m);
  auto batch = FixedBatch();
  auto before = *trainer->ResponseLogprobs(*m, batch);
  auto metrics = trainer->RlStep(batch);
  ASSERT_TRUE(metrics.ok()) << metrics.status().ToString();
  EXPECT_EQ(metrics->optimizer_steps, 1);
  EXPECT_EQ(metrics->tokens, 4 + 2 + 2 + 6);
  EXPECT_NEAR(metrics->ratio_mean, 1.0, 1e-5) << "old logprobs are recomputed with the same weights";
  auto after = *trainer->ResponseLogprobs(*m, batch);
  for (size_t i = 0; i < batch.size(); ++i) {
    double change = Sum(after[i]) - Sum(before[i]);
    EXPECT_GT(change * batch[i].advantage, 0) << "sample " << i << " change " << change;
  }
}

// Tokens the policy did not sample (an environment's, version -1) are
// context only: a batch of them alone trains nothing (no token, no change
// to any weight), and in a mixed batch they are not counted. Fails if
// environment tokens are trained.
TEST(TrainerTest, TokensThePolicyDidNotSampleAreNotTrained) {
  auto m = TinyModel();
  auto trainer = MakeTrainer(m);
  auto batch = FixedBatch();
  for (RolloutSample& s : batch) s.versions.assign(s.response.size(), -1);
  const TensorMap before = *model::ExportWeights(*m);
  auto none = trainer->RlStep(batch);
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_EQ(none->tokens, 0);
  const TensorMap after = *model::ExportWeights(*m);
  for (const auto& [name, t] : before) {
    EXPECT_EQ(std::memcmp(t.data, after.at(name).data, t.nbytes), 0) << name << " changed";
  }
  batch = FixedBatch();
  batch[0].versions = {0, -1, -1, 0};  // two of its four tokens an environment's
  auto mixed = trainer->RlStep(batch);
  ASSERT_TRUE(mixed.ok()) << mixed.status().ToString();
  EXPECT_EQ(mixed->tokens, 2 + 2 + 2 + 6);
}

TEST(TrainerTest, OneSftStepOnAFixedBatchLowersTheLoss) {
  auto m = TinyModel();
  auto trainer = MakeTrainer(m);
  std::vector<SftExample> batch = {{{257, 1, 2}, {3, 4, 258}}, {{257, 5}, {6, 7, 8, 258}}};
  auto first = trainer->SftStep(batch);
  ASSERT_TRUE(first.ok());
  auto second = trainer->SftStep(batch);
  ASSERT_TRUE(second.ok());
  EXPECT_LT(second->loss, first->loss);
  EXPECT_NEAR(first->loss, std::log(259.0), 0.1) << "a fresh model is near uniform";
}

TEST(TrainerTest, PaddingAndMicroBatchingDoNotChangeTheUpdate) {
  // Same samples; one trainer packs them one per micro-batch with pad token 0,
  // the other all in one micro-batch with pad token 99: identical updates.
  auto a = TinyModel(), b = TinyModel();
  TrainerOptions small;
  small.micro_batch_tokens = 10;
  small.pad_token = 0;
  TrainerOptions large;
  large.micro_batch_tokens = 4096;
  large.pad_token = 99;
  auto ta = MakeTrainer(a, small), tb = MakeTrainer(b, large);
  auto ma = ta->RlStep(FixedBatch()), mb = tb->RlStep(FixedBatch());
  ASSERT_TRUE(ma.ok() && mb.ok());
  EXPECT_GT(ma->micro_batches, mb->micro_batches);
  auto pa = a->named_parameters(), pb = b->named_parameters();
  for (const auto& p : pa) {
    // Adam turns summation-order noise in near-zero gradients into steps of
    // ~1e-5 at lr 1e-2; a leak from padding would move weights by ~lr.
    EXPECT_TRUE(torch::allclose(p.value(), pb[p.key()], 1e-4, 1e-4))
        << p.key() << " max diff " << (p.value() - pb[p.key()]).abs().max().item<float>();
  }
}

TEST(TrainerTest, ParallelMicroBatchWorkersGiveTheSameUpdate) {
  // Two workers split the batch into micro-batches computed at once; the
  // update equals the sequential one up to summation order. A helper that
  // may never run (may_run false) leaves all the work to the caller.
  auto seq = TinyModel(), par = TinyModel(), lent = TinyModel();
  TrainerOptions two;
  two.micro_batch_threads = 2;
  TrainerOptions never = two;
  std::atomic<int> asked{0};
  never.may_run = [&](int32_t w) {
    EXPECT_GT(w, 0) << "the caller's worker never asks";
    asked.fetch_add(1);
    return false;
  };
  auto ts = MakeTrainer(seq), tp = MakeTrainer(par, two), tl = MakeTrainer(lent, never);
  auto ms = ts->RlStep(FixedBatch()), mp = tp->RlStep(FixedBatch()), ml = tl->RlStep(FixedBatch());
  ASSERT_TRUE(ms.ok() && mp.ok() && ml.ok());
  EXPECT_EQ(ms->micro_batches, 1);
  EXPECT_GE(mp->micro_batches, 2) << "split so both workers have work";
  EXPECT_EQ(mp->tokens, ms->tokens);
  EXPECT_NEAR(mp->loss, ms->loss, 1e-5);
  EXPECT_NEAR(mp->entropy, ms->entropy, 1e-5);
  EXPECT_GT(asked.load(), 0);
  for (const auto& p : seq->named_parameters()) {
    EXPECT_TRUE(torch::allclose(p.value(), par->named_parameters()[p.key()], 1e-4, 1e-4)) << p.key();
    EXPECT_TRUE(torch::allclose(p.value(), lent->named_parameters()[p.key()], 1e-4, 1e-4)) << p.key();
  }
  // A lent worker hands its core back after every micro-batch it was allowed to take.
  TrainerOptions counted = two;
  std::atomic<int> granted{0}, handed_back{0};
  counted.may_run = [&](int32_t) {
    granted.fetch_add(1);
    return true;
  };
  counted.done_running = [&](int32_t) { handed_back.fetch_add(1); };
  auto tc = MakeTrainer(TinyModel(), counted);
  ASSERT_TRUE(tc->RlStep(FixedBatch()).ok());
  EXPECT_GT(granted.load(), 0);
  EXPECT_EQ(handed_back.load(), granted.load());
  // SFT steps use the workers too.
  std::vector<SftExample> sft = {{{257, 1, 2}, {3, 4, 258}}, {{257, 5}, {6, 7, 8, 258}}, {{257, 9}, {10, 258}}};
  auto ss = ts->SftStep(sft), sp = tp->SftStep(sft);
  ASSERT_TRUE(ss.ok() && sp.ok());
  EXPECT_NEAR(ss->loss, sp->loss, 1e-3);
}

TEST(TrainerTest, RecomputedLogprobsMatchTheRolloutEngine) {
  auto m = TinyModel(5);
  for (float temperature : {1.0f, 0.7f}) {
    auto engine =
        std::move(rollout::RolloutEngine::Create(rollout::PolicySnapshot{m, 0}, rollout::EngineOptions{})).value();
    for (uint64_t i = 0; i < 6; ++i) {
      rollout::GenerationRequest r;
      r.id = i;
      r.prompt = {257, static_cast<TokenId>(40 + i), static_cast<TokenId>(50 + 2 * i)};
      r.sampling.temperature = temperature;
      r.sampling.seed = i;
      r.sampling.forced_length = 5 + 3 * static_cast<int32_t>(i);
      ASSERT_TRUE(engine->Submit(r).ok());
    }
    auto results = engine->RunUntilIdle();
    ASSERT_TRUE(results.ok());
    std::vector<RolloutSample> samples;
    for (const auto& g : *results) {
      RolloutSample s = MakeSample(g.id, g.prompt, g.tokens, 0.0);
      s.behavior_logprobs = g.logprobs;
      samples.push_back(s);
    }
    TrainerOptions o;
    o.temperature = temperature;
    auto trainer = MakeTrainer(m, o);
    auto recomputed = trainer->ResponseLogprobs(*m, samples);
    ASSERT_TRUE(recomputed.ok());
    for (size_t i = 0; i < samples.size(); ++i) {
      ASSERT_EQ((*recomputed)[i].size(), samples[i].behavior_logprobs.size());
      for (size_t j = 0; j < samples[i].behavior_logprobs.size(); ++j) {
        EXPECT_NEAR((*recomputed)[i][j], samples[i].behavior_logprobs[j], 2e-5) << "T=" << temperature;
      }
    }
  }
}

// The step reports how far the rollout's log-probabilities lie from its own:
// behaviour logprobs offset by known amounts give exactly that gap; a
// bfloat16 rollout (bfloat16 matrices on the CPU) gives a small, nonzero one.
TEST(TrainerTest, ReportsTheGapBetweenRolloutAndTrainerLogprobs) {
  auto m = TinyModel(5);
  auto batch = FixedBatch();
  auto exact = *MakeTrainer(m)->ResponseLogprobs(*m, batch);
  double offsets = 0, tokens = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    for (size_t j = 0; j < exact[i].size(); ++j) {
      const float offset = j % 2 == 0 ? 0.25f : -0.125f;
      batch[i].behavior_logprobs[j] = exact[i][j] + offset;
      offsets += std::fabs(offset);
      ++tokens;
    }
  }
  auto metrics = MakeTrainer(m)->RlStep(batch);
  ASSERT_TRUE(metrics.ok()) << metrics.status().ToString();
  EXPECT_NEAR(metrics->rollout_logprob_gap_mean, offsets / tokens, 1e-5);
  EXPECT_NEAR(metrics->rollout_logprob_gap_max, 0.25, 1e-5);
  TrainerOptions no_recompute;
  no_recompute.recompute_old_logprobs = false;
  auto unmeasured = MakeTrainer(TinyModel(5), no_recompute)->RlStep(batch);
  ASSERT_TRUE(unmeasured.ok());
  EXPECT_EQ(unmeasured->rollout_logprob_gap_mean, 0.0);

  auto served = model::CloneModel(*m, torch::kCPU, torch::kBFloat16);
  auto engine =
      std::move(rollout::RolloutEngine::Create(rollout::PolicySnapshot{served, 0}, rollout::EngineOptions{})).value();
  for (uint64_t i = 0; i < 6; ++i) {
    rollout::GenerationRequest r;
    r.id = i;
    r.prompt = {257, static_cast<TokenId>(40 + i)};
    r.sampling.seed = i;
    r.sampling.forced_length = 12;
    ASSERT_TRUE(engine->Submit(r).ok());
  }
  auto results = engine->RunUntilIdle();
  ASSERT_TRUE(results.ok());
  std::vector<RolloutSample> generated;
  for (const auto& g : *results) {
    RolloutSample s = MakeSample(g.id, g.prompt, g.tokens, g.id % 2 == 0 ? 1.0 : -1.0);
    s.behavior_logprobs = g.logprobs;
    generated.push_back(s);
  }
  auto bf16 = MakeTrainer(m)->RlStep(generated);
  ASSERT_TRUE(bf16.ok()) << bf16.status().ToString();
  EXPECT_GT(bf16->rollout_logprob_gap_mean, 1e-5);
  EXPECT_LT(bf16->rollout_logprob_gap_mean, 0.05);
}

TEST(TrainerTest, OptimizerStateRoundTripContinuesIdentically) {
  auto a = TinyModel(), b = TinyModel();
  auto ta = MakeTrainer(a);
  ASSERT_TRUE(ta->RlStep(FixedBatch()).ok());
  ASSERT_TRUE(ta->RlStep(FixedBatch()).ok());
  // b gets a's weights and optimizer state, then both take the same step.
  ASSERT_TRUE(model::LoadWeights(*b, *model::ExportWeights(*a)).ok());
  auto tb = MakeTrainer(b);
  ASSERT_TRUE(tb->LoadOptimizerState(ta->OptimizerState(), ta->optimizer_steps()).ok());
  ASSERT_TRUE(ta->RlStep(FixedBatch()).ok());
  ASSERT_TRUE(tb->RlStep(FixedBatch()).ok());
  auto pa = a->named_parameters(), pb = b->named_parameters();
  for (const auto& p : pa) EXPECT_TRUE(torch::equal(p.value(), pb[p.key()])) << p.key();
  // A state missing one tensor is refused and leaves the moments untouched:
  // both trainers still take identical steps afterwards.
  auto state = ta->OptimizerState();
  state.erase(std::prev(state.end()));
  EXPECT_FALSE(tb->LoadOptimizerState(state, 1).ok());
  EXPECT_EQ(tb->optimizer_steps(), ta->optimizer_steps());
  ASSERT_TRUE(ta->RlStep(FixedBatch()).ok());
  ASSERT_TRUE(tb->RlStep(FixedBatch()).ok());
  for (const auto& p : pa) EXPECT_TRUE(torch::equal(p.value(), pb[p.key()])) << p.key();
}

TEST(TrainerTest, LearningRateWarmupAndCosineDecay) {
  TrainerOptions o;
  auto m = TinyModel();
  o.optimizer.lr = 1.0;
  o.optimizer.warmup_steps = 4;
  o.optimizer.decay_steps = 10;
  o.optimizer.min_lr_ratio = 0.1;
  auto t = std::move(Trainer::Create(m, nullptr, o)).value();
  std::vector<double> lrs;
  std::vector<SftExample> batch = {{{257}, {1, 258}}};
  for (int i = 0; i < 16; ++i) {
    lrs.push_back(t->CurrentLr());
    ASSERT_TRUE(t->SftStep(batch).ok());
  }
  EXPECT_DOUBLE_EQ(lrs[0], 0.25);
  EXPECT_DOUBLE_EQ(lrs[3], 1.0);
  EXPECT_DOUBLE_EQ(lrs[4], 1.0);
  EXPECT_NEAR(lrs[9], 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 0.5)), 1e-12);
  EXPECT_DOUBLE_EQ(lrs[14], 0.1);
  EXPECT_DOUBLE_EQ(lrs[15], 0.1);
}

// Regression: recompute_old_logprobs=false made pi_prox the behaviour policy,
// so every correction weight was 1 and the correction silently did nothing.
TEST(TrainerTest, ACorrectionWithoutRecomputedOldLogprobsIsRejected) {
  for (OffPolicyCorrection c :
       {OffPolicyCorrection::kDecoupled, OffPolicyCorrection::kTokenTis, OffPolicyCorrection::kSequenceTis}) {
    TrainerOptions o;
    o.loss.correction = c;
    o.recompute_old_logprobs = false;
    Status st = o.Validate();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << OffPolicyCorrectionName(c);
    EXPECT_NE(st.message().find("trainer.recompute_old_logprobs"), std::string::npos) << st.ToString();
    EXPECT_EQ(Trainer::Create(TinyModel(), nullptr, o).status().code(), StatusCode::kInvalidArgument);
    o.recompute_old_logprobs = true;
    EXPECT_TRUE(o.Validate().ok());
  }
  TrainerOptions on_policy;
  on_policy.recompute_old_logprobs = false;  // no correction: allowed
  EXPECT_TRUE(on_policy.Validate().ok());
}

// kBehavior is PPO around the behaviour policy: the same update as no
// correction without recomputation (where the behaviour policy is the
// proximal one), whatever recompute_old_logprobs says; with recomputation it
// still measures the rollout gap. Stale behaviour logprobs change the update
// (the clip is around them), unlike with no correction and recomputation.
TEST(TrainerTest, BehaviorCorrectionClipsAroundTheBehaviourPolicy) {
  auto batch = FixedBatch();
  auto m = TinyModel(7);
  auto exact = *MakeTrainer(m)->ResponseLogprobs(*m, batch);
  for (size_t i = 0; i < batch.size(); ++i) {
    for (size_t j = 0; j < exact[i].size(); ++j) batch[i].behavior_logprobs[j] = exact[i][j] + (j % 2 ? 0.5f : -0.5f);
  }
  auto step = [&](OffPolicyCorrection c, bool recompute, StepMetrics* metrics) {
    auto model = TinyModel(7);
    TrainerOptions o;
    o.loss.correction = c;
    o.recompute_old_logprobs = recompute;
    auto r = MakeTrainer(model, o)->RlStep(batch);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (r.ok() && metrics != nullptr) *metrics = *r;
    return model;
  };
  EXPECT_EQ(*ParseOffPolicyCorrection("behavior"), OffPolicyCorrection::kBehavior);
  EXPECT_EQ(OffPolicyCorrectionName(OffPolicyCorrection::kBehavior), "behavior");
  StepMetrics measured, unmeasured;
  auto behavior = step(OffPolicyCorrection::kBehavior, true, &measured);
  auto behavior_no_recompute = step(OffPolicyCorrection::kBehavior, false, &unmeasured);
  auto plain_no_recompute = step(OffPolicyCorrection::kNone, false, nullptr);
  auto plain_recompute = step(OffPolicyCorrection::kNone, true, nullptr);
  auto pb = behavior->named_parameters(), pn = behavior_no_recompute->named_parameters(),
       pp = plain_no_recompute->named_parameters(), pr = plain_recompute->named_parameters();
  bool differs_from_recomputed = false;
  for (const auto& p : pb) {
    EXPECT_TRUE(torch::equal(p.value(), pn[p.key()])) << p.key();
    EXPECT_TRUE(torch::equal(p.value(), pp[p.key()])) << p.key();
    differs_from_recomputed |= !torch::equal(p.value(), pr[p.key()]);
  }
  EXPECT_TRUE(differs_from_recomputed);
  EXPECT_NEAR(measured.rollout_logprob_gap_mean, 0.5, 1e-5);
  EXPECT_EQ(unmeasured.rollout_logprob_gap_mean, 0.0);
  EXPECT_GT(measured.clip_frac, 0.0);  // ratios e^0.5 and e^-0.5 lie outside [0.8, 1.2]
  EXPECT_EQ(measured.is_weight_mean, 0.0);
}

TEST(TrainerTest, BadInputIsRejectedWithoutChangingTheModel) {
  auto m = TinyModel();
  auto snapshot = *model::ExportWeights(*m);
  auto trainer = MakeTrainer(m);
  EXPECT_EQ(trainer->RlStep({}).status().code(), StatusCode::kInvalidArgument);
  auto batch = FixedBatch();
  batch[1].behavior_logprobs.pop_back();
  EXPECT_NE(trainer->RlStep(batch).status().message().find("1 logprobs for 2"), std::string::npos);
  batch = FixedBatch();
  batch[2].response.clear();
  batch[2].behavior_logprobs.clear();
  batch[2].versions.clear();
  EXPECT_NE(trainer->RlStep(batch).status().message().find("empty response"), std::string::npos);
  batch = FixedBatch();
  batch[0].response.assign(70, 1);
  batch[0].behavior_logprobs.assign(70, 0.f);
  batch[0].versions.assign(70, 0);
  EXPECT_EQ(trainer->RlStep(batch).status().code(), StatusCode::kOutOfRange);
  batch = FixedBatch();
  batch[3].prompt[0] = 300;
  EXPECT_NE(trainer->RlStep(batch).status().message().find("outside the vocabulary"), std::string::npos);
  auto after = *model::ExportWeights(*m);
  for (const auto& [name, t] : snapshot) {
    EXPECT_EQ(std::memcmp(t.data, after.at(name).data, t.nbytes), 0) << name;
  }
  TrainerOptions bad;
  bad.mini_batches = 0;
  EXPECT_FALSE(Trainer::Create(m, nullptr, bad).ok());
  TrainerOptions kl;
  kl.loss.kl_coef = 0.1;
  EXPECT_NE(Trainer::Create(m, nullptr, kl).status().message().find("reference"), std::string::npos);
}

TEST(TrainerTest, KlPenaltyPullsTowardTheReference) {
  auto m = TinyModel(), ref = TinyModel();
  TrainerOptions o;
  o.loss.kl_coef = 1.0;
  o.optimizer.lr = 1e-2;
  auto trainer = std::move(Trainer::Create(m, ref, o)).value();
  auto batch = FixedBatch();
  for (auto& s : batch) s.advantage = 0.0;  // only the KL term acts
  auto first = trainer->RlStep(batch);
  ASSERT_TRUE(first.ok());
  EXPECT_NEAR(first->kl, 0.0, 1e-6) << "policy == reference at the start";
  // Perturb the policy; KL becomes positive and steps reduce it.
  {
    torch::NoGradGuard g;
    for (auto& p : m->parameters()) p.add_(torch::randn(p.sizes()) * 0.05);
  }
  double kl_before = trainer->RlStep(batch)->kl;
  double kl_later = kl_before;
  for (int i = 0; i < 5; ++i) kl_later = trainer->RlStep(batch)->kl;
  EXPECT_GT(kl_before, 0);
  EXPECT_LT(kl_later, kl_before);
}

}  // namespace
}  // namespace sluice::trainer
