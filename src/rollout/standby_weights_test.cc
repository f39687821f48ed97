#include "sluice/rollout/standby_weights.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <random>

#include "sluice/checkpoint_engine/shm_store.h"
#include "sluice/checkpoint_engine/version_store.h"
#include "sluice/common/shm.h"
#include "sluice/model/config.h"
#include "sluice/model/transformer.h"
#include "sluice/model/weights.h"

namespace sluice::rollout {
namespace {

namespace ce = checkpoint_engine;
using std::chrono::milliseconds;

constexpr TokenId kBaseToken = 10;  // version v makes the model emit token kBaseToken + v

std::shared_ptr<model::Transformer> UntiedModel() {
  model::ModelConfig c = *model::PresetModelConfig("tiny");
  c.tie_word_embeddings = false;
  c.max_position_embeddings = 64;
  return std::make_shared<model::Transformer>(c, 1);
}

// Weights under which the model emits kBaseToken + version whatever it reads,
// with every tensor different in every version: every token embeds to the
// same vector and every other matrix has all entries equal, so the residual
// stream stays a positive multiple of the all-ones vector (small, equal
// contributions from the blocks) and the output projection's one positive
// row wins. A snapshot that mixes tensors of two versions still emits a
// plausible token, so CheckedHook compares every tensor of what is served.
TensorMap WeightsForVersion(model::Transformer& m, int64_t version) {
  TensorMap w = *model::ExportWeights(m);
  const float v = static_cast<float>(version);
  for (auto& [name, t] : w) {
    std::vector<float> values(t.numel(), 1e-3f * (1.0f + v));
    if (name == "model.embed_tokens.weight" || name.find("norm") != std::string::npos) {
      std::fill(values.begin(), values.end(), 1.0f + 0.1f * v);
    } else if (name == "lm_head.weight") {
      const int64_t hidden = t.shape[1];
      std::fill(values.begin(), values.end(), -1e-3f * (1.0f + v));
      for (int64_t j = 0; j < hidden; ++j) values[(kBaseToken + version) * hidden + j] = 1.0f;
    }
    t = HostTensor::Copy(DType::kF32, t.shape, values.data(), values.size() * sizeof(float));
  }
  return w;
}

// `hook`, checking that every snapshot it hands the engine holds exactly the
// weights of its version in every tensor (a torn or mislabelled set fails).
WeightSwapHook CheckedHook(WeightSwapHook hook, std::shared_ptr<model::Transformer> shape, int* checked) {
  return [hook = std::move(hook), shape, checked](PolicyVersion current) -> std::optional<PolicySnapshot> {
    std::optional<PolicySnapshot> snap = hook(current);
    if (!snap) return snap;
    const TensorMap want = WeightsForVersion(*shape, snap->version);
    const TensorMap got = *model::ExportWeights(*snap->model);
    EXPECT_EQ(got.size(), want.size());
    for (const auto& [name, t] : want) {
      auto it = got.find(name);
      EXPECT_TRUE(it != got.end() && it->second.nbytes == t.nbytes &&
                  std::memcmp(it->second.data, t.data, t.nbytes) == 0)
          << "version " << snap->version << ": tensor " << name << " is not that version's";
    }
    ++*checked;
    return snap;
  };
}

GenerationRequest Greedy(uint64_t id, int32_t tokens) {
  GenerationRequest r;
  r.id = id;
  r.prompt = {1, 2, 3};
  r.sampling.temperature = 0;
  r.sampling.max_new_tokens = tokens;
  return r;
}

// Every token must be the one its recorded version's weights produce.
void ExpectVersionsMatchTokens(const GenerationResult& r) {
  ASSERT_EQ(r.tokens.size(), r.versions.size());
  for (size_t i = 0; i < r.tokens.size(); ++i) {
    EXPECT_EQ(r.tokens[i], kBaseToken + r.versions[i]) << "request " << r.id << " token " << i;
  }
}

class StandbyWeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    serving_ = UntiedModel();
    ASSERT_TRUE(model::LoadWeights(*serving_, WeightsForVersion(*serving_, 0)).ok());
    ce::VersionStoreOptions o;
    o.layout = ce::LayoutOf(WeightsForVersion(*serving_, 0));
    store_ = std::move(ce::VersionStore::Create(o)).value();
  }

