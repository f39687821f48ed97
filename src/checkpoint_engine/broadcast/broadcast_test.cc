// The cross-host broadcast with every peer in this process (each with its
// own rendezvous connection, Gloo device and store): delivery to both kinds
// of local store, protocol and layout mismatches, rejected versions, late
// joiners, leavers and a publisher restart. The multi-process and crash
// tests are in broadcast_process_test.cc.
#include "sluice/checkpoint_engine/broadcast.h"

#include <gtest/gtest.h>

#include <thread>

#include "broadcast/broadcast_test_util.h"
#include "broadcast/broadcast_wire.h"
#include "shm/shm_test_util.h"
#include "sluice/checkpoint_engine/relay.h"

namespace sluice::checkpoint_engine {
namespace {

using namespace std::chrono_literals;
using testing::BroadcastLayout;
using testing::CheckServes;
using testing::MakeVersion;
using testing::MakeVersionStore;
using testing::TestPublisherOptions;
using testing::TestSubscriberOptions;

bool Contains(const Status& s, const std::string& needle) { return s.message().find(needle) != std::string::npos; }

class BroadcastTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = testing::StartRendezvous();
    ASSERT_NE(server_, nullptr);
    group_ = testing::UniqueGroup();
  }

  std::unique_ptr<BroadcastPublisher> StartPublisher(BroadcastPublisherOptions o) {
    auto p = BroadcastPublisher::Start(std::move(o));
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return p.ok() ? std::move(p).value() : nullptr;
  }
  BroadcastPublisherOptions PublisherOptions() { return TestPublisherOptions(server_->address(), group_); }
  BroadcastSubscriberOptions SubscriberOptions(const std::string& name) {
    return TestSubscriberOptions(server_->address(), group_, name);
  }
  std::unique_ptr<BroadcastSubscriber> StartSubscriber(const std::string& name, std::shared_ptr<VersionStore> store) {
    auto s = BroadcastSubscriber::Start(SubscriberOptions(name), std::move(store));
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(s).value() : nullptr;
  }
  // Publishes `version` and expects every one of `members` subscribers to serve it.
  void PublishOk(BroadcastPublisher& pub, int64_t version, size_t members) {
    auto report = pub.PublishWithReport(version, MakeVersion(BroadcastLayout(), version));
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    EXPECT_EQ(report->version, version);
    EXPECT_EQ(report->subscribers.size(), members);
    for (const SubscriberDelivery& d : report->subscribers) EXPECT_EQ(d.code, StatusCode::kOk) << d.name;
  }

  std::unique_ptr<RendezvousServer> server_;
  std::string group_;
};

TEST_F(BroadcastTest, DeliversVersionsIntoInProcessAndSharedMemoryStores) {
  auto pub = StartPublisher(PublisherOptions());
  ASSERT_NE(pub, nullptr);
  auto store = MakeVersionStore(BroadcastLayout());
  auto a = StartSubscriber("in-process", store);
  // The second host keeps versions in shared memory for its rollout processes.
  const std::string prefix = testing::UniquePrefix();
  ShmPublisherOptions so;
  so.shm_prefix = prefix;
  so.store_name = "weights";
  so.layout = BroadcastLayout();
  auto shm_store = ShmPublisher::Attach(so);
  ASSERT_TRUE(shm_store.ok()) << shm_store.status().ToString();
  ShmSubscriberOptions ro;
  ro.shm_prefix = prefix;
  ro.store_name = "weights";
  auto rollout = ShmSubscriber::Attach(ro);
  ASSERT_TRUE(rollout.ok());
  auto b = BroadcastSubscriber::Start(SubscriberOptions("shm"), std::shared_ptr<ShmPublisher>(std::move(*shm_store)));
  ASSERT_TRUE(b.ok()) << b.status().ToString();

  for (int64_t v = 1; v <= 3; ++v) {
    PublishOk(*pub, v, 2);
    // Publish returns after every member committed.
    EXPECT_EQ(CheckServes(*store, v), "");
    EXPECT_EQ(CheckServes(**rollout, v), "");
  }
  const BroadcastPublishReport report = pub->last_report();
  EXPECT_EQ(report.attempts, 1u);
  EXPECT_TRUE(report.dropped.empty());
  EXPECT_EQ(report.bytes, size_t{1} * 1024 * 1024 + 64 * 1024 + 32 * 1024 + 4096 + 400);
  EXPECT_EQ(pub->stats().generations_formed, 1u);
  EXPECT_EQ(pub->stats().latest_version, 3);
  EXPECT_EQ(a->stats().versions_committed, 3u);
  EXPECT_EQ((*b)->stats().versions_committed, 3u);
  EXPECT_EQ((*b)->stats().rank + a->stats().rank, 3);  // ranks 1 and 2
  EXPECT_TRUE(a->WaitForVersion(3, 0ms).ok());
  EXPECT_EQ(a->WaitForVersion(4, 10ms).code(), StatusCode::kTimeout);
  b->reset();
  rollout->reset();
  EXPECT_EQ(testing::SegmentsWithPrefix(prefix), std::vector<std::string>{});
}

