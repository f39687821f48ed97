#include "broadcast/broadcast_test_util.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <random>

#include "shm/shm_test_util.h"

namespace sluice::checkpoint_engine::testing {

Layout BroadcastLayout() {
  return {{"embed", DType::kF32, {256, 1024}}, {"w_i64", DType::kI64, {8192}}, {"w_i32", DType::kI32, {64, 128}},
          {"norm", DType::kF32, {1024}},       {"bias", DType::kI32, {100}},   {"empty", DType::kF32, {0}}};
}

std::string UniqueGroup() {
  std::random_device rd;
  char buf[64];
  std::snprintf(buf, sizeof(buf), "g%dx%08x", static_cast<int>(::getpid()), rd());
  return buf;
}

std::unique_ptr<RendezvousServer> StartRendezvous() {
  auto server = RendezvousServer::Start({});
  EXPECT_TRUE(server.ok()) << server.status().ToString();
  return server.ok() ? std::move(server).value() : nullptr;
}

std::shared_ptr<VersionStore> MakeVersionStore(const Layout& layout) {
  VersionStoreOptions o;
  o.layout = layout;
  auto store = VersionStore::Create(o);
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  return store.ok() ? std::shared_ptr<VersionStore>(std::move(store).value()) : nullptr;
}

BroadcastPublisherOptions TestPublisherOptions(const std::string& address, const std::string& group) {
  BroadcastPublisherOptions o;
  o.rendezvous_address = address;
  o.group = group;
  o.layout = BroadcastLayout();
  o.bucket_bytes = kTestBucketBytes;
  o.op_timeout = kTestOpTimeout;
  o.join_timeout = std::chrono::seconds(10);
  o.reform_timeout = std::chrono::seconds(2);
  return o;
}

BroadcastSubscriberOptions TestSubscriberOptions(const std::string& address, const std::string& group,
                                                 const std::string& name) {
  BroadcastSubscriberOptions o;
  o.rendezvous_address = address;
  o.group = group;
  o.name = name;
  o.op_timeout = kTestOpTimeout;
  o.join_timeout = std::chrono::seconds(10);
  return o;
}

namespace {

template <typename Handle>
std::string CheckHandle(const Handle& h, const Layout& layout, int64_t at_least) {
  if (h.version() < at_least) return "serves version " + std::to_string(h.version()) + " < " + std::to_string(at_least);
  for (size_t t = 0; t < layout.size(); ++t) {
    Result<HostTensor> view = h.tensor(layout[t].name);
    if (!view.ok()) return view.status().ToString();
    std::string bad = CheckTensorBytes(layout[t], t, h.version(), view->data, view->nbytes);
    if (!bad.empty()) return bad;
  }
  Status verified = h.Verify();
  return verified.ok() ? "" : verified.ToString();
}

}  // namespace

std::string CheckServes(VersionStore& store, int64_t at_least) {
  Result<VersionHandle> h = store.AcquireLatest();
  if (!h.ok()) return h.status().ToString();
  return CheckHandle(*h, store.layout(), at_least);
}

std::string CheckServes(ShmSubscriber& store, int64_t at_least) {
  Result<ShmVersionHandle> h = store.AcquireLatest();
  if (!h.ok()) return h.status().ToString();
  return CheckHandle(*h, store.layout(), at_least);
}

}  // namespace sluice::checkpoint_engine::testing
