// The contract of weights.h, run through the interfaces alone against each
// transport that is both staged and read on this host: the in-process
// VersionStore (one object is publisher and reader) and the shared-memory
// store (ShmPublisher + ShmSubscriber). The broadcast publisher is checked
// through WeightPublisher in broadcast_process_test.cc.
#include "sluice/checkpoint_engine/weights.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>

#include "shm/shm_test_util.h"
#include "sluice/checkpoint_engine/shm_store.h"
#include "sluice/checkpoint_engine/version_store.h"

namespace sluice::checkpoint_engine {
namespace {

using testing::CheckTensorBytes;
using testing::MakeVersion;
using testing::TestLayout;

// One transport: a publisher and a reader of the same store, kept alive
// together.
struct Transport {
  std::shared_ptr<void> keep_alive;
  TwoPhasePublisher* publisher = nullptr;
  WeightReader* reader = nullptr;
  std::string prefix;  // shared-memory prefix to clean up, if any
};

Transport InProcess() {
  VersionStoreOptions o;
  o.layout = TestLayout();
  std::shared_ptr<VersionStore> store = std::move(VersionStore::Create(o)).value();
  return Transport{store, store.get(), store.get(), ""};
}

Transport SharedMemory() {
  const std::string prefix = testing::UniquePrefix();
  ShmPublisherOptions po;
  po.store_name = "contract";
  po.shm_prefix = prefix;
  po.layout = TestLayout();
  auto publisher = ShmPublisher::Attach(po);
  EXPECT_TRUE(publisher.ok()) << publisher.status().ToString();
  ShmSubscriberOptions so;
  so.store_name = "contract";
  so.shm_prefix = prefix;
  auto subscriber = ShmSubscriber::Attach(so);
  EXPECT_TRUE(subscriber.ok()) << subscriber.status().ToString();
  if (!publisher.ok() || !subscriber.ok()) return {};
  struct Both {
    std::unique_ptr<ShmPublisher> publisher;
    std::unique_ptr<ShmSubscriber> subscriber;
  };
  auto both = std::make_shared<Both>(Both{std::move(publisher).value(), std::move(subscriber).value()});
  return Transport{both, both->publisher.get(), both->subscriber.get(), prefix};
}

class WeightsContractTest : public ::testing::TestWithParam<std::function<Transport()>> {
 protected:
  void SetUp() override {
    t_ = GetParam()();
    ASSERT_NE(t_.publisher, nullptr);
  }
  void TearDown() override {
    const std::string prefix = t_.prefix;
    t_ = {};
    if (!prefix.empty()) {
      EXPECT_TRUE(testing::SegmentsWithPrefix(prefix).empty()) << "segments left after the last user detached";
      testing::RemoveSegmentsWithPrefix(prefix);
    }
  }
  // "" if `pinned` is version `v` of the test layout, every tensor whole.
  static std::string CheckPinned(const PinnedWeights& pinned, int64_t v) {
    if (pinned.version != v) return "version " + std::to_string(pinned.version) + ", want " + std::to_string(v);
    const Layout layout = TestLayout();
    if (pinned.tensors.size() != layout.size()) return std::to_string(pinned.tensors.size()) + " tensors";
    for (size_t i = 0; i < layout.size(); ++i) {
      auto it = pinned.tensors.find(layout[i].name);
      if (it == pinned.tensors.end()) return "no tensor " + layout[i].name;
      std::string bad = CheckTensorBytes(layout[i], i, v, it->second.data, it->second.nbytes);
      if (!bad.empty()) return layout[i].name + ": " + bad;
    }
    return "";
  }
  Transport t_;
};

TEST_P(WeightsContractTest, VersionsArePublishedWholeAndOnlyIncrease) {
  TwoPhasePublisher& pub = *t_.publisher;
  WeightReader& reader = *t_.reader;
  EXPECT_EQ(reader.layout().size(), TestLayout().size());
  EXPECT_EQ(pub.latest_version(), kNoVersion);
  EXPECT_EQ(reader.latest_version(), kNoVersion);
  EXPECT_EQ(reader.PinLatest().status().code(), StatusCode::kNotFound);

  ASSERT_TRUE(pub.Publish(1, MakeVersion(TestLayout(), 1)).ok());
  EXPECT_EQ(pub.latest_version(), 1);
  EXPECT_EQ(reader.latest_version(), 1);
  auto first = reader.PinLatest();
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(CheckPinned(*first, 1), "");

  // Refused publishes leave version 1 serving.
  EXPECT_EQ(pub.Publish(1, MakeVersion(TestLayout(), 1)).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(pub.Publish(0, MakeVersion(TestLayout(), 0)).code(), StatusCode::kFailedPrecondition);
  TensorMap missing = MakeVersion(TestLayout(), 2);
  missing.erase(missing.begin());
  EXPECT_EQ(pub.Publish(2, missing).code(), StatusCode::kFailedPrecondition);
  TensorMap extra = MakeVersion(TestLayout(), 2);
  extra.emplace("not_in_layout", extra.begin()->second);
  EXPECT_EQ(pub.Publish(2, extra).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(reader.latest_version(), 1);

  // A staged version whose bytes change before Commit is refused too.
  {
    auto staged = pub.BeginPublish(2);
    ASSERT_TRUE(staged.ok()) << staged.status().ToString();
    EXPECT_EQ((*staged)->version(), 2);
    for (const auto& [name, tensor] : MakeVersion(TestLayout(), 2)) ASSERT_TRUE((*staged)->Put(name, tensor).ok());
    std::span<std::byte> bytes = (*staged)->MutableStagedBytesForTesting(TestLayout()[1].name);
    ASSERT_FALSE(bytes.empty());
    bytes[7] ^= std::byte{1};
    EXPECT_EQ((*staged)->Commit().code(), StatusCode::kDataLoss);
  }
  EXPECT_EQ(reader.latest_version(), 1);

  // The pin on version 1 outlives its replacement, unchanged.
  ASSERT_TRUE(pub.Publish(2, MakeVersion(TestLayout(), 2)).ok());
  auto second = reader.WaitAndPin(2, std::chrono::milliseconds(1000));
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(CheckPinned(*second, 2), "");
  EXPECT_EQ(CheckPinned(*first, 1), "");

  // Waiting for a version nobody publishes times out, naming the latest.
  auto none = reader.WaitAndPin(3, std::chrono::milliseconds(50));
  EXPECT_EQ(none.status().code(), StatusCode::kTimeout);
  EXPECT_NE(none.status().message().find('2'), std::string::npos) << none.status().ToString();
}

TEST_P(WeightsContractTest, StagedInPlaceTensorsCountOnlyOnceSealed) {
  TwoPhasePublisher& pub = *t_.publisher;
  const Layout layout = TestLayout();
  const TensorMap v1 = MakeVersion(layout, 1);
  auto staged = pub.BeginPublish(1);
  ASSERT_TRUE(staged.ok()) << staged.status().ToString();
  for (size_t i = 0; i < layout.size(); ++i) {
    const HostTensor& tensor = v1.at(layout[i].name);
    if (i == 0) {
      ASSERT_TRUE((*staged)->Put(layout[i].name, tensor).ok());
      continue;
    }
    auto span = (*staged)->StageInPlace(layout[i].name);
    ASSERT_TRUE(span.ok()) << span.status().ToString();
    ASSERT_EQ(span->size(), tensor.nbytes);
    std::memcpy(span->data(), tensor.data, tensor.nbytes);
  }
  // Staged but not sealed: missing.
  EXPECT_EQ((*staged)->Commit().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ((*staged)->SealInPlace(layout[1].name, 12345).code(), StatusCode::kDataLoss);
  // The right checksums, taken from a version staged by Put.
  {
    VersionStoreOptions o;
    o.layout = layout;
    auto reference = std::move(VersionStore::Create(o)).value();
    ASSERT_TRUE(reference->Publish(1, v1).ok());
    VersionHandle h = std::move(reference->AcquireLatest()).value();
    for (size_t i = 1; i < layout.size(); ++i) {
      ASSERT_TRUE((*staged)->SealInPlace(layout[i].name, h.checksum(layout[i].name).value()).ok());
    }
  }
  ASSERT_TRUE((*staged)->Commit().ok());
  auto pinned = t_.reader->PinLatest();
  ASSERT_TRUE(pinned.ok()) << pinned.status().ToString();
  EXPECT_EQ(CheckPinned(*pinned, 1), "");
}

INSTANTIATE_TEST_SUITE_P(Transports, WeightsContractTest,
                         ::testing::Values(std::function<Transport()>(InProcess),
                                           std::function<Transport()>(SharedMemory)),
                         [](const ::testing::TestParamInfo<std::function<Transport()>>& info) {
                           return info.index == 0 ? std::string("InProcess") : std::string("SharedMemory");
                         });

}  // namespace
}  // namespace sluice::checkpoint_engine