TEST_F(BroadcastTest, PublisherSpeakingAnotherProtocolIsRefusedAtStart) {
  BroadcastPublisherOptions po = PublisherOptions();
  po.test_hooks.announced_protocol = 99;
  auto pub = StartPublisher(po);
  auto store = MakeVersionStore(BroadcastLayout());
  ASSERT_TRUE(store->Publish(4, MakeVersion(BroadcastLayout(), 4)).ok());
  auto sub = BroadcastSubscriber::Start(SubscriberOptions("s"), store);
  EXPECT_EQ(sub.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(sub.status(), "protocol version 99") && Contains(sub.status(), "speaks version 1"))
      << sub.status().ToString();
  EXPECT_EQ(CheckServes(*store, 4), "");  // untouched
}

TEST_F(BroadcastTest, LayoutMismatchIsRefusedWithTheDifferenceNamed) {
  auto pub = StartPublisher(PublisherOptions());
  Layout other = BroadcastLayout();
  other[2].shape = {128, 64};
  auto store = MakeVersionStore(other);
  auto sub = BroadcastSubscriber::Start(SubscriberOptions("s"), store);
  EXPECT_EQ(sub.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(sub.status(), "layout differs") && Contains(sub.status(), "'w_i32'") &&
              Contains(sub.status(), "[128, 64]"))
      << sub.status().ToString();
  EXPECT_EQ(store->latest_version(), kNoVersion);
  // The same tensors under another layout hash (another encoding) too.
  pub.reset();
  BroadcastPublisherOptions po = PublisherOptions();
  po.test_hooks.announced_layout_hash = 12345;
  pub = StartPublisher(po);
  sub = BroadcastSubscriber::Start(SubscriberOptions("s"), MakeVersionStore(BroadcastLayout()));
  EXPECT_EQ(sub.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(sub.status(), "layout hash 0x3039")) << sub.status().ToString();
}

TEST_F(BroadcastTest, RejectedVersionsLeaveThePreviousOneServingAndTheGroupUp) {
  BroadcastPublisherOptions po = PublisherOptions();
  po.test_hooks.mutate_header = [](int64_t version, std::string* header) {
    if (version == 2) (*header)[header->size() - 8] ^= 1;          // the last tensor's checksum
    if (version == 3) (*header)[0] = 'X';                          // not a broadcast message
    if (version == 4) (*header)[bcast::kPreambleBytes + 24] ^= 1;  // the layout hash
  };
  auto pub = StartPublisher(po);
  auto s1 = MakeVersionStore(BroadcastLayout());
  auto s2 = MakeVersionStore(BroadcastLayout());
  auto a = StartSubscriber("a", s1);
  auto b = StartSubscriber("b", s2);
  PublishOk(*pub, 1, 2);

  auto bad = pub->PublishWithReport(2, MakeVersion(BroadcastLayout(), 2));
  EXPECT_EQ(bad.status().code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(bad.status(), "2 of 2 subscriber(s) rejected it") && Contains(bad.status(), "a: DataLoss"))
      << bad.status().ToString();
  EXPECT_EQ(CheckServes(*s1, 1), "");
  EXPECT_EQ(s1->latest_version(), 1);
  EXPECT_EQ(s2->latest_version(), 1);
  EXPECT_EQ(s1->stats().staging_version, kNoVersion);  // staging aborted
  EXPECT_TRUE(Contains(a->stats().last_error, "'empty'") || Contains(a->stats().last_error, "checksum"))
      << a->stats().last_error.ToString();

  bad = pub->PublishWithReport(3, MakeVersion(BroadcastLayout(), 3));
  EXPECT_EQ(bad.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(a->stats().last_error, "not a Sluice broadcast message")) << a->stats().last_error.ToString();
  bad = pub->PublishWithReport(4, MakeVersion(BroadcastLayout(), 4));
  EXPECT_EQ(bad.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(b->stats().last_error, "layout hash")) << b->stats().last_error.ToString();
  EXPECT_EQ(CheckServes(*s2, 1), "");
  EXPECT_EQ(a->stats().versions_rejected, 3u);

  // The same generation carries on.
  PublishOk(*pub, 5, 2);
  EXPECT_EQ(CheckServes(*s1, 5), "");
  EXPECT_EQ(CheckServes(*s2, 5), "");
  EXPECT_EQ(pub->stats().generations_formed, 1u);
  EXPECT_EQ(pub->stats().broken_generations, 0u);
}