  std::unique_ptr<RolloutEngine> Engine(SwitchPolicy policy) {
    EngineOptions o;
    o.num_slots = 2;
    o.eos_token_id = 0;  // never produced by these weights
    o.switch_policy = policy;
    return std::move(RolloutEngine::Create({serving_, 0}, o)).value();
  }

  void Publish(int64_t v) { ASSERT_TRUE(store_->Publish(v, WeightsForVersion(*serving_, v)).ok()); }

  std::shared_ptr<model::Transformer> serving_;
  std::unique_ptr<ce::VersionStore> store_;
};

TEST_F(StandbyWeightsTest, InFlightSwitchContinuesSequencesOnTheNewWeights) {
  auto engine = Engine(SwitchPolicy::kInFlight);
  auto standby = std::move(StandbyWeights::Create(serving_, 0, *store_)).value();
  int checked = 0;
  engine->SetWeightSwapHook(CheckedHook(standby->Hook(), serving_, &checked));
  ASSERT_TRUE(engine->Submit(Greedy(1, 12)).ok());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(engine->Step().ok());
  Publish(1);
  ASSERT_TRUE(standby->WaitUntilReady(1, milliseconds(10000)).ok());
  auto results = engine->RunUntilIdle();
  ASSERT_TRUE(results.ok()) << results.status().ToString();
  ASSERT_EQ(results->size(), 1u);
  const GenerationResult& r = (*results)[0];
  ExpectVersionsMatchTokens(r);
  // Tokens 0..3 came from version 0, the rest from version 1 (one sequence, two versions).
  EXPECT_EQ(r.versions.front(), 0);
  EXPECT_EQ(r.versions.back(), 1);
  EXPECT_EQ(engine->policy_version(), 1);
  EXPECT_EQ(standby->stats().handed, 1);
  EXPECT_EQ(checked, 1);
}

TEST_F(StandbyWeightsTest, SharedHookNeverRecyclesWeightsALaggingEngineServes) {
  auto fast = Engine(SwitchPolicy::kInFlight), slow = Engine(SwitchPolicy::kInFlight);
  auto standby = std::move(StandbyWeights::Create(serving_, 0, *store_)).value();
  auto hooks = ShareWeightSwapHook(standby->Hook(), 2, 0);
  ASSERT_EQ(hooks.size(), 2u);
  fast->SetWeightSwapHook(hooks[0]);
  slow->SetWeightSwapHook(hooks[1]);
  ASSERT_TRUE(fast->Submit(Greedy(1, 20)).ok());
  ASSERT_TRUE(slow->Submit(Greedy(2, 20)).ok());
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(fast->Step().ok() && slow->Step().ok());
  Publish(1);
  ASSERT_TRUE(standby->WaitUntilReady(1, milliseconds(10000)).ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(fast->Step().ok());
  EXPECT_EQ(fast->policy_version(), 1);
  EXPECT_EQ(slow->policy_version(), 0);
  // Version 2 needs the buffer the slow engine still reads: it must wait.
  Publish(2);
  EXPECT_FALSE(standby->WaitUntilReady(2, milliseconds(300)).ok());
  ASSERT_TRUE(slow->Step().ok());  // adopts version 1
  EXPECT_EQ(slow->policy_version(), 1);
  EXPECT_FALSE(standby->WaitUntilReady(2, milliseconds(100)).ok());
  ASSERT_TRUE(slow->Step().ok());  // its hook sees it serve 1: version 0's buffer is free
  ASSERT_TRUE(standby->WaitUntilReady(2, milliseconds(10000)).ok());
  auto a = fast->RunUntilIdle();
  auto b = slow->RunUntilIdle();
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->size(), 1u);
  ASSERT_EQ(b->size(), 1u);
  ExpectVersionsMatchTokens((*a)[0]);
  ExpectVersionsMatchTokens((*b)[0]);
  EXPECT_EQ((*b)[0].versions.front(), 0);
  EXPECT_EQ((*a)[0].versions.back(), 2);
  EXPECT_EQ((*b)[0].versions.back(), 2);
}