TEST_F(BroadcastTest, LateJoinersAndLeaversChangeTheGroupAtTheNextPublish) {
  auto pub = StartPublisher(PublisherOptions());
  auto s1 = MakeVersionStore(BroadcastLayout());
  auto a = StartSubscriber("a", s1);
  PublishOk(*pub, 1, 1);
  Result<bool> changed = pub->GroupChanged();
  ASSERT_TRUE(changed.ok()) << changed.status().ToString();
  EXPECT_FALSE(*changed);
  auto s2 = MakeVersionStore(BroadcastLayout());
  auto b = StartSubscriber("b", s2);
  changed = pub->GroupChanged();
  ASSERT_TRUE(changed.ok()) << changed.status().ToString();
  EXPECT_TRUE(*changed);  // b registered
  // The last version again: b receives it, a takes part serving it already.
  PublishOk(*pub, 1, 2);  // re-formed with b
  EXPECT_EQ(CheckServes(*s2, 1), "");
  EXPECT_EQ(CheckServes(*s1, 1), "");
  EXPECT_EQ(pub->stats().generations_formed, 2u);
  changed = pub->GroupChanged();
  ASSERT_TRUE(changed.ok()) << changed.status().ToString();
  EXPECT_FALSE(*changed);
  PublishOk(*pub, 2, 2);
  EXPECT_EQ(CheckServes(*s2, 2), "");
  EXPECT_EQ(pub->stats().generations_formed, 2u);
  a.reset();  // leaves
  auto report = pub->PublishWithReport(3, MakeVersion(BroadcastLayout(), 3));
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_EQ(report->subscribers.size(), 1u);
  EXPECT_EQ(report->subscribers[0].name, "b");
  EXPECT_EQ(report->attempts, 1u);
  EXPECT_EQ(CheckServes(*s1, 2), "");  // a's store keeps what it had
  EXPECT_EQ(CheckServes(*s2, 3), "");
}

// Re-forming with a registered subscriber that never declares itself ready
// (started, not yet listening; or stuck): the publisher goes on with the
// ready ones after reform_timeout, even when join_timeout is shorter
// (join_timeout bounds only the wait for min_subscribers).
TEST_F(BroadcastTest, ReformingWaitsForAPendingSubscriberOnlyUntilReformTimeout) {
  BroadcastPublisherOptions po = PublisherOptions();
  po.join_timeout = 100ms;
  po.reform_timeout = 600ms;
  auto pub = StartPublisher(po);
  auto s1 = MakeVersionStore(BroadcastLayout());
  auto a = StartSubscriber("a", s1);
  PublishOk(*pub, 1, 1);
  // A subscriber that registers and then says nothing more.
  RendezvousClientOptions ko;
  ko.address = server_->address();
  auto kv = RendezvousClient::Connect(ko);
  ASSERT_TRUE(kv.ok()) << kv.status().ToString();
  bcast::Keys keys(group_);
  keys.set_epoch(pub->stats().epoch);
  auto next = (*kv)->Add(keys.NextId(), 1);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  bcast::SubscriberHello silent;
  silent.layout_hash = bcast::LayoutHash(BroadcastLayout());
  silent.name = "silent";
  ASSERT_TRUE((*kv)->Set(keys.Subscriber(static_cast<uint64_t>(*next - 1)), bcast::Encode(silent)).ok());
  const auto start = std::chrono::steady_clock::now();
  PublishOk(*pub, 2, 1);  // a only
  EXPECT_GE(std::chrono::steady_clock::now() - start, 600ms);
  EXPECT_EQ(CheckServes(*s1, 2), "");
}

TEST_F(BroadcastTest, ANewPublisherTakesOverAndSubscribersFollowIt) {
  auto store = MakeVersionStore(BroadcastLayout());
  std::unique_ptr<BroadcastSubscriber> sub;
  uint64_t first_epoch = 0;
  {
    auto pub = StartPublisher(PublisherOptions());
    first_epoch = pub->stats().epoch;
    sub = StartSubscriber("s", store);
    PublishOk(*pub, 1, 1);
    // One live publisher per group.
    auto second = BroadcastPublisher::Start(PublisherOptions());
    EXPECT_EQ(second.status().code(), StatusCode::kAlreadyExists) << second.status().ToString();
  }
  EXPECT_EQ(CheckServes(*store, 1), "");
  auto pub = StartPublisher(PublisherOptions());
  ASSERT_NE(pub, nullptr);
  EXPECT_GT(pub->stats().epoch, first_epoch);
  PublishOk(*pub, 2, 1);
  EXPECT_EQ(CheckServes(*store, 2), "");
  EXPECT_EQ(sub->stats().epoch, pub->stats().epoch);
}

// Waits (bounded) until `store` serves `version`.
std::string EventuallyServes(VersionStore& store, int64_t version) {
  for (int i = 0; i < 500 && store.latest_version() < version; ++i) std::this_thread::sleep_for(10ms);
  return CheckServes(store, version);
}

TEST_F(BroadcastTest, RelayCarriesAHostStoresVersionsAndSendsTheCurrentOneToAJoiner) {
  const std::string prefix = testing::UniquePrefix();
  ShmPublisherOptions so;
  so.shm_prefix = prefix;
  so.store_name = "host";
  so.layout = BroadcastLayout();
  RelayOptions ro;
  ro.store_name = "host";
  ro.shm_prefix = prefix;
  ro.broadcast = PublisherOptions();
  ro.broadcast.min_subscribers = 1;
  ro.first_timeout = 20s;
  // Started before the host's store exists: it attaches once it does.
  auto relay = ShmBroadcastRelay::Start(ro);
  ASSERT_TRUE(relay.ok()) << relay.status().ToString();
  auto s1 = MakeVersionStore(BroadcastLayout());
  auto a = StartSubscriber("a", s1);
  {
    auto host = ShmPublisher::Attach(so);
    ASSERT_TRUE(host.ok()) << host.status().ToString();
    for (int64_t v = 1; v <= 3; ++v) {
      ASSERT_TRUE((*host)->Publish(v, MakeVersion(BroadcastLayout(), v)).ok());
      EXPECT_EQ(EventuallyServes(*s1, v), "");
    }
    // A subscriber joining between versions is sent the current one.
    auto s2 = MakeVersionStore(BroadcastLayout());
    auto b = StartSubscriber("b", s2);
    EXPECT_EQ(EventuallyServes(*s2, 3), "");
    ASSERT_TRUE((*host)->Publish(4, MakeVersion(BroadcastLayout(), 4)).ok());
    EXPECT_EQ(EventuallyServes(*s1, 4), "");
    EXPECT_EQ(EventuallyServes(*s2, 4), "");
    EXPECT_TRUE((*relay)->status().ok()) << (*relay)->status().ToString();
    // (the subscribers may commit a version before the relay's delivery call
    // returns and counts it)
    for (int i = 0; i < 500 && (*relay)->stats().last_delivered < 4; ++i) std::this_thread::sleep_for(10ms);
    EXPECT_EQ((*relay)->stats().last_delivered, 4);
    EXPECT_GE((*relay)->stats().deliveries, 5u);  // 1-4, and 3 again for b
  }
  relay->reset();
  testing::RemoveSegmentsWithPrefix(prefix);
}