TEST_F(StandbyWeightsTest, AtBoundarySwitchFinishesSequencesInFlightOnTheOldWeights) {
  auto engine = Engine(SwitchPolicy::kAtBoundary);
  auto standby = std::move(StandbyWeights::Create(serving_, 0, *store_)).value();
  engine->SetWeightSwapHook(standby->Hook());
  ASSERT_TRUE(engine->Submit(Greedy(1, 10)).ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(engine->Step().ok());
  Publish(1);
  ASSERT_TRUE(standby->WaitUntilReady(1, milliseconds(10000)).ok());
  ASSERT_TRUE(engine->Submit(Greedy(2, 5)).ok());  // arrives while 1 is in flight
  ASSERT_TRUE(engine->Step().ok());
  EXPECT_EQ(engine->pending_version(), std::optional<PolicyVersion>(1));
  EXPECT_EQ(engine->num_waiting(), 1u) << "no admission while a switch is pending";
  auto results = engine->RunUntilIdle();
  ASSERT_TRUE(results.ok()) << results.status().ToString();
  ASSERT_EQ(results->size(), 2u);
  for (const auto& r : *results) {
    ExpectVersionsMatchTokens(r);
    const PolicyVersion want = r.id == 1 ? 0 : 1;
    for (PolicyVersion v : r.versions) EXPECT_EQ(v, want) << "request " << r.id;
  }
  EXPECT_FALSE(engine->pending_version().has_value());
}

TEST_F(StandbyWeightsTest, OnlyTheNewestVersionIsServedAndBuffersAreNotOverwrittenWhileServing) {
  auto engine = Engine(SwitchPolicy::kInFlight);
  auto standby = std::move(StandbyWeights::Create(serving_, 0, *store_)).value();
  int checked = 0;
  engine->SetWeightSwapHook(CheckedHook(standby->Hook(), serving_, &checked));
  // Many versions while generating: each forward pass must still be one whole version.
  for (uint64_t id = 1; id <= 6; ++id) ASSERT_TRUE(engine->Submit(Greedy(id, 20)).ok());
  int64_t published = 0;
  std::vector<GenerationResult> all;
  while (!engine->idle()) {
    if (published < 8) Publish(++published);
    auto done = engine->Step();
    ASSERT_TRUE(done.ok()) << done.status().ToString();
    for (auto& r : *done) all.push_back(std::move(r));
  }
  ASSERT_EQ(all.size(), 6u);
  for (const auto& r : all) {
    ExpectVersionsMatchTokens(r);
    for (size_t i = 1; i < r.versions.size(); ++i) EXPECT_LE(r.versions[i - 1], r.versions[i]);
  }
  // How many versions the filler caught while generating depends on timing;
  // then two more, each waited for, so at least two are served and checked.
  for (int i = 0; i < 2; ++i) {
    if (i > 0) Publish(++published);
    ASSERT_TRUE(standby->WaitUntilReady(published, milliseconds(10000)).ok());
    ASSERT_TRUE(engine->Submit(Greedy(7 + i, 3)).ok());
    auto last = engine->RunUntilIdle();
    ASSERT_TRUE(last.ok());
    EXPECT_EQ(engine->policy_version(), published);
    ExpectVersionsMatchTokens((*last)[0]);
  }
  const StandbyStats stats = standby->stats();
  EXPECT_LE(stats.fills, published);
  EXPECT_EQ(stats.fill_errors, 0) << stats.last_error;
  EXPECT_EQ(checked, stats.handed);
  EXPECT_GE(checked, 2) << "several versions served, each checked whole";
}

TEST_F(StandbyWeightsTest, ReadsVersionsFromTheSharedMemoryStore) {
  const std::string name =
      "standby" + std::to_string(::getpid()) + "_" + std::to_string(std::random_device{}() % 100000);
  ce::ShmPublisherOptions po;
  po.store_name = name;
  po.layout = ce::LayoutOf(WeightsForVersion(*serving_, 0));
  auto publisher = ce::ShmPublisher::Attach(po);
  ASSERT_TRUE(publisher.ok()) << publisher.status().ToString();
  ce::ShmSubscriberOptions so;
  so.store_name = name;
  auto subscriber = ce::ShmSubscriber::Attach(so);
  ASSERT_TRUE(subscriber.ok()) << subscriber.status().ToString();
  {
    auto engine = Engine(SwitchPolicy::kInFlight);
    auto standby = std::move(StandbyWeights::Create(serving_, 0, **subscriber)).value();
    int checked = 0;
    engine->SetWeightSwapHook(CheckedHook(standby->Hook(), serving_, &checked));
    ASSERT_TRUE((*publisher)->Publish(3, WeightsForVersion(*serving_, 3)).ok());
    ASSERT_TRUE(standby->WaitUntilReady(3, milliseconds(10000)).ok());
    ASSERT_TRUE(engine->Submit(Greedy(1, 4)).ok());
    auto results = engine->RunUntilIdle();
    ASSERT_TRUE(results.ok());
    ExpectVersionsMatchTokens((*results)[0]);
    EXPECT_EQ((*results)[0].versions.front(), 3);
    EXPECT_EQ(checked, 1);
  }
  subscriber->reset();
  publisher->reset();  // the last detach removes every segment of the store
  auto left = ListShmSegments({"sluice", name});
  ASSERT_TRUE(left.ok());
  EXPECT_TRUE(left->empty()) << left->size() << " segments left";
}

TEST_F(StandbyWeightsTest, AVersionThatDoesNotFitIsReportedAndServingContinues) {
  // A store whose layout names a tensor the model does not have.
  ce::VersionStoreOptions o;
  o.layout = {{"not.a.weight", DType::kF32, {4}}};
  auto bad_store = std::move(ce::VersionStore::Create(o)).value();
  auto engine = Engine(SwitchPolicy::kInFlight);
  auto standby = std::move(StandbyWeights::Create(serving_, 0, *bad_store)).value();
  engine->SetWeightSwapHook(standby->Hook());
  std::vector<float> four(4, 0.0f);
  TensorMap w;
  w["not.a.weight"] = HostTensor::Copy(DType::kF32, {4}, four.data(), sizeof(float) * 4);
  ASSERT_TRUE(bad_store->Publish(1, w).ok());
  Status st = standby->WaitUntilReady(1, milliseconds(300));
  EXPECT_EQ(st.code(), StatusCode::kTimeout);
  EXPECT_NE(st.message().find("not.a.weight"), std::string::npos) << st.ToString();
  ASSERT_TRUE(engine->Submit(Greedy(1, 3)).ok());
  auto results = engine->RunUntilIdle();
  ASSERT_TRUE(results.ok());
  EXPECT_EQ(engine->policy_version(), 0);
  ExpectVersionsMatchTokens((*results)[0]);
  EXPECT_EQ(standby->stats().fill_errors, 1);
}

TEST(StandbyWeightsCreateTest, RejectsANullModel) {
  ce::VersionStoreOptions o;
  o.layout = {{"w", DType::kF32, {1}}};
  auto store = std::move(ce::VersionStore::Create(o)).value();
  EXPECT_EQ(StandbyWeights::Create(nullptr, 0, *store).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice::rollout