TEST_F(BroadcastTest, RelayStopsNamingAStoreOfAnotherLayout) {
  const std::string prefix = testing::UniquePrefix();
  ShmPublisherOptions so;
  so.shm_prefix = prefix;
  so.store_name = "host";
  so.layout = testing::TestLayout();  // not the broadcast's
  auto host = ShmPublisher::Attach(so);
  ASSERT_TRUE(host.ok()) << host.status().ToString();
  RelayOptions ro;
  ro.store_name = "host";
  ro.shm_prefix = prefix;
  ro.broadcast = PublisherOptions();
  auto relay = ShmBroadcastRelay::Start(ro);
  ASSERT_TRUE(relay.ok()) << relay.status().ToString();
  for (int i = 0; i < 500 && (*relay)->status().ok(); ++i) std::this_thread::sleep_for(10ms);
  const Status s = (*relay)->status();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_TRUE(Contains(s, "store 'host'")) << s.ToString();
  EXPECT_EQ(ShmBroadcastRelay::Start(RelayOptions{}).status().code(), StatusCode::kInvalidArgument);
  relay->reset();
  host->reset();
  testing::RemoveSegmentsWithPrefix(prefix);
}

TEST_F(BroadcastTest, PublishRejectsBadInputAndTooFewSubscribers) {
  BroadcastPublisherOptions po = PublisherOptions();
  po.join_timeout = 100ms;
  auto pub = StartPublisher(po);
  TensorMap v = MakeVersion(BroadcastLayout(), 1);
  auto none = pub->PublishWithReport(1, v);
  EXPECT_EQ(none.status().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(none.status(), "only 0 subscriber(s)")) << none.status().ToString();

  auto store = MakeVersionStore(BroadcastLayout());
  auto sub = StartSubscriber("s", store);
  TensorMap missing = v;
  missing.erase("empty");
  Status s = pub->PublishWithReport(1, missing).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s, "missing: 'empty'")) << s.ToString();
  TensorMap extra = v;
  extra["nope"] = v.at("bias");
  EXPECT_EQ(pub->PublishWithReport(1, extra).status().code(), StatusCode::kInvalidArgument);
  TensorMap wrong = v;
  wrong["bias"] = v.at("norm");
  EXPECT_EQ(pub->PublishWithReport(1, wrong).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(pub->PublishWithReport(-1, v).status().code(), StatusCode::kInvalidArgument);
  PublishOk(*pub, 2, 1);
  s = pub->PublishWithReport(1, v).status();  // below the last one
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(s, "only increase")) << s.ToString();
  EXPECT_EQ(CheckServes(*store, 2), "");

  // Nobody required: publishing to an empty group succeeds.
  BroadcastPublisherOptions lone = TestPublisherOptions(server_->address(), testing::UniqueGroup());
  lone.min_subscribers = 0;
  auto alone = StartPublisher(lone);
  auto r = alone->PublishWithReport(1, v);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->subscribers.empty());
}

TEST_F(BroadcastTest, MalformedOptionsAreRefused) {
  BroadcastPublisherOptions po = PublisherOptions();
  po.group = "a/b";
  EXPECT_EQ(BroadcastPublisher::Start(po).status().code(), StatusCode::kInvalidArgument);
  po = PublisherOptions();
  po.bucket_bytes = 1000;
  Status s = BroadcastPublisher::Start(po).status();
  EXPECT_TRUE(Contains(s, "bucket_bytes")) << s.ToString();
  po = PublisherOptions();
  po.max_in_flight = 0;
  EXPECT_EQ(BroadcastPublisher::Start(po).status().code(), StatusCode::kInvalidArgument);
  po = PublisherOptions();
  po.layout.clear();
  EXPECT_EQ(BroadcastPublisher::Start(po).status().code(), StatusCode::kInvalidArgument);
  po = PublisherOptions();
  po.rendezvous_address = "nowhere";
  EXPECT_EQ(BroadcastPublisher::Start(po).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(BroadcastSubscriber::Start(SubscriberOptions("s"), std::shared_ptr<VersionStore>()).status().code(),
            StatusCode::kInvalidArgument);
  BroadcastSubscriberOptions so = SubscriberOptions(std::string(200, 'n'));
  EXPECT_EQ(BroadcastSubscriber::Start(so, MakeVersionStore(BroadcastLayout())).status().code(),
            StatusCode::kInvalidArgument);
  // No publisher within join_timeout.
  so = SubscriberOptions("s");
  so.join_timeout = 50ms;
  s = BroadcastSubscriber::Start(so, MakeVersionStore(BroadcastLayout())).status();
  EXPECT_EQ(s.code(), StatusCode::kTimeout);
  EXPECT_TRUE(Contains(s, "no publisher")) << s.ToString();
}

}  // namespace
}  // namespace sluice::checkpoint_engine
